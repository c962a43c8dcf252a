"""`Qwen3`: a Qwen3 decoder on the library's kernels, prefilled eagerly and decoded by replaying
one captured graph per token.

Per layer (T tokens, h the hidden state, x the residual stream), as the prefill runs it:
    h, x = add_rms_norm(mlp_out, x, input_layernorm)      (rms_norm of the embedding at layer 0)
    qkv  = h @ [Wq; Wk; Wv]ᵀ                               (one fused projection)
    q    = rope(rms_norm_per_head(q) · q_norm)             (head-major, `q_prep`)
    k, v → KV cache rows at their positions, k normed and rotated the same way
    o    = attention(q, K cache, V cache, causal)          (GQA, split-KV when T is small)
    h, x = add_rms_norm(o @ Woᵀ, x, post_attention_layernorm)
    g, u = h @ [Wg; Wu]ᵀ                                   (one fused projection)
    mlp_out = (silu(g) · u) @ Wdᵀ
then the final norm, the LM head (the embedding when tied) and argmax on the device.

A step is a `.then` chain of launches over tensors it allocates (`_Steps`). The prefill runs
at once with gemm projections. The decode step (T = 1) is captured once by `ct.graph` (each
token only updates the token id and position tensors) and fuses what a launch per operation
would cost (~2 µs each on a GPU beside ~0.4 ms of weight reads per token for 0.6B): each
RMSNorm into the matrix-vector product after it (the norm's scale is one number per token),
each residual add into the product before it, q and k norm + RoPE + the cache write into one
kernel, SwiGLU into the down projection: 7 launches per layer instead of 10.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import cutile_py as ct
from cutile_py import Tensor, f16, f32, i32
from cutile_py_kernels import autotune
from cutile_py_kernels._common import next_pow2, prev_pow2, row_plan, row_warps, view
from cutile_py_kernels.attention import AttentionPlan
from cutile_py_kernels.gemm import _gemm_kernel
from cutile_py_kernels.layout import embedding_launch
from cutile_py_kernels.models.checkpoint import Qwen3Config, read_config, read_weights
from cutile_py_kernels.models.qwen3_kernels import (
    decode_gemv_kernels,
    mlp_kernels,
    qwen3_kernels,
)
from cutile_py_kernels.norms import _rms_kernels
from cutile_py_kernels.softmax import argmax_launch

AnyTensor = Tensor[Any, Any]


@functools.lru_cache(maxsize=16)
def _rope_tables(backend: str, half: int, theta: float, rows: int) -> tuple[AnyTensor, AnyTensor]:
    """cos and sin of pos·theta^(-i/half) for pos < rows, i < half (f64 → f32) on `backend`
    (the active one): made once per size, read by the fused q/k-norm + RoPE kernels."""
    freq = theta ** (-np.arange(half, dtype=np.float64) / half)
    angle = np.arange(rows, dtype=np.float64)[:, None] * freq[None, :]
    return (
        ct.from_numpy(np.cos(angle).astype(np.float32)),
        ct.from_numpy(np.sin(angle).astype(np.float32)),
    )


#: The compute dtype of a checkpoint's `torch_dtype`. The kernels compute in f16 or bf16 with
#: f32 sums (attention and the tensor-core projections take no f32 operands), so an f32
#: checkpoint runs in bf16: f32's exponent range (its activations cannot overflow as in f16)
#: and the dtype Qwen3 was trained in. Pass `dtype=` to choose otherwise.
DTYPES = {"float32": ct.bf16, "bfloat16": ct.bf16, "float16": ct.f16}


def compute_dtype(cfg: Qwen3Config) -> type[ct.DType]:
    """DTYPES[cfg.torch_dtype], or ValueError naming an unknown one."""
    if cfg.torch_dtype not in DTYPES:
        raise ValueError(
            f"Qwen3: torch_dtype {cfg.torch_dtype!r} is not one of {', '.join(DTYPES)}; "
            "pass dtype=ct.f16 or ct.bf16"
        )
    return DTYPES[cfg.torch_dtype]


def check_head_dim(cfg: Qwen3Config) -> None:
    """ValueError unless the attention kernel takes cfg.head_dim (a multiple of 16, the mma's
    K), so that a model it cannot run is refused when made, not at its first prefill."""
    if cfg.head_dim <= 0 or cfg.head_dim % 16:
        raise ValueError(
            f"Qwen3: head_dim must be a multiple of 16, got {cfg.head_dim} (the attention "
            "kernel's matrix products take 16 columns at a time)"
        )


#: Cache rows per block of the prefill's KV-cache kernel.
CACHE_BLOCK = 64
#: Prefill tokens per block of the q/transpose kernels.
TOKEN_BLOCK = 16


class _Layer:
    """One decoder layer's weights on the device (Linear weights (out, in))."""

    def __init__(self, w: Mapping[str, np.ndarray], prefix: str, dt: type[ct.DType]) -> None:
        def dev(name: str) -> AnyTensor:
            return ct.from_numpy(w[prefix + name], dt)

        self.ln1 = dev("input_layernorm.weight")
        self.ln2 = dev("post_attention_layernorm.weight")
        qkv = np.concatenate([w[prefix + f"self_attn.{p}_proj.weight"] for p in "qkv"], axis=0)
        self.qkv = ct.from_numpy(qkv, dt)
        self.o = dev("self_attn.o_proj.weight")
        self.q_norm = dev("self_attn.q_norm.weight")
        self.k_norm = dev("self_attn.k_norm.weight")
        # gate and up as one (2I, H) projection: one launch, its output viewed as (T, 2, I).
        gate_up = [w[prefix + f"mlp.{p}_proj.weight"] for p in ("gate", "up")]
        self.gate_up = ct.from_numpy(np.concatenate(gate_up, axis=0), dt)
        self.down = dev("mlp.down_proj.weight")


class _Cache:
    """The KV cache: per layer (kv_heads, capacity, head_dim) K and V, zero-filled (rows past
    the current length are read as padding by the attention kernels and must be finite)."""

    def __init__(self, cfg: Qwen3Config, capacity: int, dt: type[ct.DType]) -> None:
        self.capacity = -(-capacity // CACHE_BLOCK) * CACHE_BLOCK
        shape = (cfg.num_key_value_heads, self.capacity, cfg.head_dim)
        self.k: list[AnyTensor] = [ct.zeros(shape, dt) for _ in range(cfg.num_hidden_layers)]
        self.v: list[AnyTensor] = [ct.zeros(shape, dt) for _ in range(cfg.num_hidden_layers)]


class _Steps:
    """Builds a `.then` chain of launches. Outputs are partitions made by `out`; once the
    launch that wrote them has completed (at the next step), they become tensors in `env`."""

    def __init__(self) -> None:
        self.env: dict[str, AnyTensor] = {}
        self.pending: dict[str, ct.Partition] = {}
        self.makers: list[Callable[[], ct.OpLike]] = []

    def out(
        self, name: str, shape: tuple[int, ...], tile: tuple[int, ...], dt: type[ct.DType]
    ) -> ct.Partition:
        p: ct.Partition = ct.empty(shape, dt).partition(tile)
        self.pending[name] = p
        return p

    def put(self, name: str, p: ct.Partition) -> ct.Partition:
        """Hand an existing tensor's partition to a launch; it comes back as `name`."""
        self.pending[name] = p
        return p

    def settle(self) -> None:
        for name, p in self.pending.items():
            self.env[name] = p.unpartition()
        self.pending.clear()

    def add(self, make: Callable[[], ct.OpLike]) -> None:
        self.makers.append(make)

    def op(self) -> ct.OpLike:
        def after(make: Callable[[], ct.OpLike]) -> Callable[[tuple[Any, ...]], ct.OpLike]:
            def step(_: tuple[Any, ...]) -> ct.OpLike:
                self.settle()
                return make()

            return step

        op = self.makers[0]()
        for make in self.makers[1:]:
            op = op.then(after(make))
        return op


class Qwen3:
    """A Qwen3 causal LM (q/k RMSNorm, RoPE, GQA, SwiGLU) on cutile_py kernels, f16 or bf16
    (f32 sums; float32 checkpoints compute in bf16 unless `dtype` says otherwise). Make one
    with `from_pretrained(path)` or `random(config, seed)`."""

    def __init__(
        self, cfg: Qwen3Config, weights: Mapping[str, np.ndarray], dtype: type[ct.DType]
    ) -> None:
        if dtype not in (f16, ct.bf16):
            raise TypeError(f"Qwen3: dtype must be f16 or bf16, got {dtype.name}")
        check_head_dim(cfg)
        self.config = cfg
        self.dtype = dtype
        self.layers = [
            _Layer(weights, f"model.layers.{i}.", dtype) for i in range(cfg.num_hidden_layers)
        ]
        self.embed = ct.from_numpy(weights["model.embed_tokens.weight"], dtype)
        self.norm = ct.from_numpy(weights["model.norm.weight"], dtype)
        self.lm_head = self.embed
        if not cfg.tie_word_embeddings:
            self.lm_head = ct.from_numpy(weights["lm_head.weight"], dtype)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self._table_rows = 0

    # --- construction ----------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: type[ct.DType] | None = None) -> Qwen3:
        """Load a Hugging Face Qwen3 directory (config.json and *.safetensors in f32, f16 or
        bf16); weights are converted to `dtype`, by default the config's torch_dtype with
        float32 computed in bf16 (see DTYPES: the kernels take no f32 operands)."""
        path = Path(path)
        cfg = read_config(path)
        check_head_dim(cfg)  # before the weights are read
        weights = read_weights(path, cfg)
        return cls(cfg, weights, dtype or compute_dtype(cfg))

    @classmethod
    def random(
        cls,
        config: Qwen3Config | dict[str, Any],
        seed: int = 0,
        dtype: type[ct.DType] | None = None,
    ) -> Qwen3:
        """Random weights of the shapes `config` implies: Linear weights N(0, 1/in), norm
        weights 1 + N(0, 0.1²), the embedding N(0, 1); `dtype` as in `from_pretrained`."""
        cfg = config if isinstance(config, Qwen3Config) else Qwen3Config.from_dict(config)
        return cls(cfg, RandomWeights(cfg, seed), dtype or compute_dtype(cfg))

    # --- public -------------------------------------------------------------------------------
    def logits(self, ids: list[int] | np.ndarray) -> np.ndarray:
        """The prefill logits (float32, (len(ids), vocab)) at every position of `ids`."""
        ids_a = self._ids(ids)
        cache = _Cache(self.config, len(ids_a), self.dtype)
        s = self._prefill(ids_a, cache)
        s.op().sync()
        s.settle()
        out: np.ndarray = s.env["logits"].to_numpy().astype(np.float32)
        return out

    def generate(self, prompt_ids: list[int] | np.ndarray, max_new_tokens: int) -> list[int]:
        """Greedy decoding: the prompt's prefill picks the first new token; each further token
        is one replay of the captured decode step (its token id and position updated)."""
        ids_a = self._ids(prompt_ids)
        if max_new_tokens <= 0:
            return []
        n = len(ids_a)
        cache = _Cache(self.config, n + max_new_tokens, self.dtype)
        s = self._prefill(ids_a, cache)
        s.op().sync()
        s.settle()
        tokens = [int(s.env["next"].to_numpy().reshape(-1)[-1])]
        if max_new_tokens == 1:
            return tokens
        step = DecodeGraph(self, cache)
        try:
            for p in range(n, n + max_new_tokens - 1):
                tokens.append(step.step(tokens[-1], p))
        finally:
            step.release()
        return tokens

    def decode_graph(self, capacity: int) -> DecodeGraph:
        """A captured decode step over a fresh (zero) KV cache of at least `capacity` rows
        (for timing, or decoding after no prefill)."""
        return DecodeGraph(self, _Cache(self.config, capacity, self.dtype))

    def weight_bytes(self) -> int:
        """Bytes of the weights one decode step reads (the LM head counted once)."""
        ts = [self.embed, self.norm, *([self.lm_head] if self.lm_head is not self.embed else [])]
        for layer in self.layers:
            ts += [layer.ln1, layer.ln2, layer.qkv, layer.o, layer.q_norm, layer.k_norm]
            ts += [layer.gate_up, layer.down]
        # The embedding's one row per token is negligible next to the LM head's whole table.
        return sum(t.nbytes for t in ts) - (
            self.embed.nbytes if self.lm_head is not self.embed else 0
        )

    # --- building the steps ------------------------------------------------------------------
    def _ids(self, ids: list[int] | np.ndarray) -> np.ndarray:
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        if a.size == 0:
            raise ValueError("Qwen3: ids must not be empty")
        if a.min() < 0 or a.max() >= self.config.vocab_size:
            raise ValueError(f"Qwen3: ids must be in [0, {self.config.vocab_size})")
        return a.astype(np.int32)

    def _rope_tables(self, rows: int) -> tuple[AnyTensor, AnyTensor]:
        """cos/sin tables of at least `rows` positions (grown by powers of two, so that a
        longer generation does not rebuild them each time), on the active backend."""
        cfg = self.config
        rows = next_pow2(max(rows, self._table_rows, 1))
        self._table_rows = rows
        return _rope_tables(ct.backend(), cfg.head_dim // 2, float(cfg.rope_theta), rows)

    def _prefill(self, ids: np.ndarray, cache: _Cache) -> _Steps:
        t = len(ids)
        s = _Steps()
        s.env["ids"] = ct.from_numpy(ids)
        s.env["pos0"] = ct.zeros((1,), i32)
        s.env["kv_len"] = ct.from_numpy(np.array([t], dtype=np.int32))
        self._build_prefill(s, t, cache)
        return s

    def _build_prefill(self, s: _Steps, t: int, cache: _Cache) -> None:
        """The prefill of T tokens at positions 0 .. T-1: gemm projections, one launch per
        norm, activation and layout change (run once per prompt, so not fused further)."""
        cfg, dt = self.config, self.dtype
        d = cfg.head_dim
        nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        group = nq // nkv
        eps = float(cfg.rms_norm_eps)
        cos, sin = self._rope_tables(cache.capacity)
        q_prep, kv_prefill, _, tokens_first = qwen3_kernels(dt)
        bt = min(TOKEN_BLOCK, next_pow2(t))
        attn = AttentionPlan(dt, nkv, group * t, t, d, cache.capacity, True, self.scale)
        env = s.env

        s.add(partial(self._embed, s, t))
        for i, layer in enumerate(self.layers):
            if i == 0:
                s.add(partial(self._rms, s, "h", "x", None, layer.ln1, t, eps))
            else:
                s.add(partial(self._rms, s, "h", "mlp", "x", layer.ln1, t, eps))
            s.add(partial(self._gemm, s, "qkv", "h", layer.qkv, t))

            def prep(layer: _Layer = layer, i: int = i) -> ct.OpLike:
                qkv = view(env["qkv"], (t, nq + 2 * nkv, d))
                q = s.out("q", (nq, t, d), (1, bt, d), dt)
                kc = s.put(f"k{i}", cache.k[i].partition((1, CACHE_BLOCK, d)))
                vc = s.put(f"v{i}", cache.v[i].partition((1, CACHE_BLOCK, d)))
                qop = q_prep(q, qkv, layer.q_norm, cos, sin, env["pos0"], eps)
                kvop = kv_prefill(kc, vc, qkv, layer.k_norm, cos, sin, nq, nkv, eps)
                zipped: ct.OpLike = ct.zip(qop, kvop)
                return zipped

            s.add(prep)
            s.add(partial(self._attend, s, attn, cache, i, t, env["kv_len"], 0))

            def to_tokens() -> ct.OpLike:
                y = s.out("o_t", (t, nq, d), (bt, 1, d), dt)
                op: ct.OpLike = tokens_first(y, view(env["o"], (nq, t, d)))
                return op

            s.add(to_tokens)
            s.add(partial(self._gemm, s, "attn", "o_t", layer.o, t))
            s.add(partial(self._rms, s, "h", "attn", "x", layer.ln2, t, eps))
            s.add(partial(self._gemm, s, "gu", "h", layer.gate_up, t))
            s.add(partial(self._swiglu, s, t))
            s.add(partial(self._gemm, s, "mlp", "act", layer.down, t))
        s.add(partial(self._rms, s, "h", "mlp", "x", self.norm, t, eps))
        s.add(partial(self._gemm, s, "logits", "h", self.lm_head, t, f32))
        s.add(partial(self._argmax, s, t))

    def _decode_step(self, token: AnyTensor, pos: AnyTensor, cache: _Cache) -> _Steps:
        """One token at position pos[0] over cache rows 0 .. pos[0]: the embedding; per layer
        7 launches (norm+qkv, q/k norm+RoPE+cache write, attention split and merge (one flash
        launch over a short cache), o-proj+residual, norm+gate/up, SwiGLU+down+residual); the
        final norm + LM head (f32 logits, as the prefill's) and the argmax.
        tests/test_qwen3.py holds the count so that it cannot silently grow back."""
        cfg, dt = self.config, self.dtype
        d = cfg.head_dim
        nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        group = nq // nkv
        eps = float(cfg.rms_norm_eps)
        cos, sin = self._rope_tables(cache.capacity)
        _, _, decode_prep, _ = qwen3_kernels(dt)
        attn = AttentionPlan(dt, nkv, group, 1, d, cache.capacity, True, self.scale)
        s = _Steps()
        env = s.env
        env["ids"] = token

        s.add(partial(self._embed, s, 1))
        for i, layer in enumerate(self.layers):
            s.add(partial(self._norm_gemv, s, "qkv", layer.ln1, layer.qkv, dt))

            def prep(layer: _Layer = layer, i: int = i) -> ct.OpLike:
                qkv = view(env["qkv"], (1, nq + 2 * nkv, d))
                q = s.out("q", (nkv, group, d), (1, group, d), dt)
                kc = s.put(f"k{i}", cache.k[i].partition((1, cache.capacity, d)))
                vc = s.put(f"v{i}", cache.v[i].partition((1, cache.capacity, d)))
                args = (layer.q_norm, layer.k_norm, cos, sin, pos, nq, nkv, eps)
                op: ct.OpLike = decode_prep(q, kc, vc, qkv, *args)
                return op

            s.add(prep)
            s.add(partial(self._attend, s, attn, cache, i, 1, pos, 1))
            s.add(partial(self._gemv_add, s, layer.o))
            s.add(partial(self._norm_gemv, s, "gu", layer.ln2, layer.gate_up, dt))
            s.add(partial(self._swiglu_down, s, layer.down))
        s.add(partial(self._norm_gemv, s, "logits", self.norm, self.lm_head, f32))
        s.add(partial(self._argmax, s, 1))
        return s

    # --- one launch each ---------------------------------------------------------------------
    def _embed(self, s: _Steps, t: int) -> ct.OpLike:
        hid = self.config.hidden_size
        kernel, width = embedding_launch(self.dtype, t, hid)
        y = s.out("x", (t, hid), (1, width), self.dtype)
        op: ct.OpLike = kernel(y, self.embed, s.env["ids"])
        return op

    def _attend(
        self,
        s: _Steps,
        attn: AttentionPlan,
        cache: _Cache,
        i: int,
        t: int,
        kv_len: AnyTensor,
        len_offset: int,
    ) -> ct.OpLike:
        """o = attention of the step's q over layer i's cache rows 0 .. kv_len[0] + len_offset
        - 1 (the cache tensors come back from the launch that wrote them)."""
        cfg = self.config
        cache.k[i], cache.v[i] = s.env[f"k{i}"], s.env[f"v{i}"]
        q_rows = view(s.env["q"], (cfg.num_key_value_heads, attn.rows, cfg.head_dim))
        o = s.put("o", attn.partition())
        return attn.op(o, q_rows, cache.k[i], cache.v[i], kv_len, len_offset)

    def _rms(
        self,
        s: _Steps,
        out: str,
        x: str,
        residual: str | None,
        w: AnyTensor,
        t: int,
        eps: float,
    ) -> ct.OpLike:
        """out = rms_norm(x (+ residual)) · w; with a residual, the sum is the new x."""
        hid, dt = self.config.hidden_size, self.dtype
        rows = view(s.env[x], (t, hid))
        plan = row_plan(t, hid, dt)
        tile = (1, -(-hid // plan.width) * plan.width) if plan.loop else (plan.rows, plan.width)
        tail = (plan.width,) if plan.loop else ()
        rms_tile, rms_loop, add_tile, add_loop = _rms_kernels(dt, row_warps(plan))
        y = s.out(out, (t, hid), tile, dt)
        if residual is None:
            op: ct.OpLike = (rms_loop if plan.loop else rms_tile)(y, rows, w, 1.0 / hid, eps, *tail)
            return op
        h = s.out("x", (t, hid), tile, dt)
        res = view(s.env[residual], (t, hid))
        op = (add_loop if plan.loop else add_tile)(y, h, rows, res, w, 1.0 / hid, eps, *tail)
        return op

    def _gemm(
        self, s: _Steps, out: str, x: str, w: AnyTensor, t: int, odt: type[ct.DType] | None = None
    ) -> ct.OpLike:
        """out = x @ wᵀ for a prefill's (T, K) rows."""
        m, k = w.shape
        dt = self.dtype
        odt = odt or dt
        cfg = autotune.default_config(dt, t, m, k)
        y = s.out(out, (t, m), (cfg.bm, cfg.bn), odt)
        op: ct.OpLike = _gemm_kernel(dt, odt, True, False, cfg.stages)(
            y, _shaped(s.env[x], (t, k)), w, cfg.bk
        )
        return op

    def _norm_gemv(
        self, s: _Steps, out: str, g: AnyTensor, w: AnyTensor, odt: type[ct.DType]
    ) -> ct.OpLike:
        """out = w @ (rms_norm(x) · g) for the one token's residual stream x."""
        m, k = w.shape
        bm, bk = _gemv_tiles(m, k)
        norm_gemv, _ = decode_gemv_kernels(self.dtype, odt)
        y = s.out(out, (m,), (bm,), odt)
        x = _shaped(s.env["x"], (k,))
        op: ct.OpLike = norm_gemv(y, w, x, g, 1.0 / k, float(self.config.rms_norm_eps), bk)
        return op

    def _gemv_add(self, s: _Steps, w: AnyTensor) -> ct.OpLike:
        """x = x + w @ o: the attention's output projection added to the residual stream."""
        m, k = w.shape
        bm, bk = _gemv_tiles(m, k)
        _, gemv_add = decode_gemv_kernels(self.dtype, self.dtype)
        res = _shaped(s.env["x"], (m,))
        y = s.out("x", (m,), (bm,), self.dtype)
        op: ct.OpLike = gemv_add(y, w, _shaped(s.env["o"], (k,)), res, bk)
        return op

    def _swiglu(self, s: _Steps, t: int) -> ct.OpLike:
        """act = silu(gate) · up for a prefill's T tokens."""
        i = self.config.intermediate_size
        swiglu_rows, _ = mlp_kernels(self.dtype)
        a = s.out("act", (t, i), (1, min(2048, next_pow2(i))), self.dtype)
        op: ct.OpLike = swiglu_rows(a, view(s.env["gu"], (t, 2, i)))
        return op

    def _swiglu_down(self, s: _Steps, down: AnyTensor) -> ct.OpLike:
        """x = x + down @ (silu(gate) · up) for one token, the activation made as it is read."""
        hid, i = down.shape
        _, swiglu_down = mlp_kernels(self.dtype)
        bm, bk = _gemv_tiles(hid, i)
        res = _shaped(s.env["x"], (hid,))
        y = s.out("x", (hid,), (bm,), self.dtype)
        op: ct.OpLike = swiglu_down(y, down, view(s.env["gu"], (1, 2, i)), res, bk)
        return op

    def _argmax(self, s: _Steps, t: int) -> ct.OpLike:
        v = self.config.vocab_size
        # Kept in env: the tensor a captured step's logits can be read back through.
        rows = s.env["logit_rows"] = view(s.env["logits"], (t, v))
        kernel, rows_per_block, width = argmax_launch(f32, t, v)
        y = s.out("next", (t, 1), (rows_per_block, 1), i32)
        op: ct.OpLike = kernel(y, rows, width)
        return op


class DecodeGraph:
    """The decode step captured once over a KV cache: `step(token, position)` writes the token
    id and position (the graph's only updates), replays it and returns the greedy next token.
    Positions must lie in the cache, whose rows before them a prefill or earlier steps wrote."""

    def __init__(self, model: Qwen3, cache: _Cache) -> None:
        self.capacity = cache.capacity
        self.vocab_size = model.config.vocab_size
        self._token = ct.zeros((1,), i32)
        self._pos = ct.zeros((1,), i32)
        self._steps = model._decode_step(self._token, self._pos, cache)
        self.graph = ct.graph(self._steps.op(), name="qwen3 decode step")
        self.launches = self.graph.launches

    def step(self, token: int, position: int) -> int:
        """Decode `token` at `position`: its K/V rows written there, attention over rows
        0 .. position; the argmax of the logits after it."""
        # The kernels read the position on the device: past the cache they would drop the
        # K/V row and attend over rows that are not there, giving a wrong token silently.
        if not 0 <= position < self.capacity:
            raise ValueError(
                f"Qwen3 decode: position {position} is outside the KV cache ({self.capacity} rows)"
            )
        if not 0 <= token < self.vocab_size:
            raise ValueError(f"Qwen3 decode: token id {token} is not in [0, {self.vocab_size})")
        self.graph.update(self._token, np.array([token], dtype=np.int32))
        self.graph.update(self._pos, np.array([position], dtype=np.int32))
        self.graph.replay()
        return int(self.graph.read(self._steps.pending["next"]).reshape(-1)[0])

    def logits(self) -> np.ndarray:
        """The last step's logits (float32, (vocab,))."""
        out: np.ndarray = self.graph.read(self._steps.env["logit_rows"]).reshape(-1)
        return out

    def release(self) -> None:
        self.graph.release()


def _gemv_tiles(m: int, k: int) -> tuple[int, int]:
    """(rows per block, K chunk) of a decode step's matrix-vector product: chunks of up to 512
    and 2048 products per block."""
    bk = min(next_pow2(k), 512)
    return min(prev_pow2(max(1, 2048 // bk)), next_pow2(m)), bk


def _shaped(t: AnyTensor, shape: tuple[int, ...]) -> AnyTensor:
    """`t` itself when it has `shape`, else a view of it in that shape."""
    return t if tuple(t.shape) == shape else view(t, shape)


class RandomWeights(Mapping[str, np.ndarray]):
    """Random float32 weights for a config, made when first asked for (one tensor at a time,
    so that a 4B-shaped model never holds all of them on the host): Linear weights N(0, 1/in),
    norm weights 1 + N(0, 0.1²), the embedding N(0, 1); each from its own stream of `seed`."""

    def __init__(self, cfg: Qwen3Config, seed: int = 0) -> None:
        self.shapes = cfg.weight_shapes()
        self.index = {name: i for i, name in enumerate(self.shapes)}
        self.seed = seed

    def __getitem__(self, name: str) -> np.ndarray:
        shape = self.shapes[name]
        rng = np.random.default_rng([self.seed, self.index[name]])
        a = rng.standard_normal(shape, dtype=np.float32)
        if len(shape) == 1:
            a = a * np.float32(0.1) + np.float32(1.0)
        elif name != "model.embed_tokens.weight":
            a *= np.float32(1.0 / np.sqrt(shape[1]))
        return a

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def random_weights(cfg: Qwen3Config, seed: int = 0) -> dict[str, np.ndarray]:
    """All of `RandomWeights(cfg, seed)` as a dict (the weights `Qwen3.random` makes)."""
    return dict(RandomWeights(cfg, seed))
