"""One launch path (DESIGN.md, "The launch path"): every launcher (sync, await, `.then`,
`ct.zip`, graph capture, `ct.RawKernel`) reaches the device through the backend's prepared
launch, on sim, interpret and cuda (over a stand-in driver); and a launch's host cost stays a
plan lookup, the ownership checks and one driver call."""

from __future__ import annotations

import asyncio
import cProfile
import pstats
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.runtime import backend as rb
from cutile_py.runtime import cuda_backend as cb
from tests.support import elementwise_kernels as K
from tests.support.fake_driver import vector_add_ptx

N = 512
TILE = 128


class Spy:
    """Counts the calls that reach each backend's prepared launch."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for cls, name in (
            (rb._PreparedThroughLaunch, "launch"),  # sim
            (rb._HostLaunch, "launch"),  # interpret
            (cb.CudaPreparedLaunch, "run"),  # cuda: every launch, waited for or not
            (cb.CudaPreparedLaunch, "capture"),  # cuda: a launch a graph records
        ):
            monkeypatch.setattr(cls, name, self._counting(getattr(cls, name), name))

    def _counting(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return method(*args, **kwargs)

        return counted


@pytest.fixture(params=["sim", "interpret"])
def cpu(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield request.param


def _inputs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, Any, Any]:
    a = rng.standard_normal(N).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    return a, b, ct.from_numpy(a), ct.from_numpy(b)


def _out() -> Any:
    return ct.empty((N,), ct.f32).partition(TILE)


def test_every_launcher_goes_through_the_prepared_launch(
    cpu: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    a, b, x, y = _inputs(rng)
    want = "launch"

    z, x, y = K.add(_out(), x, y).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), a + b)
    assert spy.calls == [want]

    z, x, y = asyncio.run(_awaited(K.add(_out(), x, y)))
    np.testing.assert_array_equal(z.unpartition().to_numpy(), a + b)
    assert spy.calls == [want] * 2

    z, y, x = K.add(_out(), x, y).then(lambda r: K.add(_out(), r[2], r[1])).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), b + a)
    assert spy.calls == [want] * 4

    (z1, x, y), (z2, _, _) = ct.zip(K.add(_out(), x, y), K.add(_out(), y, y)).sync()
    np.testing.assert_array_equal(z1.unpartition().to_numpy(), a + b)
    np.testing.assert_array_equal(z2.unpartition().to_numpy(), 2 * b)
    assert spy.calls == [want] * 6

    g = ct.graph(K.add(_out(), x, y))
    assert spy.calls == [want] * 6  # capturing runs nothing
    g.replay()
    g.replay()
    z, x, y = g.release()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), a + b)
    assert spy.calls == [want] * 8


async def _awaited(op: Any) -> Any:
    return await op


def test_a_raw_kernel_goes_through_the_prepared_launch(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    a, b, x, y = _inputs(rng)
    z = ct.empty((N,), ct.f32)
    vadd = ct.RawKernel(vector_add_ptx(_target()), "vadd")
    x, y, z, _ = vadd(x, y, z, N, grid=N // TILE, block=TILE).sync()
    np.testing.assert_array_equal(z.to_numpy(), a + b)
    g = ct.graph(vadd(x, y, z, N, grid=N // TILE, block=TILE))
    g.replay()
    np.testing.assert_array_equal(g.read(z), a + b)
    assert spy.calls == ["launch"] * 2


def _target() -> Any:
    from cutile_py.runtime.select import active_backend

    return active_backend().target


@pytest.fixture
def null_cuda() -> Iterator[Any]:
    """The real cuda backend, active, over a driver whose calls return at once."""
    pytest.importorskip("cuda.bindings")
    from cutile_py.runtime import cuda_driver as cu
    from paper_repro.experiments.host import null_cuda as make
    from paper_repro.null_driver import NullDriver

    with make(check_arguments=True):
        driver = cu._cu()
        assert isinstance(driver, NullDriver)
        yield driver


def test_on_cuda_every_launcher_goes_through_the_prepared_launch(
    null_cuda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    rng = np.random.default_rng()
    _, _, x, y = _inputs(rng)
    _, x, y = K.add(_out(), x, y).sync()
    asyncio.run(_awaited(K.add(_out(), x, y)))
    K.add(_out(), x, y).then(lambda r: K.add(r[0], r[1], r[2])).sync()
    ct.zip(K.add(_out(), x, y), K.add(_out(), y, x)).sync()
    assert spy.calls == ["run"] * 6
    g = ct.graph(K.add(_out(), x, y).then(lambda r: K.add(r[0], r[1], r[2])))
    assert spy.calls[6:] == ["capture"] * 2  # the capture records both through their plans
    g.replay()
    g.release()
    vadd = ct.RawKernel(vector_add_ptx(_target()), "vadd")
    w = ct.empty((N,), ct.f32)
    vadd(x, y, w, N, grid=N // TILE, block=TILE).sync()
    ct.graph(vadd(x, y, w, N, grid=N // TILE, block=TILE)).release()
    assert spy.calls[8:] == ["run", "capture"]


def _calls_per_launch(body: Callable[[], None], launches: int) -> float:
    profile = cProfile.Profile()
    profile.enable()
    body()
    profile.disable()
    stats = pstats.Stats(profile)
    return sum(s[1] for s in stats.stats.values()) / launches  # type: ignore[attr-defined]


def test_a_synchronous_launch_costs_few_python_calls() -> None:
    """The launch path in Python calls per launch (cProfile counts them; a machine's speed
    does not change them): the plan lookup, the ownership checks and flips, one driver call
    and one stream synchronize. 111 before the launch plan; 46 with it. (Over the null
    driver as the host experiment times it: without the argument check's calls.)"""
    pytest.importorskip("cuda.bindings")
    from paper_repro.experiments.host import null_cuda as make

    with make():
        _count_sync_launches()


def _count_sync_launches() -> None:
    rng = np.random.default_rng()
    _, _, x, y = _inputs(rng)
    state = [_out(), x, y]
    K.add(*state).sync()  # compiled and planned
    state = list(K.add(*state).sync())

    def body() -> None:
        z, a, b = state
        for _ in range(200):
            z, a, b = K.add(z, a, b).sync()
        state[:] = [z, a, b]

    assert _calls_per_launch(body, 200) <= 60


def test_each_cuda_backend_launches_with_its_own_module() -> None:
    """Two cuda backends (two devices, or a driver replaced) share compiled kernels but not
    loaded modules or prepared launches: each launch goes to its own backend."""
    pytest.importorskip("cuda.bindings")
    from cutile_py.runtime.select import active_backend
    from paper_repro.experiments.host import null_cuda as make

    rng = np.random.default_rng()
    launched_on = []
    for _ in range(2):
        with make(check_arguments=True):
            _, _, x, y = _inputs(rng)
            op = K.add(_out(), x, y)
            op.sync()
            assert op.plan.launch is not None
            launched_on.append((op.plan.launch._backend, active_backend()))  # type: ignore[attr-defined]
    assert all(used is active for used, active in launched_on)
    assert launched_on[0][1] is not launched_on[1][1]


def test_every_launcher_on_cuda_over_a_stand_in_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """A raw `vadd` kernel, which the stand-in driver runs in NumPy, through sync, await,
    `.then`, `ct.zip` and a graph on the cuda backend: results against NumPy, and each
    launch through the prepared launch (a graph's through its capture)."""
    pytest.importorskip("cuda.bindings")
    from cutile_py.ptx.target import Target
    from cutile_py.runtime import cuda_driver as cu
    from cutile_py.runtime import select
    from tests.support.fake_driver import StreamDriver, graph_driver

    fake = graph_driver(StreamDriver())
    monkeypatch.setattr(cu, "_cu", lambda: fake)
    monkeypatch.setitem(select._instances, "cuda", cb.CudaBackend())
    monkeypatch.setattr(select, "_active", "cuda")
    spy = Spy(monkeypatch)
    vadd = ct.RawKernel(vector_add_ptx(Target(90)), "vadd")
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    x, y = ct.from_numpy(a), ct.from_numpy(b)
    z, w = ct.empty((N,), ct.f32), ct.empty((N,), ct.f32)
    grid = N // TILE

    x, y, z, _ = vadd(x, y, z, N, grid=grid, block=TILE).sync()
    np.testing.assert_array_equal(z.to_numpy(), a + b)
    z, _, w, _ = asyncio.run(_awaited(vadd(z, z, w, N, grid=grid, block=TILE)))
    np.testing.assert_array_equal(w.to_numpy(), 2 * (a + b))
    step = vadd(x, y, w, N, grid=grid, block=TILE)  # w = a + b, then w = a + w
    x, w, _, _ = step.then(lambda r: vadd(r[0], r[2], r[2], N, grid=grid, block=TILE)).sync()
    np.testing.assert_array_equal(w.to_numpy(), a + (a + b))
    (x, _, z, _), (y, _, w, _) = ct.zip(
        vadd(x, x, z, N, grid=grid, block=TILE), vadd(y, y, w, N, grid=grid, block=TILE)
    ).sync()
    np.testing.assert_array_equal(z.to_numpy(), 2 * a)
    np.testing.assert_array_equal(w.to_numpy(), 2 * b)
    assert spy.calls == ["run"] * 6
    g = ct.graph(vadd(y, y, z, N, grid=grid, block=TILE))
    g.update(y, 3 * b)
    g.replay()
    np.testing.assert_array_equal(g.read(z), 6 * b)
    g.release()
    assert spy.calls[6:] == ["capture"]
