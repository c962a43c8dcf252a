"""Blocked layouts: which thread holds which elements of a tile.

A tile of shape S is cut, in row-major order, into chunks of `vec` consecutive elements of its
last dim; chunk c belongs to thread c % threads as its repetition c // threads. A chunk is one
vectorized global access, and consecutive threads touch consecutive chunks (coalesced).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from cutile_py.ir import ops as o
from cutile_py.ir.types import TileType

MAX_THREADS = 256
VECTOR_BYTES = 16
#: Vector width (elements) for shapes no memory op touches: arithmetic only.
DEFAULT_VEC = 4


@dataclass(frozen=True)
class BlockedLayout:
    shape: tuple[int, ...]
    vec: int
    threads: int

    @property
    def chunks(self) -> int:
        return prod(self.shape) // self.vec

    @property
    def reps(self) -> int:
        """Chunks per thread (the last repetition may be partial)."""
        return -(-self.chunks // self.threads)

    @property
    def guarded(self) -> bool:
        """Whether some threads have no chunk in the last repetition."""
        return self.chunks % self.threads != 0

    @property
    def per_thread(self) -> int:
        return self.reps * self.vec


@dataclass(frozen=True)
class LayoutPlan:
    threads: int
    layouts: dict[tuple[int, ...], BlockedLayout]

    def of(self, t: TileType) -> BlockedLayout:
        return self.layouts[t.shape]


def walk(region: o.Region) -> list[o.Op]:
    out: list[o.Op] = []
    for op in region.ops:
        out.append(op)
        for r in op.regions():
            out.extend(walk(r))
    return out


def plan_layouts(kernel: o.Kernel) -> LayoutPlan:
    """One layout per tile shape, all sharing one block size."""
    min_item: dict[tuple[int, ...], int] = {}
    shapes: set[tuple[int, ...]] = set()
    for op in walk(kernel.body):
        for value in (*op.operands, *op.results):
            if value.type.shape:
                shapes.add(value.type.shape)
        if isinstance(op, (o.LoadOp, o.StoreOp)):
            t = op.result.type if isinstance(op, o.LoadOp) else op.operands[-1].type
            size = t.dtype.itemsize()
            min_item[t.shape] = min(min_item.get(t.shape, size), size)
    vecs: dict[tuple[int, ...], int] = {}
    for s in shapes:
        limit = VECTOR_BYTES // min_item[s] if s in min_item else DEFAULT_VEC
        v = 1
        while v * 2 <= limit and s[-1] % (v * 2) == 0:
            v *= 2
        vecs[s] = v
    most = max((prod(s) // vecs[s] for s in shapes), default=1)
    threads = min(MAX_THREADS, max(32, -(-most // 32) * 32))
    return LayoutPlan(threads, {s: BlockedLayout(s, vecs[s], threads) for s in sorted(shapes)})
