"""Inclusive prefix sums along one axis of a blocked tile (`ct.cumsum`).

Along the scanned base dim each thread holds runs of `unit` consecutive elements, one run per
repetition, and the threads along it are a contiguous bit field of the thread index. Per
repetition: each thread sums its run in order; the threads' totals are scanned with warp
shuffles (`shfl.sync.up`, log2 steps) within each warp, then across warps through one shared
slot per thread; a repetition's total carries into the next. f16/bf16 accumulate in f32 and
each output is rounded once; f32 sums are rounded at each addition in this tree order.
"""

from __future__ import annotations

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import DType, bf16, f16, f32
from cutile_py.lower import emit_shared
from cutile_py.lower.context import WARP, EmitContext
from cutile_py.lower.errors import LoweringError
from cutile_py.lower.isel import BITS_SUFFIX, INT_SUFFIX
from cutile_py.lower.layout import Layout
from cutile_py.ptx.builder import Imm, Reg, Vec, f32_imm


class _Adder:
    """Sums in the accumulation type of `dt` (f32 for every float)."""

    def __init__(self, em: EmitContext, dt: type[DType]) -> None:
        if dt not in (f32, f16, bf16) and dt not in INT_SUFFIX:
            raise LoweringError(f"cumsum of {dt.name} is not supported")
        self.em, self.src = em, dt
        self.acc: type[DType] = f32 if dt.is_float() else dt

    def add(self, a: Reg, b: Reg) -> Reg:
        r = self.em.new(self.acc)
        op = "add.rn.f32" if self.acc is f32 else f"add.{INT_SUFFIX[self.acc]}"
        self.em.fb.ins(op, r, a, b)
        return r

    def zero(self) -> Reg:
        r = self.em.new(self.acc)
        if self.acc is f32:
            self.em.fb.ins("mov.f32", r, f32_imm(0.0))
        else:
            self.em.fb.ins(f"mov.{BITS_SUFFIX[self.acc]}", r, 0)
        return r

    def select(self, a: Reg, b: Reg, cond: Reg) -> Reg:
        r = self.em.new(self.acc)
        suffix = "f32" if self.acc is f32 else BITS_SUFFIX[self.acc]
        self.em.fb.ins(f"selp.{suffix}", r, a, b, cond)
        return r

    def shuffle(self, x: Reg, mode: str, lane: int | Reg) -> Reg:
        """`shfl.sync.<mode>` of `x` (64-bit values in two halves); every lane takes part."""
        fb = self.em.fb
        clamp = 0 if mode == "up" else 0x1F
        if x.ptype == "b64":
            lo, hi, slo, shi = (fb.reg("b32") for _ in range(4))
            fb.ins("mov.b64", Vec((lo, hi)), x)
            fb.ins(f"shfl.sync.{mode}.b32", slo, lo, lane, clamp, Imm("-1"))
            fb.ins(f"shfl.sync.{mode}.b32", shi, hi, lane, clamp, Imm("-1"))
            r = fb.reg("b64")
            fb.ins("mov.b64", r, Vec((slo, shi)))
            return r
        r = fb.reg(x.ptype)
        fb.ins(f"shfl.sync.{mode}.b32", r, x, lane, clamp, Imm("-1"))
        return r


def _field(em: EmitContext, shift: int, bits: int) -> Reg:
    """`(tid >> shift) & (2**bits - 1)`."""
    assert em.tid is not None
    r = em.fb.reg("b32")
    em.fb.ins("shr.u32", r, em.tid, shift)
    em.fb.ins("and.b32", r, r, (1 << bits) - 1)
    return r


def scan(em: EmitContext, op: o.ScanOp) -> None:
    (x,) = op.operands
    res = op.result
    xl = em.layout(x)
    d = xl.dims[op.axis]
    dt = x.type.dtype
    ad = _Adder(em, dt)
    xregs = em.regs(x)
    if d is None:  # an axis of size 1: each element is its own prefix
        out = xregs
    else:
        wide = [em.widen(r, dt) if dt in (f16, bf16) else r for r in xregs]
        out = _scan_rows(em, ad, xl, d, wide)
        out = [em.narrow(r, dt) if dt in (f16, bf16) else r for r in out]
    rl = em.layout(res)
    em.define(res, out if rl == xl else emit_shared.convert(em, out, xl, rl, res.type, res.type))


def _scan_rows(em: EmitContext, ad: _Adder, xl: Layout, d: int, xregs: list[Reg]) -> list[Reg]:
    b = xl.base
    fb = em.fb
    threads, unit, reps = b.threads[d], b.unit(d), b.reps(d)
    lo = b.stride(d).bit_length() - 1  # first tid bit of the threads along d
    tbits = threads.bit_length() - 1
    lane_bits = max(0, min(lo + tbits, 5) - lo) if lo < 5 else 0
    per_warp = 1 << lane_bits  # threads along d in one warp
    warps = threads // per_warp  # warp segments along d
    p = _field(em, lo, tbits) if threads > 1 else None  # this thread's place along d
    pw = _field(em, lo, lane_bits) if per_warp > 1 else None  # ... within its warp
    rows: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for k, offs in enumerate(xl.registers()):
        key = tuple(sorted((dd, off) for dd, off in offs.items() if dd != d))
        rows.setdefault(key, []).append(k)
    out: list[Reg | None] = [None] * len(xregs)
    # Per row and repetition: the thread's own running sums, and the total of its run.
    runs: list[tuple[list[int], list[Reg], Reg]] = []
    for regs in rows.values():
        offs_of = {xl.registers()[k][d]: k for k in regs}
        for r in range(reps):
            ks = [offs_of[r * threads * unit + v] for v in range(unit)]
            acc: list[Reg] = []
            for k in ks:
                acc.append(xregs[k] if not acc else ad.add(acc[-1], xregs[k]))
            runs.append((ks, acc, acc[-1]))
    # Inclusive scan of the run totals over the threads of each warp segment.
    incl = [tot for _, _, tot in runs]
    for bit in range(lane_bits):
        step = 1 << bit
        assert pw is not None
        take = fb.reg("pred")
        fb.ins("setp.ge.u32", take, pw, step)
        for i, v in enumerate(incl):
            got = ad.shuffle(v, "up", step << lo)
            incl[i] = ad.select(ad.add(v, got), v, take)
    # Exclusive: the inclusive value of the previous thread in the warp segment.
    excl: list[Reg | None] = [None] * len(runs)
    if per_warp > 1:
        assert pw is not None
        first = fb.reg("pred")
        fb.ins("setp.eq.u32", first, pw, 0)
        zero = ad.zero()
        for i, v in enumerate(incl):
            excl[i] = ad.select(zero, ad.shuffle(v, "up", 1 << lo), first)
    # Across warp segments, and each segment's share of the repetition's total.
    carry: list[Reg | None] = [None] * len(runs)
    totals: list[Reg] = []
    if warps > 1:
        carry, totals = _across_warps(em, ad, b.block, lo, lane_bits, warps, per_warp, p, incl)
    elif threads > 1:
        # The last thread along d of this warp holds the repetition's total.
        assert em.tid is not None
        src = fb.reg("b32")
        fb.ins("and.b32", src, em.tid, (WARP - 1) & ~((threads - 1) << lo))
        fb.ins("or.b32", src, src, ((threads - 1) << lo) & (WARP - 1))
        totals = [ad.shuffle(v, "idx", src) for v in incl]
    else:
        totals = list(incl)
    # Per row: repetition r starts after the totals of repetitions 0..r-1.
    i = 0
    for _ in rows:
        before: Reg | None = None
        for _r in range(reps):
            ks, acc, _tot = runs[i]
            start = before
            for extra in (carry[i], excl[i]):
                if extra is not None:
                    start = extra if start is None else ad.add(start, extra)
            for k, a in zip(ks, acc):
                out[k] = a if start is None else ad.add(start, a)
            before = totals[i] if before is None else ad.add(before, totals[i])
            i += 1
    assert all(r is not None for r in out)
    return [r for r in out if r is not None]


def _across_warps(
    em: EmitContext,
    ad: _Adder,
    block: int,
    lo: int,
    lane_bits: int,
    warps: int,
    per_warp: int,
    p: Reg | None,
    incl: list[Reg],
) -> tuple[list[Reg | None], list[Reg]]:
    """Per run: the sum of the warp segments before this thread's, and of all of them (read
    in one order by every thread, so every thread sees the same total)."""
    fb, tid = em.fb, em.tid
    assert tid is not None and p is not None
    smem = em.shared_scratch(len(incl) * block * 8)
    mine = fb.reg("b32")
    fb.ins("mad.lo.u32", mine, tid, 8, smem)
    width = "b64" if ad.acc.itemsize() == 8 else "b32"
    for k, v in enumerate(incl):
        fb.ins(f"st.shared.{width}", f"[{mine}+{k * block * 8}]", v)
    em.barrier()
    tbits = (warps * per_warp).bit_length() - 1
    mask = ((1 << tbits) - 1) << lo
    first = fb.reg("b32")
    fb.ins("and.b32", first, tid, ~mask & 0xFFFFFFFF)
    fb.ins("mad.lo.u32", first, first, 8, smem)
    seg = fb.reg("b32")
    fb.ins("shr.u32", seg, p, lane_bits)
    before_seg = []
    for j in range(warps):
        t = fb.reg("pred")
        fb.ins("setp.gt.u32", t, seg, j)
        before_seg.append(t)
    carry: list[Reg | None] = []
    totals: list[Reg] = []
    zero = ad.zero()
    for k in range(len(incl)):
        acc_c: Reg | None = None
        acc_t: Reg | None = None
        for j in range(warps):
            last = ((j + 1) * per_warp - 1) << lo  # the segment's last thread, from `first`
            v = em.new(ad.acc)
            fb.ins(f"ld.shared.{width}", v, f"[{first}+{k * block * 8 + last * 8}]")
            acc_t = v if acc_t is None else ad.add(acc_t, v)
            c = ad.select(v, zero, before_seg[j])
            acc_c = c if acc_c is None else ad.add(acc_c, c)
        carry.append(acc_c)
        assert acc_t is not None
        totals.append(acc_t)
    em.barrier()
    return carry, totals
