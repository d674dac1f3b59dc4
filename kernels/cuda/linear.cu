/* Dense layers on the GPU through cuBLASLt (matmul.cu), with fp32 accumulation
 * (CUBLAS_COMPUTE_32F: no TF32, so fp32 activations get fp32 arithmetic). Row-major tensors are
 * handed to cuBLASLt as their column-major transposes: out[N,OC] = inp·W is outᵀ = Wᵀ·inpᵀ. The
 * bias is added in the epilogue and the residual as the C matrix (beta = 1), so a block's output
 * is written once; GPT-2's MLP has GELU in the epilogues too (GELU_AUX_BIAS forward, DGELU
 * backward), as llm.c does.
 *
 * Parameters are fp32 (ops.h) while 16-bit activations are bf16 or fp16, and cuBLASLt multiplies
 * only matching A and B types. In a mixed-precision job the weight's and bias's 16-bit twin
 * (zt_param16: ZeRO's 16-bit parameters, which the optimizer writes once per step) is what the
 * product reads, so a step makes no pass over W besides the product itself. A weight without a
 * twin (an op called outside a model, ZTRAIN_CUDA_WEIGHTS=round) is rounded into a scratch
 * buffer first, at a pass over W per call: the same values, since the twin is the fp32 value
 * rounded as to_half rounds. A bias twin that is not 16-byte aligned, which cuBLASLt's bias
 * epilogue wants, is copied into aligned scratch (OC values). With a twin the fp32 values are
 * never read (backend.h, reads_param16). The weight gradient reads 16-bit inputs
 * and accumulates into fp32 directly. The bias gradient comes from that GEMM's epilogue
 * (BGRADB where dout is its B operand, W[OC,C]; BGRADA where it is A, W[C,OC]), so dout is read
 * once for both: cuBLASLt writes it in fp32 to scratch and one small kernel adds it to the
 * gradient. Where cuBLASLt has no algorithm for that epilogue at the shape and types, or
 * ZTRAIN_CUDA_BIAS_GRAD=sums, it is the per-channel sum over row tiles instead (channel_sums.cuh),
 * a second pass over dout; both are deterministic. */
#include <pthread.h>
#include <stdio.h>

#include "channel_sums.cuh"
#include "matmul.cuh"

template <typename T> __global__ void round_copy(T *dst, const float *src, size_t n) {
    ZT_GRID_LOOP(i, n) { zt_st(dst, i, src[i]); }
}

/* n values of src rounded to the activations' 16-bit type at dst (16-byte aligned scratch). */
static void round_into(const zt_ctx *x, void *dst, const float *src, size_t n) {
    if (x->act == ZT_BF16)
        ZT_LAUNCH_1D(x, n, round_copy<__nv_bfloat16>, (__nv_bfloat16 *)dst, src, n);
    else
        ZT_LAUNCH_1D(x, n, round_copy<__half>, (__half *)dst, src, n);
}

/* The twin of p[0, n) as the product may read it (NULL: none, or refused by the environment). */
static const void *twin(const zt_ctx *x, const float *p, size_t n) {
    return zt_cuda_param(x, p, n).half;
}

__global__ void copy_u16(uint16_t *dst, const uint16_t *src, size_t n) {
    ZT_GRID_LOOP(i, n) { dst[i] = src[i]; }
}

/* W (n_w values) and bias (n_b, may be NULL) in the activations' 16-bit type: their twins where
 * the ctx has them, else rounded into the W16 scratch (counted in weights_rounded). NULL W after
 * recording the failure. */
static const void *weights16(const zt_ctx *x, const float *w, size_t n_w, const float *bias,
                             size_t n_b, const void **bias16) {
    const void *w16 = twin(x, w, n_w), *b16 = bias ? twin(x, bias, n_b) : NULL;
    /* A twin bias off cuBLASLt's 16-byte alignment is copied to scratch that is aligned. */
    const uint16_t *b_unaligned = NULL;
    if (b16 && (uintptr_t)b16 % 16 != 0) {
        b_unaligned = (const uint16_t *)b16;
        b16 = NULL;
    }
    const bool round_w = !w16, round_b = bias && !b16;
    /* The bias follows W at an offset kept 16-byte aligned for cuBLASLt. */
    size_t boff = round_w ? (n_w * 2 + 15) / 16 * 16 : 0;
    char *p = NULL;
    if (round_w || round_b) {
        p = (char *)zt_cuda_scratch(x, ZT_CUDA_SCRATCH_W16, boff + (round_b ? n_b * 2 : 0));
        if (!p)
            return NULL;
    }
    if (round_w) {
        round_into(x, p, w, n_w);
        w16 = p;
        __atomic_add_fetch(&zt_cuda_of(x)->weights_rounded, 1, __ATOMIC_RELAXED);
    }
    if (round_b) {
        if (b_unaligned)
            ZT_LAUNCH_1D(x, n_b, copy_u16, (uint16_t *)(p + boff), b_unaligned, n_b);
        else
            round_into(x, p + boff, bias, n_b);
        b16 = p + boff;
    }
    if (bias16)
        *bias16 = b16;
    return w16;
}

/* W and bias as the product reads them: themselves at fp32, 16-bit twins or rounded copies at
 * 16 bits (NULL W after recording the failure). */
static const void *product_weights(const zt_ctx *x, const float *w, const float *bias, int C,
                                   int OC, const void **b) {
    *b = bias;
    if (x->act == ZT_F32)
        return w;
    return weights16(x, w, (size_t)C * OC, bias, bias ? (size_t)OC : 0, b);
}

/* outᵀ[OC,N] = Wᵀ·inpᵀ: W[C,OC] row-major is Wᵀ column-major (lda OC); W[OC,C] is W
 * column-major, transposed (lda C). */
static zt_gemm forward_product(const zt_ctx *x, void *out, const void *inp, const void *wa,
                               int N, int C, int OC, zt_weight_layout layout) {
    const bool out_in = layout == ZT_W_OUT_IN;
    zt_gemm g = {};
    g.ta = out_in;
    g.m = OC;
    g.n = N;
    g.k = C;
    g.a = wa;
    g.lda = out_in ? C : OC;
    g.b = inp;
    g.ldb = C;
    g.ab_type = g.cd_type = zt_cuda_type(x->act);
    g.d = out;
    g.ldd = OC;
    g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    return g;
}

extern "C" void zt_cuda_linear_forward(const zt_ctx *x, void *out, const void *inp,
                                       const float *w, const float *bias, const void *residual,
                                       int N, int C, int OC, zt_weight_layout layout) {
    const void *b;
    const void *wa = product_weights(x, w, bias, C, OC, &b);
    if (!wa)
        return;
    zt_gemm g = forward_product(x, out, inp, wa, N, C, OC, layout);
    g.beta = residual ? 1.0f : 0.0f;
    g.c = residual;
    g.epilogue = b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = b;
    zt_cuda_gemm(x, &g);
}

/* cuBLASLt's GELU epilogues keep the pre-activation with a leading dimension divisible by 8
 * (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD); a narrower matrix (a small test, a TP
 * shard of an odd width) takes the unfused path: the product, then the GELU kernel. */
static bool gelu_fusable(int rows) { return rows % 8 == 0; }

extern "C" void zt_cuda_linear_gelu_forward(const zt_ctx *x, void *out, void *pre,
                                            const void *inp, const float *w, const float *bias,
                                            int N, int C, int OC, zt_weight_layout layout) {
    const void *b;
    const void *wa = product_weights(x, w, bias, C, OC, &b);
    if (!wa)
        return;
    zt_gemm g = forward_product(x, pre, inp, wa, N, C, OC, layout);
    g.epilogue = b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = b;
    if (b && gelu_fusable(OC)) {
        g.d = out;
        g.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        g.aux = pre;
        g.aux_ld = OC;
        zt_cuda_gemm(x, &g);
        return;
    }
    zt_cuda_gemm(x, &g);
    zt_cuda_gelu_forward(x, out, pre, (size_t)N * OC);
}

/* dinpᵀ[C,N] = W·doutᵀ for W[C,OC] (stored as Wᵀ column-major: transpose it), and Wᵀ·doutᵀ for
 * W[OC,C] (stored column-major as Wᵀ already); false after recording a failure. */
static bool input_product(const zt_ctx *x, zt_gemm *g, void *dinp, const void *dout,
                          const float *w, int N, int C, int OC, zt_weight_layout layout) {
    const bool out_in = layout == ZT_W_OUT_IN;
    const void *wa = w;
    if (x->act != ZT_F32)
        wa = weights16(x, w, (size_t)C * OC, NULL, 0, NULL);
    if (!wa)
        return false;
    *g = zt_gemm{};
    g->ta = !out_in;
    g->m = C;
    g->n = N;
    g->k = OC;
    g->a = wa;
    g->lda = out_in ? C : OC;
    g->b = dout;
    g->ldb = OC;
    g->ab_type = g->cd_type = zt_cuda_type(x->act);
    g->d = dinp;
    g->ldd = C;
    g->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    return true;
}

/* The first bias gradient's way in this process, reported once on stderr and to
 * zt_cuda_bias_grad_choice, as attention/attention.c reports its choice. */
static pthread_once_t bias_said_once = PTHREAD_ONCE_INIT;
static char bias_said[16];
static const char *bias_said_name, *bias_said_why;
static int bias_said_n, bias_said_oc;
static zt_dtype bias_said_act;

static void bias_say(void) {
    snprintf(bias_said, sizeof bias_said, "%s", bias_said_name);
    fprintf(stderr, "[ztrain] bias gradient: %s (%s; N=%d, OC=%d, %s)\n", bias_said_name,
            bias_said_why, bias_said_n, bias_said_oc, zt_dtype_name(bias_said_act));
    fflush(stderr);
}

static void bias_choose(const zt_ctx *x, const char *name, const char *why, int N, int OC) {
    bias_said_name = name, bias_said_why = why, bias_said_n = N, bias_said_oc = OC;
    bias_said_act = x->act;
    pthread_once(&bias_said_once, bias_say);
}

extern "C" const char *zt_cuda_bias_grad_choice(void) {
    return bias_said[0] ? bias_said : NULL;
}

__global__ void add_bias_grad(zt_grad_view dbias, const float *g, int n) {
    ZT_GRID_LOOP(i, (size_t)n) { dbias.add(i, g[i]); }
}

/* dbias[OC] += g[OC], the bias gradient cuBLASLt wrote: the gradient accumulates over
 * micro-steps (into its 16-bit gradient where the ctx has one, zt_grad_view). */
static void accumulate_bias_grad(const zt_ctx *x, float *dbias, const float *g, int OC) {
    ZT_LAUNCH_1D(x, (size_t)OC, add_bias_grad, zt_cuda_grad(x, dbias, (size_t)OC), g, OC);
}

/* Runs the weight-gradient product g with the bias gradient in its epilogue and adds that to
 * dbias: BGRADB when dout is g's B (W[OC,C]), BGRADA when it is A (W[C,OC]), either summing dout
 * over the N rows. False, with nothing enqueued, where the row-tile sums are to run instead:
 * ZTRAIN_CUDA_BIAS_GRAD=sums, or cuBLASLt refused the epilogue for this shape (a refusal kept
 * with the shape's plan, so asked once). */
static bool dw_with_bias_grad(const zt_ctx *x, const zt_gemm *g, float *dbias, int N, int OC,
                              bool out_in) {
    const zt_cuda_bias_grad_policy policy = zt_cuda_of(x)->bias_grad;
    if (policy == ZT_CUDA_BIAS_GRAD_SUMS) {
        bias_choose(x, "sums", "ZTRAIN_CUDA_BIAS_GRAD=sums", N, OC);
        return false;
    }
    float *scratch = (float *)zt_cuda_scratch(x, ZT_CUDA_SCRATCH_BIAS_GRAD, (size_t)OC * 4);
    if (!scratch)
        return false;
    zt_gemm e = *g;
    e.epilogue = out_in ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
    e.dbias = scratch;
    if (zt_cuda_gemm_try(x, &e)) {
        accumulate_bias_grad(x, dbias, scratch, OC);
        bias_choose(x, "epilogue",
                    out_in ? "cuBLASLt's BGRADB on the weight-gradient GEMM"
                           : "cuBLASLt's BGRADA on the weight-gradient GEMM",
                    N, OC);
        return true;
    }
    if (policy == ZT_CUDA_BIAS_GRAD_EPILOGUE) {
        zt_cuda_fail(x->be, "cuBLASLt", "ZTRAIN_CUDA_BIAS_GRAD=epilogue",
                     out_in ? "no algorithm for BGRADB at this shape"
                            : "no algorithm for BGRADA at this shape",
                     __FILE__, __LINE__);
        return true;
    }
    bias_choose(x, "sums",
                out_in ? "cuBLASLt has no algorithm for BGRADB at this shape"
                       : "cuBLASLt has no algorithm for BGRADA at this shape",
                N, OC);
    return false;
}

/* The parameter gradients: W[C,OC]: dWᵀ[OC,C] += doutᵀ·inp; W[OC,C]: dWᵀ[C,OC] += inpᵀ·dout;
 * dbias += the column sums of dout, from the dW product's epilogue where there is one and
 * cuBLASLt takes it, else from the row-tile sums. */
static void param_grads(const zt_ctx *x, float *dw, float *dbias, const void *dout,
                        const void *inp, int N, int C, int OC, zt_weight_layout layout) {
    const bool out_in = layout == ZT_W_OUT_IN;
    if (dw) {
        zt_gemm g = {};
        g.tb = true;
        g.m = out_in ? C : OC;
        g.n = out_in ? OC : C;
        g.k = N;
        g.a = out_in ? inp : dout;
        g.lda = out_in ? C : OC;
        g.b = out_in ? dout : inp;
        g.ldb = out_in ? OC : C;
        g.ab_type = zt_cuda_type(x->act);
        /* Accumulated, into the 16-bit gradient where the ctx has one (cuBLASLt adds C in fp32
         * and rounds D once, as zt_grad_view does). */
        const zt_grad_view gw = zt_cuda_grad(x, dw, (size_t)C * OC);
        g.beta = 1.0f;
        g.d = gw.half ? (void *)gw.half : (void *)dw;
        g.ldd = g.m;
        g.cd_type = gw.half ? zt_cuda_type(x->act) : CUDA_R_32F;
        g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
        /* An empty product (no rows, or C = 0) leaves the sums to say what the bias gets. */
        const bool product = N > 0 && C > 0 && OC > 0;
        if (dbias && product && dw_with_bias_grad(x, &g, dbias, N, OC, out_in))
            return;
        zt_cuda_gemm(x, &g);
    }
    if (dbias) {
        ZT_ACT_DISPATCH(x->act, {
            zt_bias_term<ACT_T> term = {(const ACT_T *)dout, OC};
            zt_channel_sums(x, zt_cuda_grad(x, dbias, OC), zt_grad_view{}, term, N, OC);
        });
    }
}

extern "C" void zt_cuda_linear_backward(const zt_ctx *x, void *dinp, float *dw, float *dbias,
                                        const void *dout, const void *inp, const float *w, int N,
                                        int C, int OC, zt_weight_layout layout,
                                        bool accumulate_dinp) {
    zt_gemm g;
    if (dinp && input_product(x, &g, dinp, dout, w, N, C, OC, layout)) {
        g.beta = accumulate_dinp ? 1.0f : 0.0f;
        zt_cuda_gemm(x, &g);
    }
    param_grads(x, dw, dbias, dout, inp, N, C, OC, layout);
}

extern "C" void zt_cuda_linear_backward_gelu(const zt_ctx *x, void *dpre, float *dw,
                                             float *dbias, const void *dout, const void *inp,
                                             const void *pre, const float *w, int N, int C,
                                             int OC, zt_weight_layout layout) {
    zt_gemm g;
    if (input_product(x, &g, dpre, dout, w, N, C, OC, layout)) {
        if (gelu_fusable(C)) {
            g.epilogue = CUBLASLT_EPILOGUE_DGELU;
            g.aux = (void *)pre;
            g.aux_ld = C;
            zt_cuda_gemm(x, &g);
        } else {
            zt_cuda_gemm(x, &g);
            zt_cuda_gelu_backward(x, dpre, pre, dpre, (size_t)N * C);
        }
    }
    param_grads(x, dw, dbias, dout, inp, N, C, OC, layout);
}
