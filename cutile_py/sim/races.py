"""Shared-memory race detection: two threads of a block touch one byte between barriers,
at least one of them writing (the hazard `compute-sanitizer --tool racecheck` reports).

Per byte it keeps the last writer and the reader(s) since the block's last `bar.sync`; a
`bar.warp.sync` forgets what the synced warp did. Atomics are not tracked. Bytes a `cp.async`
is still copying into belong to its thread until that thread's wait lands the copy, across
barriers: another thread touching them in between races with the landing.

Reads are checked against the writers at once but entered in the reader tables only when
something needs them (a write, or what forgets readers): most reads meet a barrier first.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

NONE = -1
MANY = -2
UINT = {k: np.dtype(f"u{k}") for k in (1, 2, 4, 8)}
#: Access spans checked on the history viewed as rows (the shared stride is a multiple of 16).
ROW_SPANS = frozenset({1, 2, 4, 8, 16})
#: Reads logged before they are entered in the reader tables anyway (bounds the log).
MAX_LOGGED = 64


#: Per row size in bytes: the NumPy type of one row as a whole (gathers and scatters of a
#: 1-D array of rows are an order of magnitude faster than of rows of a 2-D array).
ROW = {n: np.dtype(f"V{n}") for n in (2, 4, 8, 16, 32)}


def _words(table: np.ndarray, span: int) -> np.ndarray:
    """An int16 history table as a 1-D array of rows of `span` entries."""
    return table.view(ROW[2 * span])


def _take(table: np.ndarray, rows: np.ndarray, span: int) -> np.ndarray:
    """Rows `rows` of `table` (int16, shape (len(rows), span))."""
    return _words(table, span).take(rows).view(np.int16).reshape(-1, span)


def _put(table: np.ndarray, rows: np.ndarray, span: int, values: np.ndarray) -> None:
    """`table`'s rows `rows` = `values` (int16, (len(rows), span))."""
    words = _words(table, span)
    words[rows] = np.ascontiguousarray(values).view(words.dtype).reshape(-1)


#: Per word size: the multiplier that replicates a uint16 into each 16-bit slot of a word.
_SPREAD = {w: UINT[w].type(sum(1 << (16 * i) for i in range(w // 2))) for w in (2, 4, 8)}


def _fill(who: np.ndarray, span: int) -> np.ndarray:
    """Entries `who` (int16, n) as rows of `_words(table, span)`: each in every slot (built
    in words of up to 8 bytes: fewer elements to repeat than 16-bit entries)."""
    size = min(2 * span, 8)
    one: np.ndarray = who.reshape(-1).astype(np.uint16).astype(UINT[size]) * _SPREAD[size]
    per = 2 * span // size
    return (one if per == 1 else np.repeat(one, per)).view(ROW[2 * span])


def _equal(got: np.ndarray, want: np.ndarray) -> bool:
    """Whether two arrays of `ROW` rows are equal (compared as integers)."""
    word = UINT[min(got.dtype.itemsize, 8)]
    return bool((got.view(word) == want.view(word)).all())


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per row of two arrays of `ROW` rows: whether they are equal (compared as integers)."""
    size = got.dtype.itemsize
    word = UINT[min(size, 8)]
    a, b = got.view(word).reshape(got.size, -1), want.view(word).reshape(want.size, -1)
    out: np.ndarray = (a == b).all(axis=1) if a.shape[1] > 1 else (a == b)[:, 0]
    return out


def _clash(owners: np.ndarray, t: np.ndarray) -> bool:
    """Whether a byte belongs to a thread (>= 0) other than its accessing lane's `t`."""
    if owners.max() < 0:
        return False
    return bool(((owners >= 0) & (owners != t)).any())


class RaceFault(Exception):
    """A race found at an access by global lane `lane` (turned into a SimError upstream)."""

    def __init__(self, lane: int, message: str) -> None:
        super().__init__(message)
        self.lane = lane
        self.message = message


class RaceTracker:
    """Access history of a batch's shared memory: `slots` blocks of `stride` bytes each."""

    def __init__(
        self,
        slots: int,
        stride: int,
        lanes_per_block: int,
        describe_thread: Callable[[int], str],
        warp_syncs: bool = True,
        proxy_fences: bool = False,
    ) -> None:
        """`warp_syncs`: whether the kernel has `bar.warp.sync` (only then the warps of the
        readers are kept, for `warp_barrier` to forget); `proxy_fences`: whether it has bulk
        stores (only then each byte's generic write not yet followed by its writer's
        `fence.proxy.async` is kept, for `bulk_store_read` to check)."""
        self.stride = stride
        self.warp_syncs = warp_syncs
        self.lanes_per_block = lanes_per_block
        self.describe_thread = describe_thread  # block-local thread index -> "(x, y, z)"
        size = slots * stride
        # int16 holds any thread index of a block (at most 1024 threads).
        self.writer = np.full(size, NONE, dtype=np.int16)
        self.reader = np.full(size, NONE, dtype=np.int16)
        self.reader_warp = np.full(size, NONE, dtype=np.int16)
        #: The thread whose cp.async has not landed in the byte yet (barriers keep it).
        self.in_flight = np.full(size, NONE, dtype=np.int16)
        self.copies = False
        self.dirty = False
        #: Reads not yet in the reader tables: (rows, span, thread) per aligned access. Only a
        #: write (or what forgets readers) needs those tables, and a barrier usually comes
        #: first, so most reads never cost a scatter.
        self._reads: list[tuple[np.ndarray, int, np.ndarray]] = []
        self._none_rows: dict[tuple[int, int], np.ndarray] = {}
        #: Each lane's thread index in its block.
        self._tids = (np.arange(slots * lanes_per_block) % lanes_per_block).astype(np.int16)
        #: Whether the reader tables may hold a reader (cleared with them by a bar.sync).
        self._readers = False
        #: Per byte: the thread whose generic-proxy write no fence.proxy.async of that thread
        #: has followed yet (barriers keep it: the copy engine reads through the async proxy).
        self.unfenced = np.full(size, NONE, dtype=np.int16) if proxy_fences else None

    def access(
        self,
        lanes: np.ndarray,
        flat: np.ndarray,
        span: int,
        write: bool,
        values: np.ndarray | None = None,
    ) -> None:
        """Record accesses of `span` bytes at byte `flat[i]` by global lane `lanes[i]`;
        a write passes its bytes, (len(lanes), span) uint8, so that lanes storing one value to
        one byte in one instruction are not a race (on hardware one of them lands, and every
        candidate is the same)."""
        if lanes.size == 0:
            return
        self.dirty = True
        tid = self._tids.take(lanes)
        if write and self.unfenced is not None:
            self.unfenced[self._bytes(flat, span)] = np.repeat(tid, span)
        rows = self._rows(flat, span)
        if rows is not None and self._access_rows(rows, span, write, tid):
            return
        self._access_bytes(lanes, flat, span, write, values, tid)

    def proxy_fence(self, lanes: np.ndarray) -> None:
        """`fence.proxy.async` by `lanes`: their generic writes so far are ordered before
        later async-proxy accesses (a bulk store's read)."""
        if self.unfenced is None or lanes.size == 0:
            return
        slots = lanes // self.lanes_per_block
        for slot in np.unique(slots):
            tids = np.unique(self._tids.take(lanes[slots == slot]))
            part = self.unfenced.reshape(-1, self.stride)[slot]
            part[np.isin(part, tids)] = NONE

    def bulk_store_read(self, lane: int, idx: np.ndarray) -> None:
        """A bulk store issued by global lane `lane` reads bytes `idx` through the async
        proxy: fail if a thread's generic write of one has no fence.proxy.async after it."""
        if self.unfenced is None:
            return
        who = self.unfenced[idx]
        bad = who != NONE
        if bad.any():
            k = int(np.argmax(bad))
            raise RaceFault(
                lane,
                f"shared-memory race: this thread's bulk store reads shared address "
                f"{int(idx[k]) % self.stride:#x}, which thread "
                f"{self.describe_thread(int(who[k]))} wrote through the generic proxy with no "
                "fence.proxy.async (by that thread) after the write",
            )

    def _access_rows(self, rows: np.ndarray, span: int, write: bool, tid: np.ndarray) -> bool:
        """`access` for aligned spans, on the tables viewed as rows of `span` bytes (one
        gather per table instead of one per byte); False, having changed nothing, where a
        check fails, for `_access_bytes` to name the race."""
        t = tid[:, None]
        if self.copies and _clash(_take(self.in_flight, rows, span), t):
            return False
        w = _take(self.writer, rows, span)
        if _clash(w, t):
            return False
        if not write:
            self._reads.append((rows, span, tid))
            if len(self._reads) >= MAX_LOGGED:
                self._flush()
            return True
        self._flush()
        if self._readers:
            r = _take(self.reader, rows, span)
            read = r.max() != NONE or r.min() != NONE  # a reader since the last barrier
            if read and ((r == MANY) | ((r >= 0) & (r != t))).any():
                return False
        words, mine = _words(self.writer, span), _fill(tid, span)
        words[rows] = mine
        distinct = rows.size < 2 or bool((rows[1:] > rows[:-1]).all())
        if not distinct and not _equal(words.take(rows), mine):
            # Lanes of this store hit one byte: put the writers back, let the bytes decide.
            _put(self.writer, rows, span, w)
            return False
        return True

    def _flush(self) -> None:
        """Enter the logged reads in the reader tables, all of one span at once (a reader
        set, one thread or several, does not depend on the order of the reads)."""
        if not self._reads:
            return
        self._readers = True
        spans = {span for _, span, _ in self._reads}
        for span in spans:
            got = [(rows, tid) for rows, s, tid in self._reads if s == span]
            rows = np.concatenate([r for r, _ in got]) if len(got) > 1 else got[0][0]
            tid = np.concatenate([t for _, t in got]) if len(got) > 1 else got[0][1]
            distinct = rows.size < 2 or bool((rows[1:] > rows[:-1]).all())
            self._add_reader_rows(self.reader, rows, span, tid, distinct)
            if self.warp_syncs:
                self._add_reader_rows(self.reader_warp, rows, span, tid // 32, distinct)
        self._reads.clear()

    @staticmethod
    def _add_reader_rows(
        table: np.ndarray, rows: np.ndarray, span: int, who: np.ndarray, distinct: bool
    ) -> None:
        """Readers `who[i]` (int16) of rows `rows[i]` added to `table`: an entry becomes the
        reader where it had none or the same one, else MANY."""
        words = _words(table, span)
        old_rows = words.take(rows)
        old = old_rows.view(np.int16).reshape(-1, span)
        mine = _fill(who, span)
        if old.min() == NONE and old.max() == NONE:  # no reader of these rows yet
            words[rows] = mine
            if distinct:
                return
            # Lanes reading one row (all of it): several readers.
            hit = np.flatnonzero(~_same(words.take(rows), mine))
            words[rows[hit]] = _fill(np.full(hit.size, MANY, np.int16), span)
            return
        if _equal(old_rows, mine) or (old == MANY).all():
            return  # each row is this lane's already, or several threads' already
        w = who[:, None]
        new = np.where((old == NONE) | (old == w), w, np.int16(MANY))
        _put(table, rows, span, new)
        if distinct:
            return
        several = _take(table, rows, span) != new
        hit = np.flatnonzero(several.any(axis=1))
        if hit.size:  # several lanes read one byte
            at = rows[hit, None] * span + np.arange(span)
            table[at[several[hit]]] = MANY

    def _access_bytes(
        self,
        lanes: np.ndarray,
        flat: np.ndarray,
        span: int,
        write: bool,
        values: np.ndarray | None,
        tid: np.ndarray,
    ) -> None:
        self._flush()
        if span == 1:
            idx = flat.astype(np.intp)
            t = tid
            owner = np.arange(lanes.size)
        else:
            idx = (flat.astype(np.intp)[:, None] + np.arange(span, dtype=np.intp)).ravel()
            t = np.repeat(tid, span)
            owner = np.repeat(np.arange(lanes.size), span)
        if self.copies:
            f = self.in_flight[idx]
            clash = (f >= 0) & (f != t)
            if clash.any():
                k = int(np.argmax(clash))
                verb = "writes" if write else "reads"
                self._fail(lanes, owner, idx, k, f"{verb} shared memory that a cp.async of "
                           f"thread {self.describe_thread(int(f[k]))} has not landed in yet",
                           "before that thread's cp.async.wait_group lands it")  # fmt: skip
        w = self.writer[idx]
        clash = (w >= 0) & (w != t)
        if clash.any():
            k = int(np.argmax(clash))
            verb = "writes" if write else "reads"
            self._fail(lanes, owner, idx, k, f"{verb} shared memory that thread "
                       f"{self.describe_thread(int(w[k]))} wrote")  # fmt: skip
        if write:
            r = self.reader[idx]
            clash = (r == MANY) | ((r >= 0) & (r != t))
            if clash.any():
                k = int(np.argmax(clash))
                other = (
                    "several threads"
                    if r[k] == MANY
                    else f"thread {self.describe_thread(int(r[k]))}"
                )
                self._fail(lanes, owner, idx, k, f"writes shared memory that {other} read")
            self.writer[idx] = t
            got = self.writer[idx]
            dup = got != t
            if dup.any():
                if values is not None:
                    self._same_instruction(lanes, idx, owner, values.reshape(-1))
                else:
                    k = int(np.argmax(dup))
                    self._fail(lanes, owner, idx, k, f"and thread "
                               f"{self.describe_thread(int(got[k]))} write the same shared "
                               "memory in one instruction")  # fmt: skip
        else:
            self._readers = True
            self._add_readers(self.reader, idx, t)
            if self.warp_syncs:
                self._add_readers(self.reader_warp, idx, t // 32)

    def _same_instruction(
        self, lanes: np.ndarray, idx: np.ndarray, owner: np.ndarray, values: np.ndarray
    ) -> None:
        """Several lanes of one store hit one byte: a race only where their bytes differ."""
        order = np.argsort(idx, kind="stable")
        i, v = idx[order], values[order]
        clash = (i[1:] == i[:-1]) & (v[1:] != v[:-1])
        if clash.any():
            at = i[int(np.argmax(clash)) + 1]
            group = np.flatnonzero(i == at)  # in lane order: the sort is stable
            a = int(group[0])
            z = int(group[np.argmax(v[group] != v[a])])
            tid = lanes % self.lanes_per_block
            raise RaceFault(
                int(lanes[owner[order[a]]]),
                f"shared-memory race: this thread and thread "
                f"{self.describe_thread(int(tid[owner[order[z]]]))} write different values "
                f"({int(v[a]):#04x} and {int(v[z]):#04x}) to shared address "
                f"{int(at) % self.stride:#x} in one instruction",
            )

    def _bytes(self, flat: np.ndarray, span: int) -> np.ndarray:
        return (flat.astype(np.intp)[:, None] + np.arange(span, dtype=np.intp)).ravel()

    def copy_issued(self, lanes: np.ndarray, flat: np.ndarray, span: int) -> None:
        """A cp.async of `span` bytes into `flat[i]` by lane `lanes[i]`: a write now, and the
        bytes stay the thread's until `copy_landed`."""
        if lanes.size == 0:
            return
        self.dirty = True
        tid = self._tids.take(lanes)
        if self.unfenced is not None:
            self.unfenced[self._bytes(flat, span)] = np.repeat(tid, span)
        rows = self._rows(flat, span)
        if rows is None or not self._access_rows(rows, span, True, tid):
            self._access_bytes(lanes, flat, span, True, None, tid)
        self.copies = True
        if rows is not None:  # the writer rows just written: the same entries
            _words(self.in_flight, span)[rows] = _words(self.writer, span).take(rows)
        else:
            self.in_flight[self._bytes(flat, span)] = np.repeat(tid, span)

    def engine_wrote(self, idx: np.ndarray) -> None:
        """Bytes `idx` were written by the copy engine (a TMA load), which the barrier wait
        orders before any later access: no thread's earlier access races with them."""
        self._flush()
        self.writer[idx] = NONE
        self.reader[idx] = NONE
        self.reader_warp[idx] = NONE
        if self.unfenced is not None:
            self.unfenced[idx] = NONE  # written through the async proxy

    def copy_landed(self, lanes: np.ndarray, flat: np.ndarray, span: int) -> None:
        """The cp.asyncs of lanes `lanes` landed `span` bytes at `flat`: the bytes are no
        longer in flight, and their writer is the issuing thread again (a barrier since the
        issue may have cleared it; until the next one, other threads may not read them). Any
        other thread's access since the issue met the in-flight bytes and was reported, so
        the landing write itself needs no check."""
        tid = self._tids.take(lanes)
        rows = self._rows(flat, span)
        if rows is not None:
            _words(self.in_flight, span)[rows] = self._nones(rows.size, span)
            _words(self.writer, span)[rows] = _fill(tid, span)
        else:
            idx = self._bytes(flat, span)
            self.in_flight[idx] = NONE
            self.writer[idx] = np.repeat(tid, span)
        self.dirty = True

    def _nones(self, n: int, span: int) -> np.ndarray:
        """`n` rows of `span` NONE entries (the same read-only array for each size)."""
        got = self._none_rows.get((n, span))
        if got is None:
            got = self._none_rows[(n, span)] = _fill(np.full(n, NONE, np.int16), span)
            got.flags.writeable = False
        return got

    def _rows(self, flat: np.ndarray, span: int) -> np.ndarray | None:
        """The history rows of `span` bytes that accesses of `span` bytes at `flat` are;
        None where they are not whole aligned rows."""
        if span not in ROW_SPANS or self.writer.size % span:
            return None
        if flat.dtype == np.uint64:  # memory's byte indices: shifts, not divisions
            if (flat & np.uint64(span - 1)).any():
                return None
            rows: np.ndarray = (flat >> np.uint64(span.bit_length() - 1)).view(np.int64)
            return rows
        if (flat % span).any():
            return None
        return (flat // span).astype(np.intp)

    @staticmethod
    def _add_readers(table: np.ndarray, idx: np.ndarray, who: np.ndarray) -> None:
        old = table[idx]
        new = np.where((old == NONE) | (old == who), who, np.int16(MANY))
        table[idx] = new
        # Several lanes of this one instruction reading one byte: the last assignment won.
        several = table[idx] != new
        if several.any():
            table[idx[several]] = MANY

    def _fail(
        self,
        lanes: np.ndarray,
        owner: np.ndarray,
        idx: np.ndarray,
        k: int,
        what: str,
        when: str = "with no barrier (bar.sync) between the two accesses",
    ) -> None:
        offset = int(idx[k]) % self.stride
        raise RaceFault(
            int(lanes[owner[k]]),
            f"shared-memory race: this thread {what} at shared address {offset:#x} {when}",
        )

    def barrier(self, slots: np.ndarray) -> None:
        """`bar.sync` completed by blocks `slots`: their history starts afresh."""
        if not self.dirty:
            return
        every = slots.size * self.stride == self.writer.size
        if every:
            self._reads.clear()  # forgotten with the tables
        else:
            self._flush()
        for table in (self.writer, self.reader, self.reader_warp):
            if every:
                table.fill(NONE)
            else:
                table.reshape(-1, self.stride)[slots] = NONE
        self.dirty = not every
        self._readers = self._readers and not every

    def release(self, slot: int, tids: np.ndarray) -> None:
        """Threads `tids` of block `slot` arrived on an mbarrier whose phase a wait then saw
        complete: forget their accesses in the block (they happen before what follows)."""
        if not self.dirty:
            return
        self._flush()
        rows = slice(slot * self.stride, (slot + 1) * self.stride)
        who = np.unique(tids).astype(np.int16)
        for table in (self.writer, self.reader):
            part = table[rows]
            hit = part == who[0] if who.size == 1 else np.isin(part, who)
            part[hit] = NONE
            if table is self.reader:
                self.reader_warp[rows][hit] = NONE  # the warps of the readers forgotten

    def warp_barrier(self, lanes: np.ndarray) -> None:
        """`bar.warp.sync` by `lanes`: forget what their warps did, block by block."""
        if not self.dirty or lanes.size == 0:
            return
        assert self.warp_syncs, "a bar.warp.sync in a kernel loaded without one"
        self._flush()
        slots = lanes // self.lanes_per_block
        warps = (lanes % self.lanes_per_block) // 32
        for slot in np.unique(slots):
            synced = np.unique(warps[slots == slot]).astype(np.int16)
            rows = slice(int(slot) * self.stride, (int(slot) + 1) * self.stride)
            w = self.writer[rows]
            w[(w >= 0) & np.isin(w // 32, synced)] = NONE
            rw = self.reader_warp[rows]
            mine = np.isin(rw, synced)
            self.reader[rows][mine] = NONE
            rw[mine] = NONE
