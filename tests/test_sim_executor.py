"""The simulator's executor on hand-written PTX: divergence and reconvergence, loops, early
exits, barriers, batching, and the faults it must report (with kernel, line, block, thread)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cutile_py.ptx.parser import parse
from cutile_py.sim.context import SimError
from cutile_py.sim.program import Program
from tests.support.sim_harness import Sim, line_of

DATA = Path(__file__).parent / "data" / "ptx"

DIVERGE = """
.visible .entry diverge(.param .u64 out, .param .u32 n)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .reg .pred %p<3>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r7, [n];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.u32 %r4, %r2, %r3, %r1;
    setp.ge.u32 %p2, %r4, %r7;
    @%p2 bra DONE;
    and.b32 %r5, %r4, 1;
    setp.eq.u32 %p1, %r5, 0;
    @%p1 bra EVEN;
    mul.lo.u32 %r6, %r4, 3;
    bra.uni JOIN;
EVEN:
    shl.b32 %r6, %r4, 1;
JOIN:
    add.u32 %r6, %r6, 1000;
    mul.wide.u32 %rd2, %r4, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r6;
DONE:
    ret;
}
"""


@pytest.mark.parametrize(
    ("block", "grid", "batch"), [(48, 3, 1 << 16), (256, 5, 1 << 16), (64, 9, 64)]
)
def test_divergent_if_else_reconverges(block: int, grid: int, batch: int) -> None:
    sim = Sim()
    n = block * grid - 5
    addr, out = sim.buffer(np.full(block * grid, 7, dtype=np.uint32))
    stats = sim.launch(DIVERGE, "diverge", (grid, 1, 1), (block, 1, 1), [("u64", addr), ("u32", n)],
                       max_batch_lanes=batch)  # fmt: skip
    i = np.arange(n, dtype=np.uint32)
    np.testing.assert_array_equal(out[:n], np.where(i % 2 == 0, 2 * i, 3 * i) + 1000)
    assert (out[n:] == 7).all()  # threads past n stored nothing
    assert stats.batches == -(-grid // max(1, batch // (-(-block // 32) * 32)))


NESTED = """
.visible .entry nested(.param .u64 out)
{
    .reg .b32 %r<12>;
    .reg .b64 %rd<4>;
    .reg .pred %p<3>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    and.b32 %r8, %r1, 3;          // outer trip count: tid & 3
    shr.u32 %r9, %r1, 2;
    and.b32 %r9, %r9, 3;          // inner trip count: ((tid >> 2) & 3) + i
    mov.u32 %r10, 0;
    mov.u32 %r2, 0;
OUTER:
    setp.ge.u32 %p1, %r2, %r8;
    @%p1 bra DONE;
    mov.u32 %r3, 0;
INNER:
    add.u32 %r4, %r9, %r2;
    setp.ge.u32 %p2, %r3, %r4;
    @%p2 bra NEXT;
    mad.lo.u32 %r10, %r2, %r3, %r10;
    add.u32 %r10, %r10, 1;
    add.u32 %r3, %r3, 1;
    bra.uni INNER;
NEXT:
    add.u32 %r2, %r2, 1;
    bra.uni OUTER;
DONE:
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r10;
    ret;
}
"""


def test_nested_loops_with_per_thread_trip_counts() -> None:
    sim = Sim()
    addr, out = sim.buffer(np.zeros(96, dtype=np.uint32))
    sim.launch(NESTED, "nested", (1, 1, 1), (96, 1, 1), [("u64", addr)])
    want = []
    for t in range(96):
        acc = 0
        for i in range(t & 3):
            for j in range(((t >> 2) & 3) + i):
                acc += i * j + 1
        want.append(acc)
    np.testing.assert_array_equal(out, want)


EARLY = """
.visible .entry early(.param .u64 out, .param .u32 live)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .reg .pred %p<2>;
    .shared .align 4 .b8 smem[256];
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r7, [live];
    mov.u32 %r1, %tid.x;
    setp.ge.u32 %p1, %r1, %r7;
    @%p1 ret;
    mul.lo.u32 %r2, %r1, 7;
    mov.u32 %r3, smem;
    shl.b32 %r4, %r1, 2;
    add.u32 %r5, %r3, %r4;
    st.shared.u32 [%r5], %r2;
    bar.sync 0;
    add.u32 %r4, %r1, 1;
    and.b32 %r4, %r4, 15;
    shl.b32 %r4, %r4, 2;
    add.u32 %r5, %r3, %r4;
    ld.shared.u32 %r6, [%r5];
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r6;
    ret;
}
"""


def test_early_return_then_barrier_counts_only_live_threads() -> None:
    sim = Sim()
    addr, out = sim.buffer(np.full((2, 48), 5, dtype=np.uint32))
    sim.launch(EARLY, "early", (2, 1, 1), (48, 1, 1), [("u64", addr), ("u32", 16)])
    t = np.arange(16)
    np.testing.assert_array_equal(out[0, :16], ((t + 1) & 15) * 7)
    assert (out[0, 16:] == 5).all()  # both blocks write the same 16 words


PARTIAL_BARRIER = """
.visible .entry partial()
{
    .reg .b32 %r1;
    .reg .pred %p1;
    mov.u32 %r1, %tid.x;
    setp.lt.u32 %p1, %r1, 16;
    @%p1 bra SKIP;
    bar.sync 0;
SKIP:
    bar.sync 0;
    ret;
}
"""


def test_barrier_reached_by_part_of_a_block_is_an_error() -> None:
    with pytest.raises(SimError) as e:
        Sim().launch(PARTIAL_BARRIER, "partial", (1, 1, 1), (48, 1, 1), [])
    msg = str(e.value)
    line = line_of(PARTIAL_BARRIER, "    bar.sync 0;")
    assert f"kernel partial, PTX line {line} `bar.sync 0;`" in msg
    assert "block (0, 0, 0) thread (16, 0, 0)" in msg
    assert "only 32 of the 48 live threads" in msg and "thread (0, 0, 0) did not arrive" in msg


OOB = """
.visible .entry oob(.param .u64 out, .param .u32 n)
{
    .reg .b32 %r<6>;
    .reg .b64 %rd<4>;
    .reg .pred %p1;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r5, [n];
    add.u32 %r5, %r5, 3;            // the planted bug: three elements too many
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.u32 %r4, %r2, %r3, %r1;
    setp.ge.u32 %p1, %r4, %r5;
    @%p1 ret;
    mul.wide.u32 %rd2, %r4, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r4;
    ret;
}
"""


def test_out_of_bounds_store_names_line_block_and_thread() -> None:
    sim = Sim()
    addr, _ = sim.buffer(np.zeros(100, dtype=np.uint32))
    with pytest.raises(SimError) as e:
        sim.launch(OOB, "oob", (2, 1, 1), (64, 1, 1), [("u64", addr), ("u32", 100)])
    msg = str(e.value)
    line = line_of(OOB, "st.global.u32")
    assert msg.startswith(f"kernel oob, PTX line {line} `st.global.u32 [%rd3], %r4;`: ")
    assert "block (1, 0, 0) thread (36, 0, 0)" in msg
    assert "out-of-bounds store of 4 bytes" in msg and "0 bytes past the end of the 400-byte" in msg


MISALIGNED = """
.visible .entry misaligned(.param .u64 src, .param .u64 dst)
{
    .reg .f32 %f<5>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [dst];
    ld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1+4];
    st.global.v4.f32 [%rd2], {%f1, %f2, %f3, %f4};
    ret;
}
"""


def test_misaligned_vector_load_is_an_error() -> None:
    sim = Sim()
    src, _ = sim.buffer(np.zeros(64, dtype=np.float32))
    dst, _ = sim.buffer(np.zeros(64, dtype=np.float32))
    with pytest.raises(SimError) as e:
        sim.launch(MISALIGNED, "misaligned", (1, 1, 1), (32, 1, 1), [("u64", src), ("u64", dst)])
    msg = str(e.value)
    assert f"PTX line {line_of(MISALIGNED, 'ld.global.nc.v4')}" in msg
    assert "block (0, 0, 0) thread (0, 0, 0)" in msg and "misaligned" in msg
    assert "not a multiple of 16" in msg


RACE = """
.visible .entry race(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .shared .align 4 .b8 buf[128];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, buf;
    shl.b32 %r3, %r1, 2;
    add.u32 %r4, %r2, %r3;
    st.shared.u32 [%r4], %r1;
    BARRIER
    add.u32 %r5, %r1, 1;
    and.b32 %r5, %r5, 31;
    shl.b32 %r5, %r5, 2;
    add.u32 %r5, %r2, %r5;
    ld.shared.u32 %r6, [%r5];
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r6;
    ret;
}
"""


@pytest.mark.parametrize("barrier", ["", "bar.sync 0;", "barrier.sync.aligned 0;"])
def test_shared_memory_race_without_barrier(barrier: str) -> None:
    sim = Sim()
    ptx = RACE.replace("BARRIER", barrier)
    addr, out = sim.buffer(np.zeros(32, dtype=np.uint32))
    if barrier:
        sim.launch(ptx, "race", (2, 1, 1), (32, 1, 1), [("u64", addr)])
        np.testing.assert_array_equal(out, (np.arange(32) + 1) % 32)
        return
    with pytest.raises(SimError) as e:
        sim.launch(ptx, "race", (2, 1, 1), (32, 1, 1), [("u64", addr)])
    msg = str(e.value)
    assert f"PTX line {line_of(ptx, 'ld.shared.u32')}" in msg
    assert "block (0, 0, 0) thread (0, 0, 0)" in msg and "thread (1, 0, 0) wrote" in msg
    assert "race" in msg
    # The detector is optional: without it the kernel runs (and reads whatever is there).
    sim.launch(ptx, "race", (2, 1, 1), (32, 1, 1), [("u64", addr)], race_check=False)


IDS = """
.visible .entry ids(.param .u64 out)
{
    .reg .b32 %r<12>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %tid.y;
    mov.u32 %r3, %tid.z;
    mov.u32 %r4, %ctaid.x;
    mov.u32 %r5, %ctaid.y;
    mov.u32 %r6, %ctaid.z;
    mov.u32 %r7, %ntid.x;
    mov.u32 %r8, %nctaid.y;
    mov.u32 %r9, %laneid;
    mov.u32 %r10, %warpid;
    // linear index: ((block linear) * 24 + thread linear) * 12 words
    mad.lo.u32 %r11, %r6, 3, %r5;
    mad.lo.u32 %r11, %r11, 2, %r4;
    mad.lo.u32 %r0, %r3, 2, %r2;
    mad.lo.u32 %r0, %r0, 4, %r1;
    mad.lo.u32 %r11, %r11, 24, %r0;
    mul.lo.u32 %r11, %r11, 48;
    cvt.u64.u32 %rd2, %r11;
    add.u64 %rd3, %rd1, %rd2;
    st.global.v4.u32 [%rd3], {%r1, %r2, %r3, %r4};
    st.global.v4.u32 [%rd3+16], {%r5, %r6, %r7, %r8};
    st.global.v2.u32 [%rd3+32], {%r9, %r10};
    ret;
}
"""


def test_special_registers_in_three_dimensions() -> None:
    sim = Sim()
    addr, out = sim.buffer(np.zeros((12, 24, 12), dtype=np.uint32))
    sim.launch(IDS, "ids", (2, 3, 2), (4, 2, 3), [("u64", addr)], max_batch_lanes=96)
    b = np.arange(12)
    t = np.arange(24)
    want = np.zeros((12, 24, 12), dtype=np.uint32)
    want[..., 0], want[..., 1], want[..., 2] = t % 4, (t // 4) % 2, t // 8
    want[..., 3] = (b % 2)[:, None]
    want[..., 4] = ((b // 2) % 3)[:, None]
    want[..., 5] = (b // 6)[:, None]
    want[..., 6], want[..., 7] = 4, 3
    want[..., 8], want[..., 9] = t % 32, t // 32
    np.testing.assert_array_equal(out, want)


def test_load_rejects_unknown_opcodes_naming_the_line() -> None:
    ptx = ".visible .entry k()\n{\n.reg .b32 %r1;\nfrobnicate.b32 %r1, %r1;\nret;\n}\n"
    with pytest.raises(SimError, match=r"PTX line 7 `frobnicate.b32 %r1, %r1;`: .*frobnicate"):
        Sim().program(ptx, "k")
    with pytest.raises(SimError, match=r"no \.entry 'nope'"):
        Sim().program(ptx, "nope")


def test_launch_configuration_checks() -> None:
    ptx = ".visible .entry k() .reqntid 64, 1, 1\n{\nret;\n}\n"
    with pytest.raises(SimError, match=r"requires \(64, 1, 1\) threads"):
        Sim().launch(ptx, "k", (1, 1, 1), (32, 1, 1), [])
    with pytest.raises(SimError, match="at most 1024 threads"):
        Sim().launch(ptx.replace(".reqntid 64, 1, 1", ""), "k", (1, 1, 1), (2048, 1, 1), [])


# --- nvcc's PTX (tests/data/ptx/parser_sample.cu) -----------------------------------------------


def _nvcc(sim: Sim, entry: str) -> Program:
    return Program(parse((DATA / "parser_sample.ptx").read_text()), entry, sim.memory)


def test_nvcc_block_sum(rng: np.random.Generator) -> None:
    from cutile_py.sim.executor import run

    sim = Sim()
    n = 1000
    x = rng.standard_normal(n).astype(np.float32)
    xa, _ = sim.buffer(x)
    oa, out = sim.buffer(np.zeros(4, dtype=np.float32))
    run(_nvcc(sim, "block_sum"), sim.memory, (4, 1, 1), (256, 1, 1), 0,
        [("u64", xa), ("u64", oa), ("u32", n)])  # fmt: skip
    want = [np.pad(x, (0, 24))[i * 256 : (i + 1) * 256].astype(np.float64).sum() for i in range(4)]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_nvcc_collatz_loops_and_early_returns(rng: np.random.Generator) -> None:
    from cutile_py.sim.executor import run

    sim = Sim()
    n = 2000
    start = rng.integers(-5, 200, n).astype(np.int32)
    sa, _ = sim.buffer(start)
    oa, out = sim.buffer(np.full(n + 48, 99, dtype=np.int32))
    run(_nvcc(sim, "collatz"), sim.memory, (-(-n // 128), 1, 1), (128, 1, 1), 0,
        [("u64", sa), ("u64", oa), ("u32", n)])  # fmt: skip

    def steps(v: int) -> int:
        if v <= 0:
            return -1
        k = 0
        while v != 1:
            v, k = (3 * v + 1 if v & 1 else v // 2), k + 1
        return k

    np.testing.assert_array_equal(out[:n], [steps(int(v)) for v in start])
    assert (out[n:] == 99).all()


BREAK = """
.visible .entry brk(.param .u64 out)
{
    .reg .b32 %r<12>;
    .reg .b64 %rd<4>;
    .reg .pred %p<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    and.b32 %r8, %r1, 7;              // outer trips: tid & 7
    and.b32 %r9, %r1, 3;
    or.b32 %r9, %r9, 4;               // the exit test mask: (tid & 3) | 4
    mov.u32 %r10, 0;
    mov.u32 %r2, 0;
OUTER:
    setp.ge.u32 %p1, %r2, %r8;
    @%p1 bra OUT;
    mov.u32 %r3, 0;
INNER:
    mad.lo.u32 %r4, %r2, 10, %r3;
    and.b32 %r5, %r4, %r9;
    setp.eq.u32 %p2, %r5, 5;
    @%p2 bra OUT;                     // leaves both loops at once
    add.u32 %r10, %r10, 1;
    add.u32 %r3, %r3, 1;
    setp.lt.u32 %p3, %r3, 10;
    @%p3 bra INNER;
    add.u32 %r2, %r2, 1;
    bra.uni OUTER;
OUT:
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r10;
    ret;
}
"""


def test_branch_out_of_nested_loops() -> None:
    sim = Sim()
    addr, out = sim.buffer(np.zeros(64, dtype=np.uint32))
    sim.launch(BREAK, "brk", (1, 1, 1), (64, 1, 1), [("u64", addr)])
    want = []
    for t in range(64):
        acc, done = 0, False
        for i in range(t & 7):
            for j in range(10):
                if ((i * 10 + j) & ((t & 3) | 4)) == 5:
                    done = True
                    break
                acc += 1
            if done:
                break
        want.append(acc)
    np.testing.assert_array_equal(out, want)


BAR_RED = """
.visible .entry vote(.param .u64 out)
{
    .reg .b32 %r<6>;
    .reg .b64 %rd<4>;
    .reg .pred %p<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    setp.lt.u32 %p1, %r1, %r2;        // block b: threads below b vote yes
    bar.red.popc.u32 %r3, 0, %p1;
    bar.red.or.pred %p2, 0, %p1;
    bar.red.and.pred %p3, 0, !%p1;
    selp.u32 %r4, 1, 0, %p2;
    selp.u32 %r5, 1, 0, %p3;
    mad.lo.u32 %r1, %r2, 40, %r1;
    mul.wide.u32 %rd2, %r1, 16;
    add.u64 %rd3, %rd1, %rd2;
    st.global.v4.u32 [%rd3], {%r3, %r4, %r5, %r2};
    ret;
}
"""


def test_barrier_reductions() -> None:
    sim = Sim()
    addr, out = sim.buffer(np.zeros((3, 40, 4), dtype=np.uint32))
    sim.launch(BAR_RED, "vote", (3, 1, 1), (40, 1, 1), [("u64", addr)])
    for b in range(3):
        assert (out[b, :, 0] == b).all()  # popc: how many threads voted yes
        assert (out[b, :, 1] == (b > 0)).all() and (out[b, :, 2] == (b == 0)).all()


ONE_WORD = """
.visible .entry one_word(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .shared .align 4 .b8 buf[4];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, buf;
    VALUE
    st.shared.u32 [%r2], %r3;
    bar.sync 0;
    ld.shared.u32 %r4, [%r2];
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r4;
    ret;
}
"""


def test_lanes_storing_one_value_to_one_shared_word_is_no_race(rng: np.random.Generator) -> None:
    """Triton's reductions end so: every lane of a warp stores the same result to one word."""
    sim = Sim()
    v = int(rng.integers(1, 2**31))
    addr, out = sim.buffer(np.zeros(64, dtype=np.uint32))
    sim.launch(ONE_WORD.replace("VALUE", f"mov.u32 %r3, {v};"), "one_word", (1, 1, 1),
               (64, 1, 1), [("u64", addr)])  # fmt: skip
    np.testing.assert_array_equal(out, np.full(64, v, dtype=np.uint32))


def test_lanes_storing_different_values_to_one_shared_word_race(rng: np.random.Generator) -> None:
    sim = Sim()
    # Lanes 0..k-1 store v, lanes from k on store v + 1 (in the word's second byte).
    k, v = int(rng.integers(1, 32)), int(rng.integers(0, 2**16))
    ptx = ONE_WORD.replace(
        "VALUE",
        f"setp.ge.u32 %p1, %r1, {k};\n    selp.u32 %r5, 256, 0, %p1;\n    add.u32 %r3, %r5, {v};",
    ).replace(".reg .b64", ".reg .pred %p<2>;\n    .reg .b64")
    addr, _ = sim.buffer(np.zeros(32, dtype=np.uint32))
    with pytest.raises(SimError) as e:
        sim.launch(ptx, "one_word", (1, 1, 1), (32, 1, 1), [("u64", addr)])
    msg = str(e.value)
    assert f"PTX line {line_of(ptx, 'st.shared.u32')}" in msg
    lo, hi = sorted([0, k])
    assert f"block (0, 0, 0) thread ({lo}, 0, 0)" in msg
    assert f"this thread and thread ({hi}, 0, 0) write different values" in msg
    byte = ((v >> 8) & 0xFF, ((v + 256) >> 8) & 0xFF)
    assert f"({byte[0]:#04x} and {byte[1]:#04x}) to shared address 0x1 in one instruction" in msg
