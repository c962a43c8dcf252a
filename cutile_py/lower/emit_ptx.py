"""Tile IR → PTX for element-wise kernels over blocked layouts.

Each tile value becomes `per_thread` registers of the thread that holds those elements;
scalars are one register, uniform across the block. Loads and stores are vectorized per
chunk and predicated on bounds, so edge tiles need no branches.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import DType, bf16, bool_, f16, f32, i32, i64, round_to_bf16
from cutile_py.lower import emit_math
from cutile_py.lower.isel import (
    BITS_SUFFIX,
    F32_BINARY,
    F32_COMPARE,
    FLOAT_NAME,
    INT_BINARY,
    INT_COMPARE,
    INT_SUFFIX,
    MOV,
    ONE_BITS,
    PRED_BINARY,
    REG_CLASS,
)
from cutile_py.lower.layout import BlockedLayout, LayoutPlan
from cutile_py.ptx.builder import FunctionBuilder, Imm, Reg, Vec, f32_imm, int_imm


class LoweringError(Exception):
    """The IR uses something this back end cannot lower (a compiler limitation)."""


@dataclass(frozen=True)
class PtxParam:
    """One `.param` of the entry: a tensor's address or dim, or a scalar argument."""

    arg: int  # kernel parameter index
    what: str  # "ptr", "dim" or "scalar"
    axis: int = 0
    ptype: str = "u64"


@dataclass
class TensorRegs:
    base: Reg  # global address of element 0
    dims: list[Reg]  # run-time dims (u32)


@dataclass
class ChunkCoords:
    guard: Reg | None  # false for threads without a chunk in this repetition
    coords: list[Reg]  # the chunk's first element within the tile, per dim


@dataclass
class Emitter:
    kernel: o.Kernel
    plan: LayoutPlan
    fb: FunctionBuilder
    params: list[PtxParam] = field(default_factory=list)
    values: dict[int, list[Reg]] = field(default_factory=dict)
    tensors: dict[int, TensorRegs] = field(default_factory=dict)
    chunks: dict[tuple[tuple[int, ...], int], ChunkCoords] = field(default_factory=dict)
    #: Instruction families used that need more than the target's base PTX version.
    features: set[str] = field(default_factory=set)

    # -- registers ------------------------------------------------------------------------
    def regs(self, v: o.Value) -> list[Reg]:
        return self.values[id(v)]

    def define(self, v: o.Value, regs: list[Reg]) -> None:
        self.values[id(v)] = regs

    def new(self, dtype: type[DType]) -> Reg:
        return self.fb.reg(REG_CLASS[dtype])

    def count(self, v: o.Value) -> int:
        return self.plan.of(v.type).per_thread if v.type.shape else 1

    # -- preamble -------------------------------------------------------------------------
    def preamble(self) -> None:
        fb = self.fb
        for i, p in enumerate(self.kernel.params):
            if isinstance(p, o.TensorParam):
                name = f"p{i}_ptr"
                fb.params.append((name, "u64"))
                self.params.append(PtxParam(i, "ptr"))
                raw, base = fb.reg("b64"), fb.reg("b64")
                fb.ins("ld.param.u64", raw, f"[{name}]")
                fb.ins("cvta.to.global.u64", base, raw)
                dims = []
                for k in range(p.rank):
                    dname = f"p{i}_dim{k}"
                    fb.params.append((dname, "u32"))
                    self.params.append(PtxParam(i, "dim", k, "u32"))
                    r = fb.reg("b32")
                    fb.ins("ld.param.u32", r, f"[{dname}]")
                    dims.append(r)
                self.tensors[i] = TensorRegs(base, dims)
            else:
                value = self.kernel.param_values[i]
                if value is None:
                    continue  # a Constant: compiled in
                self.define(value, [self.scalar_param(i, p)])
        tid = fb.reg("b32")
        fb.ins("mov.u32", tid, "%tid.x")
        for layout in self.plan.layouts.values():
            self.chunk_coords(tid, layout)

    def scalar_param(self, i: int, p: o.ScalarParam) -> Reg:
        fb, name = self.fb, f"p{i}"
        if p.dtype is f32:
            fb.params.append((name, "f32"))
            self.params.append(PtxParam(i, "scalar", ptype="f32"))
            r = fb.reg("f32")
            fb.ins("ld.param.f32", r, f"[{name}]")
            return r
        if p.dtype is i32 or p.dtype is bool_:
            ptype = "s32" if p.dtype is i32 else "u32"
            fb.params.append((name, ptype))
            self.params.append(PtxParam(i, "scalar", ptype=ptype))
            r = fb.reg("b32")
            fb.ins(f"ld.param.{ptype}", r, f"[{name}]")
            if p.dtype is i32:
                return r
            pr = fb.reg("pred")
            fb.ins("setp.ne.u32", pr, r, 0)
            return pr
        if p.dtype is i64:
            fb.params.append((name, "s64"))
            self.params.append(PtxParam(i, "scalar", ptype="s64"))
            r = fb.reg("b64")
            fb.ins("ld.param.s64", r, f"[{name}]")
            return r
        raise LoweringError(f"scalar parameters of type {p.dtype.name} are not supported")

    def chunk_coords(self, tid: Reg, layout: BlockedLayout) -> None:
        """Each repetition's chunk: its guard and the tile coordinates of its first element."""
        fb = self.fb
        for r in range(layout.reps):
            c = fb.reg("b32")
            fb.ins("add.u32", c, tid, r * layout.threads)
            guard = None
            if layout.guarded and (r + 1) * layout.threads > layout.chunks:
                guard = fb.reg("pred")
                fb.ins("setp.lt.u32", guard, c, layout.chunks)
            e = fb.reg("b32")
            fb.ins("mul.lo.u32", e, c, layout.vec)
            coords: list[Reg] = []
            rest = e
            for d in reversed(layout.shape[1:]):
                i, q = fb.reg("b32"), fb.reg("b32")
                fb.ins("rem.u32", i, rest, d)
                fb.ins("div.u32", q, rest, d)
                coords.append(i)
                rest = q
            coords.append(rest)
            self.chunks[(layout.shape, r)] = ChunkCoords(guard, coords[::-1])

    # -- the body -------------------------------------------------------------------------
    def region(self, region: o.Region) -> None:
        for op in region.ops:
            self.op(op)

    def op(self, op: o.Op) -> None:
        handler = getattr(self, f"op_{op.opname}", None)
        if handler is None:
            raise LoweringError(f"no lowering for IR op {op.opname}")
        handler(op)

    def op_constant(self, op: o.ConstantOp) -> None:
        dt = op.result.type.dtype
        r = self.new(dt)
        fb = self.fb
        if dt is f32:
            fb.ins("mov.f32", r, f32_imm(float(op.value)))
        elif dt in (f16, bf16):
            fb.ins("mov.b16", r, Imm(f"0x{_bits16(float(op.value), dt):04X}"))
        elif dt is bool_:
            t = fb.reg("b32")
            fb.ins("mov.u32", t, int(bool(op.value)))
            fb.ins("setp.ne.u32", r, t, 0)
        else:
            fb.ins(f"mov.{INT_SUFFIX[dt]}", r, int_imm(int(op.value)))
        self.define(op.result, [r])

    def op_grid(self, op: o.GridOp) -> None:
        r = self.fb.reg("b32")
        special = "%ctaid" if op.which == "bid" else "%nctaid"
        self.fb.ins("mov.u32", r, f"{special}.{'xyz'[op.axis]}")
        self.define(op.result, [r])

    def op_tensor_dim(self, op: o.TensorDimOp) -> None:
        self.define(op.result, [self.tensors[op.param].dims[op.axis]])

    def op_iota(self, op: o.IotaOp) -> None:
        layout = self.plan.of(op.result.type)
        out = []
        for r in range(layout.reps):
            first = self.chunks[(layout.shape, r)].coords[0]
            for v in range(layout.vec):
                x = self.fb.reg("b32")
                self.fb.ins("add.u32", x, first, v)
                out.append(x)
        self.define(op.result, out)

    def op_broadcast(self, op: o.BroadcastOp) -> None:
        (r,) = self.regs(op.operands[0])
        self.define(op.result, [r] * self.count(op.result))

    # -- memory ---------------------------------------------------------------------------
    def access(
        self, param: int, index: list[Reg], layout: BlockedLayout, r: int, dtype: type[DType]
    ) -> tuple[Reg, list[tuple[Reg, int]]]:
        """Address of repetition `r`'s chunk, and for each vector of it a predicate and offset."""
        fb, t = self.fb, self.tensors[param]
        p = self.kernel.params[param]
        assert isinstance(p, o.TensorParam)
        cc = self.chunks[(layout.shape, r)]
        rank = len(layout.shape)
        g: list[Reg] = []
        rows = cc.guard
        for k in range(rank):
            gk = fb.reg("b32")
            fb.ins("mad.lo.u32", gk, index[k], layout.shape[k], cc.coords[k])
            g.append(gk)
            # A tile index so large (or negative) that index*shape wraps around 32 bits must
            # not land back inside the tensor: such a tile lies wholly outside it.
            fits = fb.reg("pred")
            fb.ins("setp.le.u32", fits, index[k], (0xFFFFFFFF - layout.shape[k]) // layout.shape[k])
            rows = fits if rows is None else self._and(rows, fits)
        for k in range(rank - 1):
            pk = fb.reg("pred")
            fb.ins("setp.lt.u32", pk, g[k], t.dims[k])
            rows = pk if rows is None else self._and(rows, pk)
        size = dtype.itemsize()
        addr = fb.reg("b64")
        if rank == 1:
            fb.ins("mad.wide.u32", addr, g[0], size, t.base)
        else:
            lin = fb.reg("b64")
            fb.ins("mul.wide.u32", lin, g[0], t.dims[1])
            for k in range(1, rank):
                gk64 = fb.reg("b64")
                fb.ins("cvt.u64.u32", gk64, g[k])
                fb.ins("add.s64", lin, lin, gk64)
                if k + 1 < rank:
                    dk = fb.reg("b64")
                    fb.ins("cvt.u64.u32", dk, t.dims[k + 1])
                    fb.ins("mul.lo.u64", lin, lin, dk)
            fb.ins("mad.lo.u64", addr, lin, size, t.base)
        width = self.vector_width(p, layout, dtype)
        vectors = []
        for j in range(0, layout.vec, width):
            last = fb.reg("b32")
            fb.ins("add.u32", last, g[-1], j)
            pj = fb.reg("pred")
            fb.ins("setp.lt.u32", pj, last, t.dims[-1])
            vectors.append((pj if rows is None else self._and(rows, pj), j))
        return addr, vectors

    def vector_width(self, p: o.TensorParam, layout: BlockedLayout, dtype: type[DType]) -> int:
        """Elements per access: within 16 bytes, the layout's chunk and the tensor's alignment."""
        if dtype is bool_:
            return 1
        return max(1, min(layout.vec, 16 // dtype.itemsize(), p.align))

    def _and(self, a: Reg, b: Reg) -> Reg:
        r = self.fb.reg("pred")
        self.fb.ins("and.pred", r, a, b)
        return r

    def op_load(self, op: o.LoadOp) -> None:
        res = op.result
        dt = res.type.dtype
        layout = self.plan.of(res.type)
        p = self.kernel.params[op.param]
        assert isinstance(p, o.TensorParam)
        index = [self.regs(v)[0] for v in op.operands]
        cache = "" if p.mut else ".nc"  # shared tensors are read-only while the kernel runs
        out: list[Reg] = []
        for r in range(layout.reps):
            addr, vectors = self.access(op.param, index, layout, r, dt)
            width = self.vector_width(p, layout, dt)
            for pred, j in vectors:
                out.extend(
                    self.load_vector(addr, j * dt.itemsize(), width, dt, pred, op.padding, cache)
                )
        self.define(res, out)

    def load_vector(
        self,
        addr: Reg,
        offset: int,
        width: int,
        dt: type[DType],
        pred: Reg,
        padding: float,
        cache: str,
    ) -> list[Reg]:
        fb = self.fb
        where = f"[{addr}+{offset}]" if offset else f"[{addr}]"
        if dt is bool_:
            h, r = fb.reg("b16"), fb.reg("pred")
            fb.ins("mov.b16", h, int(bool(padding)))
            fb.ins(f"ld.global{cache}.u8", h, where, pred=pred)
            fb.ins("setp.ne.b16", r, h, 0)
            return [r]
        if dt in (f16, bf16):
            pad = _bits16(float(padding), dt)
            if width == 1:
                h = fb.reg("b16")
                fb.ins("mov.b16", h, Imm(f"0x{pad:04X}"))
                fb.ins(f"ld.global{cache}.b16", h, where, pred=pred)
                return [h]
            words = [fb.reg("b32") for _ in range(width // 2)]
            for w in words:
                fb.ins("mov.b32", w, Imm(f"0x{pad * 0x10001:08X}"))
            self._ld(words, "b32", where, pred, cache)
            halves = []
            for w in words:
                lo, hi = fb.reg("b16"), fb.reg("b16")
                fb.ins("mov.b32", Vec((lo, hi)), w)
                halves += [lo, hi]
            return halves
        regs = [self.new(dt) for _ in range(width)]
        for x in regs:
            if dt is f32:
                fb.ins("mov.f32", x, f32_imm(float(padding)))
            else:
                fb.ins(f"mov.{BITS_SUFFIX[dt]}", x, int_imm(int(padding)))
        self._ld(regs, "f32" if dt is f32 else BITS_SUFFIX[dt], where, pred, cache)
        return regs

    def _ld(self, regs: list[Reg], suffix: str, where: str, pred: Reg, cache: str) -> None:
        vec = f".v{len(regs)}" if len(regs) > 1 else ""
        dst: Reg | Vec = Vec(tuple(regs)) if len(regs) > 1 else regs[0]
        self.fb.ins(f"ld.global{cache}{vec}.{suffix}", dst, where, pred=pred)

    def op_store(self, op: o.StoreOp) -> None:
        *idx, value = op.operands
        dt = value.type.dtype
        layout = self.plan.of(value.type)
        p = self.kernel.params[op.param]
        assert isinstance(p, o.TensorParam)
        index = [self.regs(v)[0] for v in idx]
        src = self.regs(value)
        width = self.vector_width(p, layout, dt)
        fb = self.fb
        for r in range(layout.reps):
            addr, vectors = self.access(op.param, index, layout, r, dt)
            for pred, j in vectors:
                regs = src[r * layout.vec + j : r * layout.vec + j + width]
                where = f"[{addr}+{j * dt.itemsize()}]" if j else f"[{addr}]"
                if dt is bool_:
                    h = fb.reg("b16")
                    fb.ins("selp.u16", h, 1, 0, regs[0])
                    fb.ins("st.global.u8", where, h, pred=pred)
                elif dt in (f16, bf16) and width > 1:
                    words = []
                    for k in range(0, width, 2):
                        w = fb.reg("b32")
                        fb.ins("mov.b32", w, Vec((regs[k], regs[k + 1])))
                        words.append(w)
                    self._st(words, "b32", where, pred)
                else:
                    suffix = {f32: "f32", f16: "b16", bf16: "b16"}.get(dt) or BITS_SUFFIX[dt]
                    self._st(list(regs), suffix, where, pred)

    def _st(self, regs: list[Reg], suffix: str, where: str, pred: Reg) -> None:
        vec = f".v{len(regs)}" if len(regs) > 1 else ""
        src: Reg | Vec = Vec(tuple(regs)) if len(regs) > 1 else regs[0]
        self.fb.ins(f"st.global{vec}.{suffix}", where, src, pred=pred)

    # -- element-wise ---------------------------------------------------------------------
    def elementwise(self, op: o.Op, fn: Callable[..., Reg]) -> None:
        n = self.count(op.result)
        ins = [self.regs(v) for v in op.operands]
        cache: dict[tuple[str, ...], Reg] = {}
        out = []
        for k in range(n):
            args = [regs[k] if len(regs) > 1 else regs[0] for regs in ins]
            key = tuple(a.name for a in args)
            if key not in cache:  # broadcast operands repeat: compute each distinct input once
                cache[key] = fn(*args)
            out.append(cache[key])
        self.define(op.result, out)

    def widen(self, x: Reg, dt: type[DType]) -> Reg:
        """A 16-bit float as f32 (exact)."""
        if dt is f32:
            return x
        r = self.fb.reg("f32")
        if dt is bf16:
            self.features.add("cvt.f32.bf16")
        self.fb.ins(f"cvt.f32.{FLOAT_NAME[dt]}", r, x)
        return r

    def narrow(self, x: Reg, dt: type[DType]) -> Reg:
        """An f32 rounded to nearest even into `dt`."""
        if dt is f32:
            return x
        r = self.fb.reg("b16")
        self.fb.ins(f"cvt.rn.{FLOAT_NAME[dt]}.f32", r, x)
        return r

    def op_unary(self, op: o.UnaryOp) -> None:
        dt, fb, kind = op.result.type.dtype, self.fb, op.kind
        fast = self.kernel.fast_math

        def one(x: Reg) -> Reg:
            if dt.is_float():
                xf = self.widen(x, dt)
                if kind in ("neg", "abs"):
                    r = fb.reg("f32")
                    fb.ins(f"{kind}.f32", r, xf)
                else:
                    r = getattr(emit_math, f"emit_{kind}")(fb, xf, fast=fast)
                return self.narrow(r, dt)
            r = self.new(dt)
            if dt is bool_:
                fb.ins("not.pred", r, x)
            elif kind == "not":
                fb.ins(f"not.{BITS_SUFFIX[dt]}", r, x)
            else:
                fb.ins(f"{kind}.{INT_SUFFIX[dt]}", r, x)
            return r

        self.elementwise(op, one)

    def op_binary(self, op: o.BinaryOp) -> None:
        dt, fb, kind = op.result.type.dtype, self.fb, op.kind
        fast = self.kernel.fast_math

        def one(a: Reg, b: Reg) -> Reg:
            if dt.is_float():
                af, bf = self.widen(a, dt), self.widen(b, dt)
                if kind == "div":
                    r = emit_math.emit_div(fb, af, bf, fast=fast)
                elif kind in F32_BINARY:
                    r = fb.reg("f32")
                    fb.ins(F32_BINARY[kind], r, af, bf)
                else:
                    raise LoweringError(f"{kind} on {dt.name} is not supported")
                return self.narrow(r, dt)
            if dt is bool_:
                r = fb.reg("pred")
                fb.ins(PRED_BINARY[kind], r, a, b)
                return r
            if kind in ("floordiv", "mod"):
                return self.int_divmod(kind, a, b, dt)
            r = self.new(dt)
            fb.ins(INT_BINARY[kind].format(s=INT_SUFFIX[dt], b=BITS_SUFFIX[dt]), r, a, b)
            return r

        self.elementwise(op, one)

    def int_divmod(self, kind: str, a: Reg, b: Reg, dt: type[DType]) -> Reg:
        """Python's floor division and modulo (sign of the divisor); 0 for a zero divisor."""
        fb, s, bits = self.fb, INT_SUFFIX[dt], BITS_SUFFIX[dt]
        q, rem, x = self.new(dt), self.new(dt), self.new(dt)
        fb.ins(f"div.{s}", q, a, b)
        fb.ins(f"rem.{s}", rem, a, b)
        fb.ins(f"xor.{bits}", x, rem, b)
        nonzero, neg, adjust = fb.reg("pred"), fb.reg("pred"), fb.reg("pred")
        fb.ins(f"setp.ne.{s}", nonzero, rem, 0)
        fb.ins(f"setp.lt.{s}", neg, x, 0)
        fb.ins("and.pred", adjust, nonzero, neg)
        out = self.new(dt)
        if kind == "floordiv":
            qm = self.new(dt)
            fb.ins(f"sub.{s}", qm, q, 1)
            fb.ins(f"selp.{bits}", out, qm, q, adjust)
        else:
            rp = self.new(dt)
            fb.ins(f"add.{s}", rp, rem, b)
            fb.ins(f"selp.{bits}", out, rp, rem, adjust)
        zero, res = fb.reg("pred"), self.new(dt)
        fb.ins(f"setp.eq.{s}", zero, b, 0)
        fb.ins(f"selp.{bits}", res, 0, out, zero)
        return res

    def op_compare(self, op: o.CompareOp) -> None:
        dt, fb, kind = op.operands[0].type.dtype, self.fb, op.kind

        def one(a: Reg, b: Reg) -> Reg:
            r = fb.reg("pred")
            if dt.is_float():
                fb.ins(f"setp.{F32_COMPARE[kind]}.f32", r, self.widen(a, dt), self.widen(b, dt))
            elif dt is bool_:
                ai, bi = fb.reg("b32"), fb.reg("b32")
                fb.ins("selp.u32", ai, 1, 0, a)
                fb.ins("selp.u32", bi, 1, 0, b)
                fb.ins(f"setp.{INT_COMPARE[kind]}.u32", r, ai, bi)
            else:
                fb.ins(f"setp.{INT_COMPARE[kind]}.{INT_SUFFIX[dt]}", r, a, b)
            return r

        self.elementwise(op, one)

    def op_select(self, op: o.SelectOp) -> None:
        dt, fb = op.result.type.dtype, self.fb

        def one(c: Reg, a: Reg, b: Reg) -> Reg:
            r = self.new(dt)
            if dt is bool_:
                t1, nc, t2 = fb.reg("pred"), fb.reg("pred"), fb.reg("pred")
                fb.ins("and.pred", t1, c, a)
                fb.ins("not.pred", nc, c)
                fb.ins("and.pred", t2, nc, b)
                fb.ins("or.pred", r, t1, t2)
            else:
                fb.ins(f"selp.{MOV[REG_CLASS[dt]]}", r, a, b, c)
            return r

        self.elementwise(op, one)

    def op_fma(self, op: o.FmaOp) -> None:
        dt, fb = op.result.type.dtype, self.fb

        def one(a: Reg, b: Reg, c: Reg) -> Reg:
            r = fb.reg("f32")
            fb.ins("fma.rn.f32", r, self.widen(a, dt), self.widen(b, dt), self.widen(c, dt))
            return self.narrow(r, dt)

        self.elementwise(op, one)

    def op_cast(self, op: o.CastOp) -> None:
        src, dst = op.operands[0].type.dtype, op.result.type.dtype
        self.elementwise(op, lambda x: self.cast(x, src, dst))

    def cast(self, x: Reg, src: type[DType], dst: type[DType]) -> Reg:
        fb = self.fb
        if src is dst:
            return x
        if src is bool_:
            r = self.new(dst)
            if dst is f32:
                fb.ins("selp.f32", r, f32_imm(1.0), f32_imm(0.0), x)
            elif dst in (f16, bf16):
                fb.ins("selp.b16", r, Imm(f"0x{ONE_BITS[dst]:04X}"), Imm("0x0000"), x)
            else:
                fb.ins(f"selp.{BITS_SUFFIX[dst]}", r, 1, 0, x)
            return r
        if dst is bool_:
            r = fb.reg("pred")
            if src.is_float():
                fb.ins("setp.neu.f32", r, self.widen(x, src), f32_imm(0.0))
            else:
                fb.ins(f"setp.ne.{INT_SUFFIX[src]}", r, x, 0)
            return r
        if src.is_float() and dst.is_float():
            return self.narrow(self.widen(x, src), dst)
        if src.is_float():
            r = self.new(dst)
            fb.ins(f"cvt.rzi.{INT_SUFFIX[dst]}.f32", r, self.widen(x, src))
            return r
        if dst.is_float():
            f = fb.reg("f32")
            fb.ins(f"cvt.rn.f32.{INT_SUFFIX[src]}", f, x)
            return self.narrow(f, dst)
        r = self.new(dst)
        if dst is i64:
            fb.ins("cvt.s64.s32", r, x)
        else:
            fb.ins("cvt.u32.u64", r, x)  # wraps, as NumPy's astype does
        return r

    # -- control flow ---------------------------------------------------------------------
    def mov(self, dst: Reg, src: Reg) -> None:
        self.fb.ins(f"mov.{MOV[dst.ptype]}", dst, src)

    def fresh_like(self, regs: list[Reg]) -> list[Reg]:
        """New registers for a value that is assigned more than once (loop or branch result)."""
        return [self.fb.reg(r.ptype) for r in regs]

    def copy_into(self, dst: list[list[Reg]], src: list[list[Reg]]) -> None:
        """Parallel copy: through temporaries, since a source may be another destination."""
        temps = []
        for d, s in zip(dst, src):
            t = self.fresh_like(d)
            for tr, sr in zip(t, s):
                self.mov(tr, sr)
            temps.append(t)
        for d, t in zip(dst, temps):
            for dr, tr in zip(d, t):
                self.mov(dr, tr)

    def op_for(self, op: o.ForOp) -> None:
        fb = self.fb
        lo, hi, step, *inits = op.operands
        iv = fb.reg("b32")
        self.mov(iv, self.regs(lo)[0])
        carried = [self.fresh_like(self.regs(v)) for v in inits]
        self.copy_into(carried, [self.regs(v) for v in inits])
        self.define(op.body.args[0], [iv])
        for arg, regs in zip(op.body.args[1:], carried):
            self.define(arg, regs)
        top, end = fb.new_label("loop"), fb.new_label("done")
        fb.place(top)
        done = fb.reg("pred")
        fb.ins("setp.le.s32" if op.descending else "setp.ge.s32", done, iv, self.regs(hi)[0])
        fb.ins("bra.uni", end, pred=done)
        body_ops = op.body.ops
        self.region(o.Region([], body_ops[:-1]))
        yielded = body_ops[-1]
        self.copy_into(carried, [self.regs(v) for v in yielded.operands])
        fb.ins("add.s32", iv, iv, self.regs(step)[0])
        fb.ins("bra.uni", top)
        fb.place(end)
        for res, regs in zip(op.results, carried):
            self.define(res, regs)

    def op_if(self, op: o.IfOp) -> None:
        fb = self.fb
        cond = self.regs(op.operands[0])[0]
        orelse, end = fb.new_label("else"), fb.new_label("endif")
        results: list[list[Reg]] = []
        for res in op.results:
            n = self.count(res)
            results.append([self.new(res.type.dtype) for _ in range(n)])
        fb.ins("bra.uni", orelse, pred=cond, negate=True)
        for k, region in enumerate((op.then, op.orelse)):
            if k:
                fb.place(orelse)
            self.region(o.Region([], region.ops[:-1]))
            self.copy_into(results, [self.regs(v) for v in region.ops[-1].operands])
            if not k:
                fb.ins("bra.uni", end)
        fb.place(end)
        for res, regs in zip(op.results, results):
            self.define(res, regs)

    def op_yield(self, op: o.YieldOp) -> None:
        raise LoweringError("yield outside a loop or branch")


def _bits16(x: float, dt: type[DType]) -> int:
    """The 16 bits of `x` rounded to f16 or bf16."""
    with np.errstate(over="ignore"):
        if dt is f16:
            return int(np.array([x], dtype=np.float16).view(np.uint16)[0])
        f = round_to_bf16(np.array([x], dtype=np.float32))
    return int(f.view(np.uint32)[0] >> 16)


def entry_name(name: str) -> str:
    """A valid PTX identifier for the kernel's entry."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return clean if clean and not clean[0].isdigit() else f"k_{clean}"
