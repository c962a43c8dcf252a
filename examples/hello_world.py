"""Hello, tiles: each block writes its own block id into its tile of the output.

Run: python examples/hello_world.py
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Mut, Tensor, i32

B = TypeVar("B")


@ct.kernel
def write_block_ids(out: Mut[Tensor[i32, B]]) -> None:
    # Every element of this block's tile gets the block's index along the grid.
    out.store(ct.full(out.shape, ct.bid(0), ct.i32))


def main() -> None:
    n, tile = 20, 8
    out = ct.zeros(n, dtype=ct.i32).partition(tile)  # 3 tiles: 8 + 8 + 4 elements
    print(f"backend: {ct.backend()}, grid: {out.grid}")
    (out,) = write_block_ids(out).sync()
    result = out.unpartition().to_numpy()
    print(result)
    assert np.array_equal(result, np.arange(n) // tile)
    print("PTX of the kernel (first lines):")
    ptx = write_block_ids.ptx(ct.PartitionSpec((n,), (tile,), ct.i32))
    print("\n".join(ptx.splitlines()[:12]))


if __name__ == "__main__":
    main()
