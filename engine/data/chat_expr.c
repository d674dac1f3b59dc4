/* Expressions of the chat templates' Jinja subset (ztrain/chat_template.h): one
 * recursive-descent parser over an expression's source that either evaluates it or, without a
 * render, only checks it, so parse time sees every construct of every branch. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_internal.h"

static val v_int(long long i) { return (val){.k = V_INT, .i = i}; }

/* A number for arithmetic and indices: an integer, or a bool as Python's 1 and 0. */
static bool as_int(val v, long long *i) {
    if (v.k == V_INT || v.k == V_BOOL) {
        *i = v.k == V_INT ? v.i : v.b;
        return true;
    }
    return false;
}

/* ---- expressions -------------------------------------------------------------------------- */

typedef struct {
    const char *p, *end, *base;
    render *r;       /* NULL: check only, nothing is evaluated */
    const zt_chat_template *t;
    size_t offset;   /* of the expression's source (base) in t->src */
    zt_status st;
    int depth;       /* nesting, up to ZT_CHAT_MAX_NESTING */
} ex;

static val fail(ex *e, zt_status code, const char *fmt, ...) {
    if (e->st == ZT_OK) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        e->st = zt_error(code, "%s: chat_template at offset %zu: %s", e->t->source,
                         zt_chat_offset(e->t, e->offset + (size_t)(e->p - e->base)), msg);
    }
    e->p = e->end;
    return (val){.k = V_UNDEF};
}

static void skip_ws(ex *e) {
    while (e->p < e->end && (*e->p == ' ' || *e->p == '\t' || *e->p == '\n' || *e->p == '\r'))
        e->p++;
}

bool zt_chat_is_ident(char c, bool first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (!first && c >= '0' && c <= '9');
}

/* The identifier at p (not consumed), its length in *n; 0 when none. */
static size_t peek_ident(ex *e) {
    skip_ws(e);
    size_t n = 0;
    while (e->p + n < e->end && zt_chat_is_ident(e->p[n], n == 0))
        n++;
    return n;
}

static bool word(ex *e, const char *w) {
    size_t n = peek_ident(e);
    if (n == strlen(w) && memcmp(e->p, w, n) == 0) {
        e->p += n;
        return true;
    }
    return false;
}

static bool op(ex *e, const char *o) {
    skip_ws(e);
    size_t n = strlen(o);
    if ((size_t)(e->end - e->p) >= n && memcmp(e->p, o, n) == 0) {
        /* "=" is not "==", "/" not "//", "*" not "**" */
        if ((n == 1 && (o[0] == '/' || o[0] == '*') && e->p + 1 < e->end && e->p[1] == o[0]) ||
            (n == 1 && (o[0] == '<' || o[0] == '>') && e->p + 1 < e->end && e->p[1] == '='))
            return false;
        e->p += n;
        return true;
    }
    return false;
}

static void expect(ex *e, const char *o) {
    if (!op(e, o))
        fail(e, ZT_ERR_FORMAT, "expected '%s'", o);
}

static val expr(ex *e);

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static size_t put_utf8(char *out, unsigned cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f)), out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* A string literal's escapes as jinja2 decodes them, with Python's unicode-escape: \\ \' \" \a
 * \b \f \n \r \t \v, octal \ooo, \xHH, \uXXXX, \UXXXXXXXX; a backslash before a newline drops
 * both; before anything else it stays. NUL is refused: a render is a C string. The text
 * [s, stop) is decoded into out (never longer than the source), or only checked when out is
 * NULL; the decoded length, or -1 after fail(). */
static long unescape(ex *e, const char *s, const char *stop, char *out) {
    char buf[4];
    size_t k = 0;
    while (s < stop) {
        if (*s != '\\' || s + 1 >= stop) {
            if (out)
                out[k] = *s;
            k++, s++;
            continue;
        }
        const char *at = s++;
        unsigned cp = 0;
        int digits = 0;
        switch (*s) {
        case '\n': s++; continue;
        case '\\': case '\'': case '"': cp = (unsigned char)*s; break;
        case 'a': cp = '\a'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'v': cp = '\v'; break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'N':
            e->p = at;
            fail(e, ZT_ERR_UNSUPPORTED, "string escape '\\N{...}' is not supported");
            return -1;
        default:
            if (*s >= '0' && *s <= '7') {
                for (int d = 0; d < 3 && s < stop && *s >= '0' && *s <= '7'; d++)
                    cp = cp * 8 + (unsigned)(*s++ - '0');
                s--;
            } else { /* Python keeps an unknown escape as it is */
                if (out)
                    out[k] = '\\';
                k++;
                continue;
            }
        }
        s++;
        for (int d = 0; d < digits; d++, s++) {
            int h = s < stop ? hex_digit(*s) : -1;
            if (h < 0) {
                e->p = at;
                fail(e, ZT_ERR_FORMAT, "truncated \\%c escape in a string", at[1]);
                return -1;
            }
            cp = cp * 16 + (unsigned)h;
        }
        if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            e->p = at;
            fail(e, ZT_ERR_UNSUPPORTED, "string escape '%.*s' is not a Unicode character",
                 (int)(s - at), at);
            return -1;
        }
        if (cp == 0) { /* renders are C strings */
            e->p = at;
            fail(e, ZT_ERR_UNSUPPORTED, "string escape '%.*s' (NUL) is not supported",
                 (int)(s - at), at);
            return -1;
        }
        size_t w = put_utf8(out ? out + k : buf, cp);
        k += w;
    }
    return (long)k;
}

static val string_literal(ex *e) {
    char q = *e->p++;
    const char *start = e->p, *stop = start;
    bool escaped = false;
    while (stop < e->end && *stop != q) {
        escaped |= *stop == '\\';
        stop += *stop == '\\' && stop + 1 < e->end ? 2 : 1;
    }
    if (stop >= e->end)
        return fail(e, ZT_ERR_FORMAT, "unterminated string");
    e->p = stop + 1;
    if (!escaped)
        return zt_chat_str(start, (size_t)(stop - start));
    char *out = e->r ? zt_chat_alloc(e->r, (size_t)(stop - start)) : NULL;
    if (e->r && !out)
        return fail(e, ZT_ERR_NOMEM, "out of memory");
    const char *resume = e->p;
    long n = unescape(e, start, stop, out);
    if (n < 0)
        return (val){.k = V_UNDEF};
    e->p = resume;
    return out ? zt_chat_str(out, (size_t)n) : (val){.k = V_UNDEF};
}

/* An undefined value carrying jinja2's message for when it is used. */
static val undefined(ex *e, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    char *s = zt_chat_alloc(e->r, len);
    if (!s)
        return fail(e, ZT_ERR_NOMEM, "out of memory");
    memcpy(s, msg, len);
    s[len] = '\0';
    return (val){.k = V_UNDEF, .s = s};
}

/* Using an undefined value where jinja2's Undefined raises: UndefinedError, its message. */
static val undefined_error(ex *e, val v) {
    return fail(e, ZT_ERR_INVALID, "%s", v.s ? v.s : "a value is undefined");
}

static val lookup(ex *e, const char *name, size_t n) {
    render *r = e->r;
    for (int i = r->n_vars - 1; i >= 0; i--)
        if (strlen(r->vars[i].name) == n && memcmp(r->vars[i].name, name, n) == 0)
            return r->vars[i].v;
    return undefined(e, "'%.*s' is undefined", (int)n, name);
}

/* '+' and '~' of two strings. */
static val concat(ex *e, val a, val b) {
    char *s = zt_chat_alloc(e->r, a.n + b.n);
    if (!s)
        return fail(e, ZT_ERR_NOMEM, "out of memory");
    memcpy(s, a.s, a.n);
    memcpy(s + a.n, b.s, b.n);
    return zt_chat_str(s, a.n + b.n);
}

/* '~': both sides as text, undefined as nothing. */
static val tilde(ex *e, val a, val b) {
    if (!e->r)
        return a;
    char na[32], nb[32];
    val ta = {.k = V_STR}, tb = {.k = V_STR};
    if (!zt_chat_text(a, na, &ta.s, &ta.n) || !zt_chat_text(b, nb, &tb.s, &tb.n))
        return fail(e, ZT_ERR_UNSUPPORTED, "'~' of a %s is not supported",
                    zt_chat_type_name(zt_chat_text(a, na, &ta.s, &ta.n) ? b : a));
    return concat(e, ta, tb);
}

static val strip(ex *e, val v, bool left, bool right) {
    if (v.k != V_STR)
        return fail(e, ZT_ERR_INVALID, "trim or strip of a %s, not a string", zt_chat_type_name(v));
    return zt_chat_strip_space(v, left, right);
}

static bool is_name(const char *name, size_t n, const char *w) {
    return n == strlen(w) && memcmp(name, w, n) == 0;
}

/* The loop variable's attributes; in a check (no loop) only whether the name is one. */
static val loop_attribute(ex *e, const loop_state *l, const char *name, size_t n) {
    static const char *const names[] = {"index0", "index", "revindex0", "revindex", "first",
                                        "last", "length", "depth0", "depth", "previtem",
                                        "nextitem"};
    size_t k = 0;
    while (k < sizeof names / sizeof names[0] && !is_name(name, n, names[k]))
        k++;
    if (k == sizeof names / sizeof names[0])
        return fail(e, ZT_ERR_UNSUPPORTED, "loop.%.*s is not supported", (int)n, name);
    if (!l)
        return (val){.k = V_UNDEF};
    int i = l->index0, len = l->length;
    switch (k) {
    case 0: return v_int(i);
    case 1: return v_int(i + 1);
    case 2: return v_int(len - i - 1);
    case 3: return v_int(len - i);
    case 4: return zt_chat_bool(i == 0);
    case 5: return zt_chat_bool(i == len - 1);
    case 6: return v_int(len);
    case 7: return v_int(0);
    case 8: return v_int(1);
    case 9:
        return i > 0 ? l->items[i - 1] : undefined(e, "there is no previous item");
    default:
        return i + 1 < len ? l->items[i + 1] : undefined(e, "there is no next item");
    }
}

/* x.name: an object's key; anything else has no such attribute (undefined), and an attribute of
 * undefined raises, as in jinja2. */
static val attribute(ex *e, val v, const char *name, size_t n) {
    if (v.k == V_LOOP)
        return loop_attribute(e, v.loop, name, n);
    if (!e->r)
        return v;
    if (v.k == V_UNDEF)
        return undefined_error(e, v);
    if (v.k == V_DICT) {
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)n, name);
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(v.j, key);
        if (j)
            return zt_chat_from_json(j);
    }
    return undefined(e, "'%s object' has no attribute '%.*s'", zt_chat_type_name(v), (int)n, name);
}

/* A key or slice bound as Python's repr shows it in jinja2's messages. */
static const char *repr(val v, char num[32]) {
    const char *s;
    size_t n;
    if (v.k == V_STR || !zt_chat_text(v, num, &s, &n))
        return v.k == V_STR ? "a string" : zt_chat_type_name(v);
    return s;
}

/* The byte offset of code point k of the string v (k may be its length: the end). */
static size_t cp_offset(val v, long long k) {
    size_t at = 0;
    for (; k > 0 && at < v.n; k--)
        at += zt_chat_cp_len((unsigned char)v.s[at]);
    return at > v.n ? v.n : at;
}

/* x[key] as jinja2's getitem: an object's key, a list's item, a string's code point (a negative
 * index counts from the end). Anything else is undefined with jinja2's message (its getitem
 * swallows Python's TypeError and LookupError); only a subscript of undefined raises. */
static val subscript(ex *e, val v, val key) {
    if (!e->r)
        return v;
    if (v.k == V_UNDEF)
        return undefined_error(e, v);
    const char *type = zt_chat_type_name(v);
    if (v.k == V_DICT && key.k == V_STR) {
        char k[128];
        snprintf(k, sizeof k, "%.*s", (int)key.n, key.s);
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(v.j, k);
        return j ? zt_chat_from_json(j)
                 : undefined(e, "'dict object' has no attribute '%.*s'", (int)key.n, key.s);
    }
    long long i;
    if ((v.k == V_LIST || v.k == V_STR) && as_int(key, &i)) {
        long long len = v.k == V_LIST ? v.count : zt_chat_items(v, NULL);
        long long at = i < 0 ? len + i : i;
        if (at < 0 || at >= len)
            return undefined(e, "%s object has no element %lld", type, i);
        if (v.k == V_LIST)
            return zt_chat_list_item(v, (int)at);
        size_t from = cp_offset(v, at);
        return zt_chat_str(v.s + from, cp_offset((val){.s = v.s + from, .n = v.n - from}, 1));
    }
    if (key.k == V_STR)
        return undefined(e, "'%s object' has no attribute '%.*s'", type, (int)key.n, key.s);
    char num[32];
    return undefined(e, "%s object has no element %s", type, repr(key, num));
}

/* Python's slice.indices(len): *start and the count of items, for a step that is not 0. */
static long long slice_indices(val a, val b, long long step, long long len, long long *start) {
    long long lower = step < 0 ? -1 : 0, upper = step < 0 ? len - 1 : len, lo, hi;
    val bound[2] = {a, b};
    long long *out[2] = {&lo, &hi};
    for (int k = 0; k < 2; k++) {
        long long x;
        if (!as_int(bound[k], &x))
            x = (k == 0) == (step < 0) ? upper : lower;
        else if (x < 0)
            x = x + len < lower ? lower : x + len;
        else if (x > upper)
            x = upper;
        *out[k] = x;
    }
    *start = lo;
    if (step > 0)
        return lo < hi ? (hi - lo - 1) / step + 1 : 0;
    return hi < lo ? (lo - hi - 1) / -step + 1 : 0;
}

/* x[a:b:c] as Python slices a list, or a string by code points. A bound that is not an integer
 * or none, or a value that is neither, gives jinja2's undefined; a step of 0 raises. */
static val slice(ex *e, val v, val a, val b, val c) {
    if (!e->r || e->st != ZT_OK)
        return v;
    if (v.k == V_UNDEF)
        return undefined_error(e, v);
    long long step = 1, len = v.k == V_LIST ? v.count : v.k == V_STR ? zt_chat_items(v, NULL) : 0;
    bool ok = v.k == V_LIST || v.k == V_STR;
    val bound[3] = {a, b, c};
    for (int k = 0; k < 3; k++)
        ok = ok && (bound[k].k == V_NONE || bound[k].k == V_INT || bound[k].k == V_BOOL);
    if (!ok) {
        char n0[32], n1[32], n2[32];
        return undefined(e, "%s object has no element slice(%s, %s, %s)", zt_chat_type_name(v),
                         repr(a, n0), repr(b, n1), repr(c, n2));
    }
    if (c.k != V_NONE && as_int(c, &step) && step == 0)
        return fail(e, ZT_ERR_INVALID, "slice step cannot be zero");
    /* a step past the length takes at most one item, as the length plus one does */
    step = step > len + 1 ? len + 1 : step < -len - 1 ? -len - 1 : step;
    long long start, count = slice_indices(a, b, step, len, &start);
    if (count <= 1)
        step = 1;
    if (v.k == V_LIST) {
        int was = v.step ? v.step : 1;
        v.lo += (int)(start * was), v.step = (int)(step * was), v.count = (int)count;
        return v;
    }
    if (step == 1) {
        size_t from = cp_offset(v, start);
        return zt_chat_str(v.s + from, cp_offset((val){.s = v.s + from, .n = v.n - from}, count));
    }
    /* where each code point starts, and the end */
    size_t *at = (size_t *)(void *)zt_chat_alloc(e->r, (size_t)(len + 1) * sizeof *at);
    char *out = zt_chat_alloc(e->r, v.n);
    if (!at || !out)
        return fail(e, ZT_ERR_NOMEM, "out of memory");
    at[0] = 0;
    for (long long k = 0; k < len; k++) {
        size_t w = zt_chat_cp_len((unsigned char)v.s[at[k]]);
        at[k + 1] = at[k] + w > v.n ? v.n : at[k] + w;
    }
    size_t n = 0;
    for (long long k = 0, i = start; k < count; k++, i += step) {
        memcpy(out + n, v.s + at[i], at[i + 1] - at[i]);
        n += at[i + 1] - at[i];
    }
    return zt_chat_str(out, n);
}

static val call_filter(ex *e, val v) {
    size_t n = peek_ident(e);
    const char *name = e->p;
    e->p += n;
    skip_ws(e);
    if (e->p < e->end && *e->p == '(' && (is_name(name, n, "trim") || is_name(name, n, "length")))
        return fail(e, ZT_ERR_UNSUPPORTED, "filter '%.*s' with arguments is not supported",
                    (int)n, name);
    if (is_name(name, n, "trim")) {
        if (!e->r)
            return v;
        /* jinja2's trim strips the value made text */
        char num[32];
        val t = {.k = V_STR};
        if (!zt_chat_text(v, num, &t.s, &t.n))
            return fail(e, ZT_ERR_UNSUPPORTED, "trim of a %s is not supported", zt_chat_type_name(v));
        if (t.s == num) {
            char *copy = zt_chat_alloc(e->r, t.n);
            if (!copy)
                return fail(e, ZT_ERR_NOMEM, "out of memory");
            t.s = memcpy(copy, num, t.n);
        }
        return strip(e, t, true, true);
    }
    if (is_name(name, n, "length")) {
        if (!e->r)
            return v;
        if (v.k == V_LIST) return v_int(v.count);
        if (v.k == V_DICT) return v_int(cJSON_GetArraySize(v.j));
        if (v.k == V_UNDEF) return v_int(0);
        if (v.k == V_STR) { /* code points, as Python's len */
            long long count = 0;
            for (size_t i = 0; i < v.n; i++)
                count += ((unsigned char)v.s[i] & 0xc0) != 0x80;
            return v_int(count);
        }
        return fail(e, ZT_ERR_INVALID, "length of a %s", zt_chat_type_name(v));
    }
    return fail(e, ZT_ERR_UNSUPPORTED, "filter '%.*s' is not supported", (int)n, name);
}

static val primary(ex *e) {
    skip_ws(e);
    if (e->p >= e->end)
        return fail(e, ZT_ERR_FORMAT, "expression ends early");
    if (*e->p == '\'' || *e->p == '"')
        return string_literal(e);
    if (*e->p >= '0' && *e->p <= '9') {
        long long i = 0;
        while (e->p < e->end && *e->p >= '0' && *e->p <= '9')
            if (__builtin_mul_overflow(i, 10, &i) || __builtin_add_overflow(i, *e->p++ - '0', &i))
                return fail(e, ZT_ERR_UNSUPPORTED, "an integer beyond 64 bits is not supported");
        if (e->p < e->end && *e->p == '.')
            return fail(e, ZT_ERR_UNSUPPORTED, "floating-point numbers are not supported");
        return v_int(i);
    }
    if (op(e, "(")) {
        val v = expr(e);
        expect(e, ")");
        return v;
    }
    if (op(e, "[") || op(e, "{"))
        return fail(e, ZT_ERR_UNSUPPORTED, "list and dict literals are not supported");
    size_t n = peek_ident(e);
    if (n == 0)
        return fail(e, ZT_ERR_FORMAT, "unexpected '%c'", *e->p);
    const char *name = e->p;
    e->p += n;
    if (is_name(name, n, "true") || is_name(name, n, "True"))
        return zt_chat_bool(true);
    if (is_name(name, n, "false") || is_name(name, n, "False"))
        return zt_chat_bool(false);
    if (is_name(name, n, "none") || is_name(name, n, "None"))
        return (val){.k = V_NONE};
    if (is_name(name, n, "raise_exception")) {
        expect(e, "(");
        val msg = expr(e);
        expect(e, ")");
        if (e->r && e->st == ZT_OK)
            return fail(e, ZT_ERR_INVALID, "raise_exception: %.*s", msg.k == V_STR ? (int)msg.n : 0,
                        msg.k == V_STR ? msg.s : "");
        return (val){.k = V_UNDEF};
    }
    skip_ws(e);
    if (e->p < e->end && *e->p == '(')
        return fail(e, ZT_ERR_UNSUPPORTED, "function '%.*s' is not supported", (int)n, name);
    if (!e->r) /* a check knows `loop` by name, so its attributes are checked too */
        return is_name(name, n, "loop") ? (val){.k = V_LOOP} : (val){.k = V_UNDEF};
    return lookup(e, name, n);
}

/* The arguments of a call after its '(' up to its ')', at most max (positional only). */
static int arguments(ex *e, val *args, int max) {
    int n = 0;
    if (op(e, ")"))
        return 0;
    do {
        size_t w = peek_ident(e);
        const char *after = e->p + w;
        while (after < e->end && (*after == ' ' || *after == '\t' || *after == '\n'))
            after++;
        if (w && after < e->end && *after == '=' && (after + 1 >= e->end || after[1] != '=')) {
            fail(e, ZT_ERR_UNSUPPORTED, "keyword arguments ('%.*s=') are not supported", (int)w,
                 e->p);
            return -1;
        }
        val a = expr(e);
        if (n < max)
            args[n] = a;
        n++;
    } while (e->st == ZT_OK && op(e, ","));
    expect(e, ")");
    return e->st == ZT_OK ? n : -1;
}

/* v.name(...): a method of the subset (chat_method.c), called as Python calls it; a method of
 * undefined raises, as jinja2's Undefined does. */
static val call_method(ex *e, val v, const char *name, size_t n) {
    const char *at = e->p;
    const zt_chat_method *m = zt_chat_method_find(name, n);
    if (!m) {
        e->p = name;
        return fail(e, ZT_ERR_UNSUPPORTED, "method '%.*s' is not supported", (int)n, name);
    }
    val args[8];
    int nargs = arguments(e, args, 8);
    if (nargs < 0)
        return (val){.k = V_UNDEF};
    if (nargs < m->min_args || nargs > m->max_args) {
        e->p = at;
        return fail(e, ZT_ERR_UNSUPPORTED, "method '%s' with %d argument%s is not supported "
                    "(the subset gives it %d to %d)", m->name, nargs, nargs == 1 ? "" : "s",
                    m->min_args, m->max_args);
    }
    if (!e->r || e->st != ZT_OK)
        return v;
    if (v.k == V_UNDEF)
        return undefined_error(e, v);
    char why[256];
    val out;
    if (!zt_chat_method_call(e->r, m, v, args, nargs, &out, why)) {
        e->p = name;
        return fail(e, ZT_ERR_INVALID, "%s", why);
    }
    return out;
}

/* x.name, x.name(...), x[key] and x[a:b:c] after a primary, as jinja2's parse_postfix. */
static val postfix(ex *e, val v) {
    for (;;) {
        if (e->st != ZT_OK)
            return v;
        if (op(e, ".")) {
            size_t n = peek_ident(e);
            const char *name = e->p;
            e->p += n;
            if (n == 0)
                return fail(e, ZT_ERR_FORMAT, "expected a name after '.'");
            v = op(e, "(") ? call_method(e, v, name, n) : attribute(e, v, name, n);
        } else if (op(e, "[")) {
            /* a key, or a slice: up to three optional parts split by ':' */
            val part[3] = {{.k = V_NONE}, {.k = V_NONE}, {.k = V_NONE}};
            int colons = 0;
            for (;;) {
                skip_ws(e);
                if (e->p < e->end && *e->p != ':' && *e->p != ']')
                    part[colons] = expr(e);
                else if (colons == 0 && e->p < e->end && *e->p == ']')
                    return fail(e, ZT_ERR_FORMAT, "expected a key or a slice in '[]'");
                if (e->st != ZT_OK || colons == 2 || !op(e, ":"))
                    break;
                colons++;
            }
            expect(e, "]");
            v = colons ? slice(e, v, part[0], part[1], part[2]) : subscript(e, v, part[0]);
        } else if (op(e, "(")) {
            return fail(e, ZT_ERR_UNSUPPORTED, "calling a value is not supported");
        } else {
            return v;
        }
    }
}

/* x is [not] defined|none|string. */
static val test(ex *e, val v) {
    bool neg = word(e, "not");
    size_t n = peek_ident(e);
    const char *t = e->p;
    e->p += n;
    bool r;
    if (is_name(t, n, "defined")) r = v.k != V_UNDEF;
    else if (is_name(t, n, "none")) r = v.k == V_NONE;
    else if (is_name(t, n, "string")) r = v.k == V_STR;
    else return fail(e, ZT_ERR_UNSUPPORTED, "test 'is %.*s' is not supported", (int)n, t);
    return e->r ? zt_chat_bool(r != neg) : v;
}

/* Filters and tests after a value, as jinja2's parse_filter_expr: they bind tighter than any
 * operator ("a == b is none" tests b). */
static val filters(ex *e, val v) {
    for (;;) {
        if (e->st != ZT_OK)
            return v;
        if (op(e, "|"))
            v = call_filter(e, v);
        else if (word(e, "is"))
            v = test(e, v);
        else
            return v;
    }
}

/* One level deeper for a nested expression or a chain of '-' or 'not'; false (failed) past the
 * limit, so a hostile template cannot exhaust the stack. */
static bool deeper(ex *e) {
    if (e->depth == ZT_CHAT_MAX_NESTING) {
        fail(e, ZT_ERR_UNSUPPORTED, "the expression nests deeper than %d (parentheses, brackets, "
             "'-' or 'not')", ZT_CHAT_MAX_NESTING);
        return false;
    }
    e->depth++;
    return true;
}

/* Integer arithmetic with Python's floor division and modulo. jinja2's integers are unbounded:
 * a result beyond 64 bits is refused, never wrapped. */
static val arith(ex *e, const char *o, val a, val b) {
    if (!e->r || e->st != ZT_OK)
        return a;
    if (a.k == V_UNDEF || b.k == V_UNDEF)
        return undefined_error(e, a.k == V_UNDEF ? a : b);
    long long x, y, z;
    if (!as_int(a, &x) || !as_int(b, &y))
        return fail(e, ZT_ERR_INVALID, "'%s' of a %s and a %s, not two integers", o, zt_chat_type_name(a),
                    zt_chat_type_name(b));
    bool over = false;
    switch (o[0]) {
    case '+': over = __builtin_add_overflow(x, y, &z); break;
    case '-': over = __builtin_sub_overflow(x, y, &z); break;
    case '*': over = __builtin_mul_overflow(x, y, &z); break;
    default: { /* "//" and "%" */
        if (y == 0)
            return fail(e, ZT_ERR_INVALID, "integer division or modulo by zero");
        long long q, m;
        if (y == -1) { /* LLONG_MIN / -1 would trap */
            over = __builtin_sub_overflow(0, x, &q);
            m = 0;
        } else {
            q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0)))
                q--, m += y;
        }
        z = o[0] == '%' ? m : q;
        over = over && o[0] != '%';
    }
    }
    if (over)
        return fail(e, ZT_ERR_UNSUPPORTED, "'%s' gives an integer beyond 64 bits (%lld %s %lld)",
                    o, x, o, y);
    return v_int(z);
}

/* Unary '-' and '+' of a number, as Python's; anything else raises TypeError. */
static val sign(ex *e, char o, val v) {
    if (!e->r || e->st != ZT_OK)
        return v;
    if (v.k == V_UNDEF)
        return undefined_error(e, v);
    if (v.k != V_INT && v.k != V_BOOL && v.k != V_FLOAT)
        return fail(e, ZT_ERR_INVALID, "bad operand type for unary %c: '%s'", o,
                    zt_chat_type_name(v));
    return arith(e, o == '-' ? "-" : "+", v_int(0), v);
}

/* jinja2's parse_unary: a '-' or '+' takes the value after it without its filters and tests,
 * which then apply to the signed value: -x|length is (-x)|length. */
static val unary(ex *e, bool with_filter) {
    val v;
    if (op(e, "-") || op(e, "+")) {
        char o = e->p[-1];
        if (!deeper(e))
            return (val){.k = V_UNDEF};
        v = sign(e, o, unary(e, false));
        e->depth--;
    } else {
        v = postfix(e, primary(e));
    }
    return with_filter ? filters(e, v) : v;
}

/* '*': integers multiply, and a string times an integer repeats, as in Python. */
static val times(ex *e, val a, val b) {
    long long k;
    if (!e->r || e->st != ZT_OK || !((a.k == V_STR && as_int(b, &k)) ||
                                     (b.k == V_STR && as_int(a, &k))))
        return arith(e, "*", a, b);
    val s = a.k == V_STR ? a : b;
    if (k <= 0 || s.n == 0)
        return zt_chat_str("", 0);
    if ((unsigned long long)k > (1ull << 30) / s.n)
        return fail(e, ZT_ERR_UNSUPPORTED, "'*' makes a string over 1 GiB");
    char *out = zt_chat_alloc(e->r, s.n * (size_t)k);
    if (!out)
        return fail(e, ZT_ERR_NOMEM, "out of memory");
    for (long long i = 0; i < k; i++)
        memcpy(out + (size_t)i * s.n, s.s, s.n);
    return zt_chat_str(out, s.n * (size_t)k);
}

static val mul(ex *e) {
    val v = unary(e, true);
    for (;;) {
        if (op(e, "//")) v = arith(e, "//", v, unary(e, true));
        else if (op(e, "*")) v = times(e, v, unary(e, true));
        else if (op(e, "%")) v = arith(e, "%", v, unary(e, true));
        else if (op(e, "/")) {
            e->p--;
            return fail(e, ZT_ERR_UNSUPPORTED, "'/' (true division, a float) is not supported; "
                        "use '//'");
        } else return v;
    }
}

/* '~' binds tighter than '+' and '-' in jinja2 (parse_concat sits between them). */
static val concat_expr(ex *e) {
    val v = mul(e);
    while (op(e, "~"))
        v = tilde(e, v, mul(e));
    return v;
}

static val add(ex *e) {
    val v = concat_expr(e);
    for (;;) {
        if (op(e, "+")) {
            val b = concat_expr(e);
            long long x, y;
            if (!e->r || e->st != ZT_OK)
                continue;
            if (as_int(v, &x) && as_int(b, &y))
                v = arith(e, "+", v, b);
            else if (v.k == V_UNDEF || b.k == V_UNDEF)
                return undefined_error(e, v.k == V_UNDEF ? v : b);
            else if (v.k == V_STR && b.k == V_STR)
                v = concat(e, v, b);
            else
                return fail(e, ZT_ERR_INVALID, "'+' of a %s and a %s", zt_chat_type_name(v), zt_chat_type_name(b));
        } else if (op(e, "-")) {
            v = arith(e, "-", v, concat_expr(e));
        } else {
            return v;
        }
    }
}

/* Python's `needle in hay`: a substring, a list's item, an object's key. */
static bool contains(ex *e, val hay, val needle) {
    if (hay.k == V_STR) {
        if (needle.k != V_STR) {
            fail(e, ZT_ERR_INVALID, "'in <string>' requires string as left operand, not %s",
                 zt_chat_type_name(needle));
            return false;
        }
        for (size_t i = 0; i + needle.n <= hay.n; i++)
            if (memcmp(hay.s + i, needle.s, needle.n) == 0)
                return true;
        return false;
    }
    if (hay.k == V_LIST) {
        for (int k = 0; k < hay.count; k++)
            if (zt_chat_equal(zt_chat_list_item(hay, k), needle))
                return true;
        return false;
    }
    if (hay.k == V_DICT) {
        if (needle.k != V_STR)
            return false;
        char k[128];
        snprintf(k, sizeof k, "%.*s", (int)needle.n, needle.s);
        return cJSON_GetObjectItemCaseSensitive(hay.j, k) != NULL;
    }
    if (hay.k == V_UNDEF) /* jinja2's Undefined iterates as empty */
        return false;
    fail(e, ZT_ERR_INVALID, "argument of type '%s' is not iterable", zt_chat_type_name(hay));
    return false;
}

/* <, <=, >, >= of two numbers or two strings (code point order, which is UTF-8's byte order). */
static val order(ex *e, char o, bool eq, val a, val b) {
    if (!e->r || e->st != ZT_OK)
        return a;
    if (a.k == V_UNDEF || b.k == V_UNDEF)
        return undefined_error(e, a.k == V_UNDEF ? a : b);
    long long x, y;
    int c;
    if (as_int(a, &x) && as_int(b, &y)) {
        c = x < y ? -1 : x > y;
    } else if (a.k == V_STR && b.k == V_STR) {
        c = memcmp(a.s, b.s, a.n < b.n ? a.n : b.n);
        if (c == 0)
            c = a.n < b.n ? -1 : a.n > b.n;
    } else {
        return fail(e, ZT_ERR_INVALID, "'%c%s' between a %s and a %s", o, eq ? "=" : "",
                    zt_chat_type_name(a), zt_chat_type_name(b));
    }
    return zt_chat_bool(o == '<' ? (eq ? c <= 0 : c < 0) : (eq ? c >= 0 : c > 0));
}

/* The comparison operator at p, consumed: "==", "!=", "<=", ">=", "<", ">", "in", "not in";
 * NULL when there is none. */
static const char *compare_op(ex *e) {
    static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">"};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        if (op(e, ops[k]))
            return ops[k];
    if (word(e, "in"))
        return "in";
    if (peek_ident(e) == 3 && !memcmp(e->p, "not", 3)) {
        const char *save = e->p;
        e->p += 3;
        if (word(e, "in"))
            return "not in";
        e->p = save;
    }
    return NULL;
}

static bool compare_one(ex *e, const char *o, val a, val b) {
    if (o[0] == '=' || o[0] == '!')
        return zt_chat_equal(a, b) == (o[0] == '=');
    if (o[0] == 'i' || o[0] == 'n')
        return contains(e, b, a) == (o[0] == 'i');
    return zt_chat_truthy(order(e, o[0], o[1] == '=', a, b));
}

/* Comparisons chain as Python's: a < b < c is a < b and b < c, and stops at the first false. */
static val compare(ex *e) {
    val left = add(e), v = left;
    render *keep = e->r;
    const char *o;
    while ((o = compare_op(e))) {
        val right = add(e);
        if (e->r && e->st == ZT_OK) {
            bool b = compare_one(e, o, left, right);
            v = zt_chat_bool(b);
            if (!b) /* the rest is only checked */
                e->r = NULL;
        }
        left = right;
    }
    e->r = keep;
    return v;
}

static val not_expr(ex *e) {
    if (word(e, "not")) {
        if (!deeper(e))
            return (val){.k = V_UNDEF};
        val v = not_expr(e);
        e->depth--;
        return e->r ? zt_chat_bool(!zt_chat_truthy(v)) : v;
    }
    return compare(e);
}

/* and/or keep Python's short-circuit values; the right side is still parsed (checked) when it
 * is not evaluated. */
static val and_expr(ex *e) {
    val v = not_expr(e);
    while (word(e, "and")) {
        render *keep = e->r;
        if (keep && !zt_chat_truthy(v))
            e->r = NULL;
        val b = not_expr(e);
        e->r = keep;
        if (keep && zt_chat_truthy(v))
            v = b;
    }
    return v;
}

static val or_expr(ex *e) {
    val v = and_expr(e);
    while (word(e, "or")) {
        render *keep = e->r;
        if (keep && zt_chat_truthy(v))
            e->r = NULL;
        val b = and_expr(e);
        e->r = keep;
        if (keep && !zt_chat_truthy(v))
            v = b;
    }
    return v;
}

static val expr(ex *e) {
    if (!deeper(e))
        return (val){.k = V_UNDEF};
    val v = or_expr(e);
    e->depth--;
    if (peek_ident(e) == 2 && !memcmp(e->p, "if", 2))
        return fail(e, ZT_ERR_UNSUPPORTED, "inline 'if ... else' is not supported");
    return v;
}

/* Evaluates (r NULL: checks) the expression of node d; the whole source must be used. */
val zt_chat_eval(const zt_chat_template *t, render *r, const node *d, zt_status *st) {
    ex e = {d->at, d->at + d->len, d->at, r, t, (size_t)(d->at - t->src), ZT_OK, 0};
    val v = expr(&e);
    skip_ws(&e);
    if (e.st == ZT_OK && e.p < e.end)
        fail(&e, ZT_ERR_UNSUPPORTED, "unexpected '%.*s'", (int)(e.end - e.p > 20 ? 20 : e.end - e.p),
             e.p);
    *st = e.st;
    return v;
}


zt_status zt_chat_split_for(const zt_chat_template *t, node *d) {
    ex e = {d->at, d->at + d->len, d->at, NULL, t, (size_t)(d->at - t->src), ZT_OK, 0};
    if (deeper(&e))
        or_expr(&e);
    skip_ws(&e);
    if (e.st == ZT_OK && word(&e, "recursive")) {
        e.p -= strlen("recursive");
        fail(&e, ZT_ERR_UNSUPPORTED, "recursive loops ('for ... recursive') are not supported");
    }
    if (e.st != ZT_OK || !(peek_ident(&e) == 2 && !memcmp(e.p, "if", 2)))
        return e.st; /* without a filter, the check of the whole expression says what is left */
    d->len = (size_t)(e.p - d->at);
    d->test = e.p + 2;
    d->test_len = (size_t)(e.end - d->test);
    return ZT_OK;
}
