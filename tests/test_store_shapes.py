"""A store takes a tile of exactly the destination's shape: a reduced tile that lost an axis,
a tile that would need broadcasting, or a scalar is a CompileError at the store's line that
says what to write instead, on every backend; a reduction's result broadcast back against its
source along the wrong axis is one too. The explicit forms compute what NumPy does."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

R = TypeVar("R")
C = TypeVar("C")


@pytest.fixture(params=["interpret", "sim"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(str(request.param))
    yield str(request.param)
    ct.set_backend("sim")


def line_of(fn: Any, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def launch_error(k: ct.Kernel, x: np.ndarray, tile: tuple[int, int]) -> ct.CompileError:
    """The CompileError of launching `k` over `x`, after which nothing stays borrowed."""
    z, xt = ct.zeros(x.shape).partition(tile), ct.from_numpy(x)
    with pytest.raises(ct.CompileError) as info:
        k(z, xt)
    z.unpartition().to_numpy()
    xt.to_numpy()
    return info.value


def run(k: ct.Kernel, x: np.ndarray, tile: tuple[int, int]) -> np.ndarray:
    z = ct.full(x.shape, np.nan, f32).partition(tile)
    out, _ = k(z, ct.from_numpy(x)).sync()
    return np.asarray(out.unpartition().to_numpy())


@ct.kernel
def k_row_sums(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(ct.sum(t, axis=1))  # forgot keepdims=True


@ct.kernel
def k_normalize_rows(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t / ct.sum(t, axis=1))  # forgot keepdims=True


@ct.kernel
def k_normalize_rows_kept(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t / ct.sum(t, axis=1, keepdims=True))


@ct.kernel
def k_normalize_columns(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t / ct.sum(t, axis=0))  # (C,) lines up with the columns it came from


@ct.kernel
def k_store_a_row(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(ct.max(t, axis=0, keepdims=True))


@ct.kernel
def k_store_a_row_broadcast(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(ct.broadcast_to(ct.max(t, axis=0, keepdims=True), z.shape))


@ct.kernel
def k_store_a_scalar(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    z.store(1.5)  # type: ignore[arg-type]


@ct.kernel
def k_sub_store_a_scalar(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    ct.store(z, (0, 0), ct.sum(ct.load_tile_like(x, z)))


@ct.kernel
def k_sub_store_row_sums(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    ct.store(z, (0, 0), ct.sum(t, axis=1))


@ct.kernel
def k_sub_store_row_sums_kept(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    for j in range(z.shape[1]):
        ct.store(z, (0, j), ct.sum(t, axis=1, keepdims=True))


STORE_ERRORS: list[tuple[ct.Kernel, str, tuple[int, int], str]] = [
    (
        k_row_sums,
        "z.store(ct.sum(t, axis=1))",
        (8, 8),
        "cannot store a tile of shape (8,) into 'z', whose tiles are (8, 8): a store takes a "
        "tile of exactly that shape; it lacks axis 0 or 1: keep a reduced axis with "
        "keepdims=True (ct.sum(t, axis=1, keepdims=True)), or repeat the tile along it with "
        "ct.broadcast_to(ct.expand_dims(tile, 1), (8, 8))",
    ),
    (
        k_row_sums,
        "z.store(ct.sum(t, axis=1))",
        (4, 8),
        "cannot store a tile of shape (4,) into 'z', whose tiles are (4, 8): a store takes a "
        "tile of exactly that shape; it lacks axis 1: keep a reduced axis with keepdims=True "
        "(ct.sum(t, axis=1, keepdims=True)), or repeat the tile along it with "
        "ct.broadcast_to(ct.expand_dims(tile, 1), (4, 8))",
    ),
    (
        k_normalize_rows,
        "z.store(t / ct.sum(t, axis=1))",
        (8, 8),
        "the (8,) result of ct.sum(..., axis=1) at line {line} is broadcast back against a "
        "(8, 8) tile along axis 1, not axis 0 where it came from (NumPy's rule, which mixes up "
        "rows here): keep the reduced axis with keepdims=True",
    ),
    (
        k_normalize_rows,
        "z.store(t / ct.sum(t, axis=1))",
        (4, 8),
        "tiles of shapes (4, 8) and (4,) cannot be broadcast together: the "
        "ct.sum(..., axis=1) at line {line} dropped its axis; keep it with keepdims=True",
    ),
    (
        k_store_a_row,
        "z.store(ct.max(",
        (4, 8),
        "cannot store a tile of shape (1, 8) into 'z', whose tiles are (4, 8): a store takes a "
        "tile of exactly that shape; to repeat it, broadcast it explicitly with "
        "ct.broadcast_to(tile, (4, 8))",
    ),
    (
        k_store_a_scalar,
        "z.store(1.5)",
        (4, 8),
        "z.store() takes a tile, not a scalar: fill one with ct.full(shape, value, ct.f32)",
    ),
    (
        k_sub_store_a_scalar,
        "ct.store(z, (0, 0)",
        (4, 8),
        "ct.store takes a tile, not a scalar: fill one with ct.full(shape, value, ct.f32)",
    ),
    (
        k_sub_store_row_sums,
        "ct.store(z, (0, 0)",
        (4, 8),
        "cannot store a rank-1 tile into 'z', which has rank 2: ct.store takes a tile of "
        "exactly the sub-tile's shape; if it comes from a reduction, keep the reduced axis with "
        "keepdims=True, or add the axis with ct.expand_dims(tile, axis)",
    ),
]


@pytest.mark.parametrize("kernel,needle,tile,message", STORE_ERRORS)
def test_a_store_of_another_shape_is_a_compile_error(
    backend: str,
    rng: np.random.Generator,
    kernel: ct.Kernel,
    needle: str,
    tile: tuple[int, int],
    message: str,
) -> None:
    x = rng.standard_normal((tile[0] * 2, tile[1])).astype(np.float32)
    err = launch_error(kernel, x, tile)
    line = line_of(kernel.fn, needle)
    assert err.message == message.format(line=line)
    assert err.where is not None and (err.where.file, err.where.line) == (__file__, line)
    assert needle in err.where.text


def test_the_silent_row_normalization_now_fails_at_ir_too() -> None:
    """Without a launch (`.ir`, `.ptx`) the same check applies."""
    args = (ct.PartitionSpec((16, 16), (16, 16)), ct.TensorSpec((16, 16)))
    with pytest.raises(ct.CompileError, match="keepdims=True"):
        k_normalize_rows.ir(*args)
    with pytest.raises(ct.CompileError, match="keepdims=True"):
        k_normalize_rows.ptx(*args)


KEPT: list[tuple[ct.Kernel, Callable[[np.ndarray], np.ndarray]]] = [
    (k_normalize_rows_kept, lambda t: t / t.sum(axis=1, keepdims=True)),
    (k_normalize_columns, lambda t: t / t.sum(axis=0)),
    (k_store_a_row_broadcast, lambda t: np.broadcast_to(t.max(axis=0, keepdims=True), t.shape)),
    (k_sub_store_row_sums_kept, lambda t: np.broadcast_to(t.sum(axis=1, keepdims=True), t.shape)),
]


@pytest.mark.parametrize("kernel,reference", KEPT)
def test_the_explicit_forms_compute_numpys_result(
    backend: str,
    rng: np.random.Generator,
    kernel: ct.Kernel,
    reference: Callable[[np.ndarray], np.ndarray],
) -> None:
    r = int(rng.integers(2, 9))
    tile = (r, r)  # square: where a misaligned broadcast would go unnoticed
    x = rng.uniform(0.5, 2.0, (r * 3, r * 2)).astype(np.float32)
    out = run(kernel, x, tile)
    blocks = [
        reference(x[i : i + r, j : j + r])
        for i in range(0, x.shape[0], r)
        for j in range(0, x.shape[1], r)
    ]
    want = np.block([blocks[k * 2 : k * 2 + 2] for k in range(3)])
    np.testing.assert_allclose(out, want, rtol=1e-5)
