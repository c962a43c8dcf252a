"""`ct.set_backend("sim", target=...)`: the simulator as a device of that target. Kernels
compile for it, its limits apply (sm_90: 227 KB of shared memory per block), and unknown
targets are refused naming the argument."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Mut, Tensor, f16, f32
from cutile_py.ptx.target import Target
from cutile_py.runtime.select import active_backend
from cutile_py_kernels.gemm import _gemm_kernel

B = TypeVar("B")


@ct.kernel
def axpy(z: Mut[Tensor[f32, B]], a: float, x: Tensor[f32, ct.Dyn]) -> None:
    z.store(a * ct.load_tile_like(x, z) + ct.load_tile_like(z, z))


def test_default_sim_is_sm_80_and_target_selects_another() -> None:
    assert active_backend().target == Target(80)
    ct.set_backend("sim", target="sm_90")
    assert ct.backend() == "sim"
    assert active_backend().target == Target(90)
    ct.set_backend("sim", target="sm_80")
    assert active_backend().target == Target(80)
    ct.set_backend("sim", target=90)
    assert active_backend().target == Target(90)


def test_kernels_compile_for_the_simulated_target(rng: np.random.Generator) -> None:
    ct.set_backend("sim", target="sm_90")
    x = rng.standard_normal(1000).astype(np.float32)
    z0 = rng.standard_normal(1000).astype(np.float32)
    z = ct.from_numpy(z0).partition(256)
    assert ".target sm_90\n" in axpy.ptx(z, 2.0, ct.from_numpy(x))
    res, *_ = axpy(z, 2.0, ct.from_numpy(x)).sync()
    np.testing.assert_allclose(res.unpartition().to_numpy(), 2.0 * x + z0, rtol=1e-6)


#: 128x128 f16 tiles, BK=64, 6 stages: 192 KB of shared memory, past sm_80's 163 KB and
#: within sm_90's 227 KB.
DEEP = _gemm_kernel(f16, f32, False, False, 6)


def _deep_gemm(rng: np.random.Generator) -> tuple[ct.DeviceOp, np.ndarray]:
    a = rng.standard_normal((128, 320)).astype(np.float16)
    b = rng.standard_normal((320, 128)).astype(np.float16)
    out = ct.zeros((128, 128)).partition((128, 128))
    op = DEEP(out, ct.from_numpy(a, f16), ct.from_numpy(b, f16), 64)
    return op, a.astype(np.float32) @ b.astype(np.float32)


def test_sm_90_shared_memory_limit(rng: np.random.Generator) -> None:
    with pytest.raises(ct.CompileError, match="stages=6 needs 196608 bytes"):
        _deep_gemm(rng)[0].sync()
    ct.set_backend("sim", target="sm_90")
    op, want = _deep_gemm(rng)
    res, *_ = op.sync()
    np.testing.assert_allclose(res.unpartition().to_numpy(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("bad", ["sm_75", "sm_9O", "hopper", 95])
def test_unknown_targets_name_the_argument(bad: str | int) -> None:
    with pytest.raises(ValueError, match=r"set_backend\('sim', target=.*is not a known target"):
        ct.set_backend("sim", target=bad)
    assert active_backend().target == Target(80)  # unchanged


@pytest.mark.parametrize("name", ["interpret", "cuda"])
def test_only_sim_takes_a_target(name: str) -> None:
    with pytest.raises(ValueError, match=rf"set_backend\('{name}', target='sm_90'\): only"):
        ct.set_backend(name, target="sm_90")


def test_tensors_stay_on_the_simulator_they_were_made_on(rng: np.random.Generator) -> None:
    x = ct.from_numpy(rng.standard_normal(64).astype(np.float32))
    ct.set_backend("sim", target="sm_90")
    y = ct.from_numpy(rng.standard_normal(64).astype(np.float32))
    assert x.backend is not y.backend
    ct.set_backend("sim")
    assert active_backend() is x.backend
