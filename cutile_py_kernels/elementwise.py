"""Element-wise kernels: `add(x, y) = x + y` and `saxpy(a, x, y) = a*x + y` (f32, 1-D)."""

from __future__ import annotations

from typing import Any, TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py_kernels._common import empty_partition

B = TypeVar("B")
#: Elements per block: four 16-byte accesses per thread of 256 (the per-thread index and
#: predicate set-up spread over 16 elements: 5.25 SASS instructions per element for add, 10.75
#: with one access per thread).
TILE = 4096


@ct.kernel
def add_kernel(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    """z = x + y"""
    z.store(ct.load_tile_like(x, z) + ct.load_tile_like(y, z))


@ct.kernel
def saxpy_kernel(
    z: Mut[Tensor[f32, B]], a: float, x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]
) -> None:
    """z = a*x + y, rounded once (fma)"""
    z.store(ct.fma(a, ct.load_tile_like(x, z), ct.load_tile_like(y, z)))


def _check(name: str, *tensors: Tensor[Any, Any]) -> tuple[int, ...]:
    shape = tensors[0].shape
    for t in tensors:
        if t.dtype is not f32:
            raise TypeError(f"{name}: expected f32 tensors, got {t.dtype.name}")
        if len(t.shape) != 1:
            raise ValueError(f"{name}: expected 1-D tensors, got shape {t.shape}")
        if t.shape != shape:
            raise ValueError(f"{name}: shapes differ: {shape} and {t.shape}")
    return shape


def add(x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> Tensor[f32, Dyn]:
    """`x + y` as a new tensor; `x` and `y` stay usable."""
    shape = _check("add", x, y)
    z, _, _ = add_kernel(empty_partition(shape, f32, (TILE,)), x, y).sync()
    result: Tensor[f32, Dyn] = z.unpartition()
    return result


def saxpy(a: float, x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> Tensor[f32, Dyn]:
    """`a*x + y` (rounded once, as one fma) as a new tensor; `x` and `y` stay usable."""
    shape = _check("saxpy", x, y)
    z, _, _, _ = saxpy_kernel(empty_partition(shape, f32, (TILE,)), float(a), x, y).sync()
    result: Tensor[f32, Dyn] = z.unpartition()
    return result
