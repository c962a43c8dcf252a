"""The one module that calls the CUDA driver (`cuda.bindings.driver`), as small typed functions.

A failing call raises CudaDriverError naming the call, the error and the driver's description.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cutile_py.ptx.builder import TENSOR_MAP_PTYPE
from cutile_py.runtime.backend import TENSOR_MAP_BYTES
from cutile_py.sim.tensor_map import check_tiled

#: Results that mean a kernel faulted on the device; they poison the context for good.
DEVICE_FAULTS = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_ECC_UNCORRECTABLE",
    }
)

_SUCCESS = 0
_NOT_READY = 600


_bindings: Any = None


def _cu() -> Any:
    # Imported by name: cuda-python ships no type information, and a static import would make
    # mypy report that in every user's kernel file that follows its imports into cutile_py.
    # Kept once found: every driver call goes through here (tests replace this function).
    global _bindings
    if _bindings is None:
        _bindings = importlib.import_module("cuda.bindings.driver")
    return _bindings


def _doc_summary(doc: str | None) -> str:
    if not doc:
        return ""
    text = re.sub(r":py:obj:`~?\.?([^`]+)`", r"\1", " ".join(doc.split()))
    first = re.split(r"(?<=[a-z0-9)])\. ", text, maxsplit=1)[0]
    return first.rstrip(".")


def describe_result(code: int) -> tuple[str, str]:
    """(name, description) of a CUresult code.

    The driver's own text when it answers; otherwise (no driver here, or a poisoned context)
    the name and documentation that the bindings carry.
    """
    cu = _cu()
    try:
        enum: Any = cu.CUresult(code)
    except ValueError:
        return f"CUresult {code}", "unknown error code"
    name = str(enum.name)
    description = ""
    try:
        err, raw = cu.cuGetErrorName(enum)
        if int(err) == _SUCCESS and raw:
            name = bytes(raw).decode()
        err, raw = cu.cuGetErrorString(enum)
        if int(err) == _SUCCESS and raw:
            description = bytes(raw).decode()
    except Exception:
        pass
    return name, description or _doc_summary(enum.__doc__) or "no description"


def format_driver_error(call: str, code: int) -> str:
    """`cuFoo failed: CUDA_ERROR_X (n): description`."""
    name, description = describe_result(code)
    return f"{call} failed: {name} ({code}): {description}"


class CudaDriverError(RuntimeError):
    """A driver call returned an error; `.log` holds the JIT's log where there is one."""

    def __init__(self, call: str, code: int, log: str = "") -> None:
        self.call = call
        self.code = code
        self.name, self.description = describe_result(code)
        self.log = log
        message = f"{call} failed: {self.name} ({code}): {self.description}"
        super().__init__(f"{message}\n{log}" if log else message)

    @property
    def is_device_fault(self) -> bool:
        return self.name in DEVICE_FAULTS


def _check(call: str, result: Any) -> Any:
    """The values a binding returned after its CUresult; raise if that result is an error."""
    if int(result[0]) != _SUCCESS:
        raise CudaDriverError(call, int(result[0]))
    rest = result[1:]
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


# Opaque handles, typed apart so that a stream cannot be passed where an event is wanted.
@dataclass(frozen=True, eq=False)
class Context:
    raw: object


@dataclass(frozen=True, eq=False)
class Stream:
    raw: object


@dataclass(frozen=True, eq=False)
class Event:
    raw: object


@dataclass(frozen=True, eq=False)
class Module:
    raw: object


@dataclass(frozen=True, eq=False)
class Function:
    raw: object


# --- devices and contexts ---------------------------------------------------------------------


def init() -> None:
    _check("cuInit", _cu().cuInit(0))


def driver_version() -> int:
    """The CUDA version the driver supports, e.g. 13000 for 13.0."""
    return int(_check("cuDriverGetVersion", _cu().cuDriverGetVersion()))


def device_count() -> int:
    init()
    return int(_check("cuDeviceGetCount", _cu().cuDeviceGetCount()))


@functools.cache
def driver_available() -> bool:
    """Whether a driver and at least one device are present. Never raises."""
    try:
        return device_count() > 0
    except Exception:
        return False


def _device(ordinal: int) -> Any:
    return _check("cuDeviceGet", _cu().cuDeviceGet(ordinal))


def retain_primary_context(ordinal: int = 0) -> Context:
    init()
    dev = _device(ordinal)
    return Context(_check("cuDevicePrimaryCtxRetain", _cu().cuDevicePrimaryCtxRetain(dev)))


def set_current(ctx: Context) -> None:
    """Make `ctx` current for the calling thread (the driver keeps one per thread)."""
    _check("cuCtxSetCurrent", _cu().cuCtxSetCurrent(ctx.raw))


def compute_capability(ordinal: int = 0) -> tuple[int, int]:
    cu = _cu()
    dev = _device(ordinal)
    attr = cu.CUdevice_attribute
    major = _check(
        "cuDeviceGetAttribute",
        cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
    )
    minor = _check(
        "cuDeviceGetAttribute",
        cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
    )
    return int(major), int(minor)


def max_shared_optin(ordinal: int = 0) -> int:
    """The shared memory one block may use on the device with the opt-in (bytes)."""
    cu = _cu()
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    return int(_check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(attr, _device(ordinal))))


def sm_count(ordinal: int = 0) -> int:
    """The device's streaming multiprocessors."""
    cu = _cu()
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return int(_check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(attr, _device(ordinal))))


def blocks_per_sm(function: Function, threads: int, dynamic_shared: int) -> int:
    """How many blocks of `function` (of `threads` threads and `dynamic_shared` bytes of
    dynamic shared memory) one SM holds at once: the driver's occupancy query (registers,
    shared memory and threads of the compiled kernel)."""
    return int(
        _check(
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            _cu().cuOccupancyMaxActiveBlocksPerMultiprocessor(
                function.raw, threads, dynamic_shared
            ),
        )
    )


def device_name(ordinal: int = 0) -> str:
    raw = _check("cuDeviceGetName", _cu().cuDeviceGetName(256, _device(ordinal)))
    return bytes(raw).split(b"\x00", 1)[0].decode(errors="replace")


def context_synchronize() -> None:
    _check("cuCtxSynchronize", _cu().cuCtxSynchronize())


# --- memory -----------------------------------------------------------------------------------


def mem_alloc(nbytes: int) -> int:
    """A device allocation of `nbytes` (at least 1), as its address."""
    return int(_check("cuMemAlloc", _cu().cuMemAlloc(max(nbytes, 1))))


def mem_free(address: int) -> None:
    _check("cuMemFree", _cu().cuMemFree(address))


def memory_pools_supported(ordinal: int = 0) -> bool:
    """Whether the device has stream-ordered memory pools (`cuMemAllocAsync`)."""
    cu = _cu()
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
    return bool(_check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(attr, _device(ordinal))))


def keep_pool_memory(ordinal: int = 0, threshold: int = (1 << 64) - 1) -> None:
    """Let the device's default memory pool keep up to `threshold` bytes of freed memory
    for the next allocations instead of handing it back to the OS at every synchronize
    (the default, 0, would make each `cuMemAllocAsync` after a sync a fresh allocation)."""
    cu = _cu()
    pool = _check("cuDeviceGetDefaultMemPool", cu.cuDeviceGetDefaultMemPool(_device(ordinal)))
    attr = cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
    value = cu.cuuint64_t(threshold)
    _check("cuMemPoolSetAttribute", cu.cuMemPoolSetAttribute(pool, attr, value))


def trim_pool_memory(ordinal: int = 0, keep: int = 0) -> None:
    """Hand the freed memory the device's default pool keeps back to the OS, down to `keep`
    bytes (memory freed in a stream's order counts once that stream has reached the free)."""
    cu = _cu()
    pool = _check("cuDeviceGetDefaultMemPool", cu.cuDeviceGetDefaultMemPool(_device(ordinal)))
    _check("cuMemPoolTrimTo", cu.cuMemPoolTrimTo(pool, keep))


def mem_alloc_async(nbytes: int, stream: Stream) -> int:
    """An allocation of `nbytes` (at least 1) from the device's default pool, usable in
    `stream`'s order (other streams: after waiting for it there), as its address."""
    return int(_check("cuMemAllocAsync", _cu().cuMemAllocAsync(max(nbytes, 1), stream.raw)))


def mem_free_async(address: int, stream: Stream) -> None:
    """Give `address` (from `mem_alloc_async`) back to its pool once `stream` reaches here."""
    _check("cuMemFreeAsync", _cu().cuMemFreeAsync(address, stream.raw))


_MEMSET = {1: "cuMemsetD8Async", 2: "cuMemsetD16Async", 4: "cuMemsetD32Async"}


def memset_async(dst: int, value: int, width: int, count: int, stream: Stream) -> None:
    """Set `count` elements of `width` bytes (1, 2 or 4) at `dst` to the bits `value`, in
    `stream`'s order."""
    call = _MEMSET[width]
    _check(call, getattr(_cu(), call)(dst, value, count, stream.raw))


def _contiguous(arr: np.ndarray, what: str) -> None:
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what} must be a C-contiguous array")


def memcpy_htod(dst: int, src: np.ndarray, stream: Stream | None = None) -> None:
    """Copy all bytes of `src` to device address `dst`, ordered on `stream` when one is given.

    From pageable memory the driver stages the bytes before returning, so `src` may be
    reused at once.
    """
    _contiguous(src, "the source")
    if src.nbytes == 0:
        return
    cu = _cu()
    if stream is None:
        _check("cuMemcpyHtoD", cu.cuMemcpyHtoD(dst, src.ctypes.data, src.nbytes))
    else:
        _check(
            "cuMemcpyHtoDAsync",
            cu.cuMemcpyHtoDAsync(dst, src.ctypes.data, src.nbytes, stream.raw),
        )


def memcpy_dtoh(dst: np.ndarray, src: int, stream: Stream | None = None) -> None:
    """Fill `dst` from device address `src`; returns once the bytes are in `dst`.

    With `stream`, the copy waits for the work queued there before it, then the stream is
    synchronized. Without one the copy runs on the legacy default stream, which does not wait
    for non-blocking streams.
    """
    _contiguous(dst, "the destination")
    if not dst.flags.writeable:
        raise ValueError("the destination must be writeable")
    if dst.nbytes == 0:
        return
    cu = _cu()
    if stream is None:
        _check("cuMemcpyDtoH", cu.cuMemcpyDtoH(dst.ctypes.data, src, dst.nbytes))
    else:
        _check(
            "cuMemcpyDtoHAsync",
            cu.cuMemcpyDtoHAsync(dst.ctypes.data, src, dst.nbytes, stream.raw),
        )
        stream_synchronize(stream)


# --- streams and events -----------------------------------------------------------------------


def stream_create(non_blocking: bool = True) -> Stream:
    cu = _cu()
    flags = int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING) if non_blocking else 0
    return Stream(_check("cuStreamCreate", cu.cuStreamCreate(flags)))


def stream_synchronize(stream: Stream) -> None:
    _check("cuStreamSynchronize", _cu().cuStreamSynchronize(stream.raw))


def stream_destroy(stream: Stream) -> None:
    _check("cuStreamDestroy", _cu().cuStreamDestroy(stream.raw))


def stream_wait_event(stream: Stream, event: Event) -> None:
    """Order the work queued on `stream` from now on after the work before `event`."""
    _check("cuStreamWaitEvent", _cu().cuStreamWaitEvent(stream.raw, event.raw, 0))


def event_create(timing: bool = False) -> Event:
    cu = _cu()
    flags = 0 if timing else int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    return Event(_check("cuEventCreate", cu.cuEventCreate(flags)))


def event_record(event: Event, stream: Stream) -> None:
    # (`_check`, inline: every awaited launch records one.)
    err = _cu().cuEventRecord(event.raw, stream.raw)[0]
    if err:
        raise CudaDriverError("cuEventRecord", int(err))


def event_query(event: Event) -> bool:
    """True once the work before the event has finished; raises if that work failed."""
    err = _cu().cuEventQuery(event.raw)[0]
    if not err:
        return True
    if int(err) == _NOT_READY:
        return False
    raise CudaDriverError("cuEventQuery", int(err))


def event_synchronize(event: Event) -> None:
    _check("cuEventSynchronize", _cu().cuEventSynchronize(event.raw))


def event_elapsed_ms(start: Event, end: Event) -> float:
    """Milliseconds between two recorded events (both created with `timing=True`)."""
    return float(_check("cuEventElapsedTime", _cu().cuEventElapsedTime(start.raw, end.raw)))


def event_destroy(event: Event) -> None:
    _check("cuEventDestroy", _cu().cuEventDestroy(event.raw))


# --- modules and launches ---------------------------------------------------------------------


def module_load_data(image: bytes) -> Module:
    """Load a cubin or fatbin into the current context."""
    return Module(_check("cuModuleLoadData", _cu().cuModuleLoadData(image)))


def module_load_ptx(ptx: str, log_size: int = 1 << 16) -> tuple[Module, str]:
    """JIT-compile PTX with the driver: the module and the JIT's verbose info log (ptxas's
    registers and spills per function); on failure the JIT's error log goes into the error."""
    cu = _cu()
    opt = cu.CUjit_option
    error_log = bytearray(log_size)
    info_log = bytearray(log_size)
    keys = [
        opt.CU_JIT_ERROR_LOG_BUFFER,
        opt.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        opt.CU_JIT_INFO_LOG_BUFFER,
        opt.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        opt.CU_JIT_LOG_VERBOSE,
    ]
    values = [error_log, log_size, info_log, log_size, 1]
    # The driver reads the image as a NUL-terminated string.
    image = ptx.encode() + b"\x00"
    result = cu.cuModuleLoadDataEx(image, len(keys), keys, values)
    if int(result[0]) != _SUCCESS:
        log = bytes(error_log).split(b"\x00", 1)[0].decode(errors="replace").strip()
        raise CudaDriverError("cuModuleLoadDataEx", int(result[0]), log)
    info = bytes(info_log).split(b"\x00", 1)[0].decode(errors="replace").strip()
    return Module(result[1]), info


def module_unload(module: Module) -> None:
    _check("cuModuleUnload", _cu().cuModuleUnload(module.raw))


def module_get_function(module: Module, name: str) -> Function:
    return Function(
        _check(
            f"cuModuleGetFunction({name!r})", _cu().cuModuleGetFunction(module.raw, name.encode())
        )
    )


def max_dynamic_shared(function: Function) -> int:
    """The dynamic shared memory per block that `function` may be launched with now."""
    cu = _cu()
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    return int(_check("cuFuncGetAttribute", cu.cuFuncGetAttribute(attr, function.raw)))


def set_max_dynamic_shared(function: Function, nbytes: int) -> None:
    """Allow `nbytes` of dynamic shared memory per block (needed above 48 KiB)."""
    cu = _cu()
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    _check("cuFuncSetAttribute", cu.cuFuncSetAttribute(function.raw, attr, nbytes))


_INT_PARAMS: dict[str, tuple[type[ctypes._SimpleCData[Any]], int, int]] = {
    "u8": (ctypes.c_uint8, 0, 1 << 8),
    "s8": (ctypes.c_int8, -(1 << 7), 1 << 7),
    "b8": (ctypes.c_uint8, -(1 << 7), 1 << 8),
    "u16": (ctypes.c_uint16, 0, 1 << 16),
    "s16": (ctypes.c_int16, -(1 << 15), 1 << 15),
    "b16": (ctypes.c_uint16, -(1 << 15), 1 << 16),
    "u32": (ctypes.c_uint32, 0, 1 << 32),
    "s32": (ctypes.c_int32, -(1 << 31), 1 << 31),
    "b32": (ctypes.c_uint32, -(1 << 31), 1 << 32),
    "u64": (ctypes.c_uint64, 0, 1 << 64),
    "s64": (ctypes.c_int64, -(1 << 63), 1 << 63),
    "b64": (ctypes.c_uint64, -(1 << 63), 1 << 64),
}


def _bf16_bits(value: float) -> int:
    bits = int(np.array(value, dtype=np.float32).view(np.uint32))
    if (bits & 0x7F800000) == 0x7F800000 and (bits & 0x007FFFFF):
        return 0x7FC0  # a quiet NaN; rounding could carry a NaN's payload into infinity
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _f16_bits(value: int | float) -> int:
    return int(np.array(value, dtype=np.float16).view(np.uint16))


def param_ctype(ptype: str, value: int | float) -> ctypes._SimpleCData[Any]:
    """`value` as the ctypes scalar whose bytes a `.param .<ptype>` parameter expects."""
    t = ptype.lstrip(".")
    if t in _INT_PARAMS:
        ctype, lo, hi = _INT_PARAMS[t]
        if isinstance(value, float) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"a .{t} parameter needs an integer, not {value!r}")
        if not lo <= int(value) < hi:
            raise ValueError(f"{value} does not fit a .{t} parameter")
        # ctypes wraps a negative `.bN` bit pattern into the unsigned type on its own.
        return ctype(int(value))
    if t == "f32":
        return ctypes.c_float(float(value))
    if t == "f64":
        return ctypes.c_double(float(value))
    if t == "f16":
        return ctypes.c_uint16(_f16_bits(value))
    if t == "bf16":
        return ctypes.c_uint16(_bf16_bits(float(value)))
    raise ValueError(f"unsupported kernel parameter type .{t}")


@dataclass(frozen=True, eq=False)
class KernelParams:
    """Kernel parameters packed for `cuLaunchKernel`: each value typed by its ctypes class."""

    values: tuple[ctypes._SimpleCData[Any], ...]


def pack_params(params: Sequence[tuple[str, int | float]]) -> KernelParams:
    """Pack `(PTX type, value)` pairs in declared order; TypeError/ValueError name the index."""
    values = []
    for i, (ptype, value) in enumerate(params):
        try:
            values.append(param_ctype(ptype, value))
        except (TypeError, ValueError) as e:
            raise type(e)(f"parameter {i}: {e}") from e
    return KernelParams(tuple(values))


#: Each parameter's slot in a `ParamBlock`: 8 bytes (aligned for every scalar type; a tensor
#: map's 128), packed little-endian by `struct`, whose range checks reject what does not fit
#: the type.
_SLOT_FORMAT = {
    "u64": "Q",
    "s64": "q",
    "b64": "Q",
    "f64": "d",
    "u32": "I4x",
    "s32": "i4x",
    "b32": "I4x",
    "f32": "f4x",
    "u16": "H6x",
    "s16": "h6x",
    "b16": "H6x",
    "f16": "H6x",  # as bits: NumPy's rounding, and inf where struct's "e" would raise
    "bf16": "H6x",
    "u8": "B7x",
    "s8": "b7x",
    "b8": "B7x",
    # A tensor map (`.param .align 64 .b8 name[128]`): its 128 bytes as they are.
    TENSOR_MAP_PTYPE: "128s",
}


class ParamBlock:
    """Reusable parameter memory for one kernel signature: the `void**` array `cuLaunchKernel`
    reads, pointing at one 8-byte slot per parameter. `pack` writes all values in one call;
    the driver copies them at launch, so the block is free again when the launch returns.
    One block per thread (a launch releases the GIL)."""

    def __init__(self, ptypes: Sequence[str]) -> None:
        self.ptypes = tuple(t.lstrip(".") for t in ptypes)
        unknown = [t for t in self.ptypes if t not in _SLOT_FORMAT]
        if unknown:
            raise ValueError(f"unsupported kernel parameter type .{unknown[0]}")
        self._halves = tuple(
            (i, t == "bf16") for i, t in enumerate(self.ptypes) if t in ("f16", "bf16")
        )
        # struct pads short bytes with zeros: a tensor map's length is checked here.
        self._maps = tuple(i for i, t in enumerate(self.ptypes) if t == TENSOR_MAP_PTYPE)
        #: No half-precision or tensor-map parameter: `struct.pack_into(slots, 0, *values)` is
        #: all of `pack`.
        self.plain = not self._halves and not self._maps
        #: Integer parameters only: equal values are equal bytes (a float's -0.0 == 0.0 is
        #: not), so values equal to `packed` need no packing.
        self.exact = self.plain and not any(t.startswith("f") for t in self.ptypes)
        #: The values the slots hold now, where `exact` (None: unknown).
        self.packed: list[int | float | bytes] | None = None
        fmt = "".join(_SLOT_FORMAT[t] for t in self.ptypes)
        self.struct = self._struct = struct.Struct("<" + fmt)
        n = len(self.ptypes)
        offsets, at = [], 0
        for t in self.ptypes:
            offsets.append(at)
            at += TENSOR_MAP_BYTES if t == TENSOR_MAP_PTYPE else 8
        self.slots = self._slots = ctypes.create_string_buffer(max(at, 8))
        base = ctypes.addressof(self._slots)
        self._pointers = (ctypes.c_void_p * max(n, 1))(*(base + off for off in offsets))
        #: What `launch_kernel_packed` passes: the address of the `void**` array (0: none).
        self.address = ctypes.addressof(self._pointers) if n else 0

    def pack(self, values: Sequence[int | float | bytes]) -> None:
        """Write `values`; TypeError / ValueError name the parameter that does not fit."""
        self.packed = None
        if self._halves:
            values = list(values)
            for i, brain in self._halves:
                v = values[i]
                if not isinstance(v, bytes):  # else struct reports the type
                    values[i] = _bf16_bits(float(v)) if brain else _f16_bits(v)
        for i in self._maps:
            v = values[i]
            if not isinstance(v, bytes) or len(v) != TENSOR_MAP_BYTES:
                raise ValueError(f"parameter {i}: a tensor map takes 128 bytes, not {v!r}")
        try:
            self._struct.pack_into(self._slots, 0, *values)
        except (struct.error, TypeError, OverflowError):
            scalars = [(t, v) for t, v in zip(self.ptypes, values) if not isinstance(v, bytes)]
            pack_params(scalars)  # raises the precise error
            raise


def launch_kernel_packed(
    function: Function,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_mem: int,
    stream: Stream,
    params: ParamBlock,
    synchronize: bool = False,
) -> None:
    """`launch_kernel` with parameters already packed into `params`; with `synchronize`, then
    wait for `stream` (a failure there raises a CudaDriverError whose `call` is
    `cuStreamSynchronize`). The launch path of every kernel: two driver calls, nothing else."""
    cu = _cu()
    g0, g1, g2 = grid
    b0, b1, b2 = block
    raw = stream.raw
    err = cu.cuLaunchKernel(
        function.raw, g0, g1, g2, b0, b1, b2, shared_mem, raw, params.address or None, 0
    )[0]
    if err:
        raise CudaDriverError("cuLaunchKernel", int(err))
    if synchronize:
        err = cu.cuStreamSynchronize(raw)[0]
        if err:
            raise CudaDriverError("cuStreamSynchronize", int(err))


def launch_kernel(
    function: Function,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_mem: int,
    stream: Stream,
    params: KernelParams,
) -> None:
    """Queue `function` on `stream` with `shared_mem` bytes of dynamic shared memory."""
    values = params.values
    # The bindings' (values, ctypes classes) form: each value is copied into a buffer and
    # pointed to from the void** array the driver reads.
    kernel_params = (values, tuple(type(v) for v in values)) if values else None
    _check(
        "cuLaunchKernel",
        _cu().cuLaunchKernel(function.raw, *grid, *block, shared_mem, stream.raw, kernel_params, 0),
    )


# --- tensor maps ------------------------------------------------------------------------------


def encode_tensor_map(
    dtype: int,
    address: int,
    dims: tuple[int, ...],
    strides: tuple[int, ...],
    box: tuple[int, ...],
    swizzle: int,
) -> bytes:
    """The driver's 128-byte tiled tensor map (`cuTensorMapEncodeTiled`, no interleave, no L2
    promotion, zero out-of-bounds fill, element strides 1): arguments as
    `cutile_py.sim.tensor_map.encode_tiled`'s, checked first by the rules cuda.h documents
    (ValueError naming the argument) rather than left to a bare CUDA_ERROR_INVALID_VALUE."""
    check_tiled(dtype, address, dims, strides, box, swizzle)
    cu = _cu()
    rank = len(dims)
    # The bindings take the sized integer types, not Python ints (TypeError otherwise).
    u32, u64 = cu.cuuint32_t, cu.cuuint64_t
    tmap = _check(
        "cuTensorMapEncodeTiled",
        cu.cuTensorMapEncodeTiled(
            cu.CUtensorMapDataType(dtype),
            u32(rank),
            address,
            [u64(d) for d in dims],
            [u64(s) for s in strides],
            [u32(b) for b in box],
            [u32(1)] * rank,
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            cu.CUtensorMapSwizzle(swizzle),
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        ),
    )
    return ctypes.string_at(int(tmap.getPtr()), TENSOR_MAP_BYTES)


# --- graphs -----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Graph:
    raw: object


@dataclass(frozen=True, eq=False)
class GraphExec:
    raw: object


def stream_from_handle(handle: int) -> Stream:
    """A stream made elsewhere (another library's `CUstream`, by address); never destroyed here."""
    return Stream(_cu().CUstream(handle))


def stream_handle(stream: Stream) -> int:
    """The address of the driver stream, as other libraries take it."""
    raw: Any = stream.raw
    return int(raw)


def stream_begin_capture(stream: Stream) -> None:
    """Record, not run, the work queued on `stream` from now on (this thread's calls only)."""
    cu = _cu()
    mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    _check("cuStreamBeginCapture", cu.cuStreamBeginCapture(stream.raw, mode))


def stream_end_capture(stream: Stream) -> Graph:
    return Graph(_check("cuStreamEndCapture", _cu().cuStreamEndCapture(stream.raw)))


def graph_instantiate(graph: Graph) -> GraphExec:
    return GraphExec(_check("cuGraphInstantiate", _cu().cuGraphInstantiate(graph.raw, 0)))


def graph_launch(graph: GraphExec, stream: Stream) -> None:
    _check("cuGraphLaunch", _cu().cuGraphLaunch(graph.raw, stream.raw))


def graph_destroy(graph: Graph) -> None:
    _check("cuGraphDestroy", _cu().cuGraphDestroy(graph.raw))


def graph_exec_destroy(graph: GraphExec) -> None:
    _check("cuGraphExecDestroy", _cu().cuGraphExecDestroy(graph.raw))


# --- interop ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForeignArray:
    """Another library's array as DLPack or the CUDA Array Interface describe it.

    `strides` count elements (None: C-contiguous); `device_id` is -1 for host-only memory.
    `view` is cuda.core's view of it, which holds the producer's DLPack capsule: the memory
    stays valid only while it lives (its deleter runs when it dies).
    """

    address: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: np.dtype[Any]
    device_id: int
    device_accessible: bool
    readonly: bool
    view: object = field(default=None, compare=False, repr=False)


def strided_memory_view() -> Any:
    """cuda.core's `StridedMemoryView` class: in `cuda.core.utils` from cuda-core 0.5, in
    `cuda.core.experimental.utils` before. ImportError where cuda-core is missing."""
    try:
        utils: Any = importlib.import_module("cuda.core.utils")  # untyped: see _cu
    except ImportError:
        utils = importlib.import_module("cuda.core.experimental.utils")
    return utils.StridedMemoryView


def foreign_array(obj: object, consumer_stream: int) -> ForeignArray:
    """Describe `obj` (DLPack first, then the CUDA Array Interface) through cuda.core.

    The producer orders its pending work before `consumer_stream` (a `CUstream` address).
    """
    smv = strided_memory_view()
    make = getattr(smv, "from_any_interface", None)  # the constructor did this before 0.6
    view: Any = (make or smv)(obj, stream_ptr=consumer_stream)
    strides = view.strides
    return ForeignArray(
        address=int(view.ptr),
        shape=tuple(int(d) for d in view.shape),
        strides=None if strides is None else tuple(int(s) for s in strides),
        dtype=np.dtype(view.dtype),
        device_id=int(view.device_id),
        device_accessible=bool(view.is_device_accessible),
        readonly=bool(view.readonly),
        view=view,
    )
