/* The methods of ztraind's gRPC server (grpc_server.h): each handler checks its request, asks
 * the job manager and replies through the call's sending side in grpc_server.c.
 *
 * Unary methods run to completion on the completion queue's thread. WatchJob and StreamLogs -f
 * register a job-manager watch whose callback, on_job_event, runs on other threads with the
 * manager's lock held: it only packs the event and queues it under the call's mutex (lock order
 * manager -> call). WatchJob registers on a thread of its own (grpc_server.c), where the
 * history read from the state file is replayed without the manager's lock: there the callback
 * waits while REPLAY_WINDOW bytes are queued, so the replay goes out as the client reads it.
 * grpc_server.c removes the watch when the call closes. GetMetrics is bounded by the manager
 * (keys, points) and computed without its lock. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grpc_server_internal.h"
#include "api/page_token.h"
#include "api/grpc_util.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "health.pb-c.h"
#include "api/job_proto.h"
#include "api/submitter.h"
#include "ztrain.pb-c.h"

#define LIST_DEFAULT_PAGE 50
#define LIST_MAX_PAGE 1000
/* A replay from the state file waits while this much is queued on its call: an unread WatchJob
 * holds about this much of a long history (issue 34; as the SSE stream's window). */
#define REPLAY_WINDOW ((size_t)256 * 1024)

/* ---- unary methods ----------------------------------------------------------------------- */

static bool require_id(call *c, const char *id) {
    if (id && *id)
        return true;
    zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "id", "id is required");
    return false;
}

/* The server's wall clock, which ends a running job's run_duration. */
static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Replies with the job of a manager call, or its error (scope and id as zt_call_finish_zt's).
 * Reads zt_last_error() at once, on the thread that made the call. */
static void reply_job(call *c, zt_status s, zt_job_info *info, const char *scope,
                      const char *id) {
    if (s != ZT_OK) {
        zt_call_finish_zt(c, s, scope, id);
        return;
    }
    Ztrain__V1__Job *job;
    s = zt_job_proto_job_from_info(info, wall_ms(), &job);
    zt_job_info_free(info);
    if (s != ZT_OK) {
        zt_call_finish(c, GRPC_STATUS_INTERNAL, zt_last_error());
        return;
    }
    zt_call_reply(c, &job->base);
    protobuf_c_message_free_unpacked(&job->base, NULL);
}

static void handle_submit(call *c, ProtobufCMessage *m) {
    Ztrain__V1__SubmitJobRequest *req = (Ztrain__V1__SubmitJobRequest *)m;
    char *spec_json;
    zt_status s = zt_job_proto_spec_to_json(req->spec, &spec_json);
    if (s != ZT_OK) {
        zt_call_finish_zt(c, s, "spec", NULL);
        return;
    }
    zt_job_info info;
    memset(&info, 0, sizeof info);
    zt_submitter by;
    s = zt_jobs_submit_by(c->srv->jm, spec_json, req->idempotency_key,
                          zt_submitter_of(&c->who, &by), &info);
    free(spec_json);
    reply_job(c, s, &info, "spec", NULL);
}

static void handle_get(call *c, ProtobufCMessage *m) {
    Ztrain__V1__GetJobRequest *req = (Ztrain__V1__GetJobRequest *)m;
    if (!require_id(c, req->id))
        return;
    zt_job_info info;
    memset(&info, 0, sizeof info);
    reply_job(c, zt_jobs_get(c->srv->jm, req->id, &info), &info, NULL, req->id);
}

static void free_infos(zt_job_info *jobs, int n) {
    for (int i = 0; i < n; i++)
        zt_job_info_free(&jobs[i]);
    free(jobs);
}

static zt_status list_response(const zt_page_key *key, zt_job_info *jobs, int n, bool more,
                               const char *filter, Ztrain__V1__ListJobsResponse *resp) {
    if (n > 0) {
        resp->jobs = calloc((size_t)n, sizeof *resp->jobs);
        if (!resp->jobs)
            return zt_error(ZT_ERR_NOMEM, "out of memory listing %d jobs", n);
    }
    for (int i = 0; i < n; i++) {
        ZT_TRY(zt_job_proto_job_from_info(&jobs[i], wall_ms(), &resp->jobs[i]));
        resp->n_jobs++;
    }
    /* The page token holds the last id of this page, bound to the list's filter: the next
     * page starts after it. */
    char token[ZT_PAGE_TOKEN_MAX];
    if (more && n > 0 &&
        zt_page_token_make(key, ZT_PAGE_JOBS, "", filter, jobs[n - 1].id, token, sizeof token) &&
        !(resp->next_page_token = strdup(token))) {
        resp->next_page_token = (char *)protobuf_c_empty_string;
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    return ZT_OK;
}

static void handle_list(call *c, ProtobufCMessage *m) {
    Ztrain__V1__ListJobsRequest *req = (Ztrain__V1__ListJobsRequest *)m;
    if ((int)req->state < 0 || (int)req->state > ZT_JOB_CANCELLED) {
        zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "state", "state is not a JobState");
        return;
    }
    int limit;
    if (!zt_call_page_size(c, req->page_size, LIST_DEFAULT_PAGE, LIST_MAX_PAGE, &limit))
        return;
    const char *filter = req->state ? zt_job_state_name((zt_job_state)req->state) : "";
    char after[ZT_PAGE_TOKEN_MAX] = "";
    if (req->page_token[0] && !zt_page_token_read(&c->srv->page_key, req->page_token,
                                                  ZT_PAGE_JOBS, "", filter, after, sizeof after)) {
        zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "page_token",
                             "page_token: not a next_page_token of ListJobs with this state");
        return;
    }
    zt_job_info *jobs = NULL;
    int n = 0;
    bool more = false;
    zt_status s = zt_jobs_list(c->srv->jm, (zt_job_state)req->state, after, limit, &jobs,
                               &n, &more);
    if (s != ZT_OK) {
        zt_call_finish_zt(c, s, NULL, NULL);
        return;
    }
    Ztrain__V1__ListJobsResponse *resp = malloc(sizeof *resp);
    if (resp)
        ztrain__v1__list_jobs_response__init(resp);
    s = resp ? list_response(&c->srv->page_key, jobs, n, more, filter, resp)
             : zt_error(ZT_ERR_NOMEM, "out of memory");
    free_infos(jobs, n);
    if (s == ZT_OK)
        zt_call_reply(c, &resp->base);
    else
        zt_call_finish(c, GRPC_STATUS_INTERNAL, zt_last_error());
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
}

static void handle_cancel(call *c, ProtobufCMessage *m) {
    Ztrain__V1__CancelJobRequest *req = (Ztrain__V1__CancelJobRequest *)m;
    if (!require_id(c, req->id))
        return;
    if (!isfinite(req->grace_seconds) || req->grace_seconds < 0 ||
        req->grace_seconds > ZT_JOBS_MAX_GRACE_S) {
        char why[96];
        snprintf(why, sizeof why, "grace_seconds must be a number of seconds from 0 to %g",
                 ZT_JOBS_MAX_GRACE_S);
        zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "grace_seconds", why);
        return;
    }
    zt_job_info info;
    memset(&info, 0, sizeof info);
    /* Below admin, a token cancels only the jobs it submitted; who submitted a job never
     * changes, so checking first is no race. */
    if (c->who.scope < ZT_SCOPE_ADMIN) {
        zt_status s = zt_jobs_get(c->srv->jm, req->id, &info);
        char text[300];
        bool own = s == ZT_OK && zt_submitted_by(&info, &c->who, text, sizeof text);
        zt_job_info_free(&info);
        if (s != ZT_OK) {
            reply_job(c, s, &info, NULL, req->id);
            return;
        }
        if (!own) {
            zt_api_error e;
            zt_submitter_refusal(&e, req->id, text);
            zt_call_finish_error(c, &e);
            return;
        }
    }
    zt_status s = zt_jobs_cancel(c->srv->jm, req->id, req->force, req->grace_seconds, &info);
    reply_job(c, s, &info, NULL, req->id);
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

/* Copies one key's series into the response (the manager calls it with no lock held). */
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

/* A step is never negative; HTTP answers since_step=-5 with 400 naming it, and so does this. */
static bool since_step_ok(call *c, int64_t since_step) {
    if (since_step >= 0)
        return true;
    zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "since_step",
                         "since_step must be >= 0");
    return false;
}

static void handle_metrics(call *c, ProtobufCMessage *m) {
    Ztrain__V1__GetMetricsRequest *req = (Ztrain__V1__GetMetricsRequest *)m;
    if (!require_id(c, req->id))
        return;
    if (req->max_points < 0) {
        zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "max_points",
                             "max_points must be >= 0");
        return;
    }
    if (!since_step_ok(c, req->since_step))
        return;
    Ztrain__V1__GetMetricsResponse *resp = malloc(sizeof *resp);
    if (!resp) {
        zt_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ztraind is out of memory");
        return;
    }
    ztrain__v1__get_metrics_response__init(resp);
    /* The manager checks the keys against ZT_METRICS_MAX_KEYS (repeats count once) and caps the
     * points, so that the answer is bounded whatever the request. */
    series_ctx sc = {.resp = resp};
    zt_status s = zt_jobs_metric_series(c->srv->jm, req->id, (const char *const *)req->keys,
                                        (int)req->n_keys, req->since_step, req->max_points,
                                        emit_series, &sc);
    if (s != ZT_OK)
        zt_call_finish_zt(c, s, NULL, req->id);
    else if (sc.oom)
        zt_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                       "ztraind ran out of memory copying the series");
    else
        zt_call_reply(c, &resp->base);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}

/* Whether the health service knows `service`: the server as a whole ("") or its Trainer. */
static bool health_known(const char *service) {
    return !service[0] || strcmp(service, "ztrain.v1.Trainer") == 0;
}

static void handle_health(call *c, ProtobufCMessage *m) {
    Grpc__Health__V1__HealthCheckRequest *req = (Grpc__Health__V1__HealthCheckRequest *)m;
    if (!health_known(req->service)) {
        zt_call_finish(c, GRPC_STATUS_NOT_FOUND, "unknown service");
        return;
    }
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    zt_call_reply(c, &resp.base);
}

/* Health/Watch as the health protocol has it: the current status at once (SERVICE_UNKNOWN for
 * a service it does not know, without ending the call), then one message per change, until the
 * client cancels or the server stops. A serving ztraind's status does not change while it
 * runs, so the call stays open with nothing more to send; stopping cancels every open call
 * (grpc_server.c, begin_shutdown), which ends the stream without waiting for its deadline. */
static void handle_health_watch(call *c, ProtobufCMessage *m) {
    Grpc__Health__V1__HealthCheckRequest *req = (Grpc__Health__V1__HealthCheckRequest *)m;
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = health_known(req->service)
                      ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                      : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    zt_call_send(c, &resp.base);
}

/* ---- streams ----------------------------------------------------------------------------- */

/* The message an event becomes on this call's stream (JobEvent for WatchJob, LogLine for
 * StreamLogs), packed; *out is NULL for events the stream does not carry. */
static zt_status pack_event(const call *c, const zt_job_event *ev, grpc_byte_buffer **out) {
    *out = NULL;
    ProtobufCMessage *inner = NULL;
    Ztrain__V1__JobEvent je = ZTRAIN__V1__JOB_EVENT__INIT;
    if (ev->kind == ZT_EVENT_STATE) {
        if (c->method != M_WATCH)
            return ZT_OK;
        ZT_TRY(zt_job_proto_job_from_info(ev->job, wall_ms(), &je.job));
        je.event_case = ZTRAIN__V1__JOB_EVENT__EVENT_JOB;
        inner = &je.job->base;
    } else if (ev->kind == ZT_EVENT_METRICS) {
        ZT_TRY(zt_job_proto_record_from_metric(ev->record, &je.metrics));
        je.event_case = ZTRAIN__V1__JOB_EVENT__EVENT_METRICS;
        inner = &je.metrics->base;
    } else if (ev->kind == ZT_EVENT_ANOMALY) {
        if (c->method != M_WATCH)
            return ZT_OK;
        ZT_TRY(zt_job_proto_anomaly_from(ev->anomaly, &je.anomaly));
        je.event_case = ZTRAIN__V1__JOB_EVENT__EVENT_ANOMALY;
        inner = &je.anomaly->base;
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
 * event, or without it on the thread registering the watch, replaying a history from the store
 * inside zt_jobs_watch (ev->may_block). It packs, queues and kicks, and never calls into the
 * manager; only a may_block event waits, for the client to take what is queued. */
static void on_job_event(void *ctx, const zt_job_event *ev) {
    call *c = ctx;
    grpc_byte_buffer *bb = NULL;
    zt_status s = pack_event(c, ev, &bb);
    bool terminal = ev->kind == ZT_EVENT_STATE && zt_job_state_terminal(ev->job->state);
    size_t len = bb ? grpc_byte_buffer_length(bb) : 0;
    pthread_mutex_lock(&c->mu);
    while (ev->may_block && c->head && c->queued_bytes + len > REPLAY_WINDOW && !c->closed &&
           !c->broken && !c->finishing)
        pthread_cond_wait(&c->room, &c->mu);
    if (s != ZT_OK)
        zt_call_finish_locked(c, GRPC_STATUS_INTERNAL, zt_last_error());
    if (bb)
        zt_call_push_locked(c, bb);
    if (terminal && c->replaying)
        c->terminal_seen = true;
    else if (terminal)
        zt_call_finish_locked(c, GRPC_STATUS_OK, "");
    pthread_mutex_unlock(&c->mu);
}

/* Registers the watch. Events replayed inside zt_jobs_watch may include a terminal state
 * before the history that follows it, so the stream ends only once the replay is over. */
static void start_watch(call *c, const char *id, int what, int64_t from_step,
                        zt_watch_cursor after, int log_tail) {
    pthread_mutex_lock(&c->mu);
    c->replaying = true;
    pthread_mutex_unlock(&c->mu);
    zt_job_watch *w = NULL;
    zt_status s = zt_jobs_watch(c->srv->jm, id, what, from_step, after, log_tail, on_job_event,
                                c, &w);
    zt_api_error *e = s != ZT_OK ? malloc(sizeof *e) : NULL;
    if (e)
        zt_api_error_from_status(e, s, zt_last_error(), NULL, id);
    pthread_mutex_lock(&c->mu);
    c->replaying = false;
    bool end = s == ZT_OK && c->terminal_seen;
    /* A call that closed while its history was replayed is not watched any more: its watch is
     * removed here, as the queue's thread found none to remove. */
    bool gone = s == ZT_OK && c->closed;
    if (s == ZT_OK && !gone)
        c->watch = w;
    pthread_mutex_unlock(&c->mu);
    if (gone)
        zt_jobs_unwatch(c->srv->jm, w);
    if (e)
        zt_call_finish_error(c, e);
    else if (s != ZT_OK)
        zt_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ztraind is out of memory");
    else if (end)
        zt_call_finish(c, GRPC_STATUS_OK, "");
    free(e);
}

static void handle_watch(call *c, ProtobufCMessage *m) {
    Ztrain__V1__WatchJobRequest *req = (Ztrain__V1__WatchJobRequest *)m;
    if (!require_id(c, req->id))
        return;
    if (!since_step_ok(c, req->since_step))
        return;
    if (req->after_seq < 0) {
        zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "after_seq",
                             "after_seq must be >= 0 (the seq of the last record received)");
        return;
    }
    if (req->after_anomaly_seq < 0) {
        zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "after_anomaly_seq",
                             "after_anomaly_seq must be >= 0 (the seq of the last anomaly event "
                             "received)");
        return;
    }
    if (req->after_log_seq < 0) {
        zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "after_log_seq",
                             "after_log_seq must be >= 0 (the seq of the last log line "
                             "received)");
        return;
    }
    int what = ZT_WATCH_STATE | ZT_WATCH_METRICS | (req->logs ? ZT_WATCH_LOGS : 0);
    /* A first watch's log lines are live ones only (StreamLogs reads a tail); a resumed one
     * first gets the kept lines after its last (a tail of -1: all that are kept). */
    zt_watch_cursor after = {req->after_seq, req->after_anomaly_seq, req->after_log_seq};
    start_watch(c, req->id, what, req->since_step, after, req->after_log_seq > 0 ? -1 : 0);
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
    /* tail sits in a oneof for its presence: 0 asks for no kept lines, unset for the default. */
    bool given = req->tail_present_case == ZTRAIN__V1__STREAM_LOGS_REQUEST__TAIL_PRESENT_TAIL;
    if (given && req->tail < 0) {
        zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "tail", "tail must be >= 0");
        return;
    }
    int tail = given ? req->tail : ZT_LOG_TAIL_DEFAULT;
    if (req->follow) {
        start_watch(c, req->id, ZT_WATCH_LOGS, 0, (zt_watch_cursor){0}, tail);
        return;
    }
    zt_status s = zt_jobs_logs(c->srv->jm, req->id, tail, emit_log, c);
    if (s != ZT_OK)
        zt_call_finish_zt(c, s, NULL, req->id);
    else
        zt_call_finish(c, GRPC_STATUS_OK, "");
}

/* ---- the method table -------------------------------------------------------------------- */

const method_def zt_grpc_methods[M_COUNT] = {
    [M_SUBMIT] = {"/ztrain.v1.Trainer/SubmitJob", &ztrain__v1__submit_job_request__descriptor,
                  handle_submit, .op = ZT_OP_SUBMIT},
    [M_GET] = {"/ztrain.v1.Trainer/GetJob", &ztrain__v1__get_job_request__descriptor, handle_get,
               .op = ZT_OP_GET},
    [M_LIST] = {"/ztrain.v1.Trainer/ListJobs", &ztrain__v1__list_jobs_request__descriptor,
                handle_list, .op = ZT_OP_LIST},
    [M_CANCEL] = {"/ztrain.v1.Trainer/CancelJob", &ztrain__v1__cancel_job_request__descriptor,
                  handle_cancel, .op = ZT_OP_CANCEL},
    [M_WATCH] = {"/ztrain.v1.Trainer/WatchJob", &ztrain__v1__watch_job_request__descriptor,
                 handle_watch, .op = ZT_OP_WATCH},
    [M_METRICS] = {"/ztrain.v1.Trainer/GetMetrics", &ztrain__v1__get_metrics_request__descriptor,
                   handle_metrics, .op = ZT_OP_METRICS},
    [M_LOGS] = {"/ztrain.v1.Trainer/StreamLogs", &ztrain__v1__stream_logs_request__descriptor,
                handle_logs, .op = ZT_OP_LOGS},
    [M_HEALTH] = {"/grpc.health.v1.Health/Check",
                  &grpc__health__v1__health_check_request__descriptor, handle_health,
                  .op = ZT_OP_HEALTH},
    [M_CHECKPOINTS] = {"/ztrain.v1.Trainer/ListCheckpoints",
                       &ztrain__v1__list_checkpoints_request__descriptor,
                       zt_grpc_list_checkpoints, .op = ZT_OP_CHECKPOINTS},
    [M_EFFECTIVE_CONFIG] = {"/ztrain.v1.Trainer/GetEffectiveConfig",
                            &ztrain__v1__get_effective_config_request__descriptor,
                            zt_grpc_get_effective_config, .op = ZT_OP_EFFECTIVE_CONFIG},
    [M_ANOMALIES] = {"/ztrain.v1.Trainer/ListAnomalies",
                     &ztrain__v1__list_anomalies_request__descriptor, zt_grpc_list_anomalies,
                     .op = ZT_OP_ANOMALIES},
    [M_DELIVERIES] = {"/ztrain.v1.Trainer/ListWebhookDeliveries",
                      &ztrain__v1__list_webhook_deliveries_request__descriptor,
                      zt_grpc_list_webhook_deliveries, .op = ZT_OP_DELIVERIES},
    [M_REFLECTION] = {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                      &grpc__reflection__v1__server_reflection_request__descriptor,
                      zt_grpc_reflection_handle, true, .op = ZT_OP_API_DOC},
    [M_REFLECTION_ALPHA] = {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                            &grpc__reflection__v1__server_reflection_request__descriptor,
                            zt_grpc_reflection_handle, true, .op = ZT_OP_API_DOC},
    [M_HEALTH_WATCH] = {"/grpc.health.v1.Health/Watch",
                        &grpc__health__v1__health_check_request__descriptor, handle_health_watch,
                        .op = ZT_OP_HEALTH},
};
