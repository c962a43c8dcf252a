"""Read/write pairs on global memory inside one block: a thread reading a word a thread of
another warp of its block wrote with no barrier between is a race; the same thread reading back
its own store, or a bar.sync between, is none. A read of another lane of the same warp's write,
and a write after other threads' reads, are not reported (replicated tile layouts do both; see
`cutile_py.sim.global_races`)."""

from __future__ import annotations

import numpy as np
import pytest

from cutile_py.sim.context import SimError
from tests.support.sim_harness import Sim, line_of

#: Thread FIRST accesses word 0 (FIRST_OP), then (after BARRIER) thread SECOND does SECOND_OP.
PAIR = """
.visible .entry pair(.param .u64 out)
{
    .reg .b32 %r<6>;
    .reg .b64 %rd<2>;
    .reg .pred %p<3>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    add.u32 %r2, %r1, 100;
    mov.u32 %r3, 0;
    setp.eq.u32 %p1, %r1, FIRST;
    @%p1 FIRST_OP
    BARRIER
    setp.eq.u32 %p2, %r1, SECOND;
    @%p2 SECOND_OP
    @%p2 st.global.u32 [%rd1+4], %r3;
    ret;
}
"""
STORE = "st.global.u32 [%rd1], %r2;"
LOAD = "ld.global.u32 %r3, [%rd1];"


def _pair(first: int, first_op: str, second: int, second_op: str, barrier: str) -> str:
    return (
        PAIR.replace("FIRST_OP", first_op).replace("SECOND_OP", second_op)
        .replace("FIRST", str(first)).replace("SECOND", str(second))
        .replace("BARRIER", barrier)
    )  # fmt: skip


@pytest.mark.parametrize("threads", [(0, 32), (40, 3)])
def test_a_read_of_another_threads_write_without_a_barrier_races(threads: tuple[int, int]) -> None:
    first_op, second_op = STORE, LOAD
    ptx = _pair(threads[0], first_op, threads[1], second_op, "")
    sim = Sim()
    addr, _ = sim.buffer(np.zeros(2, dtype=np.uint32))
    with pytest.raises(SimError) as e:
        sim.launch(ptx, "pair", (1, 1, 1), (64, 1, 1), [("u64", addr)])
    msg = str(e.value)
    second_line = line_of(ptx, f"@%p2 {second_op}")
    first_line = line_of(ptx, f"@%p1 {first_op}")
    assert (
        f"PTX line {second_line} `@%p2 {second_op}`: block (0, 0, 0) thread ({threads[1]}, 0, 0)"
        f": global-memory race: this thread reads global address {addr:#x}"
    ) in msg
    assert (
        f"which block (0, 0, 0) thread ({threads[0]}, 0, 0) wrote at PTX line {first_line}"
        f" `@%p1 {first_op}`, with no bar.sync between the two accesses"
    ) in msg


@pytest.mark.parametrize(("first_op", "second_op"), [(STORE, LOAD), (LOAD, STORE)])
def test_a_barrier_orders_two_threads_of_a_block(first_op: str, second_op: str) -> None:
    ptx = _pair(0, first_op, 33, second_op, "bar.sync 0;")
    sim = Sim()
    addr, out = sim.buffer(np.full(2, 7, dtype=np.uint32))
    sim.launch(ptx, "pair", (1, 1, 1), (64, 1, 1), [("u64", addr)])
    if first_op == STORE:
        np.testing.assert_array_equal(out, [100, 100])  # thread 33 read thread 0's 100
    else:
        np.testing.assert_array_equal(out, [133, 0])  # thread 33 wrote; it loaded no %r3


@pytest.mark.parametrize(("first_op", "second_op"), [(STORE, LOAD), (LOAD, STORE)])
def test_one_thread_reading_back_its_own_store_is_no_race(first_op: str, second_op: str) -> None:
    ptx = _pair(5, first_op, 5, second_op, "")
    sim = Sim()
    addr, out = sim.buffer(np.full(2, 7, dtype=np.uint32))
    sim.launch(ptx, "pair", (1, 1, 1), (64, 1, 1), [("u64", addr)])
    want = [105, 105] if first_op == STORE else [105, 7]
    np.testing.assert_array_equal(out, want)


def test_a_write_after_another_threads_read_is_not_reported() -> None:
    """Thread 0 reads word 0, thread 40 then writes it with no barrier: the pattern of a
    replicated tile layout (replicas read, the owner rewrites), deliberately not reported."""
    ptx = _pair(0, LOAD, 40, STORE, "")
    sim = Sim()
    addr, out = sim.buffer(np.full(2, 7, dtype=np.uint32))
    sim.launch(ptx, "pair", (1, 1, 1), (64, 1, 1), [("u64", addr)])
    np.testing.assert_array_equal(out, [140, 0])


def test_a_read_of_a_write_by_a_lane_of_the_same_warp_is_not_reported() -> None:
    """Thread 0 writes word 0, thread 5 of the same warp then reads it: how a replica of a tile
    layout reads the element its owner stored, deliberately not reported."""
    ptx = _pair(0, STORE, 5, LOAD, "")
    sim = Sim()
    addr, out = sim.buffer(np.full(2, 7, dtype=np.uint32))
    sim.launch(ptx, "pair", (1, 1, 1), (64, 1, 1), [("u64", addr)])
    np.testing.assert_array_equal(out, [100, 100])
