// The reduction forms cutile_py's atomics emit (ct.atomic_add / atomic_max / atomic_min):
// red.global.add.s32, add.f32, add.u64 (an i64 add), max.s32 / min.s32 and max.s64 / min.s64,
// from every thread onto a few addresses; every result is independent of the order.
extern "C" __global__ void red_signed(const int* __restrict__ xi, const long long* __restrict__ xl,
                                      const float* __restrict__ xf, int* __restrict__ iout,
                                      long long* __restrict__ lout, float* __restrict__ fout,
                                      int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    asm volatile("red.global.add.s32 [%0], %1;" ::"l"(iout), "r"(xi[i]) : "memory");
    asm volatile("red.global.max.s32 [%0], %1;" ::"l"(iout + 1), "r"(xi[i]) : "memory");
    asm volatile("red.global.min.s32 [%0], %1;" ::"l"(iout + 2), "r"(xi[i]) : "memory");
    asm volatile("red.global.add.u64 [%0], %1;" ::"l"(lout), "l"(xl[i]) : "memory");
    asm volatile("red.global.max.s64 [%0], %1;" ::"l"(lout + 1), "l"(xl[i]) : "memory");
    asm volatile("red.global.min.s64 [%0], %1;" ::"l"(lout + 2), "l"(xl[i]) : "memory");
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(fout), "f"(xf[i]) : "memory");
}

// f32 max / min as ct.atomic_max / atomic_min do them, on the bits: a value with the sign bit
// clear by max.s32 (min.s32), one with it set by min.u32 (max.u32); a NaN value first becomes
// 0x7FFFFFFF for max and 0xFFFFFFFF for min. out[0] = max, out[1] = min of xf in IEEE totalOrder.
extern "C" __global__ void red_f32_extremes(const float* __restrict__ xf, float* __restrict__ out,
                                            int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = xf[i];
    unsigned hi = isnan(x) ? 0x7FFFFFFFu : __float_as_uint(x);
    unsigned lo = isnan(x) ? 0xFFFFFFFFu : __float_as_uint(x);
    if ((int)hi >= 0) {
        asm volatile("red.global.max.s32 [%0], %1;" ::"l"(out), "r"(hi) : "memory");
    } else {
        asm volatile("red.global.min.u32 [%0], %1;" ::"l"(out), "r"(hi) : "memory");
    }
    if ((int)lo >= 0) {
        asm volatile("red.global.min.s32 [%0], %1;" ::"l"(out + 1), "r"(lo) : "memory");
    } else {
        asm volatile("red.global.max.u32 [%0], %1;" ::"l"(out + 1), "r"(lo) : "memory");
    }
}
