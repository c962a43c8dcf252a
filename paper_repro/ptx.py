"""Hand-written PTX kernels (written here, for this harness) launched through `ct.RawKernel`.

Each works on `cuda` and `sim`. `.global` accesses go through `cvta.to.global`, as nvcc does,
so that generic allocation addresses are converted to the global window by the book.
"""

from __future__ import annotations

HEADER = ".version 7.0\n.target sm_80\n.address_size 64\n"

#: `spin(ns)`: one thread busy-waits `ns` nanoseconds on %globaltimer. Queued before a timed
#: batch, it keeps the stream busy while the host enqueues, so that host launch overhead does
#: not leak into device times.
SPIN = (
    HEADER
    + """
.visible .entry spin(.param .u64 p_ns)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [p_ns];
    mov.u64 %rd2, %globaltimer;
SPIN_LOOP:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra SPIN_LOOP;
    ret;
}
"""
)


def _binary_f32(name: str, body: str, scalar: str) -> str:
    """`z[i] = f(x[i], y[i])` on f32, four elements per thread (16-byte accesses), with a
    scalar loop for the last partial group."""
    return (
        HEADER
        + f"""
.visible .entry {name}(.param .u64 p_z, .param .u64 p_x, .param .u64 p_y, .param .u32 p_n)
{{
    .reg .pred %p<3>;
    .reg .b32 %r<9>;
    .reg .f32 %f<13>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [p_z];
    ld.param.u64 %rd2, [p_x];
    ld.param.u64 %rd3, [p_y];
    ld.param.u32 %r1, [p_n];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    cvta.to.global.u64 %rd3, %rd3;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    shl.b32 %r6, %r5, 2;
    add.u32 %r7, %r6, 4;
    setp.gt.u32 %p1, %r7, %r1;
    @%p1 bra TAIL;
    mul.wide.u32 %rd4, %r6, 4;
    add.u64 %rd5, %rd2, %rd4;
    add.u64 %rd6, %rd3, %rd4;
    add.u64 %rd7, %rd1, %rd4;
    ld.global.v4.f32 {{%f1, %f2, %f3, %f4}}, [%rd5];
    ld.global.v4.f32 {{%f5, %f6, %f7, %f8}}, [%rd6];
{body}
    st.global.v4.f32 [%rd7], {{%f9, %f10, %f11, %f12}};
    ret;
TAIL:
    setp.ge.u32 %p2, %r6, %r1;
    @%p2 bra DONE;
    mul.wide.u32 %rd4, %r6, 4;
    add.u64 %rd5, %rd2, %rd4;
    add.u64 %rd6, %rd3, %rd4;
    add.u64 %rd7, %rd1, %rd4;
    ld.global.f32 %f1, [%rd5];
    ld.global.f32 %f5, [%rd6];
{scalar}
    st.global.f32 [%rd7], %f9;
    add.u32 %r6, %r6, 1;
    bra TAIL;
DONE:
    ret;
}}
"""
    )


#: `add_f32(z, x, y, n)`: z = x + y. Launch with ceil(n / 4) threads.
ADD_F32 = _binary_f32(
    "add_f32",
    "\n".join(f"    add.rn.f32 %f{9 + k}, %f{1 + k}, %f{5 + k};" for k in range(4)),
    "    add.rn.f32 %f9, %f1, %f5;",
)

#: `add_f16(z, x, y, n)`: z = x + y on f16, eight elements per thread as four f16x2 pairs.
#: Launch with ceil(n / 8) threads.
ADD_F16 = (
    HEADER
    + """
.visible .entry add_f16(.param .u64 p_z, .param .u64 p_x, .param .u64 p_y, .param .u32 p_n)
{
    .reg .pred %p<3>;
    .reg .b32 %r<21>;
    .reg .b16 %h<4>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [p_z];
    ld.param.u64 %rd2, [p_x];
    ld.param.u64 %rd3, [p_y];
    ld.param.u32 %r1, [p_n];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    cvta.to.global.u64 %rd3, %rd3;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    shl.b32 %r6, %r5, 3;
    add.u32 %r7, %r6, 8;
    setp.gt.u32 %p1, %r7, %r1;
    @%p1 bra TAIL;
    mul.wide.u32 %rd4, %r6, 2;
    add.u64 %rd5, %rd2, %rd4;
    add.u64 %rd6, %rd3, %rd4;
    add.u64 %rd7, %rd1, %rd4;
    ld.global.v4.b32 {%r9, %r10, %r11, %r12}, [%rd5];
    ld.global.v4.b32 {%r13, %r14, %r15, %r16}, [%rd6];
    add.rn.f16x2 %r17, %r9, %r13;
    add.rn.f16x2 %r18, %r10, %r14;
    add.rn.f16x2 %r19, %r11, %r15;
    add.rn.f16x2 %r20, %r12, %r16;
    st.global.v4.b32 [%rd7], {%r17, %r18, %r19, %r20};
    ret;
TAIL:
    setp.ge.u32 %p2, %r6, %r1;
    @%p2 bra DONE;
    mul.wide.u32 %rd4, %r6, 2;
    add.u64 %rd5, %rd2, %rd4;
    add.u64 %rd6, %rd3, %rd4;
    add.u64 %rd7, %rd1, %rd4;
    ld.global.b16 %h1, [%rd5];
    ld.global.b16 %h2, [%rd6];
    add.rn.f16 %h3, %h1, %h2;
    st.global.b16 [%rd7], %h3;
    add.u32 %r6, %r6, 1;
    bra TAIL;
DONE:
    ret;
}
"""
)

#: `copy_f32(z, x, n)`: z = x, 16-byte accesses; the copy-kernel bandwidth ceiling.
COPY_F32 = (
    HEADER
    + """
.visible .entry copy_f32(.param .u64 p_z, .param .u64 p_x, .param .u32 p_n)
{
    .reg .pred %p<3>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [p_z];
    ld.param.u64 %rd2, [p_x];
    ld.param.u32 %r1, [p_n];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    shl.b32 %r6, %r5, 2;
    add.u32 %r7, %r6, 4;
    setp.gt.u32 %p1, %r7, %r1;
    @%p1 bra TAIL;
    mul.wide.u32 %rd3, %r6, 4;
    add.u64 %rd4, %rd2, %rd3;
    add.u64 %rd5, %rd1, %rd3;
    ld.global.v4.b32 {%r8, %r9, %r10, %r11}, [%rd4];
    st.global.v4.b32 [%rd5], {%r8, %r9, %r10, %r11};
    ret;
TAIL:
    setp.ge.u32 %p2, %r6, %r1;
    @%p2 bra DONE;
    mul.wide.u32 %rd3, %r6, 4;
    add.u64 %rd4, %rd2, %rd3;
    add.u64 %rd5, %rd1, %rd3;
    ld.global.b32 %r8, [%rd4];
    st.global.b32 [%rd5], %r8;
    add.u32 %r6, %r6, 1;
    bra TAIL;
DONE:
    ret;
}
"""
)


def _permute(name: str, store_index: str) -> str:
    """Transpose of an R x C f32 matrix into C x R, one element per thread;
    `store_index` computes the output element index %r9 from row %r7 and column %r8."""
    return (
        HEADER
        + f"""
.visible .entry {name}(.param .u64 p_out, .param .u64 p_in, .param .u32 p_rows,
                       .param .u32 p_cols)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<11>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [p_out];
    ld.param.u64 %rd2, [p_in];
    ld.param.u32 %r1, [p_rows];
    ld.param.u32 %r2, [p_cols];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.u32 %r6, %r3, %r4, %r5;
    mul.lo.u32 %r10, %r1, %r2;
    setp.ge.u32 %p1, %r6, %r10;
    @%p1 bra DONE;
    div.u32 %r7, %r6, %r2;
    rem.u32 %r8, %r6, %r2;
    mul.wide.u32 %rd3, %r6, 4;
    add.u64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
{store_index}
    mul.wide.u32 %rd5, %r9, 4;
    add.u64 %rd6, %rd1, %rd5;
    st.global.f32 [%rd6], %f1;
DONE:
    ret;
}}
"""
    )


#: `permute_ok(out, in, R, C)`: out[c, r] = in[r, c] (out is C x R, row stride R).
PERMUTE_OK = _permute("permute_ok", "    mad.lo.u32 %r9, %r8, %r1, %r7;")
#: `permute_racy(out, in, R, C)`: the store index swapped, out[r*R + c] = in[r, c]. With
#: C > R, threads (r, c) and (r+1, c-R) store to the same element: a write-write race between
#: blocks, and part of `out` is never written.
PERMUTE_RACY = _permute("permute_racy", "    mad.lo.u32 %r9, %r7, %r1, %r8;")
