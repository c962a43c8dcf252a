"""Host µs per op on the null device in **process CPU time**, with Python calls per op.

`python -m paper_repro.host_cpu [--samples 7] [--warm 10] [--calls]` prints one JSON object:
for each mode of `paper_repro host` (sync, chained with `.then`, `ct.zip` of 100 ops,
awaited, graph replay of a 100-op chain, `ct.zeros(2**28)`, the `rms_norm` host function on
4096x4096), the median over `--samples` samples of CPU µs per op, and with `--calls` the
calls per op cProfile counts (builtins included). Process CPU time is what a loaded machine
disturbs least; compare two trees by running this file alternately under each
(`PYTHONPATH=<tree>`) in the same minutes, as paper_repro/results/host-null-device.md does.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import cutile_py as ct
from paper_repro.experiments.host import null_cuda
from paper_repro.experiments.launch import _tensors
from paper_repro.kernels import add_f32

#: Ops per sample of the launch modes.
N = 100


def modes() -> dict[str, tuple[Callable[[], Any], int]]:
    """Each mode's sample body and the ops it makes, over the active (null) backend. The
    graph is captured last: while it exists it holds `x` and `y` shared."""
    from cutile_py_kernels import rms_norm

    zs, x, y = _tensors(N)
    state = [zs[0], x, y]

    def sync() -> None:
        z, a, b = state
        for _ in range(N):
            z, a, b = add_f32(z, a, b).sync()
        state[:] = [z, a, b]

    def rms_calls() -> None:
        for _ in range(N):
            rms_norm(rx, rw)

    def chained() -> None:
        op: Any = add_f32(*state)
        for _ in range(N - 1):
            op = op.then(lambda r: add_f32(*r))
        state[:] = list(op.sync())

    def queued() -> None:
        ct.zip(*[add_f32(z, x, y) for z in zs]).sync()

    async def awaited_body() -> None:
        z, a, b = state
        for _ in range(N):
            z, a, b = await add_f32(z, a, b)
        state[:] = [z, a, b]

    loop = asyncio.new_event_loop()
    rng = np.random.default_rng(0)
    rx = ct.from_numpy(rng.standard_normal((4096, 4096), dtype=np.float32))
    rw = ct.from_numpy(rng.standard_normal(4096, dtype=np.float32))
    out: dict[str, tuple[Callable[[], Any], int]] = {
        "sync": (sync, N),
        "chained (.then)": (chained, N),
        "queued (ct.zip)": (queued, N),
        "async (awaited)": (lambda: loop.run_until_complete(awaited_body()), N),
        "ct.zeros(2**28)": (lambda: ct.zeros(2**28), 1),
        # N calls per sample like the launch modes (one call per sample adds the timer's
        # own cost and a cold start to each op); each output is freed by the next call.
        "rms_norm 4096x4096 host fn": (rms_calls, N),
    }
    out["graph replay (100-op chain)"] = (lambda: graph().replay(), N)
    graphs: list[Any] = []

    def graph() -> Any:
        """The graph of a 100-op chain, captured at first use (made last: see above)."""
        if not graphs:
            op: Any = add_f32(*state)
            for _ in range(N - 1):
                op = op.then(lambda r: add_f32(*r))
            graphs.append(ct.graph(op))
        return graphs[0]

    return out


def measure(samples: int, calls: bool, warm: int = 10) -> dict[str, dict[str, float]]:
    """CPU µs per op (median of `samples`, after `warm` unmeasured runs) and, with `calls`,
    cProfile calls per op."""
    result: dict[str, dict[str, float]] = {}
    for name, (body, ops) in modes().items():
        for _ in range(warm):
            body()  # warm: plans made, kernels loaded
        times = []
        for _ in range(samples):
            t0 = time.process_time()
            body()
            times.append((time.process_time() - t0) * 1e6 / ops)
        row = {"us_per_op": round(statistics.median(times), 2)}
        if calls:
            prof = cProfile.Profile()
            prof.enable()
            body()
            prof.disable()
            row["calls_per_op"] = round(pstats.Stats(prof).total_calls / ops, 1)  # type: ignore[attr-defined]
        result[name] = row
    return result


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m paper_repro.host_cpu", description=__doc__)
    p.add_argument("--samples", type=int, default=7)
    p.add_argument("--warm", type=int, default=10, help="unmeasured runs of each mode first")
    p.add_argument("--calls", action="store_true", help="also count calls per op (cProfile)")
    args = p.parse_args()
    with null_cuda():
        print(json.dumps(measure(args.samples, args.calls, args.warm)))


if __name__ == "__main__":
    main()
