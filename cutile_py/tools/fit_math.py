"""Fit the polynomial coefficients of `ct.sin`, `ct.cos` and `ct.erf` (`lower/emit_math.py`).

`python -m cutile_py.tools.fit_math` prints, for each polynomial, its f32 coefficients as hex
floats and its fitted error, and the 2/pi words of the large-argument sin/cos reduction. Each fit
is a weighted minimax fit in float64 by Lawson's algorithm (iteratively reweighted least squares
on a dense Chebyshev grid); the coefficients are then rounded to f32 one at a time, lowest order
first, with the remaining ones refitted after each rounding, so the rounding costs little.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

#: sin/cos polynomials cover |r| <= this: pi/4 plus the slack of the f32 quadrant choice
#: (j = rint(f32(x * f32(2/pi))) for |x| <= 105615: both roundings together move x*2/pi by
#: under 0.008, so |r| < (0.5 + 0.008) pi/2 = 0.798).
TRIG_R = 0.8
#: erf: x + x*Q(x^2) below this; 1 - exp(p(|x|)) from here to ERF_ONE.
ERF_SPLIT = 0.921875
#: erf(x) rounds to 1 in f32 from about 3.9192 (erfc(x) < 2^-25).
ERF_ONE = 3.92
#: p is a polynomial in t = |x| - ERF_CENTER (exact in f32 over the interval).
ERF_CENTER = ERF_SPLIT


def f32(v: float) -> float:
    return float(np.float32(v))


def cheb_grid(lo: float, hi: float, n: int = 4000) -> F64:
    """Chebyshev points of the second kind on [lo, hi] (dense at the ends, where the
    equioscillation extrema crowd)."""
    k = np.arange(n)
    return np.asarray(lo + (hi - lo) * (1 - np.cos(np.pi * k / (n - 1))) / 2, dtype=np.float64)


@dataclass(frozen=True)
class Fit:
    """Approximate `target` by sum_k c_k phi_k with |weight * error| minimal on `grid`."""

    grid: F64
    basis: F64  # (n, k): phi_k(grid)
    target: F64
    weight: F64

    def lawson(self, fixed: dict[int, float], iters: int = 200) -> F64:
        """Coefficients with those in `fixed` held at their values (Lawson's algorithm)."""
        k = self.basis.shape[1]
        free = [i for i in range(k) if i not in fixed]
        rest = self.target - sum(
            (c * self.basis[:, i] for i, c in fixed.items()), np.zeros_like(self.target)
        )
        a = self.basis[:, free] * self.weight[:, None]
        b = rest * self.weight
        u = np.full(len(self.grid), 1.0 / len(self.grid))
        coef = np.zeros(len(free))
        for _ in range(iters):
            s = np.sqrt(u)
            coef = np.linalg.lstsq(a * s[:, None], b * s, rcond=None)[0]
            err = np.abs(a @ coef - b)
            u = u * err
            u /= u.sum()
        out = np.zeros(k)
        for i, c in fixed.items():
            out[i] = c
        out[free] = coef
        return out

    def error(self, coef: F64) -> float:
        return float(np.max(np.abs((self.basis @ coef - self.target) * self.weight)))

    def f32_coefficients(self) -> tuple[list[float], float]:
        """Coefficients rounded to f32 one at a time (refitting the rest), and the max
        weighted error of the result."""
        fixed: dict[int, float] = {}
        for i in range(self.basis.shape[1]):
            fixed[i] = f32(self.lawson(fixed)[i])
        coef = np.array([fixed[i] for i in range(self.basis.shape[1])])
        return [float(c) for c in coef], self.error(coef)


def _series(z: F64, terms: Callable[[int], float], n: int = 30) -> F64:
    """sum_{k<n} terms(k) z^k by Horner (the series here converge to f64 precision)."""
    acc = np.zeros_like(z)
    for k in reversed(range(n)):
        acc = acc * z + terms(k)
    return acc


def sin_fit(degree: int = 4) -> Fit:
    """sin r = r + r^3 S(r^2): S(z) ~ (sin r - r)/r^3, relative error of sin weighted in."""
    r = cheb_grid(0.0, TRIG_R)
    z = r * r
    s_true = _series(z, lambda k: (-1) ** (k + 1) / math.factorial(2 * k + 3))
    rel = np.where(r > 0, r * r * r / np.where(r > 0, np.sin(r), 1.0), 0.0)
    return Fit(z, np.vander(z, degree, increasing=True), s_true, rel)


def cos_fit(degree: int = 4) -> Fit:
    """cos r = 1 + z K(z), z = r^2: K(z) ~ (cos r - 1)/z, relative error of cos weighted in."""
    r = cheb_grid(0.0, TRIG_R)
    z = r * r
    k_true = _series(z, lambda k: (-1) ** (k + 1) / math.factorial(2 * k + 2))
    return Fit(z, np.vander(z, degree, increasing=True), k_true, z / np.cos(r))


def erf_small_fit(degree: int = 7) -> Fit:
    """erf x = x + x Q(x^2) for |x| < ERF_SPLIT: Q(z) ~ erf(x)/x - 1, relative error of erf."""
    x = cheb_grid(0.0, ERF_SPLIT)
    z = x * x
    c = 2.0 / math.sqrt(math.pi)
    q_true = _series(z, lambda k: c * (-1) ** k / (math.factorial(k) * (2 * k + 1))) - 1.0
    ratio = np.where(x > 0, x / np.where(x > 0, _erf(x), 1.0), 1.0 / c)
    return Fit(z, np.vander(z, degree, increasing=True), q_true, ratio)


def erf_large_fit(degree: int = 7) -> Fit:
    """erf x = 1 - exp(p(x - ERF_CENTER)) on [ERF_SPLIT, ERF_ONE]: p ~ log erfc, weighted by
    erfc (the absolute error of erf, which is near 1 there)."""
    x = cheb_grid(ERF_SPLIT, ERF_ONE)
    erfc = np.array([math.erfc(v) for v in x])
    t = x - ERF_CENTER
    return Fit(x, np.vander(t, degree, increasing=True), np.log(erfc), erfc)


def _erf(x: F64) -> F64:
    return np.array([math.erf(v) for v in x])


def pi_bits(n: int) -> int:
    """floor(pi * 2^n), exactly (Machin: pi = 16 atan(1/5) - 4 atan(1/239), with 64 guard bits)."""
    one = 1 << (n + 64)

    def atan_inv(k: int) -> int:
        total, term, j, sign = 0, one // k, 1, 1
        while term:
            total += sign * (term // j)
            term //= k * k
            j += 2
            sign = -sign
        return total

    return (16 * atan_inv(5) - 4 * atan_inv(239)) >> 64


def two_over_pi_words(words: int = 7) -> list[int]:
    """floor(2/pi * 2^(32*words)) as 32-bit words, least significant first."""
    bits = 32 * words + 64  # 64 guard bits: the quotient below is then floor-exact
    g = ((1 << (2 * bits + 1)) // pi_bits(bits)) >> 64  # 2^(2 bits+1) / (pi 2^bits) = 2/pi 2^bits
    return [(g >> (32 * i)) & 0xFFFFFFFF for i in range(words)]


def pio2_parts(n: int = 3) -> tuple[list[float], float]:
    """pi/2 as n f32 parts, each the f32 at or below what is left (so all are positive), and
    log2 of the remainder."""
    left = Fraction(pi_bits(300), 2**301)
    parts = []
    for _ in range(n):
        f = np.float32(float(left))
        if Fraction(float(f)) > left:
            f = np.nextafter(f, np.float32(0))
        parts.append(float(f))
        left -= Fraction(float(f))
    return parts, math.log2(float(left))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.parse_args(argv)
    fits = {
        "sin S(z)": sin_fit(),
        "cos K(z)": cos_fit(),
        "erf small Q(z)": erf_small_fit(),
        "erf large p(t)": erf_large_fit(),
    }
    for name, fit in fits.items():
        coef, err = fit.f32_coefficients()
        print(f"{name}: max weighted error 2^{math.log2(err):.1f}")
        for c in coef:
            print(f"    {float(c).hex()}")
    parts, rest = pio2_parts()
    print(f"pi/2 parts (remainder 2^{rest:.1f}):", ", ".join(p.hex() for p in parts))
    print("2/pi words (least significant first):")
    print("   ", ", ".join(f"0x{w:08X}" for w in two_over_pi_words()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
