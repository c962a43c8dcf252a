"""The simulator's tensor maps: what `cp.async.bulk.tensor` reads from its 128-byte operand.

The driver's `CUtensorMap` (made by `cuTensorMapEncodeTiled`) is opaque, so the simulator
has an encoding of its own, made by `encode_tiled` with the driver's arguments and checked by
the rules the driver documents for them (cuda.h, `cuTensorMapEncodeTiled`). A kernel passes
it the way it passes the driver's: as a 64-byte-aligned `.param .b8 [128]` (or in global
memory) whose generic address is the copy's tensor operand.

Layout (little-endian): magic, rank, element size, data type, swizzle, out-of-bounds fill,
the global address, then per dimension its size, its stride in bytes and the box size.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cutile_py.sim.context import SimError

SIZE = 128
MAGIC = 0x50544D43  # "CMTP": a tensor map made by `encode_tiled`

#: `CUtensorMapDataType` values and their element sizes (the sub-byte and packed types are
#: not supported).
DATA_TYPES: dict[int, tuple[str, int]] = {
    0: ("uint8", 1),
    1: ("uint16", 2),
    2: ("uint32", 4),
    3: ("int32", 4),
    4: ("uint64", 8),
    5: ("int64", 8),
    6: ("float16", 2),
    7: ("float32", 4),
    8: ("float64", 8),
    9: ("bfloat16", 2),
    10: ("float32_ftz", 4),
    11: ("tfloat32", 4),
    12: ("tfloat32_ftz", 4),
}
FLOATS = frozenset([6, 7, 8, 9, 10, 11, 12])

#: `CUtensorMapSwizzle`: NONE, 32B, 64B, 128B -> the span of the pattern in bytes (0: none).
SWIZZLE_BYTES = {0: 0, 1: 32, 2: 64, 3: 128}

_HEAD = struct.Struct("<IBBBBB3xQ")  # magic, rank, esize, dtype, swizzle, oob fill; address
_DIMS = struct.Struct("<5Q5Q5H")  # sizes, byte strides (dimension 0: the element size), box


@dataclass(frozen=True)
class TensorMap:
    """A decoded tensor map: dimension 0 is the innermost (contiguous) one."""

    address: int
    dtype: int
    esize: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]  # bytes; strides[0] == esize
    box: tuple[int, ...]
    swizzle: int  # bytes of the swizzle span; 0: none
    nan_fill: bool  # out-of-bounds elements read as NaN (else zero)

    @property
    def box_bytes(self) -> int:
        n = self.esize
        for b in self.box:
            n *= b
        return n


def check_tiled(
    dtype: int,
    address: int,
    dims: tuple[int, ...],
    strides: tuple[int, ...],
    box: tuple[int, ...],
    swizzle: int = 0,
    nan_fill: bool = False,
    element_strides: tuple[int, ...] | None = None,
) -> None:
    """Check `cuTensorMapEncodeTiled`'s arguments against the rules cuda.h documents for them
    (the driver's own encoding and the simulator's both call this first): ValueError names
    the argument that breaks one."""
    if dtype not in DATA_TYPES:
        raise ValueError(f"tensorDataType {dtype} is not supported (packed and sub-byte types)")
    name, esize = DATA_TYPES[dtype]
    rank = len(dims)
    if not 1 <= rank <= 5:
        raise ValueError(f"tensorRank {rank}: a tiled tensor map has 1 to 5 dimensions")
    if len(strides) != rank - 1 or len(box) != rank:
        raise ValueError(
            f"globalStrides needs {rank - 1} values and boxDim {rank} for rank {rank}; "
            f"got {len(strides)} and {len(box)}"
        )
    if element_strides is not None and any(e != 1 for e in element_strides):
        raise ValueError(f"elementStrides {element_strides}: only 1s are supported")
    if address % 16:
        raise ValueError(f"globalAddress {address:#x} is not 16-byte aligned")
    for i, d in enumerate(dims):
        if not 1 <= d <= 1 << 32:
            raise ValueError(f"globalDim[{i}] = {d} is not in 1..2**32")
    for i, s in enumerate(strides):
        if s % 16 or not 0 < s < 1 << 40:
            raise ValueError(
                f"globalStrides[{i}] = {s} is not a positive multiple of 16 below 2**40"
            )
    for i, b in enumerate(box):
        if not 1 <= b <= 256:
            raise ValueError(f"boxDim[{i}] = {b} is not in 1..256")
    inner = box[0] * esize
    if inner % 16:
        raise ValueError(f"boxDim[0] * {esize} bytes ({name}) = {inner} is not a multiple of 16")
    if swizzle not in SWIZZLE_BYTES:
        raise ValueError(f"swizzle {swizzle} is not a CUtensorMapSwizzle of 32, 64 or 128 bytes")
    span = SWIZZLE_BYTES[swizzle]
    if span and inner > span:
        raise ValueError(
            f"boxDim[0] * {esize} bytes = {inner} exceeds the {span}-byte swizzle span"
        )
    if nan_fill and dtype not in FLOATS:
        raise ValueError(
            f"NaN out-of-bounds fill needs a floating-point tensorDataType, not {name}"
        )


def encode_tiled(
    dtype: int,
    address: int,
    dims: tuple[int, ...],
    strides: tuple[int, ...],
    box: tuple[int, ...],
    swizzle: int = 0,
    nan_fill: bool = False,
    element_strides: tuple[int, ...] | None = None,
) -> bytes:
    """The 128 bytes of a tiled tensor map; arguments as `cuTensorMapEncodeTiled`'s: `dims`
    innermost first, `strides` the byte strides of dimensions 1.. (rank - 1 of them), `box`
    the box size per dimension, `swizzle` a `CUtensorMapSwizzle` value. ValueError names the
    argument that breaks one of the driver's documented rules (`check_tiled`)."""
    check_tiled(dtype, address, dims, strides, box, swizzle, nan_fill, element_strides)
    esize = DATA_TYPES[dtype][1]
    rank = len(dims)
    pad = (5 - rank) * (0,)
    all_strides = (esize, *strides)
    head = _HEAD.pack(MAGIC, rank, esize, dtype, swizzle, int(nan_fill), address)
    body = _DIMS.pack(*dims, *pad, *all_strides, *pad, *box, *pad)
    return (head + body).ljust(SIZE, b"\0")


def decode(raw: bytes) -> TensorMap:
    """The tensor map in `raw`; SimError where it is not one that `encode_tiled` made."""
    magic, rank, esize, dtype, swizzle, nan_fill, address = _HEAD.unpack_from(raw, 0)
    if magic != MAGIC or not 1 <= rank <= 5:
        raise SimError(
            "the tensor-map operand does not point at a tensor map made for the simulator "
            "(cutile_py.sim.tensor_map.encode_tiled)"
        )
    values = _DIMS.unpack_from(raw, _HEAD.size)
    dims, strides, box = values[0:rank], values[5 : 5 + rank], values[10 : 10 + rank]
    return TensorMap(address, dtype, esize, tuple(dims), tuple(strides), tuple(box),
                     SWIZZLE_BYTES[swizzle], bool(nan_fill))  # fmt: skip
