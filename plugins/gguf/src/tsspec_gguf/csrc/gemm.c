#include "kernels.h"

/* ---- drivers ---------------------------------------------------------------------------- */


#define ROW_CHUNK 8   /* output rows per chunk (at least) */
#define CHUNKS_PER_THREAD 4
#define FUSED_ROWS 4  /* rows of x a block is multiplied into while it sits in registers */

#define GUIDED_CHUNKS 96 /* at most this many chunks in a guided schedule */


#define Q8_TILE 8    /* rows of x a block is multiplied into while it sits in a register */
#define Q8_GROUP 64  /* rows of x kept in cache while a chunk's weight rows pass over them */

static void gemm_chunk_q8(const GemmJob *J, int64_t n0, int64_t n1, float *res) {
    const QWeight *W = J->W;
    const QAct *A = J->A;
    const int64_t nb = W->K / QK, bb = block_bytes(W->fmt), ns = nb * block_scales(W->fmt);
    const int simd = simd_on();
    for (int64_t g0 = 0; g0 < J->R; g0 += Q8_GROUP) {
        const int64_t g1 = g0 + Q8_GROUP < J->R ? g0 + Q8_GROUP : J->R;
        for (int64_t n = n0; n < n1; n++) {
            const uint8_t *q = W->q + n * nb * bb;
            const float *d = W->d + n * ns, *m = W->m + n * ns;
#ifdef QG_X86
            if (simd && use_pairs && g1 - g0 == 1 && n + 1 < n1 && W->fmt == 4) { /* (format 8's lm_head
                                                                              measured 1.5x slower in pairs) */
                dots_q8_pair_avx2(W->fmt, q, nb * bb, d, m, ns, nb, A, g0, res, 1);
                for (int c = 0; c < 2; c++, n++)
                    J->out[g0 * J->os + n] = J->base != NULL ? J->base[g0 * J->os + n] + res[c] : res[c];
                n--;
                continue;
            }
            if (simd && use_int8_spans && g1 - g0 > 1 && (W->fmt == 4 || W->fmt == 8)) {
                /* every weight row left in the chunk, the group's rows, in one call */
                q8s_span(W->fmt, q, nb * bb, d, m, ns, nb, A, g0, g1 - g0, n1 - n, J->out + g0 * J->os + n, J->os,
                         J->base != NULL ? J->base + g0 * J->os + n : NULL);
                break;
            }
            if (simd) {
                for (int64_t r = g0; r < g1; r += Q8_TILE)
                    dots_q8_avx2(W->fmt, q, d, m, nb, A, r, g1 - r < Q8_TILE ? g1 - r : Q8_TILE, res + (r - g0));
            } else
#endif
                for (int64_t r = g0; r < g1; r++)
                    res[r - g0] = dot_q8_scalar(W->fmt, q, d, m, nb, A->q + r * A->K, A->d + r * nb, A->s32 + r * nb,
                                                A->s16 + r * 2 * nb);
            for (int64_t r = g0; r < g1; r++)
                J->out[r * J->os + n] = J->base != NULL ? J->base[r * J->os + n] + res[r - g0] : res[r - g0];
        }
    }
}

void gemm_chunk(void *arg, int64_t c) {
    const GemmJob *J = (const GemmJob *)arg;
    const QWeight *W = J->W;
    const int64_t nb = W->K / QK, bb = block_bytes(W->fmt), ns = nb * block_scales(W->fmt), R = J->R;
    float *w = scratch((size_t)(W->K + (R > Q8_GROUP ? R : Q8_GROUP)));
    if (w == NULL) {
        atomic_store(J->failed, 1);
        return;
    }
    float *res = w + W->K;
    int64_t n0 = c * J->rows_per_chunk, n1 = n0 + J->rows_per_chunk < W->N ? n0 + J->rows_per_chunk : W->N;
    if (J->bounds != NULL) {
        n0 = J->bounds[c];
        n1 = J->bounds[c + 1];
    }
    if (J->A != NULL) {
        gemm_chunk_q8(J, n0, n1, res);
        return;
    }
    if (is_half_fmt(W->fmt)) {
        gemm_chunk_half(J, n0, n1, w, res);
        return;
    }
    const int simd = simd_on();
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *q = W->q + n * nb * bb;
        const float *d = W->d + n * ns, *m = W->m + n * ns;
#ifdef QG_X86
        if (simd && use_pairs && use_decode_spans && R == 1 && (W->fmt == 4 ? n + 3 < n1 : W->fmt == 8 && n + 1 < n1)) {
            const int64_t group = W->fmt == 4 ? 4 : 2, groups = (n1 - n) / group; /* a decode row: every group */
            const float *bs = J->base != NULL ? J->base + n : NULL;
            if (W->fmt == 4) dot_quad_q4_span_avx2(q, nb * bb, d, m, ns, nb, J->x, groups, J->out + n, bs);
            else if (W->zero_m && use_zero_m) dot_pair_q8z_span_avx2(q, nb * bb, d, ns, nb, J->x, groups, J->out + n, bs);
            else dot_pair_q8_span_avx2(q, nb * bb, d, m, ns, nb, J->x, groups, J->out + n, bs);
            n += group * groups - 1; /* the rows left over go on below */
            continue;
        }
        if (simd && use_pairs && R == 1 && W->fmt == 4 && n + 3 < n1) { /* a decode row, four weight rows */
            dot_quad_q4_avx2(q, nb * bb, d, m, ns, nb, J->x, res);
            for (int c = 0; c < 4; c++, n++) J->out[n] = J->base != NULL ? J->base[n] + res[c] : res[c];
            n--;
            continue;
        }
        if (simd && use_pairs && R == 1 && (W->fmt == 4 || W->fmt == 8) && n + 1 < n1) { /* two weight rows */
            if (W->fmt == 4) dot_pair_q4_avx2(q, nb * bb, d, m, ns, nb, J->x, res);
            else dot_pair_q8_avx2(q, nb * bb, d, m, ns, nb, J->x, res);
            for (int c = 0; c < 2; c++, n++) J->out[n] = J->base != NULL ? J->base[n] + res[c] : res[c];
            n--;
            continue;
        }
        if (simd && use_pair_tiles && use_pair_spans && R == 2 && n + 1 < n1) { /* every pair of the chunk */
            const int64_t pairs = (n1 - n) / 2;
            float *o = J->out + n;
            const float *bs = J->base != NULL ? J->base + n : NULL;
            switch (W->fmt) {
                case 4: pair_tiles_q4_avx2_span(q, nb * bb, d, m, ns, nb, J->x, J->xs, pairs, o, J->os, bs); break;
                case 8: pair_tiles_q8_avx2_span(q, nb * bb, d, m, ns, nb, J->x, J->xs, pairs, o, J->os, bs); break;
                case 16: pair_tiles_q16_avx2_span(q, nb * bb, d, m, ns, nb, J->x, J->xs, pairs, o, J->os, bs); break;
                default: pair_tiles_f32_avx2_span(q, nb * bb, d, m, ns, nb, J->x, J->xs, pairs, o, J->os, bs); break;
            }
            n += 2 * pairs - 1; /* a last unpaired weight row goes on below */
            continue;
        }
        if (simd && use_pair_tiles && R == 2 && n + 1 < n1) { /* two rows of x, two weight rows */
            pair_tiles_avx2(W->fmt, q, nb * bb, d, m, ns, nb, J->x, J->xs, res);
            for (int c = 0; c < 2; c++, n++)
                for (int64_t r = 0; r < 2; r++)
                    J->out[r * J->os + n] = J->base != NULL ? J->base[r * J->os + n] + res[2 * c + r] : res[2 * c + r];
            n--;
            continue;
        }
        const FixedSpan span = simd && use_tile_spans ? fixed_span(W->fmt, R, use_wide_tiles ? WIDE_ROWS : FUSED_ROWS)
                                                      : NULL;
        if (span != NULL) { /* one tile of 3-5 rows: every weight row left in the chunk, in one call */
            span(q, nb * bb, d, m, ns, nb, J->x, J->xs, n1 - n, J->out + n, J->os, J->base != NULL ? J->base + n : NULL);
            break;
        }
        if (simd && use_tile_spans && R > WIDE_ROWS) { /* several tiles: every weight row left, one call */
            const int64_t most = use_wide_tiles ? WIDE_ROWS : FUSED_ROWS, count = n1 - n;
            const float *bs = J->base != NULL ? J->base + n : NULL;
            float *o = J->out + n;
            switch (W->fmt) {
                case 4: tile_spans_q4_avx2(q, nb * bb, d, m, ns, nb, J->x, J->xs, R, most, count, o, J->os, bs, res); break;
                case 8: tile_spans_q8_avx2(q, nb * bb, d, m, ns, nb, J->x, J->xs, R, most, count, o, J->os, bs, res); break;
                case 16: tile_spans_q16_avx2(q, nb * bb, d, m, ns, nb, J->x, J->xs, R, most, count, o, J->os, bs, res); break;
                default: tile_spans_f32_avx2(q, nb * bb, d, m, ns, nb, J->x, J->xs, R, most, count, o, J->os, bs, res); break;
            }
            break;
        }
        if (simd) {
            /* re-unpacking the row per tile beats one unpack into a buffer shared by all
             * rows (measured: 8 rows 21.6 vs 23.2 ms a token); the rows go in the fewest tiles
             * of at most WIDE_ROWS (FUSED_ROWS with wide_tiles off), of near-equal size (9 =
             * 5 + 4, 6 = 3 + 3, not 5 + 1: a lone row's tile waits on its two accumulators'
             * latency) */
            const int64_t most = use_wide_tiles ? WIDE_ROWS : FUSED_ROWS;
            const int64_t tiles = (R + most - 1) / most;
            for (int64_t i = 0, r = 0; i < tiles; i++) {
                const int64_t rows = R / tiles + (i < R % tiles);
                dots_fused_avx2(W->fmt, q, d, m, nb, J->x + r * J->xs, J->xs, rows, res + r);
                r += rows;
            }
        } else
#endif
        {
            unpack_row_scalar(W->fmt, q, d, m, nb, w);
            for (int64_t r = 0; r < R; r++) res[r] = dot_scalar(w, J->x + r * J->xs, W->K);
        }
        if (J->base != NULL)
            for (int64_t r = 0; r < R; r++) J->out[r * J->os + n] = J->base[r * J->os + n] + res[r];
        else
            for (int64_t r = 0; r < R; r++) J->out[r * J->os + n] = res[r];
    }
}

/* A guided schedule of n output rows over `threads` threads: each chunk takes 1 / (2 threads) of
 * the rows left (rounded up to ROW_CHUNK), at least GUIDED_MIN rows, so the first chunks are
 * large (few takes) and the last ones small (a thread that finds no chunk left waits at most on
 * a short one). Which thread computes an output row never changes its value. Writes the chunk
 * bounds (bounds[0] = 0 .. bounds[chunks] = n) and returns the chunk count. */
#define GUIDED_MIN 16
static int64_t guided_bounds(int64_t n, int threads, int64_t *bounds) {
    int64_t chunks = 0, at = 0;
    bounds[0] = 0;
    while (at < n) {
        int64_t size = (n - at + 2 * threads - 1) / (2 * threads);
        size = (size + ROW_CHUNK - 1) / ROW_CHUNK * ROW_CHUNK;
        if (size < GUIDED_MIN) size = GUIDED_MIN;
        if (chunks == GUIDED_CHUNKS - 1 || at + size > n) size = n - at; /* the last chunk takes the rest */
        at += size;
        bounds[++chunks] = at;
    }
    return chunks;
}

int gemm(const QWeight *W, const float *x, int64_t xs, int64_t R, float *out, int64_t os, const float *base,
                int threads, int int8) {
    _Atomic int failed = 0;
    GemmJob J = {W, x, xs, R, os, ROW_CHUNK, out, base, NULL, NULL, &failed};
    int64_t bounds[GUIDED_CHUNKS + 1];
    QAct A;
    void *held = NULL;
    if (int8 && W->fmt != 32 && !is_half_fmt(W->fmt) && R > 0) { /* quantise every row once, before the threads start */
        const int64_t nb = W->K / QK;
        held = malloc((size_t)(R * W->K) + sizeof(float) * (size_t)(R * nb * 4));
        if (held == NULL) return -1;
        A.d = (float *)held;
        A.s32 = A.d + R * nb;
        A.s16 = A.s32 + R * nb;
        A.q = (int8_t *)(A.s16 + R * 2 * nb);
        A.K = W->K;
        A.nb = nb;
        for (int64_t r = 0; r < R; r++) {
#ifdef QG_X86
            if (simd_on()) {
                quantize_row_avx2(x + r * xs, nb, A.q + r * W->K, A.d + r * nb, A.s32 + r * nb, A.s16 + r * 2 * nb);
                continue;
            }
#endif
            quantize_row(x + r * xs, nb, A.q + r * W->K, A.d + r * nb, A.s32 + r * nb, A.s16 + r * 2 * nb);
        }
        J.A = &A;
    }
    if (W->N * W->K * (R > 0 ? R : 1) < 65536) threads = 1;
    int64_t chunks = (W->N + J.rows_per_chunk - 1) / J.rows_per_chunk;
    if (threads > 1 && use_guided) { /* guided: chunks shrink as the rows left do */
        chunks = guided_bounds(W->N, threads, bounds);
        J.bounds = bounds;
    } else if (threads > 1) {
        /* a few chunks per thread: enough for a late worker to join, few enough that taking them
         * costs little (each take is an atomic on a shared cache line) */
        int64_t per = (W->N + threads * CHUNKS_PER_THREAD - 1) / (threads * CHUNKS_PER_THREAD);
        J.rows_per_chunk = per > ROW_CHUNK ? per : ROW_CHUNK;
        chunks = (W->N + J.rows_per_chunk - 1) / J.rows_per_chunk;
    }
    run_chunks(gemm_chunk, &J, chunks, threads);
    free(held);
    return atomic_load(&failed) ? -1 : 0;
}

typedef struct {
    const QWeight *W;
    float *out;
} DequantJob;

static void dequant_chunk(void *arg, int64_t c) {
    const DequantJob *J = (const DequantJob *)arg;
    const QWeight *W = J->W;
    const int64_t nb = W->K / QK, bb = block_bytes(W->fmt), ns = nb * block_scales(W->fmt);
    const int64_t n0 = c * 64, n1 = n0 + 64 < W->N ? n0 + 64 : W->N;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *q = W->q + n * nb * bb;
        const float *d = W->d + n * ns, *m = W->m + n * ns;
#ifdef QG_X86
        if (simd_on())
            unpack_row_avx2(W->fmt, q, d, m, nb, J->out + n * W->K);
        else
#endif
            unpack_row_scalar(W->fmt, q, d, m, nb, J->out + n * W->K);
    }
}

void dequant(const QWeight *W, float *out, int threads) {
    DequantJob J = {W, out};
    run_chunks(dequant_chunk, &J, (W->N + 63) / 64, threads);
}
