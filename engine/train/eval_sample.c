/* Text samples at evaluation (eval_sample.h): the model continues the job's prompt and the text
 * goes to the log as one line, its newlines and control characters escaped. */
#include "eval_sample.h"

#include <stdlib.h>
#include <string.h>

#include "ztrain/text.h"
#include "ztrain/sampler.h"

zt_status zt_eval_sampler_init(zt_eval_sampler *s, const zt_job_spec *job) {
    memset(s, 0, sizeof *s);
    const zt_data_spec *d = &job->data;
    ZT_TRY(zt_tokenizer_load(d->tokenizer, &s->tok));
    zt_status st = ZT_OK;
    if (zt_tokenizer_vocab_size(s->tok) > job->model.vocab_size)
        st = zt_error(ZT_ERR_INVALID, "data.tokenizer %s has %d tokens but model.vocab_size is %d",
                      d->tokenizer, zt_tokenizer_vocab_size(s->tok), job->model.vocab_size);
    zt_tok_worker_t *w = NULL;
    zt_tok_ids ids = {0};
    const char *prompt = d->sample_prompt ? d->sample_prompt : "";
    if (st == ZT_OK)
        st = zt_tok_worker_create(s->tok, &w);
    if (st == ZT_OK)
        st = zt_tok_encode(w, prompt, strlen(prompt), true, &ids, NULL);
    zt_tok_worker_destroy(w);
    /* An empty prompt (and no BOS template) starts from the end-of-text token. */
    const char *eot[] = {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"};
    int32_t start = -1;
    for (size_t i = 0; ids.n == 0 && start < 0 && i < sizeof eot / sizeof eot[0]; i++)
        start = zt_tokenizer_token_id(s->tok, eot[i]);
    if (st == ZT_OK && ids.n == 0 && start < 0)
        st = zt_error(ZT_ERR_INVALID, "data.sample_prompt is empty and %s has no BOS or "
                      "end-of-text token to start from", d->tokenizer);
    if (st == ZT_OK && ids.n + (size_t)d->sample_tokens > (size_t)job->model.block_size * 64)
        st = zt_error(ZT_ERR_INVALID, "data.sample_prompt and data.sample_tokens make %zu "
                      "tokens, too long a sample", ids.n + (size_t)d->sample_tokens);
    if (st == ZT_OK) {
        s->n_prompt = ids.n ? (int)ids.n : 1;
        s->n_total = s->n_prompt + d->sample_tokens;
        s->tokens = malloc((size_t)s->n_total * sizeof *s->tokens);
        if (!s->tokens)
            st = zt_error(ZT_ERR_NOMEM, "out of memory");
        else if (ids.n)
            memcpy(s->tokens, ids.ids, ids.n * sizeof *ids.ids);
        else
            s->tokens[0] = start;
    }
    free(ids.ids);
    if (st != ZT_OK)
        zt_eval_sampler_free(s);
    return st;
}

zt_status zt_eval_sampler_run(zt_eval_sampler *s, zt_model *m, int64_t step, FILE *out) {
    zt_sample_options o = {.temperature = 0.8f, .top_k = 40, .seed = 1234};
    ZT_TRY(zt_sample_generate(m, s->tokens, s->n_prompt, s->n_total, &o, NULL, NULL));
    char *text;
    ZT_TRY(zt_tokenizer_decode(s->tok, s->tokens, (size_t)s->n_total, true, &text, NULL));
    char *shown = zt_text_escape_dup(text, 0);
    free(text);
    if (!shown)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    if (out) {
        fprintf(out, "step %lld | sample: %s\n", (long long)step, shown);
        fflush(out);
    }
    free(shown);
    return ZT_OK;
}

void zt_eval_sampler_free(zt_eval_sampler *s) {
    zt_tokenizer_destroy(s->tok);
    free(s->tokens);
    memset(s, 0, sizeof *s);
}
