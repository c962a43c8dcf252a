// CUDA C whose nvcc PTX exercises the parser (tests/test_ptx_parser.py) and the executor
// (tests/test_sim_executor.py): shared memory, inline-asm scopes, atomics, constant and
// local memory, loops with per-thread trip counts, early return.
// Regenerate: see regen.sh beside this file.
#include <cstdint>

__constant__ float coeffs[4] = {1.0f, -2.5f, 0.25f, 3.0f};
__device__ unsigned int counter;

// Block-wide sum of x into out[blockIdx.x] (tree reduction in shared memory).
extern "C" __global__ void block_sum(const float* __restrict__ x, float* out, int n) {
    __shared__ float sdata[256];
    unsigned tid = threadIdx.x;
    unsigned i = blockIdx.x * blockDim.x + tid;
    sdata[tid] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) out[blockIdx.x] = sdata[0];
}

// Each thread loops a data-dependent number of times; some threads return early.
extern "C" __global__ void collatz(const int* __restrict__ start, int* steps, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = start[i], k = 0;
    if (v <= 0) { steps[i] = -1; return; }
    while (v != 1) {
        v = (v & 1) ? 3 * v + 1 : v / 2;
        ++k;
    }
    steps[i] = k;
}

// Inline PTX with its own register scope (nvcc wraps each asm in `{ }`), used twice.
__device__ __forceinline__ unsigned mix(unsigned a, unsigned b) {
    unsigned r;
    asm("{\n\t.reg .u32 t;\n\tmul.lo.u32 t, %1, 2654435761;\n\txor.b32 %0, t, %2;\n\t}"
        : "=r"(r) : "r"(a), "r"(b));
    return r;
}

extern "C" __global__ void hash_and_count(const unsigned* in, unsigned* out, float* poly, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned h = mix(mix(in[i], i), 7u);
        out[i] = h;
        float x = (float)(h & 255u) / 256.0f;
        float acc = 0.0f;
        float local[4];
        for (int k = 0; k < 4; ++k) local[k] = coeffs[k] * x;
        for (int k = 0; k < 4; ++k) acc += local[(h + k) & 3];
        poly[i] = acc;
        if (h & 1u) atomicAdd(&counter, 1u);
    }
}
