// f16 and bf16 arithmetic on the tensor-core types (add/mul/fma in 16-bit, scalar and x2
// vector forms), correctly rounded to nearest even. One 32-bit result row per operation:
// out[k * n + i], holding 16-bit results zero-extended (x2 results: both halves).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" __global__ void half_math(const __half2* __restrict__ a, const __half2* __restrict__ b,
                                     const __half2* __restrict__ c, unsigned* __restrict__ out,
                                     int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const __half2 x = a[i], y = b[i], z = c[i];
    unsigned* o = out + i;
    int k = 0;
    o[n * k++] = __half_as_ushort(__hadd(__low2half(x), __low2half(y)));
    o[n * k++] = __half_as_ushort(__hmul(__low2half(x), __low2half(y)));
    o[n * k++] = __half_as_ushort(__hfma(__low2half(x), __low2half(y), __low2half(z)));
    o[n * k++] = __half_as_ushort(__hsub(__high2half(x), __high2half(y)));
    const __half2 s = __hadd2(x, y), p = __hmul2(x, y), f = __hfma2(x, y, z);
    o[n * k++] = *reinterpret_cast<const unsigned*>(&s);
    o[n * k++] = *reinterpret_cast<const unsigned*>(&p);
    o[n * k++] = *reinterpret_cast<const unsigned*>(&f);
    o[n * k++] = __half_as_ushort(__hmax(__low2half(x), __high2half(y)));
    o[n * k++] = __half_as_ushort(__hneg(__low2half(z)));
    o[n * k++] = (unsigned)__hlt(__low2half(x), __low2half(y));
}

extern "C" __global__ void bf16_math(const __nv_bfloat162* __restrict__ a,
                                     const __nv_bfloat162* __restrict__ b,
                                     const __nv_bfloat162* __restrict__ c,
                                     unsigned* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const __nv_bfloat162 x = a[i], y = b[i], z = c[i];
    unsigned* o = out + i;
    int k = 0;
    const __nv_bfloat162 f = __hfma2(x, y, z);
    o[n * k++] = *reinterpret_cast<const unsigned*>(&f);
    o[n * k++] = __bfloat16_as_ushort(__hfma(__low2bfloat16(x), __low2bfloat16(y),
                                             __low2bfloat16(z)));
    o[n * k++] = __bfloat16_as_ushort(__hmax(__low2bfloat16(x), __high2bfloat16(y)));
}
