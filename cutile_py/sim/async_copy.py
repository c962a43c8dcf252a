"""`cp.async` (global → shared) with commit and wait groups, modelled as deferred copies.

The source is read when the copy is issued (so a bad source address is reported at its
line); the destination is written only when the issuing thread waits for the copy's group,
so a kernel that reads shared memory without `cp.async.wait_group` sees stale data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from cutile_py.ptx.ast import Imm, Instruction, Operand
from cutile_py.sim.bulk_copy import make_bulk
from cutile_py.sim.memops import _address, is_predicate, unsupported
from cutile_py.sim.memory import UINT, MemoryFault, check_aligned

if TYPE_CHECKING:
    from cutile_py.sim.program import Handler, Program
    from cutile_py.sim.spaces import Batch


@dataclass
class _Copies:
    """Copies of one cp.async execution: lane, shared offset and bytes of each."""

    lanes: np.ndarray
    flat: np.ndarray  # the destination's byte index in the batch's shared memory
    data: np.ndarray  # (k, size) uint8
    group: np.ndarray  # the issuing lane's group number once committed; -1 before
    #: Whether some copy is not committed yet (a commit skips those that are).
    open: bool = True


class AsyncCopies:
    """The pending cp.async copies of a batch, and each lane's count of committed groups."""

    def __init__(self, n: int) -> None:
        self.pending: list[_Copies] = []
        self.committed = np.zeros(n, dtype=np.int64)

    def issue(self, lanes: np.ndarray, flat: np.ndarray, data: np.ndarray) -> None:
        self.pending.append(_Copies(lanes, flat, data, np.full(lanes.size, -1, dtype=np.int64)))

    def commit(self, mask: np.ndarray) -> None:
        for c in self.pending:
            if not c.open:
                continue
            m = mask[c.lanes] & (c.group < 0)
            c.group[m] = self.committed[c.lanes[m]]
            c.open = bool((c.group < 0).any())
        self.committed[mask] += 1

    def wait(self, b: Batch, mask: np.ndarray, keep: int) -> None:
        """Complete every committed group of the lanes in `mask` but their newest `keep`."""
        limit = self.committed - keep
        still: list[_Copies] = []
        for c in self.pending:
            done = mask[c.lanes] & (c.group >= 0) & (c.group < limit[c.lanes])
            every = bool(done.all())
            if every or done.any():
                # All of an execution's copies landing at once is the usual case: no gathers.
                lanes = c.lanes if every else c.lanes[done]
                data = c.data if every else c.data[done]
                flat = c.flat if every else c.flat[done]
                size = data.shape[1]
                if b.shared.tracker is not None:
                    b.shared.tracker.copy_landed(lanes, flat, size)
                # In words of up to 8 bytes (the destination is aligned to the copy's size).
                word = min(size & -size, 8)
                words = np.ascontiguousarray(data).view(UINT[word])
                b.shared.land(flat, word, words)
                if every:
                    continue
                rest = ~done
                c = _Copies(c.lanes[rest], c.flat[rest], c.data[rest], c.group[rest])
            if c.lanes.size:
                still.append(c)
        self.pending = still


def copies_of(b: Batch) -> AsyncCopies:
    """The batch's copies, for an issue, commit or wait: each changes memory or what will."""
    b.writes += 1
    got = b.async_copies
    if got is None:
        got = b.async_copies = AsyncCopies(b.n)
    return got


def make_cp(ins: Instruction, prog: Program) -> Handler:
    mods = ins.modifiers
    if mods[:2] == ("async", "bulk"):
        return make_bulk(ins, prog)
    if mods[:1] != ("async",) or any(m.startswith("bulk") for m in mods):
        raise unsupported(ins, "only cp.async and cp.async.bulk copies are supported")
    if "commit_group" in mods:
        return lambda b: copies_of(b).commit(b.mask)
    if "wait_all" in mods or "wait_group" in mods:
        keep = 0
        if "wait_group" in mods:
            n = ins.operands[0] if ins.operands else None
            if not isinstance(n, Imm) or not isinstance(n.value, int):
                raise unsupported(ins, "cp.async.wait_group needs an integer immediate")
            keep = n.value

        def wait(b: Batch) -> None:
            copies = copies_of(b)
            if "wait_all" in mods:
                copies.commit(b.mask)
            copies.wait(b, b.mask, keep)

        return wait
    if "shared" not in {m.split("::")[0] for m in mods} or "global" not in mods:
        raise unsupported(ins, "cp.async copies from .global to .shared")
    return _make_issue(ins, prog)


def _make_issue(ins: Instruction, prog: Program) -> Handler:
    dst_addr, src_addr = _address(ins, 0), _address(ins, 1)
    size_op = ins.operands[2] if len(ins.operands) > 2 else None
    if not isinstance(size_op, Imm) or size_op.value not in (4, 8, 16):
        raise unsupported(ins, "the cp.async size must be 4, 8 or 16")
    size = int(size_op.value)
    if "cg" in ins.modifiers and size != 16:
        raise unsupported(ins, "cp.async.cg copies 16 bytes")
    extra: list[Operand] = list(ins.operands[3:])
    ignore_src: Operand | None = None
    src_size: Operand | None = None
    for op in extra:
        if is_predicate(op, prog):
            ignore_src = op
        elif src_size is None:
            src_size = op
        # a further operand is an L2 cache policy: a hint

    def run(b: Batch) -> None:
        lanes = b.active()
        dst = b.addresses(dst_addr, lanes, False)
        src = b.addresses(src_addr, lanes, False)
        check_aligned(lanes, dst, size, "cp.async shared destination")
        check_aligned(lanes, src, size, "cp.async global source")
        flat = b.shared.flat(lanes, b.slot[lanes], dst, size, "cp.async store")  # bounds, now
        b.shared.check_bulk(lanes, flat, size)
        if b.shared.tracker is not None:
            # The copy may land any time until the wait: to the race detector it writes from
            # issue on (and again when it lands), so a read by another thread in between is
            # a race even where a barrier separates it from the wait.
            b.shared.tracker.copy_issued(lanes, flat, size)
        if src_size is not None:
            n_src = b.read(src_size, "u32")[lanes].astype(np.int64)
            if (n_src > size).any():
                k = int(np.argmax(n_src > size))
                raise MemoryFault(int(lanes[k]), f"cp.async src-size {n_src[k]} exceeds {size}")
        else:
            n_src = np.full(lanes.size, size, dtype=np.int64)
        if ignore_src is not None:
            n_src[b.read(ignore_src, "pred")[lanes]] = 0
        if (n_src == size).all():  # the usual case: whole copies, read in aligned words
            word = min(size, 8)
            got = b.glob.load(lanes, src, word, size // word)
            data = np.ascontiguousarray(got).view(np.uint8).reshape(lanes.size, size)
            if b.global_races is not None:
                b.global_races.access(b.instr, lanes, src, size, False)
            copies_of(b).issue(lanes, flat, data)
            return
        data = np.zeros((lanes.size, size), dtype=np.uint8)
        # Only the first src-size bytes are read (the rest is zero-filled), so a masked-off
        # edge copy with src-size 0 may point anywhere.
        for n in np.unique(n_src):
            if n == 0:
                continue
            pos = np.flatnonzero(n_src == n)
            data[pos, :n] = b.glob.load(lanes[pos], src[pos], 1, int(n))
            if b.global_races is not None:
                b.global_races.access(b.instr, lanes[pos], src[pos], int(n), False)
        copies_of(b).issue(lanes, flat, data)

    return run
