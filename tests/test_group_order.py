"""`@ct.kernel(group_m=G)`: blocks own their tiles in the L2-grouped order, a permutation of
the grid; sim (the PTX) and interpret agree on it, and every tile access follows it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32, i32
from cutile_py.host import jit_disk
from cutile_py.host.kernel import COMPILER_VERSION
from cutile_py.ir.grid_order import grouped

BM = TypeVar("BM")
BN = TypeVar("BN")


@pytest.mark.parametrize(
    ("nx", "ny", "g"), [(1, 1, 1), (7, 5, 3), (8, 3, 8), (5, 9, 8), (13, 4, 4), (3, 11, 1)]
)
def test_grouped_is_a_bijection_of_the_grid(nx: int, ny: int, g: int) -> None:
    grid = (nx, ny, 2)
    blocks = list(itertools.product(range(nx), range(ny), range(2)))
    tiles = [grouped(b, grid, g) for b in blocks]
    assert sorted(tiles) == sorted(blocks)  # every tile once
    assert all(t[2] == b[2] for t, b in zip(tiles, blocks))  # axis 2 untouched


def test_grouped_walks_bands_of_group_m_rows() -> None:
    """In launch order (axis 0 fastest), the first blocks cover rows 0..g-1 of column 0,
    then of column 1; the last band is narrower where nx is not a multiple of g."""
    grid = (5, 3, 1)
    order = [grouped((x, y, 0), grid, 2) for y in range(3) for x in range(5)]
    assert order[:6] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (0, 2, 0), (1, 2, 0)]
    assert order[12:] == [(4, 0, 0), (4, 1, 0), (4, 2, 0)]
    # One row per band walks each row of tiles along axis 1 first.
    assert [grouped((x, 0, 0), grid, 1) for x in range(4)] == [
        (0, 0, 0),
        (0, 1, 0),
        (0, 2, 0),
        (1, 0, 0),
    ]


def _who(
    c: Mut[Tensor[i32, BM, BN]],
    x: Tensor[f32, Dyn, Dyn],
    y: Mut[Tensor[f32, BM, BN]],
    z: Mut[Tensor[f32, BM, BN]],
) -> None:
    """Each block writes its tile index into its c tile; into y, x's tile at that index
    (through `bid`, a plain load) plus z's tile, read as a sub-tile of its own (the `within`
    path); into the top half of its z tile, the bottom half. Tiles are (16, 8)."""
    bm, bn = c.shape[0], c.shape[1]
    i, j = ct.bid(0), ct.bid(1)
    c.store(ct.full((bm, bn), i * 1000 + j, i32))
    t = ct.load(x, (i, j), (bm, bn))
    y.store(t * 2.0 + ct.load(z, (0, 0), (16, 8)))
    ct.store(z, (0, 0), ct.load(z, (1, 0), (8, 8)))


@pytest.mark.parametrize("backend", ["sim", "interpret"])
@pytest.mark.parametrize(("m", "n", "g"), [(70, 45, 3), (40, 100, 2), (100, 30, 4)])
def test_grouped_blocks_own_their_tiles(backend: str, m: int, n: int, g: int, rng: Any) -> None:
    """Every tile is written once, by the block the order gives it, and each of its accesses
    (bid-indexed, own tile, own sub-tiles) names that tile: the outputs equal NumPy's."""
    grid = (-(-m // 16), -(-n // 8), 1)
    blocks = list(itertools.product(range(grid[0]), range(grid[1]), range(1)))
    assert any(grouped(b, grid, g) != b for b in blocks)  # the order differs from the plain one
    ct.set_backend(backend)
    k = ct.kernel(group_m=g)(_who)
    xs, ys, zs = (rng.standard_normal((m, n)).astype(np.float32) for _ in range(3))
    tm, tn = 16, 8
    c, _, y, z = k(
        ct.empty((m, n), i32).partition((tm, tn)),
        ct.from_numpy(xs),
        ct.from_numpy(ys).partition((tm, tn)),
        ct.from_numpy(zs).partition((tm, tn)),
    ).sync()
    rows, cols = np.meshgrid(np.arange(m) // tm, np.arange(n) // tn, indexing="ij")
    assert (c.unpartition().to_numpy() == rows * 1000 + cols).all()
    np.testing.assert_array_equal(y.unpartition().to_numpy(), xs * 2.0 + zs)
    want = zs.copy()
    padded = np.zeros((m + tm, n), np.float32)
    padded[:m] = zs
    for r0 in range(0, m, tm):
        want[r0 : min(r0 + 8, m)] = padded[r0 + 8 : r0 + 16][: min(8, m - r0)]
    np.testing.assert_array_equal(z.unpartition().to_numpy(), want)


def _order(c: Mut[Tensor[i32, BM, BN]]) -> None:
    bm, bn = c.shape[0], c.shape[1]
    c.store(ct.full((bm, bn), ct.bid(0) * 1000 + ct.bid(1), i32))


def test_the_ir_names_group_m_and_the_caches_keep_it_apart() -> None:
    spec = (ct.PartitionSpec((64, 64), (16, 16), i32),)
    grouped_k, plain = ct.kernel(group_m=4)(_order), ct.kernel(_order)
    assert grouped_k.ir(*spec).splitlines()[0].endswith(" group_m=4 {")
    assert "group_m" not in plain.ir(*spec).splitlines()[0]
    ptx = grouped_k.compile(*spec, target="sm_80").lowered.ptx
    assert "div.u32" in ptx and "%nctaid.y" in ptx
    assert "%nctaid.y" not in plain.compile(*spec, target="sm_80").lowered.ptx
    k = ct.kernel(_order)
    s = k.specialize(spec)
    keys = {
        jit_disk.disk_key(captured=k.captured, qualname=k.__qualname__, spec=s,
                          target=ct.Target(80), fast_math=False, compiler=COMPILER_VERSION,
                          group_m=g)
        for g in (None, 2, 8)
    }  # fmt: skip
    assert len(keys) == 3


@pytest.mark.parametrize(
    ("group_m", "error", "match"),
    [(0, ValueError, "at least 1, got 0"), (True, TypeError, "got True"), (2.0, TypeError, "2.0")],
)
def test_bad_group_m_is_rejected_at_decoration(
    group_m: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        ct.kernel(group_m=group_m)(_order)
    line = next(
        i + 1
        for i, t in enumerate(Path(__file__).read_text().splitlines())
        if t.startswith("def _order(")
    )
    assert f"{__file__}:{line}: kernel _order: group_m" in str(info.value)
