"""Triton's versions of the memory-bound library kernels, compiled for sm_90 with no GPU.

Run with the Python that has Triton (`python -m paper_repro.peers.triton_sass`, this
repository on PYTHONPATH); it needs nothing of cutile_py. It prints one JSON object per case:
its name, Triton's PTX, the threads of one program, the programs, the elements and the
trips of its loop (1 for straight-line code), for `paper_repro.kernels_sass` to assemble and
count like ours.
"""

# mypy: disable-error-code="no-untyped-def,misc,untyped-decorator"

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without a warning

import triton  # type: ignore[import-not-found, import-untyped, unused-ignore]
import triton.language as tl  # type: ignore[import-not-found, import-untyped, unused-ignore]
from triton.backends.compiler import GPUTarget  # type: ignore[import-not-found, import-untyped, unused-ignore]
from triton.compiler import ASTSource  # type: ignore[import-not-found, import-untyped, unused-ignore]

from paper_repro.peers import triton_kernels as tk


@triton.jit
def _saxpy_kernel(x_ptr, y_ptr, z_ptr, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(z_ptr + offs, a * x + y, mask=mask)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, z_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask).to(tl.float32)
    tl.store(z_ptr + offs, (g * tl.sigmoid(g) * u).to(z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_rms_norm_kernel(out_ptr, h_ptr, x_ptr, r_ptr, w_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    base = row.to(tl.int64) * n_cols
    x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
    res = tl.load(r_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
    h = (x + res).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + base + cols, h, mask=mask)
    hf = h.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + base + cols, (hf * r * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_kernel(out_ptr, x_ptr, w_ptr, b_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    base = row.to(tl.int64) * n_cols
    x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    r = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + base + cols, (d * r * w + b).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _transpose_kernel(y_ptr, x_ptr, m, n, BLOCK: tl.constexpr):
    # y (n, m) = x (m, n).T, one BLOCK x BLOCK tile per program.
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (i[:, None] < m) & (j[None, :] < n)
    t = tl.load(x_ptr + i[:, None] * n + j[None, :], mask=mask)
    tl.store(y_ptr + j[None, :] * m + i[:, None], t, mask=mask)


@triton.jit
def _embedding_kernel(y_ptr, table_ptr, ids_ptr, d, BLOCK: tl.constexpr):
    row = tl.load(ids_ptr + tl.program_id(0)).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    t = tl.load(table_ptr + row * d + cols, mask=mask)
    tl.store(y_ptr + tl.program_id(0).to(tl.int64) * d + cols, t, mask=mask)


@triton.jit
def _argmax_kernel(y_ptr, x_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row.to(tl.int64) * n_cols + cols, mask=cols < n_cols, other=-float("inf"))
    tl.store(y_ptr + row, tl.argmax(x.to(tl.float32), axis=0).to(tl.int32))


_T = {"f32": "*fp32", "bf16": "*bf16"}
#: (tokens, heads, head_dim) of the rope case, (M, K) of the gemv case.
ROPE = (4096, 32, 128)
GEMV = (4096, 4096)


def _row_warps(block: int) -> int:
    return int(tk._row_warps(block))


def cases() -> list[dict[str, Any]]:
    """(name, kernel, signature, constants, warps, programs, elements) of each case."""
    out: list[dict[str, Any]] = []
    flat = 1 << 22
    for dt in ("f32", "bf16"):
        p = _T[dt]
        if dt == "f32":
            out.append(
                dict(
                    name="add f32",
                    fn=tk._add_kernel,
                    warps=4,
                    programs=flat // 1024,
                    elements=flat,
                    constants={"BLOCK": 1024},
                    sig={"x_ptr": p, "y_ptr": p, "z_ptr": p, "n": "i32"},
                )
            )
            out.append(
                dict(
                    name="saxpy f32",
                    fn=_saxpy_kernel,
                    warps=4,
                    programs=flat // 1024,
                    elements=flat,
                    constants={"BLOCK": 1024},
                    sig={"x_ptr": p, "y_ptr": p, "z_ptr": p, "a": "fp32", "n": "i32"},
                )
            )
        block = 1024 if dt == "f32" else 2048
        out.append(
            dict(
                name=f"silu_mul {dt}",
                fn=_silu_mul_kernel,
                warps=4,
                programs=flat // block,
                elements=flat,
                constants={"BLOCK": block},
                sig={"g_ptr": p, "u_ptr": p, "z_ptr": p, "n": "i32"},
            )
        )
        out.append(
            dict(
                name=f"gelu {dt}",
                fn=tk._gelu_kernel,
                warps=4,
                programs=flat // block,
                elements=flat,
                constants={"BLOCK": block},
                sig={"x_ptr": p, "z_ptr": p, "n": "i32"},
            )
        )
        for h in (1536, 2048, 4096):
            block = triton.next_power_of_2(h)
            out.append(
                dict(
                    name=f"rms_norm {dt} 4096x{h}",
                    fn=tk._rms_norm_kernel,
                    warps=_row_warps(block),
                    programs=4096,
                    elements=4096 * h,
                    constants={"BLOCK": block},
                    sig={"out_ptr": p, "x_ptr": p, "w_ptr": p, "n_cols": "i32", "eps": "fp32"},
                )
            )
        for h in (1536, 2048, 4096):
            block = triton.next_power_of_2(h)
            out.append(
                dict(
                    name=f"add_rms_norm {dt} 4096x{h}",
                    fn=_add_rms_norm_kernel,
                    warps=_row_warps(block),
                    programs=4096,
                    elements=4096 * h,
                    constants={"BLOCK": block},
                    sig={"out_ptr": p, "h_ptr": p, "x_ptr": p, "r_ptr": p, "w_ptr": p,
                         "n_cols": "i32", "eps": "fp32"},
                )
            )  # fmt: skip
            out.append(
                dict(
                    name=f"layer_norm {dt} 4096x{h}",
                    fn=_layer_norm_kernel,
                    warps=_row_warps(block),
                    programs=4096,
                    elements=4096 * h,
                    constants={"BLOCK": block},
                    sig={"out_ptr": p, "x_ptr": p, "w_ptr": p, "b_ptr": p, "n_cols": "i32",
                         "eps": "fp32"},
                )
            )  # fmt: skip
        out.append(
            dict(
                name=f"transpose {dt} 4096x4096",
                fn=_transpose_kernel,
                warps=4,
                programs=64 * 64,
                elements=4096 * 4096,
                constants={"BLOCK": 64},
                sig={"y_ptr": p, "x_ptr": p, "m": "i32", "n": "i32"},
            )
        )
        out.append(
            dict(
                name=f"embedding {dt} 4096x4096",
                fn=_embedding_kernel,
                warps=_row_warps(4096),
                programs=4096,
                elements=4096 * 4096,
                constants={"BLOCK": 4096},
                sig={"y_ptr": p, "table_ptr": p, "ids_ptr": "*i32", "d": "i32"},
            )
        )
        for n in (1024, 32768):
            out.append(
                dict(
                    name=f"argmax {dt} 4096x{n}",
                    fn=_argmax_kernel,
                    warps=_row_warps(n),
                    programs=4096,
                    elements=4096 * n,
                    constants={"BLOCK": n},
                    sig={"y_ptr": "*i32", "x_ptr": p, "n_cols": "i32"},
                )
            )
        for n in (1024, 32768):
            out.append(
                dict(
                    name=f"softmax {dt} 4096x{n}",
                    fn=tk._softmax_kernel,
                    warps=_row_warps(n),
                    programs=4096,
                    elements=4096 * n,
                    constants={"BLOCK": n, "CAUSAL": False},
                    sig={"out_ptr": p, "in_ptr": p, "n_cols": "i32", "seq": "i32"},
                )
            )
        t, heads, d = ROPE
        hb = tk.rope_heads(heads, d)
        out.append(
            dict(
                name=f"rope {dt} {t}x{heads}x{d}",
                fn=tk._rope_kernel,
                warps=2,
                programs=t * (heads // hb),
                elements=t * heads * d,
                constants={"HEADS": heads, "HB": hb, "HALF": d // 2},
                sig={
                    "y_ptr": p,
                    "x_ptr": p,
                    "pos_ptr": "*i32",
                    "fh_ptr": "*fp32",
                    "fl_ptr": "*fp32",
                },
            )
        )
        m, k = GEMV
        bm, bk = tk.gemv_tile(k)
        out.append(
            dict(
                name=f"gemv {dt} {m}x{k}",
                fn=tk._gemv_kernel,
                warps=2,
                programs=m // bm,
                elements=m * k,
                trips=k // bk,
                constants={"BM": bm, "BK": bk},
                sig={"y_ptr": p, "a_ptr": p, "x_ptr": p, "m": "i32", "k": "i32"},
            )
        )
        out.append(
            dict(
                name=f"causal softmax {dt} 16x1024x1024",
                fn=tk._softmax_kernel,
                warps=_row_warps(1024),
                programs=16 * 1024,
                elements=16 * 1024 * 1024,
                constants={"BLOCK": 1024, "CAUSAL": True},
                sig={"out_ptr": p, "in_ptr": p, "n_cols": "i32", "seq": "i32"},
            )
        )
    return out  # fmt: skip


def compile_case(case: dict[str, Any]) -> dict[str, Any]:
    sig = dict(case["sig"])
    sig.update({k: "constexpr" for k in case["constants"]})
    # As Triton's launcher specializes them for these shapes: 16-byte aligned pointers and
    # sizes that are multiples of 16 (the tensors' own sizes here), so loads vectorize.
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, (k, t) in enumerate(case["sig"].items())
        if t.startswith("*") or t == "i32"
    }
    src = ASTSource(case["fn"], sig, constexprs=dict(case["constants"]), attrs=aligned)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": case["warps"]})
    return {
        "name": case["name"],
        "ptx": k.asm["ptx"],
        "threads": 32 * case["warps"],
        "programs": case["programs"],
        "elements": case["elements"],
        "trips": case.get("trips", 1),
    }


def main() -> int:
    for case in cases():
        print(json.dumps(compile_case(case)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
