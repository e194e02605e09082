#include "kernels.h"

/* ---- small row ops of a transformer block ------------------------------------------------
 * 3. rms_norm: out[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * w, the sum of squares in the
 *    fixed 8-lane order; rope: adjacent pairs (x[2i], x[2i+1]) of each head's first rope_dim
 *    values turned by (cos, sin) of the row's position, in place; silu_mul: out = silu(g) * u.
 *    All per row, so they keep the forward batch-invariant. */

void rms_norm_rows(const float *x, const float *w, float *out, int64_t rows, int64_t n, float eps) {
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

void rope_rows(float *x, int64_t row_stride, int64_t rows, int64_t heads, int64_t hd, int64_t rope_dim,
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

/* gelu_tanh(g) u: gelu(g) = 0.5 g (1 + tanh(y)), y = sqrt(2 / pi) (g + 0.044715 g^3), tanh(y) =
 * sign(y) (1 - e) / (1 + e) with e = exp(-2 |y|) <= 1. The AVX2 lanes do the scalar loop's
 * operations in its order, so both agree bit for bit. */
#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_K 0.044715f

static inline float gelu_mul_scalar(float g, float u) {
    const float y = GELU_C * fmaf(GELU_K, (g * g) * g, g);
    const float e = exp_scalar(-2.0f * fabsf(y));
    const float t = copysignf((1.0f - e) / (1.0f + e), y);
    return ((0.5f * g) * (1.0f + t)) * u;
}

#ifdef QG_X86
QG_AVX2 static void gelu_mul_avx2(const float *g, const float *u, float *o, int64_t f) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    int64_t j = 0;
    for (; j + 8 <= f; j += 8) {
        const __m256 gv = _mm256_loadu_ps(g + j);
        const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(gv, gv), gv);
        const __m256 y = _mm256_mul_ps(_mm256_set1_ps(GELU_C), _mm256_fmadd_ps(_mm256_set1_ps(GELU_K), cube, gv));
        const __m256 e = exp_avx2(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, y)));
        const __m256 mag = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
        const __m256 t = _mm256_or_ps(_mm256_andnot_ps(sign, mag), _mm256_and_ps(sign, y));
        const __m256 half_g = _mm256_mul_ps(_mm256_set1_ps(0.5f), gv);
        _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_mul_ps(half_g, _mm256_add_ps(one, t)), _mm256_loadu_ps(u + j)));
    }
    for (; j < f; j++) o[j] = gelu_mul_scalar(g[j], u[j]);
}
#endif

/* out[r, j] = gelu_tanh(gu[r, j]) * gu[r, f + j] */
void gelu_mul_rows(const float *gu, float *out, int64_t rows, int64_t f) {
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * f, *u = g + f;
        float *o = out + r * f;
#ifdef QG_X86
        if (simd_on()) {
            gelu_mul_avx2(g, u, o, f);
            continue;
        }
#endif
        for (int64_t j = 0; j < f; j++) o[j] = gelu_mul_scalar(g[j], u[j]);
    }
}

void silu_mul_rows(const float *gu, float *out, int64_t rows, int64_t f) {
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


/* ---- one native call for a whole decode or verify step -------------------
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
void rms_norm_torch_rows(const float *x, int64_t xs, const float *w, float *out, int64_t rows, int64_t n,
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

int torch_lanes_ok(int lanes) { return lanes >= 1 && lanes <= TORCH_MAX_LANES; }

/* rms_norm_torch(x, w, out, rows, n, eps, lanes): out[rows, n] = F.rms_norm(x[rows, n], w, eps)
 * bit for bit, for torch's vector width `lanes` */
PyObject *py_rms_norm_torch(PyObject *self, PyObject *args) {
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


/* top-1 over the top-k of float32 x[0..n-1] (1 <= k <= TOPK_MAX): the first index of the
 * maximum in *best and the softmax probability of the largest of the k largest, in double
 * (1 / sum_i exp(v_i - v_0)), in *prob. Returns 0 where x holds a NaN or its maximum is not
 * finite (the caller's reference path decides those), else 1. Needs no GIL. */

int top1_topk_of(const float *x, long long n, int k, long long *best_out, double *prob) {
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

/* ---- the draft-head gate: top-1 over the top-k ---------------------------------------------
 * top1_topk(x, n, k) over float32 x[0..n-1]: (the first index of the maximum, the softmax
 * probability of the largest value among the k largest, in double: 1 / sum_i exp(v_i - v_0)).
 * None where x holds a NaN or its maximum is not finite (the caller's reference path decides
 * those). The speculator's gate (confidence.top1_over_topk) on one crossing instead of a
 * handful of torch ops. */
PyObject *py_top1_topk(PyObject *self, PyObject *args) {
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

/* one matrix row dequantised, on the vector path where the CPU has it (the embedding rows of a
 * fused step: the torch dequantiser's values) */
void unpack_row(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, float *w) {
#ifdef QG_X86
    if (simd_on()) {
        unpack_row_avx2(fmt, q, d, m, nb, w);
        return;
    }
#endif
    unpack_row_scalar(fmt, q, d, m, nb, w);
}
