"""`Tile`: the value of a tile expression. In the interpreter it holds a NumPy array; for
mypy it types tile arithmetic inside kernel bodies. Every operator applies `ir.reference`."""

from __future__ import annotations

from typing import Union

import numpy as np

from cutile_py.ir import reference
from cutile_py.ir.builder import check_mma
from cutile_py.ir.dtypes import (
    DType,
    bool_,
    f32,
    i32,
    is_dtype,
    op_type,
    result_type,
    round_to,
)
from cutile_py.ir.shapes import reshape_target
from cutile_py.ir.types import TileType
from cutile_py.language.block import resolve_dtype

Operand = Union["Tile", int, float, bool]


class Tile:
    """An immutable tile of `dtype` values (compute form: f16 and bf16 held in float32).

    Shape () is a typed scalar (a full reduction, `item()`): it keeps its dtype in arithmetic,
    unlike a Python number, and converts to bool/int/float for conditions and loop bounds.
    """

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

    @property
    def ndim(self) -> int:
        return self.array.ndim

    @property
    def size(self) -> int:
        return int(self.array.size)

    @property
    def T(self) -> Tile:
        """The tile with its axes reversed."""
        return Tile(reference.permute(self.array, tuple(reversed(range(self.ndim)))), self.dtype)

    def astype(self, dtype: type[DType]) -> Tile:
        """Convert element-wise (round to nearest even; float → int truncates toward zero)."""
        dt = resolve_dtype(dtype)
        if not is_dtype(dt):
            raise TypeError(f"astype takes a cutile_py dtype (ct.f32, ct.i32, ...), not {dt!r}")
        return Tile(reference.cast(self.array, dt), dt)

    def reshape(self, *shape: int | tuple[int, ...]) -> Tile:
        """The same elements in row-major order under `shape` (a tuple or the dims as
        arguments; one dim may be -1)."""
        dims = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        target = reshape_target(dims, self.size, self.shape)
        return Tile(reference.reshape(self.array, target), self.dtype)

    def item(self) -> Tile:
        """The one element of a size-1 tile, as a scalar (a tile of shape ())."""
        if self.size != 1:
            raise ValueError(f"item() needs a tile of one element, not one of shape {self.shape}")
        return Tile(reference.reshape(self.array, ()), self.dtype)

    def _scalar(self, what: str) -> np.ndarray:
        if self.shape:
            raise TypeError(
                f"a tile of shape {self.shape} has no {what}; use ct.where() or a scalar"
            )
        return self.array

    def __bool__(self) -> bool:
        return bool(self._scalar("truth value"))

    def __int__(self) -> int:
        return int(self._scalar("int value"))

    def __index__(self) -> int:
        return int(self._scalar("int value"))

    def __float__(self) -> float:
        return float(self._scalar("float value"))

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

    def __pow__(self, other: Operand) -> Tile:
        return power(self, other)

    def __rpow__(self, other: Operand) -> Tile:
        return power(other, self)

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

    def __matmul__(self, other: Tile) -> Tile:
        """`self @ other` with f32 accumulation (`ct.mma` into zeros)."""
        if not isinstance(other, Tile) or self.ndim != 2 or other.ndim != 2:
            raise TypeError("@ needs two 2-D tiles")
        zero = Tile(np.zeros((self.shape[0], other.shape[1]), np.float32), f32)
        return mma(self, other, zero)

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


def scalar_dtype(value: object) -> type[DType]:
    """The dtype a Python scalar takes when it stands alone (int → i32, float → f32)."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return i32
    if isinstance(value, float):
        return f32
    raise TypeError(f"expected a tile or a Python number, got {type(value).__name__}")


def operand_type(x: Operand) -> type[DType] | type:
    """What `result_type` takes for `x`: a tile's dtype (strong), a number's Python type
    (weak)."""
    if isinstance(x, Tile):
        return x.dtype
    if isinstance(x, (bool, int, float)):
        return type(x) if not isinstance(x, bool) else bool
    raise TypeError(f"expected a tile or a Python number, got {type(x).__name__}")


def result_dtype(*xs: Operand) -> type[DType]:
    """The common type of the operands of an element-wise op (`dtypes.result_type`)."""
    return result_type(*(operand_type(x) for x in xs))


def as_array(x: Operand, dtype: type[DType]) -> np.ndarray:
    if isinstance(x, Tile):
        return reference.cast(x.array, dtype) if x.dtype is not dtype else x.array
    return round_to(np.asarray(x), dtype)


def binary(kind: str, a: Operand, b: Operand) -> Tile:
    dt = op_type(kind, result_dtype(a, b))
    return Tile(reference.binary(kind, as_array(a, dt), as_array(b, dt), dt), dt)


def power(a: Operand, b: Operand) -> Tile:
    """`a ** b` as the compiled code computes it: a constant integer exponent by repeated
    multiplication (`reference.int_power`; negative: the reciprocal after), else pow."""
    if isinstance(a, Tile) and isinstance(b, int):
        x = a.astype(i32) if a.dtype is bool_ else a
        if b < 0 and not x.dtype.is_float():
            raise TypeError("integers to negative integer powers are not allowed")

        def one() -> Tile:
            return Tile(np.ones(x.shape, x.dtype.compute), x.dtype)

        r = reference.int_power(x, abs(b), lambda p, q: binary("mul", p, q), one)
        return binary("div", one(), r) if b < 0 else r
    dt = op_type("pow", result_dtype(a, b))
    return Tile(reference.binary("pow", as_array(a, dt), as_array(b, dt), dt), dt)


def compare(kind: str, a: Operand, b: Operand) -> Tile:
    dt = result_dtype(a, b)
    return Tile(reference.compare(kind, as_array(a, dt), as_array(b, dt)), bool_)


def unary(kind: str, x: Operand) -> Tile:
    t = x if isinstance(x, Tile) else Tile(np.asarray(x), scalar_dtype(x))
    dt = op_type(kind, t.dtype)
    return Tile(reference.unary(kind, as_array(t, dt), dt), dt)


def mma(a: Tile, b: Tile, acc: Tile) -> Tile:
    """`acc + a @ b` (`reference.mma`), after the IR's type rule."""
    check_mma(*(TileType(t.dtype, t.shape) for t in (a, b, acc)))
    return Tile(reference.mma(a.array, b.array, acc.array, a.dtype), f32)
