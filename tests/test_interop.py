"""Interop (API.md §2 `creation`, `reading` and `streams` rows): `ct.from_dlpack` borrows
zero-copy, `t.__dlpack__()` exports zero-copy, `__cuda_array_interface__` on cuda, and other
libraries' streams (`__cuda_stream__`) wherever a `ct.Stream` goes.

NumPy checks the CPU side on `sim` and `interpret`; PyTorch and CuPy on a GPU (`gpu` tests).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.runtime import cuda_driver as cu
from cutile_py.runtime import dlpack
from tests.support import elementwise_kernels as K
from tests.support.fake_driver import FakeDriver

N = 1000
TILE = 128


@pytest.fixture(params=["sim", "interpret"], autouse=True)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield request.param
    ct.set_backend("sim")


def _vec(rng: np.random.Generator, n: int = N) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


class ForeignStream:
    """A stream of another library: cuda.core's `__cuda_stream__` protocol."""

    def __init__(self, handle: int = 0x1234) -> None:
        self.handle = handle
        self.asked = 0

    def __cuda_stream__(self) -> tuple[int, int]:
        self.asked += 1
        return (0, self.handle)


# --- from_dlpack: borrowing --------------------------------------------------------------


def test_from_dlpack_borrows_numpy_memory(rng: np.random.Generator) -> None:
    a, b = _vec(rng), _vec(rng)
    out = np.zeros(N, np.float32)
    z = ct.from_dlpack(out)
    x = ct.from_dlpack(a)
    assert x.shape == (N,) and x.dtype is ct.f32 and x.device == ct.backend()
    K.add(z.partition(TILE), x, ct.from_numpy(b)).sync()
    np.testing.assert_allclose(out, a + b, rtol=1e-6)  # written in place: zero-copy
    a[:] = 7.0
    np.testing.assert_array_equal(x.to_numpy(), np.full(N, 7.0, np.float32))


def test_borrowed_memory_outlives_the_producer_reference(rng: np.random.Generator) -> None:
    a = _vec(rng)
    keep = a.copy()
    x = ct.from_dlpack(a)
    del a
    gc.collect()
    np.testing.assert_array_equal(x.to_numpy(), keep)


def test_from_dlpack_of_2d_int_and_bool(rng: np.random.Generator) -> None:
    m = rng.integers(-5, 5, size=(7, 9)).astype(np.int32)
    flags = m > 0
    assert ct.from_dlpack(m).shape == (7, 9) and ct.from_dlpack(m).dtype is ct.i32
    np.testing.assert_array_equal(ct.from_dlpack(flags).to_numpy(), flags)


def test_from_dlpack_refusals() -> None:
    with pytest.raises(ValueError, match="C-contiguous"):
        ct.from_dlpack(np.zeros((8, 8), np.float32)[:, ::2])
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises((ValueError, TypeError), match=r"read-only|readonly"):
        ct.from_dlpack(ro)
    with pytest.raises(TypeError, match="float64"):
        ct.from_dlpack(np.zeros(8))
    with pytest.raises(TypeError, match="cannot borrow a list"):
        ct.from_dlpack([1.0, 2.0])
    with pytest.raises(TypeError, match="would alias it"):
        ct.from_dlpack(ct.zeros(4))


# --- __dlpack__: exporting ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [ct.f32, ct.f16, ct.i32, ct.i64, ct.bool_])
def test_dlpack_export_is_zero_copy(rng: np.random.Generator, dtype: Any) -> None:
    values = rng.standard_normal((5, 40)) * 4
    t = ct.from_numpy(values.astype(dtype.storage) if dtype is not ct.bool_ else values > 0)
    view = np.from_dlpack(t)
    assert view.shape == (5, 40) and view.dtype == dtype.storage
    np.testing.assert_array_equal(view, t.to_numpy().astype(dtype.storage))
    assert t.__dlpack_device__() == (1, 0)


def test_dlpack_export_sees_kernel_output_and_keeps_memory_alive(
    rng: np.random.Generator,
) -> None:
    a, b = _vec(rng), _vec(rng)
    z, _, _ = K.add(ct.zeros(N).partition(TILE), ct.from_numpy(a), ct.from_numpy(b)).sync()
    t = z.unpartition()
    view = np.from_dlpack(t)
    live = len(dlpack._live)
    del t, z
    gc.collect()
    np.testing.assert_allclose(view, a + b, rtol=1e-6)  # the buffer lives as long as the view
    del view
    gc.collect()
    assert len(dlpack._live) == live - 1


def test_unconsumed_capsule_frees_its_record() -> None:
    t = ct.zeros(16)
    live = len(dlpack._live)
    capsule = t.__dlpack__()
    assert len(dlpack._live) == live + 1
    del capsule
    gc.collect()
    assert len(dlpack._live) == live


def test_dlpack_export_checks_ownership(rng: np.random.Generator) -> None:
    x = ct.from_numpy(_vec(rng))
    op = K.add(ct.zeros(N).partition(TILE), x, x)
    with pytest.raises(ct.BorrowError, match=r"cannot export the tensor.*held by the pending"):
        np.from_dlpack(x)
    op.sync()
    with pytest.raises(BufferError, match="without copying"):
        x.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="not"):
        x.__dlpack__(dl_device=(2, 0))
    assert not hasattr(x, "__cuda_array_interface__")  # host memory


# --- foreign streams ---------------------------------------------------------------------


# --- several views of one memory: ownership belongs to the span ---------------------------


def _two_views(rng: np.random.Generator) -> tuple[np.ndarray, Any, Any]:
    a = _vec(rng)
    return a, ct.from_dlpack(a), ct.from_dlpack(a)


def test_a_mut_op_on_one_view_holds_every_view(rng: np.random.Generator) -> None:
    a, t1, t2 = _two_views(rng)
    b, c = _vec(rng), _vec(rng)
    x, y = ct.from_numpy(b), ct.from_numpy(c)
    op = K.add(t1.partition(TILE), x, y)  # pending, and writes a's memory
    with pytest.raises(ct.BorrowError, match=r"also viewed by another tensor.*kernel add made at"):
        t2.to_numpy()
    with pytest.raises(ct.BorrowError, match="also viewed"):
        np.from_dlpack(t2)
    p2 = t2.partition(TILE)  # (partitioning touches no memory)
    with pytest.raises(ct.BorrowError, match=r"parameter 'z'.*also viewed"):
        K.add(p2, x, y)
    t2 = p2.unpartition()
    with pytest.raises(ct.BorrowError, match=r"parameter 'x'.*also viewed"):
        K.add(ct.zeros(N).partition(TILE), t2, y)  # a read of memory being written
    z, _, _ = op.sync()
    np.testing.assert_allclose(t2.to_numpy(), b + c, rtol=1e-6)  # the op's write, seen
    np.testing.assert_allclose(a, b + c, rtol=1e-6)
    # Let go, every view is free again: a Mut launch on the second one runs.
    K.add(t2.partition(TILE), x, x).sync()
    np.testing.assert_allclose(a, 2 * b, rtol=1e-6)
    np.testing.assert_allclose(z.unpartition().to_numpy(), 2 * b, rtol=1e-6)


def test_a_reading_op_on_one_view_allows_reads_of_another(rng: np.random.Generator) -> None:
    a, t1, t2 = _two_views(rng)
    t3 = ct.from_dlpack(a)
    b = _vec(rng)
    x = ct.from_numpy(b)
    first = K.add(ct.zeros(N).partition(TILE), t1, x)  # reads a's memory, pending
    second = K.add(ct.zeros(N).partition(TILE), t2, x)  # another read: allowed
    with pytest.raises(ct.BorrowError, match=r"parameter 'z'.*also viewed"):
        K.add(t3.partition(TILE), x, x)  # a write is not
    with pytest.raises(ct.BorrowError, match="also viewed"):
        ct.from_dlpack(a).to_numpy()  # nor the host, while launches use the memory
    for op in (first, second):
        np.testing.assert_allclose(op.sync()[0].unpartition().to_numpy(), a + b, rtol=1e-6)
    np.testing.assert_array_equal(t2.to_numpy(), a)


def test_a_graph_holding_one_view_holds_every_view(rng: np.random.Generator) -> None:
    a, t1, t2 = _two_views(rng)
    b = _vec(rng)
    x = ct.from_numpy(b)
    g = ct.graph(K.add(t1.partition(TILE), x, x), name="double")
    with pytest.raises(ct.BorrowError, match=r"also viewed.*graph 'double'"):
        t2.to_numpy()
    with pytest.raises(ct.BorrowError, match=r"parameter 'x'.*graph 'double'"):
        K.add(ct.zeros(N).partition(TILE), t2, x)
    g.replay()
    g.release()
    np.testing.assert_allclose(t2.to_numpy(), 2 * b, rtol=1e-6)
    np.testing.assert_allclose(a, 2 * b, rtol=1e-6)


def test_graph_update_refuses_memory_a_pending_op_holds_through_another_view(
    rng: np.random.Generator,
) -> None:
    a, t1, t2 = _two_views(rng)
    g = ct.graph(K.add(ct.zeros(N).partition(TILE), t1, t1))
    op = K.add(ct.zeros(N).partition(TILE), t2, t2)  # reads a, pending: the graph may not write
    with pytest.raises(ct.BorrowError, match=r"update: the memory of .* kernel add made at"):
        g.update(t1, _vec(rng))
    op.sync()
    a = _vec(rng)
    g.update(t1, a)
    g.replay()
    z, _, _ = g.release()
    np.testing.assert_allclose(z.unpartition().to_numpy(), 2 * a, rtol=1e-6)


@pytest.mark.parametrize(
    "views",
    [
        [slice(None), slice(None)],  # the same array twice
        [slice(0, N // 2), slice(None)],  # a prefix first, then all of it (one start address)
        [slice(N // 4, N), slice(0, N // 2)],  # overlapping halves
        [slice(0, N // 2), slice(N // 2, N), slice(None)],  # two halves, then their union
    ],
)
@pytest.mark.parametrize("keep", ["first", "last"])
def test_views_of_one_array_stay_reachable_while_any_lives(
    rng: np.random.Generator, views: list[slice], keep: str
) -> None:
    a = _vec(rng)
    tensors = [ct.from_dlpack(a[s]) for s in views]
    i = 0 if keep == "first" else len(views) - 1
    kept, sl = tensors[i], views[i]
    del tensors
    gc.collect()
    want = a[sl].copy()
    z, _, _ = K.add(ct.zeros(want.size).partition(TILE), kept, kept).sync()
    np.testing.assert_allclose(z.unpartition().to_numpy(), 2 * want, rtol=1e-6)
    out = ct.from_dlpack(a)
    K.add(out.partition(TILE), ct.from_numpy(a), ct.from_numpy(a)).sync()
    np.testing.assert_allclose(kept.to_numpy(), 2 * want, rtol=1e-6)  # one memory, one view


def test_foreign_streams_are_accepted_where_a_stream_is(rng: np.random.Generator) -> None:
    a, b = _vec(rng), _vec(rng)
    s = ForeignStream()
    z, _, _ = K.add(ct.zeros(N).partition(TILE), ct.from_numpy(a), ct.from_numpy(b)).sync_on(s)
    np.testing.assert_allclose(z.unpartition().to_numpy(), a + b, rtol=1e-6)
    assert s.asked == 1
    x = ct.from_numpy(a)
    chain = K.add(ct.zeros(N).partition(TILE), x, x).then(lambda r: K.add(*r))
    z2 = chain.sync_on(s)[0]
    np.testing.assert_allclose(z2.unpartition().to_numpy(), 2 * a, rtol=1e-6)
    out = ct.zeros(N).partition(TILE)
    g = ct.graph(K.add(out, x, x))
    g.replay(s)
    np.testing.assert_allclose(g.read(out), 2 * a, rtol=1e-6)
    g.release()
    with pytest.raises(TypeError, match=r"expected a ct.Stream or a stream object"):
        K.add(ct.zeros(N).partition(TILE), x, x).sync_on(object())


def test_foreign_stream_with_a_bad_handle() -> None:
    class Bad:
        def __cuda_stream__(self) -> tuple[int, str]:
            return (0, "nope")

    x = ct.zeros(N)
    with pytest.raises(TypeError, match="integer handle"):
        K.add(ct.zeros(N).partition(TILE), x, x).sync_on(Bad())


# --- the cuda side, without a GPU --------------------------------------------------------


def _foreign(**kw: Any) -> cu.ForeignArray:
    base: dict[str, Any] = dict(
        address=1 << 20,
        shape=(4, 8),
        strides=None,
        dtype=np.dtype(np.float32),
        device_id=0,
        device_accessible=True,
        readonly=False,
    )
    base.update(kw)
    return cu.ForeignArray(**base)


def test_cuda_borrow_checks() -> None:
    pytest.importorskip("cuda.core")
    from cutile_py.runtime.cuda_backend import check_foreign

    check_foreign(_foreign(), 0, "Tensor")
    check_foreign(_foreign(strides=(8, 1)), 0, "Tensor")
    check_foreign(_foreign(shape=(4, 1), strides=(1, 99)), 0, "Tensor")  # size-1 dims: any
    with pytest.raises(ValueError, match=r"host memory.*ct.from_numpy"):
        check_foreign(_foreign(device_id=-1, device_accessible=False), 0, "ndarray")
    with pytest.raises(ValueError, match="on device 1"):
        check_foreign(_foreign(device_id=1), 0, "Tensor")
    with pytest.raises(ValueError, match="not C-contiguous"):
        check_foreign(_foreign(strides=(1, 4)), 0, "Tensor")
    with pytest.raises(ValueError, match="read-only"):
        check_foreign(_foreign(readonly=True), 0, "Tensor")
    # cuda.core describes a NumPy array as host memory
    view = cu.foreign_array(np.zeros((3, 5), np.float16), -1)
    assert view.shape == (3, 5) and view.dtype == np.float16 and not view.device_accessible
    with pytest.raises(ValueError, match="host memory"):
        check_foreign(view, 0, "ndarray")


def test_cuda_array_interface_on_a_stand_in_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cuda.bindings")
    from cutile_py.runtime.cuda_backend import CudaBackend

    monkeypatch.setattr(cu, "_cu", lambda: FakeDriver())
    backend = CudaBackend()
    monkeypatch.setattr(backend, "stream_address", lambda: 0xABC)
    buf = backend.alloc(4 * 12)
    t: ct.Tensor[Any, Any] = ct.Tensor(buf, (3, 4), ct.f32, backend)
    cai = t.__cuda_array_interface__
    assert cai == {
        "shape": (3, 4),
        "typestr": "<f4",
        "data": (buf.address, False),
        "strides": None,
        "version": 3,
        "stream": 0xABC,
    }
    assert t.__dlpack_device__() == (2, 0)
    capsule = t.__dlpack__()
    assert type(capsule).__name__ == "PyCapsule"
    bf: ct.Tensor[Any, Any] = ct.Tensor(backend.alloc(8), (4,), ct.bf16, backend)
    assert not hasattr(bf, "__cuda_array_interface__")


# --- on a real GPU -----------------------------------------------------------------------


@pytest.mark.gpu
def test_torch_interop_on_the_gpu(backend: str) -> None:
    if backend != "sim":
        pytest.skip("runs once, on cuda")
    torch = pytest.importorskip("torch")
    ct.set_backend("cuda")
    a = torch.randn(N, device="cuda")
    b = torch.randn(N, device="cuda")
    out = torch.zeros(N, device="cuda")
    stream = torch.cuda.Stream()
    K.add(ct.from_dlpack(out).partition(TILE), ct.from_dlpack(a), ct.from_dlpack(b)).sync_on(stream)
    torch.testing.assert_close(out, a + b)
    z = ct.from_numpy(np.arange(N, dtype=np.float32))
    torch.testing.assert_close(torch.from_dlpack(z).cpu(), torch.arange(N, dtype=torch.float32))
    # The export, re-imported, is the same memory: a launch writing z holds it too.
    view = ct.from_dlpack(torch.from_dlpack(z))
    op = K.add(z.partition(TILE), ct.from_dlpack(a), ct.from_dlpack(b))
    with pytest.raises(ct.BorrowError, match="also viewed"):
        view.to_numpy()
    op.sync()
    torch.testing.assert_close(torch.from_dlpack(view), a + b)


@pytest.mark.gpu
def test_cupy_interop_on_the_gpu(backend: str) -> None:
    if backend != "sim":
        pytest.skip("runs once, on cuda")
    cp = pytest.importorskip("cupy")
    ct.set_backend("cuda")
    a = cp.random.standard_normal(N, dtype=cp.float32)
    out = cp.zeros(N, dtype=cp.float32)
    K.add(ct.from_dlpack(out).partition(TILE), ct.from_dlpack(a), ct.from_dlpack(a)).sync()
    cp.testing.assert_allclose(out, 2 * a, rtol=1e-6)
    z = ct.from_numpy(np.arange(N, dtype=np.float32))
    cp.testing.assert_array_equal(cp.asarray(z), cp.arange(N, dtype=cp.float32))
    cp.testing.assert_array_equal(cp.from_dlpack(z), cp.arange(N, dtype=cp.float32))
