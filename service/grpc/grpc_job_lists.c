/* The gRPC methods over a job's side data (grpc_server_internal.h), the same the HTTP API has
 * (http_job_lists.c, http_jobs.c): its checkpoints, its effective DeepSpeed config, its anomaly
 * events (page_size, page_token) and its webhook delivery attempts. Each runs to completion on
 * the completion queue's thread; the manager reads the event store without its lock. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_server_internal.h"
#include "api/page_token.h"
#include "api/job_proto.h"
#include "ztrain/json_util.h"
#include "ztrain.pb-c.h"

#define LIST_MAX 10000

static bool need_id(call *c, const char *id) {
    if (id && *id)
        return true;
    zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "id", "id is required");
    return false;
}

/* The job named by a request's id into *info (zeroed first; the caller frees it), or false with
 * the call finished: INVALID_ARGUMENT without an id, the store's error (NOT_FOUND...) else. */
static bool find_job(call *c, const char *id, zt_job_info *info) {
    memset(info, 0, sizeof *info);
    if (!need_id(c, id))
        return false;
    zt_status s = zt_jobs_get(c->srv->jm, id, info);
    if (s == ZT_OK)
        return true;
    zt_call_finish_zt(c, s, NULL, id);
    return false;
}

void zt_grpc_list_checkpoints(call *c, ProtobufCMessage *m) {
    Ztrain__V1__ListCheckpointsRequest *req = (Ztrain__V1__ListCheckpointsRequest *)m;
    zt_job_info info;
    if (!find_job(c, req->id, &info))
        return;
    Ztrain__V1__ListCheckpointsResponse *resp;
    zt_status s = zt_job_proto_checkpoints(info.id, info.checkpoint_dir, &resp);
    zt_job_info_free(&info);
    if (s != ZT_OK) {
        zt_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ztraind is out of memory");
        return;
    }
    zt_call_reply(c, &resp->base);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}

void zt_grpc_get_effective_config(call *c, ProtobufCMessage *m) {
    Ztrain__V1__GetEffectiveConfigRequest *req = (Ztrain__V1__GetEffectiveConfigRequest *)m;
    zt_job_info info;
    if (!find_job(c, req->id, &info))
        return;
    /* Rank 0 writes it into the run directory when it has resolved the config. */
    char path[4200], *text = NULL;
    snprintf(path, sizeof path, "%s/ds_config.effective.json", info.run_dir ? info.run_dir : "");
    bool have = info.run_dir && zt_json_read_file(path, &text, NULL) == ZT_OK;
    if (!have) {
        char msg[200];
        snprintf(msg, sizeof msg, "jobs/%.64s: its ranks have not written the effective config "
                 "yet (state %s)", req->id, zt_job_state_name(info.state));
        zt_api_error e;
        zt_api_error_set(&e, GRPC_STATUS_FAILED_PRECONDITION, NULL, msg);
        e.kind = ZT_DETAIL_PRECONDITION;
        snprintf(e.type, sizeof e.type, "STATE");
        snprintf(e.field, sizeof e.field, "jobs/%.64s", req->id);
        zt_call_finish_error(c, &e);
    } else {
        Ztrain__V1__EffectiveConfig resp = ZTRAIN__V1__EFFECTIVE_CONFIG__INIT;
        resp.deepspeed_json = text;
        zt_call_reply(c, &resp.base);
    }
    free(text);
    zt_job_info_free(&info);
}

/* ---- lists from the event store ---------------------------------------------------------- */

typedef struct {
    ProtobufCMessage **items;
    size_t n, cap;
    bool oom;
    int64_t last_seq;
} collected;

static void collect(collected *col, ProtobufCMessage *m) {
    if (!m) {
        col->oom = true;
        return;
    }
    if (col->n == col->cap) {
        size_t cap = col->cap ? 2 * col->cap : 64;
        ProtobufCMessage **grown = realloc(col->items, sizeof *grown * cap);
        if (!grown) {
            col->oom = true;
            protobuf_c_message_free_unpacked(m, NULL);
            return;
        }
        col->items = grown;
        col->cap = cap;
    }
    col->items[col->n++] = m;
}

static void collected_free(collected *col) {
    for (size_t i = 0; i < col->n; i++)
        protobuf_c_message_free_unpacked(col->items[i], NULL);
    free(col->items);
}

static void on_anomaly(void *ctx, const zt_anomaly *a) {
    collected *col = ctx;
    Ztrain__V1__AnomalyEvent *ev = NULL;
    if (zt_job_proto_anomaly_from(a, &ev) != ZT_OK)
        ev = NULL;
    col->last_seq = a->seq;
    collect(col, ev ? &ev->base : NULL);
}

void zt_grpc_list_anomalies(call *c, ProtobufCMessage *m) {
    Ztrain__V1__ListAnomaliesRequest *req = (Ztrain__V1__ListAnomaliesRequest *)m;
    if (!need_id(c, req->id))
        return;
    int size;
    if (!zt_call_page_size(c, req->page_size, LIST_MAX, LIST_MAX, &size))
        return;
    int64_t after = 0;
    if (req->page_token[0]) {
        /* A token this list gave for this job (page_token.h), holding the last seq shown. */
        char number[ZT_PAGE_TOKEN_MAX] = "";
        zt_page_token_read(&c->srv->page_key, req->page_token, ZT_PAGE_ANOMALIES, req->id, "",
                           number, sizeof number);
        char *end = NULL;
        long long v = strtoll(number, &end, 10);
        if (!number[0] || *end || v < 0) {
            zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "page_token",
                                 "page_token: not a next_page_token of ListAnomalies");
            return;
        }
        after = v;
    }
    collected col = {0};
    int64_t total = 0;
    zt_status s = zt_jobs_anomalies(c->srv->jm, req->id, after, size, &total, on_anomaly, &col);
    if (s != ZT_OK) {
        zt_call_finish_zt(c, s, NULL, req->id);
    } else if (col.oom) {
        zt_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ztraind is out of memory");
    } else {
        Ztrain__V1__ListAnomaliesResponse resp = ZTRAIN__V1__LIST_ANOMALIES_RESPONSE__INIT;
        char token[ZT_PAGE_TOKEN_MAX] = "", number[24];
        /* A full page may have more behind it; the next one starts after its last event. */
        snprintf(number, sizeof number, "%" PRId64, col.last_seq);
        if ((int)col.n == size)
            zt_page_token_make(&c->srv->page_key, ZT_PAGE_ANOMALIES, req->id, "", number, token,
                               sizeof token);
        resp.n_anomalies = col.n;
        resp.anomalies = (Ztrain__V1__AnomalyEvent **)col.items;
        resp.next_page_token = token;
        resp.total_size = total;
        zt_call_reply(c, &resp.base);
    }
    collected_free(&col);
}

static void on_delivery(void *ctx, const zt_delivery *d) {
    Ztrain__V1__WebhookDelivery *w = NULL;
    zt_job_proto_delivery_from(d, &w);
    collect(ctx, w ? &w->base : NULL);
}

void zt_grpc_list_webhook_deliveries(call *c, ProtobufCMessage *m) {
    Ztrain__V1__ListWebhookDeliveriesRequest *req = (Ztrain__V1__ListWebhookDeliveriesRequest *)m;
    if (!need_id(c, req->id))
        return;
    int size;
    if (!zt_call_page_size(c, req->page_size, LIST_MAX, LIST_MAX, &size))
        return;
    collected col = {0};
    zt_status s = zt_jobs_deliveries(c->srv->jm, req->id, size, on_delivery, &col);
    if (s != ZT_OK) {
        zt_call_finish_zt(c, s, NULL, req->id);
    } else if (col.oom) {
        zt_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ztraind is out of memory");
    } else {
        Ztrain__V1__ListWebhookDeliveriesResponse resp =
            ZTRAIN__V1__LIST_WEBHOOK_DELIVERIES_RESPONSE__INIT;
        resp.n_deliveries = col.n;
        resp.deliveries = (Ztrain__V1__WebhookDelivery **)col.items;
        zt_call_reply(c, &resp.base);
    }
    collected_free(&col);
}
