/* `ztrain sample --chat`: a conversation rendered with the model's chat template, and the
 * reply the model samples after it. */
#ifndef ZTRAIN_CLI_CHAT_H
#define ZTRAIN_CLI_CHAT_H

#include "ztrain/model.h"
#include "ztrain/sampler.h"
#include "ztrain/tokenizer.h"

/* Reads the conversation (a JSON list of {"role", "content"} messages, or an object with one
 * under "messages") from conv_path, renders it with the generation prompt using the chat
 * template of template_path (NULL: tokenizer_config.json beside tok_path), samples at most
 * max_tokens tokens, stopping at the template's eos_token, and prints the reply's text. Returns
 * the exit status (0, or 1 with the error on stderr). */
int zt_cli_sample_chat(zt_model *m, const zt_tokenizer_t *tok, const char *tok_path,
                       const char *conv_path, const char *template_path, int max_tokens,
                       const zt_sample_options *so);

#endif
