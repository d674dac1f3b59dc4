/* What the job manager's files share: job_manager.c (the table, submitting, queries, cancel,
 * start and stop), job_runner.c (the queue, starting jobs, and turning what the supervisor
 * reports into records, logs and final states), job_metrics.c (history queries) and
 * job_watch.c (watchers). Not an API: nothing outside these files includes it.
 *
 * One mutex, zt_jobs.mu, guards the table and every job in it. Every function declared here is
 * called with it held and never takes it, but for job_metrics.c's (which say so). A job's
 * spec, name, idempotency key and paths never change once it is in the table, and jobs leave
 * the table only with the manager: they may be read without the lock through a job pointer
 * found under it. zt_jm_prepare_fork (job_fork.c) is the other exception: it takes the lock. */
#ifndef ZTRAIN_JOB_MANAGER_INTERNAL_H
#define ZTRAIN_JOB_MANAGER_INTERNAL_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "event_store.h"
#include "job_history.h"
#include "job_manager.h"
#include "job_store.h"
#include "gpu_pool.h"
#include "ranks/supervisor.h"
#include "ztrain/job_spec.h"

#define LOG_RING 2000            /* log lines per job in memory */
#define LOG_KEEP 10000           /* log lines per job in the store: the most a tail serves */
#define LOAD_RECORDS 64          /* a job's newest records read back at start */

typedef struct job {
    struct zt_jobs *jm;
    zt_job_info info;
    long long number;
    zt_job_history *history;
    zt_job_watch *watches;       /* job_watch.c's */
    /* While ranks run. */
    zt_rank_group *group;
    bool cancel_requested, force;
    bool shutdown;               /* cancelled because ztraind is stopping */
    double grace_s;
    int failed_rank;             /* first rank that failed, -1 */
    char *fail_reason;
    char **last_stderr;          /* per rank, for the failure reason */
    char **hosts;                /* per rank: the Slurm node it runs on, once it said so */
    /* Slurm: the scheduler stopped the job itself (scancel from outside, time limit, node
     * failure) or srun failed; launch_failed tells FAILED from CANCELLED. */
    char *launch_reason;
    bool launch_failed;
    /* The checkpoint directory's `latest` as the ranks found it when they started (device,
     * inode and modification time; zero when there was none): the ranks wrote a checkpoint
     * when it changed (job_runner.c). */
    struct stat latest_at_start;
    /* After a daemon restart (job_recovery.c): the ranks of the previous daemon's attempt,
     * which must be gone before the job starts again, and since when they are waited for. */
    pid_t *orphans;
    int n_orphans;
    double orphans_since;
    /* Back-off between restarts (job_recovery.c): the job starts again no sooner than
     * restart_at (CLOCK_MONOTONIC seconds; 0: no wait), and restart_why says why it waits. */
    double restart_at;
    char *restart_why;
    struct zt_job_anomalies *anomalies; /* job_events.c's: its events and stall watch */
} job;

struct zt_jobs {
    zt_jobs_config cfg;
    pthread_mutex_t mu;
    job **jobs;                  /* oldest first; numbers increase */
    int n_jobs, cap_jobs;
    long long last_number;
    int ranks_in_use;
    zt_gpu_pool gpus;            /* held by running "device": "cuda" jobs */
    zt_job_store *store;
    zt_supervisor *sup;
    bool stopping;               /* zt_jobs_destroy began: queued jobs no longer start */
    char tag[16];                /* names this daemon's Slurm jobs (zt_jobs_config.slurm) */
    bool store_failing;          /* the last write to the store failed (zt_jm_store_result) */
    long store_failures_unsaid;  /* failures since the one reported */
    zt_event_store *events;      /* anomaly events and webhook deliveries (job_events.c) */
    struct zt_webhooks *hooks;   /* the webhook delivery thread */
};

static inline int64_t zt_jm_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A copy of s, "" for NULL; running out of memory for one is an assertion. */
static inline char *zt_jm_strdup(const char *s) {
    char *d = strdup(s ? s : "");
    ZT_ASSERT(d);
    return d;
}

/* Replaces a malloc'd string field with a copy of value. */
static inline void zt_jm_set_str(char **field, const char *value) {
    free(*field);
    *field = zt_jm_strdup(value);
}

/* job_manager.c: the table, and a job's state and what is known about it. */

/* The job with this id, or NULL. */
job *zt_jm_find_job(zt_jobs *jm, const char *id);
/* ZT_ERR_NOT_FOUND, naming the id. */
zt_status zt_jm_not_found(const char *id);

/* Sets the job's reason (why it failed or was cancelled, or what it waits for). It is only
 * stored and told with the next zt_jm_set_state, or the caller's own persist and notify. */
void zt_jm_set_reason(job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* What every write to the store ends with. A store failure must not take the daemon down: the
 * job goes on with its history in memory, and the failure goes to ztraind's stderr: the first one of a run of failures, and how many
 * followed once a write succeeds again (a full disk would fail every log line). */
void zt_jm_store_result(zt_jobs *jm, zt_status s);
/* The last `tail` log lines of j (at most LOG_KEEP; tail < 0: LOG_KEEP), oldest first: the
 * ring's, after older ones read from the store when the ring holds fewer than asked for. */
void zt_jm_logs(zt_jobs *jm, job *j, int tail, zt_log_fn emit, void *ctx);
/* Writes the job through to the store (zt_jm_store_result). */
void zt_jm_persist(zt_jobs *jm, const job *j);
/* Every state change goes through here: stored, then told. Terminal states never change. */
void zt_jm_set_state(zt_jobs *jm, job *j, zt_job_state s);
/* A line of ztraind's own about the job, for its log ("started 2 ranks: pids 10, 11"). */
void zt_jm_daemon_log(zt_jobs *jm, job *j, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Adds a record to the history and takes step, loss and tokens/s from it for the job's info.
 * *out describes the stored record. */
void zt_jm_add_record(job *j, const cJSON *obj, const char *text, int64_t time_ms,
                      zt_metric_record *out);
/* The job's Slurm name: unique per daemon (its tag) and job, so scancel --name finds it. */
void zt_jm_slurm_job_name(const zt_jobs *jm, const job *j, char *buf, size_t size);

/* job_runner.c: the queue and the supervisor's reports. */

/* Goes through the queue in submission order, starting the jobs that fit when `start` (spawning
 * is the supervisor thread's), and says in each waiting job's reason what it waits for. */
void zt_jm_schedule(zt_jobs *jm, bool start);
/* What the supervisor thread calls: ctx is the zt_jobs, group_ctx the job. These take the lock
 * themselves. */
extern const zt_supervisor_callbacks zt_jm_supervisor_callbacks;

/* job_recovery.c: attempts and automatic restarts. */

/* dst->attempts becomes a deep copy of src's (dst's own are not freed: it is a fresh copy); the
 * running attempt's step is the job's. zt_jm_free_attempts releases them. */
void zt_jm_copy_attempts(zt_job_info *dst, const zt_job_info *src);
void zt_jm_free_attempts(zt_job_info *j);
/* Appends a stored attempt (a restarted daemon's loader). */
void zt_jm_add_attempt(job *j, const zt_job_attempt *a);
/* The job file of the job's next attempt (heap): its spec as resolved, with train.resume set
 * after the first attempt, so that a restart goes on from the newest complete checkpoint. */
char *zt_jm_attempt_spec(const job *j);
/* The ranks of a new attempt started: a new attempt, with the checkpoint step the ranks resume
 * from, is added and stored. */
void zt_jm_attempt_started(zt_jobs *jm, job *j);
/* Ends the running attempt, if any: failed or not, with the job's reason and its first failed
 * rank's exit; stored. zt_jm_set_state calls it for every terminal state. */
void zt_jm_attempt_ended(zt_jobs *jm, job *j, bool failed);
/* The job's ranks failed, and j->info.reason says why. When a restart is left (max_restarts),
 * ends the attempt as failed, puts the job back in the queue (QUEUED, a reason saying which
 * restart it is) and returns true; else adds to the reason that the restarts are used up and
 * returns false: the caller sets FAILED. */
bool zt_jm_restart(zt_jobs *jm, job *j);
/* A job that ran under the previous daemon, with the reason saying so: as zt_jm_restart, and
 * the job then waits for its old ranks (zt_jm_orphans_gone) before it starts again. */
bool zt_jm_restart_orphan(zt_jobs *jm, job *j);
/* Whether a restarted job's back-off is over; if not, why gets the reason that says so (the
 * one zt_jm_restart set, which names the wait, so the reason does not change while it runs). */
bool zt_jm_backoff_over(const zt_jobs *jm, const job *j, char *why, size_t size);
/* Whether the previous daemon's ranks of the job are gone (they get SIGTERM when it dies and
 * stop with a checkpoint); those still there after the default grace period are killed. */
bool zt_jm_orphans_gone(zt_jobs *jm, job *j);

/* job_fork.c: forks (fork_from). */

/* A spec with fork_from, checked and resolved (spec_check.h): refuses, naming the key, a parent
 * job that does not exist, a step without a complete checkpoint, a checkpoint whose model is not
 * the spec's, and a checkpoint directory that already holds checkpoints; else, with place, puts
 * the parent's checkpoint into spec's checkpoint directory as its latest (without, it only
 * checks). Takes the manager's lock itself, for the parent's directory only: call it without
 * the lock. */
zt_status zt_jm_prepare_fork(zt_jobs *jm, const zt_job_spec *spec, bool place);
/* A fork's resolved spec (*text, heap, replaced) gets train.resume true, so that its ranks start
 * from the checkpoint zt_jm_prepare_fork put in place; any other spec is left as it is. */
zt_status zt_jm_fork_resume(char **text);

/* job_metrics.c: reading a job's history. */

/* What walks a history: false stops the walk. */
typedef bool (*zt_jm_walk_fn)(void *ctx, const zt_metric_record *r);
/* Reads the job's stored records with step >= since and *after < seq < before, in the order
 * they came (seq), a page at a time, through fn; *after follows each record delivered, so that
 * a later call goes on after it. *stopped (may be NULL) says whether fn stopped the walk. Needs
 * no lock, and may be called with the manager's lock held (the store's reader lock comes after
 * it). */
zt_status zt_jm_read_stored(zt_jobs *jm, const char *id, int64_t since, int64_t *after,
                            int64_t before, zt_jm_walk_fn fn, void *ctx, bool *stopped);

/* job_watch.c: events to watchers. */

/* Hands ev to every watch of the job that asked for its kind. The watchers' callbacks run here,
 * with the lock held, as zt_jobs_watch promises. */
void zt_jm_notify(job *j, const zt_job_event *ev);
/* A STATE event with the job as it is now. */
void zt_jm_notify_state(job *j);
/* Frees the job's watches, when the job itself goes (zt_jobs_destroy). */
void zt_jm_free_watches(job *j);

#endif
