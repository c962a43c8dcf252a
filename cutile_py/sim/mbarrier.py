"""`mbarrier.*` (PTX ISA §9.7.13.15): barrier objects in shared memory, with phases,
arrival counts and transaction counts.

A barrier's 8 bytes hold the simulator's own encoding of its state (the hardware's is
opaque): pending arrivals, the expected count, the transaction count and the phase parity.
A phase completes when no arrival and no transaction byte is pending; the barrier then
flips its parity and expects the same count again.

Asynchronous copies that signal a barrier (`cp.async.bulk ... mbarrier::complete_tx`) are
kept pending, and land (write shared memory, then complete their bytes on the barrier) when
a thread of the block tests or waits on that barrier: a kernel that reads the destination
without waiting sees stale bytes, as it may on hardware.

Operations on barrier objects are atomic: they are not shared-memory accesses to the race
detector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from cutile_py.ptx.ast import Addr, Instruction, Operand, Sink
from cutile_py.sim.context import SimError
from cutile_py.sim.memops import _address, unsupported
from cutile_py.sim.memory import SHARED_WINDOW, WINDOW_SPAN, MemoryFault
from cutile_py.sim.spaces import space_of

if TYPE_CHECKING:
    from cutile_py.sim.program import Handler, Program
    from cutile_py.sim.spaces import Batch

COUNT_BITS = 20
COUNT_MAX = (1 << COUNT_BITS) - 1
_COUNT = np.uint64(COUNT_MAX)
_TX_BITS = 22
_TX_MASK = np.uint64((1 << _TX_BITS) - 1)
_EXPECTED_SHIFT = np.uint64(COUNT_BITS)
_TX_SHIFT = np.uint64(2 * COUNT_BITS)
_LIVE = np.uint64(1 << 62)  # initialized and not invalidated
_PARITY = np.uint64(1 << 63)
#: An arrive's state token: the phase parity it arrived in, and a mark that it is one.
_TOKEN = np.uint64(0x7E57 << 32)


@dataclass
class Delivery:
    """A pending asynchronous copy: `land()` writes its bytes; then it completes `nbytes`
    transaction bytes on the barrier at byte `barrier` of the batch's shared memory."""

    barrier: int
    nbytes: int
    land: Callable[[], None]


@dataclass
class Barriers:
    """The batch's pending deliveries, in issue order; and per barrier (by its byte in the
    batch's shared memory) the threads that arrived in its current phase and in the phase
    that completed last (for the race check: their accesses happen before a wait's)."""

    pending: list[Delivery] = field(default_factory=list)
    arriving: dict[int, list[int]] = field(default_factory=dict)
    arrived: dict[int, np.ndarray] = field(default_factory=dict)


def barriers_of(b: Batch) -> Barriers:
    got = b.barriers
    if got is None:
        got = b.barriers = Barriers()
    return got


def _fields(state: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(pending, expected, tx as int64, parity) of encoded states."""
    pending = state & _COUNT
    expected = (state >> _EXPECTED_SHIFT) & _COUNT
    tx = ((state >> _TX_SHIFT) & _TX_MASK).astype(np.int64)
    tx = np.where(tx >= 1 << (_TX_BITS - 1), tx - (1 << _TX_BITS), tx)
    return pending, expected, tx, (state >> np.uint64(63)) & np.uint64(1)


def _encode(
    pending: np.ndarray, expected: np.ndarray, tx: np.ndarray, parity: np.ndarray
) -> np.ndarray:
    txu = (tx.astype(np.int64) % (1 << _TX_BITS)).astype(np.uint64)
    out: np.ndarray = (
        pending.astype(np.uint64)
        | (expected.astype(np.uint64) << _EXPECTED_SHIFT)
        | (txu << _TX_SHIFT)
        | _LIVE
        | (parity.astype(np.uint64) << np.uint64(63))
    )
    return out


def shared_offsets(b: Batch, ins: Instruction, op: Addr, lanes: np.ndarray) -> np.ndarray:
    """Shared-space offsets of `op` for `lanes`, whether the instruction names `.shared` or
    addresses generically (then each address must lie in the shared window)."""
    space = space_of(ins.modifiers)
    if space == "shared":
        return b.addresses(op, lanes, False)
    if space:
        raise unsupported(ins, f"a barrier lives in shared memory, not .{space}")
    a = b.addresses(op, lanes, True)
    inside = (a >= np.uint64(SHARED_WINDOW)) & (a < np.uint64(SHARED_WINDOW + WINDOW_SPAN))
    if not inside.all():
        k = int(np.argmax(~inside))
        raise MemoryFault(int(lanes[k]), f"mbarrier at generic address {int(a[k]):#x}, "
                          "which is not shared memory")  # fmt: skip
    out: np.ndarray = a - np.uint64(SHARED_WINDOW)
    return out


def _flat(b: Batch, ins: Instruction, op: Addr, lanes: np.ndarray) -> np.ndarray:
    offs = shared_offsets(b, ins, op, lanes)
    if (offs % np.uint64(8)).any():
        k = int(np.argmax(offs % np.uint64(8) != 0))
        raise MemoryFault(int(lanes[k]), f"mbarrier at shared address {int(offs[k]):#x} is "
                          "not 8-byte aligned")  # fmt: skip
    flat: np.ndarray = b.shared.flat(lanes, b.slot[lanes], offs, 8, "mbarrier")
    return flat


def _states(b: Batch, flat: np.ndarray, lanes: np.ndarray, what: str) -> np.ndarray:
    view = b.shared.view(8)
    state: np.ndarray = view[(flat // np.uint64(8)).astype(np.intp)]
    dead = (state & _LIVE) == 0
    if dead.any():
        k = int(np.argmax(dead))
        raise MemoryFault(int(lanes[k]), f"{what} on a barrier that was not initialized "
                          f"(shared address {int(flat[k]) % b.shared.stride:#x})")  # fmt: skip
    return state


def _apply(b: Batch, flat: np.ndarray, lanes: np.ndarray, arrivals: np.ndarray,
           tx: np.ndarray, what: str) -> None:  # fmt: skip
    """Add `tx[i]` transaction bytes (negative: complete them) and then `arrivals[i]`
    arrivals to the barrier at `flat[i]`, in lane order, completing phases as they end."""
    view = b.shared.view(8)
    idx = (flat // np.uint64(8)).astype(np.intp)
    order = np.argsort(idx, kind="stable")
    for i in order:  # few lanes per instruction: one or one per warp
        j = idx[i]
        state = view[j : j + 1]
        if not (state & _LIVE).any():
            raise MemoryFault(int(lanes[i]), f"{what} on a barrier that was not initialized")
        pending, expected, count, parity = _fields(state)
        count = count + int(tx[i])
        pending = pending.astype(np.int64) - int(arrivals[i])
        if (pending < 0).any():
            raise MemoryFault(int(lanes[i]), f"{what}: more arrivals than the barrier's "
                              f"expected count ({int(expected[0])}) in one phase")  # fmt: skip
        if abs(int(count[0])) >= 1 << (_TX_BITS - 2):
            raise MemoryFault(int(lanes[i]), f"{what}: the transaction count leaves its range")
        if arrivals[i] and b.shared.tracker is not None:
            barriers_of(b).arriving.setdefault(int(flat[i]), []).append(int(lanes[i]))
        if pending[0] == 0 and count[0] == 0:  # the phase completes
            pending, parity = expected.astype(np.int64), parity ^ np.uint64(1)
            got = b.barriers
            if got is not None and b.shared.tracker is not None:
                who = got.arriving.pop(int(flat[i]), [])
                got.arrived[int(flat[i])] = np.array(who, dtype=np.int64)
        view[j] = _encode(pending, expected, count, parity)[0]


def land(b: Batch, flat: np.ndarray) -> None:
    """Land every pending delivery to the barriers at `flat` (and complete its bytes)."""
    got = b.barriers
    if got is None or not got.pending:
        return
    want = set(int(x) for x in np.unique(flat))
    keep: list[Delivery] = []
    for d in got.pending:
        if d.barrier in want:
            d.land()
            b.writes += 1
            one = np.array([d.barrier], dtype=np.uint64)
            lane = np.zeros(1, dtype=np.int64)
            _apply(b, one, lane, np.zeros(1, np.int64), np.array([-d.nbytes]), "complete_tx")
        else:
            keep.append(d)
    got.pending = keep


def _ordered(b: Batch, flat: np.ndarray) -> None:
    """Waits on the barriers at `flat` succeeded: what the threads that arrived in their last
    completed phases did before arriving is ordered before what the waiters do next. (The race
    check forgets those threads' accesses for every thread, not only the waiters: a race
    between them and a thread that did not wait goes unreported.)"""
    got = b.barriers
    tracker = b.shared.tracker
    if got is None or tracker is None:
        return
    for bar in np.unique(flat).tolist():
        who = got.arrived.pop(int(bar), None)
        if who is not None and who.size:
            tracker.release(int(bar) // b.shared.stride, b.tid[who])


def _count(op: Operand | None, b: Batch, lanes: np.ndarray, default: int) -> np.ndarray:
    if op is None:
        return np.full(lanes.size, default, dtype=np.int64)
    out: np.ndarray = b.read(op, "u32")[lanes].astype(np.int64)
    return out


def make_mbarrier(ins: Instruction, prog: Program) -> Handler:
    """`mbarrier.{init, arrive, arrive.expect_tx, expect_tx, complete_tx, test_wait,
    try_wait, inval}` on `.shared{::cta}` or generic addresses."""
    mods = ins.modifiers
    if "b64" not in mods:
        raise unsupported(ins, "mbarrier operations take .b64 barrier objects")
    if "shared::cluster" in mods or "cluster" in mods or "remote" in mods:
        raise unsupported(ins, "cluster-scope barriers are not supported")
    ops = ins.operands
    if "init" in mods:
        addr, count_op = _address(ins, 0), ops[1]

        def init(b: Batch) -> None:
            lanes = b.active()
            flat = _flat(b, ins, addr, lanes)
            n = _count(count_op, b, lanes, 1)
            if ((n < 1) | (n > COUNT_MAX)).any():
                k = int(np.argmax((n < 1) | (n > COUNT_MAX)))
                raise MemoryFault(int(lanes[k]), f"mbarrier.init count {int(n[k])} is not in "
                                  f"1..{COUNT_MAX}")  # fmt: skip
            zero = np.zeros(lanes.size, dtype=np.int64)
            b.shared.view(8)[(flat // np.uint64(8)).astype(np.intp)] = _encode(
                n, n, zero, zero.astype(np.uint64)
            )
            b.writes += 1

        return init
    if "inval" in mods:
        addr = _address(ins, 0)

        def inval(b: Batch) -> None:
            lanes = b.active()
            flat = _flat(b, ins, addr, lanes)
            b.shared.view(8)[(flat // np.uint64(8)).astype(np.intp)] = 0
            b.writes += 1

        return inval
    if "arrive" in mods or "expect_tx" in mods or "complete_tx" in mods:
        return _make_arrive(ins)
    if "test_wait" in mods or "try_wait" in mods:
        return _make_wait(ins)
    raise unsupported(ins, "this mbarrier operation is not supported")


def _make_arrive(ins: Instruction) -> Handler:
    mods, ops = ins.modifiers, ins.operands
    arrive = "arrive" in mods
    if "noComplete" in mods:
        raise unsupported(ins, "mbarrier.arrive.noComplete is not supported")
    if arrive:
        dest, addr = ops[0], _address(ins, 1)
        extra = ops[2] if len(ops) > 2 else None
    else:  # expect_tx / complete_tx [addr], txCount
        dest, addr, extra = None, _address(ins, 0), ops[1]
    tx_sign = -1 if "complete_tx" in mods else 1
    has_tx = "expect_tx" in mods or "complete_tx" in mods
    if has_tx and extra is None:
        raise unsupported(ins, "expect_tx and complete_tx need a transaction count")

    def run(b: Batch) -> None:
        lanes = b.active()
        flat = _flat(b, ins, addr, lanes)
        before = _states(b, flat, lanes, ins.opcode + "." + ".".join(mods))
        if has_tx:
            tx = tx_sign * _count(extra, b, lanes, 0)
            n = np.ones(lanes.size, np.int64) if arrive else np.zeros(lanes.size, np.int64)
        else:
            tx = np.zeros(lanes.size, dtype=np.int64)
            n = _count(extra, b, lanes, 1)
        _apply(b, flat, lanes, n, tx, "mbarrier." + ".".join(mods))
        b.writes += 1
        if dest is not None and not isinstance(dest, Sink):
            token = np.zeros(b.n, dtype=np.uint64)
            token[lanes] = _TOKEN | (before >> np.uint64(63))
            b.write(dest, "b64", token)

    return run


def _make_wait(ins: Instruction) -> Handler:
    ops = ins.operands
    parity_form = "parity" in ins.modifiers
    dest, addr, phase = ops[0], _address(ins, 1), ops[2]
    # a further operand is a suspend-time hint

    def run(b: Batch) -> None:
        lanes = b.active()
        flat = _flat(b, ins, addr, lanes)
        land(b, flat)
        state = _states(b, flat, lanes, "mbarrier wait")
        parity = (state >> np.uint64(63)).astype(np.int64)
        if parity_form:
            want = b.read(phase, "u32")[lanes].astype(np.int64) & 1
        else:
            token = b.read(phase, "u64")[lanes]
            if ((token & ~np.uint64(1)) != _TOKEN).any():
                k = int(np.argmax((token & ~np.uint64(1)) != _TOKEN))
                raise SimError(b.where(int(lanes[k])) + ": mbarrier wait on a state that no "
                               "mbarrier.arrive returned")  # fmt: skip
            want = (token & np.uint64(1)).astype(np.int64)
        done = np.zeros(b.n, dtype=bool)
        passed = parity != want  # the phase of that parity has completed
        done[lanes] = passed
        if passed.any() and b.shared.tracker is not None:
            _ordered(b, flat[passed])
        b.write(dest, "pred", done)
        failed = not passed.any()
        b.wait_failed = failed
        if failed:
            b.failed_wait = (int(lanes[0]), int(flat[0]) % b.shared.stride, int(want[0]))

    return run
