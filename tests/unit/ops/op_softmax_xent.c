/* softmax_xent: every backend against the CPU, the CPU's losses against a double-precision
 * log-softmax and its fused gradient against finite differences of grad_scale · Σ losses, ignored
 * targets, grad_scale 0 leaving the logits alone, and the gradient held at 16 bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

typedef struct {
    int N, V;
    float *logits;    /* [N,V] at the case's precision */
    int32_t *targets; /* [N] in host memory; some are -1 (ignored) */
    float grad_scale;
} sx_case;

typedef struct {
    float *losses, *grad; /* grad: the logits after the call */
} sx_result;

/* Logits of a few units, one row shifted far up (the softmax must subtract its maximum). */
static sx_case sx_make(zt_test_rng *r, int N, int V, float grad_scale, zt_dtype act) {
    sx_case c = {N, V, zt_test_random(r, (size_t)N * V, 0.0, 3.0), NULL, grad_scale};
    for (int v = 0; v < V; v++)
        c.logits[v] += 60.0f;
    zt_test_round_all(c.logits, (size_t)N * V, act);
    c.targets = calloc(N, sizeof *c.targets);
    for (int i = 0; i < N; i++)
        c.targets[i] = i % 4 == 3 ? -1 : zt_test_int(r, 0, V - 1);
    return c;
}

static void sx_free(sx_case *c, sx_result *a, sx_result *b) {
    free(c->logits), free(c->targets);
    sx_result *res[] = {a, b};
    for (int i = 0; i < 2; i++)
        if (res[i])
            free(res[i]->losses), free(res[i]->grad);
}

static sx_result sx_run(zt_backend *be, zt_dtype act, const sx_case *c) {
    size_t n = (size_t)c->N * c->V;
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    float *nans = zt_test_nans(c->N);
    float *losses = zt_test_dev_f32(&d, nans, c->N);
    free(nans);
    void *logits = zt_test_dev_act(&d, c->logits, n);
    be->ops->softmax_xent(&d.ctx, losses, logits, c->targets, c->N, c->V, c->grad_scale);
    sx_result x = {zt_test_zeros(c->N), zt_test_zeros(n)};
    zt_test_dev_get_f32(&d, x.losses, losses, c->N);
    zt_test_dev_get_act(&d, x.grad, logits, n);
    zt_test_dev_finish(&d);
    return x;
}

static void sx_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    for (int k = 0; k < 4; k++) {
        int N = zt_test_int(r, 1, 9), V = k == 3 ? 1031 : zt_test_int(r, 1, 77);
        float gs = k == 1 ? 0.0f : (float)(0.1 + zt_test_uniform(r));
        sx_case c = sx_make(r, N, V, gs, act);
        sx_result want = sx_run(cpu, act, &c), got = sx_run(be, act, &c);
        char at[96];
        snprintf(at, sizeof at, "softmax_xent %s vs cpu at %s, N=%d V=%d grad_scale=%g", be->name,
                 zt_dtype_name(act), N, V, gs);
        double tol = zt_test_tol(act);
        CHECK_CLOSE(got.losses, want.losses, N, tol, "%s: losses", at);
        CHECK_CLOSE(got.grad, want.grad, (size_t)N * V, tol, "%s: logits after", at);
        sx_free(&c, &want, &got);
    }
}

/* ---- the double-precision reference ---------------------------------------------------------- */

typedef struct {
    const sx_case *c;
    double *logits;
} sx_ref;

static double sx_ref_row(const double *x, int V, int32_t y) {
    double mx = x[0], sum = 0.0;
    for (int v = 1; v < V; v++)
        mx = fmax(mx, x[v]);
    for (int v = 0; v < V; v++)
        sum += exp(x[v] - mx);
    return mx + log(sum) - x[y];
}

/* grad_scale · Σ losses, the scalar whose gradient the op writes over the logits. */
static double sx_ref_loss(void *state) {
    sx_ref *s = state;
    double l = 0.0;
    for (int i = 0; i < s->c->N; i++)
        if (s->c->targets[i] >= 0)
            l += sx_ref_row(s->logits + (size_t)i * s->c->V, s->c->V, s->c->targets[i]);
    return s->c->grad_scale * l;
}

static void sx_grad(zt_backend *cpu, zt_test_rng *r) {
    static const int shapes[][2] = {{5, 11}, {1, 1}, {8, 67}, {3, 2}};
    for (int k = 0; k < 4; k++) {
        int N = shapes[k][0], V = shapes[k][1];
        sx_case c = sx_make(r, N, V, 0.37f, ZT_F32);
        sx_result got = sx_run(cpu, ZT_F32, &c);
        sx_ref s = {&c, zt_test_widen(c.logits, (size_t)N * V)};
        double *losses = calloc(N, sizeof *losses);
        for (int i = 0; i < N; i++)
            losses[i] =
                c.targets[i] < 0 ? 0.0 : sx_ref_row(s.logits + (size_t)i * V, V, c.targets[i]);
        char at[64];
        snprintf(at, sizeof at, "softmax_xent cpu N=%d V=%d", N, V);
        CHECK_CLOSE(got.losses, losses, N, ZT_TEST_TOL_FWD, "%s: losses against the reference",
                    at);
        CHECK_FD(s.logits, (size_t)N * V, got.grad, NULL, sx_ref_loss, &s, 250, r,
                 "%s: gradient over the logits", at);
        free(losses), free(s.logits);
        sx_free(&c, &got, NULL);
    }
    /* Without a gradient the logits stay as they are. */
    sx_case c = sx_make(r, 4, 21, 0.0f, ZT_F32);
    sx_result got = sx_run(cpu, ZT_F32, &c);
    CHECK_SAME(got.grad, c.logits, (size_t)4 * 21, "softmax_xent cpu grad_scale=0: logits");
    sx_free(&c, &got, NULL);
}

static void sx_held(zt_backend *cpu, zt_test_rng *r) {
    for (zt_dtype t = ZT_BF16; t <= ZT_F16; t++) {
        sx_case c = sx_make(r, 6, 50, 0.5f, t);
        sx_result f32 = sx_run(cpu, ZT_F32, &c), held = sx_run(cpu, t, &c);
        const char *tn = zt_dtype_name(t);
        CHECK_HELD(cpu, t, held.grad, f32.grad, (size_t)6 * 50, "softmax_xent at %s: gradient",
                   tn);
        CHECK_SAME(held.losses, f32.losses, 6, "softmax_xent at %s: losses", tn);
        sx_free(&c, &f32, &held);
    }
}

static const char *const entries[] = {"softmax_xent", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "softmax_xent", entries, true, sx_compare))
        return;
    zt_test_rng r = zt_test_rng_for("softmax_xent/cpu", 0);
    sx_grad(env->be[0], &r);
    sx_held(env->be[0], &r);
}

/* ---- --perf: GPT-2 small's loss over B=4, T=256 and its 50257 tokens ------------------------- */

typedef struct {
    zt_ctx ctx;
    float *losses;
    void *logits;
    int32_t *targets;
    int N, V;
} sx_perf;

static void sx_perf_run(void *arg) {
    sx_perf *p = arg;
    p->ctx.be->ops->softmax_xent(&p->ctx, p->losses, p->logits, p->targets, p->N, p->V, 1e-3f);
}

static void perf(zt_backend *be) {
    if (!zt_test_has(be, "softmax_xent"))
        return;
    const int N = 4 * 256, V = 50257;
    zt_test_rng r = zt_test_rng_for("softmax_xent/perf", 0);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    sx_perf p = {d.ctx, .N = N, .V = V};
    p.losses = zt_test_dev_alloc(&d, N * sizeof(float));
    p.logits = zt_test_dev_random(&d, &r, (size_t)N * V, 3.0);
    p.targets = calloc(N, sizeof *p.targets);
    for (int i = 0; i < N; i++)
        p.targets[i] = zt_test_int(&r, 0, V - 1);
    char shape[32];
    snprintf(shape, sizeof shape, "N=%d V=%d", N, V);
    /* Each run reads the logits and writes the gradient over them: 8 bytes an element. Later
     * runs start from the previous gradient, which costs the same. */
    double ms = zt_test_time_ms(be, sx_perf_run, &p, 5);
    zt_test_perf_row("softmax_xent", be, shape, ms, 8.0 * N * V / 1e9, 0);
    zt_test_dev_finish(&d);
    free(p.targets);
}

const zt_test_family zt_test_softmax_xent = {"softmax_xent", entries, check, perf};
