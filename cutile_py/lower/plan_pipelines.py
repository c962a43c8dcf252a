"""plan_pipelines: before emission, decide for each loop with an mma in its body which carried
accumulators stay in mma fragments, which operand loads become `cp.async` copies (or, on a
TMA target where the tiles allow, TMA copies: `plan_tma`) issued `stages - 1` iterations
ahead into a ring of shared stages, how many stages, and which mma operands defined before
the loop are stored once for it. The decisions are data
(`PipelinePlan`); `allocate_shared` places the buffers, `emit_pipeline` carries them out."""

from __future__ import annotations

from dataclasses import dataclass, replace

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import bf16, f16, f32
from cutile_py.ir.uses import DefUse
from cutile_py.lower import plan_wgmma, plan_ws
from cutile_py.lower.assign_fragments import WARP, FragmentPlan, no_fragments
from cutile_py.lower.errors import LoweringError
from cutile_py.lower.fragments import SHARED_LIMIT, SharedTile, round_region, warp_grid
from cutile_py.lower.layout import Blocked, Layout, LayoutPlan, canonical_blocked
from cutile_py.lower.plan_tma import BARRIER_BYTES, TMA_ALIGN, tma_swizzle
from cutile_py.ptx.target import Target

#: Stages when the kernel does not say: as many as fit in 48 KiB, at most this many.
DEFAULT_STAGES = 3
#: Ops an index may be computed with: pure, scalar, no regions.
_INDEX_OPS = plan_ws.PURE_SCALAR_OPS


@dataclass(frozen=True)
class StagedLoad:
    """A body load that the pipeline issues ahead as cp.async copies."""

    load: o.LoadOp
    chain: tuple[o.Op, ...]  # the load, then the reshapes and transposes down to the operand
    operand: o.Value  # what the mma takes
    k_rows: bool  # the tile's rows run along K (an A stored (K, M), a B stored (K, N))
    tile: SharedTile  # in stage 0; stage s is `s * stage_bytes` further
    copy: Layout  # how the block's threads split the copy
    index_ops: tuple[o.Op, ...]  # the body's ops that compute the load's index, in order
    #: Every index changes by the same amount each iteration (sums, differences and products
    #: by loop invariants of the induction variable): its addresses are advanced, not
    #: recomputed.
    affine: bool = False
    #: Per index: whether it changes from one iteration to the next (an affine load's
    #: addressing along the other dims, bounds included, is computed once, before the loop).
    varying: tuple[bool, ...] = ()
    #: Copied by TMA (in a "tma" pipeline), with the tensor map's `CUtensorMapSwizzle`
    #: (see `plan_tma`); else by cp.async.
    tma: bool = False
    swizzle: int = 0


@dataclass(frozen=True)
class PipelinePlan:
    """How one loop with an mma in its body runs: which carried values stay mma fragments,
        which operand loads a `stages`-deep cp.async ring issues ahead (`allocate_shared` places
    the ring)."""

    loop: o.ForOp
    mmas: tuple[o.MmaOp, ...]
    #: (carried position, the mma whose accumulator it is): held as fragments.
    carried: tuple[tuple[int, o.MmaOp], ...]
    loads: tuple[StagedLoad, ...]
    stages: int
    stage_bytes: int
    #: mma operands defined before the loop: stored once, before it, into these tiles
    #: (placed by `allocate_shared`), instead of once per iteration.
    resident: tuple[tuple[o.Value, int, SharedTile], ...] = ()
    #: The mmas lowered to wgmma (`plan_wgmma`): their operand tiles are wgmma layouts,
    #: on 1024-byte boundaries.
    wgmma: tuple[o.MmaOp, ...] = ()
    #: "cp.async" (each thread copies its chunks) or "tma" (one thread issues a
    #: cp.async.bulk.tensor per TMA tile into stages guarded by mbarriers, the other tiles
    #: copied by cp.async beside them: `emit_tma`).
    kind: str = "cp.async"
    #: On a target with TMA, why tiles of this pipeline are copied by cp.async ("" if none).
    why: str = ""
    #: wgmma commit groups left in flight at the end of an iteration (`plan_wgmma.in_flight`):
    #: 1 lets the tensor cores run while the next stage is awaited.
    in_flight: int = 0
    #: Copies of the body per trip around the loop: one per stage for an mma.sync cp.async
    #: ring, so that each copy reads and refills fixed stages (their offsets constants, the
    #: addresses' immediates; nothing advances around the ring) in a loop that carries only
    #: mma accumulators; 1 otherwise.
    unroll: int = 1
    #: With `@ct.kernel(warp_specialize=True)`: a producer warp group issues the boxes
    #: (`plan_ws`); or why the loop is not specialized ("" where not asked).
    ws: plan_ws.WarpSpecialization | None = None
    ws_why: str = ""
    #: Fragments loaded a k step ahead (register double buffering, `emit_mma.warp_mma`):
    #: those of step ks + 1 before the mmas of step ks, and the next stage's first step
    #: after the barrier that lets it be read, before this stage's last mmas. `ahead_why`
    #: says why a pipelined mma.sync loop keeps loading each step's fragments just before
    #: its mmas ("" if it does not).
    ahead: bool = False
    ahead_why: str = ""

    @property
    def ring_bytes(self) -> int:
        """The stages, and for TMA their mbarriers after them."""
        return self.stages * self.stage_bytes + (BARRIER_BYTES if self.kind == "tma" else 0)

    @property
    def footprint(self) -> int:
        """Bytes of shared memory held while the loop runs: its ring and resident tiles."""
        if not self.loads:
            return 0
        held = sum(round_region(t.nbytes) for _, _, t in self.resident)
        return self.ring_bytes + held


def plan_pipelines(
    kernel: o.Kernel,
    layouts: LayoutPlan,
    target: Target,
    uses: DefUse,
    fragments: FragmentPlan | None = None,
) -> dict[o.ForOp, PipelinePlan]:
    """The pipeline of every loop with a top-level mma in its body, in program order. A loop
    nested in a pipelined loop chooses its stages within what the outer one leaves."""
    out: dict[o.ForOp, PipelinePlan] = {}
    frags = fragments or no_fragments()
    cx = _Planning(kernel, layouts, target, uses, frags)

    def visit(region: o.Region, outer: int) -> None:
        for op in region.ops:
            inner = outer
            if isinstance(op, o.ForOp):
                plan = plan_loop(cx, op, outer)
                if plan is not None:
                    out[op] = plan
                    inner = outer + plan.footprint
            for r in op.regions():
                visit(r, inner)

    visit(kernel.body, 0)
    if kernel.warp_specialize:
        ring = [p for p in out.values() if p.loads]
        for p in ring:
            got = plan_ws.specialize(kernel, p, layouts.threads, uses)
            if len(ring) > 1:
                got = "the kernel has more than one pipelined loop"
            if isinstance(got, str):
                out[p.loop] = replace(p, ws_why=got)
            else:
                out[p.loop] = replace(p, ws=got)
    return out


@dataclass(frozen=True)
class _Planning:
    kernel: o.Kernel
    layouts: LayoutPlan
    target: Target
    uses: DefUse
    fragments: FragmentPlan


def plan_loop(cx: _Planning, loop: o.ForOp, outer: int) -> PipelinePlan | None:
    """What of `loop` runs as a tensor-core loop, within the shared memory left past the
    `outer` bytes enclosing loops hold; None if its body has no top-level mma."""
    body = loop.body.ops
    mmas = [op for op in body if isinstance(op, o.MmaOp)]
    if not mmas:
        return None
    uses = cx.uses
    yield_op = body[-1]
    # Accumulators the loop carries in fragments (decided by `assign_fragments`), with the
    # mma that yields each.
    carried: dict[int, o.MmaOp] = {}
    for k, arg in enumerate(loop.body.args[1:]):
        frag = cx.fragments.of(arg)
        made = uses.producer(yield_op.operands[k])
        if frag is not None and frag.kind == "acc" and isinstance(made, o.MmaOp):
            carried[k] = made
    loads = []
    for mma in mmas if cx.target.cp_async else ():
        for which in (0, 1):
            sl = _staged_load(cx, loop, mma, which, uses)
            if sl is not None:
                loads.append(sl)
    pairs = tuple(carried.items())
    if not loads:
        return PipelinePlan(loop, tuple(mmas), pairs, (), 1, 0)
    staged = {sl.operand: (sl.tile, sl.k_rows) for sl in loads}
    wgmma = plan_wgmma.choose(cx.target, cx.layouts.threads, mmas, staged, cx.fragments.grids)
    if wgmma:
        ops = {v for m in wgmma for v in m.operands[:2]}
        loads = [
            replace(sl, tile=plan_wgmma.operand_tile(sl.tile)) if sl.operand in ops else sl
            for sl in loads
        ]
    plan = _place(cx, loop, pairs, loads, mmas, outer, wgmma)
    tma_only = plan.kind == "tma" and all(sl.tma for sl in plan.loads)
    depth = plan_wgmma.in_flight(loop, mmas, wgmma, pairs, uses, tma_only, plan.stages)
    return replace(plan, in_flight=depth)


def _staged_load(
    cx: _Planning, loop: o.ForOp, mma: o.MmaOp, which: int, uses: DefUse
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
    param = cx.kernel.params[load.param]
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
    base = _copy_blocked(rows, cols, eb, cx.layouts.threads, width)
    if base.vec != width:
        return None
    copy = Layout(base, tuple(None if s == 1 else big.index(i) for i, s in enumerate(shape)))
    tile = SharedTile(0, rows, cols, eb, True, xor_step=2 if k_rows and dt is f32 else 1)
    chain.reverse()
    kinds = _index_kinds(loop, load, index_ops)
    affine = None not in kinds
    varying = tuple(k != "inv" for k in kinds)
    return StagedLoad(
        load, tuple(chain), mma.operands[which], k_rows, tile, copy, index_ops, affine, varying
    )


#: Bytes of a tile row one row of copying threads may cover, widest first: a whole 128-byte
#: line, half of one or a 32-byte sector (each instruction still copies whole sectors).
COPY_ROW_BYTES = (128, 64, 32)


def _copy_blocked(rows: int, cols: int, eb: int, threads: int, width: int) -> Blocked:
    """How the block's threads split the copy of a rows x cols tile in `width`-element
    chunks: the coalesced layout, or fewer threads per row (`COPY_ROW_BYTES`) where that
    keeps every thread busy and costs a thread fewer address instructions per iteration
    (`_copy_cost`)."""
    base = canonical_blocked((rows, cols), eb, threads, max_vec=width)
    best = base
    for row_bytes in COPY_ROW_BYTES:
        line = row_bytes // (base.vec * eb)
        if 0 < line < base.threads[1] and rows * line >= threads:
            other = Blocked(base.shape, base.vec, (threads // line, line), threads)
            if _copy_cost(other, eb) < _copy_cost(best, eb):
                best = other
    return best


def _copy_cost(b: Blocked, eb: int) -> int:
    """Integer instructions per iteration a thread spends on its copies' addresses: 2 per
    row (a 64-bit address) and 1 per shared address register (copies whose swizzle agrees
    share one: rows 8 apart, columns a multiple of 8 chunks apart). The second term is an
    add of the stage per iteration where the stage offset varies (wgmma rings); where the
    loop is unrolled per stage (`PipelinePlan.unroll`) the stage is an immediate and the
    register costs nothing per iteration, and the term only breaks ties."""
    chunks = b.shape[1] // b.vec
    xor = min(chunks & -chunks, 8)
    rows, cols = b.offsets(0), b.offsets(1)[:: b.vec]
    span = xor * 16 // eb
    return 2 * len(rows) + len({r % 8 for r in rows}) * len({c % span for c in cols})


def _index_kinds(loop: o.ForOp, load: o.LoadOp, index_ops: tuple[o.Op, ...]) -> list[str | None]:
    """Per index of `load`: "inv" (the same every iteration), "iv" (the induction variable
    under additions, subtractions and multiplications by loop invariants: exact in 32-bit
    wrapping arithmetic too) or None (neither)."""
    iv = loop.body.args[0]
    made = {op.result: op for op in index_ops}
    memo: dict[o.Value, str | None] = {}

    def kind(v: o.Value) -> str | None:  # "iv": affine in it, "inv": invariant, None
        if v is iv:
            return "iv"
        op = made.get(v)
        if op is None:
            return "inv"  # defined before the loop
        if v not in memo:
            ks = [kind(x) for x in op.operands]
            if None in ks:
                memo[v] = None
            elif all(k == "inv" for k in ks):
                memo[v] = "inv"
            elif (isinstance(op, o.BinaryOp) and op.kind in ("add", "sub")) or (
                isinstance(op, o.BinaryOp) and op.kind == "mul" and "inv" in ks
            ):
                memo[v] = "iv"
            else:
                memo[v] = None
        return memo[v]

    return [kind(v) for v in load.operands]


def _in_body(uses: DefUse, loop: o.ForOp, v: o.Value) -> o.Op | None:
    """The op of the loop body (top level) that defines `v`, if one does."""
    op = uses.producer(v)
    return op if op is not None and uses.enclosing(op) is loop else None


def _index_ops(uses: DefUse, loop: o.ForOp, load: o.LoadOp) -> tuple[o.Op, ...] | None:
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
    return tuple(op for op in loop.body.ops if op in need)


def _place(
    cx: _Planning,
    loop: o.ForOp,
    carried: tuple[tuple[int, o.MmaOp], ...],
    loads: list[StagedLoad],
    mmas: list[o.MmaOp],
    outer: int,
    wgmma: tuple[o.MmaOp, ...] = (),
) -> PipelinePlan:
    """Lay the stages out in shared memory and choose their number."""
    kind, why, loads = _kind(cx, loads)
    stage_bytes = 0
    placed = []
    # wgmma descriptors and TMA's swizzle read absolute address bits: 1024-byte tiles.
    align = max(plan_wgmma.ALIGN if wgmma else 128, TMA_ALIGN if kind == "tma" else 128)
    outer = -(-outer // align) * align  # where allocate_shared puts the ring
    for sl in loads:
        placed.append(replace(sl, tile=replace(sl.tile, offset=stage_bytes)))
        stage_bytes += -(-sl.tile.nbytes // align) * align
    staged = {sl.operand for sl in placed}
    # Operands the mmas store from registers themselves (a padded load, say) each need
    # a tile of their own after the stages.
    reg_bytes = 0
    for mma in mmas:
        for v in mma.operands[:2]:
            if v not in staged and cx.fragments.of(v) is None:  # A fed from fragments
                rows, cols = v.type.shape
                reg_bytes += round_region(rows * cols * v.type.dtype.itemsize())

    max_shared = cx.target.max_shared_bytes

    # The ring starts at `outer` (rounded up above), a TMA ring's mbarriers after it.
    start, extra = outer, BARRIER_BYTES if kind == "tma" else 0

    def need(stages: int) -> int:
        return start + stages * stage_bytes + extra + reg_bytes

    explicit = cx.kernel.stages
    if explicit is not None:
        stages = explicit
        if need(stages) > max_shared:
            tiles = ", ".join(f"{sl.operand.type}" for sl in placed)
            raise LoweringError(
                f"kernel {cx.kernel.name}: stages={stages} needs {need(stages)} bytes of "
                f"shared memory ({stage_bytes} per stage for the operand tiles {tiles}), "
                f"more than the {max_shared} bytes a block may have on this target; use "
                "fewer stages or smaller tiles",
                loop.span,
            )
    else:
        stages = max(
            (s for s in range(1, DEFAULT_STAGES + 1) if need(s) <= SHARED_LIMIT),
            default=1,
        )
        if need(stages) > max_shared:
            raise LoweringError(
                f"kernel {cx.kernel.name}: the operand tiles of its mma loop need "
                f"{need(stages)} bytes of shared memory, more than the {max_shared} bytes "
                "a block may have on this target; use smaller tiles",
                loop.span,
            )
    resident: list[tuple[o.Value, int, SharedTile]] = []
    for mma in mmas:
        for which, v in enumerate(mma.operands[:2]):
            if v in staged or cx.fragments.of(v) is not None or _in_loop(cx.uses, loop, v):
                continue
            if any(v is r and which == w for r, w, _ in resident):
                continue
            rows, cols = v.type.shape
            dt = v.type.dtype
            # Oriented as the mma stores operands from registers: B of tf32 transposed.
            if which == 1 and dt is f32:
                rows, cols = cols, rows
            resident.append((v, which, SharedTile(0, rows, cols, dt.itemsize(), True)))
    # Only loops that carry nothing but mma accumulators (GEMM K loops): a body with more
    # state (flash attention's row max and sum, its scores) copied S times runs out of
    # registers (255 and spills at 64x64 tiles on sm_80, measured).
    gemm_only = len(carried) == len(loop.body.args) - 1
    unroll = stages if placed and kind == "cp.async" and not wgmma and stages > 1 else 1
    unroll = unroll if gemm_only else 1
    ahead_why = (
        _why_not_ahead(cx, placed, mmas, unroll, kind, stages) if placed and not wgmma else ""
    )
    return PipelinePlan(
        loop,
        tuple(mmas),
        carried,
        tuple(placed),
        stages,
        stage_bytes,
        tuple(resident),
        wgmma,
        kind,
        why,
        unroll=unroll,
        ahead=bool(placed) and not wgmma and not ahead_why,
        ahead_why=ahead_why,
    )


#: Registers a thread may hold (sm_80, sm_90), and those `_why_not_ahead` leaves for
#: addresses, indices and loop control past the accumulators and two k steps of fragments.
MAX_REGISTERS = 255
ADDRESS_REGISTERS = 48


def _why_not_ahead(
    cx: _Planning,
    loads: list[StagedLoad],
    mmas: list[o.MmaOp],
    unroll: int,
    kind: str,
    stages: int,
) -> str:
    """Why an mma.sync pipeline keeps loading each k step's fragments just before its
    mmas, "" if they can be loaded a step ahead: one mma in the body, both operands staged,
    the loop unrolled per stage (the turn to the next stage is made in the body copy before
    it), and the accumulators and two k steps of fragments leaving `ADDRESS_REGISTERS` of
    what a thread may hold (`MAX_REGISTERS`, fewer in blocks of more than 256 threads: the
    target's register file over the block's threads). A 64x64 warp tile holds 128
    accumulator registers and 32 per k step (m16n8k16 and m16n8k8 alike): every library
    candidate fits, measured without spills (nvJitLink, sm_80 and sm_90, f16 and tf32, B as
    (K, N) and (N, K)); a larger warp tile keeps today's order."""
    if unroll == 1:
        if kind == "tma":
            return "a TMA ring (its loop is not unrolled per stage)"
        if stages == 1:
            return "one stage"
        return "the loop carries more than mma accumulators (it is not unrolled per stage)"
    if len(mmas) != 1:
        return f"{len(mmas)} mmas in the loop body"
    (mma,) = mmas
    staged = {sl.operand: sl for sl in loads}
    if any(v not in staged for v in mma.operands[:2]):
        return "an mma operand is not staged"
    a, b, _ = mma.operands
    m, n = a.type.shape[0], b.type.shape[1]
    threads = cx.layouts.threads
    grid = cx.fragments.grids.get(mma) or warp_grid(threads // WARP, m // 16, n // 8)
    acc = 4 * grid.sm * grid.sn
    per_step = 4 * grid.sm + 2 * grid.sn
    # A block's threads share the register file: past 256 threads a thread gets fewer than
    # MAX_REGISTERS, or the block cannot launch at all.
    budget = min(MAX_REGISTERS, cx.target.max_registers_per_block // threads)
    if acc + 2 * per_step + ADDRESS_REGISTERS > budget:
        limit = "" if budget == MAX_REGISTERS else f" (a block of {threads} threads)"
        return (
            f"{acc} accumulator and 2 x {per_step} fragment registers per thread leave fewer "
            f"than {ADDRESS_REGISTERS} of {budget}{limit} for addresses (it would spill)"
        )
    return ""


def _kind(cx: _Planning, loads: list[StagedLoad]) -> tuple[str, str, list[StagedLoad]]:
    """The pipeline's kind: "tma" where the target has it and a staged tile can be a TMA box
    whose swizzle matches the tile's (`plan_tma`; those loads marked, with their swizzle),
    else "cp.async"; and why the other tiles are cp.async."""
    if not cx.target.tma:
        return "cp.async", "", loads
    out, why = [], []
    for sl in loads:
        param = cx.kernel.params[sl.load.param]
        assert isinstance(param, o.TensorParam)
        swizzle = tma_swizzle(param, sl.load, sl.tile)
        if isinstance(swizzle, str):
            why.append(swizzle)
            out.append(sl)
        else:
            # A box's coordinates are a few scalar ops: recomputed, not advanced.
            out.append(replace(sl, tma=True, swizzle=swizzle, affine=False))
    kind = "tma" if any(sl.tma for sl in out) else "cp.async"
    return kind, "; ".join(why), out


def _in_loop(uses: DefUse, loop: o.ForOp, v: o.Value) -> bool:
    """Whether `v` is defined inside `loop` (its body, at any depth, or its arguments)."""
    if v in loop.body.args:
        return True
    op = uses.producer(v)
    while op is not None:
        if op is loop:
            return True
        op = uses.enclosing(op)
    return False
