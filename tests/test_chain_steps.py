"""`.then` chains on a backend that queues work (cuda, over a stand-in driver that runs a raw
`vadd` in NumPy): a step that another follows is queued, not waited for, and only the last
waits; what the functions do between steps with the handed-back arguments (read them, launch
on another stream) is still ordered after the queued work."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.ptx.target import Target
from cutile_py.runtime import cuda_driver as cu
from cutile_py.runtime.cuda_backend import CudaBackend
from tests.support.fake_driver import StreamDriver, vector_add_ptx

N = 256
TILE = 128


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> tuple[StreamDriver, CudaBackend]:
    """The cuda backend, active, over a stand-in driver that records launches and waits."""
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


def test_a_10000_step_chain_runs_in_order_and_waits_once(
    streams: tuple[StreamDriver, CudaBackend],
) -> None:
    fake, _ = streams
    vadd = _vadd()
    rng = np.random.default_rng()
    a = rng.integers(-8, 9, N).astype(np.float32)  # sums stay exact in f32
    b = rng.integers(-8, 9, N).astype(np.float32)
    x, w = ct.from_numpy(a), ct.from_numpy(b)
    steps = 10_000

    def step(r: tuple[Any, ...]) -> Any:
        w, x, _, n = r
        return vadd(w, x, w, n, grid=N // TILE, block=TILE)  # w = w + x

    op: Any = vadd(w, x, w, N, grid=N // TILE, block=TILE)
    for _ in range(steps - 1):
        op = op.then(step)
    calls = len(fake.calls)
    w, x, _, _ = op.sync()
    made = fake.calls[calls:]
    assert made.count("cuLaunchKernel") == steps
    assert made.count("cuStreamSynchronize") == 1  # the last step's, for all of them
    assert made.count("cuEventRecord") == 0  # no completion event per step
    np.testing.assert_array_equal(w.to_numpy(), b + steps * a)
    np.testing.assert_array_equal(x.to_numpy(), a)


def test_between_queued_steps_reads_and_other_streams_come_after_them(
    streams: tuple[StreamDriver, CudaBackend],
) -> None:
    """A step's function reads the tensor the queued step wrote (the download waits on the
    backend stream) and launches on another stream (which waits for a fence recorded on the
    backend stream after the queued step)."""
    fake, backend = streams
    vadd = _vadd()
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    x, y = ct.from_numpy(a), ct.from_numpy(b)
    backend.synchronize()  # the uploads are over: only the chain's work is pending
    z, u = ct.empty((N,), ct.f32), ct.empty((N,), ct.f32)
    backend.synchronize()
    s = ct.Stream()
    seen: dict[str, Any] = {}

    def middle(r: tuple[Any, ...]) -> Any:
        x, _, z, n = r
        waits = len(fake.waits)
        vadd(z, z, u, n, grid=N // TILE, block=TILE).sync_on(s)
        seen["fence"] = [e for st, e in fake.waits[waits:] if st == s.handle.raw]  # type: ignore[union-attr]
        calls = len(fake.calls)
        seen["read"] = z.to_numpy()  # (the stand-in ran the launch; the wait is its order)
        seen["download"] = fake.calls[calls:]
        return vadd(z, x, z, n, grid=N // TILE, block=TILE)

    z, x, _, _ = vadd(x, y, z, N, grid=N // TILE, block=TILE).then(middle).sync()
    assert len(seen["fence"]) == 1  # the launch on `s` waited for the backend stream
    np.testing.assert_array_equal(seen["read"], a + b)
    assert seen["download"] == ["cuMemcpyDtoHAsync", "cuStreamSynchronize"]  # on that stream
    np.testing.assert_array_equal(u.to_numpy(), 2 * (a + b))
    np.testing.assert_array_equal(z.to_numpy(), (a + b) + a)


def test_a_chain_ending_in_an_empty_launch_still_waits_for_its_steps(
    streams: tuple[StreamDriver, CudaBackend],
) -> None:
    fake, _ = streams
    vadd = _vadd()
    x, z = ct.zeros((N,), ct.f32), ct.empty((N,), ct.f32)
    empty = ct.empty((0,), ct.f32).partition((TILE,))
    from tests.support import elementwise_kernels as K

    calls = len(fake.calls)
    op = vadd(x, x, z, N, grid=N // TILE, block=TILE).then(
        lambda r: K.add(empty, ct.zeros((0,), ct.f32), ct.zeros((0,), ct.f32))
    )
    op.sync()
    assert fake.calls[calls:].count("cuStreamSynchronize") == 1


def test_a_chain_on_a_cpu_backend_runs_each_step(rng: np.random.Generator) -> None:
    """On sim every step executes at its launch: a long chain there too, against NumPy."""
    from tests.support import elementwise_kernels as K

    ct.set_backend("sim")
    a = rng.standard_normal(N).astype(np.float32)
    x = ct.from_numpy(a)
    z = ct.zeros((N,), ct.f32).partition(TILE)
    op: Any = K.add(z, x, x)
    for _ in range(20):
        op = op.then(lambda r: K.add(r[0], r[1], r[2]))
    z, _, _ = op.sync()
    np.testing.assert_allclose(z.unpartition().to_numpy(), 2 * a)
