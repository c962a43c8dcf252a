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

Staging addresses (panel p of `rows` x `span` bytes, row r, 16-byte chunk c of the row):
`p * rows * span + r * span + (c ^ x(r)) * 16`, x(r) the swizzle's XOR of row r, which for
a fragment row (16 m + lane-dependent part) depends on the lane alone: per distinct static
chunk one address register, every other offset an immediate.
"""

from __future__ import annotations

from cutile_py.ir import ops as o
from cutile_py.lower import emit_mma
from cutile_py.lower.context import EmitContext
from cutile_py.lower.fragments import CHUNK, Setup, Slot, log2
from cutile_py.lower.plan_store import TmaStore
from cutile_py.ptx.builder import Addr, Reg, Vec

#: The swizzle's XOR reads address bits from bit 7 (`plan_tma`).
SWIZZLE_SHIFT = 7


def store(em: EmitContext, op: o.StoreOp, t: TmaStore) -> None:
    """Carry out `op` as the TMA store epilogue `t` planned."""
    fb = em.fb
    s = emit_mma.setup(em, t.frag.mma)
    regs = em.regs(op.operands[-1])
    assert len(regs) == s.count, (len(regs), s.count)
    smem = em.shared_scratch(t.nbytes)
    fb.comment(f"tma store of {t.rows}x{t.cols} {t.dtype.name}: staged in {t.panels} panel(s)")
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
    coords = []
    for r, size in zip(reversed(index), reversed(shape)):
        if size == 1:
            coords.append(r)
            continue
        c = fb.reg("b32")
        fb.ins("mul.lo.s32", c, r, size)
        coords.append(c)
    rank = len(coords)
    for p in range(t.panels):
        inner = coords[0]
        if p:
            inner = fb.reg("b32")
            fb.ins("add.s32", inner, coords[0], p * t.panel)
        where = ", ".join(map(str, [inner, *coords[1:]]))
        fb.ins(
            f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group",
            f"[{em.tensor_maps[op]}, {{{where}}}]",
            Addr(smem, p * t.panel_bytes),
        )
    fb.ins("cp.async.bulk.commit_group")
    fb.ins("cp.async.bulk.wait_group.read", 0)  # the staging memory has been read
    fb.place(done)
    em.barrier()  # nobody writes the staging memory before thread 0's wait


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
    """Rows of 32 bytes, unswizzled, a panel per N slot: (g, 2t..2t+1) at g * 32 + t * 8."""
    fb = em.fb
    assert t.panel == 8 and t.swizzle == 0
    col = fb.reg("b32")
    fb.ins("shl.b32", col, s.lane.t, 3)
    bases = {}
    for name, base in _row_bases(em, s, smem, s.lane.g, t.span).items():
        b = fb.reg("b32")
        fb.ins("add.u32", b, base, col)
        bases[name] = b
    sn = len(s.slots_n)
    for i, sl in enumerate(s.slots_m):
        for j, nl in enumerate(s.slots_n):
            k = 4 * (i * sn + j)
            panel = nl.static  # wn = 1: slot j is fragment column j, panel j
            for h in range(2):
                imm = panel * t.panel_bytes + (16 * sl.static + 8 * h) * t.span
                pair = Vec((regs[k + 2 * h], regs[k + 2 * h + 1]))
                fb.ins("st.shared.v2.f32", Addr(bases[sl.reg.name], imm), pair, pred=sl.valid)


def _stage_16(em: EmitContext, s: Setup, t: TmaStore, regs: list[Reg], smem: Reg) -> None:
    """stmatrix: lane l gives the address of row l & 15 of the slot's 16 rows; with .x4,
    lanes 16..31 those of the next N slot (chunk + 1). Chunk c of a row lands at
    c ^ x(row), x lane-only; for an even static chunk cs, (cs + b) ^ x = cs ^ (b ^ x)."""
    fb = em.fb
    chunks = t.span // CHUNK  # per staging row
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
    lane_bits = fb.reg("b32")
    fb.ins("xor.b32", lane_bits, pair_bit, xr)
    bases = _row_bases(em, s, smem, lane_row, t.span)
    addrs: dict[tuple[str, int, bool], Reg] = {}

    def address(sl: Slot, cs: int, paired: bool) -> Reg:
        key = (sl.reg.name, cs, paired)
        if key not in addrs:
            x = fb.reg("b32")
            fb.ins("xor.b32", x, lane_bits if paired else xr, cs)
            fb.ins("shl.b32", x, x, log2(CHUNK))
            fb.ins("add.u32", x, x, bases[sl.reg.name])
            addrs[key] = x
        return addrs[key]

    sn = len(s.slots_n)
    # Pairs of N slots in one panel go to one stmatrix.x4; the rest one .x2 each.
    pairs = chunks > 1 and sn > 1
    for i, sl in enumerate(s.slots_m):
        j = 0
        while j < sn:
            x4 = pairs and j + 1 < sn
            # wn = 1: slot j is fragment column j, whose 8 columns are chunk j of the tile.
            c = s.slots_n[j].static
            cs, panel = c % chunks, c // chunks
            words = []
            for jj in (j, j + 1) if x4 else (j,):
                k = 4 * (i * sn + jj)
                for h in range(2):
                    w = fb.reg("b32")
                    fb.ins("mov.b32", w, Vec((regs[k + 2 * h], regs[k + 2 * h + 1])))
                    words.append(w)
            imm = panel * t.panel_bytes + 16 * sl.static * t.span
            fb.ins(
                f"stmatrix.sync.aligned.m8n8.x{len(words)}.shared.b16",
                Addr(address(sl, cs, x4), imm),
                Vec(tuple(words)),
                pred=sl.valid,
            )
            j += 2 if x4 else 1
