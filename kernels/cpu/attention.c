/* Causal multi-head self-attention.
 *
 * Each (batch, head) pair is independent, so threads split the pairs and every matrix product
 * inside one pair is a single-threaded sgemm (the OpenMP build of OpenBLAS runs serially inside a
 * parallel region). The T×T probabilities are kept for the backward; on the CPU, at the sequence
 * lengths it trains, that is cheaper than recomputing them. Products are blocked by rows so the
 * upper (masked) triangle is mostly never computed. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

enum { ROW_BLOCK = 64 };

static int min_int(int a, int b) { return a < b ? a : b; }

/* Softmax over the first n entries of a row of T; the masked rest becomes 0. */
static void causal_softmax_row(float *row, int n, int T) {
    float mx = row[0];
    for (int s = 1; s < n; s++)
        mx = row[s] > mx ? row[s] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int s = 0; s < n; s++) {
        row[s] = expf(row[s] - mx);
        sum += row[s];
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int s = 0; s < n; s++)
        row[s] *= inv;
    memset(row + n, 0, sizeof(float) * (T - n));
}

void zt_cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH) {
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + h * hs;
            for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
                int r1 = min_int(r0 + ROW_BLOCK, T);
                /* scores for rows r0..r1 against keys 0..r1 */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, scale,
                            q + (size_t)r0 * C3, C3, k, C3, 0.0f, a + (size_t)r0 * T, T);
                for (int t = r0; t < r1; t++)
                    causal_softmax_row(a + (size_t)t * T, t + 1, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f,
                            a + (size_t)r0 * T, T, v, C3, 0.0f, o + (size_t)r0 * C, C);
            }
        }
    }
}

void zt_cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH) {
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C, *v = q + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            const float *d = dout + (size_t)b * T * C + h * hs;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs;
            float *dk = dq + C, *dv = dq + 2 * C;
            float *dp = scratch + ((size_t)b * NH + h) * T * T;
            for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
                int r1 = min_int(r0 + ROW_BLOCK, T);
                /* dprobs = dout · vᵀ, then through the softmax: dscores = p ⊙ (dp - Σ p·dp) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, 1.0f,
                            d + (size_t)r0 * C, C, v, C3, 0.0f, dp + (size_t)r0 * T, T);
                for (int t = r0; t < r1; t++) {
                    const float *p = a + (size_t)t * T;
                    float *g = dp + (size_t)t * T;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int s = 0; s <= t; s++)
                        dot += p[s] * g[s];
#pragma omp simd
                    for (int s = 0; s <= t; s++)
                        g[s] = p[s] * (g[s] - dot) * scale;
                    for (int s = t + 1; s < r1; s++)
                        g[s] = 0.0f;
                }
                /* dq rows r0..r1 = dscores · k */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f,
                            dp + (size_t)r0 * T, T, k, C3, 0.0f, dq + (size_t)r0 * C3, C3);
            }
            /* Key/value rows s0..s1 receive from query rows s0..T (the causal mask zeroes the
             * rest): dv = pᵀ · dout, dk = dscoresᵀ · q. */
            for (int s0 = 0; s0 < T; s0 += ROW_BLOCK) {
                int s1 = min_int(s0 + ROW_BLOCK, T);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s1 - s0, hs, T - s0, 1.0f,
                            a + (size_t)s0 * T + s0, T, d + (size_t)s0 * C, C, 0.0f,
                            dv + (size_t)s0 * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s1 - s0, hs, T - s0, 1.0f,
                            dp + (size_t)s0 * T + s0, T, q + (size_t)s0 * C3, C3, 0.0f,
                            dk + (size_t)s0 * C3, C3);
            }
        }
    }
}
