// cp.async.cg.shared.global (16 bytes, with src-size zero fill at the ragged end), double
// buffered with commit_group / wait_group over a grid-stride loop of tiles: y = scale * x.
// Each thread copies 16 bytes of a tile; after the barrier each thread reads elements that
// other threads copied. y has room for whole tiles: past n it receives scale * 0 (zero fill).
#define TPB 64
#define TILE (TPB * 4)

__device__ __forceinline__ void issue(const float* __restrict__ x, float* buf, int tile, int n) {
    const int idx = tile * TILE + threadIdx.x * 4;
    const int rem = n - idx;
    const int bytes = rem >= 4 ? 16 : (rem > 0 ? rem * 4 : 0);
    const float* src = x + (rem > 0 ? idx : 0);
    const unsigned dst = (unsigned)__cvta_generic_to_shared(&buf[threadIdx.x * 4]);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes)
                 : "memory");
}

extern "C" __global__ void cp_async_scale(const float* __restrict__ x, float* __restrict__ y,
                                          int n, float scale) {
    __shared__ __align__(16) float buf[2][TILE];
    const int ntiles = (n + TILE - 1) / TILE;
    int t = blockIdx.x;
    if (t < ntiles) issue(x, buf[0], t, n);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    for (int it = 0; t < ntiles; ++it, t += gridDim.x) {
        const int next = t + gridDim.x;
        if (next < ntiles) issue(x, buf[(it + 1) & 1], next, n);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        __syncthreads();
        const float* cur = buf[it & 1];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int e = j * TPB + threadIdx.x;
            y[t * TILE + e] = scale * cur[e];
        }
        __syncthreads();
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// The 4- and 8-byte forms (cp.async.ca, through L1) and cp.async.wait_all. With T = blockDim.x
// and 4T floats of x per block, thread t copies x[2t] (4 bytes) to sm[2t] and the pair
// x[2T + 2t], x[2T + 2t + 1] (8 bytes) to sm[2T + 2t]; after the barrier it reads what thread
// T - 1 - t copied. y has 2T floats per block. Dynamic shared memory: 16T bytes.
extern "C" __global__ void cp_async_small(const float* __restrict__ x, float* __restrict__ y) {
    extern __shared__ __align__(16) float sm[];
    const int t = threadIdx.x, T = blockDim.x;
    const float* xb = x + blockIdx.x * 4 * T;
    const unsigned d4 = (unsigned)__cvta_generic_to_shared(&sm[2 * t]);
    const unsigned d8 = (unsigned)__cvta_generic_to_shared(&sm[2 * T + 2 * t]);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d4), "l"(xb + 2 * t) : "memory");
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d8), "l"(xb + 2 * T + 2 * t)
                 : "memory");
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    const int u = T - 1 - t;
    float* yb = y + blockIdx.x * 2 * T;
    yb[t] = sm[2 * u];
    yb[T + t] = sm[2 * T + 2 * u] + sm[2 * T + 2 * u + 1];
}
