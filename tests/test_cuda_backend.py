"""The CUDA driver layer and backend: error text and packing anywhere, launches on a GPU.

Tests marked `gpu` are skipped where no driver and device are found.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.ptx.target import Target
from cutile_py.runtime import cuda_backend
from cutile_py.runtime import cuda_driver as cu
from cutile_py.runtime.backend import LaunchFailure, ParamValue, RuntimeFailure
from cutile_py.runtime.cuda_backend import CudaBackend, CudaBuffer, CudaKernel
from tests.support.fake_driver import FakeDriver, StreamDriver, vector_add_ptx

HAVE_GPU = cu.driver_available()
requires_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no CUDA driver or device")
REPO = Path(__file__).resolve().parent.parent


def faulting_ptx(target: Target, name: str, body: str) -> str:
    major, minor = target.ptx_version()
    return (
        f".version {major}.{minor}\n.target {target.name}\n.address_size 64\n\n"
        f".visible .entry {name}(.param .u64 p)\n{{\n{body}\n    ret;\n}}\n"
    )


# --- without a GPU ------------------------------------------------------------------------


def test_driver_available_is_a_bool() -> None:
    assert isinstance(cu.driver_available(), bool)


def test_error_message_names_call_error_and_description() -> None:
    message = cu.format_driver_error("cuLaunchKernel", 700)
    assert message.startswith("cuLaunchKernel failed: CUDA_ERROR_ILLEGAL_ADDRESS (700): ")
    description = message.split(": ", 2)[2]
    assert "memory" in description.lower()
    assert ":py:obj:" not in description


def test_driver_error_carries_its_parts() -> None:
    err = cu.CudaDriverError("cuEventSynchronize", 719)
    assert err.name == "CUDA_ERROR_LAUNCH_FAILED"
    assert err.is_device_fault
    assert "cuEventSynchronize" in str(err) and "CUDA_ERROR_LAUNCH_FAILED" in str(err)
    assert err.description and err.description in str(err)
    oom = cu.CudaDriverError("cuMemAlloc", 2)
    assert oom.name == "CUDA_ERROR_OUT_OF_MEMORY" and not oom.is_device_fault


def test_jit_log_is_part_of_the_message() -> None:
    err = cu.CudaDriverError("cuModuleLoadDataEx", 218, "ptxas application ptx input, line 7")
    assert err.name == "CUDA_ERROR_INVALID_PTX"
    assert str(err).endswith("line 7")
    assert err.log == "ptxas application ptx input, line 7"


def test_unknown_result_code() -> None:
    assert "12345" in cu.format_driver_error("cuInit", 12345)


@pytest.mark.parametrize(
    ("ptype", "value", "ctype", "raw"),
    [
        ("u64", 2**64 - 1, ctypes.c_uint64, 2**64 - 1),
        ("s64", -(2**63), ctypes.c_int64, -(2**63)),
        ("u32", 7, ctypes.c_uint32, 7),
        ("s32", -5, ctypes.c_int32, -5),
        ("b32", -1, ctypes.c_uint32, 2**32 - 1),
        ("u16", 65535, ctypes.c_uint16, 65535),
        ("s8", -128, ctypes.c_int8, -128),
        ("u8", 255, ctypes.c_uint8, 255),
        ("f32", 1.5, ctypes.c_float, 1.5),
        ("f32", 3, ctypes.c_float, 3.0),
        ("f64", 0.1, ctypes.c_double, 0.1),
        ("f16", 1.0, ctypes.c_uint16, 0x3C00),
        ("bf16", 1.0, ctypes.c_uint16, 0x3F80),
        ("bf16", -2.5, ctypes.c_uint16, 0xC020),
    ],
)
def test_param_packing(ptype: str, value: float, ctype: type, raw: float) -> None:
    packed = cu.param_ctype(ptype, value)
    assert type(packed) is ctype
    assert packed.value == raw


def test_bf16_rounds_to_nearest_even_and_keeps_nan() -> None:
    # 1 + 2^-8 lies halfway between two bf16 values; the even one is 1.0.
    assert cu.param_ctype("bf16", 1.0 + 2.0**-8).value == 0x3F80
    assert cu.param_ctype("bf16", 1.0 + 3 * 2.0**-8).value == 0x3F82
    assert cu.param_ctype("bf16", float("nan")).value == 0x7FC0


@pytest.mark.parametrize(
    ("ptype", "value", "error"),
    [
        ("u32", -1, ValueError),
        ("s32", 2**31, ValueError),
        ("u64", 2**64, ValueError),
        ("u32", 1.0, TypeError),
        ("pred", 1, ValueError),
    ],
)
def test_param_packing_rejects(ptype: str, value: float, error: type[Exception]) -> None:
    with pytest.raises(error):
        cu.param_ctype(ptype, value)


def test_pack_params_names_the_parameter() -> None:
    packed = cu.pack_params([("u64", 1), ("f32", 2.0)])
    assert [type(v) for v in packed.values] == [ctypes.c_uint64, ctypes.c_float]
    with pytest.raises(ValueError, match="parameter 1"):
        cu.pack_params([("u64", 1), ("u32", -3)])


@pytest.mark.skipif(HAVE_GPU, reason="checks the failure where there is no driver")
def test_backend_without_a_driver_fails_cleanly() -> None:
    backend = CudaBackend()  # touches nothing yet
    assert backend.name == "cuda" and backend.runs_ptx
    with pytest.raises(RuntimeFailure, match="CUDA backend cannot start"):
        backend.alloc(16)
    with pytest.raises(RuntimeFailure):
        _ = backend.target


# --- the backend's logic against a stand-in driver ------------------------------------------


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    driver = FakeDriver()
    monkeypatch.setattr(cu, "_cu", lambda: driver)
    return driver


def test_backend_wiring_on_a_stand_in_driver(fake: FakeDriver) -> None:
    backend = CudaBackend()
    assert fake.calls == []  # nothing happens before first use
    assert backend.target == Target(90, 227 * 1024)
    assert backend.device_name == "Fake H200"
    n = 1000
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    bufs = [backend.alloc(4 * n) for _ in range(3)]
    backend.upload(bufs[0], a)
    backend.upload(bufs[1], b)
    kernel = backend.load_kernel(vector_add_ptx(Target(90)), "vadd")
    assert backend.load_kernel(vector_add_ptx(Target(90)), "vadd") is kernel
    assert fake.calls.count("cuModuleLoadData") == 1
    params = [ParamValue("u64", buf.address) for buf in bufs] + [ParamValue("u32", n)]
    done = backend.launch(kernel, (8, 1, 1), (128, 1, 1), 64 * 1024, params)
    assert "cuFuncSetAttribute" in fake.calls
    done.wait()
    assert done.done()
    c = backend.download(bufs[2], 4 * n).view(np.float32)
    np.testing.assert_array_equal(c, a + b)
    address = bufs[0].address
    del bufs[0]  # the finalizer frees it
    assert address not in fake.memory


@pytest.mark.parametrize(
    ("dtype", "value", "call"),
    [
        (ct.f32, 1.5, "cuMemsetD32Async"),
        (ct.f16, -2.25, "cuMemsetD16Async"),
        (ct.bf16, 3.0, "cuMemsetD16Async"),
        (ct.i32, -7, "cuMemsetD32Async"),
        (ct.bool_, True, "cuMemsetD8Async"),
        (ct.i64, -1, "cuMemsetD32Async"),  # equal 32-bit halves
        (ct.i64, 2**40 + 3, "cuMemcpyHtoDAsync"),  # no 64-bit memset: uploaded
    ],
)
def test_full_fills_on_the_device(
    fake: FakeDriver, monkeypatch: pytest.MonkeyPatch, dtype: Any, value: float, call: str
) -> None:
    from cutile_py.runtime import select

    monkeypatch.setitem(select._instances, "cuda", CudaBackend())
    monkeypatch.setattr(select, "_active", "cuda")
    n = 1000
    t = ct.full((n,), value, dtype)
    uploads = [c for c in fake.calls if c.startswith("cuMemcpyHtoD")]
    assert call in fake.calls and (uploads == [] or call.startswith("cuMemcpyHtoD"))
    want = np.full(n, value, dtype=np.float32 if dtype is ct.bf16 else dtype.storage)
    np.testing.assert_array_equal(t.to_numpy(), want)
    e = ct.empty((3, 5), ct.f16)
    assert e.shape == (3, 5) and e.dtype is ct.f16 and e.nbytes == 30
    assert fake.calls.count(call) == 1  # empty fills nothing


def test_backend_fault_names_the_kernel(fake: FakeDriver) -> None:
    backend = CudaBackend()
    ptx = faulting_ptx(Target(90), "trapper", "    trap;")
    done = backend.launch(backend.load_kernel(ptx, "trapper"), (1, 1, 1), (32, 1, 1), 0, [])
    assert done.done()  # finished by failing
    with pytest.raises(LaunchFailure, match=r"'trapper'.*CUDA_ERROR_LAUNCH_FAILED"):
        done.wait()
    with pytest.raises(LaunchFailure):
        backend.download(backend.alloc(4), 4)


def test_backend_driver_jit_error_log(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_backend, "nvjitlink_available", lambda: False)
    backend = CudaBackend()
    kernel = backend.load_kernel(vector_add_ptx(Target(90)), "vadd")
    assert kernel.report is None and "cuModuleLoadDataEx" in fake.calls
    with pytest.raises(RuntimeFailure, match=r"CUDA_ERROR_INVALID_PTX(.|\n)*line 3; error"):
        backend.load_kernel("frobnicate", "vadd")


def test_backend_launch_rejects_bad_params(fake: FakeDriver) -> None:
    backend = CudaBackend()
    kernel = backend.load_kernel(vector_add_ptx(Target(90)), "vadd")
    with pytest.raises(ValueError, match=r"'vadd'.*parameter 3"):
        backend.launch(
            kernel, (1, 1, 1), (1, 1, 1), 0, [ParamValue("u64", 0)] * 3 + [ParamValue("u32", -1)]
        )


# --- on a GPU -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


@pytest.mark.gpu
@requires_gpu
def test_device_facts(backend: CudaBackend) -> None:
    major, minor = cu.compute_capability()
    assert backend.target == Target(major * 10 + minor, cu.max_shared_optin())
    assert backend.target.max_shared_bytes >= 48 * 1024
    assert backend.device_name
    assert cu.device_count() >= 1


@pytest.mark.gpu
@requires_gpu
def test_round_trip(backend: CudaBackend) -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=12345, dtype=np.uint8)
    buf = backend.alloc(data.nbytes)
    assert isinstance(buf, CudaBuffer)
    assert buf.address % 256 == 0
    backend.upload(buf, data)
    np.testing.assert_array_equal(backend.download(buf, data.nbytes), data)
    np.testing.assert_array_equal(backend.download(buf, 100), data[:100])
    buf.free()
    buf.free()  # a second free does nothing


@pytest.mark.gpu
@requires_gpu
def test_vector_add(backend: CudaBackend) -> None:
    rng = np.random.default_rng(1)
    n, block = 1000, 128  # n is not a multiple of the block
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    bufs = [backend.alloc(4 * n) for _ in range(3)]
    backend.upload(bufs[0], a)
    backend.upload(bufs[1], b)
    backend.upload(bufs[2], np.full(n, np.nan, dtype=np.float32))
    ptx = vector_add_ptx(backend.target)
    kernel = backend.load_kernel(ptx, "vadd")
    assert backend.load_kernel(ptx, "vadd") is kernel
    assert isinstance(kernel, CudaKernel)
    if kernel.report is not None:
        assert kernel.report.registers > 0
    params = [ParamValue("u64", buf.address) for buf in bufs] + [ParamValue("u32", n)]
    done = backend.launch(kernel, ((n + block - 1) // block, 1, 1), (block, 1, 1), 0, params)
    done.wait()
    assert done.done()
    c = backend.download(bufs[2], 4 * n).view(np.float32)
    np.testing.assert_array_equal(c, a + b)


@pytest.mark.gpu
@requires_gpu
def test_large_dynamic_shared_memory(backend: CudaBackend) -> None:
    # Above 48 KiB a launch needs the function's limit raised first.
    shared = 100 * 1024
    major, minor = backend.target.ptx_version()
    ptx = f"""\
.version {major}.{minor}
.target {backend.target.name}
.address_size 64
.extern .shared .align 16 .b8 dyn[];

.visible .entry shuffle(.param .u64 out, .param .u32 top)
{{
    .reg .b32 %r<6>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [top];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, dyn;
    shl.b32 %r4, %r2, 2;
    sub.u32 %r5, %r1, %r4;
    add.u32 %r5, %r5, %r3;
    st.shared.u32 [%r5], %r2;
    bar.sync 0;
    ld.shared.u32 %r2, [%r5];
    cvta.to.global.u64 %rd1, %rd1;
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r2;
    ret;
}}
"""
    kernel = backend.load_kernel(ptx, "shuffle")
    out = backend.alloc(4 * 256)
    params = [ParamValue("u64", out.address), ParamValue("u32", shared - 4)]
    backend.launch(kernel, (1, 1, 1), (256, 1, 1), shared, params).wait()
    got = backend.download(out, 4 * 256).view(np.uint32)
    np.testing.assert_array_equal(got, np.arange(256, dtype=np.uint32))


@pytest.mark.gpu
@requires_gpu
def test_bad_ptx_reports_the_log(backend: CudaBackend) -> None:
    ptx = vector_add_ptx(backend.target).replace("add.f32", "frobnicate.f32")
    line = next(i for i, s in enumerate(ptx.splitlines(), 1) if "frobnicate" in s)
    with pytest.raises(RuntimeFailure, match=f"line {line}"):
        backend.load_kernel(ptx, "vadd")


@pytest.mark.gpu
@requires_gpu
def test_missing_kernel_name(backend: CudaBackend) -> None:
    with pytest.raises(RuntimeFailure, match="CUDA_ERROR_NOT_FOUND"):
        backend.load_kernel(vector_add_ptx(backend.target), "no_such_kernel")


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("trapper", "    trap;"),
        (
            "wild_store",
            "    .reg .b64 %rd1;\n    mov.u64 %rd1, 8;\n    st.global.u32 [%rd1], 1;",
        ),
    ],
)
def test_device_fault_is_a_launch_failure(backend: CudaBackend, name: str, body: str) -> None:
    # A fault poisons the context for the rest of the process, so it happens in a child.
    ptx = faulting_ptx(backend.target, name, body)
    script = textwrap.dedent(
        f"""
        from cutile_py.runtime.backend import LaunchFailure, ParamValue
        from cutile_py.runtime.cuda_backend import CudaBackend

        backend = CudaBackend()
        kernel = backend.load_kernel({ptx!r}, {name!r})
        done = backend.launch(kernel, (4, 1, 1), (32, 1, 1), 0, [ParamValue("u64", 0)])
        try:
            done.wait()
        except LaunchFailure as e:
            print("LaunchFailure:", e)
        else:
            print("no failure")
        """
    )
    path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("LaunchFailure:"), result.stdout + result.stderr
    assert repr(name) in result.stdout


def test_a_prepared_launch_repacks_only_changed_parameters(fake: FakeDriver) -> None:
    """The parameter block keeps the values it last packed: a relaunch on the same memory
    skips packing, and one on other memory (or after a different launch) packs anew."""
    backend = CudaBackend()
    n = 777
    rng = np.random.default_rng()
    kernel = backend.load_kernel(vector_add_ptx(Target(90)), "vadd")
    launch = backend.prepare(kernel, (7, 1, 1), (128, 1, 1), 0, ("u64", "u64", "u64", "u32"))
    sets = []
    for _ in range(2):
        a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
        bufs = [backend.alloc(4 * n) for _ in range(3)]
        backend.upload(bufs[0], a)
        backend.upload(bufs[1], b)
        sets.append((a, b, bufs))
    for k in (0, 0, 1, 0, 1, 1):
        a, b, bufs = sets[k]
        backend.upload(bufs[2], np.zeros(n, np.float32))
        launch.run([buf.address for buf in bufs] + [n], None, None)
        got = backend.download(bufs[2], 4 * n).view(np.float32)
        np.testing.assert_array_equal(got, a + b)
    a, b, bufs = sets[0]
    backend.upload(bufs[2], np.zeros(n, np.float32))
    launch.run((*(buf.address for buf in bufs), n), None, None)  # a tuple: packed too
    np.testing.assert_array_equal(backend.download(bufs[2], 4 * n).view(np.float32), a + b)
    # Floats are never taken as packed (-0.0 == 0.0, with other bits); halves go through pack.
    assert not cu.ParamBlock(("u64", "f32")).exact
    assert not cu.ParamBlock(("u64", "f16")).exact
    assert cu.ParamBlock(("u64", "u32", "s64")).exact


# --- importing other libraries' arrays (ct.from_dlpack) over the stand-in driver ----------------


@pytest.fixture
def cuda_active(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> CudaBackend:
    """The cuda backend over the stand-in driver, made the active backend."""
    from cutile_py.runtime import select

    backend = CudaBackend()
    monkeypatch.setitem(select._instances, "cuda", backend)
    monkeypatch.setattr(select, "_active", "cuda")
    return backend


class FakeView:
    """cuda.core's StridedMemoryView as the backend reads it: a device array at `ptr`."""

    def __init__(self, producer: Producer) -> None:
        self.ptr = producer.address
        self.shape = producer.shape
        self.strides = None
        self.dtype = np.dtype(np.float32)
        self.device_id = 0
        self.is_device_accessible = True
        self.readonly = False


class Producer:
    """Another library's device array (its memory allocated through the stand-in driver)."""

    def __init__(self, backend: CudaBackend, data: np.ndarray) -> None:
        self.memory = backend.alloc(data.nbytes)
        backend.upload(self.memory, data)
        self.address = self.memory.address
        self.shape = data.shape


def _fake_view_class(failure: BaseException | None = None) -> type:
    class View(FakeView):
        made: ClassVar[list[Any]] = []

        @classmethod
        def from_any_interface(cls, obj: Producer, stream_ptr: int) -> View:
            if failure is not None:
                raise failure
            view = cls(obj)
            cls.made.append(weakref_ref(view))
            return view

    return View


def weakref_ref(obj: object) -> Any:
    import weakref

    return weakref.ref(obj)


@pytest.mark.parametrize(
    "failure",
    [
        ModuleNotFoundError("No module named 'cuda.core'"),
        RuntimeError("cuda.core: unsupported device type"),
        NotImplementedError("bfloat16 needs ml_dtypes"),
        BufferError("the producer refused"),
    ],
)
def test_from_dlpack_failures_are_type_errors(
    cuda_active: CudaBackend, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    producer = Producer(cuda_active, np.zeros(4, np.float32))
    if isinstance(failure, ImportError):

        def missing() -> Any:
            raise failure

        monkeypatch.setattr(cu, "strided_memory_view", missing)
    else:
        monkeypatch.setattr(cu, "strided_memory_view", lambda: _fake_view_class(failure))
    with pytest.raises(TypeError, match=r"from_dlpack\(obj\): cannot borrow obj, a Producer") as e:
        ct.from_dlpack(producer)
    assert str(failure) in str(e.value)


def test_cuda_core_is_a_declared_dependency_with_a_floor() -> None:
    """Issue 16, item 1: `ct.from_dlpack` on cuda reads arrays through cuda.core, so the
    package declares it, at a version that has `StridedMemoryView`."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert deps is not None
    found = re.findall(r'"cuda-core>=(\d+)\.(\d+)', deps.group(1))
    assert found and tuple(map(int, found[0])) >= (0, 5)


def test_strided_memory_view_from_the_older_location(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    old = types.ModuleType("cuda.core.experimental.utils")
    old.StridedMemoryView = FakeView  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda.core.utils", None)  # importing it fails
    monkeypatch.setitem(sys.modules, "cuda.core.experimental.utils", old)
    assert cu.strided_memory_view() is FakeView
    # Before from_any_interface, the constructor itself took (obj, stream_ptr).

    class Old:
        def __init__(self, obj: object, stream_ptr: int) -> None:
            FakeView.__init__(self, obj)  # type: ignore[arg-type]

    monkeypatch.setattr(cu, "strided_memory_view", lambda: Old)
    thing = types.SimpleNamespace(address=1 << 21, shape=(2, 3))
    view = cu.foreign_array(thing, 0)
    assert view.address == 1 << 21 and view.shape == (2, 3) and isinstance(view.view, Old)


def test_dlpack_import_keeps_the_view_alive(
    cuda_active: CudaBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    view_class = _fake_view_class()
    monkeypatch.setattr(cu, "strided_memory_view", lambda: view_class)
    data = np.random.default_rng().standard_normal(64).astype(np.float32)
    producer = Producer(cuda_active, data)
    t = ct.from_dlpack(producer)
    gc.collect()
    (view,) = view_class.made  # type: ignore[attr-defined]
    assert view() is not None  # its deleter has not run: the memory is still ours
    np.testing.assert_array_equal(t.to_numpy(), data)
    del t
    gc.collect()
    assert view() is None  # let go with the tensor


# --- frees during a stream capture ----------------------------------------------------------


def test_a_buffer_collected_during_capture_is_freed_after_it(fake: FakeDriver) -> None:
    from cutile_py.runtime.backend import BoundLaunch

    backend = CudaBackend()
    kernel = backend.load_kernel(vector_add_ptx(Target(90)), "vadd")
    bufs = [backend.alloc(4 * 64) for _ in range(3)]
    doomed = [backend.alloc(1024)]
    address = doomed[0].address
    # The last reference goes while the capture records the launch (as a garbage collection
    # in the capturing thread would drop it).
    fake.on_captured_launch = doomed.clear
    prepared = backend.prepare(kernel, (1, 1, 1), (64, 1, 1), 0, ["u64", "u64", "u64", "u32"])
    graph = backend.graph([BoundLaunch(prepared, (*(b.address for b in bufs), 64))])
    assert not fake.capture_invalidated  # the free waited for the end of the capture...
    assert address not in fake.memory  # ...and then ran: no leak
    assert backend.activate().releases.deferred == 0
    graph.launch().wait()
    keep = backend.alloc(16)
    keep_address = keep.address
    del keep  # outside a capture: freed at once
    assert keep_address not in fake.memory


# --- timing device work -------------------------------------------------------------------------


def test_time_ms_times_the_device_not_the_host(
    cuda_active: CudaBackend, fake: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    vadd = ct.RawKernel(vector_add_ptx(Target(90)), "vadd")
    n = 512
    rng = np.random.default_rng()
    a, b = (ct.from_numpy(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
    c = ct.empty((n,), ct.f32)
    fake.kernel_ms, fake.host_ms = 1.25, 40.0  # a host that wakes up late from every wait

    def launch() -> ct.OpLike:
        op: ct.OpLike = vadd(a, b, c, n, grid=(n + 127) // 128, block=128)
        return op

    times = ct.profiling.time_ms(launch, repeats=3)
    assert times == [1.25] * 3
    np.testing.assert_array_equal(c.to_numpy(), a.to_numpy() + b.to_numpy())

    # Two launches in one timed op: their device times add up, the host's gap between not.
    with cuda_active.time_launches() as timed:
        launch().sync()
        launch().sync()
    assert timed.count == 2 and timed.total_ms() == 2.5
    launch().sync()  # after the block: not timed
    assert timed.count == 2


# --- loading modules: nvJitLink, then the driver's JIT ------------------------------------------


def test_nvjitlink_failure_falls_back_to_the_driver_jit(
    fake: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cutile_py.runtime.nvjitlink import PtxAssemblyError

    def too_new(ptx: str, target: Target) -> Any:
        raise PtxAssemblyError(
            "PTX assembly for sm_90 failed (ERROR_PTX_COMPILE)",
            "ptxas fatal   : Unsupported .version 9.9; current version is '9.0'",
        )

    monkeypatch.setattr(cuda_backend, "nvjitlink_available", lambda: True)
    monkeypatch.setattr(cuda_backend, "assemble", too_new)
    backend = CudaBackend()
    kernel = backend.load_kernel(vector_add_ptx(Target(90)), "vadd")
    assert kernel.report is None  # the driver compiled it
    assert "cuModuleLoadDataEx" in fake.calls and "cuModuleLoadData" not in fake.calls
    n = 300
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    bufs = [backend.alloc(4 * n) for _ in range(3)]
    backend.upload(bufs[0], a)
    backend.upload(bufs[1], b)
    params = [ParamValue("u64", buf.address) for buf in bufs] + [ParamValue("u32", n)]
    backend.launch(kernel, (3, 1, 1), (128, 1, 1), 0, params).wait()
    np.testing.assert_array_equal(backend.download(bufs[2], 4 * n).view(np.float32), a + b)
    # Both refuse: the error holds both logs.
    with pytest.raises(RuntimeFailure) as e:
        backend.load_kernel("frobnicate", "vadd")
    message = str(e.value)
    assert "line 3; error : frobnicate" in message  # the driver JIT's log
    assert "Unsupported .version 9.9" in message  # nvJitLink's log


def test_a_kernel_that_moves_registers_is_compiled_whole_by_the_driver(
    fake: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ptxas ignores setmaxnreg when compiling for linking, as nvJitLink does: PTX that moves
    registers (warp specialization) is loaded through the driver's JIT, whose verbose log is
    the kernel's report; where the driver refuses it, nvJitLink's cubin (and report) is
    loaded instead."""
    from types import SimpleNamespace

    assembled: list[str] = []

    def report(ptx: str, target: Target) -> Any:
        assembled.append(ptx)
        return SimpleNamespace(cubin=b"\x7fELF", registers=168, spill_stores=0)

    monkeypatch.setattr(cuda_backend, "nvjitlink_available", lambda: True)
    monkeypatch.setattr(cuda_backend, "assemble", report)
    backend = CudaBackend()
    moving = vector_add_ptx(Target(90)).replace(
        "    ld.param.u64 %rd1, [pa];",
        "    setmaxnreg.inc.sync.aligned.u32 232;\n    ld.param.u64 %rd1, [pa];",
    )
    fake.jit_log = (
        "ptxas info    : Function properties for vadd\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers"
    )
    kernel = backend.load_kernel(moving, "vadd")
    assert fake.calls.count("cuModuleLoadDataEx") == 1 and "cuModuleLoadData" not in fake.calls
    assert kernel.report is not None and kernel.report.registers == 40  # the driver's
    # The driver refuses it: nvJitLink's cubin (registers capped, the same kernel) runs.
    refused = moving.replace(
        "    ld.param.u64 %rd2, [pb];", "    frobnicate;\n    ld.param.u64 %rd2, [pb];"
    )
    kernel = backend.load_kernel(refused, "vadd")
    assert fake.calls.count("cuModuleLoadDataEx") == 2 and "cuModuleLoadData" in fake.calls
    assert kernel.report is not None
    # A kernel that moves no registers takes nvJitLink's cubin at once.
    calls = len(fake.calls)
    backend.load_kernel(vector_add_ptx(Target(90)).replace("vadd", "plain"), "plain")
    assert "cuModuleLoadDataEx" not in fake.calls[calls:] and len(assembled) == 3


# --- targets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sm", "version"),
    [(80, (7, 0)), (86, (7, 1)), (87, (7, 4)), (88, (9, 0)), (89, (7, 8)), (90, (7, 8)),
     (100, (8, 6)), (101, (8, 6)), (103, (8, 8)), (110, (9, 0)), (120, (8, 7)), (121, (8, 8))],
)  # fmt: skip
def test_lowest_ptx_version_per_target(sm: int, version: tuple[int, int]) -> None:
    assert Target(sm).ptx_version() == version


def test_target_takes_the_devices_shared_memory_limit(fake: FakeDriver) -> None:
    from cutile_py.host.jit_disk import disk_key

    fake.shared_optin = int(np.random.default_rng().integers(100, 227)) * 1024
    target = CudaBackend().target
    assert target.max_shared_bytes == fake.shared_optin
    assert Target(90).max_shared_bytes == 227 * 1024  # the table, where no device was asked
    with pytest.raises(ValueError, match="below the 48 KiB"):
        Target(90, 1024)

    @ct.kernel
    def k(x: ct.Tensor[ct.f32, 4]) -> None:
        pass

    captured = k.captured
    keys = {
        disk_key(
            captured=captured,
            qualname="k",
            spec=None,
            target=t,
            fast_math=False,
            compiler="c",
        )
        for t in (Target(90), target, Target(90, fake.shared_optin))
    }
    assert len(keys) == 2  # the compile plans shared memory to the limit: a key of its own


# --- ordering across streams by what a launch touches --------------------------------------------


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> tuple[StreamDriver, CudaBackend]:
    """The cuda backend, active, over a stand-in driver that records waits per stream."""
    from cutile_py.runtime import select

    driver = StreamDriver()
    monkeypatch.setattr(cu, "_cu", lambda: driver)
    backend = CudaBackend()
    monkeypatch.setitem(select._instances, "cuda", backend)
    monkeypatch.setattr(select, "_active", "cuda")
    return driver, backend


def test_a_launch_on_a_stream_waits_only_for_what_it_uses(
    streams: tuple[StreamDriver, CudaBackend],
) -> None:
    fake, _ = streams
    fake.slow_events = True  # the uploads are still in flight when the launches come
    vadd = ct.RawKernel(vector_add_ptx(Target(90)), "vadd")
    n = 384
    rng = np.random.default_rng()
    a, b, c = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    x, y = ct.from_numpy(a), ct.from_numpy(b)  # uploads, pending on the backend stream
    upload_events = set(fake.stamps)  # recorded after each upload
    s1, s2 = ct.Stream(), ct.Stream()
    z1, z2 = ct.empty((n,), ct.f32), ct.empty((n,), ct.f32)

    vadd(x, y, z1, n, grid=3, block=128).sync_on(s1)
    on_s1 = [event for stream, event in fake.waits if stream == s1.handle.raw]  # type: ignore[union-attr]
    assert len(on_s1) == 2 and set(on_s1) <= upload_events  # the two uploads, nothing else
    np.testing.assert_array_equal(z1.to_numpy(), a + b)

    # More work on the backend stream, none of it touching what the next launch uses.
    busy = ct.from_numpy(c)
    ct.zeros((n,), ct.f32)
    waits = len(fake.waits)
    vadd(z1, z1, z2, n, grid=3, block=128).sync_on(s2)
    assert len(fake.waits) == waits  # no fence on the backend stream: free to overlap
    np.testing.assert_array_equal(z2.to_numpy(), 2 * (a + b))
    vadd(busy, z1, z2, n, grid=3, block=128).sync_on(s2)
    assert len(fake.waits) == waits  # `busy`'s upload was over: to_numpy synchronized it
    np.testing.assert_array_equal(z2.to_numpy(), c + (a + b))


def test_stream_ordering_follows_reads_and_writes(
    streams: tuple[StreamDriver, CudaBackend],
) -> None:
    fake, backend = streams
    kernel = backend.load_kernel(vector_add_ptx(Target(90)), "vadd")
    fake.slow_events = True  # each launch stays in flight until waited for
    n = 256
    bufs = [backend.alloc(4 * n) for _ in range(4)]
    backend.synchronize()
    params = [ParamValue("u64", buf.address) for buf in bufs[:3]] + [ParamValue("u32", n)]
    s1, s2, s3 = (backend.stream_acquire() for _ in range(3))
    a, b, c, d = ((buf.address, 4 * n) for buf in bufs)

    def launch(on: cu.Stream, reads: list[Any], writes: list[Any]) -> Any:
        touches = [(*r, False) for r in reads] + [(*w, True) for w in writes]
        before = len(fake.waits)
        done = backend.launch(kernel, (2, 1, 1), (128, 1, 1), 0, params, on, touches)
        return done, [e for _, e in fake.waits[before:]]

    writer, _ = launch(s1, [a, b], [c])  # in flight on s1
    _, waited = launch(s2, [c], [d])  # reads what s1 writes
    assert waited == [writer._event.raw]
    _, waited = launch(s3, [a], [d])  # reads what s1 only reads; writes what s2 writes
    assert len(waited) == 1 and waited[0] is not writer._event.raw
    _, waited = launch(s2, [b], [])  # read after read: no order
    assert waited == []
    _, waited = launch(s3, [], [a])  # writes what s1 and s3 read (s3's own: its stream)
    assert writer._event.raw in waited
    writer.wait()  # over: nothing waits for it any more
    _, waited = launch(s2, [c], [])
    assert writer._event.raw not in waited


def test_awaited_launches_reuse_pooled_events(streams: tuple[StreamDriver, CudaBackend]) -> None:
    """An awaited op's completion event goes back to a pool when the op is done: a loop of
    awaited launches creates a handful of events, not one per launch, and a completion known
    to have passed is not asked again."""
    import asyncio
    import gc

    fake, _ = streams
    vadd = ct.RawKernel(vector_add_ptx(Target(90)), "vadd")
    n = 256
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    x, y, z = ct.from_numpy(a), ct.from_numpy(b), ct.empty((n,), ct.f32)

    async def loop() -> None:
        nonlocal x, y, z
        for _ in range(50):
            x, y, z, _n = await vadd(x, y, z, n, grid=2, block=128)

    gc.collect()
    before = fake.events
    asyncio.run(loop())
    assert fake.events - before <= 4  # (was 50: one created and destroyed per launch)
    np.testing.assert_array_equal(z.to_numpy(), a + b)
    syncs = fake.calls.count("cuEventSynchronize")
    op = vadd(x, y, z, n, grid=2, block=128)
    op._launch()
    assert op._completion is not None and op._completion.done()
    op.sync()
    assert fake.calls.count("cuEventSynchronize") == syncs  # done() said it had passed


def test_finished_work_is_dropped_not_waited_for(streams: tuple[StreamDriver, CudaBackend]) -> None:
    """Uploads the device has finished are found so by one query and forgotten: the launches
    on other streams that follow queue no waits for them, then or later."""
    fake, backend = streams
    vadd = ct.RawKernel(vector_add_ptx(Target(90)), "vadd")
    n = 128
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    x, y, z = ct.from_numpy(a), ct.from_numpy(b), ct.empty((n,), ct.f32)
    assert backend._ordering.pending == 2  # the uploads, on the backend stream
    s = ct.Stream()
    for _ in range(3):
        vadd(x, y, z, n, grid=1, block=128).sync_on(s)
    assert fake.waits == [] and backend._ordering.pending == 0
    np.testing.assert_array_equal(z.to_numpy(), a + b)


def test_many_launches_in_flight_are_pruned_in_linear_time(
    streams: tuple[StreamDriver, CudaBackend],
) -> None:
    """Pending accesses past PRUNE_AT are pruned of finished work; while everything is still
    in flight, the next pass waits for the list to double (a 1,000-op zip on a busy GPU
    queried every pending event at every launch: ~470,000 queries)."""
    from cutile_py.runtime.cuda_ordering import StreamOrdering

    fake, backend = streams
    fake.slow_events = True  # nothing finishes
    stream = backend.activate().stream
    ordering = StreamOrdering()
    n = 1000
    for i in range(n):
        ordering.record(stream, [(4096 * i, 16, True)])
    assert ordering.pending == n
    assert fake.calls.count("cuEventQuery") < 4 * n


def test_unrecorded_work_of_two_streams_fences_each_for_the_other(
    streams: tuple[StreamDriver, CudaBackend],
) -> None:
    """Work queued without an event (an allocation, a `.then` step) on stream A, then on B:
    B's next launch must still fence A (B is not 'clean'), A's must fence B; a stream needs
    no fence for its own such work."""
    from cutile_py.runtime.cuda_ordering import StreamOrdering

    _, backend = streams
    backend.activate()
    a, b = backend.stream_acquire(), backend.stream_acquire()
    ordering = StreamOrdering()
    ordering.unrecorded(a)
    assert ordering.clean == {a}
    ordering.unrecorded(a)  # again, nobody waited since: nothing changes
    assert ordering.clean == {a}
    ordering.unrecorded(b)
    assert b not in ordering.clean and a not in ordering.clean
    assert ordering.order(b, []) == 1  # a fence on A
    assert ordering.order(a, []) == 1  # a fence on B
    assert ordering.order(b, []) == 0  # waited already
