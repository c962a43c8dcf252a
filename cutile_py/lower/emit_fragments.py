"""Ops on values held in mma fragment layouts (`assign_fragments`): broadcasts of row and
column vectors into an accumulator tile, row reductions (in-thread, then two quad
shuffles), reshapes between (M,) and (M, 1), iota along rows or columns, and the
conversions where a loop's carried values enter and leave fragment form. Element-wise ops
run on fragment registers through the emitter's generic element-wise path.

Register order: an `acc` value holds 4 registers per (M slot i, N slot j) at 4 (i sn + j) + e,
e = 0..3 for (row g, col 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1); a `rows` value 2 per
M slot at 2 i + h (row g + 8 h); a `cols` value 2 per N slot at 2 j + c (column 2t + c).
"""

from __future__ import annotations

from cutile_py.ir import ops as o
from cutile_py.lower import emit_mma, emit_shared
from cutile_py.lower.assign_fragments import Fragment
from cutile_py.lower.context import EmitContext
from cutile_py.lower.errors import LoweringError
from cutile_py.lower.fragments import Setup
from cutile_py.lower.layout import Layout
from cutile_py.ptx.builder import Addr, Reg


def frag_of(em: EmitContext, v: o.Value) -> Fragment:
    frag = em.fragment_plan.of(v)
    assert frag is not None, v
    return frag


def setup_of(em: EmitContext, frag: Fragment) -> Setup:
    return emit_mma.setup(em, frag.mma)


# -- ops ----------------------------------------------------------------------------------
def broadcast(em: EmitContext, op: o.Op) -> None:
    """A scalar, a row vector (M, 1) or a column vector (1, N) over an (M, N) tile: each
    register of the tile names the vector register of its row or column."""
    (x,) = op.operands
    frag = frag_of(em, op.result)
    xs = em.regs(x)
    if not x.type.shape:
        em.define(op.result, xs * frag.count())
        return
    src = frag_of(em, x)
    if src.kind == "acc":
        em.define(op.result, xs)
        return
    sn = frag.grid.sn
    out = []
    for i in range(frag.grid.sm):
        for j in range(sn):
            for e in range(4):
                out.append(xs[2 * i + e // 2] if src.kind == "rows" else xs[2 * j + e % 2])
    em.define(op.result, out)


def reshape(em: EmitContext, op: o.Op) -> None:
    """(M,) <-> (M, 1) and (N,) <-> (1, N): the same registers."""
    (x,) = op.operands
    frag = frag_of(em, op.result)
    xs = em.regs(x)
    em.define(op.result, xs if x.type.shape else xs * frag.count())


def iota(em: EmitContext, op: o.Op) -> None:
    """0 .. n-1 along the rows (16 per M slot: g, g + 8) or columns (8 per N slot: 2t,
    2t + 1) this thread holds."""
    frag = frag_of(em, op.result)
    s = setup_of(em, frag)
    fb = em.fb
    rows = frag.kind == "rows"
    slots, size, lane = (s.slots_m, 16, s.lane.g) if rows else (s.slots_n, 8, s.lane.t)
    firsts: dict[str, Reg] = {}
    out = []
    for sl in slots:
        if sl.reg.name not in firsts:
            r = fb.reg("b32")
            if rows:
                fb.ins("mad.lo.u32", r, sl.reg, size, lane)
            else:
                t2 = fb.reg("b32")
                fb.ins("shl.b32", t2, lane, 1)
                fb.ins("mad.lo.u32", r, sl.reg, size, t2)
            firsts[sl.reg.name] = r
        for k in range(2):
            x = fb.reg("b32")
            fb.ins("add.u32", x, firsts[sl.reg.name], sl.static * size + (8 * k if rows else k))
            out.append(x)
    em.define(op.result, out)


def reduce(em: EmitContext, op: o.ReduceOp) -> None:
    """Along each row of an accumulator tile: over the thread's registers of that row, then
    over the quad's 4 lanes (which together hold the row's columns of each fragment; one
    warp holds all of a row's fragments: wn = 1)."""
    (x,) = op.operands
    src = frag_of(em, x)
    assert src.grid.wn == 1, src
    cb = emit_shared.Combiner(em, op.kind, x.type.dtype)
    xs = em.regs(x)
    sn = src.grid.sn
    out = []
    for i in range(src.grid.sm):
        for h in range(2):
            acc: Reg | None = None
            for j in range(sn):
                for c in range(2):
                    v = cb.lift(xs[4 * (i * sn + j) + 2 * h + c])
                    acc = v if acc is None else cb.combine(acc, v)
            assert acc is not None
            for lanes in (1, 2):
                acc = cb.combine(acc, emit_shared.shuffle(em, acc, lanes))
            out.append(emit_shared.finish(em, acc, x.type.dtype, cb))
    em.define(op.result, out)


# -- entering and leaving fragment form (a loop's carried values) ---------------------------
def enter(em: EmitContext, frag: Fragment, init: o.Value) -> list[Reg]:
    """A carried value's initial value in fragment form."""
    if frag.kind == "acc":
        frags = emit_mma.acc_fragments(em, frag.mma, init)
        return [x for row in frags for c in row for x in c]
    op = em.uses.producer(init)
    if not isinstance(op, o.BroadcastOp) or op.operands[0].type.shape:
        raise LoweringError("a carried vector enters fragments only as a broadcast scalar")
    return em.regs(op.operands[0]) * frag.count()


def leave(em: EmitContext, frag: Fragment, arg: o.Value, result: o.Value) -> list[Reg]:
    """A carried value's registers after the loop, in the result's blocked layout."""
    s = setup_of(em, frag)
    if frag.kind == "acc":
        frags = emit_mma.acc_fragments(em, frag.mma, arg)
        return emit_mma.fragments_to_blocked(em, s, frags, em.layout(result), frag.mma)
    return _rows_to_blocked(em, s, em.regs(arg), em.layout(result), result)


def _rows_to_blocked(
    em: EmitContext, s: Setup, regs: list[Reg], lay: Layout, result: o.Value
) -> list[Reg]:
    """A row vector through shared memory: lane t = 0 of each quad writes its rows g, g + 8
    of each real M slot (warps along N hold copies: wn = 1 here), then every thread reads
    its elements of the blocked layout."""
    fb = em.fb
    m = result.type.shape[0]
    smem = em.shared_scratch(4 * m)
    em.barrier()
    lead = fb.reg("pred")
    fb.ins("setp.eq.u32", lead, s.lane.t, 0)
    for i, sl in enumerate(s.slots_m):
        row = fb.reg("b32")
        fb.ins("mad.lo.u32", row, sl.reg, 16, s.lane.g)
        addr = fb.reg("b32")
        fb.ins("mad.lo.u32", addr, row, 4, smem)
        pred = em.conj(lead, sl.valid)
        for h in range(2):
            imm = 4 * (16 * sl.static + 8 * h)
            fb.ins("st.shared.b32", Addr(addr, imm), regs[2 * i + h], pred=pred)
    em.barrier()
    out = emit_shared.load_row_major(em, smem, lay, result.type)
    em.barrier()
    return out
