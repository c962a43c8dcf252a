# mypy: disable-error-code="no-untyped-def, untyped-decorator, misc"
"""Compile Triton's warp-specialized Hopper GEMM to PTX for sm_90a, with no GPU, into
`ws_matmul_sm90.ptx` beside this file.

Dev-only, like `generate_hopper.py` beside it (run it with a Python that has Triton):

    /work/venv-triton/bin/python tests/triton_oracle/generate_hopper_ws.py

The GEMM of `generate_hopper.py`'s `tma_matmul_sm90` with its K loop marked
`tl.range(..., warp_specialize=True)`, 64x128 tiles, num_warps=4: Triton splits it into a
producer warp group issuing the TMA loads and consumer warp groups running `wgmma`
(`.reqntid 384`, `setmaxnreg`), handing stages over through "full" and "empty" mbarriers and
syncing on named barriers. (With 128x128 tiles Triton 3.9's warp-specialization pass fails;
with num_warps=8 the loop is not specialized.)

The file starts with the same comment as `generate_hopper.py` writes (num_warps is the
option given; Triton adds the producer's and consumers' warps).
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
def ws_matmul_kernel(a_desc, b_desc, c_desc, M, N, K,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """C = A @ B through tensor descriptors, the K loop warp-specialized by Triton."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BK), warp_specialize=True):
        a = a_desc.load([pid_m * BM, k * BK])
        b = b_desc.load([k * BK, pid_n * BN])
        acc = tl.dot(a, b, acc)
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.float16))


BLOCKS = {"BM": 64, "BN": 128, "BK": 64}
OPTIONS = {"num_warps": 4, "num_stages": 3}


def main() -> None:
    src = ASTSource(
        fn=ws_matmul_kernel,
        signature={"a_desc": "tensordesc<fp16[64, 64]>", "b_desc": "tensordesc<fp16[64, 128]>",
                   "c_desc": "tensordesc<fp16[64, 128]>", "M": "i32", "N": "i32", "K": "i32",
                   **dict.fromkeys(BLOCKS, "constexpr")},
        constexprs=BLOCKS,
    )  # fmt: skip
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=OPTIONS)
    boxes = [
        {"block": d["block_size"], "swizzle": d["swizzle"]}
        for d in (k.metadata.tensordesc_meta or [])
    ]
    head = (
        f"// triton {triton.__version__} sm_90a num_warps={OPTIONS['num_warps']} "
        f"shared={k.metadata.shared} constexprs={BLOCKS} descriptors={boxes} "
        f"options={OPTIONS} threads={k.metadata.num_warps * 32}: "
        "tests/triton_oracle/generate_hopper_ws.py\n"
    )
    (HERE / "ws_matmul_sm90.ptx").write_text(head + k.asm["ptx"])
    print(f"ws_matmul_sm90.ptx: {k.metadata.num_warps} warps, {k.metadata.shared} bytes of "
          f"shared memory, descriptors {boxes}")  # fmt: skip


if __name__ == "__main__":
    main()
