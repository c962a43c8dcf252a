"""Running a launch: blocks in batches, every lane of a batch in lock-step under masks.

Divergent branches go on a SIMT reconvergence stack: each entry is (pc, lanes, reconvergence
pc); a divergent branch turns the current entry into the join at the branch's immediate
post-dominator and pushes one entry per side, so every path runs with its own lanes and the
lanes meet again where all paths must pass.

Lanes that cannot go on — an `mbarrier` wait that fails for all of them, a loop whose state
repeats (`cutile_py.sim.loops`), a named barrier others have still to reach — are split off
into a `Path` of their own, with their part of the stack, and the rest run on: as warps are
scheduled independently (and, from sm_70, the sides of a divergent branch within a warp), a
producer warp spinning on a barrier lets the consumer warps run, and the other way round. Where
no path can go on, the batch is in a deadlock, reported with every waiting group of threads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

from cutile_py.ptx.ast import Instruction
from cutile_py.sim.context import WARP, SimError
from cutile_py.sim.global_races import GlobalRaces
from cutile_py.sim.loops import CHECK_EVERY, LoopWatch
from cutile_py.sim.memory import BlockMemory, GlobalMemory, MemoryFault, ParamMemory
from cutile_py.sim.named_barriers import barrier_operands, named_of, ordered
from cutile_py.sim.program import BARRIER, BRANCH, EXIT, NORMAL, WAIT, Program, Step
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


#: Why a path stopped: an mbarrier wait failed for all its lanes (it may run on where nothing
#: else can), its loop came back to a state it had (nothing but another path can end it), or
#: its lanes wait at a named barrier.
WAITED, SPUN, PARKED = 1, 2, 3


@dataclass(eq=False)
class Path:
    """Lanes the executor schedules on their own, with a SIMT stack of their own: the whole
    batch at first; the lanes of a path that stops are split off into a path of their own
    (as warps are scheduled independently), so the other lanes of its stack run on."""

    stack: list[list[object]]
    #: The progress token (`_progress`) when it stopped; None while it may run.
    token: tuple[int, int, int, int] | None = None
    why: int = 0
    #: Run on through failed waits (every path had stopped with nothing left to run).
    force: bool = False
    pc: int = 0  # where it stopped: the wait, the barrier, or the loop's back-edge
    lanes: np.ndarray | None = None
    apart: int = 0  # SPUN: instruction steps between the repeated states
    wait: tuple[int, int, int] | None = None  # the failed mbarrier wait (lane, offset, parity)


def _progress(b: Batch) -> tuple[int, int, int, int]:
    """What another path's progress changes: memory written, clock read, barrier arrivals and
    completions, threads exited. A stopped path cannot go on before one of them changes."""
    nb = b.named_barriers
    return (b.writes, b.clock_reads, 0 if nb is None else nb.events,
            int(np.count_nonzero(b.live)))  # fmt: skip


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
    regs = b.file
    paths = [Path([[0, b.live, -1]])]
    budget = max_steps
    work = 0  # thread-instructions
    st: Step | None = None
    stats.batches += 1
    try:
        while paths:
            path = paths[0]
            if path.token is not None:
                now = _progress(b)
                if path.token == now or _parked(b, path):
                    path.token = now
                    _idle(b, paths, now, watch, steps)
                    continue
                path.token = None
            stack = path.stack
            force = path.force
            stop = 0
            stop_lanes = b.live
            stop_pc = apart = 0
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
                            "endless loop that writes memory or reads the clock (without "
                            "either, a repeating state is reported sooner), or a thread "
                            "spinning on another that cannot run before it finishes. A longer "
                            "legitimate loop runs with CUTILE_PY_SIM_MAX_STEPS set higher (0: "
                            "no limit)",
                            int(np.argmax(mask)),
                            st.instr,
                        )
                    g = st.guard
                    if g is None:
                        m, mc = mask, cnt
                    else:
                        gv = regs[g]
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
                                    apart = watch.check(pc, stack, mask, max_steps - budget)
                                    if apart:
                                        entry[0] = st.target
                                        stop, stop_lanes, stop_pc = SPUN, mask, pc
                                        break
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
                    elif kind == WAIT:
                        if mc:
                            b.mask, b.instr, b.steps = m, st.instr, max_steps - budget
                            b.full, b.dense = full and mc == cnt, dense and mc == cnt
                            assert st.run is not None
                            st.run(b)
                            if b.wait_failed and not force:
                                entry[0] = pc  # it waits again when it runs next
                                stop, stop_lanes, stop_pc = WAITED, m, pc
                                break
                        pc += 1
                    else:
                        assert kind == BARRIER
                        if mc:
                            b.mask, b.instr = m, st.instr
                            b.full, b.dense = full and mc == cnt, dense and mc == cnt
                            if barrier(b, st.instr, m, pc):
                                entry[0] = pc + 1
                                nb = b.named_barriers
                                assert nb is not None
                                stop, stop_lanes, stop_pc = PARKED, m & nb.waiting, pc
                                break
                        pc += 1
                if stop:
                    break
            if stop:
                _stop(b, paths, path, stop, stop_lanes, stop_pc, apart, steps)
            else:
                paths.pop(0)
        if b.shared.bulk is not None:
            b.shared.bulk.check_exit()
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


def _parked(b: Batch, path: Path) -> bool:
    """Whether lanes of `path` still wait at a named barrier."""
    nb = b.named_barriers
    if path.why != PARKED or nb is None or not path.stack:
        return False
    top = path.stack[-1][1]
    assert isinstance(top, np.ndarray)
    return bool((nb.waiting & top).any())


def _stop(b: Batch, paths: list[Path], path: Path, why: int, lanes: np.ndarray, pc: int,
          apart: int, steps: list[Step]) -> None:  # fmt: skip
    """`lanes` of the running path `path` (paths[0]) cannot go on at `pc`: split them off
    into a path of their own where the path has other lanes to run, else stop it."""
    stack = path.stack
    keep: list[list[object]] = []
    for e in stack:
        rest = e[1] & ~lanes
        if (rest & b.live).any():
            keep.append([e[0], rest, e[2]])
    if keep:
        mine = [[e[0], e[1] & lanes, e[2]] for e in stack if (e[1] & lanes).any()]
        stack[:] = keep
        path = Path(mine)
        paths.append(path)
    else:
        paths.append(paths.pop(0))
    path.token, path.why, path.pc, path.lanes, path.apart = _progress(b), why, pc, lanes, apart
    path.wait = None
    if why == SPUN:
        spin = _wait_in(steps, pc)
        if spin >= 0:  # a loop around a failing wait: name the wait
            path.pc, path.wait = spin, b.failed_wait
    elif why == WAITED:
        path.wait = b.failed_wait
    if why != WAITED:
        path.force = False


def _wait_in(steps: list[Step], back: int) -> int:
    """The mbarrier wait in the loop closed by the back-edge at `back` (-1: none)."""
    head = steps[back].target
    return next((i for i in range(head, back + 1) if steps[i].kind == WAIT), -1)


def _idle(b: Batch, paths: list[Path], now: tuple[int, int, int, int], watch: LoopWatch,
          steps: list[Step]) -> None:  # fmt: skip
    """paths[0] cannot go on: run another that may; where none may, report a barrier threads
    exited without reaching, let a path stopped at a failed wait run on, or report a
    deadlock."""
    runnable = [i for i, p in enumerate(paths) if p.token != now]
    if runnable:
        k = runnable[0] if b.schedule is None else runnable[b.schedule.pick(len(runnable))]
        paths.insert(0, paths.pop(k))
        return
    nb = b.named_barriers
    if nb is not None:
        left = nb.abandoned(b)
        if left is not None:
            raise left
    for i, p in enumerate(paths):
        if p.why == WAITED and not p.force:
            p.force, p.token = True, None  # a wait that fails may be the kernel's answer
            paths.insert(0, paths.pop(i))
            return
    raise _deadlock(b, paths, watch, steps)


def _deadlock(b: Batch, paths: list[Path], watch: LoopWatch, steps: list[Step]) -> SimError:
    """The error for a batch none of whose paths can go on."""
    first = paths[0]
    assert first.lanes is not None
    if len(paths) == 1 and first.why == SPUN and first.wait is None:
        return watch.report(first.pc, first.lanes, first.apart)
    parts = [_describe(b, p, steps) for p in paths[:4]]
    more = f"; and {len(paths) - 4} more groups of threads" if len(paths) > 4 else ""
    return b.error(
        "a deadlock: no thread of the batch can go on. " + "; ".join(parts) + more,
        int(np.argmax(first.lanes)),
        steps[first.pc].instr,
    )


def _describe(b: Batch, p: Path, steps: list[Step]) -> str:
    assert p.lanes is not None
    lane = int(np.argmax(p.lanes))
    ins = steps[p.pc].instr
    blocks = sorted({b.block_of(int(x)) for x in np.flatnonzero(p.lanes)[::WARP]})
    where = ", ".join(f"({x}, {y}, {z})" for x, y, z in blocks[:4])
    where += f" and {len(blocks) - 4} more" if len(blocks) > 4 else ""
    who = (f"warp {int(b.tid[lane]) // WARP} ({int(np.count_nonzero(p.lanes))} threads) of "
           f"blocks {where}")  # fmt: skip
    if p.wait is not None:
        _, offset, parity = p.wait
        return (f"{who} wait at PTX line {ins.line} `{ins.text}` on the mbarrier at shared "
                f"address {offset:#x} for its phase of parity {parity} to complete, which no "
                "thread that can run arrives on or completes transaction bytes of")  # fmt: skip
    if p.why == PARKED:
        nb = b.named_barriers
        told = nb.describe(b) if nb is not None else None
        what = f": {told[0]}" if told is not None else ""
        return f"{who} wait at PTX line {ins.line} `{ins.text}`{what}"
    head = steps[steps[p.pc].target].instr.line
    return (f"{who} spin in the loop at PTX lines {head}-{ins.line} with nothing written "
            "that another thread could change")  # fmt: skip


def barrier(b: Batch, ins: Instruction, m: np.ndarray, pc: int = -1) -> bool:
    """`bar.sync` / `barrier.sync` / `bar.arrive` / `bar.red` by lanes `m` at step `pc`;
    True if some must wait for threads that have not arrived (`b.named_barriers.waiting`)."""
    park = False
    for ident, expected, lanes in barrier_operands(b, ins, m):
        park |= _arrive(b, ins, lanes, pc, ident, expected)
    return park


def _arrive(b: Batch, ins: Instruction, m: np.ndarray, pc: int, ident: int,
            expected: int) -> bool:  # fmt: skip
    red = "red" in ins.modifiers
    nb = b.named_barriers
    if nb is None or ident not in nb.gens:
        # The common case: every thread the barrier waits for arrives in this one step.
        per = b.per_block
        arrived = m.reshape(-1, per).sum(axis=1)
        if expected:
            whole = not ((arrived > 0) & (arrived != expected)).any()
        else:
            live = b.live.reshape(-1, per).sum(axis=1)
            whole = not ((arrived > 0) & (arrived != live)).any()
        if whole:
            if red:
                _reduce(b, ins, m)
            ordered(b, np.flatnonzero(arrived))
            return False
    if red:
        b.fail("bar.red reached by part of the threads it waits for is not supported")
    wait = "arrive" not in ins.modifiers
    return named_of(b).arrive(b, ins, pc, m, ident, expected, wait)


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
