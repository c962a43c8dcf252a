"""A persistent kernel's tile walk (`plan_persistent`): block b runs the body for tiles b,
b + blocks, ... of the logical grid, each tile's indices computed as a launched block's
(`ir.grid_order` where `group_m` is set); also the L2-grouped arithmetic every block-order
remapping shares."""

from __future__ import annotations

from dataclasses import dataclass

from cutile_py.lower.context import EmitContext
from cutile_py.ptx.builder import FunctionBuilder, Reg


def grouped(
    fb: FunctionBuilder, pid: Reg, nx: Reg | str, ny: Reg | str, group_m: int
) -> tuple[Reg, Reg]:
    """Tile indices (axis 0, axis 1) of launch-order position `pid` of an `nx` x `ny` grid
    in the L2-grouped order (`ir.grid_order.grouped`, the same arithmetic)."""
    width, band, first, rows, r, m, n = (fb.reg("b32") for _ in range(7))
    fb.ins("mul.lo.u32", width, ny, group_m)  # blocks per band
    fb.ins("div.u32", band, pid, width)
    fb.ins("mul.lo.u32", first, band, group_m)
    fb.ins("sub.u32", rows, nx, first)
    fb.ins("min.u32", rows, rows, group_m)  # the last band may be narrower
    fb.ins("mul.lo.u32", r, band, width)
    fb.ins("sub.u32", r, pid, r)
    fb.ins("rem.u32", m, r, rows)
    fb.ins("add.u32", m, m, first)
    fb.ins("div.u32", n, r, rows)
    return m, n


def load_grid(em: EmitContext, dims: list[Reg]) -> None:
    """Keep the logical grid's sizes (registers loaded from the kernel's grid parameters)
    and its tile count, for the walk and for `ct.num_blocks`."""
    fb = em.fb
    tiles = fb.reg("b32")
    fb.ins("mul.lo.u32", tiles, dims[0], dims[1])
    fb.ins("mul.lo.u32", tiles, tiles, dims[2])
    em.logical_grid, em.tiles = dims, tiles


def tile_ids(em: EmitContext, t: Reg) -> list[Reg]:
    """The indices (axes 0, 1, 2) of tile `t` of the logical grid: t in launch order (axis 0
    fastest), remapped by `group_m` as a launched block's id would be."""
    fb = em.fb
    nx, ny, _ = em.logical_grid
    plane, z, pid = fb.reg("b32"), fb.reg("b32"), fb.reg("b32")
    fb.ins("mul.lo.u32", plane, nx, ny)
    fb.ins("div.u32", z, t, plane)
    fb.ins("rem.u32", pid, t, plane)
    group_m = em.kernel.group_m
    if group_m is not None:
        m, n = grouped(fb, pid, nx, ny, group_m)
        return [m, n, z]
    x, y = fb.reg("b32"), fb.reg("b32")
    fb.ins("rem.u32", x, pid, nx)
    fb.ins("div.u32", y, pid, nx)
    return [x, y, z]


@dataclass
class TileWalk:
    """One loop over a block's tiles: `t` the tile, `stride` the blocks launched."""

    t: Reg
    stride: Reg
    top: str
    end: str


def walk(em: EmitContext, name: str = "tile") -> TileWalk:
    """Open the loop over this block's tiles (t = %ctaid.x, then + %nctaid.x while t <
    tiles) and point `ct.bid` at tile t's indices."""
    fb = em.fb
    assert em.tiles is not None
    t, stride = fb.reg("b32"), fb.reg("b32")
    fb.ins("mov.u32", t, "%ctaid.x")
    fb.ins("mov.u32", stride, "%nctaid.x")
    tw = TileWalk(t, stride, fb.new_label(name), fb.new_label(f"{name}s_done"))
    fb.place(tw.top)
    done = fb.reg("pred")
    fb.ins("setp.ge.u32", done, t, em.tiles)
    fb.ins("bra.uni", tw.end, pred=done)
    em.block_ids = tile_ids(em, t)
    return tw


def next_tile(em: EmitContext, tw: TileWalk, barrier: bool = True) -> None:
    """Close the loop: (`barrier`: once every thread is done with this tile's shared
    memory) go on with the block's next tile."""
    fb = em.fb
    if barrier:
        em.barrier()
    fb.ins("add.u32", tw.t, tw.t, tw.stride)
    fb.ins("bra.uni", tw.top)
    fb.place(tw.end)
