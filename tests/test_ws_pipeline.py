"""Warp-specialized TMA + wgmma K loops (`@ct.kernel(warp_specialize=True)`, `plan_ws`,
`emit_tma`): a producer warp group issues each stage's boxes after the consumers hand the
stage back on its "empty" mbarrier; the consumers wait on "full", run wgmma and arrive on
"empty" once the wgmma reading the stage retired. Run on the simulator as an sm_90 device
with race checks under several warp schedules, with planted protocol bugs, and assembled
for sm_90a."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, bf16, f16, f32
from cutile_py.host import jit_disk
from cutile_py.host.kernel import COMPILER_VERSION
from cutile_py.host.launch import ParamReader
from cutile_py.ir.dtypes import round_to
from cutile_py.lower.plan import format_plan
from cutile_py.ptx.target import Target
from cutile_py.runtime.backend import LaunchFailure, ParamValue
from cutile_py.runtime.nvjitlink import nvjitlink_available
from cutile_py.runtime.sass import SassUnavailable, disassemble, find_tool, instructions
from cutile_py.runtime.sim_backend import SimBackend
from cutile_py_kernels import autotune
from cutile_py_kernels.gemm import _gemm_kernel
from tests.support.active_sim import activate_sim, backends_restored
from tests.support.sass import opcodes_without_spills
from tests.test_tma_pipeline import make_gemm as tma_gemm

BM = TypeVar("BM")
BN = TypeVar("BN")
SM90 = Target(90)


def make_gemm(dt: type[ct.DType], warp_specialize: bool = True) -> Any:
    """test_tma_pipeline's GEMM (a TMA-fed K loop), 3 stages, warp-specialized."""
    return tma_gemm(dt, 3, warp_specialize)


GEMMS = {dt: make_gemm(dt) for dt in (f16, bf16)}


def _operand(rng: np.random.Generator, shape: tuple[int, ...], dt: type[ct.DType]) -> Any:
    x = round_to(rng.standard_normal(shape).astype(np.float32), dt)
    return x.astype(np.float64), ct.from_numpy(x, dt)


def _sim90(**options: Any) -> SimBackend:
    """The simulator as an sm_90 device with race checks on, made the active backend."""
    return activate_sim(SM90, **options)


@pytest.fixture
def restore_backends() -> Iterator[None]:
    with backends_restored():
        yield


@pytest.mark.parametrize("dt", [f16, bf16], ids=lambda d: d.name)
@pytest.mark.parametrize("mnk", [(130, 72, 104), (200, 136, 264)])
def test_ws_gemm_matches_numpy_under_several_schedules(
    dt: type[ct.DType], mnk: tuple[int, int, int], rng: np.random.Generator, restore_backends: Any
) -> None:
    """Ragged M, N, K (no multiple of the 128 x 64 x 32 tile); each launch runs under three
    warp schedules, and every one must give the same output, race-free."""
    _sim90(schedules=3)
    m, n, k = mnk
    a, ta = _operand(rng, (m, k), dt)
    b, tb = _operand(rng, (k, n), dt)
    kernel = GEMMS[dt]
    out = ct.full((m, n), np.nan).partition((128, 64))
    lowered = kernel.compile(out, ta, tb, 32, target=SM90).lowered
    ptx = lowered.ptx
    assert lowered.block_threads == 384  # two consumer warp groups and the producer
    assert ".maxnreg 168" in ptx and ".reqntid 384, 1, 1" in ptx
    assert "setmaxnreg.inc.sync.aligned.u32 232;" in ptx
    assert "setmaxnreg.dec.sync.aligned.u32 40;" in ptx
    assert "bar.sync 0;" not in ptx  # the consumers' barrier leaves the producer out
    res, *_ = kernel(out, ta, tb, 32).sync()
    want = a @ b
    got = res.unpartition().to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@ct.kernel(stages=2, warp_specialize=True)
def gemm_hoisted(
    c: Mut[Tensor[f32, BM, BN]],
    a: Tensor[bf16, Dyn, Dyn],
    b: Tensor[bf16, Dyn, Dyn],
    BK: ct.Constant[int],
) -> None:
    """The tile indices and the trip count computed before the loop: the producer computes
    them again (its registers are not the consumers')."""
    row, col = ct.bid(0), ct.bid(1)
    steps = ct.num_tiles(a, 1, BK)
    acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
    for kk in range(steps):
        ta = ct.load(a, (row, kk), (c.shape[0], BK))
        tb = ct.load(b, (kk, col), (BK, c.shape[1]))
        acc = ct.mma(ta, tb, acc)
    c.store(acc)


def test_indices_made_before_the_loop(rng: np.random.Generator, restore_backends: Any) -> None:
    _sim90(schedules=2)
    m, n, k = 200, 136, 96
    a, ta = _operand(rng, (m, k), bf16)
    b, tb = _operand(rng, (k, n), bf16)
    out = ct.full((m, n), np.nan).partition((128, 64))
    assert "setmaxnreg" in gemm_hoisted.ptx(out, ta, tb, 32, target=SM90)
    res, *_ = gemm_hoisted(out, ta, tb, 32).sync()
    _check(res, a @ b)


@pytest.mark.parametrize("trans_b", [False, True])
def test_library_gemm_and_bmm_warp_specialized(
    trans_b: bool, rng: np.random.Generator, restore_backends: Any
) -> None:
    """The library's kernels with the option: 2-D in L2-grouped order (the tile index the
    preamble remaps, read by both sides), and batched (3-D boxes), B as (K, N) or (N, K)."""
    _sim90(schedules=2)
    m, n, k = 330, 72, 104
    a, ta = _operand(rng, (m, k), bf16)
    b, tb = _operand(rng, (n, k) if trans_b else (k, n), bf16)
    kernel = _gemm_kernel(bf16, f32, trans_b, False, 3, None, 2, True)
    out = ct.full((m, n), np.nan).partition((128, 64))
    assert "setmaxnreg" in kernel.ptx(out, ta, tb, 32)
    res, *_ = kernel(out, ta, tb, 32).sync()
    _check(res, a @ (b.T if trans_b else b))
    p = 2
    a3, ta3 = _operand(rng, (p, 130, k), f16)
    b3, tb3 = _operand(rng, (p, n, k) if trans_b else (p, k, n), f16)
    bmm = _gemm_kernel(f16, f32, trans_b, True, 3, None, None, True)
    out3 = ct.full((p, 130, n), np.nan).partition((1, 128, 64))
    assert "setmaxnreg" in bmm.ptx(out3, ta3, tb3, 32)
    res3, *_ = bmm(out3, ta3, tb3, 32).sync()
    _check(res3, a3 @ (np.swapaxes(b3, 1, 2) if trans_b else b3))


def test_an_empty_k_loop_gives_zeros(rng: np.random.Generator, restore_backends: Any) -> None:
    """K = 0: the producer issues nothing and the consumers wait on nothing."""
    _sim90()
    _, ta = _operand(rng, (70, 0), f16)
    _, tb = _operand(rng, (0, 72), f16)
    out = ct.full((70, 72), np.nan).partition((128, 64))
    res, *_ = GEMMS[f16](out, ta, tb, 32).sync()
    assert (res.unpartition().to_numpy() == 0).all()


def _launch_edited(
    rng: np.random.Generator, edit: Any, k: int = 256
) -> tuple[Any, list[Any], Any, np.ndarray]:
    """The generated PTX of the f16 kernel and `edit(ptx)`, with what launching them takes."""
    sim = _sim90()
    a, ta = _operand(rng, (128, k), f16)
    b, tb = _operand(rng, (k, 64), f16)
    c = ct.zeros((128, 64), f32).partition((128, 64))
    lowered = GEMMS[f16].compile(c, ta, tb, 32, target=SM90).lowered
    broken = edit(lowered.ptx)
    assert broken != lowered.ptx
    reader = ParamReader(lowered)
    values = [ParamValue(t, v) for t, v in zip(reader.ptypes, reader([c, ta, tb, 32], sim))]

    def launch(ptx: str, keep: tuple[Any, ...] = (ta, tb)) -> Any:
        # `keep`: the operands stay allocated while the launches read them.
        kernel = sim.load_kernel(ptx, lowered.entry)
        return sim.launch(kernel, (1, 1, 1), (lowered.block_threads, 1, 1),
                          lowered.dynamic_shared, values)  # fmt: skip

    return launch, [lowered.ptx, broken], c, a @ b


def _check(c: Any, want: np.ndarray) -> None:
    got = c.unpartition().to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_without_the_empty_arrive_the_producer_deadlocks(
    rng: np.random.Generator, restore_backends: Any
) -> None:
    """8 K steps over 3 stages: the producer waits for stage 0 back before step 3; no
    consumer arrives, so no thread can go on."""
    arrive = re.compile(r"\n\t@%p\d+ mbarrier\.arrive\.shared::cta\.b64 _, \[[^\]]*\];")
    launch, (good, broken), c, want = _launch_edited(rng, lambda p: arrive.sub("", p))
    launch(good).wait()
    _check(c, want)
    with pytest.raises(LaunchFailure, match="deadlock"):
        launch(broken).wait()


def test_without_the_full_wait_the_stale_stage_is_reported(
    rng: np.random.Generator, restore_backends: Any
) -> None:
    """The consumers read stages without waiting on their full barriers: they run through
    the loop on bytes the copy engine has not written (the simulator's copies land only when
    a barrier is tested) and invalidate the barriers while the producer still waits for
    stages back, which the simulator reports."""

    def drop_wait(ptx: str) -> str:
        # The consumers' wait loop (label tma_wait): the try_wait and the branch back.
        return re.sub(
            r"\$__tma_wait_\d+:\n\tmbarrier\.try_wait[^\n]*\n\t@!%p\d+ bra \$__tma_wait_\d+;\n",
            "",
            ptx,
        )

    launch, (good, broken), c, want = _launch_edited(rng, drop_wait)
    launch(good).wait()
    _check(c, want)
    with pytest.raises(LaunchFailure, match="wait on a barrier that was not initialized"):
        launch(broken).wait()


def test_handing_a_stage_back_before_its_wgmma_retired_is_reported(
    rng: np.random.Generator, restore_backends: Any
) -> None:
    """Two groups left in flight (`wait_group 2`): a consumer hands back the stage the
    previous iteration's wgmma may still read, and the producer's box overwrites it."""
    launch, (good, broken), c, want = _launch_edited(
        rng,
        lambda p: p.replace("wgmma.wait_group.sync.aligned 1;", "wgmma.wait_group.sync.aligned 2;"),
    )
    launch(good).wait()
    _check(c, want)
    with pytest.raises(LaunchFailure, match="overwrites an operand of a wgmma still in flight"):
        launch(broken).wait()


def test_the_plan_says_how_and_why_not() -> None:
    ta, tb = ct.TensorSpec((130, 104), f16), ct.TensorSpec((104, 72), f16)
    out = ct.PartitionSpec((130, 72), (128, 64), f32)
    compiled = GEMMS[f16].compile(out, ta, tb, 32, target=SM90)
    assert compiled.lowered is not None and compiled.lowered.plan is not None
    text = format_plan(compiled.ir, compiled.lowered.plan)
    assert "mbarriers at +36864 (full and empty per stage)" in text
    assert (
        "warp specialized: consumers warp groups 0..1 (256 threads, setmaxnreg.inc 232), "
        "producer warp group 2 (threads 256..383, setmaxnreg.dec 40, thread 256 issues)"
    ) in text
    assert "producer computes again: tensor_dim" in text
    # K = 100: rows of 200 bytes, no TMA box; the loop stays a cp.async one and says why.
    ta2, tb2 = ct.TensorSpec((130, 100), f16), ct.TensorSpec((100, 72), f16)
    other = GEMMS[f16].compile(out, ta2, tb2, 32, target=SM90)
    assert other.lowered is not None and other.lowered.plan is not None
    text2 = format_plan(other.ir, other.lowered.plan)
    assert "not warp specialized: its operand tiles are not all TMA boxes" in text2
    assert other.lowered.block_threads == 256 and "setmaxnreg" not in other.lowered.ptx
    # sm_80: no TMA, no specialization.
    on80 = GEMMS[f16].compile(out, ta, tb, 32, target=Target(80))
    assert on80.lowered is not None and "setmaxnreg" not in on80.lowered.ptx


def test_the_option_is_part_of_the_jit_key() -> None:
    plain = make_gemm(f16, warp_specialize=False)
    spec = (
        ct.PartitionSpec((256, 128), (128, 64), f32),
        ct.TensorSpec((256, 128), f16),
        ct.TensorSpec((128, 128), f16),
    )
    assert "setmaxnreg" not in plain.ptx(*spec, 32, target=SM90)
    assert "setmaxnreg" in GEMMS[f16].ptx(*spec, 32, target=SM90)

    def nothing(c: Mut[Tensor[f32, Dyn]]) -> None:
        c.store(ct.zeros((16,), f32))

    with pytest.raises(TypeError, match="nothing: warp_specialize must be a bool, got 1"):
        ct.kernel(warp_specialize=1)(nothing)  # type: ignore[arg-type]
    k = GEMMS[f16]
    keys = {
        jit_disk.disk_key(captured=k.captured, qualname=k.__qualname__, spec=k.specialize(spec),
                          target=SM90, fast_math=False, compiler=COMPILER_VERSION, stages=3,
                          warp_specialize=ws)
        for ws in (False, True)
    }  # fmt: skip
    assert None not in keys and len(keys) == 2


def test_the_tuner_tries_ws_variants_of_the_best_wgmma_configs() -> None:
    found = autotune.candidates(bf16, 8192, 8192, 8192, wgmma=True)
    ws = {c for c in found if c.ws}
    assert autotune.GemmConfig(128, 256, 64, 4, 0, 8, 1) in ws
    assert autotune.GemmConfig(256, 128, 64, 3, 0, 8, 1) in ws
    assert all(c.specialized and c.group_m == 8 and c.warps == 0 for c in ws)
    assert not any(c.ws for c in autotune.candidates(bf16, 8192, 8192, 8192, wgmma=False))
    assert autotune.GemmConfig(128, 256, 64, 4, 0, 8, 1).astuple()[-1] == 1


WS_CANDIDATES = sorted({c for c in autotune.candidates(bf16, 4096, 4096, 4096, wgmma=True) if c.ws})


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("cfg", WS_CANDIDATES, ids=lambda c: "x".join(map(str, c.astuple())))
def test_ws_candidates_assemble_for_sm90a(cfg: autotune.GemmConfig, trans_b: bool) -> None:
    kernel = _gemm_kernel(bf16, bf16, trans_b, False, cfg.stages, None, cfg.group, True)
    spec = (
        ct.PartitionSpec((4096, 4096), (cfg.bm, cfg.bn), bf16),
        ct.TensorSpec((4096, 4096), bf16),
        ct.TensorSpec((4096, 4096), bf16),
    )
    ptx = kernel.ptx(*spec, cfg.bk, target=SM90)
    assert "setmaxnreg.dec" in ptx and "cp.async.bulk.tensor" in ptx
    ops = opcodes_without_spills(ptx, SM90)
    assert any(op.startswith("HGMMA") for op in ops)
    assert any(op.startswith("UTMALDG") for op in ops)
    assert not any(op.startswith("LDGSTS") for op in ops)


def test_ptxas_moves_the_registers(tmp_path: Any) -> None:
    """nvJitLink ignores `setmaxnreg` (ptxas C7504, "to maintain compatibility across
    compilation units"); ptxas on its own keeps it: USETMAXREG in the SASS."""
    import subprocess

    ptxas = find_tool("ptxas")
    if ptxas is None:
        pytest.skip("ptxas not found")
    kernel = _gemm_kernel(bf16, bf16, False, False, 4, None, 8, True)
    spec = (
        ct.PartitionSpec((4096, 4096), (128, 256), bf16),
        ct.TensorSpec((4096, 4096), bf16),
        ct.TensorSpec((4096, 4096), bf16),
    )
    src, cubin = tmp_path / "k.ptx", tmp_path / "k.cubin"
    src.write_text(kernel.ptx(*spec, 64, target=SM90))
    run = subprocess.run(
        [str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(cubin)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "0 bytes spill stores, 0 bytes spill loads" in run.stderr
    try:
        sass = disassemble(cubin.read_bytes())
    except SassUnavailable as e:
        pytest.skip(str(e))
    regs = [i for i in instructions(sass) if i.startswith("USETMAXREG")]
    assert any("TRY_ALLOC" in i and "0xe8" in i for i in regs), regs  # 232 for consumers
    assert any("DEALLOC" in i and "0x28" in i for i in regs), regs  # 40 for the producer
