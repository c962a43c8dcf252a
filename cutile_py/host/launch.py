"""Launching compiled PTX: the `.param` values of a launch, and the call into the backend."""

from __future__ import annotations

from typing import Any

from cutile_py.host.tensor import Partition
from cutile_py.lower.pipeline import LoweredKernel
from cutile_py.runtime.backend import (
    Backend,
    KernelLaunch,
    LoadedKernel,
    ParamValue,
    Touch,
)

_PTR, _DIM, _INT, _FLOAT = range(4)


class ParamReader:
    """Reads a launch's `.param` values off its arguments, in the order the PTX declares them
    (a plan made once per compiled kernel: one pass over the arguments per launch)."""

    def __init__(self, lowered: LoweredKernel) -> None:
        steps = []
        for p in lowered.params:
            kind = {"ptr": _PTR, "dim": _DIM}.get(p.what)
            if kind is None:
                kind = _INT if p.ptype in ("s32", "u32", "s64") else _FLOAT
            steps.append((p.arg, kind, p.axis))
        self._steps = tuple(steps)
        self._pointers = tuple(dict.fromkeys(p.arg for p in lowered.params if p.what == "ptr"))
        self.ptypes = tuple(p.ptype for p in lowered.params)

    def __call__(self, args: tuple[Any, ...]) -> list[int | float]:
        out: list[int | float] = []
        for arg, kind, axis in self._steps:
            a = args[arg]
            if kind == _PTR:
                out.append((a._tensor if type(a) is Partition else a)._address)
            elif kind == _DIM:
                out.append((a._tensor if type(a) is Partition else a)._shape[axis])
            else:
                out.append(int(a) if kind == _INT else float(a))
        return out

    def touches(self, args: tuple[Any, ...], atomic: frozenset[int] = frozenset()) -> list[Touch]:
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


def pack_params(lowered: LoweredKernel, args: tuple[Any, ...]) -> list[ParamValue]:
    """The `.param` values of a launch, in the order the PTX declares them."""
    reader = ParamReader(lowered)
    return [ParamValue(t, v) for t, v in zip(reader.ptypes, reader(args))]


def kernel_launch(
    backend: Backend,
    lowered: LoweredKernel,
    grid: tuple[int, ...],
    args: tuple[Any, ...],
    loaded: dict[str, LoadedKernel],
) -> KernelLaunch:
    """The launch on `backend` with its parameters bound; `loaded` caches the module there."""
    kern = loaded.get(backend.name)
    if kern is None:
        kern = loaded[backend.name] = backend.load_kernel(lowered.ptx, lowered.entry)
    g = (*grid, 1, 1, 1)[:3]
    return KernelLaunch(
        kern,
        (g[0], g[1], g[2]),
        (lowered.block_threads, 1, 1),
        lowered.dynamic_shared,
        tuple(pack_params(lowered, args)),
    )
