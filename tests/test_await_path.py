"""`await op` on a backend that queues work (cuda over a stand-in driver that runs a raw
`vadd` in NumPy): the launch is queued where it is awaited, work found done at once is handed
back with no waiting machinery, work still in flight is polled from the loop, and many
awaited ops (in sequence, or gathered over the pooled streams) give NumPy's results."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.host import device_op
from cutile_py.ptx.target import Target
from cutile_py.runtime import cuda_driver as cu
from cutile_py.runtime.cuda_backend import CudaBackend
from tests.support.fake_driver import StreamDriver, vector_add_ptx

N = 256
TILE = 128


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> tuple[StreamDriver, CudaBackend]:
    pytest.importorskip("cuda.bindings")
    from cutile_py.runtime import select

    driver = StreamDriver()
    monkeypatch.setattr(cu, "_cu", lambda: driver)
    backend = CudaBackend()
    monkeypatch.setitem(select._instances, "cuda", backend)
    monkeypatch.setattr(select, "_active", "cuda")
    return driver, backend


def _vadd() -> Any:
    return ct.RawKernel(vector_add_ptx(Target(90)), "vadd")


def test_work_found_done_at_once_needs_no_waiting(
    streams: tuple[StreamDriver, CudaBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_wait(*_: Any, **__: Any) -> None:
        raise AssertionError("waited for work that was already done")

    monkeypatch.setattr(device_op, "wait_done", no_wait)
    vadd = _vadd()
    rng = np.random.default_rng()
    a = rng.integers(-8, 9, N).astype(np.float32)
    x, w = ct.from_numpy(a), ct.zeros((N,), ct.f32)

    async def run() -> Any:
        nonlocal w, x
        for _ in range(1000):
            w, x, _, _ = await vadd(w, x, w, N, grid=N // TILE, block=TILE)
        return w

    w = asyncio.run(run())
    np.testing.assert_array_equal(w.to_numpy(), 1000 * a)


def test_work_in_flight_is_polled_and_cancellation_waits(
    streams: tuple[StreamDriver, CudaBackend],
) -> None:
    fake, _ = streams
    fake.slow_events = True  # in flight until a synchronize says otherwise
    vadd = _vadd()
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    x, y, z = ct.from_numpy(a), ct.from_numpy(b), ct.empty((N,), ct.f32)

    async def catch_up() -> None:
        await asyncio.sleep(0.01)
        fake.cuStreamSynchronize(None)  # the device catches up

    async def run() -> Any:
        helper = asyncio.ensure_future(catch_up())
        result = await vadd(x, y, z, N, grid=N // TILE, block=TILE)
        await helper
        return result

    _, _, z, _ = asyncio.run(run())
    np.testing.assert_array_equal(z.to_numpy(), a + b)
    assert "cuEventQuery" in fake.calls  # polled while in flight

    async def cancelled() -> None:
        op = vadd(x, y, z, N, grid=N // TILE, block=TILE)
        task = asyncio.ensure_future(op)
        await asyncio.sleep(0)  # launched, in flight
        task.cancel()
        asyncio.get_running_loop().call_later(0.01, fake.cuStreamSynchronize, None)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not z.held_exclusively  # handed back, after the work was over

    asyncio.run(cancelled())


def test_many_awaited_ops_gathered(streams: tuple[StreamDriver, CudaBackend]) -> None:
    vadd = _vadd()
    rng = np.random.default_rng()
    count = 300
    data = [rng.standard_normal(N).astype(np.float32) for _ in range(count)]
    xs = [ct.from_numpy(d) for d in data]
    outs = [ct.empty((N,), ct.f32) for _ in range(count)]

    async def run() -> list[Any]:
        ops = [vadd(x, x, o, N, grid=N // TILE, block=TILE) for x, o in zip(xs, outs)]
        return list(await asyncio.gather(*ops))

    results = asyncio.run(run())
    for r, d in zip(results, data):
        np.testing.assert_array_equal(r[2].to_numpy(), d + d)


def test_finished_work_a_launch_does_not_touch_is_dropped(
    streams: tuple[StreamDriver, CudaBackend],
) -> None:
    """Uploads still pending on the backend stream, which later launches on other streams
    do not touch, leave the pending list (one query per launch) instead of being scanned at
    every launch for good."""
    fake, backend = streams
    vadd = _vadd()
    rng = np.random.default_rng()
    x, z = ct.zeros((N,), ct.f32), ct.empty((N,), ct.f32)
    backend.synchronize()
    ct.from_numpy(rng.standard_normal(N).astype(np.float32))  # uploads nobody waits for
    ct.from_numpy(rng.standard_normal(N).astype(np.float32))
    assert backend._ordering.pending == 2
    s = ct.Stream()
    for _ in range(2):
        vadd(x, x, z, N, grid=N // TILE, block=TILE).sync_on(s)
    assert backend._ordering.pending == 0
    assert fake.waits == []
