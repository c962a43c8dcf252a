"""JIT cost: capture, frontend, lowering, PTX→cubin, module load, and the first launch cold,
warm in-process and from the disk cache, for a small and a larger kernel.

Phases are timed from outside with `time.perf_counter` around cutile_py's internal steps
(`capture`, `build_kernel`, `lower_kernel`, nvJitLink `assemble`, module load); first launches
are timed in fresh processes so that no in-memory cache helps.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import cutile_py as ct
from paper_repro.core import Context, Result, Row, attempt, missing_row, sig
from paper_repro.kernels import TILE

KERNELS = {"small (add_f32)": "add_f32", "larger (chain_f32)": "chain_f32"}
N = 1 << 16
N_QUICK = 1 << 12

_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import cutile_py as ct
from paper_repro import kernels
t1 = time.perf_counter()
k = getattr(kernels, sys.argv[1])
n = int(sys.argv[2])
x = ct.from_numpy(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
y = ct.from_numpy(np.random.default_rng(1).standard_normal(n, dtype=np.float32))
z = ct.zeros(n).partition(kernels.TILE)
t2 = time.perf_counter()
z, x, y = k(z, x, y).sync()
t3 = time.perf_counter()
z, x, y = k(z, x, y).sync()
t4 = time.perf_counter()
info = ct.cache_info()
print(json.dumps({"import_s": t1 - t0, "first_s": t3 - t2, "second_s": t4 - t3,
                  "disk_hits": info.disk_hits, "compiles": info.compiles}))
"""


def _median_s(body: Callable[[], Any], reps: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = body()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _capture(fn: Any) -> Any:
    return ct.kernel(fn)


def phases(ctx: Context, label: str, name: str) -> list[Row]:
    """In-process phase times (medians over repetitions; each phase starts from scratch)."""
    from cutile_py.frontend.build_ir import build_kernel
    from cutile_py.lower.pipeline import lower_kernel
    from cutile_py.runtime.select import active_backend
    from paper_repro import kernels

    reps = 3 if ctx.quick else 10
    fn = getattr(kernels, name).fn
    backend = active_backend()
    target = backend.target if backend.runs_ptx else ct.Target(80)
    n = N_QUICK if ctx.quick else N
    args = (
        ct.PartitionSpec((n,), (TILE,), ct.f32),
        ct.TensorSpec((n,), ct.f32),
        ct.TensorSpec((n,), ct.f32),
    )
    rows: list[Row] = []

    def row(phase: str, seconds: float, **extra: Any) -> None:
        rows.append(
            {"kernel": label, "phase": phase, "status": "ok", "ms": sig(seconds * 1e3), **extra}
        )

    t, k = _median_s(partial(_capture, fn), reps)
    row("capture (@ct.kernel)", t)
    spec = k.specialize(args)
    t, ir = _median_s(partial(build_kernel, k.captured, spec, False), reps)
    row("frontend (AST → tile IR)", t)
    t, lowered = _median_s(partial(lower_kernel, ir, target), reps)
    row("lowering (tile IR → PTX)", t, ptx_lines=lowered.ptx.count("\n"))
    from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available

    cubin = None
    if nvjitlink_available():
        asm_target = target if backend.name == "cuda" else ct.Target(90)
        t, report = _median_s(partial(assemble, lowered.ptx, asm_target), reps)
        cubin = report.cubin
        row(f"PTX → cubin (nvJitLink, {asm_target.name})", t, registers=report.registers)
    else:
        rows.append(missing_row("nvJitLink not installed", kernel=label, phase="PTX → cubin"))
    if backend.name == "cuda" and cubin is not None:
        from cutile_py.runtime import cuda_driver as cu

        backend.target  # noqa: B018 (makes the context current)

        def load() -> Any:
            module = cu.module_load_data(cubin)
            cu.module_get_function(module, lowered.entry)
            return module

        t, _ = _median_s(load, reps)
        row("module load (cuModuleLoadData)", t)
    elif backend.name == "sim":
        from cutile_py.runtime.sim_backend import SimBackend

        t, _ = _median_s(lambda: SimBackend().load_kernel(lowered.ptx, lowered.entry), reps)
        row("module load (sim: parse PTX, build program)", t)
    return rows


def first_launches(ctx: Context, label: str, name: str) -> list[Row]:
    """First launch in a fresh process with an empty disk cache, then with a warm one."""
    root = Path(__file__).resolve().parents[2]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CUTILE_PY_CACHE_DIR=cache, CUTILE_PY_BACKEND=ctx.backend)
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        for phase in ("cold (fresh process, empty disk cache)", "disk cache (fresh process)"):
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, name, str(N_QUICK if ctx.quick else N)],
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
                check=False,
            )
            if out.returncode != 0:
                raise RuntimeError(f"child failed: {out.stderr.strip().splitlines()[-1:]}")
            got = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(
                {
                    "kernel": label,
                    "phase": f"first launch, {phase}",
                    "status": "ok",
                    "ms": sig(got["first_s"] * 1e3),
                    "disk_hits": got["disk_hits"],
                    "frontend_runs": got["compiles"],
                }
            )
            if phase.startswith("cold"):
                rows.append(
                    {
                        "kernel": label,
                        "phase": "next launch, warm in-process",
                        "status": "ok",
                        "ms": sig(got["second_s"] * 1e3),
                    }
                )
                rows.append(
                    {
                        "kernel": label,
                        "phase": "import cutile_py (fresh process)",
                        "status": "ok",
                        "ms": sig(got["import_s"] * 1e3),
                    }
                )
    return rows


def run(ctx: Context) -> Result:
    res = Result("jit", "JIT compile and load times")
    res.columns = [
        "kernel",
        "phase",
        "status",
        "ms",
        "ptx_lines",
        "registers",
        "disk_hits",
        "frontend_runs",
        "note",
    ]
    for label, name in KERNELS.items():
        ctx.log(f"jit: {label}")
        attempt(ctx, res.rows, f"{label} phases", partial(phases, ctx, label, name), kernel=label)
        attempt(
            ctx,
            res.rows,
            f"{label} launches",
            partial(first_launches, ctx, label, name),
            kernel=label,
        )
    res.notes.append(
        "Launch rows include everything the first `op.sync()` does (specialization, cache "
        "lookups, compile or disk read, module load, the launch and its wait) for n = 65536 "
        "(4096 with --quick). The disk-cache row is a second fresh process given the first "
        "one's cache directory."
    )
    cold = {
        r["kernel"]: r["ms"]
        for r in res.rows
        if str(r.get("phase", "")).endswith("empty disk cache)")
    }
    disk = {
        r["kernel"]: r["ms"]
        for r in res.rows
        if str(r.get("phase", "")).endswith("disk cache (fresh process)")
    }
    for k in cold:
        res.summary.append(
            f"{k}: first launch {cold[k]} ms cold, {disk.get(k)} ms from the disk cache "
            f"({ctx.backend})"
        )
    return res
