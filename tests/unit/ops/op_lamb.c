/* LAMB's step as the optimizer runs it (lamb_moments_to adding each piece's sums to a device
 * slot, lamb_steps, lamb_apply reading its step from device memory): every backend against the
 * CPU, lamb_moments_to against lamb_moments on each backend bit for bit (its sums added to what
 * the slot held), lamb_steps on every backend bit for bit the CPU's and against the clamped
 * ratio computed in double from the same sums, and the CPU against DeepSpeed's FusedLamb step
 * written out in double over several steps (moments, the two sums of squares, the clamped trust
 * ratio, the update), in both eps modes, with and without weight decay; and a slice split at an
 * odd offset gives the same bits per element as the whole. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* A few fp32 roundings per result, as for Adam (op_adam.c); the step p' - p on its own at 1e-4.
 * The sums are double accumulations of fp32 squares: the update's square carries its few fp32
 * roundings, so 1e-6 relative. */
#define TOL_UPDATE 1e-6
#define TOL_STEP 1e-4
#define TOL_SUMS 1e-6

typedef struct {
    size_t n;
    float *p, *g, *m, *v;
} lamb_state;

static lamb_state lamb_make(zt_test_rng *r, size_t n) {
    lamb_state s = {n, zt_test_random(r, n, 0.0, 1.0), zt_test_random(r, n, 0.0, 1.0),
                    zt_test_random(r, n, 0.0, 1e-2), zt_test_random(r, n, 0.0, 1e-2)};
    for (size_t i = 0; i < n; i++)
        s.v[i] = s.v[i] * s.v[i];
    return s;
}

static lamb_state lamb_copy(const lamb_state *s) {
    return (lamb_state){s->n, zt_test_dup(s->p, s->n), zt_test_dup(s->g, s->n),
                        zt_test_dup(s->m, s->n), zt_test_dup(s->v, s->n)};
}

static void lamb_free(lamb_state *s) { free(s->p), free(s->g), free(s->m), free(s->v); }

/* Three settings: FusedLamb's defaults with decay, eps inside the sqrt, and no decay. */
static zt_lamb_args lamb_args(int variant) {
    return (zt_lamb_args){.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-3f,
                          .weight_decay = variant == 2 ? 0.0f : 0.05f,
                          .eps_inside_sqrt = variant == 1};
}

/* One step on be in place over s as the optimizer runs it, its first pass in two pieces split
 * at `split` (0: one piece) adding their sums to one zeroed device slot, the second pass with
 * the step lamb_steps derives from the slot: step_size times the trust ratio clamped to
 * [0.01, 10]. The slot's sums are read back into sums. */
static void lamb_run(zt_backend *be, lamb_state *s, const zt_lamb_args *a, float step_size,
                     size_t split, double sums[2]) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    float *p = zt_test_dev_f32(&d, s->p, s->n), *g = zt_test_dev_f32(&d, s->g, s->n);
    float *m = zt_test_dev_f32(&d, s->m, s->n), *v = zt_test_dev_f32(&d, s->v, s->n);
    const double zero[2] = {0.0, 0.0};
    double *slot = zt_test_dev_bytes(&d, zero, sizeof zero);
    float *step = zt_test_dev_alloc(&d, sizeof(float));
    be->ops->lamb_moments_to(&d.ctx, p, g, m, v, split, a, slot);
    be->ops->lamb_moments_to(&d.ctx, p + split, g + split, m + split, v + split, s->n - split, a,
                             slot);
    zt_lamb_step_args sa = {.step_size = step_size, .max_coeff = 10.0f, .min_coeff = 0.01f};
    be->ops->lamb_steps(&d.ctx, step, slot, 1, &sa);
    be->ops->lamb_apply(&d.ctx, p, m, v, split, a, step);
    be->ops->lamb_apply(&d.ctx, p + split, m + split, v + split, s->n - split, a, step);
    zt_test_dev_get_bytes(&d, sums, slot, 2 * sizeof(double));
    zt_test_dev_get_f32(&d, s->p, p, s->n);
    zt_test_dev_get_f32(&d, s->m, m, s->n);
    zt_test_dev_get_f32(&d, s->v, v, s->n);
    zt_test_dev_finish(&d);
}

/* Sizes below one thread chunk and past two (16384 elements each), with a tail. */
static const size_t sizes[] = {13, 2 * 16384 + 37};

static void lamb_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act;
    for (int k = 0; k < 2; k++)
        for (int variant = 0; variant < 3; variant++) {
            lamb_state want = lamb_make(r, sizes[k]), got = lamb_copy(&want);
            zt_lamb_args a = lamb_args(variant);
            for (int step = 1; step <= 3; step++) {
                double ws[2], gs[2];
                lamb_run(cpu, &want, &a, 1e-2f, 0, ws);
                lamb_run(be, &got, &a, 1e-2f, 0, gs);
                char at[96];
                snprintf(at, sizeof at, "lamb %s vs cpu, n=%zu variant %d step %d", be->name,
                         want.n, variant, step);
                CHECK_AT(fabs(gs[0] - ws[0]) <= TOL_SUMS * ws[0] &&
                             fabs(gs[1] - ws[1]) <= TOL_SUMS * ws[1],
                         "%s: sums %g %g, want %g %g", at, gs[0], gs[1], ws[0], ws[1]);
                CHECK_CLOSE(got.p, want.p, want.n, ZT_TEST_TOL_F32, "%s: p", at);
                CHECK_CLOSE(got.m, want.m, want.n, ZT_TEST_TOL_F32, "%s: m", at);
                CHECK_CLOSE(got.v, want.v, want.n, ZT_TEST_TOL_F32, "%s: v", at);
                for (size_t i = 0; i < want.n; i++)
                    got.g[i] = want.g[i] = (float)zt_test_normal(r);
            }
            lamb_free(&want), lamb_free(&got);
        }
}

/* ---- the double-precision reference ---------------------------------------------------------- */

/* One FusedLamb step on a whole tensor from s (left as it is) into p, m, v and the sums, with
 * step t's bias-corrected step size lr·sqrt(1 - b2^t) / (1 - b1^t). */
static void lamb_ref(const lamb_state *s, const zt_lamb_args *a, double step_size, double *p,
                     double *m, double *v, double sums[2]) {
    double b1 = a->beta1, b2 = a->beta2, eps = a->eps, wd = a->weight_decay;
    double *u = calloc(s->n, sizeof *u);
    sums[0] = sums[1] = 0.0;
    for (size_t i = 0; i < s->n; i++) {
        double g = s->g[i];
        m[i] = b1 * s->m[i] + (1.0 - b1) * g;
        v[i] = b2 * s->v[i] + (1.0 - b2) * g * g;
        double denom = a->eps_inside_sqrt ? sqrt(v[i] + eps) : sqrt(v[i]) + eps;
        u[i] = m[i] / denom + wd * s->p[i];
        sums[0] += (double)s->p[i] * s->p[i];
        sums[1] += u[i] * u[i];
    }
    double coeff = sqrt(sums[0]) / sqrt(sums[1]);
    coeff = coeff > 10.0 ? 10.0 : coeff < 0.01 ? 0.01 : coeff;
    for (size_t i = 0; i < s->n; i++)
        p[i] = s->p[i] - step_size * coeff * u[i];
    free(u);
}

static void lamb_cpu(zt_backend *cpu, zt_test_rng *r) {
    for (int k = 0; k < 2; k++)
        for (int variant = 0; variant < 3; variant++) {
            lamb_state s = lamb_make(r, sizes[k]);
            zt_lamb_args a = lamb_args(variant);
            double *p = calloc(s.n, sizeof *p), *m = calloc(s.n, sizeof *m),
                   *v = calloc(s.n, sizeof *v), *want_step = calloc(s.n, sizeof *want_step);
            float *got_step = zt_test_zeros(s.n);
            for (int step = 1; step <= 3; step++) {
                float step_size = (float)(1e-2 * sqrt(1.0 - pow(0.999, step)) /
                                          (1.0 - pow(0.9, step)));
                double want_sums[2], got_sums[2];
                lamb_ref(&s, &a, step_size, p, m, v, want_sums);
                float *p0 = zt_test_dup(s.p, s.n);
                lamb_run(cpu, &s, &a, step_size, 0, got_sums);
                for (size_t i = 0; i < s.n; i++) {
                    got_step[i] = (float)((double)s.p[i] - p0[i]);
                    want_step[i] = p[i] - p0[i];
                }
                char at[80];
                snprintf(at, sizeof at, "lamb cpu n=%zu variant %d step %d", s.n, variant, step);
                for (int j = 0; j < 2; j++)
                    CHECK_AT(fabs(got_sums[j] - want_sums[j]) <= TOL_SUMS * want_sums[j],
                             "%s: sum %d is %.17g, the reference %.17g", at, j, got_sums[j],
                             want_sums[j]);
                CHECK_CLOSE(s.p, p, s.n, TOL_UPDATE, "%s: p against the reference", at);
                CHECK_CLOSE(got_step, want_step, s.n, TOL_STEP, "%s: p' - p against the reference",
                            at);
                CHECK_CLOSE(s.m, m, s.n, TOL_UPDATE, "%s: m against the reference", at);
                CHECK_CLOSE(s.v, v, s.n, TOL_UPDATE, "%s: v against the reference", at);
                free(p0);
                for (size_t i = 0; i < s.n; i++)
                    s.g[i] = (float)zt_test_normal(r);
            }
            free(p), free(m), free(v), free(want_step), free(got_step);
            lamb_free(&s);
        }
}

/* Split at an odd element, the pieces' sums add up to the whole's (to rounding) and every
 * element comes out with the same bits: a ZeRO partition boundary inside a tensor changes
 * nothing but the order of the sums' additions. */
static void lamb_split(zt_backend *cpu, zt_test_rng *r) {
    lamb_state whole = lamb_make(r, sizes[1]), parts = lamb_copy(&whole);
    zt_lamb_args a = lamb_args(0);
    double ws[2], ps[2];
    lamb_run(cpu, &whole, &a, 1e-2f, 0, ws);
    lamb_run(cpu, &parts, &a, 1e-2f, 16384 + 5, ps);
    CHECK_AT(fabs(ps[0] - ws[0]) <= 1e-12 * ws[0] && fabs(ps[1] - ws[1]) <= 1e-12 * ws[1],
             "lamb split: sums %.17g %.17g, whole %.17g %.17g", ps[0], ps[1], ws[0], ws[1]);
    CHECK_AT(memcmp(whole.m, parts.m, whole.n * sizeof(float)) == 0 &&
                 memcmp(whole.v, parts.v, whole.n * sizeof(float)) == 0,
             "lamb split: moments differ from the whole slice's");
    /* Sums a few ulps apart may round the trust ratio to a neighbouring float: p within one
     * ulp or so. */
    CHECK_CLOSE(parts.p, whole.p, whole.n, 1e-7, "lamb split: p against the whole slice's");
    lamb_free(&whole), lamb_free(&parts);
}

/* lamb_moments_to on a backend against its own lamb_moments: the same m and v bit for bit, and
 * the sums, added in device memory to what the slot held and read back, the same bits as the
 * ones returned added to it on the host; and against the CPU's lamb_moments, the reference: sums
 * within TOL_SUMS, m and v within fp32's tolerance. The slot starts at values of the sums' own
 * size, so a pass that wrote its sums instead of adding them is off by about half. */
static void lamb_to_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act;
    for (int k = 0; k < 2; k++) {
        lamb_state s = lamb_make(r, sizes[k]);
        zt_lamb_args a = lamb_args(0);
        lamb_state ref = lamb_copy(&s);
        double ref_sums[2];
        zt_test_dev c;
        zt_test_dev_init(&c, cpu, ZT_F32);
        cpu->ops->lamb_moments(&c.ctx, ref.p, ref.g, ref.m, ref.v, ref.n, &a, ref_sums);
        zt_test_dev_finish(&c);
        zt_test_dev d;
        zt_test_dev_init(&d, be, ZT_F32);
        float *p = zt_test_dev_f32(&d, s.p, s.n), *g = zt_test_dev_f32(&d, s.g, s.n);
        float *m1 = zt_test_dev_f32(&d, s.m, s.n), *v1 = zt_test_dev_f32(&d, s.v, s.n);
        float *m2 = zt_test_dev_f32(&d, s.m, s.n), *v2 = zt_test_dev_f32(&d, s.v, s.n);
        const double held[2] = {ref_sums[0] * 0.75, ref_sums[1] * 1.25};
        double *dev = zt_test_dev_bytes(&d, held, sizeof held), want[2], got[2];
        be->ops->lamb_moments(&d.ctx, p, g, m1, v1, s.n, &a, want);
        be->ops->lamb_moments_to(&d.ctx, p, g, m2, v2, s.n, &a, dev);
        zt_test_dev_get_bytes(&d, got, dev, sizeof got);
        double returned[2] = {want[0], want[1]};
        want[0] = held[0] + returned[0];
        want[1] = held[1] + returned[1];
        float *hm1 = malloc(s.n * sizeof(float)), *hm2 = malloc(s.n * sizeof(float));
        float *hv1 = malloc(s.n * sizeof(float)), *hv2 = malloc(s.n * sizeof(float));
        zt_test_dev_get_f32(&d, hm1, m1, s.n), zt_test_dev_get_f32(&d, hm2, m2, s.n);
        zt_test_dev_get_f32(&d, hv1, v1, s.n), zt_test_dev_get_f32(&d, hv2, v2, s.n);
        CHECK_AT(memcmp(got, want, sizeof got) == 0, "lamb_moments_to %s n=%zu: sums %.17g %.17g, "
                 "lamb_moments %.17g %.17g", be->name, s.n, got[0], got[1], want[0], want[1]);
        CHECK_SAME(hm2, hm1, s.n, "lamb_moments_to %s n=%zu: m", be->name, s.n);
        CHECK_SAME(hv2, hv1, s.n, "lamb_moments_to %s n=%zu: v", be->name, s.n);
        CHECK_AT(fabs(returned[0] - ref_sums[0]) <= TOL_SUMS * ref_sums[0] &&
                     fabs(returned[1] - ref_sums[1]) <= TOL_SUMS * ref_sums[1],
                 "lamb_moments %s n=%zu: sums %.17g %.17g, the CPU's lamb_moments %.17g %.17g",
                 be->name, s.n, returned[0], returned[1], ref_sums[0], ref_sums[1]);
        CHECK_CLOSE(hm2, ref.m, s.n, ZT_TEST_TOL_F32, "lamb_moments_to %s n=%zu: m vs the CPU",
                    be->name, s.n);
        CHECK_CLOSE(hv2, ref.v, s.n, ZT_TEST_TOL_F32, "lamb_moments_to %s n=%zu: v vs the CPU",
                    be->name, s.n);
        free(hm1), free(hm2), free(hv1), free(hv2);
        zt_test_dev_finish(&d);
        lamb_free(&s), lamb_free(&ref);
    }
}

/* ---- lamb_steps ------------------------------------------------------------------------------ */

/* Sums of every kind lamb_steps meets: the two norms' ratio inside the bounds, past either
 * bound, exactly at one, either norm or both zero, and magnitudes from tiny to huge; then
 * random ones. More tensors than one block of threads. */
enum { STEPS_N = 300 };

static void steps_sums(zt_test_rng *r, double *sums) {
    static const double fixed[][2] = {
        {4.0, 1.0},     {1.0, 4.0},      {1e6, 1e-6},  {1e-6, 1e6},  {0.0, 3.0},
        {3.0, 0.0},     {0.0, 0.0},      {100.0, 1.0}, {1.0, 1e4},   {1e-30, 4e-30},
        {1e30, 1e26},   {2.0, 2.0},      {7.5, 0.3},   {1e-3, 9.99e-2},
    };
    enum { NFIXED = sizeof fixed / sizeof fixed[0] };
    for (int i = 0; i < STEPS_N; i++) {
        if (i < NFIXED) {
            sums[2 * i] = fixed[i][0];
            sums[2 * i + 1] = fixed[i][1];
            continue;
        }
        /* |p|² and |u|² over many decades, so the ratio crosses both bounds often. */
        sums[2 * i] = pow(10.0, 8.0 * zt_test_uniform(r) - 4.0) * (1.0 + zt_test_uniform(r));
        sums[2 * i + 1] = pow(10.0, 8.0 * zt_test_uniform(r) - 4.0) * (1.0 + zt_test_uniform(r));
    }
}

/* The clamped ratio from the sums in double, as ops.h states it: the reference. */
static double steps_ref(const double *sums, int i, const zt_lamb_step_args *a) {
    double w = sqrt(sums[2 * i]), u = sqrt(sums[2 * i + 1]);
    if (w == 0.0 || u == 0.0)
        return a->step_size;
    double coeff = w / u;
    coeff = coeff > a->max_coeff ? a->max_coeff : coeff;
    coeff = coeff < a->min_coeff ? a->min_coeff : coeff;
    return a->step_size * coeff;
}

/* steps[0, STEPS_N) from sums by backend be's lamb_steps. */
static void run_lamb_steps(zt_backend *be, const double *sums, const zt_lamb_step_args *a,
                           float *steps) {
    zt_test_dev t;
    zt_test_dev_init(&t, be, ZT_F32);
    double *ts = zt_test_dev_bytes(&t, sums, 2 * STEPS_N * sizeof *sums);
    float *tw = zt_test_dev_alloc(&t, STEPS_N * sizeof *steps);
    be->ops->lamb_steps(&t.ctx, tw, ts, STEPS_N, a);
    zt_test_dev_get_bytes(&t, steps, tw, STEPS_N * sizeof *steps);
    zt_test_dev_finish(&t);
}

static void lamb_steps_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act;
    double sums[2 * STEPS_N];
    steps_sums(r, sums);
    zt_lamb_step_args a = {.step_size = 3.1e-3f, .max_coeff = 10.0f, .min_coeff = 0.01f};
    float want[STEPS_N], got[STEPS_N];
    run_lamb_steps(cpu, sums, &a, want);
    run_lamb_steps(be, sums, &a, got);
    /* The float roots, divide and multiply: a few float roundings from the double value. */
    for (int i = 0; i < STEPS_N; i++) {
        double ref = steps_ref(sums, i, &a);
        CHECK_AT(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                 "lamb_steps %s tensor %d (sums %.17g %.17g): %.9g, the CPU's %.9g", be->name, i,
                 sums[2 * i], sums[2 * i + 1], got[i], want[i]);
        CHECK_AT(fabs(got[i] - ref) <= 4e-7 * ref,
                 "lamb_steps %s tensor %d (sums %.17g %.17g): %.9g, the double reference %.9g",
                 be->name, i, sums[2 * i], sums[2 * i + 1], got[i], ref);
    }
}

static const char *const lamb_entries[] = {"lamb_moments_to", "lamb_steps", "lamb_apply", NULL};
static const char *const lamb_to_entries[] = {"lamb_moments", "lamb_moments_to", NULL};
static const char *const lamb_steps_entries[] = {"lamb_steps", NULL};
static const char *const lamb_family[] = {"lamb_moments", "lamb_moments_to", "lamb_steps",
                                          "lamb_apply", NULL};

static void lamb_check(const zt_test_env *env) {
    zt_test_each_backend(env, "lamb_moments_to", lamb_to_entries, false, lamb_to_compare);
    zt_test_each_backend(env, "lamb_steps", lamb_steps_entries, false, lamb_steps_compare);
    if (!zt_test_each_backend(env, "lamb", lamb_entries, false, lamb_compare))
        return;
    zt_test_rng r = zt_test_rng_for("lamb/cpu", 0);
    lamb_cpu(env->be[0], &r);
    lamb_split(env->be[0], &r);
}

/* ---- --perf: 16M parameters in 64 tensors of 256K, as adam_update's perf case ---------------- */

typedef struct {
    zt_ctx ctx;
    float *p, *g, *m, *v, *step;
    size_t n;
    zt_lamb_args a;
} lamb_perf;

/* One LAMB step as the optimizer runs it: both passes, tensor by tensor. */
static void lamb_perf_run(void *arg) {
    lamb_perf *q = arg;
    const size_t t = q->n / 64;
    for (size_t lo = 0; lo < q->n; lo += t) {
        double sums[2];
        q->ctx.be->ops->lamb_moments(&q->ctx, q->p + lo, q->g + lo, q->m + lo, q->v + lo, t,
                                     &q->a, sums);
    }
    for (size_t lo = 0; lo < q->n; lo += t)
        q->ctx.be->ops->lamb_apply(&q->ctx, q->p + lo, q->m + lo, q->v + lo, t, &q->a, q->step);
}

static void lamb_perf_fn(zt_backend *be) {
    if (!zt_test_has(be, "lamb_moments") || !zt_test_has(be, "lamb_apply"))
        return;
    const size_t n = (size_t)1 << 24;
    zt_test_rng r = zt_test_rng_for("lamb/perf", 0);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    lamb_perf q = {d.ctx, .n = n, .a = lamb_args(0)};
    q.p = zt_test_dev_random(&d, &r, n, 1.0);
    q.g = zt_test_dev_random(&d, &r, n, 1.0);
    q.m = zt_test_dev_alloc(&d, n * sizeof(float));
    q.v = zt_test_dev_alloc(&d, n * sizeof(float));
    const float step = 1e-9f;
    q.step = zt_test_dev_f32(&d, &step, 1);
    /* Bytes: the first pass reads p, g, m, v and writes m, v (24 a parameter); the second reads
     * p, m, v and writes p (16). */
    double ms = zt_test_time_ms(be, lamb_perf_run, &q, 9);
    zt_test_perf_row("lamb (both passes)", be, "n=16777216, 64 tensors", ms, 40.0 * n / 1e9, 0);
    zt_test_dev_finish(&d);
}

const zt_test_family zt_test_lamb = {"lamb", lamb_family, lamb_check, lamb_perf_fn};
