"""The emission context every `emit_*` module works on: the kernel, its layouts, the function
being built, the registers of each IR value, per-thread coordinates and predicates, the shared
scratch space and the barrier. It imports no emitter, so every emitter can import it."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import DType, bf16, f32
from cutile_py.ir.uses import DefUse
from cutile_py.lower.allocate_shared import SharedPlan, no_shared
from cutile_py.lower.assign_fragments import FragmentPlan, no_fragments
from cutile_py.lower.errors import LoweringError
from cutile_py.lower.fragments import Ahead, Operand, Setup, SharedTile
from cutile_py.lower.isel import FLOAT_NAME, REG_CLASS
from cutile_py.lower.layout import Blocked, Layout, LayoutPlan
from cutile_py.lower.plan_persistent import Persistence
from cutile_py.lower.plan_pipelines import PipelinePlan
from cutile_py.lower.plan_store import TmaStore
from cutile_py.ptx.builder import FunctionBuilder, Imm, Reg
from cutile_py.ptx.target import Target

#: Threads per warp.
WARP = 32
#: The named barrier of the consumer warps of a warp-specialized kernel (`EmitContext.barrier`).
CONSUMERS_BARRIER = 1

__all__ = [
    "CONSUMERS_BARRIER",
    "WARP",
    "BaseRegs",
    "EmitContext",
    "KeptRing",
    "LoweringError",
    "TensorRegs",
]


@dataclass
class TensorRegs:
    base: Reg  # global address of element 0
    dims: list[Reg]  # run-time dims (u32)


@dataclass
class BaseRegs:
    """Per-thread registers of one blocked base, computed once in the preamble."""

    coord: list[Reg]  # per base dim: this thread's first element along it (u32)
    guards: dict[tuple[int, int], Reg]  # (dim, static offset) → element lies inside the dim
    owners: dict[tuple[int, ...], Reg | None]  # replicated dims → this thread owns the copy
    #: (dim, guarded static offset) → min(offset, the dim's last index - coordinate) (s32):
    #: the farthest of this thread's elements up to that offset that lies inside the tile
    #: (`emit_memory.Access.all_inside`).
    ends: dict[tuple[int, int], Reg] = field(default_factory=dict)


@dataclass
class KeptRing:
    """The consumers' side of a warp-specialized ring set up once per block (`emit_tma`):
    the threads that init and arrive, the stage read next with its full barrier, the full
    barrier of the stage read last, and the parity awaited (carried across a persistent
    kernel's tiles)."""

    loop: o.ForOp
    leader: Reg
    lane0: Reg
    read: Reg
    bar_read: Reg
    bar_prev: Reg
    phase: Reg


def _no_dispatch(op: o.Op) -> None:
    raise LoweringError(f"no emitter is attached to emit {op.opname}")


@dataclass
class EmitContext:
    kernel: o.Kernel
    plan: LayoutPlan
    fb: FunctionBuilder
    target: Target
    #: Who defines and uses each value (built once per kernel).
    uses: DefUse
    #: The pipeline planned for each loop with an mma in its body.
    pipelines: Mapping[o.ForOp, PipelinePlan] = field(default_factory=dict)
    #: Values held in mma fragment layouts, and the warp split of their families' mmas.
    fragment_plan: FragmentPlan = field(default_factory=no_fragments)
    #: Where the long-lived shared buffers (rings, resident operand tiles) lie.
    shared: SharedPlan = field(default_factory=no_shared)
    values: MutableMapping[o.Value, list[Reg]] = field(default_factory=dict)
    tensors: dict[int, TensorRegs] = field(default_factory=dict)
    bases: dict[Blocked, BaseRegs] = field(default_factory=dict)
    tid: Reg | None = None
    smem: Reg | None = None  # shared address of `smem` (u32)
    #: The block's tile index per grid axis where the kernel remaps it (`group_m`), computed
    #: in the preamble; empty: the tile index is `%ctaid`.
    block_ids: list[Reg] = field(default_factory=list)
    #: Instruction families used that need more than the target's base PTX version.
    features: set[str] = field(default_factory=set)
    #: Emits one IR op where it stands (the emitter's dispatch; a pipeline emits a load's
    #: index ops again for a later iteration through it).
    emit_op: Callable[[o.Op], None] = _no_dispatch
    # -- tensor cores (emit_mma, emit_pipeline) --
    #: Per mma op, its fragment addressing.
    mma_setups: dict[o.MmaOp, Setup] = field(default_factory=dict)
    #: Values held as mma accumulator fragments (`acc` values of `fragment_plan`).
    fragment_values: set[o.Value] = field(default_factory=set)
    #: mma operand value → (its shared tile, whether its rows run along K, register
    #: with the byte offset of the pipeline stage being read): operands a cp.async pipeline
    #: loads.
    staged: dict[o.Value, tuple[SharedTile, bool, Reg]] = field(default_factory=dict)
    #: (staged operand, 0 for A or 1 for B) → its fragment addressing, computed before the
    #: loop, bound per iteration to the stage read (`fragments.Bindable`).
    staged_readers: dict[
        tuple[o.Value, int], Callable[[Reg | None], Callable[[int], list[list[Reg]]]]
    ] = field(default_factory=dict)
    #: mma → its first k step's fragments, loaded ahead across the pipeline's barrier.
    ahead: dict[o.MmaOp, Ahead] = field(default_factory=dict)
    #: (mma operand, 0 for A or 1 for B) → its tile, stored once before the loop.
    resident: dict[tuple[o.Value, int], Operand] = field(default_factory=dict)
    #: Bytes at the start of shared memory a pipeline keeps in flight while its loop body is
    #: emitted, and the address past them (None: `smem`): a scratch buffer planned there is
    #: addressed with no instruction (`shared_scratch`).
    scratch_floor: int = 0
    scratch: Reg | None = None
    #: The op (and moment of a loop) whose planned scratch buffer `shared_scratch` gives.
    scratch_user: tuple[o.Op, str] | None = None
    #: The most bytes emission addressed in each planned scratch buffer (what tests compare
    #: with the plan).
    scratch_used: dict[tuple[o.Op, str], int] = field(default_factory=dict)
    #: Ops not emitted where they stand (loads a pipeline issues ahead instead).
    skipped: set[o.Op] = field(default_factory=set)
    #: Loads emitted without writing their padding (the plan's `unpadded`).
    unpadded: frozenset[o.LoadOp] = frozenset()
    #: Loops around the op being emitted (a load in a loop splits off its edge tiles).
    loop_depth: int = 0
    #: 16-bit registers split from a loaded b32 pair: (the pair, 0 low or 1 high half). A
    #: bf16 half widens from the pair with one shift or mask (`widen`).
    halves: dict[Reg, tuple[Reg, int]] = field(default_factory=dict)
    #: A TMA pipeline's load or a TMA store → the generic address of its tensor map (a
    #: kernel parameter).
    tensor_maps: dict[o.LoadOp | o.StoreOp, Reg] = field(default_factory=dict)
    #: Stores carried out as TMA epilogues (`plan_store`).
    tma_stores: Mapping[o.StoreOp, TmaStore] = field(default_factory=dict)
    #: Threads of the consumer warps of a warp-specialized kernel (0: not specialized): the
    #: block's barrier is then named barrier 1 over them, the producer warps being elsewhere.
    consumers: int = 0
    #: Code placed after the body's `ret` (a warp-specialized loop's producer: `emit_tma`).
    tails: list[Callable[[], None]] = field(default_factory=list)
    # -- a persistent kernel (`emit_persistent`) --
    persistent: Persistence | None = None
    #: The logical grid's sizes (x, y, z) and its tiles, read from parameters.
    logical_grid: list[Reg] = field(default_factory=list)
    tiles: Reg | None = None
    #: The consumers' state of the warp-specialized ring kept across tiles, set up once
    #: (None: none is kept).
    kept_ring: KeptRing | None = None

    def __post_init__(self) -> None:
        self.fragment_values.update(
            v for v, f in self.fragment_plan.values.items() if f.kind == "acc"
        )

    @property
    def max_shared(self) -> int:
        """Shared memory per block the target allows (dynamic shared memory past 48 KiB)."""
        return self.target.max_shared_bytes

    def block_index(self, axis: int) -> Reg | str:
        """The index of the tile this block owns along grid `axis` (a `mov` source)."""
        return self.block_ids[axis] if self.block_ids else f"%ctaid.{'xyz'[axis]}"

    # -- registers ------------------------------------------------------------------------
    def regs(self, v: o.Value) -> list[Reg]:
        return self.values[v]

    def define(self, v: o.Value, regs: list[Reg]) -> None:
        self.values[v] = regs

    @contextmanager
    def scope(self, bindings: Mapping[o.Value, list[Reg]]) -> Iterator[None]:
        """Emit with `bindings` over the current registers; what is defined inside is
        forgotten at the end (ops emitted once more, for another loop iteration)."""
        outer = self.values
        self.values = ChainMap(dict(bindings), outer)
        try:
            yield
        finally:
            self.values = outer

    def new(self, dtype: type[DType]) -> Reg:
        return self.fb.reg(REG_CLASS[dtype])

    def layout(self, v: o.Value) -> Layout:
        return self.plan.of(v)

    def count(self, v: o.Value) -> int:
        return self.layout(v).count() if v.type.shape else 1

    def widen(self, x: Reg, dt: type[DType]) -> Reg:
        """A 16-bit float as f32 (exact)."""
        if dt is f32:
            return x
        r = self.fb.reg("f32")
        pair = self.halves.get(x) if dt is bf16 else None
        if pair is not None:
            # A bf16 is the high half of its f32: the low half of the pair shifted up, or
            # the high half masked (sm_90 SASS: one instruction, where unpacking the half
            # and converting it took two).
            w, high = pair
            bits = self.fb.reg("b32")
            if high:
                self.fb.ins("and.b32", bits, w, Imm("0xFFFF0000"))
            else:
                self.fb.ins("shl.b32", bits, w, 16)
            self.fb.ins("mov.b32", r, bits)
            return r
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

    # -- thread coordinates and predicates ------------------------------------------------
    def base_regs(self, b: Blocked) -> BaseRegs:
        """Thread coordinates and edge guards of base `b` (in the preamble, so that every
        later use, in any branch or loop, sees them defined)."""
        if b in self.bases:
            return self.bases[b]
        fb, tid = self.fb, self.tid
        assert tid is not None
        coord: list[Reg] = []
        for d in range(b.rank):
            c = fb.reg("b32")
            if b.threads[d] == 1:
                fb.ins("mov.u32", c, 0)
            else:
                fb.ins("shr.u32", c, tid, b.stride(d).bit_length() - 1)
                fb.ins("and.b32", c, c, b.threads[d] - 1)
                if b.unit(d) > 1:
                    fb.ins("shl.b32", c, c, b.unit(d).bit_length() - 1)
            coord.append(c)
        guards: dict[tuple[int, int], Reg] = {}
        ends: dict[tuple[int, int], Reg] = {}
        for d in range(b.rank):
            last: Reg | None = None
            for off in b.offsets(d):
                if b.guarded(d, off):
                    g = fb.reg("pred")
                    fb.ins("setp.lt.u32", g, coord[d], b.shape[d] - off)
                    guards[(d, off)] = g
                    if last is None:
                        last = fb.reg("b32")
                        fb.ins("sub.s32", last, b.shape[d] - 1, coord[d])
                    e = fb.reg("b32")
                    fb.ins("min.s32", e, last, off)
                    ends[(d, off)] = e
        regs = BaseRegs(coord, guards, {}, ends)
        self.bases[b] = regs
        return regs

    def owner(self, lay: Layout) -> Reg | None:
        """True in the one thread that holds each element of a replicated layout (stores and
        shared-memory writes happen once per element)."""
        br = self.base_regs(lay.base)
        key = lay.replicated
        if key in br.owners:
            return br.owners[key]
        fb, tid = self.fb, self.tid
        assert tid is not None
        pred: Reg | None = None
        terms: list[Reg] = []
        for d in key:
            if lay.base.threads[d] > 1:
                t = fb.reg("pred")
                fb.ins("setp.eq.u32", t, br.coord[d], 0)
                terms.append(t)
        if lay.base.used < lay.base.block:
            t = fb.reg("pred")
            fb.ins("setp.lt.u32", t, tid, lay.base.used)
            terms.append(t)
        for t in terms:
            pred = t if pred is None else self.and_(pred, t)
        br.owners[key] = pred
        return pred

    def valid(self, lay: Layout, offsets: dict[int, int]) -> Reg | None:
        """The element at `offsets` lies inside the tile (None: always)."""
        br = self.bases[lay.base]
        pred: Reg | None = None
        for d, off in offsets.items():
            g = br.guards.get((d, off))
            if g is not None:
                pred = g if pred is None else self.and_(pred, g)
        return pred

    def and_(self, a: Reg, b: Reg) -> Reg:
        r = self.fb.reg("pred")
        self.fb.ins("and.pred", r, a, b)
        return r

    def conj(self, a: Reg | None, b: Reg | None) -> Reg | None:
        """`a and b` where None stands for an always-true predicate."""
        if a is None:
            return b
        if b is None:
            return a
        return self.and_(a, b)

    # -- shared memory --------------------------------------------------------------------
    def shared_scratch(self, nbytes: int) -> Reg:
        """The address of the scratch buffer `allocate_shared` planned for the op being
        emitted (`scratch_user`); `nbytes`, what the caller addresses, must fit it."""
        assert self.smem is not None
        buf = self.shared.scratch.get(self.scratch_user) if self.scratch_user else None
        if buf is None or nbytes > buf.nbytes:
            op, moment = self.scratch_user or (None, "")
            raise LoweringError(
                f"kernel {self.kernel.name}: {op.opname if op else 'code outside any op'}"
                f"{f' ({moment})' if moment else ''} addresses {nbytes} bytes of shared "
                f"scratch, but allocate_shared planned {buf.nbytes if buf else 0} "
                "(size_scratch disagrees with the emitter)"
            )
        key = (buf.op, buf.moment)
        self.scratch_used[key] = max(self.scratch_used.get(key, 0), nbytes)
        if buf.offset == self.scratch_floor:  # the address is at hand (in a pipelined body)
            return self.scratch if self.scratch is not None else self.smem
        at = self.fb.reg("b32")
        self.fb.ins("add.u32", at, self.smem, buf.offset)
        return at

    @contextmanager
    def scratch_for(self, op: o.Op, moment: str = "") -> Iterator[None]:
        """Emit with `op`'s planned scratch buffer (at `moment` of a loop) at hand."""
        outer = self.scratch_user
        self.scratch_user = (op, moment)
        try:
            yield
        finally:
            self.scratch_user = outer

    def barrier(self) -> None:
        """Every thread of the block waits here (shared memory written before is visible)."""
        if self.consumers:
            self.fb.ins("bar.sync", CONSUMERS_BARRIER, self.consumers)
        else:
            self.fb.ins("bar.sync", 0)
