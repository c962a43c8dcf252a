"""cutile_py kernels of the harness itself: element-wise add in f32 and f16, and a longer
element-wise chain as the "larger kernel" of the JIT timings."""

from __future__ import annotations

from typing import TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f16, f32

B = TypeVar("B")
#: Elements per block (as in cutile_py_kernels.add: 16-byte accesses by 256 threads for f32).
TILE = 1024


@ct.kernel
def add_f32(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    """z = x + y"""
    z.store(ct.load_tile_like(x, z) + ct.load_tile_like(y, z))


@ct.kernel
def add_f16(z: Mut[Tensor[f16, B]], x: Tensor[f16, Dyn], y: Tensor[f16, Dyn]) -> None:
    """z = x + y"""
    z.store(ct.load_tile_like(x, z) + ct.load_tile_like(y, z))


@ct.kernel
def chain_f32(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    """A longer element-wise body: GELU (tanh form) of x, gated by sigmoid(y), plus a
    clamped log-sum-exp term."""
    tx = ct.load_tile_like(x, z)
    ty = ct.load_tile_like(y, z)
    inner = 0.7978845608 * (tx + 0.044715 * tx * tx * tx)
    gelu = 0.5 * tx * (1.0 + ct.tanh(inner))
    gate = ct.sigmoid(ty)
    m = ct.maximum(tx, ty)
    lse = m + ct.log(ct.exp(tx - m) + ct.exp(ty - m))
    clamped = ct.where(lse > 4.0, 4.0, ct.minimum(lse, ct.abs(ty)))
    z.store(ct.fma(gelu, gate, ct.sqrt(ct.abs(clamped) + 1.0)))
