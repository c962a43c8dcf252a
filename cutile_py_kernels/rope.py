"""Rotary position embedding, half-split (GPT-NeoX) layout, with host-made cos/sin tables.

The kernel language has no sin/cos: `rope` builds cos(pos·freq) and sin(pos·freq) tables of
shape (max_position, D/2) on the host in float64, rounds them to f32 and keeps them (per
backend, D, theta and max_position) for later calls; each block gathers its token's row.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32, i32
from cutile_py_kernels._common import BLOCK_ELEMS, Elem, check_float, per_dtype, prev_pow2

ONE = TypeVar("ONE")  # 1 token per block
H = TypeVar("H")  # heads per block
D = TypeVar("D")  # head_dim


@per_dtype
def _rope_kernel(dt: type[ct.DType]) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel
    def rope_kernel(
        y: Mut[Tensor[Elem, ONE, H, D]],
        x: Tensor[Elem, Dyn, Dyn, Dyn],
        positions: Tensor[i32, Dyn],
        cos: Tensor[f32, Dyn, Dyn],
        sin: Tensor[f32, Dyn, Dyn],
    ) -> None:
        """For i < D/2: y[i] = x1 cos - x2 sin, y[i + D/2] = x2 cos + x1 sin, where x1, x2
        are the halves of the head and cos, sin the table rows at the token's position."""
        tok = ct.bid(0)
        half = y.shape[2] // 2
        shape = (1, y.shape[1], half)
        pos = ct.load(positions, (tok,), (1,)).item()
        c = ct.load(cos, (pos, 0), (1, half)).reshape((1, 1, half))
        s = ct.load(sin, (pos, 0), (1, half)).reshape((1, 1, half))
        x1 = ct.load(x, (tok, ct.bid(1), 0), shape).astype(f32)
        x2 = ct.load(x, (tok, ct.bid(1), 1), shape).astype(f32)
        ct.store(y, (0, 0, 0), (x1 * c - x2 * s).astype(y.dtype))
        ct.store(y, (0, 0, 1), (x2 * c + x1 * s).astype(y.dtype))

    return rope_kernel


@functools.lru_cache(maxsize=16)
def _tables(
    backend: str, half: int, theta: float, max_position: int
) -> tuple[Tensor[Any, Any], Tensor[Any, Any]]:
    """cos and sin of pos·theta^(-i/half) for pos < max_position, i < half (f64 → f32)."""
    freq = theta ** (-np.arange(half, dtype=np.float64) / half)
    angle = np.arange(max_position, dtype=np.float64)[:, None] * freq[None, :]
    return (
        ct.from_numpy(np.cos(angle).astype(np.float32)),
        ct.from_numpy(np.sin(angle).astype(np.float32)),
    )


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

    The cos/sin tables cover positions below `max_position`; when it is None the positions
    are read back to the host to size them. Positions outside [0, max_position) give zeros.
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
    if max_position is None:
        pos = positions.to_numpy()
        if pos.size and pos.min() < 0:
            raise ValueError("rope: positions must be >= 0")
        max_position = int(pos.max()) + 1 if pos.size else 1
    if x.size == 0:
        return ct.zeros(x.shape, dt)
    cos, sin = _tables(ct.backend(), d // 2, float(theta), int(max_position))
    hb = heads if heads * d <= BLOCK_ELEMS[dt] else prev_pow2(max(1, BLOCK_ELEMS[dt] // d))
    out = ct.empty(x.shape, dt).partition((1, hb, d))
    y, *_ = _rope_kernel(dt)(out, x, positions, cos, sin).sync()
    result: Tensor[Any, Any] = y.unpartition()
    return result
