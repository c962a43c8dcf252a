"""One kernel for every float dtype: `Tensor[T, ...]` with a dtype TypeVar `T`, bound at launch.

Each dtype the kernel is launched with compiles its own variant (cached like any other), and
the file passes `mypy --strict` as written: no factory, no `TYPE_CHECKING`.

Run: python examples/generic_dtype.py
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

T = TypeVar("T")  # the element dtype: f32, f16 or bf16, whatever the arguments hold
B = TypeVar("B")  # the tile size


@ct.kernel
def axpy(z: Mut[Tensor[T, B]], a: float, x: Tensor[T, Dyn], y: Tensor[T, Dyn]) -> None:
    """z = a*x + y, computed in f32 and rounded once to the arguments' dtype."""
    tx = ct.load_tile_like(x, z).astype(f32)
    ty = ct.load_tile_like(y, z).astype(f32)
    # mypy allows a TypeVar only in annotations: name the dtype through a parameter.
    z.store((a * tx + ty).astype(z.dtype))


def main() -> None:
    n, a = 3_000, 1.5
    rng = np.random.default_rng()
    xs = rng.standard_normal(n).astype(np.float32)
    ys = rng.standard_normal(n).astype(np.float32)
    # (dtype, its relative rounding error: half an ulp)
    for dt, tol in ((ct.f32, 2.0**-24), (ct.f16, 2.0**-11), (ct.bf16, 2.0**-8)):
        x, y = ct.from_numpy(xs, dt), ct.from_numpy(ys, dt)
        # the reference from the inputs as the dtype holds them
        hx, hy = x.to_numpy().astype(np.float32), y.to_numpy().astype(np.float32)
        z = ct.empty((n,), dt).partition(512)
        z, _, _, _ = axpy(z, a, x, y).sync()
        got = z.unpartition().to_numpy().astype(np.float32)
        want = np.float32(a) * hx + hy
        err = float((np.abs(got - want) / np.maximum(np.abs(want), 1e-3)).max())
        print(f"backend {ct.backend()}: {dt.name}: max relative error = {err:.3g}")
        assert err <= tol, (dt.name, err)


if __name__ == "__main__":
    main()
