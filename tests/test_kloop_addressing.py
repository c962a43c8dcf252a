"""The cp.async pipeline of an mma loop advances the addresses of loads whose index is affine
in the induction variable (one 64-bit add per tile and iteration) instead of recomputing
them; loads with other indices are recomputed. The loop holds one copy of its body per
stage, each reading and refilling fixed stages (constant offsets, no ring arithmetic). All
match NumPy on sim at ragged shapes and every trip count, ascending and descending."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Constant, Dyn, Mut, Tensor, f16, f32
from cutile_py.host import kernel as kmod
from cutile_py.host.launch import ParamReader
from cutile_py.lower import plan_pipelines
from cutile_py.ptx.target import Target
from cutile_py.runtime.backend import LaunchFailure, ParamValue
from cutile_py.runtime.sim_backend import SimBackend
from tests.support.active_sim import active_sim

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
@pytest.mark.parametrize("cut", [5, 8])
def test_every_trip_count_matches_numpy_on_sim(
    rng: np.random.Generator, order: int, steps: int, cut: int
) -> None:
    """The loop's 3 copies of the body per trip (3 stages) exit after any of them: K steps
    of 16 from 1 to 7 (the last ragged), each trip count modulo 3; K rows of 16-byte
    multiples (`cut` 8) are staged by cp.async, fragments a k step ahead, odd ones not."""
    ct.set_backend("sim")
    m, n, k = 40, 24, 16 * steps - cut
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


@pytest.fixture
def each_step_loaded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Fragments loaded just before each k step's mmas (`PipelinePlan.ahead` off: as the
    plan chooses where registers would not suffice), compiled afresh (neither cache)."""
    monkeypatch.setattr(plan_pipelines, "MAX_REGISTERS", 0)
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path / "cache"))
    kmod._CACHE.clear()
    yield
    kmod._CACHE.clear()  # no kernel compiled here is found by a later test


@pytest.mark.parametrize("order", [0, 1])
def test_affine_copies_compute_only_what_varies(order: int, each_step_loaded: None) -> None:
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
def test_copies_ahead_of_fragments_are_checked_in_line(order: int) -> None:
    """With fragments loaded ahead each copy of the body refills its stage first, each
    cp.async checked in line (a zero-fill size operand), its shared address still computed
    before the loop, no branch to checked copies."""
    body = _loop_body(order)
    issue = _issue_section(body)
    copies = re.findall(r"cp\.async\.cg\.shared\.global [^;]*, 16, %r\d+;", issue)
    assert len(copies) == 2, issue
    assert "ldmatrix" not in issue and "mma" not in issue  # the refill comes first
    assert not re.search(r"\b(xor|shl|shr|and)\.b32|mad\.lo\.u32|mul\.lo", issue), issue
    assert "$__checked_" not in body


@pytest.mark.parametrize("order", [0, 1])
def test_copies_at_an_edge_are_checked_out_of_line(order: int, each_step_loaded: None) -> None:
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


def _body_copies(ptx: str) -> list[str]:
    """The loop body's copies (one per stage), each from its exit test to the next."""
    top = re.search(r"^\$__loop_\d+:$", ptx, re.M)
    end = re.search(r"^\$__done_\d+:$", ptx, re.M)
    assert top is not None and end is not None
    return re.split(r"\n\t@%p\d+ bra\.uni \$__done_\d+;", ptx[top.end() : end.start()])[1:]


@pytest.mark.parametrize("bk", [16, 32, 64])
def test_next_stage_fragments_are_loaded_before_the_last_mmas(bk: int) -> None:
    """Fragments a k step ahead (1, 2 and 4 k steps per stage): in each copy of the body
    every ldmatrix of its stage comes before the barrier, and after it the next stage's
    first k step is loaded before the last step's mmas, which end the copy and read only
    fragments loaded before the barrier: they run while the loads after it land."""
    ct.set_backend("sim")
    a = ct.empty((256, 256), f16)
    c = ct.empty((256, 256), f32).partition((64, 64))
    ptx = gemm_order.ptx(c, a, a, bk, 0, target=80)
    copies = _body_copies(ptx)
    assert len(copies) == 3
    steps = bk // 16
    for body in copies:
        ops = re.findall(
            r"^\t(?:@%p\d+ )?(ldmatrix|mma|bar\.sync|cp\.async\.wait_group)", body, re.M
        )
        bar = ops.index("bar.sync")
        assert ops[bar - 1] == "cp.async.wait_group" and ops.count("bar.sync") == 1
        per_step = ops.count("mma") // steps
        loads = ops.count("ldmatrix") // steps
        before, after = ops[:bar], ops[bar + 1 :]
        assert before.count("ldmatrix") == (steps - 1) * loads
        assert before.count("mma") == (steps - 1) * per_step
        assert after == ["ldmatrix"] * loads + ["mma"] * per_step, ops
        # The mmas after the barrier read none of the registers loaded after it.
        tail = body[body.index("bar.sync") :]
        loaded = set(re.findall(r"%r\d+", "".join(re.findall(r"ldmatrix[^{]*(\{[^}]*\})", tail))))
        read = re.findall(r"^\tmma[^{]*\{[^}]*\}, (\{[^}]*\}, \{[^}]*\})", tail, re.M)
        assert len(loaded) == 4 * loads and len(read) == per_step
        assert not loaded & set(re.findall(r"%r\d+", "".join(read)))


@pytest.fixture
def sim80_races() -> Iterator[SimBackend]:
    """The simulator as an sm_80 device with race checks on, active."""
    with active_sim(Target(80)) as backend:
        yield backend


@pytest.mark.parametrize("broken", [False, True])
def test_the_simulator_catches_a_refill_before_every_warp_read_its_stage(
    sim80_races: SimBackend, rng: np.random.Generator, broken: bool
) -> None:
    """With fragments loaded ahead the barrier before a body copy's last mmas is what tells
    that every warp has read the stage the copy then refills. Planted without it (the
    wait kept) the refill's cp.async lands where a slower warp may still read: reported as
    a race; intact, the same launch matches NumPy with race checks on."""
    m, n, k = 64, 64, 16 * 7 - 8
    an = rng.standard_normal((m, k)).astype(np.float16)
    bn = rng.standard_normal((k, n)).astype(np.float16)
    c = ct.full((m, n), np.nan, f32).partition((64, 64))
    a, b = ct.from_numpy(an), ct.from_numpy(bn)
    lowered = gemm_order.compile(c, a, b, 16, 0, target=80).lowered
    ptx = lowered.ptx
    if broken:
        cut = re.sub(r"(cp\.async\.wait_group 1;\n)\tbar\.sync 0;\n", r"\1", ptx)
        assert cut.count("bar.sync") < ptx.count("bar.sync")
        ptx = cut
    reader = ParamReader(lowered)
    values = [
        ParamValue(t, v) for t, v in zip(reader.ptypes, reader([c, a, b, 16, 0], sim80_races))
    ]
    kernel = sim80_races.load_kernel(ptx, lowered.entry)
    launch = (kernel, (1, 1, 1), (lowered.block_threads, 1, 1), lowered.dynamic_shared, values)
    if broken:
        with pytest.raises(LaunchFailure, match="race"):
            sim80_races.launch(*launch).wait()
        return
    sim80_races.launch(*launch).wait()
    got = c.unpartition().to_numpy()
    np.testing.assert_allclose(got, an.astype(np.float64) @ bn.astype(np.float64), atol=2e-3)


def _plan_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: Any, *args: Any) -> str:
    monkeypatch.setenv("CUTILE_PY_DUMP", str(tmp_path))
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path / "cache"))
    kmod._CACHE.clear()  # compiled (and dumped) again, not found in memory
    kernel.compile(*args, target=80)
    (plan,) = tmp_path.glob("*.plan")
    return plan.read_text()


def test_the_plan_says_whether_fragments_are_loaded_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loaded ahead in a GEMM loop, its index affine or not; for one warp's 128x128 tile
    (512 accumulator registers: two k steps of fragments would spill) the plan keeps each
    step's loads just before its mmas and says why."""
    from cutile_py_kernels.gemm import _gemm_kernel

    a = ct.empty((256, 256), f16)

    def c(tile: int) -> ct.Tensor:
        return ct.empty((256, 256), f32).partition((tile, tile))

    text = _plan_text(tmp_path / "a", monkeypatch, gemm_order, c(64), a, a, 32, 0)
    assert "    fragments a k step ahead, across the barrier to the next stage\n" in text
    text = _plan_text(tmp_path / "b", monkeypatch, gemm_order, c(64), a, a, 32, 2)
    assert "    fragments a k step ahead, across the barrier to the next stage\n" in text
    one_warp = _gemm_kernel(f16, f32, False, False, 3, 1)
    text = _plan_text(tmp_path / "c", monkeypatch, one_warp, c(128), a, a, 32)
    assert (
        "fragments loaded per k step: 512 accumulator and 2 x 64 fragment registers per "
        "thread leave fewer than 48 of 255 for addresses (it would spill)"
    ) in text
    # 16 warps share the register file: 128 registers a thread, too few for two k steps of
    # a 32x64 warp tile's fragments beside its accumulators (the block would not launch).
    sixteen = _gemm_kernel(f16, f32, False, False, 3, 16)
    wide = ct.empty((256, 256), f32).partition((128, 256))
    text = _plan_text(tmp_path / "d", monkeypatch, sixteen, wide, a, a, 32)
    assert (
        "fragments loaded per k step: 64 accumulator and 2 x 24 fragment registers per "
        "thread leave fewer than 48 of 128 (a block of 512 threads) for addresses"
    ) in text
    eight = _gemm_kernel(f16, f32, False, False, 3, 8)
    text = _plan_text(tmp_path / "e", monkeypatch, eight, wide, a, a, 32)
    assert "    fragments a k step ahead, across the barrier to the next stage\n" in text


@pytest.mark.parametrize("stages", [2, 5])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("name", ["f16", "f32"])
def test_fragments_ahead_in_rings_of_other_depths_match_numpy_on_sim(
    rng: np.random.Generator, stages: int, trans_b: bool, name: str
) -> None:
    """The library GEMM with fragments loaded ahead in rings of 2 (the next stage's wait is
    for every copy in flight) and 5 stages, 16-bit and tf32 (read word by word from K-row
    tiles where B is (K, N)), B either way, at a shape ragged in M, N and K whose trip
    count is no multiple of the stages."""
    from cutile_py_kernels.gemm import _gemm_kernel

    ct.set_backend("sim")
    dt = {"f16": f16, "f32": f32}[name]
    bk = 32 if dt is f16 else 16
    m, n, k = 64 + 5, 64 + 11, 7 * bk + 8
    kernel = _gemm_kernel(dt, f32, trans_b, False, stages, 4)
    a = rng.standard_normal((m, k)).astype(np.float16 if dt is f16 else np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(a.dtype)
    c = ct.full((m, n), np.nan, f32).partition((64, 64))
    (cp, *_) = kernel(c, ct.from_numpy(a), ct.from_numpy(b), bk).sync()
    want = a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
    # tf32 keeps 10 bits of mantissa: sums of k products of unit normals
    atol = 2e-3 if dt is f16 else 2e-3 * np.sqrt(k) * 8
    np.testing.assert_allclose(cp.unpartition().to_numpy(), want, atol=atol)


def test_an_empty_k_loop_with_fragments_ahead_gives_zeros(sim80_races: SimBackend) -> None:
    """K = 0: the loop makes no trip, yet its prologue waits, synchronizes and loads the
    first k step's fragments (of zero-filled tiles) without a race; the result is zeros."""
    ct.set_backend("sim")
    a, b = ct.zeros((64, 0), f16), ct.zeros((0, 64), f16)
    c = ct.full((64, 64), np.nan, f32)
    ptx = gemm_order.ptx(ct.empty((64, 64), f32).partition((64, 64)), a, b, 32, 0)
    prologue = ptx[: re.search(r"^\$__loop_\d+:$", ptx, re.M).start()]  # type: ignore[union-attr]
    assert "cp.async.cg" in prologue and "ldmatrix" in prologue
    (cp, *_) = gemm_order(c.partition((64, 64)), a, b, 32, 0).sync()
    np.testing.assert_array_equal(cp.unpartition().to_numpy(), np.zeros((64, 64), np.float32))
