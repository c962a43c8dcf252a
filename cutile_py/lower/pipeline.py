"""The lowering pipeline, in order: verify → plan layouts → emit PTX → render the module.

Layouts are planned before emission because every op of a shape must agree on which thread
holds which element; emission then is a single walk in program order.
"""

from __future__ import annotations

from dataclasses import dataclass

from cutile_py.ir import Kernel, verify
from cutile_py.ir.uses import def_use
from cutile_py.lower.emit_ptx import Emitter, PtxParam, entry_name
from cutile_py.lower.layout import LayoutPlan, plan_layouts
from cutile_py.ptx.builder import FunctionBuilder, ModuleBuilder
from cutile_py.ptx.target import Target


@dataclass(frozen=True)
class LoweredKernel:
    """A kernel's PTX module and what a launch needs to run it."""

    ptx: str
    entry: str
    block_threads: int
    params: tuple[PtxParam, ...]
    target: Target
    #: Bytes of dynamic shared memory each launch passes (0: the kernel's shared is static).
    dynamic_shared: int = 0


def lower_kernel(kernel: Kernel, target: Target) -> LoweredKernel:
    verify(kernel)
    plan: LayoutPlan = plan_layouts(kernel, target)
    fb = FunctionBuilder(entry_name(kernel.name), [])
    em = Emitter(kernel, plan, fb, target, def_use(kernel))
    em.preamble()
    em.region(kernel.body)
    em.finish()
    fb.ins("ret")
    module = ModuleBuilder(target, em.features)
    module.functions.append(fb)
    return LoweredKernel(
        module.render(), fb.name, plan.threads, tuple(em.params), target, fb.dynamic_shared
    )
