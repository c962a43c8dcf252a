"""`python -m paper_repro all --quick` on the CPU: every experiment writes its files, every
measured number is positive, and absent peers and kernels are reported as missing."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from paper_repro.kloop_sass import copy_slices, k_loop, measure, ready_after_barrier

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ["bandwidth", "race", "elementwise", "gemm", "jit", "launch", "workdist", "dispatch",
               "decode"]  # fmt: skip
#: Columns holding measurements, which must be positive wherever a row says "ok".
METRICS = ["time_us", "gbps", "frac_copy", "tflops", "us_per_op", "ops_per_s", "ms", "device_us",
           "host_us_per_call", "tokens_per_s", "roofline_tokens_per_s",
           "frac_roofline", "frac_same_copy"]  # fmt: skip


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("repro")
    env = dict(os.environ, CUTILE_PY_CACHE_DIR=str(out / "cache"), CUTILE_PY_BACKEND="sim")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "paper_repro", "all", "--quick", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "== bandwidth" in proc.stderr  # progress goes to stderr
    return out


def test_every_experiment_writes_csv_and_json(quick_run: Path) -> None:
    for name in EXPERIMENTS:
        data = json.loads((quick_run / f"{name}.json").read_text())
        assert data["name"] == name
        assert data["rows"], name
        with open(quick_run / f"{name}.csv") as f:
            assert len(list(csv.DictReader(f))) == len(data["rows"])
    assert json.loads((quick_run / "machine.json").read_text())["backend"] == "sim"


def test_numbers_are_positive_and_nothing_failed(quick_run: Path) -> None:
    measured = 0
    for name in EXPERIMENTS:
        for row in json.loads((quick_run / f"{name}.json").read_text())["rows"]:
            assert row["status"] in ("ok", "missing"), (name, row)
            if row["status"] != "ok":
                continue
            for key in METRICS:
                if row.get(key) is not None:
                    assert row[key] > 0, (name, key, row)
                    measured += 1
    assert measured > 50


def test_measured_what_exists_on_sim(quick_run: Path) -> None:
    rows = json.loads((quick_run / "elementwise.json").read_text())["rows"]
    impls = {(r["impl"], r.get("dtype")) for r in rows if r["status"] == "ok"}
    assert {("cutile_py", "f32"), ("cutile_py", "f16"), ("ptx (ct.RawKernel)", "f16")} <= impls
    race = {r["what"]: r for r in json.loads((quick_run / "race.json").read_text())["rows"]}
    # The simulator names the race: threads of two blocks write different values to one element.
    assert "global-memory race" in race["permute_racy"]["error_raised"], race["permute_racy"]
    assert "permute_racy" in race["permute_racy"]["error_raised"]
    assert "write different values to global address" in race["permute_racy"]["error_raised"]
    assert race["permute_ok"]["wrong_vs_reference"] == 0
    shared = race["store into a shared (read-only) tensor at a computed index"]
    assert shared["error_raised"].startswith("CompileError")


def test_report_lists_missing_peers(quick_run: Path) -> None:
    report = (quick_run / "REPORT.md").read_text()
    assert "Not a GPU measurement" in report
    assert "## Missing" in report
    missing = report.split("## Missing", 1)[1].split("\n## ", 1)[0]
    for peer in ("torch", "triton", "cupy"):
        try:
            __import__(peer)
        except ImportError:
            assert peer in missing, peer
    assert "7.02" in report and "96.4%" in report  # the paper's numbers are quoted


def test_gemm_summary_holds_large_sizes_to_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GEMM summary gives, per dtype, the range of % of cuBLAS at n >= 4096 and whether
    the 60 % target is met (as a cuda run would, with the measurements faked)."""
    import paper_repro.experiments.gemm as gemm
    from paper_repro.core import Context, Row
    from paper_repro.timing import Timer

    # (impl, dtype, n) -> TFLOP/s; 100 elsewhere.
    tflops = {
        ("cutile_py", "f16", 4096): 390.0,
        ("torch", "f16", 4096): 600.0,
        ("cutile_py", "f16", 8192): 420.0,
        ("torch", "bf16", 4096): 400.0,
    }

    def fake(ctx: Context, impl: str, dtype: str, n: int, gpu: object) -> list[Row]:
        name = "cuBLAS (torch)" if impl == "torch" else impl
        got = tflops.get((impl, dtype, n), 100.0)
        return [{"impl": name, "dtype": dtype, "n": n, "status": "ok", "tflops": got}]

    monkeypatch.setattr(gemm, "measure", fake)
    monkeypatch.setattr(gemm, "peer_missing", lambda p: None if p == "torch" else {"impl": p})
    res = gemm.run(Context("cuda", False, Timer("sim", reps=1, warmup=0), 0, {}))
    # f16: 390/600 at 4096, 420/100 at 8192; bf16: 100/400 at 4096, 100/100 at 8192.
    assert "cutile_py f16 at n >= 4096: 65.0-420.0% of cuBLAS (target 60%: met)" in res.summary
    assert "cutile_py bf16 at n >= 4096: 25.0-100.0% of cuBLAS (target 60%: not met)" in res.summary


def test_gemm_replay_leaves_out_the_tuning_launches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """On cuda the first gemm of a shape runs every tuning candidate; the replay that is
    timed holds the one launch gemm makes once tuned (here a tuner that runs each candidate
    stands in for the cuda one), and it computes a @ b."""
    from cutile_py_kernels import autotune
    from paper_repro.experiments.gemm import cutile_replay

    runs: list[autotune.GemmConfig] = []

    def timer(cfg: autotune.GemmConfig, launch: autotune.Launch) -> float:
        launch().sync()
        runs.append(cfg)
        return float(cfg.bm)

    tuner = autotune.Autotuner(path=tmp_path / "gemm.json", timer=timer)
    monkeypatch.setattr(autotune, "TUNER", tuner)
    ct.set_backend("sim")
    a = rng.standard_normal((48, 40)).astype(np.float16)
    b = rng.standard_normal((40, 24)).astype(np.float16)
    sets = [[ct.from_numpy(a, ct.f16), ct.from_numpy(b, ct.f16)]]
    replay = cutile_replay(sets)
    assert tuner.sweeps == 1 and len(runs) > 1
    assert len(replay.launches) == 1
    for p in replay.launch(0):
        p.wait()
    (out,) = [x for x in replay.slots[0][0] if isinstance(x, ct.Partition)]
    want = a.astype(np.float32) @ b.astype(np.float32)
    got = out.unpartition().to_numpy().astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())


def test_rotation_always_goes_past_twice_the_l2() -> None:
    from paper_repro.timing import rotation

    l2 = 50 * 2**20  # H100
    for n in (128, 256, 512, 1024, 8192):
        footprint = 2 * 3 * n * n  # a GEMM's three f16 matrices
        r = rotation(footprint, l2)
        assert r * footprint > 2 * l2 >= (r - 1) * footprint


def test_cuda_timing_goes_through_every_buffer_set() -> None:
    from paper_repro.experiments.host import null_cuda
    from paper_repro.timing import Timer

    used: list[int] = []

    def launch(slot: int) -> tuple[()]:
        used.append(slot)
        return ()

    rotate = int(np.random.default_rng().integers(40, 120))
    with null_cuda(check_arguments=True):
        Timer("cuda", reps=3, warmup=1).device(launch, rotate=rotate)
    assert set(used) == set(range(rotate))


def test_host_gpu_rows_say_why_they_are_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU, `host` reports the cuda and Triton rows as missing, with the reason."""
    from types import SimpleNamespace

    from cutile_py.runtime import cuda_driver
    from paper_repro.experiments import host

    monkeypatch.setattr(cuda_driver, "driver_available", lambda: False)
    rows = host.gpu_rows(SimpleNamespace(log=lambda _: None), [1, 100])  # type: ignore[arg-type]
    assert {(r["impl"], r["n"]) for r in rows} == {
        (impl, n) for impl in ("cutile_py", "triton") for n in (1, 100)
    }
    for r in rows:
        assert r["device"] == "cuda" and r["status"] == "missing"
        assert "no NVIDIA GPU" in str(r["note"])


def test_host_compares_cutile_py_with_triton_in_the_same_run() -> None:
    from paper_repro.experiments import host

    def row(impl: str, mode: str, us: float, n: int = 1) -> dict[str, object]:
        return {"device": "cuda", "impl": impl, "mode": mode, "n": n, "status": "ok",
                "us_per_op": us}  # fmt: skip

    rows = [
        row("triton", "sync", 8.0),
        row("cutile_py", "sync", 6.5),
        row("cutile_py", "graph replay", 9.0),
        row("cutile_py", "sync", 1.0, n=100),  # no Triton row at N=100: not compared
        row("triton", "queued", 1.0),
    ]
    assert host.against_triton(rows) == [  # type: ignore[arg-type]
        "cuda: cutile_py sync 6.5 µs/op is below Triton's sync launch 8.0 µs/op (N=1)",
        "cuda: cutile_py graph replay 9.0 µs/op is not below Triton's sync launch 8.0 µs/op (N=1)",
    ]


def test_kloop_sass_counts_the_gemm_k_loop() -> None:
    """`python -m paper_repro.kloop_sass` finds the K loop of a 64x64x32 f16 GEMM in sm_80
    SASS: per warp and K step of 32, 8 warps split the 64x64 block 2 x 4 (32x16 each: 2 x 2
    fragments) over 2 k steps = 8 HMMA; one 16-byte chunk of A and one of B per thread of
    the 256, checked in line: 2 LDGSTS. A trip around the loop holds one copy of the body
    per stage: 3 K steps. Fragments are loaded a k step ahead: after each barrier the
    warp's 4 HMMA of the last k step read none of the fragments loaded after it."""
    ct.set_backend("sim")
    r = measure(64, 64, 32, 3, ct.Target(80))
    assert r.steps == 3
    assert (r.hmma, r.ldgsts) == (8 * 3, 2 * 3)
    assert r.ready >= 4
    assert r.ldsm > 0 and r.integer > 0 and r.total > r.hmma + r.ldsm + r.ldgsts
    assert 0 < r.mma_share < 1


def test_kloop_copy_slices_follow_the_values_the_copies_read() -> None:
    """The address slice of a copy is the integer instructions its address registers
    depend on in the loop, carried values included (the 64-bit advance with its carry), not
    a later reuse of a register's name; the bounds slice is its predicate's."""
    body = [
        "IADD3 R4, P0, R4, R10, RZ",
        "IMAD.X R5, R5, 0x1, R11, P0",
        "IADD3 R7, R20, UR5, RZ",
        "ISETP.GT.AND P1, PT, R30, RZ, PT",
        "LOP3.LUT R40, R41, 0x7, RZ, 0xc0, !PT",
        "LDGSTS.E.BYPASS.128 [R7], [R4.64], P1",
        "IMAD.MOV.U32 R7, RZ, RZ, R50",
        "LDSM.16.M88.4 R8, [R7]",
        "BRA 0x0",
    ]
    assert copy_slices(body) == (3, 1)


def test_kloop_counts_the_hmma_ready_after_a_barrier() -> None:
    """Per barrier, the HMMA after it before one reads a register an LDSM after it wrote
    (A 4 registers from its first, B 2): here 2 after the first barrier (the third reads
    R12-R15), none after the second (the first HMMA reads R9 of the LDSM .2 at R8)."""
    body = [
        "BAR.SYNC.DEFER_BLOCKING 0x0",
        "LDSM.16.M88.4 R12, [R3]",
        "HMMA.16816.F32 R0, R4, R8, R0",
        "HMMA.16816.F32 R20, R4, R10, R20",
        "HMMA.16816.F32 R24, R14, R10, R24",
        "BAR.SYNC.DEFER_BLOCKING 0x0",
        "LDSM.16.MT88.2 R8, [R3]",
        "HMMA.16816.F32 R0, R4, R9, R0",
        "BRA 0x0",
    ]
    assert ready_after_barrier(body) == (2 + 0) / 2


def test_kloop_counts_the_steady_state_path() -> None:
    """Of a loop whose copies branch off to a checked variant, the shortest path from the
    top to the back edge is counted: the unchecked copy, not the checked one beside it."""
    code = [
        "HMMA.16816.F32 R0, R4, R8, R0",
        "@P0 BRA 0x40",
        "LDGSTS.E.BYPASS.128 [R7], [R4.64], P1",
        "BRA 0x50",
        "LDGSTS.E.BYPASS.128 [R7], [R4.64]",
        "IADD3 R1, R1, 0x1, RZ",
        "BRA 0x0",
    ]
    sass = "\n".join(
        f"        /*{16 * i:04x}*/                   {t} ;" for i, t in enumerate(code)
    )
    assert k_loop(sass) == [code[0], code[1], code[4], code[5], code[6]]


def test_row_sweep_times_both_choices_and_restores_the_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The sweep the next GPU lease runs: each per-thread count launched as asked (1024 f32
    at 16 a thread: 8 warps where the library picks 4), the library's pick marked, and the
    library's rule back afterwards (on sim, tiny shapes: a check of the script only)."""
    from cutile_py_kernels import _common, norms
    from paper_repro import row_sweep

    plan = _common.row_plan(4096, 1024, ct.f32)
    with row_sweep.elements_per_thread(16):
        assert _common.row_warps(plan) == 8
    assert _common.row_warps(plan) == 4
    # layer_norm's own rule for f32 rows past 8192 (64 a thread: 8 warps at 16384) is off
    # while sweeping: the count asked is the count launched.
    wide = ct.TensorSpec((4096, 16384), ct.f32)

    def layer_norm_warps() -> int:
        launch = _common.row_launch(norms._layer_norm_kernels, 0, wide, norms.ONE_PASS_CAP,
                                    norms.layer_norm_per_thread)  # fmt: skip
        return int(launch.kernel.num_warps)

    with row_sweep.elements_per_thread(32):
        assert layer_norm_warps() == 16
    assert layer_norm_warps() == 8
    assert _common.per_thread(_common.row_plan(4096, 1536, ct.f32)) == 16
    assert row_sweep.WIDTHS == (1024, 1536, 2048, 3072, 4096)
    assert row_sweep.main(["--quick", "--kernels", "rms_norm", "--per", "8,32"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| rms_norm")]  # fmt: skip
    # (per thread, the library's pick?, warps) at 8x64 and 8x96
    got = [(r[3].strip(), r[4].strip(), r[5].strip()) for r in rows]
    assert got == [("8", "", "2"), ("32", "yes", "1")] * 2


@pytest.mark.parametrize(("dtype", "rows_a_block"), [("f32", (4, 16, 32)), ("bf16", (8, 32, 64))])
def test_row_sweep_times_the_causal_softmax_by_block_size(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    dtype: str,
    rows_a_block: tuple[int, int, int],
) -> None:
    """`--kernels softmax_causal`: one row per (CAUSAL_WARPS, CAUSAL_EXACT) asked, in the
    dtype asked, rows a block as launched, the library's pick marked and back afterwards, and
    each variant launched as asked (seen by the measurement; on sim: a check of the script
    only)."""
    from paper_repro import row_sweep

    seen: list[tuple[int, bool, str]] = []
    prepare = row_sweep.bandwidth.prepare_cutile
    mod = row_sweep.softmax_mod
    timed: list[str] = []

    def spy(*args: Any) -> Any:
        _, _, tail = mod.softmax_launch(getattr(ct, dtype), 256, 256, True)
        seen.append((mod.CAUSAL_WARPS, bool(tail[-1]), args[4]))
        got = prepare(*args)
        key = f"{mod.CAUSAL_WARPS}/{tail[-1]}"

        def time() -> Any:  # each variant's replay launches what was prepared
            timed.append(key)
            return got.time()

        return replace(got, time=time)

    monkeypatch.setattr(row_sweep.bandwidth, "prepare_cutile", spy)
    before = (mod.CAUSAL_WARPS, mod.CAUSAL_EXACT)
    argv = ["--quick", "--kernels", "softmax_causal", "--causal-warps", "1,4,8", "--dtype", dtype,
            "--rounds", "2"]  # fmt: skip
    assert row_sweep.main(argv) == 0
    assert (mod.CAUSAL_WARPS, mod.CAUSAL_EXACT) == before == (1, True)
    variants = [(w, e) for w in (1, 4, 8) for e in (True, False)]
    assert seen == [(w, e, dtype) for w, e in variants]
    # two interleaved rounds, the second starting at the second variant
    keys = [f"{w}/{int(e)}" for w, e in variants]
    assert timed == keys + keys[1:] + keys[:1]
    rows = [[c.strip() for c in line.split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| softmax_causal")]  # fmt: skip
    # (shape, CAUSAL_WARPS, exact, library's pick?, rows a block) at 1x256x256 (32-column
    # chunks: a warp covers 4 rows of f32, 8 of bf16)
    want = [(f"1x256x256 {dtype}", str(w), e, "yes" if (w, e) == (1, "yes") else "", str(rows))
            for w, rows in zip((1, 4, 8), rows_a_block) for e in ("yes", "no")]  # fmt: skip
    assert [(r[2], r[3], r[4], r[5], r[6]) for r in rows] == want
    assert all(float(r[7]) > 0 and "error" not in r[7] for r in rows)
    assert all(float(r[11]) >= 0 for r in rows)  # the spread of the two rounds


def test_row_sweep_names_a_bad_causal_exact(capsys: pytest.CaptureFixture[str]) -> None:
    from paper_repro import row_sweep

    with pytest.raises(SystemExit):
        row_sweep.main(["--quick", "--kernels", "softmax_causal", "--causal-exact", "1,yes"])
    assert "--causal-exact: expected 1 (element by element) or 0 (whole), got 'yes'" in (
        capsys.readouterr().err
    )


def test_row_sweep_times_rows_a_block(capsys: pytest.CaptureFixture[str]) -> None:
    """`--block-elems`: the f32 norms' blocks of that many elements (rows a block: it over the
    width) with each per-thread count, as launched, and the library's blocks back after (on
    sim, tiny shapes: a check of the script only)."""
    from cutile_py_kernels import _common
    from paper_repro import row_sweep

    before = dict(_common.BLOCK_ELEMS)
    argv = ["--quick", "--kernels", "rms_norm", "--per", "16", "--block-elems", "64,256"]
    assert row_sweep.main(argv) == 0
    assert before == _common.BLOCK_ELEMS
    rows = [[c.strip() for c in line.split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| rms_norm")]  # fmt: skip
    # (shape, warps, rows a block): 8x64 (one row of 64, then four), 8x96 (a tile of 128: one
    # row, then two)
    want = [("8x64", "1", "1"), ("8x64", "1", "4"), ("8x96", "1", "1"), ("8x96", "1", "2")]
    assert [(r[2], r[5], r[10]) for r in rows] == want
    assert all(float(r[6]) > 0 for r in rows)


@pytest.mark.parametrize(("dtype", "tiles"), [("f32", (1024, 4096)), ("bf16", (4096, 2048))])
def test_row_sweep_times_gelu_by_elements_a_block(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    dtype: str,
    tiles: tuple[int, int],
) -> None:
    """`--kernels gelu`: each tile asked is the one launched (seen when it is prepared), in
    the dtype asked, timed in two interleaved rounds, the library's tile (4 KiB of input)
    marked and back afterwards (on sim, 4096 elements: a check of the script only)."""
    from cutile_py_kernels import activations
    from paper_repro import row_sweep

    seen: list[tuple[int, str]] = []
    timed: list[int] = []
    prepare = row_sweep.bandwidth.prepare_cutile

    def spy(*args: Any) -> Any:
        tile = activations._tile(ct.f32)
        seen.append((tile, args[4]))
        got = prepare(*args)

        def time() -> Any:
            timed.append(tile)
            return got.time()

        return replace(got, time=time)

    monkeypatch.setattr(row_sweep.bandwidth, "prepare_cutile", spy)
    argv = ["--quick", "--kernels", "gelu", "--gelu-tiles", ",".join(map(str, tiles)),
            "--dtype", dtype, "--rounds", "2"]  # fmt: skip
    assert row_sweep.main(argv) == 0
    assert seen == [(t, dtype) for t in tiles]
    assert timed == [tiles[0], tiles[1], tiles[1], tiles[0]]  # round 2 starts at the second
    assert activations._tile(ct.f32) == 1024 and activations._tile(ct.bf16) == 2048
    rows = [[c.strip() for c in line.split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| gelu")]  # fmt: skip
    library = activations._tile(getattr(ct, dtype))
    want = [("4096", dtype, str(t), "yes" if t == library else "") for t in tiles]
    assert sum(w[3] == "yes" for w in want) == 1
    assert [(r[2], r[3], r[4], r[5]) for r in rows] == want
    assert all(float(r[6]) > 0 and float(r[10]) >= 0 for r in rows)


def _faked_sweep(monkeypatch: pytest.MonkeyPatch, rounds_us: list[float], names: list[str]) -> Any:
    """A cuda context for `row_sweep`'s tables with every preparation faked (no GPU, no
    Triton): each variant moves 1e6 bytes in `rounds_us[r]` microseconds in round r, the
    same-size copy runs at 200 GB/s; `names` records "cutile_py" or "triton" as each is
    prepared."""
    from paper_repro import row_sweep
    from paper_repro.core import Context
    from paper_repro.experiments import bandwidth
    from paper_repro.timing import Measurement, Timer

    def prepared(*args: Any) -> bandwidth.Prepared:
        names.append("triton" if "triton" in args else "cutile_py")
        us = iter(rounds_us)

        def time() -> Measurement:
            return Measurement(next(us), 9.0, 12.0, 1, "cuda-events")

        return bandwidth.Prepared("x", 1_000_000, time, {"impl": "x"})

    monkeypatch.setattr(row_sweep, "same_size_copy", lambda ctx, nbytes: 200.0)
    monkeypatch.setattr(row_sweep, "peer_missing", lambda name: None)
    monkeypatch.setattr(bandwidth, "host_arrays", lambda ctx, spec, shape: [])
    monkeypatch.setattr(bandwidth, "prepare_cutile", prepared)
    monkeypatch.setattr(bandwidth, "prepare_peer", prepared)
    return Context("cuda", False, Timer("cuda", reps=1, warmup=0), 1 << 20, {})


def test_row_sweeps_triton_rows_name_the_warps_triton_ran(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The causal sweep's Triton rows (here with every measurement faked: no GPU, no
    Triton) name the warps `triton_kernels.softmax` launches at that width: 4 at 1024, 8 at
    2048, not the library's CAUSAL_WARPS; each row is the median of its rounds."""
    from paper_repro import row_sweep

    monkeypatch.setattr(row_sweep, "CAUSAL_SHAPES", ((2, 1024, 1024), (1, 2048, 2048)))
    ctx = _faked_sweep(monkeypatch, [10.0, 12.0, 9.0], [])  # three rounds: median 10
    row_sweep.causal_sweep(ctx, 400.0, [1, 4], [True], rounds=3)
    rows = [[c.strip() for c in line.split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ")][1:]  # fmt: skip
    # (kernel, shape, warps, rows a block)
    assert [(r[1], r[2], r[3], r[6]) for r in rows] == [
        ("softmax_causal", "2x1024x1024 f32", "1", "1"),
        ("softmax_causal", "2x1024x1024 f32", "4", "4"),
        ("triton", "2x1024x1024 f32", "4", "1"),
        ("softmax_causal", "1x2048x2048 f32", "1", "1"),
        ("softmax_causal", "1x2048x2048 f32", "4", "2"),
        ("triton", "1x2048x2048 f32", "8", "1"),
    ]
    # 1e6 bytes in the median 10 us: 100 GB/s, a quarter of the copy ceiling, half of the
    # same-size copy; the rounds spread (12 - 9) / 10
    assert all(r[7:12] == ["10.0", "100", "0.250", "0.500", "0.3"] for r in rows)


def test_row_sweeps_norms_table_has_tritons_rms_norm(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The norms' table gives Triton's rms_norm (where installed; faked here: no GPU) a row
    beside the variants, with the elements a thread and warps its kernel runs (a row a
    program: 2048 wide at 1536, 8 warps, 8 a thread), timed in the same rounds."""
    from paper_repro import row_sweep
    from paper_repro.experiments import bandwidth

    names: list[str] = []
    ctx = _faked_sweep(monkeypatch, [10.0, 10.0], names)
    spec = {s.name: s for s in bandwidth.SPECS}["rms_norm"]
    row_sweep.norms_table(ctx, 400.0, spec, (4096, 1536), [8, 16], [2048], rounds=2)
    rows = [[c.strip() for c in line.split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ")]  # fmt: skip
    # (kernel, per thread, warps, rows a block): one row a block, 4 warps at 8 a thread
    # (1536 / 256 = 6, a power of two below), 2 at 16
    want = [("rms_norm", "8", "4", "1"), ("rms_norm", "16", "2", "1"), ("triton", "8", "8", "1")]
    assert [(r[1], r[3], r[5], r[10]) for r in rows] == want
    assert names == ["cutile_py", "cutile_py", "triton"]
    assert all(r[6:10] == ["10.0", "100", "0.250", "0.500"] and float(r[11]) == 0 for r in rows)


@pytest.mark.parametrize(
    "argv",
    [
        ["--kernels", "softmax_causal", "--causal-warps", "1,2", "--rounds", "2"],
        ["--kernels", "gelu", "--gelu-tiles", "1024,2048", "--dtype", "bf16"],
        ["--kernels", "rms_norm", "--widths", "1536", "--per", "8,16", "--block-elems", "2048"],
    ],
)
def test_row_sweeps_run_their_cuda_paths_over_a_null_device(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweeps `lease_check.sh` runs, on the cuda backend over the null driver (every
    driver call checked against the real bindings; small shapes): every variant prepared,
    replayed and timed, no error row. The null device's times are zeros: a check of the
    script, not of a GPU."""
    from paper_repro import row_sweep
    from paper_repro.experiments.common import measure_copy
    from paper_repro.experiments.host import null_cuda

    monkeypatch.setattr(row_sweep, "CAUSAL_SHAPES", ((2, 256, 256),))
    monkeypatch.setattr(row_sweep, "GELU_SIZES", (1 << 14,))
    monkeypatch.setattr(row_sweep.bandwidth, "ROWS", 64)

    def small_ceiling(ctx: Any) -> Any:  # the real one copies 2^28 floats
        ctx.ceilings["copy_gbps"] = 1.0
        return measure_copy(ctx, 1 << 12)

    monkeypatch.setattr(row_sweep, "copy_ceiling", small_ceiling)
    with null_cuda(check_arguments=True):
        assert row_sweep.main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| kernel")]  # fmt: skip
    assert len(rows) == 4 if "softmax_causal" in argv else len(rows) == 2
    assert not [r for r in rows if "error" in r], rows


def test_gemm_timing_check_runs_over_a_null_device(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script the next GPU lease runs first, end to end on the cuda backend over the null
    driver (every driver call checked against the real bindings; no PyTorch: no cuBLAS rows):
    the tuner's pick and the sweep's best configs, each over both operand kinds, and the lines
    `lease_check.sh` prints from it. The times are the null device's zeros: a check of the
    script, not of a GPU."""
    from cutile_py_kernels import autotune
    from paper_repro import gemm_timing_check, gpu_monitor
    from paper_repro.experiments.host import null_cuda

    monkeypatch.setitem(sys.modules, "torch", None)  # import fails: no cuBLAS rows
    monkeypatch.setattr(autotune, "TUNER", autotune.TUNER)  # the script installs its own
    monkeypatch.setattr(gpu_monitor, "NVML_LIBRARIES", ("libnvidia-ml.absent",))  # no NVML
    with null_cuda(check_arguments=True):
        assert gemm_timing_check.main(["--n", "256"]) == 0
    out = capsys.readouterr().out
    assert "(no clock samples: NVML: libnvidia-ml not found)" in out
    cells = [line.split("|") for line in out.splitlines() if line.startswith("| ")]
    assert cells[0][6].strip() == "GPU while timed"
    assert {c[6].strip() for c in cells[1:]} == {"no GPU samples (NVML: libnvidia-ml not found)"}
    rows = [c[1:3] for c in cells]
    tuned = next(r[0].replace("(tuner)", "") for r in rows if "(tuner)" in r[0])
    best = [" ".join(map(str, autotune.GemmConfig(*c).astuple()))
            for c in gemm_timing_check.SWEEP_BEST]  # fmt: skip
    want = [c.strip() for c in (tuned, *best)]
    got = [(r[0].replace("(tuner)", "").strip(), r[1].strip()) for r in rows[1:]]
    assert got == [(c, kind) for kind in ("ct-scaled", "ct-plain") for c in want]
    assert "The tuner picked GemmConfig(" in out
    assert 1 <= out.count("\n- finalist GemmConfig(") <= autotune.FINALISTS


@pytest.mark.parametrize("experiment", ["bandwidth", "gemm"])
def test_the_leases_experiments_run_their_cuda_paths_over_a_null_device(
    experiment: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`bandwidth` (f32 and bf16 in two rounds, with each size's own copy, cuMemcpyDtoD
    included) and `gemm` (the tuner on cuda, the replayed launch) on the cuda backend over
    the null driver, every driver call checked against the real bindings, at the quick
    sizes: every cutile_py row ok. The null
    device's times are zeros, so rates are NaN: a check of the harness, not of a GPU."""
    import importlib

    from cutile_py_kernels import autotune
    from paper_repro import gpu_monitor
    from paper_repro.core import Context
    from paper_repro.experiments.host import null_cuda
    from paper_repro.timing import Timer

    monkeypatch.setattr(autotune, "TUNER", autotune.Autotuner(path=tmp_path / "gemm.json"))
    monkeypatch.setattr(gpu_monitor, "NVML_LIBRARIES", ("libnvidia-ml.absent",))
    module = importlib.import_module(f"paper_repro.experiments.{experiment}")
    with null_cuda(check_arguments=True):
        ctx = Context("cuda", True, Timer("cuda", reps=3, warmup=1), 50 << 20, {})
        res = module.run(ctx, ["rms_norm", "softmax_causal"], dtypes=("f32", "bf16"), rounds=2) \
            if experiment == "bandwidth" else module.run(ctx)  # fmt: skip
    ours = [r for r in res.rows if r.get("impl") == "cutile_py"]
    assert ours and all(r["status"] == "ok" for r in ours), ours
    if experiment == "bandwidth":
        assert {(r["dtype"], r["rounds"]) for r in ours} == {("f32", 2), ("bf16", 2)}
        copies = [r for r in res.rows if r.get("kernel") == "copy (ceiling)"]
        assert {r["impl"] for r in copies} == {"ptx copy kernel", "cuMemcpyDtoDAsync"}
        assert all("frac_same_copy" in r for r in ours)
        assert len(ctx.copies) == len({r["bytes"] for r in ours})
    else:  # what the GPU's clocks were while each row was timed (no NVML here)
        want = "GPU: no GPU samples (NVML: libnvidia-ml not found)"
        assert all(str(r["note"]).endswith(want) for r in ours), ours
        assert not any("from rest" in n for n in res.notes)  # nothing waited on


def test_the_gemm_experiment_times_each_row_from_rest(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With clock readings (a stand-in sampler: under the power cap until 0.2 s after the
    first row asks to settle, then at rest) the GEMM experiment starts each row once the
    limit is gone and 0.5 s of rest is seen, says how long that took in the row's note, and
    says what it did in the report's notes."""
    import time

    from cutile_py_kernels import autotune
    from paper_repro import gpu_monitor
    from paper_repro.core import Context
    from paper_repro.experiments import gemm
    from paper_repro.experiments.host import null_cuda
    from paper_repro.timing import Timer

    monkeypatch.setattr(autotune, "TUNER", autotune.Autotuner(path=tmp_path / "gemm.json"))
    monkeypatch.setattr(gpu_monitor, "PERIOD_MS", 5)
    cool_at: list[float] = []

    def source() -> Any:
        def read() -> gpu_monitor.Sample:
            now = time.monotonic()
            hot = not cool_at or now < cool_at[0]
            return gpu_monitor.Sample(now, 1200.0 if hot else 345.0, 1980.0, 700.0, 55.0,
                                      0x4 if hot else 0x1)  # fmt: skip

        return read, lambda: None

    class Monitor(gpu_monitor.GpuMonitor):
        def settle(self, quiet_s: float = 0.5, limit_s: float = 15.0) -> str:
            if not cool_at:
                cool_at.append(time.monotonic() + 0.2)
            return super().settle(quiet_s, limit_s)

    monkeypatch.setattr(gemm, "GpuMonitor", lambda: Monitor(source=source))
    with null_cuda(check_arguments=True):
        res = gemm.run(Context("cuda", True, Timer("cuda", reps=3, warmup=1), 50 << 20, {}))
    ours = [r for r in res.rows if r.get("impl") == "cutile_py"]
    assert ours and all(r["status"] == "ok" for r in ours), ours
    pattern = r"GPU \(settled in ([0-9.]+) s\): SM \d+ MHz"
    waits = [re.search(pattern, str(r["note"])) for r in ours]
    assert all(waits), ours
    # The first row waited out the cap (0.2 s of it, then 0.5 s of rest); the later ones
    # found the GPU at rest.
    assert float(waits[0].group(1)) >= 0.65  # type: ignore[union-attr]
    assert all(float(w.group(1)) < 0.65 for w in waits[1:])  # type: ignore[union-attr]
    assert any("timed from rest" in n for n in res.notes)


def test_gemm_sweeps_run_after_run_table_runs_over_a_null_device(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`gemm_sweep --sustained`'s table (the lease's last step) on the cuda backend over the
    null driver, PyTorch faked (its events read 1 ms): the fastest configs, the tuner's pick
    and cuBLAS, each with what the GPU's clocks were (no NVML here)."""
    from types import SimpleNamespace

    from cutile_py_kernels import autotune
    from paper_repro import gemm_sweep, gpu_monitor
    from paper_repro.experiments.host import null_cuda

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            pass

        def record(self) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end: Event) -> float:
            return 1.0

    torch = SimpleNamespace(
        cuda=SimpleNamespace(Event=Event),
        empty_like=lambda x: object(),
        matmul=lambda a, b, out: out,
    )
    monkeypatch.setattr(autotune, "TUNER", autotune.Autotuner(path=tmp_path / "gemm.json"))
    monkeypatch.setattr(gpu_monitor, "NVML_LIBRARIES", ("libnvidia-ml.absent",))
    n, dt = 256, ct.bf16
    with null_cuda(check_arguments=True):
        ct.set_backend("cuda")
        a, b = ct.zeros((n, n), dt), ct.zeros((n, n), dt)
        best = autotune.GemmConfig(128, 128, 64, 4, 0, 8, 1)
        rows = [(1.0, best, "wgmma+tma+ws", 0.0, "")]
        gemm_sweep._sustained(torch, 1, rows, dt, n, a, b, object(), object())
    out = capsys.readouterr().out
    table = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
             if line.startswith("| ") and "---" not in line]  # fmt: skip
    assert table[0] == ["config", "us per launch", "TFLOP/s", "GPU while timed"]
    assert table[1][0] == " ".join(map(str, best.astuple())) + (
        " (tuner)" if autotune.TUNER.last == best else ""
    )
    assert table[-1][:2] == ["cuBLAS (torch.matmul)", f"{1e3 / gemm_sweep.RUNS:.1f}"]
    assert all(r[3] == "no GPU samples (NVML: libnvidia-ml not found)" for r in table[1:])
