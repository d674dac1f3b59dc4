/* `ztrain prepare --format chat|prompt-completion`: JSONL examples into token shards with loss
 * masks (ztrain/prepare.h says the rules; ztrain/loss_mask.h the mask).
 *
 * Examples are read one at a time and held per split until the end, when they are cut into
 * shards at example boundaries: fine-tuning sets are small next to pre-training corpora, and a
 * failure anywhere leaves no shard behind. Which tokens an assistant turn (or a completion)
 * covers is found by encoding the text up to each boundary: its tokens must be the first ones of
 * the whole example's, as TRL requires of a prompt; a boundary inside a token (a prompt ending in
 * a space that merges with the completion's first word) is refused naming the line, rather than
 * training on part of the prompt or leaving out part of the answer. {% generation %} blocks,
 * which transformers maps by offsets, are mapped by the tokens' offsets where the tokenizer has
 * them (generation_mask). */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "prepare_internal.h"
#include "ztrain/chat_template.h"
#include "ztrain/data.h"
#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"
#include "ztrain/loss_mask.h"
#include "ztrain/prepare.h"
#include "ztrain/tokenizer.h"

#define DEFAULT_SHARD_TOKENS 100000000

typedef struct {
    int32_t *ids;
    uint8_t *flags;
    size_t n, cap;
    size_t *starts; /* where each example begins */
    size_t n_ex, cap_ex;
} split_buf;

typedef struct {
    const zt_prepare_options *o;
    zt_prepare_stats *st;
    zt_tokenizer_t *tok;
    zt_tok_worker_t *w;
    zt_chat_template *tmpl;
    int32_t eos;
    split_buf train, val;
    zt_tok_ids ex, part; /* the example's ids, and a prefix's */
    uint8_t *ex_flags;
    size_t ex_flags_cap;
} sft_run;

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static zt_status grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap)
        return ZT_OK;
    size_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * size);
    if (!q)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    *p = q;
    *cap = c;
    return ZT_OK;
}

/* Encodes text[0..len) into out (cleared first). */
static zt_status encode(sft_run *r, const char *text, size_t len, bool special, zt_tok_ids *out) {
    out->n = 0;
    size_t bad = 0;
    ZT_TRY(zt_tok_encode(r->w, text, len, special, out, &bad));
    r->st->invalid_utf8 += bad;
    return ZT_OK;
}

/* The example's token index where text offset `at` falls: the count of the prefix's tokens
 * (without the post-processor's closing ones), which must begin the example's. */
static zt_status boundary(sft_run *r, const char *text, size_t at, bool special, size_t *tok,
                          const char *where, const char *what) {
    ZT_TRY(encode(r, text, at, special, &r->part));
    size_t n = r->part.n;
    if (special) {
        const int32_t *before, *after;
        size_t nb, na;
        zt_tokenizer_template(r->tok, &before, &nb, &after, &na);
        n = n >= na ? n - na : 0;
    }
    size_t k = 0;
    while (k < n && k < r->ex.n && r->part.ids[k] == r->ex.ids[k])
        k++;
    if (k < n)
        return zt_error(ZT_ERR_INVALID, "%s: the tokens of the text before %s are not the first "
                        "tokens of the whole example (token %zu differs: the boundary falls "
                        "inside a token, e.g. a prompt ending in whitespace)", where, what, k);
    *tok = k;
    return ZT_OK;
}

static void mark(sft_run *r, size_t from, size_t to) {
    for (size_t i = from; i < to && i < r->ex.n; i++)
        r->ex_flags[i] |= ZT_LOSS_MASK_TRAINED;
}

/* Renders the first k messages; spans (or NULL) receives the generation blocks' spans. */
static zt_status render_prefix(sft_run *r, const zt_chat_conversation *c, int k, bool gen,
                               char **out, zt_chat_spans *spans, const char *where) {
    cJSON *head = cJSON_CreateArray();
    if (!head)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < k; i++)
        cJSON_AddItemReferenceToArray(head, cJSON_GetArrayItem(c->messages, i));
    zt_chat_args a = c->args;
    a.add_generation_prompt = gen;
    zt_status s = zt_chat_template_render(r->tmpl, head, &a, out, spans);
    cJSON_Delete(head);
    return s == ZT_OK ? s : zt_error_prefix(s, "%s: ", where);
}

/* The start of the UTF-8 character that holds byte at of text. */
static size_t char_start(const char *text, size_t at) {
    while (at > 0 && ((unsigned char)text[at] & 0xC0) == 0x80)
        at--;
    return at;
}

/* Names generation span k of a line for messages: its place and first words, cut at a
 * character. (Which message a block belongs to is not known: a turn may write two blocks, or
 * none.) */
static void span_name(const char *text, const zt_chat_spans *sp, size_t k, char *out,
                      size_t cap) {
    size_t n = sp->end[k] - sp->start[k];
    if (n > 30)
        n = char_start(text + sp->start[k], 30);
    snprintf(out, cap, "generation block %zu (\"%.*s\")", k + 1, (int)n, text + sp->start[k]);
}

/* The example's token that holds byte `at` of its text: the first whose end lies past it. */
static size_t token_at(const size_t *ends, size_t n, size_t at) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ends[mid] > at)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Without offsets, span k's first token (*ts) and the first token holding its last character
 * (*te) are found by encoding the text before them, whose tokens must begin the example's
 * (boundary()); a span edge inside a token, or a last character split over tokens, is refused
 * naming the line and the block. */
static zt_status span_by_prefixes(sft_run *r, const char *full, size_t len,
                                  const zt_chat_spans *sp, size_t k, size_t *ts, size_t *te,
                                  const char *where) {
    size_t s = sp->start[k], e = sp->end[k], last = 0;
    char what[128], what_end[160];
    span_name(full, sp, k, what, sizeof what);
    snprintf(what_end, sizeof what_end, "the last character of %s", what);
    ZT_TRY(boundary(r, full, s, false, ts, where, what));
    /* the first token that holds the last character: one that starts with it, or for a
     * one-byte character the token that ends the span */
    size_t cs = char_start(full, e - 1);
    zt_status st = cs == s ? (last = *ts, ZT_OK)
                           : boundary(r, full, cs, false, &last, where, what_end);
    if (st != ZT_OK && cs == e - 1) {
        st = e == len ? (last = r->ex.n, ZT_OK)
                      : boundary(r, full, e, false, &last, where, what_end);
        *te = last - 1;
    } else {
        *te = last;
    }
    return st;
}

/* The loss mask of a template with {% generation %} blocks, as apply_chat_template(...,
 * return_assistant_tokens_mask=True) computes it: for each span the tokens from the one holding
 * its first character through the one holding its last (char_to_token of start and end - 1; a
 * start past the text stops the marking, and an end in token 0 marks up to token 1 only:
 * transformers 4.46 then runs to len(input_ids), which for one conversation is the length of
 * the list around its ids, 1). Byte-level and SentencePiece-style tokenizers give the tokens'
 * offsets (zt_tokenizer_offsets), read as char_to_token reads them: a span's byte offsets are
 * its characters' first bytes. A text without them (an <unk> token, a normalizer that changes
 * it) falls back to span_by_prefixes. */
static zt_status generation_mask(sft_run *r, const char *full, size_t len,
                                 const zt_chat_spans *sp, const char *where) {
    size_t n = r->ex.n, *ends = malloc((n + 1) * sizeof *ends);
    if (!ends)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    bool exact = zt_tokenizer_offsets(r->tok, r->ex.ids, n, full, len, ends);
    zt_status st = ZT_OK;
    for (size_t k = 0; st == ZT_OK && k < sp->n; k++) {
        size_t s = sp->start[k], e = sp->end[k], ts = 0, te = 0;
        if (s >= len)
            break;
        if (e == 0) {
            char what[128];
            span_name(full, sp, k, what, sizeof what);
            st = zt_error(ZT_ERR_UNSUPPORTED, "%s: %s is empty at the text's start, which has "
                          "no last character to find", where, what);
        } else if (exact) {
            ts = token_at(ends, n, s);
            te = token_at(ends, n, char_start(full, e - 1));
        } else {
            st = span_by_prefixes(r, full, len, sp, k, &ts, &te, where);
        }
        if (st == ZT_OK)
            mark(r, ts, te ? te + 1 : 1);
    }
    free(ends);
    return st;
}

/* The loss mask by the prefix rule: each assistant turn is the text between the conversation
 * before it rendered with the generation prompt and the conversation through it, both of
 * which must begin the whole. */
static zt_status prefix_mask(sft_run *r, const zt_chat_conversation *c, const char *full,
                             size_t len, const char *where) {
    zt_status s = ZT_OK;
    const cJSON *m;
    int k = 0;
    cJSON_ArrayForEach(m, c->messages) {
        if (s != ZT_OK)
            break;
        const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        if (strcmp(role, "assistant") == 0) {
            char *before = NULL, *through = NULL;
            s = render_prefix(r, c, k, true, &before, NULL, where);
            if (s == ZT_OK)
                s = render_prefix(r, c, k + 1, false, &through, NULL, where);
            size_t a = before ? strlen(before) : 0, b = through ? strlen(through) : 0;
            if (s == ZT_OK && (b > len || memcmp(through, full, b) != 0 || a > b ||
                               memcmp(before, full, a) != 0))
                s = zt_error(ZT_ERR_UNSUPPORTED, "%s: the chat template does not render the "
                             "conversation up to message %d as the start of the whole, so its "
                             "assistant turn cannot be located (a template whose assistant "
                             "turns are {%% generation %%} blocks is masked by those instead: "
                             "see docs/fine-tuning.md)", where, k);
            size_t ta = 0, tb = 0;
            char what[64];
            snprintf(what, sizeof what, "assistant message %d", k);
            if (s == ZT_OK)
                s = boundary(r, full, a, false, &ta, where, what);
            snprintf(what, sizeof what, "the message after assistant message %d", k);
            if (s == ZT_OK)
                s = b == len ? (tb = r->ex.n, ZT_OK)
                             : boundary(r, full, b, false, &tb, where, what);
            if (s == ZT_OK)
                mark(r, ta, tb);
            free(before);
            free(through);
        }
        k++;
    }
    return s;
}

static zt_status chat_example(sft_run *r, const cJSON *obj, const char *where) {
    zt_chat_conversation c;
    zt_chat_conversation_split(obj, r->o->field, &c);
    ZT_TRY(zt_chat_conversation_check(&c, r->o->field, where));
    bool tracked = zt_chat_template_has_generation(r->tmpl, &c.args);
    char *full = NULL;
    zt_chat_spans spans = {0};
    zt_status s = render_prefix(r, &c, cJSON_GetArraySize(c.messages), false, &full,
                                tracked ? &spans : NULL, where);
    size_t len = full ? strlen(full) : 0;
    if (s == ZT_OK)
        s = encode(r, full, len, false, &r->ex);
    if (s == ZT_OK)
        s = grow((void **)&r->ex_flags, &r->ex_flags_cap, r->ex.n + 1, 1);
    if (s == ZT_OK)
        memset(r->ex_flags, 0, r->ex.n);
    if (s == ZT_OK)
        s = tracked ? generation_mask(r, full, len, &spans, where)
                    : prefix_mask(r, &c, full, len, where);
    zt_chat_spans_free(&spans);
    free(full);
    return s;
}

static zt_status prompt_completion_example(sft_run *r, const cJSON *obj, const char *where) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "prompt");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(obj, "completion");
    if (!cJSON_IsString(p) || !cJSON_IsString(c))
        return zt_error(ZT_ERR_FORMAT, "%s: no string \"prompt\" and \"completion\"", where);
    size_t lp = strlen(p->valuestring), lc = strlen(c->valuestring);
    char *text = malloc(lp + lc + 1);
    if (!text)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    memcpy(text, p->valuestring, lp);
    memcpy(text + lp, c->valuestring, lc + 1);
    zt_status s = encode(r, text, lp + lc, true, &r->ex);
    /* The post-processor's closing tokens (if any) end the text; EOS ends the completion. */
    if (s == ZT_OK)
        s = grow((void **)&r->ex.ids, &r->ex.cap, r->ex.n + 1, sizeof(int32_t));
    if (s == ZT_OK)
        r->ex.ids[r->ex.n++] = r->eos;
    if (s == ZT_OK)
        s = grow((void **)&r->ex_flags, &r->ex_flags_cap, r->ex.n + 1, 1);
    size_t tp = 0;
    if (s == ZT_OK) {
        memset(r->ex_flags, 0, r->ex.n);
        s = boundary(r, text, lp, true, &tp, where, "the completion");
    }
    if (s == ZT_OK)
        mark(r, tp, r->ex.n);
    free(text);
    return s;
}

static zt_status add_example(sft_run *r, split_buf *b) {
    size_t n = r->ex.n;
    if (n == 0)
        return ZT_OK;
    if (r->o->max_length > 0 && n > (size_t)r->o->max_length) {
        if (r->o->drop_long) {
            r->st->dropped++;
            return ZT_OK;
        }
        r->st->truncated++;
        n = (size_t)r->o->max_length;
    }
    ZT_TRY(grow((void **)&b->ids, &b->cap, b->n + n, sizeof(int32_t)));
    void *f = realloc(b->flags, b->cap);
    if (!f)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    b->flags = f;
    ZT_TRY(grow((void **)&b->starts, &b->cap_ex, b->n_ex + 1, sizeof(size_t)));
    b->starts[b->n_ex++] = b->n;
    memcpy(b->ids + b->n, r->ex.ids, n * sizeof(int32_t));
    memcpy(b->flags + b->n, r->ex_flags, n);
    b->flags[b->n] |= ZT_LOSS_MASK_DOC_START;
    for (size_t i = 1; i < n; i++)
        r->st->trained_tokens += (r->ex_flags[i] & ZT_LOSS_MASK_TRAINED) != 0;
    b->n += n;
    r->st->documents++;
    r->st->tokens += n;
    return ZT_OK;
}

/* The line [p, end) as one JSON value, as Python's json.loads reads it: NULL when it is not JSON
 * or has more than blanks after the value (a second object on the line would otherwise be
 * dropped unseen). */
static cJSON *parse_line(const char *p, const char *end) {
    const char *rest = NULL;
    cJSON *obj = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &rest, false);
    while (obj && rest < end && (*rest == ' ' || *rest == '\t' || *rest == '\r'))
        rest++;
    if (obj && rest < end) {
        cJSON_Delete(obj);
        return NULL;
    }
    return obj;
}

/* A bad line: the error, or counted and skipped under --skip-bad-lines. */
static zt_status bad_line(sft_run *r, zt_status s) {
    if (!r->o->skip_bad_lines)
        return s;
    r->st->bad_lines++;
    return ZT_OK;
}

static zt_status read_file(sft_run *r, const char *path, uint64_t *index) {
    char *text;
    size_t len;
    ZT_TRY(zt_json_read_file(path, &text, &len));
    r->st->bytes += len;
    zt_status s = ZT_OK;
    size_t line = 0;
    for (char *p = text; s == ZT_OK && p < text + len; line++) {
        char *nl = memchr(p, '\n', (size_t)(text + len - p));
        char *end = nl ? nl : text + len;
        char where[4200];
        snprintf(where, sizeof where, "%s:%zu", path, line + 1);
        char save = *end;
        *end = '\0';
        const char *q = p;
        while (*q == ' ' || *q == '\t' || *q == '\r')
            q++;
        if (*q) {
            cJSON *obj = parse_line(p, end);
            /* 5.0 stays a float in the template, and 12345678901234567891 exact, as in
             * Python's json.loads (only a chat template sees the numbers of a line) */
            if (obj && r->o->format == ZT_PREPARE_CHAT &&
                !zt_json_mark_floats(obj, p, (size_t)(end - p))) {
                s = zt_error(ZT_ERR_NOMEM, "%s: out of memory keeping a large integer's digits",
                             where);
            } else if (!cJSON_IsObject(obj)) {
                s = bad_line(r, zt_error(ZT_ERR_FORMAT, "%s: not a JSON object", where));
            } else if ((s = zt_json_check_duplicates(obj, where, "the line", "", NULL)) != ZT_OK) {
                /* cJSON finds the first of two same keys, json.loads keeps the last */
                s = bad_line(r, s);
            } else {
                s = r->o->format == ZT_PREPARE_CHAT ? chat_example(r, obj, where)
                                                    : prompt_completion_example(r, obj, where);
                bool val = r->o->val_fraction > 0 &&
                           (double)(mix(r->o->seed ^ mix(*index)) >> 11) / 9007199254740992.0 <
                               r->o->val_fraction;
                uint64_t docs = r->st->documents, tokens = r->st->tokens;
                if (s == ZT_OK)
                    s = add_example(r, val ? &r->val : &r->train);
                if (val)
                    r->st->val_documents += r->st->documents - docs,
                        r->st->val_tokens += r->st->tokens - tokens;
                (*index)++;
            }
            cJSON_Delete(obj);
        }
        *end = save;
        p = end + 1;
    }
    free(text);
    return s;
}

/* Writes one shard (tokens and mask) of b's tokens [from, to). */
static zt_status write_shard(sft_run *r, const split_buf *b, const char *split, int index,
                             size_t from, size_t to) {
    const zt_prepare_options *o = r->o;
    char path[PATH_MAX], mpath[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/%s_%s_%06d.bin", o->out_dir, o->name ? o->name : "data",
             split, index);
    zt_loss_mask_path(path, mpath, sizeof mpath);
    struct stat sb;
    if (!o->overwrite && (stat(path, &sb) == 0 || stat(mpath, &sb) == 0))
        return zt_error(ZT_ERR_INVALID, "%s exists (--overwrite replaces it)", path);
    size_t n = to - from, es = r->st->uint32_tokens ? 4 : 2;
    unsigned char *buf = malloc(ZT_DATASET_HEADER_INTS * 4 + n * es);
    if (!buf)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    int32_t header[ZT_DATASET_HEADER_INTS];
    zt_dataset_header(header, r->st->uint32_tokens, (int32_t)n);
    memcpy(buf, header, sizeof header);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)b->ids[from + i];
        unsigned char *d = buf + sizeof header + i * es;
        for (size_t k = 0; k < es; k++)
            d[k] = (unsigned char)(v >> (8 * k));
    }
    zt_status s = zt_write_file_atomic(path, buf, sizeof header + n * es);
    free(buf);
    return s == ZT_OK ? zt_loss_mask_write(mpath, b->flags + from, n) : s;
}

static zt_status write_split(sft_run *r, const split_buf *b, const char *split, int *shards) {
    size_t limit = (size_t)(r->o->shard_tokens ? r->o->shard_tokens : DEFAULT_SHARD_TOKENS);
    size_t from = 0;
    *shards = 0;
    for (size_t e = 0; e < b->n_ex; e++) {
        size_t end = e + 1 < b->n_ex ? b->starts[e + 1] : b->n;
        /* close the shard before an example that would overflow it */
        if (end - from > limit && b->starts[e] > from) {
            ZT_TRY(write_shard(r, b, split, (*shards)++, from, b->starts[e]));
            from = b->starts[e];
        }
    }
    if (b->n > from)
        ZT_TRY(write_shard(r, b, split, (*shards)++, from, b->n));
    return ZT_OK;
}

/* Whether the ByteLevel post-processor p (or one of a Sequence's) trims offsets: tokenizers'
 * default where the key is missing. */
static bool trims_offsets(const cJSON *p) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type"), *e;
    if (cJSON_IsString(type) && strcmp(type->valuestring, "Sequence") == 0) {
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "processors"))
            if (trims_offsets(e))
                return true;
        return false;
    }
    const cJSON *trim = cJSON_GetObjectItemCaseSensitive(p, "trim_offsets");
    return cJSON_IsString(type) && strcmp(type->valuestring, "ByteLevel") == 0 &&
           !cJSON_IsFalse(trim);
}

/* A ByteLevel post-processor with trim_offsets moves each token's character offsets off its
 * leading and trailing spaces, so transformers' char_to_token finds no token for a generation
 * block that starts or ends on such a space (it then stops marking, or marks token 0 at most);
 * ztrain's offsets are untrimmed, so a template with blocks is refused with such a tokenizer
 * rather than masked differently. */
static zt_status check_offsets(sft_run *r) {
    if (!zt_chat_template_has_generation(r->tmpl, NULL))
        return ZT_OK;
    cJSON *root;
    ZT_TRY(zt_json_load_file(r->o->tokenizer, &root));
    bool trims = trims_offsets(cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    cJSON_Delete(root);
    if (trims)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: post_processor ByteLevel has \"trim_offsets\": "
                        "true (or leaves it to its default), with which transformers maps a "
                        "{%% generation %%} block that starts or ends on a space to no token; "
                        "ztrain cannot reproduce that assistant mask: use a chat template "
                        "without generation blocks, or a tokenizer.json with \"trim_offsets\": "
                        "false", r->o->tokenizer);
    return ZT_OK;
}

static zt_status load_template(sft_run *r) {
    const zt_prepare_options *o = r->o;
    char path[PATH_MAX];
    if (o->chat_template)
        snprintf(path, sizeof path, "%s", o->chat_template);
    else
        zt_path_beside(o->tokenizer, "tokenizer_config.json", path, sizeof path);
    ZT_TRY(zt_chat_template_load(path, &r->tmpl));
    return check_offsets(r);
}

static void free_split(split_buf *b) {
    free(b->ids);
    free(b->flags);
    free(b->starts);
}

zt_status zt_prepare_sft_run(const zt_prepare_options *o, zt_prepare_stats *st) {
    memset(st, 0, sizeof *st);
    if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        return zt_error(ZT_ERR_INVALID, "the validation fraction %g is not in [0, 1)",
                        o->val_fraction);
    sft_run r = {.o = o, .st = st, .eos = -1};
    ZT_TRY(zt_tokenizer_load(o->tokenizer, &r.tok));
    st->vocab_size = zt_tokenizer_vocab_size(r.tok);
    st->uint32_tokens = o->dtype == ZT_PREPARE_DTYPE_U32 ||
                        (o->dtype == ZT_PREPARE_DTYPE_AUTO && st->vocab_size > 65536);
    zt_status s = ZT_OK;
    if (!st->uint32_tokens && st->vocab_size > 65536)
        s = zt_error(ZT_ERR_INVALID, "%s: a vocabulary of %d tokens does not fit uint16 token "
                     "files", o->tokenizer, st->vocab_size);
    if (s == ZT_OK && o->format == ZT_PREPARE_CHAT)
        s = load_template(&r);
    if (s == ZT_OK && o->format == ZT_PREPARE_PROMPT_COMPLETION) {
        static const char *const names[] = {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>",
                                            "<|im_end|>"};
        if (o->separator)
            r.eos = zt_tokenizer_token_id(r.tok, o->separator);
        for (size_t i = 0; !o->separator && r.eos < 0 && i < sizeof names / sizeof names[0];
             i++)
            r.eos = zt_tokenizer_token_id(r.tok, names[i]);
        if (r.eos < 0)
            s = zt_error(ZT_ERR_INVALID, "%s: no end-of-text token (%s); name it with "
                         "--separator TOKEN", o->tokenizer,
                         o->separator ? o->separator : "none of <|endoftext|>, </s>, "
                         "<|end_of_text|>, <eos>, <|im_end|>");
    }
    if (s == ZT_OK)
        s = zt_tok_worker_create(r.tok, &r.w);
    prep_files files = {0};
    if (s == ZT_OK)
        s = prep_expand_inputs(o->inputs, o->n_inputs, o->out_dir, o->name ? o->name : "data",
                               &files);
    uint64_t index = 0;
    for (size_t i = 0; s == ZT_OK && i < files.n; i++)
        s = read_file(&r, files.paths[i], &index);
    if (s == ZT_OK && r.train.n + r.val.n == 0)
        s = zt_error(ZT_ERR_INVALID, "the inputs hold no examples");
    /* Training on shards without a trained target fails at its first step: say why here. */
    uint64_t trained = 0;
    for (size_t i = 0; s == ZT_OK && i < r.train.n; i++)
        trained += (r.train.flags[i] & (ZT_LOSS_MASK_TRAINED | ZT_LOSS_MASK_DOC_START)) ==
                   ZT_LOSS_MASK_TRAINED;
    if (s == ZT_OK && r.train.n && trained == 0) {
        const char *what = o->format == ZT_PREPARE_CHAT ? "assistant turn" : "completion";
        if (o->max_length > 0 && st->truncated + st->dropped > 0)
            s = zt_error(ZT_ERR_INVALID, "the train split has no trained token (the loss would "
                         "be over 0 tokens): --max-length %lld cuts off every example's %s "
                         "(%llu truncated, %llu dropped); raise --max-length",
                         (long long)o->max_length, what, (unsigned long long)st->truncated,
                         (unsigned long long)st->dropped);
        else
            s = zt_error(ZT_ERR_INVALID, "the train split has no trained token (the loss would "
                         "be over 0 tokens): no example has a non-empty %s", what);
    }
    if (s == ZT_OK)
        s = zt_mkdirs(o->out_dir);
    if (s == ZT_OK)
        s = write_split(&r, &r.train, "train", &st->train_shards);
    if (s == ZT_OK && r.val.n)
        s = write_split(&r, &r.val, "val", &st->val_shards);
    prep_files_free(&files);
    free_split(&r.train);
    free_split(&r.val);
    free(r.ex.ids);
    free(r.part.ids);
    free(r.ex_flags);
    zt_tok_worker_destroy(r.w);
    zt_chat_template_destroy(r.tmpl);
    zt_tokenizer_destroy(r.tok);
    return s;
}
