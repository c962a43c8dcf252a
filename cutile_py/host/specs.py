"""`TensorSpec` / `PartitionSpec`: argument descriptions for compiling without real tensors."""

from __future__ import annotations

from dataclasses import dataclass

from cutile_py.ir.dtypes import DType, f32


@dataclass(frozen=True)
class TensorSpec:
    """Stands in for a `Tensor` argument of `kernel.compile/ptx/ir`."""

    shape: tuple[int, ...]
    dtype: type[DType] = f32


@dataclass(frozen=True)
class PartitionSpec:
    """Stands in for a `Partition` argument: the tensor's shape and the tile shape."""

    shape: tuple[int, ...]
    tile: tuple[int, ...]
    dtype: type[DType] = f32
