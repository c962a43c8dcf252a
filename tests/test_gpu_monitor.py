"""paper_repro.gpu_monitor: nvidia-smi's samples parsed and gathered per window (here a
stand-in process prints them: this machine has no GPU)."""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path

import pytest

from paper_repro import gpu_monitor
from paper_repro.gpu_monitor import GpuMonitor, parse_sample, reason_names


def _printer(lines: list[str], period_s: float = 0.01) -> list[str]:
    """A command printing `lines` one per period, as `nvidia-smi --loop-ms` does, then the
    last one forever."""
    code = (
        "import sys, time\n"
        f"lines = {lines!r}\n"
        "i = 0\n"
        "while True:\n"
        "    print(lines[min(i, len(lines) - 1)], flush=True)\n"
        "    i += 1\n"
        f"    time.sleep({period_s})\n"
    )
    return [sys.executable, "-c", code]


def test_a_line_of_nvidia_smi_reads_as_a_sample() -> None:
    s = parse_sample("1755, 1980, 699.52, 61, 0x0000000000000004", 3.0)
    assert s is not None
    assert (s.t, s.sm_mhz, s.max_sm_mhz, s.power_w, s.temp_c, s.reasons) == (
        3.0, 1755.0, 1980.0, 699.52, 61.0, 4
    )  # fmt: skip
    # A field it cannot read leaves the others standing.
    s = parse_sample("1755, 1980, [N/A], 61, [Not Supported]", 0.0)
    assert s is not None and (s.sm_mhz, s.temp_c, s.reasons) == (1755.0, 61.0, None)
    assert math.isnan(s.power_w)
    assert parse_sample('Field "clocks_event_reasons.active" is not a valid field', 0.0) is None
    assert reason_names(0x24) == ["sw power cap", "sw thermal"]
    assert reason_names(0x1000 | 0x40) == ["hw thermal", "0x1000"]


def test_a_window_gathers_the_samples_taken_while_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_monitor, "PERIOD_MS", 10)
    cool = "1980, 1980, 420.0, 40, 0x0000000000000000"
    hot = "1650, 1980, 700.1, 66, 0x0000000000000004"
    with GpuMonitor(command=_printer([cool] * 5 + [hot])) as gpu:
        assert gpu.failure == ""
        with gpu.window() as first:
            time.sleep(0.02)
        time.sleep(0.2)  # the stand-in has moved on to the hot line
        with gpu.window() as later:
            time.sleep(0.1)
    assert first.samples and later.samples
    assert first.samples[0].power_w == 420.0
    assert {s.sm_mhz for s in later.samples} == {1650.0}
    assert later.summary() == "SM 1650 MHz (1980 max), 700 W, 66 C: sw power cap"
    assert all(s.t >= later.samples[0].t for s in later.samples)


def test_without_nvidia_smi_windows_say_they_have_no_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_monitor.shutil, "which", lambda _: None)
    with GpuMonitor() as gpu, gpu.window() as w:
        pass
    assert gpu.failure == "nvidia-smi: not found"
    assert w.summary() == "no GPU samples"
    # One that names a field it does not know (an older driver) fails on its first line.
    bad = 'Field "clocks_event_reasons.active" is not a valid field to query.'
    with GpuMonitor(command=_printer([bad])) as gpu, gpu.window() as w:
        pass
    assert gpu.failure == f"nvidia-smi: {bad}" and not w.samples


def test_an_older_drivers_field_name_is_tried_next(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A stand-in nvidia-smi that knows only the older name of the limit reasons' field
    (and records what it was asked)."""
    asked = tmp_path / "asked.txt"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import sys, time\n"
        f"open({str(asked)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "if 'clocks_event_reasons.active' in ' '.join(sys.argv):\n"
        "    print('Field \"clocks_event_reasons.active\" is not a valid field to query.')\n"
        "    sys.exit(2)\n"
        "while True:\n"
        "    print('1980, 1980, 500.0, 50, 0x0000000000000000', flush=True)\n"
        "    time.sleep(0.01)\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(gpu_monitor.shutil, "which", lambda _: str(fake))
    with GpuMonitor(index=1) as gpu, gpu.window() as w:
        time.sleep(0.05)
    assert gpu.failure == "" and w.summary().startswith("SM 1980 MHz (1980 max), 500 W")
    first, second = asked.read_text().splitlines()[:2]
    assert "--id=1" in first and "clocks_event_reasons.active" in first
    assert "clocks_throttle_reasons.active" in second
    assert "--format=csv,noheader,nounits" in second and "--loop-ms=50" in second


def test_a_field_nvidia_smi_cannot_read_costs_only_that_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU whose power draw (or limit reasons) nvidia-smi reads as "[N/A]": the clock and
    the rest are still sampled, the unread fields say n/a."""
    monkeypatch.setattr(gpu_monitor, "PERIOD_MS", 10)

    def summary(line: str) -> str:
        with GpuMonitor(command=_printer([line])) as gpu, gpu.window() as w:
            time.sleep(0.05)
        assert gpu.failure == "" and w.samples
        return w.summary()

    assert summary("1650, 1980, [N/A], 66, 0x0000000000000004") == (
        "SM 1650 MHz (1980 max), n/a W, 66 C: sw power cap"
    )
    assert (
        summary("1700, 1980, 650.0, 64, [N/A]") == "SM 1700 MHz (1980 max), 650 W, 64 C: limits n/a"
    )
    assert summary("[N/A], [N/A], [N/A], [N/A], [N/A]") == (
        "SM n/a MHz (n/a max), n/a W, n/a C: limits n/a"
    )


def test_an_nvidia_smi_that_writes_nothing_does_not_hold_the_measurement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One that hangs before its first line (a driver in a bad state): entering the monitor
    gives up after FIRST_LINE_S, and the windows say they have no samples."""
    monkeypatch.setattr(gpu_monitor, "FIRST_LINE_S", 0.5, raising=False)
    silent = [sys.executable, "-c", "import time; time.sleep(8)"]
    entered: list[GpuMonitor] = []

    def enter() -> None:
        with GpuMonitor(command=silent) as gpu, gpu.window() as w:
            pass
        assert not w.samples
        entered.append(gpu)

    t = threading.Thread(target=enter, daemon=True)
    started = time.monotonic()
    t.start()
    t.join(5)
    assert not t.is_alive(), "entering the monitor waited on nvidia-smi's first line"
    assert time.monotonic() - started < 5
    assert entered and entered[0].failure == "nvidia-smi: no output in 0.5 s"
