"""How an int tile changes along its last dim, read off the IR that computed it: 0 (the same
along it), 1 (up by one per element: `ct.arange(n) + offset` and its broadcasts), or None
(unknown). A gather whose last index steps by 1 while the others stay put reads consecutive
elements, and may load them as one vector."""

from __future__ import annotations

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import i32
from cutile_py.ir.uses import DefUse

#: Ops whose result at an element depends only on their operands at that element.
_ELEMENTWISE = (o.UnaryOp, o.BinaryOp, o.CompareOp, o.SelectOp, o.FmaOp, o.CastOp)


def last_dim_stride(uses: DefUse, v: o.Value, memo: dict[o.Value, int | None]) -> int | None:
    """0 or 1 as described above, else None; `memo` caches per value."""
    if v in memo:
        return memo[v]
    shape = v.type.shape
    stride: int | None
    if not shape or shape[-1] == 1:
        stride = 0
    else:
        op = uses.producer(v)
        stride = None if op is None else _of(uses, op, memo)
    memo[v] = stride
    return stride


def _of(uses: DefUse, op: o.Op, memo: dict[o.Value, int | None]) -> int | None:
    if isinstance(op, o.IotaOp):
        return 1
    if isinstance(op, o.BroadcastOp):
        # Same rank (or a scalar): a last dim of 1 repeats one value along it.
        (x,) = op.operands
        if not x.type.shape or x.type.shape[-1] == 1:
            return 0
        return last_dim_stride(uses, x, memo)
    if isinstance(op, o.ReshapeOp):
        # A row-major reshape keeps each element's last-dim index when it keeps that dim's
        # size; otherwise other dims fold into the last one.
        (x,) = op.operands
        shape, out = x.type.shape, op.result.type.shape
        return last_dim_stride(uses, x, memo) if shape and shape[-1] == out[-1] else None
    if not isinstance(op, _ELEMENTWISE):
        return None
    strides = [last_dim_stride(uses, x, memo) for x in op.operands]
    if any(s is None for s in strides):
        return None
    if all(s == 0 for s in strides):
        return 0
    if op.result.type.dtype is not i32:
        return None
    if isinstance(op, o.CastOp):
        return strides[0] if op.operands[0].type.dtype is i32 else None
    if isinstance(op, o.BinaryOp) and op.kind in ("add", "sub"):
        a, b = strides
        assert a is not None and b is not None
        s = a + b if op.kind == "add" else a - b
        return s if s in (0, 1) else None
    return None
