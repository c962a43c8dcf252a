"""PTX instruction sequences for f32 math (division, floor division and remainder, roots,
exp/log, pow, tanh, sigmoid, sin/cos, erf).

Each `emit_*` appends code and returns a fresh f32 register; all is straight-line except the
exact remainder's reduction loop (`_fmod`) and sin/cos's branch to their large-argument
reduction (`_trig_reduce_large`).
"""

from __future__ import annotations

import math
import struct
from typing import Protocol

from cutile_py.ptx.builder import FunctionBuilder, Imm, Operand, Reg, Vec, f32_imm, int_imm

__all__ = [
    "BINARY",
    "UNARY",
    "BinaryEmitter",
    "UnaryEmitter",
    "emit_cos",
    "emit_div",
    "emit_erf",
    "emit_exp",
    "emit_exp2",
    "emit_floordiv",
    "emit_log",
    "emit_log2",
    "emit_mod",
    "emit_pow",
    "emit_rsqrt",
    "emit_sigmoid",
    "emit_sin",
    "emit_sqrt",
    "emit_tanh",
]


def _k(hex_float: str) -> Imm:
    """An f32 immediate from a hex-float literal, which must be exactly representable."""
    value = float.fromhex(hex_float)
    imm = f32_imm(value)
    if struct.unpack(">f", bytes.fromhex(imm.text[2:]))[0] != value:
        raise ValueError(f"{hex_float} is not an f32 value")
    return imm


# Constants (exact f32 values; the `_LO` parts carry the next 24 bits of the true value).
_LOG2E = _k("0x1.715476p+0")  # f32(log2(e))
_LOG2E_LO = _k("0x1.4ae0c0p-26")  # log2(e) - _LOG2E
_TWO_LOG2E = _k("0x1.715476p+1")
_LN2 = _k("0x1.62e430p-1")  # f32(ln 2)
_LN2_LO = _k("-0x1.05c610p-29")  # ln 2 - _LN2
_NEG_LN2 = _k("-0x1.62e430p-1")
_NEG_LN2_LO = _k("0x1.05c610p-29")
_NEG_LOG2E = _k("-0x1.715476p+0")
_ROUND_MAGIC = _k("0x1.8p+23")  # adding it rounds |t| < 2^22 to an integer (half to even)
_ZERO = _k("0x0p+0")
_HALF = _k("0x1p-1")
_ONE = _k("0x1p+0")
_TWO = _k("0x1p+1")
_MINUS_TWO = _k("-0x1p+1")
_MIN_NORMAL = _k("0x1p-126")
_TWO_23 = _k("0x1p+23")
_FLT_MAX = _k("0x1.fffffep+127")
_NEG_INF = Imm("0fFF800000")
_NAN = Imm("0f7FFFFFFF")
# Inputs are clamped to where the result has just underflowed to 0 (< 2^-150) or overflowed
# (> 2^128), which keeps the reduced argument inside the polynomial's interval and the scale
# exponent j in [-151, 128].
_EXP_X_MIN = _k("-0x1.a2p+6")  # -104.5: e^x < 2^-150.7
_EXP_X_MAX = _k("0x1.64p+6")  # 89: e^x > 2^128.4
_EXP_NEG_X_MAX = _k("0x1.a2p+6")  # 104.5, for e^-x
# exp on ex2.approx: j = rint(x log2e) clamped to [-126, 127] (so 2^j is a normal number whose
# bits are (j + 127) << 23) from one saturating fma: u = x log2e/253 + 126/253 in [0, 1] (NaN
# gives 0), s = u*253 + 1.5*2^23 + 1 = (1.5*2^23 + 127) + j, exactly, rounded to an integer.
_EXP_U_SCALE = _k("0x1.75b598p-8")  # f32(log2(e) / 253)
_EXP_U_BIAS = _k("0x1.fdf9eep-2")  # f32(126 / 253)
_EXP_U_RANGE = _k("0x1.fap+7")  # 253
_EXP_S_BIAS = _k("0x1.800002p+23")  # 1.5*2^23 + 1
_EXP_S_ZERO = _k("0x1.8000fep+23")  # 1.5*2^23 + 127: s - this is j
_EXP2_X_MIN = _k("-0x1.2ep+7")  # -151
_EXP2_X_MAX = _k("0x1.02p+7")  # 129

# log: the fdlibm/musl logf kernel. m in [sqrt(1/2), sqrt(2)), f = m - 1, s = f/(2+f);
# log(1+f) = f - f^2/2 + s*(f^2/2 + R(s^2)), with |R - (log(1+s) - log(1-s))/s| < 2^-34.2.
_LG1 = _k("0xaaaaaa.0p-24")
_LG2 = _k("0xccce13.0p-25")
_LG3 = _k("0x91e9ee.0p-25")
_LG4 = _k("0xf89e26.0p-26")

# tanh on |x| < 0.625: tanh(x) = x + x*z*P(z), z = x^2, P a degree-4 relative-error minimax fit
# of (tanh(x)/x - 1)/z (Lawson iteration in float64, coefficients rounded to f32 one at a time
# with the rest refitted): within 2^-27.7 of tanh, so the f32 evaluation error dominates.
_TANH_SMALL = _k("0x1.4p-1")  # 0.625
_TANH_CLAMP = _k("0x1.3p+3")  # 9.5; above 9.01, tanh rounds to 1
_TANH_P = tuple(
    _k(h)
    for h in (
        "-0x1.555532p-2",
        "0x1.1106f6p-3",
        "-0x1.b835a4p-5",
        "0x1.51f8cep-6",
        "-0x1.750ce2p-8",
    )
)

# e^r = 1 + r*Q(r) on |r| <= 0.3467 (ln2/2 plus the rounding slack of the reduction) and
# 2^f = 1 + f*Q2(f) on |f| <= 1/2: degree-5 relative-error minimax fits made as for tanh's,
# within 2^-28.2 of the function. Horner with fma then stays within ~1 ulp, with IEEE
# operations only (no ex2.approx), so the bound does not rest on undocumented hardware error.
_EXP_Q = tuple(
    _k(h)
    for h in (
        "0x1p+0",
        "0x1.fffffcp-2",
        "0x1.555492p-3",
        "0x1.5558aep-5",
        "0x1.123986p-7",
        "0x1.6a4f54p-10",
    )
)
_EXP2_Q = tuple(
    _k(h)
    for h in (
        "0x1.62e430p-1",
        "0x1.ebfbdcp-3",
        "0x1.c6af7cp-5",
        "0x1.3b2de0p-7",
        "0x1.5f0830p-10",
        "0x1.416b42p-13",
    )
)


def _d(value: float) -> Imm:
    """An f64 immediate (PTX's exact `0d` form)."""
    return Imm("0d" + struct.pack(">d", value).hex().upper())


# pow: ln(m) = 2 atanh(s) = 2s(1 + z/3 + z^2/5 + ...), s = f/(2+f), z = s^2 <= 0.0295 on the
# reduced m in [sqrt(1/2), sqrt(2)): the terms through z^8/17 leave < 2^-50 relative. e^u on
# |u| <= ln2/2 by Taylor through u^11/11! (< 2^-47 relative). Both in f64.
_ATANH_D = tuple(_d(1.0 / (2 * j + 1)) for j in range(9))
_EXP_D = tuple(_d(1.0 / math.factorial(j)) for j in range(12))
_LOG2E_D = _d(1.0 / math.log(2.0))
_LN2_D = _d(math.log(2.0))
_POW_T_LIMIT = 200.0  # |y log2 x| beyond it: 2^t is 0 or inf in f32 either way
_INF = Imm("0f7F800000")
_TWO_24 = _k("0x1p+24")


def _op(fb: FunctionBuilder, ptype: str, opcode: str, *srcs: Operand) -> Reg:
    dst = fb.reg(ptype)
    fb.ins(opcode, dst, *srcs)
    return dst


def _f(fb: FunctionBuilder, opcode: str, *srcs: Operand) -> Reg:
    return _op(fb, "f32", opcode, *srcs)


def _b(fb: FunctionBuilder, opcode: str, *srcs: Operand) -> Reg:
    return _op(fb, "b32", opcode, *srcs)


def _p(fb: FunctionBuilder, opcode: str, *srcs: Operand) -> Reg:
    return _op(fb, "pred", opcode, *srcs)


def _clamp(fb: FunctionBuilder, x: Reg, lo: Imm | None, hi: Imm | None) -> Reg:
    """min(max(x, lo), hi); the `.NaN` forms (sm_80, PTX 7.0) keep NaN a NaN."""
    if lo is not None:
        x = _f(fb, "max.NaN.f32", x, lo)
    if hi is not None:
        x = _f(fb, "min.NaN.f32", x, hi)
    return x


def _rint(fb: FunctionBuilder, t: Reg) -> tuple[Reg, Reg]:
    """(j, s): j = rint(t), half to even, for |t| < 2^22; s = t + 1.5*2^23 = bits 0x4B400000 + j."""
    s = _f(fb, "add.rn.f32", t, _ROUND_MAGIC)
    return _f(fb, "sub.rn.f32", s, _ROUND_MAGIC), s


def _times_pow2(fb: FunctionBuilder, e: Reg, s: Reg) -> Reg:
    """e * 2^j where bits(s) = 0x4B400000 + j, j in [-151, 129] (any f32 result's range).

    2^j1 (j1 = j>>1) and 2^j2 (j2 = j - j1) are both normal, so e*2^j1 is exact and the
    second product rounds once, into the subnormal range or to inf where the result does.
    The 0x4B400000 part vanishes from both exponent fields: shifted left 23 (or 22, after
    the >>1) it is a multiple of 2^32.
    """
    sb = _b(fb, "mov.b32", s)
    half = _b(fb, "shr.u32", sb, int_imm(1))
    s1 = _b(fb, "mad.lo.u32", half, int_imm(1 << 23), int_imm(0x3F800000))
    s2 = _b(fb, "mad.lo.u32", sb, int_imm(1 << 23), int_imm(0x7F000000))
    s2 = _b(fb, "sub.u32", s2, s1)
    y = _f(fb, "mul.rn.f32", e, _f(fb, "mov.b32", s1))
    return _f(fb, "mul.rn.f32", y, _f(fb, "mov.b32", s2))


def _poly_one_plus(fb: FunctionBuilder, r: Reg, q: tuple[Imm, ...]) -> Reg:
    """1 + r*(q0 + q1*r + ...) by Horner with fma."""
    acc = _f(fb, "fma.rn.f32", r, q[-1], q[-2])
    for c in reversed(q[:-2]):
        acc = _f(fb, "fma.rn.f32", acc, r, c)
    return _f(fb, "fma.rn.f32", acc, r, _ONE)


def _exp_precise(fb: FunctionBuilder, x: Reg, *, negate: bool = False) -> Reg:
    """exp(x), or exp(-x) when `negate` (for x >= 0 or NaN).

    Cody-Waite: j = rint(x*log2e), r = x - j*ln2 in two fma steps. j*ln2_hi is exact inside
    the fma and x - j*ln2_hi is exact (both are multiples of 2^-24 near each other), so r
    carries only the ln2_lo rounding (< 2^-24 |r|). exp(r) by polynomial (< 1 ulp), then the
    exact scaling by 2^j: the result is within ~1 ulp, subnormal and overflow cases included.
    """
    if negate:
        xc = _clamp(fb, x, None, _EXP_NEG_X_MAX)
        j, s = _rint(fb, _f(fb, "mul.rn.f32", xc, _NEG_LOG2E))
        # xc + j*ln2 is minus the reduced argument.
        r = _f(fb, "fma.rn.f32", j, _LN2, xc)
        r = _f(fb, "neg.f32", _f(fb, "fma.rn.f32", j, _LN2_LO, r))
    else:
        xc = _clamp(fb, x, _EXP_X_MIN, _EXP_X_MAX)
        j, s = _rint(fb, _f(fb, "mul.rn.f32", xc, _LOG2E))
        r = _f(fb, "fma.rn.f32", j, _NEG_LN2, xc)
        r = _f(fb, "fma.rn.f32", j, _NEG_LN2_LO, r)
    return _times_pow2(fb, _poly_one_plus(fb, r, _EXP_Q), s)


def _exp_ex2(fb: FunctionBuilder, x: Reg) -> Reg:
    """exp(x) = 2^j * ex2.approx(f), f = x*log2e - j in two fma steps (log2e as hi + lo).

    j is rint(x*log2e) clamped to [-126, 127], so 2^j is normal and |f| <= 0.5 + 2^-16 except
    where the result overflows (f > 1: inf from ex2 or the product) or is below 2^-126 (f down
    to -25, where an ulp of the result is 2^-149 and f's rounding is far below it). The
    product rounds once, to the subnormal or overflowed result where there is one. -inf gives
    f = -inf and 0; NaN gives NaN. Error: f's two roundings (< 2^-24, under 0.7 ulp of the
    result), the final rounding (0.5 ulp) and ex2.approx's own (PTX ISA: 2^-22.5 relative, up
    to 2.9 ulp; the simulator's is correctly rounded). 8 SASS instructions.
    """
    u = _f(fb, "fma.rn.sat.f32", x, _EXP_U_SCALE, _EXP_U_BIAS)
    s = _f(fb, "fma.rn.f32", u, _EXP_U_RANGE, _EXP_S_BIAS)
    neg_j = _f(fb, "sub.rn.f32", _EXP_S_ZERO, s)
    f = _f(fb, "fma.rn.f32", x, _LOG2E, neg_j)
    f = _f(fb, "fma.rn.f32", x, _LOG2E_LO, f)
    scale = _b(fb, "shl.b32", _b(fb, "mov.b32", s), int_imm(23))
    e = _f(fb, "ex2.approx.ftz.f32", f)
    return _f(fb, "mul.rn.f32", e, _f(fb, "mov.b32", scale))


def emit_exp(fb: FunctionBuilder, x: Reg, *, fast: bool) -> Reg:
    """e^x. Fast: ex2.approx(x*log2e), as CUDA's __expf (2 + 1.2|x| ulp: x*log2e rounds).
    Precise: `_exp_ex2`, measured on the simulator over ~1M inputs (tests/test_emit_math.py):
    within 1 ulp with a correctly rounded ex2, 3 with ex2's result moved by up to 2 ulp (the
    hardware's error)."""
    if fast:
        return _f(fb, "ex2.approx.ftz.f32", _f(fb, "mul.ftz.f32", x, _LOG2E))
    return _exp_ex2(fb, x)


def emit_exp2(fb: FunctionBuilder, x: Reg, *, fast: bool) -> Reg:
    """2^x. Precise: x = j + f with |f| <= 1/2 (exact), 2^f by polynomial, times 2^j."""
    if fast:
        return _f(fb, "ex2.approx.ftz.f32", x)
    xc = _clamp(fb, x, _EXP2_X_MIN, _EXP2_X_MAX)
    j, s = _rint(fb, xc)
    # Exact: xc and j agree in every bit above 2^-1. Integer x gives f = 0 and an exact power
    # of two.
    f = _f(fb, "sub.rn.f32", xc, j)
    return _times_pow2(fb, _poly_one_plus(fb, f, _EXP2_Q), s)


def _log_reduce(fb: FunctionBuilder, x: Reg) -> tuple[Reg, Reg]:
    """(k, f) as f32, both exact, for x = 2^k * (1+f), 1+f in [sqrt(1/2), sqrt(2)), x > 0."""
    # Subnormal inputs are scaled by 2^23 first so the exponent field holds all of k.
    sub = _p(fb, "setp.lt.f32", x, _MIN_NORMAL)
    xm = _f(fb, "selp.f32", _f(fb, "mul.rn.f32", x, _TWO_23), x, sub)
    # Adding 1.0 - sqrt(1/2) (as bits) carries into the exponent exactly when the mantissa
    # is >= sqrt(2)'s, so m = 1+f lands in [sqrt(1/2), sqrt(2)) and |f| <= 0.415.
    ix = _b(fb, "add.s32", _b(fb, "mov.b32", xm), int_imm(0x3F800000 - 0x3F3504F3))
    k = _b(fb, "shr.s32", ix, int_imm(23))
    k = _b(fb, "add.s32", k, _b(fb, "selp.s32", int_imm(-150), int_imm(-127), sub))
    dk = _f(fb, "cvt.rn.f32.s32", k)
    mb = _b(fb, "add.s32", _b(fb, "and.b32", ix, int_imm(0x007FFFFF)), int_imm(0x3F3504F3))
    f = _f(fb, "sub.rn.f32", _f(fb, "mov.b32", mb), _ONE)  # exact
    return dk, f


def _log_core(fb: FunctionBuilder, x: Reg) -> tuple[Reg, Reg, Reg, Reg]:
    """(k, f, f^2/2, s*(f^2/2 + R)) for x = 2^k * (1+f), 1+f in [sqrt(1/2), sqrt(2))."""
    dk, f = _log_reduce(fb, x)
    # s only scales the small correction s*(hfsq + R) (< |f|^3/3), so div.approx's 2 ulp
    # move the result by < 0.1 ulp; f is never subnormal (a multiple of 2^-24) and 2+f in
    # [1.58, 2.42], so .ftz is exact here.
    s = _f(fb, "div.approx.ftz.f32", f, _f(fb, "add.rn.f32", f, _TWO))
    z = _f(fb, "mul.rn.f32", s, s)
    w = _f(fb, "mul.rn.f32", z, z)
    odd = _f(fb, "fma.rn.f32", w, _LG3, _LG1)
    even = _f(fb, "mul.rn.f32", _f(fb, "fma.rn.f32", w, _LG4, _LG2), w)
    r = _f(fb, "fma.rn.f32", odd, z, even)
    hfsq = _f(fb, "mul.rn.f32", _f(fb, "mul.rn.f32", f, _HALF), f)
    v = _f(fb, "mul.rn.f32", _f(fb, "add.rn.f32", hfsq, r), s)
    return dk, f, hfsq, v


def _log_specials(fb: FunctionBuilder, x: Reg, y: Reg) -> Reg:
    """IEEE results outside (0, inf): +inf and NaN pass through, +-0 -> -inf, x < 0 -> NaN."""
    big = _p(fb, "setp.gtu.f32", x, _FLT_MAX)  # +inf or NaN
    y = _f(fb, "selp.f32", x, y, big)
    zero = _p(fb, "setp.eq.f32", x, _ZERO)
    y = _f(fb, "selp.f32", _NEG_INF, y, zero)
    neg = _p(fb, "setp.lt.f32", x, _ZERO)
    return _f(fb, "selp.f32", _NAN, y, neg)


def emit_log(fb: FunctionBuilder, x: Reg, *, fast: bool) -> Reg:
    """ln x. Fast: lg2.approx(x)*ln2, as CUDA's __logf (~2^-21.4 absolute error near 1)."""
    if fast:
        return _f(fb, "mul.ftz.f32", _f(fb, "lg2.approx.ftz.f32", x), _LN2)
    dk, f, hfsq, v = _log_core(fb, x)
    # musl's order: ((s*(hfsq+R) + k*ln2_lo) - hfsq) + f + k*ln2_hi; the small terms first.
    y = _f(fb, "fma.rn.f32", dk, _LN2_LO, v)
    y = _f(fb, "add.rn.f32", _f(fb, "sub.rn.f32", y, hfsq), f)
    y = _f(fb, "fma.rn.f32", dk, _LN2, y)
    return _log_specials(fb, x, y)


def emit_log2(fb: FunctionBuilder, x: Reg, *, fast: bool) -> Reg:
    """log2 x. Precise: log(1+f) as hi + lo, times log2e in extra precision, plus k.

    For x = 2^k, f = 0 and every term is 0, so the result is exactly k.
    """
    if fast:
        return _f(fb, "lg2.approx.ftz.f32", x)
    dk, f, hfsq, v = _log_core(fb, x)
    hi = _f(fb, "sub.rn.f32", f, hfsq)
    # (f - hi) is exact (Sterbenz: hi is within 21% of f) and (f - hi) - hfsq is hi's rounding
    # error, exactly; so hi + lo = log(1+f) to the kernel's accuracy.
    lo = _f(fb, "sub.rn.f32", _f(fb, "sub.rn.f32", f, hi), hfsq)
    lo = _f(fb, "add.rn.f32", lo, v)
    p = _f(fb, "mul.rn.f32", hi, _LOG2E)
    perr = _f(fb, "fma.rn.f32", hi, _LOG2E, _f(fb, "neg.f32", p))  # p + perr = hi*_LOG2E
    c = _f(fb, "fma.rn.f32", lo, _LOG2E, perr)
    c = _f(fb, "fma.rn.f32", hi, _LOG2E_LO, c)
    y = _f(fb, "add.rn.f32", _f(fb, "add.rn.f32", dk, p), c)
    return _log_specials(fb, x, y)


def emit_tanh(fb: FunctionBuilder, x: Reg, *, fast: bool) -> Reg:
    """tanh x. Fast: tanh.approx.f32 (sm_75+, relative error ~2^-11).

    Precise: |x| < 0.625 uses the odd minimax polynomial (keeps +-0 and tiny x exact);
    otherwise 1 - 2/(e^(2|x|) + 1) with x's sign. There tanh >= 0.55, so the subtraction
    cancels at most one bit, and the relative error of e^(2|x|) (ex2.approx, 2 ulp, plus the
    rounding of 2|x|*log2e) reaches the result scaled by 2q(1-q) <= 0.35 (q = 1/(e+1)).
    Every |x| > 9.01 gives exactly +-1.
    """
    if fast:
        return _f(fb, "tanh.approx.f32", x)
    a = _f(fb, "abs.f32", x)
    z = _f(fb, "mul.rn.f32", x, x)
    poly = _f(fb, "fma.rn.f32", z, _TANH_P[4], _TANH_P[3])
    for c in reversed(_TANH_P[:3]):
        poly = _f(fb, "fma.rn.f32", poly, z, c)
    small = _f(fb, "fma.rn.f32", _f(fb, "mul.rn.f32", poly, z), x, x)
    # Beyond 9.5, tanh rounds to +-1; the clamp keeps e and d finite for the Newton step.
    ac = _f(fb, "min.f32", a, _TANH_CLAMP)
    e = _f(fb, "ex2.approx.ftz.f32", _f(fb, "mul.rn.f32", ac, _TWO_LOG2E))
    d = _f(fb, "add.rn.f32", e, _ONE)
    # q = 1/d: rcp.approx, then one Newton step so that q's error is its rounding alone.
    q = _f(fb, "rcp.approx.ftz.f32", d)
    q = _f(fb, "fma.rn.f32", _f(fb, "fma.rn.f32", _f(fb, "neg.f32", d), q, _ONE), q, q)
    large = _f(fb, "fma.rn.f32", q, _MINUS_TWO, _ONE)
    # NaN fails the compare and takes the polynomial, which propagates it.
    use_large = _p(fb, "setp.ge.f32", a, _TANH_SMALL)
    # x's sign for both paths: large is |tanh|, and for x = -0 the polynomial's
    # fma(x, z*P, x) gives (-0)*(-0) + (-0) = +0.
    return _f(fb, "copysign.f32", x, _f(fb, "selp.f32", large, small, use_large))


def emit_sigmoid(fb: FunctionBuilder, x: Reg, *, fast: bool) -> Reg:
    """1/(1 + e^-x). Fast: rcp.approx(1 + ex2.approx(-x*log2e)) (0 below x ~ -87).

    Precise: with e = exp(-|x|) in (0, 1], sigmoid = 1/(1+e) for x >= 0 and e/(1+e) for
    x < 0; the second form keeps tiny and subnormal results (x < -87) that 1/(1+e^-x) would
    lose to overflow. The quotient is num/d with d in [1, 2]: rcp.approx plus one Newton
    step (exact residual by fma) is within 0.5 ulp + 2^-40 relative of the correctly
    rounded quotient, so no div.rn (and no slow path) is needed.
    """
    if fast:
        e = _f(fb, "ex2.approx.ftz.f32", _f(fb, "mul.ftz.f32", x, _NEG_LOG2E))
        return _f(fb, "rcp.approx.ftz.f32", _f(fb, "add.ftz.f32", e, _ONE))
    e = _exp_precise(fb, _f(fb, "abs.f32", x), negate=True)
    d = _f(fb, "add.rn.f32", e, _ONE)
    neg = _p(fb, "setp.lt.f32", x, _ZERO)
    num = _f(fb, "selp.f32", e, _ONE, neg)
    inv = _f(fb, "rcp.approx.ftz.f32", d)
    q = _f(fb, "mul.rn.f32", num, inv)
    res = _f(fb, "fma.rn.f32", _f(fb, "neg.f32", d), q, num)
    return _f(fb, "fma.rn.f32", res, inv, q)


def emit_sqrt(fb: FunctionBuilder, x: Reg, *, fast: bool) -> Reg:
    """sqrt x. Precise: sqrt.rn (correctly rounded). Fast: sqrt.approx.ftz (rel. error ~2^-23)."""
    return _f(fb, "sqrt.approx.ftz.f32" if fast else "sqrt.rn.f32", x)


def emit_rsqrt(fb: FunctionBuilder, x: Reg, *, fast: bool) -> Reg:
    """1/sqrt x. Fast: rsqrt.approx.ftz (relative error ~2^-22.9).

    Precise: one Newton step on rsqrt.approx: y1 = y0 + y0/2 * (1 - (x*y0)*y0). The step
    squares the approximation error (~2^-45 left), so y1 is within ~1 ulp: the rounding of
    h = x*y0 (0.5 ulp, halved by the step) plus the final rounding. That is as good as
    sqrt.rn followed by div.rn (two roundings, <= 1 ulp) at a fraction of the cost and with
    no slow path. Forming x*y0 before multiplying by y0 again keeps subnormal x from
    overflowing y0^2. Where y0 is 0, inf or NaN (x = +inf, +-0, x < 0, NaN) the step gives
    NaN and y0 itself (+0, +-inf, NaN: the IEEE values) is kept.

    Subnormal x is scaled by 2^24 first (result by 2^12, both exact): readings of the PTX ISA
    differ on whether `rsqrt.approx.f32` flushes a subnormal input, and this is right either way.
    """
    if fast:
        return _f(fb, "rsqrt.approx.ftz.f32", x)
    tiny = _p(fb, "setp.lt.f32", _f(fb, "abs.f32", x), _k("0x1p-126"))
    xs = _f(fb, "selp.f32", _f(fb, "mul.rn.f32", x, _k("0x1p+24")), x, tiny)
    y0 = _f(fb, "rsqrt.approx.f32", xs)
    h = _f(fb, "mul.rn.f32", xs, y0)
    err = _f(fb, "fma.rn.f32", _f(fb, "neg.f32", h), y0, _ONE)
    y1 = _f(fb, "fma.rn.f32", _f(fb, "mul.rn.f32", y0, _HALF), err, y0)
    bad = _p(fb, "setp.nan.f32", err, err)
    y = _f(fb, "selp.f32", y0, y1, bad)
    return _f(fb, "selp.f32", _f(fb, "mul.rn.f32", y, _k("0x1p+12")), y, tiny)


def emit_div(fb: FunctionBuilder, a: Reg, b: Reg, *, fast: bool) -> Reg:
    """a / b. Precise: div.rn (IEEE, correctly rounded).

    Fast: div.approx.ftz: max 2 ulp for |b| in [2^-126, 2^126]; for larger |b| the result
    is flushed to 0 (and subnormal inputs/results to 0), so a/a is not always 1.
    """
    return _f(fb, "div.approx.ftz.f32" if fast else "div.rn.f32", a, b)


def emit_recip_fast(fb: FunctionBuilder, b: Reg) -> Reg:
    """1 / b under fast_math: rcp.approx.ftz (max 1 ulp, PTX ISA), one MUFU.RCP. The same
    value as div.approx.ftz(1, b), whose expansion by ptxas adds a flushing FADD."""
    return _f(fb, "rcp.approx.ftz.f32", b)


def _exponent(fb: FunctionBuilder, v: Reg) -> Reg:
    """floor(log2 v) as s32 for positive finite v, subnormals included (scaled by 2^24 first
    so that the exponent field holds it)."""
    tiny = _p(fb, "setp.lt.f32", v, _MIN_NORMAL)
    vs = _f(fb, "selp.f32", _f(fb, "mul.rn.f32", v, _TWO_24), v, tiny)
    e = _b(fb, "shr.u32", _b(fb, "mov.b32", vs), int_imm(23))
    return _b(fb, "sub.s32", e, _b(fb, "selp.s32", int_imm(127 + 24), int_imm(127), tiny))


def _fmod(fb: FunctionBuilder, a: Reg, b: Reg) -> Reg:
    """C's fmodf(a, b), exactly: a - trunc(a/b)*b with a's sign; NaN for b = 0, infinite a
    or a NaN; a itself for infinite b.

    The remainder is always representable, so it is found exactly: while r = |a| >= |b|,
    r is reduced modulo ys = |b|*2^k, k chosen so that q = r/ys < 2^24: then div.rn's q
    truncated is floor(r/ys) or one more, r - q*ys is exact in one fma (a multiple of
    ulp(ys) below ys in magnitude), and one add of ys fixes the one-more case. Each step
    takes 23 bits off the exponent gap, so at most 13 steps (one for |a/b| < 2^24).
    Infinite a or zero b make q infinite or NaN and r NaN, which ends the loop.
    """
    x, y = _f(fb, "abs.f32", a), _f(fb, "abs.f32", b)
    ey = _exponent(fb, y)
    r = _f(fb, "mov.f32", x)
    top, done = fb.new_label("fmod"), fb.new_label("fmod_done")
    fb.place(top)
    small = _p(fb, "setp.ltu.f32", r, y)  # r < |b|, or r NaN
    fb.ins("bra", done, pred=small)
    k = _b(fb, "sub.s32", _exponent(fb, r), ey)
    k = _b(fb, "max.s32", _b(fb, "sub.s32", k, int_imm(23)), int_imm(0))
    # ys = y * 2^k in two exact steps (k may exceed 127): 2^k1 and 2^k2 are normal f32.
    k1 = _b(fb, "shr.u32", k, int_imm(1))
    k2 = _b(fb, "sub.s32", k, k1)
    s1 = _b(fb, "mad.lo.u32", k1, int_imm(1 << 23), int_imm(0x3F800000))
    s2 = _b(fb, "mad.lo.u32", k2, int_imm(1 << 23), int_imm(0x3F800000))
    ys = _f(fb, "mul.rn.f32", y, _f(fb, "mov.b32", s1))
    ys = _f(fb, "mul.rn.f32", ys, _f(fb, "mov.b32", s2))
    q = _f(fb, "cvt.rzi.f32.f32", _f(fb, "div.rn.f32", r, ys))
    fb.ins("fma.rn.f32", r, _f(fb, "neg.f32", q), ys, r)
    under = _p(fb, "setp.lt.f32", r, _ZERO)
    fb.ins("add.rn.f32", r, r, ys, pred=under)
    fb.ins("bra.uni", top)
    fb.place(done)
    res = _f(fb, "copysign.f32", a, r)
    return _f(fb, "selp.f32", _NAN, res, _p(fb, "setp.nan.f32", a, b))


def _signed_zero(fb: FunctionBuilder, v: Reg) -> Reg:
    """0 with the sign bit of v."""
    return _f(fb, "mov.b32", _b(fb, "and.b32", _b(fb, "mov.b32", v), int_imm(0x80000000)))


def _divmod(fb: FunctionBuilder, a: Reg, b: Reg) -> tuple[Reg, Reg]:
    """(a // b, a % b) with NumPy's float semantics, step for step as its `npy_divmodf`:
    mod = fmod(a, b) (exact), moved to b's sign by adding b; a zero remainder takes b's
    sign; div = (a - mod) / b, snapped to the nearest integer when within 1/2 of floor(div);
    a zero quotient takes the sign of a/b; a zero divisor gives a/b (±inf or NaN) and NaN."""
    mod = _fmod(fb, a, b)
    div = _f(fb, "div.rn.f32", _f(fb, "sub.rn.f32", a, mod), b)
    nonzero = _p(fb, "setp.neu.f32", mod, _ZERO)  # NaN counts as nonzero, as in C
    signs = _p(fb, "xor.pred", _p(fb, "setp.lt.f32", b, _ZERO), _p(fb, "setp.lt.f32", mod, _ZERO))
    adjust = _p(fb, "and.pred", nonzero, signs)
    mod = _f(fb, "selp.f32", _f(fb, "add.rn.f32", mod, b), mod, adjust)
    div = _f(fb, "selp.f32", _f(fb, "sub.rn.f32", div, _ONE), div, adjust)
    mod = _f(fb, "selp.f32", mod, _signed_zero(fb, b), nonzero)
    floor = _f(fb, "cvt.rmi.f32.f32", div)
    up = _p(fb, "setp.gt.f32", _f(fb, "sub.rn.f32", div, floor), _HALF)
    floor = _f(fb, "selp.f32", _f(fb, "add.rn.f32", floor, _ONE), floor, up)
    quotient = _f(fb, "div.rn.f32", a, b)
    floordiv = _f(
        fb, "selp.f32", floor, _signed_zero(fb, quotient), _p(fb, "setp.neu.f32", div, _ZERO)
    )
    floordiv = _f(fb, "selp.f32", quotient, floordiv, _p(fb, "setp.eq.f32", b, _ZERO))
    return floordiv, mod


def emit_floordiv(fb: FunctionBuilder, a: Reg, b: Reg, *, fast: bool) -> Reg:
    """a // b as NumPy's float floor_divide (`_divmod`); fast math changes nothing."""
    return _divmod(fb, a, b)[0]


def emit_mod(fb: FunctionBuilder, a: Reg, b: Reg, *, fast: bool) -> Reg:
    """a % b as NumPy's float remainder: the sign of b (`_divmod`); exact but for the final
    addition of b where the signs differ, which rounds as NumPy's does."""
    return _divmod(fb, a, b)[1]


def _dop(fb: FunctionBuilder, opcode: str, *srcs: Operand) -> Reg:
    return _op(fb, "f64", opcode, *srcs)


def _horner_d(fb: FunctionBuilder, z: Reg, coeffs: tuple[Imm, ...]) -> Reg:
    """c0 + c1*z + c2*z^2 + ... in f64 by Horner with fma."""
    acc = _dop(fb, "fma.rn.f64", z, coeffs[-1], coeffs[-2])
    for c in reversed(coeffs[:-2]):
        acc = _dop(fb, "fma.rn.f64", acc, z, c)
    return acc


def _pow_magnitude(fb: FunctionBuilder, ax: Reg, y: Reg) -> Reg:
    """|x|^y for finite nonzero |x| = ax: 2^(y log2 ax), log2 and 2^t in f64.

    log2 ax = k + ln(m) log2(e) to 2^-50 relative, t = y log2 ax (|t| <= 200 after the
    clamp) to within 2^-42 absolute, 2^t = 2^j e^(r ln2) with r = t - j exact, e^u to
    2^-47: the f64 value is within 2^-41 relative of |x|^y, so its one rounding to f32
    (cvt.rn, subnormal and overflow included) is within 0.5 ulp + 2^-17 ulp of the correctly
    rounded result. Exact powers (2^n, 9 = 3^2, ...) come out exact.
    """
    dk, f = _log_reduce(fb, ax)
    fd = _dop(fb, "cvt.f64.f32", f)
    s = _dop(fb, "div.rn.f64", fd, _dop(fb, "add.rn.f64", fd, _d(2.0)))
    ln_m = _dop(
        fb,
        "mul.rn.f64",
        _dop(fb, "add.rn.f64", s, s),
        _horner_d(fb, _dop(fb, "mul.rn.f64", s, s), _ATANH_D),
    )
    log2x = _dop(fb, "fma.rn.f64", ln_m, _LOG2E_D, _dop(fb, "cvt.f64.f32", dk))
    t = _dop(fb, "mul.rn.f64", _dop(fb, "cvt.f64.f32", y), log2x)
    t = _dop(fb, "max.f64", t, _d(-_POW_T_LIMIT))  # NaN is handled by the caller
    t = _dop(fb, "min.f64", t, _d(_POW_T_LIMIT))
    j = _dop(fb, "cvt.rni.f64.f64", t)
    u = _dop(fb, "mul.rn.f64", _dop(fb, "sub.rn.f64", t, j), _LN2_D)
    e = _horner_d(fb, u, _EXP_D)
    # 2^j from its bits: j + 1023 in the f64 exponent field.
    ji = _b(fb, "cvt.rni.s32.f64", j)
    bits = _op(fb, "b64", "cvt.s64.s32", _b(fb, "add.s32", ji, int_imm(1023)))
    scale = _dop(fb, "mov.b64", _op(fb, "b64", "shl.b64", bits, int_imm(52)))
    return _f(fb, "cvt.rn.f32.f64", _dop(fb, "mul.rn.f64", e, scale))


def emit_pow(fb: FunctionBuilder, x: Reg, y: Reg, *, fast: bool) -> Reg:
    """x ** y with C's powf special cases (see `ct.pow`).

    Precise: `_pow_magnitude` (within 0.5 ulp + 2^-17 ulp). Fast: ex2.approx(y *
    lg2.approx(|x|)), as CUDA's __powf. Then, in order: |x| = 0 or inf give 0 or inf by y's
    sign; a negative x (sign bit: -0 and -inf too) with an odd integer y negates; a finite
    x < 0 with a non-integer y, or a NaN, gives NaN; y = ±0, x = 1, and x = -1 with y = ±inf
    give 1.
    """
    ax = _f(fb, "abs.f32", x)
    if fast:
        lg = _f(fb, "lg2.approx.ftz.f32", ax)
        mag = _f(fb, "ex2.approx.ftz.f32", _f(fb, "mul.ftz.f32", y, lg))
    else:
        mag = _pow_magnitude(fb, ax, y)
    yneg = _p(fb, "setp.lt.f32", y, _ZERO)
    inf_or_zero = _f(fb, "selp.f32", _INF, _ZERO, yneg)
    zero_or_inf = _f(fb, "selp.f32", _ZERO, _INF, yneg)
    mag = _f(fb, "selp.f32", inf_or_zero, mag, _p(fb, "setp.eq.f32", ax, _ZERO))
    x_inf = _p(fb, "setp.eq.f32", ax, _INF)
    mag = _f(fb, "selp.f32", zero_or_inf, mag, x_inf)
    ty = _f(fb, "cvt.rzi.f32.f32", y)
    y_int = _p(fb, "setp.eq.f32", ty, y)  # infinities are (even) integers
    # Beyond 2^24 every f32 is even; below, the low bit of the integer decides.
    odd = _p(fb, "setp.lt.f32", _f(fb, "abs.f32", y), _TWO_24)
    low = _b(fb, "and.b32", _b(fb, "cvt.rzi.s32.f32", y), int_imm(1))
    odd = _p(fb, "and.pred", odd, _p(fb, "setp.ne.s32", low, int_imm(0)))
    x_sign = _p(fb, "setp.lt.s32", _b(fb, "mov.b32", x), int_imm(0))
    negate = _p(fb, "and.pred", _p(fb, "and.pred", odd, y_int), x_sign)
    res = _f(fb, "selp.f32", _f(fb, "neg.f32", mag), mag, negate)
    x_neg_finite = _p(fb, "and.pred", _p(fb, "setp.lt.f32", x, _ZERO), _p(fb, "not.pred", x_inf))
    bad = _p(fb, "and.pred", x_neg_finite, _p(fb, "setp.neu.f32", ty, y))
    bad = _p(fb, "or.pred", bad, _p(fb, "setp.nan.f32", x, y))
    res = _f(fb, "selp.f32", _NAN, res, bad)
    one = _p(fb, "setp.eq.f32", y, _ZERO)
    one = _p(fb, "or.pred", one, _p(fb, "setp.eq.f32", x, _ONE))
    minus_one = _p(fb, "setp.eq.f32", x, _k("-0x1p+0"))
    y_inf = _p(fb, "setp.eq.f32", _f(fb, "abs.f32", y), _INF)
    one = _p(fb, "or.pred", one, _p(fb, "and.pred", minus_one, y_inf))
    return _f(fb, "selp.f32", _ONE, res, one)


# -- sin, cos ------------------------------------------------------------------------------------
# Coefficients by `python -m cutile_py.tools.fit_math` (weighted minimax in float64, rounded to
# f32 one at a time with the rest refitted), on |r| <= 0.8 (pi/4 plus the slack of the f32
# quadrant choice): sin r = r + r^3 S(r^2) within 2^-32.5 relative, cos r = 1 + r^2 K(r^2)
# within 2^-32.6 relative, so the f32 evaluation error dominates.
_SIN_S = tuple(
    _k(h) for h in ("-0x1.555556p-3", "0x1.11117p-7", "-0x1.a05408p-13", "0x1.7a9198p-19")
)
_COS_K = tuple(_k(h) for h in ("-0x1p-1", "0x1.555548p-5", "-0x1.6c0af4p-10", "0x1.999116p-16"))
_TWO_OVER_PI = _k("0x1.45f306p-1")
# pi/2 = _PIO2_1 + _PIO2_2 + _PIO2_3 + 2^-71.4, each part the f32 below what is left
# (`fit_math.pio2_parts`): all positive, so that every step r - j*_PIO2_k adds a negative
# product, and a zero r keeps its sign (-0 + -0 = -0; +0 + -0 = +0).
_NEG_PIO2_1 = _k("-0x1.921fb4p+0")
_NEG_PIO2_2 = _k("-0x1.4442d0p-24")
_NEG_PIO2_3 = _k("-0x1.846988p-48")
# Above it, the Cody-Waite reduction loses accuracy (as CUDA's sinf; j*_PIO2_1 would need more
# than the 41 bits that keep x - j*_PIO2_1 exact).
_TRIG_LARGE = _k("0x1.9c8fp+16")  # 105615
#: floor(2/pi * 2^224) in 32-bit words, least significant first (`fit_math.two_over_pi_words`),
#: and a zero word above.
_TWO_OVER_PI_WORDS = (
    0xFE5163AB,
    0x3C439041,
    0xDB629599,
    0xF534DDC0,
    0xFC2757D1,
    0x4E441529,
    0xA2F9836E,
    0,
)
_PIO2_2M62_D = _d(math.pi / 2 * 2.0**-62)


def _trig_reduce_large(fb: FunctionBuilder, x: Reg, r: Reg, q: Reg) -> None:
    """Set r (f32) and q (b32, low 2 bits) to x = (4k + q) pi/2 + r, |r| <= pi/4, for any
    finite x, by an integer Payne-Hanek reduction.

    x = m 2^e (m < 2^24 an integer, e = E - 150 from the exponent field E). In x 2/pi only the
    bits of 2/pi from weight 2^(1-e) downwards matter below 4, so a 96-bit window W of
    G = floor(2/pi 2^224), taken from bit 280 - E up, gives x 2/pi mod 4 = m W 2^-94 mod 4 to
    within 2^-70. The top 64 bits F of m W mod 2^96 (units 2^-62) hold the quadrant and the
    fraction; d = F mod 2^62 read as a signed 62-bit number is the fraction minus the nearest
    integer, and r = d pi/2 2^-62 in f64 is rounded once to f32. Every f32 x >= 2^16 has
    |d| >= 2^32.1 (an exhaustive search; x = 7.729179e28 comes closest to a multiple of pi/2,
    r = 2^-29.2), so the ~2^-62 truncation leaves r within 2^-32 relative before its rounding.
    """
    bits = _b(fb, "mov.b32", x)
    e_field = _b(fb, "bfe.u32", bits, int_imm(23), int_imm(8))
    m = _b(fb, "or.b32", _b(fb, "and.b32", bits, int_imm(0x7FFFFF)), int_imm(0x800000))
    sh = _b(fb, "sub.s32", int_imm(280), e_field)  # 26..137 for 2^16 <= |x| < 2^128
    wi = _b(fb, "shr.u32", sh, int_imm(5))
    bit = _b(fb, "and.b32", sh, int_imm(31))
    # Words wi..wi+3 of G (wi <= 4), picked by selects: a register has no indexed form.
    at = [_p(fb, "setp.eq.u32", wi, int_imm(t)) for t in range(1, 5)]
    v = []
    for k in range(4):
        word = _b(fb, "mov.b32", int_imm(_TWO_OVER_PI_WORDS[k]))
        for t in range(1, 5):
            word = _b(fb, "selp.b32", int_imm(_TWO_OVER_PI_WORDS[t + k]), word, at[t - 1])
        v.append(word)
    w = [_b(fb, "shf.r.clamp.b32", v[k], v[k + 1], bit) for k in range(3)]
    # m W mod 2^96, word by word: the low word only feeds its carry.
    p0 = _op(fb, "b64", "mul.wide.u32", m, w[0])
    p1 = _op(fb, "b64", "mad.wide.u32", m, w[1], _op(fb, "b64", "shr.u64", p0, int_imm(32)))
    lo1, hi1 = fb.reg("b32"), fb.reg("b32")
    fb.ins("mov.b64", Vec((lo1, hi1)), p1)
    top = _b(fb, "mad.lo.u32", m, w[2], hi1)
    f = _op(fb, "b64", "mov.b64", Vec((lo1, top)))
    quadrant = _op(
        fb, "b64", "shr.u64", _op(fb, "b64", "add.u64", f, Imm("0x2000000000000000")), int_imm(62)
    )
    d = _op(fb, "b64", "shr.s64", _op(fb, "b64", "shl.b64", f, int_imm(2)), int_imm(2))
    rd = _dop(fb, "mul.rn.f64", _dop(fb, "cvt.rn.f64.s64", d), _PIO2_2M62_D)
    rf = _f(fb, "cvt.rn.f32.f64", rd)
    qi = _b(fb, "cvt.u32.u64", quadrant)
    # sin/cos(-x): r and the quadrant change sign.
    neg = _p(fb, "setp.lt.s32", bits, int_imm(0))
    fb.ins("selp.f32", r, _f(fb, "neg.f32", rf), rf, neg)
    fb.ins("selp.b32", q, _b(fb, "neg.s32", qi), qi, neg)


def _sin_cos(fb: FunctionBuilder, x: Reg, quarter_turns: int) -> Reg:
    """sin(x + quarter_turns pi/2) (0: sin, 1: cos); see `emit_sin`."""
    # j = rint(x 2/pi) by the round magic; q = bits(s) = 0x4B400000 + j has j mod 4 in its
    # low bits.
    j, s = _rint(fb, _f(fb, "mul.rn.f32", x, _TWO_OVER_PI))
    q = _b(fb, "mov.b32", s)
    # Exact: x and j*_PIO2_1 are multiples of 2^-24 (or j = 0) less than 0.81 apart. x = -0
    # gives j = +0 (from the magic), so r = +0*(-c) + -0 = -0 at each step.
    r = _f(fb, "fma.rn.f32", j, _NEG_PIO2_1, x)
    fb.ins("fma.rn.f32", r, j, _NEG_PIO2_2, r)
    fb.ins("fma.rn.f32", r, j, _NEG_PIO2_3, r)
    a = _f(fb, "abs.f32", x)
    large = _p(fb, "setp.gt.f32", a, _TRIG_LARGE)
    # Infinities stay on this path: j*_PIO2_1 = inf, and inf - inf is the NaN sin(inf) is.
    large = _p(fb, "and.pred", large, _p(fb, "setp.lt.f32", a, _INF))
    done = fb.new_label("trig_done")
    fb.ins("bra", done, pred=large, negate=True)
    _trig_reduce_large(fb, x, r, q)
    fb.place(done)
    z = _f(fb, "mul.rn.f32", r, r)
    ps = _f(fb, "fma.rn.f32", z, _SIN_S[3], _SIN_S[2])
    for c in reversed(_SIN_S[:2]):
        ps = _f(fb, "fma.rn.f32", ps, z, c)
    sin_r = _f(fb, "fma.rn.f32", ps, _f(fb, "mul.rn.f32", r, z), r)
    # sin r has r's sign on |r| <= pi/4; this also keeps sin(-0) = -0, which r + r^3 S(z)
    # (-0 + +0) would lose.
    sin_r = _f(fb, "copysign.f32", r, sin_r)
    pc = _f(fb, "fma.rn.f32", z, _COS_K[3], _COS_K[2])
    for c in reversed(_COS_K[:2]):
        pc = _f(fb, "fma.rn.f32", pc, z, c)
    cos_r = _f(fb, "fma.rn.f32", pc, z, _ONE)
    # Quadrant n = q + quarter_turns: sin r, cos r, -sin r, -cos r for n mod 4 = 0, 1, 2, 3.
    n = _b(fb, "add.s32", q, int_imm(quarter_turns)) if quarter_turns else q
    odd = _p(fb, "setp.ne.u32", _b(fb, "and.b32", n, int_imm(1)), int_imm(0))
    v = _f(fb, "selp.f32", cos_r, sin_r, odd)
    sign = _b(fb, "and.b32", _b(fb, "shl.b32", n, int_imm(30)), int_imm(0x80000000))
    return _f(fb, "mov.b32", _b(fb, "xor.b32", _b(fb, "mov.b32", v), sign))


def emit_sin(fb: FunctionBuilder, x: Reg, *, fast: bool) -> Reg:
    """sin x. Fast: sin.approx.ftz.f32, as CUDA's __sinf (absolute error 2^-20.5 on
    [-2pi, 2pi], 2^-14.7 on [-100pi, 100pi], none promised beyond: PTX ISA 9.1).

    Precise: x = j pi/2 + r with j = rint(x 2/pi), r by a 3-part Cody-Waite reduction with fma
    for |x| <= 105615, else (in a branch, so ordinary inputs do not pay for it) by an exact
    integer Payne-Hanek reduction; minimax polynomials for sin r and cos r on |r| <= 0.8,
    picked and signed by j mod 4. Inf and NaN give NaN, sin(-0) = -0.

    Max error in ulp of the exact value, measured on sim over 2^20 random inputs per range
    and seed, seeds 0-3 (`python -m cutile_py.tools.math_accuracy`): 1.40 on [-pi, pi], 1.48
    on [-1e5, 1e5], 1.46 over all f32 bit patterns; never more than 1 ulp from the correctly
    rounded result. Bound asserted in tests: 1.5 ulp. (cos: 1.42, 1.49, 1.46; the same bound.)
    """
    if fast:
        return _f(fb, "sin.approx.ftz.f32", x)
    return _sin_cos(fb, x, 0)


def emit_cos(fb: FunctionBuilder, x: Reg, *, fast: bool) -> Reg:
    """cos x = sin(x + pi/2), the quadrant moved by one (`emit_sin`, which gives the measured
    errors: at most 1.49 ulp, bound 1.5). Fast: cos.approx.ftz.f32, as CUDA's __cosf (the
    PTX ISA's bounds for sin.approx: an H200 was 3.71e-7 off at 1.6877, past the 2^-21.41
    that CUDA's page gives)."""
    if fast:
        return _f(fb, "cos.approx.ftz.f32", x)
    return _sin_cos(fb, x, 1)


# -- erf -----------------------------------------------------------------------------------------
# By `python -m cutile_py.tools.fit_math`: for |x| < 0.921875, erf x = x + x Q(x^2), within
# 2^-30.1 relative; from there to 3.92, erf |x| = 1 - exp(p(|x| - 0.921875)), p ~ log erfc,
# within 2^-26.3 absolute (2^-29.3 before its f32 rounding: p(0) itself, ~log erfc(0.92),
# is only good to half an f32 ulp). erf(x) rounds to +-1 in f32 from |x| = 3.9192 (erfc < 2^-25).
_ERF_SPLIT = _k("0x1.d8p-1")  # 0.921875
_ERF_ONE = _k("0x1.f5c290p+1")  # 3.92 (f32)
_ERF_Q = tuple(
    _k(h)
    for h in (
        "0x1.06eba8p-3",
        "-0x1.81274p-2",
        "0x1.ce2d64p-4",
        "-0x1.b80112p-6",
        "0x1.544954p-8",
        "-0x1.a5fe48p-11",
        "0x1.4f2da2p-14",
    )
)
_ERF_P = tuple(
    _k(h)
    for h in (
        "-0x1.a60828p+0",
        "-0x1.41066p+1",
        "-0x1.aa870cp-1",
        "-0x1.6c88bep-5",
        "0x1.4f1602p-7",
        "-0x1.a2cb44p-10",
        "0x1.9bb968p-14",
    )
)


def _horner(fb: FunctionBuilder, t: Reg, coeffs: tuple[Imm, ...]) -> Reg:
    """c0 + c1 t + c2 t^2 + ... in f32 by Horner with fma."""
    acc = _f(fb, "fma.rn.f32", t, coeffs[-1], coeffs[-2])
    for c in reversed(coeffs[:-2]):
        acc = _f(fb, "fma.rn.f32", acc, t, c)
    return acc


def emit_erf(fb: FunctionBuilder, x: Reg, *, fast: bool) -> Reg:
    """erf x. |x| < 0.921875: x + x Q(x^2) (keeps -0, subnormals and x's sign); up to 3.92:
    1 - exp(p(|x| - 0.921875)) with x's sign (p centred at the split, where erfc is largest,
    so that its Horner sum does not cancel), exp by `_exp_precise` (fast: ex2.approx, the
    only difference); beyond: +-1. NaN gives NaN.

    Max error in ulp of the exact value, measured on sim over 2^20 random inputs per range
    and seed, seeds 0-3 (`python -m cutile_py.tools.math_accuracy`): 1.03 on [-5, 5], 1.02
    over all f32 bit patterns; never more than 1 ulp from the correctly rounded result.
    Bound asserted in tests: 1.1 ulp (fast: 1.14 measured over 200k inputs on [-5, 5], with
    the sim's exact ex2.approx).
    """
    a = _f(fb, "abs.f32", x)
    small = _f(fb, "fma.rn.f32", x, _horner(fb, _f(fb, "mul.rn.f32", x, x), _ERF_Q), x)
    p = _horner(fb, _f(fb, "sub.rn.f32", a, _ERF_SPLIT), _ERF_P)
    if fast:
        e = _f(fb, "ex2.approx.ftz.f32", _f(fb, "mul.rn.f32", p, _LOG2E))
    else:
        e = _exp_precise(fb, p)
    large = _f(fb, "sub.rn.f32", _ONE, e)
    large = _f(fb, "selp.f32", _ONE, large, _p(fb, "setp.ge.f32", a, _ERF_ONE))
    large = _f(fb, "copysign.f32", x, large)
    # NaN fails the compare and takes the polynomial, which propagates it.
    return _f(fb, "selp.f32", large, small, _p(fb, "setp.ge.f32", a, _ERF_SPLIT))


class UnaryEmitter(Protocol):
    def __call__(self, fb: FunctionBuilder, x: Reg, /, *, fast: bool) -> Reg: ...


class BinaryEmitter(Protocol):
    def __call__(self, fb: FunctionBuilder, a: Reg, b: Reg, /, *, fast: bool) -> Reg: ...


#: The unary math functions by name; each is called as `emit(fb, x, fast=...)`.
UNARY: dict[str, UnaryEmitter] = {
    "exp": emit_exp,
    "exp2": emit_exp2,
    "log": emit_log,
    "log2": emit_log2,
    "tanh": emit_tanh,
    "sigmoid": emit_sigmoid,
    "sin": emit_sin,
    "cos": emit_cos,
    "erf": emit_erf,
    "sqrt": emit_sqrt,
    "rsqrt": emit_rsqrt,
}
#: The binary ones, called as `emit(fb, a, b, fast=...)`.
BINARY: dict[str, BinaryEmitter] = {
    "div": emit_div,
    "floordiv": emit_floordiv,
    "mod": emit_mod,
    "pow": emit_pow,
}
