/* The chat templates' filters, tests and functions (chat_expr_internal.h), as jinja2 defines
 * them, with transformers' own tojson and strftime_now. A filter's arguments are bound to its
 * parameters as Python binds them (positionally, then by keyword), so an unknown keyword or one
 * argument too many is refused by name when the template is read. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unicase.h>
#include <unictype.h>
#include <unistr.h>

#include "chat_expr_internal.h"

#define MAX_PARAMS 4

typedef struct {
    const char *name;
    const char *params[MAX_PARAMS]; /* in positional order, each also a keyword */
    bool rest;                      /* select/reject: the arguments are a test's name and its */
} filter_spec;

static const filter_spec FILTERS[] = {
    {"trim", {NULL}, false},   {"length", {NULL}, false}, {"string", {NULL}, false},
    {"list", {NULL}, false},   {"items", {NULL}, false},  {"join", {"d", "attribute"}, false},
    {"select", {NULL}, true},  {"reject", {NULL}, true},  {"selectattr", {NULL}, true},
    {"rejectattr", {NULL}, true}, {"first", {NULL}, false}, {"last", {NULL}, false},
    {"map", {NULL}, true},     {"upper", {NULL}, false},  {"lower", {NULL}, false},
    {"capitalize", {NULL}, false}, {"title", {NULL}, false},
    {"tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}, false},
    {"default", {"default_value", "boolean"}, false}, {"d", {"default_value", "boolean"}, false},
};

static int n_params(const filter_spec *f) {
    int k = 0;
    while (k < MAX_PARAMS && f->params[k])
        k++;
    return k;
}

/* The arguments into the filter's parameters (slot[k], given[k]); false after zt_chat_fail. */
static bool bind_args(ex *e, const filter_spec *f, const zt_chat_arg *args, int nargs,
                      val slot[MAX_PARAMS], bool given[MAX_PARAMS]) {
    int np = n_params(f), pos = 0;
    for (int k = 0; k < nargs; k++) {
        if (f->rest && args[k].kw) {
            zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "filter '%s' with keyword arguments is not "
                         "supported", f->name);
            return false;
        }
        if (f->rest)
            continue;
        int at = pos;
        if (args[k].kw) {
            at = 0;
            while (at < np && !zt_chat_is_name(args[k].kw, args[k].kw_len, f->params[at]))
                at++;
            if (at == np) {
                zt_chat_fail(e, ZT_ERR_INVALID, "filter '%s' has no argument '%.*s'", f->name,
                             (int)args[k].kw_len, args[k].kw);
                return false;
            }
        } else {
            pos++;
        }
        if (np == 0) {
            zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "filter '%s' with arguments is not supported",
                         f->name);
            return false;
        }
        if (at >= np) {
            zt_chat_fail(e, ZT_ERR_INVALID, "filter '%s' takes at most %d argument%s", f->name,
                         np, np == 1 ? "" : "s");
            return false;
        }
        if (given[at]) {
            zt_chat_fail(e, ZT_ERR_INVALID, "filter '%s' got argument '%s' twice", f->name,
                         f->params[at]);
            return false;
        }
        slot[at] = args[k].v, given[at] = true;
    }
    return true;
}

/* v as jinja2 prints it (soft_str: a list or dict as its repr), copied into the arena when it
 * lives in num, for filter name. False after zt_chat_fail: what the subset does not print is
 * refused with zt_chat_print's reason. */
static bool text_of(ex *e, val v, val *out, const char *name) {
    char num[32], why[256];
    *out = (val){.k = V_STR};
    if (!zt_chat_print(e->r, v, num, &out->s, &out->n, why)) {
        if (strstr(why, "out of memory"))
            zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
        else
            zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "%s of a %s: %s", name, zt_chat_type_name(v),
                         why);
        return false;
    }
    if (out->s == num) {
        char *copy = zt_chat_alloc(e->r, out->n);
        if (!copy) {
            zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
            return false;
        }
        out->s = memcpy(copy, num, out->n);
    }
    return true;
}

/* What a filter iterates over (list, join, select, reject): undefined as empty, as jinja2's
 * Undefined iterates; a generator is consumed (zt_chat_consume). NULL after a failure; *n the
 * count. */
static val *iterate(ex *e, const char *filter, val v, int *n) {
    *n = v.k == V_UNDEF ? 0 : zt_chat_items(v, NULL);
    if (*n < 0) {
        zt_chat_fail(e, ZT_ERR_INVALID, "filter '%s' of a %s, which is not iterable", filter,
                     zt_chat_type_name(v));
        return NULL;
    }
    char why[256];
    if (!zt_chat_consume(v, why)) {
        zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "filter '%s': %s", filter, why);
        return NULL;
    }
    val *items = (val *)(void *)zt_chat_alloc(e->r, (size_t)(*n ? *n : 1) * sizeof *items);
    if (!items) {
        zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (*n)
        zt_chat_items(v, items);
    return items;
}

static val make_list(ex *e, const val *items, int n) {
    char why[256];
    val out;
    if (!zt_chat_make_list(e->r, items, n, &out, why))
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "%s", why);
    return out;
}

/* What jinja2 gives as a tuple (items' pairs): a list here, marked so that it is not printed
 * as one. */
static val not_list(ex *e, val v) {
    return e->st == ZT_OK && v.k == V_LIST ? zt_chat_not_list(v) : v;
}

/* What jinja2 gives as a generator (select, reject, map, items): a list made at once, marked so
 * that it is neither printed, counted nor used twice as one (ZT_CHAT_GENERATOR). */
static val generator(ex *e, val v) {
    return e->st == ZT_OK && v.k == V_LIST ? zt_chat_generator(v) : v;
}

static val trim(ex *e, val v) {
    val t;
    if (!text_of(e, v, &t, "trim"))
        return t;
    return zt_chat_strip_space(t, true, true);
}

/* ---- case: Python's str.upper, lower, capitalize and title, jinja2's title ------------------- */

/* Python 3.11's case mappings are Unicode 14's full ones (SpecialCasing's unconditional entries:
 * 'ß'.upper() is 'SS', 'İ'.lower() is 'i̇') with one context, Final_Sigma ('ΑΣ'.lower() is 'ας').
 * libunistring 1.0 carries the same Unicode version and maps every code point as Python does
 * (tests/reference/test_chat_case.py checks them all), so its u8_ct_* functions are used; glibc's
 * towupper/towlower know only the one-to-one mappings, which would need a table of our own
 * beside them. Final_Sigma is CPython's own (final_sigma below): libunistring reads a character
 * that is both cased and case-ignorable (U+0345, the modifier letters ʰ ˡ ᵃ ...) next to a Σ as
 * cased, where CPython skips it as ignorable. */
typedef enum { MAP_UPPER, MAP_LOWER, MAP_TITLE } case_map;

/* One case mapping into a buffer big enough for it (case_out). */
typedef struct {
    char *out;
    size_t len;
    char *why;
} case_buf;

/* Appends s[0..n) mapped by kind to b. Only Final_Sigma depends on the text around, and
 * lower_append decides it itself, so the text is mapped without a context. */
static bool case_append(case_buf *b, const char *s, size_t n, case_map kind) {
    size_t m = 0;
    uint8_t *(*f)(const uint8_t *, size_t, casing_prefix_context_t, casing_suffix_context_t,
                  const char *, uninorm_t, uint8_t *, size_t *) =
        kind == MAP_UPPER ? u8_ct_toupper : kind == MAP_LOWER ? u8_ct_tolower : u8_ct_totitle;
    if (n == 0)
        return true;
    uint8_t *r = f((const uint8_t *)s, n, unicase_empty_prefix_context,
                   unicase_empty_suffix_context, NULL, NULL, NULL, &m);
    if (!r) {
        snprintf(b->why, 256, "a change of case of text that is not UTF-8");
        return false;
    }
    memcpy(b->out + b->len, r, m);
    b->len += m;
    free(r);
    return true;
}

/* CPython's handle_capital_sigma: the Σ at s[at] of the string s[0..n) is final when a cased
 * code point precedes it and none follows it, case-ignorable ones skipped on both sides. */
static bool final_sigma(const char *s, size_t n, size_t at) {
    const uint8_t *b = (const uint8_t *)s, *p = b + at;
    ucs4_t c = 0;
    bool found = false;
    while ((p = u8_prev(&c, p, b)) != NULL)
        if (!uc_is_property_case_ignorable(c)) {
            found = true;
            break;
        }
    if (!found || !uc_is_property_cased(c))
        return false;
    for (size_t i = at + 2; i < n;) {
        int k = u8_mbtouc(&c, b + i, n - i);
        if (!uc_is_property_case_ignorable(c))
            return !uc_is_property_cased(c);
        i += (size_t)k;
    }
    return true;
}

static bool is_sigma(const char *s, size_t n, size_t i) {
    return i + 1 < n && (unsigned char)s[i] == 0xce && (unsigned char)s[i + 1] == 0xa3;
}

/* s[from..to).lower() as Python lowers it inside the string s[0..n): between the Σs (whose
 * mapping alone depends on the text around) by libunistring, each Σ by final_sigma. */
static bool lower_append(case_buf *b, const char *s, size_t n, size_t from, size_t to) {
    while (from < to) {
        size_t end = from;
        while (end < to && !is_sigma(s, n, end))
            end++;
        if (!case_append(b, s + from, end - from, MAP_LOWER))
            return false;
        if (end < to) {
            memcpy(b->out + b->len, final_sigma(s, n, end) ? "\xcf\x82" : "\xcf\x83", 2);
            b->len += 2;
            end += 2;
        }
        from = end;
    }
    return true;
}

/* The length of the code point at s (n > 0). */
static size_t cp_at(const char *s, size_t n) {
    size_t k = zt_chat_cp_len((unsigned char)s[0]);
    return k < n ? k : n;
}

/* CPython's do_title (str.title): each code point after a cased one lowered (in the string's
 * context, for Σ), every other one title-cased; whether a code point is cased is read from it
 * as it was, not from its mapping. */
static bool str_title(case_buf *b, const char *s, size_t n) {
    bool after_cased = false;
    for (size_t i = 0; i < n;) {
        size_t k = cp_at(s + i, n - i);
        bool ok = after_cased ? lower_append(b, s, n, i, i + k)
                              : case_append(b, s + i, k, MAP_TITLE);
        if (!ok)
            return false;
        ucs4_t c;
        after_cased = u8_mbtouc(&c, (const uint8_t *)s + i, k) > 0 && uc_is_property_cased(c);
        i += k;
    }
    return true;
}

/* Where jinja2's title splits: ([-\s({\[<]+), \s being Python's whitespace. */
static size_t word_split_at(const char *s, size_t n) {
    if (s[0] && strchr("-({[<", s[0]))
        return 1;
    size_t k = zt_chat_space_prefix(s, n);
    return k ? cp_at(s, k) : 0;
}

/* jinja2's do_title: the text split into words and runs of the separators (both kept), each
 * item[0].upper() + item[1:].lower(), the two halves cased as strings of their own. */
static bool jinja_title(case_buf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        bool sep = word_split_at(s + i, n - i) > 0;
        size_t end = i;
        while (end < n && (word_split_at(s + end, n - end) > 0) == sep)
            end += sep ? word_split_at(s + end, n - end) : cp_at(s + end, n - end);
        size_t k = cp_at(s + i, end - i);
        if (!case_append(b, s + i, k, MAP_UPPER) ||
            !lower_append(b, s + i + k, end - i - k, 0, end - i - k))
            return false;
        i = end;
    }
    return true;
}

bool zt_chat_case(render *r, val t, zt_chat_case_kind kind, val *out, char why[256]) {
    /* A full case mapping makes a code point at most 3 code points of at most 4 bytes: 12 bytes
     * for each input byte is always enough. */
    case_buf b = {zt_chat_alloc(r, t.n * 12 + 1), 0, why};
    if (!b.out) {
        snprintf(why, 256, "%s", zt_chat_nomem(r));
        return false;
    }
    bool ok = true;
    switch (kind) {
    case ZT_CASE_UPPER: ok = case_append(&b, t.s, t.n, MAP_UPPER); break;
    case ZT_CASE_LOWER: ok = lower_append(&b, t.s, t.n, 0, t.n); break;
    case ZT_CASE_CAPITALIZE: /* CPython's do_capitalize: the first code point's title mapping */
        if (t.n) {
            size_t k = cp_at(t.s, t.n);
            ok = case_append(&b, t.s, k, MAP_TITLE) && lower_append(&b, t.s, t.n, k, t.n);
        }
        break;
    case ZT_CASE_TITLE: ok = str_title(&b, t.s, t.n); break;
    case ZT_CASE_JINJA_TITLE: ok = jinja_title(&b, t.s, t.n); break;
    }
    *out = zt_chat_str(b.out, b.len);
    return ok;
}

/* The four case filters take any value jinja2 prints (soft_str), as trim does; upper, lower and
 * capitalize are then Python's str methods, title is jinja2's own. */
static val case_filter(ex *e, val v, const char *name) {
    val t, out;
    if (!text_of(e, v, &t, name))
        return t;
    zt_chat_case_kind kind = name[0] == 'u' ? ZT_CASE_UPPER : name[0] == 'l' ? ZT_CASE_LOWER
                             : name[0] == 'c' ? ZT_CASE_CAPITALIZE : ZT_CASE_JINJA_TITLE;
    char why[256];
    if (!zt_chat_case(e->r, t, kind, &out, why))
        return zt_chat_fail(e, ZT_ERR_INVALID, "%s", why);
    return out;
}

static val length(ex *e, val v) {
    if (v.k == V_LIST && !zt_chat_is_generator(v)) return zt_chat_int(v.count);
    if (v.k == V_DICT) return zt_chat_int(cJSON_GetArraySize(v.j));
    if (v.k == V_UNDEF) return zt_chat_int(0);
    if (v.k == V_STR) /* code points, as Python's len */
        return zt_chat_int(zt_chat_items(v, NULL));
    return zt_chat_fail(e, ZT_ERR_INVALID, "object of type '%s' has no len()",
                        zt_chat_type_name(v));
}

/* items: a generator of an object's (key, value) pairs, tuples (lists marked not to print). */
static val items(ex *e, val v) {
    if (v.k == V_UNDEF)
        return generator(e, make_list(e, NULL, 0));
    if (v.k != V_DICT)
        return zt_chat_fail(e, ZT_ERR_INVALID, "Can only get item pairs from a mapping.");
    int n = cJSON_GetArraySize(v.j), k = 0;
    val *pairs = (val *)(void *)zt_chat_alloc(e->r, (size_t)(n ? n : 1) * sizeof *pairs);
    if (!pairs)
        return zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, v.j) {
        val pair[2] = {zt_chat_str(x->string, strlen(x->string)), zt_chat_from_json(x)};
        pairs[k++] = not_list(e, make_list(e, pair, 2));
    }
    return e->st == ZT_OK ? generator(e, make_list(e, pairs, n)) : (val){.k = V_UNDEF};
}

/* join(d='', attribute=None): the items as text with d between them. */
static val join(ex *e, val v, const val slot[MAX_PARAMS], const bool given[MAX_PARAMS]) {
    /* join's attribute is refused unless none, by zt_chat_filter */
    val d = zt_chat_str("", 0);
    if (given[0] && !text_of(e, slot[0], &d, "join's separator"))
        return d;
    int n;
    val *all = iterate(e, "join", v, &n);
    if (!all)
        return (val){.k = V_UNDEF};
    size_t len = 0;
    for (int k = 0; k < n; k++) {
        if (!text_of(e, all[k], &all[k], "join's item"))
            return all[k];
        len += all[k].n + (k ? d.n : 0);
    }
    char *s = zt_chat_alloc(e->r, len), *p = s;
    if (!s)
        return zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
    for (int k = 0; k < n; k++) {
        if (k)
            memcpy(p, d.s, d.n), p += d.n;
        memcpy(p, all[k].s, all[k].n), p += all[k].n;
    }
    return zt_chat_str(s, len);
}

/* The attribute path's value in item, as jinja2's make_attrgetter takes it: the path split at
 * dots, a part of digits an index, each part looked up by getitem (the item, else the
 * attribute); with dflt (map's default= other than none), dflt where a part gives undefined. */
static val attribute_path(ex *e, val item, val path, const val *dflt) {
    const char *p = path.s, *end = path.s + path.n;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot)
            dot = end;
        long long index = 0;
        bool digits = dot > p;
        for (const char *c = p; digits && c < dot; c++) {
            digits = *c >= '0' && *c <= '9';
            index = index > (LLONG_MAX - 9) / 10 ? LLONG_MAX : index * 10 + (*c - '0');
        }
        item = zt_chat_subscript(e, item, digits ? zt_chat_int(index)
                                                 : zt_chat_str(p, (size_t)(dot - p)));
        if (dflt && item.k == V_UNDEF)
            item = *dflt;
        if (dot == end || e->st != ZT_OK)
            return item;
        p = dot + 1;
    }
}

/* select/reject(test, args...): the items the test passes (or fails); with no test, the truthy
 * (or falsy) ones; selectattr/rejectattr test each item's attribute. A generator, as jinja2's. */
static val select(ex *e, val v, bool keep, bool attr, const zt_chat_arg *args, int nargs) {
    val name = {.k = V_NONE};
    if (attr) { /* selectattr/rejectattr(name, test, args...): the test of each item's name */
        if (nargs == 0 || args[0].v.k != V_STR)
            return zt_chat_fail(e, ZT_ERR_INVALID, "%sattr needs an attribute's name",
                                keep ? "select" : "reject");
        name = args[0].v, args++, nargs--;
    }
    if (nargs && args[0].v.k != V_STR)
        return zt_chat_fail(e, ZT_ERR_INVALID, "No test named %s.",
                            zt_chat_type_name(args[0].v));
    if (nargs && !zt_chat_test_check(e, args[0].v.s, args[0].v.n, nargs - 1))
        return (val){.k = V_UNDEF};
    int n, kept = 0;
    val *all = iterate(e, keep ? "select" : "reject", v, &n);
    for (int k = 0; all && k < n && e->st == ZT_OK; k++) {
        val x = attr ? attribute_path(e, all[k], name, NULL) : all[k];
        val t = nargs ? zt_chat_test(e, x, args[0].v.s, args[0].v.n, args + 1, nargs - 1, false)
                      : x;
        if (zt_chat_truthy(t) == keep)
            all[kept++] = all[k];
    }
    return all && e->st == ZT_OK ? generator(e, make_list(e, all, kept)) : (val){.k = V_UNDEF};
}

/* tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False): transformers'
 * filter, json.dumps with those arguments. */
static val tojson(ex *e, val v, const val slot[MAX_PARAMS], const bool given[MAX_PARAMS]) {
    zt_chat_json_opts o = {.ensure_ascii = given[0] && zt_chat_truthy(slot[0]),
                           .sort_keys = given[3] && zt_chat_truthy(slot[3])};
    val indent = given[1] ? slot[1] : (val){.k = V_NONE};
    char spaces[64];
    if (indent.k == V_INT || indent.k == V_BOOL) { /* json: ' ' * indent */
        long long k = indent.k == V_INT ? indent.i : indent.b;
        if (k > (long long)sizeof spaces)
            return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "tojson with an indent over %zu is not "
                                "supported", sizeof spaces);
        o.indent_n = k < 0 ? 0 : (size_t)k;
        memset(spaces, ' ', o.indent_n);
        o.indent = spaces;
    } else if (indent.k == V_STR) {
        o.indent = indent.s, o.indent_n = indent.n;
    } else if (indent.k != V_NONE) {
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "tojson with an indent that is a %s is not "
                            "supported (an integer, a string or none)", zt_chat_type_name(indent));
    }
    val sep = given[2] ? slot[2] : (val){.k = V_NONE};
    if (sep.k != V_NONE) {
        val item = sep.k == V_LIST && sep.count == 2 ? zt_chat_list_item(sep, 0) : sep;
        val key = sep.k == V_LIST && sep.count == 2 ? zt_chat_list_item(sep, 1) : sep;
        if (item.k != V_STR || key.k != V_STR)
            return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "tojson's separators must be two "
                                "strings, (item, key)");
        o.item_sep = item.s, o.item_sep_n = item.n, o.key_sep = key.s, o.key_sep_n = key.n;
    }
    char why[256];
    val out;
    if (zt_chat_is_generator(v))
        return zt_chat_fail(e, ZT_ERR_INVALID, "Object of type generator is not JSON "
                            "serializable");
    if (!zt_chat_json_dump(e->r, v, &o, &out, why))
        return zt_chat_fail(e, v.k == V_FLOAT ? ZT_ERR_UNSUPPORTED : ZT_ERR_INVALID, "%s", why);
    return out;
}

/* first and last: an item of what v iterates; undefined when there is none. last takes
 * Python's reversed(), which a generator refuses. */
static val end_item(ex *e, val v, bool last) {
    if (last && zt_chat_is_generator(v))
        return zt_chat_fail(e, ZT_ERR_INVALID, "'generator' object is not reversible");
    int n;
    val *all = iterate(e, last ? "last" : "first", v, &n);
    if (!all)
        return (val){.k = V_UNDEF};
    if (n == 0)
        return zt_chat_undefined(e, "No %s item, sequence was empty.", last ? "last" : "first");
    return all[last ? n - 1 : 0];
}

/* map(attribute='x'[, default=d]) takes each item's attribute (d where it has none);
 * map('filter', args...) applies the filter to each item. A generator, as select's. */
static val map(ex *e, val v, const zt_chat_arg *args, int nargs) {
    const zt_chat_arg *attr = NULL, *dflt = NULL;
    for (int k = 0; k < nargs; k++) {
        if (args[k].kw && zt_chat_is_name(args[k].kw, args[k].kw_len, "attribute"))
            attr = &args[k];
        else if (args[k].kw && zt_chat_is_name(args[k].kw, args[k].kw_len, "default"))
            dflt = &args[k];
        else if (args[k].kw)
            return zt_chat_fail(e, ZT_ERR_INVALID, "filter 'map' has no argument '%.*s'",
                                (int)args[k].kw_len, args[k].kw);
    }
    if (attr ? nargs != 1 + (dflt != NULL) : dflt || nargs == 0)
        return zt_chat_fail(e, ZT_ERR_INVALID, "filter 'map' takes attribute= (and default=), "
                            "or a filter's name and its arguments");
    val f = attr ? attr->v : args[0].v;
    if (f.k != V_STR)
        return e->r ? zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "map's %s must be a string",
                                   attr ? "attribute" : "filter name") : v;
    if (!e->r) /* a check of the filter, when it is a literal */
        return attr ? v : zt_chat_filter(e, v, f.s, f.n, args + 1, nargs - 1);
    int n;
    val *all = iterate(e, "map", v, &n);
    for (int k = 0; all && k < n && e->st == ZT_OK; k++) {
        all[k] = attr ? attribute_path(e, all[k], f, dflt && dflt->v.k != V_NONE ? &dflt->v : NULL)
                      : zt_chat_filter(e, all[k], f.s, f.n, args + 1, nargs - 1);
    }
    return all && e->st == ZT_OK ? generator(e, make_list(e, all, n)) : (val){.k = V_UNDEF};
}

val zt_chat_filter(ex *e, val v, const char *name, size_t n, const zt_chat_arg *args,
                   int nargs) {
    const filter_spec *f = NULL;
    for (size_t k = 0; k < sizeof FILTERS / sizeof FILTERS[0] && !f; k++)
        if (zt_chat_is_name(name, n, FILTERS[k].name))
            f = &FILTERS[k];
    if (!f)
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "filter '%.*s' is not supported", (int)n,
                            name);
    if (!strcmp(f->name, "map"))
        return map(e, v, args, nargs);
    val slot[MAX_PARAMS];
    bool given[MAX_PARAMS] = {false};
    if (!bind_args(e, f, args, nargs, slot, given))
        return (val){.k = V_UNDEF};
    /* a check only knows the literals: a test's name, join's attribute none */
    if (!strcmp(f->name, "join") && given[1] && slot[1].k != V_NONE)
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "join's 'attribute' argument is not "
                            "supported");
    int t = strstr(f->name, "attr") ? 1 : 0; /* selectattr's test follows the name */
    if (!e->r && f->rest && nargs > t && args[t].v.k == V_STR &&
        !zt_chat_test_check(e, args[t].v.s, args[t].v.n, nargs - t - 1))
        return (val){.k = V_UNDEF};
    if (!e->r || e->st != ZT_OK)
        return v;
    const char *w = f->name;
    if (!strcmp(w, "trim")) return trim(e, v);
    if (!strcmp(w, "upper") || !strcmp(w, "lower") || !strcmp(w, "capitalize") ||
        !strcmp(w, "title"))
        return case_filter(e, v, w);
    if (!strcmp(w, "length")) return length(e, v);
    if (!strcmp(w, "items")) return items(e, v);
    if (!strcmp(w, "join")) return join(e, v, slot, given);
    if (f->rest)
        return select(e, v, w[0] == 's', strstr(w, "attr") != NULL, args, nargs);
    if (!strcmp(w, "tojson")) return tojson(e, v, slot, given);
    if (!strcmp(w, "first") || !strcmp(w, "last")) return end_item(e, v, w[0] == 'l');
    if (w[0] == 'd') { /* default(default_value='', boolean=False), alias d */
        bool use = v.k == V_UNDEF || (given[1] && zt_chat_truthy(slot[1]) && !zt_chat_truthy(v));
        return !use ? v : given[0] ? slot[0] : zt_chat_str("", 0);
    }
    if (!strcmp(w, "string")) {
        val t;
        text_of(e, v, &t, "string");
        return t;
    }
    /* list: a generator's or tuple's items (ZT_CHAT_NOT_LIST) make a new list */
    if (v.k == V_LIST && !v.b)
        return v;
    int count;
    val *all = iterate(e, "list", v, &count);
    return all ? make_list(e, all, count) : (val){.k = V_UNDEF};
}

/* ---- tests -------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    int args;
} TESTS[] = {
    {"defined", 0}, {"undefined", 0}, {"none", 0},     {"string", 0}, {"mapping", 0},
    {"iterable", 0}, {"sequence", 0}, {"number", 0},   {"integer", 0}, {"float", 0},
    {"boolean", 0}, {"true", 0},      {"false", 0},    {"equalto", 1}, {"eq", 1},
    {"==", 1},      {"ne", 1},        {"!=", 1},       {"in", 1},
};

/* The test's index in TESTS, or -1. */
static int find_test(const char *name, size_t n) {
    for (size_t k = 0; k < sizeof TESTS / sizeof TESTS[0]; k++)
        if (zt_chat_is_name(name, n, TESTS[k].name))
            return (int)k;
    return -1;
}

bool zt_chat_test_check(ex *e, const char *name, size_t n, int nargs) {
    int k = find_test(name, n);
    if (k < 0) {
        zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "test 'is %.*s' is not supported", (int)n, name);
        return false;
    }
    if (nargs != TESTS[k].args) {
        zt_chat_fail(e, ZT_ERR_INVALID, "test '%s' takes %d argument%s, not %d", TESTS[k].name,
                     TESTS[k].args, TESTS[k].args == 1 ? "" : "s", nargs);
        return false;
    }
    return true;
}

val zt_chat_test(ex *e, val v, const char *t, size_t n, const zt_chat_arg *args, int nargs,
                 bool neg) {
    for (int k = 0; k < nargs; k++)
        if (args[k].kw)
            return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "a test with keyword arguments is not "
                                "supported");
    if (!zt_chat_test_check(e, t, n, nargs))
        return (val){.k = V_UNDEF};
    if (!e->r || e->st != ZT_OK)
        return v;
    const char *w = TESTS[find_test(t, n)].name;
    bool r, seq = v.k == V_STR || v.k == V_LIST || v.k == V_DICT || v.k == V_UNDEF;
    if (!strcmp(w, "defined")) r = v.k != V_UNDEF;
    else if (!strcmp(w, "undefined")) r = v.k == V_UNDEF;
    else if (!strcmp(w, "none")) r = v.k == V_NONE;
    else if (!strcmp(w, "string")) r = v.k == V_STR;
    else if (!strcmp(w, "mapping")) r = v.k == V_DICT;
    /* Undefined has __iter__ and __len__: jinja2 finds it iterable and a sequence */
    else if (!strcmp(w, "iterable")) r = seq;
    /* a generator has no len(), a dict view no items by index */
    else if (!strcmp(w, "sequence")) r = seq && !zt_chat_is_generator(v) && !zt_chat_view_of(v);
    else if (!strcmp(w, "number")) r = v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL;
    else if (!strcmp(w, "integer")) r = v.k == V_INT || (v.k == V_FLOAT && v.b);
    else if (!strcmp(w, "float")) r = v.k == V_FLOAT && !v.b;
    else if (!strcmp(w, "boolean")) r = v.k == V_BOOL;
    else if (!strcmp(w, "true")) r = v.k == V_BOOL && v.b;
    else if (!strcmp(w, "false")) r = v.k == V_BOOL && !v.b;
    else if (!strcmp(w, "in")) r = zt_chat_compare(e, "in", v, args[0].v);
    else r = zt_chat_compare(e, w[0] == 'n' || w[0] == '!' ? "!=" : "==", v, args[0].v);
    return zt_chat_bool(r != neg);
}

/* ---- functions ---------------------------------------------------------------------------- */

/* namespace(a=1, ...): jinja2's object whose attributes `set ns.a = ...` may change, also
 * from inside a loop. */
static val namespace(ex *e, const zt_chat_arg *args, int nargs) {
    val keys[ZT_CHAT_MAX_ARGS], items[ZT_CHAT_MAX_ARGS];
    for (int k = 0; k < nargs; k++) {
        if (!args[k].kw)
            return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "namespace() with a positional argument "
                                "is not supported (give name=value)");
        keys[k] = zt_chat_str(args[k].kw, args[k].kw_len);
        items[k] = args[k].v;
    }
    if (!e->r || e->st != ZT_OK)
        return (val){.k = V_UNDEF};
    char why[256];
    val out;
    if (!zt_chat_make_dict(e->r, keys, items, nargs, true, &out, why))
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "%s", why);
    return out;
}

val zt_chat_call(ex *e, const char *name, size_t n, const zt_chat_arg *args, int nargs) {
    if (zt_chat_is_name(name, n, "namespace"))
        return namespace(e, args, nargs);
    if (!zt_chat_is_name(name, n, "strftime_now"))
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "function '%.*s' is not supported", (int)n,
                            name);
    if (nargs != 1 || args[0].kw)
        return zt_chat_fail(e, ZT_ERR_INVALID, "strftime_now takes one argument, the format");
    if (!e->r || e->st != ZT_OK)
        return (val){.k = V_UNDEF};
    val f = args[0].v;
    if (f.k != V_STR)
        return zt_chat_fail(e, ZT_ERR_INVALID, "strftime() argument 1 must be str, not %s",
                            zt_chat_type_name(f));
    char fmt[256], out[512];
    if (f.n >= sizeof fmt)
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "a strftime_now format over %zu bytes",
                            sizeof fmt - 1);
    memcpy(fmt, f.s, f.n);
    fmt[f.n] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    size_t len = f.n ? strftime(out, sizeof out, fmt, &tm) : 0;
    if (f.n && len == 0)
        return zt_chat_fail(e, ZT_ERR_UNSUPPORTED, "strftime_now('%s') is empty or too long",
                            fmt);
    char *s = zt_chat_alloc(e->r, len);
    if (!s)
        return zt_chat_fail(e, ZT_ERR_NOMEM, "out of memory");
    return zt_chat_str(memcpy(s, out, len), len);
}
