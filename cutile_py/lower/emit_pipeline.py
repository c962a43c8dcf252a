"""Tensor-core loops: accumulators carried as mma fragments, operand tiles loaded ahead by a
multi-stage `cp.async` pipeline.

A `for` loop whose body feeds a carried value to `mma` as its accumulator and yields the
product keeps that value in the mma fragment layout from before the loop to after it: no
trip through shared memory per iteration. The body's operand loads (`ct.load` of a read-only
tensor, possibly reshaped or transposed on the way to `mma`) become 16-byte (or, for less
aligned tensors, 8- or 4-byte) `cp.async` copies straight into the swizzled shared tiles
that the fragments are read from, issued `stages - 1` iterations ahead into a ring of stages:

    prologue:   issue iterations 0 .. S-2, one commit group each
    iteration:  wait until this iteration's group landed; barrier (which also tells that
                every warp is done reading the stage about to be refilled); issue iteration
                i + S - 1 into that stage; commit; the mma reads stage i % S
    after:      wait for all groups (prefetches past the end) before shared memory is reused

The loop holds one copy of its body per stage (`PipelinePlan.unroll`; each copy tests the
exit): copy u reads stage u and refills stage u - 1 mod S, so both offsets are constants
that ptxas folds into the shared addresses' immediates, and no offset is advanced around
the ring.

Where the plan loads fragments a k step ahead (`PipelinePlan.ahead`), the wait and the
barrier of iteration i + 1 move into iteration i, before the mmas of its last k step (all
of stage i's fragments are read by then), followed by the loads of stage i + 1's first k
step; iteration i + 1 starts with the refill of stage i and the mmas of the fragments it
was handed (`emit_mma.warp_mma`):

    prologue:   issue iterations 0 .. S-2; wait for 0; barrier; load its first k step
    iteration:  refill the stage the previous one read (S - 1 ahead); per k step ks, load
                step ks + 1, then the mmas of step ks; before the last step's mmas: wait
                for the next stage, barrier, load its first step

What is pipelined, how deep and where its ring lies is decided before emission
(`plan_pipelines`); this module carries it out. A load whose index is affine in the
induction variable is a stream: its shared addresses, the bounds along the dims that do not
vary and the mma's fragment addresses are computed before the loop, and each iteration
advances its global address by one add; in the loop, a thread whose copies all lie inside
the tensors makes them unchecked, and the checked ones (zero-filling past an edge) are a
block placed after the loop. Another load's index is recomputed for the iteration it is
issued for, by emitting again the scalar ops of the body that compute it with the induction
variable advanced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import f32
from cutile_py.lower import emit_mma
from cutile_py.lower.allocate_shared import SharedRegion
from cutile_py.lower.context import EmitContext
from cutile_py.lower.emit_memory import Access
from cutile_py.lower.fragments import CHUNK, Ahead, Operand
from cutile_py.lower.plan_pipelines import PipelinePlan, StagedLoad
from cutile_py.ptx.builder import Addr, Reg


def start(em: EmitContext, plan: PipelinePlan) -> LoopPipeline:
    """Carry out `plan` for its loop, at the loop: set up the mmas' fragment addressing
    (the epilogue after the loop uses it too), claim the ring, and set aside the loads the
    pipeline issues ahead."""
    for mma in plan.mmas:
        emit_mma.setup(em, mma)
    if plan.loads:
        for sl in plan.loads:
            em.skipped.update(sl.chain)
            em.base_regs(sl.copy.base)  # before the loop: the prologue and the body use it
            _hoist_reader(em, plan, sl)
        resident = em.shared.resident(plan.loop)
        if resident:
            _store_resident(em, resident)
        return LoopPipeline(
            em,
            plan.loop,
            dict(plan.carried),
            list(plan.loads),
            plan.stages,
            plan.stage_bytes,
            em.shared.ring(plan.loop),
            em.shared.floor(plan.loop),
            [(r.value, r.which) for r in resident if r.value is not None],
            async_reads=bool(plan.wgmma),
            unroll=plan.unroll,
            ahead=plan.mmas[0] if plan.ahead else None,
        )
    return LoopPipeline(em, plan.loop, dict(plan.carried), [], 1, plan.stage_bytes)


def _hoist_reader(em: EmitContext, plan: PipelinePlan, sl: StagedLoad) -> None:
    """The fragment addressing of the mma operand `sl` fills, before the loop: the body adds
    the stage it reads to each address register (`em.staged_readers`)."""
    assert em.smem is not None
    for mma in plan.mmas:
        for which in (0, 1):
            if mma.operands[which] is sl.operand and not (
                which == 0 and em.fragment_plan.of(sl.operand) is not None
            ):
                a = mma.operands[0]
                dt, k = a.type.dtype, a.type.shape[1]
                operand = Operand(sl.tile, em.smem, sl.k_rows, unrounded=dt is f32)
                s = emit_mma.setup(em, mma)
                em.staged_readers[(sl.operand, which)] = emit_mma.reader(
                    em, dt, operand, s, which, k
                )


@dataclass
class LoopPipeline:
    em: EmitContext
    loop: o.ForOp
    #: Carried position → the mma whose accumulator it is (held as fragments).
    carried: dict[int, o.MmaOp]
    loads: list[StagedLoad]
    stages: int
    stage_bytes: int
    #: Byte offset of stage 0 in shared memory: the scratch floor of the enclosing code
    #: (an outer pipeline's stages stay untouched).
    ring: int = 0
    #: Where the body's scratch starts: past the ring and the resident operand tiles.
    floor: int = 0
    #: The keys of `em.resident` this loop stored (their tiles are scratch after it).
    resident: list[tuple[o.Value, int]] = field(default_factory=list)
    #: The scratch space of the enclosing code, restored after the loop.
    outer_scratch: tuple[int, Reg | None] = (0, None)
    read: Reg | None = None  # byte offset of the stage this iteration reads
    write: Reg | None = None  # and of the stage it refills
    iv: Reg | None = None
    step: Reg | None = None
    #: Affine loads' addressing, advanced in place.
    streams: dict[o.LoadOp, _Stream] = field(default_factory=dict)
    #: wgmma reads the stages (through the async proxy): the copies that landed are made
    #: visible to it before the barrier.
    async_reads: bool = False
    #: Code of the loop placed after it: the copies of tiles crossing a tensor's edge.
    deferred: list[str] = field(default_factory=list)
    #: Copies of the body per trip around the loop: with one per stage, each copy reads and
    #: refills fixed stages, whose offsets are constants (immediates in the addresses) and
    #: no stage offset is advanced around the ring.
    unroll: int = 1
    #: The mma whose fragments are loaded a k step ahead (`PipelinePlan.ahead`): the wait
    #: and the barrier of each iteration are made before the previous one's last mmas.
    ahead: o.MmaOp | None = None
    #: The copy of the body being emitted.
    u: int = 0

    # -- emission hooks (called by Emitter.op_for) ----------------------------------------
    def prologue(self, iv: Reg, step: Reg) -> None:
        """Issue the first S - 1 iterations' loads (before the loop's exit test)."""
        if not self.loads:
            return
        em, fb = self.em, self.em.fb
        self.iv, self.step = iv, step
        self.read, self.write = fb.reg("b32"), fb.reg("b32")
        fb.ins("mov.u32", self.read, self.ring)
        fb.ins("mov.u32", self.write, self.ring + (self.stages - 1) * self.stage_bytes)
        self._streams()
        for s in range(self.stages - 1):
            fixed = fb.reg("b32")
            fb.ins("mov.u32", fixed, self.ring + s * self.stage_bytes)
            self._issue(s, fixed)
        for sl in self.loads:
            em.staged[sl.operand] = (sl.tile, sl.k_rows, self.read)
        # Shared memory that the body's other ops use (reductions, layout changes, mma
        # operands from registers) starts past the stages in flight.
        assert em.smem is not None
        self.outer_scratch = (em.scratch_floor, em.scratch)
        floor = self.floor
        em.scratch_floor, em.scratch = floor, fb.reg("b32")
        fb.ins("add.u32", em.scratch, em.smem, floor)
        if self.ahead is not None:
            self._enter_ahead(self.ahead)

    def _enter_ahead(self, mma: o.MmaOp) -> None:
        """Before the loop: the wait and the barrier of iteration 0 (its stage landed),
        and the fragments of its first k step, which the body then carries."""
        em, fb = self.em, self.em.fb
        fb.ins("cp.async.wait_group", self.stages - 2)
        em.barrier()
        readers = (
            em.staged_readers[(mma.operands[0], 0)],
            em.staged_readers[(mma.operands[1], 1)],
        )
        first = fb.reg("b32")
        fb.ins("mov.u32", first, self.ring)
        held = (readers[0](first)(0), readers[1](first)(0))
        em.ahead[mma] = Ahead(held, self._turn, readers)

    def _turn(self) -> Reg:
        """In copy u, before its last mmas (all of its stage's fragments read): wait for
        the next stage, and make the barrier after which stage u may be refilled (by the
        next copy's `top`); the next stage's offset."""
        fb = self.em.fb
        fb.ins("cp.async.wait_group", self.stages - 2)
        self.em.barrier()  # every warp has read stage u, and stage u + 1 landed for all
        nxt = fb.reg("b32")
        fb.ins("mov.u32", nxt, self.ring + (self.u + 1) % self.stages * self.stage_bytes)
        return nxt

    def copy(self, u: int) -> None:
        """Before copy `u` of the body (of `unroll`): its stages, as constants."""
        self.u = u
        if self.unroll == 1:
            return
        assert self.read is not None and self.write is not None
        fb, s = self.em.fb, self.stages
        fb.ins("mov.u32", self.read, self.ring + u % s * self.stage_bytes)
        fb.ins("mov.u32", self.write, self.ring + (u + s - 1) % s * self.stage_bytes)

    def top(self) -> None:
        """Wait for this iteration's tiles; refill the stage the previous one read. Where
        fragments are loaded ahead the wait and the barrier were made by the previous
        iteration (`_turn`), before its last mmas, and only the refill is left: its copies
        checked in line (with mmas on both sides ptxas turned the branch between the
        unchecked and the checked copies into both, predicated: twice the LDGSTS in
        sm_80 SASS, and it did so there wherever it was placed)."""
        if not self.loads:
            return
        if self.ahead is not None:
            assert self.write is not None
            self._issue(self.stages - 1, self.write)
            return
        fb = self.em.fb
        assert self.write is not None
        if self.stages == 1:
            self.em.barrier()  # every warp is done with the previous iteration's tiles
            self._issue(0, self.write)
            fb.ins("cp.async.wait_group", 0)
            self._proxy_fence()
            self.em.barrier()
        else:
            fb.ins("cp.async.wait_group", self.stages - 2)
            self._proxy_fence()
            self.em.barrier()
            self._issue(self.stages - 1, self.write, in_loop=True)

    def bottom(self) -> None:
        """Advance both stage offsets around the ring."""
        if not self.loads or self.stages == 1 or self.unroll > 1:
            return
        for r in (self.read, self.write):
            assert r is not None
            self._advance(r)

    def drain(self) -> None:
        """No copy may land in shared memory after the loop, where it is reused."""
        if not self.loads:
            return
        if self.deferred:
            after = self.em.fb.new_label("drain")
            self.em.fb.ins("bra.uni", after)
            self.em.fb.body.extend(self.deferred)
            self.em.fb.place(after)
        self.em.fb.ins("cp.async.wait_all")
        self.em.barrier()
        self.em.scratch_floor, self.em.scratch = self.outer_scratch
        for key in self.resident:
            del self.em.resident[key]
        if self.ahead is not None:
            del self.em.ahead[self.ahead]

    # -- internals ------------------------------------------------------------------------
    def _proxy_fence(self) -> None:
        if self.async_reads:
            self.em.fb.ins("fence.proxy.async.shared::cta")

    def _advance(self, r: Reg) -> None:
        fb = self.em.fb
        wrap = fb.reg("pred")
        fb.ins("add.u32", r, r, self.stage_bytes)
        fb.ins("setp.eq.u32", wrap, r, self.ring + self.stages * self.stage_bytes)
        fb.ins("selp.b32", r, self.ring, r, wrap)

    def _issue(self, ahead: int, stage: Reg, in_loop: bool = False) -> None:
        """cp.async every staged tile of iteration i + `ahead` into the stage at byte offset
        `stage`, as one commit group. In the loop, where every load is affine, the copies
        of a thread whose tiles lie wholly inside the tensors are made unchecked, and the
        checked ones out of line (`deferred`, placed after the loop by `drain`)."""
        em, fb = self.em, self.em.fb
        assert self.iv is not None and self.step is not None
        iv = self.iv
        if ahead and any(sl.load not in self.streams for sl in self.loads):
            iv = fb.reg("b32")
            fb.ins("mad.lo.s32", iv, self.step, ahead, self.iv)
        assert em.smem is not None
        streams = [(sl, self.streams[sl.load]) for sl in self.loads if sl.load in self.streams]
        oks = [st.tile_ok_now(sl) for sl, st in streams]
        if in_loop and len(streams) == len(self.loads):
            fast: Reg | None = None
            for (sl, st), ok in zip(streams, oks):
                fast = em.conj(fast, em.conj(ok, st.inside_now(em, sl)))
            if fast is not None:
                slow, resume = fb.new_label("checked"), fb.new_label("copied")
                fb.ins("bra", slow, pred=fast, negate=True)
                for sl, st in streams:
                    st.copy(em, sl, stage, None, checked=False)
                fb.place(resume)
                main, fb.body = fb.body, self.deferred
                fb.place(slow)
                for (sl, st), ok in zip(streams, oks):
                    st.copy(em, sl, stage, ok, checked=True)
                fb.ins("bra.uni", resume)
                fb.body = main
                for sl, st in streams:
                    st.advance(em, sl.varying)
                fb.ins("cp.async.commit_group")
                return
        base: Reg | None = None
        for sl in self.loads:
            stream = self.streams.get(sl.load)
            if stream is None:
                if base is None:
                    base = fb.reg("b32")
                    fb.ins("add.u32", base, em.smem, stage)
                copy_staged(em, sl, staged_access(em, sl, index_at(em, self.loop, sl, iv)), base)
        for (sl, st), ok in zip(streams, oks):
            st.copy(em, sl, stage, ok, checked=True)
            st.advance(em, sl.varying)
        fb.ins("cp.async.commit_group")

    def _streams(self) -> None:
        """Before the first issue: the addressing of each affine load for iteration 0, and
        its change per iteration (from the index ops emitted for iterations 0 and 1)."""
        em, fb = self.em, self.em.fb
        assert self.iv is not None and self.step is not None
        nxt = fb.reg("b32")
        fb.ins("add.s32", nxt, self.iv, self.step)
        for sl in self.loads:
            if not sl.affine:
                continue
            first = index_at(em, self.loop, sl, self.iv)
            second = index_at(em, self.loop, sl, nxt)
            index, steps = [], []
            for a, b in zip(first, second):
                copy, d = fb.reg("b32"), fb.reg("b32")
                fb.ins("mov.b32", copy, a)  # a copy: advanced in place
                fb.ins("sub.s32", d, b, a)
                index.append(copy)
                steps.append(d)
            access = staged_access(em, sl, index)
            deltas, step_bytes = [], fb.reg("b64")
            fb.ins("mov.u64", step_bytes, 0)
            for i, (d, size) in enumerate(zip(steps, sl.load.shape)):
                e = fb.reg("b32")
                fb.ins("mul.lo.s32", e, d, size)
                deltas.append(e)
                wide = fb.reg("b64")
                fb.ins("cvt.s64.s32", wide, e)
                stride = access.row_bytes[i]
                if stride is None:
                    fb.ins("mad.lo.s64", step_bytes, wide, access.size, step_bytes)
                else:
                    fb.ins("mad.lo.s64", step_bytes, wide, stride, step_bytes)
            self.streams[sl.load] = _Stream(
                access, index, steps, deltas, step_bytes, _hoisted_copy(em, sl, access)
            )


def index_at(em: EmitContext, loop: o.ForOp, sl: StagedLoad, iv: Reg) -> list[Reg]:
    """The load's index registers with the induction variable at `iv`: its index ops
    emitted again in a scope of their own (the body's registers are untouched)."""
    with em.scope({loop.body.args[0]: [iv]}):
        for op in sl.index_ops:
            em.emit_op(op)
        return [em.regs(v)[0] for v in sl.load.operands]


@dataclass
class _Chunk:
    """One cp.async of a thread, as an affine load issues it every iteration."""

    row: tuple[int, ...]  # static offsets along the dims before the last (its row address)
    col: int  # byte offset along the last dim
    group: int  # index of its shared address register in `_Hoisted.groups`
    imm: int  # byte offset from that register
    bounds: tuple[tuple[int, int], ...]  # (dim, static offset) it must lie inside
    issue: Reg | None  # made at all: inside the tile, by the thread owning the copy


@dataclass
class _Hoisted:
    """What an affine load's copies compute once, before the loop: the shared addresses
    (shared base + thread offset, without the stage), grouped so that copies whose swizzle
    agrees share one register; and whether all of the thread's copies lie inside the
    tensor along the dims whose index does not vary (`inside`; None: always)."""

    groups: list[Reg]
    chunks: list[_Chunk]
    inside: Reg | None
    #: Per varying dim: the largest static offset of the thread's copies along it.
    reach: dict[int, int]


def _hoisted_copy(em: EmitContext, sl: StagedLoad, access: Access) -> _Hoisted:
    row_dim, col_dim = (d for d in sl.copy.dims if d is not None)
    width = sl.copy.base.vec
    assert access.width == width and em.smem is not None
    tile = sl.tile
    smem = emit_mma.shared_addresses(em, em.smem, tile, sl.copy, row_dim, col_dim, width)
    # Rows a swizzle period apart share their XOR, and so do columns a multiple of the XOR
    # width of chunks apart (the XOR never carries past it): one register for all of them,
    # immediates between them. Panels (wgmma operands cut into 128-byte columns) lie
    # rows x row_bytes apart: each panel has registers of its own.
    period = tile.rows_per_step * tile.xor_width if tile.swizzled else 1
    span = tile.xor_width * CHUNK // tile.eb if tile.swizzled else 1
    first: dict[tuple[int, int, int], tuple[int, int, int]] = {}  # key -> group, row, col
    groups: list[Reg] = []
    owner = em.owner(sl.copy)
    chunks = []
    reach: dict[int, int] = {}
    for (_, reg, imm), offs in zip(smem, access.vectors_static(), strict=True):
        ro, co = offs[row_dim], offs[col_dim]
        key = (co % span, ro % period, co // tile.panel if tile.panel else 0)
        if key not in first:
            first[key] = (len(groups), ro, co)
            groups.append(reg)
        group, ro0, co0 = first[key]
        static = [offs[d] if d is not None else 0 for d in sl.copy.dims]
        for i, off in enumerate(static):
            reach[i] = max(reach.get(i, 0), off)
        chunks.append(
            _Chunk(
                tuple(static[:-1]),
                static[-1] * access.size,
                group,
                imm + (ro - ro0) * tile.row_bytes + (co - co0) * tile.eb,
                tuple(enumerate(static)),
                em.conj(em.valid(sl.copy, offs), owner),
            )
        )
    inside = access.tile_ok_along([not v for v in sl.varying])
    for i, off in reach.items():
        if not sl.varying[i]:
            inside = em.conj(inside, access.in_bounds(i, off))
    return _Hoisted(groups, chunks, inside, {i: r for i, r in reach.items() if sl.varying[i]})


@dataclass
class _Stream:
    """The addressing of an affine staged load for the next iteration it issues, advanced in
    place after each issue instead of recomputed: per iteration one 64-bit add for the tile,
    one multiply-add per further row of a thread, one add per shared address register, and
    the bounds along the dims that vary, once per thread (its farthest copy)."""

    access: Access
    index: list[Reg]  # the index, owned here
    steps: list[Reg]  # its change per iteration
    deltas: list[Reg]  # the tile origin's change per iteration, in elements
    step_bytes: Reg  # the address change per iteration
    hoisted: _Hoisted

    def tile_ok_now(self, sl: StagedLoad) -> Reg | None:
        """This iteration's tile index is sane along the dims that vary."""
        return self.access.tile_ok_along(list(sl.varying), recheck=True)

    def inside_now(self, em: EmitContext, sl: StagedLoad) -> Reg | None:
        """Every copy of this thread lies inside the tensor (the tile index aside)."""
        pred = self.hoisted.inside
        for i, off in self.hoisted.reach.items():
            pred = em.conj(pred, self.access.in_bounds(i, off))
        return pred

    def copy(
        self, em: EmitContext, sl: StagedLoad, stage: Reg, ok: Reg | None, checked: bool
    ) -> None:
        """Issue this iteration's copies into the stage at byte offset `stage`; `checked`:
        each copy past the tensor's edge (or with `ok` false) zero-fills its chunk."""
        fb, acc = em.fb, self.access
        acc.rows.clear()  # made again here: the other path's rows are not defined on this one
        dsts = []
        for g in self.hoisted.groups:
            d = fb.reg("b32")
            fb.ins("add.u32", d, g, stage)
            dsts.append(d)
        rows: dict[tuple[int, ...], Reg] = {}
        dt = sl.load.result.type.dtype
        nbytes = sl.copy.base.vec * dt.itemsize()
        level = "cg" if nbytes == 16 else "ca"
        op = f"cp.async.{level}.shared.global"
        for ch in self.hoisted.chunks:
            if ch.row not in rows:
                rows[ch.row] = acc.row_address_wide(ch.row)
            dst, src = Addr(dsts[ch.group], ch.imm), Addr(rows[ch.row], ch.col)
            inside = ok
            if checked:
                for i, off in ch.bounds:
                    inside = em.conj(inside, acc.in_bounds(i, off))
            if inside is None:
                fb.ins(op, dst, src, nbytes, pred=ch.issue)
            else:
                size = fb.reg("b32")
                fb.ins("selp.u32", size, nbytes, 0, inside)
                fb.ins(op, dst, src, nbytes, size, pred=ch.issue)

    def advance(self, em: EmitContext, varying: tuple[bool, ...]) -> None:
        for i, d, v in zip(self.index, self.steps, varying):
            if v:
                em.fb.ins("add.s32", i, i, d)
        self.access.advance(self.deltas, self.step_bytes, varying)


def staged_access(em: EmitContext, sl: StagedLoad, index: list[Reg]) -> Access:
    load = sl.load
    return Access(em, load.param, index, load.shape, sl.copy, load.result.type.dtype, None)


def copy_staged(em: EmitContext, sl: StagedLoad, access: Access, base: Reg) -> None:
    """One tile: each thread copies its chunks, zero-filling those past the tensor's edge."""
    fb = em.fb
    load = sl.load
    dt = load.result.type.dtype
    row_dim, col_dim = (d for d in sl.copy.dims if d is not None)
    width = sl.copy.base.vec
    assert access.width == width
    nbytes = width * dt.itemsize()
    smem = emit_mma.shared_addresses(em, base, sl.tile, sl.copy, row_dim, col_dim, width)
    level = "cg" if nbytes == 16 else "ca"  # .cg (L2 only) exists for 16-byte copies
    owner = em.owner(sl.copy)
    for (_, row, offset, inside), (offs, dst, imm) in zip(access.vectors(None), smem, strict=True):
        # A copy past the tensor's edge zero-fills its chunk (src-size 0); one of a thread
        # past the tile's edge, or of a replica, is not made at all.
        issue = em.conj(em.valid(sl.copy, offs), owner)
        src = Addr(row, offset)
        if inside is None:
            fb.ins(f"cp.async.{level}.shared.global", Addr(dst, imm), src, nbytes, pred=issue)
        else:
            size = fb.reg("b32")
            fb.ins("selp.u32", size, nbytes, 0, inside)
            fb.ins(f"cp.async.{level}.shared.global", Addr(dst, imm), src, nbytes, size, pred=issue)


def _store_resident(em: EmitContext, resident: tuple[SharedRegion, ...]) -> None:
    """Store the mma operands defined before the loop into their tiles once, before it
    (f32 ones rounded to tf32 on the way); the mmas of the body read them from there."""
    assert em.smem is not None
    em.barrier()  # earlier readers of this shared memory are done
    for r in resident:
        v, tile = r.value, r.tile
        assert v is not None and tile is not None
        dt = v.type.dtype
        transpose = r.which == 1 and dt is f32
        emit_mma.store_tile(
            em, em.smem, tile, em.regs(v), em.layout(v), transpose=transpose, tf32=dt is f32
        )
        em.resident[(v, r.which)] = Operand(tile, em.smem, k_rows=r.which == 1 and not transpose)
    em.barrier()
