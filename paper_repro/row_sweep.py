"""Elements per thread of the one-tile row kernels, timed on a GPU at short rows.

    PYTHONPATH=. python -m paper_repro.row_sweep [--kernels rms_norm,softmax] [--per 16,32]
                                                 [--widths 1024,4096] [--causal-warps 1,2,4,8]
                                                 [--causal-exact 1,0] [--rounds 3]
                                                 [--block-elems 2048,4096]
                                                 [--gelu-tiles 1024,4096] [--dtype bf16]
                                                 [--quick]

The one-tile norms give each thread `_common.per_thread(plan)` elements (f32: 16 for tiles
wider than 1024 and narrower than 4096, else 32; the table `PER_THREAD_BY_WIDTH`), softmax
its own `PER_THREAD` (32). At rows this short a whole problem is a few microseconds of memory
traffic, and how many loads are in flight (registers, hence warps per SM), not instructions
alone, may set the time. This times each kernel the way `python -m paper_repro bandwidth`
does (the launches the host function makes, replayed on rotated buffer sets, CUDA events)
with each per-thread count of `--per`, beside the copy ceiling, and prints a Markdown table;
the `library` column marks the count the library picks. Beside the copy ceiling (2^28
floats) each shape has the copy of its own bytes (the same PTX copy kernel or
cuMemcpyDtoDAsync, the better): at a few tens of megabytes a copy does not reach the ceiling
either. Every table's variants, and Triton's kernel where installed (rms_norm, GELU, the
causal softmax), are prepared once on the same inputs and timed in `--rounds` (3)
interleaved rounds: each row the median of its rounds, `spread` their range over it, so that
a difference of 1-2% is told from run-to-run noise. `--quick` runs tiny shapes on sim (a
check of the script only).

The next GPU lease confirms the norms' rule with the defaults: rms_norm, add_rms_norm and
layer_norm at 1024, 1536, 2048, 3072 and 4096, 16 and 32 elements per thread (f32).

`--block-elems 2048,4096` times the f32 norms with blocks of that many elements as well
(rows a block: it over the width; one row a block is how Triton's kernels run them), each
with every `--per`; a column says the rows a block.

`--kernels gelu` times GELU f32 (`--dtype`: or f16, bf16) at 2^26 and 2^28 elements with
each of `--gelu-tiles` elements a block (`activations._tile`: 4 KiB of input, 1024 f32, since
an H200 ran it at 0.99 of the copy ceiling where 4096 ran at 0.96; 2048 bf16 by analogy)
beside Triton's.

`--kernels softmax_causal` times the causal softmax instead (the bandwidth experiment's
shapes, 16 x 1024^2, 4 x 2048^2 and 1 x 4096^2, f32 or `--dtype`) with each of
`--causal-warps` warps a block (`softmax.CAUSAL_WARPS`: a warp a row of 1024 f32, so also
rows a block), each reading the chunk a row ends in element by element and whole
(`--causal-exact 1,0`, `softmax.CAUSAL_EXACT`: the visible triangle only, or 1.04x its
bytes), beside Triton's in the same run where it is installed.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Any
from unittest import mock

import numpy as np

import cutile_py as ct
from cutile_py_kernels import _common, activations, norms
from paper_repro.core import Context
from paper_repro.experiments import bandwidth
from paper_repro.experiments.common import (
    CT_DTYPES,
    copy_ceiling,
    peer_missing,
    same_size_copy,
)
from paper_repro.machine import describe
from paper_repro.peers import row_warps
from paper_repro.timing import Timer

softmax_mod: Any = importlib.import_module("cutile_py_kernels.softmax")  # not the function
WIDTHS = (1024, 1536, 2048, 3072, 4096)
KERNELS = "rms_norm,add_rms_norm,layer_norm"
PER_THREAD = (16, 32)
CAUSAL_SHAPES = ((16, 1024, 1024), (4, 2048, 2048), (1, 4096, 4096))
CAUSAL_WARPS = (1, 2, 4, 8)
GELU_SIZES = (1 << 26, 1 << 28)
GELU_TILES = (1024, 2048, 4096, 8192)


@contextmanager
def elements_per_thread(per: int, block_elems: int | None = None) -> Iterator[None]:
    """The row kernels (norms and softmax) with `per` elements per thread at every width,
    and f32 blocks of `block_elems` elements (rows a block: `block_elems` // width; the
    library's `_common.BLOCK_ELEMS` when None), as launched inside; the library's rule again
    after."""
    saved = (_common.PER_THREAD_BY_WIDTH, softmax_mod.PER_THREAD, norms.LAYER_NORM_WIDE,
             _common.BLOCK_ELEMS)  # fmt: skip
    _common.PER_THREAD_BY_WIDTH = ((1 << 30, per),)
    softmax_mod.PER_THREAD = per
    norms.LAYER_NORM_WIDE = 1 << 30  # layer_norm's own rule for long rows off
    if block_elems is not None:
        _common.BLOCK_ELEMS = {**_common.BLOCK_ELEMS, ct.f32: block_elems}
    _common._ROW_LAUNCHES.clear()
    try:
        yield
    finally:
        (_common.PER_THREAD_BY_WIDTH, softmax_mod.PER_THREAD, norms.LAYER_NORM_WIDE,
         _common.BLOCK_ELEMS) = saved  # fmt: skip
        _common._ROW_LAUNCHES.clear()


def causal_sweep(
    ctx: Context,
    copy: float,
    warps: list[int],
    exacts: list[bool],
    dtype: str = "f32",
    rounds: int = 3,
) -> None:
    """Markdown rows: the causal softmax in `dtype` by warps a block and by how it reads the
    chunk each row ends in (`softmax.CAUSAL_EXACT`), then Triton's (where installed), each
    prepared once and timed in `rounds` interleaved rounds (`bandwidth.timed_rounds`): the
    median of the rounds and their spread, so that a difference of 1-2% is told from noise."""
    spec = {s.name: s for s in bandwidth.SPECS}["softmax_causal"]
    print("| kernel | shape | CAUSAL_WARPS | exact | library | rows a block | us | GB/s "
          "| of copy | of same-size copy | spread |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in [(1, 256, 256)] if ctx.quick else CAUSAL_SHAPES:
        label = f"{'x'.join(map(str, shape))} {dtype}"
        heads: dict[str, str] = {}
        variants: dict[str, bandwidth.Preparer] = {}
        for w in warps:
            for exact in exacts:
                mark = "yes" if (w, exact) == (softmax_mod.CAUSAL_WARPS,
                                               softmax_mod.CAUSAL_EXACT) else ""  # fmt: skip
                patch = partial(
                    mock.patch.multiple, softmax_mod, CAUSAL_WARPS=w, CAUSAL_EXACT=exact
                )
                with patch():
                    r = shape[0] * shape[1]
                    _, tile, _ = softmax_mod.softmax_launch(CT_DTYPES[dtype], r, shape[2], True)
                key = f"{w}/{int(exact)}"
                heads[key] = (
                    f"| softmax_causal | {label} | {w} | {'yes' if exact else 'no'} | {mark} "
                    f"| {tile[0]} |"
                )
                variants[key] = partial(_prepare_patched, patch, ctx, spec, shape, dtype)
        if not ctx.quick and peer_missing("triton") is None:
            theirs = row_warps(_common.next_pow2(shape[2]))  # `triton_kernels.softmax`: a row each
            heads["triton"] = f"| triton | {label} | {theirs} | yes | | 1 |"
            variants["triton"] = partial(bandwidth.prepare_peer, ctx, spec, "triton", shape, dtype)
        rows = _rounds(ctx, spec, shape, dtype, variants, rounds)
        # after the variants' buffers are gone: the copy of the same bytes
        same = same_size_copy(ctx, bandwidth.spec_bytes(spec, shape, dtype))
        for key, head in heads.items():
            print(f"{head} {_cells(copy, same, rows[key])} {rows[key].get('spread', '')} |",
                  flush=True)  # fmt: skip


def _prepare_patched(
    patch: Callable[[], AbstractContextManager[Any]],
    ctx: Context,
    spec: bandwidth.Spec,
    shape: tuple[int, ...],
    dtype: str,
    arrays: list[np.ndarray],
) -> bandwidth.Prepared:
    """The library's function for `spec` prepared while `patch()` holds: the launch it
    replays is fixed then, by the library's rules as patched (a variant of a sweep)."""
    fn = getattr(importlib.import_module("cutile_py_kernels"), spec.name.removesuffix("_causal"))
    with patch():
        return bandwidth.prepare_cutile(ctx, spec, fn, shape, dtype, arrays)


def _rounds(
    ctx: Context,
    spec: bandwidth.Spec,
    shape: tuple[int, ...],
    dtype: str,
    variants: dict[str, bandwidth.Preparer],
    rounds: int,
) -> dict[str, dict[str, Any]]:
    """Each variant's row by its key (`bandwidth.timed_rounds`: prepared on the same inputs,
    its launch fixed then, by the library's rules as patched inside it; timed in `rounds`
    interleaved rounds), or its error row."""
    rows, _ = bandwidth.timed_rounds(ctx, spec, shape, dtype, variants, rounds)
    return {str(row["impl"]): row for row in rows}


def _cells(copy: float, same: float, row: dict[str, Any]) -> str:
    """`us | GB/s | of copy | of same-size copy |` of a sweep's row, or its error."""
    if row.get("status") != "ok":
        return f"error: {row.get('note')} | | | |"
    gbps = float(row["gbps"] or 0)
    return f"{row['time_us']} | {gbps:.0f} | {gbps / copy:.3f} | {gbps / same:.3f} |"


def gelu_sweep(
    ctx: Context, copy: float, tiles: list[int], dtype: str = "f32", rounds: int = 3
) -> None:
    """Markdown rows: GELU in `dtype` by elements a block (`activations._tile`), then
    Triton's (where installed), at 2^26 and 2^28 elements, timed in `rounds` interleaved
    rounds (the median and the rounds' spread)."""
    spec = {s.name: s for s in bandwidth.SPECS}["gelu"]
    library = activations._tile(CT_DTYPES[dtype])
    print("| kernel | elements | dtype | per block | library | us | GB/s | of copy "
          "| of same-size copy | spread |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape in [(1 << 12,)] if ctx.quick else [(n,) for n in GELU_SIZES]:
        heads: dict[str, str] = {}
        variants: dict[str, bandwidth.Preparer] = {}
        for tile in tiles:
            mark = "yes" if tile == library else ""
            heads[str(tile)] = f"| gelu | {shape[0]} | {dtype} | {tile} | {mark} |"
            patch = partial(mock.patch.object, activations, "_tile", lambda dt, t=tile: t)
            variants[str(tile)] = partial(_prepare_patched, patch, ctx, spec, shape, dtype)
        if not ctx.quick and peer_missing("triton") is None:
            heads["triton"] = f"| triton | {shape[0]} | {dtype} | 1024 | |"
            variants["triton"] = partial(bandwidth.prepare_peer, ctx, spec, "triton", shape, dtype)
        got = _rounds(ctx, spec, shape, dtype, variants, rounds)
        same = same_size_copy(ctx, bandwidth.spec_bytes(spec, shape, dtype))
        for key, head in heads.items():
            cells = _cells(copy, same, got[key])
            print(f"{head} {cells} {got[key].get('spread', '')} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper_repro.row_sweep")
    p.add_argument("--kernels", default=KERNELS)
    p.add_argument("--per", default=",".join(map(str, PER_THREAD)),
                   help="elements per thread to time, comma-separated")  # fmt: skip
    p.add_argument("--causal-warps", default=",".join(map(str, CAUSAL_WARPS)),
                   help="warps a block of the causal softmax to time (softmax_causal)")  # fmt: skip
    p.add_argument("--causal-exact", default="1,0",
                   help="softmax_causal: 1 reads the chunk each row ends in element by element "
                        "(the visible part only), 0 whole")  # fmt: skip
    p.add_argument("--block-elems", default="",
                   help="f32 elements a block of the norms to time (rows a block: this over the "
                        "width), comma-separated; the library's when not given")  # fmt: skip
    p.add_argument("--gelu-tiles", default=",".join(map(str, GELU_TILES)),
                   help="elements a block of GELU to time (gelu)")  # fmt: skip
    p.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"],
                   help="the dtype of gelu and softmax_causal (the norms: f32)")  # fmt: skip
    p.add_argument("--widths", default=",".join(map(str, WIDTHS)),
                   help="row lengths to time (4096 rows each), comma-separated")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds of each variant and Triton's")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="tiny shapes on sim")
    args = p.parse_args(argv)
    bad = [v for v in args.causal_exact.split(",") if v not in ("0", "1")]
    if bad:
        p.error(f"--causal-exact: expected 1 (element by element) or 0 (whole), got {bad[0]!r}")
    if args.rounds < 1:
        p.error(f"--rounds: expected at least 1, got {args.rounds}")
    ct.set_backend("sim" if args.quick else "cuda")
    backend = ct.backend()
    device = describe(backend)
    l2 = device.get("l2_bytes")
    reps = 3 if args.quick else 15
    ctx = Context(backend, args.quick, Timer(backend, reps, 1 if args.quick else 2), 0, device)
    ctx.l2_bytes = int(l2) if isinstance(l2, int) else 0
    copy = max(float(r.get("gbps") or 0) for r in copy_ceiling(ctx))
    specs = {s.name: s for s in bandwidth.SPECS}
    rows_n = 8 if args.quick else bandwidth.ROWS
    widths = (64, 96) if args.quick else tuple(int(v) for v in args.widths.split(","))
    pers = [int(v) for v in args.per.split(",")]
    print(f"# one-tile row kernels by elements per thread ({device.get('gpu', backend)})")
    print(f"copy ceiling {copy:.0f} GB/s\n")
    names = args.kernels.split(",")
    sweeps: dict[str, Callable[[], None]] = {
        "gelu": lambda: gelu_sweep(
            ctx, copy, [int(v) for v in args.gelu_tiles.split(",")], args.dtype, args.rounds
        ),
        "softmax_causal": lambda: causal_sweep(
            ctx,
            copy,
            [int(v) for v in args.causal_warps.split(",")],
            [v == "1" for v in args.causal_exact.split(",")],
            args.dtype,
            args.rounds,
        ),
    }
    for name, sweep in sweeps.items():  # tables of their own, before the norms'
        if name in names:
            names.remove(name)
            sweep()
            if not names:
                return 0
            print()
    blocks: list[int | None] = [int(v) for v in args.block_elems.split(",") if v] or [None]
    print("| kernel | shape | per thread | library | warps | us | GB/s | of copy "
          "| of same-size copy | rows a block | spread |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        spec = specs[name]
        for w in widths:
            norms_table(ctx, copy, spec, (rows_n, w), pers, blocks, args.rounds)
    return 0


def norms_table(
    ctx: Context,
    copy: float,
    spec: bandwidth.Spec,
    shape: tuple[int, int],
    pers: list[int],
    blocks: list[int | None],
    rounds: int,
) -> None:
    """Markdown rows: norm `spec` (f32) at `shape` with each elements-a-thread count and
    block size, and Triton's rms_norm where installed (a row a program), timed in `rounds`
    interleaved rounds."""
    name = spec.name
    chosen = _launch(name, shape)
    heads: dict[str, tuple[str, int]] = {}  # the cells before the time, the rows a block
    variants: dict[str, bandwidth.Preparer] = {}
    for block in blocks:
        for per in pers:
            patch = partial(elements_per_thread, per, block)
            with patch():
                warps, rows = _launch(name, shape)
            mark = "yes" if (warps, rows) == chosen else ""
            key = f"{per}/{block}"
            heads[key] = f"| {name} | {shape[0]}x{shape[1]} | {per} | {mark} | {warps} |", rows
            variants[key] = partial(_prepare_patched, patch, ctx, spec, shape, "f32")
    if name == "rms_norm" and not ctx.quick and peer_missing("triton") is None:
        block_t = _common.next_pow2(shape[1])  # `triton_kernels.rms_norm`: a row a program
        warps_t = row_warps(block_t)
        per_t = block_t // (32 * warps_t)
        heads["triton"] = f"| triton | {shape[0]}x{shape[1]} | {per_t} | | {warps_t} |", 1
        variants["triton"] = partial(bandwidth.prepare_peer, ctx, spec, "triton", shape, "f32")
    got = _rounds(ctx, spec, shape, "f32", variants, rounds)
    same = same_size_copy(ctx, spec.nbytes(shape))  # after the variants' buffers are gone
    for key, (head, rows) in heads.items():
        cells = _cells(copy, same, got[key])
        print(f"{head} {cells} {rows} | {got[key].get('spread', '')} |", flush=True)


def _launch(name: str, shape: tuple[int, int]) -> tuple[int, int]:
    """The warps and rows a block the library picks for f32 `shape` (under the current
    rule)."""
    r, n = shape
    if name == "softmax":
        plan, warps = softmax_mod.softmax_plan(r, n, ct.f32)
        return int(warps), plan.rows
    plan = _common.row_plan(r, n, ct.f32, norms.ONE_PASS_CAP)
    if name == "layer_norm" and not plan.loop:
        return _common.row_warps(plan, norms.layer_norm_per_thread(plan)), plan.rows
    return _common.row_warps(plan), plan.rows


if __name__ == "__main__":
    raise SystemExit(main())
