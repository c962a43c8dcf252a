"""`attention(q, k, v)`: fused flash attention (online softmax), causal or not, grouped-query.

Grouped-query heads share their K/V loads: q (heads, S_q, D) is viewed as (kv_heads, G·S_q, D)
(the G = heads / kv_heads query heads of one kv head are adjacent), so one block multiplies the
rows of all G heads by each K/V tile it loads; row r is query r % S_q. Scores are kept in base 2
(q kᵀ · scale · log2 e, then `exp2`). The valid key count is read from a device tensor, so a
captured decode step attends over a KV cache whose length changes between replays.

Long queries (G·S_q > one block of rows) run one block per row tile over all its K/V blocks;
blocks above the causal diagonal are never loaded. Short queries (decoding) split the keys over
several blocks, each writing an unnormalized partial (acc, running max m, running sum l), and a
merge kernel combines the partials: o = Σ_s 2^(m_s - M) acc_s / Σ_s 2^(m_s - M) l_s.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32, i32
from cutile_py_kernels._common import ConstInt, Elem, check_float, per_dtype_warps, view

ONE = TypeVar("ONE")  # one kv head (or one split of one) per block
BM = TypeVar("BM")  # query rows per block
D = TypeVar("D")  # head_dim
ONECOL = TypeVar("ONECOL")  # 1: the per-row statistics m and l

NEG_INF = -math.inf
LOG2E = 1.4426950408889634
#: Rows of queries per block (multiples of 16: the mma tile) and keys per K/V step, for
#: queries of at most BLOCK_M rows per kv head (decoding, short prefills: these may split).
BLOCK_M = 32
BLOCK_N = 32
#: (query rows, keys per K/V step, warps) of the flash kernel for longer queries, per head_dim:
#: the largest tile that ptxas (nvJitLink) assembles with no spills for both sm_80 and sm_90,
#: among 32x32, 64x32, 64x64, 128x32 and 128x64 at 4, 8 or the compiler's warps (f16):
#:   head_dim 64:  64x64 at 8 warps: 255 registers, no spills (64x64 at 4 warps spills
#:                 ~1.9 KB; 128x32 20-52 bytes; 128x64 ~1.9 KB);
#:   head_dim 128: 32x32 (8 warps: 187-196 registers); 64x32 spills 32-60 bytes, 64x64 and
#:                 128-row tiles ~2-8 KB.
#: tests/test_attention.py checks these still assemble without spills.
FLASH_TILES: dict[int, tuple[int, int, int]] = {64: (64, 64, 8)}
#: Key blocks per split at least, in the split-KV path (fewer splits when the keys are few).
MIN_BLOCKS_PER_SPLIT = 2
MAX_SPLITS = 16


@per_dtype_warps
def _attention_kernels(dt: type[ct.DType], warps: int) -> tuple[Any, Any, Any]:
    """(flash, split, merge) for dtype `dt`, flash and split with `warps` warps per block (0:
    the compiler's choice)."""
    nw = warps or None
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.function
    def attend(
        qt: ct.Tile,
        k: Tensor[Elem, Dyn, Dyn, Dyn],
        v: Tensor[Elem, Dyn, Dyn, Dyn],
        kvh: int,
        r0: int,
        j0: int,
        j1: int,
        sk: int,
        sq: int,
        causal: bool,
        scale2: float,
        bm: int,
        bn: int,
        d: int,
    ) -> tuple[ct.Tile, ct.Tile, ct.Tile]:
        """Online softmax of rows r0.. of qt over key blocks j0 <= j < j1: the unnormalized
        f32 accumulator Σ 2^(s - m) v, the running row maximum m (base 2) and the sum l."""
        rows = ct.expand_dims(ct.arange(bm), 1) + r0
        # Query i sees keys j <= i + sk - sq (bottom-right aligned); keys >= sk never.
        # (Kernels have no conditional expressions.)
        if causal:  # noqa: SIM108
            limit = ct.minimum(rows % sq + (sk - sq), sk - 1)
        else:
            limit = rows * 0 + (sk - 1)
        acc: ct.Tile = ct.zeros((bm, d), f32)
        m: ct.Tile = ct.full((bm, 1), NEG_INF, f32)
        l: ct.Tile = ct.zeros((bm, 1), f32)
        for j in range(j0, j1):
            kt = ct.load(k, (kvh, j, 0), (1, bn, d)).reshape((bn, d))
            s = ct.mma(qt, kt.T, ct.zeros((bm, bn), f32)) * scale2
            cols = ct.expand_dims(ct.arange(bn), 0) + j * bn
            s = ct.where(cols <= limit, s, NEG_INF)
            m_new = ct.maximum(m, ct.max(s, axis=1, keepdims=True))
            # A row that has seen no key yet keeps m = -inf: subtract 0 instead (no NaN).
            base = ct.where(m_new == NEG_INF, 0.0, m_new)
            p = ct.exp2(s - base)
            alpha = ct.exp2(m - base)
            l = l * alpha + ct.sum(p, axis=1, keepdims=True)
            vt = ct.load(v, (kvh, j, 0), (1, bn, d)).reshape((bn, d))
            acc = ct.mma(p.astype(qt.dtype), vt, acc * alpha)
            m = m_new
        return acc, m, l

    @ct.function
    def key_blocks(r0: int, rows: int, sk: int, sq: int, causal: bool, bm: int, bn: int) -> int:
        """How many key blocks rows r0 .. r0+bm-1 (of `rows`) need: all of sk, or with
        `causal` up to the last key their latest query sees."""
        n = ct.cdiv(sk, bn)
        if causal:
            r1 = ct.minimum(r0 + bm, rows) - 1
            last = sq - 1
            if r0 // sq == r1 // sq:
                last = r1 % sq
            n = ct.minimum(n, ct.cdiv(last + sk - sq + 1, bn))
        return n

    @ct.kernel(num_warps=nw)
    def flash_kernel(
        o: Mut[Tensor[Elem, ONE, BM, D]],
        q: Tensor[Elem, Dyn, Dyn, Dyn],
        k: Tensor[Elem, Dyn, Dyn, Dyn],
        v: Tensor[Elem, Dyn, Dyn, Dyn],
        kv_len: Tensor[i32, Dyn],
        len_offset: int,
        sq: int,
        causal: bool,
        scale2: float,
        BN: ConstInt,
    ) -> None:
        """o = softmax2(q kᵀ · scale2) v for BM rows of kv head bid(0)'s query rows (queries
        of its G heads, row r being query r % sq), over the first kv_len[0] + len_offset keys."""
        bm, d = o.shape[1], o.shape[2]
        bn = BN
        kvh = ct.bid(0)
        r0 = ct.bid(1) * bm
        sk = int(ct.load(kv_len, (0,), (1,)).item()) + len_offset
        qt = ct.load(q, (kvh, ct.bid(1), 0), (1, bm, d)).reshape((bm, d))
        n = key_blocks(r0, q.shape[1], sk, sq, causal, bm, bn)
        acc, _m, l = attend(qt, k, v, kvh, r0, 0, n, sk, sq, causal, scale2, bm, bn, d)
        # A row that sees no key (only padding rows past the queries) writes 0, not NaN.
        out = acc / ct.where(l == 0.0, 1.0, l)
        o.store(out.astype(o.dtype).reshape((1, bm, d)))

    @ct.kernel(num_warps=nw)
    def split_kernel(
        acc_out: Mut[Tensor[f32, ONE, BM, D]],
        m_out: Mut[Tensor[f32, ONE, BM, ONECOL]],
        l_out: Mut[Tensor[f32, ONE, BM, ONECOL]],
        q: Tensor[Elem, Dyn, Dyn, Dyn],
        k: Tensor[Elem, Dyn, Dyn, Dyn],
        v: Tensor[Elem, Dyn, Dyn, Dyn],
        kv_len: Tensor[i32, Dyn],
        len_offset: int,
        sq: int,
        causal: bool,
        scale2: float,
        splits: int,
        BN: ConstInt,
    ) -> None:
        """Split s = bid(0) % splits of kv head bid(0) // splits: the partial (acc, m, l) of
        all the head's query rows (one block of them) over its share of the key blocks."""
        bm, d = acc_out.shape[1], acc_out.shape[2]
        bn = BN
        kvh = ct.bid(0) // splits
        split = ct.bid(0) % splits
        sk = int(ct.load(kv_len, (0,), (1,)).item()) + len_offset
        qt = ct.load(q, (kvh, 0, 0), (1, bm, d)).reshape((bm, d))
        n = key_blocks(0, q.shape[1], sk, sq, causal, bm, bn)
        per = ct.cdiv(n, splits)
        j0 = ct.minimum(split * per, n)
        j1 = ct.minimum(j0 + per, n)
        acc, m, l = attend(qt, k, v, kvh, 0, j0, j1, sk, sq, causal, scale2, bm, bn, d)
        acc_out.store(acc.reshape((1, bm, d)))
        m_out.store(m.reshape((1, bm, 1)))
        l_out.store(l.reshape((1, bm, 1)))

    @ct.kernel
    def merge_kernel(
        o: Mut[Tensor[Elem, ONE, BM, D]],
        acc_in: Tensor[f32, Dyn, Dyn, Dyn],
        m_in: Tensor[f32, Dyn, Dyn, Dyn],
        l_in: Tensor[f32, Dyn, Dyn, Dyn],
        splits: int,
    ) -> None:
        """o = Σ_s 2^(m_s - M) acc_s / Σ_s 2^(m_s - M) l_s over the splits of kv head bid(0)
        (M the running maximum; splits that saw no key have m_s = -inf and weigh 0)."""
        bm, d = o.shape[1], o.shape[2]
        acc: ct.Tile = ct.zeros((bm, d), f32)
        m: ct.Tile = ct.full((bm, 1), NEG_INF, f32)
        l: ct.Tile = ct.zeros((bm, 1), f32)
        for s in range(splits):
            part = ct.bid(0) * splits + s
            ms = ct.load(m_in, (part, 0, 0), (1, bm, 1)).reshape((bm, 1))
            m_new = ct.maximum(m, ms)
            base = ct.where(m_new == NEG_INF, 0.0, m_new)
            alpha = ct.exp2(m - base)
            beta = ct.exp2(ms - base)
            ls = ct.load(l_in, (part, 0, 0), (1, bm, 1)).reshape((bm, 1))
            accs = ct.load(acc_in, (part, 0, 0), (1, bm, d)).reshape((bm, d))
            l = l * alpha + ls * beta
            acc = acc * alpha + accs * beta
            m = m_new
        out = acc / ct.where(l == 0.0, 1.0, l)
        o.store(out.astype(o.dtype).reshape((1, bm, d)))

    return flash_kernel, split_kernel, merge_kernel


def check_attention(
    q: Tensor[Any, Any], k: Tensor[Any, Any], v: Tensor[Any, Any]
) -> tuple[type[ct.DType], int]:
    """The dtype and the group size G of valid attention inputs, else TypeError/ValueError."""
    dt = check_float("attention", q, k, v)
    if dt is f32:
        raise TypeError("attention: expected f16 or bf16 tensors (f32 sums), got f32")
    if len(q.shape) != 3 or len(k.shape) != 3 or k.shape != v.shape:
        raise ValueError(
            "attention: expected q (heads, S_q, D), k and v (kv_heads, S_k, D), got "
            f"{q.shape}, {k.shape}, {v.shape}"
        )
    heads, _, d = q.shape
    kv_heads = k.shape[0]
    if k.shape[2] != d or kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            "attention: q's heads must be a multiple of k's and head_dims must agree: "
            f"q {q.shape}, k {k.shape}"
        )
    if d % 16:
        raise ValueError(f"attention: head_dim must be a multiple of 16 (mma), got {d}")
    return dt, heads // kv_heads


def block_m(rows: int) -> int:
    """Query rows per block for `rows` (at most BLOCK_M) rows per kv head: 16 (the mma's M)
    for a decode step's few rows, else BLOCK_M."""
    return 16 if rows <= 16 else BLOCK_M


def attention_tile(rows: int, d: int) -> tuple[int, int, int]:
    """(query rows per block, keys per K/V step, warps per block; 0: the compiler's choice)
    for `rows` query rows per kv head at head_dim `d`."""
    if rows <= BLOCK_M:
        return block_m(rows), BLOCK_N, 0
    return FLASH_TILES.get(d, (BLOCK_M, BLOCK_N, 0))


class AttentionPlan:
    """The launches of one attention shape: the flash kernel, or split-KV plus merge.

    `op(o, q_rows, k, v, kv_len, len_offset)` builds the op over the first
    kv_len[0] + len_offset keys of k and v (kv_len: an int32 device tensor, so a captured
    graph reads the current length; k and v may be longer, a KV cache); q_rows is q viewed as
    (kv_heads, G·S_q, D), o is (kv_heads, G·S_q, D) partitioned by `partition`."""

    def __init__(
        self,
        dt: type[ct.DType],
        kv_heads: int,
        rows: int,
        sq: int,
        d: int,
        max_keys: int,
        causal: bool,
        scale: float,
    ) -> None:
        self.dt, self.kv_heads, self.rows, self.sq, self.d = dt, kv_heads, rows, sq, d
        self.causal, self.scale2 = causal, scale * LOG2E
        self.bm, self.bn, self.warps = attention_tile(rows, d)
        blocks = -(-max_keys // self.bn)
        # Short queries (one row block) leave most SMs idle with one block per kv head:
        # split the keys so that each block still walks a few K/V tiles.
        self.splits = 1
        if rows <= BLOCK_M:
            self.splits = max(1, min(MAX_SPLITS, blocks // MIN_BLOCKS_PER_SPLIT))

    def partition(self) -> ct.Partition:
        out: ct.Partition = ct.empty((self.kv_heads, self.rows, self.d), self.dt).partition(
            (1, self.bm, self.d)
        )
        return out

    def op(
        self,
        o: ct.Partition,
        q_rows: Tensor[Any, Any],
        k: Tensor[Any, Any],
        v: Tensor[Any, Any],
        kv_len: Tensor[Any, Any],
        len_offset: int = 0,
    ) -> ct.OpLike:
        flash, split, merge = _attention_kernels(self.dt, self.warps)
        if self.splits == 1:
            op: ct.OpLike = flash(
                o, q_rows, k, v, kv_len, len_offset, self.sq, self.causal, self.scale2, self.bn
            )
            return op
        parts = self.kv_heads * self.splits
        acc = ct.empty((parts, self.bm, self.d), f32).partition((1, self.bm, self.d))
        m = ct.empty((parts, self.bm, 1), f32).partition((1, self.bm, 1))
        l = ct.empty((parts, self.bm, 1), f32).partition((1, self.bm, 1))
        first = split(
            acc,
            m,
            l,
            q_rows,
            k,
            v,
            kv_len,
            len_offset,
            self.sq,
            self.causal,
            self.scale2,
            self.splits,
            self.bn,
        )
        splits = self.splits

        def combine(res: tuple[Any, ...]) -> ct.OpLike:
            a, mm, ll = (p.unpartition() for p in res[:3])
            step: ct.OpLike = merge(o, a, mm, ll, splits)
            return step

        chained: ct.OpLike = first.then(combine)
        return chained


def attention(
    q: Tensor[Any, Any],
    k: Tensor[Any, Any],
    v: Tensor[Any, Any],
    causal: bool = True,
    scale: float | None = None,
) -> Tensor[Any, Any]:
    """`o[h] = softmax(q[h] k[g]ᵀ · scale) v[g]` with g = h // (heads / kv_heads), for q
    (heads, S_q, D) and k, v (kv_heads, S_k, D), f16 or bf16 (f32 sums); `scale` defaults
    to 1/√D. With `causal`, query i sees keys j <= i + S_k - S_q (bottom-right aligned; a
    query that sees no key gives 0). Returns o (heads, S_q, D) in the inputs' dtype."""
    dt, group = check_attention(q, k, v)
    heads, sq, d = q.shape
    kv_heads, sk, _ = k.shape
    if heads * sq * d == 0:
        return ct.zeros(q.shape, dt)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    plan = AttentionPlan(dt, kv_heads, group * sq, sq, d, sk, bool(causal), scale)
    kv_len = ct.from_numpy(np.array([sk], dtype=np.int32))
    q_rows = view(q, (kv_heads, group * sq, d))
    res = plan.op(plan.partition(), q_rows, k, v, kv_len).sync()
    result: Tensor[Any, Any] = res[0].unpartition().reshape(q.shape)
    return result
