"""`cutile_py_kernels.attention` against NumPy float64 on sim and interpret (and cuda where a GPU
is found): causal and not, grouped-query heads, S_q = 1 and S_q = S_k, odd lengths, head_dim 64
and 128, f16 and bf16, the split-KV path with its merge, and the causal block skip."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
import cutile_py_kernels as ck
from cutile_py.ir.dtypes import round_to
from cutile_py_kernels.attention import AttentionPlan, attention_tile

DTYPES = [pytest.param(ct.f16, id="f16"), pytest.param(ct.bf16, id="bf16")]
#: Absolute tolerance on outputs of size ~1: the output rounding plus P rounded to the dtype
#: before the P·V product.
ATOL = {ct.f16: 4e-3, ct.bf16: 3e-2}


@pytest.fixture(params=["sim", "interpret", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield str(request.param)
    ct.set_backend("sim")


def reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float
) -> np.ndarray:
    """softmax(q kᵀ · scale) v per head in float64, GQA head h reading kv head h // G;
    causal: query i sees keys j <= i + S_k - S_q."""
    heads, sq, _ = q.shape
    kv_heads, sk, _ = k.shape
    group = heads // kv_heads
    out = np.zeros(q.shape)
    for h in range(heads):
        s = q[h] @ k[h // group].T * scale
        if causal:
            i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
            s = np.where(j <= i + sk - sq, s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[h] = p / p.sum(axis=1, keepdims=True) @ v[h // group]
    return out


def rand(rng: np.random.Generator, shape: tuple[int, ...], dt: Any) -> tuple[np.ndarray, Any]:
    a = round_to(rng.standard_normal(shape).astype(np.float32), dt)
    return a.astype(np.float64), ct.from_numpy(a, dt)


#: (heads, kv_heads, S_q, S_k, head_dim, causal)
CASES = [
    (2, 2, 33, 33, 64, True),  # prefill, S_q = S_k, odd, two row blocks
    (4, 2, 1, 1, 64, True),  # the first decode step: S_q = S_k = 1
    (4, 1, 1, 203, 128, True),  # decode, G = 4: split-KV and merge
    (2, 1, 17, 45, 64, False),  # not causal, odd lengths, GQA
    (6, 2, 7, 300, 128, True),  # short prefill onto a long cache: split-KV, causal
    (2, 2, 70, 70, 128, True),  # three row blocks, blocks above the diagonal skipped
    (3, 3, 5, 40, 64, False),  # not causal, S_q < S_k, no GQA
    (4, 1, 24, 24, 64, True),  # causal row blocks holding queries of two heads
    (2, 2, 150, 150, 64, True),  # 64x64 tiles: three row blocks, a partial key block
    (4, 2, 40, 77, 64, True),  # 64x64 tiles: S_q < S_k, row blocks spanning two heads
]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "h{}kv{}_q{}_k{}_d{}_{}".format(*c))
def test_attention_matches_float64(
    backend: str, rng: np.random.Generator, dt: Any, case: tuple[int, ...]
) -> None:
    heads, kv_heads, sq, sk, d, causal = case
    q, qt = rand(rng, (heads, sq, d), dt)
    k, kt = rand(rng, (kv_heads, sk, d), dt)
    v, vt = rand(rng, (kv_heads, sk, d), dt)
    out = ck.attention(qt, kt, vt, causal=bool(causal))
    assert out.dtype is dt and out.shape == (heads, sq, d)
    want = reference(q, k, v, bool(causal), 1 / np.sqrt(d))
    np.testing.assert_allclose(out.to_numpy().astype(np.float64), want, rtol=0, atol=ATOL[dt])
    qt.to_numpy(), kt.to_numpy(), vt.to_numpy()  # the inputs stay usable


def test_split_kv_is_taken_for_short_queries() -> None:
    """The cases meant for the split path take it (and the long ones do not)."""
    split = AttentionPlan(ct.f16, 1, 4, 1, 128, 203, True, 1.0)
    assert split.splits > 1
    assert AttentionPlan(ct.f16, 2, 21, 7, 128, 300, True, 1.0).splits > 1
    assert AttentionPlan(ct.f16, 2, 70, 70, 128, 70, True, 1.0).splits == 1


@pytest.mark.parametrize("dt", DTYPES)
def test_explicit_scale(backend: str, rng: np.random.Generator, dt: Any) -> None:
    q, qt = rand(rng, (2, 9, 64), dt)
    k, kt = rand(rng, (1, 9, 64), dt)
    v, vt = rand(rng, (1, 9, 64), dt)
    out = ck.attention(qt, kt, vt, causal=True, scale=0.3)
    want = reference(q, k, v, True, 0.3)
    np.testing.assert_allclose(out.to_numpy().astype(np.float64), want, rtol=0, atol=ATOL[dt])


@pytest.mark.parametrize("d", [64, 128])
def test_blocks_above_the_causal_diagonal_are_not_read(rng: np.random.Generator, d: int) -> None:
    """V rows bm.. hold NaN (bm x bn the flash tile at head_dim d): queries 0..bm-1 (the first
    row block) see keys 0..bm-1 only, so their output is finite and exact only if no key block
    from bm on is loaded (a masked score gives p = 0, and 0 · NaN is NaN)."""
    bm, bn, _ = attention_tile(2 * 64, d)
    assert bm % bn == 0 and AttentionPlan(ct.f16, 1, 2 * bm, 2 * bm, d, 2 * bm, True, 1).splits == 1
    q, qt = rand(rng, (1, 2 * bm, d), ct.f16)
    k, kt = rand(rng, (1, 2 * bm, d), ct.f16)
    v = rng.standard_normal((1, 2 * bm, d)).astype(np.float32)
    v[:, bm:] = np.nan
    v = round_to(v, ct.f16)
    out = ck.attention(qt, kt, ct.from_numpy(v, ct.f16), causal=True).to_numpy()
    want = reference(q[:, :bm], k[:, :bm], v[:, :bm].astype(np.float64), True, d**-0.5)
    np.testing.assert_allclose(out[:, :bm].astype(np.float64), want, rtol=0, atol=ATOL[ct.f16])


def test_flash_tiles_per_head_dim() -> None:
    """The retuned tiles: 64x64 (8 warps) at head_dim 64, 32x32 at 128 (64x32 spills there);
    short queries keep 16 or 32 rows and 32 keys (the split-KV path). That they assemble
    without spills is checked by test_kernels_library's PTX cases."""
    assert attention_tile(4096, 64) == (64, 64, 8)
    assert attention_tile(4096, 128) == (32, 32, 0)
    assert attention_tile(8, 64) == (16, 32, 0) and attention_tile(20, 128) == (32, 32, 0)
    assert AttentionPlan(ct.f16, 2, 100, 50, 64, 100, True, 1.0).bm == 64


def test_attention_checks_its_inputs() -> None:
    z = ct.zeros((2, 4, 64), ct.f16)
    with pytest.raises(TypeError, match="f16 or bf16"):
        ck.attention(ct.zeros((2, 4, 64)), ct.zeros((2, 4, 64)), ct.zeros((2, 4, 64)))
    with pytest.raises(ValueError, match="multiple of k's"):
        ck.attention(ct.zeros((3, 4, 64), ct.f16), z, z)
    with pytest.raises(ValueError, match="expected q"):
        ck.attention(z, ct.zeros((2, 4, 64), ct.f16), ct.zeros((2, 5, 64), ct.f16))
    with pytest.raises(ValueError, match="multiple of 16"):
        w = ct.zeros((2, 4, 40), ct.f16)
        ck.attention(w, w, w)


@pytest.mark.parametrize("sq", [1, 5])
def test_keys_counted_on_the_device_over_a_longer_cache(
    backend: str, rng: np.random.Generator, sq: int
) -> None:
    """A KV cache of 200 rows holding 37 valid keys (the rest random, not padding): the key
    count is kv_len[0] + len_offset, read by the kernel, as a captured decode step does."""
    dt = ct.f16
    heads, kv_heads, d, sk = 4, 2, 64, 37
    q, _ = rand(rng, (heads, sq, d), dt)
    k, kt = rand(rng, (kv_heads, 200, d), dt)
    v, vt = rand(rng, (kv_heads, 200, d), dt)
    plan = AttentionPlan(dt, kv_heads, 2 * sq, sq, d, 200, True, 1 / 8)
    assert plan.splits > 1
    kv_len = ct.from_numpy(np.array([sk - 1], dtype=np.int32))
    q_rows = ct.from_numpy(round_to(q.reshape(kv_heads, 2 * sq, d).astype(np.float32), dt), dt)
    (o, *_) = plan.op(plan.partition(), q_rows, kt, vt, kv_len, 1).sync()
    got = o.unpartition().to_numpy().reshape(heads, sq, d).astype(np.float64)
    want = reference(q, k[:, :sk], v[:, :sk], True, 1 / 8)
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL[dt])


@pytest.mark.parametrize(("sq", "sk"), [(9, 4), (40, 3)])
def test_causal_queries_that_see_no_key_give_zero(
    rng: np.random.Generator, sq: int, sk: int
) -> None:
    """Causal with S_q > S_k (beyond the contract's S_q <= S_k): bottom-right aligned, queries
    i < S_q - S_k see no key and give 0 as the docstring says (not NaN), the others match
    the reference over the keys they see (split-KV path, and the flash path's row blocks)."""
    dt = ct.f16
    q, qt = rand(rng, (2, sq, 64), dt)
    k, kt = rand(rng, (1, sk, 64), dt)
    v, vt = rand(rng, (1, sk, 64), dt)
    out = ck.attention(qt, kt, vt, causal=True).to_numpy().astype(np.float64)
    blind = sq - sk
    assert np.all(out[:, :blind] == 0.0)
    want = reference(q[:, blind:], k, v, True, 1 / 8)
    np.testing.assert_allclose(out[:, blind:], want, rtol=0, atol=ATOL[dt])
