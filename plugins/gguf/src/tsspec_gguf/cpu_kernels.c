/* CPU kernels of tsspec (module tsspec_gguf._cpu_kernels): the quantised-weight matmul (1),
 * causal attention over a KV cache (2), the small per-row ops of a block (3), a stack of
 * pre-norm GQA + SwiGLU blocks run from those in one call (4), and two roofline probes (5:
 * measurement only, nothing else calls them). All compute every row the same
 * way whatever the number of rows in the call, so a 1-row decode and a k-row verify agree bit
 * for bit.
 *
 * 1. Matmul: out[r, n] = (base[r, n] +) sum_k x[r, k] * W[n, k].
 *
 * W stays in 32-weight affine blocks, w = d * q + m (d, m float32 per block):
 *   fmt 4: q is 4-bit, 16 bytes a block, ggml's nibble order (byte j: low nibble is weight j,
 *          high nibble weight j + 16); covers Q4_0 (m = -8 d) and Q4_1.
 *   fmt 8: q is int8, 32 bytes a block; covers Q8_0 (m = 0) and any 4/5-bit type widened.
 *   fmt 16: fmt 8 with d, m per 16 weights (Q6_K, and anything fused with it).
 *   fmt 32: plain float32 weights, 128 bytes a block, d and m unused (F32/F16 matrices and
 *           types without a block form, so that every matrix takes the same row-invariant path).
 * A block dequantises to exactly the float32 values the torch dequantiser gives (q * d is exact
 * in float32, so the fused multiply-add rounds once, like q * d + m), so results differ from a
 * float32 GEMM on the dequantised matrix only in summation order.
 *
 * Batch invariance: every output row r is summed in the same order (two 8-lane accumulators
 * over 16-weight steps, then a fixed horizontal sum) whatever the number of rows R in the call
 * and whatever the thread split, so a row's result does not depend on the rows beside it:
 * a 1-row decode and an 8-row verify give bit-identical logits for the same token. Which rows
 * and weight rows share a tile (a decode row against 2 or 4 weight rows, 2 rows against 2
 * weight rows, tiles of up to 5 rows that unpack each weight block once for all of them) only
 * decides which chains are in flight together, never a chain's operands or order.
 *
 * Threads: a small pool of our own (below), not OpenMP. Work is split into chunks that the caller
 * and the workers take from one atomic counter, so the caller never waits for a worker to wake
 * up: a sleeping or descheduled worker just takes no chunks, and the caller does them all.
 * (OpenMP's fork/join makes every call wait for every worker: with OMP_WAIT_POLICY=PASSIVE,
 * which a shared machine needs, that wake-up cost 40% of a decode step; spinning workers
 * instead lose 3-5x whenever another process holds a core.)
 * Vector code is AVX2 + FMA, chosen at run time; the scalar path is the fallback and the
 * specification (same summation order, so both paths agree bit for bit).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#if defined(__linux__)
#include <sys/mman.h>
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1's value (older C headers lack it; older kernels refuse it) */
#endif
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define QG_X86 1
#endif

#define QK 32
/* weight bytes ahead of the one being unpacked that a lone-row kernel asks the cache for (the
 * stream of quantised weights is the decode step's memory traffic) */
#define PREFETCH_BYTES 2048

static inline int64_t block_bytes(int fmt) { return fmt == 4 ? 16 : fmt == 32 ? 128 : 32; }
/* scales (d, m) per 32-weight block: format 16 is format 8 with a scale per 16 weights (Q6_K) */
static inline int64_t block_scales(int fmt) { return fmt == 16 ? 2 : 1; }

/* ---- scalar reference ------------------------------------------------------------------- */

static void unpack_row_scalar(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, float *w) {
    for (int64_t b = 0; b < nb; b++) {
        float *o = w + b * QK;
        if (fmt == 4) {
            const uint8_t *p = q + b * 16;
            for (int j = 0; j < 16; j++) {
                o[j] = fmaf((float)(p[j] & 0x0F), d[b], m[b]);
                o[j + 16] = fmaf((float)(p[j] >> 4), d[b], m[b]);
            }
        } else if (fmt == 32) {
            memcpy(o, q + b * 128, sizeof(float) * QK);
        } else if (fmt == 8) {
            const int8_t *p = (const int8_t *)(q + b * 32);
            for (int j = 0; j < 32; j++) o[j] = fmaf((float)p[j], d[b], m[b]);
        } else {
            const int8_t *p = (const int8_t *)(q + b * 32);
            for (int j = 0; j < 32; j++) o[j] = fmaf((float)p[j], d[2 * b + j / 16], m[2 * b + j / 16]);
        }
    }
}

/* the fixed summation order: lane l of accumulator A sums w[16 s + l] x[16 s + l], lane l of B
 * sums w[16 s + 8 + l] x[...]; then A + B lane-wise, then lanes ((0+4)+(2+6))+((1+5)+(3+7)) */
static inline float reduce_lanes(const float *a, const float *b) {
    float s[8];
    for (int l = 0; l < 8; l++) s[l] = a[l] + b[l];
    float t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6], t3 = s[3] + s[7];
    return (t0 + t2) + (t1 + t3);
}

static float dot_scalar(const float *w, const float *x, int64_t k) {
    float a[8] = {0}, b[8] = {0};
    for (int64_t i = 0; i < k; i += 16)
        for (int l = 0; l < 8; l++) {
            a[l] = fmaf(w[i + l], x[i + l], a[l]);
            b[l] = fmaf(w[i + 8 + l], x[i + 8 + l], b[l]);
        }
    return reduce_lanes(a, b);
}

/* ---- AVX2 + FMA ------------------------------------------------------------------------- */
#ifdef QG_X86
#define QG_AVX2 __attribute__((target("avx2,fma")))

QG_AVX2 static inline float hsum_avx2(__m256 a, __m256 b) {
    __m256 s = _mm256_add_ps(a, b);
    __m128 lo = _mm256_castps256_ps128(s), hi = _mm256_extractf128_ps(s, 1);
    __m128 t = _mm_add_ps(lo, hi);                         /* (0+4) (1+5) (2+6) (3+7) */
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));          /* (0+4)+(2+6), (1+5)+(3+7) */
    __m128 v = _mm_add_ss(u, _mm_shuffle_ps(u, u, 0x55));
    return _mm_cvtss_f32(v);
}

/* the `tree_sums` switch: several horizontal sums at once, each hsum_avx2's value bit for bit */
static int use_tree_sums = 1;

/* hsum_avx2(v, 0) of four vectors at once (lane t of the result: v[t]'s sum), the same adds in
 * the same order, the lanes of the four shuffled together: 14 instructions instead of 4 x 6.
 * (Adding 0 is left out: hsum_avx2(v, 0) = hsum of v, since a lane is -0 only if it is -0
 * before the add, which a chain of fused multiply-adds from +0 never makes; NaN and infinities
 * pass through adds alike.) */
QG_AVX2 static inline __m128 hsum4_avx2(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    /* lanes 0-3 of each vector + lanes 4-7: t_i = v_i + v_{i+4}, two vectors per register */
    const __m256 s01 = _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20), _mm256_permute2f128_ps(v0, v1, 0x31));
    const __m256 s23 = _mm256_add_ps(_mm256_permute2f128_ps(v2, v3, 0x20), _mm256_permute2f128_ps(v2, v3, 0x31));
    /* u = t0 + t2, w = t1 + t3: low half [v0.u, v0.w, v2.u, v2.w], high half [v1.u, v1.w, v3.u, v3.w] */
    const __m256 u = _mm256_add_ps(_mm256_shuffle_ps(s01, s23, 0x44), _mm256_shuffle_ps(s01, s23, 0xEE));
    const __m128 lo = _mm256_castps256_ps128(u), hi = _mm256_extractf128_ps(u, 1);
    /* u + w: [v0, v2, v1, v3], then in order */
    const __m128 r = _mm_add_ps(_mm_shuffle_ps(lo, hi, 0x88), _mm_shuffle_ps(lo, hi, 0xDD));
    return _mm_shuffle_ps(r, r, 0xD8);
}

/* hsum_avx2(v[t], 0) of eight vectors at once, lane t of the result (22 instructions instead of
 * 8 x 6), the same adds in the same order as hsum4_avx2 */
QG_AVX2 static inline __m256 hsum8_avx2(const __m256 v[8]) {
    __m256 s[4];
    for (int p = 0; p < 4; p++)
        s[p] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x31));
    /* [v0.u, v0.w, v2.u, v2.w | v1.u, v1.w, v3.u, v3.w] and the same for v4..v7 */
    const __m256 u0 = _mm256_add_ps(_mm256_shuffle_ps(s[0], s[1], 0x44), _mm256_shuffle_ps(s[0], s[1], 0xEE));
    const __m256 u1 = _mm256_add_ps(_mm256_shuffle_ps(s[2], s[3], 0x44), _mm256_shuffle_ps(s[2], s[3], 0xEE));
    /* u + w: [v0, v2, v4, v6 | v1, v3, v5, v7], then in order */
    const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(u0, u1, 0x88), _mm256_shuffle_ps(u0, u1, 0xDD));
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

QG_AVX2 static void rms_sumsq_avx2(const float *x, int64_t n, float *lanes) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    _mm256_storeu_ps(lanes, acc);
}

/* block blk of a row: its 32 weights d * q + m as four 8-lane vectors (weights 0-7, 8-15,
 * 16-23, 24-31); exactly unpack_row_scalar's values */
QG_AVX2 static inline __attribute__((always_inline)) void block_avx2(int fmt, const uint8_t *q, int64_t blk,
                                                                     const float *d, const float *m, __m256 w[4]) {
    __m256i i[4];
    if (fmt == 32) {
        for (int k = 0; k < 4; k++) w[k] = _mm256_loadu_ps((const float *)(q + blk * 128) + 8 * k);
        return;
    }
    if (fmt == 4) { /* bytes 0-7 and 8-15 zero-extended from memory: low nibbles are weights
                     * 0..15, high nibbles 16..31 */
        const __m256i low4 = _mm256_set1_epi32(0x0F);
        const __m256i z0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + blk * 16)));
        const __m256i z1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + blk * 16 + 8)));
        i[0] = _mm256_and_si256(z0, low4);
        i[1] = _mm256_and_si256(z1, low4);
        i[2] = _mm256_srli_epi32(z0, 4);
        i[3] = _mm256_srli_epi32(z1, 4);
    } else { /* each 8 bytes sign-extended straight from memory (no shuffles to split them) */
        for (int k = 0; k < 4; k++) i[k] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + blk * 32 + 8 * k)));
    }
    const int64_t s0 = fmt == 16 ? 2 * blk : blk, s1 = fmt == 16 ? 2 * blk + 1 : blk; /* weights 0-15, 16-31 */
    const __m256 d0 = _mm256_set1_ps(d[s0]), m0 = _mm256_set1_ps(m[s0]);
    const __m256 d1 = _mm256_set1_ps(d[s1]), m1 = _mm256_set1_ps(m[s1]);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[0]), d0, m0);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[1]), d0, m0);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[2]), d1, m1);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[3]), d1, m1);
}

QG_AVX2 static void unpack_row_avx2(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, float *w) {
    for (int64_t b = 0; b < nb; b++) {
        __m256 v[4];
        block_avx2(fmt, q, b, d, m, v);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(w + b * QK + 8 * k, v[k]);
    }
}

/* up to 4 rows of x: unpack each block in registers and multiply it into every row's two
 * accumulators; the same lanes and order as dot_scalar over unpack_row_scalar, so both paths
 * agree bit for bit and a row's result never depends on the rows tiled with it */
QG_AVX2 static inline __attribute__((always_inline)) void dot_fused_avx2(int fmt, const uint8_t *q, const float *d,
                                                                          const float *m, int64_t nb, const float *x,
                                                                          int64_t xs, const int T, float *res) {
    __m256 a[4], b[4];
    for (int t = 0; t < T; t++) a[t] = b[t] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        const float *xb = x + blk * QK;
        __m256 w[4];
        _mm_prefetch((const char *)(q + blk * block_bytes(fmt)) + PREFETCH_BYTES, _MM_HINT_T0);
        block_avx2(fmt, q, blk, d, m, w);
        __m256 w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
        for (int t = 0; t < T; t++) {
            const float *xt = xb + t * xs;
            a[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), a[t]);
            b[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), b[t]);
            a[t] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt + 16), a[t]);
            b[t] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), b[t]);
        }
    }
    if (use_tree_sums && T == 4) {
        _mm_storeu_ps(res, hsum4_avx2(_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1]), _mm256_add_ps(a[2], b[2]),
                                      _mm256_add_ps(a[3], b[3])));
        return;
    }
    if (use_tree_sums && T == 3) { /* the third sum twice in the tree's fourth lane */
        const __m256 s2 = _mm256_add_ps(a[T > 2 ? 2 : 0], b[T > 2 ? 2 : 0]);
        float four[4];
        _mm_storeu_ps(four, hsum4_avx2(_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[T > 1 ? 1 : 0], b[T > 1 ? 1 : 0]), s2, s2));
        for (int t = 0; t < 3; t++) res[t] = four[t];
        return;
    }
    for (int t = 0; t < T; t++) res[t] = hsum_avx2(a[t], b[t]);
}

/* the scales of block blk as vectors: d0, m0 for weights 0-15, d1, m1 for 16-31 (format 16 has
 * two per block; format 32 none: zeros, unused) */
QG_AVX2 static inline __attribute__((always_inline)) void scales_avx2(const int fmt, const float *d, const float *m,
                                                                       int64_t blk, __m256 s[4]) {
    s[0] = s[1] = s[2] = s[3] = _mm256_setzero_ps();
    if (fmt == 32) return;
    const int64_t s0 = fmt == 16 ? 2 * blk : blk, s1 = fmt == 16 ? 2 * blk + 1 : blk;
    s[0] = _mm256_set1_ps(d[s0]), s[1] = _mm256_set1_ps(m[s0]);
    s[2] = _mm256_set1_ps(d[s1]), s[3] = _mm256_set1_ps(m[s1]);
}

/* quarter k (weights 8k .. 8k + 7) of the block at qb as one 8-lane vector: block_avx2's w[k]
 * (format 4: bytes 0-7 for even k, 8-15 for odd k; low nibbles for k < 2, high for k >= 2) */
QG_AVX2 static inline __attribute__((always_inline)) __m256 quarter_avx2(const int fmt, const uint8_t *qb, const int k,
                                                                          const __m256 s[4]) {
    if (fmt == 32) return _mm256_loadu_ps((const float *)qb + 8 * k);
    __m256i i;
    if (fmt == 4) {
        const __m256i z = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qb + 8 * (k & 1))));
        i = k < 2 ? _mm256_and_si256(z, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(z, 4);
    } else {
        i = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qb + 8 * k)));
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), k < 2 ? s[0] : s[2], k < 2 ? s[1] : s[3]);
}

/* WIDE_ROWS rows of x in one tile (the `wide_tiles` switch): each block's four weight vectors
 * are made one at a time (quarter k: weights 8k .. 8k + 7, block_avx2's w[k]) and multiplied into
 * every row before the next, so 2 x 5 accumulators, one weight vector and the block's scales fit
 * the 16 registers without spills (6 rows spill: measured 1.1-1.2x the 5-row tile's cost per row).
 * Every row's two chains take the same fused multiply-adds in the same order as dot_fused_avx2
 * and dot_scalar (a: w0 then w2, b: w1 then w3, block after block), so the tile changes which
 * rows share an unpack, never a row's value. Each row has its own pointer into x and one byte
 * offset walks all of them: with x + t * xs written out, GCC keeps an address register per row
 * and quarter and spills them past 4 rows (measured ~1.6x slower per row). */
#define WIDE_ROWS 5
#define XROW(p, o) _mm256_loadu_ps((const float *)((p) + (o)))
QG_AVX2 static inline __attribute__((always_inline)) void dot_wide_avx2(const int fmt, const uint8_t *q, const float *d,
                                                                         const float *m, int64_t nb, const float *x,
                                                                         int64_t xs, float *res) {
    __m256 a[WIDE_ROWS], b[WIDE_ROWS];
    const char *xr[WIDE_ROWS];
    for (int t = 0; t < WIDE_ROWS; t++) {
        a[t] = b[t] = _mm256_setzero_ps();
        xr[t] = (const char *)(x + t * xs);
    }
    for (int64_t blk = 0, o = 0; blk < nb; blk++, o += QK * (int64_t)sizeof(float)) {
        const uint8_t *qb = q + blk * block_bytes(fmt);
        _mm_prefetch((const char *)qb + PREFETCH_BYTES, _MM_HINT_T0);
        __m256 sc[4];
        scales_avx2(fmt, d, m, blk, sc);
        for (int k = 0; k < 4; k++) {
            const __m256 w = quarter_avx2(fmt, qb, k, sc);
            if (k % 2 == 0)
                for (int t = 0; t < WIDE_ROWS; t++) a[t] = _mm256_fmadd_ps(w, XROW(xr[t], o + 32 * k), a[t]);
            else
                for (int t = 0; t < WIDE_ROWS; t++) b[t] = _mm256_fmadd_ps(w, XROW(xr[t], o + 32 * k), b[t]);
        }
    }
    if (use_tree_sums) {
        _mm_storeu_ps(res, hsum4_avx2(_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1]), _mm256_add_ps(a[2], b[2]),
                                      _mm256_add_ps(a[3], b[3])));
        res[4] = hsum_avx2(a[4], b[4]);
        return;
    }
    for (int t = 0; t < WIDE_ROWS; t++) res[t] = hsum_avx2(a[t], b[t]);
}

/* two rows of x (a learned drafter's verify) against weight rows n and n + 1 (the `pair_tiles`
 * switch): 8 chains in flight instead of 4, so the tile is no longer bound by the latency of
 * each row's two chains (2 fused multiply-adds a block each); each output's chains, operands
 * and order are dot_fused_avx2's, so its value is the 1-row decode's. (Three rows against two
 * weight rows measured 1.2-1.4x slower than the 3-row tile: 12 chains spill or crowd the
 * registers.) */
QG_AVX2 static inline __attribute__((always_inline)) void dot_pair_tile_avx2(const int fmt, const uint8_t *q,
                                                                              int64_t q_row, const float *d,
                                                                              const float *m, int64_t s_row,
                                                                              int64_t nb, const float *x, int64_t xs,
                                                                              float *res) {
    enum { T = 2 };
    __m256 a[2][T], b[2][T];
    const char *xr[T];
    for (int t = 0; t < T; t++) {
        a[0][t] = b[0][t] = a[1][t] = b[1][t] = _mm256_setzero_ps();
        xr[t] = (const char *)(x + t * xs);
    }
    for (int64_t blk = 0, o = 0; blk < nb; blk++, o += QK * (int64_t)sizeof(float)) {
        for (int c = 0; c < 2; c++) {
            const uint8_t *qb = q + c * q_row + blk * block_bytes(fmt);
            _mm_prefetch((const char *)qb + PREFETCH_BYTES, _MM_HINT_T0);
            __m256 sc[4];
            scales_avx2(fmt, d + c * s_row, m + c * s_row, blk, sc);
            for (int k = 0; k < 4; k++) {
                const __m256 w = quarter_avx2(fmt, qb, k, sc);
                if (k % 2 == 0)
                    for (int t = 0; t < T; t++) a[c][t] = _mm256_fmadd_ps(w, XROW(xr[t], o + 32 * k), a[c][t]);
                else
                    for (int t = 0; t < T; t++) b[c][t] = _mm256_fmadd_ps(w, XROW(xr[t], o + 32 * k), b[c][t]);
            }
        }
    }
    if (use_tree_sums) { /* res[c * T + t] */
        _mm_storeu_ps(res, hsum4_avx2(_mm256_add_ps(a[0][0], b[0][0]), _mm256_add_ps(a[0][1], b[0][1]),
                                      _mm256_add_ps(a[1][0], b[1][0]), _mm256_add_ps(a[1][1], b[1][1])));
        return;
    }
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < T; t++) res[c * T + t] = hsum_avx2(a[c][t], b[c][t]);
}

/* NAME: one pair of weight rows; NAME##_span (the `pair_spans` switch): `pairs` pairs in a row,
 * each output written (to out[r, 2 p + c], plus base when given) inside the format's own loop,
 * so a chunk makes one call instead of one a pair (the same tiles and values) */
#define DEFINE_PAIR_TILES(NAME, FMT) \
QG_AVX2 static void NAME(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row, int64_t nb, \
                         const float *x, int64_t xs, float *res) { \
    dot_pair_tile_avx2(FMT, q, q_row, d, m, s_row, nb, x, xs, res); \
} \
QG_AVX2 static void NAME##_span(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row, \
                                int64_t nb, const float *x, int64_t xs, int64_t pairs, float *out, int64_t os, \
                                const float *base) { \
    for (int64_t p = 0; p < pairs; p++) { \
        float res[4]; \
        dot_pair_tile_avx2(FMT, q + 2 * p * q_row, q_row, d + 2 * p * s_row, m + 2 * p * s_row, s_row, nb, x, xs, res); \
        for (int c = 0; c < 2; c++) \
            for (int r = 0; r < 2; r++) \
                out[r * os + 2 * p + c] = base != NULL ? base[r * os + 2 * p + c] + res[2 * c + r] : res[2 * c + r]; \
    } \
}
DEFINE_PAIR_TILES(pair_tiles_q4_avx2, 4)
DEFINE_PAIR_TILES(pair_tiles_q8_avx2, 8)
DEFINE_PAIR_TILES(pair_tiles_q16_avx2, 16)
DEFINE_PAIR_TILES(pair_tiles_f32_avx2, 32)

/* the tile for one format, the format a constant: its unpack is inlined without branches */
#define DEFINE_FUSED_TILES(NAME, FMT) \
QG_AVX2 static void NAME(const uint8_t *q, const float *d, const float *m, int64_t nb, const float *x, int64_t xs, \
                         int64_t R, float *res) { \
    switch (R) { \
        case WIDE_ROWS: dot_wide_avx2(FMT, q, d, m, nb, x, xs, res); break; \
        case 4: dot_fused_avx2(FMT, q, d, m, nb, x, xs, 4, res); break; \
        case 3: dot_fused_avx2(FMT, q, d, m, nb, x, xs, 3, res); break; \
        case 2: dot_fused_avx2(FMT, q, d, m, nb, x, xs, 2, res); break; \
        default: dot_fused_avx2(FMT, q, d, m, nb, x, xs, 1, res); break; \
    } \
}
DEFINE_FUSED_TILES(dots_fused_q4_avx2, 4)
DEFINE_FUSED_TILES(dots_fused_q8_avx2, 8)
DEFINE_FUSED_TILES(dots_fused_q16_avx2, 16)
DEFINE_FUSED_TILES(dots_fused_f32_avx2, 32)

/* the `tile_spans` switch: `count` weight rows in a row against R rows of x in tiles of at most
 * `most` rows (near-equal, as gemm_chunk splits them), each output written (out[r, n], plus base
 * when given) inside the format's own loop: one call a chunk instead of one a tile, the same
 * tiles and values; res holds R */
#define DEFINE_TILE_SPANS(NAME, FMT) \
QG_AVX2 static void NAME(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row, int64_t nb, \
                         const float *x, int64_t xs, int64_t R, int64_t most, int64_t count, float *out, int64_t os, \
                         const float *base, float *res) { \
    const int64_t tiles = (R + most - 1) / most; \
    for (int64_t n = 0; n < count; n++) { \
        const uint8_t *qn = q + n * q_row; \
        const float *dn = d + n * s_row, *mn = m + n * s_row; \
        for (int64_t i = 0, r = 0; i < tiles; i++) { \
            const int64_t rows = R / tiles + (i < R % tiles); \
            const float *xt = x + r * xs; \
            switch (rows) { \
                case WIDE_ROWS: dot_wide_avx2(FMT, qn, dn, mn, nb, xt, xs, res + r); break; \
                case 4: dot_fused_avx2(FMT, qn, dn, mn, nb, xt, xs, 4, res + r); break; \
                case 3: dot_fused_avx2(FMT, qn, dn, mn, nb, xt, xs, 3, res + r); break; \
                case 2: dot_fused_avx2(FMT, qn, dn, mn, nb, xt, xs, 2, res + r); break; \
                default: dot_fused_avx2(FMT, qn, dn, mn, nb, xt, xs, 1, res + r); break; \
            } \
            r += rows; \
        } \
        for (int64_t r = 0; r < R; r++) out[r * os + n] = base != NULL ? base[r * os + n] + res[r] : res[r]; \
    } \
}
DEFINE_TILE_SPANS(tile_spans_q4_avx2, 4)
DEFINE_TILE_SPANS(tile_spans_q8_avx2, 8)
DEFINE_TILE_SPANS(tile_spans_q16_avx2, 16)
DEFINE_TILE_SPANS(tile_spans_f32_avx2, 32)

/* the same for a call of exactly T rows (one tile), T a constant: no row-count switch inside the
 * loop over weight rows (the generic span above measured 2-4% slower than one call a tile for 3
 * and 4 rows, this one 12-20% faster) */
#define DEFINE_FIXED_SPANS(NAME, FMT, T) \
QG_AVX2 static void NAME(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row, int64_t nb, \
                         const float *x, int64_t xs, int64_t count, float *out, int64_t os, const float *base) { \
    for (int64_t n = 0; n < count; n++) { \
        float res[T]; \
        if (T == WIDE_ROWS) dot_wide_avx2(FMT, q + n * q_row, d + n * s_row, m + n * s_row, nb, x, xs, res); \
        else dot_fused_avx2(FMT, q + n * q_row, d + n * s_row, m + n * s_row, nb, x, xs, T < 4 ? T : 4, res); \
        for (int64_t r = 0; r < T; r++) out[r * os + n] = base != NULL ? base[r * os + n] + res[r] : res[r]; \
    } \
}
#define DEFINE_FIXED_SPANS_FMT(SUFFIX, FMT) \
DEFINE_FIXED_SPANS(span3_##SUFFIX, FMT, 3) \
DEFINE_FIXED_SPANS(span4_##SUFFIX, FMT, 4) \
DEFINE_FIXED_SPANS(span5_##SUFFIX, FMT, WIDE_ROWS)
DEFINE_FIXED_SPANS_FMT(q4_avx2, 4)
DEFINE_FIXED_SPANS_FMT(q8_avx2, 8)
DEFINE_FIXED_SPANS_FMT(q16_avx2, 16)
DEFINE_FIXED_SPANS_FMT(f32_avx2, 32)

/* two tiles of T1 and T2 rows (near-equal, as gemm_chunk splits 6-10 rows with wide tiles), both
 * constants */
#define FIXED_TILE(FMT, T, q, d, m, nb, x, xs, res) \
    do { \
        if ((T) == WIDE_ROWS) dot_wide_avx2(FMT, q, d, m, nb, x, xs, res); \
        else dot_fused_avx2(FMT, q, d, m, nb, x, xs, (T) < 4 ? (T) : 4, res); \
    } while (0)
#define DEFINE_FIXED2_SPANS(NAME, FMT, T1, T2) \
QG_AVX2 static void NAME(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row, int64_t nb, \
                         const float *x, int64_t xs, int64_t count, float *out, int64_t os, const float *base) { \
    for (int64_t n = 0; n < count; n++) { \
        float res[(T1) + (T2)]; \
        FIXED_TILE(FMT, T1, q + n * q_row, d + n * s_row, m + n * s_row, nb, x, xs, res); \
        FIXED_TILE(FMT, T2, q + n * q_row, d + n * s_row, m + n * s_row, nb, x + (T1) * xs, xs, res + (T1)); \
        for (int64_t r = 0; r < (T1) + (T2); r++) out[r * os + n] = base != NULL ? base[r * os + n] + res[r] : res[r]; \
    } \
}
#define DEFINE_FIXED2_SPANS_FMT(SUFFIX, FMT) \
DEFINE_FIXED2_SPANS(span6_##SUFFIX, FMT, 3, 3) \
DEFINE_FIXED2_SPANS(span7_##SUFFIX, FMT, 4, 3) \
DEFINE_FIXED2_SPANS(span8_##SUFFIX, FMT, 4, 4) \
DEFINE_FIXED2_SPANS(span9_##SUFFIX, FMT, WIDE_ROWS, 4) \
DEFINE_FIXED2_SPANS(span10_##SUFFIX, FMT, WIDE_ROWS, WIDE_ROWS)
DEFINE_FIXED2_SPANS_FMT(q4_avx2, 4)
DEFINE_FIXED2_SPANS_FMT(q8_avx2, 8)
DEFINE_FIXED2_SPANS_FMT(q16_avx2, 16)
DEFINE_FIXED2_SPANS_FMT(f32_avx2, 32)

typedef void (*FixedSpan)(const uint8_t *, int64_t, const float *, const float *, int64_t, int64_t, const float *,
                          int64_t, int64_t, float *, int64_t, const float *);
/* the fixed span for fmt and R rows in tiles of at most `most` rows: one tile of 3, 4 or WIDE_ROWS
 * rows, or two near-equal tiles of 6-10 rows (6-8 whatever `most`, 9-10 only with wide tiles, as
 * gemm_chunk would split them); NULL otherwise */
static FixedSpan fixed_span(int fmt, int64_t R, int64_t most) {
    static const FixedSpan spans[4][8] = {
        {span3_q4_avx2, span4_q4_avx2, span5_q4_avx2, span6_q4_avx2, span7_q4_avx2, span8_q4_avx2, span9_q4_avx2,
         span10_q4_avx2},
        {span3_q8_avx2, span4_q8_avx2, span5_q8_avx2, span6_q8_avx2, span7_q8_avx2, span8_q8_avx2, span9_q8_avx2,
         span10_q8_avx2},
        {span3_q16_avx2, span4_q16_avx2, span5_q16_avx2, span6_q16_avx2, span7_q16_avx2, span8_q16_avx2,
         span9_q16_avx2, span10_q16_avx2},
        {span3_f32_avx2, span4_f32_avx2, span5_f32_avx2, span6_f32_avx2, span7_f32_avx2, span8_f32_avx2,
         span9_f32_avx2, span10_f32_avx2},
    };
    if (R < 3 || R > 2 * most || R > 2 * WIDE_ROWS || (R > most && R <= WIDE_ROWS)) return NULL;
    return spans[fmt == 4 ? 0 : fmt == 8 ? 1 : fmt == 16 ? 2 : 3][R - 3];
}

/* a lone row of x (a decode) against weight rows n and n + 1 (formats 4 and 8): each output's
 * accumulators and order exactly the tile's with T = 1, but two rows' chains of fused
 * multiply-adds in flight and x loaded once per block for both */
QG_AVX2 static inline __attribute__((always_inline)) void dot_pair_avx2(const int fmt, const uint8_t *q, int64_t q_row,
                                                                         const float *d, const float *m, int64_t s_row,
                                                                         int64_t nb, const float *x, float *res) {
    __m256 a[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, b[2] = {a[0], a[1]};
    for (int64_t blk = 0; blk < nb; blk++) {
        const float *xb = x + blk * QK;
        const __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
        const __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
        for (int c = 0; c < 2; c++) {
            __m256 w[4];
            _mm_prefetch((const char *)(q + c * q_row + blk * block_bytes(fmt)) + PREFETCH_BYTES, _MM_HINT_T0);
            block_avx2(fmt, q + c * q_row, blk, d + c * s_row, m + c * s_row, w);
            a[c] = _mm256_fmadd_ps(w[0], x0, a[c]);
            b[c] = _mm256_fmadd_ps(w[1], x1, b[c]);
            a[c] = _mm256_fmadd_ps(w[2], x2, a[c]);
            b[c] = _mm256_fmadd_ps(w[3], x3, b[c]);
        }
    }
    res[0] = hsum_avx2(a[0], b[0]);
    res[1] = hsum_avx2(a[1], b[1]);
}

QG_AVX2 static void dot_pair_q4_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
                                     int64_t nb, const float *x, float *res) {
    dot_pair_avx2(4, q, q_row, d, m, s_row, nb, x, res);
}

/* a lone row of x against 4-bit weight rows n .. n + 3: eight chains in flight; each output's
 * accumulators and order are the tile's with T = 1 */
QG_AVX2 static inline __attribute__((always_inline)) void dot_quad_q4_body(const uint8_t *q, int64_t q_row,
                                                                            const float *d, const float *m,
                                                                            int64_t s_row, int64_t nb, const float *x,
                                                                            float *res) {
    __m256 a[4], b[4];
    for (int c = 0; c < 4; c++) a[c] = b[c] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    for (int64_t blk = 0; blk < nb; blk++) {
        const float *xb = x + blk * QK;
        for (int c = 0; c < 4; c++) {
            const uint8_t *qc = q + c * q_row + blk * 16;
            _mm_prefetch((const char *)qc + PREFETCH_BYTES, _MM_HINT_T0);
            const __m256 dv = _mm256_set1_ps(d[c * s_row + blk]), mv = _mm256_set1_ps(m[c * s_row + blk]);
            const __m256i z0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qc));
            const __m256i z1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qc + 8)));
            a[c] = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(z0, low4)), dv, mv),
                                   _mm256_loadu_ps(xb), a[c]);
            b[c] = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(z1, low4)), dv, mv),
                                   _mm256_loadu_ps(xb + 8), b[c]);
            a[c] = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(z0, 4)), dv, mv),
                                   _mm256_loadu_ps(xb + 16), a[c]);
            b[c] = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(z1, 4)), dv, mv),
                                   _mm256_loadu_ps(xb + 24), b[c]);
        }
    }
    if (use_tree_sums) {
        _mm_storeu_ps(res, hsum4_avx2(_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1]), _mm256_add_ps(a[2], b[2]),
                                      _mm256_add_ps(a[3], b[3])));
        return;
    }
    for (int c = 0; c < 4; c++) res[c] = hsum_avx2(a[c], b[c]);
}

QG_AVX2 static void dot_quad_q4_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
                                     int64_t nb, const float *x, float *res) {
    dot_quad_q4_body(q, q_row, d, m, s_row, nb, x, res);
}

QG_AVX2 static void dot_pair_q8_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
                                     int64_t nb, const float *x, float *res) {
    dot_pair_avx2(8, q, q_row, d, m, s_row, nb, x, res);
}

/* a decode row against `groups` groups of G weight rows in a row (the `decode_spans` switch:
 * 4-bit quads, format 8 pairs), each output written (out[G g + c], plus base when given) inside
 * the format's own loop: one call a chunk instead of one a group, the same values */
QG_AVX2 static void dot_quad_q4_span_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m,
                                          int64_t s_row, int64_t nb, const float *x, int64_t groups, float *out,
                                          const float *base) {
    for (int64_t g = 0; g < groups; g++) {
        float res[4];
        dot_quad_q4_body(q + 4 * g * q_row, q_row, d + 4 * g * s_row, m + 4 * g * s_row, s_row, nb, x, res);
        for (int c = 0; c < 4; c++) out[4 * g + c] = base != NULL ? base[4 * g + c] + res[c] : res[c];
    }
}

QG_AVX2 static void dot_pair_q8_span_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m,
                                          int64_t s_row, int64_t nb, const float *x, int64_t groups, float *out,
                                          const float *base) {
    for (int64_t g = 0; g < groups; g++) {
        float res[2];
        dot_pair_avx2(8, q + 2 * g * q_row, q_row, d + 2 * g * s_row, m + 2 * g * s_row, s_row, nb, x, res);
        for (int c = 0; c < 2; c++) out[2 * g + c] = base != NULL ? base[2 * g + c] + res[c] : res[c];
    }
}

/* a decode row against format-8 weight rows whose m is all zero (Q8_0: the LM head of most
 * GGUFs; the `zero_m` switch, for weights described with zero_m): each weight is q * d by a
 * multiply and m is never read, a tenth of the bytes such a matrix streams. Bit for bit
 * dot_pair_avx2(8, ..): there w = fma(q, d, +0), the same rounded product except where it is
 * -0 (q or d zero, signs differing), which the fma makes +0; a product w * x of -0 or +0 then
 * adds to an accumulator that is never -0 (it starts at +0, and a sum that cancels exactly is
 * +0), leaving it as it was either way (and 0 * inf is NaN either way). Same lanes, chains and
 * order as the pair kernel otherwise. */
QG_AVX2 static void dot_pair_q8z_span_avx2(const uint8_t *q, int64_t q_row, const float *d, int64_t s_row, int64_t nb,
                                           const float *x, int64_t groups, float *out, const float *base) {
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *qg = q + 2 * g * q_row;
        const float *dg = d + 2 * g * s_row;
        __m256 a[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, b[2] = {a[0], a[1]};
        for (int64_t blk = 0; blk < nb; blk++) {
            const float *xb = x + blk * QK;
            const __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
            const __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
            for (int c = 0; c < 2; c++) {
                const uint8_t *qb = qg + c * q_row + blk * 32;
                _mm_prefetch((const char *)qb + PREFETCH_BYTES, _MM_HINT_T0);
                const __m256 dv = _mm256_set1_ps(dg[c * s_row + blk]);
                __m256 w[4];
                for (int k = 0; k < 4; k++)
                    w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qb + 8 * k)))),
                                         dv);
                a[c] = _mm256_fmadd_ps(w[0], x0, a[c]);
                b[c] = _mm256_fmadd_ps(w[1], x1, b[c]);
                a[c] = _mm256_fmadd_ps(w[2], x2, a[c]);
                b[c] = _mm256_fmadd_ps(w[3], x3, b[c]);
            }
        }
        for (int c = 0; c < 2; c++) {
            const float r = hsum_avx2(a[c], b[c]);
            out[2 * g + c] = base != NULL ? base[2 * g + c] + r : r;
        }
    }
}

QG_AVX2 static void dots_fused_avx2(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb,
                                    const float *x, int64_t xs, int64_t R, float *res) {
    switch (fmt) {
        case 4: dots_fused_q4_avx2(q, d, m, nb, x, xs, R, res); break;
        case 8: dots_fused_q8_avx2(q, d, m, nb, x, xs, R, res); break;
        case 16: dots_fused_q16_avx2(q, d, m, nb, x, xs, R, res); break;
        default: dots_fused_f32_avx2(q, d, m, nb, x, xs, R, res); break;
    }
}

/* res[2 c + r]: weight row n + c, row r of x */
QG_AVX2 static void pair_tiles_avx2(int fmt, const uint8_t *q, int64_t q_row, const float *d, const float *m,
                                    int64_t s_row, int64_t nb, const float *x, int64_t xs, float *res) {
    switch (fmt) {
        case 4: pair_tiles_q4_avx2(q, q_row, d, m, s_row, nb, x, xs, res); break;
        case 8: pair_tiles_q8_avx2(q, q_row, d, m, s_row, nb, x, xs, res); break;
        case 16: pair_tiles_q16_avx2(q, q_row, d, m, s_row, nb, x, xs, res); break;
        default: pair_tiles_f32_avx2(q, q_row, d, m, s_row, nb, x, xs, res); break;
    }
}

static int have_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
}
#else
static int have_avx2(void) { return 0; }
#endif

static int use_simd = -1; /* -1: auto, 0: scalar forced (tests) */
static int use_vnni = 1;  /* 0: the int8 path stays on AVX2 even where VNNI exists (tests) */
static int use_pairs = 1; /* 0: a decode row meets one weight row at a time (A/B runs, tests) */
static int use_qpairs = 1; /* 0: attention takes a KV head's queries one at a time (A/B runs, tests) */
static int use_guided = 1; /* 0: a gemm's rows in equal chunks, 4 a thread (A/B runs, tests) */
static int use_wide_attn = 1; /* 0: a query's scores 4 keys, its V sums 32 values at a time (A/B, tests) */
static int use_wide_tiles = 1; /* 0: verify rows in tiles of at most FUSED_ROWS, never WIDE_ROWS (A/B, tests) */
static int use_pair_tiles = 1; /* 0: 2 rows of x meet one weight row at a time, not two (A/B, tests) */
static int use_key_segments = 1; /* 0: attention in chunks of query heads over all keys, as before (A/B, tests) */
static int use_pair_spans = 1; /* 0: a 2-row call's pair tiles one call a pair of weight rows (A/B, tests) */
static int use_decode_spans = 1; /* 0: a decode row's quads / pairs one call a group of weight rows (A/B, tests) */
static int use_tile_spans = 1; /* 0: 3+ rows' tiles one call a tile, not a chunk's weight rows in one (A/B, tests) */
static int use_zero_m = 1; /* 0: a decode row reads a zero_m weight's m like any other's (A/B, tests) */

static inline int simd_on(void) { return use_simd != 0 && have_avx2(); }


static inline float lanes8(const float *s);

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

typedef struct {
    int8_t *q;      /* [R, K] */
    float *d;       /* [R, nb]: dx per block */
    float *s32;     /* [R, nb]: dx_b * sum of the block's xq */
    float *s16;     /* [R, 2 nb]: the same per 16 values */
    int64_t K, nb;
} QAct;

static void quantize_row(const float *x, int64_t nb, int8_t *q, float *d, float *s32, float *s16) {
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
QG_AVX2 static void quantize_row_avx2(const float *x, int64_t nb, int8_t *q, float *d, float *s32, float *s16) {
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

static float dot_q8_scalar(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, const int8_t *xq,
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
#define QG_VNNI __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")))
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

static int have_vnni(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
}

/* a lone row of x against weight rows n and n + 1 (formats 4 and 8; the driver pairs format 4) */
QG_AVX2 static void dots_q8_pair_avx2(int fmt, const uint8_t *q, int64_t q_row, const float *d, const float *m,
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

QG_AVX2 static void dots_q8_avx2(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, const QAct *A,
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
static int use_int8_spans = 1;
static int use_int8_row_pairs = 1; /* 0: a span's tiles take their rows one at a time (A/B, tests) */

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
#define QG_VNNI_SPAN __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")))
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
QG_AVX2 static void q8s_span(int fmt, const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
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

/* ---- thread pool ------------------------------------------------------------------------ */

typedef void (*chunk_fn)(void *arg, int64_t chunk);

#define MAX_WORKERS 63
#define SPIN_NS 200000    /* a worker spins this long after its last chunk before sleeping */
#define WAIT_SPIN_NS 20000 /* the caller spins this long on chunks in flight, then yields */
#define FIELD 20           /* ticket = generation << 40 | chunks << 20 | next chunk */
#define FIELD_MASK ((UINT64_C(1) << FIELD) - 1)

static struct {
    pthread_mutex_t busy;        /* one job at a time; a second caller runs inline */
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
    _Alignas(64) _Atomic uint64_t ticket; /* own cache lines: workers poll it while others count */
    _Alignas(64) _Atomic int64_t done;
    _Alignas(64) _Atomic int sleepers;
    _Atomic int active; /* workers 0 .. active-1 may take chunks of the current job */
    _Atomic(chunk_fn) fn;
    _Atomic(void *) arg;
    _Atomic int kind;            /* the current job's region kind (pool statistics) */
    _Atomic int64_t first_take;  /* when a worker took the job's first chunk (pool statistics) */
    int started;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

/* Pool statistics (off unless a measuring script turns them on: set_pool_stats): per kind of
 * region, how long the caller's regions took on the wall, how long the caller and the workers
 * spent inside chunks, how long the caller waited for chunks a worker still held after it ran
 * out of chunks to take, and how late the first worker joined. Kinds are set by the region's
 * caller (a thread-local tag), so they describe what the pool ran, never how. */
enum { KIND_OTHER, KIND_QKV, KIND_ATTENTION, KIND_O, KIND_GATE_UP, KIND_DOWN, KIND_GEMM, KIND_BLOCKS, KINDS };
static const char *const kind_names[KINDS] = {"other", "qkv", "attention", "o", "gate_up", "down", "gemm", "blocks"};

typedef struct {
    _Atomic int64_t regions, inline_regions, chunks, caller_chunks, wall_ns, caller_busy_ns, worker_busy_ns, wait_ns,
        waits, long_waits, join_ns, joined, caller_cpu_ns;
} KindStats;

static KindStats pool_stats[KINDS];
static _Atomic int stats_on = 0;
static __thread int region_kind = KIND_OTHER; /* the kind of the regions this thread starts next */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void relax(void) {
#ifdef QG_X86
    _mm_pause();
#endif
}

/* take one chunk of the job the ticket shows; -1 when none is left */
static int64_t take_chunk(uint64_t *seen) {
    uint64_t v = atomic_load(&pool.ticket);
    for (;;) {
        *seen = v;
        uint64_t chunks = (v >> FIELD) & FIELD_MASK, next = v & FIELD_MASK;
        if (next >= chunks) return -1;
        if (atomic_compare_exchange_weak(&pool.ticket, &v, v + 1)) return (int64_t)next;
    }
}

static void *worker_main(void *index_ptr) {
    const int index = (int)(intptr_t)index_ptr;
    int64_t idle_since = now_ns();
    uint64_t seen = atomic_load(&pool.ticket);
    for (;;) {
        if (index < atomic_load(&pool.active)) {
            int64_t c = take_chunk(&seen);
            if (c >= 0) { /* the job cannot finish (nor fn/arg change) before this chunk is done */
                chunk_fn fn = atomic_load(&pool.fn);
                if (atomic_load_explicit(&stats_on, memory_order_relaxed)) {
                    const int64_t t0 = now_ns();
                    int64_t zero = 0;
                    atomic_compare_exchange_strong(&pool.first_take, &zero, t0);
                    fn(atomic_load(&pool.arg), c);
                    atomic_fetch_add(&pool_stats[atomic_load(&pool.kind)].worker_busy_ns, now_ns() - t0);
                } else
                    fn(atomic_load(&pool.arg), c);
                atomic_fetch_add(&pool.done, 1);
                idle_since = now_ns();
                continue;
            }
        }
        /* nothing to take: spin a while for the next job, then sleep until the ticket moves */
        uint64_t v = atomic_load(&pool.ticket);
        int spins = 0;
        while (v == seen) {
            relax();
            if (++spins % 64 == 0 && now_ns() - idle_since > SPIN_NS) {
                pthread_mutex_lock(&pool.sleep_lock);
                atomic_fetch_add(&pool.sleepers, 1);
                while (atomic_load(&pool.ticket) == seen) pthread_cond_wait(&pool.wake, &pool.sleep_lock);
                atomic_fetch_sub(&pool.sleepers, 1);
                pthread_mutex_unlock(&pool.sleep_lock);
                idle_since = now_ns();
            }
            v = atomic_load(&pool.ticket);
        }
        seen = v;
    }
    return NULL;
}

static void pool_after_fork(void) { /* the child has none of the parent's workers */
    pthread_mutex_init(&pool.busy, NULL);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.active, 0);
    pool.started = 0;
}

/* fn(arg, c) for c in 0..chunks-1 on up to `threads` threads (the caller included) */
static void run_chunks(chunk_fn fn, void *arg, int64_t chunks, int threads) {
    if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
    const int stats = atomic_load_explicit(&stats_on, memory_order_relaxed);
    const int kind = region_kind;
    const int64_t t_start = stats ? now_ns() : 0, cpu_start = stats ? thread_cpu_ns() : 0;
    if (threads <= 1 || chunks <= 1 || chunks > (int64_t)FIELD_MASK || pthread_mutex_trylock(&pool.busy) != 0) {
        for (int64_t c = 0; c < chunks; c++) fn(arg, c);
        if (stats) {
            KindStats *K = &pool_stats[kind];
            const int64_t wall = now_ns() - t_start;
            atomic_fetch_add(&K->inline_regions, 1);
            atomic_fetch_add(&K->chunks, chunks);
            atomic_fetch_add(&K->caller_chunks, chunks);
            atomic_fetch_add(&K->wall_ns, wall);
            atomic_fetch_add(&K->caller_busy_ns, wall);
            atomic_fetch_add(&K->caller_cpu_ns, thread_cpu_ns() - cpu_start);
        }
        return;
    }
    static int fork_hook = 0;
    if (!fork_hook) {
        pthread_atfork(NULL, NULL, pool_after_fork);
        fork_hook = 1;
    }
    while (pool.started < threads - 1) {
        pthread_t tid;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&tid, &attr, worker_main, (void *)(intptr_t)pool.started);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        pool.started++;
    }
    atomic_store(&pool.fn, fn);
    atomic_store(&pool.arg, arg);
    atomic_store(&pool.done, 0);
    atomic_store(&pool.kind, kind);
    atomic_store(&pool.first_take, 0);
    atomic_store(&pool.active, threads - 1);
    uint64_t generation = (atomic_load(&pool.ticket) >> (2 * FIELD)) + 1;
    atomic_store(&pool.ticket, (generation << (2 * FIELD)) | ((uint64_t)chunks << FIELD));
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.sleep_lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
    uint64_t seen;
    int64_t c, mine = 0;
    while ((c = take_chunk(&seen)) >= 0) {
        fn(arg, c);
        atomic_fetch_add(&pool.done, 1);
        mine++;
    }
    const int64_t t_out = stats ? now_ns() : 0;
    const int waited = atomic_load(&pool.done) < chunks;
    int64_t waiting_since = 0;
    int spins = 0, yielded = 0;
    while (atomic_load(&pool.done) < chunks) { /* chunks a worker took and is still doing */
        relax();
        if (++spins % 64 == 0) {
            if (!waiting_since) waiting_since = now_ns();
            else if (now_ns() - waiting_since > WAIT_SPIN_NS) {
                sched_yield();
                yielded = 1;
            }
        }
    }
    if (stats) {
        KindStats *K = &pool_stats[kind];
        const int64_t t_end = now_ns(), first = atomic_load(&pool.first_take);
        atomic_fetch_add(&K->regions, 1);
        atomic_fetch_add(&K->chunks, chunks);
        atomic_fetch_add(&K->caller_chunks, mine);
        atomic_fetch_add(&K->wall_ns, t_end - t_start);
        atomic_fetch_add(&K->caller_busy_ns, t_out - t_start);
        atomic_fetch_add(&K->wait_ns, t_end - t_out);
        atomic_fetch_add(&K->waits, waited);
        atomic_fetch_add(&K->long_waits, yielded);
        atomic_fetch_add(&K->caller_cpu_ns, thread_cpu_ns() - cpu_start);
        if (first) {
            atomic_fetch_add(&K->join_ns, first - t_start);
            atomic_fetch_add(&K->joined, 1);
        }
    }
    pthread_mutex_unlock(&pool.busy);
}

/* per-thread scratch memory (grown, never shrunk), in two slots: slot 0 for a chunk's own use,
 * slot 1 for what a caller shares with the chunks of its region (attention's per-segment partial
 * results), so that the caller's chunks growing slot 0 never move it */
/* a thread's buffers go when the thread ends (the keys' destructors): a server runs each
 * sequence in a thread of its own, and its drafter's kernel calls run there */
#define SCRATCH_SLOTS 2
static pthread_key_t scratch_keys[SCRATCH_SLOTS];
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_make_key(void) {
    for (int i = 0; i < SCRATCH_SLOTS; i++) pthread_key_create(&scratch_keys[i], free);
}

static float *scratch_slot(int slot, size_t floats) {
    static __thread float *buf[SCRATCH_SLOTS];
    static __thread size_t cap[SCRATCH_SLOTS];
    if (floats > cap[slot]) {
        float *grown = (float *)realloc(buf[slot], sizeof(float) * floats);
        if (grown == NULL) return NULL;
        pthread_once(&scratch_once, scratch_make_key);
        pthread_setspecific(scratch_keys[slot], grown);
        buf[slot] = grown;
        cap[slot] = floats;
    }
    return buf[slot];
}

static float *scratch(size_t floats) { return scratch_slot(0, floats); }

/* a chunk that cannot get its scratch memory sets its job's `failed` flag (each call has its
 * own: two callers running at once, e.g. a target and a draft head's view, never reset or read
 * each other's), and the call then reports out of memory */

/* ---- drivers ---------------------------------------------------------------------------- */

typedef struct {
    int fmt;
    const uint8_t *q;
    const float *d, *m;
    int64_t N, K;
    int zero_m; /* the caller vouches that every m is 0 (format 8): decode rows skip m (zero_m switch) */
} QWeight;

#define ROW_CHUNK 8   /* output rows per chunk (at least) */
#define CHUNKS_PER_THREAD 4
#define FUSED_ROWS 4  /* rows of x a block is multiplied into while it sits in registers */

#define GUIDED_CHUNKS 96 /* at most this many chunks in a guided schedule */

typedef struct {
    const QWeight *W;
    const float *x;
    int64_t xs, R, os, rows_per_chunk;
    float *out;
    const float *base;
    const QAct *A; /* the rows quantised (precision int8); NULL: float32 math */
    const int64_t *bounds; /* chunk c: output rows bounds[c] .. bounds[c + 1] - 1; NULL: rows_per_chunk each */
    _Atomic int *failed;   /* this call's out-of-memory flag (see scratch) */
} GemmJob;

#define Q8_TILE 8    /* rows of x a block is multiplied into while it sits in a register */
#define Q8_GROUP 64  /* rows of x kept in cache while a chunk's weight rows pass over them */

static void gemm_chunk_q8(const GemmJob *J, int64_t n0, int64_t n1, float *res) {
    const QWeight *W = J->W;
    const QAct *A = J->A;
    const int64_t nb = W->K / QK, bb = block_bytes(W->fmt), ns = nb * block_scales(W->fmt);
    const int simd = simd_on();
    for (int64_t g0 = 0; g0 < J->R; g0 += Q8_GROUP) {
        const int64_t g1 = g0 + Q8_GROUP < J->R ? g0 + Q8_GROUP : J->R;
        for (int64_t n = n0; n < n1; n++) {
            const uint8_t *q = W->q + n * nb * bb;
            const float *d = W->d + n * ns, *m = W->m + n * ns;
#ifdef QG_X86
            if (simd && use_pairs && g1 - g0 == 1 && n + 1 < n1 && W->fmt == 4) { /* (format 8's lm_head
                                                                              measured 1.5x slower in pairs) */
                dots_q8_pair_avx2(W->fmt, q, nb * bb, d, m, ns, nb, A, g0, res, 1);
                for (int c = 0; c < 2; c++, n++)
                    J->out[g0 * J->os + n] = J->base != NULL ? J->base[g0 * J->os + n] + res[c] : res[c];
                n--;
                continue;
            }
            if (simd && use_int8_spans && g1 - g0 > 1 && (W->fmt == 4 || W->fmt == 8)) {
                /* every weight row left in the chunk, the group's rows, in one call */
                q8s_span(W->fmt, q, nb * bb, d, m, ns, nb, A, g0, g1 - g0, n1 - n, J->out + g0 * J->os + n, J->os,
                         J->base != NULL ? J->base + g0 * J->os + n : NULL);
                break;
            }
            if (simd) {
                for (int64_t r = g0; r < g1; r += Q8_TILE)
                    dots_q8_avx2(W->fmt, q, d, m, nb, A, r, g1 - r < Q8_TILE ? g1 - r : Q8_TILE, res + (r - g0));
            } else
#endif
                for (int64_t r = g0; r < g1; r++)
                    res[r - g0] = dot_q8_scalar(W->fmt, q, d, m, nb, A->q + r * A->K, A->d + r * nb, A->s32 + r * nb,
                                                A->s16 + r * 2 * nb);
            for (int64_t r = g0; r < g1; r++)
                J->out[r * J->os + n] = J->base != NULL ? J->base[r * J->os + n] + res[r - g0] : res[r - g0];
        }
    }
}

static void gemm_chunk(void *arg, int64_t c) {
    const GemmJob *J = (const GemmJob *)arg;
    const QWeight *W = J->W;
    const int64_t nb = W->K / QK, bb = block_bytes(W->fmt), ns = nb * block_scales(W->fmt), R = J->R;
    float *w = scratch((size_t)(W->K + (R > Q8_GROUP ? R : Q8_GROUP)));
    if (w == NULL) {
        atomic_store(J->failed, 1);
        return;
    }
    float *res = w + W->K;
    int64_t n0 = c * J->rows_per_chunk, n1 = n0 + J->rows_per_chunk < W->N ? n0 + J->rows_per_chunk : W->N;
    if (J->bounds != NULL) {
        n0 = J->bounds[c];
        n1 = J->bounds[c + 1];
    }
    if (J->A != NULL) {
        gemm_chunk_q8(J, n0, n1, res);
        return;
    }
    const int simd = simd_on();
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *q = W->q + n * nb * bb;
        const float *d = W->d + n * ns, *m = W->m + n * ns;
#ifdef QG_X86
        if (simd && use_pairs && use_decode_spans && R == 1 && (W->fmt == 4 ? n + 3 < n1 : W->fmt == 8 && n + 1 < n1)) {
            const int64_t group = W->fmt == 4 ? 4 : 2, groups = (n1 - n) / group; /* a decode row: every group */
            const float *bs = J->base != NULL ? J->base + n : NULL;
            if (W->fmt == 4) dot_quad_q4_span_avx2(q, nb * bb, d, m, ns, nb, J->x, groups, J->out + n, bs);
            else if (W->zero_m && use_zero_m) dot_pair_q8z_span_avx2(q, nb * bb, d, ns, nb, J->x, groups, J->out + n, bs);
            else dot_pair_q8_span_avx2(q, nb * bb, d, m, ns, nb, J->x, groups, J->out + n, bs);
            n += group * groups - 1; /* the rows left over go on below */
            continue;
        }
        if (simd && use_pairs && R == 1 && W->fmt == 4 && n + 3 < n1) { /* a decode row, four weight rows */
            dot_quad_q4_avx2(q, nb * bb, d, m, ns, nb, J->x, res);
            for (int c = 0; c < 4; c++, n++) J->out[n] = J->base != NULL ? J->base[n] + res[c] : res[c];
            n--;
            continue;
        }
        if (simd && use_pairs && R == 1 && (W->fmt == 4 || W->fmt == 8) && n + 1 < n1) { /* two weight rows */
            if (W->fmt == 4) dot_pair_q4_avx2(q, nb * bb, d, m, ns, nb, J->x, res);
            else dot_pair_q8_avx2(q, nb * bb, d, m, ns, nb, J->x, res);
            for (int c = 0; c < 2; c++, n++) J->out[n] = J->base != NULL ? J->base[n] + res[c] : res[c];
            n--;
            continue;
        }
        if (simd && use_pair_tiles && use_pair_spans && R == 2 && n + 1 < n1) { /* every pair of the chunk */
            const int64_t pairs = (n1 - n) / 2;
            float *o = J->out + n;
            const float *bs = J->base != NULL ? J->base + n : NULL;
            switch (W->fmt) {
                case 4: pair_tiles_q4_avx2_span(q, nb * bb, d, m, ns, nb, J->x, J->xs, pairs, o, J->os, bs); break;
                case 8: pair_tiles_q8_avx2_span(q, nb * bb, d, m, ns, nb, J->x, J->xs, pairs, o, J->os, bs); break;
                case 16: pair_tiles_q16_avx2_span(q, nb * bb, d, m, ns, nb, J->x, J->xs, pairs, o, J->os, bs); break;
                default: pair_tiles_f32_avx2_span(q, nb * bb, d, m, ns, nb, J->x, J->xs, pairs, o, J->os, bs); break;
            }
            n += 2 * pairs - 1; /* a last unpaired weight row goes on below */
            continue;
        }
        if (simd && use_pair_tiles && R == 2 && n + 1 < n1) { /* two rows of x, two weight rows */
            pair_tiles_avx2(W->fmt, q, nb * bb, d, m, ns, nb, J->x, J->xs, res);
            for (int c = 0; c < 2; c++, n++)
                for (int64_t r = 0; r < 2; r++)
                    J->out[r * J->os + n] = J->base != NULL ? J->base[r * J->os + n] + res[2 * c + r] : res[2 * c + r];
            n--;
            continue;
        }
        const FixedSpan span = simd && use_tile_spans ? fixed_span(W->fmt, R, use_wide_tiles ? WIDE_ROWS : FUSED_ROWS)
                                                      : NULL;
        if (span != NULL) { /* one tile of 3-5 rows: every weight row left in the chunk, in one call */
            span(q, nb * bb, d, m, ns, nb, J->x, J->xs, n1 - n, J->out + n, J->os, J->base != NULL ? J->base + n : NULL);
            break;
        }
        if (simd && use_tile_spans && R > WIDE_ROWS) { /* several tiles: every weight row left, one call */
            const int64_t most = use_wide_tiles ? WIDE_ROWS : FUSED_ROWS, count = n1 - n;
            const float *bs = J->base != NULL ? J->base + n : NULL;
            float *o = J->out + n;
            switch (W->fmt) {
                case 4: tile_spans_q4_avx2(q, nb * bb, d, m, ns, nb, J->x, J->xs, R, most, count, o, J->os, bs, res); break;
                case 8: tile_spans_q8_avx2(q, nb * bb, d, m, ns, nb, J->x, J->xs, R, most, count, o, J->os, bs, res); break;
                case 16: tile_spans_q16_avx2(q, nb * bb, d, m, ns, nb, J->x, J->xs, R, most, count, o, J->os, bs, res); break;
                default: tile_spans_f32_avx2(q, nb * bb, d, m, ns, nb, J->x, J->xs, R, most, count, o, J->os, bs, res); break;
            }
            break;
        }
        if (simd) {
            /* re-unpacking the row per tile beats one unpack into a buffer shared by all
             * rows (measured: 8 rows 21.6 vs 23.2 ms a token); the rows go in the fewest tiles
             * of at most WIDE_ROWS (FUSED_ROWS with wide_tiles off), of near-equal size (9 =
             * 5 + 4, 6 = 3 + 3, not 5 + 1: a lone row's tile waits on its two accumulators'
             * latency) */
            const int64_t most = use_wide_tiles ? WIDE_ROWS : FUSED_ROWS;
            const int64_t tiles = (R + most - 1) / most;
            for (int64_t i = 0, r = 0; i < tiles; i++) {
                const int64_t rows = R / tiles + (i < R % tiles);
                dots_fused_avx2(W->fmt, q, d, m, nb, J->x + r * J->xs, J->xs, rows, res + r);
                r += rows;
            }
        } else
#endif
        {
            unpack_row_scalar(W->fmt, q, d, m, nb, w);
            for (int64_t r = 0; r < R; r++) res[r] = dot_scalar(w, J->x + r * J->xs, W->K);
        }
        if (J->base != NULL)
            for (int64_t r = 0; r < R; r++) J->out[r * J->os + n] = J->base[r * J->os + n] + res[r];
        else
            for (int64_t r = 0; r < R; r++) J->out[r * J->os + n] = res[r];
    }
}

/* A guided schedule of n output rows over `threads` threads: each chunk takes 1 / (2 threads) of
 * the rows left (rounded up to ROW_CHUNK), at least GUIDED_MIN rows, so the first chunks are
 * large (few takes) and the last ones small (a thread that finds no chunk left waits at most on
 * a short one). Which thread computes an output row never changes its value. Writes the chunk
 * bounds (bounds[0] = 0 .. bounds[chunks] = n) and returns the chunk count. */
#define GUIDED_MIN 16
static int64_t guided_bounds(int64_t n, int threads, int64_t *bounds) {
    int64_t chunks = 0, at = 0;
    bounds[0] = 0;
    while (at < n) {
        int64_t size = (n - at + 2 * threads - 1) / (2 * threads);
        size = (size + ROW_CHUNK - 1) / ROW_CHUNK * ROW_CHUNK;
        if (size < GUIDED_MIN) size = GUIDED_MIN;
        if (chunks == GUIDED_CHUNKS - 1 || at + size > n) size = n - at; /* the last chunk takes the rest */
        at += size;
        bounds[++chunks] = at;
    }
    return chunks;
}

static int gemm(const QWeight *W, const float *x, int64_t xs, int64_t R, float *out, int64_t os, const float *base,
                int threads, int int8) {
    _Atomic int failed = 0;
    GemmJob J = {W, x, xs, R, os, ROW_CHUNK, out, base, NULL, NULL, &failed};
    int64_t bounds[GUIDED_CHUNKS + 1];
    QAct A;
    void *held = NULL;
    if (int8 && W->fmt != 32 && R > 0) { /* quantise every row once, before the threads start */
        const int64_t nb = W->K / QK;
        held = malloc((size_t)(R * W->K) + sizeof(float) * (size_t)(R * nb * 4));
        if (held == NULL) return -1;
        A.d = (float *)held;
        A.s32 = A.d + R * nb;
        A.s16 = A.s32 + R * nb;
        A.q = (int8_t *)(A.s16 + R * 2 * nb);
        A.K = W->K;
        A.nb = nb;
        for (int64_t r = 0; r < R; r++) {
#ifdef QG_X86
            if (simd_on()) {
                quantize_row_avx2(x + r * xs, nb, A.q + r * W->K, A.d + r * nb, A.s32 + r * nb, A.s16 + r * 2 * nb);
                continue;
            }
#endif
            quantize_row(x + r * xs, nb, A.q + r * W->K, A.d + r * nb, A.s32 + r * nb, A.s16 + r * 2 * nb);
        }
        J.A = &A;
    }
    if (W->N * W->K * (R > 0 ? R : 1) < 65536) threads = 1;
    int64_t chunks = (W->N + J.rows_per_chunk - 1) / J.rows_per_chunk;
    if (threads > 1 && use_guided) { /* guided: chunks shrink as the rows left do */
        chunks = guided_bounds(W->N, threads, bounds);
        J.bounds = bounds;
    } else if (threads > 1) {
        /* a few chunks per thread: enough for a late worker to join, few enough that taking them
         * costs little (each take is an atomic on a shared cache line) */
        int64_t per = (W->N + threads * CHUNKS_PER_THREAD - 1) / (threads * CHUNKS_PER_THREAD);
        J.rows_per_chunk = per > ROW_CHUNK ? per : ROW_CHUNK;
        chunks = (W->N + J.rows_per_chunk - 1) / J.rows_per_chunk;
    }
    run_chunks(gemm_chunk, &J, chunks, threads);
    free(held);
    return atomic_load(&failed) ? -1 : 0;
}

typedef struct {
    const QWeight *W;
    float *out;
} DequantJob;

static void dequant_chunk(void *arg, int64_t c) {
    const DequantJob *J = (const DequantJob *)arg;
    const QWeight *W = J->W;
    const int64_t nb = W->K / QK, bb = block_bytes(W->fmt), ns = nb * block_scales(W->fmt);
    const int64_t n0 = c * 64, n1 = n0 + 64 < W->N ? n0 + 64 : W->N;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *q = W->q + n * nb * bb;
        const float *d = W->d + n * ns, *m = W->m + n * ns;
#ifdef QG_X86
        if (simd_on())
            unpack_row_avx2(W->fmt, q, d, m, nb, J->out + n * W->K);
        else
#endif
            unpack_row_scalar(W->fmt, q, d, m, nb, J->out + n * W->K);
    }
}

static void dequant(const QWeight *W, float *out, int threads) {
    DequantJob J = {W, out};
    run_chunks(dequant_chunk, &J, (W->N + 63) / 64, threads);
}

/* ---- attention ---------------------------------------------------------------------------
 * 2. Causal attention of query rows t = 0..rows-1 at positions past + t over a KV cache:
 *    out[t, h, :] = sum_j softmax_j(q[t, h] . k[g, j]) v[g, j], j = 0 .. past + t, g = h / group.
 * q is pre-scaled. Fixed order: the dot over hd in 8 lanes (lane l sums elements l, l + 8, ..),
 * lanes summed ((0+4)+(2+6))+((1+5)+(3+7)); per key segment of KEY_SEGMENT keys (below) the
 * softmax's exps and their sum in key order, the weighted sum of v accumulated per element in key
 * order; the segments merged in their order, divided by the merged sum at the end. A row depends
 * only on its own query and the keys it sees. */

static inline float lanes8(const float *s) { /* ((0+4)+(2+6))+((1+5)+(3+7)) */
    float t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6], t3 = s[3] + s[7];
    return (t0 + t2) + (t1 + t3);
}

/* exp(x) for x <= 0 (softmax arguments): 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 in two
 * parts, p a degree-6 polynomial (relative error ~2e-7); below -87 it is 0. The scalar and AVX2
 * versions perform the same operations, so they agree bit for bit. */
#define EXP_LO -87.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_C2 0.5f
#define EXP_C3 1.6666667e-1f
#define EXP_C4 4.1666667e-2f
#define EXP_C5 8.3333333e-3f
#define EXP_C6 1.3888889e-3f

static inline float exp_scalar(float x) {
    if (!(x >= EXP_LO)) return 0.0f;
    float n = nearbyintf(x * EXP_LOG2E);
    float r = fmaf(n, -EXP_LN2_HI, x);
    r = fmaf(n, -EXP_LN2_LO, r);
    float p = fmaf(EXP_C6, r, EXP_C5);
    p = fmaf(p, r, EXP_C4);
    p = fmaf(p, r, EXP_C3);
    p = fmaf(p, r, EXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t bits;
    memcpy(&bits, &p, 4);
    bits += (int32_t)n << 23;
    memcpy(&p, &bits, 4);
    return p;
}

/* one query row of one head over keys 0..keys-1 of a KV head (or of one key segment, kg and vg
 * pointing at its first row): the softmax's largest score (*top_out), its sum of exps
 * (*total_out), and the unnormalised V sum o[hd] = sum_j exp(s_j - top) v_j */
static void attend_part_scalar(const float *qv, const float *kg, const float *vg, int64_t keys, int64_t hd,
                               float *scores, float *o, float *top_out, float *total_out) {
    float top = -INFINITY;
    for (int64_t j = 0; j < keys; j++) {
        float acc[8] = {0};
        for (int64_t i = 0; i < hd; i++) acc[i % 8] = fmaf(qv[i], kg[j * hd + i], acc[i % 8]);
        scores[j] = lanes8(acc);
        if (scores[j] > top) top = scores[j];
    }
    float lane[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= keys; j += 8)
        for (int l = 0; l < 8; l++) {
            scores[j + l] = exp_scalar(scores[j + l] - top);
            lane[l] += scores[j + l];
        }
    float total = lanes8(lane);
    for (; j < keys; j++) {
        scores[j] = exp_scalar(scores[j] - top);
        total += scores[j];
    }
    memset(o, 0, sizeof(float) * (size_t)hd);
    for (j = 0; j < keys; j++)
        for (int64_t i = 0; i < hd; i++) o[i] = fmaf(scores[j], vg[j * hd + i], o[i]);
    *top_out = top;
    *total_out = total;
}

/* one query row of one head: softmax over keys 0..keys-1 of a KV head, times V, into o[hd] */
static void attend_scalar(const float *qv, const float *kg, const float *vg, int64_t keys, int64_t hd, float *scores,
                          float *o) {
    float top, total;
    attend_part_scalar(qv, kg, vg, keys, hd, scores, o, &top, &total);
    const float inv = 1.0f / total;
    for (int64_t i = 0; i < hd; i++) o[i] *= inv;
}

#ifdef QG_X86
QG_AVX2 static inline __m256 exp_avx2(__m256 x) {
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LO));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(EXP_C6), r, _mm256_set1_ps(EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23));
    return _mm256_and_ps(_mm256_castsi256_ps(bits), keep);
}

/* scores of one query against keys [j0, j1) of a KV head, eight keys at a time (eight chains in
 * flight), then four, then one; each score is the same 8-lane dot as attend_scalar's */
QG_AVX2 static inline void scores_avx2(const float *qv, const float *kg, int64_t j0, int64_t j1, int64_t hd,
                                       float *scores) {
    int64_t j = j0;
    __m256 z = _mm256_setzero_ps();
    for (; use_wide_attn && j + 8 <= j1; j += 8) {
        const float *k0 = kg + j * hd;
        __m256 a[8];
        for (int t = 0; t < 8; t++) a[t] = z;
        for (int64_t i = 0; i < hd; i += 8) {
            const __m256 q = _mm256_loadu_ps(qv + i);
            for (int t = 0; t < 8; t++) a[t] = _mm256_fmadd_ps(q, _mm256_loadu_ps(k0 + t * hd + i), a[t]);
        }
        if (use_tree_sums)
            _mm256_storeu_ps(scores + j, hsum8_avx2(a));
        else
            for (int t = 0; t < 8; t++) scores[j + t] = hsum_avx2(a[t], z);
    }
    for (; j + 4 <= j1; j += 4) {
        const float *k0 = kg + j * hd;
        __m256 a0 = z, a1 = z, a2 = z, a3 = z;
        for (int64_t i = 0; i < hd; i += 8) {
            __m256 q = _mm256_loadu_ps(qv + i);
            a0 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k0 + hd + i), a1);
            a2 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k0 + 2 * hd + i), a2);
            a3 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k0 + 3 * hd + i), a3);
        }
        if (use_tree_sums) {
            _mm_storeu_ps(scores + j, hsum4_avx2(a0, a1, a2, a3));
            continue;
        }
        scores[j] = hsum_avx2(a0, z);
        scores[j + 1] = hsum_avx2(a1, z);
        scores[j + 2] = hsum_avx2(a2, z);
        scores[j + 3] = hsum_avx2(a3, z);
    }
    for (; j < j1; j++) {
        __m256 a0 = z;
        for (int64_t i = 0; i < hd; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qv + i), _mm256_loadu_ps(kg + j * hd + i), a0);
        scores[j] = hsum_avx2(a0, z);
    }
}

/* softmax weights in place (unnormalised), their sum (returned) and the largest score (*top_out),
 * as attend_part_scalar computes them */
QG_AVX2 static inline float softmax_avx2(float *scores, int64_t keys, float *top_out) {
    /* the largest score in 8 lanes, then across them: a maximum is the same in any order (a NaN
     * score is passed over, as the scalar loop's comparison passes it over) */
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    int64_t j;
    for (j = 0; j + 8 <= keys; j += 8) m8 = _mm256_max_ps(_mm256_loadu_ps(scores + j), m8);
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, m8);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > top) top = lanes[l];
    for (; j < keys; j++)
        if (scores[j] > top) top = scores[j];
    *top_out = top;
    __m256 vtop = _mm256_set1_ps(top), lane = _mm256_setzero_ps();
    for (j = 0; j + 8 <= keys; j += 8) {
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vtop));
        _mm256_storeu_ps(scores + j, e);
        lane = _mm256_add_ps(lane, e);
    }
    float total = hsum_avx2(lane, _mm256_setzero_ps());
    for (; j < keys; j++) {
        scores[j] = exp_scalar(scores[j] - top);
        total += scores[j];
    }
    return total;
}

/* scores of two queries against keys [j0, j1) of a KV head, four keys at a time: eight chains in
 * flight instead of four, each K row loaded once for both; every score is scores_avx2's */
QG_AVX2 static inline void scores2_avx2(const float *qa, const float *qb, const float *kg, int64_t j0, int64_t j1,
                                        int64_t hd, float *sa, float *sb) {
    int64_t j = j0;
    const __m256 z = _mm256_setzero_ps();
    for (; j + 4 <= j1; j += 4) {
        const float *k0 = kg + j * hd;
        __m256 a0 = z, a1 = z, a2 = z, a3 = z, b0 = z, b1 = z, b2 = z, b3 = z;
        for (int64_t i = 0; i < hd; i += 8) {
            const __m256 x = _mm256_loadu_ps(qa + i), y = _mm256_loadu_ps(qb + i);
            __m256 k = _mm256_loadu_ps(k0 + i);
            a0 = _mm256_fmadd_ps(x, k, a0);
            b0 = _mm256_fmadd_ps(y, k, b0);
            k = _mm256_loadu_ps(k0 + hd + i);
            a1 = _mm256_fmadd_ps(x, k, a1);
            b1 = _mm256_fmadd_ps(y, k, b1);
            k = _mm256_loadu_ps(k0 + 2 * hd + i);
            a2 = _mm256_fmadd_ps(x, k, a2);
            b2 = _mm256_fmadd_ps(y, k, b2);
            k = _mm256_loadu_ps(k0 + 3 * hd + i);
            a3 = _mm256_fmadd_ps(x, k, a3);
            b3 = _mm256_fmadd_ps(y, k, b3);
        }
        if (use_tree_sums) {
            const __m256 v[8] = {a0, a1, a2, a3, b0, b1, b2, b3};
            const __m256 r = hsum8_avx2(v);
            _mm_storeu_ps(sa + j, _mm256_castps256_ps128(r));
            _mm_storeu_ps(sb + j, _mm256_extractf128_ps(r, 1));
            continue;
        }
        sa[j] = hsum_avx2(a0, z), sa[j + 1] = hsum_avx2(a1, z);
        sa[j + 2] = hsum_avx2(a2, z), sa[j + 3] = hsum_avx2(a3, z);
        sb[j] = hsum_avx2(b0, z), sb[j + 1] = hsum_avx2(b1, z);
        sb[j + 2] = hsum_avx2(b2, z), sb[j + 3] = hsum_avx2(b3, z);
    }
    if (j < j1) {
        scores_avx2(qa, kg, j, j1, hd, sa);
        scores_avx2(qb, kg, j, j1, hd, sb);
    }
}

/* o += p_j v_j over keys [j0, j1) for two queries at once (hd a multiple of 32): each query's
 * lanes take its products in key order, as in the one-query loop, but eight chains are in flight
 * instead of four and each V row is loaded once for both */
QG_AVX2 static inline void weighted_v2_avx2(const float *pa, const float *pb, const float *vg, int64_t j0, int64_t j1,
                                            int64_t hd, float *oa, float *ob) {
    for (int64_t i = 0; i < hd; i += 32) {
        __m256 c0 = _mm256_loadu_ps(oa + i), c1 = _mm256_loadu_ps(oa + i + 8);
        __m256 c2 = _mm256_loadu_ps(oa + i + 16), c3 = _mm256_loadu_ps(oa + i + 24);
        __m256 e0 = _mm256_loadu_ps(ob + i), e1 = _mm256_loadu_ps(ob + i + 8);
        __m256 e2 = _mm256_loadu_ps(ob + i + 16), e3 = _mm256_loadu_ps(ob + i + 24);
        for (int64_t j = j0; j < j1; j++) {
            const __m256 a = _mm256_set1_ps(pa[j]), b = _mm256_set1_ps(pb[j]);
            const float *vj = vg + j * hd + i;
            __m256 v = _mm256_loadu_ps(vj);
            c0 = _mm256_fmadd_ps(a, v, c0);
            e0 = _mm256_fmadd_ps(b, v, e0);
            v = _mm256_loadu_ps(vj + 8);
            c1 = _mm256_fmadd_ps(a, v, c1);
            e1 = _mm256_fmadd_ps(b, v, e1);
            v = _mm256_loadu_ps(vj + 16);
            c2 = _mm256_fmadd_ps(a, v, c2);
            e2 = _mm256_fmadd_ps(b, v, e2);
            v = _mm256_loadu_ps(vj + 24);
            c3 = _mm256_fmadd_ps(a, v, c3);
            e3 = _mm256_fmadd_ps(b, v, e3);
        }
        _mm256_storeu_ps(oa + i, c0), _mm256_storeu_ps(oa + i + 8, c1);
        _mm256_storeu_ps(oa + i + 16, c2), _mm256_storeu_ps(oa + i + 24, c3);
        _mm256_storeu_ps(ob + i, e0), _mm256_storeu_ps(ob + i + 8, e1);
        _mm256_storeu_ps(ob + i + 16, e2), _mm256_storeu_ps(ob + i + 24, e3);
    }
}

/* o += p_j v_j over keys [j0, j1) for one query: 8 chunks of 8 elements in registers (eight
 * chains) while 64 are left, then up to 4; each element takes its products in key order */
QG_AVX2 static inline void weighted_v_avx2(const float *p, const float *vg, int64_t j0, int64_t j1, int64_t hd,
                                           float *o) {
    int64_t i0 = 0;
    for (; use_wide_attn && i0 + 64 <= hd; i0 += 64) {
        __m256 c[8];
        for (int t = 0; t < 8; t++) c[t] = _mm256_loadu_ps(o + i0 + 8 * t);
        for (int64_t j = j0; j < j1; j++) {
            const __m256 pj = _mm256_set1_ps(p[j]);
            const float *vj = vg + j * hd + i0;
            for (int t = 0; t < 8; t++) c[t] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * t), c[t]);
        }
        for (int t = 0; t < 8; t++) _mm256_storeu_ps(o + i0 + 8 * t, c[t]);
    }
    for (int64_t i = i0; i < hd; i += 32) {
        int64_t w = hd - i < 32 ? hd - i : 32;
        __m256 c0 = _mm256_loadu_ps(o + i), c1 = c0, c2 = c0, c3 = c0;
        if (w > 8) c1 = _mm256_loadu_ps(o + i + 8);
        if (w > 16) c2 = _mm256_loadu_ps(o + i + 16);
        if (w > 24) c3 = _mm256_loadu_ps(o + i + 24);
        for (int64_t j = j0; j < j1; j++) {
            __m256 pj = _mm256_set1_ps(p[j]);
            const float *vj = vg + j * hd + i;
            c0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj), c0);
            if (w > 8) c1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8), c1);
            if (w > 16) c2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 16), c2);
            if (w > 24) c3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 24), c3);
        }
        _mm256_storeu_ps(o + i, c0);
        if (w > 8) _mm256_storeu_ps(o + i + 8, c1);
        if (w > 16) _mm256_storeu_ps(o + i + 16, c2);
        if (w > 24) _mm256_storeu_ps(o + i + 24, c3);
    }
}

#define KEY_BLOCK 64 /* keys of K (and V) reused from L1 by every query of a KV head */

/* queries of one KV head (n of them: group heads x rows, or a share of them) over its keys 0..
 * keys[u]-1 (kg, vg: its first K and V row, or a key segment's): keys are walked in blocks so a
 * block of K and V serves every query while it is in cache; per query, the largest score
 * (tops[u]), the sum of exps (sums[u]) and the unnormalised V sum (os[u]: o += p_j v_j, j in
 * order, 8 lanes per element chunk) are exactly attend_part_scalar's */
QG_AVX2 static void attend_group_avx2(const float *const *qs, const int64_t *keys, int64_t n, const float *kg,
                                      const float *vg, int64_t hd, float *scores, int64_t stride, float *const *os,
                                      float *sums, float *tops) {
    int64_t most = 0;
    for (int64_t u = 0; u < n; u++) most = keys[u] > most ? keys[u] : most;
    /* queries two at a time where both have keys in the block (their common keys together, the
     * longer one's last keys alone: each query's scores are the same either way) */
    for (int64_t j0 = 0; j0 < most; j0 += KEY_BLOCK) {
        int64_t u = 0;
        for (; use_qpairs && u + 1 < n; u += 2) {
            const int64_t ja = j0 + KEY_BLOCK < keys[u] ? j0 + KEY_BLOCK : keys[u];
            const int64_t jb = j0 + KEY_BLOCK < keys[u + 1] ? j0 + KEY_BLOCK : keys[u + 1];
            const int64_t jc = ja < jb ? ja : jb;
            float *sa = scores + u * stride, *sb = sa + stride;
            if (jc > j0) scores2_avx2(qs[u], qs[u + 1], kg, j0, jc, hd, sa, sb);
            const int64_t c0 = jc > j0 ? jc : j0;
            if (ja > c0) scores_avx2(qs[u], kg, c0, ja, hd, sa);
            if (jb > c0) scores_avx2(qs[u + 1], kg, c0, jb, hd, sb);
        }
        for (; u < n; u++) {
            int64_t j1 = j0 + KEY_BLOCK < keys[u] ? j0 + KEY_BLOCK : keys[u];
            if (j1 > j0) scores_avx2(qs[u], kg, j0, j1, hd, scores + u * stride);
        }
    }
    for (int64_t u = 0; u < n; u++) {
        sums[u] = softmax_avx2(scores + u * stride, keys[u], &tops[u]);
        memset(os[u], 0, sizeof(float) * (size_t)hd);
    }
    for (int64_t j0 = 0; j0 < most; j0 += KEY_BLOCK) {
        int64_t u = 0;
        for (; use_qpairs && hd % 32 == 0 && u + 1 < n; u += 2) {
            const int64_t ja = j0 + KEY_BLOCK < keys[u] ? j0 + KEY_BLOCK : keys[u];
            const int64_t jb = j0 + KEY_BLOCK < keys[u + 1] ? j0 + KEY_BLOCK : keys[u + 1];
            const int64_t jc = ja < jb ? ja : jb;
            const float *pa = scores + u * stride, *pb = pa + stride;
            if (jc > j0) weighted_v2_avx2(pa, pb, vg, j0, jc, hd, os[u], os[u + 1]);
            const int64_t c0 = jc > j0 ? jc : j0;
            if (ja > c0) weighted_v_avx2(pa, vg, c0, ja, hd, os[u]);
            if (jb > c0) weighted_v_avx2(pb, vg, c0, jb, hd, os[u + 1]);
        }
        for (; u < n; u++) {
            int64_t j1 = j0 + KEY_BLOCK < keys[u] ? j0 + KEY_BLOCK : keys[u];
            if (j1 > j0) weighted_v_avx2(scores + u * stride, vg, j0, j1, hd, os[u]);
        }
    }
}

/* fold_segment (below), 8 elements at a time: the same operations, each rounded once; exp_scalar
 * and fmaf inline here as single instructions (this function may use FMA) */
QG_AVX2 static void fold_segment_avx2(float *o, float *m, float *l, const float *os, float ms, float ls, int64_t hd) {
    const float top = ms > *m ? ms : *m, fa = exp_scalar(*m - top), fb = exp_scalar(ms - top);
    *l = fmaf(ls, fb, *l * fa);
    *m = top;
    const __m256 va = _mm256_set1_ps(fa), vb = _mm256_set1_ps(fb);
    for (int64_t i = 0; i < hd; i += 8)
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(_mm256_loadu_ps(os + i), vb, _mm256_mul_ps(_mm256_loadu_ps(o + i), va)));
}
#endif

typedef struct {
    const float *q, *kc, *vc;
    float *out;
    int64_t q_row, cap, rows, heads, kv_heads, hd, past;
    int64_t split, per;      /* by heads: chunks per KV head, each up to `per` of its query heads */
    int64_t segments, parts; /* by segments: the call's key segments; query parts of a KV head */
    float *partial;          /* by segments: [rows, heads, segments, hd + 2]: V sum, top, sum of exps */
    _Atomic int64_t *done;   /* by segments: [kv_heads, parts] segments finished per query share */
    _Atomic int *failed;     /* this call's out-of-memory flag (see scratch) */
} AttentionJob;

/* ---- by key segments (the default) ----
 * A query's keys 0..past+t go in segments [s S, (s + 1) S), S = KEY_SEGMENT, a constant: the
 * boundaries depend on the key index only. Per segment the query's largest score m_s, its sum of
 * exps l_s = sum_j exp(x_j - m_s) and its unnormalised V sum o_s = sum_j exp(x_j - m_s) v_j are
 * attend_part_scalar's over the segment's keys (lanes counted from the segment's first key).
 * They fold in segment order, from (m, l, o) = (m_0, l_0, o_0): for s = 1, 2, ..
 *   top = max(m, m_s), a = exp(m - top), b = exp(m_s - top),
 *   l = fma(l_s, b, l * a), o = fma(o_s, b, o * a) per element, m = top;
 * and out = o * (1 / l) (one segment: o_0 * (1 / l_0)). So a query's output depends on its own
 * query and keys only, whatever the rows, threads and chunks: a k-row verify is the 1-row decode
 * bit for bit. Two chunkings give those same bits:
 * - segment chunks (decode, verify): (segment, KV head, share of its queries); every row and
 *   query head of the group meets the segment's K and V rows while they are in cache, so with
 *   one share each KV row is read once, and the segments balance over the threads; each stores
 *   its partial (o_s, m_s, l_s), and the chunk that finishes a share's last segment folds them;
 * - span chunks (prefill slices of many rows, arithmetic-bound): (KV head, share), every segment
 *   in order, folding as it goes into the output row (no partials through memory). */
#define KEY_SEGMENT 256

/* (m, l, o[hd]) = the fold of (m, l, o) with segment (ms, ls, os[hd]), as described above */
static void fold_segment(float *o, float *m, float *l, const float *os, float ms, float ls, int64_t hd) {
#ifdef QG_X86
    if (simd_on() && hd % 8 == 0) {
        fold_segment_avx2(o, m, l, os, ms, ls, hd);
        return;
    }
#endif
    const float top = ms > *m ? ms : *m, fa = exp_scalar(*m - top), fb = exp_scalar(ms - top);
    *l = fmaf(ls, fb, *l * fa);
    *m = top;
    for (int64_t i = 0; i < hd; i++) o[i] = fmaf(os[i], fb, o[i] * fa);
}

/* o[hd] *= 1 / l: a query's output from its folded V sum */
static void normalise_row(float *o, float l, int64_t hd) {
    const float inv = 1.0f / l;
    for (int64_t i = 0; i < hd; i++) o[i] *= inv;
}

/* one query's output from its segments' partial results part [segs, hd + 2] (V sum, top, sum of
 * exps), folded in order */
static void merge_query(const float *part, int64_t segs, int64_t hd, float *o) {
    const int64_t slot = hd + 2;
    float m = part[hd], l = part[hd + 1];
    memcpy(o, part, sizeof(float) * (size_t)hd);
    for (int64_t s = 1; s < segs; s++) fold_segment(o, &m, &l, part + s * slot, part[s * slot + hd], part[s * slot + hd + 1], hd);
    normalise_row(o, l, hd);
}

/* every query of KV head g's share p with more than one segment: its output from its segments */
static void merge_share(const AttentionJob *J, int64_t g, int64_t p) {
    const int64_t group = J->heads / J->kv_heads, hd = J->hd;
    for (int64_t u = p; u < J->rows * group; u += J->parts) {
        const int64_t t = u / group, h = g * group + u % group, end = J->past + t + 1;
        if (end <= KEY_SEGMENT) continue; /* one segment: segment_chunk wrote the output */
        const float *part = J->partial + (t * J->heads + h) * J->segments * (hd + 2);
        merge_query(part, (end + KEY_SEGMENT - 1) / KEY_SEGMENT, hd, J->out + (t * J->heads + h) * hd);
    }
}

/* A chunk's scratch: `floats` floats of the caller's layout, then (8-byte aligned) query pointers,
 * output pointers and key counts [n] each. 0 (and the call's out-of-memory flag set) when the
 * scratch cannot grow. */
typedef struct {
    float *f;
    const float **qs;
    float **os;
    int64_t *keys;
} QueryScratch;

static int query_scratch(const AttentionJob *J, size_t floats, int64_t n, QueryScratch *S) {
    const size_t pointer_floats = (2 * sizeof(void *) + sizeof(int64_t)) / sizeof(float);
    float *f = scratch(floats + pointer_floats * (size_t)n + 2);
    if (f == NULL) {
        atomic_store(J->failed, 1);
        return 0;
    }
    S->f = f;
    S->qs = (const float **)(((uintptr_t)(f + floats) + 7) & ~(uintptr_t)7);
    S->os = (float **)(S->qs + n);
    S->keys = (int64_t *)(S->os + n);
    return 1;
}

static void segment_chunk(void *arg, int64_t c) { /* segment s of KV head g, queries p, p + parts, .. */
    const AttentionJob *J = (const AttentionJob *)arg;
    const int64_t group = J->heads / J->kv_heads, hd = J->hd, slot = hd + 2, all = J->rows * group;
    const int64_t s = c / (J->kv_heads * J->parts), g = c / J->parts % J->kv_heads, p = c % J->parts;
    const int64_t a = s * KEY_SEGMENT, last = J->past + J->rows;
    const int64_t b = a + KEY_SEGMENT < last ? a + KEY_SEGMENT : last;
    const int64_t most = (all - p + J->parts - 1) / J->parts;
    /* scores [most, KEY_SEGMENT], sums [most], tops [most], then (8-byte aligned) query and
     * output pointers and key counts [most] each */
    QueryScratch S;
    if (!query_scratch(J, (size_t)(most * (KEY_SEGMENT + 2)), most, &S)) return;
    float *scores = S.f, *sums = scores + most * KEY_SEGMENT, *tops = sums + most;
    const float **qs = S.qs;
    float **os = S.os;
    int64_t *keys = S.keys;
    int64_t n = 0;
    for (int64_t u = p; u < all; u += J->parts) {
        const int64_t t = u / group, h = g * group + u % group, end = J->past + t + 1;
        if (end <= a) continue; /* a row before the segment */
        qs[n] = J->q + t * J->q_row + h * hd;
        os[n] = end <= KEY_SEGMENT ? J->out + (t * J->heads + h) * hd
                                   : J->partial + ((t * J->heads + h) * J->segments + s) * slot;
        keys[n++] = (end < b ? end : b) - a;
    }
    const float *ks = J->kc + (g * J->cap + a) * hd, *vs = J->vc + (g * J->cap + a) * hd;
#ifdef QG_X86
    if (simd_on() && hd % 8 == 0)
        attend_group_avx2(qs, keys, n, ks, vs, hd, scores, KEY_SEGMENT, os, sums, tops);
    else
#endif
        for (int64_t u = 0; u < n; u++) attend_part_scalar(qs[u], ks, vs, keys[u], hd, scores, os[u], &tops[u], &sums[u]);
    for (int64_t u = p, m = 0; u < all; u += J->parts) { /* the same queries again, in the same order */
        const int64_t end = J->past + u / group + 1;
        if (end <= a) continue;
        if (end <= KEY_SEGMENT) { /* the query's only segment: its output */
            normalise_row(os[m], sums[m], hd);
        } else {
            os[m][hd] = tops[m];
            os[m][hd + 1] = sums[m];
        }
        m++;
    }
    if (J->segments > 1 && atomic_fetch_add(&J->done[g * J->parts + p], 1) == J->segments - 1)
        merge_share(J, g, p); /* every segment of this share is in (the add orders their writes) */
}

static void span_chunk(void *arg, int64_t c) { /* KV head g, queries p, p + parts, ..: every segment */
    const AttentionJob *J = (const AttentionJob *)arg;
    const int64_t group = J->heads / J->kv_heads, hd = J->hd, all = J->rows * group;
    const int64_t g = c / J->parts, p = c % J->parts, most = (all - p + J->parts - 1) / J->parts;
    /* scores [most, KEY_SEGMENT], sums, tops, folded tops and sums [most] each, a segment's V sums
     * [most, hd], then (8-byte aligned) query and output pointers and key counts [most] each */
    QueryScratch S;
    if (!query_scratch(J, (size_t)(most * (KEY_SEGMENT + 4 + hd)), most, &S)) return;
    float *scores = S.f, *sums = scores + most * KEY_SEGMENT, *tops = sums + most, *ms = tops + most;
    float *ls = ms + most, *seg_o = ls + most;
    const float **qs = S.qs;
    float **os = S.os;
    int64_t *keys = S.keys;
    const float *kg = J->kc + g * J->cap * hd, *vg = J->vc + g * J->cap * hd;
    for (int64_t s = 0; s < J->segments; s++) {
        const int64_t a = s * KEY_SEGMENT, last = J->past + J->rows;
        const int64_t b = a + KEY_SEGMENT < last ? a + KEY_SEGMENT : last;
        int64_t n = 0;
        for (int64_t u = p, i = 0; u < all; u += J->parts, i++) {
            const int64_t t = u / group, h = g * group + u % group, end = J->past + t + 1;
            if (end <= a) continue; /* a row before the segment */
            qs[n] = J->q + t * J->q_row + h * hd;
            os[n] = s == 0 ? J->out + (t * J->heads + h) * hd : seg_o + i * hd; /* segment 0 starts the fold */
            keys[n++] = (end < b ? end : b) - a;
        }
#ifdef QG_X86
        if (simd_on() && hd % 8 == 0)
            attend_group_avx2(qs, keys, n, kg + a * hd, vg + a * hd, hd, scores, KEY_SEGMENT, os, sums, tops);
        else
#endif
            for (int64_t u = 0; u < n; u++)
                attend_part_scalar(qs[u], kg + a * hd, vg + a * hd, keys[u], hd, scores, os[u], &tops[u], &sums[u]);
        for (int64_t u = p, i = 0, m = 0; u < all; u += J->parts, i++) {
            const int64_t t = u / group, h = g * group + u % group;
            if (J->past + t + 1 <= a) continue;
            if (s == 0) {
                ms[i] = tops[m];
                ls[i] = sums[m];
            } else {
                fold_segment(J->out + (t * J->heads + h) * hd, &ms[i], &ls[i], os[m], tops[m], sums[m], hd);
            }
            m++;
        }
    }
    for (int64_t u = p, i = 0; u < all; u += J->parts, i++)
        normalise_row(J->out + ((u / group) * J->heads + g * group + u % group) * hd, ls[i], hd);
}

/* Segment chunks for calls of up to SPAN_ROWS rows (decode, verify) on several threads, segments
 * first (the early ones hold the most rows of a causal call); one share per KV head (each K and V
 * row read once) unless the segments and KV heads give the threads fewer than 2 chunks each (a
 * few rows over few keys), then as many shares, each every parts-th query of the group (rows
 * interleaved, so the shares' key counts match), as make up 2. On one thread (nothing to
 * balance) span chunks, one a KV head; longer calls (prefill slices) in span chunks too, shares
 * of the KV heads, 4 chunks a thread: their attention is arithmetic on K and V rows in cache, and
 * a segment chunk's partial results would go through memory for every row. */
#define SPAN_ROWS 16
static int attention_by_segments(AttentionJob *J, int threads) {
    const int64_t group = J->heads / J->kv_heads, span = threads <= 1 || J->rows > SPAN_ROWS;
    J->segments = (J->past + J->rows + KEY_SEGMENT - 1) / KEY_SEGMENT;
    J->parts = 1;
    const int64_t base = span ? J->kv_heads : J->kv_heads * J->segments, want = (span ? 4 : 2) * (int64_t)threads;
    if (threads > 1 && base < want) {
        J->parts = (want + base - 1) / base;
        if (J->parts > J->rows * group) J->parts = J->rows * group;
    }
    J->partial = NULL;
    J->done = NULL;
    if (!span && J->segments > 1) {
        /* partial results, then (8-byte aligned) a count of finished segments per share */
        const size_t floats = (size_t)(J->rows * J->heads * J->segments * (J->hd + 2));
        const size_t shares = (size_t)(J->kv_heads * J->parts);
        J->partial = scratch_slot(1, floats + 2 + shares * sizeof(int64_t) / sizeof(float));
        if (J->partial == NULL) return -1;
        J->done = (_Atomic int64_t *)(((uintptr_t)(J->partial + floats) + 7) & ~(uintptr_t)7);
        for (size_t i = 0; i < shares; i++) atomic_store_explicit(&J->done[i], 0, memory_order_relaxed);
    }
    run_chunks(span ? span_chunk : segment_chunk, J, base * J->parts, threads);
    return atomic_load(J->failed) ? -1 : 0;
}

/* ---- by query heads (set_key_segments(False): the previous scheme, for A/B runs) ---- */
static void heads_chunk(void *arg, int64_t c) { /* KV head g: its query heads h0..h1-1, all rows */
    const AttentionJob *J = (const AttentionJob *)arg;
    const int64_t group = J->heads / J->kv_heads, stride = J->past + J->rows;
    const int64_t g = c / J->split, h0 = g * group + (c % J->split) * J->per;
    const int64_t h1 = h0 + J->per < (g + 1) * group ? h0 + J->per : (g + 1) * group, n = (h1 - h0) * J->rows;
    /* scores [n, stride], sums [n], tops [n], then (8-byte aligned) query and output pointers and
     * key counts [n] each */
    QueryScratch S;
    if (!query_scratch(J, (size_t)(n * stride + 2 * n), n, &S)) return;
    float *scores = S.f, *sums = scores + n * stride, *tops = sums + n;
    const float **qs = S.qs;
    float **os = S.os;
    int64_t *keys = S.keys;
    const float *kg = J->kc + g * J->cap * J->hd, *vg = J->vc + g * J->cap * J->hd;
    for (int64_t t = 0, u = 0; t < J->rows; t++)
        for (int64_t h = h0; h < h1; h++, u++) {
            qs[u] = J->q + t * J->q_row + h * J->hd;
            os[u] = J->out + (t * J->heads + h) * J->hd;
            keys[u] = J->past + t + 1;
        }
#ifdef QG_X86
    if (simd_on() && J->hd % 8 == 0) {
        attend_group_avx2(qs, keys, n, kg, vg, J->hd, scores, stride, os, sums, tops);
        for (int64_t u = 0; u < n; u++) {
            const float inv = 1.0f / sums[u];
            for (int64_t i = 0; i < J->hd; i++) os[u][i] *= inv;
        }
    } else
#endif
        for (int64_t u = 0; u < n; u++) attend_scalar(qs[u], kg, vg, keys[u], J->hd, scores, os[u]);
}

/* chunks are KV heads (their queries share every K and V row while it is in cache). Where the KV
 * heads do not split evenly over the threads, several rows' queries go in single query heads
 * (SmolLM2's 3 KV heads on 2 threads: 9 chunks instead of 2 + 1, each KV head read 3 times),
 * while one row's stay KV heads unless there are fewer KV heads than threads (then as few query
 * groups as keep every thread busy). Every query is computed the same way either way. */
static int attention_by_heads(AttentionJob *J, int threads) {
    if (threads > 1 && J->rows > 1 && J->kv_heads % threads != 0) {
        J->per = 1;
        J->split = J->heads / J->kv_heads;
    } else if (threads > 1 && J->kv_heads < threads) {
        const int64_t group = J->heads / J->kv_heads, parts = (threads + J->kv_heads - 1) / J->kv_heads;
        J->per = (group + parts - 1) / parts;
        J->split = (group + J->per - 1) / J->per;
    }
    run_chunks(heads_chunk, J, J->kv_heads * J->split, threads);
    return atomic_load(J->failed) ? -1 : 0;
}

static int attention(const float *q, int64_t q_row, const float *kc, const float *vc, int64_t cap, float *out,
                     int64_t rows, int64_t heads, int64_t kv_heads, int64_t hd, int64_t past, int threads) {
    _Atomic int failed = 0;
    AttentionJob J = {q, kc, vc, out, q_row, cap, rows, heads, kv_heads, hd, past, 1, heads / kv_heads, 1, 1, NULL, NULL,
                      &failed};
    if (heads * rows * (past + rows) * hd < 262144) threads = 1;
    return use_key_segments ? attention_by_segments(&J, threads) : attention_by_heads(&J, threads);
}

/* ---- small row ops of a transformer block ------------------------------------------------
 * 3. rms_norm: out[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * w, the sum of squares in the
 *    fixed 8-lane order; rope: adjacent pairs (x[2i], x[2i+1]) of each head's first rope_dim
 *    values turned by (cos, sin) of the row's position, in place; silu_mul: out = silu(g) * u.
 *    All per row, so they keep the forward batch-invariant. */

static void rms_norm_rows(const float *x, const float *w, float *out, int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        float acc[8] = {0};
#ifdef QG_X86
        if (simd_on() && n % 8 == 0)
            rms_sumsq_avx2(xr, n, acc);
        else
#endif
            for (int64_t i = 0; i < n; i++) acc[i % 8] = fmaf(xr[i], xr[i], acc[i % 8]);
        const float scale = 1.0f / sqrtf(lanes8(acc) / (float)n + eps);
        for (int64_t i = 0; i < n; i++) o[i] = (xr[i] * scale) * w[i];
    }
}

static void rope_rows(float *x, int64_t row_stride, int64_t rows, int64_t heads, int64_t hd, int64_t rope_dim,
                      const float *table, int64_t start) {
    const int64_t half = rope_dim / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *cs = table + (start + r) * half * 2; /* [half, (cos, sin)] */
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + r * row_stride + h * hd;
            for (int64_t i = 0; i < half; i++) {
                const float a = v[2 * i], b = v[2 * i + 1], c = cs[2 * i], sn = cs[2 * i + 1];
                v[2 * i] = a * c - b * sn;
                v[2 * i + 1] = a * sn + b * c;
            }
        }
    }
}

/* silu(g) u = g sigmoid(g) u with e = exp(-|g|) (at most 1: the softmax exp above serves):
 * (g >= 0 ? g : g e) / (1 + e) * u. The AVX2 lanes do the same operations as the scalar loop,
 * so both agree bit for bit. */
static inline float silu_mul_scalar(float g, float u) {
    const float e = exp_scalar(-fabsf(g));
    return (g >= 0.0f ? g : g * e) / (1.0f + e) * u;
}

#ifdef QG_X86
QG_AVX2 static void silu_mul_avx2(const float *g, const float *u, float *o, int64_t f) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= f; j += 8) {
        const __m256 gv = _mm256_loadu_ps(g + j);
        const __m256 e = exp_avx2(_mm256_or_ps(gv, sign)); /* exp(-|g|) */
        const __m256 num = _mm256_blendv_ps(_mm256_mul_ps(gv, e), gv, _mm256_cmp_ps(gv, zero, _CMP_GE_OQ));
        _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_div_ps(num, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + j)));
    }
    for (; j < f; j++) o[j] = silu_mul_scalar(g[j], u[j]);
}
#endif

static void silu_mul_rows(const float *gu, float *out, int64_t rows, int64_t f) {
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * f, *u = g + f;
        float *o = out + r * f;
#ifdef QG_X86
        if (simd_on()) {
            silu_mul_avx2(g, u, o, f);
            continue;
        }
#endif
        for (int64_t j = 0; j < f; j++) o[j] = silu_mul_scalar(g[j], u[j]);
    }
}

/* ---- roofline probes ---------------------------------------------------------------------
 * 5. What this CPU can do at most, for the verify-cost bound (scripts time them): probe_fma runs
 *    chunks of independent 8-lane fused multiply-add chains (enough chains to cover the FMA
 *    latency on every port), probe_read sums a buffer with 8-lane loads; both on the pool. */

#define PROBE_CHAINS 12

typedef struct {
    int64_t iters;
    const float *buf;
    int64_t per_chunk; /* floats per chunk (probe_read) */
    int64_t n;
    float sums[256];
} ProbeJob;

#ifdef QG_X86
QG_AVX2 static void probe_fma_chunk(void *arg, int64_t c) {
    ProbeJob *J = (ProbeJob *)arg;
    __m256 acc[PROBE_CHAINS];
    const __m256 mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < PROBE_CHAINS; i++) acc[i] = _mm256_set1_ps((float)(i + c));
    for (int64_t it = 0; it < J->iters; it++)
        for (int i = 0; i < PROBE_CHAINS; i++) acc[i] = _mm256_fmadd_ps(acc[i], mul, add);
    __m256 t = acc[0];
    for (int i = 1; i < PROBE_CHAINS; i++) t = _mm256_add_ps(t, acc[i]);
    J->sums[c % 256] = hsum_avx2(t, _mm256_setzero_ps());
}

QG_AVX2 static void probe_read_chunk(void *arg, int64_t c) {
    ProbeJob *J = (ProbeJob *)arg;
    const int64_t i0 = c * J->per_chunk, i1 = i0 + J->per_chunk < J->n ? i0 + J->per_chunk : J->n;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = i0;
    for (; i + 32 <= i1; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(J->buf + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(J->buf + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(J->buf + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(J->buf + i + 24));
    }
    float s = hsum_avx2(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    for (; i < i1; i++) s += J->buf[i];
    J->sums[c % 256] = s;
}

/* probe_int8: the int8 path's multiply-add peak. PROBE_CHAINS independent int32 accumulators,
 * each step one 32-byte dot of unsigned bytes and int8 bytes added in (AVX2: vpmaddubsw +
 * vpmaddwd + vpaddd, as the int8 tiles; VNNI: one vpdpbusd): 32 multiply-adds a step. The
 * operands pass an empty asm each step, so the compiler cannot hoist the dots out of the loop;
 * the chains run through the adds only (1 cycle), so the multipliers' throughput is measured. */
QG_AVX2 static void probe_int8_chunk_avx2(void *arg, int64_t c) {
    ProbeJob *J = (ProbeJob *)arg;
    __m256i acc[PROBE_CHAINS];
    __m256i u = _mm256_set1_epi8(3), x = _mm256_set1_epi8((char)(5 + c));
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < PROBE_CHAINS; i++) acc[i] = _mm256_set1_epi32(i + (int)c);
    for (int64_t it = 0; it < J->iters; it++)
        for (int i = 0; i < PROBE_CHAINS; i++) {
            __asm__ volatile("" : "+x"(u), "+x"(x));
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones));
        }
    __m256i t = acc[0];
    for (int i = 1; i < PROBE_CHAINS; i++) t = _mm256_xor_si256(t, acc[i]);
    J->sums[c % 256] = (float)(_mm256_extract_epi32(t, 0) & 0xFF);
}

QG_VNNI_SPAN static void probe_int8_chunk_vnni(void *arg, int64_t c) {
    ProbeJob *J = (ProbeJob *)arg;
    __m256i acc[PROBE_CHAINS];
    __m256i u = _mm256_set1_epi8(3), x = _mm256_set1_epi8((char)(5 + c));
    for (int i = 0; i < PROBE_CHAINS; i++) acc[i] = _mm256_set1_epi32(i + (int)c);
    for (int64_t it = 0; it < J->iters; it++)
        for (int i = 0; i < PROBE_CHAINS; i++) {
            __asm__ volatile("" : "+x"(u), "+x"(x));
            acc[i] = _mm256_dpbusd_epi32(acc[i], u, x); /* latency-bound on Zen 4 / Ice Lake: 12 chains cover it */
        }
    __m256i t = acc[0];
    for (int i = 1; i < PROBE_CHAINS; i++) t = _mm256_xor_si256(t, acc[i]);
    J->sums[c % 256] = (float)(_mm256_extract_epi32(t, 0) & 0xFF);
}
#endif

/* ---- python surface: raw addresses of torch tensors (qlinear.py checks every shape) ------- */

static int check_weight(QWeight *W, int fmt, unsigned long long q, unsigned long long d, unsigned long long m,
                        long long N, long long K) {
    if ((fmt != 4 && fmt != 8 && fmt != 16 && fmt != 32) || N < 0 || K < 0 || K % QK != 0 || !q || !d || !m) {
        PyErr_SetString(PyExc_ValueError, "bad quantised weight description");
        return 0;
    }
    W->fmt = fmt;
    W->q = (const uint8_t *)(uintptr_t)q;
    W->d = (const float *)(uintptr_t)d;
    W->m = (const float *)(uintptr_t)m;
    W->N = N;
    W->K = K;
    W->zero_m = 0;
    return 1;
}

/* ---- a stack of llama blocks in one call -------------------------------------------------
 * 4. layers_forward runs whole transformer blocks on rows of the residual stream x [rows, H]
 *    (in place), each block exactly as the per-op path runs it (target.py's _kernel_block):
 *      h = rms_norm(x, attn_norm); qkv = h @ Wqkv^T (+ bqkv); rope(Q and K heads of qkv);
 *      K, V rows -> the cache at past..; a = attention(qkv, cache); x = (x (+ bo)) + a @ Wo^T;
 *      h = rms_norm(x, ffn_norm); gu = h @ Wgu^T; s = silu(g) * u; x = x + s @ Wdown^T
 *    with the same static kernels, arguments and thread counts, so every value is bit for bit
 *    the per-op path's (and, like it, independent of the row count). The weights are described
 *    once (layers_new -> a capsule of raw addresses; the caller keeps the tensors alive), so a
 *    decode step crosses from Python into C once for all its blocks instead of ~12 times each. */

typedef struct {
    const float *attn_norm, *bqkv, *bo, *ffn_norm; /* bqkv, bo: NULL when the file has none */
    QWeight wqkv, wo, gate_up, down;
} StackLayer;

typedef struct {
    int64_t H, heads, kv_heads, hd, rope_dim, ffn, n_layers;
    float eps;
    StackLayer *layers;
} LayerStack;

#define ATTN_ROW_SLICE 64 /* query rows per attention call (attention.py's ROW_SLICE) */

/* A block's first half for rows of x: attn_norm, the fused QKV (+ bias), RoPE from position
 * past, and the K, V rows written into the block's cache kl, vl [nkv, cap, hd] at past..;
 * h [rows, H] and qkv [rows, qkv_n] are the caller's scratch (qkv holds the turned Q, K, V). */
static int block_qkv_cache(const LayerStack *S, const StackLayer *L, const float *x, float *h, float *qkv, int64_t rows,
                           int64_t past, float *kl, float *vl, int64_t cap, const float *rope_table, int threads,
                           int int8) {
    const int64_t H = S->H, hd = S->hd, nh = S->heads, nkv = S->kv_heads;
    const int64_t q_size = nh * hd, qk_size = (nh + nkv) * hd, qkv_n = (nh + 2 * nkv) * hd;
    rms_norm_rows(x, L->attn_norm, h, rows, H, S->eps);
    region_kind = KIND_QKV;
    const int rc = gemm(&L->wqkv, h, H, rows, qkv, qkv_n, NULL, threads, int8);
    if (rc != 0) return rc;
    if (L->bqkv != NULL)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t n = 0; n < qkv_n; n++) qkv[r * qkv_n + n] += L->bqkv[n];
    rope_rows(qkv, qkv_n, rows, nh + nkv, hd, S->rope_dim, rope_table, past);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < nkv; g++) {
            memcpy(kl + (g * cap + past + r) * hd, qkv + r * qkv_n + q_size + g * hd, sizeof(float) * (size_t)hd);
            memcpy(vl + (g * cap + past + r) * hd, qkv + r * qkv_n + qk_size + g * hd, sizeof(float) * (size_t)hd);
        }
    return 0;
}

/* the block's scratch: h [rows, H], qkv [rows, (nh + 2 nkv) hd], attn [rows, nh hd],
 * gate_up [rows, 2 F], act [rows, F] */
static int stack_forward(const LayerStack *S, int64_t l0, int64_t l1, float *x, int64_t rows, int64_t past, float *kc,
                         float *vc, int64_t cap, const float *rope_table, int threads, int int8) {
    const int64_t H = S->H, hd = S->hd, nh = S->heads, nkv = S->kv_heads, F = S->ffn;
    const int64_t q_size = nh * hd, qkv_n = (nh + 2 * nkv) * hd;
    float *buf = (float *)malloc(sizeof(float) * (size_t)(rows * (H + qkv_n + q_size + 3 * F)));
    if (buf == NULL) return -1;
    float *h = buf, *qkv = h + rows * H, *attn = qkv + rows * qkv_n, *gu = attn + rows * q_size, *act = gu + rows * 2 * F;
    int rc = 0;
    const int64_t t_start = atomic_load_explicit(&stats_on, memory_order_relaxed) ? now_ns() : 0;
    for (int64_t i = l0; i < l1 && rc == 0; i++) {
        const StackLayer *L = &S->layers[i];
        float *kl = kc + i * nkv * cap * hd, *vl = vc + i * nkv * cap * hd; /* [nkv, cap, hd] */
        if ((rc = block_qkv_cache(S, L, x, h, qkv, rows, past, kl, vl, cap, rope_table, threads, int8)) != 0) break;
        region_kind = KIND_ATTENTION;
        for (int64_t s = 0; s < rows && rc == 0; s += ATTN_ROW_SLICE) {
            const int64_t e = s + ATTN_ROW_SLICE < rows ? s + ATTN_ROW_SLICE : rows;
            rc = attention(qkv + s * qkv_n, qkv_n, kl, vl, cap, attn + s * q_size, e - s, nh, nkv, hd, past + s, threads);
        }
        if (rc != 0) break;
        if (L->bo != NULL) /* base = x + bo, then x = base + a @ Wo^T (the per-op path's order) */
            for (int64_t r = 0; r < rows; r++)
                for (int64_t n = 0; n < H; n++) x[r * H + n] += L->bo[n];
        region_kind = KIND_O;
        if ((rc = gemm(&L->wo, attn, q_size, rows, x, H, x, threads, int8)) != 0) break;
        rms_norm_rows(x, L->ffn_norm, h, rows, H, S->eps);
        region_kind = KIND_GATE_UP;
        if ((rc = gemm(&L->gate_up, h, H, rows, gu, 2 * F, NULL, threads, int8)) != 0) break;
        silu_mul_rows(gu, act, rows, F);
        region_kind = KIND_DOWN;
        rc = gemm(&L->down, act, F, rows, x, H, x, threads, int8);
    }
    region_kind = KIND_OTHER;
    if (t_start) {
        atomic_fetch_add(&pool_stats[KIND_BLOCKS].regions, 1);
        atomic_fetch_add(&pool_stats[KIND_BLOCKS].wall_ns, now_ns() - t_start);
    }
    free(buf);
    return rc;
}

static void stack_free(PyObject *capsule) {
    LayerStack *S = (LayerStack *)PyCapsule_GetPointer(capsule, "tsspec.LayerStack");
    if (S != NULL) {
        free(S->layers);
        free(S);
    }
}

/* (fmt, q, d, m, N, K[, zero_m]): zero_m true vouches that every m is 0 (format 8 only) */
static int parse_weight(PyObject *t, QWeight *W) {
    int fmt, zero_m = 0;
    unsigned long long q, d, m;
    long long n, k;
    if (!PyArg_ParseTuple(t, "iKKKLL|p", &fmt, &q, &d, &m, &n, &k, &zero_m)) return 0;
    if (!check_weight(W, fmt, q, d, m, n, k)) return 0;
    if (zero_m && fmt != 8) {
        PyErr_SetString(PyExc_ValueError, "zero_m describes format 8 weights only");
        return 0;
    }
    W->zero_m = zero_m;
    return 1;
}

static int parse_matrix(PyObject *t, QWeight *W, long long N, long long K, const char *name) {
    if (!parse_weight(t, W)) return 0; /* (fmt, q, d, m, N, K[, zero_m]) */
    const long long n = W->N, k = W->K;
    if (n != N || k != K) {
        PyErr_Format(PyExc_ValueError, "%s is [%lld, %lld], the block needs [%lld, %lld]", name, n, k, N, K);
        return 0;
    }
    return 1;
}

/* layers_new((H, heads, kv_heads, hd, rope_dim, ffn, eps), layers): each layer a tuple
 * (attn_norm, bqkv, bo, ffn_norm, wqkv, wo, gate_up, down): addresses (0: no bias) and four
 * matrices (fmt, q, d, m, N, K[, zero_m]); returns a capsule the caller keeps with the tensors */
static PyObject *py_layers_new(PyObject *self, PyObject *args) {
    long long H, heads, kv_heads, hd, rope_dim, ffn;
    float eps;
    PyObject *list;
    if (!PyArg_ParseTuple(args, "(LLLLLLf)O", &H, &heads, &kv_heads, &hd, &rope_dim, &ffn, &eps, &list)) return NULL;
    if (H < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads || hd < 1 || rope_dim < 0 || rope_dim > hd ||
        rope_dim % 2 || ffn < 1 || !PySequence_Check(list)) {
        PyErr_SetString(PyExc_ValueError, "bad layer stack dimensions");
        return NULL;
    }
    Py_ssize_t n = PySequence_Size(list);
    if (n < 0) return NULL;
    LayerStack *S = (LayerStack *)calloc(1, sizeof(LayerStack));
    StackLayer *layers = (StackLayer *)calloc(n > 0 ? (size_t)n : 1, sizeof(StackLayer));
    if (S == NULL || layers == NULL) {
        free(S);
        free(layers);
        return PyErr_NoMemory();
    }
    *S = (LayerStack){H, heads, kv_heads, hd, rope_dim, ffn, n, eps, layers};
    const long long qkv_n = (heads + 2 * kv_heads) * hd;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(list, i);
        unsigned long long an, bq, bo, fn;
        PyObject *mw[4];
        int ok = item != NULL && PyArg_ParseTuple(item, "KKKKOOOO", &an, &bq, &bo, &fn, &mw[0], &mw[1], &mw[2], &mw[3]);
        StackLayer *L = &layers[i];
        ok = ok && parse_matrix(mw[0], &L->wqkv, qkv_n, H, "wqkv") && parse_matrix(mw[1], &L->wo, H, heads * hd, "wo") &&
             parse_matrix(mw[2], &L->gate_up, 2 * ffn, H, "w_gate_up") && parse_matrix(mw[3], &L->down, H, ffn, "w_down");
        Py_XDECREF(item);
        if (ok && (!an || !fn)) {
            PyErr_SetString(PyExc_ValueError, "a layer needs both norm weights");
            ok = 0;
        }
        if (!ok) {
            free(layers);
            free(S);
            return NULL;
        }
        L->attn_norm = (const float *)(uintptr_t)an;
        L->ffn_norm = (const float *)(uintptr_t)fn;
        L->bqkv = (const float *)(uintptr_t)bq;
        L->bo = (const float *)(uintptr_t)bo;
    }
    PyObject *capsule = PyCapsule_New(S, "tsspec.LayerStack", stack_free);
    if (capsule == NULL) {
        free(layers);
        free(S);
    }
    return capsule;
}

/* layers_forward(stack, l0, l1, x, rows, past, k, v, cap, rope_table, threads, int8): blocks
 * l0..l1-1 on x [rows, H] in place; k, v [layers, kv_heads, cap, hd]; rope_table [positions,
 * rope_dim / 2, 2] covering past + rows */
static PyObject *py_layers_forward(PyObject *self, PyObject *args) {
    PyObject *capsule;
    long long l0, l1, rows, past, cap;
    unsigned long long x, k, v, table;
    int threads, int8, rc;
    if (!PyArg_ParseTuple(args, "OLLKLLKKLKip", &capsule, &l0, &l1, &x, &rows, &past, &k, &v, &cap, &table, &threads,
                          &int8))
        return NULL;
    const LayerStack *S = (const LayerStack *)PyCapsule_GetPointer(capsule, "tsspec.LayerStack");
    if (S == NULL) return NULL;
    if (l0 < 0 || l1 < l0 || l1 > S->n_layers || !x || !k || !v || !table || rows < 1 || past < 0 ||
        past + rows > cap) {
        PyErr_SetString(PyExc_ValueError, "bad layers_forward operands");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = stack_forward(S, l0, l1, (float *)(uintptr_t)x, rows, past, (float *)(uintptr_t)k, (float *)(uintptr_t)v, cap,
                       (const float *)(uintptr_t)table, threads, int8);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* ---- huge pages for the weight stream (the `huge_pages` switch) --------------------------
 * A decode step streams every weight once (~115 MB for the embedded model): on 4 KiB pages that
 * is a TLB miss and a page walk every 4 KiB, ~28,000 a step. advise_huge_pages(addr, nbytes,
 * collapse) asks Linux to back the 2 MiB-aligned pages inside [addr, addr + nbytes) with huge
 * pages (MADV_HUGEPAGE: later faults take them) and, with collapse, to move the pages already
 * there into huge pages now (MADV_COLLAPSE, Linux 6.1+; the contents stay as they are). Returns
 * the bytes advised (collapse: collapsed), 0 where the system refuses or has no such call, or
 * with set_huge_pages(False). Nothing computed changes: only which pages hold the bytes. */
static int use_huge_pages = 1;
#define HUGE_PAGE ((uintptr_t)2 << 20)

static PyObject *py_advise_huge_pages(PyObject *self, PyObject *args) {
    unsigned long long addr, nbytes;
    int collapse;
    if (!PyArg_ParseTuple(args, "KKp", &addr, &nbytes, &collapse)) return NULL;
    if (nbytes > UINTPTR_MAX - addr) {
        PyErr_SetString(PyExc_ValueError, "advise_huge_pages: the range wraps around");
        return NULL;
    }
    long long advised = 0;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t lo = ((uintptr_t)addr + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    const uintptr_t hi = ((uintptr_t)addr + (uintptr_t)nbytes) & ~(HUGE_PAGE - 1);
    if (use_huge_pages && hi > lo && madvise((void *)lo, hi - lo, MADV_HUGEPAGE) == 0) {
        advised = (long long)(hi - lo);
        if (collapse) {
            int rc;
            Py_BEGIN_ALLOW_THREADS
            rc = madvise((void *)lo, hi - lo, MADV_COLLAPSE);
            Py_END_ALLOW_THREADS
            if (rc != 0) advised = 0;
        }
    }
#else
    (void)addr;
    (void)nbytes;
    (void)collapse;
#endif
    return PyLong_FromLongLong(advised);
}

/* gemm(fmt, q, d, m, N, K, x, R, out, base, threads[, int8[, zero_m]]): out[R, N] = (base[R, N] +) x[R, K] @ W^T;
 * x, out and base are contiguous float32; base 0 means none; int8 true: x quantised per row
 * (the int8 arithmetic above; format 32 keeps float32) */
static PyObject *py_gemm(PyObject *self, PyObject *args) {
    QWeight W;
    int fmt, threads, rc, int8 = 0, zero_m = 0;
    unsigned long long q, d, m, x, out, base;
    long long N, K, R;
    if (!PyArg_ParseTuple(args, "iKKKLLKLKKi|pp", &fmt, &q, &d, &m, &N, &K, &x, &R, &out, &base, &threads, &int8,
                          &zero_m))
        return NULL;
    if (!check_weight(&W, fmt, q, d, m, N, K)) return NULL;
    if (zero_m && fmt != 8) {
        PyErr_SetString(PyExc_ValueError, "zero_m describes format 8 weights only");
        return NULL;
    }
    W.zero_m = zero_m;
    if (!x || !out || R < 0) {
        PyErr_SetString(PyExc_ValueError, "bad gemm operands");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    region_kind = KIND_GEMM;
    rc = gemm(&W, (const float *)(uintptr_t)x, K, R, (float *)(uintptr_t)out, N, (const float *)(uintptr_t)base, threads,
              int8);
    region_kind = KIND_OTHER;
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* dequant(fmt, q, d, m, N, K, out, threads): out[N, K] float32 */
static PyObject *py_dequant(PyObject *self, PyObject *args) {
    QWeight W;
    int fmt, threads;
    unsigned long long q, d, m, out;
    long long N, K;
    if (!PyArg_ParseTuple(args, "iKKKLLKi", &fmt, &q, &d, &m, &N, &K, &out, &threads)) return NULL;
    if (!check_weight(&W, fmt, q, d, m, N, K)) return NULL;
    if (!out) {
        PyErr_SetString(PyExc_ValueError, "bad dequant output");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    dequant(&W, (float *)(uintptr_t)out, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* attention(q, q_row, k, v, cap, out, rows, heads, kv_heads, hd, past, threads): q [rows, *]
 * with row stride q_row (heads * hd used), k and v [kv_heads, cap, hd], out [rows, heads * hd] */
static PyObject *py_attention(PyObject *self, PyObject *args) {
    unsigned long long q, k, v, out;
    long long q_row, cap, rows, heads, kv_heads, hd, past;
    int threads, rc;
    if (!PyArg_ParseTuple(args, "KLKKLKLLLLLi", &q, &q_row, &k, &v, &cap, &out, &rows, &heads, &kv_heads, &hd, &past,
                          &threads))
        return NULL;
    if (!q || !k || !v || !out || rows < 0 || heads < 1 || kv_heads < 1 || heads % kv_heads || hd < 1 || past < 0 ||
        past + rows > cap || q_row < heads * hd) {
        PyErr_SetString(PyExc_ValueError, "bad attention operands");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = attention((const float *)(uintptr_t)q, q_row, (const float *)(uintptr_t)k, (const float *)(uintptr_t)v, cap,
                   (float *)(uintptr_t)out, rows, heads, kv_heads, hd, past, threads);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* rms_norm(x, w, out, rows, n, eps) */
static PyObject *py_rms_norm(PyObject *self, PyObject *args) {
    unsigned long long x, w, out;
    long long rows, n;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKLLf", &x, &w, &out, &rows, &n, &eps)) return NULL;
    if (!x || !w || !out || rows < 0 || n < 1) {
        PyErr_SetString(PyExc_ValueError, "bad rms_norm operands");
        return NULL;
    }
    rms_norm_rows((const float *)(uintptr_t)x, (const float *)(uintptr_t)w, (float *)(uintptr_t)out, rows, n, eps);
    Py_RETURN_NONE;
}

/* rope(x, row_stride, rows, heads, hd, rope_dim, table, start): in place */
static PyObject *py_rope(PyObject *self, PyObject *args) {
    unsigned long long x, table;
    long long row_stride, rows, heads, hd, rope_dim, start;
    if (!PyArg_ParseTuple(args, "KLLLLLKL", &x, &row_stride, &rows, &heads, &hd, &rope_dim, &table, &start)) return NULL;
    if (!x || !table || rows < 0 || heads < 0 || rope_dim < 0 || rope_dim > hd || rope_dim % 2 || start < 0 ||
        row_stride < heads * hd) {
        PyErr_SetString(PyExc_ValueError, "bad rope operands");
        return NULL;
    }
    rope_rows((float *)(uintptr_t)x, row_stride, rows, heads, hd, rope_dim, (const float *)(uintptr_t)table, start);
    Py_RETURN_NONE;
}

/* silu_mul(gate_up, out, rows, f): out[r, j] = silu(gate_up[r, j]) * gate_up[r, f + j] */
static PyObject *py_silu_mul(PyObject *self, PyObject *args) {
    unsigned long long gu, out;
    long long rows, f;
    if (!PyArg_ParseTuple(args, "KKLL", &gu, &out, &rows, &f)) return NULL;
    if (!gu || !out || rows < 0 || f < 0) {
        PyErr_SetString(PyExc_ValueError, "bad silu_mul operands");
        return NULL;
    }
    silu_mul_rows((const float *)(uintptr_t)gu, (float *)(uintptr_t)out, rows, f);
    Py_RETURN_NONE;
}

static PyObject *py_set_simd(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    use_simd = on ? -1 : 0;
    Py_RETURN_NONE;
}

/* set_NAME(on): a test / A-B switch that sets one int flag */
#define DEFINE_SWITCH(NAME, FLAG) \
    static PyObject *py_set_##NAME(PyObject *self, PyObject *args) { \
        int on; \
        if (!PyArg_ParseTuple(args, "p", &on)) return NULL; \
        FLAG = on; \
        Py_RETURN_NONE; \
    }
DEFINE_SWITCH(vnni, use_vnni)
DEFINE_SWITCH(int8_spans, use_int8_spans)
DEFINE_SWITCH(int8_row_pairs, use_int8_row_pairs)
DEFINE_SWITCH(query_pairs, use_qpairs)
DEFINE_SWITCH(wide_attention, use_wide_attn)
DEFINE_SWITCH(guided, use_guided)
DEFINE_SWITCH(pairs, use_pairs)
DEFINE_SWITCH(wide_tiles, use_wide_tiles)
DEFINE_SWITCH(pair_tiles, use_pair_tiles)
DEFINE_SWITCH(key_segments, use_key_segments)
DEFINE_SWITCH(tree_sums, use_tree_sums)
DEFINE_SWITCH(pair_spans, use_pair_spans)
DEFINE_SWITCH(decode_spans, use_decode_spans)
DEFINE_SWITCH(tile_spans, use_tile_spans)
DEFINE_SWITCH(huge_pages, use_huge_pages)
DEFINE_SWITCH(zero_m, use_zero_m)

static PyObject *py_info(PyObject *self, PyObject *noargs) {
    const char *int8 = "scalar";
#ifdef QG_X86
    if (simd_on()) int8 = use_vnni && have_vnni() ? "avx512-vnni" : "avx2";
#endif
    return Py_BuildValue("{s:s,s:s,s:i}", "simd", simd_on() ? "avx2+fma" : "scalar", "int8", int8, "pool_workers",
                         pool.started);
}

/* a probe's call: chunks x iters steps of chunk function fn on `threads` threads (args: iters,
 * chunks, threads); fn NULL (a build without x86 SIMD) or a CPU without AVX2: RuntimeError */
static PyObject *run_probe(PyObject *args, const char *bad, const char *needs, chunk_fn fn) {
    long long iters, chunks;
    int threads;
    if (!PyArg_ParseTuple(args, "LLi", &iters, &chunks, &threads)) return NULL;
    if (iters < 1 || chunks < 1) {
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    if (fn == NULL || !have_avx2()) {
        PyErr_SetString(PyExc_RuntimeError, needs);
        return NULL;
    }
    ProbeJob *J = (ProbeJob *)calloc(1, sizeof(ProbeJob));
    if (J == NULL) return PyErr_NoMemory();
    J->iters = iters;
    Py_BEGIN_ALLOW_THREADS
    run_chunks(fn, J, chunks, threads);
    Py_END_ALLOW_THREADS
    double total = 0;
    for (int i = 0; i < 256; i++) total += J->sums[i];
    free(J);
    return PyFloat_FromDouble(total);
}

/* probe_fma(iters, chunks, threads): chunks x iters x 12 eight-lane FMAs (AVX2 builds only) */
static PyObject *py_probe_fma(PyObject *self, PyObject *args) {
#ifdef QG_X86
    return run_probe(args, "bad probe_fma operands", "probe_fma needs AVX2 + FMA", probe_fma_chunk);
#else
    return run_probe(args, "bad probe_fma operands", "probe_fma needs AVX2 + FMA", NULL);
#endif
}

/* probe_int8(iters, chunks, threads): chunks x iters x 12 steps of 32 int8 multiply-adds on the
 * int8 path's instructions (VNNI where it runs, else AVX2); returns a checksum (AVX2 builds only) */
static PyObject *py_probe_int8(PyObject *self, PyObject *args) {
#ifdef QG_X86
    return run_probe(args, "bad probe_int8 operands", "probe_int8 needs AVX2",
                     use_vnni && have_vnni() ? probe_int8_chunk_vnni : probe_int8_chunk_avx2);
#else
    return run_probe(args, "bad probe_int8 operands", "probe_int8 needs AVX2", NULL);
#endif
}

/* probe_read(addr, n, chunks, threads): the sum of n float32 at addr, read in up to 256 chunks */
static PyObject *py_probe_read(PyObject *self, PyObject *args) {
    unsigned long long addr;
    long long n, chunks;
    int threads;
    if (!PyArg_ParseTuple(args, "KLLi", &addr, &n, &chunks, &threads)) return NULL;
    if (!addr || n < 1 || chunks < 1 || chunks > 256) {
        PyErr_SetString(PyExc_ValueError, "bad probe_read operands");
        return NULL;
    }
#ifdef QG_X86
    if (!have_avx2()) {
        PyErr_SetString(PyExc_RuntimeError, "probe_read needs AVX2 + FMA");
        return NULL;
    }
    ProbeJob *J = (ProbeJob *)calloc(1, sizeof(ProbeJob));
    if (J == NULL) return PyErr_NoMemory();
    J->buf = (const float *)(uintptr_t)addr;
    J->n = n;
    J->per_chunk = ((n + chunks - 1) / chunks + 31) & ~(int64_t)31;
    Py_BEGIN_ALLOW_THREADS
    run_chunks(probe_read_chunk, J, (n + J->per_chunk - 1) / J->per_chunk, threads);
    Py_END_ALLOW_THREADS
    double total = 0;
    for (int i = 0; i < 256; i++) total += J->sums[i];
    free(J);
    return PyFloat_FromDouble(total);
#else
    PyErr_SetString(PyExc_RuntimeError, "probe_read needs AVX2 + FMA");
    return NULL;
#endif
}

/* set_pool_stats(on): zero the pool statistics and start (True) or stop (False) counting */
static PyObject *py_set_pool_stats(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    atomic_store(&stats_on, 0);
    for (int k = 0; k < KINDS; k++) {
        _Atomic int64_t *f = &pool_stats[k].regions;
        for (size_t i = 0; i < sizeof(KindStats) / sizeof(int64_t); i++) atomic_store(&f[i], 0);
    }
    atomic_store(&stats_on, on);
    Py_RETURN_NONE;
}

/* pool_stats(): {kind: {field: count or nanoseconds}} for the kinds that ran since set_pool_stats */
static PyObject *py_pool_stats(PyObject *self, PyObject *noargs) {
    static const char *const fields[] = {"regions",        "inline_regions", "chunks",  "caller_chunks", "wall_ns",
                                         "caller_busy_ns", "worker_busy_ns", "wait_ns", "waits",         "long_waits",
                                         "join_ns",        "joined",         "caller_cpu_ns"};
    _Static_assert(sizeof(fields) / sizeof(fields[0]) == sizeof(KindStats) / sizeof(int64_t), "one name a field");
    PyObject *all = PyDict_New();
    if (all == NULL) return NULL;
    for (int k = 0; k < KINDS; k++) {
        _Atomic int64_t *f = &pool_stats[k].regions;
        if (atomic_load(&f[0]) == 0 && atomic_load(&f[1]) == 0) continue;
        PyObject *one = PyDict_New();
        if (one == NULL || PyDict_SetItemString(all, kind_names[k], one) != 0) {
            Py_XDECREF(one);
            Py_DECREF(all);
            return NULL;
        }
        Py_DECREF(one);
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
            PyObject *v = PyLong_FromLongLong((long long)atomic_load(&f[i]));
            if (v == NULL || PyDict_SetItemString(one, fields[i], v) != 0) {
                Py_XDECREF(v);
                Py_DECREF(all);
                return NULL;
            }
            Py_DECREF(v);
        }
    }
    return all;
}

#define PING_TIMEOUT_NS 1000000

typedef struct {
    _Atomic int64_t arrived;
    int64_t chunks, deadline;
} PingJob;

/* a chunk that waits (at most PING_TIMEOUT_NS) until every chunk of its region has started */
static void ping_chunk(void *arg, int64_t c) {
    PingJob *J = (PingJob *)arg;
    (void)c;
    atomic_fetch_add(&J->arrived, 1);
    while (atomic_load(&J->arrived) < J->chunks && now_ns() < J->deadline) relax();
}

/* probe_handshake(regions, threads): the wall nanoseconds of each of `regions` pool regions of
 * `threads` chunks that each wait until all have started: what it costs to bring every thread
 * into a region and back out (a region whose workers did not come within 1 ms reads >= 1 ms) */
static PyObject *py_probe_handshake(PyObject *self, PyObject *args) {
    long long regions;
    int threads;
    if (!PyArg_ParseTuple(args, "Li", &regions, &threads)) return NULL;
    if (regions < 1 || regions > 1000000 || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "bad probe_handshake operands");
        return NULL;
    }
    int64_t *ns = (int64_t *)malloc(sizeof(int64_t) * (size_t)regions);
    if (ns == NULL) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    for (long long i = 0; i < regions; i++) {
        const int64_t t0 = now_ns();
        PingJob J = {0, threads, t0 + PING_TIMEOUT_NS};
        run_chunks(ping_chunk, &J, threads, threads);
        ns[i] = now_ns() - t0;
    }
    Py_END_ALLOW_THREADS
    PyObject *list = PyList_New((Py_ssize_t)regions);
    for (long long i = 0; list != NULL && i < regions; i++) {
        PyObject *v = PyLong_FromLongLong((long long)ns[i]);
        if (v == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    free(ns);
    return list;
}

/* ---- one native call for a whole decode or verify step (issue 16, glue) -------------------
 * 6. The final RMSNorm in torch's own order, and model_step: the embedding rows, every block
 *    (stack_forward), the final RMSNorm and the LM head in one call, so a step leaves Python
 *    once. Every value is bit for bit what the Python path gives: the embedding rows are the
 *    dequantiser's (unpack_row_*), the blocks are stack_forward, the LM head is gemm() with
 *    the Python path's arguments, and the final norm reproduces torch's F.rms_norm on float32
 *    rows exactly (the logits of the torch path therefore do not move):
 *      F.rms_norm(x, w, eps) = (x * rsqrt(mean(x * x) + eps)) * w,
 *    where torch's mean is its cascade sum (ATen's SumKernel: vectors of `lanes` floats, 4
 *    interleaved partial sums, levels of 16, the vector's lanes last) divided by n, and rsqrt is
 *    1 / sqrtf. `lanes` is torch's vector width on this CPU (8 with AVX2, 16 with AVX-512);
 *    the caller finds it by comparing against torch (model_llama's target does, at load, and
 *    keeps torch's own op where none matches). Torch sums one row this way when it reduces
 *    serially (fewer than its grain of 32768 values in the call); the caller keeps to that. */

#define TORCH_SUM_LEVELS 4
#define TORCH_SUM_ILP 4
#define TORCH_MAX_LANES 16

static int64_t ceil_log2_torch(int64_t x) { /* c10's CeilLog2 */
    if (x <= 2) return 1;
    int64_t bits = 0;
    for (uint64_t v = (uint64_t)(x - 1); v; v >>= 1) bits++;
    return bits;
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
static float torch_sum_squares(const float *x, int64_t n, int lanes) {
    /* at::sum(x * x) of one contiguous row: x * x rounded (torch's pow(x, 2)), then the
     * vectorised inner sum over n / lanes vectors, the scalar tail first, the lanes after it */
    const int64_t nvec = n / lanes, size = nvec / TORCH_SUM_ILP;
    const int64_t lp = ceil_log2_torch(size) / TORCH_SUM_LEVELS;
    const int64_t power = lp > 4 ? lp : 4, step = (int64_t)1 << power, mask = step - 1;
    float acc[TORCH_SUM_LEVELS][TORCH_SUM_ILP][TORCH_MAX_LANES];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    while (i + step <= size) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < TORCH_SUM_ILP; k++) {
                const float *v = x + (i * TORCH_SUM_ILP + k) * lanes;
                for (int l = 0; l < lanes; l++) {
                    const float sq = v[l] * v[l];
                    acc[0][k][l] += sq;
                }
            }
        for (int j = 1; j < TORCH_SUM_LEVELS; j++) {
            for (int k = 0; k < TORCH_SUM_ILP; k++)
                for (int l = 0; l < lanes; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if (i & (mask << (j * power))) break;
        }
    }
    for (; i < size; i++)
        for (int k = 0; k < TORCH_SUM_ILP; k++) {
            const float *v = x + (i * TORCH_SUM_ILP + k) * lanes;
            for (int l = 0; l < lanes; l++) {
                const float sq = v[l] * v[l];
                acc[0][k][l] += sq;
            }
        }
    for (int j = 1; j < TORCH_SUM_LEVELS; j++)
        for (int k = 0; k < TORCH_SUM_ILP; k++)
            for (int l = 0; l < lanes; l++) acc[0][k][l] += acc[j][k][l];
    for (int64_t v = size * TORCH_SUM_ILP; v < nvec; v++) /* vectors past the last group of 4 */
        for (int l = 0; l < lanes; l++) {
            const float sq = x[v * lanes + l] * x[v * lanes + l];
            acc[0][0][l] += sq;
        }
    for (int k = 1; k < TORCH_SUM_ILP; k++)
        for (int l = 0; l < lanes; l++) acc[0][0][l] += acc[0][k][l];
    float total = 0.0f;
    for (int64_t e = nvec * lanes; e < n; e++) {
        const float sq = x[e] * x[e];
        total += sq;
    }
    for (int l = 0; l < lanes; l++) total += acc[0][0][l];
    return 0.0f + total; /* the output starts at 0 and accumulates the row's sum */
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
static void rms_norm_torch_rows(const float *x, int64_t xs, const float *w, float *out, int64_t rows, int64_t n,
                                float eps, int lanes) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * xs;
        float *o = out + r * n;
        float mean = torch_sum_squares(xr, n, lanes) / (float)n;
        mean = mean + eps;
        const float scale = 1.0f / sqrtf(mean);
        for (int64_t i = 0; i < n; i++) {
            const float y = xr[i] * scale;
            o[i] = y * w[i];
        }
    }
}

static int torch_lanes_ok(int lanes) { return lanes >= 1 && lanes <= TORCH_MAX_LANES; }

/* rms_norm_torch(x, w, out, rows, n, eps, lanes): out[rows, n] = F.rms_norm(x[rows, n], w, eps)
 * bit for bit, for torch's vector width `lanes` */
static PyObject *py_rms_norm_torch(PyObject *self, PyObject *args) {
    unsigned long long x, w, out;
    long long rows, n;
    float eps;
    int lanes;
    if (!PyArg_ParseTuple(args, "KKKLLfi", &x, &w, &out, &rows, &n, &eps, &lanes)) return NULL;
    if (!x || !w || !out || rows < 0 || n < 1 || !torch_lanes_ok(lanes)) {
        PyErr_SetString(PyExc_ValueError, "bad rms_norm_torch operands");
        return NULL;
    }
    rms_norm_torch_rows((const float *)(uintptr_t)x, n, (const float *)(uintptr_t)w, (float *)(uintptr_t)out, rows, n,
                        eps, lanes);
    Py_RETURN_NONE;
}

static void embed_rows(const QWeight *E, const long long *ids, int64_t rows, float *x) {
    const int64_t nb = E->K / QK, bb = block_bytes(E->fmt), ns = nb * block_scales(E->fmt);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = ids[r];
        const uint8_t *q = E->q + n * nb * bb;
        const float *d = E->d + n * ns, *m = E->m + n * ns;
#ifdef QG_X86
        if (simd_on())
            unpack_row_avx2(E->fmt, q, d, m, nb, x + r * E->K);
        else
#endif
            unpack_row_scalar(E->fmt, q, d, m, nb, x + r * E->K);
    }
}

/* model_step(stack, ids, embed, x, past, k, v, cap, rope_table, threads, int8, head[, taps]):
 *   x[rows, H] = the embedding rows of ids (a sequence of ints in [0, embed's N)); blocks
 *   0..n_layers-1 on x in place (layers_forward); then head, when not None: a tuple
 *   (norm_w, eps, lanes, normed, first, lm_head, logits): normed[rows - first, H] =
 *   rms_norm_torch(x[first:]), logits[rows - first, V] = normed @ lm_head^T. embed and lm_head
 *   are (fmt, q, d, m, N, K). taps, when given and not None: (layers, out), a drafter's feature
 *   taps: out[rows, len(layers) H] receives the residual rows entering each of those layers
 *   (tap i in columns i H .. (i + 1) H; layer n_layers is the residual after the last block);
 *   the blocks then run in stretches between the tapped layers, as the Python path's
 *   layers_forward calls do (a block's values do not depend on where a stretch starts). */
typedef struct {
    int64_t n;
    long long *layer; /* n layer ids (malloc'd; free it once the call is done), NULL without taps */
    float *out;
} Taps;

static int parse_taps(PyObject *obj, int64_t n_layers, Taps *T) {
    T->n = 0;
    T->layer = NULL;
    T->out = NULL;
    if (obj == Py_None) return 1;
    PyObject *layers;
    unsigned long long out;
    if (!PyTuple_Check(obj)) { /* PyArg_ParseTuple would raise SystemError on a non-tuple */
        PyErr_SetString(PyExc_TypeError, "model_step: taps must be None or a (layer ids, address) tuple");
        return 0;
    }
    if (!PyArg_ParseTuple(obj, "OK", &layers, &out)) return 0;
    PyObject *seq = PySequence_Fast(layers, "model_step: taps must be a sequence of layer ids");
    if (seq == NULL) return 0;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int ok = n >= 1 && out != 0; /* any number of taps, repeats included, as the Python path */
    if (ok && (T->layer = (long long *)malloc(sizeof(long long) * (size_t)n)) == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return 0;
    }
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        T->layer[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (T->layer[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            free(T->layer);
            T->layer = NULL;
            return 0;
        }
        ok = T->layer[i] >= 0 && T->layer[i] <= n_layers;
    }
    Py_DECREF(seq);
    if (!ok) {
        free(T->layer);
        T->layer = NULL;
        PyErr_SetString(PyExc_ValueError, "bad model_step taps");
        return 0;
    }
    T->n = n;
    T->out = (float *)(uintptr_t)out;
    return 1;
}

static int stack_forward_tapped(const LayerStack *S, float *x, int64_t rows, int64_t past, float *kc, float *vc,
                                int64_t cap, const float *table, int threads, int int8, const Taps *T) {
    int64_t start = 0;
    for (;;) {
        for (int64_t i = 0; i < T->n; i++)
            if (T->layer[i] == start)
                for (int64_t r = 0; r < rows; r++)
                    memcpy(T->out + (r * T->n + i) * S->H, x + r * S->H, sizeof(float) * (size_t)S->H);
        if (start == S->n_layers) return 0;
        int64_t stop = S->n_layers; /* the next tapped layer after start */
        for (int64_t i = 0; i < T->n; i++)
            if (T->layer[i] > start && T->layer[i] < stop) stop = T->layer[i];
        const int rc = stack_forward(S, start, stop, x, rows, past, kc, vc, cap, table, threads, int8);
        if (rc != 0) return rc;
        start = stop;
    }
}

static PyObject *py_model_step(PyObject *self, PyObject *args) {
    PyObject *capsule, *ids_obj, *embed_obj, *head, *taps_obj = Py_None;
    long long past, cap;
    unsigned long long x, k, v, table;
    int threads, int8, rc;
    if (!PyArg_ParseTuple(args, "OOOKLKKLKipO|O", &capsule, &ids_obj, &embed_obj, &x, &past, &k, &v, &cap, &table,
                          &threads, &int8, &head, &taps_obj))
        return NULL;
    const LayerStack *S = (const LayerStack *)PyCapsule_GetPointer(capsule, "tsspec.LayerStack");
    if (S == NULL) return NULL;
    QWeight E, LM;
    if (!parse_weight(embed_obj, &E)) return NULL;
    if (E.K != S->H) {
        PyErr_SetString(PyExc_ValueError, "the embedding's rows are not the stack's width");
        return NULL;
    }
    Taps T;
    if (!parse_taps(taps_obj, S->n_layers, &T)) return NULL;
    PyObject *seq = PySequence_Fast(ids_obj, "model_step: ids must be a sequence of ints");
    if (seq == NULL) {
        free(T.layer);
        return NULL;
    }
    const Py_ssize_t rows = PySequence_Fast_GET_SIZE(seq);
    long long *ids = (long long *)malloc(sizeof(long long) * (size_t)(rows > 0 ? rows : 1));
    if (ids == NULL) {
        Py_DECREF(seq);
        free(T.layer);
        return PyErr_NoMemory();
    }
    int ok = rows >= 1;
    for (Py_ssize_t i = 0; ok && i < rows; i++) {
        ids[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (ids[i] == -1 && PyErr_Occurred()) ok = 0;
        else if (ids[i] < 0 || ids[i] >= E.N) {
            PyErr_Format(PyExc_ValueError, "token ids must lie in [0, %lld)", (long long)E.N);
            ok = 0;
        }
    }
    Py_DECREF(seq);
    if (ok && (!x || !k || !v || !table || past < 0 || past + rows > cap)) {
        PyErr_SetString(PyExc_ValueError, "bad model_step operands");
        ok = 0;
    }
    unsigned long long norm_w = 0, normed = 0, logits = 0;
    float eps = 0.0f;
    int lanes = 0;
    long long first = 0;
    if (ok && head != Py_None) {
        PyObject *lm_obj;
        ok = PyArg_ParseTuple(head, "KfiKLOK", &norm_w, &eps, &lanes, &normed, &first, &lm_obj, &logits) &&
             parse_weight(lm_obj, &LM);
        if (ok && (!norm_w || !normed || !logits || !torch_lanes_ok(lanes) || first < 0 || first >= rows ||
                   LM.K != S->H)) {
            PyErr_SetString(PyExc_ValueError, "bad model_step head operands");
            ok = 0;
        }
    }
    if (!ok) {
        free(ids);
        free(T.layer);
        return NULL;
    }
    float *xs = (float *)(uintptr_t)x;
    Py_BEGIN_ALLOW_THREADS
    embed_rows(&E, ids, rows, xs);
    rc = stack_forward_tapped(S, xs, rows, past, (float *)(uintptr_t)k, (float *)(uintptr_t)v, cap,
                              (const float *)(uintptr_t)table, threads, int8, &T);
    if (rc == 0 && head != Py_None) {
        float *hn = (float *)(uintptr_t)normed;
        const int64_t kept = rows - first;
        rms_norm_torch_rows(xs + first * S->H, S->H, (const float *)(uintptr_t)norm_w, hn, kept, S->H, eps, lanes);
        region_kind = KIND_GEMM;
        rc = gemm(&LM, hn, S->H, kept, (float *)(uintptr_t)logits, LM.N, NULL, threads, int8);
        region_kind = KIND_OTHER;
    }
    Py_END_ALLOW_THREADS
    free(ids);
    free(T.layer);
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* ---- a NextN draft head's whole call in one crossing ---------------------------------------
 * A per-token draft head (one llama block over [rms_norm(emb); rms_norm(h)] @ Eh^T, the NextN
 * layout) is small: on the embedded model its arithmetic is ~1/20 of a target step, and the
 * seven Python-side kernel calls, tensor allocations and glue of a head call cost as much as
 * the arithmetic. head_new describes the head once (a capsule of raw addresses that keeps the
 * layer stack's capsule alive; the caller keeps the tensors alive); head_forward runs
 *     ne, nh = rms_norm(E[slot], enorm), rms_norm(h, hnorm)
 *     u      = nh @ Eh_hid^T + (ne @ Eh_emb^T)               (the two halves of eh_proj)
 *     u      = block(u)                                        (stack_forward, KV cache at past..)
 *     out    = rms_norm(u[-1], head_norm); logits = out @ head^T   (draft vocabulary)
 * with the same static kernels, arguments and order as those seven calls, so every value is bit
 * for bit theirs. The embedding rows come from a table [slots, H] of the caller's (exact copies
 * of the target's rows), by slot. */

typedef struct {
    int64_t H;
    float eps;
    const float *enorm, *hnorm, *head_norm;
    QWeight e_emb, e_hid, head;
    const LayerStack *S;
    PyObject *stack; /* the layer stack's capsule: a reference held */
    int int8;        /* the rows quantised per row for every matrix (the gemms' int8 flag) */
} HeadDesc;

static void head_free(PyObject *capsule) {
    HeadDesc *D = (HeadDesc *)PyCapsule_GetPointer(capsule, "tsspec.HeadDesc");
    if (D != NULL) {
        Py_XDECREF(D->stack);
        free(D);
    }
}

/* head_new(stack, eps, (enorm, hnorm, head_norm), e_emb, e_hid, head[, int8]): the matrices as
 * (fmt, q, d, m, N, K[, zero_m]); e_emb, e_hid [H, H], head [K, H]; the stack one block of width H;
 * int8: every gemm of the call quantises its rows (the int8 arithmetic), else float32 rows */
static PyObject *py_head_new(PyObject *self, PyObject *args) {
    PyObject *stack, *mats[3];
    float eps;
    unsigned long long en, hn, hdn;
    int int8 = 0;
    if (!PyArg_ParseTuple(args, "Of(KKK)OOO|p", &stack, &eps, &en, &hn, &hdn, &mats[0], &mats[1], &mats[2], &int8))
        return NULL;
    const LayerStack *S = (const LayerStack *)PyCapsule_GetPointer(stack, "tsspec.LayerStack");
    if (S == NULL) return NULL;
    if (S->n_layers != 1 || !en || !hn || !hdn) {
        PyErr_SetString(PyExc_ValueError, "head_new: a one-block stack and three norm weights are needed");
        return NULL;
    }
    HeadDesc *D = (HeadDesc *)calloc(1, sizeof(HeadDesc));
    if (D == NULL) return PyErr_NoMemory();
    const long long H = S->H;
    if (!parse_matrix(mats[0], &D->e_emb, H, H, "eh_proj (embedding half)") ||
        !parse_matrix(mats[1], &D->e_hid, H, H, "eh_proj (hidden half)") || !parse_weight(mats[2], &D->head)) {
        free(D);
        return NULL;
    }
    if (D->head.K != H || D->head.N < 1) {
        PyErr_SetString(PyExc_ValueError, "head_new: the head's rows are not the stack's width");
        free(D);
        return NULL;
    }
    D->H = H;
    D->eps = eps;
    D->enorm = (const float *)(uintptr_t)en;
    D->hnorm = (const float *)(uintptr_t)hn;
    D->head_norm = (const float *)(uintptr_t)hdn;
    D->S = S;
    D->int8 = int8;
    D->stack = stack;
    Py_INCREF(stack);
    PyObject *capsule = PyCapsule_New(D, "tsspec.HeadDesc", head_free);
    if (capsule == NULL) {
        Py_DECREF(stack);
        free(D);
    }
    return capsule;
}

#define HEAD_MAX_ROWS 4096

/* top-1 over the top-k of float32 x[0..n-1] (1 <= k <= TOPK_MAX): the first index of the
 * maximum in *best and the softmax probability of the largest of the k largest, in double
 * (1 / sum_i exp(v_i - v_0)), in *prob. Returns 0 where x holds a NaN or its maximum is not
 * finite (the caller's reference path decides those), else 1. Needs no GIL. */
#define TOPK_MAX 64

static int top1_topk_of(const float *x, long long n, int k, long long *best_out, double *prob) {
    if (k > n) k = (int)n;
    float top[TOPK_MAX]; /* descending */
    int have = 0;
    long long best = 0;
    for (long long i = 0; i < n; i++) {
        const float v = x[i];
        if (v != v) return 0; /* NaN */
        if (v > x[best]) best = i;
        if (have == k && !(v > top[k - 1])) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && top[j - 1] < v) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = v;
    }
    if (!isfinite(top[0])) return 0;
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += exp((double)top[j] - (double)top[0]);
    *best_out = best;
    *prob = 1.0 / sum;
    return 1;
}

/* head_forward(head, table, table_rows, slots, h, past, k, v, cap, rope_table, threads, out, logits
 *              [, gate_n, gate_k[, h_last]]):
 * rows n = len(slots); table [table_rows, H] float32 (row slots[r] is row r's token embedding,
 * 0 <= slots[r] < table_rows); h [n, H] (its first n - 1 rows only with h_last below)
 * the rows before them; k, v [kv_heads, cap, hd] (the block's cache; rows go to past..);
 * rope_table covers past + n positions. out [H] (0: none) gets the last row after head_norm;
 * logits [K] (0: none, needs out) its draft-vocabulary logits. Returns None; with gate_k > 0
 * (needs logits, 1 <= gate_n <= K, gate_k <= TOPK_MAX) the draft-head gate runs on
 * logits[0..gate_n-1] in the same crossing: (index, probability) as top1_topk gives them, or
 * None where top1_topk gives None (the logits are written either way). h_last (0: none): the
 * last row's predecessor [H] read from there instead of h's row n-1 (h may then be 0 when n is
 * 1), so a caller need not copy it next to the others. */
static PyObject *py_head_forward(PyObject *self, PyObject *args) {
    PyObject *capsule, *slots_obj;
    unsigned long long table, h, k, v, rope, out, logits, h_last = 0;
    long long table_rows, past, cap, gate_n = 0;
    int threads, gate_k = 0;
    if (!PyArg_ParseTuple(args, "OKLOKLKKLKiKK|LiK", &capsule, &table, &table_rows, &slots_obj, &h, &past, &k, &v,
                          &cap, &rope, &threads, &out, &logits, &gate_n, &gate_k, &h_last))
        return NULL;
    const HeadDesc *D = (const HeadDesc *)PyCapsule_GetPointer(capsule, "tsspec.HeadDesc");
    if (D == NULL) return NULL;
    if (gate_k < 0 || gate_k > TOPK_MAX || (gate_k && (!logits || gate_n < 1 || gate_n > D->head.N))) {
        PyErr_SetString(PyExc_ValueError, "head_forward: the gate needs logits, 1 <= gate_n <= K and gate_k <= 64");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(slots_obj, "head_forward: slots must be a sequence of ints");
    if (seq == NULL) return NULL;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > HEAD_MAX_ROWS || !table || (!h && !(h_last && n == 1)) || !k || !v || !rope || past < 0 ||
        past + n > cap || (logits && !out)) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "bad head_forward operands");
        return NULL;
    }
    const int64_t H = D->H;
    long long *slots = (long long *)malloc(sizeof(long long) * (size_t)n);
    float *buf = (float *)malloc(sizeof(float) * (size_t)(4 * n * H)); /* emb, normed emb, normed h, u */
    if (slots == NULL || buf == NULL) {
        Py_DECREF(seq);
        free(slots);
        free(buf);
        return PyErr_NoMemory();
    }
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        slots[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (slots[i] == -1 && PyErr_Occurred()) ok = 0;
        else if (slots[i] < 0 || slots[i] >= table_rows) {
            PyErr_SetString(PyExc_ValueError, "head_forward: a slot outside the embedding table");
            ok = 0;
        }
    }
    Py_DECREF(seq);
    if (!ok) {
        free(slots);
        free(buf);
        return NULL;
    }
    const float *tab = (const float *)(uintptr_t)table;
    float *emb = buf, *ne = emb + n * H, *nh = ne + n * H, *u = nh + n * H;
    int rc, gated = 0;
    long long best = 0;
    double prob = 0.0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < n; r++) memcpy(emb + r * H, tab + slots[r] * H, sizeof(float) * (size_t)H);
    rms_norm_rows(emb, D->enorm, ne, n, H, D->eps);
    if (h_last) { /* row by row, so the same values as one call over n rows */
        rms_norm_rows((const float *)(uintptr_t)h, D->hnorm, nh, n - 1, H, D->eps);
        rms_norm_rows((const float *)(uintptr_t)h_last, D->hnorm, nh + (n - 1) * H, 1, H, D->eps);
    } else {
        rms_norm_rows((const float *)(uintptr_t)h, D->hnorm, nh, n, H, D->eps);
    }
    region_kind = KIND_GEMM;
    rc = gemm(&D->e_emb, ne, H, n, u, H, NULL, threads, D->int8);
    if (rc == 0) rc = gemm(&D->e_hid, nh, H, n, u, H, u, threads, D->int8);
    region_kind = KIND_OTHER;
    /* the block is the head's only one: a row whose output is not wanted (every row but the
     * last, all of them without out) only feeds the cache, so it runs the block's first half
     * alone (the rows are independent bit for bit: batch invariance); the rest run it whole */
    const int64_t whole = out ? 1 : 0, cache_only = n - whole;
    if (rc == 0 && cache_only) {
        const LayerStack *S = D->S;
        const int64_t qkv_n = (S->heads + 2 * S->kv_heads) * S->hd;
        float *scratch = (float *)malloc(sizeof(float) * (size_t)(cache_only * (H + qkv_n)));
        if (scratch == NULL) rc = -1;
        else {
            rc = block_qkv_cache(S, &S->layers[0], u, scratch, scratch + cache_only * H, cache_only, past,
                                 (float *)(uintptr_t)k, (float *)(uintptr_t)v, cap, (const float *)(uintptr_t)rope,
                                 threads, D->int8);
            free(scratch);
        }
        region_kind = KIND_OTHER;
    }
    if (rc == 0 && whole)
        rc = stack_forward(D->S, 0, 1, u + cache_only * H, whole, past + cache_only, (float *)(uintptr_t)k,
                           (float *)(uintptr_t)v, cap, (const float *)(uintptr_t)rope, threads, D->int8);
    if (rc == 0 && out) {
        rms_norm_rows(u + (n - 1) * H, D->head_norm, (float *)(uintptr_t)out, 1, H, D->eps);
        if (logits) {
            region_kind = KIND_GEMM;
            rc = gemm(&D->head, (const float *)(uintptr_t)out, H, 1, (float *)(uintptr_t)logits, D->head.N, NULL,
                      threads, D->int8);
            region_kind = KIND_OTHER;
        }
    }
    if (rc == 0 && gate_k) gated = top1_topk_of((const float *)(uintptr_t)logits, gate_n, gate_k, &best, &prob);
    Py_END_ALLOW_THREADS
    free(slots);
    free(buf);
    if (rc != 0) return PyErr_NoMemory();
    if (gated) return Py_BuildValue("Ld", best, prob);
    Py_RETURN_NONE;
}

/* ---- the draft-head gate: top-1 over the top-k ---------------------------------------------
 * top1_topk(x, n, k) over float32 x[0..n-1]: (the first index of the maximum, the softmax
 * probability of the largest value among the k largest, in double: 1 / sum_i exp(v_i - v_0)).
 * None where x holds a NaN or its maximum is not finite (the caller's reference path decides
 * those). The speculator's gate (confidence.top1_over_topk) on one crossing instead of a
 * handful of torch ops. */
static PyObject *py_top1_topk(PyObject *self, PyObject *args) {
    unsigned long long addr;
    long long n;
    int k;
    if (!PyArg_ParseTuple(args, "KLi", &addr, &n, &k)) return NULL;
    if (!addr || n < 1 || k < 1 || k > TOPK_MAX) {
        PyErr_SetString(PyExc_ValueError, "bad top1_topk operands");
        return NULL;
    }
    long long best;
    double prob;
    if (!top1_topk_of((const float *)(uintptr_t)addr, n, k, &best, &prob)) Py_RETURN_NONE;
    return Py_BuildValue("Ld", best, prob);
}

static PyMethodDef methods[] = {
    {"gemm", py_gemm, METH_VARARGS, "out[R, N] (+)= x[R, K] @ W[N, K]^T on quantised blocks"},
    {"dequant", py_dequant, METH_VARARGS, "W[N, K] -> float32"},
    {"attention", py_attention, METH_VARARGS, "causal attention of query rows over a KV cache"},
    {"rms_norm", py_rms_norm, METH_VARARGS, "RMSNorm of rows"},
    {"rope", py_rope, METH_VARARGS, "rotary embedding of rows, in place (adjacent pairs)"},
    {"silu_mul", py_silu_mul, METH_VARARGS, "silu(gate) * up of rows"},
    {"set_simd", py_set_simd, METH_VARARGS, "False forces the scalar path (tests)"},
    {"set_vnni", py_set_vnni, METH_VARARGS, "False keeps the int8 path on AVX2 where VNNI exists (tests)"},
    {"set_int8_spans", py_set_int8_spans, METH_VARARGS,
     "False: int8 verify rows one call a weight row and tile, not a chunk's weight rows in one (A/B, tests)"},
    {"set_int8_row_pairs", py_set_int8_row_pairs, METH_VARARGS,
     "False: an int8 span's tiles take their rows one at a time, not two in one register (A/B, tests)"},
    {"layers_new", py_layers_new, METH_VARARGS, "describe a stack of llama blocks once (a capsule)"},
    {"layers_forward", py_layers_forward, METH_VARARGS, "run blocks of a layer stack on residual rows, in place"},
    {"set_query_pairs", py_set_query_pairs, METH_VARARGS,
     "False: attention takes a KV head's queries one at a time (A/B runs, tests)"},
    {"set_wide_attention", py_set_wide_attention, METH_VARARGS,
     "False: a query's scores 4 keys, its V sums 32 values at a time (A/B runs, tests)"},
    {"set_pairs", py_set_pairs, METH_VARARGS,
     "False: a decode row meets one weight row at a time, not 4 (4-bit) or 2 (A/B runs, tests)"},
    {"set_wide_tiles", py_set_wide_tiles, METH_VARARGS,
     "False: verify rows in tiles of at most 4 rows, never 5 (A/B runs, tests)"},
    {"set_pair_tiles", py_set_pair_tiles, METH_VARARGS,
     "False: 2 rows of x meet one weight row at a time, not two (A/B runs, tests)"},
    {"set_tile_spans", py_set_tile_spans, METH_VARARGS,
     "False: 3+ rows' tiles one call a tile, not a chunk's weight rows in one (A/B runs, tests)"},
    {"set_decode_spans", py_set_decode_spans, METH_VARARGS,
     "False: a decode row's weight-row quads / pairs one call a group, not a chunk's groups in one (A/B runs, tests)"},
    {"set_pair_spans", py_set_pair_spans, METH_VARARGS,
     "False: a 2-row call's pair tiles one call a pair of weight rows, not a chunk's pairs in one (A/B runs, tests)"},
    {"set_tree_sums", py_set_tree_sums, METH_VARARGS,
     "False: every horizontal sum of a gemm tile or attention score on its own, not 4 or 8 at once (A/B runs, tests)"},
    {"set_key_segments", py_set_key_segments, METH_VARARGS,
     "False: attention in chunks of query heads over all keys, not of key segments (A/B runs, tests)"},
    {"set_guided", py_set_guided, METH_VARARGS,
     "False: a gemm's output rows in equal chunks (4 a thread), not shrinking ones (A/B runs, tests)"},
    {"advise_huge_pages", py_advise_huge_pages, METH_VARARGS,
     "advise_huge_pages(addr, nbytes, collapse): back the 2 MiB pages inside a range with huge pages; bytes advised"},
    {"set_zero_m", py_set_zero_m, METH_VARARGS,
     "False: a decode row reads the m of format 8 weights described with zero_m like any other's (A/B runs, tests)"},
    {"set_huge_pages", py_set_huge_pages, METH_VARARGS,
     "False: advise_huge_pages does nothing and returns 0 (A/B runs, tests)"},
    {"info", py_info, METH_NOARGS, "which paths this build has"},
    {"probe_fma", py_probe_fma, METH_VARARGS, "roofline probe: chunks of independent FMA chains"},
    {"probe_read", py_probe_read, METH_VARARGS, "roofline probe: sum a float32 buffer (read bandwidth)"},
    {"probe_int8", py_probe_int8, METH_VARARGS, "roofline probe: chunks of independent int8 dot chains"},
    {"set_pool_stats", py_set_pool_stats, METH_VARARGS, "zero the pool statistics; True counts from now on"},
    {"pool_stats", py_pool_stats, METH_NOARGS, "the pool statistics by kind of region (counts, nanoseconds)"},
    {"probe_handshake", py_probe_handshake, METH_VARARGS,
     "wall nanoseconds of each of a number of regions that bring every thread in and out"},
    {"rms_norm_torch", py_rms_norm_torch, METH_VARARGS, "RMSNorm of rows in torch's summation order (F.rms_norm bit for bit)"},
    {"head_new", py_head_new, METH_VARARGS, "describe a NextN draft head once (a capsule)"},
    {"head_forward", py_head_forward, METH_VARARGS,
     "a NextN draft head's call: input norms, eh_proj, its block, head norm, draft-vocabulary logits"},
    {"top1_topk", py_top1_topk, METH_VARARGS, "(argmax, softmax probability of the top-1 among the top-k) of a row"},
    {"model_step", py_model_step, METH_VARARGS,
     "embedding rows, every block, the final norm and the LM head of one step in one call"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu_kernels", "tsspec's CPU kernels.", -1, methods};

PyMODINIT_FUNC PyInit__cpu_kernels(void) {
    PyObject *m = PyModule_Create(&module);
    /* attention's key segment (tests put key counts around its boundaries) */
    if (m != NULL && PyModule_AddIntConstant(m, "KEY_SEGMENT", KEY_SEGMENT) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
