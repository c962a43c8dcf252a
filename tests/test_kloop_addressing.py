"""The cp.async pipeline of an mma loop advances the addresses of loads whose index is affine
in the induction variable (one 64-bit add per tile and iteration) instead of recomputing
them; loads with other indices are recomputed. The loop holds one copy of its body per
stage, each reading and refilling fixed stages (constant offsets, no ring arithmetic). All
match NumPy on sim at ragged shapes and every trip count, ascending and descending."""

from __future__ import annotations

import re
from typing import TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Constant, Dyn, Mut, Tensor, f16, f32

BM = TypeVar("BM")
BN = TypeVar("BN")


@ct.kernel
def gemm_order(
    c: Mut[Tensor[f32, BM, BN]],
    a: Tensor[f16, Dyn, Dyn],
    b: Tensor[f16, Dyn, Dyn],
    BK: Constant[int],
    ORDER: Constant[int],
) -> None:
    """c = a @ b over the K blocks in order (ORDER 0), in reverse (1: a descending loop, an
    affine index with a negative step), or permuted as (3 kk) mod nk (2: not affine)."""
    bm, bn = c.shape[0], c.shape[1]
    nk = ct.cdiv(a.shape[1], BK)
    acc = ct.zeros((bm, bn), f32)
    if ORDER == 1:
        for kk in range(nk - 1, -1, -1):
            ta = ct.load(a, (ct.bid(0), kk), (bm, BK))
            acc = ct.mma(ta, ct.load(b, (kk, ct.bid(1)), (BK, bn)), acc)
    else:
        for kk in range(nk):
            kp = kk
            if ORDER == 2:
                kp = (3 * kk) % nk
            ta = ct.load(a, (ct.bid(0), kp), (bm, BK))
            acc = ct.mma(ta, ct.load(b, (kp, ct.bid(1)), (BK, bn)), acc)
    c.store(acc)


@pytest.mark.parametrize("order", [0, 1, 2])
@pytest.mark.parametrize(("m", "n", "k"), [(40, 24, 72), (32, 32, 64)])
def test_k_order_matches_numpy_on_sim(
    rng: np.random.Generator, order: int, m: int, n: int, k: int
) -> None:
    """72 = 4.5 blocks of 16 (ragged, zero-filled past K); permuted order: 3 kk mod 5."""
    ct.set_backend("sim")
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = ct.full((m, n), np.nan, f32)
    (cp, *_) = gemm_order(
        c.partition((32, 32)), ct.from_numpy(a), ct.from_numpy(b), 16, order
    ).sync()
    got = cp.unpartition().to_numpy()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), atol=2e-3)


@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5, 7])
def test_every_trip_count_matches_numpy_on_sim(
    rng: np.random.Generator, order: int, steps: int
) -> None:
    """The loop's 3 copies of the body per trip (3 stages) exit after any of them: K steps
    of 16 from 1 to 7 (the last ragged), each trip count modulo 3."""
    ct.set_backend("sim")
    m, n, k = 40, 24, 16 * steps - 5
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = ct.full((m, n), np.nan, f32)
    (cp, *_) = gemm_order(
        c.partition((32, 32)), ct.from_numpy(a), ct.from_numpy(b), 16, order
    ).sync()
    got = cp.unpartition().to_numpy()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), atol=2e-3)


def _loop_body(order: int) -> str:
    ct.set_backend("sim")
    a = ct.empty((256, 256), f16)
    c = ct.empty((256, 256), f32).partition((64, 64))
    ptx = gemm_order.ptx(c, a, a, 32, order, target=80)
    top = re.search(r"^\$__loop_\d+:$", ptx, re.M)
    end = re.search(r"^\$__done_\d+:$", ptx, re.M)
    assert top is not None and end is not None
    return ptx[top.end() : end.start()]


@pytest.mark.parametrize("order", [0, 1])
def test_affine_loads_advance_their_addresses(order: int) -> None:
    """In the K loop, each staged tile's address is advanced by one 64-bit add: no 64-bit
    address arithmetic is recomputed from the index (cvt.u64, mad/mul.lo.u64), and the
    index ops are not emitted again."""
    body = _loop_body(order)
    copies = body.count("cp.async.commit_group")  # one per copy of the body
    assert copies == 3  # the default 3 stages
    assert body.count("cp.async.cg.shared.global") == 2 * copies
    assert body.count("add.s64") == 2 * copies  # one per tile
    assert not re.search(r"cvt\.u64\.u32|(mad|mul)\.lo\.u64", body), body


def test_other_loads_recompute_their_addresses() -> None:
    body = _loop_body(2)
    assert "add.s64" not in body
    assert re.search(r"mad\.lo\.u64", body)


def _issue_section(body: str) -> str:
    """The loop body from its top to the commit of the copies it issues."""
    return body[: body.index("cp.async.commit_group")]


@pytest.mark.parametrize("order", [0, 1])
def test_affine_copies_compute_only_what_varies(order: int) -> None:
    """Per iteration an affine tile's copies add the stage to a shared address computed
    before the loop (no swizzle arithmetic: xor, shifts, masks, multiplies) and check, per
    tile, its index and the farthest copy of the thread along the dim that varies (not the
    bounds of M and N again, nor one check per copy)."""
    issue = _issue_section(_loop_body(order))
    copies = issue.count("cp.async.cg.shared.global")
    assert copies == 2
    assert not re.search(r"\b(xor|shl|shr|and)\.b32|mad\.lo\.u32|mul\.lo", issue), issue
    assert len(re.findall(r"\bsetp\.", issue)) == 2 * 2 + 1  # + the loop's exit test


@pytest.mark.parametrize("order", [0, 1])
def test_copies_at_an_edge_are_checked_out_of_line(order: int) -> None:
    """In the loop, a thread whose copies all lie inside the tensors makes them unchecked
    (no zero-fill size operand); the checked copies (zero-filling past an edge) are a block
    placed after the loop that branches back."""
    ct.set_backend("sim")
    a = ct.empty((256, 256), f16)
    c = ct.empty((256, 256), f32).partition((64, 64))
    ptx = gemm_order.ptx(c, a, a, 32, order, target=80)
    issue = _issue_section(_loop_body(order))
    assert not re.search(r"cp\.async\.cg\.shared\.global [^;]*, 16, %r", issue), issue
    checked = re.search(r"^(\$__checked_\d+):$(.*?)bra\.uni (\$__copied_\d+);", ptx, re.M | re.S)
    assert checked is not None
    assert ptx.index("$__done_") < checked.start()
    assert len(re.findall(r"cp\.async\.cg\.shared\.global [^;]*, 16, %r", checked.group(2))) == 2
    assert "@!%p" in issue and checked.group(1) in issue


@pytest.mark.parametrize("order", [0, 1])
def test_fragment_addresses_are_computed_before_the_loop(order: int) -> None:
    """The ldmatrix addresses of the staged tiles are lane offsets computed before the loop
    plus the stage read: the loop body does no lane or swizzle arithmetic at all."""
    body = _loop_body(order)
    assert body.count("ldmatrix") == 6 * body.count("cp.async.commit_group")
    assert not re.search(r"\b(xor|shl|shr|and)\.b32|mad\.lo|mul\.lo", body), body


@pytest.mark.parametrize("order", [0, 1])
def test_each_copy_of_the_body_has_constant_stages(order: int) -> None:
    """Copy u of the body reads stage u and refills stage u - 1 (mod 3), both set as
    constants: the loop does no arithmetic on the stage offsets (no add, compare and select
    wrapping them around the ring)."""
    body = _loop_body(order)
    stages = [
        (int(r), int(w))
        for r, w in re.findall(r"mov\.u32 %r\d+, (\d+);\n\tmov\.u32 %r\d+, (\d+);", body)
    ]
    assert len(stages) == 3, stages
    size = stages[1][0] - stages[0][0]
    assert size > 0 and [(r - stages[0][0]) // size for r, _ in stages] == [0, 1, 2]
    assert [(w - stages[0][0]) // size for _, w in stages] == [2, 0, 1]
    assert not re.search(r"selp\.b32|setp\.eq\.u32", body), body


def test_wide_tiles_copy_few_rows_per_thread() -> None:
    """Rows of 128 bytes (A, 128x64) and 512 (B, 64x256) over 256 threads: a row of copying
    threads covers 64 bytes (whole 32-byte sectors), so a thread copies A's tile from 2 rows
    (not 4) and B's from 1 (not 8), its copies of a row one address plus immediates: one
    multiply-add per iteration for A's second row, none for B."""
    ct.set_backend("sim")
    a = ct.empty((256, 256), f16)
    c = ct.empty((256, 256), f32).partition((128, 256))
    ptx = gemm_order.ptx(c, a, a, 64, 0, target=80)
    top = re.search(r"^\$__loop_\d+:$", ptx, re.M)
    assert top is not None
    issue = _issue_section(ptx[top.end() :])
    copies = re.findall(r"cp\.async\.cg\.shared\.global \[(%r\d+)\+?(\d*)\], \[(%rd\d+)", issue)
    assert len(copies) == 4 + 8  # A 128x64, B 64x256 over 256 threads
    assert len({src for _, _, src in copies[:4]}) == 2, copies
    assert len({src for _, _, src in copies[4:]}) == 1, copies
    assert len(re.findall(r"mad\.wide\.u32", issue)) == 1


def test_wide_tiles_match_numpy_on_sim(rng: np.random.Generator) -> None:
    ct.set_backend("sim")
    m, n, k = 130, 250, 136
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = ct.full((m, n), np.nan, f32)
    (cp, *_) = gemm_order(c.partition((128, 256)), ct.from_numpy(a), ct.from_numpy(b), 64, 0).sync()
    got = cp.unpartition().to_numpy()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), atol=2e-3)


def test_narrow_rows_are_copied_a_sector_per_thread_row() -> None:
    """A 128x32 f16 A tile (64-byte rows) over 128 threads (4 warps): two threads cover a
    32-byte sector of a row, so a thread copies its 4 chunks from 2 rows (not 4), and B's
    32x128 tile (256-byte rows) from 1: with the stage an immediate, one 64-bit add per row
    past the first and per tile is all the copies' address arithmetic."""
    from cutile_py_kernels.gemm import _gemm_kernel

    ct.set_backend("sim")
    kernel = _gemm_kernel(f16, f32, False, False, 4, 4)
    a = ct.empty((512, 512), f16)
    c = ct.empty((512, 512), f32).partition((128, 128))
    ptx = kernel.ptx(c, a, a, 32, target=80)
    top = re.search(r"^\$__loop_\d+:$", ptx, re.M)
    assert top is not None
    issue = _issue_section(ptx[top.end() :])
    copies = re.findall(r"cp\.async\.cg\.shared\.global \[(%r\d+)\+?(\d*)\], \[(%rd\d+)", issue)
    assert len(copies) == 4 + 4
    assert len({src for _, _, src in copies[:4]}) == 2, copies
    assert len({src for _, _, src in copies[4:]}) == 1, copies
