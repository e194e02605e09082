#include "kernels.h"

/* ---- int8 activations (precision "int8") ------------------------------------------------
 * llama.cpp's CPU arithmetic: each row of x is quantised per 32-value block, xq = round(x / dx)
 * with dx = max|x| / 127, and multiplied with the weights' integer q exactly in int32:
 *   out[r, n] = sum_b (d_b dx_b) isum_b  +  sum_b m_b (dx_b sum_j xq_j),  isum_b = sum_j q_j xq_j
 * Integer sums are exact whatever the order (the AVX2 path forms them with maddubs + madd: no pair
 * can saturate, |q| <= 128 and |xq| <= 127), so only the float part has a fixed order:
 *   formats 4 and 8: a 4-lane accumulator, block b in lane b mod 4: acc = fma(isum_b, d_b * dx_b,
 *     acc), then acc = fma(m_b, s_b, acc) (s_b = dx_b * sum of the block's xq), blocks in order;
 *     result (l0 + l2) + (l1 + l3);
 *   format 16 (a scale per 16 weights): per block, lane l (0..7) holds the int sum over weights
 *     4l..4l+3 and takes fma(lane, d_half * dx_b, acc); the min term m_h s_h in 8 lanes (h mod 8)
 *     over halves; result reduce(acc) + reduce(min lanes).
 * The scalar path follows the same order, so it agrees with the AVX2 path bit for bit, and a row
 * depends only on itself: batch-invariant like the float32 path. Format 32 (plain float weights)
 * has no integer form and keeps the float32 path. */


void quantize_row(const float *x, int64_t nb, int8_t *q, float *d, float *s32, float *s16) {
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        int32_t sum[2] = {0, 0};
        for (int j = 0; j < QK; j++) {
            int v = (int)nearbyintf(xb[j] * id);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            q[b * QK + j] = (int8_t)v;
            sum[j / 16] += v;
        }
        d[b] = dd;
        s32[b] = dd * (float)(sum[0] + sum[1]);
        s16[2 * b] = dd * (float)sum[0];
        s16[2 * b + 1] = dd * (float)sum[1];
    }
}

#ifdef QG_X86
/* quantize_row with AVX2: the same values (max |x| is exact in any order, x * id rounds to the
 * nearest even like nearbyintf, integer sums are exact), so both paths agree bit for bit */
QG_AVX2 void quantize_row_avx2(const float *x, int64_t nb, int8_t *q, float *d, float *s32, float *s16) {
    const __m256 sign = _mm256_set1_ps(-0.0f), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * QK;
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(xb + 8 * k);
        __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 0x55));
        const float amax = _mm_cvtss_f32(m4);
        const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i i[4];
        for (int k = 0; k < 4; k++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            i[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
        }
        /* int32 -> int8 in order: packs work per 128-bit lane, so restore the order after */
        __m256i w16a = _mm256_packs_epi32(i[0], i[1]), w16b = _mm256_packs_epi32(i[2], i[3]);
        __m256i w8 = _mm256_packs_epi16(w16a, w16b);
        w8 = _mm256_permutevar8x32_epi32(w8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + b * QK), w8);
        __m256i h0 = _mm256_add_epi32(i[0], i[1]), h1 = _mm256_add_epi32(i[2], i[3]); /* values 0-15, 16-31 */
        __m128i t0 = _mm_add_epi32(_mm256_castsi256_si128(h0), _mm256_extracti128_si256(h0, 1));
        __m128i t1 = _mm_add_epi32(_mm256_castsi256_si128(h1), _mm256_extracti128_si256(h1, 1));
        __m128i t = _mm_hadd_epi32(t0, t1);
        t = _mm_hadd_epi32(t, t); /* sum0, sum1, sum0, sum1 */
        const int32_t sum0 = _mm_cvtsi128_si32(t), sum1 = _mm_extract_epi32(t, 1);
        d[b] = dd;
        s32[b] = dd * (float)(sum0 + sum1);
        s16[2 * b] = dd * (float)sum0;
        s16[2 * b + 1] = dd * (float)sum1;
    }
}
#endif

/* the 32 weights of block b as integers, in order */
static inline void block_ints(int fmt, const uint8_t *q, int64_t b, int32_t *w) {
    if (fmt == 4) {
        const uint8_t *p = q + b * 16;
        for (int j = 0; j < 16; j++) {
            w[j] = p[j] & 0x0F;
            w[j + 16] = p[j] >> 4;
        }
    } else {
        const int8_t *p = (const int8_t *)(q + b * 32);
        for (int j = 0; j < 32; j++) w[j] = p[j];
    }
}

static inline float min_term_scalar(int fmt, const float *m, int64_t nb, const float *s32, const float *s16) {
    const int64_t n = fmt == 16 ? 2 * nb : nb;
    const float *s = fmt == 16 ? s16 : s32;
    float mt[8] = {0};
    for (int64_t i = 0; i < n; i++) mt[i % 8] = fmaf(m[i], s[i], mt[i % 8]);
    return lanes8(mt);
}

float dot_q8_scalar(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, const int8_t *xq,
                           const float *dx, const float *s32, const float *s16) {
    int32_t w[32];
    if (fmt != 16) { /* blocks in 4 lanes */
        float acc[4] = {0};
        for (int64_t b = 0; b < nb; b++) {
            block_ints(fmt, q, b, w);
            const int8_t *x = xq + b * QK;
            int32_t isum = 0;
            for (int j = 0; j < QK; j++) isum += w[j] * (int32_t)x[j];
            acc[b % 4] = fmaf((float)isum, d[b] * dx[b], acc[b % 4]);
            acc[b % 4] = fmaf(m[b], s32[b], acc[b % 4]);
        }
        return (acc[0] + acc[2]) + (acc[1] + acc[3]);
    }
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++) {
        block_ints(fmt, q, b, w);
        const int8_t *x = xq + b * QK;
        for (int l = 0; l < 8; l++) {
            int32_t lane = 0;
            for (int i = 0; i < 4; i++) lane += w[4 * l + i] * (int32_t)x[4 * l + i];
            acc[l] = fmaf((float)lane, d[2 * b + (l >= 4)] * dx[b], acc[l]);
        }
    }
    return lanes8(acc) + min_term_scalar(fmt, m, nb, s32, s16);
}

#ifdef QG_X86
/* block b's 32 weights as bytes in order (format 4: 0..15; 8 and 16: int8) */
QG_AVX2 static inline __m256i block_bytes_avx2(int fmt, const uint8_t *q, int64_t b) {
    if (fmt == 4) {
        __m128i raw = _mm_loadu_si128((const __m128i *)(q + b * 16));
        __m256i v = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
        return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
    }
    return _mm256_loadu_si256((const __m256i *)(q + b * 32));
}

QG_AVX2 static inline float min_term_avx2(int fmt, const float *m, int64_t nb, const float *s32, const float *s16) {
    const int64_t n = fmt == 16 ? 2 * nb : nb;
    const float *s = fmt == 16 ? s16 : s32;
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(m + i), _mm256_loadu_ps(s + i), acc);
    float mt[8];
    _mm256_storeu_ps(mt, acc);
    for (; i < n; i++) mt[i % 8] = fmaf(m[i], s[i], mt[i % 8]);
    return lanes8(mt);
}

/* up to 8 rows of quantised x against one weight row: each block is unpacked once and
 * multiplied into every row while it sits in a register */
QG_AVX2 static inline __attribute__((always_inline)) void dot_q8_tile_avx2(int fmt, const uint8_t *q, const float *d,
                                                                           const float *m, int64_t nb, const QAct *A,
                                                                           int64_t r0, const int T, float *res) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[8];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i w = block_bytes_avx2(fmt, q, b);
        const __m256i uw = fmt == 4 ? w : _mm256_sign_epi8(w, w); /* |w| as unsigned bytes */
        const __m256 dv = fmt == 16 ? _mm256_setr_ps(d[2 * b], d[2 * b], d[2 * b], d[2 * b], d[2 * b + 1],
                                                     d[2 * b + 1], d[2 * b + 1], d[2 * b + 1])
                                    : _mm256_set1_ps(d[b]);
        for (int t = 0; t < T; t++) {
            const int64_t r = r0 + t;
            __m256i x = _mm256_loadu_si256((const __m256i *)(A->q + r * A->K + b * QK));
            if (fmt != 4) x = _mm256_sign_epi8(x, w); /* the sign of w moved onto x */
            const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(uw, x), ones);
            const __m256 scale = _mm256_mul_ps(dv, _mm256_set1_ps(A->d[r * nb + b]));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, acc[t]);
        }
    }
    for (int t = 0; t < T; t++) {
        const int64_t r = r0 + t;
        float lanes[8];
        _mm256_storeu_ps(lanes, acc[t]);
        res[t] = lanes8(lanes) + min_term_avx2(fmt, m, nb, A->s32 + r * nb, A->s16 + r * 2 * nb);
    }
}

/* the int32 lanes of one block against one row of xq (weights w, |w| in uw for signed formats) */
QG_AVX2 static inline __m256i block_lanes_avx2(const int fmt, __m256i w, __m256i uw, const int8_t *xq) {
    __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    if (fmt != 4) x = _mm256_sign_epi8(x, w); /* the sign of w moved onto x */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(uw, x), _mm256_set1_epi16(1));
}

/* formats 4 and 8: up to 4 rows of quantised x against one weight row, 4 blocks at a time (their
 * weights stay in registers for every row); the 4 blocks' exact int sums go into one vector */
#define DEFINE_Q8G_TILE(NAME, ATTR, LANES) \
ATTR static inline __attribute__((always_inline)) void NAME(const int fmt, const uint8_t *q, \
                                                                            const float *d, const float *m, \
                                                                            int64_t nb, const QAct *A, int64_t r0, \
                                                                            const int T, float *res) { \
    __m128 acc[4]; \
    for (int t = 0; t < T; t++) acc[t] = _mm_setzero_ps(); \
    const int64_t nb4 = nb & ~(int64_t)3; \
    for (int64_t b = 0; b < nb4; b += 4) { \
        __m256i w[4], uw[4]; \
        _mm_prefetch((const char *)(q + b * (fmt == 4 ? 16 : 32)) + PREFETCH_BYTES, _MM_HINT_T0); \
        for (int i = 0; i < 4; i++) { \
            w[i] = block_bytes_avx2(fmt, q, b + i); \
            uw[i] = fmt == 4 ? w[i] : _mm256_sign_epi8(w[i], w[i]); \
        } \
        const __m128 dv = _mm_loadu_ps(d + b), mv = _mm_loadu_ps(m + b); \
        for (int t = 0; t < T; t++) { \
            const int64_t r = r0 + t; \
            const int8_t *x = A->q + r * A->K + b * QK; \
            __m256i v0 = LANES(fmt, w[0], uw[0], x), v1 = LANES(fmt, w[1], uw[1], x + QK); \
            __m256i v2 = LANES(fmt, w[2], uw[2], x + 2 * QK), v3 = LANES(fmt, w[3], uw[3], x + 3 * QK); \
            __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3)); \
            __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)); \
            __m128 scale = _mm_mul_ps(dv, _mm_loadu_ps(A->d + r * nb + b)); \
            acc[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), scale, acc[t]); \
            acc[t] = _mm_fmadd_ps(mv, _mm_loadu_ps(A->s32 + r * nb + b), acc[t]); \
        } \
    } \
    if (nb4 < nb) { /* the last nb mod 4 blocks in lanes 0 .. nt-1 (b mod 4), as the scalar path */ \
        const int nt = (int)(nb - nb4); \
        const __m128i keep = _mm_cmpgt_epi32(_mm_set1_epi32(nt), _mm_setr_epi32(0, 1, 2, 3)); \
        __m256i w[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()}, uw[3] = {w[0], w[1], w[2]}; \
        for (int i = 0; i < nt; i++) { \
            w[i] = block_bytes_avx2(fmt, q, nb4 + i); \
            uw[i] = fmt == 4 ? w[i] : _mm256_sign_epi8(w[i], w[i]); \
        } \
        const __m128 dv = _mm_maskload_ps(d + nb4, keep), mv = _mm_maskload_ps(m + nb4, keep); \
        for (int t = 0; t < T; t++) { \
            const int64_t r = r0 + t; \
            const int8_t *x = A->q + r * A->K + nb4 * QK; \
            const __m256i z = _mm256_setzero_si256(); \
            __m256i v0 = LANES(fmt, w[0], uw[0], x); \
            __m256i v1 = nt > 1 ? LANES(fmt, w[1], uw[1], x + QK) : z, v2 = nt > 2 ? LANES(fmt, w[2], uw[2], x + 2 * QK) : z; \
            __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, z)); \
            __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)); \
            __m128 scale = _mm_mul_ps(dv, _mm_maskload_ps(A->d + r * nb + nb4, keep)); \
            __m128 upd = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), scale, acc[t]); \
            upd = _mm_fmadd_ps(mv, _mm_maskload_ps(A->s32 + r * nb + nb4, keep), upd); \
            acc[t] = _mm_blendv_ps(acc[t], upd, _mm_castsi128_ps(keep)); \
        } \
    } \
    for (int t = 0; t < T; t++) { \
        float lanes[4]; \
        _mm_storeu_ps(lanes, acc[t]); \
        res[t] = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]); \
    } \
}

/* the last nb mod 4 blocks of one row into its group accumulator (lanes 0 .. nt-1, b mod 4, as
 * the scalar path), then the tile's final sum (l0 + l2) + (l1 + l3) */
#define DEFINE_Q8G_TAIL(NAME, ATTR, LANES) \
ATTR static inline void NAME(const int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, \
                             const QAct *A, int64_t r, __m128 acc, float *res) { \
    const int64_t nb4 = nb & ~(int64_t)3; \
    const int nt = (int)(nb - nb4); \
    const __m128i keep = _mm_cmpgt_epi32(_mm_set1_epi32(nt), _mm_setr_epi32(0, 1, 2, 3)); \
    const __m256i z = _mm256_setzero_si256(); \
    __m256i v[3] = {z, z, z}; \
    const int8_t *x = A->q + r * A->K + nb4 * QK; \
    for (int i = 0; i < nt; i++) { \
        const __m256i w = block_bytes_avx2(fmt, q, nb4 + i); \
        v[i] = LANES(fmt, w, fmt == 4 ? w : _mm256_sign_epi8(w, w), x + i * QK); \
    } \
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], z)); \
    __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)); \
    __m128 scale = _mm_mul_ps(_mm_maskload_ps(d + nb4, keep), _mm_maskload_ps(A->d + r * nb + nb4, keep)); \
    __m128 upd = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), scale, acc); \
    upd = _mm_fmadd_ps(_mm_maskload_ps(m + nb4, keep), _mm_maskload_ps(A->s32 + r * nb + nb4, keep), upd); \
    acc = _mm_blendv_ps(acc, upd, _mm_castsi128_ps(keep)); \
    float lanes[4]; \
    _mm_storeu_ps(lanes, acc); \
    *res = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]); \
}

DEFINE_Q8G_TAIL(dot_q8g_pair_avx2_tail, QG_AVX2, block_lanes_avx2)
/* formats 4 and 8, a lone row of x (a decode) against two weight rows: each weight row's lanes,
 * sums and order exactly the tile's with T = 1, but two independent chains of the per-group
 * fused multiply-adds instead of one, so the row does not wait on their latency */
#define DEFINE_Q8G_PAIR(NAME, ATTR, LANES) \
ATTR static void NAME(const int fmt, const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row, \
                      int64_t nb, const QAct *A, int64_t r, float *res, int64_t res_stride) { \
    __m128 acc[2] = {_mm_setzero_ps(), _mm_setzero_ps()}; \
    const int64_t nb4 = nb & ~(int64_t)3; \
    const int8_t *xr = A->q + r * A->K; \
    const float *dx = A->d + r * nb, *sx = A->s32 + r * nb; \
    for (int64_t b = 0; b < nb4; b += 4) { \
        const __m128 xd = _mm_loadu_ps(dx + b), xsum = _mm_loadu_ps(sx + b); \
        for (int c = 0; c < 2; c++) { \
            const uint8_t *qc = q + c * q_row; \
            _mm_prefetch((const char *)(qc + b * (fmt == 4 ? 16 : 32)) + PREFETCH_BYTES, _MM_HINT_T0); \
            __m256i v[4]; \
            for (int i = 0; i < 4; i++) { \
                const __m256i w = block_bytes_avx2(fmt, qc, b + i); \
                v[i] = LANES(fmt, w, fmt == 4 ? w : _mm256_sign_epi8(w, w), xr + (b + i) * QK); \
            } \
            __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3])); \
            __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)); \
            __m128 scale = _mm_mul_ps(_mm_loadu_ps(d + c * s_row + b), xd); \
            acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), scale, acc[c]); \
            acc[c] = _mm_fmadd_ps(_mm_loadu_ps(m + c * s_row + b), xsum, acc[c]); \
        } \
    } \
    for (int c = 0; c < 2; c++) { \
        float one; \
        if (nb4 < nb) { /* the tail as the tile does it, then the tile's final sum */ \
            const uint8_t *qc = q + c * q_row; \
            const float *dc = d + c * s_row, *mc = m + c * s_row; \
            NAME##_tail(fmt, qc, dc, mc, nb, A, r, acc[c], &one); \
        } else { \
            float lanes[4]; \
            _mm_storeu_ps(lanes, acc[c]); \
            one = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]); \
        } \
        res[c * res_stride] = one; \
    } \
}

DEFINE_Q8G_PAIR(dot_q8g_pair_avx2, QG_AVX2, block_lanes_avx2)
DEFINE_Q8G_TILE(dot_q8g_tile_avx2, QG_AVX2, block_lanes_avx2)

/* AVX-512 VNNI (on 256-bit registers, so no wider than the AVX2 path's): vpdpbusd forms the same
 * int32 lanes in one instruction (sums of four u8 x s8 products, no int16 step); the float part
 * is the shared tile's, so results equal the AVX2 and scalar paths bit for bit */
QG_VNNI static inline __m256i block_lanes_vnni(const int fmt, __m256i w, __m256i uw, const int8_t *xq) {
    __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    if (fmt != 4) x = _mm256_sign_epi8(x, w);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), uw, x);
}

DEFINE_Q8G_TILE(dot_q8g_tile_vnni, QG_VNNI, block_lanes_vnni)
DEFINE_Q8G_TAIL(dot_q8g_pair_vnni_tail, QG_VNNI, block_lanes_vnni)
DEFINE_Q8G_PAIR(dot_q8g_pair_vnni, QG_VNNI, block_lanes_vnni)

QG_VNNI static void dots_q8g_vnni(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb,
                                  const QAct *A, int64_t r0, int64_t R, float *res) {
    if (fmt == 4) {
        for (; R >= 4; R -= 4, r0 += 4, res += 4) dot_q8g_tile_vnni(4, q, d, m, nb, A, r0, 4, res);
        switch (R) {
            case 3: dot_q8g_tile_vnni(4, q, d, m, nb, A, r0, 3, res); break;
            case 2: dot_q8g_tile_vnni(4, q, d, m, nb, A, r0, 2, res); break;
            case 1: dot_q8g_tile_vnni(4, q, d, m, nb, A, r0, 1, res); break;
        }
        return;
    }
    for (; R >= 2; R -= 2, r0 += 2, res += 2) dot_q8g_tile_vnni(8, q, d, m, nb, A, r0, 2, res);
    if (R == 1) dot_q8g_tile_vnni(8, q, d, m, nb, A, r0, 1, res);
}

int have_vnni(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
}

/* a lone row of x against weight rows n and n + 1 (formats 4 and 8; the driver pairs format 4) */
QG_AVX2 void dots_q8_pair_avx2(int fmt, const uint8_t *q, int64_t q_row, const float *d, const float *m,
                                      int64_t s_row, int64_t nb, const QAct *A, int64_t r, float *res,
                                      int64_t res_stride) {
    if (use_vnni && have_vnni()) {
        if (fmt == 4) dot_q8g_pair_vnni(4, q, q_row, d, m, s_row, nb, A, r, res, res_stride);
        else dot_q8g_pair_vnni(8, q, q_row, d, m, s_row, nb, A, r, res, res_stride);
        return;
    }
    if (fmt == 4) dot_q8g_pair_avx2(4, q, q_row, d, m, s_row, nb, A, r, res, res_stride);
    else dot_q8g_pair_avx2(8, q, q_row, d, m, s_row, nb, A, r, res, res_stride);
}

QG_AVX2 void dots_q8_avx2(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, const QAct *A,
                                 int64_t r0, int64_t R, float *res) {
    if ((fmt == 4 || fmt == 8) && use_vnni && have_vnni()) {
        dots_q8g_vnni(fmt, q, d, m, nb, A, r0, R, res);
        return;
    }
    if (fmt == 4) {
        for (; R >= 4; R -= 4, r0 += 4, res += 4) dot_q8g_tile_avx2(4, q, d, m, nb, A, r0, 4, res);
        switch (R) {
            case 3: dot_q8g_tile_avx2(4, q, d, m, nb, A, r0, 3, res); break;
            case 2: dot_q8g_tile_avx2(4, q, d, m, nb, A, r0, 2, res); break;
            case 1: dot_q8g_tile_avx2(4, q, d, m, nb, A, r0, 1, res); break;
        }
        return;
    }
    if (fmt == 8) { /* signed: w and |w| both held, so 2 rows a tile */
        for (; R >= 2; R -= 2, r0 += 2, res += 2) dot_q8g_tile_avx2(8, q, d, m, nb, A, r0, 2, res);
        if (R == 1) dot_q8g_tile_avx2(8, q, d, m, nb, A, r0, 1, res);
        return;
    }
    switch (R) {
        case 8: dot_q8_tile_avx2(fmt, q, d, m, nb, A, r0, 8, res); break;
        case 7: dot_q8_tile_avx2(fmt, q, d, m, nb, A, r0, 7, res); break;
        case 6: dot_q8_tile_avx2(fmt, q, d, m, nb, A, r0, 6, res); break;
        case 5: dot_q8_tile_avx2(fmt, q, d, m, nb, A, r0, 5, res); break;
        case 4: dot_q8_tile_avx2(fmt, q, d, m, nb, A, r0, 4, res); break;
        case 3: dot_q8_tile_avx2(fmt, q, d, m, nb, A, r0, 3, res); break;
        case 2: dot_q8_tile_avx2(fmt, q, d, m, nb, A, r0, 2, res); break;
        default: dot_q8_tile_avx2(fmt, q, d, m, nb, A, r0, 1, res); break;
    }
}
#endif

/* ---- int8 verify spans: one call a chunk of weight rows, tiles specialised by row count ----
 * A 2+ row int8 call (formats 4 and 8) hands all of a chunk's weight rows to one span function;
 * for each weight row the rows of x go in one tile up to 10 rows, more in near-equal tiles of at
 * most 10 (the sizes constants for 2-10 rows; measured: one tile of 5-8 beat 3 + 2 .. 4 + 4 by
 * 2-16%; with the rows in pairs, 9 and 10 in one tile beat 5 + 4 and 5 + 5 by 1-9%). A tile
 * holds a group of 4 weight blocks in registers (format 4: the nibbles; format 8: |w|, the signs
 * read again from L1 per row) while they multiply into every row of the tile. The float part of every output is the tile's above
 * (DEFINE_Q8G_TILE): per group, acc = fma(isum, d * dx, acc), acc = fma(m, s, acc), the last
 * nb mod 4 blocks in lanes 0 .. nt-1, result (l0 + l2) + (l1 + l3); only the integer sums are
 * formed in another order (exact), so a span's rows equal the 1-row path and the scalar path bit
 * for bit. Format 4 sums a group's maddubs pairs in int16 before one madd (a sum of 8 products
 * of a nibble and an int8 is at most 8 x 15 x 127 = 15240, no saturation) and reduces the four
 * blocks with unpacks instead of hadd. Switches: set_int8_spans (off: the per-tile driver),
 * set_int8_row_pairs (off: a tile's rows one at a time; on: two in one register). */
int use_int8_spans = 1;
int use_int8_row_pairs = 1; /* 0: a span's tiles take their rows one at a time (A/B, tests) */

#ifdef QG_X86
/* The exact int sums of one group of 4 weight blocks (held in hw: format 4 the nibbles, format 8
 * |w| with the signs read from qb) against one row of xq (x: the group's first value), block i in
 * lane i. nt: the blocks present (4, or the last nb mod 4: hw is zero past nt, and the missing
 * blocks read block 0's x and signs, in bounds, and multiply them by zero).
 * group_lanes_*: the four blocks' lane vectors folded to one, [b0 b1 b2 b3 | b0 b1 b2 b3] (each
 * half a partial sum); on AVX2 format 4 keeps int16 lanes (8 products of a nibble and an int8:
 * at most 15240, no saturation) and needs one madd to finish, else int32 lanes. */
QG_AVX2 static inline __attribute__((always_inline)) __m256i lanes_fold(const int i16, const __m256i *v) {
    if (i16) {
        const __m256i a = _mm256_add_epi16(_mm256_unpacklo_epi32(v[0], v[1]), _mm256_unpackhi_epi32(v[0], v[1]));
        const __m256i c = _mm256_add_epi16(_mm256_unpacklo_epi32(v[2], v[3]), _mm256_unpackhi_epi32(v[2], v[3]));
        return _mm256_add_epi16(_mm256_unpacklo_epi64(a, c), _mm256_unpackhi_epi64(a, c));
    }
    const __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(v[0], v[1]), _mm256_unpackhi_epi32(v[0], v[1]));
    const __m256i c = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2], v[3]), _mm256_unpackhi_epi32(v[2], v[3]));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(a, c), _mm256_unpackhi_epi64(a, c));
}

/* one row's folded lanes to its four block sums */
QG_AVX2 static inline __attribute__((always_inline)) __m128i sums_one(const int i16, __m256i e) {
    if (i16) e = _mm256_madd_epi16(e, _mm256_set1_epi16(1));
    return _mm_add_epi32(_mm256_castsi256_si128(e), _mm256_extracti128_si256(e, 1));
}

/* two rows' folded lanes to their block sums, row x in the low 128 bits and row y in the high
 * (format 4 on AVX2 adds each row's halves in int16, at most 2 x 15240, before one madd) */
QG_AVX2 static inline __attribute__((always_inline)) __m256i sums_pair(const int i16, __m256i ex, __m256i ey) {
    const __m256i lo = _mm256_permute2x128_si256(ex, ey, 0x20), hi = _mm256_permute2x128_si256(ex, ey, 0x31);
    if (i16) return _mm256_madd_epi16(_mm256_add_epi16(lo, hi), _mm256_set1_epi16(1));
    return _mm256_add_epi32(lo, hi);
}

QG_AVX2 static inline __attribute__((always_inline)) __m256i group_lanes_avx2(const int fmt, const __m256i *hw,
                                                                              const uint8_t *qb, const int nt,
                                                                              const int8_t *x) {
    __m256i v[4];
    for (int i = 0; i < 4; i++) {
        const int at = i < nt ? i : 0;
        __m256i xs = _mm256_loadu_si256((const __m256i *)(x + at * QK));
        if (fmt != 4) xs = _mm256_sign_epi8(xs, _mm256_loadu_si256((const __m256i *)(qb + at * QK)));
        v[i] = _mm256_maddubs_epi16(hw[i], xs);
        if (fmt != 4) v[i] = _mm256_madd_epi16(v[i], _mm256_set1_epi16(1));
    }
    return lanes_fold(fmt == 4, v);
}

QG_AVX2 static inline __attribute__((always_inline)) __m128i group_sums_avx2(const int fmt, const __m256i *hw,
                                                                             const uint8_t *qb, const int nt,
                                                                             const int8_t *x) {
    return sums_one(fmt == 4, group_lanes_avx2(fmt, hw, qb, nt, x));
}

QG_AVX2 static inline __attribute__((always_inline)) __m256i group_pair_avx2(const int fmt, const __m256i *hw,
                                                                             const uint8_t *qb, const int nt,
                                                                             const int8_t *x, const int8_t *y) {
    return sums_pair(fmt == 4, group_lanes_avx2(fmt, hw, qb, nt, x), group_lanes_avx2(fmt, hw, qb, nt, y));
}

/* VNNI: vpdpbusd forms each block's int32 lanes in one instruction */
QG_VNNI_SPAN static inline __attribute__((always_inline)) __m256i group_lanes_vnni(const int fmt, const __m256i *hw,
                                                                                   const uint8_t *qb, const int nt,
                                                                                   const int8_t *x) {
    __m256i v[4];
    for (int i = 0; i < 4; i++) {
        const int at = i < nt ? i : 0;
        __m256i xs = _mm256_loadu_si256((const __m256i *)(x + at * QK));
        if (fmt != 4) xs = _mm256_sign_epi8(xs, _mm256_loadu_si256((const __m256i *)(qb + at * QK)));
        v[i] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), hw[i], xs);
    }
    return lanes_fold(0, v);
}

QG_VNNI_SPAN static inline __attribute__((always_inline)) __m128i group_sums_vnni(const int fmt, const __m256i *hw,
                                                                                  const uint8_t *qb, const int nt,
                                                                                  const int8_t *x) {
    return sums_one(0, group_lanes_vnni(fmt, hw, qb, nt, x));
}

QG_VNNI_SPAN static inline __attribute__((always_inline)) __m256i group_pair_vnni(const int fmt, const __m256i *hw,
                                                                                  const uint8_t *qb, const int nt,
                                                                                  const int8_t *x, const int8_t *y) {
    return sums_pair(0, group_lanes_vnni(fmt, hw, qb, nt, x), group_lanes_vnni(fmt, hw, qb, nt, y));
}

#define Q8S_MOST 10 /* rows of x a span's tile takes at most */

/* rows a0 + r0 .. a0 + r0 + T - 1 of xq against weight row q (scales d, m): out[r0 + t, 0] (+ base).
 * With PAIRS (set_int8_row_pairs) the rows go two at a time, T / 2 pairs and a lone last row: a
 * pair's four block sums in one vector, its float steps on both rows' 4 lanes in one 8-lane
 * register (row x in lanes 0-3, y in 4-7); without, every row alone in a 4-lane register. Every
 * lane takes the same operations in the same order (scale = d * dx, fma, fma, the tail blended),
 * so both give the same bits. */
#define DEFINE_Q8S_TILE(NAME, ATTR, SUMS, PAIR, PAIRS) \
ATTR static inline __attribute__((always_inline)) void NAME(const int fmt, const uint8_t *q, const float *d, \
                                                            const float *m, int64_t nb, const QAct *A, int64_t a0, \
                                                            int64_t r0, const int T, float *out, int64_t os, \
                                                            const float *base) { \
    const int P = PAIRS ? T / 2 : 0; /* rows 2P .. T-1 alone */ \
    __m256 acc[Q8S_MOST / 2]; \
    __m128 one[Q8S_MOST]; \
    for (int p = 0; p < P; p++) acc[p] = _mm256_setzero_ps(); \
    for (int t = 2 * P; t < T; t++) one[t] = _mm_setzero_ps(); \
    const int64_t nb4 = nb & ~(int64_t)3, bb = fmt == 4 ? 16 : 32, K = A->K; \
    const int64_t r1 = a0 + r0; /* the tile's first row of xq */ \
    for (int64_t b = 0; b < nb4; b += 4) { \
        const uint8_t *qb = q + b * bb; \
        _mm_prefetch((const char *)qb + PREFETCH_BYTES, _MM_HINT_T0); \
        __m256i hw[4]; \
        for (int i = 0; i < 4; i++) { \
            const __m256i w = block_bytes_avx2(fmt, q, b + i); \
            hw[i] = fmt == 4 ? w : _mm256_sign_epi8(w, w); \
        } \
        const __m128 dv = _mm_loadu_ps(d + b), mv = _mm_loadu_ps(m + b); \
        const __m256 dv2 = _mm256_set_m128(dv, dv), mv2 = _mm256_set_m128(mv, mv); \
        for (int p = 0; p < P; p++) { \
            const int64_t r = r1 + 2 * p; \
            const __m256i isum = PAIR(fmt, hw, qb, 4, A->q + r * K + b * QK, A->q + (r + 1) * K + b * QK); \
            const __m256 dx = _mm256_loadu2_m128(A->d + (r + 1) * nb + b, A->d + r * nb + b); \
            const __m256 sx = _mm256_loadu2_m128(A->s32 + (r + 1) * nb + b, A->s32 + r * nb + b); \
            acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dv2, dx), acc[p]); \
            acc[p] = _mm256_fmadd_ps(mv2, sx, acc[p]); \
        } \
        for (int t = 2 * P; t < T; t++) { \
            const int64_t r = r1 + t; \
            const __m128i isum = SUMS(fmt, hw, qb, 4, A->q + r * K + b * QK); \
            one[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(dv, _mm_loadu_ps(A->d + r * nb + b)), one[t]); \
            one[t] = _mm_fmadd_ps(mv, _mm_loadu_ps(A->s32 + r * nb + b), one[t]); \
        } \
    } \
    if (nb4 < nb) { /* the last nb mod 4 blocks in lanes 0 .. nt-1 (b mod 4), as the scalar path */ \
        const int nt = (int)(nb - nb4); \
        const __m128i keep = _mm_cmpgt_epi32(_mm_set1_epi32(nt), _mm_setr_epi32(0, 1, 2, 3)); \
        const __m256 keep2 = _mm256_castsi256_ps(_mm256_set_m128i(keep, keep)); \
        const __m128 dv = _mm_maskload_ps(d + nb4, keep), mv = _mm_maskload_ps(m + nb4, keep); \
        const __m256 dv2 = _mm256_set_m128(dv, dv), mv2 = _mm256_set_m128(mv, mv); \
        const uint8_t *qb = q + nb4 * bb; \
        __m256i hw[4]; \
        for (int i = 0; i < 4; i++) { \
            const __m256i w = i < nt ? block_bytes_avx2(fmt, q, nb4 + i) : _mm256_setzero_si256(); \
            hw[i] = fmt == 4 ? w : _mm256_sign_epi8(w, w); \
        } \
        for (int p = 0; p < P; p++) { \
            const int64_t r = r1 + 2 * p; \
            const __m256i isum = PAIR(fmt, hw, qb, nt, A->q + r * K + nb4 * QK, A->q + (r + 1) * K + nb4 * QK); \
            const __m256 dx = _mm256_set_m128(_mm_maskload_ps(A->d + (r + 1) * nb + nb4, keep), \
                                              _mm_maskload_ps(A->d + r * nb + nb4, keep)); \
            const __m256 sx = _mm256_set_m128(_mm_maskload_ps(A->s32 + (r + 1) * nb + nb4, keep), \
                                              _mm_maskload_ps(A->s32 + r * nb + nb4, keep)); \
            __m256 upd = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dv2, dx), acc[p]); \
            upd = _mm256_fmadd_ps(mv2, sx, upd); \
            acc[p] = _mm256_blendv_ps(acc[p], upd, keep2); \
        } \
        for (int t = 2 * P; t < T; t++) { \
            const int64_t r = r1 + t; \
            const __m128i isum = SUMS(fmt, hw, qb, nt, A->q + r * K + nb4 * QK); \
            const __m128 scale = _mm_mul_ps(dv, _mm_maskload_ps(A->d + r * nb + nb4, keep)); \
            __m128 upd = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), scale, one[t]); \
            upd = _mm_fmadd_ps(mv, _mm_maskload_ps(A->s32 + r * nb + nb4, keep), upd); \
            one[t] = _mm_blendv_ps(one[t], upd, _mm_castsi128_ps(keep)); \
        } \
    } \
    for (int t = 0; t < T; t++) { \
        float lanes[8]; \
        if (t < 2 * P) \
            _mm256_storeu_ps(lanes, acc[t / 2]); \
        else \
            _mm_storeu_ps(lanes, one[t]); \
        const float *l = lanes + (t < 2 * P ? 4 * (t % 2) : 0); \
        const float v = (l[0] + l[2]) + (l[1] + l[3]); \
        const int64_t at = (r0 + t) * os; \
        out[at] = base != NULL ? base[at] + v : v; \
    } \
}

/* every weight row of a chunk (count of them) against R rows of xq: for each weight row, tiles
 * of T1 and T2 rows (constants; 0: none) or, for R > 10, near-equal tiles of at most Q8S_MOST */
#define Q8S_ROWS(TILE, FMT, T1, T2) \
    for (int64_t n = 0; n < count; n++) { \
        const uint8_t *qn = q + n * q_row; \
        const float *dn = d + n * s_row, *mn = m + n * s_row, *bn = base != NULL ? base + n : NULL; \
        TILE(FMT, qn, dn, mn, nb, A, a0, 0, T1, out + n, os, bn); \
        if (T2) TILE(FMT, qn, dn, mn, nb, A, a0, T1, T2, out + n, os, bn); \
    }

#define DEFINE_Q8S_SPAN(NAME, ATTR, TILE, FMT) \
ATTR static void NAME(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row, int64_t nb, \
                      const QAct *A, int64_t a0, int64_t R, int64_t count, float *out, int64_t os, \
                      const float *base) { \
    switch (R) { \
        case 1: Q8S_ROWS(TILE, FMT, 1, 0) return; \
        case 2: Q8S_ROWS(TILE, FMT, 2, 0) return; \
        case 3: Q8S_ROWS(TILE, FMT, 3, 0) return; \
        case 4: Q8S_ROWS(TILE, FMT, 4, 0) return; \
        case 5: Q8S_ROWS(TILE, FMT, 5, 0) return; \
        case 6: Q8S_ROWS(TILE, FMT, 6, 0) return; \
        case 7: Q8S_ROWS(TILE, FMT, 7, 0) return; \
        case 8: Q8S_ROWS(TILE, FMT, 8, 0) return; \
        case 9: Q8S_ROWS(TILE, FMT, 9, 0) return; \
        case 10: Q8S_ROWS(TILE, FMT, 10, 0) return; \
    } \
    const int64_t tiles = (R + Q8S_MOST - 1) / Q8S_MOST; \
    for (int64_t n = 0; n < count; n++) { \
        const uint8_t *qn = q + n * q_row; \
        const float *dn = d + n * s_row, *mn = m + n * s_row, *bn = base != NULL ? base + n : NULL; \
        for (int64_t i = 0, r = 0; i < tiles; i++) { \
            const int64_t rows = R / tiles + (i < R % tiles); \
            switch (rows) { \
                case 10: TILE(FMT, qn, dn, mn, nb, A, a0, r, 10, out + n, os, bn); break; \
                case 9: TILE(FMT, qn, dn, mn, nb, A, a0, r, 9, out + n, os, bn); break; \
                case 8: TILE(FMT, qn, dn, mn, nb, A, a0, r, 8, out + n, os, bn); break; \
                case 7: TILE(FMT, qn, dn, mn, nb, A, a0, r, 7, out + n, os, bn); break; \
                case 6: TILE(FMT, qn, dn, mn, nb, A, a0, r, 6, out + n, os, bn); break; \
                case 5: TILE(FMT, qn, dn, mn, nb, A, a0, r, 5, out + n, os, bn); break; \
                case 4: TILE(FMT, qn, dn, mn, nb, A, a0, r, 4, out + n, os, bn); break; \
                case 3: TILE(FMT, qn, dn, mn, nb, A, a0, r, 3, out + n, os, bn); break; \
                case 2: TILE(FMT, qn, dn, mn, nb, A, a0, r, 2, out + n, os, bn); break; \
                default: TILE(FMT, qn, dn, mn, nb, A, a0, r, 1, out + n, os, bn); break; \
            } \
            r += rows; \
        } \
    } \
}

DEFINE_Q8S_TILE(q8s_tile_avx2, QG_AVX2, group_sums_avx2, group_pair_avx2, 0)
DEFINE_Q8S_SPAN(q8s_span_q4_avx2, QG_AVX2, q8s_tile_avx2, 4)
DEFINE_Q8S_SPAN(q8s_span_q8_avx2, QG_AVX2, q8s_tile_avx2, 8)
DEFINE_Q8S_TILE(q8s_tile_vnni, QG_VNNI_SPAN, group_sums_vnni, group_pair_vnni, 0)
DEFINE_Q8S_SPAN(q8s_span_q4_vnni, QG_VNNI_SPAN, q8s_tile_vnni, 4)
DEFINE_Q8S_SPAN(q8s_span_q8_vnni, QG_VNNI_SPAN, q8s_tile_vnni, 8)
DEFINE_Q8S_TILE(q8p_tile_avx2, QG_AVX2, group_sums_avx2, group_pair_avx2, 1)
DEFINE_Q8S_SPAN(q8p_span_q4_avx2, QG_AVX2, q8p_tile_avx2, 4)
DEFINE_Q8S_SPAN(q8p_span_q8_avx2, QG_AVX2, q8p_tile_avx2, 8)
DEFINE_Q8S_TILE(q8p_tile_vnni, QG_VNNI_SPAN, group_sums_vnni, group_pair_vnni, 1)
DEFINE_Q8S_SPAN(q8p_span_q4_vnni, QG_VNNI_SPAN, q8p_tile_vnni, 4)
DEFINE_Q8S_SPAN(q8p_span_q8_vnni, QG_VNNI_SPAN, q8p_tile_vnni, 8)

/* rows a0 .. a0 + R - 1 of xq against weight rows 0 .. count-1 (format 4 or 8), one call; out
 * and base point at row a0's outputs */
QG_AVX2 void q8s_span(int fmt, const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
                             int64_t nb, const QAct *A, int64_t a0, int64_t R, int64_t count, float *out, int64_t os,
                             const float *base) {
    const int vnni = use_vnni && have_vnni();
    if (use_int8_row_pairs && fmt == 4)
        (vnni ? q8p_span_q4_vnni : q8p_span_q4_avx2)(q, q_row, d, m, s_row, nb, A, a0, R, count, out, os, base);
    else if (use_int8_row_pairs)
        (vnni ? q8p_span_q8_vnni : q8p_span_q8_avx2)(q, q_row, d, m, s_row, nb, A, a0, R, count, out, os, base);
    else if (fmt == 4)
        (vnni ? q8s_span_q4_vnni : q8s_span_q4_avx2)(q, q_row, d, m, s_row, nb, A, a0, R, count, out, os, base);
    else
        (vnni ? q8s_span_q8_vnni : q8s_span_q8_avx2)(q, q_row, d, m, s_row, nb, A, a0, R, count, out, os, base);
}
#endif
