// selector_lattice: DFlash2's candidate lattice for one block in one launch, written compactly
// so the host walk reads back k + k*k*(n-1) floats (plus the n*k candidate ids) instead of
// [n, vocab] logits. Reproduces tsspec_block.selector.selector_lattice:
//   proj_e = P h_e;  (unary_e, cand_e) = top-k(logits_e)  (best first, ties to the lower id)
//   first[c]        = unary_0[c] + sum_r A[anchor]_r proj_0,r B[cand_0[c]]_r
//   trans[e-1][i][c] = unary_e[c] + sum_r A[cand_{e-1}[i]]_r proj_e,r B[cand_e[c]]_r
// One block per row; a grid barrier separates the per-row top-k from the pair scores, which
// read the previous row's candidates (n blocks, all resident at once).
#include "common.cuh"

#define SEL_THREADS 256
#define SEL_MAX_RANK 256

// (value, id) ordering of top-k: larger value first, then smaller id
__device__ __forceinline__ bool sel_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

extern "C" __global__ void __launch_bounds__(SEL_THREADS) selector_lattice(
    const float* __restrict__ logits,  // [n, V] after the target's logit transform
    const float* __restrict__ hidden,  // [n, Hd] final-normed drafter rows
    const float* __restrict__ P,       // [r, Hd] hidden projection
    const float* __restrict__ A,       // [V, r] predecessor codebook
    const float* __restrict__ Bc,      // [V, r] successor codebook
    int* __restrict__ cand,            // [n, k] out: candidate ids, best first
    float* __restrict__ unary,         // [n, k] scratch: their logits
    float* __restrict__ first,         // [k] out
    float* __restrict__ trans,         // [n-1, k, k] out
    unsigned int* bar,                 // [2] grid barrier
    int n, int V, int Hd, int r, int k, long long anchor) {
    __shared__ float proj[SEL_MAX_RANK];
    __shared__ float red_v[SEL_THREADS / 32];
    __shared__ int red_i[SEL_THREADS / 32];
    const int e = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;

    for (int q = warp; q < r; q += warps) {  // proj_e = P h_e
        float acc = 0.0f;
        for (int i = lane; i < Hd; i += 32) acc += P[(long long)q * Hd + i] * hidden[(long long)e * Hd + i];
        acc = warp_sum(acc);
        if (lane == 0) proj[q] = acc;
    }

    const float* row = logits + (long long)e * V;  // top-k: k passes, each the best below the last
    float prev_v = TS_INF;
    int prev_i = -1;
    for (int c = 0; c < k; ++c) {
        float best_v = -TS_INF;
        int best_i = V;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const float v = row[i];
            const bool below = v < prev_v || (v == prev_v && i > prev_i);
            if (below && sel_better(v, i, best_v, best_i)) { best_v = v; best_i = i; }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best_v, offset);
            const int oi = __shfl_xor_sync(0xffffffffu, best_i, offset);
            if (sel_better(ov, oi, best_v, best_i)) { best_v = ov; best_i = oi; }
        }
        if (lane == 0) { red_v[warp] = best_v; red_i[warp] = best_i; }
        __syncthreads();
        best_v = red_v[0];
        best_i = red_i[0];
        for (int w = 1; w < warps; ++w)
            if (sel_better(red_v[w], red_i[w], best_v, best_i)) { best_v = red_v[w]; best_i = red_i[w]; }
        if (threadIdx.x == 0) { cand[e * k + c] = best_i; unary[e * k + c] = best_v; }
        prev_v = best_v;
        prev_i = best_i;
        __syncthreads();  // red_* are rewritten by the next pass
    }
    grid_sync(bar);

    // pair scores: row 0 against the anchor, row e against each candidate of row e-1
    const int pairs = e == 0 ? k : k * k;
    for (int item = warp; item < pairs; item += warps) {
        const int i = item / k, c = item % k;
        const long long prev = e == 0 ? anchor : (long long)cand[(e - 1) * k + i];
        const long long succ = cand[e * k + c];
        float acc = 0.0f;
        for (int q = lane; q < r; q += 32) acc += Bc[succ * r + q] * (A[prev * r + q] * proj[q]);
        acc = warp_sum(acc);
        if (lane == 0) {
            const float score = unary[e * k + c] + acc;
            if (e == 0) first[c] = score;
            else trans[((long long)(e - 1) * k + i) * k + c] = score;
        }
    }
}
