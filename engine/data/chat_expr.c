/* Expressions of the chat templates' Jinja subset (ztrain/chat_template.h): one
 * recursive-descent parser over an expression's source that either evaluates it or, without a
 * render, only checks it, so parse time sees every construct of every branch. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_internal.h"

static char *arena_alloc(render *r, size_t n) {
    arena_block *b = malloc(sizeof *b + n + 1);
    if (!b)
        return NULL;
    b->next = r->arena;
    r->arena = b;
    return b->data;
}

static val v_int(long long i) { return (val){.k = V_INT, .i = i}; }

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
    char *out = e->r ? arena_alloc(e->r, (size_t)(stop - start)) : NULL;
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
    char *s = arena_alloc(e->r, len);
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
    char *s = arena_alloc(e->r, a.n + b.n);
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
    if (left) {
        size_t k = zt_chat_space_prefix(v.s, v.n);
        v.s += k, v.n -= k;
    }
    if (right)
        v.n -= zt_chat_space_suffix(v.s, v.n);
    return v;
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
        return i > 0 ? zt_chat_from_json(cJSON_GetArrayItem(l->list, l->lo + i - 1))
                     : undefined(e, "there is no previous item");
    default:
        return i + 1 < len ? zt_chat_from_json(cJSON_GetArrayItem(l->list, l->lo + i + 1))
                           : undefined(e, "there is no next item");
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

static val subscript(ex *e, val v, val key) {
    if (!e->r)
        return v;
    if (v.k == V_UNDEF)
        return undefined_error(e, v);
    if (v.k == V_DICT && key.k == V_STR) {
        char k[128];
        snprintf(k, sizeof k, "%.*s", (int)key.n, key.s);
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(v.j, k);
        return j ? zt_chat_from_json(j)
                 : undefined(e, "'dict object' has no attribute '%.*s'", (int)key.n, key.s);
    }
    if (v.k == V_LIST && key.k == V_INT) {
        long long i = key.i < 0 ? v.hi + key.i : v.lo + key.i;
        if (i < v.lo || i >= v.hi)
            return undefined(e, "list object has no element %lld", key.i);
        return zt_chat_from_json(cJSON_GetArrayItem(v.j, (int)i));
    }
    return fail(e, ZT_ERR_UNSUPPORTED, "subscript of a %s by a %s is not supported",
                zt_chat_type_name(v), zt_chat_type_name(key));
}

static long long slice_bound(long long i, int len) {
    if (i < 0)
        i += len;
    return i < 0 ? 0 : i > len ? len : i;
}

static val call_filter(ex *e, val v) {
    size_t n = peek_ident(e);
    const char *name = e->p;
    e->p += n;
    if (is_name(name, n, "trim")) {
        if (!e->r)
            return v;
        /* jinja2's trim strips the value made text */
        char num[32];
        val t = {.k = V_STR};
        if (!zt_chat_text(v, num, &t.s, &t.n))
            return fail(e, ZT_ERR_UNSUPPORTED, "trim of a %s is not supported", zt_chat_type_name(v));
        if (t.s == num) {
            char *copy = arena_alloc(e->r, t.n);
            if (!copy)
                return fail(e, ZT_ERR_NOMEM, "out of memory");
            t.s = memcpy(copy, num, t.n);
        }
        return strip(e, t, true, true);
    }
    if (is_name(name, n, "length")) {
        if (!e->r)
            return v;
        if (v.k == V_LIST) return v_int(v.hi - v.lo);
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

static val postfix(ex *e) {
    val v = primary(e);
    for (;;) {
        if (e->st != ZT_OK)
            return v;
        if (op(e, ".")) {
            size_t n = peek_ident(e);
            const char *name = e->p;
            e->p += n;
            if (n == 0)
                return fail(e, ZT_ERR_FORMAT, "expected a name after '.'");
            if (op(e, "(")) {
                expect(e, ")");
                bool l = is_name(name, n, "strip"), ls = is_name(name, n, "lstrip"),
                     rs = is_name(name, n, "rstrip");
                if (!l && !ls && !rs)
                    return fail(e, ZT_ERR_UNSUPPORTED, "method '%.*s' is not supported", (int)n,
                                name);
                if (e->r && v.k == V_UNDEF)
                    return undefined_error(e, v);
                v = e->r ? strip(e, v, l || ls, l || rs) : v;
            } else {
                v = attribute(e, v, name, n);
            }
        } else if (op(e, "[")) {
            skip_ws(e);
            val a = {.k = V_NONE}, b = {.k = V_NONE};
            bool slice = false;
            if (!op(e, ":"))
                a = expr(e);
            else
                slice = true;
            if (slice || op(e, ":")) {
                slice = true;
                skip_ws(e);
                if (e->p < e->end && *e->p != ']')
                    b = expr(e);
            }
            expect(e, "]");
            if (!slice) {
                v = subscript(e, v, a);
            } else if (e->r && e->st == ZT_OK) {
                if (v.k == V_UNDEF)
                    return undefined_error(e, v);
                if (v.k != V_LIST)
                    return fail(e, ZT_ERR_UNSUPPORTED, "a slice of a %s is not supported",
                                zt_chat_type_name(v));
                int len = v.hi - v.lo;
                long long lo = a.k == V_INT ? slice_bound(a.i, len) : 0;
                long long hi = b.k == V_INT ? slice_bound(b.i, len) : len;
                v.hi = v.lo + (int)(hi > lo ? hi : lo);
                v.lo += (int)lo;
            }
        } else if (op(e, "|")) {
            v = call_filter(e, v);
        } else if (op(e, "(")) {
            return fail(e, ZT_ERR_UNSUPPORTED, "calling a value is not supported");
        } else {
            return v;
        }
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

/* A number for arithmetic: an integer, or a bool as Python's 1 and 0. */
static bool as_int(val v, long long *i) {
    if (v.k == V_INT || v.k == V_BOOL) {
        *i = v.k == V_INT ? v.i : v.b;
        return true;
    }
    return false;
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

static val unary(ex *e) {
    if (op(e, "-")) {
        if (!deeper(e))
            return (val){.k = V_UNDEF};
        val v = unary(e);
        e->depth--;
        return arith(e, "-", v_int(0), v);
    }
    return postfix(e);
}

static val mul(ex *e) {
    val v = unary(e);
    for (;;) {
        if (op(e, "//")) v = arith(e, "//", v, unary(e));
        else if (op(e, "*")) v = arith(e, "*", v, unary(e));
        else if (op(e, "%")) v = arith(e, "%", v, unary(e));
        else if (op(e, "/")) {
            e->p--;
            return fail(e, ZT_ERR_UNSUPPORTED, "'/' (true division, a float) is not supported; "
                        "use '//'");
        } else return v;
    }
}

static val add(ex *e) {
    val v = mul(e);
    for (;;) {
        if (op(e, "+")) {
            val b = mul(e);
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
            v = arith(e, "-", v, mul(e));
        } else if (op(e, "~")) {
            v = tilde(e, v, mul(e));
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
        const cJSON *x = cJSON_GetArrayItem(hay.j, hay.lo);
        for (int i = hay.lo; i < hay.hi; i++, x = x->next)
            if (zt_chat_equal(zt_chat_from_json(x), needle))
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

static val compare(ex *e) {
    val v = add(e);
    for (;;) {
        if (op(e, "==")) { val b = add(e); v = e->r ? zt_chat_bool(zt_chat_equal(v, b)) : v; }
        else if (op(e, "!=")) { val b = add(e); v = e->r ? zt_chat_bool(!zt_chat_equal(v, b)) : v; }
        else if (op(e, "<=") || op(e, ">=") || op(e, "<") || op(e, ">")) {
            char o = e->p[-1] == '=' ? e->p[-2] : e->p[-1];
            bool eq = e->p[-1] == '=';
            v = order(e, o, eq, v, add(e));
        } else if (word(e, "in")) {
            val b = add(e);
            v = e->r && e->st == ZT_OK ? zt_chat_bool(contains(e, b, v)) : v;
        } else if (peek_ident(e) == 3 && !memcmp(e->p, "not", 3)) {
            const char *save = e->p;
            e->p += 3;
            if (!word(e, "in")) {
                e->p = save;
                return v;
            }
            val b = add(e);
            v = e->r && e->st == ZT_OK ? zt_chat_bool(!contains(e, b, v)) : v;
        } else if (word(e, "is")) {
            bool neg = word(e, "not");
            size_t n = peek_ident(e);
            const char *t = e->p;
            e->p += n;
            bool r;
            if (is_name(t, n, "defined")) r = v.k != V_UNDEF;
            else if (is_name(t, n, "none")) r = v.k == V_NONE;
            else if (is_name(t, n, "string")) r = v.k == V_STR;
            else return fail(e, ZT_ERR_UNSUPPORTED, "test 'is %.*s' is not supported", (int)n, t);
            v = e->r ? zt_chat_bool(r != neg) : v;
        } else {
            return v;
        }
    }
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

