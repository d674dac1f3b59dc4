/* Automatic recovery (job_manager.h): every start of a job's ranks is an attempt, kept in the
 * store; when the ranks fail and the spec's max_restarts allows, the job goes back to the queue
 * and its next attempt resumes from the newest complete checkpoint. A job whose ranks were
 * running under a daemon that was killed is restarted the same way, once its old ranks are gone.
 * Called with the manager's lock held, as everything in job_manager_internal.h. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <ctype.h>
#include <limits.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "job_manager_internal.h"
#include "ztrain/checkpoint.h"

/* The orphans of a killed daemon get this long beyond the default grace period to write their
 * checkpoint and stop before they are killed. */
#define ORPHAN_EXTRA_S 5.0

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void zt_jm_copy_attempts(zt_job_info *dst, const zt_job_info *src) {
    dst->attempts = NULL;
    dst->n_attempts = src->n_attempts;
    if (!src->n_attempts)
        return;
    dst->attempts = calloc((size_t)src->n_attempts, sizeof *dst->attempts);
    ZT_ASSERT(dst->attempts);
    for (int i = 0; i < src->n_attempts; i++) {
        dst->attempts[i] = src->attempts[i];
        dst->attempts[i].reason = zt_jm_strdup(src->attempts[i].reason);
        if (!dst->attempts[i].ended_ms)
            dst->attempts[i].step = src->step;
    }
}

void zt_jm_free_attempts(zt_job_info *j) {
    for (int i = 0; i < j->n_attempts; i++)
        free(j->attempts[i].reason);
    free(j->attempts);
    j->attempts = NULL;
    j->n_attempts = 0;
}

void zt_jm_add_attempt(job *j, const zt_job_attempt *a) {
    j->info.attempts = realloc(j->info.attempts,
                               (size_t)(j->info.n_attempts + 1) * sizeof *j->info.attempts);
    ZT_ASSERT(j->info.attempts);
    zt_job_attempt *c = &j->info.attempts[j->info.n_attempts++];
    *c = *a;
    c->reason = zt_jm_strdup(a->reason);
}

/* Whether the spec asks to resume from its checkpoint directory itself (train.resume). */
static bool spec_resumes(const cJSON *top) {
    const cJSON *train = cJSON_GetObjectItemCaseSensitive(top, "train");
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(train, "resume"));
}

char *zt_jm_attempt_spec(const job *j) {
    if (j->info.n_attempts == 0)
        return zt_jm_strdup(j->info.spec_json);
    cJSON *top = cJSON_Parse(j->info.spec_json);
    cJSON *train = cJSON_GetObjectItemCaseSensitive(top, "train");
    ZT_ASSERT(cJSON_IsObject(train));   /* a resolved spec always has one (checkpoint_dir) */
    cJSON_DeleteItemFromObjectCaseSensitive(train, "resume");
    cJSON_AddBoolToObject(train, "resume", true);
    char *text = cJSON_PrintUnformatted(top);
    cJSON_Delete(top);
    ZT_ASSERT(text);
    return text;
}

/* The step of the checkpoint that ranks started with `resume` begin from: what the worker's
 * own choice (zt_ckpt_find_resume) will be, read from the trailing digits of its tag. 0 when
 * they start from the beginning, or when the choice is an error the ranks will report. */
static int64_t resume_step(const job *j) {
    cJSON *top = cJSON_Parse(j->info.spec_json);
    bool resumes = j->info.n_attempts > 0 || spec_resumes(top);
    cJSON_Delete(top);
    if (!resumes || !j->info.checkpoint_dir || !j->info.checkpoint_dir[0])
        return 0;
    char tag[256], note[2048];
    if (zt_ckpt_find_resume(j->info.checkpoint_dir, tag, sizeof tag, note, sizeof note) != ZT_OK)
        return 0;
    size_t n = strlen(tag);
    while (n > 0 && isdigit((unsigned char)tag[n - 1]))
        n--;
    return tag[n] ? strtoll(tag + n, NULL, 10) : 0;
}

static void put_attempt(zt_jobs *jm, const job *j, const zt_job_attempt *a) {
    zt_jm_store_result(jm, zt_store_put_attempt(jm->store, j->info.id, a));
}

void zt_jm_attempt_started(zt_jobs *jm, job *j) {
    zt_job_attempt a = {.attempt = j->info.n_attempts + 1, .started_ms = zt_jm_now_ms(),
                        .step = j->info.step, .resumed_from_step = resume_step(j), .rank = -1,
                        .reason = ""};
    zt_jm_add_attempt(j, &a);
    put_attempt(jm, j, &j->info.attempts[j->info.n_attempts - 1]);
    if (a.attempt > 1)
        zt_jm_daemon_log(jm, j, "attempt %d of at most %d: the ranks resume from %s", a.attempt,
                         j->info.max_restarts + 1,
                         a.resumed_from_step ? "the newest complete checkpoint" :
                                               "step 0 (no complete checkpoint yet)");
}

void zt_jm_attempt_ended(zt_jobs *jm, job *j, bool failed) {
    if (!j->info.n_attempts)
        return;
    zt_job_attempt *a = &j->info.attempts[j->info.n_attempts - 1];
    if (a->ended_ms)
        return;
    a->ended_ms = zt_jm_now_ms();
    a->step = j->info.step;
    a->failed = failed;
    a->rank = j->failed_rank;
    if (j->failed_rank >= 0) {
        a->exit_code = j->info.ranks[j->failed_rank].exit_code;
        a->signal = j->info.ranks[j->failed_rank].signal;
    }
    zt_jm_set_str(&a->reason, j->info.reason);
    put_attempt(jm, j, a);
}

/* What one attempt leaves behind in the job: the next one starts clean. */
static void forget_attempt(job *j) {
    j->failed_rank = -1;
    free(j->fail_reason);
    j->fail_reason = NULL;
    free(j->launch_reason);
    j->launch_reason = NULL;
    j->launch_failed = false;
    for (int r = 0; r < j->info.world_size; r++) {
        free(j->last_stderr[r]);
        j->last_stderr[r] = NULL;
        free(j->hosts[r]);
        j->hosts[r] = NULL;
        j->info.ranks[r] = (zt_rank_info){.rank = r};
    }
}

/* The wait before restart number n (1-based): restart_backoff_s, doubling each time, at most
 * RESTART_BACKOFF_MAX_S. A job whose every attempt fails at once (a corrupt init_from passes
 * the submit check, which only opens the file) would otherwise spin through all its restarts
 * in a fraction of a second (issue 34, defect 10). */
#define RESTART_BACKOFF_MAX_S 300.0

static double backoff_s(const zt_jobs *jm, int n) {
    double base = jm->cfg.restart_backoff_s > 0 ? jm->cfg.restart_backoff_s : 1.0;
    double d = base * ldexp(1.0, n - 1 < 30 ? n - 1 : 30);
    return d < RESTART_BACKOFF_MAX_S ? d : RESTART_BACKOFF_MAX_S;
}

bool zt_jm_backoff_over(const zt_jobs *jm, const job *j, char *why, size_t size) {
    (void)jm;
    double left = j->restart_at - now_s();
    if (j->restart_at <= 0 || left <= 0)
        return true;
    snprintf(why, size, "%s", j->restart_why ? j->restart_why : "restarting after a back-off");
    return false;
}

bool zt_jm_restart(zt_jobs *jm, job *j) {
    int restarts = j->info.n_attempts > 0 ? j->info.n_attempts - 1 : 0;
    if (restarts >= j->info.max_restarts) {
        if (j->info.max_restarts > 0)
            zt_jm_set_reason(j, "%s (attempt %d: the %d restart(s) of max_restarts are used up)",
                             j->info.reason, j->info.n_attempts, j->info.max_restarts);
        return false;
    }
    zt_jm_attempt_ended(jm, j, true);
    char *why = zt_jm_strdup(j->info.reason);
    forget_attempt(j);
    double wait = backoff_s(jm, restarts + 1);
    zt_jm_set_reason(j, "restart %d of max_restarts %d queued after a back-off of %g s "
                     "(doubling per restart, at most %g s): the ranks resume from the newest "
                     "complete checkpoint; attempt %d failed: %s", restarts + 1,
                     j->info.max_restarts, wait, RESTART_BACKOFF_MAX_S, j->info.n_attempts, why);
    free(why);
    free(j->restart_why);
    j->restart_why = zt_jm_strdup(j->info.reason);
    j->restart_at = now_s() + wait;
    zt_jm_daemon_log(jm, j, "%s", j->info.reason);
    zt_jm_set_state(jm, j, ZT_JOB_QUEUED);
    return true;
}

bool zt_jm_restart_orphan(zt_jobs *jm, job *j) {
    pid_t *pids = calloc((size_t)j->info.world_size, sizeof *pids);
    ZT_ASSERT(pids);
    int n = 0;
    for (int r = 0; r < j->info.world_size; r++)
        if (j->info.ranks[r].pid > 0)
            pids[n++] = j->info.ranks[r].pid;
    if (!zt_jm_restart(jm, j)) {
        free(pids);
        return false;
    }
    /* A Slurm job's ranks ran elsewhere and were cancelled with scancel: nothing to wait for. */
    if (jm->cfg.slurm)
        n = 0;
    free(j->orphans);
    j->orphans = n ? pids : NULL;
    j->n_orphans = n;
    j->orphans_since = now_s();
    if (!n)
        free(pids);
    return true;
}

/* Whether pid is one of the job's old ranks: a live ztrain-worker (zombies have no exe) whose
 * working directory is the job's run directory, which is where ztraind starts them. */
static bool is_job_rank(const char *worker, const char *run_dir, pid_t pid) {
    char link[64], exe[PATH_MAX], cwd[PATH_MAX], want[PATH_MAX];
    snprintf(link, sizeof link, "/proc/%ld/exe", (long)pid);
    ssize_t n = readlink(link, exe, sizeof exe - 1);
    if (n <= 0)
        return false;
    exe[n] = '\0';
    if (!realpath(worker, want) || strcmp(exe, want) != 0)
        return false;
    snprintf(link, sizeof link, "/proc/%ld/cwd", (long)pid);
    n = readlink(link, cwd, sizeof cwd - 1);
    if (n <= 0)
        return false;
    cwd[n] = '\0';
    return realpath(run_dir, want) && strcmp(cwd, want) == 0;
}

bool zt_jm_orphans_gone(zt_jobs *jm, job *j) {
    if (!j->n_orphans)
        return true;
    bool late = now_s() - j->orphans_since > jm->cfg.default_grace_s + ORPHAN_EXTRA_S;
    int alive = 0;
    for (int i = 0; i < j->n_orphans; i++) {
        if (!is_job_rank(jm->cfg.worker_path, j->info.run_dir, j->orphans[i]))
            continue;
        alive++;
        if (late)
            kill(j->orphans[i], SIGKILL);
    }
    if (alive)
        return false;
    zt_jm_daemon_log(jm, j, "the ranks of the previous ztraind are gone: the job can start again");
    free(j->orphans);
    j->orphans = NULL;
    j->n_orphans = 0;
    return true;
}
