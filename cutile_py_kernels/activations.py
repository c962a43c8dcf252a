"""Element-wise activations, any shape: `silu_mul(gate, up) = gate * sigmoid(gate) * up`
(SwiGLU) and `gelu(x)` (tanh form)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

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


@per_dtype
def _silu_mul_kernel(dt: type[ct.DType]) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel
    def silu_mul_kernel(
        z: Mut[Tensor[Elem, B]], gate: Tensor[Elem, Dyn], up: Tensor[Elem, Dyn]
    ) -> None:
        """z = g / (1 + exp(-g)) * u in f32 (g * sigmoid(g) * u; exp on ex2.approx, one
        division), rounded once to the dtype. Below g = -88, exp(-g) overflows and z is -0
        where g sigmoid(g) is under 8e-37 in magnitude."""
        g = ct.load_tile_like(gate, z).astype(f32)
        u = ct.load_tile_like(up, z).astype(f32)
        z.store((g / (1.0 + ct.exp(-g)) * u).astype(z.dtype))

    return silu_mul_kernel


#: silu_mul's elements per block, every dtype: 16 16-bit elements per thread would take 119
#: registers (the division's slow-path call keeps values live).
SILU_TILE = 4096
#: sqrt(2/pi), and GELU's cubic coefficient.
_GELU_S = 0.7978845608028654
_GELU_C = 0.044715


@per_dtype
def _gelu_kernel(dt: type[ct.DType]) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel
    def gelu_kernel(z: Mut[Tensor[Elem, B]], x: Tensor[Elem, Dyn]) -> None:
        """z = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in f32, rounded once."""
        t = ct.load_tile_like(x, z).astype(f32)
        inner = t * (_GELU_S + (_GELU_S * _GELU_C) * (t * t))
        z.store((0.5 * t * (1.0 + ct.tanh(inner))).astype(z.dtype))

    return gelu_kernel


def _tile(dt: type[ct.DType]) -> int:
    """Elements per block: four 16-byte accesses per thread of 256 (set-up spread thinner)."""
    return 4096 if dt is f32 else 8192


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
