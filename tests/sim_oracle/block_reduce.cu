// Shared-memory tree reductions with __syncthreads: block 256, several blocks, n not a power of
// two (bounds checks). Each block writes one partial result.
#include <climits>
#define BS 256

// Each thread first adds x[i] and x[i + BS] (the classic "first add during load"), then a tree.
extern "C" __global__ void block_reduce_sum(const float* __restrict__ x,
                                            float* __restrict__ partial, int n) {
    __shared__ float sh[BS];
    unsigned tid = threadIdx.x;
    unsigned i = blockIdx.x * (2 * BS) + tid;
    float v = 0.0f;
    if (i < n) v = x[i];
    if (i + BS < n) v += x[i + BS];
    sh[tid] = v;
    __syncthreads();
    for (unsigned s = BS / 2; s > 0; s >>= 1) {
        if (tid < s) sh[tid] += sh[tid + s];
        __syncthreads();
    }
    if (tid == 0) partial[blockIdx.x] = sh[0];
}

// Integer min and max together (two shared arrays), one element per thread.
extern "C" __global__ void block_reduce_minmax(const int* __restrict__ x, int* __restrict__ out,
                                               int n) {
    __shared__ int lo[BS];
    __shared__ int hi[BS];
    unsigned tid = threadIdx.x;
    unsigned i = blockIdx.x * BS + tid;
    int v = i < n ? x[i] : 0;
    lo[tid] = i < n ? v : INT_MAX;
    hi[tid] = i < n ? v : INT_MIN;
    __syncthreads();
    for (unsigned s = BS / 2; s > 0; s >>= 1) {
        if (tid < s) {
            lo[tid] = min(lo[tid], lo[tid + s]);
            hi[tid] = max(hi[tid], hi[tid + s]);
        }
        __syncthreads();
    }
    if (tid == 0) {
        out[2 * blockIdx.x] = lo[0];
        out[2 * blockIdx.x + 1] = hi[0];
    }
}

// Dynamic shared memory and a run-time block size (a power of two): an i64 sum.
extern "C" __global__ void block_reduce_dyn(const long long* __restrict__ x,
                                            long long* __restrict__ partial, int n) {
    extern __shared__ long long dsh[];
    unsigned tid = threadIdx.x;
    unsigned i = blockIdx.x * blockDim.x + tid;
    dsh[tid] = i < n ? x[i] : 0;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) dsh[tid] += dsh[tid + s];
        __syncthreads();
    }
    if (tid == 0) partial[blockIdx.x] = dsh[0];
}
