"""Element-wise kernels against NumPy on the interpreter, and their PTX through nvJitLink."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.ir.dtypes import round_to
from cutile_py.runtime.nvjitlink import assemble
from tests.support import elementwise_kernels as K


@pytest.fixture(params=["sim", "interpret", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest) -> str:
    """Each kernel test runs on the simulator (the compiled PTX), on the interpreter and,
    where a GPU is found, on cuda."""
    ct.set_backend(request.param)
    return str(request.param)


def run(
    kernel: Any, out_shape: tuple[int, ...], tile: tuple[int, ...], dtype: Any, *args: Any
) -> np.ndarray:
    """Launch with a fresh (poisoned) output partition and return the output as NumPy."""
    poison = ct.full(out_shape, 12345 if not dtype.is_float() else np.nan, dtype)
    result = kernel(poison.partition(tile), *args).sync()
    return result[0].unpartition().to_numpy()


def f32s(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("n,tile", [(1, 128), (1000, 128), (4099, 1024), (777, 96)])
def test_add(backend: str, rng: np.random.Generator, n: int, tile: int) -> None:
    x, y = f32s(rng, n), f32s(rng, n)
    out = run(K.add, (n,), (tile,), ct.f32, ct.from_numpy(x), ct.from_numpy(y))
    np.testing.assert_array_equal(out, x + y)


def test_saxpy_scalar_non_divisible(backend: str, rng: np.random.Generator) -> None:
    n, a = 10_007, float(rng.uniform(-3, 3))
    x, y = f32s(rng, n), f32s(rng, n)
    out = run(K.saxpy, (n,), (1024,), ct.f32, a, ct.from_numpy(x), ct.from_numpy(y))
    np.testing.assert_array_equal(out, np.float32(a) * x + y)


def test_gelu_tanh(backend: str, rng: np.random.Generator) -> None:
    x = f32s(rng, 5003) * 3
    out = run(K.gelu_tanh, (5003,), (512,), ct.f32, ct.from_numpy(x))
    np.testing.assert_allclose(out, K.gelu_tanh_ref(x), rtol=2e-6, atol=1e-6)


def test_2d_tiles_over_non_divisible_tensor(backend: str, rng: np.random.Generator) -> None:
    x, y = f32s(rng, 200, 130), f32s(rng, 200, 130)
    out = run(K.scale_add_2d, (200, 130), (64, 48), ct.f32, ct.from_numpy(x), ct.from_numpy(y))
    ref = np.maximum(
        x * np.float32(2) - y, np.exp(y.astype(np.float64)).astype(np.float32) * np.float32(0.5)
    )
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_f16_and_bf16_inputs_with_f32_math(backend: str, rng: np.random.Generator) -> None:
    n = 3001
    x = round_to(f32s(rng, n) * 4, ct.f16)
    w = round_to(f32s(rng, n), ct.bf16)
    out = run(
        K.mixed_f16, (n,), (256,), ct.f16, ct.from_numpy(x, ct.f16), ct.from_numpy(w, ct.bf16)
    )
    x64 = x.astype(np.float64)
    ref = (1 / (1 + np.exp(-x64))) * w + np.sqrt(np.abs(x64))
    np.testing.assert_allclose(out, ref.astype(np.float16).astype(np.float32), rtol=2e-3, atol=1e-3)


def test_bf16_output(backend: str, rng: np.random.Generator) -> None:
    n = 2050
    x = round_to(f32s(rng, n), ct.bf16)
    y = round_to(f32s(rng, n), ct.f16)
    out = run(
        K.mixed_bf16, (n,), (512,), ct.bf16, ct.from_numpy(x, ct.bf16), ct.from_numpy(y, ct.f16)
    )
    ref = np.where(x > y, x * y, np.log(np.abs(y.astype(np.float64)) + 1.0)).astype(np.float32)
    np.testing.assert_allclose(out, round_to(ref, ct.bf16), rtol=1e-2, atol=1e-2)


def test_integer_floor_semantics(backend: str, rng: np.random.Generator) -> None:
    n = 999
    x = rng.integers(-1000, 1000, n).astype(np.int32)
    y = rng.integers(-50, 50, n).astype(np.int32)
    y[y == 0] = 7
    out = run(K.int_ops, (n,), (128,), ct.i32, ct.from_numpy(x), ct.from_numpy(y))
    np.testing.assert_array_equal(out, (x // y) * 3 + x % y - (x & 7) + np.minimum(x, y))


@pytest.mark.parametrize("rows", [0, 2, 5])
def test_loop_carried_tile_and_branch(backend: str, rng: np.random.Generator, rows: int) -> None:
    x = f32s(rng, 6, 300)
    scale = float(rng.uniform(0.5, 2))
    out = run(K.column_sum, (1, 300), (1, 128), ct.f32, ct.from_numpy(x), rows, scale)
    np.testing.assert_allclose(out, K.column_sum_ref(x, rows, scale), rtol=1e-6, atol=1e-6)


CASES: list[tuple[Any, tuple[Any, ...]]] = [
    (K.add, (ct.PartitionSpec((1000,), (128,)), ct.TensorSpec((1000,)), ct.TensorSpec((1000,)))),
    (K.add, (ct.PartitionSpec((1001,), (1024,)), ct.TensorSpec((1001,)), ct.TensorSpec((1001,)))),
    (
        K.saxpy,
        (ct.PartitionSpec((4096,), (1024,)), 2.0, ct.TensorSpec((4096,)), ct.TensorSpec((4096,))),
    ),
    (K.gelu_tanh, (ct.PartitionSpec((4096,), (512,)), ct.TensorSpec((4096,)))),
    (
        K.scale_add_2d,
        (
            ct.PartitionSpec((200, 130), (64, 48)),
            ct.TensorSpec((200, 130)),
            ct.TensorSpec((200, 130)),
        ),
    ),
    (
        K.mixed_f16,
        (
            ct.PartitionSpec((3001,), (256,), ct.f16),
            ct.TensorSpec((3001,), ct.f16),
            ct.TensorSpec((3001,), ct.bf16),
        ),
    ),
    (
        K.mixed_bf16,
        (
            ct.PartitionSpec((4096,), (512,), ct.bf16),
            ct.TensorSpec((4096,), ct.bf16),
            ct.TensorSpec((4096,), ct.f16),
        ),
    ),
    (
        K.int_ops,
        (
            ct.PartitionSpec((999,), (128,), ct.i32),
            ct.TensorSpec((999,), ct.i32),
            ct.TensorSpec((999,), ct.i32),
        ),
    ),
    (K.column_sum, (ct.PartitionSpec((1, 300), (1, 128)), ct.TensorSpec((6, 300)), 3, 1.5)),
    (K.reverse_tiles, (ct.PartitionSpec((1000,), (96,)), ct.TensorSpec((1000,)), 2.0)),
]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_ptx_assembles_without_spills(case: int, arch: str) -> None:
    kernel, args = CASES[case]
    ptx = kernel.ptx(*args, target=arch)
    report = assemble(ptx, ct.Target(int(arch[3:])))
    assert report.cubin
    assert report.spill_free, report.info_log


def test_ptx_version_is_the_lowest_the_target_allows() -> None:
    args = (ct.PartitionSpec((64,), (64,)), ct.TensorSpec((64,)), ct.TensorSpec((64,)))
    assert ".version 7.0\n.target sm_80" in K.add.ptx(*args, target="sm_80")
    assert ".version 7.8\n.target sm_90" in K.add.ptx(*args, target="sm_90")

    def bf16_args(n: int) -> tuple[ct.PartitionSpec, ct.TensorSpec, ct.TensorSpec]:
        return (
            ct.PartitionSpec((n,), (64,), ct.bf16),
            ct.TensorSpec((n,), ct.bf16),
            ct.TensorSpec((n,), ct.f16),
        )

    # One bf16 a load (an odd length): widened by cvt.f32.bf16, which needs 7.1.
    assert ".version 7.1\n" in K.mixed_bf16.ptx(*bf16_args(63), target="sm_80")
    # Pairs: each half widened by a shift or a mask of its pair, no cvt.
    paired = K.mixed_bf16.ptx(*bf16_args(64), target="sm_80")
    assert ".version 7.0\n" in paired and "cvt.f32.bf16" not in paired


def test_vectorized_access_where_aligned() -> None:
    aligned = K.add.ptx(
        ct.PartitionSpec((4096,), (1024,)), ct.TensorSpec((4096,)), ct.TensorSpec((4096,))
    )
    assert "ld.global.nc.v4.f32" in aligned and "st.global.v4.f32" in aligned
    odd = K.add.ptx(
        ct.PartitionSpec((4097,), (1024,)), ct.TensorSpec((4097,)), ct.TensorSpec((4097,))
    )
    assert "ld.global.nc.v4.f32" not in odd and "ld.global.nc.f32" in odd
    half = K.mixed_f16.ptx(
        ct.PartitionSpec((4096,), (256,), ct.f16),
        ct.TensorSpec((4096,), ct.f16),
        ct.TensorSpec((4096,), ct.bf16),
    )
    assert "ld.global.nc.v4.b32" in half  # 8 halves in one 16-byte load


def test_explicit_tile_index_padding_and_grid_queries(
    backend: str, rng: np.random.Generator
) -> None:
    n, tile = 1000, 96
    x = rng.uniform(0, 1, n).astype(np.float32)
    fill = float(rng.uniform(2, 3))
    out = run(K.reverse_tiles, (n,), (tile,), ct.f32, ct.from_numpy(x), fill)
    np.testing.assert_array_equal(out, K.reverse_tiles_ref(x, tile, fill))


def test_function_helpers_are_inlined(backend: str, rng: np.random.Generator) -> None:
    x = f32s(rng, 3001) * 3
    out = run(K.gelu_helpers, (3001,), (256,), ct.f32, ct.from_numpy(x))
    np.testing.assert_allclose(out, K.gelu_tanh_ref(x), rtol=2e-6, atol=1e-6)
    ir_text = K.gelu_helpers.ir(ct.PartitionSpec((3001,), (256,)), ct.TensorSpec((3001,)))
    assert "unary[tanh]" in ir_text and "call" not in ir_text
