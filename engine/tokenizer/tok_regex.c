/* Hugging Face's regexes in PCRE2: tokenizers compiles a pattern with Oniguruma (Ruby syntax,
 * UTF-8), whose escapes, anchors and options do not all mean what PCRE2's do. Each construct
 * whose meaning differs is rewritten to a PCRE2 equivalent measured against Oniguruma over every
 * code point, or refused by name; the rest passes through unchanged. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "ztrain/strbuf.h"

/* Oniguruma's word character under Unicode, inside a class: Alphabetic, marks, decimal digits and
 * connector punctuation (so ① is not one, though PCRE2's \w with UCP takes every \p{N}). */
#define ONIG_CLASS_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"
/* A \w outside a class also takes the Latin-1 superscripts and fractions, which Oniguruma's
 * ISO-8859-1 table (consulted below U+0100) counts as word. */
#define ONIG_WORD ONIG_CLASS_WORD "\\x{b2}\\x{b3}\\x{b9}\\x{bc}-\\x{be}"
/* Oniguruma's \b and \B: a change (or none) between a word character and anything else, where
 * the start and end of the text count as not word. */
#define ONIG_BOUNDARY                                                                             \
    "(?:(?<=[" ONIG_WORD "])(?![" ONIG_WORD "])|(?<![" ONIG_WORD "])(?=[" ONIG_WORD "]))"
#define ONIG_NOT_BOUNDARY                                                                         \
    "(?:(?<=[" ONIG_WORD "])(?=[" ONIG_WORD "])|(?<![" ONIG_WORD "])(?![" ONIG_WORD "]))"

typedef struct {
    zt_strbuf out;
    const char *pattern, *src, *what;
    bool caseless; /* the pattern turns on (?i) somewhere */
    zt_status status;
} translation;

/* Appends to the translation; the first failure, a refusal or out of memory, is the one kept. */
static void put_n(translation *t, const char *s, size_t n) {
    if (t->status != ZT_OK)
        return;
    zt_strbuf_append(&t->out, s, n);
    if (t->out.oom)
        t->status = zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->src);
}

static void put(translation *t, const char *s) {
    put_n(t, s, strlen(s));
}

static void refuse(translation *t, const char *construct, const char *why) {
    if (t->status == ZT_OK)
        t->status = zt_error(ZT_ERR_UNSUPPORTED,
                             "%s: %s pattern /%s/: %s is not supported (%s)", t->src, t->what,
                             t->pattern, construct, why);
}

/* True when name is a script's name to PCRE2 (so \p{sc:name} compiles). */
static bool is_script(const char *name, size_t len) {
    char pat[80];
    if (len == 0 || len > 60)
        return false;
    snprintf(pat, sizeof pat, "\\p{sc:%.*s}", (int)len, name);
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &err, &off, NULL);
    pcre2_code_free(re);
    return re != NULL;
}

/* \p{NAME} or \P{NAME} (pat[i] is the p): general categories and binary properties mean the same
 * in both, but a script (\p{Han}) is Oniguruma's Script where PCRE2 reads Script_Extensions, so
 * it becomes \p{sc:Han} (without it, CJK punctuation such as U+3001 would be Han). Copied whole,
 * so the name is never read as pattern letters. Returns the extra bytes used. */
static size_t property(translation *t, const char *pat, size_t i) {
    size_t k = i + 2;
    bool negated = pat[k] == '^';
    k += negated;
    size_t name = k;
    while (pat[k] && pat[k] != '}')
        k++;
    char head[8];
    snprintf(head, sizeof head, "\\%c{%s%s", pat[i], negated ? "^" : "",
             is_script(pat + name, k - name) ? "sc:" : "");
    put(t, head);
    put_n(t, pat + name, k - name);
    if (pat[k] == '}')
        put(t, "}");
    else
        k--;
    return k - i;
}

/* One escape \e (at pat[i], the backslash at pat[i-1]); returns how many extra bytes it used. */
static size_t escape(translation *t, const char *pat, size_t i, bool in_class) {
    char e = pat[i], tmp[32];
    switch (e) {
    case 'w': put(t, in_class ? ONIG_CLASS_WORD : "[" ONIG_WORD "]"); break;
    case 'W':
        if (in_class)
            refuse(t, "\\W inside a character class", "Oniguruma's non-word set has no PCRE2 "
                                                       "class item");
        put(t, "[^" ONIG_WORD "]");
        break;
    /* Oniguruma's \s is Unicode's White_Space; PCRE2's also takes U+180E. */
    case 's': put(t, "\\p{White_Space}"); break;
    case 'S': put(t, "\\P{White_Space}"); break;
    case 'd': put(t, "\\p{Nd}"); break;
    case 'D': put(t, "\\P{Nd}"); break;
    /* Oniguruma's \h is a hexadecimal digit, PCRE2's horizontal space. */
    case 'h': put(t, in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]"); break;
    case 'H':
        if (in_class)
            refuse(t, "\\H inside a character class", "no PCRE2 class item is a non-hex-digit");
        put(t, "[^0-9A-Fa-f]");
        break;
    case 'b': put(t, in_class ? "\\b" : ONIG_BOUNDARY); break;
    case 'B':
        if (in_class)
            refuse(t, "\\B inside a character class", "Oniguruma has no such class item");
        put(t, ONIG_NOT_BOUNDARY);
        break;
    /* Oniguruma's \v is the vertical tab, PCRE2's any vertical space. */
    case 'v': put(t, "\\x{0b}"); break;
    case 'u': {
        /* \uHHHH, which PCRE2 spells \x{HHHH}. */
        size_t k = 1;
        while (k <= 4 && pat[i + k] && strchr("0123456789abcdefABCDEF", pat[i + k]))
            k++;
        if (k != 5) {
            refuse(t, "\\u without four hex digits", "Oniguruma reads \\uHHHH");
            return 0;
        }
        snprintf(tmp, sizeof tmp, "\\x{%.4s}", pat + i + 1);
        put(t, tmp);
        return 4;
    }
    case 'Q': case 'E': case 'C': case 'V': case 'O': case 'X': case 'y': case 'Y':
        snprintf(tmp, sizeof tmp, "\\%c", e);
        refuse(t, tmp, "Oniguruma and PCRE2 read it differently, or PCRE2 not at all");
        break;
    case 'p': case 'P':
        if (pat[i + 1] == '{')
            return property(t, pat, i);
        /* fall through */
    case 'x': {
        /* Copied whole, so hex digits are never read as pattern letters. */
        size_t k = 1;
        if (pat[i + 1] == '{') {
            while (pat[i + k] && pat[i + k] != '}')
                k++;
            k += pat[i + k] == '}';
        } else if (e == 'x') {
            while (k <= 2 && pat[i + k] && strchr("0123456789abcdefABCDEF", pat[i + k]))
                k++;
        }
        put(t, "\\");
        put_n(t, pat + i, k);
        return k - 1;
    }
    default:
        snprintf(tmp, sizeof tmp, "\\%c", e);
        put(t, tmp);
    }
    return 0;
}

/* An option group (?imx-imx) or (?imx-imx:...) at pat[i] == '('; returns the bytes it used, or
 * 0 when the group is another kind ((?:, (?=, (?<name>, ...). Ruby's (?m) is PCRE2's (?s). */
static size_t options(translation *t, const char *pat, size_t i) {
    size_t k = i + 2;
    while (pat[k] && strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-", pat[k]))
        k++;
    if (k == i + 2 || (pat[k] != ')' && pat[k] != ':'))
        return 0;
    put(t, "(?");
    for (size_t j = i + 2; j < k; j++) {
        char o = pat[j];
        if (o == 'm') {
            put(t, "s");
        } else if (o == 'i' || o == '-') {
            char s[2] = {o, 0};
            put(t, s);
        } else {
            char what[16];
            snprintf(what, sizeof what, "option (?%c)", o);
            refuse(t, what, "only i and m (dot matches newline) are translated");
        }
    }
    return k - i;
}

/* Under (?i) Oniguruma applies Unicode's full case folding, so "ss" also matches ß and "fi" the
 * ligature ﬁ; PCRE2 folds one character to one. Literal pairs that some character folds to
 * (the only ASCII ones: ss, st, ff, fi, fl) and non-ASCII literals are refused under (?i). */
static bool multi_fold_literal(const char *p) {
    static const char *const pairs[] = {"ss", "st", "ff", "fi", "fl"};
    if ((unsigned char)p[0] >= 0x80)
        return true;
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++)
        if ((p[0] | 0x20) == pairs[k][0] && p[1] && (p[1] | 0x20) == pairs[k][1])
            return true;
    return false;
}

static bool turns_on_caseless(const char *pat) {
    for (const char *p = strstr(pat, "(?"); p; p = strstr(p + 1, "(?")) {
        size_t k = 2;
        bool i = false;
        while (p[k] && strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-", p[k]))
            i |= p[k++] == 'i';
        if (i && (p[k] == ')' || p[k] == ':'))
            return true;
    }
    return false;
}

/* Oniguruma pattern -> PCRE2 pattern in *out (heap, the caller frees). */
static zt_status onig_to_pcre2(const char *pat, const char *src, const char *what, char **out) {
    translation t = {.pattern = pat, .src = src, .what = what, .status = ZT_OK,
                     .caseless = turns_on_caseless(pat)};
    size_t n = strlen(pat);
    bool in_class = false;
    for (size_t i = 0; i < n && t.status == ZT_OK; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            i++;
            i += escape(&t, pat, i, in_class);
            continue;
        }
        if (in_class && c == '[') {
            /* Oniguruma nests classes and reads [:alpha:] with its own Unicode tables. */
            refuse(&t, pat[i + 1] == ':' ? "a POSIX bracket class ([:name:])"
                                         : "a class inside a class",
                   "Oniguruma's meaning has no exact PCRE2 spelling");
            break;
        }
        if (in_class && c == '&' && pat[i + 1] == '&') {
            refuse(&t, "class intersection (&&)", "PCRE2 reads it as two '&'");
            break;
        }
        if (!in_class && c == '(' && pat[i + 1] == '?') {
            size_t used = options(&t, pat, i);
            if (used) {
                i += used - 1;
                continue;
            }
        }
        if (t.caseless && multi_fold_literal(pat + i)) {
            refuse(&t, (unsigned char)c >= 0x80 ? "a non-ASCII literal under (?i)"
                                                : "the letters ss, st, ff, fi or fl under (?i)",
                   "Oniguruma's full case folding matches them to ß or a ligature too");
            break;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            char s[2] = {c, 0};
            put(&t, s);
            /* A ']' right after '[' or '[^' is a literal member, not the end of the class. */
            if (i + 1 < n && pat[i + 1] == '^')
                put(&t, "^"), i++;
            if (i + 1 < n && pat[i + 1] == ']')
                put(&t, "\\]"), i++;
            continue;
        }
        if (c == ']' && in_class)
            in_class = false;
        put_n(&t, &c, 1);
    }
    if (t.status != ZT_OK) {
        zt_strbuf_free(&t.out);
        return t.status;
    }
    *out = zt_strbuf_take(&t.out, NULL);
    return *out ? ZT_OK : zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
}

zt_status tok_regex_compile(const char *pattern, bool literal, pcre2_code **out, const char *src,
                            const char *what) {
    char *pat = NULL;
    if (!literal)
        ZT_TRY(onig_to_pcre2(pattern, src, what, &pat));
    else if (!(pat = strdup(pattern)))
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    /* PCRE2 allows no UCP with LITERAL (a literal has no classes for UCP to widen). Oniguruma's
     * ^ and $ match at every line, which is PCRE2's MULTILINE; lines end at \n only. */
    uint32_t opts = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        free(pat);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &err, &off, cc);
    pcre2_compile_context_free(cc);
    free(pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: %s pattern /%s/ does not compile in PCRE2%s: %s",
                        src, what, pattern,
                        literal ? "" : " (translated from Oniguruma's syntax)", (char *)msg);
    }
    /* JIT is only speed: without it (a platform PCRE2 has no JIT for) matching is the same. */
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return ZT_OK;
}
