"""`ct.sin`, `ct.cos` and `ct.erf` through the kernel language: the documented f32 error bounds
on sim (20k random inputs per range here; `python -m cutile_py.tools.math_accuracy` measures
2^20), the interpreter's correctly rounded values, f16/bf16/integer inputs, special values, and
the constants against their generator (`cutile_py.tools.fit_math`)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, bf16, f16, f32, i32
from cutile_py.ir.dtypes import round_to
from cutile_py.lower import emit_math
from cutile_py.runtime.nvjitlink import assemble
from cutile_py.tools import fit_math, math_accuracy
from cutile_py.tools.math_accuracy import RANGES, errors, range_name

B = TypeVar("B")
SEED = 20250120
N = 20_000
#: The bounds in ulp of the exact value that README and the emitters' docstrings state
#: (measured max over 4 x 2^20 inputs per range: sin 1.48, cos 1.49, erf 1.03).
BOUND = {"sin": 1.5, "cos": 1.5, "erf": 1.1}
NAMES = sorted(BOUND)
CASES = [(name, r) for name in NAMES for r in RANGES[name]]


@pytest.mark.parametrize(("name", "r"), CASES, ids=[f"{n}-{range_name(r)}" for n, r in CASES])
def test_error_bound_on_sim(name: str, r: tuple[float, float] | None) -> None:
    ct.set_backend("sim")
    worst, dist, at = math_accuracy.measure(name, r, N, seed=SEED)
    assert worst <= BOUND[name], f"ct.{name}: {worst:.3f} ulp at x = {at!r}"
    assert dist <= 1, f"ct.{name}: {dist} ulp from the correctly rounded result"


@pytest.mark.parametrize("name", NAMES)
def test_interpret_is_correctly_rounded(name: str) -> None:
    ct.set_backend("interpret")
    x = np.concatenate([math_accuracy.inputs(r, 4000, SEED) for r in RANGES[name]])
    got = math_accuracy.run(name, x)
    _, dist = errors(name, x, got)
    assert dist.max() == 0


def test_near_multiples_of_half_pi() -> None:
    """The f32 nearest k pi/2: small remainders, where the reduction's error shows most; both
    reductions (k pi/2 below and above 105615) and the whole exponent range."""
    ct.set_backend("sim")
    rng = np.random.default_rng(SEED)
    pio2 = Fraction(fit_math.pi_bits(400), 2**401)
    ks = [int(k) for k in rng.integers(1, 2**26, 3000)]
    ks += [int(rng.integers(1, 2**40)) << int(s) for s in rng.integers(0, 85, 2000)]
    x = np.array([float(k * pio2) for k in ks], dtype=np.float32)
    x = np.concatenate([x, -x])
    for name in ("sin", "cos"):
        err, dist = errors(name, x, math_accuracy.run(name, x))
        worst = int(np.argmax(err))
        assert err[worst] <= BOUND[name], f"ct.{name}: {err[worst]:.3f} ulp at x = {x[worst]!r}"
        assert dist.max() <= 1


SPECIAL = np.array(
    [
        *[0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-149, -(2.0**-149), 1e-30, -1e-30, 2.0**-126],
        *[3.4028235e38, -3.4028235e38, 1e38, 2.0**100, 105615.0, 105616.0, -105616.0, 2.0**24],
        *[0.921875, -0.921875, 3.92, -3.92, 3.9192, 10.0, -10.0, 1.0, -1.0],
        # The f32s >= 2^16 nearest a multiple of pi/2 (r = 2^-29.2, 2^-28.9).
        *[7.729179e28, -7.729179e28, 2.1999385e10],
    ],
    dtype=np.float32,
)


@pytest.mark.parametrize("backend", ["sim", "interpret"])
@pytest.mark.parametrize("name", NAMES)
def test_special_values(name: str, backend: str) -> None:
    """NaN for inf and NaN (sin, cos), +-1 for +-inf (erf), signed zeros kept (sin(-0) = -0,
    erf(-0) = -0), subnormals, the largest f32, the borders of the reductions and of erf's
    pieces."""
    ct.set_backend(backend)
    got = math_accuracy.run(name, SPECIAL)
    err, dist = errors(name, SPECIAL, got)
    assert dist.max() <= (0 if backend == "interpret" else 1), SPECIAL[dist > 0]
    assert err.max() <= (0.5 if backend == "interpret" else BOUND[name]), SPECIAL[err > 0.5]
    with np.errstate(invalid="ignore"):
        want = math_accuracy.EXACT[name](SPECIAL.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # Zeros, +-1 and the results of infinities: exactly, with their signs.
    exact = ((want == 0) | np.isinf(SPECIAL) | (np.abs(want) == 1)) & ~np.isnan(want)
    np.testing.assert_array_equal(got[exact], want[exact])
    np.testing.assert_array_equal(np.signbit(got[exact]), np.signbit(want[exact]))
    if name == "sin":
        assert np.signbit(got[1]) and got[5] == np.float32(2.0**-149)
    if name == "cos":
        assert got[0] == 1 and got[1] == 1
    if name == "erf":
        assert list(got[2:4]) == [1, -1] and np.signbit(got[1])


@ct.kernel
def _trig_f16(z: Mut[Tensor[f16, B]], x: Tensor[f16, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(ct.sin(t) + ct.cos(t) * ct.erf(t))


@ct.kernel
def _trig_bf16(z: Mut[Tensor[bf16, B]], x: Tensor[bf16, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(ct.sin(t) + ct.cos(t) * ct.erf(t))


@ct.kernel
def _trig_i32(z: Mut[Tensor[f32, B]], x: Tensor[i32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(ct.sin(t) + ct.cos(t) + ct.erf(t))


def _rounded(x: np.ndarray, name: str, dtype: type[ct.DType]) -> np.ndarray:
    return round_to(math_accuracy.EXACT[name](x.astype(np.float64)), dtype)


@pytest.mark.parametrize("backend", ["sim", "interpret"])
@pytest.mark.parametrize("dtype", [f16, bf16], ids=["f16", "bf16"])
def test_16_bit_inputs(dtype: type[ct.DType], backend: str) -> None:
    """As tanh: computed in f32 and each result rounded to the input's type, so sin(t) etc.
    are each the 16-bit rounding of the f32 value (within one 16-bit ulp of the correctly
    rounded one, since the f32 value is within 1.5 f32 ulp), and then added in 16 bits."""
    ct.set_backend(backend)
    rng = np.random.default_rng(SEED)
    n = 5000
    x = round_to(rng.uniform(-8, 8, n).astype(np.float32), dtype)
    kernel = _trig_f16 if dtype is f16 else _trig_bf16
    z = ct.full((n,), np.nan, dtype).partition((512,))
    got = kernel(z, ct.from_numpy(x, dtype)).sync()[0].unpartition().to_numpy()
    s, c, e = (_rounded(x, name, dtype) for name in ("sin", "cos", "erf"))
    want = round_to(s + round_to(c * e, dtype), dtype)
    if backend == "interpret":
        np.testing.assert_array_equal(got, want)
    else:
        # One 16-bit ulp on each of sin, cos, erf can move the sum by a few of its ulps.
        eps = 2.0**-10 if dtype is f16 else 2.0**-7
        np.testing.assert_allclose(got, want, rtol=4 * eps, atol=4 * eps)
        assert np.mean(got == want) > 0.95


@pytest.mark.parametrize("backend", ["sim", "interpret"])
def test_integer_inputs_compute_in_f32(backend: str) -> None:
    ct.set_backend(backend)
    x = np.arange(-3000, 3000, 3, dtype=np.int32)
    z = ct.full((x.size,), np.nan, f32).partition((256,))
    got = _trig_i32(z, ct.from_numpy(x)).sync()[0].unpartition().to_numpy()
    x32 = x.astype(np.float32)
    parts = [_rounded(x32, name, f32) for name in ("sin", "cos", "erf")]
    want = (parts[0] + parts[1]) + parts[2]
    np.testing.assert_allclose(got, want, atol=4 * 2.0**-24)


def test_constants_match_their_generator() -> None:
    """2/pi's words and pi/2's parts in `emit_math` are what `fit_math` computes exactly (pi
    by Machin's formula in integers), checked here against math.pi as well."""
    assert list(emit_math._TWO_OVER_PI_WORDS[:7]) == fit_math.two_over_pi_words()
    assert emit_math._TWO_OVER_PI_WORDS[7] == 0
    g = sum(w << (32 * i) for i, w in enumerate(fit_math.two_over_pi_words()))
    assert abs(g / 2.0**224 - 2 / math.pi) < 1e-16
    parts, rest = fit_math.pio2_parts()
    imms = (emit_math._NEG_PIO2_1, emit_math._NEG_PIO2_2, emit_math._NEG_PIO2_3)
    assert [imm.text for imm in imms] == [ct_f32_imm(-p) for p in parts]
    assert rest < -70
    assert abs(sum(parts) - math.pi / 2) < 1e-15


def ct_f32_imm(v: float) -> str:
    return emit_math.f32_imm(v).text


def test_polynomials_match_their_fits() -> None:
    """Rerunning the fits (`python -m cutile_py.tools.fit_math`) gives the f32 coefficients
    in `emit_math`, within the errors its comments state."""
    fits = [
        (fit_math.sin_fit(), emit_math._SIN_S, -32.4),
        (fit_math.cos_fit(), emit_math._COS_K, -32.5),
        (fit_math.erf_small_fit(), emit_math._ERF_Q, -30.0),
        (fit_math.erf_large_fit(), emit_math._ERF_P, -26.2),
    ]
    for fit, imms, log2_err in fits:
        coef, err = fit.f32_coefficients()
        assert [ct_f32_imm(c) for c in coef] == [imm.text for imm in imms]
        assert math.log2(err) < log2_err


def test_kernel_assembles_without_spills() -> None:
    """A 4096-element tile of sin: each element has its own branch around the large-argument
    reduction (16 per thread here), and ptxas still needs no spills."""
    spec = (ct.PartitionSpec((8192,), (4096,), f32), ct.TensorSpec((8192,), f32))
    ptx = math_accuracy.KERNELS["sin", False].ptx(*spec, target="sm_90")
    assert ptx.count("bra") == 16
    report = assemble(ptx, ct.Target(90))
    assert report.spill_free
    assert report.registers <= 64
