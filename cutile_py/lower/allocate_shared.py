"""allocate_shared: where each long-lived shared-memory buffer lies, and for how long, decided
before emission from the pipelines' sizes.

Buffers and their lifetimes:
- a pipeline's ring of stages (a TMA ring aligned to `plan_tma.TMA_ALIGN`, its mbarriers
  after the stages), and the mma operands defined before its loop (stored once,
  "resident"), live while the loop runs: from its prologue to its drain;
- scratch (layout conversions, reductions and scans across warps, mma operands stored from
  registers, accumulator bands: `size_scratch`) lives while one op runs, barrier to
  barrier, at the floor of the code it is in: past every ring and resident tile live there.
  Scratch of code outside a pipelined loop overlays that loop's ring (dead there), scratch
  inside its body lies past it; the loop's own "enter" conversions run after its resident
  tiles are stored, so they lie past them too.

Sibling loops do not overlap in time, so their buffers share offsets; a loop nested in a
pipelined loop stacks its buffers past the outer one's. Scratch buffers of different ops
share offsets: no two ops run at once. The block's shared memory is the plan's `total`,
checked against the target's limit here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from cutile_py.ir import ops as o
from cutile_py.ir.uses import DefUse
from cutile_py.lower.assign_fragments import FragmentPlan
from cutile_py.lower.errors import LoweringError
from cutile_py.lower.fragments import SHARED_LIMIT, SharedTile, round_region
from cutile_py.lower.layout import LayoutPlan
from cutile_py.lower.plan_pipelines import PipelinePlan
from cutile_py.lower.plan_store import TmaStore
from cutile_py.lower.plan_tma import TMA_ALIGN
from cutile_py.lower.plan_wgmma import ALIGN
from cutile_py.lower.size_scratch import ENTER, LEAVE, Need, Sizer
from cutile_py.ptx.target import Target


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
class ScratchBuffer:
    """`nbytes` at byte `offset` that `op` (at `moment`, for a loop: "enter" or "leave")
    moves values through while it runs; `what`: the uses, largest first."""

    op: o.Op
    moment: str
    what: str
    offset: int
    nbytes: int
    #: Its lifetime: the step of `op` in program order (`SharedPlan.steps`).
    step: int


@dataclass(frozen=True)
class SharedPlan:
    regions: tuple[SharedRegion, ...]
    #: Where the scratch of each pipelined loop's body starts (past every buffer live
    #: there); scratch elsewhere starts at the enclosing loop's floor, or at 0.
    floors: Mapping[o.ForOp, int]
    #: Every op's scratch buffer, by (op, moment), in program order.
    scratch: Mapping[tuple[o.Op, str], ScratchBuffer] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: Bytes of shared memory the block needs (a multiple of 16).
    total: int = 0
    #: Where an accumulator's bands may reach (`size_scratch.band_tile`).
    band_limit: int = SHARED_LIMIT
    #: Per loop: the steps of its enter and its leave in program order (every op, and a
    #: loop's enter and leave, is one step); its ring and resident tiles live from its
    #: enter up to, not including, its leave.
    steps: Mapping[o.ForOp, tuple[int, int]] = field(default_factory=lambda: MappingProxyType({}))

    def live(self, region: SharedRegion) -> tuple[int, int]:
        """The first and last step `region` is live at."""
        enter, leave = self.steps[region.loop]
        return enter, leave - 1

    def ring(self, loop: o.ForOp) -> int:
        """Byte offset of stage 0 of `loop`'s ring."""
        return next(r.offset for r in self.regions if r.loop is loop and r.kind == "ring")

    def resident(self, loop: o.ForOp) -> tuple[SharedRegion, ...]:
        return tuple(r for r in self.regions if r.loop is loop and r.kind == "resident")

    def floor(self, loop: o.ForOp) -> int:
        return self.floors[loop]


def no_shared() -> SharedPlan:
    return SharedPlan((), MappingProxyType({}))


def _up(n: int, align: int) -> int:
    return -(-n // align) * align


def allocate_shared(
    kernel: o.Kernel,
    pipelines: Mapping[o.ForOp, PipelinePlan],
    layouts: LayoutPlan,
    fragments: FragmentPlan,
    uses: DefUse,
    target: Target,
    tma_stores: Mapping[o.StoreOp, TmaStore] | None = None,
    kept: o.ForOp | None = None,
    check: bool = True,
) -> SharedPlan:
    """Place every pipelined loop's ring and resident tiles (outer loops first), then every
    op's scratch at the floor of the code it is in; the total must fit `target`. `kept`: a
    top-level loop whose ring lives the whole kernel (a persistent kernel's warp-specialized
    loop, its producer filling it while the rest of the body runs): all scratch lies past it,
    and an accumulator's bands may take what shared memory is left. `check` False: the total
    may exceed the target's limit (the caller compares)."""
    rings = place_rings(kernel, pipelines)
    band_limit = max(SHARED_LIMIT, max((r.offset + r.nbytes for r in rings.regions), default=0))
    base = 0
    if kept is not None:
        base = rings.floors[kept]
        band_limit = max(band_limit, target.max_shared_bytes)
    sizer = Sizer(layouts, fragments, pipelines, uses, band_limit, tma_stores=tma_stores or {})
    scratch: dict[tuple[o.Op, str], ScratchBuffer] = {}

    steps: dict[o.ForOp, tuple[int, int]] = {}
    counter = iter(range(1 << 62))

    def place(op: o.Op, moment: str, at: int, needs: list[Need]) -> int:
        step = next(counter)
        needs = sorted((n for n in needs if n.nbytes), key=lambda n: -n.nbytes)
        if needs:
            what = ", ".join(dict.fromkeys(n.what for n in needs))
            at = _up(at, max(n.align for n in needs))
            scratch[(op, moment)] = ScratchBuffer(op, moment, what, at, needs[0].nbytes, step)
        return step

    def sized(op: o.Op, floor: int, moment: str = "") -> list[Need]:
        return list(replace(sizer, floor=floor).needs(op, moment))

    def visit(region: o.Region, floor: int, likes: tuple[o.Value, ...]) -> None:
        floor = _up(floor, 16)  # scratch starts 16-byte aligned (`size_scratch.Need`)
        for op in region.ops:
            if isinstance(op, o.YieldOp):
                place(op, "", floor, list(sizer.yielded(op, likes)))
            elif isinstance(op, o.ForOp):
                inner = _up(rings.floors.get(op, floor), 16)
                enter = place(op, ENTER, inner, sized(op, inner, ENTER))
                visit(op.body, inner, tuple(op.body.args[1:]))
                steps[op] = (enter, place(op, LEAVE, floor, sized(op, floor, LEAVE)))
            elif isinstance(op, o.IfOp):
                for r in op.regions():
                    visit(r, floor, op.results)
                place(op, "", floor, sized(op, floor))
            else:
                place(op, "", floor, sized(op, floor))
                for r in op.regions():
                    visit(r, floor, ())

    visit(kernel.body, base, ())
    ends = [r.offset + r.nbytes for r in rings.regions]
    ends += [b.offset + b.nbytes for b in scratch.values()]
    total = _up(max(ends, default=0), 16)
    if check and total > target.max_shared_bytes:
        every = [(r.nbytes, f"{r.kind} of the loop{_at(r.loop)}") for r in rings.regions]
        every += [(b.nbytes, f"{b.what} of {b.op.opname}{_at(b.op)}") for b in scratch.values()]
        big = "; ".join(f"{what}: {n} bytes" for n, what in sorted(every, key=lambda e: -e[0])[:3])
        raise LoweringError(
            f"kernel {kernel.name} needs {total} bytes of shared memory, more than the "
            f"{target.max_shared_bytes} bytes a block may have on {target.name} (the biggest "
            f"buffers: {big}); use smaller tiles"
        )
    return replace(
        rings,
        scratch=MappingProxyType(scratch),
        total=total,
        band_limit=band_limit,
        steps=MappingProxyType(steps),
    )


def _at(op: o.Op) -> str:
    return f" at {op.span[0]}:{op.span[1]}" if op.span is not None else ""


def place_rings(kernel: o.Kernel, pipelines: Mapping[o.ForOp, PipelinePlan]) -> SharedPlan:
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
