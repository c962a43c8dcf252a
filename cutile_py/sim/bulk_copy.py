"""`cp.async.bulk.tensor` (the Tensor Memory Accelerator, PTX ISA §9.7.9.25): boxes of a
tensor copied between global and shared memory, described by a tensor map
(`cutile_py.sim.tensor_map`); and `cp.async.bulk` (§9.7.9.24), contiguous bytes, which
land and complete as the tensor forms do.

A load (global → shared) reads global memory when it is issued (a bad tensor map or box is
reported at its line) and lands in shared memory when a thread of the block tests or waits
on the barrier it signals (`cutile_py.sim.mbarrier`). The box is written densely, dimension
0 innermost; out-of-bounds elements are zero (or NaN, as the map asks); with a swizzled map,
16-byte chunk c of each `span`-byte row at shared address a goes to chunk
`c ^ ((a >> 7) & (span/16 - 1))`, the pattern `wgmma` descriptors read back.

A store (shared → global, `.bulk_group`) checks its map and box when issued and reads its
shared source at the `cp.async.bulk.wait_group{.read}` that retires its group
(`cutile_py.sim.bulk_stores`: a write to that source in between is reported); elements
outside the tensor are not written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cutile_py.ptx.ast import Addr, Imm, Instruction, Operand, Reg, Symbol, Vec
from cutile_py.sim.bulk_stores import _Store, stores_of
from cutile_py.sim.context import SimError
from cutile_py.sim.mbarrier import Delivery, barriers_of, shared_offsets
from cutile_py.sim.memops import _address, unsupported
from cutile_py.sim.memory import MemoryFault
from cutile_py.sim.tensor_map import FLOATS, SIZE, TensorMap, decode

if TYPE_CHECKING:
    from collections.abc import Callable

    from cutile_py.sim.program import Handler, Program
    from cutile_py.sim.spaces import Batch

_NAN = {2: 0x7FFF, 4: 0x7FFFFFFF, 8: 0x7FFFFFFFFFFFFFFF}


def swizzle(offs: np.ndarray, span: int) -> np.ndarray:
    """Shared addresses `offs` under the `span`-byte swizzle (32, 64 or 128; 0: none): the
    16-byte chunk bits [4, 4 + log2(span/16)) XOR the same number of bits from bit 7."""
    if not span:
        return offs
    mask = np.uint64(span // 16 - 1)
    out: np.ndarray = offs ^ (((offs >> np.uint64(7)) & mask) << np.uint64(4))
    return out


def make_bulk(ins: Instruction, prog: Program) -> Handler:
    """`cp.async.bulk.tensor.{1..5}d` loads and stores, their non-tensor forms (contiguous
    bytes), `cp.async.bulk.commit_group` and `wait_group{.read}`, and
    `cp.async.bulk.prefetch{.tensor}` (a hint)."""
    mods = ins.modifiers
    if "prefetch" in mods:
        return lambda b: None  # a hint
    if "commit_group" in mods:
        return lambda b: stores_of(b).commit(b.mask)
    if "wait_group" in mods:
        n = ins.operands[0] if ins.operands else None
        if not isinstance(n, Imm) or not isinstance(n.value, int):
            raise unsupported(ins, "cp.async.bulk.wait_group needs an integer immediate")
        keep = int(n.value)

        def wait(b: Batch) -> None:
            b.writes += 1
            stores_of(b).wait(b, b.mask, keep)

        return wait
    if "tensor" not in mods:
        return _make_plain(ins)
    rank = next((int(m[0]) for m in mods if len(m) == 2 and m[1] == "d" and m[0] in "12345"), 0)
    if not rank:
        raise unsupported(ins, "cp.async.bulk.tensor needs .1d to .5d")
    if any(m.startswith(("multicast", "im2col", "tile::gather", "tile::scatter")) for m in mods):
        raise unsupported(ins, "multicast, im2col and gather/scatter modes are not supported")
    spaces = [m for m in mods if m.split("::")[0] in ("global", "shared")]
    if len(spaces) != 2:
        raise unsupported(ins, "cp.async.bulk.tensor names its destination and source spaces")
    if spaces[0] == "global":  # destination first: a store
        tmap, coords = _tensor_operand(ins, 0, rank)
        return _make_store(ins, tmap, coords, rank, _address(ins, 1))
    if "mbarrier::complete_tx::bytes" not in mods:
        raise unsupported(ins, "a tensor load must signal a barrier (mbarrier::complete_tx::bytes)")
    tmap, coords = _tensor_operand(ins, 1, rank)
    return _make_load(ins, tmap, coords, rank, _address(ins, 0), _address(ins, 2))


def _tensor_operand(ins: Instruction, k: int, rank: int) -> tuple[Operand, tuple[Operand, ...]]:
    op = ins.operands[k] if len(ins.operands) > k else None
    if (
        isinstance(op, Vec)
        and len(op.items) == 2
        and isinstance(op.items[0], (Reg, Symbol))
        and isinstance(op.items[1], Vec)
    ):
        if len(op.items[1].items) != rank:
            raise unsupported(ins, f"a .{rank}d copy needs {rank} coordinates")
        return op.items[0], op.items[1].items
    raise unsupported(ins, f"operand {k + 1} must be `[tensorMap, {{coordinates}}]`")


def _make_plain(ins: Instruction) -> Handler:
    """`cp.async.bulk.shared::{cta,cluster}.global.mbarrier::complete_tx::bytes [dst], [src],
    size, [mbar]` and `cp.async.bulk.global.shared::cta.bulk_group [dst], [src], size`:
    `size` contiguous bytes (a multiple of 16, both addresses 16-byte aligned)."""
    mods = ins.modifiers
    if any(m.startswith(("multicast", "cp_mask", "L2::cache_hint")) for m in mods):
        raise unsupported(ins, "multicast, byte masks and cache hints are not supported")
    spaces = [m for m in mods if m.split("::")[0] in ("global", "shared")]
    if len(spaces) != 2 or len(ins.operands) < 3:
        raise unsupported(ins, "cp.async.bulk names its destination and source spaces")
    dst, src, size = _address(ins, 0), _address(ins, 1), ins.operands[2]
    store = spaces[0] == "global"
    if store and "bulk_group" not in mods:
        raise unsupported(ins, "a bulk store completes through .bulk_group")
    if not store and (
        spaces[0] not in ("shared::cta", "shared::cluster")
        or "mbarrier::complete_tx::bytes" not in mods
        or len(ins.operands) < 4
    ):
        raise unsupported(ins, "a bulk load goes to shared memory and signals a barrier "
                          "(mbarrier::complete_tx::bytes)")  # fmt: skip
    mbar = None if store else _address(ins, 3)

    def run(b: Batch) -> None:
        lanes = b.active()
        if not lanes.size:
            return
        sizes = b.read(size, "u32")[lanes].astype(np.int64)
        shared_op, global_op = (src, dst) if store else (dst, src)
        soffs = b.addresses(shared_op, lanes, False)
        gaddrs = b.addresses(global_op, lanes, True)
        bad = (sizes % 16 != 0) | (soffs % np.uint64(16) != 0) | (gaddrs % np.uint64(16) != 0)
        if bad.any():
            k = int(np.argmax(bad))
            raise MemoryFault(int(lanes[k]), f"bulk copy of {int(sizes[k])} bytes between "
                              f"{int(gaddrs[k]):#x} and shared {int(soffs[k]):#x}: size and "
                              "addresses must be multiples of 16")  # fmt: skip
        bars = None if mbar is None else shared_offsets(b, ins, mbar, lanes)
        for i, lane in enumerate(lanes.tolist()):
            n = int(sizes[i])
            if not n:
                continue
            who = np.full(n, lane, dtype=np.int64)
            at = np.uint64(gaddrs[i]) + np.arange(n, dtype=np.uint64)
            one = np.full(1, lane, dtype=np.int64)
            base = b.shared.flat(one, b.slot[one], soffs[i : i + 1], n, "bulk copy")
            flat = (int(base[0]) + np.arange(n)).astype(np.intp)
            if store:
                if b.shared.tracker is not None:  # the copy engine reads: fenced, ordered
                    b.shared.tracker.access(one, base, n, write=False)
                    b.shared.tracker.bulk_store_read(lane, flat)
                stores_of(b).issue(_Store(lane, flat, 1, at, np.arange(n), b.instr.line))
            else:
                assert bars is not None
                data = b.glob.load(who, at, 1, 1)[:, 0].copy()
                if b.global_races is not None:
                    b.global_races.access(b.instr, who, at, 1, False)
                bar = int(b.slot[lane]) * b.shared.stride + int(bars[i])
                barriers_of(b).pending.append(Delivery(bar, n, _lander(b, flat, data)))
        b.writes += 1

    return run


def _maps(b: Batch, tmap: Operand, lanes: np.ndarray) -> list[TensorMap]:
    if isinstance(tmap, Symbol):
        addrs = b.addresses(Addr(tmap, 0), lanes, True)
    else:
        addrs = b.read(tmap, "u64")[lanes]
    if (addrs % np.uint64(64)).any():
        k = int(np.argmax(addrs % np.uint64(64) != 0))
        raise MemoryFault(int(lanes[k]), f"tensor map at {int(addrs[k]):#x} is not 64-byte aligned")
    words = SIZE // 8  # read as 8-byte words: one 128-byte access would need 128-byte alignment
    at = (addrs[:, None] + np.arange(0, SIZE, 8, dtype=np.uint64)).ravel()
    raw = b.load("", np.repeat(lanes, words), at, 8, 1).reshape(lanes.size, words)
    out = []
    for i in range(lanes.size):
        try:
            out.append(decode(raw[i].tobytes()))
        except SimError as e:
            raise MemoryFault(int(lanes[i]), str(e)) from None
    return out


def _box(m: TensorMap, rank: int, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Global byte address of each box element (dimension 0 fastest) and whether it is in
    the tensor."""
    if len(m.dims) != rank:
        raise SimError(f"a .{rank}d copy with a tensor map of rank {len(m.dims)}")
    grids = np.meshgrid(*[np.arange(n, dtype=np.int64) for n in reversed(m.box)], indexing="ij")
    addr = np.full(grids[0].shape, m.address, dtype=np.int64)
    inside = np.ones(grids[0].shape, dtype=bool)
    for d in range(rank):
        c = grids[rank - 1 - d] + int(start[d])
        inside &= (c >= 0) & (c < m.dims[d])
        addr += c * m.strides[d]
    return addr.ravel(), inside.ravel()


def _smem_bytes(b: Batch, lane: int, dst: int, m: TensorMap) -> np.ndarray:
    """Flat byte indices in the batch's shared memory of the box's bytes, in box order."""
    if dst % 128:
        raise MemoryFault(lane, f"bulk tensor copy at shared address {dst:#x}: "
                          "not 128-byte aligned")  # fmt: skip
    if m.swizzle and m.box[0] * m.esize != m.swizzle:
        raise MemoryFault(lane, f"a {m.swizzle}-byte swizzled box must have {m.swizzle}-byte "
                          f"rows (boxDim[0] = {m.box[0]})")  # fmt: skip
    n = m.box_bytes
    offs = swizzle(np.uint64(dst) + np.arange(n, dtype=np.uint64), m.swizzle)
    lanes = np.full(1, lane, dtype=np.int64)
    b.shared.flat(lanes, b.slot[lanes], np.array([dst], np.uint64), n, "bulk tensor copy")
    flat: np.ndarray = np.uint64(int(b.slot[lane]) * b.shared.stride) + offs
    return flat.astype(np.intp)


def _issued(
    b: Batch, tmap: Operand, coords: tuple[Operand, ...], rank: int
) -> tuple[np.ndarray, list[tuple[TensorMap, np.ndarray, np.ndarray]]]:
    """The issuing lanes, and for each its tensor map, its box's global byte addresses and
    which of them lie in the tensor."""
    lanes = b.active()
    if not lanes.size:
        return lanes, []
    maps = _maps(b, tmap, lanes)
    start = np.stack([b.read(c, "s32")[lanes].astype(np.int64) for c in coords], axis=1)
    return lanes, [(m, *_box(m, rank, start[i])) for i, m in enumerate(maps)]


def _make_load(
    ins: Instruction, tmap: Operand, coords: tuple[Operand, ...], rank: int, dst: Addr,
    mbar: Addr,
) -> Handler:  # fmt: skip

    # Imported here: wgmma imports this module's swizzle.
    from cutile_py.sim.wgmma import pending_reads

    def run(b: Batch) -> None:
        lanes, boxes = _issued(b, tmap, coords, rank)
        if not boxes:
            return
        dsts = b.addresses(dst, lanes, False)
        bars = shared_offsets(b, ins, mbar, lanes)
        pending = barriers_of(b).pending
        for i, (lane, (m, addr, inside)) in enumerate(zip(lanes.tolist(), boxes)):
            fill = _NAN[m.esize] if m.nan_fill and m.dtype in FLOATS else 0
            vals = np.full(addr.size, fill, dtype=f"u{m.esize}")
            if inside.any():
                got = np.flatnonzero(inside)
                who = np.full(got.size, lane, dtype=np.int64)
                at = addr[got].astype(np.uint64)
                vals[got] = b.glob.load(who, at, m.esize, 1)[:, 0]
                if b.global_races is not None:
                    b.global_races.access(b.instr, who, at, m.esize, False)
            data = vals.view(np.uint8)
            flat = _smem_bytes(b, lane, int(dsts[i]), m)
            bulk = b.shared.bulk
            if b.shared.tracker is not None and bulk is not None and bulk.pending:
                # The copy engine may write from now on.
                bulk.check_write(np.full(1, lane), flat, flat.size)
            # The copy engine may write at once: a wgmma still reading these bytes races.
            running = b.wgmma is not None and b.wgmma.pending
            if running and np.isin(flat, pending_reads(b, int(b.slot[lane]))).any():
                raise MemoryFault(lane, f"bulk tensor copy to shared {int(dsts[i]):#x} "
                                  "overwrites an operand of a wgmma still in flight "
                                  "(not yet retired by wgmma.wait_group)")  # fmt: skip
            bar = int(b.slot[lane]) * b.shared.stride + int(bars[i])
            pending.append(Delivery(bar, data.size, _lander(b, flat, data)))
        b.writes += 1

    return run


def _lander(b: Batch, flat: np.ndarray, data: np.ndarray) -> Callable[[], None]:
    def land() -> None:
        b.shared.data[flat] = data
        tracker = b.shared.tracker
        if tracker is not None:
            tracker.engine_wrote(flat)

    return land


def _make_store(
    ins: Instruction, tmap: Operand, coords: tuple[Operand, ...], rank: int, src: Addr
) -> Handler:
    if "bulk_group" not in ins.modifiers:
        raise unsupported(ins, "a tensor store completes through .bulk_group")

    def run(b: Batch) -> None:
        lanes, boxes = _issued(b, tmap, coords, rank)
        if not boxes:
            return
        srcs = b.addresses(src, lanes, False)
        stores = stores_of(b)
        for i, (lane, (m, addr, inside)) in enumerate(zip(lanes.tolist(), boxes)):
            flat = _smem_bytes(b, lane, int(srcs[i]), m)
            tracker = b.shared.tracker
            if tracker is not None:
                # To the race detector the issuing thread reads the source now: what other
                # threads wrote there must be ordered before it by a barrier. (Swizzling
                # moves 16-byte chunks: each is contiguous.)
                starts = flat[::16].astype(np.uint64)
                tracker.access(np.full(starts.size, lane), starts, 16, write=False)
                tracker.bulk_store_read(lane, flat)
            got = np.flatnonzero(inside)
            # Read at the wait that retires its group (`BulkStores.wait`), not now.
            at = addr[got].astype(np.uint64)
            stores.issue(_Store(lane, flat, m.esize, at, got, b.instr.line))
        b.writes += 1

    return run
