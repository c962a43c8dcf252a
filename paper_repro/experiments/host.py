"""Host cost per op on a null device (issue 16): the real `cuda` backend over a driver whose
calls return at once (`paper_repro.null_driver`), so only cutile_py's own work is timed, on any
CPU, GPU or not. The modes are `launch`'s: synchronous, chained with `.then`, queued with
`ct.zip`, awaited, and graph replay; then allocation and a library host function. `launch`
measures the same modes end to end on a GPU, with Triton beside them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial

import numpy as np

import cutile_py as ct
from paper_repro.core import Context, Result, Row, attempt, measured_row, sig
from paper_repro.experiments.launch import cutile_modes
from paper_repro.null_driver import null_device

#: The issue's goals, µs per op on the null device.
GOALS = {
    "sync": 5.0,
    "chained (.then)": 3.0,
    "async (awaited)": 6.0,
    "graph replay": 1.0,
}


@contextlib.contextmanager
def null_cuda() -> Iterator[None]:
    """A fresh cuda backend over the null driver, active meanwhile (the real one untouched)."""
    from cutile_py.runtime import select
    from cutile_py.runtime.cuda_backend import CudaBackend

    saved = dict(select._instances), select._active
    with null_device():
        select._instances["cuda"] = CudaBackend()
        select._active = "cuda"
        try:
            yield
        finally:
            select._instances.clear()
            select._instances.update(saved[0])
            select._active = saved[1]


def run(ctx: Context) -> Result:
    res = Result("host", "Host µs per op on a null device (the driver's calls return at once)")
    res.columns = ["mode", "n", "status", "us_per_op", "goal_us", "median_us", "note"]
    res.notes.append(
        "The real cuda backend over paper_repro.null_driver: every driver call returns at once, "
        "so these are cutile_py's host costs alone (argument checks, ownership, parameter "
        "packing, the calls it makes), on this CPU."
    )
    with null_cuda():
        for n in [1, 100] if ctx.quick else [1, 100, 1000]:
            ctx.log(f"host: N={n}")
            attempt(ctx, res.rows, f"modes N={n}", partial(cutile_modes, ctx, n), n=n)
            for r in res.rows:
                if r.get("n") == n:
                    r["goal_us"] = GOALS.get(str(r.get("mode")))
                    r.pop("impl", None)
        size = 2**28
        m = ctx.timer.host(lambda: ct.zeros(size), reps=3)
        res.rows.append(
            measured_row(m, mode=f"ct.zeros({size:,} f32)", n=1, goal_us=1000.0)
            | {"us_per_op": sig(m.median_us)}
        )
        res.rows.extend(_library_rows(ctx))
    for r in res.rows:
        goal, got = r.get("goal_us"), r.get("us_per_op")
        if isinstance(goal, float) and isinstance(got, (int, float)):
            verdict = "meets" if got <= goal else "misses"
            res.summary.append(
                f"{r['mode']} (N={r['n']}): {got} µs/op, {verdict} the {goal} µs goal"
            )
    return res


def _library_rows(ctx: Context) -> list[Row]:
    from cutile_py_kernels import rms_norm

    rng = np.random.default_rng(0)
    x = ct.from_numpy(rng.standard_normal((4096, 4096), dtype=np.float32))
    w = ct.from_numpy(rng.standard_normal(4096, dtype=np.float32))
    m = ctx.timer.host(lambda: rms_norm(x, w), reps=5)
    return [
        measured_row(m, mode="cutile_py_kernels.rms_norm (4096x4096)", n=1, goal_us=20.0)
        | {"us_per_op": sig(m.median_us)}
    ]
