"""Warp-specialized kernels on the simulator: a producer warp and consumer warps that hand
stages of a ring to each other through mbarriers, and named barriers that only some warps
take part in. The executor runs the warps that can go on while others wait (as warps are
scheduled independently), and reports a deadlock — no thread can go on — naming the line,
the blocks and the barrier."""

from __future__ import annotations

import numpy as np
import pytest

from cutile_py.sim.context import SimError
from tests.support.sim_harness import Sim

#: Warp 0 copies tile t (64 floats) of `inp` into stage t % 2 with a bulk copy, once the
#: consumers have released it; warps 1-2 wait for it, accumulate inp[t][c] * (t + 1), release
#: the stage, and at the end exchange their sums through shared memory under a named barrier
#: of the 64 consumer threads: out[c] = acc[c] + acc[63 - c]. PRODUCER_ARRIVE, CONSUMER_BAR
#: and EXCHANGE are replaced by the tests.
WS = """.version 8.0
.target sm_90
.address_size 64
.visible .entry ws(.param .u64 out, .param .u64 inp, .param .u32 ntiles)
{
    .reg .b32 %r<40>;
    .reg .b64 %rd<10>;
    .reg .f32 %f<8>;
    .reg .pred %p<10>;
    .shared .align 128 .b8 stage[512];
    .shared .align 8 .b64 full[2];
    .shared .align 8 .b64 empty[2];
    .shared .align 4 .f32 red[64];
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [inp];
    ld.param.u32 %r1, [ntiles];
    mov.u32 %r2, %tid.x;
    mov.u32 %r30, full;
    mov.u32 %r31, empty;
    mov.u32 %r32, stage;
    mov.u32 %r33, red;
    setp.ne.u32 %p1, %r2, 0;
    @%p1 bra INIT_DONE;
    mbarrier.init.shared::cta.b64 [%r30], 1;
    add.u32 %r34, %r30, 8;
    mbarrier.init.shared::cta.b64 [%r34], 1;
    mbarrier.init.shared::cta.b64 [%r31], 64;
    add.u32 %r34, %r31, 8;
    mbarrier.init.shared::cta.b64 [%r34], 64;
INIT_DONE:
    bar.sync 0;
    setp.ge.u32 %p2, %r2, 32;
    @%p2 bra CONSUMER;
    mov.u32 %r3, 0;
PLOOP:
    setp.ge.u32 %p3, %r3, %r1;
    @%p3 bra PDONE;
    and.b32 %r4, %r3, 1;
    shr.u32 %r5, %r3, 1;
    and.b32 %r5, %r5, 1;
    xor.b32 %r6, %r5, 1;
    shl.b32 %r8, %r4, 3;
    add.u32 %r9, %r31, %r8;
PWAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p4, [%r9], %r6;
    @!%p4 bra PWAIT;
    @%p1 bra PNEXT;
    add.u32 %r11, %r30, %r8;
    PRODUCER_ARRIVE
    shl.b32 %r13, %r4, 8;
    add.u32 %r14, %r32, %r13;
    mul.wide.u32 %rd3, %r3, 256;
    add.u64 %rd4, %rd2, %rd3;
    cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r14], [%rd4], 256, [%r11];
PNEXT:
    add.u32 %r3, %r3, 1;
    bra PLOOP;
PDONE:
    ret;
CONSUMER:
    sub.u32 %r20, %r2, 32;
    shl.b32 %r15, %r20, 2;
    mov.f32 %f1, 0f00000000;
    mov.u32 %r3, 0;
CLOOP:
    setp.ge.u32 %p5, %r3, %r1;
    @%p5 bra CDONE;
    and.b32 %r4, %r3, 1;
    shr.u32 %r5, %r3, 1;
    and.b32 %r5, %r5, 1;
    shl.b32 %r8, %r4, 3;
    add.u32 %r11, %r30, %r8;
CWAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p6, [%r11], %r5;
    @!%p6 bra CWAIT;
    shl.b32 %r13, %r4, 8;
    add.u32 %r14, %r32, %r13;
    add.u32 %r16, %r14, %r15;
    ld.shared.f32 %f2, [%r16];
    add.u32 %r17, %r3, 1;
    cvt.rn.f32.u32 %f3, %r17;
    fma.rn.f32 %f1, %f2, %f3, %f1;
    add.u32 %r9, %r31, %r8;
    mbarrier.arrive.shared::cta.b64 %rd9, [%r9];
    add.u32 %r3, %r3, 1;
    bra CLOOP;
CDONE:
    add.u32 %r22, %r33, %r15;
    st.shared.f32 [%r22], %f1;
    CONSUMER_BAR
    mov.u32 %r23, 63;
    sub.u32 %r23, %r23, %r20;
    shl.b32 %r24, %r23, 2;
    add.u32 %r25, %r33, %r24;
    ld.shared.f32 %f4, [%r25];
    add.f32 %f5, %f1, %f4;
    mul.wide.u32 %rd5, %r20, 4;
    mov.u32 %r26, %ctaid.x;
    mul.wide.u32 %rd6, %r26, 256;
    add.u64 %rd7, %rd1, %rd6;
    add.u64 %rd8, %rd7, %rd5;
    st.global.f32 [%rd8], %f5;
    ret;
}
"""


def line_of(ptx: str, fragment: str) -> int:
    return next(i for i, ln in enumerate(ptx.splitlines(), 1) if fragment in ln)


ARRIVE = "mbarrier.arrive.expect_tx.shared::cta.b64 %rd9, [%r11], 256;"


def ws(arrive: str = ARRIVE, bar: str = "bar.sync 1, 64;") -> str:
    return WS.replace("PRODUCER_ARRIVE", arrive).replace("CONSUMER_BAR", bar)


def _expected(inp: np.ndarray, ntiles: int) -> np.ndarray:
    w = np.arange(1, ntiles + 1, dtype=np.float32)
    acc = np.zeros(64, dtype=np.float32)
    for t in range(ntiles):
        acc = (inp[t] * w[t] + acc).astype(np.float32)  # one fma per tile, in order
    return acc + acc[::-1]


@pytest.mark.parametrize(
    ("grid", "ntiles", "lanes"), [(1, 1, 1 << 16), (3, 5, 96), (4, 8, 1 << 16)]
)
def test_producer_and_consumer_warps_hand_stages_over(grid: int, ntiles: int, lanes: int) -> None:
    rng = np.random.default_rng(grid * 100 + ntiles)
    inp = rng.standard_normal((ntiles, 64)).astype(np.float32)
    for seed in (None, 1, 2):
        sim = Sim()
        in_addr, _ = sim.buffer(inp)
        out_addr, out = sim.buffer(np.zeros((grid, 64), dtype=np.float32))
        sim.launch(ws(), "ws", (grid, 1, 1), (96, 1, 1),
                   [("u64", out_addr), ("u64", in_addr), ("u32", ntiles)],
                   max_batch_lanes=lanes, schedule=seed)  # fmt: skip
        for g in range(grid):
            np.testing.assert_allclose(out[g], _expected(inp, ntiles), rtol=1e-5, atol=1e-5)


def test_under_several_schedules_the_output_is_the_same() -> None:
    inp = np.random.default_rng(7).standard_normal((6, 64)).astype(np.float32)
    sim = Sim()
    in_addr, _ = sim.buffer(inp)
    out_addr, out = sim.buffer(np.zeros((2, 64), dtype=np.float32))
    sim.launch(ws(), "ws", (2, 1, 1), (96, 1, 1),
               [("u64", out_addr), ("u64", in_addr), ("u32", 6)], schedules=4)  # fmt: skip
    np.testing.assert_allclose(out[1], _expected(inp, 6), rtol=1e-5, atol=1e-5)


def test_a_missing_arrival_is_a_deadlock_naming_the_barrier() -> None:
    """The producer's bulk copy is dropped: its expect_tx leaves 256 bytes pending on `full`,
    so the consumers wait forever, and the producer for them."""
    sim = Sim()
    in_addr, _ = sim.buffer(np.zeros((2, 64), dtype=np.float32))
    out_addr, _ = sim.buffer(np.zeros((2, 64), dtype=np.float32))
    broken = ws().replace(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%r14], [%rd4], 256, [%r11];",
        "",
    )
    with pytest.raises(SimError) as e:
        sim.launch(broken, "ws", (2, 1, 1), (96, 1, 1),
                   [("u64", out_addr), ("u64", in_addr), ("u32", 2)])  # fmt: skip
    msg = str(e.value)
    wait = line_of(WS, "mbarrier.try_wait.parity.shared::cta.b64 %p6")
    assert msg.startswith(f"kernel ws, PTX line {wait} ")
    assert "a deadlock: no thread of the batch can go on" in msg
    assert "of blocks (0, 0, 0), (1, 0, 0) wait at PTX line" in msg
    assert "on the mbarrier at shared address 0x200 for its phase of parity 0" in msg


def test_without_the_named_barrier_the_exchange_is_a_race() -> None:
    sim = Sim()
    in_addr, _ = sim.buffer(np.zeros((1, 64), dtype=np.float32))
    out_addr, _ = sim.buffer(np.zeros((1, 64), dtype=np.float32))
    with pytest.raises(SimError, match="race"):
        sim.launch(ws(bar=""), "ws", (1, 1, 1), (96, 1, 1),
                   [("u64", out_addr), ("u64", in_addr), ("u32", 1)])  # fmt: skip


#: Warp 1 computes a value into shared memory and signals with `bar.arrive 3, 64` (no wait);
#: warp 0 waits at `bar.sync 3, 64` and then reads it; warp 2 exits at once.
ARRIVE_SYNC = """
.visible .entry arrive_sync(.param .u64 out)
{
    .reg .b32 %r<10>;
    .reg .b64 %rd<4>;
    .reg .pred %p<3>;
    .shared .align 4 .u32 box[32];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    setp.ge.u32 %p2, %r1, 64;
    @%p2 ret;
    mov.u32 %r5, box;
    and.b32 %r6, %r1, 31;
    shl.b32 %r6, %r6, 2;
    add.u32 %r7, %r5, %r6;
    setp.ge.u32 %p1, %r1, 32;
    @%p1 bra SIGNAL;
    bar.sync 3, 64;
    ld.shared.u32 %r2, [%r7];
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r2;
    ret;
SIGNAL:
    mul.lo.u32 %r3, %r1, 3;
    st.shared.u32 [%r7], %r3;
    bar.arrive 3, 64;
    ret;
}
"""


def test_bar_arrive_releases_the_warps_that_sync() -> None:
    sim = Sim()
    addr, out = sim.buffer(np.zeros(32, dtype=np.uint32))
    sim.launch(ARRIVE_SYNC, "arrive_sync", (1, 1, 1), (96, 1, 1), [("u64", addr)])
    np.testing.assert_array_equal(out, (np.arange(32) + 32) * 3)


def test_a_named_barrier_nobody_else_reaches_is_a_deadlock() -> None:
    sim = Sim()
    addr, _ = sim.buffer(np.zeros(32, dtype=np.uint32))
    with pytest.raises(SimError) as e:
        sim.launch(ARRIVE_SYNC.replace("bar.arrive 3, 64;", ""), "arrive_sync", (1, 1, 1),
                   (96, 1, 1), [("u64", addr)])  # fmt: skip
    msg = str(e.value)
    assert "PTX line" in msg and "`bar.sync 3, 64;`: block (0, 0, 0) thread (0, 0, 0)" in msg
    assert "a deadlock: no thread of the batch can go on" in msg
    assert "barrier 3 reached by only 32 of the 64 threads it waits for in the block" in msg


def test_more_threads_than_a_named_barrier_counts_are_reported() -> None:
    sim = Sim()
    addr, _ = sim.buffer(np.zeros(32, dtype=np.uint32))
    with pytest.raises(SimError, match="barrier 3: 64 threads arrived where it expects 32"):
        sim.launch(ARRIVE_SYNC.replace("bar.sync 3, 64;", "bar.sync 3, 32;"), "arrive_sync",
                   (1, 1, 1), (96, 1, 1), [("u64", addr)])  # fmt: skip


#: One warp tests a fresh barrier (phase 0 not complete: false), arrives (completing it), and
#: tests again (true): a failed test_wait is an answer the kernel acts on, not only a wait.
TEST_THEN_ARRIVE = """.version 8.0
.target sm_90
.address_size 64
.visible .entry test_then_arrive(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<6>;
    .reg .pred %p<3>;
    .shared .align 8 .b64 bar;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, bar;
    mov.u32 %r3, 0;
    mbarrier.init.shared::cta.b64 [%r2], 32;
    mbarrier.test_wait.parity.shared::cta.b64 %p1, [%r2], %r3;
    mbarrier.arrive.shared::cta.b64 %rd5, [%r2];
    mbarrier.test_wait.parity.shared::cta.b64 %p2, [%r2], %r3;
    selp.u32 %r4, 1, 0, %p1;
    selp.u32 %r5, 1, 0, %p2;
    mul.wide.u32 %rd2, %r1, 8;
    add.u64 %rd3, %rd1, %rd2;
    st.global.v2.u32 [%rd3], {%r4, %r5};
    ret;
}
"""


def test_a_failed_test_wait_with_nothing_else_to_run_goes_on() -> None:
    sim = Sim()
    addr, out = sim.buffer(np.full((32, 2), 7, dtype=np.uint32))
    sim.launch(TEST_THEN_ARRIVE, "test_then_arrive", (1, 1, 1), (32, 1, 1), [("u64", addr)])
    np.testing.assert_array_equal(out, np.tile([0, 1], (32, 1)))


#: Warp 1 stores box[lane] = 5 * tid with plain stores and arrives on an mbarrier (32
#: arrivals); warp 0 waits on it and reads box: the arrivals order the stores before the reads.
HANDOFF = """.version 8.0
.target sm_90
.address_size 64
.visible .entry hand(.param .u64 out)
{
    .reg .b32 %r<10>;
    .reg .b64 %rd<6>;
    .reg .pred %p<3>;
    .shared .align 8 .b64 bar;
    .shared .align 4 .u32 box[32];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, bar;
    mov.u32 %r5, box;
    and.b32 %r6, %r1, 31;
    shl.b32 %r6, %r6, 2;
    add.u32 %r7, %r5, %r6;
    setp.ne.u32 %p2, %r1, 0;
    @%p2 bra SKIP;
    mbarrier.init.shared::cta.b64 [%r2], 32;
SKIP:
    bar.sync 0;
    mov.u32 %r3, 0;
    setp.ge.u32 %p1, %r1, 32;
    @%p1 bra PRODUCE;
WAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r2], %r3;
    @!%p2 bra WAIT;
    ld.shared.u32 %r4, [%r7];
    mov.u32 %r9, %ctaid.x;
    mad.lo.u32 %r9, %r9, 32, %r1;
    mul.wide.u32 %rd2, %r9, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r4;
    ret;
PRODUCE:
    mul.lo.u32 %r8, %r1, 5;
    st.shared.u32 [%r7], %r8;
    mbarrier.arrive.shared::cta.b64 %rd5, [%r2];
    ret;
}
"""


def test_plain_stores_handed_over_through_an_mbarrier_are_no_race() -> None:
    sim = Sim()
    addr, out = sim.buffer(np.zeros((2, 32), dtype=np.uint32))
    for seed in (None, 1, 2):
        out[:] = 0
        sim.launch(HANDOFF, "hand", (2, 1, 1), (64, 1, 1), [("u64", addr)], schedule=seed,
                   max_batch_lanes=64 if seed else 1 << 16)  # fmt: skip
        np.testing.assert_array_equal(out, np.tile((np.arange(32) + 32) * 5, (2, 1)))


def test_reading_without_waiting_on_the_mbarrier_is_a_race() -> None:
    sim = Sim()
    addr, _ = sim.buffer(np.zeros(32, dtype=np.uint32))
    broken = HANDOFF.replace("@!%p2 bra WAIT;", "").replace(
        "mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r2], %r3;", ""
    )
    with pytest.raises(SimError, match=r"reads shared memory that thread \(32, 0, 0\) wrote"):
        sim.launch(broken, "hand", (1, 1, 1), (64, 1, 1), [("u64", addr)])
