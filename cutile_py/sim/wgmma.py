"""`wgmma` (PTX ISA §9.7.15): warpgroup-wide asynchronous D = A @ B (+ D) with operands in
shared memory, read through matrix descriptors.

A warpgroup is four consecutive warps of a block, the first a multiple of four; all 128 of
its threads execute each `wgmma` together (`.sync.aligned`), with the same descriptors.
`mma_async` records the operation; it is carried out when the warpgroup's
`wgmma.wait_group` completes its commit group, reading the accumulator registers, shared
memory and the descriptors' matrices then, and writing the accumulators. So a kernel that
overwrites an operand's shared memory, or uses the accumulators, before the wait sees a
different result, as it may on hardware.

Matrix descriptor (64 bits): start address >> 4 (bits 0-13), leading-dimension byte offset
>> 4 (16-29), stride-dimension byte offset >> 4 (32-45), base offset (49-51; only 0 is
supported), swizzle (62-63: 0 none, 1 128-byte, 2 64-byte, 3 32-byte). The byte offset of
element (mn, k) in the ISA's canonical layouts, with S the swizzle span and e the element
size (before the swizzle of the address, `cutile_py.sim.bulk_copy.swizzle`):

- K-major, swizzled:    (mn % 8) * S + (mn // 8) * SBO + k * e
- K-major, none:        (mn % 8) * 16 + (mn // 8) * SBO + (k*e // 16) * LBO + k*e % 16
- MN-major, swizzled:   (mn % (S/e)) * e + (mn // (S/e)) * LBO + (k % 8) * S + (k // 8) * SBO
- MN-major, none:       (mn % (16/e)) * e + (mn // (16/e)) * SBO + (k % 8) * 16 + (k // 8) * LBO

Accumulator fragment (m64nN, f32): thread t of the warpgroup (warp w = t // 32, lane l)
holds in register j = 4i + r the element (16w + l//4 + 8(r//2), 8i + 2(l%4) + r%2). With A
in registers, its fragment is mma.m16n8k16's A fragment for rows 16w..16w+15.

Products are exact in f64 and summed in f64, then rounded once to the accumulator type, as
`cutile_py.sim.semantics.mma` does for mma.sync; compare with a tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from cutile_py.ptx.ast import Imm, Instruction, Operand, Vec
from cutile_py.sim.bulk_copy import swizzle
from cutile_py.sim.context import WARP
from cutile_py.sim.memops import unsupported

if TYPE_CHECKING:
    from cutile_py.sim.program import Handler, Program
    from cutile_py.sim.spaces import Batch

GROUP = 4 * WARP
_SPANS = {0: 0, 1: 128, 2: 64, 3: 32}
#: input type -> (element bytes, K of one instruction)
_INPUTS = {"f16": (2, 16), "bf16": (2, 16), "tf32": (4, 8)}


@dataclass
class _Op:
    """One `mma_async` of the warpgroups in `groups` (first lanes)."""

    ins: Instruction
    n: int
    k: int
    kind: str  # input type
    acc: str  # "f32" or "f16"
    d: tuple[Operand, ...]
    groups: np.ndarray  # first lane of each warpgroup
    a_desc: np.ndarray | None  # per warpgroup, or None with A in registers
    a_regs: np.ndarray | None  # (groups, 128, 4) uint32 when A is in registers
    b_desc: np.ndarray
    scale_d: np.ndarray  # bool per warpgroup
    neg: float  # imm-scale-a * imm-scale-b
    trans_a: bool
    trans_b: bool
    commit: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # -1: open


@dataclass
class Wgmma:
    """The batch's pending operations and each lane's count of committed groups."""

    committed: np.ndarray
    pending: list[_Op] = field(default_factory=list)


def state_of(b: Batch) -> Wgmma:
    got = b.wgmma
    if got is None:
        got = b.wgmma = Wgmma(np.zeros(b.n, dtype=np.int64))
    return got


def _groups(b: Batch, ins: Instruction) -> np.ndarray:
    """First lanes of the warpgroups executing; fail unless each runs with all 128 threads."""
    if b.per_block % GROUP:
        b.fail(f"{ins.opcode}: a block of {b.threads} threads has no whole warpgroup")
    wg = b.mask.reshape(-1, GROUP)
    used = wg.any(axis=1)
    partial = used & ~wg.all(axis=1)
    if partial.any():
        b.fail("wgmma executed by only part of a warpgroup", np.repeat(partial, GROUP))
    out: np.ndarray = np.flatnonzero(used) * GROUP
    return out


def _uniform(b: Batch, values: np.ndarray, groups: np.ndarray, what: str) -> np.ndarray:
    per = values.reshape(-1, GROUP)[groups // GROUP]
    bad = (per != per[:, :1]).any(axis=1)
    if bad.any():
        which = np.isin(np.arange(b.n // GROUP), groups[bad] // GROUP)
        b.fail(f"wgmma: the {what} differs between threads of one warpgroup",
               np.repeat(which, GROUP))  # fmt: skip
    out: np.ndarray = per[:, 0]
    return out


def make_wgmma(ins: Instruction, prog: Program) -> Handler:
    mods = ins.modifiers
    if "fence" in mods:
        return lambda b: None  # orders register accesses; the simulator's are in order
    if "commit_group" in mods:

        def commit(b: Batch) -> None:
            st = state_of(b)
            for op in st.pending:
                open_ = (op.commit < 0) & b.mask[op.groups]
                op.commit[open_] = st.committed[op.groups[open_]]
            st.committed[b.mask] += 1

        return commit
    if "wait_group" in mods:
        n = ins.operands[0] if ins.operands else None
        if not isinstance(n, Imm) or not isinstance(n.value, int):
            raise unsupported(ins, "wgmma.wait_group needs an integer immediate")
        keep = int(n.value)
        return lambda b: _wait(b, ins, keep)
    if "mma_async" in mods:
        return _make_mma(ins)
    raise unsupported(ins, "this wgmma operation is not supported")


def _make_mma(ins: Instruction) -> Handler:
    mods = ins.modifiers
    if "sp" in mods:
        raise unsupported(ins, "sparse wgmma is not supported")
    shape = next((m for m in mods if m.startswith("m64n")), None)
    types = [m for m in mods if m in ("f32", "f16", "bf16", "tf32")]
    if shape is None or len(types) != 3 or types[1] != types[2] or types[1] not in _INPUTS:
        raise unsupported(ins, "supported: wgmma.mma_async m64nNk16 .f16/.bf16 and m64nNk8 .tf32")
    acc, kind = types[0], types[1]
    k = _INPUTS[kind][1]
    try:
        n_str, k_str = shape[4:].split("k")
        n, k_given = int(n_str), int(k_str)
    except ValueError:
        raise unsupported(ins, f"bad shape {shape}") from None
    if k_given != k or n % 8 or not 8 <= n <= 256 or (acc == "f16" and kind != "f16"):
        raise unsupported(ins, f"{shape} with .{acc}.{kind} is not a wgmma shape")
    ops = ins.operands
    nregs = n // 2 if acc == "f32" else n // 4
    d = ops[0].items if isinstance(ops[0], Vec) else (ops[0],)
    if len(d) != nregs:
        raise unsupported(ins, f"{shape}.{acc} takes {nregs} accumulator registers")
    a_in_regs = isinstance(ops[1], Vec)
    imms = ops[4:]
    want = 2 if kind == "tf32" else (3 if a_in_regs else 4)
    if len(imms) != want or not all(isinstance(x, Imm) for x in imms):
        raise unsupported(ins, f"expected {want} immediate operands after scale-d")
    vals = [int(x.value) for x in imms if isinstance(x, Imm)]
    if any(v not in (1, -1) for v in vals[:2]) or any(v not in (0, 1) for v in vals[2:]):
        raise unsupported(ins, "imm-scale must be 1 or -1 and imm-trans 0 or 1")
    neg = float(vals[0] * vals[1])
    trans_a = not a_in_regs and len(vals) > 2 and vals[2] == 1
    trans_b = len(vals) > 2 and vals[-1] == 1
    a_op, b_op, scale_op = ops[1], ops[2], ops[3]
    if a_in_regs and (not isinstance(a_op, Vec) or len(a_op.items) != 4 or kind == "tf32"):
        raise unsupported(ins, "A in registers is four .b32 registers of f16/bf16 pairs")

    def run(b: Batch) -> None:
        groups = _groups(b, ins)
        if not groups.size:
            return
        a_desc = a_regs = None
        if a_in_regs:
            assert isinstance(a_op, Vec)
            regs = np.stack([b.read(x, "b32") for x in a_op.items], axis=1).view(np.uint32)
            a_regs = regs.reshape(-1, GROUP, 4)[groups // GROUP].copy()
        else:
            a_desc = _uniform(b, b.read(a_op, "b64").view(np.uint64), groups, "A descriptor")
        b_desc = _uniform(b, b.read(b_op, "b64").view(np.uint64), groups, "B descriptor")
        if isinstance(scale_op, Imm):
            scale = np.full(groups.size, bool(scale_op.value), dtype=bool)
        else:
            scale = _uniform(b, b.read(scale_op, "pred"), groups, "scale-d")
        st = state_of(b)
        st.pending.append(_Op(ins, n, k, kind, acc, d, groups, a_desc, a_regs, b_desc,
                              scale, neg, trans_a, trans_b,
                              np.full(groups.size, -1, dtype=np.int64)))  # fmt: skip

    return run


def _wait(b: Batch, ins: Instruction, keep: int) -> None:
    groups = _groups(b, ins)
    st = b.wgmma
    if st is None or not groups.size:
        return
    limit = st.committed - keep
    still: list[_Op] = []
    for op in st.pending:
        done = np.isin(op.groups, groups) & (op.commit >= 0) & (op.commit < limit[op.groups])
        if done.any():
            _carry_out(b, op, np.flatnonzero(done))
            rest = ~done
            if rest.any():
                op.groups, op.commit, op.b_desc, op.scale_d = (
                    op.groups[rest],
                    op.commit[rest],
                    op.b_desc[rest],
                    op.scale_d[rest],
                )
                if op.a_desc is not None:
                    op.a_desc = op.a_desc[rest]
                if op.a_regs is not None:
                    op.a_regs = op.a_regs[rest]
                still.append(op)
        else:
            still.append(op)
    st.pending = still


def pending_reads(b: Batch, slot: int) -> np.ndarray:
    """Flat byte indices of the batch's shared memory that the wgmma operations of block
    slot `slot` still in flight (issued, not yet retired by a `wait_group`) read: bytes that
    nothing may write before they retire."""
    st = b.wgmma
    out = [np.zeros(0, dtype=np.int64)]
    for op in st.pending if st is not None else ():
        esize = _INPUTS[op.kind][0]
        for w, first in enumerate(op.groups.tolist()):
            if int(b.slot[first]) != slot:
                continue
            reads = [(int(op.b_desc[w]), op.n, op.trans_b)]
            if op.a_desc is not None:
                reads.append((int(op.a_desc[w]), 64, op.trans_a))
            for desc, rows, mn_major in reads:
                try:
                    offs = _offsets(rows, op.k, esize, desc, mn_major).ravel().astype(np.int64)
                except ValueError:
                    continue  # a bad descriptor: reported when the operation is carried out
                starts = slot * b.shared.stride + offs
                out.append((starts[:, None] + np.arange(esize)).ravel())
    return np.concatenate(out)


def _decode(desc: int) -> tuple[int, int, int, int]:
    """(start, LBO, SBO, swizzle span) of a descriptor, all in bytes."""
    if (desc >> 49) & 7:
        raise ValueError("a matrix descriptor with a non-zero base offset is not supported")
    return ((desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4,
            _SPANS[desc >> 62])  # fmt: skip


def _offsets(mn: int, k: int, esize: int, desc: int, mn_major: bool) -> np.ndarray:
    """Shared addresses (after the swizzle) of the (mn, k) elements of a descriptor's matrix."""
    start, lbo, sbo, span = _decode(desc)
    i, j = np.meshgrid(np.arange(mn, dtype=np.int64), np.arange(k, dtype=np.int64), indexing="ij")
    kb = j * esize
    if not mn_major:
        if span:
            off = (i % 8) * span + (i // 8) * sbo + kb
        else:
            off = (i % 8) * 16 + (i // 8) * sbo + (kb // 16) * lbo + kb % 16
    else:
        if span:
            per = span // esize
            off = (i % per) * esize + (i // per) * lbo + (j % 8) * span + (j // 8) * sbo
        else:
            per = 16 // esize
            off = (i % per) * esize + (i // per) * sbo + (j % 8) * 16 + (j // 8) * lbo
    return swizzle((start + off).astype(np.uint64), span)


def _values(bits: np.ndarray, kind: str) -> np.ndarray:
    """f64 values of operand element bits."""
    if kind == "f16":
        f: np.ndarray = bits.astype(np.uint16).view(np.float16)
    elif kind == "bf16":
        f = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    else:  # tf32: the 13 low mantissa bits are ignored
        f = (bits.astype(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return f.astype(np.float64)


def _matrix(b: Batch, op: _Op, first_lane: int, desc: int, rows: int, mn_major: bool) -> np.ndarray:
    esize = _INPUTS[op.kind][0]
    try:
        offs = _offsets(rows, op.k, esize, desc, mn_major)
    except ValueError as e:
        b.fail(f"wgmma: {e}", np.isin(b.ids, [first_lane]))
    lanes = np.full(offs.size, first_lane, dtype=np.int64)
    flat = b.shared.flat(lanes, b.slot[lanes], offs.ravel(), esize, "wgmma operand read")
    if (offs % np.uint64(esize)).any():
        b.fail("wgmma: a misaligned operand element", np.isin(b.ids, [first_lane]))
    view = b.shared.view(esize)
    bits = view[(flat // np.uint64(esize)).astype(np.intp)]
    return _values(bits, op.kind).reshape(rows, op.k)


def _a_from_regs(regs: np.ndarray, kind: str) -> np.ndarray:
    """(64, 16) A of one warpgroup from its (128, 4) fragment registers."""
    t = np.arange(GROUP)
    w, lane = t // WARP, t % WARP
    g, q = lane >> 2, lane & 3
    out = np.zeros((64, 16), dtype=np.float64)
    for r in range(4):
        for e in range(2):
            rows = 16 * w + g + 8 * (r & 1)
            cols = 2 * q + e + 8 * (r >> 1)
            half = (regs[:, r] >> np.uint32(16 * e)) & np.uint32(0xFFFF)
            out[rows, cols] = _values(half, kind)
    return out


def _fragment(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols), each (128 threads, n/2 registers), of the f32 accumulator fragment."""
    t = np.arange(GROUP)[:, None]
    j = np.arange(n // 2)[None, :]
    w, lane = t // WARP, t % WARP
    i, r = j // 4, j % 4
    return 16 * w + lane // 4 + 8 * (r // 2), 8 * i + 2 * (lane % 4) + r % 2


def _carry_out(b: Batch, op: _Op, which: np.ndarray) -> None:
    rows, cols = _fragment(op.n)
    if op.acc == "f32":
        regs = np.stack([b.read(x, "f32") for x in op.d], axis=1)
    else:  # f16x2 pairs: register j holds columns 2j', 2j'+1 of the f32 layout's pair j'
        packed = np.stack([b.read(x, "b32").view(np.uint32) for x in op.d], axis=1)
        lo = (packed & np.uint32(0xFFFF)).astype(np.uint16).view(np.float16)
        hi = (packed >> np.uint32(16)).astype(np.uint16).view(np.float16)
        regs = np.stack([lo, hi], axis=2).reshape(b.n, -1).astype(np.float32)
    out = regs.astype(np.float64)
    for w in which.tolist():
        first = int(op.groups[w])
        lanes = np.arange(first, first + GROUP)
        if op.a_desc is not None:
            a = _matrix(b, op, first, int(op.a_desc[w]), 64, op.trans_a)
        else:
            assert op.a_regs is not None
            a = _a_from_regs(op.a_regs[w], op.kind)
        bm = _matrix(b, op, first, int(op.b_desc[w]), op.n, op.trans_b)
        prod = op.neg * (a @ bm.T)
        if op.scale_d[w]:
            c = np.zeros((64, op.n), dtype=np.float64)
            c[rows, cols] = regs[lanes].astype(np.float64)
            prod = prod + c
        out[lanes] = prod[rows, cols]
    if op.acc == "f32":
        res = out.astype(np.float32)  # one rounding, to nearest even
        for j, x in enumerate(op.d):
            b.write(x, "f32", res[:, j])
    else:
        half = out.astype(np.float16).reshape(b.n, -1, 2)
        bits = half.view(np.uint16).astype(np.uint32)
        packed = bits[:, :, 0] | (bits[:, :, 1] << np.uint32(16))
        for j, x in enumerate(op.d):
            b.write(x, "b32", packed[:, j])


def make_setmaxnreg(ins: Instruction, prog: Program) -> Handler:
    """`setmaxnreg.{inc,dec}.sync.aligned.u32 n`: a register-budget hint to the hardware;
    checked (n a multiple of 8 in 24..256, a whole warpgroup executing) and otherwise a no-op."""
    n = ins.operands[0] if ins.operands else None
    if (
        not isinstance(n, Imm)
        or not isinstance(n.value, int)
        or n.value % 8
        or not (24 <= n.value <= 256)
    ):
        raise unsupported(ins, "setmaxnreg takes an immediate multiple of 8 in 24..256")
    if not {"inc", "dec"} & set(ins.modifiers):
        raise unsupported(ins, "setmaxnreg needs .inc or .dec")

    def run(b: Batch) -> None:
        _groups(b, ins)

    return run
