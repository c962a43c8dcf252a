"""What an instruction's semantics see: operands read and written for all lanes at once.

Lanes are laid out warp by warp: lane `i` of warp `w` is element `32*w + i` of every array, so
warp-level instructions reshape to (-1, 32). Lanes that do not exist (a block size that is not a
multiple of 32) or have exited are never in `mask`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NoReturn

import numpy as np

from cutile_py.ptx.ast import Instruction, Operand

WARP = 32

#: The NumPy dtype holding a value of each PTX type (bf16, tf32 and packed pairs as raw bits).
PTYPE_DTYPE: dict[str, np.dtype[np.generic]] = {
    **{f"{k}8": np.dtype(d) for k, d in (("u", np.uint8), ("s", np.int8), ("b", np.uint8))},
    **{f"{k}16": np.dtype(d) for k, d in (("u", np.uint16), ("s", np.int16), ("b", np.uint16))},
    **{f"{k}32": np.dtype(d) for k, d in (("u", np.uint32), ("s", np.int32), ("b", np.uint32))},
    **{f"{k}64": np.dtype(d) for k, d in (("u", np.uint64), ("s", np.int64), ("b", np.uint64))},
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "bf16": np.dtype(np.uint16),
    "tf32": np.dtype(np.uint32),
    "f16x2": np.dtype(np.uint32),
    "bf16x2": np.dtype(np.uint32),
    "pred": np.dtype(np.bool_),
}


class SimError(RuntimeError):
    """A fault found while simulating: names the kernel, PTX line, block and thread."""


class ExecContext(ABC):
    """The executor's side of one instruction's execution."""

    #: Number of lanes (a multiple of 32).
    n: int
    #: Lanes that execute this instruction (active, not exited, guard true).
    mask: np.ndarray
    instr: Instruction

    @abstractmethod
    def read(self, op: Operand, ptype: str) -> np.ndarray:
        """Operand values as PTYPE_DTYPE[ptype], shape (n,), for every lane.

        Registers are stored as raw bits and reinterpreted (a wider register read as a narrower
        type is truncated, as PTX allows for cvt/ld/st); immediates are broadcast; a Symbol
        reads as its address; special registers (%tid.x, %laneid, ...) are computed.
        """

    @abstractmethod
    def write(self, op: Operand, ptype: str, values: np.ndarray) -> None:
        """Store `values` (convertible to PTYPE_DTYPE[ptype]) into register `op` for the lanes
        in `mask` only; a Sink discards."""

    def move(self, dst: Operand, src: Operand, width: int) -> bool:
        """Make register `dst` hold register `src`'s array itself, where both are `width` bytes
        wide and every lane writes (a mov); False, having done nothing, elsewhere. Keeping
        the array lets the semantics recognize a value they decoded before (mma)."""
        return False

    @abstractmethod
    def fail(self, message: str, lanes: np.ndarray | None = None) -> NoReturn:
        """Raise SimError for this instruction; `lanes` (bool, shape (n,)) picks the threads
        named in the message."""
