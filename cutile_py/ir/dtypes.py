"""Element types: one class per dtype (so `Tensor[f32, B]` is a type for mypy), with promotion."""

from __future__ import annotations

from typing import ClassVar, TypeGuard

import numpy as np


class DType:
    """Base of the element types. Dtypes are used as classes, never instantiated."""

    name: ClassVar[str]
    bits: ClassVar[int]
    kind: ClassVar[str]  # "float", "int" or "bool"
    #: NumPy dtype of host storage (bf16 is stored as its 16 raw bits).
    storage: ClassVar[np.dtype[np.generic]]
    #: NumPy dtype that holds this type's values exactly while computing (bf16, f16 → f32).
    compute: ClassVar[np.dtype[np.generic]]

    def __init__(self) -> None:
        raise TypeError(f"{type(self).__name__} is a dtype; use the class itself, not an instance")

    @classmethod
    def itemsize(cls) -> int:
        return max(cls.bits // 8, 1)

    @classmethod
    def is_float(cls) -> bool:
        return cls.kind == "float"


class f32(DType):
    name = "f32"
    bits = 32
    kind = "float"
    storage = np.dtype(np.float32)
    compute = np.dtype(np.float32)


class f16(DType):
    name = "f16"
    bits = 16
    kind = "float"
    storage = np.dtype(np.float16)
    compute = np.dtype(np.float32)


class bf16(DType):
    name = "bf16"
    bits = 16
    kind = "float"
    storage = np.dtype(np.uint16)
    compute = np.dtype(np.float32)


class i32(DType):
    name = "i32"
    bits = 32
    kind = "int"
    storage = np.dtype(np.int32)
    compute = np.dtype(np.int32)


class i64(DType):
    name = "i64"
    bits = 64
    kind = "int"
    storage = np.dtype(np.int64)
    compute = np.dtype(np.int64)


class bool_(DType):
    name = "bool"
    bits = 8
    kind = "bool"
    storage = np.dtype(np.bool_)
    compute = np.dtype(np.bool_)


ALL_DTYPES: tuple[type[DType], ...] = (f32, f16, bf16, i32, i64, bool_)
BY_NAME: dict[str, type[DType]] = {d.name: d for d in ALL_DTYPES}


def is_dtype(obj: object) -> TypeGuard[type[DType]]:
    return isinstance(obj, type) and issubclass(obj, DType) and obj is not DType


def from_numpy_dtype(dt: np.dtype[np.generic]) -> type[DType]:
    """The dtype whose host storage is `dt` (uint16 is not taken as bf16: say so explicitly)."""
    for d in ALL_DTYPES:
        if d is not bf16 and d.storage == dt:
            return d
    raise TypeError(f"NumPy dtype {dt} has no cutile_py equivalent (have {', '.join(BY_NAME)})")


def promote(a: type[DType], b: type[DType]) -> type[DType]:
    """Result type of a binary op between two tiles (NumPy-like, without f64)."""
    if a is b:
        return a
    if a is bool_:
        return b
    if b is bool_:
        return a
    if a.kind == "float" and b.kind == "float":
        return f32  # f16 with bf16, or a 16-bit float with f32
    if a.kind == "float":
        return a if a.bits > 16 or b.bits <= 8 else f32
    if b.kind == "float":
        return b if b.bits > 16 or a.bits <= 8 else f32
    return i64 if 64 in (a.bits, b.bits) else i32


def promote_weak(tile: type[DType], scalar: type) -> type[DType]:
    """Result type of a tile with a Python scalar (NEP 50: the scalar is weak)."""
    if scalar is bool:
        return tile
    if scalar is int:
        return i32 if tile is bool_ else tile
    # float
    return tile if tile.kind == "float" else f32


#: An operand's type for `result_type`: a dtype (a tile or a typed scalar: strong) or the
#: Python type of a plain number (weak).
OperandType = type[DType] | type[bool] | type[int] | type[float]

#: Ops computed in floating point: integer and bool operands are converted to f32 first.
FLOAT_OPS = frozenset(
    {"div", "pow", "fma", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid"}
    | {"sin", "cos", "erf"}
)


def result_type(*operands: OperandType) -> type[DType]:
    """The one type that the operands of an element-wise op are converted to: the strong
    dtypes promoted together, then each Python number applied weakly (NEP 50). Python numbers
    alone take bool_, i32 or f32 by the widest of their kinds. The frontend and the
    interpreter both use this, so that they agree on every result type."""
    strong: list[type[DType]] = []
    weak: list[type] = []
    for t in operands:
        if isinstance(t, type) and issubclass(t, DType):
            strong.append(t)
        else:
            weak.append(t)
    if strong:
        dtype = strong[0]
        for t in strong[1:]:
            dtype = promote(dtype, t)
    else:
        dtype = f32 if float in weak else i32 if int in weak else bool_
    for w in weak:
        dtype = promote_weak(dtype, w)
    return dtype


def op_type(kind: str, dtype: type[DType]) -> type[DType]:
    """The type op `kind` computes in, given its operands' common type: true division, pow,
    fma and the transcendental functions compute integers and bools in f32."""
    return f32 if kind in FLOAT_OPS and not dtype.is_float() else dtype


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even); returns float32 of the
    same shape (0-d stays 0-d)."""
    arr = np.asarray(x, dtype=np.float32)
    bits = np.ascontiguousarray(arr).reshape(-1).view(np.uint32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    rounded = np.where(nan, bits | 0x00400000, rounded).astype(np.uint32)
    return rounded.view(np.float32).reshape(arr.shape)


def round_to(x: np.ndarray, dtype: type[DType]) -> np.ndarray:
    """Values of `x` rounded to `dtype`, held in `dtype.compute` (what a cast means)."""
    if dtype is bf16:
        return round_to_bf16(np.asarray(x, dtype=np.float32))
    if dtype is f16:
        return np.asarray(x).astype(np.float16).astype(np.float32)
    if dtype.kind == "int" and np.asarray(x).dtype.kind == "f":
        # PTX cvt.rzi: truncate toward zero; NaN becomes 0; saturate at the type's limits.
        info = np.iinfo(np.int64 if dtype.bits == 64 else np.int32)
        t = np.trunc(np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0))
        limit = 2.0 ** (dtype.bits - 1)  # exact in f64, unlike info.max for 64 bits
        inside = np.where((t >= -limit) & (t < limit), t, 0).astype(dtype.compute)
        return np.where(t >= limit, info.max, np.where(t < -limit, info.min, inside)).astype(
            dtype.compute
        )
    if dtype is bool_:
        return np.asarray(np.asarray(x) != 0)
    return np.asarray(x).astype(dtype.compute)


def convert_scalar(value: bool | int | float, dtype: type[DType]) -> bool | int | float:
    """A Python number converted as a cast to `dtype` converts it: floats round to nearest
    (overflowing to inf), float → int truncates and saturates with NaN → 0. An int that does
    not fit an integer dtype raises ValueError."""
    if dtype.kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        lo = -(2 ** (dtype.bits - 1))
        if not lo <= value < -lo:
            raise ValueError(f"{value} does not fit in {dtype.name}")
        return value
    with np.errstate(all="ignore"):
        converted = round_to(np.asarray(value, dtype=np.float64), dtype)
    if dtype is bool_:
        return bool(converted)
    return int(converted) if dtype.kind == "int" else float(converted)


def to_storage(values: np.ndarray, dtype: type[DType]) -> np.ndarray:
    """Compute-form values → host storage form (bf16 → its raw bits)."""
    if dtype is bf16:
        return round_to_bf16(values).view(np.uint32).__rshift__(16).astype(np.uint16)
    return np.asarray(round_to(values, dtype)).astype(dtype.storage)


def from_storage(raw: np.ndarray, dtype: type[DType]) -> np.ndarray:
    """Host storage form → compute form (bf16 bits → float32 values)."""
    if dtype is bf16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(dtype.compute)


def to_host(raw: np.ndarray, dtype: type[DType]) -> np.ndarray:
    """Host storage form → the array a user reads back: the dtype's own NumPy type (f16 as
    float16), and bf16, which NumPy lacks, as float32 (exactly)."""
    if dtype is bf16:
        return from_storage(raw, dtype)
    return raw.astype(dtype.storage)
