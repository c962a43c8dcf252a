"""Warps per block of the one-tile row kernels, timed on a GPU at short rows.

    PYTHONPATH=. python -m paper_repro.row_sweep [--kernels rms_norm,softmax] [--quick]

The one-tile row kernels give each thread `PER_THREAD` elements (32: fewest SASS instructions
per element, measured off-GPU), so a 4096 x 1536 f32 rms_norm runs 2048 blocks of 2 warps.
At rows this short a whole problem is a few microseconds of memory traffic, and how many
loads are in flight, not instructions, may set the time. This times each kernel the way
`python -m paper_repro bandwidth` does (the launches the host function makes, replayed on
rotated buffer sets, CUDA events) with PER_THREAD 8, 16 and 32, beside the copy ceiling, and
prints a Markdown table. Beside the copy ceiling (2^28 floats) each shape has the copy of
its own bytes (the same PTX copy kernel or cuMemcpyDtoDAsync, the better): at a few tens of
megabytes a copy does not reach the ceiling either. `--quick` runs tiny shapes on sim (a check
of the script only).
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

import cutile_py as ct
from cutile_py_kernels import _common
from paper_repro.core import Context
from paper_repro.experiments import bandwidth
from paper_repro.experiments.common import copy_ceiling, measure_copy
from paper_repro.machine import describe
from paper_repro.timing import Timer

softmax_mod: Any = importlib.import_module("cutile_py_kernels.softmax")  # not the function
WIDTHS = (1024, 1536, 2048, 4096)
PER_THREAD = (8, 16, 32)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper_repro.row_sweep")
    p.add_argument("--kernels", default="rms_norm,softmax")
    p.add_argument("--quick", action="store_true", help="tiny shapes on sim")
    args = p.parse_args(argv)
    ct.set_backend("sim" if args.quick else "cuda")
    backend = ct.backend()
    device = describe(backend)
    l2 = device.get("l2_bytes")
    reps = 3 if args.quick else 15
    ctx = Context(backend, args.quick, Timer(backend, reps, 1 if args.quick else 2), 0, device)
    ctx.l2_bytes = int(l2) if isinstance(l2, int) else 0
    copy = max(float(r.get("gbps") or 0) for r in copy_ceiling(ctx))
    specs = {s.name: s for s in bandwidth.SPECS}
    rows_n = 8 if args.quick else bandwidth.ROWS
    widths = (64, 96) if args.quick else WIDTHS
    print(f"# one-tile row kernels by elements per thread ({device.get('gpu', backend)})")
    print(f"copy ceiling {copy:.0f} GB/s\n")
    print("| kernel | shape | per thread | warps | us | GB/s | of copy | of same-size copy |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.kernels.split(","):
        spec, fn = specs[name], getattr(importlib.import_module("cutile_py_kernels"), name)
        for w in widths:
            shape = (rows_n, w)
            same = max(
                float(r.get("gbps") or 0) for r in measure_copy(ctx, spec.nbytes(shape) // 8)
            )
            for per in PER_THREAD:
                _common.PER_THREAD = per
                softmax_mod.PER_THREAD = per
                _common._ROW_LAUNCHES.clear()
                warps = _warps(name, shape)
                try:
                    (row,) = bandwidth.measure_cutile(ctx, spec, fn, shape)
                    gbps = float(row["gbps"] or 0)
                    print(
                        f"| {name} | {rows_n}x{w} | {per} | {warps} | {row['time_us']} | "
                        f"{gbps:.0f} | {gbps / copy:.3f} | {gbps / same:.3f} |",
                        flush=True,
                    )
                except Exception as e:  # a failing variant is a row; the sweep goes on
                    print(f"| {name} | {rows_n}x{w} | {per} | {warps} | error: {e} | | | |")
    return 0


def _warps(name: str, shape: tuple[int, int]) -> Any:
    """The warps per block the library picks for `shape` under the current PER_THREAD."""
    r, n = shape
    if name == "softmax":
        return softmax_mod.softmax_plan(r, n, ct.f32)[1]
    return _common.row_warps(_common.row_plan(r, n, ct.f32))


if __name__ == "__main__":
    raise SystemExit(main())
