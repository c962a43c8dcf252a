"""mma.sync.aligned (PTX ISA §9.7.14.5): warp-wide D = A @ B + C on register fragments.

Supported (.row.col): m16n8k16 and m16n8k8 with f16 or bf16 inputs (f32 or, for f16, f16
accumulators), m16n8k8 and m16n8k4 with tf32 inputs, m8n8k4 and m16n8k8 with f64. Fragment
layouts (g = lane>>2, t = lane&3) are those of NOTES-PTX.md and the ISA's figures. The products
are exact in f64 and are summed in f64, then rounded once (to nearest) to the accumulator type;
the hardware's summation order and internal precision differ slightly, so compare results with
a tolerance. tf32 operands use the f32 bits with the 13 low mantissa bits ignored. All 32 lanes
of a warp must execute it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from cutile_py.ptx.ast import Instruction, Operand, Vec
from cutile_py.sim.context import WARP, ExecContext
from cutile_py.sim.semantics._common import Mods, Run, decode_error, read_bits, write_bits
from cutile_py.sim.semantics.fpcore import BF16, F16, F32, F64, TF32, FloatFormat, decode, round_f64

#: (lane group g, thread t, register r, element e) -> (row, col) of a fragment element.
Layout = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]

_LAYOUTS: dict[str, Layout] = {
    # m16n8k16, 16-bit A: a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
    "A16x16": lambda g, t, r, e: (g + 8 * (r & 1), 2 * t + e + 8 * (r >> 1)),
    # B 16x8 ("col"): b0 k = 2t, 2t+1; b1 k = 2t+8, 2t+9; n = g. Returned as (k, n).
    "B16x8": lambda g, t, r, e: (2 * t + e + 8 * r, g),
    # m16n8k8, 16-bit A: a0 (g, 2t..), a1 (g+8, 2t..); B: b0 k = 2t, 2t+1.
    "A16x8": lambda g, t, r, e: (g + 8 * r, 2 * t + e),
    "B8x8": lambda g, t, r, e: (2 * t + e, g),
    # tf32 m16n8k8: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); b0 k = t, b1 k = t+4.
    "A16x8tf32": lambda g, t, r, e: (g + 8 * (r & 1), t + 4 * (r >> 1)),
    "B8x8tf32": lambda g, t, r, e: (t + 4 * r, g),
    # tf32 m16n8k4: a0 (g, t), a1 (g+8, t); b0 k = t.
    "A16x4tf32": lambda g, t, r, e: (g + 8 * r, t),
    "B4x8tf32": lambda g, t, r, e: (t, g),
    # C/D 16x8: f32 d0, d1 (g, 2t..2t+1), d2, d3 (g+8, ...); f16x2 d0 (g, ...), d1 (g+8, ...).
    "C16x8f32": lambda g, t, r, e: (g + 8 * (r >> 1), 2 * t + (r & 1)),
    "C16x8f16": lambda g, t, r, e: (g + 8 * r, 2 * t + e),
    # m8n8k4 f64: a0 (g, t); b0 (k = t, n = g); d0, d1 (g, 2t), (g, 2t+1).
    "A8x4f64": lambda g, t, r, e: (g, t),
    "B4x8f64": lambda g, t, r, e: (t, g),
    "C8x8f64": lambda g, t, r, e: (g, 2 * t + r),
}


def fragment_index(layout: str, regs: int, elems: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols), each shaped (32 lanes, regs, elems), of a fragment layout."""
    lane, r, e = np.meshgrid(np.arange(WARP), np.arange(regs), np.arange(elems), indexing="ij")
    return _LAYOUTS[layout](lane >> 2, lane & 3, r, e)


#: (shape, input type) → (M, N, K, A layout, A regs, B layout, B regs, input format).
CONFIGS: dict[tuple[str, str], tuple[int, int, int, str, int, str, int, FloatFormat]] = {
    ("m16n8k16", "f16"): (16, 8, 16, "A16x16", 4, "B16x8", 2, F16),
    ("m16n8k16", "bf16"): (16, 8, 16, "A16x16", 4, "B16x8", 2, BF16),
    ("m16n8k8", "f16"): (16, 8, 8, "A16x8", 2, "B8x8", 1, F16),
    ("m16n8k8", "bf16"): (16, 8, 8, "A16x8", 2, "B8x8", 1, BF16),
    ("m16n8k8", "tf32"): (16, 8, 8, "A16x8tf32", 4, "B8x8tf32", 2, TF32),
    ("m16n8k4", "tf32"): (16, 8, 4, "A16x4tf32", 2, "B4x8tf32", 1, TF32),
    ("m8n8k4", "f64"): (8, 8, 4, "A8x4f64", 1, "B4x8f64", 1, F64),
    # sm_90 f64 m16n8k8: the tf32 A/B layouts with one f64 per register.
    ("m16n8k8", "f64"): (16, 8, 8, "A16x8tf32", 4, "B8x8tf32", 2, F64),
}


def _regs(instr: Instruction, op: Operand, count: int, what: str) -> list[Operand]:
    if not isinstance(op, Vec) or len(op.items) != count:
        decode_error(instr, f"operand {what} must be a vector of {count} registers")
    return list(op.items)


#: A decoded fragment: (the registers' arrays it was decoded from, its (warps, rows, cols)
#: matrix, f64 or an f32 to widen).
Decoded = tuple[tuple[np.ndarray, ...], np.ndarray]
#: Per batch: fragments decoded lately, by layout, format and the identities of their
#: registers' arrays. A register's array never changes (a write binds a new one), and the entry
#: holds the arrays, so an identity seen again is the same value: an A or B fragment feeding
#: several mma, or a D read back as the next mma's C, is decoded once.
_DECODED: weakref.WeakKeyDictionary[ExecContext, dict[tuple[object, ...], Decoded]] = (
    weakref.WeakKeyDictionary()
)
#: Entries kept per batch (the fragments of a K step of a warp tile, and more), and bytes of
#: matrices at most (a batch of 64K lanes holds 4 MiB per f64 m16n8k16 A fragment).
MAX_DECODED = 32
DECODED_BYTES = 32 << 20


def _decoded(ctx: ExecContext) -> dict[tuple[object, ...], Decoded]:
    got = _DECODED.get(ctx)
    if got is None:
        got = _DECODED[ctx] = {}
    return got


def _keep(ctx: ExecContext, key: tuple[object, ...], entry: Decoded) -> None:
    """Remember a decoded fragment, forgetting the oldest beyond the limits."""
    cache = _decoded(ctx)
    limit = max(2, min(MAX_DECODED, DECODED_BYTES // max(1, entry[1].nbytes)))
    while len(cache) >= limit:
        del cache[next(iter(cache))]
    cache[key] = entry


def _raw(ctx: ExecContext, ops: list[Operand], fmt: FloatFormat) -> np.ndarray:
    """A fragment's registers as (n, regs) bits of the register width."""
    width = 64 if fmt is F64 else 32
    return np.stack([read_bits(ctx, op, width) for op in ops], axis=-1)


def _load(ctx: ExecContext, ops: list[Operand], fmt: FloatFormat) -> np.ndarray:
    """Fragment values, shape (warps, 32, regs, elems) as exact f64."""
    raw = _raw(ctx, ops, fmt).reshape(-1, WARP, len(ops))
    if fmt is F16:
        # Little-endian: the low half of each register is its first f16; f16 -> f64 is exact.
        halves16 = np.ascontiguousarray(raw).view(np.float16)
        return halves16.reshape(*raw.shape, 2).astype(np.float64)
    if fmt is F32:  # f32 -> f64 is exact
        f32: np.ndarray = np.ascontiguousarray(raw).view(np.float32).astype(np.float64)
        return f32[..., None]
    if fmt in (F16, BF16):
        halves = np.stack([raw & np.uint32(0xFFFF), raw >> np.uint32(16)], axis=-1)
        return decode(halves.astype(np.uint16), fmt)
    return decode(raw, fmt)[..., None]


def mma(instr: Instruction) -> Run:
    m = Mods(instr)
    if not (m.flag("sync") and m.flag("aligned")):
        m.fail("needs .sync.aligned")
    shape = m.one_of(("m16n8k16", "m16n8k8", "m16n8k4", "m8n8k4"), "shape", required=True)
    if not (m.flag("row") and m.flag("col")):
        m.fail("only the .row.col layouts are supported")
    dtype, atype, btype, ctype = m.types({"f16", "bf16", "tf32", "f32", "f64"}, 4)
    m.finish()
    cfg = CONFIGS.get((str(shape), atype))
    if cfg is None or btype != atype:
        m.fail(f"mma.{shape} with .{atype}/.{btype} inputs is not supported")
    big_m, big_n, big_k, a_lay, a_regs, b_lay, b_regs, fmt = cfg
    acc_ok = {"f16": ("f16", "f32"), "bf16": ("f32",), "tf32": ("f32",), "f64": ("f64",)}
    if dtype not in acc_ok[atype] or ctype not in acc_ok[atype]:
        m.fail(f"accumulators .{dtype}/.{ctype} are not defined for .{atype} inputs")
    if len(instr.operands) != 4:
        m.fail("expected operands d, a, b, c")
    d_op, a_op, b_op, c_op = instr.operands
    elems = 2 if fmt in (F16, BF16) else 1
    a_ops = _regs(instr, a_op, a_regs, "a")
    b_ops = _regs(instr, b_op, b_regs, "b")
    c_lay, c_regs, c_fmt, c_el = _acc_layout(str(shape), ctype)
    c_ops = _regs(instr, c_op, c_regs, "c")
    d_lay, d_regs, d_fmt, d_el = _acc_layout(str(shape), dtype)
    d_ops = _regs(instr, d_op, d_regs, "d")
    a_at = _Placement(fragment_index(a_lay, a_regs, elems), (big_m, big_k), a_lay)
    b_at = _Placement(fragment_index(b_lay, b_regs, elems), (big_k, big_n), b_lay)
    c_at = _Placement(fragment_index(c_lay, c_regs, c_el), (big_m, big_n), c_lay)
    d_rows, d_cols = fragment_index(d_lay, d_regs, d_el)
    d_flat = (d_rows * big_n + d_cols).ravel()
    # Register r of lane l of D: its element's index in the (warp's) matrix, for f32 D.
    d_by_reg = (d_rows * big_n + d_cols)[:, :, 0].T  # (regs, 32)
    d_index: dict[int, np.ndarray] = {}  # per warp count: (regs, n) into all warps' D

    def run(ctx: ExecContext) -> None:
        warps = ctx.mask.reshape(-1, WARP)
        if not ctx.mask.all():  # (one reduction where every lane runs: the usual case)
            partial = warps.any(axis=1) & ~warps.all(axis=1)
            if partial.any():
                whole = "mma.sync.aligned needs all 32 lanes of the warp"
                ctx.fail(whole, np.repeat(partial, WARP))
        nw = warps.shape[0]
        a_mat = a_at.load(ctx, a_ops, fmt, nw)
        b_mat = b_at.load(ctx, b_ops, fmt, nw)
        c_mat = c_at.load(ctx, c_ops, c_fmt, nw)
        with np.errstate(all="ignore"):
            d_mat = a_mat @ b_mat + c_mat
        if d_fmt is F32:
            index = d_index.get(nw)
            if index is None:
                per = np.arange(nw)[:, None] * (big_m * big_n)
                index = d_index[nw] = (per[None] + d_by_reg[:, None, :]).reshape(d_regs, -1)
            # f64 -> f32 in NumPy rounds to nearest even (subnormals, overflow included); only
            # NaNs need the canonical encoding. One conversion and gather for all registers,
            # each then a contiguous row.
            d32 = d_mat.astype(np.float32)
            f = d32.reshape(-1).take(index)
            bits32 = f.view(np.uint32)
            nan = np.isnan(f)
            if nan.any():
                bits32 = np.where(nan, np.uint32(F32.canonical_nan), bits32)
            rows = tuple(bits32)
            for op, row in zip(d_ops, rows, strict=True):
                write_bits(ctx, op, 32, row)
            if d_lay == c_lay:  # the next mma's C, if it reads these registers as written
                c_at.remember(ctx, d_ops, F32, rows, d32)
            return
        vals = d_mat.reshape(nw, -1).take(d_flat, axis=1).reshape(nw, WARP, d_regs, d_el)
        for r, op in enumerate(d_ops):
            v = vals[:, :, r, :].reshape(-1, d_el)
            if d_fmt is F64:
                write_bits(ctx, op, 64, np.ascontiguousarray(v[:, 0]).view(np.uint64))
            else:
                h = round_f64(v, F16, "rn").astype(np.uint32)
                write_bits(ctx, op, 32, h[:, 0] | (h[:, 1] << np.uint32(16)))

    return run


class _Placement:
    """Where a fragment's elements go in its matrix: a gather where the fragment covers every
    element once (all the layouts here), else a scatter into zeros."""

    def __init__(
        self, index: tuple[np.ndarray, np.ndarray], shape: tuple[int, int], layout: str
    ) -> None:
        self.index, self.shape = index, shape
        self.layout = layout
        flat = (index[0] * shape[1] + index[1]).ravel()
        self.perm: np.ndarray | None = None
        if flat.size == shape[0] * shape[1] and np.unique(flat).size == flat.size:
            self.perm = np.empty(flat.size, dtype=np.intp)
            self.perm[flat] = np.arange(flat.size)

    def load(self, ctx: ExecContext, ops: list[Operand], fmt: FloatFormat, nw: int) -> np.ndarray:
        """(warps, rows, cols) f64 of the fragment in registers `ops`: where it is a gather,
        its elements are gathered into matrix order while still bits (narrower than the f64
        values), then decoded."""
        if self.perm is None:
            return self.matrix(_load(ctx, ops, fmt))
        width = 64 if fmt is F64 else 32
        arrays = tuple(read_bits(ctx, op, width) for op in ops)
        key = (self.layout, fmt.name, *map(id, arrays))
        got = _decoded(ctx).get(key)
        if got is not None and all(x is y for x, y in zip(got[0], arrays, strict=True)):
            return got[1].astype(np.float64, copy=False)
        raw = np.stack(arrays, axis=-1)
        if fmt in (F16, BF16):  # two elements per register, the first in the low half
            raw = raw.view(np.uint16)
        bits = raw.reshape(nw, -1).take(self.perm, axis=1)
        out: np.ndarray = decode(bits, fmt).reshape(nw, *self.shape)
        _keep(ctx, key, (arrays, out))
        return out

    def remember(
        self,
        ctx: ExecContext,
        ops: list[Operand],
        fmt: FloatFormat,
        written: tuple[np.ndarray, ...],
        matrix: np.ndarray,
    ) -> None:
        """`matrix` is the fragment in registers `ops` if they hold the arrays `written` (a
        partial write merges them with the old values instead)."""
        arrays = tuple(read_bits(ctx, op, 32) for op in ops)
        if all(x is y for x, y in zip(arrays, written, strict=True)):
            key = (self.layout, fmt.name, *map(id, arrays))
            _keep(ctx, key, (arrays, matrix))

    def matrix(self, frag: np.ndarray) -> np.ndarray:
        """(warps, rows, cols) from fragments (warps, 32, regs, elems)."""
        nw = frag.shape[0]
        if self.perm is not None:
            out: np.ndarray = frag.reshape(nw, -1).take(self.perm, axis=1)
            return out.reshape(nw, *self.shape)
        mat = np.zeros((nw, *self.shape))
        mat[:, self.index[0], self.index[1]] = frag
        return mat


def _acc_layout(shape: str, acc: str) -> tuple[str, int, FloatFormat, int]:
    """Layout, register count, format and elements per register of C/D."""
    if shape == "m8n8k4":
        return "C8x8f64", 2, F64, 1
    if acc == "f16":
        return "C16x8f16", 2, F16, 2
    return "C16x8f32", 4, F64 if acc == "f64" else F32, 1
