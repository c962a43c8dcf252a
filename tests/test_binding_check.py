"""The stand-in drivers pass every call's arguments through the real `cuda.bindings` first,
so a call the bindings would refuse fails here as it would on a GPU (first contact found one
such call, with Python ints where the bindings take sized integers, in 58 GPU tests)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("cuda.bindings")

from paper_repro import null_driver
from paper_repro.null_driver import BindingCheck, NullDriver
from tests.support.fake_driver import FakeDriver


@pytest.fixture
def real() -> Any:
    from cuda.bindings import driver

    if not BindingCheck(driver).active:
        pytest.skip("a CUDA driver library is installed: the stand-ins call no real binding")
    return driver


def test_a_refused_argument_fails_the_null_driver(real: Any) -> None:
    null = NullDriver(real, check_arguments=True)
    ok, count = null.cuOccupancyMaxActiveBlocksPerMultiprocessor(7, 256, 1024)
    assert ok == real.CUresult.CUDA_SUCCESS and isinstance(count, int)
    with pytest.raises(TypeError, match="cuOccupancyMaxActiveBlocksPerMultiprocessor"):
        null.cuOccupancyMaxActiveBlocksPerMultiprocessor(7, "256", 1024)
    with pytest.raises(TypeError, match="cuModuleGetFunction"):
        null.cuModuleGetFunction("module", b"kernel")  # a str is no module handle
    attr = real.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    assert null.cuDeviceGetAttribute(attr, 0)[0] == real.CUresult.CUDA_SUCCESS
    with pytest.raises(TypeError, match="cuDeviceGetAttribute"):
        null.cuDeviceGetAttribute(attr, "0")  # the stand-in's own method, checked too


def test_the_unchecked_null_driver_takes_anything(real: Any) -> None:
    """What the host experiment times: no check, as before."""
    null = NullDriver(real)
    assert null.cuModuleGetFunction("module", b"kernel")[0] == real.CUresult.CUDA_SUCCESS


def test_a_refused_argument_fails_the_fake_driver(real: Any) -> None:
    fake = FakeDriver()
    with pytest.raises(TypeError, match="cuStreamSynchronize"):
        fake.cuStreamSynchronize(object())
    assert fake.cuStreamSynchronize(fake.cuStreamCreate(0x1)[1])[0] == real.CUresult.CUDA_SUCCESS


def test_each_argument_signature_is_checked_once(real: Any) -> None:
    calls: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            fn = getattr(real, name)

            def call(*args: Any) -> Any:
                calls.append(name)
                return fn(*args)

            return call

    check = BindingCheck(Counting())
    assert check.active
    calls.clear()  # (the library probe)
    for _ in range(3):
        check("cuStreamSynchronize", (5,))
    check("cuMemcpyHtoD", (1 << 20, 1 << 21, 16))
    check("cuMemcpyHtoD", (1 << 20, 1 << 21, 16))
    assert calls == ["cuStreamSynchronize", "cuMemcpyHtoD"]
    with pytest.raises(TypeError, match="cuStreamSynchronize"):
        check("cuStreamSynchronize", ("stream",))  # new types: checked, refused


class _Bindings:
    """A `cuda.bindings.driver` of another version: each call converts its argument (a
    handle must be an int) and then fails to load the driver library with `error`, as the
    probe does; `called` names the calls that got past the probe's failure to a driver."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error
        self.called: list[str] = []

    def cuDriverGetVersion(self) -> tuple[Any, ...]:
        raise self.error("Failed to dlopen libcuda.so.1")

    def cuStreamSynchronize(self, stream: Any) -> tuple[Any, ...]:
        if not isinstance(stream, int):
            raise TypeError("Argument 'hStream' is not instance of type (expected int)")
        self.called.append("cuStreamSynchronize")
        raise self.error("Failed to dlopen libcuda.so.1")


def test_a_missing_library_under_another_exception_still_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever the bindings call the library's absence (cuda.pathfinder's
    DynamicLibNotFoundError here, a plain RuntimeError elsewhere), the check stays on where
    no driver library can be loaded, rather than passing everything unchecked."""
    monkeypatch.setattr(null_driver, "_driver_loadable", lambda: False)
    check = BindingCheck(_Bindings(RuntimeError))
    assert check.active
    check("cuStreamSynchronize", (5,))
    with pytest.raises(TypeError, match="cuStreamSynchronize"):
        check("cuStreamSynchronize", ("stream",))


def test_where_a_driver_library_loads_nothing_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe that fails by the expected name while the loader finds a driver (a GPU
    machine whose bindings look elsewhere): the check must not call bindings that may reach
    a real driver with a stand-in's handles."""

    class DynamicLibNotFoundError(RuntimeError):
        pass

    monkeypatch.setattr(null_driver, "_driver_loadable", lambda: True)
    real = _Bindings(DynamicLibNotFoundError)
    check = BindingCheck(real)
    assert not check.active
    check("cuStreamSynchronize", (5,))
    assert real.called == []


def test_the_null_driver_encodes_no_tensor_map_with_an_installed_driver() -> None:
    """Unchecked or not, where the driver answers the probe the null driver's tensor maps
    do not go through the real `cuTensorMapEncodeTiled` (its addresses are made up)."""
    from cuda.bindings import driver

    class Installed:
        def __init__(self) -> None:
            self.encoded: list[tuple[Any, ...]] = []

        def __getattr__(self, name: str) -> Any:
            return getattr(driver, name)

        def cuDriverGetVersion(self) -> tuple[Any, ...]:
            return (driver.CUresult.CUDA_SUCCESS, 13000)

        def cuTensorMapEncodeTiled(self, *args: Any) -> tuple[Any, ...]:
            self.encoded.append(args)
            return (driver.CUresult.CUDA_SUCCESS, driver.CUtensorMap())

    for check_arguments in (False, True):
        installed = Installed()
        null = NullDriver(installed, check_arguments=check_arguments)
        assert null.cuTensorMapEncodeTiled(7, 2, 1 << 32)[0] == driver.CUresult.CUDA_SUCCESS
        assert null.tensor_maps == [(7, 2, 1 << 32)]
        assert installed.encoded == []


def test_a_call_from_inside_a_real_binding_is_not_checked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The garbage collector may run a `__del__` (freeing memory through the stand-in) while
    the check is inside a real binding, whose attempt to load the driver holds a lock: a
    nested check would wait on that lock for ever (a CI run hung so). Here the binding holds
    a lock and frees memory meanwhile, as such a `__del__` would: the nested call goes
    through unchecked; a new call afterwards is checked again."""
    import threading

    monkeypatch.setattr(null_driver, "_driver_loadable", lambda: False)
    loading = threading.Lock()

    class Locking(_Bindings):
        def cuStreamCreate(self, flags: Any) -> tuple[Any, ...]:
            with loading:
                self.called.append("cuStreamCreate")
                check("cuMemFreeAsync", (1 << 32, 0))  # a __del__, collected here
                raise self.error("Failed to dlopen libcuda.so.1")

        def cuMemFreeAsync(self, address: Any, stream: Any) -> tuple[Any, ...]:
            if not loading.acquire(timeout=5):
                raise AssertionError("the nested check waited on the loader's lock")
            loading.release()
            self.called.append("cuMemFreeAsync")
            raise self.error("Failed to dlopen libcuda.so.1")

    real = Locking(RuntimeError)
    check = BindingCheck(real)
    assert check.active
    check("cuStreamCreate", (0,))
    assert real.called == ["cuStreamCreate"]  # the nested free went unchecked
    check("cuMemFreeAsync", (1 << 32, 0))
    assert real.called == ["cuStreamCreate", "cuMemFreeAsync"]
