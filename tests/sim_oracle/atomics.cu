// Global and shared-memory atomics from many threads onto few addresses. Every result is
// independent of the order the hardware serializes them in (float sums use exactly
// representable values), except the returned old values, whose multiset is fixed.

// Tickets: every thread gets a distinct old value of the counter, 0 .. n-1.
extern "C" __global__ void atomic_ticket(int* __restrict__ counter, int* __restrict__ tickets,
                                         int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) tickets[i] = atomicAdd(counter, 1);
}

// Sums into one global counter (int, float, 64-bit; results unused).
extern "C" __global__ void atomic_sum(const int* __restrict__ xi, const float* __restrict__ xf,
                                      const long long* __restrict__ xl, int* __restrict__ isum,
                                      float* __restrict__ fsum, long long* __restrict__ lsum,
                                      int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        atomicAdd(isum, xi[i]);
        atomicAdd(fsum, xf[i]);
        atomicAdd(reinterpret_cast<unsigned long long*>(lsum), (unsigned long long)xl[i]);
    }
}

// The reduction forms (no result) through inline PTX: red.global.{add.u32, add.f32, min.s32,
// max.u64} and red.shared.add.u32 (a per-block count, then merged).
extern "C" __global__ void red_ops(const int* __restrict__ xi, const float* __restrict__ xf,
                                   const long long* __restrict__ xl, int* __restrict__ out,
                                   float* __restrict__ fout, long long* __restrict__ lout, int n) {
    __shared__ unsigned count;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        asm volatile("red.global.add.u32 [%0], %1;" ::"l"(out), "r"(xi[i]) : "memory");
        asm volatile("red.global.min.s32 [%0], %1;" ::"l"(out + 1), "r"(xi[i]) : "memory");
        asm volatile("red.global.add.f32 [%0], %1;" ::"l"(fout), "f"(xf[i]) : "memory");
        asm volatile("red.global.max.u64 [%0], %1;" ::"l"(lout), "l"(xl[i]) : "memory");
        const unsigned c = (unsigned)__cvta_generic_to_shared(&count);
        asm volatile("red.shared.add.u32 [%0], %1;" ::"r"(c), "r"(xi[i] & 1) : "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(out + 2, (int)count);
}

// Min/max (signed and unsigned) and bitwise atomics; out[0..6] hold the initial values.
extern "C" __global__ void atomic_minmax_bits(const int* __restrict__ x, int* __restrict__ out,
                                              int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = x[i];
    atomicMax(&out[0], v);
    atomicMin(&out[1], v);
    atomicMax(reinterpret_cast<unsigned*>(&out[2]), (unsigned)v);
    atomicMin(reinterpret_cast<unsigned*>(&out[3]), (unsigned)v);
    atomicOr(&out[4], 1 << (v & 31));
    atomicXor(&out[5], v);
    atomicAnd(&out[6], ~(1 << ((v >> 5) & 31)));
}

// Compare-and-swap loops: a float max through 32-bit CAS and an i64 sum through 64-bit CAS.
extern "C" __global__ void atomic_cas_loops(const float* __restrict__ xf,
                                            const long long* __restrict__ xl,
                                            float* __restrict__ fmax_out,
                                            long long* __restrict__ lsum_out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int* addr = reinterpret_cast<int*>(fmax_out);
    int old = *addr, assumed;
    do {
        assumed = old;
        old = atomicCAS(addr, assumed, __float_as_int(fmaxf(xf[i], __int_as_float(assumed))));
    } while (assumed != old);
    unsigned long long* laddr = reinterpret_cast<unsigned long long*>(lsum_out);
    unsigned long long lold = *laddr, lassumed;
    do {
        lassumed = lold;
        lold = atomicCAS(laddr, lassumed, lassumed + (unsigned long long)xl[i]);
    } while (lassumed != lold);
}

// atomicInc wraps at a limit; atomicExch swaps values in; both return old values.
extern "C" __global__ void atomic_inc_exch(const int* __restrict__ x, unsigned* __restrict__ ctr,
                                           int* __restrict__ slot, unsigned* __restrict__ inc_old,
                                           int* __restrict__ exch_old, unsigned limit, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    inc_old[i] = atomicInc(ctr, limit);
    exch_old[i] = atomicExch(slot, x[i]);
}

// Histogram with shared-memory atomics (counts and float weights), merged into global memory.
#define NBINS 64
extern "C" __global__ void shared_histogram(const int* __restrict__ x,
                                            const float* __restrict__ w, int* __restrict__ hist,
                                            float* __restrict__ whist, int n) {
    __shared__ int counts[NBINS];
    __shared__ float weights[NBINS];
    for (int b = threadIdx.x; b < NBINS; b += blockDim.x) {
        counts[b] = 0;
        weights[b] = 0.0f;
    }
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int b = x[i] & (NBINS - 1);
        atomicAdd(&counts[b], 1);
        atomicAdd(&weights[b], w[i]);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < NBINS; b += blockDim.x) {
        atomicAdd(&hist[b], counts[b]);
        atomicAdd(&whist[b], weights[b]);
    }
}
