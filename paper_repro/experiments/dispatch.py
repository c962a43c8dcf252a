"""The seed talk's dispatch table: causal softmax at seq_len 128 and 2048, RMSNorm at hidden
1536 and 2048, matmul at N = 128 and 2048, by cutile_py and Triton: host time per call
(queued, no waits) and device time per call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from paper_repro import peers
from paper_repro.core import Context, Result, Row, attempt, measured_row, missing_row, sig
from paper_repro.experiments.common import to_ct, torch_tensor
from paper_repro.replay import Replay
from paper_repro.timing import Pending

HEADS = 16
TOKENS = 4096


def _cases(quick: bool) -> list[tuple[str, str, tuple[int, ...]]]:
    if quick:
        return [
            ("softmax_causal", "seq_len=16", (2, 16, 16)),
            ("rms_norm", "hidden=64", (8, 64)),
            ("gemm", "N=32", (32,)),
        ]
    return [
        ("softmax_causal", "seq_len=128", (HEADS, 128, 128)),
        ("softmax_causal", "seq_len=2048", (HEADS, 2048, 2048)),
        ("rms_norm", "hidden=1536", (TOKENS, 1536)),
        ("rms_norm", "hidden=2048", (TOKENS, 2048)),
        ("gemm", "N=128", (128,)),
        ("gemm", "N=2048", (2048,)),
    ]


def _arrays(ctx: Context, op: str, shape: tuple[int, ...]) -> list[np.ndarray]:
    rng = ctx.rng(sum(shape))
    if op == "gemm":
        n = shape[0]
        return [
            rng.standard_normal((n, n), dtype=np.float32) / np.float32(n**0.5),
            rng.standard_normal((n, n), dtype=np.float32),
        ]
    if op == "rms_norm":
        return [
            rng.standard_normal(shape, dtype=np.float32),
            rng.standard_normal(shape[-1:], dtype=np.float32),
        ]
    return [rng.standard_normal(shape, dtype=np.float32)]


def _dtype(op: str) -> str:
    return "f16" if op == "gemm" else "f32"


def _two(
    ctx: Context, launch: Callable[[int], Sequence[Pending]], stream: int | None, **fields: Any
) -> Row:
    """Host µs to issue one call (building and launching its ops, no waits) and device µs
    per call. Calls alternate between two buffer sets; a set's previous call is waited for
    (untimed) before it is used again, since a pending op holds its outputs."""
    calls = 3 if ctx.quick else 50

    def issue() -> float:
        pending: list[Sequence[Pending]] = [(), ()]
        total = 0.0
        for i in range(calls):
            for p in pending[i % 2]:
                p.wait()
            t0 = time.perf_counter()
            pending[i % 2] = launch(i % 2)
            total += time.perf_counter() - t0
        for group in pending:
            for p in group:
                p.wait()
        return total * 1e6 / calls

    issue()
    host_us = statistics.median(issue() for _ in range(3))
    dev = ctx.timer.device(launch, rotate=2, stream=stream)
    row = measured_row(dev, **fields)
    row["device_us"] = row.pop("time_us")
    row["host_us_per_call"] = sig(host_us)
    return row


def cutile(ctx: Context, op: str, case: str, shape: tuple[int, ...]) -> list[Row]:
    import cutile_py_kernels as lib

    arrays = _arrays(ctx, op, shape)
    sets = [[to_ct(a, _dtype(op)) for a in arrays] for _ in range(2)]
    fn = getattr(lib, "softmax" if op == "softmax_causal" else op)
    call: Callable[..., Any] = (lambda x: fn(x, causal=True)) if op == "softmax_causal" else fn
    replay = Replay(call, sets[0], sets)
    return [_two(ctx, replay.launch, None, op=op, case=case, impl="cutile_py")]


def triton(ctx: Context, op: str, case: str, shape: tuple[int, ...]) -> list[Row]:
    from paper_repro.peers import triton_kernels as tk

    torch = peers.load("torch")[0]
    arrays = _arrays(ctx, op, shape)
    sets = [[torch_tensor(a, _dtype(op)) for a in arrays] for _ in range(2)]
    outs = [torch.empty_like(s[0]) for s in sets]
    if op == "gemm":
        fns = [lambda i=i: tk.matmul(sets[i][0], sets[i][1], outs[i]) for i in range(2)]
    elif op == "rms_norm":
        fns = [lambda i=i: tk.rms_norm(sets[i][0], sets[i][1], outs[i]) for i in range(2)]
    else:
        fns = [lambda i=i: tk.softmax(sets[i][0], outs[i], causal=True) for i in range(2)]

    def launch(i: int) -> Sequence[Pending]:
        fns[i]()
        return ()

    return [_two(ctx, launch, peers.torch_stream(), op=op, case=case, impl="triton")]


def run(ctx: Context) -> Result:
    import cutile_py_kernels as lib

    res = Result("dispatch", "Dispatch table: host and device time per call")
    res.columns = ["op", "case", "impl", "status", "host_us_per_call", "device_us", "note"]
    have_triton = peers.load("triton")[0] is not None and ctx.backend == "cuda"
    for op, case, shape in _cases(ctx.quick):
        ctx.log(f"dispatch: {op} {case}")
        name = "softmax" if op == "softmax_causal" else op
        if getattr(lib, name, None) is None:
            res.rows.append(
                missing_row(
                    f"cutile_py_kernels.{name} not written yet", op=op, case=case, impl="cutile_py"
                )
            )
        else:
            attempt(
                ctx,
                res.rows,
                f"{op} {case}",
                partial(cutile, ctx, op, case, shape),
                op=op,
                case=case,
                impl="cutile_py",
            )
        if have_triton:
            attempt(
                ctx,
                res.rows,
                f"triton {op} {case}",
                partial(triton, ctx, op, case, shape),
                op=op,
                case=case,
                impl="triton",
            )
    if not have_triton:
        why = peers.load("triton")[1] or "triton needs the cuda backend"
        res.rows.append(missing_row(why, impl="triton"))
    res.notes.append(
        "host_us_per_call: host time to issue one call (op construction, checks, cache lookup, "
        "launch; waits excluded), median over 3 rounds of 50 calls; "
        "device_us: CUDA-event time per call. Causal softmax is over (16, S, S), RMSNorm over "
        "4096 tokens, matmul f16 NxNxN."
    )
    return res
