#include "kernels_api.h"

static const TsspecKernelsApi *api; /* the generic kernels, imported at module init */

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
    const LayerStack *S = (const LayerStack *)PyCapsule_GetPointer(stack, LAYER_STACK_CAPSULE);
    if (S == NULL) return NULL;
    if (S->n_layers != 1 || !en || !hn || !hdn) {
        PyErr_SetString(PyExc_ValueError, "head_new: a one-block stack and three norm weights are needed");
        return NULL;
    }
    HeadDesc *D = (HeadDesc *)calloc(1, sizeof(HeadDesc));
    if (D == NULL) return PyErr_NoMemory();
    const long long H = S->H;
    if (!api->parse_matrix(mats[0], &D->e_emb, H, H, "eh_proj (embedding half)") ||
        !api->parse_matrix(mats[1], &D->e_hid, H, H, "eh_proj (hidden half)") || !api->parse_weight(mats[2], &D->head)) {
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
    api->rms_norm_rows(emb, D->enorm, ne, n, H, D->eps);
    if (h_last) { /* row by row, so the same values as one call over n rows */
        api->rms_norm_rows((const float *)(uintptr_t)h, D->hnorm, nh, n - 1, H, D->eps);
        api->rms_norm_rows((const float *)(uintptr_t)h_last, D->hnorm, nh + (n - 1) * H, 1, H, D->eps);
    } else {
        api->rms_norm_rows((const float *)(uintptr_t)h, D->hnorm, nh, n, H, D->eps);
    }
    api->set_region_kind(KIND_GEMM);
    rc = api->gemm(&D->e_emb, ne, H, n, u, H, NULL, threads, D->int8);
    if (rc == 0) rc = api->gemm(&D->e_hid, nh, H, n, u, H, u, threads, D->int8);
    api->set_region_kind(KIND_OTHER);
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
            rc = api->block_qkv_cache(S, &S->layers[0], u, scratch, scratch + cache_only * H, cache_only, past,
                                 (float *)(uintptr_t)k, (float *)(uintptr_t)v, cap, (const float *)(uintptr_t)rope,
                                 threads, D->int8);
            free(scratch);
        }
        api->set_region_kind(KIND_OTHER);
    }
    if (rc == 0 && whole)
        rc = api->stack_forward(D->S, 0, 1, u + cache_only * H, whole, past + cache_only, (float *)(uintptr_t)k,
                           (float *)(uintptr_t)v, cap, (const float *)(uintptr_t)rope, threads, D->int8);
    if (rc == 0 && out) {
        api->rms_norm_rows(u + (n - 1) * H, D->head_norm, (float *)(uintptr_t)out, 1, H, D->eps);
        if (logits) {
            api->set_region_kind(KIND_GEMM);
            rc = api->gemm(&D->head, (const float *)(uintptr_t)out, H, 1, (float *)(uintptr_t)logits, D->head.N, NULL,
                      threads, D->int8);
            api->set_region_kind(KIND_OTHER);
        }
    }
    if (rc == 0 && gate_k) gated = api->top1_topk_of((const float *)(uintptr_t)logits, gate_n, gate_k, &best, &prob);
    Py_END_ALLOW_THREADS
    free(slots);
    free(buf);
    if (rc != 0) return PyErr_NoMemory();
    if (gated) return Py_BuildValue("Ld", best, prob);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"head_new", py_head_new, METH_VARARGS, "describe a NextN draft head once (a capsule)"},
    {"head_forward", py_head_forward, METH_VARARGS,
     "a NextN draft head's call: input norms, eh_proj, its block, head norm, draft-vocabulary logits"},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_head_kernels", "a NextN draft head's call in one crossing (on tsspec_gguf's kernels).", -1, methods};

PyMODINIT_FUNC PyInit__head_kernels(void) {
    api = tsspec_kernels_import();
    if (api == NULL) return NULL;
    return PyModule_Create(&module);
}
