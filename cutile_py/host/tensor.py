"""`Tensor` and `Partition`: device memory with an ownership state checked on every use."""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from math import prod
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from typing_extensions import TypeVarTuple, Unpack

from cutile_py.host.errors import BorrowError, MovedError
from cutile_py.ir.dtypes import DType, to_host
from cutile_py.runtime import dlpack
from cutile_py.runtime.backend import Backend, Buffer, HostBuffer

DT = TypeVar("DT")
Shape = TypeVarTuple("Shape")


def caller_location(depth: int = 2) -> str:
    """`file:line` of the user code `depth` frames up (where a tensor was moved)."""
    frame = sys._getframe(depth)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


#: The package directory: frames under it are cutile_py's own, not the user's.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_location() -> str:
    """`file:line` of the innermost caller outside cutile_py (where the user made an op)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(PACKAGE_DIR):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class Holder(Protocol):
    """What may hold tensors: a pending op, a graph."""

    def holding(self) -> str:
        """Who holds, and what to do about it (for BorrowError messages)."""
        ...


@dataclass
class Capture:
    """A `ct.graph` capture in progress: the memory its recorded launches use. A chain's
    functions run once, during capture, before any data exists, so they may not read it."""

    name: str | None
    kernels: list[str] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)

    def describe(self) -> str:
        if self.name is not None:
            return f"graph {self.name!r}"
        return f"graph of {', '.join(dict.fromkeys(self.kernels))}"

    def record(self, kernel: str, args: Sequence[object]) -> None:
        """Note a launch the capture recorded (its tensors' memory is the graph's from now)."""
        self.kernels.append(kernel)
        for a in args:
            t = a.tensor if isinstance(a, Partition) else a
            if isinstance(t, Tensor):
                self.spans.append((t.buffer.address, t.buffer.address + t.nbytes))


#: The capture running on this thread or task, if any (set by `ct.graph`).
capturing: ContextVar[Capture | None] = ContextVar("cutile_py_capture", default=None)


@dataclass
class _SpanHold:
    """A hold on memory other objects may also view (see `escaped`)."""

    lo: int
    hi: int
    exclusive: bool
    holder: weakref.ref[Holder]
    obj: weakref.ref[Owned]


#: Holds on escaped memory, by span: ownership there belongs to the memory, not the object.
_span_holds: list[_SpanHold] = []
#: The same list, for the launch plans' generated release (it is only changed in place).
span_holds = _span_holds


def take_hold(holder: Holder, obj: Owned, exclusive: bool) -> tuple[Owned, bool]:
    """Make `holder` hold `obj` (exclusively: a `Mut` partition, a graph's written memory);
    returns the entry for `release_holds`."""
    return take_holds(holder, [(obj, exclusive)])[0]


def take_holds(holder: Holder, wanted: list[tuple[Owned, bool]]) -> list[tuple[Owned, bool]]:
    """`take_hold` of each (object, exclusive) in `wanted`, which is returned."""
    me: weakref.ref[Holder] = weakref.ref(holder)
    for obj, exclusive in wanted:
        if exclusive:
            obj._exclusive = me
        else:
            obj._shared.append(me)
        # obj._storage(), inline (a launch's hot path)
        t: Tensor[Any] = obj._tensor if type(obj) is Partition else obj  # type: ignore[assignment]
        if t._escaped and t._nbytes:
            lo = t._address
            _span_holds.append(_SpanHold(lo, lo + t._nbytes, exclusive, me, weakref.ref(obj)))
    return wanted


def release_holds(holder: Holder, held: Sequence[tuple[Owned, bool]]) -> None:
    """End `holder`'s holds on `held` (what `take_hold` returned)."""
    for obj, exclusive in held:
        if exclusive:
            obj._exclusive = None
        else:
            shared = obj._shared
            if len(shared) == 1 and shared[0]() is holder:
                # The common case, without a pass; in place (not `= []`): a hold another
                # thread appends meanwhile stays.
                del shared[0]
            else:
                drop_shared(obj, holder)
    if _span_holds:  # (none at all, the common case: no pass over `held` for them)
        release_spans(holder, held)


def drop_shared(obj: Owned, holder: Holder) -> None:
    """End `holder`'s shared hold on `obj`, which others hold too. Holds mostly end in the
    order they were taken (a zip's ops, pending reads), so the oldest and the newest entry
    are tried first, in place: n holders letting go of one tensor cost O(n) in all, where
    rebuilding the list each time cost O(n²) (a 1,000-op zip reading one tensor). The list
    is changed in place, never replaced: another thread's launch may append to it meanwhile
    (concurrent releases of one tensor by several threads are not made atomic)."""
    shared = obj._shared
    if not shared:
        # Dropped already: the cycle collector clears every weak reference to the ops it
        # frees before their finalizers run, so the first one to release cleared them all.
        return
    last = len(shared) - 1  # (a hold appended meanwhile goes after it: the index stays)
    if shared[0]() is holder:
        del shared[0]
    elif shared[last]() is holder:
        del shared[last]
    else:  # (anywhere else: one pass, dropping the holds of holders gone meanwhile too)
        # Each removed in place: a rebuilt list would lose the holds that other threads'
        # launches append to this one meanwhile.
        for r in [r for r in shared if r() is holder or r() is None]:
            # (A dead one may have gone meanwhile, removed by another thread's pass.)
            with contextlib.suppress(ValueError):
                shared.remove(r)


def release_spans(holder: Holder, held: Sequence[tuple[Owned, bool]]) -> None:
    """End `holder`'s holds on the escaped memory of `held` (`release_holds`' second half,
    needed only while any such hold exists)."""
    for obj, _ in held:
        t: Tensor[Any] = obj._tensor if type(obj) is Partition else obj  # type: ignore[assignment]
        if t._escaped:
            _span_holds[:] = [h for h in _span_holds if _outlives(h, holder, obj)]


def _outlives(h: _SpanHold, holder: Holder, obj: Owned) -> bool:
    """Whether `h` stays when `holder` lets go of `obj` (holds of dropped holders go too)."""
    other = h.holder()
    return other is not None and not (other is holder and h.obj() is obj)


def alias_holder(obj: Owned, exclusive: bool, ignore: object = None) -> Holder | None:
    """Who holds, through another object, memory that `obj` views: any holder if the use is
    exclusive (a `Mut` launch, or the host touching it), else an exclusive one. None for
    memory that never escaped (only cutile_py's own objects view it, one at a time)."""
    t = obj._storage()
    if not t._escaped or not _span_holds or not t.nbytes:
        return None
    lo = t._buffer.address
    hi = lo + t.nbytes
    for h in _span_holds:
        holder = h.holder()
        other = h.obj()
        if holder is None or other is None or other is obj or holder is ignore:
            continue
        if (exclusive or h.exclusive) and h.lo < hi and lo < h.hi:
            return holder
    return None


class Owned:
    """Ownership state shared by tensors and partitions.

    A value is usable, or moved (consumed by partition/unpartition), or held by pending ops:
    exclusively by one, or shared by any number.
    """

    _kind = "tensor"

    def __init__(self) -> None:
        #: Where it was moved (file, line), if it was.
        self._moved_at: tuple[str, int] | None = None
        self._moved_by = ""
        # Weak, so that dropping a pending op runs its finalizer, which releases these holds.
        self._exclusive: weakref.ref[Holder] | None = None
        self._shared: list[weakref.ref[Holder]] = []

    def _holder(self) -> Holder | None:
        """The pending op or graph holding this value, if any."""
        if self._exclusive is not None:
            return self._exclusive()
        for ref in self._shared:
            op = ref()
            if op is not None:
                return op
        return None

    @property
    def held_exclusively(self) -> bool:
        return self._exclusive is not None and self._exclusive() is not None

    def _check_usable(self, action: str) -> None:
        """Raise unless the host may touch this value now."""
        if self._moved_at is not None:
            file, line = self._moved_at
            raise MovedError(
                f"cannot {action}: this {self._kind} was moved by {self._moved_by} at {file}:{line}"
            )
        if self._exclusive is None and not self._shared:
            return  # held by nobody: the common case, without a call
        holder = self._holder()
        if holder is not None:
            raise BorrowError(f"cannot {action}: this {self._kind} is held by {holder.holding()}")

    def _storage(self) -> Tensor[Any, Unpack[tuple[Any, ...]]]:
        """The tensor whose memory this value views."""
        raise NotImplementedError

    def _check_aliases(self, action: str, exclusive: bool) -> None:
        """Raise if another object over this value's memory (a second `ct.from_dlpack` of one
        array, or a re-import of an exported tensor) is held against this use."""
        holder = alias_holder(self, exclusive)
        if holder is not None:
            raise BorrowError(
                f"cannot {action}: its memory is also viewed by another tensor (a second "
                f"ct.from_dlpack of the same array, or an exported tensor), held by "
                f"{holder.holding()}"
            )

    def _move(self, by: str) -> None:
        if self._moved_at is not None or self._exclusive is not None or self._shared:
            self._check_usable(f"call {by}")  # (the message is built only where it may raise)
        frame = sys._getframe(2)  # (`caller_location(3)`, kept unformatted until a message)
        self._moved_at = (frame.f_code.co_filename, frame.f_lineno)
        self._moved_by = by

    @property
    def is_moved(self) -> bool:
        return self._moved_at is not None


class Tensor(Owned, Generic[DT, Unpack[Shape]]):
    """A dense, row-major array in a backend's memory.

    As an annotation, `Tensor[dtype, d0, ...]` is a kernel's shared, read-only tensor parameter.
    """

    __cutile_tensor__ = True

    def __init__(
        self,
        buffer: Buffer,
        shape: tuple[int, ...],
        dtype: type[DType],
        backend: Backend,
        *,
        borrowed_from: object = None,
        escaped: bool = False,
    ) -> None:
        super().__init__()
        self._buffer = buffer
        self._shape = shape
        self._dtype = dtype
        self._backend = backend
        self._borrowed_from = borrowed_from  # keeps foreign memory alive; never freed by us
        size = dtype.itemsize()
        self._nbytes = prod(shape) * size
        #: The first element's address, and the elements (a power of two <= 16) it is aligned
        #: to: read on every launch, so kept rather than recomputed.
        self._address = address = buffer.address
        elements = address // size
        self._align = 1 if address % size else min(elements & -elements, 16) if elements else 16
        #: What a launch plan depends on (see `cutile_py.host.launch.launch_keyer`).
        self._key = (dtype, shape, None, self._align)
        #: Whether objects outside this one's line (partition/unpartition) may view the memory:
        #: borrowed with from_dlpack, or exported. Holds on it are then also kept by span.
        self._escaped = escaped or borrowed_from is not None

    def _storage(self) -> Tensor[Any, Unpack[tuple[Any, ...]]]:
        return self

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> type[DType]:
        return self._dtype

    @property
    def size(self) -> int:
        return prod(self._shape)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def device(self) -> str:
        """The backend holding the memory: 'cuda', 'sim' or 'interpret'."""
        return self._backend.name

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def buffer(self) -> Buffer:
        return self._buffer

    def to_numpy(self) -> np.ndarray:
        """A host copy in the tensor's own NumPy dtype (f16 as float16); bf16, which NumPy lacks,
        reads as float32 (exactly)."""
        self._check_host_access("read the tensor")
        raw = self._backend.download(self._buffer, self.nbytes)
        return to_host(raw.view(self._dtype.storage), self._dtype).reshape(self._shape)

    def _check_host_access(self, action: str) -> None:
        """Like `_check_usable` (also through aliases of the memory), and no host access to
        memory a graph being captured uses."""
        self._check_usable(action)
        self._check_aliases(action, exclusive=True)
        capture = capturing.get()
        if capture is None or self.nbytes == 0:
            return
        lo = self._buffer.address
        hi = lo + self.nbytes
        if any(lo < h and l < hi for l, h in capture.spans):
            raise BorrowError(
                f"cannot {action}: this tensor is held by the {capture.describe()} being "
                "captured. A chain's functions run once, at capture, before any launch has "
                "run: they may only build the next op. Read the tensor with the graph's "
                ".read() after a replay."
            )

    def partition(self, tile_shape: Sequence[int] | int) -> Partition:
        """Split into disjoint tiles of `tile_shape` for a `Mut` parameter; consumes this tensor."""
        tiles = (tile_shape,) if isinstance(tile_shape, int) else tuple(tile_shape)
        if len(tiles) != len(self._shape):
            raise ValueError(
                f"tile_shape {tiles} has rank {len(tiles)}; the tensor has shape {self._shape}"
            )
        for d in tiles:
            if type(d) is not int or d <= 0:  # (else the common case: plain ints, one pass)
                for e in tiles:
                    if not isinstance(e, (int, np.integer)) or isinstance(e, bool) or e <= 0:
                        raise ValueError(f"tile_shape dims must be positive integers, got {tiles}")
                tiles = tuple(int(e) for e in tiles)
                break
        self._move(".partition()")
        return Partition(self, tiles)

    def reshape(self, *shape: int | Sequence[int]) -> Tensor[Any, Unpack[tuple[Any, ...]]]:
        """The same memory with another shape (row-major, as NumPy's reshape of a contiguous
        array; one dim may be -1); consumes this tensor, like `partition`."""
        dims = _reshaped(self._shape, shape)
        self._move(".reshape()")
        return Tensor(
            self._buffer,
            dims,
            self._dtype,
            self._backend,
            borrowed_from=self._borrowed_from,
            escaped=self._escaped,
        )

    def __repr__(self) -> str:
        state = " (moved)" if self._moved_at else ""
        return f"Tensor(shape={self._shape}, dtype={self._dtype.name}, device={self.device}){state}"

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Any = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        """DLPack export, zero-copy: the consumer aliases this tensor's memory.

        Like `ct.RawKernel`, this leaves the checked model: cutile_py cannot see what the
        consumer does with the memory. The memory stays alive while the consumer holds it.
        """
        self._check_host_access("export the tensor")
        if copy:
            raise BufferError("cutile_py exports without copying; pass copy=None or False")
        device = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError(f"the tensor is on DLPack device {device}, not {tuple(dl_device)}")
        self._escaped = True
        storage = self._dtype.storage
        code = dlpack.dtype_code(storage.kind, 8 * storage.itemsize, self._dtype.name == "bf16")
        self._backend.stream_synchronize(None)  # pending uploads land before the consumer reads
        return dlpack.export(self._buffer.address, self._shape, code, device, self._buffer)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(kDLCPU, 0) on the CPU backends, (kDLCUDA, ordinal) on cuda."""
        if isinstance(self._buffer, HostBuffer):
            return (dlpack.KDL_CPU, 0)
        return (dlpack.KDL_CUDA, int(getattr(self._backend, "ordinal", 0)))

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA Array Interface (v3) of a tensor on the cuda backend (zero-copy export)."""
        if isinstance(self._buffer, HostBuffer):
            raise AttributeError(
                f"__cuda_array_interface__: the tensor is in host memory ({self.device} "
                "backend); use __dlpack__ or to_numpy()"
            )
        if self._dtype.name == "bf16":
            raise AttributeError("__cuda_array_interface__ has no bf16 type; use __dlpack__")
        self._check_host_access("export the tensor")
        self._escaped = True
        return {
            "shape": self._shape,
            "typestr": self._dtype.storage.str,
            "data": (self._buffer.address, False),
            "strides": None,
            "version": 3,
            # Consumers order their reads after the backend stream (pending uploads).
            "stream": self._backend.stream_address(),
        }


class Partition(Owned):
    """A tensor split into a grid of disjoint tiles; each block of a launch writes one."""

    _kind = "partition"

    def __init__(
        self, tensor: Tensor[Any, Unpack[tuple[Any, ...]]], tile_shape: tuple[int, ...]
    ) -> None:
        super().__init__()
        self._tensor = tensor
        self._tile_shape = tile_shape
        self._grid = tuple(-(-n // t) for n, t in zip(tensor._shape, tile_shape))
        self._key = (tensor._dtype, tensor._shape, tile_shape, tensor._align)

    @property
    def tile_shape(self) -> tuple[int, ...]:
        return self._tile_shape

    @property
    def grid(self) -> tuple[int, ...]:
        """Tiles per dimension: `ceil(shape[i] / tile_shape[i])`."""
        return self._grid

    @property
    def shape(self) -> tuple[int, ...]:
        return self._tensor.shape

    @property
    def dtype(self) -> type[DType]:
        return self._tensor.dtype

    @property
    def tensor(self) -> Tensor[Any, Unpack[tuple[Any, ...]]]:
        """The partitioned storage (internal: the host uses it for launches)."""
        return self._tensor

    def _storage(self) -> Tensor[Any, Unpack[tuple[Any, ...]]]:
        return self._tensor

    def unpartition(self) -> Tensor[Any, Unpack[tuple[Any, ...]]]:
        """The whole tensor back; consumes this partition."""
        self._move(".unpartition()")
        t = self._tensor
        return Tensor(
            t._buffer,
            t._shape,
            t._dtype,
            t._backend,
            borrowed_from=t._borrowed_from,
            escaped=t._escaped,
        )

    def __repr__(self) -> str:
        state = " (moved)" if self._moved_at else ""
        return (
            f"Partition(shape={self.shape}, tile_shape={self._tile_shape}, grid={self._grid}, "
            f"dtype={self.dtype.name}){state}"
        )


def _reshaped(old: tuple[int, ...], shape: tuple[int | Sequence[int], ...]) -> tuple[int, ...]:
    """`reshape`'s new shape: `shape` as given (`t.reshape(2, 3)` or `t.reshape((2, 3))`), a
    -1 resolved; ValueError / TypeError saying what does not fit."""
    if not shape:
        raise TypeError("reshape: expected a shape, as t.reshape(2, 3) or t.reshape((2, 3))")
    one = shape[0]
    given = tuple(one) if len(shape) == 1 and not isinstance(one, (int, np.integer)) else shape
    dims: list[int] = []
    for d in given:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"reshape: dims must be integers, got {given!r}")
        if int(d) < -1:
            raise ValueError(f"reshape: dims must be non-negative (or one -1), got {given}")
        dims.append(int(d))
    size = prod(old)
    if dims.count(-1) > 1:
        raise ValueError(f"reshape: at most one dim may be -1, got {tuple(dims)}")
    if -1 in dims:
        known = prod(d for d in dims if d != -1)
        if known == 0 or size % known:
            raise ValueError(
                f"reshape: cannot reshape a tensor of shape {old} ({size} elements) into "
                f"{tuple(dims)}"
            )
        dims[dims.index(-1)] = size // known
    if prod(dims) != size:
        raise ValueError(
            f"reshape: cannot reshape a tensor of shape {old} ({size} elements) into "
            f"{tuple(dims)} ({prod(dims)} elements)"
        )
    return tuple(dims)
