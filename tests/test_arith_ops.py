"""In-kernel arithmetic: float and int `//` and `%` (NumPy's meaning), `x ** n`, `ct.pow` and
`**` with other exponents, `a if c else b` on scalars, and Python numbers staying weak through
`ct.maximum`/`ct.minimum`. Each on sim (the compiled PTX) and interpret, against NumPy."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, bf16, f16, f32, i32
from cutile_py.ir.dtypes import round_to, round_to_bf16
from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available
from cutile_py.tools import pow_accuracy

B = TypeVar("B")
Elem = f32  # the element dtype of kernels made per dtype: f32 for mypy, rebound by each maker
DTYPES: dict[str, Any] = {"f32": f32, "f16": f16, "bf16": bf16}
NP_STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.float32}
SPECIALS = np.array(
    [
        *(0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 2.5, -2.5),
        *(3.0, -3.0, 7.0, -7.0, 1e-45, -1e-45, 1e-40, 3.4e38, -3.4e38, 1e30, 1e-30),
    ],
    np.float32,
)


@pytest.fixture(params=["sim", "interpret"])
def backend(request: pytest.FixtureRequest) -> str:
    ct.set_backend(str(request.param))
    return str(request.param)


def run(kernel: Any, n: int, dtype: Any, *args: Any, tile: int = 128) -> np.ndarray:
    """Launch over a NaN-poisoned output of n elements; the output as NumPy."""
    poison = ct.full((n,), np.nan if dtype.is_float() else 12345, dtype)
    return np.asarray(kernel(poison.partition((tile,)), *args).sync()[0].unpartition().to_numpy())


def tensor(a: np.ndarray, dtype: Any) -> ct.Tensor:
    """`a` as a tensor of `dtype` (bf16 from float32 values, rounded)."""
    if dtype is bf16:
        t = ct.zeros(a.shape, bf16)
        return _fill_bf16(t, a)
    return ct.from_numpy(a.astype(NP_STORAGE[dtype.name]))


@ct.kernel
def _copy_f32_to_bf16(z: Mut[Tensor[bf16, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z).astype(bf16))


def _fill_bf16(t: ct.Tensor, a: np.ndarray) -> ct.Tensor:
    out: ct.Tensor = (
        _copy_f32_to_bf16(t.partition((128,)), ct.from_numpy(a.astype(np.float32)))
        .sync()[0]
        .unpartition()
    )
    return out


def in_dtype(values: np.ndarray, name: str) -> np.ndarray:
    """float32 values rounded to the dtype `name`, held as its NumPy storage type (bf16:
    float32)."""
    v = values.astype(np.float32)
    with np.errstate(over="ignore"):  # beyond f16's range: inf, as a cast gives
        return round_to_bf16(v) if name == "bf16" else v.astype(NP_STORAGE[name])


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit, NaN matching any NaN; signs of zero count."""
    got, want = np.asarray(got), np.asarray(want).astype(got.dtype)
    nan = np.isnan(want) if want.dtype.kind == "f" else np.zeros(want.shape, bool)
    if nan.any():
        np.testing.assert_array_equal(np.isnan(got), nan)
    keep = ~nan
    bits = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    bad = got[keep].view(bits) != want[keep].view(bits)
    assert not bad.any(), (
        f"{bad.sum()} differ; first got {got[keep][bad][:6]}, want {want[keep][bad][:6]}"
    )


def random_pairs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Random float32 pairs of any sign and widely spread magnitudes, then every pair of
    special values."""
    mag = lambda k: np.exp2(rng.uniform(-20, 20, k)) * rng.choice([-1, 1], k)  # noqa: E731
    a = mag(n).astype(np.float32)
    b = mag(n).astype(np.float32)
    # Quotients near integers and beyond 2^24 (several reduction steps of the remainder).
    a[: n // 4] = (b[: n // 4] * rng.integers(-100, 100, n // 4)).astype(np.float32)
    a[n // 4 : n // 2] = np.exp2(rng.uniform(40, 120, n // 4)).astype(np.float32)
    k = len(SPECIALS)
    return (
        np.concatenate([a, np.repeat(SPECIALS, k)]),
        np.concatenate([b, np.tile(SPECIALS, k)]),
    )


# -- // and % ---------------------------------------------------------------------------------
@cache
def make_divmod(dt: Any) -> tuple[Any, Any]:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel
    def floordiv(z: Mut[Tensor[Elem, B]], x: Tensor[Elem, Dyn], y: Tensor[Elem, Dyn]) -> None:
        z.store(ct.load_tile_like(x, z) // ct.load_tile_like(y, z))

    @ct.kernel
    def mod(z: Mut[Tensor[Elem, B]], x: Tensor[Elem, Dyn], y: Tensor[Elem, Dyn]) -> None:
        z.store(ct.load_tile_like(x, z) % ct.load_tile_like(y, z))

    return floordiv, mod


FLOORDIV, MOD = make_divmod(f32)


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
def test_float_floordiv_and_mod_are_numpys(
    backend: str, name: str, rng: np.random.Generator
) -> None:
    dt = DTYPES[name]
    a, b = random_pairs(rng, 2000)
    a, b = in_dtype(a, name), in_dtype(b, name)
    with np.errstate(all="ignore"):
        # NumPy computes float16 divmod in float32 and rounds, as the kernels do for bf16.
        want_q = in_dtype(np.floor_divide(a.astype(np.float32), b.astype(np.float32)), name)
        want_r = in_dtype(np.remainder(a.astype(np.float32), b.astype(np.float32)), name)
        if name == "f16":
            assert_same(want_q, np.floor_divide(a, b))
            assert_same(want_r, np.remainder(a, b))
    for kernel, want in zip(make_divmod(dt), (want_q, want_r)):
        got = run(kernel, len(a), dt, tensor(a, dt), tensor(b, dt))
        assert_same(got, want)


def test_float_floordiv_and_mod_special_values(backend: str) -> None:
    k = len(SPECIALS)
    a, b = np.repeat(SPECIALS, k), np.tile(SPECIALS, k)
    with np.errstate(all="ignore"):
        assert_same(run(FLOORDIV, len(a), f32, ct.from_numpy(a), ct.from_numpy(b)), a // b)
        assert_same(run(MOD, len(a), f32, ct.from_numpy(a), ct.from_numpy(b)), a % b)
    # The cases that differ from C's fmod and from floor(a / b), spelled out.
    assert (np.float32(-1.0) % np.float32(np.inf), np.float32(-1.0) // np.float32(np.inf)) == (
        np.inf,
        -1.0,
    )


@ct.kernel
def int_divmod(z: Mut[Tensor[i32, B]], x: Tensor[i32, Dyn], y: Tensor[i32, Dyn]) -> None:
    a = ct.load_tile_like(x, z)
    b = ct.load_tile_like(y, z)
    z.store((a // b) * 65536 + (a % b))


def test_int_floordiv_and_mod_follow_python_and_numpy(
    backend: str, rng: np.random.Generator
) -> None:
    """Floor toward -inf, remainder with the divisor's sign; by zero both are 0 (NumPy's
    result, which it warns about); INT_MIN // -1 wraps to INT_MIN."""
    n = 3000
    a = rng.integers(-30000, 30000, n).astype(np.int32)
    b = rng.integers(-300, 300, n).astype(np.int32)
    a[:4], b[:4] = [-(2**31), 7, -7, 0], [-1, 0, 0, 0]
    with np.errstate(all="ignore"):
        want = (a // b) * np.int32(65536) + a % b
    got = run(int_divmod, n, i32, ct.from_numpy(a), ct.from_numpy(b))
    np.testing.assert_array_equal(got, want)


@ct.kernel
def mixed_scalars(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], s: float) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t % 2.5 + 7.0 // t + (t // s) * 1000.0)


def test_float_divmod_with_scalars(backend: str, rng: np.random.Generator) -> None:
    x = rng.uniform(-20, 20, 500).astype(np.float32)
    got = run(mixed_scalars, 500, f32, ct.from_numpy(x), -1.75)
    with np.errstate(all="ignore"):
        want = x % np.float32(2.5) + np.float32(7.0) // x + (x // np.float32(-1.75)) * 1000
    assert_same(got, want.astype(np.float32))


# -- x ** n -----------------------------------------------------------------------------------
@cache
def make_int_power(dt: Any) -> Any:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel
    def int_power(z: Mut[Tensor[Elem, B]], x: Tensor[Elem, Dyn], n: ct.Constant[int]) -> None:
        z.store(ct.load_tile_like(x, z) ** n)

    return int_power


def int_power_chain(x: np.ndarray, n: int, name: str) -> np.ndarray:
    """x ** n as the kernels compute it, in NumPy: squarings and products, each rounded to
    the dtype, then one division for n < 0."""
    rnd = (lambda v: round_to_bf16(v)) if name == "bf16" else (lambda v: v)
    dt = x.dtype
    result, square, k = None, x, abs(n)
    with np.errstate(all="ignore"):
        while k:
            if k & 1:
                result = square if result is None else rnd((result * square).astype(dt))
            k >>= 1
            if k:
                square = rnd((square * square).astype(dt))
        out = np.ones_like(x) if result is None else result
        return rnd((np.ones_like(x) / out).astype(dt)) if n < 0 else out


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 13, -1, -2, -7])
def test_constant_integer_powers(backend: str, name: str, n: int, rng: np.random.Generator) -> None:
    dt = DTYPES[name]
    x = in_dtype(rng.uniform(-3, 3, 400).astype(np.float32), name)
    x[:5] = in_dtype(np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32), name)
    got = run(make_int_power(dt), len(x), dt, tensor(x, dt), n)
    assert_same(got, int_power_chain(x, n, name))
    # Within a few ulp of NumPy's power (each multiplication rounds once).
    with np.errstate(all="ignore"):
        exact = in_dtype(np.power(x.astype(np.float64), n).astype(np.float32), name)
    finite = np.isfinite(exact) & (np.abs(exact) > 1e-3)
    eps = {"f32": 2.0**-23, "f16": 2.0**-10, "bf16": 2.0**-7}[name]
    rel = np.abs(got[finite].astype(np.float64) / exact[finite] - 1)
    assert rel.max(initial=0) <= (abs(n) + 1) * eps


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 30])
def test_integer_tiles_to_constant_powers_wrap_like_numpy(
    backend: str, n: int, rng: np.random.Generator
) -> None:
    x = rng.integers(-50, 50, 300).astype(np.int32)
    got = run(make_int_power(i32), 300, i32, ct.from_numpy(x), n)
    np.testing.assert_array_equal(got, np.power(x, n))


# -- ct.pow and ** with other exponents -------------------------------------------------------
@cache
def make_pow(dt: Any) -> tuple[Any, Any, Any]:
    if not TYPE_CHECKING:
        Elem = dt  # noqa: F841 (named by the annotations below)

    @ct.kernel
    def pow_fn(z: Mut[Tensor[Elem, B]], x: Tensor[Elem, Dyn], y: Tensor[Elem, Dyn]) -> None:
        z.store(ct.pow(ct.load_tile_like(x, z), ct.load_tile_like(y, z)))

    @ct.kernel
    def pow_op(z: Mut[Tensor[Elem, B]], x: Tensor[Elem, Dyn], y: Tensor[Elem, Dyn]) -> None:
        z.store(ct.load_tile_like(x, z) ** ct.load_tile_like(y, z))

    @ct.kernel
    def pow_consts(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
        t = ct.load_tile_like(x, z)
        z.store(t**2.5 + ct.pow(2.0, t) + ct.pow(t, 0.5) * ct.pow(2.0, 3.0))

    return pow_fn, pow_op, pow_consts


POW_FN, POW_OP, POW_CONSTS = make_pow(f32)


def c_pow(x: np.ndarray, y: np.ndarray, name: str) -> np.ndarray:
    """C's pow in double precision, rounded once to the dtype (the correctly rounded value
    but in rare double-rounding cases)."""
    with np.errstate(all="ignore"):
        exact = np.power(x.astype(np.float64), y.astype(np.float64))
        return (
            in_dtype(exact.astype(np.float32), name) if name != "f16" else exact.astype(np.float16)
        )


def test_pow_special_cases_are_c_powf(backend: str) -> None:
    k = len(SPECIALS)
    x, y = np.repeat(SPECIALS, k), np.tile(SPECIALS, k)
    for kernel in (POW_FN, POW_OP):
        got = run(kernel, len(x), f32, ct.from_numpy(x), ct.from_numpy(y))
        assert_same(got, c_pow(x, y, "f32"))


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
def test_pow_random_within_an_ulp(backend: str, name: str, rng: np.random.Generator) -> None:
    dt = DTYPES[name]
    x, y = pow_accuracy.inputs(3000, rng)
    if name != "f32":  # results inside the 16-bit range
        y = np.clip(y, -14 / np.maximum(np.abs(np.log2(np.abs(x))), 1e-3), 14)
        y = np.where(x < 0, np.round(y), y).astype(np.float32)
        x = np.clip(x, -1e4, 1e4)
    x, y = in_dtype(x, name), in_dtype(y, name)
    got = run(make_pow(dt)[0], len(x), dt, tensor(x, dt), tensor(y, dt)).astype(np.float32)
    if name == "f32":
        err = pow_accuracy.ulp_errors(got, x, y)
        assert err.max() <= 0.5 + 2.0**-16, err.max()
        return
    want = c_pow(x, y, name).astype(np.float32)
    ok = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(all="ignore"):  # spacing of inf and NaN, inf - inf: those are `ok`
        ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float32)
        if name == "bf16":
            ulp = ulp * 8
        near = np.abs(got - want) <= ulp
    assert (ok | near).all(), (x[~(ok | near)][:5], y[~(ok | near)][:5], got[~(ok | near)][:5])


def test_pow_ulp_error_on_sim_measured() -> None:
    """The docstring's claim, on fresh inputs (the tool measures 2^20)."""
    worst, wrong = pow_accuracy.measure(1 << 15, seed=int(np.random.SeedSequence().entropy % 1000))
    assert worst <= 0.5 + 2.0**-16 and wrong == 0.0


def test_pow_with_constant_and_scalar_exponents(backend: str, rng: np.random.Generator) -> None:
    x = rng.uniform(0.01, 10, 500).astype(np.float32)
    got = run(POW_CONSTS, 500, f32, ct.from_numpy(x))
    want = c_pow(x, np.float32(2.5), "f32") + c_pow(np.float32(2.0), x, "f32")
    want = want + c_pow(x, np.float32(0.5), "f32") * np.float32(8.0)
    np.testing.assert_allclose(got, want, rtol=4e-7)


@ct.kernel
def int_pow_neg(z: Mut[Tensor[i32, B]], x: Tensor[i32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) ** -1)


@ct.kernel
def int_pow_tile(z: Mut[Tensor[i32, B]], x: Tensor[i32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t**t)


@pytest.mark.parametrize(
    ("kernel", "words"),
    [(int_pow_neg, "negative integer powers"), (int_pow_tile, "astype(ct.f32)")],
)
def test_integer_powers_numpy_rejects_are_compile_errors(
    backend: str, kernel: Any, words: str
) -> None:
    with pytest.raises(ct.CompileError, match=words.replace("(", r"\(").replace(")", r"\)")):
        run(kernel, 8, i32, ct.from_numpy(np.arange(8, dtype=np.int32)))


# -- a if c else b ----------------------------------------------------------------------------
@ct.kernel
def choose(z: Mut[Tensor[f16, B]], x: Tensor[f16, Dyn], t: int, n: int) -> None:
    v = ct.load_tile_like(x, z)
    s = 0.3 if ct.bid(0) < t else 1.7  # two Python numbers: weak, so f16 arithmetic
    k = n if ct.bid(0) < t else 2.5  # an i32 scalar and a float: f32, as n + 2.5 would be
    z.store(v * s + ct.full(z.shape, k * 0.5 if ct.bid(0) == 0 else 0.0, f16))


def test_conditional_expression_on_scalars(backend: str, rng: np.random.Generator) -> None:
    x = rng.uniform(-4, 4, 512).astype(np.float16)
    got = run(choose, 512, f16, ct.from_numpy(x), 2, 3)
    blocks = np.arange(512) // 128
    s = np.where(blocks < 2, np.float16(0.3), np.float16(1.7)).astype(np.float16)
    extra = np.where(blocks == 0, np.float16(1.5), np.float16(0.0))
    assert_same(got, (x * s + extra).astype(np.float16))


@ct.kernel
def choose_tiles(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], t: int) -> None:
    v = ct.load_tile_like(x, z)
    z.store(v if ct.bid(0) < t else v * 2.0)


@ct.kernel
def choose_by_tile(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    v = ct.load_tile_like(x, z)
    z.store(ct.full(z.shape, 1.0 if v > 0.0 else 2.0, f32))


@pytest.mark.parametrize(
    ("kernel", "words"),
    [
        (choose_tiles, "chooses between scalars, and this branch is a tile"),
        (choose_by_tile, "must be a bool scalar"),
    ],
)
def test_conditional_expression_with_tiles_suggests_where(
    backend: str, kernel: Any, words: str
) -> None:
    args = (ct.from_numpy(np.ones(8, np.float32)),) + ((1,) if kernel is choose_tiles else ())
    with pytest.raises(ct.CompileError, match=words) as e:
        run(kernel, 8, f32, *args)
    assert "ct.where" in str(e.value)


# -- weak Python numbers through ct.maximum / ct.minimum --------------------------------------
@ct.kernel
def weak_max(z: Mut[Tensor[f16, B]], x: Tensor[f16, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t * ct.maximum(0.1, 0.3) + ct.minimum(0.7, 2) * t - abs(-0.1) * t)


def test_maximum_of_python_numbers_stays_weak_on_every_backend(rng: np.random.Generator) -> None:
    x = rng.uniform(-100, 100, 256).astype(np.float16)
    outs = []
    for name in ("sim", "interpret"):
        ct.set_backend(name)
        outs.append(run(weak_max, 256, f16, ct.from_numpy(x)))
    want = x * np.float16(0.3) + np.float16(0.7) * x - np.float16(0.1) * x  # NEP 50: f16 math
    assert_same(outs[0], outs[1])
    assert_same(outs[1], want.astype(np.float16))


def test_fold_of_python_numbers() -> None:
    from cutile_py.ir.reference import fold

    assert fold("max", 2, 1.5) == 2.0 and isinstance(fold("max", 2, 1.5), float)
    assert fold("min", 2, 3) == 2 and isinstance(fold("min", 2, 3), int)
    assert np.isnan(fold("max", 1.0, float("nan"))) and np.isnan(fold("min", float("nan"), 1))
    assert fold("pow", 0.0, -1) == np.inf and np.isnan(fold("pow", -8.0, 1 / 3))
    assert ct.maximum(1, 2.5) == 2.5 and ct.pow(2, 10) == 1024.0


# -- typing: a user's kernel file under mypy --strict -----------------------------------------
USER_KERNEL = """
from typing import TypeVar
import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

B = TypeVar("B")


@ct.kernel
def k(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], s: float) -> None:
    t = ct.load_tile_like(x, z)
    c: float = ct.pow(2.0, 3.0) + ct.maximum(1.0, s)
    u: ct.Tile = ct.pow(t, 2.0) + t**3 + 2.0**t + t % 1.5 + t // s
    z.store(u * (c if s > 0.0 else 1.0))
"""


def test_pow_and_friends_type_check_in_a_user_kernel(tmp_path: Path) -> None:
    src = tmp_path / "user_kernel.py"
    src.write_text(textwrap.dedent(USER_KERNEL))
    root = Path(ct.__file__).resolve().parents[1]
    config = ["--config-file", str(root / "pyproject.toml")]
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *config, str(src)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        # An editable install is invisible to mypy: point it at the checkout.
        env={**os.environ, "MYPYPATH": str(root)},
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- the PTX assembles ------------------------------------------------------------------------
@ct.kernel(fast_math=True)
def pow_fast(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    z.store(ct.pow(ct.load_tile_like(x, z), ct.load_tile_like(y, z)))


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
@pytest.mark.parametrize("sm", [80, 90])
@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
def test_ptx_assembles_without_spills(sm: int, name: str) -> None:
    """The remainder's loop, the f64 pow core and the fast pow, per dtype, as nvJitLink sees
    them, 8 elements per thread (tiles of 1024)."""
    dt = DTYPES[name]
    args = (ct.PartitionSpec((5000,), (1024,), dt), ct.TensorSpec((5000,), dt))
    kernels = [*make_divmod(dt), make_pow(dt)[0], *([pow_fast] if dt is f32 else [])]
    for kernel in kernels:
        report = assemble(kernel.ptx(*args, args[1], target=f"sm_{sm}"), ct.Target(sm))
        assert report.cubin
        assert report.spill_free, report.info_log


# -- 1 / x under fast_math ------------------------------------------------------------------
@ct.kernel(fast_math=True)
def recip_fast(
    z: Mut[Tensor[f32, B]], w: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]
) -> None:
    t = ct.load_tile_like(x, z)
    z.store(1.0 / t)
    w.store(ct.load_tile_like(y, w) / t)


def test_fast_reciprocal_is_one_rcp(rng: np.random.Generator) -> None:
    """`1.0 / x` in a fast_math kernel is rcp.approx.ftz alone (div.approx.ftz's expansion by
    ptxas adds a flushing FADD to the MUFU.RCP); any other numerator stays div.approx."""
    n = 3001
    spec = ct.PartitionSpec((n,), (1024,))
    ptx = recip_fast.ptx(spec, spec, ct.TensorSpec((n,)), ct.TensorSpec((n,)))
    assert ptx.count("rcp.approx.ftz.f32") == 4 and ptx.count("div.approx.ftz.f32") == 4, ptx
    xs = (rng.uniform(0.5, 4.0, n) * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    ys = rng.standard_normal(n).astype(np.float32)
    z, w, _, _ = recip_fast(
        ct.empty((n,)).partition(1024), ct.empty((n,)).partition(1024),
        ct.from_numpy(xs), ct.from_numpy(ys),
    ).sync()  # fmt: skip
    # The simulator's .approx results are correctly rounded.
    np.testing.assert_array_equal(z.unpartition().to_numpy(), np.float32(1.0) / xs)
    np.testing.assert_array_equal(w.unpartition().to_numpy(), ys / xs)


# -- 16-bit sums ------------------------------------------------------------------------------
def _half_sum(dt: Any) -> Any:
    @ct.kernel
    def half_sum(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
        a = ct.load_tile_like(x, z).astype(dt)
        b = ct.load_tile_like(y, z).astype(dt)
        z.store((a.astype(f32) + b.astype(f32)).astype(dt).astype(f32))

    return half_sum


@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_sum_narrowed_to_16_bits_is_one_fma(name: str, rng: np.random.Generator) -> None:
    """dt(f32(a) + f32(b)) on 16-bit a, b lowers to one fma.rn.{dt} a, 1, b (f32's rounding
    before dt's cannot change dt's result: 24 >= 2p + 2 bits), bit for bit what NumPy's f32
    sum rounded to dt gives, across magnitudes, signed zeros, subnormals and infinities."""
    dt = DTYPES[name]
    kernel = _half_sum(dt)
    n = 4099
    spec = (ct.PartitionSpec((n,), (1024,)), ct.TensorSpec((n,)), ct.TensorSpec((n,)))
    ptx = kernel.ptx(*spec)
    # Per thread: 4 elements; narrowing only a and b from the f32 inputs, not the sum.
    assert ptx.count(f"fma.rn.{name} ") == 4 and ptx.count(f"cvt.rn.{name}.f32") == 8, ptx
    scale = 2.0 ** rng.integers(-30, 30, n)
    xs = (rng.standard_normal(n) * scale).astype(np.float32)
    ys = (rng.standard_normal(n) * scale * 2.0 ** rng.integers(-12, 12, n)).astype(np.float32)
    special = [0.0, -0.0, np.inf, -np.inf, 6e-8, -6e-8, 1e-40, 65504.0, 3e38]
    xs[: len(special)] = special
    ys[: len(special)] = special[::-1]
    z, _, _ = kernel(ct.empty((n,)).partition(1024), ct.from_numpy(xs), ct.from_numpy(ys)).sync()
    got = z.unpartition().to_numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        a, b = (round_to(v, dt).astype(np.float32) for v in (xs, ys))
        want = round_to(a + b, dt).astype(np.float32)
    np.testing.assert_array_equal(got, want)  # NaN where want is NaN (inf - inf)
    number = ~np.isnan(want)
    assert np.array_equal(np.signbit(got[number]), np.signbit(want[number]))
