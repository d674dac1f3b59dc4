/* weighted_sum_to: the gradient norm's pieces combined where they are (ops.h). On every backend,
 * bit for bit, the loop the op states written here on the host (s = fma(w, part, s) in index
 * order from 0.0; with no weights, part after part added), which is what zt_zero_norm_combine
 * computes on the host; and the CPU's result. The parts span many magnitudes and both signs, so
 * another order or an extra rounding shows in the last bits; counts beyond the CUDA backend's
 * weights per launch check that its chunks go on from each other; a non-finite part (the
 * overflow the engine tests for) stays non-finite. */
#include <math.h>
#include <stdlib.h>

#include "harness.h"

static const int counts[] = {0, 1, 2, 7, 32, 33, 70};

static double *make_parts(zt_test_rng *r, int n) {
    double *p = malloc(((size_t)n + 1) * sizeof *p);
    for (int i = 0; i < n; i++)
        p[i] = ldexp(zt_test_normal(r), zt_test_int(r, -30, 30));
    return p;
}

/* Weights as tensor parallelism makes them (1, 1/tp) and others whose products round. */
static double *make_weights(zt_test_rng *r, int n) {
    static const double kinds[] = {1.0, 0.5, 1.0 / 3.0, 0.25, 0.1};
    double *w = malloc(((size_t)n + 1) * sizeof *w);
    for (int i = 0; i < n; i++)
        w[i] = kinds[zt_test_int(r, 0, 4)] * (zt_test_int(r, 0, 3) == 0 ? zt_test_uniform(r) : 1);
    return w;
}

static double reference(const double *p, const double *w, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s = w ? fma(w[i], p[i], s) : s + p[i];
    return s;
}

static double run(zt_backend *be, const double *p, const double *w, int n) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    double *dp = zt_test_dev_bytes(&d, p, ((size_t)n + 1) * sizeof *p);
    /* A stale value in the output, which the op must not read. */
    double stale = 12345.0, got;
    double *out = zt_test_dev_bytes(&d, &stale, sizeof stale);
    be->ops->weighted_sum_to(&d.ctx, out, dp, w, n);
    zt_test_dev_get_bytes(&d, &got, out, sizeof got);
    zt_test_dev_finish(&d);
    return got;
}

static bool same(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

static void one(zt_backend *cpu, zt_backend *be, const double *p, const double *w, int n,
                const char *what) {
    double want = reference(p, w, n), got = run(be, p, w, n);
    CHECK_AT(same(got, want), "weighted_sum_to %s %s n=%d: %.17g, the stated loop %.17g",
             be->name, what, n, got, want);
    if (cpu != be) {
        double c = run(cpu, p, w, n);
        CHECK_AT(same(got, c), "weighted_sum_to %s %s n=%d: %.17g, the CPU's %.17g", be->name,
                 what, n, got, c);
    }
}

static void compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act;
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        int n = counts[k];
        double *p = make_parts(r, n), *w = make_weights(r, n);
        one(cpu, be, p, NULL, n, "unweighted");
        one(cpu, be, p, w, n, "weighted");
        if (n >= 2) {
            p[n / 2] = INFINITY;
            one(cpu, be, p, w, n, "with an infinite part");
            CHECK_AT(isinf(run(be, p, NULL, n)), "weighted_sum_to %s n=%d: an infinite part "
                     "gives a finite sum", be->name, n);
            p[n - 1] = NAN;
            one(cpu, be, p, NULL, n, "with a NaN part");
            CHECK_AT(isnan(run(be, p, w, n)), "weighted_sum_to %s n=%d: a NaN part gives a "
                     "number", be->name, n);
        }
        free(p), free(w);
    }
}

static const char *const entries[] = {"weighted_sum_to", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "weighted_sum_to", entries, false, compare))
        return;
    zt_test_rng r = zt_test_rng_for("weighted_sum_to/cpu", 0);
    compare(env->be[0], env->be[0], ZT_F32, &r);
}

const zt_test_family zt_test_weighted_sum_to = {"weighted_sum_to", entries, check, NULL};
