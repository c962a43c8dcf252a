"""The simulator's memories: global allocations, per-block shared, per-thread local, params.

Every access is vectorized over lanes and checked: an address outside its space, or not
aligned to the access size, raises `MemoryFault` naming the first offending lane.
"""

from __future__ import annotations

import ctypes
from bisect import bisect_right, insort
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from cutile_py.sim.races import RaceTracker

if TYPE_CHECKING:
    from cutile_py.sim.bulk_stores import BulkStores

#: Generic-address windows of the per-block and per-thread spaces. They lie in the upper half
#: of the 64-bit space, where no host allocation lives, and their low 32 bits are the offset in
#: the space (so `cvt.u32.u64` of a generic shared address gives its shared address, as nvcc
#: code assumes).
SHARED_WINDOW = 0xFFFF_8000_0000_0000
LOCAL_WINDOW = 0xFFFF_9000_0000_0000
PARAM_WINDOW = 0xFFFF_A000_0000_0000
WINDOW_SPAN = 1 << 32

#: The unsigned dtype of each width in bytes: how raw bits travel between registers and memory.
UINT: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
    8: np.dtype(np.uint64),
}
SINT: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.int8),
    2: np.dtype(np.int16),
    4: np.dtype(np.int32),
    8: np.dtype(np.int64),
}


class MemoryFault(Exception):
    """A bad access by global lane `lane`; the executor turns it into a located SimError."""

    def __init__(self, lane: int, message: str) -> None:
        super().__init__(message)
        self.lane = lane
        self.message = message


def check_aligned(lanes: np.ndarray, addrs: np.ndarray, align: int, what: str) -> None:
    if align > 1:
        bad = (addrs & np.uint64(align - 1)) != 0
        if bad.any():
            k = int(np.argmax(bad))
            raise MemoryFault(
                int(lanes[k]),
                f"misaligned {what}: address {int(addrs[k]):#x} is not a multiple of {align}",
            )


def _element_index(data: np.ndarray, offs: np.ndarray, esize: int, nvec: int) -> np.ndarray:
    """Indices into `data` viewed as `esize`-byte elements: shape (k, nvec) (offs aligned)."""
    # A shift, not a division: offsets are aligned and far below 2**63, so the int64 view holds.
    base: np.ndarray = (offs >> np.uint64(esize.bit_length() - 1)).view(np.int64)[:, None]
    return base if nvec == 1 else base + np.arange(nvec, dtype=np.int64)


def _rows_ok(view: np.ndarray, offs: np.ndarray, span: int, nvec: int) -> bool:
    """Whether accesses of `span` bytes at `offs` are whole rows of `view` as (-1, nvec)."""
    if span & (span - 1) or view.size % nvec:
        return False
    return nvec == 1 or not (offs & np.uint64(span - 1)).any()


def _gather(view: np.ndarray, offs: np.ndarray, esize: int, nvec: int) -> np.ndarray:
    """(k, nvec) `esize`-byte elements of `view` at byte offsets `offs` (in bounds, aligned
    to the element); whole rows of a (-1, nvec) view where `offs` are aligned to the vector,
    as vector accesses are (NumPy takes rows far faster than it gathers 2-D indices)."""
    span = esize * nvec
    if _rows_ok(view, offs, span, nvec):
        rows = (offs >> np.uint64(span.bit_length() - 1)).view(np.int64)
        out: np.ndarray = view.reshape(-1, nvec).take(rows, axis=0)
        return out
    got: np.ndarray = view[_element_index(view, offs, esize, nvec)]
    return got


def _scatter(view: np.ndarray, offs: np.ndarray, esize: int, nvec: int, values: np.ndarray) -> None:
    """`_gather`'s elements set to `values` (k, nvec)."""
    span = esize * nvec
    if _rows_ok(view, offs, span, nvec):
        rows = (offs >> np.uint64(span.bit_length() - 1)).view(np.int64)
        # Rows as single elements of `span` bytes: NumPy scatters 1-D far faster than 2-D.
        row = np.dtype(f"V{span}")
        view.view(row)[rows] = np.ascontiguousarray(values, dtype=view.dtype).view(row).reshape(-1)
        return
    view[_element_index(view, offs, esize, nvec)] = values


def _view(data: np.ndarray, esize: int) -> np.ndarray:
    usable = data.size - data.size % esize
    out: np.ndarray = data[:usable].view(UINT[esize])
    return out


@dataclass
class Allocation:
    start: int
    data: np.ndarray  # uint8, contiguous
    name: str
    readonly: bool = False
    views: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.start + int(self.data.size)

    def view(self, esize: int) -> np.ndarray:
        v = self.views.get(esize)
        if v is None:
            v = self.views[esize] = _view(self.data, esize)
        return v


class GlobalMemory:
    """Live allocations by address. HostBuffers register here; so do `.global`/`.const` data."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._allocs: dict[int, Allocation] = {}
        self._starts_arr: np.ndarray | None = None
        #: Of each allocation made by `acquire`: how many acquisitions it serves, and the
        #: arrays that own its bytes (a merged span's own array does not).
        self._users: dict[int, int] = {}
        self._owners: dict[int, list[np.ndarray]] = {}

    def register(self, data: np.ndarray, name: str = "allocation", readonly: bool = False) -> int:
        """Make the bytes of `data` (uint8, contiguous) addressable; returns their address."""
        assert data.dtype == np.uint8 and data.flags.c_contiguous
        start = int(data.ctypes.data)
        if data.size == 0:
            return start
        if start in self._allocs:
            raise ValueError(f"memory at {start:#x} is already registered")
        self._allocs[start] = Allocation(start, data, name, readonly)
        insort(self._starts, start)
        self._starts_arr = None
        return start

    def acquire(self, data: np.ndarray, name: str) -> None:
        """Make the bytes of `data` addressable until `release` has been called once per
        `acquire`. Several host objects may view one array (two tensors over it, or a tensor
        and an exported view): overlapping spans count their users and merge into one
        allocation, which stays while any of them lives."""
        assert data.dtype == np.uint8 and data.flags.c_contiguous
        lo = int(data.ctypes.data)
        hi = lo + int(data.size)
        if lo == hi:
            return
        overlapping = self._overlapping(lo, hi)
        if len(overlapping) == 1 and overlapping[0].start <= lo and hi <= overlapping[0].end:
            self._users[overlapping[0].start] += 1
            return
        new_lo = min([lo] + [a.start for a in overlapping])
        new_hi = max([hi] + [a.end for a in overlapping])
        owners = [data]
        users = 1
        for a in overlapping:
            owners += self._owners.pop(a.start)
            users += self._users.pop(a.start)
            self.unregister(a.start)
        span = data
        if (new_lo, new_hi) != (lo, hi):
            # The union of views of one array: its bytes stay owned by `owners`.
            span = np.ctypeslib.as_array((ctypes.c_uint8 * (new_hi - new_lo)).from_address(new_lo))
        self.register(span, overlapping[0].name if overlapping else name)
        self._users[new_lo] = users
        self._owners[new_lo] = owners

    def release(self, address: int) -> None:
        """End one `acquire` of the memory at `address`."""
        i = bisect_right(self._starts, address) - 1
        start = self._starts[i]
        self._users[start] -= 1
        if self._users[start] == 0:
            del self._users[start], self._owners[start]
            self.unregister(start)

    def _overlapping(self, lo: int, hi: int) -> list[Allocation]:
        found = []
        i = bisect_right(self._starts, hi - 1) - 1
        while i >= 0 and self._allocs[self._starts[i]].end > lo:
            a = self._allocs[self._starts[i]]
            if a.start not in self._users:
                raise ValueError(f"memory at {lo:#x} overlaps the {a.name} at {a.start:#x}")
            found.append(a)
            i -= 1
        return found[::-1]

    def covers(self, address: int, nbytes: int) -> bool:
        """Whether [address, address + nbytes) lies inside one registered allocation."""
        i = bisect_right(self._starts, address) - 1
        return i >= 0 and address + nbytes <= self._allocs[self._starts[i]].end

    def unregister(self, address: int) -> None:
        if self._allocs.pop(address, None) is not None:
            self._starts.remove(address)
            self._starts_arr = None

    def __len__(self) -> int:
        return len(self._allocs)

    def containing(self, address: int) -> Allocation | None:
        """The allocation holding byte `address`, if any."""
        i = bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        a = self._allocs[self._starts[i]]
        return a if address < a.end else None

    def allocations(self) -> list[Allocation]:
        """Every live allocation, by address."""
        return [self._allocs[s] for s in self._starts]

    def allocation(self, address: int) -> Allocation:
        """The allocation starting at `address` (KeyError if none)."""
        return self._allocs[address]

    def _describe(self, addr: int) -> str:
        i = bisect_right(self._starts, addr) - 1
        if i >= 0:
            a = self._allocs[self._starts[i]]
            if addr < a.end:
                return f"inside the {a.data.size}-byte {a.name} at {a.start:#x}"
            return (
                f"{addr - a.end} bytes past the end of the {a.data.size}-byte {a.name} "
                f"at {a.start:#x}"
            )
        return "below every allocation"

    def locate(
        self, lanes: np.ndarray, addrs: np.ndarray, span: int, what: str
    ) -> list[tuple[Allocation, np.ndarray | None]]:
        """The allocation each access falls in, as (allocation, positions or None for all)."""
        if addrs.size == 0:
            return []
        lo, hi = int(addrs.min()), int(addrs.max()) + span
        i = bisect_right(self._starts, lo) - 1
        if i >= 0:
            a = self._allocs[self._starts[i]]
            if hi <= a.end:
                return [(a, None)]
        if self._starts_arr is None:
            self._starts_arr = np.array(self._starts, dtype=np.uint64)
            self._ends_arr = np.array([self._allocs[s].end for s in self._starts], dtype=np.uint64)
        idx = np.searchsorted(self._starts_arr, addrs, side="right").astype(np.intp) - 1
        ok = idx >= 0
        inside = addrs[ok]
        end = self._ends_arr[idx[ok]]
        ok[ok] = (inside < end) & (inside + np.uint64(span) <= end)
        if not ok.all():
            k = int(np.argmin(ok))
            addr = int(addrs[k])
            raise MemoryFault(
                int(lanes[k]),
                f"out-of-bounds {what} of {span} bytes at {addr:#x}: {self._describe(addr)}",
            )
        out: list[tuple[Allocation, np.ndarray | None]] = []
        for j in np.unique(idx):
            out.append((self._allocs[self._starts[int(j)]], np.flatnonzero(idx == j)))
        return out

    def load(self, lanes: np.ndarray, addrs: np.ndarray, esize: int, nvec: int) -> np.ndarray:
        out = np.empty((addrs.size, nvec), dtype=UINT[esize])
        for a, pos in self.locate(lanes, addrs, esize * nvec, "load"):
            sub = addrs if pos is None else addrs[pos]
            vals = _gather(a.view(esize), sub - np.uint64(a.start), esize, nvec)
            if pos is None:
                return vals
            out[pos] = vals
        return out

    def store(self, lanes: np.ndarray, addrs: np.ndarray, esize: int, values: np.ndarray) -> None:
        nvec = values.shape[1]
        for a, pos in self.locate(lanes, addrs, esize * nvec, "store"):
            if a.readonly:
                k = 0 if pos is None else int(pos[0])
                raise MemoryFault(int(lanes[k]), f"store to the read-only {a.name}")
            sub = addrs if pos is None else addrs[pos]
            _scatter(
                a.view(esize), sub - np.uint64(a.start), esize, nvec,
                values if pos is None else values[pos],
            )  # fmt: skip


class BlockMemory:
    """Per-slot memory of one space (shared: a slot per block; local: a slot per lane).

    Byte `off` of slot `s` is `data[s * stride + off]`; `size` is the usable size.
    """

    def __init__(self, space: str, slots: int, size: int, tracker: RaceTracker | None) -> None:
        self.space = space
        self.size = size
        self.stride = max(16, -(-size // 16) * 16)
        self.data = np.zeros(slots * self.stride, dtype=np.uint8)
        self.tracker = tracker
        self._views: dict[int, np.ndarray] = {}
        #: The batch's pending bulk stores (shared space; made by the first): a write to
        #: bytes one still reads is a fault.
        self.bulk: BulkStores | None = None

    def view(self, esize: int) -> np.ndarray:
        v = self._views.get(esize)
        if v is None:
            v = self._views[esize] = self.data.view(UINT[esize])
        return v

    def flat(
        self, lanes: np.ndarray, slots: np.ndarray, offs: np.ndarray, span: int, what: str
    ) -> np.ndarray:
        """Byte index in `data` of each access; MemoryFault if outside the space."""
        limit = self.size - span
        bad = np.ones(offs.shape, dtype=bool) if limit < 0 else offs > np.uint64(limit)
        if bad.any():
            k = int(np.argmax(bad))
            raise MemoryFault(
                int(lanes[k]),
                f"out-of-bounds {self.space} {what} of {span} bytes at {self.space} address "
                f"{int(offs[k]):#x}: the {self.space} space of this "
                f"{'block' if self.space == 'shared' else 'thread'} has {self.size} bytes",
            )
        flat: np.ndarray = slots.astype(np.uint64) * np.uint64(self.stride) + offs
        return flat

    def load(
        self, lanes: np.ndarray, slots: np.ndarray, offs: np.ndarray, esize: int, nvec: int
    ) -> np.ndarray:
        flat = self.flat(lanes, slots, offs, esize * nvec, "load")
        if self.tracker is not None:
            self.tracker.access(lanes, flat, esize * nvec, write=False)
        out = _gather(self.view(esize), flat, esize, nvec)
        return out

    def store(
        self, lanes: np.ndarray, slots: np.ndarray, offs: np.ndarray, esize: int, values: np.ndarray
    ) -> None:
        nvec = values.shape[1]
        flat = self.flat(lanes, slots, offs, esize * nvec, "store")
        self.check_bulk(lanes, flat, esize * nvec)
        if self.tracker is not None:
            raw = np.ascontiguousarray(values).view(np.uint8)
            self.tracker.access(lanes, flat, esize * nvec, write=True, values=raw)
        _scatter(self.view(esize), flat, esize, nvec, values)

    def land(self, flat: np.ndarray, esize: int, values: np.ndarray) -> None:
        """Write `values` (k, nvec) at byte indices `flat` (from `flat`) as a copy that lands:
        the race tracker has been told already (`RaceTracker.copy_landed`)."""
        _scatter(self.view(esize), flat, esize, values.shape[1], values)

    def check_bulk(self, lanes: np.ndarray, flat: np.ndarray, span: int) -> None:
        """With race checks on: fail if a pending bulk store reads a byte of the writes of
        `span` bytes at `flat`."""
        if self.tracker is not None and self.bulk is not None and self.bulk.pending:
            idx = (flat.astype(np.intp)[:, None] + np.arange(span, dtype=np.intp)).ravel()
            self.bulk.check_write(lanes, idx, span)


class ParamMemory:
    """The launch's parameter bytes (read-only, the same for every lane)."""

    def __init__(self, data: bytes) -> None:
        self.data = np.frombuffer(bytearray(data) + bytes(16), dtype=np.uint8)
        self.size = len(data)

    def load(self, lanes: np.ndarray, offs: np.ndarray, esize: int, nvec: int) -> np.ndarray:
        span = esize * nvec
        bad = offs + np.uint64(span) > np.uint64(self.size)
        if bad.any():
            k = int(np.argmax(bad))
            raise MemoryFault(
                int(lanes[k]),
                f"out-of-bounds param load at param offset {int(offs[k]):#x}: "
                f"the kernel's parameters take {self.size} bytes",
            )
        if offs.size and int(offs.min()) == int(offs.max()):
            # The usual case (`ld.param [name]`): one value for every lane.
            o = int(offs[0])
            row = self.data[o : o + span].copy().view(UINT[esize])
            return np.broadcast_to(row, (offs.size, nvec))
        idx = offs.astype(np.intp)[:, None] + np.arange(span, dtype=np.intp)
        out: np.ndarray = np.ascontiguousarray(self.data[idx]).view(UINT[esize])
        return out
