"""Greedy decoding with a Qwen3 on cutile_py, each token one replay of a captured graph, and its
speed beside the HBM roofline (the step's bytes: weights + KV cache, at the measured copy
bandwidth).

Run: python examples/qwen3_decode.py [--model DIR] [--tokens N] [--prompt 1,2,3]
With no DIR, a small random Qwen3 (two layers, hidden 128) that decodes on the simulator in
seconds; with DIR, a Hugging Face Qwen3 directory (config.json, *.safetensors; needs the
`safetensors` package: pip install 'cutile_py[models]'). Prompts are token ids (no tokenizer).
"""

from __future__ import annotations

import argparse
import time

import cutile_py as ct
from cutile_py_kernels.models import Qwen3, Qwen3Config
from cutile_py_kernels.models.decode_speed import copy_bandwidth, measure_decode

SMALL = Qwen3Config(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rope_theta=1_000_000.0,
    # Untied: a random tied model mostly predicts the token it was given.
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", help="a Hugging Face Qwen3 directory (default: random small)")
    parser.add_argument("--tokens", type=int, default=8, help="tokens to generate (8)")
    parser.add_argument("--prompt", default="1,2,3,4", help="comma-separated token ids")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    backend = ct.backend()
    note = " (the PTX simulator on the CPU: not GPU speeds)" if backend == "sim" else ""
    t0 = time.perf_counter()
    model = Qwen3.from_pretrained(args.model) if args.model else Qwen3.random(SMALL, args.seed)
    cfg = model.config
    print(
        f"backend {backend}{note}: Qwen3 {'from ' + args.model if args.model else 'random'}, "
        f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, heads "
        f"{cfg.num_attention_heads}/{cfg.num_key_value_heads}, vocab {cfg.vocab_size}, "
        f"{model.dtype.name}, {model.weight_bytes() / 1e6:.1f} MB of weights "
        f"(loaded in {time.perf_counter() - t0:.1f} s)"
    )
    prompt = [int(i) for i in args.prompt.split(",")]
    for i in prompt:
        if not 0 <= i < cfg.vocab_size:  # refused, not wrapped into the vocabulary
            parser.error(f"--prompt: token id {i} is not in [0, {cfg.vocab_size})")
    t0 = time.perf_counter()
    tokens = model.generate(prompt, args.tokens)
    print(
        f"prompt {prompt} -> {tokens} ({time.perf_counter() - t0:.2f} s with prefill and capture)"
    )

    bw = copy_bandwidth(
        min(1 << 28, max(1 << 16, model.weight_bytes())) if backend == "cuda" else 1 << 16
    )
    speed = measure_decode(model, len(prompt), args.tokens, bw)
    print(
        f"decode: {speed.tokens_per_s:.1f} tokens/s; roofline {speed.roofline_tokens_per_s:.1f} "
        f"tokens/s ({speed.bytes_per_token / 1e6:.2f} MB per token at "
        f"{bw / 1e9:.1f} GB/s copy bandwidth): {100 * speed.fraction:.1f}% of the roofline; "
        f"{speed.launches} launches per token{note}"
    )


if __name__ == "__main__":
    main()
