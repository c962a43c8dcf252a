"""`gemv(a, x) = a @ x`: a bandwidth-bound matrix-vector product on CUDA cores, f32 sums."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py_kernels._common import ConstInt, Elem, check_float, next_pow2, per_dtype

BM = TypeVar("BM")


#: Warps a block, and elements of `a` a block's step: 64 a thread. sm_90 SASS instructions
#: an element at 4096 x 4096, f32 / bf16: 8.5 / 11.2 with (8, 256) / (4, 512) steps on the
#: 8 warps the compiler chose and products added apart, 2.7 / 3.7 here, with the loop's
#: loads split from the tensor's edge (Triton's kernel with this tiling: 2.6 / 3.9;
#: `paper_repro.kernels_sass`), at 154 registers (12 warps an SM, each thread 20 (f32)
#: 16-byte loads in flight). Not timed on a GPU.
WARPS = 2
STEP_ELEMS = 4096


@per_dtype
def _gemv_kernel(dt: type[ct.DType]) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel(num_warps=WARPS)
    def gemv_kernel(
        y: Mut[Tensor[Elem, BM]], a: Tensor[Elem, Dyn, Dyn], x: Tensor[Elem, Dyn], BK: ConstInt
    ) -> None:
        """y[i] = sum_k a[i, k] x[k] for BM rows: (BM, BK) products accumulate element-wise
        in f32 over the K loop (fused multiply-adds), and one reduction over axis 1 ends it
        (padding reads 0)."""
        acc: ct.Tile = ct.zeros((y.shape[0], BK), f32)
        for k in range(ct.cdiv(a.shape[1], BK)):
            at = ct.load(a, (ct.bid(0), k), (y.shape[0], BK)).astype(f32)
            xt = ct.load(x, (k,), (BK,)).astype(f32)
            acc = ct.fma(at, xt, acc)
        y.store(ct.sum(acc, axis=1).astype(y.dtype))

    return gemv_kernel


def gemv_tile(m: int, k: int) -> tuple[int, int]:
    """(rows, columns) of a block's step through `a`: 512 columns (fewer for a shorter
    row), as many rows as make STEP_ELEMS elements (fewer for fewer rows)."""
    bk = min(next_pow2(k), 512)
    return min(STEP_ELEMS // bk, next_pow2(m)), bk


def gemv(a: Tensor[Any, Any], x: Tensor[Any, Any]) -> Tensor[Any, Any]:
    """`y = a @ x` for `a` (M, K) and `x` (K,), f32, f16 or bf16 (the same); products and sums
    in f32 on CUDA cores (no tf32), `y` (M,) in the inputs' dtype."""
    dt = check_float("gemv", a, x)
    if len(a.shape) != 2 or len(x.shape) != 1 or a.shape[1] != x.shape[0]:
        raise ValueError(f"gemv: expected a (M, K) and x (K,), got {a.shape} and {x.shape}")
    m, k = a.shape
    if m * k == 0:  # an empty sum is 0
        return ct.zeros((m,), dt)
    bm, bk = gemv_tile(m, k)
    out = ct.empty((m,), dt).partition(bm)
    y, _, _, _ = _gemv_kernel(dt)(out, a, x, bk).sync()
    result: Tensor[Any, Any] = y.unpartition()
    return result
