/* Pre-tokenizers of a tokenizer.json: how normalized text is cut into the pre-tokens BPE encodes
 * one by one (ByteLevel with GPT-2's regex, Split by a regex or string, Metaspace, Digits), and
 * ByteLevel's mapping of each byte to its printable stand-in. Regexes are Oniguruma's, compiled
 * to PCRE2 by tok_regex.c. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* GPT-2's pre-tokenizer pattern, as ByteLevel's use_regex applies it. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct tok_span {
    size_t start, end;
    bool match;
};

/* ---- parsing ---------------------------------------------------------------------------------- */

static zt_status add_pre(zt_tokenizer_t *t, tok_pre p, const char *src) {
    tok_pre *v = realloc(t->pres, (t->n_pres + 1) * sizeof *v);
    if (!v) {
        pcre2_code_free(p.re);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    }
    t->pres = v;
    v[t->n_pres++] = p;
    return ZT_OK;
}

static zt_status parse_prepend_scheme(const cJSON *j, tok_prepend *out, const char *src,
                                      const char *what) {
    const char *scheme = tok_json_str(j, "prepend_scheme");
    const cJSON *legacy = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
    if (!scheme)
        *out = cJSON_IsFalse(legacy) ? TOK_PREPEND_NEVER : TOK_PREPEND_ALWAYS;
    else if (strcmp(scheme, "always") == 0)
        *out = TOK_PREPEND_ALWAYS;
    else if (strcmp(scheme, "first") == 0)
        *out = TOK_PREPEND_FIRST;
    else if (strcmp(scheme, "never") == 0)
        *out = TOK_PREPEND_NEVER;
    else
        return zt_error(ZT_ERR_FORMAT, "%s: %s Metaspace prepend_scheme \"%s\" is unknown", src,
                        what, scheme);
    return ZT_OK;
}

static zt_status metaspace_char(const cJSON *j, char *repl, size_t *len, const char *src,
                                const char *what) {
    const char *r = tok_json_str(j, "replacement");
    if (!r)
        r = "\xe2\x96\x81";
    size_t n = strlen(r), bad;
    if (n == 0 || n > 4 || tok_utf8_valid((const unsigned char *)r, n, &bad) != n)
        return zt_error(ZT_ERR_FORMAT, "%s: %s Metaspace replacement must be one character", src,
                        what);
    memcpy(repl, r, n);
    *len = n;
    return ZT_OK;
}

static const struct {
    const char *name;
    tok_split_behavior b;
} behaviors[] = {{"Removed", TOK_SPLIT_REMOVED},
                 {"Isolated", TOK_SPLIT_ISOLATED},
                 {"MergedWithPrevious", TOK_SPLIT_MERGED_PREV},
                 {"MergedWithNext", TOK_SPLIT_MERGED_NEXT},
                 {"Contiguous", TOK_SPLIT_CONTIGUOUS}};

zt_status tok_parse_pre_tokenizer(zt_tokenizer_t *t, const cJSON *j, const char *src) {
    if (!j || cJSON_IsNull(j))
        return ZT_OK;
    const char *type = tok_json_str(j, "type");
    if (!type)
        return zt_error(ZT_ERR_FORMAT, "%s: pre_tokenizer has no type", src);
    tok_pre p = {0};
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
        if (!cJSON_IsArray(list))
            return zt_error(ZT_ERR_FORMAT, "%s: pre_tokenizer Sequence needs pretokenizers", src);
        for (const cJSON *n = list->child; n; n = n->next)
            ZT_TRY(tok_parse_pre_tokenizer(t, n, src));
        return ZT_OK;
    } else if (strcmp(type, "ByteLevel") == 0) {
        p.kind = TOK_PRE_BYTELEVEL;
        p.add_prefix_space = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space"));
        p.behavior = TOK_SPLIT_ISOLATED;
        if (!cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "use_regex")))
            ZT_TRY(tok_regex_compile(gpt2_pattern, false, &p.re, src, "pre_tokenizer ByteLevel"));
    } else if (strcmp(type, "Split") == 0) {
        p.kind = TOK_PRE_SPLIT;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const char *re = tok_json_str(pat, "Regex"), *str = tok_json_str(pat, "String");
        if ((!re && !str) || (str && !*str))
            return zt_error(ZT_ERR_FORMAT, "%s: pre_tokenizer Split needs pattern.Regex or a "
                            "non-empty pattern.String", src);
        const char *b = tok_json_str(j, "behavior");
        size_t k = 0, nb = sizeof behaviors / sizeof behaviors[0];
        while (k < nb && (!b || strcmp(b, behaviors[k].name) != 0))
            k++;
        if (k == nb)
            return zt_error(ZT_ERR_FORMAT, "%s: pre_tokenizer Split behavior \"%s\" is unknown",
                            src, b ? b : "(none)");
        p.behavior = behaviors[k].b;
        p.invert = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "invert"));
        ZT_TRY(tok_regex_compile(re ? re : str, !re, &p.re, src, "pre_tokenizer Split"));
    } else if (strcmp(type, "Metaspace") == 0) {
        p.kind = TOK_PRE_METASPACE;
        ZT_TRY(metaspace_char(j, p.repl, &p.repl_len, src, "pre_tokenizer"));
        ZT_TRY(parse_prepend_scheme(j, &p.prepend, src, "pre_tokenizer"));
        p.split = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "split"));
        p.behavior = TOK_SPLIT_MERGED_NEXT;
        if (p.split)
            ZT_TRY(tok_regex_compile(p.repl, true, &p.re, src, "pre_tokenizer Metaspace"));
    } else if (strcmp(type, "Digits") == 0) {
        p.kind = TOK_PRE_SPLIT;
        bool individual = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "individual_digits"));
        p.behavior = individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS;
        ZT_TRY(tok_regex_compile("\\p{N}", false, &p.re, src, "pre_tokenizer Digits"));
    } else {
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: pre_tokenizer type %s is not supported", src,
                        type);
    }
    return add_pre(t, p, src);
}

/* ---- pre-tokenizing --------------------------------------------------------------------------- */

static bool add_span(zt_tok_worker_t *w, size_t *n, size_t start, size_t end, bool match) {
    if (*n == w->cap_spans) {
        size_t cap = w->cap_spans ? 2 * w->cap_spans : 256;
        struct tok_span *v = realloc(w->spans, cap * sizeof *v);
        if (!v)
            return false;
        w->spans = v;
        w->cap_spans = cap;
    }
    w->spans[(*n)++] = (struct tok_span){start, end, match};
    return true;
}

/* The matches of re in s and the gaps between them, in order, covering s (HF's find_matches). */
static zt_status find_matches(zt_tok_worker_t *w, const pcre2_code *re, const char *s, size_t len,
                              size_t *n_spans) {
    size_t n = 0, prev = 0, at = 0;
    bool ok = true;
    while (at <= len && ok) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, w->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return zt_error(ZT_ERR_INVALID, "tokenizer: regex match failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t ms = ov[0], me = ov[1];
        if (prev != ms)
            ok &= add_span(w, &n, prev, ms, false);
        ok &= add_span(w, &n, ms, me, true);
        prev = me;
        if (me > at) {
            at = me;
        } else {
            /* An empty match: step over one character so the search moves on. */
            if (at == len)
                break;
            size_t clen;
            tok_utf8_decode((const unsigned char *)s + at, &clen);
            at += clen;
        }
    }
    if (ok && prev != len)
        ok &= add_span(w, &n, prev, len, false);
    if (!ok)
        return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory splitting");
    *n_spans = n;
    return ZT_OK;
}

/* Folds the spans by the split behaviour (HF's NormalizedString::split) and adds the resulting
 * non-empty pieces to out. */
static bool emit_split(zt_tok_worker_t *w, size_t n, tok_split_behavior b, const char *s,
                       bool first, tok_pieces *out) {
    struct tok_span *sp = w->spans;
    size_t m = 0;
    bool prev_match = false;
    switch (b) {
    case TOK_SPLIT_ISOLATED:
        m = n;
        break;
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!sp[i].match)
                sp[m++] = sp[i];
        break;
    case TOK_SPLIT_MERGED_PREV:
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            bool merge = b == TOK_SPLIT_MERGED_PREV ? sp[i].match && !prev_match
                                                    : sp[i].match == prev_match;
            prev_match = sp[i].match;
            if (merge && m > 0)
                sp[m - 1].end = sp[i].end;
            else
                sp[m++] = sp[i];
        }
        break;
    case TOK_SPLIT_MERGED_NEXT: {
        /* Folded from the right, then put back in order. */
        size_t top = n;
        for (size_t i = n; i-- > 0;) {
            bool merge = sp[i].match && !prev_match;
            prev_match = sp[i].match;
            if (merge && top < n)
                sp[top].start = sp[i].start;
            else
                sp[--top] = sp[i];
        }
        memmove(sp, sp + top, (n - top) * sizeof *sp);
        m = n - top;
        break;
    }
    }
    for (size_t i = 0; i < m; i++)
        if (sp[i].end > sp[i].start &&
            !tok_pieces_add(out, s + sp[i].start, sp[i].end - sp[i].start,
                            first && sp[i].start == 0))
            return false;
    return true;
}

static zt_status split_piece(zt_tok_worker_t *w, const tok_pre *p, const char *s, size_t len,
                             bool first, tok_pieces *out) {
    size_t n;
    ZT_TRY(find_matches(w, p->re, s, len, &n));
    if (p->invert)
        for (size_t i = 0; i < n; i++)
            w->spans[i].match = !w->spans[i].match;
    return emit_split(w, n, p->behavior, s, first, out)
               ? ZT_OK
               : zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory splitting");
}

/* ByteLevel: the optional prefix space, GPT-2's split, then every byte to its stand-in. */
static zt_status byte_level(zt_tok_worker_t *w, const tok_pre *p, const char *s, size_t len,
                            bool first, tok_pieces *out) {
    zt_strbuf *tmp = &w->scratch;
    if (p->add_prefix_space && s[0] != ' ') {
        tok_buf_restart(tmp);
        zt_strbuf_putc(tmp, ' ');
        zt_strbuf_append(tmp, s, len);
        if (tmp->oom)
            return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory");
        s = tmp->data;
        len = tmp->len;
    }
    size_t start = out->n;
    if (p->re)
        ZT_TRY(split_piece(w, p, s, len, first, out));
    else if (!tok_pieces_add(out, s, len, first))
        return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory");
    /* Map the new pieces in place of themselves: each byte grows to at most two, written into
     * the room reserved for them (then the NUL the buffer keeps after its bytes). */
    zt_strbuf *b = &out->buf;
    for (size_t i = start; i < out->n; i++) {
        tok_piece *pc = &out->v[i];
        size_t need = 0;
        for (size_t k = 0; k < pc->len; k++)
            need += tok_byte_to_char[(unsigned char)b->data[pc->off + k]].len;
        if (!zt_strbuf_reserve(b, need))
            return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory");
        size_t off = b->len;
        for (size_t k = 0; k < pc->len; k++) {
            const tok_bytechar *c = &tok_byte_to_char[(unsigned char)b->data[pc->off + k]];
            memcpy(b->data + b->len, c->s, c->len);
            b->len += c->len;
        }
        b->data[b->len] = '\0';
        pc->off = off;
        pc->len = b->len - off;
    }
    return ZT_OK;
}

static zt_status metaspace(zt_tok_worker_t *w, const tok_pre *p, const char *s, size_t len,
                           bool first, tok_pieces *out) {
    zt_strbuf *tmp = &w->scratch;
    tok_buf_restart(tmp);
    bool starts = len >= 1 && s[0] == ' ';
    bool starts_repl = len >= p->repl_len && memcmp(s, p->repl, p->repl_len) == 0;
    if (!starts && !starts_repl &&
        (p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST && first)))
        zt_strbuf_append(tmp, p->repl, p->repl_len);
    for (size_t i = 0; i < len; i++)
        if (s[i] == ' ')
            zt_strbuf_append(tmp, p->repl, p->repl_len);
        else
            zt_strbuf_putc(tmp, s[i]);
    if (tmp->oom)
        return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory");
    if (p->split)
        return split_piece(w, p, tmp->data, tmp->len, first, out);
    return tok_pieces_add(out, tmp->data, tmp->len, first) ? ZT_OK
                                                      : zt_error(ZT_ERR_NOMEM, "tokenizer: oom");
}

zt_status tok_pre_tokenize(zt_tok_worker_t *w, const char *s, size_t len, bool first,
                           tok_pieces **result) {
    const zt_tokenizer_t *t = w->t;
    tok_pieces *cur = &w->a, *next = &w->b;
    tok_pieces_clear(cur);
    if (len && !tok_pieces_add(cur, s, len, first))
        return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t k = 0; k < t->n_pres; k++) {
        const tok_pre *p = &t->pres[k];
        tok_pieces_clear(next);
        for (size_t i = 0; i < cur->n; i++) {
            const char *ps = tok_piece_text(cur, i);
            size_t pl = cur->v[i].len;
            bool pf = cur->v[i].first;
            switch (p->kind) {
            case TOK_PRE_BYTELEVEL: ZT_TRY(byte_level(w, p, ps, pl, pf, next)); break;
            case TOK_PRE_SPLIT: ZT_TRY(split_piece(w, p, ps, pl, pf, next)); break;
            case TOK_PRE_METASPACE: ZT_TRY(metaspace(w, p, ps, pl, pf, next)); break;
            }
        }
        tok_pieces *swap = cur;
        cur = next;
        next = swap;
    }
    *result = cur;
    return ZT_OK;
}
