"""`@ct.kernel`: capture at definition, specialize and compile on first use, cache in memory
and on disk (PTX only; see `jit_disk` and `cutile_py.runtime.disk_cache`)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import linecache
import os
import sys
import typing
import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

from cutile_py.frontend.build_ir import build_kernel
from cutile_py.frontend.capture import CapturedFunction, capture
from cutile_py.frontend.errors import CompileError, SourceLocation
from cutile_py.frontend.signature import ParamSpec, Specialization, TensorArg, bind, parse_signature
from cutile_py.host import dump, jit_disk
from cutile_py.host.device_op import launch_op
from cutile_py.host.errors import PerformanceWarning
from cutile_py.host.launch import (
    LaunchPlan,
    ParamReader,
    launch_keyer,
    plan_finder,
    prepare_lowered,
)
from cutile_py.host.report import KernelReport, build_report
from cutile_py.host.specs import PartitionSpec, TensorSpec
from cutile_py.host.tensor import Partition, Tensor
from cutile_py.ir import Kernel as KernelIR
from cutile_py.ir import print_kernel
from cutile_py.lower.emit_ptx import LoweringError
from cutile_py.lower.pipeline import LoweredKernel, lower_kernel
from cutile_py.ptx.target import Target
from cutile_py.ptx.target import parse_target as parse_target_name
from cutile_py.runtime.backend import Backend, LoadedKernel, PreparedLaunch, RuntimeFailure
from cutile_py.runtime.disk_cache import default_cache
from cutile_py.runtime.nvjitlink import (
    AssemblyReport,
    PtxAssemblyError,
    assemble,
    moves_registers,
    nvjitlink_available,
)


def _compiler_digest() -> str:
    """A digest of the compiler's own source: a changed compiler (an edit in a development
    tree, a new release) never reads modules an older one wrote to the disk cache."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for layer in ("ir", "language", "frontend", "lower", "ptx"):
        for path in sorted((root / layer).glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


#: Changes whenever generated code may change; part of every cache key.
COMPILER_VERSION = f"0.1.0+{_compiler_digest()}"

#: The most K-loop iterations a kernel may ask the cp.async pipeline to load ahead.
MAX_STAGES = 8


_P = typing.ParamSpec("_P")
_R = TypeVar("_R")


def user_boundary(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """`method` as the user sees it: a CompileError leaves it with the compiler's own frames
    cut from its traceback, so that the user's call is the last frame shown before the error,
    which itself shows the kernel's source line (as Python shows a SyntaxError)."""

    @functools.wraps(method)
    def at_boundary(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except CompileError as err:
            raise err.with_traceback(None) from None  # the kernel's source line is shown below

    return at_boundary


_PACKAGE = str(Path(__file__).resolve().parent.parent)


def _user_stacklevel() -> int:
    """The `stacklevel` of the innermost caller outside cutile_py, for `warnings.warn` called
    by the caller of this function (a warning shows the user's line, not the compiler's)."""
    frame = sys._getframe(1)  # the caller's frame: stacklevel 1
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level


@dataclass(frozen=True)
class CacheKey:
    source_hash: str
    qualname: str
    spec: Specialization
    target: Target | None  # None: IR only (the interpreter)
    fast_math: bool
    stages: int | None
    #: What the kernel and its helpers read from outside, at any depth: globals, closure
    #: variables, module attributes (see `CapturedFunction.fingerprint`).
    deps: tuple[tuple[tuple[str, ...], Hashable], ...] = ()
    compiler: str = COMPILER_VERSION
    num_warps: int | None = None
    group_m: int | None = None
    warp_specialize: bool = False
    persistent: bool = False


class CompiledKernel:
    """A specialization's IR and, for a target, its PTX.

    Read from the disk cache, it has the PTX and the printed IR but not the IR itself; `ir` then
    builds it on first use (through `build_ir`), and `recompile` stands by in case its PTX does
    not load."""

    def __init__(
        self,
        ir: KernelIR | None,
        ir_text: str,
        lowered: LoweredKernel | None,
        loaded: dict[Backend, LoadedKernel] | None = None,
        build_ir: Callable[[], KernelIR] | None = None,
        recompile: Callable[[str], CompiledKernel] | None = None,
        name: str = "",
    ) -> None:
        if ir is None and build_ir is None:
            raise ValueError("CompiledKernel needs its IR or a way to build it")
        self._ir = ir
        self._build_ir = build_ir
        self.ir_text = ir_text
        self.lowered = lowered
        #: The module loaded on each backend (the object: two cuda backends, of two devices
        #: or two drivers, each load their own), so a launch does not look it up again.
        self.loaded: dict[Backend, LoadedKernel] = {} if loaded is None else loaded
        self._recompile = recompile
        #: The kernel's name, for messages.
        self.name = name or (lowered.entry if lowered is not None else "?")
        #: Whether the cubin's spills were checked (see `check_spills`).
        self._spills_checked = False
        #: Launches made ready per (backend, grid), and how to read their parameters.
        self._prepared: dict[tuple[Backend, tuple[int, ...]], PreparedLaunch] = {}
        self._reader: ParamReader | None = None

    @property
    def ir(self) -> KernelIR:
        if self._ir is None:
            assert self._build_ir is not None
            self._ir = self._build_ir()
            self._build_ir = None
        return self._ir

    def load(self, backend: Backend) -> LoadedKernel:
        """The module loaded on `backend`, once. PTX from the disk cache that does not load
        is compiled again from the source (the entry replaced, with one warning): a cache
        entry never fails a launch that compiling would not."""
        kern = self.loaded.get(backend)
        if kern is not None:
            return kern
        assert self.lowered is not None
        try:
            kern = backend.load_kernel(self.lowered.ptx, self.lowered.entry)
        except RuntimeFailure as e:
            if self._recompile is None:
                raise
            fresh, self._recompile = self._recompile(str(e)), None
            self._ir, self._build_ir = fresh._ir, fresh._build_ir
            self.ir_text, self.lowered = fresh.ir_text, fresh.lowered
            self.loaded.clear()  # modules of the PTX read from disk
            self._prepared.clear()
            self._reader = None
            assert self.lowered is not None
            kern = backend.load_kernel(self.lowered.ptx, self.lowered.entry)
        self.loaded[backend] = kern
        self.check_spills(kern.assembly())
        return kern

    def check_spills(self, assembly: AssemblyReport | None = None) -> AssemblyReport | None:
        """Warn (PerformanceWarning) if ptxas spills registers in this kernel's cubin, once.

        `assembly`: ptxas's report where a backend made the cubin; otherwise nvJitLink makes
        one for the PTX's target, where it is installed (CUTILE_PY_SPILL_CHECK=0 skips that),
        except for PTX that moves registers between warp groups, whose spills nvJitLink's
        compile for linking does not show as a GPU compiles them (`moves_registers`)."""
        if self._spills_checked or self.lowered is None:
            return assembly
        if assembly is None:
            if os.environ.get("CUTILE_PY_SPILL_CHECK", "1").strip() in ("0", "false", "no"):
                return None
            if not nvjitlink_available() or moves_registers(self.lowered.ptx):
                return None
            try:
                assembly = assemble(self.lowered.ptx, self.lowered.target)
            except PtxAssemblyError:
                return None  # the backend's own load says what is wrong with the PTX
        self._spills_checked = True
        if assembly.spill_stores or assembly.spill_loads:
            warnings.warn(
                f"kernel {self.name} spills registers on {self.lowered.target.name}: "
                f"{assembly.spill_stores} bytes of spill stores and {assembly.spill_loads} "
                f"bytes of spill loads per thread ({assembly.registers} registers); smaller "
                "tiles, or fewer values live across loops, keep it in registers",
                PerformanceWarning,
                stacklevel=_user_stacklevel(),
            )
        return assembly

    def prepared(self, backend: Backend, grid: tuple[int, ...]) -> PreparedLaunch:
        """This kernel ready to launch on `backend` over `grid`, made once."""
        launch = self._prepared.get((backend, grid))
        if launch is None:
            kern = self.load(backend)  # may recompile, replacing `lowered`
            assert self.lowered is not None
            launch = prepare_lowered(backend, kern, self.lowered, grid)
            self._prepared[(backend, grid)] = launch
        return launch

    def param_reader(self) -> ParamReader:
        """How a launch reads its `.param` values off the arguments."""
        if self._reader is None:
            assert self.lowered is not None
            self._reader = ParamReader(self.lowered)
        return self._reader

    def __repr__(self) -> str:
        where = "none" if self.lowered is None else self.lowered.target.name
        return f"<CompiledKernel ptx={where} ir={'built' if self._ir else 'lazy'}>"


@dataclass
class CacheStats:
    """JIT cache counters: `hits`/`misses` of the in-memory cache; of the misses for a target,
    `disk_hits` were read from the disk cache, `disk_misses` were not there (or it is off);
    `compiles` counts runs of the frontend (building IR)."""

    hits: int = 0
    misses: int = 0
    disk_hits: int = 0
    disk_misses: int = 0
    compiles: int = 0


class _MemoryCache(dict[CacheKey, CompiledKernel]):
    """The in-memory JIT cache. Launch plans hold compiled kernels too: clearing the cache
    moves to a new generation, and plans of an older one are made again."""

    generation = 0

    def clear(self) -> None:
        super().clear()
        type(self).generation += 1


_CACHE = _MemoryCache()
STATS = CacheStats()


def parse_target(target: Target | str | int | None) -> Target | None:
    if target is None or isinstance(target, Target):
        return target
    return parse_target_name(target)


class Kernel:
    """A captured kernel; calling it with arguments builds a `DeviceOp`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        fast_math: bool = False,
        stages: int | None = None,
        num_warps: int | None = None,
        group_m: int | None = None,
        warp_specialize: bool = False,
        persistent: bool = False,
        scope: dict[str, Any] | None = None,
    ) -> None:
        self.fn = fn
        self.fast_math = fast_math
        self.captured: CapturedFunction = capture(fn, scope)
        _check_stages(stages, self.captured)
        _check_num_warps(num_warps, self.captured)
        _check_group_m(group_m, self.captured)
        self.stages = stages
        self.num_warps = num_warps
        self.group_m = group_m
        if not isinstance(warp_specialize, bool):
            where = f"{self.captured.file}:{self.captured.first_line}: kernel {self.captured.name}"
            raise TypeError(f"{where}: warp_specialize must be a bool, got {warp_specialize!r}")
        self.warp_specialize = warp_specialize
        if not isinstance(persistent, bool):
            where = f"{self.captured.file}:{self.captured.first_line}: kernel {self.captured.name}"
            raise TypeError(f"{where}: persistent must be a bool, got {persistent!r}")
        self.persistent = persistent
        self.name = self.captured.name
        self._signature = inspect.signature(fn)
        self._arity = len(self._signature.parameters)
        self._params: tuple[ParamSpec, ...] | None = None
        self._atomic: frozenset[int] | None = None
        #: Launch plans by backend and key of the arguments (`launch_keyer`): see `plan`.
        self._plans: dict[Backend, dict[tuple[Any, ...], LaunchPlan]] = {}
        #: `plan`'s lookup, generated with the kernel's first plan (`plan_finder`).
        self._find_plan: Callable[[Backend, tuple[Any, ...]], LaunchPlan | None] = _no_plan
        self.__doc__ = fn.__doc__
        self.__name__ = self.name
        self.__qualname__ = getattr(fn, "__qualname__", self.name)
        self.__module__ = getattr(fn, "__module__", __name__)

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        if self._params is None:
            self._params = parse_signature(self.captured)
        return self._params

    @property
    def atomic_params(self) -> frozenset[int]:
        """Indices of the `Atomic` parameters (held exclusively, like partitions)."""
        if self._atomic is None:
            self._atomic = frozenset(i for i, p in enumerate(self.params) if p.kind == "atomic")
        return self._atomic

    def bind_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Positional and keyword arguments in parameter order; TypeError if any is missing."""
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"kernel {self.name}: {e}") from None
        return tuple(bound.arguments[p] for p in self._signature.parameters)

    def specialize(self, args: tuple[Any, ...]) -> Specialization:
        infos = tuple(_arg_info(a) for a in args)
        return bind(self.name, self.params, infos)

    def compiled(self, spec: Specialization, target: Target | None) -> CompiledKernel:
        deps = self.captured.fingerprint()
        key = CacheKey(
            self.captured.source_hash,
            self.__qualname__,
            spec,
            target,
            self.fast_math,
            self.stages,
            deps,
            num_warps=self.num_warps,
            group_m=self.group_m,
            warp_specialize=self.warp_specialize,
            persistent=self.persistent,
        )
        hit = _CACHE.get(key)
        if hit is not None:
            STATS.hits += 1
            return hit
        STATS.misses += 1
        if target is None:
            result = self._build(spec, deps)
        else:
            disk_key = jit_disk.disk_key(
                captured=self.captured,
                qualname=self.__qualname__,
                spec=spec,
                target=target,
                fast_math=self.fast_math,
                stages=self.stages,
                num_warps=self.num_warps,
                group_m=self.group_m,
                warp_specialize=self.warp_specialize,
                persistent=self.persistent,
                compiler=COMPILER_VERSION,
            )
            from_disk = self._from_disk(disk_key, spec, target)
            if from_disk is not None:
                result = from_disk
            else:
                result = self._compile(spec, target, deps, disk_key)
        _CACHE[key] = result
        return result

    def _build(
        self, spec: Specialization, deps: tuple[tuple[tuple[str, ...], Hashable], ...]
    ) -> CompiledKernel:
        """The IR of `spec` (from the memory cache, or a run of the frontend), under its key."""
        ir_key = CacheKey(
            self.captured.source_hash,
            self.__qualname__,
            spec,
            None,
            self.fast_math,
            self.stages,
            deps,
            num_warps=self.num_warps,
            group_m=self.group_m,
            warp_specialize=self.warp_specialize,
            persistent=self.persistent,
        )
        base = _CACHE.get(ir_key)
        if base is None:
            STATS.compiles += 1
            kir = build_kernel(
                self.captured,
                spec,
                self.fast_math,
                self.stages,
                self.num_warps,
                self.group_m,
                self.warp_specialize,
                self.persistent,
            )
            base = _CACHE[ir_key] = CompiledKernel(kir, print_kernel(kir), None)
        return base

    def _compile(
        self,
        spec: Specialization,
        target: Target,
        deps: tuple[tuple[tuple[str, ...], Hashable], ...],
        disk_key: str | None,
    ) -> CompiledKernel:
        """`spec` compiled for `target` from the source, and written to the disk cache."""
        base = self._build(spec, deps)
        result = CompiledKernel(
            base.ir, base.ir_text, self._lower(base.ir, target), name=self.__qualname__
        )
        if result.lowered is not None:
            dump.dump_compiled(self.__qualname__, base.ir, base.ir_text, result.lowered)
        if disk_key is not None and result.lowered is not None:
            payload = jit_disk.encode(result.lowered, result.ir_text)
            meta = {"kernel": self.__qualname__, "target": target.name}
            default_cache().put(disk_key, payload, meta)
        return result

    def _lower(self, kir: KernelIR, target: Target) -> LoweredKernel:
        """`lower_kernel`, its errors as a `CompileError` at the op's source line (the
        kernel's `def` where the op has none)."""
        try:
            return lower_kernel(kir, target)
        except LoweringError as e:
            cap = self.captured
            file, line, col = e.span or (cap.file, cap.first_line, 1)
            text = linecache.getline(file, line)
            raise CompileError(e.message, SourceLocation(file, line, col, text), cap.name) from e

    def _from_disk(
        self, disk_key: str | None, spec: Specialization, target: Target
    ) -> CompiledKernel | None:
        """The compiled kernel stored under `disk_key`, or None: a miss, no stable key, or an
        entry that is not what compiling would give (undecodable, or its parameter map, entry
        or target differ: removed, with one warning for the last kinds)."""
        if disk_key is None:
            STATS.disk_misses += 1
            return None
        cache = default_cache()
        payload = cache.get(disk_key)
        if payload is None:
            STATS.disk_misses += 1
            return None
        try:
            decoded = jit_disk.decode(payload)
            why = (
                None if decoded is None else jit_disk.mismatch(decoded[0], self.name, spec, target)
            )
        except Exception as e:  # a cache entry must never fail a launch
            decoded, why = None, f"it cannot be decoded ({type(e).__name__}: {e})"
        if decoded is None or why is not None:
            if why is None:
                cache.discard(disk_key)  # not a compiled kernel (an old format): recompile
            else:
                cache.reject(disk_key, "mismatch", why)
            STATS.disk_misses += 1
            return None
        STATS.disk_hits += 1
        lowered, ir_text = decoded

        def recompile(failure: str) -> CompiledKernel:
            cache.reject(disk_key, "load", f"its PTX does not load ({failure})")
            return self._compile(spec, target, self.captured.fingerprint(), disk_key)

        return CompiledKernel(
            None,
            ir_text,
            lowered,
            build_ir=lambda: self.compiled(spec, None).ir,
            recompile=recompile,
            name=self.__qualname__,
        )

    # -- inspection (launches nothing) ---------------------------------------------------------
    @user_boundary
    def compile(
        self, *args: Any, target: Target | str | int | None = None, **kwargs: Any
    ) -> CompiledKernel:
        """Compile for `target` (default: the active GPU's architecture, else sm_80) with these
        arguments, or TensorSpec / PartitionSpec in their place. Launches nothing."""
        spec = self.specialize(self.bind_arguments(args, kwargs))
        return self.compiled(spec, parse_target(target) or _default_target())

    @user_boundary
    def ptx(self, *args: Any, target: Target | str | int | None = None, **kwargs: Any) -> str:
        """The PTX module text for these arguments (see `compile` for `target`)."""
        lowered = self.compile(*args, target=target, **kwargs).lowered
        assert lowered is not None
        return lowered.ptx

    @user_boundary
    def report(
        self, *args: Any, target: Target | str | int | None = None, **kwargs: Any
    ) -> KernelReport:
        """Registers, spills, shared memory, occupancy, instructions and bytes per element,
        bank conflicts and uncoalesced accesses of this kernel for these arguments (or
        TensorSpec / PartitionSpec in their place), compiled for `target` (see `compile`).
        Launches nothing on the active backend: the measured numbers come from a run on a
        private simulator over copies of the arguments (see `cutile_py.host.report`)."""
        tgt = parse_target(target) or _default_target()
        bound = self.bind_arguments(args, kwargs)
        compiled = self.compiled(self.specialize(bound), tgt)
        return build_report(self, compiled, bound, tgt)

    @user_boundary
    def ir(self, *args: Any, **kwargs: Any) -> str:
        """The tile IR for these arguments, printed."""
        spec = self.specialize(self.bind_arguments(args, kwargs))
        return self.compiled(spec, None).ir_text

    @functools.cached_property
    def param_names(self) -> tuple[str, ...]:
        """The parameters' names, in order."""
        return tuple(p.name for p in self.params)

    def plan(self, backend: Backend, args: tuple[Any, ...]) -> LaunchPlan | None:
        """The launch plan made earlier for arguments like `args` on `backend` (same dtypes,
        shapes, tiles, alignment, scalar types and constant values), if what the kernel reads
        is unchanged and its int scalars still fit; else None (then `make_plan`). A launch
        calls `_find_plan` itself (`plan_finder`, generated at the kernel's first plan)."""
        return self._find_plan(backend, args)

    def make_plan(
        self, backend: Backend, args: tuple[Any, ...], grid: tuple[int, ...]
    ) -> LaunchPlan:
        """Check `args` against the signature (TypeError / ValueError naming the parameter),
        compile on first use, and remember the plan for the next launch like it."""
        deps = self.captured.fingerprint()
        spec = self.specialize(args)
        target = backend.target if backend.runs_ptx else None
        compiled = self.compiled(spec, target)  # CompileError, before anything is held
        plan = LaunchPlan(
            deps, _MemoryCache.generation, spec, compiled, grid, backend, args, self.fn,
            self.atomic_params,
        )  # fmt: skip
        plans = self._plans.setdefault(backend, {})
        if len(plans) >= MAX_PLANS:
            plans.clear()  # a kernel launched over ever-new shapes: start over
        plans[self._shape_info()[2](args)] = plan
        return plan

    def _shape_info(
        self,
    ) -> tuple[frozenset[int], tuple[int, ...], Callable[[tuple[Any, ...]], tuple[Any, ...]]]:
        """Indices of the Constant parameters and of the int scalar ones, and the function
        that gives the plan key of arguments (`launch_keyer`; bound: one per parameter)."""
        info = self.__dict__.get("_param_kinds")
        if info is None:
            consts = frozenset(i for i, p in enumerate(self.params) if p.kind == "constant")
            ints = tuple(
                i for i, p in enumerate(self.params) if p.kind == "scalar" and p.py_type is int
            )
            key = launch_keyer(len(self.params), consts)
            info = self.__dict__["_param_kinds"] = (consts, ints, key)
            self._find_plan = plan_finder(
                len(self.params), consts, ints, self._plans, self.captured.fingerprint,
                _MemoryCache, STATS,
            )  # fmt: skip
        return info

    #: Launch on these arguments: a `DeviceOp` (`cutile_py.host.device_op.launch_op`).
    __call__ = launch_op

    def __repr__(self) -> str:
        return f"<cutile_py kernel {self.__qualname__}>"


def _no_plan(backend: Backend, args: tuple[Any, ...]) -> None:
    """`Kernel._find_plan` before the kernel has any plan."""
    return None


#: Plans one kernel keeps (one per distinct argument signature and backend).
MAX_PLANS = 256


def _default_target() -> Target:
    from cutile_py.runtime.select import active_backend

    backend = active_backend()
    return backend.target if backend.runs_ptx else Target(80)


def _arg_info(a: Any) -> Any:
    if isinstance(a, Partition):
        return TensorArg(a.dtype, a.shape, a.tile_shape, a.tensor._align)
    if isinstance(a, Tensor):
        return TensorArg(a.dtype, a.shape, None, a._align)
    if isinstance(a, PartitionSpec):
        return TensorArg(a.dtype, tuple(a.shape), tuple(a.tile))
    if isinstance(a, TensorSpec):
        return TensorArg(a.dtype, tuple(a.shape), None)
    return a


@overload
def kernel(fn: Callable[..., Any], /) -> Kernel: ...


@overload
def kernel(
    *,
    fast_math: bool = False,
    stages: int | None = None,
    num_warps: int | None = None,
    group_m: int | None = None,
    warp_specialize: bool = False,
    persistent: bool = False,
) -> Callable[[Callable[..., Any]], Kernel]: ...


def kernel(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    fast_math: bool = False,
    stages: int | None = None,
    num_warps: int | None = None,
    group_m: int | None = None,
    warp_specialize: bool = False,
    persistent: bool = False,
) -> Kernel | Callable[[Callable[..., Any]], Kernel]:
    """Capture a kernel function: `@ct.kernel`, or with options, `@ct.kernel(fast_math=True,
    stages=3)`. `stages`: how many K-loop iterations ahead the cp.async pipeline loads
    tensor-core operand tiles (1 to 8; None: the compiler chooses). `num_warps`: warps per
    block (1, 2, 4, 8, 16 or 32; None: the compiler chooses from the tile sizes).
    `group_m`: blocks take their tiles in L2-grouped order (a positive int; None: block i
    owns tile i): in launch order, blocks cover `group_m` tiles along grid axis 0, then step
    along axis 1, band after band; axis 2 is left as it is. The order is a permutation of the
    grid, so every tile still has one owner, and `ct.bid` and each `Mut` tile of a block name
    its remapped tile (`cutile_py.ir.grid_order.grouped`). `warp_specialize`: on sm_90, a
    K loop whose operand tiles are all TMA boxes read by wgmma runs with one more warp group,
    a producer that issues the copies stage by stage while the block's other warps wait,
    run wgmma and hand each stage back (mbarriers "full" and "empty" per stage;
    `setmaxnreg` moves registers to the consumers); the epilogue runs on the consumers.
    Where the plan cannot specialize a loop it says why and the loop runs as without it.
    `persistent`: about one wave of blocks is started (the SMs times the blocks of this
    kernel one SM holds at once, at most the tiles), and block b walks the tiles b,
    b + blocks, ... of the grid the arguments define, in the `group_m` order where given;
    `ct.bid` and `ct.num_blocks` name the tile and that grid, each tile still has one owner.
    A warp-specialized loop keeps its ring and mbarriers across tiles (the producer issues
    the next tile's copies while the consumers finish the last one)."""
    if fn is not None:
        return Kernel(fn, fast_math=fast_math, stages=stages, scope=_defining_scope(fn))
    return lambda f: Kernel(
        f,
        fast_math=fast_math,
        stages=stages,
        num_warps=num_warps,
        group_m=group_m,
        warp_specialize=warp_specialize,
        persistent=persistent,
        scope=_defining_scope(f),
    )


def _check_stages(stages: object, captured: CapturedFunction) -> None:
    """TypeError / ValueError, located at the kernel's `def`, unless `stages` is None or an int
    in 1..MAX_STAGES (checked when decorating, not at the first launch far from the cause)."""
    if stages is None:
        return
    where = f"{captured.file}:{captured.first_line}: kernel {captured.name}"
    # bool is an int subclass, but `stages=True` is surely a mistake.
    if isinstance(stages, bool) or not isinstance(stages, int):
        raise TypeError(f"{where}: stages must be an int or None, got {stages!r}")
    if not 1 <= stages <= MAX_STAGES:
        raise ValueError(f"{where}: stages must be from 1 to {MAX_STAGES}, got {stages}")


def _check_num_warps(num_warps: object, captured: CapturedFunction) -> None:
    """TypeError / ValueError, located at the kernel's `def`, unless `num_warps` is None or a
    power of two from 1 to 32 (checked when decorating)."""
    if num_warps is None:
        return
    where = f"{captured.file}:{captured.first_line}: kernel {captured.name}"
    if isinstance(num_warps, bool) or not isinstance(num_warps, int):
        raise TypeError(f"{where}: num_warps must be an int or None, got {num_warps!r}")
    if num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"{where}: num_warps must be 1, 2, 4, 8, 16 or 32, got {num_warps}")


def _check_group_m(group_m: object, captured: CapturedFunction) -> None:
    """TypeError / ValueError, located at the kernel's `def`, unless `group_m` is None or a
    positive int (checked when decorating)."""
    if group_m is None:
        return
    where = f"{captured.file}:{captured.first_line}: kernel {captured.name}"
    if isinstance(group_m, bool) or not isinstance(group_m, int):
        raise TypeError(f"{where}: group_m must be an int or None, got {group_m!r}")
    if group_m < 1:
        raise ValueError(f"{where}: group_m must be at least 1, got {group_m}")


def _defining_scope(fn: Callable[..., Any]) -> dict[str, Any]:
    """The locals of the function in which `fn` is being decorated ({} at module level)."""
    frame = sys._getframe(2)
    if frame.f_locals is getattr(fn, "__globals__", None):
        return {}
    return dict(frame.f_locals)


def cache_info() -> CacheStats:
    """JIT cache counters: in-memory hits and misses, and of the misses, disk cache hits and
    misses and frontend runs (see `CacheStats`)."""
    return CacheStats(**vars(STATS))
