"""The kernel of API.md: `z = x + y`, with the ownership rules at work.

Run: python examples/add.py
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

B = TypeVar("B")


@ct.kernel
def add(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    tx = ct.load_tile_like(x, z)
    ty = ct.load_tile_like(y, z)
    z.store(tx + ty)


def main() -> None:
    n = 1 << 16
    x = ct.randn(n, seed=1)
    y = ct.randn(n, seed=2)
    z = ct.zeros(n)
    zp = z.partition(1024)  # `z` is moved into the partition: using it now is an error
    try:
        z.to_numpy()
    except ct.MovedError as e:
        print(f"as expected: {e}")
    op = add(zp, x, y)  # checks the arguments and takes them; nothing runs yet
    try:
        add(zp, x, y)  # the partition belongs to the pending op
    except ct.BorrowError as e:
        print(f"as expected: {e}")
    zp, x, y = op.sync()  # runs, waits, and hands the arguments back
    result = zp.unpartition().to_numpy()
    assert np.allclose(result, x.to_numpy() + y.to_numpy())
    print(f"backend {ct.backend()}: {n} sums correct")


if __name__ == "__main__":
    main()
