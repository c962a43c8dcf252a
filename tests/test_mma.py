"""`ct.mma` and `@` on tensor cores: K loops over masked tiles against NumPy on sim and
interpret, tf32 rounding, the type rule's errors, the swizzled shared layout, and the PTX
(ldmatrix, mma.sync; assembled for sm_80 and sm_90 without spills; SASS where possible)."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, bf16, f16, f32
from cutile_py.ir.dtypes import round_to
from cutile_py.ir.reference import mma as ref_mma
from cutile_py.ir.reference import round_to_tf32
from cutile_py.lower.fragments import SharedTile, warp_grid
from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available

if TYPE_CHECKING:
    ConstInt = int
else:
    ConstInt = ct.Constant[int]

BM = TypeVar("BM")
BN = TypeVar("BN")
Elem = f32  # rebound per dtype by the kernel makers (f32 for mypy)
DTYPES = {"f16": f16, "bf16": bf16, "f32": f32}
#: Relative tolerance per operand dtype (of the result's scale, sum |a| |b| + |acc|).
RTOL = {"f16": 1e-2, "bf16": 1e-2, "f32": 1e-3}


@pytest.fixture(params=["interpret", "sim", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest) -> str:
    ct.set_backend(str(request.param))
    return str(request.param)


def make_gemm(dt: type[ct.DType], stages: int | None = None) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel(stages=stages)
    def gemm(
        c: Mut[Tensor[f32, BM, BN]],
        a: Tensor[Elem, Dyn, Dyn],
        b: Tensor[Elem, Dyn, Dyn],
        BK: ConstInt,
    ) -> None:
        acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
        for kk in range(ct.num_tiles(a, 1, BK)):
            ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
            tb = ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1]))
            acc = ct.mma(ta, tb, acc)
        c.store(acc)

    return gemm


#: The line of `make_gemm`'s K loop (where pipeline errors point).
_lines, _first = inspect.getsourcelines(make_gemm)
LOOP_LINE = _first + next(i for i, t in enumerate(_lines) if t.lstrip().startswith("for kk"))


def make_matmul(dt: type[ct.DType]) -> Any:
    """One K tile: `a @ b` (zero accumulator) plus `ct.mma` onto a loaded accumulator."""
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841

    @ct.kernel
    def matmul(
        c: Mut[Tensor[f32, BM, BN]],
        d: Mut[Tensor[f32, BM, BN]],
        a: Tensor[Elem, Dyn, Dyn],
        b: Tensor[Elem, Dyn, Dyn],
        acc: Tensor[f32, Dyn, Dyn],
        BK: ConstInt,
    ) -> None:
        ta = ct.load(a, (ct.bid(0), 0), (c.shape[0], BK))
        tb = ct.load(b, (0, ct.bid(1)), (BK, c.shape[1]))
        c.store(ta @ tb)
        d.store(ct.mma(ta, tb, ct.load_tile_like(acc, d)))

    return matmul


GEMM = {name: make_gemm(dt) for name, dt in DTYPES.items()}
MATMUL = {name: make_matmul(dt) for name, dt in DTYPES.items()}


def operand(rng: np.random.Generator, shape: tuple[int, int], dt: type[ct.DType]) -> np.ndarray:
    return np.asarray(round_to(rng.standard_normal(shape).astype(np.float32), dt))


def check(got: np.ndarray, a: np.ndarray, b: np.ndarray, acc: np.ndarray, name: str) -> None:
    """Every element within RTOL of the result's scale; no poison left."""
    want = ref_mma(a, b, acc, DTYPES[name])
    scale = np.abs(a) @ np.abs(b) + np.abs(acc) + 1e-30
    err = np.abs(got.astype(np.float64) - want) / scale
    assert not np.isnan(got).any(), "unwritten (poisoned) outputs"
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert err.max() <= RTOL[name], f"{name}: at {worst} got {got[worst]}, want {want[worst]}"


# (dtype, M, N, K, tile M, tile N, tile K): edge tiles in every dim; clamped warp slots
# (48 x 24: 3 x 3 fragments over 4 warps); operands and accumulator sharing one region of
# shared memory (128 x 64 with K tile 64); 8 warps (64 x 64).
CASES = [
    ("f16", 40, 24, 40, 32, 16, 16),
    ("bf16", 33, 20, 50, 16, 16, 32),
    ("f32", 40, 24, 20, 32, 16, 8),
    ("f16", 50, 30, 40, 48, 24, 16),
    ("bf16", 130, 64, 70, 128, 64, 64),
    ("f32", 70, 72, 24, 64, 64, 16),
    ("f16", 16, 8, 16, 16, 8, 16),
    # A 128 x 128 f32 accumulator (64 KiB) leaves fragments in two row bands.
    ("f16", 200, 136, 72, 128, 128, 32),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_mma_k_loop(backend: str, rng: np.random.Generator, case: tuple[Any, ...]) -> None:
    name, m, n, k, bm, bn, bk = case
    dt = DTYPES[name]
    a, b = operand(rng, (m, k), dt), operand(rng, (k, n), dt)
    out = ct.full((m, n), np.nan, f32)
    result = GEMM[name](out.partition((bm, bn)), ct.from_numpy(a, dt), ct.from_numpy(b, dt), bk)
    got = np.asarray(result.sync()[0].unpartition().to_numpy())
    check(got, a, b, np.zeros((m, n), np.float32), name)


def make_gemm_variant(dt: type[ct.DType], variant: str) -> Any:
    """K loops in every shape the pipeline meets: `padded` loads (padding 1 would add
    to the sums, so the kernel pads A with 0 explicitly and B with 1: its loads stay in
    registers), `transposed` B (loaded (N, K), N rows in shared memory), `a_transposed`
    (A given (K, M), loaded (BK, BM) and transposed: K rows in shared memory), `observed`
    accumulators (read in the loop beyond the mma: they stay blocked)."""
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841

    @ct.kernel
    def padded(
        c: Mut[Tensor[f32, BM, BN]],
        a: Tensor[Elem, Dyn, Dyn],
        b: Tensor[Elem, Dyn, Dyn],
        BK: ConstInt,
    ) -> None:
        acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
        for kk in range(ct.num_tiles(a, 1, BK)):
            ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
            tb = ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1]), padding=1.0)
            acc = ct.mma(ta, tb, acc)
        c.store(acc)

    @ct.kernel
    def transposed(
        c: Mut[Tensor[f32, BM, BN]],
        a: Tensor[Elem, Dyn, Dyn],
        bt: Tensor[Elem, Dyn, Dyn],
        BK: ConstInt,
    ) -> None:
        acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
        for kk in range(ct.num_tiles(a, 1, BK)):
            ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
            tb = ct.load(bt, (ct.bid(1), kk), (c.shape[1], BK))
            acc = ct.mma(ta, tb.T, acc)
        c.store(acc)

    @ct.kernel
    def a_transposed(
        c: Mut[Tensor[f32, BM, BN]],
        at: Tensor[Elem, Dyn, Dyn],
        b: Tensor[Elem, Dyn, Dyn],
        BK: ConstInt,
    ) -> None:
        acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
        for kk in range(ct.num_tiles(at, 0, BK)):
            ta = ct.load(at, (kk, ct.bid(0)), (BK, c.shape[0]))
            tb = ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1]))
            acc = ct.mma(ta.T, tb, acc)
        c.store(acc)

    @ct.kernel
    def observed(
        c: Mut[Tensor[f32, BM, BN]],
        a: Tensor[Elem, Dyn, Dyn],
        b: Tensor[Elem, Dyn, Dyn],
        BK: ConstInt,
    ) -> None:
        acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
        biggest: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
        for kk in range(ct.num_tiles(a, 1, BK)):
            ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
            tb = ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1]))
            acc = ct.mma(ta, tb, acc)
            biggest = ct.maximum(biggest, acc)
        c.store(acc + 0.0 * biggest)

    variants = {"padded": padded, "transposed": transposed, "a_transposed": a_transposed}
    return {**variants, "observed": observed}[variant]


@pytest.mark.parametrize("variant", ["padded", "transposed", "a_transposed", "observed"])
@pytest.mark.parametrize("name", ["f16", "f32"])
def test_partly_pipelined_k_loops(
    backend: str, rng: np.random.Generator, name: str, variant: str
) -> None:
    dt = DTYPES[name]
    m, n, k, bm, bn, bk = 40, 24, 40, 32, 16, 16
    a, b = operand(rng, (m, k), dt), operand(rng, (k, n), dt)
    kernel = make_gemm_variant(dt, variant)
    out = ct.full((m, n), np.nan, f32)
    b_arg = np.ascontiguousarray(b.T) if variant == "transposed" else b
    a_arg = np.ascontiguousarray(a.T) if variant == "a_transposed" else a
    # Padded with 1 past K, B adds sum_k' a[i, k'] over A's zero padding: nothing.
    result = kernel(out.partition((bm, bn)), ct.from_numpy(a_arg, dt), ct.from_numpy(b_arg, dt), bk)
    got = np.asarray(result.sync()[0].unpartition().to_numpy())
    check(got, a, b, np.zeros((m, n), np.float32), name)


@ct.kernel
def gemm_and_row_sums(
    c: Mut[Tensor[f32, BM, BN]],
    s: Mut[Tensor[f32, BM, BN]],
    a: Tensor[f16, Dyn, Dyn],
    b: Tensor[f16, Dyn, Dyn],
    BK: ConstInt,
) -> None:
    """A pipelined K loop whose body also reduces (through shared memory): that scratch
    must not land in the stages the cp.async copies are filling."""
    acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
    total: ct.Tile = ct.zeros((c.shape[0], 1), f32)
    for kk in range(ct.num_tiles(a, 1, BK)):
        ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
        tb = ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1]))
        acc = ct.mma(ta, tb, acc)
        again = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
        total = total + ct.sum(again.astype(f32), axis=1, keepdims=True)
    c.store(acc)
    s.store(ct.broadcast_to(total, (c.shape[0], c.shape[1])))


@ct.kernel
def scaled_gemm_and_row_sums(
    c: Mut[Tensor[f32, BM, BN]],
    s: Mut[Tensor[f32, BM, BN]],
    a: Tensor[f16, Dyn, Dyn],
    b: Tensor[f16, Dyn, Dyn],
    BK: ConstInt,
) -> None:
    """A computed (register) operand beside a staged one, and a reduction right after the
    mma: every warp must be done reading the operand tile before the reduction's scratch
    overwrites it (the race detector checks)."""
    acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
    total: ct.Tile = ct.zeros((c.shape[0], 1), f32)
    for kk in range(ct.num_tiles(a, 1, BK)):
        ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK)) * 1.0
        tb = ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1]))
        acc = ct.mma(ta, tb, acc)
        again = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
        total = total + ct.sum(again.astype(f32))  # across warps: through shared memory
    c.store(acc)
    s.store(ct.broadcast_to(total, (c.shape[0], c.shape[1])))


@pytest.mark.parametrize("staged_a", [True, False])
def test_shared_scratch_in_a_pipelined_body(
    backend: str, rng: np.random.Generator, staged_a: bool
) -> None:
    m, n, k = 50, 40, 90
    a, b = operand(rng, (m, k), f16), operand(rng, (k, n), f16)
    c, s = ct.full((m, n), np.nan, f32), ct.full((m, n), np.nan, f32)
    kernel = gemm_and_row_sums if staged_a else scaled_gemm_and_row_sums
    op = kernel(
        c.partition((32, 32)),
        s.partition((32, 32)),
        ct.from_numpy(a, f16),
        ct.from_numpy(b, f16),
        32,
    )
    pc, ps, *_ = op.sync()
    check(np.asarray(pc.unpartition().to_numpy()), a, b, np.zeros((m, n)), "f16")
    sums = np.asarray(ps.unpartition().to_numpy())
    want = a.astype(np.float64).sum(axis=1, keepdims=True)
    if not staged_a:  # the whole (32, K) block of rows, summed
        want = np.concatenate(
            [np.full((min(32, m - i), 1), want[i : i + 32].sum()) for i in (0, 32)]
        )
    np.testing.assert_allclose(sums, np.broadcast_to(want, (m, n)), rtol=1e-5, atol=1e-3)


def test_empty_k_loop_gives_the_initial_accumulator(backend: str) -> None:
    """K = 0: the loop never runs, the prefetched (zero-filled) stages are drained."""
    out = ct.full((32, 16), np.nan, f32)
    a, b = np.zeros((32, 0), np.float16), np.zeros((0, 16), np.float16)
    result = GEMM["f16"](out.partition((32, 16)), ct.from_numpy(a, f16), ct.from_numpy(b, f16), 16)
    np.testing.assert_array_equal(result.sync()[0].unpartition().to_numpy(), 0.0)


@pytest.mark.parametrize("name", ["f16", "bf16", "f32"])
def test_matmul_operator_and_accumulator(backend: str, rng: np.random.Generator, name: str) -> None:
    dt = DTYPES[name]
    m, n, bm, bn, bk = 45, 20, 32, 16, 16
    a, b = operand(rng, (m, bk - 3), dt), operand(rng, (bk - 3, n), dt)
    acc = rng.standard_normal((m, n)).astype(np.float32)
    c, d = ct.full((m, n), np.nan, f32), ct.full((m, n), np.nan, f32)
    op = MATMUL[name](
        c.partition((bm, bn)),
        d.partition((bm, bn)),
        ct.from_numpy(a, dt),
        ct.from_numpy(b, dt),
        ct.from_numpy(acc),
        bk,
    )
    pc, pd, *_ = op.sync()
    check(np.asarray(pc.unpartition().to_numpy()), a, b, np.zeros_like(acc), name)
    check(np.asarray(pd.unpartition().to_numpy()), a, b, acc, name)


def test_tf32_rounds_to_nearest_away(backend: str) -> None:
    """1 + 2^-11 is a tie between tf32 neighbours: rna gives 1 + 2^-10; 1 + 2^-12 rounds
    down to 1. Exact sums of small integers times those show which rounding ran."""
    m, n, k = 16, 8, 8
    a = np.full((m, k), 1 + 2.0**-11, np.float32)
    a[:, 1::2] = 1 + 2.0**-12
    b = np.ones((k, n), np.float32)
    out = ct.full((m, n), np.nan, f32)
    got = GEMM["f32"](out.partition((m, n)), ct.from_numpy(a), ct.from_numpy(b), k).sync()[0]
    want = 4 * (1 + 2.0**-10) + 4 * 1.0
    np.testing.assert_array_equal(np.asarray(got.unpartition().to_numpy()), np.float32(want))
    np.testing.assert_array_equal(
        round_to_tf32(np.array([1 + 2.0**-11], np.float32)), [1 + 2.0**-10]
    )


# -- the type rule -----------------------------------------------------------------------------
def make_bad(shape_a: tuple[int, int], shape_b: tuple[int, int], db: type[ct.DType]) -> Any:
    if not TYPE_CHECKING:
        Elem = db  # noqa: F841

    @ct.kernel
    def bad(
        c: Mut[Tensor[f32, BM, BN]],
        a: Tensor[f16, Dyn, Dyn],
        b: Tensor[Elem, Dyn, Dyn],
        MA: ConstInt,
        KA: ConstInt,
        KB: ConstInt,
        NB: ConstInt,
    ) -> None:
        ta = ct.load(a, (0, 0), (MA, KA))
        tb = ct.load(b, (0, 0), (KB, NB))
        c.store(ct.mma(ta, tb, ct.zeros((MA, NB), f32)))

    return bad


@pytest.mark.parametrize(
    ("shape_a", "shape_b", "db", "words"),
    [
        ((16, 16), (32, 8), f16, ["a (16, 16), b (32, 8)", "(M, K), b (K, N)"]),
        ((16, 16), (16, 8), f32, ["both f16", "f16 and f32"]),
        ((24, 16), (16, 8), f16, ["M a multiple of 16", "a (24, 16)"]),
        ((16, 8), (8, 8), f16, ["K of 16", "a (16, 8)"]),
        ((16, 16), (16, 12), f16, ["N of 8", "b (16, 12)"]),
    ],
)
def test_type_rule_errors(
    shape_a: tuple[int, int], shape_b: tuple[int, int], db: type[ct.DType], words: list[str]
) -> None:
    kernel = make_bad(shape_a, shape_b, db)
    m, n = shape_a[0], shape_b[1]
    args = (
        ct.PartitionSpec((m, n), (m, n), f32),
        ct.TensorSpec((64, 64), f16),
        ct.TensorSpec((64, 64), db),
        *shape_a,
        *shape_b,
    )
    with pytest.raises(ct.CompileError) as info:
        kernel.ir(*args)
    text = str(info.value)
    assert "test_mma.py" in text
    for w in words:
        assert w in text, text


def test_matmul_needs_2d_tiles() -> None:
    @ct.kernel
    def vec(c: Mut[Tensor[f32, BM]], a: Tensor[f16, Dyn]) -> None:
        t = ct.load(a, (0,), (16,))
        c.store((t @ t).reshape((1,)))

    with pytest.raises(ct.CompileError, match="@ needs 2-D tiles"):
        vec.ir(ct.PartitionSpec((16,), (16,), f32), ct.TensorSpec((16,), f16))


def test_interpreter_applies_the_type_rule() -> None:
    from cutile_py.language.tile import Tile

    t = Tile(np.zeros((16, 12), np.float32), f16)
    with pytest.raises(TypeError, match="K of 16"):
        ct.mma(t, Tile(np.zeros((12, 8), np.float32), f16), Tile(np.zeros((16, 8)), f32))


# -- the shared layout and the warp split ----------------------------------------------------
@pytest.mark.parametrize("cols_bytes", [16, 32, 48, 64, 96, 128, 256, 384])
def test_swizzle_is_a_bijection_and_conflict_free(cols_bytes: int) -> None:
    """Every 8 consecutive rows at one logical chunk land in 8 different 16-byte bank groups
    (an ldmatrix matrix, or a row-wise store sweep); each row's chunks are permuted in place."""
    tile = SharedTile(0, 64, cols_bytes // 2, 2, True)
    chunks = cols_bytes // 16
    s, r = tile.xor_width, tile.rows_per_step

    def chunk_at(row: int, c: int) -> int:
        return c ^ ((row // r) % s)

    for row in range(64):
        assert sorted(chunk_at(row, c) for c in range(chunks)) == list(range(chunks))
    for row0 in range(0, 64, 8):
        for c in range(chunks):
            groups = {(row * chunks + chunk_at(row, c)) % 8 for row in range(row0, row0 + 8)}
            assert len(groups) == 8, (cols_bytes, row0, c)


def test_warp_grid_balances_fragments() -> None:
    g = warp_grid(8, 4, 8)  # a 64 x 64 accumulator over 8 warps
    assert (g.wm, g.wn, g.sm, g.sn) == (2, 4, 2, 2)
    g = warp_grid(4, 1, 1)  # one fragment: three warps idle
    assert g.sm * g.sn == 1


# -- PTX, assembly, SASS ---------------------------------------------------------------------
PTX_CASES = [
    ("f16", 64, 64, 32),
    ("bf16", 128, 64, 64),
    ("f32", 64, 64, 16),
    ("f16", 48, 24, 16),
    ("f32", 16, 8, 8),
]


def gemm_ptx(name: str, bm: int, bn: int, bk: int, target: ct.Target) -> str:
    dt = DTYPES[name]
    return str(
        GEMM[name].ptx(
            ct.PartitionSpec((256, 256), (bm, bn), f32),
            ct.TensorSpec((256, 256), dt),
            ct.TensorSpec((256, 256), dt),
            bk,
            target=target,
        )
    )


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
@pytest.mark.parametrize("case", PTX_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("sm", [80, 90])
def test_ptx_assembles_without_spills(case: tuple[str, int, int, int], sm: int) -> None:
    name, bm, bn, bk = case
    target = ct.Target(sm, arch_specific=False)  # mma.sync (wgmma: tests/test_wgmma.py)
    ptx = gemm_ptx(name, bm, bn, bk, target)
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert ("m16n8k8" if name == "f32" else "m16n8k16") in ptx
    if name == "f32":
        assert "cvt.rna.tf32.f32" in ptx
    else:
        assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x[24]\.trans\.shared\.b16", ptx)
    report = assemble(ptx, target)
    print(f"{name} {bm}x{bn}x{bk} sm_{sm}: {report.registers} registers")
    assert report.spill_free, report.info_log
    assert report.registers <= 128


@pytest.mark.parametrize("variant", ["plain", "transposed", "a_transposed"])
@pytest.mark.parametrize("name", ["f16", "f32"])
def test_k_loop_is_pipelined_with_fragment_accumulators(name: str, variant: str) -> None:
    """In every orientation of A and B, both operands reach shared memory by 16-byte
    cp.async only (no ld.global, no st.shared in the loop), the loop waits on commit groups,
    and the accumulator crosses no shared memory per step. Fragments are read with ldmatrix
    (.trans for 16-bit K-row tiles), or word by word for tf32 K-row tiles: an A given
    (K, M), or a B given (K, N)."""
    dt = DTYPES[name]
    bk = 32 if dt is f16 else 16
    kernel = GEMM[name] if variant == "plain" else make_gemm_variant(dt, variant)
    args = ct.PartitionSpec((256, 256), (64, 64), f32), ct.TensorSpec((256, 256), dt)
    ptx = kernel.ptx(*args, ct.TensorSpec((256, 256), dt), bk, target=ct.Target(80))
    start, end = ptx.index("$__loop_1:"), ptx.index("$__done_2:")
    loop = ptx[start:end]
    # A and B, in each copy of the body (one per stage)
    assert loop.count("cp.async.cg.shared.global") == 2 * loop.count("commit_group"), loop
    assert "cp.async.commit_group" in loop and "cp.async.wait_group" in loop
    assert "st.shared" not in loop and "ld.global" not in loop
    assert "cp.async.wait_all" in ptx[end:]
    k_rows = {"plain": "B", "transposed": "", "a_transposed": "AB"}[variant]
    if dt is f32:
        assert ("ld.shared.b32" in loop) == bool(k_rows)
        assert ("ldmatrix" in loop) == (len(k_rows) < 2)
        assert ".trans" not in loop
    else:
        assert "ld.shared" not in loop
        assert ("ldmatrix.sync.aligned.m8n8.x4.trans" in loop) == bool(k_rows)


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
@pytest.mark.parametrize("sm", [80, 90])
@pytest.mark.parametrize("variant", ["plain", "transposed", "a_transposed"])
@pytest.mark.parametrize("name", ["f16", "f32"])
def test_pipelined_k_loop_assembles_without_spills(name: str, variant: str, sm: int) -> None:
    dt = DTYPES[name]
    bk = 32 if dt is f16 else 16
    kernel = GEMM[name] if variant == "plain" else make_gemm_variant(dt, variant)
    args = ct.PartitionSpec((256, 256), (64, 64), f32), ct.TensorSpec((256, 256), dt)
    target = ct.Target(sm)
    report = assemble(kernel.ptx(*args, ct.TensorSpec((256, 256), dt), bk, target=target), target)
    assert report.spill_free, (sm, report.info_log)


def _shared_wavefronts(lanes: np.ndarray, addrs: np.ndarray, nbytes: int) -> tuple[int, int]:
    """(wavefronts, the fewest possible) of one warp-wide shared access of `nbytes` per lane:
    lanes are served 128 bytes per phase (8 lanes of 16 bytes, or 32 of 4), and a phase
    takes as many wavefronts as the most distinct 4-byte words one of the 32 banks holds."""
    per_phase = min(32, 128 // nbytes)
    got = best = 0
    for warp in np.unique(lanes // 32):
        mine = lanes // 32 == warp
        for phase in range(0, 32, per_phase):
            sel = mine & (lanes % 32 >= phase) & (lanes % 32 < phase + per_phase)
            words = {(int(x) + off) // 4 for x in addrs[sel] for off in range(0, nbytes, 4)}
            if words:
                banks = np.bincount([w % 32 for w in words], minlength=32)
                got += int(banks.max())
                best += -(-len(words) // 32)
    return got, best


@pytest.mark.parametrize("variant", ["plain", "transposed", "a_transposed"])
@pytest.mark.parametrize("name", ["f16", "f32"])
def test_fragment_reads_are_free_of_bank_conflicts(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, name: str, variant: str
) -> None:
    """Run on sim, every ldmatrix and every tf32 word read of an operand fragment takes the
    fewest wavefronts its bytes allow (the swizzles, not a formula of this test, decide)."""
    from cutile_py.sim import spaces

    dt = DTYPES[name]
    m, n, bk = 64, 64, 32 if dt is f16 else 16
    k = 2 * bk
    kernel = GEMM[name] if variant == "plain" else make_gemm_variant(dt, variant)
    a, b = operand(rng, (m, k), dt), operand(rng, (k, n), dt)
    a_arg = np.ascontiguousarray(a.T) if variant == "a_transposed" else a
    b_arg = np.ascontiguousarray(b.T) if variant == "transposed" else b
    seen: dict[str, list[int]] = {}
    load = spaces.Batch.load

    def counted(
        self: spaces.Batch, space: str, lanes: np.ndarray, addrs: np.ndarray, esize: int, nvec: int
    ) -> np.ndarray:
        kind = {(2, 8): "ldmatrix", (4, 1): "word"}.get((esize, nvec))
        if space == "shared" and kind is not None:
            got, best = _shared_wavefronts(lanes, addrs.astype(np.int64), esize * nvec)
            tally = seen.setdefault(kind, [0, 0])
            tally[0] += got
            tally[1] += best
        return load(self, space, lanes, addrs, esize, nvec)

    monkeypatch.setattr(spaces.Batch, "load", counted)
    ct.set_backend("sim")
    out = ct.full((m, n), np.nan, f32).partition((64, 64))
    result = kernel(out, ct.from_numpy(a_arg, dt), ct.from_numpy(b_arg, dt), bk).sync()
    check(np.asarray(result[0].unpartition().to_numpy()), a, b, np.zeros((m, n), np.float32), name)
    assert "ldmatrix" in seen or variant == "a_transposed"
    assert ("word" in seen) == (dt is f32 and variant != "transposed")
    for kind, (got, best) in seen.items():
        assert got == best, f"{kind}: {got} wavefronts where {best} would do"


@pytest.mark.parametrize("stages", [1, 2, 5])
def test_stage_counts(rng: np.random.Generator, stages: int) -> None:
    """Any number of stages, more than the K loop has iterations included, gives the same
    sums; the PTX waits on the group stages - 1 behind."""
    ct.set_backend("sim")
    m, n, k, bm, bn, bk = 40, 24, 72, 32, 16, 16
    a, b = operand(rng, (m, k), f16), operand(rng, (k, n), f16)
    kernel = make_gemm(f16, stages)
    out = ct.full((m, n), np.nan, f32)
    result = kernel(out.partition((bm, bn)), ct.from_numpy(a, f16), ct.from_numpy(b, f16), bk)
    check(np.asarray(result.sync()[0].unpartition().to_numpy()), a, b, np.zeros((m, n)), "f16")
    ptx = kernel.ptx(
        ct.PartitionSpec((m, n), (bm, bn), f32),
        ct.TensorSpec((m, k), f16),
        ct.TensorSpec((k, n), f16),
        bk,
    )
    assert f"cp.async.wait_group {max(stages - 2, 0)};" in ptx


def test_stages_past_the_shared_budget_are_a_clear_error() -> None:
    """8 stages of 128 x 64 and 64 x 128 f16 tiles are 256 KiB (and 128 bytes of mbarriers:
    the A tiles go by TMA on sm_90): more than sm_90's 227."""
    spec = (
        ct.PartitionSpec((256, 256), (128, 128), f32),
        ct.TensorSpec((256, 256), f16),
        ct.TensorSpec((256, 256), f16),
        64,
    )
    with pytest.raises(ct.CompileError, match=r"stages=8 needs 262272 bytes.*232448") as err:
        make_gemm(f16, 8).ptx(*spec, target=ct.Target(90))
    # Located at the K loop of the kernel, the source line shown under it.
    assert err.value.where is not None
    assert (err.value.where.file, err.value.where.line) == (__file__, LOOP_LINE)
    assert "for kk in range(ct.num_tiles(a, 1, BK)):" in str(err.value)
    assert ".extern .shared" in make_gemm(f16, 3).ptx(*spec, target=ct.Target(90))


def _cuobjdump() -> Path | None:
    """cuobjdump with nvdisasm beside it (it disassembles through nvdisasm)."""
    found = shutil.which("cuobjdump")
    candidates = [Path(found)] if found else []
    for site in map(Path, sys.path):
        candidates.extend(site.glob("nvidia/*/bin/cuobjdump"))
    for cand in candidates:
        if (cand.parent / "nvdisasm").exists() or shutil.which("nvdisasm"):
            return cand
    return None


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
@pytest.mark.parametrize("name", ["f16", "f32"])
def test_sass_uses_ldsm_and_hmma(name: str, tmp_path: Path) -> None:
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump and nvdisasm not found (pip nvidia-cuda-cuobjdump, -nvdisasm)")
    target = ct.Target(80)
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(assemble(gemm_ptx(name, 64, 64, 32, target), target).cubin)
    env = {**os.environ, "PATH": f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    sass = subprocess.run(
        [str(tool), "-sass", str(cubin)], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert "LDSM" in sass and "HMMA" in sass, sass[:2000]
