"""Stream-ordered device memory on the cuda backend (a stand-in driver, no GPU): allocations
come from the device's default pool with `cuMemAllocAsync` on the backend stream, which keeps
freed memory for the next ones; frees are `cuMemFreeAsync` after the last launch that used the
buffer, deferred while a graph is captured; devices without pools use `cuMemAlloc`."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.ptx.target import Target
from cutile_py.runtime import cuda_driver as cu
from cutile_py.runtime.cuda_backend import CudaBackend
from tests.support.fake_driver import Handle, StreamDriver, vector_add_ptx


class PoolDriver(StreamDriver):
    """A stand-in with a default memory pool: freed blocks are handed out again by size."""

    def __init__(self, pools: bool = True) -> None:
        super().__init__()
        self.pools = pools
        self.threshold: int | None = None
        self.free_blocks: dict[int, list[int]] = {}
        self.sizes: dict[int, int] = {}
        #: (call, address, stream) of every pool allocation and free, in order.
        self.pool_calls: list[tuple[str, int, object]] = []
        #: The stream each event was last recorded on.
        self.event_stream: dict[object, object] = {}

    def cuDeviceGetAttribute(self, attr: object, dev: int) -> tuple[object, ...]:
        if attr == self.real.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
            return self._ok("cuDeviceGetAttribute", int(self.pools))
        return super().cuDeviceGetAttribute(attr, dev)

    def cuEventRecord(self, event: object, stream: object) -> tuple[object, ...]:
        self.event_stream[event] = stream
        return super().cuEventRecord(event, stream)

    def cuDeviceGetDefaultMemPool(self, dev: int) -> tuple[object, ...]:
        return self._ok("cuDeviceGetDefaultMemPool", Handle("pool"))

    def cuMemPoolSetAttribute(self, pool: object, attr: object, value: Any) -> tuple[object, ...]:
        assert pool == "pool"
        assert attr == self.real.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
        self.threshold = int(value)
        return self._ok("cuMemPoolSetAttribute")

    def cuMemAllocAsync(self, nbytes: int, stream: object) -> tuple[object, ...]:
        reuse = self.free_blocks.get(nbytes)
        if reuse:
            address = reuse.pop()
        else:
            result = self.cuMemAlloc(nbytes)
            self.calls.pop()  # counted as the pool's
            address = int(result[1])
        self.sizes[address] = nbytes
        self.pool_calls.append(("cuMemAllocAsync", address, stream))
        return self._ok("cuMemAllocAsync", self.real.CUdeviceptr(address))

    def cuMemFreeAsync(self, address: int, stream: object) -> tuple[object, ...]:
        if self.in_capture:  # as for cuMemFree: the tests want no frees during a capture
            self.capture_invalidated = True
            return (self.real.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        address = int(address)
        self.free_blocks.setdefault(self.sizes[address], []).append(address)
        self.pool_calls.append(("cuMemFreeAsync", address, stream))
        return self._ok("cuMemFreeAsync")


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[PoolDriver, CudaBackend]]:
    """The cuda backend, active, over a stand-in driver whose device has memory pools."""
    from cutile_py.runtime import select

    driver = PoolDriver()
    monkeypatch.setattr(cu, "_cu", lambda: driver)
    backend = CudaBackend()
    monkeypatch.setitem(select._instances, "cuda", backend)
    monkeypatch.setattr(select, "_active", "cuda")
    yield driver, backend
    gc.collect()


def test_memory_comes_from_the_pool_and_goes_back_to_it(
    pool: tuple[PoolDriver, CudaBackend],
) -> None:
    fake, backend = pool
    stream = backend.activate().stream.raw
    assert fake.threshold == 2**64 - 1  # freed memory stays in the pool for the next ones
    rng = np.random.default_rng()
    data = rng.standard_normal(1000).astype(np.float32)
    t = ct.from_numpy(data)
    address = t.buffer.address
    assert fake.pool_calls == [("cuMemAllocAsync", address, stream)]
    assert "cuMemAlloc" not in fake.calls
    np.testing.assert_array_equal(t.to_numpy(), data)
    del t
    gc.collect()
    assert fake.pool_calls[-1] == ("cuMemFreeAsync", address, stream)
    again = ct.empty((1000,), ct.f32)
    assert again.buffer.address == address  # the pool handed the same block out again
    assert "cuMemFree" not in fake.calls


def test_without_pools_memory_comes_from_cuMemAlloc(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = PoolDriver(pools=False)
    monkeypatch.setattr(cu, "_cu", lambda: driver)
    backend = CudaBackend()
    buf = backend.alloc(4096)
    address = buf.address
    assert driver.calls.count("cuMemAlloc") == 1 and driver.pool_calls == []
    assert driver.threshold is None
    buf.free()
    assert "cuMemFree" in driver.calls and address not in driver.memory


def test_a_free_comes_after_the_last_launch_that_used_the_buffer(
    pool: tuple[PoolDriver, CudaBackend],
) -> None:
    """An op dropped while its launch is in flight waits for it; only then is its memory
    given back, in the backend stream's order."""
    fake, backend = pool
    fake.slow_events = True  # the launch stays in flight until waited for
    vadd = ct.RawKernel(vector_add_ptx(Target(90)), "vadd")
    n = 256
    rng = np.random.default_rng()
    x = ct.from_numpy(rng.standard_normal(n).astype(np.float32))
    y = ct.from_numpy(rng.standard_normal(n).astype(np.float32))
    z = ct.empty((n,), ct.f32)
    addresses = {t.buffer.address for t in (x, y, z)}
    op = vadd(x, y, z, n, grid=2, block=128)
    op._launch(backend.stream_acquire())  # queued on a stream of its own, not waited for
    del x, y, z
    gc.collect()
    assert not [c for c in fake.pool_calls if c[0] == "cuMemFreeAsync"]  # the op holds them
    launched = len(fake.calls)
    del op  # waits for the launch, then lets go of the tensors
    gc.collect()
    later = fake.calls[launched:]
    assert later.index("cuEventSynchronize") < later.index("cuMemFreeAsync")
    freed = [(a, s) for c, a, s in fake.pool_calls if c == "cuMemFreeAsync"]
    assert {a for a, _ in freed} == addresses
    assert all(s == backend.activate().stream.raw for _, s in freed)


def test_other_streams_wait_for_the_allocation(pool: tuple[PoolDriver, CudaBackend]) -> None:
    """Memory from the pool exists from its point of the backend stream on: a launch on
    another stream that uses a fresh tensor waits for that point."""
    fake, backend = pool
    fake.slow_events = True
    vadd = ct.RawKernel(vector_add_ptx(Target(90)), "vadd")
    n = 128
    x, y, z = (ct.empty((n,), ct.f32) for _ in range(3))
    s = ct.Stream()
    waits = len(fake.waits)
    vadd(x, y, z, n, grid=1, block=128).sync_on(s)
    on_s = [event for stream, event in fake.waits[waits:] if stream == s.handle.raw]  # type: ignore[union-attr]
    assert [fake.event_stream[e] for e in on_s] == [backend.activate().stream.raw]  # a fence
    waits = len(fake.waits)
    backend.synchronize()  # the allocations are over: nothing more to wait for
    vadd(x, y, z, n, grid=1, block=128).sync_on(s)
    assert len(fake.waits) == waits


def test_frees_during_a_capture_wait_for_its_end(pool: tuple[PoolDriver, CudaBackend]) -> None:
    from cutile_py.runtime.backend import BoundLaunch

    fake, backend = pool
    kernel = backend.load_kernel(vector_add_ptx(Target(90)), "vadd")
    bufs = [backend.alloc(4 * 64) for _ in range(3)]
    doomed = [backend.alloc(1024)]
    address = doomed[0].address
    fake.on_captured_launch = doomed.clear  # dropped while the capture records the launch
    prepared = backend.prepare(kernel, (1, 1, 1), (64, 1, 1), 0, ["u64", "u64", "u64", "u32"])
    backend.graph([BoundLaunch(prepared, (*(b.address for b in bufs), 64))])
    assert not fake.capture_invalidated
    assert fake.pool_calls[-1][:2] == ("cuMemFreeAsync", address)  # after the capture
    assert backend.activate().releases.deferred == 0


class TightPoolDriver(PoolDriver):
    """A device of `capacity` bytes whose pool keeps freed blocks (counted as used) until
    trimmed: an allocation that does not fit beside them is refused as out of memory."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.live = 0

    def _kept(self) -> int:
        return sum(n * len(blocks) for n, blocks in self.free_blocks.items())

    def cuMemAllocAsync(self, nbytes: int, stream: object) -> tuple[object, ...]:
        if not self.free_blocks.get(nbytes) and self.live + self._kept() + nbytes > self.capacity:
            self.calls.append("cuMemAllocAsync (out of memory)")
            return (self.real.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        self.live += nbytes
        return super().cuMemAllocAsync(nbytes, stream)

    def cuMemFreeAsync(self, address: int, stream: object) -> tuple[object, ...]:
        self.live -= self.sizes[int(address)]
        return super().cuMemFreeAsync(address, stream)

    def cuMemPoolTrimTo(self, pool: object, keep: int) -> tuple[object, ...]:
        assert pool == "pool" and keep == 0
        self.free_blocks.clear()
        return self._ok("cuMemPoolTrimTo")


@pytest.fixture
def tight(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TightPoolDriver, CudaBackend]]:
    from cutile_py.runtime import select

    driver = TightPoolDriver(capacity=1 << 20)
    monkeypatch.setattr(cu, "_cu", lambda: driver)
    backend = CudaBackend()
    monkeypatch.setitem(select._instances, "cuda", backend)
    monkeypatch.setattr(select, "_active", "cuda")
    yield driver, backend
    gc.collect()


def test_out_of_memory_trims_the_pool_and_retries_once(
    tight: tuple[TightPoolDriver, CudaBackend],
) -> None:
    """The pool keeps what was freed (its release threshold is the maximum): an allocation
    that needs that memory in other sizes fits once the backend stream has reached the frees
    and the pool has handed its memory back."""
    fake, _ = tight
    kept = [ct.empty((1 << 16,), ct.f32) for _ in range(3)]  # 3 x 256 KiB
    del kept
    gc.collect()  # freed into the pool, which keeps them: 768 KiB of 1 MiB
    calls = len(fake.calls)
    big = ct.empty((3 << 16,), ct.f32)  # 768 KiB: fits only after the trim
    made = [c for c in fake.calls[calls:] if c != "cuDeviceGet"]
    assert made == [
        "cuMemAllocAsync (out of memory)",
        "cuMemAllocAsync (out of memory)",  # after collecting garbage: nothing was garbage
        "cuStreamSynchronize",
        "cuDeviceGetDefaultMemPool",
        "cuMemPoolTrimTo",
        "cuMemAllocAsync",
    ]
    assert big.nbytes == 3 << 18


def test_out_of_memory_after_the_trim_names_the_allocation(
    tight: tuple[TightPoolDriver, CudaBackend],
) -> None:
    from cutile_py.runtime.backend import RuntimeFailure

    fake, _ = tight
    with pytest.raises(RuntimeFailure, match=r"allocating 2097152 bytes.*OUT_OF_MEMORY"):
        ct.empty((1 << 19,), ct.f32)  # 2 MiB on a 1 MiB device
    assert fake.calls.count("cuMemPoolTrimTo") == 1  # one retry after the trim, not more
