"""`mma` on Hopper's warpgroup tensor cores: `wgmma.mma_async` m64nNk16 (f16, bf16) or
m64nNk8 (tf32), both operands read through matrix descriptors from the stage a cp.async
pipeline filled, the accumulator in registers in the fragment layout of `plan_wgmma`.

Per iteration: `wgmma.fence`; for each 16 (8) of K, each 64-row block of the warpgroup and each
256 columns of N, one `mma_async` with descriptors advanced by constants; `commit_group`;
`wait_group N`, N the plan's groups in flight (`PipelinePlan.in_flight`). With N = 0 every
read of the stage is done (it is refilled after the next barrier), and the accumulator is
copied first, so that `acc` keeps its registers. With N = 1 the wgmma accumulates in place
into the loop's carried registers, which nothing else touches while it runs (the yield's
copy of them to themselves is skipped), and keeps running while the next stage is awaited;
`emit_tma` refills its stage only after the next iteration's `wait_group 1` and a barrier,
and waits for group 0 after the loop. The pipeline puts `fence.proxy.async` between its
cp.async wait and its barrier: cp.async writes through the generic proxy, wgmma reads
through the async one.
"""

from __future__ import annotations

from cutile_py.ir import ops as o
from cutile_py.lower import emit_mma, plan_wgmma
from cutile_py.lower.context import WARP, EmitContext
from cutile_py.lower.fragments import SharedTile, log2
from cutile_py.lower.plan_wgmma import GROUP_WARPS, M_BLOCK, MAX_N, Descriptor
from cutile_py.ptx.builder import Reg, Vec


def planned(em: EmitContext, op: o.MmaOp) -> bool:
    """Whether the plan lowers `op` to wgmma."""
    return any(op in p.wgmma for p in em.pipelines.values())


def in_flight(em: EmitContext, op: o.MmaOp) -> int:
    """The wgmma groups the loop of `op` leaves in flight (0: `op` is waited for at once)."""
    return next(p.in_flight for p in em.pipelines.values() if op in p.wgmma)


def mma(em: EmitContext, op: o.MmaOp) -> None:
    """`acc + a @ b`: with wgmma where the plan says so, else with mma.sync (`emit_mma`)."""
    if not planned(em, op):
        emit_mma.mma(em, op)
        return
    fb = em.fb
    a, b, acc = op.operands
    (m, k), n = a.type.shape, b.type.shape[1]
    s = emit_mma.setup(em, op)
    groups = em.plan.threads // WARP // GROUP_WARPS
    em.features.add("wgmma")
    fb.shared_align = max(fb.shared_align, plan_wgmma.ALIGN)
    fb.comment(f"wgmma {a.type} @ {b.type} + {acc.type}: {groups} warpgroup(s)")
    depth = in_flight(em, op)
    frags = emit_mma.acc_fragments(em, op, acc)
    if not depth:  # wgmma accumulates in place: into copies, so that `acc` keeps its own
        frags = [[[_copy(em, x) for x in c] for c in row] for row in frags]
    (tile_a, fa, desc_a), (tile_b, fb_, desc_b) = (
        _descriptor(em, a, M_BLOCK),
        _descriptor(em, b, MAX_N),
    )
    # Warpgroup g multiplies the m64 blocks g, g + groups, ...: its A rows start 64 g down.
    group, offset = fb.reg("b32"), fb.reg("b64")
    fb.ins("shr.u32", group, s.lane.wm, log2(GROUP_WARPS))
    fb.ins("mul.wide.u32", offset, group, fa.mn_step >> 4)
    fb.ins("add.s64", desc_a, desc_a, offset)
    scale_d = fb.reg("pred")
    fb.ins("setp.eq.u32", scale_d, 0, 0)  # D = A @ B + D: the accumulator is read
    dt = plan_wgmma.ptx_type(a.type.dtype)
    step = plan_wgmma.k_step(a.type.dtype)
    # imm-trans-a, imm-trans-b: 1 where the tile's rows run along K (16-bit types only)
    trans = [] if dt == "tf32" else [int(fa.mn_major), int(fb_.mn_major)]
    fb.ins("wgmma.fence.sync.aligned")
    assert all(sm.valid is None for sm in s.slots_m) and m % (M_BLOCK * groups) == 0
    for ks in range(k // step):
        ka = plan_wgmma.k_offset(tile_a, fa, ks * step)
        kb = plan_wgmma.k_offset(tile_b, fb_, ks * step)
        for si in range(len(s.slots_m)):
            da = _advanced(em, desc_a, ka + si * groups * fa.mn_step)
            for c, n0 in enumerate(range(0, n, MAX_N)):
                width = min(MAX_N, n - n0)
                db = _advanced(em, desc_b, kb + c * fb_.mn_step)
                d = [x for j in range(n0 // 8, (n0 + width) // 8) for x in frags[si][j]]
                fb.ins(
                    f"wgmma.mma_async.sync.aligned.m64n{width}k{step}.f32.{dt}.{dt}",
                    Vec(tuple(d)),
                    da,
                    db,
                    scale_d,
                    1,
                    1,
                    *trans,
                )
    fb.ins("wgmma.commit_group.sync.aligned")
    fb.ins("wgmma.wait_group.sync.aligned", depth)
    assert op.result in em.fragment_values
    em.define(op.result, [x for row in frags for c in row for x in c])


def _copy(em: EmitContext, x: Reg) -> Reg:
    r = em.fb.reg("f32")
    em.fb.ins("mov.f32", r, x)
    return r


def _descriptor(em: EmitContext, v: o.Value, block: int) -> tuple[SharedTile, Descriptor, Reg]:
    """The staged tile of operand `v`, its descriptor layout, and the descriptor of its start
    in the stage this iteration reads (start address >> 4 in bits 0-13, the constant fields
    above)."""
    fb = em.fb
    tile, k_rows, stage = em.staged[v]
    d = plan_wgmma.descriptor(tile, k_rows, block)
    assert em.smem is not None
    addr, lo, desc = fb.reg("b32"), fb.reg("b32"), fb.reg("b64")
    fb.ins("add.u32", addr, em.smem, stage)
    fb.ins("add.u32", addr, addr, tile.offset)
    fb.ins("bfe.u32", lo, addr, 4, 14)
    fb.ins("cvt.u64.u32", desc, lo)
    fb.ins("or.b64", desc, desc, d.high)
    return tile, d, desc


def _advanced(em: EmitContext, desc: Reg, nbytes: int) -> Reg:
    """`desc` with its start address `nbytes` further (a multiple of 16)."""
    if not nbytes:
        return desc
    assert nbytes % 16 == 0
    r = em.fb.reg("b64")
    em.fb.ins("add.s64", r, desc, nbytes >> 4)
    return r
