"""`ct.graph(op)`: capture an op (a launch, a chain or a zip) once, replay it many times.

Capturing runs nothing. Each launch is bound once, with its parameters packed: on `cuda` the
launches are recorded by CUDA stream capture into one executable graph (`cuGraphLaunch` per
replay); on `sim` and `interpret` the recorded launches run again, in order. A chain's
functions run once, at capture, to build the next steps: they must only build ops (the data
does not exist yet), as host code around CUDA stream capture runs once.

While the graph lives it holds its tensors: exclusively those its launches write (and
everything that overlaps them), shared those it only reads, which other launches may still
read. The host reaches them through `g.read` and `g.update`; `g.release()` hands the op's
result back, as `op.sync()` would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import numpy as np

from cutile_py.host.device_op import DeviceOp, OpLike
from cutile_py.host.errors import BorrowError, LaunchError, MovedError
from cutile_py.host.streams import (
    StreamLike,
    as_stream,
    async_stream,
    off_loop,
    settle,
    wait_done,
)
from cutile_py.host.tensor import (
    Capture,
    Owned,
    Partition,
    Tensor,
    alias_holder,
    caller_location,
    capturing,
    release_holds,
    take_hold,
)
from cutile_py.ir.dtypes import bf16, to_host, to_storage
from cutile_py.runtime.backend import (
    HOST_EXECUTION,
    Completion,
    GraphExec,
    LaunchFailure,
    RuntimeFailure,
)

AnyTensor = Tensor[Any, Any]


class _Executing(Completion):
    """A replay that a worker thread is about to run or running (sim, interpret)."""

    def __init__(self) -> None:
        self.finished = threading.Event()

    def done(self) -> bool:
        return self.finished.is_set()

    def wait(self) -> None:
        self.finished.wait()


class Graph:
    """A captured op; `replay()` runs it again on the same tensors. Made by `ct.graph(op)`."""

    def __init__(self, op: OpLike, name: str | None = None) -> None:
        if not isinstance(op, OpLike):
            raise TypeError(
                f"ct.graph: expected an op (a launch, .then chain or ct.zip), got "
                f"{type(op).__name__}"
            )
        self._name = name
        self._released_at: str | None = None
        self._in_flight: Completion | None = None
        #: The event loop of the last `replay_async` (see `_settle_orphaned_replay`).
        self._replay_loop: asyncio.AbstractEventLoop | None = None
        self._held: list[tuple[Owned, bool]] = []
        launches: list[DeviceOp] = []
        token = capturing.set(Capture(name))  # no host reads of the launches' memory meanwhile
        try:
            self._result = op._record(launches)  # nothing runs; the ops hold nothing after this
        finally:
            capturing.reset(token)
        self._launches = launches
        if not launches:
            raise ValueError("ct.graph: the op made no launches")
        self.backend = launches[0].backend
        for d in launches:
            if d.backend is not self.backend:
                raise ValueError(
                    f"ct.graph: {d.describe()} is on the {d.backend.name} backend, the first "
                    f"launch on {self.backend.name}; a graph runs on one backend"
                )
        # Each tensor or partition of the graph, with where it first appears (for messages).
        self._members: dict[int, tuple[Owned, str]] = {}
        for i, d in enumerate(launches):
            for pname, a in zip(d.param_names(), d.args):
                if isinstance(a, (Tensor, Partition)) and id(a) not in self._members:
                    where = f" (launch {i})" if len(launches) > 1 else ""
                    self._members[id(a)] = (a, f"'{pname}' of kernel {d.name}{where}")
        self._acquire()
        try:
            self._exec = self._capture()
        except BaseException:
            self._release_holds()
            raise

    # --- ownership ------------------------------------------------------------------------------

    def describe(self) -> str:
        if self._name is not None:
            return f"graph {self._name!r}"
        names = list(dict.fromkeys(d.name for d in self._launches))
        return f"graph of {', '.join(names)}"

    def holding(self) -> str:
        return (
            f"{self.describe()}; use the graph's .read() / .update(), or call its .release() "
            "to get the tensor back"
        )

    def _acquire(self) -> None:
        holds: dict[int, tuple[Owned, bool]] = {}
        for d in self._launches:
            for obj, exclusive in d._graph_holds:
                if obj.is_moved:  # consumed by a chain's step; its successor is held instead
                    continue
                prev = holds.get(id(obj))
                holds[id(obj)] = (obj, exclusive or (prev is not None and prev[1]))
        # Memory that a launch writes is the graph's alone, through every object that views it.
        written = [_span(o) for o, x in holds.values() if x]
        for key, (obj, exclusive) in holds.items():
            lo, hi = _span(obj)
            exclusive = exclusive or any(lo < h and l < hi for l, h in written)
            label = self._members.get(key, (obj, f"a {obj._kind}"))[1]
            holder = obj._holder()
            if holder is None or not (exclusive or obj.held_exclusively):
                holder = alias_holder(obj, exclusive, ignore=self)
            if holder is not None:
                self._release_holds()
                raise BorrowError(f"ct.graph: {label} is held by {holder.holding()}")
            self._held.append(take_hold(self, obj, exclusive))

    def _release_holds(self) -> None:
        release_holds(self, self._held)
        self._held = []

    def _capture(self) -> GraphExec:
        # Each launch bound through its plan's prepared launch, the path every launch takes
        # (a launch over no tiles runs nothing).
        live = [d for d in self._launches if not d.empty]
        try:
            return self.backend.graph([d._bound() for d in live])
        except RuntimeFailure as e:
            raise LaunchError(f"{self.describe()}: capture failed: {e}") from e

    def _check_live(self, action: str) -> None:
        self._settle_orphaned_replay()
        if self._released_at is not None:
            raise MovedError(
                f"cannot {action}: this {self.describe()} was released at {self._released_at}; "
                "capture a new one with ct.graph(op)"
            )
        if self._in_flight is not None:
            raise BorrowError(
                f"cannot {action}: a replay of this {self.describe()} is still running; "
                "await it first"
            )

    def _member(self, target: object, action: str) -> tuple[AnyTensor, str]:
        """The tensor behind `target` (a partition stands for its whole tensor) and its label."""
        if not isinstance(target, (Tensor, Partition)):
            raise TypeError(
                f"{self.describe()}.{action}: expected a Tensor or Partition, got "
                f"{type(target).__name__}"
            )
        entry = self._members.get(id(target))
        if target.is_moved:
            target._check_usable(f"{action} it through the {self.describe()}")
        if entry is None or entry[0] is not target:
            raise ValueError(
                f"{self.describe()}.{action}: this {target._kind} is not an argument of the "
                "graph's launches; use the tensor or partition that was passed to them"
            )
        return (target.tensor if isinstance(target, Partition) else target), entry[1]

    def _settle_orphaned_replay(self) -> None:
        """A replay whose `replay_async` can no longer resume (its event loop stopped or was
        closed with the await pending): wait for the device here, so that the graph stays
        usable and releasable. One awaited from a running loop is that await's to finish."""
        completion = self._in_flight
        loop = self._replay_loop
        if completion is None or loop is None or loop.is_running():
            return
        self._replay_loop = None
        if isinstance(completion, _Executing):
            completion.wait()
            if self._in_flight is None:  # it failed to launch; nothing runs
                return
            completion = self._in_flight
        self._complete(completion)

    # --- replaying ------------------------------------------------------------------------------

    def _launch(self, stream: object | None) -> Completion:
        try:
            if self.backend.executes_on_host:
                with HOST_EXECUTION:
                    self._in_flight = self._exec.launch(stream)
            else:
                self._in_flight = self._exec.launch(stream)
        except RuntimeFailure as e:
            self._in_flight = None
            raise LaunchError(f"{self.describe()}: replay failed to launch: {e}") from e
        return self._in_flight

    def _complete(self, completion: Completion) -> None:
        try:
            completion.wait()
        except RuntimeFailure as e:
            raise LaunchError(f"{self.describe()} failed on the device: {e}") from e
        finally:
            self._in_flight = None

    def replay(self, stream: StreamLike | None = None) -> None:
        """Run the captured launches, in order, and wait for them."""
        self._check_live("replay the graph")
        handle = None if stream is None else as_stream(stream, self.backend).handle
        if self.backend.executes_on_host:
            self._complete(self._launch(handle))
            return
        try:  # on the device: wait on the stream, with no completion event
            self._exec.launch_and_wait(handle)
        except LaunchFailure as e:
            raise LaunchError(f"{self.describe()} failed on the device: {e}") from e
        except RuntimeFailure as e:
            raise LaunchError(f"{self.describe()}: replay failed to launch: {e}") from e

    async def replay_async(self) -> None:
        """Like `replay()`, without blocking the event loop. Cancelling the awaiting task waits
        for the replay to finish before `CancelledError` propagates."""
        self._check_live("replay the graph")
        self._replay_loop = asyncio.get_running_loop()
        stream = async_stream(self.backend)
        if self.backend.executes_on_host:
            running = _Executing()
            self._in_flight = running  # until the worker thread has run the replay

            def work() -> Completion:
                try:
                    return self._launch(stream)
                finally:
                    running.finished.set()

            try:
                completion = await off_loop(self.backend, work)
            except asyncio.CancelledError:
                # off_loop let the launch finish first; the replay, too, ends before we let go.
                if self._in_flight is not None:
                    await settle(self._in_flight)
                self._in_flight = None
                raise
        else:
            completion = self._launch(stream)
        try:
            await wait_done(completion)
        except asyncio.CancelledError:
            await settle(completion)
            self._in_flight = None
            raise
        self._complete(completion)

    # --- the host's view of the graph's tensors -------------------------------------------------

    def read(self, tensor: Tensor[Any, Any] | Partition) -> np.ndarray:
        """A host copy of one of the graph's tensors (a partition reads as its whole tensor)."""
        self._check_live("read a tensor")
        t, _ = self._member(tensor, "read")
        raw = self.backend.download(t.buffer, t.nbytes)
        return to_host(raw.view(t.dtype.storage), t.dtype).reshape(t.shape)

    def update(self, tensor: Tensor[Any, Any] | Partition, values: np.ndarray) -> None:
        """Copy `values` (the tensor's shape and dtype; float32 for bf16) into one of the
        graph's tensors, for the next replay."""
        self._check_live("update a tensor")
        t, label = self._member(tensor, "update")
        for ref in tensor._shared:
            other = ref()
            if other is not None and other is not self:
                raise BorrowError(
                    f"{self.describe()}.update: {label} is also held by {other.holding()}"
                )
        other = alias_holder(t, exclusive=True, ignore=self)
        if other is not None:
            raise BorrowError(
                f"{self.describe()}.update: the memory of {label} is also viewed by another "
                f"tensor, held by {other.holding()}"
            )
        arr = np.asarray(values)
        if arr.shape != t.shape:
            raise ValueError(
                f"{self.describe()}.update: {label} has shape {t.shape}, the array "
                f"{arr.shape}; pass an array of the tensor's shape"
            )
        want = np.dtype(np.float32) if t.dtype is bf16 else t.dtype.storage
        if arr.dtype != want:
            raise TypeError(
                f"{self.describe()}.update: {label} is {t.dtype.name}, the array {arr.dtype}; "
                f"convert it with .astype(np.{want.name})"
            )
        if t.nbytes:
            self.backend.upload(t.buffer, np.ascontiguousarray(to_storage(arr, t.dtype)))

    def release(self) -> tuple[Any, ...]:
        """End the graph and hand back the op's result, as `op.sync()` would."""
        self._check_live("release the graph")
        self._exec.destroy()
        self._release_holds()
        self._released_at = caller_location()
        return self._result

    @property
    def launches(self) -> int:
        """How many kernel launches one replay makes."""
        return len(self._launches)

    def __del__(self) -> None:
        # Rule 5: a replay still running keeps its memory until it has finished.
        if getattr(self, "_released_at", "") is not None or not hasattr(self, "_exec"):
            return
        with contextlib.suppress(Exception):
            if self._in_flight is not None:
                self._in_flight.wait()
        with contextlib.suppress(Exception):
            self._exec.destroy()
        self._release_holds()

    def __repr__(self) -> str:
        state = "released" if self._released_at else "running" if self._in_flight else "ready"
        return f"<{self.describe()}: {len(self._launches)} launches, {state}>"


def _span(obj: Owned) -> tuple[int, int]:
    t = obj.tensor if isinstance(obj, Partition) else obj
    assert isinstance(t, Tensor)
    return t.buffer.address, t.buffer.address + t.nbytes


def graph(op: OpLike, *, name: str | None = None) -> Graph:
    """Capture `op` (a launch, a `.then` chain or a `ct.zip`) without running it.

    `g.replay()` / `await g.replay_async()` run it; `g.update(t, array)` and `g.read(t)` reach
    its tensors between replays; `g.release()` ends it and hands back the op's result.
    """
    return Graph(op, name)
