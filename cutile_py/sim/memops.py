"""Handlers of the memory instructions: `ld`, `st`, `cvta`, `mov` of a symbol, `ldmatrix`,
the hints that need no work in a sequential simulator, and fences (see `make_fence`).

Each `make_*` decodes its instruction once, at load time, and returns the per-step handler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cutile_py.ptx.ast import Addr, Instruction, Operand, Reg, Sink, Symbol, Vec
from cutile_py.sim.context import PTYPE_DTYPE, WARP, SimError
from cutile_py.sim.memory import LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW, UINT
from cutile_py.sim.spaces import space_of

if TYPE_CHECKING:
    from cutile_py.sim.program import Handler, Program
    from cutile_py.sim.spaces import Batch

TYPES = frozenset(PTYPE_DTYPE) - {"pred"}
VECTORS = {"v2": 2, "v4": 4, "v8": 8}


def unsupported(ins: Instruction, why: str) -> SimError:
    return SimError(f"PTX line {ins.line} `{ins.text}`: {why}")


def value_type(ins: Instruction) -> str:
    """The instruction's data type: its last type modifier."""
    for m in reversed(ins.modifiers):
        if m in TYPES:
            return m
    raise unsupported(ins, "no data type among the modifiers")


def vector_width(ins: Instruction) -> int:
    for m in ins.modifiers:
        if m in VECTORS:
            return VECTORS[m]
    return 1


def items(op: Operand, n: int, ins: Instruction) -> tuple[Operand, ...]:
    got = op.items if isinstance(op, Vec) else (op,)
    if len(got) != n:
        raise unsupported(ins, f"expected {n} value operands, found {len(got)}")
    return got


def _address(ins: Instruction, k: int) -> Addr:
    op = ins.operands[k] if len(ins.operands) > k else None
    if not isinstance(op, Addr):
        raise unsupported(ins, f"operand {k + 1} must be an address `[...]`")
    return op


def make_ld(ins: Instruction, prog: Program) -> Handler:
    ptype = value_type(ins)
    nvec = vector_width(ins)
    space = space_of(ins.modifiers)
    dests = items(ins.operands[0], nvec, ins)
    addr = _address(ins, 1)
    esize = PTYPE_DTYPE[ptype].itemsize
    generic = space == ""
    if (
        space == "param"
        and isinstance(addr.base, Symbol)
        and addr.base.name not in prog.param_offsets
    ):
        raise unsupported(ins, f"{addr.base.name} is not a parameter of {prog.name}")

    def run(b: Batch) -> None:
        lanes = b.active()
        vals = b.load(space, lanes, b.addresses(addr, lanes, generic), esize, nvec)
        if lanes is not b.ids:
            full = np.zeros((b.n, nvec), dtype=vals.dtype)
            full[lanes] = vals
            vals = full
        for j, d in enumerate(dests):
            if not isinstance(d, Sink):
                b.write(d, ptype, vals[:, j].view(PTYPE_DTYPE[ptype]))

    return run


def make_st(ins: Instruction, prog: Program) -> Handler:
    ptype = value_type(ins)
    nvec = vector_width(ins)
    space = space_of(ins.modifiers)
    if space in ("param", "const"):
        raise unsupported(ins, f"stores to {space} space are not supported")
    addr = _address(ins, 0)
    srcs = items(ins.operands[1], nvec, ins)
    esize = PTYPE_DTYPE[ptype].itemsize
    udtype = UINT[esize]
    generic = space == ""

    def run(b: Batch) -> None:
        lanes = b.active()
        cols = [b.read(s, ptype).view(udtype) for s in srcs]
        if lanes is b.ids:
            vals = np.stack(cols, axis=1) if nvec > 1 else cols[0][:, None]
        else:
            vals = np.stack([c[lanes] for c in cols], axis=1)
        b.store(space, lanes, b.addresses(addr, lanes, generic), esize, vals)

    return run


def make_cvta(ins: Instruction, prog: Program) -> Handler:
    """`cvta.space` (space address → generic) and `cvta.to.space` (generic → space address)."""
    to = "to" in ins.modifiers
    space = space_of(ins.modifiers)
    window = {"shared": SHARED_WINDOW, "local": LOCAL_WINDOW, "param": PARAM_WINDOW}.get(space, 0)
    ptype = value_type(ins)
    dst, src = ins.operands[0], ins.operands[1]

    def run(b: Batch) -> None:
        if isinstance(src, Symbol):
            a = np.full(b.n, b.symbol_address(src.name, generic=False), dtype=np.uint64)
        else:
            a = b.read(src, "u64")
        w = np.uint64(window)
        out = a - w if to else a + w
        b.write(dst, ptype, out if ptype in ("u64", "b64", "s64") else out.astype(np.uint32))

    return run


def make_mov_symbol(ins: Instruction, prog: Program) -> Handler:
    """`mov.u64 %rd, name`: the address of a variable (in its own state space)."""
    dst, src = ins.operands
    assert isinstance(src, Symbol)
    ptype = value_type(ins)

    def run(b: Batch) -> None:
        b.write(dst, ptype, b.read(src, ptype))

    return run


def make_ldmatrix(ins: Instruction, prog: Program) -> Handler:
    """`ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16` (NOTES-PTX.md, "ldmatrix")."""
    mods = ins.modifiers
    if "m8n8" not in mods or "b16" not in mods:
        raise unsupported(ins, "only ldmatrix .m8n8 ... .b16 is supported")
    num = next((int(m[1:]) for m in mods if m in ("x1", "x2", "x4")), 0)
    if not num:
        raise unsupported(ins, "ldmatrix needs .x1, .x2 or .x4")
    trans = "trans" in mods
    space = space_of(mods)
    dests = items(ins.operands[0], num, ins)
    addr = _address(ins, 1)
    providers = np.arange(8 * num)
    every_lane: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # per lane count: (wl, lanes)

    def run(b: Batch) -> None:
        if b.mask.all():  # every warp, whole (the usual case): the same lanes every time
            got = every_lane.get(b.n)
            if got is None:
                wl = np.arange(b.n // WARP)
                got = every_lane[b.n] = (wl, (wl[:, None] * WARP + providers).ravel())
                got[1].flags.writeable = False
            wl, lanes = got
        else:
            warps = b.mask.reshape(-1, WARP)
            used = warps.any(axis=1)
            partial = used & ~(warps.all(axis=1))
            if partial.any():
                b.fail(
                    "ldmatrix.sync.aligned executed by only part of a warp",
                    np.repeat(partial, WARP),
                )
            wl = np.flatnonzero(used)
            lanes = (wl[:, None] * WARP + providers).ravel()
        rows = b.load(space, lanes, b.addresses(addr, lanes, space == ""), 2, 8)
        m = rows.reshape(wl.size, num, 8, 8)
        if trans:
            m = m.transpose(0, 1, 3, 2)
        # Lane l of a warp gets row l // 4, columns 2 (l % 4) and the next, the lower column in
        # the low half: little-endian, that is the row's 16-bit pairs read as 32-bit words.
        packed = np.ascontiguousarray(m).view(np.uint32).reshape(wl.size, num, WARP)
        every = wl.size * WARP == b.n
        for i, d in enumerate(dests):
            if every:
                b.write(d, "b32", packed[:, i, :].reshape(-1))
                continue
            full = np.zeros((b.n // WARP, WARP), dtype=np.uint32)
            full[wl] = packed[:, i, :]
            b.write(d, "b32", full.reshape(-1))

    return run


def make_stmatrix(ins: Instruction, prog: Program) -> Handler:
    """`stmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16`: ldmatrix's inverse; lane
    8i + r gives the address of row r of matrix i, register i holds the matrix's fragment."""
    mods = ins.modifiers
    if "m8n8" not in mods or "b16" not in mods:
        raise unsupported(ins, "only stmatrix .m8n8 ... .b16 is supported")
    num = next((int(m[1:]) for m in mods if m in ("x1", "x2", "x4")), 0)
    if not num:
        raise unsupported(ins, "stmatrix needs .x1, .x2 or .x4")
    trans = "trans" in mods
    space = space_of(mods)
    addr = _address(ins, 0)
    srcs = items(ins.operands[1], num, ins)
    lane = np.arange(WARP)
    row, col = lane // 4, 2 * (lane % 4)
    providers = np.arange(8 * num)

    def run(b: Batch) -> None:
        warps = b.mask.reshape(-1, WARP)
        used = warps.any(axis=1)
        if (used & ~warps.all(axis=1)).any():
            b.fail("stmatrix.sync.aligned executed by only part of a warp",
                   np.repeat(used & ~warps.all(axis=1), WARP))  # fmt: skip
        wl = np.flatnonzero(used)
        m = np.zeros((wl.size, num, 8, 8), dtype=np.uint16)
        for i, s in enumerate(srcs):
            v = b.read(s, "b32").view(np.uint32).reshape(-1, WARP)[wl]  # (warps, 32)
            m[:, i, row, col] = (v & np.uint32(0xFFFF)).astype(np.uint16)
            m[:, i, row, col + 1] = (v >> np.uint32(16)).astype(np.uint16)
        if trans:
            m = m.transpose(0, 1, 3, 2)
        lanes = (wl[:, None] * WARP + providers).ravel()
        b.store(space, lanes, b.addresses(addr, lanes, space == ""), 2,
                np.ascontiguousarray(m).reshape(-1, 8))  # fmt: skip

    return run


def make_nop(ins: Instruction, prog: Program) -> Handler:
    """Hints, fences and sleeps: nothing to do when every access happens in program order."""

    def run(b: Batch) -> None:
        return None

    return run


#: Fence forms that order a thread's global accesses for every block of the GPU.
GPU_SCOPES = frozenset({"gl", "sys", "gpu"})


def make_fence(ins: Instruction, prog: Program) -> Handler:
    """`membar` / `fence`: a no-op on memory (every access happens in program order); one of
    gpu or system scope (`membar.gl`, `fence.sc.gpu`, ...; not `.proxy` forms) lets the
    thread's next atomic order its earlier accesses for other blocks (`GlobalRaces`)."""
    if {"proxy", "async"} <= set(ins.modifiers):

        def proxy(b: Batch) -> None:
            if b.shared.tracker is not None:
                b.shared.tracker.proxy_fence(b.active())

        return proxy
    orders = bool(GPU_SCOPES.intersection(ins.modifiers)) and "proxy" not in ins.modifiers
    if not orders:
        return make_nop(ins, prog)

    def run(b: Batch) -> None:
        if b.global_races is not None:
            b.global_races.fence(b.instr, b.active())

    return run


def make_trap(ins: Instruction, prog: Program) -> Handler:
    def run(b: Batch) -> None:
        b.fail("trap executed (the kernel aborted)")

    return run


def make_warp_sync(ins: Instruction, prog: Program) -> Handler:
    """`bar.warp.sync`: lanes run in lock-step already; the race detector forgets the warp."""

    def run(b: Batch) -> None:
        if b.shared.tracker is not None:
            b.shared.tracker.warp_barrier(b.active())
        if b.global_races is not None:
            b.global_races.warp_barrier(b.active())

    return run


def is_predicate(op: Operand, prog: Program) -> bool:
    return isinstance(op, Reg) and prog.regs.get(op.name) == "pred"
