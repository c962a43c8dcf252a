"""`ct.Atomic[Tensor[...]]` parameters and `ct.atomic_add/max/min`: a histogram and cross-block
reductions in one launch on sim and interpret against NumPy; the launch holds the tensor
exclusively; reading it in the kernel is a CompileError naming the parameter and the line."""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Atomic, Dyn, Mut, Tensor, f16, f32, i32, i64
from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available

B = TypeVar("B")
BACKENDS = ["sim", "interpret"]


@ct.kernel
def histogram(z: Mut[Tensor[i32, B]], x: Tensor[i32, Dyn], h: Atomic[Tensor[i32, Dyn]]) -> None:
    """h[v] += 1 for every v of x (values outside h, and the padding -1, are dropped); z = x."""
    v = ct.load(x, ct.bid(0), z.shape, padding=-1)
    ct.atomic_add(h, v, 1)
    z.store(v)


@ct.kernel
def stats(
    z: Mut[Tensor[f32, B]],
    x: Tensor[f32, Dyn],
    total: Atomic[Tensor[f32, Dyn]],
    big: Atomic[Tensor[i64, Dyn]],
    ext: Atomic[Tensor[i32, Dyn]],
) -> None:
    """total[0] += sum(x); big[0] += sum(int(x * 1000)) (i64); ext = (max, min) of x * 1000."""
    v = ct.load_tile_like(x, z)
    z.store(v)
    zero = ct.zeros((1,), i32)
    ct.atomic_add(total, zero, ct.sum(v, keepdims=True))
    q = ct.load(x, ct.bid(0), z.shape, padding=0) * 1000
    ct.atomic_add(big, zero, ct.sum(q.astype(i64), keepdims=True))
    inside = ct.arange(z.shape[0], i32) + ct.bid(0) * z.shape[0] < x.shape[0]
    qi = q.astype(i32)
    ct.atomic_max(ext, 0, ct.where(inside, qi, -(2**31)))
    ct.atomic_min(ext, 1, ct.where(inside, qi, 2**31 - 1))


@ct.kernel
def scatter_add_2d(
    z: Mut[Tensor[f32, B]],
    rows: Tensor[i32, Dyn],
    vals: Tensor[f32, Dyn],
    acc: Atomic[Tensor[f32, Dyn, Dyn]],
) -> None:
    """acc[rows[i], j] += vals[i] for j in 0..3 (a tuple of broadcast index tiles)."""
    r = ct.load(rows, ct.bid(0), z.shape, padding=-1)
    v = ct.load_tile_like(vals, z)
    z.store(v)
    cols = ct.expand_dims(ct.arange(4, i32), 0)
    ct.atomic_add(
        acc, (ct.expand_dims(r, 1), cols), ct.broadcast_to(ct.expand_dims(v, 1), (z.shape[0], 4))
    )


@ct.kernel
def f32_extremes(
    z: Mut[Tensor[f32, B]],
    x: Tensor[f32, Dyn],
    bins: Tensor[i32, Dyn],
    hi: Atomic[Tensor[f32, Dyn]],
    lo: Atomic[Tensor[f32, Dyn]],
    amax: Atomic[Tensor[f32, Dyn]],
) -> None:
    """hi[b] = max, lo[b] = min of the x in bin b (bin -1: past the end, dropped); amax[0] =
    max |x| (a quantization scale)."""
    v = ct.load_tile_like(x, z)
    z.store(v)
    b = ct.load(bins, ct.bid(0), z.shape, padding=-1)
    ct.atomic_max(hi, b, v)
    ct.atomic_min(lo, b, v)
    ct.atomic_max(amax, 0, ct.max(ct.abs(v), keepdims=True))


def _extreme(kind: str, start: float, xs: np.ndarray) -> np.float32:
    """max/min of `start` and `xs` with -0.0 below +0.0 and NaN winning (none in `start`)."""
    if np.isnan(xs).any():
        return np.float32(np.nan)
    both = np.append(np.float32(start), xs)
    best = both.max() if kind == "max" else both.min()
    if best == 0:  # a zero is the extreme: +0.0 for max if any zero is +0.0, -0.0 for min
        signs = np.signbit(both[both == 0])
        best = np.float32(-0.0 if (signs.all() if kind == "max" else signs.any()) else 0.0)
    return np.float32(best)


def _same_bits_or_nan(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.int32), want[~nan].view(np.int32))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("special", ["finite", "zeros", "nan", "inf"])
def test_f32_max_min_in_total_order(backend: str, special: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    n, nb = int(rng.integers(1, 3000)), int(rng.integers(1, 12))
    xs = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 38, n)).astype(np.float32)
    if special == "zeros":  # bins of only signed zeros, and zeros among negatives
        xs = np.where(rng.random(n) < 0.7, np.copysign(np.float32(0), rng.random(n) - 0.5), -xs)
        xs = xs.astype(np.float32)
    elif special != "finite":
        hit = rng.random(n) < 0.01
        bad = np.float32(np.nan if special == "nan" else np.inf)
        xs[hit] = np.where(rng.random(int(hit.sum())) < 0.5, bad, -bad)
    bins = rng.integers(-1, nb, n).astype(np.int32)
    _, _, _, hi, lo, amax = f32_extremes(
        ct.empty((n,), f32).partition(256),
        ct.from_numpy(xs),
        ct.from_numpy(bins),
        ct.full((nb,), -np.inf, f32),
        ct.full((nb,), np.inf, f32),
        ct.zeros((1,), f32),
    ).sync()
    want_hi = np.array([_extreme("max", -np.inf, xs[bins == b]) for b in range(nb)])
    want_lo = np.array([_extreme("min", np.inf, xs[bins == b]) for b in range(nb)])
    _same_bits_or_nan(hi.to_numpy(), want_hi)
    _same_bits_or_nan(lo.to_numpy(), want_lo)
    _same_bits_or_nan(amax.to_numpy(), np.array([_extreme("max", 0.0, np.abs(xs))]))


@ct.kernel
def count_blocks(
    z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], counter: Atomic[Tensor[i32, Dyn]]
) -> None:
    """counter[0] += 1 and counter[1] = max(bid) with scalar indices and values: one update per
    block; counter[2] = min over blocks of x[block's first element], scaled to an int."""
    z.store(ct.load_tile_like(x, z))
    ct.atomic_add(counter, 0, 1)
    ct.atomic_max(counter, 1, ct.bid(0))
    first = ct.load(x, ct.bid(0), z.shape).astype(i32)
    ct.atomic_min(counter, 2, ct.min(first * 0 + ct.bid(0) * 7 + 3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalar_indices_and_values_update_once_per_block(
    backend: str, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    n, tile = int(rng.integers(1, 3000)), 128
    blocks = -(-n // tile)
    start = np.array([5, -1, 2**31 - 1], np.int32)
    _, _, counter = count_blocks(
        ct.empty((n,), f32).partition(tile),
        ct.from_numpy(rng.standard_normal(n).astype(np.float32)),
        ct.from_numpy(start),
    ).sync()
    np.testing.assert_array_equal(counter.to_numpy(), [5 + blocks, blocks - 1, 3])


@pytest.mark.parametrize("backend", BACKENDS)
def test_histogram_in_one_launch(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    n, bins = int(rng.integers(1, 5000)), int(rng.integers(1, 40))
    xs = rng.integers(-3, bins + 3, n).astype(np.int32)
    _, _, h = histogram(
        ct.empty((n,), i32).partition(256), ct.from_numpy(xs), ct.zeros((bins,), i32)
    ).sync()
    want = np.bincount(xs[(xs >= 0) & (xs < bins)], minlength=bins)
    np.testing.assert_array_equal(h.to_numpy(), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cross_block_sum_max_min(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    n = int(rng.integers(1, 4000))
    xs = rng.standard_normal(n).astype(np.float32)
    ext0 = np.array([-(2**31), 2**31 - 1], np.int32)
    big0 = int(rng.integers(-(2**40), 2**40))
    _, _, total, big, ext = stats(
        ct.empty((n,), f32).partition(128),
        ct.from_numpy(xs),
        ct.from_numpy(np.array([1.5], np.float32)),
        ct.from_numpy(np.array([big0], np.int64)),
        ct.from_numpy(ext0),
    ).sync()
    q = (xs * np.float32(1000)).astype(np.int32)
    assert total.to_numpy()[0] == pytest.approx(1.5 + float(xs.astype(np.float64).sum()), abs=1e-3)
    assert int(big.to_numpy()[0]) == big0 + int(q.astype(np.int64).sum())
    np.testing.assert_array_equal(ext.to_numpy(), [q.max(), q.min()])


@pytest.mark.parametrize("backend", BACKENDS)
def test_atomic_add_with_two_dim_indices(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    n, m = int(rng.integers(1, 700)), int(rng.integers(1, 20))
    rows = rng.integers(-1, m + 1, n).astype(np.int32)
    vals = rng.integers(-8, 8, n).astype(np.float32)  # exact sums in any order
    _, _, _, acc = scatter_add_2d(
        ct.empty((n,), f32).partition(64),
        ct.from_numpy(rows),
        ct.from_numpy(vals),
        ct.zeros((m, 4), f32),
    ).sync()
    want = np.zeros((m, 4), np.float32)
    ok = (rows >= 0) & (rows < m)
    np.add.at(want, rows[ok], vals[ok, None])
    np.testing.assert_array_equal(acc.to_numpy(), want)


def test_the_ptx_uses_red(rng: np.random.Generator) -> None:
    ptx = stats.ptx(
        ct.PartitionSpec((1000,), (128,)),
        ct.TensorSpec((1000,)),
        ct.TensorSpec((1,)),
        ct.TensorSpec((1,), i64),
        ct.TensorSpec((2,), i32),
    )
    for ins in (
        "red.global.add.f32",
        "red.global.add.u64",
        "red.global.max.s32",
        "red.global.min.s32",
    ):
        assert ins in ptx


@pytest.mark.skipif(not nvjitlink_available(), reason="nvJitLink cannot be loaded")
@pytest.mark.parametrize("sm", [80, 90])
def test_atomic_ptx_assembles(sm: int) -> None:
    target = ct.Target(sm)
    args = (
        ct.PartitionSpec((1000,), (128,)),
        ct.TensorSpec((1000,)),
        ct.TensorSpec((1,)),
        ct.TensorSpec((1,), i64),
        ct.TensorSpec((2,), i32),
    )
    assert assemble(stats.ptx(*args, target=target), target).spill_free
    h = (
        ct.PartitionSpec((1000,), (256,), i32),
        ct.TensorSpec((1000,), i32),
        ct.TensorSpec((16,), i32),
    )
    assemble(histogram.ptx(*h, target=target), target)
    e = (
        ct.PartitionSpec((1000,), (256,)),
        ct.TensorSpec((1000,)),
        ct.TensorSpec((1000,), i32),
        *(ct.TensorSpec((n,)) for n in (5, 5, 1)),
    )
    assert assemble(f32_extremes.ptx(*e, target=target), target).spill_free


# -- ownership on the host --------------------------------------------------------------------
def test_the_launch_holds_the_atomic_tensor_exclusively() -> None:
    h = ct.zeros((4,), i32)
    x = ct.zeros((10,), i32)
    op = histogram(ct.empty((10,), i32).partition(8), x, h)
    with pytest.raises(ct.BorrowError):
        h.to_numpy()
    other = ct.zeros((10,), i32)
    # not even a shared read by another launch while the op holds it
    with pytest.raises(ct.BorrowError, match="parameter 'x'"):
        histogram(ct.empty((4,), i32).partition(8), h, other)
    _, _, h = op.sync()
    np.testing.assert_array_equal(h.to_numpy(), [10, 0, 0, 0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_graph_holds_the_atomic_tensor_and_each_replay_adds(
    backend: str, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    xs = rng.integers(0, 16, 1000).astype(np.int32)
    h = ct.zeros((16,), i32)
    g = ct.graph(histogram(ct.empty((1000,), i32).partition(256), ct.from_numpy(xs), h))
    g.replay()
    g.replay()
    np.testing.assert_array_equal(g.read(h), 2 * np.bincount(xs, minlength=16))
    with pytest.raises(ct.BorrowError, match="held by graph of histogram"):
        h.to_numpy()
    _, _, back = g.release()
    assert back is h


def test_an_atomic_tensor_may_not_also_be_passed_shared() -> None:
    h = ct.zeros((16,), i32)
    with pytest.raises(ct.AliasError, match="'x' and 'h'"):
        histogram(ct.empty((16,), i32).partition(8), h, h)


def test_an_atomic_parameter_takes_a_tensor_not_a_partition() -> None:
    with pytest.raises(
        TypeError, match="parameter 'h': an Atomic parameter takes the tensor itself"
    ):
        histogram(
            ct.empty((16,), i32).partition(8),
            ct.zeros((16,), i32),
            ct.zeros((16,), i32).partition(8),
        )


def test_an_atomic_dtype_mismatch_names_the_parameter() -> None:
    with pytest.raises(TypeError, match="parameter 'h': expected dtype i32, got f32"):
        histogram(ct.empty((16,), i32).partition(8), ct.zeros((16,), i32), ct.zeros((16,), f32))


# -- misuse in the kernel ---------------------------------------------------------------------
def k_reads_atomic(
    z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], a: Atomic[Tensor[f32, Dyn]]
) -> None:
    t = ct.load_tile_like(a, z)
    z.store(t)


def k_loads_atomic(
    z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], a: Atomic[Tensor[f32, Dyn]]
) -> None:
    z.store(ct.load(a, 0, z.shape))


def k_gathers_atomic(
    z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], a: Atomic[Tensor[f32, Dyn]]
) -> None:
    z.store(ct.gather(a, ct.arange(z.shape[0], i32)))


def k_atomic_on_shared(
    z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], a: Atomic[Tensor[f32, Dyn]]
) -> None:
    ct.atomic_add(x, ct.arange(z.shape[0], i32), 1.0)


def k_max_of_half(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], a: Atomic[Tensor[f16, Dyn]]) -> None:
    ct.atomic_max(a, ct.arange(z.shape[0], i32), 1.0)


def _line(fn: Any, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(k for k, line in enumerate(lines) if text in line)


@pytest.mark.parametrize(
    ("fn", "text", "message"),
    [
        (
            k_reads_atomic,
            "load_tile_like(a",
            "'a' is an Atomic parameter: the kernel may only update it",
        ),
        (k_loads_atomic, "ct.load(a", "'a' is an Atomic parameter: the kernel may only update it"),
        (
            k_gathers_atomic,
            "ct.gather(a",
            "'a' is an Atomic parameter: the kernel may only update it",
        ),
        (
            k_atomic_on_shared,
            "atomic_add(x",
            "ct.atomic_add updates an Atomic parameter (annotate it ct.Atomic[Tensor[...]]); "
            "'x' is a shared Tensor",
        ),
        (k_max_of_half, "atomic_max(a", "ct.atomic_max: 'a' is f16; it updates f32, i32, i64"),
    ],
    ids=lambda v: getattr(v, "__name__", None) or "",
)
def test_misuse_is_a_compile_error_at_the_line(fn: Any, text: str, message: str) -> None:
    kernel = ct.kernel(fn)
    for backend in BACKENDS:
        ct.set_backend(backend)
        a = ct.zeros((64,), ct.f16 if fn is k_max_of_half else f32)
        with pytest.raises(ct.CompileError) as info:
            kernel(ct.zeros((64,)).partition(32), ct.zeros((64,)), a).sync()
        msg = str(info.value)
        assert message in msg
        assert f"line {_line(fn, text)}" in msg
