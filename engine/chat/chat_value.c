/* The chat templates' values (chat_template_internal.h): a conversation's JSON as values,
 * and what Python does with them in jinja2 — truth, printing (str, and repr inside a list or
 * dict), equality, type names and str's whitespace. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unictype.h>
#include <unistr.h>

#include "chat_template_internal.h"
#include "ztrain/json_util.h"

/* A block's size; a larger request gets a block of its own. */
#define ARENA_BLOCK (64 * 1024)

/* Under AddressSanitizer a block is poisoned but for the n + 1 bytes handed out, so that a
 * write past one string is caught as it would be past its own malloc. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define ARENA_POISON(p, n) ((void)(p), (void)(n))
#define ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

bool zt_chat_charge(render *r, size_t n) {
    if (n > ZT_CHAT_MAX_MADE - r->bytes_made) {
        r->over_budget = true;
        return false;
    }
    r->bytes_made += n;
    return true;
}

const char *zt_chat_nomem(const render *r) {
    return r->over_budget ? "the render made over 2 GiB of strings, lists and objects (a value "
                            "grown in a loop?)" : "out of memory";
}

char *zt_chat_alloc(render *r, size_t n) {
    if (n > SIZE_MAX - 32)
        return NULL;
    size_t need = (n + 1 + 15) & ~(size_t)15;
    if (!zt_chat_charge(r, need))
        return NULL;
    arena_block *b = r->arena;
    if (b && b->cap - b->used >= need) {
        char *p = b->data + b->used;
        b->used += need;
        ARENA_UNPOISON(p, n + 1);
        return p;
    }
    size_t cap = need > ARENA_BLOCK / 4 ? need : ARENA_BLOCK;
    if (!(b = malloc(sizeof *b + cap)))
        return NULL;
    b->cap = cap;
    b->used = need;
    ARENA_POISON(b->data, cap);
    ARENA_UNPOISON(b->data, n + 1);
    if (cap == need && r->arena) { /* behind the current block, whose room stays in use */
        b->next = r->arena->next;
        r->arena->next = b;
    } else {
        b->next = r->arena;
        r->arena = b;
    }
    return b->data;
}

void zt_chat_arena_free(render *r) {
    while (r->arena) {
        arena_block *b = r->arena;
        r->arena = b->next;
        ARENA_UNPOISON(b->data, b->cap); /* free's own poisoning takes it from here */
        free(b);
    }
}

val zt_chat_str(const char *s, size_t n) { return (val){.k = V_STR, .s = s, .n = n}; }
val zt_chat_bool(bool b) { return (val){.k = V_BOOL, .b = b}; }
val zt_chat_int(long long i) { return (val){.k = V_INT, .i = i}; }

/* A number of the conversation as Python's json.loads reads it: a float when written with a
 * fraction or an exponent, else an int, exact from the literal's digits where the double would
 * have rounded it (zt_json_int_digits), and past 64 bits a V_FLOAT with b set that keeps them. */
static val number(const cJSON *j) {
    double d = j->valuedouble;
    if (zt_json_is_float_literal(j))
        return (val){.k = V_FLOAT, .d = d};
    const char *digits = zt_json_int_digits(j);
    if (digits) {
        errno = 0;
        long long i = strtoll(digits, NULL, 10);
        if (errno != ERANGE)
            return zt_chat_int(i);
        return (val){.k = V_FLOAT, .d = d, .b = true, .s = digits, .n = strlen(digits)};
    }
    /* a node the render made from a double (a conversion outside long long's range would be
     * undefined behaviour); past 64 bits without digits it is never printed */
    if (d > -9.2e18 && d < 9.2e18 && d == (double)(long long)d)
        return zt_chat_int((long long)d);
    return (val){.k = V_FLOAT, .d = d, .b = d == floor(d)};
}

val zt_chat_from_json(const cJSON *j) {
    if (!j)
        return (val){.k = V_UNDEF};
    if (cJSON_IsString(j))
        return zt_chat_str(j->valuestring, strlen(j->valuestring));
    if (cJSON_IsBool(j))
        return zt_chat_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j))
        return number(j);
    if (cJSON_IsArray(j))
        return (val){.k = V_LIST, .j = j, .lo = 0, .count = cJSON_GetArraySize(j), .step = 1,
                     .b = (j->type & ZT_CHAT_NOT_LIST) != 0};
    if (cJSON_IsObject(j))
        return (val){.k = V_DICT, .j = j};
    return (val){.k = V_NONE};
}

bool zt_chat_truthy(val v) {
    switch (v.k) {
    case V_BOOL: return v.b;
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.d != 0;
    case V_STR: return v.n > 0;
    case V_LIST: return v.count > 0 || zt_chat_is_generator(v); /* a generator is true */
    case V_DICT: return v.j->child != NULL;
    case V_LOOP: case V_NS: case V_FUNC: return true;
    default: return false;
    }
}

val zt_chat_list_item(val v, int k) {
    return zt_chat_from_json(cJSON_GetArrayItem(v.j, v.lo + k * (v.step ? v.step : 1)));
}

size_t zt_chat_cp_len(unsigned char c) {
    return c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc0 && c < 0xe0 ? 2 : 1;
}

int zt_chat_items(val v, val *out) {
    int n = 0;
    switch (v.k) {
    case V_LIST:
        if (v.step == 1 || v.step == 0) { /* one walk along the cJSON list */
            const cJSON *x = cJSON_GetArrayItem(v.j, v.lo);
            for (; n < v.count; n++, x = x->next)
                if (out)
                    out[n] = zt_chat_from_json(x);
            return n;
        }
        for (; n < v.count; n++)
            if (out)
                out[n] = zt_chat_list_item(v, n);
        return n;
    case V_DICT: {
        const cJSON *x;
        cJSON_ArrayForEach(x, v.j) {
            if (out)
                out[n] = zt_chat_str(x->string, strlen(x->string));
            n++;
        }
        return n;
    }
    case V_STR:
        for (size_t i = 0; i < v.n; n++) {
            size_t w = zt_chat_cp_len((unsigned char)v.s[i]);
            w = w > v.n - i ? v.n - i : w;
            if (out)
                out[n] = zt_chat_str(v.s + i, w);
            i += w;
        }
        return n;
    default:
        return -1;
    }
}

/* Python's repr(d), which str() and json.dumps write too: the fewest significant digits that
 * read back as d (the correctly rounded ones, as Python's dtoa picks), in positional notation
 * when the exponent is in [-4, 16) ("0.0001", "1e-05", "1e+16"), with ".0" on an integral one.
 * False for inf and NaN, which JSON data cannot hold. */
static bool float_repr(double d, char out[32], size_t *n) {
    if (d != d || d - d != 0)
        return false;
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, d);
        if (strtod(e, NULL) == d)
            break;
    }
    /* e is [-]D[.DDD]e[+-]XX: the digits without the point, and the exponent */
    char digits[20];
    size_t nd = 0;
    const char *q = e + (e[0] == '-');
    for (; *q != 'e'; q++)
        if (*q != '.')
            digits[nd++] = *q;
    int exp = atoi(q + 1);
    size_t k = 0;
    if (e[0] == '-')
        out[k++] = '-';
    if (exp < -4 || exp >= 16) {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            memcpy(out + k, digits + 1, nd - 1);
            k += nd - 1;
        }
        k += (size_t)snprintf(out + k, 32 - k, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
    } else if (exp < 0) {
        memcpy(out + k, "0.", 2);
        k += 2;
        for (int z = -1; z > exp; z--)
            out[k++] = '0';
        memcpy(out + k, digits, nd);
        k += nd;
    } else {
        for (int i = 0; i <= exp; i++)
            out[k++] = (size_t)i < nd ? digits[i] : '0';
        out[k++] = '.';
        if (nd > (size_t)exp + 1) {
            memcpy(out + k, digits + exp + 1, nd - (size_t)exp - 1);
            k += nd - (size_t)exp - 1;
        } else {
            out[k++] = '0';
        }
    }
    out[k] = '\0';
    *n = k;
    return true;
}

bool zt_chat_text(val v, char num[32], const char **s, size_t *n) {
    switch (v.k) {
    case V_STR: *s = v.s, *n = v.n; return true;
    case V_FLOAT:
        if (v.b) { /* an integer past 64 bits: its digits as written, when known */
            *s = v.s, *n = v.n;
            return v.s != NULL;
        }
        *s = num;
        return float_repr(v.d, num, n);
    case V_INT: *n = (size_t)snprintf(num, 32, "%lld", v.i), *s = num; return true;
    case V_BOOL: *s = v.b ? "True" : "False", *n = v.b ? 4 : 5; return true;
    case V_NONE: *s = "None", *n = 4; return true;
    case V_UNDEF: *s = "", *n = 0; return true;
    default: return false;
    }
}

/* Python's str.isprintable() of one code point: false for the categories Other (Cc, Cf, Cs, Co,
 * Cn: unassigned ones too) and Separator (Zs, Zl, Zp) but the ASCII space. libunistring 1.0
 * has Python 3.11's Unicode 14 (tests/reference/test_chat_print.py checks every code point). */
static bool printable(ucs4_t c) {
    return c == ' ' || (!uc_is_general_category(c, UC_CATEGORY_C) &&
                        !uc_is_general_category(c, UC_CATEGORY_Z));
}

/* repr(s) as CPython's unicode_repr writes it: in single quotes, or double ones when s holds a '
 * and no "; the quote and \ escaped, \t \n \r, the other ASCII control characters as \xHH, and
 * a code point that is not printable as \xHH, \uHHHH or \UHHHHHHHH; everything else as it is. */
static void repr_str(zt_strbuf *b, const char *s, size_t n) {
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    zt_strbuf_putc(b, q);
    for (size_t i = 0; i < n;) {
        ucs4_t c;
        int w = u8_mbtouc(&c, (const uint8_t *)s + i, n - i);
        if (c == (ucs4_t)q || c == '\\')
            zt_strbuf_putc(b, '\\'), zt_strbuf_putc(b, (char)c);
        else if (c == '\t' || c == '\n' || c == '\r')
            zt_strbuf_puts(b, c == '\t' ? "\\t" : c == '\n' ? "\\n" : "\\r");
        else if (c < ' ' || c == 0x7f)
            zt_strbuf_printf(b, "\\x%02x", (unsigned)c);
        else if (c < 0x7f || printable(c))
            zt_strbuf_append(b, s + i, (size_t)w);
        else
            zt_strbuf_printf(b, c <= 0xff ? "\\x%02x" : c <= 0xffff ? "\\u%04x" : "\\U%08x",
                             (unsigned)c);
        i += (size_t)w;
    }
    zt_strbuf_putc(b, q);
}

/* Why v cannot be printed: the kinds zt_chat_text does not write. */
static bool unprintable(val v, char why[256]) {
    snprintf(why, 256, "printing a%s %s is not supported", v.k == V_FLOAT ? "n" : "",
             v.k == V_FLOAT ? "integer beyond 64 bits" : zt_chat_type_name(v));
    return false;
}

/* repr(v) of an item of a list or dict: strings by repr_str, lists and dicts item by item,
 * numbers, booleans and None as str() writes them. False with why for what it cannot write. */
static bool repr(zt_strbuf *b, val v, char why[256]) {
    if (v.k == V_STR) {
        repr_str(b, v.s, v.n);
        return true;
    }
    if (v.k == V_LIST && v.b) {
        snprintf(why, 256, "printing a tuple, a generator or a dict view (select, map, items(), "
                 "..., which the subset holds as a list) is not supported; |list makes a list");
        return false;
    }
    if (v.k == V_LIST) {
        zt_strbuf_putc(b, '[');
        for (int k = 0; k < v.count; k++) {
            if (k)
                zt_strbuf_puts(b, ", ");
            if (!repr(b, zt_chat_list_item(v, k), why))
                return false;
        }
        zt_strbuf_putc(b, ']');
        return true;
    }
    if (v.k == V_DICT) {
        const cJSON *x;
        zt_strbuf_putc(b, '{');
        cJSON_ArrayForEach(x, v.j) {
            if (x != v.j->child)
                zt_strbuf_puts(b, ", ");
            repr_str(b, x->string, strlen(x->string));
            zt_strbuf_puts(b, ": ");
            if (!repr(b, zt_chat_from_json(x), why))
                return false;
        }
        zt_strbuf_putc(b, '}');
        return true;
    }
    char num[32];
    const char *s;
    size_t n;
    if (!zt_chat_text(v, num, &s, &n) || v.k == V_UNDEF)
        return unprintable(v, why);
    zt_strbuf_append(b, s, n);
    return true;
}

bool zt_chat_print(render *r, val v, char num[32], const char **s, size_t *n, char why[256]) {
    if (v.k != V_LIST && v.k != V_DICT)
        return zt_chat_text(v, num, s, n) || unprintable(v, why);
    zt_strbuf b = {0};
    bool ok = repr(&b, v, why);
    char *out = ok && !b.oom ? zt_chat_alloc(r, b.len) : NULL;
    if (ok && !out)
        snprintf(why, 256, "%s", zt_chat_nomem(r));
    if (out) {
        memcpy(out, b.data, b.len);
        *s = out, *n = b.len;
    }
    zt_strbuf_free(&b);
    return out != NULL;
}

val zt_chat_not_list(val v) {
    ((cJSON *)v.j)->type |= ZT_CHAT_NOT_LIST;
    v.b = true;
    return v;
}

val zt_chat_generator(val v) {
    ((cJSON *)v.j)->type |= ZT_CHAT_GENERATOR;
    return zt_chat_not_list(v);
}

bool zt_chat_is_generator(val v) {
    return v.k == V_LIST && v.j && (v.j->type & ZT_CHAT_GENERATOR);
}

val zt_chat_dict_view(val v, int view) {
    ((cJSON *)v.j)->type |= view;
    return zt_chat_not_list(v);
}

int zt_chat_view_of(val v) {
    return v.k == V_LIST && v.j ? v.j->type & ZT_CHAT_DICT_VIEW : 0;
}

bool zt_chat_is_tuple(val v) {
    return v.k == V_LIST && v.b && !zt_chat_is_generator(v) && !zt_chat_view_of(v);
}

bool zt_chat_consume(val v, char why[256]) {
    if (!zt_chat_is_generator(v))
        return true;
    if (v.j->type & ZT_CHAT_CONSUMED) {
        snprintf(why, 256, "a generator (select, reject, map, items, ...) used a second time is "
                 "not supported: its first use (a for, |list, |join, |first, 'in', a filter) "
                 "consumed it, and jinja2 gives only what that left; |list makes a list to use "
                 "twice");
        return false;
    }
    ((cJSON *)v.j)->type |= ZT_CHAT_CONSUMED;
    return true;
}

/* Python's whitespace in UTF-8: the byte length of the one at s (or ending at s + n), 0 if none. */
static size_t space_at(const unsigned char *s, size_t n) {
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20)))
        return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2;
    if (n >= 3 && ((s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80) ||
                   (s[0] == 0xe2 && s[1] == 0x80 &&
                    ((s[2] >= 0x80 && s[2] <= 0x8a) || s[2] == 0xa8 || s[2] == 0xa9 ||
                     s[2] == 0xaf)) ||
                   (s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) ||
                   (s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80)))
        return 3;
    return 0;
}

size_t zt_chat_space_prefix(const char *s, size_t n) {
    size_t k = 0, w;
    while ((w = space_at((const unsigned char *)s + k, n - k)) > 0)
        k += w;
    return k;
}

val zt_chat_strip_space(val v, bool left, bool right) {
    if (left) {
        size_t k = zt_chat_space_prefix(v.s, v.n);
        v.s += k, v.n -= k;
    }
    if (right)
        v.n -= zt_chat_space_suffix(v.s, v.n);
    return v;
}

/* UTF-8 is self-synchronising, so a whitespace sequence found ending at the end is one. */
size_t zt_chat_space_suffix(const char *s, size_t n) {
    size_t k = 0;
    for (;;) {
        size_t w = 0;
        for (size_t len = 1; len <= 3 && len <= n - k && !w; len++)
            if (space_at((const unsigned char *)s + n - k - len, len) == len)
                w = len;
        if (!w)
            return k;
        k += w;
    }
}

/* The decimal text of v in buf or v's digits: an integer (a bool as 1 or 0, one past 64 bits
 * when its digits are known) or, with floats, a float that is a whole number (glibc prints a
 * double's exact value). False for anything else. */
static bool decimal(val v, bool floats, char buf[400], const char **s, size_t *n) {
    if (v.k == V_INT || v.k == V_BOOL) {
        *n = (size_t)snprintf(buf, 400, "%lld", v.k == V_INT ? v.i : (long long)v.b);
        *s = buf;
        return true;
    }
    if (v.k == V_FLOAT && v.b) {
        *s = v.s, *n = v.n;
        return v.s != NULL;
    }
    if (!floats || v.k != V_FLOAT || !isfinite(v.d) || v.d != floor(v.d))
        return false;
    *n = (size_t)snprintf(buf, 400, "%.0f", v.d == 0 ? 0.0 : v.d); /* -0.0 is 0 */
    *s = buf;
    return true;
}

/* The order of two integers written in decimal without leading zeros: -1, 0 or 1. */
static int decimal_order(const char *x, size_t nx, const char *y, size_t ny) {
    bool neg = x[0] == '-';
    if (neg != (y[0] == '-'))
        return neg ? -1 : 1;
    x += neg, nx -= neg, y += neg, ny -= neg;
    int c = nx != ny ? (nx < ny ? -1 : 1) : memcmp(x, y, nx);
    c = c < 0 ? -1 : c > 0;
    return neg ? -c : c;
}

/* Whether a and b are both whole numbers (with floats, whole floats too) and *c their order. */
static bool whole_order(val a, val b, bool floats, int *c) {
    char ba[400], bb[400];
    const char *sa, *sb;
    size_t na, nb;
    if (!decimal(a, floats, ba, &sa, &na) || !decimal(b, floats, bb, &sb, &nb))
        return false;
    *c = decimal_order(sa, na, sb, nb);
    return true;
}

bool zt_chat_int_order(val a, val b, int *c) {
    if ((a.k == V_INT || a.k == V_BOOL) && (b.k == V_INT || b.k == V_BOOL)) {
        long long x = a.k == V_INT ? a.i : a.b, y = b.k == V_INT ? b.i : b.b;
        *c = x < y ? -1 : x > y;
        return true;
    }
    return whole_order(a, b, false, c);
}

const char *zt_chat_unhashable(val v) {
    if (zt_chat_is_generator(v) || zt_chat_view_of(v) == ZT_CHAT_DICT_VALUES)
        return NULL; /* by identity */
    if (v.k == V_DICT || (v.k == V_LIST && !zt_chat_is_tuple(v)))
        return zt_chat_type_name(v);
    for (int k = 0; v.k == V_LIST && k < v.count; k++) {
        const char *t = zt_chat_unhashable(zt_chat_list_item(v, k));
        if (t)
            return t;
    }
    return NULL;
}

/* Python's == of two dict views: keys() and items() as sets (the same count, and each item of a
 * one of b's: a dict's keys are distinct), values() only itself (each call makes a new array,
 * numbered in its valueint, which the arrays referencing it copy: an empty view has no items
 * whose address could tell it). Python looks a's items up in b one by one: items() against
 * keys() hashes the first pair, which fails when its value is a list or dict. */
static int views_equal(val a, val b, char why[256]) {
    int va = zt_chat_view_of(a), vb = zt_chat_view_of(b);
    if (va == ZT_CHAT_DICT_VALUES || vb == ZT_CHAT_DICT_VALUES)
        return va == vb && a.j->valueint == b.j->valueint;
    if (!va || !vb || a.count != b.count)
        return 0;
    if (va != vb && a.count > 0) { /* keys() holds strings, items() tuples */
        const char *t = va == ZT_CHAT_DICT_ITEMS ? zt_chat_unhashable(zt_chat_list_item(a, 0)) : NULL;
        if (t)
            snprintf(why, 256, "unhashable type: '%s'", t);
        return t ? -1 : 0;
    }
    for (int k = 0; k < a.count; k++) {
        int found = 0;
        for (int i = 0; i < b.count && !found; i++)
            found = zt_chat_equal(zt_chat_list_item(a, k), zt_chat_list_item(b, i), why);
        if (found != 1)
            return found;
    }
    return 1;
}

int zt_chat_equal(val a, val b, char why[256]) {
    if ((a.k == V_INT || a.k == V_BOOL) && (b.k == V_INT || b.k == V_BOOL))
        return (a.k == V_INT ? a.i : a.b) == (b.k == V_INT ? b.i : b.b);
    if (a.k == V_FLOAT || b.k == V_FLOAT) {
        bool na = a.k == V_FLOAT || a.k == V_INT || a.k == V_BOOL;
        bool nb = b.k == V_FLOAT || b.k == V_INT || b.k == V_BOOL;
        /* 5.0 == 5 and 2**53 + 1 != 2.0**53, as in Python, which compares an int with a float
         * exactly: by their decimal digits */
        int c;
        if (na && nb && whole_order(a, b, true, &c))
            return c == 0;
        /* a fraction, or an integer past 64 bits without its digits, compares as a double */
        double x = a.k == V_FLOAT ? a.d : a.k == V_INT ? (double)a.i : a.b;
        double y = b.k == V_FLOAT ? b.d : b.k == V_INT ? (double)b.i : b.b;
        return na && nb && x == y;
    }
    if (a.k != b.k)
        return 0;
    if (zt_chat_is_generator(a) || zt_chat_is_generator(b)) /* Python's object identity */
        return a.j == b.j;
    if (zt_chat_view_of(a) || zt_chat_view_of(b))
        return views_equal(a, b, why);
    if (a.k == V_LIST && zt_chat_is_tuple(a) != zt_chat_is_tuple(b)) /* (1, 2) != [1, 2] */
        return 0;
    switch (a.k) {
    case V_STR: return a.n == b.n && memcmp(a.s, b.s, a.n) == 0;
    case V_NONE: case V_UNDEF: return 1;
    case V_LOOP: return a.loop == b.loop;
    case V_NS: return a.j == b.j;
    case V_LIST: {
        if (a.count != b.count)
            return 0;
        for (int k = 0; k < a.count; k++) {
            int eq = zt_chat_equal(zt_chat_list_item(a, k), zt_chat_list_item(b, k), why);
            if (eq != 1)
                return eq;
        }
        return 1;
    }
    case V_DICT: {
        if (cJSON_GetArraySize(a.j) != cJSON_GetArraySize(b.j))
            return 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, a.j) {
            const cJSON *y = cJSON_GetObjectItemCaseSensitive(b.j, x->string);
            int eq = y ? zt_chat_equal(zt_chat_from_json(x), zt_chat_from_json(y), why) : 0;
            if (eq != 1)
                return eq;
        }
        return 1;
    }
    default: return 0;
    }
}

const char *zt_chat_type_name(val v) {
    switch (v.k) {
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return v.b ? "int" : "float";
    case V_STR: return "str";
    case V_LIST:
        switch (zt_chat_view_of(v)) {
        case ZT_CHAT_DICT_KEYS: return "dict_keys";
        case ZT_CHAT_DICT_VALUES: return "dict_values";
        case ZT_CHAT_DICT_ITEMS: return "dict_items";
        default: return zt_chat_is_generator(v) ? "generator" : v.b ? "tuple" : "list";
        }
    case V_DICT: return "dict";
    case V_LOOP: return "LoopContext";
    case V_FUNC: return "function";
    case V_NS: return "Namespace";
    default: return "Undefined";
    }
}

/* An integer as an item of a list a render builds: a cJSON number, a double, and with more than
 * 15 digits its digits too, as zt_json_parse keeps them (zt_json_int_digits), so it reads back
 * exact. */
static cJSON *whole_number(double d, const char *digits, size_t n, char why[256]) {
    cJSON *x = cJSON_CreateNumber(d);
    if (x && n - (digits[0] == '-') > 15) {
        x->valuestring = cJSON_malloc(n + 1);
        if (x->valuestring) {
            memcpy(x->valuestring, digits, n);
            x->valuestring[n] = '\0';
        } else {
            cJSON_Delete(x);
            x = NULL;
        }
    }
    if (!x)
        snprintf(why, 256, "out of memory");
    return x;
}

/* v as an item of a list a render builds: strings copied (a value's text need not end in a
 * NUL), lists and objects referenced; NULL when v cannot be one (why says so) or out of memory. */
static cJSON *to_json(render *r, val v, char why[256]) {
    switch (v.k) {
    case V_NONE: return cJSON_CreateNull();
    case V_BOOL: return cJSON_CreateBool(v.b);
    case V_INT: {
        char digits[32];
        snprintf(digits, sizeof digits, "%lld", v.i);
        return whole_number((double)v.i, digits, strlen(digits), why);
    }
    case V_FLOAT: { /* still a float when integral */
        if (v.b && !v.s) {
            snprintf(why, 256, "a list or object holding an integer beyond 64 bits that a "
                     "render computed is not supported");
            return NULL;
        }
        if (v.b)
            return whole_number(v.d, v.s, v.n, why);
        cJSON *x = cJSON_CreateNumber(v.d);
        if (x)
            x->type |= ZT_JSON_FLOAT_LITERAL;
        return x;
    }
    case V_STR: {
        char *s = zt_chat_alloc(r, v.n);
        if (!s) {
            snprintf(why, 256, "%s", zt_chat_nomem(r));
            return NULL;
        }
        memcpy(s, v.s, v.n);
        s[v.n] = '\0';
        return cJSON_CreateStringReference(s);
    }
    case V_DICT: return cJSON_CreateObjectReference(v.j->child);
    case V_LIST: { /* a tuple or dict view stays one inside (ZT_CHAT_NOT_LIST) */
        if (zt_chat_is_generator(v)) {
            snprintf(why, 256, "a list, dict or namespace holding a generator (select, reject, "
                     "map, items, ...) is not supported: its copy there would not be consumed "
                     "with it; |list makes a list to hold");
            return NULL;
        }
        if (v.lo == 0 && (v.step == 1 || v.step == 0) && v.count == cJSON_GetArraySize(v.j)) {
            cJSON *a = cJSON_CreateArrayReference(v.j->child);
            if (a) {
                a->type |= v.j->type & (ZT_CHAT_NOT_LIST | ZT_CHAT_DICT_VIEW);
                a->valueint = v.j->valueint; /* a values() view's identity */
            }
            return a;
        }
        cJSON *a = cJSON_CreateArray(); /* a slice: of a tuple (a view has none) */
        if (a && v.b)
            a->type |= ZT_CHAT_NOT_LIST;
        for (int k = 0; a && k < v.count; k++) {
            cJSON *x = to_json(r, zt_chat_list_item(v, k), why);
            if (!x || !cJSON_AddItemToArray(a, x)) {
                cJSON_Delete(a);
                return NULL;
            }
        }
        return a;
    }
    default:
        snprintf(why, 256, "a list, object or namespace holding a %s is not supported", zt_chat_type_name(v));
        return NULL;
    }
}

/* A new array or object for n items, kept in r->made. */
static cJSON *made(render *r, bool object, int n) {
    if (!zt_chat_charge(r, (size_t)(n + 1) * sizeof(cJSON)))
        return NULL;
    if (!r->made && !(r->made = cJSON_CreateArray()))
        return NULL;
    cJSON *a = object ? cJSON_CreateObject() : cJSON_CreateArray();
    if (!a || !cJSON_AddItemToArray(r->made, a)) {
        cJSON_Delete(a);
        return NULL;
    }
    return a;
}

bool zt_chat_make_list(render *r, const val *items, int n, val *out, char why[256]) {
    cJSON *a = made(r, false, n);
    snprintf(why, 256, "%s", zt_chat_nomem(r));
    if (!a)
        return false;
    for (int k = 0; k < n; k++) {
        cJSON *x = to_json(r, items[k], why);
        if (!x || !cJSON_AddItemToArray(a, x)) {
            cJSON_Delete(x);
            return false;
        }
    }
    *out = zt_chat_from_json(a);
    return true;
}

bool zt_chat_make_dict(render *r, const val *keys, const val *items, int n, bool ns, val *out,
                       char why[256]) {
    cJSON *o = made(r, true, n);
    snprintf(why, 256, "%s", zt_chat_nomem(r));
    if (!o)
        return false;
    for (int k = 0; k < n; k++) {
        char key[128];
        if (keys[k].k != V_STR) {
            snprintf(why, 256, "an object key that is a %s is not supported",
                     zt_chat_type_name(keys[k]));
            return false;
        }
        snprintf(key, sizeof key, "%.*s", (int)keys[k].n, keys[k].s);
        cJSON *x = to_json(r, items[k], why);
        if (!x)
            return false;
        cJSON *old = cJSON_DetachItemFromObjectCaseSensitive(o, key);
        if (old)
            cJSON_AddItemToArray(r->made, old);
        if (!cJSON_AddItemToObject(o, key, x)) {
            cJSON_Delete(x);
            return false;
        }
    }
    *out = ns ? (val){.k = V_NS, .j = o} : zt_chat_from_json(o);
    return true;
}

bool zt_chat_ns_set(render *r, val ns, const char *name, val v, char why[256]) {
    snprintf(why, 256, "%s", zt_chat_nomem(r));
    cJSON *x = to_json(r, v, why);
    if (!x)
        return false;
    /* a value read from the old one may still be in use: it moves to made, not away */
    cJSON *old = cJSON_DetachItemFromObjectCaseSensitive((cJSON *)ns.j, name);
    if (old)
        cJSON_AddItemToArray(r->made, old);
    if (!cJSON_AddItemToObject((cJSON *)ns.j, name, x)) {
        cJSON_Delete(x);
        return false;
    }
    return true;
}
