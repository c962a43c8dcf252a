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
from collections.abc import Callable
from typing import Any

from cutile_py.host.device_op import DeviceOp, OpLike
from cutile_py.host.errors import AliasError, BorrowError
from cutile_py.host.streams import StreamLike, async_stream
from cutile_py.host.tensor import Owned, Partition, Tensor


class _Once(OpLike):
    """An op-like that may be run (synced or awaited) only once."""

    _used = False

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
    """`first.then(fn)`: run `first`, then the op that `fn(first's result)` returns."""

    def __init__(self, first: OpLike, fn: Callable[[tuple[Any, ...]], OpLike]) -> None:
        if not isinstance(first, OpLike):
            raise TypeError(f"then: expected an op to chain from, got {type(first).__name__}")
        if not callable(fn):
            raise TypeError(f"then: expected a callable, got {type(fn).__name__}")
        self.first = first
        self.fn = fn

    def describe(self) -> str:
        return f"chain .then({getattr(self.fn, '__name__', 'fn')})"

    def _next(self, result: tuple[Any, ...]) -> OpLike:
        nxt = self.fn(result)
        if not isinstance(nxt, OpLike):
            raise TypeError(
                f"the function of {self.describe()} must return an op (a DeviceOp, chain or "
                f"zip), got {type(nxt).__name__}"
            )
        return nxt

    def sync(self) -> tuple[Any, ...]:
        self._use()
        return self._next(self.first.sync()).sync()

    def sync_on(self, stream: StreamLike) -> tuple[Any, ...]:
        self._use()
        return self._next(self.first.sync_on(stream)).sync_on(stream)

    def _record(self, launches: list[DeviceOp]) -> tuple[Any, ...]:
        self._use()
        # `fn` runs once, now, to build the next step; replays run the launches it made.
        return self._next(self.first._record(launches))._record(launches)

    async def _run_async(self) -> tuple[Any, ...]:
        self._use()
        result = await self.first
        return await self._next(result)

    def _ops(self) -> list[DeviceOp]:
        return [] if self._used else self.first._ops()

    def _members(self) -> list[OpLike]:
        return [self.first]


class Zip(_Once):
    """`ct.zip(op1, op2, ...)`: the ops run together; the result is the tuple of their results."""

    def __init__(self, ops: tuple[OpLike, ...]) -> None:
        for i, op in enumerate(ops):
            if not isinstance(op, OpLike):
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
            holds.extend((i, obj, exclusive) for obj, exclusive in d._held)
    spans = []
    for i, obj, exclusive in holds:
        t = obj.tensor if isinstance(obj, Partition) else obj
        if isinstance(t, Tensor):
            lo = t.buffer.address
            spans.append((i, obj, exclusive, lo, lo + t.nbytes))
    for k, (i1, o1, x1, lo1, hi1) in enumerate(spans):
        for i2, o2, x2, lo2, hi2 in spans[k + 1 :]:
            if i1 != i2 and (x1 or x2) and lo1 < hi2 and lo2 < hi1:
                same = f"the same {o1._kind}" if o1 is o2 else "overlapping memory"
                raise AliasError(
                    f"zip: ops {i1} and {i2} both use {same}, and at least one holds it "
                    "exclusively (Mut)"
                )
