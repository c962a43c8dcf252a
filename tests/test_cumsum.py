"""`ct.cumsum(tile, axis)`: inclusive prefix sums on sim (warp shuffles, then shared memory
across warps) and interpret, against NumPy on random inputs, for every layout shape the
scanned axis can take (within one thread, one warp, several warps, repeated), and dtypes."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32, i32
from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available

A = TypeVar("A")
R = TypeVar("R")
C = TypeVar("C")
T = TypeVar("T")
BACKENDS = ["sim", "interpret"]


@ct.kernel
def cumsum_1d(z: Mut[Tensor[T, A]], x: Tensor[T, Dyn]) -> None:
    z.store(ct.cumsum(ct.load_tile_like(x, z), 0))


@ct.kernel
def cumsum_2d(z: Mut[Tensor[T, R, C]], x: Tensor[T, Dyn, Dyn], axis: ct.Constant[int]) -> None:
    z.store(ct.cumsum(ct.load_tile_like(x, z), axis))


@ct.kernel
def cumsum_3d(
    z: Mut[Tensor[f32, A, R, C]], x: Tensor[f32, Dyn, Dyn, Dyn], axis: ct.Constant[int]
) -> None:
    z.store(ct.cumsum(ct.load_tile_like(x, z), axis))


@ct.kernel
def cumsum_of_row_sums(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """Prefix sums down a column of row sums (a layout replicated along the reduced dim)."""
    s = ct.sum(ct.load(x, (ct.bid(0), 0), (z.shape[0], 64)), axis=1, keepdims=True)
    z.store(ct.cumsum(s, 0))


@ct.kernel
def cumsum_transposed(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """z = cumsum(x_tile.T, 1): the scanned axis is the loaded tile's slow one."""
    t = ct.load(x, (ct.bid(1), ct.bid(0)), (z.shape[1], z.shape[0]))
    z.store(ct.cumsum(ct.permute(t, (1, 0)), 1))


def _tiles_cumsum(x: np.ndarray, tile: tuple[int, ...], axis: int) -> np.ndarray:
    """NumPy's cumsum within each tile of `x` (in f64 for floats, then rounded)."""
    out = np.empty_like(x)
    grid = [range(0, n, t) for n, t in zip(x.shape, tile)]
    for origin in np.ndindex(*(len(g) for g in grid)):
        sl = tuple(slice(g[o], g[o] + t) for g, o, t in zip(grid, origin, tile))
        part = x[sl]
        acc = np.cumsum(part.astype(np.float64) if part.dtype.kind == "f" else part, axis=axis)
        out[sl] = acc.astype(x.dtype)
    return out


def _check(got: np.ndarray, x: np.ndarray, tile: tuple[int, ...], axis: int) -> None:
    want = _tiles_cumsum(x, tile, axis)
    if x.dtype.kind == "f":
        # f32 additions in a tree of depth about log2(n) + 2: each prefix is within that many
        # f32 roundings of the prefix of |x| (the scale of the sum).
        scale = _tiles_cumsum(np.abs(x).astype(np.float64), tile, axis)
        steps = np.log2(max(tile[axis], 2)) + 2
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        assert np.all(err <= steps * 2.0**-23 * scale)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tile", [1, 3, 32, 100, 256, 1024, 4096])
def test_cumsum_1d_f32(backend: str, tile: int, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    n = int(rng.integers(1, 3 * tile + 2))
    x = rng.standard_normal(n).astype(np.float32)
    z, _ = cumsum_1d(ct.empty((n,), f32).partition(tile), ct.from_numpy(x)).sync()
    _check(z.unpartition().to_numpy(), x, (tile,), 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [ct.i32, ct.i64], ids=lambda d: d.name)
def test_cumsum_integers_exact_and_wrapping(
    backend: str, dt: type[ct.DType], rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    npdt = np.int32 if dt is ct.i32 else np.int64
    info = np.iinfo(npdt)
    n = int(rng.integers(1, 2000))
    x = rng.integers(info.min // 4, info.max // 4, n, dtype=npdt)  # sums wrap around
    z, _ = cumsum_1d(ct.empty((n,), dt).partition(512), ct.from_numpy(x)).sync()
    _check(z.unpartition().to_numpy(), x, (512,), 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("tile", "axis"),
    [
        ((8, 1024), 1),
        ((64, 64), 0),
        ((64, 64), 1),
        ((256, 8), 0),
        ((3, 100), 1),
        ((1, 128), 0),
        ((128, 2), 0),
        ((16, 16), 0),
    ],
)
def test_cumsum_2d_each_axis(
    backend: str, tile: tuple[int, int], axis: int, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    shape = (int(rng.integers(1, 2 * tile[0] + 1)), int(rng.integers(1, 2 * tile[1] + 1)))
    x = rng.standard_normal(shape).astype(np.float32)
    z, _, _ = cumsum_2d(ct.empty(shape, f32).partition(tile), ct.from_numpy(x), axis).sync()
    _check(z.unpartition().to_numpy(), x, tile, axis)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [ct.f16, ct.bf16], ids=lambda d: d.name)
def test_cumsum_16_bit_floats_accumulate_in_f32(
    backend: str, dt: type[ct.DType], rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    x = ct.from_numpy(rng.standard_normal((20, 300)).astype(np.float32), dt)
    exact = np.cumsum(x.to_numpy().astype(np.float64), axis=1)
    z, _, _ = cumsum_2d(ct.empty((20, 300), dt).partition((4, 300)), x, 1).sync()
    got = z.unpartition().to_numpy().astype(np.float64)
    half_ulp = 2.0**-11 if dt is ct.f16 else 2.0**-8  # one rounding of the f32 sum
    scale = np.cumsum(np.abs(x.to_numpy().astype(np.float64)), axis=1)
    assert np.all(np.abs(got - exact) <= half_ulp * np.abs(exact) + 1e-5 * scale)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_cumsum_3d(backend: str, axis: int, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    tile = (4, 8, 32)
    x = rng.integers(-9, 9, (6, 9, 40)).astype(np.float32)  # exact in any order
    z, _, _ = cumsum_3d(ct.empty(x.shape, f32).partition(tile), ct.from_numpy(x), axis).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), _tiles_cumsum(x, tile, axis))


@pytest.mark.parametrize("backend", BACKENDS)
def test_cumsum_of_a_reduction_and_of_a_permuted_tile(
    backend: str, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    x = rng.integers(-9, 9, (200, 64)).astype(np.float32)
    z, _ = cumsum_of_row_sums(ct.empty((200, 1), f32).partition((64, 1)), ct.from_numpy(x)).sync()
    np.testing.assert_array_equal(
        z.unpartition().to_numpy(), _tiles_cumsum(x.sum(1, keepdims=True), (64, 1), 0)
    )
    y = rng.integers(-9, 9, (48, 40)).astype(np.float32)
    z, _ = cumsum_transposed(ct.empty((40, 48), f32).partition((8, 16)), ct.from_numpy(y)).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), _tiles_cumsum(y.T.copy(), (8, 16), 1))


def test_cumsum_of_a_bool_tile_is_a_compile_error() -> None:
    def k(z: Mut[Tensor[i32, A]], x: Tensor[f32, Dyn]) -> None:
        z.store(ct.cumsum(ct.load_tile_like(x, z) > 0, 0).astype(i32))

    with pytest.raises(ct.CompileError, match=r"ct\.cumsum of a bool tile: convert it"):
        ct.kernel(k).ir(ct.PartitionSpec((64,), (32,), i32), ct.TensorSpec((64,)))


def test_cumsum_axis_out_of_range_is_a_compile_error() -> None:
    def k(z: Mut[Tensor[f32, A]], x: Tensor[f32, Dyn]) -> None:
        z.store(ct.cumsum(ct.load_tile_like(x, z), 1))

    with pytest.raises(
        ct.CompileError, match=r"ct.cumsum: axis must be a constant in \[-1, 1\), got 1"
    ):
        ct.kernel(k).ir(ct.PartitionSpec((64,), (32,)), ct.TensorSpec((64,)))


@pytest.mark.skipif(not nvjitlink_available(), reason="nvJitLink cannot be loaded")
@pytest.mark.parametrize("sm", [80, 90])
def test_cumsum_ptx_assembles(sm: int) -> None:
    target = ct.Target(sm)
    for tile, axis, dt in [((8, 1024), 1, f32), ((64, 64), 0, ct.i64), ((16, 16), 1, ct.f16)]:
        args = (ct.PartitionSpec((64, 2048), tile, dt), ct.TensorSpec((64, 2048), dt), axis)
        report = assemble(cumsum_2d.ptx(*args, target=target), target)
        assert report.spill_free
