"""A null device: the CUDA driver's bindings replaced by calls that succeed at once.

The real `cuda` backend runs over it unchanged, so timing a launch times only cutile_py's
host work (argument checks, ownership, parameter packing, the calls it makes): the numbers
`python -m paper_repro host` reports on any CPU. Memory is never touched; kernels never run.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from cutile_py.runtime import cuda_driver

#: Where the driver library lives under each system's loader.
DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


def _driver_loadable() -> bool:
    """Whether the system's loader finds a CUDA driver library here."""
    for name in DRIVER_LIBRARIES:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


@functools.cache
def _missing_library_error(real: Any) -> type[BaseException] | None:
    """The exception the bindings raise for want of the driver library, where none can be
    loaded here (then a binding converts its arguments and fails before any driver code
    runs); None where a driver library is there, however the bindings' probe went. The
    probe takes no arguments, so whatever it raises is the library's absence, by whatever
    name this version of the bindings gives it (cuda.pathfinder's DynamicLibNotFoundError
    in 13.x); the loader's own look-up decides that none is there."""
    try:
        real.cuDriverGetVersion()
    except Exception as e:
        return None if _driver_loadable() else type(e)
    return None


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The argument types of a call, lists and tuples by their elements' types too."""
    return tuple(
        (type(a), tuple(type(x) for x in a)) if isinstance(a, (list, tuple)) else type(a)
        for a in args
    )


class BindingCheck:
    """Passes each call's arguments through the real binding of the same name, once per
    distinct argument types. The bindings convert their arguments before they load the
    driver and refuse what the driver's C types do not take (a Python int for a
    `cuuint32_t`, a str for a handle: TypeError), so a stand-in that took anything would
    hide such a call until a GPU ran it. On a machine with no driver library the call then
    fails to load it, which is the check passing; where a driver is installed nothing is
    called (the `gpu` tests run the real calls)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self._missing = _missing_library_error(real)
        self.active = self._missing is not None
        self._seen: set[tuple[str, tuple[Any, ...]]] = set()
        self._inside = threading.local()

    def __call__(self, name: str, args: tuple[Any, ...]) -> None:
        # A call made while this thread is inside a real binding (a `__del__` that frees
        # memory, run by the garbage collector there) is not checked: the bindings' attempt
        # to load the driver holds a lock that a nested attempt would wait on for ever.
        if not self.active or getattr(self._inside, "busy", False):
            return
        key = (name, _signature(args))
        if key in self._seen:
            return
        self._inside.busy = True
        try:
            getattr(self.real, name)(*args)
        except Exception as e:
            if type(e) is not self._missing:
                raise TypeError(f"the real binding refuses {name}{args!r}: {e}") from e
        finally:
            self._inside.busy = False
        self._seen.add(key)


class NullDriver:
    """`cuda.bindings.driver` with every function returning success and a fresh handle; with
    `check_arguments`, each call's arguments first pass the real binding (`BindingCheck`)."""

    def __init__(
        self,
        real: Any,
        compute_capability: tuple[int, int] = (9, 0),
        check_arguments: bool = False,
    ) -> None:
        self._real = real
        self._check = BindingCheck(real) if check_arguments else None
        #: Tensor maps are checked unasked (nothing is called where a driver is installed).
        self._encode_check = self._check or BindingCheck(real)
        self._ok = real.CUresult.CUDA_SUCCESS
        self._cc = compute_capability
        self._next_address = 1 << 32
        self._handles = itertools.count(1)
        self.calls = 0
        #: The arguments of each cuTensorMapEncodeTiled call, in order (sized integers as ints).
        self.tensor_maps: list[tuple[Any, ...]] = []
        if self._check is not None:  # the stand-in's own calls, checked like the rest
            for name in dir(type(self)):
                if name.startswith("cu"):
                    setattr(self, name, self._checked(name, getattr(self, name)))

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._real, name)
        if not name.startswith("cu") or not callable(real) or isinstance(real, type):
            value = real  # enums and handle types
        else:
            value = self._generic
            if self._check is not None:
                value = self._checked(name, value)
        setattr(self, name, value)  # found once: the stand-in costs one call, as a binding does
        return value

    def _checked(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        check = self._check
        assert check is not None

        def call(*args: Any) -> Any:
            check(name, args)
            return fn(*args)

        return call

    def _generic(self, *args: Any) -> tuple[Any, ...]:
        self.calls += 1
        return (self._ok, next(self._handles))

    def cuDeviceGetAttribute(self, attr: Any, dev: Any) -> tuple[Any, ...]:
        names = self._real.CUdevice_attribute
        if attr == names.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
            return (self._ok, self._cc[0])
        if attr == names.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
            return (self._ok, self._cc[1])
        return (self._ok, 227 * 1024)  # shared memory limits and the like

    def cuDeviceGetName(self, length: int, dev: Any) -> tuple[Any, ...]:
        return (self._ok, b"null device\x00")

    def cuDeviceGetCount(self) -> tuple[Any, ...]:
        return (self._ok, 1)

    def cuDriverGetVersion(self) -> tuple[Any, ...]:
        return (self._ok, 13000)

    def cuMemAlloc(self, nbytes: int) -> tuple[Any, ...]:
        self.calls += 1
        address = self._next_address
        self._next_address += (nbytes + 4095) // 4096 * 4096 or 4096  # never reused
        return (self._ok, self._real.CUdeviceptr(address))

    def cuMemAllocAsync(self, nbytes: int, stream: Any) -> tuple[Any, ...]:
        return self.cuMemAlloc(nbytes)

    def cuMemAllocFromPoolAsync(self, nbytes: int, *args: Any) -> tuple[Any, ...]:
        return self.cuMemAlloc(nbytes)

    def cuFuncGetAttribute(self, attr: Any, fn: Any) -> tuple[Any, ...]:
        return (self._ok, 48 * 1024)

    def cuEventQuery(self, event: Any) -> tuple[Any, ...]:
        return (self._ok,)

    def cuEventElapsedTime(self, start: Any, end: Any) -> tuple[Any, ...]:
        return (self._ok, 0.0)

    def cuTensorMapEncodeTiled(self, *args: Any) -> tuple[Any, ...]:
        """Recorded, once the real bindings have taken the arguments (`BindingCheck`, with or
        without `check_arguments`): they refuse a Python int where a sized integer type is due
        (a stand-in that took anything hid that until a GPU ran it). The map is the bindings'
        own (zeroed) CUtensorMap, as a device has none."""
        self._encode_check("cuTensorMapEncodeTiled", args)
        self.calls += 1
        sized = (self._real.cuuint32_t, self._real.cuuint64_t)

        def plain(a: Any) -> Any:
            return (
                [int(x) for x in a]
                if isinstance(a, list)
                else int(a)
                if isinstance(a, sized)
                else a
            )

        self.tensor_maps.append(tuple(map(plain, args)))
        return (self._ok, self._real.CUtensorMap())

    def cuStreamIsCapturing(self, stream: Any) -> tuple[Any, ...]:
        status = self._real.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
        return (self._ok, status)


@contextlib.contextmanager
def null_device(
    compute_capability: tuple[int, int] = (9, 0), check_arguments: bool = False
) -> Iterator[NullDriver]:
    """Make the cuda backend's driver calls go to a `NullDriver` meanwhile (see it for
    `check_arguments`)."""
    real = cuda_driver._cu()
    driver = NullDriver(real, compute_capability, check_arguments)
    saved: Callable[[], Any] = cuda_driver._cu
    cuda_driver._cu = lambda: driver
    try:
        yield driver
    finally:
        cuda_driver._cu = saved
