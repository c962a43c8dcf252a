"""TMA-fed pipelines on sm_90: a K loop's operand tiles copied by `cp.async.bulk.tensor`
into mbarrier-guarded stages (`plan_tma`, `emit_tma`), run on the simulator as an sm_90
device with race checks on, assembled for sm_90, and launched on the cuda backend over the
null driver (which records the tensor maps the host makes)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, bf16, f16, f32
from cutile_py.host import jit_disk
from cutile_py.host import kernel as kmod
from cutile_py.host.launch import ParamReader
from cutile_py.ptx.target import Target
from cutile_py.runtime.backend import LaunchFailure, ParamValue
from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available
from cutile_py.runtime.sass import SassUnavailable, disassemble
from cutile_py.runtime.sim_backend import SimBackend
from tests.support.active_sim import active_sim

BM = TypeVar("BM")
BN = TypeVar("BN")
Elem = f16  # rebound per dtype by `make_gemm` (f16 for mypy)
NP = {f16: np.float16, bf16: np.float32, f32: np.float32}


def make_gemm(
    dt: type[ct.DType],
    stages: int | None = None,
    warp_specialize: bool = False,
    group_m: int | None = None,
    persistent: bool = False,
) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel(
        stages=stages, warp_specialize=warp_specialize, group_m=group_m, persistent=persistent
    )
    def gemm(
        c: Mut[Tensor[f32, BM, BN]],
        a: Tensor[Elem, Dyn, Dyn],
        b: Tensor[Elem, Dyn, Dyn],
        BK: ct.Constant[int],
    ) -> None:
        acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
        for kk in range(ct.num_tiles(a, 1, BK)):
            ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
            tb = ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1]))
            acc = ct.mma(ta, tb, acc)
        c.store(acc)

    return gemm


GEMMS = {dt: make_gemm(dt) for dt in (f16, bf16, f32)}


@pytest.fixture
def sim90() -> Iterator[SimBackend]:
    """The simulator as an sm_90 device (TMA, mbarriers), race checks on, active."""
    with active_sim(Target(90)) as backend:
        yield backend


def _values(rng: np.random.Generator, shape: tuple[int, int], dt: type[ct.DType]) -> np.ndarray:
    """Random values exactly representable in `dt` (as the NumPy type `from_numpy` takes)."""
    x = rng.standard_normal(shape).astype(np.float32)
    if dt is bf16:
        x = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    return x.astype(NP[dt])


def _run(
    dt: type[ct.DType], a: np.ndarray, b: np.ndarray, tiles: tuple[int, int, int]
) -> np.ndarray:
    bm, bn, bk = tiles
    m, n = a.shape[0], b.shape[1]
    c = ct.full((m, n), float("nan"), f32)  # poisoned: every element must be written
    src_a, src_b = ct.from_numpy(a, dtype=dt), ct.from_numpy(b, dtype=dt)
    out, *_ = GEMMS[dt](c.partition((bm, bn)), src_a, src_b, bk).sync()
    result: np.ndarray = out.unpartition().to_numpy()
    return result


def test_an_empty_k_gives_the_initial_accumulator(sim90: SimBackend) -> None:
    """K = 0: the driver refuses a tensor map with a zero extent, and the loop issues no TMA
    copy, so the launch passes a blank map and the accumulator (zeros) is stored."""
    for dt in (f16, f32):
        a, b = np.zeros((40, 0), NP[dt]), np.zeros((0, 24), NP[dt])
        np.testing.assert_array_equal(_run(dt, a, b, (64, 64, 64)), 0.0)


#: Tile shapes covering every tensor-map swizzle: rows of 128 bytes (128B swizzle), 64
#: (64B), 32 (32B) and 16 (none); B's rows are BN elements, A's BK.
COPY_TILES = [
    (f16, (64, 64, 64)),  # A 128 B, B 128 B
    (f16, (32, 32, 32)),  # 64, 64
    (bf16, (32, 16, 16)),  # 32, 32
    (f16, (16, 8, 64)),  # 128, 16
    (f16, (16, 128, 16)),  # mma.sync: A 32 by TMA; B 256: by cp.async beside it
    (f16, (64, 128, 32)),  # wgmma: B MN-major in 2 panels of 128 B, a box each
    (f16, (64, 64, 128)),  # wgmma: A K-major in 2 panels of 128 B, a box each
]


@pytest.mark.parametrize(("dt", "tiles"), COPY_TILES)
def test_tma_tile_copy_is_exact(
    sim90: SimBackend, rng: np.random.Generator, dt: type[ct.DType], tiles: tuple[int, int, int]
) -> None:
    """A @ I with I an identity: each output element is one element of A times 1.0, so every
    element a box put in the wrong place (a swizzle, an offset, a coordinate) shows, exactly.
    Ragged M and K (K a multiple of 8: rows of 16 bytes, as a tensor map needs): the boxes
    past the edges arrive as zeros. K > BN: every column of a B tile (each of its panels)
    is an identity column somewhere."""
    bm, bn, bk = tiles
    low = max(bk, bn) // 8 + 1
    m, k = int(rng.integers(1, 3 * bm)), 8 * int(rng.integers(low, low + 3 * bk // 8))
    n = min(k, 3 * bn)
    a = _values(rng, (m, k), dt)
    eye = np.eye(k, n, dtype=NP[dt])
    spec = ct.PartitionSpec((m, n), (bm, bn), f32), ct.TensorSpec((m, k), dt)
    assert "cp.async.bulk.tensor" in GEMMS[dt].ptx(*spec, ct.TensorSpec((k, n), dt), bk, target=90)
    got = _run(dt, a, eye, tiles)
    np.testing.assert_array_equal(got, a[:, :n].astype(np.float32))


@pytest.mark.parametrize(
    ("dt", "tiles", "mnk"),
    [
        (f16, (64, 64, 32), (200, 136, 104)),
        (bf16, (32, 64, 64), (70, 130, 150)),
        (f16, (64, 32, 16), (64, 96, 16)),  # one K step: the ring never wraps
        (f16, (64, 128, 32), (130, 260, 200)),  # B's 256-byte rows: a box per panel
        (f16, (16, 128, 32), (40, 260, 72)),  # mma.sync: B (256-byte rows) by cp.async
    ],
)
def test_tma_gemm_matches_numpy_at_ragged_shapes(
    sim90: SimBackend,
    rng: np.random.Generator,
    dt: type[ct.DType],
    tiles: tuple[int, int, int],
    mnk: tuple[int, int, int],
) -> None:
    m, n, k = mnk
    a, b = _values(rng, (m, k), dt), _values(rng, (k, n), dt)
    got = _run(dt, a, b, tiles)
    want = a.astype(np.float64) @ b.astype(np.float64)
    bound = k * 2.0**-22 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    assert (np.abs(got - want) <= bound + 1e-6).all()


@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("tiles", [(64, 64, 32), (32, 128, 16)])
def test_tma_rings_of_one_and_two_stages(
    sim90: SimBackend, rng: np.random.Generator, stages: int, tiles: tuple[int, int, int]
) -> None:
    """One stage (refilled after a barrier, waited at once: the phase flips every
    iteration) and two (the ring wraps every other one), pure TMA and mixed with cp.async."""
    m, n, k = 90, 152, 72
    a, b = _values(rng, (m, k), f16), _values(rng, (k, n), f16)
    c = ct.full((m, n), float("nan"), f32).partition(tiles[:2])
    src = ct.from_numpy(a), ct.from_numpy(b)
    gemm = make_gemm(f16, stages)
    assert "cp.async.bulk.tensor" in gemm.ptx(c, *src, tiles[2], target=90)
    out, *_ = gemm(c, *src, tiles[2]).sync()
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out.unpartition().to_numpy(), want, rtol=1e-5, atol=1e-4)


@ct.kernel
def gemm_descending(
    c: Mut[Tensor[f32, BM, BN]],
    a: Tensor[f16, Dyn, Dyn],
    b: Tensor[f16, Dyn, Dyn],
    BK: ct.Constant[int],
) -> None:
    """K tiles from the last to the first: iterations past the end are below the bound."""
    acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
    for kk in range(ct.num_tiles(a, 1, BK) - 1, -1, -1):
        ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
        tb = ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1]))
        acc = ct.mma(ta, tb, acc)
    c.store(acc)


def test_tma_descending_loop(sim90: SimBackend, rng: np.random.Generator) -> None:
    m, n, k = 70, 72, 104
    a, b = _values(rng, (m, k), f16), _values(rng, (k, n), f16)
    c = ct.full((m, n), float("nan"), f32).partition((64, 64))
    src = ct.from_numpy(a), ct.from_numpy(b)
    assert "cp.async.bulk.tensor" in gemm_descending.ptx(c, *src, 32, target=90)
    out, *_ = gemm_descending(c, *src, 32).sync()
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out.unpartition().to_numpy(), want, rtol=1e-5, atol=1e-4)


def _spec(dt: type[ct.DType], tiles: tuple[int, int, int], k: int = 256) -> tuple[Any, ...]:
    bm, bn, bk = tiles
    return (
        ct.PartitionSpec((256, 256), (bm, bn), f32),
        ct.TensorSpec((256, k), dt),
        ct.TensorSpec((k, 256), dt),
        bk,
    )


def test_sm90_ptx_is_tma_and_assembles_to_utmaldg() -> None:
    lowered = GEMMS[f16].compile(*_spec(f16, (64, 64, 32)), target=ct.Target(90)).lowered
    ptx = lowered.ptx
    assert ".param .align 64 .b8 p1_map0[128]" in ptx and ".param .align 64 .b8 p2_map1[128]" in ptx
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "mbarrier.try_wait.parity.shared::cta.b64" in ptx
    assert "mbarrier.arrive.expect_tx.shared::cta.b64 _" in ptx
    assert "fence.proxy.async.shared::cta;" in ptx
    assert "cp.async.cg" not in ptx and ".shared .align 1024 .b8 smem[" in ptx
    assert [(p.what, p.box, p.swizzle, p.map_dtype) for p in lowered.params[-3:]] == [
        ("tmap", (32, 64), 2, 6),  # A: 64 x 32 f16, rows of 64 bytes
        ("tmap", (64, 32), 3, 6),  # B: 32 x 64 f16, rows of 128 bytes
        ("tmap", (8, 64), 0, 7),  # C's TMA store: 64 x 8 f32 panels
    ]
    # sm_80 keeps cp.async.
    assert "cp.async.bulk" not in GEMMS[f16].ptx(*_spec(f16, (64, 64, 32)), target=80)
    if not nvjitlink_available():
        pytest.skip("the nvJitLink library cannot be loaded")
    asm = assemble(ptx, Target(90))
    assert asm.spill_free
    try:
        sass = disassemble(asm.cubin)
    except SassUnavailable as e:
        pytest.skip(str(e))
    assert re.search(r"\bUTMALDG\.2D\b", sass)
    assert re.search(r"\bSYNCS\.PHASECHK\.TRANS64\.TRYWAIT\b", sass)
    # Target(90) is sm_90a: the TMA-fed stages feed wgmma.
    assert re.search(r"\bHGMMA\.", sass) and not re.search(r"\bHMMA\.", sass)


def test_wide_wgmma_tiles_are_a_box_per_panel() -> None:
    """128 x 256 x 64 f16: A's 128-byte rows are one box; B's rows of 512 bytes are 4 panels
    of 64 x 128 bytes, each filled by a box of 64 x 64 (inner coordinate a panel further,
    destination 8 KiB further), from one tensor map; no cp.async is left."""
    lowered = GEMMS[f16].compile(*_spec(f16, (128, 256, 64)), target=ct.Target(90)).lowered
    assert [(p.what, p.box, p.swizzle) for p in lowered.params[-3:-1]] == [
        ("tmap", (64, 128), 3),
        ("tmap", (64, 64), 3),
    ]
    ptx = lowered.ptx
    assert "cp.async.cg" not in ptx and "cp.async.ca" not in ptx
    issues = re.findall(
        r"cp\.async\.bulk\.tensor\.2d\S+ \[%r\d+(?:\+(\d+))?\], \[(%rd\d+), \{(%r\d+), (%r\d+)\}\]",
        ptx,
    )
    assert len(issues) % 5 == 0 and issues  # 5 boxes per issue
    first = issues[:5]
    assert [int(x[0] or 0) for x in first] == [0, 16384, 24576, 32768, 40960]
    assert len({x[1] for x in first[1:]}) == 1 and first[0][1] != first[1][1]
    assert len({x[3] for x in first[1:]}) == 1  # B's K coordinate, shared by its panels
    inner = [x[2] for x in first[1:]]
    for k, reg in enumerate(inner[1:], start=1):  # panel k: the first panel's column + 64 k
        assert re.search(rf"add\.s32 {reg}, {inner[0]}, {64 * k};", ptx)
    if not nvjitlink_available():
        pytest.skip("the nvJitLink library cannot be loaded")
    asm = assemble(ptx, Target(90))
    assert asm.spill_free
    try:
        sass = disassemble(asm.cubin)
    except SassUnavailable as e:
        pytest.skip(str(e))
    assert re.search(r"\bUTMALDG\.2D\b", sass) and re.search(r"\bHGMMA\.", sass)
    assert not re.search(r"\bLDGSTS\b", sass)


def _plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *spec: Any) -> str:
    monkeypatch.setenv("CUTILE_PY_DUMP", str(tmp_path))
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path / "cache"))  # compiled, not read
    kmod._CACHE.clear()  # compiled (and dumped) again, not found in memory
    make_gemm(spec[1].dtype).compile(*spec, target=ct.Target(90))
    (plan,) = tmp_path.glob("*.plan")
    return plan.read_text()


def test_the_plan_says_tma_or_why_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _plan(tmp_path / "a", monkeypatch, *_spec(f16, (64, 64, 32)))
    assert re.search(r"for %\d+: tma stages=3 stage_bytes=8192\n", text)
    assert "tma %" in text and "box 64x32 swizzle=2" in text and "box 32x64 swizzle=3" in text
    # B's rows of 128 f16 are 256 bytes: wgmma cuts them into 128-byte panels, a box each.
    text = _plan(tmp_path / "b", monkeypatch, *_spec(f16, (64, 128, 32)))
    assert re.search(r"for %\d+: tma stages=3 stage_bytes=12288\n", text)
    assert "cp.async, not tma" not in text
    assert re.search(r"tma %\d+ \(load\): tile 64x32x2B at \+0 .*box 64x32 swizzle=2", text)
    assert re.search(
        r"tma %\d+ \(load\): tile 32x128x2B at \+4096 .*box 32x64 swizzle=3 per panel, "
        r"2 boxes, index ops %\d+, 2 panels of 64 columns",
        text,
    )
    # mma.sync reads 256-byte rows swizzled across the whole row: no box fills that.
    text = _plan(tmp_path / "e", monkeypatch, *_spec(f16, (16, 128, 32)))
    assert "cp.async, not tma: b: tile rows of 256 bytes; a TMA swizzle matches" in text
    # tf32 B tiles with K rows step their swizzle by 2: no TMA swizzle does that.
    text = _plan(tmp_path / "c", monkeypatch, *_spec(f32, (32, 32, 16)))
    assert "cp.async, not tma: b: its tile's swizzle steps by 2" in text
    # A row stride that is not a multiple of 16 bytes (K = 260 f16: 520 bytes).
    text = _plan(tmp_path / "d", monkeypatch, *_spec(f16, (64, 64, 32), k=260))
    assert "cp.async, not tma: a: its base or row stride is not a multiple of 16 bytes" in text


def test_mixed_pipeline_fences_cp_async_writes_before_wgmma(
    sim90: SimBackend, rng: np.random.Generator
) -> None:
    """K = 260 f16: A's rows (520 bytes) are no multiple of 16, so A is copied by cp.async
    beside B's boxes, and wgmma reads both: after its cp.async wait each thread orders its
    generic-proxy writes before the async-proxy reads (fence.proxy.async, then the barrier),
    as the cp.async-only wgmma pipeline does. Matches NumPy on sim."""
    m, n, k = 100, 72, 260
    a, b = _values(rng, (m, k), f16), _values(rng, (k, n), f16)
    c = ct.full((m, n), float("nan"), f32).partition((64, 64))
    src = ct.from_numpy(a), ct.from_numpy(b)
    ptx = GEMMS[f16].ptx(c, *src, 32, target=90)
    loop = re.search(r"\n(\$\w*loop\w*):\n(.*?)\tbra\.uni \1;\n", ptx, re.S)
    assert loop is not None
    body = loop.group(2)
    assert "wgmma.mma_async" in body and "cp.async.bulk.tensor" in body and "cp.async.ca" in body
    wait, fence = body.find("cp.async.wait_group"), body.find("fence.proxy.async.shared::cta")
    assert -1 < wait < fence < body.find("bar.sync") < body.find("wgmma.mma_async")
    out, *_ = GEMMS[f16](c, *src, 32).sync()
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out.unpartition().to_numpy(), want, rtol=1e-5, atol=1e-4)


def test_tf32_pipeline_computes(sim90: SimBackend, rng: np.random.Generator) -> None:
    """f32 (tf32): A by TMA, B (K rows, swizzle stepping by 2) by cp.async; matches NumPy."""
    m, n, k = 40, 40, 40
    a, b = _values(rng, (m, k), f32), _values(rng, (k, n), f32)
    got = _run(f32, a, b, (32, 32, 16))
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_disk_cache_entry_keeps_the_tensor_map_parameters() -> None:
    lowered = GEMMS[bf16].compile(*_spec(bf16, (64, 64, 32)), target=ct.Target(90)).lowered
    decoded = jit_disk.decode(jit_disk.encode(lowered, "ir"))
    assert decoded is not None
    assert decoded[0].params == lowered.params


@pytest.fixture
def null_cuda() -> Iterator[Any]:
    """The real cuda backend (an sm_90 device) over a driver whose calls return at once."""
    pytest.importorskip("cuda.bindings")
    from cutile_py.runtime import cuda_driver as cu
    from paper_repro.experiments.host import null_cuda as make
    from paper_repro.null_driver import NullDriver

    with make(check_arguments=True):
        driver = cu._cu()
        assert isinstance(driver, NullDriver)
        yield driver


def test_cuda_launch_makes_the_tensor_maps_on_the_host(null_cuda: Any) -> None:
    """The cuda backend encodes each map with the driver: the tensor's address, dims
    innermost first, the row stride, the box and swizzle of the plan; once per address."""
    from cuda.bindings import driver as real

    m, n, k = 100, 72, 88
    a, b = ct.zeros((m, k), f16), ct.zeros((k, n), f16)
    c = ct.zeros((m, n), f32)
    out, a, b, _ = GEMMS[f16](c.partition((64, 64)), a, b, 32).sync()
    maps = null_cuda.tensor_maps
    assert len(maps) == 3
    types = real.CUtensorMapDataType
    want = [
        (types.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, a._address, [k, m], [k * 2], [32, 64], "64B"),
        (types.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, b._address, [n, k], [n * 2], [64, 32], "128B"),
        # The TMA store of C: the whole (m, n) tensor, 64 x 8 f32 boxes, unswizzled.
        (types.CU_TENSOR_MAP_DATA_TYPE_FLOAT32, c._address, [n, m], [n * 4], [8, 64], "NONE"),
    ]
    for args, (dtype, address, dims, strides, box, swizzle) in zip(maps, want, strict=True):
        assert args[0] == dtype
        assert args[1:6] == (2, address, dims, strides, box)
        assert list(args[6]) == [1, 1]
        assert args[8] == getattr(real.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}")
    GEMMS[f16](out, a, b, 32).sync()  # the same tensors: the maps are not made again
    assert len(null_cuda.tensor_maps) == 3


@pytest.mark.parametrize(
    ("mutation", "error"),
    [
        ("wait", "more arrivals than the barrier's expected count"),
        ("expect_tx", "a deadlock: no thread of the batch can go on"),
    ],
)
def test_the_simulator_catches_a_broken_barrier_protocol(
    sim90: SimBackend, mutation: str, error: str
) -> None:
    """The generated PTX with its barrier wait dropped (the next refill finds the phase not
    complete) or its expect_tx dropped (the phase never completes): both reported, so the
    tests above would see a broken protocol."""
    m = n = k = 128
    a, b = ct.zeros((m, k), f16), ct.zeros((k, n), f16)
    c = ct.zeros((m, n), f32).partition((64, 64))
    lowered = GEMMS[f16].compile(c, a, b, 32, target=90).lowered
    ptx = lowered.ptx
    if mutation == "wait":
        wait = r"mbarrier\.try_wait\.parity\.shared::cta\.b64 (%p\d+), \[%r\d+\], %r\d+;"
        broken = re.sub(wait, r"mov.pred \1, -1;", ptx)
    else:
        broken = re.sub(r"\tmbarrier\.arrive\.expect_tx[^\n]*\n", "", ptx)
    assert broken != ptx
    reader = ParamReader(lowered)
    values = [ParamValue(t, v) for t, v in zip(reader.ptypes, reader([c, a, b, 32], sim90))]
    kernel = sim90.load_kernel(broken, lowered.entry)
    block = (lowered.block_threads, 1, 1)
    with pytest.raises(LaunchFailure, match=error):
        sim90.launch(kernel, (2, 2, 1), block, lowered.dynamic_shared, values).wait()


def test_report_counts_the_bytes_tma_reads() -> None:
    """kernel.report's global traffic on sm_90 (TMA boxes, in-bounds elements only) is
    cp.async's on sm_80: every block reads its K panels of A and B once."""
    m, n, k = 256, 192, 200  # ragged K: the last boxes read only what lies in the tensors

    def traffic(target: int) -> list[str]:
        a, b = ct.zeros((m, k), f16), ct.zeros((k, n), f16)
        c = ct.zeros((m, n), f32).partition((64, 64))
        text = str(GEMMS[f16].report(c, a, b, 32, target=target))
        return re.findall(r"\n +(?:a|b|c) \(\d+ B\) +read \d+ B, written \d+ B", text)

    sm90 = traffic(90)
    assert f"read {m * k * 2 * (n // 64)} B" in sm90[1]  # A once per column of blocks
    assert f"read {k * n * 2 * (m // 64)} B" in sm90[2]
    assert sm90 == traffic(80)
