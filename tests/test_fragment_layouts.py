"""mma fragment layouts as a planned layout kind (`assign_fragments`): a flash-attention-style
loop keeps its scores, probabilities and rescaled accumulator in fragment registers (no
shared memory per iteration, shown from the plan and the PTX) and matches NumPy on sim;
row reductions of an mma result run on fragments; families that cannot stay in fragments
fall back to blocked layouts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Constant, Dyn, Mut, Tensor, f16, f32, ir
from cutile_py.ir import ops as o
from cutile_py.ir.uses import def_use
from cutile_py.lower.plan import plan_lowering
from cutile_py.ptx.target import Target

BM = TypeVar("BM")
D = TypeVar("D")
TWO = TypeVar("TWO")


@ct.kernel
def flash(
    out: Mut[Tensor[f32, BM, D]],
    q: Tensor[f16, Dyn, D],
    k: Tensor[f16, Dyn, D],
    v: Tensor[f16, Dyn, D],
    BN: Constant[int],
    scale: float,
) -> None:
    """One block: softmax(q k^T * scale) v for BM query rows, BN keys per iteration, with
    a running row max m, row sum l and rescaled accumulator (keys past n masked)."""
    bm, d = out.shape[0], out.shape[1]
    n = k.shape[0]
    qt = ct.load(q, (ct.bid(0), 0), (bm, d))
    m = ct.full((bm,), float("-inf"), f32)
    l = ct.zeros((bm,), f32)
    acc = ct.zeros((bm, d), f32)
    for j in range(ct.cdiv(n, BN)):
        kt = ct.load(k, (j, 0), (BN, d))
        s = ct.mma(qt, kt.T, ct.zeros((bm, BN), f32)) * scale
        cols = j * BN + ct.arange(BN, ct.i32)
        s = ct.where(ct.reshape(cols, (1, BN)) < n, s, float("-inf"))
        m_new = ct.maximum(m, ct.max(s, 1))
        p = ct.exp(s - ct.expand_dims(m_new, 1))
        alpha = ct.exp(m - m_new)
        l = l * alpha + ct.sum(p, 1)
        vt = ct.load(v, (j, 0), (BN, d))
        acc = ct.mma(p.astype(f16), vt, acc * ct.expand_dims(alpha, 1))
        m = m_new
    out.store(acc / ct.expand_dims(l, 1))


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    s = q.astype(np.float64) @ k.astype(np.float64).T * scale
    p = np.exp(s - s.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)) @ v.astype(np.float64)


def _run_flash(
    rng: np.random.Generator, s: int, d: int, bm: int, bn: int
) -> tuple[np.ndarray, np.ndarray]:
    q, k, v = (rng.standard_normal((s, d)).astype(np.float16) for _ in range(3))
    scale = float(1 / np.sqrt(d))
    out = ct.full((s, d), np.nan, f32)
    (op, *_) = flash(
        out.partition((bm, d)), ct.from_numpy(q), ct.from_numpy(k), ct.from_numpy(v), bn, scale
    ).sync()
    return op.unpartition().to_numpy(), _attention(q, k, v, scale)


@pytest.mark.parametrize(
    ("s", "d", "bm", "bn"),
    [(100, 32, 64, 32), (80, 16, 32, 16), (128, 32, 64, 64)],
)
def test_flash_loop_matches_numpy_on_sim(
    rng: np.random.Generator, s: int, d: int, bm: int, bn: int
) -> None:
    """Ragged in queries and keys (100 = 64 + 36, 80 = 5 x 16 keys but 2.5 query blocks)."""
    ct.set_backend("sim")
    got, ref = _run_flash(rng, s, d, bm, bn)
    # p is rounded to f16 before the second mma: errors of a few f16 ulps of p.
    np.testing.assert_allclose(got, ref, atol=3e-3, rtol=0)


def _loop_lines(text: str) -> list[str]:
    """The PTX lines of the (only) loop: from its label to its exit label."""
    lines = text.splitlines()
    top = next(i for i, x in enumerate(lines) if re.match(r"\$__loop_\d+:", x))
    end = next(i for i, x in enumerate(lines) if re.match(r"\$__done_\d+:", x))
    return lines[top:end]


def test_flash_loop_keeps_scores_and_accumulator_in_fragments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    ct.set_backend("sim")
    monkeypatch.setenv("CUTILE_PY_DUMP", str(tmp_path / "dump"))
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path / "cache"))
    s, d, bm, bn = 64, 16, 64, 32  # a specialization no other test compiles (so it is dumped)
    _run_flash(rng, s, d, bm, bn)
    (plan_file,) = (tmp_path / "dump").glob("*.plan")
    ir_text = plan_file.with_suffix(".ir").read_text()
    plan = plan_file.read_text()
    ptx = plan_file.with_suffix(".ptx").read_text()

    # Every tile the loop body computes, but the two operand loads (cp.async stages) and the
    # transpose of k, is held in mma fragments: the scores s, their mask, p, its f16 copy,
    # the row max/sum vectors and the rescaled accumulator.
    body = ir_text[ir_text.index(" = for ") :]
    body = body[: body.index("\n  }")]
    defs = re.findall(r"^\s+(%\d+) = (\w+)(?:\[[^\]]*\])? .*: (\w+<[\dx]+>)$", body, re.M)
    held = dict(re.findall(r"^\s+(%\d+) \S+: (.*)$", plan, re.M))
    tiles = [(name, opname) for name, opname, _ in defs]
    # One warp per 16-row band of the accumulators: no warp holds copies of another's.
    warps = bm // 16
    assert f"\nthreads {32 * warps}\n" in plan
    assert len(tiles) > 25
    for name, opname in tiles:
        if opname in ("load", "permute"):
            assert "fragments" not in held[name], (name, held[name])
        else:
            assert re.fullmatch(rf"mma (acc|rows|cols) fragments, warps {warps}x1", held[name]), (
                name,
                opname,
                held[name],
            )
    assert re.search(r"carried %\d+: fragments of mma %\d+", plan)

    # The loop body: no shared-memory load or store (no scores or accumulator round trip,
    # q stored once before the loop), one barrier (the cp.async stage handoff); two mmas of
    # 16 m16n8k16 each over 8 warps, row reductions as quad shuffles.
    loop = "\n".join(_loop_lines(ptx))
    assert not re.search(r"\b(st|ld)\.shared", loop), loop
    assert loop.count("bar.sync") == 1
    slots = 1  # M slots per warp
    assert loop.count("mma.sync.aligned.m16n8k16") == slots * (
        bn // 8 * d // 16 + d // 8 * bn // 16
    )
    assert loop.count("shfl.sync.bfly") == slots * 2 * 2 * 2  # max and sum, rows g, g+8


@ct.kernel
def row_stats(
    out: Mut[Tensor[f32, BM, TWO]],
    a: Tensor[f16, Dyn, Dyn],
    b: Tensor[f16, Dyn, Dyn],
    BN: Constant[int],
    BK: Constant[int],
) -> None:
    """Per row, over the K blocks of a @ b: the sum of all partial products' row sums and
    the largest partial product's row maximum, reduced on fragments and carried as row
    vectors (column 0: sum, column 1: max)."""
    bm = out.shape[0]
    total = ct.zeros((bm,), f32)
    top = ct.full((bm,), float("-inf"), f32)
    for kk in range(ct.cdiv(a.shape[1], BK)):
        s = ct.mma(
            ct.load(a, (ct.bid(0), kk), (bm, BK)),
            ct.load(b, (kk, 0), (BK, BN)),
            ct.zeros((bm, BN), f32),
        )
        total = total + ct.sum(s, 1)
        top = ct.maximum(top, ct.max(s, 1))
    first = ct.reshape(ct.arange(2, ct.i32), (1, 2)) == 0
    out.store(ct.where(first, ct.expand_dims(total, 1), ct.expand_dims(top, 1)))


def test_row_vectors_carried_in_fragments(rng: np.random.Generator) -> None:
    """Row sum and row max of each K block's mma product, carried across the loop as rows
    fragments and converted back once after it; ragged in M (40 rows, blocks of 32) and K
    (40, steps of 16)."""
    ct.set_backend("sim")
    m, kk, n, bk = 40, 40, 16, 16
    a = rng.standard_normal((m, kk)).astype(np.float16)
    b = rng.standard_normal((kk, n)).astype(np.float16)
    out = ct.full((m, 2), np.nan, f32)
    (op, *_) = row_stats(out.partition((32, 2)), ct.from_numpy(a), ct.from_numpy(b), n, bk).sync()
    got = op.unpartition().to_numpy()
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    parts = [a64[:, s : s + bk] @ b64[s : s + bk] for s in range(0, kk, bk)]
    np.testing.assert_allclose(got[:, 0], sum(p.sum(1) for p in parts), atol=1e-3)
    np.testing.assert_allclose(got[:, 1], np.max([p.max(1) for p in parts], axis=0), atol=1e-3)


def _row_sum_loop(store_inside: bool, feed_f32: bool) -> ir.Kernel:
    """rows += rowsum(a @ b) over 4 K steps; optionally the product is also stored inside
    the loop, or fed (f32, not 16-bit) as the A operand of a second mma."""
    b = ir.Builder()
    params: tuple[ir.Param, ...] = (
        ir.TensorParam("a", ir.f32 if feed_f32 else ir.f16, 2, False, (None, None), 16),
        ir.TensorParam("b", ir.f32 if feed_f32 else ir.f16, 2, False, (None, None), 16),
        ir.TensorParam("c", ir.f32, 2, True, (32, 16), 16),
    )
    dt = ir.f32 if feed_f32 else ir.f16
    zero, one, steps = b.constant(0, ir.i32), b.constant(1, ir.i32), b.constant(4, ir.i32)
    rows0 = b.broadcast(b.constant(0.0, ir.f32), (32, 1))
    loop = b.for_loop(zero, steps, one, [rows0])
    with b.inside(loop.body):
        k, rows = loop.body.args
        s = b.mma(
            b.load(0, dt, [zero, k], (32, 16), 0),
            b.load(1, dt, [k, zero], (16, 16), 0),
            b.broadcast(b.constant(0.0, ir.f32), (32, 16)),
        )
        if store_inside:
            b.store(2, [zero, zero], s)
        if feed_f32:
            s = b.mma(s, b.load(1, dt, [k, zero], (16, 16), 0), s)
        b.yield_([b.binary("add", rows, b.reduce("sum", s, 1))])
    b.store(2, [zero, zero], b.broadcast(loop.results[0], (32, 16)))
    return ir.Kernel("row_sum_loop", params, (None, None, None), b.region)


@pytest.mark.parametrize(
    ("store_inside", "feed_f32", "expect"),
    [(False, False, True), (True, False, False), (False, True, False)],
)
def test_family_is_kept_whole_or_not_at_all(
    store_inside: bool, feed_f32: bool, expect: bool
) -> None:
    """The pass alone: a family stays in fragments only if every op touching it runs on
    fragments: a store of the product in the loop, or an f32 product fed to a tf32 mma's A
    (not a register permutation of its fragments), keep the whole family blocked."""
    kernel = _row_sum_loop(store_inside, feed_f32)
    ir.verify(kernel)
    plan = plan_lowering(kernel, Target(80), def_use(kernel))
    loop = next(op for op in kernel.body.ops if isinstance(op, o.ForOp))
    frags = plan.fragment_plan
    carried = loop.body.args[1]
    mma = next(op for op in loop.body.ops if isinstance(op, o.MmaOp))
    if expect:
        assert {frags.values[v].kind for v in (carried, mma.result)} == {"rows", "acc"}
        assert all(f.grid.wn == 1 for f in frags.values.values())
        assert frags.grids[mma].wn == 1
    else:
        assert not frags.values and not frags.grids
