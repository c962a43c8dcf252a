"""Floating-point arithmetic (PTX ISA §9.7.3 and the half-precision §9.7.4): add, sub, mul,
fma, mad, div, rcp, sqrt (rounded forms), min, max, abs, neg, copysign and testp.

f32/f16/bf16 (and the packed x2 forms) are bit exact in every rounding mode (see `fpcore`);
f64 is bit exact through `f64ops`. `.ftz` flushes subnormal inputs and results (the result after
rounding) to zero of the same sign; `.sat` clamps to [0.0, 1.0] with NaN → +0.0. NaN results are
the canonical NaN of f32/f16/bf16 (the ISA leaves single-precision NaN bits unspecified).
"""

from __future__ import annotations

import numpy as np

from cutile_py.ptx.ast import Instruction, Operand
from cutile_py.sim.context import ExecContext
from cutile_py.sim.semantics import f64ops
from cutile_py.sim.semantics._common import (
    ROUND_FLOAT,
    Mods,
    Run,
    operands,
    read_typed_bits,
    write_bits,
    write_pred,
)
from cutile_py.sim.semantics.fpcore import (
    BF16,
    F16,
    F32,
    F64,
    FloatFormat,
    decode,
    flush_bits,
    fma_rn_f32,
    is_nan_bits,
    is_subnormal_bits,
    odd_add,
    odd_div,
    odd_fma,
    odd_sqrt,
    round_f64,
    saturate,
)

#: Element format and elements per register of each floating instruction type.
ELEMS: dict[str, tuple[FloatFormat, int]] = {
    "f16": (F16, 1),
    "f16x2": (F16, 2),
    "bf16": (BF16, 1),
    "bf16x2": (BF16, 2),
    "f32": (F32, 1),
    "f64": (F64, 1),
}
HALF = frozenset({"f16", "f16x2", "bf16", "bf16x2"})
FTZ_TYPES = frozenset({"f32", "f16", "f16x2"})


def load(ctx: ExecContext, op: Operand, ftype: str) -> np.ndarray:
    """The encodings of an operand, shape (elements, lanes); element 0 is the low half."""
    k = ELEMS[ftype][1]
    bits = read_typed_bits(ctx, op, ftype)
    if k == 1:
        return bits[None, :]
    lo = (bits & np.uint32(0xFFFF)).astype(np.uint16)
    hi = (bits >> np.uint32(16)).astype(np.uint16)
    return np.stack([lo, hi])


def store(ctx: ExecContext, op: Operand, ftype: str, bits: np.ndarray) -> None:
    fmt, k = ELEMS[ftype]
    if k == 1:
        write_bits(ctx, op, fmt.nbits, bits[0])
        return
    packed = bits[0].astype(np.uint32) | (bits[1].astype(np.uint32) << np.uint32(16))
    write_bits(ctx, op, 32, packed)


def load_values(ctx: ExecContext, op: Operand, ftype: str, ftz: bool) -> np.ndarray:
    """Exact float64 values of an operand (after `.ftz` flushing), shape (elements, lanes)."""
    fmt = ELEMS[ftype][0]
    bits = load(ctx, op, ftype)
    if ftz:
        bits = flush_bits(bits, fmt)
    return decode(bits, fmt)


def finish_bits(odd: np.ndarray, fmt: FloatFormat, mode: str, ftz: bool, sat: bool) -> np.ndarray:
    """Round an f64 (exact or rounded to odd) to `fmt`, applying `.sat` and `.ftz`."""
    if sat:
        odd = saturate(odd)
    bits = round_f64(odd, fmt, mode)
    return flush_bits(bits, fmt) if ftz else bits


def relu_bits(bits: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """`.relu`: negative results (and -0.0) become +0.0; NaN stays (canonical) NaN."""
    neg = (bits & bits.dtype.type(fmt.sign_bit)) != 0
    return np.where(neg & ~is_nan_bits(bits, fmt), bits.dtype.type(0), bits)


def _float_mods(
    instr: Instruction, types: frozenset[str], sat_ok: bool = False
) -> tuple[Mods, str, bool, bool]:
    """Type, `.ftz` (f32, f16) and, where the instruction has it, `.sat` (f32, f16)."""
    m = Mods(instr)
    ftype = m.type(types)
    ftz = ftype in FTZ_TYPES and m.flag("ftz")
    sat = sat_ok and ftype in FTZ_TYPES and m.flag("sat")
    return m, ftype, ftz, sat


ARITH_TYPES = frozenset(ELEMS)


def arith(instr: Instruction) -> Run:
    """add, sub, mul, fma and mad on floating types (§9.7.3.3-7, §9.7.4.1-4)."""
    kind = instr.opcode
    m, ftype, ftz, sat = _float_mods(instr, ARITH_TYPES, sat_ok=True)
    rnd = m.one_of(ROUND_FLOAT, "rounding")
    fused = kind in ("fma", "mad")
    if fused and rnd is None:
        m.fail("needs a rounding modifier (.rn, .rz, .rm or .rp)")
    if ftype in HALF and rnd not in (None, "rn"):
        m.fail(f"only .rn is defined for .{ftype}")
    if ftype in HALF and kind == "mad":
        m.fail(f"mad is not defined for .{ftype}")
    relu = fused and ftype in HALF and m.flag("relu")
    m.finish()
    mode = rnd or "rn"
    d, *srcs = operands(instr, 4 if fused else 3)
    if ftype == "f64":

        def run_f64(ctx: ExecContext) -> None:
            a, b, *c = (np.asarray(ctx.read(s, "f64"), dtype=np.float64) for s in srcs)
            if kind == "add":
                r = f64ops.f64_add(a, b, mode)
            elif kind == "sub":
                r = f64ops.f64_add(a, -b, mode)
            elif kind == "mul":
                r = f64ops.f64_mul(a, b, mode)
            else:
                r = f64ops.f64_fma(a, b, c[0], mode)
            ctx.write(d, "f64", r)

        return run_f64
    fmt = ELEMS[ftype][0]
    if ftype == "f32" and mode == "rn" and not fused:
        return _f32_rn(kind, d, srcs, ftz, sat)

    def run(ctx: ExecContext) -> None:
        vals = [load_values(ctx, s, ftype, ftz) for s in srcs]
        with np.errstate(all="ignore"):
            if fused and mode == "rn" and fmt is F32:
                odd = fma_rn_f32(vals[0], vals[1], vals[2])
            elif kind == "add":
                odd = odd_add(vals[0], vals[1], mode)
            elif kind == "sub":
                odd = odd_add(vals[0], -vals[1], mode)
            elif kind == "mul":
                odd = vals[0] * vals[1]  # exact in f64 for these formats
            else:
                odd = odd_fma(vals[0], vals[1], vals[2], mode)
        bits = finish_bits(odd, fmt, mode, ftz, sat)
        store(ctx, d, ftype, relu_bits(bits, fmt) if relu else bits)

    return run


def _f32_rn(kind: str, d: Operand, srcs: list[Operand], ftz: bool, sat: bool) -> Run:
    """add/sub/mul.rn.f32 in NumPy's float32, which rounds to nearest even like IEEE 754
    (subnormals, overflow and signed zeros included); only NaNs need canonicalising."""
    a_op, b_op = srcs
    nan = np.uint32(F32.canonical_nan)

    def run(ctx: ExecContext) -> None:
        x, y = ctx.read(a_op, "f32"), ctx.read(b_op, "f32")
        if ftz:
            x = flush_bits(x.view(np.uint32), F32).view(np.float32)
            y = flush_bits(y.view(np.uint32), F32).view(np.float32)
        with np.errstate(all="ignore"):
            r = x + y if kind == "add" else x - y if kind == "sub" else x * y
        if sat:
            r = saturate(r)
        bits = r.view(np.uint32)
        isnan = np.isnan(r)
        if isnan.any():
            bits = np.where(isnan, nan, bits)
        ctx.write(d, "f32", (flush_bits(bits, F32) if ftz else bits).view(np.float32))

    return run


def div(instr: Instruction) -> Run:
    """div.{rnd,approx,full}{.ftz}.f32 and div.rnd.f64 (§9.7.3.8)."""
    m, ftype, ftz, _ = _float_mods(instr, frozenset({"f32", "f64"}))
    kind = m.one_of((*ROUND_FLOAT, "approx", "full"), "division", required=True)
    m.finish()
    assert kind is not None
    d, a_op, b_op = operands(instr, 3)
    if ftype == "f64" and kind not in ROUND_FLOAT:
        m.fail(f".{kind} is defined for .f32 only")

    def run(ctx: ExecContext) -> None:
        if ftype == "f64":
            a, b = (np.asarray(ctx.read(x, "f64"), dtype=np.float64) for x in (a_op, b_op))
            ctx.write(d, "f64", f64ops.f64_div(a, b, kind))
            return
        if kind in ROUND_FLOAT:
            a, b = (load_values(ctx, x, "f32", ftz) for x in (a_op, b_op))
            with np.errstate(all="ignore"):
                store(ctx, d, "f32", finish_bits(odd_div(a, b), F32, kind, ftz, False))
            return
        # .approx/.full: modelled as the correctly rounded quotient (the hardware is within 2 ulp).
        # The ISA flushes their subnormal inputs and results; division by zero gives infinity with
        # the sign of a; div.approx returns 0 (NaN for infinite a) when 2**126 < |b| < 2**128.
        a, b = (load_values(ctx, x, "f32", True) for x in (a_op, b_op))
        with np.errstate(all="ignore"):
            q = a / b
            q = np.where((b == 0) & (a != 0) & ~np.isnan(a), np.copysign(np.inf, a), q)
            if kind == "approx":
                huge = (np.abs(b) > 2.0**126) & np.isfinite(b)
                q = np.where(huge, np.where(np.isinf(a), np.nan, np.copysign(0.0, a * b)), q)
        store(ctx, d, "f32", finish_bits(q, F32, "rn", True, False))

    return run


def rcp_sqrt_rounded(instr: Instruction, kind: str, rnd: str) -> Run:
    """rcp.rnd / sqrt.rnd on .f32 (`.ftz` allowed) and .f64, correctly rounded."""
    m = Mods(instr)
    m.flag(rnd)
    ftype = m.type({"f32", "f64"})
    ftz = ftype == "f32" and m.flag("ftz")
    m.finish()
    d, a_op = operands(instr, 2)

    def run(ctx: ExecContext) -> None:
        if ftype == "f64":
            a = np.asarray(ctx.read(a_op, "f64"), dtype=np.float64)
            one = np.ones_like(a)
            r = f64ops.f64_div(one, a, rnd) if kind == "rcp" else f64ops.f64_sqrt(a, rnd)
            ctx.write(d, "f64", r)
            return
        a = load_values(ctx, a_op, "f32", ftz)
        with np.errstate(all="ignore"):
            odd = odd_div(np.ones_like(a), a) if kind == "rcp" else odd_sqrt(a)
        store(ctx, d, "f32", finish_bits(odd, F32, rnd, ftz, False))

    return run


def _select(x: np.ndarray, y: np.ndarray, fmt: FloatFormat, is_max: bool, nan: bool) -> np.ndarray:
    """min/max of encodings per the ISA pseudo-code (-0.0 < +0.0; NaN rules)."""
    xv, yv = decode(x, fmt), decode(y, fmt)
    xn, yn = np.isnan(xv), np.isnan(yv)
    xs, ys = np.signbit(xv), np.signbit(yv)
    zeros = xv == yv  # only two zeros of different sign need the sign test
    x_larger = (xv > yv) | (zeros & ~xs & ys)
    x_smaller = (xv < yv) | (zeros & xs & ~ys)
    take_x = x_larger if is_max else x_smaller
    res = np.where(take_x, x, y)
    if not nan:
        res = np.where(xn & ~yn, y, np.where(yn & ~xn, x, res))
    nan_res = (xn & yn) | ((xn | yn) if nan else False)
    return np.where(nan_res, x.dtype.type(fmt.canonical_nan), res)


def minmax(instr: Instruction) -> Run:
    """min/max on floating types incl. .NaN, .xorsign.abs and 3-input .f32 (§9.7.3.11-12)."""
    is_max = instr.opcode == "max"
    m, ftype, ftz, _ = _float_mods(instr, ARITH_TYPES)
    nan = ftype != "f64" and m.flag("NaN")
    xorsign = ftype != "f64" and m.flag("xorsign")
    absf = ftype != "f64" and m.flag("abs")
    m.finish()
    if xorsign and not absf:
        m.fail(".xorsign requires .abs")
    nsrc = len(instr.operands) - 1
    if nsrc == 3 and (ftype != "f32" or xorsign):
        m.fail("three inputs are defined for .f32 without .xorsign only")
    d, *srcs = operands(instr, nsrc + 1 if nsrc == 3 else 3)
    fmt = ELEMS[ftype][0]

    def run(ctx: ExecContext) -> None:
        bits = [load(ctx, s, ftype) for s in srcs]
        if ftz:
            bits = [flush_bits(b, fmt) for b in bits]
        sign = bits[0].dtype.type(fmt.sign_bit)
        xsign = (bits[0] ^ bits[1]) & sign
        if absf:
            bits = [b & ~sign for b in bits]
        res = _select(bits[0], bits[1], fmt, is_max, nan)
        if nsrc == 3:
            res = _select(res, bits[2], fmt, is_max, nan)
        if xorsign:
            res = np.where(is_nan_bits(res, fmt), res, (res & ~sign) | xsign)
        store(ctx, d, ftype, res)

    return run


def abs_neg(instr: Instruction) -> Run:
    """abs/neg on floating types: sign-bit operations (NaN in gives an unspecified NaN)."""
    m, ftype, ftz, _ = _float_mods(instr, ARITH_TYPES)
    m.finish()
    d, a_op = operands(instr, 2)
    fmt = ELEMS[ftype][0]

    def run(ctx: ExecContext) -> None:
        bits = load(ctx, a_op, ftype)
        if ftz:
            bits = flush_bits(bits, fmt)
        sign = bits.dtype.type(fmt.sign_bit)
        store(ctx, d, ftype, bits & ~sign if instr.opcode == "abs" else bits ^ sign)

    return run


def copysign(instr: Instruction) -> Run:
    """copysign.{f32,f64} d, a, b: b with the sign bit of a (§9.7.3.2)."""
    m = Mods(instr)
    ftype = m.type({"f32", "f64"})
    m.finish()
    d, a_op, b_op = operands(instr, 3)
    width = 32 if ftype == "f32" else 64

    def run(ctx: ExecContext) -> None:
        a, b = read_typed_bits(ctx, a_op, ftype), read_typed_bits(ctx, b_op, ftype)
        sign = a.dtype.type(1 << (width - 1))
        write_bits(ctx, d, width, (b & ~sign) | (a & sign))

    return run


def testp(instr: Instruction) -> Run:
    """testp.op.{f32,f64} p, a (§9.7.3.1); zeros count as normal."""
    m = Mods(instr)
    op = m.one_of(
        ("finite", "infinite", "number", "notanumber", "normal", "subnormal"), "test", required=True
    )
    ftype = m.type({"f32", "f64"})
    m.finish()
    p, a_op = operands(instr, 2)
    fmt = F32 if ftype == "f32" else F64

    def run(ctx: ExecContext) -> None:
        bits = read_typed_bits(ctx, a_op, ftype)
        v = decode(bits, fmt)
        sub = is_subnormal_bits(bits, fmt)
        result = {
            "finite": np.isfinite(v),
            "infinite": np.isinf(v),
            "number": ~np.isnan(v),
            "notanumber": np.isnan(v),
            "normal": np.isfinite(v) & ~sub,
            "subnormal": sub,
        }[str(op)]
        write_pred(ctx, p, result)

    return run
