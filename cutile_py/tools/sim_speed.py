"""Measure the simulator's speed: thread-instructions per second on element-wise kernels.

`python -m cutile_py.tools.sim_speed [--write] [--ab TREE]` runs each element-wise kernel at
1M elements and a 128^3 f16 GEMM (tensor-core mma, cp.async pipeline, ldmatrix) on the `sim`
backend (compiled PTX), checks the results against NumPy, and prints a Markdown table; with
`--write` it also writes `paper_repro/results/sim-speed.md` with this CPU's model and the date.
`--ab TREE` adds the GEMM timed against another checkout of the project (TREE, e.g. an older
commit's `git archive`): one process per tree, launches alternating, so both meet the same load.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f16, f32
from cutile_py.runtime.select import get_backend
from cutile_py.runtime.sim_backend import SimBackend
from cutile_py_kernels.elementwise import add_kernel, saxpy_kernel
from cutile_py_kernels.gemm import _gemm_kernel

ROOT = Path(__file__).resolve().parents[2]
B = TypeVar("B")


@ct.kernel
def gelu_tanh(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(0.5 * t * (1.0 + ct.tanh(0.7978845608028654 * (t + 0.044715 * t * t * t))))


def _gelu_ref(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    out: np.ndarray = 0.5 * x64 * (1.0 + np.tanh(0.7978845608028654 * (x64 + 0.044715 * x64**3)))
    return out


Case = tuple[str, Callable[[np.ndarray, np.ndarray], tuple[Any, ...]], Callable[..., np.ndarray]]


def cases(n: int, tile: int) -> list[Case]:
    def part() -> Any:
        return ct.zeros((n,)).partition(tile)

    return [
        ("add", lambda x, y: (add_kernel, part(), ct.from_numpy(x), ct.from_numpy(y)),
         lambda x, y: x + y),
        ("saxpy", lambda x, y: (saxpy_kernel, part(), 1.5, ct.from_numpy(x), ct.from_numpy(y)),
         lambda x, y: np.float32(1.5) * x + y),
        ("gelu_tanh", lambda x, y: (gelu_tanh, part(), ct.from_numpy(x)),
         lambda x, y: _gelu_ref(x)),
    ]  # fmt: skip


#: The GEMM case: (M, N, K), the output tile and K step the tuner picks for it on sim.
GEMM = (128, 128, 128)
GEMM_TILE, GEMM_BK = (64, 64), 32


def gemm_case() -> Case:
    m, n, k = GEMM
    kernel = _gemm_kernel(f16, f16, False, False)

    def make(x: np.ndarray, y: np.ndarray) -> tuple[Any, ...]:
        a = ct.from_numpy(x[: m * k].astype(np.float16).reshape(m, k))
        b = ct.from_numpy(y[: k * n].astype(np.float16).reshape(k, n))
        return (kernel, ct.empty((m, n), f16).partition(GEMM_TILE), a, b, GEMM_BK)

    def ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        a = x[: m * k].astype(np.float16).astype(np.float64).reshape(m, k)
        b = y[: k * n].astype(np.float16).astype(np.float64).reshape(k, n)
        return (a @ b).astype(np.float16)

    return ("gemm_f16_128^3", make, ref)


def measure(n: int = 1 << 20, tile: int = 1024, repeats: int = 5) -> list[dict[str, Any]]:
    ct.set_backend("sim")
    sim = get_backend("sim")
    assert isinstance(sim, SimBackend)
    saved = sim.options
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    rows = []
    for name, make, ref in [*cases(n, tile), gemm_case()]:
        kernel, *args = make(x, y)
        kernel(*args).sync()  # compile, load and parse outside the timing
        best = best_cpu = float("inf")
        for _ in range(repeats):
            kernel, *args = make(x, y)
            t0, c0 = time.perf_counter(), time.process_time()
            result = kernel(*args).sync()
            best = min(best, time.perf_counter() - t0)
            best_cpu = min(best_cpu, time.process_time() - c0)
        out = result[0].unpartition().to_numpy()
        want = ref(x, y)
        if want.dtype == np.float16:  # f32 sums rounded once to f16: within an f16 ulp
            np.testing.assert_allclose(out.astype(np.float64), want, rtol=2e-3, atol=2e-3)
        else:
            np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)
        stats = sim.last_stats
        assert stats is not None
        # Once more with the register semantics timed apart from the executor.
        sim.options = replace(saved, profile=True)
        kernel, *args = make(x, y)
        t0 = time.perf_counter()
        kernel(*args).sync()
        profiled = time.perf_counter() - t0
        sim.options = saved
        assert sim.last_stats is not None
        share = sim.last_stats.semantics_seconds / profiled
        rows.append(
            {
                "kernel": name,
                "elements": n,
                "threads": stats.threads,
                "thread_instructions": stats.thread_instructions,
                "steps": stats.steps,
                "seconds": best,
                "rate": stats.thread_instructions / best,
                "cpu_seconds": best_cpu,
                "cpu_rate": stats.thread_instructions / best_cpu,
                "semantics_share": share,
            }
        )
    return rows


#: A process that launches the GEMM once per line read, printing each launch's thread CPU time
#: (run with the tree to time on its PYTHONPATH; only public entry points, so older trees run
#: it too).
AB_WORKER = """
import sys, time
import numpy as np
import cutile_py as ct
from cutile_py.tools.sim_speed import gemm_case
ct.set_backend("sim")
rng = np.random.default_rng(0)
x = rng.standard_normal(1 << 20).astype(np.float32)
y = rng.standard_normal(1 << 20).astype(np.float32)
_, make, _ = gemm_case()
kernel, *args = make(x, y)
kernel(*args).sync()
print("ready", flush=True)
for _ in sys.stdin:
    kernel, *args = make(x, y)
    t0 = time.thread_time()
    kernel(*args).sync()
    print(time.thread_time() - t0, flush=True)
"""


def ab(trees: dict[str, Path], launches: int = 30) -> dict[str, list[float]]:
    """The GEMM's thread CPU seconds per launch in each tree, launches alternating between
    the trees' processes (in turn reversed every round)."""
    procs = {}
    for name, tree in trees.items():
        env = dict(os.environ, PYTHONPATH=str(tree))
        p = subprocess.Popen([sys.executable, "-c", AB_WORKER], cwd=tree, env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        assert p.stdin is not None and p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the GEMM did not run in {tree}")
        procs[name] = p
    times: dict[str, list[float]] = {name: [] for name in trees}
    order = list(procs.items())
    for i in range(launches):
        for name, p in order if i % 2 == 0 else order[::-1]:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("go\n")
            p.stdin.flush()
            times[name].append(float(p.stdout.readline()))
    for p in procs.values():
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
    return times


def ab_report(times: dict[str, list[float]], load: tuple[float, float]) -> str:
    """Markdown: `ab`'s times, best, tenth percentile and median per tree."""
    lines = [
        "",
        "## The GEMM against another tree",
        "",
        "Thread CPU time of the 128^3 f16 GEMM launch (race checks on), one process per tree,",
        f"{len(next(iter(times.values())))} launches each, alternating; load average (1 min) "
        f"before and after: {load[0]:.1f}, {load[1]:.1f}.",
        "",
        "| tree | best ms | p10 ms | median ms |",
        "|---|---:|---:|---:|",
    ]
    for name, ts in times.items():
        t = sorted(ts)
        lines.append(f"| {name} | {t[0] * 1e3:.2f} | {t[len(t) // 10] * 1e3:.2f} | "
                     f"{statistics.median(t) * 1e3:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    model = fields.get("Model name", platform.machine()).strip()
    cpus = fields.get("CPU(s)", "?").strip()
    return f"{model} ({cpus} CPUs)"


def report(rows: list[dict[str, Any]], load: tuple[float, float] = (0.0, 0.0)) -> str:
    """The Markdown table of `measure`'s rows; `load`: the 1-minute load average before and
    after measuring."""
    lines = [
        "# Simulator speed",
        "",
        "The `sim` backend executing the compiled PTX of element-wise kernels (f32, 1M elements,",
        "1024-element tiles, 256 threads per block) and of a 128^3 f16 GEMM (64x64 output tiles,",
        "K steps of 32, mma.sync, 3-stage cp.async pipeline), checked against NumPy, with the",
        "shared- and global-memory race checks on (the default). A thread-instruction",
        "is one instruction executed by one thread; the time is the best of five launches",
        "(`--repeats`),",
        "after the first launch (compilation, PTX parsing) has been done. Regenerate with",
        "`PYTHONPATH=. python -m cutile_py.tools.sim_speed --write`.",
        "",
        f"- CPU: {cpu_model()}",
        f"- Date: {datetime.date.today().isoformat()}",
        f"- Python {platform.python_version()}, NumPy {np.__version__}",
        "",
        "`semantics` is the share of the time spent in the register semantics",
        "(`cutile_py.sim.semantics`: ALU, float rounding, cvt, special functions, mma); the",
        "rest is the executor (control flow, masks, memory, race checks). It is one profiled",
        "launch's wall-time ratio, so it is noisy on a loaded machine.",
        "",
        "`cpu` is the same launch's best process CPU time. Method: on a machine shared with",
        "other work, wall time measures the machine's load as much as the simulator (here, a",
        "2-CPU box shared by several sessions, the GEMM's wall-clock rate ranged over 2x while",
        "its CPU time moved by 10%), so compare CPU times; the load average below says how busy",
        "the machine was (above its CPU count, wall times are inflated by waiting for a CPU).",
        "CPU time too grows with the load (sessions share caches and cores): a change is judged",
        "by `--ab`, which times the GEMM in this tree and another one in two processes whose",
        "launches alternate, so that both meet the same load.",
        "",
        f"- Load average (1 min) before and after measuring: {load[0]:.1f}, {load[1]:.1f}",
        "",
        "| kernel | threads | thread-instructions | steps | seconds | thread-instr/s | cpu "
        "seconds | thread-instr/s (cpu) | semantics |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kernel']} | {r['threads']:,} | {r['thread_instructions']:,} | "
            f"{r['steps']:,} | {r['seconds']:.3f} | {r['rate'] / 1e6:,.0f} M | "
            f"{r['cpu_seconds']:.3f} | {r['cpu_rate'] / 1e6:,.0f} M | {r['semantics_share']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="write paper_repro/results/")
    parser.add_argument("--repeats", type=int, default=5, help="launches timed per kernel")
    parser.add_argument("--ab", type=Path, help="another tree to time the GEMM against")
    parser.add_argument("--ab-name", default="before", help="its name in the table")
    args = parser.parse_args()
    before = os.getloadavg()[0]
    rows = measure(repeats=args.repeats)
    text = report(rows, (before, os.getloadavg()[0]))
    if args.ab is not None:
        before = os.getloadavg()[0]
        times = ab({args.ab_name: args.ab.resolve(), "this tree": ROOT})
        text += ab_report(times, (before, os.getloadavg()[0]))
    print(text)
    if args.write:
        path = ROOT / "paper_repro" / "results" / "sim-speed.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


if __name__ == "__main__":
    main()
