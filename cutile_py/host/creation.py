"""Making tensors: `empty`, `zeros`, `ones`, `full`, `arange`, `randn`, `from_numpy`, `from_dlpack`.

`zeros`, `ones` and `full` also make tiles when called inside a kernel, as in NumPy and cuTile
Python; their return type serves both uses (`TensorOrTile`).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np

from cutile_py.host.tensor import Tensor
from cutile_py.ir.dtypes import DType, bf16, f32, from_numpy_dtype, i32, is_dtype, to_storage
from cutile_py.language.block import CURRENT_BLOCK, resolve_dtype
from cutile_py.language.functions import builtin, tile_full
from cutile_py.language.tile import Tile
from cutile_py.runtime.select import active_backend

if TYPE_CHECKING:
    from typing_extensions import Unpack

    class TensorOrTile(Tensor[Any, Unpack[tuple[Any, ...]]], Tile):
        """For mypy only: host code gets a Tensor, kernel code a Tile."""

        def reshape(self, *shape: Any) -> Any: ...
else:
    TensorOrTile = Any

AnyTensor = Tensor[Any, Any]


def _shape(shape: Sequence[int] | int) -> tuple[int, ...]:
    if type(shape) is tuple:  # the common case, checked without a generator
        for d in shape:
            if type(d) is not int or d < 0:
                break
        else:
            return shape
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0:
            raise ValueError(f"shape must be non-negative integers, got {shape!r}")
    return tuple(int(d) for d in dims)


def _dtype(dtype: Any) -> type[DType]:
    if not is_dtype(dtype):
        raise TypeError(
            f"dtype must be a cutile_py dtype (ct.f32, ct.f16, ct.bf16, ct.i32, ct.i64, "
            f"ct.bool_), got {dtype!r}"
        )
    return dtype


def _upload(values: np.ndarray, dtype: type[DType]) -> AnyTensor:
    """A new tensor on the active backend holding `values` (compute form) rounded to `dtype`."""
    backend = active_backend()
    storage = np.ascontiguousarray(to_storage(values, dtype))
    buf = backend.alloc(max(storage.nbytes, 1))
    if storage.nbytes:
        backend.upload(buf, storage)
    return Tensor(buf, tuple(values.shape), dtype, backend)


def empty(shape: Sequence[int] | int, dtype: Any = f32) -> AnyTensor:
    """A tensor whose contents are undefined until written (no fill: for outputs a kernel
    writes whole). On the CPU backends every byte is 0xFF (NaN for floats, -1 for integers),
    so that an element a kernel leaves unwritten shows in a test."""
    t = _allocate(shape, _dtype(dtype))
    if t._nbytes and t._backend.executes_on_host:
        t._backend.fill(t._buffer, t._nbytes, b"\xff")
    return t


def _allocate(shape: Sequence[int] | int, dt: type[DType]) -> AnyTensor:
    dims = _shape(shape)
    backend = active_backend()
    buf = backend.alloc(max(prod(dims) * dt.itemsize(), 1))
    return Tensor(buf, dims, dt, backend)


@builtin("full")
def full(shape: Sequence[int] | int, value: Any, dtype: Any = f32) -> TensorOrTile:
    """A tensor (or, inside a kernel, a tile) of `shape` filled with `value`."""
    if CURRENT_BLOCK.get() is not None:
        return tile_full(shape, value, _dtype(resolve_dtype(dtype)))  # type: ignore[return-value]
    dt = _dtype(dtype)
    one = np.full((), value, dtype=np.float64 if dt.is_float() else dt.compute)
    element = np.ascontiguousarray(to_storage(one, dt)).tobytes()  # one element's bits
    t = _allocate(shape, dt)
    if t.nbytes:
        t.backend.fill(t.buffer, t.nbytes, element)  # on the device, not uploaded
    return t  # type: ignore[return-value]


@builtin("zeros")
def zeros(shape: Sequence[int] | int, dtype: Any = f32) -> TensorOrTile:
    """A tensor (or, inside a kernel, a tile) of zeros."""
    return full(shape, 0, dtype)


@builtin("ones")
def ones(shape: Sequence[int] | int, dtype: Any = f32) -> TensorOrTile:
    """A tensor (or, inside a kernel, a tile) of ones."""
    return full(shape, 1, dtype)


@builtin("arange")
def arange(n: int, dtype: Any = i32) -> TensorOrTile:
    """`[0, 1, ..., n-1]` as a 1-D tensor (or, inside a kernel, a tile; n a tile dim)."""
    if CURRENT_BLOCK.get() is not None:
        return tile_full(  # type: ignore[return-value]
            (int(n),), Tile(np.arange(int(n), dtype=np.int32), i32), _dtype(resolve_dtype(dtype))
        )
    return _upload(np.arange(int(n)), _dtype(dtype))  # type: ignore[return-value]


def randn(shape: Sequence[int] | int, dtype: Any = f32, seed: int = 0) -> AnyTensor:
    """Standard-normal values from NumPy's PCG64 generator with `seed`, rounded to `dtype`."""
    dt = _dtype(dtype)
    if not dt.is_float():
        raise TypeError(f"randn makes floating-point tensors, not {dt.name}")
    values = np.random.default_rng(seed).standard_normal(_shape(shape))
    return _upload(values, dt)


def from_numpy(array: np.ndarray, dtype: Any = None) -> AnyTensor:
    """A copy of `array` on the active backend. Give `dtype` to convert (needed for bf16 and
    for float64 input, which cutile_py does not support: it is rounded only when asked)."""
    arr = np.asarray(array)
    if dtype is None:
        if arr.dtype == np.float64:
            raise TypeError(
                "float64 arrays are not supported; pass dtype=ct.f32 to convert, or "
                "convert with array.astype(np.float32)"
            )
        dt = from_numpy_dtype(arr.dtype)
    else:
        dt = _dtype(dtype)
    if dt is bf16 and arr.dtype == np.uint16:
        raise TypeError("a uint16 array is ambiguous for bf16; pass float values")
    return _upload(arr, dt)


def from_dlpack(obj: Any) -> AnyTensor:
    """Borrow `obj`'s memory zero-copy; it is never freed by us (`obj` is kept alive).

    On the CPU backends `obj` is host memory (NumPy, or anything `np.from_dlpack` takes); on
    cuda it is device memory (PyTorch, CuPy, ... through DLPack or the CUDA Array Interface).
    """
    backend = active_backend()
    if isinstance(obj, Tensor):
        # A second Tensor over the same memory would escape the ownership checks.
        raise TypeError(
            "ct.from_dlpack() of a cutile_py Tensor would alias it; use the tensor "
            "itself (or ct.from_numpy(t.to_numpy()) for a copy)"
        )
    if backend.name == "cuda":
        from cutile_py.runtime.cuda_backend import CudaBackend

        assert isinstance(backend, CudaBackend)
        device_buf, shape, np_dtype = backend.borrow_foreign(obj)
        return Tensor(device_buf, shape, _foreign_dtype(np_dtype), backend, borrowed_from=obj)
    try:
        arr = np.from_dlpack(obj)
    except (AttributeError, BufferError, TypeError, RuntimeError) as e:
        raise TypeError(
            f"ct.from_dlpack: cannot borrow a {type(obj).__name__} on the {backend.name} "
            f"backend, which needs host memory: {e}"
        ) from e
    if not arr.flags.c_contiguous:
        raise ValueError(
            "ct.from_dlpack needs a C-contiguous array; pass np.ascontiguousarray(a) (a copy)"
        )
    if not arr.flags.writeable:
        raise ValueError("ct.from_dlpack needs writable memory; the array is read-only")
    buf = backend.borrow_host(arr)
    return Tensor(buf, tuple(arr.shape), _foreign_dtype(arr.dtype), backend, borrowed_from=obj)


def _foreign_dtype(dt: np.dtype[Any]) -> type[DType]:
    if dt.name == "bfloat16":  # ml_dtypes' bf16, as PyTorch exports it through NumPy-like views
        return bf16
    try:
        return from_numpy_dtype(dt)
    except (TypeError, ValueError, KeyError) as e:
        raise TypeError(
            f"ct.from_dlpack: arrays of {dt} have no cutile_py dtype "
            "(f32, f16, bf16, i32, i64, bool)"
        ) from e
