"""The Qwen3-specific fused kernels: per-head RMSNorm + RoPE of q (into head-major layout) and
of k with the KV-cache write (for a prefill two kernels, for a decode step one: `decode_prep`),
the head-major → token-major copy after attention, the SwiGLU activation read from the fused
gate/up projection (alone for a prefill, inside the down projection's matrix-vector product
for a decode step, which also adds the residual), and the decode step's matrix-vector products
with the RMSNorm before them (`norm_gemv`) or the residual add after them (`gemv_add`) fused in.

The fused projection output `qkv` is (T, heads + 2·kv_heads, D): q heads, then k heads, then
v heads of each token. RoPE is the half-split layout with f32 cos/sin tables (positions, D/2).
Positions come from a device tensor `pos0` (the first token's position) so that a captured
decode step reads the current one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32, i32
from cutile_py_kernels._common import ConstInt, Elem, per_dtype

ONE = TypeVar("ONE")
BT = TypeVar("BT")  # tokens (or cache rows) per block
D = TypeVar("D")  # head_dim
G = TypeVar("G")  # query heads per kv head
CAP = TypeVar("CAP")  # KV-cache rows
#: The output dtype as kernel annotations name it (f32 for mypy; a factory rebinds it).
Out = f32
BM = TypeVar("BM")  # output rows per block of a matrix-vector product


@per_dtype
def qwen3_kernels(dt: type[ct.DType]) -> tuple[Any, Any, Any, Any]:
    """(q_prep, kv_prefill, decode_prep, tokens_first) for element dtype `dt`."""
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.function
    def norm_rope(
        qkv: Tensor[Elem, Dyn, Dyn, Dyn],
        w: Tensor[Elem, Dyn],
        cos: Tensor[f32, Dyn, Dyn],
        sin: Tensor[f32, Dyn, Dyn],
        tb: int,
        head: int,
        row: int,
        bt: int,
        nh: int,
        d: int,
        eps: float,
    ) -> tuple[ct.Tile, ct.Tile]:
        """Tokens tb·bt .. of heads head·nh .. head·nh + nh-1 of qkv: x / sqrt(mean(x²) + eps)
        · w over D, rotated by the table rows row·bt ..; the two halves (bt, nh, D/2) in f32."""
        half = d // 2
        shape = (bt, nh, half)
        x1 = ct.load(qkv, (tb, head, 0), shape).astype(f32)
        x2 = ct.load(qkv, (tb, head, 1), shape).astype(f32)
        ss = ct.sum(x1 * x1, axis=2, keepdims=True) + ct.sum(x2 * x2, axis=2, keepdims=True)
        r = ct.rsqrt(ss * (1.0 / d) + eps)
        w1 = ct.load(w, (0,), (half,)).astype(f32)
        w2 = ct.load(w, (1,), (half,)).astype(f32)
        n1 = x1 * r * w1
        n2 = x2 * r * w2
        c = ct.load(cos, (row, 0), (bt, half)).reshape((bt, 1, half))
        s = ct.load(sin, (row, 0), (bt, half)).reshape((bt, 1, half))
        return n1 * c - n2 * s, n2 * c + n1 * s

    @ct.kernel
    def q_prep(
        q: Mut[Tensor[Elem, ONE, BT, D]],
        qkv: Tensor[Elem, Dyn, Dyn, Dyn],
        w: Tensor[Elem, Dyn],
        cos: Tensor[f32, Dyn, Dyn],
        sin: Tensor[f32, Dyn, Dyn],
        pos0: Tensor[i32, Dyn],
        eps: float,
    ) -> None:
        """q[h, t] = rope(rms_norm(qkv[t, h]) · w, pos0[0] + t) for head h = bid(0) and BT
        tokens; pos0[0] must be a multiple of BT (0 for a prefill, BT = 1 for a decode)."""
        bt, d = q.shape[1], q.shape[2]
        half = d // 2
        p0 = int(ct.load(pos0, (0,), (1,)).item())
        row = p0 // bt + ct.bid(1)
        y1, y2 = norm_rope(qkv, w, cos, sin, ct.bid(1), ct.bid(0), row, bt, 1, d, eps)
        ct.store(q, (0, 0, 0), y1.astype(q.dtype).reshape((1, bt, half)))
        ct.store(q, (0, 0, 1), y2.astype(q.dtype).reshape((1, bt, half)))

    @ct.kernel
    def kv_prefill(
        kc: Mut[Tensor[Elem, ONE, BT, D]],
        vc: Mut[Tensor[Elem, ONE, BT, D]],
        qkv: Tensor[Elem, Dyn, Dyn, Dyn],
        w: Tensor[Elem, Dyn],
        cos: Tensor[f32, Dyn, Dyn],
        sin: Tensor[f32, Dyn, Dyn],
        heads: int,
        kv_heads: int,
        eps: float,
    ) -> None:
        """Cache rows bid(1)·BT .. of kv head g = bid(0), for tokens 0 .. T-1 at positions
        0 .. T-1: kc = rope(rms_norm(k) · w), vc = v; rows past T get 0; blocks past T skip."""
        bt, d = kc.shape[1], kc.shape[2]
        half = d // 2
        if ct.bid(1) * bt < qkv.shape[0]:
            g = ct.bid(0)
            b = ct.bid(1)
            y1, y2 = norm_rope(qkv, w, cos, sin, b, heads + g, b, bt, 1, d, eps)
            ct.store(kc, (0, 0, 0), y1.astype(kc.dtype).reshape((1, bt, half)))
            ct.store(kc, (0, 0, 1), y2.astype(kc.dtype).reshape((1, bt, half)))
            vt = ct.load(qkv, (b, heads + kv_heads + g, 0), (bt, 1, d))
            vc.store(vt.reshape((1, bt, d)))

    @ct.kernel
    def decode_prep(
        q: Mut[Tensor[Elem, ONE, G, D]],
        kc: Mut[Tensor[Elem, ONE, CAP, D]],
        vc: Mut[Tensor[Elem, ONE, CAP, D]],
        qkv: Tensor[Elem, Dyn, Dyn, Dyn],
        wq: Tensor[Elem, Dyn],
        wk: Tensor[Elem, Dyn],
        cos: Tensor[f32, Dyn, Dyn],
        sin: Tensor[f32, Dyn, Dyn],
        pos0: Tensor[i32, Dyn],
        heads: int,
        kv_heads: int,
        eps: float,
    ) -> None:
        """The one new token (qkv is (1, ·, D)) at position p = pos0[0], for kv head g = bid(0)
        (its whole cache is the block's tile): q[g] = its G query heads normed (wq) and rotated,
        cache row p of kc = k head g normed (wk) and rotated, of vc = v head g. One launch
        instead of one for q and one for the cache."""
        grp, d = q.shape[1], q.shape[2]
        half = d // 2
        g = ct.bid(0)
        p = int(ct.load(pos0, (0,), (1,)).item())
        q1, q2 = norm_rope(qkv, wq, cos, sin, 0, g, p, 1, grp, d, eps)
        ct.store(q, (0, 0, 0), q1.astype(q.dtype).reshape((1, grp, half)))
        ct.store(q, (0, 0, 1), q2.astype(q.dtype).reshape((1, grp, half)))
        k1, k2 = norm_rope(qkv, wk, cos, sin, 0, heads + g, p, 1, 1, d, eps)
        ct.store(kc, (0, p, 0), k1.astype(kc.dtype).reshape((1, 1, half)))
        ct.store(kc, (0, p, 1), k2.astype(kc.dtype).reshape((1, 1, half)))
        ct.store(vc, (0, p, 0), ct.load(qkv, (0, heads + kv_heads + g, 0), (1, 1, d)))

    @ct.kernel
    def tokens_first(y: Mut[Tensor[Elem, BT, ONE, D]], x: Tensor[Elem, Dyn, Dyn, Dyn]) -> None:
        """y[t, h] = x[h, t]: BT tokens of head bid(1)."""
        bt, d = y.shape[0], y.shape[2]
        t = ct.load(x, (ct.bid(1), ct.bid(0), 0), (1, bt, d))
        y.store(t.reshape((bt, 1, d)))

    return q_prep, kv_prefill, decode_prep, tokens_first


@per_dtype
def mlp_kernels(dt: type[ct.DType]) -> tuple[Any, Any]:
    """(swiglu_rows, swiglu_down) for element dtype `dt`; `gu` is the fused gate/up output
    viewed as (T, 2, I): gate at [t, 0], up at [t, 1]."""
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.function
    def swiglu(gu: Tensor[Elem, Dyn, Dyn, Dyn], t: int, j: int, bi: int) -> ct.Tile:
        """silu(gate) · up of token t, columns j·bi .., rounded to the dtype (as the unfused
        activation tensor is), in f32, shape (1, 1, bi)."""
        g = ct.load(gu, (t, 0, j), (1, 1, bi)).astype(f32)
        u = ct.load(gu, (t, 1, j), (1, 1, bi)).astype(f32)
        return (g * ct.sigmoid(g) * u).astype(gu.dtype).astype(f32)

    @ct.function
    def add_rounded(acc: ct.Tile, res: Tensor[Elem, Dyn], bm: int) -> ct.Tile:
        """acc (bm,) rounded to the dtype plus the block's bm rows of res, rounded: a
        projection's output added to the residual stream as two unfused kernels would."""
        r = ct.load(res, (ct.bid(0),), (bm,)).astype(f32)
        return (acc.astype(res.dtype).astype(f32) + r).astype(res.dtype)

    @ct.kernel
    def swiglu_rows(a: Mut[Tensor[Elem, ONE, BT]], gu: Tensor[Elem, Dyn, Dyn, Dyn]) -> None:
        """a[t, i] = silu(gate[t, i]) · up[t, i] for BT columns of token bid(0)."""
        bi = a.shape[1]
        act = swiglu(gu, ct.bid(0), ct.bid(1), bi)
        a.store(act.reshape((1, bi)).astype(a.dtype))

    @ct.kernel
    def swiglu_down(
        y: Mut[Tensor[Elem, BT]],
        w: Tensor[Elem, Dyn, Dyn],
        gu: Tensor[Elem, Dyn, Dyn, Dyn],
        res: Tensor[Elem, Dyn],
        BK: ConstInt,
    ) -> None:
        """y[i] = res[i] + Σ_k w[i, k] · silu(gate[k]) · up[k] for BT rows (one token): the
        decode step's down projection with the activation made as it is read and the residual
        added (each rounded to the dtype, as unfused); f32 sums."""
        bm = y.shape[0]
        acc: ct.Tile = ct.zeros((bm, BK), f32)
        for k in range(ct.cdiv(w.shape[1], BK)):
            wt = ct.load(w, (ct.bid(0), k), (bm, BK)).astype(f32)
            acc = acc + wt * swiglu(gu, 0, k, BK).reshape((1, BK))
        y.store(add_rounded(ct.sum(acc, axis=1), res, bm))

    return swiglu_rows, swiglu_down


_decode_gemv_made: dict[tuple[str, str], tuple[Any, Any]] = {}


def decode_gemv_kernels(dt: type[ct.DType], odt: type[ct.DType]) -> tuple[Any, Any]:
    """(norm_gemv, gemv_add) for weights and activations of dtype `dt`, output `odt`: the decode
    step's matrix-vector products with the RMSNorm before them or the residual add after them
    fused in, so that neither is a launch of its own (made once per pair of dtypes)."""
    key = (dt.name, odt.name)
    if key not in _decode_gemv_made:
        _decode_gemv_made[key] = _make_decode_gemv(dt, odt)
    return _decode_gemv_made[key]


def _make_decode_gemv(dt: type[ct.DType], odt: type[ct.DType]) -> tuple[Any, Any]:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)
        Out = odt  # noqa: F841

    @ct.kernel
    def norm_gemv(
        y: Mut[Tensor[Out, BM]],
        w: Tensor[Elem, Dyn, Dyn],
        x: Tensor[Elem, Dyn],
        g: Tensor[Elem, Dyn],
        inv_n: float,
        eps: float,
        BK: ConstInt,
    ) -> None:
        """y[i] = Σ_k w[i, k] · rms_norm(x)[k] · g[k] for BM rows, f32 sums. The norm's scale
        r = 1/sqrt(mean(x²) + eps) is one number: y = r · Σ_k w[i, k] x[k] g[k], with Σ x²
        gathered in the same pass over x (every block reads all of x anyway)."""
        bm = y.shape[0]
        acc: ct.Tile = ct.zeros((bm, BK), f32)
        ss: ct.Tile = ct.zeros((1, BK), f32)
        for k in range(ct.cdiv(w.shape[1], BK)):
            xt = ct.load(x, (k,), (BK,)).astype(f32).reshape((1, BK))
            gt = ct.load(g, (k,), (BK,)).astype(f32).reshape((1, BK))
            wt = ct.load(w, (ct.bid(0), k), (bm, BK)).astype(f32)
            acc = acc + wt * (xt * gt)
            ss = ss + xt * xt
        r = ct.rsqrt(ct.sum(ss, axis=1) * inv_n + eps)
        y.store((ct.sum(acc, axis=1) * r).astype(y.dtype))

    @ct.kernel
    def gemv_add(
        y: Mut[Tensor[Out, BM]],
        w: Tensor[Elem, Dyn, Dyn],
        x: Tensor[Elem, Dyn],
        res: Tensor[Elem, Dyn],
        BK: ConstInt,
    ) -> None:
        """y[i] = res[i] + Σ_k w[i, k] x[k] for BM rows (the product rounded to the dtype
        before the add, as unfused); f32 sums."""
        bm = y.shape[0]
        acc: ct.Tile = ct.zeros((bm, BK), f32)
        for k in range(ct.cdiv(w.shape[1], BK)):
            wt = ct.load(w, (ct.bid(0), k), (bm, BK)).astype(f32)
            acc = acc + wt * ct.load(x, (k,), (BK,)).astype(f32)
        r = ct.load(res, (ct.bid(0),), (bm,)).astype(f32)
        y.store((ct.sum(acc, axis=1).astype(res.dtype).astype(f32) + r).astype(y.dtype))

    return norm_gemv, gemv_add
