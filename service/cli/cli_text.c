/* Prompt text in, generated text out, for `ztrain sample` (cli_text.h). Printing decodes the
 * whole sequence after each id and prints what is new: decoders that look at neighbouring tokens
 * (Metaspace's first-token rule, byte fallback) then give the same text as one decode at the end
 * (show() says what is held back for that). */
#include "cli_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static zt_status push(zt_cli_text *t, int32_t id) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        int32_t *ids = realloc(t->ids, cap * sizeof *ids);
        if (!ids)
            return zt_error(ZT_ERR_NOMEM, "sample: out of memory");
        t->ids = ids;
        t->cap = cap;
    }
    t->ids[t->n++] = id;
    return ZT_OK;
}

/* True for a <0xNN> token: ByteFallback decodes a run of them together, as UTF-8 when the whole
 * run is valid and as one U+FFFD per byte when it is not. */
static bool byte_token(const zt_tokenizer_t *tok, int32_t id) {
    const char *s = zt_tokenizer_id_token(tok, id);
    return s && strlen(s) == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' &&
           strchr("0123456789ABCDEFabcdef", s[3]) && strchr("0123456789ABCDEFabcdef", s[4]);
}

/* How many ids have text that later ids cannot change: all but a trailing run of byte tokens
 * (ids that decode leaves out, special or unknown, do not end a run: the run closes over them).
 * A run that spells 日 so far turns into four U+FFFD when a stray <0xFF> follows. */
static size_t settled(const zt_cli_text *t) {
    size_t k = t->n;
    while (k > 0) {
        int32_t id = t->ids[k - 1];
        bool dropped = !zt_tokenizer_id_token(t->tok, id) || zt_tokenizer_is_special(t->tok, id);
        if (!dropped && !byte_token(t->tok, id))
            break;
        k--;
    }
    return k;
}

/* Prints the decoded text past what is shown. Unless final, the text of a trailing run of byte
 * tokens and a trailing U+FFFD (bytes of a character still to come, from ByteLevel) are held back,
 * so that what is printed is a prefix of every later decode and the output ends as one decode
 * of the whole sequence. A decoder can still change printed text in ways no hold-back foresees
 * (a Replace of several characters after Fuse, whose pattern spans two tokens): printed text
 * cannot be taken back, so the whole corrected text is printed again on a new line, with a
 * note on stderr, and printing goes on from there; the output then ends with the one decode. */
static void show(zt_cli_text *t, bool final) {
    char *text;
    size_t len;
    if (zt_tokenizer_decode(t->tok, t->ids, final ? t->n : settled(t), true, &text, &len) != ZT_OK)
        return;
    size_t end = len;
    while (!final && end >= 3 && memcmp(text + end - 3, "\xef\xbf\xbd", 3) == 0)
        end -= 3;
    size_t from = t->shown_len;
    if (len < t->shown_len || (t->shown_len && memcmp(text, t->shown, t->shown_len) != 0)) {
        if (!t->reprinted)
            fprintf(stderr, "ztrain: sample: the tokenizer's decoder changed text already "
                            "printed: the text so far is printed again on a new line\n");
        t->reprinted = true;
        putchar('\n');
        from = 0;
    } else if (end <= t->shown_len) {
        free(text);
        return;
    }
    fwrite(text + from, 1, end - from, stdout);
    fflush(stdout);
    free(t->shown);
    t->shown = text;
    t->shown_len = end;
}

zt_status zt_cli_text_prompt(zt_cli_text *t, const zt_tokenizer_t *tok, const char *prompt,
                             int vocab_size, int32_t *tokens, int cap, int *n) {
    memset(t, 0, sizeof *t);
    t->tok = tok;
    if (zt_tokenizer_vocab_size(tok) > vocab_size)
        return zt_error(ZT_ERR_INVALID,
                        "sample: the tokenizer has %d tokens but the model's vocab_size is %d",
                        zt_tokenizer_vocab_size(tok), vocab_size);
    zt_tok_worker_t *w;
    ZT_TRY(zt_tok_worker_create(tok, &w));
    zt_tok_ids ids = {0};
    zt_status s = zt_tok_encode(w, prompt, strlen(prompt), true, &ids, NULL);
    zt_tok_worker_destroy(w);
    if (s == ZT_OK && ids.n == 0) {
        const char *names[] = {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"};
        int32_t id = -1;
        for (size_t i = 0; i < sizeof names / sizeof names[0] && id < 0; i++)
            id = zt_tokenizer_token_id(tok, names[i]);
        if (id < 0)
            s = zt_error(ZT_ERR_INVALID, "sample: an empty prompt needs a BOS or end-of-text "
                                         "token, and the tokenizer has neither; give --prompt");
        else
            s = push(t, id);
    }
    for (size_t i = 0; s == ZT_OK && i < ids.n; i++)
        s = push(t, ids.ids[i]);
    free(ids.ids);
    if (s == ZT_OK && t->n > (size_t)cap)
        s = zt_error(ZT_ERR_INVALID, "sample: the prompt is %zu tokens, more than %d", t->n, cap);
    if (s != ZT_OK) {
        free(t->ids);
        return s;
    }
    for (size_t i = 0; i < t->n; i++)
        tokens[i] = t->ids[i];
    *n = (int)t->n;
    show(t, false);
    return ZT_OK;
}

void zt_cli_text_on_token(int32_t token, void *ctx) {
    zt_cli_text *t = ctx;
    if (push(t, token) == ZT_OK)
        show(t, false);
}

void zt_cli_text_finish(zt_cli_text *t) {
    show(t, true);
    free(t->ids);
    free(t->shown);
    memset(t, 0, sizeof *t);
}
