/* sgd_update, sum_squares and scale: every backend against the CPU, and the CPU against plain
 * loops (torch.optim.SGD's update written out in double, a double sum of squares, an fp32
 * multiply). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

/* As for Adam (op_adam.c): a few fp32 roundings per result, and the step checked on its own. */
#define TOL_UPDATE 1e-6
#define TOL_STEP 1e-4

/* A double sum of n squares differs from another order's by at most n·2^-53 of the sum, 5.5e-12
 * for the 49157 elements here. */
#define TOL_SUMSQ 1e-11

static const size_t sizes[] = {13, 2 * 16384 + 37};

/* ---- sgd_update ------------------------------------------------------------------------------ */

/* Five settings: plain SGD (no buffer), momentum with decay, Nesterov with dampening, momentum
 * alone, and maximize with momentum and decay. */
enum { SGD_VARIANTS = 5 };

static zt_sgd_args sgd_args(int variant, int step) {
    zt_sgd_args a = {.lr = 1e-2f, .first_step = step == 0};
    a.momentum = variant == 0 ? 0.0f : variant == 3 ? 0.5f : 0.9f;
    a.dampening = variant == 2 ? 0.1f : 0.0f;
    a.weight_decay = variant == 1 || variant == 4 ? 0.01f : variant == 2 ? 0.02f : 0.0f;
    a.nesterov = variant == 2;
    a.maximize = variant == 4;
    return a;
}

typedef struct {
    size_t n;
    float *p, *g, *buf; /* buf NULL without momentum */
} sgd_state;

static sgd_state sgd_make(zt_test_rng *r, size_t n, bool momentum) {
    return (sgd_state){n, zt_test_random(r, n, 0.0, 1.0), zt_test_random(r, n, 0.0, 1.0),
                       momentum ? zt_test_random(r, n, 0.0, 1.0) : NULL};
}

static void sgd_free(sgd_state *s) { free(s->p), free(s->g), free(s->buf); }

static void sgd_run(zt_backend *be, sgd_state *s, const zt_sgd_args *a) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    float *p = zt_test_dev_f32(&d, s->p, s->n), *g = zt_test_dev_f32(&d, s->g, s->n);
    float *buf = zt_test_dev_f32(&d, s->buf, s->n);
    be->ops->sgd_update(&d.ctx, p, g, buf, s->n, a);
    zt_test_dev_get_f32(&d, s->p, p, s->n);
    if (buf)
        zt_test_dev_get_f32(&d, s->buf, buf, s->n);
    zt_test_dev_finish(&d);
}

static void sgd_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act;
    for (int k = 0; k < 2; k++)
        for (int variant = 0; variant < SGD_VARIANTS; variant++) {
            sgd_state want = sgd_make(r, sizes[k], variant != 0);
            sgd_state got = {want.n, zt_test_dup(want.p, want.n), zt_test_dup(want.g, want.n),
                             zt_test_dup(want.buf, want.n)};
            for (int step = 0; step < 2; step++) {
                zt_sgd_args a = sgd_args(variant, step);
                sgd_run(cpu, &want, &a);
                sgd_run(be, &got, &a);
                CHECK_CLOSE(got.p, want.p, want.n, ZT_TEST_TOL_F32,
                            "sgd_update %s vs cpu, n=%zu variant %d step %d: p", be->name, want.n,
                            variant, step);
                if (want.buf)
                    CHECK_CLOSE(got.buf, want.buf, want.n, ZT_TEST_TOL_F32,
                                "sgd_update %s vs cpu, n=%zu variant %d step %d: buf", be->name,
                                want.n, variant, step);
            }
            sgd_free(&want), sgd_free(&got);
        }
}

/* torch.optim.SGD: g = -g with maximize; g += wd·p; with momentum buf = g on the first step, else
 * momentum·buf + (1 - dampening)·g, and g = Nesterov ? g + momentum·buf : buf; p -= lr·g. */
static void sgd_cpu(zt_backend *cpu, zt_test_rng *r) {
    for (int k = 0; k < 2; k++)
        for (int variant = 0; variant < SGD_VARIANTS; variant++) {
            sgd_state s = sgd_make(r, sizes[k], variant != 0);
            double *p = calloc(s.n, sizeof *p), *buf = calloc(s.n, sizeof *buf);
            double *step_want = calloc(s.n, sizeof *step_want);
            float *step_got = zt_test_zeros(s.n);
            for (int step = 0; step < 2; step++) {
                zt_sgd_args a = sgd_args(variant, step);
                for (size_t i = 0; i < s.n; i++) {
                    double g = (a.maximize ? -(double)s.g[i] : s.g[i]) +
                               (double)a.weight_decay * s.p[i];
                    if (s.buf) {
                        buf[i] = a.first_step ? g
                                              : (double)a.momentum * s.buf[i] +
                                                    (1.0 - (double)a.dampening) * g;
                        g = a.nesterov ? g + (double)a.momentum * buf[i] : buf[i];
                    }
                    p[i] = s.p[i] - (double)a.lr * g;
                    step_want[i] = p[i] - s.p[i];
                    step_got[i] = s.p[i]; /* the parameter before, until the step is known */
                }
                sgd_run(cpu, &s, &a);
                for (size_t i = 0; i < s.n; i++)
                    step_got[i] = (float)((double)s.p[i] - step_got[i]);
                char at[64];
                snprintf(at, sizeof at, "sgd_update cpu n=%zu variant %d step %d", s.n, variant,
                         step);
                CHECK_CLOSE(s.p, p, s.n, TOL_UPDATE, "%s: p against the reference", at);
                CHECK_CLOSE(step_got, step_want, s.n, TOL_STEP, "%s: p' - p against the reference",
                            at);
                if (s.buf)
                    CHECK_CLOSE(s.buf, buf, s.n, TOL_UPDATE, "%s: buf against the reference", at);
                for (size_t i = 0; i < s.n; i++)
                    s.g[i] = (float)zt_test_normal(r);
            }
            free(p), free(buf), free(step_want), free(step_got);
            sgd_free(&s);
        }
}

static const char *const sgd_entries[] = {"sgd_update", NULL};

static void sgd_check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "sgd_update", sgd_entries, false, sgd_compare))
        return;
    zt_test_rng r = zt_test_rng_for("sgd_update/cpu", 0);
    sgd_cpu(env->be[0], &r);
}

/* ---- sum_squares ----------------------------------------------------------------------------- */

static const size_t sumsq_sizes[] = {0, 1, 17, 3 * 16384 + 5};

static double sumsq_run(zt_backend *be, const float *v, size_t n) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    float *dv = zt_test_dev_f32(&d, v, n);
    double s = be->ops->sum_squares(&d.ctx, dv, n);
    zt_test_dev_finish(&d);
    return s;
}

/* Values over many magnitudes, so that fp32 accumulation would be visibly wrong. */
static float *sumsq_make(zt_test_rng *r, size_t n) {
    float *v = zt_test_random(r, n, 0.0, 1.0);
    for (size_t i = 0; i < n; i++)
        v[i] = ldexpf(v[i], zt_test_int(r, -20, 20));
    return v;
}

static void sumsq_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act;
    for (int k = 0; k < 4; k++) {
        size_t n = sumsq_sizes[k];
        float *v = sumsq_make(r, n);
        double want = sumsq_run(cpu, v, n), got = sumsq_run(be, v, n);
        CHECK_AT(fabs(got - want) <= TOL_SUMSQ * want,
                 "sum_squares %s vs cpu, n=%zu: %.17g, want %.17g", be->name, n, got, want);
        free(v);
    }
}

static void sumsq_cpu(zt_backend *cpu, zt_test_rng *r) {
    for (int k = 0; k < 4; k++) {
        size_t n = sumsq_sizes[k];
        float *v = sumsq_make(r, n);
        double want = 0.0;
        for (size_t i = 0; i < n; i++)
            want += (double)v[i] * v[i];
        double got = sumsq_run(cpu, v, n);
        CHECK_AT(fabs(got - want) <= TOL_SUMSQ * want,
                 "sum_squares cpu n=%zu: %.17g, the double loop %.17g", n, got, want);
        free(v);
    }
}

static const char *const sumsq_entries[] = {"sum_squares", NULL};

static void sumsq_check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "sum_squares", sumsq_entries, false, sumsq_compare))
        return;
    zt_test_rng r = zt_test_rng_for("sum_squares/cpu", 0);
    sumsq_cpu(env->be[0], &r);
}

/* ---- scale ----------------------------------------------------------------------------------- */

static float *scale_run(zt_backend *be, const float *v, size_t n, float s) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    float *dv = zt_test_dev_f32(&d, v, n), *out = zt_test_zeros(n);
    be->ops->scale(&d.ctx, dv, n, s);
    zt_test_dev_get_f32(&d, out, dv, n);
    zt_test_dev_finish(&d);
    return out;
}

/* One fp32 multiply per element: correctly rounded, so every backend gives the same bits. */
static void scale_all(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act;
    static const float factors[] = {0.37f, -2.5f, 0.0f, 1.0f};
    for (int k = 0; k < 4; k++) {
        size_t n = k == 3 ? 2 * 16384 + 3 : 17 + 100 * (size_t)k;
        float *v = zt_test_random(r, n, 0.0, 10.0), *want = zt_test_zeros(n);
        for (size_t i = 0; i < n; i++)
            want[i] = v[i] * factors[k];
        float *got = scale_run(be, v, n, factors[k]), *ref = scale_run(cpu, v, n, factors[k]);
        CHECK_SAME(ref, want, n, "scale cpu n=%zu s=%g against fp32 multiplies", n, factors[k]);
        CHECK_SAME(got, ref, n, "scale %s vs cpu n=%zu s=%g", be->name, n, factors[k]);
        free(v), free(want), free(got), free(ref);
    }
}

static const char *const scale_entries[] = {"scale", NULL};

static void scale_check(const zt_test_env *env) {
    zt_test_each_backend(env, "scale", scale_entries, false, scale_all);
}

/* ---- --perf: 16M elements, as adam_update ---------------------------------------------------- */

typedef struct {
    zt_ctx ctx;
    float *p, *g, *buf;
    size_t n;
    zt_sgd_args a;
    double sink;
} optim_perf;

static void sgd_perf_run(void *arg) {
    optim_perf *q = arg;
    q->ctx.be->ops->sgd_update(&q->ctx, q->p, q->g, q->buf, q->n, &q->a);
}

static void sumsq_perf_run(void *arg) {
    optim_perf *q = arg;
    q->sink += q->ctx.be->ops->sum_squares(&q->ctx, q->g, q->n);
}

static void scale_perf_run(void *arg) {
    optim_perf *q = arg;
    q->ctx.be->ops->scale(&q->ctx, q->p, q->n, 1.0f);
}

/* Bytes: sgd reads p, g, buf and writes p, buf (20 an element); sum_squares reads 4; scale reads
 * and writes 8. */
static void optim_perf_time(zt_backend *be, const char *op, void (*fn)(void *), double bytes) {
    if (!zt_test_has(be, op))
        return;
    const size_t n = (size_t)1 << 24;
    zt_test_rng r = zt_test_rng_for(op, 1);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    optim_perf q = {d.ctx, .n = n, .a = sgd_args(1, 1)};
    q.p = zt_test_dev_random(&d, &r, n, 1.0);
    q.g = zt_test_dev_random(&d, &r, n, 1.0);
    q.buf = zt_test_dev_random(&d, &r, n, 1.0);
    char shape[32];
    snprintf(shape, sizeof shape, "n=%zu", n);
    double ms = zt_test_time_ms(be, fn, &q, 9);
    zt_test_perf_row(op, be, shape, ms, bytes * n / 1e9, 0);
    zt_test_dev_finish(&d);
}

static void sgd_perf(zt_backend *be) { optim_perf_time(be, "sgd_update", sgd_perf_run, 20.0); }
static void sumsq_perf(zt_backend *be) { optim_perf_time(be, "sum_squares", sumsq_perf_run, 4.0); }
static void scale_perf(zt_backend *be) { optim_perf_time(be, "scale", scale_perf_run, 8.0); }

const zt_test_family zt_test_sgd_update = {"sgd_update", sgd_entries, sgd_check, sgd_perf};
const zt_test_family zt_test_sum_squares = {"sum_squares", sumsq_entries, sumsq_check, sumsq_perf};
const zt_test_family zt_test_scale = {"scale", scale_entries, scale_check, scale_perf};
