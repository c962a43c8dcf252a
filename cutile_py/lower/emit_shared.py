"""Ops that move data between threads: broadcasts, reductions, reshapes, permutes, and the
layout conversions through shared memory that stitch disagreeing layouts together.

A reduction runs in three steps: over each thread's own registers, over the lanes of a warp
with butterfly shuffles, and over warps through shared memory. Every thread ends with the
result (each combines the same partials in the same order), so it can be broadcast back
over the reduced dim for free.
"""

from __future__ import annotations

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import DType, bf16, bool_, f16, f32, i32, i64
from cutile_py.ir.types import TileType
from cutile_py.lower import emit_transpose
from cutile_py.lower.context import EmitContext
from cutile_py.lower.isel import MOV
from cutile_py.lower.layout import Layout
from cutile_py.ptx.builder import Imm, Reg, Vec, f32_imm

BANK_BYTES = 4


# -- layout conversion -------------------------------------------------------------------
def regs_as(em: EmitContext, v: o.Value, want: Layout) -> list[Reg]:
    """`v`'s registers in layout `want` (same shape), converting if it lives elsewhere."""
    regs = em.regs(v)
    if not v.type.shape:
        return regs * want.count()
    have = em.layout(v)
    if have == want:
        return regs
    return convert(em, regs, have, want, v.type, v.type)


def _elem(dt: type[DType]) -> tuple[int, str]:
    """Bytes and ld/st suffix of one element in shared memory."""
    if dt is bool_:
        return 1, "u8"
    return dt.itemsize(), {1: "u8", 2: "b16", 4: "b32", 8: "b64"}[dt.itemsize()]


def _row_major(shape: tuple[int, ...], pad: int) -> list[int]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        inner = shape[i + 1] + (pad if i + 1 == len(shape) - 1 else 0)
        strides[i] = strides[i + 1] * inner
    return strides


def _fast_last(lay: Layout) -> bool:
    """Consecutive threads walk the value's last dim (row-contiguous in shared memory)."""
    return lay.dims[-1] is not None and lay.dims[-1] == lay.base.rank - 1


def _thread_part(em: EmitContext, lay: Layout, strides: list[int], eb: int, smem: Reg) -> Reg:
    """smem + (this thread's linear element index) * eb."""
    fb = em.fb
    coord = em.bases[lay.base].coord
    acc = fb.reg("b32")
    fb.ins("mov.u32", acc, smem)
    for i, d in enumerate(lay.dims):
        if d is not None and lay.base.threads[d] > 1:
            fb.ins("mad.lo.u32", acc, coord[d], strides[i] * eb, acc)
    return acc


def _static(lay: Layout, offs: dict[int, int], strides: list[int]) -> int:
    return sum(offs[d] * strides[i] for i, d in enumerate(lay.dims) if d is not None)


def convert(
    em: EmitContext, regs: list[Reg], src: Layout, dst: Layout, src_t: TileType, dst_t: TileType
) -> list[Reg]:
    """Move a tile between layouts through shared memory (row-major element order, so a
    reshape is the same round trip). Rows are padded by one bank when the two layouts walk
    different dims, so that neither side's accesses conflict; a 2-D transpose whose source
    holds vectors goes through a staggered tile instead (`emit_transpose`)."""
    if not src.present:
        return [regs[0]] * dst.count()  # a size-1 tile: every thread holds it
    if emit_transpose.applies(em, src, dst, src_t, dst_t):
        return emit_transpose.convert_transposed(em, regs, src, dst, src_t)
    fb = em.fb
    dt = src_t.dtype
    eb, suffix = _elem(dt)
    pad = 0
    same_shape = src_t.shape == dst_t.shape and len(src_t.shape) > 1
    if same_shape and not (_fast_last(src) and _fast_last(dst)):
        pad = max(1, BANK_BYTES // eb)
    s_strides = _row_major(src_t.shape, pad)
    d_strides = _row_major(dst_t.shape, pad)
    total = s_strides[0] * src_t.shape[0] if src_t.shape else 1
    smem = em.shared_scratch(total * eb)
    base = _thread_part(em, src, s_strides, eb, smem)
    owner = em.owner(src)
    for r, offs in zip(regs, src.registers()):
        pred = em.conj(em.valid(src, offs), owner)
        where = _at(base, _static(src, offs, s_strides) * eb)
        if dt is bool_:
            h = fb.reg("b16")
            fb.ins("selp.u16", h, 1, 0, r)
            fb.ins("st.shared.u8", where, h, pred=pred)
        else:
            fb.ins(f"st.shared.{suffix}", where, r, pred=pred)
    em.barrier()
    out = _load_row_major(em, smem, dst, dst_t, d_strides)
    em.barrier()
    return out


def load_row_major(em: EmitContext, smem: Reg, dst: Layout, dst_t: TileType) -> list[Reg]:
    """The registers of layout `dst` read from a row-major `dst_t` tile at `smem`."""
    return _load_row_major(em, smem, dst, dst_t, _row_major(dst_t.shape, 0))


def _load_row_major(
    em: EmitContext, smem: Reg, dst: Layout, dst_t: TileType, d_strides: list[int]
) -> list[Reg]:
    fb = em.fb
    dt = dst_t.dtype
    eb, suffix = _elem(dt)
    base = _thread_part(em, dst, d_strides, eb, smem)
    out = []
    for offs in dst.registers():
        pred = em.valid(dst, offs)
        where = _at(base, _static(dst, offs, d_strides) * eb)
        if dt is bool_:
            h, p = fb.reg("b16"), fb.reg("pred")
            fb.ins("mov.b16", h, 0)
            fb.ins("ld.shared.u8", h, where, pred=pred)
            fb.ins("setp.ne.b16", p, h, 0)
            out.append(p)
            continue
        x = em.new(dt)
        if pred is not None:
            fb.ins(f"mov.{MOV[x.ptype]}", x, 0 if x.ptype != "f32" else f32_imm(0.0))
        fb.ins(f"ld.shared.{suffix}", x, where, pred=pred)
        out.append(x)
    return out


def _at(base: Reg, offset: int) -> str:
    return f"[{base}+{offset}]" if offset else f"[{base}]"


# -- shape ops ---------------------------------------------------------------------------
def broadcast(em: EmitContext, op: o.BroadcastOp) -> None:
    (x,) = op.operands
    res = op.result
    rl = em.layout(res)
    n = rl.count()
    same = em.plan.repeats.get(op)
    if same is not None and em.fragment_plan.of(same.result) is None:
        em.define(res, em.regs(same.result))  # converted once, by the first broadcast
        return
    if not x.type.shape or not em.layout(x).present:
        em.define(res, [em.regs(x)[0]] * n)
        return
    want = Layout(rl.base, tuple(d if s > 1 else None for d, s in zip(rl.dims, x.type.shape)))
    xregs = regs_as(em, x, want)
    em.define(res, [xregs[want.index(offs)] for offs in rl.registers()])


def reshape(em: EmitContext, op: o.ReshapeOp) -> None:
    (x,) = op.operands
    res = op.result
    if not x.type.shape or not res.type.shape or not em.layout(x).present:
        em.define(res, [em.regs(x)[0]] * (em.count(res)))
        return
    xl, rl = em.layout(x), em.layout(res)
    big_in = [d for d, s in zip(xl.dims, x.type.shape) if s > 1]
    big_out = [i for i, s in enumerate(res.type.shape) if s > 1]
    if [x.type.shape[i] for i, s in enumerate(x.type.shape) if s > 1] == [
        res.type.shape[i] for i in big_out
    ]:
        # Only size-1 dims come or go: the same registers under renamed dims.
        dims: list[int | None] = [None] * len(res.type.shape)
        for i, d in zip(big_out, big_in):
            dims[i] = d
        view = Layout(xl.base, tuple(dims))
        regs = em.regs(x)
        em.define(res, regs if view == rl else convert(em, regs, view, rl, res.type, res.type))
        return
    em.define(res, convert(em, em.regs(x), xl, rl, x.type, res.type))


def permute(em: EmitContext, op: o.PermuteOp) -> None:
    (x,) = op.operands
    res = op.result
    xl, rl = em.layout(x), em.layout(res)
    view = Layout(xl.base, tuple(xl.dims[a] for a in op.axes))
    regs = em.regs(x)
    em.define(res, regs if view == rl else convert(em, regs, view, rl, res.type, res.type))


# -- reductions --------------------------------------------------------------------------
class Combiner:
    """How one reduction kind combines partials; values are f32, integers or predicates."""

    def __init__(self, em: EmitContext, kind: str, dt: type[DType]) -> None:
        self.em, self.kind = em, kind
        self.src = dt
        self.acc: type[DType]
        if dt.is_float():
            self.acc = f32
        elif dt is bool_ and kind in ("argmax", "argmin"):
            self.acc = i32
        else:
            self.acc = dt
        self.arg = kind in ("argmax", "argmin")

    def lift(self, x: Reg) -> Reg:
        """An input element as an accumulator value."""
        fb = self.em.fb
        if self.src in (f16, bf16):
            return self.em.widen(x, self.src)
        if self.src is bool_ and self.acc is i32:
            r = fb.reg("b32")
            fb.ins("selp.u32", r, 1, 0, x)
            return r
        return x

    def identity(self) -> Reg:
        fb, acc = self.em.fb, self.acc
        r = self.em.new(acc)
        big = self.kind in ("min", "argmin")
        if self.kind == "sum":
            if acc is f32:
                fb.ins("mov.f32", r, f32_imm(0.0))
            else:
                fb.ins(f"mov.b{8 * acc.itemsize()}", r, 0)
        elif acc is f32:
            fb.ins("mov.f32", r, f32_imm(float("inf") if big else float("-inf")))
        elif acc is bool_:
            t = fb.reg("b32")
            fb.ins("mov.u32", t, int(big))
            fb.ins("setp.ne.u32", r, t, 0)
        else:
            bits = 8 * acc.itemsize()
            value = (1 << (bits - 1)) - 1 if big else -(1 << (bits - 1))
            fb.ins(f"mov.s{bits}", r, value)
        return r

    def combine(self, a: Reg, b: Reg) -> Reg:
        fb, acc, kind = self.em.fb, self.acc, self.kind
        r = self.em.new(acc)
        if acc is f32:
            op = {"sum": "add.rn.f32", "max": "max.NaN.f32", "min": "min.NaN.f32"}[kind]
        elif acc is bool_:
            op = {"max": "or.pred", "min": "and.pred"}[kind]
        else:
            s = f"s{8 * acc.itemsize()}"
            op = {"sum": f"add.{s}", "max": f"max.{s}", "min": f"min.{s}"}[kind]
        fb.ins(op, r, a, b)
        return r

    def combine_arg(self, av: Reg, ai: Reg, bv: Reg, bi: Reg) -> tuple[Reg, Reg]:
        """The better of two (value, index) pairs: the extreme, NaN first, then lower index.
        Symmetric in its arguments, so butterfly partners agree bit for bit."""
        em, fb = self.em, self.em.fb
        t = "f32" if self.acc is f32 else f"s{8 * self.acc.itemsize()}"
        better = em.fb.reg("pred")
        fb.ins(f"setp.{'gt' if self.kind == 'argmax' else 'lt'}.{t}", better, bv, av)
        tie = fb.reg("pred")
        fb.ins(f"setp.eq.{t}", tie, bv, av)
        if self.acc is f32:
            an, bn, not_an = fb.reg("pred"), fb.reg("pred"), fb.reg("pred")
            fb.ins("setp.nan.f32", an, av, av)
            fb.ins("setp.nan.f32", bn, bv, bv)
            fb.ins("not.pred", not_an, an)
            better = _or(em, better, em.and_(bn, not_an))
            tie = _or(em, tie, em.and_(an, bn))
        lower = fb.reg("pred")
        fb.ins("setp.lt.s32", lower, bi, ai)
        take = _or(em, better, em.and_(tie, lower))
        v, i = em.new(self.acc), fb.reg("b32")
        fb.ins(f"selp.{MOV[v.ptype]}", v, bv, av, take)
        fb.ins("selp.b32", i, bi, ai, take)
        return v, i

    def step_arg(self, av: Reg, ai: Reg, bv: Reg, bi: Reg) -> tuple[Reg, Reg]:
        """`combine_arg` where (bv, bi) comes after (av, ai) in index order (one thread's own
        elements, in `offsets` order): b wins only if strictly better, or a NaN after none
        (then the first NaN stays), so no index compare. For argmax on f32: b > a or b is
        NaN, i.e. setp.gtu, unless a is a NaN."""
        em, fb = self.em, self.em.fb
        t = "f32" if self.acc is f32 else f"s{8 * self.acc.itemsize()}"
        op = "gt" if self.kind == "argmax" else "lt"
        take = fb.reg("pred")
        if self.acc is f32:
            fb.ins(f"setp.{op}u.f32", take, bv, av)
            a_num = fb.reg("pred")
            fb.ins("setp.num.f32", a_num, av, av)
            take = em.and_(take, a_num)
        else:
            fb.ins(f"setp.{op}.{t}", take, bv, av)
        v, i = em.new(self.acc), fb.reg("b32")
        fb.ins(f"selp.{MOV[v.ptype]}", v, bv, av, take)
        fb.ins("selp.b32", i, bi, ai, take)
        return v, i


def _or(em: EmitContext, a: Reg, b: Reg) -> Reg:
    r = em.fb.reg("pred")
    em.fb.ins("or.pred", r, a, b)
    return r


def shuffle(em: EmitContext, x: Reg, lanes: int) -> Reg:
    """The value of `x` in lane `lane ^ lanes`."""
    fb = em.fb
    if x.ptype == "b64":
        lo, hi, slo, shi = fb.reg("b32"), fb.reg("b32"), fb.reg("b32"), fb.reg("b32")
        fb.ins("mov.b64", Vec((lo, hi)), x)
        fb.ins("shfl.sync.bfly.b32", slo, lo, lanes, 0x1F, Imm("-1"))
        fb.ins("shfl.sync.bfly.b32", shi, hi, lanes, 0x1F, Imm("-1"))
        r = fb.reg("b64")
        fb.ins("mov.b64", r, Vec((slo, shi)))
        return r
    if x.ptype == "pred":
        w, s, p = fb.reg("b32"), fb.reg("b32"), fb.reg("pred")
        fb.ins("selp.u32", w, 1, 0, x)
        fb.ins("shfl.sync.bfly.b32", s, w, lanes, 0x1F, Imm("-1"))
        fb.ins("setp.ne.u32", p, s, 0)
        return p
    r = fb.reg(x.ptype)
    fb.ins("shfl.sync.bfly.b32", r, x, lanes, 0x1F, Imm("-1"))
    return r


def reduce(em: EmitContext, op: o.ReduceOp) -> None:
    (x,) = op.operands
    res = op.result
    xl = em.layout(x)
    d = xl.dims[op.axis]
    want = Layout(xl.base, tuple(None if i == op.axis else e for i, e in enumerate(xl.dims)))
    cb = Combiner(em, op.kind, x.type.dtype)
    fb = em.fb
    xregs = em.regs(x)
    values: list[Reg] = []
    indices: list[Reg] = []
    for offs in want.registers():
        if d is None:
            values.append(cb.lift(xregs[xl.index(offs)]))
            if cb.arg:
                z = fb.reg("b32")
                fb.ins("mov.u32", z, 0)
                indices.append(z)
            continue
        acc_v: Reg | None = None
        acc_i: Reg | None = None
        coord = em.bases[xl.base].coord[d]
        for off in xl.base.offsets(d):
            v = cb.lift(xregs[xl.index({**offs, d: off})])
            guard = em.bases[xl.base].guards.get((d, off))
            i: Reg | None = None
            if cb.arg:
                i = fb.reg("b32")
                fb.ins("add.u32", i, coord, off)
            if guard is not None:  # past the tile's edge: must not count
                idv = cb.identity()
                sv = em.new(cb.acc)
                if sv.ptype == "pred":
                    _pred_select(em, sv, v, idv, guard)
                else:
                    fb.ins(f"selp.{MOV[sv.ptype]}", sv, v, idv, guard)
                v = sv
                if i is not None:
                    si = fb.reg("b32")
                    fb.ins("selp.b32", si, i, Imm("2147483647"), guard)
                    i = si
            if acc_v is None:
                acc_v, acc_i = v, i
            elif cb.arg:  # offsets ascend: this element's index is past acc's
                assert acc_i is not None and i is not None
                acc_v, acc_i = cb.step_arg(acc_v, acc_i, v, i)
            else:
                acc_v = cb.combine(acc_v, v)
        assert acc_v is not None
        values.append(acc_v)
        if acc_i is not None:
            indices.append(acc_i)
    if d is not None and cb.arg and cb.acc in (f32, i32):
        keys = [_arg_key(em, cb, v, i) for v, i in zip(values, indices)]
        keys, _ = _across_threads(em, Combiner(em, "max", i64), xl, d, keys, [])
        indices = [_key_index(em, k) for k in keys]
    elif d is not None:
        values, indices = _across_threads(em, cb, xl, d, values, indices)
    out = indices if cb.arg else [finish(em, v, x.type.dtype, cb) for v in values]
    rl = em.layout(res)
    em.define(res, out if rl == want else convert(em, out, want, rl, res.type, res.type))


def _arg_key(em: EmitContext, cb: Combiner, v: Reg, i: Reg) -> Reg:
    """A (value, index) pair of a 32-bit argmax/argmin as one s64 whose signed maximum is the
    better pair: the high word orders the values (argmin's negated; f32 as an ordered integer,
    -0 as +0, every NaN above +inf: NaN first), the low word is ~index (lower index wins a tie,
    compared unsigned). Across threads one max.s64 then replaces a dozen compares and selects."""
    fb = em.fb
    hi = fb.reg("b32")
    if cb.acc is f32:
        x = v
        if cb.kind == "argmin":
            x = fb.reg("f32")
            fb.ins("neg.f32", x, v)
        z, m, nan = fb.reg("f32"), fb.reg("b32"), fb.reg("pred")
        fb.ins("add.rn.f32", z, x, f32_imm(0.0))  # -0 + 0 = +0: zeros of both signs tie
        fb.ins("mov.b32", hi, z)
        fb.ins("shr.s32", m, hi, 31)
        fb.ins("and.b32", m, m, 0x7FFFFFFF)
        key = fb.reg("b32")
        fb.ins("xor.b32", key, hi, m)  # negative floats: flip the magnitude bits
        fb.ins("setp.nan.f32", nan, v, v)
        hi = fb.reg("b32")
        fb.ins("selp.b32", hi, 0x7FFFFFFF, key, nan)
    elif cb.kind == "argmin":  # ~x reverses the signed order without overflow
        fb.ins("not.b32", hi, v)
    else:
        fb.ins("mov.b32", hi, v)
    lo, r = fb.reg("b32"), fb.reg("b64")
    fb.ins("not.b32", lo, i)
    fb.ins("mov.b64", r, Vec((lo, hi)))
    return r


def _key_index(em: EmitContext, key: Reg) -> Reg:
    """The index an `_arg_key` carries."""
    fb = em.fb
    lo, hi, i = fb.reg("b32"), fb.reg("b32"), fb.reg("b32")
    fb.ins("mov.b64", Vec((lo, hi)), key)
    fb.ins("not.b32", i, lo)
    return i


def _pred_select(em: EmitContext, dst: Reg, a: Reg, b: Reg, c: Reg) -> None:
    fb = em.fb
    t1, nc, t2 = fb.reg("pred"), fb.reg("pred"), fb.reg("pred")
    fb.ins("and.pred", t1, c, a)
    fb.ins("not.pred", nc, c)
    fb.ins("and.pred", t2, nc, b)
    fb.ins("or.pred", dst, t1, t2)


def finish(em: EmitContext, v: Reg, dt: type[DType], cb: Combiner) -> Reg:
    if dt in (f16, bf16):
        return em.narrow(v, dt)
    return v


def _across_threads(
    em: EmitContext, cb: Combiner, lay: Layout, d: int, values: list[Reg], indices: list[Reg]
) -> tuple[list[Reg], list[Reg]]:
    """Combine the partials of the threads along base dim d: shuffles, then shared memory."""
    b = lay.base
    if b.threads[d] == 1:
        return values, indices
    lo = b.stride(d).bit_length() - 1
    hi = lo + b.threads[d].bit_length() - 1
    for bit in range(lo, min(hi, 5)):
        for k in range(len(values)):
            pv = shuffle(em, values[k], 1 << bit)
            if cb.arg:
                pi = shuffle(em, indices[k], 1 << bit)
                values[k], indices[k] = cb.combine_arg(values[k], indices[k], pv, pi)
            else:
                values[k] = cb.combine(values[k], pv)
    wlo = max(lo, 5)
    if hi <= wlo:
        return values, indices
    fb, tid = em.fb, em.tid
    assert tid is not None
    slots = values + indices
    block = b.block
    smem = em.shared_scratch(len(slots) * block * 8)
    mine = fb.reg("b32")
    fb.ins("mad.lo.u32", mine, tid, 8, smem)
    for k, r in enumerate(slots):
        fb.ins(f"st.shared.{_width(r)}", _at(mine, k * block * 8), _as_bits(em, r))
    em.barrier()
    # Every thread reads the partials along d in the same order: identical results.
    first = fb.reg("b32")
    fb.ins("and.b32", first, tid, ~(((1 << (hi - wlo)) - 1) << wlo) & 0xFFFFFFFF)
    fb.ins("mad.lo.u32", first, first, 8, smem)
    n = len(values)
    new_v: list[Reg] = []
    new_i: list[Reg] = []
    for k in range(n):
        acc_v: Reg | None = None
        acc_i: Reg | None = None
        for j in range(1 << (hi - wlo)):
            off = (j << wlo) * 8
            v = _load_slot(em, first, k * block * 8 + off, values[k])
            i = _load_slot(em, first, (n + k) * block * 8 + off, indices[k]) if cb.arg else None
            if acc_v is None:
                acc_v, acc_i = v, i
            elif cb.arg:
                assert acc_i is not None and i is not None
                acc_v, acc_i = cb.combine_arg(acc_v, acc_i, v, i)
            else:
                acc_v = cb.combine(acc_v, v)
        assert acc_v is not None
        new_v.append(acc_v)
        if acc_i is not None:
            new_i.append(acc_i)
    em.barrier()
    return new_v, new_i


def _width(r: Reg) -> str:
    return "b64" if r.ptype == "b64" else "b32"


def _as_bits(em: EmitContext, r: Reg) -> Reg:
    if r.ptype != "pred":
        return r
    w = em.fb.reg("b32")
    em.fb.ins("selp.u32", w, 1, 0, r)
    return w


def _load_slot(em: EmitContext, base: Reg, offset: int, like: Reg) -> Reg:
    fb = em.fb
    if like.ptype == "pred":
        w, p = fb.reg("b32"), fb.reg("pred")
        fb.ins("ld.shared.b32", w, _at(base, offset))
        fb.ins("setp.ne.u32", p, w, 0)
        return p
    r = fb.reg(like.ptype)
    fb.ins(f"ld.shared.{_width(r)}", r, _at(base, offset))
    return r
