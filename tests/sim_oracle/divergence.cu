// Divergent control flow: early returns, if/else on the thread id, data-dependent loop trip
// counts, break/continue, a switch, and a barrier after the branches reconverge.

extern "C" __global__ void divergent(const int* __restrict__ x, int* __restrict__ out,
                                     int* __restrict__ steps, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = x[i];
    if (v < 0) {
        out[i] = -v * 3;
        steps[i] = -1;
        return;
    }
    int r;
    if (threadIdx.x & 1)
        r = v * 7 + 1;
    else
        r = v ^ 0x5a5a;
    // Collatz: the trip count depends on the data.
    unsigned c = (unsigned)v;
    int s = 0;
    while (c > 1 && s < 300) {
        c = (c & 1) ? 3 * c + 1 : c >> 1;
        ++s;
    }
    int acc = 0;
    for (int j = 0; j < (v & 31); ++j) {
        if (j % 3 == 2) continue;
        acc += j * r;
        if (acc > 100000) break;
    }
    switch (v % 5) {
        case 0: acc += 1; break;
        case 1: acc -= 7; break;
        case 2: acc *= 3; break;
        case 3: acc ^= 0xff; break;
        default: acc = ~acc; break;
    }
    out[i] = r + acc;
    steps[i] = s;
}

// Threads write shared memory along different paths (one path loops a data-dependent number of
// times), meet at a barrier, then read what another thread (another warp) wrote.
extern "C" __global__ void divergent_shared(const int* __restrict__ x, int* __restrict__ out) {
    __shared__ int sh[128];
    int tid = threadIdx.x;
    int v = x[blockIdx.x * blockDim.x + tid];
    int w;
    if (tid % 3 == 0) {
        w = v * 2;
    } else if (v & 1) {
        w = 0;
        for (int k = 0; k < (v & 15); ++k) w += k ^ v;
    } else {
        w = -v;
    }
    sh[tid] = w;
    __syncthreads();
    out[blockIdx.x * blockDim.x + tid] = sh[(tid + 37) % blockDim.x] - sh[tid];
}

// Warp-level work inside divergent code: shuffles, ballots and __activemask over the lanes of
// one side of a branch only (the member masks name exactly those lanes).
extern "C" __global__ void divergent_warp(const int* __restrict__ x, unsigned* __restrict__ out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int total = gridDim.x * blockDim.x;
    int lane = threadIdx.x & 31;
    int v = x[i];
    unsigned a, b, c;
    if (lane < 16) {
        a = __activemask();
        b = (unsigned)__shfl_xor_sync(0x0000ffffu, v, 1);
        c = __ballot_sync(0x0000ffffu, v > 0);
    } else {
        a = __activemask();
        b = (unsigned)__shfl_down_sync(0xffff0000u, v, 3, 16);
        c = __ballot_sync(0xffff0000u, v < 0);
    }
    out[0 * total + i] = a;
    out[1 * total + i] = b;
    out[2 * total + i] = c;
}
