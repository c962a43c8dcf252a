"""The CUDA backend: memory, modules and launches on one device through the driver API.

PTX is assembled with nvJitLink for the device's architecture where it is installed, and
otherwise compiled by the driver's JIT.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import struct
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from cutile_py.ptx.target import Target
from cutile_py.runtime import cuda_driver as cu
from cutile_py.runtime.backend import (
    Backend,
    BoundLaunch,
    Buffer,
    Completion,
    GraphExec,
    LaunchFailure,
    LazyTouches,
    LoadedKernel,
    ParamValue,
    PreparedLaunch,
    RuntimeFailure,
    Touch,
)
from cutile_py.runtime.cuda_ordering import StreamOrdering
from cutile_py.runtime.nvjitlink import (
    AssemblyReport,
    PtxAssemblyError,
    assemble,
    moves_registers,
    nvjitlink_available,
    report_from_log,
)


def _quietly(release: Callable[[], None]) -> None:
    # Finalizers run late (garbage collection in any thread, a context poisoned by a fault,
    # interpreter shutdown): a handle that cannot be released is simply leaked.
    with contextlib.suppress(Exception):
        release()


def _free(
    ctx: cu.Context, address: int, stream: cu.Stream | None, current: _PerThread | None = None
) -> None:
    try:  # (as `_quietly`, spelled out: every buffer ends here)
        if current is None or current.ctx is not ctx:  # (a collection may run in any thread)
            cu.set_current(ctx)
        if stream is None:
            cu.mem_free(address)
        else:
            # Back to the pool in the backend stream's order. The launches that used the
            # buffer are over by now (an op keeps its tensors until it is known to be done),
            # and later work of that stream runs after the free.
            cu.mem_free_async(address, stream)
    except Exception:
        pass  # a late free (a poisoned context, shutdown) leaks, as `_quietly` says


class Releases:
    """Frees of device memory, deferred while the backend captures a graph.

    A buffer can be garbage-collected in the middle of a stream capture, in the capturing
    thread; `cuMemFree` there is an unsafe call that invalidates the capture (and the free
    fails, leaking the memory). So frees made during a capture wait here and run when the
    last capture ends.
    """

    def __init__(
        self, ctx: cu.Context, stream: cu.Stream | None = None, current: _PerThread | None = None
    ) -> None:
        self._ctx = ctx
        #: Where memory goes back to its pool (None: `cuMemFree`, no pool).
        self._stream = stream
        #: Which context each thread has made current (the backend's): a free in a thread
        #: where `ctx` is current already needs no `cuCtxSetCurrent`.
        self._current = current
        # Reentrant: a collection can run a finalizer inside `capturing` in the same thread.
        self._lock = threading.RLock()
        self._captures = 0
        self._deferred: list[int] = []

    def free(self, address: int) -> None:
        """Free `address` now, or when the capture in progress ends."""
        with self._lock:
            if self._captures:
                self._deferred.append(address)
                return
        _free(self._ctx, address, self._stream, self._current)

    @property
    def deferred(self) -> int:
        """How many frees wait for a capture to end."""
        return len(self._deferred)

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Meanwhile (a stream capture), frees are deferred; at the end they run."""
        with self._lock:
            self._captures += 1
        try:
            yield
        finally:
            with self._lock:
                self._captures -= 1
                due: list[int] = []
                if not self._captures:
                    due, self._deferred = self._deferred, []
            for address in due:
                _free(self._ctx, address, self._stream)


def _destroy_event(ctx: cu.Context, event: cu.Event) -> None:
    def release() -> None:
        cu.set_current(ctx)
        cu.event_destroy(event)

    _quietly(release)


def _destroy_stream(ctx: cu.Context, stream: cu.Stream) -> None:
    def release() -> None:
        cu.set_current(ctx)
        cu.stream_destroy(stream)

    _quietly(release)


class CudaBuffer(Buffer):
    """A device allocation (from the device's memory pool, or `cuMemAlloc` where it has
    none), freed when garbage collected or by `free()`."""

    def __init__(self, releases: Releases, address: int, nbytes: int) -> None:
        self.nbytes = nbytes
        self._address = address
        self._releases: Releases | None = releases

    @property
    def address(self) -> int:
        return self._address

    def free(self) -> None:
        """Release the memory now (no kernel may still be using it); once."""
        releases, self._releases = self._releases, None
        if releases is not None:
            releases.free(self._address)

    def __del__(self) -> None:
        # (Not `weakref.finalize`: a buffer is made per allocation, and that costs more.) At
        # exit the driver may already be torn down: the process's memory goes with it.
        releases = self._releases
        if releases is not None and not sys.is_finalizing():
            self._releases = None
            releases.free(self._address)


class ForeignCudaBuffer(Buffer):
    """Device memory another library allocated (`ct.from_dlpack`); never freed by us.

    `owner` is the producer's object, kept alive as long as this buffer is.
    """

    def __init__(self, address: int, nbytes: int, owner: object) -> None:
        self.nbytes = nbytes
        self._address = address
        self.owner = owner

    @property
    def address(self) -> int:
        return self._address


#: Memory this backend reads and writes: its own, and other libraries' (`ct.from_dlpack`).
_DEVICE_BUFFERS = (CudaBuffer, ForeignCudaBuffer)


def _destroy_graph_exec(ctx: cu.Context, graph: cu.GraphExec) -> None:
    def release() -> None:
        cu.set_current(ctx)
        cu.graph_exec_destroy(graph)

    _quietly(release)


@dataclass(eq=False)
class CudaKernel(LoadedKernel):
    """A kernel function of a loaded module; `report` is ptxas's (nvJitLink's, or the driver
    JIT's from its log; None where neither said)."""

    name: str
    function: cu.Function
    module: cu.Module
    report: AssemblyReport | None
    max_dynamic_shared: int

    def assembly(self) -> AssemblyReport | None:
        return self.report


class CudaCompletion(Completion):
    """An event (from the backend's pool, given back when this is collected) recorded after a
    launch; once it is known to have passed, neither `done` nor `wait` calls the driver."""

    def __init__(self, backend: CudaBackend, event: cu.Event, kernel_name: str) -> None:
        self._backend = backend
        self._event = event
        self.kernel_name = kernel_name
        self._passed = False

    def done(self) -> bool:
        if self._passed:
            return True
        backend = self._backend
        dev = backend._device  # (`activate`, inline: every awaited launch asks at least once)
        if dev is None or backend._thread.ctx is not dev.ctx:
            backend.activate()
        try:
            finished = cu.event_query(self._event)
        except cu.CudaDriverError:
            finished = True  # by failing; wait() reports it
        else:
            self._passed = finished
        if finished:
            self._backend._ordering.finished(self)
        return finished

    def wait(self) -> None:
        if self._passed:
            return
        self._backend.activate()
        try:
            cu.event_synchronize(self._event)
        except cu.CudaDriverError as e:
            raise LaunchFailure(f"kernel {self.kernel_name!r} failed on the device: {e}") from e
        else:
            self._passed = True
        finally:
            self._backend._ordering.finished(self)

    def __del__(self) -> None:
        # Nothing waits on the event any more (pending ordering entries keep this object
        # alive), so another launch may record it: re-recording is legal whether or not the
        # work it marked has finished.
        self._backend._events.append(self._event)


class LaunchTimes:
    """Device time of the launches queued meanwhile in one thread (`CudaBackend.time_launches`):
    a pair of timing events recorded around each launch on its stream, so the host's work
    and its waits are not counted."""

    def __init__(self, ctx: cu.Context) -> None:
        self._pairs: list[tuple[cu.Event, cu.Event]] = []
        weakref.finalize(self, _destroy_events, ctx, self._pairs).atexit = False

    def begin(self, stream: cu.Stream) -> None:
        """Record the start of a launch about to be queued on `stream`."""
        start = cu.event_create(timing=True)
        self._pairs.append((start, start))
        cu.event_record(start, stream)

    def end(self, stream: cu.Stream) -> None:
        """Record the end of the launch just queued on `stream`."""
        start, _ = self._pairs[-1]
        stop = cu.event_create(timing=True)
        self._pairs[-1] = (start, stop)
        cu.event_record(stop, stream)

    @property
    def count(self) -> int:
        """How many launches were timed."""
        return len(self._pairs)

    def total_ms(self) -> float:
        """Milliseconds the timed launches ran on the device, summed (waits for them)."""
        total = 0.0
        for start, stop in self._pairs:
            cu.event_synchronize(stop)
            total += cu.event_elapsed_ms(start, stop)
        return total


def _destroy_events(ctx: cu.Context, pairs: list[tuple[cu.Event, cu.Event]]) -> None:
    for pair in pairs:
        for event in dict.fromkeys(pair):
            _destroy_event(ctx, event)


class CudaPreparedLaunch(PreparedLaunch):
    """A kernel with its launch shape fixed: a launch packs the values into a reusable
    parameter block (one per thread) and makes one driver call; a synchronous launch then
    waits on the stream, with no event."""

    def __init__(
        self,
        backend: CudaBackend,
        kernel: CudaKernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        ptypes: tuple[str, ...],
    ) -> None:
        self._backend = backend
        self._kernel = kernel
        self._grid = grid
        self._block = block
        self._shared_mem = shared_mem
        self._ptypes = ptypes
        # Unsupported parameter types fail here, not at a launch.
        self._spares: list[cu.ParamBlock] = [cu.ParamBlock(ptypes)]
        self._what = (
            f"launching kernel {kernel.name!r} (grid {grid}, block {block}, {shared_mem} B shared)"
        )

    @property
    def name(self) -> str:
        return self._kernel.name

    def run(
        self,
        values: Sequence[int | float | bytes],
        stream: object | None = None,
        touches: LazyTouches = None,
        wait: bool = True,
        unrecorded: bool = True,
    ) -> None:
        """Pack `values`, order the launch after the work it depends on, and queue it on
        `stream` (None: the backend's); with `wait`, wait for that stream too (a fault then
        raises `LaunchFailure`). Without it, and with `unrecorded`, note that `stream` has
        work no event marks (`queue`; `launch` records an event instead). The one body of
        every launch (a frame per launch saved: `launch_and_wait` and `queue` are this)."""
        backend = self._backend
        dev = backend._device  # (`activate`, inline)
        if dev is None or backend._thread.ctx is not dev.ctx:
            dev = backend.activate()
        on = dev.stream
        if stream is not None and stream is not on:
            if not isinstance(stream, cu.Stream):
                raise TypeError(f"the cuda backend cannot launch on a {type(stream).__name__}")
            on = stream
        # A spare block, taken (`pop` is atomic: two threads never share one; a thread that
        # finds none makes one) and put back after the launch, which copied the values out.
        try:
            params = self._spares.pop()
        except IndexError:
            params = cu.ParamBlock(self._ptypes)
        try:
            if not params.plain:
                params.pack(values)
            elif values != params.packed:  # (`params.pack`, inline; else the slots hold them)
                params.packed = None
                params.struct.pack_into(params.slots, 0, *values)
                if params.exact:
                    params.packed = list(values)
        except (TypeError, ValueError, OverflowError, struct.error):
            try:
                params.pack(values)  # raises the precise error
            except (TypeError, ValueError) as e:
                raise type(e)(f"kernel {self._kernel.name!r}: {e}") from e
            raise
        kernel = self._kernel
        try:
            if self._shared_mem > kernel.max_dynamic_shared:
                cu.set_max_dynamic_shared(kernel.function, self._shared_mem)
                kernel.max_dynamic_shared = self._shared_mem
            ordering = backend._ordering
            # (Its state read directly: this is every launch's path. Allocations leave the
            # backend stream unrecorded, which matters only to launches on other streams.)
            waits = ordering._unrecorded
            if (
                ordering._pending
                or (waits and on not in ordering.clean)
                or (touches is None and on is not dev.stream)
            ):
                backend._order(dev, on, touches() if callable(touches) else touches)
            timer = backend._thread.timer
            if timer is None:
                cu.launch_kernel_packed(
                    kernel.function, self._grid, self._block, self._shared_mem, on, params, wait
                )
                self._spares.append(params)
            else:
                timer.begin(on)
                cu.launch_kernel_packed(
                    kernel.function, self._grid, self._block, self._shared_mem, on, params
                )
                timer.end(on)
                if wait:
                    cu.stream_synchronize(on)
        except cu.CudaDriverError as e:
            if wait and e.call == "cuStreamSynchronize":
                backend._ordering.stream_idle(on)
                raise LaunchFailure(
                    f"kernel {kernel.name!r} (or work queued before it) failed on the device: {e}"
                ) from e
            raise backend._failure(self._what, e) from e
        if wait:
            if ordering._pending or waits:
                ordering.stream_idle(on)
        elif unrecorded:
            # No event marks its end: other streams' launches wait for `on` (a fence)
            # instead. (Already so, with no stream having waited since: nothing to note;
            # read unlocked, as a fence taken meanwhile is recorded after this launch anyway.)
            waited = waits.get(on)
            if waited is None or waited:
                ordering.unrecorded(on)

    def capture(self, values: Sequence[int | float | bytes], stream: cu.Stream) -> None:
        """Queue the launch on `stream`, which is capturing a graph: no ordering and no
        timing (what the capture records is the launch alone); `ready()` came first."""
        params = cu.ParamBlock(self._ptypes)  # (once per capture: no spare taken)
        try:
            params.pack(values)
        except (TypeError, ValueError) as e:
            raise type(e)(f"kernel {self._kernel.name!r}: {e}") from e
        cu.launch_kernel_packed(
            self._kernel.function, self._grid, self._block, self._shared_mem, stream, params
        )

    def ready(self) -> None:
        """Raise the kernel's dynamic shared memory limit to this launch's, where needed (an
        attribute call, which a stream capture cannot hold)."""
        kernel = self._kernel
        if self._shared_mem > kernel.max_dynamic_shared:
            cu.set_max_dynamic_shared(kernel.function, self._shared_mem)
            kernel.max_dynamic_shared = self._shared_mem

    def launch(
        self,
        values: Sequence[int | float | bytes],
        stream: object | None = None,
        touches: Sequence[Touch] | None = None,
    ) -> Completion:
        backend = self._backend
        dev = backend._device  # (`activate`, inline)
        if dev is None or backend._thread.ctx is not dev.ctx:
            dev = backend.activate()
        try:
            # Taken before the launch, so that a fault of this kernel cannot surface here
            # (`_take_event`, inline).
            event = backend._events.pop()
        except IndexError:
            try:
                event = cu.event_create()
            except cu.CudaDriverError as e:
                raise backend._failure(self._what, e) from e
        try:
            self.run(values, stream, touches, False, False)
        except BaseException:
            backend._events.append(event)
            raise
        on = dev.stream if stream is None else stream  # (`run` checked it)
        assert isinstance(on, cu.Stream)
        try:
            cu.event_record(event, on)
        except cu.CudaDriverError as e:
            backend._events.append(event)
            if e.is_device_fault:
                raise LaunchFailure(
                    f"kernel {self._kernel.name!r} (or work queued before it) failed on the "
                    f"device: {e}"
                ) from e
            raise backend._failure(self._what, e) from e
        done = CudaCompletion(backend, event, self._kernel.name)
        if touches:  # pending until `done` is known to be over
            backend._ordering.record(on, touches, event, done)
        return done

    def launch_and_wait(
        self,
        values: Sequence[int | float | bytes],
        stream: object | None = None,
        touches: LazyTouches = None,
    ) -> None:
        self.run(values, stream, touches)

    def queue(
        self,
        values: Sequence[int | float],
        stream: object | None = None,
        touches: LazyTouches = None,
    ) -> None:
        self.run(values, stream, touches, False)


class CudaGraph(GraphExec):
    """An instantiated CUDA graph: one `cuGraphLaunch` replays every captured launch."""

    def __init__(self, backend: CudaBackend, graph: cu.GraphExec, names: str) -> None:
        self._backend = backend
        self._graph = graph
        self.names = names
        self._finalizer = weakref.finalize(self, _destroy_graph_exec, backend.context, graph)
        self._finalizer.atexit = False

    def _queue(self, stream: object | None) -> cu.Stream:
        """Queue one replay (on the backend stream, or `stream`); the stream it went to."""
        backend = self._backend
        dev = backend.activate()
        on = stream if isinstance(stream, cu.Stream) else dev.stream
        try:
            if on is not dev.stream:
                backend._order_after_default(dev, on)  # uploads of g.update() come first
            timer = backend._thread.timer
            if timer is not None:
                timer.begin(on)
            cu.graph_launch(self._graph, on)
            if timer is not None:
                timer.end(on)
        except cu.CudaDriverError as e:
            raise backend._failure(f"replaying the graph of {self.names}", e) from e
        return on

    def launch(self, stream: object | None = None) -> Completion:
        backend = self._backend
        try:
            event = backend._take_event()
        except cu.CudaDriverError as e:
            raise backend._failure(f"replaying the graph of {self.names}", e) from e
        try:
            on = self._queue(stream)
            cu.event_record(event, on)
        except cu.CudaDriverError as e:
            backend._events.append(event)
            raise backend._failure(f"replaying the graph of {self.names}", e) from e
        except BaseException:
            backend._events.append(event)
            raise
        return CudaCompletion(backend, event, f"graph of {self.names}")

    def launch_and_wait(self, stream: object | None = None) -> None:
        on = self._queue(stream)
        try:
            cu.stream_synchronize(on)
        except cu.CudaDriverError as e:
            raise LaunchFailure(f"graph of {self.names} failed on the device: {e}") from e
        finally:
            self._backend._ordering.stream_idle(on)

    def destroy(self) -> None:
        self._finalizer()


class _PerThread(threading.local):
    """A backend's state in each thread (read on every launch: plain attributes, no getattr
    with a default)."""

    #: The context made current in this thread by `activate`.
    ctx: cu.Context | None = None
    #: The device timing of launches in progress in this thread (`time_launches`).
    timer: LaunchTimes | None = None


@dataclass(frozen=True)
class _Device:
    ctx: cu.Context
    stream: cu.Stream
    target: Target
    name: str
    releases: Releases
    #: Whether memory comes from the device's stream-ordered pool (`cuMemAllocAsync`).
    pooled: bool


class CudaBackend(Backend):
    """Runs PTX on a CUDA device (device 0 unless told), initialized at first use."""

    name = "cuda"
    runs_ptx = True

    def __init__(self, ordinal: int = 0) -> None:
        self.ordinal = ordinal
        self._lock = threading.Lock()
        self._thread = _PerThread()
        self._device: _Device | None = None
        self._modules: dict[str, tuple[cu.Module, AssemblyReport | None]] = {}
        self._kernels: dict[tuple[str, str], CudaKernel] = {}
        # Streams of `ct.Stream` objects that were let go, for the next ones (never destroyed
        # while the backend lives, so work still queued on them runs to the end).
        self._stream_pool: list[cu.Stream] = []
        self._fence: cu.Event | None = None
        #: Completion events to record again (made on demand, kept while the backend lives).
        self._events: list[cu.Event] = []
        #: Pending device work by the memory it touches, for ordering across streams.
        self._ordering = StreamOrdering()

    # --- context ----------------------------------------------------------------------------

    def _init(self) -> _Device:
        with self._lock:
            if self._device is not None:
                return self._device
            try:
                ctx = cu.retain_primary_context(self.ordinal)
                cu.set_current(ctx)
                major, minor = cu.compute_capability(self.ordinal)
                shared_optin = cu.max_shared_optin(self.ordinal)
                name = cu.device_name(self.ordinal)
                stream = cu.stream_create(non_blocking=True)
            except RuntimeError as e:  # CudaDriverError, or the bindings' "no driver library"
                raise RuntimeFailure(f"the CUDA backend cannot start: {e}") from e
            try:
                target = Target(major * 10 + minor, shared_optin)
            except ValueError as e:
                raise RuntimeFailure(f"{name}: {e}") from e
            weakref.finalize(self, _destroy_stream, ctx, stream).atexit = False
            pooled = self._pool_memory()
            releases = Releases(ctx, stream if pooled else None, self._thread)
            self._device = _Device(ctx, stream, target, name, releases, pooled)
            return self._device

    def _pool_memory(self) -> bool:
        """Whether allocations come from the device's default memory pool, made to keep
        freed memory for the next ones; False where the device has no pools (or refuses)."""
        try:
            if not cu.memory_pools_supported(self.ordinal):
                return False
            cu.keep_pool_memory(self.ordinal)
        except cu.CudaDriverError:
            return False
        return True

    def activate(self) -> _Device:
        """The device, initialized and its context current in the calling thread."""
        dev = self._device or self._init()
        # The driver keeps the current context per thread.
        if self._thread.ctx is not dev.ctx:
            try:
                cu.set_current(dev.ctx)
            except cu.CudaDriverError as e:
                raise RuntimeFailure(str(e)) from e
            self._thread.ctx = dev.ctx
        return dev

    @property
    def context(self) -> cu.Context:
        return self.activate().ctx

    @property
    def target(self) -> Target:
        return self.activate().target

    @property
    def device_name(self) -> str:
        return self.activate().name

    @staticmethod
    def _failure(what: str, e: cu.CudaDriverError) -> RuntimeFailure:
        if e.is_device_fault:
            return LaunchFailure(f"{what}: a kernel launched earlier faulted: {e}")
        return RuntimeFailure(f"{what}: {e}")

    @contextlib.contextmanager
    def time_launches(self) -> Iterator[LaunchTimes]:
        """Meanwhile, every launch and graph replay that this thread queues is timed on the
        device (events around it on its stream); read the sum with `total_ms()` after."""
        times = LaunchTimes(self.activate().ctx)
        outer = self._thread.timer
        self._thread.timer = times
        try:
            yield times
        finally:
            self._thread.timer = outer

    # --- memory -----------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> CudaBuffer:
        dev = self.activate()
        try:
            address = self._allocate(dev, nbytes)
        except cu.CudaDriverError as e:
            if e.name != "CUDA_ERROR_OUT_OF_MEMORY":
                raise self._failure(f"allocating {nbytes} bytes", e) from e
            address = self._allocate_after_out_of_memory(dev, nbytes)
        return CudaBuffer(dev.releases, address, nbytes)

    def _allocate_after_out_of_memory(self, dev: _Device, nbytes: int) -> int:
        """Retry an allocation the device refused: after collecting garbage buffers (their
        memory goes back), then, with a pool, after the backend stream has reached the frees
        queued on it and the pool has handed its freed memory back to the OS (the pool keeps
        all of it otherwise, which another allocator in the process may need, and which may be
        cut in sizes that do not fit this one). RuntimeFailure if it still does not fit."""
        gc.collect()
        try:
            return self._allocate(dev, nbytes)
        except cu.CudaDriverError as e:
            if e.name != "CUDA_ERROR_OUT_OF_MEMORY" or not dev.pooled:
                raise self._failure(f"allocating {nbytes} bytes", e) from e
        try:
            self.synchronize()
            cu.trim_pool_memory(self.ordinal)
            return self._allocate(dev, nbytes)
        except cu.CudaDriverError as e:
            raise self._failure(f"allocating {nbytes} bytes", e) from e

    def _allocate(self, dev: _Device, nbytes: int) -> int:
        if not dev.pooled:
            return cu.mem_alloc(nbytes)
        address = cu.mem_alloc_async(nbytes, dev.stream)
        # The memory exists from this point of the backend stream on: work of other streams
        # waits for that point (a fence there when they launch; no event per allocation).
        self._ordering.unrecorded(dev.stream)
        return address

    def fill(self, buf: Buffer, nbytes: int, element: bytes) -> None:
        if not isinstance(buf, _DEVICE_BUFFERS):
            raise TypeError(f"the cuda backend cannot write to a {type(buf).__name__}")
        width = len(element)
        if width == 8:  # no 64-bit memset: two 32-bit halves alike, or the values uploaded
            if element[:4] != element[4:]:
                super().fill(buf, nbytes, element)
                return
            element, width = element[:4], 4
        dev = self.activate()
        try:
            value = int.from_bytes(element, "little")
            cu.memset_async(buf.address, value, width, nbytes // width, dev.stream)
            self._ordering.record(dev.stream, ((buf.address, nbytes, True),))
        except cu.CudaDriverError as e:
            raise self._failure("filling device memory", e) from e

    def upload(self, buf: Buffer, data: np.ndarray) -> None:
        if not isinstance(buf, _DEVICE_BUFFERS):
            raise TypeError(f"the cuda backend cannot write to a {type(buf).__name__}")
        src = np.ascontiguousarray(data)
        if src.nbytes > buf.nbytes:
            raise ValueError(f"{src.nbytes} bytes do not fit a {buf.nbytes}-byte buffer")
        dev = self.activate()
        try:
            cu.memcpy_htod(buf.address, src, dev.stream)
            self._ordering.record(dev.stream, ((buf.address, src.nbytes, True),))
        except cu.CudaDriverError as e:
            raise self._failure("uploading to the device", e) from e

    def tensor_map(
        self,
        dtype: int,
        address: int,
        dims: tuple[int, ...],
        strides: tuple[int, ...],
        box: tuple[int, ...],
        swizzle: int,
    ) -> bytes:
        """The driver's encoding (`cuTensorMapEncodeTiled`)."""
        return cu.encode_tensor_map(dtype, address, dims, strides, box, swizzle)

    def download(self, buf: Buffer, nbytes: int) -> np.ndarray:
        if not isinstance(buf, _DEVICE_BUFFERS):
            raise TypeError(f"the cuda backend cannot read from a {type(buf).__name__}")
        if nbytes > buf.nbytes:
            raise ValueError(f"cannot read {nbytes} bytes from a {buf.nbytes}-byte buffer")
        dev = self.activate()
        out = np.empty(nbytes, dtype=np.uint8)
        try:
            self._ordering.order(dev.stream, ((buf.address, nbytes, False),))
            cu.memcpy_dtoh(out, buf.address, dev.stream)  # synchronizes the stream
        except cu.CudaDriverError as e:
            raise self._failure("downloading from the device", e) from e
        self._ordering.stream_idle(dev.stream)
        return out

    def synchronize(self) -> None:
        """Wait for all work queued on the backend stream."""
        dev = self.activate()
        try:
            cu.stream_synchronize(dev.stream)
        except cu.CudaDriverError as e:
            raise self._failure("synchronizing", e) from e
        self._ordering.stream_idle(dev.stream)

    # --- streams ----------------------------------------------------------------------------

    def stream_acquire(self) -> cu.Stream:
        """A non-blocking driver stream, from the pool of released ones where there is one."""
        dev = self.activate()
        with self._lock:
            if self._stream_pool:
                return self._stream_pool.pop()
        try:
            stream = cu.stream_create(non_blocking=True)
        except cu.CudaDriverError as e:
            raise self._failure("creating a stream", e) from e
        weakref.finalize(self, _destroy_stream, dev.ctx, stream).atexit = False
        return stream

    def stream_release(self, handle: object | None) -> None:
        if isinstance(handle, cu.Stream):
            with self._lock:
                self._stream_pool.append(handle)

    def stream_synchronize(self, handle: object | None) -> None:
        dev = self.activate()
        stream = handle if isinstance(handle, cu.Stream) else dev.stream
        try:
            cu.stream_synchronize(stream)
        except cu.CudaDriverError as e:
            raise self._failure("synchronizing a stream", e) from e
        self._ordering.stream_idle(stream)

    def stream_address(self) -> int:
        return cu.stream_handle(self.activate().stream)

    def stream_from_foreign(self, address: int) -> cu.Stream:
        self.activate()
        return cu.stream_from_handle(address)

    def _order(self, dev: _Device, stream: cu.Stream, touches: Sequence[Touch] | None) -> None:
        """Make a launch about to be queued on `stream` wait for the pending work of other
        streams that it conflicts with, by the memory it `touches`. None: it may touch
        anything, so it waits for all of it (and for everything on the backend stream)."""
        if touches is None and stream is not dev.stream:
            self._order_after_default(dev, stream)
        self._ordering.order(stream, touches)

    def _take_event(self) -> cu.Event:
        """An event to record after a launch: a pooled one, or a new one."""
        try:
            return self._events.pop()  # atomic: threads may launch at once
        except IndexError:
            return cu.event_create()

    def _order_after_default(self, dev: _Device, stream: cu.Stream) -> None:
        """Make `stream` wait for the work on the backend stream (uploads, earlier launches)."""
        if self._fence is None:
            fence = cu.event_create()
            weakref.finalize(self, _destroy_event, dev.ctx, fence).atexit = False
            self._fence = fence
        # Another thread may record the fence again in between: a later point of the same
        # stream, which orders at least as much.
        cu.event_record(self._fence, dev.stream)
        cu.stream_wait_event(stream, self._fence)

    # --- modules ----------------------------------------------------------------------------

    def _load_module(self, ptx: str, dev: _Device) -> tuple[cu.Module, AssemblyReport | None]:
        # nvJitLink first (it reports registers and spills); where it fails (an architecture
        # or PTX version newer than the wheel knows) or the driver refuses its cubin, the
        # driver's own JIT may still take the PTX.
        refused = ""
        if nvjitlink_available():
            try:
                report = assemble(ptx, dev.target)
            except PtxAssemblyError as e:
                refused = f"nvJitLink failed for {dev.target.name}: {e}"
            else:
                if moves_registers(ptx):
                    # ptxas ignores setmaxnreg when it compiles for linking, as nvJitLink
                    # does (warning C7504): a warp-specialized kernel moves registers only
                    # when the driver's JIT compiles it whole, and that compile's log says
                    # what it spills. nvJitLink's cubin (the same kernel, registers capped
                    # by .maxnreg) is the fallback.
                    try:
                        module, log = cu.module_load_ptx(ptx)
                        return module, report_from_log(log)
                    except cu.CudaDriverError as e:
                        if e.is_device_fault:
                            raise self._failure("loading a module", e) from e
                try:
                    return cu.module_load_data(report.cubin), report
                except cu.CudaDriverError as e:
                    if e.is_device_fault:
                        raise self._failure("loading a module", e) from e
                    refused = f"the driver refused nvJitLink's cubin: {e}"
        try:
            module, log = cu.module_load_ptx(ptx)
            return module, report_from_log(log)
        except cu.CudaDriverError as e:
            if e.is_device_fault:
                raise self._failure("loading a module", e) from e
            note = f"\n\nbefore that, {refused}" if refused else ""
            raise RuntimeFailure(f"the driver JIT refused the PTX: {e}{note}") from e

    def load_kernel(self, ptx: str, name: str) -> CudaKernel:
        key = hashlib.sha256(ptx.encode()).hexdigest()
        cached = self._kernels.get((key, name))
        if cached is not None:
            return cached
        dev = self.activate()
        with self._lock:
            cached = self._kernels.get((key, name))
            if cached is not None:
                return cached
            loaded = self._modules.get(key)
            if loaded is None:
                loaded = self._modules[key] = self._load_module(ptx, dev)
            module, report = loaded
            try:
                function = cu.module_get_function(module, name)
                max_shared = cu.max_dynamic_shared(function)
            except cu.CudaDriverError as e:
                raise self._failure(f"kernel {name!r}", e) from e
            kernel = CudaKernel(name, function, module, report, max_shared)
            self._kernels[(key, name)] = kernel
            return kernel

    # --- launches ---------------------------------------------------------------------------

    def resident_blocks(self, kernel: LoadedKernel, threads: int, shared_mem: int) -> int:
        if not isinstance(kernel, CudaKernel):
            raise TypeError(f"the cuda backend cannot size a {type(kernel).__name__}")
        self.activate()
        try:
            # The query counts no block whose dynamic shared memory the function does not
            # allow yet (a launch allows it first, too).
            if shared_mem > kernel.max_dynamic_shared:
                cu.set_max_dynamic_shared(kernel.function, shared_mem)
                kernel.max_dynamic_shared = shared_mem
            per_sm = cu.blocks_per_sm(kernel.function, threads, shared_mem)
            sms = cu.sm_count(self.ordinal)
        except cu.CudaDriverError as e:
            raise self._failure(f"kernel {kernel.name!r}", e) from e
        return max(1, per_sm) * max(1, sms)

    def prepare(
        self,
        kernel: LoadedKernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        ptypes: Sequence[str],
    ) -> CudaPreparedLaunch:
        if not isinstance(kernel, CudaKernel):
            raise TypeError(f"the cuda backend cannot launch a {type(kernel).__name__}")
        return CudaPreparedLaunch(self, kernel, grid, block, shared_mem, tuple(ptypes))

    def launch(
        self,
        kernel: LoadedKernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        params: Sequence[ParamValue],
        stream: object | None = None,
        touches: Sequence[Touch] | None = None,
    ) -> Completion:
        prepared = self.prepare(kernel, grid, block, shared_mem, [p.ptype for p in params])
        return prepared.launch([p.value for p in params], stream, touches)

    # --- graphs -----------------------------------------------------------------------------

    def graph(self, launches: Sequence[BoundLaunch]) -> CudaGraph:
        """Stream capture of `launches`, each through its prepared launch (the path every
        launch takes, less ordering and timing): the driver copies the packed parameters
        into the graph."""
        dev = self.activate()
        prepared: list[CudaPreparedLaunch] = []
        for k in launches:
            launch = k.launch
            if not isinstance(launch, CudaPreparedLaunch) or launch._backend is not self:
                raise TypeError(f"the cuda backend cannot capture a {type(launch).__name__}")
            prepared.append(launch)
        names = ", ".join(dict.fromkeys(k.launch.name for k in launches)) or "nothing"
        # A stream of our own: no other thread queues work on it while it captures.
        stream = self.stream_acquire()
        try:
            for launch in prepared:  # outside the capture: attribute calls are not captured
                launch.ready()
            with dev.releases.capturing():
                cu.stream_begin_capture(stream)
                try:
                    for launch, k in zip(prepared, launches):
                        launch.capture(k.values, stream)
                except BaseException:
                    # End the capture, or the stream stays unusable for the next `ct.Stream`.
                    with contextlib.suppress(Exception):
                        cu.graph_destroy(cu.stream_end_capture(stream))
                    raise
                graph = cu.stream_end_capture(stream)
            try:
                exec_ = cu.graph_instantiate(graph)
            finally:
                cu.graph_destroy(graph)
        except cu.CudaDriverError as e:
            raise self._failure(f"capturing the graph of {names}", e) from e
        finally:
            self.stream_release(stream)
        return CudaGraph(self, exec_, names)

    # --- interop ----------------------------------------------------------------------------

    def borrow_foreign(self, obj: object) -> tuple[ForeignCudaBuffer, tuple[int, ...], np.dtype]:
        """Device memory of another library's array (DLPack or CUDA Array Interface), zero-copy.

        Its pending work is ordered before this backend's stream.
        """
        dev_stream = self.activate().stream
        consumer = cu.stream_handle(dev_stream)
        try:
            view = cu.foreign_array(obj, consumer)
        except _FOREIGN_FAILURES as e:
            raise TypeError(
                f"ct.from_dlpack(obj): cannot borrow obj, a {type(obj).__name__}: "
                f"{type(e).__name__}: {e}"
            ) from e
        check_foreign(view, self.ordinal, type(obj).__name__)
        nbytes = int(np.prod(view.shape, dtype=np.int64)) * view.dtype.itemsize
        try:
            # The producer's pending work was ordered before the backend stream: launches
            # on other streams that use this memory wait for that point of it.
            self._ordering.record(dev_stream, ((view.address, nbytes, True),))
        except cu.CudaDriverError as e:
            raise self._failure("ordering after another library's work", e) from e
        # DLPack: the producer's memory is ours until the capsule's deleter runs, which
        # happens when cuda.core's view dies; so the buffer keeps the view, and the object.
        return ForeignCudaBuffer(view.address, nbytes, (obj, view.view)), view.shape, view.dtype


#: What importing another library's array can raise: no cuda-core (ImportError), a producer
#: that refuses (BufferError, TypeError, ValueError, AttributeError), cuda.core's own refusals
#: (RuntimeError; NotImplementedError, e.g. bf16 without ml_dtypes).
_FOREIGN_FAILURES = (
    ImportError,
    AttributeError,
    BufferError,
    TypeError,
    ValueError,
    RuntimeError,
    NotImplementedError,
)


def check_foreign(view: cu.ForeignArray, ordinal: int, what: str) -> None:
    """Raise unless `view` is C-contiguous, writable memory of device `ordinal`."""
    if not view.device_accessible or view.device_id < 0:
        raise ValueError(
            f"ct.from_dlpack: the {what} lives in host memory; on the cuda backend use "
            "ct.from_numpy(...) to copy it to the device"
        )
    if view.device_id != ordinal:
        raise ValueError(
            f"ct.from_dlpack: the {what} is on device {view.device_id}, the backend on "
            f"device {ordinal}"
        )
    if view.readonly:
        raise ValueError(f"ct.from_dlpack: the {what} is read-only")
    expected = [1] * len(view.shape)
    for i in range(len(view.shape) - 2, -1, -1):
        expected[i] = expected[i + 1] * view.shape[i + 1]
    if view.strides is not None and any(
        s != e for s, e, d in zip(view.strides, expected, view.shape) if d > 1
    ):
        raise ValueError(
            f"ct.from_dlpack: the {what} is not C-contiguous (strides {view.strides} in "
            "elements); make a contiguous copy first"
        )
