"""Warp-level data exchange (PTX ISA §9.7.9.6 shfl.sync, §9.7.13 vote.sync, match.sync,
activemask, redux.sync), computed for all warps at once on (warps, 32) reshaped lanes.

Checks, where the ISA says "undefined": an executing lane missing from its own membermask, and a
lane sourcing a register (shfl.sync) from a lane that is not executing the instruction or not in
the membermask, fail with the lanes named. Lanes of the membermask that do not execute the
instruction (exited, or absent in a partial warp) are left out of vote/redux, as for exited
threads in the ISA.
"""

from __future__ import annotations

import numpy as np

from cutile_py.ptx.ast import Instruction
from cutile_py.sim.context import WARP, ExecContext
from cutile_py.sim.semantics._common import (
    Mods,
    Run,
    decode_error,
    lane_ids,
    operands,
    read_bits,
    read_pred,
    split_dest_pair,
    write_bits,
    write_pred,
)
from cutile_py.sim.semantics.integer import read_u64

_LANES = np.arange(WARP, dtype=np.uint64)


def _require_sync(m: Mods) -> None:
    if not m.flag("sync"):
        m.fail("only the .sync form is supported (the plain form is removed for sm_70+)")


def _check_member(ctx: ExecContext, name: str, membermask: np.ndarray) -> None:
    lane = lane_ids(ctx).astype(np.uint64)
    outside = ctx.mask & (((membermask >> lane) & np.uint64(1)) == 0)
    if outside.any():
        ctx.fail(f"{name}: executing thread is not in its membermask (undefined)", outside)


def shfl(instr: Instruction) -> Run:
    """shfl.sync.{up,down,bfly,idx}.b32 d[|p], a, b, c, membermask, per the ISA pseudo-code:
    c[4:0] is the clamp value and c[12:8] the segment mask."""
    m = Mods(instr)
    _require_sync(m)
    mode = m.one_of(("up", "down", "bfly", "idx"), "mode", required=True)
    m.type({"b32"})
    m.finish()
    d, p, srcs = split_dest_pair(instr, 4)

    def run(ctx: ExecContext) -> None:
        a = read_bits(ctx, srcs[0], 32)
        b, c, mm = (read_u64(ctx, op, "u32").astype(np.int64) for op in srcs[1:])
        _check_member(ctx, "shfl.sync", mm.astype(np.uint64))
        lane = lane_ids(ctx)
        bval, cval, seg = b & 31, c & 31, (c >> 8) & 31
        max_lane = (lane & seg) | (cval & ~seg & 31)
        min_lane = lane & seg
        if mode == "up":
            j = lane - bval
            pval = j >= max_lane
        elif mode == "down":
            j = lane + bval
            pval = j <= max_lane
        elif mode == "bfly":
            j = lane ^ bval
            pval = j <= max_lane
        else:
            j = min_lane | (bval & ~seg & 31)
            pval = j <= max_lane
        j = np.where(pval, j, lane)
        src = np.arange(ctx.n) - lane + j
        bad = ctx.mask & pval & (~ctx.mask[src] | (((mm >> j) & 1) == 0))
        if bad.any():
            ctx.fail(
                "shfl.sync: a thread sources a lane that is inactive or outside membermask "
                "(undefined)",
                bad,
            )
        write_bits(ctx, d, 32, a[src])
        write_pred(ctx, p, pval)

    return run


def _participants(ctx: ExecContext, membermask: np.ndarray) -> np.ndarray:
    """(lanes, 32) bool: lane i's membermask bit j, restricted to executing lanes j."""
    member = ((membermask.astype(np.uint64)[:, None] >> _LANES) & np.uint64(1)) == 1
    active = ctx.mask.reshape(-1, WARP)
    return np.asarray(member & np.repeat(active, WARP, axis=0))


def _warp_values(values: np.ndarray) -> np.ndarray:
    """(lanes, 32): each lane sees every value of its warp."""
    return np.repeat(values.reshape(-1, WARP), WARP, axis=0)


def vote(instr: Instruction) -> Run:
    """vote.sync.{all,any,uni}.pred d, {!}a, membermask and vote.sync.ballot.b32 d, {!}a, mm."""
    m = Mods(instr)
    _require_sync(m)
    mode = m.one_of(("all", "any", "uni", "ballot"), "mode", required=True)
    m.type({"b32"} if mode == "ballot" else {"pred"})
    m.finish()
    d, a_op, mm_op = operands(instr, 3)

    def run(ctx: ExecContext) -> None:
        mm = read_u64(ctx, mm_op, "u32")
        _check_member(ctx, "vote.sync", mm)
        part = _participants(ctx, mm)
        a = _warp_values(read_pred(ctx, a_op))
        if mode == "ballot":
            bits = ((part & a).astype(np.uint64) << _LANES).sum(axis=1, dtype=np.uint64)
            write_bits(ctx, d, 32, bits)
            return
        all_ = ~(part & ~a).any(axis=1)
        any_ = (part & a).any(axis=1)
        write_pred(ctx, d, {"all": all_, "any": any_, "uni": all_ | ~any_}[str(mode)])

    return run


def activemask(instr: Instruction) -> Run:
    """activemask.b32 d: the executing lanes of the warp."""
    m = Mods(instr)
    m.type({"b32"})
    m.finish()
    (d,) = operands(instr, 1)

    def run(ctx: ExecContext) -> None:
        act = ctx.mask.reshape(-1, WARP).astype(np.uint64) << _LANES
        write_bits(ctx, d, 32, np.repeat(act.sum(axis=1, dtype=np.uint64), WARP))

    return run


def match(instr: Instruction) -> Run:
    """match.{any,all}.sync.{b32,b64} d[|p], a, membermask (§9.7.13.8): d is the mask of the
    executing membermask lanes holding this lane's value (any), or all of them when every one
    holds the same value, else 0 (all, with p = that test)."""
    m = Mods(instr)
    _require_sync(m)
    mode = m.one_of(("any", "all"), "mode", required=True)
    t = m.type({"b32", "b64"})
    m.finish()
    d, p, srcs = split_dest_pair(instr, 2)
    if p is not None and mode == "any":
        m.fail("match.any has no predicate destination")

    def run(ctx: ExecContext) -> None:
        mm = read_u64(ctx, srcs[1], "u32")
        _check_member(ctx, "match.sync", mm)
        part = _participants(ctx, mm)
        a = read_bits(ctx, srcs[0], 64 if t == "b64" else 32)
        same = part & (_warp_values(a) == a[:, None])
        weights = np.uint64(1) << _LANES
        if mode == "any":
            write_bits(ctx, d, 32, (same * weights).sum(axis=1, dtype=np.uint64))
            return
        uniform = ~(part & ~same).any(axis=1)
        members = (part * weights).sum(axis=1, dtype=np.uint64)
        write_bits(ctx, d, 32, np.where(uniform, members, np.uint64(0)))
        write_pred(ctx, p, uniform)

    return run


def redux(instr: Instruction) -> Run:
    """redux.sync.{add,min,max}.{u32,s32} and .{and,or,xor}.b32 d, a, membermask."""
    m = Mods(instr)
    _require_sync(m)
    op = m.one_of(("add", "min", "max", "and", "or", "xor"), "operation", required=True)
    t = m.type({"u32", "s32"} if op in ("add", "min", "max") else {"b32"})
    m.finish()
    d, a_op, mm_op = operands(instr, 3)

    def run(ctx: ExecContext) -> None:
        mm = read_u64(ctx, mm_op, "u32")
        _check_member(ctx, "redux.sync", mm)
        part = _participants(ctx, mm)
        v = np.asarray(ctx.read(a_op, t)).astype(np.int64)
        vals = _warp_values(v)
        if op == "add":
            r = np.where(part, vals, 0).sum(axis=1)
        elif op in ("min", "max"):
            ident = np.iinfo(np.int64).max if op == "min" else np.iinfo(np.int64).min
            masked = np.where(part, vals, ident)
            r = masked.min(axis=1) if op == "min" else masked.max(axis=1)
        else:
            u = np.where(part, vals, -1 if op == "and" else 0).astype(np.uint64)
            r = (
                {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[str(op)]
                .reduce(u, axis=1)
                .astype(np.int64)
            )
        write_bits(ctx, d, 32, r.astype(np.uint64) & np.uint64(0xFFFFFFFF))

    return run


def elect(instr: Instruction) -> Run:
    """elect.sync d|p, membermask: the lowest executing lane of membermask is the leader;
    every participant gets its lane id in d (d may be `_`), and p is true in the leader only."""
    m = Mods(instr)
    _require_sync(m)
    m.finish()
    d, p, (mm_op,) = split_dest_pair(instr, 1)
    if p is None:
        decode_error(instr, "elect.sync needs the destination pair d|p")

    def run(ctx: ExecContext) -> None:
        mm = read_u64(ctx, mm_op, "u32")
        _check_member(ctx, "elect.sync", mm)
        part = _participants(ctx, mm)
        leader = np.where(part.any(axis=1), np.argmax(part, axis=1), -1)
        lane = np.arange(ctx.n) % WARP
        write_bits(ctx, d, 32, leader.astype(np.uint64))
        write_pred(ctx, p, leader == lane)

    return run
