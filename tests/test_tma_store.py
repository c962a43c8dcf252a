"""The TMA store epilogue (`plan_store`, `emit_store`): on sm_90 a loop's accumulator is
written from its fragments into a swizzled staging tile and stored by `cp.async.bulk.tensor`.

Checked on the simulator as an sm_90 device (race checks on, several warp schedules) against
NumPy at ragged M, N, K for f16, bf16 and f32 outputs, plain and warp-specialized, 2-D and
batched; the staging writes are free of bank conflicts (the simulator's counters); a tensor
whose rows are not 16-byte aligned keeps the plain store; a planted missing
`wait_group.read` before the staging memory is reused is reported; the library GEMM
assembles for sm_90a with UTMASTG and no spills."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, bf16, f16, f32
from cutile_py.host.launch import ParamReader
from cutile_py.ir.dtypes import round_to
from cutile_py.lower.pipeline import LoweredKernel, lower_kernel
from cutile_py.lower.plan import LoweringPlan, format_plan
from cutile_py.ptx.target import Target
from cutile_py.runtime.backend import LaunchFailure, ParamValue
from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available
from cutile_py.runtime.sass import SassUnavailable, disassemble
from cutile_py.runtime.sim_backend import SimBackend
from cutile_py_kernels.gemm import _gemm_kernel
from paper_repro.epilogue_sass import epilogue, measure
from paper_repro.kloop_sass_sm90 import opcode
from tests.support.active_sim import active_sim

BM = TypeVar("BM")
BN = TypeVar("BN")
One = TypeVar("One")
SM90 = Target(90)
STORE = "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"
#: Relative rounding of each output dtype (half an ulp), plus f32 accumulation-order slack.
EPS = {f16: 2.0**-11, bf16: 2.0**-8, f32: 2.0**-20}


@pytest.fixture
def sim90() -> Iterator[SimBackend]:
    with active_sim(SM90, schedules=2) as backend:
        yield backend


def _operand(rng: np.random.Generator, shape: tuple[int, ...], dt: type[ct.DType]) -> Any:
    x = round_to(rng.standard_normal(shape).astype(np.float32), dt)
    return x.astype(np.float64), ct.from_numpy(x, dt)


def _check(got: np.ndarray, want: np.ndarray, odt: type[ct.DType]) -> None:
    """Within the output's rounding of the exact product (and f32 sums' slack)."""
    assert not np.isnan(got).any()
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=EPS[odt], atol=EPS[odt] * scale)


ODTS = [f16, bf16, f32]


def _square(n: int, tile: tuple[int, int], idt: type[ct.DType], odt: type[ct.DType]) -> Any:
    """The output partition and the two operands of an n x n x n GEMM, as specs."""
    return (
        ct.PartitionSpec((n, n), tile, odt),
        ct.TensorSpec((n, n), idt),
        ct.TensorSpec((n, n), idt),
    )


def _planned(kernel: Any, *args: Any) -> tuple[Any, LoweredKernel, LoweringPlan]:
    """The kernel's IR for sm_90 and its lowering with the plan (lowered here: a compile read
    back from the disk cache carries no plan)."""
    ir = kernel.compile(*args, target=SM90).ir
    lowered = lower_kernel(ir, SM90)
    assert lowered.plan is not None
    return ir, lowered, lowered.plan


@pytest.mark.parametrize("odt", ODTS, ids=lambda d: d.name)
@pytest.mark.parametrize(
    ("mnk", "tile", "ws"),
    [
        ((300, 264, 200), (128, 128, 64), False),  # ragged in all three
        ((130, 200, 104), (128, 256, 64), True),  # 4 (16-bit) / 32 (f32) panels, WS
        ((70, 40, 50), (64, 40, 48), False),  # 80-byte f16 rows: 16-byte panels, .x2
    ],
    ids=["128x128", "128x256ws", "64x40"],
)
def test_tma_store_matches_numpy(
    sim90: SimBackend,
    odt: type[ct.DType],
    mnk: tuple[int, int, int],
    tile: tuple[int, int, int],
    ws: bool,
    rng: np.random.Generator,
) -> None:
    m, n, k = mnk
    bm, bn, bk = tile
    a, ta = _operand(rng, (m, k), bf16)
    b, tb = _operand(rng, (k, n), bf16)
    kernel = _gemm_kernel(bf16, odt, False, False, 3, None, None, ws)
    out = ct.full((m, n), np.nan, odt).partition((bm, bn))
    compiled = kernel.compile(out, ta, tb, bk, target=SM90)
    ptx = compiled.lowered.ptx
    assert STORE in ptx and "st.global" not in ptx
    assert "cp.async.bulk.wait_group.read 0;" in ptx
    assert ("stmatrix" in ptx) == (odt is not f32)
    res, *_ = kernel(out, ta, tb, bk).sync()
    _check(res.unpartition().to_numpy().astype(np.float64), a @ b, odt)


@pytest.mark.parametrize("odt", ODTS, ids=lambda d: d.name)
@pytest.mark.parametrize("tile", [(32, 64, 32), (16, 128, 32), (48, 64, 32)], ids=str)
def test_tma_store_of_mma_sync_fragments_split_by_columns(
    sim90: SimBackend, odt: type[ct.DType], tile: tuple[int, int, int], rng: np.random.Generator
) -> None:
    """Tiles too short for wgmma: mma.sync fragments over 1 x 4 warps, each warp holding
    every 4th fragment column (its chunks and panels computed from the warp's column)."""
    m, n, k = 100, 200, 72
    bm, bn, bk = tile
    a, ta = _operand(rng, (m, k), f16)
    b, tb = _operand(rng, (k, n), f16)
    kernel = _gemm_kernel(f16, odt, False, False, 2, 4)
    out = ct.full((m, n), np.nan, odt).partition((bm, bn))
    _, lowered, plan = _planned(kernel, out, ta, tb, bk)
    (store,) = plan.stores.tma.values()
    assert store.frag.grid.wn == 4 and "wgmma" not in lowered.ptx
    assert STORE in lowered.ptx and "st.global" not in lowered.ptx
    res, *_ = kernel(out, ta, tb, bk).sync()
    _check(res.unpartition().to_numpy().astype(np.float64), a @ b, odt)


def test_a_staging_tile_without_a_tma_ring_declares_its_alignment(
    sim90: SimBackend, rng: np.random.Generator
) -> None:
    """Odd K: f16 rows of 74 bytes, so no TMA ring and no wgmma (whose shared memory is
    declared 1024-aligned), yet C's rows take the 128-byte-swizzled TMA store. Its staging
    tile needs 1024-byte alignment (TMA: 128 bytes, and the swizzle's XOR reads absolute
    address bits); the plan aligns its offset, and a variable is promised no more than its
    declared `.align`, which said 16 here (the simulator places `smem` at 0 and cannot tell)."""
    m, n, k = 100, 256, 37
    a, ta = _operand(rng, (m, k), f16)
    b, tb = _operand(rng, (k, n), f16)
    kernel = _gemm_kernel(f16, f16, False, False, 2, 4)
    out = ct.full((m, n), np.nan, f16).partition((64, 128))
    _, lowered, plan = _planned(kernel, out, ta, tb, 32)
    (store,) = plan.stores.tma.values()
    assert store.swizzle == 3 and "wgmma" not in lowered.ptx
    assert "complete_tx" not in lowered.ptx  # no TMA load
    assert re.search(r"\.shared \.align 1024 \.b8 smem\[", lowered.ptx), lowered.ptx[:600]
    res, *_ = kernel(out, ta, tb, 32).sync()
    _check(res.unpartition().to_numpy().astype(np.float64), a @ b, f16)


def test_plan_text_names_the_epilogue() -> None:
    kernel = _gemm_kernel(bf16, bf16, False, False, 3)
    spec = _square(4096, (128, 256), bf16, bf16)
    ir, _, plan = _planned(kernel, *spec, 64)
    text = format_plan(ir, plan)
    assert (
        "  store[param=0] %20, %21, %19: tma store: 128x256 bf16 staged by stmatrix in 4 "
        "panel(s) of 128x64 (swizzle=3), box 128x64, 4 boxes; fence.proxy.async, barrier, "
        "one thread stores, commit, wait_group.read 0, barrier\n" in text
    ), text
    assert "  %19 bf16<128x256>: mma acc fragments, warps 8x1\n" in text
    assert "tma store staging of store of %20, %21, %19: [0, 65536)" in text


@pytest.mark.parametrize("trans_b", [False, True])
def test_bmm_stores_3d_boxes(sim90: SimBackend, trans_b: bool, rng: np.random.Generator) -> None:
    """bmm's (1, BM, BN) tile: the reshape adding the batch dim stays in fragments; boxes of
    BN-panel x BM x 1 at (col, row, batch)."""
    p, m, n, k = 2, 100, 200, 72
    a, ta = _operand(rng, (p, m, k), f16)
    b, tb = _operand(rng, (p, n, k) if trans_b else (p, k, n), f16)
    kernel = _gemm_kernel(f16, f16, trans_b, True, 3)
    out = ct.full((p, m, n), np.nan, f16).partition((1, 64, 128))
    ptx = kernel.ptx(out, ta, tb, 64)
    assert "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group" in ptx
    res, *_ = kernel(out, ta, tb, 64).sync()
    _check(
        res.unpartition().to_numpy().astype(np.float64),
        a @ (np.swapaxes(b, 1, 2) if trans_b else b),
        f16,
    )


@pytest.mark.parametrize(("odt", "n"), [(f16, 100), (f32, 102), (bf16, 36)])
def test_rows_no_map_can_describe_keep_the_plain_store(
    sim90: SimBackend, odt: type[ct.DType], n: int, rng: np.random.Generator
) -> None:
    """Rows of 200, 408 or 72 bytes (not multiples of 16): the plan says why, the kernel
    stores from registers as before, and the result is right."""
    m, k = 130, 72
    a, ta = _operand(rng, (m, k), bf16)
    b, tb = _operand(rng, (k, n), bf16)
    kernel = _gemm_kernel(bf16, odt, False, False, 3)
    out = ct.full((m, n), np.nan, odt).partition((64, 64))
    ir, lowered, plan = _planned(kernel, out, ta, tb, 32)
    eb = odt.itemsize()
    aligned = (n * eb) & -(n * eb)
    assert not plan.stores.tma
    (why,) = plan.stores.why.values()
    assert why == (
        f"c: its base or row stride is not a multiple of 16 bytes (aligned to {aligned} bytes)"
    )
    assert "plain stores, not tma: c: its base or row stride" in format_plan(ir, plan)
    assert "bulk_group" not in lowered.ptx and "st.global" in lowered.ptx
    res, *_ = kernel(out, ta, tb, 32).sync()
    _check(res.unpartition().to_numpy().astype(np.float64), a @ b, odt)


def test_a_staging_tile_past_shared_memory_keeps_the_plain_store() -> None:
    """256 x 256 f32 would stage 256 KiB, past a block's 227 KiB: the plain store (through
    the accumulator's row bands) is kept, and the kernel still lowers."""
    kernel = _gemm_kernel(f16, f32, False, False, 2)
    spec = _square(1024, (256, 256), f16, f32)
    _, _, plan = _planned(kernel, *spec, 16)
    assert not plan.stores.tma
    assert list(plan.stores.why.values()) == [
        "c: a staging tile of 262144 bytes exceeds the 232448 bytes of shared memory a block "
        "may have"
    ]
    assert plan.shared.total <= SM90.max_shared_bytes


@ct.kernel
def halves(
    c: Mut[Tensor[f32, BM, BN]],
    a: Tensor[f16, Dyn, Dyn],
    b: Tensor[f16, Dyn, Dyn],
    BK: ct.Constant[int],
) -> None:
    """The block's (BM, BN) tile computed as two (BM / 2, BN) halves, each stored as a
    sub-tile of it (`ct.store(c, index, tile)`)."""
    for h in range(2):
        acc: ct.Tile = ct.zeros((c.shape[0] // 2, c.shape[1]), f32)
        for kk in range(ct.num_tiles(a, 1, BK)):
            ta = ct.load(a, (2 * ct.bid(0) + h, kk), (c.shape[0] // 2, BK))
            tb = ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1]))
            acc = ct.mma(ta, tb, acc)
        ct.store(c, (h, 0), acc)


def test_a_sub_tile_store_keeps_the_plain_store(
    sim90: SimBackend, rng: np.random.Generator
) -> None:
    """TMA clips at the tensor's edge, not at the block's tile: a sub-tile store stays plain
    (the plan says why) and is right."""
    m, n, k = 200, 72, 64
    a, ta = _operand(rng, (m, k), f16)
    b, tb = _operand(rng, (k, n), f16)
    out = ct.full((m, n), np.nan).partition((128, 64))
    _, lowered, plan = _planned(halves, out, ta, tb, 32)
    assert not plan.stores.tma
    assert list(plan.stores.why.values()) == [
        "c: a sub-tile store (TMA cannot clip to the block's tile)"
    ]
    assert "bulk_group" not in lowered.ptx
    res, *_ = halves(out, ta, tb, 32).sync()
    _check(res.unpartition().to_numpy(), a @ b, f32)


def _stored_and_summed(odt: type[ct.DType]) -> Any:
    """c = a @ b in `odt`, and d = the row sums of that stored tile: a second use of the
    value the store takes."""
    if not TYPE_CHECKING:
        Out = odt  # named by the annotations below

    @ct.kernel
    def stored_and_summed(
        c: Mut[Tensor[Out, BM, BN]],
        d: Mut[Tensor[f32, BM, One]],
        a: Tensor[f16, Dyn, Dyn],
        b: Tensor[f16, Dyn, Dyn],
        BK: ct.Constant[int],
    ) -> None:
        acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
        for kk in range(ct.cdiv(a.shape[1], BK)):
            ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
            acc = ct.mma(ta, ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1])), acc)
        out = acc.astype(c.dtype)
        c.store(out)
        d.store(ct.sum(out.astype(f32), axis=1, keepdims=True))

    return stored_and_summed


@pytest.mark.parametrize("odt", [f16, f32], ids=lambda d: d.name)
def test_a_stored_value_used_again_keeps_the_plain_store(
    odt: type[ct.DType], sim90: SimBackend, rng: np.random.Generator
) -> None:
    """The stored value (the loop's result, or its cast) also feeds a row sum: it must
    leave the fragments for that use, so the store stays plain (the plan says why) and
    both outputs are right (the TMA store kept the value in fragments, and the sum read
    fragment registers as a blocked tile: row sums off by up to 300)."""
    m, n, k = 200, 64, 96
    a, ta = _operand(rng, (m, k), f16)
    b, tb = _operand(rng, (k, n), f16)
    kernel = _stored_and_summed(odt)
    c = ct.full((m, n), np.nan, odt).partition((128, 64))
    d = ct.full((m, 1), np.nan).partition((128, 1))
    _, _, plan = _planned(kernel, c, d, ta, tb, 32)
    assert not plan.stores.tma
    assert list(plan.stores.why.values()) == [
        "c: the stored value has another use, which reads it out of the fragments"
    ]
    rc, rd, *_ = kernel(c, d, ta, tb, 32).sync()
    got = rc.unpartition().to_numpy().astype(np.float64)
    _check(got, a @ b, odt)
    _check(rd.unpartition().to_numpy()[:, 0], got.sum(axis=1), f32)  # of the stored values


@pytest.mark.parametrize("odt", ODTS, ids=lambda d: d.name)
@pytest.mark.parametrize(("bm", "bn", "warps"), [(128, 256, None), (32, 64, 4)], ids=str)
def test_staging_writes_are_free_of_bank_conflicts(
    odt: type[ct.DType], bm: int, bn: int, warps: int | None
) -> None:
    """The sim's counters: every stmatrix (16-bit) or st.shared.v2.f32 (f32) of the epilogue
    takes one wavefront per phase (wgmma fragments, and mma.sync ones over 1 x 4 warps)."""
    kernel = _gemm_kernel(bf16, odt, False, False, 3, warps)
    r = kernel.report(
        ct.PartitionSpec((256, 512), (bm, bn), odt),
        ct.TensorSpec((256, 128), bf16),
        ct.TensorSpec((128, 512), bf16),
        64,
        target="sm_90",
    )
    op = "stmatrix" if odt is not f32 else "st.shared.v2.f32"
    ways = [a.value for a in r.shared_accesses if a.text.lstrip().startswith(op)]
    assert ways and max(ways) == 1.0, ways


@ct.kernel(stages=2)
def two_products(
    c: Mut[Tensor[f16, BM, BN]],
    d: Mut[Tensor[f16, BM, BN]],
    a: Tensor[f16, Dyn, Dyn],
    b: Tensor[f16, Dyn, Dyn],
    e: Tensor[f16, Dyn, Dyn],
    BK: ct.Constant[int],
) -> None:
    """c = a @ b, then d = a @ e: the second loop's ring and staging tile reuse the first
    store's staging memory, so its wait_group.read and barrier matter (as in a persistent
    kernel, where one block stores several tiles)."""
    acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
    for kk in range(ct.num_tiles(a, 1, BK)):
        ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
        tb = ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1]))
        acc = ct.mma(ta, tb, acc)
    c.store(acc.astype(f16))
    acc2: ct.Tile = ct.zeros((d.shape[0], d.shape[1]), f32)
    for kk in range(ct.num_tiles(a, 1, BK)):
        ta = ct.load(a, (ct.bid(0), kk), (d.shape[0], BK))
        te = ct.load(e, (kk, ct.bid(1)), (BK, d.shape[1]))
        acc2 = ct.mma(ta, te, acc2)
    d.store(acc2.astype(f16))


def _two_products(rng: np.random.Generator) -> tuple[list[Any], list[np.ndarray]]:
    m, n, k = 130, 72, 96
    a, ta = _operand(rng, (m, k), f16)
    b, tb = _operand(rng, (k, n), f16)
    e, te = _operand(rng, (k, n), f16)
    outs = [ct.full((m, n), np.nan, f16).partition((64, 64)) for _ in range(2)]
    return [*outs, ta, tb, te, 32], [a @ b, a @ e]


def _run_ptx(sim90: SimBackend, lowered: Any, args: list[Any], ptx: str) -> None:
    """`ptx` (the compiled `two_products`, edited) run on `args` over its 3 x 2 tiles."""
    reader = ParamReader(lowered)
    values = [ParamValue(t, v) for t, v in zip(reader.ptypes, reader(args, sim90))]
    kernel = sim90.load_kernel(ptx, lowered.entry)
    block = (lowered.block_threads, 1, 1)
    sim90.launch(kernel, (3, 2, 1), block, lowered.dynamic_shared, values).wait()


def test_a_reused_staging_tile_waits_for_the_store(
    sim90: SimBackend, rng: np.random.Generator
) -> None:
    """Two TMA stores in one block: the first waits (wait_group.read 0) and meets a barrier
    before the second loop's TMA loads refill the memory it staged in."""
    args, wants = _two_products(rng)
    lowered = two_products.compile(*args, target=SM90).lowered
    ptx = lowered.ptx
    assert ptx.count(STORE) == 2  # 64 x 64 f16: rows of 128 bytes, one box per store
    first = ptx.index("cp.async.bulk.wait_group.read 0;")
    assert re.match(r"\s*\$__tma_stored_\d+:\s*bar\.sync", ptx[first + 32 :])
    c, d, *_ = two_products(*args).sync()
    for got, want in zip((c, d), wants):
        _check(got.unpartition().to_numpy().astype(np.float64), want, f16)


def test_a_missing_wait_before_the_staging_is_reused_is_caught(
    sim90: SimBackend, rng: np.random.Generator
) -> None:
    """The first store's wait_group.read dropped: the second loop's TMA loads overwrite the
    staging tile the store may still read; the simulator reports it."""
    args, _ = _two_products(rng)
    lowered = two_products.compile(*args, target=SM90).lowered
    ptx = lowered.ptx
    broken = ptx.replace("\tcp.async.bulk.wait_group.read 0;\n", "", 1)
    assert broken != ptx
    with pytest.raises(LaunchFailure, match=r"bulk store issued at PTX line \d+ may still"):
        _run_ptx(sim90, lowered, args, broken)


def test_a_store_of_unfenced_staging_writes_is_caught(
    sim90: SimBackend, rng: np.random.Generator
) -> None:
    """The epilogue's fence.proxy.async dropped: the copy engine's read is not ordered after
    the threads' stmatrix writes (generic proxy); the simulator reports it."""
    args, _ = _two_products(rng)
    lowered = two_products.compile(*args, target=SM90).lowered
    ptx = lowered.ptx
    fence = "\tfence.proxy.async.shared::cta;\n\tbar.sync 0;\n"
    at = ptx.index(fence, ptx.index("stmatrix"))  # the first store's, after its staging
    broken = ptx[:at] + ptx[at:].replace(fence, "\tbar.sync 0;\n", 1)
    with pytest.raises(LaunchFailure, match=r"with no fence\.proxy\.async"):
        _run_ptx(sim90, lowered, args, broken)


def test_a_store_issued_before_the_barrier_is_caught(
    sim90: SimBackend, rng: np.random.Generator
) -> None:
    """The barrier between the staging writes and thread 0's store dropped: the store reads
    what other warps wrote with nothing ordering it (a race, as racecheck reports)."""
    args, _ = _two_products(rng)
    lowered = two_products.compile(*args, target=SM90).lowered
    ptx = lowered.ptx
    fence = "\tfence.proxy.async.shared::cta;\n\tbar.sync 0;\n"
    at = ptx.index(fence, ptx.index("stmatrix"))  # the first store's, after its staging
    broken = ptx[:at] + ptx[at:].replace(fence, "\tfence.proxy.async.shared::cta;\n", 1)
    with pytest.raises(LaunchFailure, match="shared-memory race: this thread reads"):
        _run_ptx(sim90, lowered, args, broken)


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
@pytest.mark.parametrize("ws", [False, True])
def test_library_gemm_sass_stores_with_utmastg(ws: bool) -> None:
    """bf16 128 x 256 x 64: the epilogue is HGMMA's registers into STSM (stmatrix) and
    UTMASTG (no STG), with no spills."""
    kernel = _gemm_kernel(bf16, bf16, False, False, 3, None, 8, ws)
    spec = _square(4096, (128, 256), bf16, bf16)
    ptx = kernel.ptx(*spec, 64, target=SM90)
    report = assemble(ptx, SM90)
    assert report.spill_free, report.info_log
    try:
        sass = disassemble(report.cubin)
    except SassUnavailable as e:
        pytest.skip(str(e))
    tail = [opcode(i) for i in epilogue(sass)]
    assert any(op.startswith("UTMASTG") for op in tail), tail
    assert any(op.startswith("STSM") for op in tail), tail
    assert not any(op.startswith("STG") for op in tail), tail


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
def test_the_tma_epilogue_is_shorter_in_sass() -> None:
    """`paper_repro.epilogue_sass`: bf16 128 x 256 x 64, the same IR lowered with and without
    the TMA store: no shared round trip (LDS of the accumulator), no STG, about half the
    instructions (294 -> 138 measured), no more registers, no spills."""
    try:
        plain = measure(bf16, 128, 256, 64, 3, False, tma_store=False)
        tma = measure(bf16, 128, 256, 64, 3, False, tma_store=True)
    except SassUnavailable as e:
        pytest.skip(str(e))
    assert plain.counts["STG"] > 0 and tma.counts["STG"] == 0
    assert tma.counts["UTMASTG"] == 4 and tma.counts["STSM"] == 16
    assert tma.total * 3 < plain.total * 2, (tma.total, plain.total)
    assert tma.registers <= plain.registers and tma.spills == plain.spills == 0
