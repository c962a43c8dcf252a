"""A launch with a plan checks its arguments in code generated for the plan (`admit`): each
ownership rule still holds there, with the error naming the parameter, and what it declines
(a shared tensor other ops also read, passed twice, or memory others view) goes the long way
with the same outcome as a first launch."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Atomic, Dyn, Mut, Tensor, f32, i32
from tests.support import elementwise_kernels as K

B = TypeVar("B")
N = 64
TILE = 16


@ct.kernel
def copy2(a: Mut[Tensor[f32, B]], b: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, a)
    a.store(t)
    b.store(t * 2.0)


@ct.kernel
def histogram(z: Mut[Tensor[i32, B]], x: Tensor[i32, Dyn], h: Atomic[Tensor[i32, Dyn]]) -> None:
    """h[v] += 1 for every v of x (the padding -1 is dropped); z = x."""
    v = ct.load(x, ct.bid(0), z.shape, padding=-1)
    ct.atomic_add(h, v, 1)
    z.store(v)


def _planned(rng: np.random.Generator) -> tuple[np.ndarray, Any]:
    """Launch `K.add` and `copy2` once at this signature (the plans exist after)."""
    a = rng.standard_normal(N).astype(np.float32)
    x = ct.from_numpy(a)
    K.add(ct.zeros(N).partition(TILE), x, x).sync()
    copy2(ct.zeros(N).partition(TILE), ct.zeros(N).partition(TILE), x).sync()
    return a, x


def _plans_hit() -> int:
    from cutile_py.host.kernel import STATS

    return int(STATS.hits)


def test_a_planned_launch_still_refuses_each_misuse(rng: np.random.Generator) -> None:
    _, x = _planned(rng)
    p = ct.zeros(N).partition(TILE)
    hits = _plans_hit()
    with pytest.raises(ct.AliasError, match="'a' and 'b'"):
        copy2(p, p, x)  # the same partition, twice exclusive
    moved = ct.zeros(N)
    moved.partition(TILE)
    with pytest.raises(ct.MovedError, match="parameter 'x'"):
        K.add(p, moved, x)
    op = K.add(p, x, x)  # holds p
    with pytest.raises(ct.BorrowError, match="parameter 'z'"):
        K.add(p, x, x)
    q = ct.zeros(N).partition(TILE)
    with pytest.raises(ct.BorrowError, match="parameter 'x'"):
        K.add(q, p.tensor, x)  # the storage of p, which `op` holds
    op.sync()
    from cutile_py.host.tensor import Tensor as HostTensor
    from cutile_py.runtime.backend import InterpretBackend

    other = InterpretBackend()
    foreign = HostTensor(other.alloc(4 * N), (N,), ct.f32, other)
    with pytest.raises(ValueError, match="'y': the tensor lives on the interpret backend"):
        K.add(q, x, foreign)
    assert _plans_hit() > hits  # the checks above ran with plans found
    # Nothing was taken by the refused launches: all of it is usable.
    z, _, _ = K.add(q, x, x).sync()
    p2, _, _ = K.add(p, x, x).sync()
    assert not z.is_moved and not p2.is_moved


def test_shared_tensors_read_by_other_pending_ops_and_passed_twice(
    rng: np.random.Generator,
) -> None:
    a, x = _planned(rng)
    b = rng.standard_normal(N).astype(np.float32)
    y = ct.from_numpy(b)
    first = K.add(ct.zeros(N).partition(TILE), x, y)  # x and y held shared, pending
    second = K.add(ct.zeros(N).partition(TILE), x, y)  # shared again: allowed
    third = K.add(ct.zeros(N).partition(TILE), y, y)  # y twice: held once
    assert sum(h is y for h, _ in third._held) == 1
    # An Atomic tensor is the launch's alone: one that pending ops read is refused.
    v = rng.integers(0, 8, N).astype(np.int32)
    xi, h = ct.from_numpy(v), ct.zeros((8,), ct.i32)
    histogram(ct.zeros(N, ct.i32).partition(TILE), xi, h).sync()  # planned
    reader = K.int_ops(ct.zeros(8, ct.i32).partition(8), h, h)  # reads h, pending
    with pytest.raises(ct.BorrowError, match="parameter 'h'"):
        histogram(ct.zeros(N, ct.i32).partition(TILE), xi, h)
    reader.sync()
    histogram(ct.zeros(N, ct.i32).partition(TILE), xi, h).sync()
    np.testing.assert_array_equal(h.to_numpy(), 2 * np.bincount(v, minlength=8))
    results = [op.sync()[0].unpartition().to_numpy() for op in (first, second, third)]
    np.testing.assert_array_equal(results[0], a + b)
    np.testing.assert_array_equal(results[1], a + b)
    np.testing.assert_array_equal(results[2], b + b)
    assert not x._shared and not y._shared  # every hold released


def test_borrowed_memory_goes_the_long_way_and_still_aliases(rng: np.random.Generator) -> None:
    _planned(rng)
    host = rng.standard_normal(N).astype(np.float32)
    x = ct.from_dlpack(host)  # memory another object may view: checked by span
    view = ct.from_dlpack(host)
    z, _, _ = K.add(ct.zeros(N).partition(TILE), x, view).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), host + host)
    p = x.partition(TILE)
    with pytest.raises(ct.AliasError, match="'z' and 'x'"):
        K.add(p, view, ct.zeros(N))


def test_a_plan_reads_parameters_and_touched_memory_off_the_arguments(
    rng: np.random.Generator,
) -> None:
    """The plan's generated readers: the `.param` values (addresses, the plan's dims, scalars)
    and the memory each launch touches (a Mut partition and an Atomic tensor written, a shared
    tensor read), against the arguments' own addresses and sizes."""
    v = rng.integers(0, 8, N).astype(np.int32)
    z, xi, h = ct.zeros(N, ct.i32).partition(TILE), ct.from_numpy(v), ct.zeros((8,), ct.i32)
    op = histogram(z, xi, h)
    plan = op.plan
    plan.prepare()
    assert plan.touches is not None and plan.read is not None
    zt = z.tensor
    assert plan.touches(op.args) == [
        (zt.buffer.address, zt.nbytes, True),
        (xi.buffer.address, xi.nbytes, False),
        (h.buffer.address, h.nbytes, True),
    ]
    values = plan.read(op.args)
    for t in (zt, xi, h):
        assert t.buffer.address in values
    assert N in values and 8 in values  # the dims, constants of the plan
    z, _, h = op.sync()
    np.testing.assert_array_equal(h.to_numpy(), np.bincount(v, minlength=8))


def test_chain_steps_on_a_queueing_backend_still_refuse_each_misuse() -> None:
    """On cuda (over the null driver: steps are queued, not waited for), an op made in a
    `.then` step goes through the plan's checks like any launch: each misuse is refused,
    naming the parameter, and the chain's earlier steps hand everything back."""
    pytest.importorskip("cuda.bindings")
    from paper_repro.experiments.host import null_cuda

    rng = np.random.default_rng()
    with null_cuda(check_arguments=True):
        x = ct.from_numpy(rng.standard_normal(N).astype(np.float32))
        p, q = ct.zeros(N).partition(TILE), ct.zeros(N).partition(TILE)
        p, x, _ = K.add(p, x, x).sync()  # planned
        q, _, x = copy2(q, ct.zeros(N).partition(TILE), x).sync()
        hits = _plans_hit()

        def aliased(r: tuple[Any, ...]) -> Any:
            return copy2(r[0], r[0], r[1])  # the same partition, twice exclusive

        def read_while_held(r: tuple[Any, ...]) -> Any:
            op = K.add(r[0], r[1], r[2])
            r[1].to_numpy()  # held (shared) by `op`: the host may not touch it
            return op

        def held_by_another(r: tuple[Any, ...]) -> Any:
            return K.add(q, r[1], r[2])  # q is held by `pending`

        pending = K.add(q, x, x)
        for fn, error, match in [
            (aliased, ct.AliasError, "'a' and 'b'"),
            (read_while_held, ct.BorrowError, "held by the pending launch of kernel add"),
            (held_by_another, ct.BorrowError, "parameter 'z'"),
        ]:
            chain = K.add(p, x, x).then(lambda r: K.add(*r)).then(fn)
            with pytest.raises(error, match=match):
                chain.sync()
            assert p._exclusive is None and not x._shared[:-1]  # only `pending` holds x
        pending.sync()
        # In a zip, a step may not take a partition another member holds while in flight.
        both = ct.zip(K.add(q, x, x).then(lambda r: K.add(p, r[1], r[2])), K.add(p, x, x))
        with pytest.raises(ct.BorrowError, match="parameter 'z'"):
            both.sync()
        assert _plans_hit() > hits  # the steps' launches found their plans
        p, x, _ = K.add(p, x, x).then(lambda r: K.add(*r)).sync()  # all usable again
        assert p._exclusive is None and not x._shared


class _CountingList(list[Any]):
    """A tensor's shared-holds list that counts the entries passes over it visit."""

    visited = 0

    def __iter__(self) -> Any:
        for r in super().__iter__():
            _CountingList.visited += 1
            yield r


def test_a_zip_of_many_readers_of_one_tensor_lets_go_in_linear_time() -> None:
    """Each of n ops reading `x` holds it shared; as they complete in order, each hold ends
    where it is (the oldest entry), not by a pass over the other holders: O(n) in all."""
    pytest.importorskip("cuda.bindings")
    from paper_repro.experiments.host import null_cuda

    n = 300
    rng = np.random.default_rng()
    with null_cuda(check_arguments=True):
        x = ct.from_numpy(rng.standard_normal(N).astype(np.float32))
        outs = [ct.zeros(N).partition(TILE) for _ in range(n)]
        K.add(outs[0], x, x).sync()  # planned
        x._shared = _CountingList()
        _CountingList.visited = 0
        ops = [K.add(z, x, x) for z in outs]
        keep = K.add(ct.zeros(N).partition(TILE), x, x)  # holds x past the zip
        results = ct.zip(*ops).sync()
        assert len(results) == n and len(x._shared) == 1
        # The holds ended in place, with no pass (one per release was ~n²/2 = 45,000 visits).
        assert type(x._shared) is _CountingList and _CountingList.visited <= 2 * n
        keep.sync()
        assert not x._shared
