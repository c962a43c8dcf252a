"""Measuring from outside the checked model: which device runs the kernels, where caches
live, and how long a launch takes (CUDA events on `cuda`, the wall clock elsewhere).

Library code that tunes itself (`cutile_py_kernels.autotune`) uses these instead of reaching
into the runtime.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from cutile_py.host.device_op import OpLike
from cutile_py.ptx.target import Target
from cutile_py.runtime.cuda_backend import CudaBackend
from cutile_py.runtime.disk_cache import cache_dir as _cache_dir
from cutile_py.runtime.select import active_backend


def device_name() -> str:
    """The GPU's name on `cuda` (e.g. 'NVIDIA H200'); the backend's name elsewhere."""
    backend = active_backend()
    return backend.device_name if isinstance(backend, CudaBackend) else backend.name


def target() -> Target:
    """The target kernels compile for on the active backend: the GPU's architecture on
    `cuda`, the simulated one on `sim` (`ct.set_backend("sim", target=...)`), sm_80 on
    `interpret`."""
    backend = active_backend()
    return backend.target if backend.runs_ptx else Target(80)


def cache_dir() -> Path:
    """The directory cutile_py caches under: `CUTILE_PY_CACHE_DIR`, else the user cache."""
    return _cache_dir()


def time_ms(launch: Callable[[], OpLike], repeats: int = 5) -> list[float]:
    """Milliseconds of each of `repeats` runs of `launch()` (an op made fresh each time),
    after one untimed run that compiles and warms up.

    On `cuda` the times are the device's: events recorded on the stream around each kernel
    launch (or graph replay) of the op, summed, so host work and the host's wait for the
    result are not counted. Elsewhere they are wall-clock times of `op.sync()`.
    """
    launch().sync()
    backend = active_backend()
    if not isinstance(backend, CudaBackend):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            launch().sync()
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    out = []
    for _ in range(repeats):
        op = launch()
        with backend.time_launches() as timed:
            op.sync()
        out.append(timed.total_ms())
    return out


def time_ms_queued(launches: Sequence[Callable[[], OpLike]], runs: int) -> float:
    """Milliseconds per launch over `runs` launches kept queued back to back, taking
    `launches` in turn (each builds an op on outputs of its own; one is built again only once
    its previous op is done, so up to len(launches) are queued at once), after one untimed
    run of each. The GPU does not wait for the host in between, as in a model's stream of
    kernels: run after run, clocks can settle lower than in a short burst (an H200 ran
    cuBLAS's bf16 8192 GEMM 13% slower so). Device time (CUDA events, summed) on `cuda`;
    wall clock elsewhere."""
    if not launches or runs < 1:
        raise ValueError(
            f"time_ms_queued needs launches and runs >= 1, got {len(launches)}, {runs}"
        )
    for launch in launches:
        launch().sync()
    backend = active_backend()
    if not isinstance(backend, CudaBackend):
        t0 = time.perf_counter()
        _run_queued(launches, runs)
        return (time.perf_counter() - t0) * 1e3 / runs
    with backend.time_launches() as timed:
        _run_queued(launches, runs)
    return timed.total_ms() / runs


def _run_queued(launches: Sequence[Callable[[], OpLike]], runs: int) -> None:
    pending: deque[OpLike] = deque()
    for i in range(runs):
        if len(pending) == len(launches):
            pending.popleft().sync()  # its outputs are free again for the next launch
        pending.append(launches[i % len(launches)]())
    while pending:
        pending.popleft().sync()
