"""The GPU's SM clock, power draw, temperature and clock-limit reasons while something runs,
read from `nvidia-smi`'s own sampling loop (read only: nothing is set).

    with GpuMonitor() as gpu:
        with gpu.window() as w:
            ...                      # a measurement
        print(w.summary())           # "SM 1755 MHz (1980 max), 699 W, 61 C: sw power cap"

On the H200 the same GEMM config timed 1426 us in a burst and 1769 us in the experiment, and
configs slowed run after run: whether a time was taken under a power or thermal limit is what
these windows say. Where `nvidia-smi` is missing or fails, windows hold no samples and say so.
"""

from __future__ import annotations

import contextlib
import math
import queue
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType

#: nvidia-smi's query fields; the limit reasons' field was renamed in newer drivers.
FIELDS = "clocks.sm,clocks.max.sm,power.draw,temperature.gpu,{reasons}"
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
#: Milliseconds between samples.
PERIOD_MS = 50
#: Seconds nvidia-smi has for its first line: one that hangs (a driver in a bad state) must
#: not hold the measurement, which goes on without samples.
FIRST_LINE_S = 10.0
#: NVML's clock-limit reason bits (nvmlClocksEventReason*), by the name printed here.
REASONS = {
    0x1: "idle",
    0x2: "application clocks",
    0x4: "sw power cap",
    0x8: "hw slowdown",
    0x10: "sync boost",
    0x20: "sw thermal",
    0x40: "hw thermal",
    0x80: "hw power brake",
    0x100: "display clocks",
}


def reason_names(mask: int) -> list[str]:
    """The names of the limit reasons set in `mask` (unknown bits in hex)."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    return names + ([f"0x{rest:x}"] if rest else [])


@dataclass(frozen=True)
class Sample:
    """One nvidia-smi line, stamped with `time.monotonic()` when it was read; a field that
    nvidia-smi could not read ("[N/A]") is NaN (`reasons`: None)."""

    t: float
    sm_mhz: float
    max_sm_mhz: float
    power_w: float
    temp_c: float
    reasons: int | None


def _unread(cell: str) -> bool:
    """Whether `cell` is nvidia-smi's mark of a field it cannot read ("[N/A]", "[Not
    Supported]", "[Unknown Error]", ...)."""
    return cell.startswith("[") and cell.endswith("]")


def parse_sample(line: str, t: float) -> Sample | None:
    """A sample from a `--format=csv,noheader,nounits` line, or None (a header, an error
    message); a field nvidia-smi cannot read ("[N/A]") leaves the others standing."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != 5:
        return None
    try:
        sm, top, power, temp = (math.nan if _unread(c) else float(c) for c in cells[:4])
        reasons = None if _unread(cells[4]) else int(cells[4], 16)
    except ValueError:
        return None
    return Sample(t, sm, top, power, temp, reasons)


@dataclass
class Window:
    """The samples taken between a window's start and end."""

    samples: list[Sample] = field(default_factory=list)

    def summary(self) -> str:
        """Median SM clock (and the clock's maximum), the highest power and temperature, and
        every limit reason seen (the idle bit left out: a gap between launches)."""
        if not self.samples:
            return "no GPU samples"
        s = self.samples
        mhz, top = _known(x.sm_mhz for x in s), _known(x.max_sm_mhz for x in s)
        power, temp = _known(x.power_w for x in s), _known(x.temp_c for x in s)
        masks = [x.reasons for x in s if x.reasons is not None]
        mask = 0
        for m in masks:
            mask |= m
        why = (", ".join(reason_names(mask & ~0x1)) or "no limit") if masks else "limits n/a"
        return (
            f"SM {_cell(statistics.median(mhz) if mhz else None)} MHz "
            f"({_cell(top[0] if top else None)} max), {_cell(max(power, default=None))} W, "
            f"{_cell(max(temp, default=None))} C: {why}"
        )


def _known(values: Iterator[float]) -> list[float]:
    """`values` but those nvidia-smi could not read (NaN)."""
    return [v for v in values if not math.isnan(v)]


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _first_line(proc: subprocess.Popen[str]) -> str | None:
    """`proc`'s first line, or None where it writes none in FIRST_LINE_S (read by a thread of
    its own: a plain readline would wait for ever on an nvidia-smi that hangs)."""
    assert proc.stdout is not None
    stdout = proc.stdout
    got: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: got.put(stdout.readline()), daemon=True).start()
    try:
        return got.get(timeout=FIRST_LINE_S)
    except queue.Empty:
        return None  # the thread ends once `proc` is killed (its pipe closes)


def _end(proc: subprocess.Popen[str]) -> None:
    """Kill `proc` and reap it, waiting 5 s at most: a process stuck in the driver dies only
    when the driver lets it, and the measurement must not wait for that."""
    proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


class GpuMonitor:
    """nvidia-smi sampling device `index` every PERIOD_MS in a child process, read by a
    thread; `window()` gathers the samples taken while its block runs."""

    def __init__(self, index: int = 0, command: Sequence[str] | None = None) -> None:
        self.index = index
        self.command = list(command) if command is not None else None
        self.samples: list[Sample] = []
        self.failure = ""
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()

    def _commands(self) -> list[list[str]]:
        if self.command is not None:
            return [self.command]
        exe = shutil.which("nvidia-smi")
        if exe is None:
            self.failure = "nvidia-smi: not found"
            return []
        return [
            [exe, f"--id={self.index}", f"--query-gpu={FIELDS.format(reasons=r)}",
             "--format=csv,noheader,nounits", f"--loop-ms={PERIOD_MS}"]
            for r in REASON_FIELDS
        ]  # fmt: skip

    def __enter__(self) -> GpuMonitor:
        for cmd in self._commands():
            try:
                proc = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
                )
            except OSError as e:
                self.failure = f"nvidia-smi failed: {e}"
                continue
            first = _first_line(proc)  # an unknown field fails on the first line
            sample = None if first is None else parse_sample(first, time.monotonic())
            if sample is None:
                _end(proc)
                if first is None:  # hangs: the next field name would not fare better
                    self.failure = f"nvidia-smi: no output in {FIRST_LINE_S:g} s"
                    break
                self.failure = f"nvidia-smi: {first.strip() or 'no output'}"
                continue
            self.samples.append(sample)
            self._proc, self.failure = proc, ""
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
            break
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            sample = parse_sample(line, time.monotonic())
            if sample is not None:
                with self._lock:
                    self.samples.append(sample)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _end(self._proc)
        if self._reader is not None:
            self._reader.join(timeout=5)

    @contextmanager
    def window(self) -> Iterator[Window]:
        """The samples read while the block runs (filled in when it ends; one period more is
        waited for, so that a short block still gets the sample that covers it)."""
        w = Window()
        start = time.monotonic()
        try:
            yield w
        finally:
            end = time.monotonic()
            if self._proc is not None:
                time.sleep(PERIOD_MS / 1e3)
            with self._lock:
                w.samples = [s for s in self.samples if start <= s.t <= end + PERIOD_MS / 1e3]
