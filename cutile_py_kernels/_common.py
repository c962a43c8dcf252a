"""Host-side helpers of the library: dtype checks, row views of tensors and tile-size choices.

Kernels are written once per dtype family through small factories (`Elem` names the element
dtype in their annotations; mypy checks them as f32).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import cutile_py as ct
from cutile_py import Tensor, bf16, f16, f32

#: The element dtype as kernel annotations name it: f32 for mypy; each factory rebinds it.
Elem = f32
if TYPE_CHECKING:
    #: A `ct.Constant[int]` parameter; mypy reads it as the int it is inside the body.
    ConstInt = int
else:
    ConstInt = ct.Constant[int]
FLOATS = (f32, f16, bf16)
#: Longest row (elements) held in one tile; longer rows are processed in chunks of at most this.
ROW_CAP = {f32: 4096, f16: 8192, bf16: 8192}
#: Elements one block handles at once (several short rows share a block).
BLOCK_ELEMS = {f32: 4096, f16: 8192, bf16: 8192}
LOOP_CHUNK_CAP = 4096


K = TypeVar("K")


def per_dtype(factory: Callable[[type[ct.DType]], K]) -> Callable[[type[ct.DType]], K]:
    """Memoize a kernel factory per element dtype (each dtype compiles its own kernels)."""
    made: dict[str, K] = {}

    def get(dt: type[ct.DType]) -> K:
        if dt.name not in made:
            made[dt.name] = factory(dt)
        return made[dt.name]

    get.__doc__ = factory.__doc__
    return get


def per_dtype_warps(
    factory: Callable[[type[ct.DType], int], K],
) -> Callable[[type[ct.DType], int], K]:
    """Memoize a kernel factory per (element dtype, warps per block of its one-tile kernels)."""
    made: dict[tuple[str, int], K] = {}

    def get(dt: type[ct.DType], warps: int) -> K:
        key = (dt.name, warps)
        if key not in made:
            made[key] = factory(dt, warps)
        return made[key]

    get.__doc__ = factory.__doc__
    return get


def check_float(name: str, *tensors: Tensor[Any, Any]) -> type[ct.DType]:
    """The common float dtype of `tensors` (f32, f16 or bf16), else TypeError."""
    dt = tensors[0].dtype
    for t in tensors:
        if t._dtype is not dt or dt not in FLOATS:  # (the common case: no property call)
            if t.dtype not in FLOATS:
                raise TypeError(f"{name}: expected f32, f16 or bf16 tensors, got {t.dtype.name}")
            raise TypeError(f"{name}: dtypes differ: {dt.name} and {t.dtype.name}")
    return dt


def check_shape(name: str, what: str, t: Tensor[Any, Any], shape: Sequence[int]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: {what} has shape {t.shape}, expected {tuple(shape)}")


def view(t: Tensor[Any, Any], shape: Sequence[int]) -> Tensor[Any, Any]:
    """`t`'s storage under another row-major shape (same element count), sharing memory.

    Used inside host functions that launch and sync at once, so the view never outlives
    the call while a kernel holds it."""
    shape = tuple(int(d) for d in shape)
    if prod(shape) != t.size:
        raise ValueError(f"cannot view shape {t.shape} as {shape}")
    t._check_usable("read the tensor")
    if shape == t.shape:
        return t  # no second object over the memory: its ownership stays simple
    return Tensor(t.buffer, shape, t.dtype, t.backend, borrowed_from=t)


def as_rows(name: str, t: Tensor[Any, Any]) -> Tensor[Any, Any]:
    """`t` (..., N) as a 2-D (rows, N) view (either may be 0)."""
    shape = t.shape
    if len(shape) == 2 and t._moved_at is None and t._exclusive is None and not t._shared:
        return t  # already rows, and held by nobody: the common case, without a view
    if len(shape) == 0:
        raise ValueError(f"{name}: expected a tensor with at least one axis, got a scalar")
    return view(t, (prod(shape[:-1]), shape[-1]))


def as_shape(t: Tensor[Any, Any], shape: tuple[int, ...]) -> Tensor[Any, Any]:
    """A host function's fresh output `t` under `shape` (the caller's), moved only if needed."""
    return t if t.shape == shape else t.reshape(shape)


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def prev_pow2(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (n.bit_length() - 1)


@dataclass(frozen=True)
class RowPlan:
    """How a (rows, n) problem is tiled: `rows` rows per block of width `width` when the row
    fits one tile (`loop` False), else one row per block in chunks of `width`."""

    rows: int
    width: int
    loop: bool
    #: Bytes per element (the per-thread choice of the norms depends on it).
    itemsize: int = 4


#: Elements per thread a one-tile row kernel aims at: a row spread over fewer threads takes
#: fewer shuffle and shared-memory steps per element in its reductions (sm_90 SASS per
#: element, RMSNorm f32 4096: 12.2 with 256 threads, 9.75 with 128).
PER_THREAD = 32
#: The norms' exceptions to PER_THREAD by f32 tile width: (widest tile, elements per
#: thread), the first that fits; 16-bit tiles keep PER_THREAD (not timed). Chosen from an
#: H200 sweep (paper_repro/results/h200-2026-11-26/row-sweep.md: rms_norm f32, 4096 rows,
#: fraction of the copy ceiling, 16 per thread against 32): 1024 0.626 against 0.708 (32
#: kept), 1536 0.762 against 0.719 (Triton 0.758), 2048 0.763 against 0.754 (Triton
#: 0.765). 4096 stays at 32: 16 measured 0.866 against 0.851 (Triton 0.851) in one run but
#: costs 12.2 SASS instructions per element against 9.75 (Triton 10.6: the edge of issue
#: 19's 1.15x budget). 3072 was not timed (48 against 24 per thread, as 1536). At 1536, 32
#: a thread is 48 (2 warps, 86 registers: 20 warps an SM), 16 is 24 (4 warps, 56: 36); since
#: rows reduce within fewer warps (`lower.layout`), 93 and 48 registers (20 and 40 warps).
#: Next GPU: `python -m paper_repro.row_sweep` times both choices, 1024..4096.
PER_THREAD_BY_WIDTH: tuple[tuple[int, int], ...] = ((1024, PER_THREAD), (4095, 16))
#: Warps per block at most.
MAX_WARPS = 16


def per_thread(plan: RowPlan) -> int:
    """Elements per thread the one-tile norms aim at for `plan`'s tiles."""
    if plan.itemsize != 4:
        return PER_THREAD
    return next((per for widest, per in PER_THREAD_BY_WIDTH if plan.width <= widest), PER_THREAD)


def row_warps(plan: RowPlan, per: int | None = None) -> int:
    """Warps per block of the one-tile kernel for `plan`: `per` elements per thread (by
    default `per_thread(plan)`), at least 1 and at most MAX_WARPS (more elements per thread
    beyond); 1 for a looping plan."""
    if plan.loop:
        return 1
    per = per or per_thread(plan)
    return min(MAX_WARPS, prev_pow2(max(1, plan.rows * plan.width // (32 * per))))


def row_plan(n_rows: int, n: int, dtype: type[ct.DType], cap: int | None = None) -> RowPlan:
    """A tile for rows of `n` elements.

    A row that fits (n <= cap) is one tile: exactly n wide when n is a multiple of 32 (no
    padding, e.g. 1536), else the next power of two (masked). Longer rows loop over chunks:
    n split evenly when that gives chunks of a multiple of 32, else chunks of `cap`.
    """
    cap = cap or ROW_CAP[dtype]
    if n <= cap:
        width = n if n % 32 == 0 else next_pow2(n)
        rows = min(prev_pow2(max(1, BLOCK_ELEMS[dtype] // width)), next_pow2(n_rows))
        return RowPlan(rows, width, False, dtype.itemsize())
    # A looping kernel carries running statistics per element of its chunk (softmax: a max
    # and a sum) besides the chunk itself: 4096 elements keep them in registers at any dtype.
    cap = min(cap, LOOP_CHUNK_CAP)
    k = -(-n // cap)
    while n % k or (n // k) % 32:
        k += 1
        if n // k < cap // 4:  # no even split of a useful size: fixed chunks, last one masked
            return RowPlan(1, cap, True)
    return RowPlan(1, n // k, True)


class Shaped(Protocol):
    """What `row_launch` reads of its rows: a `Tensor`, or a `TensorSpec` standing in for one
    (the kernel a host call would launch, compiled or reported without data)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> type[ct.DType]: ...


@dataclass(frozen=True)
class RowLaunch:
    """How a row kernel's host function launches over (rows, n) of one dtype: the kernel (the
    one-tile or the chunked one), the outputs' tile, and the arguments after the caller's (a
    chunked kernel's chunk width). Made once per shape and dtype (`row_launch`)."""

    kernel: Any
    tile: tuple[int, int]
    extra: tuple[int, ...]

    def outputs(self, count: int, rows: Tensor[Any, Any]) -> list[ct.Partition]:
        """`count` fresh outputs of `rows`' shape and dtype, partitioned for the kernel."""
        return [empty_partition(rows.shape, rows.dtype, self.tile) for _ in range(count)]


def empty_partition(
    shape: tuple[int, ...], dtype: type[ct.DType], tile: tuple[int, ...]
) -> ct.Partition:
    """A host function's output: a fresh tensor of `shape`, partitioned in tiles of `tile`."""
    return ct.empty(shape, dtype).partition(tile)


_ROW_LAUNCHES: dict[tuple[Any, ...], RowLaunch] = {}


def row_launch(
    family: Callable[[type[ct.DType], int], tuple[Any, ...]],
    first: int,
    rows: Shaped,
    cap: int | None = None,
    per: Callable[[RowPlan], int] | None = None,
) -> RowLaunch:
    """The `RowLaunch` of kernel family `family(dtype, warps)` (its one-tile kernel at index
    `first`, the chunked one after it) over `rows`, rows of up to `cap` elements in one tile
    (`row_plan`), `per(plan)` elements a thread (default `per_thread`), remembered by shape,
    dtype, cap and rule: a host call then skips choosing the tiles, warps and kernel."""
    key = (family, first, rows.shape, rows.dtype, cap, per)
    got = _ROW_LAUNCHES.get(key)
    if got is None:
        r, n = rows.shape
        dt = rows.dtype
        plan = row_plan(r, n, dt, cap)
        warps = row_warps(plan, per(plan) if per is not None and not plan.loop else None)
        tile_k, loop_k = family(dt, warps)[first : first + 2]
        if plan.loop:
            # The block's tile: the row rounded up to whole chunks (the tail is masked).
            got = RowLaunch(loop_k, (1, -(-n // plan.width) * plan.width), (plan.width,))
        else:
            got = RowLaunch(tile_k, (plan.rows, plan.width), ())
        if len(_ROW_LAUNCHES) >= 1024:
            _ROW_LAUNCHES.clear()  # ever-new shapes: start over
        _ROW_LAUNCHES[key] = got
    return got
