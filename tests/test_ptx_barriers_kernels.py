"""`ptx.barriers.drop_idle_barriers` on kernels with several block-wide users of shared or
global memory in turn (a reduction then a transpose, a scan then a reduction, a reduction then
a gather, reductions in a loop and a branch, a store then a scatter over the same tile): each
keeps the barriers it needs (all but the loop's lose some to the pass; there every barrier
is next to a label or a branch), and on sim, whose race checker reports any shared-memory access
two threads make with no barrier between (and a global read of another warp's store), the
result still matches NumPy."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32, i32

R = TypeVar("R")
C = TypeVar("C")


@ct.kernel(num_warps=4)
def reduce_then_permute(z: Mut[Tensor[f32, C, R]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """The tile less its row sums, transposed through shared memory."""
    t = ct.load(x, (ct.bid(1), ct.bid(0)), (z.shape[1], z.shape[0]))
    z.store(ct.permute(t - ct.sum(t, axis=1, keepdims=True), (1, 0)))


@ct.kernel(num_warps=4)
def scan_then_reduce(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """Prefix sums along the row (across warps), less their maximum."""
    t = ct.cumsum(ct.load_tile_like(x, z), 1)
    z.store(t - ct.max(t, axis=1, keepdims=True))


@ct.kernel(num_warps=4)
def reduce_then_gather(
    z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn], idx: Tensor[i32, Dyn]
) -> None:
    """The columns `idx` names, times the row maximum, plus the row sum."""
    t = ct.load_tile_like(x, z)
    m = ct.max(t, axis=1, keepdims=True)
    rows = ct.expand_dims(ct.arange(z.shape[0]), 1) + ct.bid(0) * z.shape[0]
    cols = ct.expand_dims(ct.load(idx, (0,), (z.shape[1],)), 0)
    z.store(ct.gather(x, (rows, cols)) * m + ct.sum(t, axis=1, keepdims=True))


@ct.kernel(num_warps=4)
def reductions_in_a_loop(
    z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn], n: int, flip: int
) -> None:
    """Per chunk a sum (of the chunk less the first) and a max across warps; after the loop,
    a branch with a minimum. (The chunks are taken less the first so that they and it share
    one layout: a tile scaled by a reduction of another, unrelated, tile of its shape gets a
    layout that spills.)"""
    acc = ct.zeros((z.shape[0], 1), f32)
    out = ct.load(x, (ct.bid(0), 0), z.shape)
    for j in range(n):
        t = ct.load(x, (ct.bid(0), j), z.shape)
        acc = acc + ct.sum(t - out, axis=1, keepdims=True) * ct.max(t, axis=1, keepdims=True)
    if flip > 0:
        out = out - ct.min(out, axis=1, keepdims=True)
    z.store(out * acc)


@ct.kernel(num_warps=4)
def store_then_scatter(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """The tile scaled by its row sums stored, then overwritten by a scatter that reverses
    its columns: another thread's stores to the same elements, ordered by a barrier."""
    t = ct.load_tile_like(x, z)
    t = t * ct.sum(t, axis=1, keepdims=True)
    z.store(t)
    rows = ct.expand_dims(ct.arange(z.shape[0]), 1)
    cols = (z.shape[1] - 1) - ct.expand_dims(ct.arange(z.shape[1]), 0)
    ct.scatter(z, (rows, cols), t + 1.0)


@pytest.fixture(autouse=True)
def hopper_sim() -> None:
    """sm_90 PTX on sim (the tensors made after it live on that backend)."""
    ct.set_backend("sim", target="sm_90")


def _run(kernel: Any, barriers: int, z: ct.Tensor, *args: Any) -> np.ndarray:
    """The kernel's output, after checking how many block barriers it keeps
    (each of these kernels but the loop's has more before the pass)."""
    assert kernel.ptx(z, *args, target=90).count("bar.sync 0;") == barriers
    (out, *_) = kernel(z, *args).sync()
    return np.asarray(out.unpartition().to_numpy())


def _center(x: np.ndarray) -> np.ndarray:
    return x - x.sum(axis=1, keepdims=True)


def test_a_reduction_then_a_transpose(rng: np.random.Generator) -> None:
    x = rng.standard_normal((64, 128)).astype(np.float32)
    got = _run(reduce_then_permute, 1, ct.empty((128, 64)).partition((64, 32)), ct.from_numpy(x))
    want = np.empty((128, 64), np.float32)
    for bj in range(2):
        for bi in range(2):
            block = x[32 * bi : 32 * bi + 32, 64 * bj : 64 * bj + 64]
            want[64 * bj : 64 * bj + 64, 32 * bi : 32 * bi + 32] = _center(block).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_a_scan_then_a_reduction(rng: np.random.Generator) -> None:
    x = rng.standard_normal((8, 256)).astype(np.float32)
    got = _run(scan_then_reduce, 3, ct.empty(x.shape).partition((2, 256)), ct.from_numpy(x))
    c = np.cumsum(x.astype(np.float64), axis=1)
    np.testing.assert_allclose(got, c - c.max(axis=1, keepdims=True), rtol=1e-4, atol=1e-3)


def test_a_reduction_then_a_gather(rng: np.random.Generator) -> None:
    x = rng.standard_normal((8, 256)).astype(np.float32)
    idx = rng.permutation(256).astype(np.int32)
    z = ct.empty(x.shape).partition((2, 256))
    got = _run(reduce_then_gather, 3, z, ct.from_numpy(x), ct.from_numpy(idx))
    want = x[:, idx] * x.max(axis=1, keepdims=True) + x.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("flip", [0, 1])
def test_reductions_in_a_loop_and_a_branch(rng: np.random.Generator, flip: int) -> None:
    x = rng.standard_normal((4, 3 * 256)).astype(np.float32)
    z = ct.empty((4, 256)).partition((2, 256))
    got = _run(reductions_in_a_loop, 6, z, ct.from_numpy(x), 3, flip)
    chunks = np.split(x.astype(np.float64), 3, axis=1)
    out = x[:, :256].astype(np.float64)
    acc = sum((c - out).sum(axis=1, keepdims=True) * c.max(axis=1, keepdims=True) for c in chunks)
    if flip:
        out = out - out.min(axis=1, keepdims=True)
    np.testing.assert_allclose(got, out * acc, rtol=1e-4, atol=1e-3)


def test_a_store_then_a_scatter_over_the_same_tile(rng: np.random.Generator) -> None:
    """Of the scatter's two barriers and its conversion's two, one stays: it orders the
    store before the conversion's reads, and so before the scatter's stores."""
    x = rng.standard_normal((8, 128)).astype(np.float32)
    got = _run(store_then_scatter, 1, ct.empty(x.shape).partition((2, 128)), ct.from_numpy(x))
    t = x * x.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got, (t + 1.0)[:, ::-1], rtol=1e-5, atol=1e-3)
