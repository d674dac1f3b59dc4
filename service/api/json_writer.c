/* A JSON writer over a growable buffer (json_writer.h): comma tracking, and string escaping
 * that repairs invalid UTF-8. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_writer.h"

void zt_jbuf_init(zt_jbuf *b) {
    zt_strbuf_init(&b->buf);
    b->comma = false;
}

void zt_jbuf_free(zt_jbuf *b) {
    zt_strbuf_free(&b->buf);
    b->comma = false;
}

bool zt_jbuf_reserve(zt_jbuf *b, size_t n) {
    return zt_strbuf_reserve(&b->buf, n);
}

char *zt_jbuf_take(zt_jbuf *b, size_t *len) {
    b->comma = false;
    return zt_strbuf_take(&b->buf, len);
}

void zt_jbuf_clear(zt_jbuf *b) {
    zt_strbuf_clear(&b->buf);
    b->comma = false;
}

/* Appends without touching the comma state: the building block of everything else. */
static void put(zt_jbuf *b, const char *s, size_t n) {
    zt_strbuf_append(&b->buf, s, n);
}

static void putc1(zt_jbuf *b, char c) {
    zt_strbuf_putc(&b->buf, c);
}

void zt_jbuf_text(zt_jbuf *b, const char *s, size_t n) {
    put(b, s, n);
    b->comma = false;
}

void zt_jbuf_puts(zt_jbuf *b, const char *s) {
    zt_jbuf_text(b, s, strlen(s));
}

void zt_jbuf_printf(zt_jbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    zt_strbuf_vprintf(&b->buf, fmt, ap);
    va_end(ap);
    b->comma = false;
}

/* Starts a value or a member: the separator from the previous one, if any. */
static void sep(zt_jbuf *b) {
    if (b->comma)
        putc1(b, ',');
}

void zt_json_open(zt_jbuf *b, char c) {
    sep(b);
    putc1(b, c);
    b->comma = false;
}

void zt_json_close(zt_jbuf *b, char c) {
    putc1(b, c);
    b->comma = true;
}

/* The length of the valid UTF-8 sequence at s (at most n bytes), or 0 when it is not one:
 * no overlong forms, no surrogates, nothing above U+10FFFF (RFC 3629). */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    unsigned cp = c & (0x3F >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

static void escape_into(zt_jbuf *b, const char *str, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        /* Copy the longest run that needs no escaping in one go. */
        size_t run = i;
        while (run < n && s[run] >= 0x20 && s[run] < 0x80 && s[run] != '"' && s[run] != '\\')
            run++;
        put(b, str + i, run - i);
        i = run;
        if (i >= n)
            break;
        unsigned char c = s[i];
        if (c >= 0x80) {
            size_t len = utf8_len(s + i, n - i);
            if (len) {
                put(b, str + i, len);
                i += len;
            } else {
                put(b, "\\ufffd", 6);
                i++;
            }
            continue;
        }
        char esc[6] = {'\\', 0};
        size_t elen = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        default:
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            elen = 6;
        }
        put(b, esc, elen);
        i++;
    }
}

void zt_json_key(zt_jbuf *b, const char *key) {
    sep(b);
    putc1(b, '"');
    escape_into(b, key, strlen(key));
    put(b, "\":", 2);
    b->comma = false;
}

void zt_json_strn(zt_jbuf *b, const char *s, size_t n) {
    sep(b);
    putc1(b, '"');
    escape_into(b, s, n);
    putc1(b, '"');
    b->comma = true;
}

void zt_json_str(zt_jbuf *b, const char *s) {
    if (!s)
        zt_json_null(b);
    else
        zt_json_strn(b, s, strlen(s));
}

/* Series hold hundreds of steps per response: a hand-written conversion instead of snprintf. */
static size_t format_int(char *out, int64_t v) {
    char tmp[24];
    size_t n = 0;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    size_t k = 0;
    if (v < 0)
        out[k++] = '-';
    while (n)
        out[k++] = tmp[--n];
    return k;
}

void zt_json_int(zt_jbuf *b, int64_t v) {
    sep(b);
    char tmp[24];
    put(b, tmp, format_int(tmp, v));
    b->comma = true;
}

static const double p10[18] = {1e0, 1e1, 1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,
                               1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17};

/* Whether a == m / 10^k for the integer m nearest a * 10^k (which must stay below 2^53). The
 * test is exact: m and 10^k are exact doubles and IEEE division rounds their quotient
 * correctly, which is the double that parsing the decimal text m·10^-k gives. */
static bool exact_at(double a, int k, double *m) {
    double scaled = a * p10[k];
    if (scaled >= 9007199254740992.0)
        return false;
    *m = nearbyint(scaled);
    return *m / p10[k] == a;
}

/* The fewest decimals k (at most 17) with a == m / 10^k as above, written as fixed-point text;
 * 0 when there is none (printf then decides). Metric values arrive as 9-significant-digit text
 * from the worker, so k is usually found by the first guess, 9 digits, with trailing zeros
 * stripped: any shorter exact form would have passed at that k too. This replaces printf's %g
 * and a strtod check per value, which were most of the cost of a series response. */
static size_t format_fixed(char *out, double v) {
    double a = fabs(v), m = 0;
    if (!(a >= 1e-7 && a < 1e15))
        return 0;
    int digits_before = 0;   /* floor(log10(a)) + 1, approximately: only a first guess */
    while (digits_before < 16 && a >= p10[digits_before])
        digits_before++;
    for (double x = a; digits_before > -7 && x < 0.1; x *= 10)
        digits_before--;
    int k = 9 - digits_before;
    if (k < 0)
        k = 0;
    if (k > 17)
        k = 17;
    int64_t im;
    if (exact_at(a, k, &m)) {
        im = (int64_t)m;
        while (k > 0 && im % 10 == 0) {
            im /= 10;
            k--;
        }
    } else {
        do
            k++;
        while (k < 18 && !exact_at(a, k, &m));
        if (k == 18)
            return 0;
        im = (int64_t)m;
    }
    char digits[24];
    size_t nd = format_int(digits, im), n = 0;
    if (v < 0)
        out[n++] = '-';
    if (nd <= (size_t)k) {
        out[n++] = '0';
        out[n++] = '.';
        for (size_t z = nd; z < (size_t)k; z++)
            out[n++] = '0';
        memcpy(out + n, digits, nd);
        return n + nd;
    }
    memcpy(out + n, digits, nd - (size_t)k);
    n += nd - (size_t)k;
    if (k > 0) {
        out[n++] = '.';
        memcpy(out + n, digits + nd - (size_t)k, (size_t)k);
        n += (size_t)k;
    }
    return n;
}

void zt_json_num(zt_jbuf *b, double v) {
    if (!isfinite(v)) {
        zt_json_null(b);
        return;
    }
    sep(b);
    char tmp[40];
    size_t n;
    if (v == 0) {
        n = signbit(v) ? 2 : 1;
        memcpy(tmp, signbit(v) ? "-0" : "0", n);
    } else if ((n = format_fixed(tmp, v)) == 0) {
        n = (size_t)snprintf(tmp, sizeof tmp, "%.15g", v);
        if (strtod(tmp, NULL) != v)
            n = (size_t)snprintf(tmp, sizeof tmp, "%.17g", v);
    }
    put(b, tmp, n);
    b->comma = true;
}

void zt_json_bool(zt_jbuf *b, bool v) {
    sep(b);
    put(b, v ? "true" : "false", v ? 4 : 5);
    b->comma = true;
}

void zt_json_null(zt_jbuf *b) {
    sep(b);
    put(b, "null", 4);
    b->comma = true;
}

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

void zt_json_raw(zt_jbuf *b, const char *json, size_t n) {
    while (n && json && is_space(*json))
        json++, n--;
    while (n && json && is_space(json[n - 1]))
        n--;
    if (!json || n == 0) {
        zt_json_null(b);
        return;
    }
    sep(b);
    put(b, json, n);
    b->comma = true;
}
