"""Data movement: `transpose(x)` (2-D) and `embedding(table, ids) = table[ids]` (row gather)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, i32
from cutile_py_kernels._common import (
    FLOATS,
    PER_THREAD,
    Elem,
    RowPlan,
    per_dtype,
    per_dtype_warps,
    row_plan,
    row_warps,
    view,
)

R = TypeVar("R")
C = TypeVar("C")
#: The transpose tile's side per element size in bytes (square, so a block's load and store
#: cover the same elements): 16 KiB or 32 KiB of shared memory for the layout change. sm_90
#: SASS per element at 4096x4096 (each thread's 16-byte vector stored whole, read back one
#: element at a time): f32 17.8 at side 32, 8.25 at 64; bf16 7.2 at 64, 4.44 at 128. (f32 at
#: 128 would be 5.75, but needs 64 KiB of shared memory and 88 registers.)
TRANSPOSE_TILE = {4: 64, 2: 128}


def transpose_tile(dt: type[ct.DType]) -> int:
    """The side of `transpose`'s square tile for elements of `dt`."""
    return TRANSPOSE_TILE[dt.itemsize()]


def _check_dtype(name: str, what: str, t: Tensor[Any, Any]) -> type[ct.DType]:
    if t.dtype not in (*FLOATS, i32):
        raise TypeError(f"{name}: {what} must be f32, f16, bf16 or i32, got {t.dtype.name}")
    return t.dtype


@per_dtype
def _transpose_kernel(dt: type[ct.DType]) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel
    def transpose_kernel(y: Mut[Tensor[Elem, R, C]], x: Tensor[Elem, Dyn, Dyn]) -> None:
        """Tile (i, j) of y is the transpose of tile (j, i) of x."""
        t = ct.load(x, (ct.bid(1), ct.bid(0)), (y.shape[1], y.shape[0]))
        y.store(t.T)

    return transpose_kernel


@per_dtype_warps
def _embedding_kernel(dt: type[ct.DType], warps: int) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel(num_warps=warps)
    def embedding_kernel(
        y: Mut[Tensor[Elem, R, C]], table: Tensor[Elem, Dyn, Dyn], ids: Tensor[i32, Dyn]
    ) -> None:
        """Block (i, j): chunk j of row ids[i] of the table (one row per block: R is 1)."""
        row = ct.load(ids, (ct.bid(0),), (1,)).item()
        y.store(ct.load(table, (row, ct.bid(1)), y.shape))

    return embedding_kernel


def embedding_launch(dt: type[ct.DType], n: int, d: int) -> tuple[Any, int]:
    """The embedding kernel for `n` ids into a table of `d` columns, and the width of its
    (1, width) output tile: PER_THREAD elements per thread (a block's fixed cost, reading its
    id and forming its addresses, spread over more elements)."""
    plan = row_plan(n, d, dt if dt is not i32 else ct.f32)
    return _embedding_kernel(dt, row_warps(RowPlan(1, plan.width, False), PER_THREAD)), plan.width


def transpose(x: Tensor[Any, Any]) -> Tensor[Any, Any]:
    """`x.T` of a 2-D tensor (f32, f16, bf16 or i32) as a new tensor."""
    dt = _check_dtype("transpose", "x", x)
    if len(x.shape) != 2:
        raise ValueError(f"transpose: expected a 2-D tensor, got shape {x.shape}")
    m, n = x.shape
    t = transpose_tile(dt)
    out = ct.empty((n, m), dt).partition((t, t))
    y, _ = _transpose_kernel(dt)(out, x).sync()
    result: Tensor[Any, Any] = y.unpartition()
    return result


def embedding(table: Tensor[Any, Any], ids: Tensor[Any, Any]) -> Tensor[Any, Any]:
    """`table[ids]`: `table` (V, D) of f32, f16, bf16 or i32, `ids` int32 of any shape; the
    result has shape `ids.shape + (D,)`. Ids outside [0, V) give rows of zeros (they are not
    checked on the host, which would read the ids back)."""
    dt = _check_dtype("embedding", "table", table)
    if ids.dtype is not i32:
        raise TypeError(f"embedding: ids must be i32, got {ids.dtype.name}")
    if len(table.shape) != 2:
        raise ValueError(f"embedding: table must be 2-D (V, D), got shape {table.shape}")
    n, d = ids.size, table.shape[1]
    if n * d == 0:
        return ct.zeros((*ids.shape, d), dt)
    kernel, width = embedding_launch(dt, n, d)
    out = ct.empty((n, d), dt).partition((1, width))
    y, _, _ = kernel(out, table, view(ids, (n,))).sync()
    result: Tensor[Any, Any] = y.unpartition().reshape((*ids.shape, d))
    return result
