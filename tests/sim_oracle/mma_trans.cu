// ldmatrix.x4.trans for both operands of mma.sync m16n8k16 (f16 inputs, f32 accumulators),
// through inline PTX: A given K x M (stored k-major, as a transposed A tile is) and B given
// K x N row-major. One warp per block computes a 16x16 tile of D = A @ B + C (two 16x8 mma
// tiles), looping over K in steps of 16; C and D are M x N f32 row-major.
// A fragments: .x4.trans of As[k][m], lanes 0-7 giving rows k 0-7 at m 0-7, lanes 8-15 k 0-7
// at m 8-15, lanes 16-23 k 8-15 at m 0-7, lanes 24-31 k 8-15 at m 8-15 (a0..a3 in order).
// B fragments of both n tiles: one .x4.trans of Bs[k][n], lane l giving row k = l % 16 at
// n = 8 * (l / 16).
// Requires M % 16 == 0, N % 16 == 0, K % 16 == 0; grid = (N / 16, M / 16), block = 32.
#include <cuda_fp16.h>

extern "C" __global__ void mma_f16_kmajor(const __half* __restrict__ At,
                                          const __half* __restrict__ B,
                                          const float* __restrict__ C, float* __restrict__ D,
                                          int M, int N, int K) {
    __shared__ __align__(16) unsigned short As[16 * 16];  // [k][m]
    __shared__ __align__(16) unsigned short Bs[16 * 16];  // [k][n]
    const unsigned short* a = reinterpret_cast<const unsigned short*>(At);
    const unsigned short* b = reinterpret_cast<const unsigned short*>(B);
    const int lane = threadIdx.x;
    const int m0 = blockIdx.y * 16;
    const int n0 = blockIdx.x * 16;
    const int g = lane >> 2;
    const int t = lane & 3;
    float d[2][4];
    for (int j = 0; j < 2; ++j) {
        const int n = n0 + 8 * j + 2 * t;
        d[j][0] = C[(m0 + g) * N + n];
        d[j][1] = C[(m0 + g) * N + n + 1];
        d[j][2] = C[(m0 + g + 8) * N + n];
        d[j][3] = C[(m0 + g + 8) * N + n + 1];
    }
    for (int k0 = 0; k0 < K; k0 += 16) {
        // Each tile: 16 rows x 32 bytes = 32 chunks of 16 bytes, one per lane.
        const int row = lane >> 1, chunk = lane & 1;
        *reinterpret_cast<uint4*>(&As[row * 16 + chunk * 8]) =
            *reinterpret_cast<const uint4*>(&a[(k0 + row) * M + m0 + chunk * 8]);
        *reinterpret_cast<uint4*>(&Bs[row * 16 + chunk * 8]) =
            *reinterpret_cast<const uint4*>(&b[(k0 + row) * N + n0 + chunk * 8]);
        __syncthreads();
        unsigned a0, a1, a2, a3, b00, b01, b10, b11;
        const int krow = (lane & 7) + 8 * (lane >> 4);
        const unsigned a_addr =
            (unsigned)__cvta_generic_to_shared(&As[krow * 16 + 8 * ((lane >> 3) & 1)]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                     : "r"(a_addr));
        const unsigned b_addr =
            (unsigned)__cvta_generic_to_shared(&Bs[(lane % 16) * 16 + 8 * (lane / 16)]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(b00), "=r"(b01), "=r"(b10), "=r"(b11)
                     : "r"(b_addr));
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b00), "r"(b01));
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b10), "r"(b11));
        __syncthreads();
    }
    for (int j = 0; j < 2; ++j) {
        const int n = n0 + 8 * j + 2 * t;
        D[(m0 + g) * N + n] = d[j][0];
        D[(m0 + g) * N + n + 1] = d[j][1];
        D[(m0 + g + 8) * N + n] = d[j][2];
        D[(m0 + g + 8) * N + n + 1] = d[j][3];
    }
}
