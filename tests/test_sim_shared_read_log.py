"""The shared-memory race check enters reads in its reader tables only when something needs
them (a write, or what forgets readers): writes after reads in one barrier interval must still
be checked against every read, whatever the reads' number, warps, widths and grouping; reads
before a barrier must not count."""

from __future__ import annotations

import numpy as np
import pytest

from cutile_py.sim import races
from cutile_py.sim.context import SimError
from tests.support.sim_harness import Sim

#: One block of 64 threads (two warps); READS and MIDDLE are replaced; then thread WRITER
#: stores its thread index to `buf[OFF]`, and after a barrier thread 0 copies that word and
#: the word every thread read last (`%r3`) to `out`.
KERNEL = """
.visible .entry k(.param .u64 out)
{
    .reg .b16 %rs<2>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<4>;
    .reg .pred %p<10>;
    .shared .align 16 .b8 buf[256];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, buf;
    mov.u32 %r3, 0;
    READS
    MIDDLE
    setp.eq.u32 %p2, %r1, WRITER;
    @%p2 st.shared.u32 [%r2+OFF], %r1;
    bar.sync 0;
    ld.shared.u32 %r10, [%r2+OFF];
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3+4], %r3;
    setp.eq.u32 %p3, %r1, 0;
    @%p3 st.global.u32 [%rd1], %r10;
    ret;
}
"""


def _read(who: str, offset: str, width: str = "u32", dest: str = "%r3") -> str:
    """Threads with `who` (a setp condition on %r1 into %p1) read `buf + offset` (a register
    or constant expression in %r5)."""
    return (
        f"{who}\n    {offset}\n    add.u32 %r4, %r2, %r5;\n"
        f"    @%p1 ld.shared.{width} {dest}, [%r4];"
    )


ALL = "setp.lt.u32 %p1, %r1, 64;"
WORD0 = "mov.u32 %r5, 0;"
OWN_WORD = "shl.b32 %r5, %r1, 2;"


def _launch(reads: str, writer: int, off: int = 0, middle: str = "") -> np.ndarray:
    ptx = (
        KERNEL.replace("READS", reads)
        .replace("MIDDLE", middle)
        .replace("WRITER", str(writer))
        .replace("OFF", str(off))
    )
    sim = Sim()
    addr, out = sim.buffer(np.zeros(65, dtype=np.uint32))
    sim.launch(ptx, "k", (1, 1, 1), (64, 1, 1), [("u64", addr)])
    return out


def test_a_write_after_more_reads_than_the_log_holds_races() -> None:
    reads = "\n    ".join([_read(ALL, WORD0)] * (races.MAX_LOGGED + 6))
    with pytest.raises(SimError, match="writes shared memory that several threads read"):
        _launch(reads, writer=5)


def test_a_write_after_many_reads_of_its_own_word_is_clean() -> None:
    # Every thread reads its own word, again and again; thread 5 then writes word 5.
    reads = "\n    ".join([_read(ALL, OWN_WORD)] * (races.MAX_LOGGED + 6))
    out = _launch(reads, writer=5, off=20)
    assert out[0] == 5
    np.testing.assert_array_equal(out[1:], np.zeros(64))  # buf was zero when read


@pytest.mark.parametrize("writer", [3, 40])
def test_reads_by_two_warps_then_a_write_races(writer: int) -> None:
    reads = "\n    ".join(
        [_read("setp.eq.u32 %p1, %r1, 3;", WORD0), _read("setp.eq.u32 %p1, %r1, 40;", WORD0)]
    )
    with pytest.raises(SimError, match="writes shared memory that several threads read"):
        _launch(reads, writer=writer)


def test_reads_before_a_barrier_then_a_write_is_clean() -> None:
    out = _launch(_read(ALL, WORD0), writer=3, middle="bar.sync 0;")
    assert out[0] == 3


@pytest.mark.parametrize("middle", ["", "@%p9 st.shared.u32 [%r2+200], %r1;"])
def test_a_byte_several_threads_read_stays_theirs(middle: str) -> None:
    """Threads 0 and 1 read word 0 in one instruction; then threads 2 and 3 read words 0 and
    1 in another (with or without a write between, which makes the check take the reads in
    two goes): thread 2's write of word 0 still races with threads 0 and 1."""
    reads = "\n    ".join(
        [
            _read("setp.lt.u32 %p1, %r1, 2;", WORD0),
            "setp.eq.u32 %p9, %r1, 9;",
            middle,
            _read(
                "setp.eq.u32 %p1, %r1, 2;\n    setp.eq.u32 %p8, %r1, 3;\n"
                "    or.pred %p1, %p1, %p8;",
                "sub.u32 %r5, %r1, 2;\n    shl.b32 %r5, %r5, 2;",
            ),
        ]
    )
    with pytest.raises(SimError, match="writes shared memory that several threads read"):
        _launch(reads, writer=2)


@pytest.mark.parametrize(("off", "clash"), [(4, True), (12, False)])
def test_reads_of_several_widths_then_a_write(off: int, clash: bool) -> None:
    """Thread 7 reads 16 bytes at 0, thread 8 two bytes at 6; thread 7 then writes 4 bytes:
    at 4 it overwrites what thread 8 read, at 12 only what it read itself."""
    reads = "\n    ".join(
        [
            _read("setp.eq.u32 %p1, %r1, 7;", WORD0, "v4.u32", "{%r6, %r7, %r8, %r9}"),
            _read("setp.eq.u32 %p1, %r1, 8;", "mov.u32 %r5, 6;", "u16", "%rs1"),
        ]
    )
    if clash:
        with pytest.raises(SimError, match="that several threads read at shared address 0x6"):
            _launch(reads, writer=7, off=off)
    else:
        assert _launch(reads, writer=7, off=off)[0] == 7
