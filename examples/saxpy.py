"""SAXPY, `z = a*x + y`, with a run-time scalar and a size that tiles do not divide.

Run: python examples/saxpy.py
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

B = TypeVar("B")


@ct.kernel
def saxpy(z: Mut[Tensor[f32, B]], a: float, x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    tx = ct.load_tile_like(x, z)
    ty = ct.load_tile_like(y, z)
    z.store(a * tx + ty)


def main() -> None:
    n, tile, a = 10_007, 1024, 2.5  # the last tile is partial: its loads and stores are masked
    rng = np.random.default_rng()
    xs = rng.standard_normal(n).astype(np.float32)
    ys = rng.standard_normal(n).astype(np.float32)
    z = ct.zeros(n).partition(tile)
    z, _, _, _ = saxpy(z, a, ct.from_numpy(xs), ct.from_numpy(ys)).sync()
    result = z.unpartition().to_numpy()
    expected = np.float32(a) * xs + ys
    print(f"backend {ct.backend()}: max |error| = {np.abs(result - expected).max():.3g}")
    assert np.allclose(result, expected, rtol=1e-6, atol=1e-6)


if __name__ == "__main__":
    main()
