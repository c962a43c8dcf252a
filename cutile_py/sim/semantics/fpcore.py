"""Bit-exact floating-point rounding for the f32/f16/bf16/tf32 formats, vectorized over lanes.

The approach: compute an operation's exact result as an f64 *rounded to odd* (error-free
transformations give the residual of the f64 result; when it is inexact and the f64 is even, step
to the odd neighbour), then round that f64 to the target format with any IEEE mode. Rounding to
odd at 53 bits followed by rounding to p <= 51 bits equals a single correct rounding of the exact
value (Boldo & Melquiond, "When double rounding is odd", 2005), so every mode is bit exact, incl.
subnormal results, overflow and ties. Inputs must be values of an f32-or-narrower format, which
makes every product and the residual of every sum, quotient and root exact in f64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Veltkamp's splitting constant for f64 (2**27 + 1).
_SPLIT = 134217729.0


@dataclass(frozen=True)
class FloatFormat:
    """An IEEE-754-style binary format: `ebits` exponent bits, `mbits` stored fraction bits."""

    name: str
    ebits: int
    mbits: int
    #: Bits of the encoding as produced by `round_f64` (tf32 is widened to f32 layout after).
    nbits: int
    canonical_nan: int

    @property
    def bias(self) -> int:
        return (1 << (self.ebits - 1)) - 1

    @property
    def prec(self) -> int:
        return self.mbits + 1

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def inf_bits(self) -> int:
        return ((1 << self.ebits) - 1) << self.mbits

    @property
    def max_bits(self) -> int:
        return self.inf_bits - 1

    @property
    def sign_bit(self) -> int:
        return 1 << (self.nbits - 1)


F16 = FloatFormat("f16", 5, 10, 16, 0x7FFF)
BF16 = FloatFormat("bf16", 8, 7, 16, 0x7FFF)
#: tf32 is rounded as a 19-bit format, then stored in f32 layout with the 13 low bits zero (its
#: layout is implementation-defined per the ISA's "Alternate Floating-Point Data Formats").
TF32 = FloatFormat("tf32", 8, 10, 19, 0x3FFFF)
F32 = FloatFormat("f32", 8, 23, 32, 0x7FFFFFFF)
#: f64: used for decoding and flushing only (f64 arithmetic lives in `f64ops`).
F64 = FloatFormat("f64", 11, 52, 64, 0x7FFFFFFFFFFFFFFF)

FORMATS: dict[str, FloatFormat] = {f.name: f for f in (F16, BF16, TF32, F32, F64)}
_CONTAINER: dict[str, type[np.unsignedinteger]] = {
    "f16": np.uint16,
    "bf16": np.uint16,
    "tf32": np.uint32,
    "f32": np.uint32,
    "f64": np.uint64,
}
TF32_MASK = 0xFFFFE000


def container(fmt: FloatFormat) -> type[np.unsignedinteger]:
    """The unsigned dtype holding an encoding of `fmt` (tf32 in f32 layout)."""
    return _CONTAINER[fmt.name]


def decode(bits: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """Encodings → exact float64 values (NaN payloads are not preserved)."""
    b = np.asarray(bits)
    with np.errstate(invalid="ignore"):  # signalling NaNs warn when widened
        if fmt is F64:
            return b.astype(np.uint64).view(np.float64)
        if fmt is F32:
            return b.astype(np.uint32).view(np.float32).astype(np.float64)
        if fmt is TF32:
            f32 = b.astype(np.uint32) & np.uint32(TF32_MASK)
            return np.asarray(f32.view(np.float32).astype(np.float64))
        if fmt is F16:
            return b.astype(np.uint16).view(np.float16).astype(np.float64)
        return np.asarray(
            (b.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
        )


def _layout(fmt: FloatFormat) -> FloatFormat:
    """The format whose field layout the encodings use (tf32 is stored as f32)."""
    return F32 if fmt is TF32 else fmt


def is_subnormal_bits(bits: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    b = np.asarray(bits)
    lay, t = _layout(fmt), b.dtype.type
    exp = b & t(((1 << lay.ebits) - 1) << lay.mbits)
    return np.asarray((exp == 0) & ((b & t((1 << lay.mbits) - 1)) != 0))


def is_nan_bits(bits: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    b = np.asarray(bits)
    lay, t = _layout(fmt), b.dtype.type
    return np.asarray((b & t(lay.sign_bit - 1)) > t(lay.inf_bits))


def flush_bits(bits: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """`.ftz`: subnormal encodings become zero of the same sign."""
    b = np.asarray(bits)
    lay, t = _layout(fmt), b.dtype.type
    tiny = (b & t(((1 << lay.ebits) - 1) << lay.mbits)) == 0
    return np.where(tiny, b & t(lay.sign_bit), b)


def fma_rn_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fma.rn for f32-format values: a*b is exact in f64 and s = RN64(a*b + c) rounds to the
    right f32 unless s, inexact, sits exactly on an f32 rounding boundary (a midpoint has 28
    trailing zero bits and is not an f32 value); only those lanes take the exact residual and
    round to odd. The result is an f64 for `round_f64(..., F32, "rn")`."""
    with np.errstate(all="ignore"):
        p = np.ravel(a * b)
        cc = np.ravel(np.broadcast_to(c, np.shape(a)))
        s = p + cc
        suspect = (s.view(np.uint64) & np.uint64(0xFFFFFFF)) == 0
        suspect &= s.astype(np.float32).astype(np.float64) != s  # not itself an f32 value
        idx = np.flatnonzero(suspect & np.isfinite(s))
        if idx.size:
            hi, lo = two_sum(p[idx], cc[idx])
            s[idx] = round_to_odd(hi, lo)
        return np.asarray(s.reshape(np.shape(a)))


def round_f64(x: np.ndarray, fmt: FloatFormat, mode: str) -> np.ndarray:
    """Round float64 values to `fmt` with IEEE mode rn/rna/rz/rm/rp; returns the encodings.

    Subnormal results, overflow (to inf or the largest finite per mode) and ties are exact; any NaN
    becomes the format's canonical NaN.
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    if mode == "rn" and fmt in (F32, F16):
        # NumPy's f64 → f32/f16 casts round to nearest even, subnormals and overflow included
        # (the tests check them against exact rationals).
        with np.errstate(over="ignore", invalid="ignore"):
            narrow = x.astype(np.float32 if fmt is F32 else np.float16)
        bits = narrow.view(container(fmt))
        return np.where(np.isnan(x), container(fmt)(fmt.canonical_nan), bits)
    xb = x.view(np.int64)
    sign = (xb >> 63) & 1
    e = (xb >> 52) & 0x7FF
    frac = xb & ((1 << 52) - 1)
    normal = e > 0
    m = np.where(normal, frac | (1 << 52), frac)  # x = m * 2**E exactly
    big_e = np.where(normal, e - 1075, -1074)
    # floor(log2 |x|) for f64-normal x; f64 subnormals are far below every target's range.
    lg = np.where(normal, e - 1023, -1100)
    p, emin = fmt.prec, fmt.emin
    q = np.maximum(lg - (p - 1), emin - (p - 1))  # exponent of the result's last place
    s = np.minimum(q - big_e, 62)  # >= 53 - p, so positive; past 62 everything is sticky
    kept = m >> s
    rem = m & ((np.int64(1) << s) - 1)
    half = np.int64(1) << (s - 1)
    if mode == "rn":
        inc = (rem > half) | ((rem == half) & ((kept & 1) == 1))
    elif mode == "rna":
        inc = rem >= half
    elif mode == "rz":
        inc = np.zeros(x.shape, dtype=np.bool_)
    elif mode == "rm":
        inc = (rem != 0) & (sign == 1)
    elif mode == "rp":
        inc = (rem != 0) & (sign == 0)
    else:
        raise ValueError(f"unknown rounding mode {mode!r}")
    kept = kept + inc
    # With q = emin-(p-1)+k the encoding of kept*2**q is (k << (p-1)) + kept, implicit bit and
    # carries included.
    enc = ((q - (emin - (p - 1))) << (p - 1)) + kept
    away = {"rn": True, "rna": True, "rz": False}
    if mode in away:
        to_inf = np.full(x.shape, away[mode])
    else:
        to_inf = (sign == 1) if mode == "rm" else (sign == 0)
    overflow = enc >= fmt.inf_bits
    enc = np.where(overflow, np.where(to_inf, fmt.inf_bits, fmt.max_bits), enc)
    special = e == 0x7FF
    enc = np.where(special, np.where(frac == 0, fmt.inf_bits, 0), enc)
    out = (sign << (fmt.nbits - 1)) | enc
    out = np.where(special & (frac != 0), fmt.canonical_nan, out)
    if fmt is TF32:
        return np.asarray((out.astype(np.uint64) << np.uint64(13)).astype(np.uint32))
    return out.astype(container(fmt))


# --- error-free transformations (exact for finite f64 without overflow) ---------------------


def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """s = RN(a+b) and the exact error e, a + b == s + e (Knuth)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = _SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """p = RN(a*b) and the exact error e (Dekker); needs |a|,|b| < 2**995 and no underflow."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def round_to_odd(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """The f64 rounded to odd of the exact hi + lo, given hi = RN(hi + lo) (or lo = 0)."""
    bits = np.ascontiguousarray(hi, dtype=np.float64).view(np.int64)
    # Both neighbours of an even f64 are odd: step one encoding away from zero when lo has
    # hi's sign, toward zero otherwise (hi != 0 whenever lo != 0; lo is NaN for infinite hi).
    need = (lo != 0) & np.isfinite(lo) & ((bits & 1) == 0)
    step = np.where((lo > 0) == (hi > 0), 1, -1)
    return (bits + np.where(need, step, 0)).view(np.float64)


def _zero_sign_rm(s: np.ndarray, x: np.ndarray, y: np.ndarray, mode: str) -> np.ndarray:
    """IEEE 754 §6.3: an exact zero sum is +0, or -0 under rm, unless both addends are -0/+0
    of one sign (then that sign). f64 RN already gives the rn/rz/rp answer."""
    if mode != "rm":
        return s
    both_pos_zero = (x == 0) & (y == 0) & ~np.signbit(x) & ~np.signbit(y)
    return np.where((s == 0) & ~both_pos_zero, -0.0, s)


def odd_add(a: np.ndarray, b: np.ndarray, mode: str) -> np.ndarray:
    """a + b rounded to odd (then ready for `round_f64` with `mode`)."""
    s, e = two_sum(a, b)
    return _zero_sign_rm(round_to_odd(s, e), a, b, mode)


def odd_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, mode: str) -> np.ndarray:
    """a*b + c with a single rounding: the product is exact, the sum's residual is exact."""
    return odd_add(a * b, c, mode)


def odd_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b rounded to odd: the residual a - q*b is exact (Sterbenz after Dekker's product)."""
    q = a / b
    p, e = two_prod(q, b)
    r = (a - p) - e
    ok = np.isfinite(q) & (q != 0) & np.isfinite(b)
    lo = np.where(ok, np.sign(r) * np.sign(b), 0.0)
    return round_to_odd(q, lo)


def odd_sqrt(a: np.ndarray) -> np.ndarray:
    """sqrt(a) rounded to odd, from the sign of a - r*r."""
    r = np.sqrt(a)
    p, e = two_prod(r, r)
    res = (a - p) - e
    ok = np.isfinite(r) & (r > 0)
    return round_to_odd(r, np.where(ok, np.sign(res), 0.0))


def saturate(x: np.ndarray) -> np.ndarray:
    """`.sat`: clamp to [+0.0, 1.0]; NaN → +0.0 (and -0.0 → +0.0: the clamp's lower bound)."""
    y = np.where(np.isnan(x), 0.0, x)
    y = np.minimum(np.maximum(y, 0.0), 1.0)
    return np.where(y == 0, 0.0, y)
