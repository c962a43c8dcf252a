"""plan_ws: whether a TMA-fed wgmma K loop runs warp-specialized
(`@ct.kernel(warp_specialize=True)`), and if not, why.

A specialized block has one more warp group than its layouts: the producer, the last 128
threads. It branches away after the preamble, hands most of its registers to the consumers
(`setmaxnreg`), computes again the scalars the loop's bounds and box coordinates need (pure
scalar ops at the kernel's top level: `producer_ops`), and one of its threads issues the
boxes of stage s once the consumers handed that stage back. The consumers (the block the
layouts were made for) run the kernel as before, the loop waiting on each stage's "full"
mbarrier instead of issuing copies, and the epilogue after it. `emit_tma` carries it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from cutile_py.ir import ops as o
from cutile_py.ir.uses import DefUse
from cutile_py.lower.plan_tma import BARRIER_BYTES

#: Ops the producer may compute again: pure, scalar, no regions.
PURE_SCALAR_OPS = (
    o.ConstantOp,
    o.BinaryOp,
    o.UnaryOp,
    o.CastOp,
    o.CompareOp,
    o.SelectOp,
    o.FmaOp,
    o.GridOp,
    o.TensorDimOp,
)
#: Threads of the producer warp group (`setmaxnreg` acts on whole warp groups).
PRODUCER_THREADS = 128
#: Registers per producer thread after `setmaxnreg.dec`: it only computes box coordinates.
PRODUCER_REGS = 40
#: 32-bit registers per SM (sm_90), shared by the block's threads.
REGISTER_FILE = 65536
#: Threads a block may have.
MAX_THREADS = 1024


class Staged(Protocol):
    """What this pass reads of a `plan_pipelines.StagedLoad` (which imports this module)."""

    @property
    def load(self) -> o.LoadOp: ...
    @property
    def index_ops(self) -> tuple[o.Op, ...]: ...
    @property
    def tma(self) -> bool: ...


class Pipeline(Protocol):
    """What this pass reads of a `plan_pipelines.PipelinePlan`."""

    @property
    def loop(self) -> o.ForOp: ...
    @property
    def mmas(self) -> tuple[o.MmaOp, ...]: ...
    @property
    def wgmma(self) -> tuple[o.MmaOp, ...]: ...
    @property
    def loads(self) -> tuple[Staged, ...]: ...
    @property
    def resident(self) -> tuple[Any, ...]: ...
    @property
    def kind(self) -> str: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def stages(self) -> int: ...


@dataclass(frozen=True)
class WarpSpecialization:
    """One specialized loop: `consumers` threads (warp groups 0 .. consumers/128 - 1) run the
    kernel; the producer warp group after them issues the loop's boxes."""

    consumers: int
    #: Top-level scalar ops before the loop that the producer emits again, in program order.
    producer_ops: tuple[o.Op, ...]

    @property
    def threads(self) -> int:
        """The block's threads: consumers and the producer warp group."""
        return self.consumers + PRODUCER_THREADS

    @property
    def maxnreg(self) -> int:
        """`.maxnreg` of the kernel: the register file split evenly over the block (ptxas
        needs a known count at entry for `setmaxnreg` to take effect)."""
        return min(255, REGISTER_FILE // self.threads) // 8 * 8

    @property
    def consumer_regs(self) -> int:
        """Registers per consumer thread after `setmaxnreg.inc`: what the producer gave up,
        shared out (a multiple of 8, at most 256)."""
        free = REGISTER_FILE - PRODUCER_THREADS * PRODUCER_REGS
        return min(256, free // self.consumers // 8 * 8)

    def describe(self) -> str:
        return (
            f"warp specialized: consumers warp groups 0..{self.consumers // 128 - 1} "
            f"({self.consumers} threads, setmaxnreg.inc {self.consumer_regs}), producer warp "
            f"group {self.consumers // 128} (threads {self.consumers}.."
            f"{self.threads - 1}, setmaxnreg.dec {PRODUCER_REGS}, thread {self.consumers} "
            f"issues); .maxnreg {self.maxnreg}; per stage a full mbarrier (1 arrival + the "
            f"boxes' bytes) and an empty one ({self.consumers // 32} arrivals: lane 0 of each "
            "consumer warp once its wgmma reading the stage retired)"
        )


def specialize(
    kernel: o.Kernel, plan: Pipeline, threads: int, uses: DefUse
) -> WarpSpecialization | str:
    """How `plan`'s loop runs warp-specialized with `threads` consumer threads, or why it
    cannot (it then runs as planned)."""
    loop = plan.loop
    if plan.kind != "tma" or not all(sl.tma for sl in plan.loads):
        return "its operand tiles are not all TMA boxes"
    if not plan.wgmma or len(plan.wgmma) != len(plan.mmas):
        return "its mmas are not all wgmma"
    if plan.in_flight != 1:
        return "its wgmma does not keep a group in flight (the stage hand-back needs it)"
    if plan.stages < 2 or 2 * plan.stages * 8 > BARRIER_BYTES:
        return f"{plan.stages} stages (it needs 2 to {BARRIER_BYTES // 16})"
    if plan.resident:
        return "it stores operands before the loop"
    if not any(op is loop for op in kernel.body.ops):
        return "the loop is nested in another loop or branch"
    if threads % PRODUCER_THREADS or threads + PRODUCER_THREADS > MAX_THREADS:
        return (
            f"{threads} threads: the consumers must be whole warp groups and, with the "
            f"producer's, at most {MAX_THREADS}"
        )
    ops = producer_slice(kernel, plan, uses)
    if isinstance(ops, str):
        return ops
    return WarpSpecialization(threads, ops)


def producer_slice(kernel: o.Kernel, plan: Pipeline, uses: DefUse) -> tuple[o.Op, ...] | str:
    """The top-level ops before the loop its bounds and box coordinates depend on (the
    kernel's scalar parameters and the preamble's registers excepted), or why one of them
    cannot be computed again by the producer."""
    loop = plan.loop
    inner = {op for sl in plan.loads for op in sl.index_ops}
    todo = list(loop.operands[:3])
    todo += [v for sl in plan.loads for op in sl.index_ops for v in op.operands]
    todo += [v for sl in plan.loads for v in sl.load.operands]  # an index made before it
    params = {v for v in kernel.param_values if v is not None}
    top = set(kernel.body.ops)
    need: set[o.Op] = set()
    while todo:
        v = todo.pop()
        if v in params or v is loop.body.args[0]:
            continue
        op = uses.producer(v)
        if op is None or op in inner or op in need:
            continue
        if op not in top:
            return "a value its copies need is computed inside another region"
        if not isinstance(op, PURE_SCALAR_OPS) or op.result.type.shape:
            return f"its copies need {op.opname}, which is not a pure scalar op"
        need.add(op)
        todo.extend(op.operands)
    return tuple(op for op in kernel.body.ops if op in need)
