"""`cutile_py_kernels.gemm` / `bmm` on sm_90: the tuner's candidates are wgmma configs, and
every one of them computes correctly on the simulator as an sm_90 device at ragged M, N, K
(f16 and bf16 into f32), fed by TMA alone, assembles for sm_90a with no spills, and its SASS
runs HGMMA and UTMALDG (no cp.async: LDGSTS), and stores its tile with UTMASTG (no STG)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import cutile_py as ct
import cutile_py_kernels as ck
from cutile_py import f32
from cutile_py.ir.dtypes import round_to
from cutile_py.ptx.target import Target
from cutile_py.runtime.nvjitlink import nvjitlink_available
from cutile_py_kernels import autotune
from cutile_py_kernels.autotune import GemmConfig
from cutile_py_kernels.gemm import _gemm_kernel, config_kernel
from tests.support.sass import opcodes_without_spills

DT = {"f16": ct.f16, "bf16": ct.bf16}
#: Ragged: no dimension a multiple of any tile (rows stay 16-byte aligned for cp.async).
M, N, K = 300, 264, 200
#: The templates as they run on this problem (BM, BN up to 256 fit; none is clamped).
CANDIDATES = autotune.candidates(ct.f16, M, N, K, wgmma=True)


def test_candidates_on_sm90_are_wgmma_configs() -> None:
    assert autotune.candidates(ct.bf16, M, N, K, wgmma=True) == CANDIDATES
    tiles = {(c.bm, c.bn) for c in CANDIDATES}
    assert {(128, 128), (128, 256), (256, 128)} <= tiles
    assert {c.stages for c in CANDIDATES} == {3, 4}
    assert all(c.bm % 64 == 0 for c in CANDIDATES)
    # Past the 96 KiB of sm_80 candidates (4 stages of 128 x 256 x 64: 192 KiB), within 227.
    assert GemmConfig(128, 256, 64, 4) in CANDIDATES
    assert all(autotune.shared_bytes(c, ct.f16) <= Target(90).max_shared_bytes for c in CANDIDATES)
    # A small problem clamps BM to whole 64-row warpgroup blocks.
    assert autotune.default_config(ct.f16, 40, 40, 40, wgmma=True) == GemmConfig(64, 40, 48)
    assert autotune.default_config(ct.f16, 40, 40, 40) == GemmConfig(48, 40, 32)


def _operands(rng: np.random.Generator, name: str, *shape: int) -> tuple[np.ndarray, Any]:
    x = round_to(rng.standard_normal(shape).astype(np.float32), DT[name])
    return x.astype(np.float64), ct.from_numpy(x, DT[name])


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", ["f16", "bf16"])
@pytest.mark.parametrize("cfg", CANDIDATES, ids=lambda c: "x".join(map(str, c.astuple())))
def test_every_candidate_on_sim_sm90(cfg: GemmConfig, name: str, rng: np.random.Generator) -> None:
    ct.set_backend("sim", target="sm_90")
    kernel = config_kernel(cfg, DT[name], f32, False, False)
    a, ta = _operands(rng, name, M, K)
    b, tb = _operands(rng, name, K, N)
    out = ct.full((M, N), np.nan).partition((cfg.bm, cfg.bn))
    ptx = kernel.ptx(out, ta, tb, cfg.bk)
    assert "wgmma.mma_async" in ptx
    # Fully TMA-fed: tiles with rows wider than 128 bytes are a box per 128-byte panel.
    assert "cp.async.bulk.tensor" in ptx and "cp.async.cg" not in ptx
    assert ("setmaxnreg.dec" in ptx) == cfg.specialized  # a producer warp group
    res, *_ = kernel(out, ta, tb, cfg.bk).sync()
    _close(res.unpartition().to_numpy(), a @ b)


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("cfg", CANDIDATES, ids=lambda c: "x".join(map(str, c.astuple())))
def test_every_candidate_assembles_for_sm90a(cfg: GemmConfig, trans_b: bool) -> None:
    target = Target(90)
    kernel = config_kernel(cfg, ct.bf16, ct.bf16, trans_b, False)
    spec = (
        ct.PartitionSpec((4096, 4096), (cfg.bm, cfg.bn), ct.bf16),
        ct.TensorSpec((4096, 4096), ct.bf16),
        ct.TensorSpec((4096, 4096), ct.bf16),
    )
    ptx = kernel.ptx(*spec, cfg.bk, target=target)
    assert ".target sm_90a" in ptx and "wgmma.mma_async" in ptx
    ops = opcodes_without_spills(ptx, target)
    assert any(op.startswith("HGMMA") for op in ops)
    assert not any(op.startswith("HMMA") for op in ops)
    assert any(op.startswith("UTMALDG") for op in ops)
    assert not any(op.startswith("LDGSTS") for op in ops)
    # The bf16 output tile leaves by TMA stores from a stmatrix-staged tile (`plan_store`).
    assert any(op.startswith("UTMASTG") for op in ops) and any(op.startswith("STSM") for op in ops)
    assert not any(op.startswith("STG") for op in ops)


def test_gemm_and_bmm_take_the_wgmma_path(rng: np.random.Generator) -> None:
    ct.set_backend("sim", target="sm_90")
    assert ct.profiling.target() == Target(90)
    m, n, k = 100, 72, 136
    a, ta = _operands(rng, "bf16", m, k)
    b, tb = _operands(rng, "bf16", k, n)
    cfg = autotune.default_config(ct.bf16, m, n, k, wgmma=True)
    assert cfg == GemmConfig(64, 64, 64)
    kernel = _gemm_kernel(ct.bf16, f32, False, False, cfg.stages)
    out = ct.empty((m, n), f32).partition((cfg.bm, cfg.bn))
    assert "wgmma.mma_async" in kernel.ptx(out, ta, tb, cfg.bk)
    _close(ck.gemm(ta, tb, out_dtype=f32).to_numpy(), a @ b)
    bt = np.ascontiguousarray(b.T)
    got = ck.gemm(ta, ct.from_numpy(bt.astype(np.float32), ct.bf16), True, f32)
    _close(got.to_numpy(), a @ b)
    p = 3
    a3, ta3 = _operands(rng, "f16", p, m, k)
    b3, tb3 = _operands(rng, "f16", p, k, n)
    bmm_kernel = _gemm_kernel(ct.f16, f32, False, True, cfg.stages)
    out3 = ct.empty((p, m, n), f32).partition((1, cfg.bm, cfg.bn))
    assert "wgmma.mma_async" in bmm_kernel.ptx(out3, ta3, tb3, cfg.bk)
    _close(ck.bmm(ta3, tb3, out_dtype=f32).to_numpy(), a3 @ b3)


@pytest.mark.parametrize("trans_b", [False, True])
def test_bmm_boxes_per_panel_of_rank_3_tiles(trans_b: bool, rng: np.random.Generator) -> None:
    """bmm's (1, rows, cols) tiles as 3-D boxes, one per 128-byte panel: B (1, 64, 128)
    MN-major in 2 panels, or with trans_b BK = 128 (A and B K-major in 2 panels each);
    ragged M, N, K and a batch of 2, on sim sm_90 against NumPy."""
    ct.set_backend("sim", target="sm_90")
    p, m, n, k = 2, 100, 200, 136
    bk = 128 if trans_b else 64
    a, ta = _operands(rng, "f16", p, m, k)
    b, tb = _operands(rng, "f16", *((p, n, k) if trans_b else (p, k, n)))
    kernel = _gemm_kernel(ct.f16, f32, trans_b, True, 3)
    out = ct.full((p, m, n), np.nan).partition((1, 64, 128))
    ptx = kernel.ptx(out, ta, tb, bk)
    assert "cp.async.bulk.tensor.3d" in ptx and "cp.async.cg" not in ptx
    res, *_ = kernel(out, ta, tb, bk).sync()
    _close(res.unpartition().to_numpy(), a @ (np.swapaxes(b, 1, 2) if trans_b else b))
