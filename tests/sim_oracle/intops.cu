// Integer arithmetic corner cases, one result row per operation: out[k * n + i].
// The host keeps b != 0 and avoids INT_MIN / -1 (undefined in C).

// PTX corner cases C cannot express without undefined behaviour, through inline PTX.
__device__ __forceinline__ unsigned ptx3(int which, unsigned a, unsigned b, unsigned c) {
    unsigned d = 0;
    switch (which) {
        case 0: asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); break;
        case 1: asm("bfe.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); break;
        case 2: asm("bfe.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); break;
        case 3: asm("mul24.lo.s32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); break;
        case 4: asm("mul24.hi.s32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); break;
        case 5: asm("shl.b32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); break;
        case 6: asm("shr.u32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); break;
        case 7: asm("shr.s32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); break;
        default: break;
    }
    return d;
}

__device__ __forceinline__ unsigned bfi(unsigned a, unsigned b, unsigned pos, unsigned len) {
    unsigned d;
    asm("bfi.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(pos), "r"(len));
    return d;
}

extern "C" __global__ void int32_ops(const int* __restrict__ a, const int* __restrict__ b,
                                     int* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int x = a[i], y = b[i];
    const unsigned ux = (unsigned)x, uy = (unsigned)y;
    int* o = out + i;
    int k = 0;
    o[n * k++] = x / y;
    o[n * k++] = x % y;
    o[n * k++] = (int)(ux / uy);
    o[n * k++] = (int)(ux % uy);
    o[n * k++] = x >> (y & 31);
    o[n * k++] = (int)(ux >> (uy & 31));
    o[n * k++] = (int)(ux << (uy & 31));
    o[n * k++] = __popc(ux);
    o[n * k++] = __clz(x);
    o[n * k++] = (int)__brev(ux);
    o[n * k++] = (int)__byte_perm(ux, uy, uy >> 16);
    o[n * k++] = __ffs(x);
    o[n * k++] = __mulhi(x, y);
    o[n * k++] = (int)__umulhi(ux, uy);
    o[n * k++] = __mul24(x, y);
    o[n * k++] = (int)__umul24(ux, uy);
    o[n * k++] = __hadd(x, y);
    o[n * k++] = __rhadd(x, y);
    o[n * k++] = (int)__uhadd(ux, uy);
    o[n * k++] = (int)__funnelshift_l(ux, uy, uy >> 8);
    o[n * k++] = (int)__funnelshift_lc(ux, uy, uy >> 8);
    o[n * k++] = (int)__funnelshift_r(ux, uy, uy >> 8);
    o[n * k++] = (int)__funnelshift_rc(ux, uy, uy >> 8);
    o[n * k++] = min(x, y);
    o[n * k++] = max(x, y);
    o[n * k++] = (int)min(ux, uy);
    o[n * k++] = abs(x);
    o[n * k++] = (int)((ux >> 7) & 0x1ffu);          // bit-field extract
    o[n * k++] = (int)((ux & ~0x3f0u) | ((uy & 0x3fu) << 4));  // bit-field insert
    o[n * k++] = (int)(signed char)x;
    o[n * k++] = (int)(short)x;
    o[n * k++] = (int)(unsigned short)x;
    o[n * k++] = x * y + (x ^ y);
    o[n * k++] = __sad(x, y, ux >> 4);
    // Inline PTX: raw prmt selector (msb of a nibble replicates the sign), bit fields with
    // positions and lengths past the register (pos, len in 0..63), 24-bit multiplies, and
    // shifts by 0..63 (PTX clamps shift amounts to the register width).
    const unsigned pos = uy & 63u, len = (uy >> 8) & 63u;
    o[n * k++] = (int)ptx3(0, ux, uy, uy >> 12);
    o[n * k++] = (int)ptx3(1, ux, pos, len);
    o[n * k++] = (int)ptx3(2, ux, pos, len);
    o[n * k++] = (int)ptx3(3, ux, uy, 0);
    o[n * k++] = (int)ptx3(4, ux, uy, 0);
    o[n * k++] = (int)ptx3(5, ux, pos, 0);
    o[n * k++] = (int)ptx3(6, ux, pos, 0);
    o[n * k++] = (int)ptx3(7, ux, pos, 0);
    o[n * k++] = (int)bfi(uy >> 16, ux, pos, len);
}

extern "C" __global__ void int64_ops(const long long* __restrict__ a,
                                     const long long* __restrict__ b, long long* __restrict__ out,
                                     int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long x = a[i], y = b[i];
    const unsigned long long ux = (unsigned long long)x, uy = (unsigned long long)y;
    long long* o = out + i;
    int k = 0;
    o[n * k++] = x / y;
    o[n * k++] = x % y;
    o[n * k++] = (long long)(ux / uy);
    o[n * k++] = (long long)(ux % uy);
    o[n * k++] = x * y;
    o[n * k++] = __mul64hi(x, y);
    o[n * k++] = (long long)__umul64hi(ux, uy);
    o[n * k++] = x >> (y & 63);
    o[n * k++] = (long long)(ux >> (uy & 63));
    o[n * k++] = (long long)(ux << (uy & 63));
    o[n * k++] = __popcll(x);
    o[n * k++] = __clzll(x);
    o[n * k++] = (long long)__brevll(ux);
    o[n * k++] = __ffsll(x);
    o[n * k++] = (long long)(int)x * (long long)(int)y;  // mul.wide.s32
    o[n * k++] = (long long)((unsigned long long)(unsigned)x * (unsigned)y);  // mul.wide.u32
    o[n * k++] = (long long)(x < y);
    o[n * k++] = (long long)(ux < uy);
}
