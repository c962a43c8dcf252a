"""`gemm(a, b) = a @ b` (or `a @ b.T`) and batched `bmm` on tensor cores (`ct.mma`).

f16 and bf16 operands multiply exactly into f32 sums; f32 operands are rounded to tf32
(`cvt.rna`) first. The output dtype defaults to the inputs'. Each block owns one (BM, BN)
output tile and walks K in steps of BK; tiles past the edges of A and B read 0, which adds
nothing to the sums, and the partial output tiles at the edges are stored masked. Large 2-D
problems take their tiles in the L2-grouped block order (`@ct.kernel(group_m=...)`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py_kernels import autotune
from cutile_py_kernels._common import FLOATS, ConstInt, Elem, check_float

BM = TypeVar("BM")
BN = TypeVar("BN")
One = TypeVar("One")
#: The output dtype as the annotations name it: f32 for mypy; the factory rebinds it.
Out = f32

_made: dict[tuple[str, str, bool, bool, int, int | None, int | None, bool, bool], Any] = {}


def _gemm_kernel(
    dt: type[ct.DType],
    odt: type[ct.DType],
    trans_b: bool,
    batched: bool,
    stages: int = autotune.STAGES,
    num_warps: int | None = None,
    group_m: int | None = None,
    warp_specialize: bool = False,
    persistent: bool = False,
) -> Any:
    """The kernel for inputs `dt`, output `odt`, B as (K, N) or (N, K), 2-D or batched,
    its operand loads pipelined `stages` deep, `num_warps` warps per block (None: the
    compiler's choice), blocks in L2-grouped bands of `group_m` tile rows (None: plain),
    its K loop warp-specialized where `warp_specialize` (and the plan can), on a persistent
    grid where `persistent` (`@ct.kernel(persistent=True)`)."""
    key = (
        dt.name,
        odt.name,
        trans_b,
        batched,
        stages,
        num_warps,
        group_m,
        warp_specialize,
        persistent,
    )
    if key not in _made:
        _made[key] = _make(
            dt, odt, trans_b, batched, stages, num_warps, group_m, warp_specialize, persistent
        )
    return _made[key]


def config_kernel(
    cfg: autotune.GemmConfig,
    dt: type[ct.DType],
    odt: type[ct.DType],
    trans_b: bool,
    batched: bool,
) -> Any:
    """The kernel that runs `cfg` (its stages, warps, block order, specialization and
    persistence) for inputs `dt`, output `odt`, B's layout, 2-D or batched."""
    return _gemm_kernel(
        dt,
        odt,
        trans_b,
        batched,
        cfg.stages,
        cfg.num_warps,
        cfg.group,
        cfg.specialized,
        cfg.persists,
    )


def _make(
    dt: type[ct.DType],
    odt: type[ct.DType],
    trans_b: bool,
    batched: bool,
    stages: int,
    num_warps: int | None,
    group_m: int | None,
    warp_specialize: bool = False,
    persistent: bool = False,
) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)
        Out = odt  # noqa: F841

    @ct.function
    def b_tile(b: Tensor[Elem, Dyn, Dyn], kk: int, j: int, bk: int, bn: int) -> ct.Tile:
        """B's (BK, BN) tile at K step kk, column block j; with trans_b B is stored (N, K),
        so its (BN, BK) tile is loaded and transposed."""
        # trans_b is a Python constant: the frontend keeps one branch (kernels have no
        # conditional expressions, hence no ternary).
        if trans_b:  # noqa: SIM108
            t = ct.load(b, (j, kk), (bn, bk)).T
        else:
            t = ct.load(b, (kk, j), (bk, bn))
        return t

    @ct.kernel(
        stages=stages,
        num_warps=num_warps,
        group_m=group_m,
        warp_specialize=warp_specialize,
        persistent=persistent,
    )
    def gemm_kernel(
        c: Mut[Tensor[Out, BM, BN]],
        a: Tensor[Elem, Dyn, Dyn],
        b: Tensor[Elem, Dyn, Dyn],
        BK: ConstInt,
    ) -> None:
        """c[i, j] = sum_k a[i, k] b[k, j] (b[j, k] with trans_b) over K steps of BK, in f32."""
        bm, bn = c.shape[0], c.shape[1]
        acc: ct.Tile = ct.zeros((bm, bn), f32)
        for kk in range(ct.cdiv(a.shape[1], BK)):
            ta = ct.load(a, (ct.bid(0), kk), (bm, BK))
            acc = ct.mma(ta, b_tile(b, kk, ct.bid(1), BK, bn), acc)
        c.store(acc.astype(c.dtype))

    @ct.function
    def b_tile3(b: Tensor[Elem, Dyn, Dyn, Dyn], kk: int, j: int, bk: int, bn: int) -> ct.Tile:
        """Batch bid(0)'s B tile as 2-D (BK, BN)."""
        if trans_b:
            t = ct.load(b, (ct.bid(0), j, kk), (1, bn, bk)).reshape((bn, bk)).T
        else:
            t = ct.load(b, (ct.bid(0), kk, j), (1, bk, bn)).reshape((bk, bn))
        return t

    @ct.kernel(
        stages=stages,
        num_warps=num_warps,
        group_m=group_m,
        warp_specialize=warp_specialize,
        persistent=persistent,
    )
    def bmm_kernel(
        c: Mut[Tensor[Out, One, BM, BN]],
        a: Tensor[Elem, Dyn, Dyn, Dyn],
        b: Tensor[Elem, Dyn, Dyn, Dyn],
        BK: ConstInt,
    ) -> None:
        """c[p, i, j] = sum_k a[p, i, k] b[p, k, j]: grid axis 0 is the batch p; 3-D tiles of
        one batch entry are reshaped to the 2-D operands mma takes."""
        bm, bn = c.shape[1], c.shape[2]
        acc: ct.Tile = ct.zeros((bm, bn), f32)
        for kk in range(ct.cdiv(a.shape[2], BK)):
            ta = ct.load(a, (ct.bid(0), ct.bid(1), kk), (1, bm, BK)).reshape((bm, BK))
            acc = ct.mma(ta, b_tile3(b, kk, ct.bid(2), BK, bn), acc)
        c.store(acc.astype(c.dtype).reshape((1, bm, bn)))

    return bmm_kernel if batched else gemm_kernel


def _out_dtype(name: str, dt: type[ct.DType], out_dtype: type[ct.DType] | None) -> type[ct.DType]:
    odt = out_dtype or dt
    if odt not in FLOATS:
        raise TypeError(f"{name}: out_dtype must be f32, f16 or bf16, got {odt.name}")
    return odt


def _config(
    dt: type[ct.DType],
    odt: type[ct.DType],
    trans_b: bool,
    mnk: tuple[int, int, int],
    batch: int | None,
    a: Tensor[Any, Any],
    b: Tensor[Any, Any],
) -> autotune.GemmConfig:
    """The tuner's choice; its candidate launches write scratch outputs it allocates here."""
    m, n, k = mnk

    def make_launch(cfg: autotune.GemmConfig) -> autotune.Launch:
        kernel = config_kernel(cfg, dt, odt, trans_b, batch is not None)
        if batch is None:
            scratch = ct.empty((m, n), odt).partition((cfg.bm, cfg.bn))
        else:
            scratch = ct.empty((batch, m, n), odt).partition((1, cfg.bm, cfg.bn))

        def launch() -> ct.DeviceOp:
            op: ct.DeviceOp = kernel(scratch, a, b, cfg.bk)
            return op

        return launch

    device = ct.profiling.device_name()
    staged = autotune.stageable(dt, (k, k) if trans_b else (k, n))
    key = autotune.TuneKey.make(m, n, k, dt, trans_b, device, odt, batch, staged)
    wgmma = dt is not f32 and staged and ct.profiling.target().wgmma  # sm_90: wgmma configs
    grouped = batch is None  # bmm's grid axis 0 is the batch: nothing to group
    return autotune.TUNER.choose(
        key,
        autotune.candidate_templates(dt, m, n, k, wgmma, staged, grouped),
        autotune.default_config(dt, m, n, k, wgmma, grouped),
        make_launch,
    )


def gemm(
    a: Tensor[Any, Any],
    b: Tensor[Any, Any],
    trans_b: bool = False,
    out_dtype: type[ct.DType] | None = None,
) -> Tensor[Any, Any]:
    """`c = a @ b` for `a` (M, K) and `b` (K, N), or `c = a @ b.T` for `b` (N, K) with
    `trans_b`: c[i, j] = sum_k a[i, k] b[k, j], f32 sums (tf32 products for f32 inputs);
    `c` (M, N) in `out_dtype`, by default the inputs' dtype (f32, f16 or bf16)."""
    dt = check_float("gemm", a, b)
    odt = _out_dtype("gemm", dt, out_dtype)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ValueError(f"gemm: expected 2-D a and b, got {a.shape} and {b.shape}")
    m, k = a.shape
    n, kb = (b.shape[0], b.shape[1]) if trans_b else (b.shape[1], b.shape[0])
    if kb != k:
        form = "b (N, K)" if trans_b else "b (K, N)"
        raise ValueError(f"gemm: expected a (M, K) and {form}, got {a.shape} and {b.shape}")
    if m * n * k == 0:  # an empty sum over k is 0
        return ct.zeros((m, n), odt)
    cfg = _config(dt, odt, trans_b, (m, n, k), None, a, b)
    out = ct.empty((m, n), odt).partition((cfg.bm, cfg.bn))
    kernel = config_kernel(cfg, dt, odt, trans_b, False)
    c, _, _, _ = kernel(out, a, b, cfg.bk).sync()
    result: Tensor[Any, Any] = c.unpartition()
    return result


def bmm(
    a: Tensor[Any, Any],
    b: Tensor[Any, Any],
    trans_b: bool = False,
    out_dtype: type[ct.DType] | None = None,
) -> Tensor[Any, Any]:
    """Batched `c[p] = a[p] @ b[p]` for `a` (B, M, K) and `b` (B, K, N), or `a[p] @ b[p].T`
    for `b` (B, N, K) with `trans_b`; dtypes and sums as `gemm`; `c` is (B, M, N)."""
    dt = check_float("bmm", a, b)
    odt = _out_dtype("bmm", dt, out_dtype)
    if len(a.shape) != 3 or len(b.shape) != 3:
        raise ValueError(f"bmm: expected 3-D a and b, got {a.shape} and {b.shape}")
    nb, m, k = a.shape
    n, kb = (b.shape[1], b.shape[2]) if trans_b else (b.shape[2], b.shape[1])
    if b.shape[0] != nb or kb != k:
        form = "b (B, N, K)" if trans_b else "b (B, K, N)"
        raise ValueError(f"bmm: expected a (B, M, K) and {form}, got {a.shape} and {b.shape}")
    if nb * m * n * k == 0:  # an empty sum over k is 0
        return ct.zeros((nb, m, n), odt)
    cfg = _config(dt, odt, trans_b, (m, n, k), nb, a, b)
    out = ct.empty((nb, m, n), odt).partition((1, cfg.bm, cfg.bn))
    kernel = config_kernel(cfg, dt, odt, trans_b, True)
    c, _, _, _ = kernel(out, a, b, cfg.bk).sync()
    result: Tensor[Any, Any] = c.unpartition()
    return result
