"""Paper §5.2 / issue 6: per-op host overhead of tiny launches, synchronous, chained with
`.then`, queued with `ct.zip`, awaited, and graph replay (`ct.graph`), for N = 1..1000, with
Triton, CuPy and a bare driver launch beside them; then async overlap: throughput against the
host work done per op, synchronous against awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import cutile_py as ct
from paper_repro import paper, peers
from paper_repro.core import Context, Result, Row, attempt, measured_row, missing_row, sig
from paper_repro.kernels import TILE, add_f32
from paper_repro.ptx import ADD_F32, SPIN

TINY = TILE  # one block


def _tensors(k: int = 1) -> tuple[list[Any], Any, Any]:
    rng = np.random.default_rng(5)
    x = ct.from_numpy(rng.standard_normal(TINY, dtype=np.float32))
    y = ct.from_numpy(rng.standard_normal(TINY, dtype=np.float32))
    return [ct.zeros(TINY).partition(TILE) for _ in range(k)], x, y


def _per_op(ctx: Context, mode: str, n: int, body: Callable[[], Any], **extra: Any) -> Row:
    m = ctx.timer.host(body, reps=3 if ctx.quick or n >= 1000 else 7)
    row = measured_row(m, mode=mode, n=n, **extra)
    row["us_per_op"] = sig(m.median_us / n)
    return row


def cutile_modes(ctx: Context, n: int) -> list[Row]:
    rows: list[Row] = []
    zs, x, y = _tensors(n)
    state = [zs[0], x, y]

    def sync() -> None:
        z, a, b = state
        for _ in range(n):
            z, a, b = add_f32(z, a, b).sync()
        state[:] = [z, a, b]

    rows.append(_per_op(ctx, "sync", n, sync, impl="cutile_py"))

    def chained() -> None:
        op: Any = add_f32(*state)
        for _ in range(n - 1):
            op = op.then(lambda r: add_f32(*r))
        state[:] = list(op.sync())

    rows.append(_per_op(ctx, "chained (.then)", n, chained, impl="cutile_py"))

    def queued() -> None:
        ct.zip(*[add_f32(z, x, y) for z in zs]).sync()

    rows.append(_per_op(ctx, "queued (ct.zip)", n, queued, impl="cutile_py"))

    async def awaited() -> None:
        z, a, b = state
        for _ in range(n):
            z, a, b = await add_f32(z, a, b)
        state[:] = [z, a, b]

    loop = asyncio.new_event_loop()
    try:
        rows.append(
            _per_op(
                ctx,
                "async (awaited)",
                n,
                lambda: loop.run_until_complete(awaited()),
                impl="cutile_py",
            )
        )
    finally:
        loop.close()
    graph = getattr(ct, "graph", None)
    if graph is None:
        rows.append(
            missing_row("ct.graph is not written yet", mode="graph replay", n=n, impl="cutile_py")
        )
    else:
        op: Any = add_f32(*state)
        for _ in range(n - 1):
            op = op.then(lambda r: add_f32(*r))
        g = graph(op)
        try:
            rows.append(_per_op(ctx, "graph replay", n, g.replay, impl="cutile_py"))
        finally:
            state[:] = list(g.release())
    return rows


def driver_floor(ctx: Context, n: int) -> list[Row]:
    """The same PTX add launched with bare `cuLaunchKernel` calls: the driver's own cost."""
    from cutile_py.runtime import cuda_driver as cu
    from cutile_py.runtime.select import active_backend

    backend: Any = active_backend()
    kern = backend.load_kernel(ADD_F32, "add_f32")
    zs, x, y = _tensors(1)
    z = zs[0].unpartition()
    stream = backend.activate().stream
    params = cu.pack_params(
        [
            ("u64", z.buffer.address),
            ("u64", x.buffer.address),
            ("u64", y.buffer.address),
            ("u32", TINY),
        ]
    )

    def queued() -> None:
        for _ in range(n):
            cu.launch_kernel(kern.function, (1, 1, 1), (256, 1, 1), 0, stream, params)
        cu.stream_synchronize(stream)

    def sync() -> None:
        for _ in range(n):
            cu.launch_kernel(kern.function, (1, 1, 1), (256, 1, 1), 0, stream, params)
            cu.stream_synchronize(stream)

    return [
        _per_op(ctx, "sync", n, sync, impl="driver (cuLaunchKernel)"),
        _per_op(ctx, "queued", n, queued, impl="driver (cuLaunchKernel)"),
    ]


def peer_modes(ctx: Context, peer: str, n: int) -> list[Row]:
    if peer == "cupy":
        cupy = peers.load("cupy")[0]
        x = cupy.ones(TINY, dtype=cupy.float32)
        y, z = x + 1, cupy.empty_like(x)
        launch: Callable[[], Any] = lambda: cupy.add(x, y, out=z)  # noqa: E731
        wait: Callable[[], Any] = cupy.cuda.get_current_stream().synchronize
    else:
        torch = peers.load("torch")[0]
        from paper_repro.peers import triton_kernels as tk

        x = torch.ones(TINY, device="cuda")
        y, z = x + 1, torch.empty_like(x)
        launch = lambda: tk.add(x, y, z)  # noqa: E731
        wait = torch.cuda.synchronize

    def sync() -> None:
        for _ in range(n):
            launch()
            wait()

    def queued() -> None:
        for _ in range(n):
            launch()
        wait()

    return [_per_op(ctx, "sync", n, sync, impl=peer), _per_op(ctx, "queued", n, queued, impl=peer)]


def _busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def overlap(ctx: Context) -> list[Row]:
    """Ops per second when each op comes with `work_us` of host work: waiting for each op
    (sync) against awaiting it after the host work (async), which overlaps the two."""
    ops = 5 if ctx.quick else 100
    if ctx.backend == "cuda":
        spin = ct.RawKernel(SPIN, "spin")
        kernel_us = 50.0
        make: Callable[[], Any] = lambda: spin(int(kernel_us * 1000), grid=1, block=1)  # noqa: E731
        what = f"spin kernel of {kernel_us:.0f} µs"
    else:
        zs, x, y = _tensors(ops)
        it = iter(range(10**9))
        make = lambda: add_f32(zs[next(it) % ops], x, y)  # noqa: E731
        what = "tiny add (sim: runs at launch, nothing to overlap)"
    rows: list[Row] = []
    for work in [0.0, 50.0] if ctx.quick else [0.0, 10.0, 25.0, 50.0, 100.0]:

        def sync() -> None:
            for _ in range(ops):
                make().sync()
                _busy(work)  # noqa: B023 (called within the iteration)

        async def awaited() -> None:
            for _ in range(ops):
                task = asyncio.ensure_future(_wait(make()))
                await asyncio.sleep(0)  # the task launches the op
                _busy(work)  # noqa: B023 (called within the iteration)
                await task

        loop = asyncio.new_event_loop()
        try:
            for mode, body in (
                ("sync", sync),
                ("async", lambda: loop.run_until_complete(awaited())),  # noqa: B023 (called within the iteration)
            ):
                m = ctx.timer.host(body, reps=3)
                rows.append(
                    {
                        "impl": "cutile_py",
                        "mode": mode,
                        "host_work_us": work,
                        "ops": ops,
                        "status": "ok",
                        "ops_per_s": sig(ops / (m.median_us * 1e-6)),
                        "us_per_op": sig(m.median_us / ops),
                        "kernel": what,
                    }
                )
        finally:
            loop.close()
    return rows


async def _wait(op: Any) -> Any:
    return await op


def run(ctx: Context) -> Result:
    res = Result("launch", "Per-op launch overhead, and async overlap (paper §5.2)")
    res.columns = [
        "impl",
        "mode",
        "n",
        "status",
        "us_per_op",
        "host_work_us",
        "ops_per_s",
        "kernel",
        "note",
    ]
    counts = [1, 10] if ctx.quick else [1, 10, 100, 1000]
    for n in counts:
        ctx.log(f"launch: N={n}")
        attempt(
            ctx, res.rows, f"cutile_py N={n}", partial(cutile_modes, ctx, n), impl="cutile_py", n=n
        )
        if ctx.backend == "cuda":
            attempt(
                ctx, res.rows, f"driver N={n}", partial(driver_floor, ctx, n), impl="driver", n=n
            )
            for peer in ("triton", "cupy"):
                if peers.load(peer)[0] is not None:
                    attempt(
                        ctx,
                        res.rows,
                        f"{peer} N={n}",
                        partial(peer_modes, ctx, peer, n),
                        impl=peer,
                        n=n,
                    )
    for peer in ("triton", "cupy"):
        mod, why = peers.load(peer)
        if mod is None or ctx.backend != "cuda":
            res.rows.append(missing_row(why or f"{peer} needs the cuda backend", impl=peer))
    ctx.log("launch: overlap")
    attempt(ctx, res.rows, "overlap", partial(overlap, ctx), mode="overlap")
    big = max(counts)
    ours = {
        str(r["mode"]): r.get("us_per_op")
        for r in res.rows
        if r.get("impl") == "cutile_py" and r.get("n") == big and r.get("status") == "ok"
    }
    theirs = ", ".join(f"{k} {v}" for k, v in paper.LAUNCH_US.items())
    here = ", ".join(f"{k} {v}" for k, v in ours.items())
    res.summary.append(
        f"paper (µs/op, {paper.LAUNCH_GPU}): {theirs}; cutile_py here (N={big}, "
        f"{ctx.backend}): {here}"
    )
    res.notes.append(
        "us_per_op = wall time of N launches (from building the op to having its result back) "
        "÷ N, median of several repetitions; the kernel is a one-block add of 1024 floats. "
        "'chained (.then)' hands every result to the next launch on the host; 'queued "
        "(ct.zip)' launches N independent ops before waiting."
    )
    if ctx.backend != "cuda":
        res.notes.append("On sim every launch runs the kernel on the CPU before returning.")
    return res
