"""The lowering plan: every decision made before emission, as one frozen, printable value.

`plan_lowering` runs the planning passes in order: `assign_layouts` (which thread holds which
element of each value: blocked layouts, then mma fragments) first, because `plan_pipelines`
splits its cp.async copies over the block that layouts chose and leaves fragment operands out;
then `allocate_shared` places the pipelines' buffers and every op's scratch. Emission then
carries the plan out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from cutile_py.ir import ops as o
from cutile_py.ir.printer import value_names
from cutile_py.ir.uses import DefUse, walk
from cutile_py.lower import plan_tma, plan_wgmma
from cutile_py.lower.allocate_shared import SharedPlan, allocate_shared
from cutile_py.lower.assign_fragments import (
    FragmentPlan,
    assign_fragments,
    family_threads,
    find_families,
)
from cutile_py.lower.layout import Blocked, Layout, LayoutPlan, plan_layouts
from cutile_py.lower.plan_padding import unpadded_loads
from cutile_py.lower.plan_persistent import Persistence, defer_store_waits, plan_persistent
from cutile_py.lower.plan_pipelines import PipelinePlan, StagedLoad, plan_pipelines
from cutile_py.lower.plan_store import StorePlan, no_stores, plan_stores, with_chains
from cutile_py.ptx.target import Target


@dataclass(frozen=True)
class LoweringPlan:
    target: Target
    layouts: LayoutPlan
    #: The pipeline of each loop with an mma in its body.
    pipelines: Mapping[o.ForOp, PipelinePlan]
    #: Values held in mma fragment layouts instead of their blocked ones.
    fragment_plan: FragmentPlan
    #: Where the pipelines' rings and resident operand tiles lie, and for how long.
    shared: SharedPlan
    #: How a persistent kernel walks its tiles (None: one block per tile).
    persistent: Persistence | None = None
    #: Loads whose padding no store can observe: emitted without writing it (`plan_padding`).
    unpadded: frozenset[o.LoadOp] = frozenset()
    #: Stores of loop accumulators carried out as TMA epilogues, and why the others are not.
    stores: StorePlan = field(default_factory=no_stores)

    @property
    def block_threads(self) -> int:
        """Threads per block: the layouts', and a warp-specialized loop's producer."""
        ws = [p.ws for p in self.pipelines.values() if p.ws is not None]
        return ws[0].threads if ws else self.layouts.threads

    @property
    def fragments(self) -> frozenset[o.Value]:
        """Values held in mma fragments (accumulators, row and column vectors), not blocked."""
        return frozenset(self.fragment_plan.values)


def assign_layouts(
    kernel: o.Kernel, target: Target, uses: DefUse
) -> tuple[LayoutPlan, FragmentPlan]:
    """Which thread holds which element of each value: blocked layouts for every value, then
    mma fragment layouts for the values of mma loops that can stay in fragments (whose row
    bands may cap the block's size first: a warp per band)."""
    families = find_families(kernel, target, uses)
    layouts = plan_layouts(kernel, target, family_threads(families))
    return layouts, assign_fragments(kernel, target, uses, layouts.threads, families)


def plan_lowering(kernel: o.Kernel, target: Target, uses: DefUse) -> LoweringPlan:
    """Run the planning passes over a verified kernel."""
    layouts, fragments = assign_layouts(kernel, target, uses)
    stores = plan_stores(kernel, target, uses, fragments)
    fragments = with_chains(fragments, stores)  # a TMA store's value stays in fragments
    pipelines = plan_pipelines(kernel, layouts, target, uses, fragments)
    persist = plan_persistent(kernel, pipelines)
    kept = persist.kept if persist is not None else None
    if kept is not None:
        shared = allocate_shared(
            kernel, pipelines, layouts, fragments, uses, target, stores.tma, kept=kept, check=False
        )
        if shared.total > target.max_shared_bytes:
            # The ring kept across tiles leaves too little for the scratch past it: the ring
            # is set up per tile instead, the scratch over it.
            persist = plan_persistent(kernel, pipelines, (shared.total, target.max_shared_bytes))
            kept = None
    if kept is None:
        shared = allocate_shared(kernel, pipelines, layouts, fragments, uses, target, stores.tma)
    if persist is not None:
        persist = defer_store_waits(persist, stores, shared)
    return LoweringPlan(
        target, layouts, MappingProxyType(pipelines), fragments, shared,
        persistent=persist, unpadded=unpadded_loads(kernel, uses), stores=stores,
    )  # fmt: skip


def format_plan(kernel: o.Kernel, plan: LoweringPlan) -> str:
    """The plan as text, naming values as `print_kernel` does (deterministic: golden tests
    and `CUTILE_PY_DUMP` show it)."""
    names = value_names(kernel)
    bases: dict[Blocked, str] = {}
    ops = list(walk(kernel.body))
    values = [v for op in ops for r in op.regions() for v in r.args]
    values += [v for op in ops for v in op.results]
    tiles = sorted(
        (v for v in values if v.type.shape and v in plan.layouts.layouts),
        key=lambda v: int(names[v][1:]),
    )

    def base(b: Blocked) -> str:
        if b not in bases:
            bases[b] = f"B{len(bases)}"
        return bases[b]

    def lay(x: Layout) -> str:
        return f"{base(x.base)} dims={_dims(x.dims)}"

    def op_name(op: o.Op) -> str:
        if op.results:
            return f"{op.opname} {names[op.results[0]]}"
        return f"{op.opname}[{op.attrs()}] " + ", ".join(names[v] for v in op.operands)

    def held(v: o.Value) -> str:
        frag = plan.fragment_plan.of(v)
        return frag.describe() if frag is not None else lay(plan.layouts.of(v))

    body = [f"  {names[v]} {v.type}: {held(v)}" for v in tiles]
    memory = [f"  {op_name(op)}: {lay(m)}" for op, m in plan.layouts.memory.items()]

    def loop_name(loop: o.ForOp) -> str:
        return names[loop.results[0]] if loop.results else names[loop.body.args[0]]

    pipes: list[str] = []
    threads = plan.layouts.threads
    for p in plan.pipelines.values():
        loop = loop_name(p.loop)
        kind = " tma" if p.kind == "tma" else ""  # cp.async: as before
        unroll = f" unroll={p.unroll}" if p.unroll > 1 else ""
        pipes.append(f"  for {loop}:{kind} stages={p.stages} stage_bytes={p.stage_bytes}{unroll}")
        if p.why:
            pipes.append(f"    cp.async, not tma: {p.why}")
        if p.ahead:
            pipes.append("    fragments a k step ahead, across the barrier to the next stage")
        elif p.ahead_why:
            pipes.append(f"    fragments loaded per k step: {p.ahead_why}")
        if p.kind == "tma":
            per = "full and empty per stage" if p.ws else "one per stage"
            pipes.append(f"    mbarriers at +{p.stages * p.stage_bytes} ({per})")
        if p.ws is not None:
            pipes.append(f"    {p.ws.describe()}")
            again = ", ".join(op_name(op) for op in p.ws.producer_ops) or "none"
            pipes.append(f"    producer computes again: {again}")
        elif p.ws_why:
            pipes.append(f"    not warp specialized: {p.ws_why}")
        if p.in_flight and p.ws is not None:
            pipes.append(
                f"    wgmma: {p.in_flight} group in flight per iteration, accumulating in place; "
                "a stage is handed back (empty) once the wgmma reading it retires"
            )
        elif p.in_flight:
            pipes.append(
                f"    wgmma: {p.in_flight} group in flight per iteration, accumulating in place; "
                "a stage is refilled a barrier after the wgmma reading it retires"
            )
        pipes += [
            f"    carried {names[p.loop.body.args[k + 1]]}: fragments of mma {names[m.result]}"
            for k, m in p.carried
        ]
        pipes += [f"    {_staged(sl, names, lay)}" for sl in p.loads]
        held_in = {sl.operand: (sl.tile, sl.k_rows) for sl in p.loads}
        pipes += [
            f"    mma {names[m.result]}: "
            + plan_wgmma.describe(m, (held_in[m.operands[0]], held_in[m.operands[1]]), threads)
            for m in p.wgmma
        ]
    lines = [
        f"plan of kernel {kernel.name} for {plan.target.describe()}",
        f"threads {plan.layouts.threads}",
        "layouts:",
        *body,
    ]
    if memory:
        lines += ["memory access layouts:", *memory]
    unpadded = [names[op.result] for op in ops if op in plan.unpadded]
    if unpadded:
        lines += ["loads writing no padding (used only by stores inside their edge): "
                  + ", ".join(unpadded)]  # fmt: skip
    if pipes:
        lines += ["pipelines:", *pipes]
    if plan.persistent is not None:
        kept = plan.persistent.kept
        lines += plan.persistent.describe(loop_name(kept) if kept is not None else "")
    deferred = plan.persistent.deferred if plan.persistent is not None else frozenset()
    stores = [
        f"  {op_name(t.store)}: {t.describe()}"
        + (
            "; its staging read waited for at the next tile's epilogue"
            if t.store in deferred
            else ""
        )
        for t in plan.stores.tma.values()
    ]
    stores += [f"  {op_name(op)}: plain stores, not tma: {w}" for op, w in plan.stores.why.items()]
    if stores:
        lines += ["stores:", *stores]
    shared = []
    for r in plan.shared.regions:
        what = "ring" if r.value is None else f"{names[r.value]} ({'AB'[r.which]} operand)"
        span = f"[{r.offset}, {r.offset + r.nbytes})"
        first, last = plan.shared.live(r)
        when = f"while for {loop_name(r.loop)} runs (steps {first}-{last})"
        if plan.persistent is not None and plan.persistent.kept is r.loop:
            when = "across tiles, the whole kernel"
        shared.append(f"  {what}: {span} {when}")
    for b in plan.shared.scratch.values():
        span = f"[{b.offset}, {b.offset + b.nbytes})"
        user = _scratch_user(b.op, b.moment, names, loop_name)
        shared.append(f"  {b.what} of {user}: {span} at step {b.step} (while it runs)")
    if shared:
        lines += ["shared memory:", *shared, f"  total {plan.shared.total} bytes"]
    lines += ["bases:"] + [
        f"  {n} = blocked shape={b.shape} vec={b.vec} threads={b.threads}" for b, n in bases.items()
    ]
    return "\n".join(lines) + "\n"


def _scratch_user(
    op: o.Op, moment: str, names: Mapping[o.Value, str], loop_name: Callable[[o.ForOp], str]
) -> str:
    """The op a scratch buffer serves, named by its result (a loop by its moment)."""
    if isinstance(op, o.ForOp):
        return f"for {loop_name(op)} ({moment})"
    if op.results:
        return f"{op.opname} {names[op.results[0]]}"
    return f"{op.opname} of {', '.join(names.get(v, '?') for v in op.operands)}"


def _dims(dims: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("-" if d is None else str(d) for d in dims) + ")"


def _staged(sl: StagedLoad, names: Mapping[o.Value, str], lay: Callable[[Layout], str]) -> str:
    t = sl.tile
    chain = " -> ".join(op.opname for op in sl.chain)
    index = ", ".join(names[op.result] for op in sl.index_ops) or "none"
    if sl.tma:
        dims = plan_tma.box(sl.load.shape, t)[::-1]
        per = f" per panel, {t.panels} boxes" if t.panels > 1 else ""
        how = f"box {'x'.join(map(str, dims))} swizzle={sl.swizzle}{per}"
    else:
        how = f"copy {lay(sl.copy)}"
    return (
        f"{'tma' if sl.tma else 'cp.async'} {names[sl.operand]} ({chain}): tile "
        f"{t.rows}x{t.cols}x{t.eb}B at +{t.offset} xor_step={t.xor_step} "
        f"rows_along={'K' if sl.k_rows else 'MN'}, {how}, index ops {index}"
        f"{' (affine: advanced)' if sl.affine and not sl.tma else ''}"
        + (f", {t.panels} panels of {t.panel} columns" if t.panels > 1 else "")
    )
