/* Token offsets: which bytes of a text each token of its encoding covers, as the offsets of HF's
 * encoding give them (prepare's {% generation %} masks read them as char_to_token does). Two
 * families are exact, each checked on every call: byte-level vocabularies, whose tokens' bytes
 * are the text's, and SentencePiece-style ones (Prepend and Replace normalizers, a Metaspace
 * pre-tokenizer, byte fallback), whose tokens' pieces are the normalized text, each normalized
 * character aligned to the original character it came from as tokenizers' NormalizedString
 * aligns it. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <uninorm.h>

#include "tok_internal.h"

/* ---- byte-level vocabularies ----------------------------------------------------------------- */

/* Whether the vocabulary is written in the byte-level alphabet: a ByteLevel pre-tokenizer maps
 * every piece into it before the model sees it. */
static bool byte_level_vocab(const zt_tokenizer_t *t) {
    for (size_t k = 0; k < t->n_pres; k++)
        if (t->pres[k].kind == TOK_PRE_BYTELEVEL)
            return true;
    return false;
}

/* Matches the bytes of token s[0..len) at text[*at..len): the alphabet reversed, or, for a token
 * with a character outside it (an added token's content), its text as it is, as the ByteLevel
 * decoder reads it. Advances *at past them; false when they differ or are none. */
static bool match_token_bytes(const char *s, size_t len, const char *text, size_t text_len,
                              size_t *at) {
    size_t p = *at;
    if (!tok_all_bytes(s, len)) {
        if (len > text_len - p || memcmp(s, text + p, len) != 0)
            return false;
        p += len;
    } else {
        for (size_t k = 0; k < len; p++) {
            size_t cl;
            int b = tok_char_to_byte(tok_utf8_decode((const unsigned char *)s + k, &cl));
            if (p >= text_len || (unsigned char)text[p] != (unsigned)b)
                return false;
            k += cl;
        }
    }
    if (p == *at)
        return false;
    *at = p;
    return true;
}

static bool byte_level_offsets(const zt_tokenizer_t *t, const int32_t *ids, size_t n,
                               const char *text, size_t len, size_t *ends) {
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->id_text[id] ||
            !match_token_bytes(t->id_text[id], t->id_len[id], text, len, &at))
            return false;
        ends[i] = at;
    }
    return at == len;
}

/* ---- SentencePiece-style vocabularies -------------------------------------------------------- */

/* One character of the normalized text and the original bytes [start, end) it is aligned to. */
typedef struct {
    char b[4];
    uint8_t len;
    size_t start, end;
} norm_char;

typedef struct {
    norm_char *v;
    size_t n, cap;
} norm_chars;

/* The normalized text of a whole input: its bytes, and for each byte the original bytes of the
 * character it belongs to. */
typedef struct {
    zt_strbuf bytes;
    size_t *start, *end;
    size_t cap;
} aligned_text;

/* The length of s when it is exactly one UTF-8 character, else 0. */
static size_t one_char(const char *s, size_t len) {
    size_t bad;
    return len > 0 && tok_utf8_valid((const unsigned char *)s, len, &bad) == len ? len : 0;
}

/* Whether every normalizer and pre-tokenizer keeps each character in place or inserts one
 * aligned to the next, the only rewrites whose alignment is followed here: Prepend, Replace of
 * one character by one, a Unicode form where it leaves the text as it is (normalize_stretch
 * checks), a Metaspace first (its prepend and spaces), Splits that remove nothing (Digits among
 * them). A Metaspace after a Split would prepend to each piece. */
static bool aligned_components(const zt_tokenizer_t *t) {
    for (size_t k = 0; k < t->n_norms; k++) {
        const tok_norm *m = &t->norms[k];
        if (m->kind == TOK_NORM_REPLACE && (!one_char(m->a, m->alen) || !one_char(m->b, m->blen)))
            return false;
    }
    for (size_t k = 0; k < t->n_pres; k++) {
        const tok_pre *p = &t->pres[k];
        if (p->kind == TOK_PRE_BYTELEVEL || (p->kind == TOK_PRE_METASPACE && k > 0) ||
            (p->kind == TOK_PRE_SPLIT && p->behavior == TOK_SPLIT_REMOVED))
            return false;
    }
    return true;
}

static bool chars_add(norm_chars *c, size_t at, const char *s, size_t len, size_t start,
                      size_t end) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        norm_char *v = realloc(c->v, cap * sizeof *v);
        if (!v)
            return false;
        c->v = v;
        c->cap = cap;
    }
    memmove(c->v + at + 1, c->v + at, (c->n - at) * sizeof *c->v);
    norm_char *ch = &c->v[at];
    memcpy(ch->b, s, len);
    ch->len = (uint8_t)len;
    ch->start = start;
    ch->end = end;
    c->n++;
    return true;
}

static bool is_char(const norm_char *c, const char *s, size_t len) {
    return c->len == len && memcmp(c->b, s, len) == 0;
}

/* Prepends the characters of s, each aligned to the first character's original bytes, as
 * NormalizedString::prepend aligns them ("▁Paris" from "Paris": the "▁" covers the "P"). */
static bool prepend(norm_chars *c, const char *s, size_t len) {
    if (c->n == 0)
        return true;
    size_t start = c->v[0].start, end = c->v[0].end;
    for (size_t k = 0, at = 0; k < len; at++) {
        size_t cl;
        tok_utf8_decode((const unsigned char *)s + k, &cl);
        if (!chars_add(c, at, s + k, cl, start, end))
            return false;
        k += cl;
    }
    return true;
}

/* Replaces each character a by b (one character each), which keeps a's alignment. */
static void replace(norm_chars *c, const char *a, size_t alen, const char *b, size_t blen) {
    for (size_t i = 0; i < c->n; i++)
        if (is_char(&c->v[i], a, alen)) {
            memcpy(c->v[i].b, b, blen);
            c->v[i].len = (uint8_t)blen;
        }
}

/* Whether Unicode normalization form `form` leaves the characters of c as they are (NFKC
 * rewrites "ﬁ" as "fi", NFC merges "e" and a combining accent: alignments this file does not
 * follow). */
static bool unicode_keeps(const norm_chars *c, const void *form) {
    zt_strbuf s = {0};
    for (size_t i = 0; i < c->n; i++)
        zt_strbuf_append(&s, c->v[i].b, c->v[i].len);
    size_t len = 0;
    uint8_t *u = s.oom || s.len == 0
                     ? NULL : u8_normalize((uninorm_t)form, (const uint8_t *)s.data, s.len, NULL,
                                           &len);
    bool same = s.len == 0 || (u && len == s.len && memcmp(u, s.data, len) == 0);
    free(u);
    zt_strbuf_free(&s);
    return same;
}

/* Normalizes and pre-tokenizes the stretch text[from..to) between raw added tokens, as
 * encode_segment and the Metaspace pre-tokenizer do, into c (emptied first). A Metaspace's
 * prepend_scheme "first" prepends only to the stretch at the text's start. False when memory
 * runs out or a Unicode form would change the stretch. */
static bool normalize_stretch(const zt_tokenizer_t *t, const char *text, size_t from, size_t to,
                              norm_chars *c) {
    c->n = 0;
    for (size_t k = from; k < to;) {
        size_t cl;
        tok_utf8_decode((const unsigned char *)text + k, &cl);
        if (!chars_add(c, c->n, text + k, cl, k, k + cl))
            return false;
        k += cl;
    }
    for (size_t k = 0; k < t->n_norms; k++) {
        const tok_norm *m = &t->norms[k];
        if (m->kind == TOK_NORM_PREPEND && !prepend(c, m->a, m->alen))
            return false;
        if (m->kind == TOK_NORM_REPLACE)
            replace(c, m->a, m->alen, m->b, m->blen);
        if (m->kind == TOK_NORM_UNICODE && !unicode_keeps(c, m->form))
            return false;
    }
    for (size_t k = 0; k < t->n_pres; k++) {
        const tok_pre *p = &t->pres[k];
        if (p->kind != TOK_PRE_METASPACE)
            continue;
        replace(c, " ", 1, p->repl, p->repl_len);
        bool wants = p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST &&
                                                          from == 0);
        if (wants && c->n > 0 && !is_char(&c->v[0], p->repl, p->repl_len) &&
            !prepend(c, p->repl, p->repl_len))
            return false;
    }
    return true;
}

/* Appends len bytes of s to a, each aligned to the original bytes [start, end). */
static bool aligned_add(aligned_text *a, const char *s, size_t len, size_t start, size_t end) {
    size_t need = a->bytes.len + len;
    if (need > a->cap) {
        size_t cap = 2 * need + 64;
        size_t *st = realloc(a->start, cap * sizeof *st);
        if (st)
            a->start = st;
        size_t *en = st ? realloc(a->end, cap * sizeof *en) : NULL;
        if (!en)
            return false;
        a->end = en;
        a->cap = cap;
    }
    for (size_t k = 0; k < len; k++) {
        a->start[a->bytes.len + k] = start;
        a->end[a->bytes.len + k] = end;
    }
    zt_strbuf_append(&a->bytes, s, len);
    return !a->bytes.oom;
}

/* The whole text normalized and aligned: stretches between raw added tokens (found as
 * zt_tok_encode finds them), and each added token's content aligned to itself. False when
 * memory runs out or the text holds a token the tokenizer lacks. */
static bool align_text(const zt_tokenizer_t *t, const char *text, size_t len, aligned_text *a) {
    norm_chars c = {0};
    bool ok = true;
    size_t start = 0;
    for (size_t i = 0; ok && i <= len;) {
        const tok_added *m = i < len && t->any_raw_added
                                 ? tok_added_match(t, text + i, len - i, false) : NULL;
        if (i < len && !m) {
            i++;
            continue;
        }
        ok = normalize_stretch(t, text, start, i, &c);
        for (size_t k = 0; ok && k < c.n; k++)
            ok = aligned_add(a, c.v[k].b, c.v[k].len, c.v[k].start, c.v[k].end);
        if (!m)
            break;
        ok = ok && m->id >= 0 && aligned_add(a, m->m, m->mlen, i, i + m->mlen);
        i += m->mlen;
        start = i;
    }
    free(c.v);
    return ok;
}

/* The normalized bytes of token id: a byte-fallback token "<0xNN>" stands for its byte, any
 * other token for its text. */
static const char *token_bytes(const zt_tokenizer_t *t, int32_t id, size_t *len, char *byte) {
    const char *s = t->id_text[id];
    *len = t->id_len[id];
    if (t->byte_fallback && *len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' &&
        isxdigit((unsigned char)s[3]) && isxdigit((unsigned char)s[4])) {
        char hex[3] = {s[3], s[4], 0};
        long v = strtol(hex, NULL, 16);
        if (t->byte_ids[v] == id) {
            *byte = (char)v;
            *len = 1;
            return byte;
        }
    }
    return s;
}

static bool valid_utf8(const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        size_t bad, v = tok_utf8_valid((const unsigned char *)s + i, len - i, &bad);
        if (!v)
            return false;
        i += v;
    }
    return true;
}

/* Each token's bytes must be the next ones of the aligned normalized text; it covers the
 * original bytes from its first byte's character through its last byte's (a byte-fallback token
 * of a character, or a prepended "▁", the whole character: tokenizers gives every token that
 * holds part of a character the whole of it). ends[i] is where token i's coverage ends; the
 * coverage must start at or before the previous token's end, so that the first token whose end
 * lies past a byte is the first that holds it, as char_to_token finds it. */
static bool aligned_offsets(const zt_tokenizer_t *t, const int32_t *ids, size_t n,
                            const char *text, size_t len, size_t *ends) {
    if (!aligned_components(t) || !valid_utf8(text, len))
        return false;
    aligned_text a = {0};
    bool ok = align_text(t, text, len, &a);
    size_t at = 0, prev_end = 0;
    for (size_t i = 0; ok && i < n; i++) {
        int32_t id = ids[i];
        char byte;
        size_t tl = 0;
        const char *s = id >= 0 && id < t->n_ids && t->id_text[id]
                            ? token_bytes(t, id, &tl, &byte) : NULL;
        ok = s && tl > 0 && tl <= a.bytes.len - at && memcmp(s, a.bytes.data + at, tl) == 0 &&
             a.start[at] <= prev_end && a.end[at + tl - 1] >= prev_end;
        if (ok) {
            prev_end = ends[i] = a.end[at + tl - 1];
            at += tl;
        }
    }
    ok = ok && at == a.bytes.len && prev_end == len;
    zt_strbuf_free(&a.bytes);
    free(a.start);
    free(a.end);
    return ok;
}

bool zt_tokenizer_offsets(const zt_tokenizer_t *t, const int32_t *ids, size_t n,
                          const char *text, size_t len, size_t *ends) {
    if (byte_level_vocab(t))
        return byte_level_offsets(t, ids, n, text, len, ends);
    return aligned_offsets(t, ids, n, text, len, ends);
}
