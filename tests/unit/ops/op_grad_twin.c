/* Every op that accumulates a parameter gradient, adding into the 16-bit gradients (ops.h,
 * zt_grad16) on a backend that says it does (backend.h, writes_grad16): the embedding's backward
 * (token and position tables), LayerNorm's and RMSNorm's backward, and the linear backward (the
 * weight's product in both layouts, the bias, and the GELU variant's). The 16-bit gradients start
 * from other values than zero, as after a micro-step, and the fp32 gradients hold a pattern that
 * no op may touch. The result must be the CPU's contribution (into zeroed fp32 gradients) added
 * to the start and rounded once to the 16-bit type, within a unit or two of that type (zt_test_tol:
 * the two contributions differ by fp32 rounding): an op that wrote the fp32 gradients, added at
 * the wrong offset, or overwrote instead of adding, fails. This is what lets ZeRO's mixed
 * precision at stages 0-1 hold no fp32 gradient (zero.h, grads16). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* A case's gradients: one flat fp32 buffer of n elements holding `pattern` and, on a backend that
 * writes 16-bit gradients, its 16-bit buffer holding `start` (16-bit values). */
typedef struct {
    zt_test_dev d;
    zt_grad16 twin;
    float *grads;     /* device, fp32 [n] */
    uint16_t *half;   /* device, [n], or NULL on the CPU */
    size_t n;
} grad_case;

static void case_init(grad_case *g, zt_backend *be, zt_dtype act, size_t n, const float *pattern,
                      const float *start) {
    zt_test_dev_init(&g->d, be, act);
    g->n = n;
    if (!start) {
        float *zeros = zt_test_zeros(n);
        g->grads = zt_test_dev_f32(&g->d, zeros, n);
        g->half = NULL;
        free(zeros);
        return;
    }
    g->grads = zt_test_dev_f32(&g->d, pattern, n);
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = zt_test_encode(start[i], act);
    g->half = zt_test_dev_bytes(&g->d, h, n * sizeof *h);
    free(h);
    g->twin = (zt_grad16){g->grads, g->half, n, act};
    g->d.ctx.grad16 = &g->twin;
}

/* The case's gradients on the host: the fp32 buffer into f32, and the 16-bit one widened into
 * half16 (when the case has one). Ends the case. */
static void case_finish(grad_case *g, zt_dtype act, float *f32, float *half16) {
    zt_test_dev_get_f32(&g->d, f32, g->grads, g->n);
    if (g->half) {
        uint16_t *h = malloc(g->n * sizeof *h);
        zt_test_dev_get_bytes(&g->d, h, g->half, g->n * sizeof *h);
        for (size_t i = 0; i < g->n; i++)
            half16[i] = zt_test_decode(h[i], act);
        free(h);
    }
    zt_test_dev_finish(&g->d);
}

/* The op of case k on backend be, writing the gradients of a flat buffer of n elements. */
typedef void (*grad_op)(grad_case *g, zt_backend *be, zt_dtype act, int k, zt_test_rng *r);

/* Runs op on the CPU into zeroed fp32 gradients and on be into 16-bit gradients starting from
 * random values, and checks be's against the CPU's contribution added to the start. */
static void compare_op(zt_backend *cpu, zt_backend *be, zt_dtype act, const char *what, size_t n,
                       grad_op op, int k, uint64_t seed) {
    zt_test_rng r0 = zt_test_rng_for(what, seed);
    float *pattern = zt_test_random(&r0, n, 0.0, 100.0);
    float *start = zt_test_random(&r0, n, 0.0, 0.5);
    zt_test_round_all(start, n, act);

    grad_case g;
    zt_test_rng r = zt_test_rng_for(what, seed + 1);
    case_init(&g, cpu, act, n, NULL, NULL);
    op(&g, cpu, act, k, &r);
    float *contribution = zt_test_zeros(n);
    case_finish(&g, act, contribution, NULL);

    r = zt_test_rng_for(what, seed + 1);
    case_init(&g, be, act, n, pattern, start);
    op(&g, be, act, k, &r);
    float *f32 = zt_test_zeros(n), *got = zt_test_zeros(n);
    case_finish(&g, act, f32, got);

    float *want = zt_test_zeros(n);
    for (size_t i = 0; i < n; i++)
        want[i] = zt_test_round(start[i] + contribution[i], act);
    CHECK_CLOSE(got, want, n, zt_test_tol(act), "%s on %s at %s: the 16-bit gradients", what,
                be->name, zt_dtype_name(act));
    CHECK_SAME(f32, pattern, n, "%s on %s at %s: the fp32 gradients untouched", what, be->name,
               zt_dtype_name(act));
    free(pattern), free(start), free(contribution), free(f32), free(got), free(want);
}

/* An activation of n random elements held at act, on the case's device. */
static void *act_in(grad_case *g, zt_dtype act, zt_test_rng *r, size_t n, double mean,
                    double std) {
    float *h = zt_test_random(r, n, mean, std);
    zt_test_round_all(h, n, act);
    void *d = zt_test_dev_act(&g->d, h, n);
    free(h);
    return d;
}

/* ---- the ops ---------------------------------------------------------------------------------- */

enum { EMB_B = 2, EMB_T = 5, EMB_V = 11 };
static const int emb_c[] = {16, 13}; /* whole 16-byte chunks; rows at every alignment */

/* [pad | wte (V×C) | wpe (T×C)], pad = k: the tables an element off 16-byte alignment too. */
static size_t emb_n(int k) { return (size_t)k + (size_t)(EMB_V + EMB_T) * emb_c[k]; }

static void emb_op(grad_case *g, zt_backend *be, zt_dtype act, int k, zt_test_rng *r) {
    const int C = emb_c[k];
    int32_t tokens[EMB_B * EMB_T];
    for (int i = 0; i < EMB_B * EMB_T; i++)
        tokens[i] = zt_test_int(r, 0, EMB_V - 1);
    tokens[3] = tokens[7]; /* a token twice: one row sums two positions */
    void *dout = act_in(g, act, r, (size_t)EMB_B * EMB_T * C, 0.0, 1.0);
    float *wte = g->grads + k, *wpe = wte + (size_t)EMB_V * C;
    be->ops->embedding_backward(&g->d.ctx, wte, wpe, dout, tokens, EMB_B, EMB_T, C);
}

/* A 16-bit buffer that covers the token table's first 4 rows only while a token selects row
 * V - 1: the backward must add every row into the fp32 gradients (it is not told the
 * vocabulary), neither into the 16-bit buffer up to its end nor past it. The buffer is allocated
 * whole, so an op that wrote it shows as a change there rather than as a write outside it. */
static void emb_short_compare(zt_backend *cpu, zt_backend *be, zt_dtype act) {
    const int C = emb_c[0], rows = 4;
    const size_t n = emb_n(0), cover = (size_t)rows * C, m = (size_t)EMB_B * EMB_T * C;
    zt_test_rng r = zt_test_rng_for("embedding short twin", 60);
    float *pattern = zt_test_random(&r, n, 0.0, 1.0), *start = zt_test_random(&r, n, 0.0, 0.5);
    zt_test_round_all(start, n, act);
    int32_t tokens[EMB_B * EMB_T];
    for (int i = 0; i < EMB_B * EMB_T; i++)
        tokens[i] = zt_test_int(&r, 0, rows - 1);
    tokens[6] = EMB_V - 1;
    float *douth = zt_test_random(&r, m, 0.0, 1.0);
    zt_test_round_all(douth, m, act);

    grad_case g;
    case_init(&g, cpu, act, n, NULL, NULL);
    void *dout = zt_test_dev_act(&g.d, douth, m);
    cpu->ops->embedding_backward(&g.d.ctx, g.grads, g.grads + (size_t)EMB_V * C, dout, tokens,
                                 EMB_B, EMB_T, C);
    float *contribution = zt_test_zeros(n);
    case_finish(&g, act, contribution, NULL);

    case_init(&g, be, act, n, pattern, start);
    g.twin.n = cover;
    dout = zt_test_dev_act(&g.d, douth, m);
    be->ops->embedding_backward(&g.d.ctx, g.grads, g.grads + (size_t)EMB_V * C, dout, tokens,
                                EMB_B, EMB_T, C);
    float *f32 = zt_test_zeros(n), *got = zt_test_zeros(n), *want = zt_test_zeros(n);
    case_finish(&g, act, f32, got);
    for (size_t i = 0; i < n; i++)
        want[i] = pattern[i] + contribution[i];
    CHECK_CLOSE(f32, want, n, zt_test_tol(act), "embedding_backward on %s at %s with a 16-bit "
                "buffer of %d rows and token %d: the fp32 gradients", be->name,
                zt_dtype_name(act), rows, EMB_V - 1);
    CHECK_SAME(got, start, n, "embedding_backward on %s at %s with a 16-bit buffer of %d rows "
               "and token %d: the 16-bit buffer untouched", be->name, zt_dtype_name(act), rows,
               EMB_V - 1);
    free(pattern), free(start), free(douth), free(contribution), free(f32), free(got), free(want);
}

static const int norm_shape[][2] = {{5, 40}, {7, 37}}; /* N, C */

/* [pad | w | b], pad = k. */
static size_t norm_n(int k) { return (size_t)k + 2 * (size_t)norm_shape[k][1]; }

static void norm_op(grad_case *g, zt_backend *be, zt_dtype act, int k, zt_test_rng *r, bool rms) {
    const int N = norm_shape[k][0], C = norm_shape[k][1];
    size_t n = (size_t)N * C;
    float *wh = zt_test_random(r, (size_t)C, 1.0, 0.3), *bh = zt_test_random(r, (size_t)C, 0, 0.3);
    zt_test_round_all(wh, (size_t)C, act);
    zt_test_round_all(bh, (size_t)C, act);
    float *w = zt_test_dev_f32(&g->d, wh, (size_t)C), *b = zt_test_dev_f32(&g->d, bh, (size_t)C);
    void *inp = act_in(g, act, r, n, 0.5, 1.5), *dout = act_in(g, act, r, n, 0.0, 1.0);
    size_t es = zt_test_act_size(be, act);
    void *out = zt_test_dev_alloc(&g->d, n * es), *dinp = zt_test_dev_alloc(&g->d, n * es);
    float *mean = zt_test_dev_alloc(&g->d, N * sizeof(float));
    float *rstd = zt_test_dev_alloc(&g->d, N * sizeof(float));
    float *dw = g->grads + k, *db = dw + C;
    if (rms) {
        be->ops->rmsnorm_forward(&g->d.ctx, out, rstd, inp, w, 1e-5f, N, C);
        be->ops->rmsnorm_backward(&g->d.ctx, dinp, dw, dout, inp, w, rstd, N, C);
    } else {
        be->ops->layernorm_forward(&g->d.ctx, out, mean, rstd, inp, w, b, N, C);
        be->ops->layernorm_backward(&g->d.ctx, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    }
    free(wh), free(bh);
}

static void layernorm_op(grad_case *g, zt_backend *be, zt_dtype act, int k, zt_test_rng *r) {
    norm_op(g, be, act, k, r, false);
}
static void rmsnorm_op(grad_case *g, zt_backend *be, zt_dtype act, int k, zt_test_rng *r) {
    norm_op(g, be, act, k, r, true);
}

/* Linear cases: N, C, OC, layout; the gradients [pad | W | bias] with pad 8 (16-byte aligned in
 * 16 bits, as cuBLASLt needs its matrices) and the bias right after W (off alignment where C·OC
 * is odd). */
static const int lin_shape[][4] = {{6, 16, 24, ZT_W_IN_OUT}, {5, 24, 8, ZT_W_OUT_IN}};
enum { LIN_PAD = 8 };

static size_t lin_n(int k) {
    return LIN_PAD + (size_t)lin_shape[k][1] * lin_shape[k][2] + (size_t)lin_shape[k][2];
}

static void linear_op(grad_case *g, zt_backend *be, zt_dtype act, int k, zt_test_rng *r,
                      bool gelu) {
    const int N = lin_shape[k][0], C = lin_shape[k][1], OC = lin_shape[k][2];
    const zt_weight_layout layout = (zt_weight_layout)lin_shape[k][3];
    float *wh = zt_test_random(r, (size_t)C * OC, 0.0, 0.3);
    zt_test_round_all(wh, (size_t)C * OC, act);
    float *w = zt_test_dev_f32(&g->d, wh, (size_t)C * OC);
    void *inp = act_in(g, act, r, (size_t)N * C, 0.0, 1.0);
    void *dout = act_in(g, act, r, (size_t)N * OC, 0.0, 1.0);
    void *dinp = zt_test_dev_alloc(&g->d, (size_t)N * C * zt_test_act_size(be, act));
    float *dw = g->grads + LIN_PAD, *dbias = dw + (size_t)C * OC;
    if (gelu) {
        /* The GELU variant's dW and bias are the same products (its input gradient is GELU's). */
        void *pre = act_in(g, act, r, (size_t)N * C, 0.0, 1.0);
        be->ops->linear_backward_gelu(&g->d.ctx, dinp, dw, dbias, dout, inp, pre, w, N, C, OC,
                                      layout);
    } else {
        be->ops->linear_backward(&g->d.ctx, dinp, dw, dbias, dout, inp, w, N, C, OC, layout,
                                 false);
    }
    free(wh);
}

static void linear_plain_op(grad_case *g, zt_backend *be, zt_dtype act, int k, zt_test_rng *r) {
    linear_op(g, be, act, k, r, false);
}
static void linear_gelu_op(grad_case *g, zt_backend *be, zt_dtype act, int k, zt_test_rng *r) {
    linear_op(g, be, act, k, r, true);
}

static void grad_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)r;
    if (act == ZT_F32 || !be->writes_grad16)
        return; /* 16-bit gradients are only ever in the activations' 16-bit type */
    for (int k = 0; k < 2; k++) {
        compare_op(cpu, be, act, "embedding_backward", emb_n(k), emb_op, k, 10 + k);
        compare_op(cpu, be, act, "layernorm_backward", norm_n(k), layernorm_op, k, 20 + k);
        compare_op(cpu, be, act, "rmsnorm_backward", norm_n(k), rmsnorm_op, k, 30 + k);
        compare_op(cpu, be, act, "linear_backward", lin_n(k), linear_plain_op, k, 40 + k);
        compare_op(cpu, be, act, "linear_backward_gelu", lin_n(k), linear_gelu_op, k, 50 + k);
    }
    emb_short_compare(cpu, be, act);
}

static const char *const grad_entries[] = {
    "embedding_backward", "layernorm_forward", "layernorm_backward", "rmsnorm_forward",
    "rmsnorm_backward",   "linear_backward",   "linear_backward_gelu", NULL};

static void grad_check(const zt_test_env *env) {
    zt_test_each_backend(env, "grad twin", grad_entries, true, grad_compare);
}

/* The entries are their own families' (each entry belongs to one): this family owns none. */
static const char *const owned[] = {NULL};

const zt_test_family zt_test_grad_twin = {"grad_twin", owned, grad_check, NULL};
