/* How ztraind's HTTP routes answer (http_internal.h): responses with the CORS headers, errors as
 * RFC 9457 problems carrying the gRPC code and field (api_error.h), the status of a job manager
 * failure, and query arguments that answer 400 naming
 * themselves when malformed, so every route reports a bad request the same way. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_error.h"
#include "http_internal.h"
#include "ztrain/text.h"

enum MHD_Result zt_http_queue(struct MHD_Connection *c, unsigned code, struct MHD_Response *r) {
    if (!r)
        return MHD_NO;
    zt_http_add_cors(c, r);
    MHD_add_response_header(r, MHD_HTTP_HEADER_SERVER, ZT_SERVER_SOFTWARE);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* A response that owns the buffer's text; NULL (b freed) when memory ran out. */
static struct MHD_Response *text_response(zt_jbuf *b, const char *type) {
    size_t n;
    char *p = zt_jbuf_take(b, &n);
    if (!p)
        return NULL;
    struct MHD_Response *r = MHD_create_response_from_buffer(n, p, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(p);
        return NULL;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    return r;
}

enum MHD_Result zt_http_send_text(struct MHD_Connection *c, unsigned code, zt_jbuf *b,
                                  const char *type) {
    return zt_http_queue(c, code, text_response(b, type));
}

enum MHD_Result zt_http_send_json(struct MHD_Connection *c, unsigned code, zt_jbuf *b) {
    return zt_http_send_text(c, code, b, "application/json");
}

enum MHD_Result zt_http_send_proto(struct MHD_Connection *c, unsigned code,
                                   const ProtobufCMessage *m) {
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_proto_json(&b, m);
    return zt_http_send_json(c, code, &b);
}

/* An error as an RFC 9457 problem (api_error.h), with one more header when hname is given. */
static enum MHD_Result send_problem(struct MHD_Connection *c, unsigned code, const char *hname,
                                    const char *hvalue, const zt_api_error *e) {
    char *text = zt_api_error_problem_json(e, code, NULL);
    if (!text)
        return MHD_NO;
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_jbuf_puts(&b, text);
    free(text);
    struct MHD_Response *r = text_response(&b, "application/problem+json");
    if (r && hname)
        MHD_add_response_header(r, hname, hvalue);
    return zt_http_queue(c, code, r);
}

enum MHD_Result zt_http_send_error_with_header(struct MHD_Connection *c, unsigned code,
                                               const char *hname, const char *hvalue,
                                               const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* A message that opens with "name:" is about that parameter or field (page_size, id, ...),
     * and its problem names it, as gRPC's BadRequest does. */
    grpc_status_code g = zt_api_code_from_http(code);
    char field[160];
    zt_api_error_field(msg, NULL, field, sizeof field);
    zt_api_error e;
    zt_api_error_set(&e, g, field[0] && (g == GRPC_STATUS_INVALID_ARGUMENT ||
                                         g == GRPC_STATUS_RESOURCE_EXHAUSTED) ? field : NULL, msg);
    return send_problem(c, code, hname, hvalue, &e);
}

enum MHD_Result zt_http_send_api_error(struct MHD_Connection *c, const zt_api_error *e) {
    return send_problem(c, zt_api_http_status(e->code), NULL, NULL, e);
}

enum MHD_Result zt_http_send_refusal_error(struct MHD_Connection *c, unsigned http_status,
                                           const char *hname, const char *hvalue,
                                           const zt_api_error *e) {
    return send_problem(c, http_status, hname, hvalue, e);
}

enum MHD_Result zt_http_send_refusal(struct MHD_Connection *c, unsigned http_status,
                                     const char *reason, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    zt_api_error e;
    zt_api_error_refusal(&e, zt_api_code_from_http(http_status), reason, msg);
    return send_problem(c, http_status, NULL, NULL, &e);
}

enum MHD_Result zt_http_send_status_in(struct MHD_Connection *c, zt_status s, const char *scope,
                                       const char *id) {
    zt_api_error e;
    const char *msg = zt_last_error();
    zt_api_error_from_status(&e, s, (int)s == ZT_ERR_NOT_FOUND && !*msg ? "no such job" : msg,
                             scope, id);
    unsigned code = zt_api_http_status(e.code);
    if (code == 500) {
        /* An internal failure is told with the job it happened to. */
        char text[sizeof e.message + 80];
        snprintf(text, sizeof text, "jobs/%.64s: %s", id ? id : "-", e.message);
        zt_text_escape(text, ZT_ESCAPE_KEEP_NEWLINE, e.message, sizeof e.message);
    }
    return send_problem(c, code, NULL, NULL, &e);
}

enum MHD_Result zt_http_send_status(struct MHD_Connection *c, zt_status s, const char *id) {
    return zt_http_send_status_in(c, s, NULL, id);
}

/* ---- query arguments --------------------------------------------------------------------- */

const char *zt_http_arg(struct MHD_Connection *c, const char *name) {
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
}

bool zt_http_arg_int(struct MHD_Connection *c, const char *name, int64_t lo, int64_t hi,
                     int64_t *out, enum MHD_Result *ret) {
    const char *v = zt_http_arg(c, name);
    if (!v)
        return true;
    char *end = NULL;
    errno = 0;
    long long x = *v && !isspace((unsigned char)*v) ? strtoll(v, &end, 10) : 0;
    if (!end || end == v || *end || errno || x < lo || x > hi) {
        if (hi == INT64_MAX)
            *ret = zt_http_send_error(c, MHD_HTTP_BAD_REQUEST,
                                      "%s: expected an integer >= %" PRId64 ", got '%.64s'",
                                      name, lo, v);
        else
            *ret = zt_http_send_error(c, MHD_HTTP_BAD_REQUEST,
                                      "%s: expected an integer from %" PRId64 " to %" PRId64
                                      ", got '%.64s'", name, lo, hi, v);
        return false;
    }
    *out = x;
    return true;
}

bool zt_http_arg_page_size(struct MHD_Connection *c, const char *name, int64_t def,
                           int64_t max, int64_t *out, enum MHD_Result *ret) {
    int64_t v = -1;
    if (!zt_http_arg_int(c, name, 0, INT64_MAX, &v, ret))
        return false;
    if (v >= 0)
        *out = v == 0 ? def : v > max ? max : v;
    return true;
}

bool zt_http_arg_bool(struct MHD_Connection *c, const char *name, bool *out,
                      enum MHD_Result *ret) {
    const char *v = zt_http_arg(c, name);
    if (!v)
        return true;
    /* Exactly the values the OpenAPI document lists ("", 0, 1, true, false): "False" or "TRUE"
     * would be accepted here and refused by the document's own validators. */
    if (!strcmp(v, "1") || !strcmp(v, "true") || !*v) {
        *out = true;
    } else if (!strcmp(v, "0") || !strcmp(v, "false")) {
        *out = false;
    } else {
        *ret = zt_http_send_error(c, MHD_HTTP_BAD_REQUEST,
                                  "%s: expected 0, 1, true or false, got '%.64s'", name, v);
        return false;
    }
    return true;
}

/* Job ids are short and plain ("job-000042"); anything else cannot name a job, and checking
 * here keeps odd bytes out of the manager and the messages. */
bool zt_http_valid_job_id(const char *id, size_t n) {
    if (n == 0 || n >= sizeof(((zt_job_info *)0)->id))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)id[i]) && id[i] != '-' && id[i] != '_' && id[i] != '.')
            return false;
    return true;
}
