"""`ct.Stream`, and waiting for a `Completion` from asyncio without blocking the event loop.

A `Stream` wraps a handle of the active backend: a driver stream from a small pool on `cuda`,
nothing on the CPU backends (their launches finish before returning). Awaited ops are spread
over a few pooled streams per backend so that independent ones can overlap on the device.

Waiting polls `Completion.done()` from the event loop (`call_soon` a few times, then
`call_later` with a doubling delay): no thread per launch, and the loop stays free. The CPU
backends execute a launch before returning, so an awaited launch there runs in one worker
thread (`off_loop`), in the order awaited, while the loop serves other tasks.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from cutile_py.runtime.backend import Backend, Completion
from cutile_py.runtime.select import active_backend

#: Polls of `done()` on the next turns of the loop before backing off to timers.
_SPINS = 3
_FIRST_DELAY_S = 5e-5
_MAX_DELAY_S = 2e-3
#: Streams per backend that awaited ops launch on, round robin.
_ASYNC_STREAMS = 4


class Stream:
    """A queue of device work on the active backend: `op.sync_on(stream)` launches there.

    Ops launched on different streams may overlap. Dropping a stream never cancels or frees
    work queued on it; its driver stream goes back to a pool for the next `Stream`.
    """

    _producer: object = None  # the library object behind a foreign stream

    def __init__(self) -> None:
        self._bind(active_backend())

    def _bind(self, backend: Backend) -> None:
        self.backend: Backend = backend
        self.handle: object | None = backend.stream_acquire()
        self._finalizer = weakref.finalize(self, backend.stream_release, self.handle)
        self._finalizer.atexit = False

    @classmethod
    def _on(cls, backend: Backend) -> Stream:
        stream = cls.__new__(cls)
        stream._bind(backend)
        return stream

    @classmethod
    def _foreign(cls, backend: Backend, obj: CudaStreamLike) -> Stream:
        """A view of another library's stream; never released or destroyed by us."""
        proto = obj.__cuda_stream__
        version, address = proto() if callable(proto) else proto
        if not isinstance(address, int) or isinstance(address, bool):
            raise TypeError(
                f"{type(obj).__name__}.__cuda_stream__() must return (version, handle) with an "
                f"integer handle, got {(version, address)!r}"
            )
        stream = cls.__new__(cls)
        stream.backend = backend
        stream.handle = backend.stream_from_foreign(address)
        stream._producer = obj  # the foreign stream lives at least as long as this view
        return stream

    def synchronize(self) -> None:
        """Wait for all work queued on this stream."""
        self.backend.stream_synchronize(self.handle)

    def __repr__(self) -> str:
        return f"<Stream on {self.backend.name}>"


class CudaStreamLike(Protocol):
    """Another library's stream: cuda.core's protocol, `__cuda_stream__() -> (version, handle)`."""

    def __cuda_stream__(self) -> tuple[int, int]: ...


#: What `op.sync_on(...)` and `g.replay(...)` take.
StreamLike = Stream | CudaStreamLike


def as_stream(stream: object, backend: Backend) -> Stream:
    """`stream` as a `Stream` on `backend`; TypeError naming what was passed otherwise."""
    if isinstance(stream, Stream):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return Stream._foreign(backend, stream)
    raise TypeError(
        f"expected a ct.Stream or a stream object with __cuda_stream__ (cuda.core, PyTorch, "
        f"CuPy), got {type(stream).__name__}"
    )


_pools: weakref.WeakKeyDictionary[Backend, Iterator[Stream | None]] = weakref.WeakKeyDictionary()


#: The last backend `async_stream` served and its pool (every awaited launch asks).
_last: tuple[Backend, Iterator[Stream | None]] | None = None


def async_stream(backend: Backend) -> object | None:
    """The stream handle for the next awaited launch on `backend` (None: its default)."""
    global _last
    last = _last
    if last is not None and last[0] is backend:
        stream = next(last[1])
        return None if stream is None else stream.handle
    pool = _pools.get(backend)
    if pool is None:
        first = Stream._on(backend)
        if first.handle is None:  # a backend without streams
            pool = itertools.repeat(None)
        else:
            rest = (Stream._on(backend) for _ in range(_ASYNC_STREAMS - 1))
            pool = itertools.cycle([first, *rest])
        _pools[backend] = pool
    _last = (backend, pool)
    stream = next(pool)
    return None if stream is None else stream.handle


T = TypeVar("T")

_worker: ThreadPoolExecutor | None = None


def _host_worker() -> ThreadPoolExecutor:
    global _worker
    if _worker is None:
        # One thread: launches execute one at a time, in the order they were awaited.
        _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cutile_py-host")
    return _worker


async def off_loop(backend: Backend, work: Callable[[], T]) -> T:
    """`work()` (a launch or replay on `backend`) without blocking the event loop: on a
    backend that executes on the host, in the worker thread; on cuda, which only queues the
    work, right here. If the awaiting task is cancelled meanwhile, `work` still finishes
    first (the arguments stay the op's until it has), then `CancelledError` propagates."""
    if not backend.executes_on_host:
        return work()
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(_host_worker(), work)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await finish_first(fut)
        raise


async def finish_first(fut: asyncio.Future[T]) -> None:
    """Wait until `fut` is done, whatever cancellations arrive meanwhile (API rule 4); its
    outcome is left to whoever asks for it."""
    while not fut.done():
        try:
            await asyncio.wait([fut])
        except asyncio.CancelledError:
            continue
    if not fut.cancelled():
        fut.exception()  # retrieved: an error here is reported by the op, not asyncio's log


async def wait_done(completion: Completion, asked: bool = False) -> None:
    """Return once `completion.done()` (a failure counts as done: `wait()` reports it);
    `asked`: the caller has just found it not done (no need to ask again at once)."""
    if not asked and is_done(completion):
        return
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    polls = 0
    delay = _FIRST_DELAY_S

    def poll() -> None:
        nonlocal polls, delay
        if fut.done():  # the awaiting task was cancelled
            return
        if is_done(completion):
            fut.set_result(None)
            return
        polls += 1
        if polls <= _SPINS:
            loop.call_soon(poll)
        else:
            loop.call_later(delay, poll)
            delay = min(2 * delay, _MAX_DELAY_S)

    loop.call_soon(poll)
    await fut


async def settle(completion: Completion) -> None:
    """Like `wait_done`, but a further cancellation does not stop the wait (API rule 4)."""
    while True:
        try:
            await wait_done(completion)
            return
        except asyncio.CancelledError:
            continue


def is_done(completion: Completion) -> bool:
    """`completion.done()`; a failure to ask counts as done (`wait()` reports it)."""
    try:
        return completion.done()
    except Exception:
        return True
