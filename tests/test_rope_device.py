"""`cutile_py_kernels.rope` computes cos/sin on the device (ct.cos/ct.sin of an angle split in
high and low f32 parts): accurate far past the positions a host table would cover, one kernel
for every float dtype, no cos/sin table read and no host read-back of the positions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import cutile_py as ct
import cutile_py_kernels as ck
from cutile_py_kernels.rope import rope_kernel


def rope_ref(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """In f64 (the exact rotation of the given inputs, to f64 rounding)."""
    half = x.shape[-1] // 2
    a = pos.astype(np.float64)[:, None, None] * theta ** (-2.0 * np.arange(half) / x.shape[-1])
    x1, x2 = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    return np.concatenate([x1 * np.cos(a) - x2 * np.sin(a), x2 * np.cos(a) + x1 * np.sin(a)], -1)


@pytest.mark.parametrize("backend", ["sim", "interpret"])
@pytest.mark.parametrize("span", [5000, 2**20, 2**24 - 1])
def test_rope_f32_is_within_a_few_ulp_up_to_2_to_the_24(
    backend: str, span: int, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    x = rng.standard_normal((48, 3, 64)).astype(np.float32)
    pos = rng.integers(-span, span + 1, 48).astype(np.int32)
    theta = float(rng.choice([10000.0, 500000.0, 1e6]))
    y = ck.rope(ct.from_numpy(x), ct.from_numpy(pos), theta=theta).to_numpy()
    ref = rope_ref(x, pos, theta)
    # |y| <= |x1| + |x2|: a few f32 roundings of that scale
    scale = np.abs(x[..., :32]) + np.abs(x[..., 32:])
    assert np.all(np.abs(y - ref) <= 2.0**-21 * np.concatenate([scale, scale], -1) + 1e-30)


@pytest.mark.parametrize("backend", ["sim", "interpret"])
def test_rope_with_max_position_zeros_positions_outside(
    backend: str, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    x = rng.standard_normal((6, 2, 8)).astype(np.float32)
    pos = np.array([0, 99, 100, -1, 7, 2**31 - 1], np.int32)
    y = ck.rope(ct.from_numpy(x), ct.from_numpy(pos), max_position=100).to_numpy()
    inside = (pos >= 0) & (pos < 100)
    np.testing.assert_array_equal(y[~inside], 0)
    np.testing.assert_allclose(y[inside], rope_ref(x, pos, 10000.0)[inside], atol=2e-6)


@pytest.mark.parametrize("backend", ["sim", "interpret"])
@pytest.mark.parametrize("dt", [ct.f16, ct.bf16], ids=lambda d: d.name)
def test_one_rope_kernel_for_each_dtype(
    backend: str, dt: type[ct.DType], rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    x = ct.from_numpy(rng.standard_normal((4, 2, 16)).astype(np.float32), dt)
    pos = rng.integers(0, 3000, 4).astype(np.int32)
    y = ck.rope(x, ct.from_numpy(pos))
    assert y.dtype is dt
    ref = rope_ref(x.to_numpy().astype(np.float64), pos, 10000.0)
    ulp = 2.0**-10 if dt is ct.f16 else 2.0**-7
    assert np.all(np.abs(y.to_numpy().astype(np.float64) - ref) <= ulp * (np.abs(ref) + 0.01))


def test_rope_kernel_computes_cos_and_sin_and_reads_no_table() -> None:
    args = (
        ct.PartitionSpec((8, 4, 64), (1, 4, 64)),
        ct.TensorSpec((8, 4, 64)),
        ct.TensorSpec((8,), ct.i32),
        ct.TensorSpec((32,)),
        ct.TensorSpec((32,)),
        0,
        99,
    )
    text = rope_kernel.ir(*args)
    assert "unary[sin]" in text and "unary[cos]" in text


def test_rope_does_not_read_positions_back_to_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without max_position nothing sizes a table, so the positions stay on the device."""
    read: list[object] = []
    original = ct.Tensor.to_numpy

    def spy(self: ct.Tensor[Any, Any]) -> np.ndarray:
        read.append(self)
        return original(self)

    monkeypatch.setattr(ct.Tensor, "to_numpy", spy)
    x = ct.from_numpy(np.ones((2, 1, 4), np.float32))
    pos = ct.from_numpy(np.array([1, 2], np.int32))
    y = ck.rope(x, pos)
    assert not any(t is pos for t in read)
    want = rope_ref(np.ones((2, 1, 4)), np.array([1, 2]), 1e4)
    np.testing.assert_allclose(y.to_numpy(), want, atol=1e-6)
