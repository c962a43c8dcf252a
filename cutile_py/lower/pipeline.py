"""The lowering pipeline, in order: verify → def-use → plan (layouts and mma fragments,
pipelines, shared memory) → emit PTX → drop the block barriers that order nothing
(`ptx.barriers`) → render the module.

Every decision is planned before emission (`plan.py`): every op of a shape must agree on which
thread holds which element, and a loop's pipeline claims shared memory that the code after
it may reuse. Emission then is a single walk in program order that carries the plan out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cutile_py.ir import Kernel, verify
from cutile_py.ir.uses import def_use
from cutile_py.lower.emit_ptx import Emitter, PtxParam, entry_name
from cutile_py.lower.plan import LoweringPlan, plan_lowering
from cutile_py.ptx.barriers import drop_idle_barriers
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
    #: What the planning passes decided (None for a kernel read back from the disk cache).
    plan: LoweringPlan | None = field(default=None, compare=False, repr=False)

    @property
    def persistent(self) -> bool:
        """Whether blocks walk the tiles of a logical grid passed as parameters (a launch
        starts about one wave of blocks: `host.launch.prepare_lowered`)."""
        return any(p.what == "grid" for p in self.params)


def plan_and_emit(kernel: Kernel, target: Target) -> tuple[LoweringPlan, Emitter]:
    """The plan of `kernel` for `target` and the emitter that carried it out, its body
    emitted (the function's `ret` and branch-only tails not yet)."""
    verify(kernel)
    uses = def_use(kernel)
    plan = plan_lowering(kernel, target, uses)
    fb = FunctionBuilder(entry_name(kernel.name), [])
    em = Emitter(
        kernel,
        plan.layouts,
        fb,
        target,
        uses,
        plan.pipelines,
        plan.fragment_plan,
        plan.shared,
        tma_stores=plan.stores.tma,
        unpadded=plan.unpadded,
        persistent=plan.persistent,
    )
    em.preamble()
    em.region(kernel.body)
    em.finish()
    return plan, em


def lower_kernel(kernel: Kernel, target: Target) -> LoweredKernel:
    plan, em = plan_and_emit(kernel, target)
    fb = em.fb
    fb.ins("ret")
    for tail in em.tails:  # code reached by a branch only (a producer warp group)
        tail()
    fb.body = drop_idle_barriers(fb.body)
    module = ModuleBuilder(target, em.features)
    module.functions.append(fb)
    return LoweredKernel(
        module.render(),
        fb.name,
        plan.block_threads,
        tuple(em.params),
        target,
        fb.dynamic_shared,
        plan,
    )
