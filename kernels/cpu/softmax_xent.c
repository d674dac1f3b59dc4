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

/* Vocabulary-parallel cross-entropy (Megatron's), a shard of V columns at a time: the row's
 * local maximum, the sum of exp(x - max) and the target's logit when this shard holds it
 * (targets[n] >= 0 is a local column; < 0 is not here), for the caller to combine across shards. */
void zt_cpu_xent_partial_stats(float *stats, const float *logits, const int32_t *targets, int N,
                               int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        float mx = x[0];
        for (int v = 1; v < V; v++)
            mx = x[v] > mx ? x[v] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++)
            sum += expf(x[v] - mx);
        stats[3 * (size_t)n] = mx;
        stats[3 * (size_t)n + 1] = sum;
        stats[3 * (size_t)n + 2] = targets[n] >= 0 ? x[targets[n]] : 0.0f;
    }
}

/* The shards' stats combined (ops.h, xent_partial_combine): the maxima's maximum M, then in
 * shard order the rescaled sums in double, each term added with one rounding (an fma, which a
 * GPU kernel can match: a compiler free to contract would choose per build), and the target
 * logits in fp32; the log-partition and the loss. */
void zt_cpu_xent_partial_combine(float *logz, float *losses, const float *stats,
                                 const int32_t *targets, int N, int shards) {
    const size_t part = 3 * (size_t)N;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *row = stats + 3 * (size_t)n;
        float mx = row[0], target = 0.0f;
        for (int s = 1; s < shards; s++)
            mx = fmaxf(mx, row[(size_t)s * part]);
        double sum = 0.0;
        for (int s = 0; s < shards; s++) {
            const float *st = row + (size_t)s * part;
            sum = fma((double)st[1], exp((double)st[0] - mx), sum);
            target += st[2];
        }
        logz[n] = mx + (float)log(sum);
        losses[n] = targets[n] == ZT_XENT_IGNORED ? 0.0f : logz[n] - target;
    }
}

/* The shard's gradient from the whole row's log-partition logz[n]: grad_scale · (softmax -
 * onehot) over the shard's columns; a row whose target is ZT_XENT_IGNORED gets zeros. */
void zt_cpu_xent_partial_grad(float *logits, const float *logz, const int32_t *targets, int N,
                              int V, float grad_scale) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * V;
        if (targets[n] == ZT_XENT_IGNORED) {
            for (int v = 0; v < V; v++)
                x[v] = 0.0f;
            continue;
        }
        const float lz = logz[n];
#pragma omp simd
        for (int v = 0; v < V; v++)
            x[v] = expf(x[v] - lz) * grad_scale;
        if (targets[n] >= 0)
            x[targets[n]] -= grad_scale;
    }
}
