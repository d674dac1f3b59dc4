/* Structured errors over gRPC and HTTP (api_error.h): which code and which detail a failure
 * gets, the field path its message names, and the two encodings (google.rpc.Status with
 * error_details.proto's messages; RFC 9457 problem JSON). */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "api/api_error.h"
#include "api/grpc_util.h"
#include "daemon/job_manager.h"
#include "google/protobuf/any.pb-c.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"
#include "ztrain/text.h"

/* The job-spec file's top-level keys: a path whose first part is one of them is a field of the
 * spec. (DeepSpeed's keys live under "deepspeed"; its own messages name them bare.) */
static const char *const spec_keys[] = {
    "name", "world_size", "device", "model", "data", "train", "deepspeed", "nodes",
    "training_args", "comm", "max_restarts", "fork_from", "pipeline", "events", "alerts",
};

static bool is_spec_key(const char *s, size_t n) {
    for (size_t i = 0; i < sizeof spec_keys / sizeof *spec_keys; i++)
        if (strlen(spec_keys[i]) == n && strncmp(spec_keys[i], s, n) == 0)
            return true;
    return false;
}

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* The length of a field path at s ("model.n_embd", "data.train[2].path"), 0 when none. */
static size_t path_len(const char *s) {
    size_t n = 0;
    if (!isalpha((unsigned char)s[0]) && s[0] != '_')
        return 0;
    for (;;) {
        while (ident_char(s[n]))
            n++;
        if (s[n] == '.' && (isalpha((unsigned char)s[n + 1]) || s[n + 1] == '_')) {
            n++;
        } else if (s[n] == '[' && isdigit((unsigned char)s[n + 1])) {
            size_t m = n + 1;
            while (isdigit((unsigned char)s[m]))
                m++;
            if (s[m] != ']')
                return n;
            n = m + 1;
        } else {
            return n;
        }
    }
}

static size_t first_part_len(const char *s, size_t n) {
    size_t k = 0;
    while (k < n && s[k] != '.' && s[k] != '[')
        k++;
    return k;
}

/* DeepSpeed's keys are snake_case; an English word of a message is not. */
static bool snake(const char *s, size_t n) {
    return memchr(s, '_', n) != NULL;
}

/* The first snake_case path in s ("train_batch_size", "zero_optimization.stage"): DeepSpeed's
 * own texts name their keys bare. */
static bool snake_word(const char *s, char *out, size_t out_size, const char *prefix) {
    for (const char *p = s; *p; p++) {
        if (p != s && (ident_char(p[-1]) || p[-1] == '.'))
            continue;
        size_t n = path_len(p);
        size_t first = first_part_len(p, n);
        if (n && snake(p, first) && islower((unsigned char)p[0])) {
            bool top = is_spec_key(p, first);
            snprintf(out, out_size, "%s%.*s", top ? "" : prefix, (int)n, p);
            return true;
        }
        if (n)
            p += n - 1;
    }
    return false;
}

/* The key of "unknown key 'K' in P" (P.K) or "unknown key 'K'" (K), the parsers' refusal of a
 * key they do not know. */
static bool unknown_key_path(const char *msg, char *out, size_t out_size, const char *prefix) {
    const char *q = strstr(msg, "unknown key '");
    if (!q)
        return false;
    q += 13;
    size_t n = path_len(q);
    if (!n || q[n] != '\'')
        return false;
    const char *in = q + n + 1;
    size_t m = strncmp(in, " in ", 4) == 0 ? path_len(in + 4) : 0;
    if (m)
        snprintf(out, out_size, "%s%.*s.%.*s", prefix, (int)m, in + 4, (int)n, q);
    else
        snprintf(out, out_size, "%s%.*s", prefix, (int)n, q);
    return true;
}

/* Finds the spec path a message names: at the start of one of its ": "-separated parts, a
 * path whose first part is a spec key ("spec: model.n_embd: ..."), and for a bare "deepspeed"
 * the DeepSpeed key its text names (an unknown key with its section, or the first snake_case
 * word); else an unknown key with its section, a quoted 'key' ("key 'model.n_layer' is
 * required"), else the first snake_case word. */
static bool spec_path(const char *msg, char *out, size_t out_size) {
    for (const char *p = msg; p; p = strstr(p, ": ")) {
        if (p != msg)
            p += 2;
        size_t n = path_len(p);
        if (!n || !is_spec_key(p, first_part_len(p, n)))
            continue;
        if (n == 9 && strncmp(p, "deepspeed", 9) == 0 &&
            (unknown_key_path(p + n, out, out_size, "deepspeed.") ||
             snake_word(p + n, out, out_size, "deepspeed.")))
            return true;
        snprintf(out, out_size, "%.*s", (int)n, p);
        return true;
    }
    if (unknown_key_path(msg, out, out_size, ""))
        return true;
    const char *q = strstr(msg, "key '");
    if (q) {
        q += 5;
        size_t n = path_len(q);
        if (n && q[n] == '\'') {
            snprintf(out, out_size, "%.*s", (int)n, q);
            return true;
        }
    }
    return snake_word(msg, out, out_size, "deepspeed.");
}

/* The field the parser recorded with the failure (zt_last_error_field(), read on the failing
 * thread like the message), under the request's scope. False when it recorded none, or when
 * the message is not the failure's own (a caller's text). */
static bool parser_field(const char *message, const char *scope, char *out, size_t out_size) {
    const char *f = zt_last_error_field();
    if (!f[0] || message != zt_last_error())
        return false;
    /* A path the request already names from its message down ("spec.deepspeed_json") is whole. */
    if (scope && strncmp(f, scope, strlen(scope)) != 0)
        snprintf(out, out_size, "%s.%s", scope, f);
    else
        snprintf(out, out_size, "%s", f);
    return true;
}

void zt_api_error_field(const char *message, const char *scope, char *out, size_t out_size) {
    out[0] = '\0';
    if (parser_field(message, scope, out, out_size))
        return;
    const char *m = message ? message : "";
    size_t lead = path_len(m);
    /* A check of the request's bytes names the field from the request message down. */
    static const char req_prefix[] = "SubmitJobRequest.";
    if (strncmp(m, req_prefix, sizeof req_prefix - 1) == 0) {
        size_t n = path_len(m + sizeof req_prefix - 1);
        snprintf(out, out_size, "%.*s", (int)n, m + sizeof req_prefix - 1);
        return;
    }
    /* Outside a spec, or for a path already given from the request ("spec.deepspeed_json",
     * "idempotency_key"), the message's leading "field:" is the field. */
    bool from_request = lead > 5 && strncmp(m, "spec.", 5) == 0;
    if (!scope || from_request || (lead == 15 && strncmp(m, "idempotency_key", 15) == 0)) {
        if (lead && m[lead] == ':')
            snprintf(out, out_size, "%.*s", (int)lead, m);
        if (!scope || out[0])
            return;
    }
    char path[160];
    if (!spec_path(m, path, sizeof path)) {
        snprintf(out, out_size, "%s", scope);
        return;
    }
    snprintf(out, out_size, "%s.%s", scope, path);
}

/* Messages and fields echo what a request sent (a job id from the URL, a spec's strings), which
 * may be cut bytes or not UTF-8 at all: both encodings need valid UTF-8 (JSON, and the status
 * text clients decode), so anything else is escaped as \xHH, never cut inside a character. */
static void copy(char *dst, size_t size, const char *src) {
    zt_text_escape(src ? src : "", ZT_ESCAPE_KEEP_NEWLINE, dst, size);
}

void zt_api_error_set(zt_api_error *e, grpc_status_code code, const char *field,
                      const char *message) {
    memset(e, 0, sizeof *e);
    e->code = code;
    copy(e->message, sizeof e->message, message);
    if (!field)
        return;
    copy(e->field, sizeof e->field, field);
    e->kind = code == GRPC_STATUS_RESOURCE_EXHAUSTED ? ZT_DETAIL_QUOTA : ZT_DETAIL_BAD_REQUEST;
}

void zt_api_error_refusal(zt_api_error *e, grpc_status_code code, const char *reason,
                          const char *message) {
    memset(e, 0, sizeof *e);
    e->code = code;
    copy(e->message, sizeof e->message, message);
    e->kind = ZT_DETAIL_ERROR_INFO;
    copy(e->reason, sizeof e->reason, reason);
}

void zt_api_error_meta(zt_api_error *e, const char *key, const char *value) {
    if (e->n_meta >= ZT_API_ERROR_META)
        return;
    copy(e->meta_key[e->n_meta], sizeof e->meta_key[0], key);
    copy(e->meta_value[e->n_meta], sizeof e->meta_value[0], value);
    e->n_meta++;
}

/* The job an ALREADY_EXISTS names ("... used for job job-000007 with ..."). */
static void named_job(const char *msg, char *out, size_t size) {
    const char *p = strstr(msg, "job-");
    size_t n = 0;
    while (p && (isalnum((unsigned char)p[n]) || p[n] == '-' || p[n] == '_'))
        n++;
    if (p)
        snprintf(out, size, "jobs/%.*s", (int)n, p);
}

void zt_api_error_from_status(zt_api_error *e, int s, const char *message, const char *scope,
                              const char *job_id) {
    memset(e, 0, sizeof *e);
    e->code = s == ZT_ERR_PRECONDITION ? GRPC_STATUS_FAILED_PRECONDITION
                                       : zt_grpc_status_from_zt(s);
    copy(e->message, sizeof e->message, message);
    switch (s) {
    case ZT_ERR_INVALID:
    case ZT_ERR_FORMAT:
    case ZT_ERR_UNSUPPORTED:
        e->kind = ZT_DETAIL_BAD_REQUEST;
        zt_api_error_field(message, scope, e->field, sizeof e->field);
        break;
    case ZT_ERR_NOT_FOUND:
        e->kind = ZT_DETAIL_RESOURCE;
        if (job_id) {
            char name[sizeof e->resource + 8];
            snprintf(name, sizeof name, "jobs/%s", job_id);
            copy(e->resource, sizeof e->resource, name);
        }
        else
            named_job(e->message, e->resource, sizeof e->resource);
        break;
    case ZT_ERR_CONFLICT:
        e->kind = ZT_DETAIL_RESOURCE;
        named_job(e->message, e->resource, sizeof e->resource);
        break;
    case ZT_ERR_PRECONDITION: {
        e->kind = ZT_DETAIL_PRECONDITION;
        /* Memory is the whole job's, whatever key the estimate's text mentions. */
        if (strstr(e->message, "does not fit"))
            copy(e->field, sizeof e->field, scope ? scope : "");
        else
            zt_api_error_field(message, scope, e->field, sizeof e->field);
        const char *last = strrchr(e->field, '.');
        last = last ? last + 1 : e->field;
        copy(e->type, sizeof e->type, !strcmp(last, "world_size") ? "RANKS"
                                      : !strcmp(last, "device")   ? "GPU"
                                      : !strcmp(last, "nodes")    ? "NODES"
                                                                  : "MEMORY");
        break;
    }
    case ZT_ERR_LIMIT:
        e->kind = ZT_DETAIL_QUOTA;
        /* The job count is the server's; anything else is a limit on the request's spec. */
        if (strstr(e->message, "queued or running jobs"))
            copy(e->field, sizeof e->field, "jobs");
        else
            zt_api_error_field(message, scope, e->field, sizeof e->field);
        break;
    case ZT_ERR_UNAVAILABLE:
        /* The server's own trouble, to retry later: its state file cannot be written. */
        e->kind = ZT_DETAIL_ERROR_INFO;
        copy(e->reason, sizeof e->reason, "STATE_FILE_UNWRITABLE");
        break;
    case ZT_ERR_PERMISSION: {
        /* Another token's job ("... of jobs/job-000007, which another token submitted"), as a
         * cancel of it is refused (submitter.h). */
        e->kind = ZT_DETAIL_ERROR_INFO;
        copy(e->reason, sizeof e->reason, "NOT_JOB_SUBMITTER");
        char job[sizeof e->resource] = "";
        const char *at = strstr(e->message, "jobs/");
        if (at)
            named_job(at + 5, job, sizeof job);
        if (job[0])
            zt_api_error_meta(e, "job", job);
        zt_api_error_meta(e, "requiredScope", "admin");
        break;
    }
    default:
        break;
    }
}

/* ---- google.rpc.Status ------------------------------------------------------------------- */

/* Packs m into an Any of the given type; the value is malloc'd into any->value. */
static bool pack_any(const ProtobufCMessage *m, const char *type_url, Google__Protobuf__Any *any) {
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return false;
    protobuf_c_message_pack(m, buf);
    any->type_url = (char *)type_url;
    any->value.data = buf;
    any->value.len = n;
    return true;
}

/* The detail repeats the message, which the status carries twice already (grpc-message and
 * google.rpc.Status.message, which clients require to be equal): its copy is cut shorter, on a
 * character boundary, to keep the trailers within what clients accept (api_error.h). */
#define DETAIL_DESCRIPTION_MAX 512

static void cut_utf8(char *dst, size_t max, const char *src) {
    size_t n = strlen(src);
    if (n > max) {
        n = max;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
            n--;
    }
    memmove(dst, src, n);
    dst[n] = '\0';
}

static bool pack_detail(const zt_api_error *e, Google__Protobuf__Any *any) {
    char description[DETAIL_DESCRIPTION_MAX + 1];
    cut_utf8(description, DETAIL_DESCRIPTION_MAX, e->message);
    switch (e->kind) {
    case ZT_DETAIL_BAD_REQUEST: {
        Google__Rpc__BadRequest__FieldViolation v = GOOGLE__RPC__BAD_REQUEST__FIELD_VIOLATION__INIT;
        v.field = (char *)e->field;
        v.description = description;
        Google__Rpc__BadRequest__FieldViolation *vs[1] = {&v};
        Google__Rpc__BadRequest br = GOOGLE__RPC__BAD_REQUEST__INIT;
        br.n_field_violations = 1;
        br.field_violations = vs;
        return pack_any(&br.base, "type.googleapis.com/google.rpc.BadRequest", any);
    }
    case ZT_DETAIL_RESOURCE: {
        Google__Rpc__ResourceInfo ri = GOOGLE__RPC__RESOURCE_INFO__INIT;
        ri.resource_type = "ztrain.v1.Job";
        ri.resource_name = (char *)e->resource;
        ri.description = description;
        return pack_any(&ri.base, "type.googleapis.com/google.rpc.ResourceInfo", any);
    }
    case ZT_DETAIL_PRECONDITION: {
        Google__Rpc__PreconditionFailure__Violation v =
            GOOGLE__RPC__PRECONDITION_FAILURE__VIOLATION__INIT;
        v.type = (char *)e->type;
        v.subject = (char *)e->field;
        v.description = description;
        Google__Rpc__PreconditionFailure__Violation *vs[1] = {&v};
        Google__Rpc__PreconditionFailure pf = GOOGLE__RPC__PRECONDITION_FAILURE__INIT;
        pf.n_violations = 1;
        pf.violations = vs;
        return pack_any(&pf.base, "type.googleapis.com/google.rpc.PreconditionFailure", any);
    }
    case ZT_DETAIL_QUOTA: {
        Google__Rpc__QuotaFailure__Violation v = GOOGLE__RPC__QUOTA_FAILURE__VIOLATION__INIT;
        v.subject = (char *)e->field;
        v.description = description;
        Google__Rpc__QuotaFailure__Violation *vs[1] = {&v};
        Google__Rpc__QuotaFailure qf = GOOGLE__RPC__QUOTA_FAILURE__INIT;
        qf.n_violations = 1;
        qf.violations = vs;
        return pack_any(&qf.base, "type.googleapis.com/google.rpc.QuotaFailure", any);
    }
    case ZT_DETAIL_ERROR_INFO: {
        Google__Rpc__ErrorInfo__MetadataEntry entries[ZT_API_ERROR_META];
        Google__Rpc__ErrorInfo__MetadataEntry *meta[ZT_API_ERROR_META];
        for (int i = 0; i < e->n_meta; i++) {
            google__rpc__error_info__metadata_entry__init(&entries[i]);
            entries[i].key = (char *)e->meta_key[i];
            entries[i].value = (char *)e->meta_value[i];
            meta[i] = &entries[i];
        }
        Google__Rpc__ErrorInfo ei = GOOGLE__RPC__ERROR_INFO__INIT;
        ei.reason = (char *)e->reason;
        ei.domain = ZT_API_ERROR_DOMAIN;
        ei.n_metadata = (size_t)e->n_meta;
        ei.metadata = e->n_meta ? meta : NULL;
        return pack_any(&ei.base, "type.googleapis.com/google.rpc.ErrorInfo", any);
    }
    default:
        return false;
    }
}

uint8_t *zt_api_error_status_bin(const zt_api_error *e, size_t *len) {
    Google__Rpc__Status st = GOOGLE__RPC__STATUS__INIT;
    st.code = (int32_t)e->code;
    st.message = (char *)e->message;
    Google__Protobuf__Any any = GOOGLE__PROTOBUF__ANY__INIT;
    Google__Protobuf__Any *anys[1] = {&any};
    if (pack_detail(e, &any)) {
        st.n_details = 1;
        st.details = anys;
    }
    size_t n = protobuf_c_message_get_packed_size(&st.base);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf)
        protobuf_c_message_pack(&st.base, buf);
    free(any.value.data);
    *len = n;
    return buf;
}

/* ---- RFC 9457 ---------------------------------------------------------------------------- */

unsigned zt_api_http_status(grpc_status_code code) {
    switch (code) {
    case GRPC_STATUS_OK: return 200;
    case GRPC_STATUS_CANCELLED: return 499;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_FAILED_PRECONDITION:
    case GRPC_STATUS_OUT_OF_RANGE: return 400;
    case GRPC_STATUS_UNAUTHENTICATED: return 401;
    case GRPC_STATUS_PERMISSION_DENIED: return 403;
    case GRPC_STATUS_NOT_FOUND: return 404;
    case GRPC_STATUS_ALREADY_EXISTS:
    case GRPC_STATUS_ABORTED: return 409;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return 429;
    case GRPC_STATUS_UNIMPLEMENTED: return 501;
    case GRPC_STATUS_UNAVAILABLE: return 503;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return 504;
    default: return 500;
    }
}

grpc_status_code zt_api_code_from_http(unsigned http_status) {
    switch (http_status) {
    case 400: case 411: case 415: case 422: return GRPC_STATUS_INVALID_ARGUMENT;
    case 401: return GRPC_STATUS_UNAUTHENTICATED;
    case 403: case 421: return GRPC_STATUS_PERMISSION_DENIED;
    case 404: return GRPC_STATUS_NOT_FOUND;
    case 405: case 501: return GRPC_STATUS_UNIMPLEMENTED;
    case 408: case 504: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case 409: return GRPC_STATUS_ALREADY_EXISTS;
    case 413: case 429: case 431: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case 503: return GRPC_STATUS_UNAVAILABLE;
    default: return http_status < 400 ? GRPC_STATUS_OK : GRPC_STATUS_INTERNAL;
    }
}

static void add_violation(cJSON *list, const char *k1, const char *v1, const char *k2,
                          const char *v2, const char *description) {
    cJSON *v = cJSON_CreateObject();
    if (!v)
        return;
    if (k1)
        cJSON_AddStringToObject(v, k1, v1);
    if (k2)
        cJSON_AddStringToObject(v, k2, v2);
    cJSON_AddStringToObject(v, "description", description);
    cJSON_AddItemToArray(list, v);
}

char *zt_api_error_problem_json(const zt_api_error *e, unsigned http_status,
                                const char *instance) {
    const char *name = zt_grpc_status_name(e->code);
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    /* The type is a URN per code: stable, and no web page is implied to exist. */
    char type[64];
    snprintf(type, sizeof type, "urn:ztrain:error:%s", name);
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddStringToObject(o, "title", name);
    cJSON_AddNumberToObject(o, "status", http_status);
    cJSON_AddStringToObject(o, "detail", e->message);
    if (instance)
        cJSON_AddStringToObject(o, "instance", instance);
    cJSON_AddStringToObject(o, "code", name);
    cJSON_AddStringToObject(o, "error", e->message);
    cJSON *list = NULL;
    switch (e->kind) {
    case ZT_DETAIL_BAD_REQUEST:
        cJSON_AddStringToObject(o, "field", e->field);
        list = cJSON_AddArrayToObject(o, "violations");
        add_violation(list, "field", e->field, NULL, NULL, e->message);
        break;
    case ZT_DETAIL_PRECONDITION:
        cJSON_AddStringToObject(o, "field", e->field);
        list = cJSON_AddArrayToObject(o, "violations");
        add_violation(list, "type", e->type, "subject", e->field, e->message);
        break;
    case ZT_DETAIL_QUOTA:
        cJSON_AddStringToObject(o, "field", e->field);
        list = cJSON_AddArrayToObject(o, "violations");
        add_violation(list, "subject", e->field, NULL, NULL, e->message);
        break;
    case ZT_DETAIL_ERROR_INFO: {
        cJSON_AddStringToObject(o, "reason", e->reason);
        cJSON_AddStringToObject(o, "domain", ZT_API_ERROR_DOMAIN);
        cJSON *m = e->n_meta ? cJSON_AddObjectToObject(o, "metadata") : NULL;
        for (int i = 0; m && i < e->n_meta; i++)
            cJSON_AddStringToObject(m, e->meta_key[i], e->meta_value[i]);
        break;
    }
    case ZT_DETAIL_RESOURCE: {
        cJSON *r = cJSON_AddObjectToObject(o, "resource");
        if (r) {
            cJSON_AddStringToObject(r, "type", "ztrain.v1.Job");
            cJSON_AddStringToObject(r, "name", e->resource);
        }
        break;
    }
    default:
        break;
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

void zt_api_error_cut(zt_api_error *e, size_t max) {
    if (max < sizeof e->message)
        cut_utf8(e->message, max, e->message);
}
