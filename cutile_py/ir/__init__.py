"""Tile IR: typed, shaped values and the ops over them; imports nothing else of cutile_py."""

from cutile_py.ir.builder import Builder, IRTypeError
from cutile_py.ir.dtypes import DType, bf16, bool_, f16, f32, i32, i64
from cutile_py.ir.ops import Kernel, Param, ScalarParam, TensorParam, Value
from cutile_py.ir.printer import print_kernel
from cutile_py.ir.types import TileType
from cutile_py.ir.verify import VerifyError, verify

__all__ = [
    "Builder",
    "DType",
    "IRTypeError",
    "Kernel",
    "Param",
    "ScalarParam",
    "TensorParam",
    "TileType",
    "Value",
    "VerifyError",
    "bf16",
    "bool_",
    "f16",
    "f32",
    "i32",
    "i64",
    "print_kernel",
    "verify",
]
