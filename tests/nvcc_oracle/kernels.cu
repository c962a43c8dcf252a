// CUDA C kernels compiled to PTX by nvcc (generate.py) and run on the simulator by
// tests/test_nvcc_oracle.py against NumPy: global atomics, warp functions, and a
// "last block done" reduction ordered by __threadfence and an atomic counter.
#include <cstdint>

extern "C" __global__ void atomics_i32(const int *x, int n, int *sum, int *mx, int *mn,
                                       unsigned *cas_hits, int *exch) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = x[i];
    atomicAdd(sum, v);
    atomicMax(mx, v);
    atomicMin(mn, v);
    // Every thread tries to swing exch from -1 to its index: exactly one succeeds.
    if (atomicCAS(exch, -1, i) == -1) atomicAdd(cas_hits, 1u);
}

extern "C" __global__ void atomics_f32(const float *x, int n, float *sum, const int *bins,
                                       float *hist) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(sum, x[i]);
    atomicAdd(&hist[bins[i]], x[i]);
}

extern "C" __global__ void atomics_u64(const unsigned long long *x, int n,
                                       unsigned long long *sum, unsigned long long *last,
                                       unsigned long long *seen) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(sum, x[i]);
    // The old values handed out by atomicExch are each a distinct earlier value.
    unsigned long long old = atomicExch(last, (unsigned long long)i);
    seen[i] = old;
}

extern "C" __global__ void shuffles(const int *x, int *up, int *down, int *bfly, int *idx,
                                    int *width8) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = x[i];
    up[i] = __shfl_up_sync(0xffffffffu, v, 3);
    down[i] = __shfl_down_sync(0xffffffffu, v, 5);
    bfly[i] = __shfl_xor_sync(0xffffffffu, v, 6);
    idx[i] = __shfl_sync(0xffffffffu, v, (threadIdx.x * 7) & 31);
    width8[i] = __shfl_down_sync(0xffffffffu, v, 2, 8);
}

extern "C" __global__ void votes(const int *x, unsigned *ballot, int *all, int *any,
                                 unsigned *reduced, unsigned *active) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = x[i];
    ballot[i] = __ballot_sync(0xffffffffu, v > 0);
    all[i] = __all_sync(0xffffffffu, v > -50);
    any[i] = __any_sync(0xffffffffu, v > 90);
    reduced[i] = __reduce_add_sync(0xffffffffu, (unsigned)v);
    __syncwarp();
    if (v & 1) active[i] = __activemask();
    else active[i] = 0;
}

// Each block sums its slice into partial[block]; the block that finishes last sums the
// partials. The fence orders the partial before the counter's increment.
extern "C" __global__ void last_block_sum(const float *x, int n, float *partial,
                                          unsigned *count, float *total) {
    __shared__ float buf[256];
    __shared__ bool last;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = buf[0];
        __threadfence();
        unsigned done = atomicAdd(count, 1u);
        last = done == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        float t = 0.0f;
        for (int b = 0; b < gridDim.x; ++b) t += ((volatile float *)partial)[b];
        *total = t;
    }
}
