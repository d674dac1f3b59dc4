/* adam_update and adam_update_mixed: every backend against the CPU, and the CPU against Adam and
 * AdamW written out in double over several steps; the mixed step also against what ops.h says it
 * is bit for bit (from_half, scale, adam_update, to_half in turn) and its 16-bit parameters
 * against the independent rounding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* An fp32 update against the same formula in double: each result is a few fp32 operations
 * (at most six roundings of 2^-24), well inside 1e-6. The parameter's step, p' - p, is checked on
 * its own at 1e-4: p' alone would hide an error in a step 100x smaller than p (the step's own
 * error is p's rounding, 2^-24·|p|, a few 1e-6 of a step of lr = 1e-2). */
#define TOL_UPDATE 1e-6
#define TOL_STEP 1e-4

typedef struct {
    size_t n;
    float *p, *g, *m, *v;
} adam_state;

/* Parameters of order 1, second moments small enough (sqrt(v) ~ 1e-2) that an eps of 1e-3
 * visibly matters. */
static adam_state adam_make(zt_test_rng *r, size_t n) {
    adam_state s = {n, zt_test_random(r, n, 0.0, 1.0), zt_test_random(r, n, 0.0, 1.0),
                    zt_test_random(r, n, 0.0, 1e-2), zt_test_random(r, n, 0.0, 1e-2)};
    for (size_t i = 0; i < n; i++)
        s.v[i] = s.v[i] * s.v[i];
    return s;
}

static void adam_state_free(adam_state *s) { free(s->p), free(s->g), free(s->m), free(s->v); }

static adam_state adam_copy(const adam_state *s) {
    return (adam_state){s->n, zt_test_dup(s->p, s->n), zt_test_dup(s->g, s->n),
                        zt_test_dup(s->m, s->n), zt_test_dup(s->v, s->n)};
}

/* Four settings: AdamW with decay, Adam with L2 decay, no decay nor bias correction, and Adam
 * with L2 decay maximizing (torch's maximize). */
enum { ADAM_VARIANTS = 4 };
static zt_adam_args adam_args(int variant, int step) {
    zt_adam_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-3f,
                      .bias_correction1 = 1.0f, .bias_correction2 = 1.0f};
    if (variant != 2) {
        a.bias_correction1 = (float)(1.0 - pow(0.9, step));
        a.bias_correction2 = (float)(1.0 - pow(0.999, step));
    }
    a.weight_decay = variant == 0 ? 0.1f : variant == 1 || variant == 3 ? 0.05f : 0.0f;
    a.adamw_mode = variant != 1 && variant != 3;
    a.maximize = variant == 3;
    return a;
}

/* One step on be, in place over s. */
static void adam_run(zt_backend *be, adam_state *s, const zt_adam_args *a) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    float *p = zt_test_dev_f32(&d, s->p, s->n), *g = zt_test_dev_f32(&d, s->g, s->n);
    float *m = zt_test_dev_f32(&d, s->m, s->n), *v = zt_test_dev_f32(&d, s->v, s->n);
    be->ops->adam_update(&d.ctx, p, g, m, v, s->n, a);
    zt_test_dev_get_f32(&d, s->p, p, s->n);
    zt_test_dev_get_f32(&d, s->m, m, s->n);
    zt_test_dev_get_f32(&d, s->v, v, s->n);
    zt_test_dev_finish(&d);
}

/* Sizes below one thread chunk and past two (16384 elements each), with a tail. */
static const size_t sizes[] = {13, 2 * 16384 + 37};

static void adam_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act;
    for (int k = 0; k < 2; k++)
        for (int variant = 0; variant < ADAM_VARIANTS; variant++) {
            adam_state want = adam_make(r, sizes[k]), got = adam_copy(&want);
            for (int step = 1; step <= 3; step++) {
                zt_adam_args a = adam_args(variant, step);
                adam_run(cpu, &want, &a);
                adam_run(be, &got, &a);
                char at[96];
                snprintf(at, sizeof at, "adam_update %s vs cpu, n=%zu variant %d step %d",
                         be->name, want.n, variant, step);
                CHECK_CLOSE(got.p, want.p, want.n, ZT_TEST_TOL_F32, "%s: p", at);
                CHECK_CLOSE(got.m, want.m, want.n, ZT_TEST_TOL_F32, "%s: m", at);
                CHECK_CLOSE(got.v, want.v, want.n, ZT_TEST_TOL_F32, "%s: v", at);
                for (size_t i = 0; i < want.n; i++)
                    got.g[i] = want.g[i] = (float)zt_test_normal(r);
            }
            adam_state_free(&want), adam_state_free(&got);
        }
}

/* ---- the double-precision reference ---------------------------------------------------------- */

/* One Adam step from s (left as it is) into p, m, v, as torch.optim.Adam / AdamW state it. */
static void adam_ref(const adam_state *s, const zt_adam_args *a, double *p, double *m, double *v) {
    double b1 = a->beta1, b2 = a->beta2, lr = a->lr, wd = a->weight_decay;
    for (size_t i = 0; i < s->n; i++) {
        double g = a->maximize ? -(double)s->g[i] : s->g[i], p0 = s->p[i];
        if (!a->adamw_mode)
            g += wd * p0;
        m[i] = b1 * s->m[i] + (1.0 - b1) * g;
        v[i] = b2 * s->v[i] + (1.0 - b2) * g * g;
        double denom = sqrt(v[i]) / sqrt((double)a->bias_correction2) + a->eps;
        double decayed = a->adamw_mode ? p0 * (1.0 - lr * wd) : p0;
        p[i] = decayed - lr / a->bias_correction1 * m[i] / denom;
    }
}

/* Checks s after a step against the reference step from before (p0 is the parameters before). */
static void adam_check_step(const adam_state *s, const float *p0, const double *p,
                            const double *m, const double *v, const char *at) {
    float *got_step = zt_test_zeros(s->n);
    double *want_step = calloc(s->n, sizeof *want_step);
    for (size_t i = 0; i < s->n; i++) {
        got_step[i] = (float)((double)s->p[i] - p0[i]);
        want_step[i] = p[i] - p0[i];
    }
    CHECK_CLOSE(s->p, p, s->n, TOL_UPDATE, "%s: p against the reference", at);
    CHECK_CLOSE(got_step, want_step, s->n, TOL_STEP, "%s: p' - p against the reference", at);
    CHECK_CLOSE(s->m, m, s->n, TOL_UPDATE, "%s: m against the reference", at);
    CHECK_CLOSE(s->v, v, s->n, TOL_UPDATE, "%s: v against the reference", at);
    free(got_step), free(want_step);
}

static void adam_cpu(zt_backend *cpu, zt_test_rng *r) {
    for (int k = 0; k < 2; k++)
        for (int variant = 0; variant < ADAM_VARIANTS; variant++) {
            adam_state s = adam_make(r, sizes[k]);
            double *p = calloc(s.n, sizeof *p), *m = calloc(s.n, sizeof *m),
                   *v = calloc(s.n, sizeof *v);
            for (int step = 1; step <= 3; step++) {
                zt_adam_args a = adam_args(variant, step);
                adam_ref(&s, &a, p, m, v);
                float *p0 = zt_test_dup(s.p, s.n);
                adam_run(cpu, &s, &a);
                char at[80];
                snprintf(at, sizeof at, "adam_update cpu n=%zu variant %d step %d", s.n, variant,
                         step);
                adam_check_step(&s, p0, p, m, v, at);
                free(p0);
                for (size_t i = 0; i < s.n; i++)
                    s.g[i] = (float)zt_test_normal(r);
            }
            free(p), free(m), free(v);
            adam_state_free(&s);
        }
}

static const char *const adam_entries[] = {"adam_update", NULL};

static void adam_check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "adam_update", adam_entries, false, adam_compare))
        return;
    zt_test_rng r = zt_test_rng_for("adam_update/cpu", 0);
    adam_cpu(env->be[0], &r);
}

/* ---- adam_update_mixed ----------------------------------------------------------------------- */

typedef struct {
    adam_state s;       /* s.g unused: the gradient is grad below */
    zt_dtype gt, pt;    /* gradient type; parameter type, ZT_F32 for no param16 */
    void *grad;         /* n floats or n 16-bit values */
    float mul;
    uint16_t *param16;  /* after the step; NULL when pt is ZT_F32 */
} mixed_case;

static mixed_case mixed_make(zt_test_rng *r, size_t n, zt_dtype gt, zt_dtype pt, float mul) {
    mixed_case c = {adam_make(r, n), gt, pt, NULL, mul, NULL};
    if (gt == ZT_F32) {
        c.grad = zt_test_dup(c.s.g, n);
    } else {
        uint16_t *h = calloc(n, sizeof *h);
        for (size_t i = 0; i < n; i++)
            h[i] = zt_test_encode(zt_test_round(c.s.g[i], gt), gt);
        c.grad = h;
    }
    if (pt != ZT_F32)
        c.param16 = calloc(n, sizeof *c.param16);
    return c;
}

static mixed_case mixed_copy(const mixed_case *c) {
    size_t gb = c->s.n * zt_dtype_size(c->gt);
    mixed_case x = *c;
    x.s = adam_copy(&c->s);
    x.grad = malloc(gb);
    memcpy(x.grad, c->grad, gb);
    x.param16 = c->param16 ? calloc(c->s.n, sizeof *x.param16) : NULL;
    return x;
}

static void mixed_free(mixed_case *c) {
    adam_state_free(&c->s);
    free(c->grad), free(c->param16);
}

static void mixed_run(zt_backend *be, mixed_case *c, const zt_adam_args *a) {
    size_t n = c->s.n;
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    float *p = zt_test_dev_f32(&d, c->s.p, n);
    float *m = zt_test_dev_f32(&d, c->s.m, n), *v = zt_test_dev_f32(&d, c->s.v, n);
    void *grad = zt_test_dev_bytes(&d, c->grad, n * zt_dtype_size(c->gt));
    uint16_t *p16 = zt_test_dev_bytes(&d, c->param16, n * sizeof(uint16_t));
    be->ops->adam_update_mixed(&d.ctx, p, grad, c->gt, c->mul, m, v, p16, c->pt, n, a);
    zt_test_dev_get_f32(&d, c->s.p, p, n);
    zt_test_dev_get_f32(&d, c->s.m, m, n);
    zt_test_dev_get_f32(&d, c->s.v, v, n);
    if (p16)
        zt_test_dev_get_bytes(&d, c->param16, p16, n * sizeof(uint16_t));
    zt_test_dev_finish(&d);
}

/* The gradient as the step reads it: widened exactly, then multiplied in fp32. */
static float mixed_grad(const mixed_case *c, size_t i) {
    float g = c->gt == ZT_F32 ? ((const float *)c->grad)[i]
                              : zt_test_decode(((const uint16_t *)c->grad)[i], c->gt);
    return g * c->mul;
}

static const zt_dtype mixed_types[3] = {ZT_F32, ZT_BF16, ZT_F16};

static void mixed_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act;
    for (int k = 0; k < 9; k++) {
        zt_dtype gt = mixed_types[k / 3], pt = mixed_types[k % 3];
        mixed_case want = mixed_make(r, sizes[k % 2], gt, pt, k % 2 ? 0.37f : 1.0f);
        mixed_case got = mixed_copy(&want);
        zt_adam_args a = adam_args(k % ADAM_VARIANTS, 2);
        mixed_run(cpu, &want, &a);
        mixed_run(be, &got, &a);
        char at[112];
        snprintf(at, sizeof at, "adam_update_mixed %s vs cpu, n=%zu grad %s param16 %s",
                 be->name, want.s.n, zt_dtype_name(gt), pt == ZT_F32 ? "none" : zt_dtype_name(pt));
        CHECK_CLOSE(got.s.p, want.s.p, want.s.n, ZT_TEST_TOL_F32, "%s: master", at);
        CHECK_CLOSE(got.s.m, want.s.m, want.s.n, ZT_TEST_TOL_F32, "%s: m", at);
        CHECK_CLOSE(got.s.v, want.s.v, want.s.n, ZT_TEST_TOL_F32, "%s: v", at);
        if (pt != ZT_F32) {
            float *g16 = zt_test_zeros(want.s.n), *w16 = zt_test_zeros(want.s.n);
            for (size_t i = 0; i < want.s.n; i++) {
                g16[i] = zt_test_decode(got.param16[i], pt);
                w16[i] = zt_test_decode(want.param16[i], pt);
            }
            CHECK_CLOSE(g16, w16, want.s.n, zt_test_tol(pt), "%s: param16", at);
            free(g16), free(w16);
        }
        mixed_free(&want), mixed_free(&got);
    }
}

/* The composition ops.h promises, run with the CPU's own entries on host memory (the CPU's
 * device memory). */
static void mixed_by_parts(zt_backend *cpu, mixed_case *c, const zt_adam_args *a) {
    zt_ctx x = {.be = cpu, .act = ZT_F32};
    size_t n = c->s.n;
    if (c->gt == ZT_F32)
        memcpy(c->s.g, c->grad, n * sizeof(float));
    else
        cpu->ops->from_half(&x, c->s.g, c->grad, n, c->gt);
    cpu->ops->scale(&x, c->s.g, n, c->mul);
    cpu->ops->adam_update(&x, c->s.p, c->s.g, c->s.m, c->s.v, n, a);
    if (c->param16)
        cpu->ops->to_half(&x, c->param16, c->s.p, n, c->pt);
}

static void mixed_cpu(zt_backend *cpu, zt_test_rng *r) {
    for (int k = 0; k < 18; k++) {
        zt_dtype gt = mixed_types[k / 6], pt = mixed_types[k / 2 % 3];
        float mul = k % 2 ? 0.37f : 1.0f;
        mixed_case c = mixed_make(r, 16384 + 1001, gt, pt, mul), parts = mixed_copy(&c);
        zt_adam_args a = adam_args(k % ADAM_VARIANTS, 1 + k % 4);
        /* The reference step reads the gradient as the op does. */
        adam_state ref_in = adam_copy(&c.s);
        for (size_t i = 0; i < c.s.n; i++)
            ref_in.g[i] = mixed_grad(&c, i);
        double *p = calloc(c.s.n, sizeof *p), *m = calloc(c.s.n, sizeof *m),
               *v = calloc(c.s.n, sizeof *v);
        adam_ref(&ref_in, &a, p, m, v);
        mixed_run(cpu, &c, &a);
        mixed_by_parts(cpu, &parts, &a);
        char at[112];
        snprintf(at, sizeof at, "adam_update_mixed cpu n=%zu grad %s grad_mul %g param16 %s",
                 c.s.n, zt_dtype_name(gt), mul, pt == ZT_F32 ? "none" : zt_dtype_name(pt));
        adam_check_step(&c.s, ref_in.p, p, m, v, at);
        CHECK_SAME(c.s.p, parts.s.p, c.s.n, "%s: master against the ops run in turn", at);
        CHECK_SAME(c.s.m, parts.s.m, c.s.n, "%s: m against the ops run in turn", at);
        CHECK_SAME(c.s.v, parts.s.v, c.s.n, "%s: v against the ops run in turn", at);
        if (pt != ZT_F32) {
            size_t bad = 0, first = 0;
            for (size_t i = 0; i < c.s.n; i++) {
                uint16_t want = zt_test_encode(zt_test_round(c.s.p[i], pt), pt);
                if (c.param16[i] != want && bad++ == 0)
                    first = i;
            }
            CHECK_AT(bad == 0, "%s: %zu param16 values are not the master rounded (first [%zu])",
                     at, bad, first);
            CHECK_AT(memcmp(c.param16, parts.param16, c.s.n * sizeof(uint16_t)) == 0,
                     "%s: param16 differs from the ops run in turn", at);
        }
        free(p), free(m), free(v);
        adam_state_free(&ref_in);
        mixed_free(&c), mixed_free(&parts);
    }
}

static const char *const mixed_entries[] = {"adam_update_mixed", NULL};

static void mixed_check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "adam_update_mixed", mixed_entries, false, mixed_compare))
        return;
    zt_test_rng r = zt_test_rng_for("adam_update_mixed/cpu", 0);
    mixed_cpu(env->be[0], &r);
}

/* ---- --perf: 16M parameters, about GPT-2 small's slice on one rank of eight ------------------ */

typedef struct {
    zt_ctx ctx;
    float *p, *g, *m, *v;
    uint16_t *g16, *p16;
    size_t n;
    zt_adam_args a;
} adam_perf;

static void adam_perf_run(void *arg) {
    adam_perf *q = arg;
    q->ctx.be->ops->adam_update(&q->ctx, q->p, q->g, q->m, q->v, q->n, &q->a);
}

static void mixed_perf_run(void *arg) {
    adam_perf *q = arg;
    q->ctx.be->ops->adam_update_mixed(&q->ctx, q->p, q->g16, ZT_BF16, 0.5f, q->m, q->v, q->p16,
                                      ZT_BF16, q->n, &q->a);
}

static void adam_perf_time(zt_backend *be, bool mixed) {
    const size_t n = (size_t)1 << 24;
    zt_test_rng r = zt_test_rng_for("adam/perf", 0);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    adam_perf q = {d.ctx, .n = n, .a = adam_args(0, 5)};
    q.p = zt_test_dev_random(&d, &r, n, 1.0);
    q.g = zt_test_dev_random(&d, &r, n, 1.0);
    q.m = zt_test_dev_alloc(&d, n * sizeof(float));
    q.v = zt_test_dev_alloc(&d, n * sizeof(float));
    q.g16 = zt_test_dev_alloc(&d, n * sizeof(uint16_t));
    q.p16 = zt_test_dev_alloc(&d, n * sizeof(uint16_t));
    char shape[48];
    snprintf(shape, sizeof shape, "n=%zu%s", n, mixed ? " bf16 grad+param" : "");
    /* Bytes: fp32 p, m, v read and written and g read (28 a parameter); mixed: 16-bit g read
     * and 16-bit param written instead of the fp32 g (28). */
    double ms = zt_test_time_ms(be, mixed ? mixed_perf_run : adam_perf_run, &q, 9);
    zt_test_perf_row(mixed ? "adam_update_mixed" : "adam_update", be, shape, ms, 28.0 * n / 1e9,
                     0);
    zt_test_dev_finish(&d);
}

static void adam_perf_fn(zt_backend *be) {
    if (zt_test_has(be, "adam_update"))
        adam_perf_time(be, false);
}

static void mixed_perf_fn(zt_backend *be) {
    if (zt_test_has(be, "adam_update_mixed"))
        adam_perf_time(be, true);
}

const zt_test_family zt_test_adam_update = {"adam_update", adam_entries, adam_check, adam_perf_fn};
const zt_test_family zt_test_adam_update_mixed = {"adam_update_mixed", mixed_entries, mixed_check,
                                                  mixed_perf_fn};
