/* The CPU backend's op table. The kernels compute in fp32 on fp32 storage and hold every
 * activation output at the context's precision by rounding it in place (nearest even) inside their
 * own loops, which is how the CPU emulates 16-bit activations exactly; this layer passes them the
 * context's precision and adapts the general shapes of ops.h to what the kernels implement. */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"
#include "ztrain/status.h"

static void embedding_forward(const zt_ctx *x, void *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C) {
    zt_cpu_embedding_forward(out, tokens, wte, wpe, B, T, C, x->act);
}

static void embedding_backward(const zt_ctx *x, float *dwte, float *dwpe, const void *dout,
                               const int32_t *tokens, int B, int T, int C) {
    (void)x;
    zt_cpu_embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
}

static void layernorm_forward(const zt_ctx *x, void *out, float *mean, float *rstd,
                              const void *inp, const float *w, const float *b, int N, int C) {
    zt_cpu_layernorm_forward(out, mean, rstd, inp, w, b, N, C, x->act);
}

static void layernorm_backward(const zt_ctx *x, void *dinp, float *dw, float *db,
                               const void *dout, const void *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C) {
    zt_cpu_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, x->act);
}

static void rmsnorm_forward(const zt_ctx *x, void *out, float *rstd, const void *inp,
                            const float *w, float eps, int N, int C) {
    zt_cpu_rmsnorm_forward(out, rstd, inp, w, eps, N, C, x->act);
}

static void rmsnorm_backward(const zt_ctx *x, void *dinp, float *dw, const void *dout,
                             const void *inp, const float *w, const float *rstd, int N, int C) {
    float *part = zt_cpu_scratch(x->be, zt_cpu_rmsnorm_backward_scratch(N, C) * sizeof(float));
    zt_cpu_rmsnorm_backward(dinp, dw, part, dout, inp, w, rstd, N, C, x->act);
}

static void rope_forward(const zt_ctx *x, void *xq, const float *cos, const float *sin, int B,
                         int T, int n_heads, int head_dim, size_t row_stride) {
    zt_cpu_rope_forward(xq, cos, sin, B, T, n_heads, head_dim, row_stride, x->act);
}

static void rope_backward(const zt_ctx *x, void *dxq, const float *cos, const float *sin, int B,
                          int T, int n_heads, int head_dim, size_t row_stride) {
    zt_cpu_rope_backward(dxq, cos, sin, B, T, n_heads, head_dim, row_stride, x->act);
}

static void linear_forward(const zt_ctx *x, void *out, const void *inp, const float *w,
                           const float *bias, const void *residual, int N, int C, int OC,
                           zt_weight_layout layout) {
    zt_cpu_linear_forward(out, inp, w, bias, residual, N, C, OC, layout == ZT_W_OUT_IN, x->act);
}

static void linear_backward(const zt_ctx *x, void *dinp, float *dw, float *dbias,
                            const void *dout, const void *inp, const float *w, int N, int C,
                            int OC, zt_weight_layout layout, bool accumulate_dinp) {
    zt_cpu_linear_backward(dinp, dw, dbias, dout, inp, w, N, C, OC, layout == ZT_W_OUT_IN,
                           accumulate_dinp, x->act);
}

static void attention_forward(const zt_ctx *x, const zt_attn_shape *s, void *out, float *att,
                              const void *q, const void *k, const void *v) {
    zt_cpu_attention_forward(out, att, s, q, k, v, x->act);
}

static void attention_backward(const zt_ctx *x, const zt_attn_shape *s, void *dq, void *dk,
                               void *dv, float *scratch, const void *dout, const void *out,
                               const void *q, const void *k, const void *v, const float *att) {
    (void)out; /* the CPU keeps the probabilities, from which the backward needs no output */
    zt_cpu_attention_backward(dq, dk, dv, scratch, dout, s, q, k, v, att, x->act);
}

static void gelu_forward(const zt_ctx *x, void *out, const void *inp, size_t n) {
    zt_cpu_gelu_forward(out, inp, n, x->act);
}

static void gelu_backward(const zt_ctx *x, void *dinp, const void *inp, const void *dout,
                          size_t n) {
    zt_cpu_gelu_backward(dinp, inp, dout, n, x->act);
}

/* The fused entries are the two ops run one after the other: the CPU has no epilogue to fuse
 * into, and so its results stay those of the unfused sequence bit for bit. */
static void linear_gelu_forward(const zt_ctx *x, void *out, void *pre, const void *inp,
                                const float *w, const float *bias, int N, int C, int OC,
                                zt_weight_layout layout) {
    linear_forward(x, pre, inp, w, bias, NULL, N, C, OC, layout);
    gelu_forward(x, out, pre, (size_t)N * OC);
}

static void linear_backward_gelu(const zt_ctx *x, void *dpre, float *dw, float *dbias,
                                 const void *dout, const void *inp, const void *pre,
                                 const float *w, int N, int C, int OC, zt_weight_layout layout) {
    linear_backward(x, dpre, dw, dbias, dout, inp, w, N, C, OC, layout, false);
    gelu_backward(x, dpre, pre, dpre, (size_t)N * C);
}

static void silu_mul_forward(const zt_ctx *x, void *out, const void *gate, const void *up,
                             size_t n) {
    zt_cpu_silu_mul_forward(out, gate, up, n, x->act);
}

static void silu_mul_backward(const zt_ctx *x, void *dgate, void *dup, const void *dout,
                              const void *gate, const void *up, size_t n) {
    zt_cpu_silu_mul_backward(dgate, dup, dout, gate, up, n, x->act);
}

static void add(const zt_ctx *x, void *out, const void *a, const void *b, size_t n) {
    zt_cpu_add(out, a, b, n, x->act);
}

static void softmax_xent(const zt_ctx *x, float *losses, void *logits, const int32_t *targets,
                         int N, int V, float grad_scale) {
    zt_cpu_softmax_xent(losses, logits, targets, N, V, grad_scale, x->act);
}

static void xent_partial_stats(const zt_ctx *x, float *stats, const void *logits,
                               const int32_t *targets, int N, int V) {
    (void)x;
    zt_cpu_xent_partial_stats(stats, logits, targets, N, V);
}

static void xent_partial_grad(const zt_ctx *x, void *logits, const float *logz,
                              const int32_t *targets, int N, int V, float grad_scale) {
    zt_cpu_xent_partial_grad(logits, logz, targets, N, V, grad_scale);
    if (x->act != ZT_F32)
        zt_cpu_round_to(logits, (size_t)N * V, x->act);
}

static void xent_partial_combine(const zt_ctx *x, float *logz, float *losses,
                                 const float *stats, const int32_t *targets, int N,
                                 int shards) {
    (void)x;
    zt_cpu_xent_partial_combine(logz, losses, stats, targets, N, shards);
}

static void adam_update(const zt_ctx *x, float *p, const float *g, float *m, float *v, size_t n,
                        const zt_adam_args *a) {
    (void)x;
    zt_cpu_adam_update(p, g, m, v, n, a);
}

static void sgd_update(const zt_ctx *x, float *p, const float *g, float *buf, size_t n,
                       const zt_sgd_args *a) {
    (void)x;
    zt_cpu_sgd_update(p, g, buf, n, a);
}

static void adam_update_mixed(const zt_ctx *x, float *master, const void *grad,
                              zt_dtype grad_type, float grad_mul, float *m, float *v,
                              uint16_t *param16, zt_dtype param_type, size_t n,
                              const zt_adam_args *a) {
    (void)x;
    zt_cpu_adam_update_mixed(master, grad, grad_type, grad_mul, m, v, param16, param_type, n, a);
}

static void lamb_moments(const zt_ctx *x, const float *p, const float *g, float *m, float *v,
                         size_t n, const zt_lamb_args *a, double sums[2]) {
    (void)x;
    zt_cpu_lamb_moments(p, g, m, v, n, a, sums);
}

/* Device memory is host memory here: the sums are added where they are asked for. */
static void lamb_moments_to(const zt_ctx *x, const float *p, const float *g, float *m, float *v,
                            size_t n, const zt_lamb_args *a, double *sums) {
    (void)x;
    double piece[2];
    zt_cpu_lamb_moments(p, g, m, v, n, a, piece);
    sums[0] += piece[0];
    sums[1] += piece[1];
}

static void lamb_steps(const zt_ctx *x, float *steps, const double *sums, size_t n,
                       const zt_lamb_step_args *a) {
    (void)x;
    zt_cpu_lamb_steps(steps, sums, n, a);
}

static void lamb_apply(const zt_ctx *x, float *p, const float *m, const float *v, size_t n,
                       const zt_lamb_args *a, const float *step) {
    (void)x;
    zt_cpu_lamb_apply(p, m, v, n, a, *step);
}

/* The CPU's fused mixed-precision SGD and LAMB apply are the separate passes, a stack-sized
 * piece at a time: the reference their GPU kernels reproduce, with the same bits (each element's
 * result does not depend on where a piece starts). */
enum { MIXED_PIECE = 4096 };

static void sgd_update_mixed(const zt_ctx *x, float *master, const void *grad, zt_dtype grad_type,
                             float grad_mul, float *buf, uint16_t *param16, zt_dtype param_type,
                             size_t n, const zt_sgd_args *a) {
    (void)x;
    ZT_ASSERT(grad_type == ZT_F32 || grad_type == ZT_BF16 || grad_type == ZT_F16);
    float g[MIXED_PIECE];
    for (size_t c = 0; c < n; c += MIXED_PIECE) {
        size_t len = n - c < MIXED_PIECE ? n - c : MIXED_PIECE;
        if (grad_type == ZT_F32)
            memcpy(g, (const float *)grad + c, len * sizeof(float));
        else
            zt_cpu_from_half(g, (const uint16_t *)grad + c, len, grad_type);
        zt_cpu_scale(g, len, grad_mul);
        zt_cpu_sgd_update(master + c, g, buf ? buf + c : NULL, len, a);
        if (param16)
            zt_cpu_to_half(param16 + c, master + c, len, param_type);
    }
}

static void lamb_apply_mixed(const zt_ctx *x, float *p, const float *m, const float *v, size_t n,
                             const zt_lamb_args *a, const float *step, uint16_t *param16,
                             zt_dtype param_type) {
    (void)x;
    zt_cpu_lamb_apply(p, m, v, n, a, *step);
    zt_cpu_to_half(param16, p, n, param_type);
}

static double sum_squares(const zt_ctx *x, const float *v, size_t n) {
    (void)x;
    return zt_cpu_sum_squares(v, n);
}

static void scale(const zt_ctx *x, float *v, size_t n, float s) {
    (void)x;
    zt_cpu_scale(v, n, s);
}

static void to_half(const zt_ctx *x, uint16_t *dst, const float *src, size_t n, zt_dtype t) {
    (void)x;
    zt_cpu_to_half(dst, src, n, t);
}

static void from_half(const zt_ctx *x, float *dst, const uint16_t *src, size_t n, zt_dtype t) {
    (void)x;
    zt_cpu_from_half(dst, src, n, t);
}

static void round_to(const zt_ctx *x, float *v, size_t n, zt_dtype t) {
    (void)x;
    zt_cpu_round_to(v, n, t);
}

static void accumulate_half(const zt_ctx *x, uint16_t *dst, const float *src, size_t n,
                            zt_dtype t) {
    (void)x;
    zt_cpu_accumulate_half(dst, src, n, t);
}

static double sum_squares_half(const zt_ctx *x, const uint16_t *v, size_t n, zt_dtype t) {
    (void)x;
    return zt_cpu_sum_squares_half(v, n, t);
}

/* Device memory is host memory here: the sum is written at once. The plain sum adds in index
 * order, as a host loop over the losses would. */
static void sum_to(const zt_ctx *x, double *out, const void *v, size_t n, zt_dtype t,
                   bool squares) {
    if (t != ZT_F32) {
        ZT_ASSERT(squares);
        *out = sum_squares_half(x, v, n, t);
    } else if (squares) {
        *out = sum_squares(x, v, n);
    } else {
        const float *f = v;
        double s = 0.0;
        for (size_t i = 0; i < n; i++)
            s += f[i];
        *out = s;
    }
}

/* fma, as the op states (and as a -march=native build contracts the host loop it replaces). */
static void weighted_sum_to(const zt_ctx *x, double *out, const double *parts,
                            const double *weights, int n) {
    (void)x;
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s = weights ? fma(weights[i], parts[i], s) : s + parts[i];
    *out = s;
}

static const zt_ops cpu_ops = {
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .rmsnorm_forward = rmsnorm_forward,
    .rmsnorm_backward = rmsnorm_backward,
    .rope_forward = rope_forward,
    .rope_backward = rope_backward,
    .linear_forward = linear_forward,
    .linear_backward = linear_backward,
    .linear_gelu_forward = linear_gelu_forward,
    .linear_backward_gelu = linear_backward_gelu,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .silu_mul_forward = silu_mul_forward,
    .silu_mul_backward = silu_mul_backward,
    .add = add,
    .softmax_xent = softmax_xent,
    .xent_partial_stats = xent_partial_stats,
    .xent_partial_grad = xent_partial_grad,
    .xent_partial_combine = xent_partial_combine,
    .adam_update = adam_update,
    .sgd_update = sgd_update,
    .adam_update_mixed = adam_update_mixed,
    .sgd_update_mixed = sgd_update_mixed,
    .lamb_moments = lamb_moments,
    .lamb_moments_to = lamb_moments_to,
    .lamb_steps = lamb_steps,
    .lamb_apply = lamb_apply,
    .lamb_apply_mixed = lamb_apply_mixed,
    .sum_squares = sum_squares,
    .scale = scale,
    .to_half = to_half,
    .from_half = from_half,
    .round_to = round_to,
    .accumulate_half = accumulate_half,
    .sum_squares_half = sum_squares_half,
    .sum_to = sum_to,
    .weighted_sum_to = weighted_sum_to,
};

const zt_ops *zt_cpu_ops(void) { return &cpu_ops; }
