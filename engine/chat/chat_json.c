/* Values as Python's json.dumps writes them (chat_template_internal.h), for the tojson filter
 * transformers gives chat templates: its escapes, separators, indentation and key sorting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_internal.h"
#include "ztrain/strbuf.h"

/* One \uXXXX escape. */
static void put_u(zt_strbuf *b, unsigned u) {
    zt_strbuf_printf(b, "\\u%04x", u);
}

/* The code point of the UTF-8 sequence at s (w bytes). */
static unsigned decode(const unsigned char *s, size_t w) {
    if (w == 1)
        return s[0];
    unsigned cp = s[0] & (0x7f >> w);
    for (size_t k = 1; k < w; k++)
        cp = cp << 6 | (s[k] & 0x3f);
    return cp;
}

/* A string as json's encoder quotes it: \" \\ \n \r \t \b \f, other control characters as
 * \u00XX; with ensure_ascii everything outside ' '..'~' as \uXXXX (UTF-16 surrogate pairs past
 * U+FFFF). */
static void put_string(zt_strbuf *b, const char *s, size_t n, bool ascii) {
    zt_strbuf_putc(b, '"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t w = zt_chat_cp_len(c);
        w = w > n - i ? n - i : w;
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f" : NULL;
        if (esc) {
            zt_strbuf_append(b, esc, 2);
        } else if (c < 0x20 || (ascii && (c >= 0x7f))) {
            unsigned cp = decode((const unsigned char *)s + i, w);
            if (cp > 0xffff) {
                cp -= 0x10000;
                put_u(b, 0xd800 | cp >> 10);
                put_u(b, 0xdc00 | (cp & 0x3ff));
            } else {
                put_u(b, cp);
            }
        } else {
            zt_strbuf_append(b, s + i, w);
        }
        i += w;
    }
    zt_strbuf_putc(b, '"');
}

static void newline(zt_strbuf *b, const zt_chat_json_opts *o, int level) {
    zt_strbuf_putc(b, '\n');
    for (int k = 0; k < level; k++)
        zt_strbuf_append(b, o->indent, o->indent_n);
}

static int by_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static bool dump(zt_strbuf *b, val v, const zt_chat_json_opts *o, int level, char why[256]);

/* A list's items or an object's members (keys[0..n) with their values), between open and
 * close, as json's encoder separates and indents them. */
static bool dump_items(zt_strbuf *b, val v, const cJSON **members, int n,
                       const zt_chat_json_opts *o, int level, char why[256]) {
    char open = members ? '{' : '[';
    zt_strbuf_putc(b, open);
    if (n == 0) {
        zt_strbuf_putc(b, members ? '}' : ']');
        return true;
    }
    for (int k = 0; k < n; k++) {
        if (k)
            zt_strbuf_append(b, o->item_sep, o->item_sep_n);
        if (o->indent)
            newline(b, o, level + 1);
        val item = members ? zt_chat_from_json(members[k]) : zt_chat_list_item(v, k);
        if (members) {
            put_string(b, members[k]->string, strlen(members[k]->string), o->ensure_ascii);
            zt_strbuf_append(b, o->key_sep, o->key_sep_n);
        }
        if (!dump(b, item, o, level + 1, why))
            return false;
    }
    if (o->indent)
        newline(b, o, level);
    zt_strbuf_putc(b, members ? '}' : ']');
    return true;
}

static bool dump(zt_strbuf *b, val v, const zt_chat_json_opts *o, int level, char why[256]) {
    switch (v.k) {
    case V_STR: put_string(b, v.s, v.n, o->ensure_ascii); return true;
    case V_INT: zt_strbuf_printf(b, "%lld", v.i); return true;
    case V_BOOL: zt_strbuf_puts(b, v.b ? "true" : "false"); return true;
    case V_NONE: zt_strbuf_puts(b, "null"); return true;
    case V_LIST:
        if (zt_chat_view_of(v)) { /* json.dumps writes a tuple as a list, but no view */
            snprintf(why, 256, "Object of type %s is not JSON serializable", zt_chat_type_name(v));
            return false;
        }
        return dump_items(b, v, NULL, v.count, o, level, why);
    case V_DICT: {
        int n = cJSON_GetArraySize(v.j), k = 0;
        const cJSON **members = malloc((size_t)(n ? n : 1) * sizeof *members), *x;
        if (!members) {
            b->oom = true;
            return true;
        }
        cJSON_ArrayForEach(x, v.j)
            members[k++] = x;
        if (o->sort_keys)
            qsort(members, (size_t)n, sizeof *members, by_key);
        bool ok = dump_items(b, v, members, n, o, level, why);
        free(members);
        return ok;
    }
    case V_FLOAT: {
        char num[32];
        const char *s;
        size_t n;
        if (!zt_chat_text(v, num, &s, &n)) {
            snprintf(why, 256, "tojson of %s is not supported",
                     v.b ? "an integer beyond 64 bits" : "an infinite float");
            return false;
        }
        zt_strbuf_append(b, s, n);
        return true;
    }
    default:
        snprintf(why, 256, "Object of type %s is not JSON serializable", zt_chat_type_name(v));
        return false;
    }
}

bool zt_chat_json_dump(render *r, val v, const zt_chat_json_opts *o, val *out, char why[256]) {
    zt_chat_json_opts opts = *o;
    /* json.dumps's separators: (', ', ': '), or (',', ': ') when it indents */
    if (!opts.item_sep)
        opts.item_sep = opts.indent ? "," : ", ", opts.item_sep_n = opts.indent ? 1 : 2;
    if (!opts.key_sep)
        opts.key_sep = ": ", opts.key_sep_n = 2;
    zt_strbuf b = {0};
    bool ok = dump(&b, v, &opts, 0, why);
    char *s = ok && !b.oom ? zt_chat_alloc(r, b.len) : NULL;
    if (ok && !s)
        snprintf(why, 256, "%s", zt_chat_nomem(r));
    if (s) {
        memcpy(s, b.data, b.len);
        *out = zt_chat_str(s, b.len);
    }
    zt_strbuf_free(&b);
    return s != NULL;
}
