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
    Run,
    decode_error,
    operands,
    read_bits,
    read_pred,
    read_typed_bits,
    write_bits,
    write_pred,
)
from cutile_py.sim.semantics.floating import load_values

MOV_TYPES = (INT_TYPES - {"b8", "u8", "s8"}) | {"f16", "bf16", "f32", "f64", "pred"}


def mov(instr: Instruction) -> Run:
    m = Mods(instr)
    t = m.type(MOV_TYPES)
    m.finish()
    d, a = operands(instr, 2)
    if t == "pred":

        def run_pred(ctx: ExecContext) -> None:
            write_pred(ctx, d, read_pred(ctx, a))

        return run_pred
    w = WIDTH[t]
    if isinstance(a, Vec):
        # Pack: element i goes to bits [i*k, (i+1)*k) (mov.b32 %r, {lo, hi}).
        k = _element_width(instr, w, len(a.items))
        if any(isinstance(item, Sink) for item in a.items):
            m.fail("`_` cannot be a source element")
        parts = a.items

        def run_pack(ctx: ExecContext) -> None:
            out = np.zeros(ctx.n, dtype=np.uint64)
            for i, item in enumerate(parts):
                out |= read_bits(ctx, item, k).astype(np.uint64) << np.uint64(i * k)
            write_bits(ctx, d, w, out.astype(UINT[w]))

        return run_pack
    if isinstance(d, Vec):
        # Unpack: element i receives bits [i*k, (i+1)*k); `_` discards.
        k = _element_width(instr, w, len(d.items))
        dests = d.items

        def run_unpack(ctx: ExecContext) -> None:
            src = read_bits(ctx, a, w).astype(np.uint64)
            for i, item in enumerate(dests):
                if not isinstance(item, Sink):
                    part = (src >> np.uint64(i * k)) & np.uint64((1 << k) - 1)
                    write_bits(ctx, item, k, part.astype(UINT[k]))

        return run_unpack

    whole = w // 8  # bytes: a register of this size is moved as it is

    def run(ctx: ExecContext) -> None:
        if not ctx.move(d, a, whole):
            write_bits(ctx, d, w, read_typed_bits(ctx, a, t))

    return run


def _element_width(instr: Instruction, width: int, count: int) -> int:
    if count not in (2, 4) or width % count or width // count not in UINT:
        decode_error(instr, f"cannot split .b{width} into {count} elements")
    return width // count


SEL_TYPES = (INT_TYPES - {"b8", "u8", "s8"}) | {"f32", "f64"}


def selp(instr: Instruction) -> Run:
    """selp.type d, a, b, c: d = c ? a : b (the bits, unchanged)."""
    m = Mods(instr)
    t = m.type(SEL_TYPES)
    m.finish()
    d, a_op, b_op, c_op = operands(instr, 4)
    w = WIDTH[t]

    def run(ctx: ExecContext) -> None:
        c = read_pred(ctx, c_op)
        a, b = read_typed_bits(ctx, a_op, t), read_typed_bits(ctx, b_op, t)
        write_bits(ctx, d, w, np.where(c, a, b))

    return run


def slct(instr: Instruction) -> Run:
    """slct.dtype.{s32,f32} d, a, b, c: d = (c >= 0) ? a : b; NaN c selects b, -0.0 >= 0."""
    m = Mods(instr)
    dtype, ctype = m.types(SEL_TYPES, 2)
    ftz = ctype == "f32" and m.flag("ftz")
    m.finish()
    if ctype not in ("s32", "f32"):
        m.fail(f"the selector type must be .s32 or .f32, not .{ctype}")
    d, a_op, b_op, c_op = operands(instr, 4)

    def run(ctx: ExecContext) -> None:
        if ctype == "f32":
            cond = load_values(ctx, c_op, "f32", ftz)[0] >= 0  # subnormals flushed → a selected
        else:
            cond = np.asarray(ctx.read(c_op, "s32")) >= 0
        a, b = read_typed_bits(ctx, a_op, dtype), read_typed_bits(ctx, b_op, dtype)
        write_bits(ctx, d, WIDTH[dtype], np.where(cond, a, b))

    return run
