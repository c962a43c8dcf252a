"""Instruction selection tables: PTX register classes, type suffixes and opcodes per (op, dtype)."""

from __future__ import annotations

import numpy as np

from cutile_py.ir.dtypes import DType, bf16, bool_, f16, f32, i32, i64, round_to_bf16

#: The register class that holds a value of each dtype.
REG_CLASS: dict[type[DType], str] = {
    f32: "f32",
    f16: "b16",
    bf16: "b16",
    i32: "b32",
    i64: "b64",
    bool_: "pred",
}
#: `mov` suffix per register class.
MOV: dict[str, str] = {"f32": "f32", "b16": "b16", "b32": "b32", "b64": "b64", "pred": "pred"}
#: Integer type suffix (signed arithmetic) per integer dtype.
INT_SUFFIX: dict[type[DType], str] = {i32: "s32", i64: "s64"}
BITS_SUFFIX: dict[type[DType], str] = {i32: "b32", i64: "b64"}

#: f32 arithmetic; `.rn` stops ptxas from contracting mul+add into fma (NumPy rounds each op).
F32_BINARY: dict[str, str] = {
    "add": "add.rn.f32",
    "sub": "sub.rn.f32",
    "mul": "mul.rn.f32",
    "max": "max.NaN.f32",
    "min": "min.NaN.f32",
}
INT_BINARY: dict[str, str] = {
    "add": "add.{s}",
    "sub": "sub.{s}",
    "mul": "mul.lo.{s}",
    "max": "max.{s}",
    "min": "min.{s}",
    "and": "and.{b}",
    "or": "or.{b}",
    "xor": "xor.{b}",
}
PRED_BINARY: dict[str, str] = {
    "and": "and.pred",
    "or": "or.pred",
    "xor": "xor.pred",
    "max": "or.pred",
    "min": "and.pred",
}
#: setp comparison per IR kind; `ne` is unordered so that NaN != x holds, as in NumPy.
F32_COMPARE: dict[str, str] = {
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "eq": "eq",
    "ne": "neu",
}
INT_COMPARE: dict[str, str] = {
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "eq": "eq",
    "ne": "ne",
}
#: Bits of 1.0 for the 16-bit float types (bool → float casts).
ONE_BITS: dict[type[DType], int] = {f16: 0x3C00, bf16: 0x3F80}
#: cvt suffix naming each float dtype.
FLOAT_NAME: dict[type[DType], str] = {f32: "f32", f16: "f16", bf16: "bf16"}


def bits16(x: float, dt: type[DType]) -> int:
    """The 16 bits of `x` rounded to f16 or bf16."""
    with np.errstate(over="ignore"):
        if dt is f16:
            return int(np.array([x], dtype=np.float16).view(np.uint16)[0])
        f = round_to_bf16(np.array([x], dtype=np.float32))
    return int(f.view(np.uint32)[0] >> 16)
