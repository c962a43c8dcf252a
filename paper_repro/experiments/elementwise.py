"""Paper §5.1, element-wise: z = x + y in f32 and f16 for N = 2^20..2^28, by cutile_py,
hand-written PTX (`ct.RawKernel`), PyTorch, CuPy and Triton; GB/s and fraction of copy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

import cutile_py as ct
from paper_repro import paper, peers
from paper_repro.core import Context, Result, Row, attempt, random_array
from paper_repro.experiments.common import (
    CT_DTYPES,
    bw_row,
    copy_ceiling,
    peer_missing,
    rotate_count,
    time_peer,
    to_ct,
    torch_tensor,
)
from paper_repro.kernels import TILE, add_f16, add_f32
from paper_repro.ptx import ADD_F16, ADD_F32
from paper_repro.timing import OpPending, Pending

PEERS = ("torch", "cupy", "triton")


def _cutile(ctx: Context, dtype: str, x: np.ndarray, y: np.ndarray, raw: bool) -> list[Row]:
    n = x.size
    size = CT_DTYPES[dtype].itemsize()
    rotate = rotate_count(ctx, 3 * n * size)
    xs = [to_ct(x, dtype) for _ in range(rotate)]
    ys = [to_ct(y, dtype) for _ in range(rotate)]
    if raw:
        per_thread = 16 // size
        kernel = ct.RawKernel(ADD_F32 if dtype == "f32" else ADD_F16, f"add_{dtype}")
        zs = [ct.zeros(n, CT_DTYPES[dtype]) for _ in range(rotate)]
        blocks = -(-n // (256 * per_thread))

        def launch(i: int) -> Sequence[Pending]:
            return [OpPending(kernel(zs[i], xs[i], ys[i], n, grid=blocks, block=256))]

        impl = "ptx (ct.RawKernel)"
        check: Callable[[], np.ndarray] | None = zs[0].to_numpy
    else:
        k = add_f32 if dtype == "f32" else add_f16
        ps = [ct.zeros(n, CT_DTYPES[dtype]).partition(TILE) for _ in range(rotate)]

        def launch(i: int) -> Sequence[Pending]:
            return [OpPending(k(ps[i], xs[i], ys[i]))]

        impl = "cutile_py"
        check = None
    m = ctx.timer.device(launch, rotate=rotate)
    if check is not None:
        got = check()
        want = (x.astype(np.float16) + y.astype(np.float16)) if dtype == "f16" else x + y
        if not np.array_equal(got, want):
            raise AssertionError("hand-written PTX add gave wrong results")
    return [bw_row(m, 3 * n * size, ctx, impl=impl, dtype=dtype, n=n)]


def _peer(ctx: Context, peer: str, dtype: str, x: np.ndarray, y: np.ndarray) -> list[Row]:
    n = x.size
    size = CT_DTYPES[dtype].itemsize()
    rotate = rotate_count(ctx, 3 * n * size)
    if peer == "cupy":
        cupy = peers.load("cupy")[0]
        np_dt = np.float32 if dtype == "f32" else np.float16
        xs = [cupy.asarray(x.astype(np_dt)) for _ in range(rotate)]
        ys = [cupy.asarray(y.astype(np_dt)) for _ in range(rotate)]
        zs = [cupy.empty_like(xs[0]) for _ in range(rotate)]
        stream = peers.cupy_stream()
        fn: Any = lambda i: cupy.add(xs[i], ys[i], out=zs[i])  # noqa: E731
    else:
        xs = [torch_tensor(x, dtype) for _ in range(rotate)]
        ys = [torch_tensor(y, dtype) for _ in range(rotate)]
        zs = [xs[0].new_empty(xs[0].shape) for _ in range(rotate)]
        stream = peers.torch_stream()
        if peer == "torch":
            torch = peers.load("torch")[0]
            fn = lambda i: torch.add(xs[i], ys[i], out=zs[i])  # noqa: E731
        else:
            from paper_repro.peers import triton_kernels as tk

            fn = lambda i: tk.add(xs[i], ys[i], zs[i])  # noqa: E731
    m = time_peer(ctx, stream, rotate, fn)
    return [bw_row(m, 3 * n * size, ctx, impl=peer, dtype=dtype, n=n)]


def run(ctx: Context) -> Result:
    res = Result("elementwise", "Element-wise add, f32 and f16 (paper §5.1)")
    res.columns = ["impl", "dtype", "n", "status", "time_us", "gbps", "frac_copy", "note"]
    res.rows.extend(copy_ceiling(ctx))
    sizes = [1 << 10, 1 << 12] if ctx.quick else [1 << p for p in (20, 22, 24, 26, 28)]
    for dtype in ("f32", "f16"):
        for n in sizes:
            ctx.log(f"elementwise: {dtype} n=2^{n.bit_length() - 1}")
            rng = ctx.rng(n)
            x, y = random_array(rng, (n,)), random_array(rng, (n,))
            for raw in (False, True):
                attempt(
                    ctx,
                    res.rows,
                    f"{dtype} {n} raw={raw}",
                    partial(_cutile, ctx, dtype, x, y, raw),
                    impl="ptx" if raw else "cutile_py",
                    dtype=dtype,
                    n=n,
                )
            if ctx.backend == "cuda":
                for peer in PEERS:
                    if peer_missing(peer) is None:
                        attempt(
                            ctx,
                            res.rows,
                            f"{peer} {dtype} {n}",
                            partial(_peer, ctx, peer, dtype, x, y),
                            impl=peer,
                            dtype=dtype,
                            n=n,
                        )
    for peer in PEERS:
        row = peer_missing(peer)
        if row is None and ctx.backend != "cuda":
            row = {"impl": peer, "status": "missing", "note": f"{peer} needs the cuda backend"}
        if row is not None:
            res.rows.append(row)
    best = max(
        (
            r
            for r in res.rows
            if r.get("impl") == "cutile_py" and r.get("status") == "ok" and r.get("dtype") == "f32"
        ),
        key=lambda r: float(r.get("gbps") or 0),
        default=None,
    )
    copy = ctx.ceilings.get("copy_gbps", 0.0)
    ours = (
        f"{best['gbps']} GB/s of {copy:.4g} GB/s copy = {best.get('frac_copy')} "
        f"(f32, n={best['n']}, {ctx.backend})"
        if best
        else "no measurement"
    )
    res.summary.append(
        f"paper: {paper.ELEMENTWISE_TBPS} of {paper.ELEMENTWISE_COPY_TBPS} TB/s on a "
        f"{paper.ELEMENTWISE_GPU} = {paper.ELEMENTWISE_FRACTION:.1%} of copy; cutile_py here: "
        + ours
    )
    res.notes.append("Bytes per call: 3·n·element size. Outputs preallocated for every impl.")
    return res
