"""Logic, shift and byte-permute instructions (PTX ISA §9.7.7, prmt §9.7.9.7):
and, or, xor, not, cnot, lop3, shl, shr, shf, prmt.
"""

from __future__ import annotations

import numpy as np

from cutile_py.ptx.ast import Imm, Instruction
from cutile_py.sim.context import ExecContext
from cutile_py.sim.semantics._common import (
    SINT,
    UINT,
    WIDTH,
    Mods,
    Run,
    imm_value,
    operands,
    read_bits,
    read_pred,
    write_bits,
    write_pred,
)
from cutile_py.sim.semantics.integer import LOW, read_u64, signed, write_u64

BITS = frozenset({"b16", "b32", "b64"})


def bitwise(instr: Instruction) -> Run:
    """and/or/xor/not on .pred, .b16, .b32, .b64."""
    op = instr.opcode
    m = Mods(instr)
    t = m.type(BITS | {"pred"})
    m.finish()
    nsrc = 1 if op == "not" else 2
    d, *srcs = operands(instr, nsrc + 1)

    def run(ctx: ExecContext) -> None:
        if t == "pred":
            vals = [read_pred(ctx, s) for s in srcs]
            write_pred(ctx, d, _apply(op, vals))
            return
        w = WIDTH[t]
        write_bits(ctx, d, w, _apply(op, [read_bits(ctx, s, w) for s in srcs]))

    return run


def _apply(op: str, v: list[np.ndarray]) -> np.ndarray:
    if op == "and":
        return np.asarray(v[0] & v[1])
    if op == "or":
        return np.asarray(v[0] | v[1])
    if op == "xor":
        return np.asarray(v[0] ^ v[1])
    return ~v[0]


def cnot(instr: Instruction) -> Run:
    """cnot: d = (a == 0) ? 1 : 0."""
    m = Mods(instr)
    t = m.type(BITS)
    m.finish()
    d, a_op = operands(instr, 2)
    w = WIDTH[t]

    def run(ctx: ExecContext) -> None:
        write_bits(ctx, d, w, (read_bits(ctx, a_op, w) == 0).astype(UINT[w]))

    return run


def lop3(instr: Instruction) -> Run:
    """lop3.b32 d, a, b, c, immLut: bit i of immLut is F at (a, b, c) = (i>>2&1, i>>1&1, i&1)."""
    m = Mods(instr)
    m.type({"b32"})
    m.finish()
    d, a_op, b_op, c_op, lut_op = operands(instr, 5)
    lut = imm_value(instr, lut_op, "lop3's immLut")

    def run(ctx: ExecContext) -> None:
        a, b, c = (read_bits(ctx, op, 32) for op in (a_op, b_op, c_op))
        out = np.zeros_like(a)
        for i in range(8):
            if lut >> i & 1:
                term = (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
                out |= term
        write_bits(ctx, d, 32, out)

    return run


def shift(instr: Instruction) -> Run:
    """shl/shr: the amount is an unsigned 32-bit value, clamped to the width; shr.s fills with
    the sign bit, shr.u/.b with zeros (§9.7.7.8-9)."""
    m = Mods(instr)
    left = instr.opcode == "shl"
    t = m.type(BITS if left else BITS | {f"{k}{w}" for k in "us" for w in (16, 32, 64)})
    m.finish()
    d, a_op, b_op = operands(instr, 3)
    w = WIDTH[t]
    if isinstance(b_op, Imm) and isinstance(b_op.value, int) and 0 <= b_op.value < w:
        # A constant amount below the width: shift in the type's own dtype (C semantics).
        amount = b_op.value
        own = (SINT if t.startswith("s") else UINT)[w]

        def run_imm(ctx: ExecContext) -> None:
            a = ctx.read(a_op, t).view(own)
            ctx.write(d, t, a << own(amount) if left else a >> own(amount))

        return run_imm

    def run(ctx: ExecContext) -> None:
        a = read_u64(ctx, a_op, t) & LOW[w]
        n = np.minimum(read_u64(ctx, b_op, "u32"), np.uint64(w))
        if left:
            r = np.where(n >= w, np.uint64(0), (a << np.minimum(n, np.uint64(63))) & LOW[w])
        elif t.startswith("s"):
            sa = signed(a, w)
            r = (sa >> np.minimum(n, np.uint64(w - 1)).astype(np.int64)).astype(np.uint64)
        else:
            r = np.where(n >= w, np.uint64(0), a >> np.minimum(n, np.uint64(63)))
        write_u64(ctx, d, t, r)

    return run


def shf(instr: Instruction) -> Run:
    """shf.{l,r}.{clamp,wrap}.b32 d, a, b, c: funnel shift of {b, a} (§9.7.7.7)."""
    m = Mods(instr)
    direction = m.one_of(("l", "r"), "direction", required=True)
    mode = m.one_of(("clamp", "wrap"), "mode", required=True)
    m.type({"b32"})
    m.finish()
    d, a_op, b_op, c_op = operands(instr, 4)

    def run(ctx: ExecContext) -> None:
        a, b = read_u64(ctx, a_op, "b32"), read_u64(ctx, b_op, "b32")
        c = read_u64(ctx, c_op, "u32")
        n = np.minimum(c, np.uint64(32)) if mode == "clamp" else c & np.uint64(31)
        both = (b << np.uint64(32)) | a
        shifted = (both << n) >> np.uint64(32) if direction == "l" else both >> n
        write_bits(ctx, d, 32, shifted & LOW[32])

    return run


#: Byte selectors of the prmt modes, as [d.b0, d.b1, d.b2, d.b3] for c[1:0] = 0..3.
PRMT_MODES: dict[str, list[list[int]]] = {
    "f4e": [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]],
    "b4e": [[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]],
    "rc8": [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]],
    "ecl": [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]],
    "ecr": [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]],
    "rc16": [[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]],
}


def prmt(instr: Instruction) -> Run:
    """prmt.b32{.mode} d, a, b, c: bytes of {b, a} (a = bytes 0..3); the generic form's selector
    msb replicates the selected byte's sign."""
    m = Mods(instr)
    m.type({"b32"})
    mode = m.one_of(tuple(PRMT_MODES), "mode")
    m.finish()
    d, a_op, b_op, c_op = operands(instr, 4)

    def run(ctx: ExecContext) -> None:
        a, b = read_u64(ctx, a_op, "b32"), read_u64(ctx, b_op, "b32")
        c = read_u64(ctx, c_op, "b32")
        src = (b << np.uint64(32)) | a
        out = np.zeros_like(a)
        for i in range(4):
            if mode is None:
                ctl = (c >> np.uint64(4 * i)) & np.uint64(0xF)
                sel = ctl & np.uint64(7)
            else:
                table = np.array([row[i] for row in PRMT_MODES[mode]], dtype=np.uint64)
                sel = table[(c & np.uint64(3)).astype(np.int64)]
                ctl = sel
            byte = (src >> (sel * np.uint64(8))) & np.uint64(0xFF)
            if mode is None:
                rep = (ctl & np.uint64(8)) != 0
                byte = np.where(
                    rep, np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0)), byte
                )
            out |= byte << np.uint64(8 * i)
        write_bits(ctx, d, 32, out)

    return run
