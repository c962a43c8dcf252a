"""Hopper's instructions on the simulator: `wgmma`, `cp.async.bulk.tensor` with tensor maps,
`mbarrier`, `elect.sync`, `stmatrix`, `setmaxnreg`.

The semantics are checked first against PTX that nobody here wrote: Triton's GEMMs compiled
for sm_90a with no GPU (`triton_oracle/generate_hopper.py`): one feeds `wgmma` through
`cp.async` into 128-byte-swizzled shared memory (A K-major, B N-major), the other through
TMA loads guarded by mbarriers, with a `stmatrix` + TMA-store epilogue, once with a block
per tile and once persistent (the ring and its phases running on across tiles). Hand-written PTX
covers what they do not: barrier phases and errors, elect's leader, stmatrix's layout.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cutile_py.sim.bulk_copy import swizzle
from cutile_py.sim.context import SimError
from cutile_py.sim.tensor_map import decode, encode_tiled
from tests.support.sim_harness import Sim

ORACLE = Path(__file__).parent / "triton_oracle"
F16 = 6  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16


def oracle(name: str) -> tuple[str, int, dict[str, int], list[dict[str, Any]]]:
    """PTX, dynamic shared bytes, block sizes and descriptor boxes of a generated kernel."""
    text = (ORACLE / f"{name}.ptx").read_text()
    head = re.match(
        r"// triton \S+ sm_90a num_warps=4 shared=(\d+) constexprs=(\{.*?\}) "
        r"descriptors=(\[.*?\]) ",
        text,
    )
    assert head, f"{name}.ptx: no generate_hopper.py header"
    return text, int(head[1]), ast.literal_eval(head[2]), ast.literal_eval(head[3])


def f16_close(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """`got` is A @ B accumulated in f32 and rounded to f16: within one f16 ulp of the exact
    product rounded to f16, plus what f32 accumulation may lose where terms cancel."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64 @ b64).astype(np.float16).astype(np.float64)
    ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
    accumulation = a.shape[1] * 2.0**-24 * (np.abs(a64) @ np.abs(b64))
    assert not np.isnan(got).any()
    assert (np.abs(got.astype(np.float64) - want) <= ulp + accumulation).all()


@pytest.mark.parametrize(("m", "n", "k"), [(128, 128, 64), (200, 136, 112), (64, 256, 320)])
def test_triton_cp_async_wgmma_gemm(rng: np.random.Generator, m: int, n: int, k: int) -> None:
    """Triton's tutorial GEMM for sm_90a: cp.async stages, 128-byte swizzle, 8 wgmma
    m64n128k16 a step with A K-major and B N-major descriptors, ragged M and N masked."""
    ptx, shared, blk, _ = oracle("matmul_sm90")
    sim = Sim()
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    pa, _ = sim.buffer(a)
    pb, _ = sim.buffer(b)
    pc, c = sim.buffer(np.full((m, n), np.nan, np.float16))
    grid = (-(-m // blk["BM"]), -(-n // blk["BN"]), 1)
    params: list[tuple[str, int | float]] = [
        ("u64", pa), ("u64", pb), ("u64", pc), ("u32", m), ("u32", n), ("u32", k),
        ("u32", k), ("u32", n), ("u32", n), ("u64", 0), ("u64", 0),
    ]  # fmt: skip
    sim.launch(ptx, "matmul_kernel", grid, (128, 1, 1), params, shared=shared)
    f16_close(c, a, b)


def _desc(address: int, rows: int, cols: int, box: list[int]) -> list[tuple[str, Any]]:
    """Triton's host-side descriptor arguments: the map, then the shape and strides."""
    tmap = encode_tiled(F16, address, (cols, rows), (cols * 2,), (box[1], box[0]), swizzle=3)
    return [("b8", tmap), ("u32", rows), ("u32", cols), ("u64", cols), ("u64", 1)]


def tma_gemm(
    rng: np.random.Generator,
    m: int,
    n: int,
    k: int,
    ptx: str | None = None,
    threads: int = 128,
    race_check: bool = True,
    programs: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Triton's TMA GEMM (or, with `programs`, its persistent form on that many blocks) on
    random f16 A (m x k) and B (k x n), `ptx` in place of the generated text if given:
    A, B and the C it computed (NaN where it wrote nothing)."""
    name = "persistent_tma_matmul_sm90" if programs else "tma_matmul_sm90"
    text, shared, blk, boxes = oracle(name)
    sim = Sim()
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    pa, _ = sim.buffer(a)
    pb, _ = sim.buffer(b)
    pc, c = sim.buffer(np.full((m, n), np.nan, np.float16))
    assert [d["swizzle"] for d in boxes] == [3, 3, 3]  # CU_TENSOR_MAP_SWIZZLE_128B
    params = [
        *_desc(pa, m, k, boxes[0]["block"]),
        *_desc(pb, k, n, boxes[1]["block"]),
        *_desc(pc, m, n, boxes[2]["block"]),
        ("u32", m), ("u32", n), ("u32", k), ("u64", 0), ("u64", 0),
    ]  # fmt: skip
    grid = (programs, 1, 1) if programs else (-(-m // blk["BM"]), -(-n // blk["BN"]), 1)
    sim.launch(ptx or text, name.removesuffix("_sm90") + "_kernel", grid, (threads, 1, 1),
               params, shared=shared, race_check=race_check)  # fmt: skip
    return a, b, c


@pytest.mark.parametrize(("m", "n", "k"), [(128, 128, 64), (200, 136, 104), (256, 128, 320)])
def test_triton_tma_wgmma_gemm(rng: np.random.Generator, m: int, n: int, k: int) -> None:
    """TMA loads into a three-stage ring guarded by mbarriers (expect_tx, try_wait.parity),
    elected issuing lanes, wgmma, stmatrix and TMA stores; boxes past the edges read zeros
    and store nothing."""
    a, b, c = tma_gemm(rng, m, n, k)
    f16_close(c, a, b)


@pytest.mark.parametrize(
    ("m", "n", "k", "programs"), [(384, 264, 200, 3), (640, 256, 64, 3), (130, 520, 136, 2)]
)
def test_triton_persistent_tma_gemm(
    rng: np.random.Generator, m: int, n: int, k: int, programs: int
) -> None:
    """Triton's persistent TMA GEMM: each block walks tiles b, b + blocks, ... with the tile
    loop and K loop flattened into one, so its three-stage ring and the mbarrier phases run
    on across tiles (a K of 64: one step a tile, so block 0's fourth of its 4, 3, 3 tiles
    takes stage 0 again, in its next phase), a TMA store per tile waiting for the last one
    to have read its staging tile; uneven tiles per block, ragged edges."""
    a, b, c = tma_gemm(rng, m, n, k, programs=programs)
    f16_close(c, a, b)


def test_a_persistent_ring_whose_phase_never_flips_is_caught(rng: np.random.Generator) -> None:
    """Triton's persistent kernel with the consumer's phase bit left at 0, one block walking
    four tiles (one K step each) over its three stages: on stage 0's second round, with the
    copy landed, parity 0 names the phase after it, which nothing will complete (on a GPU a
    hang, or stale operands where the copy has not landed yet): reported as a deadlock."""
    text, *_ = oracle("persistent_tma_matmul_sm90")
    flip = "xor.b32 \t%r245, %r245, %r115;"
    assert text.count(flip) == 1
    with pytest.raises(SimError, match=r"a deadlock(.|\n)*for its phase of parity 0"):
        tma_gemm(rng, 256, 256, 64, text.replace(flip, ""), programs=1)


def test_reading_a_tma_stage_without_waiting_is_caught(rng: np.random.Generator) -> None:
    """The same kernel with its barrier wait replaced by `true`: the copies never land, so
    the next phase's arrive finds the barrier still in the old phase."""
    text, *_ = oracle("tma_matmul_sm90")
    wait = "mbarrier.try_wait.parity.shared::cta.b64 complete, [%r37], %r162;"
    assert wait in text
    broken = text.replace(wait, "mov.pred complete, -1;")
    with pytest.raises(SimError, match="more arrivals than the barrier's expected count"):
        tma_gemm(rng, 256, 128, 320, broken)


#: The end of Triton's TMA-store epilogue: commit the store's group, wait until it has read
#: its shared source.
COMMIT, WAIT = "cp.async.bulk.commit_group;", "cp.async.bulk.wait_group \t0;"


def test_a_tma_store_reads_its_source_at_the_wait(rng: np.random.Generator) -> None:
    """A store issued before the staging tile is rewritten but retired after it stores the
    new values: the simulator reads the source at the wait, not at the issue (Triton's
    kernel with the store's commit and wait moved past a rewrite of the tile, race checks
    off so that the rewrite runs)."""
    text, *_ = oracle("tma_matmul_sm90")
    assert COMMIT in text and WAIT in text
    # Every thread then overwrites its first staged 16 bytes with zeros.
    rewrite = (
        "mov.b32 %r78, 0;\n\t"
        "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%r152], {%r78, %r78, %r78, %r78};"
    )
    broken = text.replace(COMMIT + "\n\t" + WAIT, rewrite + "\n\t" + COMMIT + "\n\t" + WAIT)
    assert broken != text
    m, n, k = 128, 128, 64
    a, b, c = tma_gemm(rng, m, n, k, broken, race_check=False)
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    zero = c == 0
    assert zero.any() and (~zero).any()
    assert np.isclose(c[~zero].astype(np.float64), want[~zero], rtol=2e-2, atol=2e-2).all()


def test_writing_a_tma_stores_source_before_its_wait_is_caught(rng: np.random.Generator) -> None:
    """The tile rewritten between the store's issue and its wait_group.read: reported as a
    race on the staging memory, naming the store's line."""
    text, *_ = oracle("tma_matmul_sm90")
    rewrite = "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%r152], {%r78, %r79, %r80, %r81};"
    broken = text.replace(COMMIT + "\n\t" + WAIT, COMMIT + "\n\t" + rewrite + "\n\t" + WAIT)
    assert broken != text
    with pytest.raises(SimError, match=r"bulk store issued at PTX line \d+ may still be reading"):
        tma_gemm(rng, 128, 128, 64, broken)


def test_exiting_before_a_tma_stores_wait_is_caught(rng: np.random.Generator) -> None:
    """Triton's kernel without its `cp.async.bulk.wait_group 0`: the block exits while the
    store may still read its shared memory."""
    text, *_ = oracle("tma_matmul_sm90")
    broken = text.replace(WAIT, "")
    assert broken != text
    with pytest.raises(SimError, match="exited with the bulk store it issued at PTX line"):
        tma_gemm(rng, 128, 128, 64, broken)


def test_swizzle_is_the_chunk_xor_of_notes_ptx() -> None:
    """Chunk c of 128-byte row r lands at chunk c ^ (r % 8); 64- and 32-byte spans use the
    low two and one bits of the row."""
    for span, bits in ((128, 7), (64, 3), (32, 1)):
        for r in range(16):
            for c in range(span // 16):
                addr = np.array([r * 128 + c * 16 + 5], dtype=np.uint64)
                want = r * 128 + ((c ^ (r & bits)) * 16) + 5
                assert int(swizzle(addr, span)[0]) == want


def test_tensor_map_round_trip_and_the_drivers_rules() -> None:
    raw = encode_tiled(F16, 0x1000, (96, 40, 3), (192, 192 * 40), (64, 16, 1), swizzle=3)
    assert len(raw) == 128
    m = decode(raw)
    assert (m.address, m.dims, m.strides, m.box, m.swizzle) == (
        0x1000, (96, 40, 3), (2, 192, 7680), (64, 16, 1), 128
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"globalStrides\[0\] = 200"):
        encode_tiled(F16, 0x1000, (100, 8), (200,), (64, 8))
    with pytest.raises(ValueError, match="exceeds the 128-byte swizzle span"):
        encode_tiled(F16, 0x1000, (128, 8), (256,), (128, 8), swizzle=3)
    with pytest.raises(ValueError, match=r"boxDim\[1\] = 512"):
        encode_tiled(F16, 0x1000, (64, 1024), (128,), (64, 512))
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        encode_tiled(F16, 0x1008, (64, 8), (128,), (64, 8))
    with pytest.raises(SimError, match="not point at a tensor map"):
        decode(bytes(128))


BARRIER = """
.visible .entry bar(.param .u64 out, .param .u32 count)
{
    .reg .b32 %r<12>;
    .reg .b64 %rd<6>;
    .reg .pred %p<6>;
    .shared .align 8 .b64 mbar;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r9, [count];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, mbar;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared.b64 [%r2], %r9;
    bar.sync 0;
    // phase 0: lanes 0..count-1 arrive, each once
    setp.lt.u32 %p2, %r1, %r9;
    @%p2 mbarrier.arrive.shared.b64 %rd2, [%r2];
    mbarrier.test_wait.parity.shared.b64 %p3, [%r2], 0;
    mbarrier.test_wait.parity.shared.b64 %p4, [%r2], 1;
    setp.ne.u32 %p5, %r1, %r1;        // false where no arrive's state is tested
    @%p2 mbarrier.test_wait.shared.b64 %p5, [%r2], %rd2;
    selp.u32 %r3, 1, 0, %p3;
    selp.u32 %r4, 2, 0, %p4;
    selp.u32 %r5, 4, 0, %p5;
    or.b32 %r6, %r3, %r4;
    or.b32 %r7, %r6, %r5;
    mov.u32 %r10, 4;                  // lanes 0..3 stay out of the election
    setp.ne.u32 %p5, %r1, %r1;
    and.b32 %r8, %r1, 31;
    setp.ge.u32 %p1, %r8, 4;
    @%p1 elect.sync %r10|%p5, 0xFFFFFFF0;
    selp.u32 %r11, 8, 0, %p5;
    or.b32 %r7, %r7, %r11;
    shl.b32 %r10, %r10, 4;
    or.b32 %r7, %r7, %r10;
    mul.wide.u32 %rd3, %r1, 4;
    add.u64 %rd4, %rd1, %rd3;
    st.global.u32 [%rd4], %r7;
    ret;
}
"""


@pytest.mark.parametrize("count", [1, 5, 64])
def test_mbarrier_phase_completes_after_count_arrivals(count: int) -> None:
    """Parity 0's phase is complete (and parity 1's is not) once `count` threads arrived;
    an arrive's state tests complete; elect.sync picks the lowest member lane (4 here)."""
    sim = Sim()
    pout, out = sim.buffer(np.zeros(64, np.uint32))
    sim.launch(BARRIER, "bar", (1, 1, 1), (64, 1, 1), [("u64", pout), ("u32", count)])
    arrived = np.arange(64) < count
    lane = np.arange(64) % 32
    want = 1 | np.where(arrived, 4, 0) | np.where(lane == 4, 8, 0) | (4 << 4)
    np.testing.assert_array_equal(out, want)


def test_mbarrier_more_arrivals_than_expected_is_an_error() -> None:
    """With transaction bytes still expected, the phase cannot complete: a sixth arrival of
    five expected has no phase to count in."""
    sim = Sim()
    pout, _ = sim.buffer(np.zeros(64, np.uint32))
    over = BARRIER.replace(
        "bar.sync 0;", "bar.sync 0;\n@%p1 mbarrier.expect_tx.shared.b64 [%r2], 16;\nbar.sync 0;"
    ).replace("setp.lt.u32 %p2, %r1, %r9;", "setp.lt.u32 %p2, %r1, 6;")
    with pytest.raises(SimError, match=r"more arrivals than the barrier's expected count \(5\)"):
        sim.launch(over, "bar", (1, 1, 1), (64, 1, 1), [("u64", pout), ("u32", 5)])


def test_mbarrier_that_was_never_initialized_is_an_error() -> None:
    sim = Sim()
    pout, _ = sim.buffer(np.zeros(64, np.uint32))
    bad = BARRIER.replace("@%p1 mbarrier.init.shared.b64 [%r2], %r9;", "")
    with pytest.raises(SimError, match="not initialized"):
        sim.launch(bad, "bar", (1, 1, 1), (64, 1, 1), [("u64", pout), ("u32", 5)])


BULK_STORE = """
.visible .entry bulk(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .reg .pred %p<2>;
    .shared .align 16 .b8 tile[64];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, tile;
    shl.b32 %r3, %r1, 2;
    add.u32 %r4, %r2, %r3;
    st.shared.u32 [%r4], 1;
    fence.proxy.async.shared::cta;
    bar.sync 0;
    setp.eq.u32 %p1, %r1, 0;
    // two groups of 16 bytes each: tile[0, 16) to out[0, 16), tile[16, 32) to out[16, 32)
    @%p1 cp.async.bulk.global.shared::cta.bulk_group [%rd1], [%r2], 16;
    cp.async.bulk.commit_group;
    add.u64 %rd2, %rd1, 16;
    add.u32 %r5, %r2, 16;
    @%p1 cp.async.bulk.global.shared::cta.bulk_group [%rd2], [%r5], 16;
    cp.async.bulk.commit_group;
    cp.async.bulk.wait_group.read %KEEP;
    bar.sync 0;
    st.shared.u32 [%r4], 2;
    bar.sync 0;
    @%p1 cp.async.bulk.wait_group 0;
    ret;
}
"""


@pytest.mark.parametrize("keep", [0, 1])
def test_bulk_stores_read_at_the_wait_of_their_group(keep: int) -> None:
    """`wait_group.read N` retires all but the newest N groups: the first store read the
    tile's 1s; the second, left pending by `.read 1`, reads the 2s written after the wait
    (with race checks off; on they report that write, the next test)."""
    sim = Sim()
    pout, out = sim.buffer(np.zeros(8, np.uint32))
    ptx = BULK_STORE.replace("%KEEP", str(keep))
    sim.launch(ptx, "bulk", (1, 1, 1), (16, 1, 1), [("u64", pout)], race_check=False)
    np.testing.assert_array_equal(out, [1] * 4 + [1 + keep] * 4)


def test_rewriting_a_pending_bulk_stores_source_is_caught() -> None:
    sim = Sim()
    pout, _ = sim.buffer(np.zeros(8, np.uint32))
    with pytest.raises(SimError, match=r"bulk store issued at PTX line \d+ may still be reading"):
        sim.launch(BULK_STORE.replace("%KEEP", "1"), "bulk", (1, 1, 1), (16, 1, 1),
                   [("u64", pout)])  # fmt: skip
    sim.launch(BULK_STORE.replace("%KEEP", "0"), "bulk", (1, 1, 1), (16, 1, 1), [("u64", pout)])


def test_a_bulk_store_of_unfenced_writes_is_caught() -> None:
    """The tile written by the generic proxy and stored by the copy engine (async proxy)
    with no fence.proxy.async between: reported, naming the writer."""
    sim = Sim()
    pout, _ = sim.buffer(np.zeros(8, np.uint32))
    ptx = BULK_STORE.replace("%KEEP", "0").replace("fence.proxy.async.shared::cta;\n", "")
    with pytest.raises(
        SimError, match=r"address 0x0, which thread \(0, 0, 0\) wrote through the generic proxy"
    ):
        sim.launch(ptx, "bulk", (1, 1, 1), (16, 1, 1), [("u64", pout)])


STMATRIX = """
.visible .entry stm(.param .u64 out)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<6>;
    .shared .align 16 .b8 tile[512];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, tile;
    // register i of lane l holds (1000 * i + 10 * l, 1000 * i + 10 * l + 1)
    mul.lo.u32 %r3, %r1, 10;
    add.u32 %r4, %r3, 1;
    shl.b32 %r4, %r4, 16;
    or.b32 %r5, %r3, %r4;
    add.u32 %r6, %r5, 0x03E803E8;
    add.u32 %r7, %r6, 0x03E803E8;
    add.u32 %r8, %r7, 0x03E803E8;
    // lane l gives the address of row l % 8 of matrix l / 8: 16 bytes a row
    shl.b32 %r9, %r1, 4;
    add.u32 %r10, %r2, %r9;
    stmatrix.sync.aligned.m8n8.x4%TRANS.shared.b16 [%r10], {%r5, %r6, %r7, %r8};
    bar.sync 0;
    ld.shared.v4.u32 {%r11, %r12, %r13, %r14}, [%r10];
    mul.wide.u32 %rd2, %r1, 16;
    add.u64 %rd3, %rd1, %rd2;
    st.global.v4.u32 [%rd3], {%r11, %r12, %r13, %r14};
    ret;
}
"""


@pytest.mark.parametrize("trans", [False, True])
def test_stmatrix_writes_the_fragment_ldmatrix_reads(trans: bool) -> None:
    """Lane l's register i holds row l/4, columns 2(l%4), 2(l%4)+1 of matrix i (NOTES-PTX's
    ldmatrix fragment); .trans stores the transpose."""
    sim = Sim()
    pout, out = sim.buffer(np.zeros((4, 8, 8), np.uint16))
    ptx = STMATRIX.replace("%TRANS", ".trans" if trans else "")
    sim.launch(ptx, "stm", (1, 1, 1), (32, 1, 1), [("u64", pout)])
    want = np.zeros((4, 8, 8), np.uint16)
    for i in range(4):
        for lane in range(32):
            r, c = lane // 4, 2 * (lane % 4)
            want[i, r, c] = 1000 * i + 10 * lane
            want[i, r, c + 1] = 1000 * i + 10 * lane + 1
    if trans:
        want = want.transpose(0, 2, 1)
    np.testing.assert_array_equal(out, want)


def test_wgmma_by_part_of_a_warpgroup_is_an_error(rng: np.random.Generator) -> None:
    text, *_ = oracle("tma_matmul_sm90")
    text = re.sub(r"\.reqntid \d+(, \d+)*", "", text)
    with pytest.raises(SimError, match="a block of 64 threads has no whole warpgroup"):
        tma_gemm(rng, 128, 128, 64, text, threads=64)
