"""Making tensors (API.md §2 `creation` row): `empty`, and `zeros` / `ones` / `full` filled
in backend memory (on cuda by a memset on the device, checked in test_cuda_backend.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from tests.support import elementwise_kernels as K


@pytest.fixture(params=["sim", "interpret"], autouse=True)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield request.param
    ct.set_backend("sim")


@pytest.mark.parametrize(
    ("dtype", "value"),
    [
        (ct.f32, -1.75),
        (ct.f32, 0.1),  # rounded to f32 as NumPy rounds it
        (ct.f16, 65504.0),
        (ct.f16, 1e-7),  # a subnormal of f16
        (ct.bf16, 3.140625),
        (ct.i32, -(2**31)),
        (ct.i64, 2**40 + 3),
        (ct.bool_, True),
    ],
)
def test_full_holds_numpys_values(dtype: Any, value: float) -> None:
    want = np.full((7, 33), value, dtype=np.float32 if dtype is ct.bf16 else dtype.storage)
    got = ct.full((7, 33), value, dtype).to_numpy()
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ct.zeros(5, dtype).to_numpy(), np.zeros(5, want.dtype))
    np.testing.assert_array_equal(ct.ones(5, dtype).to_numpy(), np.ones(5, want.dtype))


def test_an_empty_tensor_takes_what_a_kernel_writes(rng: np.random.Generator) -> None:
    n, tile = 1000, 128
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    out = ct.empty(n)
    assert out.shape == (n,) and out.dtype is ct.f32 and out.nbytes == 4 * n
    z, _, _ = K.add(out.partition(tile), ct.from_numpy(a), ct.from_numpy(b)).sync()
    np.testing.assert_allclose(z.unpartition().to_numpy(), a + b, rtol=1e-6)


def test_creation_refusals() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        ct.empty((-1, 3))
    with pytest.raises(TypeError, match="cutile_py dtype"):
        ct.empty(3, np.float32)
