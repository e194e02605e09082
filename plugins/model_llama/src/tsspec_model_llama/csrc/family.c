/* A family's blocks in one native call: target.py's _family_block on the kernel path, op for op
 * (the same kernels, arguments, thread counts and order), so every value is bit for bit the
 * per-op path's and, like it, independent of the row count:
 *   h = rms_norm(x, attn_norm); qkv = h @ Wqkv^T (+ bqkv); per-head rms_norm of Q (q_norm, the
 *   attention scale folded in) and K (k_norm); rope (the local table on sliding layers); K, V
 *   rows -> the cache at past..; a = attention (a sliding layer's row at position p sees keys
 *   p - window + 1 .. p: rows whose window starts at key 0 share one call, each later row has
 *   its own call from its window's first key); o = a @ Wo^T (+ bo), post_attn_norm(o) where the
 *   family has it; x = x + o; h = rms_norm(x, ffn_norm); gu = h @ Wgu^T; s = act(g) * u;
 *   f = s @ Wdown^T, post_ffn_norm(f); x = x + f.
 * The whole KV cache stays: a rollback never drops a key a later row's window needs. */
#include "family.h"

#include <stdlib.h>
#include <string.h>

#define ROW_SLICE 64 /* query rows per attention call (tsspec_gguf.attention.ROW_SLICE) */

static const TsspecKernelsApi *api;

void family_init(const TsspecKernelsApi *kernels_api) { api = kernels_api; }

/* ---- the blocks ------------------------------------------------------------------------ */

static int layer_attention(const FamilyStack *S, const FamilyLayer *L, const float *qkv, int64_t qkv_n, float *attn,
                           int64_t rows, int64_t past, const float *kl, const float *vl, int64_t cap, int threads) {
    const int64_t nh = S->heads, nkv = S->kv_heads, hd = S->hd, q_size = nh * hd, window = L->window;
    int64_t first = rows; /* rows whose keys start at 0 */
    if (window && past + rows > window) first = window - past < 0 ? 0 : window - past < rows ? window - past : rows;
    for (int64_t s = 0; s < first; s += ROW_SLICE) {
        const int64_t e = s + ROW_SLICE < first ? s + ROW_SLICE : first;
        const int rc = api->attention(qkv + s * qkv_n, qkv_n, kl, vl, cap, attn + s * q_size, e - s, nh, nkv, hd,
                                      past + s, threads);
        if (rc != 0) return rc;
    }
    for (int64_t t = first; t < rows; t++) {
        const int64_t start = past + t - window + 1;
        const int rc = api->attention(qkv + t * qkv_n, qkv_n, kl + start * hd, vl + start * hd, cap, attn + t * q_size, 1,
                                      nh, nkv, hd, window - 1, threads);
        if (rc != 0) return rc;
    }
    return 0;
}

static void add_rows(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}

static void add_bias(float *x, const float *b, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) x[r * n + i] += b[i];
}

/* blocks l0..l1-1 on x [rows, H] in place; kc, vc [layers, kv_heads, cap, hd]; table,
 * table_local: RoPE (cos, sin) tables [positions, rope_dim / 2, 2] of global and sliding layers */
int family_forward(const FamilyStack *S, int64_t l0, int64_t l1, float *x, int64_t rows, int64_t past, float *kc,
                   float *vc, int64_t cap, const float *table, const float *table_local, int threads, int int8) {
    const int64_t H = S->H, hd = S->hd, nh = S->heads, nkv = S->kv_heads, F = S->ffn;
    const int64_t q_size = nh * hd, qk_size = (nh + nkv) * hd, qkv_n = (nh + 2 * nkv) * hd;
    float *buf = (float *)malloc(sizeof(float) * (size_t)(rows * (2 * H + qkv_n + q_size + 3 * F)));
    if (buf == NULL) return -1;
    float *h = buf, *o = h + rows * H, *qkv = o + rows * H, *attn = qkv + rows * qkv_n, *gu = attn + rows * q_size;
    float *act = gu + rows * 2 * F;
    int rc = 0;
    for (int64_t i = l0; i < l1 && rc == 0; i++) {
        const FamilyLayer *L = &S->layers[i];
        float *kl = kc + i * nkv * cap * hd, *vl = vc + i * nkv * cap * hd; /* [nkv, cap, hd] */
        api->rms_norm_rows(x, L->attn_norm, h, rows, H, S->eps);
        api->set_region_kind(KIND_QKV);
        if ((rc = api->gemm(&L->wqkv, h, H, rows, qkv, qkv_n, NULL, threads, int8)) != 0) break;
        if (L->bqkv != NULL) add_bias(qkv, L->bqkv, rows, qkv_n);
        if (L->q_norm != NULL)
            for (int64_t r = 0; r < rows; r++) {
                float *qr = qkv + r * qkv_n;
                api->rms_norm_rows(qr, L->q_norm, qr, nh, hd, S->eps);
                api->rms_norm_rows(qr + q_size, L->k_norm, qr + q_size, nkv, hd, S->eps);
            }
        api->rope_rows(qkv, qkv_n, rows, nh + nkv, hd, S->rope_dim, L->window ? table_local : table, past);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t g = 0; g < nkv; g++) {
                memcpy(kl + (g * cap + past + r) * hd, qkv + r * qkv_n + q_size + g * hd, sizeof(float) * (size_t)hd);
                memcpy(vl + (g * cap + past + r) * hd, qkv + r * qkv_n + qk_size + g * hd, sizeof(float) * (size_t)hd);
            }
        api->set_region_kind(KIND_ATTENTION);
        if ((rc = layer_attention(S, L, qkv, qkv_n, attn, rows, past, kl, vl, cap, threads)) != 0) break;
        api->set_region_kind(KIND_O);
        if ((rc = api->gemm(&L->wo, attn, q_size, rows, o, H, NULL, threads, int8)) != 0) break;
        if (L->bo != NULL) add_bias(o, L->bo, rows, H);
        if (L->post_attn_norm != NULL) api->rms_norm_rows(o, L->post_attn_norm, o, rows, H, S->eps);
        add_rows(x, o, rows * H);
        api->rms_norm_rows(x, L->ffn_norm, h, rows, H, S->eps);
        api->set_region_kind(KIND_GATE_UP);
        if ((rc = api->gemm(&L->gate_up, h, H, rows, gu, 2 * F, NULL, threads, int8)) != 0) break;
        if (S->gelu)
            api->gelu_mul_rows(gu, act, rows, F);
        else
            api->silu_mul_rows(gu, act, rows, F);
        api->set_region_kind(KIND_DOWN);
        if ((rc = api->gemm(&L->down, act, F, rows, o, H, NULL, threads, int8)) != 0) break;
        if (L->post_ffn_norm != NULL) api->rms_norm_rows(o, L->post_ffn_norm, o, rows, H, S->eps);
        add_rows(x, o, rows * H);
    }
    api->set_region_kind(KIND_OTHER);
    free(buf);
    return rc;
}

/* ---- python surface ---------------------------------------------------------------------- */

static void family_free(PyObject *capsule) {
    FamilyStack *S = (FamilyStack *)PyCapsule_GetPointer(capsule, FAMILY_STACK_CAPSULE);
    if (S != NULL) {
        free(S->layers);
        free(S);
    }
}

/* family_new((H, heads, kv_heads, hd, rope_dim, ffn, eps, embed_scale, gelu), layers): each layer
 * (attn_norm, bqkv, bo, ffn_norm, q_norm, k_norm, post_attn_norm, post_ffn_norm, window, wqkv,
 * wo, gate_up, down): float32 addresses (0: absent), the window in keys (0: global) and four
 * matrices (fmt, q, d, m, N, K[, zero_m]); returns a capsule the caller keeps with the tensors */
PyObject *py_family_new(PyObject *self, PyObject *args) {
    long long H, heads, kv_heads, hd, rope_dim, ffn;
    float eps, embed_scale;
    int gelu;
    PyObject *list;
    if (!PyArg_ParseTuple(args, "(LLLLLLffp)O", &H, &heads, &kv_heads, &hd, &rope_dim, &ffn, &eps, &embed_scale, &gelu,
                          &list))
        return NULL;
    if (H < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads || hd < 1 || rope_dim < 0 || rope_dim > hd ||
        rope_dim % 2 || ffn < 1 || !PySequence_Check(list)) {
        PyErr_SetString(PyExc_ValueError, "bad family stack dimensions");
        return NULL;
    }
    const Py_ssize_t n = PySequence_Size(list);
    if (n < 0) return NULL;
    FamilyStack *S = (FamilyStack *)calloc(1, sizeof(FamilyStack));
    FamilyLayer *layers = (FamilyLayer *)calloc(n > 0 ? (size_t)n : 1, sizeof(FamilyLayer));
    if (S == NULL || layers == NULL) {
        free(S);
        free(layers);
        return PyErr_NoMemory();
    }
    *S = (FamilyStack){H, heads, kv_heads, hd, rope_dim, ffn, n, eps, embed_scale, gelu, layers};
    const long long qkv_n = (heads + 2 * kv_heads) * hd;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(list, i);
        unsigned long long a[8];
        long long window;
        PyObject *mw[4];
        int ok = item != NULL && PyArg_ParseTuple(item, "KKKKKKKKLOOOO", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6],
                                                  &a[7], &window, &mw[0], &mw[1], &mw[2], &mw[3]);
        FamilyLayer *L = &layers[i];
        ok = ok && api->parse_matrix(mw[0], &L->wqkv, qkv_n, H, "wqkv") &&
             api->parse_matrix(mw[1], &L->wo, H, heads * hd, "wo") &&
             api->parse_matrix(mw[2], &L->gate_up, 2 * ffn, H, "w_gate_up") &&
             api->parse_matrix(mw[3], &L->down, H, ffn, "w_down");
        Py_XDECREF(item);
        if (ok && (!a[0] || !a[3] || (!a[4]) != (!a[5]) || window < 0)) {
            PyErr_SetString(PyExc_ValueError, "a family layer needs both norm weights, Q and K norms together and "
                                              "a window of at least 0");
            ok = 0;
        }
        if (!ok) {
            free(layers);
            free(S);
            return NULL;
        }
        const float **slot[8] = {&L->attn_norm, &L->bqkv, &L->bo, &L->ffn_norm, &L->q_norm, &L->k_norm,
                                 &L->post_attn_norm, &L->post_ffn_norm};
        for (int j = 0; j < 8; j++) *slot[j] = (const float *)(uintptr_t)a[j];
        L->window = window;
    }
    PyObject *capsule = PyCapsule_New(S, FAMILY_STACK_CAPSULE, family_free);
    if (capsule == NULL) {
        free(layers);
        free(S);
    }
    return capsule;
}

/* family_forward(stack, l0, l1, x, rows, past, k, v, cap, table, table_local, threads, int8) */
PyObject *py_family_forward(PyObject *self, PyObject *args) {
    PyObject *capsule;
    long long l0, l1, rows, past, cap;
    unsigned long long x, k, v, table, local;
    int threads, int8, rc;
    if (!PyArg_ParseTuple(args, "OLLKLLKKLKKip", &capsule, &l0, &l1, &x, &rows, &past, &k, &v, &cap, &table, &local,
                          &threads, &int8))
        return NULL;
    const FamilyStack *S = (const FamilyStack *)PyCapsule_GetPointer(capsule, FAMILY_STACK_CAPSULE);
    if (S == NULL) return NULL;
    if (l0 < 0 || l1 < l0 || l1 > S->n_layers || !x || !k || !v || !table || !local || rows < 1 || past < 0 ||
        past + rows > cap) {
        PyErr_SetString(PyExc_ValueError, "bad family_forward operands");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = family_forward(S, l0, l1, (float *)(uintptr_t)x, rows, past, (float *)(uintptr_t)k, (float *)(uintptr_t)v, cap,
                        (const float *)(uintptr_t)table, (const float *)(uintptr_t)local, threads, int8);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* gelu_mul(gate_up, out, rows, f): out[r, j] = gelu_tanh(gate_up[r, j]) * gate_up[r, f + j] */
PyObject *py_gelu_mul(PyObject *self, PyObject *args) {
    unsigned long long gu, out;
    long long rows, f;
    if (!PyArg_ParseTuple(args, "KKLL", &gu, &out, &rows, &f)) return NULL;
    if (!gu || !out || rows < 0 || f < 1) {
        PyErr_SetString(PyExc_ValueError, "bad gelu_mul operands");
        return NULL;
    }
    api->gelu_mul_rows((const float *)(uintptr_t)gu, (float *)(uintptr_t)out, rows, f);
    Py_RETURN_NONE;
}
