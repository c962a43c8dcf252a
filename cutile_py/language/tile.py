"""`Tile`: the value of a tile expression. In the interpreter it holds a NumPy array; for
mypy it types tile arithmetic inside kernel bodies. Every operator applies `ir.reference`."""

from __future__ import annotations

from typing import Union

import numpy as np

from cutile_py.ir import reference
from cutile_py.ir.dtypes import DType, bool_, f32, i32, promote, promote_weak, round_to

Operand = Union["Tile", int, float, bool]


class Tile:
    """An immutable tile of `dtype` values (compute form: f16 and bf16 held in float32)."""

    __slots__ = ("_dtype", "array")

    def __init__(self, array: np.ndarray, dtype: type[DType]) -> None:
        self.array = array
        self._dtype = dtype

    @property
    def dtype(self) -> type[DType]:
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def astype(self, dtype: type[DType]) -> Tile:
        """Convert element-wise (round to nearest even; float → int truncates toward zero)."""
        return Tile(reference.cast(self.array, dtype), dtype)

    def __repr__(self) -> str:
        return f"Tile[{self.dtype.name}, {self.shape}](\n{self.array})"

    # Arithmetic: NumPy promotion with Python scalars weak (NEP 50), no f64.
    def __add__(self, other: Operand) -> Tile:
        return binary("add", self, other)

    def __radd__(self, other: Operand) -> Tile:
        return binary("add", other, self)

    def __sub__(self, other: Operand) -> Tile:
        return binary("sub", self, other)

    def __rsub__(self, other: Operand) -> Tile:
        return binary("sub", other, self)

    def __mul__(self, other: Operand) -> Tile:
        return binary("mul", self, other)

    def __rmul__(self, other: Operand) -> Tile:
        return binary("mul", other, self)

    def __truediv__(self, other: Operand) -> Tile:
        return binary("div", self, other)

    def __rtruediv__(self, other: Operand) -> Tile:
        return binary("div", other, self)

    def __floordiv__(self, other: Operand) -> Tile:
        return binary("floordiv", self, other)

    def __rfloordiv__(self, other: Operand) -> Tile:
        return binary("floordiv", other, self)

    def __mod__(self, other: Operand) -> Tile:
        return binary("mod", self, other)

    def __rmod__(self, other: Operand) -> Tile:
        return binary("mod", other, self)

    def __and__(self, other: Operand) -> Tile:
        return binary("and", self, other)

    def __rand__(self, other: Operand) -> Tile:
        return binary("and", other, self)

    def __or__(self, other: Operand) -> Tile:
        return binary("or", self, other)

    def __ror__(self, other: Operand) -> Tile:
        return binary("or", other, self)

    def __xor__(self, other: Operand) -> Tile:
        return binary("xor", self, other)

    def __rxor__(self, other: Operand) -> Tile:
        return binary("xor", other, self)

    def __neg__(self) -> Tile:
        return unary("neg", self)

    def __pos__(self) -> Tile:
        return self

    def __invert__(self) -> Tile:
        return unary("not", self)

    def __abs__(self) -> Tile:
        return unary("abs", self)

    def __lt__(self, other: Operand) -> Tile:
        return compare("lt", self, other)

    def __le__(self, other: Operand) -> Tile:
        return compare("le", self, other)

    def __gt__(self, other: Operand) -> Tile:
        return compare("gt", self, other)

    def __ge__(self, other: Operand) -> Tile:
        return compare("ge", self, other)

    def __eq__(self, other: Operand) -> Tile:  # type: ignore[override]
        return compare("eq", self, other)

    def __ne__(self, other: Operand) -> Tile:  # type: ignore[override]
        return compare("ne", self, other)

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise TypeError("a tile has no truth value; use ct.where() or a scalar condition")


def scalar_dtype(value: object) -> type[DType]:
    """The dtype a Python scalar takes when it stands alone (int → i32, float → f32)."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return i32
    if isinstance(value, float):
        return f32
    raise TypeError(f"expected a tile or a Python number, got {type(value).__name__}")


def result_dtype(a: Operand, b: Operand) -> type[DType]:
    if isinstance(a, Tile) and isinstance(b, Tile):
        return promote(a.dtype, b.dtype)
    if isinstance(a, Tile):
        return promote_weak(a.dtype, type(b))
    if isinstance(b, Tile):
        return promote_weak(b.dtype, type(a))
    return promote(scalar_dtype(a), scalar_dtype(b))


def as_array(x: Operand, dtype: type[DType]) -> np.ndarray:
    if isinstance(x, Tile):
        return reference.cast(x.array, dtype) if x.dtype is not dtype else x.array
    return round_to(np.asarray(x), dtype)


def binary(kind: str, a: Operand, b: Operand) -> Tile:
    dt = result_dtype(a, b)
    if kind == "div" and not dt.is_float():
        dt = f32
    return Tile(reference.binary(kind, as_array(a, dt), as_array(b, dt), dt), dt)


def compare(kind: str, a: Operand, b: Operand) -> Tile:
    dt = result_dtype(a, b)
    return Tile(reference.compare(kind, as_array(a, dt), as_array(b, dt)), bool_)


def unary(kind: str, x: Operand) -> Tile:
    t = x if isinstance(x, Tile) else Tile(np.asarray(x), scalar_dtype(x))
    if kind not in ("neg", "abs", "not") and not t.dtype.is_float():
        t = t.astype(f32)
    return Tile(reference.unary(kind, t.array, t.dtype), t.dtype)
