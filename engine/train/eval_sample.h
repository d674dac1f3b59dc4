/* A text sample from the model being trained, at each evaluation, when the job asks for one
 * (data.sample_tokens > 0 with data.tokenizer): rank 0 prints "step N | sample: TEXT" on its
 * progress output, which is the job's log, so ztraind's dashboard shows it (internal). */
#ifndef ZTRAIN_EVAL_SAMPLE_H
#define ZTRAIN_EVAL_SAMPLE_H

#include <stdint.h>
#include <stdio.h>

#include "ztrain/job_spec.h"
#include "ztrain/model.h"
#include "ztrain/tokenizer.h"

typedef struct {
    zt_tokenizer_t *tok;
    int32_t *tokens;   /* the prompt's ids, then room for the sample */
    int n_prompt, n_total;
} zt_eval_sampler;

/* Loads the tokenizer and encodes the prompt (data.sample_prompt; empty: the BOS template or the
 * end-of-text token). Fails naming what is missing or too large for the model. */
zt_status zt_eval_sampler_init(zt_eval_sampler *s, const zt_job_spec *job);

/* Samples data.sample_tokens tokens (temperature 0.8, top-k 40, seed 1234: the same each
 * evaluation, so successive samples show what training changed) and prints the line. */
zt_status zt_eval_sampler_run(zt_eval_sampler *s, zt_model *m, int64_t step, FILE *out);

void zt_eval_sampler_free(zt_eval_sampler *s);

#endif
