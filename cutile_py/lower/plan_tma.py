"""plan_tma: whether a pipeline's staged loads can be TMA copies (`cp.async.bulk.tensor`
into mbarrier-guarded stages) on a target with the Tensor Memory Accelerator, and with which
tensor-map swizzle; if not, why (the pipeline stays `cp.async`, and the printed plan says so).

A box lands in shared memory densely, innermost dimension fastest, swizzled by address:
16-byte chunk c of a `span`-byte row goes to `c ^ ((address >> 7) & (span/16 - 1))`. That is
exactly `SharedTile`'s swizzle (chunk `c ^ (r // R) % S`) when the tile's rows are `span`
bytes (16: no swizzle, 32, 64 or 128) and its base is aligned to the pattern's repeat (at most
8 rows of 128 bytes: `TMA_ALIGN`), so the mma reads a TMA-filled stage as it reads a
cp.async-filled one. A wgmma operand with wider rows is cut into panels of rows x 128 bytes
(`SharedTile.panel`), each a 128-byte-swizzled tile of its own: one box per panel fills it
(`box`: the inner dimension is one panel's columns; each box's inner coordinate and
destination are a panel further).
"""

from __future__ import annotations

from cutile_py.ir import ops as o
from cutile_py.lower.fragments import SharedTile

#: Alignment of a TMA stage ring and of each tile in a stage: the 128-byte swizzle's pattern
#: repeats every 8 rows of 128 bytes, and the shared address bits it reads are absolute.
TMA_ALIGN = 1024
#: Bytes set aside past a TMA ring for its mbarriers (8 bytes each, one per stage).
BARRIER_BYTES = 128
#: The largest box dimension a tensor map takes (cuTensorMapEncodeTiled's boxDim).
MAX_BOX = 256
#: `CUtensorMapSwizzle` for each row width (bytes) whose swizzle matches `SharedTile`'s.
SWIZZLE_OF_ROW = {16: 0, 32: 1, 64: 2, 128: 3}
#: `CUtensorMapDataType` of the element types a TMA pipeline copies (f32 is copied as it
#: is and rounded to tf32 when read, as after cp.async).
MAP_DTYPE = {"f16": 6, "f32": 7, "bf16": 9}


def tma_swizzle(param: o.TensorParam, load: o.LoadOp, tile: SharedTile) -> int | str:
    """The tensor-map swizzle (`CUtensorMapSwizzle`) that fills `tile` from `load` of `param`
    in the layout its readers expect, or why TMA cannot."""
    dt = load.result.type.dtype
    eb = dt.itemsize()
    if dt.name not in MAP_DTYPE:
        return f"{param.name}: no tensor-map data type for {dt.name}"
    if param.align * eb < 16:
        # align: elements dividing both the base address and the row length.
        return (
            f"{param.name}: its base or row stride is not a multiple of 16 bytes "
            f"(aligned to {param.align * eb} bytes)"
        )
    dims = box(load.shape, tile)
    if any(s > MAX_BOX for s in dims):
        return f"{param.name}: a box dim of {max(dims)} exceeds a box's {MAX_BOX}"
    if tile.xor_step != 1 or tile.pad:
        return f"{param.name}: its tile's swizzle steps by 2 (tf32 rows along K)"
    swizzle = SWIZZLE_OF_ROW.get(tile.row_bytes)
    if swizzle is None:
        return (
            f"{param.name}: tile rows of {tile.row_bytes} bytes; a TMA swizzle matches the "
            "tile's only for rows of 16, 32, 64 or 128 bytes"
        )
    return swizzle


def box(shape: tuple[int, ...], tile: SharedTile) -> tuple[int, ...]:
    """The box that fills `tile` (one panel of it, where it has panels) from a load of
    `shape`: its dimensions innermost first, as a tensor map takes them."""
    return (tile.panel or shape[-1], *reversed(shape[:-1]))


def align_tma(nbytes: int) -> int:
    """`nbytes` rounded up to `TMA_ALIGN`."""
    return -(-nbytes // TMA_ALIGN) * TMA_ALIGN
