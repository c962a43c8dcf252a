"""The element-indexed builtins: `gather`, `scatter` and the atomics. Each runs on NumPy in the
interpreter (its formula is here); the frontend builds tile IR for them instead."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cutile_py.ir.dtypes import round_to
from cutile_py.language import tile as _t
from cutile_py.language.functions import builtin
from cutile_py.language.interpret import TensorView, TileView
from cutile_py.language.tile import Operand, Tile

#: One int32 tile per dim of the tensor (a 1-D tensor also takes the tile or int alone);
#: Python ints stand for a whole tile of that index. All broadcast together.
Indices = Tile | int | Sequence[Tile | int]


def _coords(indices: Indices, *also: Operand) -> tuple[list[np.ndarray], tuple[int, ...]]:
    items = list(indices) if isinstance(indices, Sequence) else [indices]
    arrays = [np.asarray(i.array if isinstance(i, Tile) else i, dtype=np.int64) for i in items]
    extra = [np.shape(a.array if isinstance(a, Tile) else a) for a in also]
    shape = np.broadcast_shapes(*(a.shape for a in arrays), *extra)
    return [np.broadcast_to(a, shape) for a in arrays], shape


def _inside(coords: list[np.ndarray], dims: Sequence[int]) -> np.ndarray:
    ok = np.ones(coords[0].shape, dtype=bool)
    for c, n in zip(coords, dims):
        ok &= (c >= 0) & (c < n)
    return ok


@builtin("gather")
def gather(src: Any, indices: Indices, padding: float = 0) -> Tile:
    """`src[indices]` element by element: `indices` holds one int32 tile per dim of the shared
    tensor `src` (a 1-D tensor also takes the tile alone), broadcast together; the result has
    their shape and `src`'s dtype. An element whose coordinates are negative or past the end
    of a dim reads `padding`."""
    assert isinstance(src, TensorView)
    coords, shape = _coords(indices)
    out = np.full(shape, round_to(np.asarray(padding), src.dtype), dtype=src.dtype.compute)
    ok = _inside(coords, src.shape)
    out[ok] = src.array[tuple(c[ok] for c in coords)]
    return Tile(out, src.dtype)


@builtin("scatter")
def scatter(z: Any, indices: Indices, values: Operand) -> None:
    """`tile[indices] = values` on this block's own tile of the `Mut` parameter `z`:
    `indices` (one int32 tile per dim, broadcast together with `values`) count from the
    tile's origin. Elements whose coordinates leave the block's tile, or the tensor at an
    edge tile, are dropped. Where coordinates repeat, one of their values is stored (which
    one is unspecified on compiled backends)."""
    assert isinstance(z, TileView)
    coords, shape = _coords(indices, values)
    v = np.broadcast_to(_t.as_array(values, z.dtype), shape)
    glob = [c + i * t for c, i, t in zip(coords, z.index, z.shape)]
    ok = _inside(coords, z.shape) & _inside(glob, z.full_shape)
    z.array[tuple(g[ok] for g in glob)] = v[ok]


def _atomic(kind: str, t: Any, indices: Indices, values: Operand) -> None:
    assert isinstance(t, TensorView)
    coords, shape = _coords(indices, values)
    v = np.broadcast_to(_t.as_array(values, t.dtype), shape)
    ok = _inside(coords, t.shape)
    at = tuple(c[ok] for c in coords)
    # ufunc.at applies repeated coordinates one after another, as atomics do.
    {"add": np.add, "max": np.maximum, "min": np.minimum}[kind].at(t.array, at, v[ok])


@builtin("atomic_add")
def atomic_add(t: Any, indices: Indices, values: Operand) -> None:
    """`t[indices] += values` atomically, element by element, on the `Atomic` parameter `t`
    (f32, i32 or i64; integers wrap around): repeated coordinates, in this block or any
    other, each add once. Coordinates outside the tensor are dropped. f32 sums depend on
    the order the updates arrive in (rounding), which is unspecified."""
    _atomic("add", t, indices, values)


@builtin("atomic_max")
def atomic_max(t: Any, indices: Indices, values: Operand) -> None:
    """`t[indices] = max(t[indices], values)` atomically, element by element, on the
    `Atomic` parameter `t` (i32 or i64). Coordinates outside the tensor are dropped."""
    _atomic("max", t, indices, values)


@builtin("atomic_min")
def atomic_min(t: Any, indices: Indices, values: Operand) -> None:
    """`t[indices] = min(t[indices], values)` atomically, element by element, on the
    `Atomic` parameter `t` (i32 or i64). Coordinates outside the tensor are dropped."""
    _atomic("min", t, indices, values)


__all__ = ["atomic_add", "atomic_max", "atomic_min", "gather", "scatter"]
