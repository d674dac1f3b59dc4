/* Dense layers through OpenBLAS's sgemm. */
#include <cblas.h>
#include <string.h>

#include "cpu_kernels.h"

void zt_cpu_linear_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int C, int OC, bool w_transposed) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, sizeof(float) * OC);
        beta = 1.0f;
    }
    if (w_transposed)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta,
                    out, OC);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, w, OC, beta,
                    out, OC);
}

void zt_cpu_linear_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC,
                            bool w_transposed, bool accumulate_dinp) {
    const float dinp_beta = accumulate_dinp ? 1.0f : 0.0f;
    if (w_transposed) {
        /* W is [OC,C]: dinp = dout·W, dW += doutᵀ·inp */
        if (dinp)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C,
                        dinp_beta, dinp, C);
        if (dw)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                        1.0f, dw, C);
    } else {
        /* W is [C,OC]: dinp = dout·Wᵀ, dW += inpᵀ·dout */
        if (dinp)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, w, OC,
                        dinp_beta, dinp, C);
        if (dw)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC,
                        1.0f, dw, OC);
    }
    if (dbias) {
        const int band = 64;
#pragma omp parallel for
        for (int o0 = 0; o0 < OC; o0 += band) {
            int o1 = o0 + band < OC ? o0 + band : OC;
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
}
