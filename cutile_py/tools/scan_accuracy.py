"""Measure `ct.cumsum`'s f32 error on the active backend (sim by default) against exact sums.

`python -m cutile_py.tools.scan_accuracy [--n 1048576]` prints, per input distribution and row
length (the tile along the scanned axis), the largest error of any prefix in half-ulps of
that prefix's sum of |x| (the scale a sum's rounding error is measured against), beside the
same figure for NumPy's sequential f32 `cumsum`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

R = TypeVar("R")
C = TypeVar("C")


@ct.kernel
def _cumsum_rows(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    z.store(ct.cumsum(ct.load_tile_like(x, z), 1))


def measure(x: np.ndarray) -> tuple[float, float]:
    """(kernel, sequential f32) largest error in half-ulps of the prefix sums of |x|."""
    z, _ = _cumsum_rows(ct.empty(x.shape, f32).partition((1, x.shape[1])), ct.from_numpy(x)).sync()
    got = z.unpartition().to_numpy().astype(np.float64)
    exact = np.cumsum(x.astype(np.float64), axis=1)
    unit = 2.0**-24 * np.cumsum(np.abs(x.astype(np.float64)), axis=1)
    seq = np.cumsum(x, axis=1, dtype=np.float32).astype(np.float64)
    return float((np.abs(got - exact) / unit).max()), float((np.abs(seq - exact) / unit).max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1 << 20, help="elements per measurement")
    args = parser.parse_args(argv)
    if "CUTILE_PY_BACKEND" not in os.environ:
        ct.set_backend("sim")
    rng = np.random.default_rng()
    dists: dict[str, Callable[[tuple[int, int]], np.ndarray]] = {
        "normal": rng.standard_normal,
        "uniform [0, 1)": rng.random,
    }
    for name, draw in dists.items():
        for row in (128, 1024, 4096):
            x = draw((max(args.n // row, 1), row)).astype(np.float32)
            kernel, sequential = measure(x)
            print(
                f"{name:15} rows of {row:5}: max {kernel:5.2f} half-ulps of sum|x| "
                f"(sequential f32 cumsum: {sequential:5.2f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
