"""Triton's f16 GEMM (the tutorial's matmul: masked pointer loads, GROUP_M order, f32 sums),
compiled for sm_80 with no GPU. Run with the Python that has Triton
(`python -m paper_repro.peers.triton_gemm BM BN BK STAGES WARPS`); it prints the PTX for
`paper_repro.kloop_sass` to assemble and count like ours.
"""

# mypy: disable-error-code="no-untyped-def,misc,untyped-decorator"

from __future__ import annotations

import os
import sys

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without a warning

import triton  # type: ignore[import-not-found, import-untyped, unused-ignore]
import triton.language as tl  # type: ignore[import-not-found, import-untyped, unused-ignore]
from triton.backends.compiler import GPUTarget  # type: ignore[import-not-found, import-untyped, unused-ignore]
from triton.compiler import ASTSource  # type: ignore[import-not-found, import-untyped, unused-ignore]


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbk, scm,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            GROUP_M: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    width = GROUP_M * tiles_n
    first = (pid // width) * GROUP_M
    rows = min(tiles_m - first, GROUP_M)
    pm = first + (pid % rows)
    pn = (pid % width) // rows
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None] * sam + rk[None, :]
    b = b_ptr + rk[:, None] * sbk + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        x = tl.load(a, mask=(rm[:, None] < M) & (rk[None, :] < K - k * BK), other=0.0)
        y = tl.load(b, mask=(rk[:, None] < K - k * BK) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, y)
        a += BK
        b += BK * sbk
    c = c_ptr + rm[:, None] * scm + rn[None, :]
    tl.store(c, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def ptx(bm: int, bn: int, bk: int, stages: int, warps: int) -> str:
    sig = {name: "*fp16" for name in ("a_ptr", "b_ptr")} | {"c_ptr": "*fp32"}
    sig |= {name: "i32" for name in ("M", "N", "K", "sam", "sbk", "scm")}
    sig |= {name: "constexpr" for name in ("BM", "BN", "BK", "GROUP_M")}
    src = ASTSource(
        fn=_matmul,
        signature=sig,
        constexprs={"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8},
        # Pointers and sizes divisible by 16, as Triton specializes them at a launch with
        # 4096-multiples: 16-byte copies.
        attrs={(i,): [["tt.divisibility", 16]] for i in range(9)},
    )
    options = {"num_warps": warps, "num_stages": stages}
    return str(triton.compile(src, target=GPUTarget("cuda", 80, 32), options=options).asm["ptx"])


if __name__ == "__main__":
    sys.stdout.write(ptx(*(int(x) for x in sys.argv[1:6])))
