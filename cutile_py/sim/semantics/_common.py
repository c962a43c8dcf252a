"""Shared helpers of the instruction semantics: modifier parsing, operand access, type facts.

Every semantic decodes its instruction once, at load, through `Mods`, which raises SimError on
any modifier left unconsumed, so an unimplemented variant is reported when the kernel is loaded
instead of silently computed; what it returns runs the instruction at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NoReturn

import numpy as np

from cutile_py.ptx.ast import Imm, Instruction, Neg, Operand, Sink, Vec
from cutile_py.sim.context import WARP, ExecContext, SimError

#: One decoded instruction, run for the executing lanes of `ctx`.
Run = Callable[[ExecContext], None]
#: The signature of every instruction semantic: decode (SimError for a form it lacks) to a Run.
Semantic = Callable[[Instruction], Run]

#: Unsigned NumPy dtype of each bit width (raw register bits are handled in these).
UINT: dict[int, type[np.unsignedinteger]] = {
    8: np.uint8,
    16: np.uint16,
    32: np.uint32,
    64: np.uint64,
}
SINT: dict[int, type[np.signedinteger]] = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}

INT_TYPES = frozenset(f"{k}{w}" for k in "usb" for w in (8, 16, 32, 64))
FLOAT_TYPES = frozenset({"f16", "f16x2", "bf16", "bf16x2", "tf32", "f32", "f64"})
#: Bit width of every PTX scalar type the semantics handle.
WIDTH: dict[str, int] = {
    **{t: int(t[1:]) for t in INT_TYPES},
    "f16": 16,
    "bf16": 16,
    "f16x2": 32,
    "bf16x2": 32,
    "tf32": 32,
    "f32": 32,
    "f64": 64,
    "pred": 1,
}

ROUND_FLOAT = ("rn", "rz", "rm", "rp")
ROUND_INT = ("rni", "rzi", "rmi", "rpi")


def is_signed(ptype: str) -> bool:
    """True for the signed integer types `.s8` … `.s64`."""
    return ptype.startswith("s")


class Mods:
    """The modifiers of one instruction, consumed one by one by its semantic.

    `finish()` fails on whatever was not consumed: the simulator never ignores a modifier.
    Failures are decode errors (SimError), raised when the kernel is loaded.
    """

    def __init__(self, instr: Instruction) -> None:
        self.instr = instr
        self.left: list[str] = list(instr.modifiers)

    def fail(self, message: str) -> NoReturn:
        raise SimError(f"{self.instr.opcode}: {message}")

    def flag(self, name: str) -> bool:
        """Consume `name` if present."""
        if name in self.left:
            self.left.remove(name)
            return True
        return False

    def one_of(self, names: Iterable[str], what: str, *, required: bool = False) -> str | None:
        """Consume the single modifier among `names` (two of them is an error)."""
        names = tuple(names)
        found = [m for m in self.left if m in names]
        if len(found) > 1:
            self.fail(f"conflicting {what} modifiers {', '.join('.' + f for f in found)}")
        if not found:
            if required:
                self.fail(f"needs a {what} modifier (one of {', '.join('.' + n for n in names)})")
            return None
        self.left.remove(found[0])
        return found[0]

    def types(self, allowed: Iterable[str], count: int) -> list[str]:
        """Consume `count` type modifiers, in the order written (`cvt.f32.s32` → f32, s32)."""
        allowed = frozenset(allowed)
        found = [m for m in self.left if m in allowed]
        if len(found) != count:
            wanted = "one type" if count == 1 else f"{count} types"
            got = ", ".join("." + f for f in found) or "none"
            other = [m for m in self.left if m not in allowed]
            extra = f" (other modifiers: {', '.join('.' + o for o in other)})" if other else ""
            self.fail(f"expected {wanted} among {sorted(allowed)}, got {got}{extra}")
        for m in found:
            self.left.remove(m)
        return found

    def type(self, allowed: Iterable[str]) -> str:
        return self.types(allowed, 1)[0]

    def finish(self) -> None:
        if self.left:
            mods = ", ".join("." + m for m in self.left)
            self.fail(f"modifier(s) {mods} not supported here (in `{self.instr.text.strip()}`)")


def decode_error(instr: Instruction, message: str) -> NoReturn:
    raise SimError(f"{instr.opcode}: {message}")


def operands(instr: Instruction, count: int) -> tuple[Operand, ...]:
    """The operands, checked to be exactly `count`."""
    if len(instr.operands) != count:
        decode_error(instr, f"expected {count} operands, got {len(instr.operands)}")
    return instr.operands


def split_dest_pair(
    instr: Instruction, nsrc: int
) -> tuple[Operand, Operand | None, tuple[Operand, ...]]:
    """Split `d[|p], src...`: the `|` pair may arrive as two operands or as a 2-item Vec."""
    ops = instr.operands
    if len(ops) == nsrc + 2:
        return ops[0], ops[1], tuple(ops[2:])
    if len(ops) == nsrc + 1:
        first = ops[0]
        if isinstance(first, Vec) and len(first.items) == 2:
            return first.items[0], first.items[1], tuple(ops[1:])
        return first, None, tuple(ops[1:])
    decode_error(instr, f"expected {nsrc + 1} or {nsrc + 2} operands, got {len(ops)}")


def read_pred(ctx: ExecContext, op: Operand) -> np.ndarray:
    """A predicate source, honouring `!%p`."""
    if isinstance(op, Neg):
        return ~np.asarray(ctx.read(op.reg, "pred"), dtype=np.bool_)
    return np.asarray(ctx.read(op, "pred"), dtype=np.bool_)


def read_bits(ctx: ExecContext, op: Operand, width: int) -> np.ndarray:
    """Raw bits of an operand as the unsigned dtype of `width`."""
    return np.asarray(ctx.read(op, f"b{width}")).astype(UINT[width], copy=False)


def read_typed_bits(ctx: ExecContext, op: Operand, ptype: str) -> np.ndarray:
    """Raw bits of an operand read as `ptype` (so a float immediate is encoded as that type)."""
    v = np.asarray(ctx.read(op, ptype))
    u = UINT[WIDTH[ptype]]
    return v.view(u) if v.dtype.itemsize == np.dtype(u).itemsize else v.astype(u)


def write_bits(ctx: ExecContext, op: Operand, width: int, bits: np.ndarray) -> None:
    ctx.write(op, f"b{width}", np.asarray(bits).astype(UINT[width], copy=False))


def write_pred(ctx: ExecContext, op: Operand | None, values: np.ndarray) -> None:
    if op is None or isinstance(op, Sink):
        return
    ctx.write(op, "pred", np.asarray(values, dtype=np.bool_))


def lane_ids(ctx: ExecContext) -> np.ndarray:
    """%laneid of every lane (lanes are laid out warp by warp)."""
    return np.arange(ctx.n, dtype=np.int64) % WARP


def imm_value(instr: Instruction, op: Operand, what: str) -> int:
    """An operand that the ISA requires to be an integer constant (lop3's immLut)."""
    if not isinstance(op, Imm) or not isinstance(op.value, int):
        decode_error(instr, f"{what} must be an integer immediate")
    return int(op.value)
