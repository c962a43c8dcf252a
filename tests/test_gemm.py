"""`gemm` and `bmm` of cutile_py_kernels against float64 NumPy on sim and interpret (and cuda
where a GPU is found), every output element checked; and the autotuner: its candidates, its
JSON cache, reuse of a choice, and scratch outputs that are never the caller's."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
import cutile_py_kernels as ck
from cutile_py.ir.dtypes import round_to
from cutile_py_kernels import autotune
from cutile_py_kernels.autotune import Autotuner, GemmConfig, TuneKey

DTYPES = {"f16": ct.f16, "bf16": ct.bf16, "f32": ct.f32}
#: Per-element bound |got - want| <= OUT[out] |want| + ACC[in] (|a| @ |b|):
#: OUT is twice the unit roundoff of the output dtype (the final rounding);
#: ACC bounds the sums: f16/bf16 products are exact in f32 and K <= ~100 f32 additions cost
#: ~K 2^-24 << 1e-4; tf32 rounds each f32 operand to 10 mantissa bits (2^-11 relative each,
#: so ~1e-3 per product), hence 2e-3.
OUT = {"f16": 2.0**-10, "bf16": 2.0**-7, "f32": 2.0**-22}
ACC = {"f16": 1e-4, "bf16": 1e-4, "f32": 2e-3}


@pytest.fixture(params=["sim", "interpret", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield str(request.param)
    ct.set_backend("sim")


def operand(rng: np.random.Generator, shape: tuple[int, ...], name: str) -> Any:
    """(values exactly representable in the dtype, as float64; the tensor)."""
    a = round_to(rng.standard_normal(shape).astype(np.float32), DTYPES[name])
    return a.astype(np.float64), ct.from_numpy(a, DTYPES[name])


def check(got: ct.Tensor[Any, Any], a: np.ndarray, b: np.ndarray, name: str, out: str) -> None:
    """`got` == a @ b (batched over leading axes) within the bound above, element by element."""
    want = a @ b
    assert got.dtype is DTYPES[out] and got.shape == want.shape
    g = got.to_numpy().astype(np.float64)
    tol = OUT[out] * np.abs(want) + ACC[name] * (np.abs(a) @ np.abs(b)) + 1e-30
    err = np.abs(g - want)
    worst = np.unravel_index(np.argmax(err / tol), err.shape)
    assert np.isfinite(g).all()
    assert (err <= tol).all(), f"at {worst}: got {g[worst]}, want {want[worst]}, tol {tol[worst]}"


# (dtype, M, N, K): edges in every dim (not multiples of any tile), 1 x 1 x 1, exact tiles,
# K spanning several steps.
SHAPES = [(1, 1, 1), (40, 24, 40), (17, 9, 33), (64, 64, 32), (5, 70, 100)]


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("mnk", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm(backend: str, rng: np.random.Generator, name: str, mnk: Any) -> None:
    m, n, k = mnk
    a, at = operand(rng, (m, k), name)
    b, bt = operand(rng, (k, n), name)
    check(ck.gemm(at, bt), a, b, name, name)
    at.to_numpy(), bt.to_numpy()  # inputs stay usable


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("mnk", [(1, 1, 1), (40, 24, 40), (33, 20, 50)], ids=str)
def test_gemm_trans_b(backend: str, rng: np.random.Generator, name: str, mnk: Any) -> None:
    m, n, k = mnk
    a, at = operand(rng, (m, k), name)
    b, bt = operand(rng, (n, k), name)
    check(ck.gemm(at, bt, trans_b=True), a, b.T, name, name)


@pytest.mark.parametrize(("name", "out"), [("f16", "f32"), ("bf16", "f32"), ("f32", "bf16")])
def test_gemm_out_dtype(backend: str, rng: np.random.Generator, name: str, out: str) -> None:
    a, at = operand(rng, (21, 10), name)
    b, bt = operand(rng, (10, 13), name)
    check(ck.gemm(at, bt, out_dtype=DTYPES[out]), a, b, name, out)


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("trans_b", [False, True])
def test_bmm(backend: str, rng: np.random.Generator, name: str, trans_b: bool) -> None:
    nb, m, n, k = 3, 20, 12, 24
    a, at = operand(rng, (nb, m, k), name)
    b, bt = operand(rng, (nb, n, k) if trans_b else (nb, k, n), name)
    got = ck.bmm(at, bt, trans_b=trans_b)
    check(got, a, b.transpose(0, 2, 1) if trans_b else b, name, name)


def test_shape_and_dtype_errors() -> None:
    with pytest.raises(ValueError, match=r"a \(M, K\) and b \(K, N\)"):
        ck.gemm(ct.zeros((4, 5), ct.f16), ct.zeros((4, 5), ct.f16))
    with pytest.raises(ValueError, match=r"b \(N, K\)"):
        ck.gemm(ct.zeros((4, 5), ct.f16), ct.zeros((5, 4), ct.f16), trans_b=True)
    with pytest.raises(TypeError, match="dtypes differ"):
        ck.gemm(ct.zeros((4, 5), ct.f16), ct.zeros((5, 4), ct.bf16))
    with pytest.raises(ValueError, match="3-D"):
        ck.bmm(ct.zeros((4, 5), ct.f16), ct.zeros((5, 4), ct.f16))
    assert ck.gemm(ct.zeros((0, 5)), ct.zeros((5, 3))).shape == (0, 3)


# -- the autotuner ----------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [ct.f16, ct.bf16, ct.f32])
def test_candidates_are_valid(dt: type[ct.DType]) -> None:
    for mnk in [(4096, 4096, 4096), (40, 24, 40), (1, 1, 1)]:
        cands = autotune.candidates(dt, *mnk)
        assert cands and all(autotune.is_valid(c, dt) for c in cands)
        assert autotune.is_valid(autotune.default_config(dt, *mnk), dt)
    assert not autotune.is_valid(GemmConfig(256, 256, 32), dt)  # 256 accumulator registers
    assert not autotune.is_valid(GemmConfig(128, 256, 128, 4), dt)  # 192+ KiB of stages
    assert not autotune.is_valid(GemmConfig(64, 64, 32, 0), dt)
    big = autotune.candidates(dt, 4096, 4096, 4096)
    assert GemmConfig(128, 128, 2 * autotune.k_step(dt), 4, 4) in big
    assert {c.stages for c in big} == {3, 4}
    # Warp tiles of 64x64 (and 64x32): 1 to 8 warps, never more accumulator than 128
    # registers a thread.
    assert {c.warps for c in big} == {1, 2, 4, 8}
    assert {(c.bm, c.bn, c.warps) for c in big} >= {(64, 64, 1), (128, 128, 4), (128, 256, 8)}
    assert not autotune.is_valid(GemmConfig(128, 256, 32, 3, 4), dt)  # 256 registers a thread
    assert not autotune.is_valid(GemmConfig(16, 8, 16, 3, 2), dt)  # 2 warps, 1 fragment
    # Clamped to a tiny problem, a config keeps no more warps than fragments.
    assert autotune.clamp(GemmConfig(128, 128, 32, 3, 8), dt, 20, 8, 8).warps == 2


class FakeTimer:
    """Deterministic times (the smallest tile volume wins); records each scratch output."""

    def __init__(self) -> None:
        self.scratch: list[ct.Tensor[Any, Any]] = []
        self.timed: list[GemmConfig] = []

    def __call__(self, cfg: GemmConfig, launch: autotune.Launch) -> float:
        op = launch()
        held = op.sync()  # runs the candidate for real on its scratch output
        assert isinstance(held[0], ct.Partition) and held[0].tile_shape[-2:] == (cfg.bm, cfg.bn)
        self.scratch.append(held[0].tensor)
        self.timed.append(cfg)
        return float(cfg.bm * cfg.bn * cfg.bk)


@pytest.fixture
def tuner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Autotuner]:
    t = Autotuner(path=tmp_path / "autotune" / "gemm.json", timer=FakeTimer())
    monkeypatch.setattr(autotune, "TUNER", t)
    ct.set_backend("sim")
    yield t


def test_tuning_picks_the_fastest_and_never_touches_the_output(
    tuner: Autotuner, rng: np.random.Generator
) -> None:
    m, n, k = 40, 24, 40
    a, at = operand(rng, (m, k), "f16")
    b, bt = operand(rng, (k, n), "f16")
    out = ck.gemm(at, bt)
    check(out, a, b, "f16", "f16")
    timer = tuner.timer
    assert isinstance(timer, FakeTimer)
    assert sorted(timer.timed) == autotune.candidates(ct.f16, m, n, k)
    # Every candidate wrote its own scratch tensor, none of them the result or an input.
    ids = {id(s.buffer) for s in timer.scratch}
    assert len(ids) == len(timer.timed)
    assert id(out.buffer) not in ids and not {id(at.buffer), id(bt.buffer)} & ids
    # The choice (smallest volume under the fake timer) is on disk, keyed by the bucket.
    best = min(timer.timed, key=lambda c: c.bm * c.bn * c.bk)
    data = json.loads(tuner.path.read_text())
    key = TuneKey.make(m, n, k, ct.f16, False, "sim").text()
    # What is stored is the first template (as in TILES) that runs as the winner here.
    template = min(t for t, c in autotune.candidate_templates(ct.f16, m, n, k).items() if c == best)
    assert (template.bm, template.bn) in autotune.TILES
    assert autotune.clamp(template, ct.f16, m, n, k) == best
    assert data["entries"] == {key: template.astuple()}
    assert not [p for p in tuner.path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_finalists_are_timed_again_and_decide(tmp_path: Path) -> None:
    """The first round ranks every candidate; the FINALISTS fastest are timed again and the
    fastest of the second round wins, even where the first round put it last of them."""
    m, n, k = 256, 256, 256
    opts = autotune.candidate_templates(ct.f16, m, n, k)
    configs = sorted(set(opts.values()), key=lambda c: (c.bm * c.bn * c.bk, c))
    first = {c: float(i) for i, c in enumerate(configs)}  # a strict ranking
    finalists = configs[: autotune.FINALISTS]
    timed_again: list[GemmConfig] = []

    def final(cfg: GemmConfig, make_launch: Callable[[GemmConfig], autotune.Launch]) -> float:
        timed_again.append(cfg)
        return -first[cfg]  # the reverse order

    t = Autotuner(path=tmp_path / "gemm.json", timer=lambda c, _: first[c], final=final)
    key = TuneKey.make(m, n, k, ct.f16, False, "sim")
    default = autotune.default_config(ct.f16, m, n, k)
    chosen = t.choose(key, opts, default, lambda cfg: lambda: pytest.fail("launched"))
    assert sorted(timed_again) == sorted(finalists * autotune.FINAL_ROUNDS)
    assert chosen == finalists[-1] == t.last
    # What each round measured, for reports: every config's first time, finalists' medians.
    assert t.last_times == {c: (first[c], -first[c] if c in finalists else None) for c in configs}
    t.choose(key, opts, default, lambda cfg: lambda: pytest.fail("launched"))
    assert t.last == chosen and t.last_times == {}  # a cached choice: nothing timed


def test_finalists_take_turns_so_drift_does_not_pick(tmp_path: Path) -> None:
    """A GPU heating up makes every later timing slower: timed in turns with the order
    rotating, the truly fastest finalist wins although a slower one was timed first."""
    m, n, k = 256, 256, 256
    opts = autotune.candidate_templates(ct.f16, m, n, k)
    configs = sorted(set(opts.values()), key=lambda c: (c.bm * c.bn * c.bk, c))
    finalists = configs[: autotune.FINALISTS]
    true = {c: 1.0 for c in finalists}
    true[finalists[1]] = 0.97  # 3% faster, ranked second by the first round
    clock = [0.0]

    def drifting(cfg: GemmConfig, make_launch: Callable[[GemmConfig], autotune.Launch]) -> float:
        clock[0] += 1
        return true[cfg] * (1 + 0.05 * clock[0])  # each timing 5% slower than the first

    first = {c: float(i) for i, c in enumerate(configs)}
    t = Autotuner(path=tmp_path / "gemm.json", timer=lambda c, _: first[c], final=drifting)
    key = TuneKey.make(m, n, k, ct.f16, False, "sim")
    chosen = t.choose(key, opts, autotune.default_config(ct.f16, m, n, k), lambda c: lambda: 0)
    assert chosen == finalists[1]


def test_choice_is_reused_from_memory_and_from_disk(
    tuner: Autotuner, rng: np.random.Generator
) -> None:
    a, at = operand(rng, (40, 24), "bf16")
    b, bt = operand(rng, (24, 16), "bf16")
    ck.gemm(at, bt)
    assert tuner.sweeps == 1
    check(ck.gemm(at, bt), a, b, "bf16", "bf16")  # same bucket: no new sweep
    assert tuner.sweeps == 1
    # A new process (a new tuner on the same file) reads the choice back.
    again = Autotuner(path=tuner.path, timer=FakeTimer())
    key = TuneKey.make(40, 16, 24, ct.bf16, False, "sim")
    opts = autotune.candidate_templates(ct.bf16, 40, 16, 24)
    default = autotune.default_config(ct.bf16, 40, 16, 24)
    chosen = again.choose(key, opts, default, lambda cfg: pytest.fail("timed again"))
    assert chosen == min(opts.values(), key=lambda c: c.bm * c.bn * c.bk) and again.sweeps == 0


def test_one_sweep_per_bucket_whatever_the_clamping(
    tuner: Autotuner, rng: np.random.Generator
) -> None:
    """M = 33 and M = 60 share a bucket (64) but clamp the tiles differently (48 and 64
    rows): the template cached by the first sweep serves the second, every call after."""
    b, bt = operand(rng, (40, 24), "f16")
    for _ in range(2):
        for m in (33, 60):
            a, at = operand(rng, (m, 40), "f16")
            check(ck.gemm(at, bt), a, b, "f16", "f16")
    assert tuner.sweeps == 1


def test_out_dtype_and_batch_are_tuned_apart(tuner: Autotuner, rng: np.random.Generator) -> None:
    """A choice for an f16 result is not reused for an f32 one, nor a gemm's for a bmm of
    5 problems (whose grid is 5 times larger); a bmm of 7 shares that bucket (8)."""
    a, at = operand(rng, (60, 40), "f16")
    b, bt = operand(rng, (40, 24), "f16")
    ck.gemm(at, bt)
    check(ck.gemm(at, bt, out_dtype=ct.f32), a, b, "f16", "f32")
    assert tuner.sweeps == 2
    for batch in (5, 7):
        a3, at3 = operand(rng, (batch, 60, 40), "f16")
        b3, bt3 = operand(rng, (batch, 40, 24), "f16")
        check(ck.bmm(at3, bt3), a3, b3, "f16", "f16")
    assert tuner.sweeps == 3
    keys = set(json.loads(tuner.path.read_text())["entries"])
    assert keys == {
        TuneKey.make(60, 24, 40, ct.f16, False, "sim", odt, nb).text()
        for odt, nb in ((ct.f16, None), (ct.f32, None), (ct.f16, 5))
    }


def test_cache_round_trip_and_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "gemm.json"
    t = Autotuner(path=path, timer=lambda cfg, launch: float(cfg.bk))
    key = TuneKey.make(100, 200, 300, ct.f32, True, "GPU X")
    assert (key.m, key.n, key.k) == (128, 256, 512)
    opts = {c: c for c in (GemmConfig(64, 64, 16), GemmConfig(64, 64, 8))}
    small = GemmConfig(64, 64, 8)
    assert t.choose(key, opts, small, lambda cfg: lambda: pytest.fail("no launch")) == small
    assert Autotuner(path=path)._load() == {key.text(): small}
    path.write_text("{not json")
    assert Autotuner(path=path)._load() == {}


def test_no_timing_off_cuda(tmp_path: Path) -> None:
    """Without an injected timer, sim and interpret take the default and write nothing."""
    ct.set_backend("interpret")
    try:
        t = Autotuner(path=tmp_path / "gemm.json")
        key = TuneKey.make(8, 8, 8, ct.f16, False, "interpret")
        default = autotune.default_config(ct.f16, 8, 8, 8)
        opts = {GemmConfig(16, 8, 16): GemmConfig(16, 8, 16)}
        assert t.choose(key, opts, default, lambda c: pytest.fail()) == default
        assert not t.path.exists()
    finally:
        ct.set_backend("sim")


@pytest.mark.parametrize("dt", [ct.f16, ct.f32], ids=lambda d: d.name)
@pytest.mark.parametrize("trans_b", [False, True])
def test_every_candidate_assembles_without_spills(dt: type[ct.DType], trans_b: bool) -> None:
    """Whatever the tuner picks compiles: each candidate at a large shape, sm_80
    (bf16 lowers as f16 does; cases.py covers sm_90 for a few of them)."""
    from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available
    from cutile_py_kernels.gemm import _gemm_kernel

    if not nvjitlink_available():
        pytest.skip("the nvJitLink library cannot be loaded")
    m = n = k = 1000
    target = ct.Target(80)
    # The block order changes the preamble only (tests/test_group_order.py): one of each.
    for cfg in sorted({replace(c, group_m=0) for c in autotune.candidates(dt, m, n, k)}):
        args = (
            ct.PartitionSpec((m, n), (cfg.bm, cfg.bn), dt),
            ct.TensorSpec((m, k), dt),
            ct.TensorSpec((n, k) if trans_b else (k, n), dt),
            cfg.bk,
        )
        kernel = _gemm_kernel(dt, dt, trans_b, False, cfg.stages, cfg.num_warps)
        report = assemble(kernel.ptx(*args, target=target), target)
        assert report.spill_free, (cfg, report.info_log)


@pytest.mark.parametrize("name", ["f16", "f32"])
def test_every_candidate_computes_on_sim(rng: np.random.Generator, name: str) -> None:
    """Every config the tuner may pick on a GPU, run on sim at a shape ragged in M, N and K
    (a partial row block, a partial column block, K steps plus a remainder), plain and
    trans_b on alternate candidates; every output element checked (bf16 lowers as f16)."""
    from cutile_py_kernels.gemm import _gemm_kernel

    dt = DTYPES[name]
    ct.set_backend("sim")
    plain = {replace(c, group_m=0) for c in autotune.candidates(dt, 4096, 4096, 4096)}
    for i, cfg in enumerate(sorted(plain)):
        trans_b = i % 2 == 1
        # K even: 16-bit rows of 4-byte multiples, copied by cp.async (as the tuner's
        # candidates with few warps require; odd ones are tuned as unstaged below).
        m, n, k = cfg.bm + 3, 2 * cfg.bn - 6, (cfg.stages + 1) * cfg.bk + 6
        a, at = operand(rng, (m, k), name)
        b, bt = operand(rng, (n, k) if trans_b else (k, n), name)
        out = ct.zeros((m, n), dt).partition((cfg.bm, cfg.bn))
        kernel = _gemm_kernel(dt, dt, trans_b, False, cfg.stages, cfg.num_warps)
        c, _, _, _ = kernel(out, at, bt, cfg.bk).sync()
        check(c.unpartition(), a, b.T if trans_b else b, name, name)


def test_unstaged_operands_keep_the_compilers_warps(rng: np.random.Generator) -> None:
    """Odd K: 16-bit rows that are no multiple of 4 bytes cannot be copied by cp.async and
    go through registers, which a block of few warps cannot hold: the tuner then tries the
    compiler's warp count only, under a key of its own; its largest candidate computes
    exactly at ragged shapes without spilling."""
    from cutile_py.host.errors import PerformanceWarning
    from cutile_py_kernels.gemm import _gemm_kernel

    assert not autotune.stageable(ct.f16, (33, 64)) and autotune.stageable(ct.f16, (34, 64))
    assert autotune.stageable(ct.f32, (33, 65))
    unstaged = autotune.candidates(ct.f16, 4096, 4096, 4096, staged=False)
    assert {c.warps for c in unstaged} == {0}
    key = TuneKey.make(64, 64, 33, ct.f16, False, "dev", staged=False)
    assert key.text().endswith("|unstaged") and key != TuneKey.make(
        64, 64, 33, ct.f16, False, "dev"
    )
    cfg = max(unstaged, key=lambda c: (c.bm * c.bn, c.bk))
    ct.set_backend("sim")
    m, n, k = cfg.bm + 3, cfg.bn - 5, 2 * cfg.bk + 7
    a, at = operand(rng, (m, k), "f16")
    b, bt = operand(rng, (k, n), "f16")
    out = ct.zeros((m, n), ct.f16).partition((cfg.bm, cfg.bn))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        kernel = _gemm_kernel(ct.f16, ct.f16, False, False, cfg.stages, cfg.num_warps)
        c, _, _, _ = kernel(out, at, bt, cfg.bk).sync()
    check(c.unpartition(), a, b, "f16", "f16")


@pytest.mark.parametrize("be", ["sim", "interpret"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_grouped_block_order_computes_at_ragged_grids(
    rng: np.random.Generator, be: str, trans_b: bool
) -> None:
    """The GEMM kernel in the L2-grouped order, bands of 3 tile rows over a grid of 8 x 3
    tiles (the last band 2 rows, the last row and column of tiles partial, K ragged):
    every output element equals NumPy's, on sim (the PTX's remap) and interpret."""
    from cutile_py_kernels.gemm import _gemm_kernel

    bm, bn, bk = 32, 32, 32
    m, n, k = 7 * bm + 5, 3 * bn - 6, 3 * bk + 10
    ct.set_backend(be)
    try:
        a, at = operand(rng, (m, k), "f16")
        b, bt = operand(rng, (n, k) if trans_b else (k, n), "f16")
        out = ct.zeros((m, n), ct.f32).partition((bm, bn))
        kernel = _gemm_kernel(ct.f16, ct.f32, trans_b, False, 3, 4, 3)
        assert " group_m=3 " in kernel.ir(out, at, bt, bk).splitlines()[0]
        c, _, _, _ = kernel(out, at, bt, bk).sync()
        check(c.unpartition(), a, b.T if trans_b else b, "f16", "f32")
    finally:
        ct.set_backend("sim")


def test_large_problems_take_the_grouped_order() -> None:
    """The default and the tuner's candidates group blocks where M has more than GROUP_M
    tile rows (both orders tried), never for bmm, and not where grouping changes nothing."""
    big = autotune.default_config(ct.f16, 4096, 4096, 4096)
    assert big.group_m == autotune.GROUP_M and big.group == autotune.GROUP_M
    assert autotune.default_config(ct.f16, 512, 4096, 4096).group_m == 0  # 8 tile rows
    assert autotune.default_config(ct.f16, 4096, 4096, 4096, grouped=False).group is None
    cands = autotune.candidates(ct.f16, 4096, 4096, 4096)
    assert {c.group_m for c in cands} == {0, autotune.GROUP_M}
    assert replace(max(cands), group_m=0) in cands
    assert {c.group_m for c in autotune.candidates(ct.f16, 4096, 64, 64, grouped=False)} == {0}
    small = autotune.candidates(ct.f16, 300, 300, 300)
    assert {c.group_m for c in small} == {0}
    assert len(small) == len(set(autotune.candidate_templates(ct.f16, 300, 300, 300).values()))
