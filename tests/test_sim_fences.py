"""Fences and atomics order blocks for the global race check: a "last block done" reduction
(each block stores its partial, `__threadfence()`, an atomic counter; the block that counts
last reads every partial) runs clean, and is reported as a race without the fence, or with the
last block picked by its index instead of by the counter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cutile_py.ptx.parser import parse
from cutile_py.sim.context import SimError
from cutile_py.sim.executor import Options, run
from cutile_py.sim.program import Program
from tests.support.sim_harness import Sim

#: nvcc's PTX of `last_block_sum` in tests/nvcc_oracle/kernels.cu.
PTX = (Path(__file__).parent / "nvcc_oracle" / "kernels.ptx").read_text()
FENCE = "\tmembar.gl;\n"
COUNT = "\tatom.global.add.u32 \t%r24, [%rd16], 1;\n"


def _run(ptx: str, rng: np.random.Generator, schedule: int | None = None) -> tuple[float, float]:
    sim = Sim()
    n, block = 1500, 256
    grid = -(-n // block)
    x = rng.integers(-50, 50, n).astype(np.float32)
    xa, _ = sim.buffer(x)
    pa, _ = sim.buffer(np.zeros(grid, np.float32))
    ca, _ = sim.buffer(np.zeros(1, np.uint32))
    ta, total = sim.buffer(np.full(1, np.nan, np.float32))
    program = Program(parse(ptx), "last_block_sum", sim.memory)
    params: list[tuple[str, int | float]] = [
        ("u64", xa), ("s32", n), ("u64", pa), ("u64", ca), ("u64", ta)
    ]  # fmt: skip
    run(program, sim.memory, (grid, 1, 1), (block, 1, 1), 0, params, Options(schedule=schedule))
    return float(total[0]), float(x.sum(dtype=np.float64))


def test_the_kernel_has_the_fence_and_the_counter() -> None:
    assert PTX.count(FENCE) == 1
    assert PTX.count(COUNT) == 1


@pytest.mark.parametrize("schedule", [None, 5, 6])
def test_fence_and_counter_order_the_partials_before_the_last_block(
    rng: np.random.Generator, schedule: int | None
) -> None:
    got, want = _run(PTX, rng, schedule)
    assert got == want


def test_without_the_fence_the_partials_race(rng: np.random.Generator) -> None:
    with pytest.raises(SimError, match="global-memory race: this thread reads") as info:
        _run(PTX.replace(FENCE, ""), rng)
    assert "ld.volatile.global.f32" in str(info.value)
    assert "st.global.f32 [%rd15], %f14;" in str(info.value)


def test_without_the_counter_the_partials_race(rng: np.random.Generator) -> None:
    # The last block by index (ctaid.x == nctaid.x - 1) instead of by the atomic's count.
    ptx = PTX.replace(COUNT, "\tmov.u32 \t%r24, %ctaid.x;\n")
    with pytest.raises(SimError, match="global-memory race: this thread reads"):
        _run(ptx, rng)


def test_a_cta_scope_fence_does_not_order_blocks(rng: np.random.Generator) -> None:
    with pytest.raises(SimError, match="global-memory race"):
        _run(PTX.replace(FENCE, "\tmembar.cta;\n"), rng)


def test_a_release_atomic_needs_no_fence(rng: np.random.Generator) -> None:
    release = COUNT.replace("atom.global.add", "atom.release.gpu.global.add")
    got, want = _run(PTX.replace(FENCE, "").replace(COUNT, release), rng)
    assert got == want


#: Every thread stores slots[i] = i + 1, FENCE, counts itself in; the thread that counts last
#: sums every slot into total.
LAST_THREAD = """
.visible .entry last_thread(.param .u64 slots, .param .u64 count, .param .u64 total,
                            .param .u32 n)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    .reg .pred %p<3>;
    ld.param.u64 %rd1, [slots];
    ld.param.u64 %rd2, [count];
    ld.param.u64 %rd3, [total];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mad.lo.u32 %r5, %r3, %r4, %r2;
    mul.wide.u32 %rd4, %r5, 4;
    add.u64 %rd5, %rd1, %rd4;
    add.u32 %r6, %r5, 1;
    st.global.u32 [%rd5], %r6;
    FENCE
    atom.global.add.u32 %r7, [%rd2], 1;
    add.u32 %r8, %r1, -1;
    setp.ne.u32 %p1, %r7, %r8;
    @%p1 bra DONE;
    mov.u32 %r9, 0;
    mov.u32 %r10, 0;
    mov.u64 %rd6, %rd1;
LOOP:
    ld.global.u32 %r11, [%rd6];
    add.u32 %r9, %r9, %r11;
    add.u64 %rd6, %rd6, 4;
    add.u32 %r10, %r10, 1;
    setp.lt.u32 %p2, %r10, %r1;
    @%p2 bra LOOP;
    st.global.u32 [%rd3], %r9;
DONE:
    ret;
}
"""


def _last_thread(fence: str, grid: int, block: int, schedule: int | None = None) -> int:
    sim = Sim()
    n = grid * block
    sa, _ = sim.buffer(np.zeros(n, np.uint32))
    ca, count = sim.buffer(np.zeros(1, np.uint32))
    ta, total = sim.buffer(np.zeros(1, np.uint32))
    sim.launch(LAST_THREAD.replace("FENCE", fence), "last_thread", (grid, 1, 1), (block, 1, 1),
               [("u64", sa), ("u64", ca), ("u64", ta), ("u32", n)], schedule=schedule)  # fmt: skip
    assert count[0] == n
    return int(total[0])


@pytest.mark.parametrize(("grid", "block", "schedule"), [(3, 64, None), (12, 256, 7), (2, 96, 8)])
def test_every_thread_releasing_through_one_counter(
    grid: int, block: int, schedule: int | None
) -> None:
    """Each thread's own fence and atomic publish its slot to the thread that counts last,
    in its own block (other warps) and in others (3,072 releases: acquisitions keep prefixes of
    the releases at an address, not copies)."""
    n = grid * block
    assert _last_thread("membar.gl;", grid, block, schedule) == n * (n + 1) // 2


def test_every_thread_without_the_fence_races() -> None:
    with pytest.raises(SimError, match="global-memory race: this thread reads"):
        _last_thread("", 3, 64)
