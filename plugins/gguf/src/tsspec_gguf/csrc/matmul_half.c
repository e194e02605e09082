#include "kernels.h"

/* 16-bit float weights: formats FMT_F16 (IEEE half) and FMT_BF16 (bfloat16), 32 weights a block,
 * 64 bytes, no scales (d and m are carried but never read). Each weight widens to float32
 * exactly, then every output is dot_scalar's sum over the widened row: lane l of chain a sums
 * w[16 s + l] x[16 s + l], lane l of chain b w[16 s + 8 + l] x[...], fused multiply-adds in that
 * order, lanes reduced ((0+4)+(2+6))+((1+5)+(3+7)). So an output never depends on how many rows
 * of x share the call, which weight rows are tiled with it, or the thread count, and the scalar
 * and AVX2 + F16C paths agree bit for bit. */

/* IEEE half -> float32, exact (subnormals, infinities; a NaN stays a NaN, made quiet) */
static inline float f16_scalar(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13) | (man ? 0x400000u : 0u);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else { /* zero or subnormal: man * 2^-24, exact in float32 */
        float f = (float)man * 0x1p-24f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float bf16_scalar(uint16_t b) {
    const uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void unpack_row_half_scalar(int fmt, const uint8_t *q, int64_t nb, float *w) {
    const uint16_t *h = (const uint16_t *)q;
    const int64_t k = nb * QK;
    if (fmt == FMT_BF16)
        for (int64_t i = 0; i < k; i++) w[i] = bf16_scalar(h[i]);
    else
        for (int64_t i = 0; i < k; i++) w[i] = f16_scalar(h[i]);
}

#ifdef QG_X86
#include <cpuid.h>
#define QG_HALF __attribute__((target("avx2,fma,f16c")))

static int have_half_simd(void) {
    static int cached = -1;
    if (cached < 0) {
        unsigned a, b, c, d;
        const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
        cached = have_avx2() && f16c;
    }
    return cached;
}

/* 8 weights widened to float32 (exact either way) */
QG_HALF static inline __attribute__((always_inline)) __m256 load8(const int bf, const uint16_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (bf) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* C weight rows (row c at w + c * w_row) against T rows of x (row t at x + t * xs): res[c * T + t].
 * Each output has its own two chains, dot_scalar's operands and order. */
QG_HALF static inline __attribute__((always_inline)) void tile(const int bf, const int C, const int T,
                                                                const uint16_t *w, int64_t w_row, int64_t k,
                                                                const float *x, int64_t xs, float *res) {
    __m256 a[4], b[4];
    for (int i = 0; i < C * T; i++) a[i] = b[i] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
        for (int c = 0; c < C; c++) {
            _mm_prefetch((const char *)(w + c * w_row + i) + PREFETCH_BYTES, _MM_HINT_T0);
            const __m256 w0 = load8(bf, w + c * w_row + i), w1 = load8(bf, w + c * w_row + i + 8);
            for (int t = 0; t < T; t++) {
                a[c * T + t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * xs + i), a[c * T + t]);
                b[c * T + t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * xs + i + 8), b[c * T + t]);
            }
        }
    }
    for (int i = 0; i < C * T; i++) res[i] = hsum_avx2(a[i], b[i]);
}

#define DEFINE_HALF_TILES(NAME, BF) \
QG_HALF static void NAME(int C, int T, const uint16_t *w, int64_t w_row, int64_t k, const float *x, int64_t xs, \
                         float *res) { \
    if (C == 4) tile(BF, 4, 1, w, w_row, k, x, xs, res); \
    else if (C == 2) tile(BF, 2, 1, w, w_row, k, x, xs, res); \
    else if (T == 4) tile(BF, 1, 4, w, w_row, k, x, xs, res); \
    else if (T == 3) tile(BF, 1, 3, w, w_row, k, x, xs, res); \
    else if (T == 2) tile(BF, 1, 2, w, w_row, k, x, xs, res); \
    else tile(BF, 1, 1, w, w_row, k, x, xs, res); \
}
DEFINE_HALF_TILES(tiles_f16, 0)
DEFINE_HALF_TILES(tiles_bf16, 1)

QG_HALF static void unpack_row_half_avx2(int fmt, const uint8_t *q, int64_t nb, float *w) {
    const uint16_t *h = (const uint16_t *)q;
    for (int64_t i = 0; i < nb * QK; i += 8) _mm256_storeu_ps(w + i, load8(fmt == FMT_BF16, h + i));
}
#endif

void unpack_row_half(int fmt, const uint8_t *q, int64_t nb, float *w) {
#ifdef QG_X86
    if (use_simd && have_half_simd()) {
        unpack_row_half_avx2(fmt, q, nb, w);
        return;
    }
#endif
    unpack_row_half_scalar(fmt, q, nb, w);
}

/* gemm_chunk's work for a 16-bit weight: output columns n0 .. n1 - 1 of every row of x. A decode
 * row takes weight rows four (then two) at a time; more rows of x go in near-equal tiles of at
 * most 4. w: scratch of K floats; res: scratch of at least max(R, 4) floats. */
void gemm_chunk_half(const GemmJob *J, int64_t n0, int64_t n1, float *w, float *res) {
    const QWeight *W = J->W;
    const int64_t K = W->K, R = J->R, w_row = K; /* uint16 weights a row */
    const uint16_t *base_w = (const uint16_t *)W->q;
#ifdef QG_X86
    if (use_simd && have_half_simd()) {
        void (*tiles)(int, int, const uint16_t *, int64_t, int64_t, const float *, int64_t, float *) =
            W->fmt == FMT_BF16 ? tiles_bf16 : tiles_f16;
        for (int64_t n = n0; n < n1;) {
            const uint16_t *wn = base_w + n * w_row;
            if (R == 1) {
                const int C = n + 3 < n1 ? 4 : n + 1 < n1 ? 2 : 1;
                tiles(C, 1, wn, w_row, K, J->x, J->xs, res);
                for (int c = 0; c < C; c++)
                    J->out[n + c] = J->base != NULL ? J->base[n + c] + res[c] : res[c];
                n += C;
                continue;
            }
            const int64_t tiles_n = (R + 3) / 4;
            for (int64_t i = 0, r = 0; i < tiles_n; i++) {
                const int64_t rows = R / tiles_n + (i < R % tiles_n);
                tiles(1, (int)rows, wn, w_row, K, J->x + r * J->xs, J->xs, res + r);
                r += rows;
            }
            for (int64_t r = 0; r < R; r++)
                J->out[r * J->os + n] = J->base != NULL ? J->base[r * J->os + n] + res[r] : res[r];
            n++;
        }
        return;
    }
#endif
    for (int64_t n = n0; n < n1; n++) {
        unpack_row_half_scalar(W->fmt, (const uint8_t *)(base_w + n * w_row), K / QK, w);
        for (int64_t r = 0; r < R; r++) {
            const float v = dot_scalar(w, J->x + r * J->xs, K);
            J->out[r * J->os + n] = J->base != NULL ? J->base[r * J->os + n] + v : v;
        }
    }
}
