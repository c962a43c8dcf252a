"""Qwen3 configuration and checkpoints: `config.json` fields, the Hugging Face weight names, and
`*.safetensors` files (f32, f16 or bf16) read with the optional `safetensors` library."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: How to install the optional reader (an extra of this package).
INSTALL_HINT = "pip install 'cutile_py[models]' (or: pip install safetensors)"


@dataclass(frozen=True)
class Qwen3Config:
    """The architecture fields of a Hugging Face Qwen3 `config.json` (names as there; a field
    left out takes transformers' Qwen3Config default: head_dim 128, rope_theta 10000)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    torch_dtype: str = "bfloat16"

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "config") -> Qwen3Config:
        """The fields of `d` (a parsed config.json; other keys are ignored)."""
        fields = cls.__dataclass_fields__
        _refuse_other_architectures(d, where)
        if "torch_dtype" not in d and isinstance(d.get("dtype"), str):
            d = {**d, "torch_dtype": d["dtype"]}  # newer transformers write `dtype`
        rope = d.get("rope_parameters")
        if "rope_theta" not in d and isinstance(rope, dict) and "rope_theta" in rope:
            d = {**d, "rope_theta": rope["rope_theta"]}  # newer transformers nest θ there
        if "num_key_value_heads" not in d and "num_attention_heads" in d:
            d = {**d, "num_key_value_heads": d["num_attention_heads"]}  # as transformers does
        missing = [n for n, f in fields.items() if n not in d and f.default is MISSING]
        if "head_dim" in missing:
            # transformers' Qwen3Config defaults head_dim to 128, not hidden / heads.
            d = {**d, "head_dim": 128}
            missing.remove("head_dim")
        if missing:
            raise ValueError(f"{where}: missing Qwen3 fields {', '.join(missing)}")
        cfg = cls(**{n: d[n] for n in fields if n in d})
        if cfg.num_key_value_heads <= 0:
            raise ValueError(
                f"{where}: num_key_value_heads must be positive, got {cfg.num_key_value_heads}"
            )
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ValueError(
                f"{where}: num_attention_heads ({cfg.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({cfg.num_key_value_heads})"
            )
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight's Hugging Face name and shape (Linear weights are (out, in))."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        nq, nkv = self.num_attention_heads, self.num_key_value_heads
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (self.vocab_size, h),
            "model.norm.weight": (h,),
        }
        for layer in range(self.num_hidden_layers):
            p = f"model.layers.{layer}."
            shapes |= {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (nq * d, h),
                p + "self_attn.k_proj.weight": (nkv * d, h),
                p + "self_attn.v_proj.weight": (nkv * d, h),
                p + "self_attn.o_proj.weight": (h, nq * d),
                p + "self_attn.q_norm.weight": (d,),
                p + "self_attn.k_norm.weight": (d,),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        return shapes


def _refuse_other_architectures(d: Mapping[str, Any], where: str) -> None:
    """ValueError naming the first field of `d` that asks for something Qwen3 here does not
    compute (scaled or partial RoPE, q/k/v biases, another activation, sliding-window
    attention): such a checkpoint would load and give wrong logits."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = d.get(key)
        kind = (
            rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else None
        )
        if kind not in (None, "default"):
            raise ValueError(f"{where}: {key} of type {kind!r} is not supported (plain RoPE only)")
    if d.get("attention_bias"):
        raise ValueError(f"{where}: attention_bias is true; q/k/v/o biases are not supported")
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act {d['hidden_act']!r} is not supported (silu only)")
    if d.get("use_sliding_window"):
        raise ValueError(f"{where}: use_sliding_window is true; sliding windows are not supported")
    kinds = d.get("layer_types") or []
    if any(k != "full_attention" for k in kinds):
        other = next(k for k in kinds if k != "full_attention")
        raise ValueError(f"{where}: layer_types holds {other!r}; only full_attention is supported")
    if d.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(
            f"{where}: partial_rotary_factor {d['partial_rotary_factor']} is not supported "
            "(RoPE over the whole head)"
        )


def read_config(path: Path) -> Qwen3Config:
    """The Qwen3Config of a model directory's config.json."""
    file = path / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"Qwen3.from_pretrained: no config.json in {path}")
    with file.open() as f:
        return Qwen3Config.from_dict(json.load(f), str(file))


def _as_float32(name: str, dtype: str, shape: list[int], data: bytes) -> np.ndarray:
    if dtype == "F32":
        a = np.frombuffer(data, dtype="<f4")
    elif dtype == "F16":
        a = np.frombuffer(data, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":  # the high half of an f32: exact
        a = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise TypeError(f"{name}: dtype {dtype} is not supported (F32, F16 or BF16)")
    return a.reshape(shape).astype(np.float32, copy=False)


class CheckpointWeights(Mapping[str, np.ndarray]):
    """A checkpoint's weights by name, each converted to float32 when asked for, so that the
    host holds the files' bytes once and one converted tensor at a time."""

    def __init__(self, raw: dict[str, tuple[str, str, list[int], bytes]]) -> None:
        self.raw = raw  # name -> (where, safetensors dtype, shape, bytes)

    def __getitem__(self, name: str) -> np.ndarray:
        where, dtype, shape, data = self.raw[name]
        return _as_float32(where, dtype, shape, data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


def read_weights(path: Path, cfg: Qwen3Config) -> CheckpointWeights:
    """The weights of the `*.safetensors` files in `path` (F32, F16 or BF16), checked against
    the names and shapes that `cfg` implies; float32 arrays on access."""
    try:
        import safetensors
    except ImportError as e:
        raise ImportError(
            f"Qwen3.from_pretrained needs the safetensors library: {INSTALL_HINT}"
        ) from e
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"Qwen3.from_pretrained: no *.safetensors files in {path}")
    # The library ships no type hints: its one call here, typed.
    deserialize: Callable[[bytes], list[tuple[str, dict[str, Any]]]] = safetensors.deserialize
    want = cfg.weight_shapes()
    raw: dict[str, tuple[str, str, list[int], bytes]] = {}
    for file in files:
        # `deserialize` hands back raw bytes for every dtype: NumPy has no bf16.
        for name, t in deserialize(file.read_bytes()):
            if name not in want:
                continue  # e.g. a tied lm_head saved anyway
            shape = [int(d) for d in t["shape"]]
            if tuple(shape) != want[name]:
                raise ValueError(f"{file.name}: {name} has shape {shape}, expected {want[name]}")
            dtype = str(t["dtype"])
            if dtype not in ("F32", "F16", "BF16"):
                raise TypeError(
                    f"{file.name}: {name}: dtype {dtype} is not supported (F32, F16 or BF16)"
                )
            raw[name] = (f"{file.name}: {name}", dtype, shape, t["data"])
    missing = [n for n in want if n not in raw]
    if missing:
        raise ValueError(
            f"Qwen3.from_pretrained: {path} lacks {len(missing)} weights, e.g. {missing[0]}"
        )
    return CheckpointWeights(raw)
