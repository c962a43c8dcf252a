"""mma.sync reuses fragments it decoded before (A and B feeding several mma, a D read back as
the next C, through movs): a register written in between, or a D written under a guard that
leaves a warp's old values, must be read afresh."""

from __future__ import annotations

import numpy as np

from tests.support.sim_harness import Sim

MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#: Two warps. Per lane: A (4 b32), B (2 b32), C (4 f32) from global memory; then
#: D1 = AB + C, D2 = AB + D1, A' = A with a0 negated, D3 = A'B + D2, C3 = D3 through movs,
#: D4 = A'B + C3 in warp 0 only (warp 1 keeps D3), D5 = A'B + D4; D1, D2, D5 stored.
KERNEL = f"""
.visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 out)
{{
    .reg .b32 %r<8>;
    .reg .f32 %f<25>;
    .reg .b64 %rd<14>;
    .reg .pred %p<2>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u64 %rd4, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd5, %r1, 16;
    add.u64 %rd6, %rd1, %rd5;
    ld.global.v4.b32 {{%r2, %r3, %r4, %r5}}, [%rd6];
    mul.wide.u32 %rd7, %r1, 8;
    add.u64 %rd8, %rd2, %rd7;
    ld.global.v2.b32 {{%r6, %r7}}, [%rd8];
    add.u64 %rd9, %rd3, %rd5;
    ld.global.v4.f32 {{%f1, %f2, %f3, %f4}}, [%rd9];
    {MMA} {{%f5, %f6, %f7, %f8}}, {{%r2, %r3, %r4, %r5}}, {{%r6, %r7}}, {{%f1, %f2, %f3, %f4}};
    {MMA} {{%f9, %f10, %f11, %f12}}, {{%r2, %r3, %r4, %r5}}, {{%r6, %r7}}, {{%f5, %f6, %f7, %f8}};
    xor.b32 %r2, %r2, -2147450880;
    {MMA} {{%f13, %f14, %f15, %f16}}, {{%r2, %r3, %r4, %r5}}, {{%r6, %r7}},
        {{%f9, %f10, %f11, %f12}};
    mov.f32 %f17, %f13;
    mov.f32 %f18, %f14;
    mov.f32 %f19, %f15;
    mov.f32 %f20, %f16;
    setp.lt.u32 %p1, %r1, 32;
    @%p1 {MMA} {{%f13, %f14, %f15, %f16}}, {{%r2, %r3, %r4, %r5}}, {{%r6, %r7}},
        {{%f17, %f18, %f19, %f20}};
    {MMA} {{%f21, %f22, %f23, %f24}}, {{%r2, %r3, %r4, %r5}}, {{%r6, %r7}},
        {{%f13, %f14, %f15, %f16}};
    mul.wide.u32 %rd10, %r1, 48;
    add.u64 %rd11, %rd4, %rd10;
    st.global.v4.f32 [%rd11], {{%f5, %f6, %f7, %f8}};
    st.global.v4.f32 [%rd11+16], {{%f9, %f10, %f11, %f12}};
    st.global.v4.f32 [%rd11+32], {{%f21, %f22, %f23, %f24}};
    ret;
}}
"""


def _pack(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo.view(np.uint16).astype(np.uint32) | (hi.view(np.uint16).astype(np.uint32) << 16)


def test_reused_fragments_match_numpy(rng: np.random.Generator) -> None:
    nw = 2
    a = rng.standard_normal((nw, 16, 16)).astype(np.float16)
    b = rng.standard_normal((nw, 16, 8)).astype(np.float16)
    c = rng.standard_normal((nw, 16, 8)).astype(np.float32)
    g, t = np.arange(32) >> 2, np.arange(32) & 3
    # Fragments (NOTES-PTX.md): a_r (g + 8 (r & 1), 2t + 8 (r >> 1) ..+1), b_r (k = 2t + 8r
    # ..+1, n = g), c_r / d_r (g + 8 (r >> 1), 2t + (r & 1)).
    a_regs = np.stack(
        [
            _pack(a[:, g + 8 * (r & 1), 2 * t + 8 * (r >> 1)],
                  a[:, g + 8 * (r & 1), 2 * t + 8 * (r >> 1) + 1])
            for r in range(4)
        ],
        axis=-1,
    )  # fmt: skip
    b_regs = np.stack(
        [_pack(b[:, 2 * t + 8 * r, g], b[:, 2 * t + 8 * r + 1, g]) for r in range(2)], axis=-1
    )
    c_regs = np.stack([c[:, g + 8 * (r >> 1), 2 * t + (r & 1)] for r in range(4)], axis=-1)
    sim = Sim()
    pa, _ = sim.buffer(a_regs.reshape(-1))
    pb, _ = sim.buffer(b_regs.reshape(-1))
    pc, _ = sim.buffer(c_regs.reshape(-1))
    po, out = sim.buffer(np.zeros(nw * 32 * 12, np.float32))
    params = [("u64", pa), ("u64", pb), ("u64", pc), ("u64", po)]
    sim.launch(KERNEL, "k", (1, 1, 1), (32 * nw, 1, 1), params)

    def step(x: np.ndarray, acc: np.ndarray) -> np.ndarray:
        prod = x.astype(np.float64) @ b.astype(np.float64)
        out32: np.ndarray = (prod + acc.astype(np.float64)).astype(np.float32)
        return out32

    a2 = a.copy()
    a2[:, :8, :8] = -a2[:, :8, :8]  # a0 covers rows g < 8, columns 2t, 2t+1 < 8
    d1 = step(a, c)
    d2 = step(a, d1)
    d3 = step(a2, d2)
    d4 = np.concatenate([step(a2, d3)[:1], d3[1:]])  # warp 1 skipped the guarded mma
    d5 = step(a2, d4)
    got = out.reshape(nw, 32, 3, 4)
    for k, want in enumerate((d1, d2, d5)):
        frag = np.stack([want[:, g + 8 * (r >> 1), 2 * t + (r & 1)] for r in range(4)], -1)
        np.testing.assert_allclose(got[:, :, k], frag, rtol=1e-6, atol=1e-6)
