"""Adversarial checks of the launch path's fast paths (the plan's generated `admit`, its
`release`, the plan lookup's last-hit shortcut, the cuda parameter block reuse): each launch
here is made twice or more, so that the second goes through the planned fast path."""

from __future__ import annotations

import gc
import struct
import sys
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from tests.support import elementwise_kernels as K

N, TILE = 256, 64
B = TypeVar("B")


@ct.kernel
def two_outputs(z: Mut[Tensor[f32, B]], w: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t + 1.0)
    w.store(t * 2.0)


@pytest.fixture(params=["sim", "interpret"])
def cpu(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield request.param


def _vec(rng: np.random.Generator) -> tuple[np.ndarray, Any]:
    a = rng.standard_normal(N).astype(np.float32)
    return a, ct.from_numpy(a)


def _out() -> Any:
    return ct.empty((N,), ct.f32).partition(TILE)


def _warm(rng: np.random.Generator) -> None:
    """A launch of `K.add` on fresh tensors: the plan exists before the attack."""
    _, x = _vec(rng)
    _, y = _vec(rng)
    K.add(_out(), x, y).sync()


def test_a_pending_op_holds_its_output_against_a_planned_launch(cpu: str) -> None:
    rng = np.random.default_rng()
    _warm(rng)
    a, x = _vec(rng)
    b, y = _vec(rng)
    p = _out()
    op = K.add(p, x, y)
    for _ in range(2):
        with pytest.raises(ct.BorrowError, match="parameter 'z'"):
            K.add(p, x, y)
    # A shared input held by the pending op may be read by another launch, not written.
    z2, _, _ = K.add(_out(), x, x).sync()
    np.testing.assert_array_equal(z2.unpartition().to_numpy(), a + a)
    with pytest.raises(ct.BorrowError):
        x.partition(TILE)
    z, x, y = op.sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), a + b)
    assert x._shared == [] and y._shared == [] and z._exclusive is None
    x.partition(TILE)  # every hold let go


def test_the_same_tensor_twice_as_input_is_held_once_and_released(cpu: str) -> None:
    rng = np.random.default_rng()
    _warm(rng)
    a, x = _vec(rng)
    for _ in range(3):
        op = K.add(_out(), x, x)
        assert len(x._shared) == 1
        z, x2, _ = op.sync()
        assert x2 is x and x._shared == []
        np.testing.assert_array_equal(z.unpartition().to_numpy(), a + a)


def test_one_partition_for_two_mut_parameters_is_an_alias_error(cpu: str) -> None:
    rng = np.random.default_rng()
    a, x = _vec(rng)
    z, w, _ = two_outputs(_out(), _out(), x).sync()  # the plan
    np.testing.assert_array_equal(z.unpartition().to_numpy(), a + 1)
    np.testing.assert_array_equal(w.unpartition().to_numpy(), a * 2)
    p = _out()
    for _ in range(2):
        with pytest.raises(ct.AliasError, match="'z' and 'w'"):
            two_outputs(p, p, x)
    assert p._exclusive is None and x._shared == []  # nothing held by the refused launches
    z, _, _ = K.add(p, x, x).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), a + a)


def test_two_imports_of_one_array_alias_through_the_planned_path(cpu: str) -> None:
    rng = np.random.default_rng()
    _warm(rng)
    a = rng.standard_normal(N).astype(np.float32)
    b, y = _vec(rng)
    first = ct.from_dlpack(a)  # two tensors over one NumPy array's memory
    second = ct.from_dlpack(a)
    out = first.partition(TILE)
    with pytest.raises(ct.AliasError):
        K.add(out, second, y)
    pending = K.add(out, y, y)  # holds `first`'s memory exclusively
    for _ in range(2):
        with pytest.raises(ct.BorrowError, match="parameter 'x'"):
            K.add(_out(), second, y)
    z, _, _ = pending.sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), b + b)
    z2, _, _ = K.add(_out(), second, y).sync()
    np.testing.assert_array_equal(z2.unpartition().to_numpy(), b + b + b)


def test_moved_and_foreign_tensors_are_refused_by_a_planned_launch(cpu: str) -> None:
    rng = np.random.default_rng()
    _warm(rng)
    _, x = _vec(rng)
    _, y = _vec(rng)
    x.reshape(N)
    for _ in range(2):
        with pytest.raises(ct.MovedError, match="parameter 'x'"):
            K.add(_out(), x, y)
    other = "interpret" if cpu == "sim" else "sim"
    _, y = _vec(rng)
    ct.set_backend(other)
    _warm(rng)
    for _ in range(2):
        with pytest.raises(ValueError, match="parameter 'y'"):
            K.add(_out(), ct.from_numpy(np.ones(N, np.float32)), y)
    ct.set_backend(cpu)


def test_dropping_a_pending_or_finished_op_releases_its_holds(cpu: str) -> None:
    rng = np.random.default_rng()
    _warm(rng)
    a, x = _vec(rng)
    b, y = _vec(rng)
    p = _out()
    op = K.add(p, x, y)
    cycle: list[Any] = [op]
    cycle.append(cycle)  # freed by the cycle collector, which clears weak references first
    del op, cycle
    gc.collect()
    assert p._exclusive is None and x._shared == [] and y._shared == []
    z, _, _ = K.add(p, x, y).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), a + b)


def test_a_failing_chain_step_leaves_nothing_held(cpu: str) -> None:
    rng = np.random.default_rng()
    _warm(rng)
    a, x = _vec(rng)
    b, y = _vec(rng)

    def boom(r: tuple[Any, ...]) -> Any:
        raise RuntimeError("step failed")

    p = _out()
    with pytest.raises(RuntimeError, match="step failed"):
        K.add(p, x, y).then(lambda r: K.add(r[0], r[1], r[2])).then(boom).sync()
    assert p._exclusive is None and x._shared == [] and y._shared == []
    np.testing.assert_array_equal(p.unpartition().to_numpy(), a + b)


def test_threads_launching_one_kernel_at_once(cpu: str) -> None:
    rng = np.random.default_rng()
    _warm(rng)
    inputs = [(_vec(rng), _vec(rng)) for _ in range(4)]
    errors: list[BaseException] = []
    results: dict[int, list[np.ndarray]] = {}

    def work(k: int) -> None:
        try:
            ct.set_backend(cpu)
            (_, x), (_, y) = inputs[k]
            got = []
            for _ in range(3):
                z, _, _ = K.add(_out(), x, y).sync()
                got.append(z.unpartition().to_numpy())
            results[k] = got
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k, ((a, _), (b, _)) in enumerate(inputs):
        for got in results[k]:
            np.testing.assert_array_equal(got, a + b)


def test_ops_collected_together_by_the_cycle_collector_release_everything(
    cpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cycle collector clears weak references to all the ops it frees before any
    finalizer runs: each op then finds only dead references in a shared holder list."""
    rng = np.random.default_rng()
    _warm(rng)
    a, x = _vec(rng)
    b, y = _vec(rng)
    raised: list[Any] = []
    monkeypatch.setattr("sys.unraisablehook", raised.append)
    cycle: list[Any] = [K.add(_out(), x, y), K.add(_out(), x, y)]
    cycle.append(cycle)
    assert len(x._shared) == 2 and len(y._shared) == 2
    del cycle
    gc.collect()
    assert not raised, [r.exc_value for r in raised]
    assert x._shared == [] and y._shared == []
    z, _, _ = K.add(_out(), x, y).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), a + b)


@pytest.fixture
def null_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, ...]]]:
    """The real cuda backend, active, over a driver whose calls return at once; yields the
    parameter values each launch handed the driver, decoded from its parameter block."""
    pytest.importorskip("cuda.bindings")
    from cutile_py.runtime import cuda_driver as cu
    from paper_repro.experiments.host import null_cuda as make

    seen: list[tuple[Any, ...]] = []
    real = cu.launch_kernel_packed

    def spy(
        function: Any, grid: Any, block: Any, shared: Any, stream: Any, params: Any, *rest: Any
    ) -> None:
        fmt = "<" + "".join(cu._SLOT_FORMAT[t] for t in params.ptypes)
        values = struct.unpack_from(fmt, params.slots.raw)
        # The null driver's addresses start at 2**32; the dims and scalars here are smaller.
        seen.append((tuple(v for v in values if isinstance(v, int) and v >= 1 << 32), values))
        real(function, grid, block, shared, stream, params, *rest)

    monkeypatch.setattr(cu, "launch_kernel_packed", spy)
    with make(check_arguments=True):
        yield seen  # type: ignore[misc]


def _addresses(*tensors: Any) -> tuple[int, ...]:
    return tuple((t._tensor if isinstance(t, ct.Partition) else t)._address for t in tensors)


def test_reused_parameter_blocks_carry_each_launchs_values(null_cuda: list[Any]) -> None:
    """The integer-only block of `K.add` is repacked only when its values change: every
    launch still hands the driver its own tensors' addresses, in whatever order they come."""
    rng = np.random.default_rng()
    xs = [ct.from_numpy(rng.standard_normal(N).astype(np.float32)) for _ in range(3)]
    outs = [_out() for _ in range(3)]
    order = [(0, 1, 2), (0, 1, 2), (1, 2, 0), (0, 1, 2), (2, 2, 1), (0, 1, 2)]
    expected = []
    for i, j, k in order:
        args = (outs[i], xs[j], xs[k])
        expected.append(_addresses(*args))
        K.add(*args).sync()
    assert [s[0] for s in null_cuda] == expected
    # Floats are always repacked: -0.0 after 0.0 is other bits, and an int then a float
    # scalar in one slot each is written as its own type.
    del null_cuda[:]
    x = ct.from_numpy(rng.standard_normal((8, N)).astype(np.float32))
    z = ct.empty((1, N), ct.f32).partition((1, TILE))
    calls = [(3, 0.0), (3, -0.0), (5, -0.0), (5, 2.5), (3, 0.0)]
    for rows, scale in calls:
        z, x, _, _ = K.column_sum(z, x, rows, scale).sync()
    got = [(s[1][-2], struct.pack("<f", s[1][-1])) for s in null_cuda]
    assert got == [(r, struct.pack("<f", s)) for r, s in calls]


def test_threads_launching_one_plan_on_cuda_get_their_own_values(
    null_cuda: list[Any],
) -> None:
    rng = np.random.default_rng()
    K.add(_out(), *(ct.from_numpy(rng.standard_normal(N).astype(np.float32)) for _ in range(2)))
    per_thread = 6
    made: dict[int, list[tuple[int, ...]]] = {}
    tensors = [
        [ct.from_numpy(rng.standard_normal(N).astype(np.float32)) for _ in range(2)]
        for _ in range(4)
    ]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            x, y = tensors[k]
            mine = []
            for _ in range(per_thread):
                out = _out()
                mine.append(_addresses(out, x, y))
                out, x, y = K.add(out, x, y).sync()
            made[k] = mine
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave the threads as finely as the interpreter can
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors
    launched = sorted(s[0] for s in null_cuda[-4 * per_thread :])
    assert launched == sorted(a for mine in made.values() for a in mine)


def test_a_graph_holds_what_it_captured_against_planned_launches(cpu: str) -> None:
    rng = np.random.default_rng()
    _warm(rng)
    a, x = _vec(rng)
    b, y = _vec(rng)
    p = _out()
    g = ct.graph(K.add(p, x, y))
    for _ in range(2):
        with pytest.raises(ct.BorrowError, match="parameter 'z'"):
            K.add(p, x, y)
        with pytest.raises(ct.BorrowError, match="held by graph of add"):
            x.partition(TILE)
    g.replay()
    np.testing.assert_array_equal(g.read(p), a + b)
    z, x2, y2 = g.release()
    assert z is p and x2 is x and y2 is y
    z, _, _ = K.add(z, y, y).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), b + b)


def test_an_awaited_op_holds_its_output_until_it_is_done(cpu: str) -> None:
    import asyncio

    rng = np.random.default_rng()
    _warm(rng)
    a, x = _vec(rng)
    b, y = _vec(rng)
    p = _out()

    async def main() -> tuple[Any, ...]:
        task = asyncio.ensure_future(K.add(p, x, y))
        await asyncio.sleep(0)  # the launch has started
        for _ in range(2):
            with pytest.raises(ct.BorrowError, match="parameter 'z'"):
                K.add(p, y, y)
        return await task

    z, _, _ = asyncio.run(main())
    assert z._exclusive is None and x._shared == [] and y._shared == []
    np.testing.assert_array_equal(z.unpartition().to_numpy(), a + b)


class _Interleaved(list):  # type: ignore[type-arg]
    """A holder list that runs `hook` (another thread's launch, taking its hold) the first
    time a release reads its length or iterates it: the interleaving a thread switch makes
    between a release's check and its write."""

    hook: Any = None

    def _switch(self) -> None:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()

    def __len__(self) -> int:
        n = super().__len__()
        self._switch()
        return n

    def __iter__(self) -> Any:
        self._switch()
        return super().__iter__()


@pytest.mark.parametrize("where", ["planned", "checked", "middle"])
def test_a_release_keeps_a_shared_hold_taken_meanwhile_by_another_thread(
    cpu: str, where: str
) -> None:
    """Releasing one op's shared hold while another thread's launch takes one on the same
    tensor keeps the other's: it used to replace the holder list, losing that hold (and the
    tensor could then be moved or written while the other op was pending)."""
    rng = np.random.default_rng()
    _warm(rng)
    a, x = _vec(rng)
    b, y = _vec(rng)
    # "checked": `x` passed twice, which the plan's `admit` declines (`release_holds` lets go).
    first = K.add(_out(), x, x if where == "checked" else y)
    others = [K.add(_out(), y, x), K.add(_out(), x, y)] if where == "middle" else []
    if where == "middle":  # `first`'s hold between two others: `drop_shared`'s last branch
        others[0], first = first, others[0]
    held = list(x._shared)
    x._shared = shared = _Interleaved(held)
    later: list[Any] = []
    shared.hook = lambda: later.append(K.add(_out(), x, y))
    first.sync()
    assert later and shared.hook is None, "the release read the holder list"
    assert any(r() is later[0] for r in x._shared), "the other launch's hold was lost"
    with pytest.raises(ct.BorrowError):
        x.partition(TILE)
    z2, _, _ = later[0].sync()
    np.testing.assert_array_equal(z2.unpartition().to_numpy(), a + b)
    for op in others:
        op.sync()
    assert all(r() is None for r in x._shared)
