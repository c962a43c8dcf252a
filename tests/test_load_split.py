"""A tile load in a loop splits off the tensor's edge (`lower.emit_memory`): a thread whose
accesses all lie inside the tensor loads them unchecked and writes no padding; the others
check each access. Results match NumPy on sim at ragged shapes (threads of one tile on both
paths), with 0 and -inf padding, for 32- and 16-bit elements and for sub-tiles of a block's
own tile; a load outside a loop stays as it was."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

if TYPE_CHECKING:
    ConstInt = int
else:
    ConstInt = ct.Constant[int]

T = TypeVar("T")
R = TypeVar("R")
W = TypeVar("W")
NEG_INF = -math.inf


@ct.kernel(num_warps=2)
def chunk_sums(y: Mut[Tensor[f32, R]], x: Tensor[T, Dyn, Dyn], C: ConstInt) -> None:
    """y[i] = sum of row i of x, over chunks of C columns (padding 0)."""
    acc = ct.zeros((y.shape[0], C), f32)
    for k in range(ct.cdiv(x.shape[1], C)):
        acc = acc + ct.load(x, (ct.bid(0), k), (y.shape[0], C)).astype(f32)
    y.store(ct.sum(acc, axis=1))


@ct.kernel(num_warps=2)
def chunk_maxes(y: Mut[Tensor[f32, R]], x: Tensor[T, Dyn, Dyn], C: ConstInt) -> None:
    """y[i] = max of row i of x, over chunks of C columns (padding -inf)."""
    acc = ct.full((y.shape[0], C), NEG_INF, f32)
    for k in range(ct.cdiv(x.shape[1], C)):
        t = ct.load(x, (ct.bid(0), k), (y.shape[0], C), padding=NEG_INF).astype(f32)
        acc = ct.maximum(acc, t)
    y.store(ct.max(acc, axis=1))


@ct.kernel(num_warps=2)
def row_sums(y: Mut[Tensor[f32, R]], x: Tensor[T, Dyn, Dyn], C: ConstInt) -> None:
    """y[i] = sum of row i of x, read in one tile of C columns (no loop)."""
    y.store(ct.sum(ct.load(x, (ct.bid(0), 0), (y.shape[0], C)).astype(f32), axis=1))


@ct.kernel(num_warps=2)
def doubled_in_chunks(y: Mut[Tensor[f32, R, W]], C: ConstInt) -> None:
    """y *= 2, the block's own tile read and written back in chunks of C columns."""
    for k in range(y.shape[1] // C):
        ct.store(y, (0, k), ct.load(y, (0, k), (y.shape[0], C)) * 2.0)


DTYPES = [ct.f32, ct.bf16, ct.f16, ct.i32]
#: (rows, columns, rows a block, columns a chunk): interior tiles only; edges along both
#: dims (the last chunk and the last block ragged, some threads of a tile inside and some
#: not); fewer columns than a chunk; fewer rows than a block.
SHAPES = [(16, 1024, 8, 128), (13, 1000, 8, 128), (5, 200, 8, 64), (3, 40, 4, 64)]


def _inputs(rng: np.random.Generator, dt: type[ct.DType], shape: tuple[int, int]) -> np.ndarray:
    if dt is ct.i32:
        return rng.integers(-1000, 1000, shape).astype(np.int32)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize(("rows", "n", "br", "c"), SHAPES)
def test_loop_loads_match_numpy_at_every_edge(
    rng: np.random.Generator, dt: type[ct.DType], rows: int, n: int, br: int, c: int
) -> None:
    ct.set_backend("sim", target="sm_90")
    xt = ct.from_numpy(_inputs(rng, dt, (rows, n)), dt)
    x = xt.to_numpy().astype(np.float64)  # as the dtype holds them
    (sums, _, _) = chunk_sums(ct.empty((rows,)).partition(br), xt, c).sync()
    bound = 1e-6 * np.abs(x).sum(axis=1)  # f32 sums of up to 1024 terms
    assert (np.abs(sums.unpartition().to_numpy() - x.sum(axis=1)) <= bound).all()
    (maxes, _, _) = chunk_maxes(ct.empty((rows,)).partition(br), xt, c).sync()
    np.testing.assert_array_equal(maxes.unpartition().to_numpy(), x.max(axis=1))


def test_sub_tiles_of_a_blocks_own_tile_split_too(rng: np.random.Generator) -> None:
    """Chunks of the block's own tile of a ragged partition: the last block's tile runs past
    the tensor along both dims, and nothing past it is read or written."""
    ct.set_backend("sim", target="sm_90")
    x = rng.standard_normal((13, 300)).astype(np.float32)
    (y, _) = doubled_in_chunks(ct.from_numpy(x).partition((8, 256)), 64).sync()
    np.testing.assert_array_equal(y.unpartition().to_numpy(), 2 * x)
    ptx = doubled_in_chunks.ptx(ct.from_numpy(x).partition((8, 256)), 64, target=90)
    assert "$__edge_" in ptx


def _loads(ptx: str) -> tuple[int, int]:
    """(predicated, unpredicated) global loads of a PTX listing."""
    loads = re.findall(r"^\s*(@%p\d+ )?ld\.global", ptx, re.MULTILINE)
    return sum(1 for p in loads if p), sum(1 for p in loads if not p)


@pytest.mark.parametrize("dt", [ct.f32, ct.bf16], ids=lambda d: d.name)
def test_a_loop_load_takes_an_unchecked_path(dt: type[ct.DType]) -> None:
    """Each load of the loop appears twice: unchecked and zero-padding-free inside the
    tensor, checked at its edge; the one-tile kernel's load is checked only."""
    x = ct.TensorSpec((64, 1024), dt)
    looped = chunk_sums.ptx(ct.PartitionSpec((64,), (8,)), x, 128, target=90)
    checked, unchecked = _loads(looped)
    assert looped.count("bra $__edge_") == 1 and checked == unchecked > 0
    # No padding is written on the unchecked path: between its branch and the edge label
    # nothing but loads, address arithmetic and the branch past the edge.
    fast = looped.split("bra $__edge_")[1].split("$__edge_")[0]
    assert "mov.b32" not in fast and "mov.f32" not in fast
    one_tile = row_sums.ptx(ct.PartitionSpec((64,), (8,)), x, 1024, target=90)
    checked, unchecked = _loads(one_tile)
    assert "$__edge_" not in one_tile and unchecked == 0 and checked > 0


@ct.kernel(num_warps=2)
def column_sums(y: Mut[Tensor[f32, W]], x: Tensor[T, Dyn, W], C: ConstInt) -> None:
    """y = sums down the columns of x, read in chunks of C whole rows."""
    acc = ct.zeros((C, y.shape[0]), f32)
    for k in range(ct.cdiv(x.shape[0], C)):
        acc = acc + ct.load(x, (k, 0), (C, y.shape[0])).astype(f32)
    y.store(ct.sum(acc, axis=0))


def _edge_requests(rows: int, dt: type[ct.DType]) -> int:
    """Global requests the loads of `column_sums`' edge path make on sim ((rows, 1000), 2
    rows a chunk), found by the PTX lines between its labels."""
    args = (ct.PartitionSpec((1000,), (1000,)), ct.TensorSpec((rows, 1000), dt), 2)
    ptx = column_sums.ptx(*args, target=90).splitlines()
    start = next(k for k, line in enumerate(ptx, 1) if re.match(r"\$__edge_\d+:", line))
    end = next(k for k, line in enumerate(ptx, 1) if re.match(r"\$__loaded_\d+:", line))
    report = column_sums.report(*args, target="sm_90")
    return sum(a.requests for a in report.global_accesses if start < a.line < end)


@pytest.mark.parametrize("dt", [ct.f32, ct.bf16], ids=lambda d: d.name)
def test_a_layout_wider_than_the_tile_takes_the_edge_path_only_at_the_edge(
    rng: np.random.Generator, dt: type[ct.DType]
) -> None:
    """1000 columns on 64 threads of 4-element vectors: the layout spans 1024, and the
    threads holding columns 1000..1023 hold nothing there. Checked at their farthest offset,
    they took the edge path at every chunk (f32 sm_90 SASS an element 3.49 without the
    split, 3.31 with it so, 2.50 now); only the ragged last chunk of 63 rows takes it."""
    ct.set_backend("sim", target="sm_90")
    assert _edge_requests(64, dt) == 0
    assert _edge_requests(63, dt) > 0
    for rows in (64, 63):
        xt = ct.from_numpy(rng.standard_normal((rows, 1000)).astype(np.float32), dt)
        (y, _, _) = column_sums(ct.empty((1000,)).partition(1000), xt, 2).sync()
        want = xt.to_numpy().astype(np.float64).sum(axis=0)
        np.testing.assert_allclose(y.unpartition().to_numpy(), want, rtol=1e-5, atol=1e-5)
