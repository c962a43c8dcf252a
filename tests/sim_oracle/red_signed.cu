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
