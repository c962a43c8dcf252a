"""PTX that Triton compiled (for sm_80, with no GPU: `triton_oracle/generate.py`) run on sim
against NumPy. Code nobody here wrote: it exercises the parser, the semantics and the race
detector on another compiler's idioms (every lane of a warp storing its reduction's result to
one shared word, butterfly shuffles, `.loc` debug lines, trailing scratch pointers)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

import cutile_py as ct

ORACLE = Path(__file__).parent / "triton_oracle"


def load(name: str) -> tuple[ct.RawKernel, int, int, dict[str, int]]:
    """The kernel, its threads per block, dynamic shared bytes and constexpr values."""
    text = (ORACLE / f"{name}.ptx").read_text()
    head = re.match(r"// triton \S+ sm_80 num_warps=(\d+) shared=(\d+) constexprs=(\{.*?\})", text)
    assert head, f"{name}.ptx: no generate.py header"
    consts: dict[str, int] = ast.literal_eval(head.group(3))
    return ct.RawKernel(text, f"{name}_kernel"), 32 * int(head[1]), int(head[2]), consts


@pytest.mark.parametrize("cols", [1, 37, 1000, 1024])
def test_softmax(rng: np.random.Generator, cols: int) -> None:
    kernel, threads, shared, _ = load("softmax")
    rows = 6
    x = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
    out = ct.full((rows, cols), np.nan, ct.f32)
    out, *_ = kernel(
        out, ct.from_numpy(x), cols, cols, cols, 0, 0, grid=rows, block=threads, shared_mem=shared
    ).sync()
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(
        out.to_numpy(), e / e.sum(axis=1, keepdims=True), rtol=2e-6, atol=1e-7
    )


def test_layer_norm(rng: np.random.Generator) -> None:
    kernel, threads, shared, _ = load("layer_norm")
    rows, cols, eps = 5, 300, 1e-5
    x = (rng.standard_normal((rows, cols)) * 3 + 1).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    out = ct.full((rows, cols), np.nan, ct.f32)
    out, *_ = kernel(
        out, ct.from_numpy(x), ct.from_numpy(w), ct.from_numpy(b), cols, cols, eps, 0, 0,
        grid=rows, block=threads, shared_mem=shared,
    ).sync()  # fmt: skip
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    want = (x64 - mean) / np.sqrt(x64.var(axis=1, keepdims=True) + eps) * w + b
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-4, atol=1e-5)


def test_argmax_takes_the_first_of_ties(rng: np.random.Generator) -> None:
    kernel, threads, shared, consts = load("argmax")
    block = consts["BLOCK"]
    rows, cols = 9, block - int(rng.integers(0, block // 2))  # one program covers a row
    x = rng.integers(-20, 20, size=(rows, cols)).astype(np.float32)  # many ties
    out = ct.full((rows,), -1, ct.i32)
    out, *_ = kernel(
        out, ct.from_numpy(x), cols, cols, 0, 0, grid=rows, block=threads, shared_mem=shared
    ).sync()
    np.testing.assert_array_equal(out.to_numpy(), np.argmax(x, axis=1))


def test_fused_attention(rng: np.random.Generator) -> None:
    """Tensor-core dots (ldmatrix, mma.sync m16n8k16), shared-memory staging across a
    two-stage pipelined loop, butterfly row reductions, exp2 and f16 packing."""
    kernel, threads, shared, c = load("attention")
    heads, n, d = 2, c["BLOCK_M"] * int(rng.integers(1, 3)), c["HEAD"]
    q, k, v = (rng.standard_normal((heads, n, d)).astype(np.float16) for _ in range(3))
    scale = float(rng.uniform(0.05, 0.3))
    out = ct.full((heads, n, d), np.nan, ct.f16)
    _, _, _, out, *_ = kernel(
        ct.from_numpy(q), ct.from_numpy(k), ct.from_numpy(v), out, scale, n * d, n, 0, 0,
        grid=(n // c["BLOCK_M"], heads), block=threads, shared_mem=shared,
    ).sync()  # fmt: skip
    s = np.einsum("hnd,hmd->hnm", q.astype(np.float64), k.astype(np.float64)) * scale
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    want = np.einsum("hnm,hmd->hnd", p / p.sum(axis=-1, keepdims=True), v.astype(np.float64))
    # P is rounded to f16 before the second dot, and the output to f16.
    np.testing.assert_allclose(out.to_numpy().astype(np.float64), want, rtol=1e-2, atol=2e-3)


def test_softmax_result_does_not_depend_on_the_schedule(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three schedules (block order, warp order at stores) from the same memory agree."""
    monkeypatch.setenv("CUTILE_PY_SIM_SCHEDULES", "3")
    kernel, threads, shared, _ = load("softmax")
    rows, cols = 5, int(rng.integers(1, 1025))
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    out = ct.full((rows, cols), np.nan, ct.f32)
    out, *_ = kernel(
        out, ct.from_numpy(x), cols, cols, cols, 0, 0, grid=rows, block=threads, shared_mem=shared
    ).sync()
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(
        out.to_numpy(), e / e.sum(axis=1, keepdims=True), rtol=2e-6, atol=1e-7
    )
