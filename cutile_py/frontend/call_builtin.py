"""Calls inside kernels: the ct builtins, the few Python builtins allowed, and methods."""

from __future__ import annotations

import ast
import builtins
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from cutile_py.frontend import call_indexed
from cutile_py.frontend.inline import inline_helper
from cutile_py.frontend.values import BoundMethod, ParamRef, Reduced, ShapeRef
from cutile_py.ir import Value, reference
from cutile_py.ir.builder import MAX_RANK
from cutile_py.ir.dtypes import DType, bf16, bool_, convert_scalar, f16, f32, i32, is_dtype, op_type
from cutile_py.ir.shapes import (
    broadcast_to_shape,
    expanded_shape,
    permutation,
    reduction_axes,
    reshape_target,
)
from cutile_py.language.functions import builtin_name, is_helper

if TYPE_CHECKING:
    from cutile_py.frontend.build_ir import KernelBuilder

Handler = Callable[["KernelBuilder", ast.Call, Any], Any]
UNARY_BUILTINS = frozenset(
    {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "abs", "sin", "cos", "erf"}
)
#: Signatures used to bind the arguments of each builtin (positional or keyword, as in Python).
SIGNATURES: dict[str, inspect.Signature] = {}


def _sig(name: str, fn: Callable[..., Any]) -> inspect.Signature:
    if name not in SIGNATURES:
        SIGNATURES[name] = inspect.signature(fn)
    return SIGNATURES[name]


def call(
    kb: KernelBuilder, fn: Any, args: list[Any], kwargs: dict[str, Any], node: ast.Call
) -> Any:
    if isinstance(fn, BoundMethod):
        return _method(kb, fn, args, kwargs, node)
    if is_helper(fn):
        return inline_helper(kb, fn, args, kwargs, node)
    name = builtin_name(fn)
    if name is not None:
        try:
            bound = _sig(name, fn).bind(*args, **kwargs)
        except TypeError as e:
            kb.fail(f"ct.{name}(): {e}", node)
        bound.apply_defaults()
        return _BUILTINS[name](kb, node, bound.arguments)
    if fn is builtins.print or fn is builtins.breakpoint:
        return None  # a no-op in compiled code; the interpreter runs them
    if fn in (builtins.int, builtins.float, builtins.bool) and len(args) == 1 and not kwargs:
        x = args[0]
        if not isinstance(x, Value):
            return fn(x)
        if not x.type.is_scalar:
            kb.fail(f"{fn.__name__}() takes a scalar; for tiles use .astype()", node)
        return kb.b.cast(x, {int: i32, float: f32, bool: bool_}[fn])
    if fn in (builtins.min, builtins.max) and len(args) >= 2 and not kwargs:
        acc = args[0]
        for x in args[1:]:
            if isinstance(acc, Value) or isinstance(x, Value):
                (a, b), _, shape = kb.operands(acc, x)
                if shape:
                    kb.fail(
                        f"{fn.__name__}() takes scalars; for tiles use ct.{fn.__name__}imum", node
                    )
                acc = kb.b.binary(fn.__name__, a, b)
            else:
                acc = fn(acc, x)
        return acc
    if fn is builtins.len and len(args) == 1 and not kwargs:
        if isinstance(args[0], tuple):
            return len(args[0])
        if isinstance(args[0], ShapeRef):
            return args[0].param.bound.rank
        kb.fail("len() takes a tuple or a shape", node)
    if fn is builtins.abs and len(args) == 1 and not kwargs:
        if isinstance(args[0], (int, float)):
            return abs(args[0])  # a Python number stays one, as in the interpreter
        return _unary(kb, "abs", args[0])
    if fn is builtins.range:
        kb.fail("range() is only supported as the iterable of a for loop", node)
    what = getattr(fn, "__qualname__", None) or type(fn).__name__
    kb.fail(
        f"call to unsupported function '{what}': kernels may call ct builtins "
        "(see the API) and int/float/min/max/abs/print",
        node,
    )


def _method(
    kb: KernelBuilder, m: BoundMethod, args: list[Any], kwargs: dict[str, Any], node: ast.Call
) -> Any:
    recv = m.receiver
    if m.name == "astype":
        if len(args) != 1 or kwargs or not is_dtype(args[0]):
            kb.fail(".astype() takes one dtype, e.g. .astype(ct.f32)", node)
        return kb.b.cast(recv, args[0])
    if m.name == "reshape":
        if kwargs or not args:
            kb.fail(".reshape() takes a shape: .reshape((m, n)) or .reshape(m, n)", node)
        shape = args[0] if len(args) == 1 and isinstance(args[0], tuple) else tuple(args)
        return _reshape(kb, node, recv, shape)
    if m.name == "item":
        if args or kwargs:
            kb.fail(".item() takes no arguments", node)
        if recv.type.size != 1:
            kb.fail(
                f".item() needs a tile of one element, not one of shape {recv.type.shape}", node
            )
        return kb.b.reshape(recv, ())
    assert isinstance(recv, ParamRef) and recv.bound.tile_shape is not None
    tile_shape = recv.bound.tile_shape
    index = [kb.b.grid("bid", axis) for axis in range(len(tile_shape))]
    if m.name == "load":
        if args or kwargs:
            kb.fail(f"{recv.name}.load() takes no arguments", node)
        return kb.b.load(recv.index, recv.bound.dtype, index, tile_shape, 0)
    # store
    if len(args) != 1 or kwargs:
        kb.fail(f"{recv.name}.store() takes one tile", node)
    value = _stored_tile(kb, args[0], recv, f"{recv.name}.store()", node)
    if value.type.shape != tile_shape:
        kb.fail(
            f"cannot store a tile of shape {value.type.shape} into '{recv.name}', whose tiles "
            f"are {tile_shape}: a store takes a tile of exactly that shape; "
            + _reshape_hint(value.type.shape, tile_shape),
            node,
        )
    kb.b.store(recv.index, index, value)
    return None


def _stored_tile(kb: KernelBuilder, value: Any, dst: ParamRef, what: str, node: ast.AST) -> Value:
    """`value` checked as a tile of `dst`'s dtype (its shape is the caller's to check): a
    scalar is never spread over a tile implicitly, as a store takes a tile of exactly the
    destination's shape."""
    dtype = dst.bound.dtype.name
    if isinstance(value, (bool, int, float)) or (isinstance(value, Value) and value.type.is_scalar):
        kb.fail(
            f"{what} takes a tile, not a scalar: fill one with ct.full(shape, value, ct.{dtype})",
            node,
        )
    if not isinstance(value, Value):
        kb.fail(f"{what} takes a tile, got {_what(value)}", node)
    if value.type.dtype is not dst.bound.dtype:
        kb.fail(
            f"cannot store a {value.type.dtype.name} tile into '{dst.name}' "
            f"({dtype}); convert with .astype(ct.{dtype})",
            node,
        )
    return value


def _dropped_axes(have: tuple[int, ...], want: tuple[int, ...]) -> list[int]:
    """The axes `i` of `want` such that `want` without axis `i` is `have` (one dim lost)."""
    if len(have) + 1 != len(want):
        return []
    return [i for i in range(len(want)) if want[:i] + want[i + 1 :] == have]


def _reshape_hint(have: tuple[int, ...], want: tuple[int, ...]) -> str:
    """What to do about a tile of shape `have` where one of shape `want` belongs."""
    dropped = _dropped_axes(have, want)
    if dropped:
        i = dropped[-1]
        axes = " or ".join(str(a) for a in dropped)
        return (
            f"it lacks axis {axes}: keep a reduced axis with keepdims=True "
            f"(ct.sum(t, axis={i}, keepdims=True)), or repeat the tile along it with "
            f"ct.broadcast_to(ct.expand_dims(tile, {i}), {want})"
        )
    try:
        broadcast_to_shape(have, want)
    except ValueError:
        return f"make a tile of shape {want} (.reshape, ct.permute, or a load of that shape)"
    return f"to repeat it, broadcast it explicitly with ct.broadcast_to(tile, {want})"


def _param(kb: KernelBuilder, x: Any, what: str, node: ast.AST, touches: bool = True) -> ParamRef:
    """`x` as a tensor parameter; one whose data `what` `touches` may not be Atomic."""
    if not isinstance(x, ParamRef):
        kb.fail(f"{what} must be a tensor parameter of the kernel", node)
    if touches and x.bound.spec.kind == "atomic":
        call_indexed.refuse_atomic(kb, x, node)
    return x


def _static_shape(
    kb: KernelBuilder, shape: Any, node: ast.AST, max_rank: int = 3
) -> tuple[int, ...]:
    """A compile-time tile shape (an int is a 1-D shape) of rank 1 to `max_rank`."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, tuple):
        kb.fail("a tile shape must be a tuple of integers", node)
    for d in shape:
        if isinstance(d, Value):
            kb.fail(
                "tile shapes must be compile-time constants: this dim is a run-time size "
                "(a Dyn dim or a run-time scalar); use a Mut tile's shape, a TypeVar "
                "or a ct.Constant parameter",
                node,
            )
        if not isinstance(d, int) or isinstance(d, bool) or d <= 0:
            kb.fail(f"tile dims must be positive integers, got {d!r}", node)
    if not 1 <= len(shape) <= max_rank:
        kb.fail(f"tiles of rank 1 to {max_rank} are supported here, not {len(shape)}", node)
    return shape


def _axis(kb: KernelBuilder, axis: Any, node: ast.AST) -> int:
    if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis <= 2:
        kb.fail(f"the grid axis must be 0, 1 or 2 (a constant), got {axis!r}", node)
    return axis


def _cdiv(kb: KernelBuilder, a: Any, b: Any) -> Any:
    if not isinstance(a, Value) and not isinstance(b, Value):
        return -(-a // b)
    return kb.binary("floordiv", kb.binary("sub", kb.binary("add", a, b), 1), b)


def _unary(kb: KernelBuilder, kind: str, x: Any) -> Any:
    if not isinstance(x, Value):
        if not isinstance(x, (int, float)) or isinstance(x, bool):
            kb.fail(f"{kind}() needs a tile or a number")
        x = kb.constant(x, f32 if kind != "abs" or isinstance(x, float) else i32)
    return kb.b.unary(kind, kb.b.cast(x, op_type(kind, x.type.dtype)))


def _full(kb: KernelBuilder, node: ast.AST, shape: Any, value: Any, dtype: Any) -> Value:
    shp = _static_shape(kb, shape, node)
    if not is_dtype(dtype):
        kb.fail(f"dtype must be a cutile_py dtype such as ct.f32, got {dtype!r}", node)
    if isinstance(value, Value):
        if not value.type.is_scalar:
            kb.fail("the fill value must be a scalar", node)
        v = kb.b.cast(value, dtype)
    elif isinstance(value, (bool, int, float)):
        v = kb.constant(value, dtype)
    else:
        kb.fail("the fill value must be a number or a scalar", node)
    return kb.b.broadcast(v, shp)


def _index(kb: KernelBuilder, index: Any, rank: int, what: str, node: ast.AST) -> list[Value]:
    """A tile index (a scalar, or a tuple of them) as i32 values, `rank` of them."""
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) != rank:
        kb.fail(f"{what} has rank {rank}: give an index of {rank} coordinates", node)
    return [kb.scalar_i32(i, node) for i in index]


def _within(
    kb: KernelBuilder, p: ParamRef, shape: tuple[int, ...], what: str, node: ast.AST
) -> tuple[int, ...]:
    """The block tile of Mut parameter `p`, which a sub-tile of `shape` must tile exactly."""
    within = p.bound.tile_shape
    assert within is not None
    if any(w % d for w, d in zip(within, shape)):
        kb.fail(
            f"{what} a sub-tile of this block's tile of '{p.name}': each dim of that tile "
            f"{within} must be a multiple of the sub-tile shape {shape}",
            node,
        )
    return within


def _load(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Value:
    src = _param(kb, a["src"], "the source of ct.load", node)
    # A rank-4 tensor is read in rank-4 tiles (typically (1, 1, m, n), then reshaped).
    shape = _static_shape(kb, a["shape"], node, max_rank=MAX_RANK)
    index = a["index"]
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) != src.bound.rank or len(shape) != src.bound.rank:
        kb.fail(
            f"'{src.name}' has rank {src.bound.rank}: give an index and a shape of that rank", node
        )
    pad = a["padding"]
    if not isinstance(pad, (int, float)) or isinstance(pad, bool):
        kb.fail("padding must be a number", node)
    try:
        pad = convert_scalar(pad, src.bound.dtype)
    except ValueError as e:
        kb.fail(f"padding {e}", node)
    idx = [kb.scalar_i32(i, node) for i in index]
    # From a Mut parameter, only this block's own tile may be read (other blocks write theirs).
    within = _within(kb, src, shape, "ct.load reads", node) if src.is_partition else None
    return kb.b.load(src.index, src.bound.dtype, idx, shape, pad, within=within)


def _store(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> None:
    dst = _param(kb, a["dst"], "the destination of ct.store", node)
    if not dst.is_partition:
        kb.fail(
            f"'{dst.name}' is a shared, read-only Tensor: ct.store writes only into a Mut "
            "parameter",
            node,
        )
    value = _stored_tile(kb, a["tile"], dst, "ct.store", node)
    shape = value.type.shape
    if len(shape) != dst.bound.rank:
        kb.fail(
            f"cannot store a rank-{len(shape)} tile into '{dst.name}', which has rank "
            f"{dst.bound.rank}: ct.store takes a tile of exactly the sub-tile's shape; "
            + (
                "if it comes from a reduction, keep the reduced axis with keepdims=True, or "
                "add the axis with ct.expand_dims(tile, axis)"
                if len(shape) + 1 == dst.bound.rank
                else "give it that rank with .reshape"
            ),
            node,
        )
    within = _within(kb, dst, shape, "ct.store writes", node)
    idx = _index(kb, a["index"], dst.bound.rank, f"'{dst.name}'", node)
    kb.b.store(dst.index, idx, value, within=within)


# -- shapes and reductions --------------------------------------------------------------------
def _tile(kb: KernelBuilder, x: Any, what: str, node: ast.AST) -> Value:
    if not isinstance(x, Value) or x.type.is_scalar:
        kb.fail(f"{what} needs a tile, got {_what(x)}", node)
    return x


def _what(x: Any) -> str:
    if isinstance(x, Value):
        return f"a {x.type.dtype.name} scalar"
    if isinstance(x, ParamRef):
        return f"tensor parameter '{x.name}' (load a tile from it first)"
    return type(x).__name__


def _as_value(kb: KernelBuilder, x: Any, what: str, node: ast.AST) -> Value:
    """A tile or scalar operand; a Python number takes its default type (i32, f32, bool)."""
    if isinstance(x, Value):
        return x
    if isinstance(x, (bool, int, float)):
        return kb.constant(x, bool_ if isinstance(x, bool) else i32 if isinstance(x, int) else f32)
    kb.fail(f"{what} needs a tile or a number, got {_what(x)}", node)


def _shape_fail(kb: KernelBuilder, what: str, e: ValueError, node: ast.AST) -> NoReturn:
    kb.fail(f"{what}: {e}", node)


def _reshape(kb: KernelBuilder, node: ast.AST, x: Any, shape: Any) -> Value:
    v = _as_value(kb, x, "reshape", node)
    dims = shape if isinstance(shape, tuple) else (shape,)
    if any(isinstance(d, Value) for d in dims):
        kb.fail("reshape dims must be compile-time constants, not run-time values", node)
    try:
        target = reshape_target(shape, v.type.size, v.type.shape)
    except ValueError as e:
        _shape_fail(kb, "reshape", e, node)
    if len(target) > MAX_RANK:
        kb.fail(f"tiles of rank 1 to {MAX_RANK} are supported, not {len(target)}", node)
    if v.type.is_scalar:  # a scalar becomes a tile of one element by broadcasting
        return kb.b.broadcast(v, target)
    return kb.b.reshape(v, target)


def _broadcast_to(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Value:
    v = _as_value(kb, a["x"], "ct.broadcast_to", node)
    shape = _static_shape(kb, a["shape"], node, MAX_RANK)
    try:
        broadcast_to_shape(v.type.shape, shape)
    except ValueError as e:
        _shape_fail(kb, "ct.broadcast_to", e, node)
    return kb.to_shape(v, shape)


def _permute(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Value:
    v = _tile(kb, a["x"], "ct.permute", node)
    try:
        axes = permutation(a["axes"], len(v.type.shape))
    except ValueError as e:
        _shape_fail(kb, "ct.permute", e, node)
    return kb.b.permute(v, axes)


def _expand_dims(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Value:
    v = _as_value(kb, a["x"], "ct.expand_dims", node)
    try:
        shape = expanded_shape(v.type.shape, a["axis"])
    except ValueError as e:
        _shape_fail(kb, "ct.expand_dims", e, node)
    if len(shape) > MAX_RANK:
        kb.fail(f"tiles of rank 1 to {MAX_RANK} are supported, not {len(shape)}", node)
    return kb.b.broadcast(v, shape) if v.type.is_scalar else kb.b.reshape(v, shape)


def _cumsum(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Value:
    x = _tile(kb, a["x"], "ct.cumsum", node)
    rank, axis = len(x.type.shape), a["axis"]
    if not isinstance(axis, int) or isinstance(axis, bool) or not -rank <= axis < rank:
        kb.fail(f"ct.cumsum: axis must be a constant in [-{rank}, {rank}), got {axis!r}", node)
    if x.type.dtype is bool_:
        kb.fail("ct.cumsum of a bool tile: convert it with .astype(ct.i32) first", node)
    return kb.b.scan("sum", x, axis % rank)


def _reduction(kb: KernelBuilder, node: ast.AST, kind: str, a: dict[str, Any]) -> Value:
    """ct.sum/max/min/argmax/argmin: one ReduceOp per axis (keeping it), then a reshape that
    drops the reduced axes unless `keepdims`."""
    x = _tile(kb, a["x"], f"ct.{kind}", node)
    keepdims = a["keepdims"]
    if not isinstance(keepdims, bool):
        kb.fail(f"ct.{kind}(): keepdims must be a constant True or False", node)
    shape = x.type.shape
    try:
        axes = reduction_axes(a["axis"], len(shape), multiple=kind in ("sum", "max", "min"))
    except ValueError as e:
        _shape_fail(kb, f"ct.{kind}()", e, node)
    if kind in ("argmax", "argmin") and a["axis"] is None and len(shape) > 1:
        # The index of the extreme in the flattened tile, as NumPy gives it.
        r = kb.b.reduce(kind, kb.b.reshape(x, (x.type.size,)), 0)
        return kb.b.reshape(r, (1,) * len(shape) if keepdims else ())
    dtype = x.type.dtype
    # A 16-bit float sum over several axes accumulates in f32 throughout, rounded once.
    widen = kind == "sum" and dtype in (f16, bf16) and len(axes) > 1
    v = kb.b.cast(x, f32) if widen else x
    for axis in axes:
        v = kb.b.reduce(kind, v, axis)
    if widen:
        v = kb.b.cast(v, dtype)
    if keepdims:
        return v
    out = kb.b.reshape(v, tuple(d for i, d in enumerate(shape) if i not in axes))
    if out.type.shape:
        line = kb.cap.location(node).line
        which = str(axes[0]) if len(axes) == 1 else str(tuple(axes))
        call = f"ct.{kind}(..., axis={which}) at line {line}"
        kb.reduced[out] = Reduced(shape, tuple(axes), call)
    return out


def _load_tile_like(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Value:
    src = _param(kb, a["src"], "the source of ct.load_tile_like", node)
    like = _param(kb, a["like"], "the second argument of ct.load_tile_like", node)
    if like.bound.tile_shape is None:
        kb.fail(
            f"'{like.name}' is not a Mut parameter; load_tile_like needs one to take the "
            "tile position and shape from",
            node,
        )
    shape = like.bound.tile_shape
    if src.bound.rank != len(shape):
        kb.fail(
            f"'{src.name}' has rank {src.bound.rank} but the tiles of '{like.name}' have rank "
            f"{len(shape)}",
            node,
        )
    index = [kb.b.grid("bid", axis) for axis in range(len(shape))]
    return kb.b.load(src.index, src.bound.dtype, index, shape, 0)


def _where(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Value:
    cond, x, y = a["cond"], a["x"], a["y"]
    if isinstance(cond, bool):  # decided at compile time
        (xv, yv), _, shape = kb.operands(x, y)
        return xv if cond else yv
    if not isinstance(cond, Value) or cond.type.dtype is not bool_:
        kb.fail("the condition of ct.where must be a bool tile or scalar", node)
    (xv, yv), _, shape = kb.operands(x, y, with_shape=cond.type.shape)
    return kb.b.select(kb.to_shape(cond, shape), xv, yv)


def _fma(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Value:
    xs, dtype, _ = kb.operands(a["a"], a["b"], a["c"])
    dtype = op_type("fma", dtype)
    return kb.b.fma(*(kb.b.cast(v, dtype) for v in xs))


def _pow(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Any:
    x, y = a["x"], a["y"]
    if not isinstance(x, Value) and not isinstance(y, Value):
        if not all(isinstance(v, (bool, int, float)) for v in (x, y)):
            kb.fail(f"ct.pow needs tiles or numbers, got {_what(x)} and {_what(y)}", node)
        return reference.fold("pow", x, y)  # a Python float, weak as the interpreter's
    (xv, yv), dtype, _ = kb.operands(x, y)
    dtype = op_type("pow", dtype)
    return kb.b.binary("pow", kb.b.cast(xv, dtype), kb.b.cast(yv, dtype))


def _mma(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Value:
    x = _tile(kb, a["a"], "ct.mma (its a operand)", node)
    y = _tile(kb, a["b"], "ct.mma (its b operand)", node)
    acc = _tile(kb, a["acc"], "ct.mma (its accumulator)", node)
    return kb.b.mma(x, y, acc)


def matmul(kb: KernelBuilder, x: Any, y: Any, node: ast.AST) -> Value:
    """`x @ y`: an mma into a zero f32 accumulator."""
    xv = _tile(kb, x, "the left operand of @", node)
    yv = _tile(kb, y, "the right operand of @", node)
    if len(xv.type.shape) != 2 or len(yv.type.shape) != 2:
        kb.fail(f"@ needs 2-D tiles, got shapes {xv.type.shape} and {yv.type.shape}", node)
    zero = kb.b.broadcast(kb.constant(0.0, f32), (xv.type.shape[0], yv.type.shape[1]))
    return kb.b.mma(xv, yv, zero)


def _num_tiles(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Any:
    src = _param(kb, a["src"], "the first argument of ct.num_tiles", node, touches=False)
    axis = a["axis"]
    if not isinstance(axis, int) or not 0 <= axis < src.bound.rank:
        kb.fail(f"axis must be a constant in [0, {src.bound.rank})", node)
    static = None if src.bound.tile_shape is not None else src.bound.static_dims[axis]
    dim = static if static is not None else kb.b.tensor_dim(src.index, axis)
    return _cdiv(kb, dim, a["tile"])


def _arange(kb: KernelBuilder, node: ast.AST, a: dict[str, Any]) -> Value:
    n = a["n"]
    if isinstance(n, Value) or not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        kb.fail("ct.arange(n) needs a positive compile-time length (a tile dim)", node)
    return kb.b.cast(kb.b.iota(n), _dtype_arg(kb, a["dtype"], node))


def _dtype_arg(kb: KernelBuilder, d: Any, node: ast.AST) -> type[DType]:
    if not is_dtype(d):
        kb.fail(f"dtype must be a cutile_py dtype such as ct.f32, got {d!r}", node)
    return d


_BUILTINS: dict[str, Callable[[KernelBuilder, ast.AST, dict[str, Any]], Any]] = {
    "bid": lambda kb, n, a: kb.b.grid("bid", _axis(kb, a["axis"], n)),
    "num_blocks": lambda kb, n, a: kb.b.grid("num_blocks", _axis(kb, a["axis"], n)),
    "cdiv": lambda kb, n, a: _cdiv(kb, a["a"], a["b"]),
    "num_tiles": _num_tiles,
    "load": _load,
    "store": _store,
    "reshape": lambda kb, n, a: _reshape(kb, n, a["x"], a["shape"]),
    "broadcast_to": _broadcast_to,
    "permute": _permute,
    "expand_dims": _expand_dims,
    **{
        k: (lambda kind: lambda kb, n, a: _reduction(kb, n, kind, a))(k)
        for k in ("sum", "max", "min", "argmax", "argmin")
    },
    "load_tile_like": _load_tile_like,
    "full": lambda kb, n, a: _full(kb, n, a["shape"], a["value"], a["dtype"]),
    "zeros": lambda kb, n, a: _full(kb, n, a["shape"], 0, _dtype_arg(kb, a["dtype"], n)),
    "ones": lambda kb, n, a: _full(kb, n, a["shape"], 1, _dtype_arg(kb, a["dtype"], n)),
    "where": _where,
    "arange": _arange,
    "maximum": lambda kb, n, a: kb.binary("max", a["x"], a["y"]),
    "minimum": lambda kb, n, a: kb.binary("min", a["x"], a["y"]),
    "fma": _fma,
    "pow": _pow,
    "mma": _mma,
    **{k: (lambda kind: lambda kb, n, a: _unary(kb, kind, a["x"]))(k) for k in UNARY_BUILTINS},
    **call_indexed.HANDLERS,
    "cumsum": _cumsum,
}
