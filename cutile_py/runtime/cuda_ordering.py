"""Ordering device work across streams by what it touches.

Each piece of device work not yet known to have finished is kept as pending accesses: a byte
range it reads or writes, the stream it is queued on, and an event recorded after it there. A
launch on another stream waits only for the pending accesses it conflicts with: those that
write what it reads, and those that read or write what it writes. Work on the same stream is
ordered by the stream itself. Accesses are dropped once their work is known to be over (its
completion waited for, its stream synchronized, or its event found done).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple

from cutile_py.runtime import cuda_driver as cu
from cutile_py.runtime.backend import Touch


class _Access(NamedTuple):
    """A byte range that pending work reads or writes (a tuple: made on every launch)."""

    lo: int
    hi: int
    writes: bool
    stream: cu.Stream
    event: cu.Event
    #: The completion whose event `event` is; None for an event of this module's pool.
    owner: object | None


class StreamOrdering:
    """Pending accesses of one backend's device work (thread-safe)."""

    #: Past this many pending accesses, those whose events are done are dropped.
    PRUNE_AT = 256

    def __init__(self) -> None:
        self._pending: list[_Access] = []
        #: Streams with work queued whose memory was not recorded (allocations from the
        #: pool), each with the streams that have waited for all of it since (a fence): work
        #: of other streams waits for it, until the stream is idle.
        self._unrecorded: dict[cu.Stream, set[cu.Stream]] = {}
        #: Streams that have waited for all of that unrecorded work: `order` has nothing to
        #: do for them there (read on every launch).
        self.clean: set[cu.Stream] = set()
        self._spare: list[cu.Event] = []
        self._lock = threading.Lock()
        self._prune_at = self.PRUNE_AT

    def unrecorded(self, stream: cu.Stream) -> None:
        """Work was just queued on `stream` without its memory being recorded: work of other
        streams is ordered after it (a fence on `stream`) until `stream_idle(stream)`."""
        with self._lock:
            waited = self._unrecorded.get(stream)
            if waited is not None and not waited:
                # Already unrecorded, and no stream has waited for it since: each one's next
                # launch fences `stream` after this work too (an allocation or `.then` step,
                # every time: a dictionary lookup, no new fence).
                return
            self._unrecorded[stream] = set()
            self.clean = set()

    @property
    def pending(self) -> int:
        """How many accesses are pending."""
        return len(self._pending)

    def order(self, stream: cu.Stream, touches: Sequence[Touch] | None) -> int:
        """Make `stream` wait for the pending work of other streams that `touches` conflicts
        with (None: that touches anything, so all of it). Work found finished is dropped
        instead of waited for (an upload long done costs one query, once, not a wait at every
        later launch). Returns how many waits it queued."""
        with self._lock:
            fences = [
                s
                for s, waited in self._unrecorded.items()
                if s is not stream and stream not in waited
            ]
            for s in fences:
                self._unrecorded[s].add(stream)  # (the fence below is queued before any use)
            self.clean.add(stream)
        for other in fences:
            with self._lock:
                fence = self._spare.pop() if self._spare else None
            if fence is None:
                fence = cu.event_create()
            cu.event_record(fence, other)
            cu.stream_wait_event(stream, fence)
            with self._lock:  # `stream` took the fence's state at the wait: free to reuse
                self._spare.append(fence)
        if not self._pending:
            return len(fences)
        events: dict[int, cu.Event] = {}
        with self._lock:
            for a in self._pending:
                if a.stream is stream or id(a.event) in events:
                    continue
                if touches is None or any(
                    lo < a.hi and a.lo < lo + n and (writes or a.writes)
                    for lo, n, writes in touches
                ):
                    events[id(a.event)] = a.event
        passed: set[int] = set()
        for key, event in events.items():
            if _finished(event):
                passed.add(key)
            else:
                cu.stream_wait_event(stream, event)
        if passed:
            self._drop(lambda a: id(a.event) in passed)
        return len(fences) + len(events) - len(passed)

    def record(
        self,
        stream: cu.Stream,
        touches: Sequence[Touch],
        event: cu.Event | None = None,
        owner: object | None = None,
    ) -> None:
        """Note `touches` as work just queued on `stream`: its end is `event` (recorded by the
        caller after it, and kept alive by `owner`), or an event recorded here now."""
        if event is None:
            touches = [t for t in touches if t[1] > 0]
            if not touches:
                return
            with self._lock:
                event = self._spare.pop() if self._spare else None
            if event is None:
                event = cu.event_create()
            cu.event_record(event, stream)
        # (tuple.__new__: the named tuple's own constructor is a Python call per access.)
        accesses = [
            tuple.__new__(_Access, (lo, lo + n, w, stream, event, owner))
            for lo, n, w in touches
            if n > 0
        ]
        if not accesses:
            return
        with self._lock:
            self._pending.extend(accesses)
            crowded = len(self._pending) > self._prune_at
        if crowded:
            self._drop(lambda a: _finished(a.event))
            # Work still in flight stays: the next pass waits until the list has doubled, so
            # that many launches in flight (a large ct.zip) cost linear time, not quadratic.
            self._prune_at = max(self.PRUNE_AT, 2 * len(self._pending))

    def finished(self, owner: object) -> None:
        """The work of the completion `owner` is over."""
        pending = self._pending
        if not pending:
            return
        with self._lock:
            # One `record` call appended all of an owner's accesses, together: they are found
            # at the end (an awaited launch), at the start (the first of a `ct.zip`'s ops to
            # complete), or else in one pass without a call per access.
            pending = self._pending
            if not pending:
                return
            if pending[-1].owner is owner:
                while pending and pending[-1].owner is owner:
                    pending.pop()
            elif pending[0].owner is owner:
                k = 1
                while k < len(pending) and pending[k].owner is owner:
                    k += 1
                del pending[:k]
            else:
                self._pending = [a for a in pending if a.owner is not owner]

    def stream_idle(self, stream: cu.Stream) -> None:
        """Everything queued on `stream` so far is over (it was synchronized)."""
        if self._unrecorded:
            with self._lock:
                self._unrecorded.pop(stream, None)
        if self._pending:
            self._drop(lambda a: a.stream is stream)

    def _drop(self, over: Callable[[_Access], bool]) -> None:
        with self._lock:
            kept = [a for a in self._pending if not over(a)]
            if len(kept) == len(self._pending):
                return
            dropped = {id(a.event): a.event for a in self._pending if a.owner is None}
            for a in kept:
                dropped.pop(id(a.event), None)
            self._pending = kept
            # A stream that waited on one of these events took its state at that call, so
            # recording it again later changes nothing for that stream.
            self._spare.extend(dropped.values())


def _finished(event: cu.Event) -> bool:
    try:
        return cu.event_query(event)
    except cu.CudaDriverError:
        return True  # finished, by failing; the work's own completion reports it
