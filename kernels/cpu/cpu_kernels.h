/* The CPU backend's kernels, one op family per file, on fp32 host memory; ops_cpu.c gathers them
 * into the backend's op table (ztrain/ops.h). Semantics of every function are those of the matching
 * zt_ops entry. A kernel given `act` holds the activations (or activation gradients) it writes at
 * that precision (ZT_F32: as computed; ZT_BF16, ZT_F16: rounded to nearest even), rounding each
 * row or run inside its own parallel loop right after writing it (zt_cpu_round_run), so a held
 * rounding costs neither a pass of its own nor a fork and join. */
#ifndef ZTRAIN_CPU_KERNELS_H
#define ZTRAIN_CPU_KERNELS_H

#include "ztrain/ops.h"

/* The CPU backend's op table (ops_cpu.c). */
const zt_ops *zt_cpu_ops(void);

/* Work memory for an op of the CPU backend be (backend_cpu.c): at least `bytes`, grown to the
 * largest request once and kept, so the step loop does not allocate; valid until the next call;
 * freed with the backend. Only the ops of the thread that runs the model (one per backend) use
 * it; ops the communication thread may run at the same time (ZeRO's reductions) must not. */
void *zt_cpu_scratch(struct zt_backend *be, size_t bytes);

/* embedding.c (wpe and dwpe may be NULL) */
void zt_cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C, zt_dtype act);
void zt_cpu_embedding_backward(float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C);
/* layernorm.c (b and db may be NULL) */
void zt_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C, zt_dtype act);
void zt_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C, zt_dtype act);
/* rmsnorm.c */
void zt_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, float eps,
                            int N, int C, zt_dtype act);
/* part: work memory of zt_cpu_rmsnorm_backward_scratch(N, C) floats, for the weight gradient's
 * partial sums. */
size_t zt_cpu_rmsnorm_backward_scratch(int N, int C);
void zt_cpu_rmsnorm_backward(float *dinp, float *dw, float *part, const float *dout,
                             const float *inp, const float *w, const float *rstd, int N, int C,
                             zt_dtype act);
/* rope.c: in place over rows of row_stride floats (the rotated n_heads·head_dim are held) */
void zt_cpu_rope_forward(float *x, const float *cos, const float *sin, int B, int T, int n_heads,
                         int head_dim, size_t row_stride, zt_dtype act);
void zt_cpu_rope_backward(float *dx, const float *cos, const float *sin, int B, int T,
                          int n_heads, int head_dim, size_t row_stride, zt_dtype act);
/* linear.c: W is [C,OC], or [OC,C] when w_transposed; act is the activations' precision, at
 * which out (after the residual add) and dinp are held, and with which a bf16 job's products may
 * run on bf16 instructions (gemm.h) */
void zt_cpu_linear_forward(float *out, const float *inp, const float *w, const float *bias,
                           const float *residual, int N, int C, int OC, bool w_transposed,
                           zt_dtype act);
void zt_cpu_linear_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC,
                            bool w_transposed, bool accumulate_dinp, zt_dtype act);
/* attention.c: the shapes of zt_attn_shape (packed: k, v and dk, dv are NULL) */
void zt_cpu_attention_forward(float *out, float *att, const zt_attn_shape *s, const float *q,
                              const float *k, const float *v, zt_dtype act);
void zt_cpu_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                               const zt_attn_shape *s, const float *q, const float *k,
                               const float *v, const float *att, zt_dtype act);
/* Elementwise kernels split their n elements into runs of this many (64 KiB of fp32), one run
 * at a time per thread. */
#define ZT_CPU_RUN ((size_t)16384)
/* elementwise.c */
void zt_cpu_gelu_forward(float *out, const float *inp, size_t n, zt_dtype act);
void zt_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                          zt_dtype act);
void zt_cpu_add(float *out, const float *a, const float *b, size_t n, zt_dtype act);
/* swiglu.c (outputs may alias inputs) */
void zt_cpu_silu_mul_forward(float *out, const float *gate, const float *up, size_t n,
                             zt_dtype act);
void zt_cpu_silu_mul_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, size_t n, zt_dtype act);
/* softmax_xent.c (the gradient, when computed, is held at act); the partial pair is ops.h's
 * vocabulary-parallel cross-entropy */
void zt_cpu_xent_partial_stats(float *stats, const float *logits, const int32_t *targets, int N,
                               int V);
void zt_cpu_xent_partial_combine(float *logz, float *losses, const float *stats,
                                 const int32_t *targets, int N, int shards);
void zt_cpu_xent_partial_grad(float *logits, const float *logz, const int32_t *targets, int N,
                              int V, float grad_scale);
void zt_cpu_softmax_xent(float *losses, float *logits, const int32_t *targets, int N, int V,
                         float grad_scale, zt_dtype act);
/* optim.c */
void zt_cpu_adam_update(float *p, const float *g, float *m, float *v, size_t n,
                        const zt_adam_args *a);
void zt_cpu_sgd_update(float *p, const float *g, float *buf, size_t n, const zt_sgd_args *a);
double zt_cpu_sum_squares(const float *x, size_t n);
void zt_cpu_scale(float *x, size_t n, float s);
void zt_cpu_adam_update_mixed(float *master, const void *grad, zt_dtype grad_type,
                              float grad_mul, float *m, float *v, uint16_t *param16,
                              zt_dtype param_type, size_t n, const zt_adam_args *a);
/* lamb.c */
void zt_cpu_lamb_moments(const float *p, const float *g, float *m, float *v, size_t n,
                         const zt_lamb_args *a, double sums[2]);
void zt_cpu_lamb_apply(float *p, const float *m, const float *v, size_t n, const zt_lamb_args *a,
                       float step);
void zt_cpu_lamb_steps(float *steps, const double *sums, size_t n, const zt_lamb_step_args *a);
/* The path name zt_backend_cpu_optim_isa reports. */
const char *zt_cpu_optim_isa(void);

/* cast.c */
void zt_cpu_to_half(uint16_t *dst, const float *src, size_t n, zt_dtype t);
void zt_cpu_from_half(float *dst, const uint16_t *src, size_t n, zt_dtype t);
void zt_cpu_round_to(float *x, size_t n, zt_dtype t);
/* round_to on the calling thread alone, for a kernel's own parallel loop to round the run it just
 * wrote (one pass while it is in cache, no fork and join of its own); ZT_F32 leaves x as it is. */
void zt_cpu_round_run(float *x, size_t n, zt_dtype t);
void zt_cpu_accumulate_half(uint16_t *dst, const float *src, size_t n, zt_dtype t);
double zt_cpu_sum_squares_half(const uint16_t *x, size_t n, zt_dtype t);

#endif
