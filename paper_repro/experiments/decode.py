"""Issue 21: batch-1 greedy decode of Qwen3-shaped models with random weights, each token one
replay of the captured decode step: tokens/s beside the HBM roofline (all weights plus the KV
cache read per token, at the copy bandwidth measured in the same run), with Grout's figures
from the paper beside them. `--quick` decodes a small random Qwen3 on sim."""

from __future__ import annotations

from functools import partial

import cutile_py as ct
from cutile_py_kernels.models import Qwen3, Qwen3Config
from cutile_py_kernels.models.decode_speed import measure_decode
from paper_repro import paper
from paper_repro.core import Context, Result, Row, attempt, sig
from paper_repro.experiments.common import copy_ceiling

#: The published Qwen3 shapes (tied embeddings, head_dim 128, RoPE θ 1e6).
SHAPES = {
    "Qwen3-0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8),
    "Qwen3-4B": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8),
}  # fmt: skip
QUICK = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32)  # fmt: skip
#: The issue's goal for the 0.6B shape on a GPU.
GOAL_FRACTION = 0.70


def config(name: str) -> Qwen3Config:
    fields = QUICK if name == "quick" else {**SHAPES[name], "vocab_size": 151_936, "head_dim": 128}
    return Qwen3Config(
        **fields, rope_theta=1_000_000.0, tie_word_embeddings=True, torch_dtype="bfloat16"
    )


def measure(ctx: Context, name: str, bw: float) -> list[Row]:
    cfg = config(name)
    ctx.log(f"decode: {name}: random weights")
    model = Qwen3.random(cfg, seed=ctx.seed, dtype=ct.bf16)
    start, tokens = (4, 4) if ctx.quick else (512, 128)
    speed = measure_decode(model, start, tokens, bw)
    row: Row = dict(
        model=name,
        status="ok",
        context=f"{start}..{start + tokens}",
        tokens_per_s=sig(speed.tokens_per_s),
        roofline_tokens_per_s=sig(speed.roofline_tokens_per_s),
        frac_roofline=sig(speed.fraction, 3),
        mb_per_token=sig(speed.bytes_per_token / 1e6),
        ms=sig(1e3 * speed.seconds / tokens),
        launches=speed.launches,
    )
    if name == "Qwen3-0.6B":
        row["goal"] = GOAL_FRACTION
    return [row]


def run(ctx: Context) -> Result:
    res = Result("decode", "Qwen3 batch-1 decode: tokens/s and fraction of the HBM roofline")
    res.columns = ["model", "status", "context", "tokens_per_s", "roofline_tokens_per_s",
                   "frac_roofline", "mb_per_token", "ms", "launches", "gbps", "goal",
                   "note"]  # fmt: skip
    for r in copy_ceiling(ctx):  # the run's copy ceiling (shared with bandwidth, elementwise)
        res.rows.append({**r, "model": f"copy: {r.get('impl')}"})
    bw = 1e9 * ctx.ceilings["copy_gbps"]
    res.notes.append(
        f"Roofline = copy bandwidth ({sig(bw / 1e9)} GB/s, the best copy measured in this run) ÷ "
        "(all weight bytes, the tied LM head once, + the K and V cache bytes read at the mean "
        "context length). Time per token: a graph replay with the position written and the "
        "next token read back (wall clock, as `Qwen3.generate` runs it)."
    )
    for name in ["quick"] if ctx.quick else list(SHAPES)[:1] if ctx.lean else list(SHAPES):
        attempt(ctx, res.rows, name, partial(measure, ctx, name, bw), model=name)
    for model, gpu, tps, frac in paper.GROUT_DECODE:
        share = f", {100 * frac:.1f}% of its roofline" if frac is not None else ""
        res.summary.append(f"paper (Grout): {model} on {gpu}: {tps:g} tokens/s{share}")
    for r in res.rows:
        if r.get("status") == "ok" and "tokens_per_s" in r:
            res.summary.append(
                f"cutile_py ({ctx.backend}): {r['model']}: {r['tokens_per_s']} tokens/s, "
                f"{100 * float(r['frac_roofline'] or 0):.1f}% of the roofline"
                + (f" (goal {100 * GOAL_FRACTION:.0f}%)" if "goal" in r else "")
            )
    if ctx.backend != "cuda":
        res.notes.append("Not a GPU: the simulator's speed, not comparable with the paper's.")
    return res
