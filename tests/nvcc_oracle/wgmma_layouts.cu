// One warpgroup (128 threads) computes D[64][32] = A[64][32] @ B[32][32] (f32 accumulate)
// with two wgmma.mma_async m64n32k16 (K = 32), compiled to PTX for sm_90a by nvcc
// (generate_wgmma.py) and run on the simulator by tests/test_nvcc_wgmma_layouts.py against
// NumPy. Each kernel stores its operands into shared memory in one of the PTX ISA's canonical
// layouts (K-major or MN-major; no swizzle, 32-byte or 64-byte swizzle), builds the matrix
// descriptors in C, or passes A in registers, and stores the accumulator fragments to D by
// the ISA's m64nNk16 f32 D-fragment layout. Inputs are raw 16-bit patterns (f16 or bf16),
// row-major in global memory: A is M x K, B is K x N, D is M x N floats.
#include <cstdint>

#define M 64
#define N 32
#define K 32

enum Swizzle { NONE = 0, SW64 = 2, SW32 = 3 };  // descriptor bits 62-63

// Canonical-layout strides chosen for these tiles (bytes). No swizzle, K-major: core
// matrices of 8 rows x 16 bytes, K-adjacent ones LBO apart, MN-adjacent ones SBO apart.
#define KN_LBO 128
#define KN_SBO 512  // 4 core matrices along K = 32
// No swizzle, MN-major: core matrices of 8 K-rows x 16 bytes of MN; MN-adjacent ones SBO
// apart, K-adjacent ones LBO apart (the ISA's ((T,1,m),(8,k)) : ((1,T,SBO),(1T,LBO))).
#define MN_SBO 128
#define MN_LBO 512
// Swizzled MN-major: atoms of (span bytes of MN) x 8 K-rows; MN-adjacent atoms LBO apart,
// groups of 8 K-rows SBO apart.
#define MN32_LBO 256
#define MN32_SBO 512
#define MN64_SBO 512

__device__ __forceinline__ uint32_t span(int sw) { return sw == SW64 ? 64 : sw == SW32 ? 32 : 0; }

// The ISA's swizzle of a byte offset from a 1024-byte aligned base: the 16-byte chunk index
// (bits 4..) is XORed with bits 7.. of the offset, 1 bit for 32-byte, 2 bits for 64-byte.
__device__ __forceinline__ uint32_t swizzle(uint32_t o, int sw) {
    if (sw == SW32) return o ^ ((o >> 3) & 0x10);
    if (sw == SW64) return o ^ ((o >> 3) & 0x30);
    return o;
}

// Byte offset of element (mn, k) of a K-major operand (K contiguous).
__device__ __forceinline__ uint32_t kmajor(int mn, int k, int sw, int rows) {
    if (sw == NONE)
        return (mn / 8) * KN_SBO + (k / 8) * KN_LBO + (mn % 8) * 16 + (k % 8) * 2;
    // A K-major swizzled tile is one atom column per span of K: rows of `span` bytes; the
    // K = 32 tile of the 32-byte layout is two such column blocks of M or N rows each.
    uint32_t s = span(sw), per = s / 2;
    return swizzle((k / per) * rows * s + mn * s + (k % per) * 2, sw);
}

// Byte offset of element (mn, k) of an MN-major operand (MN contiguous).
__device__ __forceinline__ uint32_t mnmajor(int mn, int k, int sw) {
    if (sw == NONE)
        return (mn / 8) * MN_SBO + (k / 8) * MN_LBO + (k % 8) * 16 + (mn % 8) * 2;
    uint32_t s = span(sw), per = s / 2;
    uint32_t lbo = sw == SW32 ? MN32_LBO : 0, sbo = sw == SW32 ? MN32_SBO : MN64_SBO;
    return swizzle((k / 8) * sbo + (mn / per) * lbo + (k % 8) * s + (mn % per) * 2, sw);
}

__device__ __forceinline__ uint64_t desc(const void *p, uint32_t lbo, uint32_t sbo, int sw) {
    uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    return static_cast<uint64_t>((a & 0x3FFFF) >> 4) |
           (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
           (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) |
           (static_cast<uint64_t>(sw) << 62);
}

// Descriptor of K-step s (16 of K) of a K-major operand with `rows` rows.
__device__ __forceinline__ uint64_t kdesc(const char *base, int s, int sw, int rows) {
    if (sw == NONE) return desc(base + s * 2 * KN_LBO, KN_LBO, KN_SBO, sw);
    if (sw == SW32) return desc(base + s * rows * 32, 1, 8 * 32, sw);  // next column block
    return desc(base + s * 32, 1, 8 * 64, sw);  // 32 bytes further along the 64-byte rows
}

__device__ __forceinline__ uint64_t mndesc(const char *base, int s, int sw) {
    if (sw == NONE) return desc(base + s * 2 * MN_LBO, MN_LBO, MN_SBO, sw);
    if (sw == SW32) return desc(base + s * 2 * MN32_SBO, MN32_LBO, MN32_SBO, sw);
    return desc(base + s * 2 * MN64_SBO, 1, MN64_SBO, sw);
}

#define DREGS                                                                             \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define DOUT(d)                                                                           \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),  \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),       \
        "+f"(d[13]), "+f"(d[14]), "+f"(d[15])

template <bool BF16, int TB>
__device__ __forceinline__ void mma_ss(float *d, uint64_t a, uint64_t b, int acc) {
    if (BF16)
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %18, 0;\n\t"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " DREGS
                     ", %16, %17, p, 1, 1, 0, %19;\n\t}"
                     : DOUT(d)
                     : "l"(a), "l"(b), "r"(acc), "n"(TB));
    else
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %18, 0;\n\t"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " DREGS
                     ", %16, %17, p, 1, 1, 0, %19;\n\t}"
                     : DOUT(d)
                     : "l"(a), "l"(b), "r"(acc), "n"(TB));
}

template <bool BF16, int TB>
__device__ __forceinline__ void mma_rs(float *d, const uint32_t *a, uint64_t b, int acc) {
    if (BF16)
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %21, 0;\n\t"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " DREGS
                     ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n\t}"
                     : DOUT(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB));
    else
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %21, 0;\n\t"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " DREGS
                     ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n\t}"
                     : DOUT(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB));
}

// SWA: A's layout (K-major), or -1 for A in registers. SWB, BMN: B's layout and whether B
// is MN-major (imm-trans-b = 1) rather than K-major.
template <int SWA, int SWB, bool BMN, bool BF16>
__device__ void body(const uint16_t *__restrict__ a, const uint16_t *__restrict__ b,
                     float *__restrict__ d) {
    __shared__ alignas(1024) uint16_t sa[M * K];
    __shared__ alignas(1024) uint16_t sb[K * N];
    char *pa = reinterpret_cast<char *>(sa), *pb = reinterpret_cast<char *>(sb);
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    if (SWA >= 0)
        for (int i = tid; i < M * K; i += 128)
            *reinterpret_cast<uint16_t *>(pa + kmajor(i / K, i % K, SWA, M)) = a[i];
    for (int i = tid; i < K * N; i += 128) {  // element (k, n) of B
        int k = i / N, n = i % N;
        *reinterpret_cast<uint16_t *>(pb + (BMN ? mnmajor(n, k, SWB) : kmajor(n, k, SWB, N))) =
            b[i];
    }
    // The generic-proxy stores must be visible to wgmma's async-proxy reads.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();

    float acc[16];
    for (int j = 0; j < 16; ++j) acc[j] = 0.0f;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    for (int s = 0; s < K / 16; ++s) {
        uint64_t db = BMN ? mndesc(pb, s, SWB) : kdesc(pb, s, SWB, N);
        if (SWA >= 0) {
            mma_ss<BF16, BMN ? 1 : 0>(acc, kdesc(pa, s, SWA, M), db, s);
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
            mma_rs<BF16, BMN ? 1 : 0>(acc, frag, db, s);
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

#define KERNEL(name, swa, swb, bmn, bf16)                                                 \
    extern "C" __global__ void __launch_bounds__(128)                                     \
        name(const uint16_t *a, const uint16_t *b, float *d) {                            \
        body<swa, swb, bmn, bf16>(a, b, d);                                               \
    }

KERNEL(wg_k_none_f16, NONE, NONE, false, false)
KERNEL(wg_k_sw32_f16, SW32, SW32, false, false)
KERNEL(wg_k_sw64_f16, SW64, SW64, false, false)
KERNEL(wg_k_sw64_bf16, SW64, SW64, false, true)
KERNEL(wg_mn_none_f16, NONE, NONE, true, false)
KERNEL(wg_mn_sw32_f16, SW32, SW32, true, false)
KERNEL(wg_mn_sw64_f16, SW64, SW64, true, false)
KERNEL(wg_mn_sw64_bf16, SW64, SW64, true, true)
KERNEL(wg_reg_k_sw32_f16, -1, SW32, false, false)
KERNEL(wg_reg_mn_sw64_bf16, -1, SW64, true, true)
KERNEL(wg_reg_mn_none_f16, -1, NONE, true, false)
