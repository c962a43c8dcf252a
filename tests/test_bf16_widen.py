"""A loaded bf16 widens to f32 from its b32 pair with one shift or mask (`EmitContext.widen`):
every one of the 65536 bf16 bit patterns gives the f32 with those bits on top (signed zeros,
subnormals, infinities; NaNs stay NaN), on sim, one tile at a time and in a loop."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, bf16, f32

if TYPE_CHECKING:
    ConstInt = int
else:
    ConstInt = ct.Constant[int]

B = TypeVar("B")
R = TypeVar("R")


@ct.kernel
def widened(y: Mut[Tensor[f32, B]], x: Tensor[bf16, Dyn]) -> None:
    y.store(ct.load_tile_like(x, y).astype(f32))


@ct.kernel(num_warps=2)
def widened_in_chunks(y: Mut[Tensor[f32, R, B]], x: Tensor[bf16, Dyn, Dyn], C: ConstInt) -> None:
    for k in range(y.shape[1] // C):
        ct.store(y, (0, k), ct.load(x, (ct.bid(0), k), (y.shape[0], C)).astype(f32))


def _every_bf16() -> tuple[np.ndarray, np.ndarray]:
    """Every bf16 bit pattern, as the f32 it is exactly, and those f32 bits."""
    bits = (np.arange(1 << 16, dtype=np.uint32) << 16).astype(np.uint32)
    return bits.view(np.float32), bits


def _check(out: np.ndarray, bits: np.ndarray) -> None:
    got = out.reshape(-1).view(np.uint32)
    nan = np.isnan(bits.view(np.float32))
    np.testing.assert_array_equal(got[~nan], bits[~nan])
    assert np.isnan(got[nan].view(np.float32)).all()


def test_every_bf16_widens_exactly() -> None:
    ct.set_backend("sim", target="sm_90")
    values, bits = _every_bf16()
    x = ct.from_numpy(values, bf16)
    (y, _) = widened(ct.empty((1 << 16,)).partition(2048), x).sync()
    _check(y.unpartition().to_numpy(), bits)
    ptx = widened.ptx(ct.PartitionSpec((1 << 16,), (2048,)), ct.TensorSpec((1 << 16,), bf16),
                      target=90)  # fmt: skip
    assert "cvt.f32.bf16" not in ptx and "and.b32" in ptx and "shl.b32" in ptx


def test_every_bf16_widens_exactly_in_a_loop() -> None:
    ct.set_backend("sim", target="sm_90")
    values, bits = _every_bf16()
    x = ct.from_numpy(values.reshape(64, 1024), bf16)
    (y, _, _) = widened_in_chunks(ct.empty((64, 1024)).partition((8, 1024)), x, 256).sync()
    _check(y.unpartition().to_numpy(), bits)
