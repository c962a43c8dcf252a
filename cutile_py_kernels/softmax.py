"""Row-wise `softmax` (optionally causal) and `argmax` over the last axis.

Softmax reads rows of up to `ONE_PASS_CAP` elements once, held in registers (one row per
block for long rows, about 32 elements per thread, 64 at the cap); longer rows are read in
chunks: a running maximum and a rescaled running sum per lane (two passes). argmax keeps a
running (value, index).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32, i32
from cutile_py_kernels._common import (
    ConstInt,
    Elem,
    RowPlan,
    as_rows,
    check_float,
    next_pow2,
    per_dtype,
    prev_pow2,
    row_plan,
)

BR = TypeVar("BR")  # rows per block
T = TypeVar("T")  # tile width (>= the row length)
W = TypeVar("W")  # the row length (one-row-per-block kernels)
ONE = TypeVar("ONE")  # 1: argmax writes one index per row

NEG_INF = -math.inf
#: The longest row softmax holds in registers (64 f32 per thread of 512 at 32768: 92
#: registers on sm_90, no spills); longer rows take the chunked kernel.
ONE_PASS_CAP = 32768
#: Elements per thread the one-pass kernel aims at (fewer threads per row: fewer shuffle and
#: shared-memory steps per element in the row reductions).
PER_THREAD = 32
#: Warps per block at most (16: a 32768-element row in 512 threads).
MAX_WARPS = 16


def softmax_plan(n_rows: int, n: int, dtype: type[ct.DType]) -> tuple[RowPlan, int]:
    """The tiling of a (n_rows, n) softmax, and the warps per block of the one-pass kernel:
    rows of up to ONE_PASS_CAP in one tile (n wide when a multiple of 32, else the next
    power of two), as many whole rows per block as make 1024 elements, PER_THREAD elements
    per thread; longer rows in chunks (`row_plan`)."""
    if n > ONE_PASS_CAP:
        return row_plan(n_rows, n, dtype), 0
    width = n if n % 32 == 0 else next_pow2(n)
    rows = min(prev_pow2(max(1, 32 * PER_THREAD // width)), next_pow2(n_rows))
    warps = min(MAX_WARPS, prev_pow2(max(1, rows * width // (32 * PER_THREAD))))
    return RowPlan(rows, width, False), warps


_SOFTMAX: dict[tuple[str, int], tuple[Any, Any]] = {}


def _softmax_kernels(dt: type[ct.DType], warps: int) -> tuple[Any, Any]:
    """The one-pass and the chunked softmax kernels for `dt`, the first in blocks of `warps`
    warps (the chunked one lets the compiler choose); made once per (dtype, warps)."""
    key = (dt.name, warps)
    if key not in _SOFTMAX:
        _SOFTMAX[key] = _make_softmax_kernels(dt, warps)
    return _SOFTMAX[key]


def _make_softmax_kernels(dt: type[ct.DType], warps: int) -> tuple[Any, Any]:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel(num_warps=warps)
    def softmax_tile(
        y: Mut[Tensor[Elem, BR, T]], x: Tensor[Elem, Dyn, Dyn], n: int, causal: bool
    ) -> None:
        """y = exp(x - max) / sum(exp(x - max)) for BR whole rows, read once and held in
        registers; columns >= n read -inf, and with `causal` so do columns past the row's
        index within its n x n matrix. One division per row, then multiplies."""
        t = ct.load(x, (ct.bid(0), 0), y.shape, padding=NEG_INF).astype(f32)
        if causal:
            cols = ct.expand_dims(ct.arange(y.shape[1]), 0)
            rows = ct.expand_dims(ct.arange(y.shape[0]), 1) + ct.bid(0) * y.shape[0]
            t = ct.where(cols > rows % n, NEG_INF, t)
        e = ct.exp(t - ct.max(t, axis=1, keepdims=True))
        y.store((e * (1.0 / ct.sum(e, axis=1, keepdims=True))).astype(y.dtype))

    @ct.kernel
    def softmax_loop(
        y: Mut[Tensor[Elem, BR, W]], x: Tensor[Elem, Dyn, Dyn], n: int, causal: bool, C: ConstInt
    ) -> None:
        """softmax of one row too long for registers, in chunks of C. First pass: the row's
        running maximum m (one value, from each chunk's maximum) and per lane a sum s of
        exp(x - m), rescaled by the one exp(m_old - m_new) when m grows: each exp of an
        element computed once (while m is -inf, the base is 0 and s stays 0). Then the lanes
        combine, and a second pass writes exp(x - M) * (1 / S)."""
        row = ct.bid(0)
        limit = n
        if causal:
            limit = row % n + 1
        chunks = ct.cdiv(n, C)
        m: ct.Tile = ct.full((1, 1), NEG_INF, f32)
        s: ct.Tile = ct.zeros((1, C), f32)
        for j in range(chunks):
            t = ct.load(x, (row, j), (1, C), padding=NEG_INF).astype(f32)
            t = ct.where(ct.arange(C) + j * C < limit, t, NEG_INF)
            m_new = ct.maximum(m, ct.max(t, axis=1, keepdims=True))
            base = ct.where(m_new == NEG_INF, 0.0, m_new)
            s = s * ct.exp(m - base) + ct.exp(t - base)
            m = m_new
        inv = 1.0 / ct.sum(s, axis=1, keepdims=True)
        for j in range(chunks):
            t = ct.load(x, (row, j), (1, C), padding=NEG_INF).astype(f32)
            t = ct.where(ct.arange(C) + j * C < limit, t, NEG_INF)
            ct.store(y, (0, j), (ct.exp(t - m) * inv).astype(y.dtype))

    return softmax_tile, softmax_loop


@per_dtype
def _argmax_kernels(dt: type[ct.DType]) -> tuple[Any, Any]:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel
    def argmax_tile(y: Mut[Tensor[i32, BR, ONE]], x: Tensor[Elem, Dyn, Dyn], TW: ConstInt) -> None:
        """y[r] = the first index of the row's maximum (padding reads -inf)."""
        t = ct.load(x, (ct.bid(0), 0), (y.shape[0], TW), padding=NEG_INF)
        y.store(ct.argmax(t, axis=1, keepdims=True))

    @ct.kernel
    def argmax_loop(y: Mut[Tensor[i32, BR, ONE]], x: Tensor[Elem, Dyn, Dyn], C: ConstInt) -> None:
        """argmax of one long row in chunks of C; a later chunk wins only if strictly
        greater, so the first maximum is kept."""
        row = ct.bid(0)
        best: ct.Tile = ct.full((1, 1), NEG_INF, f32)
        best_i: ct.Tile = ct.zeros((1, 1), i32)
        for j in range(ct.cdiv(x.shape[1], C)):
            t = ct.load(x, (row, j), (1, C), padding=NEG_INF).astype(f32)
            cm = ct.max(t, axis=1, keepdims=True)
            best_i = ct.where(cm > best, ct.argmax(t, axis=1, keepdims=True) + j * C, best_i)
            best = ct.maximum(best, cm)
        y.store(best_i)

    return argmax_tile, argmax_loop


def softmax(x: Tensor[Any, Any], causal: bool = False) -> Tensor[Any, Any]:
    """`y = exp(x - max) / sum(exp(x - max))` over the last axis (f32 arithmetic, the row
    maximum subtracted first), same shape and dtype as `x`.

    With `causal=True`, `x` is (..., S, S): entry (i, j) of each S x S matrix with j > i is
    excluded from its row's softmax and is 0 in the output."""
    dt = check_float("softmax", x)
    rows = as_rows("softmax", x)
    r, n = rows.shape
    if causal and (len(x.shape) < 2 or x.shape[-2] != n):
        raise ValueError(f"softmax: causal=True needs x of shape (..., S, S), got {x.shape}")
    if rows.size == 0:
        return ct.zeros(x.shape, dt)
    plan, warps = softmax_plan(r, n, dt)
    tile_k, loop_k = _softmax_kernels(dt, max(warps, 1))
    if plan.loop:
        out = ct.empty((r, n), dt).partition((1, -(-n // plan.width) * plan.width))
        y, *_ = loop_k(out, rows, n, bool(causal), plan.width).sync()
    else:
        out = ct.empty((r, n), dt).partition((plan.rows, plan.width))
        y, *_ = tile_k(out, rows, n, bool(causal)).sync()
    result: Tensor[Any, Any] = y.unpartition().reshape(x.shape)
    return result


def argmax(x: Tensor[Any, Any]) -> Tensor[Any, Any]:
    """`argmax(x, axis=-1)` as int32, shape `x.shape[:-1]` (the first index of the maximum;
    NaN is not handled)."""
    dt = check_float("argmax", x)
    rows = as_rows("argmax", x)
    r, n = rows.shape
    if r == 0:
        return ct.zeros(x.shape[:-1], i32)
    if n == 0:  # as NumPy
        raise ValueError(f"argmax: rows of x {x.shape} are empty; an empty row has no argmax")
    tile_k, loop_k = _argmax_kernels(dt)
    plan = row_plan(r, n, dt)
    if plan.loop:
        out = ct.empty((r, 1), i32).partition((1, 1))
        y, *_ = loop_k(out, rows, plan.width).sync()
    else:
        out = ct.empty((r, 1), i32).partition((plan.rows, 1))
        y, *_ = tile_k(out, rows, plan.width).sync()
    result: Tensor[Any, Any] = y.unpartition().reshape(x.shape[:-1])
    return result
