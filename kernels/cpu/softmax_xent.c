/* Softmax cross-entropy fused with its backward, so the probabilities are never stored: each row
 * of logits becomes its own gradient in place. */
#include <math.h>

#include "cpu_kernels.h"

void zt_cpu_softmax_xent(float *losses, float *logits, const int32_t *targets, int N, int V,
                         float grad_scale, zt_dtype act) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * V;
        int32_t y = targets[n];
        if (y < 0) {
            losses[n] = 0.0f;
            if (grad_scale != 0.0f)
                for (int v = 0; v < V; v++)
                    x[v] = 0.0f;
            continue;
        }
        float mx = x[0];
        for (int v = 1; v < V; v++)
            mx = x[v] > mx ? x[v] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++)
            sum += expf(x[v] - mx);
        float logz = mx + logf(sum);
        losses[n] = logz - x[y];
        if (grad_scale != 0.0f) {
#pragma omp simd
            for (int v = 0; v < V; v++)
                x[v] = expf(x[v] - logz) * grad_scale;
            x[y] -= grad_scale;
            zt_cpu_round_run(x, (size_t)V, act);
        }
    }
}
