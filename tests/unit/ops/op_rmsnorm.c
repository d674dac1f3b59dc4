/* rmsnorm_forward and rmsnorm_backward (Llama's norm): every backend against the CPU, the CPU
 * against a double-precision reference and its finite differences (into gradients that already
 * hold values, with an eps small and large enough to matter), and outputs held at 16 bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <omp.h>

#include "harness.h"

typedef struct {
    int N, C;
    float eps;
    float *inp, *w;       /* [N,C] at the case's precision, [C] */
    float *dout;          /* [N,C] at the case's precision */
    float *dinp0, *dw0;   /* what the accumulated gradients hold before the backward */
} rms_case;

typedef struct {
    float *out, *rstd, *dinp, *dw;
} rms_result;

/* Rows of their own spread around an offset, so that the norm differs from a standard deviation
 * (a kernel that took the mean out would fail). */
static rms_case rms_make(zt_test_rng *r, int N, int C, double spread, float eps, zt_dtype act) {
    size_t n = (size_t)N * C;
    rms_case c = {.N = N, .C = C, .eps = eps};
    c.inp = zt_test_zeros(n);
    for (int i = 0; i < N; i++) {
        double mu = spread * zt_test_normal(r), sd = spread * (0.3 + zt_test_uniform(r));
        for (int j = 0; j < C; j++)
            c.inp[(size_t)i * C + j] = (float)(mu + sd * zt_test_normal(r));
    }
    zt_test_round_all(c.inp, n, act);
    c.w = zt_test_random(r, C, 1.0, 0.3);
    c.dout = zt_test_random(r, n, 0.0, 1.0);
    zt_test_round_all(c.dout, n, act);
    c.dinp0 = zt_test_random(r, n, 0.0, 0.5);
    zt_test_round_all(c.dinp0, n, act);
    c.dw0 = zt_test_random(r, C, 0.0, 0.5);
    return c;
}

static void rms_free_result(rms_result *x) {
    free(x->out), free(x->rstd), free(x->dinp), free(x->dw);
}

static void rms_free(rms_case *c) {
    free(c->inp), free(c->w), free(c->dout), free(c->dinp0), free(c->dw0);
}

/* The forward, then the backward from the rstd the forward saved, on be at act. */
static rms_result rms_run(zt_backend *be, zt_dtype act, const rms_case *c) {
    size_t n = (size_t)c->N * c->C;
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    void *out = zt_test_dev_alloc(&d, n * zt_test_act_size(be, act));
    float *rstd = zt_test_dev_alloc(&d, c->N * sizeof(float));
    void *inp = zt_test_dev_act(&d, c->inp, n);
    float *w = zt_test_dev_f32(&d, c->w, c->C);
    be->ops->rmsnorm_forward(&d.ctx, out, rstd, inp, w, c->eps, c->N, c->C);
    void *dinp = zt_test_dev_act(&d, c->dinp0, n), *dout = zt_test_dev_act(&d, c->dout, n);
    float *dw = zt_test_dev_f32(&d, c->dw0, c->C);
    be->ops->rmsnorm_backward(&d.ctx, dinp, dw, dout, inp, w, rstd, c->N, c->C);
    rms_result x = {zt_test_zeros(n), zt_test_zeros(c->N), zt_test_zeros(n), zt_test_zeros(c->C)};
    zt_test_dev_get_act(&d, x.out, out, n);
    zt_test_dev_get_f32(&d, x.rstd, rstd, c->N);
    zt_test_dev_get_act(&d, x.dinp, dinp, n);
    zt_test_dev_get_f32(&d, x.dw, dw, c->C);
    zt_test_dev_finish(&d);
    return x;
}

/* A GPU takes the weight gradient in the backward's own kernel, a block per tile of
 * ceil(N / 1024) consecutive rows but 32 at least, or in two passes of its own for rows whose
 * accumulators take more than 32 KiB (kernels/cuda/channel_sums.cuh). Beside small shapes (one
 * tile of every row), case 5 has channels not a multiple of a 16-byte chunk and 6 tiles of 32
 * rows and a last one of 5, case 6 has 64 tiles of 32 rows and a last one of 3, and case 7 rows
 * of 8200 channels, which take the two passes (8192
 * would still fit). Cases 5 and 6 run twice on be, whose weight gradients must agree bit for bit,
 * and once more into a zeroed gradient, which must differ from the first run's by the held
 * values alone: dw = dw0 + S, rounded once. */
static void rms_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    for (int k = 0; k < 8; k++) {
        int N = (k == 0 ? 1 : zt_test_int(r, 2, 3)) * zt_test_int(r, 1, 9);
        N = k == 5 ? 197 : k == 6 ? 2051 : k == 7 ? 3 : N;
        int C = k == 7 ? 8200 : k == 4 ? 263 : k >= 5 ? 45 : k == 3 ? 64 : zt_test_int(r, 1, 70);
        rms_case c = rms_make(r, N, C, 1.5, k == 2 ? 1e-2f : 1e-6f, act);
        rms_result want = rms_run(cpu, act, &c), got = rms_run(be, act, &c);
        char at[128];
        snprintf(at, sizeof at, "rmsnorm %s vs cpu at %s, N=%d C=%d eps=%g", be->name,
                 zt_dtype_name(act), N, C, (double)c.eps);
        double tol = zt_test_tol(act);
        size_t n = (size_t)N * C;
        CHECK_CLOSE(got.out, want.out, n, tol, "%s: out", at);
        CHECK_CLOSE(got.rstd, want.rstd, N, tol, "%s: rstd", at);
        CHECK_CLOSE(got.dinp, want.dinp, n, tol, "%s: dinp", at);
        CHECK_CLOSE(got.dw, want.dw, C, tol, "%s: dw", at);
        if (k == 5 || k == 6) {
            rms_result again = rms_run(be, act, &c);
            CHECK_SAME(again.dw, got.dw, C, "%s: dw run twice", at);
            rms_free_result(&again);
            rms_case z = c;
            z.dw0 = zt_test_zeros(C);
            rms_result sums = rms_run(be, act, &z);
            for (int j = 0; j < C; j++)
                sums.dw[j] = c.dw0[j] + sums.dw[j];
            CHECK_SAME(got.dw, sums.dw, C, "%s: dw is dw0 + the sum from zero", at);
            free(z.dw0), rms_free_result(&sums);
        }
        rms_free_result(&want), rms_free_result(&got), rms_free(&c);
    }
}

/* ---- the double-precision reference ---------------------------------------------------------- */

typedef struct {
    int N, C;
    double eps;
    double *inp, *w, *r; /* r is the dout the backward was fed */
} rms_ref;

static void rms_ref_forward(const rms_ref *s, double *out, double *rstd) {
    for (int i = 0; i < s->N; i++) {
        const double *x = s->inp + (size_t)i * s->C;
        double ms = 0.0;
        for (int j = 0; j < s->C; j++)
            ms += x[j] * x[j];
        double rs = 1.0 / sqrt(ms / s->C + s->eps);
        for (int j = 0; j < s->C; j++)
            out[(size_t)i * s->C + j] = x[j] * rs * s->w[j];
        if (rstd)
            rstd[i] = rs;
    }
}

static double rms_ref_loss(void *state) {
    rms_ref *s = state;
    size_t n = (size_t)s->N * s->C;
    double *out = calloc(n, sizeof *out), l = 0.0;
    rms_ref_forward(s, out, NULL);
    for (size_t i = 0; i < n; i++)
        l += out[i] * s->r[i];
    free(out);
    return l;
}

/* Shapes on both sides of the 16-channel bands of the weight gradient, a single channel (whose
 * normalised value is ±1 when eps is small: the input gradient is nearly zero there, so a
 * larger eps keeps it measurable), a single row, an eps that dominates small inputs, and rows
 * enough for several chunks of the weight gradient's partial sums (4 of 25 rows) and for their
 * cap (64 chunks of 33 rows, the last one shorter). */
static void rms_grad(zt_backend *cpu, zt_test_rng *r) {
    static const struct {
        int N, C;
        double spread;
        float eps;
    } cases[] = {{7, 37, 1.5, 1e-6f}, {1, 16, 1.0, 1e-5f}, {5, 1, 0.5, 0.1f},
                 {12, 9, 2.0, 1e-6f}, {3, 70, 0.1, 0.05f}, {100, 20, 1.0, 1e-5f},
                 {2100, 3, 1.0, 1e-5f}};
    for (int k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
        int N = cases[k].N, C = cases[k].C;
        rms_case c = rms_make(r, N, C, cases[k].spread, cases[k].eps, ZT_F32);
        rms_result got = rms_run(cpu, ZT_F32, &c);
        size_t n = (size_t)N * C;
        rms_ref s = {N, C, c.eps, zt_test_widen(c.inp, n), zt_test_widen(c.w, C),
                     zt_test_widen(c.dout, n)};
        double *out = calloc(n, sizeof *out), *rstd = calloc(N, sizeof *rstd);
        rms_ref_forward(&s, out, rstd);
        char at[96];
        snprintf(at, sizeof at, "rmsnorm cpu N=%d C=%d eps=%g", N, C, (double)c.eps);
        CHECK_CLOSE(got.out, out, n, ZT_TEST_TOL_FWD, "%s: out against the reference", at);
        CHECK_CLOSE(got.rstd, rstd, N, ZT_TEST_TOL_FWD, "%s: rstd against the reference", at);
        CHECK_FD(s.inp, n, got.dinp, c.dinp0, rms_ref_loss, &s, 200, r, "%s: dinp (accumulated)",
                 at);
        CHECK_FD(s.w, C, got.dw, c.dw0, rms_ref_loss, &s, 200, r, "%s: dw (accumulated)", at);
        /* The partial sums are cut by rows, not by threads: one thread gives the same bits. */
        int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        rms_result one = rms_run(cpu, ZT_F32, &c);
        omp_set_num_threads(threads);
        CHECK_SAME(one.dw, got.dw, C, "%s: dw on one thread", at);
        CHECK_SAME(one.dinp, got.dinp, n, "%s: dinp on one thread", at);
        rms_free_result(&one);
        free(out), free(rstd);
        free(s.inp), free(s.w), free(s.r);
        rms_free_result(&got), rms_free(&c);
    }
}

/* At 16 bits, out and the accumulated dinp are held; rstd and dw are those of fp32 activations. */
static void rms_held(zt_backend *cpu, zt_test_rng *r) {
    for (zt_dtype t = ZT_BF16; t <= ZT_F16; t++) {
        int N = 6, C = 45;
        size_t n = (size_t)N * C;
        rms_case c = rms_make(r, N, C, 1.5, 1e-5f, t);
        rms_result f32 = rms_run(cpu, ZT_F32, &c), held = rms_run(cpu, t, &c);
        const char *tn = zt_dtype_name(t);
        CHECK_HELD(cpu, t, held.out, f32.out, n, "rmsnorm at %s: out", tn);
        CHECK_HELD(cpu, t, held.dinp, f32.dinp, n, "rmsnorm at %s: dinp", tn);
        CHECK_SAME(held.rstd, f32.rstd, N, "rmsnorm at %s: rstd", tn);
        CHECK_SAME(held.dw, f32.dw, C, "rmsnorm at %s: dw", tn);
        rms_free_result(&f32), rms_free_result(&held), rms_free(&c);
    }
}

static const char *const entries[] = {"rmsnorm_forward", "rmsnorm_backward", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "rmsnorm", entries, true, rms_compare))
        return;
    zt_test_rng r = zt_test_rng_for("rmsnorm/cpu", 0);
    rms_grad(env->be[0], &r);
    rms_held(env->be[0], &r);
}

/* ---- --perf: a Llama-style RMSNorm over B=4, T=256 at width 768 ----------------------------- */

typedef struct {
    zt_ctx ctx;
    void *out, *inp, *dinp, *dout;
    float *w, *rstd, *dw;
    int N, C;
} rms_perf;

static void rms_perf_forward(void *arg) {
    rms_perf *p = arg;
    p->ctx.be->ops->rmsnorm_forward(&p->ctx, p->out, p->rstd, p->inp, p->w, 1e-6f, p->N, p->C);
}

static void rms_perf_backward(void *arg) {
    rms_perf *p = arg;
    p->ctx.be->ops->rmsnorm_backward(&p->ctx, p->dinp, p->dw, p->dout, p->inp, p->w, p->rstd,
                                     p->N, p->C);
}

static void perf(zt_backend *be) {
    if (!zt_test_has(be, "rmsnorm_forward") || !zt_test_has(be, "rmsnorm_backward"))
        return;
    const int N = 4 * 256, C = 768;
    size_t n = (size_t)N * C;
    zt_test_rng r = zt_test_rng_for("rmsnorm/perf", 0);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    rms_perf p = {d.ctx, .N = N, .C = C};
    p.out = zt_test_dev_alloc(&d, n * sizeof(float));
    p.dinp = zt_test_dev_alloc(&d, n * sizeof(float));
    p.inp = zt_test_dev_random(&d, &r, n, 1.0);
    p.dout = zt_test_dev_random(&d, &r, n, 1.0);
    p.w = zt_test_dev_random(&d, &r, C, 1.0);
    p.dw = zt_test_dev_alloc(&d, C * sizeof(float));
    p.rstd = zt_test_dev_alloc(&d, N * sizeof(float));
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
    /* Bytes: the forward reads inp and writes out; the backward reads inp and dout and reads and
     * writes dinp, and on a GPU writes a partial row of fp32 sums per tile of rows and reads
     * it back (a tile of 32 rows at this N: n / 16 floats). */
    double ms = zt_test_time_ms(be, rms_perf_forward, &p, 20);
    zt_test_perf_row("rmsnorm_forward", be, shape, ms, 2.0 * n * 4 / 1e9, 0);
    ms = zt_test_time_ms(be, rms_perf_backward, &p, 20);
    zt_test_perf_row("rmsnorm_backward", be, shape, ms, (4.0 + 1.0 / 16) * n * 4 / 1e9, 0);
    zt_test_dev_finish(&d);
}

const zt_test_family zt_test_rmsnorm = {"rmsnorm", entries, check, perf};
