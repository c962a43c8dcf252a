"""Transposing layout changes (`lower/emit_transpose`): a 2-D tile whose source layout holds
vectors along one dim and whose destination walks the other goes through shared memory as
whole vectors, on a tile staggered so that neither side's accesses conflict. Values against
NumPy on sim at ragged shapes (16-bit, f32, i32), the PTX's shared accesses, and the bank
conflicts the simulator measures."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, PartitionSpec, Tensor, TensorSpec
from cutile_py.ir.dtypes import round_to
from cutile_py_kernels import layout

T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C")
DTYPES = [pytest.param(d, id=d.name) for d in (ct.f32, ct.f16, ct.bf16, ct.i32)]
INTS = {ct.i32: np.int32, ct.i64: np.int64}


@ct.kernel
def tile_transpose(y: Mut[Tensor[T, R, C]], x: Tensor[T, Dyn, Dyn]) -> None:
    """Tile (i, j) of y is the transpose of tile (j, i) of x (tiles of any shape)."""
    t = ct.load(x, (ct.bid(1), ct.bid(0)), (y.shape[1], y.shape[0]))
    y.store(t.T)


@ct.kernel
def plus_transpose(y: Mut[Tensor[T, R, R]], x: Tensor[T, Dyn, Dyn]) -> None:
    """y's tile (i, j) = x's tile (i, j) + its transpose: one value in two layouts."""
    t = ct.load(x, (ct.bid(0), ct.bid(1)), y.shape)
    y.store(t + t.T)


def random(rng: np.random.Generator, shape: tuple[int, ...], dt: Any) -> np.ndarray:
    """Fresh values exactly representable in `dt` (as float32, or int32 for i32)."""
    if dt in INTS:
        info = np.iinfo(INTS[dt])
        return rng.integers(info.min, info.max, shape, dtype=INTS[dt])
    return round_to(rng.standard_normal(shape).astype(np.float32), dt)


@pytest.mark.parametrize("dt", [*DTYPES, pytest.param(ct.i64, id="i64")])
@pytest.mark.parametrize(
    "shape,tile",
    [((37, 70), (16, 8)), ((70, 37), (8, 32)), ((130, 100), (32, 64)), ((45, 200), (64, 16)),
     ((300, 77), (128, 128)), ((5, 9), (2, 64)), ((50, 90), (24, 40)), ((100, 100), (48, 48)),
     ((33, 17), (4, 2))],
)  # fmt: skip
def test_transpose_values(
    rng: np.random.Generator, dt: Any, shape: tuple[int, int], tile: tuple[int, int]
) -> None:
    """x (m, n) into y (n, m) tile by tile, at shapes no tile divides, against NumPy (i64:
    8-byte elements, vectors of 2)."""
    x = random(rng, shape, dt)
    y, _ = tile_transpose(ct.empty(shape[::-1], dt).partition(tile), ct.from_numpy(x, dt)).sync()
    np.testing.assert_array_equal(y.unpartition().to_numpy(), x.T)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape,tile", [((40, 24), 16), ((100, 70), 32), ((130, 130), 64)])
def test_value_plus_its_transpose(
    rng: np.random.Generator, dt: Any, shape: tuple[int, int], tile: int
) -> None:
    x = random(rng, shape, dt)
    y, _ = plus_transpose(ct.empty(shape, dt).partition((tile, tile)), ct.from_numpy(x, dt)).sync()
    want = np.zeros(shape, np.float64)
    for i in range(0, shape[0], tile):
        for j in range(0, shape[1], tile):
            a = np.zeros((tile, tile), np.float64)
            blk = x[i : i + tile, j : j + tile].astype(np.float64)
            a[: blk.shape[0], : blk.shape[1]] = blk
            s = a + a.T
            want[i : i + tile, j : j + tile] = s[: blk.shape[0], : blk.shape[1]]
    got = y.unpartition().to_numpy()
    if dt is ct.i32:  # wraps like int32 arithmetic
        np.testing.assert_array_equal(got, want.astype(np.int64).astype(np.int32))
    else:  # within one rounding of the sum to dt
        np.testing.assert_allclose(got, want, rtol={ct.f32: 2**-23, ct.f16: 2**-10}.get(dt, 2**-7))


def _shared_ops(ptx: str) -> list[str]:
    return re.findall(r"\b(?:st|ld)\.shared\.\S+", ptx)


@pytest.mark.parametrize("dt", [ct.f32, ct.f16, ct.bf16])
def test_library_transpose_stores_whole_vectors(dt: Any) -> None:
    """The library transpose writes each thread's 16-byte vector with one st.shared (not
    element by element) and reads elements back; no other shared accesses."""
    t = layout.transpose_tile(dt)
    ptx = layout._transpose_kernel(dt).ptx(
        PartitionSpec((1000, 1000), (t, t), dt), TensorSpec((1000, 1000), dt)
    )
    ops = _shared_ops(ptx)
    bits = 8 * dt.itemsize()
    assert set(ops) == {"st.shared.v4.b32", f"ld.shared.b{bits}"}, sorted(set(ops))
    # Every element is written once (as part of a vector) and read once.
    per_thread = t * t // 256
    assert ops.count("st.shared.v4.b32") * (16 // dt.itemsize()) == per_thread
    assert ops.count(f"ld.shared.b{bits}") == per_thread


@pytest.mark.parametrize("dt", [ct.f32, ct.f16, ct.bf16])
def test_library_transpose_bank_conflicts(dt: Any) -> None:
    """Measured on sim: the vector stores are conflict-free and the element reads at most
    2-way (16 lanes read 16 rows at one column; the stagger spreads them over 8 positions
    of 16 bytes). Before the staggered tile, 16-bit stores were 4-way."""
    t = layout.transpose_tile(dt)
    r = layout._transpose_kernel(dt).report(
        PartitionSpec((512, 512), (t, t), dt), TensorSpec((512, 512), dt), target="sm_90"
    )
    stores = [a.value for a in r.shared_accesses if a.text.lstrip().startswith("st.shared")]
    loads = [a.value for a in r.shared_accesses if a.text.lstrip().startswith("ld.shared")]
    assert stores and loads
    assert max(stores) == 1.0, stores
    assert max(loads) <= 2.0, loads
