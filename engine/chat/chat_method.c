/* The methods a chat template may call (chat_template_internal.h), as Python computes them on
 * jinja2's values: str.strip, lstrip, rstrip (with or without chars), startswith, endswith and
 * replace, split, upper, lower, capitalize and title, dict.get, items, keys and values (as
 * lists), and loop.cycle. Strings count and strip code points, as Python's str does. */
#include <stdio.h>
#include <string.h>

#include "chat_template_internal.h"

static const zt_chat_method METHODS[] = {
    {"strip", 0, 1},      {"lstrip", 0, 1},   {"rstrip", 0, 1}, {"startswith", 1, 1},
    {"endswith", 1, 1},   {"replace", 2, 3},  {"get", 1, 2},    {"cycle", 1, 8},
    {"items", 0, 0},      {"keys", 0, 0},     {"values", 0, 0}, {"split", 0, 2},
    {"upper", 0, 0},      {"lower", 0, 0},    {"title", 0, 0},  {"capitalize", 0, 0},
};

/* The case methods are Python's, which are not all jinja2's filters of the same name: str.title
 * starts a word after any code point that is not cased ("they're".title() is "They'Re"), the
 * title filter only after whitespace and -({[<. */
static const struct {
    const char *name;
    zt_chat_case_kind kind;
} CASES[] = {
    {"upper", ZT_CASE_UPPER}, {"lower", ZT_CASE_LOWER}, {"title", ZT_CASE_TITLE},
    {"capitalize", ZT_CASE_CAPITALIZE},
};

const zt_chat_method *zt_chat_method_find(const char *name, size_t n) {
    for (size_t k = 0; k < sizeof METHODS / sizeof METHODS[0]; k++)
        if (strlen(METHODS[k].name) == n && memcmp(METHODS[k].name, name, n) == 0)
            return &METHODS[k];
    return NULL;
}

static bool is(const zt_chat_method *m, const char *name) { return strcmp(m->name, name) == 0; }

/* Whether the code point at s (w bytes) is one of chars' code points. */
static bool in_chars(const char *s, size_t w, val chars) {
    for (size_t i = 0; i < chars.n;) {
        size_t cw = zt_chat_cp_len((unsigned char)chars.s[i]);
        if (cw == w && i + cw <= chars.n && memcmp(chars.s + i, s, w) == 0)
            return true;
        i += cw;
    }
    return false;
}

/* The code point ending at s + n starts this many bytes before it (UTF-8 continuation bytes are
 * 10xxxxxx). */
static size_t last_cp_len(const char *s, size_t n) {
    size_t w = 1;
    while (w < n && w < 4 && ((unsigned char)s[n - w] & 0xc0) == 0x80)
        w++;
    return w;
}

/* str.strip/lstrip/rstrip(chars): chars none strips Python's whitespace, as trim does. */
static val strip_chars(val v, val chars, bool left, bool right) {
    if (chars.k == V_NONE)
        return zt_chat_strip_space(v, left, right);
    while (left && v.n) {
        size_t w = zt_chat_cp_len((unsigned char)*v.s);
        w = w > v.n ? v.n : w;
        if (!in_chars(v.s, w, chars))
            break;
        v.s += w, v.n -= w;
    }
    while (right && v.n) {
        size_t w = last_cp_len(v.s, v.n);
        if (!in_chars(v.s + v.n - w, w, chars))
            break;
        v.n -= w;
    }
    return v;
}

/* str.replace(old, new, count): count < 0 replaces all; an empty old inserts new before each
 * code point and at the end, as Python does. */
static bool replace(render *r, val v, val old, val new, long long count, val *out) {
    size_t hits = 0;
    if (old.n == 0) { /* a place before each code point, and the end */
        hits = (size_t)zt_chat_items(v, NULL) + 1;
    } else {
        for (size_t i = 0; i + old.n <= v.n;)
            if (memcmp(v.s + i, old.s, old.n) == 0)
                hits++, i += old.n;
            else
                i++;
    }
    if (count >= 0 && (unsigned long long)count < hits)
        hits = (size_t)count;
    char *s = zt_chat_alloc(r, v.n + hits * new.n);
    if (!s)
        return false;
    size_t n = 0, done = 0, i = 0;
    for (;;) {
        bool hit = done < hits && (old.n == 0 || (i + old.n <= v.n &&
                                                  memcmp(v.s + i, old.s, old.n) == 0));
        if (hit) {
            memcpy(s + n, new.s, new.n);
            n += new.n, done++;
            i += old.n;
        }
        if (i >= v.n)
            break;
        if (!hit || old.n == 0) { /* the code point (or, looking for old, the byte) at i */
            size_t w = old.n ? 1 : zt_chat_cp_len((unsigned char)v.s[i]);
            w = w > v.n - i ? v.n - i : w;
            memcpy(s + n, v.s + i, w);
            n += w, i += w;
        }
    }
    *out = zt_chat_str(s, n);
    return true;
}

/* str.split(sep=None, maxsplit=-1): at each sep, or, with sep none, at runs of Python's
 * whitespace with none kept at either end. */
static bool split(render *r, val v, val sep, long long max, val *out, char why[256]) {
    val *parts = (val *)(void *)zt_chat_alloc(r, (v.n + 1) * sizeof *parts);
    if (!parts) {
        snprintf(why, 256, "%s", zt_chat_nomem(r));
        return false;
    }
    int n = 0;
    if (sep.k == V_NONE) {
        v = zt_chat_strip_space(v, true, false);
        while (v.n) {
            size_t k = 0;
            if (max < 0 || n < max)
                while (k < v.n && !zt_chat_space_prefix(v.s + k, v.n - k))
                    k += zt_chat_cp_len((unsigned char)v.s[k]);
            else /* past maxsplit the rest is one part, its trailing whitespace kept */
                k = v.n;
            k = k > v.n ? v.n : k;
            parts[n++] = zt_chat_str(v.s, k);
            v.s += k, v.n -= k;
            v = zt_chat_strip_space(v, true, false);
        }
    } else {
        for (;;) {
            size_t k = 0;
            while (k + sep.n <= v.n && memcmp(v.s + k, sep.s, sep.n) != 0)
                k++;
            if (k + sep.n > v.n || (max >= 0 && n >= max))
                break;
            parts[n++] = zt_chat_str(v.s, k);
            v.s += k + sep.n, v.n -= k + sep.n;
        }
        parts[n++] = v;
    }
    return zt_chat_make_list(r, parts, n, out, why);
}

/* dict.items(), keys(), values() as lists marked as dict views ((key, value) pairs as tuples). */
static bool dict_view(render *r, const zt_chat_method *m, val v, val *out, char why[256]) {
    int n = cJSON_GetArraySize(v.j), k = 0;
    val *all = (val *)(void *)zt_chat_alloc(r, (size_t)(n ? n : 1) * sizeof *all);
    if (!all) {
        snprintf(why, 256, "%s", zt_chat_nomem(r));
        return false;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, v.j) {
        val key = zt_chat_str(x->string, strlen(x->string)), pair[2] = {key, zt_chat_from_json(x)};
        if (is(m, "items") && !zt_chat_make_list(r, pair, 2, &all[k], why))
            return false;
        all[k] = is(m, "items") ? zt_chat_not_list(all[k]) /* a tuple */
                 : is(m, "keys") ? key : pair[1];
        k++;
    }
    /* a dict view (dict_items([...]) when printed) */
    if (!zt_chat_make_list(r, all, n, out, why))
        return false;
    *out = zt_chat_dict_view(*out, is(m, "items") ? ZT_CHAT_DICT_ITEMS
                                   : is(m, "keys") ? ZT_CHAT_DICT_KEYS : ZT_CHAT_DICT_VALUES);
    if (is(m, "values"))
        ((cJSON *)out->j)->valueint = ++r->values_made;
    return true;
}

bool zt_chat_method_call(render *r, const zt_chat_method *m, val v, const val *args, int nargs,
                         val *out, char why[256]) {
    const char *type = zt_chat_type_name(v);
    bool on_dict = is(m, "get") || is(m, "items") || is(m, "keys") || is(m, "values");
    bool on_str = !on_dict && !is(m, "cycle");
    if ((on_str && v.k != V_STR) || (on_dict && v.k != V_DICT) ||
        (is(m, "cycle") && v.k != V_LOOP)) {
        snprintf(why, 256, "'%s object' has no attribute '%s'", type, m->name);
        return false;
    }
    if (is(m, "cycle")) { /* the item for this iteration, round the arguments */
        *out = args[v.loop->index0 % nargs];
        return true;
    }
    if (on_dict && !is(m, "get"))
        return dict_view(r, m, v, out, why);
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++)
        if (is(m, CASES[k].name))
            return zt_chat_case(r, v, CASES[k].kind, out, why);
    if (is(m, "get")) {
        char key[128];
        const cJSON *j = NULL;
        if (args[0].k == V_STR) {
            snprintf(key, sizeof key, "%.*s", (int)args[0].n, args[0].s);
            j = cJSON_GetObjectItemCaseSensitive(v.j, key);
        }
        *out = j ? zt_chat_from_json(j) : nargs > 1 ? args[1] : (val){.k = V_NONE};
        return true;
    }
    bool left = is(m, "strip") || is(m, "lstrip"), right = is(m, "strip") || is(m, "rstrip");
    if (left || right) {
        val chars = nargs ? args[0] : (val){.k = V_NONE};
        if (chars.k != V_NONE && chars.k != V_STR) {
            snprintf(why, 256, "%s arg must be None or str", m->name);
            return false;
        }
        *out = strip_chars(v, chars, left, right);
        return true;
    }
    if (is(m, "startswith") || is(m, "endswith")) {
        if (args[0].k != V_STR) { /* the subset has no tuples */
            snprintf(why, 256, "%s first arg must be str or a tuple of str, not %s", m->name,
                     zt_chat_type_name(args[0]));
            return false;
        }
        val p = args[0];
        bool hit = p.n <= v.n && memcmp(is(m, "startswith") ? v.s : v.s + v.n - p.n, p.s, p.n) == 0;
        *out = zt_chat_bool(hit);
        return true;
    }
    if (is(m, "split")) {
        val sep = nargs ? args[0] : (val){.k = V_NONE};
        long long max = -1;
        if ((sep.k != V_NONE && sep.k != V_STR) ||
            (nargs > 1 && args[1].k != V_INT && args[1].k != V_BOOL)) {
            snprintf(why, 256, "split() takes a separator (str or None) and an integer");
            return false;
        }
        if (sep.k == V_STR && sep.n == 0) {
            snprintf(why, 256, "empty separator");
            return false;
        }
        if (nargs > 1)
            max = args[1].k == V_INT ? args[1].i : args[1].b;
        return split(r, v, sep, max, out, why);
    }
    /* replace */
    for (int k = 0; k < 2; k++)
        if (args[k].k != V_STR) {
            snprintf(why, 256, "replace() argument %d must be str, not %s", k + 1,
                     zt_chat_type_name(args[k]));
            return false;
        }
    long long count = -1;
    if (nargs > 2) {
        if (args[2].k != V_INT && args[2].k != V_BOOL) {
            snprintf(why, 256, "'%s' object cannot be interpreted as an integer",
                     zt_chat_type_name(args[2]));
            return false;
        }
        count = args[2].k == V_INT ? args[2].i : args[2].b;
    }
    if (!replace(r, v, args[0], args[1], count, out)) {
        snprintf(why, 256, "%s", zt_chat_nomem(r));
        return false;
    }
    return true;
}
