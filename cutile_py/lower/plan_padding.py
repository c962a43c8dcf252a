"""Which loads need not write their padding: a use-def check before emission.

A load's elements outside the tensor read `padding`: emission writes it into each register
before the predicated load. That write is unobservable when every use of the loaded value
reaches only stores, element by element, whose mask lies inside the load's: element-wise ops
of the load's shape (each element of the result depends on the same element of the operand),
ending in stores of a tile of the load's shape at the same tile index into a tensor the
loaded one covers (the launch's shapes: `TensorParam.covers`), or into the same tensor with
the same sub-tile bounds. An element the load leaves unwritten is then stored nowhere.
Anything else (a reduction, a broadcast, a reshape, a loop-carried or yielded value, a
store at another index or into a longer tensor, a value used as an index) keeps the padding.
"""

from __future__ import annotations

from cutile_py.ir import ops as o
from cutile_py.ir.uses import DefUse, walk

#: Ops whose result element i depends only on element i of their operands (same shape).
ELEMENTWISE = (o.UnaryOp, o.BinaryOp, o.CompareOp, o.SelectOp, o.FmaOp, o.CastOp)


def unpadded_loads(kernel: o.Kernel, uses: DefUse) -> frozenset[o.LoadOp]:
    """The loads of `kernel` whose padding no store can observe (see the module)."""
    return frozenset(
        op
        for op in walk(kernel.body)
        if isinstance(op, o.LoadOp) and _padding_unobservable(kernel, op, uses)
    )


def _padding_unobservable(kernel: o.Kernel, load: o.LoadOp, uses: DefUse) -> bool:
    shape = load.result.type.shape
    todo, seen = [load.result], {load.result}
    while todo:
        v = todo.pop()
        for user in uses.users(v):
            if isinstance(user, o.StoreOp):
                *index, value = user.operands
                if value is not v or v in index or not _same_mask(kernel, load, user, uses):
                    return False
            elif isinstance(user, ELEMENTWISE) and user.result.type.shape == shape:
                if user.result not in seen:
                    seen.add(user.result)
                    todo.append(user.result)
            else:
                return False
    return True


def _same_mask(kernel: o.Kernel, load: o.LoadOp, store: o.StoreOp, uses: DefUse) -> bool:
    """Whether every element `store` writes lies inside what `load` read: the same tile of
    the same shape, in a tensor the loaded one covers (or the same tensor, sub-tile bounds
    alike)."""
    *index, value = store.operands
    if value.type.shape != load.result.type.shape or store.within != load.within:
        return False
    if len(index) != len(load.operands):
        return False
    if not all(_same_index(a, b, uses) for a, b in zip(index, load.operands)):
        return False
    if store.param == load.param:
        return True
    src = kernel.params[load.param]
    return load.within is None and isinstance(src, o.TensorParam) and store.param in src.covers


def _same_index(a: o.Value, b: o.Value, uses: DefUse) -> bool:
    """Whether two tile-index values are equal in every block: the same value, the block
    index along one axis, or one integer constant."""
    if a is b:
        return True
    pa, pb = uses.producer(a), uses.producer(b)
    if isinstance(pa, o.GridOp) and isinstance(pb, o.GridOp):
        return (pa.which, pa.axis) == (pb.which, pb.axis) == ("bid", pa.axis)
    if isinstance(pa, o.ConstantOp) and isinstance(pb, o.ConstantOp):
        return type(pa.value) is type(pb.value) and pa.value == pb.value
    return False
