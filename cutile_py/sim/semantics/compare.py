"""Comparison (PTX ISA §9.7.6.1-2, half precision §9.7.7): setp and set.

Float comparisons: eq/ne/lt/le/gt/ge are ordered (false on NaN), equ/neu/ltu/leu/gtu/geu are
unordered (true on NaN), num/nan test for NaN; -0.0 == +0.0. Integer comparisons use the type's
signedness; lo/ls/hi/hs are the unsigned spellings; bit types allow eq/ne only.
"""

from __future__ import annotations

import numpy as np

from cutile_py.ptx.ast import Instruction, Operand
from cutile_py.sim.context import ExecContext
from cutile_py.sim.semantics._common import (
    INT_TYPES,
    WIDTH,
    Mods,
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


def _ordered(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    fn = {
        "eq": np.equal,
        "ne": np.not_equal,
        "lt": np.less,
        "le": np.less_equal,
        "gt": np.greater,
        "ge": np.greater_equal,
    }[op]
    return np.asarray(fn(a, b))


def compare(
    m: Mods, ctx: ExecContext, op: str, t: str, a_op: Operand, b_op: Operand, ftz: bool
) -> np.ndarray:
    """`a op b` for every lane (shape (elements, lanes): 2 elements for the x2 types)."""
    if t in ELEMS:
        if op in UNSIGNED_ALIASES:
            m.fail(f".{op} is an integer comparison")
        a, b = (load_values(ctx, x, t, ftz) for x in (a_op, b_op))
        unordered = np.isnan(a) | np.isnan(b)
        if op == "num":
            return np.asarray(~unordered)
        if op == "nan":
            return np.asarray(unordered)
        if op in UNORDERED:
            return np.asarray(unordered | _ordered(op[:-1], a, b))
        return np.asarray(~unordered & _ordered(op, a, b))
    if op in UNORDERED or op in ("num", "nan"):
        m.fail(f".{op} is a floating-point comparison")
    if t.startswith("b") and op not in ("eq", "ne"):
        m.fail(f"bit-size types compare with eq/ne only, not .{op}")
    if op in UNSIGNED_ALIASES:
        if t.startswith("s"):
            m.fail(f".{op} is an unsigned comparison")
        op = UNSIGNED_ALIASES[op]
    a, b = (np.asarray(ctx.read(x, t)) for x in (a_op, b_op))
    return _ordered(op, a, b)[None, :]


def _combine(t: np.ndarray, boolop: str | None, c: np.ndarray | None) -> np.ndarray:
    if boolop is None or c is None:
        return t
    if boolop == "and":
        return np.asarray(t & c)
    if boolop == "or":
        return np.asarray(t | c)
    return np.asarray(t ^ c)


def _parse(
    instr: Instruction, ctx: ExecContext, dtypes: frozenset[str] | None
) -> tuple[Mods, str, str | None, str, str | None, bool]:
    m = Mods(instr, ctx)
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


def setp(instr: Instruction, ctx: ExecContext) -> None:
    """setp.CmpOp{.BoolOp}{.ftz}.type p[|q], a, b{, {!}c}: p = t BoolOp c, q = !t BoolOp c;
    for .f16x2/.bf16x2, p is the low half's result and q the high half's."""
    m, op, boolop, t, _, ftz = _parse(instr, ctx, None)
    p, q, srcs = split_dest_pair(instr, ctx, 3 if boolop else 2)
    c = read_pred(ctx, srcs[2]) if boolop else None
    r = compare(m, ctx, op, t, srcs[0], srcs[1], ftz)
    if r.shape[0] == 2:
        write_pred(ctx, p, _combine(r[0], boolop, c))
        write_pred(ctx, q, _combine(r[1], boolop, c))
        return
    write_pred(ctx, p, _combine(r[0], boolop, c))
    write_pred(ctx, q, _combine(~r[0], boolop, c))


SET_DTYPES = frozenset({"u32", "s32", "f32", "u16", "s16", "f16", "f16x2"})


def set_(instr: Instruction, ctx: ExecContext) -> None:
    """set.CmpOp{.BoolOp}{.ftz}.dtype.stype: all ones (integers) or 1.0 (floats) when true."""
    m, op, boolop, t, dtype, ftz = _parse(instr, ctx, SET_DTYPES)
    assert dtype is not None
    ops = operands(instr, ctx, 4 if boolop else 3)
    c = read_pred(ctx, ops[3]) if boolop else None
    r = _combine(compare(m, ctx, op, t, ops[1], ops[2], ftz), boolop, c)
    if dtype == "f16x2" or t in ("f16x2", "bf16x2"):
        if r.shape[0] != 2:
            m.fail("packed results need an .f16x2/.bf16x2 source")
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
