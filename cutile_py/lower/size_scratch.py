"""How many bytes of shared scratch each op needs, from the plan's layouts alone (no emission).

An op needs scratch where its values move between threads through shared memory: a layout
conversion (`emit_shared.convert`: a row-major tile, rows padded by a bank when the two
layouts walk different dims), a reduction or a scan across warps (one 8-byte slot per
thread and partial), an mma operand stored from registers (swizzled tiles, `emit_mma`), an
accumulator changing between its blocked layout and mma fragments (row bands of an f32
tile), a row vector leaving fragments (`emit_fragments`). The emitters address exactly these
sizes; `EmitContext.shared_scratch` checks that they fit what `allocate_shared` planned.

`needs` answers per op, in program order of its uses of scratch: each is one lifetime,
barrier to barrier, so an op's uses share one buffer (the largest). A `ForOp` has two
moments of its own: "enter" (its carried values converted before the first trip) and
"leave" (its results converted after the last).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from math import lcm

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import DType, bool_, f32, i32
from cutile_py.ir.types import TileType
from cutile_py.ir.uses import DefUse
from cutile_py.lower.assign_fragments import WARP, FragmentPlan
from cutile_py.lower.fragments import SharedTile, round_region, warp_grid
from cutile_py.lower.layout import Layout, LayoutPlan
from cutile_py.lower.plan_pipelines import PipelinePlan
from cutile_py.lower.plan_store import TmaStore
from cutile_py.lower.plan_tma import TMA_ALIGN

#: Bytes of one shared-memory bank (rows of a conversion tile are padded by one).
BANK_BYTES = 4
#: The moments of a `ForOp`: carried values entering its layouts, results leaving them.
ENTER, LEAVE = "enter", "leave"


@dataclass(frozen=True)
class Need:
    """`nbytes` of scratch `what` needs (16-byte aligned, the widest shared access: every
    scratch buffer starts on such a boundary, and the emitters' tiles keep it)."""

    what: str
    nbytes: int
    #: The buffer's start is aligned to this many bytes (a TMA store's staging: its swizzle's
    #: repeat).
    align: int = 16


# -- the sizes the emitters address ---------------------------------------------------------
def elem_bytes(dt: type[DType]) -> int:
    """Bytes of one element in shared memory (predicates as bytes)."""
    return 1 if dt is bool_ else dt.itemsize()


def row_major(shape: tuple[int, ...], pad: int) -> list[int]:
    """Element strides of a row-major tile whose rows are padded by `pad` elements."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        inner = shape[i + 1] + (pad if i + 1 == len(shape) - 1 else 0)
        strides[i] = strides[i + 1] * inner
    return strides


def fast_last(lay: Layout) -> bool:
    """Consecutive threads walk the value's last dim (row-contiguous in shared memory)."""
    return lay.dims[-1] is not None and lay.dims[-1] == lay.base.rank - 1


def fast_dim(lay: Layout) -> int | None:
    """The value dim that `lay`'s threads walk fastest (its base's last dim), if any."""
    last = lay.base.rank - 1
    return lay.dims.index(last) if last in lay.dims else None


def transposed(src: Layout, dst: Layout, src_t: TileType, dst_t: TileType) -> bool:
    """Whether a conversion is a 2-D transpose `emit_transpose` stages (given scratch aligned
    for the source's vectors, which every planned buffer's 16-byte start is): 2-, 4- or
    8-byte elements, the source holding vectors of at least 2 along one dim and the
    destination walking the other."""
    shape = src_t.shape
    if shape != dst_t.shape or len(shape) != 2 or min(shape) < 2 or src_t.dtype is bool_:
        return False
    if src_t.dtype.itemsize() not in (2, 4, 8) or None in src.dims or None in dst.dims:
        return False
    a, b = fast_dim(src), fast_dim(dst)
    return src.base.vec >= 2 and a is not None and b is not None and a != b


def transpose_tile(src: Layout, dst: Layout, src_t: TileType) -> tuple[int, int, int, int]:
    """`emit_transpose`'s staggered tile: (its row dim, bytes per row, the gap in bytes left
    after every group of rows, log2 of the rows per group)."""
    row = fast_dim(dst)
    assert row is not None
    eb = src_t.dtype.itemsize()
    return row, src_t.shape[1 - row] * eb, src.base.vec * eb, dst.base.vec.bit_length() - 1


def transpose_bytes(src: Layout, dst: Layout, src_t: TileType) -> int:
    """Bytes of `emit_transpose`'s staggered tile: its rows, and a gap after each group."""
    row, row_bytes, gap, shift = transpose_tile(src, dst, src_t)
    rows = src_t.shape[row]
    return rows * row_bytes + (rows >> shift) * gap


def convert_bytes(src: Layout, dst: Layout, src_t: TileType, dst_t: TileType) -> int:
    """Bytes `emit_shared.convert` stages a tile in (0: a size-1 tile needs none)."""
    if not src.present:
        return 0
    if transposed(src, dst, src_t, dst_t):
        return transpose_bytes(src, dst, src_t)
    eb = elem_bytes(src_t.dtype)
    pad = 0
    if (
        src_t.shape == dst_t.shape
        and len(src_t.shape) > 1
        and not (fast_last(src) and fast_last(dst))
    ):
        pad = max(1, BANK_BYTES // eb)
    total = row_major(src_t.shape, pad)[0] * src_t.shape[0] if src_t.shape else 1
    return total * eb


def as_bytes(have: Layout, want: Layout, t: TileType) -> int:
    """Bytes `emit_shared.regs_as` needs to move a value of type `t` from `have` to `want`."""
    if not t.shape or have == want:
        return 0
    return convert_bytes(have, want, t, t)


def cross_warps(lay: Layout, d: int) -> tuple[int, int, int] | None:
    """(lo, hi, wlo): the tid bits of the threads along base dim `d` are [lo, hi), those past
    the warp's lanes [wlo, hi); None where they are all in one warp (shuffles suffice)."""
    b = lay.base
    if b.threads[d] == 1:
        return None
    lo = b.stride(d).bit_length() - 1
    hi = lo + b.threads[d].bit_length() - 1
    wlo = max(lo, 5)
    return (lo, hi, wlo) if hi > wlo else None


def reduce_slots(kind: str, dt: type[DType], partials: int) -> int:
    """8-byte slots per thread a reduction across warps stores: one per partial, and one
    per index for arg reductions that do not pack (value, index) in one 64-bit key."""
    arg = kind in ("argmax", "argmin")
    acc = f32 if dt.is_float() else (i32 if dt is bool_ and arg else dt)
    if arg and acc in (f32, i32):
        return partials
    return 2 * partials if arg else partials


def scan_runs(lay: Layout, d: int) -> int | None:
    """Runs per thread a scan along base dim `d` carries across warps (None: it does not)."""
    b = lay.base
    threads = b.threads[d]
    lo = b.stride(d).bit_length() - 1
    tbits = threads.bit_length() - 1
    lane_bits = max(0, min(lo + tbits, 5) - lo) if lo < 5 else 0
    if threads // (1 << lane_bits) <= 1:
        return None
    rows = {
        tuple(sorted((dd, off) for dd, off in offs.items() if dd != d)) for offs in lay.registers()
    }
    return len(rows) * b.reps(d)


def band_tile(lay: Layout, wm: int, m: int, n: int, budget: int) -> tuple[SharedTile, int]:
    """The f32 tile an (m, n) accumulator passes through between `lay` and fragments of
    warps `wm` along M, and its rows per band: a whole number of both the layout's row
    repetitions and the warps' M slots, as many as `budget` bytes hold (at least one)."""
    row_dim = lay.dims[0]
    assert row_dim is not None
    base = lay.base
    step = lcm(base.threads[row_dim] * base.unit(row_dim), 16 * wm)
    pad = 8 if n % 16 == 0 else 0
    one = SharedTile(0, step, n, 4, False, pad=pad)
    rows = step * max(1, min(-(-m // step), budget // one.nbytes))
    return SharedTile(0, rows, n, 4, False, pad=pad), rows


def mma_operand_tiles(op: o.MmaOp, skip: tuple[bool, bool]) -> list[SharedTile]:
    """The swizzled tiles `emit_mma.mma` stores its register operands in (not those in
    `skip`: fed from fragments, resident or staged), one after the other."""
    a, b, _ = op.operands
    dt = a.type.dtype
    at = 0
    tiles = []
    for which, v in enumerate((a, b)):
        if skip[which]:
            continue
        rows, cols = v.type.shape
        if which == 1 and dt is f32:  # tf32 B is stored transposed
            rows, cols = cols, rows
        tiles.append(SharedTile(at, rows, cols, dt.itemsize(), True))
        at += round_region(tiles[-1].nbytes)
    return tiles


# -- per op -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sizer:
    """What the sizes depend on: the plan's layouts, fragments and pipelines."""

    layouts: LayoutPlan
    fragments: FragmentPlan
    pipelines: Mapping[o.ForOp, PipelinePlan]
    uses: DefUse
    #: Where an accumulator's bands may reach (`band_tile`), and where the scratch of the
    #: op being sized starts: a band takes at most the bytes between them.
    band_limit: int
    floor: int = 0
    #: Stores carried out as TMA epilogues (`plan_store`): they need a staging tile.
    tma_stores: Mapping[o.StoreOp, TmaStore] = field(default_factory=dict)

    def lay(self, v: o.Value) -> Layout:
        return self.layouts.of(v)

    def needs(self, op: o.Op, moment: str = "") -> Iterator[Need]:
        """The scratch uses of `op` (at `moment` for a `ForOp`)."""
        if isinstance(op, o.ForOp):
            yield from (self._enter(op) if moment == ENTER else self._leave(op))
            return
        res = op.results[0] if op.results else None
        if isinstance(op, o.MmaOp):
            yield from self._mma(op)
            return
        if res is not None and self.fragments.of(res) is not None:
            return  # fragment handlers and element-wise ops on fragments stay in registers
        if isinstance(op, (o.UnaryOp, o.BinaryOp, o.CompareOp, o.SelectOp, o.FmaOp, o.CastOp)):
            assert res is not None
            if res.type.shape:
                want = self.lay(res)
                for v in op.operands:
                    yield self._conv(self.lay(v) if v.type.shape else want, want, v.type)
        elif isinstance(op, o.BroadcastOp):
            yield from self._broadcast(op)
        elif isinstance(op, (o.ReshapeOp, o.PermuteOp)):
            yield from self._view(op)
        elif isinstance(op, o.ReduceOp):
            yield from self._reduce(op)
        elif isinstance(op, o.ScanOp):
            yield from self._scan(op)
        elif isinstance(op, o.LoadOp):
            lay = self.layouts.memory.get(op) or self.lay(op.result)
            if lay != self.lay(op.result):
                yield Need(
                    "layout conversion",
                    convert_bytes(lay, self.lay(op.result), op.result.type, op.result.type),
                )
        elif isinstance(op, o.StoreOp) and op in self.tma_stores:
            yield Need("tma store staging", self.tma_stores[op].nbytes, TMA_ALIGN)
        elif isinstance(op, o.StoreOp):
            value = op.operands[-1]
            lay = self.layouts.memory.get(op) or self.lay(value)
            yield self._conv(self.lay(value), lay, value.type)
        elif isinstance(op, (o.GatherOp, o.ScatterOp, o.AtomicOp)):
            yield from self._indexed(op)

    def _conv(self, have: Layout, want: Layout, t: TileType) -> Need:
        return Need("layout conversion", as_bytes(have, want, t))

    def _broadcast(self, op: o.BroadcastOp) -> Iterator[Need]:
        (x,) = op.operands
        rl = self.lay(op.result)
        same = self.layouts.repeats.get(op)
        if same is not None and self.fragments.of(same.result) is None:
            return  # takes the registers of `same` (`emit_shared.broadcast`)
        if not x.type.shape or not self.lay(x).present:
            return
        want = Layout(rl.base, tuple(d if s > 1 else None for d, s in zip(rl.dims, x.type.shape)))
        yield self._conv(self.lay(x), want, x.type)

    def _view(self, op: o.Op) -> Iterator[Need]:
        (x,) = op.operands
        res = op.result
        xl, rl = self.lay(x), self.lay(res) if res.type.shape else None
        if isinstance(op, o.PermuteOp):
            assert rl is not None
            view = Layout(xl.base, tuple(xl.dims[a] for a in op.axes))
            yield self._conv(view, rl, res.type)
            return
        if not x.type.shape or rl is None or not xl.present:
            return
        big_in = [d for d, s in zip(xl.dims, x.type.shape) if s > 1]
        big_out = [i for i, s in enumerate(res.type.shape) if s > 1]
        if [s for s in x.type.shape if s > 1] == [res.type.shape[i] for i in big_out]:
            dims: list[int | None] = [None] * len(res.type.shape)
            for i, d in zip(big_out, big_in):
                dims[i] = d
            yield self._conv(Layout(xl.base, tuple(dims)), rl, res.type)
            return
        yield Need("layout conversion", convert_bytes(xl, rl, x.type, res.type))

    def _reduce(self, op: o.ReduceOp) -> Iterator[Need]:
        (x,) = op.operands
        xl = self.lay(x)
        d = xl.dims[op.axis]
        want = Layout(xl.base, tuple(None if i == op.axis else e for i, e in enumerate(xl.dims)))
        if d is not None and cross_warps(xl, d) is not None:
            slots = reduce_slots(op.kind, x.type.dtype, len(want.registers()))
            yield Need("reduction across warps", slots * xl.base.block * 8)
        res = op.result
        if res.type.shape:
            yield self._conv(want, self.lay(res), res.type)

    def _scan(self, op: o.ScanOp) -> Iterator[Need]:
        (x,) = op.operands
        xl = self.lay(x)
        d = xl.dims[op.axis]
        runs = scan_runs(xl, d) if d is not None else None
        if runs is not None:
            yield Need("scan across warps", runs * xl.base.block * 8)
        yield self._conv(xl, self.lay(op.result), op.result.type)

    def _indexed(self, op: o.Op) -> Iterator[Need]:
        if isinstance(op, o.GatherOp):
            coords, lay = op.operands, self.lay(op.result)
        else:
            *rest, value = op.operands
            coords, lay = tuple(rest), self.lay(value)
        for v in coords:
            yield self._conv(self.lay(v) if v.type.shape else lay, lay, v.type)

    # -- tensor cores ---------------------------------------------------------------------
    def _acc_values(self) -> set[o.Value]:
        return {v for v, f in self.fragments.values.items() if f.kind == "acc"}

    def _wm(self, mma: o.MmaOp) -> int:
        a, b, _ = mma.operands
        (m, _), n = a.type.shape, b.type.shape[1]
        grid = self.fragments.grids.get(mma) or warp_grid(
            self.layouts.threads // WARP, m // 16, n // 8
        )
        return grid.wm

    def _bands(self, mma: o.MmaOp, lay: Layout) -> Need:
        m, n = mma.result.type.shape
        tile, _ = band_tile(lay, self._wm(mma), m, n, self.band_limit - self.floor)
        return Need("accumulator band", tile.nbytes)

    def _acc_in(self, mma: o.MmaOp, acc: o.Value) -> Iterator[Need]:
        """`emit_mma.acc_fragments`: a blocked accumulator converted to fragments."""
        if acc in self._acc_values():
            return
        producer = self.uses.producer(acc)
        if isinstance(producer, o.BroadcastOp) and producer.operands[0].type.is_scalar:
            return  # a uniform accumulator: its fragments are the scalar's register
        yield self._bands(mma, self.lay(acc))

    def _mma(self, op: o.MmaOp) -> Iterator[Need]:
        a, b, acc = op.operands
        yield from self._acc_in(op, acc)
        if any(op in p.wgmma for p in self.pipelines.values()):
            return  # wgmma reads staged tiles and keeps its result in fragments
        staged = {sl.operand for p in self.pipelines.values() for sl in p.loads}
        resident = {(v, w) for p in self.pipelines.values() for v, w, _ in p.resident}
        skip = tuple(
            (which == 0 and self.fragments.of(a) is not None)
            or (v, which) in resident
            or v in staged
            for which, v in enumerate((a, b))
        )
        tiles = mma_operand_tiles(op, (skip[0], skip[1]))
        if tiles:
            yield Need("mma operands", tiles[-1].offset + round_region(tiles[-1].nbytes))
        if op.result not in self._acc_values():
            yield self._bands(op, self.lay(op.result))

    # -- loops and branches ---------------------------------------------------------------
    def _enter(self, op: o.ForOp) -> Iterator[Need]:
        for v, arg in zip(op.operands[3:], op.body.args[1:]):
            frag = self.fragments.of(arg)
            if frag is None:
                if arg.type.shape:
                    yield self._conv(
                        self.lay(v) if v.type.shape else self.lay(arg), self.lay(arg), v.type
                    )
            elif frag.kind == "acc":
                yield from self._acc_in(frag.mma, v)

    def _leave(self, op: o.ForOp) -> Iterator[Need]:
        for res, arg in zip(op.results, op.body.args[1:]):
            frag = self.fragments.of(arg)
            if frag is None:
                if res.type.shape:
                    yield self._conv(self.lay(arg), self.lay(res), arg.type)
            elif self.fragments.of(res) is not None:
                continue  # the result stays in fragments (a TMA store's value)
            elif frag.kind == "acc":
                yield self._bands(frag.mma, self.lay(res))
            else:
                yield Need("row vector out of fragments", 4 * res.type.shape[0])

    def yielded(self, op: o.YieldOp, likes: tuple[o.Value, ...]) -> Iterator[Need]:
        """A loop's or branch's `yield`: each value into the layout of what it becomes
        (`likes`: the loop's carried arguments or the branch's results)."""
        for v, like in zip(op.operands, likes):
            if self.fragments.of(like) is None and like.type.shape and v.type.shape:
                yield self._conv(self.lay(v), self.lay(like), v.type)
