"""Tile types: an element dtype and a static shape (the empty shape is a scalar)."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from cutile_py.ir.dtypes import DType


@dataclass(frozen=True)
class TileType:
    dtype: type[DType]
    shape: tuple[int, ...] = ()

    @property
    def is_scalar(self) -> bool:
        return not self.shape

    @property
    def size(self) -> int:
        return prod(self.shape)

    def with_dtype(self, dtype: type[DType]) -> TileType:
        return TileType(dtype, self.shape)

    def __str__(self) -> str:
        if not self.shape:
            return self.dtype.name
        return f"{self.dtype.name}<{'x'.join(map(str, self.shape))}>"


def scalar(dtype: type[DType]) -> TileType:
    return TileType(dtype, ())
