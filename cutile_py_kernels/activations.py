"""Element-wise activations, any shape: `silu_mul(gate, up) = gate * sigmoid(gate) * up`
(SwiGLU) and `gelu(x)` (tanh form), both through `_over_one_plus_exp`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py_kernels._common import (
    Elem,
    as_shape,
    check_float,
    check_shape,
    empty_partition,
    per_dtype,
    view,
)

B = TypeVar("B")


#: log2(e) as an f32 `_LOG2E` plus the rest, and ln 2: `_over_one_plus_exp`'s exponent.
_LOG2E = float(np.float32(math.log2(math.e)))
_LOG2E_LO = math.log2(math.e) - _LOG2E
_LN2 = math.log(2.0)
#: |y| clamp of `_over_one_plus_exp`: e^88 < 2^127 keeps 1 + e^-y finite, and e^-88 < 2^-126
#: leaves 1 + e^-y = 1.
_Y_MAX = 88.0


@ct.function
def _over_one_plus_exp(w: ct.Tile, y: ct.Tile) -> ct.Tile:
    """w / (1 + e^-y) = w sigmoid(y) in f32, in a kernel compiled with fast_math, which
    here only makes `ct.exp2` ex2.approx and `1.0 / d` rcp.approx: 14 SASS instructions on
    sm_90 and no division slow path (`g / (1 + ct.exp(-g))` took 26).

    -y log2e = p + c exactly to ~2^-48 (c from fma), so 2^p (1 + c ln2) leaves only
    ex2.approx's error (PTX ISA: 2 ulp; exact on the simulator) and one rounding in e, which
    reaches the quotient scaled by e/(1+e) <= 1. The quotient w/d: rcp.approx, then one
    Newton step with its exact residual, within 0.5 ulp + 2^-40 of the correctly rounded
    w/d. Measured on the simulator (exact ex2) over 2^20 inputs against float64: within 3
    ulp (w = y); ex2.approx's 2 ulp on the hardware reach the result scaled by e/(1+e), so up
    to ~3 more. Where e^-y exceeds 2^126 (y < -87.3) the quotient is +-0 (|w sigmoid(y)| <
    |w| 2^-126); y = +-inf and NaN follow the formula (w = +-inf at y = -inf gives NaN, as in
    NumPy).
    """
    yc = ct.minimum(ct.maximum(y, -_Y_MAX), _Y_MAX)
    p = yc * -_LOG2E
    c = ct.fma(yc, -_LOG2E_LO, ct.fma(yc, -_LOG2E, -p))
    e = ct.exp2(p)
    # 2^(p+c) = 2^p (1 + c ln2 + ...): |c| < 2^-17, so the next term is below 2^-36.
    e = ct.fma(e * c, _LN2, e)
    d = e + 1.0
    r = 1.0 / d
    q = w * r
    return ct.fma(ct.fma(-d, q, w), r, q)


@per_dtype
def _silu_mul_kernel(dt: type[ct.DType]) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel(fast_math=True)
    def silu_mul_kernel(
        z: Mut[Tensor[Elem, B]], gate: Tensor[Elem, Dyn], up: Tensor[Elem, Dyn]
    ) -> None:
        """z = (g u) / (1 + exp(-g)) in f32 (`_over_one_plus_exp`), rounded once to the
        dtype: in f32 within 4 ulp of the exact value (measured on the simulator over 2^20
        inputs, tests/test_kernels_library.py), +-0 below g = -87.3 (|z| < |g u| 2^-126)."""
        g = ct.load_tile_like(gate, z).astype(f32)
        u = ct.load_tile_like(up, z).astype(f32)
        z.store(_over_one_plus_exp(g * u, g).astype(z.dtype))

    return silu_mul_kernel


#: silu_mul's elements per block, every dtype: 16 per thread of 256.
SILU_TILE = 4096
#: sqrt(2/pi), and GELU's cubic coefficient.
_GELU_S = 0.7978845608028654
_GELU_C = 0.044715


@per_dtype
def _gelu_kernel(dt: type[ct.DType]) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel(fast_math=True)
    def gelu_kernel(z: Mut[Tensor[Elem, B]], x: Tensor[Elem, Dyn]) -> None:
        """z = 0.5 x (1 + tanh(v)), v = sqrt(2/pi) (x + 0.044715 x^3), in f32 as
        x / (1 + exp(-2v)) (the same function, without 1 + tanh's cancellation for x < 0),
        rounded once. In f32 within 3 (1 + |2v|) ulp of the exact value, 2 for x > 0
        (measured on the simulator over 2^20 inputs): 2v's own f32 rounding, times |2v|."""
        t = ct.load_tile_like(x, z).astype(f32)
        two_v = t * ((2 * _GELU_S) + (2 * _GELU_S * _GELU_C) * (t * t))
        z.store(_over_one_plus_exp(t, two_v).astype(z.dtype))

    return gelu_kernel


def _tile(dt: type[ct.DType]) -> int:
    """Elements per block: 4 KiB of input. On an H200, f32 GELU at 2^26 and 2^28 elements
    moved 0.988-0.996 of the copy ceiling with 1024 a block, 0.93-0.96 with 2048-8192 (Triton
    0.97-0.99, same run: paper_repro/results/h200-2026-11-26-lease2/gelu-tile-sweep.txt);
    16-bit inputs take the same bytes a block (not timed)."""
    return 4096 // dt.itemsize()


def gelu(x: Tensor[Any, Any]) -> Tensor[Any, Any]:
    """GELU in its tanh form, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, element-wise,
    as a new tensor of `x`'s shape and dtype (f32, f16 or bf16; f32 arithmetic)."""
    dt = check_float("gelu", x)
    n = x.size
    out = empty_partition((n,), dt, (_tile(dt),))
    z, _ = _gelu_kernel(dt)(out, view(x, (n,))).sync()
    return as_shape(z.unpartition(), x.shape)


def silu_mul(gate: Tensor[Any, Any], up: Tensor[Any, Any]) -> Tensor[Any, Any]:
    """`gate * sigmoid(gate) * up` (SwiGLU's gating), element-wise, as a new tensor of the
    inputs' shape and dtype (f32, f16 or bf16; f32 arithmetic)."""
    dt = check_float("silu_mul", gate, up)
    check_shape("silu_mul", "up", up, gate.shape)
    n = gate.size
    out = empty_partition((n,), dt, (SILU_TILE,))
    z, _, _ = _silu_mul_kernel(dt)(out, view(gate, (n,)), view(up, (n,))).sync()
    return as_shape(z.unpartition(), gate.shape)
