/* Normalizers of a tokenizer.json: how a stretch of text between added tokens is rewritten before
 * the pre-tokenizers see it: Prepend and Replace by a string (the SentencePiece-style families),
 * the Unicode normalization forms NFC, NFD, NFKC and NFKD (Qwen2's NFC) through libunistring, and
 * Sequence. Others are refused by name. */
#include <stdlib.h>
#include <string.h>
#include <uninorm.h>

#include "tok_internal.h"

static char *dup_str(const char *s, size_t *len) {
    *len = strlen(s);
    char *d = malloc(*len + 1);
    if (d)
        memcpy(d, s, *len + 1);
    return d;
}

static zt_status add_norm(zt_tokenizer_t *t, tok_norm n, const char *src) {
    tok_norm *v = realloc(t->norms, (t->n_norms + 1) * sizeof *v);
    if (!v)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    t->norms = v;
    v[t->n_norms++] = n;
    return ZT_OK;
}

/* The string of a Replace's {"String": ...} pattern; a Regex pattern is not supported. */
static zt_status string_pattern(const cJSON *j, const char *src, const char *what,
                                const char **out) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
    const char *s = tok_json_str(pat, "String");
    if (!s && tok_json_str(pat, "Regex"))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: %s Replace with a Regex pattern is not supported",
                        src, what);
    if (!s || !*s)
        return zt_error(ZT_ERR_FORMAT, "%s: %s Replace needs a non-empty pattern.String", src,
                        what);
    *out = s;
    return ZT_OK;
}

zt_status tok_parse_normalizer(zt_tokenizer_t *t, const cJSON *j, const char *src) {
    if (!j || cJSON_IsNull(j))
        return ZT_OK;
    const char *type = tok_json_str(j, "type");
    if (!type)
        return zt_error(ZT_ERR_FORMAT, "%s: normalizer has no type", src);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
        if (!cJSON_IsArray(list))
            return zt_error(ZT_ERR_FORMAT, "%s: normalizer Sequence needs normalizers", src);
        for (const cJSON *n = list->child; n; n = n->next)
            ZT_TRY(tok_parse_normalizer(t, n, src));
        return ZT_OK;
    }
    tok_norm n = {0};
    if (strcmp(type, "Prepend") == 0) {
        const char *p = tok_json_str(j, "prepend");
        if (!p)
            return zt_error(ZT_ERR_FORMAT, "%s: normalizer Prepend needs prepend", src);
        n.kind = TOK_NORM_PREPEND;
        n.a = dup_str(p, &n.alen);
    } else if (strcmp(type, "Replace") == 0) {
        const char *pat = NULL, *content = tok_json_str(j, "content");
        ZT_TRY(string_pattern(j, src, "normalizer", &pat));
        if (!content)
            return zt_error(ZT_ERR_FORMAT, "%s: normalizer Replace needs content", src);
        n.kind = TOK_NORM_REPLACE;
        n.a = dup_str(pat, &n.alen);
        n.b = dup_str(content, &n.blen);
        if (!n.b) {
            free(n.a);
            n.a = NULL;
        }
    } else {
        static const char *const names[] = {"NFC", "NFD", "NFKC", "NFKD"};
        for (int i = 0; i < 4 && !n.form; i++)
            if (strcmp(type, names[i]) == 0)
                n.form = i == 0 ? UNINORM_NFC : i == 1 ? UNINORM_NFD : i == 2 ? UNINORM_NFKC
                                                                         : UNINORM_NFKD;
        if (!n.form)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: normalizer type %s is not supported", src,
                            type);
        n.kind = TOK_NORM_UNICODE;
        return add_norm(t, n, src);
    }
    if (!n.a)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    return add_norm(t, n, src);
}

static void replace_all(const char *s, size_t len, const tok_norm *n, zt_strbuf *out) {
    for (size_t i = 0; i < len;) {
        if (i + n->alen <= len && memcmp(s + i, n->a, n->alen) == 0) {
            zt_strbuf_append(out, n->b, n->blen);
            i += n->alen;
        } else {
            zt_strbuf_putc(out, s[i]);
            i++;
        }
    }
}

zt_status tok_normalize(const zt_tokenizer_t *t, const char *s, size_t len, zt_strbuf *out) {
    tok_buf_restart(out);
    zt_strbuf_append(out, s, len);
    zt_strbuf tmp = {0};
    bool ok = !out->oom;
    for (size_t k = 0; k < t->n_norms && ok; k++) {
        const tok_norm *n = &t->norms[k];
        zt_strbuf_clear(&tmp);
        if (n->kind == TOK_NORM_UNICODE) {
            if (out->len == 0)
                continue;
            size_t len = 0;
            uint8_t *u = u8_normalize((uninorm_t)n->form, (const uint8_t *)out->data, out->len,
                                      NULL, &len);
            if (!u) {
                ok = false;
                break;
            }
            zt_strbuf_append(&tmp, u, len);
            free(u);
        } else if (n->kind == TOK_NORM_PREPEND) {
            if (out->len == 0)
                continue;
            zt_strbuf_append(&tmp, n->a, n->alen);
            zt_strbuf_append(&tmp, out->data, out->len);
        } else {
            replace_all(out->data, out->len, n, &tmp);
        }
        ok = !tmp.oom;
        zt_strbuf swap = *out;
        *out = tmp;
        tmp = swap;
    }
    zt_strbuf_free(&tmp);
    return ok ? ZT_OK : zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory normalizing");
}
