"""Host cost per op on a null device (issue 16): the real `cuda` backend over a driver whose
calls return at once (`paper_repro.null_driver`), so only cutile_py's own work is timed, on any
CPU, GPU or not. The modes are `launch`'s: synchronous, chained with `.then`, queued with
`ct.zip`, awaited, and graph replay; then allocation and a library host function. Where a GPU
is present, the same modes run end to end on it, with Triton's launch of the same element-wise
add (sync and queued) timed in the same run; elsewhere those rows say why they are missing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial

import numpy as np

import cutile_py as ct
from paper_repro import peers
from paper_repro.core import Context, Result, Row, attempt, measured_row, missing_row, sig
from paper_repro.experiments.launch import cutile_modes, peer_modes
from paper_repro.null_driver import null_device

#: The issue's goals, µs per op on the null device.
GOALS = {
    "sync": 5.0,
    "chained (.then)": 3.0,
    "async (awaited)": 6.0,
    "graph replay": 1.0,
}

#: The issue's goals on a GPU, end to end (µs per op); both also below Triton's sync launch.
GPU_GOALS = {"sync": 10.0, "graph replay": 1.5}


@contextlib.contextmanager
def null_cuda(check_arguments: bool = False) -> Iterator[None]:
    """A fresh cuda backend over the null driver, active meanwhile (the real one untouched);
    `check_arguments`: each driver call's arguments pass the real bindings first (tests)."""
    from cutile_py.runtime import select
    from cutile_py.runtime.cuda_backend import CudaBackend

    with null_device(check_arguments=check_arguments), select.restored():
        select.install("cuda", CudaBackend())
        yield


def run(ctx: Context) -> Result:
    res = Result("host", "Host µs per op on a null device (the driver's calls return at once)")
    res.columns = ["device", "impl", "mode", "n", "status", "us_per_op", "goal_us", "note"]
    res.notes.append(
        "The real cuda backend over paper_repro.null_driver: every driver call returns at once, "
        "so these are cutile_py's host costs alone (argument checks, ownership, parameter "
        "packing, the calls it makes), on this CPU."
    )
    counts = [1, 100] if ctx.quick else [1, 100, 1000]
    with null_cuda():
        for n in counts:
            ctx.log(f"host: N={n}")
            rows: list[Row] = []
            attempt(ctx, rows, f"modes N={n}", partial(cutile_modes, ctx, n), n=n)
            for r in rows:
                r.update(device="null", impl="cutile_py", goal_us=GOALS.get(str(r.get("mode"))))
            res.rows.extend(rows)
        size = 2**28
        m = ctx.timer.host(lambda: ct.zeros(size), reps=3)
        res.rows.append(
            measured_row(m, device="null", impl="cutile_py", mode=f"ct.zeros({size:,} f32)", n=1)
            | {"us_per_op": sig(m.median_us), "goal_us": 1000.0}
        )
        res.rows.extend(_library_rows(ctx))
    res.rows.extend(gpu_rows(ctx, counts))
    for r in res.rows:
        goal, got = r.get("goal_us"), r.get("us_per_op")
        if isinstance(goal, float) and isinstance(got, (int, float)):
            verdict = "meets" if got <= goal else "misses"
            res.summary.append(
                f"{r['device']}: {r['mode']} (N={r['n']}): {got} µs/op, {verdict} the "
                f"{goal} µs goal"
            )
    res.summary.extend(against_triton(res.rows))
    return res


def gpu_rows(ctx: Context, counts: list[int]) -> list[Row]:
    """On a GPU: cutile_py's modes end to end on the real cuda backend and Triton's launch
    of the same add in the same run. Without one (or without Triton), rows saying so."""
    from cutile_py.runtime.cuda_driver import driver_available

    where: Row = {"device": "cuda"}
    if not driver_available():
        why = "no NVIDIA GPU and driver here: the null-device rows above are the evidence"
        return [
            missing_row(why, **where, impl=impl, mode="sync", n=n)
            for n in counts
            for impl in ("cutile_py", "triton")
        ]
    rows: list[Row] = []
    with _active("cuda"):
        for n in counts:
            ctx.log(f"host: cuda N={n}")
            got: list[Row] = []
            attempt(ctx, got, f"cuda modes N={n}", partial(cutile_modes, ctx, n), n=n)
            for r in got:
                r.update(where, impl="cutile_py", goal_us=GPU_GOALS.get(str(r.get("mode"))))
            rows.extend(got)
            triton, why = peers.load("triton")
            if triton is None:
                rows.append(missing_row(why, **where, impl="triton", mode="sync", n=n))
                continue
            got = []
            attempt(ctx, got, f"triton N={n}", partial(peer_modes, ctx, "triton", n), n=n)
            rows.extend({**r, **where} for r in got)
    return rows


def against_triton(rows: list[Row]) -> list[str]:
    """Summary lines: cutile_py's sync launch and graph replay on the GPU against Triton's
    sync launch at the same N, where both were measured."""

    def ok(r: Row, impl: str, mode: str) -> bool:
        return (
            r.get("device") == "cuda"
            and r.get("impl") == impl
            and r.get("mode") == mode
            and r.get("status") == "ok"
        )

    lines = []
    for t in (r for r in rows if ok(r, "triton", "sync")):
        for mode in ("sync", "graph replay"):
            for c in (r for r in rows if ok(r, "cutile_py", mode) and r["n"] == t["n"]):
                ours, theirs = c["us_per_op"], t["us_per_op"]
                assert isinstance(ours, (int, float)) and isinstance(theirs, (int, float))
                side = "below" if ours < theirs else "not below"
                lines.append(
                    f"cuda: cutile_py {mode} {ours} µs/op is {side} Triton's sync launch "
                    f"{theirs} µs/op (N={t['n']})"
                )
    return lines


@contextlib.contextmanager
def _active(name: str) -> Iterator[None]:
    """Backend `name` active meanwhile."""
    from cutile_py.runtime import select

    saved = select._active
    select.set_backend(name)
    try:
        yield
    finally:
        select._active = saved


def _library_rows(ctx: Context) -> list[Row]:
    from cutile_py_kernels import rms_norm

    rng = np.random.default_rng(0)
    x = ct.from_numpy(rng.standard_normal((4096, 4096), dtype=np.float32))
    w = ct.from_numpy(rng.standard_normal(4096, dtype=np.float32))
    m = ctx.timer.host(lambda: rms_norm(x, w), reps=5)
    mode = "cutile_py_kernels.rms_norm (4096x4096)"
    return [
        measured_row(m, device="null", impl="cutile_py", mode=mode, n=1)
        | {"us_per_op": sig(m.median_us), "goal_us": 20.0}
    ]
