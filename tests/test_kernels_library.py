"""cutile_py_kernels against NumPy references computed in float64, on sim and interpret (and
cuda where a GPU is found), and the PTX of every library kernel through nvJitLink."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
import cutile_py_kernels as ck
from cutile_py.ir.dtypes import round_to
from cutile_py_kernels import _common, norms

softmax_module = importlib.import_module("cutile_py_kernels.softmax")
report_module = importlib.import_module("cutile_py.host.report")

DTYPES = [ct.f32, ct.f16, ct.bf16]
DT_PARAMS = [pytest.param(d, id=d.name) for d in DTYPES]
#: (rtol, atol) of a result rounded to the dtype after f32 arithmetic.
TOL = {ct.f32: (2e-5, 2e-6), ct.f16: (2e-3, 2e-3), ct.bf16: (1.6e-2, 1.6e-2)}


@pytest.fixture(params=["sim", "interpret", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield str(request.param)
    ct.set_backend("sim")


def rand(rng: np.random.Generator, shape: tuple[int, ...], dt: Any, scale: float = 1.0) -> Any:
    """(values rounded to dt, as float64; the tensor)."""
    a = round_to((rng.standard_normal(shape) * scale).astype(np.float32), dt)
    return a.astype(np.float64), ct.from_numpy(a, dt)


def check(out: ct.Tensor[Any, Any], ref: np.ndarray, dt: Any, scale: float = 1.0) -> None:
    assert out.dtype is dt
    assert out.shape == ref.shape
    rtol, atol = TOL[dt]
    np.testing.assert_allclose(out.to_numpy().astype(np.float64), ref, rtol=rtol, atol=atol * scale)


@pytest.fixture
def small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row cap of 256 elements, so that short rows take the chunked (looping) kernels."""
    for dt in DTYPES:
        monkeypatch.setitem(_common.ROW_CAP, dt, 256)
    monkeypatch.setattr(softmax_module, "ONE_PASS_CAP", 256)
    monkeypatch.setattr(norms, "ONE_PASS_CAP", 256)


# -- element-wise -----------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 1023, 4096, 10_001])
def test_add_and_saxpy(rng: np.random.Generator, n: int) -> None:
    xs = rng.standard_normal(n).astype(np.float32)
    ys = rng.standard_normal(n).astype(np.float32)
    x, y = ct.from_numpy(xs), ct.from_numpy(ys)
    np.testing.assert_array_equal(ck.add(x, y).to_numpy(), xs + ys)
    a = float(rng.uniform(-2, 2))
    # One rounding (fma): a*x is exact in float64, so only the sum rounds there, and that
    # lands on an f32 rounding boundary with probability ~2^-29 per element.
    want = (np.float64(np.float32(a)) * xs.astype(np.float64) + ys).astype(np.float32)
    np.testing.assert_array_equal(ck.saxpy(a, x, y).to_numpy(), want)
    x.to_numpy()  # inputs stay usable


def test_library_checks_its_inputs() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        ck.add(ct.zeros(4), ct.zeros(5))
    with pytest.raises(TypeError, match="expected f32"):
        ck.add(ct.zeros(4, ct.f16), ct.zeros(4, ct.f16))


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("shape", [(1,), (7, 33), (3, 5, 700)])
def test_silu_mul(backend: str, rng: np.random.Generator, dt: Any, shape: tuple[int, ...]) -> None:
    g, gt = rand(rng, shape, dt, 3.0)
    u, ut = rand(rng, shape, dt)
    check(ck.silu_mul(gt, ut), g / (1 + np.exp(-g)) * u, dt)
    gt.to_numpy(), ut.to_numpy()  # inputs stay usable


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("shape", [(1,), (7, 33), (3, 5, 700)])
def test_gelu(backend: str, rng: np.random.Generator, dt: Any, shape: tuple[int, ...]) -> None:
    x, xt = rand(rng, shape, dt, 4.0)
    x64 = x.astype(np.float64)
    ref = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    check(ck.gelu(xt), ref, dt, 4.0)
    xt.to_numpy()  # the input stays usable


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in f32 ulps (units in the last place) on the ordered integer line of f32."""

    def ordered(v: np.ndarray) -> np.ndarray:
        b = np.ascontiguousarray(v, dtype=np.float32).view(np.int32).astype(np.int64)
        return np.where(b < 0, -(b & 0x7FFFFFFF), b)

    return np.abs(ordered(got) - ordered(want))


def wide_inputs(rng: np.random.Generator, lo: float, hi: float) -> np.ndarray:
    """2^20 f32 inputs: uniform on [lo, hi], normal (sd 3), and tiny magnitudes of both signs."""
    n = 1 << 18
    small = rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(-40, 0, n)
    return np.concatenate([rng.uniform(lo, hi, 2 * n), rng.standard_normal(n) * 3, small]).astype(
        np.float32
    )


def test_silu_mul_ulp(rng: np.random.Generator) -> None:
    """Within 4 ulp of (g u) sigmoid(g) (float64, rounded) over 2^20 inputs on the sim; +-0
    only where the result is below |g u| 2^-126 (silu_mul_kernel's docstring)."""
    ct.set_backend("sim")
    g = wide_inputs(rng, -90.0, 20.0)
    u = rng.standard_normal(g.size).astype(np.float32)
    got = ck.silu_mul(ct.from_numpy(g), ct.from_numpy(u)).to_numpy()
    exact = g.astype(np.float64) * u / (1.0 + np.exp(-g.astype(np.float64)))
    normal = np.abs(exact) >= np.abs(g * u) * 2.0**-126
    assert ulps(got[normal], exact[normal].astype(np.float32)).max() <= 4
    assert (np.abs(got[~normal]) <= np.abs(g * u)[~normal] * 2.0**-126).all()
    assert normal.mean() > 0.9


def test_gelu_ulp(rng: np.random.Generator) -> None:
    """Within 3 (1 + |y|) ulp of the exact GELU over 2^20 inputs on the sim, y = 2 sqrt(2/pi)
    (x + 0.044715 x^3): the rounding of y in f32 (1.5 ulp of it) moves x sigmoid(y) by |y|
    times that, relatively; 2 ulp for x > 0. The float64 reference is x sigmoid(y), not
    0.5 x (1 + tanh(y/2)), whose 1 + tanh cancels in float64 too for x < -5."""
    ct.set_backend("sim")
    x = wide_inputs(rng, -10.0, 10.0)
    got = ck.gelu(ct.from_numpy(x)).to_numpy()
    x64 = x.astype(np.float64)
    y = 2 * np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)
    exact = x64 / (1.0 + np.exp(-y))
    normal = np.abs(exact) >= np.abs(x64) * 2.0**-126
    err = ulps(got[normal], exact[normal].astype(np.float32))
    assert (err <= 3 * (1 + np.abs(y[normal]))).all()
    assert err[x[normal] > 0].max() <= 2
    assert (np.abs(got[~normal]) <= np.abs(x64[~normal]) * 2.0**-126).all()


# -- norms ------------------------------------------------------------------------------------
ROWS = [(3, 1), (5, 7), (4, 1000), (2, 1536)]


def rms_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def ln_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def norm_cases(
    rng: np.random.Generator, dt: Any, r: int, n: int, offset: float = 0.0
) -> tuple[np.ndarray, Any, np.ndarray, Any]:
    x, xt = rand(rng, (r, n), dt)
    if offset:
        x = round_to((x + offset).astype(np.float32), dt).astype(np.float64)
        xt = ct.from_numpy(x.astype(np.float32), dt)
    w, wt = rand(rng, (n,), dt)
    return x, xt, w, wt


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("r,n", ROWS)
def test_rms_norm(backend: str, rng: np.random.Generator, dt: Any, r: int, n: int) -> None:
    x, xt, w, wt = norm_cases(rng, dt, r, n)
    check(ck.rms_norm(xt, wt), rms_ref(x, w, 1e-6), dt, 4)


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("r,n", ROWS)
def test_add_rms_norm(backend: str, rng: np.random.Generator, dt: Any, r: int, n: int) -> None:
    x, xt, w, wt = norm_cases(rng, dt, r, n)
    res, rt = rand(rng, (r, n), dt)
    y, h = ck.add_rms_norm(xt, rt, wt, eps=1e-5)
    h_ref = round_to((x + res).astype(np.float32), dt).astype(np.float64)
    np.testing.assert_array_equal(h.to_numpy().astype(np.float64), h_ref)
    check(y, rms_ref(h_ref, w, 1e-5), dt, 4)


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("r,n", ROWS)
def test_layer_norm(backend: str, rng: np.random.Generator, dt: Any, r: int, n: int) -> None:
    # An offset mean: a variance from E[x²] - E[x]² would lose digits here.
    x, xt, w, wt = norm_cases(rng, dt, r, n, offset=4.0 if dt is not ct.bf16 else 1.0)
    b, bt = rand(rng, (n,), dt)
    check(ck.layer_norm(xt, wt, bt), ln_ref(x, w, b, 1e-5), dt, 4)


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("n", [257, 1536])
def test_norms_chunked(
    backend: str, rng: np.random.Generator, small_cap: None, dt: Any, n: int
) -> None:
    """Rows longer than the cap loop over chunks (1536 splits evenly, 257 does not)."""
    x, xt, w, wt = norm_cases(rng, dt, 2, n, offset=2.0)
    b, bt = rand(rng, (n,), dt)
    check(ck.rms_norm(xt, wt), rms_ref(x, w, 1e-6), dt, 4)
    check(ck.layer_norm(xt, wt, bt), ln_ref(x, w, b, 1e-5), dt, 4)
    res, rt = rand(rng, (2, n), dt)
    y, h = ck.add_rms_norm(xt, rt, wt)
    h_ref = round_to((x + res).astype(np.float32), dt).astype(np.float64)
    np.testing.assert_array_equal(h.to_numpy().astype(np.float64), h_ref)
    check(y, rms_ref(h_ref, w, 1e-6), dt, 4)


def test_norms_beyond_the_real_cap(backend: str, rng: np.random.Generator) -> None:
    n = norms.ONE_PASS_CAP + 100
    x, xt, w, wt = norm_cases(rng, ct.f32, 2, n, offset=1.0)
    check(ck.rms_norm(xt, wt), rms_ref(x, w, 1e-6), ct.f32, 4)
    b, bt = rand(rng, (n,), ct.f32)
    check(ck.layer_norm(xt, wt, bt), ln_ref(x, w, b, 1e-5), ct.f32, 4)


@pytest.mark.parametrize("n", [1000, norms.ONE_PASS_CAP + 100])
def test_layer_norm_divides_on_the_host(n: int) -> None:
    """1/n comes from the host, as rms_norm's: neither layer_norm kernel divides (a div.rn.f32
    is a slow-path call in SASS)."""
    rows = ct.TensorSpec((8, n), ct.f32)
    launch = _common.row_launch(norms._layer_norm_kernels, 0, rows, norms.ONE_PASS_CAP)
    out = ct.PartitionSpec((8, n), launch.tile, ct.f32)
    w = ct.TensorSpec((n,), ct.f32)
    ptx = launch.kernel.ptx(out, rows, w, w, n, 1.0 / n, 1e-5, *launch.extra)
    f32_divisions = [
        ln for ln in ptx.splitlines() if ("div." in ln or "rcp." in ln) and "f32" in ln
    ]
    assert "ld.global" in ptx and f32_divisions == []


@pytest.mark.parametrize(
    ("dt", "n", "warps"),
    [(ct.f32, 1024, 4), (ct.f32, 1536, 4), (ct.f32, 2048, 8), (ct.f32, 3072, 4),
     (ct.f32, 4096, 4), (ct.bf16, 1536, 4), (ct.bf16, 2048, 8)],
)  # fmt: skip
def test_short_norm_rows_by_width(dt: Any, n: int, warps: int) -> None:
    """f32 tiles wider than 1024 and narrower than 4096 take 16 elements a thread, not 32
    (the H200 sweep: rms_norm 4096x1536 0.762 of copy against 0.719); 1024, 4096 and 16-bit
    rows keep 32. rms_norm, add_rms_norm and layer_norm launch alike."""
    rows = ct.TensorSpec((4096, n), dt)
    for family, first in ((norms._rms_kernels, 0), (norms._rms_kernels, 2),
                          (norms._layer_norm_kernels, 0)):  # fmt: skip
        launch = _common.row_launch(family, first, rows, norms.ONE_PASS_CAP)
        assert launch.kernel is family(dt, warps)[first]


@pytest.mark.parametrize("r,n", [(5, 2048), (3, 3072)])
def test_norms_sixteen_per_thread(backend: str, rng: np.random.Generator, r: int, n: int) -> None:
    """The 16-per-thread blocks (8 warps at 2048, two rows a block, the last one partial;
    4 warps at 3072) against NumPy."""
    x, xt, w, wt = norm_cases(rng, ct.f32, r, n, offset=2.0)
    b, bt = rand(rng, (n,), ct.f32)
    check(ck.rms_norm(xt, wt), rms_ref(x, w, 1e-6), ct.f32, 4)
    check(ck.layer_norm(xt, wt, bt), ln_ref(x, w, b, 1e-5), ct.f32, 4)
    res, rt = rand(rng, (r, n), ct.f32)
    y, h = ck.add_rms_norm(xt, rt, wt)
    h_ref = round_to((x + res).astype(np.float32), ct.f32).astype(np.float64)
    np.testing.assert_array_equal(h.to_numpy().astype(np.float64), h_ref)
    check(y, rms_ref(h_ref, w, 1e-6), ct.f32, 4)


@pytest.mark.parametrize(
    ("n", "width", "warps"), [(8192, 8192, 8), (20_000, 20_000, 16), (20_001, 32768, 16)]
)
def test_long_norm_rows_are_read_once(n: int, width: int, warps: int) -> None:
    """Rows up to ONE_PASS_CAP are one tile (masked to the next power of two unless a
    multiple of 32), PER_THREAD elements per thread up to 16 warps: the chunked kernels read
    a row once per statistic."""
    rows = ct.TensorSpec((4096, n), ct.bf16)
    for family in (norms._rms_kernels, norms._layer_norm_kernels):
        launch = _common.row_launch(family, 0, rows, norms.ONE_PASS_CAP)
        assert (launch.tile, launch.extra) == ((1, width), ())
        assert launch.kernel is family(ct.bf16, warps)[0]


#: (elements a block, elements a thread) the next lease's row sweep times at 1536 and 2048
#: (`paper_repro/lease_check.sh`: `row_sweep --block-elems 2048,4096 --per 8,16,32`): one
#: row a block as Triton's kernels run them (at 32 a thread, as softmax runs them), and two.
SWEEP_BLOCKS = [(b, per) for b in (2048, 4096) for per in (8, 16, 32)]


@pytest.mark.parametrize("n", [1536, 2048])
@pytest.mark.parametrize(("block", "per"), SWEEP_BLOCKS)
def test_norm_blocks_the_row_sweep_times(
    rng: np.random.Generator, n: int, block: int, per: int
) -> None:
    """Each norm block shape `paper_repro.row_sweep` times, correct (on sim; 3 rows: the last
    block of two rows partial)."""
    from paper_repro.row_sweep import elements_per_thread

    x, xt, w, wt = norm_cases(rng, ct.f32, 3, n, offset=2.0)
    b, bt = rand(rng, (n,), ct.f32)
    res, rt = rand(rng, (3, n), ct.f32)
    with elements_per_thread(per, block):
        plan = _common.row_plan(3, n, ct.f32)
        assert plan.rows == min(2, block // n)
        y_rms = ck.rms_norm(xt, wt)
        y_ln = ck.layer_norm(xt, wt, bt)
        y_add, h = ck.add_rms_norm(xt, rt, wt)
    check(y_rms, rms_ref(x, w, 1e-6), ct.f32, 4)
    check(y_ln, ln_ref(x, w, b, 1e-5), ct.f32, 4)
    h_ref = round_to((x + res).astype(np.float32), ct.f32).astype(np.float64)
    np.testing.assert_array_equal(h.to_numpy().astype(np.float64), h_ref)
    check(y_add, rms_ref(h_ref, w, 1e-6), ct.f32, 4)


@pytest.mark.parametrize(
    ("dt", "n", "ln_warps", "rms_warps"),
    [(ct.f32, 8192, 8, 8), (ct.f32, 8200, 8, 16), (ct.f32, 16384, 8, 16),
     (ct.f32, 32768, 16, 16), (ct.bf16, 16384, 16, 16), (ct.f32, 12288, 8, 8),
     (ct.f32, 24576, 16, 16)],
)  # fmt: skip
def test_layer_norm_takes_64_a_thread_past_8192_f32(
    dt: Any, n: int, ln_warps: int, rms_warps: int
) -> None:
    """layer_norm's f32 tiles of a power-of-two width past 8192 hold 64 elements a thread
    (8 warps at 16384: 0.914 of the copy ceiling on an H200 against 0.759 at 16 warps);
    rms_norm, 16-bit rows and other widths (12288: 48 a thread, not 96) keep the norms'
    rule. As the host function launches it (its rule, not the default)."""
    rows = ct.TensorSpec((4096, n), dt)
    ln = _common.row_launch(norms._layer_norm_kernels, 0, rows, norms.ONE_PASS_CAP,
                            norms.layer_norm_per_thread)  # fmt: skip
    assert ln.kernel is norms._layer_norm_kernels(dt, ln_warps)[0]
    rms = _common.row_launch(norms._rms_kernels, 0, rows, norms.ONE_PASS_CAP)
    assert rms.kernel is norms._rms_kernels(dt, rms_warps)[0]


@pytest.mark.parametrize("dt", DT_PARAMS)
def test_norms_of_rows_past_the_old_cap(backend: str, rng: np.random.Generator, dt: Any) -> None:
    """8200 elements: one tile of 16384 (masked) where the chunked kernels took it before
    (layer_norm f32: 64 elements a thread, 8 warps)."""
    x, xt, w, wt = norm_cases(rng, dt, 2, 8200, offset=1.0)
    b, bt = rand(rng, (8200,), dt)
    check(ck.rms_norm(xt, wt), rms_ref(x, w, 1e-6), dt, 4)
    check(ck.layer_norm(xt, wt, bt), ln_ref(x, w, b, 1e-5), dt, 4)
    res, rt = rand(rng, (2, 8200), dt)
    y, h = ck.add_rms_norm(xt, rt, wt)
    h_ref = round_to((x + res).astype(np.float32), dt).astype(np.float64)
    np.testing.assert_array_equal(h.to_numpy().astype(np.float64), h_ref)
    check(y, rms_ref(h_ref, w, 1e-6), dt, 4)


def test_norms_keep_leading_axes(rng: np.random.Generator) -> None:
    ct.set_backend("interpret")
    x, xt = rand(rng, (2, 3, 40), ct.f32)
    w, wt = rand(rng, (40,), ct.f32)
    y = ck.rms_norm(xt, wt)
    assert y.shape == (2, 3, 40)
    check(y, rms_ref(x, w, 1e-6), ct.f32, 4)


# -- softmax and argmax -----------------------------------------------------------------------
def softmax_ref(x: np.ndarray, causal: bool = False) -> np.ndarray:
    if causal:
        s = x.shape[-1]
        x = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("r,n", ROWS)
def test_softmax(backend: str, rng: np.random.Generator, dt: Any, r: int, n: int) -> None:
    x, xt = rand(rng, (r, n), dt, 4.0)
    check(ck.softmax(xt), softmax_ref(x), dt)


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("shape", [(1, 1), (7, 7), (3, 33, 33), (2, 2, 9, 9)])
def test_softmax_causal(
    backend: str, rng: np.random.Generator, dt: Any, shape: tuple[int, ...]
) -> None:
    x, xt = rand(rng, shape, dt, 4.0)
    y = ck.softmax(xt, causal=True)
    ref = softmax_ref(x, causal=True)
    check(y, ref, dt)
    assert (y.to_numpy()[ref == 0] == 0).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dt", [DT_PARAMS[0], DT_PARAMS[2]])
def test_softmax_chunked(
    backend: str, rng: np.random.Generator, small_cap: None, dt: Any, causal: bool
) -> None:
    x, xt = rand(rng, (1, 260, 260) if causal else (3, 1000), dt, 4.0)
    check(ck.softmax(xt, causal=causal), softmax_ref(x, causal), dt)


def test_softmax_beyond_the_real_cap(backend: str, rng: np.random.Generator) -> None:
    x, xt = rand(rng, (2, softmax_module.ONE_PASS_CAP + 50), ct.f32, 4.0)
    check(ck.softmax(xt), softmax_ref(x), ct.f32)


@pytest.mark.parametrize("dt", [DT_PARAMS[0], DT_PARAMS[2]])
@pytest.mark.parametrize("n", [2048, 32768])
def test_softmax_long_rows_in_one_pass(
    backend: str, rng: np.random.Generator, dt: Any, n: int
) -> None:
    """Rows up to ONE_PASS_CAP are one tile, one row per block, 32 or 64 elements a thread
    (2048: 2 warps; 32768: 16 warps, 512 threads)."""
    plan, warps = softmax_module.softmax_plan(3, n, dt)
    assert (plan.loop, plan.rows, plan.width, warps) == (False, 1, n, min(16, n // 1024))
    x, xt = rand(rng, (3, n), dt, 4.0)
    check(ck.softmax(xt), softmax_ref(x), dt)


def test_softmax_reads_each_element_once_at_32768() -> None:
    """The bf16 4096 x 32768 row of issue 19: one read of x, one write of y (sampled)."""
    plan, warps = softmax_module.softmax_plan(64, 32768, ct.bf16)
    assert not plan.loop
    tile_k, _, _ = softmax_module._softmax_kernels(ct.bf16, warps)
    spec = ct.PartitionSpec((64, 32768), (1, 32768), ct.bf16), ct.TensorSpec((64, 32768), ct.bf16)
    r = tile_k.report(*spec, 32768, False, target="sm_90")
    assert r.bytes_ratio == 1.0 and r.spill_store_bytes in (0, None)


@pytest.mark.parametrize("dt", [DT_PARAMS[0], DT_PARAMS[2]])
@pytest.mark.parametrize("shape", [(1, 256, 256), (2, 300, 300), (3, 257, 257)])
def test_softmax_causal_wide_rows(
    backend: str, rng: np.random.Generator, dt: Any, shape: tuple[int, ...]
) -> None:
    """Rows of 256 columns or more: the kernel that reads only the visible chunks (257: blocks
    of several 16-bit rows that cross from one matrix into the next)."""
    kernel, tile, _ = softmax_module.softmax_launch(dt, shape[0] * shape[1], shape[2], True)
    assert kernel.__name__ == "softmax_causal" and tile[1] == -(-shape[2] // 256) * 256
    x, xt = rand(rng, shape, dt, 4.0)
    y = ck.softmax(xt, causal=True)
    ref = softmax_ref(x, causal=True)
    check(y, ref, dt)
    assert (y.to_numpy()[ref == 0] == 0).all()


@pytest.mark.parametrize("dt", [DT_PARAMS[0], DT_PARAMS[2]])
@pytest.mark.parametrize("shape", [(3, 517, 517), (2, 301, 301), (1, 1000, 1000)])
def test_softmax_causal_blocks_of_rows(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, dt: Any, shape: tuple[int, ...]
) -> None:
    """Several rows to a block (4 warps): row counts that leave the last block partial,
    blocks that cross from one matrix into the next (517 and 300 are not multiples of the
    rows per block), rows shorter than their tile."""
    monkeypatch.setattr(softmax_module, "CAUSAL_WARPS", 4)
    b, s, _ = shape
    kernel, tile, _ = softmax_module.softmax_launch(dt, b * s, s, True)
    assert kernel.num_warps == 4 and tile[0] > 1
    assert s < tile[1] and (b == 1 or ((b * s) % tile[0] and s % tile[0]))
    x, xt = rand(rng, shape, dt, 4.0)
    y = ck.softmax(xt, causal=True)
    ref = softmax_ref(x, causal=True)
    check(y, ref, dt)
    assert (y.to_numpy()[ref == 0] == 0).all()


#: (dtype, CAUSAL_WARPS, shape, rows a block, CAUSAL_EXACT): the block sizes and ways of
#: reading the chunk a row ends in that `paper_repro.row_sweep` times beside the library's,
#: at the lease's own shapes (f32 1024: a warp a row; 2048: two warps a row) and at one whose
#: blocks cross from one matrix into the next (301 rows).
CAUSAL_BLOCKS = [
    (ct.f32, 4, (3, 301, 301), 8, True),
    (ct.f32, 2, (3, 301, 301), 4, True),
    (ct.f32, 8, (3, 301, 301), 16, True),
    (ct.bf16, 4, (3, 301, 301), 16, True),
    (ct.bf16, 8, (3, 301, 301), 32, True),
    (ct.f32, 4, (1, 1024, 1024), 4, True),
    (ct.f32, 8, (1, 1024, 1024), 8, True),
    (ct.f32, 4, (1, 2048, 2048), 2, True),
    (ct.f32, 8, (1, 2048, 2048), 4, True),
    # The chunk a row ends in read whole (CAUSAL_EXACT off), as the sweep times it too.
    (ct.f32, 1, (3, 301, 301), 2, False),
    (ct.bf16, 4, (3, 301, 301), 16, False),
    (ct.f32, 1, (1, 1024, 1024), 1, False),
]


@pytest.mark.parametrize(("dt", "warps", "shape", "rows", "exact"), CAUSAL_BLOCKS)
def test_softmax_causal_other_block_sizes(
    rng: np.random.Generator,
    monkeypatch: pytest.MonkeyPatch,
    dt: Any,
    warps: int,
    shape: tuple[int, int, int],
    rows: int,
    exact: bool,
) -> None:
    """Each block size and way of reading the chunk a row ends in that `paper_repro.row_sweep`
    times, correct too (on sim), blocks crossing matrices included."""
    monkeypatch.setattr(softmax_module, "CAUSAL_WARPS", warps)
    monkeypatch.setattr(softmax_module, "CAUSAL_EXACT", exact)
    kernel, tile, tail = softmax_module.softmax_launch(dt, shape[0] * shape[1], shape[2], True)
    assert kernel.__name__ == "softmax_causal" and tile[0] == rows and tail[-1] == exact
    x, xt = rand(rng, shape, dt, 4.0)
    y = ck.softmax(xt, causal=True)
    ref = softmax_ref(x, causal=True)
    check(y, ref, dt)
    assert (y.to_numpy()[ref == 0] == 0).all()


@pytest.mark.parametrize("exact", [True, False])
def test_causal_softmax_reads_only_the_visible_part(
    monkeypatch: pytest.MonkeyPatch, exact: bool
) -> None:
    """16 x 1024 x 1024 (sampled): row i of its matrix (limit i + 1) reads its first i + 1
    columns and nothing past them (CAUSAL_EXACT, the library's choice); with whole chunks,
    a block of br rows reads its chunks of 128 up to its last row's column, br * 128 *
    ceil(limit / 128) * 4 bytes per block, where the limit of the block starting at row i
    of its matrix is i + br. y is written whole."""
    assert softmax_module.CAUSAL_EXACT
    monkeypatch.setattr(softmax_module, "CAUSAL_EXACT", exact)
    s = 1024
    kernel, tile, tail = softmax_module.softmax_launch(ct.f32, 16 * s, s, True)
    br = tile[0]
    assert br == kernel.num_warps == softmax_module.CAUSAL_WARPS  # a row a warp
    spec = ct.PartitionSpec((16 * s, s), tile, ct.f32), ct.TensorSpec((16 * s, s), ct.f32)
    r = kernel.report(*spec, *tail, target="sm_90")
    y, x = r.arguments
    # The report samples blocks at both ends of the grid: the first rows (short) and the last
    # (long) of the matrices, and scales; the exact count over the blocks it ran:
    per_matrix = s // br
    ran = [*range(r.blocks_run // 2),
           *range(per_matrix - (r.blocks_run - r.blocks_run // 2), per_matrix)]  # fmt: skip
    if exact:
        visible = sum((b * br + i + 1) * 4 for b in ran for i in range(br))
    else:
        visible = sum(br * 128 * -(-(b * br + br) // 128) * 4 for b in ran)
    assert x.read == round(visible * r.blocks_total / r.blocks_run)
    assert y.written == y.nbytes and x.read < 0.6 * x.nbytes


@pytest.mark.parametrize("dt", [DT_PARAMS[0], DT_PARAMS[2]])
def test_causal_softmax_issues_every_load_before_using_one(dt: Any) -> None:
    """The chunks' loads (one vector load a thread each), then the element-wise loads of the
    chunk each row ends in, are straight-line PTX with no use of a loaded register, and no
    branch, between the first and the last: a warp has every chunk in flight at once (a use
    or a branch between them made it wait for each chunk in turn)."""
    s = 1024
    kernel, tile, tail = softmax_module.softmax_launch(dt, 16 * s, s, True)
    ptx = kernel.ptx(ct.PartitionSpec((16 * s, s), tile, dt), ct.TensorSpec((16 * s, s), dt),
                     *tail).splitlines()  # fmt: skip
    loads = [i for i, line in enumerate(ptx) if "ld.global" in line]
    vectors = [i for i in loads if "ld.global.nc.v4" in ptx[i]]
    assert vectors == loads[: softmax_module.CAUSAL_CHUNKS]
    chunk = tile[0] * tail[1]  # the elements of one chunk of the block
    assert len(loads) - len(vectors) == chunk // (32 * kernel.num_warps)  # a load an element
    loaded: set[str] = set()
    for line in ptx[loads[0] : loads[-1] + 1]:
        assert "bra" not in line, line
        head, _, args = line.partition("{")
        dests, _, sources = args.partition("}")
        if "ld.global" in head and "{" not in line:  # a scalar load: `@%p ld... %f9, [%rd]`
            dests = line.split("ld.global", 1)[1].split(",")[0]
        if "ld.global" in head or ("mov.b32" in head and set(re.findall(r"%\w+", sources))
                                   <= loaded):  # fmt: skip
            loaded |= set(re.findall(r"%\w+", dests))  # 16-bit halves: a renaming
        else:
            assert not loaded & set(re.findall(r"%\w+", line.partition(" ")[2])), line


def test_softmax_checks_causal_shape() -> None:
    with pytest.raises(ValueError, match=r"\(\.\.\., S, S\)"):
        ck.softmax(ct.zeros((4, 5)), causal=True)


def ties(rng: np.random.Generator, shape: tuple[int, ...], dt: Any) -> Any:
    """Small integers (many ties, exact in every dtype) and a few -inf."""
    a = rng.integers(-3, 4, shape).astype(np.float32)
    a[rng.random(shape) < 0.05] = -np.inf
    return a, ct.from_numpy(a, dt)


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("shape", [(1,), (5, 7), (4, 1000), (2, 3, 1536)])
def test_argmax_first_index(
    backend: str, rng: np.random.Generator, dt: Any, shape: tuple[int, ...]
) -> None:
    a, at = ties(rng, shape, dt)
    out = ck.argmax(at)
    assert out.dtype is ct.i32 and out.shape == shape[:-1]
    np.testing.assert_array_equal(out.to_numpy(), np.argmax(a, axis=-1))


@pytest.mark.parametrize("n", [257, 1000, _common.ROW_CAP[ct.f32] + 10])
def test_argmax_chunked(backend: str, rng: np.random.Generator, small_cap: None, n: int) -> None:
    a, at = ties(rng, (3, n), ct.f32)
    a[1, :] = -np.inf  # all -inf: index 0
    a[2, n - 1] = 100.0  # the maximum in the last, partial chunk
    at = ct.from_numpy(a)
    np.testing.assert_array_equal(ck.argmax(at).to_numpy(), np.argmax(a, axis=-1))


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("n", [300, 1000, 1024])
@pytest.mark.parametrize("chunked", [False, True], ids=["tile", "chunked"])
def test_argmax_nan_and_signed_zeros(
    backend: str, rng: np.random.Generator, request: pytest.FixtureRequest, dt: Any, n: int,
    chunked: bool,
) -> None:  # fmt: skip
    """As NumPy's: the first NaN wins wherever it is (a later chunk, a sign-bit NaN, after
    +inf), zeros of both signs are equal (the first wins), all -inf gives 0; ragged widths
    (the last chunk partly past the row's end)."""
    if chunked:
        request.getfixturevalue("small_cap")
    a, _ = ties(rng, (9, n), dt)
    neg_nan = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
    a[0, [n - 2, 5]] = [np.nan, 9.0]  # NaN in the last chunk, after a larger value
    a[1, [3, n - 1]] = [np.inf, neg_nan]
    a[2] = -np.inf
    a[3] = -1.0
    a[3, [n // 2, n - 3, 7]] = [-0.0, 0.0, -5.0]
    a[4, [260, 10]] = [np.nan, np.nan]  # the first NaN, not the later chunk's
    a[5, :] = -0.0
    a[5, n - 1] = 0.0
    a[6, int(rng.integers(0, n))] = 50.0
    a[7, [n - 1, int(rng.integers(0, n - 1))]] = 60.0  # a tie, the last one at the end
    at = ct.from_numpy(a, dt)
    np.testing.assert_array_equal(ck.argmax(at).to_numpy(), np.argmax(a, axis=-1))


# -- rope -------------------------------------------------------------------------------------
def rope_ref(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    half = x.shape[-1] // 2
    freq = theta ** (-2.0 * np.arange(half) / x.shape[-1])
    a = pos.astype(np.float64)[:, None, None] * freq
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * np.cos(a) - x2 * np.sin(a), x2 * np.cos(a) + x1 * np.sin(a)], -1)


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("tokens,heads,d", [(1, 1, 2), (5, 3, 64), (3, 2, 96)])
def test_rope(
    backend: str, rng: np.random.Generator, dt: Any, tokens: int, heads: int, d: int
) -> None:
    x, xt = rand(rng, (tokens, heads, d), dt)
    pos = rng.integers(0, 5000, tokens).astype(np.int32)
    theta = float(rng.choice([10000.0, 500000.0]))
    check(ck.rope(xt, ct.from_numpy(pos), theta=theta), rope_ref(x, pos, theta), dt)
    check(
        ck.rope(xt, ct.from_numpy(pos), theta=theta, max_position=5000),
        rope_ref(x, pos, theta),
        dt,
    )


# -- data movement ----------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [*DT_PARAMS, pytest.param(ct.i32, id="i32")])
@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (65, 100), (130, 257)])
def test_transpose(backend: str, rng: np.random.Generator, dt: Any, shape: tuple[int, int]) -> None:
    a = rng.integers(-100, 100, shape).astype(np.float32 if dt is not ct.i32 else np.int32)
    out = ck.transpose(ct.from_numpy(a, dt))
    assert out.shape == shape[::-1] and out.dtype is dt
    np.testing.assert_array_equal(out.to_numpy(), a.T)


@pytest.mark.parametrize("dt", [*DT_PARAMS, pytest.param(ct.i32, id="i32")])
@pytest.mark.parametrize("v,d,ids_shape", [(1, 1, (1,)), (50, 7, (9,)), (40, 1536, (2, 3))])
def test_embedding(
    backend: str,
    rng: np.random.Generator,
    dt: Any,
    v: int,
    d: int,
    ids_shape: tuple[int, ...],
) -> None:
    table = rng.integers(-100, 100, (v, d)).astype(np.float32 if dt is not ct.i32 else np.int32)
    ids = rng.integers(0, v, ids_shape).astype(np.int32)
    out = ck.embedding(ct.from_numpy(table, dt), ct.from_numpy(ids))
    assert out.shape == (*ids_shape, d) and out.dtype is dt
    np.testing.assert_array_equal(out.to_numpy(), table[ids])


def test_embedding_wide_rows_split_over_blocks(
    backend: str, rng: np.random.Generator, small_cap: None
) -> None:
    table = rng.standard_normal((10, 1000)).astype(np.float32)
    ids = np.array([9, 0, 9, 3], np.int32)
    out = ck.embedding(ct.from_numpy(table), ct.from_numpy(ids))
    np.testing.assert_array_equal(out.to_numpy(), table[ids])


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("d", [33, 1000, 4096])
def test_embedding_out_of_range_ids_give_zeros(
    backend: str, rng: np.random.Generator, dt: Any, d: int
) -> None:
    """As documented: ids outside [0, V) give rows of zeros (the padding of the masked
    load), beside in-range rows; ragged widths."""
    table = rng.integers(1, 100, (7, d)).astype(np.float32)
    ids = np.array([3, -1, 7, 0, 2**31 - 1, 6, -(2**31)], np.int32)
    out = ck.embedding(ct.from_numpy(table, dt), ct.from_numpy(ids)).to_numpy()
    want = np.where(((ids >= 0) & (ids < 7))[:, None], table[np.clip(ids, 0, 6)], 0.0)
    np.testing.assert_array_equal(out.astype(np.float32), want)


# -- gemv -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("m,k", [(1, 1), (7, 33), (65, 1000), (3, 1536), (16, 1024), (20, 2600)])
def test_gemv(backend: str, rng: np.random.Generator, dt: Any, m: int, k: int) -> None:
    a, at = rand(rng, (m, k), dt)
    x, xt = rand(rng, (k,), dt)
    y = ck.gemv(at, xt)
    assert y.shape == (m,) and y.dtype is dt
    ref = a @ x
    # f32 sums of k products: error grows with sqrt(k)·|a||x| on top of the output rounding.
    bound = np.abs(a) @ np.abs(x) * (4e-7 * np.sqrt(k)) + np.abs(ref) * TOL[dt][0] + 1e-6
    assert (np.abs(y.to_numpy().astype(np.float64) - ref) <= bound).all()


def test_library_checks_dtypes_and_shapes() -> None:
    with pytest.raises(TypeError, match="dtypes differ"):
        ck.rms_norm(ct.zeros((2, 4)), ct.zeros(4, ct.f16))
    with pytest.raises(ValueError, match="weight has shape"):
        ck.layer_norm(ct.zeros((2, 4)), ct.zeros(5), ct.zeros(4))
    with pytest.raises(TypeError, match="f32, f16 or bf16"):
        ck.softmax(ct.zeros((2, 4), ct.i32))
    with pytest.raises(ValueError, match="gemv"):
        ck.gemv(ct.zeros((3, 4)), ct.zeros(5))
    with pytest.raises(ValueError, match="head_dim even"):
        ck.rope(ct.zeros((2, 2, 3)), ct.zeros(2, ct.i32))


# -- PTX --------------------------------------------------------------------------------------
def _ptx_cases() -> list[Any]:
    from cutile_py_kernels.cases import cases

    return [pytest.param(k, a, id=label) for label, k, a in cases()]


@pytest.mark.parametrize("sm", [80, 90])
@pytest.mark.parametrize("kernel,args", _ptx_cases())
def test_ptx_assembles_without_spills(kernel: Any, args: tuple[Any, ...], sm: int) -> None:
    from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available

    if not nvjitlink_available():
        pytest.skip("the nvJitLink library cannot be loaded")
    target = ct.Target(sm)
    report = assemble(kernel.ptx(*args, target=target), target)
    assert report.spill_free, report.info_log


@pytest.mark.parametrize(("dt", "shape", "ratio"), [(ct.f32, (1, 256, 256), 1.0),
                                                    (ct.bf16, (1, 256, 256), 1.0),
                                                    (ct.f32, (3, 257, 257), 1.0052)])  # fmt: skip
def test_causal_softmax_bytes_with_rows_sharing_a_block(
    monkeypatch: pytest.MonkeyPatch, dt: Any, shape: tuple[int, int, int], ratio: float
) -> None:
    """Blocks of several rows (4 f32, 8 bf16), the whole grid simulated: where a block's
    rows all end in one chunk, x's bytes read are the visible triangle's exactly; a block
    crossing into the next matrix (257 rows, 2 a block) reads its chunks up to the first
    matrix's last row whole for both its rows, 0.5% more at 3 x 257^2."""
    monkeypatch.setattr(report_module, "MAX_BLOCKS", 1024)
    b, s, _ = shape
    kernel, tile, tail = softmax_module.softmax_launch(dt, b * s, s, True)
    assert tile[0] > 1 and tail[-1] == 1
    spec = ct.PartitionSpec((b * s, s), tile, dt), ct.TensorSpec((b * s, s), dt)
    r = kernel.report(*spec, *tail, target="sm_90")
    assert r.blocks_run == r.blocks_total
    visible = b * s * (s + 1) // 2 * dt.itemsize()
    assert visible <= r.arguments[1].read <= visible * ratio


@pytest.mark.parametrize("dt", DT_PARAMS)
@pytest.mark.parametrize("s", [320, 384, 640])
def test_softmax_causal_at_multiples_of_32(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, dt: Any, s: int
) -> None:
    """S a multiple of 32 but not a power of two: the causal kernel's tile is the next power
    of two (chunks of n / 8 made blocks of 5 or 6 16-bit rows that spilled, 255 registers at
    320, 384 and 640 on sm_90), correct, and reads the visible triangle only."""
    monkeypatch.setattr(report_module, "MAX_BLOCKS", 1024)
    kernel, tile, tail = softmax_module.softmax_launch(dt, s, s, True)
    assert kernel.__name__ == "softmax_causal" and tile[1] == _common.next_pow2(s)
    spec = ct.PartitionSpec((s, s), tile, dt), ct.TensorSpec((s, s), dt)
    r = kernel.report(*spec, *tail, target="sm_90")
    assert r.spill_store_bytes in (0, None) and r.blocks_run == r.blocks_total
    assert r.arguments[1].read == s * (s + 1) // 2 * dt.itemsize()
    x, xt = rand(rng, (1, s, s), dt, 4.0)
    y = ck.softmax(xt, causal=True)
    ref = softmax_ref(x, causal=True)
    check(y, ref, dt)
    assert (y.to_numpy()[ref == 0] == 0).all()
