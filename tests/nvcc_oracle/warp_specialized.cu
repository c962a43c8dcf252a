// A warp-specialized pipeline for sm_90a, compiled to PTX by nvcc (generate_sm90.py) and run
// on the simulator by tests/test_nvcc_warp_specialized.py against NumPy. Block: 384 threads,
// a producer warp group (128 threads: one thread issues, the rest exit) and two consumer warp
// groups (256 threads). The producer streams tiles of 256 floats into a 3-stage ring with
// bulk copies that complete transaction bytes on a "full" mbarrier per stage; the consumers
// wait on "full", accumulate, sync their warp group on a named barrier (ids 2 and 3, 128
// threads), and one thread per warp group arrives on the stage's "empty" mbarrier. At the
// end the 256 consumer threads exchange sums under named barrier 1 (256 threads):
// out[b][c] = acc[c] + acc[255 - c], acc[c] = sum_t x[b][t][c] * w[t].
#include <cstdint>

#define TILE 256
#define STAGES 3

__device__ __forceinline__ uint32_t smem(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem(bar)) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint64_t *bar, unsigned parity) {
    uint32_t ok;
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(ok)
        : "r"(smem(bar)), "r"(parity)
        : "memory");
    return ok != 0;
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
    while (!mbar_try_wait(bar, parity)) {
    }
}

__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes,
                                          uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];" ::"r"(smem(dst)),
        "l"(src), "r"(bytes), "r"(smem(bar))
        : "memory");
}

__device__ __forceinline__ void named_sync(unsigned id, unsigned threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

extern "C" __global__ void __launch_bounds__(384)
    ws_pipeline(const float *__restrict__ x, const float *__restrict__ w,
                float *__restrict__ out, int ntiles) {
    __shared__ alignas(128) float stage[STAGES][TILE];
    __shared__ alignas(8) uint64_t full[STAGES];
    __shared__ alignas(8) uint64_t empty[STAGES];
    __shared__ float red[TILE];
    int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 2);  // one arrival per consumer warp group
        }
    }
    __syncthreads();
    const float *xb = x + static_cast<size_t>(blockIdx.x) * ntiles * TILE;
    if (tid < 128) {  // the producer warp group
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (tid == 0) {
            for (int t = 0; t < ntiles; ++t) {
                int s = t % STAGES;
                unsigned phase = (t / STAGES) & 1;
                mbar_wait(&empty[s], phase ^ 1);  // a fresh barrier passes parity 1
                mbar_expect_tx(&full[s], TILE * sizeof(float));
                bulk_load(stage[s], xb + static_cast<size_t>(t) * TILE, TILE * sizeof(float),
                          &full[s]);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    int c = tid - 128;
    int group = c / 128;
    float acc = 0.0f;
    for (int t = 0; t < ntiles; ++t) {
        int s = t % STAGES;
        unsigned phase = (t / STAGES) & 1;
        mbar_wait(&full[s], phase);
        acc = fmaf(stage[s][c], w[t], acc);
        named_sync(2 + group, 128);  // the warp group has read the stage
        if (c % 128 == 0) mbar_arrive(&empty[s]);
    }
    red[c] = acc;
    named_sync(1, 256);
    out[static_cast<size_t>(blockIdx.x) * TILE + c] = acc + red[TILE - 1 - c];
}
