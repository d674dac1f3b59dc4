/* The supervisor's Slurm groups (supervisor.h): one srun per job whose labelled output speaks for
 * every rank, rank 0's metrics over a per-job TCP endpoint, and the scancel commands (run in the
 * background and reaped like ranks) that stop a job. What the lines mean is slurm_launch.c's. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc_spawn.h"
#include "slurm_launch.h"
#include "supervisor_internal.h"

extern char **environ;

#define SRUN_KILL_AFTER_S 10.0      /* after scancel --signal=KILL, srun itself is killed */

/* ------------------------------------------------------------------------------------------ */
/* Starting                                                                                    */

void zt_sup_slurm_free(slurm_part *sl) {
    if (!sl)
        return;
    zt_metrics_listener_destroy(sl->listener);
    free(sl->job_name);
    free(sl->ended);
    free(sl);
}

/* One srun for all the ranks, its stdout and stderr on pipes, and the metrics endpoint that
 * rank 0 will connect to. */
zt_status zt_sup_start_slurm(const zt_group_spec *spec, zt_rank_group *g, pid_t *pids) {
    slurm_part *sl = calloc(1, sizeof *sl);
    if (!sl)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    g->slurm = sl;
    sl->cfg = *spec->slurm->cfg;
    sl->job_name = strdup(spec->slurm->job_name);
    sl->ended = calloc((size_t)spec->world_size, sizeof *sl->ended);
    if (!sl->job_name || !sl->ended)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    ZT_TRY(zt_metrics_listener_create(&sl->listener, sl->cfg.metrics_host));
    char **argv = zt_slurm_srun_argv(spec->slurm, spec->argv);
    if (!argv)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    /* srun's environment, which it passes on to every task: the whitelist, the run id (the job
     * name: unique across daemons and hosts, and the same for every rank of the step; the shm
     * backend names its segment after it), how rank 0 reaches the metrics endpoint, and the
     * daemon's job id, which checkpoints record. */
    char addr_var[400], token_var[100];
    snprintf(addr_var, sizeof addr_var, "ZTRAIN_METRICS_ADDR=%s",
             zt_metrics_listener_addr(sl->listener));
    snprintf(token_var, sizeof token_var, "ZTRAIN_METRICS_TOKEN=%s",
             zt_metrics_listener_token(sl->listener));
    char job_var[160];
    snprintf(job_var, sizeof job_var, "ZTRAIN_JOB_ID=%s", spec->job_id ? spec->job_id : "");
    const char *extra[] = {addr_var, token_var, "ZTRAIN_REPORT_PLACEMENT=1",
                           spec->job_id ? job_var : NULL, NULL};
    ZT_ASSERT(spec->threads_per_rank > 0);
    zt_rank_group_spec rs = {.world_size = spec->world_size, .env = ZT_RANK_ENV_WHITELIST,
                             .identity = ZT_RANK_ID_SLURM, .run_id = spec->run_id,
                             .threads_per_rank = spec->threads_per_rank, .extra_env = extra};
    zt_rank_env env;
    int out_p[2] = {-1, -1}, err_p[2] = {-1, -1};
    zt_status st = zt_rank_env_init(&env, &rs);
    if (st == ZT_OK)
        st = zt_sup_open_pipe(out_p);
    if (st == ZT_OK)
        st = zt_sup_open_pipe(err_p);
    zt_spawn_request req = {.program = argv[0], .argv = argv, .envp = env.envp, .cwd = spec->cwd,
                            .pgid = 0, .stdout_fd = out_p[1], .stderr_fd = err_p[1]};
    if (st == ZT_OK)
        st = zt_spawn(&req, &g->procs[0].pid, &g->procs[0].pidfd);
    if (out_p[1] >= 0)
        close(out_p[1]);
    if (err_p[1] >= 0)
        close(err_p[1]);
    g->pipes[0].fd = out_p[0];
    g->pipes[1].fd = err_p[0];
    zt_rank_env_free(&env);
    zt_slurm_argv_free(argv);
    if (st != ZT_OK)
        return st;
    g->pgid = g->procs[0].pid;
    g->live = 1;
    for (int r = 0; pids && r < spec->world_size; r++)
        pids[r] = 0;
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* scancel and other commands of the supervisor's own                                          */

/* Starts argv in the background; its end is reaped by the loop, and a failure is reported on
 * ztraind's log (as a warning) with what it printed. */
static void run_helper(zt_supervisor *s, char **argv) {
    if (!argv) {
        zt_sup_warn(s, "out of memory running scancel");
        return;
    }
    helper *h = calloc(1, sizeof *h);
    int err_p[2] = {-1, -1};
    if (!h || zt_sup_open_pipe(err_p) != ZT_OK) {
        zt_sup_warn(s, "cannot run %s: %s", argv[0], h ? zt_last_error() : "out of memory");
        free(h);
        zt_slurm_argv_free(argv);
        return;
    }
    size_t len = 0;
    for (char **a = argv; *a && len + 2 < sizeof h->what; a++)
        len += (size_t)snprintf(h->what + len, sizeof h->what - len, "%s%s", len ? " " : "", *a);
    /* scancel needs the daemon's own SLURM_CONF and the like: its whole environment. */
    zt_spawn_request req = {.program = argv[0], .argv = argv, .envp = environ, .stdout_fd = -1,
                            .stderr_fd = err_p[1]};
    zt_status st = zt_spawn(&req, &h->pid, &h->pidfd);
    close(err_p[1]);
    zt_slurm_argv_free(argv);
    if (st != ZT_OK) {
        zt_sup_warn(s, "%s", zt_last_error());
        close(err_p[0]);
        free(h);
        return;
    }
    h->err_fd = err_p[0];
    h->next = s->helpers;
    s->helpers = h;
}

void zt_sup_reap_helper(zt_supervisor *s, helper *h) {
    siginfo_t si = {0};
    if (waitid(P_PIDFD, (id_t)h->pidfd, &si, WEXITED | WNOHANG) != 0 || si.si_pid == 0)
        return;
    char buf[1024];
    ssize_t k = read(h->err_fd, buf, sizeof buf - 1);
    buf[k > 0 ? k : 0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    if (si.si_code != CLD_EXITED || si.si_status != 0)
        zt_sup_warn(s, "`%s` failed (%s %d): %s", h->what,
                    si.si_code == CLD_EXITED ? "status" : "signal", si.si_status, buf);
    close(h->err_fd);
    close(h->pidfd);
    for (helper **link = &s->helpers; *link; link = &(*link)->next)
        if (*link == h) {
            *link = h->next;
            break;
        }
    free(h);
}

static void scancel(zt_supervisor *s, zt_rank_group *g, const char *sig, const char *state) {
    run_helper(s, zt_slurm_scancel_argv(&g->slurm->cfg, g->slurm->job_name, sig, state));
}

/* The stops asked for by other threads, and the deadlines, of a Slurm group whose srun runs. A
 * graceful stop signals the running steps (the ranks finish their step and checkpoint) and
 * cancels the job if it is still pending, when it has nothing to save; the hard one kills the
 * steps' tasks. srun then reports the ends and exits; if it does not, it is killed itself. */
void zt_sup_drive_slurm(zt_supervisor *s, zt_rank_group *g, double now) {
    slurm_part *sl = g->slurm;
    if (g->live == 0)
        return;
    pthread_mutex_lock(&s->mu);
    bool term = sl->term_wanted && !sl->term_sent;
    bool hard = g->kill_at && now >= g->kill_at && !g->kill_sent;
    sl->term_sent |= term;
    g->kill_sent |= hard;
    pthread_mutex_unlock(&s->mu);
    if (term) {
        scancel(s, g, "TERM", "RUNNING");
        scancel(s, g, NULL, "PENDING");
    }
    if (hard) {
        scancel(s, g, "KILL", NULL);
        scancel(s, g, NULL, "PENDING");
        sl->srun_kill_at = now + SRUN_KILL_AFTER_S;
    }
    if (sl->srun_kill_at && now >= sl->srun_kill_at && !sl->srun_killed) {
        sl->srun_killed = true;
        zt_sup_signal_group(g, SIGKILL);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Slurm groups: srun's lines and its end                                                      */

static void slurm_rank_ended(zt_supervisor *s, zt_rank_group *g, int rank, const char *host,
                             int code, int sig) {
    slurm_part *sl = g->slurm;
    if (sl->ended[rank])
        return;
    sl->ended[rank] = true;
    sl->ranks_seen = true;
    s->cb.rank_exited(g->ctx, rank, 0, host, code, sig);
    pthread_mutex_lock(&s->mu);
    bool teardown = zt_sup_rank_failed(code, sig) && !g->tearing_down;
    pthread_mutex_unlock(&s->mu);
    if (teardown)
        zt_rank_group_terminate(s, g, g->fail_grace_s);
}

/* slurmstepd's cancel banner: Slurm's own decision only when ztraind did not ask for it. */
static void slurm_cancelled(zt_supervisor *s, zt_rank_group *g, const zt_srun_line *l) {
    slurm_part *sl = g->slurm;
    pthread_mutex_lock(&s->mu);
    bool ours = sl->term_wanted || g->kill_at != 0;
    pthread_mutex_unlock(&s->mu);
    if (ours || sl->cancel_noted)
        return;
    sl->cancel_noted = true;
    char text[400];
    if (!l->due[0]) {
        snprintf(text, sizeof text, "Slurm job %lld was cancelled from outside ztraind (scancel)",
                 l->job_id);
        s->cb.launch_event(g->ctx, ZT_LAUNCH_STOPPED, text);
    } else if (strcmp(l->due, "PREEMPTION") == 0) {
        snprintf(text, sizeof text, "Slurm preempted job %lld", l->job_id);
        s->cb.launch_event(g->ctx, ZT_LAUNCH_STOPPED, text);
    } else {
        snprintf(text, sizeof text, "Slurm cancelled job %lld due to %s", l->job_id, l->due);
        for (char *c = text + strlen("Slurm cancelled job"); *c; c++)
            *c = (char)tolower((unsigned char)*c);
        s->cb.launch_event(g->ctx, ZT_LAUNCH_FAILED, text);
    }
}

/* One line of srun's stdout or stderr: a task's line ("3: text") goes to that rank's log, and
 * srun's own lines to the job's log as rank -1, after their meaning was taken. */
void zt_sup_slurm_line(zt_supervisor *s, zt_rank_group *g, const char *stream, const char *line) {
    slurm_part *sl = g->slurm;
    int rank;
    const char *text;
    zt_srun_line l;
    if (zt_slurm_split_label(line, g->n, &rank, &text)) {
        sl->ranks_seen = true;
        zt_slurm_parse_task(strcmp(stream, "stderr") == 0 ? text : "", &l);
        /* slurmstepd writes its cancel banner into task 0's stderr: it is Slurm's line, not
         * the rank's last words. */
        s->cb.log_line(g->ctx, l.kind == ZT_SRUN_CANCELLED ? -1 : rank, stream, text);
        if (l.kind == ZT_SRUN_PLACED && l.rank == rank)
            s->cb.rank_placed(g->ctx, rank, (pid_t)l.pid, l.host);
        else if (l.kind == ZT_SRUN_CANCELLED)
            slurm_cancelled(s, g, &l);
        return;
    }
    s->cb.log_line(g->ctx, -1, stream, line);
    zt_slurm_parse_srun(line, &l);
    char before[sizeof sl->last_line];
    snprintf(before, sizeof before, "%s", sl->last_line);
    if (strncmp(line, "srun: ", 6) == 0)
        snprintf(sl->last_line, sizeof sl->last_line, "%s", line);
    char text_buf[800];
    switch (l.kind) {
    case ZT_SRUN_TASK_EXIT: {
        int *ids = calloc((size_t)g->n, sizeof *ids);
        int n = ids ? zt_slurm_task_ids(l.tasks, g->n, ids, g->n) : -1;
        for (int i = 0; i < n; i++)
            slurm_rank_ended(s, g, ids[i], l.host, l.exit_code, l.signal);
        free(ids);
        break;
    }
    case ZT_SRUN_QUEUED:
        /* srun says why just before ("srun: Requested partition configuration not available
         * now"), when it is more than a wait for busy nodes. */
        snprintf(text_buf, sizeof text_buf,
                 "waiting in Slurm's queue as job %lld for resources%s%s%s", l.job_id,
                 before[0] ? " (" : "", before, before[0] ? ")" : "");
        s->cb.launch_event(g->ctx, ZT_LAUNCH_WAITING, text_buf);
        break;
    case ZT_SRUN_ALLOCATED:
        snprintf(text_buf, sizeof text_buf, "Slurm job %lld has been allocated resources",
                 l.job_id);
        s->cb.launch_event(g->ctx, ZT_LAUNCH_ALLOCATED, text_buf);
        break;
    case ZT_SRUN_CANCELLED:
        slurm_cancelled(s, g, &l);
        break;
    case ZT_SRUN_NODE_FAIL:
        if (!sl->cancel_noted) {
            sl->cancel_noted = true;
            snprintf(text_buf, sizeof text_buf, "Slurm reported a node failure on %s", l.host);
            s->cb.launch_event(g->ctx, ZT_LAUNCH_FAILED, text_buf);
        }
        break;
    case ZT_SRUN_ERROR:
        snprintf(sl->last_error, sizeof sl->last_error, "%s", line);
        break;
    default:
        break;
    }
}

/* srun has ended. Slurm reports every task that ended badly, so a rank it did not name exited 0
 * — provided the step ran at all; a srun that ended without any sign of its tasks failed to
 * launch them, and its last error says why. Whatever the case, a srun that did not succeed is
 * followed by a plain scancel, so that no allocation or task outlives it. */
void zt_sup_reap_srun(zt_supervisor *s, zt_rank_group *g) {
    siginfo_t si = {0};
    if (waitid(P_PIDFD, (id_t)g->procs[0].pidfd, &si, WEXITED | WNOHANG) != 0 || si.si_pid == 0)
        return;
    close(g->procs[0].pidfd);
    g->procs[0].pidfd = -1;
    int code = si.si_code == CLD_EXITED ? si.si_status : -1;
    int sig = si.si_code == CLD_EXITED ? 0 : si.si_status;
    zt_sup_read_pipe(s, g, &g->pipes[0]);
    zt_sup_read_pipe(s, g, &g->pipes[1]);
    if (g->pipes[2].fd >= 0)
        zt_sup_read_pipe(s, g, &g->pipes[2]);
    slurm_part *sl = g->slurm;
    pthread_mutex_lock(&s->mu);
    g->live = 0;
    g->reaped_at = zt_sup_now_s();
    bool tearing_down = g->tearing_down;
    pthread_mutex_unlock(&s->mu);
    char text[800];
    if (sig) {
        char what[64];
        zt_rank_describe_signal(what, sizeof what, sig);
        snprintf(text, sizeof text, "srun (pid %ld) was killed by %s; the job was cancelled in "
                 "Slurm", (long)g->procs[0].pid, what);
        if (!tearing_down)
            s->cb.launch_event(g->ctx, ZT_LAUNCH_FAILED, text);
        for (int r = 0; sl->ranks_seen && r < g->n; r++)
            slurm_rank_ended(s, g, r, NULL, 0, SIGKILL);
    } else if (code != 0 && !sl->ranks_seen) {
        const char *why = sl->last_error[0] ? sl->last_error : sl->last_line;
        snprintf(text, sizeof text, "srun exited with status %d before starting the ranks%s%s",
                 code, why[0] ? ": " : "", why);
        s->cb.launch_event(g->ctx, ZT_LAUNCH_FAILED, text);
    } else {
        for (int r = 0; r < g->n; r++)
            slurm_rank_ended(s, g, r, NULL, 0, 0);
    }
    if (code != 0)
        scancel(s, g, NULL, NULL);
}

/* Takes rank 0's metrics connection when it arrives (Slurm groups). */
void zt_sup_accept_metrics(zt_rank_group *g) {
    slurm_part *sl = g->slurm;
    if (!sl || !sl->listener)
        return;
    int fd = zt_metrics_listener_step(sl->listener, NULL);
    if (fd < 0)
        return;
    g->pipes[2].fd = fd;
    zt_metrics_listener_destroy(sl->listener);
    sl->listener = NULL;
}

void zt_sup_slurm_kill_now(zt_rank_group *g) {
    char **argv = zt_slurm_scancel_argv(&g->slurm->cfg, g->slurm->job_name, "KILL", NULL);
    if (argv)
        zt_slurm_run_sync(argv, 10.0, NULL, 0);
    zt_slurm_argv_free(argv);
}
