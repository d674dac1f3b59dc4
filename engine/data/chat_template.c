/* The Jinja subset of chat templates (ztrain/chat_template.h).
 *
 * A template is cut once into nodes (text, {{ }}, and the statements), with jinja2's whitespace
 * rules as transformers configures them applied to the text: trim_blocks (the newline after a
 * block tag goes), lstrip_blocks (spaces before a block tag at a line's start go), "-" markers,
 * and the template's one trailing newline dropped. Expressions stay as source text and are
 * parsed each time they are evaluated by one recursive-descent parser that can also run without
 * evaluating, which is how parse time checks every expression of every branch. */
#define _POSIX_C_SOURCE 200809L
#include "ztrain/chat_template.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/json_util.h"

typedef enum { N_TEXT, N_OUT, N_SET, N_IF, N_ELIF, N_ELSE, N_ENDIF, N_FOR, N_ENDFOR } node_kind;

typedef struct {
    node_kind kind;
    const char *at;  /* text, or the expression's source */
    size_t len;
    char var[64];    /* the name a set or for binds */
    size_t offset;   /* where the tag starts in the template, for messages */
    int match;       /* if/elif/else: the next branch tag or endif; for: its endfor */
} node;

struct zt_chat_template {
    char *src;
    char source[512];
    char *bos, *eos;
    node *nodes;
    int n;
};

/* ---- values ------------------------------------------------------------------------------- */

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_STR, V_LIST, V_DICT, V_LOOP } vkind;

typedef struct {
    int index0, length;
} loop_state;

typedef struct {
    vkind k;
    bool b;
    long long i;
    const char *s;       /* V_STR: not NUL-terminated */
    size_t n;
    const cJSON *j;      /* V_LIST (its items lo..hi-1), V_DICT */
    int lo, hi;
    const loop_state *loop;
} val;

typedef struct {
    char name[64];
    val v;
} binding;

typedef struct arena_block {
    struct arena_block *next;
    char data[];
} arena_block;

/* One render: the output, the variables (frames for loops), and the strings it made. */
typedef struct {
    const zt_chat_template *t;
    char *out;
    size_t len, cap;
    binding vars[256];
    int n_vars;
    arena_block *arena;
    zt_status st;
} render;

static char *arena_alloc(render *r, size_t n) {
    arena_block *b = malloc(sizeof *b + n + 1);
    if (!b)
        return NULL;
    b->next = r->arena;
    r->arena = b;
    return b->data;
}

static val v_str(const char *s, size_t n) { return (val){.k = V_STR, .s = s, .n = n}; }
static val v_bool(bool b) { return (val){.k = V_BOOL, .b = b}; }
static val v_int(long long i) { return (val){.k = V_INT, .i = i}; }

static val from_json(const cJSON *j) {
    if (!j)
        return (val){.k = V_UNDEF};
    if (cJSON_IsString(j))
        return v_str(j->valuestring, strlen(j->valuestring));
    if (cJSON_IsBool(j))
        return v_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j))
        return v_int((long long)j->valuedouble);
    if (cJSON_IsArray(j))
        return (val){.k = V_LIST, .j = j, .lo = 0, .hi = cJSON_GetArraySize(j)};
    if (cJSON_IsObject(j))
        return (val){.k = V_DICT, .j = j};
    return (val){.k = V_NONE};
}

static bool truthy(val v) {
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

static bool is_ident(char c, bool first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (!first && c >= '0' && c <= '9');
}

/* The identifier at p (not consumed), its length in *n; 0 when none. */
static size_t peek_ident(ex *e) {
    skip_ws(e);
    size_t n = 0;
    while (e->p + n < e->end && is_ident(e->p[n], n == 0))
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
        return v_str(start, (size_t)(stop - start));
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
    return v_str(out, k);
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
    return v_str(s, a.n + b.n);
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
        if (n == 5 && memcmp(name, "first", 5) == 0) return v_bool(l->index0 == 0);
        if (n == 4 && memcmp(name, "last", 4) == 0) return v_bool(l->index0 == l->length - 1);
        if (n == 6 && memcmp(name, "length", 6) == 0) return v_int(l->length);
        return fail(e, ZT_ERR_UNSUPPORTED, "loop.%.*s is not supported", (int)n, name);
    }
    if (v.k != V_DICT)
        return (val){.k = V_UNDEF};
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)n, name);
    return from_json(cJSON_GetObjectItemCaseSensitive(v.j, key));
}

static val subscript(ex *e, val v, val key) {
    if (!e->r)
        return v;
    if (v.k == V_DICT && key.k == V_STR) {
        char k[128];
        snprintf(k, sizeof k, "%.*s", (int)key.n, key.s);
        return from_json(cJSON_GetObjectItemCaseSensitive(v.j, k));
    }
    if (v.k == V_LIST && key.k == V_INT) {
        long long i = key.i < 0 ? v.hi + key.i : v.lo + key.i;
        if (i < v.lo || i >= v.hi)
            return fail(e, ZT_ERR_INVALID, "list index %lld out of range", key.i);
        return from_json(cJSON_GetArrayItem(v.j, (int)i));
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
        return v_bool(true);
    if ((n == 5 && (!memcmp(name, "false", 5) || !memcmp(name, "False", 5))))
        return v_bool(false);
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
            if (equal(from_json(cJSON_GetArrayItem(hay.j, i)), needle))
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
        if (op(e, "==")) { val b = add(e); v = e->r ? v_bool(equal(v, b)) : v; }
        else if (op(e, "!=")) { val b = add(e); v = e->r ? v_bool(!equal(v, b)) : v; }
        else if (op(e, "<=") || op(e, ">=") || op(e, "<") || op(e, ">")) {
            char o = e->p[-1] == '=' ? e->p[-2] : e->p[-1];
            bool eq = e->p[-1] == '=';
            val b = add(e);
            if (!e->r)
                continue;
            if (v.k != V_INT || b.k != V_INT)
                return fail(e, ZT_ERR_INVALID, "ordering of values that are not integers");
            v = v_bool(o == '<' ? (eq ? v.i <= b.i : v.i < b.i) : (eq ? v.i >= b.i : v.i > b.i));
        } else if (word(e, "in")) {
            val b = add(e);
            v = e->r ? v_bool(contains(b, v)) : v;
        } else if (peek_ident(e) == 3 && !memcmp(e->p, "not", 3)) {
            const char *save = e->p;
            e->p += 3;
            if (!word(e, "in")) {
                e->p = save;
                return v;
            }
            val b = add(e);
            v = e->r ? v_bool(!contains(b, v)) : v;
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
            v = e->r ? v_bool(r != neg) : v;
        } else {
            return v;
        }
    }
}

static val not_expr(ex *e) {
    if (word(e, "not")) {
        val v = not_expr(e);
        return e->r ? v_bool(!truthy(v)) : v;
    }
    return compare(e);
}

/* and/or keep Python's short-circuit values; the right side is still parsed (checked) when it
 * is not evaluated. */
static val and_expr(ex *e) {
    val v = not_expr(e);
    while (word(e, "and")) {
        render *keep = e->r;
        if (keep && !truthy(v))
            e->r = NULL;
        val b = not_expr(e);
        e->r = keep;
        if (keep && truthy(v))
            v = b;
    }
    return v;
}

static val or_expr(ex *e) {
    val v = and_expr(e);
    while (word(e, "or")) {
        render *keep = e->r;
        if (keep && truthy(v))
            e->r = NULL;
        val b = and_expr(e);
        e->r = keep;
        if (keep && !truthy(v))
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
static val eval_node(const zt_chat_template *t, render *r, const node *d, zt_status *st) {
    ex e = {d->at, d->at + d->len, d->at, r, t, d->offset, ZT_OK};
    val v = expr(&e);
    skip_ws(&e);
    if (e.st == ZT_OK && e.p < e.end)
        fail(&e, ZT_ERR_UNSUPPORTED, "unexpected '%.*s'", (int)(e.end - e.p > 20 ? 20 : e.end - e.p),
             e.p);
    *st = e.st;
    return v;
}

/* ---- statements --------------------------------------------------------------------------- */

static zt_status tag_error(const zt_chat_template *t, size_t at, const char *fmt, const char *a,
                           int n) {
    return zt_error(ZT_ERR_UNSUPPORTED, "%s: chat_template at offset %zu: %s '%.*s'", t->source, at,
                    fmt, n, a);
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A statement tag's content into node d: its keyword, and the name and expression it holds. */
static zt_status statement(zt_chat_template *t, node *d, const char *s, const char *end) {
    while (s < end && is_space(*s))
        s++;
    while (end > s && is_space(end[-1]))
        end--;
    const char *w = s;
    while (s < end && is_ident(*s, s == w))
        s++;
    size_t n = (size_t)(s - w);
    static const struct {
        const char *word;
        node_kind kind;
    } words[] = {{"set", N_SET}, {"if", N_IF},       {"elif", N_ELIF}, {"else", N_ELSE},
                 {"endif", N_ENDIF}, {"for", N_FOR}, {"endfor", N_ENDFOR}};
    size_t k = 0;
    while (k < sizeof words / sizeof words[0] &&
           !(strlen(words[k].word) == n && memcmp(words[k].word, w, n) == 0))
        k++;
    if (k == sizeof words / sizeof words[0])
        return tag_error(t, d->offset, "statement", w, (int)n);
    d->kind = words[k].kind;
    while (s < end && is_space(*s))
        s++;
    if (d->kind == N_ELSE || d->kind == N_ENDIF || d->kind == N_ENDFOR) {
        if (s != end)
            return tag_error(t, d->offset, "unexpected text after the statement:", s,
                             (int)(end - s));
        return ZT_OK;
    }
    if (d->kind == N_SET || d->kind == N_FOR) {
        const char *v = s;
        while (s < end && is_ident(*s, s == v))
            s++;
        if (s == v || (size_t)(s - v) >= sizeof d->var)
            return tag_error(t, d->offset, "expected a variable name after", w, (int)n);
        snprintf(d->var, sizeof d->var, "%.*s", (int)(s - v), v);
        while (s < end && is_space(*s))
            s++;
        if (d->kind == N_SET && (s == end || *s != '='))
            return tag_error(t, d->offset, "only 'set NAME = expression' is supported, not",
                             w, (int)(end - w));
        if (d->kind == N_FOR && !(end - s > 3 && !memcmp(s, "in", 2) && is_space(s[2])))
            return tag_error(t, d->offset, "only 'for NAME in expression' is supported, not",
                             w, (int)(end - w));
        s += d->kind == N_SET ? 1 : 2;
    }
    d->at = s;
    d->len = (size_t)(end - s);
    return ZT_OK;
}

/* Cuts the template into nodes, applying the whitespace rules, and pairs the block tags. */
static zt_status cut(zt_chat_template *t) {
    size_t len = strlen(t->src);
    if (len && t->src[len - 1] == '\n') /* jinja2 drops one trailing newline */
        t->src[--len] = '\0';
    t->nodes = calloc(len + 1, sizeof *t->nodes);
    if (!t->nodes)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->source);
    const char *src = t->src, *p = src, *end = src + len;
    bool lstrip_next = false, trim_newline = false;
    while (p < end) {
        const char *open = p;
        while (open + 1 < end && !(open[0] == '{' && strchr("{%#", open[1])))
            open++;
        if (open + 1 >= end)
            open = end;
        /* the text before the tag */
        const char *a = p, *b = open;
        if (lstrip_next)
            while (a < b && is_space(*a))
                a++;
        else if (trim_newline && a < b && *a == '\n')
            a++;
        else if (trim_newline && b - a >= 2 && a[0] == '\r' && a[1] == '\n')
            a += 2;
        lstrip_next = trim_newline = false;
        if (open < end) {
            char kind = open[1];
            bool minus = open + 2 < end && open[2] == '-', plus = open + 2 < end && open[2] == '+';
            if (minus)
                while (b > a && is_space(b[-1]))
                    b--;
            else if (kind != '{' && !plus) {
                /* lstrip_blocks: spaces and tabs from a line's start to a block tag */
                const char *q = b;
                while (q > a && (q[-1] == ' ' || q[-1] == '\t'))
                    q--;
                if ((q == src) || (q > src && q[-1] == '\n'))
                    b = q;
            }
        }
        if (b > a)
            t->nodes[t->n++] = (node){.kind = N_TEXT, .at = a, .len = (size_t)(b - a)};
        if (open >= end)
            break;
        char kind = open[1];
        const char *close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
        const char *inner = open + 2 + (open + 2 < end && (open[2] == '-' || open[2] == '+'));
        const char *c = strstr(inner, close);
        if (!c)
            return zt_error(ZT_ERR_FORMAT, "%s: chat_template at offset %zu: the tag is not "
                            "closed with '%s'", t->source, (size_t)(open - src), close);
        const char *inner_end = c;
        if (inner_end > inner && inner_end[-1] == '-')
            inner_end--, lstrip_next = true;
        else if (kind != '{')
            trim_newline = true;
        p = c + 2;
        if (kind == '#')
            continue;
        node d = {.offset = (size_t)(open - src)};
        if (kind == '{') {
            d.kind = N_OUT, d.at = inner, d.len = (size_t)(inner_end - inner);
        } else {
            ZT_TRY(statement(t, &d, inner, inner_end));
        }
        t->nodes[t->n++] = d;
    }
    /* Pair the blocks: each if/elif/else points at its next branch or endif, a for at its
     * endfor. */
    int stack[64], depth = 0;
    for (int i = 0; i < t->n; i++) {
        node *d = &t->nodes[i];
        if (d->kind == N_IF || d->kind == N_FOR) {
            if (depth == 64)
                return zt_error(ZT_ERR_UNSUPPORTED, "%s: chat_template nests blocks deeper than "
                                "64", t->source);
            stack[depth++] = i;
            continue;
        }
        if (d->kind != N_ELIF && d->kind != N_ELSE && d->kind != N_ENDIF && d->kind != N_ENDFOR)
            continue;
        node_kind want = d->kind == N_ENDFOR ? N_FOR : N_IF;
        node *open = depth ? &t->nodes[stack[depth - 1]] : NULL;
        /* the innermost open block's current branch */
        int at = depth ? stack[depth - 1] : -1;
        while (at >= 0 && t->nodes[at].match > 0)
            at = t->nodes[at].match;
        if (!open || open->kind != want || (at >= 0 && t->nodes[at].kind == N_ELSE &&
                                             d->kind != N_ENDIF))
            return zt_error(ZT_ERR_FORMAT, "%s: chat_template at offset %zu: a misplaced "
                            "'%s'", t->source, d->offset, d->kind == N_ELIF ? "elif" :
                            d->kind == N_ELSE ? "else" : d->kind == N_ENDIF ? "endif" : "endfor");
        t->nodes[at].match = i;
        if (d->kind == N_ENDIF || d->kind == N_ENDFOR)
            depth--;
    }
    if (depth)
        return zt_error(ZT_ERR_FORMAT, "%s: chat_template at offset %zu: the block is never "
                        "closed", t->source, t->nodes[stack[depth - 1]].offset);
    /* Check every expression, taken branch or not. */
    for (int i = 0; i < t->n; i++) {
        const node *d = &t->nodes[i];
        if (d->kind == N_OUT || d->kind == N_SET || d->kind == N_IF || d->kind == N_ELIF ||
            d->kind == N_FOR) {
            zt_status st;
            eval_node(t, NULL, d, &st);
            ZT_TRY(st);
        }
    }
    return ZT_OK;
}

/* ---- running ------------------------------------------------------------------------------ */

static void emit(render *r, const char *s, size_t n) {
    if (r->st != ZT_OK)
        return;
    if (r->len + n + 1 > r->cap) {
        size_t cap = (r->cap + n + 1) * 2;
        char *o = realloc(r->out, cap);
        if (!o) {
            r->st = zt_error(ZT_ERR_NOMEM, "%s: out of memory", r->t->source);
            return;
        }
        r->out = o, r->cap = cap;
    }
    memcpy(r->out + r->len, s, n);
    r->len += n;
    r->out[r->len] = '\0';
}

static void bind(render *r, const char *name, val v, int frame) {
    for (int i = r->n_vars - 1; i >= frame; i--)
        if (strcmp(r->vars[i].name, name) == 0) {
            r->vars[i].v = v;
            return;
        }
    if (r->n_vars == (int)(sizeof r->vars / sizeof r->vars[0])) {
        r->st = zt_error(ZT_ERR_UNSUPPORTED, "%s: chat_template sets more than %d variables",
                         r->t->source, r->n_vars);
        return;
    }
    snprintf(r->vars[r->n_vars].name, sizeof r->vars[0].name, "%s", name);
    r->vars[r->n_vars++].v = v;
}

/* Runs nodes [i, stop) with variables set from `frame` on. */
static void run(render *r, int i, int stop, int frame) {
    const zt_chat_template *t = r->t;
    while (i < stop && r->st == ZT_OK) {
        const node *d = &t->nodes[i];
        zt_status st = ZT_OK;
        switch (d->kind) {
        case N_TEXT:
            emit(r, d->at, d->len);
            i++;
            break;
        case N_OUT: {
            val v = eval_node(t, r, d, &st);
            if (st == ZT_OK && v.k == V_STR)
                emit(r, v.s, v.n);
            else if (st == ZT_OK && v.k == V_INT) {
                char num[32];
                emit(r, num, (size_t)snprintf(num, sizeof num, "%lld", v.i));
            } else if (st == ZT_OK && v.k == V_BOOL)
                emit(r, v.b ? "True" : "False", v.b ? 4 : 5);
            else if (st == ZT_OK && v.k == V_NONE)
                emit(r, "None", 4);
            else if (st == ZT_OK && v.k != V_UNDEF)
                st = zt_error(ZT_ERR_UNSUPPORTED, "%s: chat_template at offset %zu: printing a "
                              "list or object is not supported", t->source, d->offset);
            i++;
            break;
        }
        case N_SET: {
            val v = eval_node(t, r, d, &st);
            if (st == ZT_OK)
                bind(r, d->var, v, frame);
            i++;
            break;
        }
        case N_IF: {
            int branch = i, taken = -1;
            while (taken < 0 && t->nodes[branch].kind != N_ENDIF && st == ZT_OK) {
                const node *b = &t->nodes[branch];
                if (b->kind == N_ELSE || truthy(eval_node(t, r, b, &st)))
                    taken = branch;
                else
                    branch = b->match;
            }
            int end = i;
            while (t->nodes[end].kind != N_ENDIF)
                end = t->nodes[end].match;
            if (st == ZT_OK && taken >= 0)
                run(r, taken + 1, t->nodes[taken].match, frame);
            i = end + 1;
            break;
        }
        case N_FOR: {
            val list = eval_node(t, r, d, &st);
            int end = d->match;
            if (st == ZT_OK && list.k != V_LIST)
                st = zt_error(ZT_ERR_INVALID, "%s: chat_template at offset %zu: 'for' over a "
                              "value that is not a list", t->source, d->offset);
            loop_state ls = {0, list.hi - list.lo};
            for (int k = list.lo; st == ZT_OK && r->st == ZT_OK && k < list.hi; k++) {
                int inner = r->n_vars;
                ls.index0 = k - list.lo;
                bind(r, d->var, from_json(cJSON_GetArrayItem(list.j, k)), inner);
                bind(r, "loop", (val){.k = V_LOOP, .loop = &ls}, inner);
                run(r, i + 1, end, inner);
                r->n_vars = inner; /* a loop's variables end with its iteration */
            }
            i = end + 1;
            break;
        }
        default: /* elif, else, endif, endfor are consumed by their block */
            i++;
            break;
        }
        if (st != ZT_OK && r->st == ZT_OK)
            r->st = st;
    }
}

zt_status zt_chat_template_render(const zt_chat_template *t, const cJSON *messages,
                                  bool add_generation_prompt, char **out) {
    *out = NULL;
    if (!cJSON_IsArray(messages))
        return zt_error(ZT_ERR_INVALID, "%s: messages must be a list", t->source);
    render *r = calloc(1, sizeof *r);
    if (!r)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->source);
    r->t = t;
    bind(r, "messages", from_json(messages), 0);
    bind(r, "bos_token", v_str(t->bos, strlen(t->bos)), 0);
    bind(r, "eos_token", v_str(t->eos, strlen(t->eos)), 0);
    bind(r, "add_generation_prompt", v_bool(add_generation_prompt), 0);
    emit(r, "", 0);
    run(r, 0, t->n, 0);
    zt_status s = r->st;
    while (r->arena) {
        arena_block *b = r->arena;
        r->arena = b->next;
        free(b);
    }
    if (s == ZT_OK)
        *out = r->out;
    else
        free(r->out);
    free(r);
    return s;
}

zt_status zt_chat_template_parse(const char *text, const char *source, const char *bos,
                                 const char *eos, zt_chat_template **out) {
    *out = NULL;
    zt_chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", source);
    snprintf(t->source, sizeof t->source, "%s", source);
    t->src = strdup(text);
    t->bos = strdup(bos ? bos : "");
    t->eos = strdup(eos ? eos : "");
    zt_status s = t->src && t->bos && t->eos ? cut(t)
                                             : zt_error(ZT_ERR_NOMEM, "%s: out of memory", source);
    if (s != ZT_OK) {
        zt_chat_template_destroy(t);
        return s;
    }
    *out = t;
    return ZT_OK;
}

const char *zt_chat_template_eos(const zt_chat_template *t) { return t->eos; }

void zt_chat_template_destroy(zt_chat_template *t) {
    if (!t)
        return;
    free(t->src);
    free(t->bos);
    free(t->eos);
    free(t->nodes);
    free(t);
}

/* A special token as tokenizer_config.json gives it: a string, or {"content": ...}. */
static const char *token_text(const cJSON *root, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : "";
}

zt_status zt_chat_template_load(const char *path, zt_chat_template **out) {
    *out = NULL;
    cJSON *root;
    ZT_TRY(zt_json_load_file(path, &root));
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    const char *text = cJSON_IsString(ct) ? ct->valuestring : NULL;
    if (cJSON_IsArray(ct)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, ct) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0 &&
                cJSON_IsString(tmpl))
                text = tmpl->valuestring;
        }
    }
    zt_status s;
    char source[600];
    snprintf(source, sizeof source, "%s", path);
    if (!text)
        s = zt_error(ZT_ERR_FORMAT, "%s: no \"chat_template\" string (nor a list with one "
                     "named \"default\")", path);
    else
        s = zt_chat_template_parse(text, source, token_text(root, "bos_token"),
                                   token_text(root, "eos_token"), out);
    cJSON_Delete(root);
    return s;
}
