"""`silu_mul(gate, up) = gate * sigmoid(gate) * up` (SwiGLU), element-wise, any shape."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py_kernels._common import Elem, check_float, check_shape, per_dtype, view

B = TypeVar("B")


@per_dtype
def _silu_mul_kernel(dt: type[ct.DType]) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel
    def silu_mul_kernel(
        z: Mut[Tensor[Elem, B]], gate: Tensor[Elem, Dyn], up: Tensor[Elem, Dyn]
    ) -> None:
        """z = g * sigmoid(g) * u in f32, rounded once to the dtype."""
        g = ct.load_tile_like(gate, z).astype(f32)
        u = ct.load_tile_like(up, z).astype(f32)
        z.store((g * ct.sigmoid(g) * u).astype(z.dtype))

    return silu_mul_kernel


def silu_mul(gate: Tensor[Any, Any], up: Tensor[Any, Any]) -> Tensor[Any, Any]:
    """`gate * sigmoid(gate) * up` (SwiGLU's gating), element-wise, as a new tensor of the
    inputs' shape and dtype (f32, f16 or bf16; f32 arithmetic)."""
    dt = check_float("silu_mul", gate, up)
    check_shape("silu_mul", "up", up, gate.shape)
    n = gate.size
    tile = 1024 if dt is f32 else 2048
    out = ct.empty((n,), dt).partition(tile)
    z, _, _ = _silu_mul_kernel(dt)(out, view(gate, (n,)), view(up, (n,))).sync()
    result: Tensor[Any, Any] = z.unpartition().reshape(gate.shape)
    return result
