// The accurate CUDA math library (no fast math): long instruction sequences that nvcc inlines
// (fma chains, bit tricks on exponents, approximate seeds refined in software).
// One f32 row per function: out[k * n + i]; x is in [-10, 10], y in (0, 100].
extern "C" __global__ void libm(const float* __restrict__ x, const float* __restrict__ y,
                                float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float u = x[i], v = y[i];
    float* o = out + i;
    int k = 0;
    o[n * k++] = expf(u);
    o[n * k++] = logf(v);
    o[n * k++] = tanhf(u);
    o[n * k++] = sinf(u);
    o[n * k++] = cosf(u);
    o[n * k++] = exp2f(u);
    o[n * k++] = log2f(v);
    o[n * k++] = erff(u * 0.3f);
    o[n * k++] = expm1f(u * 0.1f);
    o[n * k++] = log1pf(v);
    o[n * k++] = atan2f(u, v - 50.0f);
    o[n * k++] = powf(v, u * 0.5f);
    o[n * k++] = rsqrtf(v);
    o[n * k++] = 1.0f / (1.0f + expf(-u));  // sigmoid
    // Arguments past 105615: the Payne-Hanek reduction (a table walk in local memory).
    o[n * k++] = sinf(u * 1.0e5f);
    o[n * k++] = cosf(u * 3.0e6f);
}
