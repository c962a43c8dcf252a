"""The element-indexed builtins: `gather`, `scatter` and the atomics. Each runs on NumPy in the
interpreter (its formula is here); the frontend builds tile IR for them instead."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cutile_py.ir.dtypes import f32, round_to
from cutile_py.language import tile as _t
from cutile_py.language.functions import builtin
from cutile_py.language.interpret import KernelFault, TensorView, TileView
from cutile_py.language.tile import Operand, Tile

#: One int32 tile per dim of the tensor (a 1-D tensor also takes the tile or int alone);
#: Python ints stand for a whole tile of that index. All broadcast together. Where indices
#: and values are all scalars, the access is of one element, made once per block (by one
#: thread of it on compiled backends): `ct.atomic_add(counter, 0, 1)` adds 1 per block.
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
    their shape and `src`'s dtype (a scalar for scalar indices). An element whose coordinates
    are negative or past the end of a dim reads `padding`."""
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
    edge tile, are dropped. Coordinates must not repeat: threads would race to store them
    (on a GPU, which value lands is undefined); the interpreter reports every repeat whose
    values differ, the simulator those stored by different threads, as a LaunchError."""
    assert isinstance(z, TileView)
    coords, shape = _coords(indices, values)
    v = np.broadcast_to(_t.as_array(values, z.dtype), shape)
    glob = [c + i * t for c, i, t in zip(coords, z.index, z.shape)]
    ok = _inside(coords, z.shape) & _inside(glob, z.full_shape)
    at = tuple(g[ok] for g in glob)
    _check_repeats(at, v[ok], z.full_shape)
    z.array[at] = v[ok]


def _check_repeats(at: tuple[np.ndarray, ...], v: np.ndarray, shape: tuple[int, ...]) -> None:
    """KernelFault where two elements go to one coordinate with different values (bits
    compared, as the simulator compares the bytes stored)."""
    if at[0].size < 2:
        return
    flat = np.ravel_multi_index(at, shape)
    order = np.argsort(flat, kind="stable")
    f = flat[order]
    bits = np.ascontiguousarray(v[order]).view(np.uint8).reshape(f.size, -1)
    clash = (f[1:] == f[:-1]) & (bits[1:] != bits[:-1]).any(axis=1)
    if clash.any():
        k = int(np.argmax(clash))
        where = tuple(int(c) for c in np.unravel_index(int(f[k]), shape))
        a, b = v[order[k]], v[order[k + 1]]
        raise KernelFault(
            f"global-memory race: ct.scatter stores both {a} and {b} to element {where} of "
            "the tensor (repeated coordinates)"
        )


def _total_order_key(x: np.ndarray) -> np.ndarray:
    """f32 values as int32 keys ordered as IEEE totalOrder (-NaN < -inf < ... < -0.0 < +0.0
    < ... < +inf < +NaN): the bits, with a negative pattern's magnitude bits flipped."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.int32)
    return np.where(bits < 0, bits ^ np.int32(0x7FFFFFFF), bits)


def _float_extreme(kind: str, t: TensorView, at: tuple[np.ndarray, ...], v: np.ndarray) -> None:
    """f32 max/min in totalOrder, a NaN value taken as the extreme NaN of `kind` (what the
    compiled kernel's integer atomics on the bits do)."""
    extreme = np.int32(2**31 - 1) if kind == "max" else np.int32(-1)
    bits = np.where(np.isnan(v), extreme, np.ascontiguousarray(v, np.float32).view(np.int32))
    keys = _total_order_key(t.array)
    ufunc = np.maximum if kind == "max" else np.minimum
    ufunc.at(keys, at, _total_order_key(bits.view(np.float32)))
    t.array[...] = np.where(keys < 0, keys ^ np.int32(0x7FFFFFFF), keys).view(np.float32)


def _atomic(kind: str, t: TensorView, indices: Indices, values: Operand) -> None:
    coords, shape = _coords(indices, values)
    v = np.broadcast_to(_t.as_array(values, t.dtype), shape)
    ok = _inside(coords, t.shape)
    at = tuple(c[ok] for c in coords)
    if kind != "add" and t.dtype is f32:
        _float_extreme(kind, t, at, v[ok])
        return
    # ufunc.at applies repeated coordinates one after another, as atomics do.
    {"add": np.add, "max": np.maximum, "min": np.minimum}[kind].at(t.array, at, v[ok])


@builtin("atomic_add")
def atomic_add(t: Any, indices: Indices, values: Operand) -> None:
    """`t[indices] += values` atomically, element by element, on the `Atomic` parameter `t`
    (f32, i32 or i64; integers wrap around): repeated coordinates, in this block or any
    other, each add once. Coordinates outside the tensor are dropped. f32 sums depend on
    the order the updates arrive in (rounding), which is unspecified."""
    assert isinstance(t, TensorView)
    _atomic("add", t, indices, values)


@builtin("atomic_max")
def atomic_max(t: Any, indices: Indices, values: Operand) -> None:
    """`t[indices] = max(t[indices], values)` atomically, element by element, on the
    `Atomic` parameter `t` (f32, i32 or i64). Coordinates outside the tensor are dropped.
    f32 compares in IEEE totalOrder: -0.0 is below +0.0, and a NaN value leaves NaN (the
    bits 0x7FFFFFFF; a NaN already in `t` counts above +inf if its sign bit is clear, below
    -inf if set)."""
    assert isinstance(t, TensorView)
    _atomic("max", t, indices, values)


@builtin("atomic_min")
def atomic_min(t: Any, indices: Indices, values: Operand) -> None:
    """`t[indices] = min(t[indices], values)` atomically, element by element, on the
    `Atomic` parameter `t` (f32, i32 or i64). Coordinates outside the tensor are dropped.
    f32 compares in IEEE totalOrder: -0.0 is below +0.0, and a NaN value leaves NaN (the
    bits 0xFFFFFFFF; a NaN already in `t` counts above +inf if its sign bit is clear, below
    -inf if set)."""
    assert isinstance(t, TensorView)
    _atomic("min", t, indices, values)


__all__ = ["atomic_add", "atomic_max", "atomic_min", "gather", "scatter"]
