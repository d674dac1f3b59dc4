/* silu_mul_forward and silu_mul_backward (the gate of Llama's SwiGLU MLP): every backend against
 * the CPU, outputs over their inputs too, the CPU against the double-precision formula and its
 * finite differences, gates far enough out that the exponential would overflow, and outputs held
 * at 16 bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

typedef struct {
    size_t n;
    float *gate, *up, *dout; /* at the case's precision */
} silu_case;

typedef struct {
    float *out, *dgate, *dup;
    float *out_inplace;            /* the forward with out == gate */
    float *dgate_inplace, *dup_inplace; /* the backward with dgate == dout and dup == up */
} silu_result;

/* Gates over ±8 where the sigmoid bends and saturates, and every 11th out to ±100 (exp(100)
 * overflows fp32). */
static silu_case silu_make(zt_test_rng *r, size_t n, zt_dtype act) {
    silu_case c = {n, zt_test_random(r, n, 0.0, 3.0), zt_test_random(r, n, 0.0, 1.0),
                   zt_test_random(r, n, 0.0, 1.0)};
    for (size_t i = 5; i < n; i += 11)
        c.gate[i] = (float)(200.0 * zt_test_uniform(r) - 100.0);
    zt_test_round_all(c.gate, n, act);
    zt_test_round_all(c.up, n, act);
    zt_test_round_all(c.dout, n, act);
    return c;
}

static void silu_free(silu_case *c, silu_result *a, silu_result *b) {
    free(c->gate), free(c->up), free(c->dout);
    silu_result *res[] = {a, b};
    for (int i = 0; i < 2; i++)
        if (res[i])
            free(res[i]->out), free(res[i]->dgate), free(res[i]->dup), free(res[i]->out_inplace),
                free(res[i]->dgate_inplace), free(res[i]->dup_inplace);
}

static silu_result silu_run(zt_backend *be, zt_dtype act, const silu_case *c) {
    size_t n = c->n;
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    void *out = zt_test_dev_alloc(&d, n * zt_test_act_size(be, act));
    void *gate = zt_test_dev_act(&d, c->gate, n), *up = zt_test_dev_act(&d, c->up, n);
    void *dout = zt_test_dev_act(&d, c->dout, n);
    float *nans = zt_test_nans(n);
    void *dgate = zt_test_dev_act(&d, nans, n), *dup = zt_test_dev_act(&d, nans, n);
    free(nans);
    void *gate2 = zt_test_dev_act(&d, c->gate, n), *up2 = zt_test_dev_act(&d, c->up, n);
    void *dout2 = zt_test_dev_act(&d, c->dout, n);
    be->ops->silu_mul_forward(&d.ctx, out, gate, up, n);
    be->ops->silu_mul_backward(&d.ctx, dgate, dup, dout, gate, up, n);
    be->ops->silu_mul_backward(&d.ctx, dout2, up2, dout2, gate2, up2, n);
    be->ops->silu_mul_forward(&d.ctx, gate2, gate2, up, n);
    silu_result x = {zt_test_zeros(n), zt_test_zeros(n), zt_test_zeros(n),
                     zt_test_zeros(n), zt_test_zeros(n), zt_test_zeros(n)};
    zt_test_dev_get_act(&d, x.out, out, n);
    zt_test_dev_get_act(&d, x.dgate, dgate, n);
    zt_test_dev_get_act(&d, x.dup, dup, n);
    zt_test_dev_get_act(&d, x.out_inplace, gate2, n);
    zt_test_dev_get_act(&d, x.dgate_inplace, dout2, n);
    zt_test_dev_get_act(&d, x.dup_inplace, up2, n);
    zt_test_dev_finish(&d);
    return x;
}

static void silu_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    static const size_t sizes[] = {1, 7, 333, 4096, 4099};
    for (int k = 0; k < 5; k++) {
        silu_case c = silu_make(r, sizes[k], act);
        silu_result want = silu_run(cpu, act, &c), got = silu_run(be, act, &c);
        char at[96];
        snprintf(at, sizeof at, "silu_mul %s vs cpu at %s, n=%zu", be->name, zt_dtype_name(act),
                 c.n);
        double tol = zt_test_tol(act);
        CHECK_CLOSE(got.out, want.out, c.n, tol, "%s: out", at);
        CHECK_CLOSE(got.dgate, want.dgate, c.n, tol, "%s: dgate", at);
        CHECK_CLOSE(got.dup, want.dup, c.n, tol, "%s: dup", at);
        CHECK_CLOSE(got.out_inplace, want.out, c.n, tol, "%s: out over gate", at);
        CHECK_CLOSE(got.dgate_inplace, want.dgate, c.n, tol, "%s: dgate over dout", at);
        CHECK_CLOSE(got.dup_inplace, want.dup, c.n, tol, "%s: dup over up", at);
        silu_free(&c, &want, &got);
    }
}

/* ---- the double-precision formula ------------------------------------------------------------ */

typedef struct {
    size_t n;
    double *gate, *up, *r; /* r is the dout the backward was fed */
} silu_ref;

static double silu_ref_value(double g, double u) { return g / (1.0 + exp(-g)) * u; }

static double silu_ref_loss(void *state) {
    silu_ref *s = state;
    double l = 0.0;
    for (size_t i = 0; i < s->n; i++)
        l += silu_ref_value(s->gate[i], s->up[i]) * s->r[i];
    return l;
}

static void silu_grad(zt_backend *cpu, zt_test_rng *r) {
    static const size_t sizes[] = {1, 61, 517};
    for (int k = 0; k < 3; k++) {
        silu_case c = silu_make(r, sizes[k], ZT_F32);
        silu_result got = silu_run(cpu, ZT_F32, &c);
        silu_ref s = {c.n, zt_test_widen(c.gate, c.n), zt_test_widen(c.up, c.n),
                      zt_test_widen(c.dout, c.n)};
        double *out = calloc(c.n, sizeof *out);
        for (size_t i = 0; i < c.n; i++)
            out[i] = silu_ref_value(s.gate[i], s.up[i]);
        char at[64];
        snprintf(at, sizeof at, "silu_mul cpu n=%zu", c.n);
        CHECK_CLOSE(got.out, out, c.n, ZT_TEST_TOL_FWD, "%s: out against the formula", at);
        CHECK_FD(s.gate, c.n, got.dgate, NULL, silu_ref_loss, &s, 200, r,
                 "%s: dgate (overwriting NaN)", at);
        CHECK_FD(s.up, c.n, got.dup, NULL, silu_ref_loss, &s, 200, r, "%s: dup (overwriting NaN)",
                 at);
        CHECK_SAME(got.out_inplace, got.out, c.n, "%s: out over gate", at);
        CHECK_SAME(got.dgate_inplace, got.dgate, c.n, "%s: dgate over dout", at);
        CHECK_SAME(got.dup_inplace, got.dup, c.n, "%s: dup over up", at);
        free(out), free(s.gate), free(s.up), free(s.r);
        silu_free(&c, &got, NULL);
    }
}

static void silu_held(zt_backend *cpu, zt_test_rng *r) {
    for (zt_dtype t = ZT_BF16; t <= ZT_F16; t++) {
        silu_case c = silu_make(r, 1001, t);
        silu_result f32 = silu_run(cpu, ZT_F32, &c), held = silu_run(cpu, t, &c);
        const char *tn = zt_dtype_name(t);
        CHECK_HELD(cpu, t, held.out, f32.out, c.n, "silu_mul at %s: out", tn);
        CHECK_HELD(cpu, t, held.dgate, f32.dgate, c.n, "silu_mul at %s: dgate", tn);
        CHECK_HELD(cpu, t, held.dup, f32.dup, c.n, "silu_mul at %s: dup", tn);
        CHECK_HELD(cpu, t, held.out_inplace, f32.out, c.n, "silu_mul at %s: out over gate", tn);
        silu_free(&c, &f32, &held);
    }
}

static const char *const entries[] = {"silu_mul_forward", "silu_mul_backward", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "silu_mul", entries, true, silu_compare))
        return;
    zt_test_rng r = zt_test_rng_for("silu_mul/cpu", 0);
    silu_grad(env->be[0], &r);
    silu_held(env->be[0], &r);
}

/* ---- --perf: a Llama-style MLP's gate over B=4, T=256 at width 2048 --------------------------- */

typedef struct {
    zt_ctx ctx;
    void *out, *gate, *up, *dout, *dgate, *dup;
    size_t n;
} silu_perf;

static void silu_perf_forward(void *arg) {
    silu_perf *p = arg;
    p->ctx.be->ops->silu_mul_forward(&p->ctx, p->out, p->gate, p->up, p->n);
}

static void silu_perf_backward(void *arg) {
    silu_perf *p = arg;
    p->ctx.be->ops->silu_mul_backward(&p->ctx, p->dgate, p->dup, p->dout, p->gate, p->up, p->n);
}

static void perf(zt_backend *be) {
    if (!zt_test_has(be, "silu_mul_forward") || !zt_test_has(be, "silu_mul_backward"))
        return;
    const size_t n = (size_t)4 * 256 * 2048;
    zt_test_rng r = zt_test_rng_for("silu_mul/perf", 0);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    silu_perf p = {d.ctx, .n = n};
    p.out = zt_test_dev_alloc(&d, n * sizeof(float));
    p.dgate = zt_test_dev_alloc(&d, n * sizeof(float));
    p.dup = zt_test_dev_alloc(&d, n * sizeof(float));
    p.gate = zt_test_dev_random(&d, &r, n, 2.0);
    p.up = zt_test_dev_random(&d, &r, n, 1.0);
    p.dout = zt_test_dev_random(&d, &r, n, 1.0);
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    double ms = zt_test_time_ms(be, silu_perf_forward, &p, 20);
    zt_test_perf_row("silu_mul_forward", be, shape, ms, 3.0 * n * 4 / 1e9, 0);
    ms = zt_test_time_ms(be, silu_perf_backward, &p, 20);
    zt_test_perf_row("silu_mul_backward", be, shape, ms, 5.0 * n * 4 / 1e9, 0);
    zt_test_dev_finish(&d);
}

const zt_test_family zt_test_silu_mul = {"silu_mul", entries, check, perf};
