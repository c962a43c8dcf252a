// One warpgroup (128 threads) computes D[64][32] = A[64][32] @ B[32][32] (f32 accumulate;
// the wg2_neg_ kernels: two warpgroups, D[128][32] = -(A[128][32] @ B))
// with wgmma.mma_async m64n32k16 (f16, bf16; two steps of K) or m64n32k8 (tf32; four),
// compiled to PTX for sm_90a by nvcc (generate_sm90.py) and run on the simulator by
// tests/test_nvcc_wgmma_layouts.py against NumPy. Each kernel stores its operands into
// shared memory in one of the PTX ISA's canonical layouts (K-major or MN-major; no swizzle,
// 32-byte or 64-byte swizzle), builds the matrix descriptors in C, or passes A in registers,
// and stores the accumulator fragments to D by the ISA's m64nN f32 D-fragment layout.
// Inputs are raw bit patterns (16-bit f16/bf16, 32-bit f32 for tf32), row-major in global
// memory: A is M x K, B is K x N, D is M x N floats.
#include <cstdint>

#define M 64
#define N 32
#define K 32
#define STEP 32  // bytes of K per instruction: k16 x 2 bytes, k8 x 4 bytes

enum Swizzle { NONE = 0, SW64 = 2, SW32 = 3 };  // descriptor bits 62-63
enum Kind { F16, BF16, TF32 };

__device__ __forceinline__ uint32_t span(int sw) { return sw == SW64 ? 64 : sw == SW32 ? 32 : 0; }

// The ISA's swizzle of a byte offset from a 1024-byte aligned base: the 16-byte chunk index
// (bits 4..) is XORed with bits 7.. of the offset, 1 bit for 32-byte, 2 bits for 64-byte.
__device__ __forceinline__ uint32_t swizzle(uint32_t o, int sw) {
    if (sw == SW32) return o ^ ((o >> 3) & 0x10);
    if (sw == SW64) return o ^ ((o >> 3) & 0x30);
    return o;
}

// K-major (K contiguous), `rows` rows of MN, K * E bytes each. No swizzle: core matrices of
// 8 rows x 16 bytes, K-adjacent ones LBO = 128 apart, MN-adjacent ones SBO = 8 * K * E apart
// (the ISA's ((8,m),(T,2k)) : ((1T,SBO),(1,LBO))). Swizzled: rows of `span` bytes, 8-row
// groups SBO = 8 * span apart; K wider than the span continues in a next column block of
// `rows` rows.
__device__ __forceinline__ uint32_t kmajor(int mn, int k, int sw, int rows, int e) {
    uint32_t byte = k * e;
    if (sw == NONE) return (mn / 8) * (8 * K * e) + (byte / 16) * 128 + (mn % 8) * 16 + byte % 16;
    uint32_t s = span(sw);
    return swizzle((byte / s) * rows * s + mn * s + byte % s, sw);
}

__device__ __forceinline__ uint32_t kmajor_lbo(int sw) { return sw == NONE ? 128 : 16; }
__device__ __forceinline__ uint32_t kmajor_sbo(int sw, int e) {
    return sw == NONE ? 8 * K * e : 8 * span(sw);
}

// MN-major (MN contiguous), `ext` elements of MN. No swizzle: core matrices of 8 K-rows x
// 16 bytes of MN, MN-adjacent ones SBO = 128 apart, K-adjacent ones LBO = ext * 16 apart
// (the ISA's ((T,1,m),(8,k)) : ((1,T,SBO),(1T,LBO))). Swizzled: atoms of span bytes of MN x
// 8 K-rows, MN-adjacent atoms LBO = 8 * span apart, 8-K-row groups SBO = ext * e * 8 apart
// (((T,s,m),(8,k)) : ((1,T,LBO),(sT,SBO))).
__device__ __forceinline__ uint32_t mn_lbo(int sw, int ext) {
    return sw == NONE ? ext * 16 : 8 * span(sw);
}
__device__ __forceinline__ uint32_t mn_sbo(int sw, int ext) { return sw == NONE ? 128 : ext * 16; }

__device__ __forceinline__ uint32_t mnmajor(int mn, int k, int sw, int ext) {
    const int e = 2;  // MN-major operands exist for 16-bit types only
    if (sw == NONE)
        return (mn / 8) * mn_sbo(sw, ext) + (k / 8) * mn_lbo(sw, ext) + (k % 8) * 16 +
               (mn % 8) * e;
    uint32_t s = span(sw), per = s / e;
    return swizzle((k / 8) * mn_sbo(sw, ext) + (mn / per) * mn_lbo(sw, ext) + (k % 8) * s +
                       (mn % per) * e,
                   sw);
}

__device__ __forceinline__ uint64_t desc(const char *p, uint32_t lbo, uint32_t sbo, int sw) {
    uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    return static_cast<uint64_t>((a & 0x3FFFF) >> 4) |
           (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
           (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) |
           (static_cast<uint64_t>(sw) << 62);
}

// Descriptor of K-step s (STEP bytes of K) of a K-major operand with `rows` rows: two core
// matrices further without swizzle; in the swizzled layouts the step starts STEP bytes
// further along the row, or at the next column block.
__device__ __forceinline__ uint64_t kdesc(const char *base, int s, int sw, int rows, int e) {
    uint32_t byte = s * STEP, start;
    if (sw == NONE)
        start = (byte / 16) * 128;
    else
        start = (byte / span(sw)) * rows * span(sw) + byte % span(sw);
    return desc(base + start, kmajor_lbo(sw), kmajor_sbo(sw, e), sw);
}

// Descriptor of K-step s (16 K-rows) of an MN-major operand of `ext` MN elements.
__device__ __forceinline__ uint64_t mndesc(const char *base, int s, int sw, int ext) {
    uint32_t start = sw == NONE ? 2 * s * mn_lbo(sw, ext) : 2 * s * mn_sbo(sw, ext);
    return desc(base + start, mn_lbo(sw, ext), mn_sbo(sw, ext), sw);
}

#define DREGS                                                                             \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define DOUT(d)                                                                           \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),  \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),       \
        "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define SCALE_D(i) "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %" #i ", 0;\n\t"

template <int KIND, int SA, int TA, int TB>
__device__ __forceinline__ void mma_ss(float *d, uint64_t a, uint64_t b, int acc) {
    if (KIND == BF16)
        asm volatile(SCALE_D(18) "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " DREGS
                                 ", %16, %17, p, %21, 1, %19, %20;\n\t}"
                     : DOUT(d)
                     : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB), "n"(SA));
    else if (KIND == F16)
        asm volatile(SCALE_D(18) "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " DREGS
                                 ", %16, %17, p, %21, 1, %19, %20;\n\t}"
                     : DOUT(d)
                     : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB), "n"(SA));
    else  // tf32: K-major operands only, no imm-trans operands
        asm volatile(SCALE_D(18) "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 " DREGS
                                 ", %16, %17, p, %19, 1;\n\t}"
                     : DOUT(d)
                     : "l"(a), "l"(b), "r"(acc), "n"(SA));
}

template <int KIND, int SA, int TB>
__device__ __forceinline__ void mma_rs(float *d, const uint32_t *a, uint64_t b, int acc) {
    if (KIND == BF16)
        asm volatile(SCALE_D(21) "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " DREGS
                                 ", {%16, %17, %18, %19}, %20, p, %23, 1, %22;\n\t}"
                     : DOUT(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB),
                       "n"(SA));
    else
        asm volatile(SCALE_D(21) "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " DREGS
                                 ", {%16, %17, %18, %19}, %20, p, %23, 1, %22;\n\t}"
                     : DOUT(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB),
                       "n"(SA));
}

// T: the element's storage type (its size is e). SWA, AMN: A's layout and whether it is
// MN-major (imm-trans-a = 1); SWA = -1 puts A in registers. SWB, BMN: the same for B.
// WG warpgroups (128 * WG threads): warpgroup g computes rows 64g.. of D from its own A tile
// and the shared B. SA: imm-scale-a (1, or -1 to negate A).
template <typename T, int KIND, int SWA, bool AMN, int SWB, bool BMN, int WG = 1, int SA = 1>
__device__ void body(const T *__restrict__ a, const T *__restrict__ b, float *__restrict__ d) {
    const int e = sizeof(T);
    __shared__ alignas(1024) T sa[WG][M * K];
    __shared__ alignas(1024) T sb[K * N];
    int tid = threadIdx.x, g = tid / 128, warp = tid / 32 % 4, lane = tid % 32;
    char *pa = reinterpret_cast<char *>(sa[g]), *pb = reinterpret_cast<char *>(sb);
    if (SWA >= 0)
        for (int i = tid; i < WG * M * K; i += 128 * WG) {  // element (m, k) of A's tile t
            int t = i / (M * K), m = i / K % M, k = i % K;
            char *at = reinterpret_cast<char *>(sa[t]);
            *reinterpret_cast<T *>(at + (AMN ? mnmajor(m, k, SWA, M) : kmajor(m, k, SWA, M, e))) =
                a[i];
        }
    a += g * M * K;
    d += g * M * N;
    for (int i = tid; i < K * N; i += 128 * WG) {  // element (k, n) of B
        int k = i / N, n = i % N;
        *reinterpret_cast<T *>(pb + (BMN ? mnmajor(n, k, SWB, N) : kmajor(n, k, SWB, N, e))) =
            b[i];
    }
    // The generic-proxy stores must be visible to wgmma's async-proxy reads.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();

    // Not zero: the first wgmma's scale-d = 0 must discard it.
    float acc[16];
    for (int j = 0; j < 16; ++j) acc[j] = 1000.0f;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    for (int s = 0; s < K * e / STEP; ++s) {
        uint64_t db = BMN ? mndesc(pb, s, SWB, N) : kdesc(pb, s, SWB, N, e);
        if (SWA >= 0) {
            uint64_t da = AMN ? mndesc(pa, s, SWA, M) : kdesc(pa, s, SWA, M, e);
            mma_ss<KIND, SA, AMN ? 1 : 0, BMN ? 1 : 0>(acc, da, db, s);
        } else {
            // A fragment (ISA, m64nNk16 A in registers): a_i of lane l in warp w is element
            // (16w + l/4 + 8*((i/2)%2), 2*(l%4) + i%2 + 8*(i/4)) of this K-step; register j
            // packs a_2j (low half) and a_2j+1.
            uint32_t frag[4];
            for (int j = 0; j < 4; ++j) {
                int row = 16 * warp + lane / 4 + 8 * (j % 2);
                int col = 16 * s + 2 * (lane % 4) + 8 * (j / 2);
                frag[j] = static_cast<uint32_t>(a[row * K + col]) |
                          (static_cast<uint32_t>(a[row * K + col + 1]) << 16);
            }
            mma_rs<KIND, SA, BMN ? 1 : 0>(acc, frag, db, s);
        }
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    // D fragment (ISA, m64nNk16 f32 accumulator): d_i of lane l in warp w is element
    // (16w + l/4 + 8*((i/2)%2), 8*(i/4) + 2*(l%4) + i%2).
    for (int i = 0; i < 16; ++i) {
        int row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
        int col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        d[row * N + col] = acc[i];
    }
}

#define KERNEL(name, t, kind, swa, amn, swb, bmn, ...)                                    \
    extern "C" __global__ void name(const t *a, const t *b, float *d) {                   \
        body<t, kind, swa, amn, swb, bmn, ##__VA_ARGS__>(a, b, d);                        \
    }

// Both operands K-major.
KERNEL(wg_k_none_f16, uint16_t, F16, NONE, false, NONE, false)
KERNEL(wg_k_sw32_f16, uint16_t, F16, SW32, false, SW32, false)
KERNEL(wg_k_sw64_f16, uint16_t, F16, SW64, false, SW64, false)
KERNEL(wg_k_sw64_bf16, uint16_t, BF16, SW64, false, SW64, false)
KERNEL(wg_k_none_tf32, uint32_t, TF32, NONE, false, NONE, false)
KERNEL(wg_k_sw32_tf32, uint32_t, TF32, SW32, false, SW32, false)
KERNEL(wg_k_sw64_tf32, uint32_t, TF32, SW64, false, SW64, false)
// B MN-major.
KERNEL(wg_mn_none_f16, uint16_t, F16, NONE, false, NONE, true)
KERNEL(wg_mn_sw32_f16, uint16_t, F16, SW32, false, SW32, true)
KERNEL(wg_mn_sw64_f16, uint16_t, F16, SW64, false, SW64, true)
KERNEL(wg_mn_sw64_bf16, uint16_t, BF16, SW64, false, SW64, true)
// A MN-major (and B of another layout).
KERNEL(wg_amn_none_f16, uint16_t, F16, NONE, true, SW32, false)
KERNEL(wg_amn_sw32_f16, uint16_t, F16, SW32, true, SW64, true)
KERNEL(wg_amn_sw64_bf16, uint16_t, BF16, SW64, true, NONE, true)
// A in registers.
KERNEL(wg_reg_k_sw32_f16, uint16_t, F16, -1, false, SW32, false)
KERNEL(wg_reg_mn_sw64_bf16, uint16_t, BF16, -1, false, SW64, true)
KERNEL(wg_reg_mn_none_f16, uint16_t, F16, -1, false, NONE, true)
// Two warpgroups, A negated by imm-scale-a = -1: D = -(A @ B) for 128 rows.
KERNEL(wg2_neg_k_sw64_f16, uint16_t, F16, SW64, false, SW64, false, 2, -1)
KERNEL(wg2_neg_k_sw32_tf32, uint32_t, TF32, SW32, false, SW32, false, 2, -1)
KERNEL(wg2_neg_reg_mn_sw32_bf16, uint16_t, BF16, -1, false, SW32, true, 2, -1)
