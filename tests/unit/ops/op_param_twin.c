/* Every op that reads a parameter, reading its 16-bit twin (ops.h, zt_param16) on a backend that
 * says it does (backend.h, reads_param16): LayerNorm's and RMSNorm's forward and backward, the
 * embedding's forward (token and position tables, rows of an odd width too), and the linear
 * forward with a bias whose twin is off cuBLASLt's 16-byte alignment. op_linear_twin.c covers the
 * weights of the products. As there, the fp32 buffer holds other values than the twin (a real
 * one holds the twin widened, or, in a mixed-precision step on such a backend, nothing: ZeRO
 * leaves it unfilled), so the results must be the CPU's for the twin's values: an op that read
 * the fp32 values, or the twin at the wrong offset, fails. Each parameter also starts an element
 * past a 16-byte boundary in one of the cases, as tensors in a flat buffer do. This is what lets
 * ZeRO's mixed precision leave the fp32 working copy unfilled (zero.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* The parameters of one case in one flat fp32 buffer of n elements: on the backend under test
 * it holds `shown` and the ctx's twin holds `truth` rounded to act; on the CPU (the reference) it
 * holds truth. */
static float *flat_params(zt_test_dev *d, zt_dtype act, const float *shown, const float *truth,
                          size_t n, zt_param16 *twin) {
    zt_backend *be = d->be;
    if (!shown)
        return zt_test_dev_f32(d, truth, n);
    float *params = zt_test_dev_f32(d, shown, n), *t32 = zt_test_dev_f32(d, truth, n);
    uint16_t *half = zt_test_dev_alloc(d, n * 2);
    be->ops->to_half(&d->ctx, half, t32, n, act);
    *twin = (zt_param16){params, half, n, act};
    d->ctx.param16 = twin;
    return params;
}

/* Parameters at the 16-bit precision (the values a twin holds), and another set the fp32 buffer
 * shows the backend under test. */
static void param_pair(zt_test_rng *r, size_t n, double mean, double std, zt_dtype act,
                       float **truth, float **shown) {
    *truth = zt_test_random(r, n, mean, std);
    zt_test_round_all(*truth, n, act);
    *shown = zt_test_random(r, n, mean, std);
}

/* ---- LayerNorm and RMSNorm ------------------------------------------------------------------- */

typedef struct {
    float *out, *dinp, *dw, *db;
} norm_result;

/* The forward and the backward (into zeroed gradients) of LayerNorm (rms false: with a bias) or
 * RMSNorm, the parameters `pad` elements into the flat buffer: [pad | w | b]. */
static norm_result norm_run(zt_backend *be, zt_dtype act, bool rms, int N, int C, int pad,
                            const float *inp_h, const float *dout_h, const float *shown,
                            const float *truth) {
    size_t n = (size_t)N * C, np = (size_t)pad + 2 * C;
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    zt_param16 twin;
    float *params = flat_params(&d, act, shown, truth, np, &twin);
    float *w = params + pad, *b = w + C;
    size_t es = zt_test_act_size(be, act);
    void *out = zt_test_dev_alloc(&d, n * es), *dinp = zt_test_dev_alloc(&d, n * es);
    void *inp = zt_test_dev_act(&d, inp_h, n), *dout = zt_test_dev_act(&d, dout_h, n);
    float *mean = zt_test_dev_alloc(&d, N * sizeof(float));
    float *rstd = zt_test_dev_alloc(&d, N * sizeof(float));
    float *dw = zt_test_dev_alloc(&d, C * sizeof(float));
    float *db = zt_test_dev_alloc(&d, C * sizeof(float));
    if (rms) {
        be->ops->rmsnorm_forward(&d.ctx, out, rstd, inp, w, 1e-5f, N, C);
        be->ops->rmsnorm_backward(&d.ctx, dinp, dw, dout, inp, w, rstd, N, C);
    } else {
        be->ops->layernorm_forward(&d.ctx, out, mean, rstd, inp, w, b, N, C);
        be->ops->layernorm_backward(&d.ctx, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    }
    norm_result x = {zt_test_zeros(n), zt_test_zeros(n), zt_test_zeros(C), zt_test_zeros(C)};
    zt_test_dev_get_act(&d, x.out, out, n);
    zt_test_dev_get_act(&d, x.dinp, dinp, n);
    zt_test_dev_get_f32(&d, x.dw, dw, C);
    zt_test_dev_get_f32(&d, x.db, db, C);
    zt_test_dev_finish(&d);
    return x;
}

static void norm_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    if (act == ZT_F32 || !be->reads_param16)
        return; /* a twin is only ever in the activations' 16-bit type */
    /* N, C, pad; the last has 32 tiles of 32 rows and one of 5 in a GPU's fused backward */
    static const int shapes[][3] = {{5, 40, 0}, {7, 37, 1}, {1029, 37, 1}};
    for (int rms = 0; rms < 2; rms++)
        for (int k = 0; k < 3; k++) {
            int N = shapes[k][0], C = shapes[k][1], pad = shapes[k][2];
            size_t n = (size_t)N * C, np = (size_t)pad + 2 * C;
            float *inp = zt_test_random(r, n, 0.5, 1.5), *dout = zt_test_random(r, n, 0.0, 1.0);
            zt_test_round_all(inp, n, act);
            zt_test_round_all(dout, n, act);
            float *truth, *shown;
            param_pair(r, np, 1.0, 0.3, act, &truth, &shown);
            norm_result want = norm_run(cpu, act, rms, N, C, pad, inp, dout, NULL, truth);
            norm_result got = norm_run(be, act, rms, N, C, pad, inp, dout, shown, truth);
            char at[128];
            snprintf(at, sizeof at, "%s on %s at %s reading the twin, N=%d C=%d, %d element%s in",
                     rms ? "rmsnorm" : "layernorm", be->name, zt_dtype_name(act), N, C, pad,
                     pad == 1 ? "" : "s");
            double tol = zt_test_tol(act);
            CHECK_CLOSE(got.out, want.out, n, tol, "%s: forward out", at);
            CHECK_CLOSE(got.dinp, want.dinp, n, tol, "%s: backward dinp", at);
            CHECK_CLOSE(got.dw, want.dw, (size_t)C, tol, "%s: backward dw", at);
            if (!rms)
                CHECK_CLOSE(got.db, want.db, (size_t)C, tol, "%s: backward db", at);
            free(want.out), free(want.dinp), free(want.dw), free(want.db);
            free(got.out), free(got.dinp), free(got.dw), free(got.db);
            free(inp), free(dout), free(truth), free(shown);
        }
}

/* ---- the embedding ----------------------------------------------------------------------------- */

/* embedding_forward of tokens [B, T] with tables [pad | wte (V×C) | wpe (T×C)]; a twin that
 * covers the first `cover` elements only, when not 0. */
static float *embedding_run(zt_backend *be, zt_dtype act, int B, int T, int C, int V, int pad,
                            const int32_t *tokens, const float *shown, const float *truth,
                            size_t cover) {
    size_t n = (size_t)B * T * C, np = (size_t)pad + (size_t)(V + T) * C;
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    zt_param16 twin;
    float *params = flat_params(&d, act, shown, truth, np, &twin);
    if (shown && cover)
        twin.n = cover;
    float *wte = params + pad, *wpe = wte + (size_t)V * C;
    void *out = zt_test_dev_alloc(&d, n * zt_test_act_size(be, act));
    be->ops->embedding_forward(&d.ctx, out, tokens, wte, wpe, B, T, C);
    float *x = zt_test_zeros(n);
    zt_test_dev_get_act(&d, x, out, n);
    zt_test_dev_finish(&d);
    return x;
}

static void embedding_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    if (act == ZT_F32 || !be->reads_param16)
        return;
    /* C 16: rows of whole 16-byte chunks; C 13: rows at every alignment. */
    static const int shapes[][2] = {{16, 0}, {13, 1}};
    const int B = 2, T = 5, V = 11;
    for (int k = 0; k < 2; k++) {
        int C = shapes[k][0], pad = shapes[k][1];
        size_t np = (size_t)pad + (size_t)(V + T) * C;
        int32_t tokens[2 * 5];
        for (int i = 0; i < B * T; i++)
            tokens[i] = zt_test_int(r, 0, V - 1);
        float *truth, *shown;
        param_pair(r, np, 0.0, 1.0, act, &truth, &shown);
        float *want = embedding_run(cpu, act, B, T, C, V, pad, tokens, NULL, truth, 0);
        float *got = embedding_run(be, act, B, T, C, V, pad, tokens, shown, truth, 0);
        CHECK_CLOSE(got, want, (size_t)B * T * C, zt_test_tol(act),
                    "embedding_forward on %s at %s reading the twin, C=%d, %d element%s in",
                    be->name, zt_dtype_name(act), C, pad, pad == 1 ? "" : "s");
        free(want), free(got), free(truth), free(shown);
    }
    /* A twin that covers the table's first 4 rows while a token selects row V - 1: the op must
     * read the fp32 table (here other values than the twin's) for every row, not the twin up to
     * its end and past it. So the result is the CPU's from the fp32 values. */
    const int C = 16, rows = 4;
    size_t np = (size_t)(V + T) * C;
    int32_t tokens[2 * 5];
    for (int i = 0; i < B * T; i++)
        tokens[i] = zt_test_int(r, 0, rows - 1);
    tokens[6] = V - 1;
    float *truth, *shown;
    param_pair(r, np, 0.0, 1.0, act, &truth, &shown);
    zt_test_round_all(shown, np, act);
    float *want = embedding_run(cpu, act, B, T, C, V, 0, tokens, NULL, shown, 0);
    float *got = embedding_run(be, act, B, T, C, V, 0, tokens, shown, truth, (size_t)rows * C);
    CHECK_CLOSE(got, want, (size_t)B * T * C, zt_test_tol(act),
                "embedding_forward on %s at %s with a twin of %d rows and token %d: the fp32 "
                "table", be->name, zt_dtype_name(act), rows, V - 1);
    free(want), free(got), free(truth), free(shown);
}

/* ---- a bias whose twin is not 16-byte aligned ------------------------------------------------- */

static float *linear_run(zt_backend *be, zt_dtype act, int N, int C, int OC, const float *inp_h,
                         const float *shown, const float *truth) {
    size_t np = (size_t)C * OC + OC;
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    zt_param16 twin;
    float *params = flat_params(&d, act, shown, truth, np, &twin);
    void *inp = zt_test_dev_act(&d, inp_h, (size_t)N * C);
    void *out = zt_test_dev_alloc(&d, (size_t)N * OC * zt_test_act_size(be, act));
    be->ops->linear_forward(&d.ctx, out, inp, params, params + (size_t)C * OC, NULL, N, C, OC,
                            ZT_W_IN_OUT);
    float *x = zt_test_zeros((size_t)N * OC);
    zt_test_dev_get_act(&d, x, out, (size_t)N * OC);
    zt_test_dev_finish(&d);
    return x;
}

static void bias_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    if (act == ZT_F32 || !be->reads_param16)
        return;
    /* The bias starts C·OC = 108 elements in: 216 bytes, 8 past a 16-byte boundary. */
    const int N = 4, C = 12, OC = 9;
    size_t np = (size_t)C * OC + OC;
    float *inp = zt_test_random(r, (size_t)N * C, 0.0, 1.0);
    zt_test_round_all(inp, (size_t)N * C, act);
    float *truth, *shown;
    param_pair(r, np, 0.0, 0.5, act, &truth, &shown);
    float *want = linear_run(cpu, act, N, C, OC, inp, NULL, truth);
    float *got = linear_run(be, act, N, C, OC, inp, shown, truth);
    CHECK_CLOSE(got, want, (size_t)N * OC, zt_test_tol(act),
                "linear_forward on %s at %s reading a bias twin off 16-byte alignment", be->name,
                zt_dtype_name(act));
    free(want), free(got), free(inp), free(truth), free(shown);
}

static void twin_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    norm_compare(cpu, be, act, r);
    embedding_compare(cpu, be, act, r);
    bias_compare(cpu, be, act, r);
}

static const char *const twin_entries[] = {
    "layernorm_forward", "layernorm_backward", "rmsnorm_forward", "rmsnorm_backward",
    "embedding_forward", "linear_forward",     "to_half",         NULL};

static void twin_check(const zt_test_env *env) {
    zt_test_each_backend(env, "param twin", twin_entries, true, twin_compare);
}

/* The entries are their own families' (each entry belongs to one): this family owns none. */
static const char *const owned[] = {NULL};

const zt_test_family zt_test_param_twin = {"param_twin", owned, twin_check, NULL};
