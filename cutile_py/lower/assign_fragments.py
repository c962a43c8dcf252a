"""assign_fragments: which values of an mma loop live in mma fragment layouts, decided before
emission.

In a loop whose body has an mma, the mma's result, the values computed from it element-wise,
its row reductions, the row and column vectors broadcast into it, the accumulator the loop
carries and the f16/bf16 tile fed back as the next mma's A operand can all stay in the
registers of the m16n8 accumulator fragments: no trip through shared memory per iteration.

A family is the closure of one mma result over those relations (within the loop body, top
level, and its carried values). It is accepted whole or not at all: every op that touches a
family value must be one that runs on fragments, otherwise the family's values stay blocked
(and are converted where the mma needs fragments, as before). Values enter the family at the
loop's start (converted from the initial values) and leave it at the loop's end.

Fragment kinds, for an accumulator of M x N over a grid of wm x wn warps:
- `acc`: an (M, N) tile; per thread 4 registers per (M slot, N slot): rows g and g + 8,
  columns 2t and 2t + 1 of its 16 x 8 fragment (lane = 4 g + t).
- `rows`: an (M,) or (M, 1) vector; per thread 2 registers per M slot (rows g and g + 8),
  the same in the 4 lanes of a quad, so a row reduction is two quad shuffles.
- `cols`: an (N,) or (1, N) vector; per thread 2 registers per N slot (columns 2t, 2t + 1).

A family with rows, columns or a fed-back A operand has one warp per fragment row band
(wn = 1): a row then lies in one quad, and the fragments of an A operand are those of the
accumulator it was computed from. A plain accumulator family keeps the mma's usual split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import bf16, f16, f32, i32
from cutile_py.ir.uses import DefUse, walk
from cutile_py.lower.fragments import WarpGrid, warp_grid
from cutile_py.lower.plan_wgmma import shapes_fit
from cutile_py.ptx.target import Target

WARP = 32

#: Ops that run element by element on any one fragment kind.
_ELEMENTWISE = (o.UnaryOp, o.BinaryOp, o.CompareOp, o.SelectOp, o.FmaOp, o.CastOp)
#: Reductions that combine along a row with quad shuffles.
_ROW_REDUCTIONS = ("sum", "max", "min")


@dataclass(frozen=True)
class Fragment:
    """A value held in mma fragment registers: `kind` is "acc", "rows" or "cols"; `grid`
    is the warps' split of the (M, N) accumulator the value belongs to, that of `mma`
    (whose fragment addressing the emitter uses for it)."""

    kind: str
    grid: WarpGrid
    mma: o.MmaOp

    def count(self) -> int:
        """Registers per thread."""
        if self.kind == "acc":
            return 4 * self.grid.sm * self.grid.sn
        return 2 * (self.grid.sm if self.kind == "rows" else self.grid.sn)

    def describe(self) -> str:
        return f"mma {self.kind} fragments, warps {self.grid.wm}x{self.grid.wn}"


@dataclass(frozen=True)
class FragmentPlan:
    #: Every value held in fragments.
    values: Mapping[o.Value, Fragment]
    #: The warp split each family's mma uses (mmas of no family take `warp_grid`'s).
    grids: Mapping[o.MmaOp, WarpGrid]

    def of(self, v: o.Value) -> Fragment | None:
        return self.values.get(v)


def no_fragments() -> FragmentPlan:
    return FragmentPlan(MappingProxyType({}), MappingProxyType({}))


def find_families(kernel: o.Kernel, target: Target, uses: DefUse) -> list[Family]:
    """The fragment families of every loop with a top-level mma in its body (shapes only:
    before the block size is chosen)."""
    out: list[Family] = []
    seen: set[o.Value] = set()
    if not target.mma_sync:
        return out
    for loop in walk(kernel.body):
        if not isinstance(loop, o.ForOp):
            continue
        for mma in loop.body.ops:
            if isinstance(mma, o.MmaOp) and mma.result not in seen:
                fam = _family(loop, mma, uses)
                # A closure reaching into an earlier family (through an A operand carried
                # from the previous iteration, the one link not followed backwards) stays
                # blocked: each value belongs to one family.
                if fam is not None and seen.isdisjoint(fam.kinds):
                    # wgmma's accumulator is one warp per 16-row band (plan_wgmma).
                    fam.wgmma = all(shapes_fit(m, target) for m in fam.mmas)
                    out.append(fam)
                    seen.update(fam.kinds)
    return out


def family_threads(families: list[Family]) -> int | None:
    """The most threads a block should have: one warp per 16-row band of the smallest family
    held one band per warp (more warps would only hold copies of its fragments)."""
    bands = [fam.m // 16 for fam in families if fam.one_band]
    if not bands:
        return None
    return WARP * (1 << (min(bands).bit_length() - 1))


def assign_fragments(
    kernel: o.Kernel,
    target: Target,
    uses: DefUse,
    threads: int,
    families: list[Family] | None = None,
) -> FragmentPlan:
    """The fragment layouts of the values of each family, for a block of `threads`."""
    values: dict[o.Value, Fragment] = {}
    grids: dict[o.MmaOp, WarpGrid] = {}
    fams = find_families(kernel, target, uses) if families is None else families
    for fam in fams:
        _place(fam, threads // WARP, values, grids)
    return FragmentPlan(MappingProxyType(values), MappingProxyType(grids))


#: Marks a value as a family member of a kind; False if it cannot be one.
_Mark = Callable[[o.Value, str], bool]


@dataclass
class Family:
    """Values of one loop that can stay in fragments together, by kind, and their mmas."""

    kinds: dict[o.Value, str]
    mmas: list[o.MmaOp]
    a_fed: bool  # some mma takes its A operand from the family
    #: Its mmas may lower to wgmma (types and shapes fit the target's).
    wgmma: bool = False

    @property
    def m(self) -> int:
        """Rows of the family's accumulators."""
        return next(v.type.shape[0] for v, k in self.kinds.items() if k != "cols")

    @property
    def one_band(self) -> bool:
        """Held one warp per row band (wn = 1): it has row or column vectors, feeds an
        mma's A operand, or may lower to wgmma."""
        return self.wgmma or self.a_fed or any(k != "acc" for k in self.kinds.values())


def _family(loop: o.ForOp, seed: o.MmaOp, uses: DefUse) -> Family | None:
    """The closure of `seed`'s result over the relations that run on fragments; None if an
    op touching it cannot."""
    body = loop.body
    top = set(body.ops)
    carried = list(body.args[1:])
    yield_op = body.ops[-1]
    kinds: dict[o.Value, str] = {}
    mmas: list[o.MmaOp] = []
    a_fed = False
    todo: list[o.Value] = []

    def inside(v: o.Value) -> bool:
        return uses.producer(v) in top or v in carried

    def mark(v: o.Value, kind: str) -> bool:
        have = kinds.get(v)
        if have is not None:
            return have == kind
        if not inside(v) or not _fits(v, kind):
            return False
        kinds[v] = kind
        todo.append(v)
        return True

    mark(seed.result, "acc")
    while todo:
        v = todo.pop()
        kind = kinds[v]
        prod = uses.producer(v)
        if prod is None:  # a carried value: its yielded value and its initial value
            k = carried.index(v)
            if not mark(yield_op.operands[k], kind) or not _init_ok(
                loop.operands[3 + k], kind, uses
            ):
                return None
        elif isinstance(prod, o.MmaOp):
            acc = prod.operands[2]
            if inside(acc) and not mark(acc, "acc"):
                return None  # an accumulator from outside the loop is converted once
            if prod not in mmas:
                mmas.append(prod)
        elif not _producer_ok(prod, v, kind, mark):
            return None
        for user in uses.users(v):
            if user not in top:
                return None  # used in a nested region
            if isinstance(user, o.YieldOp):
                if not all(mark(carried[k], kind) for k, x in enumerate(user.operands) if x is v):
                    return None
            elif isinstance(user, o.MmaOp):
                a, b, acc = user.operands
                if kind != "acc" or b is v or (a is v and v.type.dtype not in (f16, bf16)):
                    return None
                a_fed = a_fed or a is v
                if not mark(user.result, "acc"):
                    return None
                if user not in mmas:
                    mmas.append(user)
            elif not _user_ok(user, v, kind, mark):
                return None
    # Carried values leave the family at the loop's end, converted back: f32 tiles, and
    # f32 or i32 row vectors.
    for arg in carried:
        held = kinds.get(arg)
        if held == "cols" or (held == "acc" and arg.type.dtype is not f32):
            return None
        if held == "rows" and arg.type.dtype not in (f32, i32):
            return None
    if len({v.type.shape[0] for v, k in kinds.items() if k != "cols"}) != 1:
        return None
    return Family(kinds, mmas, a_fed)


def _fits(v: o.Value, kind: str) -> bool:
    shape = v.type.shape
    if kind == "acc":
        return len(shape) == 2 and shape[0] % 16 == 0 and shape[1] % 8 == 0
    if kind == "rows":
        return len(shape) in (1, 2) and shape[0] % 16 == 0 and shape[1:] in ((), (1,))
    return (len(shape) == 1 and shape[0] % 8 == 0) or (
        len(shape) == 2 and shape[0] == 1 and shape[1] % 8 == 0
    )


def _producer_ok(op: o.Op, v: o.Value, kind: str, mark: _Mark) -> bool:
    """Whether `op`, defining family value `v`, runs on fragments (marking its operands)."""
    if isinstance(op, _ELEMENTWISE):
        return all(not x.type.shape or mark(x, kind) for x in op.operands)
    if isinstance(op, o.BroadcastOp):
        (x,) = op.operands
        if not x.type.shape:
            return True
        if kind != "acc":
            return False
        if x.type.shape == v.type.shape:
            return mark(x, "acc")
        return mark(x, "rows" if x.type.shape[1] == 1 else "cols")
    if isinstance(op, o.ReduceOp):
        (x,) = op.operands
        return (
            kind == "rows"
            and op.kind in _ROW_REDUCTIONS
            and op.axis == 1
            and len(x.type.shape) == 2
            and x.type.dtype in (f32, f16, bf16)
            and mark(x, "acc")
        )
    if isinstance(op, o.ReshapeOp):
        (x,) = op.operands
        return kind != "acc" and (not x.type.shape or mark(x, kind))
    if isinstance(op, o.IotaOp):
        return kind != "acc"
    return False


def _user_ok(op: o.Op, v: o.Value, kind: str, mark: _Mark) -> bool:
    """Whether `op`, taking family value `v`, runs on fragments (marking its result)."""
    if isinstance(op, _ELEMENTWISE):
        return mark(op.result, kind) and all(not x.type.shape or mark(x, kind) for x in op.operands)
    if isinstance(op, o.BroadcastOp):
        res = op.result
        if kind == "acc" and res.type.shape != v.type.shape:
            return False
        return mark(res, "acc")
    if isinstance(op, o.ReduceOp):
        return (
            kind == "acc"
            and op.kind in _ROW_REDUCTIONS
            and op.axis == 1
            and v.type.dtype in (f32, f16, bf16)
            and mark(op.result, "rows")
        )
    if isinstance(op, o.ReshapeOp):
        return kind != "acc" and mark(op.result, kind)
    return False


def _init_ok(init: o.Value, kind: str, uses: DefUse) -> bool:
    """A carried value's initial value converts into fragments: any f32 tile for an
    accumulator; a vector only as a broadcast scalar (the common `ct.full`)."""
    if kind == "acc":
        return True
    op = uses.producer(init)
    return isinstance(op, o.BroadcastOp) and not op.operands[0].type.shape


def _place(
    fam: Family, warps: int, values: dict[o.Value, Fragment], grids: dict[o.MmaOp, WarpGrid]
) -> None:
    """Choose the family's warp split and record its values' layouts."""
    fm = fam.m // 16
    one_band = fam.one_band

    def grid(n: int) -> WarpGrid:
        if one_band:
            return WarpGrid(warps, 1, fm, n // 8)
        return warp_grid(warps, fm, n // 8)

    by_n = {mma.result.type.shape[1]: mma for mma in fam.mmas}
    out: dict[o.Value, Fragment] = {}
    for v, kind in fam.kinds.items():
        if kind == "rows":
            mma = fam.mmas[0]
        else:
            got = by_n.get(v.type.shape[-1])
            if got is None:
                return  # a tile no mma of the family shapes: the family stays blocked
            mma = got
        out[v] = Fragment(kind, grid(mma.result.type.shape[1]), mma)
    values.update(out)
    if one_band:
        for mma in fam.mmas:
            grids[mma] = grid(mma.result.type.shape[1])
