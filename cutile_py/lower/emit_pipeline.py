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

A load's index is recomputed for the iteration it is issued for, by emitting again the
scalar ops of the body that compute it with the induction variable advanced.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import bf16, f16, f32
from cutile_py.ir.uses import DefUse
from cutile_py.lower import emit_mma
from cutile_py.lower.context import EmitContext, LoweringError
from cutile_py.lower.emit_memory import Access
from cutile_py.lower.fragments import SHARED_LIMIT, SharedTile, round_region
from cutile_py.lower.layout import Layout, canonical_blocked
from cutile_py.ptx.builder import Addr, Reg

#: Stages when the kernel does not say: as many as fit in 48 KiB, at most this many.
DEFAULT_STAGES = 3
#: Ops an index may be computed with: pure, scalar, no regions.
_INDEX_OPS = (
    o.ConstantOp,
    o.BinaryOp,
    o.UnaryOp,
    o.CastOp,
    o.CompareOp,
    o.SelectOp,
    o.FmaOp,
    o.GridOp,
    o.TensorDimOp,
)


@dataclass
class StagedLoad:
    """A body load that the pipeline issues ahead as cp.async copies."""

    load: o.LoadOp
    chain: list[o.Op]  # the load, then the reshapes and transposes down to the operand
    operand: o.Value  # what the mma takes
    k_rows: bool  # the tile's rows run along K (an A stored (K, M), a B stored (K, N))
    tile: SharedTile  # in stage 0; stage s is `s * stage_bytes` further
    copy: Layout  # how the block's threads split the copy
    index_ops: list[o.Op]  # the body's ops that compute the load's index, in order


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
    #: The scratch space of the enclosing code, restored after the loop.
    outer_scratch: tuple[int, Reg | None] = (0, None)
    read: Reg | None = None  # byte offset of the stage this iteration reads
    write: Reg | None = None  # and of the stage it refills
    iv: Reg | None = None
    step: Reg | None = None

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
        floor = self.ring + self.stages * self.stage_bytes
        em.scratch_floor, em.scratch = floor, fb.reg("b32")
        fb.ins("add.u32", em.scratch, em.smem, floor)

    def top(self) -> None:
        """Wait for this iteration's tiles; refill the stage the previous one read."""
        if not self.loads:
            return
        fb = self.em.fb
        assert self.write is not None
        if self.stages == 1:
            self.em.barrier()  # every warp is done with the previous iteration's tiles
            self._issue(0, self.write)
            fb.ins("cp.async.wait_group", 0)
            self.em.barrier()
        else:
            fb.ins("cp.async.wait_group", self.stages - 2)
            self.em.barrier()
            self._issue(self.stages - 1, self.write)

    def bottom(self) -> None:
        """Advance both stage offsets around the ring."""
        if not self.loads or self.stages == 1:
            return
        for r in (self.read, self.write):
            assert r is not None
            self._advance(r)

    def drain(self) -> None:
        """No copy may land in shared memory after the loop, where it is reused."""
        if not self.loads:
            return
        self.em.fb.ins("cp.async.wait_all")
        self.em.barrier()
        self.em.scratch_floor, self.em.scratch = self.outer_scratch

    # -- internals ------------------------------------------------------------------------
    def _advance(self, r: Reg) -> None:
        fb = self.em.fb
        wrap = fb.reg("pred")
        fb.ins("add.u32", r, r, self.stage_bytes)
        fb.ins("setp.eq.u32", wrap, r, self.ring + self.stages * self.stage_bytes)
        fb.ins("selp.b32", r, self.ring, r, wrap)

    def _issue(self, ahead: int, stage: Reg) -> None:
        """cp.async every staged tile of iteration i + `ahead` into the stage at byte offset
        `stage`, as one commit group."""
        em, fb = self.em, self.em.fb
        assert self.iv is not None and self.step is not None
        iv = self.iv
        if ahead:
            iv = fb.reg("b32")
            fb.ins("mad.lo.s32", iv, self.step, ahead, self.iv)
        assert em.smem is not None
        base = fb.reg("b32")
        fb.ins("add.u32", base, em.smem, stage)
        for sl in self.loads:
            index = _index_at(em, self.loop, sl, iv)
            _copy(em, sl, index, base)
        fb.ins("cp.async.commit_group")


def _index_at(em: EmitContext, loop: o.ForOp, sl: StagedLoad, iv: Reg) -> list[Reg]:
    """The load's index registers with the induction variable at `iv`: its index ops
    emitted again, the body's own definitions restored afterwards."""
    touched = [loop.body.args[0], *(op.result for op in sl.index_ops)]
    saved = {v: em.values.get(v) for v in touched}
    em.define(loop.body.args[0], [iv])
    for op in sl.index_ops:
        em.emit_op(op)
    index = [em.regs(v)[0] for v in sl.load.operands]
    for v in touched:
        old = saved[v]
        if old is None:
            em.values.pop(v, None)
        else:
            em.values[v] = old
    return index


def _copy(em: EmitContext, sl: StagedLoad, index: list[Reg], base: Reg) -> None:
    """One tile: each thread copies its chunks, zero-filling those past the tensor's edge."""
    fb = em.fb
    load = sl.load
    dt = load.result.type.dtype
    access = Access(em, load.param, index, load.shape, sl.copy, dt, None)
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


# -- planning ----------------------------------------------------------------------------
def plan_loop(em: EmitContext, loop: o.ForOp) -> LoopPipeline | None:
    """What of `loop` runs as a tensor-core loop; None if its body has no top-level mma."""
    body = loop.body.ops
    mmas = [op for op in body if isinstance(op, o.MmaOp)]
    if not mmas:
        return None
    uses = em.uses
    yield_op = body[-1]
    carried: dict[int, o.MmaOp] = {}
    for k, arg in enumerate(loop.body.args[1:]):
        for mma in mmas:
            a, b, acc = mma.operands
            if (
                acc is arg
                and uses.users(arg) == (mma,)
                and yield_op.operands[k] is mma.result
                and uses.users(mma.result) == (yield_op,)
                and a is not arg
                and b is not arg
            ):
                carried[k] = mma
    loads = []
    for mma in mmas if em.target.cp_async else ():
        for which in (0, 1):
            sl = _staged_load(em, loop, mma, which, uses)
            if sl is not None:
                loads.append(sl)
    # The fragment addressing is set up before the loop: the epilogue after it uses it too.
    for mma in mmas:
        emit_mma.setup(em, mma)
    for k, mma in carried.items():
        em.fragment_values.add(loop.body.args[k + 1])
        em.fragment_values.add(mma.result)
    if not loads:
        return LoopPipeline(em, loop, carried, [], 1, 0)
    return _place(em, loop, carried, loads, mmas)


def _staged_load(
    em: EmitContext, loop: o.ForOp, mma: o.MmaOp, which: int, uses: DefUse
) -> StagedLoad | None:
    """Operand `which` of `mma` as a staged load, if it is one the pipeline can take: a
    load in the loop body of a read-only tensor, reshaped (unit dims only) or transposed
    on its single-use way to the mma."""
    v = mma.operands[which]
    transposed = False
    chain: list[o.Op] = []
    while True:
        if len(uses.users(v)) != 1:
            return None
        op = _in_body(uses, loop, v)
        if isinstance(op, o.PermuteOp) and tuple(op.axes) == (1, 0):
            transposed = not transposed
        elif isinstance(op, o.ReshapeOp):
            (x,) = op.operands
            if [s for s in x.type.shape if s > 1] != [s for s in v.type.shape if s > 1]:
                return None
        elif isinstance(op, o.LoadOp):
            chain.append(op)
            break
        else:
            return None
        chain.append(op)
        v = op.operands[0]
    load = chain[-1]
    assert isinstance(load, o.LoadOp)
    param = em.kernel.params[load.param]
    dt = load.result.type.dtype
    if (
        not isinstance(param, o.TensorParam)
        or param.mut  # the kernel may write it: loading ahead could read stale data
        or load.within is not None
        or load.padding != 0
        or dt not in (f16, bf16, f32)
    ):
        return None
    shape = load.shape
    big = [i for i, s in enumerate(shape) if s > 1]
    if len(big) != 2 or big[-1] != len(shape) - 1:
        return None  # not a 2-D tile with the tensor's contiguous dim as its columns
    rows, cols = shape[big[0]], shape[big[1]]
    eb = dt.itemsize()
    width = min(param.align, 16 // eb)
    while width > 1 and cols % width:
        width //= 2
    if width * eb < 4:
        return None  # cp.async copies 4, 8 or 16 bytes
    # The tile keeps the tensor's orientation: rows along K for an A loaded (K, M) and
    # transposed, or a B loaded (K, N); those are read with ldmatrix.trans (16-bit) or word
    # by word (tf32, whose swizzle then spreads 4 rows over the banks: xor_step 2).
    k_rows = transposed if which == 0 else not transposed
    index_ops = _index_ops(uses, loop, load)
    if index_ops is None:
        return None
    base = canonical_blocked((rows, cols), eb, em.plan.threads, max_vec=width)
    if base.vec != width:
        return None
    copy = Layout(base, tuple(None if s == 1 else big.index(i) for i, s in enumerate(shape)))
    tile = SharedTile(0, rows, cols, eb, True, xor_step=2 if k_rows and dt is f32 else 1)
    chain.reverse()
    return StagedLoad(load, chain, mma.operands[which], k_rows, tile, copy, index_ops)


def _in_body(uses: DefUse, loop: o.ForOp, v: o.Value) -> o.Op | None:
    """The op of the loop body (top level) that defines `v`, if one does."""
    op = uses.producer(v)
    return op if op is not None and uses.enclosing(op) is loop else None


def _index_ops(uses: DefUse, loop: o.ForOp, load: o.LoadOp) -> list[o.Op] | None:
    """The body ops the load's index depends on, in body order; None if any is not a pure
    scalar op or depends on a carried value (unknown for a later iteration)."""
    carried = set(loop.body.args[1:])
    need: set[o.Op] = set()
    todo = list(load.operands)
    while todo:
        v = todo.pop()
        if v in carried:
            return None
        op = _in_body(uses, loop, v)
        if op is None or op in need:
            continue  # defined before the loop, or the induction variable
        if not isinstance(op, _INDEX_OPS) or op.result.type.shape:
            return None
        need.add(op)
        todo.extend(op.operands)
    return [op for op in loop.body.ops if op in need]


def _place(
    em: EmitContext,
    loop: o.ForOp,
    carried: dict[int, o.MmaOp],
    loads: list[StagedLoad],
    mmas: list[o.MmaOp],
) -> LoopPipeline:
    """Lay the stages out in shared memory and choose their number."""
    stage_bytes = 0
    placed = []
    for sl in loads:
        placed.append(replace(sl, tile=replace(sl.tile, offset=stage_bytes)))
        stage_bytes += round_region(sl.tile.nbytes)
    staged = {sl.operand for sl in placed}
    # Operands the mmas store from registers themselves (a padded load, say) each need
    # a tile of their own after the stages.
    reg_bytes = 0
    for mma in mmas:
        for v in mma.operands[:2]:
            if v not in staged:
                rows, cols = v.type.shape
                reg_bytes += round_region(rows * cols * v.type.dtype.itemsize())

    ring = em.scratch_floor

    def need(stages: int) -> int:
        return ring + stages * stage_bytes + reg_bytes

    explicit = em.kernel.stages
    if explicit is not None:
        stages = explicit
        if need(stages) > em.max_shared:
            tiles = ", ".join(f"{sl.operand.type}" for sl in placed)
            raise LoweringError(
                f"kernel {em.kernel.name}: stages={stages} needs {need(stages)} bytes of "
                f"shared memory ({stage_bytes} per stage for the operand tiles {tiles}), "
                f"more than the {em.max_shared} bytes a block may have on this target; use "
                "fewer stages or smaller tiles"
            )
    else:
        stages = max(
            (s for s in range(1, DEFAULT_STAGES + 1) if need(s) <= SHARED_LIMIT),
            default=1,
        )
        if need(stages) > em.max_shared:
            raise LoweringError(
                f"kernel {em.kernel.name}: the operand tiles of its mma loop need "
                f"{need(stages)} bytes of shared memory, more than the {em.max_shared} bytes "
                "a block may have on this target; use smaller tiles"
            )
    em.shared_scratch(stages * stage_bytes)  # the ring; the body's scratch comes after it
    for sl in placed:
        em.skipped.update(sl.chain)
        em.base_regs(sl.copy.base)  # before the loop: the prologue and the body use it
    return LoopPipeline(em, loop, carried, placed, stages, stage_bytes, ring)


# -- accumulators in and out of fragment form -------------------------------------------
def fragments_of(em: EmitContext, mma: o.MmaOp, init: o.Value) -> list[Reg]:
    """The loop's initial accumulator `init` as `mma`'s fragments, flattened."""
    frags = emit_mma.acc_fragments(em, mma, init)
    return [x for row in frags for c in row for x in c]


def blocked_of(em: EmitContext, mma: o.MmaOp, arg: o.Value, result: o.Value) -> list[Reg]:
    """The carried accumulator (fragments in `arg`'s registers) in `result`'s layout."""
    s = emit_mma.setup(em, mma)
    frags = emit_mma.acc_fragments(em, mma, arg)
    return emit_mma.fragments_to_blocked(em, s, frags, em.layout(result), mma)
