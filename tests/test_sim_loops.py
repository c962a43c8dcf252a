"""The simulator's endless-loop report: a loop whose state repeats with nothing written is
reported within a fraction of a second naming its PTX lines, block and warp; loops that make
progress through memory or the clock are not; the step limit behind it grows with the
launch's work (pointed memory, shared memory, integer parameters) and can be lifted."""

from __future__ import annotations

import os
import time
from typing import TypeVar

import numpy as np
import pytest

import cutile_py as ct
import cutile_py.sim.executor as executor
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py.runtime.select import get_backend
from cutile_py.runtime.sim_backend import SimBackend
from cutile_py.sim.context import SimError
from cutile_py.sim.executor import MIN_STEPS, STEPS_PER_WORD, UNLIMITED, Options, step_limit
from cutile_py.sim.memory import GlobalMemory
from tests.support.sim_harness import HEAD, Sim, line_of

#: Threads with tid.x >= 40 add `step` to a counter until it reaches `n`, then every thread
#: stores its counter: `step` = 0 never ends, with the other threads waiting past the loop.
STRIDE_LOOP = """
.visible .entry stride_loop(.param .u64 out, .param .u32 n, .param .u32 step)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .reg .pred %p<3>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [n];
    ld.param.u32 %r2, [step];
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, 0;
    setp.lt.u32 %p1, %r3, 40;
    @%p1 bra DONE;
LOOP:
    BODY
    setp.lt.u32 %p2, %r4, %r1;
    @%p2 bra LOOP;
DONE:
    mov.u32 %r5, %ctaid.x;
    mov.u32 %r6, %ntid.x;
    mad.lo.u32 %r7, %r5, %r6, %r3;
    mul.wide.u32 %rd2, %r7, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r4;
    ret;
}
"""
ADD = STRIDE_LOOP.replace("BODY", "add.u32 %r4, %r4, %r2;")
#: The counter toggles between 0 and 1: the state comes back every second iteration.
TOGGLE = STRIDE_LOOP.replace("BODY", "xor.b32 %r4, %r4, 1;")

GRID, BLOCK = 3, 64


def run_stride_loop(ptx: str, n: int, step: int, **options: object) -> np.ndarray:
    sim = Sim()
    addr, out = sim.buffer(np.full(GRID * BLOCK, 99, dtype=np.uint32))
    params: list[tuple[str, int | float]] = [("u64", addr), ("u32", n), ("u32", step)]
    sim.launch(ptx, "stride_loop", (GRID, 1, 1), (BLOCK, 1, 1), params, **options)
    return out


@pytest.mark.parametrize("ptx", [ADD, TOGGLE], ids=["fixed", "period-2"])
def test_an_endless_loop_is_reported_in_milliseconds_naming_its_lines(ptx: str) -> None:
    head, branch = line_of(ptx, "LOOP:") + 1, line_of(ptx, "@%p2 bra LOOP;")
    t0 = time.perf_counter()
    # The limit is far beyond what detection needs: hitting it means nothing was detected.
    with pytest.raises(SimError) as info:
        run_stride_loop(ptx, n=1000, step=0, max_steps=1_000_000)
    seconds = time.perf_counter() - t0
    msg = str(info.value)
    assert msg.startswith(f"kernel stride_loop, PTX line {branch} `@%p2 bra LOOP;`: ")
    assert f"an endless loop (PTX lines {head}-{branch})" in msg
    # The first looping thread: block 0, thread 40, in warp 1; 24 of each block's threads loop.
    assert "block (0, 0, 0) thread (40, 0, 0)" in msg
    assert "warp 1 of block (0, 0, 0) (and 48 more threads of its batch of blocks)" in msg
    assert "no memory written and no clock read" in msg
    assert seconds < 2.0, f"detection took {seconds:.2f} s"


def test_the_same_loops_run_to_their_end_when_they_make_progress() -> None:
    tid = np.tile(np.arange(BLOCK), GRID)
    out = run_stride_loop(ADD, n=1000, step=3)
    np.testing.assert_array_equal(out, np.where(tid < 40, 0, 1002))
    out = run_stride_loop(TOGGLE, n=1, step=0)  # 0 -> 1 ends it
    np.testing.assert_array_equal(out, np.where(tid < 40, 0, 1))


def test_a_single_instruction_loop_through_raw_kernel_is_a_launch_error() -> None:
    ct.set_backend("sim")
    spin = HEAD + ".visible .entry spin()\n{\nL:\nbra.uni L;\n}\n"
    t0 = time.perf_counter()
    with pytest.raises(ct.LaunchError, match=r"line 7 `bra.uni L;`.*endless loop \(PTX line 7\)"):
        ct.RawKernel(spin, "spin")(grid=2, block=32).sync()
    assert time.perf_counter() - t0 < 2.0


def test_with_the_loop_check_off_the_step_limit_reports_it() -> None:
    spin = ".visible .entry spin()\n{\nL:\nbra.uni L;\n}\n"
    with pytest.raises(SimError, match=r"no exit after 1000 instruction steps \(Options"):
        Sim().launch(spin, "spin", (1, 1, 1), (32, 1, 1), [], max_steps=1000, loop_check=False)


#: One thread bumps a counter in global memory until it reaches `n`; its registers are the
#: same at every backward branch (the loaded value is cleared), only memory changes.
COUNT_UP = """
.visible .entry count_up(.param .u64 counter, .param .u32 n, .param .u32 inc)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<2>;
    .reg .pred %p<2>;
    ld.param.u64 %rd1, [counter];
    ld.param.u32 %r2, [n];
    ld.param.u32 %r3, [inc];
AGAIN:
    ld.global.u32 %r1, [%rd1];
    add.u32 %r1, %r1, %r3;
    st.global.u32 [%rd1], %r1;
    setp.lt.u32 %p1, %r1, %r2;
    mov.u32 %r1, 0;
    @%p1 bra AGAIN;
    ret;
}
"""


def test_a_loop_whose_only_progress_is_in_memory_is_not_reported() -> None:
    sim = Sim()
    addr, counter = sim.buffer(np.zeros(1, dtype=np.uint32))
    params: list[tuple[str, int | float]] = [("u64", addr), ("u32", 3000), ("u32", 1)]
    sim.launch(COUNT_UP, "count_up", (1, 1, 1), (1, 1, 1), params)
    assert counter[0] == 3000


def test_a_loop_writing_the_same_bytes_is_left_to_the_step_limit() -> None:
    """The rule: any write counts as progress, so this endless loop meets the step limit,
    whose message says how to raise it."""
    sim = Sim()
    addr, counter = sim.buffer(np.zeros(1, dtype=np.uint32))
    params: list[tuple[str, int | float]] = [("u64", addr), ("u32", 3000), ("u32", 0)]
    with pytest.raises(SimError) as info:
        sim.launch(COUNT_UP, "count_up", (1, 1, 1), (1, 1, 1), params, max_steps=20_000)
    msg = str(info.value)
    assert "no exit after 20000 instruction steps (Options.max_steps)" in msg
    assert "an endless loop that writes memory" in msg
    assert "CUTILE_PY_SIM_MAX_STEPS set higher (0: no limit)" in msg
    assert counter[0] == 0


#: Waits until the clock passes 40000 (the simulator's clock is 4 per step); the registers
#: at the backward branch are the same every time, but the clock read is progress.
WAIT_CLOCK = """
.visible .entry wait_clock(.param .u64 out)
{
    .reg .b64 %rd<4>;
    .reg .pred %p<2>;
    ld.param.u64 %rd1, [out];
WAIT:
    mov.u64 %rd2, %clock64;
    setp.lt.u64 %p1, %rd2, 40000;
    mov.u64 %rd2, 0;
    @%p1 bra WAIT;
    mov.u64 %rd3, %clock64;
    st.global.u64 [%rd1], %rd3;
    ret;
}
"""


def test_a_loop_waiting_on_the_clock_is_not_reported() -> None:
    sim = Sim()
    addr, out = sim.buffer(np.zeros(1, dtype=np.uint64))
    sim.launch(WAIT_CLOCK, "wait_clock", (1, 1, 1), (32, 1, 1), [("u64", addr)])
    assert 40000 <= out[0] < 40100


#: Block 0 sets a flag; every other block spins until it sees it, then stores it.
HANDOFF = """
.visible .entry handoff(.param .u64 flag, .param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<5>;
    .reg .pred %p<3>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %ctaid.x;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra SPIN;
    mov.u32 %r3, 7;
    st.global.u32 [%rd1], %r3;
    ret;
SPIN:
    ld.volatile.global.u32 %r2, [%rd1];
    setp.eq.u32 %p2, %r2, 0;
    @%p2 bra SPIN;
    mul.wide.u32 %rd3, %r1, 4;
    add.u64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r2;
    ret;
}
"""


def test_spinning_on_a_flag_another_block_sets() -> None:
    """Set by a block of an earlier batch, or of the same batch (the spinning warps stop and
    the setter runs, as warps are scheduled independently), the flag ends the spin; set by a
    block of a later batch it cannot: an endless loop on the simulator, reported with the
    reason."""
    sim = Sim()
    flag_addr, flag = sim.buffer(np.zeros(1, dtype=np.uint32))
    out_addr, out = sim.buffer(np.zeros(3, dtype=np.uint32))
    params: list[tuple[str, int | float]] = [("u64", flag_addr), ("u64", out_addr)]
    # (A flag handed between blocks with plain stores is a global-memory race to the race
    # check, rightly: it is off here, where the loop rule is under test.)
    for lanes in (32, 96):
        flag[0], out[:] = 0, 0
        sim.launch(HANDOFF, "handoff", (3, 1, 1), (32, 1, 1), params, max_batch_lanes=lanes,
                   race_check=False)  # fmt: skip
        np.testing.assert_array_equal(out, [0, 7, 7])
    flag[0], out[:] = 0, 0
    last_sets = HANDOFF.replace("setp.ne.u32 %p1, %r1, 0;", "setp.ne.u32 %p1, %r1, 2;")
    with pytest.raises(SimError) as info:
        sim.launch(
            last_sets, "handoff", (3, 1, 1), (32, 1, 1), params, max_steps=1_000_000,
            race_check=False, max_batch_lanes=32,
        )  # fmt: skip
    msg = str(info.value)
    spin = line_of(HANDOFF, "ld.volatile")
    assert f"endless loop (PTX lines {spin}-{spin + 2}): warp 0 of block (0, 0, 0)" in msg
    assert "no other thread of its batch of blocks can run" in msg
    assert flag[0] == 0


# -- the step limit -----------------------------------------------------------------------------


def test_the_step_limit_grows_with_the_launch_s_work() -> None:
    memory = GlobalMemory()
    assert step_limit(Options(), memory) == (MIN_STEPS, "the simulator's minimum")
    words = 2 * MIN_STEPS // STEPS_PER_WORD
    pointed = np.zeros(4 * words, dtype=np.uint8)
    other = np.zeros(4 * words, dtype=np.uint8)
    memory.acquire(pointed, "allocation")
    memory.acquire(other, "allocation")
    inside = int(pointed.ctypes.data) + 100  # a pointer into it counts all of it, once
    limit, why = step_limit(Options(), memory, [("u64", inside), ("u64", inside + 4)])
    assert limit == STEPS_PER_WORD * words and f"{4 * words} bytes of memory" in why
    # Integers below 2**32 count by value (a loop bound); larger ones are not counts.
    limit, why = step_limit(Options(), memory, [("s32", -words), ("u64", 1 << 40)])
    assert limit == STEPS_PER_WORD * words and f"summing to {words}" in why
    limit, why = step_limit(Options(), memory, [], shared_bytes=4 * words)
    assert limit == STEPS_PER_WORD * words and f"{4 * words} bytes of shared" in why
    assert step_limit(Options(max_steps=10), memory) == (10, "Options.max_steps")
    assert step_limit(Options(max_steps=0), memory) == (UNLIMITED, "Options.max_steps")
    with pytest.raises(SimError, match="give a step count"):
        step_limit(Options(max_steps=-5), memory)


def test_the_step_limit_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = Sim()
    addr, counter = sim.buffer(np.zeros(1, dtype=np.uint32))
    params: list[tuple[str, int | float]] = [("u64", addr), ("u32", 3000), ("u32", 0)]
    monkeypatch.setenv("CUTILE_PY_SIM_MAX_STEPS", "2000")
    with pytest.raises(SimError, match=r"no exit after 2000 .*\(CUTILE_PY_SIM_MAX_STEPS\)"):
        sim.launch(COUNT_UP, "count_up", (1, 1, 1), (1, 1, 1), params)
    for bad, why in (("lots", "'lots' is not an integer"), ("-1", "or 0 for none")):
        monkeypatch.setenv("CUTILE_PY_SIM_MAX_STEPS", bad)
        with pytest.raises(SimError, match=why):
            sim.launch(COUNT_UP, "count_up", (1, 1, 1), (1, 1, 1), params)
    # 0: no limit, even with a tiny minimum (the loop takes about 18000 steps).
    monkeypatch.setattr(executor, "MIN_STEPS", 100)
    monkeypatch.setenv("CUTILE_PY_SIM_MAX_STEPS", "0")
    params[2] = ("u32", 1)
    stats = sim.launch(COUNT_UP, "count_up", (1, 1, 1), (1, 1, 1), params)
    assert counter[0] == 3000 and stats.steps > 10_000


def test_the_tests_do_not_see_a_user_step_limit() -> None:
    assert "CUTILE_PY_SIM_MAX_STEPS" not in os.environ


def test_a_loop_bounded_by_an_integer_parameter_gets_steps_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scaled-down long loop: with a minimum of 2,000 steps, 5,000 iterations over almost
    no memory (about 15,000 steps) finish because the bound `n` is part of the work."""
    monkeypatch.setattr(executor, "MIN_STEPS", 2000)
    sim = Sim()
    addr, out = sim.buffer(np.zeros(GRID * BLOCK, dtype=np.uint32))
    params: list[tuple[str, int | float]] = [("u64", addr), ("u32", 5000), ("u32", 1)]
    stats = sim.launch(ADD, "stride_loop", (GRID, 1, 1), (BLOCK, 1, 1), params)
    assert stats.steps > 7 * 2000
    np.testing.assert_array_equal(out, np.where(np.tile(np.arange(BLOCK), GRID) < 40, 0, 5000))


#: One thread clears 16 KiB of shared memory word by word; the bound is an immediate.
CLEAR_SHARED = """
.visible .entry clear_shared(.param .u64 out)
{
    .shared .align 4 .b8 buf[16384];
    .reg .b32 %r<3>;
    .reg .b64 %rd<2>;
    .reg .pred %p<2>;
    mov.u32 %r1, 0;
    mov.u32 %r2, buf;
CLEAR:
    st.shared.u32 [%r2], %r1;
    add.u32 %r2, %r2, 4;
    add.u32 %r1, %r1, 4;
    setp.lt.u32 %p1, %r1, 16384;
    @%p1 bra CLEAR;
    ld.param.u64 %rd1, [out];
    st.global.u32 [%rd1], %r1;
    ret;
}
"""


def test_a_loop_over_shared_memory_gets_steps_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor, "MIN_STEPS", 2000)
    sim = Sim()
    addr, out = sim.buffer(np.zeros(1, dtype=np.uint32))
    stats = sim.launch(CLEAR_SHARED, "clear_shared", (1, 1, 1), (1, 1, 1), [("u64", addr)])
    assert out[0] == 16384 and stats.steps > 5 * 4096


R = TypeVar("R")
W = TypeVar("W")


@ct.kernel
def row_sum_of_squares(
    out: Mut[Tensor[f32, R, W]], x: Tensor[f32, Dyn, Dyn], C: ct.Constant[int]
) -> None:
    acc: ct.Tile = ct.zeros((1, C), f32)
    for j in range(ct.cdiv(x.shape[1], C)):
        t = ct.load(x, (ct.bid(0), j), (1, C))  # padding 0 past the row's end
        acc = acc + t * t
    out.store(ct.sum(acc, axis=1, keepdims=True))


def test_the_readme_row_loop_with_c_1_scaled_down(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """The README's kernel with C=1 takes 30 steps a column (600,000 columns: 18M steps, past
    the minimum of 5M); here 3,000 columns against a minimum of 2,000 steps."""
    monkeypatch.setattr(executor, "MIN_STEPS", 2000)
    ct.set_backend("sim")
    sim = get_backend("sim")
    assert isinstance(sim, SimBackend)
    x = rng.standard_normal((2, 3000)).astype(np.float32)
    out = ct.zeros((2, 1)).partition((1, 1))
    res = row_sum_of_squares(out, ct.from_numpy(x), 1).sync()[0]
    assert sim.last_stats is not None and sim.last_stats.steps > 20 * 2000
    want = (x.astype(np.float64) ** 2).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(res.unpartition().to_numpy(), want, rtol=1e-5)
    # kernel.report simulates the launch too, under the same limit (it used the minimum).
    x2 = ct.from_numpy(x)
    report = row_sum_of_squares.report(ct.zeros((2, 1)).partition((1, 1)), x2, 1)
    assert "row_sum_of_squares" in str(report)


ATOMIC_PROGRESS = """
.visible .entry count_up(.param .u64 c, .param .u32 n)
{
    .reg .b32 %r<4>; .reg .b64 %rd<2>; .reg .pred %p<2>;
    ld.param.u64 %rd1, [c]; ld.param.u32 %r2, [n];
AGAIN:
    atom.global.add.u32 %r1, [%rd1], 1;
    setp.lt.u32 %p1, %r1, %r2;
    mov.u32 %r1, 0;
    @%p1 bra AGAIN;
    ret;
}
"""

TIMER_WAIT = """
.visible .entry wait_a_while(.param .u64 out)
{
    .reg .b64 %rd<5>; .reg .pred %p<2>;
    ld.param.u64 %rd1, [out];
    mov.u64 %rd3, %globaltimer;
    add.u64 %rd3, %rd3, 20000000;
WAIT:
    mov.u64 %rd2, %globaltimer;
    setp.lt.u64 %p1, %rd2, %rd3;
    mov.u64 %rd2, 0;
    @%p1 bra WAIT;
    st.global.u64 [%rd1], %rd3;
    ret;
}
"""


def test_a_loop_whose_only_progress_is_an_atomic_is_not_endless() -> None:
    """The registers repeat at the back-edge (the counter's value is overwritten), but the
    atomic wrote memory: progress, so the loop runs to its end."""
    sim = Sim()
    addr, counter = sim.buffer(np.zeros(1, dtype=np.uint32))
    sim.launch(ATOMIC_PROGRESS, "count_up", (1, 1, 1), (1, 1, 1), [("u64", addr), ("u32", 5000)])
    assert counter[0] == 5001  # the pass that read 5000 added one more, then left


def test_a_loop_waiting_on_the_global_timer_is_not_endless() -> None:
    """Reading %globaltimer is progress (its value moves on its own): a 20 ms wait ends."""
    sim = Sim()
    addr, out = sim.buffer(np.zeros(1, dtype=np.uint64))
    sim.launch(TIMER_WAIT, "wait_a_while", (1, 1, 1), (32, 1, 1), [("u64", addr)])
    assert out[0] > 20_000_000
