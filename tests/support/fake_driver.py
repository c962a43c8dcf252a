"""Stand-ins for the CUDA driver's bindings, and a tiny hand-written PTX kernel they run: the
backend's wiring (which calls, with what, how results and logs are read) checked with no GPU."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from cutile_py.ptx.target import Target
from paper_repro.null_driver import BindingCheck


def vector_add_ptx(target: Target) -> str:
    """c[i] = a[i] + b[i] for i < n."""
    major, minor = target.ptx_version()
    return f"""\
.version {major}.{minor}
.target {target.name}
.address_size 64

.visible .entry vadd(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u32 pn)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<8>;
    .reg .f32 %f<4>;

    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u32 %r1, [pn];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd4, %r5, 4;
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    cvta.to.global.u64 %rd3, %rd3;
    add.s64 %rd5, %rd1, %rd4;
    add.s64 %rd6, %rd2, %rd4;
    add.s64 %rd7, %rd3, %rd4;
    ld.global.f32 %f1, [%rd5];
    ld.global.f32 %f2, [%rd6];
    add.f32 %f3, %f1, %f2;
    st.global.f32 [%rd7], %f3;
DONE:
    ret;
}}
"""


class Handle(str):
    """A stream or event handle: named for the tests' checks, an integer like the bindings'."""

    def __int__(self) -> int:
        return 0x10000 + sum(self.encode())


class FakeDriver:
    """Host memory behind the bindings' call shapes; runs `vadd` in NumPy, faults on `trapper`.

    It checks the backend's wiring (what is called with what, how results and logs are read),
    not the real driver's behaviour, which only the `gpu` tests check. Each call's arguments
    pass the real bindings first (`BindingCheck`: no call the bindings would refuse).
    """

    def __init__(self) -> None:
        from cuda.bindings import driver

        self.real = driver
        check = BindingCheck(driver)
        for name in dir(type(self)):
            if name.startswith("cu"):
                setattr(self, name, _checked(check, name, getattr(self, name)))
        self.memory: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.next_address = 1 << 20
        self.sticky = 0
        self.calls: list[str] = []
        self.functions: dict[int, str] = {}
        self.max_shared: dict[int, int] = {}
        self.shared_optin = 227 * 1024  # an H200's opt-in shared memory per block
        self.sms = 132  # an H200's SMs
        #: Blocks one SM holds (the occupancy query), and the (kernel, threads, dynamic
        #: shared memory) it was asked for.
        self.blocks_per_sm = 2
        self.occupancy_asked: list[tuple[str, int, int]] = []
        #: A stream capture in progress, and whether an unsafe call has invalidated it.
        self.in_capture = False
        self.capture_invalidated = False
        #: Called at each launch recorded by a capture (a test drops references there).
        self.on_captured_launch: Callable[[], None] = lambda: None
        #: The device's clock (ms): a launch runs `kernel_ms`; a host wait (stream or event
        #: synchronize) leaves the device idle for `host_ms` before the next call reaches it.
        self.clock = 0.0
        self.kernel_ms = 0.0
        self.host_ms = 0.0
        self.stamps: dict[object, float] = {}
        self.events = 0
        #: What the JIT's info log says (ptxas's verbose report) when it compiles PTX.
        self.jit_log = ""

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)  # enums

    def _ok(self, call: str, *values: object) -> tuple[object, ...]:
        self.calls.append(call)
        return (self.real.CUresult(self.sticky), *values)

    def cuGetErrorName(self, err: object) -> tuple[object, ...]:
        raise RuntimeError("no driver library")

    cuGetErrorString = cuGetErrorName

    def cuInit(self, flags: int) -> tuple[object, ...]:
        return self._ok("cuInit")

    def cuDeviceGet(self, ordinal: int) -> tuple[object, ...]:
        return self._ok("cuDeviceGet", ordinal)

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple[object, ...]:
        return self._ok("cuDevicePrimaryCtxRetain", Handle("context"))

    def cuCtxSetCurrent(self, ctx: object) -> tuple[object, ...]:
        return self._ok("cuCtxSetCurrent")

    def cuDeviceGetAttribute(self, attr: object, dev: int) -> tuple[object, ...]:
        major = attr == self.real.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        if attr == self.real.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
            return self._ok("cuDeviceGetAttribute", self.sms)
        if (
            attr
            == self.real.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        ):
            return self._ok("cuDeviceGetAttribute", self.shared_optin)
        return self._ok("cuDeviceGetAttribute", 9 if major else 0)

    def cuDeviceGetName(self, length: int, dev: int) -> tuple[object, ...]:
        return self._ok("cuDeviceGetName", b"Fake H200\x00\x00")

    def cuStreamCreate(self, flags: int) -> tuple[object, ...]:
        assert flags == int(self.real.CUstream_flags.CU_STREAM_NON_BLOCKING)
        return self._ok("cuStreamCreate", Handle("stream"))

    def cuStreamSynchronize(self, stream: object) -> tuple[object, ...]:
        assert stream == "stream"
        self.clock += self.host_ms
        return self._ok("cuStreamSynchronize")

    def cuMemAlloc(self, nbytes: int) -> tuple[object, ...]:
        address = self.next_address
        self.next_address += (nbytes + 255) // 256 * 256
        self.memory[address] = ctypes.create_string_buffer(nbytes)
        return self._ok("cuMemAlloc", self.real.CUdeviceptr(address))

    def cuMemFree(self, address: int) -> tuple[object, ...]:
        if self.in_capture:  # not permitted during a capture: it invalidates the capture
            self.capture_invalidated = True
            return (self.real.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        del self.memory[address]
        return self._ok("cuMemFree")

    def cuStreamBeginCapture(self, stream: object, mode: object) -> tuple[object, ...]:
        self.in_capture, self.capture_invalidated = True, False
        return self._ok("cuStreamBeginCapture")

    def cuStreamEndCapture(self, stream: object) -> tuple[object, ...]:
        self.in_capture = False
        if self.capture_invalidated:
            return (self.real.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)
        return self._ok("cuStreamEndCapture", Handle("graph"))

    def cuGraphInstantiate(self, graph: object, flags: int) -> tuple[object, ...]:
        return self._ok("cuGraphInstantiate", Handle("graph exec"))

    def cuGraphDestroy(self, graph: object) -> tuple[object, ...]:
        return self._ok("cuGraphDestroy")

    cuGraphExecDestroy = cuGraphDestroy

    def cuGraphLaunch(self, graph: object, stream: object) -> tuple[object, ...]:
        return self._ok("cuGraphLaunch")  # runs nothing: the launches were not kept

    def cuMemcpyHtoDAsync(self, dst: int, src: int, n: int, stream: object) -> tuple[object, ...]:
        ctypes.memmove(self.memory[dst], src, n)
        return self._ok("cuMemcpyHtoDAsync")

    def cuMemcpyDtoHAsync(self, dst: int, src: int, n: int, stream: object) -> tuple[object, ...]:
        ctypes.memmove(dst, self.memory[src], n)
        return self._ok("cuMemcpyDtoHAsync")

    def _memset(
        self, call: str, dst: int, value: int, count: int, width: int
    ) -> tuple[object, ...]:
        base = next(a for a in self.memory if a <= dst < a + len(self.memory[a]))
        pattern = int(value).to_bytes(width, "little") * count
        ctypes.memmove(ctypes.addressof(self.memory[base]) + dst - base, pattern, len(pattern))
        return self._ok(call)

    def cuMemsetD8Async(self, dst: int, value: int, n: int, stream: object) -> tuple[object, ...]:
        return self._memset("cuMemsetD8Async", dst, value, n, 1)

    def cuMemsetD16Async(self, dst: int, value: int, n: int, stream: object) -> tuple[object, ...]:
        return self._memset("cuMemsetD16Async", dst, value, n, 2)

    def cuMemsetD32Async(self, dst: int, value: int, n: int, stream: object) -> tuple[object, ...]:
        return self._memset("cuMemsetD32Async", dst, value, n, 4)

    def cuModuleLoadData(self, image: bytes) -> tuple[object, ...]:
        assert image[:4] == b"\x7fELF"
        return self._ok("cuModuleLoadData", Handle("module"))

    def cuModuleLoadDataEx(
        self, image: bytes, n: int, keys: list[object], values: list[object]
    ) -> tuple[object, ...]:
        assert image.endswith(b"\x00") and n == len(keys) == len(values)
        self.calls.append("cuModuleLoadDataEx")
        if b"frobnicate" in image:
            log = values[keys.index(self.real.CUjit_option.CU_JIT_ERROR_LOG_BUFFER)]
            assert isinstance(log, bytearray)
            message = b"ptxas application ptx input, line 3; error : frobnicate\x00"
            log[: len(message)] = message
            return (self.real.CUresult.CUDA_ERROR_INVALID_PTX, None)
        info = values[keys.index(self.real.CUjit_option.CU_JIT_INFO_LOG_BUFFER)]
        assert isinstance(info, bytearray)
        info[: len(self.jit_log)] = self.jit_log.encode()
        return (self.real.CUresult.CUDA_SUCCESS, Handle("module"))

    def cuModuleGetFunction(self, module: object, name: bytes) -> tuple[object, ...]:
        handle = len(self.functions) + 1
        self.functions[handle] = name.decode()
        self.max_shared[handle] = 48 * 1024
        return self._ok("cuModuleGetFunction", handle)

    def cuFuncGetAttribute(self, attr: object, fn: int) -> tuple[object, ...]:
        return self._ok("cuFuncGetAttribute", self.max_shared[fn])

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(
        self, fn: int, threads: int, shared: int
    ) -> tuple[object, ...]:
        self.occupancy_asked.append((self.functions[fn], threads, shared))
        # As the driver: no block fits with more dynamic shared memory than it allows.
        blocks = self.blocks_per_sm if shared <= self.max_shared[fn] else 0
        return self._ok("cuOccupancyMaxActiveBlocksPerMultiprocessor", blocks)

    def cuFuncSetAttribute(self, fn: int, attr: object, value: int) -> tuple[object, ...]:
        self.max_shared[fn] = value
        return self._ok("cuFuncSetAttribute")

    def cuLaunchKernel(self, fn: int, *args: object) -> tuple[object, ...]:
        shared, stream, kernel_params, extra = args[6:]
        assert isinstance(shared, int) and shared <= self.max_shared[fn]
        assert stream == "stream" and extra == 0
        result = self._ok("cuLaunchKernel")
        if self.in_capture:  # recorded, not run
            self.on_captured_launch()
            return result
        self.clock += self.kernel_ms
        if self.functions[fn] == "trapper":
            assert kernel_params is None
            self.sticky = 719  # reported by later calls, like a real fault
            return result
        if isinstance(kernel_params, int):  # the address of the `void**` array (vadd's four)
            slots = (ctypes.c_void_p * 4).from_address(kernel_params)
            pa, pb, pc = (ctypes.c_uint64.from_address(slots[i]).value for i in range(3))
            n = ctypes.c_uint32.from_address(slots[3]).value
        else:
            assert isinstance(kernel_params, tuple)
            values, types = kernel_params
            assert [type(v) for v in values] == list(types)
            pa, pb, pc, n = (v.value for v in values)
        f32 = [np.frombuffer(self.memory[p].raw, dtype=np.float32, count=n) for p in (pa, pb)]
        ctypes.memmove(self.memory[pc], (f32[0] + f32[1]).tobytes(), 4 * n)
        return result

    def cuEventCreate(self, flags: int) -> tuple[object, ...]:
        self.events += 1
        return self._ok("cuEventCreate", Handle(f"event{self.events}"))

    def cuEventRecord(self, event: object, stream: object) -> tuple[object, ...]:
        self.stamps[event] = self.clock
        return (self.real.CUresult.CUDA_SUCCESS,)  # the fault shows at the event, not here

    def cuEventSynchronize(self, event: object) -> tuple[object, ...]:
        self.clock += self.host_ms
        return self._ok("cuEventSynchronize")

    def cuEventElapsedTime(self, start: object, end: object) -> tuple[object, ...]:
        return self._ok("cuEventElapsedTime", self.stamps[end] - self.stamps[start])

    cuEventQuery = cuEventDestroy = cuStreamDestroy = lambda self, handle: self._ok(
        "event or stream"
    )


def _checked(check: BindingCheck, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        check(name, args)
        return fn(*args)

    return call


class StreamDriver(FakeDriver):
    """Distinct stream handles; records which stream launches and waits go to."""

    def __init__(self) -> None:
        super().__init__()
        self.streams = 0
        self.launched_on: list[object] = []
        self.waits: list[tuple[object, object]] = []
        self.recorded: list[object] = []
        #: When set, a recorded event reports "not ready" to queries until a synchronize (of
        #: it, or of any stream) says the device caught up: work stays in flight meanwhile.
        self.slow_events = False
        self._unfinished: set[object] = set()

    def cuEventQuery(self, event: object) -> tuple[object, ...]:
        if self.slow_events and event in self._unfinished:
            self.calls.append("cuEventQuery")
            return (self.real.CUresult.CUDA_ERROR_NOT_READY,)
        return self._ok("event or stream")

    def cuEventSynchronize(self, event: object) -> tuple[object, ...]:
        self._unfinished.discard(event)
        return super().cuEventSynchronize(event)

    def cuStreamCreate(self, flags: int) -> tuple[object, ...]:
        self.streams += 1
        name = Handle("stream" if self.streams == 1 else f"s{self.streams}")
        return self._ok("cuStreamCreate", name)

    def cuStreamSynchronize(self, stream: object) -> tuple[object, ...]:
        self._unfinished.clear()  # (the stand-in runs one queue: everything is over)
        return self._ok("cuStreamSynchronize")

    def cuStreamWaitEvent(self, stream: object, event: object, flags: int) -> tuple[object, ...]:
        self.waits.append((stream, event))
        return self._ok("cuStreamWaitEvent")

    def cuEventRecord(self, event: object, stream: object) -> tuple[object, ...]:
        self.recorded.append(stream)
        self._unfinished.add(event)
        return super().cuEventRecord(event, stream)

    def cuLaunchKernel(self, fn: int, *args: object) -> tuple[object, ...]:
        self.launched_on.append(args[7])
        fixed = (*args[:7], "stream", *args[8:])
        return super().cuLaunchKernel(fn, *fixed)


def _copy_params(address: int, count: int) -> Any:
    """A copy of the `void**` parameter array at `address` and the 8-byte slots it points to:
    (the array, the slots), kept alive together."""
    pointers = (ctypes.c_void_p * count).from_address(address)
    slots = (ctypes.c_uint64 * count)(
        *(ctypes.c_uint64.from_address(pointers[i]).value for i in range(count))
    )
    base = ctypes.addressof(slots)
    array = (ctypes.c_void_p * count)(*(base + 8 * i for i in range(count)))
    return array, slots


def graph_driver(base: Any) -> Any:
    """Adds stream capture to the stand-in: captured launches run on cuGraphLaunch."""

    class GraphDriver(type(base)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.capturing: list[tuple[Any, ...]] | None = None
            self.graph: list[tuple[Any, ...]] = []
            self.captured = 0
            self.replays = 0
            self.destroyed: list[str] = []
            self.kept: list[Any] = []

        def cuStreamBeginCapture(self, stream: object, mode: object) -> tuple[object, ...]:
            self.capturing = []
            return self._ok("cuStreamBeginCapture")  # type: ignore[no-any-return]

        def cuLaunchKernel(self, fn: int, *args: object) -> tuple[object, ...]:
            if self.capturing is not None:
                # The driver copies the parameters into the graph at capture: so does this.
                params = args[8]
                if isinstance(params, int):
                    copy = _copy_params(params, 4)
                    self.kept.append(copy)
                    args = (*args[:8], ctypes.addressof(copy[0]), *args[9:])
                self.capturing.append((fn, *args))
                self.captured += 1
                return self._ok("capture")  # type: ignore[no-any-return]
            return super().cuLaunchKernel(fn, *args)  # type: ignore[no-any-return]

        def cuStreamEndCapture(self, stream: object) -> tuple[object, ...]:
            assert self.capturing is not None
            self.graph, self.capturing = self.capturing, None
            return self._ok("cuStreamEndCapture", Handle("graph"))  # type: ignore[no-any-return]

        def cuGraphInstantiate(self, graph: object, flags: int) -> tuple[object, ...]:
            return self._ok("cuGraphInstantiate", Handle("exec"))  # type: ignore[no-any-return]

        def cuGraphLaunch(self, exec_: object, stream: object) -> tuple[object, ...]:
            self.replays += 1
            for fn, *args in self.graph:
                super().cuLaunchKernel(fn, *args)
            return self._ok("cuGraphLaunch")  # type: ignore[no-any-return]

        def cuGraphDestroy(self, graph: object) -> tuple[object, ...]:
            self.destroyed.append(str(graph))
            return self._ok("cuGraphDestroy")  # type: ignore[no-any-return]

        def cuGraphExecDestroy(self, exec_: object) -> tuple[object, ...]:
            self.destroyed.append(str(exec_))
            return self._ok("cuGraphExecDestroy")  # type: ignore[no-any-return]

    return GraphDriver()
