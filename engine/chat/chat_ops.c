/* What the chat templates' expressions compute (chat_expr_internal.h): variables, attributes,
 * subscripts and slices, and the operators, each as jinja2 and Python compute
 * them, on the values the reader (chat_expr.c) has evaluated. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "chat_expr_internal.h"

/* A number for arithmetic and indices: an integer, or a bool as Python's 1 and 0. */
static bool as_int(val v, long long *i) {
    if (v.k == V_INT || v.k == V_BOOL) {
        *i = v.k == V_INT ? v.i : v.b;
        return true;
    }
    return false;
}

val zt_chat_undefined(ex *e, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    char *s = zt_chat_alloc(e->r, len);
    if (!s)
        return zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
    memcpy(s, msg, len);
    s[len] = '\0';
    return (val){.k = V_UNDEF, .s = s};
}

val zt_chat_undefined_error(ex *e, val v) {
    return zt_chat_fail(e, ZT_ERR_INVALID, "%s", v.s ? v.s : "a value is undefined");
}

val zt_chat_lookup(ex *e, const char *name, size_t n) {
    render *r = e->r;
    for (int i = r->n_vars - 1; i >= 0; i--)
        if (strlen(r->vars[i].name) == n && memcmp(r->vars[i].name, name, n) == 0)
            return r->vars[i].v;
    return zt_chat_undefined(e, "'%.*s' is undefined", (int)n, name);
}

/* '+' and '~' of two strings. */
static val concat(ex *e, val a, val b) {
    char *s = zt_chat_alloc(e->r, a.n + b.n);
    if (!s)
        return zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
    memcpy(s, a.s, a.n);
    memcpy(s + a.n, b.s, b.n);
    return zt_chat_str(s, a.n + b.n);
}

val zt_chat_tilde(ex *e, val a, val b) {
    if (!e->r)
        return a;
    char na[32], nb[32], why[256];
    val ta = {.k = V_STR}, tb = {.k = V_STR};
    if (!zt_chat_print(e->r, a, na, &ta.s, &ta.n, why) ||
        !zt_chat_print(e->r, b, nb, &tb.s, &tb.n, why))
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "'~': %s", why);
    return concat(e, ta, tb);
}

/* The loop variable's attributes; in a check (no loop) only whether the name is one. */
static val loop_attribute(ex *e, const loop_state *l, const char *name, size_t n) {
    static const char *const names[] = {"index0", "index", "revindex0", "revindex", "first",
                                        "last", "length", "depth0", "depth", "previtem",
                                        "nextitem"};
    size_t k = 0;
    while (k < sizeof names / sizeof names[0] && !zt_chat_is_name(name, n, names[k]))
        k++;
    if (k == sizeof names / sizeof names[0])
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "loop.%.*s is not supported", (int)n, name);
    if (!l)
        return (val){.k = V_UNDEF};
    int i = l->index0, len = l->length;
    switch (k) {
    case 0: return zt_chat_int(i);
    case 1: return zt_chat_int(i + 1);
    case 2: return zt_chat_int(len - i - 1);
    case 3: return zt_chat_int(len - i);
    case 4: return zt_chat_bool(i == 0);
    case 5: return zt_chat_bool(i == len - 1);
    case 6: return zt_chat_int(len);
    case 7: return zt_chat_int(0);
    case 8: return zt_chat_int(1);
    case 9:
        return i > 0 ? l->items[i - 1] : zt_chat_undefined(e, "there is no previous item");
    default:
        return i + 1 < len ? l->items[i + 1] : zt_chat_undefined(e, "there is no next item");
    }
}

/* Python's methods of str, dict and list, which jinja2's sandboxed getattr finds before a
 * dict's key of the same name: those that modify a dict or list are unsafe there and give an
 * undefined value, the others a bound method (truthy, printed with its address), which the
 * subset does not hold. */
static const char *const STR_METHODS[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find",
    "format", "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit",
    "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper",
    "join", "ljust", "lower", "lstrip", "maketrans", "partition", "removeprefix",
    "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip",
    "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper",
    "zfill", NULL};
static const char *const DICT_METHODS[] = {"copy", "fromkeys", "get", "items", "keys", "values",
                                           NULL};
static const char *const DICT_MUTATORS[] = {"clear", "pop", "popitem", "setdefault", "update",
                                            NULL};
static const char *const LIST_METHODS[] = {"copy", "count", "index", NULL};
static const char *const LIST_MUTATORS[] = {"append", "clear", "extend", "insert", "pop",
                                            "remove", "reverse", "sort", NULL};
static const char *const GENERATOR_METHODS[] = {"close", "send", "throw", NULL};
static const char *const TUPLE_METHODS[] = {"count", "index", NULL};
static const char *const VIEW_METHODS[] = {"isdisjoint", "mapping", NULL};

static bool named(const char *const *names, const char *name, size_t n) {
    for (; *names; names++)
        if (strlen(*names) == n && memcmp(*names, name, n) == 0)
            return true;
    return false;
}

val zt_chat_attribute(ex *e, val v, const char *name, size_t n) {
    if (v.k == V_LOOP)
        return loop_attribute(e, v.loop, name, n);
    if (!e->r)
        return v;
    if (v.k == V_UNDEF)
        return zt_chat_undefined_error(e, v);
    if (zt_chat_is_generator(v)) /* its methods and gi_ attributes, which the subset lacks */
        return named(GENERATOR_METHODS, name, n) || (n > 3 && !memcmp(name, "gi_", 3))
                   ? zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "'.%.*s' of a generator is not "
                                  "supported", (int)n, name)
                   : zt_chat_undefined(e, "'generator object' has no attribute '%.*s'", (int)n,
                                       name);
    /* a tuple's or dict view's own methods, which the subset lacks; its other names (a list's
     * append, ...) are undefined, as jinja2 finds no such attribute */
    if (zt_chat_is_tuple(v) || zt_chat_view_of(v))
        return named(zt_chat_is_tuple(v) ? TUPLE_METHODS : VIEW_METHODS, name, n)
                   ? zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "'.%.*s' of a %s is not supported",
                                  (int)n, name, zt_chat_type_name(v))
                   : zt_chat_undefined(e, "'%s object' has no attribute '%.*s'",
                                       zt_chat_type_name(v), (int)n, name);
    const char *type = v.k == V_STR ? "str" : v.k == V_DICT ? "dict" : v.k == V_LIST ? "list"
                                                                                   : NULL;
    if ((v.k == V_DICT && named(DICT_MUTATORS, name, n)) ||
        (v.k == V_LIST && named(LIST_MUTATORS, name, n)))
        return zt_chat_undefined(e, "access to attribute '%.*s' of '%s' object is unsafe.",
                                 (int)n, name, type);
    if ((v.k == V_STR && named(STR_METHODS, name, n)) ||
        (v.k == V_DICT && named(DICT_METHODS, name, n)) ||
        (v.k == V_LIST && named(LIST_METHODS, name, n)))
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "'.%.*s' without a call is a bound method "
                            "of the %s in jinja2, which the subset does not hold: call it%s%.*s%s",
                            (int)n, name, type,
                            v.k == V_DICT ? " (jinja2 finds the method before a key of that "
                                            "name), or write x['" : "",
                            v.k == V_DICT ? (int)n : 0, name,
                            v.k == V_DICT ? "'] for the key" : "");
    if (v.k == V_DICT || v.k == V_NS) {
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)n, name);
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(v.j, key);
        if (j)
            return zt_chat_from_json(j);
    }
    return zt_chat_undefined(e, "'%s object' has no attribute '%.*s'", zt_chat_type_name(v),
                             (int)n, name);
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

val zt_chat_subscript(ex *e, val v, val key) {
    if (!e->r)
        return v;
    if (v.k == V_UNDEF)
        return zt_chat_undefined_error(e, v);
    const char *type = zt_chat_type_name(v);
    /* jinja2's getitem: x[key], and when that fails, x's attribute of that name (ns['a'] is
     * ns.a, a dict's missing key its method of that name) */
    if (key.k == V_STR) {
        char k[128];
        snprintf(k, sizeof k, "%.*s", (int)key.n, key.s);
        const cJSON *j = v.k == V_DICT ? cJSON_GetObjectItemCaseSensitive(v.j, k) : NULL;
        return j ? zt_chat_from_json(j) : zt_chat_attribute(e, v, key.s, key.n);
    }
    /* a generator or dict view has no items by index: Python's TypeError, which jinja2's
     * getitem makes undefined */
    long long i;
    bool indexed = v.k == V_LIST && !zt_chat_is_generator(v) && !zt_chat_view_of(v);
    if ((indexed || v.k == V_STR) && as_int(key, &i)) {
        long long len = v.k == V_LIST ? v.count : zt_chat_items(v, NULL);
        long long at = i < 0 ? len + i : i;
        if (at < 0 || at >= len)
            return zt_chat_undefined(e, "%s object has no element %lld", type, i);
        if (v.k == V_LIST)
            return zt_chat_list_item(v, (int)at);
        size_t from = cp_offset(v, at);
        return zt_chat_str(v.s + from, cp_offset((val){.s = v.s + from, .n = v.n - from}, 1));
    }
    char num[32];
    return zt_chat_undefined(e, "%s object has no element %s", type, repr(key, num));
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

val zt_chat_slice(ex *e, val v, val a, val b, val c) {
    if (!e->r || e->st != ZT_OK)
        return v;
    if (v.k == V_UNDEF)
        return zt_chat_undefined_error(e, v);
    /* jinja2 compiles a slice to Python's own, whose TypeError it does not catch */
    if (zt_chat_is_generator(v) || zt_chat_view_of(v))
        return zt_chat_fail(e, ZT_ERR_INVALID, "'%s' object is not subscriptable",
                            zt_chat_type_name(v));
    long long step = 1, len = v.k == V_LIST ? v.count : v.k == V_STR ? zt_chat_items(v, NULL) : 0;
    bool ok = v.k == V_LIST || v.k == V_STR;
    val bound[3] = {a, b, c};
    for (int k = 0; k < 3; k++)
        ok = ok && (bound[k].k == V_NONE || bound[k].k == V_INT || bound[k].k == V_BOOL);
    if (!ok) {
        char n0[32], n1[32], n2[32];
        return zt_chat_undefined(e, "%s object has no element slice(%s, %s, %s)",
                                 zt_chat_type_name(v), repr(a, n0), repr(b, n1), repr(c, n2));
    }
    if (c.k != V_NONE && as_int(c, &step) && step == 0)
        return zt_chat_fail(e, ZT_ERR_INVALID, "slice step cannot be zero");
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
        return zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
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

/* jinja2's integers are unbounded: a result beyond 64 bits is refused, never wrapped. */
val zt_chat_arith(ex *e, const char *o, val a, val b) {
    if (!e->r || e->st != ZT_OK)
        return a;
    if (a.k == V_UNDEF || b.k == V_UNDEF)
        return zt_chat_undefined_error(e, a.k == V_UNDEF ? a : b);
    long long x, y, z;
    if ((a.k == V_FLOAT && a.b) || (b.k == V_FLOAT && b.b)) {
        val big = a.k == V_FLOAT && a.b ? a : b;
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "'%s' of an integer beyond 64 bits (%.*s) is "
                            "not supported: jinja2 computes it exactly, the subset in 64 bits", o,
                            big.s ? (int)big.n : 3, big.s ? big.s : "...");
    }
    if (!as_int(a, &x) || !as_int(b, &y))
        return zt_chat_fail(e, ZT_ERR_INVALID, "'%s' of a %s and a %s, not two integers", o,
                            zt_chat_type_name(a), zt_chat_type_name(b));
    bool over = false;
    switch (o[0]) {
    case '+': over = __builtin_add_overflow(x, y, &z); break;
    case '-': over = __builtin_sub_overflow(x, y, &z); break;
    case '*': over = __builtin_mul_overflow(x, y, &z); break;
    default: { /* "//" and "%" */
        if (y == 0)
            return zt_chat_fail(e, ZT_ERR_INVALID, "integer division or modulo by zero");
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
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED,
                            "'%s' gives an integer beyond 64 bits (%lld %s %lld)", o, x, o, y);
    return zt_chat_int(z);
}

val zt_chat_sign(ex *e, char o, val v) {
    if (!e->r || e->st != ZT_OK)
        return v;
    if (v.k == V_UNDEF)
        return zt_chat_undefined_error(e, v);
    if (v.k != V_INT && v.k != V_BOOL && v.k != V_FLOAT)
        return zt_chat_fail(e, ZT_ERR_INVALID, "bad operand type for unary %c: '%s'", o,
                            zt_chat_type_name(v));
    return zt_chat_arith(e, o == '-' ? "-" : "+", zt_chat_int(0), v);
}

val zt_chat_times(ex *e, val a, val b) {
    long long k;
    if (!e->r || e->st != ZT_OK || !((a.k == V_STR && as_int(b, &k)) ||
                                     (b.k == V_STR && as_int(a, &k))))
        return zt_chat_arith(e, "*", a, b);
    val s = a.k == V_STR ? a : b;
    if (k <= 0 || s.n == 0)
        return zt_chat_str("", 0);
    if ((unsigned long long)k > (1ull << 30) / s.n)
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "'*' makes a string over 1 GiB");
    char *out = zt_chat_alloc(e->r, s.n * (size_t)k);
    if (!out)
        return zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
    for (long long i = 0; i < k; i++)
        memcpy(out + (size_t)i * s.n, s.s, s.n);
    return zt_chat_str(out, s.n * (size_t)k);
}

val zt_chat_plus(ex *e, val a, val b) {
    if (!e->r || e->st != ZT_OK)
        return a;
    bool num_a = a.k == V_INT || a.k == V_BOOL || a.k == V_FLOAT;
    bool num_b = b.k == V_INT || b.k == V_BOOL || b.k == V_FLOAT;
    if (num_a && num_b) /* a float: refused there */
        return zt_chat_arith(e, "+", a, b);
    if (a.k == V_UNDEF || b.k == V_UNDEF)
        return zt_chat_undefined_error(e, a.k == V_UNDEF ? a : b);
    if (a.k == V_STR && b.k == V_STR)
        return concat(e, a, b);
    /* a list adds only to a list, a tuple only to a tuple (Python's TypeErrors below); a
     * generator or dict view adds to nothing */
    bool seq_a = a.k == V_LIST && !zt_chat_is_generator(a) && !zt_chat_view_of(a);
    if (seq_a && b.k == V_LIST && zt_chat_is_tuple(a) == zt_chat_is_tuple(b) &&
        !zt_chat_is_generator(b) && !zt_chat_view_of(b)) { /* a new one of a's items, then b's */
        val *items = (val *)(void *)zt_chat_alloc(e->r, (size_t)(a.count + b.count + 1) *
                                                            sizeof *items);
        if (!items)
            return zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
        zt_chat_items(a, items);
        zt_chat_items(b, items + a.count);
        char why[256];
        val out;
        if (!zt_chat_make_list(e->r, items, a.count + b.count, &out, why))
            return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "%s", why);
        return a.b ? zt_chat_not_list(out) : out; /* two tuples make a tuple */
    }
    /* Python's TypeError, as a message's null content added to a string fails in jinja2 */
    if (a.k == V_STR || seq_a)
        return zt_chat_fail(e, ZT_ERR_INVALID, "can only concatenate %s (not \"%s\") to %s",
                            zt_chat_type_name(a), zt_chat_type_name(b), zt_chat_type_name(a));
    return zt_chat_fail(e, ZT_ERR_INVALID, "unsupported operand type(s) for +: '%s' and '%s'",
                        zt_chat_type_name(a), zt_chat_type_name(b));
}

/* Python's `needle in hay` for keys() and items(), which look the key up: the key must hash, and
 * items() holds only (key, value) tuples. False with *st set when it does not hash. */
static bool view_lookup(ex *e, val hay, val needle) {
    int view = zt_chat_view_of(hay);
    if (view == ZT_CHAT_DICT_ITEMS) {
        if (!zt_chat_is_tuple(needle) || needle.count != 2)
            return false;
        needle = zt_chat_list_item(needle, 0); /* the key */
    } else if (view != ZT_CHAT_DICT_KEYS) {
        return true;
    }
    const char *t = zt_chat_unhashable(needle);
    if (t)
        zt_chat_fail(e, ZT_ERR_INVALID, "unhashable type: '%s'", t);
    return t == NULL;
}

/* Python's `needle in hay`: a substring, a list's, tuple's or view's item, an object's key. */
static bool contains(ex *e, val hay, val needle) {
    if (hay.k == V_STR) {
        if (needle.k != V_STR) {
            zt_chat_fail(e, ZT_ERR_INVALID, "'in <string>' requires string as left operand, not %s",
                         zt_chat_type_name(needle));
            return false;
        }
        for (size_t i = 0; i + needle.n <= hay.n; i++)
            if (memcmp(hay.s + i, needle.s, needle.n) == 0)
                return true;
        return false;
    }
    if (hay.k == V_LIST) {
        char why[256];
        if (!zt_chat_consume(hay, why)) { /* a generator's first use consumes it */
            zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "'in': %s", why);
            return false;
        }
        if (!view_lookup(e, hay, needle))
            return false;
        for (int k = 0; k < hay.count; k++) {
            int eq = zt_chat_equal(zt_chat_list_item(hay, k), needle, why);
            if (eq < 0)
                zt_chat_fail(e, ZT_ERR_INVALID, "%s", why);
            if (eq != 0)
                return eq > 0;
        }
        return false;
    }
    if (hay.k == V_DICT) { /* a key lookup: the needle must hash */
        const char *t = zt_chat_unhashable(needle);
        if (t)
            zt_chat_fail(e, ZT_ERR_INVALID, "unhashable type: '%s'", t);
        if (t || needle.k != V_STR)
            return false;
        char k[128];
        snprintf(k, sizeof k, "%.*s", (int)needle.n, needle.s);
        return cJSON_GetObjectItemCaseSensitive(hay.j, k) != NULL;
    }
    if (hay.k == V_UNDEF) /* jinja2's Undefined iterates as empty */
        return false;
    zt_chat_fail(e, ZT_ERR_INVALID, "argument of type '%s' is not iterable",
                 zt_chat_type_name(hay));
    return false;
}

/* <, <=, >, >= of two numbers or two strings (code point order, which is UTF-8's byte order). */
static val order(ex *e, char o, bool eq, val a, val b) {
    if (!e->r || e->st != ZT_OK)
        return a;
    if (a.k == V_UNDEF || b.k == V_UNDEF)
        return zt_chat_undefined_error(e, a.k == V_UNDEF ? a : b);
    /* integers exactly, past 64 bits too (by their digits) */
    int c;
    if (a.k == V_STR && b.k == V_STR) {
        c = memcmp(a.s, b.s, a.n < b.n ? a.n : b.n);
        if (c == 0)
            c = a.n < b.n ? -1 : a.n > b.n;
    } else if (!zt_chat_int_order(a, b, &c)) {
        return zt_chat_fail(e, ZT_ERR_INVALID, "'%c%s' between a %s and a %s", o, eq ? "=" : "",
                            zt_chat_type_name(a), zt_chat_type_name(b));
    }
    return zt_chat_bool(o == '<' ? (eq ? c <= 0 : c < 0) : (eq ? c >= 0 : c > 0));
}

bool zt_chat_compare(ex *e, const char *o, val a, val b) {
    if (o[0] == '=' || o[0] == '!') {
        char why[256];
        int eq = zt_chat_equal(a, b, why);
        if (eq < 0)
            zt_chat_fail(e, ZT_ERR_INVALID, "%s", why);
        return eq == (o[0] == '=');
    }
    if (o[0] == 'i' || o[0] == 'n')
        return contains(e, b, a) == (o[0] == 'i');
    return zt_chat_truthy(order(e, o[0], o[1] == '=', a, b));
}
