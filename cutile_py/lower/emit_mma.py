"""`mma` on tensor cores: operands in swizzled shared memory, fragments loaded with
`ldmatrix`, `mma.sync` m16n8k16 (f16, bf16) or m16n8k8 (tf32).

Operands arrive in shared memory one of three ways: stored here from their registers, stored
once before the loop (`em.resident`: defined outside it), or copied there by the cp.async
pipeline of the enclosing loop (`emit_pipeline`, which then lists them in `em.staged`). A
16-bit A operand held in accumulator fragments (`assign_fragments`) is read from its
registers instead: for m16n8k16 the A fragment is a permutation of two C fragments. The
accumulator is either in mma fragment form (`em.fragment_values`) or in its blocked layout,
converted through shared memory in row bands of at most 48 KiB, so tiles of any size fit.

The fragment layouts and the shared tiles are kept apart from the instructions that use
them so that Hopper's wgmma (whose operands are these swizzled tiles, read by descriptor)
can reuse the tiles, the pipeline and the accumulator conversions.
"""

from __future__ import annotations

from dataclasses import dataclass

from cutile_py.ir import ops as o
from cutile_py.ir.builder import MMA_K_STEP
from cutile_py.ir.dtypes import DType, bf16, f16, f32
from cutile_py.lower.context import WARP, EmitContext
from cutile_py.lower.errors import LoweringError
from cutile_py.lower.fragments import (
    CHUNK,
    Ahead,
    Bindable,
    Lane,
    Operand,
    Reader,
    Setup,
    SharedTile,
    Slot,
    WarpGrid,
    log2,
    round_region,
    warp_grid,
)
from cutile_py.lower.layout import Layout
from cutile_py.lower.size_scratch import band_tile
from cutile_py.ptx.builder import Addr, Reg, Vec, f32_imm

MMA_OPCODE: dict[type[DType], str] = {
    f16: "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    bf16: "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    f32: "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
}


# -- entry --------------------------------------------------------------------------------
def setup(em: EmitContext, op: o.MmaOp) -> Setup:
    """The fragment addressing of `op` (made on first use)."""
    got = em.mma_setups.get(op)
    if got is None:
        a, b, _ = op.operands
        (m, _), n = a.type.shape, b.type.shape[1]
        grid = em.fragment_plan.grids.get(op) or warp_grid(em.plan.threads // WARP, m // 16, n // 8)
        lane = _lane_regs(em, grid)
        got = Setup(
            grid,
            lane,
            _slots(em, lane.wm, grid.wm, grid.sm, grid.fm),
            _slots(em, lane.wn, grid.wn, grid.sn, grid.fn),
        )
        em.mma_setups[op] = got
    return got


def mma(em: EmitContext, op: o.MmaOp) -> None:
    """`acc + a @ b`. The accumulator and result are in fragment form where a loop carries
    them (`em.fragment_values`), else in their blocked layouts; operands come from the
    tiles a cp.async pipeline filled (`em.staged`) or are stored from registers here."""
    a, b, acc = op.operands
    dt = a.type.dtype
    k = a.type.shape[1]
    if not em.target.mma_sync:
        raise LoweringError(f"mma needs mma.sync, which {em.target.name} does not have")
    s = setup(em, op)
    em.fb.comment(f"mma {a.type} @ {b.type} + {acc.type}: warps {s.grid.wm}x{s.grid.wn}")
    frags = acc_fragments(em, op, acc)
    at = 0
    stores: list[tuple[Operand, o.Value, bool]] = []
    ops: list[Operand | Reader] = []
    # An A operand computed in accumulator fragments (16-bit) is read from its registers.
    fed = em.fragment_plan.of(a) is not None
    for which, v in enumerate((a, b)):
        if which == 0 and fed:
            ops.append(_fed_reader(em, a, len(s.slots_m), k))
            continue
        resident = em.resident.get((v, which))
        if resident is not None:
            ops.append(resident)
            continue
        staged = em.staged.get(v)
        if staged is not None:
            tile, k_rows, stage = staged
            hoisted = em.staged_readers.get((v, which))
            if hoisted is not None:
                ops.append(hoisted(stage))
                continue
            base = em.fb.reg("b32")
            assert em.smem is not None
            em.fb.ins("add.u32", base, em.smem, stage)
            ops.append(Operand(tile, base, k_rows, unrounded=dt is f32))
            continue
        rows, cols = v.type.shape
        # A is stored as it is (M rows), B transposed to N rows for tf32 (read with plain
        # ldmatrix), as it is (K rows, ldmatrix.trans) for 16-bit types.
        transpose = which == 1 and dt is f32
        if transpose:
            rows, cols = cols, rows
        tile = SharedTile(at, rows, cols, dt.itemsize(), True)
        at += round_region(tile.nbytes)
        operand = Operand(tile, em.shared_scratch(0), k_rows=which == 1 and not transpose)
        stores.append((operand, v, transpose))
        ops.append(operand)
    if stores:
        em.shared_scratch(at)
        em.barrier()  # earlier readers of this region (the previous iteration) are done
        for operand, v, transpose in stores:
            store_tile(
                em,
                operand.base,
                operand.tile,
                em.regs(v),
                em.layout(v),
                transpose=transpose,
                tf32=dt is f32,
            )
        em.barrier()
    frags = warp_mma(em, dt, k, ops[0], ops[1], s, frags, em.ahead.get(op))
    if op.result in em.fragment_values:
        if stores:
            # The next user of scratch (a reduction, a layout change, this op in the next
            # iteration) writes it without a barrier first: every warp must be done reading.
            em.barrier()
        em.define(op.result, [x for row in frags for c in row for x in c])
    else:
        em.define(op.result, fragments_to_blocked(em, s, frags, em.layout(op.result), op))


def acc_fragments(em: EmitContext, op: o.MmaOp, acc: o.Value) -> list[list[list[Reg]]]:
    """The accumulator `acc` of `op` as fragments [M slot][N slot][4] (converted through
    shared scratch if it is blocked)."""
    s = setup(em, op)
    if acc in em.fragment_values:
        flat = em.regs(acc)
        assert len(flat) == s.count
        return [
            [
                flat[4 * (i * len(s.slots_n) + j) : 4 * (i * len(s.slots_n) + j) + 4]
                for j in range(len(s.slots_n))
            ]
            for i in range(len(s.slots_m))
        ]
    uniform = _uniform_acc(em, acc)
    if uniform is not None:
        return [[[uniform] * 4 for _ in s.slots_n] for _ in s.slots_m]
    return blocked_to_fragments(em, s, em.regs(acc), em.layout(acc), op)


def _uniform_acc(em: EmitContext, acc: o.Value) -> Reg | None:
    """The scalar register of an accumulator that is a broadcast scalar (`a @ b`'s zeros):
    its fragments are that register, with no trip through shared memory."""
    op = em.uses.producer(acc)
    if isinstance(op, o.BroadcastOp) and op.operands[0].type.is_scalar:
        return em.regs(op.operands[0])[0]
    return None


# -- accumulator: blocked layout <-> fragments, through shared memory in row bands ------------
@dataclass(frozen=True)
class _Bands:
    """The accumulator staged `rows` rows at a time: band p holds rows [p*rows, (p+1)*rows),
    which is a whole number of both the blocked layout's row repetitions and the warps' M
    slots, so every thread knows statically which of its registers and slots each band
    holds."""

    tile: SharedTile
    rows: int
    count: int
    row_dim: int

    def has_slot(self, p: int, slot: Slot) -> bool:
        return p * self.rows <= slot.nominal * 16 < (p + 1) * self.rows


def _bands(em: EmitContext, s: Setup, lay: Layout, m: int, n: int) -> _Bands:
    row_dim = lay.dims[0]
    assert row_dim is not None
    # As many rows as fit between the planned buffer and the plan's band limit.
    assert em.scratch_user is not None
    buf = em.shared.scratch.get(em.scratch_user)
    budget = em.shared.band_limit - (buf.offset if buf is not None else 0)
    tile, rows = band_tile(lay, s.grid.wm, m, n, budget)
    return _Bands(tile, rows, -(-m // rows), row_dim)


def fragments_to_blocked(
    em: EmitContext, s: Setup, frags: list[list[list[Reg]]], lay: Layout, op: o.MmaOp
) -> list[Reg]:
    """Accumulator fragments into the blocked layout `lay` of `op`'s result, through
    shared scratch."""
    m, n = op.result.type.shape
    bands = _bands(em, s, lay, m, n)
    smem = em.shared_scratch(bands.tile.nbytes)
    out: list[Reg | None] = [None] * lay.count()
    for p in range(bands.count):
        sel = [i for i, sm in enumerate(s.slots_m) if bands.has_slot(p, sm)]
        shift = p * bands.rows
        em.barrier()
        addr = _c_fragment_addresses(em, smem, bands.tile, s.lane, s.slots_m, s.slots_n, shift)
        _store_c_fragments(em, addr, bands.tile, s.slots_m, s.slots_n, frags, sel)
        em.barrier()
        band = (shift, shift + bands.rows, bands.row_dim)
        for idx, r in load_tile(em, smem, bands.tile, lay, band):
            out[idx] = r
    em.barrier()
    assert all(r is not None for r in out)
    return [r for r in out if r is not None]


def blocked_to_fragments(
    em: EmitContext, s: Setup, regs: list[Reg], lay: Layout, op: o.MmaOp
) -> list[list[list[Reg]]]:
    """An accumulator in blocked registers `regs` (layout `lay`) as fragments, through
    shared scratch."""
    m, n = op.result.type.shape
    bands = _bands(em, s, lay, m, n)
    smem = em.shared_scratch(bands.tile.nbytes)
    frags: list[list[list[Reg]]] = [[[] for _ in s.slots_n] for _ in s.slots_m]
    for p in range(bands.count):
        shift = p * bands.rows
        em.barrier()
        band = (shift, shift + bands.rows, bands.row_dim)
        store_tile(em, smem, bands.tile, regs, lay, transpose=False, band=band)
        em.barrier()
        sel = [i for i, sm in enumerate(s.slots_m) if bands.has_slot(p, sm)]
        addr = _c_fragment_addresses(em, smem, bands.tile, s.lane, s.slots_m, s.slots_n, shift)
        got = _load_c_fragments(em, addr, bands.tile, s.slots_m, s.slots_n, sel)
        for i in sel:
            frags[i] = got[i]
    em.barrier()
    return frags


# -- lanes, warps, slots --------------------------------------------------------------------
def _lane_regs(em: EmitContext, grid: WarpGrid) -> Lane:
    fb, tid = em.fb, em.tid
    assert tid is not None
    lane, warp, g, t, wm, wn = (fb.reg("b32") for _ in range(6))
    fb.ins("and.b32", lane, tid, WARP - 1)
    fb.ins("shr.u32", warp, tid, log2(WARP))
    fb.ins("shr.u32", g, lane, 2)
    fb.ins("and.b32", t, lane, 3)
    fb.ins("and.b32", wn, warp, grid.wn - 1)
    fb.ins("shr.u32", wm, warp, log2(grid.wn))
    return Lane(lane, g, t, wm, wn)


def _slots(em: EmitContext, w: Reg, warps: int, slots: int, frags: int) -> list[Slot]:
    """Slot s of warp coordinate w holds fragment w + s * warps. Only the last slot can run
    past `frags`; its index is clamped (its loads stay in bounds) and it gets a predicate."""
    out = [Slot(w, s * warps, None, s * warps) for s in range(slots)]
    if frags % warps:
        fb = em.fb
        last = slots - 1
        idx, valid = fb.reg("b32"), fb.reg("pred")
        fb.ins("add.u32", idx, w, last * warps)
        fb.ins("setp.lt.u32", valid, idx, frags)
        fb.ins("min.u32", idx, idx, frags - 1)
        out[last] = Slot(idx, 0, valid, last * warps)
    return out


# -- blocked registers <-> shared tiles -----------------------------------------------------
def _group(lay: Layout, col_dim: int, eb: int) -> int:
    """Registers stored as one vector: consecutive elements along the tile's column dim."""
    base = lay.base
    if col_dim != base.rank - 1:
        return 1
    return min(base.vec, CHUNK // eb)


#: Rows [lo, hi) of base dim `dim` of a layout, staged as rows 0 .. hi - lo of a tile.
Band = tuple[int, int, int]


def shared_addresses(
    em: EmitContext,
    smem: Reg,
    tile: SharedTile,
    lay: Layout,
    row_dim: int,
    col_dim: int,
    group: int,
    band: Band | None = None,
) -> list[tuple[dict[int, int], Reg, int]]:
    """(offsets, address register, immediate) of each group of `group` registers (of the
    rows in `band` only, if given: unswizzled tiles)."""
    fb = em.fb
    coord = em.bases[lay.base].coord
    regs = lay.registers()
    heads = [offs for offs in regs if lay.base.position(col_dim, offs[col_dim]) % group == 0]
    shift = 0
    if band is not None:
        lo, hi, dim = band
        assert dim == row_dim and not tile.swizzled
        heads = [offs for offs in heads if lo <= offs[row_dim] < hi]
        shift = lo
    if not tile.swizzled:
        lane = fb.reg("b32")
        fb.ins("mad.lo.u32", lane, coord[row_dim], tile.row_bytes, smem)
        fb.ins("mad.lo.u32", lane, coord[col_dim], tile.eb, lane)
        return [
            (
                offs,
                lane,
                tile.offset + (offs[row_dim] - shift) * tile.row_bytes + offs[col_dim] * tile.eb,
            )
            for offs in heads
        ]
    per_chunk = CHUNK // tile.eb
    rows: dict[int, tuple[Reg, Reg]] = {}
    cols: dict[int, tuple[Reg, Reg, Reg | None]] = {}
    out = []
    for offs in heads:
        ro, co = offs[row_dim], offs[col_dim]
        if ro not in rows:
            r, base, f = fb.reg("b32"), fb.reg("b32"), fb.reg("b32")
            fb.ins("add.u32", r, coord[row_dim], ro)
            fb.ins("mad.lo.u32", base, r, tile.row_bytes, smem)
            _xor_value(em, f, r, tile)
            rows[ro] = (base, f)
        if co not in cols:
            c, chunk, within = fb.reg("b32"), fb.reg("b32"), fb.reg("b32")
            fb.ins("add.u32", c, coord[col_dim], co)
            fb.ins("shr.u32", chunk, c, log2(per_chunk))
            fb.ins("and.b32", within, c, per_chunk - 1)
            fb.ins("shl.b32", within, within, log2(tile.eb))
            panel = None
            if tile.panels > 1:  # chunk ^ f keeps the panel: skip rows - 1 rows per panel
                panel = fb.reg("b32")
                fb.ins("shr.u32", panel, chunk, log2(tile.row_bytes // CHUNK))
                fb.ins("mul.lo.u32", panel, panel, (tile.rows - 1) * tile.row_bytes)
            cols[co] = (chunk, within, panel)
        base, f = rows[ro]
        chunk, within, panel = cols[co]
        x = fb.reg("b32")
        fb.ins("xor.b32", x, chunk, f)
        fb.ins("shl.b32", x, x, log2(CHUNK))
        fb.ins("or.b32", x, x, within)
        if panel is not None:
            fb.ins("add.u32", x, x, panel)
        fb.ins("add.u32", x, x, base)
        out.append((offs, x, tile.offset))
    return out


def _xor_value(em: EmitContext, dst: Reg, row: Reg, tile: SharedTile) -> None:
    """dst = f(row) = (row / R) * xor_step % S, the XOR applied to chunk indices of that
    row."""
    fb = em.fb
    fb.ins("shr.u32", dst, row, log2(tile.rows_per_step))
    if tile.xor_step > 1:
        fb.ins("shl.b32", dst, dst, log2(tile.xor_step))
    fb.ins("and.b32", dst, dst, tile.xor_width - 1)


def store_tile(
    em: EmitContext,
    smem: Reg,
    tile: SharedTile,
    regs: list[Reg],
    lay: Layout,
    *,
    transpose: bool,
    tf32: bool = False,
    band: Band | None = None,
) -> None:
    """Write a 2-D value from its blocked registers into `tile` (value dim 0 along rows, or
    along columns if `transpose`; only the rows in `band` if given); f32 values are rounded
    to tf32 on the way if `tf32`."""
    fb = em.fb
    row_dim, col_dim = lay.dims[1 if transpose else 0], lay.dims[0 if transpose else 1]
    assert row_dim is not None and col_dim is not None
    group = _group(lay, col_dim, tile.eb)
    owner = em.owner(lay)
    for offs, base, imm in shared_addresses(em, smem, tile, lay, row_dim, col_dim, group, band):
        pred = em.conj(em.valid(lay, offs), owner)
        elems = [regs[lay.index({**offs, col_dim: offs[col_dim] + v})] for v in range(group)]
        if tf32:
            rounded = []
            for x in elems:
                r = fb.reg("b32")
                fb.ins("cvt.rna.tf32.f32", r, x)
                rounded.append(r)
            elems = rounded
        if tile.eb == 2 and group > 1:
            words = []
            for lo, hi in zip(elems[::2], elems[1::2]):
                w = fb.reg("b32")
                fb.ins("mov.b32", w, Vec((lo, hi)))
                words.append(w)
            elems = words
        kind = "f32" if elems[0].ptype == "f32" else "b16" if tile.eb * group == 2 else "b32"
        fb.ins(f"st.shared{_vec(len(elems))}.{kind}", Addr(base, imm), _operand(elems), pred=pred)


def load_tile(
    em: EmitContext, smem: Reg, tile: SharedTile, lay: Layout, band: Band | None = None
) -> list[tuple[int, Reg]]:
    """Read an f32 tile into the blocked layout `lay` (0 past the value's edges; only the
    rows in `band` if given): (register index, register) pairs."""
    fb = em.fb
    row_dim, col_dim = lay.dims
    assert row_dim is not None and col_dim is not None
    group = _group(lay, col_dim, tile.eb)
    out: list[tuple[int, Reg]] = []
    for offs, base, imm in shared_addresses(em, smem, tile, lay, row_dim, col_dim, group, band):
        pred = em.valid(lay, offs)
        elems = [fb.reg("f32") for _ in range(group)]
        if pred is not None:
            for x in elems:
                fb.ins("mov.f32", x, f32_imm(0.0))
        fb.ins(f"ld.shared{_vec(group)}.f32", _operand(elems), Addr(base, imm), pred=pred)
        for v, x in enumerate(elems):
            out.append((lay.index({**offs, col_dim: offs[col_dim] + v}), x))
    return out


def _vec(n: int) -> str:
    return "" if n == 1 else f".v{n}"


def _operand(regs: list[Reg]) -> Reg | Vec:
    return regs[0] if len(regs) == 1 else Vec(tuple(regs))


# -- accumulator fragments ------------------------------------------------------------------
def _c_fragment_addresses(
    em: EmitContext,
    smem: Reg,
    tile: SharedTile,
    lane: Lane,
    slots_m: list[Slot],
    slots_n: list[Slot],
    shift: int = 0,
) -> dict[tuple[int, int], tuple[Reg, int]]:
    """Where this lane's d0, d1 (row g, cols 2t, 2t+1) of fragment slot (i, j) live, in a
    tile whose row 0 is accumulator row `shift`; d2, d3 are 8 rows further."""
    fb = em.fb
    base = fb.reg("b32")
    fb.ins("mad.lo.u32", base, lane.g, tile.row_bytes, smem)
    fb.ins("mad.lo.u32", base, lane.t, 2 * tile.eb, base)
    cache: dict[tuple[str, str], Reg] = {}
    out = {}
    for i, sm in enumerate(slots_m):
        for j, sn in enumerate(slots_n):
            key = (sm.reg.name, sn.reg.name)
            if key not in cache:
                r = fb.reg("b32")
                fb.ins("mad.lo.u32", r, sm.reg, 16 * tile.row_bytes, base)
                fb.ins("mad.lo.u32", r, sn.reg, 8 * tile.eb, r)
                cache[key] = r
            imm = tile.offset + (sm.static * 16 - shift) * tile.row_bytes + sn.static * 8 * tile.eb
            out[(i, j)] = (cache[key], imm)
    return out


def _slot_valid(em: EmitContext, sm: Slot, sn: Slot) -> Reg | None:
    return em.conj(sm.valid, sn.valid)


def _load_c_fragments(
    em: EmitContext,
    addr: dict[tuple[int, int], tuple[Reg, int]],
    tile: SharedTile,
    slots_m: list[Slot],
    slots_n: list[Slot],
    sel: list[int],
) -> dict[int, list[list[Reg]]]:
    """Accumulator fragments of the M slots `sel` from the staged tile. A clamped slot that
    is not a real fragment reads nothing (its values are never stored)."""
    fb = em.fb
    out = {}
    for i in sel:
        sm = slots_m[i]
        row = []
        for j, sn in enumerate(slots_n):
            reg, imm = addr[(i, j)]
            pred = _slot_valid(em, sm, sn)
            c = [fb.reg("f32") for _ in range(4)]
            if pred is not None:
                for x in c:
                    fb.ins("mov.f32", x, f32_imm(0.0))
            fb.ins("ld.shared.v2.f32", Vec((c[0], c[1])), Addr(reg, imm), pred=pred)
            fb.ins(
                "ld.shared.v2.f32",
                Vec((c[2], c[3])),
                Addr(reg, imm + 8 * tile.row_bytes),
                pred=pred,
            )
            row.append(c)
        out[i] = row
    return out


def _store_c_fragments(
    em: EmitContext,
    addr: dict[tuple[int, int], tuple[Reg, int]],
    tile: SharedTile,
    slots_m: list[Slot],
    slots_n: list[Slot],
    frags: list[list[list[Reg]]],
    sel: list[int],
) -> None:
    fb = em.fb
    for i in sel:
        sm = slots_m[i]
        for j, sn in enumerate(slots_n):
            reg, imm = addr[(i, j)]
            pred = _slot_valid(em, sm, sn)
            d = frags[i][j]
            fb.ins("st.shared.v2.f32", Addr(reg, imm), Vec((d[0], d[1])), pred=pred)
            fb.ins(
                "st.shared.v2.f32",
                Addr(reg, imm + 8 * tile.row_bytes),
                Vec((d[2], d[3])),
                pred=pred,
            )


def _tf32(em: EmitContext, regs: list[Reg]) -> list[Reg]:
    """f32 fragment registers rounded to tf32 (to nearest, ties away, as `cvt.rna`)."""
    out = []
    for x in regs:
        r = em.fb.reg("b32")
        em.fb.ins("cvt.rna.tf32.f32", r, x)
        out.append(r)
    return out


def _pairs(em: EmitContext, lane: Reg, slots: list[tuple[Reg, int]]) -> list[tuple[Reg, int, int]]:
    """B slot addresses (register + immediate) grouped for ldmatrix: consecutive pairs as one
    `.x4` (lanes 16-31 give the second slot's rows) with the immediates folded into the
    register, and an odd last slot as `.x2`. Per group: (register, immediate, slots)."""
    fb = em.fb
    if len(slots) < 2:
        return [(reg, imm, 1) for reg, imm in slots]
    bit, upper = fb.reg("b32"), fb.reg("pred")
    fb.ins("and.b32", bit, lane, 16)
    fb.ins("setp.ne.u32", upper, bit, 0)
    out = []
    for j in range(0, len(slots) - 1, 2):
        (r0, i0), (r1, i1) = slots[j], slots[j + 1]
        lo, hi, addr = fb.reg("b32"), fb.reg("b32"), fb.reg("b32")
        fb.ins("add.u32", lo, r0, i0)
        fb.ins("add.u32", hi, r1, i1)
        fb.ins("selp.b32", addr, hi, lo, upper)
        out.append((addr, 0, 2))
    if len(slots) % 2:
        reg, imm = slots[-1]
        out.append((reg, imm, 1))
    return out


# -- the warp's fragment loop ---------------------------------------------------------------
class _Chunks:
    """Swizzled chunk offsets `((idx + static) ^ f) * 16` as register + immediate, where
    idx = `reg`'s value and `static` has no bits in common with it. The XOR touches only the
    bits below `width`, so one register serves every `static` with the same low bits."""

    def __init__(self, em: EmitContext, reg: Reg, f: Reg, width: int) -> None:
        self.em, self.width = em, width
        self.x = em.fb.reg("b32")
        em.fb.ins("xor.b32", self.x, reg, f)
        self.cache: dict[int, Reg] = {}

    def at(self, static: int) -> tuple[Reg, int]:
        low = static & (self.width - 1)
        if low not in self.cache:
            fb = self.em.fb
            r = fb.reg("b32")
            if low:
                fb.ins("xor.b32", r, self.x, low)
                fb.ins("shl.b32", r, r, log2(CHUNK))
            else:
                fb.ins("shl.b32", r, self.x, log2(CHUNK))
            self.cache[low] = r
        return self.cache[low], (static - low) * CHUNK


def _lane_xor(em: EmitContext, lane: Reg, tile: SharedTile) -> Reg:
    """f(row) for a lane whose fragment row is lane % 8 modulo 8 (all ldmatrix rows here)."""
    fb = em.fb
    r, f = fb.reg("b32"), fb.reg("b32")
    fb.ins("and.b32", r, lane, 7)
    _xor_value(em, f, r, tile)
    return f


def _row_fragments(
    em: EmitContext, smem: Reg, tile: SharedTile, lane: Reg, rows: int, slots: list[Slot]
) -> tuple[list[tuple[Reg, int]], _Chunks]:
    """Addressing of a tile read along its rows, `rows` per fragment (A: 16 with .x4;
    B with N rows: 8 with .x2): per slot, the lane's row address; and the lane's chunk offsets
    for chunk 2*kstep + (second matrix half)."""
    fb = em.fb
    lrow, half = fb.reg("b32"), fb.reg("b32")
    fb.ins("and.b32", lrow, lane, rows - 1)
    fb.ins("shr.u32", half, lane, log2(rows))
    fb.ins("and.b32", half, half, 1)
    chunks = _Chunks(em, half, _lane_xor(em, lane, tile), max(2, tile.xor_width))
    cache: dict[str, Reg] = {}
    out = []
    for s in slots:
        if s.reg.name not in cache:
            r = fb.reg("b32")
            fb.ins("mad.lo.u32", r, s.reg, rows, lrow)
            fb.ins("mad.lo.u32", r, r, tile.row_bytes, smem)
            cache[s.reg.name] = r
        out.append((cache[s.reg.name], tile.offset + s.static * rows * tile.row_bytes))
    return out, chunks


class _Staged:
    """`reg + stage` per address register, made on first use in one bound reader."""

    def __init__(self, em: EmitContext, stage: Reg | None) -> None:
        self.em, self.stage = em, stage
        self.done: dict[str, Reg] = {}

    def __call__(self, reg: Reg) -> Reg:
        if self.stage is None:
            return reg
        if reg.name not in self.done:
            r = self.em.fb.reg("b32")
            self.em.fb.ins("add.u32", r, reg, self.stage)
            self.done[reg.name] = r
        return self.done[reg.name]


def _ldmatrix(em: EmitContext, count: int, trans: bool, where: Addr, rounded: bool) -> list[Reg]:
    """`ldmatrix .x{count}` (`.trans`): its registers, rounded to tf32 if not `rounded`."""
    regs = [em.fb.reg("b32") for _ in range(count)]
    opcode = f"ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if trans else ''}.shared.b16"
    em.fb.ins(opcode, Vec(tuple(regs)), where)
    return regs if rounded else _tf32(em, regs)


def _per_slot(regs: list[Reg], which: int) -> list[list[Reg]]:
    """One ldmatrix's registers per slot: A's 4 for its slot, B's 2 per slot (one or two)."""
    return [regs] if which == 0 else [regs[c : c + 2] for c in range(0, len(regs), 2)]


def _mn_rows(em: EmitContext, op: Operand, s: Setup, which: int, ksteps: int) -> Bindable:
    """An operand with M rows (A: `.x4` per slot, 16 rows) or N rows (B: 8 rows per slot,
    two slots per `.x4`), read with plain ldmatrix at the k step's two chunks."""
    lane = s.lane.lane
    if which == 0:
        rows, chunks = _row_fragments(em, op.base, op.tile, lane, 16, s.slots_m)
        groups = [(r, imm, 2) for r, imm in rows]
    else:
        rows, chunks = _row_fragments(em, op.base, op.tile, lane, 8, s.slots_n)
        groups = _pairs(em, lane, rows)
    cols = [chunks.at(2 * ks) for ks in range(ksteps)]

    def bind(stage: Reg | None) -> Reader:
        staged = _Staged(em, stage)

        def read(ks: int) -> list[list[Reg]]:
            col, col_imm = cols[ks]
            col = staged(col)
            out: list[list[Reg]] = []
            for reg, imm, count in groups:
                addr = em.fb.reg("b32")
                em.fb.ins("add.u32", addr, reg, col)
                where = Addr(addr, imm + col_imm)
                regs = _ldmatrix(em, 2 * count, False, where, not op.unrounded)
                out.extend(_per_slot(regs, which))
            return out

        return read

    return bind


def _k_rows_trans(em: EmitContext, op: Operand, s: Setup, which: int) -> Bindable:
    """A 16-bit operand with K rows, read with `ldmatrix.trans`. A: `.x4` per M slot, its
    matrices (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15) from lanes
    0-7, ..., 24-31; B: 8 columns of N per slot, k 0-15 from lanes 0-15, and a second slot
    from lanes 16-31 where slots pair up (`.x4`)."""
    fb, tile, lane = em.fb, op.tile, s.lane.lane
    krow, half = fb.reg("b32"), fb.reg("b32")
    if which == 0:
        upper = fb.reg("b32")  # lanes 16-31: k rows 8-15
        fb.ins("shr.u32", upper, lane, 1)
        fb.ins("and.b32", upper, upper, 8)
        fb.ins("and.b32", krow, lane, 7)
        fb.ins("or.b32", krow, krow, upper)
        fb.ins("shr.u32", half, lane, 3)  # lanes 8-15, 24-31: m 8-15, the next chunk
        fb.ins("and.b32", half, half, 1)
        slots, warps, per_slot = s.slots_m, s.grid.wm, 2
    else:
        fb.ins("and.b32", krow, lane, 15)
        slots, warps, per_slot = s.slots_n, s.grid.wn, 1
    lane_base = fb.reg("b32")
    fb.ins("mad.lo.u32", lane_base, krow, tile.row_bytes, op.base)
    f = _lane_xor(em, lane, tile)
    cols: dict[str, _Chunks] = {}
    addrs = []
    for sl in slots:
        if sl.reg.name not in cols:
            # Slot statics are multiples of the warp count, the warp coordinate is below it.
            idx = sl.reg
            if which == 0:
                idx = fb.reg("b32")
                fb.ins("mad.lo.u32", idx, sl.reg, 2, half)
            cols[sl.reg.name] = _Chunks(em, idx, f, max(per_slot * warps, tile.xor_width))
        col, imm = cols[sl.reg.name].at(per_slot * sl.static)
        r = fb.reg("b32")
        fb.ins("add.u32", r, lane_base, col)
        addrs.append((r, tile.offset + imm))
    groups = [(r, imm, 2) for r, imm in addrs] if which == 0 else _pairs(em, lane, addrs)
    step_bytes = MMA_K_STEP[f16] * tile.row_bytes

    def bind(stage: Reg | None) -> Reader:
        staged = _Staged(em, stage)

        def read(ks: int) -> list[list[Reg]]:
            out: list[list[Reg]] = []
            for reg, imm, count in groups:
                where = Addr(staged(reg), imm + ks * step_bytes)
                out.extend(_per_slot(_ldmatrix(em, 2 * count, True, where, True), which))
            return out

        return read

    return bind


def _k_rows_words(em: EmitContext, op: Operand, s: Setup, which: int) -> Bindable:
    """A tf32 operand with K rows, read a word per register (ldmatrix cannot transpose
    32-bit elements): lane (g, t) reads k = t and t + 4 at m = g and g + 8 (A: a0 (g, t),
    a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)) or at n = g (B: b0 (t, g), b1 (t+4, g)). The
    tile's `xor_step` 2 swizzle puts the 4 rows x 2 chunks a warp reads on distinct banks."""
    fb, tile, lane = em.fb, op.tile, s.lane
    assert tile.xor_step == 2, tile
    f, q, lane_base, within = fb.reg("b32"), fb.reg("b32"), fb.reg("b32"), fb.reg("b32")
    _xor_value(em, f, lane.t, tile)  # rows t + 8 ks + 4 j share it: 8 is a multiple of R S / 2
    fb.ins("shr.u32", q, lane.g, 2)  # g's chunk within the 8 columns
    fb.ins("and.b32", within, lane.g, 3)
    fb.ins("shl.b32", within, within, 2)
    fb.ins("mad.lo.u32", lane_base, lane.t, tile.row_bytes, op.base)
    fb.ins("add.u32", lane_base, lane_base, within)
    # Per slot, chunks per fragment (A: 16 rows of M, 4 chunks; B: 8 of N, 2).
    slots, warps, per_slot, halves = (
        (s.slots_m, s.grid.wm, 4, 2) if which == 0 else (s.slots_n, s.grid.wn, 2, 1)
    )
    cols: dict[str, _Chunks] = {}
    addrs: list[list[tuple[Reg, int]]] = []
    for sl in slots:
        if sl.reg.name not in cols:
            idx = fb.reg("b32")
            fb.ins("mad.lo.u32", idx, sl.reg, per_slot, q)
            cols[sl.reg.name] = _Chunks(em, idx, f, max(per_slot * warps, tile.xor_width))
        per_half = []
        for h in range(halves):  # A: m = g, then g + 8 (two chunks further)
            col, imm = cols[sl.reg.name].at(per_slot * sl.static + 2 * h)
            r = fb.reg("b32")
            fb.ins("add.u32", r, lane_base, col)
            per_half.append((r, tile.offset + imm))
        addrs.append(per_half)

    def bind(stage: Reg | None) -> Reader:
        staged = _Staged(em, stage)

        def read(ks: int) -> list[list[Reg]]:
            out = []
            for per_half in addrs:
                regs = []
                for j in range(2):  # k = t, then t + 4
                    for reg, imm in per_half:
                        x = fb.reg("b32")
                        row = (MMA_K_STEP[f32] * ks + 4 * j) * tile.row_bytes
                        fb.ins("ld.shared.b32", x, Addr(staged(reg), imm + row))
                        regs.append(x)
                out.append(_tf32(em, regs) if op.unrounded else regs)
            return out

        return read

    return bind


def reader(em: EmitContext, dt: type[DType], op: Operand, s: Setup, which: int, k: int) -> Bindable:
    """The fragment addressing of operand `which` (0: A, 1: B) of a K-`k` mma in `op`'s
    tile, all of it emitted here (before a loop, for a pipeline's tiles)."""
    if not op.k_rows:
        return _mn_rows(em, op, s, which, k // MMA_K_STEP[dt])
    if dt is f32:
        return _k_rows_words(em, op, s, which)
    return _k_rows_trans(em, op, s, which)


def _fed_reader(em: EmitContext, v: o.Value, m_slots: int, k: int) -> Reader:
    """The A operand of an m16n8k16 mma from the 16-bit accumulator fragments of `v` (M x K):
    for k step ks, N slots 2 ks and 2 ks + 1 give the A fragment's (row g, k 2t..2t+1),
    (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..) pairs, packed two halves to a register."""
    frag = em.fragment_plan.of(v)
    assert frag is not None
    xs = em.regs(v)
    sn = frag.grid.sn
    assert frag.grid.wn == 1 and frag.grid.sm == m_slots and sn * 8 == k, (frag, k)
    fb = em.fb

    def pack(lo: Reg, hi: Reg) -> Reg:
        r = fb.reg("b32")
        fb.ins("mov.b32", r, Vec((lo, hi)))
        return r

    def read(ks: int) -> list[list[Reg]]:
        out = []
        for i in range(m_slots):
            regs = []
            for j in (2 * ks, 2 * ks + 1):
                at = 4 * (i * sn + j)
                regs += [pack(xs[at], xs[at + 1]), pack(xs[at + 2], xs[at + 3])]
            out.append([regs[0], regs[1], regs[2], regs[3]])
        return out

    return read


def warp_mma(
    em: EmitContext,
    dt: type[DType],
    k: int,
    a: Operand | Reader,
    b: Operand | Reader,
    s: Setup,
    frags: list[list[list[Reg]]],
    ahead: Ahead | None = None,
) -> list[list[list[Reg]]]:
    """Each warp's K loop (unrolled): read its A and B fragments from shared memory, one
    mma.sync per (M slot, N slot); returns the new accumulator fragments. With `ahead`
    the fragments of k step ks + 1 are read before the mmas of step ks (two sets of
    registers), the first step's were read by the previous iteration, and before the last
    step's mmas the pipeline turns to its next stage and its first step is read: the
    tensor cores need not wait for shared memory after the barrier."""
    fb = em.fb
    read_a = reader(em, dt, a, s, 0, k)(None) if isinstance(a, Operand) else a
    read_b = reader(em, dt, b, s, 1, k)(None) if isinstance(b, Operand) else b
    opcode = MMA_OPCODE[dt]
    steps = k // MMA_K_STEP[dt]
    now = ahead.held if ahead is not None else None
    for ks in range(steps):
        if ahead is None:
            a_regs, b_regs = read_a(ks), read_b(ks)
        else:
            assert now is not None
            a_regs, b_regs = now
            if ks + 1 < steps:
                now = (read_a(ks + 1), read_b(ks + 1))
            else:
                stage = ahead.turn()  # every warp has read this stage: it is refilled
                now = (ahead.readers[0](stage)(0), ahead.readers[1](stage)(0))
        new = []
        for i in range(len(s.slots_m)):
            row = []
            for j in range(len(s.slots_n)):
                d = [fb.reg("f32") for _ in range(4)]
                fb.ins(
                    opcode,
                    Vec(tuple(d)),
                    Vec(tuple(a_regs[i])),
                    Vec(tuple(b_regs[j])),
                    Vec(tuple(frags[i][j])),
                )
                row.append(d)
            new.append(row)
        frags = new
    if ahead is not None:
        assert now is not None
        # The next iteration's first step reads them where the loop entered with them.
        for held, got in zip(ahead.held, now):
            for hs, gs in zip(held, got, strict=True):
                for h, g in zip(hs, gs, strict=True):
                    fb.ins("mov.b32", h, g)
    return frags
