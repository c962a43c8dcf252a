// Warp votes and warp-wide reductions: ballot, any, all, match.any / match.all, redux.sync.
// One output row per operation: out[k * total + i].
extern "C" __global__ void warp_vote(const int* __restrict__ x, unsigned* __restrict__ out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int total = gridDim.x * blockDim.x;
    int v = x[i];
    out[0 * total + i] = __ballot_sync(0xffffffffu, v > 0);
    out[1 * total + i] = __any_sync(0xffffffffu, v == 7);
    out[2 * total + i] = __all_sync(0xffffffffu, v >= -90);
    out[3 * total + i] = (unsigned)__popc(__ballot_sync(0xffffffffu, v & 1));
}

// match.any / match.all (sm_70+): which lanes hold the same value.
extern "C" __global__ void warp_match(const int* __restrict__ x, unsigned* __restrict__ out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int total = gridDim.x * blockDim.x;
    int v = x[i];
    int pred;
    out[0 * total + i] = __match_any_sync(0xffffffffu, v & 3);
    out[1 * total + i] = __match_all_sync(0xffffffffu, v >> 8, &pred);
    out[2 * total + i] = (unsigned)pred;
}

extern "C" __global__ void warp_redux(const int* __restrict__ x, unsigned* __restrict__ out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int total = gridDim.x * blockDim.x;
    int v = x[i];
    out[0 * total + i] = (unsigned)__reduce_add_sync(0xffffffffu, v);
    out[1 * total + i] = (unsigned)__reduce_min_sync(0xffffffffu, v);
    out[2 * total + i] = (unsigned)__reduce_max_sync(0xffffffffu, v);
    out[3 * total + i] = __reduce_min_sync(0xffffffffu, (unsigned)v);
    out[4 * total + i] = __reduce_max_sync(0xffffffffu, (unsigned)v);
    out[5 * total + i] = __reduce_and_sync(0xffffffffu, (unsigned)v);
    out[6 * total + i] = __reduce_or_sync(0xffffffffu, (unsigned)v);
    out[7 * total + i] = __reduce_xor_sync(0xffffffffu, (unsigned)v);
}
