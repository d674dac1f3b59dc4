/* linear_forward and linear_backward in both weight layouts: every backend against the CPU, the
 * CPU against a double-precision reference and its finite differences (bias or none, residual or
 * none, dinp overwritten or accumulated, gradients left out), and outputs held at 16 bits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct {
    int N, C, OC;
    zt_weight_layout layout;
    bool acc;                  /* accumulate_dinp */
    int calls;                 /* backward calls into the same gradients (accumulating) */
    float *inp, *w, *bias;     /* [N,C] at the case's precision, [C,OC] or [OC,C], [OC] or NULL */
    float *res;                /* [N,OC] at the case's precision, or NULL */
    float *dout;               /* [N,OC] at the case's precision */
    /* What the gradients hold before the backward (NULL: that gradient is not asked for).
     * Without acc, dinp0 is NaN, which an overwrite must not read. */
    float *dinp0, *dw0, *dbias0;
} lin_case;

typedef struct {
    float *out, *dinp, *dw, *dbias;
} lin_result;

/* What a case asks for: which optional inputs it has and which gradients it computes. */
enum { L_BIAS = 1, L_RES = 2, L_ACC = 4, L_NO_DINP = 8, L_NO_DW = 16 };

static lin_case lin_make(zt_test_rng *r, int N, int C, int OC, zt_weight_layout layout, int flags,
                         zt_dtype act) {
    size_t ni = (size_t)N * C, no = (size_t)N * OC, nw = (size_t)C * OC;
    lin_case c = {.N = N, .C = C, .OC = OC, .layout = layout, .acc = (flags & L_ACC) != 0,
                  .calls = 1};
    c.inp = zt_test_random(r, ni, 0.0, 1.0);
    zt_test_round_all(c.inp, ni, act);
    c.w = zt_test_random(r, nw, 0.0, 0.3);
    c.bias = flags & L_BIAS ? zt_test_random(r, OC, 0.0, 0.5) : NULL;
    if (flags & L_RES) {
        c.res = zt_test_random(r, no, 0.0, 1.0);
        zt_test_round_all(c.res, no, act);
    }
    c.dout = zt_test_random(r, no, 0.0, 1.0);
    zt_test_round_all(c.dout, no, act);
    if (!(flags & L_NO_DINP)) {
        c.dinp0 = c.acc ? zt_test_random(r, ni, 0.0, 0.5) : zt_test_nans(ni);
        zt_test_round_all(c.dinp0, ni, act);
    }
    if (!(flags & L_NO_DW)) {
        c.dw0 = zt_test_random(r, nw, 0.0, 0.5);
        c.dbias0 = c.bias ? zt_test_random(r, OC, 0.0, 0.5) : NULL;
    }
    return c;
}

static void lin_free_result(lin_result *x) {
    free(x->out), free(x->dinp), free(x->dw), free(x->dbias);
}

static void lin_free(lin_case *c) {
    free(c->inp), free(c->w), free(c->bias), free(c->res), free(c->dout), free(c->dinp0),
        free(c->dw0), free(c->dbias0);
}

static lin_result lin_run(zt_backend *be, zt_dtype act, const lin_case *c) {
    size_t ni = (size_t)c->N * c->C, no = (size_t)c->N * c->OC, nw = (size_t)c->C * c->OC;
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    void *out = zt_test_dev_alloc(&d, no * zt_test_act_size(be, act));
    void *inp = zt_test_dev_act(&d, c->inp, ni), *res = zt_test_dev_act(&d, c->res, no);
    float *w = zt_test_dev_f32(&d, c->w, nw), *bias = zt_test_dev_f32(&d, c->bias, c->OC);
    be->ops->linear_forward(&d.ctx, out, inp, w, bias, res, c->N, c->C, c->OC, c->layout);
    void *dinp = zt_test_dev_act(&d, c->dinp0, ni), *dout = zt_test_dev_act(&d, c->dout, no);
    float *dw = zt_test_dev_f32(&d, c->dw0, nw), *dbias = zt_test_dev_f32(&d, c->dbias0, c->OC);
    for (int i = 0; i < c->calls; i++)
        be->ops->linear_backward(&d.ctx, dinp, dw, dbias, dout, inp, w, c->N, c->C, c->OC,
                                 c->layout, c->acc);
    lin_result x = {zt_test_zeros(no), dinp ? zt_test_zeros(ni) : NULL,
                    dw ? zt_test_zeros(nw) : NULL, dbias ? zt_test_zeros(c->OC) : NULL};
    zt_test_dev_get_act(&d, x.out, out, no);
    if (dinp)
        zt_test_dev_get_act(&d, x.dinp, dinp, ni);
    if (dw)
        zt_test_dev_get_f32(&d, x.dw, dw, nw);
    if (dbias)
        zt_test_dev_get_f32(&d, x.dbias, dbias, c->OC);
    zt_test_dev_finish(&d);
    return x;
}

static const char *layout_name(zt_weight_layout l) {
    return l == ZT_W_IN_OUT ? "in_out" : "out_in";
}

static void lin_label(char *buf, size_t size, const lin_case *c) {
    snprintf(buf, size, "N=%d C=%d OC=%d %s%s%s%s%s%s", c->N, c->C, c->OC,
                    layout_name(c->layout), c->bias ? " bias" : "", c->res ? " residual" : "",
                    c->dinp0 ? (c->acc ? " dinp+=" : " dinp=") : " dinp=NULL",
                    c->dw0 ? "" : " dw=NULL", c->calls > 1 ? " backward twice" : "");
}

/* How the CUDA backend took the bias gradients (linear.cu): "epilogue" unless the environment
 * asks for the row-tile sums or has the emulated cuBLASLt refuse both epilogues, then "sums"
 * (not checked where it refuses one: the first bias decides). */
static void lin_check_bias_grad_choice(zt_backend *be) {
    if (be->device != ZT_DEVICE_CUDA)
        return;
    const char *(*choice)(void) = NULL;
    *(void **)&choice = zt_backend_cuda_symbol("zt_cuda_bias_grad_choice");
    if (!CHECK_AT(choice != NULL, "the CUDA module exports zt_cuda_bias_grad_choice"))
        return;
    const char *policy = getenv("ZTRAIN_CUDA_BIAS_GRAD"), *no_algo =
        getenv("ZTRAIN_CUDA_EMU_CUBLASLT_NO_ALGO");
    if (no_algo && *no_algo && !(strstr(no_algo, "BGRADA") && strstr(no_algo, "BGRADB")))
        return;
    const bool sums = (policy && strcmp(policy, "sums") == 0) || (no_algo && *no_algo);
    const char *got = choice();
    CHECK_AT(got && strcmp(got, sums ? "sums" : "epilogue") == 0,
             "linear cuda: the bias gradients were taken by %s, want %s", got ? got : "nothing",
             sums ? "sums" : "epilogue");
}

/* Case 8 has a bias whose gradient spans several of a GPU's 64-row tiles (150 rows, not a
 * multiple) over channels not a multiple of 32, and runs twice on be: dw and dbias must agree
 * bit for bit. Cases 9 and 10 (one per layout) call the backward twice into the same gradients,
 * which accumulate, as over two micro-batches. */
static void lin_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    for (int k = 0; k < 11; k++) {
        int N = k >= 8 ? 150 : (k == 0 ? 1 : zt_test_int(r, 2, 3)) * zt_test_int(r, 1, 11);
        int C = k == 7 ? 300 : k >= 8 ? 24 : zt_test_int(r, 1, 45);
        int OC = k == 6 ? 131 : k >= 8 ? 37 : zt_test_int(r, 1, 70);
        int flags = k >= 8 ? L_BIAS : (int)(zt_test_next(r) & (L_BIAS | L_RES | L_ACC));
        lin_case c = lin_make(r, N, C, OC, k % 2 ? ZT_W_OUT_IN : ZT_W_IN_OUT, flags, act);
        c.calls = k >= 9 ? 2 : 1;
        lin_result want = lin_run(cpu, act, &c), got = lin_run(be, act, &c);
        char shape[96], at[160];
        lin_label(shape, sizeof shape, &c);
        snprintf(at, sizeof at, "linear %s vs cpu at %s, %s", be->name, zt_dtype_name(act), shape);
        double tol = zt_test_tol(act);
        CHECK_CLOSE(got.out, want.out, (size_t)N * OC, tol, "%s: out", at);
        CHECK_CLOSE(got.dinp, want.dinp, (size_t)N * C, tol, "%s: dinp", at);
        CHECK_CLOSE(got.dw, want.dw, (size_t)C * OC, tol, "%s: dw", at);
        if (c.bias)
            CHECK_CLOSE(got.dbias, want.dbias, OC, tol, "%s: dbias", at);
        if (k == 8) {
            lin_result again = lin_run(be, act, &c);
            CHECK_SAME(again.dw, got.dw, (size_t)C * OC, "%s: dw run twice", at);
            CHECK_SAME(again.dbias, got.dbias, OC, "%s: dbias run twice", at);
            lin_free_result(&again);
        }
        lin_free_result(&want), lin_free_result(&got), lin_free(&c);
    }
    lin_check_bias_grad_choice(be);
}

/* ---- the double-precision reference ---------------------------------------------------------- */

typedef struct {
    const lin_case *c;
    double *inp, *w, *bias, *res, *r; /* r is the dout the backward was fed */
} lin_ref;

static void lin_ref_forward(const lin_ref *s, double *out) {
    const lin_case *c = s->c;
    for (int i = 0; i < c->N; i++)
        for (int o = 0; o < c->OC; o++) {
            double acc = s->bias ? s->bias[o] : 0.0;
            for (int j = 0; j < c->C; j++) {
                double wj = c->layout == ZT_W_IN_OUT ? s->w[(size_t)j * c->OC + o]
                                                     : s->w[(size_t)o * c->C + j];
                acc += s->inp[(size_t)i * c->C + j] * wj;
            }
            out[(size_t)i * c->OC + o] = acc + (s->res ? s->res[(size_t)i * c->OC + o] : 0.0);
        }
}

static double lin_ref_loss(void *state) {
    lin_ref *s = state;
    size_t n = (size_t)s->c->N * s->c->OC;
    double *out = calloc(n, sizeof *out), l = 0.0;
    lin_ref_forward(s, out);
    for (size_t i = 0; i < n; i++)
        l += out[i] * s->r[i];
    free(out);
    return l;
}

/* Both layouts with and without a bias and with dinp overwritten and accumulated (eight cases),
 * then a first layer's backward (dinp not asked for) and a frozen layer's (dw and dbias not asked
 * for). OC crosses the 64-wide bands of the bias gradient. */
static void lin_grad(zt_backend *cpu, zt_test_rng *r) {
    for (int k = 0; k < 10; k++) {
        int N = zt_test_int(r, 1, 13), C = zt_test_int(r, 1, 29);
        int OC = k == 3 ? 67 : zt_test_int(r, 1, 31);
        int flags = k < 8 ? ((k & 1) ? L_BIAS : 0) | ((k & 4) ? L_ACC : 0) | ((k % 3) ? L_RES : 0)
                          : (k == 8 ? L_BIAS | L_NO_DINP : L_BIAS | L_RES | L_NO_DW);
        zt_weight_layout layout = (k & 2) ? ZT_W_OUT_IN : ZT_W_IN_OUT;
        lin_case c = lin_make(r, N, C, OC, layout, flags, ZT_F32);
        lin_result got = lin_run(cpu, ZT_F32, &c);
        size_t ni = (size_t)N * C, no = (size_t)N * OC, nw = (size_t)C * OC;
        lin_ref s = {&c, zt_test_widen(c.inp, ni), zt_test_widen(c.w, nw),
                     c.bias ? zt_test_widen(c.bias, OC) : NULL,
                     c.res ? zt_test_widen(c.res, no) : NULL, zt_test_widen(c.dout, no)};
        double *out = calloc(no, sizeof *out);
        lin_ref_forward(&s, out);
        char shape[96], at[128];
        lin_label(shape, sizeof shape, &c);
        snprintf(at, sizeof at, "linear cpu %s", shape);
        CHECK_CLOSE(got.out, out, no, ZT_TEST_TOL_FWD, "%s: out against the reference", at);
        if (c.dinp0)
            CHECK_FD(s.inp, ni, got.dinp, c.acc ? c.dinp0 : NULL, lin_ref_loss, &s, 150, r,
                     "%s: dinp", at);
        if (c.dw0)
            CHECK_FD(s.w, nw, got.dw, c.dw0, lin_ref_loss, &s, 150, r, "%s: dw (accumulated)", at);
        if (c.dbias0)
            CHECK_FD(s.bias, OC, got.dbias, c.dbias0, lin_ref_loss, &s, 150, r,
                     "%s: dbias (accumulated)", at);
        free(out), free(s.inp), free(s.w), free(s.bias), free(s.res), free(s.r);
        lin_free_result(&got), lin_free(&c);
    }
}

/* At 16 bits out (the residual sum, rounded once) and dinp (overwritten or accumulated) are
 * held; the parameter gradients are those of fp32 activations. Where the CPU runs a bf16 job's
 * products on bf16 instructions (zt_backend_cpu_bf16_matmul; `ZTRAIN_GEMM_BF16=on test_ops` on
 * a CPU with AVX512_BF16, as ctest's unit/test_ops_bf16_matmul runs it), the bf16 case's weights
 * are bf16 values, as a bf16 job's are, and its results are the fp32 path's within bf16 tolerance
 * (the sums run in another order, so a rounding may land one unit apart) while still bf16 values;
 * the larger shape there spans several of oneDNN's blocks. */
static void lin_held(zt_backend *cpu, zt_test_rng *r) {
    for (zt_dtype t = ZT_BF16; t <= ZT_F16; t++) {
        bool native = t == ZT_BF16 && zt_backend_cpu_bf16_matmul();
        for (int k = 0; k < (native ? 4 : 2); k++) {
            int N = k < 2 ? 7 : 301, C = k < 2 ? 33 : 257, OC = k < 2 ? 19 : 131;
            lin_case c = lin_make(r, N, C, OC, k % 2 ? ZT_W_OUT_IN : ZT_W_IN_OUT,
                                  L_BIAS | L_RES | (k % 2 ? L_ACC : 0), t);
            if (native)
                zt_test_round_all(c.w, (size_t)C * OC, t);
            lin_result f32 = lin_run(cpu, ZT_F32, &c), held = lin_run(cpu, t, &c);
            char shape[96], at[160];
            lin_label(shape, sizeof shape, &c);
            snprintf(at, sizeof at, "linear at %s%s, %s", zt_dtype_name(t),
                     native ? " (native bf16 products)" : "", shape);
            if (native) {
                /* Every element a bf16 value, and close to the fp32 path's. */
                float *out16 = malloc(sizeof(float) * (size_t)N * OC);
                float *dinp16 = malloc(sizeof(float) * (size_t)N * C);
                for (size_t i = 0; i < (size_t)N * OC; i++)
                    out16[i] = zt_test_round(held.out[i], t);
                for (size_t i = 0; i < (size_t)N * C; i++)
                    dinp16[i] = zt_test_round(held.dinp[i], t);
                CHECK_SAME(held.out, out16, (size_t)N * OC, "%s: out holds bf16 values", at);
                CHECK_SAME(held.dinp, dinp16, (size_t)N * C, "%s: dinp holds bf16 values", at);
                CHECK_CLOSE(held.out, f32.out, (size_t)N * OC, zt_test_tol(t), "%s: out", at);
                CHECK_CLOSE(held.dinp, f32.dinp, (size_t)N * C, zt_test_tol(t), "%s: dinp", at);
                CHECK_CLOSE(held.dw, f32.dw, (size_t)C * OC, ZT_TEST_TOL_F32, "%s: dw", at);
                free(out16), free(dinp16);
            } else {
                CHECK_HELD(cpu, t, held.out, f32.out, (size_t)N * OC, "%s: out", at);
                CHECK_HELD(cpu, t, held.dinp, f32.dinp, (size_t)N * C, "%s: dinp", at);
                CHECK_SAME(held.dw, f32.dw, (size_t)C * OC, "%s: dw", at);
            }
            CHECK_SAME(held.dbias, f32.dbias, OC, "%s: dbias", at);
            lin_free_result(&f32), lin_free_result(&held), lin_free(&c);
        }
    }
}

static const char *const entries[] = {"linear_forward", "linear_backward", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "linear", entries, true, lin_compare))
        return;
    zt_test_rng r = zt_test_rng_for("linear/cpu", 0);
    lin_grad(env->be[0], &r);
    lin_held(env->be[0], &r);
}

/* ---- --perf: GPT-2 small's four layers of a block and its tied LM head, B=4, T=256 ----------- */

typedef struct {
    zt_ctx ctx;
    void *out, *inp, *res, *dinp, *dout;
    float *w, *bias, *dw, *dbias;
    int N, C, OC;
    zt_weight_layout layout;
} lin_perf;

static void lin_perf_forward(void *arg) {
    lin_perf *p = arg;
    p->ctx.be->ops->linear_forward(&p->ctx, p->out, p->inp, p->w, p->bias, p->res, p->N, p->C,
                                   p->OC, p->layout);
}

static void lin_perf_backward(void *arg) {
    lin_perf *p = arg;
    p->ctx.be->ops->linear_backward(&p->ctx, p->dinp, p->dw, p->dbias, p->dout, p->inp, p->w,
                                    p->N, p->C, p->OC, p->layout, false);
}

static void perf(zt_backend *be) {
    if (!zt_test_has(be, "linear_forward") || !zt_test_has(be, "linear_backward"))
        return;
    static const struct {
        const char *what;
        int C, OC;
        zt_weight_layout layout;
        bool bias, res;
        int reps;
    } layers[] = {
        {"qkv", 768, 2304, ZT_W_IN_OUT, true, false, 7},
        {"attn proj+res", 768, 768, ZT_W_IN_OUT, true, true, 11},
        {"fc", 768, 3072, ZT_W_IN_OUT, true, false, 7},
        {"fc proj+res", 3072, 768, ZT_W_IN_OUT, true, true, 7},
        {"fc out_in", 768, 3072, ZT_W_OUT_IN, true, false, 7},
        {"lm head", 768, 50257, ZT_W_OUT_IN, false, false, 3},
    };
    const int N = 4 * 256;
    zt_test_rng r = zt_test_rng_for("linear/perf", 0);
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
        int C = layers[i].C, OC = layers[i].OC;
        size_t ni = (size_t)N * C, no = (size_t)N * OC, nw = (size_t)C * OC;
        zt_test_dev d;
        zt_test_dev_init(&d, be, ZT_F32);
        lin_perf p = {d.ctx, .N = N, .C = C, .OC = OC, .layout = layers[i].layout};
        p.out = zt_test_dev_alloc(&d, no * sizeof(float));
        p.inp = zt_test_dev_random(&d, &r, ni, 1.0);
        p.res = layers[i].res ? zt_test_dev_random(&d, &r, no, 1.0) : NULL;
        p.dinp = zt_test_dev_alloc(&d, ni * sizeof(float));
        p.dout = zt_test_dev_random(&d, &r, no, 1.0);
        p.w = zt_test_dev_random(&d, &r, nw, 0.02);
        p.bias = layers[i].bias ? zt_test_dev_random(&d, &r, OC, 0.02) : NULL;
        p.dw = zt_test_dev_alloc(&d, nw * sizeof(float));
        p.dbias = layers[i].bias ? zt_test_dev_alloc(&d, OC * sizeof(float)) : NULL;
        char shape[64];
        snprintf(shape, sizeof shape, "%s N=%d C=%d OC=%d", layers[i].what, N, C, OC);
        double flop = 2.0 * N * C * OC;
        double ms = zt_test_time_ms(be, lin_perf_forward, &p, layers[i].reps);
        zt_test_perf_row("linear_forward", be, shape, ms, 0, flop / 1e9);
        ms = zt_test_time_ms(be, lin_perf_backward, &p, layers[i].reps);
        zt_test_perf_row("linear_backward", be, shape, ms, 0, 2.0 * flop / 1e9);
        zt_test_dev_finish(&d);
    }
}

const zt_test_family zt_test_linear = {"linear", entries, check, perf};
