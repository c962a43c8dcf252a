"""`kernel.report(*args, target=...)`: what a kernel costs, without a GPU.

From ptxas (through nvJitLink): registers, spills, shared memory, and from them occupancy.
From the SASS (nvdisasm / cuobjdump, where installed): instructions. From a launch on a private
simulator (cutile_py.sim's counters): global bytes moved per argument, coalescing and shared
memory bank conflicts per PTX instruction, and the instructions executed. Nothing is launched
on the active backend; a metric whose tool is missing reads "n/a" with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np

from cutile_py.host.device_op import _grid
from cutile_py.host.specs import PartitionSpec, TensorSpec
from cutile_py.host.tensor import Partition, Tensor
from cutile_py.ir.dtypes import DType, to_storage
from cutile_py.ptx.target import SmLimits, Target, sm_limits
from cutile_py.runtime.backend import ParamValue
from cutile_py.runtime.nvjitlink import (
    AssemblyReport,
    PtxAssemblyError,
    assemble,
    moves_registers,
    nvjitlink_available,
)
from cutile_py.runtime.sass import (
    SassUnavailable,
    disassemble,
    instructions,
    located,
    with_line_info,
)
from cutile_py.runtime.sim_backend import SimBackend

if TYPE_CHECKING:
    from cutile_py.host.kernel import CompiledKernel, Kernel

#: Blocks a report simulates at most: a larger grid is sampled at its two ends and scaled.
MAX_BLOCKS = 64


@dataclass(frozen=True)
class Occupancy:
    """Blocks and warps one SM holds at once, and which resource stops more."""

    blocks_per_sm: int
    warps_per_sm: int
    max_warps: int
    limited_by: str

    @property
    def fraction(self) -> float:
        return self.warps_per_sm / self.max_warps


def occupancy(limits: SmLimits, threads: int, registers: int, shared_bytes: int) -> Occupancy:
    """Occupancy of blocks of `threads` threads using `registers` per thread and
    `shared_bytes` of shared memory per block (the CUDA occupancy calculator's rules)."""
    warps = -(-threads // 32)
    bounds = {"blocks per SM": limits.max_blocks, "warps per SM": limits.max_warps // warps}
    if registers:
        unit = limits.register_unit
        per_warp = -(-registers * 32 // unit) * unit
        per_partition = limits.registers // limits.sub_partitions // per_warp
        bounds["registers"] = per_partition * limits.sub_partitions // warps
    smem = shared_bytes + limits.reserved_shared_per_block
    smem = -(-smem // limits.shared_unit) * limits.shared_unit
    bounds["shared memory"] = limits.shared_bytes // smem
    limited_by = min(bounds, key=lambda k: bounds[k])
    blocks = bounds[limited_by]
    return Occupancy(blocks, blocks * warps, limits.max_warps, limited_by)


@dataclass(frozen=True)
class ArgumentTraffic:
    """Global bytes one tensor argument moved in the launch (measured on sim), and the ideal:
    the whole tensor read once if the kernel reads it, written once if it writes it."""

    name: str
    nbytes: int
    read: int
    written: int

    @property
    def ideal(self) -> int:
        return self.nbytes * ((self.read > 0) + (self.written > 0))


@dataclass(frozen=True)
class AccessLine:
    """One PTX memory instruction: `value` is its mean bank-conflict ways (shared) or its
    sectors per request against the fewest its bytes need (global)."""

    line: int
    text: str
    requests: int
    value: float
    worst: int = 0  # shared: the most ways of one phase


@dataclass(frozen=True)
class KernelReport:
    """A compiled kernel's costs for one set of arguments; `str()` prints a table.

    Measured on the simulator (full grid, or `blocks_run` of `blocks_total` blocks scaled up):
    `ptx_instructions`, `bytes_moved` and `arguments`, `shared_accesses`, `global_accesses`.
    `unavailable` says, per metric left None, why."""

    kernel: str
    target: str
    grid: tuple[int, ...]
    block_threads: int
    #: The elements of the largest tensor argument: the "per element" of the rates below.
    elements: int
    registers: int | None
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    static_shared_bytes: int
    dynamic_shared_bytes: int
    occupancy: Occupancy | None
    #: SASS instructions in the cubin (less the padding after the code).
    sass_instructions: int | None
    #: SASS executed per element: each instruction of the cubin counted as often as warps ran
    #: the PTX line it came from on the simulator (ptxas line info), in lanes (32 per warp);
    #: code no PTX line owns (ptxas's slow-path subroutines) counts 0. Without line info: the
    #: cubin's instructions weighted by the ratio of executed to written PTX instructions.
    sass_per_element: float | None
    ptx_instructions: int
    bytes_moved: int
    arguments: tuple[ArgumentTraffic, ...]
    shared_accesses: tuple[AccessLine, ...]
    global_accesses: tuple[AccessLine, ...]
    #: Warp requests to global memory, and those touching more sectors than their bytes need.
    global_requests: int
    uncoalesced_requests: int
    blocks_run: int
    blocks_total: int
    unavailable: tuple[tuple[str, str], ...] = ()

    @property
    def bytes_ideal(self) -> int:
        """Every argument the kernel reads read once, every one it writes written once."""
        return sum(a.ideal for a in self.arguments)

    @property
    def bytes_ratio(self) -> float:
        """Bytes moved over the ideal (1.0: each byte once)."""
        return self.bytes_moved / self.bytes_ideal if self.bytes_ideal else 1.0

    @property
    def ptx_per_element(self) -> float:
        return self.ptx_instructions / self.elements if self.elements else 0.0

    @property
    def bank_conflict_ways(self) -> float:
        """The worst mean ways of a shared-memory instruction (1.0: no conflicts, or none)."""
        return max((a.value for a in self.shared_accesses), default=1.0)

    @property
    def uncoalesced_per_instruction(self) -> float:
        """Uncoalesced warp requests per global memory instruction executed."""
        return self.uncoalesced_requests / self.global_requests if self.global_requests else 0.0

    def why(self, metric: str) -> str | None:
        """Why `metric` (a field name) is not available, or None."""
        return dict(self.unavailable).get(metric)

    def __str__(self) -> str:
        return "\n".join(_table(self))


def _table(r: KernelReport) -> list[str]:
    """The lines of `str(report)`: a heading, then one row per metric."""

    def na(metric: str) -> str:
        return f"n/a ({r.why(metric) or 'not measured'})"

    occ = r.occupancy
    rows: list[tuple[str, str]] = [
        ("registers / thread", na("registers") if r.registers is None else str(r.registers)),
        (
            "spills (stores / loads)",
            na("spill_store_bytes")
            if r.spill_store_bytes is None
            else f"{r.spill_store_bytes} B / {r.spill_load_bytes} B",
        ),
        (
            "shared memory / block",
            f"{r.static_shared_bytes} B static + {r.dynamic_shared_bytes} B dynamic",
        ),
        (
            "occupancy",
            na("occupancy")
            if occ is None
            else f"{occ.blocks_per_sm} blocks, {occ.warps_per_sm} of {occ.max_warps} warps per "
            f"SM ({occ.fraction:.0%}), limited by {occ.limited_by}",
        ),
        (
            "SASS instructions / element",
            na("sass_instructions")
            if r.sass_per_element is None
            else f"{r.sass_per_element:.2f} ({r.sass_instructions} in the cubin)",
        ),
        ("PTX executed / element (sim)", f"{r.ptx_per_element:.2f}"),
        (
            "global bytes moved (sim)",
            f"{r.bytes_moved} B = {r.bytes_ratio:.2f}x the ideal {r.bytes_ideal} B",
        ),
    ]
    for arg in r.arguments:
        rows.append(
            (f"  {arg.name} ({arg.nbytes} B)", f"read {arg.read} B, written {arg.written} B")
        )
    worst = max(r.shared_accesses, key=lambda a: a.value, default=None)
    conflicts = (
        "no shared memory access"
        if worst is None
        else f"{worst.value:.2f} ways worst (line {worst.line}: {worst.text})"
    )
    rows.append(("bank conflicts (sim)", conflicts))
    rows.append(
        (
            "uncoalesced accesses (sim)",
            f"{r.uncoalesced_requests} of {r.global_requests} warp requests "
            f"({r.uncoalesced_per_instruction:.2f} per instruction)",
        )
    )
    for acc in r.global_accesses:
        if acc.value > 1.0:
            rows.append((f"  line {acc.line}", f"{acc.value:.2f}x the sectors needed: {acc.text}"))
    sampled = (
        ""
        if r.blocks_run == r.blocks_total
        else f"; sim ran {r.blocks_run} of {r.blocks_total} blocks, scaled"
    )
    head = (
        f"kernel {r.kernel} on {r.target}: grid {r.grid}, {r.block_threads} threads per block, "
        f"{r.elements} elements{sampled}"
    )
    width = max(len(k) for k, _ in rows)
    return [head, *(f"  {k.ljust(width)}  {v}" for k, v in rows)]


def build_report(
    kernel: Kernel, compiled: CompiledKernel, args: tuple[Any, ...], target: Target
) -> KernelReport:
    """The report of `compiled` (`kernel` for `args`, for `target`)."""
    lowered = compiled.lowered
    assert lowered is not None
    missing: list[tuple[str, str]] = []
    asm: AssemblyReport | None = None
    if not nvjitlink_available():
        why = "the nvJitLink library cannot be loaded"
    else:
        try:
            asm = assemble(lowered.ptx, target)
            why = ""
        except PtxAssemblyError as e:
            why = f"nvJitLink refused the PTX: {e}"
    if asm is None:
        for metric in ("registers", "spill_store_bytes", "occupancy", "sass_instructions"):
            missing.append((metric, why))
    # nvJitLink compiles for linking, which ignores setmaxnreg and fits the whole kernel in its
    # launch registers: its spills are not those of the driver JIT's whole-program compile.
    spills_known = asm is not None and asm.spills_logged and not moves_registers(lowered.ptx)
    if asm is not None and not asm.spills_logged:
        missing.append(("spill_store_bytes", "nvJitLink's log names no spills (a cached compile)"))
    elif asm is not None and not spills_known:
        why_not = "setmaxnreg: nvJitLink's compile for linking ignores it; the driver's JIT "
        missing.append(("spill_store_bytes", why_not + "compiles the kernel whole"))
    if spills_known:
        compiled.check_spills(asm)

    sim, sim_args, names = _sim_arguments(kernel, args, target)
    grid = _grid(kernel.name, names, sim_args)
    loaded = sim.load_kernel(lowered.ptx, lowered.entry)
    static_shared = loaded.program.static_shared
    if asm is not None:
        static_shared = asm.shared_bytes  # ptxas's own count
    regions = _regions(sim_args, names)
    reader = compiled.param_reader()
    g = (*grid, 1, 1, 1)[:3]
    values = [ParamValue(t, v) for t, v in zip(reader.ptypes, reader(sim_args, sim, g))]
    # A persistent kernel walks the tiles of the grid its parameters give, block b from
    # tile b on with the launched blocks as its stride: one block per tile measures (and
    # samples) it as a launched grid.
    run = (g[0] * g[1] * g[2], 1, 1) if lowered.persistent else (g[0], g[1], g[2])
    measured = (
        None
        if 0 in grid
        else sim.measure(loaded, run, (lowered.block_threads, 1, 1), lowered.dynamic_shared,
                         values, [r for _, r in regions], MAX_BLOCKS)
    )  # fmt: skip
    scale = measured.blocks_total / measured.blocks_run if measured and measured.blocks_run else 1.0
    executed = round(measured.thread_instructions * scale) if measured else 0

    sass_count: int | None = None
    sass_rate: float | None = None
    elements = max((a.size for a in sim_args if isinstance(a, Tensor)), default=0)
    elements = max([elements, *(a.tensor.size for a in sim_args if isinstance(a, Partition))])
    if asm is not None:
        try:
            sass_count = len(instructions(disassemble(asm.cubin)))
        except SassUnavailable as e:
            missing.append(("sass_instructions", str(e)))
        if sass_count is not None and elements:
            traced = (
                None if measured is None else _sass_executed(lowered.ptx, target, loaded, measured)
            )
            if traced is not None:
                sass_rate = traced * scale / elements
            else:
                written = len(loaded.program.steps)
                sass_rate = sass_count * executed / written / elements

    occ = None
    if asm is not None:
        occ = occupancy(sm_limits(target), lowered.block_threads, asm.registers,
                        static_shared + lowered.dynamic_shared)  # fmt: skip
    arguments: list[ArgumentTraffic] = []
    shared_lines: list[AccessLine] = []
    global_lines: list[AccessLine] = []
    requests = uncoalesced = 0
    if measured is not None:
        c = measured.counters
        for i, (name, (lo, hi)) in enumerate(regions):
            read, written_b = round(c.read[i] * scale), round(c.written[i] * scale)
            arguments.append(ArgumentTraffic(name, hi - lo, read, written_b))
        for s in c.shared_accesses.values():
            shared_lines.append(AccessLine(s.line, s.text, s.requests, s.ways, s.max_ways))
        for a in c.global_accesses.values():
            ratio = a.sectors / a.ideal_sectors if a.ideal_sectors else 1.0
            global_lines.append(AccessLine(a.line, a.text, round(a.requests * scale), ratio))
            requests += a.requests
            uncoalesced += a.uncoalesced
        requests, uncoalesced = round(requests * scale), round(uncoalesced * scale)
        other = round(c.other_bytes * scale)
    else:
        other = 0
    moved = sum(a.read + a.written for a in arguments) + other
    return KernelReport(
        kernel=kernel.__qualname__,
        target=target.name,
        grid=grid,
        block_threads=lowered.block_threads,
        elements=elements,
        registers=asm.registers if asm else None,
        spill_store_bytes=asm.spill_stores if asm and spills_known else None,
        spill_load_bytes=asm.spill_loads if asm and spills_known else None,
        static_shared_bytes=static_shared,
        dynamic_shared_bytes=lowered.dynamic_shared,
        occupancy=occ,
        sass_instructions=sass_count,
        sass_per_element=sass_rate,
        ptx_instructions=executed,
        bytes_moved=moved,
        arguments=tuple(arguments),
        shared_accesses=tuple(sorted(shared_lines, key=lambda a: a.line)),
        global_accesses=tuple(sorted(global_lines, key=lambda a: a.line)),
        global_requests=requests,
        uncoalesced_requests=uncoalesced,
        blocks_run=measured.blocks_run if measured else 0,
        blocks_total=measured.blocks_total if measured else 0,
        unavailable=tuple(missing),
    )


def _sass_executed(ptx: str, target: Target, loaded: Any, measured: Any) -> float | None:
    """SASS thread-instructions the measured run executed: each instruction of a `-lineinfo`
    cubin weighted by its PTX line's executions; None where the line info is not to be had."""
    try:
        cubin = assemble(with_line_info(ptx), target, verbose=False, lineinfo=True).cubin
        listing = located(disassemble(cubin, line_info=True))
    except (PtxAssemblyError, SassUnavailable):
        return None
    counters = measured.counters
    lanes: dict[int, int] = {}
    for pc, step in enumerate(loaded.program.steps):
        lanes.setdefault(step.instr.line, counters.lanes_at(pc))
    if not any(line is not None for _, line in listing):
        return None
    return float(sum(lanes.get(line, 0) for line in _hot_lines(listing) if line is not None))


def _hot_lines(listing: list[tuple[str, int | None]]) -> list[int | None]:
    """The PTX line of each SASS instruction, None for the cold ones: a call to one of
    ptxas's internal slow paths (`__cuda_...`) and its argument set-up after the conditional
    branch that skips it (taken only for rare operands, e.g. a denormal divisor)."""
    lines = [line for _, line in listing]
    skip = -1
    for i, (text, _) in enumerate(listing):
        if text.startswith("@") and " BRA " in text:
            skip = i
        elif text.startswith("CALL") and "__cuda_" in text and skip >= 0:
            lines[skip + 1 : i + 1] = [None] * (i - skip)
            skip = -1
        elif "BRA" in text or "EXIT" in text or "BAR" in text:
            skip = -1
    return lines


def _regions(args: Sequence[Any], names: Sequence[str]) -> list[tuple[str, tuple[int, int]]]:
    """(parameter name, address range) of each tensor argument on the simulator."""
    out: list[tuple[str, tuple[int, int]]] = []
    for name, a in zip(names, args):
        t = a.tensor if isinstance(a, Partition) else a
        if isinstance(t, Tensor):
            out.append((name, (t.buffer.address, t.buffer.address + t.nbytes)))
    return out


def _sim_arguments(
    kernel: Kernel, args: tuple[Any, ...], target: Target
) -> tuple[SimBackend, tuple[Any, ...], tuple[str, ...]]:
    """A private simulator, and `args` with each tensor (or spec) copied onto it: a tensor's
    own contents, or for a spec, normal random floats (zeros for integers and booleans)."""
    sim = SimBackend(target)
    rng = np.random.default_rng(0)
    out: list[Any] = []
    for a in args:
        if isinstance(a, (Tensor, Partition)):
            t = a.tensor if isinstance(a, Partition) else a
            raw = t.backend.download(t.buffer, t.nbytes) if t.nbytes else None
            copy = _sim_tensor(sim, t.shape, t.dtype, raw)
            out.append(Partition(copy, a.tile_shape) if isinstance(a, Partition) else copy)
        elif isinstance(a, (TensorSpec, PartitionSpec)):
            shape = tuple(a.shape)
            if a.dtype.is_float():
                values = rng.standard_normal(shape).astype(np.float32)
            else:
                values = np.zeros(shape, dtype=a.dtype.compute)
            raw = np.ascontiguousarray(to_storage(values, a.dtype)).reshape(-1).view(np.uint8)
            copy = _sim_tensor(sim, shape, a.dtype, raw)
            out.append(Partition(copy, tuple(a.tile)) if isinstance(a, PartitionSpec) else copy)
        else:
            out.append(a)
    return sim, tuple(out), kernel.param_names


def _sim_tensor(
    sim: SimBackend, shape: tuple[int, ...], dtype: type[DType], raw: np.ndarray | None
) -> Tensor[Any, Any]:
    nbytes = prod(shape) * dtype.itemsize()
    buf = sim.alloc(max(nbytes, 1))
    if raw is not None and nbytes:
        sim.upload(buf, raw)
    return Tensor(buf, shape, dtype, sim)
