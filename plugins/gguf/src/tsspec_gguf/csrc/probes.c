#include "kernels.h"

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
PyObject *py_probe_fma(PyObject *self, PyObject *args) {
#ifdef QG_X86
    return run_probe(args, "bad probe_fma operands", "probe_fma needs AVX2 + FMA", probe_fma_chunk);
#else
    return run_probe(args, "bad probe_fma operands", "probe_fma needs AVX2 + FMA", NULL);
#endif
}

/* probe_int8(iters, chunks, threads): chunks x iters x 12 steps of 32 int8 multiply-adds on the
 * int8 path's instructions (VNNI where it runs, else AVX2); returns a checksum (AVX2 builds only) */
PyObject *py_probe_int8(PyObject *self, PyObject *args) {
#ifdef QG_X86
    return run_probe(args, "bad probe_int8 operands", "probe_int8 needs AVX2",
                     use_vnni && have_vnni() ? probe_int8_chunk_vnni : probe_int8_chunk_avx2);
#else
    return run_probe(args, "bad probe_int8 operands", "probe_int8 needs AVX2", NULL);
#endif
}

/* probe_read(addr, n, chunks, threads): the sum of n float32 at addr, read in up to 256 chunks */
PyObject *py_probe_read(PyObject *self, PyObject *args) {
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
