"""What a kernel's parameters are while its Python runs on NumPy tiles."""

from __future__ import annotations

import numpy as np

from cutile_py.ir.dtypes import DType, round_to
from cutile_py.language.tile import Tile


class KernelFault(RuntimeError):
    """What a GPU would fault on, or the simulator report, found while a kernel's Python runs
    (a race); the launch reports it as a LaunchError naming the block and the line."""


def tile_slices(
    full: tuple[int, ...], index: tuple[int, ...], tile: tuple[int, ...]
) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """The in-bounds part of tile `index` (counted in tiles of `tile`) of an array of shape
    `full`: slices into the array and the matching slices into the tile."""
    outer, inner = [], []
    for n, k, t in zip(full, index, tile):
        lo = k * t
        a, b = max(lo, 0), min(lo + t, n)
        if b <= a:
            a = b = 0
        outer.append(slice(a, b))
        inner.append(slice(a - lo, b - lo) if b > a else slice(0, 0))
    return tuple(outer), tuple(inner)


class TensorView:
    """A shared tensor parameter: the whole tensor, read-only, in compute form."""

    def __init__(self, array: np.ndarray, dtype: type[DType]) -> None:
        self.array = array
        self.dtype = dtype
        self.shape: tuple[int, ...] = tuple(array.shape)

    def read_tile(self, index: tuple[int, ...], shape: tuple[int, ...], padding: float) -> Tile:
        out = np.full(shape, round_to(np.asarray(padding), self.dtype), dtype=self.dtype.compute)
        outer, inner = tile_slices(tuple(self.array.shape), index, shape)
        out[inner] = self.array[outer]
        return Tile(out, self.dtype)


class TileView(TensorView):
    """A `Mut` parameter: this block's tile of a partitioned tensor, writable."""

    def __init__(
        self,
        array: np.ndarray,
        dtype: type[DType],
        tile_shape: tuple[int, ...],
        index: tuple[int, ...],
    ) -> None:
        super().__init__(array, dtype)
        self.full_shape = self.shape
        self.shape = tile_shape  # what `z.shape` means inside a kernel
        self.index = index

    def load(self) -> Tile:
        return self.read_tile(self.index, self.shape, 0)

    def store(self, tile: Tile | float) -> None:
        values = tile.astype(self.dtype).array if isinstance(tile, Tile) else tile
        values = np.broadcast_to(round_to(np.asarray(values), self.dtype), self.shape)
        outer, inner = tile_slices(self.full_shape, self.index, self.shape)
        self.array[outer] = values[inner]

    def _sub_tile(self, index: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The tensor-wide tile index of sub-tile `index` (counted in tiles of `shape` inside
        this block's tile), or None where it lies outside the block's tile."""
        per = [t // s for t, s in zip(self.shape, shape)]
        if len(index) != len(shape) or not all(0 <= k < n for k, n in zip(index, per)):
            return None
        return tuple(b * n + k for b, n, k in zip(self.index, per, index))

    def read_sub_tile(self, index: tuple[int, ...], shape: tuple[int, ...], padding: float) -> Tile:
        """Sub-tile `index` of this block's tile; outside the block's tile, all `padding`."""
        at = self._sub_tile(index, shape)
        if at is None:
            pad = round_to(np.asarray(padding), self.dtype)
            return Tile(np.full(shape, pad, dtype=self.dtype.compute), self.dtype)
        return self.read_tile(at, shape, padding)

    def write_sub_tile(self, index: tuple[int, ...], tile: Tile) -> None:
        """Store `tile` as sub-tile `index` of this block's tile; outside it, nothing."""
        at = self._sub_tile(index, tile.shape)
        if at is None:
            return
        values = tile.astype(self.dtype).array
        outer, inner = tile_slices(self.full_shape, at, tile.shape)
        self.array[outer] = values[inner]
