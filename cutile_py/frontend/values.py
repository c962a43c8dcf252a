"""Compile-time stand-ins the frontend evaluates kernel expressions to, besides IR values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cutile_py.frontend.signature import BoundParam


@dataclass(frozen=True)
class ParamRef:
    """A tensor or partition parameter (`index` into the kernel's parameters)."""

    index: int
    bound: BoundParam

    @property
    def name(self) -> str:
        return self.bound.spec.name

    @property
    def is_partition(self) -> bool:
        return self.bound.tile_shape is not None


@dataclass(frozen=True)
class ShapeRef:
    """`x.shape` of a shared tensor: static where the annotation fixes a dim, else run time."""

    param: ParamRef


@dataclass(frozen=True)
class BoundMethod:
    """`receiver.name` awaiting its call (`z.store`, `t.astype`, ...)."""

    receiver: Any
    name: str


@dataclass(frozen=True)
class Reduced:
    """How a tile came out of a reduction that dropped axes (`keepdims=False`): the shape it
    was reduced from, the dropped axes and the call, for misaligned-broadcast errors."""

    source_shape: tuple[int, ...]
    axes: tuple[int, ...]
    call: str  # e.g. "ct.sum(..., axis=1) at line 9"

    @property
    def kept(self) -> tuple[int, ...]:
        return tuple(i for i in range(len(self.source_shape)) if i not in self.axes)
