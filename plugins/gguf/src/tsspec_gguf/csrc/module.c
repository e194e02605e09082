#include "kernels.h"

/* the `tree_sums` switch: several horizontal sums at once, each hsum_avx2's value bit for bit */
int use_tree_sums = 1;

int use_simd = -1; /* -1: auto, 0: scalar forced (tests) */
int use_vnni = 1;  /* 0: the int8 path stays on AVX2 even where VNNI exists (tests) */
int use_pairs = 1; /* 0: a decode row meets one weight row at a time (A/B runs, tests) */
int use_guided = 1; /* 0: a gemm's rows in equal chunks, 4 a thread (A/B runs, tests) */
int use_wide_tiles = 1; /* 0: verify rows in tiles of at most FUSED_ROWS, never WIDE_ROWS (A/B, tests) */
int use_pair_tiles = 1; /* 0: 2 rows of x meet one weight row at a time, not two (A/B, tests) */
int use_key_segments = 1; /* 0: attention in chunks of query heads over all keys, as before (A/B, tests) */
int use_pair_spans = 1; /* 0: a 2-row call's pair tiles one call a pair of weight rows (A/B, tests) */
int use_decode_spans = 1; /* 0: a decode row's quads / pairs one call a group of weight rows (A/B, tests) */
int use_tile_spans = 1; /* 0: 3+ rows' tiles one call a tile, not a chunk's weight rows in one (A/B, tests) */
int use_zero_m = 1; /* 0: a decode row reads a zero_m weight's m like any other's (A/B, tests) */

/* ---- huge pages for the weight stream (the `huge_pages` switch) --------------------------
 * A decode step streams every weight once (~115 MB for the embedded model): on 4 KiB pages that
 * is a TLB miss and a page walk every 4 KiB, ~28,000 a step. advise_huge_pages(addr, nbytes,
 * collapse) asks Linux to back the 2 MiB-aligned pages inside [addr, addr + nbytes) with huge
 * pages (MADV_HUGEPAGE: later faults take them) and, with collapse, to move the pages already
 * there into huge pages now (MADV_COLLAPSE, Linux 6.1+; the contents stay as they are). Returns
 * the bytes advised (collapse: collapsed), 0 where the system refuses or has no such call, or
 * with set_huge_pages(False). Nothing computed changes: only which pages hold the bytes. */
int use_huge_pages = 1;
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
                         pool_started());
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
#ifdef TSSPEC_PROBES /* the bench-only build (_cpu_probes): the roofline probes */
    {"probe_fma", py_probe_fma, METH_VARARGS, "roofline probe: chunks of independent FMA chains"},
    {"probe_read", py_probe_read, METH_VARARGS, "roofline probe: sum a float32 buffer (read bandwidth)"},
    {"probe_int8", py_probe_int8, METH_VARARGS, "roofline probe: chunks of independent int8 dot chains"},
#endif
    {"set_pool_stats", py_set_pool_stats, METH_VARARGS, "zero the pool statistics; True counts from now on"},
    {"pool_stats", py_pool_stats, METH_NOARGS, "the pool statistics by kind of region (counts, nanoseconds)"},
    {"probe_handshake", py_probe_handshake, METH_VARARGS,
     "wall nanoseconds of each of a number of regions that bring every thread in and out"},
    {"rms_norm_torch", py_rms_norm_torch, METH_VARARGS, "RMSNorm of rows in torch's summation order (F.rms_norm bit for bit)"},
    {"top1_topk", py_top1_topk, METH_VARARGS, "(argmax, softmax probability of the top-1 among the top-k) of a row"},
    {NULL, NULL, 0, NULL},
};

#ifdef TSSPEC_PROBES
#define MODULE_NAME "_cpu_probes"
#define MODULE_INIT PyInit__cpu_probes
#else
#define MODULE_NAME "_cpu_kernels"
#define MODULE_INIT PyInit__cpu_kernels
#endif
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, MODULE_NAME, "tsspec's CPU kernels.", -1, methods};

/* the C-API other extensions import (kernels_api.h) */
static const TsspecKernelsApi api = {
    TSSPEC_KERNELS_API_VERSION, gemm, stack_forward, block_qkv_cache, rms_norm_rows, rms_norm_torch_rows,
    torch_lanes_ok, unpack_row, parse_weight, parse_matrix, top1_topk_of, set_region_kind,
    attention, rope_rows, silu_mul_rows, gelu_mul_rows,
};

PyMODINIT_FUNC MODULE_INIT(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* attention's key segment (tests put key counts around its boundaries) */
    PyObject *capsule = PyCapsule_New((void *)&api, TSSPEC_KERNELS_CAPSULE, NULL);
    if (PyModule_AddIntConstant(m, "KEY_SEGMENT", KEY_SEGMENT) != 0 || capsule == NULL ||
        PyModule_AddObject(m, "api", capsule) != 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
