"""One GEMM config timed every way this project times it, on the same GPU in one process.

    PYTHONPATH=. python -m paper_repro.gemm_timing_check [--n 8192] [--dtype bf16]

On an H200 the `gemm` experiment timed the tuner's pick at bf16 8192 (256x128x64, 4 stages,
warp-specialized) at 1769 us where `gemm_sweep` timed the same config at 1426 us, and cuBLAS
the same both ways (1387 / 1400 us). The two differ in the operands (the experiment's are
made by `ct.from_numpy` from `a / sqrt(n)` and `b`, the sweep's by `torch.randn`), in where
their memory comes from (cutile_py's pool or PyTorch's), and in the timing method (a spin
kernel, then one launch between two events; one launch after the host waited; launches
queued back to back). This script crosses them for the tuner's pick and the sweep's two best
configs, with cuBLAS first and last, so one run says which of them the gap follows; beside
each row, the SM clock, power and clock-limit reasons sampled (NVML) while it was timed
(`gpu_monitor`: configs slowed run after run on the H200, as under a power limit). Needs
the cuda backend; without PyTorch the cuBLAS rows and the "torch" operands are left out.
Prints Markdown.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import cutile_py as ct
from cutile_py_kernels import autotune
from cutile_py_kernels.gemm import config_kernel
from paper_repro.gemm_sweep import torch_ms, torch_queued_ms
from paper_repro.gpu_monitor import GpuMonitor
from paper_repro.timing import OpPending, Timer

#: The sweep's two best configs on the H200 (bf16 8192): (bm, bn, bk, stages, warps, group_m,
#: ws).
SWEEP_BEST = ((128, 256, 64, 3, 0, 8, 1), (256, 128, 64, 4, 0, 8, 1))
#: Launches queued back to back (the tuner's final round queues 12 over 3 outputs).
QUEUED_RUNS = 12


def _operands(torch: Any, kind: str, n: int, dt: Any, tdt: Any, rng: np.random.Generator) -> Any:
    """A and B as the experiment makes them ("ct-scaled"), the same memory unscaled
    ("ct-plain"), or as the sweep makes them ("torch")."""
    if kind == "torch":
        a = torch.randn((n, n), device="cuda", dtype=torch.float32).to(tdt)
        b = torch.randn((n, n), device="cuda", dtype=torch.float32).to(tdt)
        return ct.from_dlpack(a), ct.from_dlpack(b), (a, b)
    scale = np.float32(1.0 / np.sqrt(n)) if kind == "ct-scaled" else np.float32(1.0)
    a = rng.standard_normal((n, n), dtype=np.float32) * scale
    b = rng.standard_normal((n, n), dtype=np.float32)
    return ct.from_numpy(a, dtype=dt), ct.from_numpy(b, dtype=dt), None


def _methods(timer: Timer, make: Callable[[], Callable[[], Any]]) -> dict[str, float]:
    """Microseconds per launch: after the host waited (median of 7), after a spin kernel
    (the experiment's `Timer`), and queued back to back over 3 outputs."""
    one = make()
    burst = statistics.median(ct.profiling.time_ms(one, 7)) * 1e3
    spin = timer.device(lambda _: [OpPending(one())]).median_us
    queued = ct.profiling.time_ms_queued([make() for _ in range(3)], QUEUED_RUNS) * 1e3
    return {"after a wait": burst, "after a spin": spin, "queued": queued}


def _cublas(torch: Any, timer: Timer, n: int, tdt: Any) -> dict[str, float]:
    from paper_repro import peers

    a = torch.randn((n, n), device="cuda", dtype=torch.float32).to(tdt)
    b = torch.randn((n, n), device="cuda", dtype=torch.float32).to(tdt)
    cs = [torch.empty_like(a) for _ in range(3)]
    burst = 1e3 * torch_ms(torch, lambda: torch.matmul(a, b, out=cs[0]))

    def launch(_: int) -> list[Any]:
        torch.matmul(a, b, out=cs[0])
        return []

    spin = timer.device(launch, stream=peers.torch_stream()).median_us
    queued = 1e3 * torch_queued_ms(torch, lambda i: torch.matmul(a, b, out=cs[i % 3]), QUEUED_RUNS)
    return {"after a wait": burst, "after a spin": spin, "queued": queued}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    args = p.parse_args(argv)
    with GpuMonitor() as gpu:
        return _check(args, gpu)


def _check(args: argparse.Namespace, gpu: GpuMonitor) -> int:
    import cutile_py_kernels as ck

    try:
        torch: Any = importlib.import_module("torch")
        name = torch.cuda.get_device_name()
    except ImportError:
        torch, name = None, "(no PyTorch: no cuBLAS rows)"
    ct.set_backend("cuda")
    n, dt = args.n, ct.bf16 if args.dtype == "bf16" else ct.f16
    tdt = None if torch is None else torch.bfloat16 if dt is ct.bf16 else torch.float16
    rng = np.random.default_rng(int(time.time()))
    timer = Timer("cuda", reps=15, warmup=2)
    flop = 2.0 * n**3
    print(f"# GEMM timing check: {name}, {args.dtype} n={n}\n")
    if gpu.failure:
        print(f"(no clock samples: {gpu.failure})\n")
    print("| what | operands | after a wait (us) | after a spin (us) | queued (us) "
          "| GPU while timed |")  # fmt: skip
    print("|---|---|---|---|---|---|")

    def row(what: str, operands: str, measure: Callable[[], dict[str, float]]) -> None:
        with gpu.window() as w:
            t = measure()
        cells = " | ".join(f"{v:.1f} ({flop / v / 1e6 if v > 0 else 0:.0f} TF)" for v in t.values())
        print(f"| {what} | {operands} | {cells} | {w.summary()} |", flush=True)

    if torch is not None:
        row("cuBLAS (first)", "torch", lambda: _cublas(torch, timer, n, tdt))
    a, b, _ = _operands(torch, "ct-scaled", n, dt, tdt, rng)
    # A tuner of its own, so that it times the candidates here (a choice cached by an earlier
    # run would come with no timings).
    autotune.TUNER = autotune.Autotuner(path=Path(tempfile.mkdtemp()) / "gemm.json")
    ck.gemm(a, b)  # the tuner's pick for this shape, as the experiment gets it
    tuned, times = autotune.TUNER.last, dict(autotune.TUNER.last_times)
    configs = [autotune.GemmConfig(*c) for c in SWEEP_BEST]
    if tuned is not None and tuned not in configs:
        configs.insert(0, tuned)
    for kind in ("ct-scaled", "ct-plain") + (("torch",) if torch is not None else ()):
        a, b, keep = _operands(torch, kind, n, dt, tdt, rng)
        for cfg in configs:
            kernel = config_kernel(cfg, dt, dt, False, False)

            def make(cfg: Any = cfg, kernel: Any = kernel, a: Any = a, b: Any = b) -> Any:
                out = ct.zeros((n, n), dt).partition((cfg.bm, cfg.bn))
                return lambda: kernel(out, a, b, cfg.bk)

            tag = " (tuner)" if cfg == tuned else ""
            row(" ".join(map(str, cfg.astuple())) + tag, kind, partial(_methods, timer, make))
        del keep
    if torch is not None:
        row("cuBLAS (last)", "torch", lambda: _cublas(torch, timer, n, tdt))
    if tuned is not None:
        first, final = times.get(tuned, (float("nan"), None))
        print(f"\nThe tuner picked {tuned}: {first * 1e3:.1f} us in its first round (best of "
              f"5 after a wait)" + (f", {final * 1e3:.1f} us queued" if final else ""))  # fmt: skip
        ranked = sorted(times.items(), key=lambda kv: kv[1][1] or float("inf"))
        for cfg, (t1, t2) in ranked[: autotune.FINALISTS]:
            print(f"- finalist {cfg}: {t1 * 1e3:.1f} / {(t2 or 0) * 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
