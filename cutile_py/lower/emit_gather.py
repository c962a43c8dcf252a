"""Element-indexed global memory: gathers from shared tensors, scatters into the block's own
tile, and atomic updates of `Atomic` tensors.

Each element is one access at the address its coordinates give, predicated on every
coordinate lying inside the tensor (an unsigned compare, so a negative one is outside too)
and, for a scatter, inside the block's tile; a gather's masked elements keep the padding. A
scatter sits between two block barriers: which thread holds an element of the tile is the
layout's choice, so its stores are ordered against the block's other accesses to the tile.
"""

from __future__ import annotations

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import DType, bf16, bool_, f16, f32, i32, i64
from cutile_py.lower import emit_shared
from cutile_py.lower.context import EmitContext
from cutile_py.lower.emit_memory import load_vector
from cutile_py.lower.errors import LoweringError
from cutile_py.lower.index_strides import last_dim_stride
from cutile_py.lower.isel import BITS_SUFFIX
from cutile_py.lower.layout import Layout
from cutile_py.ptx.builder import Reg, Vec

#: `atom`/`red` type suffix of each dtype an atomic may update, per kind.
ATOMIC_SUFFIX: dict[tuple[str, type[DType]], str] = {
    ("add", f32): "f32",
    ("add", i32): "s32",
    ("add", i64): "u64",  # two's complement: the same bits as a signed add
    ("max", i32): "s32",
    ("min", i32): "s32",
    ("max", i64): "s64",
    ("min", i64): "s64",
    # f32 max/min have no `red` form: they split on the sign (`_float_extreme`).
    ("max", f32): "f32",
    ("min", f32): "f32",
}
#: The NaN each f32 extreme stores for a NaN value: the top of IEEE totalOrder for max, the
#: bottom for min, so that no later value displaces it.
_EXTREME_NAN = {"max": "0x7FFFFFFF", "min": "0xFFFFFFFF"}


class _Addressing:
    """One op's caches of a tensor's 64-bit dims, of the bounds checks and row addresses its
    elements share, and the address and bounds of elements. Used within one op's
    straight-line code: a cached register is defined before every use."""

    def __init__(self, em: EmitContext, param: int, dtype: type[DType]) -> None:
        self.em, self.size = em, max(dtype.itemsize(), 1)
        self.t = em.tensors[param]
        self.dims64: dict[int, Reg] = {}
        #: (dim, coordinate register) -> the coordinate lies in [0, dim).
        self.checks: dict[tuple[int, str], Reg] = {}
        #: The coordinates before the last -> the address of their row (last coordinate 0).
        self.rows: dict[tuple[str, ...], Reg] = {}

    def dim64(self, i: int) -> Reg:
        if i not in self.dims64:
            r = self.em.fb.reg("b64")
            self.em.fb.ins("cvt.u64.u32", r, self.t.dims[i])
            self.dims64[i] = r
        return self.dims64[i]

    def inside(self, coords: list[Reg]) -> Reg | None:
        """Every coordinate in [0, dim) (negative ones compare as huge unsigned values); a
        coordinate's check is made once for all the elements sharing it (a row's, say)."""
        pred: Reg | None = None
        for i, c in enumerate(coords):
            key = (i, c.name)
            if key not in self.checks:
                ok = self.em.fb.reg("pred")
                self.em.fb.ins("setp.lt.u32", ok, c, self.t.dims[i])
                self.checks[key] = ok
            pred = self.em.conj(pred, self.checks[key])
        return pred

    def address(self, coords: list[Reg]) -> Reg:
        """base + (row-major linear index) * itemsize, in 64 bits (tensors may pass 2^32): the
        row's address (the coordinates before the last), made once for the elements sharing
        it, plus the last coordinate times the itemsize (one `mad.wide.u32` an element)."""
        fb = self.em.fb
        *lead, last = coords
        key = tuple(c.name for c in lead)
        if key not in self.rows:
            row = self.t.base
            if lead:
                lin = fb.reg("b64")
                fb.ins("cvt.u64.u32", lin, lead[0])
                for i in range(1, len(lead)):
                    c64 = fb.reg("b64")
                    fb.ins("cvt.u64.u32", c64, lead[i])
                    fb.ins("mad.lo.u64", lin, lin, self.dim64(i), c64)
                stride = fb.reg("b64")  # bytes from one row to the next
                fb.ins("mul.lo.u64", stride, self.dim64(len(lead)), self.size)
                row = fb.reg("b64")
                fb.ins("mad.lo.u64", row, lin, stride, self.t.base)
            self.rows[key] = row
        addr = fb.reg("b64")
        fb.ins("mad.wide.u32", addr, last, self.size, self.rows[key])
        return addr


def _coords(em: EmitContext, values: tuple[o.Value, ...], lay: Layout) -> list[list[Reg]]:
    """Per element of `lay`, its coordinate registers (one per tensor dim)."""
    per_dim = [emit_shared.regs_as(em, v, lay) for v in values]
    return [list(regs) for regs in zip(*per_dim)]


def _vector_width(
    em: EmitContext, coords: tuple[o.Value, ...], dt: type[DType], lay: Layout
) -> int:
    """Elements one access may take: the layout's run along the last dim when the last index
    steps by one along it and the others stay put (else 1)."""
    base = lay.base
    if dt is bool_ or lay.dims[-1] != base.rank - 1 or base.vec == 1:
        return 1
    memo: dict[o.Value, int | None] = {}
    *others, last = coords
    if last_dim_stride(em.uses, last, memo) != 1:
        return 1
    if any(last_dim_stride(em.uses, c, memo) != 0 for c in others):
        return 1
    return min(base.vec, 16 // dt.itemsize())


def gather(em: EmitContext, op: o.GatherOp) -> None:
    res = op.result
    dt = res.type.dtype
    lay = em.layout(res)
    acc = _Addressing(em, op.param, dt)
    width = _vector_width(em, op.operands, dt, lay)
    if width > 1:
        em.define(res, _gather_vectors(em, op, lay, acc, width))
        return
    out: list[Reg] = []
    done: dict[tuple[str, ...], Reg] = {}
    for coords in _coords(em, op.operands, lay):
        key = tuple(c.name for c in coords)
        if key in done:  # replicated or broadcast coordinates: one load each
            out.append(done[key])
            continue
        pred, addr = acc.inside(coords), acc.address(coords)
        (r,) = load_vector(em, addr, 0, 1, dt, pred, op.padding, ".nc")
        done[key] = r
        out.append(r)
    em.define(res, out)


def _gather_vectors(
    em: EmitContext, op: o.GatherOp, lay: Layout, acc: _Addressing, width: int
) -> list[Reg]:
    """Runs of `width` consecutive elements: one vector load where the run is aligned and
    wholly inside the tensor (checked at run time), else one predicated load per element."""
    dt = op.result.type.dtype
    fb = em.fb
    size = dt.itemsize()
    elems = _coords(em, op.operands, lay)
    out: list[Reg] = []
    for k in range(0, len(elems), width):
        run = elems[k : k + width]
        first, last = run[0], run[-1][-1]
        addr = acc.address(first)
        ok = acc.inside(first)
        end = fb.reg("pred")
        fb.ins("setp.lt.u32", end, last, acc.t.dims[len(first) - 1])
        whole = _aligned(em, addr, width * size, ok, end)
        regs = load_vector(em, addr, 0, width, dt, whole, op.padding, ".nc")
        rest = fb.reg("pred")
        fb.ins("not.pred", rest, whole)
        for i in range(1, width):  # element 0's address is `addr` already
            regs[i] = _load_into(
                em, regs[i], acc.address(run[i]), dt, em.conj(rest, acc.inside(run[i]))
            )
        regs[0] = _load_into(em, regs[0], addr, dt, em.conj(rest, ok))
        out.extend(regs)
    return out


def _suffix(dt: type[DType]) -> str:
    return "f32" if dt is f32 else "b16" if dt in (f16, bf16) else BITS_SUFFIX[dt]


def _load_into(em: EmitContext, r: Reg, addr: Reg, dt: type[DType], pred: Reg | None) -> Reg:
    """`r`, overwritten by the element at `addr` where `pred` (a scalar load)."""
    em.fb.ins(f"ld.global.nc.{_suffix(dt)}", r, f"[{addr}]", pred=pred)
    return r


def _element_guards(em: EmitContext, lay: Layout) -> list[Reg | None]:
    """Per element of `lay`: it lies inside the value's tile and this thread owns its copy."""
    owner = em.owner(lay)
    return [em.conj(em.valid(lay, offs), owner) for offs in lay.registers()]


def scatter(em: EmitContext, op: o.ScatterOp) -> None:
    *coord_values, value = op.operands
    dt = value.type.dtype
    p = em.kernel.params[op.param]
    assert isinstance(p, o.TensorParam)
    lay = em.layout(value)
    src = emit_shared.regs_as(em, value, lay)
    acc = _Addressing(em, op.param, dt)
    fb = em.fb
    # The block's tile origin, once: bid * tile along each grid axis.
    origin: list[Reg] = []
    for i, tile in enumerate(p.dims):
        assert tile is not None
        g = fb.reg("b32")
        fb.ins("mov.u32", g, em.block_index(i))
        fb.ins("mul.lo.u32", g, g, tile)
        origin.append(g)
    guards = _element_guards(em, lay)
    coords = tuple(coord_values)
    width = _vector_width(em, coords, dt, lay)
    # The tile's other writers and readers in this block (a store before, a load after) are
    # other threads: order the scatter after and before them, as the program text does.
    em.barrier()
    preds: list[Reg | None] = []
    addrs: list[Reg] = []
    for k, cs in enumerate(_coords(em, coords, lay)):
        pred = guards[k]
        glob: list[Reg] = []
        for i, c in enumerate(cs):
            tile = p.dims[i]
            assert tile is not None
            ok = fb.reg("pred")
            fb.ins("setp.lt.u32", ok, c, tile)  # inside this block's own tile
            pred = em.conj(pred, ok)
            gc = fb.reg("b32")
            fb.ins("add.u32", gc, origin[i], c)
            glob.append(gc)
        preds.append(em.conj(pred, acc.inside(glob)))
        addrs.append(acc.address(glob))
    for k in range(0, len(src), width):
        rest: Reg | None = None
        if width > 1:
            # Consecutive indices: the run's first and last elements stored means all are
            # (bounds and edge guards are monotone along the run); then one vector store.
            whole = _aligned(em, addrs[k], width * dt.itemsize(), preds[k], preds[k + width - 1])
            _store_vector(em, addrs[k], src[k : k + width], dt, whole)
            rest = fb.reg("pred")
            fb.ins("not.pred", rest, whole)
        for i in range(k, k + width):
            _store_one(em, addrs[i], src[i], dt, em.conj(rest, preds[i]))
    em.barrier()


def _aligned(em: EmitContext, addr: Reg, nbytes: int, *preds: Reg | None) -> Reg:
    """`addr` is a multiple of `nbytes`, and every one of `preds` holds."""
    fb = em.fb
    low, ok = fb.reg("b64"), fb.reg("pred")
    fb.ins("and.b64", low, addr, nbytes - 1)
    fb.ins("setp.eq.u64", ok, low, 0)
    for p in preds:
        if p is not None:
            ok = em.and_(ok, p)
    return ok


def _store_vector(em: EmitContext, addr: Reg, regs: list[Reg], dt: type[DType], pred: Reg) -> None:
    fb = em.fb
    if dt in (f16, bf16):
        words = []
        for k in range(0, len(regs), 2):
            w = fb.reg("b32")
            fb.ins("mov.b32", w, Vec((regs[k], regs[k + 1])))
            words.append(w)
        regs, suffix = words, "b32"
    else:
        suffix = _suffix(dt)
    src: Reg | Vec = Vec(tuple(regs)) if len(regs) > 1 else regs[0]
    vec = f".v{len(regs)}" if len(regs) > 1 else ""
    fb.ins(f"st.global{vec}.{suffix}", f"[{addr}]", src, pred=pred)


def _store_one(em: EmitContext, addr: Reg, x: Reg, dt: type[DType], pred: Reg | None) -> None:
    fb = em.fb
    if dt is bool_:
        h = fb.reg("b16")
        fb.ins("selp.u16", h, 1, 0, x)
        fb.ins("st.global.u8", f"[{addr}]", h, pred=pred)
        return
    suffix = {f32: "f32", f16: "b16", bf16: "b16"}.get(dt) or BITS_SUFFIX[dt]
    fb.ins(f"st.global.{suffix}", f"[{addr}]", x, pred=pred)


def atomic(em: EmitContext, op: o.AtomicOp) -> None:
    *coord_values, value = op.operands
    dt = value.type.dtype
    suffix = ATOMIC_SUFFIX.get((op.kind, dt))
    if suffix is None:
        raise LoweringError(f"atomic {op.kind} of {dt.name} is not supported")
    lay = em.layout(value)
    src = emit_shared.regs_as(em, value, lay)
    acc = _Addressing(em, op.param, dt)
    guards = _element_guards(em, lay)
    for k, coords in enumerate(_coords(em, tuple(coord_values), lay)):
        pred = em.conj(guards[k], acc.inside(coords))
        addr = acc.address(coords)
        if dt is f32 and op.kind != "add":
            _float_extreme(em, op.kind, addr, src[k], pred)
            continue
        # `red`: no result is needed, and the memory system may combine the updates.
        em.fb.ins(f"red.global.{op.kind}.{suffix}", f"[{addr}]", src[k], pred=pred)


def _float_extreme(em: EmitContext, kind: str, addr: Reg, x: Reg, pred: Reg | None) -> None:
    """f32 `red` max/min as integer ones on the bits: IEEE totalOrder is the s32 order on
    non-negative patterns and the reverse u32 order on negative ones, and each half sits
    wholly above (below) the other. So a value with the sign clear updates by max.s32 (min.s32),
    one with it set by min.u32 (max.u32); either leaves an element of the other half alone
    or replaces it as it should. A NaN value becomes the extreme NaN (`_EXTREME_NAN`)."""
    fb = em.fb
    bits, nan, neg, pos = fb.reg("b32"), fb.reg("pred"), fb.reg("pred"), fb.reg("pred")
    fb.ins("mov.b32", bits, x)
    fb.ins("setp.nan.f32", nan, x, x)
    fb.ins("selp.b32", bits, _EXTREME_NAN[kind], bits, nan)
    fb.ins("setp.lt.s32", neg, bits, 0)
    fb.ins("setp.ge.s32", pos, bits, 0)
    on_pos, on_neg = ("max.s32", "min.u32") if kind == "max" else ("min.s32", "max.u32")
    fb.ins(f"red.global.{on_pos}", f"[{addr}]", bits, pred=em.conj(pred, pos))
    fb.ins(f"red.global.{on_neg}", f"[{addr}]", bits, pred=em.conj(pred, neg))
