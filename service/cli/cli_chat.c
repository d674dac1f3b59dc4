/* `ztrain sample --chat` (cli_chat.h). */
#include "cli_chat.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_remote.h"
#include "ztrain/chat_template.h"
#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"

static zt_status prompt_ids(const zt_tokenizer_t *tok, const char *text, int vocab,
                            zt_tok_ids *ids) {
    zt_tok_worker_t *w;
    ZT_TRY(zt_tok_worker_create(tok, &w));
    /* The template writes the special tokens itself, as apply_chat_template's encoding. */
    zt_status s = zt_tok_encode(w, text, strlen(text), false, ids, NULL);
    zt_tok_worker_destroy(w);
    for (size_t i = 0; s == ZT_OK && i < ids->n; i++)
        if (ids->ids[i] >= vocab)
            s = zt_error(ZT_ERR_INVALID, "sample: the prompt's token %d is outside the model's "
                         "vocab_size %d", ids->ids[i], vocab);
    if (s == ZT_OK && ids->n == 0)
        s = zt_error(ZT_ERR_INVALID, "sample: the conversation renders to no tokens");
    return s;
}

int zt_cli_sample_chat(zt_model *m, const zt_tokenizer_t *tok, const char *tok_path,
                       const char *conv_path, const char *template_path, int max_tokens,
                       const zt_sample_options *so) {
    char cfg[PATH_MAX];
    if (template_path)
        snprintf(cfg, sizeof cfg, "%s", template_path);
    else
        zt_path_beside(tok_path, "tokenizer_config.json", cfg, sizeof cfg);
    zt_chat_template *t = NULL;
    cJSON *conv = NULL;
    char *text = NULL, *reply = NULL;
    zt_tok_ids ids = {0};
    int32_t *tokens = NULL;
    zt_status s = zt_chat_template_load(cfg, &t);
    if (s == ZT_OK)
        s = zt_json_load_file(conv_path, &conv);
    zt_chat_conversation c;
    zt_chat_conversation_split(conv, NULL, &c);
    c.args.add_generation_prompt = true;
    if (s == ZT_OK && !cJSON_IsArray(conv) && !cJSON_IsObject(conv))
        s = zt_error(ZT_ERR_FORMAT, "%s: not a list of messages (nor an object with "
                     "\"messages\")", conv_path);
    if (s == ZT_OK)
        s = zt_chat_conversation_check(&c, NULL, conv_path);
    if (s == ZT_OK)
        s = zt_chat_template_render(t, c.messages, &c.args, &text, NULL);
    if (s == ZT_OK)
        s = prompt_ids(tok, text, m->spec.vocab_size, &ids);
    int n_end = 0;
    if (s == ZT_OK) {
        tokens = malloc(sizeof *tokens * (ids.n + (size_t)max_tokens));
        if (!tokens)
            s = zt_error(ZT_ERR_NOMEM, "sample: out of memory");
    }
    if (s == ZT_OK) {
        memcpy(tokens, ids.ids, ids.n * sizeof *tokens);
        /* The reply ends at the template's eos_token; one that is not a token of the
         * tokenizer can never be sampled, so the reply runs to max_tokens: say so. */
        const char *eos = zt_chat_template_eos(t);
        int32_t stop = eos[0] ? zt_tokenizer_token_id(tok, eos) : -1;
        if (stop < 0 && eos[0])
            fprintf(stderr, "ztrain: sample: warning: %s: eos_token \"%s\" is not a single "
                    "token of %s: the reply does not stop before --tokens %d\n", cfg, eos,
                    tok_path, max_tokens);
        else if (stop < 0)
            fprintf(stderr, "ztrain: sample: warning: %s: no eos_token: the reply does not "
                    "stop before --tokens %d\n", cfg, max_tokens);
        s = zt_sample_generate_until(m, tokens, (int)ids.n, (int)ids.n + max_tokens, so, stop,
                                     &n_end, NULL, NULL);
    }
    if (s == ZT_OK)
        s = zt_tokenizer_decode(tok, tokens + ids.n, (size_t)n_end - ids.n, true, &reply, NULL);
    if (s == ZT_OK)
        printf("%s\n", reply);
    free(reply);
    free(tokens);
    free(ids.ids);
    free(text);
    cJSON_Delete(conv);
    zt_chat_template_destroy(t);
    if (s != ZT_OK)
        return zt_cli_fail("sample: ");
    return 0;
}
