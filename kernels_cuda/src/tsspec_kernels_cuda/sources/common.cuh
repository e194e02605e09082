// Shared device helpers of the tsspec CUDA kernels (included by every family).
//
// Conventions: float32 math everywhere; weights are either float32 or bf16 stored as raw
// 16-bit words (TS_BF16_WEIGHTS), converted here so no toolkit header is needed (NVRTC
// compiles these sources with no include path at all).
#pragma once

#ifdef TS_BF16_WEIGHTS
typedef unsigned short wt_t;
__device__ __forceinline__ float wload(const wt_t* p, long long i) {
    return __uint_as_float(((unsigned int)p[i]) << 16);
}
#else
typedef float wt_t;
__device__ __forceinline__ float wload(const wt_t* p, long long i) { return p[i]; }
#endif

// +inf without <math.h> (NVRTC compiles these with no headers)
#define TS_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// torch.nn.functional.softplus with its default threshold (x > 20 passes through)
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Sum over the whole block; every thread gets the result. ``scratch`` holds >= 32 floats and
// is reused, so calls are separated by the barriers inside.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += scratch[w];
    return total;
}

// A barrier across the whole grid, for launches whose blocks are all resident at once
// (grids of at most one block per multiprocessor, see ops.resident_blocks). ``bar`` is two words, zeroed once when allocated:
// an arrival count, reset to zero by the last block to arrive, and a generation it then
// advances (each block waits for the generation it saw on arrival to change), so the buffer
// never needs clearing between barriers or launches.
__device__ __forceinline__ void grid_sync(unsigned int* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned int* gen = bar + 1;
        const unsigned int seen = *gen;
        const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
        __threadfence();
        if (atomicAdd(bar, 1u) == blocks - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (*gen == seen) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}
