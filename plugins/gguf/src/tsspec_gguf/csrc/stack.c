#include "kernels.h"

/* ---- python surface: raw addresses of torch tensors (qlinear.py checks every shape) ------- */

int check_weight(QWeight *W, int fmt, unsigned long long q, unsigned long long d, unsigned long long m,
                        long long N, long long K) {
    if ((fmt != 4 && fmt != 8 && fmt != 16 && fmt != 32 && !is_half_fmt(fmt)) || N < 0 || K < 0 || K % QK != 0 || !q || !d || !m) {
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


/* A block's first half for rows of x: attn_norm, the fused QKV (+ bias), RoPE from position
 * past, and the K, V rows written into the block's cache kl, vl [nkv, cap, hd] at past..;
 * h [rows, H] and qkv [rows, qkv_n] are the caller's scratch (qkv holds the turned Q, K, V). */
int block_qkv_cache(const LayerStack *S, const StackLayer *L, const float *x, float *h, float *qkv, int64_t rows,
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
int stack_forward(const LayerStack *S, int64_t l0, int64_t l1, float *x, int64_t rows, int64_t past, float *kc,
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
    LayerStack *S = (LayerStack *)PyCapsule_GetPointer(capsule, LAYER_STACK_CAPSULE);
    if (S != NULL) {
        free(S->layers);
        free(S);
    }
}

/* (fmt, q, d, m, N, K[, zero_m]): zero_m true vouches that every m is 0 (format 8 only) */
int parse_weight(PyObject *t, QWeight *W) {
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

int parse_matrix(PyObject *t, QWeight *W, long long N, long long K, const char *name) {
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
PyObject *py_layers_new(PyObject *self, PyObject *args) {
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
    PyObject *capsule = PyCapsule_New(S, LAYER_STACK_CAPSULE, stack_free);
    if (capsule == NULL) {
        free(layers);
        free(S);
    }
    return capsule;
}

/* layers_forward(stack, l0, l1, x, rows, past, k, v, cap, rope_table, threads, int8): blocks
 * l0..l1-1 on x [rows, H] in place; k, v [layers, kv_heads, cap, hd]; rope_table [positions,
 * rope_dim / 2, 2] covering past + rows */
PyObject *py_layers_forward(PyObject *self, PyObject *args) {
    PyObject *capsule;
    long long l0, l1, rows, past, cap;
    unsigned long long x, k, v, table;
    int threads, int8, rc;
    if (!PyArg_ParseTuple(args, "OLLKLLKKLKip", &capsule, &l0, &l1, &x, &rows, &past, &k, &v, &cap, &table, &threads,
                          &int8))
        return NULL;
    const LayerStack *S = (const LayerStack *)PyCapsule_GetPointer(capsule, LAYER_STACK_CAPSULE);
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
