"""The in-kernel tile language against NumPy: reductions, broadcasting, shape ops, sub-tile
loads and stores of Mut tiles, control flow over the new shapes, and the compile errors of
their misuse.

Every kernel test takes the `backend` fixture. It runs on `interpret` now; the same body runs
on `sim` (and on `cuda` where a GPU is found) once its test name is in SIM_READY, which the
lowering fills as each op lands. Inputs are random every run, with odd shapes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f16, f32, i32
from cutile_py.ir.dtypes import round_to

#: Test functions (names) whose kernels the PTX lowering handles: these also run on sim/cuda.
SIM_READY: set[str] = {
    "test_reductions",
    "test_arg_reductions_along_long_rows",
    "test_arg_reductions_across_warps_edge_values",
    "test_row_softmax_with_padding",
    "test_broadcasting",
    "test_arange_broadcast_to_a_grid",
    "test_transpose",
    "test_permute_rank3",
    "test_reshape",
    "test_expand_dims_and_broadcast_to",
    "test_item_and_compile_time_shape_facts",
    "test_sub_tile_loads_and_stores",
    "test_loop_carried_reduction_and_branch",
    "test_helper_with_reductions",
    "test_scalar_parameters_are_typed",
}

if TYPE_CHECKING:
    ConstInt = int  # a ct.Constant[int] parameter reads as an int inside the body
else:
    ConstInt = ct.Constant[int]

B = TypeVar("B")
N = TypeVar("N")
R = TypeVar("R")
C = TypeVar("C")
D = TypeVar("D")
Elem = f32  # the element dtype of kernels made per dtype: f32 for mypy, rebound by each


@pytest.fixture(
    params=["interpret", "sim", pytest.param("cuda", marks=pytest.mark.gpu)],
)
def backend(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    test = getattr(request.node, "originalname", request.node.name)
    if name != "interpret" and test not in SIM_READY:
        pytest.skip(f"{test} is not in SIM_READY: its ops are not lowered yet")
    ct.set_backend(name)
    return name


def run(
    kernel: Any, out_shape: tuple[int, ...], tile: tuple[int, ...], dtype: Any, *args: Any
) -> np.ndarray:
    """Launch with a poisoned output partition and return the output as NumPy."""
    poison = ct.full(out_shape, 12345 if not dtype.is_float() else np.nan, dtype)
    result = kernel(poison.partition(tile), *args).sync()
    return np.asarray(result[0].unpartition().to_numpy())


def odd_shape(rng: np.random.Generator, hi: int = 40) -> tuple[int, int]:
    return int(rng.integers(1, 12)), int(rng.integers(1, hi))


# -- reductions -------------------------------------------------------------------------------
REDUCTIONS = (ct.sum, ct.max, ct.min, ct.argmax, ct.argmin)
NP_REDUCTIONS: tuple[Callable[..., Any], ...] = (np.sum, np.max, np.min, np.argmax, np.argmin)
AXES: tuple[Any, ...] = (None, 0, 1, -1, -2, (0, 1), (1, 0))


def make_reduce(dt: type[ct.DType]) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotation below)

    @ct.kernel
    def k_reduce(
        z: Mut[Tensor[f32, N]],
        x: Tensor[Elem, Dyn, Dyn],
        R: ConstInt,
        C: ConstInt,
        K: ConstInt,
        A: ConstInt,
        KD: ConstInt,
    ) -> None:
        t = ct.load(x, (0, 0), (R, C))
        r = REDUCTIONS[K](t, axis=AXES[A], keepdims=KD == 1)
        z.store(ct.reshape(r.astype(f32), z.shape))

    return k_reduce


REDUCE_KERNELS = {d.name: make_reduce(d) for d in (f32, f16, i32)}


def np_reduce(k: int, x: np.ndarray, axis: Any, keepdims: bool, dt: type[ct.DType]) -> np.ndarray:
    if k == 0 and dt is f16:
        r = np.sum(x.astype(np.float32), axis=axis, keepdims=keepdims)
        return np.asarray(round_to(np.asarray(r), f16))
    if k == 0 and dt is i32:
        return np.asarray(np.sum(x, axis=axis, keepdims=keepdims, dtype=np.int32))
    return np.asarray(NP_REDUCTIONS[k](x, axis=axis, keepdims=keepdims))


@pytest.mark.parametrize("dt", [f32, f16, i32], ids=lambda d: d.name)
@pytest.mark.parametrize("k", range(5), ids=["sum", "max", "min", "argmax", "argmin"])
def test_reductions(backend: str, rng: np.random.Generator, k: int, dt: type[ct.DType]) -> None:
    r, c = odd_shape(rng)
    if dt is i32:
        x = rng.integers(-50, 50, (r, c)).astype(np.int32)
    else:
        x = round_to(rng.standard_normal((r, c)).astype(np.float32) * 4, dt)
        # Ties and a NaN: argmax/argmin pick the first extreme; max/min/argmax see the NaN.
        x.flat[int(rng.integers(0, x.size))] = x.flat[0]
        if rng.random() < 0.5:
            x.flat[int(rng.integers(0, x.size))] = np.nan
    for a, axis in enumerate(AXES):
        if k >= 3 and isinstance(axis, tuple):
            continue  # argmax/argmin take one axis
        for keepdims in (False, True):
            want = np_reduce(k, x, axis, keepdims, dt).astype(np.float32)
            got = run(
                REDUCE_KERNELS[dt.name],
                (max(want.size, 1),),
                (max(want.size, 1),),
                f32,
                ct.from_numpy(x, dt),
                r,
                c,
                k,
                a,
                int(keepdims),
            )
            what = f"{REDUCTIONS[k].__name__} axis={axis} keepdims={keepdims} of {x.shape}"
            if k == 0 and dt is not i32:
                tol = 1e-5 if dt is f32 else 1e-3
                np.testing.assert_allclose(got, want.reshape(-1), rtol=tol, atol=tol, err_msg=what)
            else:
                np.testing.assert_array_equal(got, want.reshape(-1), err_msg=what)


@pytest.mark.parametrize("dt", [f32, f16], ids=lambda d: d.name)
@pytest.mark.parametrize("c", [1000, 1024])
def test_arg_reductions_along_long_rows(
    backend: str, rng: np.random.Generator, dt: type[ct.DType], c: int
) -> None:
    """argmax/argmin along rows long enough that each thread combines several elements of its
    own in index order: ties, first NaN, NaN before and after larger values, all -inf, the
    extreme last; then rows of small integers (many ties) with 2% NaNs. As NumPy's."""
    rows = np.tile(np.arange(c, dtype=np.float32) % 7, (8, 1))
    rows[0] = 1.0
    rows[1, [3, 700]] = 50.0
    rows[2, [500, 900]] = np.nan
    rows[3, 0] = np.nan
    rows[4] = -np.inf
    rows[5] = -np.inf
    rows[5, c - 1] = 1.0
    rows[6, c - 1] = 60.0
    rows[7, [1, 2]] = np.nan
    ties = rng.integers(-3, 4, (8, c)).astype(np.float32)
    ties[rng.random((8, c)) < 0.02] = np.nan
    x = round_to(np.concatenate([rows, ties]), dt)
    for k in (3, 4):
        want = NP_REDUCTIONS[k](x, axis=1).astype(np.float32)
        got = run(REDUCE_KERNELS[dt.name], (16,), (16,), f32, ct.from_numpy(x, dt), 16, c, k, 2, 0)
        np.testing.assert_array_equal(got, want, err_msg=REDUCTIONS[k].__name__)


@pytest.mark.parametrize("dt", [f32, f16, i32], ids=lambda d: d.name)
def test_arg_reductions_across_warps_edge_values(backend: str, dt: type[ct.DType]) -> None:
    """The extremes of 1024-wide rows sit in different warps, so the cross-thread combine
    decides: zeros of both signs tie (the first wins), a NaN with its sign bit set is a NaN
    (first NaN wins, over +inf), integers at both ends of int32. As NumPy's."""
    c = 1024
    if dt is i32:
        x = np.zeros((4, c), np.int32)
        x[0, [900, 1000]] = np.iinfo(np.int32).max
        x[0, 5] = np.iinfo(np.int32).min
        x[1, [40, 990]] = np.iinfo(np.int32).min
        x[2, [1023, 600]] = -7
        x[3] = np.iinfo(np.int32).min
    else:
        x = np.full((6, c), 0.5, np.float32)
        x[0] = -1.0
        x[0, [600, 900]] = [-0.0, 0.0]  # argmax: tie at 600
        x[1] = 1.0
        x[1, [300, 800]] = [0.0, -0.0]  # argmin: tie at 300
        neg_nan = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
        x[2, [100, 700, 950]] = [np.inf, neg_nan, np.nan]
        x[3, [20, 999]] = [-np.inf, neg_nan]
        x[4, [1, 1000]] = [-0.0, -0.0]  # two -0.0 below 0.5: argmin at 1
        x[5] = -0.0
        x[5, 1023] = 0.0
        x = round_to(x, dt)
    rows = x.shape[0]
    for k in (3, 4):
        want = NP_REDUCTIONS[k](x, axis=1).astype(np.float32)
        got = run(REDUCE_KERNELS[dt.name], (rows,), (rows,), f32, ct.from_numpy(x, dt), rows, c,
                  k, 2, 0)  # fmt: skip
        np.testing.assert_array_equal(got, want, err_msg=REDUCTIONS[k].__name__)


@ct.kernel
def k_row_softmax(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    t = ct.load(x, (ct.bid(0), 0), z.shape, padding=-np.inf)
    e = ct.exp(t - ct.max(t, axis=1, keepdims=True))
    z.store(e / ct.expand_dims(ct.sum(e, axis=-1), 1))


def test_row_softmax_with_padding(backend: str, rng: np.random.Generator) -> None:
    rows, cols = int(rng.integers(5, 30)), int(rng.integers(2, 60))
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    tile = (4, cols + int(rng.integers(0, 5)))  # padded columns read -inf: exp gives 0
    out = run(k_row_softmax, (rows, tile[1]), tile, f32, ct.from_numpy(x))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out[:, :cols], e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(out[:, cols:], 0)


# -- broadcasting -----------------------------------------------------------------------------
@ct.kernel
def k_broadcast(
    z: Mut[Tensor[f32, R, C]],
    x: Tensor[f32, Dyn, Dyn],
    row: Tensor[f32, Dyn],
    col: Tensor[f32, Dyn, Dyn],
    s: float,
    K: ConstInt,
) -> None:
    t = ct.load_tile_like(x, z)
    rv = ct.load(row, (0,), (z.shape[1],))  # (C,): broadcasts along the rows
    cv = ct.load(col, (ct.bid(0), 0), (z.shape[0], 1))  # (R, 1): along the columns
    if K == 0:
        z.store(t + rv * cv - 2.0)
    elif K == 1:
        z.store(ct.where(cv > 0, t, rv))
    elif K == 2:
        z.store(ct.maximum(rv, cv) + ct.minimum(cv, s))
    elif K == 3:
        z.store(ct.fma(rv, cv, t))
    elif K == 4:
        m = ((t > rv) & (cv < 0.5)) | ~(rv > s)
        z.store(m.astype(f32))
    elif K == 5:
        z.store(ct.where(rv > 0, 1.0, cv) * s)
    else:
        z.store(ct.broadcast_to(rv, z.shape))  # a row repeated in every row of the tile


def np_broadcast(k: int, x: np.ndarray, rv: np.ndarray, cv: np.ndarray, s: float) -> Any:
    f = np.float32
    if k == 0:
        return x + rv * cv - f(2)
    if k == 1:
        return np.where(cv > 0, x, rv)
    if k == 2:
        return np.maximum(rv, cv) + np.minimum(cv, f(s))
    if k == 3:
        return (rv.astype(np.float64) * cv + x).astype(np.float32)
    if k == 4:
        return (((x > rv) & (cv < 0.5)) | ~(rv > f(s))).astype(np.float32)
    if k == 5:
        return np.where(rv > 0, f(1), cv) * f(s)
    return np.broadcast_to(rv, x.shape)


@pytest.mark.parametrize("k", range(7))
def test_broadcasting(backend: str, rng: np.random.Generator, k: int) -> None:
    r, c = odd_shape(rng)
    rows = r * int(rng.integers(1, 4))
    x = rng.standard_normal((rows, c)).astype(np.float32)
    rv = rng.standard_normal(c).astype(np.float32)
    cv = rng.standard_normal((rows, 1)).astype(np.float32)
    s = float(np.float32(rng.standard_normal()))
    args = (ct.from_numpy(x), ct.from_numpy(rv), ct.from_numpy(cv), s, k)
    out = run(k_broadcast, (rows, c), (r, c), f32, *args)
    np.testing.assert_allclose(out, np_broadcast(k, x, rv, cv, s), rtol=1e-6, atol=1e-7)


@ct.kernel
def k_flat_index(z: Mut[Tensor[i32, R, C]]) -> None:
    rows = ct.expand_dims(ct.arange(z.shape[0]), 1) + ct.bid(0) * z.shape[0]
    z.store(rows * 1000 + ct.arange(z.shape[1]))


def test_arange_broadcast_to_a_grid(backend: str, rng: np.random.Generator) -> None:
    r, c = odd_shape(rng)
    rows = r * 3
    out = run(k_flat_index, (rows, c), (r, c), i32)
    np.testing.assert_array_equal(out, np.arange(rows)[:, None] * 1000 + np.arange(c))


# -- shape ops ----------------------------------------------------------------------------------
@ct.kernel
def k_transpose(z: Mut[Tensor[f32, C, R]], x: Tensor[f32, Dyn, Dyn], K: ConstInt) -> None:
    t = ct.load(x, (ct.bid(1), ct.bid(0)), (z.shape[1], z.shape[0]))
    if K == 0:
        z.store(t.T)
    else:
        z.store(ct.permute(t, (1, 0)))


@pytest.mark.parametrize("k", [0, 1], ids=["T", "permute"])
def test_transpose(backend: str, rng: np.random.Generator, k: int) -> None:
    r, c = odd_shape(rng)
    x = rng.standard_normal((r * 2 + 1, c * 3)).astype(np.float32)
    out = run(k_transpose, x.T.shape, (c, r), f32, ct.from_numpy(x), k)
    np.testing.assert_array_equal(out, x.T)


@ct.kernel
def k_permute3(z: Mut[Tensor[f32, C, R, D]], x: Tensor[f32, Dyn, Dyn, Dyn]) -> None:
    t = ct.load(x, (0, 0, 0), (z.shape[1], z.shape[2], z.shape[0]))
    z.store(ct.permute(t, (2, 0, 1)) + ct.permute(t, (-1, -3, -2)))


def test_permute_rank3(backend: str, rng: np.random.Generator) -> None:
    a, b, c = (int(v) for v in rng.integers(1, 9, 3))
    x = rng.standard_normal((a, b, c)).astype(np.float32)
    out = run(k_permute3, (c, a, b), (c, a, b), f32, ct.from_numpy(x))
    np.testing.assert_array_equal(out, 2 * np.transpose(x, (2, 0, 1)))


@ct.kernel
def k_reshape(
    z: Mut[Tensor[f32, N]], x: Tensor[f32, Dyn, Dyn], R: ConstInt, C: ConstInt, K: ConstInt
) -> None:
    t = ct.load(x, (0, 0), (R, C))
    if K == 0:
        z.store(t.reshape((R * C,)))
    elif K == 1:
        z.store(ct.reshape(t.T, (-1,)))
    elif K == 2:  # through rank 4 and back
        q = t.reshape(1, R, 1, C)
        z.store(ct.sum(q, axis=(0, 2)).reshape(R * C))
    else:  # (R, C) → (C, R) → flat: not a transpose, a re-reading in row-major order
        z.store(ct.reshape(t.reshape((C, R)), R * C) * 2.0)


@pytest.mark.parametrize("k", range(4))
def test_reshape(backend: str, rng: np.random.Generator, k: int) -> None:
    r, c = odd_shape(rng)
    x = rng.standard_normal((r, c)).astype(np.float32)
    out = run(k_reshape, (r * c,), (r * c,), f32, ct.from_numpy(x), r, c, k)
    want = [x.reshape(-1), x.T.reshape(-1), x.reshape(-1), x.reshape(c, r).reshape(-1) * 2][k]
    np.testing.assert_array_equal(out, want)


@ct.kernel
def k_expand_broadcast(z: Mut[Tensor[f32, R, C]], v: Tensor[f32, Dyn], w: Tensor[f32, Dyn]) -> None:
    rv = ct.load(v, (0,), (z.shape[1],))
    cv = ct.load(w, (ct.bid(0),), (z.shape[0],))
    a = ct.broadcast_to(ct.expand_dims(rv, 0), z.shape)
    b = ct.broadcast_to(ct.expand_dims(cv, -1), z.shape)
    z.store(a - b + ct.broadcast_to(rv, z.shape) * ct.broadcast_to(1.5, z.shape))


def test_expand_dims_and_broadcast_to(backend: str, rng: np.random.Generator) -> None:
    r, c = odd_shape(rng)
    rows = r * 2
    v = rng.standard_normal(c).astype(np.float32)
    w = rng.standard_normal(rows).astype(np.float32)
    out = run(k_expand_broadcast, (rows, c), (r, c), f32, ct.from_numpy(v), ct.from_numpy(w))
    np.testing.assert_allclose(out, v[None, :] - w[:, None] + v * np.float32(1.5), rtol=1e-6)


@ct.kernel
def k_item_and_facts(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    first = ct.load(x, (0, 0), (1, 1)).item()  # a scalar f32
    total = ct.sum(t, keepdims=True)  # (1, 1)
    acc: ct.Tile = ct.zeros(t.shape, t.dtype)
    if t.ndim == 2 and t.shape[1] == z.shape[1]:
        acc = acc + first
    z.store(acc + total.item() * 0.0 + ct.max(t, axis=None) * 0.0)


def test_item_and_compile_time_shape_facts(backend: str, rng: np.random.Generator) -> None:
    r, c = odd_shape(rng)
    x = rng.standard_normal((r * 2, c)).astype(np.float32)
    out = run(k_item_and_facts, x.shape, (r, c), f32, ct.from_numpy(x))
    np.testing.assert_array_equal(out, np.full(x.shape, x[0, 0]))


# -- sub-tiles of Mut parameters ----------------------------------------------------------------
@ct.kernel
def k_chunks(z: Mut[Tensor[f32, R, C]], W: ConstInt) -> None:
    """Each block rewrites its own tile in column chunks of W; one chunk past its tile reads
    padding and its store is dropped (it would be the next block's)."""
    n = z.shape[1] // W
    for j in range(n + 1):
        t = ct.load(z, (0, j), (z.shape[0], W), padding=5.0)
        ct.store(z, (0, j), t * 2.0 + j)
    outside = ct.load(z, (0, n), (z.shape[0], W), padding=5.0)
    ct.store(
        z,
        (0, 0),
        ct.load(z, (0, 0), (z.shape[0], W)) + (ct.sum(outside) * 0.0 + ct.min(outside) - 5.0),
    )


def test_sub_tile_loads_and_stores(backend: str, rng: np.random.Generator) -> None:
    w = int(rng.integers(1, 9))
    r, per = int(rng.integers(1, 6)), int(rng.integers(1, 5))
    c = w * per
    shape = (r * 2 + 1, c * 3 - int(rng.integers(0, c)))  # partial edge tiles
    x = rng.standard_normal(shape).astype(np.float32)
    z = ct.from_numpy(x).partition((r, c))
    out = k_chunks(z, w).sync()[0].unpartition().to_numpy()
    cols = np.arange(shape[1])
    want = x * 2 + ((cols % c) // w)
    np.testing.assert_allclose(out, want, rtol=1e-6)


# -- control flow over the new shapes -------------------------------------------------------------
@ct.kernel
def k_loop_rows(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn], W: ConstInt) -> None:
    """Row sums of a long row block in chunks (a loop-carried (R, 1) tile), then a branch on
    a reduced scalar."""
    acc: ct.Tile = ct.zeros((z.shape[0], 1), f32)
    best: ct.Tile = ct.full((z.shape[0],), -1, i32)
    for j in range(ct.cdiv(x.shape[1], W)):
        t = ct.load(x, (ct.bid(0), j), (z.shape[0], W))
        acc = acc + ct.sum(t, axis=1, keepdims=True)
        best = ct.maximum(best, ct.argmax(t, axis=1) + j * W)
    total = ct.sum(acc)
    if total > 0.0:  # noqa: SIM108 (kernels have no conditional expressions)
        out = acc + 1.0
    else:
        out = acc - 1.0
    z.store(ct.broadcast_to(out + ct.expand_dims(best, 1).astype(f32) * 0.0, z.shape))


def test_loop_carried_reduction_and_branch(backend: str, rng: np.random.Generator) -> None:
    r, w = int(rng.integers(1, 7)), int(rng.integers(1, 16))
    cols = int(rng.integers(1, 90))
    x = rng.standard_normal((r * 2, cols)).astype(np.float32)
    out = run(k_loop_rows, (r * 2, 3), (r, 3), f32, ct.from_numpy(x), w)
    sums = x.sum(axis=1, keepdims=True)
    blocks = sums.reshape(2, r)
    want = (sums.reshape(2, r) + np.where(blocks.sum(axis=1, keepdims=True) > 0, 1, -1)).reshape(
        -1, 1
    )
    np.testing.assert_allclose(out, np.broadcast_to(want, out.shape), rtol=1e-5, atol=1e-5)


@ct.function
def row_normalize(t: ct.Tile) -> ct.Tile:
    return t - ct.sum(t, axis=-1, keepdims=True) / t.shape[-1]


@ct.kernel
def k_helper(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    z.store(row_normalize(ct.load_tile_like(x, z)))


def test_helper_with_reductions(backend: str, rng: np.random.Generator) -> None:
    r, c = odd_shape(rng)
    x = rng.standard_normal((r, c)).astype(np.float32)
    out = run(k_helper, (r, c), (r, c), f32, ct.from_numpy(x))
    x64 = x.astype(np.float64)
    # Entries near 0 (x close to its row mean) see the f32 rounding of the sum: an absolute
    # tolerance a few ulps of the row's largest magnitude.
    atol = 8 * np.finfo(np.float32).eps * max(1.0, float(np.abs(x).max()))
    np.testing.assert_allclose(out, x64 - x64.mean(axis=1, keepdims=True), rtol=1e-5, atol=atol)


# -- compile errors ------------------------------------------------------------------------------
ARGS = (ct.PartitionSpec((64,), (32,)), ct.TensorSpec((64,)))


def k_bad_axis(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.sum(ct.load_tile_like(x, z), axis=1) + 0.0)


def k_bad_broadcast(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) + ct.arange(5))


def k_bad_reshape(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z).reshape((5, 7)).reshape(-1))


def k_sum_bool(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.sum(ct.load_tile_like(x, z) > 0).astype(f32))


def k_sub_tile_not_multiple(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load(z, (0,), (24,)))


def k_store_into_shared(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    ct.store(x, (0,), ct.load_tile_like(x, z))


def k_argmax_tuple(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.argmax(ct.load_tile_like(x, z), axis=(0,)).astype(f32))  # type: ignore[arg-type]


def k_bad_permute(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.permute(ct.load_tile_like(x, z), (0, 0)))


def k_item_of_many(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z).item())


def k_rank5(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z).reshape((1, 1, 1, 2, 16)).reshape(32))


def k_bad_broadcast_to(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.broadcast_to(ct.load_tile_like(x, z), (4, 31)))


def k_store_shape(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load(x, (0,), (16,)))


def k_sub_store_dtype(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    ct.store(z, (1,), ct.load(x, (0,), (16,)).astype(f16))


def line_of(fn: Callable[..., Any], text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize(
    "fn,needle,message",
    [
        (k_bad_axis, "ct.sum(", "axis 1 is out of range for a tile of rank 1"),
        (k_bad_broadcast, "+ ct.arange(5)", "tiles of shapes (32,) and (5,) cannot be broadcast"),
        (k_bad_reshape, "reshape((5, 7))", "(32,) (32 elements) to (5, 7) (35 elements)"),
        (k_sum_bool, "ct.sum(", "sum of a bool tile is not defined"),
        (
            k_sub_tile_not_multiple,
            "ct.load(z",
            "tile (32,) must be a multiple of the sub-tile shape (24,)",
        ),
        (k_store_into_shared, "ct.store(x", "ct.store writes only into a Mut parameter"),
        (k_argmax_tuple, "ct.argmax(", "takes one axis or None"),
        (k_bad_permute, "ct.permute(", "do not list each of the 1 dims"),
        (k_item_of_many, ".item()", "needs a tile of one element, not one of shape (32,)"),
        (k_rank5, "reshape((1, 1, 1, 2, 16))", "rank 1 to 4"),
        (
            k_bad_broadcast_to,
            "ct.broadcast_to(",
            "cannot broadcast a tile of shape (32,) to (4, 31)",
        ),
        (k_store_shape, "z.store(", "cannot store a tile of shape (16,) into 'z'"),
        (k_sub_store_dtype, "ct.store(z", "cannot store a f16 tile into 'z' (f32)"),
    ],
)
def test_misuse_is_a_compile_error_at_its_source(
    fn: Callable[..., Any], needle: str, message: str
) -> None:
    with pytest.raises(ct.CompileError) as info:
        ct.kernel(fn).ir(*ARGS)
    err = info.value
    assert message in err.message
    assert err.where is not None and err.where.file == __file__
    assert err.where.line == line_of(fn, needle)
    assert str(err).startswith(f'File "{__file__}", line {err.where.line}, col {err.where.col}, ')
    assert needle in err.where.text[err.where.col - 1 :] or needle in err.where.text


def test_ir_of_reduction_and_broadcast() -> None:
    """keepdims=False is a keepdims reduce then a reshape; rank changes reshape, then
    broadcast."""
    text = k_row_softmax.ir(ct.PartitionSpec((8, 16), (4, 16)), ct.TensorSpec((8, 16)))
    assert "reduce[max axis=1] %2 : f32<4x1>" in text
    assert "reduce[sum axis=1]" in text
    assert "reshape" in text and "broadcast" in text


# -- scalar parameters promote alike everywhere -----------------------------------------------
@ct.kernel
def k_scale_f16(z: Mut[Tensor[f32, B]], x: Tensor[f16, Dyn], s: float) -> None:
    # f16 tile * f32 run-time scalar is an f32 tile (the scalar is a typed f32, not a weak
    # Python number), on every backend: rounded to f16 the product would differ.
    y = ct.load_tile_like(x, z) * s
    z.store(y.astype(f32))


def test_scalar_parameters_are_typed(backend: str, rng: np.random.Generator) -> None:
    n = int(rng.integers(1, 300))
    x = rng.standard_normal(n).astype(np.float16)
    s = float(rng.standard_normal()) * 100.0
    got = run(k_scale_f16, (n,), (64,), f32, ct.from_numpy(x), s)
    want = x.astype(np.float32) * np.float32(s)
    np.testing.assert_array_equal(got, want)
