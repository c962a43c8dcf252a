"""Ordering device work across streams by what it touches.

Each piece of device work not yet known to have finished is kept pending: the byte ranges it
reads or writes, the stream it is queued on, and an event recorded after it there. A launch on
another stream waits only for the pending work it conflicts with: work that writes what it
reads, and work that reads or writes what it writes. Work on the same stream is ordered by the
stream itself. Work is dropped once known to be over (its completion waited for, its stream
synchronized, or its event found done).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple

from cutile_py.runtime import cuda_driver as cu
from cutile_py.runtime.backend import Touch


class _Work(NamedTuple):
    """Pending work: the memory it reads and writes, the stream it is queued on and an event
    recorded after it there (a tuple: made on every launch)."""

    touches: Sequence[Touch]
    stream: cu.Stream
    event: cu.Event
    #: The completion whose event `event` is; None for an event of this module's pool.
    owner: object | None


def _conflict(done: Sequence[Touch], new: Sequence[Touch]) -> bool:
    """Whether work touching `new` must wait for work touching `done`: they overlap (in a
    range of more than zero bytes) where one of them writes."""
    for lo, n, writes in new:
        for lo2, n2, writes2 in done:
            if lo < lo2 + n2 and lo2 < lo + n and n2 and (writes or writes2):
                return True
    return False


class StreamOrdering:
    """Pending device work of one backend (thread-safe)."""

    #: Past this many pieces of pending work, those whose events are done are dropped.
    PRUNE_AT = 256

    def __init__(self) -> None:
        self._pending: list[_Work] = []
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
            # No other stream has waited for this work yet; `stream` itself needs no fence
            # for it (nor, if it has waited for them all, for other streams' such work).
            if len(self._unrecorded) == 1:  # (the usual case: the backend stream's alone)
                self.clean = {stream}
            else:
                others = [w for s, w in self._unrecorded.items() if s is not stream]
                self.clean = {stream} if all(stream in w for w in others) else set()

    @property
    def pending(self) -> int:
        """How many pieces of work are pending."""
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
        probe: cu.Event | None = None
        with self._lock:
            for w in self._pending:
                if w.stream is stream or id(w.event) in events:
                    continue
                if touches is None or _conflict(w.touches, touches):
                    events[id(w.event)] = w.event
                elif probe is None:
                    probe = w.event
        passed: set[int] = set()
        if probe is not None and id(probe) not in events and _finished(probe):
            # Work this launch need not wait for, found over (one query per launch: work
            # nobody waits for, an upload, leaves the list, so later launches skip all this).
            passed.add(id(probe))
        for key, event in events.items():
            if _finished(event):
                passed.add(key)
            else:
                cu.stream_wait_event(stream, event)
        if passed:
            self._drop(lambda w: id(w.event) in passed)
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
            if not any(n > 0 for _, n, _ in touches):
                return
            with self._lock:
                event = self._spare.pop() if self._spare else None
            if event is None:
                event = cu.event_create()
            cu.event_record(event, stream)
        elif not touches:
            return
        # (tuple.__new__: the named tuple's own constructor is a Python call.)
        work = tuple.__new__(_Work, (touches, stream, event, owner))
        with self._lock:
            self._pending.append(work)
            crowded = len(self._pending) > self._prune_at
        if crowded:
            self._drop(lambda w: _finished(w.event))
            # Work still in flight stays: the next pass waits until the list has doubled, so
            # that many launches in flight (a large ct.zip) cost linear time, not quadratic.
            self._prune_at = max(self.PRUNE_AT, 2 * len(self._pending))

    def finished(self, owner: object) -> None:
        """The work of the completion `owner` is over."""
        pending = self._pending
        if not pending:
            return
        with self._lock:
            # An owner's work is found at the end (an awaited launch), at the start (the first
            # of a `ct.zip`'s ops to complete), or else in one pass.
            pending = self._pending
            if not pending:
                return
            if pending[-1].owner is owner:
                pending.pop()
            elif pending[0].owner is owner:
                del pending[0]
            else:
                self._pending = [w for w in pending if w.owner is not owner]

    def stream_idle(self, stream: cu.Stream) -> None:
        """Everything queued on `stream` so far is over (it was synchronized)."""
        if self._unrecorded:
            with self._lock:
                self._unrecorded.pop(stream, None)
        if self._pending:
            self._drop(lambda w: w.stream is stream)

    def _drop(self, over: Callable[[_Work], bool]) -> None:
        with self._lock:
            kept = [w for w in self._pending if not over(w)]
            if len(kept) == len(self._pending):
                return
            dropped = {id(w.event): w.event for w in self._pending if w.owner is None}
            for w in kept:
                dropped.pop(id(w.event), None)
            self._pending = kept
            # A stream that waited on one of these events took its state at that call, so
            # recording it again later changes nothing for that stream.
            self._spare.extend(dropped.values())


def _finished(event: cu.Event) -> bool:
    try:
        return cu.event_query(event)
    except cu.CudaDriverError:
        return True  # finished, by failing; the work's own completion reports it
