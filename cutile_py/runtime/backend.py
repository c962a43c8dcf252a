"""The interface every backend implements: memory, modules, launches and their completion."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cutile_py.ptx.target import Target
from cutile_py.runtime.nvjitlink import AssemblyReport

#: The size of a tensor map: cuda.h's CUtensorMap, CU_TENSOR_MAP_NUM_QWORDS (16) words of 8 bytes.
TENSOR_MAP_BYTES = 128

#: Held while a launch or replay executes on the host (sim, interpret), so that a worker
#: thread's launch, one from the event loop's thread, and changes to the simulator's memory
#: map never overlap.
HOST_EXECUTION = threading.RLock()


class RuntimeFailure(RuntimeError):
    """A backend call failed (allocation, module load, launch)."""


class LaunchFailure(RuntimeFailure):
    """The device reported a fault while running a kernel."""


class Buffer(ABC):
    """A device allocation. Freed when garbage collected; callers keep it alive while in use."""

    nbytes: int

    @property
    @abstractmethod
    def address(self) -> int:
        """The address a kernel parameter carries (at least 256-byte aligned)."""


@dataclass(frozen=True)
class ParamValue:
    """One kernel parameter as `.param` declares it: PTX type (`u64`, `s32`, `f32`...) and value."""

    ptype: str
    value: int | float | bytes  # bytes: an array parameter (a tensor map)


#: Memory a launch reads or writes: (address, bytes, whether it writes). A backend with
#: streams orders launches on different streams by these alone.
Touch = tuple[int, int, bool]

#: What a synchronous launch touches, or a function that gives it, called only where the
#: backend needs it (work pending on other streams): a launch that waits at once records none.
LazyTouches = Sequence[Touch] | Callable[[], Sequence[Touch]] | None


class Completion(ABC):
    """The end of a piece of device work: poll it, or block until it has happened."""

    @abstractmethod
    def done(self) -> bool: ...

    @abstractmethod
    def wait(self) -> None:
        """Block until the work has finished; raise LaunchFailure if it faulted."""


class Finished(Completion):
    """Work that completed synchronously (the CPU backends)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        if self.error is not None:
            raise self.error


class LoadedKernel(ABC):
    """A kernel function of a loaded module, ready to launch."""

    name: str

    def assembly(self) -> AssemblyReport | None:
        """ptxas's report on the cubin this backend compiled the PTX to (registers, spills);
        None where it made none (the simulator runs the PTX itself)."""
        return None


class PreparedLaunch(ABC):
    """A kernel with its grid, block, dynamic shared memory and parameter types fixed, so that
    each launch passes only the parameter values, in declared order: the `.param` values where
    the backend runs PTX, the kernel's Python arguments where it runs the kernel's Python
    (`HostKernel`). Every launch of every launcher goes through one of these."""

    @property
    @abstractmethod
    def name(self) -> str:
        """The kernel's name, for messages."""

    @abstractmethod
    def launch(
        self,
        values: Sequence[Any],
        stream: object | None = None,
        touches: Sequence[Touch] | None = None,
    ) -> Completion:
        """Queue one launch on `stream` (None: the backend's default). `touches` is the memory
        it reads and writes (None: any, so it is ordered after all work in flight)."""

    def launch_and_wait(
        self,
        values: Sequence[Any],
        stream: object | None = None,
        touches: LazyTouches = None,
    ) -> None:
        """Launch and wait (a synchronous launch needs no completion object); a fault of the
        kernel raises `LaunchFailure`."""
        self.launch(values, stream, touches() if callable(touches) else touches).wait()

    def queue(
        self,
        values: Sequence[Any],
        stream: object | None = None,
        touches: LazyTouches = None,
    ) -> None:
        """Queue one launch that nothing will wait for by itself (a `.then` step with a later
        step on the same stream): work and host access later in `stream`'s order come after
        it, and launches on other streams are ordered after it as after an allocation (its
        memory is not recorded). A backend that executes on the host runs it (a fault raises
        `LaunchFailure`); on a device a fault surfaces at a later launch or wait there."""
        self.launch_and_wait(values, stream, touches)

    def run(
        self,
        values: Sequence[Any],
        stream: object | None = None,
        touches: LazyTouches = None,
        wait: bool = True,
    ) -> None:
        """`launch_and_wait` (with `wait`) or `queue`: the call of a synchronous launch and of
        a `.then` step (a backend may make it its one body of both, for a frame less)."""
        if wait:
            self.launch_and_wait(values, stream, touches)
        else:
            self.queue(values, stream, touches)

    def start(
        self,
        values: Sequence[Any],
        stream: object | None,
        touches: Sequence[Touch] | None,
        wait: bool,
    ) -> Completion:
        """`launch`, or with `wait` `launch_and_wait` with a fault of the kernel kept in the
        finished completion (its `wait()` reports it)."""
        if not wait:
            return self.launch(values, stream, touches)
        try:
            self.launch_and_wait(values, stream, touches)
        except LaunchFailure as e:
            return Finished(e)
        return Finished()


@dataclass(frozen=True)
class BoundLaunch:
    """One launch with its parameter values read: what a graph captures and replays."""

    launch: PreparedLaunch
    values: tuple[Any, ...]


@dataclass(frozen=True, eq=False)
class _PreparedThroughLaunch(PreparedLaunch):
    """What a backend without its own preparation does: `Backend.launch` with the values."""

    backend: Backend
    kernel: LoadedKernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    ptypes: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.kernel.name

    def launch(
        self,
        values: Sequence[Any],
        stream: object | None = None,
        touches: Sequence[Touch] | None = None,
    ) -> Completion:
        params = [ParamValue(t, v) for t, v in zip(self.ptypes, values)]
        return self.backend.launch(
            self.kernel, self.grid, self.block, self.shared_mem, params, stream, touches
        )


class HostKernel(LoadedKernel):
    """A kernel that runs as Python on the host (the interpreter): `run(grid, args)` runs
    every block of `grid` on the arguments and returns once done."""

    def __init__(
        self, name: str, run: Callable[[tuple[int, int, int], Sequence[Any]], Completion]
    ) -> None:
        self.name = name
        self.run = run


@dataclass(frozen=True, eq=False)
class _HostLaunch(PreparedLaunch):
    """A `HostKernel` over a fixed grid; its values are the kernel's Python arguments."""

    kernel: HostKernel
    grid: tuple[int, int, int]

    @property
    def name(self) -> str:
        return self.kernel.name

    def launch(
        self,
        values: Sequence[Any],
        stream: object | None = None,
        touches: Sequence[Touch] | None = None,
    ) -> Completion:
        return self.kernel.run(self.grid, values)


class GraphExec(ABC):
    """Captured launches, replayed in order as one unit of work."""

    @abstractmethod
    def launch(self, stream: object | None = None) -> Completion:
        """Queue one replay on `stream` (None: the backend's default). One at a time."""

    def launch_and_wait(self, stream: object | None = None) -> None:
        """Replay and wait (needs no completion object); a fault raises `LaunchFailure`."""
        self.launch(stream).wait()

    def destroy(self) -> None:
        """Free what the backend made for the graph (no replay may still be running)."""
        return None


class RecordedGraph(GraphExec):
    """The CPU backends' graph: the recorded launches, run again in order on each replay."""

    def __init__(self, backend: Backend, launches: Sequence[BoundLaunch]) -> None:
        self.backend = backend
        self.launches = tuple(launches)

    def launch(self, stream: object | None = None) -> Completion:
        for k in self.launches:
            try:
                # In order: a later launch may read what this one wrote.
                k.launch.launch(k.values, stream).wait()
            except RuntimeFailure as e:
                failure = type(e)(f"kernel {k.launch.name!r}: {e}")
                failure.__cause__ = e
                return Finished(failure)
        return Finished()


class Backend(ABC):
    name: str
    #: True where kernels run as PTX (cuda, sim); False where the kernel's Python runs (interpret).
    runs_ptx: bool
    #: True where a launch executes on the host before returning (sim, interpret), False where
    #: it is only queued on a device (cuda).
    executes_on_host: bool = False

    @property
    @abstractmethod
    def target(self) -> Target:
        """The architecture code is compiled for."""

    @abstractmethod
    def alloc(self, nbytes: int) -> Buffer: ...

    @abstractmethod
    def upload(self, buf: Buffer, data: np.ndarray) -> None:
        """Copy the bytes of the contiguous array `data` to the start of `buf`."""

    def fill(self, buf: Buffer, nbytes: int, element: bytes) -> None:
        """Set the first `nbytes` of `buf` to repeats of `element` (one element's bytes), in
        order with the backend's other work (on the device where there is one)."""
        if isinstance(buf, HostBuffer):
            width = len(element)
            view = buf.bytes[:nbytes].view(np.dtype(f"<u{width}"))
            view[...] = int.from_bytes(element, "little")
            return
        count = nbytes // len(element)
        self.upload(buf, np.frombuffer(element * count, dtype=np.uint8))

    @abstractmethod
    def download(self, buf: Buffer, nbytes: int) -> np.ndarray:
        """The first `nbytes` of `buf`, as a new uint8 host array (waits for pending work)."""

    def borrow_host(self, data: np.ndarray) -> Buffer:
        """A buffer over the host array `data` (zero-copy, never freed by us): CPU backends."""
        raise RuntimeFailure(f"the {self.name} backend cannot use host memory directly")

    def load_kernel(self, ptx: str, name: str) -> LoadedKernel:
        raise RuntimeFailure(f"the {self.name} backend does not run PTX")

    def tensor_map(
        self,
        dtype: int,
        address: int,
        dims: tuple[int, ...],
        strides: tuple[int, ...],
        box: tuple[int, ...],
        swizzle: int,
    ) -> bytes:
        """The 128-byte tiled tensor map a kernel's `cp.async.bulk.tensor` reads, passed as a
        `.param .align 64 .b8 [128]`. Arguments as `cuTensorMapEncodeTiled`'s: `dtype` a
        `CUtensorMapDataType`, `dims` innermost first, `strides` the byte strides of
        dimensions 1.., `box` the copied box, `swizzle` a `CUtensorMapSwizzle`; zero fill out
        of bounds. One call, two encodings: the driver's (opaque) on cuda, the simulator's on
        sim. ValueError names an argument that breaks the driver's documented rules."""
        raise RuntimeFailure(f"the {self.name} backend has no tensor maps")

    def resident_blocks(self, kernel: LoadedKernel, threads: int, shared_mem: int) -> int:
        """How many blocks of `kernel` (`threads` threads, `shared_mem` bytes of dynamic
        shared memory each) the device runs at once: its SMs times the blocks one SM holds
        (the size of a persistent grid)."""
        raise RuntimeFailure(f"the {self.name} backend does not run persistent kernels")

    def prepare(
        self,
        kernel: LoadedKernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        ptypes: Sequence[str],
    ) -> PreparedLaunch:
        """`kernel` ready to launch with only its parameter values (of PTX types `ptypes`):
        the entry every launcher uses (sync, await, `.then`, `ct.zip`, graph capture through
        `BoundLaunch`, `ct.RawKernel`). A backend that runs the kernel's Python prepares a
        `HostKernel` (no PTX types)."""
        return _PreparedThroughLaunch(self, kernel, grid, block, shared_mem, tuple(ptypes))

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
        """Queue a launch with its parameters typed one by one (what `prepare` gives a
        backend without its own preparation: sim); `stream` is a handle from
        `stream_acquire` (None: the default one); `touches` as for `PreparedLaunch.launch`."""
        raise RuntimeFailure(f"the {self.name} backend does not run PTX")

    def graph(self, launches: Sequence[BoundLaunch]) -> GraphExec:
        """Capture `launches` (run nothing now); the returned graph replays them in order."""
        return RecordedGraph(self, launches)

    # --- streams: the CPU backends finish every launch before returning, so theirs are trivial

    def stream_acquire(self) -> object | None:
        """A stream handle for `launch` (None where the backend has only one)."""
        return None

    def stream_release(self, handle: object | None) -> None:
        """Give back a handle of `stream_acquire`; work queued on it still runs to the end."""
        return None

    def stream_synchronize(self, handle: object | None) -> None:
        """Wait for all work queued on the stream `handle` (None: the default stream)."""
        return None

    def stream_address(self) -> int | None:
        """The default stream's address for other libraries (None: no stream to order on)."""
        return None

    def stream_from_foreign(self, address: int) -> object | None:
        """A handle for another library's stream (`__cuda_stream__`); never released by us.

        The CPU backends finish every launch before returning, so any stream will do.
        """
        return None


class HostBuffer(Buffer):
    """Memory of the CPU backends: a NumPy byte array, 256-byte aligned like a device allocation."""

    ALIGN = 256

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        raw = np.zeros(nbytes + self.ALIGN, dtype=np.uint8)
        start = (-raw.ctypes.data) % self.ALIGN
        self.bytes: np.ndarray = raw[start : start + nbytes]

    @classmethod
    def over(cls, data: np.ndarray) -> HostBuffer:
        """A buffer whose memory is the contiguous array `data` (borrowed, not copied)."""
        buf = cls.__new__(cls)
        buf.nbytes = data.nbytes
        buf.bytes = data.reshape(-1).view(np.uint8)
        return buf

    @property
    def address(self) -> int:
        return int(self.bytes.ctypes.data)

    def view(self, dtype: np.dtype[np.generic], count: int) -> np.ndarray:
        return self.bytes[: count * dtype.itemsize].view(dtype)


class InterpretBackend(Backend):
    """Runs the kernel's own Python on NumPy tiles (the host package drives the blocks)."""

    name = "interpret"
    runs_ptx = False
    executes_on_host = True

    @property
    def target(self) -> Target:
        return Target(80)

    def alloc(self, nbytes: int) -> Buffer:
        return HostBuffer(nbytes)

    def upload(self, buf: Buffer, data: np.ndarray) -> None:
        assert isinstance(buf, HostBuffer)
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        buf.bytes[: raw.size] = raw

    def borrow_host(self, data: np.ndarray) -> Buffer:
        return HostBuffer.over(data)

    def prepare(
        self,
        kernel: LoadedKernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        ptypes: Sequence[str],
    ) -> PreparedLaunch:
        if not isinstance(kernel, HostKernel):
            raise RuntimeFailure(f"the {self.name} backend does not run PTX")
        return _HostLaunch(kernel, grid)

    def download(self, buf: Buffer, nbytes: int) -> np.ndarray:
        assert isinstance(buf, HostBuffer)
        out: np.ndarray = np.array(buf.bytes[:nbytes], dtype=np.uint8)
        return out
