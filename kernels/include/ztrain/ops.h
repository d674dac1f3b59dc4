/* The ops: what a model, ZeRO and the optimizer compute, as one table that every backend fills.
 *
 * Model code calls these entries and never a backend's kernels directly, so a new device is a new
 * table. Every op takes a zt_ctx: the backend that runs it (its memory, stream and handles) and
 * the precision activations are held at.
 *
 * Tensors are row-major; shapes are given in brackets, N is a number of rows (tokens), C a row's
 * width. Pointers are the backend's device memory (zt_backend_alloc with ZT_MEM_DEVICE), except
 * tokens, targets and the optimizer's argument structs, which the caller keeps in host memory.
 * Three kinds of tensor, three storage rules:
 * - activations and activation gradients (`void *`): held at ctx->act precision. A backend that
 *   computes in that type stores it; the CPU stores fp32 values rounded to ctx->act after every op
 *   (round to nearest even), which gives the values 16-bit storage would, bit for bit. Which
 *   outputs are activations is said at each op.
 * - parameters and parameter gradients (`float *`): the model's fp32 working copy of a layer.
 *   In mixed precision a parameter may also have a 16-bit twin that the ops may read instead
 *   (zt_param16 below): the same values, already in the activations' type; and a gradient a
 *   16-bit buffer that the ops may accumulate into instead (zt_grad16).
 * - statistics (LayerNorm's mean and rstd, softmax probabilities, losses): fp32 always.
 * "Accumulates" means the op adds into the output (parameter gradients across micro-steps, a
 * residual stream's gradient across branches); otherwise it overwrites. Ops never allocate and
 * never fail: shapes are checked by the model at creation. An entry a backend does not have is
 * NULL; a model checks the entries it needs when it is created. */
#ifndef ZTRAIN_OPS_H
#define ZTRAIN_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/dtype.h"

struct zt_backend;

/* The 16-bit working copy of a flat fp32 parameter buffer (DeepSpeed's bf16 optimizer keeps
 * the model in 16 bits and fp32 masters in the optimizer): half[i] is f32[i] rounded to type,
 * for i < n. Whoever installs one (ZeRO's mixed precision: its 16-bit parameters beside the
 * model's fp32 working copy) keeps that true whenever an op may read a parameter: the optimizer
 * writes the twin from the masters once per step, in the pass that writes the masters
 * (adam_update_mixed, sgd_update_mixed, lamb_apply_mixed), and loads, gathers and
 * initialisation fill both. A backend whose products
 * run in 16 bits reads a weight's and a bias's twin here instead of rounding the fp32 values at
 * every product (the CUDA backend's linear ops); a weight outside [f32, f32 + n), or a type
 * other than the activations', is rounded as before. The CPU ignores it (it computes from the
 * fp32 values, which the twin equals), so its results do not depend on it. A backend whose
 * every op reads the twin (backend.h, reads_param16) lets the installer leave the fp32 side
 * unfilled: ZeRO's mixed precision then holds no fp32 working copy in a step. Not owned by the
 * ctx; it must outlive the ops that read it. */
typedef struct {
    const float *f32;
    const uint16_t *half;
    size_t n;
    zt_dtype type; /* ZT_BF16 or ZT_F16 */
} zt_param16;

/* The 16-bit gradients beside a flat fp32 gradient buffer (ZeRO's mixed precision at stages 0-1
 * keeps the gradients in 16 bits, accumulating over micro-steps): half[i] is where the gradient
 * f32[i] accumulates, for i < n. A backend that says so (backend.h, writes_grad16) has every op
 * that accumulates a parameter gradient covered by it add its contribution into half instead,
 * in fp32 and rounded to nearest even once per op (the rounding accumulate_half would give the
 * fp32 gradient the op would otherwise have written, bit for bit, for a tensor that one op
 * writes in a micro-step; a tied embedding written by two ops is rounded twice, as autograd's
 * 16-bit accumulation rounds it). The fp32 side is then neither read nor written, so the
 * installer need not hold it: only its addresses matter, as keys (the model's fp32 gradients
 * are then a reservation holding no memory at any size, backend.h zt_backend_reserve). The CPU
 * ignores it. Not owned by the ctx. */
typedef struct {
    const float *f32;
    uint16_t *half;
    size_t n;
    zt_dtype type; /* ZT_BF16 or ZT_F16: the activations' type */
} zt_grad16;

/* Streams every backend has. Communication runs on its own stream so that gradient reductions
 * overlap the backward of the layers below. */
typedef enum { ZT_STREAM_COMPUTE = 0, ZT_STREAM_COMM, ZT_STREAMS } zt_stream;

/* What every op call carries. */
typedef struct {
    struct zt_backend *be;
    zt_dtype act;             /* precision of activations: ZT_F32, ZT_BF16 or ZT_F16 */
    const zt_param16 *param16; /* the parameters' 16-bit twin, or NULL (see zt_param16) */
    const zt_grad16 *grad16;   /* the gradients' 16-bit buffer, or NULL (see zt_grad16) */
    /* The stream the op is issued on: compute (0, what a ctx initialised by field names gets)
     * but for ZeRO's communication thread, whose jobs run their element-wise ops (add, to_half,
     * from_half, round_to, accumulate_half) on the communication stream, in order with their
     * collectives and without touching the compute stream. An op that uses the backend's scratch
     * (sums, uploads, matmul workspaces, attention) shares it with every other op and runs on
     * the compute stream only; the CUDA backend records a failure naming the op otherwise. */
    zt_stream stream;
} zt_ctx;

/* The element of t->half at address p when t covers p[0, n) in type act; else NULL. */
static inline void *zt_twin16_at(const float *f32, const uint16_t *half, size_t len, zt_dtype type,
                                 zt_dtype act, const float *p, size_t n) {
    if (!half || !p || type != act)
        return NULL;
    /* As addresses: p may point into another buffer altogether. */
    uintptr_t a = (uintptr_t)p, lo = (uintptr_t)f32;
    if (a < lo || (a - lo) / sizeof(float) + n > len)
        return NULL;
    return (void *)(half + (a - lo) / sizeof(float));
}

/* The twin of p[0, n) when x carries one that covers it in the activations' type; else NULL. */
static inline const uint16_t *zt_param16_of(const zt_ctx *x, const float *p, size_t n) {
    const zt_param16 *t = x->param16;
    return t ? (const uint16_t *)zt_twin16_at(t->f32, t->half, t->n, t->type, x->act, p, n) : NULL;
}

/* The 16-bit gradients of g[0, n) when x carries a zt_grad16 that covers it; else NULL. */
static inline uint16_t *zt_grad16_of(const zt_ctx *x, const float *g, size_t n) {
    const zt_grad16 *t = x->grad16;
    return t ? (uint16_t *)zt_twin16_at(t->f32, t->half, t->n, t->type, x->act, g, n) : NULL;
}

/* The target of a row the vocabulary-parallel cross-entropy leaves out (xent_partial_*). */
#define ZT_XENT_IGNORED (-2)

/* Weight layouts of a linear layer. */
typedef enum {
    ZT_W_IN_OUT = 0, /* W[C, OC]: Hugging Face's Conv1D (GPT-2) */
    ZT_W_OUT_IN,     /* W[OC, C]: torch.nn.Linear (Llama), and a tied LM head reading wte */
} zt_weight_layout;

/* The shape of a causal self-attention. q holds n_head heads and k, v n_kv_head heads of head_dim
 * each; n_head is a multiple of n_kv_head (grouped-query attention: query head h reads kv head
 * h / (n_head / n_kv_head)). Packed: q points at rows of [B, T, (n_head + 2·n_kv_head)·head_dim]
 * holding q | k | v, and k and v are NULL. Otherwise q[B, T, n_head·head_dim],
 * k[B, T, n_kv_head·head_dim] and v[B, T, n_kv_head·head_dim] are separate. The scale is
 * 1/sqrt(head_dim). */
typedef struct {
    int B, T;
    int n_head, n_kv_head, head_dim;
    bool packed;
    int window; /* sliding window (Mistral): a query sees at most the last `window` positions,
                   itself included; 0 for no limit */
    /* Packed documents (several examples in one row, as flash-attn's varlen path and
     * transformers' DataCollatorWithFlattening lay them out): doc_pos[b·T + t] is token t's
     * position inside its document, 0 at a document's first token and one more than the
     * previous token's otherwise, so the document starts at t - doc_pos[b·T + t] and a query
     * sees only the keys of its own document (a block-diagonal causal mask), together with the
     * window. In device memory; NULL: each row is one document. */
    const int32_t *doc_pos;
} zt_attn_shape;

typedef struct {
    float lr;
    float beta1, beta2, eps;
    float weight_decay;
    float bias_correction1; /* 1 - beta1^t, or 1 when bias correction is off */
    float bias_correction2; /* 1 - beta2^t, or 1 when bias correction is off */
    bool adamw_mode;        /* decoupled decay p -= lr*wd*p; else L2: g += wd*p */
    bool maximize;          /* torch's maximize: the gradient is negated before anything else */
} zt_adam_args;

/* LAMB as DeepSpeed's FusedLamb computes it (csrc/lamb/fused_lamb_cuda_kernel.cu): Adam's moments
 * without bias correction, an update u = m / (sqrt(v) + eps) + weight_decay·p (sqrt(v + eps) with
 * eps_inside_sqrt), and p -= step_size · trust · u, where the trust ratio ||p|| / ||u|| of the whole
 * parameter tensor is clamped to [min_coeff, max_coeff] (1 when either norm is 0) and step_size
 * carries the bias correction. The two ops are its two passes; the caller sums a tensor's
 * pieces in between. */
typedef struct {
    float beta1, beta2, eps;
    float weight_decay;
    bool eps_inside_sqrt;
} zt_lamb_args;

/* What lamb_steps turns each tensor's two sums into its step: FusedLamb's bias-corrected step
 * size (lr·sqrt(bc2)/bc1 in float, from host values alone, so the caller computes it) and the
 * trust ratio's bounds. */
typedef struct {
    float step_size;
    float max_coeff, min_coeff;
} zt_lamb_step_args;

typedef struct {
    float lr;
    float momentum, dampening, weight_decay;
    bool nesterov;
    bool maximize;   /* torch's maximize: the gradient is negated before anything else */
    bool first_step; /* torch initialises the momentum buffer to the first gradient */
} zt_sgd_args;

typedef struct zt_ops {
    /* ---- model ops ------------------------------------------------------------------------ */

    /* out[B,T,C] = wte[tok] + wpe[t] (activation); wpe NULL: no learned positions (Llama). A
     * token < 0 has no row (a vocabulary-parallel shard that does not hold it): its output is
     * wpe[t] alone (zeros without wpe), and the backward adds nothing for it to dwte. */
    void (*embedding_forward)(const zt_ctx *x, void *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C);
    /* Accumulates dwte[V,C] and, when not NULL, dwpe[T,C] from dout[B,T,C]. */
    void (*embedding_backward)(const zt_ctx *x, float *dwte, float *dwpe, const void *dout,
                               const int32_t *tokens, int B, int T, int C);

    /* out[N,C] = (inp - mean) * rstd * w + b (activation; b may be NULL); saves mean[N] and
     * rstd[N] for the backward. eps 1e-5. */
    void (*layernorm_forward)(const zt_ctx *x, void *out, float *mean, float *rstd,
                              const void *inp, const float *w, const float *b, int N, int C);
    /* Accumulates dinp[N,C] (activation gradient: the sum is held), dw[C] and db[C] (db may be
     * NULL). */
    void (*layernorm_backward)(const zt_ctx *x, void *dinp, float *dw, float *db,
                               const void *dout, const void *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C);

    /* RMSNorm (Llama): out[N,C] = inp * rstd * w with rstd = 1/sqrt(mean(inp²) + eps), computed
     * in fp32 (activation); saves rstd[N] (fp32). */
    void (*rmsnorm_forward)(const zt_ctx *x, void *out, float *rstd, const void *inp,
                            const float *w, float eps, int N, int C);
    /* Accumulates dinp[N,C] (activation gradient: the sum is held) and dw[C]. */
    void (*rmsnorm_backward)(const zt_ctx *x, void *dinp, float *dw, const void *dout,
                             const void *inp, const float *w, const float *rstd, int N, int C);

    /* Rotary embedding (Llama) in place over rows of x: token (b, t) starts at
     * x + (b·T + t)·row_stride (row_stride counts elements) and its first n_heads·head_dim
     * elements are n_heads heads of head_dim (even); the rest of the row is left as it is, so q
     * and k rotate inside a packed q|k|v row. Dimension j < head_dim/2 of a head pairs with
     * j + head_dim/2 (Hugging Face's rotate_half):
     *   (a, b) -> (a·cos[t][j] - b·sin[t][j], b·cos[t][j] + a·sin[t][j]).
     * cos and sin are [T, head_dim/2] tables in device memory that the model computes once
     * (theta and any rope_scaling are its business). The backward rotates by the negative
     * angle, in place over the gradient. Both hold their result. */
    void (*rope_forward)(const zt_ctx *x, void *xq, const float *cos, const float *sin, int B,
                         int T, int n_heads, int head_dim, size_t row_stride);
    void (*rope_backward)(const zt_ctx *x, void *dxq, const float *cos, const float *sin, int B,
                          int T, int n_heads, int head_dim, size_t row_stride);

    /* out[N,OC] = inp[N,C] · W + bias + residual (activation). W is [C,OC] or [OC,C] as layout
     * says; bias[OC] and residual[N,OC] may be NULL. The residual add is fused so that a block's
     * output is held once, as the sum. */
    void (*linear_forward)(const zt_ctx *x, void *out, const void *inp, const float *w,
                           const float *bias, const void *residual, int N, int C, int OC,
                           zt_weight_layout layout);
    /* dinp[N,C] (activation gradient; not computed when NULL) is overwritten, or accumulated into
     * when accumulate_dinp (two layers reading one input, as Llama's gate and up); dw and dbias
     * accumulate (each may be NULL). */
    void (*linear_backward)(const zt_ctx *x, void *dinp, float *dw, float *dbias,
                            const void *dout, const void *inp, const float *w, int N, int C,
                            int OC, zt_weight_layout layout, bool accumulate_dinp);

    /* A linear layer followed by GELU (GPT-2's MLP), for backends that fuse the activation into
     * the product's epilogue as cuBLASLt does: pre[N,OC] = inp · W + bias and out[N,OC] =
     * gelu(pre) (tanh form, as gelu_forward), both activations kept for the backward. A fusing
     * backend may compute gelu from pre before pre is rounded to its storage type; the CPU runs
     * linear_forward and gelu_forward, so its results are theirs bit for bit. */
    void (*linear_gelu_forward)(const zt_ctx *x, void *out, void *pre, const void *inp,
                                const float *w, const float *bias, int N, int C, int OC,
                                zt_weight_layout layout);
    /* The backward of a layer whose input is gelu(pre) (pre[N,C], saved by linear_gelu_forward),
     * carried through the GELU: dpre[N,C] = (dout · Wᵀ) ⊙ gelu'(pre) is overwritten (an
     * activation gradient; on the CPU, linear_backward then gelu_backward); dw and dbias
     * accumulate as in linear_backward (each may be NULL). */
    void (*linear_backward_gelu)(const zt_ctx *x, void *dpre, float *dw, float *dbias,
                                 const void *dout, const void *inp, const void *pre,
                                 const float *w, int N, int C, int OC, zt_weight_layout layout);

    /* Causal self-attention (see zt_attn_shape) into out[B,T,n_head·head_dim] (activation).
     * att keeps what the backward needs, fp32, in one of two forms (zt_backend.attn_lse says
     * which, zt_attn_state_floats how many floats): the softmax probabilities [B,n_head,T,T]
     * (zero where the mask is), or only the natural-log log-sum-exp of each row's scaled,
     * masked scores [B,n_head,T], from which a flash-style backward recomputes them. Every shape
     * zt_attn_shape allows: packed or separate, grouped-query heads, any head_dim, with or
     * without a window or packed documents. */
    void (*attention_forward)(const zt_ctx *x, const zt_attn_shape *s, void *out, float *att,
                              const void *q, const void *k, const void *v);
    /* Overwrites dq, dk, dv (activation gradients, laid out as q, k, v; packed: dq holds the
     * whole q|k|v rows and dk, dv are NULL) from dout; a kv head's gradient sums over the query
     * heads of its group. out is the forward's output and att what it kept; scratch is work
     * space of zt_attn_state_floats floats. */
    void (*attention_backward)(const zt_ctx *x, const zt_attn_shape *s, void *dq, void *dk,
                               void *dv, float *scratch, const void *dout, const void *out,
                               const void *q, const void *k, const void *v, const float *att);

    /* tanh-approximated GELU, as GPT-2 (torch's approximate="tanh"); out[n] is an activation. */
    void (*gelu_forward)(const zt_ctx *x, void *out, const void *inp, size_t n);
    /* Overwrites dinp[n] (held); dinp may alias dout. */
    void (*gelu_backward)(const zt_ctx *x, void *dinp, const void *inp, const void *dout,
                          size_t n);

    /* SwiGLU's gate (Llama): out[n] = silu(gate) · up, silu(g) = g / (1 + exp(-g)) (activation);
     * out may alias gate or up. */
    void (*silu_mul_forward)(const zt_ctx *x, void *out, const void *gate, const void *up,
                             size_t n);
    /* Overwrites dgate[n] and dup[n] (held); each may alias one of dout, gate and up, the two
     * not the same one. */
    void (*silu_mul_backward)(const zt_ctx *x, void *dgate, void *dup, const void *dout,
                              const void *gate, const void *up, size_t n);

    /* out = a + b (activation; out may alias a or b). */
    void (*add)(const zt_ctx *x, void *out, const void *a, const void *b, size_t n);

    /* Softmax cross-entropy over logits[N,V], fused with its backward: losses[N] receives
     * -log softmax(logits)[target] (fp32). When grad_scale != 0, logits are overwritten in place
     * by d(grad_scale · Σ losses)/dlogits = grad_scale · (softmax - onehot(target)), an
     * activation gradient. Targets < 0 are ignored (loss 0, gradient 0). */
    void (*softmax_xent)(const zt_ctx *x, float *losses, void *logits, const int32_t *targets,
                         int N, int V, float grad_scale);

    /* Vocabulary-parallel cross-entropy (tensor parallelism; Megatron's loss that never gathers
     * the logits): logits[N,V] is this shard's columns, targets (host memory) a local column, or
     * -1 when another shard holds the target, or ZT_XENT_IGNORED for a row without one. The
     * stats half writes stats[3N] (fp32 device memory): per row the shard's maximum m, the sum
     * of exp(logit - m), and the target's logit (0 when not here). The combine half turns every
     * shard's stats, gathered side by side, into the row's log-partition logz[N] and loss
     * losses[N] (fp32 device memory), and the grad half overwrites logits with grad_scale ·
     * (exp(logit - logz) - onehot(target)) (zeros for an ignored row), an activation gradient.
     * NULL on a backend without them, which then cannot train with tensor parallelism. */
    void (*xent_partial_stats)(const zt_ctx *x, float *stats, const void *logits,
                               const int32_t *targets, int N, int V);
    void (*xent_partial_grad)(const zt_ctx *x, void *logits, const float *logz,
                              const int32_t *targets, int N, int V, float grad_scale);
    /* stats[shards · 3N] holds shard s's xent_partial_stats at s · 3N (fp32 device memory);
     * targets (host memory) are one shard's local targets, of which only ZT_XENT_IGNORED is
     * read. Per row, in shard order: M the maxima's maximum (fp32), S the sum in double of
     * sum_s · exp(m_s - M) (each term added with one rounding, fma), t the fp32 sum of the
     * target logits; logz[n] = M + (float)log(S) and losses[n] = logz[n] - t, 0 for an ignored
     * row. Every backend computes these same operations in this order, so a row's results do
     * not depend on where it is combined (the CPU's and a GPU's exp and log may still differ in
     * the last bit of a double). x->act is not used. */
    void (*xent_partial_combine)(const zt_ctx *x, float *logz, float *losses, const float *stats,
                                 const int32_t *targets, int N, int shards);

    /* ---- optimizer and gradient ops (flat slices; x->act is not used) --------------------- */

    /* AdamW / Adam over n parameters. */
    void (*adam_update)(const zt_ctx *x, float *p, const float *g, float *m, float *v, size_t n,
                        const zt_adam_args *a);
    /* SGD with momentum (buf NULL without momentum), as torch.optim.SGD. */
    void (*sgd_update)(const zt_ctx *x, float *p, const float *g, float *buf, size_t n,
                       const zt_sgd_args *a);
    /* Fused mixed-precision Adam over n parameters, in one pass over memory. For each i:
     * g = grad[i] · grad_mul, grad read as grad_type (ZT_F32: a float array; ZT_BF16 / ZT_F16:
     * 16-bit values widened exactly, as from_half does); master[i], m[i] and v[i] are updated
     * from g exactly as adam_update updates p, g, m and v; then, when param16 is not NULL,
     * param16[i] = master[i] rounded to param_type (ZT_BF16 or ZT_F16) as to_half rounds. The
     * result is bit for bit that of from_half, scale by grad_mul, adam_update and to_half run one
     * after another, on every CPU path and any thread count, and so independent of where a slice
     * starts. grad_mul (the loss-scale inverse times the clipping factor) is always applied;
     * 1.0f leaves a gradient as it is. No two buffers may overlap. A grad_type or (with param16)
     * param_type outside those listed is a caller's bug and aborts. */
    void (*adam_update_mixed)(const zt_ctx *x, float *master, const void *grad,
                              zt_dtype grad_type, float grad_mul, float *m, float *v,
                              uint16_t *param16, zt_dtype param_type, size_t n,
                              const zt_adam_args *a);

    /* Fused mixed-precision SGD, as adam_update_mixed is to adam_update: g = grad[i] · grad_mul
     * (grad read as grad_type), master[i] and buf[i] updated from g exactly as sgd_update updates
     * p and buf (buf NULL without momentum), then param16[i] = master[i] rounded to param_type
     * when param16 is not NULL. Bit for bit from_half, scale, sgd_update and to_half run one
     * after another. */
    void (*sgd_update_mixed)(const zt_ctx *x, float *master, const void *grad,
                             zt_dtype grad_type, float grad_mul, float *buf, uint16_t *param16,
                             zt_dtype param_type, size_t n, const zt_sgd_args *a);

    /* LAMB's first pass over n parameters (all of one tensor, or a piece of it): m and v are
     * updated from g as Adam's (m = b1·m + (1-b1)·g, v = b2·v + (1-b2)·g²); p is only read.
     * sums[0] receives the sum of p² (p before the update) and sums[1] the sum of u², both in
     * double and returned to the host. */
    void (*lamb_moments)(const zt_ctx *x, const float *p, const float *g, float *m, float *v,
                         size_t n, const zt_lamb_args *a, double sums[2]);
    /* lamb_moments with the two sums added to sums[0..1], two doubles of device memory
     * (sums[j] = sums[j] + this piece's sum, one double addition each), in stream order and
     * without a host round trip: a tensor's pieces add up in its slot in the order they are
     * queued, which is the order the host added lamb_moments' returned sums in. Bit for bit
     * lamb_moments' m and v, and its sums added to what the slot held. */
    void (*lamb_moments_to)(const zt_ctx *x, const float *p, const float *g, float *m, float *v,
                            size_t n, const zt_lamb_args *a, double *sums);
    /* Each of n tensors' step from its sums (device memory, sums[2i] of p² and sums[2i+1] of
     * u², over the whole tensor): steps[i] = step_size · coeff in float, where coeff is
     * (float)sqrt(sums[2i]) / (float)sqrt(sums[2i+1]) clamped first to max_coeff and then to
     * min_coeff, or 1 when either root is 0. Every backend does these IEEE operations in this
     * order (double roots rounded once to float, a float divide and multiply), so the steps are
     * the same bits everywhere. steps is device memory, read by lamb_apply. */
    void (*lamb_steps)(const zt_ctx *x, float *steps, const double *sums, size_t n,
                       const zt_lamb_step_args *a);
    /* LAMB's second pass: p -= step · u, with u recomputed from p, m and v exactly as
     * lamb_moments defines it; *step (one float of device memory, the tensor's lamb_steps
     * slot, read in stream order) is the step size times the tensor's clamped trust ratio. An
     * element's result does not depend on n or on where the slice starts. */
    void (*lamb_apply)(const zt_ctx *x, float *p, const float *m, const float *v, size_t n,
                       const zt_lamb_args *a, const float *step);
    /* lamb_apply that also writes param16[i] = p[i] rounded to param_type (ZT_BF16 or ZT_F16)
     * from the same pass: bit for bit lamb_apply and then to_half. */
    void (*lamb_apply_mixed)(const zt_ctx *x, float *p, const float *m, const float *v, size_t n,
                             const zt_lamb_args *a, const float *step, uint16_t *param16,
                             zt_dtype param_type);

    /* Sum of squares in double precision (the global gradient norm); the result is returned to
     * the host (a GPU backend synchronises its compute stream). */
    double (*sum_squares)(const zt_ctx *x, const float *v, size_t n);
    /* v *= s */
    void (*scale)(const zt_ctx *x, float *v, size_t n, float s);

    /* Conversions. To 16 bits: round to nearest even, keeping subnormals, ±inf and NaN (a NaN
     * stays a quiet NaN with its sign); values beyond the 16-bit range become ±inf. t must be
     * ZT_BF16 or ZT_F16 (anything else is a caller's bug and aborts), except round_to, for which
     * ZT_F32 leaves v unchanged. In accumulate_half a NaN already in dst stays that NaN. */
    void (*to_half)(const zt_ctx *x, uint16_t *dst, const float *src, size_t n, zt_dtype t);
    void (*from_half)(const zt_ctx *x, float *dst, const uint16_t *src, size_t n, zt_dtype t);
    /* v = the nearest value of type t, in place (fp32 storage, 16-bit precision). */
    void (*round_to)(const zt_ctx *x, float *v, size_t n, zt_dtype t);
    /* dst = to_half(from_half(dst) + src): accumulates fp32 values into a 16-bit buffer. */
    void (*accumulate_half)(const zt_ctx *x, uint16_t *dst, const float *src, size_t n,
                            zt_dtype t);
    /* Sum of squares of a 16-bit buffer (double accumulation, deterministic chunking); +inf or
     * NaN when any element is not finite. Returned to the host. */
    double (*sum_squares_half)(const zt_ctx *x, const uint16_t *v, size_t n, zt_dtype t);

    /* A sum in double precision written to *out, one double of device memory, in stream order
     * and without a host round trip: the engine reads a step's sums back together, at the step's
     * one synchronisation. With `squares`, the sum of v's squares, bit for bit what sum_squares
     * (t = ZT_F32) or sum_squares_half (ZT_BF16, ZT_F16) returns for the same v; without, the
     * sum of v itself (a batch's token losses), fp32 only. */
    void (*sum_to)(const zt_ctx *x, double *out, const void *v, size_t n, zt_dtype t,
                   bool squares);
    /* *out = the sum over i in [0, n) of weights[i] · parts[i] in double: s = 0.0, then
     * s = fma(weights[i], parts[i], s) in index order (one rounding a term, as the host's loop
     * in zt_zero_norm_combine states it). It combines the gradient norm's pieces where they
     * are, so that a transport reducing device memory (NCCL) sums the total over the ranks
     * before the step's one read. parts and out are device memory (out not among parts);
     * weights is host memory, read during the call, or NULL for weights of 1 (each part then
     * added as it is, which is the same). Every backend does these IEEE operations in this
     * order, so the result is the same bits everywhere. In stream order, without a host round
     * trip. */
    void (*weighted_sum_to)(const zt_ctx *x, double *out, const double *parts,
                            const double *weights, int n);
} zt_ops;

/* Floats of attention's att (and of its backward's scratch) for B sequences of T tokens in
 * n_head heads: B·n_head·T with row statistics (attn_lse), B·n_head·T·T with probabilities.
 * *overflow is set when the count passes 64 bits. */
static inline uint64_t zt_attn_state_floats(bool attn_lse, uint64_t B, uint64_t n_head,
                                            uint64_t T, bool *overflow) {
    uint64_t f[4] = {B, n_head, T, attn_lse ? 1 : T}, n = 1;
    for (int i = 0; i < 4; i++) {
        if (f[i] != 0 && n > UINT64_MAX / f[i])
            *overflow = true;
        n *= f[i];
    }
    return n;
}

#endif
