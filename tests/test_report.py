"""`kernel.report(...)` and `ct.PerformanceWarning`: ptxas's resources, occupancy, SASS, and the
simulator's memory counters (bytes per argument, coalescing, bank conflicts)."""

from __future__ import annotations

import math
import warnings
from typing import TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py.host.report import occupancy
from cutile_py.ptx.ast import Instruction
from cutile_py.ptx.target import Target, sm_limits
from cutile_py.runtime import nvjitlink, sass
from cutile_py.runtime.backend import ParamValue
from cutile_py.runtime.nvjitlink import nvjitlink_available
from cutile_py.runtime.sim_backend import SimBackend
from cutile_py.sim.counters import MemoryCounters
from tests.support.recording_nvjitlink import CACHED_LOG, RecordingNvJitLink

needs_nvjitlink = pytest.mark.skipif(
    not nvjitlink_available(), reason="the nvJitLink library cannot be loaded"
)

B = TypeVar("B")
R = TypeVar("R")
C = TypeVar("C")


@ct.kernel
def add(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) + ct.load_tile_like(y, z))


@ct.kernel
def column_copy(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """With (rows, 1) tiles, neighbouring threads touch elements a whole row apart."""
    z.store(ct.load_tile_like(x, z) * 2.0)


@ct.kernel
def held_across_loop(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn], n: int) -> None:
    """A 256 x 256 f32 tile and the next one live across the loop: 512 values per thread."""
    acc = ct.load_tile_like(x, z)
    for _ in range(n):
        acc = acc * acc + ct.load_tile_like(x, z)
    z.store(acc)


# -- an element-wise kernel: sane numbers, nothing launched -----------------------------------


@needs_nvjitlink
def test_add_report_numbers(rng: np.random.Generator) -> None:
    n = 1024 * int(rng.integers(2, 9))
    x = ct.from_numpy(rng.standard_normal(n).astype(np.float32))
    y = ct.from_numpy(rng.standard_normal(n).astype(np.float32))
    z = ct.empty(n).partition(1024)
    r = add.report(z, x, y, target="sm_90")
    assert (r.kernel, r.target, r.grid, r.elements) == ("add", "sm_90", (n // 1024,), n)
    assert 8 <= r.registers <= 64 if r.registers is not None else False
    assert (r.spill_store_bytes, r.spill_load_bytes) == (0, 0)
    assert (r.static_shared_bytes, r.dynamic_shared_bytes) == (0, 0)
    # Each input read once, the output written once, to the byte.
    assert [(a.name, a.read, a.written) for a in r.arguments] == [
        ("z", 0, 4 * n),
        ("x", 4 * n, 0),
        ("y", 4 * n, 0),
    ]
    assert r.bytes_moved == r.bytes_ideal == 12 * n and r.bytes_ratio == 1.0
    # 16-byte accesses: a warp request is 512 contiguous bytes, 16 sectors, none wasted.
    assert r.global_requests == 3 * n // (4 * 32)
    assert r.uncoalesced_requests == 0 and r.uncoalesced_per_instruction == 0.0
    assert all(a.value == 1.0 for a in r.global_accesses)
    assert r.shared_accesses == () and r.bank_conflict_ways == 1.0
    # 256 threads, few registers: 8 blocks fill sm_90's 64 warps.
    assert r.occupancy is not None
    assert (r.occupancy.blocks_per_sm, r.occupancy.warps_per_sm) == (8, 64)
    assert 8.0 < r.ptx_per_element < 30.0
    if r.sass_per_element is None:
        assert "nvdisasm" in (r.why("sass_instructions") or "")
    else:
        assert r.sass_instructions is not None and 20 <= r.sass_instructions <= 80
        assert 5.0 <= r.sass_per_element <= 16.0
    text = str(r)
    for words in ("registers / thread", "occupancy", "1.00x the ideal", "0 of"):
        assert words in text, text
    # Nothing ran on the active backend: the output still holds ct.empty's 0xFF bytes.
    assert np.isnan(z.unpartition().to_numpy()).all()


@needs_nvjitlink
def test_report_from_specs_matches_tensors(rng: np.random.Generator) -> None:
    n = 1024 * int(rng.integers(2, 6)) + int(rng.integers(1, 1024))  # a ragged last tile
    spec = (ct.PartitionSpec((n,), (1024,)), ct.TensorSpec((n,)), ct.TensorSpec((n,)))
    r = add.report(*spec, target=80)
    x, y = ct.randn(n), ct.randn(n)
    t = add.report(ct.empty(n).partition(1024), x, y, target=80)
    assert r.bytes_moved == t.bytes_moved == r.bytes_ideal == 12 * n
    assert r.ptx_instructions == t.ptx_instructions and r.registers == t.registers


@needs_nvjitlink
def test_large_grid_is_sampled_and_scaled() -> None:
    tiles = 3000  # far past the blocks a report simulates
    n = 1024 * tiles
    r = add.report(ct.PartitionSpec((n,), (1024,)), ct.TensorSpec((n,)), ct.TensorSpec((n,)))
    assert (r.blocks_run, r.blocks_total) == (64, tiles)
    assert r.bytes_moved == r.bytes_ideal == 12 * n
    assert "sim ran 64 of 3000 blocks" in str(r)


# -- coalescing and bank conflicts, measured on sim ------------------------------------------


def test_strided_global_access_is_counted(rng: np.random.Generator) -> None:
    rows, cols = 64, int(rng.choice([32, 64, 128]))
    x = ct.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32))
    z = ct.empty((rows, cols)).partition((rows, 1))
    r = column_copy.report(z, x, target=80)
    # Every byte still moves once, but each lane of a request sits in its own sector.
    assert r.bytes_moved == r.bytes_ideal == 2 * 4 * rows * cols
    assert r.uncoalesced_requests == r.global_requests > 0
    assert r.uncoalesced_per_instruction == 1.0
    assert all(a.value > 1.0 for a in r.global_accesses)
    assert "x the sectors needed" in str(r)
    # The same kernel over row tiles is coalesced.
    z2 = ct.empty((rows, cols)).partition((1, cols))
    assert column_copy.report(z2, x, target=80).uncoalesced_requests == 0


PROBE = """
.version 7.8
.target sm_80
.address_size 64
.visible .entry probe(.param .u64 src, .param .u64 dst, .param .u32 stride)
{
  .reg .b32 %r<8>;
  .reg .f32 %f<3>;
  .reg .b64 %rd<7>;
  .shared .align 4 .b8 buf[4096];
  ld.param.u64 %rd1, [src];
  ld.param.u64 %rd2, [dst];
  ld.param.u32 %r1, [stride];
  mov.u32 %r2, %tid.x;
  mul.lo.u32 %r3, %r2, %r1;
  shl.b32 %r4, %r3, 2;
  cvt.u64.u32 %rd3, %r4;
  add.u64 %rd4, %rd1, %rd3;
  ld.global.f32 %f1, [%rd4];
  and.b32 %r5, %r4, 4095;
  mov.u32 %r6, buf;
  add.u32 %r6, %r6, %r5;
  st.shared.f32 [%r6], %f1;
  bar.sync 0;
  ld.shared.f32 %f2, [%r6];
  shl.b32 %r7, %r2, 2;
  cvt.u64.u32 %rd5, %r7;
  add.u64 %rd6, %rd2, %rd5;
  st.global.f32 [%rd6], %f2;
  ret;
}
"""


@pytest.mark.parametrize("stride", [0, 1, 2, 3, 4, 8, 12, 32, 33])
def test_bank_conflicts_and_sectors_of_a_strided_probe(stride: int) -> None:
    """Thread t reads src[t * stride] and writes it to shared word (t * stride) % 1024; lanes
    of a warp reading one address (stride 0) share its bytes."""
    sim = SimBackend()
    kernel = sim.load_kernel(PROBE, "probe")
    threads = 64
    src, dst = sim.alloc(4 * threads * max(stride, 1)), sim.alloc(4 * threads)
    got = sim.measure(
        kernel,
        (1, 1, 1),
        (threads, 1, 1),
        0,
        [ParamValue("u64", src.address), ParamValue("u64", dst.address), ParamValue("u32", stride)],
        [(src.address, src.address + src.nbytes), (dst.address, dst.address + dst.nbytes)],
    )
    c = got.counters
    distinct = 4 * len({stride * t for t in range(32)})  # bytes of one warp's request
    assert (c.read, c.written, c.other_bytes) == ([2 * distinct, 0], [0, 4 * threads], 0)
    load, store = sorted(c.global_accesses.values(), key=lambda a: a.line)
    sectors = len({(4 * stride * t) // 32 for t in range(32)})  # one warp's, by hand
    ideal = -(-distinct // 32)
    assert (load.requests, load.bytes, load.sectors) == (2, 2 * distinct, 2 * sectors)
    assert (load.ideal_sectors, load.uncoalesced) == (2 * ideal, 2 if sectors > ideal else 0)
    assert (store.sectors, store.uncoalesced) == (8, 0)
    # Words t * stride of a warp fall on gcd(stride, 32) of the lanes per bank.
    ways = math.gcd(stride, 32) if stride else 1
    for acc in c.shared_accesses.values():
        assert (acc.requests, acc.max_ways, acc.ways) == (2, ways, float(ways))


def test_vector_shared_accesses_are_served_in_phases() -> None:
    """16-byte accesses run a quarter-warp per phase: 8 lanes 16 bytes apart fill 32 banks."""
    c = MemoryCounters([])
    lanes = np.arange(32)
    probe = Instruction(1, "ld.shared.v4.f32", "ld", ("shared", "v4", "f32"), ())
    c.count_shared(0, probe, lanes, (lanes * 16).astype(np.uint64), 16)
    assert (c.shared_accesses[0].wavefronts, c.shared_accesses[0].max_ways) == (4, 1)
    c.count_shared(1, probe, lanes, (lanes * 32).astype(np.uint64), 16)  # 2 lanes per bank
    assert (c.shared_accesses[1].wavefronts, c.shared_accesses[1].max_ways) == (8, 2)
    c.count_shared(2, probe, lanes, np.zeros(32, dtype=np.uint64), 16)  # one word: broadcast
    assert c.shared_accesses[2].max_ways == 1


# -- occupancy --------------------------------------------------------------------------------


def test_occupancy_by_hand() -> None:
    # 64 registers x 32 lanes = 2048 per warp; 16384 per sub-partition hold 8 warps, 32 in all.
    occ = occupancy(sm_limits(Target(90)), 256, 64, 0)
    assert (occ.blocks_per_sm, occ.warps_per_sm, occ.limited_by) == (4, 32, "registers")
    assert occ.fraction == 0.5
    # 48 KB + the 1 KB reserved per block: three fit in sm_80's 164 KB.
    occ = occupancy(sm_limits(Target(80)), 128, 32, 48 * 1024)
    assert (occ.blocks_per_sm, occ.limited_by) == (3, "shared memory")
    # Small blocks: the 32 blocks an SM holds are the limit.
    occ = occupancy(sm_limits(Target(90)), 32, 16, 0)
    assert (occ.blocks_per_sm, occ.warps_per_sm, occ.limited_by) == (32, 32, "blocks per SM")
    # 255 registers (rounded to 256 per thread: 8192 per warp): 2 warps per sub-partition.
    occ = occupancy(sm_limits(Target(86)), 64, 255, 0)
    assert (occ.blocks_per_sm, occ.warps_per_sm) == (4, 8)


# -- SASS -------------------------------------------------------------------------------------


def test_sass_instructions_drop_the_padding() -> None:
    listing = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 EXIT ;                   /* 0x000000000000894d */
        /*0020*/                   EXIT ;
        /*0030*/                   BRA 0x30;
        /*0040*/                   NOP;
        /*0050*/                   NOP;
    """
    assert sass.instructions(listing) == ["LDC R1, c[0x0][0x28]", "@!P0 EXIT", "EXIT"]


@needs_nvjitlink
def test_missing_disassembler_reads_na(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sass, "find_tool", lambda name: None)
    r = add.report(ct.PartitionSpec((2048,), (1024,)), ct.TensorSpec((2048,)),
                   ct.TensorSpec((2048,)), target=90)  # fmt: skip
    assert r.sass_instructions is None and r.sass_per_element is None
    assert "nvdisasm not found" in (r.why("sass_instructions") or "")
    assert "n/a (nvdisasm not found" in str(r)
    assert r.registers is not None and r.bytes_moved == r.bytes_ideal  # the rest still there


def test_missing_nvjitlink_reads_na(monkeypatch: pytest.MonkeyPatch) -> None:
    from cutile_py.host import report

    monkeypatch.setattr(report, "nvjitlink_available", lambda: False)
    r = add.report(ct.PartitionSpec((2048,), (1024,)), ct.TensorSpec((2048,)),
                   ct.TensorSpec((2048,)), target=90)  # fmt: skip
    assert r.registers is None and r.occupancy is None and r.sass_per_element is None
    assert "nvJitLink" in (r.why("registers") or "")
    assert "registers / thread" in str(r) and "n/a (the nvJitLink library" in str(r)
    assert r.bytes_moved == r.bytes_ideal == 3 * 2048 * 4


# -- PerformanceWarning -----------------------------------------------------------------------


@needs_nvjitlink
def test_a_kernel_that_spills_warns_once(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUTILE_PY_SPILL_CHECK", raising=False)  # the default: on
    assert issubclass(ct.PerformanceWarning, UserWarning)
    side = 256
    xs = rng.uniform(-0.5, 0.5, (side, side)).astype(np.float32)
    x = ct.from_numpy(xs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        z = ct.empty((side, side)).partition((side, side))
        held_across_loop(z, x, 2).sync()
        (z, _, _) = held_across_loop(z, x, 3).sync()  # the same specialization: no warning
    spills = [w for w in caught if issubclass(w.category, ct.PerformanceWarning)]
    assert len(spills) == 1, [str(w.message) for w in caught]
    message = str(spills[0].message)
    assert "kernel held_across_loop" in message and "sm_80" in message
    assert "bytes of spill stores" in message and " 0 bytes of spill stores" not in message
    assert spills[0].filename == __file__  # the user's line, not the compiler's
    want = xs.astype(np.float64)
    for _ in range(3):
        want = want * want + xs
    np.testing.assert_allclose(z.unpartition().to_numpy(), want, rtol=1e-5, atol=1e-6)

    # The report sees the spills too (compiled for another target: warned there once).
    with pytest.warns(ct.PerformanceWarning, match=r"held_across_loop.*sm_90"):
        r = held_across_loop.report(
            ct.PartitionSpec((side, side), (side, side)), ct.TensorSpec((side, side)), 1,
            target="sm_90",
        )  # fmt: skip
    assert r.spill_store_bytes is not None and r.spill_store_bytes > 0
    assert r.spill_load_bytes is not None and r.spill_load_bytes > 0
    assert r.registers == 255
    assert f"{r.spill_store_bytes} B / {r.spill_load_bytes} B" in str(r)


@needs_nvjitlink
def test_a_log_without_spill_figures_claims_neither_spills_nor_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nvJitLink's log as a compile served from its cache gives it (its summary alone): the
    report leaves spills out and says why (the figures read 0) and warns nothing, though
    the kernel spills (see above)."""
    monkeypatch.delenv("CUTILE_PY_SPILL_CHECK", raising=False)
    monkeypatch.setattr(nvjitlink, "_load", lambda: RecordingNvJitLink(info_log=CACHED_LOG))
    side = 256
    with warnings.catch_warnings():
        warnings.simplefilter("error", ct.PerformanceWarning)
        r = held_across_loop.report(
            ct.PartitionSpec((side, side), (side, side)), ct.TensorSpec((side, side)), 1,
            target="sm_90",
        )  # fmt: skip
    assert r.spill_store_bytes is None and r.spill_load_bytes is None
    assert "cached" in (r.why("spill_store_bytes") or "")
    assert r.registers == 10  # the summary's count stays
    assert "n/a (nvJitLink's log names no spills" in str(r)


@needs_nvjitlink
def test_small_kernels_do_not_warn(rng: np.random.Generator) -> None:
    n = 4096
    x, y = ct.randn(n), ct.randn(n)

    @ct.kernel
    def add2(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
        z.store(ct.load_tile_like(x, z) + ct.load_tile_like(y, z))

    with warnings.catch_warnings():
        warnings.simplefilter("error", ct.PerformanceWarning)
        add2(ct.empty(n).partition(1024), x, y).sync()
        add2.report(ct.empty(n).partition(1024), x, y, target=90)


@needs_nvjitlink
def test_spill_check_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTILE_PY_SPILL_CHECK", "0")

    @ct.kernel
    def held(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn], n: int) -> None:
        acc = ct.load_tile_like(x, z)
        for _ in range(n):
            acc = acc * acc + ct.load_tile_like(x, z)
        z.store(acc)

    with warnings.catch_warnings():
        warnings.simplefilter("error", ct.PerformanceWarning)
        held(ct.empty((256, 256)).partition((256, 256)), ct.zeros((256, 256)), 1).sync()


# -- SASS counted by the PTX line each instruction came from ----------------------------------
needs_nvdisasm = pytest.mark.skipif(
    sass.find_tool("nvdisasm") is None or not nvjitlink_available(),
    reason="nvdisasm or nvJitLink is not installed",
)


@ct.kernel
def divide(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) / ct.load_tile_like(y, z))


@ct.kernel
def repeat_exp(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], n: int) -> None:
    t = ct.load_tile_like(x, z)
    for _ in range(n):
        t = ct.exp(t * 0.5)
    z.store(t)


@needs_nvdisasm
def test_sass_per_element_leaves_out_the_slow_path() -> None:
    """`div.rn` is a dozen SASS instructions on its common path, and a call to a slow-path
    subroutine of about a hundred (denormal or huge operands) that normal inputs never run;
    the count from the cubin's size and the PTX executed/written ratio charged it all
    (51.75 per element here)."""
    n = 4096
    spec = (ct.PartitionSpec((n,), (1024,)), ct.TensorSpec((n,)), ct.TensorSpec((n,)))
    div = divide.report(*spec, target="sm_90").sass_per_element
    plain = add.report(*spec, target="sm_90").sass_per_element
    assert div is not None and plain is not None
    assert plain + 6.0 <= div <= plain + 16.0, (div, plain)


@needs_nvdisasm
def test_sass_per_element_grows_with_the_trip_count(rng: np.random.Generator) -> None:
    n = 1024 * int(rng.integers(2, 5))
    spec = (ct.PartitionSpec((n,), (1024,)), ct.TensorSpec((n,)))
    k = int(rng.integers(3, 9))
    rates = [repeat_exp.report(*spec, trips, target="sm_90").sass_per_element for trips in
             (1, 2, k)]  # fmt: skip
    assert None not in rates
    one, two, many = (float(v) for v in rates if v is not None)
    step = two - one
    # An exp (8 SASS) and a multiply per element per trip, and the loop's own few per thread:
    # a body counted once per copy ptxas made of it would show a multiple.
    assert 9.0 < step < 16.0, step
    assert many == pytest.approx(one + (k - 1) * step, rel=1e-9)


def test_line_info_names_each_instruction_line() -> None:
    ptx = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n" \
          "\t.reg .b32 %r<2>;\nL1:\n\tmov.u32 %r1, 1;\n\tret;\n}\n"  # fmt: skip
    text = sass.with_line_info(ptx)
    assert '.file 1 "kernel.ptx"' in text.splitlines()[3]
    assert "\t.loc 1 8 0\n\tmov.u32 %r1, 1;" in text and "\t.loc 1 9 0\n\tret;" in text
    assert ".loc 1 6" not in text and ".loc 1 7" not in text  # not declarations or labels
    listing = (
        '\t.text.k:\n\t//## File "kernel.ptx", line 8\n        /*0000*/   MOV R1, 1 ;\n'
        "        /*0010*/   EXIT ;\n.text.__cuda_slowpath:\n        /*0020*/   RET ;\n"
    )
    assert sass.located(listing) == [("MOV R1, 1", 8), ("EXIT", 8), ("RET", None)]
