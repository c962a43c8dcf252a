"""`ct.gather` and `ct.scatter`: element-indexed loads from shared tensors and stores into the
block's own tile, on sim (the compiled PTX) and interpret, against NumPy on random inputs;
misuses are CompileErrors at the kernel's line; the PTX assembles for sm_80 and sm_90."""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32, i32
from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available

B = TypeVar("B")
R = TypeVar("R")
C = TypeVar("C")
T = TypeVar("T")
BACKENDS = ["sim", "interpret"]
NP = {ct.f32: np.float32, ct.f16: np.float16, ct.i32: np.int32, ct.i64: np.int64}


@ct.kernel
def gather_1d(
    z: Mut[Tensor[T, B]], x: Tensor[T, Dyn], idx: Tensor[i32, Dyn], pad: ct.Constant[float]
) -> None:
    z.store(ct.gather(x, ct.load_tile_like(idx, z), padding=pad))


@ct.kernel
def gather_rows(
    z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn], rows: Tensor[i32, Dyn]
) -> None:
    """z = x[rows[block rows], block columns]: a tuple of a column and a row of indices."""
    r = ct.load(rows, (ct.bid(0),), (z.shape[0],), padding=-1)
    cols = ct.arange(z.shape[1], i32) + ct.bid(1) * z.shape[1]
    z.store(ct.gather(x, (ct.expand_dims(r, 1), ct.expand_dims(cols, 0)), padding=7.0))


@ct.kernel
def gather_column(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn, Dyn], col: int) -> None:
    """z = x[block rows, col]: an int scalar index broadcasts against the row tile."""
    rows = ct.arange(z.shape[0], i32) + ct.bid(0) * z.shape[0]
    z.store(ct.gather(x, (rows, col)))


@ct.kernel
def gather_window(z: Mut[Tensor[T, B]], x: Tensor[T, Dyn], off: int) -> None:
    """z = x[start + off + arange]: a sliding window, whose indices step by one (vector loads
    where a run is aligned and inside x, element loads elsewhere)."""
    i = ct.arange(z.shape[0], i32) + ct.bid(0) * z.shape[0] + off
    z.store(ct.gather(x, i, padding=-2.0))


@ct.kernel
def gather_diagonal(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """z[i, j] = x[j, j]: the row index is an arange reshaped from a column into a row, so it
    varies along the last dim (no vector loads, though the column index steps by one)."""
    j = ct.arange(z.shape[1], i32)
    rows = ct.broadcast_to(ct.expand_dims(j, 1).reshape((1, z.shape[1])), z.shape)
    cols = ct.broadcast_to(ct.expand_dims(j, 0), z.shape)
    z.store(ct.gather(x, (rows, cols)))


@ct.kernel
def scatter_perm(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], perm: Tensor[i32, Dyn]) -> None:
    """Within each block's tile: z[perm[i]] = x[i] (perm counts from the tile's origin; past
    the end of `perm`, -1: a target outside the tile, dropped)."""
    p = ct.load(perm, ct.bid(0), z.shape, padding=-1)
    ct.scatter(z, p, ct.load_tile_like(x, z))


@ct.kernel
def scatter_transpose(z: Mut[Tensor[f32, R, R]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """Each square tile transposed in place: tile[j, i] = x's tile[i, j]."""
    t = ct.load_tile_like(x, z)
    i = ct.expand_dims(ct.arange(z.shape[0], i32), 1)
    j = ct.expand_dims(ct.arange(z.shape[1], i32), 0)
    ct.scatter(z, (j, i), t)


@ct.kernel
def scatter_shift(z: Mut[Tensor[T, R, C]], x: Tensor[T, Dyn, Dyn], shift: int) -> None:
    """Each tile's columns moved right by `shift` (those pushed out of the tile dropped): the
    column index steps by one, so runs that are aligned and inside store as vectors."""
    z.store(ct.full(z.shape, -7, z.dtype))
    rows = ct.expand_dims(ct.arange(z.shape[0], i32), 1)
    cols = ct.expand_dims(ct.arange(z.shape[1], i32), 0) + shift
    ct.scatter(z, (rows, cols), ct.load_tile_like(x, z))


@ct.kernel
def scatter_fill(z: Mut[Tensor[i32, B]], where: Tensor[i32, Dyn]) -> None:
    """z = 0, then 5 at the listed offsets of the tile (a number as the values): the scatter
    is ordered after the store, though other threads hold those elements."""
    z.store(ct.zeros(z.shape, i32))
    ct.scatter(z, ct.load(where, ct.bid(0), z.shape, padding=-1), 5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [ct.f32, ct.f16, ct.i32, ct.i64], ids=lambda d: d.name)
def test_gather_1d_reads_padding_outside(
    backend: str, dt: type[ct.DType], rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    n, m = int(rng.integers(50, 3000)), int(rng.integers(1, 2000))
    xs = (rng.standard_normal(n) * 100).astype(NP[dt])
    idx = rng.integers(-n // 4, n + n // 4, m).astype(np.int32)
    idx[: min(m, 4)] = [-1, n, -(2**31), 2**31 - 1][: min(m, 4)]
    z, _, _, _ = gather_1d(
        ct.empty((m,), dt).partition(256), ct.from_numpy(xs), ct.from_numpy(idx), -3.0
    ).sync()
    inside = (idx >= 0) & (idx < n)
    want = np.where(inside, xs[np.clip(idx, 0, n - 1)], NP[dt](-3))
    np.testing.assert_array_equal(z.unpartition().to_numpy(), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_with_a_tuple_of_broadcast_index_tiles(
    backend: str, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    n, d, m = int(rng.integers(5, 80)), int(rng.integers(3, 100)), int(rng.integers(1, 90))
    x = rng.standard_normal((n, d)).astype(np.float32)
    rows = rng.integers(-2, n + 2, m).astype(np.int32)
    z, _, _ = gather_rows(
        ct.empty((m, d), f32).partition((16, 32)), ct.from_numpy(x), ct.from_numpy(rows)
    ).sync()
    want = np.where(((rows >= 0) & (rows < n))[:, None], x[np.clip(rows, 0, n - 1)], np.float32(7))
    np.testing.assert_array_equal(z.unpartition().to_numpy(), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_with_an_int_index(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    n, d = int(rng.integers(1, 600)), int(rng.integers(1, 9))
    x = rng.standard_normal((n, d)).astype(np.float32)
    col = int(rng.integers(0, d))
    z, _, _ = gather_column(ct.empty((n,), f32).partition(128), ct.from_numpy(x), col).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), x[:, col])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [ct.f32, ct.f16, ct.i64], ids=lambda d: d.name)
def test_gather_of_consecutive_indices_any_alignment(
    backend: str, dt: type[ct.DType], rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    n, m = int(rng.integers(1, 3000)), int(rng.integers(1, 3000))
    x = (rng.standard_normal(n) * 100).astype(NP[dt])
    for off in (0, int(rng.integers(-9, 10)), int(rng.integers(-n - 5, n + 5))):
        z, _, _ = gather_window(ct.empty((m,), dt).partition(512), ct.from_numpy(x), off).sync()
        i = np.arange(m) + off
        want = np.where((i >= 0) & (i < n), x[np.clip(i, 0, n - 1)], NP[dt](-2))
        np.testing.assert_array_equal(z.unpartition().to_numpy(), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_of_a_reshaped_index_is_not_taken_for_consecutive(
    backend: str, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    z, _ = gather_diagonal(ct.empty((8, 64), f32).partition((8, 64)), ct.from_numpy(x)).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), np.tile(np.diag(x), (8, 1)))


def test_consecutive_indices_load_vectors_and_loaded_indices_do_not() -> None:
    spec = (ct.PartitionSpec((4096,), (512,)), ct.TensorSpec((4096,)))
    assert "ld.global.nc.v4.f32" in gather_window.ptx(*spec, 3)
    idx = ct.TensorSpec((4096,), i32)
    assert "ld.global.nc.v4.f32" not in gather_1d.ptx(*spec, idx, 0.0)
    rows = gather_rows.ptx(ct.PartitionSpec((64, 64), (16, 32)), ct.TensorSpec((9, 64)), idx)
    assert "ld.global.nc.v4.f32" in rows  # the column index steps by one, the row's stays


@pytest.mark.parametrize("backend", BACKENDS)
def test_scatter_permutes_within_each_tile_and_drops_outside(
    backend: str, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    tile, n = 128, int(rng.integers(1, 1000))
    xs = rng.standard_normal(n).astype(np.float32)
    blocks = -(-n // tile)
    perm = np.concatenate([rng.permutation(tile) for _ in range(blocks)]).astype(np.int32)
    # some targets leave the tile (dropped): negative, and one past its end
    drop = rng.random(perm.size) < 0.1
    perm[drop] = rng.choice([-1, tile, 5 * tile, -(2**31)], int(drop.sum()))
    perm = perm[:n]
    z = ct.from_numpy(np.full(n, 42, np.float32)).partition(tile)
    z, _, _ = scatter_perm(z, ct.from_numpy(xs), ct.from_numpy(perm)).sync()
    want = np.full(n, 42, np.float32)
    for i in range(n):
        b = i // tile
        dst = perm[i]
        if 0 <= dst < tile and b * tile + dst < n:
            want[b * tile + dst] = xs[i]
    np.testing.assert_array_equal(z.unpartition().to_numpy(), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_scatter_coordinates_with_different_values_are_a_race(
    backend: str, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    tile, blocks = 128, int(rng.integers(1, 5))
    n = tile * blocks
    xs = rng.standard_normal(n).astype(np.float32)
    perm = np.concatenate([rng.permutation(tile) for _ in range(blocks)]).astype(np.int32)
    b = int(rng.integers(0, blocks))
    perm[b * tile : (b + 1) * tile] = rng.integers(0, tile)  # the whole tile onto one element
    z = ct.empty((n,), f32).partition(tile)
    with pytest.raises(ct.LaunchError, match="global-memory race") as info:
        scatter_perm(z, ct.from_numpy(xs), ct.from_numpy(perm)).sync()
    msg = str(info.value)
    assert "kernel scatter_perm" in msg and f"block ({b}, 0, 0)" in msg
    if backend == "interpret":  # the simulator names the PTX line instead
        assert f"line {_line(scatter_perm.fn, 'ct.scatter(z')}" in msg


def test_repeated_scatter_coordinates_with_equal_values_are_kept_on_interpret(
    rng: np.random.Generator,
) -> None:
    ct.set_backend("interpret")
    n = int(rng.integers(1, 300))
    xs = np.full(n, rng.standard_normal(), np.float32)
    perm = np.zeros(n, np.int32)  # every element of each tile onto its first
    z = ct.from_numpy(np.full(n, 42, np.float32)).partition(128)
    z, _, _ = scatter_perm(z, ct.from_numpy(xs), ct.from_numpy(perm)).sync()
    want = np.full(n, 42, np.float32)
    want[::128] = xs[0]
    np.testing.assert_array_equal(z.unpartition().to_numpy(), want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [ct.f32, ct.f16], ids=lambda d: d.name)
def test_scatter_of_consecutive_indices_any_shift(
    backend: str, dt: type[ct.DType], rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    r, c = int(rng.integers(1, 40)), int(rng.integers(1, 300))
    x = (rng.standard_normal((r, c)) * 100).astype(NP[dt])
    for shift in (0, int(rng.integers(-5, 6)), int(rng.integers(-70, 70))):
        z = ct.empty((r, c), dt).partition((8, 64))
        z, _, _ = scatter_shift(z, ct.from_numpy(x), shift).sync()
        want = np.full((r, c), -7, NP[dt])
        for j in range(-(-c // 64) * 64):  # the last tile's columns past c load as 0
            tj, dst = divmod(j, 64)
            dst += shift
            if 0 <= dst < 64 and tj * 64 + dst < c:
                want[:, tj * 64 + dst] = x[:, j] if j < c else 0
        np.testing.assert_array_equal(z.unpartition().to_numpy(), want)
    assert "st.global.v4.f32" in scatter_shift.ptx(
        ct.PartitionSpec((64, 256), (8, 64)), ct.TensorSpec((64, 256)), 1
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_scatter_in_two_dims(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    n = 32 * int(rng.integers(1, 4))
    x = rng.standard_normal((n, n)).astype(np.float32)
    z, _ = scatter_transpose(ct.empty((n, n), f32).partition((32, 32)), ct.from_numpy(x)).sync()
    want = x.reshape(n // 32, 32, n // 32, 32).transpose(0, 3, 2, 1).reshape(n, n)
    np.testing.assert_array_equal(z.unpartition().to_numpy(), want)


@ct.kernel
def scalar_indexed(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], at: int) -> None:
    """z = x + x[at] (a gather of one element: a scalar), then z[3] = -1.5 and z[at % size]
    = x[0] in each tile (scatters of one element, all-scalar indices and values)."""
    z.store(ct.load_tile_like(x, z) + ct.gather(x, at))
    ct.scatter(z, 3, -1.5)
    ct.scatter(z, at % z.shape[0], ct.gather(x, 0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_scalar_gather_and_scatter(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    n, tile = int(rng.integers(1, 1000)), 64
    xs = rng.standard_normal(n).astype(np.float32)
    at = int(rng.integers(4, 64))
    z, _, _ = scalar_indexed(ct.empty((n,), f32).partition(tile), ct.from_numpy(xs), at).sync()
    pad = np.append(xs, np.zeros(-(-n // tile) * tile - n, np.float32))
    want = pad + (xs[at] if at < n else np.float32(0))
    want[3::tile] = -1.5
    want[at::tile] = xs[0]
    np.testing.assert_array_equal(z.unpartition().to_numpy(), want[:n])


@pytest.mark.parametrize("backend", BACKENDS)
def test_scatter_of_a_number(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    n = int(rng.integers(1, 500))
    where = np.concatenate([rng.permutation(64) for _ in range(-(-n // 64))])[:n]
    where = np.where(rng.random(n) < 0.5, where, -1).astype(np.int32)
    z, _ = scatter_fill(ct.empty((n,), i32).partition(64), ct.from_numpy(where)).sync()
    want = np.zeros(n, np.int32)
    for i in range(n):
        dst = (i // 64) * 64 + where[i]
        if where[i] >= 0 and dst < n:
            want[dst] = 5
    np.testing.assert_array_equal(z.unpartition().to_numpy(), want)


@pytest.mark.skipif(not nvjitlink_available(), reason="nvJitLink cannot be loaded")
@pytest.mark.parametrize("sm", [80, 90])
def test_gather_and_scatter_ptx_assembles(sm: int) -> None:
    target = ct.Target(sm)
    cases: list[tuple[ct.Kernel, tuple[Any, ...]]] = [
        (
            gather_1d,
            (
                ct.PartitionSpec((999,), (256,), ct.f16),
                ct.TensorSpec((99,), ct.f16),
                ct.TensorSpec((999,), i32),
                0.0,
            ),
        ),
        (
            gather_rows,
            (
                ct.PartitionSpec((64, 64), (16, 32)),
                ct.TensorSpec((9, 64)),
                ct.TensorSpec((64,), i32),
            ),
        ),
        (
            scatter_perm,
            (ct.PartitionSpec((999,), (128,)), ct.TensorSpec((999,)), ct.TensorSpec((999,), i32)),
        ),
        (scatter_transpose, (ct.PartitionSpec((64, 64), (32, 32)), ct.TensorSpec((64, 64)))),
    ]
    shifted = (ct.PartitionSpec((64, 256), (8, 64), ct.f16), ct.TensorSpec((64, 256), ct.f16), 1)
    cases.append((scatter_shift, shifted))
    cases.append(
        (gather_window, (ct.PartitionSpec((999,), (512,), ct.f16), ct.TensorSpec((99,), ct.f16), 3))
    )
    for kernel, args in cases:
        report = assemble(kernel.ptx(*args, target=target), target)
        assert report.spill_free


# -- misuse ---------------------------------------------------------------------------------
def k_float_index(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(ct.gather(x, t))


def k_gather_from_mut(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.gather(z, ct.arange(z.shape[0], i32)))


def k_scatter_into_shared(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    ct.scatter(x, ct.arange(z.shape[0], i32), ct.load_tile_like(x, z))


def k_rank_mismatch(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    i = ct.arange(z.shape[0], i32)
    z.store(ct.gather(x, (i, i)))


def k_scatter_dtype(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    i = ct.arange(z.shape[0], i32)
    ct.scatter(z, i, i)


def _line(fn: Any, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(k for k, line in enumerate(lines) if text in line)


@pytest.mark.parametrize(
    ("fn", "text", "message"),
    [
        (
            k_float_index,
            "ct.gather(x, t)",
            "ct.gather: index 0 into 'x' is an f32 tile; indices are int32",
        ),
        (k_gather_from_mut, "ct.gather(z", "ct.gather reads a shared Tensor parameter; 'z' is Mut"),
        (
            k_scatter_into_shared,
            "ct.scatter(x",
            "ct.scatter writes only this block's own tile of a Mut parameter; 'x' is a shared",
        ),
        (
            k_rank_mismatch,
            "(i, i)",
            "ct.gather: the tensor has rank 1: give 1 index tile (a tuple, one per dim), not 2",
        ),
        (k_scatter_dtype, "ct.scatter(z", "ct.scatter: the values are i32 but 'z' holds f32"),
    ],
    ids=lambda v: getattr(v, "__name__", None) or "",
)
def test_misuse_is_a_compile_error_at_the_line(fn: Any, text: str, message: str) -> None:
    kernel = ct.kernel(fn)
    for backend in BACKENDS:
        ct.set_backend(backend)
        with pytest.raises(ct.CompileError) as info:
            kernel(ct.zeros((64,)).partition(32), ct.zeros((64,))).sync()
        msg = str(info.value)
        assert message in msg
        assert f"line {_line(fn, text)}" in msg
