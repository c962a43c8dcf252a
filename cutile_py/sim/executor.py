"""Running a launch: blocks in batches, every lane of a batch in lock-step under masks.

Divergent branches go on a SIMT reconvergence stack: each entry is (pc, lanes, reconvergence
pc); a divergent branch turns the current entry into the join at the branch's immediate
post-dominator and pushes one entry per side, so every path runs with its own lanes and the
lanes meet again where all paths must pass.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

from cutile_py.ptx.ast import Imm, Instruction
from cutile_py.sim.context import WARP, SimError
from cutile_py.sim.global_races import GlobalRaces
from cutile_py.sim.loops import CHECK_EVERY, LoopWatch
from cutile_py.sim.memory import BlockMemory, GlobalMemory, MemoryFault, ParamMemory
from cutile_py.sim.program import BARRIER, BRANCH, EXIT, NORMAL, Program, Step
from cutile_py.sim.races import RaceFault
from cutile_py.sim.schedule import Schedule, explore, seeds
from cutile_py.sim.spaces import Batch

#: The most shared memory a block may use where the launch names no target (sm_90: 227 KB).
MAX_SHARED = 227 * 1024


@dataclass(frozen=True)
class Options:
    #: Report shared- and global-memory races (two threads, one writing, nothing ordering
    #: them: no barrier between, or different blocks).
    race_check: bool = True
    #: Lanes advanced together: blocks are batched up to this many lanes.
    max_batch_lanes: int = 1 << 16
    #: Shared memory of the blocks of one batch, in bytes (the race detector keeps 6 bytes of
    #: history per byte).
    max_batch_shared: int = 8 << 20
    #: Local memory of the lanes of one batch, in bytes.
    max_batch_local: int = 64 << 20
    #: Instruction steps one batch may take before it is reported as endless; 0: no limit.
    #: None: at least `MIN_STEPS`, more for a launch with more work (see `step_limit`);
    #: `CUTILE_PY_SIM_MAX_STEPS` sets it outright.
    max_steps: int | None = None
    #: Report a loop whose state repeats with nothing written as endless, within
    #: milliseconds (`cutile_py.sim.loops`), long before the step limit.
    loop_check: bool = True
    #: Time the register semantics apart from the rest (Stats.semantics_seconds).
    profile: bool = False
    #: The seed of the order of blocks and warps (None: ascending); `CUTILE_PY_SIM_SCHEDULE`
    #: overrides it (see `cutile_py.sim.schedule`).
    schedule: int | None = None
    #: Run each launch under this many schedules and raise if any output differs;
    #: `CUTILE_PY_SIM_SCHEDULES` overrides it.
    schedules: int = 1


#: The fewest steps a batch may take before it is reported as endless.
MIN_STEPS = 5_000_000

#: Steps allowed per unit of a launch's work (see `step_limit`): a loop over its data takes a
#: few dozen instructions per element it reads, so a legitimate kernel stays well inside this.
STEPS_PER_WORD = 64

#: The limit where there is none (CUTILE_PY_SIM_MAX_STEPS=0): more steps than any run takes.
UNLIMITED = 1 << 62

_INTEGER = frozenset(f"{k}{w}" for k in "usb" for w in (8, 16, 32, 64))


def launch_work(
    memory: GlobalMemory, params: Sequence[tuple[str, int | float | bytes]], shared_bytes: int
) -> tuple[int, str]:
    """How much a launch can loop over, in 4-byte words and integers, and what it is made
    of (for the error): the allocations its pointer parameters point into, its shared
    memory, and its other integer parameters below 2**32 (counts, sizes, strides); a loop
    bounded by one takes as many iterations as its value."""
    seen: set[int] = set()
    pointed = ints = 0
    for ptype, value in params:
        if ptype not in _INTEGER or not isinstance(value, int):
            continue
        alloc = memory.containing(value) if value > 0 else None
        if alloc is not None:
            if alloc.start not in seen:
                seen.add(alloc.start)
                pointed += int(alloc.data.size)
        elif abs(value) < 1 << 32:
            ints += abs(value)
    words = pointed // 4 + shared_bytes // 4 + ints
    what = (
        f"{pointed} bytes of memory its pointers reach, {shared_bytes} bytes of shared "
        f"memory per block and integer parameters summing to {ints}"
    )
    return words, what


def step_limit(
    options: Options,
    memory: GlobalMemory,
    params: Sequence[tuple[str, int | float | bytes]] = (),
    shared_bytes: int = 0,
) -> tuple[int, str]:
    """How many steps a batch may take (`UNLIMITED` for none), and where that number comes
    from (for the error)."""
    env = os.environ.get("CUTILE_PY_SIM_MAX_STEPS", "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            raise SimError(f"CUTILE_PY_SIM_MAX_STEPS={env!r} is not an integer") from None
        if value < 0:
            raise SimError(f"CUTILE_PY_SIM_MAX_STEPS={env!r}: give a step count, or 0 for none")
        return value or UNLIMITED, "CUTILE_PY_SIM_MAX_STEPS"
    if options.max_steps is not None:
        if options.max_steps < 0:
            raise SimError(
                f"Options.max_steps={options.max_steps}: give a step count, or 0 for none"
            )
        return options.max_steps or UNLIMITED, "Options.max_steps"
    words, what = launch_work(memory, params, shared_bytes)
    scaled = STEPS_PER_WORD * words
    if scaled > MIN_STEPS:
        return scaled, f"{STEPS_PER_WORD} per unit of the launch's work: {what}"
    return MIN_STEPS, "the simulator's minimum"


def check_launch(
    program: Program,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared: int,
    max_shared: int = MAX_SHARED,
) -> None:
    """The checks the driver makes at launch (CUDA_ERROR_INVALID_VALUE there); `max_shared`:
    the target's opt-in shared memory per block (`Target.max_shared_bytes`)."""
    where = f"kernel {program.name}: launch with grid {grid}, block {block}"
    if len(grid) != 3 or len(block) != 3 or min(*grid, *block) < 1:
        raise SimError(f"{where}: every grid and block dimension must be at least 1")
    if grid[0] >= 2**31 or max(grid[1:]) > 65535:
        raise SimError(f"{where}: the grid exceeds (2**31 - 1, 65535, 65535)")
    threads = prod(block)
    if threads > 1024 or block[0] > 1024 or block[1] > 1024 or block[2] > 64:
        raise SimError(f"{where}: at most 1024 threads per block (and block.z <= 64)")
    req = program.directives.get("reqntid")
    if req and prod(req) != threads:
        raise SimError(f"{where}: the kernel requires {req} threads per block (.reqntid)")
    most = program.directives.get("maxntid")
    if most and threads > prod(most):
        raise SimError(f"{where}: the kernel allows at most {most} threads (.maxntid)")
    if shared < 0:
        raise SimError(f"{where}: negative dynamic shared memory ({shared} bytes)")
    if program.shared_size(shared) > max_shared:
        raise SimError(
            f"{where}: {program.shared_size(shared)} bytes of shared memory "
            f"({shared} dynamic) exceed the {max_shared} bytes a block may use on this target"
        )


@dataclass
class Stats:
    """What a launch executed: instruction steps (one per batch) and thread-instructions."""

    steps: int = 0
    thread_instructions: int = 0
    batches: int = 0
    #: Threads the launch ran (grid times block).
    threads: int = 0
    #: With Options.profile: seconds spent in `cutile_py.sim.semantics` handlers.
    semantics_seconds: float = 0.0


def run(
    program: Program,
    memory: GlobalMemory,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_mem: int,
    params: Sequence[tuple[str, int | float | bytes]],
    options: Options | None = None,
    max_shared: int = MAX_SHARED,
) -> Stats:
    """Execute a launch to completion; SimError names kernel, line, block and thread."""
    opts = options or Options()
    check_launch(program, grid, block, shared_mem, max_shared)
    order = seeds(opts.schedule, opts.schedules)

    def launch(schedule: Schedule) -> Stats:
        return _run(program, memory, grid, block, shared_mem, params, opts, schedule)

    if len(order) == 1:
        return launch(Schedule(order[0]))
    return explore(launch, memory, program.name, order)


def batch_blocks(
    program: Program, block: tuple[int, int, int], shared_mem: int, opts: Options
) -> int:
    """How many blocks run together in one batch (at least one): as many as the lane, shared
    and local memory budgets of `opts` allow."""
    per_block = -(-prod(block) // WARP) * WARP
    stride = BlockMemory("shared", 0, program.shared_size(shared_mem), None).stride
    local = BlockMemory("local", 0, program.local_size, None).stride * per_block
    return max(
        1,
        min(
            opts.max_batch_lanes // per_block,
            opts.max_batch_shared // stride,
            opts.max_batch_local // local,
        ),
    )


def _run(
    program: Program,
    memory: GlobalMemory,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_mem: int,
    params: Sequence[tuple[str, int | float | bytes]],
    opts: Options,
    schedule: Schedule,
) -> Stats:
    """One run of a launch under `schedule`."""
    limit, limit_from = step_limit(opts, memory, params, program.shared_size(shared_mem))
    pmem = ParamMemory(program.pack_params(params))
    total = prod(grid)
    per_batch = min(total, batch_blocks(program, block, shared_mem, opts))
    stats = Stats(threads=total * prod(block))
    races = GlobalRaces(memory, grid, block) if opts.race_check else None
    blocks = schedule.block_order(total)
    for first in range(0, total, per_batch):
        count = min(per_batch, total - first)
        ids = None if blocks is None else blocks[first : first + count]
        b = Batch(program, memory, grid, block, shared_mem, pmem, first, count, opts.race_check,
                  ids)  # fmt: skip
        if races is not None:
            races.start_batch(b.block_ids)
            b.global_races = races
        if schedule.seed is not None:
            b.schedule = schedule
        with np.errstate(all="ignore"):
            execute(b, program.steps, limit, stats, opts.profile, limit_from, opts.loop_check)
    return stats


def execute(
    b: Batch,
    steps: list[Step],
    max_steps: int,
    stats: Stats,
    profile: bool = False,
    limit_from: str = "the simulator's minimum",
    loop_check: bool = True,
) -> None:
    """Run one batch until all of its lanes have exited."""
    nsteps = len(steps)
    watch = LoopWatch(b, steps)
    # Uniformly taken back-edges until the next loop check; never reaches 0 again when off.
    countdown = CHECK_EVERY if loop_check else 0
    regs = b.regs
    stack: list[list[object]] = [[0, b.live, -1]]
    budget = max_steps
    work = 0  # thread-instructions
    st: Step | None = None
    stats.batches += 1
    try:
        while stack:
            entry = stack[-1]
            pc, entry_mask, rpc = entry
            assert isinstance(pc, int) and isinstance(rpc, int)
            assert isinstance(entry_mask, np.ndarray)
            mask = entry_mask & b.live
            cnt = int(np.count_nonzero(mask))
            if cnt == 0:
                stack.pop()
                continue
            live_cnt = int(np.count_nonzero(b.live))
            full = cnt == live_cnt
            dense = cnt == b.n
            while True:
                if pc == rpc:
                    stack.pop()
                    break
                if pc >= nsteps:  # falling off the end is an exit
                    b.live = b.live & ~mask
                    stack.pop()
                    break
                st = steps[pc]
                budget -= 1
                if budget < 0:
                    raise b.error(
                        f"no exit after {max_steps} instruction steps ({limit_from}): an "
                        "endless loop that writes memory or reads the clock (without either, "
                        "a repeating state is reported sooner), or a thread spinning on "
                        "another that cannot run before it finishes. A longer legitimate loop "
                        "runs with CUTILE_PY_SIM_MAX_STEPS set higher (0: no limit)",
                        int(np.argmax(mask)),
                        st.instr,
                    )
                g = st.guard
                if g is None:
                    m, mc = mask, cnt
                else:
                    gv = regs.get(g)
                    if gv is None:
                        gv = np.zeros(b.n, dtype=bool)
                    m = mask & ~gv if st.negated else mask & gv
                    mc = int(np.count_nonzero(m))
                kind = st.kind
                work += mc
                if kind == NORMAL:
                    if mc:
                        b.mask, b.instr, b.steps = m, st.instr, max_steps - budget
                        b.full = full and mc == cnt
                        b.dense = dense and mc == cnt
                        assert st.run is not None
                        if profile and not st.own:
                            t0 = time.perf_counter()
                            st.run(b)
                            stats.semantics_seconds += time.perf_counter() - t0
                        else:
                            st.run(b)
                    pc += 1
                elif kind == BRANCH:
                    if mc == cnt:
                        if st.back:
                            countdown -= 1
                            if countdown == 0:
                                countdown = CHECK_EVERY
                                watch.check(pc, stack, mask, max_steps - budget)
                        pc = st.target
                    elif mc == 0:
                        pc += 1
                    else:
                        r = st.reconv
                        if rpc == r:
                            stack.pop()  # its lanes already wait at r in the entry below
                        else:
                            entry[0], entry[1] = r, mask
                        if pc + 1 != r:
                            stack.append([pc + 1, mask & ~m, r])
                        if st.target != r:
                            stack.append([st.target, m, r])
                        break
                elif kind == EXIT:
                    if mc:
                        b.live = b.live & ~m
                        live_cnt -= mc
                        mask = mask & ~m
                        cnt -= mc
                        if cnt == 0:
                            stack.pop()
                            break
                        full = cnt == live_cnt
                        dense = False
                    pc += 1
                else:
                    assert kind == BARRIER
                    if mc:
                        b.mask, b.instr = m, st.instr
                        b.full, b.dense = full and mc == cnt, dense and mc == cnt
                        barrier(b, st.instr, m)
                    pc += 1
    except (MemoryFault, RaceFault) as e:
        raise b.error(e.message, e.lane, st.instr if st else None) from None
    except SimError:
        raise
    except Exception as e:
        # A bug in the simulator, not a fault of the kernel: keep the exception, say where.
        if st is not None and hasattr(e, "add_note"):
            e.add_note(f"while simulating kernel {b.kernel}, PTX line {st.instr.line} "
                       f"`{st.instr.text}`")  # fmt: skip
        raise
    finally:
        stats.steps += max_steps - budget
        stats.thread_instructions += work


def barrier(b: Batch, ins: Instruction, m: np.ndarray) -> None:
    """`bar.sync` / `barrier.sync` / `bar.red`: every live thread of a block must arrive."""
    per = b.per_block
    arrived = m.reshape(-1, per).sum(axis=1)
    live = b.live.reshape(-1, per).sum(axis=1)
    partial = (arrived > 0) & (arrived != live)
    if partial.any():
        s = int(np.argmax(partial))
        rows = slice(s * per, (s + 1) * per)
        missing = s * per + int(np.argmax(b.live[rows] & ~m[rows]))
        here = s * per + int(np.argmax(m[rows]))
        raise b.error(
            f"{ins.opcode} reached by only {arrived[s]} of the {live[s]} live threads of the "
            f"block; thread {b.thread_of(missing)} did not arrive (a barrier in divergent code)",
            here,
            ins,
        )
    red = "red" in ins.modifiers
    ops = ins.operands[1:] if red else ins.operands
    if len(ops) > (2 if red else 1):
        count = ops[1]
        n = int(count.value) if isinstance(count, Imm) else int(b.read(count, "u32")[m][0])
        if n != -(-b.threads // WARP) * WARP and n != b.threads:
            b.fail(f"barriers over a thread count ({n}) below the block's are not supported")
    if red:
        _reduce(b, ins, m)
    if b.shared.tracker is not None:
        b.shared.tracker.barrier(np.flatnonzero(arrived))
    if b.global_races is not None:
        b.global_races.barrier(np.flatnonzero(arrived))


def _reduce(b: Batch, ins: Instruction, m: np.ndarray) -> None:
    """`bar.red.{popc,and,or}`: a block-wide reduction of a predicate, given to every thread."""
    per = b.per_block
    pred = b.read(ins.operands[-1], "pred") & m
    counts = pred.reshape(-1, per).sum(axis=1)
    arrived = m.reshape(-1, per).sum(axis=1)
    if "popc" in ins.modifiers:
        b.write(ins.operands[0], "u32", np.repeat(counts, per).astype(np.uint32))
    elif "and" in ins.modifiers:
        b.write(ins.operands[0], "pred", np.repeat(counts == arrived, per))
    elif "or" in ins.modifiers:
        b.write(ins.operands[0], "pred", np.repeat(counts > 0, per))
    else:
        b.fail("bar.red needs .popc, .and or .or")
