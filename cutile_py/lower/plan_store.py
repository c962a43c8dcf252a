"""plan_store: whether a tile store is a TMA store epilogue, and how; if not, why.

A store of an mma accumulator that a loop carried in fragments (through a cast to the
tensor's dtype, and a reshape that adds leading 1s, each used once) can skip the trip to a
blocked layout: the fragments are written straight into a shared staging tile laid out as
the tensor map's boxes expect, and one thread stores the tile with `cp.async.bulk.tensor`
(`emit_store`). TMA clips what lies past the tensor's edge, so a ragged tile needs no mask.

The staging tile is `cols / panel` panels of rows x `panel` columns, each a box of its own,
swizzled so that the fragment writes hit every bank once:
- 16-bit: rows of up to 128 bytes (the widest span dividing a tile row's bytes), with the
  span's swizzle; `stmatrix` writes 8 rows of a 16-byte chunk per matrix, and any 8
  consecutive rows hold a chunk at 8 different bank groups.
- f32: rows of 32 bytes, unswizzled: a fragment's row g, columns 2t, 2t + 1 (8 bytes) of 4
  rows x 4 lanes fill 128 contiguous bytes, one wavefront per half warp (with 128-byte rows
  the XOR would pair up rows g and g ^ 1 on the same banks).

Static conditions are checked here (target, dtype, a 16-byte aligned base and row stride as
the specialization records them, not a sub-tile store, box sizes); the host makes the map from
the tensor launched with, whose alignment is part of the specialization key, so a tensor no
map can describe compiles the plain store instead (the same choice `plan_tma` makes for
loads).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import DType
from cutile_py.ir.uses import DefUse, walk
from cutile_py.lower.assign_fragments import Fragment, FragmentPlan
from cutile_py.lower.plan_tma import MAP_DTYPE, MAX_BOX, SWIZZLE_OF_ROW
from cutile_py.ptx.target import Target

#: The widest staging row (a swizzle span).
MAX_SPAN = 128
#: Bytes per staging row of an f32 tile (see the module's docstring).
F32_SPAN = 32


@dataclass(frozen=True)
class TmaStore:
    """A store carried out as a TMA store epilogue."""

    store: o.StoreOp
    #: The loop-carried accumulator whose fragments are stored.
    acc: o.Value
    frag: Fragment
    #: The values from the loop's result to the stored one (result, cast, reshape), each
    #: held in the accumulator's fragments.
    chain: tuple[o.Value, ...]
    dtype: type[DType]
    rows: int
    cols: int
    #: Columns per panel (one box each) and the panels' `CUtensorMapSwizzle`.
    panel: int
    swizzle: int

    @property
    def eb(self) -> int:
        return self.dtype.itemsize()

    @property
    def span(self) -> int:
        """Bytes per staging row (within a panel)."""
        return self.panel * self.eb

    @property
    def panels(self) -> int:
        return self.cols // self.panel

    @property
    def panel_bytes(self) -> int:
        return self.rows * self.span

    @property
    def nbytes(self) -> int:
        return self.panels * self.panel_bytes

    @property
    def stmatrix(self) -> bool:
        """16-bit fragments are written with `stmatrix` (f32 ones with `st.shared.v2`)."""
        return self.eb == 2

    @property
    def box(self) -> tuple[int, ...]:
        """The box, innermost dimension first (leading 1s of the stored value included)."""
        rank = len(self.store.operands[-1].type.shape)
        return (self.panel, self.rows, *([1] * (rank - 2)))

    @property
    def map_dtype(self) -> int:
        return MAP_DTYPE[self.dtype.name]

    def describe(self) -> str:
        how = "stmatrix" if self.stmatrix else "st.shared.v2.f32"
        per = f", {self.panels} boxes" if self.panels > 1 else ""
        return (
            f"tma store: {self.rows}x{self.cols} {self.dtype.name} staged by {how} in "
            f"{self.panels} panel(s) of {self.rows}x{self.panel} (swizzle={self.swizzle}), "
            f"box {'x'.join(map(str, reversed(self.box)))}{per}; fence.proxy.async, barrier, "
            "one thread stores, commit, wait_group.read 0, barrier"
        )


@dataclass(frozen=True)
class StorePlan:
    """Per store of a loop's mma accumulator: its TMA epilogue, or why it has none."""

    tma: Mapping[o.StoreOp, TmaStore]
    why: Mapping[o.StoreOp, str]


def no_stores() -> StorePlan:
    return StorePlan(MappingProxyType({}), MappingProxyType({}))


def plan_stores(
    kernel: o.Kernel, target: Target, uses: DefUse, fragments: FragmentPlan
) -> StorePlan:
    """The TMA epilogue of each store of a loop-carried mma accumulator, or why not."""
    tma: dict[o.StoreOp, TmaStore] = {}
    why: dict[o.StoreOp, str] = {}
    if not target.tma:
        return no_stores()  # nothing to decide (and nothing to say) without TMA
    for op in walk(kernel.body):
        if not isinstance(op, o.StoreOp):
            continue
        found = _accumulator(op, uses, fragments)
        if found is None:
            continue  # not an accumulator's store: nothing to say
        if isinstance(found, str):
            why[op] = f"{kernel.params[op.param].name}: {found}"
            continue
        acc, frag, chain = found
        got = _decide(kernel, target, op, acc, frag, chain)
        if isinstance(got, str):
            why[op] = got
        else:
            tma[op] = got
    return StorePlan(MappingProxyType(tma), MappingProxyType(why))


def with_chains(fragments: FragmentPlan, stores: StorePlan) -> FragmentPlan:
    """`fragments` with each TMA store's chain held in its accumulator's fragments."""
    if not stores.tma:
        return fragments
    values = dict(fragments.values)
    for t in stores.tma.values():
        for v in t.chain:
            values[v] = t.frag
    return FragmentPlan(MappingProxyType(values), fragments.grids)


def _accumulator(
    store: o.StoreOp, uses: DefUse, fragments: FragmentPlan
) -> tuple[o.Value, Fragment, tuple[o.Value, ...]] | str | None:
    """The loop-carried accumulator `store` stores (through a cast and a reshape adding
    leading 1s), its fragment and the chain of values; why not, where a value of the chain
    has a use besides the next (the chain stays in fragments, which only the store reads)."""
    v = store.operands[-1]
    chain = [v]
    shared = False
    while True:
        shared = shared or len(uses.users(v)) != 1
        prod = uses.producer(v)
        if isinstance(prod, o.ForOp):
            k = prod.results.index(v)
            acc = prod.body.args[k + 1]
            frag = fragments.of(acc)
            if frag is None or frag.kind != "acc":
                return None
            if shared:
                return "the stored value has another use, which reads it out of the fragments"
            return acc, frag, tuple(reversed(chain))
        if isinstance(prod, o.CastOp):
            (x,) = prod.operands
        elif isinstance(prod, o.ReshapeOp):
            (x,) = prod.operands
            shape = prod.result.type.shape
            if shape[len(shape) - len(x.type.shape) :] != x.type.shape or any(
                d != 1 for d in shape[: len(shape) - len(x.type.shape)]
            ):
                return None
        else:
            return None
        v = x
        chain.append(v)


def _decide(
    kernel: o.Kernel,
    target: Target,
    store: o.StoreOp,
    acc: o.Value,
    frag: Fragment,
    chain: tuple[o.Value, ...],
) -> TmaStore | str:
    param = kernel.params[store.param]
    assert isinstance(param, o.TensorParam)
    dt = store.operands[-1].type.dtype
    rows, cols = acc.type.shape
    if store.within is not None:
        return f"{param.name}: a sub-tile store (TMA cannot clip to the block's tile)"
    if dt.name not in MAP_DTYPE:
        return f"{param.name}: no tensor-map data type for {dt.name}"
    eb = dt.itemsize()
    if param.align * eb < 16:
        return (
            f"{param.name}: its base or row stride is not a multiple of 16 bytes "
            f"(aligned to {param.align * eb} bytes)"
        )
    if rows > MAX_BOX:
        return f"{param.name}: a box of {rows} rows exceeds a box's {MAX_BOX}"
    if eb == 4:
        span = F32_SPAN
        swizzle = 0
    else:
        span = MAX_SPAN
        while (cols * eb) % span:
            span //= 2
        swizzle = SWIZZLE_OF_ROW[span]
    got = TmaStore(store, acc, frag, chain, dt, rows, cols, span // eb, swizzle)
    if got.nbytes > target.max_shared_bytes:
        return (
            f"{param.name}: a staging tile of {got.nbytes} bytes exceeds the "
            f"{target.max_shared_bytes} bytes of shared memory a block may have"
        )
    return got
