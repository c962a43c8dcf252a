"""Tile IR → PTX for element-wise kernels over blocked layouts.

Each tile value becomes `per_thread` registers of the thread that holds those elements;
scalars are one register, uniform across the block. Loads and stores are vectorized per
chunk and predicated on bounds, so edge tiles need no branches.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import DType, bf16, bool_, f16, f32, i32, i64
from cutile_py.lower import (
    emit_fragments,
    emit_gather,
    emit_math,
    emit_memory,
    emit_persistent,
    emit_pipeline,
    emit_scan,
    emit_shared,
    emit_store,
    emit_tma,
    emit_wgmma,
)
from cutile_py.lower.context import EmitContext, TensorRegs
from cutile_py.lower.errors import LoweringError
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
    bits16,
)
from cutile_py.lower.layout import Layout
from cutile_py.lower.size_scratch import ENTER, LEAVE
from cutile_py.ptx.builder import TENSOR_MAP_PTYPE, Imm, Reg, f32_imm, int_imm

__all__ = [
    "FRAGMENT_HANDLERS",
    "HANDLERS",
    "Emitter",
    "LoweringError",
    "PtxParam",
    "entry_name",
    "entry_params",
]


@dataclass(frozen=True)
class PtxParam:
    """One `.param` of the entry: a tensor's address or dim, or a scalar argument."""

    arg: int  # kernel parameter index
    #: "ptr", "dim", "scalar", "tmap" (a tensor map of the tensor: `emit_tma`) or "grid" (a
    #: persistent kernel's logical grid along `axis`, `arg` -1: `emit_persistent`)
    what: str
    axis: int = 0  # a dim's or the grid's axis; a tensor map's number (its order among the maps)
    ptype: str = "u64"
    #: A tensor map's box (innermost dimension first), `CUtensorMapSwizzle` and
    #: `CUtensorMapDataType`.
    box: tuple[int, ...] = ()
    swizzle: int = 0
    map_dtype: int = 0


#: The `.param` type of a run-time scalar parameter of each dtype.
SCALAR_PTYPES: dict[type[DType], str] = {f32: "f32", i32: "s32", bool_: "u32", i64: "s64"}


def entry_params(params: Sequence[o.Param]) -> tuple[PtxParam, ...]:
    """The entry's `.param`s, in order, for a kernel's parameters: a tensor's address and its
    dims, a run-time scalar; constants are compiled in. The one definition of the parameter
    map: the emitter declares these, and a launch packs them (also for PTX read from disk)."""
    out: list[PtxParam] = []
    for i, p in enumerate(params):
        if isinstance(p, o.TensorParam):
            out.append(PtxParam(i, "ptr"))
            out.extend(PtxParam(i, "dim", k, "u32") for k in range(p.rank))
        elif p.constant is None:
            ptype = SCALAR_PTYPES.get(p.dtype)
            if ptype is None:
                raise LoweringError(f"scalar parameters of type {p.dtype.name} are not supported")
            out.append(PtxParam(i, "scalar", ptype=ptype))
    return tuple(out)


@dataclass
class Emitter(EmitContext):
    """Emits a kernel's body op by op (`op_<opname>` handlers) on the context it extends."""

    params: list[PtxParam] = field(default_factory=list)
    smem_line: int = -1
    #: A persistent kernel's loop over its tiles (opened by `preamble`, closed by `finish`).
    tile_walk: emit_persistent.TileWalk | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.emit_op = self.op

    # -- preamble -------------------------------------------------------------------------
    def preamble(self) -> None:
        fb = self.fb
        self.params.extend(entry_params(self.kernel.params))
        for i, p in enumerate(self.kernel.params):
            if isinstance(p, o.TensorParam):
                name = f"p{i}_ptr"
                fb.params.append((name, "u64"))
                raw, base = fb.reg("b64"), fb.reg("b64")
                fb.ins("ld.param.u64", raw, f"[{name}]")
                fb.ins("cvta.to.global.u64", base, raw)
                dims = []
                for k in range(p.rank):
                    dname = f"p{i}_dim{k}"
                    fb.params.append((dname, "u32"))
                    r = fb.reg("b32")
                    fb.ins("ld.param.u32", r, f"[{dname}]")
                    dims.append(r)
                self.tensors[i] = TensorRegs(base, dims)
            else:
                value = self.kernel.param_values[i]
                if value is None:
                    continue  # a Constant: compiled in
                self.define(value, [self.scalar_param(i, p)])
        for k, m in enumerate(emit_tma.map_params(self)):
            # After the signature's parameters: their map (`entry_params`) stays as it is.
            name = f"p{m.arg}_map{k}"
            fb.params.append((name, TENSOR_MAP_PTYPE))
            ptx = PtxParam(m.arg, "tmap", k, TENSOR_MAP_PTYPE, m.box, m.swizzle, m.map_dtype)
            self.params.append(ptx)
            self.tensor_maps[m.load] = emit_tma.map_address(self, name)
        if self.persistent is not None:
            # After the tensor maps: the parameter map of the signature stays as it is.
            dims = []
            for k in range(3):
                fb.params.append((f"grid{k}", "u32"))
                self.params.append(PtxParam(-1, "grid", k, "u32"))
                r = fb.reg("b32")
                fb.ins("ld.param.u32", r, f"[grid{k}]")
                dims.append(r)
            emit_persistent.load_grid(self, dims)
        tid = fb.reg("b32")
        fb.ins("mov.u32", tid, "%tid.x")
        self.tid = tid
        if self.kernel.group_m is not None and self.persistent is None:
            self.block_ids = _grouped_block(self, self.kernel.group_m)
        layouts = [*self.plan.layouts.values(), *self.plan.memory.values()]
        for lay in layouts:
            self.base_regs(lay.base)
        for lay in layouts:
            # Every replication pattern a conversion might meet, all in the preamble.
            for mask in range(1 << lay.base.rank):
                kept = tuple(d if not mask >> d & 1 else None for d in range(lay.base.rank))
                self.owner(Layout(lay.base, kept))
        # Every buffer is planned: the block's shared memory is the plan's total.
        fb.shared_bytes = self.shared.total
        # Taken out again by `finish` if nothing used shared memory.
        self.smem = fb.reg("b32")
        fb.ins("mov.u32", self.smem, "smem")
        self.smem_line = len(fb.body) - 1
        emit_tma.split_warps(self)  # a warp-specialized loop's producer branches away
        if self.persistent is not None:
            self.tile_walk = emit_persistent.walk(self)

    def finish(self) -> None:
        if self.tile_walk is not None:
            # A block barrier between tiles where they reuse shared memory: each scratch use
            # ends with one already, so this keeps the walk from depending on that.
            emit_persistent.next_tile(self, self.tile_walk, barrier=self.shared.total > 0)
            emit_tma.release_kept(self)
            if self.persistent is not None and self.persistent.deferred:
                emit_store.wait_all(self)  # the last tile's store, left in flight
        if not self.fb.shared_bytes and self.smem_line >= 0:
            del self.fb.body[self.smem_line]
        if self.fb.shared_bytes > self.max_shared:
            raise LoweringError(
                f"kernel {self.kernel.name} needs {self.fb.shared_bytes} bytes of shared "
                f"memory, more than the {self.max_shared} bytes a block may have on this "
                "target; use smaller tiles"
            )

    def scalar_param(self, i: int, p: o.ScalarParam) -> Reg:
        fb, name = self.fb, f"p{i}"
        if p.dtype is f32:
            fb.params.append((name, "f32"))
            r = fb.reg("f32")
            fb.ins("ld.param.f32", r, f"[{name}]")
            return r
        if p.dtype is i32 or p.dtype is bool_:
            ptype = "s32" if p.dtype is i32 else "u32"
            fb.params.append((name, ptype))
            r = fb.reg("b32")
            fb.ins(f"ld.param.{ptype}", r, f"[{name}]")
            if p.dtype is i32:
                return r
            pr = fb.reg("pred")
            fb.ins("setp.ne.u32", pr, r, 0)
            return pr
        if p.dtype is i64:
            fb.params.append((name, "s64"))
            r = fb.reg("b64")
            fb.ins("ld.param.s64", r, f"[{name}]")
            return r
        raise LoweringError(f"scalar parameters of type {p.dtype.name} are not supported")

    # -- the body -------------------------------------------------------------------------
    def region(self, region: o.Region) -> None:
        for op in region.ops:
            self.op(op)

    def op(self, op: o.Op) -> None:
        if op in self.skipped:
            return
        handler = self.handler(op)
        try:
            with self.scratch_for(op):
                handler(op)
        except LoweringError as e:
            if e.span is None:  # the innermost op that knows its source
                e.span = op.span
            raise

    def handler(self, op: o.Op) -> Callable[[o.Op], None]:
        """The handler of `op`: from `FRAGMENT_HANDLERS` where its result is held in mma
        fragments, else from `HANDLERS`, else an `op_<opname>` method."""
        if op.results and self.fragment_plan.of(op.results[0]) is not None:
            on_fragments = FRAGMENT_HANDLERS.get(type(op))
            if on_fragments is not None:
                return partial(on_fragments, self)
        handler = HANDLERS.get(type(op))
        if handler is not None:
            return partial(handler, self)
        method: Callable[[o.Op], None] | None = getattr(self, f"op_{op.opname}", None)
        if method is None:
            raise LoweringError(f"no lowering for IR op {op.opname}", op.span)
        return method

    def op_constant(self, op: o.ConstantOp) -> None:
        dt = op.result.type.dtype
        r = self.new(dt)
        fb = self.fb
        if dt is f32:
            fb.ins("mov.f32", r, f32_imm(float(op.value)))
        elif dt in (f16, bf16):
            fb.ins("mov.b16", r, Imm(f"0x{bits16(float(op.value), dt):04X}"))
        elif dt is bool_:
            t = fb.reg("b32")
            fb.ins("mov.u32", t, int(bool(op.value)))
            fb.ins("setp.ne.u32", r, t, 0)
        else:
            fb.ins(f"mov.{INT_SUFFIX[dt]}", r, int_imm(int(op.value)))
        self.define(op.result, [r])

    def op_grid(self, op: o.GridOp) -> None:
        r = self.fb.reg("b32")
        if op.which == "bid":
            self.fb.ins("mov.u32", r, self.block_index(op.axis))
        elif self.logical_grid:  # a persistent kernel: the grid of its tiles, not of blocks
            self.fb.ins("mov.u32", r, self.logical_grid[op.axis])
        else:
            self.fb.ins("mov.u32", r, f"%nctaid.{'xyz'[op.axis]}")
        self.define(op.result, [r])

    def op_tensor_dim(self, op: o.TensorDimOp) -> None:
        self.define(op.result, [self.tensors[op.param].dims[op.axis]])

    def op_iota(self, op: o.IotaOp) -> None:
        lay = self.layout(op.result)
        (d,) = lay.dims
        out = []
        for offs in lay.registers():
            x = self.fb.reg("b32")
            if d is None:
                self.fb.ins("mov.u32", x, 0)
            else:
                self.fb.ins("add.u32", x, self.bases[lay.base].coord[d], offs[d])
            out.append(x)
        self.define(op.result, out)

    # -- element-wise ---------------------------------------------------------------------
    def elementwise(self, op: o.Op, fn: Callable[..., Reg]) -> None:
        res = op.result
        frag = self.fragment_plan.of(res)
        n = frag.count() if frag is not None else self.count(res)
        if frag is not None:  # operands in the same fragment layout, or scalars
            ins = [self.regs(v) for v in op.operands]
        elif res.type.shape:
            want = self.layout(res)
            ins = [
                self.regs(v) if not v.type.shape else emit_shared.regs_as(self, v, want)
                for v in op.operands
            ]
        else:
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
        recip = fast and kind == "div" and self.constant_value(op.operands[0]) == 1.0

        def one(a: Reg, b: Reg) -> Reg:
            if dt.is_float():
                af, bf = self.widen(a, dt), self.widen(b, dt)
                if recip:
                    r = emit_math.emit_recip_fast(fb, bf)
                elif kind in emit_math.BINARY:
                    r = emit_math.BINARY[kind](fb, af, bf, fast=fast)
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

    def constant_value(self, v: o.Value) -> int | float | bool | None:
        """The value of a constant, or of a broadcast of one; None for anything else."""
        op = self.uses.producer(v)
        while isinstance(op, o.BroadcastOp):
            op = self.uses.producer(op.operands[0])
        return op.value if isinstance(op, o.ConstantOp) else None

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
        terms = self.half_sum_terms(op)
        if terms is not None:
            # dst(f32(a) + f32(b)) is dst's own correctly rounded a + b: f32 has more than
            # 2p + 2 bits of dst's p, so rounding twice rounds once. One fma.rn.{dst} a, 1, b
            # per element, on the 16-bit registers (no unpacking, no separate narrowing).
            fb, name = self.fb, FLOAT_NAME[dst]
            one = self.new(dst)
            fb.ins("mov.b16", one, Imm(f"0x{ONE_BITS[dst]:04X}"))
            out = []
            for a, b in zip(*terms):
                r = self.new(dst)
                fb.ins(f"fma.rn.{name}", r, a, one, b)
                out.append(r)
            self.define(op.result, out)
            return
        self.elementwise(op, lambda x: self.cast(x, src, dst))

    def half_sum_terms(self, op: o.CastOp) -> tuple[list[Reg], list[Reg]] | None:
        """The 16-bit registers of a and b where `op` narrows f32(a) + f32(b) back to the
        dtype of a and b, all in one blocked layout; None otherwise."""
        dst, res = op.result.type.dtype, op.result
        add = self.uses.producer(op.operands[0])
        if dst not in (f16, bf16) or not isinstance(add, o.BinaryOp) or add.kind != "add":
            return None
        if not res.type.shape or self.fragment_plan.of(res) is not None:
            return None
        terms = []
        for v in add.operands:
            widen = self.uses.producer(v)
            if not isinstance(widen, o.CastOp):
                return None
            x = widen.operands[0]
            if x.type.dtype is not dst or x.type.shape != res.type.shape:
                return None
            if self.fragment_plan.of(x) is not None or self.layout(x) != self.layout(res):
                return None
            terms.append(self.regs(x))
        return terms[0], terms[1]

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
            w = self.widen(x, src)
            fb.ins(f"cvt.rzi.{INT_SUFFIX[dst]}.f32", r, w)
            if dst is i64:
                # cvt gives MININT for NaN into 64 bits but 0 into 32: the language gives 0.
                nan = fb.reg("pred")
                fb.ins("setp.nan.f32", nan, w, w)
                fb.ins("selp.s64", r, 0, r, nan)
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
        """Parallel copy: through temporaries, since a source may be another destination.
        A value that is its own destination (a wgmma's accumulators, yielded in place while
        the wgmma may still run) is not copied."""
        pairs = [(d, s) for d, s in zip(dst, src) if d != s]
        dst, src = [d for d, _ in pairs], [s for _, s in pairs]
        temps = []
        for d, s in zip(dst, src):
            t = self.fresh_like(d)
            for tr, sr in zip(t, s):
                self.mov(tr, sr)
            temps.append(t)
        for d, t in zip(dst, temps):
            for dr, tr in zip(d, t):
                self.mov(dr, tr)

    def regs_like(self, v: o.Value, like: o.Value) -> list[Reg]:
        """`v`'s registers in the layout of `like` (a value of the same type)."""
        if not like.type.shape:
            return self.regs(v)
        return emit_shared.regs_as(self, v, self.layout(like))

    def op_for(self, op: o.ForOp) -> None:
        fb = self.fb
        lo, hi, step, *inits = op.operands
        args = op.body.args[1:]
        # Accumulators the loop carries stay mma fragments; operand loads go through cp.async.
        planned = self.pipelines.get(op)
        pipe = None
        if planned is not None:
            start = emit_tma.start if planned.kind == "tma" else emit_pipeline.start
            pipe = start(self, planned)
        frag = {k: f for k, a in enumerate(args) if (f := self.fragment_plan.of(a)) is not None}
        iv = fb.reg("b32")
        self.mov(iv, self.regs(lo)[0])
        with self.scratch_for(op, ENTER):
            init_regs = [
                emit_fragments.enter(self, frag[k], v) if k in frag else self.regs_like(v, a)
                for k, (v, a) in enumerate(zip(inits, args))
            ]
        carried = [self.fresh_like(r) for r in init_regs]
        self.copy_into(carried, init_regs)
        self.define(op.body.args[0], [iv])
        for arg, regs in zip(args, carried):
            self.define(arg, regs)
        if pipe is not None:
            pipe.prologue(iv, self.regs(step)[0])
        top, end = fb.new_label("loop"), fb.new_label("done")
        fb.place(top)
        done = fb.reg("pred")
        # A pipeline may ask for several copies of the body per trip (each tests the exit).
        for u in range(pipe.unroll if pipe is not None else 1):
            fb.ins("setp.le.s32" if op.descending else "setp.ge.s32", done, iv, self.regs(hi)[0])
            fb.ins("bra.uni", end, pred=done)
            if pipe is not None:
                pipe.copy(u)
                pipe.top()
            body_ops = op.body.ops
            self.loop_depth += 1
            self.region(o.Region([], body_ops[:-1]))
            self.loop_depth -= 1
            yielded = body_ops[-1]
            with self.scratch_for(yielded):
                self.copy_into(
                    carried,
                    [
                        self.regs(v) if k in frag else self.regs_like(v, a)
                        for k, (v, a) in enumerate(zip(yielded.operands, args))
                    ],
                )
            if pipe is not None:
                pipe.bottom()
            fb.ins("add.s32", iv, iv, self.regs(step)[0])
        fb.ins("bra.uni", top)
        fb.place(end)
        if pipe is not None:
            pipe.drain()
        with self.scratch_for(op, LEAVE):
            for k, (res, arg) in enumerate(zip(op.results, args)):
                if k in frag and self.fragment_plan.of(res) is not None:
                    self.define(res, self.regs(arg))  # stays in fragments (a TMA store's)
                elif k in frag:
                    self.define(res, emit_fragments.leave(self, frag[k], arg, res))
                else:
                    self.define(res, self.regs_like(arg, res))

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
            yielded = region.ops[-1]
            with self.scratch_for(yielded):
                self.copy_into(
                    results, [self.regs_like(v, r) for v, r in zip(yielded.operands, op.results)]
                )
            if not k:
                fb.ins("bra.uni", end)
        fb.place(end)
        for res, regs in zip(op.results, results):
            self.define(res, regs)

    def op_yield(self, op: o.YieldOp) -> None:
        raise LoweringError("yield outside a loop or branch")


#: Emits one op (of the kind it is registered for) on the emitter.
Handler = Callable[[Emitter, Any], None]

#: How each op kind is emitted: a function of the emitter and the op. A new op adds its
#: entry here (its handler may live in a module of its own, taking an `EmitContext`).
HANDLERS: dict[type[o.Op], Handler] = {
    # element-wise and scalar ops (this module)
    o.ConstantOp: Emitter.op_constant,
    o.GridOp: Emitter.op_grid,
    o.TensorDimOp: Emitter.op_tensor_dim,
    o.IotaOp: Emitter.op_iota,
    o.UnaryOp: Emitter.op_unary,
    o.BinaryOp: Emitter.op_binary,
    o.CompareOp: Emitter.op_compare,
    o.SelectOp: Emitter.op_select,
    o.FmaOp: Emitter.op_fma,
    o.CastOp: Emitter.op_cast,
    # control flow (this module)
    o.ForOp: Emitter.op_for,
    o.IfOp: Emitter.op_if,
    o.YieldOp: Emitter.op_yield,
    # data movement between threads
    o.BroadcastOp: emit_shared.broadcast,
    o.ReduceOp: emit_shared.reduce,
    o.ReshapeOp: emit_shared.reshape,
    o.PermuteOp: emit_shared.permute,
    # global memory
    o.LoadOp: emit_memory.load,
    o.StoreOp: emit_memory.store,
    # indexed memory and scans
    o.GatherOp: emit_gather.gather,
    o.ScatterOp: emit_gather.scatter,
    o.AtomicOp: emit_gather.atomic,
    o.ScanOp: emit_scan.scan,
    # tensor cores
    o.MmaOp: emit_wgmma.mma,  # wgmma where planned, else emit_mma.mma
}

#: Handlers of ops whose result is held in mma fragments (`assign_fragments`); element-wise
#: ops need none: their `HANDLERS` entry runs on fragment registers as well.
FRAGMENT_HANDLERS: dict[type[o.Op], Handler] = {
    o.BroadcastOp: emit_fragments.broadcast,
    o.ReduceOp: emit_fragments.reduce,
    o.ReshapeOp: emit_fragments.reshape,
    o.IotaOp: emit_fragments.iota,
}


def _grouped_block(em: EmitContext, group_m: int) -> list[Reg]:
    """The block's tile index in the L2-grouped order (`ir.grid_order.grouped`, the same
    arithmetic), once in the preamble: axes 0 and 1 remapped, axis 2 as launched."""
    fb = em.fb
    x, y, z, nx, ny = (fb.reg("b32") for _ in range(5))
    for r, special in ((x, "%ctaid.x"), (y, "%ctaid.y"), (z, "%ctaid.z")):
        fb.ins("mov.u32", r, special)
    fb.ins("mov.u32", nx, "%nctaid.x")
    fb.ins("mov.u32", ny, "%nctaid.y")
    pid = fb.reg("b32")
    fb.ins("mad.lo.u32", pid, y, nx, x)  # the launch order
    m, n = emit_persistent.grouped(fb, pid, nx, ny, group_m)
    return [m, n, z]


def entry_name(name: str) -> str:
    """A valid PTX identifier for the kernel's entry."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return clean if clean and not clean[0].isdigit() else f"k_{clean}"
