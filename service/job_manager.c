/* The job manager (job_manager.h): the job table, the state machine, the queue, metric history
 * and log tails in memory, write-through to the job store, and fan-out to watchers. The
 * supervisor thread drives it: it starts queued jobs in `tick` and reports lines and exits. */
#define _GNU_SOURCE
#include "job_manager.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "job_history.h"
#include "job_store.h"
#include "spec_check.h"
#include "supervisor.h"
#include "ztrain/job_spec.h"
#include "proc_spawn.h"

#define LOG_RING 2000            /* log lines per job in memory */
#define LOG_KEEP 10000           /* log lines per job in the store */
#define STOP_EXIT_STATUS 130

struct zt_job_watch {
    struct job *job;
    int what;
    int64_t from_step;
    zt_job_event_fn fn;
    void *ctx;
    bool done;                   /* the terminal state was delivered */
    zt_job_watch *next;
};

typedef struct job {
    struct zt_jobs *jm;
    zt_job_info info;
    long long number;
    zt_job_history *history;
    zt_job_watch *watches;
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
} job;

struct zt_jobs {
    zt_jobs_config cfg;
    pthread_mutex_t mu;
    job **jobs;                  /* oldest first; numbers increase */
    int n_jobs, cap_jobs;
    long long last_number;
    int ranks_in_use;
    zt_job_store *store;
    zt_supervisor *sup;
    char tag[16];                /* names this daemon's Slurm jobs (zt_jobs_config.slurm) */
};

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                               */

static const char *const state_names[] = {
    [ZT_JOB_QUEUED] = "QUEUED",       [ZT_JOB_STARTING] = "STARTING",
    [ZT_JOB_RUNNING] = "RUNNING",     [ZT_JOB_STOPPING] = "STOPPING",
    [ZT_JOB_SUCCEEDED] = "SUCCEEDED", [ZT_JOB_FAILED] = "FAILED",
    [ZT_JOB_CANCELLED] = "CANCELLED",
};

const char *zt_job_state_name(zt_job_state s) {
    return s >= ZT_JOB_QUEUED && s <= ZT_JOB_CANCELLED ? state_names[s] : "UNKNOWN";
}

zt_job_state zt_job_state_parse(const char *s) {
    if (strncasecmp(s, "JOB_STATE_", 10) == 0)
        s += 10;
    for (int i = ZT_JOB_QUEUED; i <= ZT_JOB_CANCELLED; i++)
        if (strcasecmp(s, state_names[i]) == 0)
            return (zt_job_state)i;
    return 0;
}

bool zt_job_state_terminal(zt_job_state s) {
    return s == ZT_JOB_SUCCEEDED || s == ZT_JOB_FAILED || s == ZT_JOB_CANCELLED;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *xstrdup(const char *s) {
    char *d = strdup(s ? s : "");
    ZT_ASSERT(d);
    return d;
}

static void set_str(char **field, const char *value) {
    free(*field);
    *field = xstrdup(value);
}

static void set_reason(job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_reason(job *j, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    ZT_ASSERT(s);
    free(j->info.reason);
    j->info.reason = s;
}

void zt_job_info_free(zt_job_info *j) {
    free(j->name);
    free(j->reason);
    free(j->spec_json);
    free(j->idempotency_key);
    free(j->ranks);
    free(j->run_dir);
    free(j->checkpoint_dir);
    memset(j, 0, sizeof *j);
}

static void info_copy(zt_job_info *dst, const zt_job_info *src) {
    *dst = *src;
    dst->name = xstrdup(src->name);
    dst->reason = xstrdup(src->reason);
    dst->spec_json = xstrdup(src->spec_json);
    dst->idempotency_key = xstrdup(src->idempotency_key);
    dst->run_dir = xstrdup(src->run_dir);
    dst->checkpoint_dir = xstrdup(src->checkpoint_dir);
    dst->ranks = calloc((size_t)src->world_size, sizeof *dst->ranks);
    ZT_ASSERT(dst->ranks);
    memcpy(dst->ranks, src->ranks, (size_t)src->world_size * sizeof *dst->ranks);
}

static void job_free(job *j) {
    zt_history_destroy(j->history);
    for (zt_job_watch *w = j->watches, *next; w; w = next) {
        next = w->next;
        free(w);
    }
    for (int r = 0; j->last_stderr && r < j->info.world_size; r++)
        free(j->last_stderr[r]);
    free(j->last_stderr);
    for (int r = 0; j->hosts && r < j->info.world_size; r++)
        free(j->hosts[r]);
    free(j->hosts);
    free(j->fail_reason);
    free(j->launch_reason);
    zt_job_info_free(&j->info);
    free(j);
}

static job *job_alloc(const zt_job_info *src) {
    job *j = calloc(1, sizeof *j);
    ZT_ASSERT(j);
    info_copy(&j->info, src);
    j->history = zt_history_create(LOG_RING);
    j->last_stderr = calloc((size_t)src->world_size, sizeof *j->last_stderr);
    j->hosts = calloc((size_t)src->world_size, sizeof *j->hosts);
    ZT_ASSERT(j->last_stderr && j->hosts);
    j->failed_rank = -1;
    j->info.loss = NAN;
    j->info.tokens_per_second = NAN;
    j->info.step = 0;
    j->info.n_records = 0;
    const char *digits = strchr(src->id, '-');
    j->number = digits ? atoll(digits + 1) : 0;
    return j;
}

/* Jobs are numbered in order, so the table is sorted and an id is a binary search away. */
static job *find_job(zt_jobs *jm, const char *id) {
    if (!id || strncmp(id, "job-", 4) != 0)
        return NULL;
    char *end;
    long long n = strtoll(id + 4, &end, 10);
    if (*end || n <= 0)
        return NULL;
    int lo = 0, hi = jm->n_jobs - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (jm->jobs[mid]->number == n)
            return strcmp(jm->jobs[mid]->info.id, id) == 0 ? jm->jobs[mid] : NULL;
        if (jm->jobs[mid]->number < n)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

static zt_status not_found(const char *id) {
    return zt_error(ZT_ERR_NOT_FOUND, "job %s not found", id ? id : "(none)");
}

static void add_job(zt_jobs *jm, job *j) {
    if (jm->n_jobs == jm->cap_jobs) {
        jm->cap_jobs = jm->cap_jobs ? 2 * jm->cap_jobs : 64;
        jm->jobs = realloc(jm->jobs, (size_t)jm->cap_jobs * sizeof *jm->jobs);
        ZT_ASSERT(jm->jobs);
    }
    j->jm = jm;
    jm->jobs[jm->n_jobs++] = j;
    if (j->number > jm->last_number)
        jm->last_number = j->number;
}

/* A store failure must not take the daemon down: the job goes on, the failure is logged. */
static void persist(zt_jobs *jm, const job *j) {
    if (zt_store_put_job(jm->store, &j->info) != ZT_OK)
        fprintf(stderr, "ztraind: %s\n", zt_last_error());
}

/* ------------------------------------------------------------------------------------------ */
/* Events to watchers                                                                          */

static void notify(job *j, const zt_job_event *ev) {
    int bit = ev->kind == ZT_EVENT_METRICS ? ZT_WATCH_METRICS
              : ev->kind == ZT_EVENT_LOG   ? ZT_WATCH_LOGS
                                           : -1;
    for (zt_job_watch *w = j->watches; w; w = w->next) {
        if (w->done || (bit != -1 && !(w->what & bit)))
            continue;
        if (ev->kind == ZT_EVENT_METRICS && ev->record->step < w->from_step)
            continue;
        w->fn(w->ctx, ev);
        if (ev->kind == ZT_EVENT_STATE && zt_job_state_terminal(ev->job->state))
            w->done = true;
    }
}

static void notify_state(job *j) {
    zt_job_event ev = {.kind = ZT_EVENT_STATE, .job = &j->info};
    notify(j, &ev);
}

/* Every state change goes through here: stored, then told. Terminal states never change. */
static void set_state(zt_jobs *jm, job *j, zt_job_state s) {
    if (zt_job_state_terminal(j->info.state))
        return;
    j->info.state = s;
    if (zt_job_state_terminal(s))
        j->info.finished_ms = now_ms();
    persist(jm, j);
    notify_state(j);
}

/* ------------------------------------------------------------------------------------------ */
/* Metric records and log lines                                                                */

/* Adds a record to the history and takes step, loss and tokens/s from it for the job's info. */
static void add_record(job *j, const cJSON *obj, const char *text, int64_t time_ms,
                       zt_metric_record *out) {
    zt_history_add_record(j->history, obj, text, time_ms, j->info.step, out);
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(obj, "train/loss");
    const cJSON *tps = cJSON_GetObjectItemCaseSensitive(obj, "perf/tokens_per_second");
    if (cJSON_IsNumber(loss))
        j->info.loss = loss->valuedouble;
    if (cJSON_IsNumber(tps))
        j->info.tokens_per_second = tps->valuedouble;
    j->info.n_records = zt_history_n_records(j->history);
    if (out->step > j->info.step)
        j->info.step = out->step;
}

/* A line of ztraind's own about the job, for its log ("started 2 ranks: pids 10, 11"). */
static void daemon_log(zt_jobs *jm, job *j, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void daemon_log(zt_jobs *jm, job *j, const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    zt_log_line l = {.seq = zt_history_next_seq(j->history), .time_ms = now_ms(), .rank = -1,
                     .stream = "ztraind", .text = text};
    zt_history_add_log(j->history, &l);
    if (zt_store_add_log(jm->store, j->info.id, &l, LOG_KEEP) != ZT_OK)
        fprintf(stderr, "ztraind: %s\n", zt_last_error());
    zt_job_event ev = {.kind = ZT_EVENT_LOG, .log = &l};
    notify(j, &ev);
}

/* ------------------------------------------------------------------------------------------ */
/* Supervisor callbacks (supervisor thread)                                                    */

static zt_status write_job_file(const job *j, char *path, size_t size) {
    snprintf(path, size, "%s/job.json", j->info.run_dir);
    ZT_TRY(zt_mkdirs(j->info.run_dir));
    return zt_write_file_atomic(path, j->info.spec_json, strlen(j->info.spec_json));
}

/* The job's Slurm name: unique per daemon (its tag) and job, so scancel --name finds it. */
static void slurm_job_name(const zt_jobs *jm, const job *j, char *buf, size_t size) {
    snprintf(buf, size, "ztrain-%s-%s", jm->tag, j->info.id);
}

/* The spec's "nodes" (1 when absent); the spec was checked when it was submitted. */
static int spec_nodes(const job *j) {
    cJSON *top = cJSON_Parse(j->info.spec_json);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(top, "nodes");
    int nodes = cJSON_IsNumber(n) && n->valuedouble >= 1 ? (int)n->valuedouble : 1;
    cJSON_Delete(top);
    return nodes;
}

static void start_job(zt_jobs *jm, job *j) {
    char job_path[4200];
    zt_status s = write_job_file(j, job_path, sizeof job_path);
    char *argv[] = {jm->cfg.worker_path, job_path, "--out", j->info.run_dir, NULL};
    /* A job alone on the machine gets all of it, as under `ztrain run`; when other jobs may
     * share the cores, the ranks' OpenMP threads wait passively instead of spinning. Under
     * Slurm the cores are the scheduler's to hand out: one per rank unless --threads-per-rank
     * asks for more (and srun --cpus-per-task then reserves them). */
    int cpus = zt_cpu_count(), threads = jm->cfg.threads_per_rank;
    if (threads <= 0 && jm->cfg.slurm)
        threads = 1;
    if (threads <= 0)
        threads = cpus / j->info.world_size > 0 ? cpus / j->info.world_size : 1;
    char name[96];
    slurm_job_name(jm, j, name, sizeof name);
    zt_slurm_job sj = {.cfg = jm->cfg.slurm, .job_name = name, .nodes = spec_nodes(j),
                       .ntasks = j->info.world_size,
                       .cpus_per_task = jm->cfg.threads_per_rank};
    zt_group_spec spec = {.program = jm->cfg.worker_path, .argv = argv,
                          .cwd = j->info.run_dir, .world_size = j->info.world_size,
                          .threads_per_rank = threads,
                          .run_id = jm->cfg.slurm ? name : j->info.id,
                          .fail_grace_s = 3.0,
                          .passive_wait = (long)threads * jm->cfg.max_ranks > cpus,
                          .slurm = jm->cfg.slurm ? &sj : NULL};
    pid_t *pids = calloc((size_t)j->info.world_size, sizeof *pids);
    ZT_ASSERT(pids);
    if (s == ZT_OK)
        s = zt_supervisor_start_group(jm->sup, &spec, j, &j->group, pids);
    if (s != ZT_OK) {
        set_reason(j, "cannot start the ranks: %s", zt_last_error());
        free(pids);
        set_state(jm, j, ZT_JOB_FAILED);
        return;
    }
    jm->ranks_in_use += j->info.world_size;
    for (int r = 0; r < j->info.world_size; r++)
        j->info.ranks[r] = (zt_rank_info){.rank = r, .pid = pids[r], .running = pids[r] != 0};
    free(pids);
    j->info.started_ms = now_ms();
    set_reason(j, "%s", "");
    if (jm->cfg.slurm)
        daemon_log(jm, j, "started srun for %d rank(s) on %d node(s) as Slurm job %s%s%s, %d "
                   "thread(s) per rank", j->info.world_size, sj.nodes, name,
                   sj.cfg->partition && sj.cfg->partition[0] ? " in partition " : "",
                   sj.cfg->partition ? sj.cfg->partition : "", threads);
    else
        daemon_log(jm, j, "started %d rank(s) of %s, %d thread(s) each", j->info.world_size,
                   jm->cfg.worker_path, threads);
    set_state(jm, j, ZT_JOB_STARTING);
}

/* Says what a queued job waits for, when that changed. */
static void set_wait_reason(zt_jobs *jm, job *j, const char *why) {
    if (strcmp(why, j->info.reason) == 0)
        return;
    set_reason(j, "%s", why);
    persist(jm, j);
    notify_state(j);
}

/* Goes through the queue in submission order: jobs that fit start (only when `start`: spawning
 * is the supervisor thread's), the first that does not fit waits, and so do the ones behind it
 * (no overtaking, so a large job is never starved by small ones). Each waiting job's reason
 * says what it waits for. Called with the lock held. */
static void schedule(zt_jobs *jm, bool start) {
    const job *blocked = NULL;
    int free_ranks = jm->cfg.max_ranks - jm->ranks_in_use;
    for (int i = 0; i < jm->n_jobs; i++) {
        job *j = jm->jobs[i];
        if (j->info.state != ZT_JOB_QUEUED)
            continue;
        char why[256];
        if (blocked) {
            snprintf(why, sizeof why, "waiting behind %s, which is first in the queue",
                     blocked->info.id);
        } else if (j->info.world_size <= free_ranks) {
            free_ranks -= j->info.world_size;
            if (start) {
                start_job(jm, j);
                continue;
            }
            snprintf(why, sizeof why, "starting");
        } else {
            snprintf(why, sizeof why, "waiting for %d free rank slot(s): %d of --max-ranks %d "
                     "in use", j->info.world_size, jm->cfg.max_ranks - free_ranks,
                     jm->cfg.max_ranks);
            blocked = j;
        }
        set_wait_reason(jm, j, why);
    }
}

static void on_tick(void *ctx) {
    zt_jobs *jm = ctx;
    pthread_mutex_lock(&jm->mu);
    schedule(jm, true);
    pthread_mutex_unlock(&jm->mu);
}

static void on_metrics_line(void *group_ctx, const char *line);
static void on_log_line(void *group_ctx, int rank, const char *stream, const char *line);
static void on_rank_exited(void *group_ctx, int rank, pid_t pid, const char *host, int exit_code,
                           int sig);
static void on_rank_placed(void *group_ctx, int rank, pid_t pid, const char *host);
static void on_launch_event(void *group_ctx, zt_launch_event ev, const char *text);
static void on_group_ended(void *group_ctx);

static void on_metrics_line(void *group_ctx, const char *line) {
    job *j = group_ctx;
    zt_jobs *jm = j->jm;
    cJSON *obj = cJSON_Parse(line);
    pthread_mutex_lock(&jm->mu);
    if (!cJSON_IsObject(obj)) {
        daemon_log(jm, j, "ignored a malformed metrics line: %.200s", line);
    } else if (cJSON_GetObjectItemCaseSensitive(obj, "event")) {
        const cJSON *max = cJSON_GetObjectItemCaseSensitive(obj, "max_steps");
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "train/global_step");
        if (cJSON_IsNumber(max))
            j->info.max_steps = (int64_t)max->valuedouble;
        if (cJSON_IsNumber(step) && (int64_t)step->valuedouble > j->info.step)
            j->info.step = (int64_t)step->valuedouble;
        if (j->info.state == ZT_JOB_STARTING)
            set_state(jm, j, ZT_JOB_RUNNING);
        else
            persist(jm, j);
    } else {
        /* The record is kept as cJSON prints it, not as it came: what clients get is then
         * valid JSON whatever followed the object on the line. */
        char *text = cJSON_PrintUnformatted(obj);
        zt_metric_record r;
        add_record(j, obj, text ? text : "{}", now_ms(), &r);
        free(text);
        if (zt_store_add_record(jm->store, j->info.id, &r) != ZT_OK)
            fprintf(stderr, "ztraind: %s\n", zt_last_error());
        if (j->info.state == ZT_JOB_STARTING)
            set_state(jm, j, ZT_JOB_RUNNING);
        zt_job_event ev = {.kind = ZT_EVENT_METRICS, .record = &r};
        notify(j, &ev);
    }
    pthread_mutex_unlock(&jm->mu);
    cJSON_Delete(obj);
}

static void on_log_line(void *group_ctx, int rank, const char *stream, const char *line) {
    job *j = group_ctx;
    zt_jobs *jm = j->jm;
    pthread_mutex_lock(&jm->mu);
    zt_log_line l = {.seq = zt_history_next_seq(j->history), .time_ms = now_ms(), .rank = rank,
                     .stream = stream, .text = line};
    zt_history_add_log(j->history, &l);
    if (rank >= 0 && strcmp(stream, "stderr") == 0 && line[0])
        set_str(&j->last_stderr[rank], line);
    if (zt_store_add_log(jm->store, j->info.id, &l, LOG_KEEP) != ZT_OK)
        fprintf(stderr, "ztraind: %s\n", zt_last_error());
    zt_job_event ev = {.kind = ZT_EVENT_LOG, .log = &l};
    notify(j, &ev);
    pthread_mutex_unlock(&jm->mu);
}

/* "rank 1 (pid 4242)", "rank 3 on n2 (pid 4242)", "rank 3 on n2". */
static void describe_rank(char *buf, size_t size, int rank, pid_t pid, const char *host) {
    int n = snprintf(buf, size, "rank %d", rank);
    if (host && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, " on %s", host);
    if (pid && n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, " (pid %ld)", (long)pid);
}

static void describe_exit(char *buf, size_t size, int rank, pid_t pid, const char *host, int code,
                          int sig, const char *last_stderr) {
    char who[200];
    describe_rank(who, sizeof who, rank, pid, host);
    if (sig) {
        const char *abbrev = sigabbrev_np(sig);
        snprintf(buf, size, "%s was killed by signal %d (SIG%s)", who, sig, abbrev ? abbrev : "?");
    } else if (last_stderr) {
        snprintf(buf, size, "%s exited with status %d: %s", who, code, last_stderr);
    } else {
        snprintf(buf, size, "%s exited with status %d", who, code);
    }
}

static void on_rank_exited(void *group_ctx, int rank, pid_t pid, const char *host, int exit_code,
                           int sig) {
    job *j = group_ctx;
    zt_jobs *jm = j->jm;
    pthread_mutex_lock(&jm->mu);
    zt_rank_info *ri = &j->info.ranks[rank];
    ri->running = false;
    ri->exit_code = exit_code;
    ri->signal = sig;
    if (!pid)
        pid = ri->pid;
    if (!host)
        host = j->hosts[rank];
    bool failed = sig != 0 || (exit_code != 0 && exit_code != STOP_EXIT_STATUS);
    char what[1400];
    describe_exit(what, sizeof what, rank, pid, host, exit_code, sig,
                  failed ? j->last_stderr[rank] : NULL);
    if (failed && j->failed_rank < 0) {
        j->failed_rank = rank;
        set_str(&j->fail_reason, what);
    }
    daemon_log(jm, j, "%s", what);
    persist(jm, j);
    notify_state(j);
    pthread_mutex_unlock(&jm->mu);
}

/* A Slurm rank said where it runs: its pid is on that node. */
static void on_rank_placed(void *group_ctx, int rank, pid_t pid, const char *host) {
    job *j = group_ctx;
    zt_jobs *jm = j->jm;
    pthread_mutex_lock(&jm->mu);
    zt_rank_info *ri = &j->info.ranks[rank];
    ri->pid = pid;
    ri->running = true;
    set_str(&j->hosts[rank], host);
    /* The placement line is the rank's first stderr line, not what it died saying. */
    free(j->last_stderr[rank]);
    j->last_stderr[rank] = NULL;
    daemon_log(jm, j, "rank %d runs on %s (pid %ld)", rank, host, (long)pid);
    persist(jm, j);
    notify_state(j);
    pthread_mutex_unlock(&jm->mu);
}

static void on_launch_event(void *group_ctx, zt_launch_event ev, const char *text) {
    job *j = group_ctx;
    zt_jobs *jm = j->jm;
    pthread_mutex_lock(&jm->mu);
    daemon_log(jm, j, "%s", text);
    if (ev == ZT_LAUNCH_WAITING && j->info.state == ZT_JOB_STARTING) {
        set_reason(j, "%s", text);
        persist(jm, j);
        notify_state(j);
    } else if (ev == ZT_LAUNCH_ALLOCATED && j->info.state == ZT_JOB_STARTING) {
        set_reason(j, "%s", "");
        persist(jm, j);
        notify_state(j);
    } else if ((ev == ZT_LAUNCH_STOPPED || ev == ZT_LAUNCH_FAILED) && !j->launch_reason) {
        j->launch_reason = xstrdup(text);
        j->launch_failed = ev == ZT_LAUNCH_FAILED;
    }
    pthread_mutex_unlock(&jm->mu);
}

/* " (checkpoint global_step996)" for the job's newest complete checkpoint, or "". */
static void checkpoint_note(const job *j, char *buf, size_t size) {
    char path[4200], tag[256] = "";
    snprintf(path, sizeof path, "%s/latest", j->info.checkpoint_dir);
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (!f)
        return;
    if (fgets(tag, sizeof tag, f))
        tag[strcspn(tag, "\r\n")] = '\0';
    fclose(f);
    if (tag[0])
        snprintf(buf, size, " (checkpoint %s)", tag);
}

/* The final state, once every rank is reaped: a cancel request wins, then the first failure. */
static void on_group_ended(void *group_ctx) {
    job *j = group_ctx;
    zt_jobs *jm = j->jm;
    pthread_mutex_lock(&jm->mu);
    j->group = NULL;
    jm->ranks_in_use -= j->info.world_size;
    bool all_zero = true, all_stopped = true;
    for (int r = 0; r < j->info.world_size; r++) {
        const zt_rank_info *ri = &j->info.ranks[r];
        all_zero &= ri->signal == 0 && ri->exit_code == 0;
        all_stopped &= ri->signal == 0 && (ri->exit_code == 0 || ri->exit_code == STOP_EXIT_STATUS);
    }
    char ckpt[300];
    checkpoint_note(j, ckpt, sizeof ckpt);
    bool any_started = false;
    for (int r = 0; r < j->info.world_size; r++)
        any_started |= j->info.ranks[r].pid != 0;
    if (j->cancel_requested && !any_started) {
        set_reason(j, "cancelled by request before Slurm started the ranks");
        set_state(jm, j, ZT_JOB_CANCELLED);
    } else if (j->cancel_requested) {
        if (j->shutdown && all_stopped)
            set_reason(j, "ztraind was stopped: the job stopped with a checkpoint%s", ckpt);
        else if (j->shutdown)
            set_reason(j, "ztraind was stopped: the ranks did not stop in time and were killed");
        else if (j->force)
            set_reason(j, "cancelled by request (forced: the ranks were killed at once)");
        else if (all_stopped)
            set_reason(j, "cancelled by request: the ranks wrote a checkpoint and stopped%s",
                       ckpt);
        else
            set_reason(j, "cancelled by request; the ranks did not stop within the grace period "
                          "of %.0f s and were killed", j->grace_s);
        set_state(jm, j, ZT_JOB_CANCELLED);
    } else if (j->launch_reason) {
        /* Slurm's decision explains the ranks' ends, not the other way round. */
        if (j->failed_rank >= 0)
            set_reason(j, "%s; first failure: %s", j->launch_reason, j->fail_reason);
        else if (all_stopped && ckpt[0])
            set_reason(j, "%s; the ranks wrote a checkpoint and stopped%s", j->launch_reason,
                       ckpt);
        else
            set_reason(j, "%s", j->launch_reason);
        set_state(jm, j, j->launch_failed ? ZT_JOB_FAILED : ZT_JOB_CANCELLED);
    } else if (j->failed_rank >= 0) {
        set_reason(j, "%s", j->fail_reason);
        set_state(jm, j, ZT_JOB_FAILED);
    } else if (all_zero) {
        set_state(jm, j, ZT_JOB_SUCCEEDED);
    } else {
        set_reason(j, "the ranks were stopped by a signal from outside ztraind at step %lld",
                   (long long)j->info.step);
        set_state(jm, j, ZT_JOB_CANCELLED);
    }
    pthread_mutex_unlock(&jm->mu);
    zt_supervisor_wake(jm->sup);
}

/* ------------------------------------------------------------------------------------------ */
/* Submitting                                                                                  */

static job *find_by_key(zt_jobs *jm, const char *key) {
    if (!key || !key[0])
        return NULL;
    for (int i = jm->n_jobs - 1; i >= 0; i--)
        if (strcmp(jm->jobs[i]->info.idempotency_key, key) == 0)
            return jm->jobs[i];
    return NULL;
}

static int live_jobs(const zt_jobs *jm) {
    int n = 0;
    for (int i = 0; i < jm->n_jobs; i++)
        n += !zt_job_state_terminal(jm->jobs[i]->info.state);
    return n;
}

zt_status zt_jobs_submit(zt_jobs *jm, const char *spec_json, const char *idempotency_key,
                         zt_job_info *info) {
    size_t limit = jm->cfg.max_spec_bytes ? jm->cfg.max_spec_bytes : 1 << 20;
    if (strlen(spec_json) > limit)
        return zt_error(ZT_ERR_LIMIT, "spec: %zu bytes is above the limit of %zu",
                        strlen(spec_json), limit);
    pthread_mutex_lock(&jm->mu);
    job *known = find_by_key(jm, idempotency_key);
    if (known) {
        info_copy(info, &known->info);
        pthread_mutex_unlock(&jm->mu);
        return ZT_OK;
    }
    if (live_jobs(jm) >= jm->cfg.max_jobs) {
        pthread_mutex_unlock(&jm->mu);
        return zt_error(ZT_ERR_LIMIT, "the server already has %d queued or running jobs (its "
                        "limit)", jm->cfg.max_jobs);
    }
    /* The number is taken now so that the default checkpoint directory can name the job; a
     * refused spec leaves a gap in the numbering, which nothing relies on. */
    char id[sizeof ((zt_job_info *)0)->id];
    snprintf(id, sizeof id, "job-%06lld", (++jm->last_number) % 1000000000000LL);
    pthread_mutex_unlock(&jm->mu);

    char *text = NULL;
    zt_job_spec spec;
    zt_spec_limits limits = {.data_root = jm->cfg.data_root, .runs_root = jm->cfg.runs_root,
                             .max_world_size = jm->cfg.max_world_size,
                             .max_ranks = jm->cfg.max_ranks,
                             .max_nodes = jm->cfg.slurm ? 0 : 1};
    zt_status s = zt_spec_check(spec_json, id, &limits, &text, &spec);
    if (s != ZT_OK)
        return s;
    zt_job_info ji = {.name = spec.name, .state = ZT_JOB_QUEUED, .reason = "",
                      .spec_json = text, .idempotency_key = (char *)(idempotency_key ? idempotency_key : ""),
                      .world_size = spec.world_size, .created_ms = now_ms(),
                      .max_steps = spec.train.max_steps, .checkpoint_dir = spec.train.checkpoint_dir};
    snprintf(ji.id, sizeof ji.id, "%s", id);
    snprintf(ji.device, sizeof ji.device, "%s", spec.device == ZT_DEVICE_CUDA ? "cuda" : "cpu");
    char run_dir[PATH_MAX];
    snprintf(run_dir, sizeof run_dir, "%s/%s", jm->cfg.runs_root, id);
    ji.run_dir = run_dir;
    zt_rank_info *ranks = calloc((size_t)spec.world_size, sizeof *ranks);
    ZT_ASSERT(ranks);
    for (int r = 0; r < spec.world_size; r++)
        ranks[r].rank = r;
    ji.ranks = ranks;

    pthread_mutex_lock(&jm->mu);
    job *j = find_by_key(jm, idempotency_key);   /* a twin may have won the race */
    if (!j) {
        j = job_alloc(&ji);
        add_job(jm, j);
        persist(jm, j);
        schedule(jm, false);
    }
    info_copy(info, &j->info);
    pthread_mutex_unlock(&jm->mu);
    free(ranks);
    free(text);
    zt_job_spec_free(&spec);
    zt_supervisor_wake(jm->sup);
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Queries                                                                                     */

zt_status zt_jobs_get(zt_jobs *jm, const char *id, zt_job_info *info) {
    pthread_mutex_lock(&jm->mu);
    job *j = find_job(jm, id);
    if (j)
        info_copy(info, &j->info);
    pthread_mutex_unlock(&jm->mu);
    return j ? ZT_OK : not_found(id);
}

zt_status zt_jobs_record_count(zt_jobs *jm, const char *id, int64_t *n) {
    pthread_mutex_lock(&jm->mu);
    job *j = find_job(jm, id);
    if (j)
        *n = zt_history_n_records(j->history);
    pthread_mutex_unlock(&jm->mu);
    return j ? ZT_OK : not_found(id);
}

zt_status zt_jobs_list(zt_jobs *jm, zt_job_state state, const char *after_id, int limit,
                       zt_job_info **jobs, int *n, bool *more) {
    *jobs = NULL;
    *n = 0;
    *more = false;
    if (limit <= 0)
        limit = 50;
    pthread_mutex_lock(&jm->mu);
    int start = jm->n_jobs - 1;
    if (after_id && after_id[0]) {
        job *a = find_job(jm, after_id);
        if (!a) {
            pthread_mutex_unlock(&jm->mu);
            return zt_error(ZT_ERR_INVALID, "page token '%s' names no job", after_id);
        }
        while (start >= 0 && jm->jobs[start] != a)
            start--;
        start--;
    }
    zt_job_info *out = calloc((size_t)limit, sizeof *out);
    ZT_ASSERT(out);
    for (int i = start; i >= 0; i--) {
        const job *j = jm->jobs[i];
        if (state && j->info.state != state)
            continue;
        if (*n == limit) {
            *more = true;
            break;
        }
        info_copy(&out[(*n)++], &j->info);
    }
    pthread_mutex_unlock(&jm->mu);
    *jobs = out;
    return ZT_OK;
}

zt_status zt_jobs_all(zt_jobs *jm, zt_job_info **jobs, int *n) {
    pthread_mutex_lock(&jm->mu);
    int count = jm->n_jobs;
    zt_job_info *out = calloc((size_t)(count ? count : 1), sizeof *out);
    ZT_ASSERT(out);
    for (int i = 0; i < count; i++)
        info_copy(&out[i], &jm->jobs[count - 1 - i]->info);
    pthread_mutex_unlock(&jm->mu);
    *jobs = out;
    *n = count;
    return ZT_OK;
}

const zt_jobs_config *zt_jobs_get_config(const zt_jobs *jm) {
    return &jm->cfg;
}

zt_status zt_jobs_metric_series(zt_jobs *jm, const char *id, const char *const *keys, int n_keys,
                                int64_t since_step, int max_points, zt_series_fn emit, void *ctx) {
    pthread_mutex_lock(&jm->mu);
    job *j = find_job(jm, id);
    if (j)
        zt_history_series(j->history, keys, n_keys, since_step, max_points, emit, ctx);
    pthread_mutex_unlock(&jm->mu);
    return j ? ZT_OK : not_found(id);
}

zt_status zt_jobs_metric_records(zt_jobs *jm, const char *id, int64_t since_step,
                                 zt_record_fn emit, void *ctx) {
    pthread_mutex_lock(&jm->mu);
    job *j = find_job(jm, id);
    if (j)
        zt_history_records(j->history, since_step, emit, ctx);
    pthread_mutex_unlock(&jm->mu);
    return j ? ZT_OK : not_found(id);
}

zt_status zt_jobs_logs(zt_jobs *jm, const char *id, int tail, zt_log_fn emit, void *ctx) {
    pthread_mutex_lock(&jm->mu);
    job *j = find_job(jm, id);
    if (j)
        zt_history_logs(j->history, tail, emit, ctx);
    pthread_mutex_unlock(&jm->mu);
    return j ? ZT_OK : not_found(id);
}

/* ------------------------------------------------------------------------------------------ */
/* Cancel and watch                                                                            */

zt_status zt_jobs_cancel(zt_jobs *jm, const char *id, bool force, double grace_s,
                         zt_job_info *info) {
    pthread_mutex_lock(&jm->mu);
    job *j = find_job(jm, id);
    if (!j) {
        pthread_mutex_unlock(&jm->mu);
        return not_found(id);
    }
    if (j->info.state == ZT_JOB_QUEUED) {
        j->cancel_requested = true;
        set_reason(j, "cancelled by request while queued");
        set_state(jm, j, ZT_JOB_CANCELLED);
    } else if (!zt_job_state_terminal(j->info.state) && j->group) {
        j->cancel_requested = true;
        j->grace_s = grace_s > 0 ? grace_s : jm->cfg.default_grace_s;
        if (force) {
            j->force = true;
            daemon_log(jm, j, "force-cancel requested: killing the ranks");
            zt_rank_group_kill(jm->sup, j->group);
        } else if (j->info.state != ZT_JOB_STOPPING) {
            daemon_log(jm, j, "cancel requested: the ranks finish the step, write a checkpoint "
                              "and stop (killed after %.0f s)", j->grace_s);
            zt_rank_group_terminate(jm->sup, j->group, j->grace_s);
        }
        set_reason(j, force ? "force-cancel requested" : "cancel requested");
        if (j->info.state != ZT_JOB_STOPPING)
            set_state(jm, j, ZT_JOB_STOPPING);
        else
            persist(jm, j);
    }
    if (info)
        info_copy(info, &j->info);
    pthread_mutex_unlock(&jm->mu);
    return ZT_OK;
}

/* History replayed to a new watch, as the events live ones would have been. */
static void replay_record(void *ctx, const zt_metric_record *r) {
    zt_job_watch *w = ctx;
    zt_job_event ev = {.kind = ZT_EVENT_METRICS, .record = r};
    w->fn(w->ctx, &ev);
}

static void replay_log(void *ctx, const zt_log_line *l) {
    zt_job_watch *w = ctx;
    zt_job_event ev = {.kind = ZT_EVENT_LOG, .log = l};
    w->fn(w->ctx, &ev);
}

zt_status zt_jobs_watch(zt_jobs *jm, const char *id, int what, int64_t from_step, int log_tail,
                        zt_job_event_fn fn, void *ctx, zt_job_watch **out) {
    zt_job_watch *w = calloc(1, sizeof *w);
    if (!w)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    *w = (zt_job_watch){.what = what, .from_step = from_step, .fn = fn, .ctx = ctx};
    pthread_mutex_lock(&jm->mu);
    job *j = find_job(jm, id);
    if (!j) {
        pthread_mutex_unlock(&jm->mu);
        free(w);
        return not_found(id);
    }
    w->job = j;
    bool ended = zt_job_state_terminal(j->info.state);
    zt_job_event ev = {.kind = ZT_EVENT_STATE, .job = &j->info};
    if (!ended)
        fn(ctx, &ev);
    if (what & ZT_WATCH_METRICS)
        zt_history_records(j->history, from_step, replay_record, w);
    if (what & ZT_WATCH_LOGS)
        zt_history_logs(j->history, log_tail, replay_log, w);
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

/* ------------------------------------------------------------------------------------------ */
/* Life cycle                                                                                  */

static void load_job(void *ctx, const zt_job_info *ji) {
    zt_jobs *jm = ctx;
    add_job(jm, job_alloc(ji));
}

static void load_record(void *ctx, const char *job_id, const zt_metric_record *r) {
    zt_jobs *jm = ctx;
    job *j = find_job(jm, job_id);
    cJSON *obj = cJSON_Parse(r->json);
    zt_metric_record stored;
    if (j && cJSON_IsObject(obj))
        add_record(j, obj, r->json, r->time_ms, &stored);
    cJSON_Delete(obj);
}

static void load_log(void *ctx, const char *job_id, const zt_log_line *l) {
    zt_jobs *jm = ctx;
    job *j = find_job(jm, job_id);
    if (j)
        zt_history_add_log(j->history, l);
}

/* The previous daemon's srun died with it (it runs under setpriv --pdeathsig TERM, and srun
 * answers SIGTERM by killing its tasks), but srun may have been killed on its own, or started
 * without setpriv: the job is cancelled in Slurm all the same, so that nothing of it runs on. */
static void cancel_orphan_in_slurm(zt_jobs *jm, job *j) {
    char name[96], err[512];
    slurm_job_name(jm, j, name, sizeof name);
    char **argv = zt_slurm_scancel_argv(jm->cfg.slurm, name, NULL, NULL);
    int rc = argv ? zt_slurm_run_sync(argv, 15.0, err, sizeof err) : -1;
    zt_slurm_argv_free(argv);
    if (rc == 0)
        daemon_log(jm, j, "cancelled whatever was left in Slurm of %s (scancel --name=%s)",
                   j->info.id, name);
    else
        daemon_log(jm, j, "scancel --name=%s failed (status %d): %s", name, rc, err);
}

/* Jobs whose ranks were running under the previous daemon: they asked to be stopped when it
 * died (PR_SET_PDEATHSIG), so they are gone, and they are not re-adopted. */
static void fail_orphans(zt_jobs *jm) {
    for (int i = 0; i < jm->n_jobs; i++) {
        job *j = jm->jobs[i];
        zt_job_state s = j->info.state;
        if (s != ZT_JOB_STARTING && s != ZT_JOB_RUNNING && s != ZT_JOB_STOPPING)
            continue;
        for (int r = 0; r < j->info.world_size; r++)
            j->info.ranks[r].running = false;
        if (jm->cfg.slurm)
            cancel_orphan_in_slurm(jm, j);
        if (s == ZT_JOB_STOPPING) {
            set_reason(j, "ztraind was restarted while the job was being cancelled");
            set_state(jm, j, ZT_JOB_CANCELLED);
        } else {
            set_reason(j, "ztraind was restarted while the job was running (step %lld); its ranks "
                          "were stopped with the previous daemon",
                       (long long)j->info.step);
            set_state(jm, j, ZT_JOB_FAILED);
        }
        daemon_log(jm, j, "%s", j->info.reason);
    }
}

static zt_status resolve_root(char **root, const char *what) {
    ZT_TRY(zt_mkdirs(*root));
    char buf[PATH_MAX];
    if (!realpath(*root, buf))
        return zt_error(ZT_ERR_IO, "%s root %s: %s", what, *root, strerror(errno));
    set_str(root, buf);
    return ZT_OK;
}

/* FNV-1a of the host name and the state file's absolute path: the same daemon (same host, same
 * state) gets the same tag after a restart, two daemons get different ones. */
static void daemon_tag(zt_jobs *jm) {
    char host[256] = "", db[PATH_MAX];
    gethostname(host, sizeof host - 1);
    if (!realpath(jm->cfg.db_path, db))
        snprintf(db, sizeof db, "%s", jm->cfg.db_path);
    uint32_t h = 2166136261u;
    for (const char *p = host; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    h = (h ^ ':') * 16777619u;
    for (const char *p = db; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    snprintf(jm->tag, sizeof jm->tag, "%08x", h);
}

zt_status zt_jobs_create(zt_jobs **out, const zt_jobs_config *cfg) {
    zt_jobs *jm = calloc(1, sizeof *jm);
    if (!jm)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    jm->cfg = *cfg;
    jm->cfg.data_root = xstrdup(cfg->data_root);
    jm->cfg.runs_root = xstrdup(cfg->runs_root);
    jm->cfg.db_path = xstrdup(cfg->db_path);
    jm->cfg.worker_path = xstrdup(cfg->worker_path);
    if (jm->cfg.max_ranks < 1)
        jm->cfg.max_ranks = 1;
    pthread_mutex_init(&jm->mu, NULL);
    zt_status s = resolve_root(&jm->cfg.data_root, "data");
    if (s == ZT_OK)
        s = resolve_root(&jm->cfg.runs_root, "runs");
    if (s == ZT_OK)
        s = zt_store_open(&jm->store, jm->cfg.db_path);
    zt_store_loader loader = {load_job, load_record, load_log};
    if (s == ZT_OK)
        s = zt_store_load(jm->store, LOG_RING, &loader, jm);
    long long max_number = 0;
    if (s == ZT_OK)
        s = zt_store_max_job_number(jm->store, &max_number);
    if (s != ZT_OK) {
        zt_jobs_destroy(jm);
        return s;
    }
    if (max_number > jm->last_number)
        jm->last_number = max_number;
    daemon_tag(jm);
    fail_orphans(jm);
    zt_supervisor_callbacks cb = {.tick = on_tick, .metrics_line = on_metrics_line,
                                  .log_line = on_log_line, .rank_exited = on_rank_exited,
                                  .rank_placed = on_rank_placed,
                                  .launch_event = on_launch_event,
                                  .group_ended = on_group_ended};
    s = zt_supervisor_create(&jm->sup, &cb, jm);
    if (s != ZT_OK) {
        zt_jobs_destroy(jm);
        return s;
    }
    *out = jm;
    return ZT_OK;
}

static bool any_ranks(zt_jobs *jm) {
    pthread_mutex_lock(&jm->mu);
    bool any = jm->ranks_in_use > 0;
    pthread_mutex_unlock(&jm->mu);
    return any;
}

void zt_jobs_destroy(zt_jobs *jm) {
    if (!jm)
        return;
    if (jm->sup) {
        /* Queued jobs stay queued for the next daemon; running ones stop with a checkpoint. */
        pthread_mutex_lock(&jm->mu);
        for (int i = 0; i < jm->n_jobs; i++) {
            job *j = jm->jobs[i];
            if (j->group && !j->cancel_requested) {
                j->cancel_requested = true;
                j->shutdown = true;
                j->grace_s = jm->cfg.default_grace_s;
                daemon_log(jm, j, "ztraind is shutting down: cancelling the job");
                zt_rank_group_terminate(jm->sup, j->group, j->grace_s);
                set_reason(j, "ztraind is shutting down");
                set_state(jm, j, ZT_JOB_STOPPING);
            }
        }
        pthread_mutex_unlock(&jm->mu);
        /* The supervisor thread reaps them and records the final states. */
        while (any_ranks(jm))
            usleep(20000);
        zt_supervisor_destroy(jm->sup);
    }
    for (int i = 0; i < jm->n_jobs; i++)
        job_free(jm->jobs[i]);
    free(jm->jobs);
    zt_store_close(jm->store);
    free(jm->cfg.data_root);
    free(jm->cfg.runs_root);
    free(jm->cfg.db_path);
    free(jm->cfg.worker_path);
    pthread_mutex_destroy(&jm->mu);
    free(jm);
}
