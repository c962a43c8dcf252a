"""Appendix B: 2000 GEMMs, 80 % of 512³ and 20 % of 2048³ (f16), run serially and spread
over S = 1, 2, 4, 8 streams (one host thread per stream, `op.sync_on(stream)`); cuBLAS
through PyTorch streams beside it."""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any

import numpy as np

import cutile_py as ct
from paper_repro import peers
from paper_repro.core import Context, Result, Row, attempt, missing_row, sig
from paper_repro.experiments.common import library_kernel, to_ct, torch_tensor
from paper_repro.replay import Replay


def _workload(ctx: Context) -> tuple[list[int], list[int]]:
    small, big, count = (32, 64, 20) if ctx.quick else (512, 2048, 2000)
    rng = ctx.rng(11)
    sizes = [big if rng.random() < 0.2 else small for _ in range(count)]
    return sizes, [small, big]


def _row(mode: str, streams: int, sizes: list[int], seconds: float, impl: str) -> Row:
    flops = sum(2.0 * n**3 for n in sizes)
    return {
        "impl": impl,
        "mode": mode,
        "streams": streams,
        "gemms": len(sizes),
        "status": "ok",
        "ms": sig(seconds * 1e3),
        "tflops": sig(flops / seconds / 1e12),
    }


def _spread(sizes: list[int], streams: int, work: Any) -> float:
    """Run `work(lane, [sizes...])` on `streams` threads; wall seconds until all finish."""
    lanes = [sizes[i::streams] for i in range(streams)]
    threads = [threading.Thread(target=work, args=(i, lane)) for i, lane in enumerate(lanes)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def cutile(ctx: Context, sizes: list[int], shapes: list[int]) -> list[Row]:

    rng = ctx.rng(12)
    inputs = {
        n: [
            to_ct(rng.standard_normal((n, n), dtype=np.float32) / np.float32(n**0.5), "f16")
            for _ in range(2)
        ]
        for n in shapes
    }
    lanes = 8
    plans = {
        n: Replay(lambda a, b: library_kernel("gemm")(a, b), inputs[n], [inputs[n]] * lanes)
        for n in shapes
    }
    rows: list[Row] = []
    t0 = time.perf_counter()
    for n in sizes:
        plan = plans[n]
        for rec, args in zip(plan.launches, plan.slots[0]):
            rec.kernel(*args).sync()
    rows.append(_row("serial (sync)", 1, sizes, time.perf_counter() - t0, "cutile_py"))
    for s in (1, 2, 4, 8):
        errors: list[BaseException] = []

        def work(lane: int, mine: list[int]) -> None:
            try:
                stream = ct.Stream()
                for n in mine:
                    plan = plans[n]
                    for rec, args in zip(plan.launches, plan.slots[lane]):
                        rec.kernel(*args).sync_on(stream)
            except BaseException as e:
                errors.append(e)  # noqa: B023 (called within the iteration)

        seconds = _spread(sizes, s, work)
        if errors:
            raise errors[0]
        rows.append(_row("streams (sync_on)", s, sizes, seconds, "cutile_py"))
    return rows


def torch_peer(ctx: Context, sizes: list[int], shapes: list[int]) -> list[Row]:
    torch = peers.load("torch")[0]
    rng = ctx.rng(12)
    inputs = {
        n: [torch_tensor(rng.standard_normal((n, n), dtype=np.float32), "f16") for _ in range(2)]
        for n in shapes
    }
    outs = {
        (lane, n): torch.empty((n, n), device="cuda", dtype=torch.float16)
        for lane in range(8)
        for n in shapes
    }
    rows: list[Row] = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for n in sizes:
        torch.matmul(*inputs[n], out=outs[(0, n)])
        torch.cuda.synchronize()
    rows.append(_row("serial (sync)", 1, sizes, time.perf_counter() - t0, "cuBLAS (torch)"))
    for s in (1, 2, 4, 8):
        streams = [torch.cuda.Stream() for _ in range(s)]

        def work(lane: int, mine: list[int]) -> None:
            with torch.cuda.stream(streams[lane]):  # noqa: B023 (called within the iteration)
                for n in mine:
                    torch.matmul(*inputs[n], out=outs[(lane, n)])
                    streams[lane].synchronize()  # noqa: B023 (called within the iteration)

        rows.append(_row("streams", s, sizes, _spread(sizes, s, work), "cuBLAS (torch)"))
    return rows


def run(ctx: Context) -> Result:
    import cutile_py_kernels as lib

    res = Result("workdist", "Mixed GEMM work over streams (Appendix B)")
    res.columns = ["impl", "mode", "streams", "gemms", "status", "ms", "tflops", "note"]
    sizes, shapes = _workload(ctx)
    ctx.log(f"workdist: {len(sizes)} GEMMs of {shapes}")
    if getattr(lib, "gemm", None) is None:
        res.rows.append(
            missing_row("needs cutile_py_kernels.gemm (not written yet)", impl="cutile_py")
        )
    else:
        attempt(ctx, res.rows, "cutile_py", partial(cutile, ctx, sizes, shapes), impl="cutile_py")
    mod, why = peers.load("torch")
    if mod is None or ctx.backend != "cuda":
        res.rows.append(missing_row(why or "torch needs the cuda backend", impl="cuBLAS (torch)"))
    else:
        attempt(
            ctx, res.rows, "torch", partial(torch_peer, ctx, sizes, shapes), impl="cuBLAS (torch)"
        )
    res.notes.append(
        "Wall time for the whole batch; one host thread per stream, each waiting for its own "
        "GEMMs in turn, so streams overlap device work and host waits."
    )
    return res
