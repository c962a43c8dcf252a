"""How large a tile may be: what one block of any supported GPU can hold on chip.

A tile lives in the registers of the block that computes it, staged through shared memory
where ops need it, and no tile outlives its block. So no tile can exceed the register file
of one block plus the most shared memory one block may have. Both are facts of the CUDA C++
Programming Guide's "Technical Specifications per Compute Capability" table: 64K 32-bit
registers per block on every target from sm_80 on, and at most 227 KB of shared memory per
block (sm_90 and sm_100, with the opt-in; `cutile_py.ptx.target.MAX_SHARED_OPTIN`). The
frontend knows no target, so it takes the largest; a target with less finds out when it
allocates.
"""

from __future__ import annotations

from cutile_py.ir.dtypes import DType

#: Bytes of the register file one block may use: 64K 32-bit registers.
BLOCK_REGISTER_BYTES = 64 * 1024 * 4
#: The most shared memory one block may use on any target (sm_90's 227 KB).
MAX_BLOCK_SHARED_BYTES = 227 * 1024
#: The most bytes one tile may hold.
MAX_TILE_BYTES = BLOCK_REGISTER_BYTES + MAX_BLOCK_SHARED_BYTES


def max_tile_elements(dtype: type[DType]) -> int:
    """The most elements a tile of `dtype` may have."""
    return MAX_TILE_BYTES // dtype.itemsize()


def too_large(size: int, dtype: type[DType]) -> str | None:
    """Why a tile of `size` elements of `dtype` cannot be, or None if it can."""
    limit = max_tile_elements(dtype)
    if size <= limit:
        return None
    return (
        f"a tile of {size} elements ({_bytes(size * dtype.itemsize())} of {dtype.name}) is "
        f"larger than one block can hold: at most {limit} {dtype.name} elements "
        f"({_bytes(MAX_TILE_BYTES)}: the {_bytes(BLOCK_REGISTER_BYTES)} of a block's 64K "
        f"32-bit registers and the {_bytes(MAX_BLOCK_SHARED_BYTES)} of shared memory of the "
        "largest GPU); split the work into smaller tiles, over more blocks or a loop"
    )


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"
