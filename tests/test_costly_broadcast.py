"""A costly value broadcast over a larger tile is planned apart (`lower.layout`): its
elements are spread over the block and each computed about once, then the broadcast converts
it through shared memory; planned in the larger tile's family, every thread along the
broadcast dims would compute its own copy (rope: the cos and sin of each angle once per
head a thread holds). Cheap broadcasts, and costly values tied to the larger family by
other ops, stay in it. Results match NumPy on sim."""

from __future__ import annotations

import importlib
from math import prod
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

R = TypeVar("R")
C = TypeVar("C")
rope_module = importlib.import_module("cutile_py_kernels.rope")


@ct.kernel(num_warps=2)
def cos_scaled(y: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn], w: Tensor[f32, Dyn]) -> None:
    """y = x * cos(w), w broadcast down the rows."""
    t = ct.load_tile_like(x, y)
    y.store(t * ct.cos(ct.load(w, (ct.bid(1),), (y.shape[1],))).reshape((1, y.shape[1])))


@ct.kernel(num_warps=2)
def w_scaled(y: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn], w: Tensor[f32, Dyn]) -> None:
    """y = x * (w + 1), w broadcast down the rows (nothing costly)."""
    t = ct.load_tile_like(x, y)
    y.store(t * (ct.load(w, (ct.bid(1),), (y.shape[1],)) + 1.0).reshape((1, y.shape[1])))


@ct.kernel(num_warps=2)
def exp_of_row_max(y: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """y = x * exp(-max of the row): the costly value is a reduction of the tile itself."""
    t = ct.load_tile_like(x, y)
    y.store(t * ct.exp(-ct.max(t, axis=1, keepdims=True)))


def elements_a_thread(kernel: Any, *args: Any, shape: tuple[int, ...]) -> set[int]:
    """Elements a thread holds of each value of `shape` in `kernel`'s plan."""
    layouts = kernel.compile(*args, target=90).lowered.plan.layouts.layouts
    return {
        prod(lay.base.held(d) for d in lay.dims if d is not None)
        for v, lay in layouts.items()
        if tuple(v.type.shape) == shape
    }


def test_a_costly_broadcast_operand_is_spread_over_the_block(rng: np.random.Generator) -> None:
    """cos of 128 columns on 64 threads: 2 a thread, not the 4 of one 16-byte vector (a
    thread's columns in the (32, 128) tile); converted once through shared memory."""
    ct.set_backend("sim", target="sm_90")
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = (rng.standard_normal(256) * 100).astype(np.float32)
    args = (ct.empty(x.shape).partition((32, 128)), ct.from_numpy(x), ct.from_numpy(w))
    assert elements_a_thread(cos_scaled, *args, shape=(128,)) == {2}
    ptx = cos_scaled.ptx(*args, target=90)
    assert ptx.count("bra $__trig_done") == 2 and "st.shared" in ptx
    (y, _, _) = cos_scaled(*args).sync()
    want = x * np.cos(w.astype(np.float64))
    np.testing.assert_allclose(y.unpartition().to_numpy(), want, rtol=2e-7, atol=1e-7)


def test_cheap_and_tied_broadcasts_stay_in_their_family(rng: np.random.Generator) -> None:
    ct.set_backend("sim", target="sm_90")
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)
    args = (ct.empty(x.shape).partition((32, 128)), ct.from_numpy(x), ct.from_numpy(w))
    assert elements_a_thread(w_scaled, *args, shape=(128,)) == {4}
    assert "st.shared" not in w_scaled.ptx(*args, target=90)
    (y, _, _) = w_scaled(*args).sync()
    np.testing.assert_allclose(y.unpartition().to_numpy(), x * (w + 1), rtol=1e-6)

    tied = (ct.empty(x.shape).partition((32, 128)), ct.from_numpy(x))
    layouts = exp_of_row_max.compile(*tied, target=90).lowered.plan.layouts.layouts
    assert len({lay.base for v, lay in layouts.items() if v.type.shape}) == 1
    (y, _) = exp_of_row_max(*tied).sync()
    xr = x.astype(np.float64).reshape(2, 32, 2, 128)  # (block row, row, block column, column)
    want = (xr * np.exp(-xr.max(axis=3, keepdims=True))).reshape(x.shape)
    np.testing.assert_allclose(y.unpartition().to_numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("dt", [ct.f32, ct.bf16], ids=lambda d: d.name)
def test_rope_computes_each_angle_once(dt: type[ct.DType]) -> None:
    """32 heads of 128 on 64 threads: a thread computes the cos and sin of the high and low
    parts of one angle (4 calls), not of the 4 columns it holds of each head (16)."""
    t, h, d = 8, 32, 128
    args = (
        ct.PartitionSpec((t, h, d), rope_module.rope_tile(h, d), dt),
        ct.TensorSpec((t, h, d), dt),
        ct.TensorSpec((t,), ct.i32),
        ct.TensorSpec((d // 2,)),
        ct.TensorSpec((d // 2,)),
        0,
        t - 1,
    )
    assert rope_module.rope_kernel.ptx(*args, target=90).count("bra $__trig_done") == 4


@ct.kernel(num_warps=2)
def cos_thrice(
    y: Mut[Tensor[f32, R, C]],
    z: Mut[Tensor[f32, R, C]],
    x: Tensor[f32, Dyn, Dyn],
    w: Tensor[f32, Dyn],
) -> None:
    """y = x cos(w) + x² cos(w), z = x - cos(w): one costly value, three broadcasts."""
    t = ct.load_tile_like(x, y)
    c = ct.cos(ct.load(w, (ct.bid(1),), (y.shape[1],))).reshape((1, y.shape[1]))
    y.store(t * c + (t * t) * c)
    z.store(t - c)


def test_a_costly_value_broadcast_again_is_converted_once(rng: np.random.Generator) -> None:
    """Each broadcast of one value converted it through shared memory again (rope: the cos
    and sin of each angle twice, 7 barriers): a broadcast of the operand an earlier one of
    its region already broadcast to the same layout takes that one's registers."""
    ct.set_backend("sim", target="sm_90")
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = (rng.standard_normal(256) * 100).astype(np.float32)
    part = (32, 128)
    args = (ct.empty(x.shape).partition(part), ct.from_numpy(x), ct.from_numpy(w))
    once = cos_scaled.ptx(*args, target=90)
    both = (ct.empty(x.shape).partition(part), *args)
    thrice = cos_thrice.ptx(*both, target=90)
    assert thrice.count("st.shared") == once.count("st.shared") > 0
    assert thrice.count("bar.sync") == once.count("bar.sync")
    (y, z, _, _) = cos_thrice(*both).sync()
    xd, cw = x.astype(np.float64), np.cos(w.astype(np.float64))
    np.testing.assert_allclose(
        y.unpartition().to_numpy(), xd * cw + xd * xd * cw, rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(z.unpartition().to_numpy(), xd - cw, rtol=1e-6, atol=1e-6)
    spec = (
        ct.PartitionSpec((8, 32, 128), rope_module.rope_tile(32, 128)),
        ct.TensorSpec((8, 32, 128)),
        ct.TensorSpec((8,), ct.i32),
        ct.TensorSpec((64,)),
        ct.TensorSpec((64,)),
        0,
        7,
    )
    assert rope_module.rope_kernel.ptx(*spec, target=90).count("st.shared") == 2  # cos, sin
