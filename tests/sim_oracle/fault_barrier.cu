// Planted fault: __syncthreads reached by only part of the block.
extern "C" __global__ void partial_barrier(const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float sh[128];
    int t = threadIdx.x;
    sh[t] = x[t];
    if (t < 32) __syncthreads();
    y[t] = sh[t];
}
