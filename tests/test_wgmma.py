"""The wgmma lowering (sm_90a): a K loop's `ct.mma` with both operands staged by the cp.async
pipeline becomes `wgmma.mma_async` m64nNk16 with matrix descriptors, the accumulator in the
fragment registers. Run on the simulator as an sm_90 device against NumPy at ragged shapes,
its plan and PTX read, and assembled by nvJitLink for sm_90a with no spills (SASS: HGMMA)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f16, f32
from cutile_py.host import kernel as kmod
from cutile_py.ir.dtypes import round_to
from cutile_py.lower.fragments import WarpGrid
from cutile_py.lower.plan import format_plan
from cutile_py.ptx.target import Target
from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available
from cutile_py.runtime.sass import SassUnavailable, disassemble, instructions
from cutile_py_kernels.gemm import _gemm_kernel

if TYPE_CHECKING:
    ConstInt = int
else:
    ConstInt = ct.Constant[int]
BM = TypeVar("BM")
BN = TypeVar("BN")
SM90 = Target(90)
DT = {"f16": ct.f16, "bf16": ct.bf16}


def operand(rng: np.random.Generator, shape: tuple[int, int], name: str) -> Any:
    a = round_to(rng.standard_normal(shape).astype(np.float32), DT[name])
    return a.astype(np.float64), ct.from_numpy(a, DT[name])


def spec(m: int, n: int, k: int, tile: tuple[int, int], name: str, trans_b: bool) -> tuple:
    b = (n, k) if trans_b else (k, n)
    return (
        ct.PartitionSpec((m, n), tile, f32),
        ct.TensorSpec((m, k), DT[name]),
        ct.TensorSpec(b, DT[name]),
    )


# (BM, BN, BK, stages, dtype, B as (N, K)): 128/64/32-byte swizzles of A, B in 1, 2 and 4
# panels of 64 columns, one and two warpgroups, B K-major (trans_b).
CASES = [
    (64, 64, 64, 2, "f16", False),
    (128, 128, 32, 3, "bf16", False),
    (128, 256, 64, 2, "f16", False),
    (64, 128, 16, 3, "bf16", False),
    (128, 128, 64, 3, "f16", True),
]


def _id(c: tuple[Any, ...]) -> str:
    return "x".join(map(str, c[:3])) + f"-s{c[3]}-{c[4]}" + ("-T" if c[5] else "")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gemm_on_sim_sm90_matches_numpy(case: tuple[Any, ...], rng: np.random.Generator) -> None:
    bm, bn, bk, stages, name, trans_b = case
    ct.set_backend("sim", target="sm_90")
    kernel = _gemm_kernel(DT[name], f32, trans_b, False, stages)
    # Ragged in M, N and K: partial tiles on every edge, K not a multiple of BK (rows of A
    # and B stay 16-byte aligned: cp.async stages only such tiles, and wgmma reads stages).
    m, n, k = bm + 37, bn + 24, 3 * bk + 8
    a, ta = operand(rng, (m, k), name)
    b, tb = operand(rng, (n, k) if trans_b else (k, n), name)
    out = ct.full((m, n), np.nan).partition((bm, bn))
    ptx = kernel.ptx(out, ta, tb, bk)
    assert ".target sm_90a" in ptx and "wgmma.mma_async" in ptx and "mma.sync" not in ptx
    res, *_ = kernel(out, ta, tb, bk).sync()
    want = a @ (b.T if trans_b else b)
    got = res.unpartition().to_numpy().astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want).max())


def test_plan_shows_the_wgmma_decision(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Compiled here, not read from the caches (an entry read from disk carries no plan).
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path / "cache"))
    kmod._CACHE.clear()
    kernel = _gemm_kernel(f16, f32, False, False, 3)
    compiled = kernel.compile(*spec(512, 512, 512, (128, 256), "f16", False), 64, target=SM90)
    assert compiled.ir is not None and compiled.lowered is not None
    plan = compiled.lowered.plan
    assert plan is not None
    text = format_plan(compiled.ir, plan)
    assert (
        "wgmma.mma_async m64n256k16.f32.f16: 2 warpgroup(s) x 1 m64 block(s), 4 k-step(s)" in text
    )
    assert "A K-major swizzle 128B; B MN-major swizzle 128B, 4 panels" in text
    assert "4 panels of 64 columns" in text  # B's staged tile
    (pipe,) = plan.pipelines.values()
    assert len(pipe.wgmma) == 1
    # The accumulator keeps mma fragments of one warp per 16-row band: wgmma's layout.
    (grid,) = set(plan.fragment_plan.grids.values())
    assert grid == WarpGrid(8, 1, 8, 32)
    # The ring starts on a 1024-byte boundary and each tile on one too.
    assert all(sl.tile.offset % 1024 == 0 for sl in pipe.loads)
    assert pipe.stage_bytes % 1024 == 0 and plan.shared.ring(pipe.loop) % 1024 == 0


@pytest.mark.parametrize("target", [Target(80), Target(90, arch_specific=False)])
def test_other_targets_keep_mma_sync(target: Target) -> None:
    kernel = _gemm_kernel(f16, f32, False, False, 3)
    ptx = kernel.ptx(*spec(256, 256, 256, (128, 128), "f16", False), 64, target=target)
    assert "wgmma" not in ptx and "mma.sync.aligned.m16n8k16" in ptx
    assert f".target {target.name}\n" in ptx


@ct.kernel
def gemm_epilogue(
    c: Mut[Tensor[f32, BM, BN]], a: Tensor[f16, Dyn, Dyn], b: Tensor[f16, Dyn, Dyn], BK: ConstInt
) -> None:
    """relu(2 (a @ b) - rowmax) with the row max taken on the accumulator in the loop."""
    bm, bn = c.shape[0], c.shape[1]
    acc: ct.Tile = ct.zeros((bm, bn), f32)
    for kk in range(ct.cdiv(a.shape[1], BK)):
        ta = ct.load(a, (ct.bid(0), kk), (bm, BK))
        tb = ct.load(b, (kk, ct.bid(1)), (BK, bn))
        acc = ct.mma(ta, tb, acc)
    top = ct.max(acc, axis=1, keepdims=True)
    c.store(ct.maximum(2.0 * acc - top, 0.0))


def test_epilogue_on_the_accumulator(rng: np.random.Generator) -> None:
    ct.set_backend("sim", target="sm_90")
    m, n, k = 150, 70, 90
    a, ta = operand(rng, (m, k), "f16")
    b, tb = operand(rng, (k, n), "f16")
    out = ct.full((m, n), np.nan).partition((128, 64))
    assert "wgmma.mma_async" in gemm_epilogue.ptx(out, ta, tb, 32)
    res, *_ = gemm_epilogue(out, ta, tb, 32).sync()
    prod = a @ b
    # Rows and columns past the tensor's edge hold 0 in the tile: the row max sees them.
    tiles = np.zeros((256, 128))
    tiles[:m, :n] = prod
    top = tiles.reshape(2, 128, 2, 64).max(axis=3, keepdims=True)
    top = np.broadcast_to(top, (2, 128, 2, 64)).reshape(256, 128)[:m, :n]
    want = np.maximum(2 * prod - top, 0)
    got = res.unpartition().to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want).max())


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_assembles_for_sm90a_without_spills(case: tuple[Any, ...]) -> None:
    bm, bn, bk, stages, name, trans_b = case
    kernel = _gemm_kernel(DT[name], f32, trans_b, False, stages)
    ptx = kernel.ptx(*spec(1000, 1000, 1000, (bm, bn), name, trans_b), bk, target=SM90)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32", ptx)
    report = assemble(ptx, SM90)
    assert "sm_90a" in report.info_log
    assert report.spill_free, report.info_log
    try:
        sass = instructions(disassemble(report.cubin))
    except SassUnavailable as e:
        pytest.skip(str(e))
    assert any(i.split()[0].startswith("HGMMA") for i in sass if i.split())
    assert not any(i.split()[0].startswith("HMMA") for i in sass if i.split())


def test_tf32_with_b_k_major(rng: np.random.Generator) -> None:
    """f32 operands as tf32 (k8): wgmma has no transposed tf32 forms, so B must be loaded
    (N, K) (trans_b); B loaded (K, N) keeps mma.sync."""
    ct.set_backend("sim", target="sm_90")
    kernel = _gemm_kernel(f32, f32, True, False, 3)
    m, n, k = 165, 152, 104
    a = rng.standard_normal((m, k)).astype(np.float32)
    bt = rng.standard_normal((n, k)).astype(np.float32)
    out = ct.full((m, n), np.nan).partition((128, 128))
    ptx = kernel.ptx(out, ct.from_numpy(a), ct.from_numpy(bt), 32)
    assert "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32" in ptx
    res, *_ = kernel(out, ct.from_numpy(a), ct.from_numpy(bt), 32).sync()
    want = a.astype(np.float64) @ bt.T.astype(np.float64)
    err = np.abs(res.unpartition().to_numpy() - want)
    # tf32 keeps 10 mantissa bits of each operand (wgmma ignores the low 13 bits).
    assert (err <= 2e-3 * (np.abs(a) @ np.abs(bt.T))).all()
    if nvjitlink_available():
        report = assemble(ptx, SM90)
        assert report.spill_free
    plain = _gemm_kernel(f32, f32, False, False, 3)
    b = np.ascontiguousarray(bt.T)
    ptx = plain.ptx(out, ct.from_numpy(a), ct.from_numpy(b), 32)
    assert "wgmma" not in ptx and "mma.sync.aligned.m16n8k8" in ptx


@ct.kernel
def gemm_a_kmajor_rows(
    c: Mut[Tensor[f32, BM, BN]], at: Tensor[f16, Dyn, Dyn], b: Tensor[f16, Dyn, Dyn], BK: ConstInt
) -> None:
    """c = at.T @ b: A given (K, M), its tile loaded (BK, BM) and transposed (rows along K)."""
    bm, bn = c.shape[0], c.shape[1]
    acc: ct.Tile = ct.zeros((bm, bn), f32)
    for kk in range(ct.cdiv(at.shape[0], BK)):
        ta = ct.load(at, (kk, ct.bid(0)), (BK, bm)).T
        acc = ct.mma(ta, ct.load(b, (kk, ct.bid(1)), (BK, bn)), acc)
    c.store(acc)


@pytest.mark.parametrize("tile", [(64, 64), (128, 128)])
def test_a_mn_major(tile: tuple[int, int], rng: np.random.Generator) -> None:
    """A staged with its rows along K is read MN-major (imm-trans-a 1), in 64-column panels
    where BM is wider."""
    ct.set_backend("sim", target="sm_90")
    m, n, k = tile[0] + 40, tile[1] + 16, 88
    a, ta = operand(rng, (k, m), "f16")
    b, tb = operand(rng, (k, n), "f16")
    out = ct.full((m, n), np.nan).partition(tile)
    ptx = gemm_a_kmajor_rows.ptx(out, ta, tb, 32)
    assert re.search(r"wgmma\.mma_async\S+ \{[^}]*\}, %rd\d+, %rd\d+, %p\d+, 1, 1, 1, 1;", ptx)
    res, *_ = gemm_a_kmajor_rows(out, ta, tb, 32).sync()
    want = a.T @ b
    got = res.unpartition().to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want).max())


def test_dump_shows_the_wgmma_plan(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """`CUTILE_PY_DUMP` on the simulator as sm_90: the plan file names the wgmma lowering,
    the PTX file is sm_90a."""
    ct.set_backend("sim", target="sm_90")
    out = tmp_path / "dump"
    monkeypatch.setenv("CUTILE_PY_DUMP", str(out))
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path / "cache"))  # compiled, not read
    _, ta = operand(rng, (96, 64), "f16")
    _, tb = operand(rng, (64, 80), "f16")
    gemm_epilogue(ct.full((96, 80), np.nan).partition((64, 64)), ta, tb, 32).sync()
    (plan,) = out.glob("gemm_epilogue.sm_90.*.plan")
    text = plan.read_text()
    assert text.startswith("plan of kernel gemm_epilogue for sm_90 [mma_sync cp_async wgmma tma]")
    assert "wgmma.mma_async m64n64k16.f32.f16: 1 warpgroup(s) x 1 m64 block(s)" in text
    (ptx,) = out.glob("gemm_epilogue.sm_90.*.ptx")
    assert ".target sm_90a" in ptx.read_text()
