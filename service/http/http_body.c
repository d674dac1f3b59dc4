/* Reading a request's JSON body (http_internal.h), one way for every route that takes one. cJSON
 * alone is too lenient for a request: it stops at the end of the first value and leaves what
 * follows unread, it takes any control byte as whitespace, and it decodes \u0000 into the C
 * string it hands back, which then ends there (a name "ab\u0000cd" read as "ab"). So after
 * cJSON has parsed the body, a walk over the text refuses trailing bytes, bytes that are not
 * JSON whitespace between tokens, and U+0000 in any string, naming the field path and the
 * byte, as gRPC names a NUL byte in a request's string (grpc_util.h). */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "http_internal.h"
#include "ztrain/json_util.h"

/* The walk over text cJSON has accepted: the path of the value being read, and the first fault
 * found. Every read is bounded by `end`, whatever the text holds. */
typedef struct {
    const char *start, *p, *end;
    char path[160];
    size_t path_len;
    const char *fault;     /* NULL while none; the text before its byte offset */
    const char *fault_end; /* the text after it */
    size_t fault_at;       /* its byte offset in the body */
    char fault_path[160];  /* the path at the fault, when it is in a string; else "" */
} walk;

static bool json_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void fail(walk *w, const char *at, const char *what, const char *after, bool in_path) {
    if (w->fault)
        return;
    w->fault = what;
    w->fault_end = after;
    w->fault_at = (size_t)(at - w->start);
    snprintf(w->fault_path, sizeof w->fault_path, "%s", in_path ? w->path : "");
}

static void skip_space(walk *w) {
    while (w->p < w->end && json_space(*w->p))
        w->p++;
    /* cJSON skips every byte up to 0x20 between tokens; JSON allows only four of them. */
    if (w->p < w->end && (unsigned char)*w->p < 0x20)
        fail(w, w->p, "a control character", ", outside a string", false);
}

static bool is_hex_zero4(const char *p, const char *end) {
    return end - p >= 4 && !memcmp(p, "0000", 4);
}

/* A string at w->p (its opening quote); *body and *n get its raw text between the quotes. A NUL,
 * raw or as \u0000, is a fault at the path. */
static void string(walk *w, const char **body, size_t *n) {
    const char *q = ++w->p;
    while (w->p < w->end && *w->p != '"') {
        if (*w->p == '\0')
            fail(w, w->p, "a NUL byte", "; no string may hold one", true);
        if (*w->p == '\\' && w->p + 1 < w->end) {
            if (w->p[1] == 'u' && is_hex_zero4(w->p + 2, w->end))
                fail(w, w->p, "U+0000 (\\u0000)", "; no string may hold it", true);
            w->p++;
        }
        w->p++;
    }
    *body = q;
    *n = (size_t)(w->p - q);
    if (w->p < w->end)
        w->p++;
}

static void value(walk *w, int depth);

/* Appends ".key" or "[i]" to the path for the value read next; the old length is returned so
 * the caller can restore it. A path too long for the buffer stays cut (it only names). */
static size_t push(walk *w, const char *fmt, const char *key, size_t key_n, size_t index) {
    size_t old = w->path_len;
    size_t room = sizeof w->path - w->path_len;
    int k = key ? snprintf(w->path + w->path_len, room, fmt, (int)key_n, key)
                : snprintf(w->path + w->path_len, room, fmt, index);
    if (k > 0)
        w->path_len += (size_t)k < room ? (size_t)k : room - 1;
    return old;
}

static void pop(walk *w, size_t old) {
    w->path_len = old;
    w->path[old] = '\0';
}

static void container(walk *w, int depth, bool object) {
    char close = object ? '}' : ']';
    w->p++;
    skip_space(w);
    for (size_t i = 0; !w->fault && w->p < w->end && *w->p != close; i++) {
        size_t old;
        if (object) {
            const char *key;
            size_t n;
            if (*w->p != '"')
                return;
            /* A NUL in a member's name is told at the object that holds it. */
            string(w, &key, &n);
            old = push(w, w->path_len ? ".%.*s" : "%.*s", key, n > 64 ? 64 : n, 0);
            skip_space(w);
            if (w->p < w->end && *w->p == ':')
                w->p++;
        } else {
            old = push(w, "[%zu]", NULL, 0, i);
        }
        value(w, depth + 1);
        pop(w, old);
        skip_space(w);
        if (w->p < w->end && *w->p == ',') {
            w->p++;
            skip_space(w);
        }
    }
    if (w->p < w->end)
        w->p++;
}

static void value(walk *w, int depth) {
    skip_space(w);
    if (w->fault || w->p >= w->end || depth > 1000)
        return;
    if (*w->p == '{' || *w->p == '[') {
        container(w, depth, *w->p == '{');
    } else if (*w->p == '"') {
        const char *s;
        size_t n;
        string(w, &s, &n);
    } else {
        /* A number or a literal: up to the next delimiter. */
        while (w->p < w->end && !json_space(*w->p) && !strchr(",]}", *w->p) &&
               (unsigned char)*w->p >= 0x20)
            w->p++;
    }
}

bool zt_http_body_json(struct MHD_Connection *c, const zt_jbuf *body, const char *body_field,
                       cJSON **out, enum MHD_Result *ret) {
    *out = NULL;
    const char *text = body && body->buf.data ? body->buf.data : "";
    size_t len = body ? body->buf.len : 0;
    const char *field = body_field ? body_field : "";
    const char *sep = body_field ? ": " : "";
    /* On a failure cJSON says where through its parse end (its global error pointer is shared by
     * every connection's thread). */
    const char *at = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &at, false);
    if (!root) {
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
        *ret = zt_http_send_error(c, MHD_HTTP_BAD_REQUEST,
                                  "%s%sthe body is not JSON (it fails at byte %zu)", field, sep,
                                  off);
        return false;
    }
    walk w = {.start = text, .p = text, .end = text + len};
    value(&w, 0);
    const char *rest = w.fault ? NULL : w.p;
    while (rest && rest < w.end && json_space(*rest))
        rest++;
    if (rest && rest < w.end)
        fail(&w, rest, "more text after the JSON value", "", false);
    if (w.fault) {
        cJSON_Delete(root);
        if (w.fault_path[0])
            *ret = zt_http_send_error(c, MHD_HTTP_BAD_REQUEST,
                                      "%s: %s at byte %zu of the body%s", w.fault_path, w.fault,
                                      w.fault_at, w.fault_end);
        else
            *ret = zt_http_send_error(c, MHD_HTTP_BAD_REQUEST,
                                      "%s%s%s at byte %zu of the body%s", field, sep, w.fault,
                                      w.fault_at, w.fault_end);
        return false;
    }
    /* A number written as a float stays one for the DeepSpeed config's int checks (3.0). */
    zt_json_mark_floats(root, text, len);
    *out = root;
    return true;
}
