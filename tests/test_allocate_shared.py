"""allocate_shared plans every shared-memory buffer: the pipelines' rings and resident tiles,
and each op's scratch (layout conversions, reductions and scans across warps, mma operands
stored from registers, accumulator bands, row vectors leaving fragments).

Checked here: each kind's planned size equals what the emitted code addresses (emission
records the bytes it addresses per buffer) and the kernel's shared memory is the plan's
total; over the library's kernels (run on sim against NumPy, which reports shared accesses
out of bounds), buffers whose lifetimes overlap never overlap in space; a kernel that does
not fit is refused naming its biggest buffers.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
import cutile_py_kernels as ck
from cutile_py import ir
from cutile_py.host.kernel import Kernel
from cutile_py.ir import ops as o
from cutile_py.ir.uses import def_use
from cutile_py.lower.allocate_shared import SharedPlan
from cutile_py.lower.emit_ptx import Emitter
from cutile_py.lower.errors import LoweringError
from cutile_py.lower.pipeline import lower_kernel, plan_and_emit
from cutile_py.lower.plan import LoweringPlan, plan_lowering
from cutile_py.ptx.target import Target
from cutile_py_kernels import _common, norms
from tests.test_cumsum import cumsum_2d
from tests.test_lowering_plan import flash, gemm

softmax_module = importlib.import_module("cutile_py_kernels.softmax")
SM80, SM90 = Target(80), Target(90)


def emitted(kernel: ir.Kernel, target: Target) -> tuple[LoweringPlan, Emitter]:
    """The plan of `kernel` and the emitter that carried it out (as `lower_kernel` does)."""
    return plan_and_emit(kernel, target)


def check_sizes(kernel: ir.Kernel, target: Target) -> SharedPlan:
    """Every planned scratch buffer is addressed to its last byte by the emitted code, and
    nothing else is; the block's shared memory is the plan's total."""
    plan, em = emitted(kernel, target)
    shared = plan.shared
    planned = {key: b.nbytes for key, b in shared.scratch.items()}
    assert em.scratch_used == planned, kernel.name
    assert em.fb.shared_bytes == shared.total
    ptx = lower_kernel(kernel, target).ptx
    declared = re.search(r"\.shared \.align \d+ \.b8 smem\[(\d+)\]", ptx)
    if shared.total > 48 * 1024:
        assert declared is None and "extern .shared" in ptx  # dynamic: the launch passes it
    elif shared.total:
        assert declared is not None and int(declared.group(1)) == shared.total
    else:
        assert "smem" not in ptx
    return shared


# -- one kernel per kind of scratch ------------------------------------------------------------
def _flat(
    name: str, shape: tuple[int, ...], body: Callable[[ir.Builder, o.Value], o.Value]
) -> ir.Kernel:
    """z = body(x) for one `shape` f32 tile of x per block."""
    b = ir.Builder()
    rank = len(shape)
    params: tuple[ir.Param, ...] = (
        ir.TensorParam("x", ir.f32, rank, False, (None,) * rank, 16),
        ir.TensorParam("z", ir.f32, rank, True, (None,) * rank, 16),
    )
    zero = b.constant(0, ir.i32)
    index = [b.grid("bid", 0), *[zero] * (rank - 1)]
    x = b.load(0, ir.f32, index, shape, 0.0)
    z = body(b, x)
    b.store(1, index[: len(z.type.shape)] or index, z)
    return ir.Kernel(name, params, (None, None), b.region)


def transpose() -> ir.Kernel:
    return _flat("transpose", (64, 64), lambda b, x: b.permute(x, (1, 0)))


def row_sum() -> ir.Kernel:
    """A row of 4096 spread over every warp: the sum crosses warps through shared memory."""
    return _flat("row_sum", (1, 4096), lambda b, x: b.broadcast(b.reduce("sum", x, 1), (1, 4096)))


def row_scan() -> ir.Kernel:
    return _flat("row_scan", (1, 4096), lambda b, x: b.scan("sum", x, 1))


def mma_in_registers() -> ir.Kernel:
    """One (64, 32) @ (32, 64) f16 product outside any loop: both operands are stored from
    registers, the accumulator goes back to its blocked layout in bands."""
    b = ir.Builder()
    params: tuple[ir.Param, ...] = (
        ir.TensorParam("a", ir.f16, 2, False, (None, None), 8),
        ir.TensorParam("b", ir.f16, 2, False, (None, None), 8),
        ir.TensorParam("c", ir.f32, 2, True, (64, 64), 8),
    )
    row, zero = b.grid("bid", 0), b.constant(0, ir.i32)
    ta = b.load(0, ir.f16, [row, zero], (64, 32), 0)
    tb = b.load(1, ir.f16, [zero, zero], (32, 64), 0)
    acc = b.load(2, ir.f32, [row, zero], (64, 64), 0)
    b.store(2, [row, zero], b.mma(ta, tb, acc))
    return ir.Kernel("mma_in_registers", params, (None, None, None), b.region)


KINDS: dict[str, tuple[Callable[[], ir.Kernel], Target]] = {
    "layout conversion": (transpose, SM80),
    "reduction across warps": (row_sum, SM80),
    "scan across warps": (row_scan, SM80),
    "mma operands": (mma_in_registers, SM80),
    "accumulator band": (gemm, SM80),
    "row vector out of fragments": (flash, SM80),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_planned_size_is_what_the_code_addresses(kind: str) -> None:
    make, target = KINDS[kind]
    shared = check_sizes(make(), target)
    assert any(kind in b.what for b in shared.scratch.values()), [
        b.what for b in shared.scratch.values()
    ]


def test_wgmma_gemm_sizes_and_alignment() -> None:
    """sm_90: the TMA ring on its 1024-byte boundary, the TMA store's staging tile over it
    (128 x 128 f32: 64 KiB), on a 1024-byte boundary too; no band leaves the fragments."""
    shared = check_sizes(gemm(128, 128, 64), SM90)
    assert all(r.offset % 1024 == 0 for r in shared.regions if r.kind == "ring")
    (staging,) = shared.scratch.values()
    assert staging.what == "tma store staging" and staging.moment == ""
    assert staging.offset == 0 and staging.nbytes == 128 * 128 * 4


# -- lifetimes over the library's kernels --------------------------------------------------------
def overlaps(plan: SharedPlan) -> list[str]:
    """Pairs of buffers live at one step that share bytes."""
    spans: list[tuple[str, int, int, int, int]] = []
    for r in plan.regions:
        first, last = plan.live(r)
        spans.append((f"{r.kind} of loop", first, last, r.offset, r.offset + r.nbytes))
    for b in plan.scratch.values():
        spans.append((f"{b.what} of {b.op.opname}", b.step, b.step, b.offset, b.offset + b.nbytes))
    bad = []
    for i, (n1, f1, l1, a1, e1) in enumerate(spans):
        for n2, f2, l2, a2, e2 in spans[i + 1 :]:
            if f1 <= l2 and f2 <= l1 and a1 < e2 and a2 < e1:
                bad.append(f"{n1} [{a1}, {e1}) and {n2} [{a2}, {e2})")
    return bad


def test_overlap_check_finds_a_clash() -> None:
    """The property checker itself: a scratch buffer moved into a live ring is reported."""
    _, em = emitted(gemm(), SM80)
    shared = em.shared
    loop = shared.regions[0].loop
    enter, _ = shared.steps[loop]
    ((key, band),) = shared.scratch.items()
    moved = type(band)(band.op, band.moment, band.what, 0, band.nbytes, enter + 1)
    clash = type(shared)(
        shared.regions, shared.floors, {key: moved}, shared.total, shared.band_limit, shared.steps
    )
    assert not overlaps(shared)
    assert overlaps(clash)


@pytest.fixture
def compiled_irs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ir.Kernel]]:
    """The IR of every kernel the library compiles (or finds cached) while the test runs."""
    seen: list[ir.Kernel] = []
    original = Kernel.compiled

    def spy(self: Kernel, spec: Any, target: Any) -> Any:
        got = original(self, spec, target)
        seen.append(got.ir)
        return got

    monkeypatch.setattr(Kernel, "compiled", spy)
    ct.set_backend("sim")
    yield seen


def _tensor(rng: np.random.Generator, shape: tuple[int, ...], dt: Any) -> tuple[np.ndarray, Any]:
    a = rng.standard_normal(shape).astype(np.float32)
    t = ct.from_numpy(a, dt)
    return t.to_numpy().astype(np.float64), t


def test_library_kernels_never_overlap_live_buffers(
    rng: np.random.Generator, compiled_irs: list[ir.Kernel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gemm, attention, softmax, norms, cumsum, argmax and transpose, run on sim (shared
    accesses out of bounds are errors there) against NumPy; then every kernel they
    compiled, planned for sm_80 and sm_90: live buffers apart, sizes as addressed."""
    f16 = ct.f16
    a, ta = _tensor(rng, (80, 48), f16)
    b, tb = _tensor(rng, (48, 72), f16)
    np.testing.assert_allclose(ck.gemm(ta, tb).to_numpy(), a @ b, rtol=1e-2, atol=1e-2)
    q, tq = _tensor(rng, (2, 33, 64), f16)
    k, tk = _tensor(rng, (1, 40, 64), f16)
    v, tv = _tensor(rng, (1, 40, 64), f16)
    s = np.einsum("hqd,kd->hqk", q, k[0]) / 8.0
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = np.einsum("hqk,kd->hqd", p / p.sum(-1, keepdims=True), v[0])
    got = ck.attention(tq, tk, tv, causal=False).to_numpy().astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2)
    x, tx = _tensor(rng, (6, 3000), ct.f32)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(
        ck.softmax(tx).to_numpy(), e / e.sum(1, keepdims=True), rtol=1e-4, atol=1e-7
    )
    w, tw = _tensor(rng, (3000,), ct.f32)
    rms = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(ck.rms_norm(tx, tw).to_numpy(), rms, rtol=1e-4, atol=1e-5)
    ln = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * w + w
    np.testing.assert_allclose(ck.layer_norm(tx, tw, tw).to_numpy(), ln, rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(ck.argmax(tx).to_numpy().reshape(-1), x.argmax(1))
    # Rows past a cap of 256 elements: the chunked (looping) kernels.
    for dt in (ct.f32, ct.f16, ct.bf16):
        monkeypatch.setitem(_common.ROW_CAP, dt, 256)
    monkeypatch.setattr(softmax_module, "ONE_PASS_CAP", 256)
    monkeypatch.setattr(norms, "ONE_PASS_CAP", 256)
    np.testing.assert_allclose(
        ck.softmax(tx).to_numpy(), e / e.sum(1, keepdims=True), rtol=1e-4, atol=1e-7
    )
    np.testing.assert_allclose(ck.rms_norm(tx, tw).to_numpy(), rms, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ck.layer_norm(tx, tw, tw).to_numpy(), ln, rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(ck.argmax(tx).to_numpy().reshape(-1), x.argmax(1))
    np.testing.assert_array_equal(ck.transpose(tx).to_numpy(), x.T)

    c, tc = _tensor(rng, (3, 2048), ct.f32)
    z, _, _ = cumsum_2d(ct.empty((3, 2048), ct.f32).partition((1, 2048)), tc, 1).sync()
    np.testing.assert_allclose(z.unpartition().to_numpy(), np.cumsum(c, 1), rtol=1e-4, atol=1e-3)

    kernels = {k.name: k for k in compiled_irs}
    assert len(kernels) >= 12, sorted(kernels)
    for kernel in kernels.values():
        for target in (SM80, SM90):
            try:
                shared = check_sizes(kernel, target)
            except LoweringError as e:  # only a target's own refusal, never a sizing bug
                assert "size_scratch" not in str(e)
                continue
            assert not overlaps(shared), kernel.name


def test_too_big_names_the_biggest_buffers() -> None:
    """A conversion past the target's shared memory is refused before emission."""
    kernel = _flat("huge", (256, 256), lambda b, x: b.permute(x, (1, 0)))
    with pytest.raises(
        LoweringError,
        match=r"kernel huge needs \d+ bytes of shared memory.*layout conversion of \w+: \d+ bytes",
    ):
        plan_lowering(kernel, Target(86), def_use(kernel))
