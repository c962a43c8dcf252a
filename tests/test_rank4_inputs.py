"""Rank-4 tensors as shared inputs ((B, H, S, D) attention inputs): loads of rank-4 tiles,
gathers with four index tiles, Mut outputs of rank <= 3 over them; non-contiguous NumPy
inputs are copied by ct.from_numpy (and refused, with what to do, by ct.from_dlpack)."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32, i32

S = TypeVar("S")
D = TypeVar("D")
B = TypeVar("B")
BACKENDS = ["sim", "interpret"]


@ct.kernel
def one_head(z: Mut[Tensor[f32, S, D]], x: Tensor[f32, Dyn, Dyn, Dyn, Dyn], b: int, h: int) -> None:
    """z = x[b, h]: a (1, 1, S, D) tile reshaped to (S, D)."""
    t = ct.load(x, (b, h, ct.bid(0), 0), (1, 1, z.shape[0], z.shape[1]), padding=-1.0)
    z.store(t.reshape((z.shape[0], z.shape[1])))


@ct.kernel
def head_sum(z: Mut[Tensor[f32, S, D]], x: Tensor[f32, Dyn, Dyn, Dyn, Dyn]) -> None:
    """z = x[:2, :3].sum((0, 1)): a whole rank-4 tile, reduced."""
    t = ct.load(x, (0, 0, ct.bid(0), 0), (2, 3, z.shape[0], z.shape[1]))
    z.store(ct.sum(ct.sum(t, axis=0), axis=0))


@ct.kernel
def last_head(z: Mut[Tensor[f32, S, D]], x: Tensor[f32, Dyn, Dyn, Dyn, Dyn], b: int) -> None:
    """z = x[b, -1]: a gather with four index tiles (two of them ints)."""
    s = ct.expand_dims(ct.arange(z.shape[0], i32) + ct.bid(0) * z.shape[0], 1)
    d = ct.expand_dims(ct.arange(z.shape[1], i32), 0)
    z.store(ct.gather(x, (b, x.shape[1] - 1, s, d)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank4_load_of_one_head(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    bsz, heads, seq = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(1, 70))
    x = rng.standard_normal((bsz, heads, seq, 32)).astype(np.float32)
    b, h = int(rng.integers(0, bsz)), int(rng.integers(0, heads))
    z, *_ = one_head(ct.empty((seq, 32), f32).partition((16, 32)), ct.from_numpy(x), b, h).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), x[b, h])


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank4_tile_reduced(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    x = rng.integers(-9, 9, (2, 3, 40, 16)).astype(np.float32)
    z, _ = head_sum(ct.empty((40, 16), f32).partition((8, 16)), ct.from_numpy(x)).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), x.sum((0, 1)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank4_gather(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    x = rng.standard_normal((2, 3, 50, 24)).astype(np.float32)
    z, _, _ = last_head(ct.empty((50, 24), f32).partition((16, 24)), ct.from_numpy(x), 1).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), x[1, 2])


def test_a_rank4_mut_parameter_is_a_compile_error() -> None:
    def k(z: Mut[Tensor[f32, B, B, B, B]], x: Tensor[f32, Dyn]) -> None:
        pass

    with pytest.raises(ct.CompileError, match="parameter 'z': Mut tiles have rank 1 to 3"):
        ct.kernel(k).ir(ct.PartitionSpec((4, 4, 4, 4), (2, 2, 2, 2)), ct.TensorSpec((4,)))


def test_rank5_is_a_compile_error() -> None:
    def k(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn, Dyn, Dyn, Dyn, Dyn]) -> None:
        pass

    with pytest.raises(ct.CompileError, match="parameter 'x': tensors of rank 1 to 4"):
        ct.kernel(k).ir(ct.PartitionSpec((4,), (2,)), ct.TensorSpec((1, 1, 1, 1, 4)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_numpy_inputs_are_copied(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    base = rng.standard_normal((3, 40, 2, 32)).astype(np.float32)
    view = base.transpose(2, 0, 1, 3)[:, :, ::2]  # (2, 3, 20, 32), strided
    assert not view.flags.c_contiguous
    z, *_ = one_head(ct.empty((20, 32), f32).partition((16, 32)), ct.from_numpy(view), 1, 2).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), view[1, 2])


def test_non_contiguous_dlpack_inputs_are_refused_with_the_fix() -> None:
    view = np.zeros((4, 6), np.float32)[:, ::2]
    with pytest.raises(ValueError, match=r"C-contiguous array; pass np\.ascontiguousarray"):
        ct.from_dlpack(view)
