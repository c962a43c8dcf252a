"""The simulator's memory instructions on hand-written PTX: cp.async groups, atomics, ldmatrix,
generic addressing, local and constant memory (the latter through nvcc's PTX)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cutile_py.ptx.parser import parse
from cutile_py.sim.context import SimError
from cutile_py.sim.executor import run
from cutile_py.sim.program import Program
from tests.support.sim_harness import Sim

DATA = Path(__file__).parent / "data" / "ptx"

CP_ASYNC = """
.visible .entry cp(.param .u64 src, .param .u64 out, .param .u32 partial)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    .shared .align 16 .b8 stage[1024];
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [out];
    ld.param.u32 %r15, [partial];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, stage;
    shl.b32 %r3, %r1, 4;
    add.u32 %r4, %r2, %r3;            // this thread's 16 bytes of stage[0:512]
    add.u32 %r5, %r4, 512;            // and of stage[512:1024]
    mov.u32 %r6, 0xDEADBEEF;
    st.shared.v4.u32 [%r4], {%r6, %r6, %r6, %r6};
    st.shared.v4.u32 [%r5], {%r6, %r6, %r6, %r6};
    mul.wide.u32 %rd3, %r3, 1;
    add.u64 %rd4, %rd1, %rd3;
    cp.async.ca.shared.global [%r4], [%rd4], 16;
    cp.async.commit_group;
    cp.async.cg.shared.global [%r5], [%rd4+512], 16, %r15;
    cp.async.commit_group;
    ld.shared.u32 %r7, [%r4];         // no wait yet: stale
    cp.async.wait_group 1;            // the first group is complete, the second may not be
    ld.shared.u32 %r8, [%r4];
    ld.shared.u32 %r9, [%r5];
    cp.async.wait_all;
    ld.shared.v4.u32 {%r10, %r11, %r12, %r13}, [%r5];
    mul.wide.u32 %rd5, %r1, 32;
    add.u64 %rd6, %rd2, %rd5;
    st.global.v4.u32 [%rd6], {%r7, %r8, %r9, %r10};
    st.global.v4.u32 [%rd6+16], {%r10, %r11, %r12, %r13};
    ret;
}
"""


@pytest.mark.parametrize("partial", [16, 4, 0])
def test_cp_async_is_deferred_until_its_group_is_waited_for(
    rng: np.random.Generator, partial: int
) -> None:
    sim = Sim()
    src = rng.integers(0, 2**32, 256, dtype=np.uint32)
    sa, _ = sim.buffer(src)
    oa, out = sim.buffer(np.zeros((32, 8), dtype=np.uint32))
    sim.launch(CP_ASYNC, "cp", (1, 1, 1), (32, 1, 1),
               [("u64", sa), ("u64", oa), ("u32", partial)])  # fmt: skip
    first = src[:128].reshape(32, 4)
    second = src[128:].reshape(32, 4).copy()
    second[:, partial // 4 :] = 0  # src-size < 16 zero-fills the rest
    assert (out[:, 0] == 0xDEADBEEF).all()  # read before any wait: the stale value
    np.testing.assert_array_equal(out[:, 1], first[:, 0])  # group 0 done by wait_group 1
    assert (out[:, 2] == 0xDEADBEEF).all()  # group 1 still pending
    np.testing.assert_array_equal(out[:, 4:], second)  # everything done after wait_all
    np.testing.assert_array_equal(out[:, 3], second[:, 0])


def test_cp_async_source_is_checked_only_for_bytes_it_reads() -> None:
    """src-size 0 reads nothing: a masked-off edge copy may point past the end."""
    sim = Sim()
    sa, _ = sim.buffer(np.zeros(16, dtype=np.uint32))
    oa, out = sim.buffer(np.ones((32, 8), dtype=np.uint32))
    ptx = CP_ASYNC.replace("[%rd4+512], 16, %r15", "[%rd4+4096], 16, %r15").replace(
        "cp.async.ca.shared.global [%r4], [%rd4], 16;", ""
    )
    sim.launch(ptx, "cp", (1, 1, 1), (32, 1, 1), [("u64", sa), ("u64", oa), ("u32", 0)])
    assert (out[:, 4:] == 0).all()
    with pytest.raises(Exception, match="out-of-bounds load"):
        sim.launch(ptx, "cp", (1, 1, 1), (32, 1, 1), [("u64", sa), ("u64", oa), ("u32", 8)])


ATOM = """
.visible .entry atom(.param .u64 cells, .param .u64 olds, .param .u64 vals, .param .u32 slots)
{
    .reg .b32 %r<10>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [cells];
    ld.param.u64 %rd2, [olds];
    ld.param.u64 %rd3, [vals];
    ld.param.u32 %r9, [slots];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.u32 %r4, %r2, %r3, %r1;
    mul.wide.u32 %rd4, %r4, 4;
    add.u64 %rd5, %rd3, %rd4;
    ld.global.u32 %r5, [%rd5];
    sub.u32 %r8, %r9, 1;
    and.b32 %r6, %r4, %r8;
    mul.wide.u32 %rd6, %r6, 4;
    add.u64 %rd7, %rd1, %rd6;
    OP
    add.u64 %rd8, %rd2, %rd4;
    st.global.u32 [%rd8], %r7;
    ret;
}
"""

CASES = {
    "add": ("atom.global.add.u32 %r7, [%rd7], %r5;", np.uint32, lambda m, v: m + v),
    "max": ("atom.global.max.s32 %r7, [%rd7], %r5;", np.int32, max),
    "min": ("atom.min.s32 %r7, [%rd7], %r5;", np.int32, min),  # generic address
    "xor": ("atom.global.xor.b32 %r7, [%rd7], %r5;", np.uint32, lambda m, v: m ^ v),
    "exch": ("atom.global.exch.b32 %r7, [%rd7], %r5;", np.uint32, lambda m, v: v),
    "and": ("atom.global.and.b32 %r7, [%rd7], %r5;", np.uint32, lambda m, v: m & v),
    "or": ("atom.global.or.b32 %r7, [%rd7], %r5;", np.uint32, lambda m, v: m | v),
    "dec": (
        "atom.global.dec.u32 %r7, [%rd7], %r5;",
        np.uint32,
        lambda m, v: v if (m == 0 or m > v) else m - 1,
    ),
    "inc": (
        "atom.global.inc.u32 %r7, [%rd7], %r5;",
        np.uint32,
        lambda m, v: 0 if m >= v else m + 1,
    ),
    "cas": ("atom.global.cas.b32 %r7, [%rd7], %r5, %r4;", np.uint32, None),
    "red": ("red.global.add.f32 [%rd7], %r5;\n    mov.u32 %r7, 0;", np.float32, lambda m, v: m + v),
}


@pytest.mark.parametrize("op", list(CASES))
@pytest.mark.parametrize("slots", [1, 4, 512])
def test_atomics_serialize_lanes_on_one_address(
    rng: np.random.Generator, op: str, slots: int
) -> None:
    text, dtype, fn = CASES[op]
    sim = Sim()
    n = 1024
    if dtype == np.float32:
        vals = rng.standard_normal(n).astype(np.float32)
    elif op == "cas":
        vals = rng.integers(0, 3, n).astype(np.uint32)
    else:
        vals = rng.integers(-50, 50, n).astype(dtype)
    cells0 = rng.integers(0, 3, slots).astype(dtype)
    ca, cells = sim.buffer(cells0)
    oa, olds = sim.buffer(np.zeros(n, dtype=np.uint32))
    va, _ = sim.buffer(vals.view(np.uint32))
    sim.launch(ATOM.replace("OP", text), "atom", (4, 1, 1), (256, 1, 1),
               [("u64", ca), ("u64", oa), ("u64", va), ("u32", slots)])  # fmt: skip
    # The executor's documented order: lanes one after another in lane (= global id) order.
    mem = [dtype(c) for c in cells0]
    want_old = []
    with np.errstate(over="ignore"):
        for i in range(n):
            s = i % slots
            want_old.append(mem[s])
            if op == "cas":
                mem[s] = np.uint32(i) if mem[s] == vals[i] else mem[s]
            else:
                mem[s] = dtype(fn(mem[s], vals[i]))
    np.testing.assert_array_equal(cells, np.array(mem, dtype=dtype))
    if op != "red":
        np.testing.assert_array_equal(olds.view(dtype), np.array(want_old, dtype=dtype))


def test_atomic_add_from_64k_lanes_on_one_counter() -> None:
    sim = Sim()
    n = 1 << 16
    ca, cells = sim.buffer(np.zeros(1, dtype=np.uint32))
    oa, olds = sim.buffer(np.zeros(n, dtype=np.uint32))
    va, _ = sim.buffer(np.ones(n, dtype=np.uint32))
    sim.launch(ATOM.replace("OP", CASES["add"][0]), "atom", (256, 1, 1), (256, 1, 1),
               [("u64", ca), ("u64", oa), ("u64", va), ("u32", 1)])  # fmt: skip
    assert cells[0] == n
    np.testing.assert_array_equal(np.sort(olds), np.arange(n))


SHARED_ATOM = """
.visible .entry hist(.param .u64 src, .param .u64 out)
{
    .reg .b32 %r<10>;
    .reg .b64 %rd<6>;
    .reg .pred %p1;
    .shared .align 4 .b8 bins[64];
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, bins;
    setp.ge.u32 %p1, %r1, 16;
    shl.b32 %r3, %r1, 2;
    add.u32 %r4, %r2, %r3;
    @!%p1 st.shared.u32 [%r4], 0;
    bar.sync 0;
    mov.u32 %r5, %ctaid.x;
    mad.lo.u32 %r6, %r5, 128, %r1;
    mul.wide.u32 %rd3, %r6, 4;
    add.u64 %rd4, %rd1, %rd3;
    ld.global.u32 %r7, [%rd4];
    and.b32 %r7, %r7, 15;
    shl.b32 %r7, %r7, 2;
    add.u32 %r8, %r2, %r7;
    red.shared.add.u32 [%r8], 1;
    bar.sync 0;
    @%p1 ret;
    ld.shared.u32 %r9, [%r4];
    mul.wide.u32 %rd5, %r1, 4;
    add.u64 %rd5, %rd2, %rd5;
    atom.global.add.u32 %r0, [%rd5], %r9;
    ret;
}
"""


def test_shared_memory_atomics_build_a_histogram(rng: np.random.Generator) -> None:
    sim = Sim()
    x = rng.integers(0, 2**31, 6 * 128).astype(np.uint32)
    sa, _ = sim.buffer(x)
    oa, out = sim.buffer(np.zeros(16, dtype=np.uint32))
    sim.launch(SHARED_ATOM, "hist", (6, 1, 1), (128, 1, 1), [("u64", sa), ("u64", oa)])
    np.testing.assert_array_equal(out, np.bincount(x & 15, minlength=16))


LDMATRIX = """
.visible .entry ldm(.param .u64 src, .param .u64 rows, .param .u64 out)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<10>;
    .shared .align 16 .b8 tile[1024];
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [rows];
    ld.param.u64 %rd3, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, tile;
    shl.b32 %r3, %r1, 5;              // each lane copies 32 bytes of the 1 KB tile
    add.u32 %r4, %r2, %r3;
    mul.wide.u32 %rd4, %r3, 1;
    add.u64 %rd5, %rd1, %rd4;
    ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd5];
    st.shared.v4.u32 [%r4], {%r5, %r6, %r7, %r8};
    ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd5+16];
    st.shared.v4.u32 [%r4+16], {%r5, %r6, %r7, %r8};
    bar.sync 0;
    mul.wide.u32 %rd6, %r1, 4;
    add.u64 %rd7, %rd2, %rd6;
    ld.global.u32 %r9, [%rd7];        // this lane's row (16-byte units), any order
    shl.b32 %r9, %r9, 4;
    add.u32 %r9, %r2, %r9;
    ldmatrix.sync.aligned.m8n8.XN.shared.b16 {REGS}, [%r9];
    mul.wide.u32 %rd8, %r1, 16;
    add.u64 %rd9, %rd3, %rd8;
    st.global.v4.u32 [%rd9], {OUTS};
    ret;
}
"""


def ldmatrix_model(tile: np.ndarray, rows: np.ndarray, num: int, trans: bool) -> np.ndarray:
    """NOTES-PTX.md: lane l gets, in register i, row l/4, columns 2(l%4), 2(l%4)+1 of matrix i
    (matrix i's rows are addressed by lanes 8i..8i+7); `.trans` delivers the transpose."""
    out = np.zeros((32, 4), dtype=np.uint32)
    for i in range(num):
        m = tile.reshape(-1, 8)[rows[8 * i : 8 * i + 8]]
        if trans:
            m = m.T
        for lane in range(32):
            r, c = lane // 4, 2 * (lane % 4)
            out[lane, i] = int(m[r, c]) | (int(m[r, c + 1]) << 16)
    return out


@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_against_the_lane_row_model(
    rng: np.random.Generator, num: int, trans: bool
) -> None:
    sim = Sim()
    tile = rng.integers(0, 2**16, 512).astype(np.uint16)
    rows = rng.permutation(64)[:32].astype(np.uint32)
    rows[8 * num :] = 1 << 20  # lanes that give no row address may hold anything
    regs = ", ".join(f"%r1{i}" for i in range(num))
    outs = ", ".join([f"%r1{i}" for i in range(num)] + ["%r0"] * (4 - num))
    ptx = LDMATRIX.replace("XN", f"x{num}" + (".trans" if trans else ""))
    ptx = ptx.replace("{REGS}", "{" + regs + "}").replace("{OUTS}", "{" + outs + "}")
    ta, _ = sim.buffer(tile)
    ra, _ = sim.buffer(rows)
    oa, out = sim.buffer(np.zeros((32, 4), dtype=np.uint32))
    sim.launch(ptx, "ldm", (1, 1, 1), (32, 1, 1), [("u64", ta), ("u64", ra), ("u64", oa)])
    want = ldmatrix_model(tile, rows, num, trans)
    np.testing.assert_array_equal(out[:, :num], want[:, :num])


GENERIC = """
.visible .entry gen(.param .u64 out)
{
    .reg .b32 %r<6>;
    .reg .b64 %rd<8>;
    .shared .align 8 .b8 sm[256];
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %tid.x;
    mov.u64 %rd2, sm;
    cvta.shared.u64 %rd3, %rd2;       // a generic pointer into shared memory
    mul.wide.u32 %rd4, %r1, 4;
    add.u64 %rd5, %rd3, %rd4;
    mul.lo.u32 %r2, %r1, %r1;
    st.u32 [%rd5], %r2;               // generic store lands in shared memory
    bar.sync 0;
    ld.shared.u32 %r3, [%rd2+8];
    cvta.to.shared.u64 %rd6, %rd5;
    ld.shared.u32 %r4, [%rd6];
    add.u64 %rd7, %rd1, %rd4;
    add.u32 %r5, %r3, %r4;
    st.u32 [%rd7], %r5;               // generic store lands in global memory
    ret;
}
"""


def test_generic_addresses_reach_shared_and_global_memory() -> None:
    sim = Sim()
    oa, out = sim.buffer(np.zeros(64, dtype=np.uint32))
    sim.launch(GENERIC, "gen", (1, 1, 1), (64, 1, 1), [("u64", oa)])
    t = np.arange(64)
    np.testing.assert_array_equal(out, t * t + 4)


def test_nvcc_local_const_inline_asm_and_global_atomics(rng: np.random.Generator) -> None:
    sim = Sim()
    prog = Program(parse((DATA / "parser_sample.ptx").read_text()), "hash_and_count",
                   sim.memory)  # fmt: skip
    n = 3000
    x = rng.integers(0, 2**32, n, dtype=np.uint32)
    xa, _ = sim.buffer(x)
    ha, h = sim.buffer(np.zeros(n, dtype=np.uint32))
    pa, poly = sim.buffer(np.zeros(n, dtype=np.float32))
    run(prog, sim.memory, (-(-n // 256), 1, 1), (256, 1, 1), 0,
        [("u64", xa), ("u64", ha), ("u64", pa), ("u32", n)])  # fmt: skip
    i = np.arange(n, dtype=np.uint32)
    with np.errstate(over="ignore"):
        h1 = (x * np.uint32(2654435761)) ^ i
        want = (h1 * np.uint32(2654435761)) ^ np.uint32(7)
    np.testing.assert_array_equal(h, want)
    coeffs = np.array([1.0, -2.5, 0.25, 3.0], dtype=np.float32)
    xs = (want & 255).astype(np.float32) * np.float32(1 / 256)
    local = coeffs[None, :] * xs[:, None]
    acc = np.zeros(n, dtype=np.float32)
    for k in range(4):
        acc = acc + local[np.arange(n), (want + k) & 3]
    np.testing.assert_array_equal(poly, acc)
    counter = sim.memory.allocation(prog.global_addresses["counter"]).data.view(np.uint32)
    assert counter[0] == np.count_nonzero(want & 1)


DYNAMIC = """
.extern .shared .align 16 .b8 dyn[];
.visible .entry dynamic(.param .u64 out, .param .u32 stride)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .shared .align 4 .b8 fixed[12];
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r7, [stride];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, dyn;
    mul.lo.u32 %r3, %r1, %r7;
    add.u32 %r4, %r2, %r3;
    st.shared.u32 [%r4], %r1;
    bar.sync 0;
    ld.shared.u32 %r5, [%r4];
    mov.u32 %r6, %dynamic_smem_size;
    mul.wide.u32 %rd2, %r1, 16;
    add.u64 %rd3, %rd1, %rd2;
    st.global.v4.u32 [%rd3], {%r5, %r6, %r2, %r7};
    exit;
}
"""


def test_dynamic_shared_memory_follows_the_static_variables() -> None:
    sim = Sim()
    oa, out = sim.buffer(np.zeros((64, 4), dtype=np.uint32))
    sim.launch(DYNAMIC, "dynamic", (2, 1, 1), (64, 1, 1), [("u64", oa), ("u32", 4)], shared=256)
    np.testing.assert_array_equal(out[:, 0], np.arange(64))
    assert (out[:, 1] == 256).all() and (out[:, 2] == 16).all()  # after fixed[12], 16-aligned
    with pytest.raises(Exception, match=r"out-of-bounds shared store .* has 272 bytes") as e:
        sim.launch(DYNAMIC, "dynamic", (2, 1, 1), (64, 1, 1), [("u64", oa), ("u32", 8)],
                   shared=256)  # fmt: skip
    assert "thread (32, 0, 0)" in str(e.value)  # the first thread past the 256 dynamic bytes


def test_reading_a_cp_async_destination_before_the_wait_is_a_race() -> None:
    """Another thread reads the copy's destination after a barrier but before the wait."""
    ptx = CP_ASYNC.replace(
        "    ld.shared.u32 %r7, [%r4];         // no wait yet: stale\n",
        "    bar.sync 0;\n    xor.b32 %r14, %r4, 16;\n    ld.shared.u32 %r7, [%r14];\n",
    )
    sim = Sim()
    sa, _ = sim.buffer(np.zeros(256, dtype=np.uint32))
    oa, _ = sim.buffer(np.zeros((32, 8), dtype=np.uint32))
    # Reported at the read (not only when the copy lands on it), naming the copying thread.
    with pytest.raises(
        Exception, match=r"race: this thread reads .*cp.async of thread \(1, 0, 0\)"
    ):
        sim.launch(ptx, "cp", (1, 1, 1), (32, 1, 1), [("u64", sa), ("u64", oa), ("u32", 16)])


def test_writing_a_cp_async_destination_across_barriers_is_a_race() -> None:
    """Another thread overwrites the copy's destination between two barriers, well before
    the issuing thread waits: the copy may land before or after that write on hardware."""
    ptx = CP_ASYNC.replace(
        "    ld.shared.u32 %r7, [%r4];         // no wait yet: stale\n",
        "    bar.sync 0;\n    xor.b32 %r14, %r4, 16;\n    st.shared.u32 [%r14], %r6;\n"
        "    bar.sync 0;\n    mov.u32 %r7, 0;\n",
    )
    sim = Sim()
    sa, _ = sim.buffer(np.zeros(256, dtype=np.uint32))
    oa, _ = sim.buffer(np.zeros((32, 8), dtype=np.uint32))
    with pytest.raises(
        Exception, match=r"race: this thread writes .*cp.async of thread \(1, 0, 0\) has not landed"
    ):
        sim.launch(ptx, "cp", (1, 1, 1), (32, 1, 1), [("u64", sa), ("u64", oa), ("u32", 16)])


def test_another_thread_reading_a_landed_copy_without_a_barrier_is_a_race() -> None:
    """A barrier between issue and wait clears the history, but the copy lands at the wait:
    another thread reading it after the wait with no barrier between races with the landing
    (the copy's writer is the issuing thread again from the landing on)."""
    ptx = CP_ASYNC.replace(
        "    ld.shared.u32 %r7, [%r4];         // no wait yet: stale\n",
        "    bar.sync 0;\n    mov.u32 %r7, 0;\n",
    ).replace(
        "    ld.shared.u32 %r8, [%r4];\n",
        "    xor.b32 %r14, %r4, 16;\n    ld.shared.u32 %r8, [%r14];\n",
    )
    sim = Sim()
    sa, _ = sim.buffer(np.zeros(256, dtype=np.uint32))
    oa, _ = sim.buffer(np.zeros((32, 8), dtype=np.uint32))
    with pytest.raises(Exception, match=r"race: this thread reads shared memory that thread"):
        sim.launch(ptx, "cp", (1, 1, 1), (32, 1, 1), [("u64", sa), ("u64", oa), ("u32", 16)])
    xor = "    xor.b32 %r14, %r4, 16;\n"
    fine = ptx.replace(xor, "    bar.sync 0;\n" + xor)
    sim.launch(fine, "cp", (1, 1, 1), (32, 1, 1), [("u64", sa), ("u64", oa), ("u32", 16)])


@pytest.mark.parametrize("limit", [32, 40])
def test_ldmatrix_under_a_guard_runs_whole_warps_only(rng: np.random.Generator, limit: int) -> None:
    """Two warps, the ldmatrix guarded by `tid < limit`: warp 0 alone gets its fragments
    (warp 1's registers keep the zeros they were set to); part of warp 1 as well is an
    error."""
    ptx = (
        LDMATRIX.replace("XN", "x4")
        .replace("{REGS}", "{%r10, %r11, %r12, %r13}")
        .replace("{OUTS}", "{%r10, %r11, %r12, %r13}")
        .replace("tile[1024]", "tile[2048]")
        .replace(".reg .b32 %r<16>;", ".reg .b32 %r<16>;\n    .reg .pred %p1;")
        .replace(
            "    ldmatrix",
            "    mov.b32 %r10, 0;\n    mov.b32 %r11, 0;\n    mov.b32 %r12, 0;\n"
            f"    mov.b32 %r13, 0;\n    setp.lt.u32 %p1, %r1, {limit};\n    @%p1 ldmatrix",
        )
    )
    sim = Sim()
    tile = rng.integers(0, 2**16, 1024).astype(np.uint16)
    rows = rng.permutation(128)[:64].astype(np.uint32)
    ta, _ = sim.buffer(tile)
    ra, _ = sim.buffer(rows)
    oa, out = sim.buffer(np.zeros((64, 4), dtype=np.uint32))
    params = [("u64", ta), ("u64", ra), ("u64", oa)]
    if limit != 32:
        with pytest.raises(SimError, match="executed by only part of a warp"):
            sim.launch(ptx, "ldm", (1, 1, 1), (64, 1, 1), params)
        return
    sim.launch(ptx, "ldm", (1, 1, 1), (64, 1, 1), params)
    np.testing.assert_array_equal(out[:32], ldmatrix_model(tile, rows[:32], 4, False))
    np.testing.assert_array_equal(out[32:], np.zeros((32, 4)))
