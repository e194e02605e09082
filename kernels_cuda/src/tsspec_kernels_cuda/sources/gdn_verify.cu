// gdn_verify: the k+1 verify rows of one GDN layer in one launch. Reads the live state (never
// writes it), emits the output rows, the state after EVERY row into its own slot, and the conv
// window [conv state; new rows] whose rows m+1 .. m+K-1 are slot m's conv state. A rejected
// tail then costs nothing: the live state is still the pre-verify state, and keeping m+1 rows
// is gdn_commit of slot m (or a gdn_step that starts from it).
// Launch: grid (ceil(dv / 32), nv), block 256, shared gdn_shared_floats(dk) * 4 bytes.
#include "gdn_common.cuh"

extern "C" __global__ void __launch_bounds__(GDN_THREADS) gdn_verify(
    const float* __restrict__ mixed, const float* __restrict__ conv_in, const float* __restrict__ conv_w,
    const float* __restrict__ beta_in, const float* __restrict__ alpha_in, const float* __restrict__ a_neg,
    const float* __restrict__ dt_bias, const long long* __restrict__ key_index, const float* state_in,
    float* __restrict__ out, float* slots, float* __restrict__ window, int rows, int nk, int nv, int dk,
    int dv, int K, float scale) {
    gdn_rows_body(mixed, conv_in, conv_w, beta_in, alpha_in, a_neg, dt_bias, key_index, state_in, out, slots,
                  window, 0, rows, nk, nv, dk, dv, K, scale);
}
