"""Row-wise `softmax` (optionally causal) and `argmax` over the last axis.

Softmax reads rows of up to `ONE_PASS_CAP` elements once, held in registers (one row per
block for long rows, about 32 elements per thread, 64 at the cap); longer rows are read in
chunks: a running maximum and a rescaled running sum per lane (two passes). argmax of a long
row keeps a running (value, chunk) per lane and reduces once at the end.
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
    as_shape,
    check_float,
    empty_partition,
    next_pow2,
    per_dtype_warps,
    prev_pow2,
    row_plan,
)

BR = TypeVar("BR")  # rows per block
T = TypeVar("T")  # tile width (>= the row length)
W = TypeVar("W")  # the row length (one-row-per-block kernels)
ONE = TypeVar("ONE")  # 1: argmax writes one index per row

NEG_INF = -math.inf
INT32_MAX = 2**31 - 1
#: The longest row softmax holds in registers (64 f32 per thread of 512 at 32768: 92
#: registers on sm_90, no spills); longer rows take the chunked kernel.
ONE_PASS_CAP = 32768
#: Elements per thread the one-pass kernel aims at (fewer threads per row: fewer shuffle and
#: shared-memory steps per element in the row reductions).
PER_THREAD = 32
#: Warps per block at most (16: a 32768-element row in 512 threads).
MAX_WARPS = 16
#: Causal rows this wide or wider are read in CAUSAL_CHUNKS chunks, of which those wholly
#: masked are not read (at most one partly masked chunk per row is).
CAUSAL_MIN_WIDTH = 256
CAUSAL_CHUNKS = 8
#: Warps per block of the causal kernel where its rows are short enough to share a block.
#: Timed on an H200 at 1, 2, 4 and 8 (`paper_repro.row_sweep --kernels softmax_causal`): 1
#: was the fastest at both 16 x 1024^2 and 4 x 2048^2 f32, 1.2% ahead of 4.
CAUSAL_WARPS = 1
#: The causal kernel reads the chunk each row ends in element by element, its visible part
#: only (`softmax_causal`'s EXACT): bytes read are those of the visible triangle (blocks that
#: cross from one matrix into the next excepted: see the kernel), where whole chunks read
#: half a chunk a row more (1.04x the ideal bytes at 16 x 1024^2 and 1 x 4096^2 f32, where
#: an H200 ran the whole-chunk kernel 1.6% and 2.4% behind Triton's, whose masked loads read
#: the triangle exactly).
CAUSAL_EXACT = True


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


_SOFTMAX: dict[tuple[str, int], tuple[Any, Any, Any]] = {}


def _softmax_kernels(dt: type[ct.DType], warps: int) -> tuple[Any, Any, Any]:
    """The one-pass and the chunked softmax kernels for `dt`, the first in blocks of `warps`
    warps (the chunked one lets the compiler choose); made once per (dtype, warps)."""
    key = (dt.name, warps)
    if key not in _SOFTMAX:
        _SOFTMAX[key] = _make_softmax_kernels(dt, warps)
    return _SOFTMAX[key]


def _make_softmax_kernels(dt: type[ct.DType], warps: int) -> tuple[Any, Any, Any]:
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

    @ct.kernel(num_warps=warps)
    def softmax_causal(
        y: Mut[Tensor[Elem, BR, T]],
        x: Tensor[Elem, Dyn, Dyn],
        n: int,
        C: ConstInt,
        EXACT: ConstInt,
    ) -> None:
        """Causal softmax of BR rows, in the CAUSAL_CHUNKS chunks of C columns of their tile:
        a chunk past the last visible column of every row of the block (a row's index
        within its n x n matrix) is not read, and is written as zeros, with no arithmetic
        on it (a branch per chunk, the block's choice: 1.0 and 3.6 fewer sm_90 SASS
        instructions an element at 16 x 1024^2, f32 and bf16, registers unchanged); the
        rest as softmax_tile.
        Every chunk's load is issued before any is used: a use inside the branch that
        guards a load would make the warp wait for each chunk in turn. With
        EXACT, the chunk a row ends in is read element by element, its visible part only
        (as Triton's masked loads read it), and the chunks before it whole: where the
        block's rows all end in one chunk (its rows divide the chunk and n: every
        power-of-two n at CAUSAL_WARPS 1), no byte past a row's end is read. A block that
        crosses into the next matrix, or whose rows end in different chunks, reads a chunk
        that one of its rows reads whole for all its rows (3 x 257^2 f32: 1.005x the
        visible bytes). Without EXACT, that chunk is read whole (on average half a chunk a
        row past its end)."""
        br = y.shape[0]
        first = (ct.bid(0) * br) % n + 1  # the first row's limit (the scalar's one division)
        # A block crosses into the next matrix at most once (br < n: see softmax_launch).
        limits = ct.expand_dims(ct.arange(br), 1) + first
        limits = ct.where(limits > n, limits - n, limits)
        low = first  # the least of the rows' limits, and reach the largest, unless the
        reach = first + br - 1  # block crosses into the next matrix, whose rows see fewer
        if reach > n:  # columns
            low = 1
            reach = n
        r0, r1 = _chunk(x, 0, C, br, reach, EXACT), _chunk(x, 1, C, br, reach, EXACT)
        r2, r3 = _chunk(x, 2, C, br, reach, EXACT), _chunk(x, 3, C, br, reach, EXACT)
        r4, r5 = _chunk(x, 4, C, br, reach, EXACT), _chunk(x, 5, C, br, reach, EXACT)
        r6, r7 = _chunk(x, 6, C, br, reach, EXACT), _chunk(x, 7, C, br, reach, EXACT)
        ends = (limits - 1) // C  # the chunk each row ends in
        tail: ct.Tile = r0  # unused without EXACT
        if EXACT:
            rows = ct.expand_dims(ct.arange(br), 1) + ct.bid(0) * br
            cols = ends * C + ct.expand_dims(ct.arange(C), 0)
            # A column past the row's end becomes one past x's: not read, -inf.
            tail = ct.gather(x, (rows, ct.where(cols < limits, cols, n)), padding=NEG_INF)
        t0 = _visible(r0, 0, C, limits, low, reach, ends, tail, EXACT)  # row 0 sees chunk 0
        t1, big = _max_seen(t0, r1, 1, C, limits, low, reach, ends, tail, EXACT)
        t2, big = _max_seen(big, r2, 2, C, limits, low, reach, ends, tail, EXACT)
        t3, big = _max_seen(big, r3, 3, C, limits, low, reach, ends, tail, EXACT)
        t4, big = _max_seen(big, r4, 4, C, limits, low, reach, ends, tail, EXACT)
        t5, big = _max_seen(big, r5, 5, C, limits, low, reach, ends, tail, EXACT)
        t6, big = _max_seen(big, r6, 6, C, limits, low, reach, ends, tail, EXACT)
        t7, big = _max_seen(big, r7, 7, C, limits, low, reach, ends, tail, EXACT)
        m = ct.max(big, axis=1, keepdims=True)
        e0 = ct.exp(t0 - m)
        e1, total = _exp_seen(e0, t1, m, 1, C, reach)
        e2, total = _exp_seen(total, t2, m, 2, C, reach)
        e3, total = _exp_seen(total, t3, m, 3, C, reach)
        e4, total = _exp_seen(total, t4, m, 4, C, reach)
        e5, total = _exp_seen(total, t5, m, 5, C, reach)
        e6, total = _exp_seen(total, t6, m, 6, C, reach)
        e7, total = _exp_seen(total, t7, m, 7, C, reach)
        inv = 1.0 / ct.sum(total, axis=1, keepdims=True)
        _store_seen(y, 0, e0, inv, C, reach)
        _store_seen(y, 1, e1, inv, C, reach)
        _store_seen(y, 2, e2, inv, C, reach)
        _store_seen(y, 3, e3, inv, C, reach)
        _store_seen(y, 4, e4, inv, C, reach)
        _store_seen(y, 5, e5, inv, C, reach)
        _store_seen(y, 6, e6, inv, C, reach)
        _store_seen(y, 7, e7, inv, C, reach)

    return softmax_tile, softmax_loop, softmax_causal


@ct.function
def _chunk(x: Tensor[Any, Any, Any], j: int, c: int, br: int, reach: int, exact: int) -> ct.Tile:
    """Chunk j (br rows of the block, c columns) as stored, -inf past x's edge, where some
    row of the block sees it (with `exact`: sees it whole, the chunk a row ends in being
    read element by element). Any other chunk is addressed past the end of the row instead
    (CAUSAL_CHUNKS chunks on), where the load's edge mask reads the padding and touches no
    memory: no branch, so every chunk's load issues before any is used."""
    at = j if (j + exact) * c < reach else j + CAUSAL_CHUNKS
    return ct.load(x, (ct.bid(0), at), (br, c), padding=NEG_INF)


@ct.function
def _visible(
    t: ct.Tile,
    j: int,
    c: int,
    limits: ct.Tile,
    low: int,
    reach: int,
    ends: ct.Tile,
    tail: ct.Tile,
    exact: int,
) -> ct.Tile:
    """Chunk j in f32, -inf from each row's `limits` on: compared only where some row of the
    block ends inside it (between `low` and `reach`, the least and the largest limit), one
    compare per element there (the chunk's offset moved to the row's side); with `exact`,
    the rows that end in it take `tail`, their element-wise read of it. After every chunk's
    load: the branch makes no warp wait for a load it has not yet issued."""
    out = t.astype(f32)
    if (j + 1) * c + exact > low and j * c < reach:
        if exact:
            out = ct.where(ends == j, tail.astype(f32), out)
        out = ct.where(ct.expand_dims(ct.arange(c), 0) < limits - j * c, out, NEG_INF)
    return out


@ct.function
def _max_seen(
    big: ct.Tile,
    t: ct.Tile,
    j: int,
    c: int,
    limits: ct.Tile,
    low: int,
    reach: int,
    ends: ct.Tile,
    tail: ct.Tile,
    exact: int,
) -> tuple[ct.Tile, ct.Tile]:
    """(chunk j in f32 as `_visible` makes it, big and it element-wise) where some row of
    the block sees chunk j, else (big, big): the first is then not used."""
    v = big
    out = big
    if j * c < reach:
        v = _visible(t, j, c, limits, low, reach, ends, tail, exact)
        out = ct.maximum(big, v)
    return v, out


@ct.function
def _exp_seen(
    total: ct.Tile, t: ct.Tile, m: ct.Tile, j: int, c: int, reach: int
) -> tuple[ct.Tile, ct.Tile]:
    """(exp(t - m), total plus it) where some row of the block sees chunk j, else (total,
    total): the first is then not used (`_store_seen` writes zeros)."""
    e = total
    out = total
    if j * c < reach:
        e = ct.exp(t - m)
        out = total + e
    return e, out


@ct.function
def _store_seen(
    y: Mut[Tensor[Any, Any, Any]], j: int, e: ct.Tile, inv: ct.Tile, c: int, reach: int
) -> None:
    """Chunk j of the output: e * inv where some row of the block sees it, else zeros."""
    if j * c < reach:
        ct.store(y, (0, j), (e * inv).astype(y.dtype))
    else:
        ct.store(y, (0, j), ct.zeros(e.shape, y.dtype))


#: Elements of a chunk each thread of the chunked argmax holds: its warps are chunk / (32 * this).
ARGMAX_CHUNK_PER_THREAD = 16


@per_dtype_warps
def _argmax_kernels(dt: type[ct.DType], warps: int) -> tuple[Any, Any]:
    """The one-tile and the chunked argmax kernels for `dt`, in blocks of `warps` warps."""
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel(num_warps=warps)
    def argmax_tile(y: Mut[Tensor[i32, BR, ONE]], x: Tensor[Elem, Dyn, Dyn], TW: ConstInt) -> None:
        """y[r] = the first index of the row's maximum (padding reads -inf)."""
        t = ct.load(x, (ct.bid(0), 0), (y.shape[0], TW), padding=NEG_INF)
        y.store(ct.argmax(t, axis=1, keepdims=True))

    @ct.kernel(num_warps=warps)
    def argmax_loop(y: Mut[Tensor[i32, BR, ONE]], x: Tensor[Elem, Dyn, Dyn], C: ConstInt) -> None:
        """argmax of one long row in chunks of C. Each position p of the chunk keeps the best
        value at p, p + C, p + 2C, ... and the chunk it came from, element-wise (no reduction
        per chunk): a later chunk takes it only if strictly greater, or a NaN over a number,
        so the first maximum (the first NaN) is kept. One reduction at the end picks the
        lowest index among the positions holding the row's maximum (its NaNs, if any)."""
        best: ct.Tile = ct.full((1, C), NEG_INF, f32)
        best_j: ct.Tile = ct.zeros((1, C), i32)
        for j in range(ct.cdiv(x.shape[1], C)):
            t = ct.load(x, (ct.bid(0), j), (1, C), padding=NEG_INF).astype(f32)
            take = ~(t <= best) & (best == best)  # t > best, or t NaN and best not
            best = ct.where(take, t, best)
            best_j = ct.where(take, j, best_j)
        m = ct.max(best, axis=1, keepdims=True)  # NaN if the row has one
        hit = (best == m) | (best != best)
        index = best_j * C + ct.expand_dims(ct.arange(C), 0)
        y.store(ct.min(ct.where(hit, index, INT32_MAX), axis=1, keepdims=True))

    return argmax_tile, argmax_loop


def argmax_launch(dt: type[ct.DType], r: int, n: int) -> tuple[Any, int, int]:
    """The argmax kernel for (r, n) rows, its rows per block, and its width argument: rows
    that fit one tile take argmax_tile with PER_THREAD elements per thread (fewer threads per
    row: fewer cross-thread steps per element), longer rows argmax_loop with
    ARGMAX_CHUNK_PER_THREAD elements of each chunk per thread."""
    plan = row_plan(r, n, dt)
    if plan.loop:
        warps = min(MAX_WARPS, prev_pow2(max(1, plan.width // (32 * ARGMAX_CHUNK_PER_THREAD))))
        return _argmax_kernels(dt, warps)[1], 1, plan.width
    warps = min(MAX_WARPS, prev_pow2(max(1, plan.rows * plan.width // (32 * PER_THREAD))))
    return _argmax_kernels(dt, warps)[0], plan.rows, plan.width


def softmax_launch(
    dt: type[ct.DType], r: int, n: int, causal: bool
) -> tuple[Any, tuple[int, int], tuple[Any, ...]]:
    """The softmax kernel for (r, n) rows, its output's tile shape, and its arguments after
    the output and x: causal rows of at least CAUSAL_MIN_WIDTH (one tile) take the kernel that
    skips their masked chunks, other rows that fit one tile softmax_tile, longer rows the
    chunked kernel."""
    plan, warps = softmax_plan(r, n, dt)
    if plan.loop:
        _, loop_k, _ = _softmax_kernels(dt, 1)
        return loop_k, (1, -(-n // plan.width) * plan.width), (n, causal, plan.width)
    if causal and plan.width >= CAUSAL_MIN_WIDTH:
        # Chunks CAUSAL_WARPS warps wide: 32 lanes of 16-byte vectors over the rows of the
        # block (a row a warp at 1024 f32, two rows of 16-bit elements). One warp a block caps
        # an SM at 32 warps (its 32 blocks), half of Hopper's 64, and still ran the fastest.
        # n > width / 2 >= 128 and rows <= 32 * 8 * CAUSAL_WARPS / 32: a block crosses at
        # most one matrix boundary (up to CAUSAL_WARPS = 16).
        # A power-of-two tile even where n is a multiple of 32 that is not one: the columns
        # past n cost no bytes (no row's limit passes n), where chunks of n / 8 (48 at 384)
        # made 5 rows a block of 16-bit elements and spilled (255 registers).
        width = next_pow2(plan.width)
        c = width // CAUSAL_CHUNKS
        vec = 16 // dt.itemsize()
        rows = max(1, min(next_pow2(r), 32 * vec * CAUSAL_WARPS // c))
        warps = min(MAX_WARPS, prev_pow2(max(1, rows * c // (32 * vec))))  # no replicas
        _, _, causal_k = _softmax_kernels(dt, warps)
        return causal_k, (rows, width), (n, c, int(CAUSAL_EXACT))
    tile_k, _, _ = _softmax_kernels(dt, warps)
    return tile_k, (plan.rows, plan.width), (n, causal)


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
    kernel, tile, tail = softmax_launch(dt, r, n, bool(causal))
    y, *_ = kernel(empty_partition((r, n), dt, tile), rows, *tail).sync()
    return as_shape(y.unpartition(), x.shape)


def argmax(x: Tensor[Any, Any]) -> Tensor[Any, Any]:
    """`argmax(x, axis=-1)` as int32, shape `x.shape[:-1]`: as NumPy's, the first index of
    the maximum, or of the first NaN in a row that has one (zeros of either sign are equal)."""
    dt = check_float("argmax", x)
    rows = as_rows("argmax", x)
    r, n = rows.shape
    if r == 0:
        return ct.zeros(x.shape[:-1], i32)
    if n == 0:  # as NumPy
        raise ValueError(f"argmax: rows of x {x.shape} are empty; an empty row has no argmax")
    kernel, rows_per_block, width = argmax_launch(dt, r, n)
    out = ct.empty((r, 1), i32).partition((rows_per_block, 1))
    y, *_ = kernel(out, rows, width).sync()
    result: Tensor[Any, Any] = y.unpartition().reshape(x.shape[:-1])
    return result
