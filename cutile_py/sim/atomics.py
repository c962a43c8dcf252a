"""`atom` and `red` on global and shared memory, serialized in lane order.

Lanes that hit the same address all apply, one after another, each `atom` seeing the value
left by the lanes before it. Associative operations use a scan per address; the others run
in rounds (round r applies the r-th lane of every address), whichever loop is shorter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from cutile_py.ptx.ast import Instruction
from cutile_py.sim.context import PTYPE_DTYPE
from cutile_py.sim.memops import _address, unsupported, value_type
from cutile_py.sim.spaces import space_of

if TYPE_CHECKING:
    from cutile_py.sim.program import Handler, Program
    from cutile_py.sim.spaces import Batch

OPS = ("add", "min", "max", "inc", "dec", "and", "or", "xor", "exch", "cas")
#: The associative operations and their ufunc (a scan gives every lane its old value).
SCANS: dict[str, np.ufunc] = {
    "add": np.add,
    "min": np.minimum,
    "max": np.maximum,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
}
INT_TYPES = frozenset(["b32", "b64", "u32", "u64", "s32", "s64"])


def _flush(x: np.ndarray) -> np.ndarray:
    """f32 subnormals to sign-preserving zero (atom.add.f32 flushes inputs and result)."""
    tiny = (x != 0) & (np.abs(x) < np.float32(2.0**-126))
    return np.where(tiny, np.copysign(np.float32(0), x), x) if tiny.any() else x


def _step(op: str, dtype: np.dtype[np.generic]) -> Callable[..., np.ndarray]:
    """new = f(old, b, c) for one lane per address."""
    if op in SCANS:
        ufunc = SCANS[op]

        def scan_step(old: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
            if dtype == np.float32:
                return _flush(ufunc(_flush(old), _flush(b)))
            out: np.ndarray = ufunc(old, b)
            return out

        return scan_step

    def other(old: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        if op == "exch":
            return b
        if op == "cas":
            new: np.ndarray = np.where(old == b, c, old)
        elif op == "inc":
            new = np.where(old >= b, 0, old + 1)
        else:  # dec
            new = np.where((old == 0) | (old > b), b, old - 1)
        return new.astype(dtype)

    return other


def make_atom(ins: Instruction, prog: Program) -> Handler:
    return _make(ins, prog, returns=True)


def make_red(ins: Instruction, prog: Program) -> Handler:
    return _make(ins, prog, returns=False)


def _make(ins: Instruction, prog: Program, returns: bool) -> Handler:
    ops = [m for m in ins.modifiers if m in OPS]
    if len(ops) != 1:
        raise unsupported(ins, f"expected one atomic operation among {', '.join(OPS)}")
    op = ops[0]
    ptype = value_type(ins)
    if any(m.startswith("v") and m[1:].isdigit() for m in ins.modifiers):
        raise unsupported(ins, "vector atomics are not supported")
    ok = (
        ptype in INT_TYPES
        or (ptype == "f32" and op in ("add", "exch"))
        or (ptype == "f64" and op == "add")
    )
    if not ok or (op in ("inc", "dec") and ptype != "u32"):
        raise unsupported(ins, f"atom/red .{op} on .{ptype} is not supported")
    if op in ("min", "max") and ptype.startswith("b"):
        raise unsupported(ins, f"{op} needs a .u or .s type")
    space = space_of(ins.modifiers)
    first = 1 if returns else 0
    addr = _address(ins, first)
    srcs = ins.operands[first + 1 : first + (3 if op == "cas" else 2)]
    dtype = PTYPE_DTYPE[ptype]
    esize = dtype.itemsize
    step = _step(op, dtype)
    scan = SCANS.get(op)
    # .release/.acq_rel publish the thread's earlier accesses (at gpu or system scope, the
    # default); a relaxed atomic does after a fence of its thread (`GlobalRaces`).
    release = bool({"release", "acq_rel"} & set(ins.modifiers)) and "cta" not in ins.modifiers

    def run(b: Batch) -> None:
        lanes = b.active()
        if b.schedule is not None:  # the seed picks the order atomics serialize in
            order = b.schedule.warp_order(lanes)
            lanes = lanes if order is None else lanes[order]
        bv = b.read(srcs[0], ptype)[lanes]
        cv = b.read(srcs[1], ptype)[lanes] if op == "cas" else bv
        old = np.empty(lanes.size, dtype=dtype)
        addrs = b.addresses(addr, lanes, space == "")
        if b.global_races is not None and space in ("global", ""):
            b.global_races.atomic(b.instr, lanes, addrs, returns, release)
        for view, idx, pos in b.elements(space, lanes, addrs, esize):
            typed = view.view(dtype)
            sel = slice(None) if pos is None else pos
            got = _apply(typed, idx, bv[sel], cv[sel], step, scan, dtype)
            old[sel] = got
        if returns:
            full = np.zeros(b.n, dtype=dtype)
            full[lanes] = old
            b.write(ins.operands[0], ptype, full)

    return run


def _apply(
    mem: np.ndarray,
    idx: np.ndarray,
    bv: np.ndarray,
    cv: np.ndarray,
    step: Callable[..., np.ndarray],
    scan: np.ufunc | None,
    dtype: np.dtype[np.generic],
) -> np.ndarray:
    """Apply the lanes' operations to `mem[idx]` in lane order; each lane's old value."""
    order = np.argsort(idx, kind="stable")  # stable: lane order within one address
    sidx = idx[order]
    starts = np.flatnonzero(np.r_[True, sidx[1:] != sidx[:-1]])
    counts = np.diff(np.r_[starts, sidx.size])
    sb, sc = bv[order], cv[order]
    old_sorted = np.empty(sidx.size, dtype=dtype)
    rounds = int(counts.max()) if counts.size else 0
    with np.errstate(over="ignore"):
        if rounds <= 1:
            old_sorted[:] = mem[sidx]
            mem[sidx] = step(old_sorted, sb, sc)
        elif scan is not None and starts.size < rounds:
            # Few addresses, many lanes each: one scan per address. (For f32 the flush of
            # subnormals applies to inputs and results, not to a subnormal partial sum.)
            is_f32 = dtype == np.float32
            for s, c in zip(starts.tolist(), counts.tolist()):
                seq = np.empty(c + 1, dtype=dtype)
                seq[0] = mem[sidx[s]]
                seq[1:] = sb[s : s + c]
                acc = scan.accumulate(_flush(seq) if is_f32 else seq, dtype=dtype)
                if is_f32:
                    acc = _flush(acc)
                old_sorted[s : s + c] = acc[:-1]
                mem[sidx[s]] = acc[-1]
        else:
            for r in range(rounds):
                live = starts[counts > r] + r
                cur = mem[sidx[live]]
                old_sorted[live] = cur
                mem[sidx[live]] = step(cur, sb[live], sc[live])
    out = np.empty_like(old_sorted)
    out[order] = old_sorted
    return out
