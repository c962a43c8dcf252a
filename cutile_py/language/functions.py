"""The in-kernel builtins. Each runs on NumPy tiles in the interpreter; the frontend knows it by
its `__cutile_builtin__` name and builds tile IR instead. Formulas are element-wise."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from cutile_py.ir import reference
from cutile_py.ir.dtypes import DType, round_to
from cutile_py.language import tile as _t
from cutile_py.language.interpret import TensorView, TileView, block, resolve_shape
from cutile_py.language.tile import Operand, Tile

F = TypeVar("F", bound=Callable[..., Any])


def builtin(name: str) -> Callable[[F], F]:
    """Mark a function as the in-kernel builtin `name` (the frontend dispatches on it)."""

    def mark(fn: F) -> F:
        fn.__cutile_builtin__ = name  # type: ignore[attr-defined]
        return fn

    return mark


def function(fn: F) -> F:
    """`@ct.function`: a helper that kernels may call; the compiler inlines it at each call.

    It runs as plain Python in the interpreter, and must keep to the kernel subset of Python.
    """
    fn.__cutile_helper__ = True  # type: ignore[attr-defined]
    return fn


def is_helper(obj: object) -> bool:
    return bool(getattr(obj, "__cutile_helper__", False))


def builtin_name(obj: object) -> str | None:
    name = getattr(obj, "__cutile_builtin__", None)
    return name if isinstance(name, str) else None


# -- grid -----------------------------------------------------------------------------------
@builtin("bid")
def bid(axis: int) -> int:
    """This block's index along grid `axis` (the tile index of its `Mut` tiles)."""
    return block().bid[axis]


@builtin("num_blocks")
def num_blocks(axis: int) -> int:
    """The number of blocks along grid `axis`."""
    return block().num_blocks[axis]


@builtin("cdiv")
def cdiv(a: int, b: int) -> int:
    """`ceil(a / b)` for positive `b`."""
    return -(-a // b)


@builtin("num_tiles")
def num_tiles(src: Any, axis: int, tile: int) -> int:
    """Tiles of size `tile` covering dim `axis` of the whole tensor `src` (for a Mut
    parameter, the whole partitioned tensor, not its tile): `cdiv(dim, tile)`."""
    shape = src.full_shape if isinstance(src, TileView) else src.shape
    return cdiv(shape[axis], tile)


# -- loads ----------------------------------------------------------------------------------
@builtin("load_tile_like")
def load_tile_like(src: Any, like: Any) -> Tile:
    """The tile of `src` at the position and shape of the `Mut` tile `like` (padded with 0)."""
    assert isinstance(src, TensorView) and isinstance(like, TileView)
    return src.read_tile(like.index, like.shape, 0)


@builtin("load")
def load(src: Any, index: Sequence[int], shape: Sequence[int], padding: float = 0) -> Tile:
    """Tile `index` (counted in tiles of `shape`) of `src`; elements outside read `padding`."""
    assert isinstance(src, TensorView)
    idx = (index,) if isinstance(index, int) else tuple(index)
    return src.read_tile(idx, resolve_shape(shape), padding)


# -- element-wise ---------------------------------------------------------------------------
def tile_full(shape: Sequence[int] | int, value: Operand, dtype: type[DType]) -> Tile:
    v = value.astype(dtype).array if isinstance(value, Tile) else round_to(np.asarray(value), dtype)
    return Tile(np.array(np.broadcast_to(v, resolve_shape(shape)), dtype=dtype.compute), dtype)


@builtin("where")
def where(cond: Tile, x: Operand, y: Operand) -> Tile:
    """`x` where `cond` is true, else `y` (element-wise)."""
    dt = _t.result_dtype(x, y)
    c = cond.array if isinstance(cond, Tile) else np.asarray(cond, dtype=bool)
    if isinstance(cond, bool):
        picked = x if cond else y
        return picked if isinstance(picked, Tile) else Tile(_t.as_array(picked, dt), dt)
    return Tile(np.where(c, _t.as_array(x, dt), _t.as_array(y, dt)).astype(dt.compute), dt)


@builtin("maximum")
def maximum(x: Operand, y: Operand) -> Tile:
    """Element-wise maximum; NaN if either is NaN."""
    return _t.binary("max", x, y)


@builtin("minimum")
def minimum(x: Operand, y: Operand) -> Tile:
    """Element-wise minimum; NaN if either is NaN."""
    return _t.binary("min", x, y)


def _unary(kind: str, doc: str) -> Callable[[Operand], Tile]:
    def fn(x: Operand) -> Tile:
        return _t.unary(kind, x)

    fn.__name__ = fn.__qualname__ = kind
    fn.__doc__ = doc
    return builtin(kind)(fn)


exp = _unary("exp", "`e**x`, element-wise.")
exp2 = _unary("exp2", "`2**x`, element-wise.")
log = _unary("log", "Natural logarithm, element-wise.")
log2 = _unary("log2", "Base-2 logarithm, element-wise.")
sqrt = _unary("sqrt", "Square root (correctly rounded), element-wise.")
rsqrt = _unary("rsqrt", "`1 / sqrt(x)`, element-wise.")
tanh = _unary("tanh", "Hyperbolic tangent, element-wise.")
sigmoid = _unary("sigmoid", "`1 / (1 + exp(-x))`, element-wise.")
abs = _unary("abs", "Absolute value, element-wise.")


@builtin("fma")
def fma(a: Operand, b: Operand, c: Operand) -> Tile:
    """`a * b + c` rounded once, element-wise."""
    dt = _t.result_dtype(_t.binary("mul", a, b), c)
    x, y, z = (_t.as_array(v, dt) for v in (a, b, c))
    return Tile(reference.fma(x, y, z, dt), dt)


__all__ = [
    "abs",
    "bid",
    "builtin",
    "builtin_name",
    "cdiv",
    "exp",
    "exp2",
    "fma",
    "function",
    "is_helper",
    "load",
    "load_tile_like",
    "log",
    "log2",
    "maximum",
    "minimum",
    "num_blocks",
    "num_tiles",
    "rsqrt",
    "sigmoid",
    "sqrt",
    "tile_full",
    "tanh",
    "where",
]
