"""The lanes of one batch of blocks: registers as immutable NumPy arrays in a list indexed by
register slot (`cutile_py.sim.regfile`), special registers, and the `ExecContext` that
instruction semantics read and write through.

A register's array is never changed in place (a write rebinds it), so a read may return the
stored array or a view of it, and one array may back several registers safely.

A register read before any write holds zeros, where a GPU holds whatever was there;
`CUTILE_PY_SIM_UNWRITTEN=ones` makes it every bit set instead (NaN as a float, -1 as an
integer, true as a predicate), so that code which only passes because the value is 0 fails.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import NoReturn

import numpy as np

from cutile_py.ptx.ast import Imm, Instruction, Neg, Operand, Reg, Sink, Symbol, Vec
from cutile_py.sim.context import PTYPE_DTYPE, WARP, ExecContext, SimError
from cutile_py.sim.memory import SINT, UINT
from cutile_py.sim.regfile import Slot

BOOL = np.dtype(np.bool_)


#: Storage width in bytes of each declared register type (0: a predicate).
def reg_width(ptype: str) -> int:
    return 0 if ptype == "pred" else 16 if ptype == "b128" else PTYPE_DTYPE[ptype].itemsize


def resize(values: np.ndarray, width: int, signed: bool) -> np.ndarray:
    """Bits of `values` truncated, or sign-/zero-extended, to `width` bytes (unsigned)."""
    size = values.dtype.itemsize
    if signed and width > size:
        return values.view(SINT[size]).astype(SINT[width]).view(UINT[width])
    return values.view(UINT[size]).astype(UINT[width])


def imm_array(op: Imm, ptype: str) -> np.ndarray:
    """One lane's value of immediate `op` read as `ptype` (a 0-d array)."""
    want = PTYPE_DTYPE[ptype]
    v, bits = op.value, op.bits
    if want == BOOL:
        return np.array(bool(v))
    if ptype in ("bf16", "tf32") and isinstance(v, float) and bits is None:
        # Round the f32 value's bits to nearest even at the type's width.
        f = int(np.array(v, dtype=np.float32).view(np.uint32))
        drop = 16 if ptype == "bf16" else 13
        f = (f + (1 << (drop - 1)) - 1 + ((f >> drop) & 1)) >> drop << drop
        return np.array(f >> 16 if ptype == "bf16" else f, dtype=want)
    if want.kind == "f":
        if bits is not None and isinstance(v, float):
            return np.array(v, dtype=np.float64).astype(want)
        if isinstance(v, int) and want.itemsize <= 4 and ptype != "f16":
            return np.array(v & 0xFFFFFFFF, dtype=np.uint32).view(want)  # `mov.f32 %f, 0x3F800000`
        return np.array(float(v), dtype=want)
    if bits is not None:
        raw = bits
    elif isinstance(v, float):
        raw = int(v)
    else:
        raw = v
    return np.array(raw & ((1 << (8 * want.itemsize)) - 1), dtype=UINT[want.itemsize]).view(want)


class Lanes(ExecContext):
    """Registers and thread identities of `nblocks` consecutive blocks, warp by warp."""

    def __init__(
        self,
        kernel: str,
        reg_types: tuple[str, ...],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        first_block: int,
        nblocks: int,
        shared_sizes: tuple[int, int],
        symbol_value: Callable[[Symbol, str], np.ndarray],
        blocks: np.ndarray | None = None,
    ) -> None:
        self.kernel = kernel
        self.grid, self.block = grid, block
        self.threads = block[0] * block[1] * block[2]
        self.per_block = -(-self.threads // WARP) * WARP
        self.first_block = first_block
        #: The linear index of the block in each slot (a schedule may run blocks out of order).
        self.block_ids = (
            np.arange(first_block, first_block + nblocks, dtype=np.int64)
            if blocks is None
            else blocks.astype(np.int64)
        )
        self.nblocks = nblocks
        self.n = n = nblocks * self.per_block
        self.ids = np.arange(n, dtype=np.int64)
        self.tid = self.ids % self.per_block  # linear thread index in its block
        self.slot = self.ids // self.per_block  # block index within the batch
        self.exists = self.tid < self.threads
        self.live = self.exists.copy()
        self.mask = self.live
        self.full = True  # mask covers every live lane
        self.dense = bool(self.exists.all())  # mask covers every lane of the batch
        #: What a never-written register reads as: every bit set (else zeros; see the module).
        self.unwritten_ones = os.environ.get("CUTILE_PY_SIM_UNWRITTEN", "").strip() == "ones"
        self.instr = Instruction(0, "", "", (), ())
        #: Each declared register's lanes by slot; None until first written.
        self.file: list[np.ndarray | None] = [None] * len(reg_types)
        self.widths = tuple(reg_width(t) for t in reg_types)
        self.shared_sizes = shared_sizes  # (dynamic, total) bytes
        self.symbol_value = symbol_value
        self.steps = 0
        #: Memory writes (stores, atomics, cp.async) and clock reads so far: the loop watch
        #: (`cutile_py.sim.loops`) treats either as possible progress.
        self.writes = 0
        self.clock_reads = 0
        self._imms: dict[tuple[int, str], tuple[Imm, np.ndarray]] = {}
        self._special: dict[str, np.ndarray] = {}

    # -- identities ---------------------------------------------------------------------------
    def thread_of(self, lane: int) -> tuple[int, int, int]:
        t = int(self.tid[lane])
        bx, by, _ = self.block
        return (t % bx, (t // bx) % by, t // (bx * by))

    def block_of(self, lane: int) -> tuple[int, int, int]:
        b = int(self.block_ids[self.slot[lane]])
        gx, gy, _ = self.grid
        return (b % gx, (b // gx) % gy, b // (gx * gy))

    def describe_thread(self, tid: int) -> str:
        bx, by, _ = self.block
        return f"({tid % bx}, {(tid // bx) % by}, {tid // (bx * by)})"

    def where(self, lane: int) -> str:
        b, t = self.block_of(lane), self.thread_of(lane)
        return f"block ({b[0]}, {b[1]}, {b[2]}) thread ({t[0]}, {t[1]}, {t[2]})"

    def error(self, message: str, lane: int | None, instr: Instruction | None = None) -> SimError:
        ins = self.instr if instr is None else instr
        at = f"PTX line {ins.line} `{ins.text}`" if ins.line else "launch"
        who = f": {self.where(lane)}" if lane is not None else ""
        return SimError(f"kernel {self.kernel}, {at}{who}: {message}")

    def fail(self, message: str, lanes: np.ndarray | None = None) -> NoReturn:
        pick = self.mask
        if lanes is not None:
            mine = lanes & self.mask
            pick = mine if mine.any() else lanes
        lane = int(np.argmax(pick)) if pick.any() else None
        raise self.error(message, lane)

    def active(self, mask: np.ndarray | None = None) -> np.ndarray:
        """Global indices of the lanes in `mask` (default: this instruction's)."""
        if mask is None:
            if self.dense:
                return self.ids
            mask = self.mask
        return np.flatnonzero(mask)

    # -- operands -----------------------------------------------------------------------------
    def read(self, op: Operand, ptype: str) -> np.ndarray:
        t = type(op)
        if t is Slot:
            assert isinstance(op, Slot)
            got = self.file[op.slot]
            arr = self._unwritten(op.slot) if got is None else got
        elif t is Reg:
            assert isinstance(op, Reg)
            arr = self.special(op.name)
        else:
            return self._value(op, ptype)
        want = PTYPE_DTYPE[ptype]
        have = arr.dtype
        if have is want or have == want:
            return arr
        if have.itemsize == want.itemsize and have.kind != "b" and want.kind != "b":
            return arr.view(want)
        if have == BOOL or want == BOOL:
            self.fail(f"{op.name} is {'a predicate' if have == BOOL else 'not a predicate'}")
        return resize(arr, want.itemsize, False).view(want)

    def _value(self, op: Operand, ptype: str) -> np.ndarray:
        """`op`, not a register, read as `ptype`."""
        t = type(op)
        if t is Imm:
            assert isinstance(op, Imm)
            # By identity, hashing an Imm costs more than reading it (and Imm(1) == Imm(1.0),
            # but they read differently); the entry holds the operand, so its id stays its own.
            key = (id(op), ptype)
            got = self._imms.get(key)
            if got is None:
                got = (op, np.broadcast_to(imm_array(op, ptype), (self.n,)))
                self._imms[key] = got
            return got[1]
        if t is Neg:
            assert isinstance(op, Neg)
            return ~self.read(op.reg, "pred")
        if t is Vec:
            assert isinstance(op, Vec)
            return np.stack([self.read(x, ptype) for x in op.items], axis=1)
        if t is Symbol:
            assert isinstance(op, Symbol)
            return self.symbol_value(op, ptype)
        self.fail(f"operand {op} cannot be read as a value")

    def _unwritten(self, slot: int) -> np.ndarray:
        # A register read before any write holds zeros, or every bit set (a GPU would hold
        # garbage).
        w = self.widths[slot]
        dtype = BOOL if w == 0 else UINT[min(w, 8)]
        if self.unwritten_ones:
            return np.full(self.n, True if w == 0 else np.iinfo(dtype).max, dtype=dtype)
        return np.zeros(self.n, dtype=dtype)

    def write(self, op: Operand, ptype: str, values: np.ndarray) -> None:
        t = type(op)
        if t is Slot and self.full and type(values) is np.ndarray:
            # The common case, first: a whole register of its own width and type.
            slot = op.slot  # type: ignore[union-attr]
            want = PTYPE_DTYPE[ptype]
            if (
                values.dtype is want
                and self.widths[slot] == want.itemsize
                and (values.shape == (self.n,))
            ):
                if values.flags.writeable:
                    values.flags.writeable = False
                self.file[slot] = values
                return
        if t is Sink:
            return
        if t is Vec:
            assert isinstance(op, Vec)
            for j, item in enumerate(op.items):
                self.write(item, ptype, values[:, j])
            return
        if t is Reg:
            assert isinstance(op, Reg)
            self.fail(f"cannot write to {op.name}: not a declared register")
        if t is not Slot:
            self.fail(f"cannot write to operand {op}")
        assert isinstance(op, Slot)
        name, slot = op.name, op.slot
        width = self.widths[slot]
        want = PTYPE_DTYPE[ptype]
        vals = np.asarray(values)
        if vals.dtype != want:
            vals = vals.astype(want)
        if (width == 0) != (want == BOOL):
            self.fail(f"{name} is {'a predicate' if width == 0 else 'not a predicate'}")
        if width and want.itemsize != width:
            vals = resize(vals, min(width, 8), ptype.startswith("s"))
        if vals.shape != (self.n,):
            vals = np.broadcast_to(vals, (self.n,))
        if not self.full:
            old = self.file[slot]
            if old is None:
                old = self._unwritten(slot)
            if old.dtype != vals.dtype:
                old = old.view(vals.dtype)
            vals = np.where(self.mask, vals, old)
        if vals.flags.writeable:
            vals.flags.writeable = False
        self.file[slot] = vals

    def move(self, dst: Operand, src: Operand, width: int) -> bool:
        if not (self.full and type(dst) is Slot and type(src) is Slot):
            return False
        arr = self.file[src.slot]
        slot: int = dst.slot
        if (
            arr is None
            or arr.dtype.itemsize != width
            or self.widths[slot] != width
            or arr.dtype == BOOL
        ):
            return False
        self.file[slot] = arr
        return True

    # -- special registers --------------------------------------------------------------------
    def special(self, name: str) -> np.ndarray:
        got = self._special.get(name)
        if got is not None:
            return got
        if name in ("%clock", "%clock64", "%clock_hi"):
            self.clock_reads += 1
            c = self.steps * 4  # a monotonic count, uniform across lanes
            return np.full(self.n, c, dtype=np.uint64 if name == "%clock64" else np.uint32)
        if name.startswith("%globaltimer"):
            self.clock_reads += 1
            return np.full(self.n, time.time_ns() & (2**64 - 1), dtype=np.uint64)
        value = self._compute_special(name)
        value.flags.writeable = False
        self._special[name] = value
        return value

    def _compute_special(self, name: str) -> np.ndarray:
        base, _, axis = name.partition(".")
        k = "xyz".index(axis) if axis in ("x", "y", "z") else 0
        bx, by, _ = self.block
        u32 = np.uint32
        if base == "%tid":
            t = self.tid
            return (t % bx if k == 0 else (t // bx) % by if k == 1 else t // (bx * by)).astype(u32)
        if base == "%ntid":
            return np.full(self.n, self.block[k], dtype=u32)
        if base in ("%ctaid", "%clusterid"):
            b = self.block_ids[self.slot]
            gx, gy, _ = self.grid
            return (b % gx if k == 0 else (b // gx) % gy if k == 1 else b // (gx * gy)).astype(u32)
        if base in ("%nctaid", "%nclusterid"):
            return np.full(self.n, self.grid[k], dtype=u32)
        lane = (self.tid % WARP).astype(u32)
        if base == "%laneid":
            return lane
        if base.startswith("%lanemask_"):
            bit = np.left_shift(u32(1), lane)
            kind = base[len("%lanemask_") :]
            below = bit - u32(1)
            table = {"eq": bit, "lt": below, "le": below | bit, "gt": ~(below | bit), "ge": ~below}
            mask: np.ndarray = table[kind].astype(u32)
            return mask
        if base == "%warpid":
            return (self.tid // WARP).astype(u32)
        if base == "%nwarpid":
            return np.full(self.n, self.per_block // WARP, dtype=u32)
        if base == "%dynamic_smem_size":
            return np.full(self.n, self.shared_sizes[0], dtype=u32)
        if base in ("%total_smem_size", "%aggr_smem_size"):
            return np.full(self.n, self.shared_sizes[1], dtype=u32)
        if base in ("%cluster_nctaid", "%cluster_nctarank"):
            return np.full(self.n, 1, dtype=u32)
        if base == "%nsmid":
            return np.full(self.n, 1, dtype=u32)
        # %smid, %gridid, %envregN, %pmN, %cluster_ctaid/ctarank, %is_explicit_cluster...
        return np.zeros(self.n, dtype=u32)
