"""The element-wise kernels the tests run on every backend, with their NumPy references."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, bf16, f16, f32

B = TypeVar("B")
R = TypeVar("R")
C = TypeVar("C")


@ct.kernel
def add(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) + ct.load_tile_like(y, z))


@ct.kernel
def saxpy(z: Mut[Tensor[f32, B]], a: float, x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    z.store(a * ct.load_tile_like(x, z) + ct.load_tile_like(y, z))


@ct.kernel
def gelu_tanh(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    inner = 0.7978845608028654 * (t + 0.044715 * t * t * t)
    z.store(0.5 * t * (1.0 + ct.tanh(inner)))


def gelu_tanh_ref(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + np.tanh(0.7978845608028654 * (x64 + 0.044715 * x64**3)))).astype(
        np.float32
    )


@ct.kernel
def scale_add_2d(
    z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn], y: Tensor[f32, Dyn, Dyn]
) -> None:
    tx = ct.load_tile_like(x, z)
    ty = ct.load_tile_like(y, z)
    z.store(ct.maximum(tx * 2.0 - ty, ct.exp(ty) * 0.5))


@ct.kernel
def mixed_f16(z: Mut[Tensor[f16, B]], x: Tensor[f16, Dyn], w: Tensor[bf16, Dyn]) -> None:
    tx = ct.load_tile_like(x, z).astype(f32)
    tw = ct.load_tile_like(w, z).astype(f32)
    z.store((ct.sigmoid(tx) * tw + ct.sqrt(ct.abs(tx))).astype(f16))


@ct.kernel
def mixed_bf16(z: Mut[Tensor[bf16, B]], x: Tensor[bf16, Dyn], y: Tensor[f16, Dyn]) -> None:
    tx = ct.load_tile_like(x, z).astype(f32)
    ty = ct.load_tile_like(y, z).astype(f32)
    z.store(ct.where(tx > ty, tx * ty, ct.log(ct.abs(ty) + 1.0)).astype(bf16))


@ct.kernel
def int_ops(z: Mut[Tensor[ct.i32, B]], x: Tensor[ct.i32, Dyn], y: Tensor[ct.i32, Dyn]) -> None:
    tx = ct.load_tile_like(x, z)
    ty = ct.load_tile_like(y, z)
    z.store((tx // ty) * 3 + tx % ty - (tx & 7) + ct.minimum(tx, ty))


@ct.kernel
def column_sum(
    z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn], rows: int, scale: float
) -> None:
    """z[0, j] = scale * sum(x[:rows, j]) if rows > 2 else the plain sum (a loop carrying a tile,
    a branch on a run-time scalar)."""
    acc = ct.zeros(z.shape, ct.f32)
    for i in range(rows):
        acc = acc + ct.load(x, (i, ct.bid(1)), z.shape)
    if rows > 2:
        acc = acc * scale
    z.store(acc)


def column_sum_ref(x: np.ndarray, rows: int, scale: float) -> np.ndarray:
    acc = np.zeros(x.shape[1], dtype=np.float32)
    for i in range(rows):
        acc = acc + x[i]
    return (acc * np.float32(scale) if rows > 2 else acc)[None, :]


@ct.kernel
def reverse_tiles(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], fill: float) -> None:
    """Tile i of z is tile (n - 1 - i) of x, with elements past the end of x read as `fill`."""
    n = ct.num_tiles(x, 0, z.shape[0])
    assert_same = ct.cdiv(x.shape[0], z.shape[0])
    t = ct.load(x, (n - 1 - ct.bid(0),), z.shape, padding=-1.0)
    if n == assert_same:
        z.store(ct.where(t == -1.0, fill, t))
    else:
        z.store(ct.full(z.shape, 0.0, ct.f32))


def reverse_tiles_ref(x: np.ndarray, tile: int, fill: float) -> np.ndarray:
    n = -(-x.size // tile)
    padded = np.full(n * tile, np.float32(fill), dtype=np.float32)
    padded[: x.size] = x
    return padded.reshape(n, tile)[::-1].reshape(-1)[: x.size]


@ct.function
def cube(t: ct.Tile) -> ct.Tile:
    return t * t * t


@ct.function
def gelu(t: ct.Tile, k: float = 0.044715) -> ct.Tile:
    inner = 0.7978845608028654 * (t + k * cube(t))
    return 0.5 * t * (1.0 + ct.tanh(inner))


@ct.kernel
def gelu_helpers(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    """The fused GELU again, through nested @ct.function helpers."""
    z.store(gelu(ct.load_tile_like(x, z)))
