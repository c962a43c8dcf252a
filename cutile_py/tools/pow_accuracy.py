"""Measure `ct.pow`'s f32 error on the active backend (sim by default) against the exact power.

`python -m cutile_py.tools.pow_accuracy [--n 1048576] [--fast]` prints the largest error in
ulp of the correctly rounded result over random inputs whose results span the f32 range
(subnormal to near overflow), and the share that is not correctly rounded.
"""

from __future__ import annotations

import argparse
import sys
from typing import TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

B = TypeVar("B")
TILE = 1024


@ct.kernel
def _pow(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    z.store(ct.pow(ct.load_tile_like(x, z), ct.load_tile_like(y, z)))


@ct.kernel(fast_math=True)
def _pow_fast(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    z.store(ct.pow(ct.load_tile_like(x, z), ct.load_tile_like(y, z)))


def inputs(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """x of every magnitude (subnormals included, a quarter negative with integer y), and y
    such that |y log2 x| is spread up to 160: results from 2^-160 (0) to 2^160 (inf)."""
    log2x = rng.uniform(-149.0, 128.0, n)
    near_one = rng.random(n) < 0.25  # x close to 1, where log2 x is small and y large
    log2x[near_one] = rng.uniform(-(2.0**-10), 2.0**-10, near_one.sum())
    x = np.exp2(log2x).astype(np.float32)
    x[x == 0] = np.float32(2.0**-149)
    t = rng.uniform(-160.0, 160.0, n)
    with np.errstate(divide="ignore"):
        y = (t / np.log2(x.astype(np.float64))).astype(np.float32)
    neg = rng.random(n) < 0.25
    x[neg] = -x[neg]
    y[neg] = np.round(y[neg])  # a negative base needs an integer exponent (else NaN)
    return x, y


def ulp_errors(got: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|got - x**y| in ulp of the correctly rounded f32 result (x**y exact to f64's ~1e-16;
    where that is NaN, 0 if got is NaN too, else inf)."""
    with np.errstate(all="ignore"):
        exact = np.power(x.astype(np.float64), y.astype(np.float64))
        rounded = exact.astype(np.float32)
        # The ulp at the rounded result; 2^-149 in the subnormal range; beyond f32's largest,
        # that of f32's largest (any finite result there is off by at least the overflow).
        mag = np.minimum(np.abs(rounded), np.finfo(np.float32).max)
        ulp = np.spacing(mag).astype(np.float64)
        both_inf = np.isinf(got) & np.isinf(rounded) & (np.sign(got) == np.sign(rounded))
        err = np.where(both_inf, 0.0, np.abs(got.astype(np.float64) - exact) / ulp)
        nan = np.isnan(exact)
        return np.where(nan, np.where(np.isnan(got), 0.0, np.inf), err)


def measure(n: int, fast: bool = False, seed: int = 0) -> tuple[float, float]:
    """(max ulp error, fraction not correctly rounded) of ct.pow over `n` random inputs."""
    x, y = inputs(n, np.random.default_rng(seed))
    kernel = _pow_fast if fast else _pow
    z = ct.zeros(n, f32).partition(TILE)
    out = kernel(z, ct.from_numpy(x), ct.from_numpy(y)).sync()[0].unpartition().to_numpy()
    err = ulp_errors(out, x, y)
    return float(err.max()), float(np.mean(err > 0.5))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1 << 20)
    parser.add_argument("--fast", action="store_true", help="measure fast_math=True")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    worst, wrong = measure(args.n, args.fast, args.seed)
    print(
        f"ct.pow f32 on {ct.backend()}, {args.n} inputs: max error {worst:.6f} ulp, "
        f"{wrong:.2e} not correctly rounded"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
