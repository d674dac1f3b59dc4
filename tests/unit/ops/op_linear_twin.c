/* The linear ops reading a parameter's 16-bit twin (ops.h, zt_param16): on a backend whose
 * products run in 16 bits, linear_forward, linear_gelu_forward and linear_backward take the
 * weight and bias from the twin the ctx carries, not from the fp32 values. The twin here holds
 * other weights than the fp32 buffer (which a real twin never does), so the results must be the
 * CPU's for the twin's weights: a backend that rounded the fp32 weights instead fails, and so
 * does one that read the twin at the wrong offset. The CPU ignores twins (its results are its
 * fp32 path's, checked by the linear family). */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

typedef struct {
    float *out, *pre, *dinp;
} twin_result;

/* One forward (linear_forward, then linear_gelu_forward into out2/pre) and one linear_backward
 * on be, with weights w and bias b; with twin_w (and twin_b) the fp32 buffer holds w, b and the
 * ctx's twin holds twin_w, twin_b rounded to act. */
static twin_result twin_run(zt_backend *be, zt_dtype act, int N, int C, int OC,
                            zt_weight_layout layout, const float *inp_h, const float *dout_h,
                            const float *w, const float *b, const float *twin_w,
                            const float *twin_b) {
    size_t ni = (size_t)N * C, no = (size_t)N * OC, nw = (size_t)C * OC, np = nw + OC;
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    float *params = zt_test_dev_alloc(&d, np * sizeof(float));
    zt_backend_copy(be, params, w, nw * sizeof(float), ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    zt_backend_copy(be, params + nw, b, OC * sizeof(float), ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    zt_param16 twin;
    if (twin_w) {
        float *t32 = zt_test_dev_alloc(&d, np * sizeof(float));
        zt_backend_copy(be, t32, twin_w, nw * sizeof(float), ZT_COPY_H2D, ZT_STREAM_COMPUTE);
        zt_backend_copy(be, t32 + nw, twin_b, OC * sizeof(float), ZT_COPY_H2D, ZT_STREAM_COMPUTE);
        uint16_t *half = zt_test_dev_alloc(&d, np * 2);
        be->ops->to_half(&d.ctx, half, t32, np, act);
        twin = (zt_param16){params, half, np, act};
        d.ctx.param16 = &twin;
    }
    void *inp = zt_test_dev_act(&d, inp_h, ni), *dout = zt_test_dev_act(&d, dout_h, no);
    size_t es = zt_test_act_size(be, act);
    void *out = zt_test_dev_alloc(&d, no * es), *out2 = zt_test_dev_alloc(&d, no * es);
    void *pre = zt_test_dev_alloc(&d, no * es), *dinp = zt_test_dev_alloc(&d, ni * es);
    be->ops->linear_forward(&d.ctx, out, inp, params, params + nw, NULL, N, C, OC, layout);
    be->ops->linear_gelu_forward(&d.ctx, out2, pre, inp, params, params + nw, N, C, OC, layout);
    be->ops->linear_backward(&d.ctx, dinp, NULL, NULL, dout, inp, params, N, C, OC, layout,
                             false);
    twin_result x = {zt_test_zeros(2 * no), zt_test_zeros(no), zt_test_zeros(ni)};
    zt_test_dev_get_act(&d, x.out, out, no);
    zt_test_dev_get_act(&d, x.out + no, out2, no);
    zt_test_dev_get_act(&d, x.pre, pre, no);
    zt_test_dev_get_act(&d, x.dinp, dinp, ni);
    zt_test_dev_finish(&d);
    return x;
}

static void twin_free(twin_result *x) { free(x->out), free(x->pre), free(x->dinp); }

static void twin_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    if (act == ZT_F32 || be == cpu)
        return; /* fp32 products read the fp32 weights; the CPU reads no twin */
    /* OC a multiple of 8 takes the fused GELU epilogue, 37 the unfused path. */
    static const int shapes[][3] = {{6, 24, 40}, {5, 16, 37}};
    for (int k = 0; k < 2; k++)
        for (int l = 0; l < 2; l++) {
            int N = shapes[k][0], C = shapes[k][1], OC = shapes[k][2];
            zt_weight_layout layout = l ? ZT_W_OUT_IN : ZT_W_IN_OUT;
            size_t ni = (size_t)N * C, no = (size_t)N * OC, nw = (size_t)C * OC;
            float *inp = zt_test_random(r, ni, 0.0, 1.0), *dout = zt_test_random(r, no, 0.0, 1.0);
            zt_test_round_all(inp, ni, act);
            zt_test_round_all(dout, no, act);
            float *w = zt_test_random(r, nw, 0.0, 0.3), *b = zt_test_random(r, OC, 0.0, 0.5);
            float *tw = zt_test_random(r, nw, 0.0, 0.3), *tb = zt_test_random(r, OC, 0.0, 0.5);
            zt_test_round_all(tw, nw, act);
            zt_test_round_all(tb, OC, act);
            twin_result want = twin_run(cpu, act, N, C, OC, layout, inp, dout, tw, tb, NULL, NULL);
            twin_result got = twin_run(be, act, N, C, OC, layout, inp, dout, w, b, tw, tb);
            char at[128];
            snprintf(at, sizeof at, "linear ops on %s at %s reading the twin, N=%d C=%d OC=%d %s",
                     be->name, zt_dtype_name(act), N, C, OC, l ? "out_in" : "in_out");
            double tol = zt_test_tol(act);
            CHECK_CLOSE(got.out, want.out, 2 * no, tol, "%s: linear and linear_gelu out", at);
            CHECK_CLOSE(got.pre, want.pre, no, tol, "%s: linear_gelu pre", at);
            CHECK_CLOSE(got.dinp, want.dinp, ni, tol, "%s: linear_backward dinp", at);
            twin_free(&want), twin_free(&got);
            free(inp), free(dout), free(w), free(b), free(tw), free(tb);
        }
}

static const char *const twin_entries[] = {"linear_forward", "linear_gelu_forward",
                                           "linear_backward", "to_half", NULL};

static void twin_check(const zt_test_env *env) {
    zt_test_each_backend(env, "linear twin", twin_entries, true, twin_compare);
}

/* The entries are their own families' (each entry belongs to one): this family owns none. */
static const char *const owned[] = {NULL};

const zt_test_family zt_test_linear_twin = {"linear_twin", owned, twin_check, NULL};
