"""PTX that nvcc compiled from CUDA C (`nvcc_oracle/kernels.cu`, sm_80, made by
`nvcc_oracle/generate.py`) run on sim against NumPy: global atomics on i32, f32 and u64
(add, max, min, CAS, exchange), warp shuffles and votes, `__reduce_add_sync`, `__syncwarp`,
`__activemask`, and a "last block done" reduction ordered by `__threadfence` and an atomic."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from cutile_py.ptx.ast import Module
from cutile_py.ptx.parser import parse
from cutile_py.sim.executor import Options, Stats, run
from cutile_py.sim.program import Program
from tests.support.sim_harness import Sim

PTX = Path(__file__).parent / "nvcc_oracle" / "kernels.ptx"


@cache
def module() -> Module:
    return parse(PTX.read_text())


def launch(
    sim: Sim,
    entry: str,
    grid: int,
    block: int,
    params: list[tuple[str, int | float]],
    schedule: int | None = None,
) -> Stats:
    program = Program(module(), entry, sim.memory)
    opts = Options(schedule=schedule)
    return run(program, sim.memory, (grid, 1, 1), (block, 1, 1), 0, params, opts)


def test_the_ptx_is_nvccs() -> None:
    assert PTX.read_text().startswith("// nvcc: Cuda compilation tools, release")


@pytest.mark.parametrize("schedule", [None, 1, 2])
def test_i32_atomics(rng: np.random.Generator, schedule: int | None) -> None:
    sim = Sim()
    n = 1000
    x = rng.integers(-(10**6), 10**6, n, dtype=np.int32)
    xa, _ = sim.buffer(x)
    sa, total = sim.buffer(np.zeros(1, np.int32))
    ma, mx = sim.buffer(np.full(1, np.iinfo(np.int32).min, np.int32))
    na, mn = sim.buffer(np.full(1, np.iinfo(np.int32).max, np.int32))
    ha, hits = sim.buffer(np.zeros(1, np.uint32))
    ea, exch = sim.buffer(np.full(1, -1, np.int32))
    launch(sim, "atomics_i32", 8, 128,
           [("u64", xa), ("s32", n), ("u64", sa), ("u64", ma), ("u64", na), ("u64", ha),
            ("u64", ea)], schedule)  # fmt: skip
    assert total[0] == x.astype(np.int64).sum()  # |sum| < 2**31: no wrap
    assert mx[0] == x.max()
    assert mn[0] == x.min()
    assert hits[0] == 1  # exactly one CAS from -1 succeeds
    assert 0 <= exch[0] < n


def test_f32_atomics(rng: np.random.Generator) -> None:
    sim = Sim()
    n = 777
    # Integers in f32: every order of additions gives the exact sum.
    x = rng.integers(-1000, 1000, n).astype(np.float32)
    bins = rng.integers(0, 5, n).astype(np.int32)
    xa, _ = sim.buffer(x)
    sa, total = sim.buffer(np.zeros(1, np.float32))
    ba, _ = sim.buffer(bins)
    ha, hist = sim.buffer(np.zeros(5, np.float32))
    launch(sim, "atomics_f32", 7, 128,
           [("u64", xa), ("s32", n), ("u64", sa), ("u64", ba), ("u64", ha)])  # fmt: skip
    assert total[0] == x.sum(dtype=np.float64)
    np.testing.assert_array_equal(hist, np.bincount(bins, weights=x, minlength=5))


def test_u64_atomics(rng: np.random.Generator) -> None:
    sim = Sim()
    n = 300
    x = rng.integers(0, 2**62, n, dtype=np.uint64)
    xa, _ = sim.buffer(x)
    sa, total = sim.buffer(np.array([2**63], np.uint64))
    la, last = sim.buffer(np.array([2**64 - 1], np.uint64))
    seen_a, seen = sim.buffer(np.zeros(n, np.uint64))
    launch(sim, "atomics_u64", 3, 128,
           [("u64", xa), ("s32", n), ("u64", sa), ("u64", la), ("u64", seen_a)])  # fmt: skip
    assert int(total[0]) == (2**63 + sum(int(v) for v in x)) % 2**64
    # The exchanges form one chain: the initial value and every index but the last one
    # handed out are each seen exactly once.
    got = sorted(int(v) for v in seen)
    assert got == sorted([2**64 - 1, *(i for i in range(n) if i != int(last[0]))])


def _by_warp(v: np.ndarray) -> np.ndarray:
    return v.reshape(-1, 32)


def test_shuffles(rng: np.random.Generator) -> None:
    sim = Sim()
    threads = 256
    x = rng.integers(-(2**31), 2**31, threads, dtype=np.int64).astype(np.int32)
    xa, _ = sim.buffer(x)
    outs = [sim.buffer(np.zeros(threads, np.int32)) for _ in range(5)]
    launch(sim, "shuffles", 2, 128, [("u64", xa), *[("u64", a) for a, _ in outs]])
    up, down, bfly, idx, width8 = (o for _, o in outs)
    w = _by_warp(x)
    lane = np.arange(32)
    src_up = np.where(lane >= 3, lane - 3, lane)
    src_down = np.where(lane + 5 < 32, lane + 5, lane)
    seg = lane // 8 * 8
    src_w8 = np.where(lane - seg + 2 < 8, lane + 2, lane)
    np.testing.assert_array_equal(_by_warp(up), w[:, src_up])
    np.testing.assert_array_equal(_by_warp(down), w[:, src_down])
    np.testing.assert_array_equal(_by_warp(bfly), w[:, lane ^ 6])
    np.testing.assert_array_equal(_by_warp(idx), w[:, (lane * 7) & 31])
    np.testing.assert_array_equal(_by_warp(width8), w[:, src_w8])


def test_votes_and_warp_reductions(rng: np.random.Generator) -> None:
    sim = Sim()
    threads = 192
    x = rng.integers(-100, 100, threads).astype(np.int32)
    x[64:96] = np.abs(x[64:96]) - 40  # a warp where every value is > -50
    xa, _ = sim.buffer(x)
    outs = [sim.buffer(np.full(threads, 7, np.uint32)) for _ in range(5)]
    launch(sim, "votes", 3, 64, [("u64", xa), *[("u64", a) for a, _ in outs]])
    ballot, all_, any_, reduced, active = (o for _, o in outs)
    w = _by_warp(x)
    weights = (1 << np.arange(32, dtype=np.uint64)).astype(np.uint64)
    want_ballot = ((w > 0).astype(np.uint64) * weights).sum(axis=1).astype(np.uint32)
    np.testing.assert_array_equal(_by_warp(ballot), np.repeat(want_ballot[:, None], 32, 1))
    np.testing.assert_array_equal(_by_warp(all_), np.repeat((w > -50).all(1)[:, None], 32, 1))
    np.testing.assert_array_equal(_by_warp(any_), np.repeat((w > 90).any(1)[:, None], 32, 1))
    sums = (w.astype(np.int64).sum(axis=1) % 2**32).astype(np.uint32)
    np.testing.assert_array_equal(_by_warp(reduced), np.repeat(sums[:, None], 32, 1))
    odd = (w & 1).astype(bool)
    mask = ((odd.astype(np.uint64) * weights).sum(axis=1)).astype(np.uint32)
    np.testing.assert_array_equal(_by_warp(active), np.where(odd, mask[:, None], 0))


@pytest.mark.parametrize("schedule", [None, 3, 4])
def test_last_block_done_reduction(rng: np.random.Generator, schedule: int | None) -> None:
    sim = Sim()
    n, block = 2000, 256
    grid = -(-n // block)
    x = rng.integers(-50, 50, n).astype(np.float32)  # integer sums: exact in any order
    xa, _ = sim.buffer(x)
    pa, partial = sim.buffer(np.full(grid, np.nan, np.float32))
    ca, count = sim.buffer(np.zeros(1, np.uint32))
    ta, total = sim.buffer(np.full(1, np.nan, np.float32))
    launch(sim, "last_block_sum", grid, block,
           [("u64", xa), ("s32", n), ("u64", pa), ("u64", ca), ("u64", ta)], schedule)  # fmt: skip
    padded = np.zeros(grid * block, np.float32)
    padded[:n] = x
    np.testing.assert_array_equal(partial, padded.reshape(grid, block).sum(axis=1))
    assert count[0] == grid
    assert total[0] == x.sum(dtype=np.float64)
