/* GET /api/v1/jobs/{id}/anomalies and /api/v1/jobs/{id}/webhooks (http_internal.h): a job's
 * anomaly events and its webhook delivery attempts, from the event store. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"

static void anomaly_encode(void *ctx, const zt_anomaly *a) {
    zt_jbuf *b = ctx;
    zt_json_raw(b, a->json, strlen(a->json));
}

static void delivery_encode(void *ctx, const zt_delivery *d) {
    zt_jbuf *b = ctx;
    zt_json_open(b, '{');
    zt_json_key(b, "delivery_id");
    zt_json_str(b, d->delivery_id);
    zt_json_key(b, "url");
    zt_json_str(b, d->url);
    zt_json_key(b, "type");
    zt_json_str(b, d->type);
    zt_json_key(b, "attempt");
    zt_json_int(b, d->attempt);
    zt_json_key(b, "time_unix_ms");
    zt_json_int(b, d->time_ms);
    zt_json_key(b, "http_status");
    zt_json_int(b, d->http_status);
    zt_json_key(b, "error");
    zt_json_str(b, d->error);
    zt_json_key(b, "outcome");
    zt_json_str(b, d->outcome);
    zt_json_close(b, '}');
}

static enum MHD_Result send_list(struct MHD_Connection *c, zt_jbuf *b, zt_status st,
                                 const char *id) {
    if (st != ZT_OK) {
        zt_jbuf_free(b);
        return zt_http_send_status(c, st, id);
    }
    zt_json_close(b, ']');
    zt_json_close(b, '}');
    return zt_http_send_json(c, MHD_HTTP_OK, b);
}

static void begin_list(zt_jbuf *b, const char *id, const char *name) {
    zt_jbuf_init(b);
    zt_json_open(b, '{');
    zt_json_key(b, "job_id");
    zt_json_str(b, id);
    zt_json_key(b, name);
    zt_json_open(b, '[');
}

/* ?after_seq=N&limit=N: the events numbered after N, oldest first (at most 10,000). */
enum MHD_Result zt_http_job_anomalies(zt_http_server *s, struct MHD_Connection *c,
                                      const char *id) {
    enum MHD_Result ret;
    int64_t after = 0, limit = 10000;
    if (!zt_http_arg_int(c, "after_seq", 0, INT64_MAX, &after, &ret) ||
        !zt_http_arg_int(c, "limit", 1, 10000, &limit, &ret))
        return ret;
    zt_jbuf b;
    begin_list(&b, id, "anomalies");
    zt_status st = zt_jobs_anomalies(s->jm, id, after, (int)limit, anomaly_encode, &b);
    return send_list(c, &b, st, id);
}

/* ?limit=N: the newest N delivery attempts (default and at most 10,000), oldest first. */
enum MHD_Result zt_http_job_webhooks(zt_http_server *s, struct MHD_Connection *c,
                                     const char *id) {
    enum MHD_Result ret;
    int64_t limit = 10000;
    if (!zt_http_arg_int(c, "limit", 1, 10000, &limit, &ret))
        return ret;
    zt_jbuf b;
    begin_list(&b, id, "deliveries");
    zt_status st = zt_jobs_deliveries(s->jm, id, (int)limit, delivery_encode, &b);
    return send_list(c, &b, st, id);
}
