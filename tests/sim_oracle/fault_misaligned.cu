// Planted fault (with off = 1): a float4 load from x + off, 4 bytes past a 16-byte boundary.
// With off a multiple of 4 the same kernel is correct: y[i] = sum of x[off + 4i .. off + 4i + 3].
extern "C" __global__ void misaligned_v4(const float* __restrict__ x, float* __restrict__ y,
                                         int off) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float4 v = reinterpret_cast<const float4*>(x + off)[i];
    y[i] = (v.x + v.y) + (v.z + v.w);
}
