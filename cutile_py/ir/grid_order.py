"""The L2-grouped block order (`@ct.kernel(group_m=G)`): which output tile a block owns.

Blocks are started in launch order, grid axis 0 fastest. In that order, the plain mapping has
consecutive blocks sweep a whole row of tiles along axis 0 before the next column, so the
operand rows and columns they read are reused only once the sweep comes back. Grouped,
consecutive blocks cover `G` tiles along axis 0 and then step along axis 1: a band of `G`
rows of tiles is walked column by column, and the tiles of one band share their A rows and
(with the next band) their B columns while they are still in L2.

The mapping is a bijection of the grid onto itself (a permutation of block ids), so each
tile still has exactly one owner; grid axis 2 is left as it is. The lowering computes the
same function in PTX (`lower/emit_ptx.py`), the interpreter calls `grouped`.
"""

from __future__ import annotations


def grouped(
    bid: tuple[int, int, int], grid: tuple[int, int, int], group_m: int
) -> tuple[int, int, int]:
    """The tile index that block `bid` of a `grid` launch owns under grouping by `group_m`."""
    nx, ny = grid[0], grid[1]
    pid = bid[0] + bid[1] * nx  # the launch order
    width = group_m * ny  # blocks per band of group_m tile rows
    band = pid // width
    first = band * group_m
    rows = min(nx - first, group_m)  # the last band may be narrower
    r = pid - band * width
    return (first + r % rows, r // rows, bid[2])
