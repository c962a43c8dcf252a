"""Every library kernel with arguments as specs at representative shapes, for PTX checks
(`tests/test_kernels_library.py` assembles each for sm_80 and sm_90 and checks for spills)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import cutile_py as ct
from cutile_py import PartitionSpec as PS
from cutile_py import TensorSpec as TS
from cutile_py_kernels._common import row_launch, row_plan, row_warps
from cutile_py_kernels.activations import _gelu_kernel, _silu_mul_kernel, _tile
from cutile_py_kernels.attention import _attention_kernels, attention_tile
from cutile_py_kernels.autotune import candidates, default_config
from cutile_py_kernels.gemm import _gemm_kernel
from cutile_py_kernels.gemv import _gemv_kernel
from cutile_py_kernels.layout import _transpose_kernel, embedding_launch, transpose_tile
from cutile_py_kernels.norms import (
    ONE_PASS_CAP,
    _layer_norm_kernels,
    _rms_kernels,
    layer_norm_per_thread,
)
from cutile_py_kernels.rope import rope_kernel
from cutile_py_kernels.softmax import argmax_launch, softmax_launch

Case = tuple[str, ct.Kernel, tuple[Any, ...]]


def _rows(dt: type[ct.DType], r: int, n: int) -> Iterator[tuple[str, bool, PS, int]]:
    plan = row_plan(r, n, dt)
    tile = (1, -(-n // plan.width) * plan.width) if plan.loop else (plan.rows, plan.width)
    yield f"{dt.name} {r}x{n}", plan.loop, PS((r, n), tile, dt), plan.width


def _softmax_case(dt: type[ct.DType], r: int, n: int, causal: bool) -> Case:
    kernel, tile, tail = softmax_launch(dt, r, n, causal)
    label = f"{'causal ' if causal else ''}softmax {dt.name} {r}x{n}"
    return label, kernel, (PS((r, n), tile, dt), TS((r, n), dt), *tail)


def cases() -> Iterator[Case]:
    """(label, kernel, spec arguments) for each kernel of the library."""
    for dt in (ct.f32, ct.bf16):
        n = 1 << 20
        v = TS((n,), dt)
        yield (
            f"silu_mul {dt.name}",
            _silu_mul_kernel(dt),
            (PS((n,), (1024,), dt), v, v),
        )
        yield f"gelu {dt.name}", _gelu_kernel(dt), (PS((n,), (_tile(dt),), dt), v)
        for n, causal in ((32768, False), (40_000, False), (1024, True), (256, True)):
            yield _softmax_case(dt, 8, n, causal)
        # The one-tile norms past the chunked kernels' width, as the host functions launch
        # them (layer_norm f32 with its own per-thread rule: 64 a thread, 127 registers).
        rows16k, w16k = TS((8, 16384), dt), TS((16384,), dt)
        for name, family, per, extra in (
            ("rms_norm", _rms_kernels, None, (w16k, 1.0 / 16384, 1e-6)),
            ("layer_norm", _layer_norm_kernels, layer_norm_per_thread,
             (w16k, w16k, 16384, 1.0 / 16384, 1e-5)),
        ):  # fmt: skip
            launch = row_launch(family, 0, rows16k, ONE_PASS_CAP, per)
            out16k = PS((8, 16384), launch.tile, dt)
            yield f"{name} {dt.name} 8x16384 (one tile)", launch.kernel, (out16k, rows16k, *extra)
        for r, n in ((256, 1000), (256, 1536), (256, 4096), (8, 20_000)):
            for label, loop, out, width in _rows(dt, r, n):
                x, w = TS((r, n), dt), TS((n,), dt)
                tail = (width,) if loop else ()
                warps = row_warps(row_plan(r, n, dt))
                rms_tile, rms_loop, add_tile, add_loop = _rms_kernels(dt, warps)
                ln_tile, ln_loop = _layer_norm_kernels(dt, warps)
                yield (
                    f"rms_norm {label}",
                    rms_loop if loop else rms_tile,
                    (out, x, w, 1.0 / n, 1e-6, *tail),
                )
                yield (
                    f"add_rms_norm {label}",
                    add_loop if loop else add_tile,
                    (out, out, x, x, w, 1.0 / n, 1e-6, *tail),
                )
                yield (
                    f"layer_norm {label}",
                    ln_loop if loop else ln_tile,
                    (out, x, w, w, n, 1.0 / n, 1e-5, *tail),
                )
                yield _softmax_case(dt, r, n, False)
                am_kernel, am_rows, am_width = argmax_launch(dt, r, n)
                yield (
                    f"argmax {label}",
                    am_kernel,
                    (PS((r, 1), (am_rows, 1), ct.i32), x, am_width),
                )
        yield (
            f"rope {dt.name}",
            rope_kernel,
            (
                PS((512, 32, 128), (1, 32, 128), dt),
                TS((512, 32, 128), dt),
                TS((512,), ct.i32),
                TS((64,), ct.f32),
                TS((64,), ct.f32),
                0,
                4095,
            ),
        )
        t = transpose_tile(dt)
        yield (
            f"transpose {dt.name}",
            _transpose_kernel(dt),
            (PS((1000, 1003), (t, t), dt), TS((1003, 1000), dt)),
        )
        yield (
            f"embedding {dt.name}",
            embedding_launch(dt, 512, 4096)[0],
            (PS((512, 4096), (1, 4096), dt), TS((32_000, 4096), dt), TS((512,), ct.i32)),
        )
        bk = 256 if dt is ct.f32 else 512
        yield (
            f"gemv {dt.name}",
            _gemv_kernel(dt),
            (PS((4096,), (2048 // bk,), dt), TS((4096, 4096), dt), TS((4096,), dt), bk),
        )
    yield from _gemm_cases()
    yield from _attention_cases()
    yield from _qwen3_cases()


def _attention_cases() -> Iterator[Case]:
    """The flash kernel (prefill, 32 heads over 8 kv heads, 2048 tokens) and the split-KV
    decode kernel and its merge (4 query heads per kv head, 16 splits), head_dim 64 and 128."""
    for dt in (ct.f16, ct.bf16):
        for d in (64, 128):
            kv = TS((8, 2048, d), dt)
            n = TS((1,), ct.i32)
            rows = 4 * 2048
            bm, bn, warps = attention_tile(rows, d)
            flash, _, _ = _attention_kernels(dt, warps)
            yield (
                f"attention flash {dt.name} d{d} {bm}x{bn}",
                flash,
                (
                    PS((8, rows, d), (1, bm, d), dt),
                    TS((8, rows, d), dt),
                    kv,
                    kv,
                    n,
                    0,
                    2048,
                    True,
                    0.1,
                    bn,
                ),
            )
            bm, bn, warps = attention_tile(4, d)
            _, split, merge = _attention_kernels(dt, warps)
            parts = 8 * 16
            yield (
                f"attention split {dt.name} d{d}",
                split,
                (
                    PS((parts, bm, d), (1, bm, d), ct.f32),
                    PS((parts, bm, 1), (1, bm, 1), ct.f32),
                    PS((parts, bm, 1), (1, bm, 1), ct.f32),
                    TS((8, 4, d), dt),
                    kv,
                    kv,
                    n,
                    1,
                    1,
                    True,
                    0.1,
                    16,
                    bn,
                ),
            )
            part = TS((parts, bm, d), ct.f32)
            stat = TS((parts, bm, 1), ct.f32)
            yield (
                f"attention merge {dt.name} d{d}",
                merge,
                (PS((8, 4, d), (1, bm, d), dt), part, stat, stat, 16),
            )


def _gemm_cases() -> Iterator[Case]:
    """gemm and bmm at the default tiles and at the largest tuning candidates, plain and
    trans_b, for every input dtype (f16 to f32 output once)."""
    m, n, k = 1000, 1000, 1000
    for dt in (ct.f16, ct.bf16, ct.f32):
        cands = candidates(dt, m, n, k)
        widest = max(cands, key=lambda c: (c.bm * c.bn, c.stages))
        deepest = max(cands, key=lambda c: (c.bk, c.bm * c.bn))
        for cfg in sorted({default_config(dt, m, n, k), widest, deepest}):
            for trans_b in (False, True):
                b = TS((n, k) if trans_b else (k, n), dt)
                label = (
                    f"{dt.name} {cfg.bm}x{cfg.bn}x{cfg.bk}/{cfg.stages}"
                    f"{' trans_b' if trans_b else ''}"
                )
                yield (
                    f"gemm {label}",
                    _gemm_kernel(dt, dt, trans_b, False, cfg.stages),
                    (PS((m, n), (cfg.bm, cfg.bn), dt), TS((m, k), dt), b, cfg.bk),
                )
        cfg = default_config(dt, m, n, k)
        yield (
            f"bmm {dt.name} {cfg.bm}x{cfg.bn}x{cfg.bk}",
            _gemm_kernel(dt, dt, False, True),
            (
                PS((8, 256, 256), (1, cfg.bm, cfg.bn), dt),
                TS((8, 256, 128), dt),
                TS((8, 128, 256), dt),
                cfg.bk,
            ),
        )
    yield (
        "gemm f16->f32 64x64x32",
        _gemm_kernel(ct.f16, ct.f32, False, False),
        (PS((m, n), (64, 64), ct.f32), TS((m, k), ct.f16), TS((k, n), ct.f16), 32),
    )


def _qwen3_cases() -> Iterator[Case]:
    """The Qwen3 model's own kernels at the Qwen3-4B shape (32 query and 8 kv heads of 128,
    hidden 2560, intermediate 9728): a 512-token prefill and a decode step over a 4096-row KV
    cache."""
    from cutile_py_kernels.models.qwen3 import CACHE_BLOCK, TOKEN_BLOCK
    from cutile_py_kernels.models.qwen3_kernels import (
        decode_gemv_kernels,
        mlp_kernels,
        qwen3_kernels,
    )

    t, nq, nkv, d, cap = 512, 32, 8, 128, 4096
    hid, inter = 2560, 9728
    for dt in (ct.f16, ct.bf16):
        q_prep, kv_prefill, decode_prep, tokens_first = qwen3_kernels(dt)
        w, table, pos = TS((d,), dt), TS((cap, d // 2), ct.f32), TS((1,), ct.i32)
        cache = PS((nkv, cap, d), (1, CACHE_BLOCK, d), dt)
        for tokens, bt in ((t, TOKEN_BLOCK), (1, 1)):
            qkv = TS((tokens, nq + 2 * nkv, d), dt)
            yield (
                f"qwen3 q_prep {dt.name} T={tokens}",
                q_prep,
                (PS((nq, tokens, d), (1, bt, d), dt), qkv, w, table, table, pos, 1e-6),
            )
        qkv = TS((t, nq + 2 * nkv, d), dt)
        yield (
            f"qwen3 kv_prefill {dt.name}",
            kv_prefill,
            (cache, cache, qkv, w, table, table, nq, nkv, 1e-6),
        )
        qkv1 = TS((1, nq + 2 * nkv, d), dt)
        whole = PS((nkv, cap, d), (1, cap, d), dt)
        q1 = PS((nkv, nq // nkv, d), (1, nq // nkv, d), dt)
        yield (
            f"qwen3 decode_prep {dt.name}",
            decode_prep,
            (q1, whole, whole, qkv1, w, w, table, table, pos, nq, nkv, 1e-6),
        )
        vec = TS((hid,), dt)
        for odt in (dt, ct.f32):
            norm_gemv, _ = decode_gemv_kernels(dt, odt)
            yield (
                f"qwen3 norm_gemv {dt.name}->{odt.name}",
                norm_gemv,
                (
                    PS((2 * inter,), (4,), odt),
                    TS((2 * inter, hid), dt),
                    vec,
                    vec,
                    1 / hid,
                    1e-6,
                    512,
                ),
            )
        yield (
            f"qwen3 gemv_add {dt.name}",
            decode_gemv_kernels(dt, dt)[1],
            (PS((hid,), (4,), dt), TS((hid, nq * d), dt), TS((nq * d,), dt), vec, 512),
        )
        yield (
            f"qwen3 tokens_first {dt.name}",
            tokens_first,
            (PS((t, nq, d), (TOKEN_BLOCK, 1, d), dt), TS((nq, t, d), dt)),
        )
        swiglu_rows, swiglu_down = mlp_kernels(dt)
        yield (
            f"qwen3 swiglu_rows {dt.name}",
            swiglu_rows,
            (PS((t, inter), (1, 2048), dt), TS((t, 2, inter), dt)),
        )
        yield (
            f"qwen3 swiglu_down {dt.name}",
            swiglu_down,
            (PS((hid,), (4,), dt), TS((hid, inter), dt), TS((1, 2, inter), dt), vec, 512),
        )
