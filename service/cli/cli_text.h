/* Text in and out of `ztrain sample` with a tokenizer: the prompt encoded as the tokenizer's
 * family does (BOS from its post-processor), and the ids printed as text while they are generated. */
#ifndef ZTRAIN_CLI_TEXT_H
#define ZTRAIN_CLI_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/status.h"
#include "ztrain/tokenizer.h"

typedef struct {
    const zt_tokenizer_t *tok;
    int32_t *ids;          /* every id so far: the prompt's and the generated ones */
    size_t n, cap;
    char *shown;           /* the text printed so far */
    size_t shown_len;
    bool reprinted;        /* the decoder changed printed text once: said on stderr */
} zt_cli_text;

/* Encodes prompt (may be empty: the sequence then starts with the template's BOS, else the
 * tokenizer's end-of-text token) into tokens[0..*n) (room for cap), checks every id against the
 * model's vocab_size, and prints the prompt's text. Finish t with zt_cli_text_finish. */
zt_status zt_cli_text_prompt(zt_cli_text *t, const zt_tokenizer_t *tok, const char *prompt,
                             int vocab_size, int32_t *tokens, int cap, int *n);

/* zt_sample_generate's on_token: prints the text the new id completes. A run of byte-fallback
 * tokens (<0xNN>) waits for the id after it, as do bytes of an unfinished UTF-8 character, since
 * the ids that follow may still change their text. ctx is the zt_cli_text. The output is one
 * decode of the whole sequence; a decoder that changes text already printed in another way has
 * the whole text printed again on a new line (see show() in cli_text.c). */
void zt_cli_text_on_token(int32_t token, void *ctx);

/* Prints what is left (an unfinished character as U+FFFD) and frees t. */
void zt_cli_text_finish(zt_cli_text *t);

#endif
