/* sum_to: the step's sums written to device memory (the gradient norm's squares, a batch's token
 * losses). On every backend its sums of squares equal that backend's own sum_squares and
 * sum_squares_half bit for bit (the engine's norm must not change when it stops reading each
 * piece back) and an index-order double loop on the host within the reordering of a double
 * sum, and its plain sum matches an index-order double loop: exactly on the CPU (the host loop
 * it replaces), within the reordering of a double sum elsewhere. */
#include <math.h>
#include <stdlib.h>

#include "harness.h"

static const size_t sizes[] = {0, 1, 17, 3 * 16384 + 5};

/* Values over many magnitudes, with both signs, so a float accumulator would be visibly wrong. */
static float *make(zt_test_rng *r, size_t n) {
    float *v = zt_test_random(r, n, 0.0, 1.0);
    for (size_t i = 0; i < n; i++)
        v[i] = ldexpf(v[i], zt_test_int(r, -20, 20));
    return v;
}

static double sum_to_run(zt_test_dev *d, const void *dv, size_t n, zt_dtype t, bool squares) {
    double *out = zt_test_dev_alloc(d, sizeof(double)), got;
    d->be->ops->sum_to(&d->ctx, out, dv, n, t, squares);
    zt_test_dev_get_bytes(d, &got, out, sizeof got);
    return got;
}

/* The sum of squares against an index-order double loop on the host over the same values (the
 * 16-bit ones decoded), within the reordering of a double sum of non-negative terms: independent
 * of every backend's own sum_squares, which sum_to's passes now are (an fp16 value out of range
 * is infinite on both sides). */
static void check_squares(zt_backend *be, double got, const float *v, size_t n,
                          const uint16_t *h, zt_dtype t) {
    double loop = 0.0;
    for (size_t i = 0; i < n; i++) {
        double x = h ? (double)zt_test_decode(h[i], t) : (double)v[i];
        loop += x * x;
    }
    CHECK_AT(got == loop || fabs(got - loop) <= 2.0 * (double)n * 0x1p-53 * loop,
             "sum_to %s squares %s n=%zu: %.17g, the index-order loop %.17g", be->name,
             zt_dtype_name(t), n, got, loop);
}

static void one_backend(zt_backend *be, zt_test_rng *r) {
    double plain[4];
    for (int k = 0; k < 4; k++) {
        size_t n = sizes[k];
        float *v = make(r, n);
        uint16_t *h[2] = {malloc(n * 2 + 2), malloc(n * 2 + 2)};
        static const zt_dtype halves[2] = {ZT_BF16, ZT_F16};
        for (int j = 0; j < 2; j++)
            for (size_t i = 0; i < n; i++)
                h[j][i] = zt_test_encode(zt_test_round(v[i], halves[j]), halves[j]);
        zt_test_dev d;
        zt_test_dev_init(&d, be, ZT_F32);
        float *dv = zt_test_dev_f32(&d, v, n);
        double want = be->ops->sum_squares(&d.ctx, dv, n);
        double got = sum_to_run(&d, dv, n, ZT_F32, true);
        CHECK_AT(got == want, "sum_to %s squares fp32 n=%zu: %.17g, sum_squares %.17g", be->name,
                 n, got, want);
        check_squares(be, got, v, n, NULL, ZT_F32);
        for (int j = 0; j < 2; j++) {
            uint16_t *dh = zt_test_dev_bytes(&d, h[j], n * 2 + 2);
            want = be->ops->sum_squares_half(&d.ctx, dh, n, halves[j]);
            got = sum_to_run(&d, dh, n, halves[j], true);
            CHECK_AT(got == want || (isnan(got) && isnan(want)),
                     "sum_to %s squares %s n=%zu: %.17g, sum_squares_half %.17g", be->name,
                     zt_dtype_name(halves[j]), n, got, want);
            check_squares(be, got, v, n, h[j], halves[j]);
        }
        plain[k] = sum_to_run(&d, dv, n, ZT_F32, false);
        double loop = 0.0, mag = 0.0;
        for (size_t i = 0; i < n; i++) {
            loop += v[i];
            mag += fabs(v[i]);
        }
        /* A double sum of n floats in any order is within n·2⁻⁵³ of the sum of magnitudes. */
        CHECK_AT(fabs(plain[k] - loop) <= (double)n * 0x1p-53 * mag,
                 "sum_to %s plain n=%zu: %.17g, the index-order loop %.17g", be->name, n,
                 plain[k], loop);
        if (be->device == ZT_DEVICE_CPU)
            CHECK_AT(plain[k] == loop, "sum_to cpu plain n=%zu: %.17g, not the index-order "
                     "loop's %.17g", n, plain[k], loop);
        zt_test_dev_finish(&d);
        free(v), free(h[0]), free(h[1]);
    }
}

static void compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)cpu, (void)act;
    one_backend(be, r);
}

static const char *const entries[] = {"sum_to", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "sum_to", entries, false, compare))
        return;
    zt_test_rng r = zt_test_rng_for("sum_to/cpu", 0);
    one_backend(env->be[0], &r);
}

const zt_test_family zt_test_sum_to = {"sum_to", entries, check, NULL};
