"""Every GEMM candidate of the autotuner, timed and checked one by one on a GPU.

    PYTHONPATH=. python -m paper_repro.gemm_sweep [--n 8192] [--dtype bf16] [--budget 150]

For each config the tuner would try at M = N = K = n (the wgmma list where the device has
wgmma, then the mma.sync list): the kernel's form (wgmma or mma.sync, TMA or cp.async, from
its PTX), the median device time of 7 runs (CUDA events, `ct.profiling.time_ms`), TFLOP/s,
the fraction of cuBLAS (torch.matmul, timed the same way on its own stream) and the relative
error against an f32 product of the same bf16/f16 operands (the output is poisoned with NaN
before the checked run). Stops starting new configs after `--budget` seconds and says how many
it left. Needs the cuda backend and PyTorch; prints a Markdown table, fastest first.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Any

import cutile_py as ct
from cutile_py_kernels import autotune
from cutile_py_kernels.gemm import config_kernel
from paper_repro.experiments.gemm import tflops
from paper_repro.gpu_monitor import GpuMonitor


def torch_ms(torch: Any, fn: Any, repeats: int = 7) -> float:
    """Median milliseconds of `repeats` runs of `fn()` on PyTorch's stream (CUDA events), each
    after the host waited for the last, after one untimed run."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(sorted(times)[len(times) // 2])


def torch_queued_ms(torch: Any, fn: Any, runs: int) -> float:
    """Milliseconds per run of `fn(i)` for i in 0..runs-1 queued back to back on PyTorch's
    stream, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(runs):
        fn(i)
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper_repro.gemm_sweep")
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    p.add_argument("--budget", type=float, default=150.0, help="seconds before stopping")
    p.add_argument("--only", choices=["wgmma", "mma"], help="one of the two candidate lists")
    p.add_argument(
        "--configs",
        default="",
        help="'bm,bn,bk,stages,warps,group_m[,ws[,persistent]];...' only (ws 1: "
        "warp-specialized; persistent 1: one wave of blocks walks the tiles)",
    )
    p.add_argument(
        "--sustained",
        type=int,
        default=0,
        help="then time the K fastest, the tuner's choice and cuBLAS run after run",
    )
    args = p.parse_args(argv)
    torch: Any = importlib.import_module("torch")
    ct.set_backend("cuda")
    n, dt = args.n, ct.bf16 if args.dtype == "bf16" else ct.f16
    tdt = torch.bfloat16 if dt is ct.bf16 else torch.float16
    gen = torch.Generator(device="cuda").manual_seed(int(time.time()))
    a_t = torch.randn((n, n), device="cuda", dtype=torch.float32, generator=gen).to(tdt)
    b_t = torch.randn((n, n), device="cuda", dtype=torch.float32, generator=gen).to(tdt)
    ref = a_t.float() @ b_t.float()
    ref_norm = float(ref.norm())
    a, b = ct.from_dlpack(a_t), ct.from_dlpack(b_t)
    c_t = torch.empty((n, n), device="cuda", dtype=tdt)
    cublas_ms = torch_ms(torch, lambda: torch.matmul(a_t, b_t, out=c_t))
    print(f"# gemm sweep: {torch.cuda.get_device_name()}, {args.dtype} n={n}", flush=True)
    cublas_us = cublas_ms * 1e3
    print(f"cuBLAS (torch.matmul): {cublas_us:.1f} us, {tflops(n, cublas_us):.1f} TFLOP/s")
    target = ct.profiling.target()
    lists = []
    if args.only != "mma" and target.wgmma:
        lists.append(autotune.candidates(dt, n, n, n, wgmma=True))
    if args.only != "wgmma":
        lists.append(autotune.candidates(dt, n, n, n, wgmma=False))
    configs = [c for cs in lists for c in cs]
    if args.configs:
        configs = [
            autotune.GemmConfig(*map(int, c.split(","))) for c in args.configs.split(";") if c
        ]
    rows, t0, left = [], time.perf_counter(), 0
    for i, cfg in enumerate(configs):
        if time.perf_counter() - t0 > args.budget:
            left = len(configs) - i
            break
        kernel = config_kernel(cfg, dt, dt, False, False)
        try:
            out_t = torch.full((n, n), float("nan"), device="cuda", dtype=tdt)
            out = ct.from_dlpack(out_t).partition((cfg.bm, cfg.bn))
            ptx = kernel.ptx(out, a, b, cfg.bk, target=target)
            form = ("wgmma" if "wgmma.mma_async" in ptx else "mma.sync") + (
                "+tma" if "cp.async.bulk.tensor" in ptx else ""
            )
            form += "+ws" if "setmaxnreg" in ptx else ""  # a producer warp group
            form += "+persistent" if ".param .u32 grid0" in ptx else ""
            kernel(out, a, b, cfg.bk).sync()
            err = float((out_t.float() - ref).norm()) / ref_norm
            run = lambda k=kernel, o=out, bk=cfg.bk: k(o, a, b, bk)  # noqa: E731
            ms = sorted(ct.profiling.time_ms(run, 7))[3]
            rows.append((ms, cfg, form, err, ""))
        except Exception as e:  # a failing config is a row, the sweep goes on
            rows.append((float("inf"), cfg, "?", float("nan"), f"{type(e).__name__}: {e}"[:160]))
        ms, _, form, err, note = rows[-1]
        print(f"  [{time.perf_counter() - t0:6.1f}s] {cfg} {form} {ms:.3f} ms err {err:.2e} {note}",
              file=sys.stderr, flush=True)  # fmt: skip
    head = "config (bm bn bk stages warps group_m [ws [persistent]])"
    print(f"\n| {head} | form | us | TFLOP/s | % cuBLAS | rel err |")
    print("|---|---|---|---|---|---|")
    for ms, cfg, form, err, note in sorted(rows, key=lambda r: r[0]):
        tf = tflops(n, ms * 1e3) if ms != float("inf") else 0.0
        desc = " ".join(map(str, cfg.astuple()))
        print(f"| {desc} | {form} | {ms * 1e3:.1f} | {tf:.1f} | {100 * cublas_ms / ms:.1f} | "
              f"{err:.2e} {note} |")  # fmt: skip
    if left:
        print(f"\n{left} of {len(configs)} configs not run: the {args.budget:.0f} s budget ran out")
    if args.sustained:
        _sustained(torch, args.sustained, rows, dt, n, a, b, a_t, b_t)
    return 0


#: Launches in a row for the sustained timing (each on its own output).
RUNS = 30


def _sustained(
    torch: Any, top: int, rows: list[Any], dt: Any, n: int, a: Any, b: Any, a_t: Any, b_t: Any
) -> None:  # fmt: skip
    """Device time per launch with RUNS launches queued back to back for the `top` fastest
    configs of the sweep, the config the library's tuner picks, and cuBLAS: a config that
    wins short bursts but slows run after run (clocks under a power limit) shows here, with
    the clocks, power and limit reasons sampled (NVML) while each was timed."""
    import cutile_py_kernels as ck

    ck.gemm(a, b)  # tunes this shape the way the library does
    tuned = autotune.TUNER.last
    picks = [cfg for _, cfg, _, _, note in sorted(rows, key=lambda r: r[0])[:top] if not note]
    if tuned is not None and tuned not in picks:
        picks.append(tuned)
    print(f"\n## run after run ({RUNS} launches queued); the tuner picks {tuned}")
    print("| config | us per launch | TFLOP/s | GPU while timed |\n|---|---|---|---|")
    with GpuMonitor() as gpu:
        for cfg in picks:
            kernel = config_kernel(cfg, dt, dt, False, False)

            def make(cfg: Any = cfg, kernel: Any = kernel) -> Any:
                out = ct.empty((n, n), dt).partition((cfg.bm, cfg.bn))
                return lambda: kernel(out, a, b, cfg.bk)

            # Each output is reused only once its op is done (the ownership rules): 3 in turn.
            with gpu.window() as w:
                us = 1e3 * ct.profiling.time_ms_queued([make() for _ in range(3)], RUNS)
            tag = " (tuner)" if cfg == tuned else ""
            print(f"| {' '.join(map(str, cfg.astuple()))}{tag} | {us:.1f} | "
                  f"{tflops(n, us):.1f} | {w.summary()} |")  # fmt: skip
        cs = [torch.empty_like(a_t) for _ in range(3)]
        torch.matmul(a_t, b_t, out=cs[0])
        with gpu.window() as w:
            us = 1e3 * torch_queued_ms(torch, lambda i: torch.matmul(a_t, b_t, out=cs[i % 3]), RUNS)
        print(f"| cuBLAS (torch.matmul) | {us:.1f} | {tflops(n, us):.1f} | {w.summary()} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
