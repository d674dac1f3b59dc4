/* ztraind's gRPC server (grpc_server.h): ztrain.v1.Trainer and grpc.health.v1.Health/Check on
 * gRPC's C core, one completion queue drained by zt_grpc_server_run.
 *
 * Every call is a small state machine (`struct call`) whose tags all come back on that queue.
 * Each call starts a lone RECV_CLOSE_ON_SERVER when it arrives, which returns when the call is
 * over (cancelled = 1 on a client cancel or deadline); its replies go out of a FIFO one
 * SEND_MESSAGE at a time, and the status follows the last message (in the same batch when it can).
 * A call is freed on the queue's thread once it is closed and no batch of it is in flight.
 *
 * Unary methods run to completion on the queue's thread. WatchJob and StreamLogs -f register a
 * job-manager watch whose callback runs on other threads with the manager's lock held: it only
 * packs the event and queues it under the call's mutex. Lock order is manager -> call, so no
 * zt_jobs_* function is ever called with a call's mutex held, and the watch is removed from the
 * queue's thread when the call closes, never from inside the callback. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "auth.h"
#include "grpc_server.h"
#include "grpc_util.h"
#include "health.pb-c.h"
#include "job_proto.h"
#include "ztrain.pb-c.h"

/* Requests kept posted per method: a burst of new calls beyond this waits for a re-arm, which
 * happens as soon as each one arrives. */
#define POSTED_PER_METHOD 4
#define POLL_MS 200
#define DEFAULT_MAX_MESSAGE (4u << 20)
/* A watcher that falls this far behind is ended with RESOURCE_EXHAUSTED. Metric records are
 * never dropped one by one: a client that sees the stream must see every record. */
#define STREAM_MAX_QUEUED_BYTES ((size_t)64 << 20)
#define LIST_DEFAULT_PAGE 50
#define LIST_MAX_PAGE 1000
#define LOGS_DEFAULT_TAIL 100
/* Status details travel in HTTP/2 trailers, which clients cap (8 KiB by default). */
#define STATUS_TEXT_MAX 4000

typedef enum {
    M_SUBMIT, M_GET, M_LIST, M_CANCEL, M_WATCH, M_METRICS, M_LOGS, M_HEALTH,
    M_COUNT,
    M_UNKNOWN = M_COUNT /* a method nobody registered: answered UNIMPLEMENTED */
} method_id;

typedef enum { TAG_NEW, TAG_SEND, TAG_STATUS, TAG_CLOSE, TAG_SHUTDOWN } tag_kind;

typedef struct call call;

typedef struct {
    tag_kind kind;
    call *c;
} tag;

typedef struct out_msg {
    struct out_msg *next;
    grpc_byte_buffer *bb;
    size_t bytes;
} out_msg;

struct zt_grpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    void *handles[M_COUNT];
    zt_jobs *jm;
    char *token;
    char *addr;
    int port;
    int n_calls;          /* call structs alive, posted requests included */
    bool shutting_down;   /* shutdown_and_notify was called */
    bool server_down;     /* its tag came back and the server is destroyed */
    bool cq_down;         /* grpc_completion_queue_shutdown was called */
    bool drained;         /* the queue returned GRPC_QUEUE_SHUTDOWN */
    tag shutdown_tag;
};

struct call {
    zt_grpc_server *srv;
    method_id method;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;     /* the request of a registered method */
    grpc_call_details details;     /* M_UNKNOWN: the method's name */
    tag t_new, t_send, t_status, t_close;
    int cancelled;                 /* written by RECV_CLOSE_ON_SERVER */
    zt_job_watch *watch;           /* touched on the queue's thread only */

    /* Everything below is shared with watch callbacks and guarded by mu, which also serialises
     * grpc_call_start_batch on this call. */
    pthread_mutex_t mu;
    int pending;                   /* batches started whose tags have not come back */
    bool md_sent;                  /* initial metadata went out (with the first batch) */
    bool sending;                  /* a SEND_MESSAGE is in flight: at most one at a time */
    bool status_started;
    bool broken;                   /* a send failed: the call is dead, only CLOSE will come */
    bool closed;
    bool replaying;                /* inside zt_jobs_watch: a terminal state waits for its end */
    bool terminal_seen;
    bool finishing;                /* the status is decided; it follows the queued messages */
    grpc_status_code status;
    char *status_text;
    grpc_byte_buffer *in_flight;   /* the message of the SEND or STATUS batch in flight */
    out_msg *head, *tail;
    size_t queued_bytes;
};

/* ---- sending ----------------------------------------------------------------------------- */

/* Starts a batch of c (c->mu held). A batch the core refuses is a bug; the call is cancelled
 * so that the client is not left waiting for its deadline. */
static bool start_batch(call *c, const grpc_op *ops, size_t n, tag *t) {
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, t, NULL);
    if (e != GRPC_CALL_OK) {
        fprintf(stderr, "ztraind: grpc: starting a batch failed: %s\n", grpc_call_error_to_string(e));
        grpc_call_cancel(c->call, NULL);
        return false;
    }
    c->pending++;
    return true;
}

static void drop_queue_locked(call *c) {
    while (c->head) {
        out_msg *m = c->head;
        c->head = m->next;
        grpc_byte_buffer_destroy(m->bb);
        free(m);
    }
    c->tail = NULL;
    c->queued_bytes = 0;
}

static grpc_byte_buffer *pop_locked(call *c) {
    out_msg *m = c->head;
    c->head = m->next;
    if (!c->head)
        c->tail = NULL;
    c->queued_bytes -= m->bytes;
    grpc_byte_buffer *bb = m->bb;
    free(m);
    return bb;
}

/* Adds the initial metadata to the first batch that sends anything. */
static size_t add_initial_md_locked(call *c, grpc_op *ops) {
    if (c->md_sent)
        return 0;
    c->md_sent = true;
    memset(ops, 0, sizeof *ops);
    ops->op = GRPC_OP_SEND_INITIAL_METADATA;
    return 1;
}

/* Starts the next batch when none is in flight: the next message, or the status once the
 * queue is empty and the status decided. The last message and the status go together. */
static void kick_locked(call *c) {
    if (c->sending || c->status_started || c->broken || c->closed)
        return;
    bool have_message = c->head != NULL;
    bool with_status = c->finishing && (!c->head || !c->head->next);
    if (!have_message && !with_status)
        return;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = add_initial_md_locked(c, ops);
    if (have_message) {
        c->in_flight = pop_locked(c);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->in_flight;
        n++;
    }
    if (!with_status) {
        c->sending = start_batch(c, ops, n, &c->t_send);
        c->broken = !c->sending;
        return;
    }
    grpc_slice details = grpc_slice_from_copied_string(c->status_text ? c->status_text : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = c->status;
    ops[n].data.send_status_from_server.status_details = &details;
    n++;
    c->status_started = start_batch(c, ops, n, &c->t_status);
    c->broken = !c->status_started;
    /* The core copies the details at start_batch. */
    grpc_slice_unref(details);
}

/* A copy of text cut to STATUS_TEXT_MAX bytes on a UTF-8 character boundary. */
static char *status_text_copy(const char *text) {
    size_t n = strlen(text);
    if (n > STATUS_TEXT_MAX) {
        n = STATUS_TEXT_MAX;
        while (n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80)
            n--;
    }
    return strndup(text, n);
}

/* Decides the call's status; the first decision wins. An error drops what is still queued. */
static void finish_locked(call *c, grpc_status_code code, const char *text) {
    if (c->finishing)
        return;
    c->finishing = true;
    c->status = code;
    c->status_text = status_text_copy(text ? text : "");
    if (code != GRPC_STATUS_OK)
        drop_queue_locked(c);
    kick_locked(c);
}

static void finish(call *c, grpc_status_code code, const char *text) {
    pthread_mutex_lock(&c->mu);
    finish_locked(c, code, text);
    pthread_mutex_unlock(&c->mu);
}

static void finish_zt(call *c, zt_status s) {
    finish(c, zt_grpc_status_from_zt(s), zt_last_error());
}

/* Queues a packed message; takes ownership of bb. */
static void push_locked(call *c, grpc_byte_buffer *bb) {
    size_t bytes = grpc_byte_buffer_length(bb);
    if (c->finishing || c->broken || c->closed) {
        grpc_byte_buffer_destroy(bb);
        return;
    }
    if (c->queued_bytes + bytes > STREAM_MAX_QUEUED_BYTES) {
        grpc_byte_buffer_destroy(bb);
        char text[160];
        snprintf(text, sizeof text, "the client fell more than %zu MiB behind the stream",
                 STREAM_MAX_QUEUED_BYTES >> 20);
        finish_locked(c, GRPC_STATUS_RESOURCE_EXHAUSTED, text);
        return;
    }
    out_msg *m = malloc(sizeof *m);
    if (!m) {
        grpc_byte_buffer_destroy(bb);
        finish_locked(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ztraind is out of memory");
        return;
    }
    *m = (out_msg){.bb = bb, .bytes = bytes};
    if (c->tail)
        c->tail->next = m;
    else
        c->head = m;
    c->tail = m;
    c->queued_bytes += bytes;
    kick_locked(c);
}

/* A unary reply: the message and status OK in one batch. */
static void reply(call *c, const ProtobufCMessage *msg) {
    grpc_byte_buffer *bb = zt_pb_pack(msg);
    pthread_mutex_lock(&c->mu);
    push_locked(c, bb);
    finish_locked(c, GRPC_STATUS_OK, "");
    pthread_mutex_unlock(&c->mu);
}

/* ---- method handlers --------------------------------------------------------------------- */

static bool require_id(call *c, const char *id) {
    if (id && *id)
        return true;
    finish(c, GRPC_STATUS_INVALID_ARGUMENT, "id is required");
    return false;
}

/* Replies with the job of a manager call, or its error. Reads zt_last_error() at once, on the
 * thread that made the call. */
static void reply_job(call *c, zt_status s, zt_job_info *info) {
    if (s != ZT_OK) {
        finish_zt(c, s);
        return;
    }
    Ztrain__V1__Job *job;
    s = zt_job_proto_job_from_info(info, &job);
    zt_job_info_free(info);
    if (s != ZT_OK) {
        finish(c, GRPC_STATUS_INTERNAL, zt_last_error());
        return;
    }
    reply(c, &job->base);
    protobuf_c_message_free_unpacked(&job->base, NULL);
}

static void handle_submit(call *c, ProtobufCMessage *m) {
    Ztrain__V1__SubmitJobRequest *req = (Ztrain__V1__SubmitJobRequest *)m;
    char *spec_json;
    zt_status s = zt_job_proto_spec_to_json(req->spec, &spec_json);
    if (s != ZT_OK) {
        finish(c, GRPC_STATUS_INVALID_ARGUMENT, zt_last_error());
        return;
    }
    zt_job_info info;
    memset(&info, 0, sizeof info);
    s = zt_jobs_submit(c->srv->jm, spec_json, req->idempotency_key, &info);
    free(spec_json);
    reply_job(c, s, &info);
}

static void handle_get(call *c, ProtobufCMessage *m) {
    Ztrain__V1__GetJobRequest *req = (Ztrain__V1__GetJobRequest *)m;
    if (!require_id(c, req->id))
        return;
    zt_job_info info;
    memset(&info, 0, sizeof info);
    reply_job(c, zt_jobs_get(c->srv->jm, req->id, &info), &info);
}

static void free_infos(zt_job_info *jobs, int n) {
    for (int i = 0; i < n; i++)
        zt_job_info_free(&jobs[i]);
    free(jobs);
}

static zt_status list_response(zt_job_info *jobs, int n, bool more,
                               Ztrain__V1__ListJobsResponse *resp) {
    if (n > 0) {
        resp->jobs = calloc((size_t)n, sizeof *resp->jobs);
        if (!resp->jobs)
            return zt_error(ZT_ERR_NOMEM, "out of memory listing %d jobs", n);
    }
    for (int i = 0; i < n; i++) {
        ZT_TRY(zt_job_proto_job_from_info(&jobs[i], &resp->jobs[i]));
        resp->n_jobs++;
    }
    /* The page token is the last id of this page: the next page starts after it. */
    if (more && n > 0 && !(resp->next_page_token = strdup(jobs[n - 1].id))) {
        resp->next_page_token = (char *)protobuf_c_empty_string;
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    return ZT_OK;
}

static void handle_list(call *c, ProtobufCMessage *m) {
    Ztrain__V1__ListJobsRequest *req = (Ztrain__V1__ListJobsRequest *)m;
    if ((int)req->state < 0 || (int)req->state > ZT_JOB_CANCELLED) {
        finish(c, GRPC_STATUS_INVALID_ARGUMENT, "state is not a JobState");
        return;
    }
    if (req->page_size < 0) {
        finish(c, GRPC_STATUS_INVALID_ARGUMENT, "page_size must be >= 0");
        return;
    }
    int limit = req->page_size == 0 ? LIST_DEFAULT_PAGE
                                    : req->page_size > LIST_MAX_PAGE ? LIST_MAX_PAGE : req->page_size;
    zt_job_info *jobs = NULL;
    int n = 0;
    bool more = false;
    zt_status s = zt_jobs_list(c->srv->jm, (zt_job_state)req->state, req->page_token, limit, &jobs,
                               &n, &more);
    if (s != ZT_OK) {
        finish_zt(c, s);
        return;
    }
    Ztrain__V1__ListJobsResponse *resp = malloc(sizeof *resp);
    if (resp)
        ztrain__v1__list_jobs_response__init(resp);
    s = resp ? list_response(jobs, n, more, resp) : zt_error(ZT_ERR_NOMEM, "out of memory");
    free_infos(jobs, n);
    if (s == ZT_OK)
        reply(c, &resp->base);
    else
        finish(c, GRPC_STATUS_INTERNAL, zt_last_error());
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
}

static void handle_cancel(call *c, ProtobufCMessage *m) {
    Ztrain__V1__CancelJobRequest *req = (Ztrain__V1__CancelJobRequest *)m;
    if (!require_id(c, req->id))
        return;
    if (!isfinite(req->grace_seconds) || req->grace_seconds < 0) {
        finish(c, GRPC_STATUS_INVALID_ARGUMENT, "grace_seconds must be a number >= 0");
        return;
    }
    zt_job_info info;
    memset(&info, 0, sizeof info);
    zt_status s = zt_jobs_cancel(c->srv->jm, req->id, req->force, req->grace_seconds, &info);
    reply_job(c, s, &info);
}

typedef struct {
    Ztrain__V1__GetMetricsResponse *resp;
    bool oom;
} series_ctx;

static Ztrain__V1__MetricSeries *new_series(const char *key, const int64_t *steps,
                                            const double *values, int n) {
    Ztrain__V1__MetricSeries *ms = malloc(sizeof *ms);
    if (!ms)
        return NULL;
    ztrain__v1__metric_series__init(ms);
    ms->key = strdup(key);
    ms->steps = n ? malloc(sizeof *steps * (size_t)n) : NULL;
    ms->values = n ? malloc(sizeof *values * (size_t)n) : NULL;
    if (!ms->key || (n && (!ms->steps || !ms->values))) {
        if (!ms->key)
            ms->key = (char *)protobuf_c_empty_string;
        protobuf_c_message_free_unpacked(&ms->base, NULL);
        return NULL;
    }
    if (n > 0) {
        memcpy(ms->steps, steps, sizeof *steps * (size_t)n);
        memcpy(ms->values, values, sizeof *values * (size_t)n);
    }
    ms->n_steps = ms->n_values = (size_t)n;
    return ms;
}

/* Runs under the manager's lock: copies one key's series into the response. */
static void emit_series(void *ctx, const char *key, const int64_t *steps, const double *values,
                        int n) {
    series_ctx *sc = ctx;
    Ztrain__V1__GetMetricsResponse *r = sc->resp;
    if (sc->oom)
        return;
    Ztrain__V1__MetricSeries **grown = realloc(r->series, sizeof *grown * (r->n_series + 1));
    Ztrain__V1__MetricSeries *ms = grown ? new_series(key, steps, values, n) : NULL;
    if (grown)
        r->series = grown;
    if (!ms) {
        sc->oom = true;
        return;
    }
    r->series[r->n_series++] = ms;
}

static void handle_metrics(call *c, ProtobufCMessage *m) {
    Ztrain__V1__GetMetricsRequest *req = (Ztrain__V1__GetMetricsRequest *)m;
    if (!require_id(c, req->id))
        return;
    if (req->max_points < 0) {
        finish(c, GRPC_STATUS_INVALID_ARGUMENT, "max_points must be >= 0");
        return;
    }
    Ztrain__V1__GetMetricsResponse *resp = malloc(sizeof *resp);
    if (!resp) {
        finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ztraind is out of memory");
        return;
    }
    ztrain__v1__get_metrics_response__init(resp);
    series_ctx sc = {.resp = resp};
    zt_status s = zt_jobs_metric_series(c->srv->jm, req->id, (const char *const *)req->keys,
                                        (int)req->n_keys, req->since_step, req->max_points,
                                        emit_series, &sc);
    if (s != ZT_OK)
        finish_zt(c, s);
    else if (sc.oom)
        finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ztraind ran out of memory copying the series");
    else
        reply(c, &resp->base);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}

static void handle_health(call *c, ProtobufCMessage *m) {
    Grpc__Health__V1__HealthCheckRequest *req = (Grpc__Health__V1__HealthCheckRequest *)m;
    if (req->service[0] && strcmp(req->service, "ztrain.v1.Trainer") != 0) {
        finish(c, GRPC_STATUS_NOT_FOUND, "unknown service");
        return;
    }
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    reply(c, &resp.base);
}

/* ---- streams ----------------------------------------------------------------------------- */

static bool state_is_terminal(zt_job_state s) {
    return s == ZT_JOB_SUCCEEDED || s == ZT_JOB_FAILED || s == ZT_JOB_CANCELLED;
}

/* The message an event becomes on this call's stream (JobEvent for WatchJob, LogLine for
 * StreamLogs), packed; NULL with *skip for events the stream does not carry. */
static zt_status pack_event(const call *c, const zt_job_event *ev, grpc_byte_buffer **out) {
    *out = NULL;
    ProtobufCMessage *inner = NULL;
    Ztrain__V1__JobEvent je = ZTRAIN__V1__JOB_EVENT__INIT;
    if (ev->kind == ZT_EVENT_STATE) {
        if (c->method != M_WATCH)
            return ZT_OK;
        ZT_TRY(zt_job_proto_job_from_info(ev->job, &je.job));
        je.event_case = ZTRAIN__V1__JOB_EVENT__EVENT_JOB;
        inner = &je.job->base;
    } else if (ev->kind == ZT_EVENT_METRICS) {
        ZT_TRY(zt_job_proto_record_from_metric(ev->record, &je.metrics));
        je.event_case = ZTRAIN__V1__JOB_EVENT__EVENT_METRICS;
        inner = &je.metrics->base;
    } else {
        ZT_TRY(zt_job_proto_log_from_line(ev->log, &je.log));
        je.event_case = ZTRAIN__V1__JOB_EVENT__EVENT_LOG;
        inner = &je.log->base;
    }
    *out = zt_pb_pack(c->method == M_WATCH ? &je.base : inner);
    protobuf_c_message_free_unpacked(inner, NULL);
    return ZT_OK;
}

/* The watch callback: runs with the manager's lock held, on whichever thread produced the
 * event. It packs, queues and kicks; nothing here may block or call into the manager. */
static void on_job_event(void *ctx, const zt_job_event *ev) {
    call *c = ctx;
    grpc_byte_buffer *bb = NULL;
    zt_status s = pack_event(c, ev, &bb);
    bool terminal = ev->kind == ZT_EVENT_STATE && state_is_terminal(ev->job->state);
    pthread_mutex_lock(&c->mu);
    if (s != ZT_OK)
        finish_locked(c, GRPC_STATUS_INTERNAL, zt_last_error());
    if (bb)
        push_locked(c, bb);
    if (terminal && c->replaying)
        c->terminal_seen = true;
    else if (terminal)
        finish_locked(c, GRPC_STATUS_OK, "");
    pthread_mutex_unlock(&c->mu);
}

/* Registers the watch. Events replayed inside zt_jobs_watch may include a terminal state
 * before the history that follows it, so the stream ends only once the replay is over. */
static void start_watch(call *c, const char *id, int what, int64_t from_step, int log_tail) {
    pthread_mutex_lock(&c->mu);
    c->replaying = true;
    pthread_mutex_unlock(&c->mu);
    zt_job_watch *w = NULL;
    zt_status s = zt_jobs_watch(c->srv->jm, id, what, from_step, log_tail, on_job_event, c, &w);
    grpc_status_code code = zt_grpc_status_from_zt(s);
    char *text = s != ZT_OK ? strdup(zt_last_error()) : NULL;
    c->watch = s == ZT_OK ? w : NULL;
    pthread_mutex_lock(&c->mu);
    c->replaying = false;
    if (s != ZT_OK)
        finish_locked(c, code, text ? text : "watch failed");
    else if (c->terminal_seen)
        finish_locked(c, GRPC_STATUS_OK, "");
    pthread_mutex_unlock(&c->mu);
    free(text);
}

static void handle_watch(call *c, ProtobufCMessage *m) {
    Ztrain__V1__WatchJobRequest *req = (Ztrain__V1__WatchJobRequest *)m;
    if (!require_id(c, req->id))
        return;
    int what = ZT_WATCH_STATE | ZT_WATCH_METRICS | (req->logs ? ZT_WATCH_LOGS : 0);
    /* Log lines in a watch are live ones only; StreamLogs is the way to read a tail. */
    start_watch(c, req->id, what, req->from_step, 0);
}

static void emit_log(void *ctx, const zt_log_line *l) {
    call *c = ctx;
    zt_job_event ev = {.kind = ZT_EVENT_LOG, .log = l};
    on_job_event(c, &ev);
}

static void handle_logs(call *c, ProtobufCMessage *m) {
    Ztrain__V1__StreamLogsRequest *req = (Ztrain__V1__StreamLogsRequest *)m;
    if (!require_id(c, req->id))
        return;
    if (req->tail < 0) {
        finish(c, GRPC_STATUS_INVALID_ARGUMENT, "tail must be >= 0");
        return;
    }
    int tail = req->tail ? req->tail : LOGS_DEFAULT_TAIL;
    if (req->follow) {
        start_watch(c, req->id, ZT_WATCH_LOGS, 0, tail);
        return;
    }
    zt_status s = zt_jobs_logs(c->srv->jm, req->id, tail, emit_log, c);
    if (s != ZT_OK)
        finish_zt(c, s);
    else
        finish(c, GRPC_STATUS_OK, "");
}

typedef void (*handler_fn)(call *c, ProtobufCMessage *req);

static const struct {
    const char *path;
    const ProtobufCMessageDescriptor *request;
    handler_fn handle;
} methods[M_COUNT] = {
    [M_SUBMIT] = {"/ztrain.v1.Trainer/SubmitJob", &ztrain__v1__submit_job_request__descriptor,
                  handle_submit},
    [M_GET] = {"/ztrain.v1.Trainer/GetJob", &ztrain__v1__get_job_request__descriptor, handle_get},
    [M_LIST] = {"/ztrain.v1.Trainer/ListJobs", &ztrain__v1__list_jobs_request__descriptor,
                handle_list},
    [M_CANCEL] = {"/ztrain.v1.Trainer/CancelJob", &ztrain__v1__cancel_job_request__descriptor,
                  handle_cancel},
    [M_WATCH] = {"/ztrain.v1.Trainer/WatchJob", &ztrain__v1__watch_job_request__descriptor,
                 handle_watch},
    [M_METRICS] = {"/ztrain.v1.Trainer/GetMetrics", &ztrain__v1__get_metrics_request__descriptor,
                   handle_metrics},
    [M_LOGS] = {"/ztrain.v1.Trainer/StreamLogs", &ztrain__v1__stream_logs_request__descriptor,
                handle_logs},
    [M_HEALTH] = {"/grpc.health.v1.Health/Check",
                  &grpc__health__v1__health_check_request__descriptor, handle_health},
};

/* ---- call lifecycle ---------------------------------------------------------------------- */

static void call_free(call *c) {
    c->srv->n_calls--;
    drop_queue_locked(c);
    if (c->in_flight)
        grpc_byte_buffer_destroy(c->in_flight);
    if (c->payload)
        grpc_byte_buffer_destroy(c->payload);
    grpc_metadata_array_destroy(&c->md);
    if (c->method == M_UNKNOWN)
        grpc_call_details_destroy(&c->details);
    if (c->call)
        grpc_call_unref(c->call);
    free(c->status_text);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Posts one request for a new call of method m. */
static void post_request(zt_grpc_server *s, method_id m) {
    call *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "ztraind: grpc: out of memory posting a request\n");
        return;
    }
    s->n_calls++;
    c->srv = s;
    c->method = m;
    c->t_new = (tag){TAG_NEW, c};
    c->t_send = (tag){TAG_SEND, c};
    c->t_status = (tag){TAG_STATUS, c};
    c->t_close = (tag){TAG_CLOSE, c};
    pthread_mutex_init(&c->mu, NULL);
    grpc_metadata_array_init(&c->md);
    grpc_call_error e;
    if (m == M_UNKNOWN) {
        grpc_call_details_init(&c->details);
        e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq, s->cq,
                                     &c->t_new);
    } else {
        e = grpc_server_request_registered_call(s->server, s->handles[m], &c->call, &c->deadline,
                                                &c->md, &c->payload, s->cq, s->cq, &c->t_new);
    }
    if (e != GRPC_CALL_OK) {
        fprintf(stderr, "ztraind: grpc: posting a request failed: %s\n",
                grpc_call_error_to_string(e));
        call_free(c);
    }
}

static bool authorized(const call *c) {
    if (!c->srv->token)
        return true;
    char *header = zt_grpc_metadata_find(&c->md, "authorization");
    bool ok = zt_auth_bearer_ok(c->srv->token, header);
    free(header);
    return ok;
}

static void dispatch(call *c) {
    if (!authorized(c)) {
        finish(c, GRPC_STATUS_UNAUTHENTICATED,
               "this server needs \"authorization: Bearer <token>\" metadata with its token");
        return;
    }
    if (c->method == M_UNKNOWN) {
        char *name = grpc_slice_to_c_string(c->details.method);
        char text[512];
        snprintf(text, sizeof text, "unknown method %s", name);
        gpr_free(name);
        finish(c, GRPC_STATUS_UNIMPLEMENTED, text);
        return;
    }
    ProtobufCMessage *req = zt_pb_unpack(methods[c->method].request, c->payload);
    if (!req) {
        char text[256];
        snprintf(text, sizeof text, "the request is not a valid %s message",
                 methods[c->method].request->name);
        finish(c, GRPC_STATUS_INVALID_ARGUMENT, c->payload ? text : "the request has no message");
        return;
    }
    methods[c->method].handle(c, req);
    protobuf_c_message_free_unpacked(req, NULL);
}

static void on_new_call(zt_grpc_server *s, call *c, bool ok) {
    if (!ok) {
        /* The server is shutting down and gives back what was posted. */
        call_free(c);
        return;
    }
    if (!s->shutting_down)
        post_request(s, c->method);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    pthread_mutex_lock(&c->mu);
    bool started = start_batch(c, &op, 1, &c->t_close);
    pthread_mutex_unlock(&c->mu);
    if (!started) {
        call_free(c);
        return;
    }
    /* A call that slipped in as shutdown began is not served: the job manager may already be
     * on its way out. */
    if (s->shutting_down)
        finish(c, GRPC_STATUS_UNAVAILABLE, "ztraind is shutting down");
    else
        dispatch(c);
    if (c->payload) {
        grpc_byte_buffer_destroy(c->payload);
        c->payload = NULL;
    }
}

static void on_call_tag(tag *t, bool ok) {
    call *c = t->c;
    if (t->kind == TAG_CLOSE && c->watch) {
        /* Outside c->mu: unwatch takes the manager's lock, which callbacks hold while they
         * take c->mu. Once it returns no callback touches c again. */
        zt_jobs_unwatch(c->srv->jm, c->watch);
        c->watch = NULL;
    }
    pthread_mutex_lock(&c->mu);
    c->pending--;
    if (t->kind == TAG_SEND || t->kind == TAG_STATUS) {
        if (c->in_flight)
            grpc_byte_buffer_destroy(c->in_flight);
        c->in_flight = NULL;
        c->sending = false;
        if (!ok)
            c->broken = true;
        if (c->broken)
            drop_queue_locked(c);
        else
            kick_locked(c);
    } else if (t->kind == TAG_CLOSE) {
        c->closed = true;
        drop_queue_locked(c);
    }
    bool done = c->closed && c->pending == 0;
    pthread_mutex_unlock(&c->mu);
    if (done)
        call_free(c);
}

static void on_event(zt_grpc_server *s, grpc_event ev) {
    tag *t = ev.tag;
    if (t->kind == TAG_SHUTDOWN) {
        grpc_server_destroy(s->server);
        s->server = NULL;
        s->server_down = true;
    } else if (t->kind == TAG_NEW) {
        on_new_call(s, t->c, ev.success);
    } else {
        on_call_tag(t, ev.success);
    }
}

/* ---- server ------------------------------------------------------------------------------ */

static void begin_shutdown(zt_grpc_server *s) {
    if (s->shutting_down)
        return;
    s->shutting_down = true;
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    /* Without this, shutdown waits for every open stream's client deadline. */
    grpc_server_cancel_all_calls(s->server);
}

static void serve(zt_grpc_server *s, volatile sig_atomic_t *stop) {
    while (!s->drained) {
        if (stop && *stop)
            begin_shutdown(s);
        gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                             gpr_time_from_millis(POLL_MS, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(s->cq, deadline, NULL);
        if (ev.type == GRPC_OP_COMPLETE)
            on_event(s, ev);
        else if (ev.type == GRPC_QUEUE_SHUTDOWN)
            s->drained = true;
        /* The queue shuts down only when no call is left: a watch callback on another thread
         * may still start a batch on a cancelled call until the call's CLOSE is handled. */
        if (s->server_down && s->n_calls == 0 && !s->cq_down) {
            s->cq_down = true;
            grpc_completion_queue_shutdown(s->cq);
        }
    }
}

void zt_grpc_server_run(zt_grpc_server *s, volatile sig_atomic_t *stop) { serve(s, stop); }

static grpc_server *create_core_server(const zt_grpc_server_config *cfg) {
    size_t max = cfg->max_message_bytes ? cfg->max_message_bytes : DEFAULT_MAX_MESSAGE;
    grpc_arg args[2];
    memset(args, 0, sizeof args);
    /* gRPC turns SO_REUSEPORT on by default, which lets a second daemon bind the same port
     * without an error; off, a port in use fails here. */
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[0].value.integer = 0;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[1].value.integer = max > INT32_MAX ? INT32_MAX : (int)max;
    grpc_channel_args ch_args = {.num_args = 2, .args = args};
    return grpc_server_create(&ch_args, NULL);
}

static zt_status register_and_bind(zt_grpc_server *s, const char *addr) {
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    for (int m = 0; m < M_COUNT; m++) {
        s->handles[m] = grpc_server_register_method(s->server, methods[m].path, NULL,
                                                    GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
        if (!s->handles[m])
            return zt_error(ZT_ERR_INVALID, "gRPC: cannot register %s", methods[m].path);
    }
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    s->port = grpc_server_add_http2_port(s->server, addr, creds);
    grpc_server_credentials_release(creds);
    if (s->port == 0)
        return zt_error(ZT_ERR_IO, "gRPC: cannot listen on %s: the address is in use or invalid",
                        addr);
    return ZT_OK;
}

zt_status zt_grpc_server_create(zt_grpc_server **out, const zt_grpc_server_config *cfg,
                                zt_jobs *jm) {
    *out = NULL;
    zt_grpc_server *s = calloc(1, sizeof *s);
    if (!s)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    grpc_init();
    s->jm = jm;
    s->shutdown_tag.kind = TAG_SHUTDOWN;
    s->addr = strdup(cfg->addr ? cfg->addr : "");
    s->token = cfg->token && cfg->token[0] ? strdup(cfg->token) : NULL;
    s->cq = grpc_completion_queue_create_for_next(NULL);
    s->server = create_core_server(cfg);
    zt_status st = !s->addr || (cfg->token && cfg->token[0] && !s->token)
                       ? zt_error(ZT_ERR_NOMEM, "out of memory")
                       : register_and_bind(s, cfg->addr ? cfg->addr : "");
    if (st != ZT_OK) {
        zt_grpc_server_destroy(s);
        return st;
    }
    grpc_server_start(s->server);
    for (int m = 0; m <= M_UNKNOWN; m++)
        for (int i = 0; i < POSTED_PER_METHOD; i++)
            post_request(s, (method_id)m);
    *out = s;
    return ZT_OK;
}

int zt_grpc_server_port(const zt_grpc_server *s) { return s->port; }

void zt_grpc_server_destroy(zt_grpc_server *s) {
    if (!s)
        return;
    if (!s->drained) {
        begin_shutdown(s);
        serve(s, NULL);
    }
    grpc_completion_queue_destroy(s->cq);
    free(s->token);
    free(s->addr);
    free(s);
    grpc_shutdown();
}
