"""Triton peers, written for this harness in the style of the Triton tutorials: vector add,
GELU (tanh form), row softmax (optionally causal), RMSNorm, RoPE, a matrix-vector product
and a grouped-order matmul.

Imported only where Triton is installed. Each wrapper writes into a preallocated output so
that the timing measures the kernel, not an allocation.
"""

# mypy: disable-error-code="no-untyped-def,misc,untyped-decorator"

from __future__ import annotations

from typing import Any

import triton  # type: ignore[import-not-found, import-untyped, unused-ignore]
import triton.language as tl  # type: ignore[import-not-found, import-untyped, unused-ignore]

from paper_repro.peers import row_warps


@triton.jit
def _add_kernel(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(z_ptr + offs, x + y, mask=mask)


def add(x: Any, y: Any, z: Any) -> Any:
    """z = x + y (1-D, any float dtype)."""
    n = x.numel()
    block = 1024
    _add_kernel[(triton.cdiv(n, block),)](x, y, z, n, BLOCK=block)
    return z


@triton.jit
def _gelu_kernel(x_ptr, z_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    # tanh(u) = 1 - 2 / (exp(2u) + 1): tl has no tanh outside libdevice.
    t = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
    tl.store(z_ptr + offs, (0.5 * x * (1.0 + t)).to(z_ptr.dtype.element_ty), mask=mask)


def gelu(x: Any, z: Any) -> Any:
    """z = GELU(x), the tanh form (1-D, any float dtype)."""
    n = x.numel()
    block = 1024
    _gelu_kernel[(triton.cdiv(n, block),)](x, z, n, BLOCK=block)
    return z


_row_warps = row_warps  # the rule lives where Triton need not be installed (`row_sweep`)


@triton.jit
def _softmax_kernel(out_ptr, in_ptr, n_cols, seq, CAUSAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    valid = cols < n_cols
    if CAUSAL:
        # Row `row % seq` of its (seq x seq) matrix sees columns 0..row % seq.
        valid = valid & (cols <= row % seq)
    base = row.to(tl.int64) * n_cols
    x = tl.load(in_ptr + base + cols, mask=valid, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    s = tl.sum(e, axis=0)
    y = e / s
    tl.store(out_ptr + base + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


def softmax(x: Any, out: Any, causal: bool = False) -> Any:
    """Softmax over the last axis; with `causal`, x is (..., S, S) and column > row is 0."""
    n_cols = x.shape[-1]
    rows = x.numel() // n_cols
    block = triton.next_power_of_2(n_cols)
    seq = x.shape[-2] if causal else 1
    _softmax_kernel[(rows,)](
        out, x, n_cols, seq, CAUSAL=causal, BLOCK=block, num_warps=_row_warps(block)
    )
    return out


@triton.jit
def _rms_norm_kernel(out_ptr, x_ptr, w_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    base = row.to(tl.int64) * n_cols
    x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / n_cols
    r = 1.0 / tl.sqrt(mean_sq + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + base + cols, (x * r * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: Any, weight: Any, out: Any, eps: float = 1e-6) -> Any:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    n_cols = x.shape[-1]
    rows = x.numel() // n_cols
    block = triton.next_power_of_2(n_cols)
    _rms_norm_kernel[(rows,)](out, x, weight, n_cols, eps, BLOCK=block, num_warps=_row_warps(block))
    return out


@triton.jit
def _rope_kernel(
    y_ptr,
    x_ptr,
    pos_ptr,
    fh_ptr,
    fl_ptr,
    HEADS: tl.constexpr,
    HB: tl.constexpr,
    HALF: tl.constexpr,
):
    # The library's algorithm (cutile_py_kernels.rope): the angle pos·freq in two f32 parts,
    # their cos and sin combined by the angle-sum identities; one token, HB heads a program.
    tok = tl.program_id(0)
    p = tl.load(pos_ptr + tok).to(tl.float32)
    i = tl.arange(0, HALF)
    fh = tl.load(fh_ptr + i)
    a_hi = p * fh
    a_lo = tl.fma(p, fh, -a_hi) + p * tl.load(fl_ptr + i)
    ch, sh, cl, sl = tl.cos(a_hi), tl.sin(a_hi), tl.cos(a_lo), tl.sin(a_lo)
    c = (ch * cl - sh * sl)[None, :]
    s = (sh * cl + ch * sl)[None, :]
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    offs = tok.to(tl.int64) * (HEADS * 2 * HALF) + h[:, None] * (2 * HALF) + i[None, :]
    hm = h[:, None] < HEADS
    x1 = tl.load(x_ptr + offs, mask=hm).to(tl.float32)
    x2 = tl.load(x_ptr + offs + HALF, mask=hm).to(tl.float32)
    tl.store(y_ptr + offs, (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=hm)
    tl.store(y_ptr + offs + HALF, (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=hm)


def rope_heads(heads: int, d: int) -> int:
    """Heads a program of `_rope_kernel`, as the library's: all of them up to 4096
    elements, else the most heads (a power of two) that fit."""
    if heads * d <= 4096:
        return heads
    return 1 << (max(1, 4096 // d).bit_length() - 1)


def rope(x: Any, positions: Any, freq_hi: Any, freq_lo: Any, out: Any) -> Any:
    """out = x (tokens, heads, D) rotated by `positions`, half-split layout; `freq_hi`,
    `freq_lo`: theta^(-i/half) in two f32 parts (`cutile_py_kernels.rope.frequencies`)."""
    tokens, heads, d = x.shape
    hb = rope_heads(heads, d)
    _rope_kernel[(tokens, triton.cdiv(heads, hb))](
        out, x, positions, freq_hi, freq_lo, HEADS=heads, HB=hb, HALF=d // 2, num_warps=2
    )
    return out


@triton.jit
def _gemv_kernel(y_ptr, a_ptr, x_ptr, m, k, BM: tl.constexpr, BK: tl.constexpr):
    # BM rows a program: (BM, BK) products accumulate in f32 over k, one sum at the end (the
    # library's algorithm).
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    acc = tl.zeros((BM, BK), dtype=tl.float32)
    for k0 in range(0, k, BK):
        cols = k0 + tl.arange(0, BK)
        a = tl.load(
            a_ptr + rows[:, None].to(tl.int64) * k + cols[None, :],
            mask=(rows[:, None] < m) & (cols[None, :] < k),
            other=0.0,
        )
        x = tl.load(x_ptr + cols, mask=cols < k, other=0.0)
        acc += a.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(y_ptr + rows, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=rows < m)


def gemv_tile(k: int) -> tuple[int, int]:
    """(rows, columns) of a program's step of `_gemv_kernel`, as the library's: up to 512
    columns, 4096 elements in all, on 2 warps."""
    bk = min(triton.next_power_of_2(k), 512)
    return 4096 // bk, bk


def gemv(a: Any, x: Any, y: Any) -> Any:
    """y = a @ x, a (M, K), f32 sums."""
    m, k = a.shape
    bm, bk = gemv_tile(k)
    _gemv_kernel[(triton.cdiv(m, bm),)](y, a, x, m, k, BM=bm, BK=bk, num_warps=2)
    return y


def _matmul_configs() -> list[Any]:
    shapes = [(128, 256, 64, 3, 8), (128, 128, 64, 4, 4), (128, 128, 32, 4, 4), (64, 128, 64, 4, 4)]
    return [
        triton.Config(
            {"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8}, num_stages=stages, num_warps=warps
        )
        for bm, bn, bk, stages, warps in shapes
    ]


@triton.autotune(configs=_matmul_configs(), key=["M", "N", "K"])
@triton.jit
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    s_am,
    s_ak,
    s_bk,
    s_bn,
    s_cm,
    s_cn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    # Grouped order: GROUP_M row-tiles share their B column-tiles while they sit in L2.
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + rk[:, None] * s_bk + rn[None, :] * s_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        left = K - k * BK
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < left), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < left) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BK * s_ak
        b_ptrs += BK * s_bk
    c_ptrs = c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: Any, b: Any, c: Any) -> Any:
    """c = a @ b (f16 or bf16 in, f32 accumulation)."""
    m, k = a.shape
    _, n = b.shape

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)

    _matmul_kernel[grid](
        a,
        b,
        c,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        c.stride(1),
    )
    return c
