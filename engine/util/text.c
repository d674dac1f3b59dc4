/* UTF-8 validity, printable characters, escaping for a terminal, and the nearest word to a
 * typo (text.h). Written from RFC 3629's table of well-formed byte sequences, so that the
 * checker and the escaper agree on every byte. */
#include "ztrain/text.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The length of the well-formed UTF-8 sequence at s (n > 0 bytes available) and its code point;
 * 0 when the bytes there are not one. The second byte's range depends on the lead, which rules
 * out overlong forms, surrogates and code points past U+10FFFF (RFC 3629, section 4). */
static size_t decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (b >= 0xC2 && b <= 0xDF) {
        len = 2;
        v = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        v = b & 0x0F;
        if (b == 0xE0)
            lo = 0xA0;
        else if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        v = b & 0x07;
        if (b == 0xF0)
            lo = 0x90;
        else if (b == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

/* The characters ZT_TEXT_PRINTABLE refuses. */
static bool unprintable(uint32_t cp) {
    return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x061C || cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

bool zt_text_check(const char *s, size_t n, zt_text_rule rule, size_t *offset, char *why) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t len = decode(u + i, n - i, &cp);
        const char *fault = NULL;
        if (!len)
            fault = "invalid UTF-8";
        else if (cp == 0)
            fault = "a NUL byte";
        else if (rule == ZT_TEXT_PRINTABLE && unprintable(cp))
            fault = cp < 0x80 ? "the control character" : "the control or format character";
        if (fault) {
            *offset = i;
            if (!len)
                snprintf(why, ZT_TEXT_WHY_SIZE, "%s (byte 0x%02x)", fault, u[i]);
            else if (cp == 0)
                snprintf(why, ZT_TEXT_WHY_SIZE, "%s", fault);
            else
                snprintf(why, ZT_TEXT_WHY_SIZE, "%s U+%04X", fault, (unsigned)cp);
            return false;
        }
        i += len;
    }
    return true;
}

/* Appends len bytes to buf when all of them fit (with the terminating NUL); *need counts them
 * either way, so once one unit did not fit nothing after it is written. */
static void put(char *buf, size_t size, size_t *need, bool *full, const char *p, size_t len) {
    if (!*full && *need + len < size)
        memcpy(buf + *need, p, len);
    else
        *full = true;
    *need += len;
}

size_t zt_text_escape(const char *s, int flags, char *buf, size_t size) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), need = 0, written = 0;
    bool full = size == 0;
    bool json = flags & ZT_ESCAPE_JSON;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t len = decode(u + i, n - i, &cp);
        char esc[16];
        const char *out = (const char *)u + i;
        size_t out_len = len;
        bool keep = len && (!unprintable(cp) || cp == '\t' ||
                            (cp == '\n' && (json || (flags & ZT_ESCAPE_KEEP_NEWLINE))));
        if (!len) {
            /* A byte that does not start a well-formed sequence is shown alone. */
            out_len = (size_t)(json ? snprintf(esc, sizeof esc, "\\ufffd")
                                    : snprintf(esc, sizeof esc, "\\x%02x", u[i]));
            out = esc;
            len = 1;
        } else if (!keep) {
            out_len = (size_t)(json || cp >= 0x80
                                   ? snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp)
                                   : snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp));
            out = esc;
        }
        put(buf, size, &need, &full, out, out_len);
        if (!full)
            written = need;
        i += len;
    }
    if (size > 0)
        buf[written] = '\0';
    return need;
}

char *zt_text_escape_dup(const char *s, int flags) {
    size_t need = zt_text_escape(s, flags, NULL, 0);
    char *buf = malloc(need + 1);
    if (buf)
        zt_text_escape(s, flags, buf, need + 1);
    return buf;
}

/* The optimal-string-alignment distance of a (n bytes) and b (m bytes): insertions, deletions,
 * substitutions and swaps of two neighbours each count one, so "lsit" is one edit from "list"
 * (as git's suggestions count). Words longer than 63 bytes are never near. */
static size_t edit_distance(const char *a, size_t n, const char *b, size_t m) {
    enum { MAX = 64 };
    if (n >= MAX || m >= MAX)
        return (size_t)-1;
    size_t d[MAX][MAX];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

static bool word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

const char *zt_text_suggest(const char *word, const char *text, char *buf, size_t size) {
    size_t len = strcspn(word, "="), best = (size_t)-1;
    /* Near enough to be a typo: at most two edits, and fewer than a third of the word's
     * letters (a dash prefix not counted), so "--x" suggests nothing. */
    size_t letters = len - strspn(word, "-");
    size_t limit = letters / 3 < 2 ? letters / 3 : 2;
    buf[0] = '\0';
    for (const char *p = text; p && *p;) {
        while (*p && !word_char(*p))
            p++;
        size_t n = 0;
        while (word_char(p[n]))
            n++;
        /* Options are suggested for options, names for names. */
        if (n > 0 && (p[0] == '-') == (word[0] == '-') && n < size &&
            !(n == len && strncmp(p, word, n) == 0)) {
            size_t d = edit_distance(word, len, p, n);
            if (d <= limit && d < best) {
                best = d;
                memcpy(buf, p, n);
                buf[n] = '\0';
            }
        }
        p += n;
    }
    return buf[0] ? buf : NULL;
}
