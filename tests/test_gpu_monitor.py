"""paper_repro.gpu_monitor: NVML's readings, sampled by a thread and gathered per window
(this machine has no GPU: a stand-in libnvidia-ml answers the same ctypes calls)."""

from __future__ import annotations

import ctypes
import math
import threading
import time
from typing import Any

import pytest

from paper_repro import gpu_monitor
from paper_repro.gpu_monitor import GpuMonitor, Nvml, Sample, reason_names

#: nvmlReturn_t NVML_ERROR_NOT_SUPPORTED
NOT_SUPPORTED = 3


class FakeNvml:
    """libnvidia-ml as ctypes calls it: each query writes its answer through the pointer it
    is given. `answers` maps a function to its value (None: NVML_ERROR_NOT_SUPPORTED);
    `modern`: the driver exports nvmlDeviceGetCurrentClocksEventReasons (else only the
    older ...ThrottleReasons)."""

    def __init__(self, answers: dict[str, Any], modern: bool = True) -> None:
        self.answers = answers
        self.calls: list[tuple[Any, ...]] = []
        if not modern:
            self.nvmlDeviceGetCurrentClocksEventReasons = None

    def __getattr__(self, name: str) -> Any:
        if name in ("nvmlInit_v2", "nvmlShutdown"):
            return lambda: self.calls.append((name,)) or 0
        if name == "nvmlDeviceGetHandleByIndex_v2":

            def handle(index: ctypes.c_uint, out: Any) -> int:
                self.calls.append((name, index.value))
                out._obj.value = 0x1234
                return 0

            return handle

        def query(handle: ctypes.c_void_p, *rest: Any) -> int:
            *args, out = rest
            self.calls.append((name, handle.value, *args))
            value = self.answers[name]
            if value is None:
                return NOT_SUPPORTED
            out._obj.value = value
            return 0

        return query


def _answers(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "nvmlDeviceGetMaxClockInfo": 1980,
        "nvmlDeviceGetClockInfo": 1755,
        "nvmlDeviceGetPowerUsage": 699_520,  # mW
        "nvmlDeviceGetTemperature": 61,
        "nvmlDeviceGetCurrentClocksEventReasons": 0x4,
        "nvmlDeviceGetCurrentClocksThrottleReasons": 0x20,
    }
    return base | changes


def test_nvml_answers_read_as_a_sample() -> None:
    lib = FakeNvml(_answers())
    nvml = Nvml(2, lib)
    s = nvml.sample()
    assert (s.sm_mhz, s.max_sm_mhz, s.power_w, s.temp_c, s.reasons) == (
        1755.0, 1980.0, 699.52, 61.0, 0x4
    )  # fmt: skip
    assert lib.calls[:2] == [("nvmlInit_v2",), ("nvmlDeviceGetHandleByIndex_v2", 2)]
    # Every query on that device; the SM clock (1) and the GPU's own sensor (0).
    assert ("nvmlDeviceGetClockInfo", 0x1234, 1) in lib.calls
    assert ("nvmlDeviceGetTemperature", 0x1234, 0) in lib.calls
    nvml.close()
    assert lib.calls[-1] == ("nvmlShutdown",)
    # A driver without the newer name: the older one; a field NVML does not give: NaN.
    s = Nvml(0, FakeNvml(_answers(nvmlDeviceGetPowerUsage=None), modern=False)).sample()
    assert s.reasons == 0x20 and math.isnan(s.power_w) and s.sm_mhz == 1755.0
    assert reason_names(0x24) == ["sw power cap", "sw thermal"]
    assert reason_names(0x1000 | 0x40) == ["hw thermal", "0x1000"]


def _stepping(values: list[tuple[float, float, float, int | None]]) -> Any:
    """A source whose n-th reading is values[min(n, len - 1)] (SM MHz, W, C, reasons)."""
    count = iter(range(1 << 30))

    def read() -> Sample:
        mhz, w, c, why = values[min(next(count), len(values) - 1)]
        return Sample(time.monotonic(), mhz, 1980.0, w, c, why)

    return lambda: (read, lambda: None)


def test_a_window_gathers_the_samples_taken_while_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_monitor, "PERIOD_MS", 5)
    cool, hot = (1980.0, 420.0, 40.0, 0), (1650.0, 700.1, 66.0, 0x4)
    with GpuMonitor(source=_stepping([cool] * 5 + [hot])) as gpu:
        assert gpu.failure == ""
        with gpu.window() as first:
            pass
        time.sleep(0.2)  # the source has moved on to the hot readings
        with gpu.window() as later:
            time.sleep(0.05)
    assert first.samples and later.samples
    assert first.samples[0].power_w == 420.0
    assert {s.sm_mhz for s in later.samples} == {1650.0} and len(later.samples) > 3
    assert later.summary() == "SM 1650 MHz (1980 max), 700 W, 66 C: sw power cap"
    times = [s.t for s in later.samples]
    assert times == sorted(times)
    assert not gpu.sampling  # the thread is stopped on exit


def test_unreadable_fields_cost_only_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_monitor, "PERIOD_MS", 5)
    source = _stepping([(1755.0, math.nan, 61.0, None)])
    with GpuMonitor(source=source) as gpu, gpu.window() as w:
        time.sleep(0.02)
    assert w.summary() == "SM 1755 MHz (1980 max), n/a W, 61 C: limits n/a"


def test_without_nvml_windows_say_why_they_have_no_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_monitor, "NVML_LIBRARIES", ("libnvidia-ml.absent",))
    with GpuMonitor() as gpu, gpu.window() as w:
        pass
    assert gpu.failure == "NVML: libnvidia-ml not found"
    assert w.summary() == "no GPU samples (NVML: libnvidia-ml not found)"
    # One that starts but fails: NVML's return code named.
    failing = FakeNvml(_answers())
    failing.__dict__["nvmlInit_v2"] = lambda: 999
    with GpuMonitor(source=lambda: (Nvml(0, failing).sample, lambda: None)) as gpu:
        pass
    assert gpu.failure == "NVML: nvmlInit_v2 returned 999"


def test_an_nvml_that_hangs_does_not_hold_the_measurement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A driver in a bad state may never answer: the monitor gives up after FIRST_SAMPLE_S
    and the measurement goes on without samples."""
    monkeypatch.setattr(gpu_monitor, "FIRST_SAMPLE_S", 0.2)
    released = threading.Event()

    def stuck() -> Any:
        released.wait(10)
        raise RuntimeError("never answered")

    began = time.monotonic()
    with GpuMonitor(source=stuck) as gpu, gpu.window() as w:
        pass
    assert time.monotonic() - began < 2
    assert gpu.failure == "NVML: no sample in 0.2 s" and not w.samples
    released.set()


def test_settle_waits_out_a_power_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_monitor, "PERIOD_MS", 5)
    hot, cool = (1200.0, 700.0, 58.0, 0x4), (1980.0, 300.0, 50.0, 0)
    with GpuMonitor(source=_stepping([hot] * 20 + [cool])) as gpu:
        t0 = time.monotonic()
        said = gpu.settle(quiet_s=0.05, limit_s=5)
        waited = time.monotonic() - t0
        # The hot readings (20 of them, 5 ms apart) and then 50 ms of cool ones.
        assert said.startswith("settled in") and waited >= 0.1
        last = gpu.samples[-1]
        assert last.reasons == 0
        # Settled already: back at once.
        t0 = time.monotonic()
        assert gpu.settle(quiet_s=0.05, limit_s=5).startswith("settled in")
        assert time.monotonic() - t0 < 0.5
    with GpuMonitor(source=_stepping([hot])) as gpu:
        assert gpu.settle(quiet_s=0.02, limit_s=0.1) == "still limited after 0.1 s"
    # A GPU at rest between launches reports the idle reason (at 345 MHz): that is rest.
    idle = (345.0, 80.0, 40.0, 0x1)
    with GpuMonitor(source=_stepping([hot] * 5 + [idle])) as gpu:
        assert gpu.settle(quiet_s=0.05, limit_s=1).startswith("settled in")
        assert gpu.samples[-1].reasons == 0x1
    # Reasons NVML cannot read: nothing to wait on, said so once the quiet time is sampled
    # (not "settled": nothing showed the GPU at rest).
    with GpuMonitor(source=_stepping([(1980.0, 300.0, 50.0, None)])) as gpu:
        t0 = time.monotonic()
        assert gpu.settle(quiet_s=0.02, limit_s=5) == "not waited: limits n/a"
        assert time.monotonic() - t0 < 1
    monkeypatch.setattr(gpu_monitor, "NVML_LIBRARIES", ("libnvidia-ml.absent",))
    with GpuMonitor() as gpu:
        assert gpu.settle() == ""


def test_settle_does_not_wait_on_a_sampler_stuck_in_nvml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NVML that stops answering mid-run (the sampler alive, stuck in the driver): `settle`
    has nothing to wait on and says so at once, rather than waiting its whole limit before
    each implementation and calling the GPU limited."""
    monkeypatch.setattr(gpu_monitor, "PERIOD_MS", 5)
    released = threading.Event()
    count = iter(range(1 << 30))

    def read() -> Sample:
        if next(count) >= 3:
            released.wait(10)  # in the driver
        return Sample(time.monotonic(), 1980.0, 1980.0, 300.0, 50.0, 0)

    try:
        with GpuMonitor(source=lambda: (read, lambda: None)) as gpu:
            while len(gpu.samples) < 3:
                time.sleep(0.005)
            time.sleep(0.1)  # past the quiet time since the last reading
            t0 = time.monotonic()
            said = gpu.settle(quiet_s=0.05, limit_s=2)
            assert time.monotonic() - t0 < 1
            assert said == "not waited: no reading in 0.05 s"
    finally:
        released.set()
