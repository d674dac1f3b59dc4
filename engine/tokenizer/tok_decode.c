/* Decoders of a tokenizer.json: ids back to text. The tokens' texts pass through the decoder
 * chain (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip) as lists of strings, each
 * decoder mapping the list as Hugging Face's decode_chain does, and the result is their
 * concatenation. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static zt_status add_dec(zt_tokenizer_t *t, tok_dec d, const char *src) {
    tok_dec *v = realloc(t->decs, (t->n_decs + 1) * sizeof *v);
    if (!v) {
        free(d.a);
        free(d.b);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    }
    t->decs = v;
    v[t->n_decs++] = d;
    return ZT_OK;
}

static char *dup_n(const char *s, size_t *len) {
    *len = strlen(s);
    char *d = malloc(*len + 1);
    if (d)
        memcpy(d, s, *len + 1);
    return d;
}

static bool one_char(const char *s) {
    size_t n = strlen(s), bad;
    return n > 0 && n <= 4 && tok_utf8_valid((const unsigned char *)s, n, &bad) == n;
}

zt_status tok_parse_decoder(zt_tokenizer_t *t, const cJSON *j, const char *src) {
    if (!j || cJSON_IsNull(j))
        return ZT_OK;
    t->has_decoder = true;
    const char *type = tok_json_str(j, "type");
    if (!type)
        return zt_error(ZT_ERR_FORMAT, "%s: decoder has no type", src);
    tok_dec d = {0};
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "decoders");
        if (!cJSON_IsArray(list))
            return zt_error(ZT_ERR_FORMAT, "%s: decoder Sequence needs decoders", src);
        for (const cJSON *n = list->child; n; n = n->next)
            ZT_TRY(tok_parse_decoder(t, n, src));
        return ZT_OK;
    } else if (strcmp(type, "ByteLevel") == 0) {
        d.kind = TOK_DEC_BYTELEVEL;
    } else if (strcmp(type, "ByteFallback") == 0) {
        d.kind = TOK_DEC_BYTEFALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        d.kind = TOK_DEC_FUSE;
    } else if (strcmp(type, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const char *a = tok_json_str(pat, "String"), *b = tok_json_str(j, "content");
        if (!a && tok_json_str(pat, "Regex"))
            return zt_error(ZT_ERR_UNSUPPORTED,
                            "%s: decoder Replace with a Regex pattern is not supported", src);
        if (!a || !*a || !b)
            return zt_error(ZT_ERR_FORMAT,
                            "%s: decoder Replace needs a non-empty pattern.String and content", src);
        d.kind = TOK_DEC_REPLACE;
        d.a = dup_n(a, &d.alen);
        d.b = dup_n(b, &d.blen);
    } else if (strcmp(type, "Strip") == 0) {
        const char *c = tok_json_str(j, "content");
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(j, "start");
        const cJSON *stop = cJSON_GetObjectItemCaseSensitive(j, "stop");
        if (!c || !one_char(c) || !cJSON_IsNumber(start) || !cJSON_IsNumber(stop) ||
            start->valuedouble < 0 || stop->valuedouble < 0)
            return zt_error(ZT_ERR_FORMAT,
                            "%s: decoder Strip needs one content character, start and stop >= 0",
                            src);
        d.kind = TOK_DEC_STRIP;
        d.a = dup_n(c, &d.alen);
        d.start = start->valuedouble > 1e6 ? 1000000 : (int)start->valuedouble;
        d.stop = stop->valuedouble > 1e6 ? 1000000 : (int)stop->valuedouble;
    } else if (strcmp(type, "Metaspace") == 0) {
        const char *r = tok_json_str(j, "replacement");
        if (!r)
            r = "\xe2\x96\x81";
        if (!one_char(r))
            return zt_error(ZT_ERR_FORMAT, "%s: decoder Metaspace replacement must be one "
                            "character", src);
        const char *scheme = tok_json_str(j, "prepend_scheme");
        const cJSON *legacy = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
        d.kind = TOK_DEC_METASPACE;
        d.prepend = (scheme ? strcmp(scheme, "never") == 0 : cJSON_IsFalse(legacy))
                        ? TOK_PREPEND_NEVER
                        : TOK_PREPEND_ALWAYS;
        d.a = dup_n(r, &d.alen);
    } else {
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: decoder type %s is not supported", src, type);
    }
    if ((d.kind == TOK_DEC_REPLACE && (!d.a || !d.b)) ||
        ((d.kind == TOK_DEC_STRIP || d.kind == TOK_DEC_METASPACE) && !d.a)) {
        free(d.a);
        free(d.b);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    }
    return add_dec(t, d, src);
}

/* Appends s as UTF-8 with each maximal invalid subpart replaced by U+FFFD (from_utf8_lossy). */
static void add_lossy(zt_strbuf *out, const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t bad, v = tok_utf8_valid((const unsigned char *)s + i, n - i, &bad);
        if (v) {
            zt_strbuf_append(out, s + i, v);
            i += v;
        } else {
            zt_strbuf_append(out, "\xef\xbf\xbd", 3);
            i += bad;
        }
    }
}

static bool is_valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t bad, v = tok_utf8_valid((const unsigned char *)s + i, n - i, &bad);
        if (!v)
            return false;
        i += v;
    }
    return true;
}

#define PIECE(l, i) tok_piece_text((l), (i)), ((l)->v[i].len)

/* One decoder over the token list `in`, into `out` (cleared first); tmp is scratch. False when
 * memory ran out. */
static bool decode_step(const tok_dec *d, const tok_pieces *in, tok_pieces *out, zt_strbuf *tmp) {
    bool ok = true;
    tok_pieces_clear(out);
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL: {
        /* A token with a character outside the alphabet (an added token's) is kept as it is. */
        zt_strbuf_clear(tmp);
        zt_strbuf bytes = {0};
        for (size_t i = 0; i < in->n; i++) {
            const char *s = tok_piece_text(in, i);
            size_t len = in->v[i].len;
            if (!tok_all_bytes(s, len)) {
                zt_strbuf_append(tmp, s, len);
                continue;
            }
            for (size_t k = 0; k < len;) {
                size_t cl;
                zt_strbuf_putc(tmp, (char)tok_char_to_byte(
                                        tok_utf8_decode((const unsigned char *)s + k, &cl)));
                k += cl;
            }
        }
        add_lossy(&bytes, tmp->data, tmp->len);
        ok = !bytes.oom && tok_pieces_add(out, bytes.data, bytes.len, false);
        zt_strbuf_free(&bytes);
        break;
    }
    case TOK_DEC_BYTEFALLBACK: {
        zt_strbuf_clear(tmp);
        for (size_t i = 0; i <= in->n && ok; i++) {
            const char *s = i < in->n ? tok_piece_text(in, i) : NULL;
            size_t len = i < in->n ? in->v[i].len : 0;
            bool is_byte = s && len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>';
            unsigned v = 0;
            for (int k = 3; is_byte && k < 5; k++) {
                char c = s[k];
                int h = c >= '0' && c <= '9' ? c - '0'
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
                if (h < 0)
                    is_byte = false;
                v = v * 16 + (unsigned)h;
            }
            if (is_byte) {
                zt_strbuf_putc(tmp, (char)v);
                continue;
            }
            if (tmp->len) {
                if (is_valid_utf8(tmp->data, tmp->len))
                    ok &= tok_pieces_add(out, tmp->data, tmp->len, false);
                else
                    for (size_t k = 0; k < tmp->len; k++)
                        ok &= tok_pieces_add(out, "\xef\xbf\xbd", 3, false);
                zt_strbuf_clear(tmp);
            }
            if (s)
                ok &= tok_pieces_add(out, s, len, false);
        }
        break;
    }
    case TOK_DEC_FUSE:
        zt_strbuf_clear(tmp);
        for (size_t i = 0; i < in->n; i++)
            zt_strbuf_append(tmp, PIECE(in, i));
        ok &= tok_pieces_add(out, tmp->data, tmp->len, false);
        break;
    case TOK_DEC_REPLACE:
    case TOK_DEC_METASPACE:
        for (size_t i = 0; i < in->n && ok; i++) {
            const char *s = tok_piece_text(in, i);
            size_t len = in->v[i].len;
            zt_strbuf_clear(tmp);
            for (size_t k = 0; k < len;) {
                if (k + d->alen <= len && memcmp(s + k, d->a, d->alen) == 0) {
                    if (d->kind == TOK_DEC_REPLACE)
                        zt_strbuf_append(tmp, d->b, d->blen);
                    else if (!(i == 0 && d->prepend != TOK_PREPEND_NEVER))
                        zt_strbuf_putc(tmp, ' ');
                    k += d->alen;
                } else {
                    zt_strbuf_putc(tmp, s[k]);
                    k++;
                }
            }
            ok &= tok_pieces_add(out, tmp->data, tmp->len, false);
        }
        break;
    case TOK_DEC_STRIP:
        for (size_t i = 0; i < in->n && ok; i++) {
            const char *s = tok_piece_text(in, i);
            size_t len = in->v[i].len, a = 0, b = len;
            for (int k = 0; k < d->start && a + d->alen <= b && memcmp(s + a, d->a, d->alen) == 0;
                 k++)
                a += d->alen;
            for (int k = 0; k < d->stop && b >= a + d->alen &&
                            memcmp(s + b - d->alen, d->a, d->alen) == 0;
                 k++)
                b -= d->alen;
            ok &= tok_pieces_add(out, s + a, b - a, false);
        }
        break;
    }
    return ok && !tmp->oom;
}

zt_status zt_tokenizer_decode(const zt_tokenizer_t *t, const int32_t *ids, size_t n,
                              bool skip_special, char **text, size_t *len) {
    *text = NULL;
    tok_pieces a = {0}, b = {0};
    zt_strbuf tmp = {0};
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->id_text[id] || (skip_special && t->id_special[id]))
            continue;
        ok &= tok_pieces_add(&a, t->id_text[id], t->id_len[id], false);
    }
    tok_pieces *cur = &a, *next = &b;
    for (size_t k = 0; k < t->n_decs && ok; k++) {
        ok &= decode_step(&t->decs[k], cur, next, &tmp);
        tok_pieces *swap = cur;
        cur = next;
        next = swap;
    }
    /* Without a decoder HF joins the tokens with spaces. */
    zt_strbuf_clear(&tmp);
    for (size_t i = 0; i < cur->n && ok; i++) {
        if (i > 0 && !t->has_decoder)
            zt_strbuf_putc(&tmp, ' ');
        zt_strbuf_append(&tmp, PIECE(cur, i));
    }
    tok_pieces_free(&a);
    tok_pieces_free(&b);
    if (!ok)
        zt_strbuf_free(&tmp);
    size_t n_text = 0;
    if (!ok || !(*text = zt_strbuf_take(&tmp, &n_text)))
        return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory decoding %zu ids", n);
    if (len)
        *len = n_text;
    return ZT_OK;
}
