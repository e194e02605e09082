/* The kernels' C-API for other extensions (a plugin's own fused kernels): the types they share
 * and a table of function pointers that tsspec_gguf._cpu_kernels exports as a capsule. A client
 * includes this header and calls tsspec_kernels_import() in its module init; the table's version
 * must match the header's, so a plugin built against another layout refuses to load. */
#ifndef TSSPEC_KERNELS_API_H
#define TSSPEC_KERNELS_API_H
#include <Python.h>
#include <stdint.h>

#define TSSPEC_KERNELS_API_VERSION 3
#define TSSPEC_KERNELS_CAPSULE "tsspec_gguf._cpu_kernels.api"

#define QK 32

/* 16-bit float weights (matmul_half.c): 32 weights, 64 bytes a block, d and m never read */
#define FMT_F16 101
#define FMT_BF16 102
static inline int is_half_fmt(int fmt) { return fmt == FMT_F16 || fmt == FMT_BF16; }
static inline int64_t block_bytes(int fmt) { return fmt == 4 ? 16 : fmt == 32 ? 128 : is_half_fmt(fmt) ? 64 : 32; }
/* scales (d, m) per 32-weight block: format 16 is format 8 with a scale per 16 weights (Q6_K) */
static inline int64_t block_scales(int fmt) { return fmt == 16 ? 2 : 1; }

/* a matrix in 32-weight affine blocks, w = d * q + m (formats: see the matmul sources) */
typedef struct {
    int fmt;
    const uint8_t *q;
    const float *d, *m;
    int64_t N, K;
    int zero_m; /* the caller vouches that every m is 0 (format 8): decode rows skip m (zero_m switch) */
} QWeight;

typedef struct {
    const float *attn_norm, *bqkv, *bo, *ffn_norm; /* bqkv, bo: NULL when the file has none */
    QWeight wqkv, wo, gate_up, down;
} StackLayer;

/* a stack of pre-norm GQA + SwiGLU blocks (layers_new's capsule, named LAYER_STACK_CAPSULE) */
typedef struct {
    int64_t H, heads, kv_heads, hd, rope_dim, ffn, n_layers;
    float eps;
    StackLayer *layers;
} LayerStack;
#define LAYER_STACK_CAPSULE "tsspec.LayerStack"

/* the kinds of pool region (pool statistics) a caller tags its calls with */
enum { KIND_OTHER, KIND_QKV, KIND_ATTENTION, KIND_O, KIND_GATE_UP, KIND_DOWN, KIND_GEMM, KIND_BLOCKS, KINDS };

#define TOPK_MAX 64

typedef struct {
    int version; /* TSSPEC_KERNELS_API_VERSION of the exporting build */
    int (*gemm)(const QWeight *W, const float *x, int64_t xs, int64_t R, float *out, int64_t os, const float *base,
                int threads, int int8);
    int (*stack_forward)(const LayerStack *S, int64_t l0, int64_t l1, float *x, int64_t rows, int64_t past, float *kc,
                         float *vc, int64_t cap, const float *rope_table, int threads, int int8);
    int (*block_qkv_cache)(const LayerStack *S, const StackLayer *L, const float *x, float *h, float *qkv,
                           int64_t rows, int64_t past, float *kl, float *vl, int64_t cap, const float *rope_table,
                           int threads, int int8);
    void (*rms_norm_rows)(const float *x, const float *w, float *out, int64_t rows, int64_t n, float eps);
    void (*rms_norm_torch_rows)(const float *x, int64_t xs, const float *w, float *out, int64_t rows, int64_t n,
                                float eps, int lanes);
    int (*torch_lanes_ok)(int lanes);
    /* one matrix row dequantised (nb blocks) into w, on the build's vector path where the CPU has it */
    void (*unpack_row)(int fmt, const uint8_t *q, const float *d, const float *m, int64_t nb, float *w);
    int (*parse_weight)(PyObject *t, QWeight *W);
    int (*parse_matrix)(PyObject *t, QWeight *W, long long N, long long K, const char *name);
    int (*top1_topk_of)(const float *x, long long n, int k, long long *best_out, double *prob);
    void (*set_region_kind)(int kind);
    /* version 2: the row ops a plugin's own block needs (causal attention over a KV cache, RoPE
     * in place, SiLU(gate) * up) */
    int (*attention)(const float *q, int64_t q_row, const float *kc, const float *vc, int64_t cap, float *out,
                     int64_t rows, int64_t heads, int64_t kv_heads, int64_t hd, int64_t past, int threads);
    void (*rope_rows)(float *x, int64_t row_stride, int64_t rows, int64_t heads, int64_t hd, int64_t rope_dim,
                      const float *table, int64_t start);
    void (*silu_mul_rows)(const float *gu, float *out, int64_t rows, int64_t f);
} TsspecKernelsApi;

/* For clients: the table, or NULL with a Python ImportError set. */
static inline const TsspecKernelsApi *tsspec_kernels_import(void) {
    const TsspecKernelsApi *api = (const TsspecKernelsApi *)PyCapsule_Import(TSSPEC_KERNELS_CAPSULE, 0);
    if (api != NULL && api->version != TSSPEC_KERNELS_API_VERSION) {
        PyErr_Format(PyExc_ImportError, "tsspec_gguf._cpu_kernels exports C-API version %d, this extension "
                     "was built for %d: rebuild it against the installed tsspec-gguf", api->version,
                     TSSPEC_KERNELS_API_VERSION);
        return NULL;
    }
    return api;
}
#endif
