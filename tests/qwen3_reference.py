"""A NumPy float64 Qwen3 (Hugging Face's Qwen3ForCausalLM, written out): the reference of
tests/test_qwen3.py."""

from __future__ import annotations

import numpy as np

from cutile_py_kernels.models import Qwen3Config


def rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    out: np.ndarray = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    return out


def rope(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """x (T, heads, D) rotated in the half-split layout (HF's rotate_half)."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], axis=-1)
    out: np.ndarray = x * cos + rot * sin
    return out


def logits(cfg: Qwen3Config, w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """(len(ids), vocab) logits of the whole sequence, causal, float64."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t = len(ids)
    nq, nkv, d, eps = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.rms_norm_eps,
    )
    pos = np.arange(t)
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    mask = np.tril(np.ones((t, t), dtype=bool))
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, nq, d)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, nkv, d)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, nkv, d)
        q = rope(rms(q, w[p + "self_attn.q_norm.weight"], eps), pos, cfg.rope_theta)
        k = rope(rms(k, w[p + "self_attn.k_norm.weight"], eps), pos, cfg.rope_theta)
        o = np.zeros((t, nq, d))
        for hd in range(nq):
            g = hd // (nq // nkv)
            s = q[:, hd] @ k[:, g].T / np.sqrt(d)
            s = np.where(mask, s, -np.inf)
            e = np.exp(s - s.max(axis=1, keepdims=True))
            o[:, hd] = e / e.sum(axis=1, keepdims=True) @ v[:, g]
        x = x + o.reshape(t, nq * d) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    h = rms(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]
    out: np.ndarray = h @ head.T
    return out


def greedy(cfg: Qwen3Config, w: dict[str, np.ndarray], prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after `prompt` (each step re-runs the whole sequence)."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(logits(cfg, w, seq)[-1])))
    return seq[len(prompt) :]
