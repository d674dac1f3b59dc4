/* Dense layers on the GPU through cuBLASLt, with fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32,
 * so fp32 activations get fp32 arithmetic). Row-major tensors are handed to cuBLASLt as their
 * column-major transposes: out[N,OC] = inp·W is outᵀ = Wᵀ·inpᵀ. The bias is added in the
 * epilogue and the residual as the C matrix (beta = 1), so a block's output is written once.
 *
 * Parameters are fp32 (ops.h) while 16-bit activations are bf16 or fp16, and cuBLASLt multiplies
 * only matching A and B types: the weight (and bias) are rounded to the activations' type into a
 * scratch buffer first, which costs a pass over W per call; the weight gradient reads 16-bit
 * inputs and accumulates into fp32 directly. The bias gradient is a column sum of its own (a
 * thread per output channel, deterministic). */
#include "cuda_common.cuh"

static cudaDataType_t cuda_type(zt_dtype t) {
    return t == ZT_BF16 ? CUDA_R_16BF : t == ZT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* One column-major product D[m,n] = op(A)·op(B) + beta·C (+ bias[m]), with C = D's type and
 * layout (c may be NULL when beta is 0). */
typedef struct {
    bool ta, tb;
    int m, n, k;
    const void *a;
    int lda;
    const void *b;
    int ldb;
    cudaDataType_t ab_type;
    float beta;
    const void *c;
    void *d;
    int ldd;
    cudaDataType_t cd_type;
    const void *bias; /* of cd_type */
} gemm_args;

/* The alignment of p that cuBLASLt may assume: the largest power of two dividing its address, up
 * to the 256 bytes cuBLASLt assumes when told nothing. Activations are slices of larger buffers
 * at any element offset, so the preference declares what each call really has; otherwise an
 * algorithm chosen for 256-byte alignment would read them misaligned. */
static uint32_t alignment_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uintptr_t low = a & (~a + 1);
    return a == 0 || low > 256 ? 256u : (uint32_t)low;
}

static void gemm(const zt_ctx *x, const gemm_args *g) {
    if (g->m == 0 || g->n == 0)
        return;
    zt_backend *be = x->be;
    zt_cuda_state *st = zt_cuda_of(x);
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t ta = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float alpha = 1.0f, beta = g->beta;
    ZT_CUBLAS_CHECK(be, cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                       sizeof ta));
    ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                       sizeof tb));
    if (g->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                           sizeof epi));
        ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(
                                op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
    }
    ZT_CUBLAS_CHECK(be, cublasLtMatrixLayoutCreate(&la, g->ab_type, g->ta ? g->k : g->m,
                                                   g->ta ? g->m : g->k, g->lda));
    ZT_CUBLAS_CHECK(be, cublasLtMatrixLayoutCreate(&lb, g->ab_type, g->tb ? g->n : g->k,
                                                   g->tb ? g->k : g->n, g->ldb));
    ZT_CUBLAS_CHECK(be, cublasLtMatrixLayoutCreate(&lc, g->cd_type, g->m, g->n, g->ldd));
    ZT_CUBLAS_CHECK(be, cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = ZT_CUDA_CUBLAS_WORKSPACE;
    ZT_CUBLAS_CHECK(be, cublasLtMatmulPreferenceSetAttribute(
                            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const void *operands[4] = {g->a, g->b, g->c ? g->c : g->d, g->d};
    static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        uint32_t align = alignment_of(operands[i]);
        ZT_CUBLAS_CHECK(be, cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align,
                                                                 sizeof align));
    }
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    if (op && la && lb && lc && pref)
        ZT_CUBLAS_CHECK(be, cublasLtMatmulAlgoGetHeuristic(st->lt, op, la, lb, lc, lc, pref, 1,
                                                           &heur, &found));
    if (found == 1)
        ZT_CUBLAS_CHECK(be, cublasLtMatmul(st->lt, op, &alpha, g->a, la, g->b, lb, &beta,
                                           g->c ? g->c : g->d, lc, g->d, lc, &heur.algo,
                                           st->lt_workspace, ws, zt_cuda_compute(x)));
    else if (op && la && lb && lc && pref)
        zt_cuda_fail(be, "cuBLASLt", "cublasLtMatmulAlgoGetHeuristic", "no algorithm for the shape",
                     __FILE__, __LINE__);
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (lc)
        cublasLtMatrixLayoutDestroy(lc);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (op)
        cublasLtMatmulDescDestroy(op);
}

template <typename T> __global__ void round_copy(T *dst, const float *src, size_t n) {
    ZT_GRID_LOOP(i, n) { zt_st(dst, i, src[i]); }
}

/* W (n_w values) and bias (n_b, may be NULL) as the 16-bit type t, in the W16 scratch. */
static void *weights16(const zt_ctx *x, const float *w, size_t n_w, const float *bias, size_t n_b,
                       void **bias16) {
    /* The bias follows W at an offset kept 16-byte aligned for cuBLASLt. */
    size_t boff = (n_w * 2 + 15) / 16 * 16;
    char *p = (char *)zt_cuda_scratch(x, ZT_CUDA_SCRATCH_W16, bias ? boff + n_b * 2 : n_w * 2);
    if (!p)
        return NULL;
    if (x->act == ZT_BF16) {
        ZT_LAUNCH_1D(x, n_w, round_copy<__nv_bfloat16>, (__nv_bfloat16 *)p, w, n_w);
        if (bias)
            ZT_LAUNCH_1D(x, n_b, round_copy<__nv_bfloat16>, (__nv_bfloat16 *)(p + boff), bias, n_b);
    } else {
        ZT_LAUNCH_1D(x, n_w, round_copy<__half>, (__half *)p, w, n_w);
        if (bias)
            ZT_LAUNCH_1D(x, n_b, round_copy<__half>, (__half *)(p + boff), bias, n_b);
    }
    if (bias16)
        *bias16 = bias ? p + boff : NULL;
    return p;
}

extern "C" void zt_cuda_linear_forward(const zt_ctx *x, void *out, const void *inp,
                                       const float *w, const float *bias, const void *residual,
                                       int N, int C, int OC, zt_weight_layout layout) {
    const void *wa = w, *b = bias;
    if (x->act != ZT_F32) {
        void *b16 = NULL;
        wa = weights16(x, w, (size_t)C * OC, bias, bias ? (size_t)OC : 0, &b16);
        if (!wa)
            return;
        b = b16;
    }
    /* outᵀ[OC,N] = Wᵀ·inpᵀ: W[C,OC] row-major is Wᵀ column-major (lda OC); W[OC,C] is W
     * column-major, transposed (lda C). */
    const bool out_in = layout == ZT_W_OUT_IN;
    gemm_args g = {out_in, false, OC, N, C, wa, out_in ? C : OC, inp, C, cuda_type(x->act),
                   residual ? 1.0f : 0.0f, residual, out, OC, cuda_type(x->act), b};
    gemm(x, &g);
}

template <typename T> __global__ void bias_grad(float *dbias, const T *dout, int N, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC)
        return;
    float acc = 0.0f;
    for (int n = 0; n < N; n++)
        acc += zt_ld(dout, (size_t)n * OC + o);
    dbias[o] += acc;
}

extern "C" void zt_cuda_linear_backward(const zt_ctx *x, void *dinp, float *dw, float *dbias,
                                        const void *dout, const void *inp, const float *w, int N,
                                        int C, int OC, zt_weight_layout layout,
                                        bool accumulate_dinp) {
    const bool out_in = layout == ZT_W_OUT_IN;
    const cudaDataType_t at = cuda_type(x->act);
    if (dinp) {
        const void *wa = w;
        if (x->act != ZT_F32)
            wa = weights16(x, w, (size_t)C * OC, NULL, 0, NULL);
        /* dinpᵀ[C,N] = W·doutᵀ for W[C,OC] (stored as Wᵀ column-major: transpose it), and
         * Wᵀ·doutᵀ for W[OC,C] (stored column-major as Wᵀ already). */
        gemm_args g = {!out_in, false, C, N, OC, wa, out_in ? C : OC, dout, OC, at,
                       accumulate_dinp ? 1.0f : 0.0f, NULL, dinp, C, at, NULL};
        if (wa)
            gemm(x, &g);
    }
    if (dw) {
        /* W[C,OC]: dWᵀ[OC,C] += doutᵀ·inp; W[OC,C]: dWᵀ[C,OC] += inpᵀ·dout. */
        gemm_args g = out_in ? gemm_args{false, true, C, OC, N, inp, C, dout, OC, at, 1.0f, NULL,
                                         dw, C, CUDA_R_32F, NULL}
                             : gemm_args{false, true, OC, C, N, dout, OC, inp, C, at, 1.0f, NULL,
                                         dw, OC, CUDA_R_32F, NULL};
        gemm(x, &g);
    }
    if (dbias && N > 0) {
        ZT_ACT_DISPATCH(x->act, {
            ZT_LAUNCH(bias_grad<ACT_T>, (OC + ZT_CUDA_BLOCK - 1) / ZT_CUDA_BLOCK, ZT_CUDA_BLOCK, 0,
                      zt_cuda_compute(x), dbias, (const ACT_T *)dout, N, OC);
            ZT_CUDA_LAUNCHED(x->be);
        });
    }
}
