"""`DeviceOp`: one checked launch that owns its arguments until it completes.

`OpLike` is what `.sync()`, `.sync_on(stream)`, `await` and `.then(fn)` work on: a `DeviceOp`,
or a chain or zip of them (`cutile_py.host.pipeline`).
"""

from __future__ import annotations

import asyncio
import sys
from abc import abstractmethod
from collections.abc import Callable, Coroutine, Generator, Sequence
from types import CodeType
from typing import TYPE_CHECKING, Any

from cutile_py.frontend.errors import CompileError
from cutile_py.host.errors import AliasError, BorrowError, LaunchError, MovedError
from cutile_py.host.launch import LaunchPlan
from cutile_py.host.streams import (
    StreamLike,
    as_stream,
    async_stream,
    finish_first,
    off_loop,
    settle,
    wait_done,
)
from cutile_py.host.tensor import (
    PACKAGE_DIR,
    Owned,
    Partition,
    Tensor,
    capturing,
    release_holds,
    take_holds,
)
from cutile_py.runtime import select as _select
from cutile_py.runtime.backend import (
    HOST_EXECUTION,
    Backend,
    BoundLaunch,
    Completion,
    Finished,
    LaunchFailure,
    RuntimeFailure,
    Touch,
)
from cutile_py.runtime.select import active_backend

if TYPE_CHECKING:
    from cutile_py.frontend.signature import Specialization
    from cutile_py.host.kernel import CompiledKernel, Kernel
    from cutile_py.host.pipeline import Chain


class OpLike(Coroutine[Any, Any, "tuple[Any, ...]"]):
    """Device work that owns its arguments until it completes and then hands them back.

    An op is a coroutine, so `asyncio.create_task(op)`, `asyncio.gather(op, ...)`,
    `asyncio.wait_for(op, t)` and `asyncio.run(op)` take it as they are. A task cancelled
    before the op ever ran hands the arguments back at once; after it has started, the
    cancellation waits for the device work (API.md rule 4).
    """

    # (Slots: a chain link is made per `.then`, and a slot is set faster than a dict entry.
    # A subclass without `__slots__` has a dict as usual.)
    __slots__ = ("__weakref__", "_driver")

    #: The run driven through the coroutine protocol (`send`/`throw`), once started (unset
    #: before: see `_started`).
    _driver: Generator[Any, None, tuple[Any, ...]]

    @abstractmethod
    def sync(self) -> tuple[Any, ...]:
        """Run (if not yet run), wait for completion and hand back the result."""

    @abstractmethod
    def sync_on(self, stream: StreamLike) -> tuple[Any, ...]:
        """Like `sync()`, launching on `stream` (a `ct.Stream`, or another library's stream
        object with `__cuda_stream__`)."""

    @abstractmethod
    async def _run_async(self) -> tuple[Any, ...]: ...

    @abstractmethod
    def _ops(self) -> list[DeviceOp]:
        """The launches that exist now (a chain's later ones are made when it runs)."""

    def _record(self, launches: list[DeviceOp]) -> tuple[Any, ...]:
        """For `ct.graph`: append the launches in run order without running them, and return
        the result that running would give."""
        raise TypeError(f"ct.graph cannot capture a {type(self).__name__}")

    def __await__(self) -> Generator[Any, None, tuple[Any, ...]]:
        """`await op`: like `sync()`, without blocking the event loop."""
        return self._run_async().__await__()

    # --- the coroutine protocol (what an asyncio task drives) -----------------------------

    def _started(self) -> Generator[Any, None, tuple[Any, ...]] | None:
        """The run the coroutine protocol drives, if it has started."""
        return getattr(self, "_driver", None)

    def send(self, value: Any, /) -> Any:
        driver = self._started()
        if driver is None:
            driver = self._driver = self.__await__()
        return driver.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None, /) -> Any:
        exc = typ if isinstance(typ, BaseException) else typ() if val is None else val
        driver = self._started()
        if driver is None:
            # Nothing ran and nothing will: the arguments go back to their owners now.
            self._abandon("its task was cancelled before it started")
            raise exc.with_traceback(tb) if tb is not None else exc
        return driver.throw(exc)

    def close(self) -> None:
        driver = self._started()
        if driver is not None:
            driver.close()

    @abstractmethod
    def _abandon(self, why: str) -> None:
        """Drop the launches not yet started, handing their arguments back (`why`: for the
        message a later use gets)."""

    def then(self, fn: Callable[[tuple[Any, ...]], OpLike]) -> Chain:
        """An op that runs this one, passes its result to `fn` and runs the op `fn` returns."""
        global _chain
        chain = _chain
        if chain is None:  # (pipeline imports this module; kept once found: a chain's step)
            from cutile_py.host.pipeline import Chain

            chain = _chain = Chain
        if not callable(fn):
            raise TypeError(f"then: expected a callable, got {type(fn).__name__}")
        # (`Chain(self, fn)` without `__init__`'s frame: `self` is an op, `fn` was checked.)
        link = chain.__new__(chain)
        link._used = False
        link.first = self
        link.fn = fn
        return link


#: `cutile_py.host.pipeline.Chain`, once `then` has imported it.
_chain: type[Chain] | None = None


class DeviceOp(OpLike):
    """A launch of a kernel on checked arguments; run it with `.sync()`.

    From construction until it completes, the op holds its `Partition` arguments exclusively
    and its `Tensor` arguments shared: the host cannot touch them (API.md §2, rules 1 to 5).
    """

    # The state of an op not yet run (class defaults: a launch sets only what differs).
    _completion: Completion | None = None
    #: An awaited launch executing off the event loop (CPU backends), until it returns.
    _launching: asyncio.Future[None] | None = None
    _finished = False
    _graphed = False
    #: Why the op ended without running (for messages).
    _abandoned: str | None = None
    #: What the op held when `ct.graph` captured it: the graph holds these instead.
    _graph_holds: Sequence[tuple[Owned, bool]] = ()
    #: The kernel's launch plan (None: a raw kernel's op, which launches on its own).
    _plan: LaunchPlan | None = None
    #: What the op holds (set as it takes its holds; None: what its plan's `admit` took,
    #: listed by `_holds()`).
    _held: Sequence[tuple[Owned, bool]] | None = ()

    def __init__(self, backend: Backend, kernel: Kernel, args: tuple[Any, ...], plan: LaunchPlan):
        self._setup(backend, kernel.name, args, plan.grid)
        self.kernel = kernel
        self._plan = plan

    def _setup(
        self, backend: Backend, name: str, args: tuple[Any, ...], grid: tuple[int, ...]
    ) -> None:
        """State every kind of op shares (a subclass launches something else: RawKernel)."""
        self.backend = backend
        self.name = name
        self.args = args
        self.grid = grid
        self._held = []
        self._made_where: tuple[CodeType, int] = _user_frame()

    @property
    def plan(self) -> LaunchPlan:
        """The kernel's launch plan (a raw kernel's op has none)."""
        plan = self._plan
        if plan is None:
            raise TypeError(f"this {self.describe()} has no launch plan")
        return plan

    @property
    def spec(self) -> Specialization:
        return self.plan.spec

    @property
    def compiled(self) -> CompiledKernel:
        return self.plan.compiled

    @property
    def _made_at(self) -> str:
        """Where the user made the op (`file:line`, for messages)."""
        code, offset = self._made_where
        return f"{code.co_filename}:{_line_at(code, offset)}"

    def describe(self) -> str:
        return f"launch of kernel {self.name}"

    def holding(self) -> str:
        if self._completion is None and self._launching is None:
            return (
                f"the pending {self.describe()} made at {self._made_at}, not run yet; run it "
                "(.sync() or await it), or drop it, to get the arguments back"
            )
        return f"the pending {self.describe()} made at {self._made_at}; await or .sync() it first"

    def _abandon(self, why: str) -> None:
        if self._completion is None and self._launching is None and not self._finished:
            self._abandoned = why
            self._finish()

    def param_names(self) -> list[str]:
        """The names of the parameters, in argument order (for messages)."""
        return [p.name for p in self.kernel.params]

    def _bound(self) -> BoundLaunch:
        """This launch with its parameters read, for a graph to capture (PTX from disk that
        does not load recompiles here)."""
        return self.plan.bind(self.args)

    def _record(self, launches: list[DeviceOp]) -> tuple[Any, ...]:
        self._check_pending()
        if self._completion is not None:
            raise BorrowError(
                f"ct.graph: this {self.describe()} is already running; a graph captures ops "
                "that have not been launched"
            )
        launches.append(self)
        capture = capturing.get()
        if capture is not None:
            capture.record(self.name, self.args)
        # Its arguments go on to the chain's next step now, and to the graph at the end.
        self._graph_holds = list(self._holds())
        self._graphed = True
        self._finish()
        return self.args

    def _holds(self) -> Sequence[tuple[Owned, bool]]:
        """What the op holds now: (object, exclusively) each."""
        held = self._held
        return self.plan.held(self.args) if held is None else held

    def _release(self) -> None:
        held = self._held
        if held is None:
            self.plan.release(self, self.args)
        else:
            release_holds(self, held)
        self._held = ()

    @property
    def empty(self) -> bool:
        """A launch over an empty partition: no blocks, nothing to run (API.md rule 6)."""
        return 0 in self.grid

    def _start(self, stream: object | None = None, wait: bool = False) -> Completion:
        """Queue the work on the backend (or run it, on the CPU backends). `wait`: the caller
        waits at once (a synchronous launch), so the backend may wait without an event."""
        plan = self.plan
        if plan.empty:
            return Finished()
        return plan.start(self.args, stream, wait)

    def _run(self, stream: object | None, wait: bool = True) -> None:
        """Launch and wait (or only queue: see `_sync_now`), on a backend that queues work,
        for an op without a plan (a raw kernel's): no completion object; `LaunchFailure` for
        a fault. A kernel's op runs its plan in `_sync_now`."""
        raise NotImplementedError(f"{type(self).__name__} launches through its plan")

    def _launch(self, stream: object | None = None, wait: bool = False) -> None:
        try:
            if self.backend.executes_on_host:
                with HOST_EXECUTION:
                    self._completion = self._start(stream, wait) if wait else self._start(stream)
            elif (plan := self._plan) is not None and not plan.empty:
                # (`_start` and `plan.start`, inline: every awaited launch comes here.)
                launch, read, touches = plan.launch, plan.read, plan.touches
                if wait or launch is None or read is None or touches is None:
                    self._completion = plan.start(self.args, stream, wait)
                else:
                    args = self.args
                    self._completion = launch.launch(read(args), stream, touches(args))
            else:
                self._completion = self._start(stream, wait) if wait else self._start(stream)
        except RuntimeFailure as e:
            self._finish()
            raise LaunchError(f"kernel {self.name} failed to launch: {e}") from e
        except Exception:
            self._finish()
            raise

    def _sync_now(self, stream: object | None, wait: bool = True) -> tuple[Any, ...]:
        """Launch, wait and hand back the arguments, on a backend that queues work: the
        synchronous launch's path, with no completion object. Without `wait` (a `.then` step
        that a later step follows on the same stream), the launch is only queued: what uses
        the arguments next is ordered after it by the stream (`PreparedLaunch.queue`)."""
        plan = self._plan
        try:
            if plan is None:
                self._run(stream, wait)
            elif not plan.empty:
                # (The memory touched is read only where the backend needs it.)
                launch = plan.launch or plan.prepare()
                read = plan.read
                if read is None:
                    launch.run(self.args, stream, None, wait)
                else:
                    launch.run(read(self.args), stream, self._touched, wait)
        except LaunchFailure as e:
            raise LaunchError(f"kernel {self.name} failed on the device: {e}") from e
        except RuntimeFailure as e:
            raise LaunchError(f"kernel {self.name} failed to launch: {e}") from e
        finally:
            self._finished = True
            held = self._held
            if held is None:  # (`_release`, inline: every launch ends here)
                assert plan is not None  # (only a plan's `admit` leaves None)
                plan.release(self, self.args)
            else:
                release_holds(self, held)
            self._held = ()
        return self.args

    def _touched(self) -> list[Touch]:
        """The memory the launch touches (read from its arguments when a backend asks)."""
        touches = self.plan.touches
        assert touches is not None, "a plan reads its touches with its parameters"
        return touches(self.args)

    def _finish(self) -> None:
        self._finished = True
        self._release()

    def _check_pending(self) -> None:
        if self._graphed:
            raise BorrowError(
                f"this {self.describe()} was captured by ct.graph(); replay the graph instead"
            )
        if self._abandoned is not None:
            raise BorrowError(
                f"this {self.describe()} never ran ({self._abandoned}) and has returned its "
                "arguments; make a new launch"
            )
        if self._finished:
            raise BorrowError(
                f"this {self.describe()} has already completed and returned its arguments"
            )

    def _complete(self) -> tuple[Any, ...]:
        """Wait for the launched work, release the holds and hand back the arguments."""
        assert self._completion is not None
        try:
            self._completion.wait()
        except RuntimeFailure as e:
            raise LaunchError(f"kernel {self.name} failed on the device: {e}") from e
        finally:
            self._finished = True
            held = self._held
            if held is None:  # (`_release`, inline: every launch ends here)
                self.plan.release(self, self.args)
            else:
                release_holds(self, held)
            self._held = ()
        return self.args

    def sync(self) -> tuple[Any, ...]:
        """Run (if not yet run), wait for completion and hand back the arguments, in order."""
        if self._finished:
            self._check_pending()
        if self._completion is None:
            if not self.backend.executes_on_host:
                return self._sync_now(None)
            self._launch(wait=True)
        return self._complete()

    def sync_on(self, stream: StreamLike) -> tuple[Any, ...]:
        """Launch on `stream` (if not yet launched), wait, and hand back the arguments."""
        self._check_pending()
        stream = as_stream(stream, self.backend)
        if stream.backend is not self.backend:
            raise ValueError(
                f"{self.describe()}: the stream is on the {stream.backend.name} backend, "
                f"the op on {self.backend.name}"
            )
        if self._completion is None:
            if not self.backend.executes_on_host:
                return self._sync_now(stream.handle)
            self._launch(stream.handle, wait=True)
        return self._complete()

    async def _run_async(self) -> tuple[Any, ...]:
        if self._finished:
            self._check_pending()
        if self._completion is None and self._launching is None:
            stream = async_stream(self.backend)
            if not self.backend.executes_on_host:
                self._launch(stream)  # queues the work and returns: no need to leave the loop
            else:
                # A task, so that every awaiter of this op waits for one launch.
                self._launching = asyncio.ensure_future(
                    off_loop(self.backend, lambda: self._launch(stream))
                )
        if self._launching is not None:
            launching = self._launching
            try:
                await asyncio.shield(launching)
            except asyncio.CancelledError:
                await finish_first(launching)  # rule 4: the launch ends before we let go
                if self._completion is not None:
                    await settle(self._completion)
                self._finish()
                raise
            finally:
                if launching.done():
                    self._launching = None
        if self._finished:  # a failed launch, or another awaiter that got there first
            self._check_pending()
        completion = self._completion
        assert completion is not None
        try:
            done = completion.done()  # (work found done needs no waiting coroutine)
        except Exception:
            done = True  # (as `is_done`: a failure to ask counts as done; `wait` reports it)
        if not done:
            await self._wait_launched(completion)
        return self._complete()

    def __await__(self) -> Generator[Any, None, tuple[Any, ...]]:
        """`await op`: on a backend that queues work (cuda), the launch is queued here, and
        work found done at once is handed back with no coroutine, task or future made."""
        if (
            self._completion is None
            and self._launching is None
            and not self._finished
            and not self.backend.executes_on_host
        ):
            self._launch(async_stream(self.backend))  # queues and returns: the loop stays free
            completion = self._completion
            assert completion is not None
            try:
                done = completion.done()  # (`is_done`, inline)
            except Exception:
                done = True  # (a failure to ask counts as done: `wait` reports it)
            if not done:
                yield from self._wait_launched(completion).__await__()
            return self._complete()
        return (yield from self._run_async().__await__())

    async def _wait_launched(self, completion: Completion) -> None:
        """Wait, without blocking the loop, for the launched work that `completion.done()`
        just said is not over; a cancellation still waits for it (rule 4)."""
        try:
            await wait_done(completion, asked=True)
        except asyncio.CancelledError:
            # Rule 4: the device may still use the arguments; hand them back only after.
            await settle(completion)
            self._finish()
            raise
        if self._finished:  # another task awaiting the same op got there first
            self._check_pending()

    def _ops(self) -> list[DeviceOp]:
        return [self]

    def __del__(self) -> None:
        # Rule 5: never let go of memory the device may still use; then release the holds.
        if self._finished:  # (a class default, so set even on an op half made)
            return
        try:
            if self._completion is not None:
                self._completion.wait()
        except Exception:
            pass
        self._release()

    def __repr__(self) -> str:
        state = "done" if self._finished else "launched" if self._completion else "pending"
        return f"<{type(self).__name__} {self.name} grid={self.grid} {state}>"


def launch_op(kernel: Kernel, *args: Any, **kwargs: Any) -> DeviceOp:
    """`Kernel.__call__` (every launch's first call, so one frame, not two): check `args`
    against `kernel`, compile on first use, and take ownership.

    With a plan made for arguments like these (the common case), the checks are the
    plan's: moves, holds and the backend of each tensor argument, then the overlap of each
    pair of them where one is Mut or Atomic; `plan.admit` runs them and takes the holds in
    straight-line code, and what it declines is checked one argument at a time
    (`_check_planned`), for the error naming the parameter or the allowed rare case."""
    try:
        if kwargs or len(args) != kernel._arity:
            args = kernel.bind_arguments(args, kwargs)
        backend = _select._instances.get(_select._active)  # type: ignore[arg-type]
        if backend is None:  # (`active_backend`, inline: the common case is one lookup)
            backend = active_backend()
        plan = kernel._find_plan(backend, args)  # (`kernel.plan`, one frame less)
        if plan is None:
            names = kernel.param_names
            kernel.specialize(args)  # TypeError / ValueError naming the parameter, first
            _check_ownership(kernel.name, names, args, backend, kernel.atomic_params)
            plan = kernel.make_plan(backend, args, _grid(kernel.name, names, args))
            checked = True
        else:
            checked = False
    except CompileError as err:
        raise err.with_traceback(None) from None  # the kernel's source line is shown below
    op = DeviceOp.__new__(DeviceOp)
    op.backend = backend
    op.name = kernel.name
    op.args = args
    op.grid = plan.grid
    op.kernel = kernel
    op._plan = plan
    frame = sys._getframe(1)  # (`_user_frame`, inline, with each code object's answer kept)
    code = frame.f_code
    while code not in _USER_CODE and frame.f_back is not None:
        if code not in _PACKAGE_CODE:
            if not code.co_filename.startswith(PACKAGE_DIR):
                _USER_CODE.add(code)
                break
            _PACKAGE_CODE.add(code)
        frame = frame.f_back
        code = frame.f_code
    op._made_where = (code, frame.f_lasti)  # (the line is looked up for a message only)
    # The common case in straight-line code; anything unusual, one argument at a time.
    if checked or not plan.admit(op, args, backend):
        if not checked:
            try:
                _check_planned(kernel, plan, args, backend)
            except BaseException:
                op._finished = True  # held nothing: nothing for its finalizer to do
                raise
        op._held = take_holds(op, _wanted(plan, args))
    return op


def _check_planned(
    kernel: Kernel, plan: LaunchPlan, args: tuple[Any, ...], backend: Backend
) -> None:
    """The ownership checks of a launch with a plan, one argument at a time (what the plan's
    `admit` declined): moves, holds and the backend of each tensor argument, then the
    overlap of each pair of them where one is exclusive."""
    names = kernel.param_names
    atomic = plan.atomic
    for i, mut in plan.tensors:
        a = args[i]
        t = a._tensor if mut else a
        if a._moved_at is not None or a._exclusive is not None or a._shared or t._escaped:
            _check_use(kernel.name, names[i], a, mut or i in atomic)
        if t._backend is not backend:
            _check_ownership(kernel.name, names, args, backend, atomic)  # raises
    for i, mi, j, mj in plan.pairs:
        a, b = args[i], args[j]
        ta = a._tensor if mi else a
        tb = b._tensor if mj else b
        lo1, lo2 = ta._address, tb._address
        if lo1 < lo2 + tb._nbytes and lo2 < lo1 + ta._nbytes:
            _alias_error(kernel.name, names[i], names[j], a is b)


def _wanted(plan: LaunchPlan, args: tuple[Any, ...]) -> list[tuple[Owned, bool]]:
    """What a launch holds: its Mut partitions and Atomic tensors exclusively, its other
    tensors shared (a tensor passed twice, once)."""
    wanted: list[tuple[Owned, bool]] = []
    shared: list[Tensor[Any]] = []
    for i, mut in plan.tensors:
        a = args[i]
        if mut or i in plan.atomic:  # an Atomic tensor is the op's alone too
            wanted.append((a, True))
        elif a not in shared:  # (by identity: tensors do not define ==)
            shared.append(a)
            wanted.append((a, False))
    return wanted


def _storage(a: Any) -> Tensor[Any] | None:
    if isinstance(a, Partition):
        return a.tensor
    return a if isinstance(a, Tensor) else None


def _check_ownership(
    kernel: str,
    names: Sequence[str],
    args: tuple[Any, ...],
    backend: Backend,
    atomic: frozenset[int] = frozenset(),
) -> None:
    """Moved, borrowed and aliased arguments, and tensors of another backend. The arguments
    at `atomic` are Atomic tensors: taken exclusively, as partitions are."""
    spans = []
    writes = False
    for i, (name, a) in enumerate(zip(names, args)):
        cls = type(a)
        exclusive = cls is Partition or i in atomic
        if cls is Partition:
            t = a._tensor
        elif cls is Tensor:
            t = a
        else:
            continue
        writes = writes or exclusive
        # The common case, checked inline: usable, held by nobody, memory nobody else views.
        if a._moved_at is not None or a._exclusive is not None or a._shared or t._escaped:
            _check_use(kernel, name, a, exclusive)
        if t._backend is not backend:
            raise ValueError(
                f"kernel {kernel}, parameter '{name}': the tensor lives on the "
                f"{t.device} backend but the active backend is {backend.name}"
            )
        lo = t._address
        spans.append((name, exclusive, a, lo, lo + t._nbytes))
    if not writes or len(spans) < 2:
        return
    for i, (n1, mut1, a1, lo1, hi1) in enumerate(spans):
        for n2, mut2, a2, lo2, hi2 in spans[i + 1 :]:
            if (mut1 or mut2) and lo1 < hi2 and lo2 < hi1:
                _alias_error(kernel, n1, n2, a1 is a2)


def _alias_error(kernel: str, n1: str, n2: str, same: bool) -> None:
    raise AliasError(
        f"kernel {kernel}: parameters '{n1}' and '{n2}' receive "
        f"{'the same partition' if same else 'overlapping memory'}, and at least one is Mut "
        "or Atomic (exclusive)"
    )


#: Code objects of cutile_py's own frames and of others, as `launch_op` finds them (bounded
#: by the program's code; a membership test is not a call, a `startswith` is).
_PACKAGE_CODE: set[CodeType] = set()
_USER_CODE: set[CodeType] = set()


def _user_frame() -> tuple[CodeType, int]:
    """(code, bytecode offset) of the innermost caller outside cutile_py (where the user made
    an op); its line is found (`_line_at`) only for a message."""
    frame = sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(PACKAGE_DIR):
        frame = frame.f_back
    return frame.f_code, frame.f_lasti


def _line_at(code: CodeType, offset: int) -> int:
    """The source line of the instruction at bytecode `offset` in `code` (what a frame's
    `f_lineno` gives, which costs a line-table walk on every launch if asked there)."""
    for start, end, line in code.co_lines():
        if start <= offset < end and line is not None:
            return line
    return code.co_firstlineno


def _check_use(kernel: str, name: str, a: Tensor[Any] | Partition, exclusive: bool) -> None:
    """Raise unless `a` may be passed to a launch now (naming the kernel and parameter)."""
    # Shared holds allow more shared use (a tensor that other pending ops read: no error
    # message is built for it); exclusive ones allow none.
    if exclusive or type(a) is not Tensor or a._moved_at is not None or a.held_exclusively:
        try:
            a._check_usable("pass it to a launch")
        except MovedError as e:
            raise MovedError(f"kernel {kernel}, parameter '{name}': {e}") from None
        except BorrowError as e:
            raise BorrowError(f"kernel {kernel}, parameter '{name}': {e}") from None
    if a._storage()._escaped:
        try:
            a._check_aliases("pass it to a launch", exclusive=exclusive)
        except BorrowError as e:
            raise BorrowError(f"kernel {kernel}, parameter '{name}': {e}") from None


def _grid(kernel: str, names: Sequence[str], args: tuple[Any, ...]) -> tuple[int, ...]:
    grid: tuple[int, ...] | None = None
    first = ""
    for name, a in zip(names, args):
        if isinstance(a, Partition):
            if grid is None:
                grid, first = a.grid, name
            elif a.grid != grid:
                raise ValueError(
                    f"kernel {kernel}: Mut parameters '{first}' (grid {grid}) and "
                    f"'{name}' (grid {a.grid}) must have the same grid of tiles"
                )
    if grid is None:
        raise ValueError(f"kernel {kernel} has no Mut parameter to take the launch grid from")
    if len(grid) > 1 and max(grid[1:]) > 65535:
        raise ValueError(f"kernel {kernel}: grid {grid} exceeds 65535 tiles along axis 1 or 2")
    return grid
