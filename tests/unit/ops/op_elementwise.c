/* gelu_forward, gelu_backward and add: every backend against the CPU (in place too), the CPU
 * against double-precision formulas and GELU's backward against finite differences, and outputs
 * held at 16 bits. add has no backward entry: its gradient passes to both inputs unchanged, which
 * is the model's business. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

/* ---- GELU ------------------------------------------------------------------------------------ */

typedef struct {
    size_t n;
    float *inp, *dout; /* at the case's precision */
} gelu_case;

typedef struct {
    float *out, *dinp, *dinp_inplace; /* dinp_inplace: the backward with dinp == dout */
} gelu_result;

/* Inputs out to ±8, where tanh saturates, and around 0, where GELU bends. */
static gelu_case gelu_make(zt_test_rng *r, size_t n, zt_dtype act) {
    gelu_case c = {n, zt_test_random(r, n, 0.0, 2.5), zt_test_random(r, n, 0.0, 1.0)};
    for (size_t i = 0; i < n; i += 7)
        c.inp[i] = (float)(16.0 * zt_test_uniform(r) - 8.0);
    zt_test_round_all(c.inp, n, act);
    zt_test_round_all(c.dout, n, act);
    return c;
}

static void gelu_free(gelu_case *c, gelu_result *a, gelu_result *b) {
    free(c->inp), free(c->dout);
    gelu_result *res[] = {a, b};
    for (int i = 0; i < 2; i++)
        if (res[i])
            free(res[i]->out), free(res[i]->dinp), free(res[i]->dinp_inplace);
}

static gelu_result gelu_run(zt_backend *be, zt_dtype act, const gelu_case *c) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    void *out = zt_test_dev_alloc(&d, c->n * zt_test_act_size(be, act));
    void *inp = zt_test_dev_act(&d, c->inp, c->n), *dout = zt_test_dev_act(&d, c->dout, c->n);
    void *both = zt_test_dev_act(&d, c->dout, c->n);
    float *nans = zt_test_nans(c->n);
    void *dinp = zt_test_dev_act(&d, nans, c->n);
    free(nans);
    be->ops->gelu_forward(&d.ctx, out, inp, c->n);
    be->ops->gelu_backward(&d.ctx, dinp, inp, dout, c->n);
    be->ops->gelu_backward(&d.ctx, both, inp, both, c->n);
    gelu_result x = {zt_test_zeros(c->n), zt_test_zeros(c->n), zt_test_zeros(c->n)};
    zt_test_dev_get_act(&d, x.out, out, c->n);
    zt_test_dev_get_act(&d, x.dinp, dinp, c->n);
    zt_test_dev_get_act(&d, x.dinp_inplace, both, c->n);
    zt_test_dev_finish(&d);
    return x;
}

static void gelu_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    static const size_t sizes[] = {1, 7, 333, 4096, 4099};
    for (int k = 0; k < 5; k++) {
        gelu_case c = gelu_make(r, sizes[k], act);
        gelu_result want = gelu_run(cpu, act, &c), got = gelu_run(be, act, &c);
        char at[96];
        snprintf(at, sizeof at, "gelu %s vs cpu at %s, n=%zu", be->name, zt_dtype_name(act),
                 c.n);
        double tol = zt_test_tol(act);
        CHECK_CLOSE(got.out, want.out, c.n, tol, "%s: out", at);
        CHECK_CLOSE(got.dinp, want.dinp, c.n, tol, "%s: dinp", at);
        CHECK_CLOSE(got.dinp_inplace, want.dinp, c.n, tol, "%s: dinp in place over dout", at);
        gelu_free(&c, &want, &got);
    }
}

typedef struct {
    size_t n;
    double *inp, *r;
} gelu_ref;

static double gelu_ref_value(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double gelu_ref_loss(void *state) {
    gelu_ref *s = state;
    double l = 0.0;
    for (size_t i = 0; i < s->n; i++)
        l += gelu_ref_value(s->inp[i]) * s->r[i];
    return l;
}

static void gelu_grad(zt_backend *cpu, zt_test_rng *r) {
    static const size_t sizes[] = {1, 61, 517};
    for (int k = 0; k < 3; k++) {
        gelu_case c = gelu_make(r, sizes[k], ZT_F32);
        gelu_result got = gelu_run(cpu, ZT_F32, &c);
        gelu_ref s = {c.n, zt_test_widen(c.inp, c.n), zt_test_widen(c.dout, c.n)};
        double *out = calloc(c.n, sizeof *out);
        for (size_t i = 0; i < c.n; i++)
            out[i] = gelu_ref_value(s.inp[i]);
        CHECK_CLOSE(got.out, out, c.n, ZT_TEST_TOL_FWD, "gelu cpu n=%zu: out against the formula",
                    c.n);
        CHECK_FD(s.inp, c.n, got.dinp, NULL, gelu_ref_loss, &s, 200, r,
                 "gelu cpu n=%zu: dinp (overwriting NaN)", c.n);
        CHECK_SAME(got.dinp_inplace, got.dinp, c.n, "gelu cpu n=%zu: dinp in place over dout",
                   c.n);
        free(out), free(s.inp), free(s.r);
        gelu_free(&c, &got, NULL);
    }
}

static void gelu_held(zt_backend *cpu, zt_test_rng *r) {
    for (zt_dtype t = ZT_BF16; t <= ZT_F16; t++) {
        gelu_case c = gelu_make(r, 1001, t);
        gelu_result f32 = gelu_run(cpu, ZT_F32, &c), held = gelu_run(cpu, t, &c);
        const char *tn = zt_dtype_name(t);
        CHECK_HELD(cpu, t, held.out, f32.out, c.n, "gelu at %s: out", tn);
        CHECK_HELD(cpu, t, held.dinp, f32.dinp, c.n, "gelu at %s: dinp", tn);
        CHECK_HELD(cpu, t, held.dinp_inplace, f32.dinp, c.n, "gelu at %s: dinp in place", tn);
        gelu_free(&c, &f32, &held);
    }
}

static const char *const gelu_entries[] = {"gelu_forward", "gelu_backward", NULL};

static void gelu_check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "gelu", gelu_entries, true, gelu_compare))
        return;
    zt_test_rng r = zt_test_rng_for("gelu/cpu", 0);
    gelu_grad(env->be[0], &r);
    gelu_held(env->be[0], &r);
}

/* ---- add ------------------------------------------------------------------------------------- */

typedef struct {
    float *out, *inplace; /* inplace: out == a */
    float *shifted;       /* out one element past an aligned start (a vector kernel's slow path) */
} add_result;

static add_result add_run(zt_backend *be, zt_dtype act, const float *a, const float *b, size_t n) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    void *out = zt_test_dev_alloc(&d, n * zt_test_act_size(be, act));
    void *da = zt_test_dev_act(&d, a, n), *db = zt_test_dev_act(&d, b, n);
    const size_t es = zt_test_act_size(be, act);
    char *out2 = zt_test_dev_alloc(&d, (n + 1) * es);
    be->ops->add(&d.ctx, out, da, db, n);
    be->ops->add(&d.ctx, out2 + es, da, db, n);
    be->ops->add(&d.ctx, da, da, db, n);
    add_result x = {zt_test_zeros(n), zt_test_zeros(n), zt_test_zeros(n)};
    zt_test_dev_get_act(&d, x.out, out, n);
    zt_test_dev_get_act(&d, x.inplace, da, n);
    zt_test_dev_get_act(&d, x.shifted, out2 + es, n);
    zt_test_dev_finish(&d);
    return x;
}

static void add_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    static const size_t sizes[] = {1, 13, 4096, 4097};
    for (int k = 0; k < 4; k++) {
        size_t n = sizes[k];
        float *a = zt_test_random(r, n, 0.0, 1.0), *b = zt_test_random(r, n, 0.0, 3.0);
        zt_test_round_all(a, n, act), zt_test_round_all(b, n, act);
        add_result want = add_run(cpu, act, a, b, n), got = add_run(be, act, a, b, n);
        double tol = zt_test_tol(act);
        CHECK_CLOSE(got.out, want.out, n, tol, "add %s vs cpu at %s, n=%zu: out", be->name,
                    zt_dtype_name(act), n);
        CHECK_CLOSE(got.inplace, want.out, n, tol, "add %s vs cpu at %s, n=%zu: out in place of a",
                    be->name, zt_dtype_name(act), n);
        CHECK_CLOSE(got.shifted, want.out, n, tol,
                    "add %s vs cpu at %s, n=%zu: out one element past an aligned start", be->name,
                    zt_dtype_name(act), n);
        free(a), free(b), free(want.out), free(want.inplace), free(want.shifted), free(got.out),
            free(got.inplace), free(got.shifted);
    }
}

/* An fp32 sum is the exact sum rounded once. The double sum of two floats rounded to float is
 * that same value (double carries more than twice float's precision, so its rounding cannot
 * disturb the second), so the CPU must match it bit for bit; at 16 bits the fp32 sum is held. */
static void add_cpu(zt_backend *cpu, zt_test_rng *r) {
    static const zt_dtype acts[] = {ZT_F32, ZT_BF16, ZT_F16};
    for (int k = 0; k < 3; k++) {
        zt_dtype t = acts[k];
        size_t n = 1000 + 17 * (size_t)k;
        float *a = zt_test_random(r, n, 0.0, 1.0), *b = zt_test_random(r, n, 0.0, 3.0);
        zt_test_round_all(a, n, t), zt_test_round_all(b, n, t);
        float *sum = zt_test_zeros(n);
        for (size_t i = 0; i < n; i++)
            sum[i] = (float)((double)a[i] + (double)b[i]);
        add_result got = add_run(cpu, t, a, b, n);
        if (t == ZT_F32) {
            CHECK_SAME(got.out, sum, n, "add cpu n=%zu: out against the double sum", n);
        } else {
            CHECK_HELD(cpu, t, got.out, sum, n, "add at %s: out", zt_dtype_name(t));
            CHECK_HELD(cpu, t, got.inplace, sum, n, "add at %s: out in place", zt_dtype_name(t));
        }
        free(a), free(b), free(sum), free(got.out), free(got.inplace), free(got.shifted);
    }
}

static const char *const add_entries[] = {"add", NULL};

static void add_check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "add", add_entries, true, add_compare))
        return;
    zt_test_rng r = zt_test_rng_for("add/cpu", 0);
    add_cpu(env->be[0], &r);
}

/* ---- --perf: over GPT-2 small's MLP activations (B=4, T=256, 4·768) and residual stream ------ */

typedef struct {
    zt_ctx ctx;
    void *out, *inp, *dinp, *dout;
    size_t n;
} ew_perf;

static void gelu_perf_forward(void *arg) {
    ew_perf *p = arg;
    p->ctx.be->ops->gelu_forward(&p->ctx, p->out, p->inp, p->n);
}

static void gelu_perf_backward(void *arg) {
    ew_perf *p = arg;
    p->ctx.be->ops->gelu_backward(&p->ctx, p->dinp, p->inp, p->dout, p->n);
}

static void add_perf_run(void *arg) {
    ew_perf *p = arg;
    p->ctx.be->ops->add(&p->ctx, p->out, p->inp, p->dout, p->n);
}

/* Bytes: 4 per element of each tensor read or written. */
static void ew_perf_time(zt_backend *be, const char *op, size_t n, void (*fn)(void *),
                         int tensors) {
    zt_test_rng r = zt_test_rng_for(op, 0);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    ew_perf p = {d.ctx, .n = n};
    p.out = zt_test_dev_alloc(&d, n * sizeof(float));
    p.dinp = zt_test_dev_alloc(&d, n * sizeof(float));
    p.inp = zt_test_dev_random(&d, &r, n, 1.0);
    p.dout = zt_test_dev_random(&d, &r, n, 1.0);
    char shape[32];
    snprintf(shape, sizeof shape, "n=%zu", n);
    double ms = zt_test_time_ms(be, fn, &p, 21);
    zt_test_perf_row(op, be, shape, ms, (double)tensors * n * 4 / 1e9, 0);
    zt_test_dev_finish(&d);
}

static void gelu_perf(zt_backend *be) {
    if (!zt_test_has(be, "gelu_forward") || !zt_test_has(be, "gelu_backward"))
        return;
    ew_perf_time(be, "gelu_forward", (size_t)4 * 256 * 3072, gelu_perf_forward, 2);
    ew_perf_time(be, "gelu_backward", (size_t)4 * 256 * 3072, gelu_perf_backward, 3);
}

static void add_perf(zt_backend *be) {
    if (zt_test_has(be, "add"))
        ew_perf_time(be, "add", (size_t)4 * 256 * 768, add_perf_run, 3);
}

const zt_test_family zt_test_gelu = {"gelu", gelu_entries, gelu_check, gelu_perf};
const zt_test_family zt_test_add = {"add", add_entries, add_check, add_perf};
