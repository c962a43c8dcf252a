"""Launching compiled PTX: the `.param` values of a launch, and the call into the backend."""

from __future__ import annotations

from typing import Any

from cutile_py.host.tensor import Partition
from cutile_py.lower.pipeline import LoweredKernel
from cutile_py.runtime.backend import (
    Backend,
    Completion,
    KernelLaunch,
    LoadedKernel,
    ParamValue,
)


def pack_params(lowered: LoweredKernel, args: tuple[Any, ...]) -> list[ParamValue]:
    """The `.param` values of a launch, in the order the PTX declares them."""
    out = []
    for p in lowered.params:
        a = args[p.arg]
        t = a.tensor if isinstance(a, Partition) else a
        if p.what == "ptr":
            out.append(ParamValue("u64", t.buffer.address))
        elif p.what == "dim":
            out.append(ParamValue("u32", t.shape[p.axis]))
        else:
            out.append(
                ParamValue(p.ptype, int(a) if p.ptype in ("s32", "u32", "s64") else float(a))
            )
    return out


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


def launch_ptx(
    backend: Backend,
    lowered: LoweredKernel,
    grid: tuple[int, ...],
    args: tuple[Any, ...],
    loaded: dict[str, LoadedKernel],
    stream: object | None = None,
) -> Completion:
    """Launch on `backend` (on `stream`, a backend stream handle, where one is given)."""
    k = kernel_launch(backend, lowered, grid, args, loaded)
    return backend.launch(k.kernel, k.grid, k.block, k.shared_mem, k.params, stream)
