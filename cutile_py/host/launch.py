"""Launch plans: what launching a kernel on arguments like these needs, computed once (the
specialization, the compiled kernel, the grid, the backend's prepared launch, how to read the
`.param` values off the arguments, which arguments need which ownership check)."""

from __future__ import annotations

import struct
import weakref
from collections.abc import Callable, Hashable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from cutile_py.host.interpret_run import run_interpreted
from cutile_py.host.tensor import Partition, Tensor, drop_shared, release_spans, span_holds
from cutile_py.lower.pipeline import LoweredKernel
from cutile_py.runtime.backend import (
    TENSOR_MAP_BYTES,
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

_PTR, _DIM, _INT, _FLOAT, _MAP, _GRID = range(6)
#: Bytes per element of the `CUtensorMapDataType`s a lowering uses (f16, f32, bf16).
_MAP_ELEMENT_BYTES = {6: 2, 7: 4, 9: 2}


class ParamReader:
    """Reads a launch's `.param` values off its arguments, in the order the PTX declares them
    (a plan made once per compiled kernel: one pass over the arguments per launch)."""

    def __init__(self, lowered: LoweredKernel) -> None:
        steps = []
        for p in lowered.params:
            kind = {"ptr": _PTR, "dim": _DIM, "tmap": _MAP, "grid": _GRID}.get(p.what)
            if kind is None:
                kind = _INT if p.ptype in ("s32", "u32", "s64") else _FLOAT
            steps.append((p.arg, kind, p.axis))
        self.steps = tuple(steps)
        #: The arguments whose addresses are passed (each once): the memory a launch touches.
        self.pointers = tuple(dict.fromkeys(p.arg for p in lowered.params if p.what == "ptr"))
        self.ptypes = tuple(p.ptype for p in lowered.params)
        #: The tensor-map parameters, by their number (`PtxParam.axis`).
        self.maps = {p.axis: p for p in lowered.params if p.what == "tmap"}

    def __call__(
        self,
        args: Sequence[Any],
        backend: Backend | None = None,
        grid: tuple[int, ...] | None = None,
    ) -> list[int | float | bytes]:
        """The values; `backend` makes the tensor maps (a kernel with TMA pipelines); `grid`:
        the tiles a persistent kernel's blocks walk (required there: no default grid is
        right for it)."""
        out: list[int | float | bytes] = []
        for arg, kind, axis in self.steps:
            if kind == _GRID:
                if grid is None:
                    raise ValueError(
                        "grid: a persistent kernel's parameters include the grid of tiles "
                        "its blocks walk; pass it"
                    )
                out.append((*grid, 1, 1, 1)[axis])
                continue
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
        if 0 in shape:
            # No element to copy, and the driver refuses a zero extent: the kernel issues its
            # TMA copies only for iterations of the loop over this tensor, so none reads it.
            return bytes(TENSOR_MAP_BYTES)
        eb = _MAP_ELEMENT_BYTES[p.map_dtype]
        dims = tuple(reversed(shape))
        strides, stride = [], eb
        for d in dims[:-1]:
            stride *= d
            strides.append(stride)
        return backend.tensor_map(p.map_dtype, address, dims, tuple(strides), p.box, p.swizzle)


class LaunchPlan:
    """A kernel's launch on `backend` for arguments like the ones it was made for (the same
    dtypes, shapes, tiles, alignment, scalar types and constants; see `launch_keyer`).

    Made once; a launch then reads the parameters off its arguments (`read`) and makes one
    call into the backend's prepared launch (`launch`, made by `prepare`), whatever launches
    it: sync (`DeviceOp._sync_now`), await, `.then` and `ct.zip` (`start`), or a graph
    capture (`bind`)."""

    __slots__ = (
        "_fn",
        "_shapes",
        "admit",
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
        "release",
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
        self.read: Callable[[Sequence[Any]], list[int | float | bytes]] | None = None
        self.touches: Callable[[Sequence[Any]], list[Touch]] | None = None
        # Each tensor argument's shape (part of the plan's key, so fixed): dims are constants.
        self._shapes = {i: (mut, args[i]._storage()._shape) for i, mut in self.tensors}
        self._fn = fn  # the kernel's Python (the interpreter runs it)
        #: The common case of a launch's checks and holds, unrolled for these arguments (see
        #: `_admitter`): False where anything is unusual, and then nothing was changed.
        self.admit: Callable[[object, Sequence[Any], Backend], bool] = _admitter(
            len(args), self.tensors, atomic
        )
        #: `release(op, args)`: let go of what `admit` took (see `_releaser`).
        self.release: Callable[[object, Sequence[Any]], None] = _releaser(
            len(args), self.tensors, atomic, self.held
        )

    def held(self, args: Sequence[Any]) -> list[tuple[Any, bool]]:
        """What a launch of this plan on `args` that `admit` accepted holds, as
        `take_holds` lists it: each tensor argument, exclusively where Mut or Atomic."""
        atomic = self.atomic
        return [(args[i], mut or i in atomic) for i, mut in self.tensors]

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
            self.read, self.touches = _readers(reader, self._shapes, self.atomic, backend, grid)
        else:
            # The interpreter walks the partitions' own grid (of their rank), not the padded one.
            fn, spec, tiles = self._fn, self.spec, self.grid
            group = compiled.ir.group_m
            kernel = HostKernel(
                compiled.name,
                lambda _, args: run_interpreted(fn, spec, tiles, tuple(args), group),
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


def _readers(
    reader: ParamReader,
    shapes: dict[int, tuple[bool, tuple[int, ...]]],
    atomic: frozenset[int],
    backend: Backend,
    grid: tuple[int, int, int],
) -> tuple[
    Callable[[Sequence[Any]], list[int | float | bytes]], Callable[[Sequence[Any]], list[Touch]]
]:
    """`reader` and its `touches` for one launch plan, generated as one list display each: the
    dims are the plan's (shapes are part of its key), so only pointers and scalars are read,
    with no loop and no call per value but a scalar's conversion. `shapes`: (whether a Mut
    partition, shape) of each tensor argument. Tensor maps are made by `backend`, once per
    tensor address. A persistent kernel's `grid` parameters are the plan's grid."""
    items: list[str] = []
    maps: dict[str, _Maps] = {}
    for arg, kind, axis in reader.steps:
        if kind == _GRID:
            items.append(repr(grid[axis]))
        elif kind == _DIM:
            items.append(repr(shapes[arg][1][axis]))
        elif kind == _PTR:
            items.append(f"{_storage(arg, shapes)}._address")
        elif kind == _MAP:  # made by the backend, once per address
            name = f"map{len(maps)}"
            maps[name] = _Maps(reader, backend, axis, shapes[arg][1], shapes[arg][0])
            items.append(f"{name}(args[{arg}])")
        else:
            items.append(f"{'int' if kind == _INT else 'float'}(args[{arg}])")
    touched = []
    for arg in reader.pointers:
        t = _storage(arg, shapes)
        touched.append(f"({t}._address, {t}._nbytes, {shapes[arg][0] or arg in atomic})")
    source = (
        f"def read(args):\n    return [{', '.join(items)}]\n"
        f"def touches(args):\n    return [{', '.join(touched)}]"
    )
    scope: dict[str, Any] = dict(maps)
    exec(compile(source, "<cutile_py launch plan>", "exec"), scope)
    return scope["read"], scope["touches"]


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
        self.address = attrgetter("_tensor._address" if partition else "_address")
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


def _storage(arg: int, shapes: dict[int, tuple[bool, tuple[int, ...]]]) -> str:
    """The expression of argument `arg`'s tensor (a partition's, where it is one)."""
    return f"args[{arg}]._tensor" if shapes[arg][0] else f"args[{arg}]"


def _admitter(
    arity: int, tensors: tuple[tuple[int, bool], ...], atomic: frozenset[int]
) -> Callable[[object, Sequence[Any], Backend], bool]:
    """`admit(op, args, backend)`: if every tensor argument is usable (not moved, held by no
    one against this use, memory nobody else views, on `backend`), no exclusive one overlaps
    another and no shared tensor is passed twice, take `op`'s holds and return True (its
    `_held` is then None: the plan's `held(args)`, built only where asked; `release` lets go
    of them); else return False having changed nothing (`device_op.launch_op` then checks one
    by one, for the error naming the parameter, or for the uncommon cases that are allowed).

    Generated once per plan, as straight-line code: a launch's checks are then a handful of
    attribute reads per argument, with no loop and no call per argument."""
    exclusive = {i: mut or i in atomic for i, mut in tensors}
    lines = ["def admit(op, args, backend, ref=ref):", f"    {_unpack(arity)} = args"]
    fail: list[str] = []
    for i, mut in tensors:
        if mut:
            lines.append(f"    t{i} = a{i}._tensor")
        else:
            lines.append(f"    t{i} = a{i}")
        fail.append(f"a{i}._moved_at is not None or a{i}._exclusive is not None")
        if exclusive[i]:
            fail.append(f"a{i}._shared")  # shared holders forbid an exclusive use
        fail.append(f"t{i}._escaped or t{i}._backend is not backend")
    shared = [i for i, _ in tensors if not exclusive[i]]
    fail.extend(f"a{j} is a{i}" for k, i in enumerate(shared) for j in shared[k + 1 :])
    if fail:
        lines.append("    if (" + "\n        or ".join(fail) + "\n    ):\n        return False")
    for i, _ in tensors:
        lines.append(f"    l{i} = t{i}._address")
    for k, (i, _) in enumerate(tensors):
        for j, _ in tensors[k + 1 :]:
            if exclusive[i] or exclusive[j]:
                lines.append(
                    f"    if l{i} < l{j} + t{j}._nbytes and l{j} < l{i} + t{i}._nbytes:\n"
                    "        return False"
                )
    lines.append("    me = ref(op)")
    for i, _ in tensors:
        lines.append(
            f"    a{i}._exclusive = me" if exclusive[i] else f"    a{i}._shared.append(me)"
        )
    lines.append("    op._held = None")
    lines.append("    return True")
    scope: dict[str, Any] = {"ref": weakref.ref}
    exec(compile("\n".join(lines), "<cutile_py launch plan>", "exec"), scope)
    admit: Callable[[object, Sequence[Any], Backend], bool] = scope["admit"]
    return admit


def _releaser(
    arity: int,
    tensors: tuple[tuple[int, bool], ...],
    atomic: frozenset[int],
    held: Callable[[Sequence[Any]], list[tuple[Any, bool]]],
) -> Callable[[object, Sequence[Any]], None]:
    """`release(op, args)`: `release_holds(op, held(args))` for a launch `admit` accepted,
    as straight-line code (generated once per plan, as `_admitter` is): each Mut or Atomic
    argument's exclusive hold, each other tensor's shared one; holds on escaped memory (none,
    the common case) through `release_spans`. Holder lists are changed in place, never
    replaced: another thread may be appending its hold to one meanwhile."""
    lines = ["def release(op, args):", f"    {_unpack(arity)} = args"]
    for i, mut in tensors:
        if mut or i in atomic:
            lines.append(f"    a{i}._exclusive = None")
        else:
            lines += [
                f"    s = a{i}._shared",
                "    if len(s) == 1 and s[0]() is op:",
                "        del s[0]",
                "    else:",
                f"        drop_shared(a{i}, op)",
            ]
    lines += ["    if spans:", "        release_spans(op, held(args))"]
    scope: dict[str, Any] = {
        "spans": span_holds,
        "release_spans": release_spans,
        "held": held,
        "drop_shared": drop_shared,
    }
    exec(compile("\n".join(lines), "<cutile_py launch plan>", "exec"), scope)
    release: Callable[[object, Sequence[Any]], None] = scope["release"]
    return release


def _unpack(arity: int) -> str:
    """The left side that unpacks `arity` arguments (`a0, a1, ...`)."""
    return "(" + "".join(f"a{i}, " for i in range(arity)) + ")"


def launch_keyer(
    arity: int, constants: frozenset[int]
) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The function giving what of `arity` arguments a launch plan depends on (its key): each
    tensor's dtype, shape, tiles and address alignment (`_key`); each scalar's type; each
    constant's (at `constants`) type and value, a float by its bits. Generated as one tuple
    display (every launch looks its plan up by it: no loop, no call per argument but a
    constant's)."""
    items = []
    for i in range(arity):
        if i in constants:
            items.append(f"(type(a{i}), const(a{i}))")
        else:
            items.append(f"a{i}._key if type(a{i}) in tensors else type(a{i})")
    display = "".join(e + ", " for e in items)
    source = f"def key(args):\n    {_unpack(arity)} = args\n    return ({display})"
    scope: dict[str, Any] = {"tensors": (Partition, Tensor), "const": _constant_key}
    exec(compile(source, "<cutile_py launch key>", "exec"), scope)
    key: Callable[[tuple[Any, ...]], tuple[Any, ...]] = scope["key"]
    return key


def plan_finder(
    arity: int,
    constants: frozenset[int],
    ints: tuple[int, ...],
    plans: dict[Backend, dict[tuple[Any, ...], LaunchPlan]],
    fingerprint: Callable[[], Hashable],
    cache: Any,
    stats: Any,
) -> Callable[[Backend, tuple[Any, ...]], LaunchPlan | None]:
    """`find(backend, args)`: the plan in `plans` for arguments like `args` (keyed as by
    `launch_keyer`), if it is of the JIT cache's current generation (`cache.generation`),
    what the kernel reads is unchanged (`fingerprint()` is the plan's `deps`) and the int
    scalars at `ints` fit 32 bits; else None. A hit counts in `stats.hits`.

    Generated once per kernel with the key's parts inline: every launch looks its plan up
    here, so this is one frame (not a method, a key function and a loop), and a launch on
    the same tensors as the kernel's last hit takes that plan without a dict lookup (its
    validity is checked as any plan's)."""
    keys = "".join(
        f"    k{i} = (type(a{i}), const(a{i}))\n"
        if i in constants
        else f"    k{i} = a{i}._key if type(a{i}) in tensors else type(a{i})\n"
        for i in range(arity)
    )
    ks = "".join(f"k{i}, " for i in range(arity))
    # The last hit's key parts, compared by identity (a tensor's `_key` is one tuple for its
    # life; scalar types are singletons) and constants by value: a launch on the same
    # tensors as the last one skips building and hashing the key.
    same = "".join(
        f" and hit[{i + 1}] {'==' if i in constants else 'is'} k{i}" for i in range(arity)
    )
    fits = "".join(
        f"    if not -2147483648 <= a{i} < 2147483648:\n        return None\n" for i in ints
    )
    source = (
        "def find(backend, args):\n"
        f"    {_unpack(arity)} = args\n"
        f"{keys}"
        "    hit = last[0]\n"
        f"    if hit[0] is backend{same}:\n"
        "        plan = hit[-1]\n"
        "    else:\n"
        "        by_key = plans.get(backend)\n"
        "        if by_key is None:\n            return None\n"
        "        try:\n"
        f"            plan = by_key.get(({ks}))\n"
        "        except TypeError:  # an unhashable argument: `make_plan` names it\n"
        "            return None\n"
        "        if plan is None:\n            return None\n"
        f"        last[0] = (backend, {ks}plan)  # (one tuple: a thread reads all or none)\n"
        "    if plan.generation != cache.generation:\n"
        "        last[0] = (None,)  # (`make_plan` replaces it: the next launch looks again)\n"
        "        return None\n"
        "    deps = fingerprint()\n"
        "    if plan.deps is not deps and plan.deps != deps:\n"
        "        last[0] = (None,)\n"
        "        return None\n"
        f"{fits}"
        "    stats.hits += 1\n"
        "    return plan"
    )
    scope: dict[str, Any] = {
        "tensors": (Partition, Tensor),
        "const": _constant_key,
        "plans": plans,
        "fingerprint": fingerprint,
        "cache": cache,
        "stats": stats,
        "last": [(None,)],
    }
    exec(compile(source, "<cutile_py launch plan lookup>", "exec"), scope)
    find: Callable[[Backend, tuple[Any, ...]], LaunchPlan | None] = scope["find"]
    return find


def _constant_key(a: Any) -> Any:
    """A constant's value in a launch key (a float by its bits: -0.0 and 0.0 differ)."""
    return struct.pack("<d", a) if isinstance(a, float) else a


def prepare_lowered(
    backend: Backend, kernel: LoadedKernel, lowered: LoweredKernel, grid: tuple[int, ...]
) -> PreparedLaunch:
    """`kernel` (the loaded `lowered`) ready to launch on `backend` over `grid`: one block of
    `lowered.block_threads` threads per tile, with the dynamic shared memory it declares; a
    persistent kernel as many blocks as the device runs at once (at most one per tile), each
    walking the tiles of `grid` (passed as parameters)."""
    g = (*grid, 1, 1, 1)[:3]
    if lowered.persistent:
        wave = backend.resident_blocks(kernel, lowered.block_threads, lowered.dynamic_shared)
        g = (max(1, min(g[0] * g[1] * g[2], wave)), 1, 1)
    return backend.prepare(
        kernel,
        (g[0], g[1], g[2]),
        (lowered.block_threads, 1, 1),
        lowered.dynamic_shared,
        tuple(p.ptype for p in lowered.params),
    )
