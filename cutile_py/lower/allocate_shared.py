"""allocate_shared: where each long-lived shared-memory buffer lies, and for how long, decided
before emission from the pipelines' sizes.

Buffers and their lifetimes:
- a pipeline's ring of stages (a TMA ring aligned to `plan_tma.TMA_ALIGN`, its mbarriers
  after the stages), and the mma operands defined before its loop (stored once,
  "resident"), live while the loop runs: from its prologue to its drain;
- scratch (layout conversions, cross-warp reductions, mma operands stored from registers,
  accumulator bands) lives for one op at a time, barrier to barrier, at the floor of the
  code it is in: past every buffer live there.

Sibling loops do not overlap in time, so their buffers share offsets; a loop nested in a
pipelined loop stacks its buffers past the outer one's. Scratch sizes are measured while
emitting (the emitter grows the block's shared memory from the floor up).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from cutile_py.ir import ops as o
from cutile_py.lower.fragments import SharedTile, round_region
from cutile_py.lower.plan_pipelines import PipelinePlan
from cutile_py.lower.plan_tma import TMA_ALIGN
from cutile_py.lower.plan_wgmma import ALIGN


@dataclass(frozen=True)
class SharedRegion:
    """A buffer of `nbytes` at byte `offset` of shared memory, live while `loop` runs."""

    kind: str  # "ring" (a pipeline's stages) or "resident" (an mma operand stored once)
    loop: o.ForOp
    offset: int
    nbytes: int
    #: For a resident tile: the operand, 0 for A or 1 for B, and its tile (at `offset`).
    value: o.Value | None = None
    which: int = 0
    tile: SharedTile | None = None


@dataclass(frozen=True)
class SharedPlan:
    regions: tuple[SharedRegion, ...]
    #: Where the scratch of each pipelined loop's body starts (past every buffer live
    #: there); scratch elsewhere starts at the enclosing loop's floor, or at 0.
    floors: Mapping[o.ForOp, int]

    def ring(self, loop: o.ForOp) -> int:
        """Byte offset of stage 0 of `loop`'s ring."""
        return next(r.offset for r in self.regions if r.loop is loop and r.kind == "ring")

    def resident(self, loop: o.ForOp) -> tuple[SharedRegion, ...]:
        return tuple(r for r in self.regions if r.loop is loop and r.kind == "resident")

    def floor(self, loop: o.ForOp) -> int:
        return self.floors[loop]


def no_shared() -> SharedPlan:
    return SharedPlan((), MappingProxyType({}))


def allocate_shared(kernel: o.Kernel, pipelines: Mapping[o.ForOp, PipelinePlan]) -> SharedPlan:
    """Place every pipelined loop's ring and resident tiles, outer loops first."""
    regions: list[SharedRegion] = []
    floors: dict[o.ForOp, int] = {}

    def visit(region: o.Region, floor: int) -> None:
        for op in region.ops:
            inner = floor
            plan = pipelines.get(op) if isinstance(op, o.ForOp) else None
            if plan is not None and plan.loads:
                assert isinstance(op, o.ForOp)
                # wgmma's and TMA's swizzled tiles start on 1024-byte boundaries
                align = max(ALIGN if plan.wgmma else 1, TMA_ALIGN if plan.kind == "tma" else 1)
                start = -(-floor // align) * align
                size = plan.ring_bytes
                regions.append(SharedRegion("ring", op, start, size))
                at = start + size
                for v, which, tile in plan.resident:
                    placed = replace(tile, offset=at)
                    regions.append(SharedRegion("resident", op, at, tile.nbytes, v, which, placed))
                    at += round_region(tile.nbytes)
                inner = floors[op] = at
            for r in op.regions():
                visit(r, inner)

    visit(kernel.body, 0)
    return SharedPlan(tuple(regions), MappingProxyType(floors))
