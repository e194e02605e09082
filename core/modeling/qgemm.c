/* Quantised-weight matmul for the CPU: out[r, n] (+)= sum_k x[r, k] * W[n, k].
 *
 * W stays in 32-weight affine blocks, w = d * q + m (d, m float32 per block):
 *   fmt 4: q is 4-bit, 16 bytes a block, ggml's nibble order (byte j: low nibble is weight j,
 *          high nibble weight j + 16); covers Q4_0 (m = -8 d) and Q4_1.
 *   fmt 8: q is int8, 32 bytes a block; covers Q8_0 (m = 0) and any 4/5-bit type widened.
 * A block dequantises to exactly the float32 values the torch dequantiser gives (q * d is exact
 * in float32, so the fused multiply-add rounds once, like q * d + m), so results differ from a
 * float32 GEMM on the dequantised matrix only in summation order.
 *
 * Batch invariance: every output row r is summed in the same order (two 8-lane accumulators
 * over 16-weight steps, then a fixed horizontal sum) whatever the number of rows R in the call
 * and whatever the thread split, so a row's result does not depend on the rows beside it:
 * a 1-row decode and an 8-row verify give bit-identical logits for the same token.
 *
 * Threads: OpenMP over output rows n (torch's libgomp is the one loaded when torch comes first).
 * Vector code is AVX2 + FMA, chosen at run time; the scalar path is the fallback and the
 * specification (same summation order, so both paths agree bit for bit).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define QG_X86 1
#endif

#define QK 32

static inline int64_t block_bytes(int fmt) { return fmt == 4 ? 16 : 32; }

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
        } else {
            const int8_t *p = (const int8_t *)(q + b * 32);
            for (int j = 0; j < 32; j++) o[j] = fmaf((float)p[j], d[b], m[b]);
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

QG_AVX2 static void unpack_row_avx2(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, float *w) {
    const __m128i low4 = _mm_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        __m256 vd = _mm256_set1_ps(d[b]), vm = _mm256_set1_ps(m[b]);
        float *o = w + b * QK;
        __m128i q0, q1;
        __m256i i0, i1, i2, i3;
        if (fmt == 4) {
            __m128i raw = _mm_loadu_si128((const __m128i *)(q + b * 16));
            q0 = _mm_and_si128(raw, low4);                       /* weights 0..15 */
            q1 = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);    /* weights 16..31 */
            i0 = _mm256_cvtepu8_epi32(q0);
            i1 = _mm256_cvtepu8_epi32(_mm_srli_si128(q0, 8));
            i2 = _mm256_cvtepu8_epi32(q1);
            i3 = _mm256_cvtepu8_epi32(_mm_srli_si128(q1, 8));
        } else {
            q0 = _mm_loadu_si128((const __m128i *)(q + b * 32));
            q1 = _mm_loadu_si128((const __m128i *)(q + b * 32 + 16));
            i0 = _mm256_cvtepi8_epi32(q0);
            i1 = _mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8));
            i2 = _mm256_cvtepi8_epi32(q1);
            i3 = _mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8));
        }
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), vd, vm));
        _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), vd, vm));
        _mm256_storeu_ps(o + 16, _mm256_fmadd_ps(_mm256_cvtepi32_ps(i2), vd, vm));
        _mm256_storeu_ps(o + 24, _mm256_fmadd_ps(_mm256_cvtepi32_ps(i3), vd, vm));
    }
}

/* up to 4 rows of x: unpack each block in registers and multiply it into every row's two
 * accumulators; the same lanes and order as dot_scalar over unpack_row_scalar, so both paths
 * agree bit for bit and a row's result never depends on the rows tiled with it */
QG_AVX2 static inline __attribute__((always_inline)) void dot_fused_avx2(int fmt, const uint8_t *q, const float *d,
                                                                          const float *m, int64_t nb, const float *x,
                                                                          int64_t xs, const int T, float *res) {
    const __m128i low4 = _mm_set1_epi8(0x0F);
    __m256 a[4], b[4];
    for (int t = 0; t < T; t++) a[t] = b[t] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        __m256 vd = _mm256_set1_ps(d[blk]), vm = _mm256_set1_ps(m[blk]);
        const float *xb = x + blk * QK;
        __m128i q0, q1;
        __m256i i0, i1, i2, i3;
        if (fmt == 4) {
            __m128i raw = _mm_loadu_si128((const __m128i *)(q + blk * 16));
            q0 = _mm_and_si128(raw, low4);
            q1 = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
            i0 = _mm256_cvtepu8_epi32(q0);
            i1 = _mm256_cvtepu8_epi32(_mm_srli_si128(q0, 8));
            i2 = _mm256_cvtepu8_epi32(q1);
            i3 = _mm256_cvtepu8_epi32(_mm_srli_si128(q1, 8));
        } else {
            q0 = _mm_loadu_si128((const __m128i *)(q + blk * 32));
            q1 = _mm_loadu_si128((const __m128i *)(q + blk * 32 + 16));
            i0 = _mm256_cvtepi8_epi32(q0);
            i1 = _mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8));
            i2 = _mm256_cvtepi8_epi32(q1);
            i3 = _mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8));
        }
        __m256 w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), vd, vm);
        __m256 w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), vd, vm);
        __m256 w2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i2), vd, vm);
        __m256 w3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i3), vd, vm);
        for (int t = 0; t < T; t++) {
            const float *xt = xb + t * xs;
            a[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), a[t]);
            b[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), b[t]);
            a[t] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt + 16), a[t]);
            b[t] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), b[t]);
        }
    }
    for (int t = 0; t < T; t++) res[t] = hsum_avx2(a[t], b[t]);
}

QG_AVX2 static void dots_fused_avx2(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb,
                                    const float *x, int64_t xs, int64_t R, float *res) {
    switch (R) {
        case 4: dot_fused_avx2(fmt, q, d, m, nb, x, xs, 4, res); break;
        case 3: dot_fused_avx2(fmt, q, d, m, nb, x, xs, 3, res); break;
        case 2: dot_fused_avx2(fmt, q, d, m, nb, x, xs, 2, res); break;
        default: dot_fused_avx2(fmt, q, d, m, nb, x, xs, 1, res); break;
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

static inline int simd_on(void) { return use_simd != 0 && have_avx2(); }

/* ---- drivers ---------------------------------------------------------------------------- */

typedef struct {
    int fmt;
    const uint8_t *q;
    const float *d, *m;
    int64_t N, K;
} QWeight;

#define ROW_CHUNK 8  /* output rows per scheduling unit */
#define FUSED_ROWS 4 /* rows of x a block is multiplied into while it sits in registers */

static int gemm(const QWeight *W, const float *x, int64_t xs, int64_t R, float *out, int64_t os, const float *base,
                int threads) {
    const int64_t nb = W->K / QK, bb = block_bytes(W->fmt);
    const int simd = simd_on();
    int failed = 0;
    const int64_t chunks = (W->N + ROW_CHUNK - 1) / ROW_CHUNK;
#ifdef _OPENMP
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads(threads) if (threads > 1 && W->N * W->K * R >= 65536)
#endif
    {
        float *w = (float *)malloc(sizeof(float) * (size_t)(W->K + (R > 0 ? R : 1)));
        if (w == NULL) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t c = 0; c < chunks; c++) {
            if (w == NULL) continue;
            float *res = w + W->K;
            const int64_t n_end = (c + 1) * ROW_CHUNK < W->N ? (c + 1) * ROW_CHUNK : W->N;
            for (int64_t n = c * ROW_CHUNK; n < n_end; n++) {
                const uint8_t *q = W->q + n * nb * bb;
                const float *d = W->d + n * nb, *m = W->m + n * nb;
#ifdef QG_X86
                if (simd) {
                    /* re-unpacking the row per tile of 4 beats one unpack into a buffer
                     * shared by all rows (measured: 8 rows 21.6 vs 23.2 ms a token) */
                    for (int64_t r = 0; r < R; r += FUSED_ROWS)
                        dots_fused_avx2(W->fmt, q, d, m, nb, x + r * xs, xs,
                                        R - r < FUSED_ROWS ? R - r : FUSED_ROWS, res + r);
                } else
#endif
                {
                    unpack_row_scalar(W->fmt, q, d, m, nb, w);
                    for (int64_t r = 0; r < R; r++) res[r] = dot_scalar(w, x + r * xs, W->K);
                }
                if (base != NULL)
                    for (int64_t r = 0; r < R; r++) out[r * os + n] = base[r * os + n] + res[r];
                else
                    for (int64_t r = 0; r < R; r++) out[r * os + n] = res[r];
            }
        }
        free(w);
    }
    return failed ? -1 : 0;
}

static void dequant(const QWeight *W, float *out, int threads) {
    const int64_t nb = W->K / QK, bb = block_bytes(W->fmt);
    const int simd = simd_on();
#ifdef _OPENMP
    if (threads < 1) threads = 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
    for (int64_t n = 0; n < W->N; n++) {
        const uint8_t *q = W->q + n * nb * bb;
        const float *d = W->d + n * nb, *m = W->m + n * nb;
#ifdef QG_X86
        if (simd)
            unpack_row_avx2(W->fmt, q, d, m, nb, out + n * W->K);
        else
#endif
            unpack_row_scalar(W->fmt, q, d, m, nb, out + n * W->K);
    }
}

/* ---- python surface: raw addresses of torch tensors (qlinear.py checks every shape) ------- */

static int check_weight(QWeight *W, int fmt, unsigned long long q, unsigned long long d, unsigned long long m,
                        long long N, long long K) {
    if ((fmt != 4 && fmt != 8) || N < 0 || K < 0 || K % QK != 0 || !q || !d || !m) {
        PyErr_SetString(PyExc_ValueError, "bad quantised weight description");
        return 0;
    }
    W->fmt = fmt;
    W->q = (const uint8_t *)(uintptr_t)q;
    W->d = (const float *)(uintptr_t)d;
    W->m = (const float *)(uintptr_t)m;
    W->N = N;
    W->K = K;
    return 1;
}

/* gemm(fmt, q, d, m, N, K, x, R, out, base, threads): out[R, N] = (base[R, N] +) x[R, K] @ W^T;
 * x, out and base are contiguous float32; base 0 means none */
static PyObject *py_gemm(PyObject *self, PyObject *args) {
    QWeight W;
    int fmt, threads, rc;
    unsigned long long q, d, m, x, out, base;
    long long N, K, R;
    if (!PyArg_ParseTuple(args, "iKKKLLKLKKi", &fmt, &q, &d, &m, &N, &K, &x, &R, &out, &base, &threads)) return NULL;
    if (!check_weight(&W, fmt, q, d, m, N, K)) return NULL;
    if (!x || !out || R < 0) {
        PyErr_SetString(PyExc_ValueError, "bad gemm operands");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = gemm(&W, (const float *)(uintptr_t)x, K, R, (float *)(uintptr_t)out, N, (const float *)(uintptr_t)base, threads);
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

static PyObject *py_set_simd(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    use_simd = on ? -1 : 0;
    Py_RETURN_NONE;
}

static PyObject *py_info(PyObject *self, PyObject *noargs) {
    int omp = 0;
#ifdef _OPENMP
    omp = 1;
#endif
    return Py_BuildValue("{s:s,s:O}", "simd", simd_on() ? "avx2+fma" : "scalar", "openmp", omp ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"gemm", py_gemm, METH_VARARGS, "out[R, N] (+)= x[R, K] @ W[N, K]^T on quantised blocks"},
    {"dequant", py_dequant, METH_VARARGS, "W[N, K] -> float32"},
    {"set_simd", py_set_simd, METH_VARARGS, "False forces the scalar path (tests)"},
    {"info", py_info, METH_NOARGS, "which paths this build has"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qgemm", "Quantised-weight CPU matmul.", -1, methods};

PyMODINIT_FUNC PyInit__qgemm(void) { return PyModule_Create(&module); }
