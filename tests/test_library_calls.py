"""The library's host functions through their fast path: the launch of a row kernel chosen
once per (shape, dtype) (`row_launch`), the result reshaped only where the caller's shape
differs. Results against NumPy on fresh random
inputs, through the remembered launch and after shape changes; the host cost in Python calls."""

from __future__ import annotations

import cProfile
import pstats
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
import cutile_py_kernels as K
from cutile_py_kernels import _common
from cutile_py_kernels.norms import _rms_kernels


def _rms(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("backend", ["sim", "interpret"])
def test_rms_norm_through_the_remembered_launch_and_after_shape_changes(
    backend: str, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    for shape in [(6, 96), (6, 96), (2, 3, 96), (5, 130), (6, 96)]:
        a = rng.standard_normal(shape).astype(np.float32)
        w = rng.standard_normal(shape[-1]).astype(np.float32)
        x = ct.from_numpy(a)
        y = K.rms_norm(x, ct.from_numpy(w))
        assert y.shape == shape and not y.is_moved
        np.testing.assert_allclose(y.to_numpy(), _rms(a, w), rtol=2e-5, atol=2e-5)
        np.testing.assert_array_equal(x.to_numpy(), a)  # the input stays usable
    rows = ct.empty((6, 96), ct.f32)
    first = _common.row_launch(_rms_kernels, 0, rows)
    assert _common.row_launch(_rms_kernels, 0, rows) is first  # remembered by shape, dtype


def test_add_rms_norm_and_layer_norm_through_the_fast_path(rng: np.random.Generator) -> None:
    ct.set_backend("sim")
    shape = (2, 4, 64)
    a, r = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    w, b = (rng.standard_normal(64).astype(np.float32) for _ in range(2))
    for _ in range(2):
        y, h = K.add_rms_norm(ct.from_numpy(a), ct.from_numpy(r), ct.from_numpy(w))
        np.testing.assert_allclose(h.to_numpy(), a + r, rtol=1e-6)
        np.testing.assert_allclose(y.to_numpy(), _rms(a + r, w), rtol=2e-5, atol=2e-5)
        z = K.layer_norm(ct.from_numpy(a), ct.from_numpy(w), ct.from_numpy(b)).to_numpy()
        mean = a.mean(-1, keepdims=True, dtype=np.float64)
        var = ((a - mean) ** 2).mean(-1, keepdims=True)
        np.testing.assert_allclose(z, (a - mean) / np.sqrt(var + 1e-5) * w + b, atol=3e-5)


def test_a_long_row_takes_the_chunked_kernel(rng: np.random.Generator) -> None:
    ct.set_backend("interpret")
    n = _common.ROW_CAP[ct.f32] + 100  # past one tile: chunks
    a = rng.standard_normal((2, n)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    x = ct.from_numpy(a)
    assert _common.row_launch(_rms_kernels, 0, x).extra  # the chunk width
    y = K.rms_norm(x, ct.from_numpy(w))
    np.testing.assert_allclose(y.to_numpy(), _rms(a, w), rtol=2e-5, atol=2e-5)


def test_other_host_functions_keep_the_callers_shape(rng: np.random.Generator) -> None:
    ct.set_backend("sim")
    a = rng.standard_normal((3, 2, 40)).astype(np.float32)
    b = rng.standard_normal((3, 2, 40)).astype(np.float32)
    s = K.softmax(ct.from_numpy(a)).to_numpy()
    e = np.exp(a - a.max(-1, keepdims=True))
    np.testing.assert_allclose(s, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    g = K.silu_mul(ct.from_numpy(a), ct.from_numpy(b)).to_numpy()
    np.testing.assert_allclose(g, a / (1 + np.exp(-a)) * b, rtol=1e-5, atol=1e-6)
    z = K.add(ct.from_numpy(a.reshape(-1)), ct.from_numpy(b.reshape(-1))).to_numpy()
    np.testing.assert_array_equal(z, (a + b).reshape(-1))


def test_a_held_or_moved_input_is_still_refused(rng: np.random.Generator) -> None:
    ct.set_backend("sim")
    from tests.support import elementwise_kernels as E

    a = rng.standard_normal(128).astype(np.float32)
    w = rng.standard_normal(128).astype(np.float32)
    x, wt = ct.from_numpy(a), ct.from_numpy(w)
    K.rms_norm(x, wt)  # remembered
    pending = E.add(ct.zeros(128).partition(32), x, x)  # x held by a pending op
    with pytest.raises(ct.BorrowError, match="held by the pending launch of kernel add"):
        K.rms_norm(x, wt)
    pending.sync()
    np.testing.assert_allclose(K.rms_norm(x, wt).to_numpy(), _rms(a, w), rtol=2e-5, atol=2e-5)
    x2 = ct.from_numpy(np.stack([a, a]))
    x2.partition((2, 32))
    with pytest.raises(ct.MovedError, match="partition"):
        K.rms_norm(x2, wt)  # 2-D: the fast path checks the move too


def test_the_rms_norm_host_function_costs_few_python_calls(rng: np.random.Generator) -> None:
    """4096 x 4096 on the real cuda backend over a driver whose calls return at once: argument
    checks, output allocation, one launch and the result, in Python calls (214 before the
    remembered launch and the fast paths; 131 with them)."""
    pytest.importorskip("cuda.bindings")
    from paper_repro.experiments.host import null_cuda

    with null_cuda():  # as the host experiment times it: no argument check's calls
        x = ct.from_numpy(rng.standard_normal((4096, 4096), dtype=np.float32))
        w = ct.from_numpy(rng.standard_normal(4096, dtype=np.float32))
        K.rms_norm(x, w)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20):
            K.rms_norm(x, w)
        profile.disable()
        stats: Any = pstats.Stats(profile)
        calls = sum(s[1] for s in stats.stats.values()) / 20
    assert calls <= 140
