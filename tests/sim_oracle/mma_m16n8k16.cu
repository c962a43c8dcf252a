// ldmatrix + mma.sync m16n8k16 (f16 and bf16 inputs, f32 accumulators) through inline PTX.
// One warp per block computes a 16x8 tile of D = A @ B + C, looping over K in steps of 16:
// A is M x K row-major, B is K x N row-major (k-major), C and D are M x N f32 row-major.
// Each K step stages A (16x16) and B (16x8) through shared memory with 16-byte copies;
// A fragments come from ldmatrix.x4, B fragments from ldmatrix.x2.trans.
// Requires M % 16 == 0, N % 8 == 0, K % 16 == 0; grid = (N / 8, M / 16), block = 32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

template <bool BF16>
__device__ __forceinline__ void mma_tile(const unsigned short* __restrict__ A,
                                         const unsigned short* __restrict__ B,
                                         const float* __restrict__ C, float* __restrict__ D,
                                         int M, int N, int K) {
    __shared__ __align__(16) unsigned short As[16 * 16];
    __shared__ __align__(16) unsigned short Bs[16 * 8];
    const int lane = threadIdx.x;
    const int m0 = blockIdx.y * 16;
    const int n0 = blockIdx.x * 8;
    const int g = lane >> 2;
    const int t = lane & 3;
    float d0 = C[(m0 + g) * N + n0 + 2 * t];
    float d1 = C[(m0 + g) * N + n0 + 2 * t + 1];
    float d2 = C[(m0 + g + 8) * N + n0 + 2 * t];
    float d3 = C[(m0 + g + 8) * N + n0 + 2 * t + 1];
    for (int k0 = 0; k0 < K; k0 += 16) {
        // A tile: 16 rows x 32 bytes = 32 chunks of 16 bytes, one per lane.
        {
            const int row = lane >> 1, chunk = lane & 1;
            *reinterpret_cast<uint4*>(&As[row * 16 + chunk * 8]) =
                *reinterpret_cast<const uint4*>(&A[(m0 + row) * K + k0 + chunk * 8]);
        }
        // B tile: 16 rows (k) x 16 bytes (8 columns of n), lanes 0..15.
        if (lane < 16) {
            *reinterpret_cast<uint4*>(&Bs[lane * 8]) =
                *reinterpret_cast<const uint4*>(&B[(k0 + lane) * N + n0]);
        }
        __syncthreads();
        unsigned a0, a1, a2, a3, b0, b1;
        const unsigned a_addr =
            (unsigned)__cvta_generic_to_shared(&As[(lane % 16) * 16 + 8 * (lane / 16)]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                     : "r"(a_addr));
        const unsigned b_addr = (unsigned)__cvta_generic_to_shared(&Bs[(lane % 16) * 8]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(b0), "=r"(b1)
                     : "r"(b_addr));
        if (BF16) {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        } else {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
        __syncthreads();
    }
    D[(m0 + g) * N + n0 + 2 * t] = d0;
    D[(m0 + g) * N + n0 + 2 * t + 1] = d1;
    D[(m0 + g + 8) * N + n0 + 2 * t] = d2;
    D[(m0 + g + 8) * N + n0 + 2 * t + 1] = d3;
}

extern "C" __global__ void mma_f16_m16n8k16(const __half* __restrict__ A,
                                            const __half* __restrict__ B,
                                            const float* __restrict__ C, float* __restrict__ D,
                                            int M, int N, int K) {
    mma_tile<false>(reinterpret_cast<const unsigned short*>(A),
                    reinterpret_cast<const unsigned short*>(B), C, D, M, N, K);
}

extern "C" __global__ void mma_bf16_m16n8k16(const __nv_bfloat16* __restrict__ A,
                                             const __nv_bfloat16* __restrict__ B,
                                             const float* __restrict__ C, float* __restrict__ D,
                                             int M, int N, int K) {
    mma_tile<true>(reinterpret_cast<const unsigned short*>(A),
                   reinterpret_cast<const unsigned short*>(B), C, D, M, N, K);
}
