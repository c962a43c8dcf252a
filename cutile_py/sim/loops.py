"""Endless-loop detection: a batch whose whole state at a backward branch comes back, with no
memory written and no clock read in between, can never leave its loop.

A batch's future is a function of its registers on live lanes, its reconvergence stack, its
live lanes, its memories and its clock. Batches run one after another, so within a batch
memory changes only through the batch's own stores, atomics and `cp.async` (which count as
writes here). The executor calls `LoopWatch.check` at every `CHECK_EVERY`-th uniformly taken
backward branch; each back-edge keeps one snapshot, moved forward at its 1st, 2nd, 4th, 8th...
check (Brent's cycle finding, so loops whose state cycles with a period above 1 are found
too) and retaken after any write or clock read. A snapshot holds references, not copies:
register arrays are never changed in place, so taking one costs a list copy. Lanes whose
state repeats are stopped (the executor runs its other paths, which may set what they wait
for); only where nothing else can run is the loop reported (`LoopWatch.report`).

A loop that writes memory in every iteration is never reported here, even when it writes the
same bytes: the step limit (`executor.step_limit`) is left to end it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cutile_py.sim.context import WARP, SimError
from cutile_py.sim.memory import UINT
from cutile_py.sim.program import Step
from cutile_py.sim.spaces import Batch

#: Uniformly taken backward branches between two checks (a power of two, so a loop whose
#: state alternates between two values is compared at an even distance).
CHECK_EVERY = 32

Stack = list[list[object]]


@dataclass
class _Snapshot:
    regs: list[np.ndarray | None]  # the register file by slot
    live: np.ndarray
    mask: np.ndarray
    # (pc, rpc, mask) of every stack entry; the top entry's pc is where it resumes, not
    # where it runs now (the running pc is the back-edge's target itself).
    stack: list[tuple[object, object, object]]
    writes: int
    clock_reads: int
    step: int  # the batch's instruction steps when taken
    checks: int  # checks of this back-edge since the snapshot chain began


class LoopWatch:
    """The back-edge snapshots of one batch."""

    def __init__(self, b: Batch, steps: list[Step]) -> None:
        self.b = b
        self.steps = steps
        self._snaps: dict[int, _Snapshot] = {}

    def check(self, pc: int, stack: Stack, mask: np.ndarray, step: int) -> int:
        """At backward branch `pc`, taken by every lane in `mask` (the running lanes) after
        `step` instruction steps: the steps since the snapshot whose state the batch repeats
        (`report` makes the error), else 0."""
        b = self.b
        snap = self._snaps.get(pc)
        if snap is None or snap.writes != b.writes or snap.clock_reads != b.clock_reads:
            self._snaps[pc] = self._take(stack, mask, step, 1)
            return 0
        snap.checks += 1
        if self._same(snap, stack, mask):
            del self._snaps[pc]  # the lanes stop here: others run before they come back
            return max(step - snap.step, 1)
        if snap.checks & (snap.checks - 1) == 0:
            self._snaps[pc] = self._take(stack, mask, step, snap.checks)
        return 0

    def _take(self, stack: Stack, mask: np.ndarray, step: int, checks: int) -> _Snapshot:
        b = self.b
        entries = [(e[0], e[2], e[1]) for e in stack]
        return _Snapshot(list(b.file), b.live.copy(), mask.copy(), entries, b.writes,
                         b.clock_reads, step, checks)  # fmt: skip

    def _same(self, snap: _Snapshot, stack: Stack, mask: np.ndarray) -> bool:
        b = self.b
        if len(stack) != len(snap.stack) or not np.array_equal(mask, snap.mask):
            return False
        if not np.array_equal(b.live, snap.live):
            return False
        for i, (e, (pc, rpc, m)) in enumerate(zip(stack, snap.stack)):
            if e[2] != rpc:
                return False
            if i < len(stack) - 1 and (e[0] != pc or not _equal_masks(e[1], m)):
                return False
        live = b.live
        every = bool(live.all())
        for then, now in zip(snap.regs, b.file):
            if then is now:
                continue
            if then is None or now is None or not _same_on(then, now, live, every):
                return False  # (None: a register first written since the snapshot)
        return True

    def report(self, pc: int, mask: np.ndarray, apart: int) -> SimError:
        """The error for lanes `mask` that came back to back-edge `pc` in one state."""
        b = self.b
        st = self.steps[pc]
        head = self.steps[st.target].instr.line
        lane = int(np.argmax(mask))
        blk = b.block_of(lane)
        first = lane - lane % WARP  # lanes are laid out warp by warp
        others = int(np.count_nonzero(mask)) - int(np.count_nonzero(mask[first : first + WARP]))
        where = f"warp {int(b.tid[lane]) // WARP} of block ({blk[0]}, {blk[1]}, {blk[2]})"
        with_others = f" (and {others} more threads of its batch of blocks)" if others else ""
        lines = f"line {head}" if head == st.instr.line else f"lines {head}-{st.instr.line}"
        return b.error(
            f"an endless loop (PTX {lines}): {where}{with_others} came back to this backward "
            f"branch in the same state {apart} instruction steps later (the same registers, "
            "predicates, pending branches and running threads) with no memory written and no "
            "clock read in between, and no other thread of its batch of blocks can run, so it can "
            "never exit. A thread waiting here for a flag that another thread sets waits "
            "forever if that thread runs later on the simulator, which runs batches of blocks "
            "one after another",
            lane,
            st.instr,
        )


def _equal_masks(a: object, b: object) -> bool:
    assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
    return a is b or np.array_equal(a, b)


def _same_on(then: np.ndarray, now: np.ndarray, live: np.ndarray, every: bool) -> bool:
    """Whether two values of one register hold the same bits in every live lane."""
    if then.shape != now.shape or then.dtype.itemsize != now.dtype.itemsize:
        return False
    if then.dtype != now.dtype or then.dtype.kind == "f":
        # Bits, not values: a NaN equals itself, -0.0 differs from 0.0.
        unsigned = UINT.get(then.dtype.itemsize)
        if unsigned is None:
            return False
        then, now = then.view(unsigned), now.view(unsigned)
    equal = then == now
    if equal.ndim > 1:
        equal = equal.reshape(equal.shape[0], -1).all(axis=1)
    if every:
        return bool(equal.all())
    return not bool((live & ~equal).any())
