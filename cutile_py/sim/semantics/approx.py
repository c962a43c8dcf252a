"""The `.approx` floating-point functions: rcp, sqrt, rsqrt, ex2, lg2, sin, cos, tanh.

Each is modelled as the correctly rounded (round-to-nearest) value of the exact function, computed
in f64. The hardware differs within the error bounds the PTX ISA states (e.g. ex2.approx.f32:
2**-22.5 absolute for the fraction, tanh.approx.f32: about 2**-11 relative), so tests of code that
uses them must compare with a tolerance. Special inputs follow the ISA's tables (§9.7.3.13-22):
subnormal inputs of rcp/sqrt/rsqrt/lg2/ex2/sin/cos.approx.f32 act as zeros of their sign (the
tables give ±Inf, ±0, -Inf, 1.0 …); tanh passes subnormals through; `.ftz` also flushes
subnormal results.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cutile_py.ptx.ast import Instruction, Operand
from cutile_py.sim.context import ExecContext
from cutile_py.sim.semantics import floating
from cutile_py.sim.semantics._common import (
    ROUND_FLOAT,
    Mods,
    Run,
    operands,
    read_typed_bits,
    write_bits,
)
from cutile_py.sim.semantics.f64ops import F64_NAN
from cutile_py.sim.semantics.fpcore import F64, decode, flush_bits, round_f64

_Fn = Callable[[np.ndarray], np.ndarray]

#: The exact functions, evaluated in f64 (NumPy's libm is accurate to about 1 f64 ulp).
FUNCS: dict[str, _Fn] = {
    "rcp": lambda x: 1.0 / x,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "ex2": np.exp2,
    "lg2": np.log2,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
}

#: Types each `.approx` function accepts besides .f32 (§9.7.3, §9.7.4.9-10, PTX 7.8 bf16 forms).
EXTRA_TYPES: dict[str, frozenset[str]] = {
    "rcp": frozenset({"f64"}),
    "rsqrt": frozenset({"f64"}),
    "ex2": frozenset({"f16", "f16x2", "bf16", "bf16x2"}),
    "tanh": frozenset({"f16", "f16x2", "bf16", "bf16x2"}),
}


def approx_or_rounded(instr: Instruction) -> Run:
    """rcp and sqrt: `.approx` here, `.rn/.rz/.rm/.rp` in `floating` (correctly rounded)."""
    rnd = next((m for m in instr.modifiers if m in ROUND_FLOAT), None)
    if rnd is not None:
        return floating.rcp_sqrt_rounded(instr, instr.opcode, rnd)
    return approx(instr)


def approx(instr: Instruction) -> Run:
    """rcp/sqrt/rsqrt/ex2/lg2/sin/cos/tanh `.approx` on .f32, .f64 (rcp, rsqrt), f16/bf16."""
    name = instr.opcode
    m = Mods(instr)
    if not m.flag("approx"):
        m.fail("needs .approx (or a rounding modifier for rcp/sqrt)")
    ftype = m.type(frozenset({"f32"}) | EXTRA_TYPES.get(name, frozenset()))
    ftz = m.flag("ftz")
    m.finish()
    d, a_op = operands(instr, 2)
    if ftype == "f64":
        if name == "rcp" and not ftz:
            m.fail("rcp.approx.f64 requires .ftz (rcp.approx.ftz.f64)")

        def run_f64(ctx: ExecContext) -> None:
            _approx_f64(ctx, name, ftz, d, a_op)

        return run_f64
    fmt = floating.ELEMS[ftype][0]
    if ftz and (ftype not in ("f32", "bf16", "bf16x2") or name == "tanh"):
        m.fail(f".ftz is not defined for {name}.approx.{ftype}")
    if ftype in ("bf16", "bf16x2") and name == "ex2" and not ftz:
        m.fail("ex2.approx on bf16 requires .ftz")

    def run(ctx: ExecContext) -> None:
        bits = floating.load(ctx, a_op, ftype)
        if name != "tanh" and ftype == "f32":
            bits = flush_bits(bits, fmt)  # the ISA tables: subnormal inputs act as signed zeros
        elif ftz:
            bits = flush_bits(bits, fmt)
        x = decode(bits, fmt)
        with np.errstate(all="ignore"):
            y = FUNCS[name](x)
            if name == "lg2":
                y = np.where(x == 0, -np.inf, y)  # lg2(-0.0) = -Inf per the table
        out = round_f64(y, fmt, "rn")
        floating.store(ctx, d, ftype, flush_bits(out, fmt) if ftz else out)

    return run


def _approx_f64(ctx: ExecContext, name: str, ftz: bool, d: Operand, a_op: Operand) -> None:
    """rsqrt.approx.f64, and the `.ftz.f64` forms that work on the upper 32 bits only."""
    bits = read_typed_bits(ctx, a_op, "f64")
    if ftz:
        # §9.7.3.14/17: use a[63:32] only, return 32 result bits and zero the low word;
        # subnormals flush; NaN inputs give the canonical 0x7fffffff00000000.
        hi = flush_bits(bits & np.uint64(0xFFFFFFFF00000000), F64)
        x = decode(hi, F64)
        with np.errstate(all="ignore"):
            y = FUNCS[name](x)
        yb = flush_bits(np.ascontiguousarray(y).view(np.uint64), F64) & np.uint64(
            0xFFFFFFFF00000000
        )
        yb = np.where(np.isnan(x), np.uint64(0x7FFFFFFF00000000), yb)
        write_bits(ctx, d, 64, yb)
        return
    x = decode(bits, F64)
    with np.errstate(all="ignore"):
        y = FUNCS[name](x)
    y = np.where(np.isnan(y), F64_NAN.view(np.float64), y)
    ctx.write(d, "f64", y)
