"""Global loads and stores of tiles: addressing, bounds, vectorization.

Per access the uniform part (the tile's origin and how much of the tensor remains past it)
is computed once; each thread then adds its own coordinate once, and every register of the
tile is an immediate offset from one row address, predicated on the edge of the tensor, the
edge of the tile and, for stores of replicated layouts, on the one thread that owns the copy.
A load in a loop checks the tensor's edges once per thread instead, and only the threads at
an edge take the path that checks each access (`_load_split`).
"""

from __future__ import annotations

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import DType, bf16, bool_, f16, f32
from cutile_py.lower import emit_shared, emit_store
from cutile_py.lower.context import EmitContext
from cutile_py.lower.isel import BITS_SUFFIX, bits16
from cutile_py.lower.layout import Layout
from cutile_py.ptx.builder import Imm, Reg, Vec, f32_imm, int_imm


class Access:
    """Where each register of a tile lives in global memory, and when it may be touched."""

    def __init__(
        self,
        em: EmitContext,
        param: int,
        index: list[Reg],
        shape: tuple[int, ...],
        lay: Layout,
        dtype: type[DType],
        within: tuple[int, ...] | None,
    ) -> None:
        self.em, self.lay, self.dtype = em, lay, dtype
        fb = em.fb
        p = em.kernel.params[param]
        assert isinstance(p, o.TensorParam)
        t = em.tensors[param]
        br = em.bases[lay.base]
        rank = len(shape)
        size = dtype.itemsize()
        # Uniform: the tile origin, whether the tile index is sane, the elements left.
        tile_ok: Reg | None = None
        #: How the uniform index checks were made, to redo them (`tile_ok_along`).
        self.checks: list[tuple[Reg, Reg, int]] = []
        self.dim_ok: list[Reg] = []  # per dim: its tile index is sane
        self.dims = t.dims
        origin: list[Reg] = []
        for i in range(rank):
            ok = fb.reg("pred")
            g = fb.reg("b32")
            if within is not None:
                # A sub-tile of the block's own tile: its index must stay inside that tile.
                fb.ins("setp.lt.u32", ok, index[i], within[i] // shape[i])
                b = fb.reg("b32")
                fb.ins("mov.u32", b, em.block_index(i))
                fb.ins("mul.lo.u32", b, b, within[i])
                fb.ins("mad.lo.u32", g, index[i], shape[i], b)
            else:
                # An index so large (or negative) that index*shape wraps must not land back
                # inside the tensor: such a tile lies wholly outside it.
                bound = (0x7FFFFFFF - shape[i]) // shape[i]
                fb.ins("setp.le.u32", ok, index[i], bound)
                fb.ins("mul.lo.u32", g, index[i], shape[i])
                self.checks.append((ok, index[i], bound))
            self.dim_ok.append(ok)
            tile_ok = ok if tile_ok is None else em.and_(tile_ok, ok)
            origin.append(g)
        # Per thread: its coordinate, the elements left past it, and its row address.
        left: list[Reg] = []
        coord: list[Reg] = []
        for i in range(rank):
            d = lay.dims[i]
            c = origin[i]
            if d is not None:
                c = fb.reg("b32")
                fb.ins("add.u32", c, origin[i], br.coord[d])
            rem = fb.reg("b32")
            fb.ins("sub.s32", rem, t.dims[i], c)
            coord.append(c)
            left.append(rem)
        lin = fb.reg("b64")
        fb.ins("cvt.u64.u32", lin, coord[0])
        self.row_bytes: list[Reg | None] = []
        for i in range(1, rank):
            d64, c64 = fb.reg("b64"), fb.reg("b64")
            fb.ins("cvt.u64.u32", d64, t.dims[i])
            fb.ins("cvt.u64.u32", c64, coord[i])
            fb.ins("mad.lo.u64", lin, lin, d64, c64)
        # Bytes between consecutive indices of each dim, for the static offsets.
        for i in range(rank - 1):
            rb = fb.reg("b64")
            fb.ins("mov.u64", rb, size)
            for k in range(i + 1, rank):
                d64 = fb.reg("b64")
                fb.ins("cvt.u64.u32", d64, t.dims[k])
                fb.ins("mul.lo.u64", rb, rb, d64)
            self.row_bytes.append(rb)
        self.row_bytes.append(None)
        self.addr = fb.reg("b64")
        fb.ins("mad.lo.u64", self.addr, lin, size, t.base)
        self.tile_ok = tile_ok
        self.left = left
        self.size = size
        self.rank = rank
        self.inside: dict[tuple[int, int], Reg] = {}
        self.rows: dict[tuple[int, ...], Reg] = {}
        # Elements per access: 16 bytes at most, within the layout's run along the last dim,
        # and no wider than the tensor's alignment allows.
        last = lay.dims[-1]
        contiguous = last is not None and last == lay.base.rank - 1
        self.width = 1
        if contiguous and dtype is not bool_:
            self.width = max(1, min(lay.base.vec, 16 // size, p.align))

    def advance(self, deltas: list[Reg], step_bytes: Reg, varying: tuple[bool, ...]) -> None:
        """Move this access by one step, in place, once the caller has advanced the index
        registers it was made from: `deltas[i]` is the change of the tile's origin along dim
        i (in elements; 0, and skipped, where `varying[i]` is False), `step_bytes` that of
        its address. The tile-index checks of the new step are `tile_ok_along(...,
        recheck=True)`."""
        fb = self.em.fb
        for i, d in enumerate(deltas):
            if varying[i]:
                fb.ins("sub.s32", self.left[i], self.left[i], d)
        fb.ins("add.s64", self.addr, self.addr, step_bytes)
        # Row addresses and edge predicates are made again where used: as cheap as
        # advancing them, and not live (registers, predicates) across the loop.
        self.rows.clear()
        self.inside.clear()

    def tile_ok_along(self, dims: list[bool], recheck: bool = False) -> Reg | None:
        """Whether the tile index is sane along the dims marked in `dims` (None: no dim
        marked); with `recheck`, those checks are made again from the current index."""
        pred: Reg | None = None
        fb = self.em.fb
        for i, on in enumerate(dims):
            if not on:
                continue
            ok = self.dim_ok[i]
            if recheck:
                check = next(c for c in self.checks if c[0] is ok)
                ok = fb.reg("pred")
                fb.ins("setp.le.u32", ok, check[1], check[2])
            pred = self.em.conj(pred, ok)
        return pred

    def vectors_static(self) -> list[dict[int, int]]:
        """The static offsets of each vector `vectors` makes, in its order (nothing emitted)."""
        regs = self.lay.registers()
        return [regs[k] for k in range(0, len(regs), self.width)]

    def row_address_wide(self, outer: tuple[int, ...]) -> Reg:
        """`row_address(outer)`; a row offset along the next-to-last dim alone is one
        32 x 32 -> 64-bit multiply-add (the last dim's extent times a constant)."""
        if not any(outer) or any(outer[:-1]) or self.rank < 2:
            return self.row_address(outer)
        if outer not in self.rows:
            r = self.em.fb.reg("b64")
            self.em.fb.ins(
                "mad.wide.u32", r, self.dims[self.rank - 1], outer[-1] * self.size, self.addr
            )
            self.rows[outer] = r
        return self.rows[outer]

    def in_bounds(self, i: int, off: int) -> Reg:
        """Element `off` past this thread's coordinate along dim i lies inside the tensor."""
        key = (i, off)
        if key not in self.inside:
            r = self.em.fb.reg("pred")
            self.em.fb.ins("setp.gt.s32", r, self.left[i], off)
            self.inside[key] = r
        return self.inside[key]

    def row_address(self, outer: tuple[int, ...]) -> Reg:
        """The address of the element at static offsets `outer` (all dims but the last)."""
        if not any(outer):
            return self.addr
        if outer not in self.rows:
            fb = self.em.fb
            a = self.addr
            for i, off in enumerate(outer):
                if off:
                    rb = self.row_bytes[i]
                    assert rb is not None
                    n = fb.reg("b64")
                    fb.ins("mad.lo.u64", n, rb, off, a)
                    a = n
            self.rows[outer] = a
        return self.rows[outer]

    def all_inside(self) -> Reg | None:
        """Every access of this thread lies inside the tensor, and the tile index is sane:
        what `vectors` checks per access, checked once (at each dim's farthest offset, or
        the tile's end where that lies past it; the edge checks are monotone along a dim)."""
        reach: dict[int, int] = {}
        for offs in self.vectors_static():
            for i, d in enumerate(self.lay.dims):
                off = offs[d] if d is not None else 0
                reach[i] = max(reach.get(i, 0), off)
        pred = self.tile_ok
        for i, off in sorted(reach.items()):
            d = self.lay.dims[i]
            if d is not None and self.lay.base.guarded(d, off):
                pred = self.em.conj(pred, self._tile_end_inside(i, d, off))
            else:
                pred = self.em.conj(pred, self.in_bounds(i, off))
        return pred

    def _tile_end_inside(self, i: int, d: int, reach: int) -> Reg:
        """This thread's elements along dim i lie inside the tensor, where its farthest
        offset `reach` may lie past the tile's end (a layout wider than the tile): its
        farthest element inside the tile does (`BaseRegs.ends`, made in the preamble: one
        compare here, as at `reach`). Checked at `reach`, such a thread would take the edge
        path at every tile, interior ones too (a (2, 1000) tile on 64 threads: the 8 threads
        holding columns 1000..1023)."""
        fb = self.em.fb
        r = fb.reg("pred")
        fb.ins("setp.gt.s32", r, self.left[i], self.em.bases[self.lay.base].ends[(d, reach)])
        return r

    def vectors(
        self, owner: Reg | None, bounds: bool = True
    ) -> list[tuple[list[int], Reg, int, Reg | None]]:
        """Per access: register indices, row address, byte offset and predicate; without
        `bounds`, the predicate leaves out the tensor's edges and the tile index (the caller
        checked them: `all_inside`)."""
        em, lay = self.em, self.lay
        out = []
        regs = lay.registers()
        k = 0
        while k < len(regs):
            offs = regs[k]
            static = [offs[d] if d is not None else 0 for d in lay.dims]
            group = list(range(k, k + self.width))
            k += self.width
            pred = None
            if bounds:
                pred = self.tile_ok
                for i, off in enumerate(static):
                    pred = em.conj(pred, self.in_bounds(i, off))
            pred = em.conj(pred, em.valid(lay, offs))
            pred = em.conj(pred, owner)
            row = self.row_address(tuple(static[:-1]))
            out.append((group, row, static[-1] * self.size, pred))
        return out


def _memory_layout(em: EmitContext, op: o.Op, v: o.Value) -> Layout:
    return em.plan.memory.get(op) or em.layout(v)


def load(em: EmitContext, op: o.LoadOp) -> None:
    res = op.result
    dt = res.type.dtype
    lay = _memory_layout(em, op, res)
    p = em.kernel.params[op.param]
    assert isinstance(p, o.TensorParam)
    index = [em.regs(v)[0] for v in op.operands]
    acc = Access(em, op.param, index, op.shape, lay, dt, op.within)
    cache = "" if p.mut else ".nc"  # shared tensors are read-only while the kernel runs
    padding = None if op in em.unpadded else op.padding  # unobservable: not written
    out: list[Reg] = []
    inside = acc.all_inside() if em.loop_depth and len(acc.vectors_static()) > 1 else None
    if inside is not None:
        out = _load_split(em, acc, inside, dt, padding, cache)
    else:
        for group, row, offset, pred in acc.vectors(None):
            out.extend(load_vector(em, row, offset, len(group), dt, pred, padding, cache))
    if lay != em.layout(res):
        out = emit_shared.convert(em, out, lay, em.layout(res), res.type, res.type)
    em.define(res, out)


def _load_split(
    em: EmitContext,
    acc: Access,
    inside: Reg,
    dt: type[DType],
    padding: float | None,
    cache: str,
) -> list[Reg]:
    """A tile load in a loop, in two paths: a thread whose accesses all lie inside the
    tensor (`inside`: every tile but those at its edges) loads unchecked, with no padding
    written; the others check each access. In a loop the checks would cost each iteration about an
    instruction an access and one a register pair of padding (gemv f32, 64 elements a
    thread: 73 of the loop's 197 sm_90 SASS instructions)."""
    fb = em.fb
    edge, loaded = fb.new_label("edge"), fb.new_label("loaded")
    fb.ins("bra", edge, pred=inside, negate=True)
    dests: list[list[Reg]] = []
    for group, row, offset, pred in acc.vectors(None, bounds=False):
        dest = _vector_registers(em, len(group), dt)
        _fill_vector(em, dest, row, offset, dt, pred, padding, cache)
        dests.append(dest)
    fb.ins("bra.uni", loaded)
    fb.place(edge)
    acc.rows.clear()  # the row addresses made above are not defined on this path
    for (_, row, offset, pred), dest in zip(acc.vectors(None), dests, strict=True):
        _fill_vector(em, dest, row, offset, dt, pred, padding, cache)
    fb.place(loaded)
    return [r for dest in dests for r in _vector_values(em, dest, dt)]


def load_vector(
    em: EmitContext,
    addr: Reg,
    offset: int,
    width: int,
    dt: type[DType],
    pred: Reg | None,
    padding: float | None,
    cache: str,
) -> list[Reg]:
    """`width` elements at `addr + offset` where `pred`, else `padding` (None: left as the
    registers were, where the plan proved no store can see them): one load (16-bit elements
    in b32 pairs; a bool is one byte); `cache` is "" or ".nc"."""
    dest = _vector_registers(em, width, dt)
    _fill_vector(em, dest, addr, offset, dt, pred, padding, cache)
    return _vector_values(em, dest, dt)


def _vector_registers(em: EmitContext, width: int, dt: type[DType]) -> list[Reg]:
    """The registers one load of `width` elements writes: a b16 for a bool's byte or one
    16-bit element, b32 pairs for more, else one register an element."""
    fb = em.fb
    if dt is bool_ or (dt in (f16, bf16) and width == 1):
        return [fb.reg("b16")]
    if dt in (f16, bf16):
        return [fb.reg("b32") for _ in range(width // 2)]
    return [em.new(dt) for _ in range(width)]


def _fill_vector(
    em: EmitContext,
    dest: list[Reg],
    addr: Reg,
    offset: int,
    dt: type[DType],
    pred: Reg | None,
    padding: float | None,
    cache: str,
) -> None:
    """Load `dest` (`_vector_registers`) from `addr + offset` where `pred`, else write
    `padding` (None: nothing) into it."""
    fb = em.fb
    where = f"[{addr}+{offset}]" if offset else f"[{addr}]"
    pad = padding if pred is not None else None  # an unpredicated load leaves none to pad
    if dt is bool_:
        if pad is not None:
            fb.ins("mov.b16", dest[0], int(bool(pad)))
        fb.ins(f"ld.global{cache}.u8", dest[0], where, pred=pred)
        return
    if dt in (f16, bf16):
        bits = None if pad is None else bits16(float(pad), dt)
        if bits is not None:
            for w in dest:
                if w.ptype == "b16":
                    fb.ins("mov.b16", w, Imm(f"0x{bits:04X}"))
                else:
                    fb.ins("mov.b32", w, Imm(f"0x{bits * 0x10001:08X}"))
        _ld(em, dest, dest[0].ptype, where, pred, cache)
        return
    if pad is not None:
        for x in dest:
            if dt is f32:
                fb.ins("mov.f32", x, f32_imm(float(pad)))
            else:
                fb.ins(f"mov.{BITS_SUFFIX[dt]}", x, int_imm(int(pad)))
    _ld(em, dest, "f32" if dt is f32 else BITS_SUFFIX[dt], where, pred, cache)


def _vector_values(em: EmitContext, dest: list[Reg], dt: type[DType]) -> list[Reg]:
    """The elements a loaded `dest` holds: a bool's byte as a predicate, b32 pairs of 16-bit
    elements split in halves, else the registers themselves."""
    fb = em.fb
    if dt is bool_:
        r = fb.reg("pred")
        fb.ins("setp.ne.b16", r, dest[0], 0)
        return [r]
    if dt in (f16, bf16) and dest[0].ptype == "b32":
        halves = []
        for w in dest:
            lo, hi = fb.reg("b16"), fb.reg("b16")
            fb.ins("mov.b32", Vec((lo, hi)), w)
            em.halves[lo], em.halves[hi] = (w, 0), (w, 1)
            halves += [lo, hi]
        return halves
    return dest


def _ld(
    em: EmitContext, regs: list[Reg], suffix: str, where: str, pred: Reg | None, cache: str
) -> None:
    vec = f".v{len(regs)}" if len(regs) > 1 else ""
    dst: Reg | Vec = Vec(tuple(regs)) if len(regs) > 1 else regs[0]
    em.fb.ins(f"ld.global{cache}{vec}.{suffix}", dst, where, pred=pred)


def store(em: EmitContext, op: o.StoreOp) -> None:
    tma = em.tma_stores.get(op)
    if tma is not None:  # an accumulator's TMA epilogue (`plan_store`)
        emit_store.store(em, op, tma)
        return
    *idx, value = op.operands
    dt = value.type.dtype
    lay = _memory_layout(em, op, value)
    index = [em.regs(v)[0] for v in idx]
    src = emit_shared.regs_as(em, value, lay)
    acc = Access(em, op.param, index, value.type.shape, lay, dt, op.within)
    fb = em.fb
    for group, row, offset, pred in acc.vectors(em.owner(lay)):
        regs = [src[k] for k in group]
        where = f"[{row}+{offset}]" if offset else f"[{row}]"
        if dt is bool_:
            h = fb.reg("b16")
            fb.ins("selp.u16", h, 1, 0, regs[0])
            fb.ins("st.global.u8", where, h, pred=pred)
        elif dt in (f16, bf16) and len(regs) > 1:
            words = []
            for k in range(0, len(regs), 2):
                w = fb.reg("b32")
                fb.ins("mov.b32", w, Vec((regs[k], regs[k + 1])))
                words.append(w)
            _st(em, words, "b32", where, pred)
        else:
            suffix = {f32: "f32", f16: "b16", bf16: "b16"}.get(dt) or BITS_SUFFIX[dt]
            _st(em, regs, suffix, where, pred)


def _st(em: EmitContext, regs: list[Reg], suffix: str, where: str, pred: Reg | None) -> None:
    vec = f".v{len(regs)}" if len(regs) > 1 else ""
    src: Reg | Vec = Vec(tuple(regs)) if len(regs) > 1 else regs[0]
    em.fb.ins(f"st.global{vec}.{suffix}", where, src, pred=pred)
