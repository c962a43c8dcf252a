"""Comparison (PTX ISA §9.7.6.1-2, half precision §9.7.7): setp and set.

Float comparisons: eq/ne/lt/le/gt/ge are ordered (false on NaN), equ/neu/ltu/leu/gtu/geu are
unordered (true on NaN), num/nan test for NaN; -0.0 == +0.0. Integer comparisons use the type's
signedness; lo/ls/hi/hs are the unsigned spellings; bit types allow eq/ne only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cutile_py.ptx.ast import Instruction, Operand, Sink
from cutile_py.sim.context import ExecContext
from cutile_py.sim.semantics._common import (
    INT_TYPES,
    WIDTH,
    Mods,
    Run,
    operands,
    read_pred,
    split_dest_pair,
    write_bits,
    write_pred,
)
from cutile_py.sim.semantics.floating import ELEMS, load_values
from cutile_py.sim.semantics.fpcore import F16, F32, round_f64

ORDERED = ("eq", "ne", "lt", "le", "gt", "ge")
UNORDERED = ("equ", "neu", "ltu", "leu", "gtu", "geu")
UNSIGNED_ALIASES = {"lo": "lt", "ls": "le", "hi": "gt", "hs": "ge"}
CMP_OPS = (*ORDERED, *UNORDERED, *UNSIGNED_ALIASES, "num", "nan")
BOOL_OPS = ("and", "or", "xor")
CMP_TYPES = (INT_TYPES - {"b8", "u8", "s8"}) | set(ELEMS)


ORDERED_FN: dict[str, np.ufunc] = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


def _ordered(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(ORDERED_FN[op](a, b))


Compare = Callable[[ExecContext, Operand, Operand], np.ndarray]


def comparison(m: Mods, op: str, t: str, ftz: bool) -> Compare:
    """`a op b` for every lane (shape (elements, lanes): 2 elements for the x2 types)."""
    if t in ELEMS:
        if op in UNSIGNED_ALIASES:
            m.fail(f".{op} is an integer comparison")

        def floats(ctx: ExecContext, a_op: Operand, b_op: Operand) -> np.ndarray:
            a, b = (load_values(ctx, x, t, ftz) for x in (a_op, b_op))
            unordered = np.isnan(a) | np.isnan(b)
            if op == "num":
                return np.asarray(~unordered)
            if op == "nan":
                return np.asarray(unordered)
            if op in UNORDERED:
                return np.asarray(unordered | _ordered(op[:-1], a, b))
            return np.asarray(~unordered & _ordered(op, a, b))

        return floats
    if op in UNORDERED or op in ("num", "nan"):
        m.fail(f".{op} is a floating-point comparison")
    if t.startswith("b") and op not in ("eq", "ne"):
        m.fail(f"bit-size types compare with eq/ne only, not .{op}")
    if op in UNSIGNED_ALIASES and t.startswith("s"):
        m.fail(f".{op} is an unsigned comparison")
    fn = ORDERED_FN[UNSIGNED_ALIASES.get(op, op)]

    def ints(ctx: ExecContext, a_op: Operand, b_op: Operand) -> np.ndarray:
        return np.asarray(fn(ctx.read(a_op, t), ctx.read(b_op, t)))[None, :]

    return ints


def _combine(t: np.ndarray, boolop: str | None, c: np.ndarray | None) -> np.ndarray:
    if boolop is None or c is None:
        return t
    if boolop == "and":
        return np.asarray(t & c)
    if boolop == "or":
        return np.asarray(t | c)
    return np.asarray(t ^ c)


def _parse(
    instr: Instruction, dtypes: frozenset[str] | None
) -> tuple[Mods, str, str | None, str, str | None, bool]:
    m = Mods(instr)
    op = m.one_of(CMP_OPS, "comparison", required=True)
    boolop = m.one_of(BOOL_OPS, "boolean")
    if dtypes is None:
        dtype, t = None, m.type(CMP_TYPES)
    else:
        dtype, t = m.types(dtypes | CMP_TYPES, 2)
    ftz = m.flag("ftz")
    if ftz and t not in ("f32", "f16", "f16x2"):
        m.fail(".ftz applies to .f32 and .f16 comparisons only")
    m.finish()
    assert op is not None
    return m, op, boolop, t, dtype, ftz


def setp(instr: Instruction) -> Run:
    """setp.CmpOp{.BoolOp}{.ftz}.type p[|q], a, b{, {!}c}: p = t BoolOp c, q = !t BoolOp c;
    for .f16x2/.bf16x2, p is the low half's result and q the high half's."""
    m, op, boolop, t, _, ftz = _parse(instr, None)
    p, q, srcs = split_dest_pair(instr, 3 if boolop else 2)
    cmp = comparison(m, op, t, ftz)
    a_op, b_op = srcs[0], srcs[1]
    if boolop is None and (q is None or isinstance(q, Sink)):

        def run_p(ctx: ExecContext) -> None:
            ctx.write(p, "pred", cmp(ctx, a_op, b_op)[0])

        return run_p

    def run(ctx: ExecContext) -> None:
        c = read_pred(ctx, srcs[2]) if boolop else None
        r = cmp(ctx, a_op, b_op)
        if r.shape[0] == 2:
            write_pred(ctx, p, _combine(r[0], boolop, c))
            write_pred(ctx, q, _combine(r[1], boolop, c))
            return
        write_pred(ctx, p, _combine(r[0], boolop, c))
        write_pred(ctx, q, _combine(~r[0], boolop, c))

    return run


SET_DTYPES = frozenset({"u32", "s32", "f32", "u16", "s16", "f16", "f16x2"})


def set_(instr: Instruction) -> Run:
    """set.CmpOp{.BoolOp}{.ftz}.dtype.stype: all ones (integers) or 1.0 (floats) when true."""
    m, op, boolop, t, dtype, ftz = _parse(instr, SET_DTYPES)
    assert dtype is not None
    ops = operands(instr, 4 if boolop else 3)
    cmp = comparison(m, op, t, ftz)
    packed = dtype == "f16x2" or t in ("f16x2", "bf16x2")
    if packed and t not in ("f16x2", "bf16x2"):
        m.fail("packed results need an .f16x2/.bf16x2 source")

    def run(ctx: ExecContext) -> None:
        c = read_pred(ctx, ops[3]) if boolop else None
        r = _combine(cmp(ctx, ops[1], ops[2]), boolop, c)
        if packed:
            one = 0x3C00 if dtype == "f16x2" else 0xFFFF
            halves = np.where(r, np.uint32(one), np.uint32(0))
            write_bits(ctx, ops[0], 32, halves[0] | (halves[1] << np.uint32(16)))
            return
        if dtype in ("f32", "f16"):
            fmt = F32 if dtype == "f32" else F16
            write_bits(ctx, ops[0], fmt.nbits, round_f64(r[0].astype(np.float64), fmt, "rn"))
            return
        w = WIDTH[dtype]
        write_bits(ctx, ops[0], w, np.where(r[0], np.uint64((1 << w) - 1), np.uint64(0)))

    return run
