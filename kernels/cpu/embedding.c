/* Token embeddings, with learned position embeddings added when the model has them (GPT-2). A
 * negative token has no row here (a vocabulary-parallel shard that does not hold it): its output
 * is the position's embedding alone, or zeros, and it adds nothing to dwte. */
#include <string.h>

#include "cpu_kernels.h"

void zt_cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C, zt_dtype act) {
#pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * C;
        if (tokens[bt] < 0) {
            if (wpe) {
                memcpy(o, wpe + (size_t)(bt % T) * C, sizeof(float) * C);
                zt_cpu_round_run(o, (size_t)C, act);
            } else {
                memset(o, 0, sizeof(float) * C);
            }
            continue;
        }
        const float *te = wte + (size_t)tokens[bt] * C;
        if (!wpe) {
            memcpy(o, te, sizeof(float) * C);
            zt_cpu_round_run(o, (size_t)C, act);
            continue;
        }
        const float *pe = wpe + (size_t)(bt % T) * C;
#pragma omp simd
        for (int c = 0; c < C; c++)
            o[c] = te[c] + pe[c];
        zt_cpu_round_run(o, (size_t)C, act);
    }
}

/* Several positions may hold the same token, so threads split the channels rather than the
 * positions: every thread owns a column band of dwte and dwpe and the sums stay deterministic. */
void zt_cpu_embedding_backward(float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C) {
    const int band = 16;
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += band) {
        int c1 = c0 + band < C ? c0 + band : C;
        for (int bt = 0; bt < B * T; bt++) {
            const float *d = dout + (size_t)bt * C;
            if (tokens[bt] >= 0) {
                float *te = dwte + (size_t)tokens[bt] * C;
                for (int c = c0; c < c1; c++)
                    te[c] += d[c];
            }
            if (!dwpe)
                continue;
            float *pe = dwpe + (size_t)(bt % T) * C;
            for (int c = c0; c < c1; c++)
                pe[c] += d[c];
        }
    }
}
