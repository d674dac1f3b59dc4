/* linear_gelu_forward and linear_backward_gelu (GPT-2's MLP: a layer into GELU, and the backward
 * of the layer after it carried through the GELU): every backend against the CPU, in both weight
 * layouts, at widths a multiple of 8 (which the CUDA backend runs in cuBLASLt's GELU_AUX_BIAS and
 * DGELU epilogues) and not (its unfused path), with a bias gradient over several row tiles; and
 * the CPU's fused entries against its own linear and gelu ops run one after the other, bit for
 * bit, as ops.h defines them. The CPU's linear and gelu ops are themselves checked against
 * double precision and finite differences by their own families. On the CUDA backend the case
 * also shows, through the module's matmul counts, that the epilogues ran and that a repeated
 * shape asks cuBLASLt's heuristic nothing. */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

typedef struct {
    int N, C, F, OC; /* inp[N,C] -> pre, out [N,F]; the next layer F -> OC */
    zt_weight_layout layout;
    float *inp, *w1, *b1; /* [N,C], [C,F] or [F,C], [F] or NULL */
    float *w2, *dout;     /* the next layer's weight, the gradient of its output [N,OC] */
    float *dw0, *db0;     /* what its weight and bias gradients hold before the backward */
} lg_case;

typedef struct {
    float *out, *pre, *dpre, *dw, *db;
} lg_result;

static lg_case lg_make(zt_test_rng *r, int N, int C, int F, int OC, zt_weight_layout layout,
                       bool bias, zt_dtype act) {
    lg_case c = {.N = N, .C = C, .F = F, .OC = OC, .layout = layout};
    c.inp = zt_test_random(r, (size_t)N * C, 0.0, 1.0);
    zt_test_round_all(c.inp, (size_t)N * C, act);
    c.w1 = zt_test_random(r, (size_t)C * F, 0.0, 0.5);
    c.b1 = bias ? zt_test_random(r, F, 0.0, 0.5) : NULL;
    c.w2 = zt_test_random(r, (size_t)F * OC, 0.0, 0.3);
    c.dout = zt_test_random(r, (size_t)N * OC, 0.0, 1.0);
    zt_test_round_all(c.dout, (size_t)N * OC, act);
    c.dw0 = zt_test_random(r, (size_t)F * OC, 0.0, 0.5);
    c.db0 = zt_test_random(r, OC, 0.0, 0.5);
    return c;
}

static void lg_free_result(lg_result *x) {
    free(x->out), free(x->pre), free(x->dpre), free(x->dw), free(x->db);
}

static void lg_free(lg_case *c) {
    free(c->inp), free(c->w1), free(c->b1), free(c->w2), free(c->dout), free(c->dw0),
        free(c->db0);
}

/* The fused entries on be, or (unfused) the CPU's linear and gelu ops one after the other. */
static lg_result lg_run(zt_backend *be, zt_dtype act, const lg_case *c, bool unfused) {
    const size_t ni = (size_t)c->N * c->C, nf = (size_t)c->N * c->F, no = (size_t)c->N * c->OC;
    const size_t nw = (size_t)c->F * c->OC;
    const zt_ops *op = be->ops;
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    const size_t es = zt_test_act_size(be, act);
    void *out = zt_test_dev_alloc(&d, nf * es), *pre = zt_test_dev_alloc(&d, nf * es);
    void *inp = zt_test_dev_act(&d, c->inp, ni);
    float *w1 = zt_test_dev_f32(&d, c->w1, (size_t)c->C * c->F);
    float *b1 = zt_test_dev_f32(&d, c->b1, c->F);
    float *nan = zt_test_nans(nf);
    zt_test_round_all(nan, nf, act);
    void *dpre = zt_test_dev_act(&d, nan, nf); /* overwritten: a read of it shows as NaN */
    free(nan);
    void *dout = zt_test_dev_act(&d, c->dout, no);
    float *w2 = zt_test_dev_f32(&d, c->w2, nw);
    float *dw = zt_test_dev_f32(&d, c->dw0, nw), *db = zt_test_dev_f32(&d, c->db0, c->OC);
    if (unfused) {
        op->linear_forward(&d.ctx, pre, inp, w1, b1, NULL, c->N, c->C, c->F, c->layout);
        op->gelu_forward(&d.ctx, out, pre, nf);
        op->linear_backward(&d.ctx, dpre, dw, db, dout, out, w2, c->N, c->F, c->OC, c->layout,
                            false);
        op->gelu_backward(&d.ctx, dpre, pre, dpre, nf);
    } else {
        op->linear_gelu_forward(&d.ctx, out, pre, inp, w1, b1, c->N, c->C, c->F, c->layout);
        op->linear_backward_gelu(&d.ctx, dpre, dw, db, dout, out, pre, w2, c->N, c->F, c->OC,
                                 c->layout);
    }
    lg_result x = {zt_test_zeros(nf), zt_test_zeros(nf), zt_test_zeros(nf), zt_test_zeros(nw),
                   zt_test_zeros(c->OC)};
    zt_test_dev_get_act(&d, x.out, out, nf);
    zt_test_dev_get_act(&d, x.pre, pre, nf);
    zt_test_dev_get_act(&d, x.dpre, dpre, nf);
    zt_test_dev_get_f32(&d, x.dw, dw, nw);
    zt_test_dev_get_f32(&d, x.db, db, c->OC);
    zt_test_dev_finish(&d);
    return x;
}

/* The CUDA module's matmul counts (cuda_backend.h, zt_cuda_matmul_counts), or false when be is
 * not the CUDA backend. */
typedef struct {
    unsigned long long products, heuristics, gelu;
} lg_counts;

static bool lg_counts_of(zt_backend *be, lg_counts *out) {
    if (be->device != ZT_DEVICE_CUDA)
        return false;
    void (*counts)(zt_backend *, unsigned long long *, unsigned long long *,
                   unsigned long long *);
    *(void **)&counts = zt_backend_cuda_symbol("zt_cuda_matmul_counts");
    if (!CHECK_AT(counts != NULL, "the CUDA module exports zt_cuda_matmul_counts"))
        return false;
    counts(be, &out->products, &out->heuristics, &out->gelu);
    return true;
}

static const int shapes[][5] = {
    /* N, C, F, OC, bias: F a multiple of 8 takes the epilogues, otherwise the unfused path */
    {5, 12, 16, 9, 1}, {7, 10, 13, 6, 1}, {1, 3, 8, 5, 1}, {6, 9, 24, 11, 0}, {150, 20, 40, 37, 1},
};
enum { NSHAPES = sizeof shapes / sizeof shapes[0] };

static void lg_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    for (int k = 0; k < NSHAPES; k++) {
        const int *s = shapes[k];
        lg_case c = lg_make(r, s[0], s[1], s[2], s[3], k % 2 ? ZT_W_OUT_IN : ZT_W_IN_OUT,
                            s[4] != 0, act);
        lg_counts before, mid, after;
        bool counted = lg_counts_of(be, &before);
        lg_result want = lg_run(cpu, act, &c, false), got = lg_run(be, act, &c, false);
        char at[160];
        snprintf(at, sizeof at, "linear_gelu %s vs cpu at %s, N=%d C=%d F=%d OC=%d %s%s",
                 be->name, zt_dtype_name(act), c.N, c.C, c.F, c.OC,
                 c.layout == ZT_W_IN_OUT ? "in_out" : "out_in", c.b1 ? " bias" : "");
        const double tol = zt_test_tol(act);
        const size_t nf = (size_t)c.N * c.F;
        CHECK_CLOSE(got.out, want.out, nf, tol, "%s: out", at);
        CHECK_CLOSE(got.pre, want.pre, nf, tol, "%s: pre", at);
        CHECK_CLOSE(got.dpre, want.dpre, nf, tol, "%s: dpre", at);
        CHECK_CLOSE(got.dw, want.dw, (size_t)c.F * c.OC, tol, "%s: dw", at);
        CHECK_CLOSE(got.db, want.db, c.OC, tol, "%s: dbias", at);
        if (counted && lg_counts_of(be, &mid)) {
            /* Fused: the forward with its bias, and the backward's input product. */
            int gelu = (c.F % 8 == 0 && c.b1) + (c.F % 8 == 0);
            CHECK_AT(mid.gelu - before.gelu == (unsigned long long)gelu,
                     "%s: %llu products with a GELU epilogue, want %d", at,
                     mid.gelu - before.gelu, gelu);
            lg_result again = lg_run(be, act, &c, false);
            lg_counts_of(be, &after);
            CHECK_AT(after.products > mid.products && after.heuristics == mid.heuristics,
                     "%s: the same shapes again ran %llu products and asked the heuristic %llu "
                     "times (want 0)", at, after.products - mid.products,
                     after.heuristics - mid.heuristics);
            CHECK_SAME(again.dw, got.dw, (size_t)c.F * c.OC, "%s: dw run twice", at);
            CHECK_SAME(again.db, got.db, c.OC, "%s: dbias run twice", at);
            lg_free_result(&again);
        }
        lg_free_result(&want), lg_free_result(&got), lg_free(&c);
    }
}

/* The CPU's fused entries are its unfused ops, bit for bit. */
static void lg_cpu_unfused(zt_backend *cpu, zt_test_rng *r) {
    static const zt_dtype acts[] = {ZT_F32, ZT_BF16, ZT_F16};
    for (int a = 0; a < 3; a++) {
        for (int k = 0; k < NSHAPES; k++) {
            const int *s = shapes[k];
            lg_case c = lg_make(r, s[0], s[1], s[2], s[3], k % 2 ? ZT_W_IN_OUT : ZT_W_OUT_IN,
                                s[4] != 0, acts[a]);
            lg_result fused = lg_run(cpu, acts[a], &c, false), two = lg_run(cpu, acts[a], &c, true);
            char at[128];
            snprintf(at, sizeof at, "linear_gelu cpu fused vs unfused at %s, N=%d C=%d F=%d",
                     zt_dtype_name(acts[a]), c.N, c.C, c.F);
            const size_t nf = (size_t)c.N * c.F;
            CHECK_SAME(fused.out, two.out, nf, "%s: out", at);
            CHECK_SAME(fused.pre, two.pre, nf, "%s: pre", at);
            CHECK_SAME(fused.dpre, two.dpre, nf, "%s: dpre", at);
            CHECK_SAME(fused.dw, two.dw, (size_t)c.F * c.OC, "%s: dw", at);
            CHECK_SAME(fused.db, two.db, c.OC, "%s: dbias", at);
            lg_free_result(&fused), lg_free_result(&two), lg_free(&c);
        }
    }
}

static const char *const entries[] = {"linear_gelu_forward", "linear_backward_gelu", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "linear_gelu", entries, true, lg_compare))
        return;
    zt_test_rng r = zt_test_rng_for("linear_gelu/cpu", 0);
    lg_cpu_unfused(env->be[0], &r);
}

const zt_test_family zt_test_linear_gelu = {"linear_gelu", entries, check, NULL};
