"""The bandwidth experiment's rounds, dtypes and checkpoints: implementations timed in turn and
compared with Triton round by round, bf16 rows moving half the bytes, and a run cut short
keeping the rows it measured."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from paper_repro import __main__ as cli
from paper_repro.core import Context, sig
from paper_repro.experiments import bandwidth
from paper_repro.timing import Measurement, Timer

SPECS = {s.name: s for s in bandwidth.SPECS}


def _measurement(us: float) -> Measurement:
    return Measurement(us, 0.9 * us, 1.1 * us, 15, "cuda-events")


def _fake_impls(
    monkeypatch: pytest.MonkeyPatch,
    times: dict[str, list[float]] | Callable[[str, str], list[float]],
    order: list[str],
    fail: dict[str, int] | None = None,
) -> None:
    """Each implementation prepared without a GPU: its r-th timing returns times[impl][r]
    (or times(impl, shape label)[r]), and raises at round fail[impl]; `order` records which
    was timed when."""
    fail = fail or {}

    def prepare(impl: str, spec: bandwidth.Spec, shape: bandwidth.Shape, dtype: str) -> Any:
        mine = times(impl, bandwidth._label(shape)) if callable(times) else times[impl]
        calls = iter(range(len(mine)))

        def time() -> Measurement:
            r = next(calls)
            order.append(impl)
            if fail.get(impl) == r:
                raise RuntimeError(f"{impl} failed in round {r}")
            return _measurement(mine[r])

        nbytes = bandwidth.spec_bytes(spec, shape, dtype)
        return bandwidth.Prepared(impl, nbytes, time, bandwidth._fields(spec, impl, shape, dtype))

    def cutile(ctx: Context, spec: bandwidth.Spec, fn: Any, shape: Any, dtype: str,
               arrays: Any) -> Any:  # fmt: skip
        return prepare("cutile_py", spec, shape, dtype)

    def peer(ctx: Context, spec: bandwidth.Spec, name: str, shape: Any, dtype: str,
             arrays: Any) -> Any:  # fmt: skip
        return prepare(name, spec, shape, dtype)

    monkeypatch.setattr(bandwidth, "prepare_cutile", cutile)
    monkeypatch.setattr(bandwidth, "prepare_peer", peer)
    monkeypatch.setattr(bandwidth, "peer_missing", lambda name, **_: None)


def _cuda_ctx() -> Context:
    """A context as a GPU run's, with nothing measured: no copy ceiling, so no fractions."""
    return Context("cuda", False, Timer("sim", reps=1, warmup=0), 0, {})


def test_rounds_take_turns_and_compare_with_triton_round_by_round(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    rounds = 5
    times = {impl: list(rng.uniform(10.0, 20.0, rounds)) for impl in ("cutile_py", "torch",
                                                                       "triton")}  # fmt: skip
    order: list[str] = []
    _fake_impls(monkeypatch, times, order)
    spec = SPECS["rms_norm"]
    rows = bandwidth.measure_shape(_cuda_ctx(), spec, object(), (4096, 1536), "bf16", rounds)
    # round r starts at the r-th implementation: none is always the first after a pause
    impls = ["cutile_py", "torch", "triton"]
    assert order == [impls[(i + r) % 3] for r in range(rounds) for i in range(3)]
    by_impl = {r["impl"]: r for r in rows}
    assert set(by_impl) == set(impls)
    for impl, row in by_impl.items():
        medians = times[impl]
        assert row["status"] == "ok" and row["dtype"] == "bf16" and row["rounds"] == rounds
        assert row["time_us"] == sig(statistics.median(medians))
        assert row["min_us"] == sig(0.9 * min(medians))
        assert row["spread"] == sig((max(medians) - min(medians)) / statistics.median(medians))
        assert row["bytes"] == (8 * 4096 * 1536 + 4 * 1536) // 2  # bf16: half of f32's
    ratios = [t / o for o, t in zip(times["cutile_py"], times["triton"])]
    ours = by_impl["cutile_py"]
    assert ours["vs_triton"] == sig(statistics.median(ratios))
    assert ours["vs_triton_range"] == f"{min(ratios):.3f}-{max(ratios):.3f}"
    assert "vs_triton" not in by_impl["torch"] and "vs_triton" not in by_impl["triton"]


def test_a_failing_round_is_an_error_row_and_the_others_go_on(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    times = {impl: list(rng.uniform(10.0, 20.0, 3)) for impl in ("cutile_py", "torch", "triton")}
    order: list[str] = []
    _fake_impls(monkeypatch, times, order, fail={"torch": 1})
    rows = bandwidth.measure_shape(_cuda_ctx(), SPECS["rms_norm"], object(), (8, 64), "f32", 3)
    assert order.count("torch") == 2  # timed no more after it failed
    assert [(r["impl"], r["status"]) for r in rows] == [
        ("torch", "error"), ("cutile_py", "ok"), ("triton", "ok")]  # fmt: skip
    assert "torch failed in round 1" in str(rows[0]["note"])


def test_the_summary_names_the_shapes_behind_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's time over ours below 1 at one shape of two: the summary says where, with the
    rounds' range."""
    times = {
        ("cutile_py", "4096x1536"): [10.0, 10.2, 10.1],
        ("triton", "4096x1536"): [9.9, 10.0, 10.05],
        ("cutile_py", "4096x4096"): [20.0, 20.4, 19.8],
        ("triton", "4096x4096"): [20.2, 20.6, 20.1],
    }
    _fake_impls(monkeypatch, lambda impl, label: times[impl, label], [])
    spec = SPECS["rms_norm"]
    monkeypatch.setattr(bandwidth, "SPECS", [replace(spec, peers={"triton": spec.peers["triton"]})])
    monkeypatch.setattr(bandwidth, "copy_ceiling", lambda ctx: [])
    res = bandwidth.run(_cuda_ctx(), ["rms_norm"], rounds=3, shapes=["4096x1536", "4096x4096"])
    ours, theirs = times["cutile_py", "4096x1536"], times["triton", "4096x1536"]
    want = sig(statistics.median([t / o for o, t in zip(ours, theirs)]))
    assert want < 1
    line = next(s for s in res.summary if s.startswith("against Triton"))
    assert "the median of 3 interleaved rounds): even or ahead at 1 of 2" in line
    assert f"behind at rms_norm 4096x1536 f32 {want} (rounds 0.980-0.995)" in line


def test_shapes_and_dtypes_choose_what_is_timed_on_sim() -> None:
    """On sim (no peers): `shapes` keeps the shapes named, `dtypes` times each of them at
    f32 and bf16 (half the bytes), and a kernel with an int tensor says it is timed at f32
    only."""
    ct.set_backend("sim")
    ctx = Context("sim", True, Timer("sim", reps=1, warmup=0), 0, {})
    res = bandwidth.run(ctx, ["rms_norm", "rope"], dtypes=("f32", "bf16"), shapes=["8x96"])
    ok = [r for r in res.rows if r["status"] == "ok" and r.get("kernel") == "rms_norm"]
    assert [(r["shape"], r["dtype"]) for r in ok] == [("8x96", "f32"), ("8x96", "bf16")]
    assert ok[1]["bytes"] * 2 == ok[0]["bytes"] == 8 * 8 * 96 + 4 * 96
    assert all(r["kernels"] == "rms_norm_tile" for r in ok)
    rope = [r for r in res.rows if r.get("kernel") == "rope"]
    ours = [r for r in rope if r["impl"] == "cutile_py"]
    assert [(r["dtype"], r["status"], r["note"]) for r in ours] == [
        ("bf16", "missing", "timed at f32 only")]  # fmt: skip
    assert not [r for r in rope if r.get("shape")]  # no rope shape is labelled 8x96


def test_kernels_run_in_the_order_named_each_at_the_shapes_named_for_it() -> None:
    """`only` sets the order; a shape named for one kernel ("softmax:8x64") is timed for that
    kernel alone, a plain one for every kernel that has it (on sim)."""
    ct.set_backend("sim")
    ctx = Context("sim", True, Timer("sim", reps=1, warmup=0), 0, {})
    res = bandwidth.run(ctx, ["softmax", "rms_norm", "gelu"],
                        shapes=["softmax:8x64", "rms_norm:8x96", "4096"])  # fmt: skip
    got = [(r["kernel"], r["shape"]) for r in res.rows
           if r["status"] == "ok" and r["kernel"] != "copy (ceiling)"]  # fmt: skip
    assert got == [("softmax", "8x64"), ("rms_norm", "8x96"), ("gelu", "4096")]
    with pytest.raises(ValueError, match="no kernel rmsnorm"):
        bandwidth.run(ctx, ["rmsnorm"])


def test_a_run_cut_short_keeps_the_shapes_it_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped during its second shape (as a time limit stops it) leaves the first
    shape's rows in the CSV, the JSON and REPORT.md, which says the experiment was
    unfinished."""
    measure = bandwidth.measure_shape
    calls: list[int] = []

    def stopped_at_the_second(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise SystemExit(124)
        return measure(*args)

    monkeypatch.setattr(bandwidth, "measure_shape", stopped_at_the_second)
    argv = ["bandwidth", "--quick", "--only", "rms_norm", "--dtype", "bf16", "--out",
            str(tmp_path)]  # fmt: skip
    with pytest.raises(SystemExit):
        cli.main(argv)
    rows = json.loads((tmp_path / "bandwidth.json").read_text())["rows"]
    ours = [(r["shape"], r["dtype"], r["status"]) for r in rows if r.get("impl") == "cutile_py"]
    assert ours == [("8x64", "bf16", "ok")]
    assert "8x64" in (tmp_path / "bandwidth.csv").read_text()
    report = (tmp_path / "REPORT.md").read_text()
    assert "(unfinished when written: the rows of its first" in report
    assert "| rms_norm | cutile_py | 8x64 | bf16 | ok |" in report


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dtype", "f32,f64"], "--dtype: unknown dtype(s) f64"),
        (["--rounds", "0"], "--rounds: expected at least 1, got 0"),
        (["--only", "softmax,rmsnorm"], "--only: unknown kernel(s) rmsnorm; choose from add,"),
    ],
)
def test_bad_options_are_named(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.parse(["bandwidth", *argv])
    assert message in capsys.readouterr().err


def test_options_reach_the_experiment() -> None:
    args = cli.parse(["bandwidth", "--only", "gelu,softmax", "--dtype", "f32,bf16", "--rounds",
                      "3", "--shapes", "268435456,4096x1024"])  # fmt: skip
    want: dict[str, object] = {"only": ["gelu", "softmax"], "dtypes": ["f32", "bf16"],
                               "rounds": 3, "shapes": ["268435456", "4096x1024"]}  # fmt: skip
    assert cli.bandwidth_options(args) == want


def test_a_failure_after_some_shapes_keeps_their_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error the experiment does not catch (here in its second shape) leaves the rows
    checkpointed before it, beside the error, in the JSON and REPORT.md (they were replaced
    by the error row alone), and the report is not marked unfinished."""
    measure = bandwidth.measure_shape
    calls: list[int] = []

    def failing_at_the_second(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("lost the device")
        return measure(*args)

    monkeypatch.setattr(bandwidth, "measure_shape", failing_at_the_second)
    argv = ["bandwidth", "--quick", "--only", "rms_norm", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    rows = json.loads((tmp_path / "bandwidth.json").read_text())["rows"]
    ours = [(r["shape"], r["dtype"], r["status"]) for r in rows if r.get("impl") == "cutile_py"]
    assert ours == [("8x64", "f32", "ok")]
    assert [r["note"] for r in rows if r["status"] == "error"] == ["RuntimeError: lost the device"]
    report = (tmp_path / "REPORT.md").read_text()
    assert "| rms_norm | cutile_py | 8x64 | f32 | ok |" in report
    assert "unfinished" not in report


def test_the_buffers_go_before_the_copy_of_the_same_size(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """Every prepared implementation (its buffers) is released before the copy of the same
    size is timed: the last one was kept alive by the loop's variable."""
    times = {impl: list(rng.uniform(10.0, 20.0, 2)) for impl in ("cutile_py", "triton")}
    _fake_impls(monkeypatch, times, [])
    alive: list[weakref.ref[Any]] = []
    prepare = bandwidth.prepare_peer

    def tracked(*args: Any) -> Any:
        p = prepare(*args)
        alive.append(weakref.ref(p))
        return p

    monkeypatch.setattr(bandwidth, "prepare_peer", tracked)
    held: list[int] = []

    def copy(ctx: Context, nbytes: int) -> float:
        held.append(sum(r() is not None for r in alive))
        return 1000.0

    monkeypatch.setattr(bandwidth, "same_size_copy", copy)
    spec = SPECS["rms_norm"]
    spec = replace(spec, peers={"triton": spec.peers["triton"]})
    ctx = _cuda_ctx()
    ctx.ceilings["copy_gbps"] = 1000.0
    rows = bandwidth.measure_shape(ctx, spec, object(), (8, 64), "f32", 2)
    assert len(alive) == 1 and held == [0, 0]
    assert all(isinstance(r["frac_same_copy"], float) for r in rows)


def test_inputs_are_the_same_in_every_run() -> None:
    """`host_arrays` salts its generator with a stable digest of the kernel and shape, not
    Python's per-process string hash: a fresh interpreter draws the same inputs."""
    code = ("from paper_repro.core import Context; from paper_repro.timing import Timer; "
            "from paper_repro.experiments import bandwidth as b; "
            "ctx = Context('sim', True, Timer('sim', reps=1, warmup=0), 0, {}); "
            "spec = [s for s in b.SPECS if s.name == 'rms_norm'][0]; "
            "print(float(b.host_arrays(ctx, spec, (8, 64))[0].sum()))")  # fmt: skip
    root = Path(__file__).resolve().parents[1]
    sums = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(sums) == 1 and float(sums.pop()) != 0.0
