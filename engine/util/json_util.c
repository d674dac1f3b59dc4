/* JSON reading helpers with path-aware messages (see json_util.h).
 *
 * cJSON is lenient where users make mistakes (it takes "01", raw newlines inside strings, and it
 * places the error of a trailing comma after the closing brace), so a small strict scanner runs
 * first: it pins a syntax error to the character at fault and words it as Python's json module
 * does, which is what DeepSpeed users have seen before. Only text it accepts reaches cJSON. */
#include "ztrain/json_util.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/fsutil.h"

/* cJSON refuses nesting deeper than 1000; staying below it keeps our message the one users see. */
#define SCAN_MAX_DEPTH 512

/* ------------------------------------------------------------------------------------------ */
/* Strict syntax scan                                                                          */

/* Where a number is written in the text, and whether with a fraction or an exponent (Python's
 * json reads it as a float). */
typedef struct {
    size_t at, len;
    bool is_float;
} num_literal;

typedef struct {
    const char *s;
    size_t n, pos;
    int depth;
    const char *err; /* first error found, NULL while the text is fine */
    size_t err_pos;
    /* The numbers, in document order. NULL when the allocation failed. */
    num_literal *nums;
    size_t nnum, cap;
} scanner;

static bool scan_fail(scanner *sc, size_t at, const char *msg) {
    if (!sc->err) {
        sc->err = msg;
        sc->err_pos = at;
    }
    return false;
}

static int scan_peek(const scanner *sc) {
    return sc->pos < sc->n ? (unsigned char)sc->s[sc->pos] : -1;
}

static void scan_ws(scanner *sc) {
    while (sc->pos < sc->n) {
        char c = sc->s[sc->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        sc->pos++;
    }
}

static bool scan_value(scanner *sc);

static bool scan_string(scanner *sc) {
    size_t start = sc->pos++;
    for (;;) {
        if (sc->pos >= sc->n)
            return scan_fail(sc, start, "Unterminated string starting here");
        unsigned char c = (unsigned char)sc->s[sc->pos];
        if (c == '"') {
            sc->pos++;
            return true;
        }
        if (c < 0x20)
            return scan_fail(sc, sc->pos, "Invalid control character in string");
        if (c != '\\') {
            sc->pos++;
            continue;
        }
        size_t esc = sc->pos++;
        if (sc->pos >= sc->n)
            return scan_fail(sc, start, "Unterminated string starting here");
        c = (unsigned char)sc->s[sc->pos];
        if (c == 'u') {
            for (size_t i = 1; i <= 4; i++)
                if (sc->pos + i >= sc->n || !isxdigit((unsigned char)sc->s[sc->pos + i]))
                    return scan_fail(sc, esc, "Invalid \\uXXXX escape");
            /* cJSON would store the NUL and every C string would end there: a name or a path
             * cut short without a word. */
            if (memcmp(sc->s + sc->pos + 1, "0000", 4) == 0)
                return scan_fail(sc, esc, "\\u0000 (NUL) is not allowed in a string");
            sc->pos += 5;
        } else if (c != 0 && strchr("\"\\/bfnrt", c)) {
            sc->pos++;
        } else {
            return scan_fail(sc, esc, "Invalid \\escape");
        }
    }
}

static bool scan_digits(scanner *sc) {
    if (!isdigit(scan_peek(sc)))
        return false;
    while (isdigit(scan_peek(sc)))
        sc->pos++;
    return true;
}

static bool scan_number(scanner *sc) {
    size_t start = sc->pos;
    if (scan_peek(sc) == '-')
        sc->pos++;
    if (scan_peek(sc) == '0') {
        sc->pos++;
        if (isdigit(scan_peek(sc)))
            return scan_fail(sc, start, "Invalid number (leading zeros are not allowed)");
    } else if (!scan_digits(sc)) {
        return scan_fail(sc, start, "Expecting value");
    }
    if (scan_peek(sc) == '.') {
        sc->pos++;
        if (!scan_digits(sc))
            return scan_fail(sc, start, "Invalid number");
    }
    if (scan_peek(sc) == 'e' || scan_peek(sc) == 'E') {
        sc->pos++;
        if (scan_peek(sc) == '+' || scan_peek(sc) == '-')
            sc->pos++;
        if (!scan_digits(sc))
            return scan_fail(sc, start, "Invalid number");
    }
    if (sc->nnum == sc->cap) {
        size_t cap = sc->cap ? 2 * sc->cap : 64;
        num_literal *f = realloc(sc->nums, cap * sizeof *f);
        if (!f)
            return scan_fail(sc, start, "out of memory");
        sc->nums = f;
        sc->cap = cap;
    }
    size_t len = sc->pos - start;
    sc->nums[sc->nnum++] = (num_literal){
        .at = start, .len = len,
        .is_float = memchr(sc->s + start, '.', len) || memchr(sc->s + start, 'e', len) ||
                    memchr(sc->s + start, 'E', len)};
    return true;
}

static bool scan_literal(scanner *sc, const char *word) {
    size_t len = strlen(word);
    if (sc->n - sc->pos < len || memcmp(sc->s + sc->pos, word, len) != 0)
        return scan_fail(sc, sc->pos, "Expecting value");
    sc->pos += len;
    return true;
}

/* Objects and arrays share one loop: `close` is '}' or ']', and objects read "name": first. */
static bool scan_container(scanner *sc, char close) {
    bool object = close == '}';
    if (++sc->depth > SCAN_MAX_DEPTH)
        return scan_fail(sc, sc->pos, "Nesting too deep");
    sc->pos++;
    scan_ws(sc);
    if (scan_peek(sc) == close) {
        sc->pos++;
        sc->depth--;
        return true;
    }
    for (;;) {
        if (object) {
            scan_ws(sc);
            if (scan_peek(sc) != '"')
                return scan_fail(sc, sc->pos, "Expecting property name enclosed in double quotes");
            if (!scan_string(sc))
                return false;
            scan_ws(sc);
            if (scan_peek(sc) != ':')
                return scan_fail(sc, sc->pos, "Expecting ':' delimiter");
            sc->pos++;
        }
        if (!scan_value(sc))
            return false;
        scan_ws(sc);
        if (scan_peek(sc) == close) {
            sc->pos++;
            break;
        }
        if (scan_peek(sc) != ',')
            return scan_fail(sc, sc->pos, "Expecting ',' delimiter");
        size_t comma = sc->pos++;
        scan_ws(sc);
        if (scan_peek(sc) == close)
            return scan_fail(sc, comma, object ? "Illegal trailing comma before end of object"
                                               : "Illegal trailing comma before end of array");
    }
    sc->depth--;
    return true;
}

static bool scan_value(scanner *sc) {
    scan_ws(sc);
    int c = scan_peek(sc);
    switch (c) {
    case '{': return scan_container(sc, '}');
    case '[': return scan_container(sc, ']');
    case '"': return scan_string(sc);
    case 't': return scan_literal(sc, "true");
    case 'f': return scan_literal(sc, "false");
    case 'n': return scan_literal(sc, "null");
    default:
        if (c == '-' || isdigit(c))
            return scan_number(sc);
        return scan_fail(sc, sc->pos, "Expecting value");
    }
}

/* Lines count from 1 at each '\n'; columns count characters (UTF-8 lead bytes) from 1. */
static void line_col(const char *s, size_t pos, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < pos; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '\n') {
            l++;
            c = 1;
        } else if ((ch & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

/* A few words on the likely cause, keyed on the character where the scan stopped. */
static const char *syntax_hint(const char *s, size_t n, size_t pos) {
    if (pos >= n)
        return " (the text ends here)";
    switch (s[pos]) {
    case '/':
    case '#': return " (comments are not allowed in JSON)";
    case '\'': return " (JSON strings take double quotes)";
    default: return "";
    }
}

/* A double holds every integer of up to 15 digits exactly (2**53 has 16): only longer integer
 * literals keep their digits. */
#define EXACT_DIGITS 15

/* Marks the numbers of the tree that were written as floats, and keeps the text of each integer
 * of more than EXACT_DIGITS digits as its valuestring, visiting them in document order as the
 * scan met them. False when out of memory. */
static bool mark_floats(cJSON *node, const scanner *sc, size_t *next) {
    for (cJSON *c = node; c; c = c->next) {
        const num_literal *lit = cJSON_IsNumber(c) && *next < sc->nnum ? &sc->nums[(*next)++]
                                                                       : NULL;
        if (lit && lit->is_float)
            c->type |= ZT_JSON_FLOAT_LITERAL;
        else if (lit && lit->len - (sc->s[lit->at] == '-') > EXACT_DIGITS && !c->valuestring) {
            if (!(c->valuestring = cJSON_malloc(lit->len + 1)))
                return false;
            memcpy(c->valuestring, sc->s + lit->at, lit->len);
            c->valuestring[lit->len] = '\0';
        }
        if (c->child && !mark_floats(c->child, sc, next))
            return false;
    }
    return true;
}

bool zt_json_is_float_literal(const cJSON *item) {
    return cJSON_IsNumber(item) && (item->type & ZT_JSON_FLOAT_LITERAL);
}

const char *zt_json_int_digits(const cJSON *item) {
    return cJSON_IsNumber(item) && !(item->type & ZT_JSON_FLOAT_LITERAL) ? item->valuestring
                                                                          : NULL;
}

/* Turns each whole number marked as a float into raw text with a fraction ("3.0"), which cJSON
 * prints as is; false when out of memory. */
static bool keep_floats(cJSON *node) {
    for (cJSON *c = node; c; c = c->next) {
        if (zt_json_is_float_literal(c) && isfinite(c->valuedouble) &&
            c->valuedouble == floor(c->valuedouble)) {
            char text[48];
            snprintf(text, sizeof text, "%.17g", c->valuedouble);
            if (!strpbrk(text, ".e"))
                strcat(text, ".0");
            char *raw = malloc(strlen(text) + 1);
            if (!raw)
                return false;
            strcpy(raw, text);
            c->type = cJSON_Raw;
            c->valuestring = raw;
        }
        if (c->child && !keep_floats(c->child))
            return false;
    }
    return true;
}

bool zt_json_mark_floats(cJSON *root, const char *text, size_t len) {
    scanner sc = {.s = text, .n = len};
    bool ok = true;
    if (scan_value(&sc) && !sc.err && sc.nums) {
        size_t next = 0;
        ok = mark_floats(root, &sc, &next);
    }
    free(sc.nums);
    return ok;
}

char *zt_json_print(const cJSON *item, bool formatted) {
    cJSON *copy = item ? cJSON_Duplicate(item, true) : NULL;
    if (!copy)
        return NULL;
    /* Only the copy's children are walked: the root itself stays a value cJSON prints. */
    if (cJSON_IsNumber(copy) || keep_floats(copy->child) || !copy->child) {
        char *text = formatted ? cJSON_Print(copy) : cJSON_PrintUnformatted(copy);
        cJSON_Delete(copy);
        return text;
    }
    cJSON_Delete(copy);
    return NULL;
}

zt_status zt_json_parse(const char *text, const char *source, cJSON **out) {
    *out = NULL;
    /* Editors on Windows write a byte-order mark; it is not part of the JSON text. */
    if ((unsigned char)text[0] == 0xEF && (unsigned char)text[1] == 0xBB &&
        (unsigned char)text[2] == 0xBF)
        text += 3;
    scanner sc = {.s = text, .n = strlen(text)};
    if (scan_value(&sc)) {
        scan_ws(&sc);
        if (sc.pos < sc.n)
            scan_fail(&sc, sc.pos, "Extra data after the JSON value");
    }
    if (sc.err) {
        free(sc.nums);
        int line, col;
        line_col(text, sc.err_pos, &line, &col);
        return zt_error(ZT_ERR_FORMAT, "%s: line %d, column %d: %s%s", source, line, col, sc.err,
                        syntax_hint(text, sc.n, sc.err_pos));
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        /* The scan accepted the text, so this is cJSON running out of memory. */
        int line = 1, col = 1;
        if (end && end >= text && (size_t)(end - text) <= sc.n)
            line_col(text, (size_t)(end - text), &line, &col);
        free(sc.nums);
        return zt_error(ZT_ERR_NOMEM, "%s: line %d, column %d: cJSON could not build the tree",
                        source, line, col);
    }
    size_t next = 0;
    bool marked = mark_floats(root, &sc, &next);
    free(sc.nums);
    if (!marked) {
        cJSON_Delete(root);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory keeping a large integer's digits",
                        source);
    }
    *out = root;
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Files                                                                                       */

/* The NUL check of a text just read. */
static zt_status refuse_nul(const char *path, char **text, size_t n, size_t *len) {
    if (memchr(*text, '\0', n)) {
        free(*text);
        *text = NULL;
        return zt_error(ZT_ERR_FORMAT, "%s: contains a NUL byte; not a JSON text file", path);
    }
    if (len)
        *len = n;
    return ZT_OK;
}

zt_status zt_json_read_file(const char *path, char **text, size_t *len) {
    size_t n;
    ZT_TRY(zt_read_file(path, text, &n));
    return refuse_nul(path, text, n, len);
}

zt_status zt_json_read_config(const char *path, char **text, size_t *len) {
    size_t n;
    ZT_TRY(zt_read_regular_file(path, ZT_JSON_CONFIG_MAX_BYTES, text, &n));
    return refuse_nul(path, text, n, len);
}

/* Reads path with `read` (any file, or a bounded regular one) and parses it. */
static zt_status load_with(zt_status (*read)(const char *, char **, size_t *), const char *path,
                           cJSON **out) {
    char *text;
    *out = NULL;
    ZT_TRY(read(path, &text, NULL));
    zt_status s = zt_json_parse(text, path, out);
    free(text);
    return s;
}

zt_status zt_json_load_file(const char *path, cJSON **out) {
    return load_with(zt_json_read_file, path, out);
}

zt_status zt_json_load_config(const char *path, cJSON **out) {
    return load_with(zt_json_read_config, path, out);
}

/* ------------------------------------------------------------------------------------------ */
/* Duplicate keys                                                                              */

/* Appends ".key" or "[i]" to the shared path buffer; the caller truncates it back afterwards. */
static void path_push(char *path, size_t cap, const char *key, int index) {
    size_t len = strlen(path);
    if (key)
        snprintf(path + len, cap - len, "%s%s", len ? "." : "", key);
    else
        snprintf(path + len, cap - len, "[%d]", index);
}

/* Children first, as DeepSpeed's object_pairs_hook sees the innermost object first. */
static zt_status dup_walk(const cJSON *node, const char *source, const char *what, char *path,
                          size_t cap, const char *skip_key) {
    int index = 0;
    for (const cJSON *c = node->child; c; c = c->next, index++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c))
            continue;
        if (skip_key && cJSON_IsObject(node) && c->string && strcmp(c->string, skip_key) == 0)
            continue;
        size_t len = strlen(path);
        path_push(path, cap, cJSON_IsObject(node) ? c->string : NULL, index);
        zt_status s = dup_walk(c, source, what, path, cap, NULL);
        path[len] = '\0';
        if (s != ZT_OK)
            return s;
    }
    if (!cJSON_IsObject(node))
        return ZT_OK;

    /* Python's Counter lists each repeated key once, in order of first appearance. */
    char keys[1024] = "";
    size_t klen = 0;
    for (const cJSON *a = node->child; a; a = a->next) {
        bool seen_before = false, repeated = false;
        for (const cJSON *b = node->child; b != a; b = b->next)
            if (strcmp(a->string, b->string) == 0)
                seen_before = true;
        if (seen_before)
            continue;
        for (const cJSON *b = a->next; b; b = b->next)
            if (strcmp(a->string, b->string) == 0)
                repeated = true;
        if (repeated && klen < sizeof keys)
            klen += (size_t)snprintf(keys + klen, sizeof keys - klen, "%s'%s'", klen ? ", " : "",
                                     a->string);
    }
    if (klen == 0)
        return ZT_OK;
    if (path[0])
        return zt_error(ZT_ERR_INVALID, "%s: Duplicate keys in %s: [%s] (in %s)", source, what, keys,
                        path);
    return zt_error(ZT_ERR_INVALID, "%s: Duplicate keys in %s: [%s] (in the top-level object)",
                    source, what, keys);
}

/* ------------------------------------------------------------------------------------------ */
/* Non-finite numbers                                                                          */

static zt_status finite_walk(const cJSON *node, const char *source, char *path, size_t cap,
                             const char *skip_key) {
    int index = 0;
    for (const cJSON *c = node->child; c; c = c->next, index++) {
        bool object = cJSON_IsObject(node) && c->string;
        if (skip_key && object && strcmp(c->string, skip_key) == 0)
            continue;
        size_t len = strlen(path);
        path_push(path, cap, object ? c->string : NULL, index);
        zt_status s = ZT_OK;
        if (cJSON_IsNumber(c) && !isfinite(c->valuedouble)) {
            s = zt_error(ZT_ERR_INVALID, "%s: key '%s' is not a finite number (it overflows a "
                         "double)", source, path);
            s = zt_error_field(s, path);
        } else if (cJSON_IsObject(c) || cJSON_IsArray(c)) {
            s = finite_walk(c, source, path, cap, NULL);
        }
        path[len] = '\0';
        if (s != ZT_OK)
            return s;
    }
    return ZT_OK;
}

zt_status zt_json_check_finite(const cJSON *node, const char *source, const char *path,
                               const char *skip_key) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path ? path : "");
    if (cJSON_IsNumber(node) && !isfinite(node->valuedouble))
        return zt_error_field(zt_error(ZT_ERR_INVALID, "%s: key '%s' is not a finite number "
                                       "(it overflows a double)", source, buf), buf);
    return finite_walk(node, source, buf, sizeof buf, skip_key);
}

zt_status zt_json_check_duplicates(const cJSON *node, const char *source, const char *what,
                                   const char *path, const char *skip_key) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path ? path : "");
    return dup_walk(node, source, what, buf, sizeof buf, skip_key);
}

/* ------------------------------------------------------------------------------------------ */
/* Typed access                                                                                */

void zt_json_obj_init(zt_json_obj *o, const cJSON *root, const char *source, const char *path) {
    o->obj = root;
    o->source = source;
    snprintf(o->path, sizeof o->path, "%s", path ? path : "");
}

/* Copies as much of s as fits after buf[*len], keeping buf NUL-terminated. */
static void append(char *buf, size_t n, size_t *len, const char *s) {
    while (*s && *len + 1 < n)
        buf[(*len)++] = *s++;
    buf[*len] = '\0';
}

void zt_json_key_path(const zt_json_obj *o, const char *key, char *buf, size_t n) {
    size_t len = 0;
    if (n == 0)
        return;
    buf[0] = '\0';
    append(buf, n, &len, o->path);
    if (o->path[0])
        append(buf, n, &len, ".");
    append(buf, n, &len, key);
}

zt_status zt_json_token_text(const cJSON *v, const char *source, const char *key,
                             const char **text) {
    *text = NULL;
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (cJSON_IsString(v))
        *text = v->valuestring;
    else if (v && !cJSON_IsNull(v))
        return zt_error(ZT_ERR_FORMAT, "%s: key '%s' must be a string or an AddedToken object "
                        "({\"content\": \"...\"})", source, key);
    return ZT_OK;
}

bool zt_json_truthy(const cJSON *v) {
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return false;
    if (cJSON_IsObject(v) || cJSON_IsArray(v))
        return v->child != NULL;
    if (cJSON_IsNumber(v))
        return v->valuedouble != 0;
    if (cJSON_IsString(v))
        return v->valuestring[0] != '\0';
    return true;
}

void zt_json_repr(const cJSON *item, char *buf, size_t n) {
    char *text = item ? cJSON_PrintUnformatted(item) : NULL;
    if (!text) {
        snprintf(buf, n, "%s", item ? "(unprintable)" : "nothing");
        return;
    }
    if (strlen(text) < n)
        snprintf(buf, n, "%s", text);
    else if (n > 4)
        snprintf(buf, n, "%.*s...", (int)(n - 4), text);
    cJSON_free(text);
}

zt_status zt_json_key_error(zt_status s, const zt_json_obj *o, const char *key, const char *fmt, ...) {
    char path[512], msg[1024];
    zt_json_key_path(o, key, path, sizeof path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    zt_error(s, "%s: key '%s' %s", o->source, path, msg);
    return zt_error_field(s, path);
}

static zt_status type_error(const zt_json_obj *o, const char *key, const cJSON *it, const char *want) {
    char got[128];
    zt_json_repr(it, got, sizeof got);
    /* "auto" is the DeepSpeed config's (its parser removes it where the Trainer fills it). */
    bool is_auto = cJSON_IsString(it) && strcmp(it->valuestring, "auto") == 0;
    return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be %s, got %s%s", want, got,
                             is_auto ? " (\"auto\" is only for the DeepSpeed config keys the "
                                       "Hugging Face Trainer fills)" : "");
}

/* cJSON reads a number beyond a double's range (1e999) as an infinity, which it prints as null. */
static zt_status not_finite(const zt_json_obj *o, const char *key) {
    return zt_json_key_error(ZT_ERR_INVALID, o, key, "is not a finite number (it overflows a "
                             "double)");
}

const cJSON *zt_json_item(const zt_json_obj *o, const char *key) {
    if (!o->obj)
        return NULL;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o->obj, key);
    if (!it || cJSON_IsNull(it))
        return NULL;
    return it;
}

zt_status zt_json_child(const zt_json_obj *o, const char *key, zt_json_obj *child) {
    const cJSON *it = zt_json_item(o, key);
    zt_json_obj_init(child, NULL, o->source, NULL);
    zt_json_key_path(o, key, child->path, sizeof child->path);
    if (!it)
        return ZT_OK;
    if (!cJSON_IsObject(it))
        return type_error(o, key, it, "an object");
    child->obj = it;
    return ZT_OK;
}

static void set_found(bool *found, bool v) {
    if (found)
        *found = v;
}

/* Integral numbers only; the range is checked by the callers below. */
static zt_status get_integral(const zt_json_obj *o, const char *key, double lo, double hi,
                              double *out, bool *found) {
    const cJSON *it = zt_json_item(o, key);
    set_found(found, false);
    if (!it)
        return ZT_OK;
    if (cJSON_IsNumber(it) && !isfinite(it->valuedouble))
        return not_finite(o, key);
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble))
        return type_error(o, key, it, "an integer");
    if (it->valuedouble < lo || it->valuedouble > hi) {
        char got[64];
        zt_json_repr(it, got, sizeof got);
        return zt_json_key_error(ZT_ERR_INVALID, o, key, "is out of range (%.0f to %.0f), got %s",
                                 lo, hi, got);
    }
    *out = it->valuedouble;
    set_found(found, true);
    return ZT_OK;
}

zt_status zt_json_get_int(const zt_json_obj *o, const char *key, int *out, bool *found) {
    double v;
    bool f;
    ZT_TRY(get_integral(o, key, (double)INT_MIN, (double)INT_MAX, &v, &f));
    if (f)
        *out = (int)v;
    set_found(found, f);
    return ZT_OK;
}

zt_status zt_json_get_int64(const zt_json_obj *o, const char *key, int64_t *out, bool *found) {
    /* Doubles hold integers exactly only up to 2^53, which is far beyond any count in a config. */
    const double limit = 9007199254740992.0;
    double v;
    bool f;
    ZT_TRY(get_integral(o, key, -limit, limit, &v, &f));
    if (f)
        *out = (int64_t)v;
    set_found(found, f);
    return ZT_OK;
}

zt_status zt_json_get_double(const zt_json_obj *o, const char *key, double *out, bool *found) {
    const cJSON *it = zt_json_item(o, key);
    set_found(found, false);
    if (!it)
        return ZT_OK;
    if (!cJSON_IsNumber(it))
        return type_error(o, key, it, "a number");
    if (!isfinite(it->valuedouble))
        return not_finite(o, key);
    *out = it->valuedouble;
    set_found(found, true);
    return ZT_OK;
}

zt_status zt_json_get_bool(const zt_json_obj *o, const char *key, bool *out, bool *found) {
    const cJSON *it = zt_json_item(o, key);
    set_found(found, false);
    if (!it)
        return ZT_OK;
    if (!cJSON_IsBool(it))
        return type_error(o, key, it, "true or false");
    *out = cJSON_IsTrue(it);
    set_found(found, true);
    return ZT_OK;
}

zt_status zt_json_get_string(const zt_json_obj *o, const char *key, const char **out, bool *found) {
    const cJSON *it = zt_json_item(o, key);
    set_found(found, false);
    if (!it)
        return ZT_OK;
    if (!cJSON_IsString(it))
        return type_error(o, key, it, "a string");
    *out = it->valuestring;
    set_found(found, true);
    return ZT_OK;
}

zt_status zt_json_require(const zt_json_obj *o, const char *key) {
    if (zt_json_item(o, key))
        return ZT_OK;
    return zt_json_key_error(ZT_ERR_INVALID, o, key, "is required");
}

/* ------------------------------------------------------------------------------------------ */
/* Allowed keys                                                                                */

/* Case-insensitive Levenshtein distance, capped for names longer than the table. */
static int edit_distance(const char *a, const char *b) {
    enum { MAXLEN = 63 };
    size_t la = strlen(a), lb = strlen(b);
    if (la > MAXLEN || lb > MAXLEN)
        return INT_MAX;
    int prev[MAXLEN + 1], cur[MAXLEN + 1];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (lb + 1));
    }
    return prev[lb];
}

const char *zt_json_suggest(const char *word, const char *const *names) {
    const char *best = NULL;
    int best_d = INT_MAX;
    /* A third of the word's length, at most 3 edits: close enough to be a typo, not a rename. */
    int limit = (int)strlen(word) / 3;
    if (limit < 1)
        limit = 1;
    if (limit > 3)
        limit = 3;
    for (const char *const *n = names; *n; n++) {
        int d = edit_distance(word, *n);
        if (d <= limit && d < best_d) {
            best = *n;
            best_d = d;
        }
    }
    return best;
}

zt_status zt_json_check_keys(const zt_json_obj *o, const char *const *allowed) {
    if (!o->obj)
        return ZT_OK;
    for (const cJSON *c = o->obj->child; c; c = c->next) {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(c->string, *a) == 0;
        if (ok)
            continue;
        char list[2048] = "", where[300], hint[128] = "";
        size_t len = 0;
        for (const char *const *a = allowed; *a && len < sizeof list; a++)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", *a);
        if (o->path[0])
            snprintf(where, sizeof where, "in %s", o->path);
        else
            snprintf(where, sizeof where, "at the top level");
        const char *near = zt_json_suggest(c->string, allowed);
        if (near)
            snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
        zt_error(ZT_ERR_INVALID, "%s: unknown key '%s' %s%s; allowed keys: %s", o->source,
                 c->string, where, hint, list);
        char path[512];
        zt_json_key_path(o, c->string, path, sizeof path);
        return zt_error_field(ZT_ERR_INVALID, path);
    }
    return ZT_OK;
}

char *zt_json_strdup(const char *s) {
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (!d) {
        zt_error(ZT_ERR_NOMEM, "out of memory copying a %zu-byte string", n);
        return NULL;
    }
    memcpy(d, s, n);
    return d;
}
