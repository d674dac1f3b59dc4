/* The operation table that every compute backend fills.
 *
 * Model code calls these entries and never a backend directly, so a CUDA backend is one more table.
 * All tensors are row-major fp32 here; shapes are given in brackets. "Accumulates" means the kernel
 * adds into the output (parameter gradients across micro-steps); otherwise it overwrites. Kernels
 * never allocate and never fail: shapes are checked by the caller at init. */
#ifndef ZTRAIN_KERNELS_H
#define ZTRAIN_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/dtype.h"

typedef struct {
    float lr;
    float beta1, beta2, eps;
    float weight_decay;
    float bias_correction1; /* 1 - beta1^t, or 1 when bias correction is off */
    float bias_correction2; /* 1 - beta2^t, or 1 when bias correction is off */
    bool adamw_mode;        /* decoupled decay p -= lr*wd*p; else L2: g += wd*p */
} zt_adam_args;

typedef struct {
    float lr;
    float momentum, dampening, weight_decay;
    bool nesterov;
    bool first_step; /* torch initialises the momentum buffer to the first gradient */
} zt_sgd_args;


typedef struct zt_kernels {
    const char *name;

    /* out[B,T,C] = wte[tok] + wpe[t] */
    void (*encoder_forward)(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                            int B, int T, int C);
    /* Accumulates dwte[V,C] and dwpe[T,C] from dout[B,T,C]. */
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                             int B, int T, int C);

    /* out[N,C] = (inp - mean) * rstd * w + b; saves mean[N] and rstd[N] for the backward. */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C);
    /* Accumulates dinp[N,C], dw[C], db[C]. */
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);

    /* out[N,OC] = inp[N,C] · W + bias. W is [C,OC] (Hugging Face Conv1D layout), or [OC,C] when
     * w_transposed (the tied LM head reading wte). bias may be NULL. */
    void (*matmul_forward)(float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC, bool w_transposed);
    /* Overwrites dinp[N,C] (when not NULL); accumulates dw and dbias (when not NULL). */
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC,
                            bool w_transposed);

    /* Causal self-attention over qkv[B,T,3C] (q, k, v each [B,T,NH,C/NH]) into out[B,T,C];
     * att[B,NH,T,T] keeps the softmax probabilities for the backward. */
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
    /* Overwrites dqkv[B,T,3C]; scratch[B,NH,T,T] is work space. */
    void (*attention_backward)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH);

    /* tanh-approximated GELU, as GPT-2 (and torch's approximate="tanh"). */
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    /* Overwrites dinp. */
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);

    /* out = a + b (out may alias a). */
    void (*add)(float *out, const float *a, const float *b, size_t n);

    /* Softmax cross-entropy over logits[N,V], fused with its backward: losses[N] receives
     * -log softmax(logits)[target]. When grad_scale != 0, logits are overwritten in place by
     * d(grad_scale * sum(losses))/dlogits = grad_scale * (softmax - onehot(target)).
     * Targets < 0 are ignored (loss 0, gradient 0). */
    void (*softmax_xent)(float *losses, float *logits, const int32_t *targets, int N, int V,
                         float grad_scale);

    /* Optimizer updates over a flat slice of n parameters. */
    void (*adam_update)(float *p, const float *g, float *m, float *v, size_t n,
                        const zt_adam_args *a);
    void (*sgd_update)(float *p, const float *g, float *buf, size_t n, const zt_sgd_args *a);

    /* Sum of squares in double precision (for the global gradient norm). */
    double (*sum_squares)(const float *x, size_t n);
    /* x *= s */
    void (*scale)(float *x, size_t n, float s);

    /* Mixed precision. Conversions to 16 bits round to nearest even and keep subnormals, ±inf and
     * NaN (a NaN stays a quiet NaN with its sign); values beyond the 16-bit range become ±inf.
     * t must be ZT_BF16 or ZT_F16 (ZT_F32 is a caller's bug and aborts), except round_to, for which
     * ZT_F32 leaves x unchanged. In accumulate_half a NaN already in dst stays that NaN. The CPU
     * backend picks AVX-512, AVX2+F16C or portable code at run time (ZTRAIN_CAST_ISA forces one,
     * for tests); every path gives the same bits. */
    void (*to_half)(uint16_t *dst, const float *src, size_t n, zt_dtype t);
    void (*from_half)(float *dst, const uint16_t *src, size_t n, zt_dtype t);
    /* x = the nearest representable value of type t, in place (fp32 storage, 16-bit precision). */
    void (*round_to)(float *x, size_t n, zt_dtype t);
    /* dst = to_half(from_half(dst) + src): accumulates fp32 values into a 16-bit buffer. */
    void (*accumulate_half)(uint16_t *dst, const float *src, size_t n, zt_dtype t);
    /* Sum of squares of a 16-bit buffer (double accumulation, deterministic chunking); +inf/NaN
     * when any element is not finite. */
    double (*sum_squares_half)(const uint16_t *x, size_t n, zt_dtype t);

    /* Fused mixed-precision Adam over a flat slice of n parameters, in one pass over memory. For
     * each i: g = grad[i] * grad_mul, grad read as grad_type (ZT_F32: grad is a float array;
     * ZT_BF16 / ZT_F16: 16-bit values widened exactly, as from_half does); master[i], m[i] and v[i]
     * are updated from g exactly as adam_update updates p, g, m and v; then, when param16 is not
     * NULL, param16[i] = master[i] rounded to param_type (ZT_BF16 or ZT_F16) as to_half rounds.
     * The result is bit for bit that of from_half (for 16-bit gradients), scale by grad_mul,
     * adam_update and to_half run one after another, on every CPU path and any thread count,
     * and so independent of where a slice starts. grad_mul (the loss-scale inverse times the
     * clipping factor) is always applied; 1.0f leaves a gradient as it is. param_type is ignored
     * when param16 is NULL. No two buffers may overlap. A grad_type or (with param16) param_type
     * outside those listed is a caller's bug and aborts. The CPU backend runs the path
     * ZTRAIN_OPTIM_ISA names (portable, avx2 or avx512; see zt_kernels_cpu_optim_isa), as it
     * does for adam_update and sgd_update. */
    void (*adam_update_mixed)(float *master, const void *grad, zt_dtype grad_type, float grad_mul,
                              float *m, float *v, uint16_t *param16, zt_dtype param_type,
                              size_t n, const zt_adam_args *a);
} zt_kernels;

/* The CPU backend: OpenBLAS for matmuls, OpenMP threads and SIMD for the rest. */
const zt_kernels *zt_kernels_cpu(void);

/* Threads used by the CPU kernels and OpenBLAS (0 leaves the OpenMP default). */
void zt_kernels_cpu_set_threads(int n);

/* The instruction-set path of the CPU optimizer kernels (adam_update, sgd_update,
 * adam_update_mixed): "avx512", "avx2" or "portable". It is the widest this CPU has, unless the
 * environment variable ZTRAIN_OPTIM_ISA, read at the first call, names a narrower one the CPU has;
 * every path gives the same bits. A static string. */
const char *zt_kernels_cpu_optim_isa(void);

#endif
