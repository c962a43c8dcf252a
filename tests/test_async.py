"""Async launching (API.md §2 `launching` and `streams` rows): `await op`, `op.then(fn)`,
`ct.zip`, `asyncio.gather`, `ct.Stream` / `op.sync_on`, and the ownership rules across them.

Runs on `sim` and `interpret`; a fake slow `Completion` makes a real in-flight window on these
backends, whose launches otherwise finish before returning. The cuda stream logic is checked
against a stand-in driver; the `gpu` tests run it for real.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.host.device_op import DeviceOp
from cutile_py.host.streams import async_stream
from cutile_py.runtime import cuda_driver as cu
from cutile_py.runtime.backend import Completion, ParamValue
from tests.support import elementwise_kernels as K
from tests.support.completions import SlowCompletion, until
from tests.support.fake_driver import StreamDriver, vector_add_ptx

N = 1000
TILE = 128


@pytest.fixture(params=["sim", "interpret"], autouse=True)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield request.param
    ct.set_backend("sim")


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(abs(hash(request.node.name)) % (1 << 32))


def _vec(rng: np.random.Generator, n: int = N) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def _add_op(rng: np.random.Generator) -> tuple[DeviceOp, np.ndarray]:
    a, b = _vec(rng), _vec(rng)
    return K.add(ct.zeros(N).partition(TILE), ct.from_numpy(a), ct.from_numpy(b)), a + b


def _slow(op: DeviceOp, polls: int) -> list[SlowCompletion]:
    """Make `op` launch with a SlowCompletion; the list receives it once launched."""
    made: list[SlowCompletion] = []
    start = op._start

    def slow_start(stream: object | None = None) -> Completion:
        c = SlowCompletion(start(stream), polls)
        made.append(c)
        return c

    op._start = slow_start  # type: ignore[method-assign]
    return made


# --- await, then, zip, gather --------------------------------------------------------------


def test_await_returns_the_same_arguments_and_result(rng: np.random.Generator) -> None:
    op, ref = _add_op(rng)
    args = op.args

    async def main() -> tuple[Any, ...]:
        return await op

    out = asyncio.run(main())
    assert len(out) == 3 and all(o is a for o, a in zip(out, args))
    np.testing.assert_allclose(out[0].unpartition().to_numpy(), ref, rtol=1e-6)
    with pytest.raises(ct.BorrowError, match="already completed"):
        op.sync()


def test_await_does_not_block_the_event_loop(rng: np.random.Generator) -> None:
    op, ref = _add_op(rng)
    made = _slow(op, polls=30)
    ticks = 0

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    async def main() -> tuple[Any, ...]:
        stop = asyncio.Event()
        t = asyncio.create_task(ticker(stop))
        out = await op
        stop.set()
        await t
        return out

    z, _, _ = asyncio.run(main())
    assert made[0].polls >= 30 and ticks > 3
    np.testing.assert_allclose(z.unpartition().to_numpy(), ref, rtol=1e-6)


def _blocks_until(op: DeviceOp, release: threading.Event) -> list[str]:
    """Make `op`'s launch (which executes on sim and interpret) wait for `release`: if the
    launch ran on the event loop's thread, nothing could set it, and the wait times out."""
    start = op._start
    threads: list[str] = []

    def blocking_start(stream: object | None = None) -> Completion:
        threads.append(threading.current_thread().name)
        if not release.wait(timeout=10):
            raise AssertionError("the launch blocked the event loop: no other task ran")
        return start(stream)

    op._start = blocking_start  # type: ignore[method-assign]
    return threads


def test_an_executing_launch_leaves_the_event_loop_free(rng: np.random.Generator) -> None:
    op, ref = _add_op(rng)
    release = threading.Event()
    threads = _blocks_until(op, release)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while ticks < 5:  # five turns of a 1 ms ticker while the launch executes
            await asyncio.sleep(0.001)
            ticks += 1
        release.set()

    async def main() -> tuple[Any, ...]:
        t = asyncio.create_task(ticker())
        out = await op
        await t
        return out

    z, x, _ = asyncio.run(main())
    assert ticks == 5 and threads and threads[0] != threading.main_thread().name
    np.testing.assert_allclose(z.unpartition().to_numpy(), ref, rtol=1e-6)
    assert x.to_numpy().shape == (N,)


def test_cancelling_an_executing_launch_waits_for_it(rng: np.random.Generator) -> None:
    op, ref = _add_op(rng)
    release = threading.Event()
    threads = _blocks_until(op, release)
    z, x, _ = op.args

    async def main() -> None:
        task = asyncio.create_task(_await(op))
        await until(lambda: bool(threads))  # executing in the worker thread
        task.cancel()
        await asyncio.sleep(0.01)
        assert not task.done()  # the cancellation waits for the launch ...
        with pytest.raises(ct.BorrowError, match="pending launch of kernel add made at"):
            x.to_numpy()  # ... which still holds its arguments
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    np.testing.assert_allclose(z.unpartition().to_numpy(), ref, rtol=1e-6)


def test_a_pending_op_names_the_line_that_made_it(rng: np.random.Generator) -> None:
    # The line is looked up from the bytecode offset only for the message: it must be the
    # call's own line, also where the op is made in a chain step's function.
    a, b = _vec(rng), _vec(rng)
    z, x, y = ct.zeros(N).partition(TILE), ct.from_numpy(a), ct.from_numpy(b)
    here = sys._getframe().f_lineno
    op = K.add(z, x, y)
    with pytest.raises(ct.BorrowError, match=rf"made at .*test_async.py:{here + 1}, not"):
        x.to_numpy()
    z, x, y = op.sync()
    seen: list[str] = []

    def step(r: tuple[Any, ...]) -> Any:
        first = sys._getframe().f_lineno
        nxt = K.add(r[0], r[1], r[2])
        with pytest.raises(ct.BorrowError) as e:
            r[1].to_numpy()
        seen.append(f"{first + 1}" if f"test_async.py:{first + 1}, not" in str(e.value) else "")
        return nxt

    z, x, y = K.add(z, x, y).then(step).sync()
    assert len(seen) == 1 and seen[0]
    np.testing.assert_allclose(z.unpartition().to_numpy(), a + b, rtol=1e-6)


@pytest.mark.parametrize("how", ["create_task", "ensure_future", "gather", "wait_for"])
def test_a_task_cancelled_before_its_op_ran_hands_the_arguments_back(
    rng: np.random.Generator, how: str
) -> None:
    a, b = _vec(rng), _vec(rng)
    z, x, y = ct.zeros(N).partition(TILE), ct.from_numpy(a), ct.from_numpy(b)
    op = K.add(z, x, y)
    with pytest.raises(ct.BorrowError, match=r"made at .*test_async.py:\d+, not run yet"):
        x.to_numpy()

    async def main() -> None:
        if how == "wait_for":
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(op, timeout=0)
            return
        task: asyncio.Future[Any]
        if how == "create_task":
            task = asyncio.create_task(op)
        elif how == "ensure_future":
            task = asyncio.ensure_future(op)
        else:
            task = asyncio.gather(op)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # At once, with the task object still alive: nothing ran, nothing is held.
        np.testing.assert_array_equal(x.to_numpy(), a)
        np.testing.assert_array_equal(z.unpartition().to_numpy(), np.zeros(N, np.float32))

    asyncio.run(main())
    np.testing.assert_array_equal(y.to_numpy(), b)
    with pytest.raises(ct.BorrowError, match=r"never ran .*cancelled before it started"):
        op.sync()


@pytest.mark.parametrize("runner", ["create_task", "run"])
def test_an_op_is_a_coroutine_for_asyncio(rng: np.random.Generator, runner: str) -> None:
    op, ref = _add_op(rng)
    chain = op.then(lambda res: K.add(ct.zeros(N).partition(TILE), res[0].unpartition(), res[1]))

    async def main() -> tuple[Any, ...]:
        return await asyncio.create_task(chain)

    out = asyncio.run(main()) if runner == "create_task" else asyncio.run(chain)
    x = op.args[1].to_numpy()
    np.testing.assert_allclose(out[0].unpartition().to_numpy(), ref + x, rtol=1e-5, atol=1e-6)


def test_then_chain_feeds_results_forward(rng: np.random.Generator) -> None:
    a, b, c = _vec(rng), _vec(rng), _vec(rng)
    x, y, w = (ct.from_numpy(v) for v in (a, b, c))

    def step2(res: tuple[Any, ...]) -> ct.DeviceOp:
        z, _, _ = res
        return K.saxpy(ct.zeros(N).partition(TILE), 2.0, z.unpartition(), w)

    def step3(res: tuple[Any, ...]) -> ct.DeviceOp:
        return K.add(ct.zeros(N).partition(TILE), res[0].unpartition(), res[3])

    ref = 2.0 * (a + b) + c + c
    chain = K.add(ct.zeros(N).partition(TILE), x, y).then(step2).then(step3)
    out = chain.sync()
    np.testing.assert_allclose(out[0].unpartition().to_numpy(), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ct.BorrowError, match="already run"):
        chain.sync()

    chain2 = K.add(ct.zeros(N).partition(TILE), x, y).then(step2).then(step3)
    out2 = asyncio.run(_await(chain2))
    np.testing.assert_allclose(out2[0].unpartition().to_numpy(), ref, rtol=1e-5, atol=1e-6)


async def _await(op: ct.DeviceOp | Any) -> Any:
    return await op


def test_then_rejects_a_function_returning_no_op(rng: np.random.Generator) -> None:
    op, _ = _add_op(rng)
    with pytest.raises(TypeError, match="must return an op"):
        op.then(lambda res: res).sync()  # type: ignore[arg-type, return-value]
    assert op.args[1].to_numpy().shape == (N,)  # handed back despite the error


def test_zip_runs_ops_together(rng: np.random.Generator) -> None:
    ops, refs = zip(*(_add_op(rng) for _ in range(3)))
    out = ct.zip(*ops).sync()
    assert len(out) == 3
    for (z, _, _), ref in zip(out, refs):
        np.testing.assert_allclose(z.unpartition().to_numpy(), ref, rtol=1e-6)

    ops2, refs2 = zip(*(_add_op(rng) for _ in range(3)))
    chained = ct.zip(ops2[0], ops2[1].then(lambda r: K.add(r[0], r[1], r[2])), ops2[2])
    out2 = asyncio.run(_await(chained))
    for (z, _, _), ref in zip(out2, refs2):
        np.testing.assert_allclose(z.unpartition().to_numpy(), ref, rtol=1e-6)


def test_gather_of_many_ops(rng: np.random.Generator) -> None:
    pairs = [_add_op(rng) for _ in range(50)]
    for op, _ in pairs[::7]:
        _slow(op, polls=5)

    async def main() -> list[tuple[Any, ...]]:
        return await asyncio.gather(*(op for op, _ in pairs))

    outs = asyncio.run(main())
    for (op, ref), out in zip(pairs, outs):
        assert out[0] is op.args[0]
        np.testing.assert_allclose(out[0].unpartition().to_numpy(), ref, rtol=1e-6)


# --- ownership across async boundaries -----------------------------------------------------


def test_arguments_are_held_until_the_await_completes(rng: np.random.Generator) -> None:
    op, ref = _add_op(rng)
    made = _slow(op, polls=20)
    z, x, _ = op.args

    async def main() -> None:
        task = asyncio.create_task(_await(op))
        await until(lambda: bool(made))  # the op is launched and in flight
        assert op._completion is not None and not op._completion.done()
        with pytest.raises(ct.BorrowError, match="held by the pending"):
            x.to_numpy()
        with pytest.raises(ct.BorrowError):
            z.unpartition()
        with pytest.raises(ct.BorrowError, match="parameter 'z'"):
            K.add(z, x, x)
        # A tensor held shared may still be read by another launch.
        other = K.add(ct.zeros(N).partition(TILE), x, x)
        with pytest.raises(ct.BorrowError, match="held by the pending"):
            other.sync()[1].to_numpy()  # x is still the first op's
        await task

    asyncio.run(main())
    np.testing.assert_allclose(z.unpartition().to_numpy(), ref, rtol=1e-6)
    assert x.to_numpy().shape == (N,)


def test_same_partition_in_two_zipped_ops_raises(rng: np.random.Generator) -> None:
    p = ct.zeros(N).partition(TILE)
    x = ct.from_numpy(_vec(rng))
    with pytest.raises(ct.BorrowError, match="parameter 'z'"):
        ct.zip(K.add(p, x, x), K.add(p, x, x))
    op = K.add(p, x, x)  # the failed attempt left nothing held
    with pytest.raises(ct.AliasError, match="same launch"):
        ct.zip(op, op)
    op.sync()
    with pytest.raises(ct.BorrowError, match="already completed"):
        ct.zip(op)


def test_cancellation_mid_flight_hands_the_arguments_back(rng: np.random.Generator) -> None:
    op, ref = _add_op(rng)
    made = _slow(op, polls=40)
    z, x, y = op.args

    async def main() -> None:
        task = asyncio.create_task(_await(op))
        await until(lambda: bool(made))
        assert made and not made[0].done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The device work finished before the holds were released.
        assert made[0].left <= 0 and op._finished

    asyncio.run(main())
    np.testing.assert_allclose(z.unpartition().to_numpy(), ref, rtol=1e-6)
    assert x.to_numpy().shape == y.to_numpy().shape == (N,)


def test_cancelling_a_zip_waits_for_every_member(rng: np.random.Generator) -> None:
    pairs = [_add_op(rng) for _ in range(3)]
    slow = [_slow(op, polls=10 + 10 * i) for i, (op, _) in enumerate(pairs)]

    async def main() -> None:
        zipped = ct.zip(*(op for op, _ in pairs))
        task = asyncio.create_task(_await(zipped))
        for _ in range(4):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert all(s[0].left <= 0 for s in slow)

    asyncio.run(main())
    for op, ref in pairs:
        np.testing.assert_allclose(op.args[0].unpartition().to_numpy(), ref, rtol=1e-6)


def test_dropping_an_in_flight_op_waits_and_releases(rng: np.random.Generator) -> None:
    op, _ = _add_op(rng)
    made = _slow(op, polls=10)
    x = op.args[1]
    op._launch()
    with pytest.raises(ct.BorrowError):
        x.to_numpy()
    del op
    gc.collect()  # the fake's patched method makes a reference cycle
    assert made[0].left <= 0
    assert x.to_numpy().shape == (N,)


# --- streams -------------------------------------------------------------------------------


def test_sync_on_a_stream(rng: np.random.Generator) -> None:
    s1, s2 = ct.Stream(), ct.Stream()
    (op1, ref1), (op2, ref2) = _add_op(rng), _add_op(rng)
    z1 = op1.sync_on(s1)[0]
    z2 = op2.then(lambda r: K.add(r[0], r[1], r[2])).sync_on(s2)[0]
    s1.synchronize()
    np.testing.assert_allclose(z1.unpartition().to_numpy(), ref1, rtol=1e-6)
    np.testing.assert_allclose(z2.unpartition().to_numpy(), ref2, rtol=1e-6)
    (op3, _), (op4, ref4) = _add_op(rng), _add_op(rng)
    out = ct.zip(op3, op4).sync_on(s1)
    np.testing.assert_allclose(out[1][0].unpartition().to_numpy(), ref4, rtol=1e-6)
    assert "Stream on" in repr(s1)


# --- the cuda stream logic, on a stand-in driver -------------------------------------------


def test_cuda_streams_on_a_stand_in_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launches on a pooled stream run there, after the work of the backend stream."""
    pytest.importorskip("cuda.bindings")
    from cutile_py.ptx.target import Target
    from cutile_py.runtime.cuda_backend import CudaBackend

    fake = StreamDriver()
    fake.slow_events = True  # the uploads are still in flight at the launch
    monkeypatch.setattr(cu, "_cu", lambda: fake)
    backend = CudaBackend()
    n = 256
    rng = np.random.default_rng(7)
    a, b = _vec(rng, n), _vec(rng, n)
    bufs = [backend.alloc(4 * n) for _ in range(3)]
    backend.upload(bufs[0], a)
    backend.upload(bufs[1], b)
    kernel = backend.load_kernel(vector_add_ptx(Target(90)), "vadd")
    params = [ParamValue("u64", buf.address) for buf in bufs] + [ParamValue("u32", n)]

    handles = [async_stream(backend) for _ in range(5)]
    assert len({id(h) for h in handles[:4]}) == 4 and handles[4] is handles[0]
    s = handles[1]
    assert isinstance(s, cu.Stream) and s.raw != "stream"
    done = backend.launch(kernel, (2, 1, 1), (128, 1, 1), 0, params, s)
    assert fake.launched_on[-1] == s.raw
    # Not told what it touches, it waits for everything: a fence recorded on the backend
    # stream, and the uploads' own events.
    assert fake.recorded[-2:] == ["stream", s.raw] and {w[0] for w in fake.waits} == {s.raw}
    assert len(fake.waits) == 3
    done.wait()
    np.testing.assert_array_equal(backend.download(bufs[2], 4 * n).view(np.float32), a + b)

    backend.launch(kernel, (2, 1, 1), (128, 1, 1), 0, params).wait()
    assert fake.launched_on[-1] == "stream" and len(fake.waits) == 3  # default: no fence
    backend.stream_synchronize(s)

    own = backend.stream_acquire()
    backend.stream_release(own)
    assert backend.stream_acquire() is own  # pooled, not destroyed
    with pytest.raises(TypeError, match="cannot launch on"):
        backend.launch(kernel, (2, 1, 1), (128, 1, 1), 0, params, "stream")


# --- on a real GPU -------------------------------------------------------------------------


@pytest.mark.gpu
def test_gather_and_streams_on_the_gpu(backend: str) -> None:
    if backend != "sim":
        pytest.skip("runs once, on cuda")
    ct.set_backend("cuda")
    rng = np.random.default_rng(11)
    pairs = [_add_op(rng) for _ in range(64)]

    async def main() -> list[tuple[Any, ...]]:
        return await asyncio.gather(*(op for op, _ in pairs))

    for (_, ref), out in zip(pairs, asyncio.run(main())):
        np.testing.assert_allclose(out[0].unpartition().to_numpy(), ref, rtol=1e-6)
    streams = [ct.Stream() for _ in range(3)]
    for s in streams:
        op, ref = _add_op(rng)
        z = op.sync_on(s)[0]
        np.testing.assert_allclose(z.unpartition().to_numpy(), ref, rtol=1e-6)
    op, ref = _add_op(rng)
    chain = op.then(lambda r: K.add(r[0], r[1], r[2]))
    out = asyncio.run(_await(chain))
    np.testing.assert_allclose(out[0].unpartition().to_numpy(), ref, rtol=1e-6)


@pytest.mark.parametrize("form", ["then_series", "recursive_fn"])
def test_long_chains_run_in_constant_stack_depth(form: str) -> None:
    """A chain longer than Python's recursion limit runs (it used to raise RecursionError
    near 990 steps), built either as a `.then` series or by a function that chains again."""
    steps = 1200
    n, tile = 8, 8
    one = ct.from_numpy(np.ones(n, np.float32))
    start = np.random.default_rng().standard_normal(n).astype(np.float32)

    def inc(res: tuple[Any, ...]) -> ct.DeviceOp:
        return K.add(ct.empty(n).partition(tile), res[0].unpartition(), one)

    first = K.add(ct.empty(n).partition(tile), ct.from_numpy(start), one)
    if form == "then_series":
        chain: Any = first
        for _ in range(steps):
            chain = chain.then(inc)
    else:
        left = [steps]

        def again(res: tuple[Any, ...]) -> Any:
            left[0] -= 1
            op = inc(res)
            return op.then(again) if left[0] > 0 else op

        chain = first.then(again)
    out = chain.sync()
    np.testing.assert_allclose(out[0].unpartition().to_numpy(), start + steps + 1, rtol=1e-5)


def test_zip_overlap_sweep_agrees_with_pairwise_check() -> None:
    """The zip's alias check (one sweep in address order) finds a clash exactly when some pair
    of spans of different ops overlaps with at least one exclusive: checked against the
    pairwise definition on random span sets."""
    from cutile_py.host.pipeline import _first_clash, _Span

    rng = np.random.default_rng()
    dummy = ct.zeros(1)
    for _ in range(3000):
        n = int(rng.integers(0, 8))
        spans = []
        for _ in range(n):
            lo = int(rng.integers(0, 40))
            spans.append(
                _Span(
                    lo,
                    lo + int(rng.integers(1, 12)),
                    int(rng.integers(0, 4)),
                    bool(rng.integers(0, 2)),
                    dummy,
                )
            )
        pairwise = any(
            a.op != b.op and (a.exclusive or b.exclusive) and a.lo < b.hi and b.lo < a.hi
            for k, a in enumerate(spans)
            for b in spans[k + 1 :]
        )
        clash = _first_clash(spans)
        assert (clash is not None) == pairwise, spans
        if clash is not None:
            a, b = clash
            assert a.op != b.op and (a.exclusive or b.exclusive)
            assert a.lo < b.hi and b.lo < a.hi


def test_zip_of_a_thousand_ops() -> None:
    rng = np.random.default_rng()
    xs = [rng.standard_normal(4).astype(np.float32) for _ in range(1000)]
    one = ct.from_numpy(np.ones(4, np.float32))
    ops = [K.add(ct.empty(4).partition(4), ct.from_numpy(x), one) for x in xs]
    out = ct.zip(*ops).sync()
    for (z, _, _), x in zip(out, xs):
        np.testing.assert_allclose(z.unpartition().to_numpy(), x + 1, rtol=1e-6)
