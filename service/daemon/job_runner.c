/* Running jobs (job_manager.h): the queue, which starts queued jobs on the supervisor thread's
 * tick when there is room, and the supervisor's callbacks, which turn what the ranks print and
 * how they end into metric records, log lines and final states with their reasons. Each
 * callback takes the manager's lock for itself; the rest runs with it held. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "ztrain/fsutil.h"
#include "job_events.h"
#include "job_manager_internal.h"
#include "oplog.h"
#include "ranks/proc_spawn.h"
#include "ranks/rank_group.h"

/* After a rank fails, the others get SIGTERM and, this many seconds later, SIGKILL. */
#define RANK_FAIL_GRACE_S 3.0
/* Descriptors a job's start must leave free: the pipes' write ends while it spawns, the state
 * file's journal, a connection accepted meanwhile. */
#define FD_RESERVE 16

/* ------------------------------------------------------------------------------------------ */
/* The queue                                                                                   */

static zt_status write_job_file(const job *j, char *path, size_t size) {
    snprintf(path, size, "%s/job.json", j->info.run_dir);
    ZT_TRY(zt_mkdirs(j->info.run_dir));
    char *text = zt_jm_attempt_spec(j);
    zt_status s = zt_write_file_atomic(path, text, strlen(text));
    free(text);
    return s;
}

/* The spec's "nodes" (1 when absent); the spec was checked when it was submitted. */
static int spec_nodes(const job *j) {
    cJSON *top = cJSON_Parse(j->info.spec_json);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(top, "nodes");
    int nodes = cJSON_IsNumber(n) && n->valuedouble >= 1 ? (int)n->valuedouble : 1;
    cJSON_Delete(top);
    return nodes;
}

/* GPUs a queued job holds once it starts: none unless it computes on "device": "cuda". */
static int gpus_needed(const zt_jobs *jm, const job *j) {
    cJSON *top = cJSON_Parse(j->info.spec_json);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(top, "device");
    bool cuda = cJSON_IsString(d) && strcmp(d->valuestring, "cuda") == 0;
    cJSON_Delete(top);
    return cuda && !jm->cfg.slurm ? zt_gpu_pool_need(&jm->gpus, j->info.world_size) : 0;
}

/* The checkpoint directory's `latest` file now: what stat says, all zero when it is missing. */
static struct stat latest_now(const job *j) {
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/latest", j->info.checkpoint_dir);
    if (stat(path, &st) != 0)
        memset(&st, 0, sizeof st);
    return st;
}

static void start_job(zt_jobs *jm, job *j) {
    char job_path[4200];
    zt_status s = write_job_file(j, job_path, sizeof job_path);
    char *argv[] = {jm->cfg.worker_path, job_path, "--out", j->info.run_dir, "--validated", NULL};
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
    zt_jm_slurm_job_name(jm, j, name, sizeof name);
    zt_slurm_job sj = {.cfg = jm->cfg.slurm, .job_name = name, .nodes = spec_nodes(j),
                       .ntasks = j->info.world_size,
                       .cpus_per_task = jm->cfg.threads_per_rank};
    zt_group_spec spec = {.program = jm->cfg.worker_path, .argv = argv,
                          .cwd = j->info.run_dir, .world_size = j->info.world_size,
                          .threads_per_rank = threads,
                          .run_id = jm->cfg.slurm ? name : j->info.id,
                          .job_id = j->info.id,
                          .fail_grace_s = RANK_FAIL_GRACE_S,
                          .passive_wait = (long)threads * jm->cfg.max_ranks > cpus,
                          .slurm = jm->cfg.slurm ? &sj : NULL};
    /* Every rank sees the job's GPUs and takes the one of its LOCAL_RANK (gpu_pool.h). */
    char gpu_list[ZT_MAX_GPUS * 65];
    const char **devices = NULL;
    int gpus = gpus_needed(jm, j);
    if (s == ZT_OK && gpus > 0) {
        /* The queue started this job only with this many free. */
        bool took = zt_gpu_pool_take(&jm->gpus, j->info.id, gpus, gpu_list, sizeof gpu_list);
        ZT_ASSERT(took);
        devices = calloc((size_t)j->info.world_size, sizeof *devices);
        ZT_ASSERT(devices);
        for (int r = 0; r < j->info.world_size; r++)
            devices[r] = gpu_list;
        spec.cuda_devices = devices;
    }
    pid_t *pids = calloc((size_t)j->info.world_size, sizeof *pids);
    ZT_ASSERT(pids);
    if (s == ZT_OK)
        s = zt_supervisor_start_group(jm->sup, &spec, j, &j->group, pids);
    free(devices);
    if (s != ZT_OK)
        zt_gpu_pool_release(&jm->gpus, j->info.id);
    if (s != ZT_OK) {
        zt_jm_set_reason(j, "cannot start the ranks: %s", zt_last_error());
        free(pids);
        zt_jm_set_state(jm, j, ZT_JOB_FAILED);
        return;
    }
    jm->ranks_in_use += j->info.world_size;
    for (int r = 0; r < j->info.world_size; r++)
        j->info.ranks[r] = (zt_rank_info){.rank = r, .pid = pids[r], .running = pids[r] != 0};
    free(pids);
    if (!j->info.started_ms)
        j->info.started_ms = zt_jm_now_ms();
    zt_jm_set_reason(j, "%s", "");
    j->latest_at_start = latest_now(j);
    zt_jm_attempt_started(jm, j);
    if (jm->cfg.slurm)
        zt_jm_daemon_log(jm, j, "started srun for %d rank(s) on %d node(s) as Slurm job "
                         "%s%s%s, %d thread(s) per rank, %s transport", j->info.world_size,
                         sj.nodes, name,
                         sj.cfg->partition && sj.cfg->partition[0] ? " in partition " : "",
                         sj.cfg->partition ? sj.cfg->partition : "", threads, j->info.comm);
    else
        zt_jm_daemon_log(jm, j, "started %d rank(s) of %s, %d thread(s) each, %s transport%s%s",
                         j->info.world_size, jm->cfg.worker_path, threads, j->info.comm,
                         gpus ? ", CUDA_VISIBLE_DEVICES=" : "", gpus ? gpu_list : "");
    zt_jm_set_state(jm, j, ZT_JOB_STARTING);
}

/* Descriptors ztraind holds for a job while its ranks run: each local rank's pidfd and the read
 * ends of its stdout and stderr, and rank 0's metrics pipe (for Slurm: srun's, and rank 0's
 * metrics connection). */
static int fds_needed(const zt_jobs *jm, const job *j) {
    return jm->cfg.slurm ? 4 : 3 * j->info.world_size + 1;
}

/* How many more descriptors ztraind may open (its open-file limit less those open, less
 * FD_RESERVE), so that a job whose ranks' pipes do not fit waits in the queue rather than
 * failing at its start ("pipe: Too many open files"). *limit gets the limit. */
static long fds_free(long *limit) {
    struct rlimit rl;
    *limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                 ? (long)rl.rlim_cur : 1L << 20;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return *limit;   /* no /proc: nothing is held back */
    long open_fds = -3;  /* ".", ".." and the directory's own descriptor */
    while (readdir(d))
        open_fds++;
    closedir(d);
    return *limit - open_fds - FD_RESERVE;
}

/* Says what a queued job waits for, when that changed. */
static void set_wait_reason(zt_jobs *jm, job *j, const char *why) {
    if (strcmp(why, j->info.reason) == 0)
        return;
    zt_jm_set_reason(j, "%s", why);
    zt_jm_persist(jm, j);
    zt_jm_notify_state(j);
}

/* Goes through the queue in submission order: jobs that fit start (only when `start`: spawning
 * is the supervisor thread's), the first that does not fit waits, and so do the ones behind it
 * (no overtaking, so a large job is never starved by small ones). Each waiting job's reason
 * says what it waits for. Called with the lock held. */
void zt_jm_schedule(zt_jobs *jm, bool start) {
    const job *blocked = NULL;
    int free_ranks = jm->cfg.max_ranks - jm->ranks_in_use;
    int free_gpus = zt_gpu_pool_free(&jm->gpus);
    long fd_limit = 0, free_fds = -1;   /* counted when a job is about to start */
    for (int i = 0; i < jm->n_jobs; i++) {
        job *j = jm->jobs[i];
        if (j->info.state != ZT_JOB_QUEUED)
            continue;
        char why[1024];
        if (blocked) {
            snprintf(why, sizeof why, "waiting behind %s, which is first in the queue",
                     blocked->info.id);
        } else if (!zt_jm_backoff_over(jm, j, why, sizeof why)) {
            /* Waiting out its back-off; it holds no place, so the jobs behind it may start. */
        } else if (!zt_jm_orphans_gone(jm, j)) {
            snprintf(why, sizeof why, "restarting once the ranks of the previous ztraind have "
                     "stopped (they write a checkpoint first)");
        } else if (j->info.world_size <= free_ranks && gpus_needed(jm, j) <= free_gpus) {
            if (free_fds < 0)
                free_fds = fds_free(&fd_limit);
            /* With nothing running, waiting frees nothing: the start is tried, and a failure
             * says what ran out. */
            if (fds_needed(jm, j) > free_fds && jm->ranks_in_use > 0) {
                snprintf(why, sizeof why, "waiting for file descriptors: its ranks' output needs "
                         "%d, and %ld of ztraind's open-file limit %ld are free (%d kept in "
                         "reserve)", fds_needed(jm, j), free_fds > 0 ? free_fds : 0, fd_limit,
                         FD_RESERVE);
                blocked = j;
            } else {
                free_ranks -= j->info.world_size;
                free_gpus -= gpus_needed(jm, j);
                free_fds -= fds_needed(jm, j);
                if (start) {
                    start_job(jm, j);
                    continue;
                }
                snprintf(why, sizeof why, "starting");
            }
        } else if (j->info.world_size > free_ranks) {
            snprintf(why, sizeof why, "waiting for %d free rank slot(s): %d of --max-ranks %d "
                     "in use", j->info.world_size, jm->cfg.max_ranks - free_ranks,
                     jm->cfg.max_ranks);
            blocked = j;
        } else {
            snprintf(why, sizeof why, "waiting for %d free GPU(s): %d of --gpus %d in use",
                     gpus_needed(jm, j), jm->gpus.n - free_gpus, jm->gpus.n);
            blocked = j;
        }
        set_wait_reason(jm, j, why);
    }
}

/* The supervisor thread's periodic tick, and the only place where queued jobs start. Once the
 * daemon is stopping it starts nothing: the ranks that the running jobs free while they stop
 * must not go to a queued job, which stays QUEUED for the next daemon. */
static void on_tick(void *ctx) {
    zt_jobs *jm = ctx;
    pthread_mutex_lock(&jm->mu);
    if (!jm->stopping)
        zt_jm_schedule(jm, true);
    zt_jm_check_stalls(jm);
    pthread_mutex_unlock(&jm->mu);
}

/* ------------------------------------------------------------------------------------------ */
/* Supervisor callbacks (supervisor thread)                                                    */

static void on_metrics_line(void *group_ctx, const char *line) {
    job *j = group_ctx;
    zt_jobs *jm = j->jm;
    /* Parsed and printed before the lock is taken: neither needs the job. A record is kept as
     * cJSON prints it, not as it came: what clients get is then valid JSON whatever followed
     * the object on the line. */
    cJSON *obj = cJSON_Parse(line);
    bool is_record = cJSON_IsObject(obj) && !cJSON_GetObjectItemCaseSensitive(obj, "event");
    char *text = is_record ? cJSON_PrintUnformatted(obj) : NULL;
    pthread_mutex_lock(&jm->mu);
    const cJSON *event = cJSON_GetObjectItemCaseSensitive(obj, "event");
    if (cJSON_IsObject(obj))
        zt_jm_job_progress(j);
    if (!cJSON_IsObject(obj)) {
        zt_jm_daemon_log(jm, j, "ignored a malformed metrics line: %.200s", line);
    } else if (cJSON_IsString(event) && strcmp(event->valuestring, "anomaly") == 0) {
        zt_jm_anomaly_line(jm, j, obj);
    } else if (!is_record) {
        const cJSON *max = cJSON_GetObjectItemCaseSensitive(obj, "max_steps");
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "train/global_step");
        if (cJSON_IsNumber(max))
            j->info.max_steps = (int64_t)max->valuedouble;
        if (cJSON_IsNumber(step) && (int64_t)step->valuedouble > j->info.step)
            j->info.step = (int64_t)step->valuedouble;
        if (j->info.state == ZT_JOB_STARTING)
            zt_jm_set_state(jm, j, ZT_JOB_RUNNING);
        else
            zt_jm_persist(jm, j);
    } else {
        zt_metric_record r;
        zt_jm_add_record(j, obj, text ? text : "{}", zt_jm_now_ms(), &r);
        zt_jm_store_result(jm, zt_store_add_record(jm->store, j->info.id, &r));
        if (j->info.state == ZT_JOB_STARTING)
            zt_jm_set_state(jm, j, ZT_JOB_RUNNING);
        zt_job_event ev = {.kind = ZT_EVENT_METRICS, .record = &r};
        zt_jm_notify(j, &ev);
    }
    pthread_mutex_unlock(&jm->mu);
    free(text);
    cJSON_Delete(obj);
}

static void on_log_line(void *group_ctx, int rank, const char *stream, const char *line) {
    job *j = group_ctx;
    zt_jobs *jm = j->jm;
    pthread_mutex_lock(&jm->mu);
    zt_log_line l = {.seq = zt_history_next_seq(j->history), .time_ms = zt_jm_now_ms(),
                     .rank = rank, .stream = stream, .text = line};
    zt_history_add_log(j->history, &l);
    if (rank >= 0 && strcmp(stream, "stderr") == 0 && line[0])
        zt_jm_set_str(&j->last_stderr[rank], line);
    zt_jm_store_result(jm, zt_store_add_log(jm->store, j->info.id, &l, LOG_KEEP));
    zt_job_event ev = {.kind = ZT_EVENT_LOG, .log = &l};
    zt_jm_notify(j, &ev);
    pthread_mutex_unlock(&jm->mu);
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
    zt_rank_exit x = {.pid = pid, .exit_status = exit_code, .term_signal = sig};
    bool failed = zt_rank_exit_is_failure(&x, ZT_RANK_SENT_NONE);
    char what[1400];
    zt_rank_describe_exit(what, sizeof what, rank, host, &x, failed ? j->last_stderr[rank] : NULL);
    if (failed && j->failed_rank < 0) {
        j->failed_rank = rank;
        zt_jm_set_str(&j->fail_reason, what);
    }
    zt_jm_daemon_log(jm, j, "%s", what);
    zt_jm_persist(jm, j);
    zt_jm_notify_state(j);
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
    zt_jm_set_str(&j->hosts[rank], host);
    /* The placement line is the rank's first stderr line, not what it died saying. */
    free(j->last_stderr[rank]);
    j->last_stderr[rank] = NULL;
    zt_jm_daemon_log(jm, j, "rank %d runs on %s (pid %ld)", rank, host, (long)pid);
    zt_jm_persist(jm, j);
    zt_jm_notify_state(j);
    pthread_mutex_unlock(&jm->mu);
}

static void on_launch_event(void *group_ctx, zt_launch_event ev, const char *text) {
    job *j = group_ctx;
    zt_jobs *jm = j->jm;
    pthread_mutex_lock(&jm->mu);
    zt_jm_daemon_log(jm, j, "%s", text);
    if (ev == ZT_LAUNCH_WAITING && j->info.state == ZT_JOB_STARTING) {
        zt_jm_set_reason(j, "%s", text);
        zt_jm_persist(jm, j);
        zt_jm_notify_state(j);
    } else if (ev == ZT_LAUNCH_ALLOCATED && j->info.state == ZT_JOB_STARTING) {
        zt_jm_set_reason(j, "%s", "");
        zt_jm_persist(jm, j);
        zt_jm_notify_state(j);
    } else if ((ev == ZT_LAUNCH_STOPPED || ev == ZT_LAUNCH_FAILED) && !j->launch_reason) {
        j->launch_reason = zt_jm_strdup(text);
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

/* Whether the ranks wrote a checkpoint since they started: `latest` is there and is not the
 * file it was then. */
static bool wrote_checkpoint(const job *j) {
    struct stat now = latest_now(j);
    const struct stat *then = &j->latest_at_start;
    return now.st_ino && (now.st_dev != then->st_dev || now.st_ino != then->st_ino ||
                          now.st_mtim.tv_sec != then->st_mtim.tv_sec ||
                          now.st_mtim.tv_nsec != then->st_mtim.tv_nsec);
}

/* What ranks that all stopped cleanly on a request left: the checkpoint they wrote, or none. A
 * rank stopped before the ranks have met exits as cleanly as one that wrote its checkpoint (130,
 * ztrain_worker.c); ranks that wrote none stopped before training began (or, resumed, before
 * they trained a step past the checkpoint they started from). */
static void stop_outcome(const job *j, char *buf, size_t size) {
    char ckpt[300];
    checkpoint_note(j, ckpt, sizeof ckpt);
    if (wrote_checkpoint(j))
        snprintf(buf, size, "the ranks wrote a checkpoint and stopped%s", ckpt);
    else
        snprintf(buf, size, "the ranks stopped before training began, without writing a "
                 "checkpoint%s%s", ckpt[0] ? "; the newest is still the one they started from" :
                 "", ckpt);
}

/* Why a cancelled job's ranks did not all stop cleanly: the grace period in force ran out (a
 * later cancel asking for a longer one does not extend it, and the supervisor says which one it
 * was), or a rank failed on its own on the way out. */
static void stop_failure(const job *j, const zt_group_end *end, char *buf, size_t size) {
    const zt_rank_info *first = j->failed_rank >= 0 ? &j->info.ranks[j->failed_rank] : NULL;
    if (end->killed && (!first || first->signal == SIGKILL))
        snprintf(buf, size, "the ranks did not stop within the grace period of %g s and were "
                 "killed", round(end->grace_s * 10) / 10);
    else if (j->fail_reason)
        snprintf(buf, size, "the ranks did not stop cleanly: %s", j->fail_reason);
    else
        snprintf(buf, size, "the ranks did not stop cleanly");
}

/* The rank that failed first may only have given up waiting for a peer that was stopped
 * (zt_group_end.stuck_rank): that peer becomes the failed rank, and the reason blames it, as
 * `ztrain run` does. */
static void blame_stuck_rank(job *j, const zt_group_end *end) {
    if (end->stuck_rank < 0 || end->stuck_rank >= j->info.world_size)
        return;
    char line[1600];
    zt_rank_describe_stuck(line, sizeof line, end->stuck_rank, end->stuck_pid, true,
                           RANK_FAIL_GRACE_S, j->fail_reason ? j->fail_reason : "");
    zt_jm_set_str(&j->fail_reason, line);
    j->failed_rank = end->stuck_rank;
}

/* The final state, once every rank is reaped: a cancel request wins, then the first failure. */
static void on_group_ended(void *group_ctx, const zt_group_end *end) {
    job *j = group_ctx;
    zt_jobs *jm = j->jm;
    pthread_mutex_lock(&jm->mu);
    j->group = NULL;
    if (end->offload_dirs && end->offload_dirs[0])
        zt_jm_daemon_log(jm, j, "removed the NVMe offload directories that killed ranks left "
                         "behind: %s", end->offload_dirs);
    jm->ranks_in_use -= j->info.world_size;
    zt_gpu_pool_release(&jm->gpus, j->info.id);
    bool all_zero = true, all_stopped = true;
    for (int r = 0; r < j->info.world_size; r++) {
        const zt_rank_info *ri = &j->info.ranks[r];
        all_zero &= ri->signal == 0 && ri->exit_code == 0;
        zt_rank_exit x = {.exit_status = ri->exit_code, .term_signal = ri->signal};
        all_stopped &= !zt_rank_exit_is_failure(&x, ZT_RANK_SENT_NONE);
    }
    char ckpt[300], outcome[512];
    checkpoint_note(j, ckpt, sizeof ckpt);
    stop_outcome(j, outcome, sizeof outcome);
    bool wrote = wrote_checkpoint(j), any_started = false;
    for (int r = 0; r < j->info.world_size; r++)
        any_started |= j->info.ranks[r].pid != 0;
    if (j->cancel_requested && !any_started) {
        zt_jm_set_reason(j, "cancelled by request before Slurm started the ranks");
        zt_jm_set_state(jm, j, ZT_JOB_CANCELLED);
    } else if (j->cancel_requested) {
        char why[1600];
        stop_failure(j, end, why, sizeof why);
        if (j->shutdown && all_stopped && wrote)
            zt_jm_set_reason(j, "ztraind was stopped: the job stopped with a checkpoint%s", ckpt);
        else if (j->shutdown)
            zt_jm_set_reason(j, "ztraind was stopped: %s", all_stopped ? outcome : why);
        else if (j->force)
            zt_jm_set_reason(j, "cancelled by request (forced: the ranks were killed at once)");
        else if (all_stopped)
            zt_jm_set_reason(j, "cancelled by request: %s", outcome);
        else
            zt_jm_set_reason(j, "cancelled by request; %s", why);
        zt_jm_set_state(jm, j, ZT_JOB_CANCELLED);
    } else if (j->launch_reason) {
        /* Slurm's decision explains the ranks' ends, not the other way round. */
        if (j->failed_rank >= 0)
            zt_jm_set_reason(j, "%s; first failure: %s", j->launch_reason, j->fail_reason);
        else if (all_stopped && wrote)
            zt_jm_set_reason(j, "%s; %s", j->launch_reason, outcome);
        else
            zt_jm_set_reason(j, "%s", j->launch_reason);
        /* A failure of Slurm's (a node lost) is one of the attempt's: restarts may mend it. */
        if (!j->launch_failed)
            zt_jm_set_state(jm, j, ZT_JOB_CANCELLED);
        else if (!zt_jm_restart(jm, j))
            zt_jm_set_state(jm, j, ZT_JOB_FAILED);
    } else if (j->failed_rank >= 0) {
        blame_stuck_rank(j, end);
        zt_jm_set_reason(j, "%s", j->fail_reason);
        if (!zt_jm_restart(jm, j))
            zt_jm_set_state(jm, j, ZT_JOB_FAILED);
    } else if (all_zero) {
        zt_jm_set_state(jm, j, ZT_JOB_SUCCEEDED);
    } else {
        zt_jm_set_reason(j, "the ranks were stopped by a signal from outside ztraind at step "
                            "%lld", (long long)j->info.step);
        zt_jm_set_state(jm, j, ZT_JOB_CANCELLED);
    }
    pthread_mutex_unlock(&jm->mu);
    zt_supervisor_wake(jm->sup);
}

/* The supervisor's own problems go to ztraind's log as warnings. */
static void on_warning(void *ctx, const char *text) {
    (void)ctx;
    zt_oplog(ZT_LOG_WARNING, "%s\n", text);
}

const zt_supervisor_callbacks zt_jm_supervisor_callbacks = {
    .tick = on_tick, .metrics_line = on_metrics_line, .log_line = on_log_line,
    .rank_exited = on_rank_exited, .rank_placed = on_rank_placed,
    .launch_event = on_launch_event, .group_ended = on_group_ended, .warning = on_warning,
};
