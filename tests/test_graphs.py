"""`ct.graph` (API.md §2 `graphs` row): capture, replay, update, read, release, and the
ownership rules across graph boundaries. Runs on `sim` and `interpret`; the cuda capture is
checked against a stand-in driver, and for real by the `gpu` test.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.runtime import cuda_driver as cu
from cutile_py.runtime.backend import BoundLaunch, Completion, GraphExec
from tests.support import elementwise_kernels as K
from tests.support.completions import SlowCompletion, until
from tests.support.fake_driver import StreamDriver, graph_driver, vector_add_ptx

N = 1000
TILE = 128


@pytest.fixture(params=["sim", "interpret"], autouse=True)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield request.param
    ct.set_backend("sim")


def _vec(rng: np.random.Generator, n: int = N) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def _add_graph(rng: np.random.Generator) -> tuple[ct.Graph, Any, Any, Any, np.ndarray]:
    a, b = _vec(rng), _vec(rng)
    z, x, y = ct.zeros(N).partition(TILE), ct.from_numpy(a), ct.from_numpy(b)
    return ct.graph(K.add(z, x, y)), z, x, y, a + b


def test_capture_runs_nothing_and_replay_runs(rng: np.random.Generator) -> None:
    g, z, x, y, ref = _add_graph(rng)
    assert g.launches == 1
    np.testing.assert_array_equal(g.read(z), np.zeros(N, np.float32))  # captured, not run
    g.replay()
    np.testing.assert_allclose(g.read(z), ref, rtol=1e-6)
    for _ in range(3):  # fresh inputs between replays
        a, b = _vec(rng), _vec(rng)
        g.update(x, a)
        g.update(y, b)
        g.replay()
        np.testing.assert_allclose(g.read(z), a + b, rtol=1e-6)
        np.testing.assert_array_equal(g.read(x), a)
    out = g.release()
    assert out[0] is z and out[1] is x and out[2] is y
    np.testing.assert_allclose(z.unpartition().to_numpy(), a + b, rtol=1e-6)
    assert x.to_numpy().shape == (N,)  # handed back: usable again
    assert "released" in repr(g)


def test_chain_replays_in_order(rng: np.random.Generator) -> None:
    a, b, c = _vec(rng), _vec(rng), _vec(rng)
    x, y, w = ct.from_numpy(a), ct.from_numpy(b), ct.from_numpy(c)
    out = ct.zeros(N).partition(TILE)
    built = []

    def step2(res: tuple[Any, ...]) -> Any:
        built.append(2)
        return K.saxpy(out, 3.0, res[0].unpartition(), w)

    g = ct.graph(K.add(ct.zeros(N).partition(TILE), x, y).then(step2), name="fused")
    assert g.launches == 2 and built == [2]  # the chain's function ran once, at capture
    assert "graph 'fused'" in repr(g)
    for _ in range(3):
        g.replay()
        np.testing.assert_allclose(g.read(out), 3.0 * (a + b) + c, rtol=1e-5, atol=1e-6)
        a, b, c = _vec(rng), _vec(rng), _vec(rng)
        g.update(x, a)
        g.update(y, b)
        g.update(w, c)
    assert built == [2]
    result = g.release()
    assert result[0] is out and result[3] is w


def test_zip_of_a_chain_and_a_launch(rng: np.random.Generator) -> None:
    a, b = _vec(rng), _vec(rng)
    x, y = ct.from_numpy(a), ct.from_numpy(b)
    z1, z2 = ct.zeros(N).partition(TILE), ct.zeros(N).partition(TILE)
    chained = K.add(ct.zeros(N).partition(TILE), x, y).then(
        lambda r: K.add(z1, r[0].unpartition(), r[1])
    )
    g = ct.graph(ct.zip(chained, K.saxpy(z2, -2.0, x, y)))
    g.replay()
    np.testing.assert_allclose(g.read(z1), a + b + a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g.read(z2), -2.0 * a + b, rtol=1e-5, atol=1e-6)
    (r1, r2) = g.release()
    assert r1[0] is z1 and r2[0] is z2


def test_replay_async_with_asyncio(rng: np.random.Generator) -> None:
    graphs = [_add_graph(rng) for _ in range(3)]

    async def main() -> None:
        await asyncio.gather(*(g.replay_async() for g, *_ in graphs))

    asyncio.run(main())
    for g, z, x, y, ref in graphs:
        np.testing.assert_allclose(g.read(z), ref, rtol=1e-6)
        a = _vec(rng)
        g.update(x, a)
        asyncio.run(g.replay_async())
        np.testing.assert_allclose(g.read(z), a + g.read(y), rtol=1e-6)
        g.release()


def test_bf16_update_takes_float32(rng: np.random.Generator) -> None:
    x16, w16 = _vec(rng).astype(np.float16), _vec(rng)
    z = ct.zeros(N, ct.f16).partition(TILE)
    x, w = ct.from_numpy(x16), ct.from_numpy(w16, dtype=ct.bf16)
    g = ct.graph(K.mixed_f16(z, x, w))
    new_w = _vec(rng)
    g.update(w, new_w)
    with pytest.raises(TypeError, match=r"'x' of kernel mixed_f16 is f16, the array float32"):
        g.update(x, _vec(rng))
    g.replay()
    ref = ct.from_numpy(new_w, dtype=ct.bf16).to_numpy()
    assert np.array_equal(g.read(w), ref)
    assert g.read(z).dtype == np.float16 and g.read(z).shape == (N,)
    assert g.read(w).dtype == np.float32  # NumPy has no bf16


def test_what_read_returns_update_accepts(rng: np.random.Generator) -> None:
    """f16 reads back as float16 (also from to_numpy), bf16 as float32; either array goes
    straight back into `g.update`, unchanged."""
    x16, w32 = _vec(rng).astype(np.float16), _vec(rng)
    z = ct.zeros(N, ct.f16).partition(TILE)
    x, w = ct.from_numpy(x16), ct.from_numpy(w32, dtype=ct.bf16)
    g = ct.graph(K.mixed_f16(z, x, w))
    g.replay()
    out = g.read(z)
    assert out.dtype == np.float16
    g.update(x, out)
    g.update(w, g.read(w))
    assert np.array_equal(g.read(x), out)
    (z, x, w) = g.release()
    assert x.to_numpy().dtype == np.float16 and np.array_equal(x.to_numpy(), out)
    assert z.unpartition().to_numpy().dtype == np.float16
    assert w.to_numpy().dtype == np.float32


# --- ownership across the graph boundary ---------------------------------------------------


def _reading_chain(
    rng: np.random.Generator, read: Callable[[tuple[Any, ...]], np.ndarray], seen: list[Any]
) -> tuple[ct.DeviceOp | Any, np.ndarray]:
    """add, then a step whose function reads the first step's data on the host."""
    a, b = _vec(rng), _vec(rng)
    z, x, y = ct.zeros(N).partition(TILE), ct.from_numpy(a), ct.from_numpy(b)
    w = ct.zeros(N).partition(TILE)

    def step(r: tuple[Any, ...]) -> ct.DeviceOp:
        seen.append(read(r))
        return K.add(w, r[1], r[2])

    return K.add(z, x, y).then(step), a + b


@pytest.mark.parametrize("what", ["input", "output"])
def test_a_host_read_during_capture_is_a_borrow_error(what: str, rng: np.random.Generator) -> None:
    """A chain's function runs once, at capture, before any data exists: reading a tensor the
    graph holds would bake stale data into every replay, so it raises instead, naming the graph;
    run eagerly, the same chain reads the real data."""

    def read(r: tuple[Any, ...]) -> np.ndarray:
        return r[1].to_numpy() if what == "input" else r[0].unpartition().to_numpy()

    seen: list[Any] = []
    chain, ref = _reading_chain(rng, read, seen)
    with pytest.raises(ct.BorrowError, match=r"held by the graph 'step' being captured") as e:
        ct.graph(chain, name="step")
    assert "read the tensor with the graph's .read() after a replay" in str(e.value).lower()
    assert seen == []
    chain, ref = _reading_chain(rng, read, seen)
    with pytest.raises(ct.BorrowError, match=r"held by the graph of add being captured"):
        ct.graph(chain)

    seen.clear()
    chain, ref = _reading_chain(rng, read, seen)
    out = chain.sync()  # eagerly, the read sees the first launch's result
    if what == "output":
        np.testing.assert_allclose(seen[0], ref, rtol=1e-6)
    else:
        assert seen[0].shape == (N,)
    np.testing.assert_allclose(out[0].unpartition().to_numpy(), ref, rtol=1e-6)


def test_tensors_outside_the_graph_stay_readable_during_capture(rng: np.random.Generator) -> None:
    other = ct.from_numpy(_vec(rng))
    seen: list[Any] = []
    chain, _ = _reading_chain(rng, lambda r: other.to_numpy(), seen)
    g = ct.graph(chain)
    g.replay()
    assert len(seen) == 1 and seen[0].shape == (N,)
    g.release()


def test_graphed_tensors_belong_to_the_graph(rng: np.random.Generator) -> None:
    g, z, x, y, _ = _add_graph(rng)
    with pytest.raises(ct.BorrowError, match="held by graph of add"):
        x.to_numpy()
    with pytest.raises(ct.BorrowError, match="held by graph of add"):
        z.unpartition()
    with pytest.raises(ct.BorrowError, match=r"parameter 'z'.*held by graph of add"):
        K.add(z, x, y)
    with pytest.raises(ct.BorrowError, match="held by graph of add"):
        x.partition(TILE)  # would write what the graph reads
    with pytest.raises(ct.BorrowError, match="held by graph"):
        ct.graph(K.add(ct.zeros(N).partition(TILE), x, y)).update(x, _vec(rng))
    # An input the graph only reads may still be read by other launches.
    out = K.add(ct.zeros(N).partition(TILE), x, y).sync()
    np.testing.assert_allclose(out[0].unpartition().to_numpy(), g.read(x) + g.read(y), rtol=1e-6)
    g.release()
    x.to_numpy()
    z.unpartition()


def test_an_input_also_held_by_a_pending_op_cannot_be_updated(rng: np.random.Generator) -> None:
    g, _, x, _, _ = _add_graph(rng)
    pending = K.add(ct.zeros(N).partition(TILE), x, x)
    with pytest.raises(ct.BorrowError, match="also held by the pending launch of kernel add"):
        g.update(x, _vec(rng))
    pending.sync()
    g.update(x, _vec(rng))


def test_a_tensor_another_op_holds_cannot_be_graphed(rng: np.random.Generator) -> None:
    p = ct.zeros(N).partition(TILE)
    x = ct.from_numpy(_vec(rng))
    first = K.add(p, x, x)
    with pytest.raises(ct.BorrowError, match="parameter 'z'"):
        ct.graph(K.add(p, x, x))
    g = ct.graph(first)  # the op's own holds pass to the graph
    with pytest.raises(ct.BorrowError, match=r"captured by ct.graph"):
        first.sync()
    with pytest.raises(ct.BorrowError, match="already run"):
        chain = K.add(ct.zeros(N).partition(TILE), x, x).then(lambda r: K.add(*r))
        chain.sync()
        ct.graph(chain)
    g.release()


def test_update_errors_name_the_tensor(rng: np.random.Generator) -> None:
    g, z, x, y, _ = _add_graph(rng)
    with pytest.raises(
        ValueError, match=r"'y' of kernel add has shape \(1000,\), the array \(7,\)"
    ):
        g.update(y, np.zeros(7, np.float32))
    with pytest.raises(TypeError, match=r"'x' of kernel add is f32, the array float64.*astype"):
        g.update(x, np.zeros(N))
    with pytest.raises(ValueError, match="not an argument of the graph"):
        g.update(ct.zeros(N), np.zeros(N, np.float32))
    with pytest.raises(TypeError, match="expected a Tensor or Partition"):
        g.update(np.zeros(N), np.zeros(N, np.float32))  # type: ignore[arg-type]
    g.update(z, np.ones(N, np.float32))  # a partition updates its whole tensor
    np.testing.assert_array_equal(g.read(z), np.ones(N, np.float32))
    g.release()


def test_read_of_a_tensor_not_in_the_graph(rng: np.random.Generator) -> None:
    g, *_ = _add_graph(rng)
    other = ct.zeros(N)
    with pytest.raises(ValueError, match="not an argument of the graph"):
        g.read(other)
    base = ct.zeros(N)
    p = base.partition(TILE)
    g2 = ct.graph(K.add(p, ct.zeros(N), ct.zeros(N)))
    with pytest.raises(ct.MovedError, match=r"moved by \.partition\(\)"):
        g2.read(base)  # the partition stands for it: read that
    assert g2.read(p).shape == (N,)
    g.release()
    g2.release()


def test_replay_after_release_is_an_error(rng: np.random.Generator) -> None:
    g, z, x, _, _ = _add_graph(rng)
    g.replay()
    g.release()
    with pytest.raises(ct.MovedError, match=r"was released at .*test_graphs\.py:\d+.*ct\.graph"):
        g.replay()
    with pytest.raises(ct.MovedError, match="released"):
        asyncio.run(g.replay_async())
    with pytest.raises(ct.MovedError, match="released"):
        g.read(z)
    with pytest.raises(ct.MovedError, match="released"):
        g.update(x, _vec(rng))
    with pytest.raises(ct.MovedError, match="released"):
        g.release()


class _SlowReplay(GraphExec):
    """Replays whose completion comes only after some polls: an in-flight window on the CPU."""

    def __init__(self, inner: GraphExec) -> None:
        self.inner = inner
        self.made: list[SlowCompletion] = []

    def launch(self, stream: object | None = None) -> Completion:
        self.made.append(SlowCompletion(self.inner.launch(stream), 20))
        return self.made[-1]


def test_no_update_or_read_while_a_replay_is_in_flight(rng: np.random.Generator) -> None:
    g, z, x, _, ref = _add_graph(rng)
    slow = g._exec = _SlowReplay(g._exec)

    async def main() -> None:
        task = asyncio.create_task(g.replay_async())
        await until(lambda: bool(slow.made))
        assert slow.made and not slow.made[0].done()
        with pytest.raises(ct.BorrowError, match="still running"):
            g.update(x, _vec(rng))
        with pytest.raises(ct.BorrowError, match="still running"):
            g.read(z)
        with pytest.raises(ct.BorrowError, match="still running"):
            g.replay()
        with pytest.raises(ct.BorrowError, match="still running"):
            g.release()
        await task
        np.testing.assert_allclose(g.read(z), ref, rtol=1e-6)

    asyncio.run(main())
    g.release()


def test_cancelling_a_replay_waits_for_it(rng: np.random.Generator) -> None:
    g, z, _, _, ref = _add_graph(rng)
    slow = g._exec = _SlowReplay(g._exec)

    async def main() -> None:
        task = asyncio.create_task(g.replay_async())
        for _ in range(3):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert slow.made[0].left <= 0  # the replay finished before the cancellation landed

    asyncio.run(main())
    np.testing.assert_allclose(g.read(z), ref, rtol=1e-6)
    g.release()


class _BlockingReplay(GraphExec):
    """Replays that wait for `release` before executing: if a replay ran on the event loop's
    thread, no task could set it, and the wait times out."""

    def __init__(self, inner: GraphExec) -> None:
        self.inner = inner
        self.release = threading.Event()
        self.threads: list[str] = []

    def launch(self, stream: object | None = None) -> Completion:
        self.threads.append(threading.current_thread().name)
        if not self.release.wait(timeout=10):
            raise AssertionError("the replay blocked the event loop: no other task ran")
        return self.inner.launch(stream)

    def destroy(self) -> None:
        self.inner.destroy()


def test_an_executing_replay_leaves_the_event_loop_free(rng: np.random.Generator) -> None:
    g, z, x, _, ref = _add_graph(rng)
    blocking = g._exec = _BlockingReplay(g._exec)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while ticks < 5:
            await asyncio.sleep(0.001)
            ticks += 1
        with pytest.raises(ct.BorrowError, match="still running"):
            g.read(z)  # the replay is executing in the worker thread
        blocking.release.set()

    async def main() -> None:
        t = asyncio.create_task(ticker())
        await g.replay_async()
        await t

    asyncio.run(main())
    assert ticks == 5 and blocking.threads[0] != threading.main_thread().name
    np.testing.assert_allclose(g.read(z), ref, rtol=1e-6)
    g.release()
    assert x.to_numpy().shape == (N,)


def test_a_replay_orphaned_by_a_closed_event_loop_is_waited_for(
    rng: np.random.Generator,
) -> None:
    g, z, x, _, ref = _add_graph(rng)
    slow = g._exec = _SlowReplay(g._exec)
    loop = asyncio.new_event_loop()
    task = loop.create_task(g.replay_async())
    loop.run_until_complete(until(lambda: bool(slow.made)))  # the replay is in flight ...
    assert not task.done() and not slow.made[0].done()
    loop.close()  # ... and its await will never resume
    np.testing.assert_allclose(g.read(z), ref, rtol=1e-6)  # waits for the replay
    assert slow.made[0].left <= 0
    z2, x2, _ = g.release()
    assert z2 is z and x2 is x
    np.testing.assert_allclose(z.unpartition().to_numpy(), ref, rtol=1e-6)
    del task
    gc.collect()


def test_release_waits_for_a_replay_whose_loop_has_closed(rng: np.random.Generator) -> None:
    g, z, _, _, ref = _add_graph(rng)
    blocking = g._exec = _BlockingReplay(g._exec)
    loop = asyncio.new_event_loop()
    task = loop.create_task(g.replay_async())
    loop.run_until_complete(until(lambda: bool(blocking.threads)))  # executing in the worker
    loop.close()
    assert not task.done()
    threading.Timer(0.05, blocking.release.set).start()
    g.release()  # waits for the worker's replay, then succeeds
    np.testing.assert_allclose(z.unpartition().to_numpy(), ref, rtol=1e-6)


def test_dropping_a_graph_releases_its_tensors(rng: np.random.Generator) -> None:
    g, z, x, _, ref = _add_graph(rng)
    g.replay()
    del g
    gc.collect()
    np.testing.assert_allclose(z.unpartition().to_numpy(), ref, rtol=1e-6)
    assert x.to_numpy().shape == (N,)


def test_capture_of_a_failing_chain_leaves_nothing_held(rng: np.random.Generator) -> None:
    x = ct.from_numpy(_vec(rng))
    p = ct.zeros(N).partition(TILE)

    def bad(res: tuple[Any, ...]) -> Any:
        raise RuntimeError("no next step")

    with pytest.raises(RuntimeError, match="no next step"):
        ct.graph(K.add(p, x, x).then(bad))
    x.to_numpy()
    p.unpartition()
    with pytest.raises(TypeError, match="expected an op"):
        ct.graph(x)  # type: ignore[arg-type]


# --- the cuda capture, on a stand-in driver ------------------------------------------------


def test_cuda_graph_capture_on_a_stand_in_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parameters are packed once, at capture; a replay is one cuGraphLaunch."""
    pytest.importorskip("cuda.bindings")
    from cutile_py.ptx.target import Target
    from cutile_py.runtime.cuda_backend import CudaBackend

    fake = graph_driver(StreamDriver())
    monkeypatch.setattr(cu, "_cu", lambda: fake)
    backend = CudaBackend()
    n = 256
    rng = np.random.default_rng(3)
    a, b = _vec(rng, n), _vec(rng, n)
    bufs = [backend.alloc(4 * n) for _ in range(3)]
    backend.upload(bufs[0], a)
    backend.upload(bufs[1], b)
    kernel = backend.load_kernel(vector_add_ptx(Target(90)), "vadd")
    prepared = backend.prepare(kernel, (2, 1, 1), (128, 1, 1), 0, ["u64", "u64", "u64", "u32"])
    launch = BoundLaunch(prepared, (*(buf.address for buf in bufs), n))
    graph = backend.graph([launch, launch])
    assert fake.captured == 2 and fake.calls.count("cuLaunchKernel") == 0  # nothing ran
    # Captured through the prepared launch: one packed parameter block per launch.
    assert all(isinstance(args[8], int) for _, *args in fake.graph)
    for _ in range(2):
        graph.launch().wait()
    assert fake.replays == 2
    np.testing.assert_array_equal(backend.download(bufs[2], 4 * n).view(np.float32), a + b)
    graph.destroy()
    assert fake.destroyed == ["graph", "exec"]


def test_a_synchronous_replay_on_cuda_waits_on_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """`g.replay()` is one cuGraphLaunch and one stream synchronize: no completion event; a
    fault on the device is a LaunchError saying so."""
    pytest.importorskip("cuda.bindings")
    from cutile_py.ptx.target import Target
    from cutile_py.runtime import select
    from cutile_py.runtime.cuda_backend import CudaBackend

    fake = graph_driver(StreamDriver())
    monkeypatch.setattr(cu, "_cu", lambda: fake)
    monkeypatch.setitem(select._instances, "cuda", CudaBackend())
    monkeypatch.setattr(select, "_active", "cuda")
    n = 256
    rng = np.random.default_rng()
    a, b = _vec(rng, n), _vec(rng, n)
    x, y, z = ct.from_numpy(a), ct.from_numpy(b), ct.empty((n,), ct.f32)
    vadd = ct.RawKernel(vector_add_ptx(Target(90)), "vadd")
    g = ct.graph(vadd(x, y, z, n, grid=2, block=128))
    events, syncs = fake.events, fake.calls.count("cuStreamSynchronize")
    for _ in range(3):
        g.replay()
    assert fake.replays == 3 and fake.events == events
    assert fake.calls.count("cuStreamSynchronize") == syncs + 3
    np.testing.assert_array_equal(g.read(z), a + b)
    fake.sticky = 719  # CUDA_ERROR_LAUNCH_FAILED, as a faulting kernel leaves the context
    with pytest.raises(ct.LaunchError, match="failed on the device"):
        g.replay()
    fake.sticky = 0


# --- on a real GPU -------------------------------------------------------------------------


@pytest.mark.gpu
def test_graphs_on_the_gpu(backend: str) -> None:
    if backend != "sim":
        pytest.skip("runs once, on cuda")
    ct.set_backend("cuda")
    rng = np.random.default_rng(5)
    a, b, c = _vec(rng), _vec(rng), _vec(rng)
    x, y, w = ct.from_numpy(a), ct.from_numpy(b), ct.from_numpy(c)
    out = ct.zeros(N).partition(TILE)
    g = ct.graph(
        K.add(ct.zeros(N).partition(TILE), x, y).then(
            lambda r: K.saxpy(out, 2.0, r[0].unpartition(), w)
        )
    )
    for _ in range(3):
        g.replay()
        np.testing.assert_allclose(g.read(out), 2.0 * (a + b) + c, rtol=1e-5, atol=1e-6)
        a = _vec(rng)
        g.update(x, a)
    asyncio.run(g.replay_async())
    np.testing.assert_allclose(g.read(out), 2.0 * (a + b) + c, rtol=1e-5, atol=1e-6)
    s = ct.Stream()
    g.replay(s)
    g.release()
