"""`bar.sync` / `barrier.sync` / `bar.arrive` / `bar.red` (PTX ISA §9.7.13.1): the 16 named
barriers of each block, with thread counts.

A barrier completes for a block when as many threads have arrived as it expects: its thread
count operand, or every thread of the block where there is none or it is the block's size
(threads that exited count as arrived). Threads that `sync` wait until then (the executor
parks their path and runs others); threads that `arrive` go on. The common case, every live
thread of each block arriving in one step, completes at once, as the lock-step executor
always did.

`.aligned` forms (`bar.sync` and `bar.arrive` are aligned) require the threads of a warp to
execute the same barrier instruction: a warp whose threads arrive from two instructions is
reported as a barrier in divergent code. Warps may arrive from different instructions (a
producer's `bar.arrive` and the consumers' `bar.sync`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from cutile_py.ptx.ast import Imm, Instruction
from cutile_py.sim.context import WARP

if TYPE_CHECKING:
    from cutile_py.sim.spaces import Batch

#: Named barriers per block.
COUNT = 16


@dataclass
class _Generation:
    """The arrivals at one barrier id not yet completed, per block of the batch."""

    arrived: np.ndarray  # threads arrived, per block
    expected: np.ndarray  # threads expected per block (0: every live thread)
    pc: np.ndarray  # the first arrival's step index per block (-1: none)
    ins: dict[int, Instruction] = field(default_factory=dict)  # step index -> instruction
    lanes: np.ndarray | None = None  # lanes arrived (for messages)
    lane_pc: np.ndarray | None = None  # the step each lane arrived from (-1: not arrived)
    #: Lanes live at their block's first arrival: a block-wide barrier waits for them all.
    present: np.ndarray | None = None


class NamedBarriers:
    """The pending barrier generations of one batch, and the lanes waiting on them."""

    def __init__(self, b: Batch) -> None:
        self.gens: dict[int, _Generation] = {}
        #: Lanes parked in a `sync`, released when their block's barrier completes.
        self.waiting = np.zeros(b.n, dtype=bool)
        #: Completions and arrivals so far: the executor's measure of progress.
        self.events = 0

    def _gen(self, b: Batch, ident: int) -> _Generation:
        g = self.gens.get(ident)
        if g is None:
            nb = b.nblocks
            g = self.gens[ident] = _Generation(
                np.zeros(nb, np.int64), np.zeros(nb, np.int64), np.full(nb, -1, np.int64),
                lanes=np.zeros(b.n, dtype=bool), lane_pc=np.full(b.n, -1, np.int64),
                present=np.zeros(b.n, dtype=bool),
            )  # fmt: skip
        return g

    def pending(self) -> bool:
        return bool(self.gens)

    def arrive(self, b: Batch, ins: Instruction, pc: int, m: np.ndarray, ident: int,
               expected: int, wait: bool) -> bool:  # fmt: skip
        """Lanes `m` arrive at barrier `ident` of their blocks (expecting `expected` threads,
        0: every live one); True if some of them must wait."""
        per = b.per_block
        g = self._gen(b, ident)
        counts = m.reshape(-1, per).sum(axis=1)
        blocks = np.flatnonzero(counts)
        assert g.lanes is not None and g.lane_pc is not None
        if "aligned" in ins.modifiers or ins.opcode == "bar":
            warps = np.zeros(b.n // WARP, dtype=bool)
            warps[np.flatnonzero(m) // WARP] = True
            mine = np.repeat(warps, WARP)
            clash = mine & g.lanes & (g.lane_pc != pc)
            if clash.any():
                k = int(np.argmax(clash))
                raise _divergent(b, g, k // per, int(g.lane_pc[k]))
        g.lane_pc[m] = pc
        fresh = g.arrived[blocks] == 0
        if fresh.any():
            assert g.present is not None
            rows = np.zeros(b.nblocks, dtype=bool)
            rows[blocks[fresh]] = True
            rows = np.repeat(rows, per)
            g.present[rows] = b.live[rows]
        g.pc[blocks] = np.where(g.pc[blocks] < 0, pc, g.pc[blocks])
        g.ins.setdefault(pc, ins)
        g.arrived[blocks] += counts[blocks]
        g.expected[blocks] = expected
        assert g.lanes is not None
        g.lanes |= m
        self.events += 1
        if wait:
            self.waiting |= m
        self.complete(b)
        return wait and bool((self.waiting & m).any())

    def complete(self, b: Batch) -> None:
        """Complete every generation whose blocks have all their threads; release them."""
        per = b.per_block
        for ident in list(self.gens):
            g = self.gens[ident]
            assert g.lanes is not None and g.present is not None
            # Threads that exited before the first arrival count as arrived; those that
            # exit later without arriving leave it incomplete (see `abandoned`).
            every = g.present.reshape(-1, per).sum(axis=1)
            need = np.where(g.expected > 0, g.expected, every)
            done = (g.arrived > 0) & (g.arrived >= need)
            if not done.any():
                continue
            slots = np.flatnonzero(done)
            over = g.arrived[slots] > need[slots]
            if over.any():
                s = int(slots[int(np.argmax(over))])
                lane = s * per + int(np.argmax(g.lanes[s * per : (s + 1) * per]))
                raise b.error(
                    f"barrier {ident}: {int(g.arrived[s])} threads arrived where it expects "
                    f"{int(need[s])}",
                    lane,
                    g.ins[int(g.pc[s])],
                )
            rows = np.repeat(done, per)
            self.waiting &= ~rows
            assert g.lanes is not None
            g.lanes &= ~rows
            assert g.lane_pc is not None
            g.lane_pc[rows] = -1
            assert g.present is not None
            g.present[rows] = False
            g.arrived[slots] = 0
            g.expected[slots] = 0
            g.pc[slots] = -1
            if not g.arrived.any():
                del self.gens[ident]
            self.events += 1
            ordered(b, slots)

    def abandoned(self, b: Batch) -> Exception | None:
        """The error for a block-wide barrier that threads live at its first arrival left
        by exiting without reaching it (a barrier in divergent code), if there is one."""
        per = b.per_block
        for g in self.gens.values():
            assert g.lanes is not None and g.present is not None
            left = g.present & ~b.live & ~g.lanes
            left &= np.repeat(g.expected == 0, per)
            if left.any():
                s = int(np.argmax(left)) // per
                return _divergent(b, g, s, int(g.pc[s]), "exited without reaching it")
        return None

    def describe(self, b: Batch) -> tuple[str, int, Instruction] | None:
        """The first incomplete generation: a message, a lane that arrived and its line."""
        per = b.per_block
        for ident, g in sorted(self.gens.items()):
            s = int(np.argmax(g.arrived > 0))
            assert g.lanes is not None
            rows = slice(s * per, (s + 1) * per)
            here = s * per + int(np.argmax(g.lanes[rows]))
            live = int(b.live[rows].sum())
            need = int(g.expected[s]) or live
            missing = b.live[rows] & ~g.lanes[rows]
            who = (
                f"; thread {b.thread_of(s * per + int(np.argmax(missing)))} did not arrive"
                if missing.any()
                else ""
            )
            msg = (
                f"barrier {ident} reached by only {int(g.arrived[s])} of the {need} threads "
                f"it waits for in the block ({live} live){who}"
            )
            return msg, here, g.ins[int(g.pc[s])]
        return None


def _divergent(b: Batch, g: _Generation, s: int, first: int, why: str = "") -> Exception:
    per = b.per_block
    rows = slice(s * per, (s + 1) * per)
    assert g.lanes is not None and g.present is not None
    here = s * per + int(np.argmax(g.lanes[rows]))
    live = int((b.live[rows] | g.present[rows]).sum())
    missing = s * per + int(np.argmax((b.live[rows] | g.present[rows]) & ~g.lanes[rows]))
    ins = g.ins[first]
    why = why or (f"reached line {b.instr.line} instead, and .aligned barriers need one "
                  "instruction per warp")  # fmt: skip
    return b.error(
        f"{ins.opcode} reached by only {int(g.arrived[s])} of the {live} live threads of the "
        f"block; thread {b.thread_of(missing)} did not arrive (a barrier in divergent code: "
        f"it {why})",
        here,
        ins,
    )


def ordered(b: Batch, slots: np.ndarray) -> None:
    """A barrier completed in blocks `slots`: what their threads did before is ordered."""
    if b.shared.tracker is not None:
        b.shared.tracker.barrier(slots)
    if b.global_races is not None:
        b.global_races.barrier(slots)


def named_of(b: Batch) -> NamedBarriers:
    got = b.named_barriers
    if got is None:
        got = b.named_barriers = NamedBarriers(b)
    return got


def barrier_operands(
    b: Batch, ins: Instruction, m: np.ndarray
) -> list[tuple[int, int, np.ndarray]]:
    """(barrier id, threads expected (0: the whole block), lanes) for each barrier the lanes
    `m` of a barrier instruction name (warps may name different ids in one step)."""
    red = "red" in ins.modifiers
    ops = ins.operands[1:] if red else ins.operands
    if not ops or isinstance(ops[0], Imm):
        groups = [(int(ops[0].value) if ops else 0, m)]  # type: ignore[union-attr]
    else:
        ids = b.read(ops[0], "u32")
        groups = [(int(v), m & (ids == v)) for v in np.unique(ids[m])]
    out = []
    for ident, lanes in groups:
        if not 0 <= ident < COUNT:
            b.fail(f"barrier id {ident} is not in 0..{COUNT - 1}", lanes)
        expected = 0
        if len(ops) > (2 if red else 1):
            n = _uniform(b, ins, ops[1], lanes, "thread count")
            if n != b.per_block and n != b.threads:
                if n <= 0 or n % WARP or n > b.per_block:
                    b.fail(f"barrier thread count {n}: give a multiple of {WARP} up to the "
                           f"block's {b.threads} threads", lanes)  # fmt: skip
                expected = n
        out.append((ident, expected, lanes))
    return out


def _uniform(b: Batch, ins: Instruction, op: object, m: np.ndarray, what: str) -> int:
    if isinstance(op, Imm):
        return int(op.value)
    vals = b.read(op, "u32")[m]  # type: ignore[arg-type]
    if vals.size and (vals != vals[0]).any():
        b.fail(f"the {what} of {ins.opcode} differs between threads that name one barrier", m)
    return int(vals[0]) if vals.size else 0
