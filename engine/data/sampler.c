/* Temperature / top-k sampling. The context is re-run through the full forward each step; at the
 * sizes this trains on the CPU that is fast enough that a key/value cache would not pay for its
 * complexity. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/sampler.h"

static uint64_t next_random(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int compare_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

zt_status zt_sample_generate(zt_model *m, int32_t *tokens, int n_prompt, int n_total,
                             const zt_sample_options *opts,
                             void (*on_token)(int32_t token, void *ctx), void *ctx) {
    return zt_sample_generate_until(m, tokens, n_prompt, n_total, opts, -1, NULL, on_token, ctx);
}

zt_status zt_sample_generate_until(zt_model *m, int32_t *tokens, int n_prompt, int n_total,
                                   const zt_sample_options *opts, int32_t stop, int *n_end,
                                   void (*on_token)(int32_t token, void *ctx), void *ctx) {
    if (n_end)
        *n_end = n_prompt;
    const int V = m->spec.vocab_size, maxT = m->spec.block_size;
    if (n_prompt < 1 || n_total < n_prompt)
        return zt_error(ZT_ERR_INVALID, "sample: need at least one prompt token");
    if (!(opts->temperature > 0.0f))
        return zt_error(ZT_ERR_INVALID, "sample: temperature must be positive, got %g",
                        opts->temperature);
    for (int i = 0; i < n_prompt; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return zt_error(ZT_ERR_INVALID, "sample: prompt token %d is outside vocab_size %d",
                            tokens[i], V);
    float *probs = malloc(sizeof(float) * V * 3);
    if (!probs)
        return zt_error(ZT_ERR_NOMEM, "sample: out of memory");
    float *sorted = probs + V, *logits = probs + 2 * V;
    uint64_t rng = opts->seed;
    for (int n = n_prompt; n < n_total; n++) {
        int start = n > maxT ? n - maxT : 0, T = n - start;
        /* Under tensor parallelism every shard runs this alike: the forward and the gathered
         * logits are collectives of the TP group, and the same logits and seed make every
         * shard pick the same token. */
        m->ops->forward(m, tokens + start, NULL, 1, T, 0.0f);
        zt_status s = zt_model_logits(m, (size_t)(T - 1), 1, logits);
        if (s != ZT_OK) {
            free(probs);
            return s;
        }
        float cutoff = -INFINITY;
        if (opts->top_k > 0 && opts->top_k < V) {
            memcpy(sorted, logits, sizeof(float) * V);
            qsort(sorted, V, sizeof(float), compare_desc);
            cutoff = sorted[opts->top_k - 1];
        }
        float mx = -INFINITY;
        for (int v = 0; v < V; v++)
            if (logits[v] >= cutoff && logits[v] > mx)
                mx = logits[v];
        double sum = 0.0;
        for (int v = 0; v < V; v++) {
            probs[v] = logits[v] >= cutoff ? expf((logits[v] - mx) / opts->temperature) : 0.0f;
            sum += probs[v];
        }
        double r = ((next_random(&rng) >> 11) * 0x1.0p-53) * sum, acc = 0.0;
        int pick = V - 1;
        for (int v = 0; v < V; v++) {
            acc += probs[v];
            if (probs[v] > 0.0f && r < acc) {
                pick = v;
                break;
            }
        }
        tokens[n] = pick;
        if (n_end)
            *n_end = n + 1;
        if (on_token)
            on_token(pick, ctx);
        if (pick == stop)
            break;
    }
    free(probs);
    return ZT_OK;
}
