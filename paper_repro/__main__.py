"""`python -m paper_repro [all | EXPERIMENT ...] [--out DIR] [--quick] [--backend NAME]`."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import time
import traceback
from pathlib import Path

import cutile_py as ct
from paper_repro.core import Context, Result, error_row
from paper_repro.machine import describe
from paper_repro.report import write_report, write_result
from paper_repro.timing import Timer

EXPERIMENTS = [
    "bandwidth",
    "race",
    "elementwise",
    "gemm",
    "jit",
    "launch",
    "host",
    "workdist",
    "dispatch",
    "decode",
]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m paper_repro", description=__doc__)
    p.add_argument(
        "experiments",
        nargs="*",
        default=["all"],
        help=f"'all' or some of: {', '.join(EXPERIMENTS)}",
    )
    p.add_argument("--out", type=Path, help="output directory (default: results/<gpu>-<date>)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes on the CPU ('sim' backend unless --backend is given)",
    )
    p.add_argument(
        "--lean",
        action="store_true",
        help="GPU sizes, but only the largest few per experiment (for a bounded device lease)",
    )
    p.add_argument("--backend", choices=["cuda", "sim", "interpret"])
    p.add_argument("--reps", type=int, help="timed samples per measurement")
    p.add_argument(
        "--only", default="", help="bandwidth: comma-separated kernel names, timed in that order"
    )
    p.add_argument(
        "--dtype",
        default="f32",
        help="bandwidth: comma-separated dtypes (f32, f16, bf16) of the kernels "
        "whose tensors are all floats",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="bandwidth: time each implementation at a shape this many times in "
        "turn (the spread between rounds, and the rounds' ratio to Triton)",
    )
    p.add_argument(
        "--shapes",
        default="",
        help="bandwidth: only these shapes, comma-separated as labelled in the "
        "report (4096x1536, 268435456, 16x1024x1024), or for one kernel (softmax:4096x1024)",
    )
    p.add_argument("--debug", action="store_true", help="tracebacks for every failure")
    args = p.parse_args(argv)
    chosen = EXPERIMENTS if "all" in args.experiments else args.experiments
    unknown = [e for e in chosen if e not in EXPERIMENTS]
    if unknown:
        p.error(f"unknown experiment(s) {', '.join(unknown)}; choose from {', '.join(EXPERIMENTS)}")
    bad = [d for d in args.dtype.split(",") if d not in ("f32", "f16", "bf16")]
    if bad:
        p.error(f"--dtype: unknown dtype(s) {', '.join(bad)}; choose from f32, f16, bf16")
    if args.rounds < 1:
        p.error(f"--rounds: expected at least 1, got {args.rounds}")
    from paper_repro.experiments.bandwidth import SPECS

    kernels = [spec.name for spec in SPECS]
    unknown = [k for k in args.only.split(",") if k and k not in kernels]
    if unknown:
        p.error(f"--only: unknown kernel(s) {', '.join(unknown)}; choose from {', '.join(kernels)}")
    args.chosen = chosen
    return args


def bandwidth_options(args: argparse.Namespace) -> dict[str, object]:
    """The bandwidth experiment's keyword arguments from the command line."""
    return {
        "only": [k for k in args.only.split(",") if k],
        "dtypes": args.dtype.split(","),
        "rounds": args.rounds,
        "shapes": [s for s in args.shapes.split(",") if s],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    backend = args.backend or ("sim" if args.quick else None)
    if backend:
        ct.set_backend(backend)
    backend = ct.backend()
    device = describe(backend)
    if args.out is None:
        slug = re.sub(r"[^a-z0-9]+", "-", str(device.get("gpu", backend)).lower()).strip("-")
        slug = slug if backend == "cuda" else f"{backend}-quick" if args.quick else backend
        args.out = Path(__file__).parent / "results" / f"{slug}-{time.strftime('%Y-%m-%d')}"
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    quick = args.quick or backend != "cuda"
    reps = args.reps or (3 if quick else 15)
    timer = Timer(backend, reps=reps, warmup=1 if quick else 2)
    l2 = device.get("l2_bytes")
    ctx = Context(backend, quick, timer, int(l2) if isinstance(l2, int) else 0, device)
    ctx.lean = args.lean and not quick
    ctx.log(f"paper_repro: backend {backend}, experiments {', '.join(args.chosen)} -> {out}")
    (out / "machine.json").write_text(json.dumps(device, indent=1) + "\n")
    results: list[Result] = []
    for name in args.chosen:
        t0 = time.perf_counter()
        ctx.log(f"== {name}")
        module = importlib.import_module(f"paper_repro.experiments.{name}")

        saved: list[Result] = []  # the result as last checkpointed

        def checkpoint(res: Result, t0: float = t0, saved: list[Result] = saved) -> None:
            saved[:] = [res]
            res.seconds = time.perf_counter() - t0
            write_result(out, res)
            write_report(out, ctx, [*results, res], argv, running=res.name)

        ctx.checkpoint = checkpoint
        try:
            if name == "bandwidth":
                res: Result = module.run(ctx, **bandwidth_options(args))
            else:
                res = module.run(ctx)
        except Exception as e:  # an experiment that fails leaves its error in the report
            traceback.print_exc(file=sys.stderr)
            if saved:  # the rows checkpointed before the error are kept beside it
                res = saved[0]
                res.title += " (failed)"
                res.rows.append(error_row(e, what=name))
            else:
                res = Result(name, f"{name} (failed)", rows=[error_row(e, what=name)])
        res.seconds = time.perf_counter() - t0
        results.append(res)
        write_result(out, res)
        write_report(out, ctx, results, argv)
        ctx.log(f"   {name}: {len(res.rows)} rows in {res.seconds:.1f}s")
    ctx.log(f"done: {out / 'REPORT.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
