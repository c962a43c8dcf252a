"""The GPU's SM clock, power draw, temperature and clock-limit reasons while something runs,
sampled every PERIOD_MS by a thread through NVML (the driver's management library,
libnvidia-ml, by ctypes; read only: nothing is set).

    with GpuMonitor() as gpu:
        with gpu.window() as w:
            ...                      # a measurement
        print(w.summary())           # "SM 1755 MHz (1980 max), 699 W, 61 C: sw power cap"

On the H200 the same GEMM config timed 1426 us in a burst and 1769 us in the experiment, and
configs slowed run after run: whether a time was taken under a power or thermal limit is what
these windows say. Each sample is stamped when it is read (nvidia-smi's loop, read through a
pipe, could arrive in bursts). Where NVML is missing or fails, windows hold no samples and
the monitor's `failure` says why.
"""

from __future__ import annotations

import bisect
import ctypes
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

#: Milliseconds between samples.
PERIOD_MS = 20
#: Seconds NVML has to start and give its first sample: one that hangs (a driver in a bad
#: state) must not hold the measurement, which goes on without samples.
FIRST_SAMPLE_S = 10.0
#: Seconds a window waits at most for the first reading after it.
WAIT_AFTER_S = 0.5
#: Clock-limit reasons that slow a kernel down (power and thermal limits), which `settle`
#: waits out.
SLOWING = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
#: Seconds of readings free of SLOWING reasons that `settle` asks for.
SETTLED_S = 0.5
#: Seconds `settle` waits at most.
SETTLE_LIMIT_S = 15.0
#: Where NVML lives under each system's loader.
NVML_LIBRARIES = ("libnvidia-ml.so.1", "libnvidia-ml.so", "nvml.dll")
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
    """One reading, stamped with `time.monotonic()` when it was taken; a field NVML could not
    read is NaN (`reasons`: None)."""

    t: float
    sm_mhz: float
    max_sm_mhz: float
    power_w: float
    temp_c: float
    reasons: int | None


class NvmlError(RuntimeError):
    """NVML could not be loaded or started."""


class Nvml:
    """The NVML calls a sample needs, on device `index` (NVML's numbering, which is CUDA's on
    a one-GPU machine). `lib`: a loaded libnvidia-ml (found by the loader when not given)."""

    # nvmlClockType_t NVML_CLOCK_SM, nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU
    CLOCK_SM, TEMPERATURE_GPU = 1, 0

    def __init__(self, index: int = 0, lib: Any = None) -> None:
        self.lib = lib if lib is not None else _load_nvml()
        self._call("nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(self.handle))
        # Renamed in newer drivers; the old name stays exported.
        self._reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if self._reasons is None:
            self._reasons = self.lib.nvmlDeviceGetCurrentClocksThrottleReasons
        self.max_sm_mhz = self._read(
            self.lib.nvmlDeviceGetMaxClockInfo, ctypes.c_uint, self.CLOCK_SM
        )

    def _call(self, name: str, *args: Any) -> None:
        got = getattr(self.lib, name)(*args)
        if got != 0:
            raise NvmlError(f"{name} returned {got}")

    def _read(self, fn: Any, ctype: Any, *args: Any) -> float:
        """`fn(handle, *args, &out)` as a number, NaN where NVML does not say."""
        out = ctype()
        return float(out.value) if fn(self.handle, *args, ctypes.byref(out)) == 0 else math.nan

    def sample(self) -> Sample:
        lib = self.lib
        mhz = self._read(lib.nvmlDeviceGetClockInfo, ctypes.c_uint, self.CLOCK_SM)
        power_mw = self._read(lib.nvmlDeviceGetPowerUsage, ctypes.c_uint)
        temp = self._read(lib.nvmlDeviceGetTemperature, ctypes.c_uint, self.TEMPERATURE_GPU)
        reasons = self._read(self._reasons, ctypes.c_ulonglong)
        return Sample(
            time.monotonic(), mhz, self.max_sm_mhz, power_mw / 1e3, temp,
            None if math.isnan(reasons) else int(reasons),
        )  # fmt: skip

    def close(self) -> None:
        self.lib.nvmlShutdown()


def _load_nvml() -> Any:
    for name in NVML_LIBRARIES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise NvmlError("libnvidia-ml not found")


@dataclass
class Window:
    """The samples taken between a window's start and end."""

    samples: list[Sample] = field(default_factory=list)
    #: Why there are none, where the monitor knows.
    why: str = ""

    def summary(self) -> str:
        """Median SM clock (and the clock's maximum), the highest power and temperature, and
        every limit reason seen (the idle bit left out: a gap between launches)."""
        if not self.samples:
            return f"no GPU samples ({self.why})" if self.why else "no GPU samples"
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
    """`values` but those NVML could not read (NaN)."""
    return [v for v in values if not math.isnan(v)]


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


class GpuMonitor:
    """A thread sampling device `index` every PERIOD_MS; `window()` gathers the samples taken
    while its block runs. `source`: opens the sampler (NVML's, when not given) and returns
    its read function and its close function."""

    def __init__(
        self,
        index: int = 0,
        source: Callable[[], tuple[Callable[[], Sample], Callable[[], None]]] | None = None,
    ) -> None:
        self.index = index
        self.source = source or self._nvml
        self.samples: list[Sample] = []
        self.failure = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None

    def _nvml(self) -> tuple[Callable[[], Sample], Callable[[], None]]:
        nvml = Nvml(self.index)
        return nvml.sample, nvml.close

    def __enter__(self) -> GpuMonitor:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._started.wait(FIRST_SAMPLE_S):
            self.failure = f"NVML: no sample in {FIRST_SAMPLE_S:g} s"
            self._stop.set()
        return self

    def _run(self) -> None:
        try:
            read, close = self.source()
        except Exception as e:  # no NVML here, or it would not start: no samples
            self.failure = f"NVML: {e}"
            self._started.set()
            return
        try:
            while True:
                sample = read()
                with self._lock:
                    self.samples.append(sample)
                self._started.set()
                if self._stop.wait(PERIOD_MS / 1e3):
                    break
        except Exception as e:
            self.failure = f"NVML: {e}"
        finally:
            self._started.set()
            close()

    @property
    def sampling(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None and self._started.is_set():
            self._thread.join(timeout=5)  # one stuck in the driver is left behind (a daemon)

    def settle(self, quiet_s: float = SETTLED_S, limit_s: float = SETTLE_LIMIT_S) -> str:
        """Waits until the readings of the last `quiet_s` seconds show no power or thermal
        limit (SLOWING), at most `limit_s`, and says how long it waited. On the H200 a run of
        8192 GEMMs holds the SM clock under the power cap (1200 MHz where 1980 is the
        maximum), so whatever is timed right after it runs slower than the same kernel timed
        from rest: implementations compared with each other each start from rest. Without
        samples (no NVML) it returns "" at once; with none in the last `quiet_s` (NVML stuck
        in the driver), or none whose limit reasons NVML could read, it says so at once:
        there is nothing to wait on."""
        start = time.monotonic()
        while self.sampling:
            now = time.monotonic()
            with self._lock:
                since = bisect.bisect_left(self.samples, now - quiet_s, key=lambda s: s.t)
                recent = self.samples[since:]
                first = self.samples[0].t if self.samples else now
            covered = first <= now - quiet_s  # sampled for the whole quiet time
            if covered and not recent:
                return f"not waited: no reading in {quiet_s:g} s"
            known = [s.reasons for s in recent if s.reasons is not None]
            if covered and not known:
                return "not waited: limits n/a"
            if covered and not any(r & SLOWING for r in known):
                return f"settled in {now - start:.1f} s"
            if now - start >= limit_s:
                return f"still limited after {limit_s:g} s"
            time.sleep(PERIOD_MS / 1e3)
        return ""

    @contextmanager
    def window(self) -> Iterator[Window]:
        """The samples taken while the block runs, and the first one after it (filled in when
        it ends, after waiting up to WAIT_AFTER_S for that one: a block shorter than a
        period still gets the reading that follows it)."""
        w = Window()
        start = time.monotonic()
        try:
            yield w
        finally:
            end = time.monotonic()
            while self.sampling and time.monotonic() < end + WAIT_AFTER_S:
                with self._lock:
                    if self.samples and self.samples[-1].t >= end:
                        break
                time.sleep(PERIOD_MS / 4e3)
            with self._lock:
                after = next((s.t for s in self.samples if s.t >= end), end)
                w.samples = [s for s in self.samples if start <= s.t <= after]
            w.why = self.failure
