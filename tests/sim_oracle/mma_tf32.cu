// mma.sync m16n8k8 with tf32 inputs (f32 accumulators) through inline PTX, operands rounded
// with cvt.rna.tf32.f32. One warp per block computes a 16x8 tile of D = A @ B + C over K in
// steps of 8: A is M x K f32 row-major, B is K x N f32 row-major, C and D M x N f32.
// A fragments come from ldmatrix.x4 on 32-bit data (each 8x8 b16 matrix is 8 rows of 4 f32);
// B fragments are read from shared memory directly. The rounded A operands are also written
// out (Ar, M x K, raw tf32 bits) so the rounding and the fragment layout are checked exactly.
// Requires M % 16 == 0, N % 8 == 0, K % 8 == 0; grid = (N / 8, M / 16), block = 32.

__device__ __forceinline__ unsigned to_tf32(unsigned x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
}

extern "C" __global__ void mma_tf32_m16n8k8(const float* __restrict__ A,
                                            const float* __restrict__ B,
                                            const float* __restrict__ C, float* __restrict__ D,
                                            unsigned* __restrict__ Ar, int M, int N, int K) {
    __shared__ __align__(16) float As[16 * 8];
    __shared__ __align__(16) float Bs[8 * 8];
    const int lane = threadIdx.x;
    const int m0 = blockIdx.y * 16;
    const int n0 = blockIdx.x * 8;
    const int g = lane >> 2;
    const int t = lane & 3;
    float d0 = C[(m0 + g) * N + n0 + 2 * t];
    float d1 = C[(m0 + g) * N + n0 + 2 * t + 1];
    float d2 = C[(m0 + g + 8) * N + n0 + 2 * t];
    float d3 = C[(m0 + g + 8) * N + n0 + 2 * t + 1];
    for (int k0 = 0; k0 < K; k0 += 8) {
        {
            const int row = lane >> 1, chunk = lane & 1;
            *reinterpret_cast<float4*>(&As[row * 8 + chunk * 4]) =
                *reinterpret_cast<const float4*>(&A[(m0 + row) * K + k0 + chunk * 4]);
        }
        if (lane < 16) {
            const int row = lane >> 1, chunk = lane & 1;
            *reinterpret_cast<float4*>(&Bs[row * 8 + chunk * 4]) =
                *reinterpret_cast<const float4*>(&B[(k0 + row) * N + n0 + chunk * 4]);
        }
        __syncthreads();
        unsigned a0, a1, a2, a3;
        const unsigned a_addr =
            (unsigned)__cvta_generic_to_shared(&As[(lane % 16) * 8 + 4 * (lane / 16)]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                     : "r"(a_addr));
        a0 = to_tf32(a0);
        a1 = to_tf32(a1);
        a2 = to_tf32(a2);
        a3 = to_tf32(a3);
        const unsigned b0 = to_tf32(__float_as_uint(Bs[t * 8 + g]));
        const unsigned b1 = to_tf32(__float_as_uint(Bs[(t + 4) * 8 + g]));
        // tf32 A fragment: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4).
        Ar[(m0 + g) * K + k0 + t] = a0;
        Ar[(m0 + g + 8) * K + k0 + t] = a1;
        Ar[(m0 + g) * K + k0 + t + 4] = a2;
        Ar[(m0 + g + 8) * K + k0 + t + 4] = a3;
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        __syncthreads();
    }
    D[(m0 + g) * N + n0 + 2 * t] = d0;
    D[(m0 + g) * N + n0 + 2 * t + 1] = d1;
    D[(m0 + g + 8) * N + n0 + 2 * t] = d2;
    D[(m0 + g + 8) * N + n0 + 2 * t + 1] = d3;
}
