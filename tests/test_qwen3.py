"""`cutile_py_kernels.models.Qwen3` against a NumPy float64 Qwen3 (tests/qwen3_reference.py):
prefill logits, greedy generation by graph replay, and `from_pretrained` on tiny checkpoints
written here with safetensors (f32, f16 and bf16 files)."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.ir.dtypes import round_to
from cutile_py_kernels.attention import AttentionPlan
from cutile_py_kernels.models import Qwen3, Qwen3Config
from cutile_py_kernels.models.qwen3 import DecodeGraph, _Cache, random_weights
from tests import qwen3_reference as ref

#: Max |logit error| over logits of size ~3: f16 activations through two layers (measured
#: ~0.003), bf16 (8x coarser).
ATOL = {ct.f16: 0.03, ct.bf16: 0.25}
#: The dtypes' machine epsilon.
EPS = {ct.f16: 2.0**-10, ct.bf16: 2.0**-7}


def logit_atol(dt: Any, want: np.ndarray) -> float:
    """Max |logit error| against the float64 reference: 3 epsilons of `dt` times the largest
    |logit| (activations are rounded to `dt` at every kernel boundary, so the error scales
    with the logits: tied embeddings make them ~10x larger). Over 300 seeds on interpret the
    worst was 1.6 eps (f16, untied) and 0.85 eps (bf16, tied); a fixed 0.25 for bf16 failed
    about once in 300."""
    return 3 * EPS[dt] * float(np.abs(want).max())


def tiny(tied: bool = False, **kw: Any) -> Qwen3Config:
    """Two layers, GQA 4 query heads over 2 kv heads, head_dim 32, vocab 96."""
    fields: dict[str, Any] = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
    )
    return Qwen3Config(**(fields | kw))


@pytest.fixture(params=["sim", "interpret", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield str(request.param)
    ct.set_backend("sim")


def rounded(w: dict[str, np.ndarray], dt: Any) -> dict[str, np.ndarray]:
    """The weights as the model holds them (rounded to dt), in float64."""
    return {k: round_to(v, dt).astype(np.float64) for k, v in w.items()}


@pytest.mark.parametrize(
    "dt,tied",
    [pytest.param(ct.f16, False, id="f16-untied"), pytest.param(ct.bf16, True, id="bf16-tied")],
)
def test_logits_match_float64_reference(
    backend: str, rng: np.random.Generator, dt: Any, tied: bool
) -> None:
    cfg = tiny(tied, rope_theta=float(rng.choice([10000.0, 1e6])))
    seed = int(rng.integers(2**31))
    model = Qwen3.random(cfg, seed=seed, dtype=dt)
    ids = [int(i) for i in rng.integers(0, cfg.vocab_size, size=int(rng.integers(5, 20)))]
    got = model.logits(ids)
    assert got.dtype == np.float32 and got.shape == (len(ids), cfg.vocab_size)
    want = ref.logits(cfg, rounded(random_weights(cfg, seed), dt), ids)
    np.testing.assert_allclose(got, want, rtol=0, atol=logit_atol(dt, want))


def test_generate_is_greedy_decoding_by_graph_replay(
    backend: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tokens equal greedy decoding with the float64 reference, each after the first one
    replay of one captured graph. Where the reference's top two logits are closer than the
    model's error bound the two may rightly part ways: the comparison stops there."""
    cfg = tiny()
    seed = int(rng.integers(2**31))
    model = Qwen3.random(cfg, seed=seed, dtype=ct.f16)
    w = rounded(random_weights(cfg, seed), ct.f16)
    prompt = [int(i) for i in rng.integers(0, cfg.vocab_size, size=int(rng.integers(2, 9)))]
    replays: list[str] = []
    updates: list[tuple[int, ...]] = []
    original, original_update = ct.Graph.replay, ct.Graph.update

    def counting(self: ct.Graph, *a: Any, **k: Any) -> Any:
        replays.append(self.describe())
        return original(self, *a, **k)

    def recording(self: ct.Graph, tensor: Any, data: np.ndarray) -> Any:
        updates.append(tuple(np.asarray(data).reshape(-1)))
        return original_update(self, tensor, data)

    monkeypatch.setattr(ct.Graph, "replay", counting)
    monkeypatch.setattr(ct.Graph, "update", recording)
    n = 6
    got = model.generate(prompt, n)
    assert len(got) == n and replays == ["graph 'qwen3 decode step'"] * (n - 1)
    # Before each replay only the token id (the last token) and its position are written.
    fed = [(t,) for t in got[:-1]]
    positions = [(len(prompt) + i,) for i in range(n - 1)]
    assert updates == [u for pair in zip(fed, positions, strict=True) for u in pair]
    seq = list(prompt)
    for step, token in enumerate(got):
        row = ref.logits(cfg, w, seq)[-1]
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] < 2 * ATOL[ct.f16]:
            break  # a near tie: either token is right
        assert token == int(np.argmax(row)), f"step {step}: {got} vs reference at {seq}"
        seq.append(token)


def test_generate_over_a_long_prompt_splits_the_keys(rng: np.random.Generator) -> None:
    """A 70-token prompt: the prefill's row blocks hold queries of two heads, and each decode
    step's attention is split over the KV cache (128 rows) and merged."""
    cfg = tiny()
    seed = int(rng.integers(2**31))
    model = Qwen3.random(cfg, seed=seed, dtype=ct.f16)
    prompt = [int(i) for i in rng.integers(0, cfg.vocab_size, size=70)]
    cap = _Cache(cfg, 73, ct.f16).capacity
    assert AttentionPlan(ct.f16, 2, 2, 1, 32, cap, True, 1.0).splits > 1
    got = model.generate(prompt, 3)
    w = rounded(random_weights(cfg, seed), ct.f16)
    seq = list(prompt)
    for step, token in enumerate(got):
        row = ref.logits(cfg, w, seq)[-1]
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] < 2 * ATOL[ct.f16]:
            break
        assert token == int(np.argmax(row)), f"step {step}"
        seq.append(token)


def test_generate_continues_where_a_prefill_left_off(rng: np.random.Generator) -> None:
    """Generating n tokens then reading the logits of prompt + tokens[:-1]: each token is the
    argmax of the row before it (the decode step's cache equals the prefill's)."""
    cfg = tiny()
    model = Qwen3.random(cfg, seed=int(rng.integers(2**31)), dtype=ct.f16)
    prompt = [int(i) for i in rng.integers(0, cfg.vocab_size, size=3)]
    got = model.generate(prompt, 4)
    rows = model.logits(prompt + got[:-1])[len(prompt) - 1 :]
    for step, (row, token) in enumerate(zip(rows, got, strict=True)):
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] < 2 * ATOL[ct.f16]:
            break
        assert token == int(np.argmax(row)), f"step {step}"


def test_generate_edges_and_id_checks(rng: np.random.Generator) -> None:
    """No new token is an empty list; one is the prefill's argmax (no graph); ids outside the
    vocabulary and empty prompts are refused."""
    cfg = tiny()
    model = Qwen3.random(cfg, seed=int(rng.integers(2**31)), dtype=ct.f16)
    prompt = [int(i) for i in rng.integers(0, cfg.vocab_size, size=4)]
    assert model.generate(prompt, 0) == []
    (token,) = model.generate(prompt, 1)
    row = model.logits(prompt)[-1]
    assert row[token] == row.max()
    with pytest.raises(ValueError, match=r"ids must be in \[0, 96\)"):
        model.generate([0, 96], 2)
    with pytest.raises(ValueError, match="must not be empty"):
        model.logits([])


# -- checkpoints -------------------------------------------------------------------------------
def _write_bf16(path: Path, weights: dict[str, np.ndarray]) -> None:
    """A bf16 safetensors file (NumPy has no bf16, so safetensors.numpy cannot write one): the
    format's 8-byte header length, JSON header and raw little-endian data, bits rounded to
    nearest even by round_to."""
    header: dict[str, Any] = {}
    blobs: list[bytes] = []
    offset = 0
    for name, a in weights.items():
        bits = (round_to(a, ct.bf16).astype(np.float32).view(np.uint32) >> 16).astype("<u2")
        data = bits.tobytes()
        header[name] = {
            "dtype": "BF16",
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.mark.parametrize("file_dtype", ["F32", "F16", "BF16"])
def test_from_pretrained_round_trips(
    tmp_path: Path, rng: np.random.Generator, file_dtype: str
) -> None:
    """A checkpoint of random weights (split over two files, as sharded checkpoints are) loads
    into the model `Qwen3.random` makes from the same weights: equal logits."""
    pytest.importorskip("safetensors", reason="safetensors is not installed (the 'models' extra)")
    from safetensors.numpy import save_file

    cfg = tiny(tied=file_dtype == "F16", torch_dtype="float16")
    seed = int(rng.integers(2**31))
    w = random_weights(cfg, seed)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    names = sorted(w)
    halves = [
        dict((n, w[n]) for n in names[: len(names) // 2]),
        dict((n, w[n]) for n in names[len(names) // 2 :]),
    ]
    for i, part in enumerate(halves):
        file = tmp_path / f"model-0000{i + 1}-of-00002.safetensors"
        if file_dtype == "BF16":
            _write_bf16(file, part)
        else:
            np_dt = np.float32 if file_dtype == "F32" else np.float16
            save_file({k: v.astype(np_dt) for k, v in part.items()}, str(file))
    model = Qwen3.from_pretrained(tmp_path)
    assert model.config == cfg and model.dtype is ct.f16
    stored = {"F32": w, "F16": {k: v.astype(np.float16).astype(np.float32) for k, v in w.items()}}
    stored["BF16"] = {k: round_to(v, ct.bf16).astype(np.float32) for k, v in w.items()}
    ids = [int(i) for i in rng.integers(0, cfg.vocab_size, size=6)]
    direct = Qwen3(cfg, stored[file_dtype], ct.f16)
    np.testing.assert_array_equal(model.logits(ids), direct.logits(ids))


def test_config_reads_the_published_fields() -> None:
    """A Qwen3-0.6B-style config.json (other keys ignored; `dtype` as newer files spell it)."""
    d = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "head_dim": 128,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "max_position_embeddings": 40960,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "tie_word_embeddings": True,
        "dtype": "float16",
        "vocab_size": 151936,
    }
    cfg = Qwen3Config.from_dict(d)
    assert (cfg.head_dim, cfg.rope_theta, cfg.tie_word_embeddings) == (128, 1e6, True)
    assert cfg.torch_dtype == "float16" and "lm_head.weight" not in cfg.weight_shapes()
    assert cfg.weight_shapes()["model.layers.27.self_attn.k_proj.weight"] == (1024, 1024)
    with pytest.raises(ValueError, match="must be a multiple of num_key_value_heads"):
        Qwen3Config.from_dict({**d, "num_key_value_heads": 3})


def test_from_pretrained_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        Qwen3.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 8}))
    with pytest.raises(ValueError, match="missing Qwen3 fields hidden_size"):
        Qwen3.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny().to_dict()))
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if not installed
    with pytest.raises(ImportError, match=r"cutile_py\[models\]"):
        Qwen3.from_pretrained(tmp_path)


def test_from_pretrained_names_a_wrong_shape(tmp_path: Path) -> None:
    pytest.importorskip("safetensors", reason="safetensors is not installed (the 'models' extra)")
    from safetensors.numpy import save_file

    cfg = tiny()
    w = random_weights(cfg)
    w["model.norm.weight"] = np.ones(63, np.float32)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    save_file(w, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \[63\], expected \(64,\)"):
        Qwen3.from_pretrained(tmp_path)
    w["model.norm.weight"] = np.ones(64, np.int32)
    save_file(w, str(tmp_path / "model.safetensors"))
    with pytest.raises(TypeError, match=r"model\.norm\.weight: dtype I32 is not supported"):
        Qwen3.from_pretrained(tmp_path)
    del w["model.norm.weight"]
    save_file(w, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks 1 weights, e\.g\. model\.norm\.weight"):
        Qwen3.from_pretrained(tmp_path)


def test_config_reads_rope_theta_from_rope_parameters() -> None:
    """Configs written by newer transformers hold θ under `rope_parameters`: it must be read,
    not replaced by the default (θ = 1e6); a kv head count left out means one per head."""
    d = {**tiny().to_dict(), "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    del d["rope_theta"], d["num_key_value_heads"]
    cfg = Qwen3Config.from_dict(d)
    assert cfg.rope_theta == 5e5 and cfg.num_key_value_heads == cfg.num_attention_heads


@pytest.mark.parametrize(
    "extra,match",
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.*yarn"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.*linear"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope_parameters.*yarn"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "'sliding_attention'"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
    ],
)
def test_config_refuses_what_the_model_does_not_compute(extra: dict[str, Any], match: str) -> None:
    """Config fields that change the architecture (scaled or partial RoPE, q/k/v biases,
    another activation, sliding windows) are refused by name instead of silently ignored."""
    with pytest.raises(ValueError, match=match):
        Qwen3Config.from_dict({**tiny().to_dict(), **extra}, "cfg.json")


def test_config_accepts_the_published_defaults_of_those_fields() -> None:
    d = {
        **tiny().to_dict(),
        "rope_scaling": None,
        "attention_bias": False,
        "hidden_act": "silu",
        "use_sliding_window": False,
        "layer_types": ["full_attention", "full_attention"],
        "partial_rotary_factor": 1.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    assert Qwen3Config.from_dict(d) == tiny()


def test_a_float32_checkpoint_computes_in_bf16(tmp_path: Path, rng: np.random.Generator) -> None:
    """torch_dtype float32 loads as bf16 (documented: the kernels take no f32 operands), with
    the logits of the bf16 reference; dtype= overrides it; an unknown torch_dtype is named."""
    pytest.importorskip("safetensors", reason="safetensors is not installed (the 'models' extra)")
    from safetensors.numpy import save_file

    cfg = tiny(torch_dtype="float32")
    seed = int(rng.integers(2**31))
    w = random_weights(cfg, seed)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    save_file(w, str(tmp_path / "model.safetensors"))
    model = Qwen3.from_pretrained(tmp_path)
    assert model.dtype is ct.bf16
    ids = [int(i) for i in rng.integers(0, cfg.vocab_size, size=5)]
    want = ref.logits(cfg, rounded(w, ct.bf16), ids)
    np.testing.assert_allclose(model.logits(ids), want, rtol=0, atol=logit_atol(ct.bf16, want))
    assert Qwen3.from_pretrained(tmp_path, dtype=ct.f16).dtype is ct.f16
    with pytest.raises(ValueError, match="torch_dtype 'float64' is not one of"):
        Qwen3.random(tiny(torch_dtype="float64"))


def test_decode_step_launches_and_logits_at_every_step(
    backend: str, rng: np.random.Generator
) -> None:
    """The captured decode step makes 7 launches per layer and 3 outside them (it made 10 per
    layer and 4 before the norms, residual adds and q/k/cache kernels were fused), and at
    every step its f32 logits match the float64 reference of the sequence so far (the
    reference's greedy token is fed back, so that near ties cannot end the comparison)."""
    cfg = tiny(num_hidden_layers=3)
    seed = int(rng.integers(2**31))
    model = Qwen3.random(cfg, seed=seed, dtype=ct.f16)
    w = rounded(random_weights(cfg, seed), ct.f16)
    seq = [int(i) for i in rng.integers(0, cfg.vocab_size, size=int(rng.integers(60, 70)))]
    steps = 5
    cache = _Cache(cfg, len(seq) + steps, ct.f16)
    assert AttentionPlan(ct.f16, 2, 2, 1, 32, cache.capacity, True, 1.0).splits > 1
    model._prefill(np.array(seq, np.int32), cache).op().sync()
    token, pos = ct.zeros((1,), ct.i32), ct.zeros((1,), ct.i32)
    d = model._decode_step(token, pos, cache)
    g = ct.graph(d.op())
    try:
        assert g.launches == 3 + 7 * cfg.num_hidden_layers
        for _ in range(steps):
            seq.append(int(np.argmax(ref.logits(cfg, w, seq)[-1])))
            g.update(token, np.array(seq[-1:], np.int32))
            g.update(pos, np.array([len(seq) - 1], np.int32))
            g.replay()
            got = g.read(d.env["logit_rows"]).reshape(-1)
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, ref.logits(cfg, w, seq)[-1], rtol=0, atol=ATOL[ct.f16])
            assert int(g.read(d.pending["next"]).reshape(-1)[0]) == int(np.argmax(got))
    finally:
        g.release()


def test_config_defaults_are_the_transformers_ones() -> None:
    """A config.json without head_dim or rope_theta reads as transformers reads it: head_dim 128
    (not hidden / heads) and θ = 10000 (1e6 is what the published files write, not a default)."""
    d = tiny().to_dict()
    del d["head_dim"], d["rope_theta"]
    cfg = Qwen3Config.from_dict(d)
    assert (cfg.head_dim, cfg.rope_theta) == (128, 10000.0)


def test_model_refuses_a_head_dim_or_kv_head_count_it_cannot_compute() -> None:
    """A head_dim the attention kernel cannot take (not a multiple of 16) is refused by name
    when the model is made, not by a compile error inside attention at the first prefill; a
    kv head count of 0 is a ValueError, not a ZeroDivisionError."""
    with pytest.raises(ValueError, match="head_dim must be a multiple of 16, got 40"):
        Qwen3.random(tiny(head_dim=40), dtype=ct.f16)
    with pytest.raises(ValueError, match="num_key_value_heads must be positive, got 0"):
        Qwen3Config.from_dict({**tiny().to_dict(), "num_key_value_heads": 0}, "cfg.json")


def test_a_decode_step_at_position_0_and_past_the_cache(rng: np.random.Generator) -> None:
    """`decode_graph(capacity)`: a step at position 0 over the empty cache gives the logits of
    the one-token sequence (split-KV: every split but the first sees no key); a position at or
    past the cache's rows (the kernels would neither write nor read them: a silently wrong
    token) or a token id outside the vocabulary is refused by name before the replay."""
    cfg = tiny()
    seed = int(rng.integers(2**31))
    model = Qwen3.random(cfg, seed=seed, dtype=ct.f16)
    w = rounded(random_weights(cfg, seed), ct.f16)
    token = int(rng.integers(cfg.vocab_size))
    step = model.decode_graph(128)
    try:
        assert AttentionPlan(ct.f16, 2, 2, 1, 32, 128, True, 1.0).splits > 1
        assert step.capacity == 128 and step.launches == 3 + 7 * cfg.num_hidden_layers
        nxt = step.step(token, 0)
        got = step.logits()
        np.testing.assert_allclose(got, ref.logits(cfg, w, [token])[-1], rtol=0, atol=ATOL[ct.f16])
        assert nxt == int(np.argmax(got))
        with pytest.raises(ValueError, match=r"position 128 is outside the KV cache \(128 rows\)"):
            step.step(token, 128)
        with pytest.raises(ValueError, match=r"position -1 is outside"):
            step.step(token, -1)
        with pytest.raises(ValueError, match=r"token id 96 is not in \[0, 96\)"):
            step.step(96, 1)
    finally:
        step.release()


@pytest.mark.parametrize(
    "fields",
    [
        # no GQA, head_dim 64, hidden/intermediate/vocab sizes not multiples of any tile,
        # an eps large enough that a norm ignoring the config's would show
        pytest.param(
            dict(
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=64,
                hidden_size=72,
                intermediate_size=100,
                vocab_size=97,
                rms_norm_eps=0.25,
            ),
            id="G1-d64-odd-eps",
        ),
        # Qwen3-14B's group of 5 query heads per kv head (not a power of two), head_dim 128
        pytest.param(
            dict(num_attention_heads=10, num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-5),
            id="G5-d128",
        ),
    ],
)
def test_prefill_and_the_last_cache_slot_at_edge_shapes(
    rng: np.random.Generator, fields: dict[str, Any]
) -> None:
    """A one-layer model at edge shapes: the prefill logits of 63 tokens, then a decode step
    at position 63, the last row of its 64-row KV cache, against the float64 reference."""
    cfg = tiny(num_hidden_layers=1, rope_theta=1e6, **fields)
    seed = int(rng.integers(2**31))
    model = Qwen3.random(cfg, seed=seed, dtype=ct.f16)
    w = rounded(random_weights(cfg, seed), ct.f16)
    seq = [int(i) for i in rng.integers(0, cfg.vocab_size, size=63)]
    cache = _Cache(cfg, 64, ct.f16)
    assert cache.capacity == 64
    s = model._prefill(np.array(seq, np.int32), cache)
    s.op().sync()
    s.settle()
    want = ref.logits(cfg, w, seq)
    np.testing.assert_allclose(s.env["logits"].to_numpy(), want, rtol=0, atol=ATOL[ct.f16])
    seq.append(int(np.argmax(want[-1])))
    step = DecodeGraph(model, cache)
    try:
        nxt = step.step(seq[-1], 63)
        got = step.logits()
        np.testing.assert_allclose(got, ref.logits(cfg, w, seq)[-1], rtol=0, atol=ATOL[ct.f16])
        assert nxt == int(np.argmax(got))
    finally:
        step.release()
