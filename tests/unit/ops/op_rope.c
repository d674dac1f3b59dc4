/* rope_forward and rope_backward (rotary embeddings, Hugging Face's rotate_half pairing): every
 * backend against the CPU, the CPU against a double-precision rotation written from the
 * definition and the backward against its finite differences, heads inside wider rows (q or k of
 * a packed q|k|v row) whose other elements must stay untouched, and results held at 16 bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

typedef struct {
    int B, T, n_heads, head_dim;
    size_t row_stride, offset; /* the heads start offset elements into each row */
    float *cos, *sin;          /* [T, head_dim/2] */
    float *x, *dout;           /* [B·T·row_stride] at the case's precision */
} rope_case;

typedef struct {
    float *x, *dx; /* the buffers after the forward, and after the backward over dout */
} rope_result;

static size_t rope_n(const rope_case *c) { return (size_t)c->B * c->T * c->row_stride; }

/* Angles as a model tabulates them, t·theta^(-2j/head_dim) with theta 10000, so that the first
 * dimensions turn fast and the last slowly. */
static rope_case rope_make(zt_test_rng *r, int B, int T, int n_heads, int head_dim, size_t extra,
                           size_t offset, zt_dtype act) {
    rope_case c = {.B = B, .T = T, .n_heads = n_heads, .head_dim = head_dim,
                   .row_stride = (size_t)n_heads * head_dim + extra, .offset = offset};
    ZT_ASSERT(offset <= extra);
    int half = head_dim / 2;
    c.cos = zt_test_zeros((size_t)T * half);
    c.sin = zt_test_zeros((size_t)T * half);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < half; j++) {
            double angle = t * pow(10000.0, -2.0 * j / head_dim);
            c.cos[(size_t)t * half + j] = (float)cos(angle);
            c.sin[(size_t)t * half + j] = (float)sin(angle);
        }
    size_t n = rope_n(&c);
    c.x = zt_test_random(r, n, 0.0, 1.0);
    zt_test_round_all(c.x, n, act);
    c.dout = zt_test_random(r, n, 0.0, 1.0);
    zt_test_round_all(c.dout, n, act);
    return c;
}

static void rope_free(rope_case *c, rope_result *a, rope_result *b) {
    free(c->cos), free(c->sin), free(c->x), free(c->dout);
    rope_result *res[] = {a, b};
    for (int i = 0; i < 2; i++)
        if (res[i])
            free(res[i]->x), free(res[i]->dx);
}

static rope_result rope_run(zt_backend *be, zt_dtype act, const rope_case *c) {
    size_t n = rope_n(c), half = (size_t)c->head_dim / 2, es = zt_test_act_size(be, act);
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    float *cs = zt_test_dev_f32(&d, c->cos, c->T * half);
    float *sn = zt_test_dev_f32(&d, c->sin, c->T * half);
    char *x = zt_test_dev_act(&d, c->x, n), *dx = zt_test_dev_act(&d, c->dout, n);
    be->ops->rope_forward(&d.ctx, x + c->offset * es, cs, sn, c->B, c->T, c->n_heads,
                          c->head_dim, c->row_stride);
    be->ops->rope_backward(&d.ctx, dx + c->offset * es, cs, sn, c->B, c->T, c->n_heads,
                           c->head_dim, c->row_stride);
    rope_result res = {zt_test_zeros(n), zt_test_zeros(n)};
    zt_test_dev_get_act(&d, res.x, x, n);
    zt_test_dev_get_act(&d, res.dx, dx, n);
    zt_test_dev_finish(&d);
    return res;
}

/* Head shapes for the 16-byte chunks (cuda/rope.cu), after four random ones: whole aligned
 * chunks of pairs at every precision (head_dim 64, a q|k|v row), a tail at 16 bits (head_dim 24:
 * 12 pairs), an odd half (26: 13 pairs, misaligned heads after the first), and heads one
 * element off alignment inside a wider row. {head_dim, extra elements, offset} */
static const int rope_shapes[][3] = {{64, 128, 64}, {24, 0, 0}, {26, 26, 0}, {64, 1, 1}};

static void rope_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    for (int k = 0; k < 8; k++) {
        int B = zt_test_int(r, 1, 3), T = zt_test_int(r, 1, 19), H = zt_test_int(r, 1, 5);
        int hd = k < 4 ? 2 * zt_test_int(r, 1, 12) : rope_shapes[k - 4][0];
        size_t extra = k == 0 ? 0 : (size_t)zt_test_int(r, 1, 3) * hd, off = k == 2 ? extra : 0;
        if (k >= 4)
            extra = (size_t)rope_shapes[k - 4][1], off = (size_t)rope_shapes[k - 4][2];
        rope_case c = rope_make(r, B, T, H, hd, extra, off, act);
        rope_result want = rope_run(cpu, act, &c), got = rope_run(be, act, &c);
        char at[160];
        snprintf(at, sizeof at, "rope %s vs cpu at %s, B=%d T=%d heads=%d hd=%d stride=%zu off=%zu",
                 be->name, zt_dtype_name(act), B, T, H, hd, c.row_stride, off);
        double tol = zt_test_tol(act);
        CHECK_CLOSE(got.x, want.x, rope_n(&c), tol, "%s: forward", at);
        CHECK_CLOSE(got.dx, want.dx, rope_n(&c), tol, "%s: backward", at);
        rope_free(&c, &want, &got);
    }
}

/* ---- the double-precision reference ---------------------------------------------------------- */

typedef struct {
    const rope_case *c;
    double *x, *r; /* r is the dout the backward was fed */
} rope_ref;

/* Rotates a copy of s->x into out, from the definition: with rotate_half(v) = (-v2, v1) for the
 * halves v1, v2 of a head, out = v·cos + rotate_half(v)·sin with cos and sin repeated over both
 * halves (as Hugging Face writes it). */
static void rope_ref_forward(const rope_ref *s, double *out) {
    const rope_case *c = s->c;
    int half = c->head_dim / 2;
    for (size_t i = 0; i < rope_n(c); i++)
        out[i] = s->x[i];
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int h = 0; h < c->n_heads; h++) {
                size_t at = ((size_t)b * c->T + t) * c->row_stride + c->offset +
                            (size_t)h * c->head_dim;
                const double *v = s->x + at;
                for (int i = 0; i < c->head_dim; i++) {
                    int j = i % half;
                    double rot = i < half ? -v[i + half] : v[i - half];
                    out[at + i] = v[i] * c->cos[(size_t)t * half + j] +
                                  rot * c->sin[(size_t)t * half + j];
                }
            }
}

static double rope_ref_loss(void *state) {
    rope_ref *s = state;
    size_t n = rope_n(s->c);
    double *out = calloc(n, sizeof *out), l = 0.0;
    rope_ref_forward(s, out);
    for (size_t i = 0; i < n; i++)
        l += out[i] * s->r[i];
    free(out);
    return l;
}

/* The elements outside the heads pass through the forward unchanged, and so their gradient is
 * dout itself, which the finite differences check along with the rest. */
static void rope_grad(zt_backend *cpu, zt_test_rng *r) {
    static const struct {
        int B, T, H, hd, extra_heads, offset_heads;
    } cases[] = {{2, 7, 3, 8, 0, 0}, {1, 1, 1, 2, 0, 0}, {2, 9, 4, 6, 4, 0},
                 {1, 13, 2, 10, 2, 2}, {3, 5, 1, 4, 3, 1}};
    for (int k = 0; k < 5; k++) {
        int B = cases[k].B, T = cases[k].T, H = cases[k].H, hd = cases[k].hd;
        rope_case c = rope_make(r, B, T, H, hd, (size_t)cases[k].extra_heads * hd,
                                (size_t)cases[k].offset_heads * hd, ZT_F32);
        rope_result got = rope_run(cpu, ZT_F32, &c);
        size_t n = rope_n(&c);
        rope_ref s = {&c, zt_test_widen(c.x, n), zt_test_widen(c.dout, n)};
        double *out = calloc(n, sizeof *out);
        rope_ref_forward(&s, out);
        char at[128];
        snprintf(at, sizeof at, "rope cpu B=%d T=%d heads=%d hd=%d stride=%zu off=%zu", B, T, H,
                 hd, c.row_stride, c.offset);
        CHECK_CLOSE(got.x, out, n, ZT_TEST_TOL_FWD, "%s: forward against the reference", at);
        CHECK_FD(s.x, n, got.dx, NULL, rope_ref_loss, &s, 300, r, "%s: backward", at);
        free(out), free(s.x), free(s.r);
        rope_free(&c, &got, NULL);
    }
}

/* At 16 bits both directions hold the rotated heads; the elements around them are untouched. */
static void rope_held(zt_backend *cpu, zt_test_rng *r) {
    for (zt_dtype t = ZT_BF16; t <= ZT_F16; t++) {
        rope_case c = rope_make(r, 2, 11, 3, 6, 12, 6, t);
        rope_result f32 = rope_run(cpu, ZT_F32, &c), held = rope_run(cpu, t, &c);
        const char *tn = zt_dtype_name(t);
        CHECK_HELD(cpu, t, held.x, f32.x, rope_n(&c), "rope at %s: forward", tn);
        CHECK_HELD(cpu, t, held.dx, f32.dx, rope_n(&c), "rope at %s: backward", tn);
        rope_free(&c, &f32, &held);
    }
}

static const char *const entries[] = {"rope_forward", "rope_backward", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "rope", entries, true, rope_compare))
        return;
    zt_test_rng r = zt_test_rng_for("rope/cpu", 0);
    rope_grad(env->be[0], &r);
    rope_held(env->be[0], &r);
}

/* ---- --perf: q and k of a Llama-style packed q|k|v row, B=4, T=256, 12 + 4 heads of 64 ------- */

typedef struct {
    zt_ctx ctx;
    float *x, *cos, *sin;
    int B, T, heads, hd;
    size_t stride;
} rope_perf;

static void rope_perf_forward(void *arg) {
    rope_perf *p = arg;
    p->ctx.be->ops->rope_forward(&p->ctx, p->x, p->cos, p->sin, p->B, p->T, p->heads, p->hd,
                                 p->stride);
}

static void rope_perf_backward(void *arg) {
    rope_perf *p = arg;
    p->ctx.be->ops->rope_backward(&p->ctx, p->x, p->cos, p->sin, p->B, p->T, p->heads, p->hd,
                                  p->stride);
}

static void perf(zt_backend *be) {
    if (!zt_test_has(be, "rope_forward") || !zt_test_has(be, "rope_backward"))
        return;
    const int B = 4, T = 256, NH = 12, KVH = 4, hd = 64;
    zt_test_rng r = zt_test_rng_for("rope/perf", 0);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    rope_perf p = {d.ctx, .B = B, .T = T, .heads = NH + KVH, .hd = hd,
                   .stride = (size_t)(NH + 2 * KVH) * hd};
    p.x = zt_test_dev_random(&d, &r, (size_t)B * T * p.stride, 1.0);
    /* Real tables, so that the values keep their size over the repetitions. */
    rope_case tables = rope_make(&r, 1, T, 1, hd, 0, 0, ZT_F32);
    p.cos = zt_test_dev_f32(&d, tables.cos, (size_t)T * hd / 2);
    p.sin = zt_test_dev_f32(&d, tables.sin, (size_t)T * hd / 2);
    rope_free(&tables, NULL, NULL);
    char shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d heads=%d+%d hd=%d", B, T, NH, KVH, hd);
    /* Bytes: the rotated heads are read and written once. */
    double gb = 2.0 * B * T * p.heads * hd * 4 / 1e9;
    double ms = zt_test_time_ms(be, rope_perf_forward, &p, 20);
    zt_test_perf_row("rope_forward", be, shape, ms, gb, 0);
    ms = zt_test_time_ms(be, rope_perf_backward, &p, 20);
    zt_test_perf_row("rope_backward", be, shape, ms, gb, 0);
    zt_test_dev_finish(&d);
}

const zt_test_family zt_test_rope = {"rope", entries, check, perf};
