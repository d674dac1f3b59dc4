/* The harness's side that touches backends: device buffers, the walk over backends and
 * precisions, the op table's entries by name, finite differences and --perf's timing and table
 * (see harness.h). */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static void *must(void *p) {
    if (!p) {
        fprintf(stderr, "test_ops: out of host memory\n");
        exit(2);
    }
    return p;
}

/* ---- device buffers -------------------------------------------------------------------------- */

void zt_test_dev_init(zt_test_dev *d, zt_backend *be, zt_dtype act) {
    memset(d, 0, sizeof *d);
    d->be = be;
    d->ctx = (zt_ctx){.be = be, .act = act};
}

size_t zt_test_act_size(const zt_backend *be, zt_dtype act) {
    return zt_backend_act_size(be, act);
}

void *zt_test_dev_alloc(zt_test_dev *d, size_t bytes) {
    ZT_ASSERT(d->n < ZT_TEST_DEV_MAX);
    void *p = zt_backend_alloc(d->be, ZT_MEM_DEVICE, bytes);
    if (!p) {
        fprintf(stderr, "test_ops: %s: cannot allocate %zu bytes of device memory\n", d->be->name,
                bytes);
        exit(2);
    }
    d->p[d->n] = p;
    d->bytes[d->n++] = bytes;
    return p;
}

float *zt_test_dev_f32(zt_test_dev *d, const float *host, size_t n) {
    if (!host)
        return NULL;
    float *p = zt_test_dev_alloc(d, n * sizeof(float));
    zt_backend_copy(d->be, p, host, n * sizeof(float), ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    return p;
}

void *zt_test_dev_act(zt_test_dev *d, const float *host, size_t n) {
    if (!host)
        return NULL;
    size_t es = zt_test_act_size(d->be, d->ctx.act);
    void *p = zt_test_dev_alloc(d, n * es);
    for (size_t i = 0; i < n; i++) {
        float r = zt_test_round(host[i], d->ctx.act);
        /* An input a model could not hold at this precision is a bug of the test's own. */
        ZT_ASSERT(isnan(host[i]) || memcmp(&r, &host[i], sizeof r) == 0);
    }
    if (es == sizeof(float)) {
        zt_backend_copy(d->be, p, host, n * es, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
        return p;
    }
    uint16_t *h = must(calloc(n ? n : 1, sizeof *h));
    for (size_t i = 0; i < n; i++)
        h[i] = zt_test_encode(host[i], d->ctx.act);
    zt_backend_copy(d->be, p, h, n * es, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    free(h);
    return p;
}

void *zt_test_dev_bytes(zt_test_dev *d, const void *host, size_t bytes) {
    if (!host)
        return NULL;
    void *p = zt_test_dev_alloc(d, bytes);
    zt_backend_copy(d->be, p, host, bytes, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    return p;
}

void zt_test_dev_get_bytes(zt_test_dev *d, void *host, const void *dev, size_t bytes) {
    zt_backend_copy(d->be, host, dev, bytes, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
}

float *zt_test_dev_random(zt_test_dev *d, zt_test_rng *r, size_t n, double std) {
    float *h = zt_test_random(r, n, 0.0, std);
    float *p = zt_test_dev_f32(d, h, n);
    free(h);
    return p;
}

void zt_test_dev_get_f32(zt_test_dev *d, float *host, const float *dev, size_t n) {
    zt_backend_copy(d->be, host, dev, n * sizeof(float), ZT_COPY_D2H, ZT_STREAM_COMPUTE);
}

void zt_test_dev_get_act(zt_test_dev *d, float *host, const void *dev, size_t n) {
    size_t es = zt_test_act_size(d->be, d->ctx.act);
    if (es == sizeof(float)) {
        zt_backend_copy(d->be, host, dev, n * es, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
        return;
    }
    uint16_t *h = must(calloc(n ? n : 1, sizeof *h));
    zt_backend_copy(d->be, h, dev, n * es, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    for (size_t i = 0; i < n; i++)
        host[i] = zt_test_decode(h[i], d->ctx.act);
    free(h);
}

void zt_test_dev_finish(zt_test_dev *d) {
    zt_status s = zt_backend_sync(d->be);
    CHECK_AT(s == ZT_OK, "%s: zt_backend_sync: %s", d->be->name, zt_last_error());
    for (int i = 0; i < d->n; i++)
        zt_backend_free(d->be, ZT_MEM_DEVICE, d->p[i], d->bytes[i]);
    d->n = 0;
}

/* ---- the op table by name -------------------------------------------------------------------- */

typedef void (*any_fn)(void);

#define ENTRY(f) {#f, offsetof(zt_ops, f)}
static const struct {
    const char *name;
    size_t offset;
} entries[] = {
    ENTRY(embedding_forward), ENTRY(embedding_backward), ENTRY(layernorm_forward),
    ENTRY(layernorm_backward), ENTRY(rmsnorm_forward),   ENTRY(rmsnorm_backward),
    ENTRY(rope_forward),      ENTRY(rope_backward),      ENTRY(linear_forward),
    ENTRY(linear_backward),   ENTRY(linear_gelu_forward), ENTRY(linear_backward_gelu),
    ENTRY(attention_forward), ENTRY(attention_backward),
    ENTRY(gelu_forward),      ENTRY(gelu_backward),      ENTRY(silu_mul_forward),
    ENTRY(silu_mul_backward), ENTRY(add),                ENTRY(softmax_xent),
    ENTRY(xent_partial_stats), ENTRY(xent_partial_grad), ENTRY(xent_partial_combine),
    ENTRY(adam_update),       ENTRY(sgd_update),         ENTRY(adam_update_mixed),
    ENTRY(sgd_update_mixed),  ENTRY(lamb_moments),       ENTRY(lamb_apply),
    ENTRY(lamb_moments_to),   ENTRY(lamb_steps),
    ENTRY(lamb_apply_mixed),
    ENTRY(sum_squares),       ENTRY(scale),              ENTRY(to_half),
    ENTRY(from_half),         ENTRY(round_to),           ENTRY(accumulate_half),
    ENTRY(sum_squares_half), ENTRY(sum_to),           ENTRY(weighted_sum_to),
};

/* zt_ops is a struct of function pointers only: an entry added to ops.h and not listed here
 * stops the build, so no op goes unchecked by accident. */
_Static_assert(sizeof entries / sizeof entries[0] == sizeof(zt_ops) / sizeof(any_fn),
               "every zt_ops entry is listed in entries[]");

int zt_test_entry_count(void) { return (int)(sizeof entries / sizeof entries[0]); }

const char *zt_test_entry_name(int i) { return entries[i].name; }

bool zt_test_has(const zt_backend *be, const char *entry) {
    for (int i = 0; i < zt_test_entry_count(); i++) {
        if (strcmp(entries[i].name, entry) != 0)
            continue;
        any_fn f;
        memcpy(&f, (const char *)be->ops + entries[i].offset, sizeof f);
        return f != NULL;
    }
    ZT_ASSERT(!"an entry name the harness does not know");
    return false;
}

bool zt_test_each_backend(const zt_test_env *env, const char *family, const char *const *names,
                          bool act_matters, zt_test_compare_fn compare) {
    static const zt_dtype acts[] = {ZT_F32, ZT_BF16, ZT_F16};
    zt_backend *cpu = env->be[0];
    bool cpu_has = true;
    for (const char *const *e = names; *e; e++)
        cpu_has = cpu_has && zt_test_has(cpu, *e);
    for (int b = 0; b < env->n; b++) {
        zt_backend *be = env->be[b];
        const char *missing = NULL;
        for (const char *const *e = names; *e && !missing; e++)
            if (!zt_test_has(be, *e))
                missing = *e;
        if (missing) {
            printf("%-18s %-5s not implemented (%s is NULL)\n", family, be->name, missing);
            continue;
        }
        /* The CPU's kernels are the reference of every other backend's (STYLE.md). */
        if (!CHECK_AT(cpu_has, "%s: %s has it but the CPU, its reference, does not", family,
                      be->name))
            continue;
        for (int a = 0; a < (act_matters ? 3 : 1); a++) {
            zt_test_rng r = zt_test_rng_for(family, (uint64_t)(b * 16 + a));
            compare(cpu, be, acts[a], &r);
        }
    }
    return cpu_has;
}

/* ---- finite differences ---------------------------------------------------------------------- */

void zt_test_fd_at(const char *file, int line, double *x, size_t n, const float *grad,
                   const float *base, zt_test_loss_fn loss, void *state, int samples,
                   zt_test_rng *r, const char *fmt, ...) {
    size_t m = n <= (size_t)samples ? n : (size_t)samples;
    size_t *idx = must(calloc(m ? m : 1, sizeof *idx));
    double *fd = must(calloc(m ? m : 1, sizeof *fd));
    for (size_t k = 0; k < m; k++) {
        size_t i = m == n ? k : (size_t)(zt_test_next(r) % n);
        double x0 = x[i], h = 1e-4 * fmax(1.0, fabs(x0));
        double xp = x0 + h, xm = x0 - h;
        x[i] = xp;
        double lp = loss(state);
        x[i] = xm;
        double lm = loss(state);
        x[i] = x0;
        idx[k] = i;
        fd[k] = (lp - lm) / (xp - xm);
    }
    double ss = 0.0;
    for (size_t k = 0; k < m; k++)
        ss += fd[k] * fd[k];
    double rms = m ? sqrt(ss / m) : 0.0;
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    for (size_t k = 0; k < m; k++) {
        size_t i = idx[k];
        double got = (double)grad[i] - (base ? base[i] : 0.0);
        /* An accumulated output carries the rounding of its sum, up to half a unit of the larger
         * addend's magnitude. */
        double slack = base ? 0x1p-24 * (fabs(base[i]) + fabs(grad[i])) : 0.0;
        double bound = ZT_TEST_TOL_FD * (fabs(fd[k]) + rms) + slack, err = fabs(got - fd[k]);
        bool ok = err <= bound;
        double ratio = !ok && err != err ? INFINITY : err == 0 ? 0 : err / bound;
        bad += !ok;
        if (ratio > worst_ratio || (!ok && bad == 1))
            worst = k, worst_ratio = ratio;
    }
    char what[1024] = "";
    if (bad || zt_test_margins) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
    }
    if (zt_test_margins)
        printf("margin %.3f of fd tol %.3g: %s\n", worst_ratio, ZT_TEST_TOL_FD, what);
    zt_test_check_at(file, line, bad == 0,
             "%s: %zu of %zu sampled gradients beyond tol %.3g of the finite differences (rms "
             "%.4g); worst [%zu] got %.9g, finite difference %.9g",
             what, bad, m, ZT_TEST_TOL_FD, rms, m ? idx[worst] : 0,
             m ? (double)grad[idx[worst]] - (base ? base[idx[worst]] : 0.0) : 0.0,
             m ? fd[worst] : 0.0);
    free(idx);
    free(fd);
}

/* ---- --perf ---------------------------------------------------------------------------------- */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double zt_test_time_ms(zt_backend *be, void (*fn)(void *arg), void *arg, int reps) {
    fn(arg);
    zt_status s = zt_backend_sync(be);
    CHECK_AT(s == ZT_OK, "%s: zt_backend_sync: %s", be->name, zt_last_error());
    double *t = must(calloc((size_t)reps, sizeof *t));
    for (int k = 0; k < reps; k++) {
        double t0 = now_ms();
        fn(arg);
        zt_backend_sync(be);
        t[k] = now_ms() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    free(t);
    return med;
}

void zt_test_perf_row(const char *op, const zt_backend *be, const char *shape, double ms,
                      double gbytes, double gflop) {
    char rate[32] = "";
    if (gflop > 0)
        snprintf(rate, sizeof rate, "%8.1f GFLOP/s", gflop / (ms * 1e-3));
    else if (gbytes > 0)
        snprintf(rate, sizeof rate, "%8.1f GB/s", gbytes / (ms * 1e-3));
    printf("%-24s %-5s %-36s %10.3f  %s\n", op, be->name, shape, ms, rate);
}
