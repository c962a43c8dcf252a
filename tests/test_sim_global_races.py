"""Global-memory races on sim: between blocks of one launch (nothing orders them), and writes of
different values by threads of one block with no barrier between (issue 18)."""

from __future__ import annotations

import numpy as np
import pytest

from cutile_py.ptx.ast import Instruction
from cutile_py.sim.context import SimError
from cutile_py.sim.global_races import GlobalRaces
from cutile_py.sim.races import RaceFault
from tests.support.sim_harness import Sim, line_of

#: permute_heads(dst, src, heads): row h of dst (256 f32, one per thread of block h) = row
#: (h + 1) % heads of src. In place (dst == src) block h writes the row block h - 1 reads.
PERMUTE_HEADS = """
.visible .entry permute_heads(.param .u64 dst, .param .u64 src, .param .u32 heads)
{
    .reg .b32 %r<8>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u32 %r1, [heads];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %tid.x;
    add.u32 %r4, %r2, 1;
    rem.u32 %r4, %r4, %r1;
    mad.lo.u32 %r5, %r4, 256, %r3;
    mul.wide.u32 %rd3, %r5, 4;
    add.u64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    mad.lo.u32 %r6, %r2, 256, %r3;
    mul.wide.u32 %rd5, %r6, 4;
    add.u64 %rd6, %rd1, %rd5;
    st.global.f32 [%rd6], %f1;
    ret;
}
"""


def test_out_of_place_head_permute_runs_clean(rng: np.random.Generator) -> None:
    heads = int(rng.integers(2, 9))
    x = rng.standard_normal((heads, 256)).astype(np.float32)
    sim = Sim()
    src, _ = sim.buffer(x)
    dst, out = sim.buffer(np.full_like(x, np.nan))
    sim.launch(PERMUTE_HEADS, "permute_heads", (heads, 1, 1), (256, 1, 1),
               [("u64", dst), ("u64", src), ("u32", heads)])  # fmt: skip
    np.testing.assert_array_equal(out, np.roll(x, -1, axis=0))


@pytest.mark.parametrize("batched", [True, False])
def test_in_place_head_permute_is_a_global_race(rng: np.random.Generator, batched: bool) -> None:
    """Blocks read rows that other blocks write. All blocks in one batch (lock-step: block 0's
    store meets block heads-1's load) or one block per batch (block 1's store meets block 0's
    load from an earlier batch): both are reported, naming both accesses."""
    heads = int(rng.integers(3, 9))  # with 2, block 1 first reads what block 0 wrote
    sim = Sim()
    addr, _ = sim.buffer(rng.standard_normal((heads, 256)).astype(np.float32))
    opts = {"max_batch_lanes": 256} if batched else {}
    with pytest.raises(SimError) as e:
        sim.launch(PERMUTE_HEADS, "permute_heads", (heads, 1, 1), (256, 1, 1),
                   [("u64", addr), ("u64", addr), ("u32", heads)], **opts)  # fmt: skip
    msg = str(e.value)
    st, ld = line_of(PERMUTE_HEADS, "st.global.f32"), line_of(PERMUTE_HEADS, "ld.global.f32")
    writer, reader = (1, 0) if batched else (0, heads - 1)
    row = writer * 256 * 4
    assert msg.startswith(
        f"kernel permute_heads, PTX line {st} `st.global.f32 [%rd6], %f1;`: "
        f"block ({writer}, 0, 0) thread (0, 0, 0): global-memory race: this thread writes "
        f"global address {addr + row:#x} (byte {row} of the {heads * 1024}-byte allocation at "
        f"{addr:#x}), which block ({reader}, 0, 0) thread (0, 0, 0) read at PTX line {ld} "
        "`ld.global.f32 %f1, [%rd4];`, from another block of the launch"
    ), msg
    # The detector is optional: without it the kernel runs.
    sim.launch(PERMUTE_HEADS, "permute_heads", (heads, 1, 1), (256, 1, 1),
               [("u64", addr), ("u64", addr), ("u32", heads)], race_check=False)  # fmt: skip


#: Every thread stores VALUE to out[tid / SHARE] of its block's row (32 words a block).
SHARED_WORD = """
.visible .entry shared_word(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    div.u32 %r3, %r1, SHARE;
    mad.lo.u32 %r4, %r2, 32, %r3;
    mul.wide.u32 %rd2, %r4, 4;
    add.u64 %rd3, %rd1, %rd2;
    VALUE
    st.global.u32 [%rd3], %r5;
    BARRIER
    st.global.u32 [%rd3], %r5;
    ret;
}
"""


def test_lanes_of_one_store_writing_one_value_are_no_race(rng: np.random.Generator) -> None:
    v = int(rng.integers(0, 2**32))
    ptx = (SHARED_WORD.replace("SHARE", "32").replace("VALUE", f"mov.u32 %r5, {v};")
           .replace("BARRIER", "bar.sync 0;"))  # fmt: skip
    sim = Sim()
    addr, out = sim.buffer(np.zeros(64, dtype=np.uint32))
    sim.launch(ptx, "shared_word", (2, 1, 1), (64, 1, 1), [("u64", addr)])
    np.testing.assert_array_equal(out.reshape(2, 32)[:, :2], np.full((2, 2), v))


def test_lanes_of_one_store_writing_different_values_race() -> None:
    ptx = (SHARED_WORD.replace("SHARE", "32").replace("VALUE", "mov.u32 %r5, %r1;")
           .replace("BARRIER", "bar.sync 0;"))  # fmt: skip
    sim = Sim()
    addr, _ = sim.buffer(np.zeros(64, dtype=np.uint32))
    with pytest.raises(SimError) as e:
        sim.launch(ptx, "shared_word", (2, 1, 1), (64, 1, 1), [("u64", addr)])
    assert (
        f"PTX line {line_of(ptx, 'st.global.u32')} `st.global.u32 [%rd3], %r5;`: block (0, 0, 0) "
        "thread (0, 0, 0): global-memory race: this thread and block (0, 0, 0) thread (1, 0, 0) "
        f"write different values to global address {addr:#x} (byte 0 of the 256-byte "
        f"allocation at {addr:#x}) in one instruction"
    ) in str(e.value)


@pytest.mark.parametrize("barrier", ["", "bar.sync 0;", "bar.warp.sync -1;"])
def test_threads_of_a_block_writing_one_word_need_a_barrier(barrier: str) -> None:
    """Lane t stores t to its word, then to the next lane's word: each word written by two
    threads in two instructions, a race unless a barrier is between (one warp: bar.warp.sync
    orders its lanes)."""
    ptx = SHARED_WORD.replace("SHARE", "1").replace("VALUE", "mov.u32 %r5, %r1;")
    # The second store goes to the next thread's word.
    ptx = ptx.replace("BARRIER\n    st.global.u32 [%rd3]", "BARRIER\n    st.global.u32 [%rd3+4]")
    ptx = ptx.replace("BARRIER", barrier)
    sim = Sim()
    addr, out = sim.buffer(np.zeros(80, dtype=np.uint32))
    if barrier:
        sim.launch(ptx, "shared_word", (1, 1, 1), (32, 1, 1), [("u64", addr)])
        np.testing.assert_array_equal(out[:33], np.r_[0, np.arange(32)])
        return
    with pytest.raises(SimError) as e:
        sim.launch(ptx, "shared_word", (1, 1, 1), (32, 1, 1), [("u64", addr)])
    msg = str(e.value)
    assert f"PTX line {line_of(ptx, '[%rd3+4]')}" in msg
    assert (
        f"block (0, 0, 0) thread (0, 0, 0): global-memory race: this thread writes global "
        f"address {addr + 4:#x} (byte 4 of the 320-byte allocation at {addr:#x}), which block "
        f"(0, 0, 0) thread (1, 0, 0) wrote at PTX line {line_of(ptx, 'st.global.u32 [%rd3], %r5')} "
        "`st.global.u32 [%rd3], %r5;`, with no bar.sync between the two accesses"
    ) in msg


def test_blocks_reading_one_input_are_no_race(rng: np.random.Generator) -> None:
    """Every block reads all of src (a broadcast) and writes its own row."""
    heads = int(rng.integers(2, 6))
    x = rng.standard_normal((1, 256)).astype(np.float32)
    sim = Sim()
    src, _ = sim.buffer(x)
    dst, out = sim.buffer(np.zeros((heads, 256), dtype=np.float32))
    # heads=1 makes every block read row 0.
    sim.launch(PERMUTE_HEADS, "permute_heads", (heads, 1, 1), (256, 1, 1),
               [("u64", dst), ("u64", src), ("u32", 1)])  # fmt: skip
    np.testing.assert_array_equal(out, np.repeat(x, heads, axis=0))


def test_a_block_reading_what_an_earlier_batch_wrote_is_a_race(rng: np.random.Generator) -> None:
    """Two heads, one block per batch: block 1 reads row 0, which block 0 (an earlier batch)
    wrote: nothing orders blocks, whichever order they run in."""
    sim = Sim()
    addr, _ = sim.buffer(rng.standard_normal((2, 256)).astype(np.float32))
    with pytest.raises(SimError) as e:
        sim.launch(PERMUTE_HEADS, "permute_heads", (2, 1, 1), (256, 1, 1),
                   [("u64", addr), ("u64", addr), ("u32", 2)], max_batch_lanes=256)  # fmt: skip
    msg = str(e.value)
    ld, st = line_of(PERMUTE_HEADS, "ld.global.f32"), line_of(PERMUTE_HEADS, "st.global.f32")
    assert msg.startswith(
        f"kernel permute_heads, PTX line {ld} `ld.global.f32 %f1, [%rd4];`: block (1, 0, 0) "
        f"thread (0, 0, 0): global-memory race: this thread reads global address {addr:#x} "
        f"(byte 0 of the 2048-byte allocation at {addr:#x}), which block (0, 0, 0) thread "
        f"(0, 0, 0) wrote at PTX line {st} `st.global.f32 [%rd6], %f1;`, from another block"
    ), msg


def test_a_warp_barrier_does_not_order_two_warps() -> None:
    """As above over 64 threads: thread 31's second store hits thread 32's word, in the other
    warp, which bar.warp.sync does not reach."""
    ptx = SHARED_WORD.replace("SHARE", "1").replace("VALUE", "mov.u32 %r5, %r1;")
    ptx = ptx.replace("BARRIER\n    st.global.u32 [%rd3]", "BARRIER\n    st.global.u32 [%rd3+4]")
    ptx = ptx.replace("BARRIER", "bar.warp.sync -1;")
    sim = Sim()
    addr, _ = sim.buffer(np.zeros(80, dtype=np.uint32))
    with pytest.raises(SimError) as e:
        sim.launch(ptx, "shared_word", (1, 1, 1), (64, 1, 1), [("u64", addr)])
    assert (
        f"block (0, 0, 0) thread (31, 0, 0): global-memory race: this thread writes global "
        f"address {addr + 128:#x} (byte 128 of the 320-byte allocation at {addr:#x}), which "
        "block (0, 0, 0) thread (32, 0, 0) wrote"
    ) in str(e.value)


def test_thread_numbers_past_2_31_keep_their_block() -> None:
    """A grid of 2**22 blocks of 1024 threads numbers threads past int32; the last block's
    store is reported as its own, not a wrapped one."""
    grid, block = (2**22, 1, 1), (1024, 1, 1)
    sim = Sim()
    addr, _ = sim.buffer(np.zeros(4, dtype=np.uint32))
    races = GlobalRaces(sim.memory, grid, block)
    last = 2**22 - 1
    ins = Instruction(7, "st.global.u32 [%rd1], %r1;", "st", ("global", "u32"), ())
    for b in (0, last):
        races.start_batch(np.array([b]))
        lanes, addrs = np.array([0]), np.array([addr], dtype=np.uint64)
        if b == 0:
            races.access(ins, lanes, addrs, 4, True, np.zeros((1, 4), dtype=np.uint8))
            continue
        with pytest.raises(RaceFault, match=r"which block \(0, 0, 0\) thread \(0, 0, 0\) wrote"):
            races.access(ins, lanes, addrs, 4, True, np.ones((1, 4), dtype=np.uint8))
        assert int(races.who[0]) == last * 1024


@pytest.mark.parametrize("span", [12, 6, 3])
def test_an_access_of_a_span_that_is_no_power_of_two(span: int) -> None:
    """A cp.async with src-size 12 reads 12 bytes: the shadow's granule is a power of two
    dividing it (the access used to index the shadow past its end, or miss what it touched
    when the allocation's start happened to be a multiple of the span)."""
    sim = Sim()
    raw = np.zeros(48 * 12 + 768, dtype=np.uint8)
    skip = -raw.ctypes.data % 768  # an allocation starting at a multiple of 3 * 256
    base = sim.memory.register(raw[skip : skip + 48 * 12])
    sim.keep.append(raw)
    assert base % span == 0
    races = GlobalRaces(sim.memory, (2, 1, 1), (32, 1, 1))
    ins = Instruction(3, "cp.async.cg.shared.global [%r1], [%rd1], 16, %r2;", "cp", (), ())
    load = Instruction(5, "ld.global.u8 %r3, [%rd2];", "ld", ("global", "u8"), ())
    store = Instruction(9, "st.global.u8 [%rd2], %r4;", "st", ("global", "u8"), ())
    # Block 0 reads bytes [48 * span, 49 * span) with one access; block 1 writes its last one.
    races.start_batch(np.array([0]))
    lanes = np.array([0])
    races.access(ins, lanes, np.array([base + 48 * span - span], dtype=np.uint64), span, False)
    races.access(load, lanes, np.array([base], dtype=np.uint64), 1, False)
    races.start_batch(np.array([1]))
    last = np.array([base + 48 * span - 1], dtype=np.uint64)
    with pytest.raises(RaceFault, match="read"):
        races.access(store, lanes, last, 1, True, np.ones((1, 1), dtype=np.uint8))
