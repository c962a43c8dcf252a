"""Calls of the element-indexed builtins: `ct.gather`, `ct.scatter`, `ct.atomic_add/max/min`.

Each checks which kind of parameter it touches (a gather reads a shared Tensor, a scatter
writes this block's own `Mut` tile, an atomic updates an `Atomic` tensor), that the indices
are int32 tiles (or ints), one per dim, and broadcasts indices and values to one shape.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from cutile_py.frontend.values import ParamRef
from cutile_py.ir import Value
from cutile_py.ir.dtypes import DType, convert_scalar, f32, i32, i64
from cutile_py.ir.shapes import broadcast_shapes

if TYPE_CHECKING:
    from cutile_py.frontend.build_ir import KernelBuilder

#: The dtypes each atomic updates (`red.global` on every target from sm_80; f32 max/min as
#: integer ones on the bits).
ATOMIC_DTYPES: dict[str, tuple[type[DType], ...]] = {
    "add": (f32, i32, i64),
    "max": (f32, i32, i64),
    "min": (f32, i32, i64),
}
MAX_TILE_RANK = 3


def _param_kind(p: ParamRef) -> str:
    return p.bound.spec.kind


def _tensor(kb: KernelBuilder, x: Any, call: str, want: str, node: ast.AST) -> ParamRef:
    """`x` as a tensor parameter of kind `want` ("tensor", "partition" or "atomic")."""
    if not isinstance(x, ParamRef):
        kb.fail(f"{call} takes a tensor parameter first, not {type(x).__name__}", node)
    kind = _param_kind(x)
    if kind == want:
        return x
    if kind == "atomic":
        refuse_atomic(kb, x, node)
    if want == "tensor":
        kb.fail(
            f"{call} reads a shared Tensor parameter; '{x.name}' is Mut: read this block's "
            "own tile with ct.load or .load(), and write it with ct.scatter",
            node,
        )
    if want == "partition":
        kb.fail(
            f"{call} writes only this block's own tile of a Mut parameter; '{x.name}' is a "
            "shared, read-only Tensor",
            node,
        )
    kb.fail(
        f"{call} updates an Atomic parameter (annotate it ct.Atomic[Tensor[...]]); "
        f"'{x.name}' is {'Mut' if kind == 'partition' else 'a shared Tensor'}",
        node,
    )


def refuse_atomic(kb: KernelBuilder, p: ParamRef, node: ast.AST) -> NoReturn:
    """CompileError: Atomic parameter `p` used other than by an atomic update."""
    kb.fail(
        f"'{p.name}' is an Atomic parameter: the kernel may only update it with "
        "ct.atomic_add / atomic_max / atomic_min, never read or store it (other blocks "
        "update it meanwhile)",
        node,
    )


def _article(name: str) -> str:
    """'a' or 'an' before a dtype name as it is spoken ("an f32", "an i64", "a bf16")."""
    return "an" if name[:1] in "fi" else "a"


def _coords(
    kb: KernelBuilder,
    indices: Any,
    t: ParamRef,
    call: str,
    node: ast.AST,
    value_shape: tuple[int, ...] = (),
) -> tuple[list[Value], tuple[int, ...]]:
    """One i32 tile per dim of `t`, broadcast together (and with `value_shape`) to one shape,
    and that shape. All scalars: one element, as tiles of shape (1,) (the tile's one owning
    thread does it, so an atomic updates once per block)."""
    rank = t.bound.rank
    items = indices if isinstance(indices, tuple) else (indices,)
    if len(items) != rank:
        kb.fail(
            f"{call}: the tensor has rank {rank}: give {rank} index tile"
            f"{'s' if rank > 1 else ''} (a tuple, one per dim), not {len(items)}",
            node,
        )
    values: list[Value] = []
    for k, x in enumerate(items):
        if isinstance(x, Value):
            if x.type.dtype is not i32:
                name = x.type.dtype.name
                kb.fail(
                    f"{call}: index {k} into '{t.name}' is {_article(name)} {name} "
                    f"{'tile' if x.type.shape else 'scalar'}; indices are int32 (convert "
                    "with .astype(ct.i32))",
                    node,
                )
            values.append(x)
        elif isinstance(x, int) and not isinstance(x, bool):
            values.append(kb.constant(x, i32))
        else:
            what = type(x).__name__
            kb.fail(f"{call}: index {k} must be an int32 tile or an int, not {what}", node)
    try:
        shape = broadcast_shapes(*(v.type.shape for v in values), value_shape)
    except ValueError as e:
        kb.fail(f"{call}: the indices do not broadcast together: {e}", node)
    if len(shape) > MAX_TILE_RANK:
        kb.fail(f"{call}: tiles of rank 1 to {MAX_TILE_RANK} are supported, not {len(shape)}", node)
    return [kb.to_shape(v, shape or (1,)) for v in values], shape


def _value(kb: KernelBuilder, x: Any, dst: ParamRef, call: str, node: ast.AST) -> Value:
    """The data of a scatter or atomic as a value of `dst`'s dtype (a number converts)."""
    dtype = dst.bound.dtype
    if isinstance(x, Value):
        if x.type.dtype is not dtype:
            kb.fail(
                f"{call}: the values are {x.type.dtype.name} but '{dst.name}' holds "
                f"{dtype.name}; convert with .astype(ct.{dtype.name})",
                node,
            )
        return x
    if isinstance(x, (bool, int, float)):
        try:
            return kb.b.constant(convert_scalar(x, dtype), dtype)
        except ValueError as e:
            kb.fail(f"{call}: {e}", node)
    kb.fail(f"{call}: the values must be a tile or a number, not {type(x).__name__}", node)


def _gather(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Value:
    src = _tensor(kb, a["src"], "ct.gather", "tensor", node)
    coords, shape = _coords(kb, a["indices"], src, "ct.gather", node)
    pad = a["padding"]
    if not isinstance(pad, (int, float)) or isinstance(pad, bool):
        kb.fail("ct.gather: padding must be a number", node)
    try:
        pad = convert_scalar(pad, src.bound.dtype)
    except ValueError as e:
        kb.fail(f"ct.gather: padding {e}", node)
    got = kb.b.gather(src.index, src.bound.dtype, coords, pad)
    return got if shape else kb.b.reshape(got, ())


def _scatter(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> None:
    z = _tensor(kb, a["z"], "ct.scatter", "partition", node)
    value = _value(kb, a["values"], z, "ct.scatter", node)
    coords, shape = _coords(kb, a["indices"], z, "ct.scatter", node, value_shape=value.type.shape)
    kb.b.scatter(z.index, coords, kb.to_shape(value, shape or (1,)))


def _atomic(kind: str) -> Callable[[KernelBuilder, ast.AST, dict[str, Any]], None]:
    call = f"ct.atomic_{kind}"

    def handle(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> None:
        t = _tensor(kb, a["t"], call, "atomic", node)
        if t.bound.dtype not in ATOMIC_DTYPES[kind]:
            names = ", ".join(d.name for d in ATOMIC_DTYPES[kind])
            kb.fail(f"{call}: '{t.name}' is {t.bound.dtype.name}; it updates {names}", node)
        value = _value(kb, a["values"], t, call, node)
        coords, shape = _coords(kb, a["indices"], t, call, node, value_shape=value.type.shape)
        kb.b.atomic(kind, t.index, coords, kb.to_shape(value, shape or (1,)))

    return handle


HANDLERS: dict[str, Callable[[KernelBuilder, ast.AST, dict[str, Any]], Any]] = {
    "gather": _gather,
    "scatter": _scatter,
    **{f"atomic_{k}": _atomic(k) for k in ATOMIC_DTYPES},
}
