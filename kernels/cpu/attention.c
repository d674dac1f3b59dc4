/* Causal multi-head self-attention, with grouped-query heads and an optional sliding window.
 *
 * Each (batch, head) pair is independent, so threads split the pairs and every matrix product
 * inside one pair is a single-threaded product (zt_cpu_sgemm runs on the calling thread inside a
 * parallel region). The T×T probabilities are kept for the backward; on the CPU, at the sequence
 * lengths it trains, that is cheaper than recomputing them. Products are blocked by rows so that
 * the upper (masked) triangle, and with a window the keys before it, are mostly never computed.
 *
 * q, k and v are read through row strides, which covers the packed q|k|v rows of GPT-2 and the
 * separate buffers of Llama's projections with one code path; a query head h reads kv head
 * h / (n_head / n_kv_head). In the backward several query heads of a group add into one kv
 * head's gradient, so those sums are made by the thread that owns the kv head. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu_kernels.h"
#include "gemm.h"
#include "ztrain/status.h"

enum { ROW_BLOCK = 64 };

static int min_int(int a, int b) { return a < b ? a : b; }
static int max_int(int a, int b) { return a > b ? a : b; }

/* Where the heads live: q, k, v (or their gradients) and out, each with its distance between
 * consecutive tokens in floats. */
typedef struct {
    int B, T, NH, KVH, hd, group, window;
    size_t sq, skv, so;
    float scale;
    zt_dtype act; /* the precision outputs are held at, rounded where each block is written */
    const int32_t *doc_pos; /* zt_attn_shape.doc_pos: documents packed in a row, or NULL */
} geom;

/* Rounds rows r0..r1 of one head (hd values at each row stride) to the held precision. */
static void round_rows(const geom *g, float *x, size_t stride, int r0, int r1) {
    if (g->act == ZT_F32)
        return;
    for (int r = r0; r < r1; r++)
        zt_cpu_round_run(x + (size_t)r * stride, (size_t)g->hd, g->act);
}

static geom geom_of(const zt_attn_shape *s, zt_dtype act) {
    ZT_ASSERT(s->n_kv_head > 0 && s->n_head % s->n_kv_head == 0 && s->window >= 0);
    geom g = {.B = s->B, .T = s->T, .NH = s->n_head, .KVH = s->n_kv_head, .hd = s->head_dim,
              .group = s->n_head / s->n_kv_head, .window = s->window, .act = act,
              .doc_pos = s->doc_pos};
    size_t qw = (size_t)s->n_head * s->head_dim, kvw = (size_t)s->n_kv_head * s->head_dim;
    g.sq = s->packed ? qw + 2 * kvw : qw;
    g.skv = s->packed ? g.sq : kvw;
    g.so = qw;
    g.scale = 1.0f / sqrtf((float)s->head_dim);
    return g;
}

/* Where k and v start inside a packed q|k|v row. */
static size_t packed_k(const zt_attn_shape *s) { return (size_t)s->n_head * s->head_dim; }
static size_t packed_v(const zt_attn_shape *s) {
    return packed_k(s) + (size_t)s->n_kv_head * s->head_dim;
}

/* The first key query t of row b sees: the window's, or its document's first token if later.
 * Both only move forward with t, so a block of rows starts at its first row's. Keys from there
 * to t are all visible: a document is contiguous. */
static int first_key(const geom *g, int b, int t) {
    int lo = g->window ? max_int(0, t - g->window + 1) : 0;
    return g->doc_pos ? max_int(lo, t - g->doc_pos[(size_t)b * g->T + t]) : lo;
}

/* Softmax over entries lo..hi-1 of a row of T; the masked rest becomes 0. */
static void masked_softmax_row(float *row, int lo, int hi, int T) {
    float mx = row[lo];
    for (int s = lo + 1; s < hi; s++)
        mx = row[s] > mx ? row[s] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int s = lo; s < hi; s++) {
        row[s] = expf(row[s] - mx);
        sum += row[s];
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int s = lo; s < hi; s++)
        row[s] *= inv;
    memset(row, 0, sizeof(float) * lo);
    memset(row + hi, 0, sizeof(float) * (T - hi));
}

void zt_cpu_attention_forward(float *out, float *att, const zt_attn_shape *s, const float *q,
                              const float *k, const float *v, zt_dtype act) {
    if (s->packed)
        k = q + packed_k(s), v = q + packed_v(s);
    const geom g = geom_of(s, act);
    const int T = g.T;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < g.B; b++) {
        for (int h = 0; h < g.NH; h++) {
            const float *qh = q + (size_t)b * T * g.sq + (size_t)h * g.hd;
            size_t kv_at = (size_t)b * T * g.skv + (size_t)(h / g.group) * g.hd;
            const float *kh = k + kv_at, *vh = v + kv_at;
            float *a = att + ((size_t)b * g.NH + h) * T * T;
            float *o = out + (size_t)b * T * g.so + (size_t)h * g.hd;
            for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
                int r1 = min_int(r0 + ROW_BLOCK, T), k0 = first_key(&g, b, r0);
                /* scores for rows r0..r1 against the keys any of them sees, k0..r1 */
                zt_cpu_sgemm(false, true, r1 - r0, r1 - k0, g.hd,
                             g.scale, qh + r0 * g.sq, (int)g.sq, kh + k0 * g.skv, (int)g.skv, 0.0f,
                             a + (size_t)r0 * T + k0, T);
                for (int t = r0; t < r1; t++)
                    masked_softmax_row(a + (size_t)t * T, first_key(&g, b, t), t + 1, T);
                zt_cpu_sgemm(false, false, r1 - r0, g.hd, r1 - k0,
                             1.0f, a + (size_t)r0 * T + k0, T, vh + k0 * g.skv, (int)g.skv, 0.0f,
                             o + r0 * g.so, (int)g.so);
                round_rows(&g, o, g.so, r0, r1);
            }
        }
    }
}

/* The backward's tensors besides the geometry. */
typedef struct {
    float *dq, *dk, *dv, *scratch;
    const float *dout, *q, *k, *v, *att;
} grads;

/* Query head h of batch b: dscores into its scratch (zero wherever the mask is, so that the key
 * gradients below may read whole blocks of it) and dq. */
static void dscores_and_dq(const geom *g, const grads *x, int b, int h) {
    const int T = g->T;
    size_t kv_at = (size_t)b * T * g->skv + (size_t)(h / g->group) * g->hd;
    const float *kh = x->k + kv_at, *vh = x->v + kv_at;
    const float *a = x->att + ((size_t)b * g->NH + h) * T * T;
    const float *d = x->dout + (size_t)b * T * g->so + (size_t)h * g->hd;
    float *dqh = x->dq + (size_t)b * T * g->sq + (size_t)h * g->hd;
    float *dp = x->scratch + ((size_t)b * g->NH + h) * T * T;
    for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
        int r1 = min_int(r0 + ROW_BLOCK, T), k0 = first_key(g, b, r0);
        /* dprobs = dout · vᵀ, then through the softmax: dscores = p ⊙ (dp - Σ p·dp) */
        zt_cpu_sgemm(false, true, r1 - r0, r1 - k0, g->hd, 1.0f,
                     d + r0 * g->so, (int)g->so, vh + k0 * g->skv, (int)g->skv, 0.0f,
                     dp + (size_t)r0 * T + k0, T);
        for (int t = r0; t < r1; t++) {
            const float *p = a + (size_t)t * T;
            float *gr = dp + (size_t)t * T;
            int lo = first_key(g, b, t);
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int s = lo; s <= t; s++)
                dot += p[s] * gr[s];
#pragma omp simd
            for (int s = lo; s <= t; s++)
                gr[s] = p[s] * (gr[s] - dot) * g->scale;
            memset(gr, 0, sizeof(float) * lo);
            for (int s = t + 1; s < r1; s++)
                gr[s] = 0.0f;
        }
        /* dq rows r0..r1 = dscores · k */
        zt_cpu_sgemm(false, false, r1 - r0, g->hd, r1 - k0, 1.0f,
                     dp + (size_t)r0 * T + k0, T, kh + k0 * g->skv, (int)g->skv, 0.0f,
                     dqh + r0 * g->sq, (int)g->sq);
        round_rows(g, dqh, g->sq, r0, r1);
    }
}

/* Query head i of kv head kvh's group, batch b: its share of dv = Σ pᵀ · dout and
 * dk = Σ dscoresᵀ · q over the group's query heads, whose dscores are in scratch; the first head
 * of the group (i = 0) writes dk and dv, the others add. Key rows s0..s1 receive from the query
 * rows that see them, s0 up to s1 + window - 1 (all later rows without a window). */
static void kv_grads_of_head(const geom *g, const grads *x, int b, int kvh, int i) {
    const int T = g->T, h = kvh * g->group + i;
    size_t kv_at = (size_t)b * T * g->skv + (size_t)kvh * g->hd;
    float *dkh = x->dk + kv_at, *dvh = x->dv + kv_at;
    const float *qh = x->q + (size_t)b * T * g->sq + (size_t)h * g->hd;
    const float *a = x->att + ((size_t)b * g->NH + h) * T * T;
    const float *dp = x->scratch + ((size_t)b * g->NH + h) * T * T;
    const float *d = x->dout + (size_t)b * T * g->so + (size_t)h * g->hd;
    const float beta = i == 0 ? 0.0f : 1.0f;
    for (int s0 = 0; s0 < T; s0 += ROW_BLOCK) {
        int s1 = min_int(s0 + ROW_BLOCK, T);
        int q1 = g->window ? min_int(T, s1 + g->window - 1) : T;
        zt_cpu_sgemm(true, false, s1 - s0, g->hd, q1 - s0, 1.0f,
                     a + (size_t)s0 * T + s0, T, d + s0 * g->so, (int)g->so, beta,
                     dvh + s0 * g->skv, (int)g->skv);
        zt_cpu_sgemm(true, false, s1 - s0, g->hd, q1 - s0, 1.0f,
                     dp + (size_t)s0 * T + s0, T, qh + s0 * g->sq, (int)g->sq, beta,
                     dkh + s0 * g->skv, (int)g->skv);
    }
}

/* Rounds kv head kvh's dk and dv, once every query head of its group has added its share. */
static void round_kv(const geom *g, const grads *x, int b, int kvh) {
    size_t kv_at = (size_t)b * g->T * g->skv + (size_t)kvh * g->hd;
    round_rows(g, x->dk + kv_at, g->skv, 0, g->T);
    round_rows(g, x->dv + kv_at, g->skv, 0, g->T);
}

void zt_cpu_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                               const zt_attn_shape *s, const float *q, const float *k,
                               const float *v, const float *att, zt_dtype act) {
    if (s->packed) {
        k = q + packed_k(s), v = q + packed_v(s);
        dk = dq + packed_k(s), dv = dq + packed_v(s);
    }
    const geom g = geom_of(s, act);
    const grads x = {dq, dk, dv, scratch, dout, q, k, v, att};
    /* Each thread takes a kv head and goes through its group's query heads: a head's dscores
     * and dq, then at once its share of the kv head's dk and dv, while its T×T probabilities and
     * dscores (a quarter of a megabyte each at T = 256) are still in the core's cache rather
     * than written out for a second pass over all heads. The kv head's sums still run over the
     * heads in order (the same bits as query heads first, kv heads after). With too few kv
     * heads to keep every thread busy (batch 1 with one kv head, say) the query heads go in
     * parallel first and the kv heads after, as before. */
    if (g.B * g.KVH >= 2 * omp_get_max_threads()) {
#pragma omp parallel for collapse(2)
        for (int b = 0; b < g.B; b++)
            for (int kvh = 0; kvh < g.KVH; kvh++) {
                for (int i = 0; i < g.group; i++) {
                    dscores_and_dq(&g, &x, b, kvh * g.group + i);
                    kv_grads_of_head(&g, &x, b, kvh, i);
                }
                round_kv(&g, &x, b, kvh);
            }
        return;
    }
#pragma omp parallel for collapse(2)
    for (int b = 0; b < g.B; b++)
        for (int h = 0; h < g.NH; h++)
            dscores_and_dq(&g, &x, b, h);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < g.B; b++)
        for (int kvh = 0; kvh < g.KVH; kvh++) {
            for (int i = 0; i < g.group; i++)
                kv_grads_of_head(&g, &x, b, kvh, i);
            round_kv(&g, &x, b, kvh);
        }
}
