"""The stand-in drivers pass every call's arguments through the real `cuda.bindings` first,
so a call the bindings would refuse fails here as it would on a GPU (first contact found one
such call, with Python ints where the bindings take sized integers, in 58 GPU tests)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("cuda.bindings")

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
