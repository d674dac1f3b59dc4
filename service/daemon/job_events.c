/* Anomaly events on jobs and the webhooks they and the jobs' ends set off (job_events.h). An
 * event keeps the engine's JSON fields and gains a per-job number and a time; the daemon's stall
 * events are made here in the same form. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job_events.h"
#include "job_manager_internal.h"
#include "webhooks.h"

typedef struct {
    int64_t seq, step, time_ms;
    double value, zscore;
    int rank;
    char *kind, *policy, *message, *json;
} kept_event;

struct zt_job_anomalies {
    kept_event *v;            /* oldest first, at most ZT_JOB_ANOMALIES_KEPT */
    int n;
    int64_t last_seq;
    int64_t progress_ms;      /* monotonic ms of the last line from rank 0; 0: none yet */
    bool stalled;             /* a stall event was made since the last progress */
    double stall_s;           /* events.stall.seconds; <= 0: not watched; NAN: not yet read */
};

/* Stalls are timed on the monotonic clock: a wall clock set back or forward is no stall. */
static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct zt_job_anomalies *anomalies_of(job *j) {
    if (!j->anomalies) {
        j->anomalies = calloc(1, sizeof *j->anomalies);
        ZT_ASSERT(j->anomalies);
        j->anomalies->stall_s = NAN;
    }
    return j->anomalies;
}

static void kept_free(kept_event *k) {
    free(k->kind);
    free(k->policy);
    free(k->message);
    free(k->json);
}

void zt_jm_job_events_free(job *j) {
    if (!j->anomalies)
        return;
    for (int i = 0; i < j->anomalies->n; i++)
        kept_free(&j->anomalies->v[i]);
    free(j->anomalies->v);
    free(j->anomalies);
    j->anomalies = NULL;
}

static zt_anomaly view(const kept_event *k) {
    return (zt_anomaly){.seq = k->seq, .step = k->step, .time_ms = k->time_ms, .kind = k->kind,
                        .policy = k->policy, .message = k->message, .value = k->value,
                        .zscore = k->zscore, .rank = k->rank, .json = k->json};
}

static void keep(job *j, const zt_anomaly *a) {
    struct zt_job_anomalies *an = anomalies_of(j);
    if (!an->v) {
        an->v = calloc(ZT_JOB_ANOMALIES_KEPT, sizeof *an->v);
        ZT_ASSERT(an->v);
    }
    if (an->n == ZT_JOB_ANOMALIES_KEPT) {
        kept_free(&an->v[0]);
        memmove(an->v, an->v + 1, sizeof *an->v * (ZT_JOB_ANOMALIES_KEPT - 1));
        an->n--;
    }
    an->v[an->n++] = (kept_event){.seq = a->seq, .step = a->step, .time_ms = a->time_ms,
                                  .value = a->value, .zscore = a->zscore, .rank = a->rank,
                                  .kind = zt_jm_strdup(a->kind), .policy = zt_jm_strdup(a->policy),
                                  .message = zt_jm_strdup(a->message),
                                  .json = zt_jm_strdup(a->json)};
    if (a->seq > an->last_seq)
        an->last_seq = a->seq;
}

static void load_one(void *ctx, const zt_anomaly *a) {
    keep(ctx, a);
}

zt_status zt_jm_events_open(zt_jobs *jm) {
    ZT_TRY(zt_event_store_open(&jm->events, jm->cfg.db_path));
    for (int i = 0; i < jm->n_jobs; i++) {
        job *j = jm->jobs[i];
        /* The newest ones are what memory keeps: skip the older of a job with very many. */
        ZT_TRY(zt_event_store_anomalies(jm->events, j->info.id, 0, 1 << 30, load_one, j));
    }
    zt_webhooks_options o = {.max_attempts = jm->cfg.webhook_attempts,
                             .backoff_ms = jm->cfg.webhook_backoff_ms,
                             .policy = jm->cfg.webhook_policy};
    return zt_webhooks_create(&jm->hooks, jm->events, &o);
}

void zt_jm_events_close(zt_jobs *jm) {
    zt_webhooks_destroy(jm->hooks);
    jm->hooks = NULL;
    zt_event_store_close(jm->events);
    jm->events = NULL;
}

/* The job as webhook bodies show it: what a receiver needs to say what happened, and nothing
 * of the spec (its paths and settings are the API's to serve to those allowed to read it). */
static cJSON *job_summary(const job *j) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->info.id);
    cJSON_AddStringToObject(o, "name", j->info.name ? j->info.name : "");
    cJSON_AddStringToObject(o, "state", zt_job_state_name(j->info.state));
    cJSON_AddStringToObject(o, "reason", j->info.reason ? j->info.reason : "");
    cJSON_AddNumberToObject(o, "step", (double)j->info.step);
    cJSON_AddNumberToObject(o, "max_steps", (double)j->info.max_steps);
    if (isfinite(j->info.loss))
        cJSON_AddNumberToObject(o, "loss", j->info.loss);
    else
        cJSON_AddNullToObject(o, "loss");
    return o;
}

/* Posts body to every webhook of the job's spec and the daemon's that wants `bit`. */
static void post_hooks(zt_jobs *jm, job *j, unsigned bit, const char *type, cJSON *event) {
    zt_webhook_list list;
    zt_status s = zt_webhook_list_from_spec(&list, j->info.spec_json, "spec",
                                            jm->cfg.webhook_policy);
    if (s != ZT_OK) {
        zt_jm_daemon_log(jm, j, "webhooks: %s", zt_last_error());
        list = (zt_webhook_list){0};
    }
    bool daemon = jm->cfg.webhook_url && (jm->cfg.webhook_on & bit);
    bool any = daemon;
    for (int i = 0; i < list.n; i++)
        any |= (list.t[i].on & bit) != 0;
    if (!any) {
        zt_webhook_list_free(&list);
        cJSON_Delete(event);
        return;
    }
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "type", type);
    cJSON_AddNumberToObject(body, "time_unix_ms", (double)zt_jm_now_ms());
    cJSON_AddItemToObject(body, "job", job_summary(j));
    if (event)
        cJSON_AddItemToObject(body, "event", event);
    char *text = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    for (int i = 0; text && i < list.n; i++)
        if (list.t[i].on & bit)
            zt_webhooks_post(jm->hooks, j->info.id, list.t[i].url, list.t[i].secret, type, text,
                             false);
    if (text && daemon)
        zt_webhooks_post(jm->hooks, j->info.id, jm->cfg.webhook_url, jm->cfg.webhook_secret, type,
                         text, true);
    cJSON_free(text);
    zt_webhook_list_free(&list);
}

/* Numbers a new event, keeps and stores it, tells the watchers and the webhooks. `obj` is the
 * event's JSON object; seq and time_unix_ms are set in it here. */
static void add_event(zt_jobs *jm, job *j, cJSON *obj) {
    struct zt_job_anomalies *an = anomalies_of(j);
    int64_t now = zt_jm_now_ms();
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "event");
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "seq");
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "time_unix_ms");
    cJSON_AddNumberToObject(obj, "seq", (double)(an->last_seq + 1));
    cJSON_AddNumberToObject(obj, "time_unix_ms", (double)now);
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "train/global_step");
    const cJSON *value = cJSON_GetObjectItemCaseSensitive(obj, "value");
    const cJSON *z = cJSON_GetObjectItemCaseSensitive(obj, "zscore");
    const cJSON *rank = cJSON_GetObjectItemCaseSensitive(obj, "rank");
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "kind"));
    const char *policy = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "policy"));
    const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "message"));
    char *json = cJSON_PrintUnformatted(obj);
    zt_anomaly a = {.seq = an->last_seq + 1, .step = cJSON_IsNumber(step) ? (int64_t)step->valuedouble : 0,
                    .time_ms = now, .kind = kind ? kind : "unknown",
                    .policy = policy ? policy : "record", .message = msg ? msg : "",
                    .value = cJSON_IsNumber(value) ? value->valuedouble : NAN,
                    .zscore = cJSON_IsNumber(z) ? z->valuedouble : NAN,
                    .rank = cJSON_IsNumber(rank) ? (int)rank->valuedouble : -1,
                    .json = json ? json : "{}"};
    keep(j, &a);
    zt_jm_store_result(jm, zt_event_store_add_anomaly(jm->events, j->info.id, &a));
    zt_jm_daemon_log(jm, j, "event %s at step %lld: %s", a.kind, (long long)a.step, a.message);
    zt_job_event ev = {.kind = ZT_EVENT_ANOMALY, .anomaly = &a};
    zt_jm_notify(j, &ev);
    cJSON *copy = json ? cJSON_Parse(json) : NULL;
    cJSON_free(json);
    post_hooks(jm, j, ZT_HOOK_EVENT, "job.event", copy);
}

void zt_jm_anomaly_line(zt_jobs *jm, job *j, const cJSON *obj) {
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "kind"));
    if (!kind) {
        zt_jm_daemon_log(jm, j, "ignored an anomaly line without a kind");
        return;
    }
    cJSON *copy = cJSON_Duplicate(obj, true);
    if (copy)
        add_event(jm, j, copy);
    cJSON_Delete(copy);
}

void zt_jm_job_progress(job *j) {
    struct zt_job_anomalies *an = anomalies_of(j);
    an->progress_ms = mono_ms();
    an->stalled = false;
}

/* events.stall.seconds of the job's spec; 0 when it has none. */
static double stall_seconds(const job *j) {
    cJSON *top = cJSON_Parse(j->info.spec_json);
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(top, "events");
    const cJSON *stall = cJSON_GetObjectItemCaseSensitive(ev, "stall");
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(stall, "seconds");
    double s = cJSON_IsObject(stall) ? (cJSON_IsNumber(sec) ? sec->valuedouble : 300.0) : 0.0;
    cJSON_Delete(top);
    return s;
}

void zt_jm_check_stalls(zt_jobs *jm) {
    int64_t now = mono_ms();
    for (int i = 0; i < jm->n_jobs; i++) {
        job *j = jm->jobs[i];
        if (j->info.state != ZT_JOB_RUNNING)
            continue;
        struct zt_job_anomalies *an = anomalies_of(j);
        if (isnan(an->stall_s))
            an->stall_s = stall_seconds(j);
        if (!an->progress_ms)
            an->progress_ms = now;
        double quiet = (double)(now - an->progress_ms) / 1e3;
        if (an->stall_s <= 0 || an->stalled || quiet < an->stall_s)
            continue;
        an->stalled = true;
        char msg[256];
        snprintf(msg, sizeof msg, "no step reported for %.1f s (threshold %g s); last step %lld",
                 quiet, an->stall_s, (long long)j->info.step);
        cJSON *obj = cJSON_CreateObject();
        cJSON_AddStringToObject(obj, "kind", "stall");
        cJSON_AddStringToObject(obj, "policy", "record");
        cJSON_AddNumberToObject(obj, "train/global_step", (double)j->info.step);
        cJSON_AddNumberToObject(obj, "value", quiet);
        cJSON_AddNullToObject(obj, "zscore");
        cJSON_AddNumberToObject(obj, "rank", -1);
        cJSON_AddStringToObject(obj, "message", msg);
        add_event(jm, j, obj);
        cJSON_Delete(obj);
    }
}

void zt_jm_job_ended(zt_jobs *jm, job *j) {
    bool failed = j->info.state == ZT_JOB_FAILED;
    post_hooks(jm, j, failed ? ZT_HOOK_FAILURE : ZT_HOOK_END, failed ? "job.failure" : "job.end",
               NULL);
}

void zt_jm_replay_anomalies(job *j, int64_t after_seq, zt_job_event_fn fn, void *ctx) {
    if (!j->anomalies)
        return;
    for (int i = 0; i < j->anomalies->n; i++) {
        zt_anomaly a = view(&j->anomalies->v[i]);
        if (a.seq <= after_seq)
            continue;
        zt_job_event ev = {.kind = ZT_EVENT_ANOMALY, .anomaly = &a};
        fn(ctx, &ev);
    }
}

static zt_status known_job(zt_jobs *jm, const char *id) {
    pthread_mutex_lock(&jm->mu);
    bool found = zt_jm_find_job(jm, id) != NULL;
    pthread_mutex_unlock(&jm->mu);
    return found ? ZT_OK : zt_jm_not_found(id);
}

zt_status zt_jobs_anomalies(zt_jobs *jm, const char *id, int64_t after_seq, int limit,
                            int64_t *total, zt_anomaly_fn emit, void *ctx) {
    ZT_TRY(known_job(jm, id));
    if (limit <= 0 || limit > 10000)
        limit = 10000;
    ZT_TRY(zt_event_store_anomalies(jm->events, id, after_seq, limit, emit, ctx));
    /* Events are numbered from 1 without gaps (add_event), so the newest number is the count.
     * Read after the page, so that it is never below a seq the page holds. */
    pthread_mutex_lock(&jm->mu);
    const job *j = zt_jm_find_job(jm, id);
    *total = j && j->anomalies ? j->anomalies->last_seq : 0;
    pthread_mutex_unlock(&jm->mu);
    return ZT_OK;
}

zt_status zt_jobs_deliveries(zt_jobs *jm, const char *id, int limit, zt_delivery_fn emit,
                             void *ctx) {
    ZT_TRY(known_job(jm, id));
    if (limit <= 0 || limit > 10000)
        limit = 10000;
    return zt_event_store_deliveries(jm->events, id, limit, emit, ctx);
}
