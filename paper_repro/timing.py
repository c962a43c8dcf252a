"""The timing core: CUDA events on the GPU, wall clock on the CPU backends.

On `cuda` a measured batch is queued behind a `spin` kernel that keeps the stream busy while
the host enqueues, so the events bracket device work only (host launch overhead is measured
separately, by the `launch` experiment). Each call of a batch uses the next of `rotate` sets of
buffers, chosen by the caller so that their total footprint exceeds twice the L2 cache and
L2 does not flatter the numbers. The result is the median over `reps` batches.

On `sim` and `interpret` the kernels run on the CPU: times are wall clock per call and are
not GPU measurements.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Pending(Protocol):
    """Queued work the host must wait for (and, for a cutile_py op, take its arguments back)."""

    def wait(self) -> None: ...


#: Queues the work of one call using rotation slot `i`; returns what must be waited for.
Launch = Callable[[int], Sequence[Pending]]


@dataclass(frozen=True)
class Measurement:
    """Per-call time of a kernel (or a sequence of kernels) in microseconds."""

    median_us: float
    min_us: float
    max_us: float
    samples: int
    method: str  # "cuda-events" or "wall-clock"
    #: The host could not keep the queue ahead of the device in some samples (cuda only).
    host_bound: bool = False


class OpPending:
    """Launch a cutile_py op now without waiting; `wait()` completes it.

    Uses the ops' internal `_launch`/`_complete` (the public `sync()` waits at once, which
    would put host latency between every two kernels); falls back to `sync()`.
    """

    def __init__(self, op: Any) -> None:
        self.op = op
        self.done = False
        launch = getattr(op, "_launch", None)
        if callable(launch) and callable(getattr(op, "_complete", None)):
            launch()
        else:
            op.sync()
            self.done = True

    def wait(self) -> None:
        if not self.done:
            self.done = True
            self.op._complete()


def rotation(footprint: int, l2_bytes: int) -> int:
    """Buffer sets so that together they exceed twice the L2 size, however small each is: a
    set is used again only after the others have pushed it out of L2 (a cap on the count
    left small footprints, GEMM 128-512 in ~3 MB, L2-resident)."""
    if footprint <= 0:
        return 1
    return max(1, 2 * l2_bytes // footprint + 1)


def _summary(samples: list[float], method: str, host_bound: bool = False) -> Measurement:
    return Measurement(
        statistics.median(samples), min(samples), max(samples), len(samples), method, host_bound
    )


class Timer:
    """Times launches on the active backend; `stream` is a raw CUstream handle for peers
    (PyTorch's or CuPy's current stream), None for cutile_py's own backend stream."""

    def __init__(self, backend: str, reps: int, warmup: int, max_batch: int = 32) -> None:
        self.backend = backend
        self.reps = reps
        self.warmup = warmup
        self.max_batch = max_batch
        self._cuda: _CudaTiming | None = None

    @property
    def method(self) -> str:
        return "cuda-events" if self.backend == "cuda" else "wall-clock"

    def device(
        self,
        launch: Launch,
        *,
        rotate: int = 1,
        stream: int | None = None,
        reps: int | None = None,
    ) -> Measurement:
        """Median per-call time of `launch` (cuda: device time; else wall clock)."""
        n = reps or self.reps
        if self.backend != "cuda":
            return self._wall(launch, rotate, n)
        if self._cuda is None:
            self._cuda = _CudaTiming()
        return self._cuda.measure(launch, rotate, stream, n, self.warmup, self.max_batch)

    def _wall(self, launch: Launch, rotate: int, reps: int) -> Measurement:
        for i in range(self.warmup):
            for p in launch(i % rotate):
                p.wait()
        samples = []
        for i in range(reps):
            t0 = time.perf_counter()
            for p in launch(i % rotate):
                p.wait()
            samples.append((time.perf_counter() - t0) * 1e6)
        return _summary(samples, "wall-clock")

    def host(self, body: Callable[[], Any], reps: int | None = None) -> Measurement:
        """Median wall-clock time of `body()` (which must finish its own work)."""
        body()
        samples = []
        for _ in range(reps or self.reps):
            t0 = time.perf_counter()
            body()
            samples.append((time.perf_counter() - t0) * 1e6)
        return _summary(samples, "wall-clock")


class _CudaTiming:
    """Events and the spin kernel on the cuda backend's context."""

    MAX_SPIN_NS = 200_000_000

    def __init__(self) -> None:
        from cutile_py.runtime import cuda_driver as cu
        from cutile_py.runtime.cuda_backend import CudaBackend
        from cutile_py.runtime.select import active_backend
        from paper_repro.ptx import SPIN

        backend = active_backend()
        assert isinstance(backend, CudaBackend)
        self.cu = cu
        self.backend = backend
        self.spin_kernel = backend.load_kernel(SPIN, "spin")
        self.start = cu.event_create(timing=True)
        self.end = cu.event_create(timing=True)

    def stream(self, handle: int | None) -> Any:
        if handle is None:
            return self.backend.activate().stream
        from paper_repro.cudrv import stream_from_handle

        self.backend.activate()
        return stream_from_handle(handle)

    def spin(self, stream: Any, ns: int) -> None:
        cu = self.cu
        cu.launch_kernel(
            self.spin_kernel.function,
            (1, 1, 1),
            (1, 1, 1),
            0,
            stream,
            cu.pack_params([("u64", int(ns))]),
        )

    def measure(
        self, launch: Launch, rotate: int, handle: int | None, reps: int, warmup: int, cap: int
    ) -> Measurement:
        cu = self.cu
        stream = self.stream(handle)
        # One call per buffer set: a cutile_py op holds its outputs until it completes.
        batch = max(1, min(cap, rotate))
        # Batches go on through the sets where the last one stopped, so that every set is
        # used in turn (more sets than a batch holds would otherwise never be reached).
        slots = itertools.count()

        def run_batch() -> list[Pending]:
            return [p for _ in range(batch) for p in launch(next(slots) % rotate)]

        for _ in range(max(1, warmup)):
            for p in run_batch():
                p.wait()
        cu.stream_synchronize(stream)
        t0 = time.perf_counter()
        pending = run_batch()
        host_ns = (time.perf_counter() - t0) * 1e9
        for p in pending:
            p.wait()
        cu.stream_synchronize(stream)
        spin_ns = int(min(self.MAX_SPIN_NS, 1.5 * host_ns + 20_000))
        samples: list[float] = []
        flagged = False
        attempts = 0
        while len(samples) < reps and attempts < 3 * reps:
            attempts += 1
            self.spin(stream, spin_ns)
            cu.event_record(self.start, stream)
            pending = run_batch()
            cu.event_record(self.end, stream)
            # The spin already over: the device may have waited for the host in between.
            starved = cu.event_query(self.start)
            for p in pending:
                p.wait()
            cu.event_synchronize(self.end)
            per_call = cu.event_elapsed_ms(self.start, self.end) * 1000.0 / batch
            if starved and spin_ns < self.MAX_SPIN_NS:
                spin_ns = min(self.MAX_SPIN_NS, 2 * spin_ns)
                if attempts < 2 * reps:
                    continue
            flagged = flagged or starved
            samples.append(per_call)
        return _summary(samples, "cuda-events", flagged)


def gbps(nbytes: float, us: float) -> float:
    """GB/s (10^9 bytes per second) of moving `nbytes` in `us` microseconds."""
    return nbytes / (us * 1e3) if us > 0 else math.nan
