"""Several independent ops in flight at once from asyncio, then the same work as a graph.

Each task builds `z = a*x + y` followed by `w = z + x` (a `.then` chain) and awaits it; the
event loop stays free while the device works, and the tasks' launches go to different
streams, so on a GPU they overlap. Then one chain is captured with `ct.graph` and replayed on
fresh inputs. Every result is checked against NumPy.

Run: python examples/async_pipeline.py   (on the GPU where there is one, else the simulator)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

import cutile_py as ct
from cutile_py_kernels.elementwise import TILE, add_kernel, saxpy_kernel

N = 3 * TILE + 100  # the last tile is partial
TASKS = 4


def pipeline(a: float, x: ct.Tensor[Any, Any], y: ct.Tensor[Any, Any]) -> ct.OpLike:
    """`w = (a*x + y) + x` as a chain of two launches (not yet run)."""

    def add_x(result: tuple[Any, ...]) -> ct.DeviceOp:
        z, _, x_back, _ = result
        op: ct.DeviceOp = add_kernel(ct.zeros(N).partition(TILE), z.unpartition(), x_back)
        return op

    first: ct.DeviceOp = saxpy_kernel(ct.zeros(N).partition(TILE), a, x, y)
    return first.then(add_x)


async def one_task(i: int, rng: np.random.Generator) -> float:
    """Run one pipeline on fresh inputs; return its largest error against NumPy."""
    xs = rng.standard_normal(N).astype(np.float32)
    ys = rng.standard_normal(N).astype(np.float32)
    a = float(i + 1)
    w, _, _ = await pipeline(a, ct.from_numpy(xs), ct.from_numpy(ys))
    got = w.unpartition().to_numpy()
    expected = (np.float32(a) * xs + ys) + xs
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-5), f"task {i} differs from NumPy"
    return float(np.abs(got - expected).max())


async def run_tasks() -> list[float]:
    rng = np.random.default_rng()
    return await asyncio.gather(*(one_task(i, rng) for i in range(TASKS)))


async def run_graph(replays: int) -> float:
    """Capture one pipeline and replay it on new inputs; returns the largest error."""
    rng = np.random.default_rng()
    x, y = ct.zeros(N), ct.zeros(N)
    out = ct.zeros(N).partition(TILE)

    def into_out(result: tuple[Any, ...]) -> ct.DeviceOp:
        op: ct.DeviceOp = add_kernel(out, result[0].unpartition(), result[2])
        return op

    first: ct.DeviceOp = saxpy_kernel(ct.zeros(N).partition(TILE), 2.0, x, y)
    g = ct.graph(first.then(into_out))
    worst = 0.0
    for _ in range(replays):
        xs = rng.standard_normal(N).astype(np.float32)
        ys = rng.standard_normal(N).astype(np.float32)
        g.update(x, xs)
        g.update(y, ys)
        await g.replay_async()
        expected = (np.float32(2.0) * xs + ys) + xs
        got = g.read(out)
        assert np.allclose(got, expected, rtol=1e-5, atol=1e-5), "graph replay differs"
        worst = max(worst, float(np.abs(got - expected).max()))
    g.release()
    return worst


def main() -> None:
    start = time.perf_counter()
    errors = asyncio.run(run_tasks())
    graph_error = asyncio.run(run_graph(replays=3))
    seconds = time.perf_counter() - start
    print(
        f"backend {ct.backend()}: {TASKS} pipelines in flight, max |error| {max(errors):.3g}; "
        f"graph replays max |error| {graph_error:.3g}; {seconds:.2f} s"
    )


if __name__ == "__main__":
    main()
