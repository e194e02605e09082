/* A stack of blocks of a family whose block is not llama's (families.py: per-head Q/K norms,
 * post norms, GELU-tanh, sliding-window layers with their own RoPE table, the sqrt(H) embedding
 * scale), run on tsspec_gguf's kernels in one native call (family.c). */
#ifndef TSSPEC_LLAMA_FAMILY_H
#define TSSPEC_LLAMA_FAMILY_H
#include "kernels_api.h"

#define FAMILY_STACK_CAPSULE "tsspec.FamilyStack"

typedef struct {
    const float *attn_norm, *bqkv, *bo, *ffn_norm;   /* bqkv, bo: NULL when the file has none */
    const float *q_norm, *k_norm;                   /* [hd] each, or NULL (no per-head norms) */
    const float *post_attn_norm, *post_ffn_norm;    /* [H] each, or NULL */
    int64_t window;                                 /* keys a row sees (0: every earlier key) */
    QWeight wqkv, wo, gate_up, down;
} FamilyLayer;

typedef struct {
    int64_t H, heads, kv_heads, hd, rope_dim, ffn, n_layers;
    float eps, embed_scale; /* embed_scale 0: the embedding rows are not scaled */
    int gelu;               /* 1: GELU-tanh(gate) * up, 0: SiLU(gate) * up */
    FamilyLayer *layers;
} FamilyStack;

void family_init(const TsspecKernelsApi *kernels_api);
int family_forward(const FamilyStack *S, int64_t l0, int64_t l1, float *x, int64_t rows,
                   int64_t past, float *kc, float *vc, int64_t cap, const float *table, const float *table_local,
                   int threads, int int8);
PyObject *py_family_new(PyObject *self, PyObject *args);
PyObject *py_family_forward(PyObject *self, PyObject *args);
PyObject *py_gelu_mul(PyObject *self, PyObject *args);
#endif
