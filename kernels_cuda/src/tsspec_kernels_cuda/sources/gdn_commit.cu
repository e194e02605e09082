// gdn_commit: make slot m of the last verify live, for every GDN layer in one launch (device to
// device, no host round trip). gdn_step: the deferred one-row step: one plain-decode row that
// starts from slot m of the last verify (the commit it defers) or from the live state, and
// writes the new state and conv state into the live buffers.
#include "gdn_common.cuh"

// Launch: grid (blocks, layers), any block size. Pointer tables hold one address per layer.
extern "C" __global__ void gdn_commit(
    const long long* __restrict__ slot_ptrs,    // [layers] -> [rows, nv, dk, dv] slot buffers
    const long long* __restrict__ window_ptrs,  // [layers] -> [K-1+rows, conv_dim] verify windows
    const long long* __restrict__ state_ptrs,   // [layers] -> [nv, dk, dv] live state
    const long long* __restrict__ conv_ptrs,    // [layers] -> [K-1, conv_dim] live conv state
    int m, long long state_size, int conv_dim, int K) {
    const int layer = blockIdx.y;
    const float* slot = reinterpret_cast<const float*>(slot_ptrs[layer]) + (long long)m * state_size;
    float* state = reinterpret_cast<float*>(state_ptrs[layer]);
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const bool wide = (state_size % 4 == 0) && ((reinterpret_cast<unsigned long long>(slot) | reinterpret_cast<unsigned long long>(state)) % 16 == 0);
    if (wide) {  // 16-byte loads and stores
        const float4* s4 = reinterpret_cast<const float4*>(slot);
        float4* d4 = reinterpret_cast<float4*>(state);
        for (long long e = start; e < state_size / 4; e += stride) d4[e] = s4[e];
    } else {
        for (long long e = start; e < state_size; e += stride) state[e] = slot[e];
    }
    if (K > 1) {
        const float* window = reinterpret_cast<const float*>(window_ptrs[layer]) + (long long)(m + 1) * conv_dim;
        float* conv = reinterpret_cast<float*>(conv_ptrs[layer]);
        const long long total = (long long)(K - 1) * conv_dim;
        for (long long e = start; e < total; e += stride) conv[e] = window[e];
    }
}

// Launch: grid (ceil(dv / 32), nv), block 256, shared gdn_shared_floats(dk) * 4 bytes.
// ``state_in`` may be ``state_out`` (no pending slot: an in-place step); ``conv_in`` must not
// overlap ``conv_out`` (the caller double-buffers the live conv state).
extern "C" __global__ void __launch_bounds__(GDN_THREADS) gdn_step(
    const float* __restrict__ mixed, const float* __restrict__ conv_in, const float* __restrict__ conv_w,
    const float* __restrict__ beta_in, const float* __restrict__ alpha_in, const float* __restrict__ a_neg,
    const float* __restrict__ dt_bias, const long long* __restrict__ key_index, const float* state_in,
    float* __restrict__ out, float* state_out, float* __restrict__ conv_out, int nk, int nv, int dk, int dv,
    int K, float scale) {
    gdn_rows_body(mixed, conv_in, conv_w, beta_in, alpha_in, a_neg, dt_bias, key_index, state_in, out, state_out,
                  conv_out, 1, 1, nk, nv, dk, dv, K, scale);
}
