"""Integer arithmetic (PTX ISA §9.7.1): add, sub, mul, mad, mul24, mad24, sad, div, rem, abs,
neg, min, max, popc, clz, bfind, brev, bfe, bfi.

Values are computed as 64-bit two's complement (uint64, wrapping) and truncated to the type.
Division by zero, which the ISA leaves "unspecified, machine-specific", is defined here as:
quotient = all ones (-1 for signed types) and remainder = the dividend, so a == q*b + r holds.
MININT / -1 wraps to MININT (remainder 0).
"""

from __future__ import annotations

import numpy as np

from cutile_py.ptx.ast import Instruction, Operand
from cutile_py.sim.context import ExecContext
from cutile_py.sim.semantics._common import SINT, UINT, WIDTH, Mods, Run, is_signed, operands

M32 = np.uint64(0xFFFFFFFF)
#: The mask of the low w bits, as uint64.
LOW = {w: np.uint64((1 << w) - 1) for w in (8, 16, 32, 64)}
U32 = np.uint64(32)
ARITH = frozenset(f"{k}{w}" for k in "us" for w in (16, 32, 64))
#: Types shared by the 16-bit-lane SIMD forms (min/max .u16x2/.s16x2, sm_90).
PACKED = frozenset({"u16x2", "s16x2"})


def read_u64(ctx: ExecContext, op: Operand, ptype: str) -> np.ndarray:
    """Operand value as uint64 two's complement (sign-extended for .s types)."""
    v = np.asarray(ctx.read(op, ptype))
    if is_signed(ptype):
        return v.astype(np.int64).astype(np.uint64)
    return v.astype(np.uint64)


def write_u64(ctx: ExecContext, op: Operand, ptype: str, u: np.ndarray) -> None:
    """Store the low bits of a uint64 array as `ptype`."""
    w = WIDTH[ptype]
    t = u.astype(UINT[w])
    ctx.write(op, ptype, t.view(SINT[w]) if is_signed(ptype) else t)


def signed(u: np.ndarray, w: int) -> np.ndarray:
    """The int64 value of the low `w` bits of u, read as a signed w-bit integer."""
    return u.astype(UINT[w]).view(SINT[w]).astype(np.int64)


def mulhi64(a: np.ndarray, b: np.ndarray, is_signed: bool) -> np.ndarray:
    """High 64 bits of the 128-bit product (32-bit limbs; signed by the usual correction)."""
    a0, a1, b0, b1 = a & M32, a >> U32, b & M32, b >> U32
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> U32) + (p01 & M32) + (p10 & M32)
    hi = p11 + (p01 >> U32) + (p10 >> U32) + (mid >> U32)
    if is_signed:
        top = np.uint64(63)
        hi = hi - np.where((a >> top) == 1, b, 0) - np.where((b >> top) == 1, a, 0)
    return np.asarray(hi)


def _product(a: np.ndarray, b: np.ndarray, ptype: str, mode: str) -> tuple[np.ndarray, str]:
    """mul's t<…> selection: (.lo) low w bits, (.hi) high w bits, (.wide) all 2w bits."""
    w = WIDTH[ptype]
    s = is_signed(ptype)
    if mode == "lo":
        return a * b, ptype
    if w == 64:
        if mode == "wide":
            raise ValueError("wide")
        return mulhi64(a, b, s), ptype
    full = (signed(a, w) * signed(b, w)).astype(np.uint64) if s else a * b  # exact in 64 bits
    if mode == "wide":
        return full, f"{ptype[0]}{2 * w}"
    hi = (full.view(np.int64) >> np.int64(w)).astype(np.uint64) if s else full >> np.uint64(w)
    return hi, ptype


def add_sub(instr: Instruction) -> Run:
    """add/sub.{u,s}{16,32,64}, with .sat on .s32 (§9.7.1.1-2)."""
    m = Mods(instr)
    t = m.type(ARITH)
    sat = t == "s32" and m.flag("sat")
    m.finish()
    d, a_op, b_op = operands(instr, 3)
    add = instr.opcode == "add"
    if not sat:
        # Wrapping arithmetic in the type's own width: the low bits are those of the 64-bit
        # two's complement result, without widening every lane to 64 bits and back.
        dt = UINT[WIDTH[t]]

        def run_wrap(ctx: ExecContext) -> None:
            a, b = ctx.read(a_op, t).view(dt), ctx.read(b_op, t).view(dt)
            ctx.write(d, t, (a + b if add else a - b).view(SINT[WIDTH[t]] if t[0] == "s" else dt))

        return run_wrap

    def run(ctx: ExecContext) -> None:
        a, b = read_u64(ctx, a_op, t), read_u64(ctx, b_op, t)
        sa, sb = signed(a, 32), signed(b, 32)
        r = sa + sb if add else sa - sb
        write_u64(ctx, d, t, np.clip(r, -(2**31), 2**31 - 1).astype(np.uint64))

    return run


def mul_mad(instr: Instruction) -> Run:
    """mul/mad.{lo,hi,wide} (§9.7.1.3-4) incl. mad.hi.sat.s32; `.cc` forms are not modelled."""
    m = Mods(instr)
    t = m.type(ARITH)
    mode = m.one_of(("lo", "hi", "wide"), "mode", required=True)
    assert mode is not None
    sat = instr.opcode == "mad" and mode == "hi" and t == "s32" and m.flag("sat")
    m.finish()
    if mode == "wide" and WIDTH[t] == 64:
        m.fail(".wide is defined for 16- and 32-bit types only")
    mad = instr.opcode == "mad"
    ops = operands(instr, 4 if mad else 3)
    if mode == "lo":
        # The low bits of a wrapping product or sum do not depend on the width computed in.
        dt = UINT[WIDTH[t]]
        out = SINT[WIDTH[t]] if t[0] == "s" else dt

        def run_lo(ctx: ExecContext) -> None:
            r = ctx.read(ops[1], t).view(dt) * ctx.read(ops[2], t).view(dt)
            if mad:
                r = r + ctx.read(ops[3], t).view(dt)
            ctx.write(ops[0], t, r.view(out))

        return run_lo

    def run(ctx: ExecContext) -> None:
        a, b = read_u64(ctx, ops[1], t), read_u64(ctx, ops[2], t)
        r, rt = _product(a, b, t, mode)
        if mad:
            c = read_u64(ctx, ops[3], rt)
            if sat:
                exact = signed(r, 32) + signed(c, 32)
                r = np.clip(exact, -(2**31), 2**31 - 1).astype(np.uint64)
            else:
                r = r + c
        write_u64(ctx, ops[0], rt, r)

    return run


def mul24_mad24(instr: Instruction) -> Run:
    """mul24/mad24.{lo,hi}.{u32,s32}: 24-bit operands, 48-bit product (§9.7.1.5-6)."""
    m = Mods(instr)
    t = m.type({"u32", "s32"})
    mode = m.one_of(("lo", "hi"), "mode", required=True)
    sat = instr.opcode == "mad24" and mode == "hi" and t == "s32" and m.flag("sat")
    m.finish()
    mad = instr.opcode == "mad24"
    ops = operands(instr, 4 if mad else 3)

    def run(ctx: ExecContext) -> None:
        a, b = (read_u64(ctx, op, t) & np.uint64(0xFFFFFF) for op in ops[1:3])
        if is_signed(t):
            a, b = (signed(x << np.uint64(8), 32) >> np.int64(8) for x in (a, b))
            p = (a * b).astype(np.uint64)
        else:
            p = a * b
        r = p if mode == "lo" else p >> np.uint64(16)  # .hi: bits 47..16 of the product
        if mad:
            c = read_u64(ctx, ops[3], t)
            if sat:
                r = np.clip(signed(r, 32) + signed(c, 32), -(2**31), 2**31 - 1).astype(np.uint64)
            else:
                r = r + c
        write_u64(ctx, ops[0], t, r)

    return run


def sad(instr: Instruction) -> Run:
    """sad: d = c + |a - b| (§9.7.1.7)."""
    m = Mods(instr)
    t = m.type(ARITH)
    m.finish()
    d, *srcs = operands(instr, 4)

    def run(ctx: ExecContext) -> None:
        a, b, c = (read_u64(ctx, op, t) for op in srcs)
        w = WIDTH[t]
        va, vb = (signed(a, w), signed(b, w)) if is_signed(t) else (a & LOW[w], b & LOW[w])
        less = va < vb
        write_u64(ctx, d, t, c + np.where(less, b - a, a - b))

    return run


def div_rem(instr: Instruction) -> Run:
    """div/rem, truncating toward zero; by zero: q = all ones, r = a (module docstring)."""
    m = Mods(instr)
    t = m.type(ARITH)
    m.finish()
    d, a_op, b_op = operands(instr, 3)
    w = WIDTH[t]

    def run(ctx: ExecContext) -> None:
        a, b = read_u64(ctx, a_op, t), read_u64(ctx, b_op, t)
        zero = b.astype(UINT[w]) == 0
        if is_signed(t):
            sa, sb = signed(a, w), signed(b, w)
            ua = np.where(sa < 0, np.uint64(0) - sa.astype(np.uint64), sa.astype(np.uint64))
            ub = np.where(sb < 0, np.uint64(0) - sb.astype(np.uint64), sb.astype(np.uint64))
            with np.errstate(all="ignore"):
                q = ua // np.where(zero, np.uint64(1), ub)
            r = ua - q * ub
            q = np.where((sa < 0) != (sb < 0), np.uint64(0) - q, q)
            r = np.where(sa < 0, np.uint64(0) - r, r)
        else:
            ua, ub = a, b  # zero-extended by read_u64
            q = ua // np.where(zero, np.uint64(1), ub)
            r = ua - q * ub
        q = np.where(zero, LOW[64], q)
        r = np.where(zero, a, r)
        write_u64(ctx, d, t, q if instr.opcode == "div" else r)

    return run


def abs_neg(instr: Instruction) -> Run:
    """abs/neg.{s16,s32,s64}, wrapping (abs(MININT) == MININT)."""
    m = Mods(instr)
    t = m.type({"s16", "s32", "s64"})
    m.finish()
    d, a_op = operands(instr, 2)

    def run(ctx: ExecContext) -> None:
        a = read_u64(ctx, a_op, t)
        neg = np.uint64(0) - a
        if instr.opcode == "neg":
            write_u64(ctx, d, t, neg)
        else:
            write_u64(ctx, d, t, np.where(signed(a, WIDTH[t]) < 0, neg, a))

    return run


def _split16(u: np.ndarray) -> np.ndarray:
    return np.stack([u & np.uint64(0xFFFF), (u >> np.uint64(16)) & np.uint64(0xFFFF)])


def minmax(instr: Instruction) -> Run:
    """Integer min/max incl. .relu (.s32, .s16x2) and the SIMD .u16x2/.s16x2 forms."""
    m = Mods(instr)
    t = m.type(ARITH | PACKED)
    relu = t in ("s32", "s16x2") and m.flag("relu")
    m.finish()
    d, a_op, b_op = operands(instr, 3)
    is_max = instr.opcode == "max"

    def run(ctx: ExecContext) -> None:
        if t in PACKED:
            a, b = (_split16(read_u64(ctx, op, "b32")) for op in (a_op, b_op))
            lane_t = t[:3]
        else:
            a, b = read_u64(ctx, a_op, t), read_u64(ctx, b_op, t)
            lane_t = t
        w = WIDTH[lane_t]
        if is_signed(lane_t):
            va, vb = signed(a, w), signed(b, w)
            r = np.maximum(va, vb) if is_max else np.minimum(va, vb)
            if relu:
                r = np.maximum(r, 0)
            r = r.astype(np.uint64) & LOW[w]
        else:
            r = np.maximum(a, b) if is_max else np.minimum(a, b)
        if t in PACKED:
            write_u64(ctx, d, "b32", r[0] | (r[1] << np.uint64(16)))
        else:
            write_u64(ctx, d, t, r)

    return run


def _clz(x: np.ndarray, w: int) -> np.ndarray:
    """Leading zeros of the low `w` bits of uint64 x (binary search)."""
    x = x & LOW[w]
    n = np.zeros(x.shape, dtype=np.int64)
    s = w // 2
    while s:
        top = (x >> np.uint64(w - s)) == 0
        n += np.where(top, s, 0)
        x = np.where(top, (x << np.uint64(s)) & LOW[w], x)
        s //= 2
    return np.where(x == 0, w, n)


def bit_count(instr: Instruction) -> Run:
    """popc, clz (.b32/.b64 → .u32) and bfind{.shiftamt} (.u32/.s32/.u64/.s64 → .u32)."""
    m = Mods(instr)
    op = instr.opcode
    types = {"b32", "b64"} if op != "bfind" else {"u32", "s32", "u64", "s64"}
    t = m.type(types)
    shiftamt = op == "bfind" and m.flag("shiftamt")
    m.finish()
    d, a_op = operands(instr, 2)
    w = WIDTH[t]

    def run(ctx: ExecContext) -> None:
        a = read_u64(ctx, a_op, t) & LOW[w]
        if op == "popc":
            r = np.bitwise_count(a).astype(np.int64)
        elif op == "clz":
            r = _clz(a, w)
        else:
            if is_signed(t):
                neg = (a >> np.uint64(w - 1)) == 1
                a = np.where(neg, ~a & LOW[w], a)
            lz = _clz(a, w)
            r = np.where(a == 0, -1, lz if shiftamt else w - 1 - lz)
        ctx.write(d, "u32", r.astype(np.int64).astype(np.uint32))

    return run


def brev(instr: Instruction) -> Run:
    """brev.{b32,b64}: bit reversal (§9.7.1.18)."""
    m = Mods(instr)
    t = m.type({"b32", "b64"})
    m.finish()
    d, a_op = operands(instr, 2)
    w = WIDTH[t]

    def run(ctx: ExecContext) -> None:
        x = read_u64(ctx, a_op, t)
        out = np.zeros_like(x)
        for i in range(w):
            out |= ((x >> np.uint64(i)) & np.uint64(1)) << np.uint64(w - 1 - i)
        write_u64(ctx, d, t, out)

    return run


def _mask(n: np.ndarray) -> np.ndarray:
    """(1 << n) - 1 for n in 0..64, as uint64."""
    n = n.astype(np.uint64)
    full = n >= np.uint64(64)
    low = (np.uint64(1) << np.minimum(n, np.uint64(63))) - np.uint64(1)
    return np.asarray(np.where(full, LOW[64], low))


def bfe(instr: Instruction) -> Run:
    """bfe.{u32,s32,u64,s64} d, a, pos, len per the ISA's bit-by-bit definition (§9.7.1.19)."""
    m = Mods(instr)
    t = m.type({"u32", "s32", "u64", "s64"})
    m.finish()
    d, a_op, b_op, c_op = operands(instr, 4)
    w = WIDTH[t]

    def run(ctx: ExecContext) -> None:
        a = read_u64(ctx, a_op, t) & LOW[w]
        pos = read_u64(ctx, b_op, "u32") & np.uint64(0xFF)
        ln = read_u64(ctx, c_op, "u32") & np.uint64(0xFF)
        avail = np.where(pos < np.uint64(w), np.uint64(w) - pos, np.uint64(0))
        eff = np.minimum(ln, avail)  # field bits taken from a
        field = (a >> np.minimum(pos, np.uint64(63))) & _mask(eff)
        field = np.where(pos < np.uint64(w), field, np.uint64(0))
        if is_signed(t):
            sbit_pos = np.minimum(pos + ln - np.uint64(1), np.uint64(w - 1))
            sbit = np.where(ln == 0, np.uint64(0), (a >> sbit_pos) & np.uint64(1))
            field = np.where(sbit == 1, field | ~_mask(eff), field)
        write_u64(ctx, d, t, field)

    return run


def bfi(instr: Instruction) -> Run:
    """bfi.{b32,b64} f, a, b, pos, len: insert a's low bits into b (§9.7.1.20)."""
    m = Mods(instr)
    t = m.type({"b32", "b64"})
    m.finish()
    f, a_op, b_op, c_op, d_op = operands(instr, 5)
    w = WIDTH[t]

    def run(ctx: ExecContext) -> None:
        a, b = read_u64(ctx, a_op, t), read_u64(ctx, b_op, t)
        pos = read_u64(ctx, c_op, "u32") & np.uint64(0xFF)
        ln = read_u64(ctx, d_op, "u32") & np.uint64(0xFF)
        avail = np.where(pos < np.uint64(w), np.uint64(w) - pos, np.uint64(0))
        sh = np.minimum(pos, np.uint64(63))
        mask = _mask(np.minimum(ln, avail)) << sh
        write_u64(ctx, f, t, (b & ~mask) | ((a << sh) & mask))

    return run
