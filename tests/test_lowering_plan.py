"""The planning passes alone, on kernels built with the IR builder: the printed IR and the
printed plan are pinned by golden files (tests/data/plans/), and the pipeline pass's choices
(stages, rings of nested loops, shared-memory limits) are checked directly.

Regenerate the golden files after an intended change with CUTILE_PY_REGEN_GOLDEN=1.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import replace
from pathlib import Path

import pytest

from cutile_py import ir
from cutile_py.ir import ops as o
from cutile_py.ir.uses import def_use
from cutile_py.lower.errors import LoweringError
from cutile_py.lower.plan import format_plan, plan_lowering
from cutile_py.ptx.target import Target

GOLDEN = Path(__file__).parent / "data" / "plans"


def gemm(bm: int = 64, bn: int = 64, bk: int = 32, stages: int | None = None) -> ir.Kernel:
    """c[tile] = sum over K of a (M, K) f16 @ b (K, N) f16, one K step per iteration."""
    b = ir.Builder()
    params: tuple[ir.Param, ...] = (
        ir.TensorParam("a", ir.f16, 2, False, (None, None), 8),
        ir.TensorParam("b", ir.f16, 2, False, (None, None), 8),
        ir.TensorParam("c", ir.f32, 2, True, (bm, bn), 8),
    )
    row, col = b.grid("bid", 0), b.grid("bid", 1)
    zero, one = b.constant(0, ir.i32), b.constant(1, ir.i32)
    steps = b.constant(4, ir.i32)
    acc0 = b.broadcast(b.constant(0.0, ir.f32), (bm, bn))
    loop = b.for_loop(zero, steps, one, [acc0])
    with b.inside(loop.body):
        k, acc = loop.body.args
        ta = b.load(0, ir.f16, [row, k], (bm, bk), 0)
        tb = b.load(1, ir.f16, [k, col], (bk, bn), 0)
        b.yield_([b.mma(ta, tb, acc)])
    b.store(2, [row, col], loop.results[0])
    return ir.Kernel("gemm", params, (None, None, None), b.region, grid_rank=2, stages=stages)


def gemm_ws() -> ir.Kernel:
    """`gemm` at 128 x 128 x 64 with `warp_specialize`: on sm_90 a producer warp group."""
    return replace(gemm(128, 128, 64, stages=3), warp_specialize=True)


def softmax_rows() -> ir.Kernel:
    """z = softmax(x) along rows, for (4, 128) f32 tiles."""
    b = ir.Builder()
    params: tuple[ir.Param, ...] = (
        ir.TensorParam("x", ir.f32, 2, False, (None, 128), 16),
        ir.TensorParam("z", ir.f32, 2, True, (4, 128), 16),
    )
    row, zero = b.grid("bid", 0), b.constant(0, ir.i32)
    x = b.load(0, ir.f32, [row, zero], (4, 128), float("-inf"))
    big = b.broadcast(b.reduce("max", x, 1), (4, 128))
    e = b.unary("exp", b.binary("sub", x, big))
    total = b.broadcast(b.reduce("sum", e, 1), (4, 128))
    b.store(1, [row, zero], b.binary("div", e, total))
    return ir.Kernel("softmax_rows", params, (None, None), b.region)


def flash(bm: int = 64, bn: int = 32, d: int = 32) -> ir.Kernel:
    """out = softmax(q k^T) v for bm query rows, bn keys per step (keys past n masked), with
    a running row max m, row sum l and a rescaled accumulator: every tile the loop computes
    but the two staged loads stays in mma fragments (assign_fragments)."""
    b = ir.Builder()
    params: tuple[ir.Param, ...] = (
        ir.TensorParam("q", ir.f16, 2, False, (None, d), 16),
        ir.TensorParam("k", ir.f16, 2, False, (None, d), 16),
        ir.TensorParam("v", ir.f16, 2, False, (None, d), 16),
        ir.TensorParam("out", ir.f32, 2, True, (bm, d), 16),
    )
    n = b.tensor_dim(1, 0)
    row, zero, one = b.grid("bid", 0), b.constant(0, ir.i32), b.constant(1, ir.i32)
    q = b.load(0, ir.f16, [row, zero], (bm, d), 0)
    m0 = b.broadcast(b.constant(float("-inf"), ir.f32), (bm,))
    l0 = b.broadcast(b.constant(0.0, ir.f32), (bm,))
    acc0 = b.broadcast(b.constant(0.0, ir.f32), (bm, d))
    steps = b.binary(
        "floordiv", b.binary("add", n, b.constant(bn - 1, ir.i32)), b.constant(bn, ir.i32)
    )
    loop = b.for_loop(zero, steps, one, [acc0, l0, m0])
    with b.inside(loop.body):
        j, acc, l, m = loop.body.args
        kt = b.permute(b.load(1, ir.f16, [j, zero], (bn, d), 0), (1, 0))
        s = b.mma(q, kt, b.broadcast(b.constant(0.0, ir.f32), (bm, bn)))
        cols = b.binary(
            "add", b.broadcast(b.binary("mul", j, b.constant(bn, ir.i32)), (bn,)), b.iota(bn)
        )
        keep = b.broadcast(
            b.compare("lt", b.reshape(cols, (1, bn)), b.broadcast(n, (1, bn))), (bm, bn)
        )
        s = b.select(keep, s, b.broadcast(b.constant(float("-inf"), ir.f32), (bm, bn)))
        m_new = b.binary("max", m, b.reshape(b.reduce("max", s, 1), (bm,)))
        p = b.unary("exp", b.binary("sub", s, b.broadcast(b.reshape(m_new, (bm, 1)), (bm, bn))))
        alpha = b.unary("exp", b.binary("sub", m, m_new))
        l_new = b.binary("add", b.binary("mul", l, alpha), b.reshape(b.reduce("sum", p, 1), (bm,)))
        scaled = b.binary("mul", acc, b.broadcast(b.reshape(alpha, (bm, 1)), (bm, d)))
        vt = b.load(2, ir.f16, [j, zero], (bn, d), 0)
        b.yield_([b.mma(b.cast(p, ir.f16), vt, scaled), l_new, m_new])
    acc, l, _ = loop.results
    b.store(3, [row, zero], b.binary("div", acc, b.broadcast(b.reshape(l, (bm, 1)), (bm, d))))
    return ir.Kernel("flash", params, (None, None, None, None), b.region)


def _printed(kernel: ir.Kernel, target: Target) -> str:
    ir.verify(kernel)
    plan = plan_lowering(kernel, target, def_use(kernel))
    return ir.print_kernel(kernel) + "\n" + format_plan(kernel, plan)


@pytest.mark.parametrize(
    ("name", "make", "sm"),
    [
        ("gemm_sm80", gemm, 80),
        ("gemm_sm90", gemm, 90),
        ("gemm_ws_sm90", gemm_ws, 90),
        ("softmax_rows_sm90", softmax_rows, 90),
        ("flash_sm80", flash, 80),
    ],
)
def test_plan_matches_golden(name: str, make: object, sm: int) -> None:
    assert callable(make)
    got = _printed(make(), Target(sm))
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("CUTILE_PY_REGEN_GOLDEN"):
        path.write_text(got)
    want = path.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True)))
    assert got == want, f"{path} differs (CUTILE_PY_REGEN_GOLDEN=1 rewrites it):\n{diff}"


def test_plan_is_deterministic() -> None:
    assert _printed(gemm(), Target(80)) == _printed(gemm(), Target(80))


SM80 = Target(80)


def _pipeline(kernel: ir.Kernel, target: Target = SM80) -> tuple[int, int, int]:
    plan = plan_lowering(kernel, target, def_use(kernel))
    (p,) = plan.pipelines.values()
    return p.stages, p.stage_bytes, len(p.loads)


def test_pipeline_stages_default_and_explicit() -> None:
    # Two 64x32 / 32x64 f16 tiles: 8 KiB a stage; three stages fit the 48 KiB default.
    assert _pipeline(gemm()) == (3, 8192, 2)
    assert _pipeline(gemm(stages=2)) == (2, 8192, 2)
    # 128x128x64: 32 KiB a stage, one fits under 48 KiB; stages=4 needs the opt-in.
    assert _pipeline(gemm(128, 128, 64)) == (1, 32768, 2)
    assert _pipeline(gemm(128, 128, 64, stages=4)) == (4, 32768, 2)


def test_pipeline_refuses_more_stages_than_the_target_has_shared_memory() -> None:
    k = gemm(128, 128, 64, stages=6)  # 192 KiB: more than sm_80's 163 KiB, less than sm_90's
    assert _pipeline(k, Target(90)) == (6, 32768, 2)
    with pytest.raises(LoweringError, match=r"stages=6 needs 196608 bytes") as e:
        _pipeline(k, Target(80))
    loop = next(op for op in k.body.ops if isinstance(op, o.ForOp))
    assert e.value.span == loop.span


def test_fragments_are_the_carried_accumulator() -> None:
    k = gemm()
    plan = plan_lowering(k, Target(80), def_use(k))
    loop = next(op for op in k.body.ops if isinstance(op, o.ForOp))
    mma = next(op for op in loop.body.ops if isinstance(op, o.MmaOp))
    assert plan.fragments == {loop.body.args[1], mma.result}


def two_loops(resident: bool) -> ir.Kernel:
    """Two mma loops one after the other (lifetimes that do not overlap); the first takes its
    A operand loaded before the loop (stored once: a resident tile) if `resident`."""
    b = ir.Builder()
    params: tuple[ir.Param, ...] = (
        ir.TensorParam("a", ir.f16, 2, False, (None, None), 8),
        ir.TensorParam("b", ir.f16, 2, False, (None, None), 8),
        ir.TensorParam("c", ir.f32, 2, True, (64, 64), 8),
    )
    zero, one, steps = b.constant(0, ir.i32), b.constant(1, ir.i32), b.constant(4, ir.i32)
    outer_a = b.load(0, ir.f16, [zero, zero], (64, 32), 0)
    results = []
    for first in (True, False):
        loop = b.for_loop(zero, steps, one, [b.broadcast(b.constant(0.0, ir.f32), (64, 64))])
        with b.inside(loop.body):
            k, acc = loop.body.args
            ta = outer_a if first and resident else b.load(0, ir.f16, [zero, k], (64, 32), 0)
            tb = b.load(1, ir.f16, [k, zero], (32, 64), 0)
            b.yield_([b.mma(ta, tb, acc)])
        results.append(loop.results[0])
    b.store(2, [zero, zero], b.binary("add", results[0], results[1]))
    return ir.Kernel("two_loops", params, (None, None, None), b.region)


@pytest.mark.parametrize("resident", [False, True])
def test_allocate_shared_reuses_disjoint_lifetimes_and_places_resident_tiles(
    resident: bool,
) -> None:
    """Sibling loops' rings share offset 0 (their lifetimes do not overlap); an mma operand
    defined before its loop gets a tile of its own past the ring, for the loop's lifetime,
    and the loop body's scratch starts past both."""
    k = two_loops(resident)
    plan = plan_lowering(k, Target(80), def_use(k))
    first, second = (op for op in k.body.ops if isinstance(op, o.ForOp))
    p1, p2 = plan.pipelines[first], plan.pipelines[second]
    assert plan.shared.ring(first) == plan.shared.ring(second) == 0
    ring1 = p1.stages * p1.stage_bytes
    assert plan.shared.floor(second) == p2.stages * p2.stage_bytes
    if resident:
        assert len(p1.loads) == 1  # b only: a is loaded before the loop
        (region,) = plan.shared.resident(first)
        outer_a = next(op for op in k.body.ops if isinstance(op, o.LoadOp)).result
        assert region.value is outer_a and region.which == 0
        assert (region.offset, region.nbytes) == (ring1, 64 * 32 * 2)
        assert plan.shared.floor(first) == ring1 + 64 * 32 * 2
    else:
        assert not plan.shared.resident(first)
        assert plan.shared.floor(first) == ring1
    assert not plan.shared.resident(second)
