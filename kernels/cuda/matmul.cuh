/* One cuBLASLt product, as the CUDA ops (linear.cu) ask for it: column-major
 *   D[m,n] = epilogue(op(A)[m,k] · op(B)[k,n] + beta · C)
 * with fp32 accumulation (CUBLAS_COMPUTE_32F, no TF32) and C of D's type and layout. matmul.cu
 * runs it, keeping the descriptor, layouts and the heuristic's algorithm per shape. */
#ifndef ZTRAIN_CUDA_MATMUL_CUH
#define ZTRAIN_CUDA_MATMUL_CUH

#include "cuda_common.cuh"

typedef struct {
    bool ta, tb;
    int m, n, k;
    const void *a;
    int lda;
    const void *b;
    int ldb;
    cudaDataType_t ab_type;
    float beta;
    const void *c; /* NULL: D itself (read only when beta is not 0) */
    void *d;
    int ldd;
    cudaDataType_t cd_type;
    /* CUBLASLT_EPILOGUE_DEFAULT, _BIAS (bias[m] added to every column), _GELU_AUX_BIAS
     * (pre = product + bias is stored to aux, D = gelu(pre)), _DGELU (D = product ⊙
     * gelu'(aux)); GELU is the tanh form. Or _BGRADA / _BGRADB: D is the plain product, and the
     * sums over k of op(A)'s m rows (BGRADA) or op(B)'s n columns (BGRADB) are written (not
     * added) to dbias, in fp32 (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE CUDA_R_32F); run those
     * through zt_cuda_gemm_try, since a GPU's cuBLASLt may have no kernel for them. */
    cublasLtEpilogue_t epilogue;
    const void *bias; /* of cd_type */
    float *dbias;     /* BGRADA: m floats, BGRADB: n floats */
    void *aux;        /* of cd_type, column-major with leading dimension aux_ld */
    int aux_ld;       /* a multiple of 8, at least m (cuBLASLt's rule) */
} zt_gemm;

/* Enqueues g on the compute stream of x; a failure is recorded for the next sync. */
void zt_cuda_gemm(const zt_ctx *x, const zt_gemm *g);

/* As zt_cuda_gemm, but where cuBLASLt refuses g's epilogue for its shape and types (the heuristic
 * answers CUBLAS_STATUS_NOT_SUPPORTED or finds no algorithm) nothing is enqueued or recorded and
 * the answer is false; the refusal is kept with the shape's plan, so the heuristic is asked
 * once per shape. True when g was enqueued, or failed otherwise (recorded as zt_cuda_gemm's). */
bool zt_cuda_gemm_try(const zt_ctx *x, const zt_gemm *g);

static inline cudaDataType_t zt_cuda_type(zt_dtype t) {
    return t == ZT_BF16 ? CUDA_R_16BF : t == ZT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

#endif
