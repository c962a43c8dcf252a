"""The simulator's `red.global` forms that `ct.atomic_*` lowers to, on PTX that nvcc made from
CUDA C (`sim_oracle/red_signed.cu`, committed with `regenerate.sh`): many threads of several
blocks onto a few addresses, against NumPy (integers exact and wrapping; f32 sums of values
that add exactly in any order)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cutile_py as ct

PTX = (Path(__file__).parent / "sim_oracle" / "red_signed.ptx").read_text()


@pytest.mark.parametrize("n", [1, 37, 1000])
def test_red_signed_forms(n: int, rng: np.random.Generator) -> None:
    ct.set_backend("sim")
    xi = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    xl = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    xf = rng.integers(-1000, 1000, n).astype(np.float32) / 8  # exact sums in any order
    iout = np.array([5, -(2**31), 2**31 - 1], np.int32)
    lout = np.array([-3, -(2**63), 2**63 - 1], np.int64)
    fout = np.array([0.5], np.float32)
    args = [ct.from_numpy(a) for a in (xi, xl, xf, iout, lout, fout)]
    op = ct.RawKernel(PTX, "red_signed")(*args, n, grid=(-(-n // 128), 1, 1), block=(128, 1, 1))
    *_, gi, gl, gf, _ = op.sync()
    wrap32 = (5 + int(xi.astype(np.int64).sum()) + 2**31) % 2**32 - 2**31
    np.testing.assert_array_equal(gi.to_numpy(), [wrap32, xi.max(), xi.min()])
    wrap64 = (-3 + sum(int(v) for v in xl) + 2**63) % 2**64 - 2**63
    np.testing.assert_array_equal(gl.to_numpy(), [wrap64, xl.max(), xl.min()])
    assert gf.to_numpy()[0] == np.float32(0.5 + float(xf.astype(np.float64).sum()))


@pytest.mark.parametrize("special", ["finite", "zeros", "nan"])
def test_red_f32_extremes_on_the_bits(special: str, rng: np.random.Generator) -> None:
    """The integer `red` forms of f32 atomic_max/min (`red_f32_extremes`): IEEE totalOrder
    extremes, -0.0 below +0.0, a NaN value leaving NaN."""
    ct.set_backend("sim")
    n = int(rng.integers(1, 2000))
    xs = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 38, n)).astype(np.float32)
    if special == "zeros":
        xs = np.copysign(np.float32(0), rng.random(n) - 0.5).astype(np.float32)
    elif special == "nan":
        xs[rng.integers(0, n)] = np.float32(-np.nan if rng.random() < 0.5 else np.nan)
    out = np.array([-np.inf, np.inf], np.float32)
    args = [ct.from_numpy(a) for a in (xs, out)]
    op = ct.RawKernel(PTX, "red_f32_extremes")(
        *args, n, grid=(-(-n // 128), 1, 1), block=(128, 1, 1)
    )
    _, got, _ = op.sync()
    hi, lo = got.to_numpy()
    if special == "nan":
        assert np.isnan(hi) and np.isnan(lo)
        return
    want_hi, want_lo = xs.max(), xs.min()
    if special == "zeros":  # +0.0 is the max unless every zero is -0.0; -0.0 the min if any
        want_hi = np.float32(-0.0 if np.signbit(xs).all() else 0.0)
        want_lo = np.float32(-0.0 if np.signbit(xs).any() else 0.0)
    assert np.float32(hi).view(np.int32) == np.float32(want_hi).view(np.int32)
    assert np.float32(lo).view(np.int32) == np.float32(want_lo).view(np.int32)
