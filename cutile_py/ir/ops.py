"""Tile IR: values, operations, regions and the kernel they form.

Each op is a small dataclass holding its operands and attributes; its result types are
computed by its constructor helper in `builder.py` and checked again by `verify.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from cutile_py.ir.dtypes import DType
from cutile_py.ir.types import TileType


class Value:
    """An SSA value: the result of one op or an argument of a region."""

    __slots__ = ("hint", "type")

    def __init__(self, type: TileType, hint: str = "") -> None:
        self.type = type
        self.hint = hint

    def __repr__(self) -> str:
        return f"Value({self.type}, {self.hint!r})"


UNARY_KINDS = frozenset(
    {"neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "not"}
    | {"sin", "cos", "erf"}
)
BINARY_KINDS = frozenset(
    {"add", "sub", "mul", "div", "floordiv", "mod", "max", "min", "pow", "and", "or", "xor"}
)
COMPARE_KINDS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
REDUCE_KINDS = frozenset({"sum", "max", "min", "argmax", "argmin"})
Span = tuple[str, int, int]  # file, line, column of the source that made an op


@dataclass(frozen=True)
class TensorParam:
    """A kernel parameter holding a whole tensor (shared, read-only), or a partition (`mut`)."""

    name: str
    dtype: type[DType]
    rank: int
    mut: bool
    #: For a partition: the tile shape each block sees. For a shared tensor: the static dims
    #: (None where the dim is only known at run time).
    dims: tuple[int | None, ...]
    #: Largest power of two (at most 16) dividing the last dim: the widest aligned vector access.
    align: int = 1
    #: An `Atomic` parameter: the kernel only updates it with atomics (never reads or stores).
    atomic: bool = False
    #: For a shared tensor: the Mut parameters (by index) whose tensors this one covers (as
    #: long or longer along every dim), as this launch's arguments showed.
    covers: tuple[int, ...] = ()


@dataclass(frozen=True)
class ScalarParam:
    name: str
    dtype: type[DType]
    #: The compiled-in value of a `ct.Constant` parameter (None for run-time scalars).
    constant: int | float | bool | None = None


Param = TensorParam | ScalarParam


@dataclass(eq=False)
class Op:
    opname: ClassVar[str] = "op"
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    span: Span | None = field(default=None, kw_only=True)

    @property
    def result(self) -> Value:
        (r,) = self.results
        return r

    def regions(self) -> tuple[Region, ...]:
        return ()

    def attrs(self) -> str:
        """Attributes as the printer shows them (operands are printed separately)."""
        return ""


@dataclass(eq=False)
class Region:
    args: list[Value] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)


@dataclass(eq=False)
class ConstantOp(Op):
    opname: ClassVar[str] = "constant"
    value: int | float | bool = 0

    def attrs(self) -> str:
        return repr(self.value)


@dataclass(eq=False)
class GridOp(Op):
    """The block index (`bid`) or the grid size (`num_blocks`) along one axis."""

    opname: ClassVar[str] = "grid"
    which: Literal["bid", "num_blocks"] = "bid"
    axis: int = 0

    def attrs(self) -> str:
        return f"{self.which} axis={self.axis}"


@dataclass(eq=False)
class TensorDimOp(Op):
    """The run-time size of dimension `axis` of a tensor parameter (the whole tensor)."""

    opname: ClassVar[str] = "tensor_dim"
    param: int = 0
    axis: int = 0

    def attrs(self) -> str:
        return f"param={self.param} axis={self.axis}"


@dataclass(eq=False)
class LoadOp(Op):
    """Load the tile of `shape` at tile index `operands` (counted in tiles) of a tensor.

    Elements outside the tensor read `padding`.
    """

    opname: ClassVar[str] = "load"
    param: int = 0
    shape: tuple[int, ...] = ()
    padding: int | float = 0
    #: Set for a sub-tile of a `Mut` parameter: the block's own tile shape. The index then
    #: counts tiles of `shape` inside this block's tile, and elements outside it read `padding`.
    within: tuple[int, ...] | None = None

    def attrs(self) -> str:
        w = f" within={self.within}" if self.within is not None else ""
        return f"param={self.param} shape={self.shape} padding={self.padding!r}{w}"


@dataclass(eq=False)
class StoreOp(Op):
    """Store tile `operands[-1]` at tile index `operands[:-1]`; elements outside are dropped."""

    opname: ClassVar[str] = "store"
    param: int = 0
    #: As for LoadOp: the block's own tile shape when storing a sub-tile of a `Mut` parameter
    #: (index relative to that tile); elements outside the block's tile are dropped.
    within: tuple[int, ...] | None = None

    def attrs(self) -> str:
        w = f" within={self.within}" if self.within is not None else ""
        return f"param={self.param}{w}"


@dataclass(eq=False)
class GatherOp(Op):
    """The elements of tensor `param` at coordinates `operands` (one i32 tile per dim of the
    tensor, each of the result's shape); a coordinate outside the tensor reads `padding`."""

    opname: ClassVar[str] = "gather"
    param: int = 0
    padding: int | float = 0

    def attrs(self) -> str:
        return f"param={self.param} padding={self.padding!r}"


@dataclass(eq=False)
class ScatterOp(Op):
    """Store `operands[-1]` at coordinates `operands[:-1]` (one i32 tile per dim, each of the
    value's shape), counted from this block's tile of the `Mut` parameter `param`; elements
    whose coordinates leave the block's tile (or the tensor) are dropped."""

    opname: ClassVar[str] = "scatter"
    param: int = 0

    def attrs(self) -> str:
        return f"param={self.param}"


ATOMIC_KINDS = frozenset({"add", "max", "min"})


@dataclass(eq=False)
class AtomicOp(Op):
    """`t[c] = kind(t[c], v)` atomically for each element `v` of `operands[-1]` at coordinates
    `operands[:-1]` (whole-tensor coordinates) of the `Atomic` parameter `param`; coordinates
    outside the tensor are dropped."""

    opname: ClassVar[str] = "atomic"
    kind: str = "add"
    param: int = 0

    def attrs(self) -> str:
        return f"{self.kind} param={self.param}"


@dataclass(eq=False)
class ScanOp(Op):
    """Inclusive prefix `kind` (sum) along `axis`: result[..., i, ...] = sum of x[..., :i+1, ...].
    f16/bf16 accumulate in f32 and round each output once; integers wrap around."""

    opname: ClassVar[str] = "scan"
    kind: str = "sum"
    axis: int = 0

    def attrs(self) -> str:
        return f"{self.kind} axis={self.axis}"


@dataclass(eq=False)
class IotaOp(Op):
    """The 1-D i32 tile `[0, 1, ..., n-1]`."""

    opname: ClassVar[str] = "iota"


@dataclass(eq=False)
class BroadcastOp(Op):
    """A scalar, or a tile of the result's rank whose dims are each equal or 1, repeated to
    the result's shape (NumPy broadcasting; rank changes go through ReshapeOp first)."""

    opname: ClassVar[str] = "broadcast"


@dataclass(eq=False)
class ReduceOp(Op):
    """Reduce `axis` of the operand; the result keeps that axis with size 1 (keepdims).

    sum/max/min keep the dtype (f16/bf16 accumulate in f32, rounded once; max/min propagate
    NaN); argmax/argmin give i32, the first index of the extreme (NaN counts as extreme).
    """

    opname: ClassVar[str] = "reduce"
    kind: str = "sum"
    axis: int = 0

    def attrs(self) -> str:
        return f"{self.kind} axis={self.axis}"


@dataclass(eq=False)
class MmaOp(Op):
    """`acc + a @ b` for a (M, K), b (K, N), acc (M, N) f32: f16/bf16 operands multiply
    exactly and accumulate in f32; f32 operands are first rounded to tf32 (`cvt.rna`)."""

    opname: ClassVar[str] = "mma"


@dataclass(eq=False)
class ReshapeOp(Op):
    """The same elements in row-major order under the result's shape (shape () takes the one
    element of a size-1 tile as a scalar)."""

    opname: ClassVar[str] = "reshape"


@dataclass(eq=False)
class PermuteOp(Op):
    """Result dim i is operand dim `axes[i]` (NumPy `transpose(axes)`)."""

    opname: ClassVar[str] = "permute"
    axes: tuple[int, ...] = ()

    def attrs(self) -> str:
        return f"axes={self.axes}"


@dataclass(eq=False)
class UnaryOp(Op):
    opname: ClassVar[str] = "unary"
    kind: str = ""

    def attrs(self) -> str:
        return self.kind


@dataclass(eq=False)
class BinaryOp(Op):
    opname: ClassVar[str] = "binary"
    kind: str = ""

    def attrs(self) -> str:
        return self.kind


@dataclass(eq=False)
class CompareOp(Op):
    opname: ClassVar[str] = "compare"
    kind: str = ""

    def attrs(self) -> str:
        return self.kind


@dataclass(eq=False)
class SelectOp(Op):
    opname: ClassVar[str] = "select"


@dataclass(eq=False)
class FmaOp(Op):
    opname: ClassVar[str] = "fma"


@dataclass(eq=False)
class CastOp(Op):
    opname: ClassVar[str] = "cast"


@dataclass(eq=False)
class ForOp(Op):
    """`for iv in range(lo, hi, step)` carrying values; operands are (lo, hi, step, *inits).

    The body's args are (iv, *carried); it ends with a YieldOp of the next carried values.
    """

    opname: ClassVar[str] = "for"
    body: Region = field(default_factory=Region)
    #: The step is negative: the loop runs while iv > hi.
    descending: bool = False

    def attrs(self) -> str:
        return "descending" if self.descending else ""

    def regions(self) -> tuple[Region, ...]:
        return (self.body,)


@dataclass(eq=False)
class IfOp(Op):
    """Branch on a scalar bool; both regions end with a YieldOp of the results."""

    opname: ClassVar[str] = "if"
    then: Region = field(default_factory=Region)
    orelse: Region = field(default_factory=Region)

    def regions(self) -> tuple[Region, ...]:
        return (self.then, self.orelse)


@dataclass(eq=False)
class YieldOp(Op):
    opname: ClassVar[str] = "yield"


@dataclass(eq=False)
class Kernel:
    """A specialized kernel: parameters with static facts, and its body."""

    name: str
    params: tuple[Param, ...]
    #: Values of the scalar parameters, in parameter order (None for tensor parameters).
    param_values: tuple[Value | None, ...]
    body: Region
    #: Launch grid rank (1 to 3); the grid size itself is a run-time value.
    grid_rank: int = 1
    fast_math: bool = False
    #: K-loop iterations the cp.async pipeline loads ahead (None: the compiler chooses).
    stages: int | None = None
    #: Warps per block (None: the compiler chooses from the tile sizes).
    num_warps: int | None = None
    #: Blocks take their tiles in L2-grouped order, `group_m` tile rows per band
    #: (`ir.grid_order`; None: block index = tile index).
    group_m: int | None = None
    #: A TMA-fed wgmma K loop runs with a producer warp group issuing its copies and the
    #: block's other warps as consumers (`plan_ws`), where the plan can specialize it.
    warp_specialize: bool = False
    #: Each block walks tiles bid, bid + blocks, ... of the logical grid (a persistent grid
    #: of about one wave of blocks: `lower/plan_persistent`).
    persistent: bool = False
