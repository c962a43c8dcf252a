"""TMA pipelines: a loop's operand tiles loaded by the Tensor Memory Accelerator into a ring
of shared stages, each guarded by an mbarrier.

The plan (`plan_pipelines`, kind "tma") is the cp.async one with staged loads that are boxes
of a tensor map (a kernel parameter made on the host by `Backend.tensor_map`) whose swizzle
puts the box where the mma's fragment reads expect the tile (`plan_tma`); tiles no box can
fill (mma.sync tiles with rows of 256 bytes, say) are copied by cp.async beside them, in the
same stages, as `emit_pipeline` copies them (a commit group per issue, `wait_group` and,
where a wgmma reads the stage, `fence.proxy.async` before the barrier wait). Per stage s,
barrier b[s]; thread 0 issues the boxes, every thread waits:

    before:     thread 0 inits b[0..S-1] (count 1); fence.proxy.async (earlier generic
                writes to this memory precede the copy engine's); barrier; issue 0 .. S-2
    issue j:    every thread: its cp.async chunks of the other tiles, one commit group;
                thread 0, if j is an iteration of the loop (the others branch past):
                arrive.expect_tx(b[j % S], the boxes' bytes), then one cp.async.bulk.tensor
                per box (per 128-byte panel of a wide wgmma tile), completing on b[j % S]
    iteration:  try_wait.parity(b[i % S], (i / S) & 1) until it holds; barrier (every warp
                is done with the stage about to be refilled); issue i + S - 1
    after:      barrier; thread 0 invalidates the barriers (their memory is scratch again)

With a wgmma group left in flight (`PipelinePlan.in_flight`; TMA tiles only, S >= 2), the
stage iteration i - 1 read may still be read by its wgmma until iteration i's
`wgmma.wait_group 1`, so the refill moves after the body:

    iteration:  try_wait.parity(b[i % S], (i / S) & 1) until it holds; the body (wgmma of
                stage i % S, commit, wait_group 1: the one of stage (i - 1) % S retired);
                barrier (in every warp); issue i + S - 1 into stage (i - 1) % S
    after:      wgmma.wait_group 0 (the accumulators are read after the loop); as above

Only the loop's own iterations are issued, so each barrier phase is waited on exactly once
and nothing is in flight after the loop. Boxes past the tensor's edge arrive as zeros.

Warp-specialized (`PipelinePlan.ws`, `plan_ws`): C consumer threads, the producer warp group
after them; per stage s a full barrier f[s] (count 1) and an empty one e[s] (count C / 32);
the consumers' block barrier is `bar.sync 1, C`, and `bar.sync 2, C + 128` meets both sides:

    after the preamble: threads >= C branch to the producer (placed after the body's `ret`);
                the consumers `setmaxnreg.inc`
    consumers:  at the loop, thread 0 inits f and e; fence.proxy.async; bar.sync 2
                iteration i: try_wait.parity(f[i % S], (i / S) & 1); the body (wgmma,
                commit, wait_group 1: the wgmma of iteration i - 1 retired); if i > first,
                lane 0 of each warp arrives on e[(i - 1) % S]
                after: wait_group 0; bar.sync 1; thread 0 invalidates f and e; bar.sync 1
    producer:   setmaxnreg.dec; its scalars again (`producer_ops`); bar.sync 2; all but
                thread C exit; thread C, per iteration j: try_wait.parity(e[j % S],
                ((j / S) & 1) ^ 1) (a fresh barrier passes parity 1: the first round does
                not wait), arrive.expect_tx(f[j % S]), the boxes; then it exits

In a persistent kernel (`plan_persistent`) the ring is kept across tiles (`KeptRing`): the
consumers init f and e and meet the producer at `bar.sync 2` once, after the preamble; j and
i run on over the block's tiles (stage, barrier and phase registers carried, never reset);
each tile's loop starts with nothing to hand back, and its drain (wait_group 0) hands back
the stage its last iteration read; the producer walks the same tiles (`emit_persistent`),
computing each tile's bounds and box coordinates again, and fills the next tile's stages as
the consumers hand them back, while they run this tile's epilogue. After the last tile: the
consumers' barrier, thread 0 invalidates f and e. Where the plan sets the ring up per tile
instead (its scratch lies over the ring), the whole producer warp group walks the tiles and
meets the consumers at `bar.sync 2` once per tile, after they initialized its barriers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from cutile_py.ir import ops as o
from cutile_py.lower import emit_persistent, emit_pipeline
from cutile_py.lower.context import EmitContext, KeptRing
from cutile_py.lower.emit_pipeline import LoopPipeline
from cutile_py.lower.emit_store import box_origin, panel_coords
from cutile_py.lower.plan_pipelines import PipelinePlan, StagedLoad
from cutile_py.lower.plan_tma import MAP_DTYPE, box
from cutile_py.lower.plan_ws import PRODUCER_REGS, PRODUCER_THREADS
from cutile_py.ptx.builder import Addr, Reg

#: Bytes per mbarrier.
BARRIER = 8


@dataclass(frozen=True)
class MapParam:
    """The tensor map one staged load reads (or a TMA store writes): of kernel parameter
    `arg`, its box (innermost dimension first), `CUtensorMapSwizzle` and
    `CUtensorMapDataType`."""

    load: o.LoadOp | o.StoreOp
    arg: int
    box: tuple[int, ...]
    swizzle: int
    map_dtype: int


def map_params(em: EmitContext) -> list[MapParam]:
    """One tensor map per load of every TMA pipeline, in program order, then one per TMA
    store (`plan_store`)."""
    out = []
    for plan in em.pipelines.values():
        if plan.kind != "tma":
            continue
        for sl in plan.loads:
            if not sl.tma:
                continue
            load = sl.load
            code = MAP_DTYPE[load.result.type.dtype.name]
            out.append(MapParam(load, load.param, box(load.shape, sl.tile), sl.swizzle, code))
    for t in em.tma_stores.values():
        out.append(MapParam(t.store, t.store.param, t.box, t.swizzle, t.map_dtype))
    return out


def map_address(em: EmitContext, name: str) -> Reg:
    """The generic address of the tensor-map parameter `name` (a kernel parameter's address
    in the param space, converted as for a `__grid_constant__` argument)."""
    fb = em.fb
    em.features.add("tma")
    local, wide, generic = fb.reg("b32"), fb.reg("b64"), fb.reg("b64")
    fb.ins("mov.b32", local, name)
    fb.ins("cvt.u64.u32", wide, local)
    fb.ins("cvta.param.u64", generic, wide)
    return generic


def start(em: EmitContext, plan: PipelinePlan) -> TmaPipeline:
    """`emit_pipeline.start`'s setup (mma addressing, the ring claimed, the loads set
    aside, resident tiles stored), carried out by a `TmaPipeline`."""
    base = emit_pipeline.start(em, plan)
    em.fb.shared_align = max(em.fb.shared_align, 1024)
    kind = TmaPipeline if plan.ws is None else WsPipeline
    pipe = kind(**{f.name: getattr(base, f.name) for f in fields(LoopPipeline)})
    pipe.descending = plan.loop.descending
    pipe.in_flight = plan.in_flight
    return pipe


@dataclass
class TmaPipeline(LoopPipeline):
    """A `LoopPipeline` whose boxes are issued by thread 0 and awaited on the stage's
    mbarrier (the emission hooks `Emitter.op_for` calls are the same)."""

    descending: bool = False
    in_flight: int = 0  # wgmma groups left running per iteration: the refill waits for them
    leader: Reg | None = None  # thread 0: inits, arrives and issues
    hi: Reg | None = None  # the loop's bound: iterations past it are not issued
    bars: int = 0  # byte offset of b[0]
    bar_read: Reg | None = None  # shared address of the barrier of the stage read
    bar_write: Reg | None = None  # and of the stage refilled
    phase: Reg | None = None  # parity of the read stage's phase awaited

    def prologue(self, iv: Reg, step: Reg) -> None:
        em, fb = self.em, self.em.fb
        assert em.smem is not None and em.tid is not None
        self.iv, self.step = iv, step
        self.hi = em.regs(self.loop.operands[1])[0]
        self.leader = fb.reg("pred")
        fb.ins("setp.eq.u32", self.leader, em.tid, 0)
        self.bars = self.ring + self.stages * self.stage_bytes
        for s in range(self.stages):
            fb.ins("mbarrier.init.shared::cta.b64", self._bar(s), 1, pred=self.leader)
        # What the block wrote to this memory before (generic proxy) comes before what the
        # copy engine writes (async proxy).
        fb.ins("fence.proxy.async.shared::cta")
        em.barrier()
        self.read, self.write = fb.reg("b32"), fb.reg("b32")
        fb.ins("mov.u32", self.read, self.ring)
        fb.ins("mov.u32", self.write, self.ring + (self.stages - 1) * self.stage_bytes)
        self.bar_read, self.bar_write, self.phase = fb.reg("b32"), fb.reg("b32"), fb.reg("b32")
        fb.ins("add.u32", self.bar_read, em.smem, self.bars)
        fb.ins("add.u32", self.bar_write, em.smem, self.bars + (self.stages - 1) * BARRIER)
        fb.ins("mov.u32", self.phase, 0)
        self._streams()  # the addressing of the affine cp.async tiles, advanced per issue
        for s in range(self.stages - 1):
            stage, bar = fb.reg("b32"), fb.reg("b32")
            fb.ins("mov.u32", stage, self.ring + s * self.stage_bytes)
            fb.ins("add.u32", bar, em.smem, self.bars + s * BARRIER)
            self._issue_tma(s, stage, bar)
        self._enter_body()

    def top(self) -> None:
        assert self.write is not None and self.bar_write is not None
        fb = self.em.fb
        copies = any(not sl.tma for sl in self.loads)
        if self.stages == 1:
            self.em.barrier()  # every warp is done with the previous iteration's tiles
            self._issue_tma(0, self.write, self.bar_write)
            self._wait()
            if copies:  # other threads' cp.async copies are seen after a barrier
                fb.ins("cp.async.wait_group", 0)
                self._proxy_fence()
                self.em.barrier()
        elif self.in_flight:
            self._wait()  # the refill comes in `bottom`, once the wgmma reading it retired
        else:
            if copies:
                fb.ins("cp.async.wait_group", self.stages - 2)
                # cp.async wrote through the generic proxy; a wgmma reads through the async one.
                self._proxy_fence()
            self._wait()
            self.em.barrier()
            self._issue_tma(self.stages - 1, self.write, self.bar_write)

    def bottom(self) -> None:
        fb = self.em.fb
        assert self.em.smem is not None and self.phase is not None
        if self.stages == 1:
            fb.ins("xor.b32", self.phase, self.phase, 1)
            return
        if self.in_flight:
            assert self.write is not None and self.bar_write is not None
            # Every warp's wgmma of the previous iteration retired (its wait_group in the
            # body): the stage it read can be refilled.
            self.em.barrier()
            self._issue_tma(self.stages - 1, self.write, self.bar_write)
        for stage, bar in ((self.read, self.bar_read), (self.write, self.bar_write)):
            assert stage is not None and bar is not None
            wrap = fb.reg("pred")
            fb.ins("add.u32", stage, stage, self.stage_bytes)
            fb.ins("add.u32", bar, bar, BARRIER)
            fb.ins("setp.eq.u32", wrap, stage, self.ring + self.stages * self.stage_bytes)
            fb.ins("selp.b32", stage, self.ring, stage, wrap)
            first = fb.reg("b32")
            fb.ins("add.u32", first, self.em.smem, self.bars)
            fb.ins("selp.b32", bar, first, bar, wrap)
            if stage is self.read:  # the ring wrapped: the next use is the next phase
                fb.ins("xor.b32", self.phase, self.phase, 1, pred=wrap)

    def drain(self) -> None:
        em = self.em
        if self.in_flight:
            em.fb.ins("wgmma.wait_group.sync.aligned", 0)  # the accumulators are final
        if any(not sl.tma for sl in self.loads):
            em.fb.ins("cp.async.wait_all")  # cp.async copies issued past the end
        em.barrier()  # every thread has waited on its last phase
        for s in range(self.stages):
            em.fb.ins("mbarrier.inval.shared::cta.b64", self._bar(s), pred=self.leader)
        em.barrier()
        em.scratch_floor, em.scratch = self.outer_scratch
        for key in self.resident:
            del em.resident[key]

    # -- internals ------------------------------------------------------------------------
    def _enter_body(self) -> None:
        """The body reads its staged operands at the read stage, and its scratch lies past
        the ring (the outer floor comes back after the loop)."""
        em, fb = self.em, self.em.fb
        assert em.smem is not None and self.read is not None
        for sl in self.loads:
            em.staged[sl.operand] = (sl.tile, sl.k_rows, self.read)
        self.outer_scratch = (em.scratch_floor, em.scratch)
        em.scratch_floor, em.scratch = self.floor, fb.reg("b32")
        fb.ins("add.u32", em.scratch, em.smem, self.floor)

    def _bar(self, s: int) -> Addr:
        assert self.em.smem is not None
        return Addr(self.em.smem, self.bars + s * BARRIER)

    def _wait(self) -> None:
        """Spin until the read stage's barrier completes the phase awaited."""
        fb = self.em.fb
        done, again = fb.reg("pred"), fb.new_label("tma_wait")
        fb.place(again)
        assert self.bar_read is not None and self.phase is not None
        fb.ins("mbarrier.try_wait.parity.shared::cta.b64", done, Addr(self.bar_read), self.phase)
        fb.ins("bra", again, pred=done, negate=True)

    def _issue_tma(self, ahead: int, stage: Reg, bar: Reg) -> None:
        """Thread 0: if iteration i + `ahead` is one of the loop's, expect the stage's TMA
        bytes on `bar` and copy its TMA tiles into the stage at `stage`. Every thread: copy
        its chunks of the other tiles with cp.async (zeros past the tensor's edge), one
        commit group."""
        em, fb = self.em, self.em.fb
        assert self.iv is not None and self.step is not None and self.hi is not None
        assert em.smem is not None and self.leader is not None
        it = self.iv
        if ahead:
            it = fb.reg("b32")
            fb.ins("mad.lo.s32", it, self.step, ahead, self.iv)
        copies = [sl for sl in self.loads if not sl.tma]
        if copies:
            base: Reg | None = None
            for sl in copies:  # as emit_pipeline issues them (its helpers, not copies)
                stream = self.streams.get(sl.load)
                if stream is None:
                    if base is None:
                        base = fb.reg("b32")
                        fb.ins("add.u32", base, em.smem, stage)
                    index = emit_pipeline.index_at(em, self.loop, sl, it)
                    emit_pipeline.copy_staged(
                        em, sl, emit_pipeline.staged_access(em, sl, index), base
                    )
                else:
                    stream.copy(em, sl, stage, stream.tile_ok_now(sl), checked=True)
                    stream.advance(em, sl.varying)
            fb.ins("cp.async.commit_group")
        inside, go = fb.reg("pred"), fb.reg("pred")
        fb.ins("setp.gt.s32" if self.descending else "setp.lt.s32", inside, it, self.hi)
        fb.ins("and.pred", go, inside, self.leader)
        # The other threads branch past (not predicated off: the per-warp issue loops ptxas
        # builds around a TMA instruction would otherwise run in every warp).
        skip = fb.new_label("tma_issued")
        fb.ins("bra", skip, pred=go, negate=True)
        issue_boxes(em, self.loop, self.loads, it, stage, bar)
        fb.place(skip)


def issue_boxes(
    em: EmitContext, loop: o.ForOp, loads: list[StagedLoad], it: Reg, stage: Reg, bar: Reg
) -> None:
    """(One thread:) expect the TMA tiles' bytes on the barrier at `bar` and copy them, at
    iteration `it`, into the stage at byte `stage` of shared memory."""
    fb = em.fb
    assert em.smem is not None
    boxes = [sl for sl in loads if sl.tma]
    total = sum(sl.tile.nbytes for sl in boxes)  # boxes count whole, zeros included
    fb.ins("mbarrier.arrive.expect_tx.shared::cta.b64", "_", Addr(bar), total)
    base = fb.reg("b32")
    fb.ins("add.u32", base, em.smem, stage)
    for sl in boxes:
        coords = _coords(em, loop, sl, it)
        tile = sl.tile
        for p in range(tile.panels):  # one box per 128-byte panel of a wgmma tile
            where = panel_coords(fb, coords, p * tile.panel)
            fb.ins(
                f"cp.async.bulk.tensor.{len(coords)}d.shared::cluster.global"
                ".mbarrier::complete_tx::bytes",
                Addr(base, tile.offset + p * tile.rows * tile.row_bytes),
                f"[{em.tensor_maps[sl.load]}, {{{where}}}]",
                Addr(bar),
            )


def _coords(em: EmitContext, loop: o.ForOp, sl: StagedLoad, it: Reg) -> list[Reg]:
    """The box's first element, innermost dimension first: the load's index (its index ops
    emitted again with the induction variable at `it`) times the tile shape."""
    return box_origin(em.fb, emit_pipeline.index_at(em, loop, sl, it), sl.load.shape)


#: The named barrier both sides of a warp-specialized kernel meet at once the mbarriers are
#: initialized (the consumers' block barrier is `context.CONSUMERS_BARRIER`).
READY_BARRIER = 2


def _ws_setup(em: EmitContext, plan: PipelinePlan) -> KeptRing:
    """(Consumers:) thread 0 inits every stage's full and empty mbarrier; both sides meet at
    `READY_BARRIER`; the ring's read state starts at stage 0, phase 0."""
    fb = em.fb
    assert em.smem is not None and em.tid is not None
    leader, lane0 = fb.reg("pred"), fb.reg("pred")
    fb.ins("setp.eq.u32", leader, em.tid, 0)
    lane = fb.reg("b32")
    fb.ins("and.b32", lane, em.tid, 31)
    fb.ins("setp.eq.u32", lane0, lane, 0)
    ring = em.shared.ring(plan.loop)
    bars = ring + plan.stages * plan.stage_bytes
    for s in range(2 * plan.stages):
        count = 1 if s < plan.stages else em.consumers // 32
        fb.ins(
            "mbarrier.init.shared::cta.b64", Addr(em.smem, bars + s * BARRIER), count, pred=leader
        )
    fb.ins("fence.proxy.async.shared::cta")
    fb.ins("bar.sync", READY_BARRIER, em.consumers + PRODUCER_THREADS)
    read, bar_read, bar_prev, phase = (fb.reg("b32") for _ in range(4))
    fb.ins("mov.u32", read, ring)
    fb.ins("add.u32", bar_read, em.smem, bars)
    fb.ins("mov.u32", bar_prev, bar_read)
    fb.ins("mov.u32", phase, 0)
    return KeptRing(plan.loop, leader, lane0, read, bar_read, bar_prev, phase)


def release_kept(em: EmitContext) -> None:
    """After a persistent kernel's last tile: every consumer has waited on its last phase;
    thread 0 invalidates the kept ring's barriers."""
    kept = em.kept_ring
    if kept is None:
        return
    assert em.smem is not None
    plan = em.pipelines[kept.loop]
    bars = em.shared.ring(kept.loop) + plan.stages * plan.stage_bytes
    em.barrier()
    for s in range(2 * plan.stages):
        em.fb.ins(
            "mbarrier.inval.shared::cta.b64", Addr(em.smem, bars + s * BARRIER), pred=kept.leader
        )


def split_warps(em: EmitContext) -> None:
    """After the preamble of a kernel with a warp-specialized loop: send the producer warp
    group to its code (emitted after the body) and give the consumers their registers (and
    in a persistent kernel, set up the ring kept across its tiles)."""
    plans = [p for p in em.pipelines.values() if p.ws is not None]
    if not plans:
        return
    (plan,) = plans
    ws = plan.ws
    assert ws is not None and em.tid is not None
    fb = em.fb
    fb.directives += [f".maxnreg {ws.maxnreg}", f".reqntid {ws.threads}, 1, 1"]
    em.consumers = ws.consumers
    producer, go = fb.new_label("producer"), fb.reg("pred")
    fb.ins("setp.ge.u32", go, em.tid, ws.consumers)
    fb.ins("bra", producer, pred=go)
    fb.ins("setmaxnreg.inc.sync.aligned.u32", ws.consumer_regs)
    em.tails.append(lambda: _producer(em, plan, producer))
    if em.persistent is not None and em.persistent.kept is plan.loop:
        em.kept_ring = _ws_setup(em, plan)


def _producer(em: EmitContext, plan: PipelinePlan, label: str) -> None:
    """The producer warp group's code: its thread `consumers` issues every iteration's boxes
    into the stage the consumers handed back (in a persistent kernel, every iteration of
    each of the block's tiles, the ring's state running on)."""
    ws, fb, loop = plan.ws, em.fb, plan.loop
    assert ws is not None and em.tid is not None and em.smem is not None
    fb.place(label)
    fb.ins("setmaxnreg.dec.sync.aligned.u32", PRODUCER_REGS)
    ring = em.shared.ring(loop)
    bars = ring + plan.stages * plan.stage_bytes
    stage, bar, phase = fb.reg("b32"), fb.reg("b32"), fb.reg("b32")
    if em.persistent is not None and em.kept_ring is None:
        _producer_per_tile(em, plan, (stage, bar, phase))
        return
    if em.kept_ring is None:
        with em.scope({}):
            for op in ws.producer_ops:  # the consumers' registers are not ours
                em.emit_op(op)
            bounds = [em.regs(v)[0] for v in loop.operands[:3]]
            _producer_start(em, ws.threads, ws.consumers, ring, bars, (stage, bar, phase))
            _produce(em, plan, bounds, (stage, bar, phase))
        fb.ins("ret")
        return
    _producer_start(em, ws.threads, ws.consumers, ring, bars, (stage, bar, phase))
    tw = emit_persistent.walk(em, "produce_tile")
    with em.scope({}):
        for op in ws.producer_ops:  # this tile's bounds and box coordinates
            em.emit_op(op)
        _produce(em, plan, [em.regs(v)[0] for v in loop.operands[:3]], (stage, bar, phase))
    emit_persistent.next_tile(em, tw, barrier=False)
    fb.ins("ret")


def _producer_per_tile(em: EmitContext, plan: PipelinePlan, state: tuple[Reg, ...]) -> None:
    """A persistent kernel's producer where the ring is set up per tile: the whole warp
    group walks the tiles, meets the consumers once they initialized the tile's barriers,
    and its issuing thread fills the fresh ring for the tile's iterations."""
    ws, fb, loop = plan.ws, em.fb, plan.loop
    assert ws is not None and em.tid is not None and em.smem is not None
    ring = em.shared.ring(loop)
    bars = ring + plan.stages * plan.stage_bytes
    stage, bar, phase = state
    tw = emit_persistent.walk(em, "produce_tile")
    with em.scope({}):
        for op in ws.producer_ops:  # this tile's bounds and box coordinates
            em.emit_op(op)
        bounds = [em.regs(v)[0] for v in loop.operands[:3]]
        fb.ins("bar.sync", READY_BARRIER, ws.threads)  # this tile's mbarriers are initialized
        idle, issued = fb.reg("pred"), fb.new_label("tile_produced")
        fb.ins("setp.ne.u32", idle, em.tid, ws.consumers)
        fb.ins("bra", issued, pred=idle)
        fb.ins("mov.u32", stage, ring)
        fb.ins("add.u32", bar, em.smem, bars)
        fb.ins("mov.u32", phase, 1)  # fresh barriers pass parity 1: round 0 goes on
        _produce(em, plan, bounds, state)
        fb.place(issued)
    emit_persistent.next_tile(em, tw, barrier=False)
    fb.ins("ret")


def _producer_start(
    em: EmitContext, threads: int, consumers: int, ring: int, bars: int, state: tuple[Reg, ...]
) -> None:
    """Once the mbarriers are initialized, every producer thread but `consumers` exits; the
    ring's write state starts at stage 0, on parity 1 (a fresh barrier passes it)."""
    fb = em.fb
    assert em.tid is not None and em.smem is not None
    stage, bar, phase = state
    fb.ins("bar.sync", READY_BARRIER, threads)  # the mbarriers are initialized
    idle = fb.reg("pred")
    fb.ins("setp.ne.u32", idle, em.tid, consumers)
    fb.ins("ret", pred=idle)
    fb.ins("mov.u32", stage, ring)
    fb.ins("add.u32", bar, em.smem, bars)
    fb.ins("mov.u32", phase, 1)  # a fresh barrier passes parity 1: round 0 goes on


def _produce(
    em: EmitContext, plan: PipelinePlan, bounds: list[Reg], state: tuple[Reg, ...]
) -> None:
    """(The issuing thread:) for each iteration from `bounds` (lo, hi, step): wait for the
    stage back (its empty barrier), expect its bytes and issue its boxes; the stage, its
    barrier and the parity (`state`) advance around the ring."""
    fb, loop = em.fb, plan.loop
    assert em.smem is not None
    ring = em.shared.ring(loop)
    bars = ring + plan.stages * plan.stage_bytes
    stage, bar, phase = state
    lo, hi, step = bounds
    it = fb.reg("b32")
    fb.ins("mov.u32", it, lo)
    top, end, done = fb.new_label("produce"), fb.new_label("produced"), fb.reg("pred")
    fb.place(top)
    fb.ins("setp.le.s32" if loop.descending else "setp.ge.s32", done, it, hi)
    fb.ins("bra", end, pred=done)
    free, again = fb.reg("pred"), fb.new_label("empty_wait")
    fb.place(again)
    empty = Addr(bar, plan.stages * BARRIER)
    fb.ins("mbarrier.try_wait.parity.shared::cta.b64", free, empty, phase)
    fb.ins("bra", again, pred=free, negate=True)
    issue_boxes(em, loop, list(plan.loads), it, stage, bar)
    wrap = fb.reg("pred")
    fb.ins("add.u32", stage, stage, plan.stage_bytes)
    fb.ins("add.u32", bar, bar, BARRIER)
    fb.ins("setp.eq.u32", wrap, stage, bars)
    fb.ins("selp.b32", stage, ring, stage, wrap)
    first = fb.reg("b32")
    fb.ins("add.u32", first, em.smem, bars)
    fb.ins("selp.b32", bar, first, bar, wrap)
    fb.ins("xor.b32", phase, phase, 1, pred=wrap)
    fb.ins("add.s32", it, it, step)
    fb.ins("bra", top)
    fb.place(end)


@dataclass
class WsPipeline(TmaPipeline):
    """The consumers' side of a warp-specialized TMA loop: wait on the stage's full
    barrier, and once the wgmma reading it retired, arrive on its empty one."""

    lane0: Reg | None = None  # lane 0 of its warp: arrives for the warp
    started: Reg | None = None  # past the first iteration: a stage is to be handed back
    bar_prev: Reg | None = None  # full barrier of the stage the previous iteration read

    def prologue(self, iv: Reg, step: Reg) -> None:
        em, fb = self.em, self.em.fb
        assert em.smem is not None and em.tid is not None
        self.iv, self.step = iv, step
        self.bars = self.ring + self.stages * self.stage_bytes
        # Kept across a persistent kernel's tiles: set up once, its state running on.
        ring = em.kept_ring if em.kept_ring is not None else _ws_setup(em, em.pipelines[self.loop])
        self.leader, self.lane0, self.phase = ring.leader, ring.lane0, ring.phase
        self.read, self.bar_read, self.bar_prev = ring.read, ring.bar_read, ring.bar_prev
        self.started = fb.reg("pred")
        fb.ins("setp.ne.u32", self.started, em.tid, em.tid)  # false: nothing to hand back
        self._enter_body()

    def top(self) -> None:
        self._wait()

    def bottom(self) -> None:
        fb = self.em.fb
        assert self.lane0 is not None and self.started is not None
        assert self.bar_prev is not None and self.bar_read is not None
        assert self.read is not None and self.phase is not None and self.em.smem is not None
        # The body's wait_group 1 retired the previous iteration's wgmma: its stage is free.
        go = fb.reg("pred")
        fb.ins("and.pred", go, self.started, self.lane0)
        empty = Addr(self.bar_prev, self.stages * BARRIER)
        fb.ins("mbarrier.arrive.shared::cta.b64", "_", empty, pred=go)
        fb.ins("mov.u32", self.bar_prev, self.bar_read)
        fb.ins("setp.eq.u32", self.started, self.bar_read, self.bar_read)  # true
        wrap = fb.reg("pred")
        fb.ins("add.u32", self.read, self.read, self.stage_bytes)
        fb.ins("add.u32", self.bar_read, self.bar_read, BARRIER)
        fb.ins("setp.eq.u32", wrap, self.read, self.bars)
        fb.ins("selp.b32", self.read, self.ring, self.read, wrap)
        first = fb.reg("b32")
        fb.ins("add.u32", first, self.em.smem, self.bars)
        fb.ins("selp.b32", self.bar_read, first, self.bar_read, wrap)
        fb.ins("xor.b32", self.phase, self.phase, 1, pred=wrap)

    def drain(self) -> None:
        em = self.em
        em.fb.ins("wgmma.wait_group.sync.aligned", 0)  # the accumulators are final
        if em.kept_ring is not None:
            # The ring lives on: the stage the last iteration read goes back to the producer
            # (the next tile's copies go on; `release_kept` invalidates at the end).
            assert self.started is not None and self.lane0 is not None
            assert self.bar_prev is not None
            go = em.fb.reg("pred")
            em.fb.ins("and.pred", go, self.started, self.lane0)
            empty = Addr(self.bar_prev, self.stages * BARRIER)
            em.fb.ins("mbarrier.arrive.shared::cta.b64", "_", empty, pred=go)
            em.scratch_floor, em.scratch = self.outer_scratch
            return
        em.barrier()  # every consumer has waited on its last phase
        for s in range(2 * self.stages):
            em.fb.ins("mbarrier.inval.shared::cta.b64", self._bar(s), pred=self.leader)
        em.barrier()
        em.scratch_floor, em.scratch = self.outer_scratch
