// dflash_inject: PASS B of the DFlash drafter for the committed rows, every layer, one launch.
// Reproduces DFlashDraftHead.inject_rows (tsspec_block.head) on the device:
//   c = RMSNorm(fc @ features) * enc_norm                           (pass A, the encoder)
//   per layer: K = rope_neox(RMSNorm_head(W_k c + b_k) * k_norm),  V = W_v c + b_v
//   ring[slot(pos)] <- K, V, pos   (slot = pos % ring rows; a linear store: slot = pos)
// Three phases separated by grid barriers (a grid of at most one block per
// multiprocessor): 1. fc rows, one warp per output feature for all rows at once, squares into
// sumsq; 2. K/V rows of every layer, one warp per output feature; values go straight into the
// rings, keys into a scratch; 3. per (layer, row, kv head) one warp: head norm, RoPE, ring write.
// Weights are read exactly once per launch, which is the bytes floor of the pass.
#include "common.cuh"

#define INJ_THREADS 256
#define INJ_MAX_ROWS 32

__device__ __forceinline__ long long inj_slot(long long pos, int ring_rows) {
    return ring_rows > 0 ? pos % ring_rows : pos;
}

extern "C" __global__ void __launch_bounds__(INJ_THREADS) dflash_inject(
    const float* __restrict__ feat,           // [n, F] tapped target residuals, concatenated
    const wt_t* __restrict__ fc,              // [H, F]
    const wt_t* __restrict__ enc_norm,        // [H]
    const long long* __restrict__ wk_ptrs,    // [L] -> [nkv*hd, H]
    const long long* __restrict__ bk_ptrs,    // [L] -> [nkv*hd] or 0
    const long long* __restrict__ wv_ptrs,    // [L] -> [nkv*vd, H]
    const long long* __restrict__ bv_ptrs,    // [L] -> [nkv*vd] or 0
    const long long* __restrict__ knorm_ptrs, // [L] -> [hd]
    const long long* __restrict__ ring_k_ptrs,   // [L] -> float [rows_l, nkv, hd]
    const long long* __restrict__ ring_v_ptrs,   // [L] -> float [rows_l, nkv, vd]
    const long long* __restrict__ ring_pos_ptrs, // [L] -> long long [rows_l]
    const int* __restrict__ ring_rows,        // [L] ring capacity, 0 = linear store
    const long long* __restrict__ positions,  // [n] absolute positions of the rows
    float* ctx,                               // [n, H] scratch: fc output before the norm
    float* kraw,                              // [L, n, nkv*hd] scratch: keys before norm/rope
    float* sumsq,                             // [n] zero on entry, left zero
    unsigned int* bar,                        // [2] grid barrier, zero once
    int n, int F, int H, int L, int nkv, int hd, int vd, float eps, float rope_base) {
    const int lane = threadIdx.x & 31;
    const int warps_per_block = blockDim.x >> 5;
    const int gwarp = blockIdx.x * warps_per_block + (threadIdx.x >> 5);
    const int nwarps = gridDim.x * warps_per_block;

    // phase 1: ctx = features @ fc^T, one warp per output feature, all rows together
    for (int o = gwarp; o < H; o += nwarps) {
        float acc[INJ_MAX_ROWS];
#pragma unroll
        for (int r = 0; r < INJ_MAX_ROWS; ++r) acc[r] = 0.0f;
        for (int f = lane; f < F; f += 32) {
            const float w = wload(fc, (long long)o * F + f);
#pragma unroll
            for (int r = 0; r < INJ_MAX_ROWS; ++r)
                if (r < n) acc[r] += w * feat[(long long)r * F + f];
        }
#pragma unroll
        for (int r = 0; r < INJ_MAX_ROWS; ++r) {
            if (r < n) {
                const float v = warp_sum(acc[r]);
                if (lane == 0) {
                    ctx[(long long)r * H + o] = v;
                    atomicAdd(&sumsq[r], v * v);
                }
            }
        }
    }
    grid_sync(bar);

    // phase 2: K and V rows of every layer from RMSNorm(ctx) (the norm is linear per row, so
    // the row's 1/rms multiplies the finished dot product)
    const int kw = nkv * hd, vw = nkv * vd, per_layer = kw + vw;
    for (int item = gwarp; item < L * per_layer; item += nwarps) {
        const int l = item / per_layer, o = item % per_layer;
        const bool is_key = o < kw;
        const wt_t* w = reinterpret_cast<const wt_t*>(is_key ? wk_ptrs[l] : wv_ptrs[l]);
        const int row = is_key ? o : o - kw;
        float acc[INJ_MAX_ROWS];
#pragma unroll
        for (int r = 0; r < INJ_MAX_ROWS; ++r) acc[r] = 0.0f;
        for (int i = lane; i < H; i += 32) {
            const float wi = wload(w, (long long)row * H + i) * wload(enc_norm, i);
#pragma unroll
            for (int r = 0; r < INJ_MAX_ROWS; ++r)
                if (r < n) acc[r] += wi * ctx[(long long)r * H + i];
        }
        const long long bias_ptr = is_key ? bk_ptrs[l] : bv_ptrs[l];
        const float bias = bias_ptr ? wload(reinterpret_cast<const wt_t*>(bias_ptr), row) : 0.0f;
#pragma unroll
        for (int r = 0; r < INJ_MAX_ROWS; ++r) {
            if (r < n) {
                const float dot = warp_sum(acc[r]);
                if (lane == 0) {
                    const float v = dot * rsqrtf(sumsq[r] / H + eps) + bias;
                    if (is_key) {
                        kraw[((long long)l * n + r) * kw + row] = v;
                    } else {
                        float* ring_v = reinterpret_cast<float*>(ring_v_ptrs[l]);
                        ring_v[inj_slot(positions[r], ring_rows[l]) * vw + row] = v;
                    }
                }
            }
        }
    }
    grid_sync(bar);

    // phase 3: head RMSNorm, NeoX RoPE (angles in double, as the torch path), ring write
    const int half = hd / 2;
    for (int item = gwarp; item < L * n * nkv; item += nwarps) {
        const int l = item / (n * nkv), r = (item / nkv) % n, head = item % nkv;
        const float* k = kraw + ((long long)l * n + r) * kw + head * hd;
        const wt_t* kn = reinterpret_cast<const wt_t*>(knorm_ptrs[l]);
        float ss = 0.0f;
        for (int d = lane; d < hd; d += 32) ss += k[d] * k[d];
        const float rs = rsqrtf(warp_sum(ss) / hd + eps);
        const long long pos = positions[r];
        const long long slot = inj_slot(pos, ring_rows[l]);
        float* ring_k = reinterpret_cast<float*>(ring_k_ptrs[l]) + (slot * nkv + head) * hd;
        for (int d = lane; d < half; d += 32) {
            const float x1 = k[d] * rs * wload(kn, d), x2 = k[d + half] * rs * wload(kn, d + half);
            const double angle = (double)pos * pow((double)rope_base, -2.0 * d / hd);
            const float c = (float)cos(angle), s = (float)sin(angle);
            ring_k[d] = x1 * c - x2 * s;
            ring_k[d + half] = x2 * c + x1 * s;
        }
        if (head == 0 && lane == 0) reinterpret_cast<long long*>(ring_pos_ptrs[l])[slot] = pos;
    }
    if (blockIdx.x == 0 && (int)threadIdx.x < n) sumsq[threadIdx.x] = 0.0f;  // read only in phase 2
}
