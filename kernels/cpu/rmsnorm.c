/* RMSNorm over the last dimension (Llama's norm): no mean is taken out and there is no bias. The
 * statistics are fp32 whatever precision the activations are held at, as Hugging Face computes
 * them. */
#include <math.h>

#include "cpu_kernels.h"

void zt_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, float eps,
                            int N, int C, zt_dtype act) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++)
            ss += x[c] * x[c];
        float s = 1.0f / sqrtf(ss / C + eps);
#pragma omp simd
        for (int c = 0; c < C; c++)
            o[c] = x[c] * s * w[c];
        zt_cpu_round_run(o, (size_t)C, act);
        rstd[n] = s;
    }
}

void zt_cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int C, zt_dtype act) {
    /* With xhat = x·rstd, d rstd / dx_c = -rstd³·x_c / C, so
     * dx = rstd·(w⊙d - xhat·mean(w⊙d⊙xhat)). */
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *d = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float s = rstd[n];
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; c++)
            dot += w[c] * d[c] * x[c] * s;
        dot /= C;
#pragma omp simd
        for (int c = 0; c < C; c++)
            dx[c] += s * (w[c] * d[c] - x[c] * s * dot);
        zt_cpu_round_run(dx, (size_t)C, act);
    }
    /* The weight gradient sums over rows: threads own bands of channels, so the sums are
     * deterministic and need no scratch memory. */
    enum { BAND = 16 };
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += BAND) {
        int c1 = c0 + BAND < C ? c0 + BAND : C;
        float gw[BAND] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *d = dout + (size_t)n * C;
            float s = rstd[n];
            for (int c = c0; c < c1; c++)
                gw[c - c0] += x[c] * s * d[c];
        }
        for (int c = c0; c < c1; c++)
            dw[c] += gw[c - c0];
    }
}
