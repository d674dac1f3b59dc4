/* Text generation from a trained model: temperature and top-k sampling, one token at a time. */
#ifndef ZTRAIN_SAMPLER_H
#define ZTRAIN_SAMPLER_H

#include <stdint.h>

#include "ztrain/model.h"
#include "ztrain/status.h"

typedef struct {
    float temperature;  /* > 0; 1 samples the model's distribution, smaller is greedier */
    int top_k;          /* 0: the whole vocabulary */
    uint64_t seed;
} zt_sample_options;

/* Extends tokens[0..n_prompt) to tokens[0..n_total) by sampling; the context the model sees is
 * the last block_size tokens. `tokens` has room for n_total entries; n_prompt ≥ 1. on_token (may
 * be NULL) is called with each new token as it is produced. */
zt_status zt_sample_generate(zt_model *m, int32_t *tokens, int n_prompt, int n_total,
                             const zt_sample_options *opts,
                             void (*on_token)(int32_t token, void *ctx), void *ctx);

/* zt_sample_generate that stops after producing the token `stop` (< 0: never), with the end of
 * what it wrote in *n_end (may be NULL): tokens[n_prompt..*n_end) are new, the stop token
 * included when it came. */
zt_status zt_sample_generate_until(zt_model *m, int32_t *tokens, int n_prompt, int n_total,
                                   const zt_sample_options *opts, int32_t stop, int *n_end,
                                   void (*on_token)(int32_t token, void *ctx), void *ctx);

#endif
