/* silu_mul_forward and silu_mul_backward (the gate of Llama's SwiGLU MLP): every backend against
 * the CPU, outputs over their inputs too, gate and up as separate buffers and as the halves of
 * each row of one [rows, 2·cols] buffer (the Llama MLP's one gate|up product: row stride 2·cols),
 * the CPU against the double-precision formula and its finite differences, gates far enough out
 * that the exponential would overflow, and outputs held at 16 bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

typedef struct {
    size_t rows, cols, n; /* n = rows · cols */
    float *gate, *up, *dout; /* at the case's precision, dense [rows, cols] */
} silu_case;

typedef struct {
    float *out, *dgate, *dup;
    float *out_inplace;            /* the forward with out == gate */
    float *dgate_inplace, *dup_inplace; /* the backward with dgate == dout and dup == up */
    /* gate and up as the halves of each row of one buffer (ld = 2·cols), dense again */
    float *out_packed, *dgate_packed, *dup_packed;
    float *dgate_over, *dup_over; /* the packed backward written over gate and up */
} silu_result;

/* Gates over ±8 where the sigmoid bends and saturates, and every 11th out to ±100 (exp(100)
 * overflows fp32). */
static silu_case silu_make(zt_test_rng *r, size_t rows, size_t cols, zt_dtype act) {
    const size_t n = rows * cols;
    silu_case c = {rows, cols, n, zt_test_random(r, n, 0.0, 3.0), zt_test_random(r, n, 0.0, 1.0),
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
                free(res[i]->dgate_inplace), free(res[i]->dup_inplace), free(res[i]->out_packed),
                free(res[i]->dgate_packed), free(res[i]->dup_packed), free(res[i]->dgate_over),
                free(res[i]->dup_over);
}

/* Rows of a and b side by side: [rows, 2·cols]. */
static float *side_by_side(const float *a, const float *b, size_t rows, size_t cols) {
    float *p = zt_test_zeros(2 * rows * cols);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            p[r * 2 * cols + c] = a[r * cols + c];
            p[r * 2 * cols + cols + c] = b[r * cols + c];
        }
    return p;
}

/* Half h (0 or 1) of each row of p [rows, 2·cols], dense. */
static float *half_of(const float *p, int h, size_t rows, size_t cols) {
    float *x = zt_test_zeros(rows * cols);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            x[r * cols + c] = p[r * 2 * cols + (size_t)h * cols + c];
    return x;
}

static silu_result silu_run(zt_backend *be, zt_dtype act, const silu_case *c) {
    const size_t n = c->n, R = c->rows, C = c->cols, es = zt_test_act_size(be, act);
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
    be->ops->silu_mul_forward(&d.ctx, out, gate, up, R, C, C);
    be->ops->silu_mul_backward(&d.ctx, dgate, dup, dout, gate, up, R, C, C);
    be->ops->silu_mul_backward(&d.ctx, dout2, up2, dout2, gate2, up2, R, C, C);
    be->ops->silu_mul_forward(&d.ctx, gate2, gate2, up, R, C, C);
    /* The packed layout: gate | up in each row; the backward into a NaN-filled [R, 2C] buffer,
     * and once more over gu itself. */
    float *host_gu = side_by_side(c->gate, c->up, R, C), *nan2 = zt_test_nans(2 * n);
    void *gu = zt_test_dev_act(&d, host_gu, 2 * n), *gu2 = zt_test_dev_act(&d, host_gu, 2 * n);
    void *dgu = zt_test_dev_act(&d, nan2, 2 * n), *out3 = zt_test_dev_act(&d, nan2, n);
    free(host_gu), free(nan2);
    be->ops->silu_mul_forward(&d.ctx, out3, gu, (char *)gu + C * es, R, C, 2 * C);
    be->ops->silu_mul_backward(&d.ctx, dgu, (char *)dgu + C * es, dout, gu, (char *)gu + C * es,
                               R, C, 2 * C);
    be->ops->silu_mul_backward(&d.ctx, gu2, (char *)gu2 + C * es, dout, gu2,
                               (char *)gu2 + C * es, R, C, 2 * C);
    silu_result x = {.out = zt_test_zeros(n), .dgate = zt_test_zeros(n), .dup = zt_test_zeros(n),
                     .out_inplace = zt_test_zeros(n), .dgate_inplace = zt_test_zeros(n),
                     .dup_inplace = zt_test_zeros(n), .out_packed = zt_test_zeros(n)};
    float *dgu_host = zt_test_zeros(2 * n), *over_host = zt_test_zeros(2 * n);
    zt_test_dev_get_act(&d, x.out_packed, out3, n);
    zt_test_dev_get_act(&d, dgu_host, dgu, 2 * n);
    zt_test_dev_get_act(&d, over_host, gu2, 2 * n);
    x.dgate_packed = half_of(dgu_host, 0, R, C), x.dup_packed = half_of(dgu_host, 1, R, C);
    x.dgate_over = half_of(over_host, 0, R, C), x.dup_over = half_of(over_host, 1, R, C);
    free(dgu_host), free(over_host);
    zt_test_dev_get_act(&d, x.out, out, n);
    zt_test_dev_get_act(&d, x.dgate, dgate, n);
    zt_test_dev_get_act(&d, x.dup, dup, n);
    zt_test_dev_get_act(&d, x.out_inplace, gate2, n);
    zt_test_dev_get_act(&d, x.dgate_inplace, dout2, n);
    zt_test_dev_get_act(&d, x.dup_inplace, up2, n);
    zt_test_dev_finish(&d);
    return x;
}

/* rows × cols: single elements, odd widths whose rows start unaligned in the packed layout,
 * widths that are multiples of the vectors, and one row of more than a run (ZT_CPU_RUN). */
static const size_t shapes[][2] = {{1, 1}, {1, 7}, {9, 37}, {4, 1024}, {3, 1365}, {1, 17000}};
enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };

static void silu_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    for (int k = 0; k < N_SHAPES; k++) {
        silu_case c = silu_make(r, shapes[k][0], shapes[k][1], act);
        silu_result want = silu_run(cpu, act, &c), got = silu_run(be, act, &c);
        char at[96];
        snprintf(at, sizeof at, "silu_mul %s vs cpu at %s, %zux%zu", be->name,
                 zt_dtype_name(act), c.rows, c.cols);
        double tol = zt_test_tol(act);
        CHECK_CLOSE(got.out, want.out, c.n, tol, "%s: out", at);
        CHECK_CLOSE(got.dgate, want.dgate, c.n, tol, "%s: dgate", at);
        CHECK_CLOSE(got.dup, want.dup, c.n, tol, "%s: dup", at);
        CHECK_CLOSE(got.out_inplace, want.out, c.n, tol, "%s: out over gate", at);
        CHECK_CLOSE(got.dgate_inplace, want.dgate, c.n, tol, "%s: dgate over dout", at);
        CHECK_CLOSE(got.dup_inplace, want.dup, c.n, tol, "%s: dup over up", at);
        CHECK_CLOSE(got.out_packed, want.out, c.n, tol, "%s: out from gate|up rows", at);
        CHECK_CLOSE(got.dgate_packed, want.dgate, c.n, tol, "%s: dgate into gate|up rows", at);
        CHECK_CLOSE(got.dup_packed, want.dup, c.n, tol, "%s: dup into gate|up rows", at);
        CHECK_CLOSE(got.dgate_over, want.dgate, c.n, tol, "%s: dgate over gate|up rows", at);
        CHECK_CLOSE(got.dup_over, want.dup, c.n, tol, "%s: dup over gate|up rows", at);
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
    static const size_t sizes[][2] = {{1, 1}, {1, 61}, {11, 47}};
    for (int k = 0; k < 3; k++) {
        silu_case c = silu_make(r, sizes[k][0], sizes[k][1], ZT_F32);
        silu_result got = silu_run(cpu, ZT_F32, &c);
        silu_ref s = {c.n, zt_test_widen(c.gate, c.n), zt_test_widen(c.up, c.n),
                      zt_test_widen(c.dout, c.n)};
        double *out = calloc(c.n, sizeof *out);
        for (size_t i = 0; i < c.n; i++)
            out[i] = silu_ref_value(s.gate[i], s.up[i]);
        char at[64];
        snprintf(at, sizeof at, "silu_mul cpu %zux%zu", c.rows, c.cols);
        CHECK_CLOSE(got.out, out, c.n, ZT_TEST_TOL_FWD, "%s: out against the formula", at);
        CHECK_FD(s.gate, c.n, got.dgate, NULL, silu_ref_loss, &s, 200, r,
                 "%s: dgate (overwriting NaN)", at);
        CHECK_FD(s.up, c.n, got.dup, NULL, silu_ref_loss, &s, 200, r, "%s: dup (overwriting NaN)",
                 at);
        CHECK_SAME(got.out_inplace, got.out, c.n, "%s: out over gate", at);
        CHECK_SAME(got.dgate_inplace, got.dgate, c.n, "%s: dgate over dout", at);
        CHECK_SAME(got.dup_inplace, got.dup, c.n, "%s: dup over up", at);
        CHECK_SAME(got.out_packed, got.out, c.n, "%s: out from gate|up rows", at);
        CHECK_SAME(got.dgate_packed, got.dgate, c.n, "%s: dgate into gate|up rows", at);
        CHECK_SAME(got.dup_packed, got.dup, c.n, "%s: dup into gate|up rows", at);
        CHECK_SAME(got.dgate_over, got.dgate, c.n, "%s: dgate over gate|up rows", at);
        CHECK_SAME(got.dup_over, got.dup, c.n, "%s: dup over gate|up rows", at);
        free(out), free(s.gate), free(s.up), free(s.r);
        silu_free(&c, &got, NULL);
    }
}

static void silu_held(zt_backend *cpu, zt_test_rng *r) {
    for (zt_dtype t = ZT_BF16; t <= ZT_F16; t++) {
        silu_case c = silu_make(r, 7, 143, t);
        silu_result f32 = silu_run(cpu, ZT_F32, &c), held = silu_run(cpu, t, &c);
        const char *tn = zt_dtype_name(t);
        CHECK_HELD(cpu, t, held.out, f32.out, c.n, "silu_mul at %s: out", tn);
        CHECK_HELD(cpu, t, held.dgate, f32.dgate, c.n, "silu_mul at %s: dgate", tn);
        CHECK_HELD(cpu, t, held.dup, f32.dup, c.n, "silu_mul at %s: dup", tn);
        CHECK_HELD(cpu, t, held.out_inplace, f32.out, c.n, "silu_mul at %s: out over gate", tn);
        CHECK_HELD(cpu, t, held.out_packed, f32.out, c.n, "silu_mul at %s: out, gate|up rows", tn);
        CHECK_HELD(cpu, t, held.dgate_packed, f32.dgate, c.n, "silu_mul at %s: dgate, gate|up rows",
                   tn);
        CHECK_HELD(cpu, t, held.dup_packed, f32.dup, c.n, "silu_mul at %s: dup, gate|up rows", tn);
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

/* ---- --perf: a Llama-style MLP's gate over B=4, T=256 at width 2048, gate|up rows ------------ */

typedef struct {
    zt_ctx ctx;
    void *out, *gu, *dout, *dgu;
    size_t rows, cols;
} silu_perf;

static void *upper(const silu_perf *p, void *gu) {
    return (char *)gu + p->cols * sizeof(float);
}

static void silu_perf_forward(void *arg) {
    silu_perf *p = arg;
    p->ctx.be->ops->silu_mul_forward(&p->ctx, p->out, p->gu, upper(p, p->gu), p->rows, p->cols,
                                     2 * p->cols);
}

static void silu_perf_backward(void *arg) {
    silu_perf *p = arg;
    p->ctx.be->ops->silu_mul_backward(&p->ctx, p->dgu, upper(p, p->dgu), p->dout, p->gu,
                                      upper(p, p->gu), p->rows, p->cols, 2 * p->cols);
}

static void perf(zt_backend *be) {
    if (!zt_test_has(be, "silu_mul_forward") || !zt_test_has(be, "silu_mul_backward"))
        return;
    const size_t rows = (size_t)4 * 256, cols = 2048, n = rows * cols;
    zt_test_rng r = zt_test_rng_for("silu_mul/perf", 0);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    silu_perf p = {d.ctx, .rows = rows, .cols = cols};
    p.out = zt_test_dev_alloc(&d, n * sizeof(float));
    p.dgu = zt_test_dev_alloc(&d, 2 * n * sizeof(float));
    p.gu = zt_test_dev_random(&d, &r, 2 * n, 2.0);
    p.dout = zt_test_dev_random(&d, &r, n, 1.0);
    char shape[64];
    snprintf(shape, sizeof shape, "%zux%zu, gate|up rows", rows, cols);
    double ms = zt_test_time_ms(be, silu_perf_forward, &p, 20);
    zt_test_perf_row("silu_mul_forward", be, shape, ms, 3.0 * n * 4 / 1e9, 0);
    ms = zt_test_time_ms(be, silu_perf_backward, &p, 20);
    zt_test_perf_row("silu_mul_backward", be, shape, ms, 5.0 * n * 4 / 1e9, 0);
    zt_test_dev_finish(&d);
}

const zt_test_family zt_test_silu_mul = {"silu_mul", entries, check, perf};
