"""Global-memory race detection over one launch: two threads touch one address, at least one
of them writing, and nothing orders the two accesses.

Threads of different blocks are ordered only by release and acquire through an atomic: a
thread's gpu-scope fence (`__threadfence()`: membar.gl, fence.sc/acq_rel.gpu) followed by its
atomic on an address (or an atomic with .release/.acq_rel) publishes what the thread did before
the fence, and what its block did before the block's last bar.sync preceding it; an `atom` of
another block on that address acquires what was published there so far, for its own thread at
once and for the rest of its block after the block's next bar.sync (a "last block done"
reduction: partials, fence, counter). Acquisitions are not passed on (no transitivity), and
readers in several blocks cannot be ordered before a write. Every other pair of accesses of
two blocks to one byte with a write among them is a race.

Inside a block (INSIDE_BLOCKS) a write of a word another thread of the block wrote, and a read
of a word a thread of another warp of the block wrote, with no `bar.sync` between (for two
writes in one warp: or `bar.warp.sync`) are races. Not reported: a read of what another lane of
its own warp wrote, and a write of a word other threads of the block read. Tile layouts that
replicate elements do both: every replica reads the element its owner (a lane of the same
warp) wrote, or then rewrites, and the replicas' values are never stored (`k_chunks` in
tests/test_tile_language.py). Lanes of one store writing equal values to one address are no
race; different values are.

Shadow state exists only for the allocations a launch touches, made on first access, with one
entry per granule (the narrowest access seen: an f32 tensor gets one per 4 bytes; a narrower
access later refines it by repetition). An entry holds the last writer and the last reader(s)
with the launch clock of the access; the clock ticks at every tracked access and barrier, and
`events[t]` is the instruction of tick t, so a report names both accesses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cutile_py.ptx.ast import Instruction
from cutile_py.sim.context import WARP
from cutile_py.sim.memory import Allocation, GlobalMemory
from cutile_py.sim.races import RaceFault

NONE = -1
#: Which pairs of accesses inside one block are checked (the module's docstring says why).
INSIDE_BLOCKS = "write-write, read-after-write across warps"
#: Readers in several blocks: no later write is ordered after all of them.
MANY_BLOCKS = -2
#: `IN_BLOCK - b`: several threads of block b read (the latest at the entry's clock).
IN_BLOCK = -3


class Shadow:
    """Access history of one allocation, one entry per `granule` bytes."""

    def __init__(self, nbytes: int, granule: int, who: type[np.signedinteger[Any]]) -> None:
        n = -(-nbytes // granule)
        self.nbytes = nbytes
        self.granule = granule
        # Threads as `who` (int32 unless the launch has 2**31 of them); int32 clocks: a
        # launch the simulator finishes makes fewer ticks.
        self.writer = np.full(n, NONE, dtype=who)
        self.wtime = np.zeros(n, dtype=np.int32)
        self.reader = np.full(n, NONE, dtype=who)
        self.rtime = np.zeros(n, dtype=np.int32)

    def refine(self, granule: int) -> None:
        """Entries of `granule` bytes (a divisor of the current one), each a copy of its old
        entry."""
        k = self.granule // granule
        n = -(-self.nbytes // granule)
        for name in ("writer", "wtime", "reader", "rtime"):
            setattr(self, name, np.repeat(getattr(self, name), k)[:n])
        self.granule = granule


class Releases:
    """The releases made at one address, numbered in order: by thread, (number, fence clock),
    and by block, (number, the block's last bar.sync clock at the fence)."""

    def __init__(self) -> None:
        self.count = 0
        self.by_thread: dict[int, list[tuple[int, int]]] = {}
        self.by_block: dict[int, list[tuple[int, int]]] = {}

    def add(self, who: int, block: int, fence: int, barrier: int) -> None:
        self.by_thread.setdefault(who, []).append((self.count, fence))
        self.by_block.setdefault(block, []).append((self.count, barrier))
        self.count += 1

    def covers(self, other: int, block: int, when: int, upto: int) -> bool:
        """Whether one of the first `upto` releases publishes an access at clock `when` by
        thread `other` (-1: a thread unknown) of `block`: its own fence after it, or a
        release of its block whose preceding bar.sync came after it."""
        mine = self.by_thread.get(other, ()) if other >= 0 else ()
        return any(n < upto and when < f for n, f in mine) or any(
            n < upto and when < bar for n, bar in self.by_block.get(block, ())
        )


class GlobalRaces:
    """The race detector's view of one launch's global memory (kept across its batches)."""

    def __init__(
        self, memory: GlobalMemory, grid: tuple[int, int, int], block: tuple[int, int, int]
    ) -> None:
        self.memory = memory
        self.grid, self.block = grid, block
        self.per_block = -(-block[0] * block[1] * block[2] // WARP) * WARP
        blocks = grid[0] * grid[1] * grid[2]
        small = blocks * self.per_block < 2**31 and blocks - IN_BLOCK < 2**31
        self.who_type: type[np.signedinteger[Any]] = np.int32 if small else np.int64
        self.shadows: dict[int, Shadow] = {}
        self.events: list[Instruction | None] = []
        #: Clock of each batch slot's last bar.sync, and of each batch warp's last
        #: bar.warp.sync (-1: none yet).
        self.last_barrier = np.zeros(0, dtype=np.int64)
        self.last_warp_sync = np.zeros(0, dtype=np.int64)
        #: Per address of an atomic: the releases made there, in order.
        self.releases: dict[int, Releases] = {}
        #: Per batch slot: (acquiring thread, clock, address, how many of the address's
        #: releases it acquired: a prefix, never a copy).
        self.acquired: dict[int, list[tuple[int, int, int, int]]] = {}
        self.fenced = np.zeros(0, dtype=np.int64)
        self.fence_bar = np.zeros(0, dtype=np.int64)

    def start_batch(self, block_ids: np.ndarray) -> None:
        """A batch runs the blocks `block_ids` (linear indices), one per slot."""
        nblocks = block_ids.size
        #: Each batch lane's thread number in the launch (block * per_block + thread).
        self.who = (
            np.repeat(block_ids * self.per_block, self.per_block)
            + np.tile(np.arange(self.per_block), nblocks)
        ).astype(self.who_type)
        self.last_barrier = np.full(nblocks, -1, dtype=np.int64)
        self.last_warp_sync = np.full(nblocks * self.per_block // WARP, -1, dtype=np.int64)
        #: Each batch lane's last gpu-scope fence (-1: none), and its block's last bar.sync
        #: then.
        self.fenced = np.full(nblocks * self.per_block, -1, dtype=np.int64)
        self.fence_bar = np.full(nblocks * self.per_block, -1, dtype=np.int64)
        self.acquired = {}

    def _tick(self, ins: Instruction | None) -> int:
        self.events.append(ins)
        return len(self.events) - 1

    def barrier(self, slots: np.ndarray) -> None:
        """`bar.sync` completed by the batch's blocks `slots`."""
        self.last_barrier[slots] = self._tick(None)

    def warp_barrier(self, lanes: np.ndarray) -> None:
        """`bar.warp.sync` by batch lanes `lanes`."""
        self.last_warp_sync[np.unique(lanes // WARP)] = self._tick(None)

    def fence(self, ins: Instruction, lanes: np.ndarray) -> None:
        """A gpu-scope fence by batch lanes `lanes`."""
        self.fenced[lanes] = self._tick(ins)
        self.fence_bar[lanes] = self.last_barrier[lanes // self.per_block]

    def atomic(
        self, ins: Instruction, lanes: np.ndarray, addrs: np.ndarray, acquire: bool, release: bool
    ) -> None:
        """An atomic by batch lanes `lanes` at `addrs`: it acquires (an `atom`, which reads)
        what other threads released at its address, and releases (with `release`, or after
        a fence of the lane) what its lane did before."""
        if lanes.size == 0:
            return
        now = self._tick(ins)
        if release:
            when, bar = np.full(lanes.size, now), self.last_barrier[lanes // self.per_block]
        else:
            when, bar = self.fenced[lanes], self.fence_bar[lanes]
        releasing = when >= 0
        if not releasing.any() and not (acquire and self.releases):
            return
        # Lanes serialize in the order given: each acquires what the lanes before it released.
        keys = {*self.releases, *addrs[releasing].tolist()}
        touched = np.isin(addrs, np.fromiter(keys, np.uint64, len(keys)))
        for k in np.flatnonzero(touched & (releasing | acquire)):
            address, lane = int(addrs[k]), int(lanes[k])
            who = int(self.who[lane])
            got = self.releases.get(address)
            if acquire and got is not None:
                slot = lane // self.per_block
                self.acquired.setdefault(slot, []).append((who, now, address, got.count))
            if releasing[k]:
                if got is None:
                    got = self.releases[address] = Releases()
                got.add(who, who // self.per_block, int(when[k]), int(bar[k]))

    def _acquired(
        self, bad: np.ndarray, other: np.ndarray, when: np.ndarray, lane: np.ndarray
    ) -> np.ndarray:
        """Which of the `bad` pairs an acquisition orders: the access of `other` (a thread,
        or IN_BLOCK code) at clock `when` was published where this lane's block acquired,
        and the acquisition reaches this lane (its own, or a bar.sync of its block since)."""
        ordered = np.zeros(bad.shape, dtype=bool)
        for k in np.flatnonzero(bad):
            o, t = int(other[k]), int(when[k])
            if o == MANY_BLOCKS:
                continue
            oblock = o // self.per_block if o >= 0 else IN_BLOCK - o
            slot = int(lane[k]) // self.per_block
            me = int(self.who[lane[k]])
            for u, at, address, upto in self.acquired.get(slot, ()):
                if u != me and self.last_barrier[slot] <= at:
                    continue
                if self.releases[address].covers(o, oblock, t, upto):
                    ordered[k] = True
                    break
        return ordered

    # -- accesses -------------------------------------------------------------------------------
    def access(
        self,
        ins: Instruction,
        lanes: np.ndarray,
        addrs: np.ndarray,
        span: int,
        write: bool,
        values: np.ndarray | None = None,
    ) -> None:
        """Record accesses of `span` bytes at `addrs[i]` by batch lane `lanes[i]` (already
        made, so every address is inside an allocation); a store passes its bytes,
        (len(lanes), span) uint8."""
        if lanes.size == 0:
            return
        now = self._tick(ins)
        what = "store" if write else "load"
        for alloc, pos in self.memory.locate(lanes, addrs, span, what):
            if pos is None:
                self._access(alloc, now, lanes, addrs, span, write, values)
            else:
                vals = None if values is None else values[pos]
                self._access(alloc, now, lanes[pos], addrs[pos], span, write, vals)

    def _shadow(self, alloc: Allocation, span: int) -> Shadow:
        # A power of two dividing the span (a cp.async may copy 12 bytes) and the start.
        granule = span & -span
        while alloc.start % granule:
            granule //= 2
        sh = self.shadows.get(alloc.start)
        if sh is None:
            sh = self.shadows[alloc.start] = Shadow(int(alloc.data.size), granule, self.who_type)
        elif granule < sh.granule:
            sh.refine(granule)
        return sh

    def _access(
        self,
        alloc: Allocation,
        now: int,
        lanes: np.ndarray,
        addrs: np.ndarray,
        span: int,
        write: bool,
        values: np.ndarray | None,
    ) -> None:
        sh = self._shadow(alloc, span)
        g = sh.granule
        per = span // g
        # Granules are powers of two; offsets are far below 2**63, so the int64 view holds.
        shift = np.uint64(g.bit_length() - 1)
        first = ((addrs - np.uint64(alloc.start)) >> shift).view(np.int64)
        if per == 1:
            idx, lane = first, lanes
        else:
            idx = (first[:, None] + np.arange(per, dtype=np.intp)).ravel()
            lane = np.repeat(lanes, per)
        who = self.who[lane]
        # Lanes touching consecutive granules in order (the usual case) make the shadow
        # accesses slices, and no two lanes can share a granule.
        lo, n = int(idx[0]), idx.size
        sel: slice | np.ndarray = idx
        runs = int(idx[-1]) - lo + 1 == n and (n == 1 or bool((idx[1:] - idx[:-1] == 1).all()))
        if runs:
            sel = slice(lo, lo + n)
        w = sh.writer[sel]
        seen = w != NONE
        if seen.any():
            block = who // self.per_block
            slot = lane // self.per_block
            bad = seen & (w != who) & ~self._ordered(w, sh.wtime[sel], who, slot, lane)
            if not write:  # see INSIDE_BLOCKS: a read is checked against other warps' writes
                bad &= (w // WARP) != (who // WARP)
            if bad.any() and self.acquired:
                bad &= ~self._acquired(bad, w, sh.wtime[sel], lane)
            if bad.any():
                k = int(np.argmax(bad))
                self._fail(alloc, lane, idx, g, k, write, int(w[k]), int(sh.wtime[sel][k]), True)
        r = sh.reader[sel]
        if write:
            seen = r != NONE
            if seen.any():
                rt = sh.rtime[sel]
                block = who // self.per_block
                rblock = np.where(r >= 0, r // self.per_block, IN_BLOCK - r)
                bad = seen & (r != who) & ((r == MANY_BLOCKS) | (rblock != block))  # INSIDE_BLOCKS
                if bad.any() and self.acquired:
                    bad &= ~self._acquired(bad, r, rt, lane)
                if bad.any():
                    k = int(np.argmax(bad))
                    self._fail(alloc, lane, idx, g, k, True, int(r[k]), int(rt[k]), False)
                sh.reader[sel] = NONE
            sh.writer[sel] = who
            sh.wtime[sel] = now
            if not runs and (sh.writer[idx] != who).any():
                assert values is not None
                self._same_store(alloc, lane, idx, g, values.reshape(idx.size, -1))
            return
        if (r == NONE).all():
            new = who
        else:
            rt = sh.rtime[sel]
            block = who // self.per_block
            slot = lane // self.per_block
            rblock = np.where(r >= 0, r // self.per_block, IN_BLOCK - r)
            mine = (r != MANY_BLOCKS) & (rblock == block)
            replace = (r == NONE) | (r == who) | (mine & self._ordered(r, rt, who, slot, lane))
            new = np.where(replace, who, np.where(mine, IN_BLOCK - block, MANY_BLOCKS))
        sh.reader[sel] = new
        sh.rtime[sel] = now
        if runs:
            return
        got = sh.reader[idx]
        lost = got != new
        if lost.any():
            # Several lanes of this load read one granule: all of them are its readers now.
            li, gw, nw = idx[lost], got[lost], new[lost]
            gb = np.where(gw >= 0, gw // self.per_block, IN_BLOCK - gw)
            nb = np.where(nw >= 0, nw // self.per_block, IN_BLOCK - nw)
            same = (gb == nb) & (gw != MANY_BLOCKS) & (nw != MANY_BLOCKS)
            sh.reader[li[same]] = IN_BLOCK - nb[same]
            sh.reader[li[~same]] = MANY_BLOCKS

    def _ordered(
        self, other: np.ndarray, when: np.ndarray, who: np.ndarray, slot: np.ndarray,
        lane: np.ndarray,
    ) -> np.ndarray:  # fmt: skip
        """Whether the access of thread `other` (a single thread or IN_BLOCK code) at clock
        `when` happened before this one of `who`: same block and a barrier in between."""
        ob = np.where(other >= 0, other // self.per_block, IN_BLOCK - other)
        block = who // self.per_block
        same = (other != MANY_BLOCKS) & (ob == block)
        synced = self.last_barrier[slot] > when
        warp = (other >= 0) & (other // WARP == who // WARP)
        warp_synced = warp & (self.last_warp_sync[lane // WARP] > when)
        out: np.ndarray = same & (synced | warp_synced)
        return out

    # -- reports --------------------------------------------------------------------------------
    def _block_name(self, b: int) -> str:
        gx, gy, _ = self.grid
        return f"({b % gx}, {(b // gx) % gy}, {b // (gx * gy)})"

    def _thread_name(self, who: int) -> str:
        t = who % self.per_block
        bx, by, _ = self.block
        where = f"({t % bx}, {(t // bx) % by}, {t // (bx * by)})"
        return f"block {self._block_name(who // self.per_block)} thread {where}"

    def _where(self, alloc: Allocation, granule: int, index: int) -> str:
        off = index * granule
        return (
            f"global address {alloc.start + off:#x} (byte {off} of the "
            f"{alloc.data.size}-byte {alloc.name} at {alloc.start:#x})"
        )

    def _fail(
        self, alloc: Allocation, lane: np.ndarray, idx: np.ndarray, granule: int, k: int,
        write: bool, other: int, when: int, other_wrote: bool,
    ) -> None:  # fmt: skip
        mine = int(self.who[lane[k]]) // self.per_block
        if other >= 0:
            them = self._thread_name(other)
            same = other // self.per_block == mine
        elif other == MANY_BLOCKS:
            them, same = "threads of several blocks", False
        else:
            them = f"several threads of block {self._block_name(IN_BLOCK - other)}"
            same = IN_BLOCK - other == mine
        ins = self.events[when]
        at = f" at PTX line {ins.line} `{ins.text}`" if ins is not None else ""
        why = (
            "with no bar.sync between the two accesses"
            if same
            else "from another block of the launch, and nothing orders the two (blocks are "
            "ordered only by a fence and an atomic one makes and the other's atomic sees)"
        )
        raise RaceFault(
            int(lane[k]),
            f"global-memory race: this thread {'writes' if write else 'reads'} "
            f"{self._where(alloc, granule, int(idx[k]))}, which {them} "
            f"{'wrote' if other_wrote else 'read'}{at}, {why}",
        )

    def _same_store(
        self, alloc: Allocation, lane: np.ndarray, idx: np.ndarray, granule: int,
        values: np.ndarray,
    ) -> None:  # fmt: skip
        """Several lanes of one store hit one granule: a race only where their bytes differ."""
        order = np.argsort(idx, kind="stable")
        i, v = idx[order], values[order]
        clash = (i[1:] == i[:-1]) & (v[1:] != v[:-1]).any(axis=1)
        if not clash.any():
            return
        at = i[int(np.argmax(clash)) + 1]
        group = order[np.flatnonzero(i == at)]  # in lane order: the sort is stable
        a = int(group[0])
        z = int(group[np.argmax((values[group] != values[a]).any(axis=1))])
        other = int(self.who[lane[z]])
        raise RaceFault(
            int(lane[a]),
            f"global-memory race: this thread and {self._thread_name(other)} write different "
            f"values to {self._where(alloc, granule, int(at))} in one instruction",
        )
