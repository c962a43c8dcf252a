"""Memory counters of a simulated launch: the bytes each global region reads and writes, and
per PTX memory instruction the 32-byte sectors of each warp request (coalescing) and the
shared-memory bank conflicts of each warp access.

`instrument` wraps the handlers of a copy of a `Program`'s memory instructions, so launches
that count nothing run the simulator's own handlers at full speed.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from math import prod
from typing import TYPE_CHECKING

import numpy as np

from cutile_py.ptx.ast import Imm, Instruction, Operand
from cutile_py.sim import bulk_copy
from cutile_py.sim.context import PTYPE_DTYPE, WARP
from cutile_py.sim.executor import (
    MAX_SHARED,
    Options,
    Stats,
    batch_blocks,
    check_launch,
    execute,
    step_limit,
)
from cutile_py.sim.memops import _address, is_predicate, value_type, vector_width
from cutile_py.sim.memory import SHARED_WINDOW, WINDOW_SPAN, GlobalMemory, ParamMemory
from cutile_py.sim.program import BRANCH, EXIT, NORMAL, Program, Step
from cutile_py.sim.spaces import Batch, space_of

if TYPE_CHECKING:
    from cutile_py.sim.program import Handler

#: Global memory moves in 32-byte sectors; shared memory has 32 banks of 4 bytes.
SECTOR = 32
BANKS = 32
BANK_BYTES = 4
_U64 = np.uint64


@dataclass
class GlobalAccess:
    """One global load/store instruction over a launch: warp requests, the distinct bytes
    their active lanes asked for, the sectors they touched and the fewest those bytes fit in."""

    line: int
    text: str
    requests: int = 0
    bytes: int = 0
    sectors: int = 0
    ideal_sectors: int = 0
    #: Requests that touched more sectors than their bytes need (strided or scattered lanes).
    uncoalesced: int = 0


@dataclass
class SharedAccess:
    """One shared-memory access instruction: warp requests, and the wavefronts they took (the
    bank-conflict ways summed over each request's phases) against one per phase."""

    line: int
    text: str
    requests: int = 0
    wavefronts: int = 0
    ideal_wavefronts: int = 0
    max_ways: int = 0

    @property
    def ways(self) -> float:
        """The mean bank-conflict ways of a phase (1.0: conflict-free)."""
        return self.wavefronts / self.ideal_wavefronts if self.ideal_wavefronts else 1.0


@dataclass
class MemoryCounters:
    """Counts of a launch; `regions` are the (start, end) global address ranges whose bytes
    are counted apart (a kernel's arguments; `read[i]`, `written[i]` are region i's)."""

    regions: Sequence[tuple[int, int]]
    read: list[int] = field(default_factory=list)
    written: list[int] = field(default_factory=list)
    #: Global bytes outside every region (module variables, other allocations).
    other_bytes: int = 0
    global_accesses: dict[int, GlobalAccess] = field(default_factory=dict)
    shared_accesses: dict[int, SharedAccess] = field(default_factory=dict)
    #: Per pc, the lanes of the warps that ran it (counted at one step of each basic block;
    #: `block_of[pc]` names that step, for the pcs of blocks that have one).
    step_lanes: list[int] = field(default_factory=list)
    block_of: dict[int, int] = field(default_factory=dict)

    def lanes_at(self, pc: int) -> int:
        """The lanes of the warps that reached step `pc` (its block's count; 0 if unknown)."""
        rep = self.block_of.get(pc)
        return 0 if rep is None else self.step_lanes[rep]

    def __post_init__(self) -> None:
        self.read = [0] * len(self.regions)
        self.written = [0] * len(self.regions)
        #: The regions by start address, and each one's index in `regions`.
        self._order = np.argsort([r[0] for r in self.regions], kind="stable").astype(np.int64)
        self._starts = np.array([self.regions[i][0] for i in self._order], dtype=np.uint64)
        self._ends = np.array([self.regions[i][1] for i in self._order], dtype=np.uint64)

    def count_global(
        self,
        pc: int,
        ins: Instruction,
        lanes: np.ndarray,
        addrs: np.ndarray,
        size: np.ndarray,
        write: bool | None = None,
    ) -> None:
        """Lanes `lanes` accessed `size[i]` bytes at `addrs[i]` (size 0: nothing); `write`:
        whether the bytes were written (None: as the opcode says)."""
        keep = size > 0
        if not keep.all():
            lanes, addrs, size = lanes[keep], addrs[keep], size[keep]
        if lanes.size == 0:
            return
        # Lanes of one warp reading the same address share one transfer (a broadcast): the
        # bytes a request moves are its distinct ones.
        warp_addr = ((lanes // WARP).astype(np.uint64) << _U64(52)) | addrs
        _, first_of = np.unique(warp_addr, return_index=True)
        if first_of.size < lanes.size:
            lanes, addrs, size = lanes[first_of], addrs[first_of], size[first_of]
        acc = self.global_accesses.get(pc)
        if acc is None:
            acc = self.global_accesses[pc] = GlobalAccess(ins.line, ins.text)
        nbytes = int(size.sum())
        acc.bytes += nbytes
        self._attribute(ins, addrs, size, write)
        warps = (lanes // WARP).astype(np.int64)
        first = addrs >> _U64(5)
        last = (addrs + size.astype(np.uint64) - _U64(1)) >> _U64(5)
        span = (last - first).astype(np.int64) + 1
        if span.max() > 1:  # an access over several sectors (unaligned bytes, or wide)
            warps = np.repeat(warps, span)
            first = np.repeat(first, span) + _U64(1) * (
                np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span)
            ).astype(np.uint64)
        keys = np.unique((warps.astype(np.uint64) << _U64(44)) | (first & _U64((1 << 44) - 1)))
        sector_warps = (keys >> _U64(44)).astype(np.int64)
        per_warp_sectors = np.bincount(sector_warps)
        per_warp_bytes = np.bincount((lanes // WARP).astype(np.int64), weights=size)
        used = np.flatnonzero(per_warp_bytes)
        ideal = -(-per_warp_bytes[used].astype(np.int64) // SECTOR)
        acc.requests += used.size
        acc.sectors += keys.size
        acc.ideal_sectors += int(ideal.sum())
        acc.uncoalesced += int(np.count_nonzero(per_warp_sectors[used] > ideal))

    def _attribute(
        self, ins: Instruction, addrs: np.ndarray, size: np.ndarray, write: bool | None
    ) -> None:
        if write is None:
            write = ins.opcode in ("st", "atom", "red")
            read = ins.opcode != "st"
        else:
            read = not write
        if not len(self.regions):
            self.other_bytes += int(size.sum()) * (int(read) + int(write))
            return
        idx = np.searchsorted(self._starts, addrs, side="right") - 1
        inside = (idx >= 0) & (addrs < self._ends[np.maximum(idx, 0)])
        which = self._order[idx[inside]]
        per = np.bincount(which, weights=size[inside], minlength=len(self.regions))
        self.other_bytes += int(size[~inside].sum()) * (int(read) + int(write))
        for i, n in enumerate(per.astype(np.int64).tolist()):
            if read:
                self.read[i] += n
            if write:
                self.written[i] += n

    def count_shared(
        self, pc: int, ins: Instruction, lanes: np.ndarray, offsets: np.ndarray, size: int
    ) -> None:
        """Lanes `lanes` accessed `size` bytes each at shared `offsets` (of their block).

        A request is served in phases: a warp for accesses up to 4 bytes, half-warps for 8,
        quarter-warps for 16. In a phase, each bank serves one 4-byte word per wavefront, and
        lanes reading one word share it (a broadcast): the phase takes as many wavefronts as
        the most distinct words any one bank holds."""
        if lanes.size == 0:
            return
        acc = self.shared_accesses.get(pc)
        if acc is None:
            acc = self.shared_accesses[pc] = SharedAccess(ins.line, ins.text)
        words = max(1, size // BANK_BYTES)
        phases = min(words, WARP)
        group = (lanes // WARP) * phases + (lanes % WARP) // (WARP // phases)
        word = (offsets >> _U64(2)).astype(np.int64)
        if words > 1:
            group = np.repeat(group, words)
            word = (word[:, None] + np.arange(words)).reshape(-1)
        distinct = np.unique((group.astype(np.int64) << 32) | word)
        grp = distinct >> 32
        bank = (distinct & 0xFFFFFFFF) % BANKS
        gb, ways = np.unique(grp * BANKS + bank, return_counts=True)  # words per phase and bank
        per_group = np.zeros(int(grp.max()) + 1, dtype=np.int64)
        np.maximum.at(per_group, gb // BANKS, ways)
        used = per_group[np.unique(grp)]
        acc.requests += np.unique(lanes // WARP).size
        acc.wavefronts += int(used.sum())
        acc.ideal_wavefronts += used.size
        acc.max_ways = max(acc.max_ways, int(used.max()))


def _split(addrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of generic addresses in global memory, and in the shared window."""
    shared = (addrs >= _U64(SHARED_WINDOW)) & (addrs < _U64(SHARED_WINDOW + WINDOW_SPAN))
    return addrs < _U64(SHARED_WINDOW), shared


def _wrap_access(
    ins: Instruction, pc: int, inner: Handler, counters: MemoryCounters, addr_at: int
) -> Handler:
    """`ld`, `st`, `atom`, `red`: count the access of the active lanes, then run it."""
    space = space_of(ins.modifiers)
    if space not in ("global", "shared", ""):
        return inner
    size = PTYPE_DTYPE[value_type(ins)].itemsize * vector_width(ins)
    addr = _address(ins, addr_at)
    atomic = ins.opcode in ("atom", "red")

    def run(b: Batch) -> None:
        lanes = b.active()
        addrs = b.addresses(addr, lanes, space == "")
        if space == "global":
            counters.count_global(pc, ins, lanes, addrs, np.full(lanes.size, size))
        elif space == "shared":
            if not atomic:
                counters.count_shared(pc, ins, lanes, addrs, size)
        else:
            glob, shared = _split(addrs)
            if glob.any():
                counters.count_global(pc, ins, lanes[glob], addrs[glob],
                                      np.full(int(glob.sum()), size))  # fmt: skip
            if shared.any() and not atomic:
                offs = addrs[shared] - _U64(SHARED_WINDOW)
                counters.count_shared(pc, ins, lanes[shared], offs, size)
        inner(b)

    return run


def _wrap_ldmatrix(ins: Instruction, pc: int, inner: Handler, counters: MemoryCounters) -> Handler:
    """`ldmatrix` (and `stmatrix`): lanes 0-7 of a warp give the rows of the first matrix,
    8-15 the second..."""
    num = next(int(m[1:]) for m in ins.modifiers if m in ("x1", "x2", "x4"))
    addr = _address(ins, 1 if ins.opcode == "ldmatrix" else 0)
    generic = space_of(ins.modifiers) == ""
    providers = np.arange(8 * num)

    def run(b: Batch) -> None:
        used = np.flatnonzero(b.mask.reshape(-1, WARP).any(axis=1))
        lanes = (used[:, None] * WARP + providers).reshape(-1)
        offs = b.addresses(addr, lanes, generic)
        if generic:
            offs = offs - _U64(SHARED_WINDOW)
        counters.count_shared(pc, ins, lanes, offs, 16)
        inner(b)

    return run


def _wrap_cp_async(
    ins: Instruction, pc: int, inner: Handler, counters: MemoryCounters, prog: Program
) -> Handler:
    """`cp.async` issue: reads src-size bytes of global memory, writes `size` to shared."""
    dst_addr, src_addr = _address(ins, 0), _address(ins, 1)
    size_op = ins.operands[2]
    assert isinstance(size_op, Imm)
    size = int(size_op.value)
    ignore: Operand | None = None
    src_size: Operand | None = None
    for op in ins.operands[3:]:
        if is_predicate(op, prog):
            ignore = op
        elif src_size is None:
            src_size = op

    def run(b: Batch) -> None:
        lanes = b.active()
        n = (
            b.read(src_size, "u32")[lanes].astype(np.int64)
            if src_size is not None
            else np.full(lanes.size, size, dtype=np.int64)
        )
        if ignore is not None:
            n[b.read(ignore, "pred")[lanes]] = 0
        counters.count_global(pc, ins, lanes, b.addresses(src_addr, lanes, False), n)
        counters.count_shared(pc, ins, lanes, b.addresses(dst_addr, lanes, False), size)
        inner(b)

    return run


def _wrap(step: Step, pc: int, counters: MemoryCounters, prog: Program) -> Handler | None:
    ins, inner = step.instr, step.run
    if inner is None or not step.own:
        return None
    op = ins.opcode
    if op in ("ld", "ldu"):
        return _wrap_access(ins, pc, inner, counters, 1)
    if op == "st" or op == "red":
        return _wrap_access(ins, pc, inner, counters, 0)
    if op == "atom":
        return _wrap_access(ins, pc, inner, counters, 1)
    if op in ("ldmatrix", "stmatrix"):
        return _wrap_ldmatrix(ins, pc, inner, counters)
    if op == "cp" and len(ins.operands) > 2 and isinstance(ins.operands[2], Imm):
        return _wrap_cp_async(ins, pc, inner, counters, prog)
    if op == "cp" and "tensor" in ins.modifiers and "mbarrier::complete_tx::bytes" in ins.modifiers:
        return _wrap_tma(ins, pc, inner, counters, store=False)
    if op == "cp" and "tensor" in ins.modifiers and "bulk_group" in ins.modifiers:
        return _wrap_tma(ins, pc, inner, counters, store=True)
    return None


def _wrap_tma(
    ins: Instruction, pc: int, inner: Handler, counters: MemoryCounters, store: bool
) -> Handler:
    """`cp.async.bulk.tensor`: a load reads, a store writes, the elements of its box that lie
    in the tensor (a store's are counted at the issue; it reads shared memory later,
    `bulk_stores`)."""
    rank = next(int(m[0]) for m in ins.modifiers if len(m) == 2 and m[1] == "d")
    tmap, coords = bulk_copy._tensor_operand(ins, 0 if store else 1, rank)

    def run(b: Batch) -> None:
        lanes, boxes = bulk_copy._issued(b, tmap, coords, rank)
        for lane, (m, addr, inside) in zip(lanes.tolist(), boxes):
            at = addr[inside].astype(np.uint64)
            if at.size:
                who = np.full(at.size, lane, dtype=np.int64)
                sizes = np.full(at.size, m.esize)
                counters.count_global(pc, ins, who, at, sizes, write=store)
        inner(b)

    return run


def _leaders(steps: Sequence[Step]) -> dict[int, int]:
    """Each step's basic block, as the pc of a step that runs whenever the block does (an
    unguarded NORMAL one), for the blocks that have one."""
    starts = {0}
    for pc, st in enumerate(steps):
        if st.kind in (BRANCH, EXIT):
            starts.add(pc + 1)
            if st.kind == BRANCH:
                starts.add(st.target)
    out: dict[int, int] = {}
    block: list[int] = []
    for pc in range(len(steps) + 1):
        if pc in starts or pc == len(steps):
            rep = next((q for q in block if steps[q].kind == NORMAL and steps[q].guard is None), -1)
            if rep >= 0:
                out.update((q, rep) for q in block)
            block = []
        if pc < len(steps):
            block.append(pc)
    return out


def _wrap_count(inner: Handler, pc: int, counts: list[int]) -> Handler:
    """Count the lanes of the warps that run the step (a warp issues for all of its lanes)."""

    def run(b: Batch) -> None:
        m = b.mask
        counts[pc] += (
            WARP * int(np.count_nonzero(m.reshape(-1, WARP).any(axis=1)))
            if m.size % WARP == 0
            else int(np.count_nonzero(m))
        )
        inner(b)

    return run


def instrument(
    program: Program, regions: Sequence[tuple[int, int]]
) -> tuple[Program, MemoryCounters]:
    """A copy of `program` whose memory instructions count into the returned counters, and
    whose blocks count their executions into `counters.step_lanes`."""
    counters = MemoryCounters(regions)
    counted = copy.copy(program)
    lead = _leaders(program.steps)
    reps = set(lead.values())
    counts = [0] * len(program.steps)
    steps = []
    for pc, st in enumerate(program.steps):
        run = _wrap(st, pc, counters, program)
        inner = run or st.run
        if pc in reps and inner is not None:
            run = _wrap_count(inner, pc, counts)
        steps.append(st if run is None else replace(st, run=run))
    counted.steps = steps
    counters.step_lanes = counts
    counters.block_of = lead
    return counted, counters


@dataclass(frozen=True)
class Measurement:
    """A counted launch: its counters, thread-instructions executed, and how many of the
    grid's blocks ran (all of them, or a sample from the start and the end of the grid)."""

    counters: MemoryCounters
    thread_instructions: int
    blocks_run: int
    blocks_total: int


def sample(total: int, most: int) -> list[tuple[int, int]]:
    """(first block, count) ranges: the whole grid, or `most` blocks from its two ends."""
    if total <= most:
        return [(0, total)]
    head = most // 2
    return [(0, head), (total - (most - head), most - head)]


def measure(
    program: Program,
    memory: GlobalMemory,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_mem: int,
    params: Sequence[tuple[str, int | float | bytes]],
    regions: Sequence[tuple[int, int]],
    max_blocks: int = 256,
    max_shared: int = MAX_SHARED,
) -> Measurement:
    """Run (a sample of) a launch with counters; no race check (counting only)."""
    counted, counters = instrument(program, regions)
    check_launch(counted, grid, block, shared_mem, max_shared)
    opts = Options(race_check=False)
    limit, limit_from = step_limit(opts, memory, params, counted.shared_size(shared_mem))
    pmem = ParamMemory(counted.pack_params(params))
    per_batch = batch_blocks(counted, block, shared_mem, opts)
    stats = Stats()
    ran = 0
    for first, count in sample(prod(grid), max_blocks):
        for start in range(first, first + count, per_batch):
            n = min(per_batch, first + count - start)
            b = Batch(counted, memory, grid, block, shared_mem, pmem, start, n, False)
            with np.errstate(all="ignore"):
                execute(b, counted.steps, limit, stats, False, limit_from)
            ran += n
    return Measurement(counters, stats.thread_instructions, ran, prod(grid))
