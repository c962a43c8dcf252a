"""`gemv(a, x) = a @ x`: a bandwidth-bound matrix-vector product on CUDA cores, f32 sums."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py_kernels._common import ConstInt, Elem, check_float, next_pow2, per_dtype, prev_pow2

BM = TypeVar("BM")


@per_dtype
def _gemv_kernel(dt: type[ct.DType]) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel
    def gemv_kernel(
        y: Mut[Tensor[Elem, BM]], a: Tensor[Elem, Dyn, Dyn], x: Tensor[Elem, Dyn], BK: ConstInt
    ) -> None:
        """y[i] = sum_k a[i, k] x[k] for BM rows: (BM, BK) products accumulate element-wise
        in f32 over the K loop, and one reduction over axis 1 ends it (padding reads 0)."""
        acc: ct.Tile = ct.zeros((y.shape[0], BK), f32)
        for k in range(ct.cdiv(a.shape[1], BK)):
            at = ct.load(a, (ct.bid(0), k), (y.shape[0], BK)).astype(f32)
            xt = ct.load(x, (k,), (BK,)).astype(f32)
            acc = acc + at * xt
        y.store(ct.sum(acc, axis=1).astype(y.dtype))

    return gemv_kernel


def gemv(a: Tensor[Any, Any], x: Tensor[Any, Any]) -> Tensor[Any, Any]:
    """`y = a @ x` for `a` (M, K) and `x` (K,), f32, f16 or bf16 (the same); products and sums
    in f32 on CUDA cores (no tf32), `y` (M,) in the inputs' dtype."""
    dt = check_float("gemv", a, x)
    if len(a.shape) != 2 or len(x.shape) != 1 or a.shape[1] != x.shape[0]:
        raise ValueError(f"gemv: expected a (M, K) and x (K,), got {a.shape} and {x.shape}")
    m, k = a.shape
    if m * k == 0:  # an empty sum is 0
        return ct.zeros((m,), dt)
    bk = min(next_pow2(k), 256 if dt is f32 else 512)
    bm = min(prev_pow2(max(1, 2048 // bk)), next_pow2(m))
    out = ct.empty((m,), dt).partition(bm)
    y, _, _, _ = _gemv_kernel(dt)(out, a, x, bk).sync()
    result: Tensor[Any, Any] = y.unpartition()
    return result
