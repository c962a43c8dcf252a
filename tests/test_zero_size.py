"""Empty tensors (API.md §2 rule 6): a launch over an empty partition is a no-op that hands its
arguments back, on every launcher; every host function of the library takes empty inputs and
returns NumPy's result (an empty array of the right shape and dtype)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
import cutile_py_kernels as kernels
from tests.support import elementwise_kernels as K


@pytest.fixture(params=["sim", "interpret"], autouse=True)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield request.param
    ct.set_backend("sim")


def _empty_add() -> tuple[ct.DeviceOp, tuple[Any, ...]]:
    z = ct.zeros(0).partition(128)
    x, y = ct.from_numpy(np.zeros(0, np.float32)), ct.from_numpy(np.zeros(0, np.float32))
    return K.add(z, x, y), (z, x, y)


def _handed_back(out: tuple[Any, ...], args: tuple[Any, ...]) -> None:
    assert len(out) == len(args) and all(o is a for o, a in zip(out, args))
    z = out[0].unpartition()  # usable again: nothing holds it
    assert z.to_numpy().shape == (0,) and z.to_numpy().dtype == np.float32
    assert out[1].to_numpy().shape == (0,)


def test_creation_and_reading_of_empty_tensors() -> None:
    for dtype, np_dtype in ((ct.f32, np.float32), (ct.f16, np.float16), (ct.i32, np.int32)):
        t = ct.zeros((0, 5), dtype)
        assert t.shape == (0, 5) and t.nbytes == 0
        a = t.to_numpy()
        assert a.shape == (0, 5) and a.dtype == np_dtype
        assert ct.from_numpy(np.zeros((3, 0), np_dtype)).to_numpy().shape == (3, 0)
    assert ct.zeros(0, ct.bf16).to_numpy().dtype == np.float32


def test_sync_over_an_empty_partition_hands_the_arguments_back() -> None:
    op, args = _empty_add()
    assert op.grid == (0,)
    _handed_back(op.sync(), args)


def test_await_then_and_zip_over_empty_partitions() -> None:
    op, args = _empty_add()
    _handed_back(asyncio.run(_await(op)), args)

    op, args = _empty_add()
    chain = op.then(lambda r: K.add(r[0], r[1], r[2]))
    _handed_back(chain.sync(), args)

    (op1, args1), (op2, args2) = _empty_add(), _empty_add()
    out = ct.zip(op1, op2).sync()
    _handed_back(out[0], args1)
    _handed_back(out[1], args2)


def test_a_graph_of_an_empty_launch_replays_nothing(rng: np.random.Generator) -> None:
    op, args = _empty_add()
    n = 300
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    zf, xf, yf = ct.zeros(n).partition(128), ct.from_numpy(a), ct.from_numpy(b)
    g = ct.graph(ct.zip(op, K.add(zf, xf, yf)))
    g.replay()
    np.testing.assert_allclose(g.read(zf), a + b, rtol=1e-6)
    out = g.release()
    _handed_back(out[0], args)


async def _await(op: Any) -> Any:
    return await op


# --- the library's host functions ----------------------------------------------------------

F32 = np.float32


def _t(shape: tuple[int, ...], dtype: Any = F32) -> ct.Tensor[Any, Any]:
    return ct.from_numpy(np.zeros(shape, dtype))


def _ids(n: int) -> ct.Tensor[Any, Any]:
    return ct.from_numpy(np.zeros(n, np.int32))


#: (name, call, NumPy's result shape, dtype) for empty inputs.
LIBRARY: list[tuple[str, Callable[[], Any], tuple[int, ...], Any]] = [
    ("add", lambda: kernels.add(_t((0,)), _t((0,))), (0,), F32),
    ("saxpy", lambda: kernels.saxpy(2.0, _t((0,)), _t((0,))), (0,), F32),
    ("silu_mul", lambda: kernels.silu_mul(_t((0, 64)), _t((0, 64))), (0, 64), F32),
    ("rms_norm", lambda: kernels.rms_norm(_t((0, 64)), _t((64,))), (0, 64), F32),
    (
        "add_rms_norm",
        lambda: kernels.add_rms_norm(_t((0, 64)), _t((0, 64)), _t((64,))),
        (0, 64),
        F32,
    ),
    ("layer_norm", lambda: kernels.layer_norm(_t((0, 64)), _t((64,)), _t((64,))), (0, 64), F32),
    ("softmax rows", lambda: kernels.softmax(_t((0, 64))), (0, 64), F32),
    ("softmax empty rows", lambda: kernels.softmax(_t((4, 0))), (4, 0), F32),
    ("softmax causal", lambda: kernels.softmax(_t((0, 8, 8)), causal=True), (0, 8, 8), F32),
    ("softmax causal 0x0", lambda: kernels.softmax(_t((0, 0)), causal=True), (0, 0), F32),
    ("rope", lambda: kernels.rope(_t((0, 2, 16)), _ids(0)), (0, 2, 16), F32),
    ("transpose", lambda: kernels.transpose(_t((0, 5))), (5, 0), F32),
    ("transpose other", lambda: kernels.transpose(_t((5, 0))), (0, 5), F32),
    ("argmax", lambda: kernels.argmax(_t((0, 64))), (0,), np.int32),
    ("embedding", lambda: kernels.embedding(_t((10, 16)), _ids(0)), (0, 16), F32),
    ("gemm m=0", lambda: kernels.gemm(_t((0, 32)), _t((32, 16))), (0, 16), F32),
    ("gemm n=0", lambda: kernels.gemm(_t((16, 32)), _t((32, 0))), (16, 0), F32),
    ("gemv", lambda: kernels.gemv(_t((0, 32)), _t((32,))), (0,), F32),
    ("bmm", lambda: kernels.bmm(_t((0, 16, 32)), _t((0, 32, 16))), (0, 16, 16), F32),
]


@pytest.mark.parametrize("name,call,shape,dtype", LIBRARY, ids=[c[0] for c in LIBRARY])
def test_library_host_functions_take_empty_inputs(
    name: str, call: Callable[[], Any], shape: tuple[int, ...], dtype: Any
) -> None:
    out = call()
    first = out[0] if isinstance(out, tuple) else out
    a = first.to_numpy()
    assert a.shape == shape and a.dtype == dtype, (a.shape, a.dtype)


def test_gemm_with_an_empty_inner_dimension_is_zeros() -> None:
    """NumPy: (m, 0) @ (0, n) is an (m, n) array of zeros."""
    a, b = np.zeros((16, 0), F32), np.zeros((0, 24), F32)
    for out in (
        kernels.gemm(ct.from_numpy(a), ct.from_numpy(b)).to_numpy(),
        kernels.gemv(ct.from_numpy(a), ct.from_numpy(np.zeros(0, F32))).to_numpy(),
    ):
        np.testing.assert_array_equal(out, a @ (b if out.ndim == 2 else np.zeros(0, F32)))


def test_argmax_of_empty_rows_is_an_error_as_in_numpy() -> None:
    with pytest.raises(ValueError):
        np.argmax(np.zeros((4, 0), F32), axis=-1)
    with pytest.raises(ValueError, match=r"argmax: rows of x \(4, 0\) are empty"):
        kernels.argmax(_t((4, 0)))
