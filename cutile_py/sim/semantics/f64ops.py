"""Correctly rounded f64 add/mul/div/sqrt/fma in all four IEEE modes, vectorized over lanes.

NumPy's f64 arithmetic is round-to-nearest-even. Directed modes start from that result z and the
exact sign of the residual x - z (error-free transformations on exponent-scaled operands), then
step one ulp where the mode requires. fma first forms x = z + w + wl exactly (Dekker product,
Knuth sums) and decides when |w| is below z's spacing. The few lanes outside those methods' ranges
(subnormal or overflowing results, extreme fma operands) are rounded exactly with `fractions`.

NaN policy (PTX ISA §9.7.3: "NaN payloads are supported for double-precision instructions"): a
NaN input propagates, quieted (the first NaN operand); a NaN created by an invalid operation is
the canonical 0x7FFFFFFFFFFFFFFF.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from cutile_py.sim.semantics.fpcore import two_prod, two_sum

F64_NAN = np.uint64(0x7FFFFFFFFFFFFFFF)
_QUIET = np.uint64(1 << 51)
_MAX = np.finfo(np.float64).max
_TINY = 2.0**-1000
#: Results at least this large are normal both in IEEE and in the exponent-scaled computation
#: (at exactly 2**-1022 an unbounded-exponent rounding may differ from the IEEE one).
_NORMAL = 2.0**-1021


def round_fraction(x: Fraction, mode: str, negative_zero: bool = False) -> float:
    """The rational `x` correctly rounded to f64 in `mode` (subnormals and overflow exact)."""
    if x == 0:
        return -0.0 if negative_zero else 0.0
    neg = x < 0
    n, d = abs(x.numerator), x.denominator
    e = n.bit_length() - d.bit_length()
    if (n < d << e) if e >= 0 else (n << -e < d):
        e -= 1  # now 2**e <= |x| < 2**(e+1)
    q = max(e - 52, -1074)
    num, den = (n, d << q) if q >= 0 else (n << -q, d)
    kept, rem = divmod(num, den)
    if mode == "rn":
        inc = 2 * rem > den or (2 * rem == den and kept & 1 == 1)
    elif mode == "rz":
        inc = False
    elif mode == "rm":
        inc = rem != 0 and neg
    elif mode == "rp":
        inc = rem != 0 and not neg
    else:
        raise ValueError(mode)
    kept += int(inc)
    if kept.bit_length() + q > 1024:  # overflow
        away = mode == "rn" or (mode == "rm" and neg) or (mode == "rp" and not neg)
        mag = math.inf if away else float(_MAX)
    else:
        mag = math.ldexp(kept, q)
    return -mag if neg else mag


def fix_nan(result: np.ndarray, *inputs: np.ndarray) -> np.ndarray:
    """Apply the NaN policy: first NaN input (quieted) wins, else the canonical NaN."""
    bits = np.ascontiguousarray(result, dtype=np.float64).view(np.uint64).copy()
    isnan = np.isnan(result)
    if not isnan.any():
        return result
    chosen = np.full(bits.shape, F64_NAN)
    taken = np.zeros(bits.shape, dtype=np.bool_)
    for x in inputs:
        xn = np.isnan(x) & ~taken
        xb = np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)
        chosen = np.where(xn, xb | _QUIET, chosen)
        taken |= xn
    bits = np.where(isnan, chosen, bits)
    return bits.view(np.float64)


def _step(z: np.ndarray, up: np.ndarray) -> np.ndarray:
    return np.asarray(np.nextafter(z, np.where(up, np.inf, -np.inf)))


def directed(z: np.ndarray, resid: np.ndarray, mode: str) -> np.ndarray:
    """From z = RN(x) and sign(x - z), the rounding of x in `mode` (z finite)."""
    if mode == "rn":
        return z
    if mode == "rm":
        return np.where(resid < 0, _step(z, np.zeros(z.shape, np.bool_)), z)
    if mode == "rp":
        return np.where(resid > 0, _step(z, np.ones(z.shape, np.bool_)), z)
    toward_zero = (resid != 0) & (np.signbit(z) != (resid < 0))
    return np.where(toward_zero, np.nextafter(z, 0.0), z)


def _fallback(
    out: np.ndarray,
    lanes: np.ndarray,
    exact: Callable[[int], Fraction | None],
    mode: str,
) -> np.ndarray:
    """Round, lane by lane, the rare lanes no vectorized method covers (exact rationals)."""
    idx = np.flatnonzero(lanes)
    if idx.size == 0:
        return out
    out = out.copy()
    for i in idx:
        fr = exact(int(i))
        if fr is not None:
            out[i] = round_fraction(fr, mode, negative_zero=mode == "rm")
    return out


def _frac(x: np.ndarray, i: int) -> Fraction:
    return Fraction(float(x[i]))


def f64_add(a: np.ndarray, b: np.ndarray, mode: str) -> np.ndarray:
    """a + b in `mode` (TwoSum is exact for every finite a, b without overflow)."""
    with np.errstate(all="ignore"):
        s, e = two_sum(a, b)
        finite_in = np.isfinite(a) & np.isfinite(b)
        res = np.where(np.isfinite(s) & finite_in, directed(s, np.nan_to_num(e), mode), s)
        if mode != "rn":
            over = ~np.isfinite(s) & finite_in
            res = np.where(over, directed_overflow(np.sign(s), mode), res)
            if mode == "rm":
                pos0 = (a == 0) & (b == 0) & ~np.signbit(a) & ~np.signbit(b)
                res = np.where((res == 0) & ~pos0, -0.0, res)
    return fix_nan(res, a, b)


def directed_overflow(sign: np.ndarray, mode: str) -> np.ndarray:
    """The result of a finite computation whose magnitude rounds past the largest f64."""
    if mode == "rz":
        return np.asarray(sign * _MAX)
    if mode == "rm":
        return np.where(sign > 0, _MAX, -np.inf)
    if mode == "rp":
        return np.where(sign > 0, np.inf, -_MAX)
    return sign * np.inf


def f64_mul(a: np.ndarray, b: np.ndarray, mode: str) -> np.ndarray:
    """a * b in `mode`: the residual sign comes from the product of the scaled significands."""
    with np.errstate(all="ignore"):
        z = a * b
        if mode == "rn":
            return fix_nan(z, a, b)
        ma, _ = np.frexp(a)
        mb, _ = np.frexp(b)
        _, err = two_prod(ma, mb)
        ok = np.isfinite(z) & (np.abs(z) >= _NORMAL)
        res = np.where(ok, directed(z, np.nan_to_num(err), mode), z)
        hard = np.isfinite(a) & np.isfinite(b) & (a != 0) & (b != 0) & ~ok
        res = _fallback(res, hard, lambda i: _frac(a, i) * _frac(b, i), mode)
    return fix_nan(res, a, b)


def f64_div(a: np.ndarray, b: np.ndarray, mode: str) -> np.ndarray:
    """a / b in `mode`: the remainder of the scaled significands gives the residual sign."""
    with np.errstate(all="ignore"):
        z = a / b
        if mode == "rn":
            return fix_nan(z, a, b)
        ma, _ = np.frexp(a)
        mb, _ = np.frexp(b)
        q = ma / mb
        p, e = two_prod(q, mb)
        r = (ma - p) - e  # exact: Sterbenz, then Dekker
        resid = np.nan_to_num(np.sign(r) * np.sign(mb))
        ok = np.isfinite(z) & (np.abs(z) >= _NORMAL)
        res = np.where(ok, directed(z, resid, mode), z)
        hard = np.isfinite(a) & np.isfinite(b) & (a != 0) & (b != 0) & ~ok
        res = _fallback(res, hard, lambda i: _frac(a, i) / _frac(b, i), mode)
    return fix_nan(res, a, b)


def f64_sqrt(a: np.ndarray, mode: str) -> np.ndarray:
    """sqrt(a) in `mode`: an even exponent split keeps the residual a - r*r exact."""
    with np.errstate(all="ignore"):
        z = np.sqrt(a)
        if mode == "rn":
            return fix_nan(z, a)
        m, k = np.frexp(a)
        odd = (k & 1) == 1
        m = np.where(odd, m * 2.0, m)  # a = m * 2**k2 with k2 even, m in [0.5, 2)
        r = np.sqrt(m)
        p, e = two_prod(r, r)
        resid = np.nan_to_num(np.sign((m - p) - e))
        ok = np.isfinite(z) & (a > 0)
        res = np.where(ok, directed(z, resid, mode), z)
    return fix_nan(res, a)


def f64_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, mode: str) -> np.ndarray:
    """a*b + c rounded once in `mode` (every mode, rn included: NumPy has no fma)."""
    with np.errstate(all="ignore"):
        finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
        # Non-finite operands: the IEEE result does not depend on the mode.
        special = np.where(np.isinf(c) & np.isfinite(a) & np.isfinite(b), c, a * b + c)
        zero_prod = (a == 0) | (b == 0)

        def in_range(x: np.ndarray, lim: float) -> np.ndarray:
            ax = np.abs(x)
            return np.asarray((ax >= 2.0**-lim) & (ax <= 2.0**lim))

        safe = finite & ~zero_prod & in_range(a, 480) & in_range(b, 480)
        safe &= (c == 0) | in_range(c, 960)
        ph, pl = two_prod(a, b)
        th, tl = two_sum(c, ph)
        uh, ul = two_sum(tl, pl)
        z, zl = two_sum(th, uh)
        w, wl = two_sum(zl, ul)  # a*b + c == z + w + wl exactly, w = RN(w + wl)
        res, certain = _round_expansion(z, w, wl, mode)
        certain &= safe
        # Exact zero: IEEE 754 §6.3 sign rules (product and c both zero of one sign keep it).
        exact_zero = (z == 0) & (w == 0)
        zero = np.full(z.shape, -0.0 if mode == "rm" else 0.0)
        res = np.where(exact_zero, zero, res)
        # A zero product leaves c (exact), or a signed zero when c is zero too.
        psign = np.signbit(a) ^ np.signbit(b)
        both0 = np.where(psign == np.signbit(c), c, zero)
        res = np.where(zero_prod & finite, np.where(c == 0, both0, c), res)
        certain |= zero_prod & finite
        res = np.where(finite, res, special)
        hard = finite & ~certain

        def exact(i: int) -> Fraction:
            return _frac(a, i) * _frac(b, i) + _frac(c, i)

        res = _fallback(res, hard, exact, mode)
    return fix_nan(res, a, b, c)


def _round_expansion(
    z: np.ndarray, w: np.ndarray, wl: np.ndarray, mode: str
) -> tuple[np.ndarray, np.ndarray]:
    """Round x = z + w + wl (w = RN(w + wl)) in `mode` where |w| is below z's spacing.

    Returns (result, certain): lanes not certain need an exact fallback.
    """
    up = w > 0
    z2 = _step(z, up)  # the neighbour of z on w's side
    gap = np.abs(z2 - z)
    # Near the top of the range z2 is inf: the spacing is then the one below z.
    gap = np.where(np.isfinite(gap), gap, np.abs(z - np.nextafter(z, 0.0)))
    aw = np.abs(w)
    certain = np.isfinite(z) & (np.abs(z) >= _TINY) & (aw < gap)
    certain |= (z == 0) & np.isfinite(w)  # then zl == 0, w == ul exactly and wl == 0
    if mode == "rn":
        half = gap * 0.5
        tie = aw == half
        wl_same = np.sign(wl) == np.sign(w)
        even_z = (np.ascontiguousarray(z).view(np.uint64) & np.uint64(1)) == 0
        take = (aw > half) | (tie & ((wl != 0) & wl_same | (wl == 0) & ~even_z))
    elif mode == "rz":
        take = (w != 0) & (np.signbit(z) != (w < 0))
    elif mode == "rm":
        take = w < 0
    elif mode == "rp":
        take = w > 0
    else:
        raise ValueError(mode)
    res = np.where(take & (w != 0), z2, z)
    res = np.where(z == 0, w, res)
    return res, certain
