// Fast-math intrinsics and approximate PTX instructions, one f32 row per operation:
// out[k * n + i]. Compared within the error bounds the CUDA and PTX documentation state.

__device__ __forceinline__ float tanh_approx(float x) {
    float r;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float ex2_approx(float x) {
    float r;
    asm("ex2.approx.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float lg2_approx(float x) {
    float r;
    asm("lg2.approx.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float rcp_approx(float x) {
    float r;
    asm("rcp.approx.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float sqrt_approx(float x) {
    float r;
    asm("sqrt.approx.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

// x is in [-10, 10], y in [0.01, 100] (both signs).
extern "C" __global__ void fast_math(const float* __restrict__ x, const float* __restrict__ y,
                                     float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float u = x[i], v = y[i], av = fabsf(v);
    float* o = out + i;
    int k = 0;
    o[n * k++] = __expf(u);
    o[n * k++] = __logf(av);
    o[n * k++] = tanh_approx(u);
    o[n * k++] = __fdividef(u, v);
    o[n * k++] = __sinf(u * 0.3f);
    o[n * k++] = __cosf(u * 0.3f);
    o[n * k++] = rsqrtf(av);
    o[n * k++] = ex2_approx(u);
    o[n * k++] = lg2_approx(av);
    o[n * k++] = rcp_approx(v);
    o[n * k++] = sqrt_approx(av);
    o[n * k++] = __saturatef(u * 0.1f);
}
