"""plan_persistent: how a persistent kernel (`@ct.kernel(persistent=True)`) walks its tiles.

About one wave of blocks is launched; block b runs the kernel's body for the tiles t = b,
b + blocks, ... < tiles of the logical grid (passed as parameters), each t mapped to tile
indices as a launched block id would be (the `group_m` order where set: `ir.grid_order`).
The body is wrapped whole: a kernel returns only at its end (the frontend refuses any other
`return`), so every block reaches the next tile. Between tiles a block barrier: the next
tile's shared memory (rings, scratch) is written only once every warp is done with this one.

A warp-specialized loop keeps its ring across tiles: its mbarriers are initialized once per
block and invalidated at the end, their phases run on from tile to tile, and the producer
walks the same tiles, issuing the next tile's boxes while the consumers finish the last
(their epilogue's scratch then lies past the ring, not over it). Where the ring and that
scratch do not fit together, or there is no warp-specialized loop, every ring is set up and
drained per tile, as in a launched block (a producer warp group then meets the consumers
once per tile, when they have initialized its barriers).

With the ring kept, a TMA store epilogue whose staging tile no other buffer overlaps does
not wait for the copy engine to read that tile before the next tile's loop starts: the wait
moves to the next tile's epilogue, before the staging tile is written again, and to the
block's end (`defer_store_waits`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from cutile_py.ir import ops as o
from cutile_py.lower.allocate_shared import SharedPlan
from cutile_py.lower.plan_pipelines import PipelinePlan
from cutile_py.lower.plan_store import StorePlan


@dataclass(frozen=True)
class Persistence:
    """The tile walk of a persistent kernel."""

    #: Tile rows per band of the L2-grouped order (None: the launch order).
    group_m: int | None
    #: The warp-specialized loop whose ring and mbarriers live across tiles (None: every
    #: ring is set up and drained per tile), and why not where there is a ring ("").
    kept: o.ForOp | None = None
    why: str = ""
    #: TMA stores whose wait for the staging tile's read is left to the next tile's
    #: epilogue and the block's end (`defer_store_waits`).
    deferred: frozenset[o.StoreOp] = frozenset()

    def describe(self, loop_name: str = "") -> list[str]:
        order = f"L2-grouped by group_m={self.group_m}" if self.group_m else "in launch order"
        lines = [
            "persistent: one wave of blocks; block b runs the body for tiles b, b + blocks, "
            f"... of the logical grid (parameters), {order}; a block barrier between tiles; "
            "the whole body is wrapped (a kernel returns only at its end)"
        ]
        if self.kept is not None:
            lines.append(
                f"  ring of for {loop_name} kept across tiles: its mbarriers initialized once "
                "and invalidated at the end, phases running on; the producer walks the same "
                "tiles and fills the next tile's stages while the consumers finish the last "
                "(scratch past the ring)"
            )
        elif self.why:
            lines.append(f"  rings set up and drained per tile: {self.why}")
        return lines


def plan_persistent(
    kernel: o.Kernel,
    pipelines: Mapping[o.ForOp, PipelinePlan],
    too_big: tuple[int, int] | None = None,
) -> Persistence | None:
    """The tile walk of `kernel` (None unless persistent): which warp-specialized ring it
    keeps across tiles. `too_big`: (bytes, limit) where keeping it, the scratch moved past
    the ring, would need more shared memory than the block may have (`plan.plan_lowering`)."""
    if not kernel.persistent:
        return None
    rings = [loop for loop, p in pipelines.items() if p.loads]
    ws = [loop for loop, p in pipelines.items() if p.ws is not None]
    if ws and too_big is None and len(rings) == 1:
        return Persistence(kernel.group_m, ws[0])
    if not rings:
        return Persistence(kernel.group_m)
    if ws and len(rings) > 1:
        # Sibling loops' rings share offsets: another loop would write over the kept one.
        why = "another loop's ring shares the warp-specialized ring's shared memory"
    elif too_big is not None:
        why = "the warp-specialized ring kept across tiles and the scratch past it (the "
        why += f"epilogue's) would need {too_big[0]} bytes of shared memory, more than the "
        why += f"{too_big[1]} a block may have"
    elif kernel.warp_specialize:
        why = "no loop is warp-specialized (see its pipeline)"
    else:
        why = "no warp-specialized loop (only a producer warp group can fill the next tile's"
        why += " stages while the block finishes this one)"
    return Persistence(kernel.group_m, None, why)


def defer_store_waits(persist: Persistence, stores: StorePlan, shared: SharedPlan) -> Persistence:
    """`persist` with the TMA stores whose staging wait can move to the next tile: the ring
    is kept across tiles (so it is not over the staging tile) and no other buffer of the
    plan overlaps the staging tile, so nothing but the next tile's store writes it again."""
    if persist.kept is None:
        return persist
    rings = [(r.offset, r.nbytes) for r in shared.regions]
    deferred = set()
    for store in stores.tma:
        buf = shared.scratch.get((store, ""))
        if buf is None:
            continue
        others = [(b.offset, b.nbytes) for b in shared.scratch.values() if b is not buf]
        if all(at + n <= buf.offset or buf.offset + buf.nbytes <= at for at, n in rings + others):
            deferred.add(store)
    return replace(persist, deferred=frozenset(deferred))
