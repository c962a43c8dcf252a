"""DLPack export (`Tensor.__dlpack__`) of any backend's memory: host or device alike.

The capsule carries an unversioned `DLManagedTensor` (DLPack 0.8 layout, which every consumer
reads). Its `manager_ctx` keeps the exporting buffer alive until the consumer calls the
deleter, or until the capsule is dropped unconsumed.
"""

from __future__ import annotations

import ctypes
from typing import Any

#: DLDeviceType values.
KDL_CPU = 1
KDL_CUDA = 2

#: DLDataTypeCode values by NumPy kind (bf16 is its own code).
_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}
KDL_BFLOAT = 4


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


_NAME = b"dltensor"
#: Exported tensors not yet given back: struct address -> (struct, shape array, owner).
_live: dict[int, tuple[Any, ...]] = {}


def _forget(address: int | None) -> None:
    if address is not None and _live is not None:  # None at interpreter shutdown
        _live.pop(address, None)


_deleter = _DELETER(_forget)


_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


def _on_capsule_freed(capsule: int | None) -> None:
    # A consumer renames the capsule when it takes the tensor (and then calls the deleter
    # itself); one still named "dltensor" was never consumed.
    if capsule is not None and _api.PyCapsule_IsValid(capsule, _NAME):
        _forget(_api.PyCapsule_GetPointer(capsule, _NAME))


_capsule_destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_on_capsule_freed)


def dtype_code(kind: str, bits: int, bfloat: bool = False) -> tuple[int, int]:
    """(DLDataTypeCode, bits) of a NumPy kind ('f', 'i', 'u', 'b') and width."""
    if bfloat:
        return KDL_BFLOAT, 16
    if kind not in _CODES:
        raise BufferError(f"DLPack cannot describe NumPy kind {kind!r}")
    return _CODES[kind], bits


def export(
    address: int,
    shape: tuple[int, ...],
    dtype: tuple[int, int],
    device: tuple[int, int],
    owner: object,
) -> object:
    """A "dltensor" capsule over C-contiguous memory at `address`; `owner` lives until the
    consumer lets go."""
    managed = _Managed()
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    t = managed.dl_tensor
    t.data = address
    t.device = _Device(*device)
    t.ndim = len(shape)
    t.dtype = _DataType(dtype[0], dtype[1], 1)
    t.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.POINTER(ctypes.c_int64)()  # NULL: compact row-major
    t.byte_offset = 0
    managed.deleter = _deleter
    key = ctypes.addressof(managed)
    _live[key] = (managed, dims, owner)
    capsule: object = _api.PyCapsule_New(
        key, _NAME, ctypes.cast(_capsule_destructor, ctypes.c_void_p)
    )
    return capsule
