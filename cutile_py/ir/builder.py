"""Building tile IR: one method per op, each applying the op's type and shape rule."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from math import prod

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import DType, bf16, bool_, f16, f32, i32
from cutile_py.ir.types import TileType, scalar


class IRTypeError(TypeError):
    """An op was given operands its type rule rejects."""


FLOAT_ONLY_UNARY = frozenset(
    {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "erf"}
)
#: Highest rank of a tile value (loads and stores stay at rank 3, the launch grid's; reshapes
#: and expand_dims may pass through one more dim).
MAX_RANK = 4


class Builder:
    """Appends ops to the innermost open region; tags each with the current source span."""

    def __init__(self) -> None:
        self.regions: list[o.Region] = [o.Region()]
        self.span: o.Span | None = None

    @property
    def region(self) -> o.Region:
        return self.regions[-1]

    @contextmanager
    def inside(self, region: o.Region) -> Iterator[o.Region]:
        self.regions.append(region)
        try:
            yield region
        finally:
            self.regions.pop()

    def _add(self, op: o.Op) -> o.Op:
        op.span = self.span
        self.region.ops.append(op)
        return op

    # -- leaves ---------------------------------------------------------------------------
    def constant(self, value: int | float | bool, dtype: type[DType]) -> o.Value:
        if dtype.kind == "bool":
            value = bool(value)
        elif dtype.kind == "int":
            if not isinstance(value, int):
                raise IRTypeError(f"{value!r} is not an integer")
            value = int(value)
        else:
            value = float(value)
        return self._add(o.ConstantOp((), (o.Value(scalar(dtype)),), value=value)).result

    def grid(self, which: str, axis: int) -> o.Value:
        if axis not in (0, 1, 2):
            raise IRTypeError(f"grid axis must be 0, 1 or 2, not {axis}")
        op = o.GridOp((), (o.Value(scalar(i32)),), which=which, axis=axis)  # type: ignore[arg-type]
        return self._add(op).result

    def tensor_dim(self, param: int, axis: int) -> o.Value:
        return self._add(o.TensorDimOp((), (o.Value(scalar(i32)),), param=param, axis=axis)).result

    def load(
        self,
        param: int,
        dtype: type[DType],
        index: Sequence[o.Value],
        shape: tuple[int, ...],
        padding: int | float,
        within: tuple[int, ...] | None = None,
    ) -> o.Value:
        """The tile of `shape` at tile `index`; with `within`, a sub-tile of the block's own
        tile of that shape (see `LoadOp`)."""
        _check_index(index)
        if not shape or any(d <= 0 for d in shape):
            raise IRTypeError(
                f"a loaded tile needs a non-empty shape of positive dims, got {shape}"
            )
        if len(index) != len(shape):
            raise IRTypeError(
                f"tile index has {len(index)} coordinates for a rank-{len(shape)} tile"
            )
        _check_within(within, shape)
        res = o.Value(TileType(dtype, shape))
        return self._add(
            o.LoadOp(tuple(index), (res,), param=param, shape=shape, padding=padding, within=within)
        ).result

    def store(
        self,
        param: int,
        index: Sequence[o.Value],
        value: o.Value,
        within: tuple[int, ...] | None = None,
    ) -> None:
        """Store `value` at tile `index`; with `within`, as a sub-tile of the block's own tile."""
        _check_index(index)
        if value.type.is_scalar:
            raise IRTypeError("store needs a tile, not a scalar")
        if len(index) != len(value.type.shape):
            raise IRTypeError(
                f"tile index has {len(index)} coordinates for a rank-{len(value.type.shape)} tile"
            )
        _check_within(within, value.type.shape)
        self._add(o.StoreOp((*index, value), (), param=param, within=within))

    def gather(
        self, param: int, dtype: type[DType], coords: Sequence[o.Value], padding: int | float
    ) -> o.Value:
        """The elements of tensor `param` at `coords` (see `GatherOp`)."""
        shape = _coords_shape(coords)
        res = o.Value(TileType(dtype, shape))
        return self._add(o.GatherOp(tuple(coords), (res,), param=param, padding=padding)).result

    def scatter(self, param: int, coords: Sequence[o.Value], value: o.Value) -> None:
        """Store `value` at `coords` of this block's tile of `param` (see `ScatterOp`)."""
        if _coords_shape(coords) != value.type.shape:
            raise IRTypeError(f"scatter of a {value.type} tile at coordinates of another shape")
        self._add(o.ScatterOp((*coords, value), (), param=param))

    def atomic(self, kind: str, param: int, coords: Sequence[o.Value], value: o.Value) -> None:
        """Atomic `kind` of `value` into tensor `param` at `coords` (see `AtomicOp`)."""
        if kind not in o.ATOMIC_KINDS:
            raise IRTypeError(f"unknown atomic {kind!r}")
        if _coords_shape(coords) != value.type.shape:
            raise IRTypeError(f"atomic {kind} of a {value.type} tile at coordinates of other shape")
        self._add(o.AtomicOp((*coords, value), (), kind=kind, param=param))

    def scan(self, kind: str, x: o.Value, axis: int) -> o.Value:
        """Inclusive prefix `kind` of `x` along `axis` (see `ScanOp`)."""
        if x.type.is_scalar or not 0 <= axis < len(x.type.shape):
            raise IRTypeError(f"scan axis {axis} of a {x.type} value")
        if kind != "sum" or x.type.dtype is bool_:
            raise IRTypeError(f"scan {kind} of {x.type.dtype.name} is not supported")
        return self._add(o.ScanOp((x,), (o.Value(x.type),), kind=kind, axis=axis)).result

    def iota(self, n: int) -> o.Value:
        if n <= 0:
            raise IRTypeError(f"arange needs a positive length, got {n}")
        return self._add(o.IotaOp((), (o.Value(TileType(i32, (n,))),))).result

    # -- element-wise ---------------------------------------------------------------------
    def broadcast(self, x: o.Value, shape: tuple[int, ...]) -> o.Value:
        """`x` repeated to `shape`: a scalar, or a tile of the same rank whose dims are each
        equal to `shape`'s or 1 (rank changes go through `reshape` first)."""
        if x.type.shape == shape:
            return x
        _check_shape(shape)
        if not x.type.is_scalar and not broadcastable(x.type.shape, shape):
            raise IRTypeError(f"cannot broadcast a tile of shape {x.type.shape} to {shape}")
        return self._add(o.BroadcastOp((x,), (o.Value(TileType(x.type.dtype, shape)),))).result

    def reduce(self, kind: str, x: o.Value, axis: int) -> o.Value:
        """Reduce `axis` of tile `x`, keeping it with size 1. sum/max/min keep the dtype;
        argmax/argmin give i32 indices."""
        if kind not in o.REDUCE_KINDS:
            raise IRTypeError(f"unknown reduction {kind}")
        shape = x.type.shape
        if not shape:
            raise IRTypeError(f"{kind} needs a tile, not a scalar")
        if not 0 <= axis < len(shape):
            raise IRTypeError(f"axis {axis} is out of range for a tile of shape {shape}")
        if kind == "sum" and x.type.dtype is bool_:
            raise IRTypeError("sum of a bool tile is not defined; convert with .astype(ct.i32)")
        dtype = i32 if kind in ("argmax", "argmin") else x.type.dtype
        out = TileType(dtype, (*shape[:axis], 1, *shape[axis + 1 :]))
        return self._add(o.ReduceOp((x,), (o.Value(out),), kind=kind, axis=axis)).result

    def reshape(self, x: o.Value, shape: tuple[int, ...]) -> o.Value:
        """The elements of tile `x` in row-major order under `shape` (same count); shape ()
        takes the one element of a size-1 tile as a scalar."""
        if x.type.shape == shape:
            return x
        if x.type.is_scalar:
            raise IRTypeError("reshape needs a tile; broadcast a scalar to make one")
        if shape:
            _check_shape(shape)
        elif x.type.size != 1:
            raise IRTypeError(
                f"only a tile of one element becomes a scalar, not one of shape {x.type.shape}"
            )
        if prod(shape) != x.type.size:
            raise IRTypeError(
                f"cannot reshape a tile of shape {x.type.shape} ({x.type.size} elements) to "
                f"{shape} ({prod(shape)} elements)"
            )
        return self._add(o.ReshapeOp((x,), (o.Value(TileType(x.type.dtype, shape)),))).result

    def permute(self, x: o.Value, axes: tuple[int, ...]) -> o.Value:
        """Tile `x` with its dims reordered: result dim i is `x`'s dim `axes[i]`."""
        shape = x.type.shape
        if sorted(axes) != list(range(len(shape))) or not shape:
            raise IRTypeError(f"axes {axes} are not a permutation of the dims of {x.type}")
        if axes == tuple(range(len(shape))):
            return x
        out = TileType(x.type.dtype, tuple(shape[a] for a in axes))
        return self._add(o.PermuteOp((x,), (o.Value(out),), axes=axes)).result

    def cast(self, x: o.Value, dtype: type[DType]) -> o.Value:
        if x.type.dtype is dtype:
            return x
        return self._add(o.CastOp((x,), (o.Value(x.type.with_dtype(dtype)),))).result

    def unary(self, kind: str, x: o.Value) -> o.Value:
        if kind not in o.UNARY_KINDS:
            raise IRTypeError(f"unknown unary op {kind}")
        dt = x.type.dtype
        if kind in FLOAT_ONLY_UNARY and not dt.is_float():
            raise IRTypeError(f"{kind} needs a floating-point operand, got {dt.name}")
        if kind == "not" and dt.is_float():
            raise IRTypeError(f"~ needs a bool or integer operand, got {dt.name}")
        if kind in ("neg", "abs") and dt is bool_:
            raise IRTypeError(f"{kind} of a bool is not defined")
        return self._add(o.UnaryOp((x,), (o.Value(x.type),), kind=kind)).result

    def binary(self, kind: str, x: o.Value, y: o.Value) -> o.Value:
        if kind not in o.BINARY_KINDS:
            raise IRTypeError(f"unknown binary op {kind}")
        _same_type(kind, x, y)
        dt = x.type.dtype
        if kind in ("and", "or", "xor") and dt.is_float():
            raise IRTypeError(f"{kind} needs bool or integer operands, got {dt.name}")
        if kind in ("div", "pow") and not dt.is_float():
            name = "true division" if kind == "div" else "pow"
            raise IRTypeError(f"{name} needs floating-point operands")
        if kind in ("add", "sub", "mul", "floordiv", "mod") and dt is bool_:
            raise IRTypeError(f"{kind} of bools is not defined")
        return self._add(o.BinaryOp((x, y), (o.Value(x.type),), kind=kind)).result

    def compare(self, kind: str, x: o.Value, y: o.Value) -> o.Value:
        if kind not in o.COMPARE_KINDS:
            raise IRTypeError(f"unknown comparison {kind}")
        _same_type(kind, x, y)
        res = o.Value(x.type.with_dtype(bool_))
        return self._add(o.CompareOp((x, y), (res,), kind=kind)).result

    def select(self, cond: o.Value, x: o.Value, y: o.Value) -> o.Value:
        if cond.type.dtype is not bool_:
            raise IRTypeError(f"the condition of where() must be bool, got {cond.type.dtype.name}")
        _same_type("where", x, y)
        if cond.type.shape != x.type.shape:
            raise IRTypeError(f"condition shape {cond.type.shape} differs from {x.type.shape}")
        return self._add(o.SelectOp((cond, x, y), (o.Value(x.type),))).result

    def fma(self, a: o.Value, b: o.Value, c: o.Value) -> o.Value:
        _same_type("fma", a, b)
        _same_type("fma", a, c)
        if not a.type.dtype.is_float():
            raise IRTypeError("fma needs floating-point operands")
        return self._add(o.FmaOp((a, b, c), (o.Value(a.type),))).result

    def mma(self, a: o.Value, b: o.Value, acc: o.Value) -> o.Value:
        """`acc + a @ b` on tensor cores; the rule is `check_mma`."""
        check_mma(a.type, b.type, acc.type)
        return self._add(o.MmaOp((a, b, acc), (o.Value(acc.type),))).result

    # -- control flow ---------------------------------------------------------------------
    def for_loop(
        self,
        lo: o.Value,
        hi: o.Value,
        step: o.Value,
        inits: Sequence[o.Value],
        descending: bool = False,
    ) -> o.ForOp:
        """Open a loop; the caller fills `op.body` (under `inside`) and ends it with `yield_`."""
        for v in (lo, hi, step):
            if v.type != scalar(i32):
                raise IRTypeError(f"range() bounds must be i32 scalars, got {v.type}")
        body = o.Region([o.Value(scalar(i32), "i"), *(o.Value(v.type) for v in inits)])
        results = tuple(o.Value(v.type) for v in inits)
        op = o.ForOp((lo, hi, step, *inits), results, body=body, descending=descending)
        return self._add(op)  # type: ignore[return-value]

    def if_(self, cond: o.Value, result_types: Sequence[TileType]) -> o.IfOp:
        if cond.type != scalar(bool_):
            raise IRTypeError(f"an if condition must be a bool scalar, got {cond.type}")
        op = o.IfOp((cond,), tuple(o.Value(t) for t in result_types))
        return self._add(op)  # type: ignore[return-value]

    def yield_(self, values: Sequence[o.Value]) -> None:
        self._add(o.YieldOp(tuple(values), ()))


def _check_index(index: Sequence[o.Value]) -> None:
    for v in index:
        if v.type != scalar(i32):
            raise IRTypeError(f"tile index coordinates must be i32 scalars, got {v.type}")


def broadcastable(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    """A tile of shape `src` broadcasts to `dst` without a rank change (each dim equal or 1)."""
    return len(src) == len(dst) and all(s in (1, d) for s, d in zip(src, dst))


def _check_shape(shape: tuple[int, ...]) -> None:
    if not 1 <= len(shape) <= MAX_RANK or any(d <= 0 for d in shape):
        raise IRTypeError(f"a tile needs 1 to {MAX_RANK} positive dims, got {shape}")


def _check_within(within: tuple[int, ...] | None, shape: tuple[int, ...]) -> None:
    if within is None:
        return
    if len(within) != len(shape) or any(w % d for w, d in zip(within, shape)):
        raise IRTypeError(
            f"each dim of the block's tile {within} must be a multiple of the sub-tile's {shape}"
        )


def _same_type(what: str, x: o.Value, y: o.Value) -> None:
    if x.type != y.type:
        raise IRTypeError(f"{what}: operand types differ ({x.type} and {y.type})")


#: Operand dtypes tensor cores multiply, and the K granule of each (one mma.sync's K).
MMA_K_STEP: dict[type[DType], int] = {f16: 16, bf16: 16, f32: 8}


def check_mma(a: TileType, b: TileType, acc: TileType) -> None:
    """The type rule of `mma(a, b, acc)`: a (M, K), b (K, N), acc (M, N) f32; a and b both
    f16, both bf16 or both f32 (tf32); M a multiple of 16, N of 8, K of 16 (f16/bf16) or
    8 (tf32): whole m16n8k16 / m16n8k8 instructions."""
    shapes = f"a {a.shape}, b {b.shape}, acc {acc.shape}"
    if len(a.shape) != 2 or len(b.shape) != 2 or len(acc.shape) != 2:
        raise IRTypeError(f"mma needs 2-D tiles a (M, K), b (K, N), acc (M, N); got {shapes}")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2 or acc.shape != (m, n):
        raise IRTypeError(f"mma needs a (M, K), b (K, N) and acc (M, N); got {shapes}")
    if a.dtype is not b.dtype or a.dtype not in MMA_K_STEP:
        raise IRTypeError(
            f"mma needs a and b both f16, both bf16 or both f32 (tf32); got {a.dtype.name} "
            f"and {b.dtype.name}"
        )
    if acc.dtype is not f32:
        raise IRTypeError(f"the mma accumulator must be f32, got {acc.dtype.name}")
    step = MMA_K_STEP[a.dtype]
    if m % 16 or n % 8 or k % step:
        raise IRTypeError(
            f"mma of {a.dtype.name} tiles needs M a multiple of 16, N of 8 and K of {step} "
            f"(whole tensor-core instructions); got {shapes}"
        )


def _coords_shape(coords: Sequence[o.Value]) -> tuple[int, ...]:
    """The one tile shape of the i32 coordinate tiles of a gather, scatter or atomic."""
    if not coords:
        raise IRTypeError("an indexed access needs one coordinate tile per dim")
    shape = coords[0].type.shape
    for c in coords:
        if c.type.dtype is not i32 or c.type.shape != shape or not shape:
            raise IRTypeError(f"coordinates must be i32 tiles of one shape, not {c.type}")
    return shape
