"""cutile_py_kernels against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import cutile_py as ct
import cutile_py_kernels as ck


@pytest.mark.parametrize("n", [1, 1023, 4096, 10_001])
def test_add_and_saxpy(rng: np.random.Generator, n: int) -> None:
    xs = rng.standard_normal(n).astype(np.float32)
    ys = rng.standard_normal(n).astype(np.float32)
    x, y = ct.from_numpy(xs), ct.from_numpy(ys)
    np.testing.assert_array_equal(ck.add(x, y).to_numpy(), xs + ys)
    a = float(rng.uniform(-2, 2))
    np.testing.assert_array_equal(ck.saxpy(a, x, y).to_numpy(), np.float32(a) * xs + ys)
    x.to_numpy()  # inputs stay usable


def test_library_checks_its_inputs() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        ck.add(ct.zeros(4), ct.zeros(5))
    with pytest.raises(TypeError, match="expected f32"):
        ck.add(ct.zeros(4, ct.f16), ct.zeros(4, ct.f16))
