"""Launch plans: what launching a kernel on arguments like these needs, computed once (the
specialization, the compiled kernel, the grid, the backend's prepared launch, how to read the
`.param` values off the arguments, which arguments need which ownership check)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from cutile_py.host.interpret_run import run_interpreted
from cutile_py.host.tensor import Partition, Tensor
from cutile_py.lower.pipeline import LoweredKernel
from cutile_py.runtime.backend import (
    Backend,
    BoundLaunch,
    Completion,
    HostKernel,
    LoadedKernel,
    PreparedLaunch,
    Touch,
)

if TYPE_CHECKING:
    from cutile_py.frontend.signature import Specialization
    from cutile_py.host.kernel import CompiledKernel

_PTR, _DIM, _INT, _FLOAT, _MAP = range(5)
#: Bytes per element of the `CUtensorMapDataType`s a lowering uses (f16, f32, bf16).
_MAP_ELEMENT_BYTES = {6: 2, 7: 4, 9: 2}


class ParamReader:
    """Reads a launch's `.param` values off its arguments, in the order the PTX declares them
    (a plan made once per compiled kernel: one pass over the arguments per launch)."""

    def __init__(self, lowered: LoweredKernel) -> None:
        steps = []
        for p in lowered.params:
            kind = {"ptr": _PTR, "dim": _DIM, "tmap": _MAP}.get(p.what)
            if kind is None:
                kind = _INT if p.ptype in ("s32", "u32", "s64") else _FLOAT
            steps.append((p.arg, kind, p.axis))
        self.steps = tuple(steps)
        self._pointers = tuple(dict.fromkeys(p.arg for p in lowered.params if p.what == "ptr"))
        self.ptypes = tuple(p.ptype for p in lowered.params)
        #: The tensor-map parameters, by their number (`PtxParam.axis`).
        self.maps = {p.axis: p for p in lowered.params if p.what == "tmap"}

    def __call__(
        self, args: Sequence[Any], backend: Backend | None = None
    ) -> list[int | float | bytes]:
        """The values; `backend` makes the tensor maps (a kernel with TMA pipelines)."""
        out: list[int | float | bytes] = []
        for arg, kind, axis in self.steps:
            a = args[arg]
            if kind == _PTR:
                out.append((a._tensor if type(a) is Partition else a)._address)
            elif kind == _DIM:
                out.append((a._tensor if type(a) is Partition else a)._shape[axis])
            elif kind == _MAP:
                assert backend is not None, "a tensor map needs the backend that makes it"
                t = a._tensor if type(a) is Partition else a
                out.append(self.tensor_map(backend, axis, t._address, t._shape))
            else:
                out.append(int(a) if kind == _INT else float(a))
        return out

    def tensor_map(
        self, backend: Backend, number: int, address: int, shape: tuple[int, ...]
    ) -> bytes:
        """Tensor map `number` of the kernel over a contiguous row-major tensor of `shape`
        at `address` (`Backend.tensor_map`: dims innermost first, byte strides of the outer
        dims, the box and swizzle the lowering chose)."""
        p = self.maps[number]
        eb = _MAP_ELEMENT_BYTES[p.map_dtype]
        dims = tuple(reversed(shape))
        strides, stride = [], eb
        for d in dims[:-1]:
            stride *= d
            strides.append(stride)
        return backend.tensor_map(p.map_dtype, address, dims, tuple(strides), p.box, p.swizzle)

    def touches(self, args: Sequence[Any], atomic: frozenset[int] = frozenset()) -> list[Touch]:
        """The memory a launch reads and writes: each tensor argument's bytes, written where
        it is passed as a (Mut) partition or to an Atomic parameter (indices `atomic`), only
        read where it is passed as a shared Tensor."""
        out: list[Touch] = []
        for arg in self._pointers:
            a = args[arg]
            if type(a) is Partition:
                t = a._tensor
                out.append((t._address, t._nbytes, True))
            else:
                out.append((a._address, a._nbytes, arg in atomic))
        return out


class LaunchPlan:
    """A kernel's launch on `backend` for arguments like the ones it was made for (the same
    dtypes, shapes, tiles, alignment, scalar types and constants; see `launch_key`).

    Made once; a launch then reads the parameters off its arguments (`read`) and makes one
    call into the backend's prepared launch (`launch`, made by `prepare`), whatever launches
    it: sync (`DeviceOp._sync_now`), await, `.then` and `ct.zip` (`start`), or a graph
    capture (`bind`)."""

    __slots__ = (
        "_fn",
        "_shapes",
        "atomic",
        "backend",
        "compiled",
        "deps",
        "empty",
        "generation",
        "grid",
        "launch",
        "pairs",
        "read",
        "spec",
        "tensors",
        "touches",
    )

    def __init__(
        self,
        deps: tuple[tuple[tuple[str, ...], Hashable], ...],
        generation: int,
        spec: Specialization,
        compiled: CompiledKernel,
        grid: tuple[int, ...],
        backend: Backend,
        args: Sequence[Any],
        fn: Any,
        atomic: frozenset[int] = frozenset(),
    ) -> None:
        self.deps = deps
        self.generation = generation
        self.spec = spec
        self.compiled = compiled
        self.grid = grid
        self.backend = backend
        #: A launch over an empty partition: no blocks, nothing to run (API.md rule 6).
        self.empty = 0 in grid
        #: (position, whether it is a Mut partition) of each tensor argument: what a launch
        #: holds, and checks for moves, holds and the backend.
        self.tensors = tuple(
            (i, type(a) is Partition) for i, a in enumerate(args) if type(a) in (Partition, Tensor)
        )
        #: Positions of the tensors passed to Atomic parameters: held exclusively, written.
        self.atomic = atomic
        #: The pairs of tensor arguments whose memory must not overlap (one of them is Mut or
        #: Atomic).
        self.pairs = tuple(
            (i, mi, j, mj)
            for k, (i, mi) in enumerate(self.tensors)
            for j, mj in self.tensors[k + 1 :]
            if mi or mj or i in atomic or j in atomic
        )
        #: The backend's prepared launch, the reader of its parameter values (None: they are
        #: the arguments, for the interpreter) and of the memory it touches: set by `prepare`.
        self.launch: PreparedLaunch | None = None
        self.read: _Values | None = None
        self.touches: Callable[[Sequence[Any]], list[Touch]] | None = None
        # Each tensor argument's shape (part of the plan's key, so fixed): dims are constants.
        self._shapes = {i: (mut, args[i]._storage()._shape) for i, mut in self.tensors}
        self._fn = fn  # the kernel's Python (the interpreter runs it)

    def prepare(self) -> PreparedLaunch:
        """The backend's launch of this kernel over this grid, made on first use (loading the
        module, which may recompile PTX from the disk cache that does not load)."""
        launch = self.launch
        if launch is not None:
            return launch
        compiled = self.compiled
        backend = self.backend
        g = (*self.grid, 1, 1, 1)[:3]
        grid = (g[0], g[1], g[2])
        if compiled.lowered is not None and backend.runs_ptx:
            launch = compiled.prepared(backend, self.grid)
            reader = compiled.param_reader()  # after any recompile
            self.read = _Values(reader, self._shapes, backend)
            self.touches = partial(reader.touches, atomic=self.atomic)
        else:
            # The interpreter walks the partitions' own grid (of their rank), not the padded one.
            fn, spec, tiles = self._fn, self.spec, self.grid
            kernel = HostKernel(
                compiled.name, lambda _, args: run_interpreted(fn, spec, tiles, tuple(args))
            )
            launch = backend.prepare(kernel, grid, (1, 1, 1), 0, ())
        self.launch = launch
        return launch

    def start(self, args: tuple[Any, ...], stream: object | None, wait: bool = False) -> Completion:
        """Launch on `stream` (None: the backend's own); `wait`: and wait, with a fault kept
        in the finished completion (see `PreparedLaunch.start`)."""
        launch = self.launch or self.prepare()
        read, touches = self.read, self.touches
        if read is None or touches is None:  # the kernel's Python runs: its arguments
            return launch.start(args, stream, None, wait)
        if not wait:
            return launch.launch(read(args), stream, touches(args))
        return launch.start(read(args), stream, touches(args), wait)

    def bind(self, args: tuple[Any, ...]) -> BoundLaunch:
        """This launch with its parameters read, for a graph to capture."""
        launch = self.launch or self.prepare()
        read = self.read
        return BoundLaunch(launch, tuple(args) if read is None else tuple(read(args)))


class _Values:
    """A `ParamReader` for one launch plan: the dims are the plan's (shapes are part of its
    key), so only pointers and scalars are read, each by one C-level getter."""

    __slots__ = ("template", "vary")

    def __init__(
        self,
        reader: ParamReader,
        shapes: dict[int, tuple[bool, tuple[int, ...]]],
        backend: Backend | None = None,
    ) -> None:
        template: list[int | float | bytes] = []
        vary: list[tuple[int, int, Callable[[Any], int | float | bytes]]] = []
        for slot, (arg, kind, axis) in enumerate(reader.steps):
            if kind == _DIM:
                template.append(shapes[arg][1][axis])
                continue
            template.append(0)
            if kind == _PTR:
                vary.append((slot, arg, _PARTITION_ADDRESS if shapes[arg][0] else _ADDRESS))
            elif kind == _MAP:
                assert backend is not None
                made = _Maps(reader, backend, axis, shapes[arg][1], shapes[arg][0])
                vary.append((slot, arg, made))
            else:
                vary.append((slot, arg, int if kind == _INT else float))
        self.template = template
        self.vary = tuple(vary)

    def __call__(self, args: Sequence[Any]) -> list[int | float | bytes]:
        values = self.template.copy()
        for slot, arg, get in self.vary:
            values[slot] = get(args[arg])
        return values


_ADDRESS = attrgetter("_address")
_PARTITION_ADDRESS = attrgetter("_tensor._address")


class _Maps:
    """One tensor-map parameter of a launch plan: the map of the tensor argument's address
    (its shape is the plan's), made by the backend once per address seen."""

    __slots__ = ("address", "backend", "made", "number", "reader", "shape")

    #: Addresses remembered (a plan launched over many tensors keeps only the latest ones).
    KEEP = 64

    def __init__(
        self,
        reader: ParamReader,
        backend: Backend,
        number: int,
        shape: tuple[int, ...],
        partition: bool,
    ) -> None:
        self.reader, self.backend, self.number, self.shape = reader, backend, number, shape
        self.address = _PARTITION_ADDRESS if partition else _ADDRESS
        self.made: dict[int, bytes] = {}

    def __call__(self, arg: Any) -> bytes:
        address = self.address(arg)
        raw = self.made.get(address)
        if raw is None:
            if len(self.made) >= self.KEEP:
                self.made.clear()
            raw = self.reader.tensor_map(self.backend, self.number, address, self.shape)
            self.made[address] = raw
        return raw


def launch_key(args: tuple[Any, ...], constants: frozenset[int]) -> tuple[Any, ...]:
    """What of `args` a launch plan depends on: each tensor's dtype, shape, tiles and address
    alignment; each scalar's type; each constant's value (a float by its bits)."""
    key: list[Any] = []
    for i, a in enumerate(args):
        cls = type(a)
        if cls is Partition or cls is Tensor:
            key.append(a._key)
        elif i in constants:
            key.append((cls, struct.pack("<d", a) if isinstance(a, float) else a))
        else:
            key.append(cls)
    return tuple(key)


def prepare_lowered(
    backend: Backend, kernel: LoadedKernel, lowered: LoweredKernel, grid: tuple[int, ...]
) -> PreparedLaunch:
    """`kernel` (the loaded `lowered`) ready to launch on `backend` over `grid`: one block of
    `lowered.block_threads` threads per tile, with the dynamic shared memory it declares."""
    g = (*grid, 1, 1, 1)[:3]
    return backend.prepare(
        kernel,
        (g[0], g[1], g[2]),
        (lowered.block_threads, 1, 1),
        lowered.dynamic_shared,
        tuple(p.ptype for p in lowered.params),
    )
