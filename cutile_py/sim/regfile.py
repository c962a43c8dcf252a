"""Register slots: at load every declared register of a function gets an integer index, and
each register operand of its instructions is rewritten once into a `Slot` that carries it, so
the register file is a list indexed per access with no name lookup.

Special registers (`%tid.x`, `%laneid`...) and names the function does not declare stay plain
`Reg` operands: their values are computed, not stored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cutile_py.ptx.ast import Addr, Instruction, Neg, Operand, Reg, Vec


@dataclass(frozen=True)
class Slot(Reg):
    """A declared register operand and its index in the function's register file."""

    slot: int


class Slots:
    """The register slots of one function: declared registers in declaration order."""

    def __init__(self, reg_types: dict[str, str]) -> None:
        self.index = {name: i for i, name in enumerate(reg_types)}
        self.names = tuple(reg_types)
        self.types = tuple(reg_types.values())

    def reg(self, op: Reg) -> Reg:
        """`op` as a `Slot` where the function declares it, else `op` (a special register)."""
        i = self.index.get(op.name)
        return op if i is None else Slot(op.name, i)

    def operand(self, op: Operand) -> Operand:
        """`op` with every declared register in it (items, address base, negation) a `Slot`."""
        if isinstance(op, Reg):
            return self.reg(op)
        if isinstance(op, Vec):
            return Vec(tuple(self.operand(x) for x in op.items))
        if isinstance(op, Addr) and isinstance(op.base, Reg):
            return Addr(self.reg(op.base), op.offset)
        if isinstance(op, Neg):
            return Neg(self.reg(op.reg))
        return op

    def instruction(self, ins: Instruction) -> Instruction:
        """`ins` with its register operands resolved to slots (line and text unchanged)."""
        ops = tuple(self.operand(op) for op in ins.operands)
        return dataclasses.replace(ins, operands=ops)
