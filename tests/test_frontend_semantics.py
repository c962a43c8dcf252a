"""Edge cases of the kernel language where the compiled code and the interpreter must agree
with each other and with NumPy: constants, padding, tile indices, scalars through branches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32, i32

B = TypeVar("B")


@pytest.fixture(params=["sim", "interpret"])
def backend(request: pytest.FixtureRequest) -> str:
    ct.set_backend(request.param)
    return str(request.param)


def out_of(kernel: ct.Kernel, n: int, tile: int, dtype: Any, *args: Any) -> np.ndarray:
    z = kernel(ct.zeros(n, dtype).partition(tile), *args).sync()[0]
    return z.unpartition().to_numpy()  # type: ignore[no-any-return]


@ct.kernel
def saturating_constants(z: Mut[Tensor[i32, B]], x: Tensor[i32, Dyn]) -> None:
    t = ct.load(x, (ct.bid(0),), z.shape, padding=1e10)  # out of i32 range: saturates
    z.store(t + ct.full(z.shape, -3e9, i32) // 1048576)


def test_float_constants_convert_to_int_like_a_cast(backend: str) -> None:
    x = np.arange(10, dtype=np.int32)
    out = out_of(saturating_constants, 12, 4, i32, ct.from_numpy(x))
    pad = np.full(12, np.iinfo(np.int32).max, np.int64)
    pad[:10] = x
    expected = (pad + (np.int64(-(2**31)) // 2**20)).astype(np.int32)
    np.testing.assert_array_equal(out, expected)


@ct.kernel
def far_tile(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], offset: int) -> None:
    z.store(ct.load(x, (ct.bid(0) + offset,), z.shape, padding=7.0))


@pytest.mark.parametrize("offset", [2**30, -(2**30), -5, 2**31 - 1])
def test_tile_index_far_outside_reads_padding(backend: str, offset: int) -> None:
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(out_of(far_tile, 8, 4, f32, ct.from_numpy(x), offset), 7.0)


@ct.kernel
def count_tiles(z: Mut[Tensor[i32, B]]) -> None:
    z.store(ct.full(z.shape, ct.num_tiles(z, 0, 3) * 100 + ct.cdiv(z.shape[0], 2), i32))


def test_num_tiles_of_a_partition_counts_over_the_whole_tensor(backend: str) -> None:
    # The tensor has 10 elements in tiles of 4: num_tiles(z, 0, 3) = cdiv(10, 3) = 4.
    np.testing.assert_array_equal(out_of(count_tiles, 10, 4, i32), np.full(10, 402))


@ct.kernel
def merged_scalars(z: Mut[Tensor[f32, B]], t: int, n: int) -> None:
    if ct.bid(0) < t:  # noqa: SIM108 (a branch on a run-time scalar is what is tested)
        s = 1
    else:
        s = 2.5
    acc = 0.0
    for _ in range(n):
        acc = acc + 0.75
    z.store(ct.full(z.shape, s + acc, f32))


def test_python_numbers_merge_by_promotion(backend: str) -> None:
    out = out_of(merged_scalars, 8, 4, f32, 1, 2)
    np.testing.assert_array_equal(out, [2.5] * 4 + [4.0] * 4)


@ct.function
def typevar_tile(value: float) -> ct.Tile:
    return ct.full((B,), value, f32)


@ct.kernel
def helper_with_typevar(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(typevar_tile(2.0) * ct.load(x, ct.bid(0), B))


def test_helpers_may_name_typevars_and_int_index_shape(backend: str) -> None:
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(out_of(helper_with_typevar, 8, 4, f32, ct.from_numpy(x)), 2 * x)


@ct.kernel
def where_static(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.where(True, ct.load_tile_like(x, z), 0.5) + ct.where(False, 1.0, 0.25))


def test_where_with_a_constant_condition(backend: str) -> None:
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(out_of(where_static, 8, 4, f32, ct.from_numpy(x)), x + 0.25)


@ct.kernel
def counted_down(z: Mut[Tensor[i32, B]], n: int) -> None:
    acc = ct.zeros(z.shape, i32)
    for i in range(n, 0, -2):
        acc = acc * 10 + i
    z.store(acc + len(z.shape))


def test_range_with_a_negative_step_and_len(backend: str) -> None:
    np.testing.assert_array_equal(out_of(counted_down, 4, 4, i32, 5), np.full(4, 531 + 1))


@ct.kernel
def iota(z: Mut[Tensor[i32, B]]) -> None:
    z.store(ct.arange(z.shape[0]) + ct.bid(0) * z.shape[0])


def test_arange_inside_a_kernel(backend: str) -> None:
    np.testing.assert_array_equal(out_of(iota, 37, 16, i32), np.arange(37))


def k_loop_var_after_loop(z: Mut[Tensor[f32, B]], n: int) -> None:
    i = 100
    for i in range(n):  # noqa: B007
        pass
    z.store(ct.full(z.shape, i, f32))


def k_float_into_int_through_loop(z: Mut[Tensor[f32, B]], n: int) -> None:
    s = 0
    for _ in range(n):
        s = 0.75
    z.store(ct.full(z.shape, s, f32))


def k_negate_a_tensor(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(-x)  # type: ignore[operator]


N = ct.PartitionSpec((8,), (4,))


@pytest.mark.parametrize(
    "fn,args,message",
    [
        (k_loop_var_after_loop, (N, 3), "the loop variable 'i' cannot be read after its loop"),
        (k_float_into_int_through_loop, (N, 3), "variable 's' is i32 on one path but 0.75"),
        (k_negate_a_tensor, (N, ct.TensorSpec((8,))), "cannot apply to tensor parameter 'x'"),
    ],
)
def test_ambiguous_code_is_a_compile_error(
    fn: Callable[..., Any], args: tuple[Any, ...], message: str
) -> None:
    with pytest.raises(ct.CompileError, match=message):
        ct.kernel(fn).ir(*args)


@ct.kernel
def to_i64(z: Mut[Tensor[ct.i64, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z).astype(ct.i64))


@ct.kernel
def to_i32(z: Mut[Tensor[i32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z).astype(i32))


def test_float_to_int_truncates_saturates_and_sends_nan_to_zero(backend: str) -> None:
    """One rule for every integer width on every backend (PTX's cvt gives MININT for NaN into
    64 bits but 0 into 32; the compiled code corrects the 64-bit case)."""
    rng = np.random.default_rng()
    special = [np.nan, -np.nan, np.inf, -np.inf, 3e10, -3e10, 1e20, -1e20, 2.5, -2.5, 0.0, -0.0]
    x = np.concatenate([special, rng.standard_normal(20) * 1e3]).astype(np.float32)
    for kernel, dt, info in (
        (to_i64, ct.i64, np.iinfo(np.int64)),
        (to_i32, i32, np.iinfo(np.int32)),
    ):
        expected = [
            0
            if np.isnan(v)
            else max(info.min, min(info.max, int(v)))
            if np.isfinite(v)
            else info.max
            if v > 0
            else info.min
            for v in x.astype(np.float64)
        ]
        got = out_of(kernel, x.size, 8, dt, ct.from_numpy(x))
        np.testing.assert_array_equal(got, np.array(expected, dtype=info.dtype))
