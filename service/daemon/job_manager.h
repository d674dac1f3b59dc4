/* The job manager: ztraind's table of jobs, their state machine, the queue, and the one place
 * every front end (gRPC, HTTP) goes through.
 *
 *   QUEUED -> STARTING -> RUNNING -> STOPPING -> SUCCEEDED | FAILED | CANCELLED
 *
 * A terminal state never changes. A job whose spec has max_restarts goes back from STARTING or
 * RUNNING to QUEUED when its ranks fail and restarts are left, and its next attempt resumes
 * from the newest complete checkpoint (job_recovery.c; zt_job_attempt). Jobs wait in QUEUED
 * while starting them would put more than max_ranks ranks to work at once. Each job's ranks
 * are one process group spawned by the supervisor (supervisor.h), or one srun on a Slurm
 * cluster (which queues jobs itself: a job it holds back stays STARTING, and its reason says
 * so); rank 0 reports metric records and every rank's stdout/stderr becomes the job's log.
 * Everything is written through to the job store (SQLite), so a restarted daemon has every job
 * and its history; jobs whose ranks died with the previous daemon are marked FAILED with that
 * reason (they are not re-adopted), or queued to restart when they have restarts left.
 *
 * Memory is bounded whatever the jobs' histories: a running job keeps its newest metric
 * records in memory (ZT_JOBS_RECORD_CACHE), a job that has ended only the last values of its
 * keys, and everything older is read from the store when asked for.
 *
 * Thread safety: every function may be called from any thread. One mutex guards the table;
 * watcher callbacks run with it held (see zt_jobs_watch). Nothing that walks a job's history
 * holds it for more than a copy of the newest records: a query cannot stall the supervisor. */
#ifndef ZTRAIN_JOB_MANAGER_H
#define ZTRAIN_JOB_MANAGER_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "rank_figures.h"
#include "event_store.h"
#include "ranks/slurm_launch.h"
#include "ztrain/status.h"
#include "ztrain/tp.h"

/* The same numbers as ztrain.v1.JobState. */
typedef enum {
    ZT_JOB_QUEUED = 1,
    ZT_JOB_STARTING = 2,
    ZT_JOB_RUNNING = 3,
    ZT_JOB_STOPPING = 4,
    ZT_JOB_SUCCEEDED = 5,
    ZT_JOB_FAILED = 6,
    ZT_JOB_CANCELLED = 7,
} zt_job_state;

/* "QUEUED", "RUNNING", ...; "UNKNOWN" for anything else. */
const char *zt_job_state_name(zt_job_state s);
/* The state named by s (case-insensitive, with or without the "JOB_STATE_" prefix), or 0. */
zt_job_state zt_job_state_parse(const char *s);
bool zt_job_state_terminal(zt_job_state s);

/* Status codes of the front ends, beyond zt_status: a job that does not exist, and a limit
 * (number of jobs, spec size) that was reached. Both come with zt_last_error(). */
#define ZT_ERR_NOT_FOUND (-100)
#define ZT_ERR_LIMIT (-101)
/* An idempotency key already names a job whose spec is not the one submitted. */
#define ZT_ERR_CONFLICT (-102)
/* The server cannot do it now, and may later: its state file cannot be written (a full disk). */
#define ZT_ERR_UNAVAILABLE (-104)
/* The caller's token may not do it to a job another token submitted (PERMISSION_DENIED). */
#define ZT_ERR_PERMISSION (-105)

/* The longest idempotency key, in bytes; a key is printable UTF-8 (engine/include/ztrain/text.h). */
#define ZT_IDEMPOTENCY_KEY_MAX 256

typedef struct {
    int rank;
    int pid;           /* 0 before the rank was started */
    bool running;
    int exit_code;     /* valid when !running && signal == 0 && pid != 0 */
    int signal;        /* the signal that ended the rank, 0 if it exited */
    bool exit_unknown; /* the daemon that ran it died: how it ended is not known */
    zt_rank_figures figures;  /* its step breakdown, CPU, memory, GPU from the newest record */
} zt_rank_info;

/* One start of a job's ranks (job_recovery.h has the rules): the first, and one per restart. */
typedef struct {
    int attempt;              /* 1, 2, ... */
    int64_t started_ms, ended_ms;   /* Unix ms; ended_ms 0 while the ranks run */
    int64_t step;             /* the last train/global_step reported (so far) */
    int64_t resumed_from_step;   /* the checkpoint step it started from; 0: the start */
    int rank;                 /* the first rank that failed, -1 when none did */
    int exit_code, signal;    /* that rank's end */
    bool failed;              /* a restart followed, or the job FAILED */
    char *reason;             /* why it ended; "" while running or when it succeeded */
} zt_job_attempt;
/* Takes each rank's figures out of a metric record into ranks[r].figures, for every r < world
 * that it carries (rank_figures.c); a record with none leaves them as they were. */
void zt_rank_figures_take(zt_rank_info *ranks, int world, const cJSON *record);

/* Who submitted a job: the identity of the token (auth.h's zt_auth_who: "sha256:" and 16 hex
 * digits, never the token) and its scope's name ("submit", "admin"); both "" when the daemon
 * takes no tokens, or the job was submitted before jobs recorded it. */
typedef struct {
    char identity[24];
    char scope[8];
} zt_submitter;

/* A copy of one job, owned by the caller: release it with zt_job_info_free. */
typedef struct {
    char id[32];              /* "job-000042" */
    char *name;
    zt_job_state state;
    char *reason;             /* failure/cancel reason, or what a queued job waits for; "" if none */
    char *spec_json;          /* the job spec as resolved: absolute paths, "deepspeed" inline */
    char *idempotency_key;    /* "" if none */
    int world_size;
    char device[8];           /* "cpu" or "cuda" */
    char comm[8];             /* the ranks' transport, "shm" or "gloo" (zt_comm_for_nodes) */
    zt_grid grid;             /* its sizes dp × pp × tp, from the spec (zt_grid_of_spec_json) */
    int64_t created_ms, started_ms, finished_ms;   /* Unix ms; 0 when not yet */
    int64_t step;             /* last train/global_step */
    int64_t max_steps;        /* 0 when the job runs by epochs */
    double loss;              /* last train/loss; NaN before the first record */
    double tokens_per_second; /* last perf/tokens_per_second; NaN when none */
    int64_t n_records;        /* metric records received so far */
    zt_rank_info *ranks;      /* world_size entries */
    char *run_dir;            /* <runs root>/<id>: job.json, metrics.jsonl */
    char *checkpoint_dir;
    int max_restarts;         /* the spec's max_restarts */
    zt_job_attempt *attempts; /* n_attempts starts of the ranks, oldest first */
    int n_attempts;
    zt_submitter submitter;
} zt_job_info;

void zt_job_info_free(zt_job_info *j);

/* One metric record as rank 0 wrote it: `json` is the object's text
 * ({"train/loss": 2.5, "train/global_step": 10, ...}), `step` its train/global_step, `seq` its
 * number within the job (1, 2, ... in the order they came). */
typedef struct {
    int64_t seq;
    int64_t step;
    int64_t time_ms;
    const char *json;
} zt_metric_record;

typedef struct {
    int64_t seq;              /* per job, from 1 */
    int64_t time_ms;
    int rank;                 /* -1: a line of ztraind's own about the job */
    const char *stream;       /* "stdout", "stderr" or "ztraind" */
    const char *text;         /* without the newline */
} zt_log_line;

typedef struct {
    char *data_root;          /* data, init_from: relative to it, or absolute inside it */
    char *runs_root;          /* run directories and checkpoints */
    char *db_path;            /* the SQLite file */
    char *worker_path;        /* ztrain-worker */
    size_t max_spec_bytes;    /* largest job spec accepted (0: 1 MiB) */
    int max_ranks;            /* ranks running at once, >= 1 */
    int max_world_size;       /* largest world_size a job may ask for */
    int max_jobs;             /* jobs queued or running at once; beyond it SubmitJob says no */
    int threads_per_rank;     /* OMP_NUM_THREADS for ranks; 0: max(1, cores / world_size) */
    double default_grace_s;   /* graceful cancel: seconds before SIGKILL */
    double restart_backoff_s; /* wait before a job's first restart, doubling (0: 1 s) */
    /* Admission (ztrain/admission.h): SubmitJob refuses a job whose estimated memory is above
     * one of these; a 0 is no limit. */
    uint64_t max_rank_bytes;  /* one rank (--max-rank-memory) */
    uint64_t max_job_bytes;   /* all of a job's ranks (--max-job-memory) */
    uint64_t host_bytes;      /* the host the ranks share (its MemTotal; 0 with Slurm) */
    const char *host_name;    /* how messages call host_bytes; must outlive the manager */
    /* "cuda" jobs: one rank's device memory (--max-device-memory), and the total memory of the
     * smallest GPU the local launcher hands out (0 with Slurm or no GPU), named by gpu_name,
     * which must outlive the manager. */
    uint64_t max_device_bytes;
    uint64_t gpu_bytes;
    const char *gpu_name;
    /* NULL: the ranks run on this host. Else each job is one srun on this Slurm cluster (it must
     * stay valid until zt_jobs_destroy): its job name is ztrain-<daemon tag>-<job id>, the
     * daemon tag a hash of the host and the state file, so that a restarted daemon finds the
     * Slurm jobs of the previous one and cancels them. */
    const zt_slurm_config *slurm;
    /* GPUs the daemon hands out to "device": "cuda" jobs (--gpus; service/daemon/gpu_pool.h), named
     * as gpu_visible lists them (the daemon's CUDA_VISIBLE_DEVICES; NULL: 0 .. gpus-1). With 0
     * such jobs are refused at SubmitJob. Under Slurm the scheduler binds GPUs instead. */
    int gpus;
    const char *gpu_visible;
    /* The daemon's own webhook (--webhook): every job's end, failure and events go to it too,
     * signed with webhook_secret (NULL: unsigned); webhook_on is ZT_HOOK_* bits (webhooks.h).
     * Both strings must outlive the manager. The retry schedule is webhook_attempts attempts,
     * the first retry after webhook_backoff_ms, doubling (0: the defaults, 5 and 500). */
    const char *webhook_url;
    const char *webhook_secret;
    unsigned webhook_on;
    int webhook_attempts;
    int webhook_backoff_ms;
    /* What jobs' own webhooks may do (webhook_policy.h); NULL: jobs may have none. */
    const struct zt_webhook_policy_s *webhook_policy;
} zt_jobs_config;

typedef struct zt_jobs zt_jobs;

/* Opens (or creates) the store, loads every job, marks the ones that were running when the
 * previous daemon died as FAILED ("ztraind restarted while the job was running"; those with
 * restarts left go back to QUEUED instead), and starts the supervisor thread. Queued jobs
 * start when capacity allows. */
zt_status zt_jobs_create(zt_jobs **out, const zt_jobs_config *cfg);
/* Stops: every live job is cancelled gracefully (grace: cfg->default_grace_s), then killed; one
 * cancelled earlier keeps its grace period only while it ends within that same default grace. The
 * store is closed. Watchers get their final event first. */
void zt_jobs_destroy(zt_jobs *jm);

/* Validates and queues a job given as job-spec JSON text (the file format of DESIGN.md §3, with
 * "deepspeed" an object). Paths resolve against the roots and must stay inside them. On success
 * *info is the new job, or, for an idempotency_key (NULL or "": none) that names a job already,
 * that job, when the spec is the same: the same keys and values once resolved, in any order.
 * ZT_ERR_INVALID: the message names the field ("model.n_embd ...", "name: the control character
 * U+001B at byte 3 ...", DeepSpeed's own texts); ZT_ERR_CONFLICT: the key names a job with
 * another spec (the message names the key and that job); ZT_ERR_LIMIT: max_jobs jobs are
 * queued or running, which holds under concurrent submits; ZT_ERR_UNAVAILABLE: the job could not
 * be written to the state file, so it was not queued and took no id. */
zt_status zt_jobs_submit(zt_jobs *jm, const char *spec_json, const char *idempotency_key,
                         zt_job_info *info);
/* zt_jobs_submit, the job recording who submitted it (by may be NULL: nobody known). Keys are
 * each submitter's own: a key answers only a job of the same submitter (the same token, or
 * none), so another token can neither take over a retry nor block a key. */
zt_status zt_jobs_submit_by(zt_jobs *jm, const char *spec_json, const char *idempotency_key,
                            const zt_submitter *by, zt_job_info *info);

/* ZT_ERR_NOT_FOUND for an unknown id. */
zt_status zt_jobs_get(zt_jobs *jm, const char *id, zt_job_info *info);

/* How many metric records the job has: they are only ever appended, so a front end can cache an
 * answer computed from the history until this changes. ZT_ERR_NOT_FOUND for an unknown id. */
zt_status zt_jobs_record_count(zt_jobs *jm, const char *id, int64_t *n);

/* Jobs newest first, only those in `state` unless it is 0, starting after the job
 * `after_id` ("" or NULL: from the newest). *jobs is a malloc'd array of *n infos (free each
 * with zt_job_info_free, then the array); *more says whether jobs remain after the last one.
 * What never changes in a job (its spec, name, paths) is copied after the lock is released. */
zt_status zt_jobs_list(zt_jobs *jm, zt_job_state state, const char *after_id, int limit,
                       zt_job_info **jobs, int *n, bool *more);

/* The longest grace period a cancel may ask for, in seconds: a day, as ztraind's own --grace
 * (which is below it). The front ends refuse a longer one naming grace_seconds. */
#define ZT_JOBS_MAX_GRACE_S 86400.0

/* Graceful: SIGTERM to the ranks (they finish the step, checkpoint, exit 130), state STOPPING,
 * SIGKILL after grace_s (<= 0: the default; at most ZT_JOBS_MAX_GRACE_S); force: SIGKILL now. A queued job is cancelled at
 * once. A terminal job is left as it is. *info (may be NULL) gets the job after the request. */
zt_status zt_jobs_cancel(zt_jobs *jm, const char *id, bool force, double grace_s,
                         zt_job_info *info);

/* Metric records a running job keeps in memory; older ones are read from the store. */
#define ZT_JOBS_RECORD_CACHE 256

/* The limits of one history query, the same for every front end (GetMetrics, the HTTP series
 * and records routes): what a query may ask for and what one answer may hold. */
#define ZT_METRICS_MAX_KEYS 64                /* distinct keys of one series query */
#define ZT_METRICS_MAX_KEY_BYTES 256          /* the longest key */
#define ZT_METRICS_MAX_POINTS 10000           /* points of one series: what max_points 0 means */
#define ZT_METRICS_MAX_ANSWER_POINTS 200000   /* points of all the series of one answer */
#define ZT_RECORDS_MAX_PAGE 10000             /* records of one zt_jobs_metric_records answer */
/* A key that asks for each record's own time (time_unix_ms, Unix ms) as a series. */
#define ZT_METRICS_TIME_KEY "time_unix_ms"

/* The history of metric `keys` from the records with step >= since_step. Repeated keys count
 * once and empty ones not at all (only empty ones ask for every key, as none do); more than
 * ZT_METRICS_MAX_KEYS distinct keys, or one longer than ZT_METRICS_MAX_KEY_BYTES, is
 * ZT_ERR_INVALID naming the limit. With n_keys == 0, every key of
 * those records (more than ZT_METRICS_MAX_KEYS of them is ZT_ERR_INVALID too). Each series is
 * thinned to at most P evenly spaced points, the first and the last kept: P is max_points
 * capped at ZT_METRICS_MAX_POINTS (0: the cap) and at ZT_METRICS_MAX_ANSWER_POINTS divided by
 * the number of series. Calls emit(ctx, key, steps, values, n) once per key: in the order
 * asked (an empty series for a key no record has), or without keys in first-seen order. A
 * record that lacks a key (or has null) contributes no point to it. The key
 * ZT_METRICS_TIME_KEY, asked for by name, is each record's time_ms.
 * The manager's lock is held only to copy the job's newest records; older ones are read from
 * the store, and emit runs on the caller's thread with no lock held. */
typedef void (*zt_series_fn)(void *ctx, const char *key, const int64_t *steps,
                             const double *values, int n);
zt_status zt_jobs_metric_series(zt_jobs *jm, const char *id, const char *const *keys, int n_keys,
                                int64_t since_step, int max_points, zt_series_fn emit, void *ctx);

/* Calls emit for the records with step >= since_step and seq > after_seq, in the order they
 * came (by seq), at most `limit` of them (<= 0, or above ZT_RECORDS_MAX_PAGE: that many), with
 * no lock held (as zt_jobs_metric_series). When records remain, *next_after_seq is the seq of
 * the page's last one, so that asking again from it (with the same since_step) continues the
 * history with nothing lost or repeated, even inside a step that has several records (an eval
 * step, a step run again after a restart); -1 when the page is the end of the history. */
typedef void (*zt_record_fn)(void *ctx, const zt_metric_record *r);
zt_status zt_jobs_metric_records(zt_jobs *jm, const char *id, int64_t since_step,
                                 int64_t after_seq, int limit, zt_record_fn emit, void *ctx,
                                 int64_t *next_after_seq);

/* The lines a request for a job's log gets when it names no number (StreamLogs without tail, GET
 * .../logs and .../events without ?tail=); 0 is a number, and gets none. */
#define ZT_LOG_TAIL_DEFAULT 100

/* The last `tail` log lines of the job (all ranks, in arrival order), through emit: up to the
 * 10,000 the store keeps (a larger or negative tail serves those), the newest 2,000 from memory
 * and older ones read from the store, under the manager's lock. */
typedef void (*zt_log_fn)(void *ctx, const zt_log_line *l);
zt_status zt_jobs_logs(zt_jobs *jm, const char *id, int tail, zt_log_fn emit, void *ctx);

/* Watching a job. The callback runs with the manager's lock held, on the thread that produced
 * the event (the supervisor, or the caller of submit/cancel): it must be quick, must not block
 * and must not call back into zt_jobs. Only the replay of records older than the job's newest
 * ones runs without the lock, on the caller of zt_jobs_watch, before any live event. The `job`
 * of a STATE event, the record and the line are valid only during the call. */
typedef enum { ZT_EVENT_STATE, ZT_EVENT_METRICS, ZT_EVENT_LOG, ZT_EVENT_ANOMALY } zt_job_event_kind;
typedef struct {
    zt_job_event_kind kind;
    const zt_job_info *job;          /* ZT_EVENT_STATE */
    const zt_metric_record *record;  /* ZT_EVENT_METRICS */
    const zt_log_line *log;          /* ZT_EVENT_LOG */
    const zt_anomaly *anomaly;       /* ZT_EVENT_ANOMALY: goes with ZT_WATCH_METRICS */
    /* The event is a stored record replayed without the manager's lock, on the caller of
     * zt_jobs_watch: the callback may wait here (for its reader to make room), which pages the
     * replay of a long history as the client reads instead of holding it all. */
    bool may_block;
} zt_job_event;
typedef void (*zt_job_event_fn)(void *ctx, const zt_job_event *ev);

enum {
    ZT_WATCH_STATE = 1,    /* state changes; the first event is always the current state */
    ZT_WATCH_METRICS = 2,  /* records with step >= from_step and seq > after_seq, and anomaly
                            * events with seq > after_anomaly_seq: history first, then live */
    ZT_WATCH_LOGS = 4,     /* the last log_tail lines with seq > after.log_seq, then live */
};

/* Where a watch that was cut goes on: the seq of the last record (zt_metric_record.seq), anomaly
 * event (zt_anomaly.seq) and log line (zt_log_line.seq) the watcher had; 0: none. */
typedef struct {
    int64_t seq, anomaly_seq, log_seq;
} zt_watch_cursor;

typedef struct zt_job_watch zt_job_watch;

/* Replays and then delivers live events until zt_jobs_unwatch: first the current state, always,
 * then the records and log lines asked for, then live events; nothing is lost or repeated. For
 * a job that has ended, the terminal state comes both first and last, after the history, so
 * that the stream still ends with it. Records older than the job's newest ones are read from
 * the store without the manager's lock, the newest ones and the log lines under it; a state
 * change meanwhile comes as a STATE event before the newest records (or, when the job ended
 * meanwhile, last). A caller ends its stream once zt_jobs_watch has returned and a terminal
 * STATE event has come; after the last STATE event no more events come. When only
 * ZT_WATCH_LOGS is asked for, the terminal state is still delivered as a STATE event, so the
 * caller knows when to end. `after` resumes a watch that was cut: the records, anomaly events
 * and log lines numbered up to its seqs are not sent again (a replayed log line is one of the
 * last log_tail lines, -1 meaning every line the job keeps, and newer than after.log_seq).
 * ZT_ERR_NOT_FOUND for an unknown id. */
zt_status zt_jobs_watch(zt_jobs *jm, const char *id, int what, int64_t from_step,
                        zt_watch_cursor after, int log_tail, zt_job_event_fn fn, void *ctx,
                        zt_job_watch **out);
/* After it returns, fn is never called again for this watch. */
void zt_jobs_unwatch(zt_jobs *jm, zt_job_watch *w);

/* The job's anomaly events (event_store.h) with seq > after_seq, oldest first, at most limit
 * (<= 0 or above 10,000: 10,000), read from the store on the caller's thread without the
 * manager's lock, and into *total how many events the job has had (the newest seq: the store
 * keeps only the newest ZT_EVENT_STORE_ANOMALIES_PER_JOB); and its webhook delivery attempts,
 * the newest `limit` of them. Both ZT_ERR_NOT_FOUND for an unknown id. */
zt_status zt_jobs_anomalies(zt_jobs *jm, const char *id, int64_t after_seq, int limit,
                            int64_t *total, zt_anomaly_fn emit, void *ctx);
zt_status zt_jobs_deliveries(zt_jobs *jm, const char *id, int limit, zt_delivery_fn emit,
                             void *ctx);

/* What a scrape needs of a job: no spec, reason or ranks. */
typedef struct {
    char id[32];
    char *name;
    zt_job_state state;
    int64_t finished_ms;              /* Unix ms; 0 while the job is not over */
    int world_size;
    zt_grid grid;                     /* the sizes dp × pp × tp: ranks are labelled with theirs */
    int64_t step;
    double loss, tokens_per_second;   /* NaN when none */
    double *values;   /* per key asked for: its value at the job's last step; NaN when none */
    bool *reported;   /* per key: whether the last step's records have it (its value NaN there:
                       * the record had null, a value that was not finite) */
    zt_rank_figures *ranks;  /* world_size entries: each rank's figures; NULL without ranks */
} zt_job_summary;

/* Every job, newest first, for /metrics: *out is a malloc'd array of *n summaries (free it with
 * zt_job_summaries_free). Under the lock only numbers are copied: a job's name never changes and
 * is copied after. */
zt_status zt_jobs_summaries(zt_jobs *jm, const char *const *keys, int n_keys,
                            zt_job_summary **out, int *n);
void zt_job_summaries_free(zt_job_summary *s, int n);

/* How many jobs are in each state: count[s] for s in ZT_JOB_QUEUED..ZT_JOB_CANCELLED (count[0]
 * is 0). Cheap: nothing is copied. */
void zt_jobs_count_states(zt_jobs *jm, int count[ZT_JOB_CANCELLED + 1]);

/* The configuration the manager runs with (for /healthz and messages). */
const zt_jobs_config *zt_jobs_get_config(const zt_jobs *jm);

#endif
