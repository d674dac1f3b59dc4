/* A job's lists (http_internal.h): GET /api/v1/jobs/{id}/records, /logs, /anomalies and
 * /webhooks, as ListMetricRecordsResponse, ListLogLinesResponse, ListAnomaliesResponse and
 * ListWebhookDeliveriesResponse in proto3 JSON: {<name>: [...], "nextPageToken": "..."} (the
 * anomalies' also "totalSize"), and
 * one pagination scheme (AIP-158): page_size, page_token (the next_page_token of the page
 * before; "" once the list is done). A table row says, per list, its array's name, its page
 * bounds, the older names of its parameters that are still read (limit; after_seq, which
 * starts the first page), the filter every page applies (the records' since_step) and how the
 * job manager walks it. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "api/job_proto.h"
#include "api/page_token.h"

typedef struct {
    zt_jbuf *b;
    int64_t last_seq;   /* anomalies: the seq of the last one written */
    int64_t total;      /* anomalies: the events the job has had (totalSize); 0: not given */
    int count;
    zt_status failed;   /* an element that could not be built */
} walk_ctx;

/* Walks the list from cursor, at most size elements passing the filter, into w; *next is the
 * next page's cursor or -1 at the end. */
typedef zt_status (*walk_fn)(zt_http_server *s, const char *id, int64_t cursor, int64_t filter,
                             int size, walk_ctx *w, int64_t *next);

typedef struct {
    const char *array;        /* the response's member */
    const char *size_name;    /* "page_size", or "tail" for the log's last lines */
    const char *old_size;     /* an older name of the size, or NULL */
    const char *old_cursor;   /* the first page's cursor by its own name, or NULL: no paging */
    const char *filter;       /* a filter of every page (>= 0), or NULL */
    int64_t default_size, max_size;
    walk_fn walk;
    zt_page_list token;       /* its tokens, bound to the list, the job and the filter
                               * (page_token.h), or 0: no paging */
} job_list;

/* Each element is the proto3 JSON of the message gRPC sends for it; one that cannot be built
 * (out of memory, a record that is not an object) fails the whole answer. */
static void element(walk_ctx *w, zt_status st, ProtobufCMessage *m) {
    if (st == ZT_OK && m)
        zt_proto_json(w->b, m);
    else
        w->failed = st != ZT_OK ? st : ZT_ERR_NOMEM;
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    w->count++;
}

static void record_encode(void *ctx, const zt_metric_record *r) {
    Ztrain__V1__MetricRecord *m = NULL;
    zt_status st = zt_job_proto_record_from_metric(r, &m);
    element(ctx, st, m ? &m->base : NULL);
}

/* The cursor is a record's seq, not a step: an eval step's two records (or a step run again
 * after a restart) may fall on two pages. */
static zt_status walk_records(zt_http_server *s, const char *id, int64_t cursor,
                              int64_t since_step, int size, walk_ctx *w, int64_t *next) {
    return zt_jobs_metric_records(s->jm, id, since_step, cursor, size, record_encode, w, next);
}

static void log_encode(void *ctx, const zt_log_line *l) {
    Ztrain__V1__LogLine *m = NULL;
    zt_status st = zt_job_proto_log_from_line(l, &m);
    element(ctx, st, m ? &m->base : NULL);
}

static zt_status walk_logs(zt_http_server *s, const char *id, int64_t cursor, int64_t filter,
                           int size, walk_ctx *w, int64_t *next) {
    (void)cursor;
    (void)filter;
    *next = -1;
    return zt_jobs_logs(s->jm, id, size, log_encode, w);
}

static void anomaly_encode(void *ctx, const zt_anomaly *a) {
    walk_ctx *w = ctx;
    Ztrain__V1__AnomalyEvent *m = NULL;
    zt_status st = zt_job_proto_anomaly_from(a, &m);
    w->last_seq = a->seq;
    element(w, st, m ? &m->base : NULL);
}

static zt_status walk_anomalies(zt_http_server *s, const char *id, int64_t cursor,
                                int64_t filter, int size, walk_ctx *w, int64_t *next) {
    (void)filter;
    zt_status st = zt_jobs_anomalies(s->jm, id, cursor, size, &w->total, anomaly_encode, w);
    /* A full page may have more behind it; the next one starts after its last event. */
    *next = st == ZT_OK && w->count == size ? w->last_seq : -1;
    return st;
}

static void delivery_encode(void *ctx, const zt_delivery *d) {
    Ztrain__V1__WebhookDelivery *m = NULL;
    zt_status st = zt_job_proto_delivery_from(d, &m);
    element(ctx, st, m ? &m->base : NULL);
}

/* The newest attempts, oldest first: one page, no cursor. */
static zt_status walk_webhooks(zt_http_server *s, const char *id, int64_t cursor,
                               int64_t filter, int size, walk_ctx *w, int64_t *next) {
    (void)cursor;
    (void)filter;
    *next = -1;
    return zt_jobs_deliveries(s->jm, id, size, delivery_encode, w);
}

static const job_list lists[] = {
    [ZT_LIST_RECORDS] = {"records", "page_size", "limit", "after_seq", "since_step",
                         ZT_RECORDS_MAX_PAGE, ZT_RECORDS_MAX_PAGE, walk_records, ZT_PAGE_RECORDS},
    [ZT_LIST_LOGS] = {"lines", "tail", NULL, NULL, NULL, ZT_LOG_TAIL_DEFAULT, ZT_MAX_LOG_TAIL,
                      walk_logs},
    [ZT_LIST_ANOMALIES] = {"anomalies", "page_size", "limit", "after_seq", NULL, 10000, 10000,
                           walk_anomalies, ZT_PAGE_ANOMALIES},
    [ZT_LIST_WEBHOOKS] = {"deliveries", "page_size", "limit", NULL, NULL, 10000, 10000,
                          walk_webhooks},
};

/* The filter as page tokens bind it: the records' since_step in decimal, "" for none. */
static void filter_text(const job_list *l, int64_t filter, char *out, size_t size) {
    if (l->filter)
        snprintf(out, size, "%" PRId64, filter);
    else
        snprintf(out, size, "%s", "");
}

/* The page token: one this list handed out for this job and filter, or the first page's cursor
 * by its own name (both checked when both are given; the token wins). */
static bool read_cursor(zt_http_server *s, struct MHD_Connection *c, const job_list *l,
                        const char *id, const char *filter, int64_t *cursor,
                        enum MHD_Result *ret) {
    if (l->old_cursor && !zt_http_arg_int(c, l->old_cursor, 0, INT64_MAX, cursor, ret))
        return false;
    const char *token = zt_http_arg(c, "page_token");
    if (!token || !*token)
        return true;
    char number[ZT_PAGE_TOKEN_MAX] = "";
    if (l->token)
        zt_page_token_read(&s->page_key, token, l->token, id, filter, number, sizeof number);
    char *end = NULL;
    errno = 0;
    long long v = strtoll(number, &end, 10);
    if (!l->old_cursor || *end || end == number || errno || v < 0) {
        *ret = zt_http_send_error(c, MHD_HTTP_BAD_REQUEST,
                                  "page_token: '%.64s' is not a next_page_token of this list%s",
                                  token, l->filter ? " with this since_step" : "");
        return false;
    }
    *cursor = v;
    return true;
}

enum MHD_Result zt_http_job_list(zt_http_server *s, struct MHD_Connection *c, const char *id,
                                 zt_job_list_kind kind) {
    const job_list *l = &lists[kind];
    enum MHD_Result ret;
    int64_t size = l->default_size, cursor = 0, filter = 0;
    /* tail=0 is no lines, as StreamLogs' tail 0 and `ztrain logs --tail 0` (a tail is a
     * number of lines, not a page size); a page size of 0 is the default and one above the
     * maximum is the maximum (AIP-158, as gRPC's lists). The older name of the size is read
     * and checked too; the new one wins when both are given. */
    bool sized = kind == ZT_LIST_LOGS
                     ? zt_http_arg_int(c, l->size_name, 0, l->max_size, &size, &ret)
                     : (!l->old_size || zt_http_arg_page_size(c, l->old_size, l->default_size,
                                                              l->max_size, &size, &ret)) &&
                           zt_http_arg_page_size(c, l->size_name, l->default_size,
                                                 l->max_size, &size, &ret);
    if (!sized || (l->filter && !zt_http_arg_int(c, l->filter, 0, INT64_MAX, &filter, &ret)))
        return ret;
    char filter_str[24];
    filter_text(l, filter, filter_str, sizeof filter_str);
    if (!read_cursor(s, c, l, id, filter_str, &cursor, &ret))
        return ret;
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_json_open(&b, '{');
    zt_json_key(&b, l->array);
    zt_json_open(&b, '[');
    walk_ctx w = {.b = &b};
    int64_t next = -1;
    zt_status st = l->walk(s, id, cursor, filter, (int)size, &w, &next);
    if (st == ZT_OK && w.failed != ZT_OK)
        st = w.failed;
    if (st != ZT_OK) {
        zt_jbuf_free(&b);
        return zt_http_send_status(c, st, id);
    }
    /* An empty list and an empty token are left out, as protobuf's printer leaves defaults. */
    if (w.count == 0) {
        zt_jbuf_clear(&b);
        zt_json_open(&b, '{');
    } else {
        zt_json_close(&b, ']');
    }
    if (l->old_cursor && next >= 0) {
        char token[ZT_PAGE_TOKEN_MAX], number[24];
        snprintf(number, sizeof number, "%" PRId64, next);
        if (!zt_page_token_make(&s->page_key, l->token, id, filter_str, number, token,
                                sizeof token)) {
            zt_jbuf_free(&b);
            return zt_http_send_status(c, zt_error(ZT_ERR_NOMEM, "page_token: cannot sign the "
                                                   "next page's token"), id);
        }
        zt_json_key(&b, "nextPageToken");
        zt_json_str(&b, token);
    }
    /* int64 in proto3 JSON: a decimal string. */
    if (w.total > 0) {
        char total[24];
        snprintf(total, sizeof total, "%" PRId64, w.total);
        zt_json_key(&b, "totalSize");
        zt_json_str(&b, total);
    }
    zt_json_close(&b, '}');
    return zt_http_send_json(c, MHD_HTTP_OK, &b);
}
