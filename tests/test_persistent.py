"""Persistent grids (`@ct.kernel(persistent=True)`, `plan_persistent`, `emit_persistent`): a
wave of blocks walks the logical grid's tiles in the (L2-grouped) order a launch would own
them. On the simulator (a device of `SimBackend.sm_count` SMs, race checks on) with more
tiles than blocks and a last round in which some blocks have none: element-wise, sm_80
mma.sync and sm_90 TMA + wgmma GEMMs, the warp-specialized ring kept across tiles (level 2)
or set up per tile, a planted protocol bug, the plan text and sm_90a SASS."""

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
from cutile_py.ir.printer import print_kernel
from cutile_py.lower import emit_tma
from cutile_py.lower.pipeline import lower_kernel
from cutile_py.lower.plan import format_plan
from cutile_py.ptx.target import Target
from cutile_py.runtime import select
from cutile_py.runtime.backend import LaunchFailure, ParamValue
from cutile_py.runtime.nvjitlink import nvjitlink_available
from cutile_py.runtime.sim_backend import SimBackend
from cutile_py_kernels import autotune
from cutile_py_kernels.gemm import _gemm_kernel
from tests.support.active_sim import activate_sim, backends_restored
from tests.support.sass import opcodes_without_spills
from tests.test_tma_pipeline import make_gemm

B = TypeVar("B")
BM = TypeVar("BM")
BN = TypeVar("BN")
SM80, SM90 = Target(80), Target(90)


@pytest.fixture
def restore_backends() -> Iterator[None]:
    with backends_restored():
        yield


def _sim(target: Target, sms: int, **options: Any) -> SimBackend:
    backend = activate_sim(target, **options)
    backend.sm_count = sms
    return backend


def _blocks_launched(kernel: Any, backend: SimBackend) -> tuple[int, int, int]:
    """The grid the kernel's (only) launch plan on `backend` started."""
    (plan,) = kernel._plans[backend].values()
    grid: tuple[int, int, int] = plan.launch.grid
    return grid


@ct.kernel(persistent=True)
def tagged_add(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    """z = x + y + 1000 * bid + 100000 * num_blocks: the logical tile's values."""
    tx = ct.load_tile_like(x, z)
    ty = ct.load_tile_like(y, z)
    z.store(tx + ty + ct.bid(0) * 1000.0 + ct.num_blocks(0) * 100000.0)


@pytest.mark.parametrize("sms", [1, 3, 20])
def test_elementwise_walks_every_tile_once(
    sms: int, rng: np.random.Generator, restore_backends: Any
) -> None:
    """8 tiles (the last ragged) over 1, 3 (rounds of 3, 3, 2: a block has none in the last)
    or 20 SMs (8 blocks: no more than tiles); `ct.bid` / `ct.num_blocks` are the tile's."""
    sim = _sim(SM80, sms)
    n = 64 * 7 + 5
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    z = ct.full((n,), np.nan)
    res, *_ = tagged_add(z.partition((64,)), ct.from_numpy(x), ct.from_numpy(y)).sync()
    want = (x + y) + (np.arange(n) // 64) * 1000.0 + 8 * 100000.0
    np.testing.assert_allclose(res.unpartition().to_numpy(), want.astype(np.float32), rtol=1e-6)
    assert _blocks_launched(tagged_add, sim) == (min(8, sms), 1, 1)


def _plus_one(persistent: bool) -> Any:
    @ct.kernel(persistent=persistent)
    def plus_one(z: Mut[Tensor[f32, BM, BN]], x: Tensor[f32, Dyn, Dyn]) -> None:
        z.store(ct.load_tile_like(x, z) + 1.0)

    return plus_one


def test_the_report_measures_every_tile(restore_backends: Any) -> None:
    """`kernel.report` of a persistent kernel over a 4 x 3 grid of tiles measures all 12,
    as its launched twin does: every byte of x read once, of z written once (it passed the
    walk a 1 x 1 x 1 grid while starting 4 x 3 blocks: one tile per row of blocks counted)."""
    _sim(SM90, 4)
    x = ct.from_numpy(np.ones((250, 300), np.float32))
    got = {}
    for persistent in (False, True):
        z = ct.empty((250, 300)).partition((64, 128))
        r = _plus_one(persistent).report(z, x, target="sm_90")
        got[persistent] = (r.bytes_moved, [(a.read, a.written) for a in r.arguments])
    assert got[True] == got[False]
    assert got[True][0] == 2 * 250 * 300 * 4


@ct.kernel(persistent=True, group_m=2)
def tile_ids(z: Mut[Tensor[f32, B, B]]) -> None:
    """Each tile holds its own (bid(0), bid(1)) and the grid's sizes."""
    tag = ct.bid(0) * 1000 + ct.bid(1) * 10 + ct.num_blocks(0) * 100000 + ct.num_blocks(1)
    z.store(ct.full((z.shape[0], z.shape[1]), 0.0, f32) + tag * 1.0)


def test_tiles_keep_their_owner_in_the_grouped_order(restore_backends: Any) -> None:
    """A 5 x 3 grid of tiles over 4 blocks (rounds 4, 4, 4, 3): every tile is written whole
    by the block that walks it, with its own indices: the same tiles as a launched grid."""
    sim = _sim(SM80, 4)
    res, *_ = tile_ids(ct.full((5 * 16, 3 * 16 - 5), np.nan).partition((16, 16))).sync()
    got = res.unpartition().to_numpy()
    rows, cols = np.indices(got.shape) // 16
    np.testing.assert_array_equal(got, rows * 1000 + cols * 10 + 5 * 100000 + 3)
    assert _blocks_launched(tile_ids, sim) == (4, 1, 1)


def _gemm(dt: type[ct.DType], stages: int, group_m: int | None, ws: bool) -> Any:
    """test_tma_pipeline's GEMM (f32 output), persistent."""
    return make_gemm(dt, stages, ws, group_m, persistent=True)


def _operand(rng: np.random.Generator, shape: tuple[int, ...], dt: type[ct.DType]) -> Any:
    x = round_to(rng.standard_normal(shape).astype(np.float32), dt)
    return x.astype(np.float64), ct.from_numpy(x, dt)


def _check(c: Any, want: np.ndarray) -> None:
    got = c.unpartition().to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _run_gemm(
    kernel: Any, rng: np.random.Generator, dt: type[ct.DType], mnk: tuple[int, int, int],
    tile: tuple[int, int], bk: int,
) -> None:  # fmt: skip
    m, n, k = mnk
    a, ta = _operand(rng, (m, k), dt)
    b, tb = _operand(rng, (k, n), dt)
    out = ct.full((m, n), np.nan).partition(tile)
    res, *_ = kernel(out, ta, tb, bk).sync()
    _check(res, a @ b)


@pytest.mark.parametrize("dt", [f16, bf16], ids=lambda d: d.name)
@pytest.mark.parametrize("group_m", [None, 3])
def test_sm80_mma_sync_gemm(
    dt: type[ct.DType], group_m: int | None, rng: np.random.Generator, restore_backends: Any
) -> None:
    """Level 1 on sm_80: a cp.async ring set up and drained per tile; ragged M, N, K,
    5 x 4 tiles over 3 blocks (the last round has 2), two warp schedules."""
    sim = _sim(SM80, 3, schedules=2)
    kernel = _gemm(dt, 3, group_m, False)
    _run_gemm(kernel, rng, dt, (300, 200, 72), (64, 64), 32)
    assert _blocks_launched(kernel, sim) == (3, 1, 1)
    assert "mma.sync" in kernel.ptx(
        ct.PartitionSpec((300, 200), (64, 64), f32),
        ct.TensorSpec((300, 72), dt),
        ct.TensorSpec((72, 200), dt),
        32,
        target=SM80,
    )


@pytest.mark.parametrize("dt", [f16, bf16], ids=lambda d: d.name)
def test_sm90_tma_ring_per_tile(
    dt: type[ct.DType], rng: np.random.Generator, restore_backends: Any
) -> None:
    """Level 1 on sm_90 without specialization: the TMA ring's mbarriers initialized and
    invalidated per tile; 3 x 4 tiles over 5 blocks (the last round has 2)."""
    _sim(SM90, 5, schedules=2)
    kernel = _gemm(dt, 3, 2, False)
    _run_gemm(kernel, rng, dt, (300, 200, 104), (128, 64), 32)


WS_SHAPES = [(300, 264, 104), (130, 200, 72)]


@pytest.mark.parametrize("dt", [f16, bf16], ids=lambda d: d.name)
@pytest.mark.parametrize("mnk", WS_SHAPES)
def test_sm90_ws_ring_kept_across_tiles(
    dt: type[ct.DType], mnk: tuple[int, int, int], rng: np.random.Generator, restore_backends: Any
) -> None:
    """Level 2: the full/empty mbarriers initialized once per block, phases running on
    across tiles (4 or 3 K steps over 3 stages: tiles start at different stages), the
    producer filling the next tile's stages during this one's epilogue. 3 x 5 or 2 x 4
    tiles over 4 blocks (the last round has 3 or none missing), three warp schedules, race
    checks on."""
    sim = _sim(SM90, 4, schedules=3)
    kernel = _gemm(dt, 3, 2, True)
    m, n, k = mnk
    spec = (ct.PartitionSpec((m, n), (128, 64), f32), ct.TensorSpec((m, k), dt))
    compiled = kernel.compile(*spec, ct.TensorSpec((k, n), dt), 32, target=SM90)
    assert compiled.lowered is not None and compiled.lowered.plan is not None
    ptx = compiled.lowered.ptx
    assert compiled.lowered.plan.persistent is not None
    assert compiled.lowered.plan.persistent.kept is not None
    # Once per block, not per tile: 3 full and 3 empty barriers.
    assert ptx.count("mbarrier.init.shared::cta.b64") == 6
    assert ptx.count("mbarrier.inval.shared::cta.b64") == 6
    assert ptx.count("setmaxnreg.dec") == 1
    _run_gemm(kernel, rng, dt, mnk, (128, 64), 32)
    assert _blocks_launched(kernel, sim) == (4, 1, 1)


@pytest.mark.parametrize("dt", [f16, bf16], ids=lambda d: d.name)
def test_library_candidates_run_persistent(
    dt: type[ct.DType], rng: np.random.Generator, restore_backends: Any
) -> None:
    """The tuner's persistent candidates (warp-specialized; with this f32 output 128 x 256
    and 256 x 128 set the ring up per tile, the epilogue's staging tile over it; 128 x 128
    keeps the ring) at ragged M, N, K: 3 x 2, 2 x 3 and 3 x 3 tiles over 4 blocks (in the last
    round 2 or 3 blocks have none)."""
    _sim(SM90, 4, schedules=2)
    kept = {}
    for bm, bn, stages in autotune.PERSISTENT:
        kernel = _gemm_kernel(dt, f32, False, False, stages, None, 2, True, True)
        _run_gemm(kernel, rng, dt, (300, 264, 200), (bm, bn), 64)
        spec = (ct.PartitionSpec((300, 264), (bm, bn), f32), ct.TensorSpec((300, 200), dt))
        lowered = kernel.compile(*spec, ct.TensorSpec((200, 264), dt), 64).lowered
        assert lowered is not None and lowered.plan is not None
        assert lowered.plan.persistent is not None
        kept[bm, bn] = lowered.plan.persistent.kept is not None
        assert lowered.ptx.count("setmaxnreg.dec") == 1
    assert kept == {(128, 256): False, (256, 128): False, (128, 128): True}


def test_library_candidates_keep_their_rings_with_a_16_bit_output(
    rng: np.random.Generator, restore_backends: Any
) -> None:
    """With a bf16 output the epilogue is a TMA store whose staging tile (64 KiB at
    128 x 256) fits past a 144 KiB ring: every persistent candidate keeps its ring across
    tiles; 128 x 256 runs so at ragged M, N, K, 3 x 2 tiles over 4 blocks."""
    _sim(SM90, 4, schedules=2)
    for bm, bn, stages in autotune.PERSISTENT:
        kernel = _gemm_kernel(bf16, bf16, False, False, stages, None, 2, True, True)
        spec = (ct.PartitionSpec((300, 264), (bm, bn), bf16), ct.TensorSpec((300, 200), bf16))
        lowered = kernel.compile(*spec, ct.TensorSpec((200, 264), bf16), 64).lowered
        assert lowered is not None and lowered.plan is not None
        assert lowered.plan.persistent is not None and lowered.plan.persistent.kept is not None
        assert lowered.plan.stores.tma and "cp.async.bulk.tensor.2d.global" in lowered.ptx
    _check_bf16_300x264(_gemm_kernel(bf16, bf16, False, False, 3, None, 2, True, True), rng)


def _check_bf16_300x264(kernel: Any, rng: np.random.Generator) -> None:
    """`kernel` (a 128 x 256 x 64 bf16 GEMM) at 300 x 264 x 200 against NumPy."""
    a, ta = _operand(rng, (300, 200), bf16)
    b, tb = _operand(rng, (200, 264), bf16)
    res, *_ = kernel(ct.full((300, 264), np.nan, bf16).partition((128, 256)), ta, tb, 64).sync()
    got = res.unpartition().to_numpy().astype(np.float64)
    want = a @ b
    np.testing.assert_allclose(got, want, rtol=2**-7, atol=2**-7 * np.abs(want).max())


def _reset_phase_per_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant the bug of a persistent ring that restarts per tile: each tile's loop waits
    from stage 0 on parity 0 again, while the producer runs on."""
    prologue = emit_tma.WsPipeline.prologue

    def restart(self: Any, iv: Any, step: Any) -> None:
        prologue(self, iv, step)
        fb = self.em.fb
        fb.ins("mov.u32", self.phase, 0)
        fb.ins("mov.u32", self.read, self.ring)
        fb.ins("add.u32", self.bar_read, self.em.smem, self.bars)

    monkeypatch.setattr(emit_tma.WsPipeline, "prologue", restart)


def test_a_phase_reset_per_tile_is_reported(
    rng: np.random.Generator, restore_backends: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = _sim(SM90, 1)
    m, n, k = 256, 128, 128  # 4 tiles, 4 K steps over 3 stages, one block walks them all
    a, ta = _operand(rng, (m, k), f16)
    b, tb = _operand(rng, (k, n), f16)
    c = ct.zeros((m, n), f32).partition((128, 64))
    compiled = _gemm(f16, 3, None, True).compile(c, ta, tb, 32, target=SM90)
    good = compiled.lowered
    assert good is not None
    _reset_phase_per_tile(monkeypatch)
    broken = lower_kernel(compiled.ir, SM90)
    assert broken.ptx != good.ptx
    reader = ParamReader(good)
    with pytest.raises(ValueError, match="grid: a persistent kernel's parameters"):
        reader([c, ta, tb, 32], sim)  # no grid: it would walk a 1 x 1 x 1 one
    raw = reader([c, ta, tb, 32], sim, grid=(2, 2, 1))
    values = [ParamValue(t, v) for t, v in zip(reader.ptypes, raw)]

    def launch(ptx: str) -> Any:
        kernel = sim.load_kernel(ptx, good.entry)
        return sim.launch(kernel, (1, 1, 1), (good.block_threads, 1, 1),
                          good.dynamic_shared, values)  # fmt: skip

    launch(good.ptx).wait()
    _check(c, a @ b)
    # The consumers wait on stage 0's full barrier for a phase the producer, running on at
    # stage 1, never fills; the producer waits for a stage no consumer hands back.
    with pytest.raises(LaunchFailure, match="a deadlock: no thread of the batch can go on"):
        launch(broken.ptx).wait()


def test_the_plan_says_what_wraps_what() -> None:
    dt = f16
    spec = (
        ct.PartitionSpec((512, 512), (128, 64), f32),
        ct.TensorSpec((512, 256), dt),
        ct.TensorSpec((256, 512), dt),
    )
    kept = _gemm(dt, 3, 8, True).compile(*spec, 32, target=SM90)
    assert kept.lowered is not None and kept.lowered.plan is not None
    text = format_plan(kept.ir, kept.lowered.plan)
    assert "persistent: one wave of blocks; block b runs the body for tiles b" in text
    assert "L2-grouped by group_m=8; a block barrier between tiles; the whole body" in text
    assert "ring of for %" in text and "kept across tiles: its mbarriers initialized once" in text
    assert "ring: [0, 36992) across tiles, the whole kernel" in text
    # The epilogue's staging tile (a TMA store) lies past the ring, which the producer fills.
    staged = re.search(r"tma store staging of store of [^:]*: \[(\d+), (\d+)\)", text)
    assert staged is not None and int(staged[1]) >= 36992
    assert " persistent {" in print_kernel(kept.ir)
    plain = _gemm(dt, 3, None, False).compile(*spec, 32, target=SM90)
    assert plain.lowered is not None and plain.lowered.plan is not None
    text = format_plan(plain.ir, plain.lowered.plan)
    assert "in launch order; a block barrier between tiles" in text
    assert "rings set up and drained per tile: no warp-specialized loop" in text
    big = _gemm_kernel(dt, f32, False, False, 3, None, 8, True, True)
    spec_big = (ct.PartitionSpec((4096, 4096), (128, 256), f32), *spec[1:])
    lib = big.compile(*spec_big, 64, target=SM90)
    assert lib.lowered is not None and lib.lowered.plan is not None
    text = format_plan(lib.ir, lib.lowered.plan)
    assert "rings set up and drained per tile: the warp-specialized ring kept across" in text
    assert "warp specialized: consumers" in text


def test_the_option_is_checked_and_keyed() -> None:
    with pytest.raises(TypeError, match="persistent must be a bool, got 1"):
        ct.kernel(persistent=1)(tagged_add.fn)  # type: ignore[arg-type]
    spec = (ct.PartitionSpec((256,), (64,), f32), ct.TensorSpec((256,), f32))
    one = tagged_add.compile(*spec, spec[1], target=SM80)
    other = ct.kernel(tagged_add.fn).compile(*spec, spec[1], target=SM80)
    assert one.lowered is not None and other.lowered is not None
    assert "grid0" in one.lowered.ptx and "grid0" not in other.lowered.ptx
    assert one.lowered.persistent and not other.lowered.persistent
    keys = [
        jit_disk.disk_key(
            captured=tagged_add.captured,
            qualname="q",
            spec=None,
            target=SM80,
            fast_math=False,
            compiler=COMPILER_VERSION,
            persistent=p,
        )
        for p in (False, True)
    ]
    assert keys[0] != keys[1]


def test_interpret_runs_a_persistent_kernel_as_launched(
    rng: np.random.Generator, restore_backends: Any
) -> None:
    ct.set_backend("interpret")
    n = 64 * 3 + 1
    x = rng.standard_normal(n).astype(np.float32)
    z = ct.full((n,), np.nan)
    res, *_ = tagged_add(z.partition((64,)), ct.from_numpy(x), ct.from_numpy(x)).sync()
    want = 2 * x + (np.arange(n) // 64) * 1000.0 + 4 * 100000.0
    np.testing.assert_allclose(res.unpartition().to_numpy(), want.astype(np.float32), rtol=1e-6)


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
@pytest.mark.parametrize("bm,bn,stages", autotune.PERSISTENT)
def test_persistent_ws_gemm_sass_has_no_spills(bm: int, bn: int, stages: int) -> None:
    kernel = _gemm_kernel(bf16, bf16, False, False, stages, None, 8, True, True)
    spec = (
        ct.PartitionSpec((8192, 8192), (bm, bn), bf16),
        ct.TensorSpec((8192, 8192), bf16),
        ct.TensorSpec((8192, 8192), bf16),
    )
    ptx = kernel.ptx(*spec, 64, target=SM90)
    assert "setmaxnreg.dec" in ptx and ".param .u32 grid0" in ptx
    ops = opcodes_without_spills(ptx, SM90)
    assert any(op.startswith("HGMMA") for op in ops)
    assert any(op.startswith("UTMALDG") for op in ops)


def test_read_back_from_the_disk_cache(
    rng: np.random.Generator,
    restore_backends: Any,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The grid parameters are in the stored parameter map: a kernel read back from disk
    (no plan, no IR) still launches one wave and walks the tiles."""
    from cutile_py.host import kernel as kmod

    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path / "cache"))
    spec = (ct.PartitionSpec((700,), (64,), f32), ct.TensorSpec((700,), f32))
    tagged_add.compile(*spec, spec[1], target=SM80)
    kmod._CACHE.clear()  # as if in a new process
    before = ct.cache_info().disk_hits
    sim = _sim(SM80, 3)
    x = rng.standard_normal(700).astype(np.float32)
    res, *_ = tagged_add(ct.full((700,), np.nan).partition((64,)), ct.from_numpy(x),
                         ct.from_numpy(x)).sync()  # fmt: skip
    assert ct.cache_info().disk_hits == before + 1
    want = 2 * x + (np.arange(700) // 64) * 1000.0 + 11 * 100000.0
    np.testing.assert_allclose(res.unpartition().to_numpy(), want.astype(np.float32), rtol=1e-6)
    assert _blocks_launched(tagged_add, sim) == (3, 1, 1)


R = TypeVar("R")
C = TypeVar("C")


@ct.kernel(persistent=True, num_warps=4)
def centered_rows(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """z = x - max(x) per row: the row maximum crosses warps through shared memory, which
    the next tile's reduction reuses."""
    t = ct.load_tile_like(x, z)
    z.store(t - ct.max(t, axis=1, keepdims=True))


def _rows(rng: np.random.Generator, sim: SimBackend) -> tuple[Any, np.ndarray]:
    x = rng.standard_normal((37, 900)).astype(np.float32)
    res, *_ = centered_rows(ct.full((37, 900), np.nan).partition((4, 1024)),
                            ct.from_numpy(x)).sync()  # fmt: skip
    return res, x - x.max(axis=1, keepdims=True)


def test_row_kernel_reuses_shared_memory_between_tiles(
    rng: np.random.Generator, restore_backends: Any
) -> None:
    """10 row tiles (the last ragged, and 900 of 1024 columns) over 3 blocks, two warp
    schedules, race checks on: one tile's cross-warp reduction reuses the shared memory of
    the previous one's."""
    sim = _sim(SM80, 3, schedules=2)
    res, want = _rows(rng, sim)
    np.testing.assert_array_equal(res.unpartition().to_numpy(), want)
    assert _blocks_launched(centered_rows, sim) == (3, 1, 1)


def test_an_empty_k_loop_keeps_the_ring_in_step(
    rng: np.random.Generator, restore_backends: Any
) -> None:
    """K = 0: no tile issues or awaits a stage (nothing to hand back), every tile is zeros."""
    _sim(SM90, 2)
    kernel = _gemm(f16, 3, None, True)
    _, ta = _operand(rng, (300, 0), f16)
    _, tb = _operand(rng, (0, 130), f16)
    res, *_ = kernel(ct.full((300, 130), np.nan).partition((128, 64)), ta, tb, 32).sync()
    assert (res.unpartition().to_numpy() == 0).all()


def test_the_cuda_backend_sizes_the_wave_by_occupancy(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a stand-in driver: SMs x the blocks the occupancy query allows for the kernel's
    threads and dynamic shared memory (allowed first: the driver counts no block past the
    function's limit), at most one block per tile."""
    from cutile_py.host.launch import prepare_lowered
    from cutile_py.runtime import cuda_driver as cu
    from cutile_py.runtime.cuda_backend import CudaBackend
    from tests.support.fake_driver import FakeDriver, vector_add_ptx

    driver = FakeDriver()
    monkeypatch.setattr(cu, "_cu", lambda: driver)
    backend = CudaBackend()
    kernel = backend.load_kernel(vector_add_ptx(SM90), "vadd")
    assert backend.resident_blocks(kernel, 384, 100_000) == 264
    assert driver.occupancy_asked == [("vadd", 384, 100_000)]
    assert kernel.max_dynamic_shared == 100_000  # allowed before the query, as a launch does
    spec = (ct.PartitionSpec((64 * 1000,), (64,), f32), ct.TensorSpec((64 * 1000,), f32))
    lowered = tagged_add.compile(*spec, spec[1], target=SM90).lowered
    assert lowered is not None
    for tiles, blocks in ((1000, 264), (100, 100)):
        launch = prepare_lowered(backend, kernel, lowered, (tiles,))
        assert vars(launch)["_grid"] == (blocks, 1, 1)


@ct.kernel(stages=2, group_m=2, warp_specialize=True, persistent=True)
def staircase(
    c: Mut[Tensor[f32, BM, BN]], a: Tensor[f16, Dyn, Dyn], b: Tensor[f16, Dyn, Dyn]
) -> None:
    """Row tile i sums K steps 0..i only: tiles of 1, 2, 3, ... iterations, so each tile
    starts the kept ring at another stage and phase."""
    acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
    for kk in range(ct.bid(0) + 1):
        ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], 32))
        tb = ct.load(b, (kk, ct.bid(1)), (32, c.shape[1]))
        acc = ct.mma(ta, tb, acc)
    c.store(acc)


def test_tiles_of_different_trip_counts_share_the_kept_ring(
    rng: np.random.Generator, restore_backends: Any
) -> None:
    """5 x 3 tiles of 1 to 5 K steps over 2 stages, walked by 4 blocks under three warp
    schedules: the producer's and the consumers' running stage and parity stay in step."""
    _sim(SM90, 4, schedules=3)
    m, n, k = 5 * 64 - 10, 152, 152  # ragged; the last tile's K steps reach 160
    a, ta = _operand(rng, (m, k), f16)
    b, tb = _operand(rng, (k, n), f16)
    res, *_ = staircase(ct.full((m, n), np.nan).partition((64, 64)), ta, tb).sync()
    want = np.empty((m, n))
    for i in range(5):
        rows, kmax = slice(64 * i, 64 * (i + 1)), 32 * (i + 1)
        want[rows] = a[rows, :kmax] @ b[:kmax]
    _check(res, want)
    lowered = staircase.compile(
        ct.PartitionSpec((m, n), (64, 64), f32), ct.TensorSpec((m, k), f16),
        ct.TensorSpec((k, n), f16), target=SM90,
    ).lowered  # fmt: skip
    assert lowered is not None and lowered.plan is not None
    assert lowered.plan.persistent is not None and lowered.plan.persistent.kept is not None


def test_the_tuner_tries_persistent_variants() -> None:
    """On wgmma targets, persistent twins of the best warp-specialized configs; their cache
    form carries the field (and a config without it keeps its earlier form)."""
    cands = autotune.candidates(bf16, 8192, 8192, 8192, wgmma=True)
    persistent = [c for c in cands if c.persists]
    assert persistent == sorted(
        autotune.GemmConfig(bm, bn, 64, stages, 0, autotune.GROUP_M, 1, 1)
        for bm, bn, stages in autotune.PERSISTENT
    )
    for c in persistent:
        assert autotune.GemmConfig(*c.astuple()) == c and c.astuple()[-2:] == [1, 1]
    assert autotune.GemmConfig(128, 256, 64, 3, 0, 8, 1).astuple() == [128, 256, 64, 3, 0, 8, 1]
    assert not any(c.persists for c in autotune.candidates(bf16, 8192, 8192, 8192))


@pytest.mark.gpu
@pytest.mark.parametrize("odt", [bf16, f32], ids=lambda d: d.name)
@pytest.mark.parametrize("cfg", autotune.PERSISTENT, ids=lambda c: "x".join(map(str, c)))
def test_the_tuners_persistent_configs_on_the_gpu_at_a_ragged_shape(
    cfg: tuple[int, int, int], odt: type[ct.DType], rng: np.random.Generator, restore_backends: Any
) -> None:
    """Each persistent candidate on the device (none ran on one before this test), at M =
    2900, N = 2904 (rows of 16-byte multiples: TMA loads and stores, warp-specialized), K =
    200: 276 to 529 ragged tiles, so a wave of one block per SM walks two or more tiles each
    and the kept ring (bf16 out; f32 out sets it up per tile) wraps across tiles; the TMA
    store clips the edges. Every element against NumPy."""
    bm, bn, stages = cfg
    ct.set_backend("cuda")
    backend = select.active_backend()
    m, n, k = 2900, 2904, 200
    trans_b = bm > bn  # both B layouts over the three configs
    a = round_to(rng.standard_normal((m, k)).astype(np.float32), bf16)
    b = round_to(rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32), bf16)
    kernel = _gemm_kernel(bf16, odt, trans_b, False, stages, None, autotune.GROUP_M, True, True)
    out = ct.full((m, n), np.nan, odt).partition((bm, bn))
    ta, tb = ct.from_numpy(a, bf16), ct.from_numpy(b, bf16)
    ptx = kernel.ptx(out, ta, tb, 64)
    assert "global.shared::cta.bulk_group" in ptx and "setmaxnreg" in ptx
    res, *_ = kernel(out, ta, tb, 64).sync()
    tiles = -(-m // bm) * -(-n // bn)
    (plan,) = kernel._plans[backend].values()
    assert vars(plan.launch)["_grid"][0] < tiles  # CudaPreparedLaunch's grid: a wave
    got = res.unpartition().to_numpy().astype(np.float64)
    want = a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
    # The output's rounding (bf16: 2^-8; f32: 2^-22) and f32 sums of exact products.
    rel = 2.0**-8 if odt is bf16 else 2.0**-22
    tol = rel * np.abs(want) + 1e-4 * (np.abs(a) @ np.abs(b.T if trans_b else b)) + 1e-30
    assert np.isfinite(got).all()
    err = np.abs(got - want)
    worst = np.unravel_index(np.argmax(err / tol), err.shape)
    assert (err <= tol).all(), f"at {worst}: got {got[worst]}, want {want[worst]}"


def _staging_store_kernel() -> tuple[Any, Any, Any]:
    """The persistent warp-specialized 128 x 256 x 64 GEMM with a bf16 output (its ring kept
    across tiles, a TMA store epilogue staged past it), its IR for 300 x 264 x 200 (3 x 2
    tiles) and that lowered afresh (a compile read back from a cache has no plan)."""
    kernel = _gemm_kernel(bf16, bf16, False, False, 3, None, 2, True, True)
    spec = (ct.PartitionSpec((300, 264), (128, 256), bf16), ct.TensorSpec((300, 200), bf16))
    ir = kernel.compile(*spec, ct.TensorSpec((200, 264), bf16), 64, target=SM90).ir
    return kernel, ir, lower_kernel(ir, SM90)


def test_a_kept_rings_tma_store_is_waited_for_at_the_next_epilogue(
    rng: np.random.Generator, restore_backends: Any
) -> None:
    """With the ring kept and nothing else over the staging tile, the next tile's loop does
    not wait for the copy engine to read it: thread 0 waits at the next epilogue, before the
    staging tile is written again, and once more at the block's end. One block walks all 6
    tiles (three warp schedules, race checks on)."""
    _sim(SM90, 1, schedules=3)
    kernel, ir, lowered = _staging_store_kernel()
    assert lowered.plan is not None
    persistent = lowered.plan.persistent
    assert persistent is not None and persistent.kept is not None
    assert persistent.deferred == frozenset(lowered.plan.stores.tma)
    assert "its staging read waited for at the next tile's epilogue" in format_plan(
        ir, lowered.plan
    )
    ptx = lowered.ptx
    waits = [m.start() for m in re.finditer(r"cp\.async\.bulk\.wait_group\.read 0;", ptx)]
    walked = re.search(r"\$__tiles_done_\d+:", ptx)
    assert walked is not None
    commit, walked = ptx.index("cp.async.bulk.commit_group;"), walked.start()
    assert len(waits) == 2 and waits[0] < ptx.index("stmatrix") and commit < walked < waits[1]
    _check_bf16_300x264(kernel, rng)


#: What each planted bug leaves out of the deferred epilogue, and what the simulator says.
DROPPED = {
    "the wait at the next epilogue": "may still be reading",
    "the barrier after that wait": "shared-memory race: this thread writes",
    "the wait at the end": "still pending",
}


@pytest.mark.parametrize("dropped", list(DROPPED))
def test_a_deferred_store_wait_dropped_is_reported(
    dropped: str, rng: np.random.Generator, restore_backends: Any
) -> None:
    """Without the wait at the next epilogue the next tile's staging writes overwrite what
    the copy engine may still read; without the barrier after it other warps write the
    staging tile with nothing ordering them after thread 0's wait (in the simulator's
    lock-step the wait lands first all the same: the race check, not the data, must say so);
    without the wait at the end the block exits with its last store pending."""
    sim = _sim(SM90, 1)
    _, _, good = _staging_store_kernel()
    wait = re.compile(r"\t@%p\d+ cp\.async\.bulk\.wait_group\.read 0;\n(\tbar\.sync 1, 256;\n)?")
    found = list(wait.finditer(good.ptx))
    assert len(found) == 2 and found[0].group(1) is not None
    if dropped == "the wait at the next epilogue":
        cut = (found[0].start(), found[0].start(1))
    elif dropped == "the barrier after that wait":
        cut = (found[0].start(1), found[0].end())
    else:
        cut = (found[1].start(), found[1].end())
    broken = good.ptx[: cut[0]] + good.ptx[cut[1] :]
    _, ta = _operand(rng, (300, 200), bf16)
    _, tb = _operand(rng, (200, 264), bf16)
    c = ct.zeros((300, 264), bf16).partition((128, 256))
    reader = ParamReader(good)
    raw = reader([c, ta, tb, 64], sim, grid=(*c.grid, 1))
    values = [ParamValue(t, v) for t, v in zip(reader.ptypes, raw)]
    kernel = sim.load_kernel(broken, good.entry)
    with pytest.raises(LaunchFailure, match=DROPPED[dropped]):
        sim.launch(kernel, (1, 1, 1), (good.block_threads, 1, 1), good.dynamic_shared,
                   values).wait()  # fmt: skip
