"""Bulk stores (`cp.async.bulk{.tensor}.global.shared::cta.bulk_group`) and their groups.

The copy engine reads a bulk store's shared source at some moment between the issue and the
issuing thread's `cp.async.bulk.wait_group{.read}` that retires its group (PTX ISA §9.7.9.24,
§9.7.9.27): until then the bytes must stay as they were. The simulator reads them at that
wait, so a kernel that writes its staging buffer again too early stores the new values; with
race checks on, a write to bytes a store still reads is reported at once (`reading`), and
the wait counts as the issuing thread's read of them, so a write by another thread must be
ordered after it by a barrier. A block whose threads exit with a store still pending is
reported too: its shared memory goes away under the copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from cutile_py.sim.memory import MemoryFault

if TYPE_CHECKING:
    from cutile_py.sim.spaces import Batch


@dataclass
class _Store:
    """One issued store: global lane, shared bytes read (element order), element size, the
    global address of each element written and which elements those are (the rest lie
    outside the tensor), the issue's PTX line, and its group (-1: not committed yet)."""

    lane: int
    flat: np.ndarray
    esize: int
    at: np.ndarray
    written: np.ndarray
    line: int
    group: int = -1


class BulkStores:
    """The pending bulk stores of a batch, each lane's count of committed groups, and how
    many pending stores read each shared byte (None until the first store)."""

    def __init__(self, n: int, shared_bytes: int) -> None:
        self.pending: list[_Store] = []
        self.committed = np.zeros(n, dtype=np.int64)
        self.reading = np.zeros(shared_bytes, dtype=np.uint16)

    def issue(self, store: _Store) -> None:
        self.pending.append(store)
        np.add.at(self.reading, store.flat, 1)

    def commit(self, mask: np.ndarray) -> None:
        for s in self.pending:
            if s.group < 0 and mask[s.lane]:
                s.group = int(self.committed[s.lane])
        self.committed[mask] += 1

    def wait(self, b: Batch, mask: np.ndarray, keep: int) -> None:
        """Carry out the stores of every committed group of the lanes in `mask` but their
        newest `keep`: read shared memory now, write global memory."""
        limit = self.committed - keep
        still = []
        for s in self.pending:
            if not (mask[s.lane] and 0 <= s.group < limit[s.lane]):
                still.append(s)
                continue
            np.subtract.at(self.reading, s.flat, 1)
            if b.shared.tracker is not None:
                # To the race detector the waiting (issuing) thread reads the source again
                # now: another thread's write of it must come after a barrier that follows
                # this wait, not merely after the wait in lock-step. (16-byte chunks, each
                # contiguous, as at the issue.)
                starts = s.flat[::16].astype(np.uint64)
                b.shared.tracker.access(np.full(starts.size, s.lane), starts, 16, write=False)
            elems = b.shared.data[s.flat].view(f"u{s.esize}")[s.written]
            if not s.at.size:
                continue
            who = np.full(s.at.size, s.lane, dtype=np.int64)
            b.glob.store(who, s.at, s.esize, elems[:, None])
            if b.global_races is not None:
                raw = elems[:, None].view(np.uint8)
                b.global_races.access(b.instr, who, s.at, s.esize, True, raw)
        self.pending = still

    def check_write(self, lanes: np.ndarray, idx: np.ndarray, per: int) -> None:
        """Bytes `idx` (`per` of them for each lane in `lanes`) are about to be written:
        fail if a pending store still reads one."""
        hit = self.reading[idx] > 0
        if not hit.any():
            return
        k = int(np.argmax(hit))
        byte = int(idx[k])
        line = next(s.line for s in self.pending if (s.flat == byte).any())
        raise MemoryFault(
            int(lanes[k // per]),
            f"shared-memory race: this thread writes shared memory that the bulk store "
            f"issued at PTX line {line} may still be reading (no cp.async.bulk.wait_group.read "
            "of its group before the write)",
        )

    def check_exit(self) -> None:
        """Every thread of the batch has exited: fail if a store is still pending."""
        if self.pending:
            s = self.pending[0]
            raise MemoryFault(
                s.lane,
                f"this thread exited with the bulk store it issued at PTX line {s.line} still "
                "pending (no cp.async.bulk.wait_group{.read} retired its group): the block's "
                "shared memory is released while the copy may still read it",
            )


def stores_of(b: Batch) -> BulkStores:
    got = b.shared.bulk
    if got is None:
        got = b.shared.bulk = BulkStores(b.n, b.shared.data.size)
    return got
