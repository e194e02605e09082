/* llama's whole decode or verify step in one call (module tsspec_model_llama._step_kernels): the
 * embedding rows, every block (the generic kernels' stack_forward), the final RMSNorm in torch's
 * own order and the LM head, so a step leaves Python once. Every value is bit for bit the Python
 * path's. The generic kernels come from tsspec_gguf._cpu_kernels' C-API (kernels_api.h). */
#include "kernels_api.h"
#include "family.h"

static const TsspecKernelsApi *api; /* the generic kernels, imported at module init */

static void embed_rows(const QWeight *E, const long long *ids, int64_t rows, float *x) {
    const int64_t nb = E->K / QK, bb = block_bytes(E->fmt), ns = nb * block_scales(E->fmt);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = ids[r];
        const uint8_t *q = E->q + n * nb * bb;
        const float *d = E->d + n * ns, *m = E->m + n * ns;
        api->unpack_row(E->fmt, q, d, m, nb, x + r * E->K);
    }
}

/* model_step(stack, ids, embed, x, past, k, v, cap, rope_table, threads, int8, head[, taps]):
 *   x[rows, H] = the embedding rows of ids (a sequence of ints in [0, embed's N)); blocks
 *   0..n_layers-1 on x in place (layers_forward); then head, when not None: a tuple
 *   (norm_w, eps, lanes, normed, first, lm_head, logits): normed[rows - first, H] =
 *   rms_norm_torch(x[first:]), logits[rows - first, V] = normed @ lm_head^T. embed and lm_head
 *   are (fmt, q, d, m, N, K). taps, when given and not None: (layers, out), a drafter's feature
 *   taps: out[rows, len(layers) H] receives the residual rows entering each of those layers
 *   (tap i in columns i H .. (i + 1) H; layer n_layers is the residual after the last block);
 *   the blocks then run in stretches between the tapped layers, as the Python path's
 *   layers_forward calls do (a block's values do not depend on where a stretch starts). */
typedef struct {
    int64_t n;
    long long *layer; /* n layer ids (malloc'd; free it once the call is done), NULL without taps */
    float *out;
} Taps;

static int parse_taps(PyObject *obj, int64_t n_layers, Taps *T) {
    T->n = 0;
    T->layer = NULL;
    T->out = NULL;
    if (obj == Py_None) return 1;
    PyObject *layers;
    unsigned long long out;
    if (!PyTuple_Check(obj)) { /* PyArg_ParseTuple would raise SystemError on a non-tuple */
        PyErr_SetString(PyExc_TypeError, "model_step: taps must be None or a (layer ids, address) tuple");
        return 0;
    }
    if (!PyArg_ParseTuple(obj, "OK", &layers, &out)) return 0;
    PyObject *seq = PySequence_Fast(layers, "model_step: taps must be a sequence of layer ids");
    if (seq == NULL) return 0;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int ok = n >= 1 && out != 0; /* any number of taps, repeats included, as the Python path */
    if (ok && (T->layer = (long long *)malloc(sizeof(long long) * (size_t)n)) == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return 0;
    }
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        T->layer[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (T->layer[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            free(T->layer);
            T->layer = NULL;
            return 0;
        }
        ok = T->layer[i] >= 0 && T->layer[i] <= n_layers;
    }
    Py_DECREF(seq);
    if (!ok) {
        free(T->layer);
        T->layer = NULL;
        PyErr_SetString(PyExc_ValueError, "bad model_step taps");
        return 0;
    }
    T->n = n;
    T->out = (float *)(uintptr_t)out;
    return 1;
}

static int stack_forward_tapped(const LayerStack *S, float *x, int64_t rows, int64_t past, float *kc, float *vc,
                                int64_t cap, const float *table, int threads, int int8, const Taps *T) {
    int64_t start = 0;
    for (;;) {
        for (int64_t i = 0; i < T->n; i++)
            if (T->layer[i] == start)
                for (int64_t r = 0; r < rows; r++)
                    memcpy(T->out + (r * T->n + i) * S->H, x + r * S->H, sizeof(float) * (size_t)S->H);
        if (start == S->n_layers) return 0;
        int64_t stop = S->n_layers; /* the next tapped layer after start */
        for (int64_t i = 0; i < T->n; i++)
            if (T->layer[i] > start && T->layer[i] < stop) stop = T->layer[i];
        const int rc = api->stack_forward(S, start, stop, x, rows, past, kc, vc, cap, table, threads, int8);
        if (rc != 0) return rc;
        start = stop;
    }
}

static PyObject *py_model_step(PyObject *self, PyObject *args) {
    PyObject *capsule, *ids_obj, *embed_obj, *head, *table_obj, *taps_obj = Py_None;
    long long past, cap;
    unsigned long long x, k, v, table = 0, table_local = 0;
    int threads, int8, rc;
    if (!PyArg_ParseTuple(args, "OOOKLKKLOipO|O", &capsule, &ids_obj, &embed_obj, &x, &past, &k, &v, &cap, &table_obj,
                          &threads, &int8, &head, &taps_obj))
        return NULL;
    /* a llama stack (layers_new) or a family stack (family_new: rope_table is then the pair of
     * global and sliding layers' tables, and the embedding rows take the family's scale) */
    const FamilyStack *FS = NULL;
    const LayerStack *S = NULL;
    int64_t width, n_layers;
    if (PyCapsule_IsValid(capsule, FAMILY_STACK_CAPSULE)) {
        FS = (const FamilyStack *)PyCapsule_GetPointer(capsule, FAMILY_STACK_CAPSULE);
        if (!PyArg_ParseTuple(table_obj, "KK", &table, &table_local)) return NULL;
        width = FS->H;
        n_layers = FS->n_layers;
        if (taps_obj != Py_None) {
            PyErr_SetString(PyExc_ValueError, "model_step: a family stack takes no feature taps");
            return NULL;
        }
    } else {
        S = (const LayerStack *)PyCapsule_GetPointer(capsule, LAYER_STACK_CAPSULE);
        if (S == NULL) return NULL;
        table = PyLong_AsUnsignedLongLong(table_obj);
        if (PyErr_Occurred()) return NULL;
        width = S->H;
        n_layers = S->n_layers;
    }
    QWeight E, LM;
    if (!api->parse_weight(embed_obj, &E)) return NULL;
    if (E.K != width) {
        PyErr_SetString(PyExc_ValueError, "the embedding's rows are not the stack's width");
        return NULL;
    }
    Taps T;
    if (!parse_taps(taps_obj, n_layers, &T)) return NULL;
    PyObject *seq = PySequence_Fast(ids_obj, "model_step: ids must be a sequence of ints");
    if (seq == NULL) {
        free(T.layer);
        return NULL;
    }
    const Py_ssize_t rows = PySequence_Fast_GET_SIZE(seq);
    long long *ids = (long long *)malloc(sizeof(long long) * (size_t)(rows > 0 ? rows : 1));
    if (ids == NULL) {
        Py_DECREF(seq);
        free(T.layer);
        return PyErr_NoMemory();
    }
    int ok = rows >= 1;
    for (Py_ssize_t i = 0; ok && i < rows; i++) {
        ids[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (ids[i] == -1 && PyErr_Occurred()) ok = 0;
        else if (ids[i] < 0 || ids[i] >= E.N) {
            PyErr_Format(PyExc_ValueError, "token ids must lie in [0, %lld)", (long long)E.N);
            ok = 0;
        }
    }
    Py_DECREF(seq);
    if (ok && (!x || !k || !v || !table || past < 0 || past + rows > cap)) {
        PyErr_SetString(PyExc_ValueError, "bad model_step operands");
        ok = 0;
    }
    unsigned long long norm_w = 0, normed = 0, logits = 0;
    float eps = 0.0f;
    int lanes = 0;
    long long first = 0;
    if (ok && head != Py_None) {
        PyObject *lm_obj;
        ok = PyArg_ParseTuple(head, "KfiKLOK", &norm_w, &eps, &lanes, &normed, &first, &lm_obj, &logits) &&
             api->parse_weight(lm_obj, &LM);
        if (ok && (!norm_w || !normed || !logits || !api->torch_lanes_ok(lanes) || first < 0 || first >= rows ||
                   LM.K != width)) {
            PyErr_SetString(PyExc_ValueError, "bad model_step head operands");
            ok = 0;
        }
    }
    if (!ok) {
        free(ids);
        free(T.layer);
        return NULL;
    }
    float *xs = (float *)(uintptr_t)x;
    Py_BEGIN_ALLOW_THREADS
    embed_rows(&E, ids, rows, xs);
    if (FS != NULL) {
        if (FS->embed_scale != 0.0f)
            for (int64_t i = 0; i < rows * width; i++) xs[i] = xs[i] * FS->embed_scale;
        rc = family_forward(FS, 0, n_layers, xs, rows, past, (float *)(uintptr_t)k, (float *)(uintptr_t)v, cap,
                            (const float *)(uintptr_t)table, (const float *)(uintptr_t)table_local, threads, int8);
    } else
        rc = stack_forward_tapped(S, xs, rows, past, (float *)(uintptr_t)k, (float *)(uintptr_t)v, cap,
                                  (const float *)(uintptr_t)table, threads, int8, &T);
    if (rc == 0 && head != Py_None) {
        float *hn = (float *)(uintptr_t)normed;
        const int64_t kept = rows - first;
        api->rms_norm_torch_rows(xs + first * width, width, (const float *)(uintptr_t)norm_w, hn, kept, width, eps, lanes);
        api->set_region_kind(KIND_GEMM);
        rc = api->gemm(&LM, hn, width, kept, (float *)(uintptr_t)logits, LM.N, NULL, threads, int8);
        api->set_region_kind(KIND_OTHER);
    }
    Py_END_ALLOW_THREADS
    free(ids);
    free(T.layer);
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"model_step", py_model_step, METH_VARARGS,
     "embedding rows, every block, the final norm and the LM head of one step in one call"},
    {"family_new", py_family_new, METH_VARARGS, "describe a stack of a family's blocks once (a capsule)"},
    {"family_forward", py_family_forward, METH_VARARGS, "run blocks of a family stack on residual rows, in place"},
    {"gelu_mul", py_gelu_mul, METH_VARARGS, "gelu_tanh(gate) * up of rows"},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_step_kernels", "llama's whole decode or verify step in one call (on tsspec_gguf's kernels).", -1, methods};

PyMODINIT_FUNC PyInit__step_kernels(void) {
    api = tsspec_kernels_import();
    if (api == NULL) return NULL;
    family_init(api);
    return PyModule_Create(&module);
}
