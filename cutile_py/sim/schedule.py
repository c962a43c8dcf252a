"""Schedules chosen by a seed: the order in which the simulator runs a launch's blocks and
applies its warps' memory accesses.

The simulator advances the lanes of a batch of blocks in lock-step. A schedule varies what
lock-step leaves open: the order of the blocks (which blocks share a batch, in which order
batches run, and each block's place in its batch), and, at every store and atomic, the order in
which the batch's warps apply their accesses (a warp's lanes in lane order). So the store that
lands last at an address, and the order atomics serialize in, follow the seed. A warp never
runs ahead of another by whole instructions, except where threads wait (an mbarrier wait that
fails, a loop that spins, a named barrier): then the executor runs other groups of threads,
and the seed picks which (`Schedule.pick`).

`CUTILE_PY_SIM_SCHEDULE=<seed>` runs every launch under that seed's schedule (one seed, one
order, one result). `CUTILE_PY_SIM_SCHEDULES=<n>` runs every launch under n schedules (the
default order, then seeds 1 .. n-1; with CUTILE_PY_SIM_SCHEDULE=s, seeds s .. s+n-1), each
from the same memory, and raises `SimError` if any output byte differs, naming the allocation,
the byte and the two schedules; the memory is left as the first schedule left it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from cutile_py.sim.context import WARP, SimError
from cutile_py.sim.memory import GlobalMemory

T = TypeVar("T")


class Schedule:
    """The orders of one seed (None: the default order, blocks and warps ascending)."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self._rng = np.random.default_rng(seed) if seed is not None else None

    @property
    def name(self) -> str:
        return "the default order" if self.seed is None else f"CUTILE_PY_SIM_SCHEDULE={self.seed}"

    def block_order(self, total: int) -> np.ndarray | None:
        """The launch's linear block indices in the order they run (None: ascending)."""
        return None if self._rng is None else self._rng.permutation(total)

    def warp_order(self, lanes: np.ndarray) -> np.ndarray | None:
        """Positions of `lanes` (batch lanes, ascending) reordered warp by warp (None: as
        they are)."""
        if self._rng is None or lanes.size <= 1:
            return None
        warps = lanes // WARP
        uniq, which = np.unique(warps, return_inverse=True)
        if uniq.size == 1:
            return None
        rank = self._rng.permutation(uniq.size)
        out: np.ndarray = np.argsort(rank[which], kind="stable")
        return out

    def pick(self, n: int) -> int:
        """Which of `n` groups of threads that may run runs next (the first by default)."""
        return 0 if self._rng is None else int(self._rng.integers(n))


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise SimError(f"{name}={text!r} is not an integer") from None


def seeds(schedule: int | None, schedules: int) -> list[int | None]:
    """The schedules a launch runs under: the environment's, else the given ones."""
    seed = _env_int("CUTILE_PY_SIM_SCHEDULE")
    count = _env_int("CUTILE_PY_SIM_SCHEDULES")
    if seed is None:
        seed = schedule
    n = schedules if count is None else count
    if n < 1:
        raise SimError(f"CUTILE_PY_SIM_SCHEDULES={n}: at least one schedule must run")
    if n == 1:
        return [seed]
    first = 1 if seed is None else seed
    out: list[int | None] = [None] if seed is None else []
    out += list(range(first, first + n - len(out)))
    return out


def explore(
    launch: Callable[[Schedule], T], memory: GlobalMemory, kernel: str, order: list[int | None]
) -> T:
    """Run `launch` under each schedule of `order` from the same memory; SimError naming the
    first byte whose result differs. Returns the first run's result, its memory in place."""
    allocs = [a for a in memory.allocations() if not a.readonly]
    before = [a.data.copy() for a in allocs]
    first = Schedule(order[0])
    result = launch(first)
    after = [a.data.copy() for a in allocs]
    for seed in order[1:]:
        for a, b in zip(allocs, before):
            a.data[:] = b
        other = Schedule(seed)
        launch(other)
        for a, want in zip(allocs, after):
            diff = a.data != want
            if diff.any():
                k = int(np.argmax(diff))
                got = int(a.data[k])
                for x, w in zip(allocs, after):
                    x.data[:] = w
                raise SimError(
                    f"kernel {kernel}: the result depends on the schedule: byte {k} of the "
                    f"{a.data.size}-byte {a.name} at {a.start:#x} is {int(want[k]):#04x} under "
                    f"{first.name} and {got:#04x} under {other.name} "
                    f"({int(np.count_nonzero(diff))} bytes of it differ): the order of blocks or "
                    "warps decides it (atomics, or a race the checks do not see)"
                )
    for a, w in zip(allocs, after):
        a.data[:] = w
    return result
