// Warp shuffles in every mode, with sub-warp widths and per-lane source lanes.
// Each thread handles one element; the launch covers whole warps (no bounds checks needed).
extern "C" __global__ void shfl_idx(const int* __restrict__ in, const int* __restrict__ src,
                                    int* __restrict__ out, int width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = __shfl_sync(0xffffffffu, in[i], src[i], width);
}

// The same with a width known at compile time (the clamp operand becomes an immediate).
extern "C" __global__ void shfl_idx_w8(const float* __restrict__ in, const int* __restrict__ src,
                                       float* __restrict__ out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = __shfl_sync(0xffffffffu, in[i], src[i], 8);
}

extern "C" __global__ void shfl_up(const float* __restrict__ in, float* __restrict__ out,
                                   unsigned delta, int width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = __shfl_up_sync(0xffffffffu, in[i], delta, width);
}

extern "C" __global__ void shfl_down(const int* __restrict__ in, int* __restrict__ out,
                                     unsigned delta, int width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = __shfl_down_sync(0xffffffffu, in[i], delta, width);
}

extern "C" __global__ void shfl_xor(const float* __restrict__ in, float* __restrict__ out,
                                    int lane_mask, int width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = __shfl_xor_sync(0xffffffffu, in[i], lane_mask, width);
}

// A 64-bit value moves as two 32-bit shuffles.
extern "C" __global__ void shfl_xor_i64(const long long* __restrict__ in,
                                        long long* __restrict__ out, int lane_mask, int width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = __shfl_xor_sync(0xffffffffu, in[i], lane_mask, width);
}
