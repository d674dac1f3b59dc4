/* LayerNorm over the last dimension, eps 1e-5 as in GPT-2; the bias is optional. */
#include <math.h>

#include "cpu_kernels.h"

void zt_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C, zt_dtype act) {
    const float eps = 1e-5f;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < C; c++)
            sum += x[c];
        float m = sum / C;
        float var = 0.0f;
#pragma omp simd reduction(+ : var)
        for (int c = 0; c < C; c++)
            var += (x[c] - m) * (x[c] - m);
        float s = 1.0f / sqrtf(var / C + eps);
        if (b) {
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] = (x[c] - m) * s * w[c] + b[c];
        } else {
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] = (x[c] - m) * s * w[c];
        }
        zt_cpu_round_run(o, (size_t)C, act);
        mean[n] = m;
        rstd[n] = s;
    }
}

void zt_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C, zt_dtype act) {
    /* Input gradients row by row. */
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *d = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
        for (int c = 0; c < C; c++) {
            float dnorm = w[c] * d[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * (x[c] - m) * s;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
#pragma omp simd
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            dx[c] += s * (w[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean);
        }
        zt_cpu_round_run(dx, (size_t)C, act);
    }
    /* Weight and bias gradients sum over rows: threads own bands of channels, so the sums are
     * deterministic and need no scratch memory. */
    const int band = 16;
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += band) {
        int c1 = c0 + band < C ? c0 + band : C;
        float gw[16] = {0}, gb[16] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *d = dout + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            for (int c = c0; c < c1; c++) {
                gw[c - c0] += (x[c] - m) * s * d[c];
                gb[c - c0] += d[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dw[c] += gw[c - c0];
            if (db)
                db[c] += gb[c - c0];
        }
    }
}
