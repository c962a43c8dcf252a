// Warp-shuffle reductions: a butterfly f32 sum (every lane ends with the total) and an int max
// by shuffling down (lane 0 ends with the max; other lanes hold partial maxima).
// n need not be a multiple of 32: missing elements are the identity.
#include <climits>

extern "C" __global__ void warp_reduce(const float* __restrict__ x, const int* __restrict__ y,
                                       float* __restrict__ sum_out, int* __restrict__ max_out,
                                       int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    int m = i < n ? y[i] : INT_MIN;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_down_sync(0xffffffffu, m, off));
    sum_out[i] = v;
    max_out[i] = m;
}
