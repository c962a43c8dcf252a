"""Helpers the experiments share: tensors from host data, peers' tensors and the copy ceiling."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import cutile_py as ct
from paper_repro import peers
from paper_repro.core import Context, Row, measured_row, missing_row, sig
from paper_repro.timing import Measurement, Pending, gbps, rotation

CT_DTYPES = {"f32": ct.f32, "f16": ct.f16, "bf16": ct.bf16, "i32": ct.i32}
#: Bytes that rotated buffer sets may take in all (of the GPU's memory).
ROTATION_BUDGET = 8 << 30


def library_kernel(name: str) -> Any:
    """`cutile_py_kernels.<name>`, or None where it is not written yet."""
    import cutile_py_kernels

    return getattr(cutile_py_kernels, name, None)


def to_ct(arr: np.ndarray, dtype: str) -> Any:
    """A cutile_py tensor of `arr` rounded to `dtype`."""
    return ct.from_numpy(arr, dtype=CT_DTYPES[dtype])


def rotate_count(ctx: Context, footprint: int) -> int:
    """Buffer sets for a call touching `footprint` bytes (1 on the CPU backends)."""
    if ctx.backend != "cuda":
        return 1
    r = rotation(footprint, ctx.l2_bytes)
    return max(1, min(r, ROTATION_BUDGET // max(footprint, 1)))


def torch_tensor(arr: np.ndarray, dtype: str) -> Any:
    torch, _ = peers.load("torch")
    t = torch.from_numpy(np.ascontiguousarray(arr)).cuda()
    if dtype in peers.TORCH_DTYPES:
        t = t.to(getattr(torch, peers.TORCH_DTYPES[dtype]))
    return t


def nothing_to_wait(_: int) -> Sequence[Pending]:
    return ()


def time_peer(ctx: Context, stream: int, rotate: int, call: Callable[[int], Any]) -> Measurement:
    """Device time of `call(slot)` queued by a peer on its stream `stream`."""

    def launch(slot: int) -> Sequence[Pending]:
        call(slot)
        return ()

    return ctx.timer.device(launch, rotate=rotate, stream=stream)


def peer_missing(name: str, **fields: Any) -> Row | None:
    """A "missing" row if peer `name` is unavailable, else None."""
    mod, why = peers.load(name)
    return None if mod is not None else missing_row(why, impl=name, **fields)


def bandwidth_fields(m: Measurement, nbytes: int, ctx: Context) -> dict[str, Any]:
    bw = gbps(nbytes, m.median_us)
    copy = ctx.ceilings.get("copy_gbps")
    out: dict[str, Any] = {"bytes": nbytes, "gbps": sig(bw)}
    if copy:
        out["frac_copy"] = sig(bw / copy)
    return out


def bw_row(m: Measurement, nbytes: int, ctx: Context, **fields: Any) -> Row:
    return measured_row(m, **fields, **bandwidth_fields(m, nbytes, ctx))


#: Bytes below which a kernel is compared with a copy of its own size as well: a copy of
#: tens of MB does not reach the ceiling either (launch, ramp-up and tail are a larger part
#: of it; on an H200 one of 32 MB ran at 0.73 of the ceiling, one of 128 MB at 0.91).
SAME_SIZE_BELOW = 1 << 30


def same_size_copy(ctx: Context, nbytes: int) -> float:
    """GB/s of the best device copy that moves `nbytes` (half read, half written), measured
    once per size in this run; the copy ceiling from SAME_SIZE_BELOW bytes on."""
    ceiling = ctx.ceilings["copy_gbps"]
    if nbytes >= SAME_SIZE_BELOW:
        return ceiling
    if nbytes not in ctx.copies:
        rows = measure_copy(ctx, max(1, nbytes // 8))
        ctx.copies[nbytes] = max(float(r["gbps"] or 0) for r in rows)
    return ctx.copies[nbytes]


def copy_ceiling(ctx: Context) -> list[Row]:
    """Measure device-to-device copy bandwidth (cuMemcpyDtoD and a 16-byte-access copy
    kernel) once; the best is the ceiling `ctx.ceilings["copy_gbps"]`."""
    if "copy_gbps" in ctx.ceilings:
        return []
    rows = measure_copy(ctx, 1 << 10 if ctx.quick else 1 << 28)
    best = max(float(r["gbps"] or 0) for r in rows if isinstance(r.get("gbps"), float))
    ctx.ceilings["copy_gbps"] = best
    ctx.log(f"copy ceiling: {best:.1f} GB/s")
    return rows


def measure_copy(ctx: Context, n: int) -> list[Row]:
    """Device-to-device copies of `n` f32 (read once, written once): the PTX copy kernel and,
    on cuda, cuMemcpyDtoDAsync; rotated over buffer sets past twice the L2 like the rest."""
    from paper_repro.ptx import COPY_F32

    rng = ctx.rng(7)
    src = to_ct(rng.standard_normal(n, dtype=np.float32), "f32")
    rows: list[Row] = []
    copy = ct.RawKernel(COPY_F32, "copy_f32")
    rotate = rotate_count(ctx, 8 * n)
    dsts = [ct.zeros(n, ct.f32) for _ in range(rotate)]
    srcs = [src] + [
        to_ct(rng.standard_normal(n, dtype=np.float32), "f32") for _ in range(rotate - 1)
    ]
    blocks = -(-n // 1024)
    from paper_repro.timing import OpPending

    def kernel(slot: int) -> Sequence[Pending]:
        return [OpPending(copy(dsts[slot], srcs[slot], n, grid=blocks, block=256))]

    m = ctx.timer.device(kernel, rotate=rotate)
    rows.append(
        measured_row(
            m, impl="ptx copy kernel", n=n, bytes=8 * n, gbps=sig(gbps(8 * n, m.median_us))
        )
    )
    if ctx.backend == "cuda":
        from cutile_py.runtime.select import active_backend
        from paper_repro.cudrv import memcpy_dtod

        backend: Any = active_backend()
        stream = backend.activate().stream

        def memcpy(slot: int) -> Sequence[Pending]:
            memcpy_dtod(dsts[slot].buffer.address, srcs[slot].buffer.address, 4 * n, stream)
            return ()

        m2 = ctx.timer.device(memcpy, rotate=rotate)
        rows.append(
            measured_row(
                m2, impl="cuMemcpyDtoDAsync", n=n, bytes=8 * n, gbps=sig(gbps(8 * n, m2.median_us))
            )
        )
    return rows
