"""`Batch`: the lanes of a batch of blocks together with the memories they address.

It resolves address operands (`[%rd1+16]`, `[sym+8]`) and routes each access to its state
space: global, const, shared, local, param, or generic (split by the windows of `memory`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cutile_py.ptx.ast import Addr, Reg, Symbol
from cutile_py.sim.context import PTYPE_DTYPE, SimError
from cutile_py.sim.lanes import Lanes
from cutile_py.sim.memory import (
    LOCAL_WINDOW,
    PARAM_WINDOW,
    SHARED_WINDOW,
    UINT,
    WINDOW_SPAN,
    BlockMemory,
    GlobalMemory,
    MemoryFault,
    ParamMemory,
    check_aligned,
)
from cutile_py.sim.races import RaceTracker

if TYPE_CHECKING:
    from cutile_py.sim.async_copy import AsyncCopies
    from cutile_py.sim.global_races import GlobalRaces
    from cutile_py.sim.mbarrier import Barriers
    from cutile_py.sim.named_barriers import NamedBarriers
    from cutile_py.sim.program import Program
    from cutile_py.sim.schedule import Schedule
    from cutile_py.sim.wgmma import Wgmma

WINDOWS = {"shared": SHARED_WINDOW, "local": LOCAL_WINDOW, "param": PARAM_WINDOW}
U64 = np.uint64


def space_of(modifiers: tuple[str, ...]) -> str:
    """The state space named among an instruction's modifiers; "" for generic addressing."""
    for m in modifiers:
        base = m.split("::")[0]
        if base in ("global", "shared", "local", "param", "const"):
            return base
    return ""


class Batch(Lanes):
    """One batch of blocks of a launch: registers, thread identities and memories."""

    def __init__(
        self,
        program: Program,
        memory: GlobalMemory,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        dynamic_shared: int,
        params: ParamMemory,
        first_block: int,
        nblocks: int,
        race_check: bool,
        blocks: np.ndarray | None = None,
    ) -> None:
        shared_size = program.shared_size(dynamic_shared)
        super().__init__(
            program.name,
            program.slots.types,
            grid,
            block,
            first_block,
            nblocks,
            (dynamic_shared, shared_size),
            self._symbol_value,
            blocks,
        )
        self._imms = program.immediates(self.n)  # broadcast by earlier batches already
        self.program = program
        self.glob = memory
        self.params = params
        stride = BlockMemory("shared", 0, shared_size, None).stride
        tracker = (
            RaceTracker(
                nblocks,
                stride,
                self.per_block,
                self.describe_thread,
                program.warp_syncs,
                program.bulk_stores,
            )
            if race_check and shared_size
            else None
        )
        self.shared = BlockMemory("shared", nblocks, shared_size, tracker)
        self.local = BlockMemory("local", self.n if program.local_size else 0,
                                 program.local_size, None)  # fmt: skip
        self.async_copies: AsyncCopies | None = None  # made by the first cp.async
        self.barriers: Barriers | None = None  # made by the first bulk tensor load
        self.named_barriers: NamedBarriers | None = None  # made by the first partial arrival
        #: Set by an `mbarrier` wait: whether it failed for every lane that ran it, and
        #: (lane, shared offset, parity waited for) of the first such lane.
        self.wait_failed = False
        self.failed_wait: tuple[int, int, int] = (0, 0, 0)
        self.wgmma: Wgmma | None = None  # made by the first wgmma
        #: The launch's global-memory race detector (None: not checking).
        self.global_races: GlobalRaces | None = None
        #: The order of warps at stores and atomics (None: lane order).
        self.schedule: Schedule | None = None

    # -- addresses ------------------------------------------------------------------------------
    def symbol_address(self, name: str, generic: bool) -> int:
        """The address of variable or parameter `name`, in its space (or generic)."""
        prog = self.program
        if name in prog.param_offsets:
            off, space = prog.param_offsets[name], "param"
        elif name in prog.shared_offsets:
            off, space = prog.shared_offsets[name], "shared"
        elif name in prog.local_offsets:
            off, space = prog.local_offsets[name], "local"
        elif name in prog.global_addresses:
            return prog.global_addresses[name]
        else:
            self.fail(f"{name} is not a variable or parameter of this kernel")
        return WINDOWS[space] + off if generic else off

    def _symbol_value(self, op: Symbol, ptype: str) -> np.ndarray:
        arr = np.full(self.n, self.symbol_address(op.name, generic=False), dtype=np.uint64)
        want = PTYPE_DTYPE[ptype]
        return arr.view(want) if want.itemsize == 8 else arr.astype(UINT[want.itemsize]).view(want)

    def addresses(self, op: Addr, lanes: np.ndarray, generic: bool) -> np.ndarray:
        """The address `op` denotes for each lane in `lanes` (uint64, wrapping)."""
        off = U64(op.offset % (1 << 64))
        base = op.base
        if base is None:
            return np.full(lanes.size, off, dtype=np.uint64)
        if isinstance(base, Symbol):
            a = (self.symbol_address(base.name, generic) + op.offset) % (1 << 64)
            return np.full(lanes.size, a, dtype=np.uint64)
        assert isinstance(base, Reg)
        regs = self.read(base, "u64")
        vals = regs if lanes is self.ids else regs[lanes]
        return vals + off if op.offset else vals

    # -- accesses -------------------------------------------------------------------------------
    def _split_generic(self, addrs: np.ndarray) -> list[tuple[str, np.ndarray | None]]:
        """Positions of generic addresses in each space; (space, None) when all in one.

        Addresses outside every window are global (and fault there if nothing lives there).
        """
        high = addrs >= U64(SHARED_WINDOW)
        if not high.any():
            return [("global", None)]
        out: list[tuple[str, np.ndarray | None]] = []
        is_global = np.ones(addrs.shape, dtype=bool)
        for space, window in WINDOWS.items():
            inside = (addrs >= U64(window)) & (addrs < U64(window + WINDOW_SPAN))
            if inside.all():
                return [(space, None)]
            if inside.any():
                out.append((space, np.flatnonzero(inside)))
                is_global &= ~inside
        if is_global.any():
            out.append(("global", np.flatnonzero(is_global)))
        return out

    def load(
        self, space: str, lanes: np.ndarray, addrs: np.ndarray, esize: int, nvec: int
    ) -> np.ndarray:
        """(len(lanes), nvec) unsigned `esize`-byte values read at `addrs`."""
        check_aligned(lanes, addrs, esize * nvec, f"{space or 'generic'} load")
        if space == "":
            parts = self._split_generic(addrs)
            if len(parts) == 1 and parts[0][1] is None:
                space = parts[0][0]
                addrs = addrs - U64(WINDOWS[space]) if space in WINDOWS else addrs
            else:
                out = np.empty((addrs.size, nvec), dtype=UINT[esize])
                for sp, pos in parts:
                    assert pos is not None
                    sub = addrs[pos] - U64(WINDOWS[sp]) if sp in WINDOWS else addrs[pos]
                    out[pos] = self.load(sp, lanes[pos], sub, esize, nvec)
                return out
        if space in ("global", "const"):
            vals = self.glob.load(lanes, addrs, esize, nvec)
            if self.global_races is not None and space == "global":
                self.global_races.access(self.instr, lanes, addrs, esize * nvec, False)
            return vals
        if space == "shared":
            return self.shared.load(lanes, self.slot[lanes], addrs, esize, nvec)
        if space == "local":
            return self.local.load(lanes, lanes, addrs, esize, nvec)
        if space == "param":
            return self.params.load(lanes, addrs, esize, nvec)
        raise SimError(f"unknown state space {space!r}")

    def store(
        self, space: str, lanes: np.ndarray, addrs: np.ndarray, esize: int, values: np.ndarray
    ) -> None:
        """Write `values` ((len(lanes), nvec) unsigned) at `addrs`."""
        self.writes += 1
        check_aligned(lanes, addrs, esize * values.shape[1], f"{space or 'generic'} store")
        if space == "":
            parts = self._split_generic(addrs)
            for sp, pos in parts:
                sub = addrs if pos is None else addrs[pos]
                if sp in WINDOWS:
                    sub = sub - U64(WINDOWS[sp])
                if pos is None:
                    self.store(sp, lanes, sub, esize, values)
                else:
                    self.store(sp, lanes[pos], sub, esize, values[pos])
            return
        if self.schedule is not None and space in ("global", "shared"):
            order = self.schedule.warp_order(lanes)
            if order is not None:  # the last store to an address lands: the seed picks it
                lanes, addrs, values = lanes[order], addrs[order], values[order]
        if space == "global":
            self.glob.store(lanes, addrs, esize, values)
            if self.global_races is not None:
                raw = np.ascontiguousarray(values).view(np.uint8)
                self.global_races.access(self.instr, lanes, addrs, raw.shape[1], True, raw)
        elif space == "shared":
            self.shared.store(lanes, self.slot[lanes], addrs, esize, values)
        elif space == "local":
            self.local.store(lanes, lanes, addrs, esize, values)
        else:
            raise MemoryFault(int(lanes[0]) if lanes.size else 0, f"store to {space} space")

    def elements(
        self, space: str, lanes: np.ndarray, addrs: np.ndarray, esize: int
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """For read-modify-write (atomics): (element view, element indices, positions)."""
        self.writes += 1
        check_aligned(lanes, addrs, esize, f"{space or 'generic'} atomic")
        if space == "":
            out = []
            for sp, pos in self._split_generic(addrs):
                sub = addrs if pos is None else addrs[pos]
                if sp in WINDOWS:
                    sub = sub - U64(WINDOWS[sp])
                for view, idx, p in self.elements(sp, lanes if pos is None else lanes[pos],
                                                  sub, esize):  # fmt: skip
                    out.append((view, idx, pos if p is None else (p if pos is None else pos[p])))
            return out
        if space == "shared":
            flat = self.shared.flat(lanes, self.slot[lanes], addrs, esize, "atomic")
            return [(self.shared.view(esize), (flat // U64(esize)).astype(np.intp), None)]
        if space != "global":
            raise MemoryFault(int(lanes[0]), f"atomics on {space} space are not supported")
        out = []
        for a, pos in self.glob.locate(lanes, addrs, esize, "atomic"):
            if a.readonly:
                raise MemoryFault(int(lanes[0]), f"atomic on the read-only {a.name}")
            sub = addrs if pos is None else addrs[pos]
            out.append((a.view(esize), ((sub - U64(a.start)) // U64(esize)).astype(np.intp), pos))
        return out
