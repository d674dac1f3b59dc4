/* The job manager (job_manager.h): the job table, submitting, queries, cancel, and the manager's
 * start (loading the store, failing the jobs the previous daemon left running) and stop. The
 * queue and what the supervisor reports are job_runner.c's, history queries job_metrics.c's,
 * watchers job_watch.c's; what they share is in job_manager_internal.h. */
#define _GNU_SOURCE
#include "job_manager.h"
#include "oplog.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ztrain/fsutil.h"
#include "job_events.h"
#include "job_manager_internal.h"
#include "spec_check.h"
#include "ranks/strfmt.h"
#include "ztrain/text.h"
#include "ztrain/job_spec.h"

/* ------------------------------------------------------------------------------------------ */
/* States, and the job table                                                                   */

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

void zt_jm_set_reason(job *j, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = zt_vstrfmt(fmt, ap);
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
    zt_jm_free_attempts(j);
    memset(j, 0, sizeof *j);
}

/* What changes in a job: its numbers, reason and ranks. The strings that never change are left
 * NULL for info_copy_fixed, which needs no lock. */
static void info_copy_changing(zt_job_info *dst, const zt_job_info *src) {
    *dst = *src;
    dst->name = dst->spec_json = dst->idempotency_key = dst->run_dir = dst->checkpoint_dir = NULL;
    dst->reason = zt_jm_strdup(src->reason);
    dst->ranks = calloc((size_t)src->world_size, sizeof *dst->ranks);
    ZT_ASSERT(dst->ranks);
    memcpy(dst->ranks, src->ranks, (size_t)src->world_size * sizeof *dst->ranks);
    zt_jm_copy_attempts(dst, src);
}

static void info_copy_fixed(zt_job_info *dst, const zt_job_info *src) {
    dst->name = zt_jm_strdup(src->name);
    dst->spec_json = zt_jm_strdup(src->spec_json);
    dst->idempotency_key = zt_jm_strdup(src->idempotency_key);
    dst->run_dir = zt_jm_strdup(src->run_dir);
    dst->checkpoint_dir = zt_jm_strdup(src->checkpoint_dir);
}

static void info_copy(zt_job_info *dst, const zt_job_info *src) {
    info_copy_changing(dst, src);
    info_copy_fixed(dst, src);
}

static void job_free(job *j) {
    zt_history_destroy(j->history);
    zt_jm_free_watches(j);
    for (int r = 0; j->last_stderr && r < j->info.world_size; r++)
        free(j->last_stderr[r]);
    free(j->last_stderr);
    for (int r = 0; j->hosts && r < j->info.world_size; r++)
        free(j->hosts[r]);
    free(j->hosts);
    free(j->fail_reason);
    free(j->launch_reason);
    free(j->orphans);
    free(j->restart_why);
    zt_jm_job_events_free(j);
    zt_job_info_free(&j->info);
    free(j);
}

static job *job_alloc(const zt_job_info *src) {
    job *j = calloc(1, sizeof *j);
    ZT_ASSERT(j);
    info_copy(&j->info, src);
    j->history = zt_history_create(LOG_RING, ZT_JOBS_RECORD_CACHE);
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
job *zt_jm_find_job(zt_jobs *jm, const char *id) {
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

zt_status zt_jm_not_found(const char *id) {
    /* Errors name a job by its resource name, as the API does everywhere (docs/api.md). */
    return zt_error(ZT_ERR_NOT_FOUND, "jobs/%s not found", id ? id : "(none)");
}

static void add_job(zt_jobs *jm, job *j) {
    if (jm->n_jobs == jm->cap_jobs) {
        jm->cap_jobs = jm->cap_jobs ? 2 * jm->cap_jobs : 64;
        jm->jobs = realloc(jm->jobs, (size_t)jm->cap_jobs * sizeof *jm->jobs);
        ZT_ASSERT(jm->jobs);
    }
    j->jm = jm;
    /* A fork takes its number before its checkpoint is placed (submit_as), and a submit after it
     * may finish first: each job goes in at its number's place (nearly always the end), so that the table
     * stays sorted for zt_jm_find_job's binary search. */
    int at = jm->n_jobs;
    while (at > 0 && jm->jobs[at - 1]->number > j->number)
        at--;
    memmove(&jm->jobs[at + 1], &jm->jobs[at], (size_t)(jm->n_jobs - at) * sizeof *jm->jobs);
    jm->jobs[at] = j;
    jm->n_jobs++;
    if (j->number > jm->last_number)
        jm->last_number = j->number;
}

void zt_jm_store_result(zt_jobs *jm, zt_status s) {
    if (s == ZT_OK) {
        if (jm->store_failing)
            zt_oplog(ZT_LOG_INFO, "the state file is written again (%ld later failed "
                     "write(s) not reported)\n", jm->store_failures_unsaid);
        jm->store_failing = false;
        jm->store_failures_unsaid = 0;
        return;
    }
    /* A full disk fails every write, one per log line and record: the first failure is
     * reported, the ones after it are counted until a write succeeds. */
    if (jm->store_failing) {
        jm->store_failures_unsaid++;
        return;
    }
    jm->store_failing = true;
    zt_oplog(ZT_LOG_ERR, "%s (the jobs go on; what is not written is lost when ztraind "
             "restarts)\n", zt_last_error());
}

void zt_jm_persist(zt_jobs *jm, const job *j) {
    zt_jm_store_result(jm, zt_store_put_job(jm->store, &j->info));
}

/* ztraind's line for the operator on the job's new state: a failure is an error, a restart a
 * warning. The name and reason are escaped: they hold what users and ranks wrote. */
static void log_state(const job *j) {
    char name[512], reason[2048];
    zt_oplog_escape(name, sizeof name, j->info.name ? j->info.name : "");
    zt_oplog_escape(reason, sizeof reason, j->info.reason);
    zt_job_state s = j->info.state;
    zt_log_level level = s == ZT_JOB_FAILED   ? ZT_LOG_ERR
                         : s == ZT_JOB_QUEUED && reason[0] ? ZT_LOG_WARNING
                                                           : ZT_LOG_INFO;
    zt_oplog(level, "job %s \"%s\": %s%s%s\n", j->info.id, name, zt_job_state_name(s),
             reason[0] ? ": " : "", reason);
}

void zt_jm_set_state(zt_jobs *jm, job *j, zt_job_state s) {
    if (zt_job_state_terminal(j->info.state))
        return;
    bool changed = j->info.state != s;
    j->info.state = s;
    if (changed)
        log_state(j);
    /* An ended job's history is read from the store: its newest records need not stay. */
    if (zt_job_state_terminal(s)) {
        zt_jm_attempt_ended(jm, j, s == ZT_JOB_FAILED);
        j->info.finished_ms = zt_jm_now_ms();
        zt_history_drop_records(j->history);
    }
    zt_jm_persist(jm, j);
    zt_jm_notify_state(j);
    if (zt_job_state_terminal(s))
        zt_jm_job_ended(jm, j);
}

/* ------------------------------------------------------------------------------------------ */
/* Metric records and log lines                                                                */

/* The job's info after a record: its step, and the last loss and throughput. */
static void take_numbers(job *j, const cJSON *obj, int64_t step) {
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(obj, "train/loss");
    const cJSON *tps = cJSON_GetObjectItemCaseSensitive(obj, "perf/tokens_per_second");
    if (cJSON_IsNumber(loss))
        j->info.loss = loss->valuedouble;
    if (cJSON_IsNumber(tps))
        j->info.tokens_per_second = tps->valuedouble;
    j->info.n_records = zt_history_n_records(j->history);
    if (j->info.ranks)
        zt_rank_figures_take(j->info.ranks, j->info.world_size, obj);
    /* The newest record's step: a run resumed from an earlier checkpoint is at its own step. */
    j->info.step = step;
}

void zt_jm_add_record(job *j, const cJSON *obj, const char *text, int64_t time_ms,
                      zt_metric_record *out) {
    zt_history_add_record(j->history, obj, text, time_ms, j->info.step, out);
    take_numbers(j, obj, out->step);
}

void zt_jm_daemon_log(zt_jobs *jm, job *j, const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    zt_log_line l = {.seq = zt_history_next_seq(j->history), .time_ms = zt_jm_now_ms(),
                     .rank = -1, .stream = "ztraind", .text = text};
    zt_history_add_log(j->history, &l);
    zt_jm_store_result(jm, zt_store_add_log(jm->store, j->info.id, &l, LOG_KEEP));
    zt_job_event ev = {.kind = ZT_EVENT_LOG, .log = &l};
    zt_jm_notify(j, &ev);
}

/* ------------------------------------------------------------------------------------------ */
/* Submitting                                                                                  */

/* What the DeepSpeed config resolved to and its warnings, once per job, in the job's log as
 * ztraind's own lines (the ranks are started with --validated and print none of it). */
static void log_config_notes(zt_jobs *jm, job *j, const zt_job_spec *spec) {
    const char *texts[] = {spec->ds.resolved, spec->ds.warnings};
    for (int i = 0; i < 2; i++) {
        for (const char *line = texts[i]; *line;) {
            const char *end = strchr(line, '\n');
            int len = end ? (int)(end - line) : (int)strlen(line);
            zt_jm_daemon_log(jm, j, "%.*s", len, line);
            line += len + (end ? 1 : 0);
        }
    }
}

/* The job that idempotency key `key` names for submitter `by` (NULL: a daemon without tokens):
 * keys are each token's own, so that another token's job is never the answer to a retry, and a
 * key another token took is still free. */
static job *find_by_key(zt_jobs *jm, const char *key, const zt_submitter *by) {
    if (!key || !key[0])
        return NULL;
    const char *who = by ? by->identity : "";
    for (int i = jm->n_jobs - 1; i >= 0; i--)
        if (strcmp(jm->jobs[i]->info.idempotency_key, key) == 0 &&
            strcmp(jm->jobs[i]->info.submitter.identity, who) == 0)
            return jm->jobs[i];
    return NULL;
}

static int live_jobs(const zt_jobs *jm) {
    int n = 0;
    for (int i = 0; i < jm->n_jobs; i++)
        n += !zt_job_state_terminal(jm->jobs[i]->info.state);
    return n;
}

static zt_status too_many_jobs(const zt_jobs *jm) {
    return zt_error(ZT_ERR_LIMIT, "the server already has %d queued or running jobs (its limit)",
                    jm->cfg.max_jobs);
}

/* A key is echoed in messages and shown next to the job: printable text of bounded length. */
static zt_status check_key(const char *key) {
    size_t n = strlen(key), at;
    char why[ZT_TEXT_WHY_SIZE];
    if (n > ZT_IDEMPOTENCY_KEY_MAX)
        return zt_error(ZT_ERR_INVALID, "idempotency_key: %zu bytes is above the limit of %d", n,
                        ZT_IDEMPOTENCY_KEY_MAX);
    if (!zt_text_check(key, n, ZT_TEXT_PRINTABLE, &at, why))
        return zt_error(ZT_ERR_INVALID, "idempotency_key: %s at byte %zu (a key is printable "
                        "UTF-8 text)", why, at);
    return ZT_OK;
}

static zt_status check_spec(zt_jobs *jm, const char *spec_json, const char *id, char **text,
                            zt_job_spec *spec) {
    zt_spec_limits limits = {.data_root = jm->cfg.data_root, .runs_root = jm->cfg.runs_root,
                             .max_world_size = jm->cfg.max_world_size,
                             .max_ranks = jm->cfg.max_ranks,
                             .max_nodes = jm->cfg.slurm ? 0 : 1,
                             .max_rank_bytes = jm->cfg.max_rank_bytes,
                             .max_job_bytes = jm->cfg.max_job_bytes,
                             .host_bytes = jm->cfg.host_bytes, .host_name = jm->cfg.host_name,
                             .max_device_bytes = jm->cfg.max_device_bytes,
                             .gpu_bytes = jm->cfg.gpu_bytes, .gpu_name = jm->cfg.gpu_name,
                             .gpus = jm->cfg.slurm ? -1 : jm->gpus.n,
                             .webhooks = jm->cfg.webhook_policy};
    return zt_spec_check(spec_json, id, &limits, text, spec);
}

/* Whether path a is b or lies under it (both absolute and resolved). */
static bool under(const char *a, const char *b) {
    size_t n = strlen(b);
    return strncmp(a, b, n) == 0 && (a[n] == '/' || a[n] == '\0');
}

/* Whether the submitter `by` may write where the ended job `o` first wrote its checkpoints: on
 * a daemon without tokens (by NULL) anyone, else an admin, or the token that submitted `o` (so
 * that an admin's resume of it leaves it that token's). A job from before jobs recorded their
 * submitter is nobody's, as for cancelling it. */
static bool may_write_after(const zt_job_info *o, const zt_submitter *by) {
    return !by || strcmp(by->scope, "admin") == 0 ||
           (o->submitter.identity[0] && strcmp(o->submitter.identity, by->identity) == 0);
}

/* The job other than `id` that first wrote where `ckpt` lies (the lock held): the oldest whose
 * checkpoint or run directory overlaps it, or NULL. */
static const zt_job_info *first_writer(const zt_jobs *jm, const char *id, const char *ckpt) {
    const zt_job_info *first = NULL;
    for (int i = 0; i < jm->n_jobs; i++) {
        const zt_job_info *o = &jm->jobs[i]->info;
        bool overlaps = (o->checkpoint_dir && (under(ckpt, o->checkpoint_dir) ||
                                               under(o->checkpoint_dir, ckpt))) ||
                        (o->run_dir && (under(ckpt, o->run_dir) || under(o->run_dir, ckpt)));
        if (overlaps && strcmp(o->id, id) != 0 && (!first || o->created_ms < first->created_ms))
            first = o;
    }
    return first;
}

/* Whether a new job `id` of submitter `by` may write its checkpoints in `ckpt` (the lock
 * held): never where a job that is not over writes its own, nor inside another job's run
 * directory, except that job's own checkpoint directory once it has ended (resuming it is how
 * a job continues), and that only for the token that submitted it or an admin. Were any of it
 * allowed, the other job's `latest` could name a checkpoint it never wrote and its next
 * restart would resume from it (issue 34, defect 7), another token's weights included. */
static zt_status check_ckpt_dir(const zt_jobs *jm, const char *id, const char *ckpt,
                                const zt_submitter *by) {
    const zt_job_info *first = first_writer(jm, id, ckpt);
    if (first && zt_job_state_terminal(first->state) && !may_write_after(first, by)) {
        bool in_ckpt = first->checkpoint_dir && (under(ckpt, first->checkpoint_dir) ||
                                                 under(first->checkpoint_dir, ckpt));
        return zt_error(ZT_ERR_PERMISSION, "train.checkpoint_dir: %s overlaps the %s of "
                        "jobs/%s, which %s submitted; this token's scope is %s: it writes "
                        "only into the checkpoints of jobs it submitted (fork_from reads "
                        "another's), writing into this one needs admin", ckpt,
                        in_ckpt ? "checkpoint directory" : "run directory", first->id,
                        first->submitter.identity[0] ? "another token" : "no recorded token",
                        by->scope);
    }
    for (int i = 0; i < jm->n_jobs; i++) {
        const zt_job_info *o = &jm->jobs[i]->info;
        if (strcmp(o->id, id) == 0)
            continue;
        bool live = !zt_job_state_terminal(o->state);
        bool in_ckpt = o->checkpoint_dir && (under(ckpt, o->checkpoint_dir) ||
                                             under(o->checkpoint_dir, ckpt));
        bool in_run = o->run_dir && (under(ckpt, o->run_dir) || under(o->run_dir, ckpt));
        if (live && (in_ckpt || in_run))
            return zt_error(ZT_ERR_INVALID, "train.checkpoint_dir: %s overlaps the %s of jobs/%s, "
                            "which is %s; a job writes only its own checkpoints", ckpt,
                            in_ckpt ? "checkpoint directory" : "run directory", o->id,
                            zt_job_state_name(o->state));
        if (in_run && !(o->checkpoint_dir && strcmp(ckpt, o->checkpoint_dir) == 0))
            return zt_error(ZT_ERR_INVALID, "train.checkpoint_dir: %s %s the run directory of "
                            "jobs/%s (%s); only that job's checkpoint directory (%s) may be "
                            "resumed from once it has ended", ckpt,
                            under(ckpt, o->run_dir) ? "is inside" : "contains", o->id,
                            o->run_dir, o->checkpoint_dir ? o->checkpoint_dir : "none");
    }
    return ZT_OK;
}

/* Whether a new job `id` may write a DeepSpeed monitor's files (`field`, e.g. "tensorboard") in
 * `dir` (the lock held): never inside another job's run or checkpoint directory, where its event
 * files would join that job's TensorBoard export and its CSV files that job's directory. */
static zt_status check_monitor_dir(const zt_jobs *jm, const char *id, const char *field,
                                   const zt_monitor_output *m) {
    for (int i = 0; m->enabled && i < jm->n_jobs; i++) {
        const zt_job_info *o = &jm->jobs[i]->info;
        if (strcmp(o->id, id) == 0)
            continue;
        bool in_run = o->run_dir && under(m->dir, o->run_dir);
        if (in_run || (o->checkpoint_dir && under(m->dir, o->checkpoint_dir)))
            return zt_error(ZT_ERR_INVALID, "deepspeed.%s output_path/job_name: %s is inside the "
                            "%s of jobs/%s; a job writes its monitor files only outside other "
                            "jobs' directories (by default in its own run directory)", field,
                            m->dir, in_run ? "run directory" : "checkpoint directory", o->id);
    }
    return ZT_OK;
}

/* Whether the directories a new job writes (checkpoints, monitor files) leave other jobs' alone
 * (the lock held). */
static zt_status check_write_dirs(const zt_jobs *jm, const char *id, const zt_job_spec *spec,
                                  const zt_submitter *by) {
    if (spec->train.checkpoint_dir)
        ZT_TRY(check_ckpt_dir(jm, id, spec->train.checkpoint_dir, by));
    ZT_TRY(check_monitor_dir(jm, id, "tensorboard", &spec->ds.monitor.tensorboard));
    return check_monitor_dir(jm, id, "csv_monitor", &spec->ds.monitor.csv);
}

/* Whether two resolved specs say the same thing: the same keys with the same values, in any
 * order (cJSON_Compare), so that a client's retry matches however it orders its DeepSpeed
 * config. */
static bool same_spec(const char *a, const char *b) {
    cJSON *ja = cJSON_Parse(a), *jb = cJSON_Parse(b);
    bool same = ja && jb && cJSON_Compare(ja, jb, true);
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    return same;
}

/* The answer to a submit whose key names a job already: that job when the spec is the same one,
 * else ZT_ERR_CONFLICT. "The same" is judged on the specs as resolved, the new one resolved as if
 * it were that job (its id names the default checkpoint directory), so a path written
 * differently but leading to the same file, or keys in another order, is still the same job. */
static zt_status answer_known_key(zt_jobs *jm, const char *spec_json, const char *key,
                                  const char *known_id, const char *known_spec,
                                  zt_job_info *info) {
    char *text = NULL;
    zt_job_spec spec;
    zt_status s = check_spec(jm, spec_json, known_id, &text, &spec);
    if (s != ZT_OK)
        return s;
    zt_job_spec_free(&spec);
    s = zt_jm_fork_resume(&text);
    if (s != ZT_OK) {
        free(text);
        return s;
    }
    bool same = same_spec(text, known_spec);
    free(text);
    if (!same)
        return zt_error(ZT_ERR_CONFLICT, "idempotency_key '%s' was used for jobs/%s with a "
                        "different spec; a new job needs a new key", key, known_id);
    return zt_jobs_get(jm, known_id, info);
}

/* Called with the lock held, which it releases: the known job's id and resolved spec are copied
 * first, since resolving the new spec touches the file system and must not hold up the others. */
static zt_status answer_known_job(zt_jobs *jm, const char *spec_json, const char *key,
                                  const job *known, zt_job_info *info) {
    char id[sizeof known->info.id];
    snprintf(id, sizeof id, "%s", known->info.id);
    char *known_spec = zt_jm_strdup(known->info.spec_json);
    pthread_mutex_unlock(&jm->mu);
    zt_status s = answer_known_key(jm, spec_json, key, id, known_spec, info);
    free(known_spec);
    return s;
}

zt_status zt_jobs_submit(zt_jobs *jm, const char *spec_json, const char *idempotency_key,
                         zt_job_info *info) {
    return zt_jobs_submit_by(jm, spec_json, idempotency_key, NULL, info);
}

/* Judges the spec as job number `number` and adds the job, with the lock not held on entry nor
 * on return. The number is only taken under the lock of the insert, so a refused spec takes
 * none and ids stay dense; *raced says that another submit took it while the spec was judged
 * (nothing was added), and the caller tries again with the next number. */
static zt_status submit_as(zt_jobs *jm, const char *spec_json, const char *key,
                           const zt_submitter *by, long long number, zt_job_info *info,
                           bool *raced) {
    /* The id is known before the spec is judged: the default checkpoint directory names it. */
    char id[sizeof ((zt_job_info *)0)->id];
    snprintf(id, sizeof id, "job-%06lld", number % 1000000000000LL);
    char *text = NULL;
    zt_job_spec spec;
    zt_status s = check_spec(jm, spec_json, id, &text, &spec);
    if (s != ZT_OK)
        return s;
    /* A fork's checkpoint is put in the directory its id names (the default one) before the
     * job is added: its number is taken once the fork is judged, just before the files are
     * placed, so that no other job gets that directory. Only a failure to place them (an I/O
     * error) then leaves a gap in the numbering. */
    bool taken = false;
    if (spec.fork_job) {
        s = zt_jm_prepare_fork(jm, &spec, false);
        if (s == ZT_OK) {
            pthread_mutex_lock(&jm->mu);
            *raced = jm->last_number + 1 != number;
            if (!*raced)
                jm->last_number = number;
            pthread_mutex_unlock(&jm->mu);
            taken = !*raced;
        }
        if (s == ZT_OK && taken)
            s = zt_jm_prepare_fork(jm, &spec, true);
        if (s == ZT_OK && taken)
            s = zt_jm_fork_resume(&text);
        if (s != ZT_OK || *raced) {
            free(text);
            zt_job_spec_free(&spec);
            return s;
        }
    }
    zt_job_info ji = {.name = spec.name, .state = ZT_JOB_QUEUED, .reason = "",
                      .spec_json = text, .idempotency_key = (char *)key,
                      .world_size = spec.world_size, .created_ms = zt_jm_now_ms(),
                      .max_steps = spec.train.max_steps,
                      .checkpoint_dir = spec.train.checkpoint_dir,
                      .max_restarts = spec.max_restarts};
    if (by)
        ji.submitter = *by;
    snprintf(ji.id, sizeof ji.id, "%s", id);
    snprintf(ji.device, sizeof ji.device, "%s", spec.device == ZT_DEVICE_CUDA ? "cuda" : "cpu");
    snprintf(ji.comm, sizeof ji.comm, "%s", zt_comm_for_nodes(spec.comm, spec.nodes));
    ji.grid = zt_grid_of_spec_json(text);
    char run_dir[PATH_MAX];
    snprintf(run_dir, sizeof run_dir, "%s/%s", jm->cfg.runs_root, id);
    ji.run_dir = run_dir;
    zt_rank_info *ranks = calloc((size_t)spec.world_size, sizeof *ranks);
    ZT_ASSERT(ranks);
    for (int r = 0; r < spec.world_size; r++)
        ranks[r].rank = r;
    ji.ranks = ranks;

    pthread_mutex_lock(&jm->mu);
    /* A twin with the same key may have won the race while the spec was checked: its answer is
     * the answer. */
    job *twin = find_by_key(jm, key, by);
    *raced = !twin && !taken && jm->last_number + 1 != number;
    bool full = !twin && !*raced && live_jobs(jm) >= jm->cfg.max_jobs;
    /* Judged under the same lock as the insert: two submits cannot take one directory. */
    zt_status ck = twin || *raced || full ? ZT_OK : check_write_dirs(jm, id, &spec, by);
    /* The job is written to the state file before it exists anywhere else: a job the file does
     * not hold would run, then vanish at the next restart and its id go to another job, which
     * would append to its run directory. */
    zt_status saved = ZT_OK;
    char unsaved[512] = "";
    if (!twin && !*raced && !full && ck == ZT_OK) {
        job *j = job_alloc(&ji);
        saved = zt_store_put_job(jm->store, &j->info);
        if (saved != ZT_OK)
            snprintf(unsaved, sizeof unsaved, "%s", zt_last_error());
        zt_jm_store_result(jm, saved);
        if (saved == ZT_OK) {
            jm->last_number = number;
            add_job(jm, j);
            log_state(j);
            log_config_notes(jm, j, &spec);
            zt_jm_schedule(jm, false);
            info_copy(info, &j->info);
        } else {
            job_free(j);
        }
    }
    free(ranks);
    free(text);
    zt_job_spec_free(&spec);
    if (twin)
        return answer_known_job(jm, spec_json, key, twin, info);   /* unlocks */
    pthread_mutex_unlock(&jm->mu);
    if (*raced)
        return ZT_OK;
    if (full)
        return too_many_jobs(jm);
    if (ck != ZT_OK)
        return ck;
    if (saved != ZT_OK)
        return zt_error(ZT_ERR_UNAVAILABLE, "the job was not queued: ztraind cannot write its "
                        "state file (%s); free space there and submit again", unsaved);
    zt_supervisor_wake(jm->sup);
    return ZT_OK;
}

zt_status zt_jobs_submit_by(zt_jobs *jm, const char *spec_json, const char *idempotency_key,
                            const zt_submitter *by, zt_job_info *info) {
    size_t limit = jm->cfg.max_spec_bytes ? jm->cfg.max_spec_bytes : 1 << 20;
    if (strlen(spec_json) > limit)
        return zt_error(ZT_ERR_LIMIT, "spec: %zu bytes is above the limit of %zu",
                        strlen(spec_json), limit);
    const char *key = idempotency_key ? idempotency_key : "";
    ZT_TRY(check_key(key));
    for (;;) {
        pthread_mutex_lock(&jm->mu);
        job *known = find_by_key(jm, key, by);
        if (known)
            return answer_known_job(jm, spec_json, key, known, info);   /* unlocks */
        /* Checked here so that a full server says so before the spec is judged, and again in
         * submit_as, under the same lock as the insert, so that concurrent submits cannot pass
         * it together. */
        if (live_jobs(jm) >= jm->cfg.max_jobs) {
            pthread_mutex_unlock(&jm->mu);
            return too_many_jobs(jm);
        }
        long long number = jm->last_number + 1;
        pthread_mutex_unlock(&jm->mu);
        bool raced = false;
        zt_status s = submit_as(jm, spec_json, key, by, number, info, &raced);
        if (!raced)
            return s;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Queries                                                                                     */

zt_status zt_jobs_get(zt_jobs *jm, const char *id, zt_job_info *info) {
    pthread_mutex_lock(&jm->mu);
    job *j = zt_jm_find_job(jm, id);
    if (j)
        info_copy(info, &j->info);
    pthread_mutex_unlock(&jm->mu);
    return j ? ZT_OK : zt_jm_not_found(id);
}

zt_status zt_jobs_record_count(zt_jobs *jm, const char *id, int64_t *n) {
    pthread_mutex_lock(&jm->mu);
    job *j = zt_jm_find_job(jm, id);
    if (j)
        *n = zt_history_n_records(j->history);
    pthread_mutex_unlock(&jm->mu);
    return j ? ZT_OK : zt_jm_not_found(id);
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
        job *a = zt_jm_find_job(jm, after_id);
        if (!a) {
            pthread_mutex_unlock(&jm->mu);
            return zt_error(ZT_ERR_INVALID, "page_token: '%s' names no job", after_id);
        }
        while (start >= 0 && jm->jobs[start] != a)
            start--;
        start--;
    }
    zt_job_info *out = calloc((size_t)limit, sizeof *out);
    const job **found = calloc((size_t)limit, sizeof *found);
    ZT_ASSERT(out && found);
    for (int i = start; i >= 0; i--) {
        const job *j = jm->jobs[i];
        if (state && j->info.state != state)
            continue;
        if (*n == limit) {
            *more = true;
            break;
        }
        found[*n] = j;
        info_copy_changing(&out[(*n)++], &j->info);
    }
    pthread_mutex_unlock(&jm->mu);
    /* The specs (up to max_spec_bytes each) are copied here, not under the lock. */
    for (int i = 0; i < *n; i++)
        info_copy_fixed(&out[i], &found[i]->info);
    free(found);
    *jobs = out;
    return ZT_OK;
}

void zt_jobs_count_states(zt_jobs *jm, int count[ZT_JOB_CANCELLED + 1]) {
    memset(count, 0, sizeof(int) * (ZT_JOB_CANCELLED + 1));
    pthread_mutex_lock(&jm->mu);
    for (int i = 0; i < jm->n_jobs; i++) {
        zt_job_state s = jm->jobs[i]->info.state;
        if (s >= ZT_JOB_QUEUED && s <= ZT_JOB_CANCELLED)
            count[s]++;
    }
    pthread_mutex_unlock(&jm->mu);
}

zt_status zt_jobs_summaries(zt_jobs *jm, const char *const *keys, int n_keys,
                            zt_job_summary **out, int *n) {
    *out = NULL;
    *n = 0;
    if (n_keys < 0)
        n_keys = 0;
    pthread_mutex_lock(&jm->mu);
    int count = jm->n_jobs;
    size_t slots = count ? (size_t)count : 1;
    zt_job_summary *v = calloc(slots, sizeof *v);
    const job **found = calloc(slots, sizeof *found);
    double *values = calloc(slots * (size_t)(n_keys ? n_keys : 1), sizeof *values);
    bool *reported = calloc(slots * (size_t)(n_keys ? n_keys : 1), sizeof *reported);
    if (!v || !found || !values || !reported) {
        pthread_mutex_unlock(&jm->mu);
        free(v);
        free(found);
        free(values);
        free(reported);
        return zt_error(ZT_ERR_NOMEM, "out of memory summarising %d jobs", count);
    }
    for (int i = 0; i < count; i++) {
        const job *j = found[i] = jm->jobs[count - 1 - i];
        zt_job_summary *e = &v[i];
        memcpy(e->id, j->info.id, sizeof e->id);
        e->state = j->info.state;
        e->finished_ms = j->info.finished_ms;
        e->world_size = j->info.world_size;
        e->grid = j->info.grid;
        e->step = j->info.step;
        e->loss = j->info.loss;
        e->tokens_per_second = j->info.tokens_per_second;
        e->values = &values[(size_t)i * (size_t)n_keys];
        e->reported = &reported[(size_t)i * (size_t)n_keys];
        for (int k = 0; k < n_keys; k++)
            e->reported[k] = zt_history_last_value(j->history, keys[k], &e->values[k]);
        if (j->info.ranks && j->info.world_size > 0) {
            e->ranks = malloc((size_t)j->info.world_size * sizeof *e->ranks);
            ZT_ASSERT(e->ranks);
            for (int r = 0; r < j->info.world_size; r++)
                e->ranks[r] = j->info.ranks[r].figures;
        }
    }
    pthread_mutex_unlock(&jm->mu);
    for (int i = 0; i < count; i++)
        v[i].name = zt_jm_strdup(found[i]->info.name);
    free(found);
    v[0].values = values;   /* also what zt_job_summaries_free frees, when there is no job */
    v[0].reported = reported;
    *out = v;
    *n = count;
    return ZT_OK;
}

void zt_job_summaries_free(zt_job_summary *s, int n) {
    if (!s)
        return;
    for (int i = 0; i < n; i++) {
        free(s[i].name);
        free(s[i].ranks);
    }
    /* The values of every summary are one array, which the first one's points to. */
    free(s[0].values);
    free(s[0].reported);
    free(s);
}

const zt_jobs_config *zt_jobs_get_config(const zt_jobs *jm) {
    return &jm->cfg;
}

void zt_jm_logs(zt_jobs *jm, job *j, int tail, zt_log_fn emit, void *ctx) {
    if (tail < 0 || tail > LOG_KEEP)
        tail = LOG_KEEP;
    int64_t first_seq;
    int in_ring = zt_history_log_count(j->history, &first_seq);
    if (tail > in_ring && first_seq > 1) {
        zt_status s = zt_store_logs(jm->store, j->info.id, first_seq, tail - in_ring, emit, ctx);
        if (s != ZT_OK)
            zt_oplog(ZT_LOG_WARNING, "%s (serving the log lines in memory only)\n",
                     zt_last_error());
    }
    zt_history_logs(j->history, tail, emit, ctx);
}

zt_status zt_jobs_logs(zt_jobs *jm, const char *id, int tail, zt_log_fn emit, void *ctx) {
    pthread_mutex_lock(&jm->mu);
    job *j = zt_jm_find_job(jm, id);
    if (j)
        zt_jm_logs(jm, j, tail, emit, ctx);
    pthread_mutex_unlock(&jm->mu);
    return j ? ZT_OK : zt_jm_not_found(id);
}

/* ------------------------------------------------------------------------------------------ */
/* Cancel                                                                                      */

zt_status zt_jobs_cancel(zt_jobs *jm, const char *id, bool force, double grace_s,
                         zt_job_info *info) {
    pthread_mutex_lock(&jm->mu);
    job *j = zt_jm_find_job(jm, id);
    if (!j) {
        pthread_mutex_unlock(&jm->mu);
        return zt_jm_not_found(id);
    }
    if (j->info.state == ZT_JOB_QUEUED) {
        j->cancel_requested = true;
        zt_jm_set_reason(j, "cancelled by request while queued");
        zt_jm_set_state(jm, j, ZT_JOB_CANCELLED);
    } else if (!zt_job_state_terminal(j->info.state) && j->group) {
        j->cancel_requested = true;
        if (force) {
            j->force = true;
            zt_jm_daemon_log(jm, j, "force-cancel requested: killing the ranks");
            zt_rank_group_kill(jm->sup, j->group);
        } else if (j->info.state != ZT_JOB_STOPPING) {
            /* Only the request that stops the ranks sets the grace period: a later one does
             * not move the deadline that is already running. */
            j->grace_s = grace_s > 0 ? grace_s : jm->cfg.default_grace_s;
            zt_jm_daemon_log(jm, j, "cancel requested: the ranks finish the step, write a "
                                    "checkpoint and stop (killed after %g s)", j->grace_s);
            zt_rank_group_terminate(jm->sup, j->group, j->grace_s);
        }
        zt_jm_set_reason(j, force ? "force-cancel requested" : "cancel requested");
        if (j->info.state != ZT_JOB_STOPPING)
            zt_jm_set_state(jm, j, ZT_JOB_STOPPING);
        else
            zt_jm_persist(jm, j);
    }
    if (info)
        info_copy(info, &j->info);
    pthread_mutex_unlock(&jm->mu);
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Life cycle                                                                                  */

static void load_job(void *ctx, const zt_job_info *ji) {
    zt_jobs *jm = ctx;
    job *j = job_alloc(ji);
    /* The store keeps max_restarts in the spec only: it never changes. */
    cJSON *top = cJSON_Parse(ji->spec_json);
    const cJSON *mr = cJSON_GetObjectItemCaseSensitive(top, "max_restarts");
    j->info.max_restarts = cJSON_IsNumber(mr) ? mr->valueint : 0;
    cJSON_Delete(top);
    add_job(jm, j);
}

static void load_attempt(void *ctx, const char *job_id, const zt_job_attempt *a) {
    job *j = zt_jm_find_job(ctx, job_id);
    if (j)
        zt_jm_add_attempt(j, a);
}

/* The newest records of a job, newest first, as the store gives them. */
typedef struct {
    char *json[LOAD_RECORDS];
    int64_t seq[LOAD_RECORDS], step[LOAD_RECORDS];
    int n;
} newest_records;

static void take_newest(void *ctx, const zt_metric_record *r) {
    newest_records *nr = ctx;
    if (nr->n == LOAD_RECORDS)
        return;
    nr->json[nr->n] = zt_jm_strdup(r->json);
    nr->seq[nr->n] = r->seq;
    nr->step[nr->n++] = r->step;
}

/* What a restarted daemon keeps of a job's history: its record count, step, last loss and
 * throughput and the last values of its keys, from its newest LOAD_RECORDS records (the store
 * serves the rest). A loss older than those is not found, and stays unknown (NaN). */
static zt_status load_newest_records(zt_jobs *jm, job *j) {
    newest_records *nr = calloc(1, sizeof *nr);
    if (!nr)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    zt_status s = zt_store_last_records(jm->store, j->info.id, LOAD_RECORDS, take_newest, nr);
    for (int i = nr->n - 1; i >= 0; i--) {
        cJSON *obj = cJSON_Parse(nr->json[i]);
        if (s == ZT_OK && cJSON_IsObject(obj)) {
            zt_history_restore_record(j->history, obj, nr->seq[i], nr->step[i]);
            take_numbers(j, obj, nr->step[i]);
        }
        cJSON_Delete(obj);
        free(nr->json[i]);
    }
    free(nr);
    return s;
}

static void load_log(void *ctx, const char *job_id, const zt_log_line *l) {
    zt_jobs *jm = ctx;
    job *j = zt_jm_find_job(jm, job_id);
    if (j)
        zt_history_add_log(j->history, l);
}

/* The previous daemon's srun died with it (it runs under setpriv --pdeathsig TERM, and srun
 * answers SIGTERM by killing its tasks), but srun may have been killed on its own, or started
 * without setpriv: the job is cancelled in Slurm all the same, so that nothing of it runs on. */
static void cancel_orphan_in_slurm(zt_jobs *jm, job *j) {
    char name[96], err[512];
    zt_jm_slurm_job_name(jm, j, name, sizeof name);
    char **argv = zt_slurm_scancel_argv(jm->cfg.slurm, name, NULL, NULL);
    int rc = argv ? zt_slurm_run_sync(argv, 15.0, err, sizeof err) : -1;
    zt_slurm_argv_free(argv);
    if (rc == 0)
        zt_jm_daemon_log(jm, j, "cancelled whatever was left in Slurm of %s (scancel --name=%s)",
                         j->info.id, name);
    else
        zt_jm_daemon_log(jm, j, "scancel --name=%s failed (status %d): %s", name, rc, err);
}

/* Jobs whose ranks were running under the previous daemon: they asked to be stopped when it
 * died (PR_SET_PDEATHSIG), so they are gone, and they are not re-adopted. A job with restarts
 * left goes back to the queue instead of failing (job_recovery.c). */
static void fail_orphans(zt_jobs *jm) {
    for (int i = 0; i < jm->n_jobs; i++) {
        job *j = jm->jobs[i];
        zt_job_state s = j->info.state;
        if (s != ZT_JOB_STARTING && s != ZT_JOB_RUNNING && s != ZT_JOB_STOPPING)
            continue;
        for (int r = 0; r < j->info.world_size; r++) {
            zt_rank_info *ri = &j->info.ranks[r];
            ri->exit_unknown = ri->running;
            ri->running = false;
        }
        if (jm->cfg.slurm)
            cancel_orphan_in_slurm(jm, j);
        if (s == ZT_JOB_STOPPING) {
            zt_jm_set_reason(j, "ztraind was restarted while the job was being cancelled");
            zt_jm_set_state(jm, j, ZT_JOB_CANCELLED);
        } else {
            zt_jm_set_reason(j, "ztraind was restarted while the job was running (step %lld); "
                                "its ranks were stopped with the previous daemon",
                             (long long)j->info.step);
            if (zt_jm_restart_orphan(jm, j))
                continue;   /* the restart logged its reason */
            zt_jm_set_state(jm, j, ZT_JOB_FAILED);
        }
        zt_jm_daemon_log(jm, j, "%s", j->info.reason);
    }
}

static zt_status resolve_root(char **root, const char *what) {
    ZT_TRY(zt_mkdirs(*root));
    char buf[PATH_MAX];
    if (!realpath(*root, buf))
        return zt_error(ZT_ERR_IO, "%s root %s: %s", what, *root, strerror(errno));
    zt_jm_set_str(root, buf);
    return ZT_OK;
}

/* Every job's run directory and checkpoints are made in the runs root: one this user cannot
 * write (a volume owned by another uid, a read-only mount) stops ztraind at start, not each job
 * later with "cannot create directory". */
static zt_status check_runs_writable(const char *runs_root) {
    if (access(runs_root, W_OK | X_OK) != 0)
        return zt_error(ZT_ERR_IO, "runs root %s: not writable by uid %ld: %s (run directories "
                        "and checkpoints are made there)", runs_root, (long)geteuid(),
                        strerror(errno));
    return ZT_OK;
}

void zt_jm_slurm_job_name(const zt_jobs *jm, const job *j, char *buf, size_t size) {
    snprintf(buf, size, "ztrain-%s-%s", jm->tag, j->info.id);
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

/* The highest number of a run directory ("job-000042") under runs_root, 0 when none: a new job
 * never takes the id, and so the directory, of a job the state file does not hold (a state
 * directory restored from an older copy, or replaced). */
static long long highest_run_dir(const char *runs_root) {
    long long highest = 0;
    DIR *d = opendir(runs_root);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        if (strncmp(e->d_name, "job-", 4) != 0 || !isdigit((unsigned char)e->d_name[4]))
            continue;
        long long n = strtoll(e->d_name + 4, &end, 10);
        if (*end == '\0' && n > highest)
            highest = n;
    }
    closedir(d);
    return highest;
}

zt_status zt_jobs_create(zt_jobs **out, const zt_jobs_config *cfg) {
    zt_jobs *jm = calloc(1, sizeof *jm);
    if (!jm)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    jm->cfg = *cfg;
    jm->cfg.data_root = zt_jm_strdup(cfg->data_root);
    jm->cfg.runs_root = zt_jm_strdup(cfg->runs_root);
    jm->cfg.db_path = zt_jm_strdup(cfg->db_path);
    jm->cfg.worker_path = zt_jm_strdup(cfg->worker_path);
    if (jm->cfg.max_ranks < 1)
        jm->cfg.max_ranks = 1;
    pthread_mutex_init(&jm->mu, NULL);
    zt_status s = zt_gpu_pool_init(&jm->gpus, cfg->gpus, cfg->gpu_visible);
    if (s == ZT_OK)
        s = resolve_root(&jm->cfg.data_root, "data");
    if (s == ZT_OK)
        s = resolve_root(&jm->cfg.runs_root, "runs");
    if (s == ZT_OK)
        s = check_runs_writable(jm->cfg.runs_root);
    if (s == ZT_OK)
        s = zt_store_open(&jm->store, jm->cfg.db_path);
    zt_store_loader loader = {load_job, load_log, load_attempt};
    if (s == ZT_OK)
        s = zt_store_load(jm->store, LOG_RING, &loader, jm);
    for (int i = 0; s == ZT_OK && i < jm->n_jobs; i++)
        s = load_newest_records(jm, jm->jobs[i]);
    if (s == ZT_OK)
        s = zt_jm_events_open(jm);
    long long max_number = 0;
    if (s == ZT_OK)
        s = zt_store_max_job_number(jm->store, &max_number);
    if (s != ZT_OK) {
        zt_jobs_destroy(jm);
        return s;
    }
    if (max_number > jm->last_number)
        jm->last_number = max_number;
    long long dir_number = highest_run_dir(jm->cfg.runs_root);
    if (dir_number > jm->last_number)
        jm->last_number = dir_number;
    daemon_tag(jm);
    fail_orphans(jm);
    s = zt_supervisor_create(&jm->sup, &zt_jm_supervisor_callbacks, jm);
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
        /* Queued jobs stay queued for the next daemon; running ones stop with a checkpoint.
         * `stopping` is set under the same lock as the cancels, so no tick after this one
         * starts a queued job on the ranks the cancelled jobs free. */
        pthread_mutex_lock(&jm->mu);
        jm->stopping = true;
        for (int i = 0; i < jm->n_jobs; i++) {
            job *j = jm->jobs[i];
            if (j->group && !j->cancel_requested) {
                j->cancel_requested = true;
                j->shutdown = true;
                j->grace_s = jm->cfg.default_grace_s;
                zt_jm_daemon_log(jm, j, "ztraind is shutting down: cancelling the job");
                zt_rank_group_terminate(jm->sup, j->group, j->grace_s);
                zt_jm_set_reason(j, "ztraind is shutting down");
                zt_jm_set_state(jm, j, ZT_JOB_STOPPING);
            } else if (j->group) {
                /* A job cancelled earlier with a longer grace_seconds stops no later than the
                 * others, so ztraind exits at most --grace from now. */
                zt_rank_group_kill_within(jm->sup, j->group, jm->cfg.default_grace_s);
            }
        }
        pthread_mutex_unlock(&jm->mu);
        /* The supervisor thread reaps them and records the final states. */
        while (any_ranks(jm))
            usleep(20000);
        zt_supervisor_destroy(jm->sup);
    }
    zt_jm_events_close(jm);
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
