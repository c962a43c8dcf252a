"""The meaning of every element-wise, reduction and shape op, written once in NumPy.

Arrays are in compute form (`DType.compute`: f16 and bf16 values held in float32). A float op
on 16-bit types is computed in f32 and rounded once to the type, which for + - * / sqrt equals
the correctly rounded 16-bit result. f32 transcendentals are computed in f64 and rounded, so
the reference is the correctly rounded value that the compiled code must be within a few ulp of.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable

import numpy as np

from cutile_py.ir.dtypes import DType, f32, i32, round_to

Array = np.ndarray
T = typing.TypeVar("T")


def _exact(fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
    def run(x: Array) -> Array:
        return fn(x.astype(np.float64))

    return run


UNARY_FLOAT: dict[str, Callable[[Array], Array]] = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": _exact(np.exp),
    "exp2": _exact(np.exp2),
    "log": _exact(np.log),
    "log2": _exact(np.log2),
    "sqrt": _exact(np.sqrt),
    "rsqrt": _exact(lambda x: 1.0 / np.sqrt(x)),
    "tanh": _exact(np.tanh),
    "sigmoid": _exact(lambda x: 1.0 / (1.0 + np.exp(-x))),
    "sin": _exact(np.sin),
    "cos": _exact(np.cos),
    "erf": _exact(np.vectorize(math.erf, otypes=[np.float64])),  # NumPy has no erf
}

UNARY_INT: dict[str, Callable[[Array], Array]] = {
    "neg": np.negative,
    "abs": np.abs,
    "not": np.invert,
}

BINARY: dict[str, Callable[[Array, Array], Array]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "floordiv": np.floor_divide,
    "mod": np.mod,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
}

COMPARE: dict[str, Callable[[Array, Array], Array]] = {
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
}


def unary(kind: str, x: Array, dtype: type[DType]) -> Array:
    with np.errstate(all="ignore"):
        if dtype.is_float():
            return round_to(UNARY_FLOAT[kind](x), dtype)
        if kind == "not" and dtype.kind == "bool":
            return typing.cast(Array, np.logical_not(x))
        return UNARY_INT[kind](x).astype(dtype.compute)


def binary(kind: str, x: Array, y: Array, dtype: type[DType]) -> Array:
    with np.errstate(all="ignore"):
        if dtype.is_float():
            if kind == "pow":  # a math function: the correctly rounded value
                return round_to(np.power(x.astype(np.float64), y.astype(np.float64)), dtype)
            # floordiv and mod are NumPy's float32 floor_divide and remainder (also for f16:
            # NumPy computes float16 divmod in float32 too).
            x32, y32 = x.astype(np.float32), y.astype(np.float32)
            return round_to(BINARY[kind](x32, y32), dtype)
        if kind in ("floordiv", "mod"):
            # Python's floor semantics; a zero divisor gives 0 (PTX leaves it unspecified).
            safe = np.where(y == 0, 1, y)
            r = BINARY[kind](x, safe)
            return np.where(y == 0, 0, r).astype(dtype.compute)
        return BINARY[kind](x, y).astype(dtype.compute)


Number = bool | int | float


def fold(kind: str, a: Number, b: Number) -> Number:
    """`max`, `min` or `pow` of two Python numbers, as a Python number: weak, as NumPy 2 keeps
    Python scalars (NEP 50), so that it takes the type of the tiles it later meets. The
    frontend folds these calls with this function and the interpreter runs it, so both give
    the same number. max/min give a float if either is one, and NaN if either is NaN; pow is
    C's `pow` in double precision (a float; NaN for a negative base with a non-integer
    exponent, inf for zero to a negative power)."""
    if kind == "pow":
        with np.errstate(all="ignore"):
            return float(np.power(np.float64(a), np.float64(b)))
    if kind not in ("max", "min"):
        raise ValueError(f"cannot fold {kind}")
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.nan
    return max(a, b) if kind == "max" else min(a, b)


def int_power(x: T, n: int, mul: Callable[[T, T], T], one: Callable[[], T]) -> T:
    """`x ** n` for a constant n >= 0 by repeated squaring (x, x², x⁴, ... multiplied in for
    each set bit of n, lowest first): about log2(n) + popcount(n) multiplications, each
    rounded. The frontend builds these multiplications as IR and the interpreter runs them on
    tiles, so both round identically. n == 0 gives `one()` (1 even for NaN, as NumPy)."""
    if n < 0:
        raise ValueError("int_power needs n >= 0")
    result: T | None = None
    square = x
    while n:
        if n & 1:
            result = square if result is None else mul(result, square)
        n >>= 1
        if n:
            square = mul(square, square)
    return one() if result is None else result


def compare(kind: str, x: Array, y: Array) -> Array:
    with np.errstate(all="ignore"):
        return COMPARE[kind](x, y)


def select(cond: Array, x: Array, y: Array) -> Array:
    return np.where(cond, x, y)


def fma(a: Array, b: Array, c: Array, dtype: type[DType]) -> Array:
    """a*b + c rounded once (f64 holds the f32 product exactly)."""
    with np.errstate(all="ignore"):
        exact = a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)
        return round_to(exact.astype(np.float32) if dtype is not f32 else exact, dtype)


def cast(x: Array, dtype: type[DType]) -> Array:
    with np.errstate(all="ignore"):
        return round_to(x, dtype)


def broadcast(x: Array, shape: tuple[int, ...]) -> Array:
    """A scalar, or an array of the same rank with dims equal or 1, repeated to `shape`."""
    return np.array(np.broadcast_to(x, shape))


def reduce(kind: str, x: Array, axis: int, dtype: type[DType]) -> Array:
    """Reduce `axis` of `x` (of `dtype`), keeping it with size 1.

    sum: integers wrap around; f16/bf16 accumulate in f32 and f32 in f64, each rounded once
    to the dtype (the compiled code sums in another order, within rounding of this).
    max/min: NaN if any element is NaN. argmax/argmin: i32, the first index of the extreme,
    where a NaN counts as the extreme (the first NaN wins), as in NumPy.
    """
    with np.errstate(all="ignore"):
        if kind == "sum":
            if dtype.is_float():
                acc = np.float64 if dtype is f32 else np.float32
                return round_to(np.asarray(np.sum(x, axis=axis, dtype=acc, keepdims=True)), dtype)
            return np.asarray(np.sum(x, axis=axis, dtype=dtype.compute, keepdims=True))
        if kind in ("max", "min"):
            fn = np.max if kind == "max" else np.min
            return np.asarray(fn(x, axis=axis, keepdims=True)).astype(dtype.compute)
        fn_arg = np.argmax if kind == "argmax" else np.argmin
        return np.expand_dims(fn_arg(x, axis=axis), axis).astype(i32.compute)


def reshape(x: Array, shape: tuple[int, ...]) -> Array:
    """The elements of `x` in row-major order under `shape` (() takes a size-1 array's one
    element)."""
    return np.array(np.reshape(x, shape))


def permute(x: Array, axes: tuple[int, ...]) -> Array:
    """Result dim i is `x`'s dim `axes[i]`."""
    return np.ascontiguousarray(np.transpose(x, axes))


def round_to_tf32(x: Array) -> Array:
    """f32 values rounded to tf32 as `cvt.rna.tf32.f32` does: to nearest, ties away from
    zero, keeping 10 mantissa bits (the 13 low bits zero); NaN and infinities pass."""
    arr = np.ascontiguousarray(x, dtype=np.float32)
    bits = arr.view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    # Adding half an ulp to the magnitude bits rounds ties away from zero; a carry into the
    # exponent is the correct rounding up (to infinity past the largest tf32).
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)


def mma(a: Array, b: Array, acc: Array, dtype: type[DType]) -> Array:
    """`acc + a @ b` for f32 `acc`: f16/bf16 operands multiply exactly; f32 operands are
    first rounded to tf32 (`round_to_tf32`). Summed in f64 and rounded once to f32: the
    tensor cores sum in f32 in their own order, within tolerance of this."""
    if dtype is f32:
        a, b = round_to_tf32(a), round_to_tf32(b)
    with np.errstate(all="ignore"):
        exact = acc.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
        return exact.astype(np.float32)
