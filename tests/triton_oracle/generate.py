# mypy: disable-error-code="no-untyped-def, untyped-decorator, misc"
"""Compile the Triton kernels below to PTX for sm_80, with no GPU, into this folder.

Dev-only: Triton is no dependency of cutile_py. Run it with a Python that has Triton:

    python -m venv /tmp/venv-triton && /tmp/venv-triton/bin/pip install triton numpy
    /tmp/venv-triton/bin/python tests/triton_oracle/generate.py

Each `<name>.ptx` starts with a comment naming the Triton version, the target, the warps and
the dynamic shared memory the launch needs (Triton's `metadata.shared`); `test_triton_oracle.py`
reads that line. Triton appends two scratch pointers to every kernel's parameters.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, said outright

import triton  # type: ignore[import-not-found, unused-ignore]
import triton.language as tl  # type: ignore[import-not-found, unused-ignore]
from triton.backends.compiler import GPUTarget  # type: ignore[import-not-found, unused-ignore]
from triton.compiler import ASTSource  # type: ignore[import-not-found, unused-ignore]

HERE = Path(__file__).parent


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    """Triton's tutorial softmax: one program per row."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * in_stride + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_stride + offs, num / den, mask=mask)


@triton.jit
def layer_norm_kernel(out_ptr, in_ptr, w_ptr, b_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    """Layer norm of one row per program, with weight and bias."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * stride + offs, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    y = d / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + row * stride + offs, y * w + b, mask=mask)


@triton.jit
def argmax_kernel(out_ptr, in_ptr, stride, n_cols, BLOCK: tl.constexpr):
    """The index of each row's largest element (the first of ties)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(in_ptr + row * stride + offs, mask=offs < n_cols, other=-float("inf"))
    tl.store(out_ptr + row, tl.argmax(x, axis=0))


@triton.jit
def attention_kernel(
    Q,
    K,
    V,
    Out,
    sm_scale,
    stride_h,
    N_CTX,
    HEAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Flash-attention forward in the form of Triton's fused-attention tutorial (online
    softmax in base 2, two tensor-core dots a step, f16 in and out), not causal: program
    (i, h) computes rows i*BLOCK_M.. of head h; N_CTX a multiple of both blocks."""
    start_m = tl.program_id(0)
    base = tl.program_id(1) * stride_h
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD)
    q = tl.load(Q + base + offs_m[:, None] * HEAD + offs_d[None, :])
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    for start_n in range(0, N_CTX, BLOCK_N):
        k = tl.load(K + base + (start_n + offs_n)[None, :] * HEAD + offs_d[:, None])
        qk = tl.dot(q, k) * qk_scale
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(V + base + (start_n + offs_n)[:, None] * HEAD + offs_d[None, :])
        acc = tl.dot(p.to(tl.float16), v, acc)
        m_i = m_ij
    acc = acc / l_i[:, None]
    tl.store(Out + base + offs_m[:, None] * HEAD + offs_d[None, :], acc.to(tl.float16))


KERNELS: list[tuple[Any, dict[str, str], dict[str, int], dict[str, int]]] = [
    (
        softmax_kernel,
        {"out_ptr": "*fp32", "in_ptr": "*fp32", "in_stride": "i32", "out_stride": "i32",
         "n_cols": "i32", "BLOCK": "constexpr"},
        {"BLOCK": 1024},
        {"num_warps": 4},
    ),
    (
        layer_norm_kernel,
        {"out_ptr": "*fp32", "in_ptr": "*fp32", "w_ptr": "*fp32", "b_ptr": "*fp32",
         "stride": "i32", "n_cols": "i32", "eps": "fp32", "BLOCK": "constexpr"},
        {"BLOCK": 512},
        {"num_warps": 4},
    ),
    (
        argmax_kernel,
        {"out_ptr": "*i32", "in_ptr": "*fp32", "stride": "i32", "n_cols": "i32",
         "BLOCK": "constexpr"},
        {"BLOCK": 256},
        {"num_warps": 2},
    ),
    (
        attention_kernel,
        {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "sm_scale": "fp32",
         "stride_h": "i32", "N_CTX": "i32", "HEAD": "constexpr", "BLOCK_M": "constexpr",
         "BLOCK_N": "constexpr"},
        {"HEAD": 64, "BLOCK_M": 64, "BLOCK_N": 32},
        {"num_warps": 4, "num_stages": 2},
    ),
]  # fmt: skip


def main() -> None:
    target = GPUTarget("cuda", 80, 32)
    for fn, signature, constexprs, options in KERNELS:
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        k = triton.compile(src, target=target, options=options)
        warps = options["num_warps"]
        head = (
            f"// triton {triton.__version__} sm_80 num_warps={warps} "
            f"shared={k.metadata.shared} constexprs={constexprs} options={options}: "
            "tests/triton_oracle/generate.py\n"
        )
        name = fn.__name__.removesuffix("_kernel")
        (HERE / f"{name}.ptx").write_text(head + k.asm["ptx"])
        print(f"{name}.ptx: {k.metadata.shared} bytes of shared memory, {warps} warps")


if __name__ == "__main__":
    main()
