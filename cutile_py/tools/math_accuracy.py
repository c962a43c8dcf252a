"""Measure the f32 error of `ct.sin`, `ct.cos` and `ct.erf` on the active backend (sim by
default) against float64 NumPy (`math.erf` for erf).

`python -m cutile_py.tools.math_accuracy [--n 1048576] [--fast]` prints, for each function and
input range, the largest error in ulp of the exact value (|got - exact| / ulp(exact), ulp(v) the
f32 spacing at |v| rounded toward zero) and the largest distance in ulp from the correctly
rounded result. The ranges: [-pi, pi], [-1e5, 1e5] and every f32 (uniform random bit patterns)
for sin and cos; [-5, 5] and every f32 for erf.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import numpy.typing as npt

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

B = TypeVar("B")
TILE = 1024
F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


@ct.kernel
def _sin(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.sin(ct.load_tile_like(x, z)))


@ct.kernel
def _cos(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.cos(ct.load_tile_like(x, z)))


@ct.kernel
def _erf(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.erf(ct.load_tile_like(x, z)))


@ct.kernel(fast_math=True)
def _sin_fast(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.sin(ct.load_tile_like(x, z)))


@ct.kernel(fast_math=True)
def _cos_fast(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.cos(ct.load_tile_like(x, z)))


@ct.kernel(fast_math=True)
def _erf_fast(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.erf(ct.load_tile_like(x, z)))


KERNELS = {
    ("sin", False): _sin,
    ("cos", False): _cos,
    ("erf", False): _erf,
    ("sin", True): _sin_fast,
    ("cos", True): _cos_fast,
    ("erf", True): _erf_fast,
}

_erf64 = np.vectorize(math.erf, otypes=[np.float64])
EXACT: dict[str, Callable[[F64], F64]] = {"sin": np.sin, "cos": np.cos, "erf": _erf64}

#: The input ranges measured per function: (lo, hi) uniform, or None for random f32 bit patterns.
RANGES: dict[str, list[tuple[float, float] | None]] = {
    "sin": [(-math.pi, math.pi), (-1e5, 1e5), None],
    "cos": [(-math.pi, math.pi), (-1e5, 1e5), None],
    "erf": [(-5.0, 5.0), None],
}


def range_name(r: tuple[float, float] | None) -> str:
    return "all f32" if r is None else f"[{r[0]:.6g}, {r[1]:.6g}]"


def inputs(r: tuple[float, float] | None, n: int, seed: int) -> F32:
    rng = np.random.default_rng(seed)
    if r is None:
        return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return rng.uniform(r[0], r[1], n).astype(np.float32)


def _ordered(x: F32) -> npt.NDArray[np.int64]:
    b = np.ascontiguousarray(x).view(np.uint32).astype(np.int64)
    mag = b & 0x7FFFFFFF
    return np.asarray(np.where(b >> 31 == 1, -mag, mag), dtype=np.int64)


def errors(name: str, x: F32, got: F32) -> tuple[F64, npt.NDArray[np.int64]]:
    """(error in ulp of the exact value, ulp distance from the correctly rounded value) per
    element; where the exact value is NaN, 0 if got is NaN too, else inf (and 2^32)."""
    with np.errstate(all="ignore"):
        exact = EXACT[name](x.astype(np.float64))
        nan = np.isnan(exact)
        rounded = exact.astype(np.float32)
        mag = np.abs(rounded)
        # The f32 spacing at |exact| rounded toward zero (just below a power of two, the
        # smaller one).
        mag = np.where(mag.astype(np.float64) > np.abs(exact), np.nextafter(mag, 0), mag)
        ulp = np.spacing(mag.astype(np.float32)).astype(np.float64)
        err = np.abs(got.astype(np.float64) - exact) / ulp
        dist = np.abs(_ordered(got) - _ordered(rounded))
    good = np.isnan(got) == nan
    err = np.where(nan, np.where(good, 0.0, np.inf), err)
    dist = np.where(nan, np.where(good, 0, 2**32), dist)
    return err, dist


def run(name: str, x: F32, fast: bool = False) -> F32:
    """ct.sin/cos/erf of `x` (1-D f32) on the active backend."""
    z = ct.zeros(x.size, f32).partition(TILE)
    out = KERNELS[name, fast](z, ct.from_numpy(x)).sync()[0].unpartition().to_numpy()
    return np.asarray(out, dtype=np.float32)


def measure(
    name: str, r: tuple[float, float] | None, n: int, fast: bool = False, seed: int = 0
) -> tuple[float, int, float]:
    """(max error in ulp, max distance from the correctly rounded result in ulp, input at the
    max error) over `n` random inputs in range `r`."""
    x = inputs(r, n, seed)
    err, dist = errors(name, x, run(name, x, fast))
    worst = int(np.argmax(err))
    return float(err[worst]), int(dist.max()), float(x[worst])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1 << 20, help="inputs per range")
    parser.add_argument("--fast", action="store_true", help="measure fast_math=True")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=sorted(RANGES), help="one function")
    args = parser.parse_args(argv)
    for name, ranges in RANGES.items():
        if args.only and name != args.only:
            continue
        for r in ranges:
            worst, dist, at = measure(name, r, args.n, args.fast, args.seed)
            print(
                f"ct.{name} f32{' fast' if args.fast else ''} on {ct.backend()}, {args.n} "
                f"inputs in {range_name(r)}: max error {worst:.3f} ulp (x = {at!r}), "
                f"max {dist} ulp from the correctly rounded result"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
