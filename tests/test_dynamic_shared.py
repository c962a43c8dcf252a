"""Shared memory above 48 KB: `smem` is declared `.extern` (dynamic) and sized at launch, on
sim (checked against NumPy), through nvJitLink for sm_80 and sm_90, and on the GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import f16, f32
from cutile_py.host import jit_disk
from cutile_py.host.launch import ParamReader, prepare_lowered
from cutile_py.lower.emit_ptx import PtxParam
from cutile_py.lower.pipeline import LoweredKernel
from cutile_py.ptx.builder import FunctionBuilder, ModuleBuilder, int_imm
from cutile_py.ptx.target import MAX_STATIC_SHARED, Target
from cutile_py.runtime.backend import ParamValue, PreparedLaunch, RuntimeFailure
from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available
from cutile_py.runtime.select import active_backend
from cutile_py.runtime.sim_backend import SimBackend
from cutile_py_kernels.gemm import _gemm_kernel

if TYPE_CHECKING:
    ConstInt = int
else:
    ConstInt = ct.Constant[int]
BM = TypeVar("BM")
BN = TypeVar("BN")

THREADS = 256
GRID = 2
#: 72 KB: past the 48 KB static limit, within every target's opt-in maximum.
SHARED = 72 * 1024
WORDS = SHARED // 4
SM80 = Target(80)


def reverse_through_shared(shared_bytes: int, target: Target = SM80) -> LoweredKernel:
    """out[b, j] = f(b, N-1-j) with f(b, i) = 3 i + 7 + 100000 b: every word of a block's
    `smem` (N words) is written by one thread and read back by another after a barrier."""
    words = shared_bytes // 4
    fb = FunctionBuilder("reverse_smem", [("out", "u64")])
    fb.shared_bytes = shared_bytes
    p, tid, cta, base, i, v, a, j, src = (
        fb.reg(t) for t in ("pred", "b32", "b32", "b32", "b32", "b32", "b32", "b32", "b32")
    )
    out, addr, wide = fb.reg("b64"), fb.reg("b64"), fb.reg("b64")
    fb.ins("ld.param.u64", out, "[out]")
    fb.ins("cvta.to.global.u64", out, out)
    fb.ins("mov.u32", tid, "%tid.x")
    fb.ins("mov.u32", cta, "%ctaid.x")
    fb.ins("mov.u32", base, "smem")
    # Write: smem[i] = f(cta, i) for i = tid, tid + THREADS, ...
    write, wrote = fb.new_label("write"), fb.new_label("wrote")
    fb.ins("mov.u32", i, tid)
    fb.place(write)
    fb.ins("setp.ge.u32", p, i, int_imm(words))
    fb.ins("bra", wrote, pred=p)
    fb.ins("mad.lo.u32", v, i, int_imm(3), int_imm(7))
    fb.ins("mad.lo.u32", v, cta, int_imm(100000), v)
    fb.ins("mad.lo.u32", a, i, int_imm(4), base)
    fb.ins("st.shared.u32", "[" + str(a) + "]", v)
    fb.ins("add.u32", i, i, int_imm(THREADS))
    fb.ins("bra", write)
    fb.place(wrote)
    fb.ins("bar.sync", int_imm(0))
    # Read: out[cta * N + j] = smem[N - 1 - j]
    read, done = fb.new_label("read"), fb.new_label("done")
    fb.ins("mov.u32", j, tid)
    fb.place(read)
    fb.ins("setp.ge.u32", p, j, int_imm(words))
    fb.ins("bra", done, pred=p)
    fb.ins("sub.u32", src, int_imm(words - 1), j)
    fb.ins("mad.lo.u32", a, src, int_imm(4), base)
    fb.ins("ld.shared.u32", v, "[" + str(a) + "]")
    fb.ins("mad.lo.u32", a, cta, int_imm(words), j)
    fb.ins("mul.wide.u32", wide, a, int_imm(4))
    fb.ins("add.s64", addr, out, wide)
    fb.ins("st.global.u32", "[" + str(addr) + "]", v)
    fb.ins("add.u32", j, j, int_imm(THREADS))
    fb.ins("bra", read)
    fb.place(done)
    fb.ins("ret")
    module = ModuleBuilder(target)
    module.functions.append(fb)
    params = (PtxParam(0, "ptr"),)
    return LoweredKernel(module.render(), fb.name, THREADS, params, target, fb.dynamic_shared)


def expected(words: int) -> np.ndarray:
    i = np.arange(words, dtype=np.int64)[::-1]
    return np.stack([3 * i + 7 + 100000 * b for b in range(GRID)]).astype(np.int32)


def test_static_up_to_48k_then_extern() -> None:
    at_limit = reverse_through_shared(MAX_STATIC_SHARED)
    assert f".shared .align 16 .b8 smem[{MAX_STATIC_SHARED}];" in at_limit.ptx
    assert ".extern" not in at_limit.ptx
    assert at_limit.dynamic_shared == 0
    above = reverse_through_shared(SHARED)
    # At module scope, before the entry: ptxas refuses `.extern` inside a function.
    head, entry = above.ptx.split(".visible .entry")
    assert "\n.extern .shared .align 16 .b8 smem[];\n" in head
    assert "smem[" not in entry
    assert above.dynamic_shared == SHARED


def test_target_shared_limits() -> None:
    limits = {sm: Target(sm).max_shared_bytes for sm in (80, 86, 87, 89, 90, 100, 120)}
    assert limits == {
        80: 166912,
        86: 101376,
        87: 166912,  # Orin: A100's
        89: 101376,
        90: 232448,
        100: 232448,
        120: 101376,
    }


def _prepared(lowered: LoweredKernel, out: Any) -> tuple[PreparedLaunch, list[int | float]]:
    """The launch through the backend's prepared path, as `op.sync()` makes it, and its
    parameter values."""
    backend = active_backend()
    kernel = backend.load_kernel(lowered.ptx, lowered.entry)
    return prepare_lowered(backend, kernel, lowered, (GRID,)), ParamReader(lowered)((out,))


def _params(lowered: LoweredKernel, out: Any) -> list[ParamValue]:
    reader = ParamReader(lowered)
    return [ParamValue(t, v) for t, v in zip(reader.ptypes, reader((out,)))]


@pytest.mark.parametrize("words", [WORDS, MAX_STATIC_SHARED // 4])
def test_sim_runs_the_whole_region(words: int) -> None:
    """Through the host launch path: the launch passes `dynamic_shared` as its shared_mem."""
    lowered = reverse_through_shared(words * 4)
    out = ct.zeros((GRID, words), dtype=ct.i32)
    launch, values = _prepared(lowered, out)
    assert launch.shared_mem == lowered.dynamic_shared
    launch.launch_and_wait(values)
    np.testing.assert_array_equal(out.to_numpy(), expected(words))


def test_sim_without_the_dynamic_bytes_is_a_fault() -> None:
    """The launch must size `.extern` smem: with none, the first store is out of bounds."""
    lowered = reverse_through_shared(SHARED)
    backend = active_backend()
    out = ct.zeros((GRID, WORDS), dtype=ct.i32)
    k = backend.load_kernel(lowered.ptx, lowered.entry)
    params = _params(lowered, out)
    done = backend.launch(k, (GRID, 1, 1), (THREADS, 1, 1), 0, params)
    with pytest.raises(RuntimeFailure, match="out-of-bounds shared store"):
        done.wait()


def test_sim_rejects_more_than_the_target_allows() -> None:
    """96 KB is fine on sm_86 (99 KB) but 100 KB is not; sm_90 takes it."""
    lowered = reverse_through_shared(SHARED)
    out = ct.zeros((GRID, WORDS), dtype=ct.i32)
    params = _params(lowered, out)
    sm86 = SimBackend(Target(86))
    k = sm86.load_kernel(lowered.ptx, lowered.entry)
    with pytest.raises(RuntimeFailure, match=r"102400 bytes of shared memory .* exceed the 101376"):
        sm86.launch(k, (1, 1, 1), (THREADS, 1, 1), 100 * 1024, params)
    k90 = SimBackend(Target(90)).load_kernel(lowered.ptx, lowered.entry)
    assert k90.program.shared_size(100 * 1024) == 100 * 1024


def test_disk_entry_keeps_dynamic_shared() -> None:
    lowered = reverse_through_shared(SHARED)
    decoded = jit_disk.decode(jit_disk.encode(lowered, "ir"))
    assert decoded is not None and decoded[0] == lowered and decoded[1] == "ir"
    assert decoded[0].dynamic_shared == SHARED
    # An entry of the format before dynamic_shared existed is a miss (recompiled).
    old = b'{"format":1,"ptx":"","entry":"e","block_threads":32,"params":[],"target":80,'
    assert jit_disk.decode(old + b'"ir_text":""}') is None


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
@pytest.mark.parametrize("sm", [80, 90])
def test_nvjitlink_assembles_extern_shared_above_48k(sm: int) -> None:
    lowered = reverse_through_shared(SHARED, Target(sm))
    report = assemble(lowered.ptx, Target(sm))
    assert report.cubin
    # The static footprint is at most the 1 KB CUDA reserves: `smem` is sized at launch.
    assert report.shared_bytes <= 1024, report.info_log


def make_gemm(stages: int) -> Any:
    """The library's f16 -> f32 GEMM kernel, pipelined `stages` deep."""
    return _gemm_kernel(f16, f32, False, False, stages)


#: 64x64 f16 operand tiles with BK=64: 16 KB per stage, so 4 stages need 64 KB.
GEMM_SPEC = (
    ct.PartitionSpec((128, 128), (64, 64), f32),
    ct.TensorSpec((128, 256), f16),
    ct.TensorSpec((256, 128), f16),
    64,
)


@pytest.mark.parametrize("sm", [80, 90])
def test_compiled_gemm_past_48k_uses_dynamic_shared(sm: int) -> None:
    deep = make_gemm(4).compile(*GEMM_SPEC, target=Target(sm)).lowered
    assert deep.dynamic_shared > MAX_STATIC_SHARED
    # sm_90: TMA's and wgmma's swizzles read absolute address bits (1024-byte aligned).
    align = 1024 if Target(sm).tma or Target(sm).wgmma else 16
    assert f"\n.extern .shared .align {align} .b8 smem[];\n" in deep.ptx
    shallow = make_gemm(2).compile(*GEMM_SPEC, target=Target(sm)).lowered
    assert shallow.dynamic_shared == 0 and ".extern" not in shallow.ptx


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
@pytest.mark.parametrize("sm", [80, 90])
def test_compiled_gemm_past_48k_assembles(sm: int) -> None:
    deep = make_gemm(4).compile(*GEMM_SPEC, target=Target(sm)).lowered
    assert assemble(deep.ptx, Target(sm)).cubin


def run_gemm(stages: int) -> None:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((128, 256)).astype(np.float16)
    b = rng.standard_normal((256, 128)).astype(np.float16)
    out = ct.zeros((128, 128))
    res, *_ = make_gemm(stages)(
        out.partition((64, 64)), ct.from_numpy(a, f16), ct.from_numpy(b, f16), 64
    ).sync()
    want = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(res.unpartition().to_numpy(), want, rtol=1e-3, atol=1e-3)


def test_compiled_gemm_past_48k_runs_on_sim() -> None:
    run_gemm(4)


@pytest.mark.gpu
def test_compiled_gemm_past_48k_runs_on_cuda() -> None:
    ct.set_backend("cuda")
    run_gemm(4)


@pytest.mark.gpu
def test_cuda_runs_the_whole_region() -> None:
    ct.set_backend("cuda")
    backend = active_backend()
    lowered = reverse_through_shared(SHARED, backend.target)
    out = ct.zeros((GRID, WORDS), dtype=ct.i32)
    launch, values = _prepared(lowered, out)
    launch.launch_and_wait(values)
    np.testing.assert_array_equal(out.to_numpy(), expected(WORDS))


def test_target_capability_flags() -> None:
    """What each target can do, as the lowering passes read it (no pass checks `sm` itself)."""
    flags = {
        sm: (t.mma_sync, t.cp_async, t.wgmma, t.tma)
        for sm in (80, 86, 89, 90, 100)
        for t in [Target(sm)]
    }
    assert flags == {
        80: (True, True, False, False),
        86: (True, True, False, False),
        89: (True, True, False, False),
        90: (True, True, True, True),
        100: (True, True, False, True),
    }
    t = Target(90)
    assert (t.max_registers_per_thread, t.max_registers_per_block) == (255, 65536)
    assert t.describe() == (
        "sm_90 [mma_sync cp_async wgmma tma] shared 232448 B, registers 255/thread 65536/block"
    )
