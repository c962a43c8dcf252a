"""Data movement and selection: mov (PTX ISA §9.7.9.3-4; registers, immediates, special
registers and addresses, all through `ctx.read`, and the vector forms that pack `{a, b, ...}`
into one register or unpack it), selp and slct (§9.7.6.3-4).
"""

from __future__ import annotations

import numpy as np

from cutile_py.ptx.ast import Instruction, Sink, Vec
from cutile_py.sim.context import ExecContext
from cutile_py.sim.semantics._common import (
    INT_TYPES,
    UINT,
    WIDTH,
    Mods,
    operands,
    read_bits,
    read_pred,
    read_typed_bits,
    write_bits,
    write_pred,
)
from cutile_py.sim.semantics.floating import load_values

MOV_TYPES = (INT_TYPES - {"b8", "u8", "s8"}) | {"f16", "bf16", "f32", "f64", "pred"}


def mov(instr: Instruction, ctx: ExecContext) -> None:
    m = Mods(instr, ctx)
    t = m.type(MOV_TYPES)
    m.finish()
    d, a = operands(instr, ctx, 2)
    if t == "pred":
        write_pred(ctx, d, read_pred(ctx, a))
        return
    w = WIDTH[t]
    if isinstance(a, Vec):
        # Pack: element i goes to bits [i*k, (i+1)*k) (mov.b32 %r, {lo, hi}).
        k = _element_width(ctx, w, len(a.items))
        out = np.zeros(ctx.n, dtype=np.uint64)
        for i, item in enumerate(a.items):
            if isinstance(item, Sink):
                ctx.fail("mov: `_` cannot be a source element")
            out |= read_bits(ctx, item, k).astype(np.uint64) << np.uint64(i * k)
        write_bits(ctx, d, w, out.astype(UINT[w]))
        return
    if isinstance(d, Vec):
        # Unpack: element i receives bits [i*k, (i+1)*k); `_` discards.
        k = _element_width(ctx, w, len(d.items))
        src = read_bits(ctx, a, w).astype(np.uint64)
        for i, item in enumerate(d.items):
            if not isinstance(item, Sink):
                part = (src >> np.uint64(i * k)) & np.uint64((1 << k) - 1)
                write_bits(ctx, item, k, part.astype(UINT[k]))
        return
    write_bits(ctx, d, w, read_typed_bits(ctx, a, t))


def _element_width(ctx: ExecContext, width: int, count: int) -> int:
    if count not in (2, 4) or width % count or width // count not in UINT:
        ctx.fail(f"mov: cannot split .b{width} into {count} elements")
    return width // count


SEL_TYPES = (INT_TYPES - {"b8", "u8", "s8"}) | {"f32", "f64"}


def selp(instr: Instruction, ctx: ExecContext) -> None:
    """selp.type d, a, b, c: d = c ? a : b (the bits, unchanged)."""
    m = Mods(instr, ctx)
    t = m.type(SEL_TYPES)
    m.finish()
    d, a_op, b_op, c_op = operands(instr, ctx, 4)
    w = WIDTH[t]
    c = read_pred(ctx, c_op)
    a, b = read_typed_bits(ctx, a_op, t), read_typed_bits(ctx, b_op, t)
    write_bits(ctx, d, w, np.where(c, a, b))


def slct(instr: Instruction, ctx: ExecContext) -> None:
    """slct.dtype.{s32,f32} d, a, b, c: d = (c >= 0) ? a : b; NaN c selects b, -0.0 >= 0."""
    m = Mods(instr, ctx)
    dtype, ctype = m.types(SEL_TYPES, 2)
    ftz = ctype == "f32" and m.flag("ftz")
    m.finish()
    if ctype not in ("s32", "f32"):
        m.fail(f"the selector type must be .s32 or .f32, not .{ctype}")
    d, a_op, b_op, c_op = operands(instr, ctx, 4)
    if ctype == "f32":
        cond = load_values(ctx, c_op, "f32", ftz)[0] >= 0  # subnormals flushed → a selected
    else:
        cond = np.asarray(ctx.read(c_op, "s32")) >= 0
    a, b = read_typed_bits(ctx, a_op, dtype), read_typed_bits(ctx, b_op, dtype)
    write_bits(ctx, d, WIDTH[dtype], np.where(cond, a, b))
