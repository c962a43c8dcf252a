"""Composing ops: `op.then(fn)` chains and `ct.zip(op1, op2, ...)`.

Both are op-like (`sync()`, `sync_on(stream)`, `await`, `then`) and run at most once. A chain
completes each step before calling `fn` with its result (the arguments are handed back to
`fn`, which builds the next launch from them). A zip runs its ops together and returns the
tuple of their results; its ops' ownership is checked across them when the zip is made.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, TypeGuard, cast

from cutile_py.host.device_op import DeviceOp, OpLike
from cutile_py.host.errors import AliasError, BorrowError, LaunchError
from cutile_py.host.streams import StreamLike, async_stream
from cutile_py.host.tensor import Owned
from cutile_py.runtime.backend import Backend, RuntimeFailure


class _Once(OpLike):
    """An op-like that may be run (synced or awaited) only once."""

    __slots__ = ("_used",)

    #: Whether it has run (or started to); set False by each constructor.
    _used: bool

    def _use(self) -> None:
        if self._used:
            raise BorrowError(f"this {self.describe()} has already run and returned its result")
        self._used = True

    def describe(self) -> str:
        return type(self).__name__.lower()

    def _abandon(self, why: str) -> None:
        if not self._used:
            self._used = True
            for op in self._members():
                op._abandon(why)

    @abstractmethod
    def _members(self) -> list[OpLike]:
        """The ops this one runs that exist now."""


class Chain(_Once):
    """`first.then(fn)`: run `first`, then the op that `fn(first's result)` returns.

    Chains run iteratively: a chain built by a long `.then(...).then(...)` series, or by a
    function that returns a new chain at every step, runs in constant Python stack depth.
    """

    __slots__ = ("first", "fn")

    def __init__(self, first: OpLike, fn: Callable[[tuple[Any, ...]], OpLike]) -> None:
        if type(first) not in _OPS and not isinstance(first, OpLike):
            raise TypeError(f"then: expected an op to chain from, got {type(first).__name__}")
        if not callable(fn):
            raise TypeError(f"then: expected a callable, got {type(fn).__name__}")
        self._used = False
        self.first = first
        self.fn = fn

    def describe(self) -> str:
        return f"chain .then({getattr(self.fn, '__name__', 'fn')})"

    def _next(self, result: tuple[Any, ...]) -> OpLike:
        return self._checked(self.fn(result))

    def _checked(self, nxt: object) -> OpLike:
        """`nxt`, what the function returned, if it is an op; else TypeError."""
        if type(nxt) not in _OPS and not isinstance(nxt, OpLike):
            raise TypeError(
                f"the function of {self.describe()} must return an op (a DeviceOp, chain or "
                f"zip), got {type(nxt).__name__}"
            )
        return cast(OpLike, nxt)

    @staticmethod
    def _unwind(op: OpLike, pending: deque[Chain]) -> OpLike:
        """The op to run next (not a chain); the chains on `op`'s left spine go in front of
        `pending`, in the order their functions are to be called."""
        while type(op) is Chain or _is_chain(op):
            if op._used:
                op._use()  # raises
            op._used = True
            pending.appendleft(op)
            op = op.first
        return op

    def _drive(self, run: Callable[[OpLike], tuple[Any, ...]]) -> tuple[Any, ...]:
        pending: deque[Chain] = deque()
        result = run(self._unwind(self, pending))
        while pending:
            result = run(self._unwind(pending.popleft()._next(result), pending))
        return result

    def sync(self) -> tuple[Any, ...]:
        # `_drive(lambda op: op.sync())`, spelled out: a chain's step costs this loop's turn.
        # A step that another follows is only queued where the backend queues work (cuda):
        # the next one runs after it on the same stream, and so does any host access to its
        # arguments (downloads wait on that stream; other streams are fenced after it), so
        # only the last step waits, for them all.
        pending: deque[Chain] = deque()
        op = self._unwind(self, pending)
        queued: Backend | None = None  # where steps were queued and not waited for
        while pending:
            if (
                (type(op) is DeviceOp or _is_launch(op))
                and op._completion is None  # (not launched yet: else it waits, as it would)
                and not op._finished
            ):
                backend = op.backend
                if backend.executes_on_host:
                    result = op.sync()
                else:
                    result = op._sync_now(None, False)
                    queued = backend
            else:
                result = op.sync()
            chain = pending.popleft()
            op = chain.fn(result)  # (`_next`, inline)
            if type(op) is not DeviceOp:
                op = chain._checked(op)
                if _is_chain(op):
                    op = self._unwind(op, pending)
        if queued is None:
            return op.sync()
        waits = (
            _is_launch(op)
            and op.backend is queued
            and op._completion is None
            and not op._finished
            and (op._plan is None or not op._plan.empty)  # (a raw kernel's op has no plan)
        )
        result = op.sync()  # (a launch that waits on the backend's stream: for all of them)
        if not waits:
            try:
                queued.stream_synchronize(None)
            except RuntimeFailure as e:
                raise LaunchError(f"a step of this {self.describe()} failed: {e}") from e
        return result

    def sync_on(self, stream: StreamLike) -> tuple[Any, ...]:
        return self._drive(lambda op: op.sync_on(stream))

    def _record(self, launches: list[DeviceOp]) -> tuple[Any, ...]:
        # Each `fn` runs once, now, to build the next step; replays run the launches it made.
        return self._drive(lambda op: op._record(launches))

    async def _run_async(self) -> tuple[Any, ...]:
        pending: deque[Chain] = deque()
        result = await self._unwind(self, pending)
        while pending:
            result = await self._unwind(pending.popleft()._next(result), pending)
        return result

    def _base(self) -> OpLike | None:
        """The op this chain runs first (not a chain), or None once the chain has run."""
        op: OpLike = self
        while isinstance(op, Chain):
            if op._used:
                return None
            op = op.first
        return op

    def _ops(self) -> list[DeviceOp]:
        base = self._base()
        return [] if base is None else base._ops()

    def _members(self) -> list[OpLike]:
        return [self.first]

    def _abandon(self, why: str) -> None:
        base = self._base()
        op: OpLike = self
        while isinstance(op, Chain) and not op._used:
            op._used = True
            op = op.first
        if base is not None:
            base._abandon(why)


class Zip(_Once):
    """`ct.zip(op1, op2, ...)`: the ops run together; the result is the tuple of their results."""

    __slots__ = ("ops",)

    def __init__(self, ops: tuple[OpLike, ...]) -> None:
        self._used = False
        for i, op in enumerate(ops):
            if type(op) not in _OPS and not isinstance(op, OpLike):
                raise TypeError(f"zip: argument {i} is a {type(op).__name__}, not an op")
        _check_disjoint(ops)
        self.ops = ops

    def _ops(self) -> list[DeviceOp]:
        return [] if self._used else [d for op in self.ops for d in op._ops()]

    def _members(self) -> list[OpLike]:
        return list(self.ops)

    def sync(self) -> tuple[Any, ...]:
        self._use()
        # Everything is queued before anything is waited for, so that the ops can overlap.
        for d in self._ops_now():
            # (On the CPU backends a launch executes: each member's await runs it off the loop.)
            if d._completion is None and not d._finished and not d.backend.executes_on_host:
                try:
                    d._launch()
                except BaseException:
                    self._drain()
                    raise
        return self._collect(lambda op: op.sync())

    def sync_on(self, stream: StreamLike) -> tuple[Any, ...]:
        self._use()
        return self._collect(lambda op: op.sync_on(stream))

    def _record(self, launches: list[DeviceOp]) -> tuple[Any, ...]:
        self._use()
        results = []
        for op in self.ops:
            try:
                results.append(op._record(launches))
            except BaseException:
                self._drain()  # the members not captured give their arguments back
                raise
        return tuple(results)

    def _ops_now(self) -> list[DeviceOp]:
        return [d for op in self.ops for d in op._ops()]

    def _drain(self) -> None:
        """After a failure: every op completes (or is released unlaunched); none stays held."""
        for op in self.ops:
            for d in op._ops():
                if d._finished:
                    continue
                if d._completion is not None:
                    with contextlib.suppress(Exception):
                        d._completion.wait()
                d._finish()

    def _collect(self, run: Callable[[OpLike], tuple[Any, ...]]) -> tuple[Any, ...]:
        results: list[tuple[Any, ...]] = []
        error: BaseException | None = None
        for op in self.ops:
            try:
                results.append(run(op))
            except BaseException as e:  # finish the others before reporting the first failure
                if error is None:
                    error = e
                results.append(())
        if error is not None:
            self._drain()
            raise error
        return tuple(results)

    async def _run_async(self) -> tuple[Any, ...]:
        self._use()
        # Launched first, each on the next pooled stream, so that independent ops overlap.
        for d in self._ops_now():
            if d._completion is None and not d._finished:
                try:
                    d._launch(async_stream(d.backend))
                except BaseException:
                    self._drain()
                    raise
        # gather waits for every member, cancelled or not, before it reports (rule 4).
        results = await asyncio.gather(*self.ops, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return tuple(results)


#: The op types that need no ABC instance check (OpLike is a Coroutine, an ABC).
_OPS = frozenset([DeviceOp, Chain, Zip])


def _is_launch(op: object) -> TypeGuard[DeviceOp]:
    """`isinstance(op, DeviceOp)` (a kernel's or a raw kernel's launch), without the ABC check
    for the usual types."""
    cls = type(op)
    return cls is DeviceOp or (cls not in _OPS and isinstance(op, DeviceOp))


def _is_chain(op: object) -> TypeGuard[Chain]:
    """`isinstance(op, Chain)`, without the ABC check for the usual types."""
    cls = type(op)
    return cls is Chain or (cls not in _OPS and isinstance(op, Chain))


def zip(*ops: OpLike) -> Zip:
    """Run `ops` together; `sync()` / `await` give the tuple of their results, in order.

    The ops' arguments are checked across them: the same partition (or overlapping memory where
    one use is exclusive) in two of them raises `ct.AliasError`, as within one launch.
    """
    return Zip(ops)


def _check_disjoint(ops: tuple[OpLike, ...]) -> None:
    seen: dict[int, int] = {}
    holds: list[tuple[int, Owned, bool]] = []
    for i, op in enumerate(ops):
        for d in op._ops():
            if d._finished:
                raise BorrowError(
                    f"zip: argument {i}: this {d.describe()} has already completed "
                    "and returned its arguments"
                )
            if id(d) in seen:
                raise AliasError(
                    f"zip: arguments {seen[id(d)]} and {i} are the same {d.describe()}"
                )
            seen[id(d)] = i
            held = d._held
            if held is None:  # (what its plan's `admit` took: `d._holds()`, inline)
                plan, args = d.plan, d.args
                atomic = plan.atomic
                holds.extend((i, args[j], mut or j in atomic) for j, mut in plan.tensors)
            else:
                holds.extend((i, obj, exclusive) for obj, exclusive in held)
    spans: list[_Span] = []
    for i, obj, exclusive in holds:
        t = obj._storage()
        if t._nbytes:
            lo = t._address
            # (tuple.__new__: the named tuple's own constructor is a Python call per span.)
            spans.append(tuple.__new__(_Span, (lo, lo + t._nbytes, i, exclusive, obj)))
    clash = _first_clash(spans)
    if clash is not None:
        s1, s2 = sorted(clash, key=lambda s: s.op)
        same = f"the same {s1.obj._kind}" if s1.obj is s2.obj else "overlapping memory"
        raise AliasError(
            f"zip: ops {s1.op} and {s2.op} both use {same}, and at least one holds it "
            "exclusively (Mut)"
        )


class _Span(NamedTuple):
    """Memory one op of a zip holds: bytes [lo, hi) of one allocation."""

    lo: int
    hi: int
    op: int  # the op's position in the zip
    exclusive: bool
    obj: Owned


class _Reach:
    """Of the spans seen so far, the two reaching furthest (highest `hi`) that belong to
    different ops: any span overlapping an earlier one of another op overlaps one of them."""

    def __init__(self) -> None:
        self.best: _Span | None = None
        self.other: _Span | None = None  # the furthest of an op other than best's

    def add(self, s: _Span) -> None:
        best = self.best
        if best is None or s.hi > best.hi:
            if best is not None and best.op != s.op:
                self.other = best  # else `other` (of an op other than s's) stays right
            self.best = s
        elif s.op != best.op and (self.other is None or s.hi > self.other.hi):
            self.other = s

    def overlapping(self, s: _Span) -> _Span | None:
        """An earlier span of another op that reaches past `s.lo`, if any."""
        for c in (self.best, self.other):
            if c is not None and c.op != s.op and c.hi > s.lo:
                return c
        return None


def _first_clash(spans: list[_Span]) -> tuple[_Span, _Span] | None:
    """Two spans of different ops that overlap where at least one is exclusive, or None.

    One sweep in address order (O(n log n), not pairwise): a span overlaps an earlier one
    exactly when that one reaches past its start; an exclusive span may clash with any earlier
    span, a shared one only with an earlier exclusive span."""
    anything, exclusive = _Reach(), _Reach()
    for s in sorted(spans, key=lambda s: s.lo):
        hit = (anything if s.exclusive else exclusive).overlapping(s)
        if hit is not None:
            return hit, s
        anything.add(s)
        if s.exclusive:
            exclusive.add(s)
    return None
