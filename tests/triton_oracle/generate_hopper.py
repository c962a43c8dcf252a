# mypy: disable-error-code="no-untyped-def, untyped-decorator, misc"
"""Compile Triton's Hopper GEMMs to PTX for sm_90a, with no GPU, into this folder.

Dev-only, like `generate.py` beside it (run it with a Python that has Triton):

    /tmp/venv-triton/bin/python tests/triton_oracle/generate_hopper.py

- `matmul_sm90.ptx`: the tutorial GEMM (pointer loads with masks). With 16-divisible
  pointers and strides Triton pipelines it with `cp.async` into 128-byte-swizzled shared
  memory and multiplies with `wgmma.mma_async` (A K-major, B N-major), three stages.
- `tma_matmul_sm90.ptx`: the same GEMM on host-made tensor descriptors: `cp.async.bulk.tensor`
  loads signalling `mbarrier`s (`arrive.expect_tx`, `try_wait.parity`), `elect.sync`,
  `wgmma`, and a `stmatrix` + TMA-store epilogue. Each descriptor is a 128-byte `.param`
  followed by its shape and strides; the header names each one's box and swizzle.
- `persistent_tma_matmul_sm90.ptx`: that GEMM on a persistent grid (a block takes tiles b,
  b + blocks, ...), the tile and K loops flattened into one, so the TMA ring and its
  mbarrier phases run on across tiles, with a TMA store per tile.

Each file starts with a comment that `test_triton_oracle_hopper.py` reads.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, said outright

import triton  # type: ignore[import-not-found, unused-ignore]
import triton.language as tl  # type: ignore[import-not-found, unused-ignore]
from triton.backends.compiler import GPUTarget  # type: ignore[import-not-found, unused-ignore]
from triton.compiler import ASTSource  # type: ignore[import-not-found, unused-ignore]

HERE = Path(__file__).parent


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """C = A @ B, f16 in and out, f32 accumulation; any M, N, K (masked edges)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K - k * BK)
        b_mask = (offs_k[:, None] < K - k * BK) & (offs_n[None, :] < N)
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += BK * stride_bk
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc.to(tl.float16), c_mask)


@triton.jit
def tma_matmul_kernel(a_desc, b_desc, c_desc, M, N, K,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """C = A @ B through tensor descriptors (out-of-bounds boxes read zeros)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a = a_desc.load([pid_m * BM, k * BK])
        b = b_desc.load([k * BK, pid_n * BN])
        acc = tl.dot(a, b, acc)
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.float16))


@triton.jit
def persistent_tma_matmul_kernel(a_desc, b_desc, c_desc, M, N, K,
                                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """C = A @ B by a persistent grid: program p takes output tiles p, p + programs, ...
    (row-major tile order); the tile loop and the K loop flattened into one pipelined loop,
    so its TMA ring and mbarrier phases run on from one tile to the next."""
    tiles_n = tl.cdiv(N, BN)
    k_steps = tl.cdiv(K, BK)
    tiles = tl.cdiv(M, BM) * tiles_n
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=True):
        row = (tile // tiles_n) * BM
        col = (tile % tiles_n) * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, k_steps):
            acc = tl.dot(a_desc.load([row, k * BK]), b_desc.load([k * BK, col]), acc)
        c_desc.store([row, col], acc.to(tl.float16))


BLOCKS = {"BM": 128, "BN": 128, "BK": 64}
OPTIONS = {"num_warps": 4, "num_stages": 3}
SCALARS = {"M": "i32", "N": "i32", "K": "i32"}


def main() -> None:
    target = GPUTarget("cuda", 90, 32)
    pointers = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16"}
    strides = {"stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32"}
    consts = dict.fromkeys(BLOCKS, "constexpr")
    kernels = [
        (
            "matmul_sm90",
            ASTSource(
                fn=matmul_kernel,
                signature={**pointers, **SCALARS, **strides, **consts},
                constexprs=BLOCKS,
                # what Triton's launcher infers for 16-byte-aligned pointers and strides (the
                # K; M and N stay unconstrained: the masks handle ragged edges)
                attrs={(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 5, 6, 7, 8)},
            ),
        ),
        (
            "tma_matmul_sm90",
            ASTSource(
                fn=tma_matmul_kernel,
                signature={"a_desc": "tensordesc<fp16[128, 64]>",
                           "b_desc": "tensordesc<fp16[64, 128]>",
                           "c_desc": "tensordesc<fp16[128, 128]>", **SCALARS, **consts},
                constexprs=BLOCKS,
            ),
        ),
        (
            "persistent_tma_matmul_sm90",
            ASTSource(
                fn=persistent_tma_matmul_kernel,
                signature={"a_desc": "tensordesc<fp16[128, 64]>",
                           "b_desc": "tensordesc<fp16[64, 128]>",
                           "c_desc": "tensordesc<fp16[128, 128]>", **SCALARS, **consts},
                constexprs=BLOCKS,
            ),
        ),
    ]  # fmt: skip
    for name, src in kernels:
        k = triton.compile(src, target=target, options=OPTIONS)
        boxes = [
            {"block": d["block_size"], "swizzle": d["swizzle"]}
            for d in (k.metadata.tensordesc_meta or [])
        ]
        head = (
            f"// triton {triton.__version__} sm_90a num_warps={OPTIONS['num_warps']} "
            f"shared={k.metadata.shared} constexprs={BLOCKS} descriptors={boxes} "
            f"options={OPTIONS}: tests/triton_oracle/generate_hopper.py\n"
        )
        (HERE / f"{name}.ptx").write_text(head + k.asm["ptx"])
        print(f"{name}.ptx: {k.metadata.shared} bytes of shared memory, descriptors {boxes}")


if __name__ == "__main__":
    main()
