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

/* The backward's chunks of rows: they depend on N alone, so the sums are the same whatever the
 * threads. */
enum { MIN_ROWS = 32, MAX_CHUNKS = 64 };

static int backward_chunks(int N) {
    return N <= 0 ? 0 : N < MAX_CHUNKS * MIN_ROWS ? (N + MIN_ROWS - 1) / MIN_ROWS : MAX_CHUNKS;
}

size_t zt_cpu_rmsnorm_backward_scratch(int N, int C) {
    return (size_t)backward_chunks(N) * (size_t)(C > 0 ? C : 0);
}

void zt_cpu_rmsnorm_backward(float *dinp, float *dw, float *part, const float *dout,
                             const float *inp, const float *w, const float *rstd, int N, int C,
                             zt_dtype act) {
    /* With xhat = x·rstd, d rstd / dx_c = -rstd³·x_c / C, so
     * dx = rstd·(w⊙d - xhat·mean(w⊙d⊙xhat)).
     * One pass over the rows makes dx and, while each row is in cache, adds xhat⊙d into its
     * chunk's partial weight gradient (a row of part per chunk); a second, small loop adds the
     * chunks' partials in chunk order. */
    const int chunks = backward_chunks(N);
    const int per = chunks ? (N + chunks - 1) / chunks : 0;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int k = 0; k < chunks; k++) {
            float *pw = part + (size_t)k * C;
            for (int c = 0; c < C; c++)
                pw[c] = 0.0f;
            const int n1 = (k + 1) * per < N ? (k + 1) * per : N;
            for (int n = k * per; n < n1; n++) {
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
                for (int c = 0; c < C; c++) {
                    dx[c] += s * (w[c] * d[c] - x[c] * s * dot);
                    pw[c] += x[c] * s * d[c];
                }
                zt_cpu_round_run(dx, (size_t)C, act);
            }
        }
#pragma omp for schedule(static)
        for (int c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int k = 0; k < chunks; k++)
                acc += part[(size_t)k * C + c];
            dw[c] += acc;
        }
    }
}
