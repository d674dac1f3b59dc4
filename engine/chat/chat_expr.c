/* Reading the chat templates' expressions (chat_expr_internal.h): the scanner, and one
 * recursive-descent parser of jinja2's grammar that either evaluates an expression, calling
 * chat_ops.c for what each construct computes, or, without a render, only checks it, so parse
 * time sees every construct of every branch. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "chat_expr_internal.h"

/* ---- the scanner -------------------------------------------------------------------------- */

val zt_chat_fail(ex *e, zt_status code, const char *fmt, ...) {
    if (e->st == ZT_OK) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (e->r && e->r->over_budget)
            snprintf(msg, sizeof msg, "%s", zt_chat_nomem(e->r));
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

bool zt_chat_is_name(const char *name, size_t n, const char *w) {
    return n == strlen(w) && memcmp(name, w, n) == 0;
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
        zt_chat_fail(e, ZT_ERR_FORMAT, "expected '%s'", o);
}

/* ---- string literals ---------------------------------------------------------------------- */

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
 * NULL; the decoded length, or -1 after zt_chat_fail(). */
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
            zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "string escape '\\N{...}' is not supported");
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
                zt_chat_fail(e, ZT_ERR_FORMAT, "truncated \\%c escape in a string", at[1]);
                return -1;
            }
            cp = cp * 16 + (unsigned)h;
        }
        if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            e->p = at;
            zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "string escape '%.*s' is not a Unicode character",
                         (int)(s - at), at);
            return -1;
        }
        if (cp == 0) { /* renders are C strings */
            e->p = at;
            zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "string escape '%.*s' (NUL) is not supported",
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
        return zt_chat_fail(e, ZT_ERR_FORMAT, "unterminated string");
    e->p = stop + 1;
    if (!escaped)
        return zt_chat_str(start, (size_t)(stop - start));
    char *out = e->r ? zt_chat_alloc(e->r, (size_t)(stop - start)) : NULL;
    if (e->r && !out)
        return zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
    const char *resume = e->p;
    long n = unescape(e, start, stop, out);
    if (n < 0)
        return (val){.k = V_UNDEF};
    e->p = resume;
    return out ? zt_chat_str(out, (size_t)n) : (val){.k = V_UNDEF};
}

/* ---- the grammar, as jinja2's parser: each level calls the one that binds tighter --------- */

static val expr(ex *e);
static val postfix(ex *e, val v);
static int arguments(ex *e, zt_chat_arg *args, bool kw);

/* The items of a list literal (or tuple) up to close, after its opening bracket; a trailing
 * comma is allowed, as in jinja2. */
static val list_literal(ex *e, const char *close) {
    val items[64];
    int n = 0;
    while (e->st == ZT_OK && !op(e, close)) {
        if (n == 64)
            return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "a list literal of more than 64 items");
        items[n++] = expr(e);
        if (!op(e, ",")) {
            expect(e, close);
            break;
        }
    }
    if (!e->r || e->st != ZT_OK)
        return (val){.k = V_UNDEF};
    char why[256];
    val out;
    if (!zt_chat_make_list(e->r, items, n, &out, why))
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "%s", why);
    return out;
}

/* (x) is x; (a, b) and () are tuples, which the subset holds as lists (ZT_CHAT_NOT_LIST). */
static val tuple(ex *e) {
    if (op(e, ")")) { /* () */
        char why[256];
        val out = {.k = V_UNDEF};
        if (e->r && !zt_chat_make_list(e->r, NULL, 0, &out, why))
            return zt_chat_fail(e, ZT_ERR_NOMEM, "%s", why);
        return e->r ? zt_chat_not_list(out) : out;
    }
    const char *at = e->p;
    val v = expr(e);
    if (op(e, ")"))
        return v;
    if (e->st != ZT_OK || !op(e, ","))
        return zt_chat_fail(e, ZT_ERR_FORMAT, "expected ')'");
    e->p = at; /* read again as a list's items */
    v = list_literal(e, ")");
    return e->r && e->st == ZT_OK ? zt_chat_not_list(v) : v;
}

/* {key: value, ...} with string keys. */
static val dict_literal(ex *e) {
    val keys[64], items[64];
    int n = 0;
    while (e->st == ZT_OK && !op(e, "}")) {
        if (n == 64)
            return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "a dict literal of more than 64 items");
        keys[n] = expr(e);
        expect(e, ":");
        items[n++] = expr(e);
        if (!op(e, ",")) {
            expect(e, "}");
            break;
        }
    }
    if (!e->r || e->st != ZT_OK)
        return (val){.k = V_UNDEF};
    char why[256];
    val out;
    if (!zt_chat_make_dict(e->r, keys, items, n, false, &out, why))
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "%s", why);
    return out;
}

static val primary(ex *e) {
    skip_ws(e);
    if (e->p >= e->end)
        return zt_chat_fail(e, ZT_ERR_FORMAT, "expression ends early");
    if (*e->p == '\'' || *e->p == '"')
        return string_literal(e);
    if (*e->p >= '0' && *e->p <= '9') {
        long long i = 0;
        while (e->p < e->end && *e->p >= '0' && *e->p <= '9')
            if (__builtin_mul_overflow(i, 10, &i) || __builtin_add_overflow(i, *e->p++ - '0', &i))
                return zt_chat_fail(e, ZT_ERR_UNSUPPORTED,
                                    "an integer beyond 64 bits is not supported");
        if (e->p < e->end && *e->p == '.')
            return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "floating-point numbers are not supported");
        return zt_chat_int(i);
    }
    if (op(e, "("))
        return tuple(e);
    if (op(e, "["))
        return list_literal(e, "]");
    if (op(e, "{"))
        return dict_literal(e);
    size_t n = peek_ident(e);
    if (n == 0)
        return zt_chat_fail(e, ZT_ERR_FORMAT, "unexpected '%c'", *e->p);
    const char *name = e->p;
    e->p += n;
    if (zt_chat_is_name(name, n, "true") || zt_chat_is_name(name, n, "True"))
        return zt_chat_bool(true);
    if (zt_chat_is_name(name, n, "false") || zt_chat_is_name(name, n, "False"))
        return zt_chat_bool(false);
    if (zt_chat_is_name(name, n, "none") || zt_chat_is_name(name, n, "None"))
        return (val){.k = V_NONE};
    if (zt_chat_is_name(name, n, "raise_exception") && op(e, "(")) {
        val msg = expr(e);
        expect(e, ")");
        if (e->r && e->st == ZT_OK)
            return zt_chat_fail(e, ZT_ERR_INVALID, "raise_exception: %.*s",
                                msg.k == V_STR ? (int)msg.n : 0, msg.k == V_STR ? msg.s : "");
        return (val){.k = V_UNDEF};
    }
    if (op(e, "(")) {
        zt_chat_arg args[ZT_CHAT_MAX_ARGS];
        int nargs = arguments(e, args, true);
        return nargs < 0 ? (val){.k = V_UNDEF} : zt_chat_call(e, name, n, args, nargs);
    }
    if (!e->r) /* a check knows `loop` by name, so its attributes are checked too */
        return zt_chat_is_name(name, n, "loop") ? (val){.k = V_LOOP} : (val){.k = V_UNDEF};
    return zt_chat_lookup(e, name, n);
}

/* The arguments of a call after its '(' up to its ')', at most ZT_CHAT_MAX_ARGS: positional
 * ones, then keyword ones (name=value), as Python's grammar orders them; keywords are refused
 * by name where kw is false (methods: Python's str methods take none that templates use). */
static int arguments(ex *e, zt_chat_arg *args, bool kw) {
    int n = 0;
    if (op(e, ")"))
        return 0;
    do {
        size_t w = peek_ident(e);
        const char *name = e->p, *after = e->p + w;
        while (after < e->end && (*after == ' ' || *after == '\t' || *after == '\n'))
            after++;
        zt_chat_arg a = {0};
        if (w && after < e->end && *after == '=' && (after + 1 >= e->end || after[1] != '=')) {
            if (!kw) {
                zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "keyword arguments ('%.*s=') are not "
                             "supported", (int)w, name);
                return -1;
            }
            a.kw = name, a.kw_len = w;
            e->p = after + 1;
        } else if (n && args[n - 1].kw) {
            zt_chat_fail(e, ZT_ERR_FORMAT, "a positional argument follows a keyword argument");
            return -1;
        }
        a.v = expr(e);
        if (n == ZT_CHAT_MAX_ARGS) {
            zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "a call with more than %d arguments",
                         ZT_CHAT_MAX_ARGS);
            return -1;
        }
        args[n++] = a;
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
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "method '%.*s' is not supported", (int)n, name);
    }
    zt_chat_arg a[ZT_CHAT_MAX_ARGS];
    int nargs = arguments(e, a, false);
    if (nargs < 0)
        return (val){.k = V_UNDEF};
    val args[ZT_CHAT_MAX_ARGS];
    for (int k = 0; k < nargs; k++)
        args[k] = a[k].v;
    if (nargs < m->min_args || nargs > m->max_args) {
        e->p = at;
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "method '%s' with %d argument%s is not "
                            "supported (the subset gives it %d to %d)", m->name, nargs,
                            nargs == 1 ? "" : "s", m->min_args, m->max_args);
    }
    if (!e->r || e->st != ZT_OK)
        return v;
    if (v.k == V_UNDEF)
        return zt_chat_undefined_error(e, v);
    char why[256];
    val out;
    if (!zt_chat_method_call(e->r, m, v, args, nargs, &out, why)) {
        e->p = name;
        return zt_chat_fail(e, ZT_ERR_INVALID, "%s", why);
    }
    return out;
}

/* x.name, x.name(...), x[key] and x[a:b:c] after a primary, as jinja2's parse_postfix. */
static val postfix(ex *e, val v) {
    for (;;) {
        if (e->st != ZT_OK)
            return v;
        if (op(e, ".")) {
            skip_ws(e);
            if (e->p < e->end && *e->p >= '0' && *e->p <= '9') { /* x.0 is jinja2's x[0] */
                long long i = 0;
                for (; e->p < e->end && *e->p >= '0' && *e->p <= '9'; e->p++)
                    i = i > (LLONG_MAX - 9) / 10 ? LLONG_MAX : i * 10 + (*e->p - '0');
                v = zt_chat_subscript(e, v, zt_chat_int(i));
                continue;
            }
            size_t n = peek_ident(e);
            const char *name = e->p;
            e->p += n;
            if (n == 0)
                return zt_chat_fail(e, ZT_ERR_FORMAT, "expected a name after '.'");
            v = op(e, "(") ? call_method(e, v, name, n) : zt_chat_attribute(e, v, name, n);
        } else if (op(e, "[")) {
            /* a key, or a slice: up to three optional parts split by ':' */
            val part[3] = {{.k = V_NONE}, {.k = V_NONE}, {.k = V_NONE}};
            int colons = 0;
            for (;;) {
                skip_ws(e);
                if (e->p < e->end && *e->p != ':' && *e->p != ']')
                    part[colons] = expr(e);
                else if (colons == 0 && e->p < e->end && *e->p == ']')
                    return zt_chat_fail(e, ZT_ERR_FORMAT, "expected a key or a slice in '[]'");
                if (e->st != ZT_OK || colons == 2 || !op(e, ":"))
                    break;
                colons++;
            }
            expect(e, "]");
            v = colons ? zt_chat_slice(e, v, part[0], part[1], part[2])
                       : zt_chat_subscript(e, v, part[0]);
        } else if (op(e, "(")) {
            return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "calling a value is not supported");
        } else {
            return v;
        }
    }
}

/* A filter's name after '|', and its arguments when a '(' follows. */
static val filter(ex *e, val v) {
    size_t n = peek_ident(e);
    const char *name = e->p;
    e->p += n;
    if (n == 0)
        return zt_chat_fail(e, ZT_ERR_FORMAT, "expected a filter's name after '|'");
    zt_chat_arg args[ZT_CHAT_MAX_ARGS];
    int nargs = op(e, "(") ? arguments(e, args, true) : 0;
    if (nargs < 0)
        return (val){.k = V_UNDEF};
    return zt_chat_filter(e, v, name, n, args, nargs);
}

/* x is [not] NAME, after its "is": with arguments in parentheses, or one value after the name
 * (`x is equalto 3`), as jinja2's parse_test reads a name, a string, a number, '(' '[' '{' that
 * is not "else", "or" or "and". */
static val test(ex *e, val v) {
    bool neg = word(e, "not");
    size_t n = peek_ident(e);
    const char *name = e->p;
    e->p += n;
    if (n == 0)
        return zt_chat_fail(e, ZT_ERR_FORMAT, "expected a test's name after 'is'");
    zt_chat_arg args[ZT_CHAT_MAX_ARGS];
    int nargs = 0;
    if (op(e, "(")) {
        nargs = arguments(e, args, true);
    } else {
        size_t w = peek_ident(e);
        bool keyword = (w == 4 && !memcmp(e->p, "else", 4)) || (w == 2 && !memcmp(e->p, "or", 2))
                       || (w == 3 && !memcmp(e->p, "and", 3));
        if (e->p < e->end && !keyword && (w || strchr("'\"[{0123456789", *e->p))) {
            args[0] = (zt_chat_arg){.v = postfix(e, primary(e))};
            nargs = 1;
        }
    }
    if (nargs < 0)
        return (val){.k = V_UNDEF};
    return zt_chat_test(e, v, name, n, args, nargs, neg);
}

/* Filters and tests after a value, as jinja2's parse_filter_expr: they bind tighter than any
 * operator ("a == b is none" tests b). */
static val filters(ex *e, val v) {
    for (;;) {
        if (e->st != ZT_OK)
            return v;
        if (op(e, "|"))
            v = filter(e, v);
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
        zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "the expression nests deeper than %d (parentheses, "
                     "brackets, '-' or 'not')", ZT_CHAT_MAX_NESTING);
        return false;
    }
    e->depth++;
    return true;
}

/* jinja2's parse_unary: a '-' or '+' takes the value after it without its filters and tests,
 * which then apply to the signed value: -x|length is (-x)|length. */
static val unary(ex *e, bool with_filter) {
    val v;
    if (op(e, "-") || op(e, "+")) {
        char o = e->p[-1];
        if (!deeper(e))
            return (val){.k = V_UNDEF};
        v = zt_chat_sign(e, o, unary(e, false));
        e->depth--;
    } else {
        v = postfix(e, primary(e));
    }
    return with_filter ? filters(e, v) : v;
}

static val mul(ex *e) {
    val v = unary(e, true);
    for (;;) {
        if (op(e, "//")) v = zt_chat_arith(e, "//", v, unary(e, true));
        else if (op(e, "*")) v = zt_chat_times(e, v, unary(e, true));
        else if (op(e, "%")) v = zt_chat_arith(e, "%", v, unary(e, true));
        else if (op(e, "/")) {
            e->p--;
            return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "'/' (true division, a float) is not "
                                "supported; use '//'");
        } else return v;
    }
}

/* '~' binds tighter than '+' and '-' in jinja2 (parse_concat sits between them). */
static val concat_expr(ex *e) {
    val v = mul(e);
    while (op(e, "~"))
        v = zt_chat_tilde(e, v, mul(e));
    return v;
}

static val add(ex *e) {
    val v = concat_expr(e);
    for (;;) {
        if (op(e, "+"))
            v = zt_chat_plus(e, v, concat_expr(e));
        else if (op(e, "-"))
            v = zt_chat_arith(e, "-", v, concat_expr(e));
        else
            return v;
    }
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

/* Comparisons chain as Python's: a < b < c is a < b and b < c, and stops at the first false. */
static val compare(ex *e) {
    val left = add(e), v = left;
    render *keep = e->r;
    const char *o;
    while ((o = compare_op(e))) {
        val right = add(e);
        if (e->r && e->st == ZT_OK) {
            bool b = zt_chat_compare(e, o, left, right);
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

/* Whether an inline 'if' follows at this level before the expression ends (at a ',', ':' or
 * closing bracket of the level, or its end): strings and brackets are skipped. */
static bool inline_if_ahead(const ex *e) {
    int depth = 0;
    for (const char *p = e->p; p < e->end;) {
        char c = *p;
        if (c == '\'' || c == '"') {
            for (p++; p < e->end && *p != c; p += *p == '\\' ? 2 : 1)
                ;
            p++;
        } else if (zt_chat_is_ident(c, true)) {
            const char *w = p;
            while (p < e->end && zt_chat_is_ident(*p, false))
                p++;
            if (depth == 0 && p - w == 2 && !memcmp(w, "if", 2))
                return true;
        } else {
            if (c == '(' || c == '[' || c == '{')
                depth++;
            else if (c == ')' || c == ']' || c == '}' || ((c == ',' || c == ':') && !depth))
                if (depth-- == 0)
                    return false;
            p++;
        }
    }
    return false;
}

/* a if c else b, as jinja2's parse_condexpr: c is evaluated first, then a or b (the other is
 * only checked); without an else, a false c gives undefined. So a is read once to be checked,
 * and again to be evaluated when c holds. */
static val cond_expr(ex *e) {
    const char *at = e->p;
    render *keep = e->r;
    e->r = NULL;
    val v = or_expr(e);
    e->r = keep;
    if (!word(e, "if"))
        return zt_chat_fail(e, ZT_ERR_FORMAT, "expected 'if'");
    bool c = zt_chat_truthy(or_expr(e));
    val b = {.k = V_UNDEF};
    if (word(e, "else")) {
        e->r = keep && !c ? keep : NULL;
        b = expr(e);
        e->r = keep;
    }
    if (!keep || e->st != ZT_OK)
        return v;
    if (!c)
        return b;
    const char *end = e->p;
    e->p = at;
    v = or_expr(e);
    e->p = end;
    return v;
}

static val expr(ex *e) {
    if (!deeper(e))
        return (val){.k = V_UNDEF};
    val v = inline_if_ahead(e) ? cond_expr(e) : or_expr(e);
    e->depth--;
    return v;
}

/* Evaluates (r NULL: checks) the expression of node d; the whole source must be used. */
val zt_chat_eval(const zt_chat_template *t, render *r, const node *d, zt_status *st) {
    ex e = {d->at, d->at + d->len, d->at, r, t, (size_t)(d->at - t->src), ZT_OK, 0};
    val v = expr(&e);
    skip_ws(&e);
    if (e.st == ZT_OK && e.p < e.end)
        zt_chat_fail(&e, ZT_ERR_UNSUPPORTED, "unexpected '%.*s'",
                     (int)(e.end - e.p > 20 ? 20 : e.end - e.p), e.p);
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
        zt_chat_fail(&e, ZT_ERR_UNSUPPORTED,
                     "recursive loops ('for ... recursive') are not supported");
    }
    if (e.st != ZT_OK || !(peek_ident(&e) == 2 && !memcmp(e.p, "if", 2)))
        return e.st; /* without a filter, the check of the whole expression says what is left */
    d->len = (size_t)(e.p - d->at);
    d->test = e.p + 2;
    d->test_len = (size_t)(e.end - d->test);
    return ZT_OK;
}
