"""Rotary position embedding, half-split (GPT-NeoX) layout, with cos/sin computed on the device.

One kernel serves f32, f16 and bf16 (its dtype is a TypeVar). The only host-made data is the
frequency row `theta^(-i/half)` in f64, split into f32 high and low parts and kept per (backend,
half, theta); each block computes the angles `pos·freq` of its token to about 2^-48 relative
(the product's rounding error recovered with an fma) and their cos and sin with `ct.cos` and
`ct.sin` of the high and low parts, combined by the angle-sum identities.
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32, i32
from cutile_py_kernels._common import check_float, prev_pow2

T = TypeVar("T")  # the element dtype of x and y
ONE = TypeVar("ONE")  # 1 token per block
H = TypeVar("H")  # heads per block
D = TypeVar("D")  # head_dim
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
#: Warps a block, and elements a block at most: 64 a thread. The block's angles (head_dim/2
#: of them) are computed apart from the tile, spread over its threads, and broadcast over
#: the heads through shared memory (`lower.layout`: a costly broadcast), so a thread computes
#: the cos and sin of at most one or two angles whatever the block: the more elements a
#: thread, the less that costs each. sm_90 SASS instructions an element at 4096 tokens x 32
#: heads x 128, f32 / bf16: 37.8 / 63.9 before (8 warps, each thread the angles of its own
#: 4 columns), now 19.8 / 20.1 on 8 warps, 12.9 / 13.5 on 4, 9.8 / 10.1 on 2; 9.7 / 9.4 with
#: bf16 widened from its loaded pair and each angle's cos and sin converted once for both
#: halves (Triton's kernel of the same algorithm and tiling: 9.0 / 10.5;
#: `paper_repro.kernels_sass`), at 112 / 89 registers. Not timed on a GPU.
WARPS = 2
BLOCK_ELEMS = 4096


@ct.kernel(num_warps=WARPS)
def rope_kernel(
    y: Mut[Tensor[T, ONE, H, D]],
    x: Tensor[T, Dyn, Dyn, Dyn],
    positions: Tensor[i32, Dyn],
    freq_hi: Tensor[f32, Dyn],
    freq_lo: Tensor[f32, Dyn],
    first: int,
    last: int,
) -> None:
    """For i < D/2, with a = pos·freq[i]: y[i] = x1 cos a - x2 sin a, y[i + D/2] = x2 cos a +
    x1 sin a, where x1, x2 are the halves of the head; a position outside [first, last]
    gives 0."""
    tok = ct.bid(0)
    half = y.shape[2] // 2
    shape = (1, y.shape[1], half)
    p = ct.load(positions, (tok,), (1,)).reshape((1, 1, 1))
    pos = p.astype(f32)  # exact below 2^24
    fh = ct.load(freq_hi, (0,), (half,)).reshape((1, 1, half))
    fl = ct.load(freq_lo, (0,), (half,)).reshape((1, 1, half))
    a_hi = pos * fh
    a_lo = ct.fma(pos, fh, -a_hi) + pos * fl  # what a_hi lost, and the frequency's low part
    ch, sh, cl, sl = ct.cos(a_hi), ct.sin(a_hi), ct.cos(a_lo), ct.sin(a_lo)
    inside = (p >= first) & (p <= last)
    c = ct.where(inside, ch * cl - sh * sl, 0.0)
    s = ct.where(inside, sh * cl + ch * sl, 0.0)
    x1 = ct.load(x, (tok, ct.bid(1), 0), shape).astype(f32)
    x2 = ct.load(x, (tok, ct.bid(1), 1), shape).astype(f32)
    ct.store(y, (0, 0, 0), (x1 * c - x2 * s).astype(y.dtype))
    ct.store(y, (0, 0, 1), (x2 * c + x1 * s).astype(y.dtype))


@functools.lru_cache(maxsize=16)
def frequencies(backend: str, half: int, theta: float) -> tuple[Tensor[Any, Any], Tensor[Any, Any]]:
    """theta^(-i/half) for i < half in f64, as f32 high parts and the f32 rest."""
    freq = theta ** (-np.arange(half, dtype=np.float64) / half)
    high = freq.astype(np.float32)
    low = (freq - high.astype(np.float64)).astype(np.float32)
    return ct.from_numpy(high), ct.from_numpy(low)


def rope_tile(heads: int, d: int) -> tuple[int, int, int]:
    """The output tile of one block: one token, all its heads up to BLOCK_ELEMS elements,
    else the most heads (a power of two) that fit."""
    hb = heads if heads * d <= BLOCK_ELEMS else prev_pow2(max(1, BLOCK_ELEMS // d))
    return (1, hb, d)


def rope(
    x: Tensor[Any, Any],
    positions: Tensor[Any, Any],
    theta: float = 10000.0,
    max_position: int | None = None,
) -> Tensor[Any, Any]:
    """Rotate `x` (tokens, heads, D) by `positions` (int32, one per token), half-split layout:
    for i < D/2, `freq = theta^(-2i/D)`, `a = pos·freq`,
    `y[..., i] = x[..., i] cos a - x[..., i + D/2] sin a` and
    `y[..., i + D/2] = x[..., i + D/2] cos a + x[..., i] sin a` (f32 arithmetic).

    cos and sin are computed on the device (nothing is read back to the host). With
    `max_position`, positions outside [0, max_position) give zeros; without, every position
    rotates (a negative one backwards). Angles are exact to about 2^-48 relative for
    positions below 2^24, so results stay within a few f32 ulp of the exact rotation.
    """
    dt = check_float("rope", x)
    if len(x.shape) != 3 or x.shape[2] % 2:
        raise ValueError(f"rope: x must be (tokens, heads, head_dim) with head_dim even: {x.shape}")
    tokens, heads, d = x.shape
    if positions.dtype is not i32 or positions.shape != (tokens,):
        raise ValueError(
            f"rope: positions must be int32 of shape ({tokens},), got "
            f"{positions.dtype.name} {positions.shape}"
        )
    first, last = (I32_MIN, I32_MAX) if max_position is None else (0, int(max_position) - 1)
    if x.size == 0:
        return ct.zeros(x.shape, dt)
    freq_hi, freq_lo = frequencies(ct.backend(), d // 2, float(theta))
    out = ct.empty(x.shape, dt).partition(rope_tile(heads, d))
    y, *_ = rope_kernel(out, x, positions, freq_hi, freq_lo, first, last).sync()
    result: Tensor[Any, Any] = y.unpartition()
    return result
