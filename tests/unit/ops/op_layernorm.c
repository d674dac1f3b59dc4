/* layernorm_forward and layernorm_backward: every backend against the CPU, the CPU against a
 * double-precision reference and its finite differences (with and without a bias, into
 * gradients that already hold values), and outputs held at 16 bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

typedef struct {
    int N, C;
    float *inp, *w, *b;             /* [N,C] at the case's precision, [C], [C] (b may be NULL) */
    float *dout;                    /* [N,C] at the case's precision */
    float *dinp0, *dw0, *db0;       /* what the accumulated gradients hold before the backward */
} ln_case;

typedef struct {
    float *out, *mean, *rstd, *dinp, *dw, *db;
} ln_result;

/* Rows with their own offset and spread, so that the mean and the scale both matter. */
static ln_case ln_make(zt_test_rng *r, int N, int C, bool bias, zt_dtype act) {
    size_t n = (size_t)N * C;
    ln_case c = {.N = N, .C = C};
    c.inp = zt_test_zeros(n);
    for (int i = 0; i < N; i++) {
        double mu = 2.0 * zt_test_normal(r), sd = 0.5 + 2.5 * zt_test_uniform(r);
        for (int j = 0; j < C; j++)
            c.inp[(size_t)i * C + j] = (float)(mu + sd * zt_test_normal(r));
    }
    zt_test_round_all(c.inp, n, act);
    c.w = zt_test_random(r, C, 1.0, 0.3);
    c.b = bias ? zt_test_random(r, C, 0.0, 0.2) : NULL;
    c.dout = zt_test_random(r, n, 0.0, 1.0);
    zt_test_round_all(c.dout, n, act);
    c.dinp0 = zt_test_random(r, n, 0.0, 0.5);
    zt_test_round_all(c.dinp0, n, act);
    c.dw0 = zt_test_random(r, C, 0.0, 0.5);
    c.db0 = bias ? zt_test_random(r, C, 0.0, 0.5) : NULL;
    return c;
}

static void ln_free_result(ln_result *x) {
    free(x->out), free(x->mean), free(x->rstd), free(x->dinp), free(x->dw), free(x->db);
}

static void ln_free(ln_case *c) {
    free(c->inp), free(c->w), free(c->b), free(c->dout), free(c->dinp0), free(c->dw0),
        free(c->db0);
}

/* The forward, then the backward from the statistics the forward saved, on be at act. */
static ln_result ln_run(zt_backend *be, zt_dtype act, const ln_case *c) {
    size_t n = (size_t)c->N * c->C;
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    void *out = zt_test_dev_alloc(&d, n * zt_test_act_size(be, act));
    float *mean = zt_test_dev_alloc(&d, c->N * sizeof(float));
    float *rstd = zt_test_dev_alloc(&d, c->N * sizeof(float));
    void *inp = zt_test_dev_act(&d, c->inp, n);
    float *w = zt_test_dev_f32(&d, c->w, c->C), *b = zt_test_dev_f32(&d, c->b, c->C);
    be->ops->layernorm_forward(&d.ctx, out, mean, rstd, inp, w, b, c->N, c->C);
    void *dinp = zt_test_dev_act(&d, c->dinp0, n), *dout = zt_test_dev_act(&d, c->dout, n);
    float *dw = zt_test_dev_f32(&d, c->dw0, c->C), *db = zt_test_dev_f32(&d, c->db0, c->C);
    be->ops->layernorm_backward(&d.ctx, dinp, dw, db, dout, inp, w, mean, rstd, c->N, c->C);
    ln_result x = {zt_test_zeros(n),      zt_test_zeros(c->N), zt_test_zeros(c->N),
                   zt_test_zeros(n),      zt_test_zeros(c->C), c->b ? zt_test_zeros(c->C) : NULL};
    zt_test_dev_get_act(&d, x.out, out, n);
    zt_test_dev_get_f32(&d, x.mean, mean, c->N);
    zt_test_dev_get_f32(&d, x.rstd, rstd, c->N);
    zt_test_dev_get_act(&d, x.dinp, dinp, n);
    zt_test_dev_get_f32(&d, x.dw, dw, c->C);
    if (db)
        zt_test_dev_get_f32(&d, x.db, db, c->C);
    zt_test_dev_finish(&d);
    return x;
}

/* A GPU takes the parameter gradients in the backward's own kernel, a block per tile of
 * ceil(N / 1024) consecutive rows but 32 at least, or in two passes of their own for rows whose
 * accumulators take more than 32 KiB (kernels/cuda/channel_sums.cuh). Beside small shapes (one
 * tile of every row), case 5 has channels not a multiple of a 16-byte chunk and 6 tiles of 32
 * rows and a last one of 5, case 6 has 64 tiles of 32 rows and a last one of 3, and case 7 rows
 * of 4100 channels, which take the two
 * passes (4096 would still fit). Cases 5 and 6 run twice on be, whose parameter gradients must
 * agree bit for bit (the sums' order is fixed), and once more into zeroed gradients, which must
 * differ from the first run's by the held values alone: dw = dw0 + S, rounded once. */
static void ln_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    for (int k = 0; k < 8; k++) {
        int N = (k == 0 ? 1 : zt_test_int(r, 2, 3)) * zt_test_int(r, 1, 9);
        N = k == 5 ? 197 : k == 6 ? 2051 : k == 7 ? 3 : N;
        int C = k == 7 ? 4100 : k == 4 ? 263 : k >= 5 ? 45 : k == 3 ? 64 : zt_test_int(r, 1, 70);
        bool bias = k != 1;
        ln_case c = ln_make(r, N, C, bias, act);
        ln_result want = ln_run(cpu, act, &c), got = ln_run(be, act, &c);
        char at[128];
        snprintf(at, sizeof at, "layernorm %s vs cpu at %s, N=%d C=%d%s", be->name,
                 zt_dtype_name(act), N, C, bias ? "" : " b=NULL");
        double tol = zt_test_tol(act);
        size_t n = (size_t)N * C;
        CHECK_CLOSE(got.out, want.out, n, tol, "%s: out", at);
        CHECK_CLOSE(got.mean, want.mean, N, tol, "%s: mean", at);
        CHECK_CLOSE(got.rstd, want.rstd, N, tol, "%s: rstd", at);
        CHECK_CLOSE(got.dinp, want.dinp, n, tol, "%s: dinp", at);
        CHECK_CLOSE(got.dw, want.dw, C, tol, "%s: dw", at);
        if (bias)
            CHECK_CLOSE(got.db, want.db, C, tol, "%s: db", at);
        if (k == 5 || k == 6) {
            ln_result again = ln_run(be, act, &c);
            CHECK_SAME(again.dw, got.dw, C, "%s: dw run twice", at);
            CHECK_SAME(again.db, got.db, C, "%s: db run twice", at);
            ln_free_result(&again);
            ln_case z = c;
            z.dw0 = zt_test_zeros(C), z.db0 = zt_test_zeros(C);
            ln_result sums = ln_run(be, act, &z);
            for (int j = 0; j < C; j++) {
                sums.dw[j] = c.dw0[j] + sums.dw[j];
                sums.db[j] = c.db0[j] + sums.db[j];
            }
            CHECK_SAME(got.dw, sums.dw, C, "%s: dw is dw0 + the sum from zero", at);
            CHECK_SAME(got.db, sums.db, C, "%s: db is db0 + the sum from zero", at);
            free(z.dw0), free(z.db0), ln_free_result(&sums);
        }
        ln_free_result(&want), ln_free_result(&got), ln_free(&c);
    }
}

/* ---- the double-precision reference ---------------------------------------------------------- */

typedef struct {
    int N, C;
    double *inp, *w, *b, *r; /* b NULL without a bias; r is the dout the backward was fed */
} ln_ref;

static void ln_ref_forward(const ln_ref *s, double *out, double *mean, double *rstd) {
    for (int i = 0; i < s->N; i++) {
        const double *x = s->inp + (size_t)i * s->C;
        double m = 0.0, var = 0.0;
        for (int j = 0; j < s->C; j++)
            m += x[j];
        m /= s->C;
        for (int j = 0; j < s->C; j++)
            var += (x[j] - m) * (x[j] - m);
        double rs = 1.0 / sqrt(var / s->C + 1e-5);
        for (int j = 0; j < s->C; j++)
            out[(size_t)i * s->C + j] = (x[j] - m) * rs * s->w[j] + (s->b ? s->b[j] : 0.0);
        if (mean)
            mean[i] = m, rstd[i] = rs;
    }
}

static double ln_ref_loss(void *state) {
    ln_ref *s = state;
    size_t n = (size_t)s->N * s->C;
    double *out = calloc(n, sizeof *out), l = 0.0;
    ln_ref_forward(s, out, NULL, NULL);
    for (size_t i = 0; i < n; i++)
        l += out[i] * s->r[i];
    free(out);
    return l;
}

/* Shapes on both sides of the 16-channel bands of the weight gradient, three channels and a
 * single row. (With one or two channels the normalised row is constant, so the true input
 * gradient is zero and the backward's cancellation leaves only rounding residue, which no
 * relative bound can judge; the comparison between backends still runs them.) */
static void ln_grad(zt_backend *cpu, zt_test_rng *r) {
    static const int shapes[][2] = {{7, 37}, {1, 16}, {5, 3}, {12, 9}, {3, 70}};
    for (int k = 0; k < 5; k++) {
        int N = shapes[k][0], C = shapes[k][1];
        bool bias = k != 3;
        ln_case c = ln_make(r, N, C, bias, ZT_F32);
        ln_result got = ln_run(cpu, ZT_F32, &c);
        size_t n = (size_t)N * C;
        ln_ref s = {N, C, zt_test_widen(c.inp, n), zt_test_widen(c.w, C),
                    bias ? zt_test_widen(c.b, C) : NULL, zt_test_widen(c.dout, n)};
        double *out = calloc(n, sizeof *out), *mean = calloc(N, sizeof *mean),
               *rstd = calloc(N, sizeof *rstd);
        ln_ref_forward(&s, out, mean, rstd);
        char at[96];
        snprintf(at, sizeof at, "layernorm cpu N=%d C=%d%s", N, C, bias ? "" : " b=NULL");
        CHECK_CLOSE(got.out, out, n, ZT_TEST_TOL_FWD, "%s: out against the reference", at);
        CHECK_CLOSE(got.mean, mean, N, ZT_TEST_TOL_FWD, "%s: mean against the reference", at);
        CHECK_CLOSE(got.rstd, rstd, N, ZT_TEST_TOL_FWD, "%s: rstd against the reference", at);
        CHECK_FD(s.inp, n, got.dinp, c.dinp0, ln_ref_loss, &s, 200, r, "%s: dinp (accumulated)",
                 at);
        CHECK_FD(s.w, C, got.dw, c.dw0, ln_ref_loss, &s, 200, r, "%s: dw (accumulated)", at);
        if (bias)
            CHECK_FD(s.b, C, got.db, c.db0, ln_ref_loss, &s, 200, r, "%s: db (accumulated)", at);
        free(out), free(mean), free(rstd);
        free(s.inp), free(s.w), free(s.b), free(s.r);
        ln_free_result(&got), ln_free(&c);
    }
}

/* At 16 bits, out and the accumulated dinp are held; the statistics and parameter gradients are
 * those of fp32 activations. */
static void ln_held(zt_backend *cpu, zt_test_rng *r) {
    for (zt_dtype t = ZT_BF16; t <= ZT_F16; t++) {
        int N = 6, C = 45;
        size_t n = (size_t)N * C;
        ln_case c = ln_make(r, N, C, true, t);
        ln_result f32 = ln_run(cpu, ZT_F32, &c), held = ln_run(cpu, t, &c);
        const char *tn = zt_dtype_name(t);
        CHECK_HELD(cpu, t, held.out, f32.out, n, "layernorm at %s: out", tn);
        CHECK_HELD(cpu, t, held.dinp, f32.dinp, n, "layernorm at %s: dinp", tn);
        CHECK_SAME(held.mean, f32.mean, N, "layernorm at %s: mean", tn);
        CHECK_SAME(held.rstd, f32.rstd, N, "layernorm at %s: rstd", tn);
        CHECK_SAME(held.dw, f32.dw, C, "layernorm at %s: dw", tn);
        CHECK_SAME(held.db, f32.db, C, "layernorm at %s: db", tn);
        ln_free_result(&f32), ln_free_result(&held), ln_free(&c);
    }
}

static const char *const entries[] = {"layernorm_forward", "layernorm_backward", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "layernorm", entries, true, ln_compare))
        return;
    zt_test_rng r = zt_test_rng_for("layernorm/cpu", 0);
    ln_grad(env->be[0], &r);
    ln_held(env->be[0], &r);
}

/* ---- --perf: one of GPT-2 small's LayerNorms over B=4, T=256 --------------------------------- */

typedef struct {
    zt_ctx ctx;
    void *out, *inp, *dinp, *dout;
    float *w, *b, *mean, *rstd, *dw, *db;
    int N, C;
} ln_perf;

static void ln_perf_forward(void *arg) {
    ln_perf *p = arg;
    p->ctx.be->ops->layernorm_forward(&p->ctx, p->out, p->mean, p->rstd, p->inp, p->w, p->b, p->N,
                                      p->C);
}

static void ln_perf_backward(void *arg) {
    ln_perf *p = arg;
    p->ctx.be->ops->layernorm_backward(&p->ctx, p->dinp, p->dw, p->db, p->dout, p->inp, p->w,
                                       p->mean, p->rstd, p->N, p->C);
}

static void perf(zt_backend *be) {
    if (!zt_test_has(be, "layernorm_forward") || !zt_test_has(be, "layernorm_backward"))
        return;
    const int N = 4 * 256, C = 768;
    size_t n = (size_t)N * C;
    zt_test_rng r = zt_test_rng_for("layernorm/perf", 0);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    ln_perf p = {d.ctx, .N = N, .C = C};
    p.out = zt_test_dev_alloc(&d, n * sizeof(float));
    p.dinp = zt_test_dev_alloc(&d, n * sizeof(float));
    p.inp = zt_test_dev_random(&d, &r, n, 1.0);
    p.dout = zt_test_dev_random(&d, &r, n, 1.0);
    p.w = zt_test_dev_random(&d, &r, C, 1.0);
    p.b = zt_test_dev_random(&d, &r, C, 1.0);
    p.dw = zt_test_dev_alloc(&d, C * sizeof(float));
    p.db = zt_test_dev_alloc(&d, C * sizeof(float));
    p.mean = zt_test_dev_alloc(&d, N * sizeof(float));
    p.rstd = zt_test_dev_alloc(&d, N * sizeof(float));
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
    /* Bytes: the forward reads inp and writes out; the backward reads inp and dout and reads and
     * writes dinp, and on a GPU writes two partial rows of fp32 sums per tile of rows and reads
     * them back (a tile of 32 rows at this N: n / 8 floats). */
    double ms = zt_test_time_ms(be, ln_perf_forward, &p, 20);
    zt_test_perf_row("layernorm_forward", be, shape, ms, 2.0 * n * 4 / 1e9, 0);
    ms = zt_test_time_ms(be, ln_perf_backward, &p, 20);
    zt_test_perf_row("layernorm_backward", be, shape, ms, (4.0 + 1.0 / 8) * n * 4 / 1e9, 0);
    zt_test_dev_finish(&d);
}

const zt_test_family zt_test_layernorm = {"layernorm", entries, check, perf};
