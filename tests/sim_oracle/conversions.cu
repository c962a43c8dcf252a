// Conversions and correctly rounded f32 arithmetic in every rounding mode.
// One 32-bit result row per operation: out[k * n + i] (16-bit results zero-extended).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" __global__ void cvt_narrow(const float* __restrict__ x, unsigned* __restrict__ out,
                                      int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    unsigned* o = out + i;
    int k = 0;
    o[n * k++] = __half_as_ushort(__float2half_rn(v));
    o[n * k++] = __half_as_ushort(__float2half_rz(v));
    o[n * k++] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    o[n * k++] = __bfloat16_as_ushort(__float2bfloat16_rz(v));
    o[n * k++] = __float_as_uint(__half2float(__float2half_rn(v)));
    o[n * k++] = __float_as_uint(__bfloat162float(__float2bfloat16_rn(v)));
}

extern "C" __global__ void cvt_float_to_int(const float* __restrict__ x, int* __restrict__ out,
                                            long long* __restrict__ out64, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    int* o = out + i;
    int k = 0;
    o[n * k++] = __float2int_rn(v);
    o[n * k++] = __float2int_rz(v);
    o[n * k++] = __float2int_rd(v);
    o[n * k++] = __float2int_ru(v);
    o[n * k++] = (int)__float2uint_rn(v);
    o[n * k++] = (int)__float2uint_rz(v);
    long long* o64 = out64 + i;
    o64[0] = __float2ll_rn(v);
    o64[n] = __float2ll_rz(v);
    o64[2 * n] = (long long)__float2ull_rz(v);
}

extern "C" __global__ void cvt_int_to_float(const int* __restrict__ a,
                                            const long long* __restrict__ b,
                                            float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int x = a[i];
    const long long y = b[i];
    float* o = out + i;
    int k = 0;
    o[n * k++] = __int2float_rn(x);
    o[n * k++] = __int2float_rz(x);
    o[n * k++] = __int2float_rd(x);
    o[n * k++] = __int2float_ru(x);
    o[n * k++] = __uint2float_rn((unsigned)x);
    o[n * k++] = __uint2float_rz((unsigned)x);
    o[n * k++] = __ll2float_rn(y);
    o[n * k++] = __ll2float_rz(y);
    o[n * k++] = __ll2float_ru(y);
    o[n * k++] = __ull2float_rd((unsigned long long)y);
}

extern "C" __global__ void f32_rounding(const float* __restrict__ a, const float* __restrict__ b,
                                        const float* __restrict__ c, float* __restrict__ out,
                                        int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = a[i], y = b[i], z = c[i];
    float* o = out + i;
    int k = 0;
    o[n * k++] = __fmaf_rn(x, y, z);
    o[n * k++] = __fmaf_rz(x, y, z);
    o[n * k++] = __fmaf_rd(x, y, z);
    o[n * k++] = __fmaf_ru(x, y, z);
    o[n * k++] = __fadd_rz(x, z);
    o[n * k++] = __fmul_ru(x, y);
    o[n * k++] = __fdiv_rn(x, y);
    o[n * k++] = __fdiv_rz(x, y);
    o[n * k++] = x / y;  // IEEE division (nvcc's default -prec-div=true)
    o[n * k++] = __fsqrt_rn(fabsf(y));
    o[n * k++] = __fsqrt_rd(fabsf(y));
    o[n * k++] = sqrtf(fabsf(z));
    o[n * k++] = __frcp_rn(y);
    o[n * k++] = __frcp_ru(y);
}
