"""Tiles reduced along their rows keep warps off the row dim where the rows can take them
(`lower.layout`): each row reduces within its warp, by shuffles only; results match NumPy on
sim. Tiles reduced along columns, or both ways, keep every thread along the row."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

R = TypeVar("R")
C = TypeVar("C")
N = 512


def threads_of(kernel: Any, *args: Any, shape: tuple[int, int]) -> set[tuple[int, ...]]:
    """The thread counts per base dim of the `shape` values of `kernel`'s plan."""
    lowered = kernel.compile(*args, target=90).lowered
    layouts = lowered.plan.layouts.layouts
    return {lay.base.threads for v, lay in layouts.items() if tuple(v.type.shape) == shape}


@ct.kernel(num_warps=4)
def scaled_rows(y: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """y = x / sum(|x|) over each row."""
    t = ct.load_tile_like(x, y)
    y.store(t / ct.sum(ct.abs(t), axis=1, keepdims=True))


@ct.kernel
def scaled_rows_auto(y: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """scaled_rows with the compiler's block size."""
    t = ct.load_tile_like(x, y)
    y.store(t / ct.sum(ct.abs(t), axis=1, keepdims=True))


@ct.kernel(num_warps=4)
def scaled_columns(y: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """y = x / sum(|x|) over each column of the tile."""
    t = ct.load_tile_like(x, y)
    y.store(t / ct.sum(ct.abs(t), axis=0, keepdims=True))


@ct.kernel(num_warps=4)
def scaled_both(y: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """y = x / (row max of |x|) / (column max of |x|)."""
    t = ct.load_tile_like(x, y)
    a = ct.abs(t)
    y.store(t / ct.max(a, axis=1, keepdims=True) / ct.max(a, axis=0, keepdims=True))


@pytest.mark.parametrize(("rows", "threads", "barriers"), [(4, (4, 32), 0), (8, (4, 32), 0),
                                                           (2, (2, 64), 1)])  # fmt: skip
def test_rows_reduced_within_their_warps(
    rng: np.random.Generator, rows: int, threads: tuple[int, int], barriers: int
) -> None:
    """4 warps: a warp a row where there are 4 rows or more (shuffles only: no shared memory,
    no barrier), two warps a row at 2 rows."""
    ct.set_backend("sim")
    x = rng.standard_normal((2 * rows, N)).astype(np.float32)
    y = ct.empty(x.shape).partition((rows, N))
    xt = ct.from_numpy(x)
    assert threads_of(scaled_rows, y, xt, shape=(rows, N)) == {threads}
    ptx = scaled_rows.ptx(y, xt, target=90)
    assert ptx.count("bar.sync") == barriers and (barriers > 0) == ("ld.shared" in ptx)
    (out, _) = scaled_rows(y, xt).sync()
    want = x / np.abs(x).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out.unpartition().to_numpy(), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("kernel", "reference"),
    [
        (scaled_columns, lambda x: x / np.abs(x).sum(axis=0, keepdims=True)),
        (scaled_both, lambda x: x / np.abs(x).max(axis=1, keepdims=True)
                              / np.abs(x).max(axis=0, keepdims=True)),
    ],
)  # fmt: skip
def test_tiles_reduced_along_columns_keep_threads_along_rows(
    rng: np.random.Generator, kernel: Any, reference: Any
) -> None:
    ct.set_backend("sim")
    x = rng.standard_normal((4, N)).astype(np.float32)
    y = ct.empty(x.shape).partition((4, N))
    xt = ct.from_numpy(x)
    assert threads_of(kernel, y, xt, shape=(4, N)) == {(1, 128)}
    (out, _) = kernel(y, xt).sync()
    np.testing.assert_allclose(out.unpartition().to_numpy(), reference(x), rtol=1e-5)


def elements_a_thread(kernel: Any, *args: Any, shape: tuple[int, int]) -> set[int]:
    lowered = kernel.compile(*args, target=90).lowered
    layouts = lowered.plan.layouts.layouts
    return {lay.count() for v, lay in layouts.items() if tuple(v.type.shape) == shape}


@pytest.mark.parametrize(
    ("kernel", "rows", "threads", "held"),
    [
        (scaled_rows, 3, (1, 128), 24),  # 2 warps a row: 2 row slots a thread, 32 elements
        (scaled_rows, 5, (1, 128), 40),  # a warp a row: 2 row slots a warp, 64 elements
        (scaled_rows, 6, (2, 64), 48),  # 2 warps a row, 3 rows each: no slot masked
        (scaled_rows, 7, (4, 32), 64),  # 8 slots for 7 rows: 8/7 the work, in-warp reductions
        (scaled_rows_auto, 12, (4, 64), 48),  # 256 threads: a warp a row would hold 64
    ],
)  # fmt: skip
def test_rows_that_fill_the_warps_unevenly_keep_the_work_a_thread(
    rng: np.random.Generator, kernel: Any, rows: int, threads: tuple[int, int], held: int
) -> None:
    """Rows that the warps do not divide keep warps off the row dim only where that adds at
    most 8/7 to the elements a thread (one masked row slot in 8): 5 rows of 1024 on 4 warps,
    a warp a row, held 64 elements a thread, not 40 (sm_90: 90 registers, not 70; 24.0 SASS
    an element, not 17.9)."""
    ct.set_backend("sim", target="sm_90")
    n = 1024
    x = rng.standard_normal((2 * rows, n)).astype(np.float32)
    y = ct.empty(x.shape).partition((rows, n))
    xt = ct.from_numpy(x)
    assert threads_of(kernel, y, xt, shape=(rows, n)) == {threads}
    assert elements_a_thread(kernel, y, xt, shape=(rows, n)) == {held}
    (out, _) = kernel(y, xt).sync()
    want = x / np.abs(x).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out.unpartition().to_numpy(), want, rtol=1e-5, atol=1e-7)


@ct.kernel(num_warps=4)
def centred_prefix(y: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """y = cumsum(x) down the rows of the tile, less each row's sum."""
    t = ct.load_tile_like(x, y)
    y.store(ct.cumsum(t, axis=0) - ct.sum(t, axis=1, keepdims=True))


def test_a_scan_down_the_rows_keeps_threads_along_the_row(rng: np.random.Generator) -> None:
    """A scan down the rows is a reduction across them: a warp a row would put the scan
    across the warps (2 rows of 1024: 3 barriers, not 1; sm_90 SASS an element 9.7 -> 14.8)."""
    ct.set_backend("sim", target="sm_90")
    x = rng.standard_normal((6, 1024)).astype(np.float32)
    y = ct.empty(x.shape).partition((2, 1024))
    xt = ct.from_numpy(x)
    assert threads_of(centred_prefix, y, xt, shape=(2, 1024)) == {(1, 128)}
    (out, _) = centred_prefix(y, xt).sync()
    tiles = x.reshape(3, 2, 1024)
    want = np.cumsum(tiles, axis=1) - tiles.sum(axis=2, keepdims=True)
    np.testing.assert_allclose(out.unpartition().to_numpy(), want.reshape(6, 1024), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


@ct.kernel(num_warps=4)
def reversed_rows(y: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """y = (x - each row's maximum), each row reversed, by a scatter."""
    t = ct.load_tile_like(x, y)
    s = t - ct.max(t, axis=1, keepdims=True)
    rows = ct.expand_dims(ct.arange(y.shape[0]), 1)
    cols = ct.expand_dims(y.shape[1] - 1 - ct.arange(y.shape[1]), 0)
    ct.scatter(y, (rows, cols), s)


@pytest.mark.parametrize(("rows", "n", "threads"), [(4, 512, (4, 32)), (2, 1024, (2, 64))])
def test_scatter_coordinates_share_the_row_layout(
    rng: np.random.Generator, rows: int, n: int, threads: tuple[int, int]
) -> None:
    """A scatter's coordinates take its value's layout: a row-reduced value's is not their
    canonical one, and each coordinate went through shared memory (2 rows of 1024: 5
    barriers, not 1; sm_90 SASS an element 23.2, not 14.6)."""
    ct.set_backend("sim", target="sm_90")
    x = rng.standard_normal((3 * rows, n)).astype(np.float32)
    y = ct.empty(x.shape).partition((rows, n))
    xt = ct.from_numpy(x)
    assert threads_of(reversed_rows, y, xt, shape=(rows, n)) == {threads}
    ptx = reversed_rows.ptx(y, xt, target=90)
    assert ptx.count("bar.sync") == (rows < 4)
    (out, _) = reversed_rows(y, xt).sync()
    want = (x - x.max(axis=1, keepdims=True))[:, ::-1]
    np.testing.assert_allclose(out.unpartition().to_numpy(), want, rtol=1e-6)
