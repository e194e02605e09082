// dflash_draft_block: the fused pieces of PASS C (one block of B rows, DFlashDraftHead._layer).
// The projections stay on the library GEMMs; fused here are the two steps a library runs as
// many small ops:
//   dflash_block_attention  the block's queries over [ring window | block] with the drafter's
//                           visibility (positions below the block start, sliding |q - k| <= w,
//                           non-causal inside the block), GQA, online softmax: one pass over the
//                           ring, no gather, no mask tensor
//   dflash_grouped_conv     DFlash2's grouped dynamic depthwise conv along the block (causal,
//                           no wrap), with the residual add of the output side fused in
#include "common.cuh"

#define ATT_WARPS 4
#define ATT_MAX_PER_LANE 8  // head sizes up to 256

// Launch: grid (B, nh), block 128, shared (ATT_WARPS * (2 + vd)) floats.
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32) dflash_block_attention(
    const float* __restrict__ q,            // [B, nh, hd] after q_norm and RoPE
    const float* __restrict__ ctx_k,        // [R, nkv, hd] the layer's ring (or linear store)
    const float* __restrict__ ctx_v,        // [R, nkv, vd]
    const long long* __restrict__ ctx_pos,  // [R] position held by each slot, -1 = empty
    const float* __restrict__ blk_k,        // [B, nkv, hd] the block's own keys (after RoPE)
    const float* __restrict__ blk_v,        // [B, nkv, vd]
    float* __restrict__ out,                // [B, nh * vd]
    int B, int R, int nh, int nkv, int hd, int vd, long long start, int window, float scale) {
    extern __shared__ float smem[];
    const int b = blockIdx.x, h = blockIdx.y, kvh = h / (nh / nkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long qpos = start + b;
    const long long lo = window >= 0 ? (start - window > 0 ? start - window : 0) : 0;
    float qr[ATT_MAX_PER_LANE], acc[ATT_MAX_PER_LANE];
#pragma unroll
    for (int u = 0; u < ATT_MAX_PER_LANE; ++u) {
        const int d = lane + 32 * u;
        qr[u] = d < hd ? q[((long long)b * nh + h) * hd + d] : 0.0f;
        acc[u] = 0.0f;
    }
    float m = -TS_INF, l = 0.0f;
    for (int j = warp; j < R + B; j += ATT_WARPS) {
        const float* kr;
        const float* vr;
        if (j < R) {
            const long long p = ctx_pos[j];
            if (p < lo || p >= start) continue;  // empty (-1), outside the window, or not context
            if (window >= 0 && (qpos - p > window || p - qpos > window)) continue;
            kr = ctx_k + ((long long)j * nkv + kvh) * hd;
            vr = ctx_v + ((long long)j * nkv + kvh) * vd;
        } else {
            const int jb = j - R;
            if (window >= 0 && (b - jb > window || jb - b > window)) continue;
            kr = blk_k + ((long long)jb * nkv + kvh) * hd;
            vr = blk_v + ((long long)jb * nkv + kvh) * vd;
        }
        float dot = 0.0f;
#pragma unroll
        for (int u = 0; u < ATT_MAX_PER_LANE; ++u) {
            const int d = lane + 32 * u;
            if (d < hd) dot += qr[u] * kr[d];
        }
        const float s = warp_sum(dot) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int u = 0; u < ATT_MAX_PER_LANE; ++u) {
            const int d = lane + 32 * u;
            if (d < vd) acc[u] = acc[u] * corr + p * vr[d];
        }
        m = m_new;
    }
    float* wm = smem;                 // [ATT_WARPS]
    float* wl = wm + ATT_WARPS;       // [ATT_WARPS]
    float* wacc = wl + ATT_WARPS;     // [ATT_WARPS, vd]
    if (lane == 0) { wm[warp] = m; wl[warp] = l; }
#pragma unroll
    for (int u = 0; u < ATT_MAX_PER_LANE; ++u) {
        const int d = lane + 32 * u;
        if (d < vd) wacc[warp * vd + d] = acc[u];
    }
    __syncthreads();
    float gm = -TS_INF;
    for (int w = 0; w < ATT_WARPS; ++w) gm = fmaxf(gm, wm[w]);
    float total = 0.0f;
    for (int w = 0; w < ATT_WARPS; ++w) total += wm[w] == -TS_INF ? 0.0f : wl[w] * expf(wm[w] - gm);
    for (int d = threadIdx.x; d < vd; d += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w)
            if (wm[w] != -TS_INF) sum += wacc[w * vd + d] * expf(wm[w] - gm);
        out[(long long)b * nh * vd + (long long)h * vd + d] = sum / total;
    }
}

// out[r][c] = residual[r][c] + sum_{t < K, t <= r} (base[t][c] + coef[r][t][c / group]) x[r-t][c]
// Launch: 1-D, one thread per (row, channel).
extern "C" __global__ void dflash_grouped_conv(
    const float* __restrict__ x,         // [B, H]
    const float* __restrict__ coef,      // [B, K, G] rows ``coef_stride`` floats apart
    long long coef_stride,
    const float* __restrict__ base,      // [K, H]
    const float* __restrict__ residual,  // [B, H] or null
    float* __restrict__ out,             // [B, H]
    int B, int H, int K, int group_size) {
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)B * H) return;
    const int r = (int)(e / H), c = (int)(e % H), g = c / group_size;
    const float* cr = coef + r * coef_stride;
    const int G = H / group_size;
    const float x0 = x[e];
    float acc = base[c] * x0 + cr[g] * x0;
    for (int t = 1; t < K && t <= r; ++t)
        acc += (base[(long long)t * H + c] + cr[t * G + g]) * x[(long long)(r - t) * H + c];
    out[e] = residual != nullptr ? residual[e] + acc : acc;
}
