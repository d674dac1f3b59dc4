/* Dense layers: the products go through gemm.h (fp32, or native bf16 products for bf16 operands
 * where the CPU makes them pay); the forward's residual add and the rounding that holds the result
 * at the activations' precision are one pass over the output, in one parallel region. */
#include <string.h>

#include "cpu_kernels.h"
#include "gemm.h"

/* C = op(A)·op(B) + beta·C through the bf16 product when the operands are bf16 values and it is
 * enabled, else in fp32. */
static void product(zt_dtype act, bool ta, bool tb, int M, int N, int K, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc) {
    if (act == ZT_BF16 && zt_cpu_gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc))
        return;
    zt_cpu_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

void zt_cpu_linear_forward(float *out, const float *inp, const float *w, const float *bias,
                           const float *residual, int N, int C, int OC, bool w_transposed,
                           zt_dtype act) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, sizeof(float) * OC);
        beta = 1.0f;
    }
    if (w_transposed)
        product(act, false, true, N, OC, C, inp, C, w, C, beta, out, OC);
    else
        product(act, false, false, N, OC, C, inp, C, w, OC, beta, out, OC);
    if (!residual && act == ZT_F32)
        return;
    /* The epilogue: rows in parallel, each added to and rounded while it is in cache. */
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * OC;
        if (residual) {
            const float *r = residual + (size_t)n * OC;
#pragma omp simd
            for (int i = 0; i < OC; i++)
                o[i] += r[i];
        }
        zt_cpu_round_run(o, (size_t)OC, act);
    }
}

void zt_cpu_linear_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC,
                            bool w_transposed, bool accumulate_dinp, zt_dtype act) {
    const float dinp_beta = accumulate_dinp ? 1.0f : 0.0f;
    if (w_transposed) {
        /* W is [OC,C]: dinp = dout·W, dW += doutᵀ·inp */
        if (dinp)
            product(act, false, false, N, C, OC, dout, OC, w, C, dinp_beta, dinp, C);
        if (dw)
            product(act, true, false, OC, C, N, dout, OC, inp, C, 1.0f, dw, C);
    } else {
        /* W is [C,OC]: dinp = dout·Wᵀ, dW += inpᵀ·dout */
        if (dinp)
            product(act, false, true, N, C, OC, dout, OC, w, OC, dinp_beta, dinp, C);
        if (dw)
            product(act, true, false, C, OC, N, inp, C, dout, OC, 1.0f, dw, OC);
    }
    /* The bias gradient's column sums and the rounding of dinp share one parallel region. */
    if (!dbias && (!dinp || act == ZT_F32))
        return;
    const int band = 64, n_bands = dbias ? (OC + band - 1) / band : 0;
#pragma omp parallel
    {
        if (dbias) {
#pragma omp for nowait
            for (int b = 0; b < n_bands; b++) {
                int o0 = b * band, o1 = o0 + band < OC ? o0 + band : OC;
                float acc[64] = {0};
                for (int n = 0; n < N; n++) {
                    const float *d = dout + (size_t)n * OC;
#pragma omp simd
                    for (int o = o0; o < o1; o++)
                        acc[o - o0] += d[o];
                }
                for (int o = o0; o < o1; o++)
                    dbias[o] += acc[o - o0];
            }
        }
        if (dinp && act != ZT_F32) {
#pragma omp for
            for (int n = 0; n < N; n++)
                zt_cpu_round_run(dinp + (size_t)n * C, (size_t)C, act);
        }
    }
}
