"""Structural checks of tile IR: SSA dominance, region terminators and operand types."""

from __future__ import annotations

from math import prod

from cutile_py.ir import ops as o
from cutile_py.ir.builder import IRTypeError, broadcastable, check_mma
from cutile_py.ir.dtypes import bool_, i32
from cutile_py.ir.types import TileType, scalar


class VerifyError(ValueError):
    """The IR breaks an invariant; always a compiler bug, never the user's."""


def verify(kernel: o.Kernel) -> None:
    defined: set[int] = {id(v) for v in kernel.param_values if v is not None}
    _region(kernel, kernel.body, defined, needs_yield=False)


def _region(
    kernel: o.Kernel, region: o.Region, outer: set[int], needs_yield: bool
) -> list[o.Value]:
    defined = set(outer) | {id(a) for a in region.args}
    yielded: list[o.Value] = []
    for i, op in enumerate(region.ops):
        for v in op.operands:
            if id(v) not in defined:
                raise VerifyError(f"{op.opname} uses a value not defined before it: {v!r}")
        if isinstance(op, o.YieldOp):
            if not needs_yield or i != len(region.ops) - 1:
                raise VerifyError("yield must end a loop or branch region")
            yielded = list(op.operands)
        _op(kernel, op, defined)
        defined.update(id(r) for r in op.results)
    if needs_yield and not (region.ops and isinstance(region.ops[-1], o.YieldOp)):
        raise VerifyError("loop and branch regions must end with yield")
    return yielded


def _op(kernel: o.Kernel, op: o.Op, defined: set[int]) -> None:
    i32s = scalar(i32)
    if isinstance(op, (o.LoadOp, o.StoreOp, o.TensorDimOp)):
        param = kernel.params[op.param]
        if not isinstance(param, o.TensorParam):
            raise VerifyError(f"{op.opname} refers to scalar parameter {param.name}")
        index = op.operands if isinstance(op, o.LoadOp) else op.operands[:-1]
        if not isinstance(op, o.TensorDimOp) and len(index) != param.rank:
            raise VerifyError(f"{op.opname} of {param.name} has {len(index)} index coordinates")
        if any(v.type != i32s for v in index) and not isinstance(op, o.TensorDimOp):
            raise VerifyError(f"{op.opname} index must be i32 scalars")
        if isinstance(op, o.StoreOp):
            if not param.mut:
                raise VerifyError(f"store into read-only parameter {param.name}")
            if op.operands[-1].type.dtype is not param.dtype:
                raise VerifyError(f"store of {op.operands[-1].type} into {param.dtype.name}")
        if isinstance(op, o.LoadOp) and op.result.type != TileType(param.dtype, op.shape):
            raise VerifyError(f"load of {param.name} gives {op.result.type}")
        if not isinstance(op, o.TensorDimOp) and op.within is not None:
            _within(op, param)
        if param.atomic and not isinstance(op, o.TensorDimOp):
            raise VerifyError(f"{op.opname} of Atomic parameter {param.name}")
    elif isinstance(op, (o.GatherOp, o.ScatterOp, o.AtomicOp)):
        _indexed(kernel, op)
    elif isinstance(op, o.ScanOp):
        (x,) = op.operands
        if op.result.type != x.type or not 0 <= op.axis < len(x.type.shape):
            raise VerifyError(f"scan[{op.kind} axis={op.axis}] of {x.type}")
    elif isinstance(op, o.BroadcastOp):
        (x,) = op.operands
        out = op.result.type
        if x.type.dtype is not out.dtype or not (
            x.type.is_scalar or broadcastable(x.type.shape, out.shape)
        ):
            raise VerifyError(f"broadcast of {x.type} to {out}")
    elif isinstance(op, o.ReduceOp):
        (x,) = op.operands
        shape = x.type.shape
        if op.kind not in o.REDUCE_KINDS or not 0 <= op.axis < len(shape):
            raise VerifyError(f"reduce[{op.kind} axis={op.axis}] of {x.type}")
        dtype = i32 if op.kind in ("argmax", "argmin") else x.type.dtype
        kept = (*shape[: op.axis], 1, *shape[op.axis + 1 :])
        if op.result.type != TileType(dtype, kept):
            raise VerifyError(f"reduce[{op.kind}] of {x.type} gives {op.result.type}")
    elif isinstance(op, o.MmaOp):
        a, b, acc = op.operands
        try:
            check_mma(a.type, b.type, acc.type)
        except IRTypeError as e:
            raise VerifyError(str(e)) from None
        if op.result.type != acc.type:
            raise VerifyError(f"mma of {acc.type} accumulator gives {op.result.type}")
    elif isinstance(op, o.ReshapeOp):
        (x,) = op.operands
        out = op.result.type
        if x.type.is_scalar or x.type.dtype is not out.dtype or x.type.size != prod(out.shape):
            raise VerifyError(f"reshape of {x.type} to {out}")
    elif isinstance(op, o.PermuteOp):
        (x,) = op.operands
        shape = x.type.shape
        if sorted(op.axes) != list(range(len(shape))) or op.result.type != TileType(
            x.type.dtype, tuple(shape[a] for a in op.axes)
        ):
            raise VerifyError(f"permute[axes={op.axes}] of {x.type} gives {op.result.type}")
    elif isinstance(op, (o.BinaryOp, o.CompareOp)):
        a, b = op.operands
        if a.type != b.type:
            raise VerifyError(f"{op.opname}[{op.kind}] operand types differ")
    elif isinstance(op, o.SelectOp):
        c, a, b = op.operands
        if c.type.dtype is not bool_ or a.type != b.type or c.type.shape != a.type.shape:
            raise VerifyError("select operands disagree")
    elif isinstance(op, o.ForOp):
        lo, hi, step, *inits = op.operands
        if any(v.type != i32s for v in (lo, hi, step)):
            raise VerifyError("for bounds must be i32 scalars")
        yielded = _region(kernel, op.body, defined, needs_yield=True)
        _same_types("for", inits, yielded, op.results)
    elif isinstance(op, o.IfOp):
        if op.operands[0].type != scalar(bool_):
            raise VerifyError("if condition must be a bool scalar")
        then_values = _region(kernel, op.then, defined, needs_yield=True)
        else_values = _region(kernel, op.orelse, defined, needs_yield=True)
        _same_types("if", then_values, else_values, op.results)


def _indexed(kernel: o.Kernel, op: o.GatherOp | o.ScatterOp | o.AtomicOp) -> None:
    """A gather reads a shared tensor, a scatter writes a Mut tile, an atomic updates an
    Atomic tensor; one i32 coordinate tile per dim, all of the data's shape and dtype."""
    param = kernel.params[op.param]
    if not isinstance(param, o.TensorParam):
        raise VerifyError(f"{op.opname} of scalar parameter {param.name}")
    coords = op.operands if isinstance(op, o.GatherOp) else op.operands[:-1]
    data = op.result if isinstance(op, o.GatherOp) else op.operands[-1]
    if len(coords) != param.rank:
        raise VerifyError(f"{op.opname} of {param.name} has {len(coords)} coordinate tiles")
    if any(c.type != TileType(i32, data.type.shape) for c in coords):
        raise VerifyError(f"{op.opname} coordinates must be i32 tiles of shape {data.type.shape}")
    if data.type.dtype is not param.dtype:
        raise VerifyError(f"{op.opname} of {data.type} with {param.name} ({param.dtype.name})")
    wanted = {o.GatherOp: "shared", o.ScatterOp: "mut", o.AtomicOp: "atomic"}[type(op)]
    kind = "atomic" if param.atomic else "mut" if param.mut else "shared"
    if kind != wanted:
        raise VerifyError(f"{op.opname} of {kind} parameter {param.name}")


def _within(op: o.LoadOp | o.StoreOp, param: o.TensorParam) -> None:
    """A sub-tile access: of a Mut parameter, inside its block tile, tiling it exactly."""
    shape = op.shape if isinstance(op, o.LoadOp) else op.operands[-1].type.shape
    if not param.mut or op.within != param.dims:
        raise VerifyError(
            f"{op.opname} within {op.within} of {param.name}, whose block tile is {param.dims}"
        )
    if len(shape) != len(op.within) or any(w % d for w, d in zip(op.within, shape)):
        raise VerifyError(f"{op.opname} of a {shape} sub-tile within {op.within}")


def _same_types(what: str, *groups: list[o.Value] | tuple[o.Value, ...]) -> None:
    first = [v.type for v in groups[0]]
    for g in groups[1:]:
        if [v.type for v in g] != first:
            raise VerifyError(f"{what}: carried/yielded value types disagree")
