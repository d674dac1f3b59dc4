/* Watching a job (zt_jobs_watch in job_manager.h): a new watch gets the job's history replayed,
 * the part of it in the store without the manager's lock and the newest records under it, then
 * every live event of the kinds it asked for, until the terminal state. The events come from
 * job_manager.c and job_runner.c through zt_jm_notify. */
#include <stdbool.h>
#include <stdlib.h>

#include "job_events.h"
#include "job_manager_internal.h"

struct zt_job_watch {
    struct job *job;
    int what;
    int64_t from_step;
    zt_watch_cursor after;       /* records, anomaly events and log lines numbered up to
                                  * these are not delivered */
    zt_job_event_fn fn;
    void *ctx;
    bool done;                   /* the terminal state was delivered */
    bool unlocked;               /* replaying from the store without the manager's lock */
    zt_job_watch *next;
};

void zt_jm_notify(job *j, const zt_job_event *ev) {
    int bit = ev->kind == ZT_EVENT_METRICS || ev->kind == ZT_EVENT_ANOMALY ? ZT_WATCH_METRICS
              : ev->kind == ZT_EVENT_LOG                                   ? ZT_WATCH_LOGS
                                                                           : -1;
    for (zt_job_watch *w = j->watches; w; w = w->next) {
        if (w->done || (bit != -1 && !(w->what & bit)))
            continue;
        if (ev->kind == ZT_EVENT_METRICS &&
            (ev->record->step < w->from_step || ev->record->seq <= w->after.seq))
            continue;
        if (ev->kind == ZT_EVENT_ANOMALY && ev->anomaly->seq <= w->after.anomaly_seq)
            continue;
        if (ev->kind == ZT_EVENT_LOG && ev->log->seq <= w->after.log_seq)
            continue;
        w->fn(w->ctx, ev);
        if (ev->kind == ZT_EVENT_STATE && zt_job_state_terminal(ev->job->state))
            w->done = true;
    }
}

void zt_jm_notify_state(job *j) {
    zt_job_event ev = {.kind = ZT_EVENT_STATE, .job = &j->info};
    zt_jm_notify(j, &ev);
}

void zt_jm_free_watches(job *j) {
    for (zt_job_watch *w = j->watches, *next; w; w = next) {
        next = w->next;
        free(w);
    }
    j->watches = NULL;
}

/* History replayed to a new watch, as the events live ones would have been. */
static void replay_record(void *ctx, const zt_metric_record *r) {
    zt_job_watch *w = ctx;
    zt_job_event ev = {.kind = ZT_EVENT_METRICS, .record = r, .may_block = w->unlocked};
    w->fn(w->ctx, &ev);
}

static bool replay_stored(void *ctx, const zt_metric_record *r) {
    replay_record(ctx, r);
    return true;
}

/* Rounds of reading the store without the lock before the rest is read with it held: each round
 * reads what the job reported during the one before, so this is reached only by a job that
 * reports faster than the store is read. */
#define UNLOCKED_ROUNDS 8

/* Replays the job's records that are only in the store (numbered below the ring's first), from
 * from_step. Called and returns with the lock held; releases it while it reads, so that the
 * supervisor goes on. When it returns, the ring holds every record not yet replayed (*after is
 * the last number replayed or skipped). */
static zt_status replay_store(zt_jobs *jm, job *j, zt_job_watch *w, int64_t *after) {
    int64_t before = zt_history_first_cached(j->history);
    for (int round = 0; *after < before - 1; round++) {
        bool unlocked = round < UNLOCKED_ROUNDS;
        if (unlocked)
            pthread_mutex_unlock(&jm->mu);
        w->unlocked = unlocked;
        zt_status s = zt_jm_read_stored(jm, j->info.id, w->from_step, after, before,
                                        replay_stored, w, NULL);
        w->unlocked = false;
        if (unlocked)
            pthread_mutex_lock(&jm->mu);
        ZT_TRY(s);
        /* Numbers below `before` that the store does not have were never written (a failed
         * write): there is nothing more of them to replay. */
        if (*after < before - 1)
            *after = before - 1;
        before = zt_history_first_cached(j->history);
    }
    return ZT_OK;
}

static void replay_log(void *ctx, const zt_log_line *l) {
    zt_job_watch *w = ctx;
    if (l->seq <= w->after.log_seq)
        return;
    zt_job_event ev = {.kind = ZT_EVENT_LOG, .log = l};
    w->fn(w->ctx, &ev);
}

zt_status zt_jobs_watch(zt_jobs *jm, const char *id, int what, int64_t from_step,
                        zt_watch_cursor after, int log_tail, zt_job_event_fn fn, void *ctx,
                        zt_job_watch **out) {
    zt_job_watch *w = calloc(1, sizeof *w);
    if (!w)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    if (after.seq < 0)
        after.seq = 0;
    if (after.anomaly_seq < 0)
        after.anomaly_seq = 0;
    if (after.log_seq < 0)
        after.log_seq = 0;
    *w = (zt_job_watch){.what = what, .from_step = from_step, .after = after, .fn = fn,
                        .ctx = ctx};
    pthread_mutex_lock(&jm->mu);
    job *j = zt_jm_find_job(jm, id);
    if (!j) {
        pthread_mutex_unlock(&jm->mu);
        free(w);
        return zt_jm_not_found(id);
    }
    w->job = j;
    /* The current state first, always, an ended job's too (the proto's promise): a client
     * learns what it is watching before the history. An ended job's state comes again last,
     * since a stream ends after the event that carries a terminal state. */
    zt_job_event ev = {.kind = ZT_EVENT_STATE, .job = &j->info};
    zt_job_state told = j->info.state;
    fn(ctx, &ev);
    int64_t replayed = after.seq;
    zt_status s = (what & ZT_WATCH_METRICS) ? replay_store(jm, j, w, &replayed) : ZT_OK;
    if (s != ZT_OK) {
        pthread_mutex_unlock(&jm->mu);
        free(w);
        return s;
    }
    /* The state may have changed while the store was read: the watcher hears of it now (a
     * terminal state reached meanwhile after the rest of the history). */
    bool ended = zt_job_state_terminal(j->info.state);
    if (!ended && j->info.state != told)
        fn(ctx, &ev);
    if (what & ZT_WATCH_METRICS) {
        zt_history_cached_records(j->history, from_step, replayed, replay_record, w);
        zt_jm_replay_anomalies(j, after.anomaly_seq, fn, ctx);
    }
    if (what & ZT_WATCH_LOGS) {
        /* A resumed watch needs only the lines after its cursor: when the ring holds all of
         * them, none is read from the store. */
        int64_t first;
        int in_ring = zt_history_log_count(j->history, &first);
        int64_t newer = first + in_ring - 1 - after.log_seq;
        if (after.log_seq > 0 && in_ring > 0 && after.log_seq >= first - 1 &&
            (log_tail < 0 || newer < log_tail))
            log_tail = newer > 0 ? (int)newer : 0;
        zt_jm_logs(jm, j, log_tail, replay_log, w);
    }
    if (ended) {
        fn(ctx, &ev);
        w->done = true;
    }
    w->next = j->watches;
    j->watches = w;
    pthread_mutex_unlock(&jm->mu);
    *out = w;
    return ZT_OK;
}

void zt_jobs_unwatch(zt_jobs *jm, zt_job_watch *w) {
    if (!w)
        return;
    pthread_mutex_lock(&jm->mu);
    for (zt_job_watch **link = &w->job->watches; *link; link = &(*link)->next)
        if (*link == w) {
            *link = w->next;
            break;
        }
    pthread_mutex_unlock(&jm->mu);
    free(w);
}
