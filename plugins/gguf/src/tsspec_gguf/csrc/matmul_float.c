#include "kernels.h"

/* ---- scalar reference ------------------------------------------------------------------- */

void unpack_row_scalar(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, float *w) {
    if (is_half_fmt(fmt)) {
        unpack_row_half_scalar(fmt, q, nb, w);
        return;
    }
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

float dot_scalar(const float *w, const float *x, int64_t k) {
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




QG_AVX2 void rms_sumsq_avx2(const float *x, int64_t n, float *lanes) {
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

QG_AVX2 void unpack_row_avx2(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, float *w) {
    if (is_half_fmt(fmt)) {
        unpack_row_half(fmt, q, nb, w);
        return;
    }
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
QG_AVX2 void NAME##_span(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row, \
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
QG_AVX2 void NAME(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row, int64_t nb, \
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

/* the fixed span for fmt and R rows in tiles of at most `most` rows: one tile of 3, 4 or WIDE_ROWS
 * rows, or two near-equal tiles of 6-10 rows (6-8 whatever `most`, 9-10 only with wide tiles, as
 * gemm_chunk would split them); NULL otherwise */
FixedSpan fixed_span(int fmt, int64_t R, int64_t most) {
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

QG_AVX2 void dot_pair_q4_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
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

QG_AVX2 void dot_quad_q4_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
                                     int64_t nb, const float *x, float *res) {
    dot_quad_q4_body(q, q_row, d, m, s_row, nb, x, res);
}

QG_AVX2 void dot_pair_q8_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
                                     int64_t nb, const float *x, float *res) {
    dot_pair_avx2(8, q, q_row, d, m, s_row, nb, x, res);
}

/* a decode row against `groups` groups of G weight rows in a row (the `decode_spans` switch:
 * 4-bit quads, format 8 pairs), each output written (out[G g + c], plus base when given) inside
 * the format's own loop: one call a chunk instead of one a group, the same values */
QG_AVX2 void dot_quad_q4_span_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m,
                                          int64_t s_row, int64_t nb, const float *x, int64_t groups, float *out,
                                          const float *base) {
    for (int64_t g = 0; g < groups; g++) {
        float res[4];
        dot_quad_q4_body(q + 4 * g * q_row, q_row, d + 4 * g * s_row, m + 4 * g * s_row, s_row, nb, x, res);
        for (int c = 0; c < 4; c++) out[4 * g + c] = base != NULL ? base[4 * g + c] + res[c] : res[c];
    }
}

QG_AVX2 void dot_pair_q8_span_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m,
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
QG_AVX2 void dot_pair_q8z_span_avx2(const uint8_t *q, int64_t q_row, const float *d, int64_t s_row, int64_t nb,
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

QG_AVX2 void dots_fused_avx2(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb,
                                    const float *x, int64_t xs, int64_t R, float *res) {
    switch (fmt) {
        case 4: dots_fused_q4_avx2(q, d, m, nb, x, xs, R, res); break;
        case 8: dots_fused_q8_avx2(q, d, m, nb, x, xs, R, res); break;
        case 16: dots_fused_q16_avx2(q, d, m, nb, x, xs, R, res); break;
        default: dots_fused_f32_avx2(q, d, m, nb, x, xs, R, res); break;
    }
}

/* res[2 c + r]: weight row n + c, row r of x */
QG_AVX2 void pair_tiles_avx2(int fmt, const uint8_t *q, int64_t q_row, const float *d, const float *m,
                                    int64_t s_row, int64_t nb, const float *x, int64_t xs, float *res) {
    switch (fmt) {
        case 4: pair_tiles_q4_avx2(q, q_row, d, m, s_row, nb, x, xs, res); break;
        case 8: pair_tiles_q8_avx2(q, q_row, d, m, s_row, nb, x, xs, res); break;
        case 16: pair_tiles_q16_avx2(q, q_row, d, m, s_row, nb, x, xs, res); break;
        default: pair_tiles_f32_avx2(q, q_row, d, m, s_row, nb, x, xs, res); break;
    }
}

int have_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
}
#else
int have_avx2(void) { return 0; }
#endif
