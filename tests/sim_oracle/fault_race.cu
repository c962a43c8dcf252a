// Planted fault: threads write shared memory and then read what another warp wrote, with no
// __syncthreads in between (a data race). race_fixed is the same with the barrier.
extern "C" __global__ void race_missing_sync(const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float sh[128];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    sh[t] = x[i];
    y[i] = sh[(t + 64) % blockDim.x];
}

extern "C" __global__ void race_fixed(const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float sh[128];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    sh[t] = x[i];
    __syncthreads();
    y[i] = sh[(t + 64) % blockDim.x];
}
