// The Gated DeltaNet recurrence over a few rows, shared by gdn_verify (k+1 verify rows, a state
// slot per row) and gdn_step (one row, the deferred commit). Reproduces the torch path of
// tsspec_model_qwen35.deltanet (DeltaNetLayer._prepare + delta_rule_rows) from the projections
// on: causal depthwise conv over [conv state; new rows], SiLU, L2-normalised q (scaled) and k
// of the value head's key head, beta = sigmoid(b), g = a * softplus(alpha + dt_bias), then per
// row  S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q.
//
// Work split: block (x, h) owns value head h and the GDN_COLS state columns j = 32 x + lane;
// warp w of the block holds state rows i = w, w + GDN_WARPS, ... of those columns in
// registers, so S^T k and S^T q are per-thread partial sums reduced across the warps in shared
// memory, and every state write is a coalesced 128-byte row segment. Each thread reads and
// writes only its own state elements, so ``state_in`` may alias a slot being written (a
// one-row step in place, or a verify that starts from slot m of the previous verify).
#pragma once
#include "common.cuh"

#define GDN_COLS 32
#define GDN_WARPS 8
#define GDN_THREADS (GDN_COLS * GDN_WARPS)
#define GDN_MAX_PER_THREAD 32  // dk <= GDN_WARPS * GDN_MAX_PER_THREAD = 256

// pre-activation conv output of channel ch for row t: taps over rows t .. t+K-1 of the window
// [conv_in (K-1 rows); mixed (rows)]
__device__ __forceinline__ float gdn_conv_at(const float* mixed, const float* conv_in, const float* conv_w,
                                             int t, int ch, int conv_dim, int K) {
    float acc = 0.0f;
    for (int tap = 0; tap < K; ++tap) {
        const int r = t + tap;
        const float x = r < K - 1 ? conv_in[(long long)r * conv_dim + ch]
                                  : mixed[(long long)(r - (K - 1)) * conv_dim + ch];
        acc += x * conv_w[(long long)ch * K + tap];
    }
    return acc;
}

// shared floats the body needs
__host__ __device__ __forceinline__ int gdn_shared_floats(int dk) { return 2 * dk + GDN_WARPS * GDN_COLS + 32; }

__device__ __forceinline__ void gdn_rows_body(
    const float* mixed,         // [rows, conv_dim] pre-conv rows (qkv part of in_proj)
    const float* conv_in,       // [K-1, conv_dim] conv state before the rows (never written)
    const float* conv_w,        // [conv_dim, K] depthwise kernel, tap K-1 = current row
    const float* beta_in,       // [rows, nv] ssm_beta logits
    const float* alpha_in,      // [rows, nv] ssm_alpha logits
    const float* a_neg,         // [nv] -exp(A_log)
    const float* dt_bias,       // [nv]
    const long long* key_index, // [nv] key head read by each value head
    const float* state_in,      // [nv, dk, dv] state before the rows
    float* out,                 // [rows, nv, dv] o = S^T q per row (before the gated norm)
    float* slots,               // [rows, nv, dk, dv] the state after each row
    float* window_out,          // rows window_skip .. K-2+rows of [conv_in; mixed], or null
    int window_skip, int rows, int nk, int nv, int dk, int dv, int K, float scale) {
    extern __shared__ float smem[];
    float* qk = smem;                            // [2 dk] this row's q then k (normalised later)
    float* part = qk + 2 * dk;                   // [GDN_WARPS, GDN_COLS] partial sums
    float* red = part + GDN_WARPS * GDN_COLS;    // [32] block_sum scratch
    const int h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j = blockIdx.x * GDN_COLS + lane;
    const bool col = j < dv;
    const int key_dim = nk * dk, conv_dim = 2 * key_dim + nv * dv;
    const int kh = (int)key_index[h];
    const long long head_size = (long long)dk * dv, state_size = (long long)nv * head_size;

    if (window_out != nullptr) {  // the conv window (slot m's conv state is rows m+1 .. m+K-1)
        const long long total = (long long)(K - 1 + rows - window_skip) * conv_dim;
        const long long stride = (long long)gridDim.x * gridDim.y * blockDim.x;
        for (long long e = ((long long)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
             e < total; e += stride) {
            const long long r = e / conv_dim + window_skip;
            const long long c = e % conv_dim;
            window_out[e] = r < K - 1 ? conv_in[r * conv_dim + c] : mixed[(r - (K - 1)) * conv_dim + c];
        }
    }

    float S[GDN_MAX_PER_THREAD];  // S[s] = state[h][warp + GDN_WARPS s][j]
    const float* src = state_in + h * head_size;
#pragma unroll
    for (int s = 0; s < GDN_MAX_PER_THREAD; ++s) {
        const int i = warp + GDN_WARPS * s;
        S[s] = (col && i < dk) ? src[(long long)i * dv + j] : 0.0f;
    }

    for (int t = 0; t < rows; ++t) {
        float sq = 0.0f, sk = 0.0f;
        for (int c = threadIdx.x; c < 2 * dk; c += blockDim.x) {
            const int ch = c < dk ? kh * dk + c : key_dim + kh * dk + (c - dk);
            const float x = silu(gdn_conv_at(mixed, conv_in, conv_w, t, ch, conv_dim, K));
            qk[c] = x;
            if (c < dk) sq += x * x; else sk += x * x;
        }
        const float rq = rsqrtf(block_sum(sq, red) + 1e-6f);  // ops.L2_EPS
        const float rk = rsqrtf(block_sum(sk, red) + 1e-6f);
        const float beta = sigmoid(beta_in[t * nv + h]);
        const float decay = expf(a_neg[h] * softplus(alpha_in[t * nv + h] + dt_bias[h]));
        const float vj = col ? silu(gdn_conv_at(mixed, conv_in, conv_w, t, 2 * key_dim + h * dv + j, conv_dim, K)) : 0.0f;

        float p = 0.0f;  // this thread's share of (S^T k)[j]
#pragma unroll
        for (int s = 0; s < GDN_MAX_PER_THREAD; ++s) {
            const int i = warp + GDN_WARPS * s;
            if (i < dk) {
                S[s] *= decay;
                p += S[s] * (qk[dk + i] * rk);
            }
        }
        part[warp * GDN_COLS + lane] = p;
        __syncthreads();
        float recalled = 0.0f;
        for (int w = 0; w < GDN_WARPS; ++w) recalled += part[w * GDN_COLS + lane];
        const float delta = (vj - recalled) * beta;
        __syncthreads();  // every warp has read ``part``

        float o = 0.0f;  // this thread's share of (S^T q)[j]
        float* dst = slots + t * state_size + h * head_size;
#pragma unroll
        for (int s = 0; s < GDN_MAX_PER_THREAD; ++s) {
            const int i = warp + GDN_WARPS * s;
            if (i < dk) {
                S[s] += (qk[dk + i] * rk) * delta;
                o += S[s] * (qk[i] * rq * scale);
                if (col) dst[(long long)i * dv + j] = S[s];
            }
        }
        part[warp * GDN_COLS + lane] = o;
        __syncthreads();
        if (warp == 0 && col) {
            float total = 0.0f;
            for (int w = 0; w < GDN_WARPS; ++w) total += part[w * GDN_COLS + lane];
            out[((long long)t * nv + h) * dv + j] = total;
        }
        __syncthreads();  // ``qk`` and ``part`` are rewritten by the next row
    }
}
