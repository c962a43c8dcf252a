"""The in-kernel builtins. Each runs on NumPy tiles in the interpreter; the frontend knows it by
its `__cutile_builtin__` name and builds tile IR instead. Formulas are element-wise."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

import numpy as np

from cutile_py.ir import reference
from cutile_py.ir.dtypes import DType, bf16, f16, f32, i32, op_type, round_to
from cutile_py.ir.shapes import (
    broadcast_to_shape,
    expanded_shape,
    permutation,
    reduction_axes,
    reshape_target,
)
from cutile_py.language import tile as _t
from cutile_py.language.block import block, resolve_shape
from cutile_py.language.interpret import TensorView, TileView
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


Index = int | Tile | Sequence[int | Tile]


def _index(index: Index) -> tuple[int, ...]:
    items = index if isinstance(index, Sequence) else (index,)
    return tuple(operator.index(i) for i in items)


@builtin("load")
def load(src: Any, index: Index, shape: Sequence[int] | int, padding: float = 0) -> Tile:
    """Tile `index` (counted in tiles of `shape`) of `src`; elements outside read `padding`.

    From a `Mut` parameter: a sub-tile of this block's own tile, `index` counted inside it
    (each dim of the block's tile must be a multiple of `shape`).
    """
    if isinstance(src, TileView):
        return src.read_sub_tile(_index(index), resolve_shape(shape), padding)
    assert isinstance(src, TensorView)
    return src.read_tile(_index(index), resolve_shape(shape), padding)


@builtin("store")
def store(dst: Any, index: Index, tile: Tile) -> None:
    """Store `tile` as sub-tile `index` (counted in tiles of its shape) of this block's tile
    of the `Mut` parameter `dst`; elements outside the block's tile (or the tensor) are
    dropped. Each dim of the block's tile must be a multiple of the tile's."""
    assert isinstance(dst, TileView)
    dst.write_sub_tile(_index(index), tile)


# -- element-wise ---------------------------------------------------------------------------
def tile_full(shape: Sequence[int] | int, value: Operand, dtype: type[DType]) -> Tile:
    v = value.astype(dtype).array if isinstance(value, Tile) else round_to(np.asarray(value), dtype)
    return Tile(np.array(np.broadcast_to(v, resolve_shape(shape)), dtype=dtype.compute), dtype)


@builtin("where")
def where(cond: Tile | bool, x: Operand, y: Operand) -> Tile:
    """`x` where `cond` is true, else `y` (element-wise; all three broadcast together)."""
    dt = _t.result_dtype(x, y)
    if isinstance(cond, bool):
        picked = x if cond else y
        shape = np.broadcast_shapes(np.shape(_t.as_array(x, dt)), np.shape(_t.as_array(y, dt)))
        return Tile(np.array(np.broadcast_to(_t.as_array(picked, dt), shape)), dt)
    c = cond.array if isinstance(cond, Tile) else np.asarray(cond, dtype=bool)
    return Tile(np.where(c, _t.as_array(x, dt), _t.as_array(y, dt)).astype(dt.compute), dt)


@overload
def maximum(x: int, y: int) -> int: ...
@overload
def maximum(x: float, y: float) -> float: ...
@overload
def maximum(x: Tile, y: Operand) -> Tile: ...
@overload
def maximum(x: Operand, y: Tile) -> Tile: ...
@builtin("maximum")
def maximum(x: Operand, y: Operand) -> Tile | int | float:
    """Element-wise maximum; NaN if either is NaN. Of two Python numbers: a Python number
    (`reference.fold`), weak like them, on every backend."""
    if not isinstance(x, Tile) and not isinstance(y, Tile):
        return reference.fold("max", x, y)
    return _t.binary("max", x, y)


@overload
def minimum(x: int, y: int) -> int: ...
@overload
def minimum(x: float, y: float) -> float: ...
@overload
def minimum(x: Tile, y: Operand) -> Tile: ...
@overload
def minimum(x: Operand, y: Tile) -> Tile: ...
@builtin("minimum")
def minimum(x: Operand, y: Operand) -> Tile | int | float:
    """Element-wise minimum; NaN if either is NaN. Of two Python numbers: a Python number
    (`reference.fold`), weak like them, on every backend."""
    if not isinstance(x, Tile) and not isinstance(y, Tile):
        return reference.fold("min", x, y)
    return _t.binary("min", x, y)


@overload
def pow(x: float, y: float) -> float: ...
@overload
def pow(x: Tile, y: Operand) -> Tile: ...
@overload
def pow(x: Operand, y: Tile) -> Tile: ...
@builtin("pow")
def pow(x: Operand, y: Operand) -> Tile | float:
    """`x ** y` element-wise in floating point (integers and bools compute in f32), with C's
    `powf` special cases: pow(x, ±0) = 1 and pow(1, y) = 1 even for NaN, pow(-1, ±inf) = 1;
    a finite negative base to a finite non-integer power is NaN, to an odd integer power is
    negative; pow(±0, y < 0) = ±inf; |x| < 1 to +inf is 0, |x| > 1 to +inf is inf.

    f32 results are within 0.5 ulp + 2^-17 ulp of the exact power by analysis (log2 and
    exp2 are evaluated in f64); measured on sim over 2^20 random inputs spanning the f32
    range (`python -m cutile_py.tools.pow_accuracy`): max error 0.500000 ulp, every result
    correctly rounded. f16 and bf16 compute in f32, then round. With `fast_math=True`:
    ex2.approx(y * lg2.approx(|x|)), as CUDA's `__powf` (an error growing with |y log2 x|;
    subnormal x flush to 0), same special cases. Of two Python numbers:
    a Python float (C's `pow` in double precision)."""
    if not isinstance(x, Tile) and not isinstance(y, Tile):
        return float(reference.fold("pow", x, y))
    return _t.power(x, y)


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
_TRIG_DOC = """, element-wise (radians). f32 results are within 1.5 ulp of the exact value
on the whole f32 range (an exact Payne-Hanek reduction above |x| = 105615): measured on sim over
2^20 random inputs per range (`python -m cutile_py.tools.math_accuracy`), max 1.40 ulp on
[-pi, pi], 1.49 on [-1e5, 1e5], 1.46 over all f32; inf and NaN give NaN, sin(-0) = -0. f16 and
bf16 compute in f32, then round; integers compute in f32. With `fast_math=True`: the hardware's
`sin.approx`/`cos.approx` (as CUDA's `__sinf`: about 2^-21 absolute on [-pi, pi], worse far
outside it)."""
sin = _unary("sin", "Sine" + _TRIG_DOC)
cos = _unary("cos", "Cosine" + _TRIG_DOC)
erf = _unary(
    "erf",
    """The error function, element-wise. f32 results are within 1.1 ulp of the exact value:
measured on sim over 2^20 random inputs per range (`python -m cutile_py.tools.math_accuracy`),
max 1.03 ulp on [-5, 5]; +-1 from |x| = 3.92, erf(-0) = -0, NaN gives NaN. f16 and bf16
compute in f32, then round; integers compute in f32. `fast_math=True` uses ex2.approx inside
(1.14 ulp measured on sim).""",
)
abs = _unary("abs", "Absolute value, element-wise.")


@builtin("fma")
def fma(a: Operand, b: Operand, c: Operand) -> Tile:
    """`a * b + c` rounded once, element-wise."""
    dt = op_type("fma", _t.result_dtype(a, b, c))
    x, y, z = (_t.as_array(v, dt) for v in (a, b, c))
    return Tile(reference.fma(x, y, z, dt), dt)


@builtin("mma")
def mma(a: Tile, b: Tile, acc: Tile) -> Tile:
    """`acc + a @ b` on tensor cores: a (M, K), b (K, N), acc (M, N) f32. f16/bf16 operands
    multiply exactly and accumulate in f32; f32 operands are rounded to tf32 first (nearest,
    ties away). M is a multiple of 16, N of 8, K of 16 (f16/bf16) or 8 (f32)."""
    return _t.mma(a, b, acc)


# -- shapes ---------------------------------------------------------------------------------
def _as_tile(x: Operand) -> Tile:
    return x if isinstance(x, Tile) else Tile(np.asarray(x), _t.scalar_dtype(x))


@builtin("reshape")
def reshape(x: Operand, shape: Sequence[int] | int) -> Tile:
    """The elements of `x` in row-major order under `shape` (one dim may be -1)."""
    t = _as_tile(x)
    dims = tuple(shape) if isinstance(shape, Sequence) else shape
    return Tile(reference.reshape(t.array, reshape_target(dims, t.size, t.shape)), t.dtype)


@builtin("broadcast_to")
def broadcast_to(x: Operand, shape: Sequence[int] | int) -> Tile:
    """`x` repeated to `shape` (NumPy broadcasting)."""
    t = _as_tile(x)
    target = resolve_shape(shape)
    broadcast_to_shape(t.shape, target)
    return Tile(reference.broadcast(t.array, target), t.dtype)


@builtin("permute")
def permute(x: Tile, axes: Sequence[int]) -> Tile:
    """`x` with its dims reordered: result dim i is `x`'s dim `axes[i]` (NumPy transpose)."""
    return Tile(reference.permute(x.array, permutation(tuple(axes), x.ndim)), x.dtype)


@builtin("expand_dims")
def expand_dims(x: Operand, axis: int | tuple[int, ...]) -> Tile:
    """`x` with a dim of size 1 inserted at `axis` (NumPy `expand_dims`)."""
    t = _as_tile(x)
    return Tile(reference.reshape(t.array, expanded_shape(t.shape, axis)), t.dtype)


# -- reductions -----------------------------------------------------------------------------
Axis = int | tuple[int, ...] | None


def _reduce(kind: str, x: Tile, axis: Axis, keepdims: bool) -> Tile:
    """The steps the compiler's IR takes: one keepdims reduction per axis (argmax/argmin over
    all axes: of the flattened tile), then the reduced axes dropped unless `keepdims`."""
    shape = x.shape
    axes = reduction_axes(axis, x.ndim, multiple=kind in ("sum", "max", "min"))
    if kind in ("argmax", "argmin") and axis is None and x.ndim > 1:
        r = reference.reduce(kind, x.array.reshape(-1), 0, x.dtype)
        return Tile(r.reshape((1,) * x.ndim if keepdims else ()), i32)
    # A 16-bit float sum over several axes accumulates in f32 throughout, rounded once.
    widen = kind == "sum" and x.dtype in (f16, bf16) and len(axes) > 1
    t = x.astype(f32) if widen else x
    arr = t.array
    for a in axes:
        arr = reference.reduce(kind, arr, a, t.dtype)
    out = Tile(arr, i32 if kind in ("argmax", "argmin") else t.dtype)
    if widen:
        out = out.astype(x.dtype)
    if keepdims:
        return out
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    return Tile(reference.reshape(out.array, kept), out.dtype)


@builtin("sum")
def sum(x: Tile, axis: Axis = None, keepdims: bool = False) -> Tile:
    """Sum over `axis` (None: all). Integers wrap around; f16/bf16 accumulate in f32."""
    return _reduce("sum", x, axis, keepdims)


@builtin("max")
def max(x: Tile, axis: Axis = None, keepdims: bool = False) -> Tile:
    """Maximum over `axis` (None: all); NaN if any element is NaN."""
    return _reduce("max", x, axis, keepdims)


@builtin("min")
def min(x: Tile, axis: Axis = None, keepdims: bool = False) -> Tile:
    """Minimum over `axis` (None: all); NaN if any element is NaN."""
    return _reduce("min", x, axis, keepdims)


@builtin("cumsum")
def cumsum(x: Tile, axis: int = 0) -> Tile:
    """Inclusive prefix sum along `axis`: `out[..., i, ...] = sum(x[..., :i+1, ...])`, same
    shape and dtype. Integers wrap around; f16/bf16 accumulate in f32 and round each output
    once. Compiled f32 code adds in a tree order (runs per thread, then warp shuffles, then
    across warps): measured on sim over 2^20 inputs per case (`python -m
    cutile_py.tools.scan_accuracy`), every prefix is within 4.3 half-ulps of its sum of |x|
    for rows of 128 to 4096 (NumPy's sequential f32 cumsum: up to 53 on uniform [0, 1)
    inputs). The interpreter sums in f64 and rounds each output once."""
    ax = axis + x.ndim if axis < 0 else axis
    if x.dtype.is_float():
        wide = np.cumsum(x.array.astype(np.float64), axis=ax)
        return Tile(round_to(wide, x.dtype).astype(x.dtype.compute), x.dtype)
    return Tile(np.cumsum(x.array, axis=ax, dtype=x.dtype.compute), x.dtype)


@builtin("argmax")
def argmax(x: Tile, axis: int | None = None, keepdims: bool = False) -> Tile:
    """i32 index of the first maximum along `axis` (None: in the flattened tile); a NaN
    counts as the maximum, as in NumPy."""
    return _reduce("argmax", x, axis, keepdims)


@builtin("argmin")
def argmin(x: Tile, axis: int | None = None, keepdims: bool = False) -> Tile:
    """i32 index of the first minimum along `axis` (None: in the flattened tile); a NaN
    counts as the minimum, as in NumPy."""
    return _reduce("argmin", x, axis, keepdims)


__all__ = [
    "abs",
    "argmax",
    "argmin",
    "bid",
    "broadcast_to",
    "builtin",
    "builtin_name",
    "cdiv",
    "cos",
    "cumsum",
    "erf",
    "exp",
    "exp2",
    "expand_dims",
    "fma",
    "function",
    "is_helper",
    "load",
    "load_tile_like",
    "log",
    "log2",
    "max",
    "maximum",
    "min",
    "minimum",
    "mma",
    "num_blocks",
    "num_tiles",
    "permute",
    "pow",
    "reshape",
    "rsqrt",
    "sigmoid",
    "sin",
    "sqrt",
    "store",
    "sum",
    "tanh",
    "tile_full",
    "where",
]
