/* The CPU kernels' internal header: shared types, switches and the functions one source file
 * calls in another (all hidden: the module's only export is its init function). */
#ifndef TSSPEC_KERNELS_H
#define TSSPEC_KERNELS_H
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

#include "kernels_api.h"

/* weight bytes ahead of the one being unpacked that a lone-row kernel asks the cache for (the
 * stream of quantised weights is the decode step's memory traffic) */
#define PREFETCH_BYTES 2048

#pragma GCC visibility push(hidden)

#ifdef QG_X86
#define QG_AVX2 __attribute__((target("avx2,fma")))
#define QG_VNNI __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")))
#define QG_VNNI_SPAN __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")))
#endif

typedef struct {
    int8_t *q;      /* [R, K] */
    float *d;       /* [R, nb]: dx per block */
    float *s32;     /* [R, nb]: dx_b * sum of the block's xq */
    float *s16;     /* [R, 2 nb]: the same per 16 values */
    int64_t K, nb;
} QAct;

typedef void (*chunk_fn)(void *arg, int64_t chunk);


typedef struct {
    _Atomic int64_t regions, inline_regions, chunks, caller_chunks, wall_ns, caller_busy_ns, worker_busy_ns, wait_ns,
        waits, long_waits, join_ns, joined, caller_cpu_ns;
} KindStats;


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


#define ATTN_ROW_SLICE 64 /* query rows per attention call (attention.py's ROW_SLICE) */

typedef void (*FixedSpan)(const uint8_t *, int64_t, const float *, const float *, int64_t, int64_t, const float *,
                          int64_t, int64_t, float *, int64_t, const float *);

#define WIDE_ROWS 5


#define KEY_SEGMENT 256

extern int use_decode_spans;
extern int use_guided;
extern int use_huge_pages;
extern int use_int8_row_pairs;
extern int use_int8_spans;
extern int use_key_segments;
extern int use_pair_spans;
extern int use_pair_tiles;
extern int use_pairs;
extern int use_simd;
extern int use_tile_spans;
extern int use_tree_sums;
extern int use_vnni;
extern int use_wide_tiles;
extern int use_zero_m;
extern __thread int region_kind;
extern KindStats pool_stats[KINDS];
extern _Atomic int stats_on;

/* matmul_float.c */
void unpack_row_scalar(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, float *w);
float dot_scalar(const float *w, const float *x, int64_t k);
FixedSpan fixed_span(int fmt, int64_t R, int64_t most);
int have_avx2(void);
/* matmul_half.c */
void unpack_row_half(int fmt, const uint8_t *q, int64_t nb, float *w);
void unpack_row_half_scalar(int fmt, const uint8_t *q, int64_t nb, float *w);
void gemm_chunk_half(const GemmJob *J, int64_t n0, int64_t n1, float *w, float *res);
/* matmul_int8.c */
void quantize_row(const float *x, int64_t nb, int8_t *q, float *d, float *s32, float *s16);
float dot_q8_scalar(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, const int8_t *xq,
                           const float *dx, const float *s32, const float *s16);
int have_vnni(void);
/* pool.c */
int pool_started(void);
int64_t now_ns(void);
void run_chunks(chunk_fn fn, void *arg, int64_t chunks, int threads);
float *scratch_slot(int slot, size_t floats);
float *scratch(size_t floats);
PyObject *py_set_pool_stats(PyObject *self, PyObject *args);
PyObject *py_pool_stats(PyObject *self, PyObject *noargs);
PyObject *py_probe_handshake(PyObject *self, PyObject *args);
/* gemm.c */
void gemm_chunk(void *arg, int64_t c);
int gemm(const QWeight *W, const float *x, int64_t xs, int64_t R, float *out, int64_t os, const float *base,
                int threads, int int8);
void dequant(const QWeight *W, float *out, int threads);
/* attention.c */
int attention(const float *q, int64_t q_row, const float *kc, const float *vc, int64_t cap, float *out,
                     int64_t rows, int64_t heads, int64_t kv_heads, int64_t hd, int64_t past, int threads);
/* rowops.c */
void rms_norm_rows(const float *x, const float *w, float *out, int64_t rows, int64_t n, float eps);
void rope_rows(float *x, int64_t row_stride, int64_t rows, int64_t heads, int64_t hd, int64_t rope_dim,
                      const float *table, int64_t start);
void silu_mul_rows(const float *gu, float *out, int64_t rows, int64_t f);
void rms_norm_torch_rows(const float *x, int64_t xs, const float *w, float *out, int64_t rows, int64_t n,
                                float eps, int lanes);
int torch_lanes_ok(int lanes);
PyObject *py_rms_norm_torch(PyObject *self, PyObject *args);
PyObject *py_top1_topk(PyObject *self, PyObject *args);
void unpack_row(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, float *w);
void set_region_kind(int kind);
/* probes.c */
PyObject *py_probe_fma(PyObject *self, PyObject *args);
PyObject *py_probe_int8(PyObject *self, PyObject *args);
PyObject *py_probe_read(PyObject *self, PyObject *args);
/* stack.c */
int check_weight(QWeight *W, int fmt, unsigned long long q, unsigned long long d, unsigned long long m,
                        long long N, long long K);
int block_qkv_cache(const LayerStack *S, const StackLayer *L, const float *x, float *h, float *qkv, int64_t rows,
                           int64_t past, float *kl, float *vl, int64_t cap, const float *rope_table, int threads,
                           int int8);
int stack_forward(const LayerStack *S, int64_t l0, int64_t l1, float *x, int64_t rows, int64_t past, float *kc,
                         float *vc, int64_t cap, const float *rope_table, int threads, int int8);
int parse_weight(PyObject *t, QWeight *W);
int parse_matrix(PyObject *t, QWeight *W, long long N, long long K, const char *name);
PyObject *py_layers_new(PyObject *self, PyObject *args);
PyObject *py_layers_forward(PyObject *self, PyObject *args);
int top1_topk_of(const float *x, long long n, int k, long long *best_out, double *prob);

#ifdef QG_X86
QG_AVX2 void rms_sumsq_avx2(const float *x, int64_t n, float *lanes);
QG_AVX2 void unpack_row_avx2(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, float *w);
QG_AVX2 void dot_pair_q4_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
                                     int64_t nb, const float *x, float *res);
QG_AVX2 void dot_quad_q4_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
                                     int64_t nb, const float *x, float *res);
QG_AVX2 void dot_pair_q8_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
                                     int64_t nb, const float *x, float *res);
QG_AVX2 void dot_quad_q4_span_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m,
                                          int64_t s_row, int64_t nb, const float *x, int64_t groups, float *out,
                                          const float *base);
QG_AVX2 void dot_pair_q8_span_avx2(const uint8_t *q, int64_t q_row, const float *d, const float *m,
                                          int64_t s_row, int64_t nb, const float *x, int64_t groups, float *out,
                                          const float *base);
QG_AVX2 void dot_pair_q8z_span_avx2(const uint8_t *q, int64_t q_row, const float *d, int64_t s_row, int64_t nb,
                                           const float *x, int64_t groups, float *out, const float *base);
QG_AVX2 void dots_fused_avx2(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb,
                                    const float *x, int64_t xs, int64_t R, float *res);
QG_AVX2 void pair_tiles_avx2(int fmt, const uint8_t *q, int64_t q_row, const float *d, const float *m,
                                    int64_t s_row, int64_t nb, const float *x, int64_t xs, float *res);
QG_AVX2 void quantize_row_avx2(const float *x, int64_t nb, int8_t *q, float *d, float *s32, float *s16);
QG_AVX2 void dots_q8_pair_avx2(int fmt, const uint8_t *q, int64_t q_row, const float *d, const float *m,
                                      int64_t s_row, int64_t nb, const QAct *A, int64_t r, float *res,
                                      int64_t res_stride);
QG_AVX2 void dots_q8_avx2(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, const QAct *A,
                                 int64_t r0, int64_t R, float *res);
QG_AVX2 void q8s_span(int fmt, const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row,
                             int64_t nb, const QAct *A, int64_t a0, int64_t R, int64_t count, float *out, int64_t os,
                             const float *base);
/* matmul_float.c's span functions generated per format (DEFINE_PAIR_TILES, DEFINE_TILE_SPANS) */
#define DECLARE_PAIR_SPAN(NAME) \
QG_AVX2 void NAME(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row, int64_t nb, \
                  const float *x, int64_t xs, int64_t pairs, float *out, int64_t os, const float *base);
#define DECLARE_TILE_SPANS(NAME) \
QG_AVX2 void NAME(const uint8_t *q, int64_t q_row, const float *d, const float *m, int64_t s_row, int64_t nb, \
                  const float *x, int64_t xs, int64_t R, int64_t most, int64_t count, float *out, int64_t os, \
                  const float *base, float *res);
DECLARE_PAIR_SPAN(pair_tiles_q4_avx2_span)
DECLARE_PAIR_SPAN(pair_tiles_q8_avx2_span)
DECLARE_PAIR_SPAN(pair_tiles_q16_avx2_span)
DECLARE_PAIR_SPAN(pair_tiles_f32_avx2_span)
DECLARE_TILE_SPANS(tile_spans_q4_avx2)
DECLARE_TILE_SPANS(tile_spans_q8_avx2)
DECLARE_TILE_SPANS(tile_spans_q16_avx2)
DECLARE_TILE_SPANS(tile_spans_f32_avx2)
#endif

static inline int simd_on(void) { return use_simd != 0 && have_avx2(); }

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

#ifdef QG_X86
QG_AVX2 static inline float hsum_avx2(__m256 a, __m256 b) {
    __m256 s = _mm256_add_ps(a, b);
    __m128 lo = _mm256_castps256_ps128(s), hi = _mm256_extractf128_ps(s, 1);
    __m128 t = _mm_add_ps(lo, hi);                         /* (0+4) (1+5) (2+6) (3+7) */
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));          /* (0+4)+(2+6), (1+5)+(3+7) */
    __m128 v = _mm_add_ss(u, _mm_shuffle_ps(u, u, 0x55));
    return _mm_cvtss_f32(v);
}

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

#endif

#pragma GCC visibility pop
#endif
