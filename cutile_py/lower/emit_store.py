"""The TMA store epilogue (`plan_store.TmaStore`): a loop's accumulator fragments, cast to
the tensor's dtype, written into a shared staging tile in the boxes' layout, then stored by
one thread with `cp.async.bulk.tensor`:

    every thread:  its fragments into the staging tile (stmatrix for 16-bit elements,
                   st.shared.v2.f32 for f32), then fence.proxy.async.shared::cta (its
                   generic writes before the copy engine's reads)
    barrier
    thread 0:      if the tile index is sane, one cp.async.bulk.tensor store per panel
                   (the tensor map clips what lies past the tensor); commit_group;
                   wait_group.read 0 (the staging memory is read: it may be reused)
    barrier        (before anything writes the staging memory again: the next tile of a
                   persistent block, a later loop's ring; at the kernel's end it costs
                   nothing, the block's resources go when its last thread exits)

Deferred (`Persistence.deferred`: a persistent block whose staging tile nothing else
overlaps), the wait and its barrier move to the start of the next tile's epilogue, before the
staging tile is written again, so the next tile's loop does not wait for the copy engine;
`wait_all` closes the block (the staging memory must outlive the copy engine's reads).

Staging addresses (panel p of `rows` x `span` bytes, row r, 16-byte chunk c of the row):
`p * rows * span + r * span + (c ^ x(r)) * 16`, x(r) the swizzle's XOR of row r, which for
a fragment row (16 m + lane-dependent part) depends on the lane alone: per distinct static
chunk one address register, every other offset an immediate.
"""

from __future__ import annotations

from collections.abc import Sequence

from cutile_py.ir import ops as o
from cutile_py.lower import emit_mma
from cutile_py.lower.context import EmitContext
from cutile_py.lower.fragments import CHUNK, Setup, Slot, log2
from cutile_py.lower.plan_store import TmaStore
from cutile_py.lower.plan_tma import TMA_ALIGN
from cutile_py.ptx.builder import Addr, FunctionBuilder, Reg, Vec

#: The swizzle's XOR reads address bits from bit 7 (`plan_tma`).
SWIZZLE_SHIFT = 7


def store(em: EmitContext, op: o.StoreOp, t: TmaStore) -> None:
    """Carry out `op` as the TMA store epilogue `t` planned."""
    fb = em.fb
    s = emit_mma.setup(em, t.frag.mma)
    regs = em.regs(op.operands[-1])
    assert len(regs) == s.count, (len(regs), s.count)
    smem = em.shared_scratch(t.nbytes)
    # The staging offset is planned 1024-aligned (`size_scratch`), but an address is only as
    # aligned as the shared memory's declared `.align` (a kernel with no TMA ring or wgmma
    # declares 16): TMA needs 128 bytes, 1024 under the 128-byte swizzle.
    em.fb.shared_align = max(em.fb.shared_align, TMA_ALIGN)
    fb.comment(f"tma store of {t.rows}x{t.cols} {t.dtype.name}: staged in {t.panels} panel(s)")
    deferred = em.persistent is not None and op in em.persistent.deferred
    if deferred:
        wait_all(em)  # the last tile's store has read the staging memory
        em.barrier()
    if t.stmatrix:
        _stage_16(em, s, t, regs, smem)
    else:
        _stage_f32(em, s, t, regs, smem)
    # This thread's generic writes come before the copy engine's (async proxy) reads.
    fb.ins("fence.proxy.async.shared::cta")
    em.barrier()
    assert em.tid is not None
    go = fb.reg("pred")
    fb.ins("setp.eq.u32", go, em.tid, 0)
    index = [em.regs(v)[0] for v in op.operands[:-1]]
    shape = op.operands[-1].type.shape
    for r, size in zip(index, shape):
        # An index whose tile origin wraps past 2^31 could land back in the tensor: such a
        # tile lies wholly outside it, and is dropped (as the plain store drops it).
        ok = fb.reg("pred")
        fb.ins("setp.le.u32", ok, r, (0x7FFFFFFF - size) // size)
        fb.ins("and.pred", go, go, ok)
    done = fb.new_label("tma_stored")
    fb.ins("bra", done, pred=go, negate=True)
    coords = box_origin(fb, index, shape)
    rank = len(coords)
    for p in range(t.panels):
        where = panel_coords(fb, coords, p * t.panel)
        fb.ins(
            f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group",
            f"[{em.tensor_maps[op]}, {{{where}}}]",
            Addr(smem, p * t.panel_bytes),
        )
    fb.ins("cp.async.bulk.commit_group")
    if deferred:
        fb.place(done)
        return
    fb.ins("cp.async.bulk.wait_group.read", 0)  # the staging memory has been read
    fb.place(done)
    em.barrier()  # nobody writes the staging memory before thread 0's wait


def wait_all(em: EmitContext) -> None:
    """Thread 0 waits until the copy engine has read every staging tile it stored from (a
    no-op with none in flight)."""
    assert em.tid is not None
    first = em.fb.reg("pred")
    em.fb.ins("setp.eq.u32", first, em.tid, 0)
    em.fb.ins("cp.async.bulk.wait_group.read", 0, pred=first)


def _row_bases(em: EmitContext, s: Setup, smem: Reg, lane_row: Reg, span: int) -> dict[str, Reg]:
    """Per distinct register of the M slots: smem + (16 * slot + lane_row) * span."""
    fb = em.fb
    out: dict[str, Reg] = {}
    for sl in s.slots_m:
        if sl.reg.name in out:
            continue
        row = fb.reg("b32")
        fb.ins("mad.lo.u32", row, sl.reg, 16, lane_row)
        base = fb.reg("b32")
        fb.ins("mad.lo.u32", base, row, span, smem)
        out[sl.reg.name] = base
    return out


def _stage_f32(em: EmitContext, s: Setup, t: TmaStore, regs: list[Reg], smem: Reg) -> None:
    """Rows of 32 bytes, unswizzled, a panel per fragment column (N slot j of warp column
    w: column w + j * wn): (g, 2t..2t+1) at g * 32 + t * 8 of its panel."""
    fb = em.fb
    assert t.panel == 8 and t.swizzle == 0
    col = fb.reg("b32")
    fb.ins("shl.b32", col, s.lane.t, 3)
    rows = _row_bases(em, s, smem, s.lane.g, t.span)
    bases: dict[tuple[str, str], Reg] = {}

    def base(sl: Slot, nl: Slot) -> Reg:
        key = (sl.reg.name, nl.reg.name)
        if key not in bases:
            b = fb.reg("b32")
            fb.ins("add.u32", b, rows[sl.reg.name], col)
            if t.frag.grid.wn > 1:  # the warp's first panel
                fb.ins("mad.lo.u32", b, nl.reg, t.panel_bytes, b)
            bases[key] = b
        return bases[key]

    sn = len(s.slots_n)
    for i, sl in enumerate(s.slots_m):
        for j, nl in enumerate(s.slots_n):
            k = 4 * (i * sn + j)
            pred = em.conj(sl.valid, nl.valid)
            for h in range(2):
                imm = nl.static * t.panel_bytes + (16 * sl.static + 8 * h) * t.span
                pair = Vec((regs[k + 2 * h], regs[k + 2 * h + 1]))
                fb.ins("st.shared.v2.f32", Addr(base(sl, nl), imm), pair, pred=pred)


def _stage_16(em: EmitContext, s: Setup, t: TmaStore, regs: list[Reg], smem: Reg) -> None:
    """stmatrix: lane l gives the address of row l & 15 of the slot's 16 rows; with .x4,
    lanes 16..31 those of the next N slot (wn fragment columns further). Fragment column c
    (8 columns: 16 bytes) is chunk c % S of panel c / S (S chunks per row), and lands at
    chunk (c % S) ^ x(row), x lane-only. With wn = 1 the pair's chunks are an even static
    cs and cs + 1, and (cs + b) ^ x = cs ^ (b ^ x): one address per static chunk; with
    wn > 1 the chunk is computed per slot from the warp's column."""
    fb = em.fb
    chunks = t.span // CHUNK  # per staging row
    wn = t.frag.grid.wn
    lane_row, pair_bit, xr = fb.reg("b32"), fb.reg("b32"), fb.reg("b32")
    fb.ins("and.b32", lane_row, s.lane.lane, 15)
    fb.ins("shr.u32", pair_bit, s.lane.lane, 4)
    if chunks > 1:
        # x(row) = (row * span >> 7) & (chunks - 1); 16 m + lane_row: m adds nothing.
        shift = SWIZZLE_SHIFT - log2(t.span)
        if shift:
            fb.ins("shr.u32", xr, lane_row, shift)
            fb.ins("and.b32", xr, xr, chunks - 1)
        else:  # 128-byte rows: x = row & 7
            fb.ins("and.b32", xr, lane_row, chunks - 1)
    else:
        fb.ins("mov.u32", xr, 0)
    rows = _row_bases(em, s, smem, lane_row, t.span)
    addrs: dict[tuple[str, str, int, bool], Reg] = {}
    lane_bits = fb.reg("b32")  # wn = 1: b ^ x
    fb.ins("xor.b32", lane_bits, pair_bit, xr)
    paired_col: Reg | None = None  # wn > 1: the warp's column, + wn for lanes 16..31

    def address(sl: Slot, nl: Slot, paired: bool) -> tuple[Reg, int]:
        """The address register and immediate of slot (sl, nl), with the next N slot's
        address in lanes 16..31 if `paired`."""
        nonlocal paired_col
        if wn == 1:
            cs, panel = nl.static % chunks, nl.static // chunks
            key = (sl.reg.name, "", cs, paired)
            if key not in addrs:
                x = fb.reg("b32")
                fb.ins("xor.b32", x, lane_bits if paired else xr, cs)
                fb.ins("shl.b32", x, x, log2(CHUNK))
                fb.ins("add.u32", x, x, rows[sl.reg.name])
                addrs[key] = x
            return addrs[key], panel * t.panel_bytes + 16 * sl.static * t.span
        key = (sl.reg.name, nl.reg.name, nl.static, paired)
        if key not in addrs:
            col = nl.reg
            if paired:
                if paired_col is None:
                    paired_col = fb.reg("b32")
                    fb.ins("mad.lo.u32", paired_col, pair_bit, wn, nl.reg)
                col = paired_col
            c, which, x = fb.reg("b32"), fb.reg("b32"), fb.reg("b32")
            fb.ins("add.u32", c, col, nl.static)
            fb.ins("shr.u32", which, c, log2(chunks))  # the panel
            fb.ins("and.b32", x, c, chunks - 1)
            fb.ins("xor.b32", x, x, xr)
            fb.ins("shl.b32", x, x, log2(CHUNK))
            fb.ins("mad.lo.u32", x, which, t.panel_bytes, x)
            fb.ins("add.u32", x, x, rows[sl.reg.name])
            addrs[key] = x
        return addrs[key], 16 * sl.static * t.span

    sn = len(s.slots_n)
    for i, sl in enumerate(s.slots_m):
        j = 0
        while j < sn:
            nl = s.slots_n[j]
            # Two N slots in one stmatrix.x4: with wn = 1 chunks j and j + 1 of one panel
            # (j even), else any two real slots of the warp's column; the rest .x2 each.
            x4 = j + 1 < sn and nl.valid is None and s.slots_n[j + 1].valid is None
            x4 = x4 and (chunks > 1 if wn == 1 else nl.reg is s.slots_n[j + 1].reg)
            words = []
            for jj in (j, j + 1) if x4 else (j,):
                k = 4 * (i * sn + jj)
                for h in range(2):
                    w = fb.reg("b32")
                    fb.ins("mov.b32", w, Vec((regs[k + 2 * h], regs[k + 2 * h + 1])))
                    words.append(w)
            at, imm = address(sl, nl, x4)
            fb.ins(
                f"stmatrix.sync.aligned.m8n8.x{len(words)}.shared.b16",
                Addr(at, imm),
                Vec(tuple(words)),
                pred=em.conj(sl.valid, nl.valid),
            )
            j += 2 if x4 else 1


def panel_coords(fb: FunctionBuilder, coords: Sequence[Reg], offset: int) -> str:
    """The coordinates operand (without braces) of the box `offset` elements further along
    the innermost dimension than `coords` (a panel of a box split at the swizzle span)."""
    inner = coords[0]
    if offset:
        inner = fb.reg("b32")
        fb.ins("add.s32", inner, coords[0], offset)
    return ", ".join(map(str, [inner, *coords[1:]]))


def box_origin(fb: FunctionBuilder, index: Sequence[Reg], shape: Sequence[int]) -> list[Reg]:
    """A box's first element, innermost dimension first: the tile `index` times the tile
    `shape` (a tensor map's coordinates are elements, not tiles)."""
    out = []
    for r, size in zip(reversed(index), reversed(shape)):
        if size == 1:
            out.append(r)
            continue
        c = fb.reg("b32")
        fb.ins("mul.lo.s32", c, r, size)
        out.append(c)
    return out
