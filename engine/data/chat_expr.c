/* Expressions of the chat templates' Jinja subset (ztrain/chat_template.h): values, and one
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

val zt_chat_str(const char *s, size_t n) { return (val){.k = V_STR, .s = s, .n = n}; }
val zt_chat_bool(bool b) { return (val){.k = V_BOOL, .b = b}; }
static val v_int(long long i) { return (val){.k = V_INT, .i = i}; }

val zt_chat_from_json(const cJSON *j) {
    if (!j)
        return (val){.k = V_UNDEF};
    if (cJSON_IsString(j))
        return zt_chat_str(j->valuestring, strlen(j->valuestring));
    if (cJSON_IsBool(j))
        return zt_chat_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j))
        return v_int((long long)j->valuedouble);
    if (cJSON_IsArray(j))
        return (val){.k = V_LIST, .j = j, .lo = 0, .hi = cJSON_GetArraySize(j)};
    if (cJSON_IsObject(j))
        return (val){.k = V_DICT, .j = j};
    return (val){.k = V_NONE};
}

bool zt_chat_truthy(val v) {
    switch (v.k) {
    case V_BOOL: return v.b;
    case V_INT: return v.i != 0;
    case V_STR: return v.n > 0;
    case V_LIST: return v.hi > v.lo;
    case V_DICT: return v.j->child != NULL;
    case V_LOOP: return true;
    default: return false;
    }
}

static bool equal(val a, val b) {
    if (a.k == V_STR && b.k == V_STR)
        return a.n == b.n && memcmp(a.s, b.s, a.n) == 0;
    if ((a.k == V_INT || a.k == V_BOOL) && (b.k == V_INT || b.k == V_BOOL))
        return (a.k == V_INT ? a.i : a.b) == (b.k == V_INT ? b.i : b.b);
    if (a.k == V_NONE || b.k == V_NONE || a.k == V_UNDEF || b.k == V_UNDEF)
        return a.k == b.k;
    return false;
}

/* ---- expressions -------------------------------------------------------------------------- */

typedef struct {
    const char *p, *end, *base;
    render *r;       /* NULL: check only, nothing is evaluated */
    const zt_chat_template *t;
    size_t offset;   /* of the expression in the template */
    zt_status st;
} ex;

static val fail(ex *e, zt_status code, const char *fmt, ...) {
    if (e->st == ZT_OK) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        e->st = zt_error(code, "%s: chat_template at offset %zu: %s", e->t->source,
                         e->offset + (size_t)(e->p - e->base), msg);
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
    if (!escaped || !e->r)
        return zt_chat_str(start, (size_t)(stop - start));
    char *out = arena_alloc(e->r, (size_t)(stop - start));
    if (!out)
        return fail(e, ZT_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (const char *s = start; s < stop; s++) {
        if (*s != '\\') {
            out[k++] = *s;
            continue;
        }
        s++;
        switch (*s) {
        case 'n': out[k++] = '\n'; break;
        case 't': out[k++] = '\t'; break;
        case 'r': out[k++] = '\r'; break;
        case '\\': case '\'': case '"': out[k++] = *s; break;
        default: return fail(e, ZT_ERR_UNSUPPORTED, "string escape '\\%c' is not supported", *s);
        }
    }
    return zt_chat_str(out, k);
}

static val lookup(ex *e, const char *name, size_t n) {
    render *r = e->r;
    for (int i = r->n_vars - 1; i >= 0; i--)
        if (strlen(r->vars[i].name) == n && memcmp(r->vars[i].name, name, n) == 0)
            return r->vars[i].v;
    return (val){.k = V_UNDEF};
}

static val concat(ex *e, val a, val b) {
    if (!e->r)
        return (val){.k = V_UNDEF};
    if (a.k != V_STR || b.k != V_STR)
        return fail(e, ZT_ERR_INVALID, "'+' or '~' of values that are not both strings");
    char *s = arena_alloc(e->r, a.n + b.n);
    if (!s)
        return fail(e, ZT_ERR_NOMEM, "out of memory");
    memcpy(s, a.s, a.n);
    memcpy(s + a.n, b.s, b.n);
    return zt_chat_str(s, a.n + b.n);
}

static val strip(ex *e, val v, bool left, bool right) {
    if (!e->r)
        return v;
    if (v.k != V_STR)
        return fail(e, ZT_ERR_INVALID, "trim or strip of a value that is not a string");
    static const char ws[] = " \t\n\r\v\f";
    while (left && v.n && strchr(ws, v.s[0]))
        v.s++, v.n--;
    while (right && v.n && strchr(ws, v.s[v.n - 1]))
        v.n--;
    return v;
}

static val attribute(ex *e, val v, const char *name, size_t n) {
    if (!e->r)
        return v;
    if (v.k == V_LOOP) {
        const loop_state *l = v.loop;
        if (n == 6 && memcmp(name, "index0", 6) == 0) return v_int(l->index0);
        if (n == 5 && memcmp(name, "index", 5) == 0) return v_int(l->index0 + 1);
        if (n == 5 && memcmp(name, "first", 5) == 0) return zt_chat_bool(l->index0 == 0);
        if (n == 4 && memcmp(name, "last", 4) == 0) return zt_chat_bool(l->index0 == l->length - 1);
        if (n == 6 && memcmp(name, "length", 6) == 0) return v_int(l->length);
        return fail(e, ZT_ERR_UNSUPPORTED, "loop.%.*s is not supported", (int)n, name);
    }
    if (v.k != V_DICT)
        return (val){.k = V_UNDEF};
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)n, name);
    return zt_chat_from_json(cJSON_GetObjectItemCaseSensitive(v.j, key));
}

static val subscript(ex *e, val v, val key) {
    if (!e->r)
        return v;
    if (v.k == V_DICT && key.k == V_STR) {
        char k[128];
        snprintf(k, sizeof k, "%.*s", (int)key.n, key.s);
        return zt_chat_from_json(cJSON_GetObjectItemCaseSensitive(v.j, k));
    }
    if (v.k == V_LIST && key.k == V_INT) {
        long long i = key.i < 0 ? v.hi + key.i : v.lo + key.i;
        if (i < v.lo || i >= v.hi)
            return fail(e, ZT_ERR_INVALID, "list index %lld out of range", key.i);
        return zt_chat_from_json(cJSON_GetArrayItem(v.j, (int)i));
    }
    return fail(e, ZT_ERR_INVALID, "subscript of a value that is not a list or object");
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
    if (n == 4 && memcmp(name, "trim", 4) == 0)
        return strip(e, v, true, true);
    if (n == 6 && memcmp(name, "length", 6) == 0) {
        if (!e->r)
            return v;
        if (v.k == V_LIST) return v_int(v.hi - v.lo);
        if (v.k == V_STR) return v_int((long long)v.n);
        return fail(e, ZT_ERR_INVALID, "length of a value that is neither a list nor a string");
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
            i = i * 10 + (*e->p++ - '0');
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
    if ((n == 4 && (!memcmp(name, "true", 4) || !memcmp(name, "True", 4))))
        return zt_chat_bool(true);
    if ((n == 5 && (!memcmp(name, "false", 5) || !memcmp(name, "False", 5))))
        return zt_chat_bool(false);
    if ((n == 4 && (!memcmp(name, "none", 4) || !memcmp(name, "None", 4))))
        return (val){.k = V_NONE};
    if (n == 15 && memcmp(name, "raise_exception", 15) == 0) {
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
    return e->r ? lookup(e, name, n) : (val){.k = V_UNDEF};
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
                bool l = n == 5 && !memcmp(name, "strip", 5), ls = n == 6 && !memcmp(name, "lstrip", 6),
                     rs = n == 6 && !memcmp(name, "rstrip", 6);
                if (!l && !ls && !rs)
                    return fail(e, ZT_ERR_UNSUPPORTED, "method '%.*s' is not supported", (int)n,
                                name);
                v = strip(e, v, l || ls, l || rs);
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
            } else if (e->r) {
                if (v.k != V_LIST)
                    return fail(e, ZT_ERR_INVALID, "slice of a value that is not a list");
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

static val unary(ex *e) {
    if (op(e, "-")) {
        val v = unary(e);
        if (e->r && v.k != V_INT)
            return fail(e, ZT_ERR_INVALID, "'-' of a value that is not an integer");
        return e->r ? v_int(-v.i) : v;
    }
    return postfix(e);
}

static val arith(ex *e, char o, val a, val b) {
    if (!e->r)
        return a;
    if (a.k != V_INT || b.k != V_INT)
        return fail(e, ZT_ERR_INVALID, "'%c' of values that are not integers", o);
    if ((o == '/' || o == '%') && b.i == 0)
        return fail(e, ZT_ERR_INVALID, "division by zero");
    if (o == '/')
        return fail(e, ZT_ERR_UNSUPPORTED, "'/' (a float) is not supported; use '//'");
    long long q = a.i / b.i, m = a.i % b.i;
    if (m != 0 && ((m < 0) != (b.i < 0))) /* Python's floor semantics */
        q--, m += b.i;
    return v_int(o == '*' ? a.i * b.i : o == '%' ? m : q);
}

static val mul(ex *e) {
    val v = unary(e);
    for (;;) {
        if (op(e, "//")) v = arith(e, 'q', v, unary(e));
        else if (op(e, "*")) v = arith(e, '*', v, unary(e));
        else if (op(e, "/")) v = arith(e, '/', v, unary(e));
        else if (op(e, "%")) v = arith(e, '%', v, unary(e));
        else return v;
    }
}

static val add(ex *e) {
    val v = mul(e);
    for (;;) {
        if (op(e, "+")) {
            val b = mul(e);
            if (e->r && v.k == V_INT && b.k == V_INT)
                v = v_int(v.i + b.i);
            else
                v = concat(e, v, b);
        } else if (op(e, "-")) {
            val b = mul(e);
            if (e->r && (v.k != V_INT || b.k != V_INT))
                return fail(e, ZT_ERR_INVALID, "'-' of values that are not integers");
            v = e->r ? v_int(v.i - b.i) : v;
        } else if (op(e, "~")) {
            v = concat(e, v, mul(e));
        } else {
            return v;
        }
    }
}

static bool contains(val hay, val needle) {
    if (hay.k == V_STR && needle.k == V_STR) {
        for (size_t i = 0; needle.n <= hay.n && i + needle.n <= hay.n; i++)
            if (memcmp(hay.s + i, needle.s, needle.n) == 0)
                return true;
        return false;
    }
    if (hay.k == V_LIST) {
        for (int i = hay.lo; i < hay.hi; i++)
            if (equal(zt_chat_from_json(cJSON_GetArrayItem(hay.j, i)), needle))
                return true;
        return false;
    }
    if (hay.k == V_DICT && needle.k == V_STR) {
        char k[128];
        snprintf(k, sizeof k, "%.*s", (int)needle.n, needle.s);
        return cJSON_GetObjectItemCaseSensitive(hay.j, k) != NULL;
    }
    return false;
}

static val compare(ex *e) {
    val v = add(e);
    for (;;) {
        if (op(e, "==")) { val b = add(e); v = e->r ? zt_chat_bool(equal(v, b)) : v; }
        else if (op(e, "!=")) { val b = add(e); v = e->r ? zt_chat_bool(!equal(v, b)) : v; }
        else if (op(e, "<=") || op(e, ">=") || op(e, "<") || op(e, ">")) {
            char o = e->p[-1] == '=' ? e->p[-2] : e->p[-1];
            bool eq = e->p[-1] == '=';
            val b = add(e);
            if (!e->r)
                continue;
            if (v.k != V_INT || b.k != V_INT)
                return fail(e, ZT_ERR_INVALID, "ordering of values that are not integers");
            v = zt_chat_bool(o == '<' ? (eq ? v.i <= b.i : v.i < b.i) : (eq ? v.i >= b.i : v.i > b.i));
        } else if (word(e, "in")) {
            val b = add(e);
            v = e->r ? zt_chat_bool(contains(b, v)) : v;
        } else if (peek_ident(e) == 3 && !memcmp(e->p, "not", 3)) {
            const char *save = e->p;
            e->p += 3;
            if (!word(e, "in")) {
                e->p = save;
                return v;
            }
            val b = add(e);
            v = e->r ? zt_chat_bool(!contains(b, v)) : v;
        } else if (word(e, "is")) {
            bool neg = word(e, "not");
            size_t n = peek_ident(e);
            const char *t = e->p;
            e->p += n;
            bool r;
            if (n == 7 && !memcmp(t, "defined", 7)) r = v.k != V_UNDEF;
            else if (n == 4 && !memcmp(t, "none", 4)) r = v.k == V_NONE;
            else if (n == 6 && !memcmp(t, "string", 6)) r = v.k == V_STR;
            else return fail(e, ZT_ERR_UNSUPPORTED, "test 'is %.*s' is not supported", (int)n, t);
            v = e->r ? zt_chat_bool(r != neg) : v;
        } else {
            return v;
        }
    }
}

static val not_expr(ex *e) {
    if (word(e, "not")) {
        val v = not_expr(e);
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
    val v = or_expr(e);
    if (peek_ident(e) == 2 && !memcmp(e->p, "if", 2))
        return fail(e, ZT_ERR_UNSUPPORTED, "inline 'if ... else' is not supported");
    return v;
}

/* Evaluates (r NULL: checks) the expression of node d; the whole source must be used. */
val zt_chat_eval(const zt_chat_template *t, render *r, const node *d, zt_status *st) {
    ex e = {d->at, d->at + d->len, d->at, r, t, d->offset, ZT_OK};
    val v = expr(&e);
    skip_ws(&e);
    if (e.st == ZT_OK && e.p < e.end)
        fail(&e, ZT_ERR_UNSUPPORTED, "unexpected '%.*s'", (int)(e.end - e.p > 20 ? 20 : e.end - e.p),
             e.p);
    *st = e.st;
    return v;
}

