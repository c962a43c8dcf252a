// Planted fault: an off-by-one bound lets thread n store one element past the end of y.
extern "C" __global__ void oob_store(float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) y[i] = 2.0f * i;
}

// Planted fault: a shared-memory index past the end of a static shared array.
extern "C" __global__ void oob_shared(const float* __restrict__ x, float* __restrict__ y,
                                      int shift) {
    __shared__ float sh[64];
    int t = threadIdx.x;
    sh[t] = x[t];
    __syncthreads();
    y[t] = sh[t + shift];
}
