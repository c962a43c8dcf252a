"""PTX that Triton compiled (for sm_80, with no GPU: `triton_oracle/generate.py`) run on sim
against NumPy. Code nobody here wrote: it exercises the parser, the semantics and the race
detector on another compiler's idioms (every lane of a warp storing its reduction's result to
one shared word, butterfly shuffles, `.loc` debug lines, trailing scratch pointers)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import cutile_py as ct

ORACLE = Path(__file__).parent / "triton_oracle"


def load(name: str) -> tuple[ct.RawKernel, int, int, int]:
    """The kernel, its threads per block, dynamic shared bytes and BLOCK constant."""
    text = (ORACLE / f"{name}.ptx").read_text()
    head = re.match(r"// triton \S+ sm_80 num_warps=(\d+) shared=(\d+) .*'BLOCK': (\d+)", text)
    assert head, f"{name}.ptx: no generate.py header"
    warps, shared, block = (int(g) for g in head.groups())
    return ct.RawKernel(text, f"{name}_kernel"), 32 * warps, shared, block


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
    kernel, threads, shared, block = load("argmax")
    rows, cols = 9, block - int(rng.integers(0, block // 2))  # one program covers a row
    x = rng.integers(-20, 20, size=(rows, cols)).astype(np.float32)  # many ties
    out = ct.full((rows,), -1, ct.i32)
    out, *_ = kernel(
        out, ct.from_numpy(x), cols, cols, 0, 0, grid=rows, block=threads, shared_mem=shared
    ).sync()
    np.testing.assert_array_equal(out.to_numpy(), np.argmax(x, axis=1))
