"""PTX instruction semantics for the simulator, vectorized over all lanes of a block.

`INSTRUCTIONS` maps a base opcode ("add", "cvt", "mma", ...) to a function that decodes one
instruction, once, when the kernel is loaded (SimError for a form it does not implement), into a
`Run`: a function of `ctx` that reads its operands through `ctx.read`, writes results through
`ctx.write` (masked to the executing lanes) and reports faults through `ctx.fail`. Memory, control
flow and barriers belong to the executor. Every modifier a semantic does not implement is an
error, never silently ignored.
"""

from __future__ import annotations

from cutile_py.ptx.ast import Instruction
from cutile_py.sim.semantics import (
    approx,
    compare,
    convert,
    data,
    floating,
    integer,
    logic,
    mma,
    warp,
)
from cutile_py.sim.semantics._common import FLOAT_TYPES, Run, Semantic


def _by_type(int_fn: Semantic, float_fn: Semantic) -> Semantic:
    """One opcode, two families: a floating type modifier selects `float_fn`."""

    def dispatch(instr: Instruction) -> Run:
        if any(mod in FLOAT_TYPES for mod in instr.modifiers):
            return float_fn(instr)
        return int_fn(instr)

    return dispatch


INSTRUCTIONS: dict[str, Semantic] = {
    # integer and floating arithmetic
    "add": _by_type(integer.add_sub, floating.arith),
    "sub": _by_type(integer.add_sub, floating.arith),
    "mul": _by_type(integer.mul_mad, floating.arith),
    "mad": _by_type(integer.mul_mad, floating.arith),
    "fma": floating.arith,
    "mul24": integer.mul24_mad24,
    "mad24": integer.mul24_mad24,
    "sad": integer.sad,
    "div": _by_type(integer.div_rem, floating.div),
    "rem": integer.div_rem,
    "abs": _by_type(integer.abs_neg, floating.abs_neg),
    "neg": _by_type(integer.abs_neg, floating.abs_neg),
    "min": _by_type(integer.minmax, floating.minmax),
    "max": _by_type(integer.minmax, floating.minmax),
    "popc": integer.bit_count,
    "clz": integer.bit_count,
    "bfind": integer.bit_count,
    "brev": integer.brev,
    "bfe": integer.bfe,
    "bfi": integer.bfi,
    # floating-point only
    "copysign": floating.copysign,
    "testp": floating.testp,
    "rcp": approx.approx_or_rounded,
    "sqrt": approx.approx_or_rounded,
    "rsqrt": approx.approx,
    "ex2": approx.approx,
    "lg2": approx.approx,
    "sin": approx.approx,
    "cos": approx.approx,
    "tanh": approx.approx,
    # logic and shifts
    "and": logic.bitwise,
    "or": logic.bitwise,
    "xor": logic.bitwise,
    "not": logic.bitwise,
    "cnot": logic.cnot,
    "lop3": logic.lop3,
    "shl": logic.shift,
    "shr": logic.shift,
    "shf": logic.shf,
    "prmt": logic.prmt,
    # comparison, selection, data movement, conversion
    "setp": compare.setp,
    "set": compare.set_,
    "selp": data.selp,
    "slct": data.slct,
    "mov": data.mov,
    "cvt": convert.cvt,
    # warp level
    "shfl": warp.shfl,
    "vote": warp.vote,
    "activemask": warp.activemask,
    "redux": warp.redux,
    "match": warp.match,
    "elect": warp.elect,
    "mma": mma.mma,
}

__all__ = ["INSTRUCTIONS", "Run", "Semantic"]
