"""Row normalizations over the last axis: `rms_norm`, `add_rms_norm`, `layer_norm`.

f16 and bf16 inputs are computed in f32 and rounded once to the input dtype. A row of up to
ONE_PASS_CAP elements is one tile (see `_common.row_plan`), read once and held in registers;
a longer row is read in chunks, one pass per statistic plus one to write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py_kernels._common import (
    ConstInt,
    Elem,
    RowPlan,
    as_rows,
    as_shape,
    check_float,
    check_shape,
    per_dtype_warps,
    per_thread,
    row_launch,
    view,
)

#: The longest row held in registers: 64 elements per thread of 512 at 32768, at most 127
#: registers on sm_90 and no spills for all three kernels, f32 or bf16 (nvJitLink 13.5). The
#: chunked kernels read a row once per statistic: 1.5-2x the bytes (on an H200, rms_norm
#: f32 4096 x 8192 moved 0.68 of the copy bandwidth chunked, Triton's one-pass 0.90).
ONE_PASS_CAP = 32768

#: layer_norm's f32 tiles wider than this, of a power-of-two width, take
#: LAYER_NORM_WIDE_PER_THREAD elements a thread (the norms' rule, `_common.per_thread`, gives
#: 32: 16 warps at 16384). On an H200 at 4096 x 16384, 64 (8 warps) moved 0.914 of the copy
#: ceiling where 32 moved 0.759; at 8192, 32 (8 warps) 0.874 and 64 0.849; rms_norm at 16384
#: was 1% slower at 64 and keeps the rule
#: (paper_repro/results/h200-2026-11-26-lease2/rows-long.txt). Other widths keep the rule:
#: warps are a power of two, so 64 asked at 12288 or 24576 would be 96 a thread (167
#: registers; not timed).
LAYER_NORM_WIDE = 8192
LAYER_NORM_WIDE_PER_THREAD = 64

BR = TypeVar("BR")  # rows per block
T = TypeVar("T")  # tile width (>= the row length when the row fits one tile)
W = TypeVar("W")  # the row length, for one-row-per-block kernels that loop over chunks


@per_dtype_warps
def _rms_kernels(dt: type[ct.DType], warps: int) -> tuple[Any, Any, Any, Any]:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel(num_warps=warps)
    def rms_norm_tile(
        y: Mut[Tensor[Elem, BR, T]],
        x: Tensor[Elem, Dyn, Dyn],
        w: Tensor[Elem, Dyn],
        inv_n: float,
        eps: float,
    ) -> None:
        """y = x * rsqrt(mean(x²) + eps) * w for BR whole rows (padding reads 0)."""
        xt = ct.load_tile_like(x, y).astype(f32)
        r = ct.rsqrt(ct.sum(xt * xt, axis=1, keepdims=True) * inv_n + eps)
        wt = ct.load(w, (0,), (y.shape[1],)).astype(f32)
        y.store((xt * r * wt).astype(y.dtype))

    @ct.kernel
    def rms_norm_loop(
        y: Mut[Tensor[Elem, BR, W]],
        x: Tensor[Elem, Dyn, Dyn],
        w: Tensor[Elem, Dyn],
        inv_n: float,
        eps: float,
        C: ConstInt,
    ) -> None:
        """rms_norm of one long row, in chunks of C: a pass for mean(x²), one to write."""
        row = ct.bid(0)
        chunks = ct.cdiv(x.shape[1], C)
        acc: ct.Tile = ct.zeros((1, C), f32)
        for j in range(chunks):
            t = ct.load(x, (row, j), (1, C)).astype(f32)
            acc = acc + t * t
        r = ct.rsqrt(ct.sum(acc, axis=1, keepdims=True) * inv_n + eps)
        for j in range(chunks):
            t = ct.load(x, (row, j), (1, C)).astype(f32)
            wt = ct.load(w, (j,), (C,)).astype(f32)
            ct.store(y, (0, j), (t * r * wt).astype(y.dtype))

    @ct.kernel(num_warps=warps)
    def add_rms_norm_tile(
        y: Mut[Tensor[Elem, BR, T]],
        h: Mut[Tensor[Elem, BR, T]],
        x: Tensor[Elem, Dyn, Dyn],
        res: Tensor[Elem, Dyn, Dyn],
        w: Tensor[Elem, Dyn],
        inv_n: float,
        eps: float,
    ) -> None:
        """h = x + res (rounded to the dtype); y = rms_norm(h) * w."""
        ht = (ct.load_tile_like(x, y).astype(f32) + ct.load_tile_like(res, y).astype(f32)).astype(
            h.dtype
        )
        h.store(ht)
        hf = ht.astype(f32)
        r = ct.rsqrt(ct.sum(hf * hf, axis=1, keepdims=True) * inv_n + eps)
        wt = ct.load(w, (0,), (y.shape[1],)).astype(f32)
        y.store((hf * r * wt).astype(y.dtype))

    @ct.kernel
    def add_rms_norm_loop(
        y: Mut[Tensor[Elem, BR, W]],
        h: Mut[Tensor[Elem, BR, W]],
        x: Tensor[Elem, Dyn, Dyn],
        res: Tensor[Elem, Dyn, Dyn],
        w: Tensor[Elem, Dyn],
        inv_n: float,
        eps: float,
        C: ConstInt,
    ) -> None:
        """add_rms_norm of one long row: pass 1 writes h and sums h², pass 2 reads h back."""
        row = ct.bid(0)
        chunks = ct.cdiv(x.shape[1], C)
        acc: ct.Tile = ct.zeros((1, C), f32)
        for j in range(chunks):
            a = ct.load(x, (row, j), (1, C)).astype(f32)
            b = ct.load(res, (row, j), (1, C)).astype(f32)
            ht = (a + b).astype(h.dtype)
            ct.store(h, (0, j), ht)
            hf = ht.astype(f32)
            acc = acc + hf * hf
        r = ct.rsqrt(ct.sum(acc, axis=1, keepdims=True) * inv_n + eps)
        for j in range(chunks):
            hf = ct.load(h, (0, j), (1, C)).astype(f32)
            wt = ct.load(w, (j,), (C,)).astype(f32)
            ct.store(y, (0, j), (hf * r * wt).astype(y.dtype))

    return rms_norm_tile, rms_norm_loop, add_rms_norm_tile, add_rms_norm_loop


@per_dtype_warps
def _layer_norm_kernels(dt: type[ct.DType], warps: int) -> tuple[Any, Any]:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel(num_warps=warps)
    def layer_norm_tile(
        y: Mut[Tensor[Elem, BR, T]],
        x: Tensor[Elem, Dyn, Dyn],
        w: Tensor[Elem, Dyn],
        b: Tensor[Elem, Dyn],
        n: int,
        inv_n: float,
        eps: float,
    ) -> None:
        """mean, then the variance of the centered row (columns >= n masked out); inv_n = 1/n
        from the host (no division in the kernel)."""
        xt = ct.load_tile_like(x, y).astype(f32)
        mean = ct.sum(xt, axis=1, keepdims=True) * inv_n
        d = xt - mean
        if n < y.shape[1]:  # padding columns (x = 0 there): keep -mean out of the variance
            d = ct.where(ct.arange(y.shape[1]) < n, d, 0.0)
        r = ct.rsqrt(ct.sum(d * d, axis=1, keepdims=True) * inv_n + eps)
        wt = ct.load(w, (0,), (y.shape[1],)).astype(f32)
        bt = ct.load(b, (0,), (y.shape[1],)).astype(f32)
        y.store(ct.fma(d * r, wt, bt).astype(y.dtype))

    @ct.kernel
    def layer_norm_loop(
        y: Mut[Tensor[Elem, BR, W]],
        x: Tensor[Elem, Dyn, Dyn],
        w: Tensor[Elem, Dyn],
        b: Tensor[Elem, Dyn],
        n: int,
        inv_n: float,
        eps: float,
        C: ConstInt,
    ) -> None:
        """layer_norm of one long row in chunks of C: passes for the mean, the variance of the
        centered values, and the output."""
        row = ct.bid(0)
        chunks = ct.cdiv(n, C)
        acc: ct.Tile = ct.zeros((1, C), f32)
        for j in range(chunks):
            acc = acc + ct.load(x, (row, j), (1, C)).astype(f32)
        mean = ct.sum(acc, axis=1, keepdims=True) * inv_n
        sq: ct.Tile = ct.zeros((1, C), f32)
        for j in range(chunks):
            t = ct.load(x, (row, j), (1, C)).astype(f32)
            d = ct.where(ct.arange(C) + j * C < n, t - mean, 0.0)
            sq = sq + d * d
        r = ct.rsqrt(ct.sum(sq, axis=1, keepdims=True) * inv_n + eps)
        for j in range(chunks):
            t = ct.load(x, (row, j), (1, C)).astype(f32)
            wt = ct.load(w, (j,), (C,)).astype(f32)
            bt = ct.load(b, (j,), (C,)).astype(f32)
            ct.store(y, (0, j), ct.fma((t - mean) * r, wt, bt).astype(y.dtype))

    return layer_norm_tile, layer_norm_loop


def layer_norm_per_thread(plan: RowPlan) -> int:
    """Elements a thread of layer_norm's one-tile kernel: LAYER_NORM_WIDE_PER_THREAD on f32
    tiles of a power-of-two width past LAYER_NORM_WIDE, else the norms' rule."""
    wide = plan.width > LAYER_NORM_WIDE and plan.width & (plan.width - 1) == 0
    if plan.itemsize == 4 and wide:
        return LAYER_NORM_WIDE_PER_THREAD
    return per_thread(plan)


def _launch_rows(
    family: Callable[[type[ct.DType], int], tuple[Any, ...]],
    first: int,
    outs: int,
    rows: Tensor[Any, Any],
    *args: Any,
    per: Callable[[RowPlan], int] | None = None,
) -> tuple[Tensor[Any, Any], ...]:
    """Launch the one-tile or the chunked kernel of `family` (at `first`, see `row_launch`)
    over `rows` (R, N) with `outs` fresh outputs of its shape, `per(plan)` elements a thread;
    returns them (2-D)."""
    launch = row_launch(family, first, rows, ONE_PASS_CAP, per)
    result = launch.kernel(*launch.outputs(outs, rows), rows, *args, *launch.extra).sync()
    return tuple(p.unpartition() for p in result[:outs])


def rms_norm(x: Tensor[Any, Any], weight: Tensor[Any, Any], eps: float = 1e-6) -> Tensor[Any, Any]:
    """`y = x / sqrt(mean(x², last axis) + eps) * weight`, same shape and dtype as `x`.

    `x` is (..., N) and `weight` (N,), f32, f16 or bf16 (both the same); f32 arithmetic."""
    dt = check_float("rms_norm", x, weight)
    rows = as_rows("rms_norm", x)
    n = rows.shape[1]
    check_shape("rms_norm", "weight", weight, (n,))
    if rows.size == 0:
        return ct.zeros(x.shape, dt)
    (y,) = _launch_rows(_rms_kernels, 0, 1, rows, weight, 1.0 / n, float(eps))
    return as_shape(y, x.shape)


def add_rms_norm(
    x: Tensor[Any, Any], residual: Tensor[Any, Any], weight: Tensor[Any, Any], eps: float = 1e-6
) -> tuple[Tensor[Any, Any], Tensor[Any, Any]]:
    """`h = x + residual` (rounded to the dtype); returns `(rms_norm(h, weight, eps), h)`."""
    dt = check_float("add_rms_norm", x, residual, weight)
    check_shape("add_rms_norm", "residual", residual, x.shape)
    rows = as_rows("add_rms_norm", x)
    n = rows.shape[1]
    check_shape("add_rms_norm", "weight", weight, (n,))
    if rows.size == 0:
        return ct.zeros(x.shape, dt), ct.zeros(x.shape, dt)
    res = view(residual, rows.shape)
    y, h = _launch_rows(_rms_kernels, 2, 2, rows, res, weight, 1.0 / n, float(eps))
    return as_shape(y, x.shape), as_shape(h, x.shape)


def layer_norm(
    x: Tensor[Any, Any], weight: Tensor[Any, Any], bias: Tensor[Any, Any], eps: float = 1e-5
) -> Tensor[Any, Any]:
    """`y = (x - mean) / sqrt(var + eps) * weight + bias` over the last axis, where
    `var = mean((x - mean)²)` (computed from the centered values, f32 arithmetic)."""
    dt = check_float("layer_norm", x, weight, bias)
    rows = as_rows("layer_norm", x)
    n = rows.shape[1]
    check_shape("layer_norm", "weight", weight, (n,))
    check_shape("layer_norm", "bias", bias, (n,))
    if rows.size == 0:
        return ct.zeros(x.shape, dt)
    (y,) = _launch_rows(_layer_norm_kernels, 0, 1, rows, weight, bias, n, 1.0 / n, float(eps),
                        per=layer_norm_per_thread)  # fmt: skip
    return as_shape(y, x.shape)
