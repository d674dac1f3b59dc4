/* attention_forward and attention_backward, GPT-2's case (packed q|k|v, as many kv heads as query
 * heads, no window): every backend against the CPU, the CPU against a double-precision causal
 * attention and its finite differences, and outputs held at 16 bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct {
    zt_attn_shape s;
    float *qkv;  /* [B,T,3C] at the case's precision */
    float *dout; /* [B,T,C] at the case's precision */
} att_case;

typedef struct {
    float *out, *att, *dqkv;
} att_result;

static size_t att_c(const att_case *c) { return (size_t)c->s.n_head * c->s.head_dim; }
static size_t att_rows(const att_case *c) { return (size_t)c->s.B * c->s.T; }
static size_t att_probs(const att_case *c) {
    return (size_t)c->s.B * c->s.n_head * c->s.T * c->s.T;
}

static att_case att_make(zt_test_rng *r, int B, int T, int NH, int hd, zt_dtype act) {
    att_case c = {.s = {B, T, NH, NH, hd, true, 0}};
    size_t nqkv = att_rows(&c) * 3 * att_c(&c), nout = att_rows(&c) * att_c(&c);
    c.qkv = zt_test_random(r, nqkv, 0.0, 1.0);
    zt_test_round_all(c.qkv, nqkv, act);
    c.dout = zt_test_random(r, nout, 0.0, 1.0);
    zt_test_round_all(c.dout, nout, act);
    return c;
}

static void att_free(att_case *c, att_result *a, att_result *b) {
    free(c->qkv), free(c->dout);
    att_result *res[] = {a, b};
    for (int i = 0; i < 2; i++)
        if (res[i])
            free(res[i]->out), free(res[i]->att), free(res[i]->dqkv);
}

/* The forward, then the backward from the probabilities it kept into a dq that holds NaN (the
 * backward overwrites it), on be at act. */
static att_result att_run(zt_backend *be, zt_dtype act, const att_case *c) {
    size_t nqkv = att_rows(c) * 3 * att_c(c), nout = att_rows(c) * att_c(c), np = att_probs(c);
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    void *out = zt_test_dev_alloc(&d, nout * zt_test_act_size(be, act));
    float *att = zt_test_dev_alloc(&d, np * sizeof(float));
    float *scratch = zt_test_dev_alloc(&d, np * sizeof(float));
    void *qkv = zt_test_dev_act(&d, c->qkv, nqkv), *dout = zt_test_dev_act(&d, c->dout, nout);
    float *nans = zt_test_nans(nqkv);
    void *dqkv = zt_test_dev_act(&d, nans, nqkv);
    free(nans);
    be->ops->attention_forward(&d.ctx, &c->s, out, att, qkv, NULL, NULL);
    be->ops->attention_backward(&d.ctx, &c->s, dqkv, NULL, NULL, scratch, dout, qkv, NULL, NULL,
                                att);
    att_result x = {zt_test_zeros(nout), zt_test_zeros(np), zt_test_zeros(nqkv)};
    zt_test_dev_get_act(&d, x.out, out, nout);
    zt_test_dev_get_f32(&d, x.att, att, np);
    zt_test_dev_get_act(&d, x.dqkv, dqkv, nqkv);
    zt_test_dev_finish(&d);
    return x;
}

/* The probabilities above the diagonal are zero by definition, but a backend need not write
 * them; the comparison between backends looks at the causal part only. */
static void causal_only(float *att, const att_case *c) {
    int T = c->s.T;
    for (size_t m = 0; m < (size_t)c->s.B * c->s.n_head; m++)
        for (int t = 0; t < T; t++)
            for (int u = t + 1; u < T; u++)
                att[(m * T + t) * T + u] = 0.0f;
}

static void att_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    for (int k = 0; k < 4; k++) {
        int B = k == 0 ? 1 : 2, T = k == 3 ? zt_test_int(r, 65, 70) : zt_test_int(r, 1, 23);
        int NH = zt_test_int(r, 1, 4), hd = zt_test_int(r, 2, 11);
        att_case c = att_make(r, B, T, NH, hd, act);
        att_result want = att_run(cpu, act, &c), got = att_run(be, act, &c);
        causal_only(want.att, &c), causal_only(got.att, &c);
        char at[128];
        snprintf(at, sizeof at, "attention %s vs cpu at %s, B=%d T=%d NH=%d hd=%d", be->name,
                 zt_dtype_name(act), B, T, NH, hd);
        double tol = zt_test_tol(act);
        CHECK_CLOSE(got.out, want.out, att_rows(&c) * att_c(&c), tol, "%s: out", at);
        CHECK_CLOSE(got.att, want.att, att_probs(&c), tol, "%s: att", at);
        CHECK_CLOSE(got.dqkv, want.dqkv, att_rows(&c) * 3 * att_c(&c), tol, "%s: dqkv", at);
        att_free(&c, &want, &got);
    }
}

/* ---- the double-precision reference ---------------------------------------------------------- */

typedef struct {
    const att_case *c;
    double *qkv, *r; /* r is the dout the backward was fed */
} att_ref;

/* Causal softmax attention, one (batch, head, query) row at a time; att may be NULL. */
static void att_ref_forward(const att_ref *s, double *out, double *att) {
    const zt_attn_shape *sh = &s->c->s;
    int T = sh->T, hd = sh->head_dim;
    size_t C = att_c(s->c), C3 = 3 * C;
    double scale = 1.0 / sqrt((double)hd), *p = calloc(T, sizeof *p);
    for (int b = 0; b < sh->B; b++)
        for (int h = 0; h < sh->n_head; h++)
            for (int t = 0; t < T; t++) {
                const double *q = s->qkv + ((size_t)b * T + t) * C3 + (size_t)h * hd;
                double mx = -INFINITY, sum = 0.0;
                for (int u = 0; u <= t; u++) {
                    const double *k = s->qkv + ((size_t)b * T + u) * C3 + C + (size_t)h * hd;
                    double dot = 0.0;
                    for (int i = 0; i < hd; i++)
                        dot += q[i] * k[i];
                    p[u] = dot * scale;
                    mx = fmax(mx, p[u]);
                }
                for (int u = 0; u <= t; u++)
                    sum += (p[u] = exp(p[u] - mx));
                double *o = out + ((size_t)b * T + t) * C + (size_t)h * hd;
                for (int i = 0; i < hd; i++)
                    o[i] = 0.0;
                for (int u = 0; u <= t; u++) {
                    p[u] /= sum;
                    const double *v = s->qkv + ((size_t)b * T + u) * C3 + 2 * C + (size_t)h * hd;
                    for (int i = 0; i < hd; i++)
                        o[i] += p[u] * v[i];
                }
                if (att)
                    for (int u = 0; u < T; u++)
                        att[(((size_t)b * sh->n_head + h) * T + t) * T + u] = u <= t ? p[u] : 0.0;
            }
    free(p);
}

static double att_ref_loss(void *state) {
    att_ref *s = state;
    size_t n = att_rows(s->c) * att_c(s->c);
    double *out = calloc(n, sizeof *out), l = 0.0;
    att_ref_forward(s, out, NULL);
    for (size_t i = 0; i < n; i++)
        l += out[i] * s->r[i];
    free(out);
    return l;
}

/* Single and several heads, a single position, and sequences past the kernel's 64-row blocks. */
static void att_grad(zt_backend *cpu, zt_test_rng *r) {
    static const int shapes[][4] = {{2, 9, 3, 5}, {1, 1, 2, 4}, {1, 67, 1, 3}, {2, 13, 4, 7},
                                    {1, 5, 1, 2}};
    for (int k = 0; k < 5; k++) {
        int B = shapes[k][0], T = shapes[k][1], NH = shapes[k][2], hd = shapes[k][3];
        att_case c = att_make(r, B, T, NH, hd, ZT_F32);
        att_result got = att_run(cpu, ZT_F32, &c);
        size_t nqkv = att_rows(&c) * 3 * att_c(&c), nout = att_rows(&c) * att_c(&c);
        att_ref s = {&c, zt_test_widen(c.qkv, nqkv), zt_test_widen(c.dout, nout)};
        double *out = calloc(nout, sizeof *out), *att = calloc(att_probs(&c), sizeof *att);
        att_ref_forward(&s, out, att);
        char at[96];
        snprintf(at, sizeof at, "attention cpu B=%d T=%d NH=%d hd=%d", B, T, NH, hd);
        CHECK_CLOSE(got.out, out, nout, ZT_TEST_TOL_FWD, "%s: out against the reference", at);
        CHECK_CLOSE(got.att, att, att_probs(&c), ZT_TEST_TOL_FWD,
                    "%s: att against the reference", at);
        CHECK_FD(s.qkv, nqkv, got.dqkv, NULL, att_ref_loss, &s, 300, r,
                 "%s: dqkv (overwriting NaN)", at);
        free(out), free(att), free(s.qkv), free(s.r);
        att_free(&c, &got, NULL);
    }
}

/* At 16 bits out and dqkv are held; the probabilities are those of fp32 activations. */
static void att_held(zt_backend *cpu, zt_test_rng *r) {
    for (zt_dtype t = ZT_BF16; t <= ZT_F16; t++) {
        att_case c = att_make(r, 2, 11, 3, 6, t);
        att_result f32 = att_run(cpu, ZT_F32, &c), held = att_run(cpu, t, &c);
        const char *tn = zt_dtype_name(t);
        CHECK_HELD(cpu, t, held.out, f32.out, att_rows(&c) * att_c(&c), "attention at %s: out",
                   tn);
        CHECK_HELD(cpu, t, held.dqkv, f32.dqkv, att_rows(&c) * 3 * att_c(&c),
                   "attention at %s: dqkv", tn);
        CHECK_SAME(held.att, f32.att, att_probs(&c), "attention at %s: att", tn);
        att_free(&c, &f32, &held);
    }
}

static const char *const entries[] = {"attention_forward", "attention_backward", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "attention", entries, true, att_compare))
        return;
    zt_test_rng r = zt_test_rng_for("attention/cpu", 0);
    att_grad(env->be[0], &r);
    att_held(env->be[0], &r);
}

/* ---- --perf: GPT-2 small's attention, B=4, T=256, 12 heads of 64 ----------------------------- */

typedef struct {
    zt_ctx ctx;
    zt_attn_shape s;
    void *out, *qkv, *dqkv, *dout;
    float *att, *scratch;
} att_perf;

static void att_perf_forward(void *arg) {
    att_perf *p = arg;
    p->ctx.be->ops->attention_forward(&p->ctx, &p->s, p->out, p->att, p->qkv, NULL, NULL);
}

static void att_perf_backward(void *arg) {
    att_perf *p = arg;
    p->ctx.be->ops->attention_backward(&p->ctx, &p->s, p->dqkv, NULL, NULL, p->scratch, p->dout,
                                       p->qkv, NULL, NULL, p->att);
}

static void perf(zt_backend *be) {
    if (!zt_test_has(be, "attention_forward") || !zt_test_has(be, "attention_backward"))
        return;
    const int B = 4, T = 256, NH = 12, hd = 64;
    size_t C = (size_t)NH * hd, rows = (size_t)B * T, np = (size_t)B * NH * T * T;
    zt_test_rng r = zt_test_rng_for("attention/perf", 0);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    att_perf p = {.ctx = d.ctx, .s = {B, T, NH, NH, hd, true, 0}};
    p.out = zt_test_dev_alloc(&d, rows * C * sizeof(float));
    p.qkv = zt_test_dev_random(&d, &r, rows * 3 * C, 1.0);
    p.dqkv = zt_test_dev_alloc(&d, rows * 3 * C * sizeof(float));
    p.dout = zt_test_dev_random(&d, &r, rows * C, 1.0);
    p.att = zt_test_dev_alloc(&d, np * sizeof(float));
    p.scratch = zt_test_dev_alloc(&d, np * sizeof(float));
    char shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d hd=%d", B, T, NH, hd);
    /* FLOP of the causal half: q·kᵀ and p·v take B·NH·hd·T²/2 multiply-adds each; the backward
     * has four such products. */
    double flop = 2.0 * B * NH * (double)T * T * hd;
    double ms = zt_test_time_ms(be, att_perf_forward, &p, 9);
    zt_test_perf_row("attention_forward", be, shape, ms, 0, flop / 1e9);
    ms = zt_test_time_ms(be, att_perf_backward, &p, 9);
    zt_test_perf_row("attention_backward", be, shape, ms, 0, 2.0 * flop / 1e9);
    zt_test_dev_finish(&d);
}

const zt_test_family zt_test_attention = {"attention", entries, check, perf};
