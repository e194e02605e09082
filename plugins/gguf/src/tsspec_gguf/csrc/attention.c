#include "kernels.h"

/* ---- attention ---------------------------------------------------------------------------
 * 2. Causal attention of query rows t = 0..rows-1 at positions past + t over a KV cache:
 *    out[t, h, :] = sum_j softmax_j(q[t, h] . k[g, j]) v[g, j], j = 0 .. past + t, g = h / group.
 * q is pre-scaled. Fixed order: the dot over hd in 8 lanes (lane l sums elements l, l + 8, ..),
 * lanes summed ((0+4)+(2+6))+((1+5)+(3+7)); per key segment of KEY_SEGMENT keys (below) the
 * softmax's exps and their sum in key order, the weighted sum of v accumulated per element in key
 * order; the segments merged in their order, divided by the merged sum at the end. A row depends
 * only on its own query and the keys it sees. */


/* one query row of one head over keys 0..keys-1 of a KV head (or of one key segment, kg and vg
 * pointing at its first row): the softmax's largest score (*top_out), its sum of exps
 * (*total_out), and the unnormalised V sum o[hd] = sum_j exp(s_j - top) v_j */
static void attend_part_scalar(const float *qv, const float *kg, const float *vg, int64_t keys, int64_t hd,
                               float *scores, float *o, float *top_out, float *total_out) {
    float top = -INFINITY;
    for (int64_t j = 0; j < keys; j++) {
        float acc[8] = {0};
        for (int64_t i = 0; i < hd; i++) acc[i % 8] = fmaf(qv[i], kg[j * hd + i], acc[i % 8]);
        scores[j] = lanes8(acc);
        if (scores[j] > top) top = scores[j];
    }
    float lane[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= keys; j += 8)
        for (int l = 0; l < 8; l++) {
            scores[j + l] = exp_scalar(scores[j + l] - top);
            lane[l] += scores[j + l];
        }
    float total = lanes8(lane);
    for (; j < keys; j++) {
        scores[j] = exp_scalar(scores[j] - top);
        total += scores[j];
    }
    memset(o, 0, sizeof(float) * (size_t)hd);
    for (j = 0; j < keys; j++)
        for (int64_t i = 0; i < hd; i++) o[i] = fmaf(scores[j], vg[j * hd + i], o[i]);
    *top_out = top;
    *total_out = total;
}

/* one query row of one head: softmax over keys 0..keys-1 of a KV head, times V, into o[hd] */
static void attend_scalar(const float *qv, const float *kg, const float *vg, int64_t keys, int64_t hd, float *scores,
                          float *o) {
    float top, total;
    attend_part_scalar(qv, kg, vg, keys, hd, scores, o, &top, &total);
    const float inv = 1.0f / total;
    for (int64_t i = 0; i < hd; i++) o[i] *= inv;
}

#ifdef QG_X86

/* scores of one query against keys [j0, j1) of a KV head, eight keys at a time (eight chains in
 * flight), then four, then one; each score is the same 8-lane dot as attend_scalar's */
QG_AVX2 static inline void scores_avx2(const float *qv, const float *kg, int64_t j0, int64_t j1, int64_t hd,
                                       float *scores) {
    int64_t j = j0;
    __m256 z = _mm256_setzero_ps();
    for (; j + 8 <= j1; j += 8) {
        const float *k0 = kg + j * hd;
        __m256 a[8];
        for (int t = 0; t < 8; t++) a[t] = z;
        for (int64_t i = 0; i < hd; i += 8) {
            const __m256 q = _mm256_loadu_ps(qv + i);
            for (int t = 0; t < 8; t++) a[t] = _mm256_fmadd_ps(q, _mm256_loadu_ps(k0 + t * hd + i), a[t]);
        }
        if (use_tree_sums)
            _mm256_storeu_ps(scores + j, hsum8_avx2(a));
        else
            for (int t = 0; t < 8; t++) scores[j + t] = hsum_avx2(a[t], z);
    }
    for (; j + 4 <= j1; j += 4) {
        const float *k0 = kg + j * hd;
        __m256 a0 = z, a1 = z, a2 = z, a3 = z;
        for (int64_t i = 0; i < hd; i += 8) {
            __m256 q = _mm256_loadu_ps(qv + i);
            a0 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k0 + hd + i), a1);
            a2 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k0 + 2 * hd + i), a2);
            a3 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k0 + 3 * hd + i), a3);
        }
        if (use_tree_sums) {
            _mm_storeu_ps(scores + j, hsum4_avx2(a0, a1, a2, a3));
            continue;
        }
        scores[j] = hsum_avx2(a0, z);
        scores[j + 1] = hsum_avx2(a1, z);
        scores[j + 2] = hsum_avx2(a2, z);
        scores[j + 3] = hsum_avx2(a3, z);
    }
    for (; j < j1; j++) {
        __m256 a0 = z;
        for (int64_t i = 0; i < hd; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qv + i), _mm256_loadu_ps(kg + j * hd + i), a0);
        scores[j] = hsum_avx2(a0, z);
    }
}

/* softmax weights in place (unnormalised), their sum (returned) and the largest score (*top_out),
 * as attend_part_scalar computes them */
QG_AVX2 static inline float softmax_avx2(float *scores, int64_t keys, float *top_out) {
    /* the largest score in 8 lanes, then across them: a maximum is the same in any order (a NaN
     * score is passed over, as the scalar loop's comparison passes it over) */
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    int64_t j;
    for (j = 0; j + 8 <= keys; j += 8) m8 = _mm256_max_ps(_mm256_loadu_ps(scores + j), m8);
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, m8);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > top) top = lanes[l];
    for (; j < keys; j++)
        if (scores[j] > top) top = scores[j];
    *top_out = top;
    __m256 vtop = _mm256_set1_ps(top), lane = _mm256_setzero_ps();
    for (j = 0; j + 8 <= keys; j += 8) {
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vtop));
        _mm256_storeu_ps(scores + j, e);
        lane = _mm256_add_ps(lane, e);
    }
    float total = hsum_avx2(lane, _mm256_setzero_ps());
    for (; j < keys; j++) {
        scores[j] = exp_scalar(scores[j] - top);
        total += scores[j];
    }
    return total;
}

/* o += p_j v_j over keys [j0, j1) for one query: 8 chunks of 8 elements in registers (eight
 * chains) while 64 are left, then up to 4; each element takes its products in key order */
QG_AVX2 static inline void weighted_v_avx2(const float *p, const float *vg, int64_t j0, int64_t j1, int64_t hd,
                                           float *o) {
    int64_t i0 = 0;
    for (; i0 + 64 <= hd; i0 += 64) {
        __m256 c[8];
        for (int t = 0; t < 8; t++) c[t] = _mm256_loadu_ps(o + i0 + 8 * t);
        for (int64_t j = j0; j < j1; j++) {
            const __m256 pj = _mm256_set1_ps(p[j]);
            const float *vj = vg + j * hd + i0;
            for (int t = 0; t < 8; t++) c[t] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * t), c[t]);
        }
        for (int t = 0; t < 8; t++) _mm256_storeu_ps(o + i0 + 8 * t, c[t]);
    }
    for (int64_t i = i0; i < hd; i += 32) {
        int64_t w = hd - i < 32 ? hd - i : 32;
        __m256 c0 = _mm256_loadu_ps(o + i), c1 = c0, c2 = c0, c3 = c0;
        if (w > 8) c1 = _mm256_loadu_ps(o + i + 8);
        if (w > 16) c2 = _mm256_loadu_ps(o + i + 16);
        if (w > 24) c3 = _mm256_loadu_ps(o + i + 24);
        for (int64_t j = j0; j < j1; j++) {
            __m256 pj = _mm256_set1_ps(p[j]);
            const float *vj = vg + j * hd + i;
            c0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj), c0);
            if (w > 8) c1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8), c1);
            if (w > 16) c2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 16), c2);
            if (w > 24) c3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 24), c3);
        }
        _mm256_storeu_ps(o + i, c0);
        if (w > 8) _mm256_storeu_ps(o + i + 8, c1);
        if (w > 16) _mm256_storeu_ps(o + i + 16, c2);
        if (w > 24) _mm256_storeu_ps(o + i + 24, c3);
    }
}

#define KEY_BLOCK 64 /* keys of K (and V) reused from L1 by every query of a KV head */

/* queries of one KV head (n of them: group heads x rows, or a share of them) over its keys 0..
 * keys[u]-1 (kg, vg: its first K and V row, or a key segment's): keys are walked in blocks so a
 * block of K and V serves every query while it is in cache; per query, the largest score
 * (tops[u]), the sum of exps (sums[u]) and the unnormalised V sum (os[u]: o += p_j v_j, j in
 * order, 8 lanes per element chunk) are exactly attend_part_scalar's */
QG_AVX2 static void attend_group_avx2(const float *const *qs, const int64_t *keys, int64_t n, const float *kg,
                                      const float *vg, int64_t hd, float *scores, int64_t stride, float *const *os,
                                      float *sums, float *tops) {
    int64_t most = 0;
    for (int64_t u = 0; u < n; u++) most = keys[u] > most ? keys[u] : most;
    for (int64_t j0 = 0; j0 < most; j0 += KEY_BLOCK) {
        for (int64_t u = 0; u < n; u++) {
            int64_t j1 = j0 + KEY_BLOCK < keys[u] ? j0 + KEY_BLOCK : keys[u];
            if (j1 > j0) scores_avx2(qs[u], kg, j0, j1, hd, scores + u * stride);
        }
    }
    for (int64_t u = 0; u < n; u++) {
        sums[u] = softmax_avx2(scores + u * stride, keys[u], &tops[u]);
        memset(os[u], 0, sizeof(float) * (size_t)hd);
    }
    for (int64_t j0 = 0; j0 < most; j0 += KEY_BLOCK) {
        for (int64_t u = 0; u < n; u++) {
            int64_t j1 = j0 + KEY_BLOCK < keys[u] ? j0 + KEY_BLOCK : keys[u];
            if (j1 > j0) weighted_v_avx2(scores + u * stride, vg, j0, j1, hd, os[u]);
        }
    }
}

/* fold_segment (below), 8 elements at a time: the same operations, each rounded once; exp_scalar
 * and fmaf inline here as single instructions (this function may use FMA) */
QG_AVX2 static void fold_segment_avx2(float *o, float *m, float *l, const float *os, float ms, float ls, int64_t hd) {
    const float top = ms > *m ? ms : *m, fa = exp_scalar(*m - top), fb = exp_scalar(ms - top);
    *l = fmaf(ls, fb, *l * fa);
    *m = top;
    const __m256 va = _mm256_set1_ps(fa), vb = _mm256_set1_ps(fb);
    for (int64_t i = 0; i < hd; i += 8)
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(_mm256_loadu_ps(os + i), vb, _mm256_mul_ps(_mm256_loadu_ps(o + i), va)));
}
#endif


/* ---- by key segments (the default) ----
 * A query's keys 0..past+t go in segments [s S, (s + 1) S), S = KEY_SEGMENT, a constant: the
 * boundaries depend on the key index only. Per segment the query's largest score m_s, its sum of
 * exps l_s = sum_j exp(x_j - m_s) and its unnormalised V sum o_s = sum_j exp(x_j - m_s) v_j are
 * attend_part_scalar's over the segment's keys (lanes counted from the segment's first key).
 * They fold in segment order, from (m, l, o) = (m_0, l_0, o_0): for s = 1, 2, ..
 *   top = max(m, m_s), a = exp(m - top), b = exp(m_s - top),
 *   l = fma(l_s, b, l * a), o = fma(o_s, b, o * a) per element, m = top;
 * and out = o * (1 / l) (one segment: o_0 * (1 / l_0)). So a query's output depends on its own
 * query and keys only, whatever the rows, threads and chunks: a k-row verify is the 1-row decode
 * bit for bit. Two chunkings give those same bits:
 * - segment chunks (decode, verify): (segment, KV head, share of its queries); every row and
 *   query head of the group meets the segment's K and V rows while they are in cache, so with
 *   one share each KV row is read once, and the segments balance over the threads; each stores
 *   its partial (o_s, m_s, l_s), and the chunk that finishes a share's last segment folds them;
 * - span chunks (prefill slices of many rows, arithmetic-bound): (KV head, share), every segment
 *   in order, folding as it goes into the output row (no partials through memory). */

/* (m, l, o[hd]) = the fold of (m, l, o) with segment (ms, ls, os[hd]), as described above */
static void fold_segment(float *o, float *m, float *l, const float *os, float ms, float ls, int64_t hd) {
#ifdef QG_X86
    if (simd_on() && hd % 8 == 0) {
        fold_segment_avx2(o, m, l, os, ms, ls, hd);
        return;
    }
#endif
    const float top = ms > *m ? ms : *m, fa = exp_scalar(*m - top), fb = exp_scalar(ms - top);
    *l = fmaf(ls, fb, *l * fa);
    *m = top;
    for (int64_t i = 0; i < hd; i++) o[i] = fmaf(os[i], fb, o[i] * fa);
}

/* o[hd] *= 1 / l: a query's output from its folded V sum */
static void normalise_row(float *o, float l, int64_t hd) {
    const float inv = 1.0f / l;
    for (int64_t i = 0; i < hd; i++) o[i] *= inv;
}

/* one query's output from its segments' partial results part [segs, hd + 2] (V sum, top, sum of
 * exps), folded in order */
static void merge_query(const float *part, int64_t segs, int64_t hd, float *o) {
    const int64_t slot = hd + 2;
    float m = part[hd], l = part[hd + 1];
    memcpy(o, part, sizeof(float) * (size_t)hd);
    for (int64_t s = 1; s < segs; s++) fold_segment(o, &m, &l, part + s * slot, part[s * slot + hd], part[s * slot + hd + 1], hd);
    normalise_row(o, l, hd);
}

/* every query of KV head g's share p with more than one segment: its output from its segments */
static void merge_share(const AttentionJob *J, int64_t g, int64_t p) {
    const int64_t group = J->heads / J->kv_heads, hd = J->hd;
    for (int64_t u = p; u < J->rows * group; u += J->parts) {
        const int64_t t = u / group, h = g * group + u % group, end = J->past + t + 1;
        if (end <= KEY_SEGMENT) continue; /* one segment: segment_chunk wrote the output */
        const float *part = J->partial + (t * J->heads + h) * J->segments * (hd + 2);
        merge_query(part, (end + KEY_SEGMENT - 1) / KEY_SEGMENT, hd, J->out + (t * J->heads + h) * hd);
    }
}

/* A chunk's scratch: `floats` floats of the caller's layout, then (8-byte aligned) query pointers,
 * output pointers and key counts [n] each. 0 (and the call's out-of-memory flag set) when the
 * scratch cannot grow. */
typedef struct {
    float *f;
    const float **qs;
    float **os;
    int64_t *keys;
} QueryScratch;

static int query_scratch(const AttentionJob *J, size_t floats, int64_t n, QueryScratch *S) {
    const size_t pointer_floats = (2 * sizeof(void *) + sizeof(int64_t)) / sizeof(float);
    float *f = scratch(floats + pointer_floats * (size_t)n + 2);
    if (f == NULL) {
        atomic_store(J->failed, 1);
        return 0;
    }
    S->f = f;
    S->qs = (const float **)(((uintptr_t)(f + floats) + 7) & ~(uintptr_t)7);
    S->os = (float **)(S->qs + n);
    S->keys = (int64_t *)(S->os + n);
    return 1;
}

static void segment_chunk(void *arg, int64_t c) { /* segment s of KV head g, queries p, p + parts, .. */
    const AttentionJob *J = (const AttentionJob *)arg;
    const int64_t group = J->heads / J->kv_heads, hd = J->hd, slot = hd + 2, all = J->rows * group;
    const int64_t s = c / (J->kv_heads * J->parts), g = c / J->parts % J->kv_heads, p = c % J->parts;
    const int64_t a = s * KEY_SEGMENT, last = J->past + J->rows;
    const int64_t b = a + KEY_SEGMENT < last ? a + KEY_SEGMENT : last;
    const int64_t most = (all - p + J->parts - 1) / J->parts;
    /* scores [most, KEY_SEGMENT], sums [most], tops [most], then (8-byte aligned) query and
     * output pointers and key counts [most] each */
    QueryScratch S;
    if (!query_scratch(J, (size_t)(most * (KEY_SEGMENT + 2)), most, &S)) return;
    float *scores = S.f, *sums = scores + most * KEY_SEGMENT, *tops = sums + most;
    const float **qs = S.qs;
    float **os = S.os;
    int64_t *keys = S.keys;
    int64_t n = 0;
    for (int64_t u = p; u < all; u += J->parts) {
        const int64_t t = u / group, h = g * group + u % group, end = J->past + t + 1;
        if (end <= a) continue; /* a row before the segment */
        qs[n] = J->q + t * J->q_row + h * hd;
        os[n] = end <= KEY_SEGMENT ? J->out + (t * J->heads + h) * hd
                                   : J->partial + ((t * J->heads + h) * J->segments + s) * slot;
        keys[n++] = (end < b ? end : b) - a;
    }
    const float *ks = J->kc + (g * J->cap + a) * hd, *vs = J->vc + (g * J->cap + a) * hd;
#ifdef QG_X86
    if (simd_on() && hd % 8 == 0)
        attend_group_avx2(qs, keys, n, ks, vs, hd, scores, KEY_SEGMENT, os, sums, tops);
    else
#endif
        for (int64_t u = 0; u < n; u++) attend_part_scalar(qs[u], ks, vs, keys[u], hd, scores, os[u], &tops[u], &sums[u]);
    for (int64_t u = p, m = 0; u < all; u += J->parts) { /* the same queries again, in the same order */
        const int64_t end = J->past + u / group + 1;
        if (end <= a) continue;
        if (end <= KEY_SEGMENT) { /* the query's only segment: its output */
            normalise_row(os[m], sums[m], hd);
        } else {
            os[m][hd] = tops[m];
            os[m][hd + 1] = sums[m];
        }
        m++;
    }
    if (J->segments > 1 && atomic_fetch_add(&J->done[g * J->parts + p], 1) == J->segments - 1)
        merge_share(J, g, p); /* every segment of this share is in (the add orders their writes) */
}

static void span_chunk(void *arg, int64_t c) { /* KV head g, queries p, p + parts, ..: every segment */
    const AttentionJob *J = (const AttentionJob *)arg;
    const int64_t group = J->heads / J->kv_heads, hd = J->hd, all = J->rows * group;
    const int64_t g = c / J->parts, p = c % J->parts, most = (all - p + J->parts - 1) / J->parts;
    /* scores [most, KEY_SEGMENT], sums, tops, folded tops and sums [most] each, a segment's V sums
     * [most, hd], then (8-byte aligned) query and output pointers and key counts [most] each */
    QueryScratch S;
    if (!query_scratch(J, (size_t)(most * (KEY_SEGMENT + 4 + hd)), most, &S)) return;
    float *scores = S.f, *sums = scores + most * KEY_SEGMENT, *tops = sums + most, *ms = tops + most;
    float *ls = ms + most, *seg_o = ls + most;
    const float **qs = S.qs;
    float **os = S.os;
    int64_t *keys = S.keys;
    const float *kg = J->kc + g * J->cap * hd, *vg = J->vc + g * J->cap * hd;
    for (int64_t s = 0; s < J->segments; s++) {
        const int64_t a = s * KEY_SEGMENT, last = J->past + J->rows;
        const int64_t b = a + KEY_SEGMENT < last ? a + KEY_SEGMENT : last;
        int64_t n = 0;
        for (int64_t u = p, i = 0; u < all; u += J->parts, i++) {
            const int64_t t = u / group, h = g * group + u % group, end = J->past + t + 1;
            if (end <= a) continue; /* a row before the segment */
            qs[n] = J->q + t * J->q_row + h * hd;
            os[n] = s == 0 ? J->out + (t * J->heads + h) * hd : seg_o + i * hd; /* segment 0 starts the fold */
            keys[n++] = (end < b ? end : b) - a;
        }
#ifdef QG_X86
        if (simd_on() && hd % 8 == 0)
            attend_group_avx2(qs, keys, n, kg + a * hd, vg + a * hd, hd, scores, KEY_SEGMENT, os, sums, tops);
        else
#endif
            for (int64_t u = 0; u < n; u++)
                attend_part_scalar(qs[u], kg + a * hd, vg + a * hd, keys[u], hd, scores, os[u], &tops[u], &sums[u]);
        for (int64_t u = p, i = 0, m = 0; u < all; u += J->parts, i++) {
            const int64_t t = u / group, h = g * group + u % group;
            if (J->past + t + 1 <= a) continue;
            if (s == 0) {
                ms[i] = tops[m];
                ls[i] = sums[m];
            } else {
                fold_segment(J->out + (t * J->heads + h) * hd, &ms[i], &ls[i], os[m], tops[m], sums[m], hd);
            }
            m++;
        }
    }
    for (int64_t u = p, i = 0; u < all; u += J->parts, i++)
        normalise_row(J->out + ((u / group) * J->heads + g * group + u % group) * hd, ls[i], hd);
}

/* Segment chunks for calls of up to SPAN_ROWS rows (decode, verify) on several threads, segments
 * first (the early ones hold the most rows of a causal call); one share per KV head (each K and V
 * row read once) unless the segments and KV heads give the threads fewer than 2 chunks each (a
 * few rows over few keys), then as many shares, each every parts-th query of the group (rows
 * interleaved, so the shares' key counts match), as make up 2. On one thread (nothing to
 * balance) span chunks, one a KV head; longer calls (prefill slices) in span chunks too, shares
 * of the KV heads, 4 chunks a thread: their attention is arithmetic on K and V rows in cache, and
 * a segment chunk's partial results would go through memory for every row. */
#define SPAN_ROWS 16
static int attention_by_segments(AttentionJob *J, int threads) {
    const int64_t group = J->heads / J->kv_heads, span = threads <= 1 || J->rows > SPAN_ROWS;
    J->segments = (J->past + J->rows + KEY_SEGMENT - 1) / KEY_SEGMENT;
    J->parts = 1;
    const int64_t base = span ? J->kv_heads : J->kv_heads * J->segments, want = (span ? 4 : 2) * (int64_t)threads;
    if (threads > 1 && base < want) {
        J->parts = (want + base - 1) / base;
        if (J->parts > J->rows * group) J->parts = J->rows * group;
    }
    J->partial = NULL;
    J->done = NULL;
    if (!span && J->segments > 1) {
        /* partial results, then (8-byte aligned) a count of finished segments per share */
        const size_t floats = (size_t)(J->rows * J->heads * J->segments * (J->hd + 2));
        const size_t shares = (size_t)(J->kv_heads * J->parts);
        J->partial = scratch_slot(1, floats + 2 + shares * sizeof(int64_t) / sizeof(float));
        if (J->partial == NULL) return -1;
        J->done = (_Atomic int64_t *)(((uintptr_t)(J->partial + floats) + 7) & ~(uintptr_t)7);
        for (size_t i = 0; i < shares; i++) atomic_store_explicit(&J->done[i], 0, memory_order_relaxed);
    }
    run_chunks(span ? span_chunk : segment_chunk, J, base * J->parts, threads);
    return atomic_load(J->failed) ? -1 : 0;
}

/* ---- by query heads (set_key_segments(False): the previous scheme, for A/B runs) ---- */
static void heads_chunk(void *arg, int64_t c) { /* KV head g: its query heads h0..h1-1, all rows */
    const AttentionJob *J = (const AttentionJob *)arg;
    const int64_t group = J->heads / J->kv_heads, stride = J->past + J->rows;
    const int64_t g = c / J->split, h0 = g * group + (c % J->split) * J->per;
    const int64_t h1 = h0 + J->per < (g + 1) * group ? h0 + J->per : (g + 1) * group, n = (h1 - h0) * J->rows;
    /* scores [n, stride], sums [n], tops [n], then (8-byte aligned) query and output pointers and
     * key counts [n] each */
    QueryScratch S;
    if (!query_scratch(J, (size_t)(n * stride + 2 * n), n, &S)) return;
    float *scores = S.f, *sums = scores + n * stride, *tops = sums + n;
    const float **qs = S.qs;
    float **os = S.os;
    int64_t *keys = S.keys;
    const float *kg = J->kc + g * J->cap * J->hd, *vg = J->vc + g * J->cap * J->hd;
    for (int64_t t = 0, u = 0; t < J->rows; t++)
        for (int64_t h = h0; h < h1; h++, u++) {
            qs[u] = J->q + t * J->q_row + h * J->hd;
            os[u] = J->out + (t * J->heads + h) * J->hd;
            keys[u] = J->past + t + 1;
        }
#ifdef QG_X86
    if (simd_on() && J->hd % 8 == 0) {
        attend_group_avx2(qs, keys, n, kg, vg, J->hd, scores, stride, os, sums, tops);
        for (int64_t u = 0; u < n; u++) {
            const float inv = 1.0f / sums[u];
            for (int64_t i = 0; i < J->hd; i++) os[u][i] *= inv;
        }
    } else
#endif
        for (int64_t u = 0; u < n; u++) attend_scalar(qs[u], kg, vg, keys[u], J->hd, scores, os[u]);
}

/* chunks are KV heads (their queries share every K and V row while it is in cache). Where the KV
 * heads do not split evenly over the threads, several rows' queries go in single query heads
 * (SmolLM2's 3 KV heads on 2 threads: 9 chunks instead of 2 + 1, each KV head read 3 times),
 * while one row's stay KV heads unless there are fewer KV heads than threads (then as few query
 * groups as keep every thread busy). Every query is computed the same way either way. */
static int attention_by_heads(AttentionJob *J, int threads) {
    if (threads > 1 && J->rows > 1 && J->kv_heads % threads != 0) {
        J->per = 1;
        J->split = J->heads / J->kv_heads;
    } else if (threads > 1 && J->kv_heads < threads) {
        const int64_t group = J->heads / J->kv_heads, parts = (threads + J->kv_heads - 1) / J->kv_heads;
        J->per = (group + parts - 1) / parts;
        J->split = (group + J->per - 1) / J->per;
    }
    run_chunks(heads_chunk, J, J->kv_heads * J->split, threads);
    return atomic_load(J->failed) ? -1 : 0;
}

int attention(const float *q, int64_t q_row, const float *kc, const float *vc, int64_t cap, float *out,
                     int64_t rows, int64_t heads, int64_t kv_heads, int64_t hd, int64_t past, int threads) {
    _Atomic int failed = 0;
    AttentionJob J = {q, kc, vc, out, q_row, cap, rows, heads, kv_heads, hd, past, 1, heads / kv_heads, 1, 1, NULL, NULL,
                      &failed};
    if (heads * rows * (past + rows) * hd < 262144) threads = 1;
    return use_key_segments ? attention_by_segments(&J, threads) : attention_by_heads(&J, threads);
}
