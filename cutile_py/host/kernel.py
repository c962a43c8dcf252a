"""`@ct.kernel`: capture at definition, specialize and compile on first use, cache in memory."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, overload

from cutile_py.frontend.build_ir import build_kernel
from cutile_py.frontend.capture import CapturedFunction, capture
from cutile_py.frontend.signature import ParamSpec, Specialization, TensorArg, bind, parse_signature
from cutile_py.host.specs import PartitionSpec, TensorSpec
from cutile_py.host.tensor import Partition, Tensor
from cutile_py.ir import Kernel as KernelIR
from cutile_py.ir import print_kernel
from cutile_py.lower.pipeline import LoweredKernel, lower_kernel
from cutile_py.ptx.target import Target
from cutile_py.runtime.backend import LoadedKernel

#: Changes whenever generated code may change; part of every cache key.
COMPILER_VERSION = "0.1.0-1"


@dataclass(frozen=True)
class CacheKey:
    source_hash: str
    qualname: str
    spec: Specialization
    target: Target | None  # None: IR only (the interpreter)
    fast_math: bool
    #: Values of the globals and closure variables the kernel reads (see `fingerprint`).
    deps: tuple[tuple[str, Any], ...] = ()
    compiler: str = COMPILER_VERSION


@dataclass
class CompiledKernel:
    """A specialization's IR and, for a target, its PTX."""

    ir: KernelIR
    ir_text: str
    lowered: LoweredKernel | None
    #: The module loaded on each backend (by name), so a launch does not look it up again.
    loaded: dict[str, LoadedKernel] = field(default_factory=dict)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


_CACHE: dict[CacheKey, CompiledKernel] = {}
STATS = CacheStats()


def parse_target(target: Target | str | int | None) -> Target | None:
    if target is None or isinstance(target, Target):
        return target
    if isinstance(target, str):
        name = target.removeprefix("sm_")
        if not name.isdigit():
            raise ValueError(f"target must look like 'sm_90', got {target!r}")
        return Target(int(name))
    return Target(int(target))


class Kernel:
    """A captured kernel; calling it with arguments builds a `DeviceOp`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        fast_math: bool = False,
        scope: dict[str, Any] | None = None,
    ) -> None:
        self.fn = fn
        self.fast_math = fast_math
        self.captured: CapturedFunction = capture(fn, scope)
        self.name = self.captured.name
        self._signature = inspect.signature(fn)
        self._params: tuple[ParamSpec, ...] | None = None
        self.__doc__ = fn.__doc__
        self.__name__ = self.name
        self.__qualname__ = getattr(fn, "__qualname__", self.name)
        self.__module__ = getattr(fn, "__module__", __name__)

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        if self._params is None:
            self._params = parse_signature(self.captured)
        return self._params

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
            self.captured.source_hash, self.__qualname__, spec, target, self.fast_math, deps
        )
        hit = _CACHE.get(key)
        if hit is not None:
            STATS.hits += 1
            return hit
        STATS.misses += 1
        ir_key = CacheKey(key.source_hash, key.qualname, spec, None, self.fast_math, deps)
        base = _CACHE.get(ir_key)
        if base is None:
            kir = build_kernel(self.captured, spec, self.fast_math)
            base = CompiledKernel(kir, print_kernel(kir), None)
            _CACHE[ir_key] = base
        result = (
            base
            if target is None
            else CompiledKernel(base.ir, base.ir_text, lower_kernel(base.ir, target))
        )
        _CACHE[key] = result
        return result

    # -- inspection (launches nothing) ---------------------------------------------------------
    def compile(
        self, *args: Any, target: Target | str | int | None = None, **kwargs: Any
    ) -> CompiledKernel:
        """Compile for `target` (default: the active GPU's architecture, else sm_80) with these
        arguments, or TensorSpec / PartitionSpec in their place. Launches nothing."""
        spec = self.specialize(self.bind_arguments(args, kwargs))
        return self.compiled(spec, parse_target(target) or _default_target())

    def ptx(self, *args: Any, target: Target | str | int | None = None, **kwargs: Any) -> str:
        """The PTX module text for these arguments (see `compile` for `target`)."""
        lowered = self.compile(*args, target=target, **kwargs).lowered
        assert lowered is not None
        return lowered.ptx

    def ir(self, *args: Any, **kwargs: Any) -> str:
        """The tile IR for these arguments, printed."""
        spec = self.specialize(self.bind_arguments(args, kwargs))
        return self.compiled(spec, None).ir_text

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from cutile_py.host.device_op import DeviceOp

        return DeviceOp.for_kernel(self, self.bind_arguments(args, kwargs))

    def __repr__(self) -> str:
        return f"<cutile_py kernel {self.__qualname__}>"


def _default_target() -> Target:
    from cutile_py.runtime.select import active_backend

    backend = active_backend()
    return backend.target if backend.runs_ptx else Target(80)


def _base_align(t: Tensor[Any, Any]) -> int:
    """Elements (power of two ≤ 16) that the tensor's first element's address is aligned to."""
    size = t.dtype.itemsize()
    address = t.buffer.address
    if address % size:
        return 1
    align = 1
    while align < 16 and (address // size) % (align * 2) == 0:
        align *= 2
    return align


def _arg_info(a: Any) -> Any:
    if isinstance(a, Partition):
        return TensorArg(a.dtype, a.shape, a.tile_shape, _base_align(a.tensor))
    if isinstance(a, Tensor):
        return TensorArg(a.dtype, a.shape, None, _base_align(a))
    if isinstance(a, PartitionSpec):
        return TensorArg(a.dtype, tuple(a.shape), tuple(a.tile))
    if isinstance(a, TensorSpec):
        return TensorArg(a.dtype, tuple(a.shape), None)
    return a


@overload
def kernel(fn: Callable[..., Any], /) -> Kernel: ...


@overload
def kernel(*, fast_math: bool = False) -> Callable[[Callable[..., Any]], Kernel]: ...


def kernel(
    fn: Callable[..., Any] | None = None, /, *, fast_math: bool = False
) -> Kernel | Callable[[Callable[..., Any]], Kernel]:
    """Capture a kernel function: `@ct.kernel` or `@ct.kernel(fast_math=True)`."""
    if fn is not None:
        return Kernel(fn, fast_math=fast_math, scope=_defining_scope(fn))
    return lambda f: Kernel(f, fast_math=fast_math, scope=_defining_scope(f))


def _defining_scope(fn: Callable[..., Any]) -> dict[str, Any]:
    """The locals of the function in which `fn` is being decorated ({} at module level)."""
    frame = sys._getframe(2)
    if frame.f_locals is getattr(fn, "__globals__", None):
        return {}
    return dict(frame.f_locals)


def cache_info() -> CacheStats:
    """In-memory JIT cache hits and misses (a miss compiles)."""
    return CacheStats(STATS.hits, STATS.misses)
