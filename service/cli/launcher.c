/* The launcher: starts a job's ranks as one process group and supervises them until the last has
 * ended. It waits only for the pids it started, records exit status and signal apart, and tears
 * the whole group down when one rank fails, so a dead rank never leaves its peers running. */
#define _GNU_SOURCE
#include "launcher.h"
#include "ranks/rank_group.h"
#include "ztrain/comm.h"
#include "ztrain/stop_signals.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const zt_launch_options *opts;
    int n;
    pid_t *pids;            /* 0: not started */
    char *reaped;           /* 1 once waitpid has returned the rank's status */
    zt_rank_exit *exits;
    pid_t pgid;
    int live;               /* started and not yet reaped */
    int first_failed;       /* -1 until a rank fails */
    int spawn_rank;         /* the rank that could not be started, -1 if every rank started */
    char spawn_error[512];  /* why it could not */
    int user_signals;       /* SIGINT/SIGTERM received, less repeats of the first request */
    double first_signal_at; /* CLOCK_MONOTONIC seconds of the first of them */
    int term_signals_sent;  /* SIGTERMs sent to the group */
    bool terminating;       /* tearing down after a failure: SIGKILL at deadline */
    bool kill_sent;
    bool grace_ran_out;     /* the SIGKILL was sent because ranks outlived the grace period */
    double deadline;        /* CLOCK_MONOTONIC seconds at which terminating turns into SIGKILL */
    /* The rank the others were waiting for, when the first failure was a rank that exited (its
     * collective timed out or found a peer gone) rather than one that was killed: a rank that
     * was stopped (SIGSTOP, a debugger) at that moment, else one that then ignored SIGTERM and
     * SIGCONT for the whole grace period. -1: none; the first failing rank is named. */
    int stopped_rank;
    int unanswering_rank;
} launch;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sends sig to the whole group. Only while one of our ranks is unreaped: until then its pid (the
 * group id) cannot be reused, afterwards -pgid might name someone else's group. */
static void signal_group(launch *l, int sig) {
    if (l->live == 0 || l->pgid <= 0)
        return;
    if (kill(-l->pgid, sig) != 0 && errno != ESRCH)
        fprintf(stderr, "ztrain: cannot send signal %d to the ranks' process group %ld: %s\n", sig,
                (long)l->pgid, strerror(errno));
}

/* SIGTERM asks the ranks to end; SIGCONT lets a rank that is stopped (SIGSTOP, a debugger
 * detached) act on it instead of sitting out the grace period. */
static void terminate_group(launch *l) {
    signal_group(l, SIGTERM);
    signal_group(l, SIGCONT);
    l->term_signals_sent++;
}

static void kill_group(launch *l) {
    if (l->kill_sent)
        return;
    signal_group(l, SIGKILL);
    l->kill_sent = true;
}

/* What the launcher had sent the group, for zt_rank_exit_is_failure: a rank that died of the
 * SIGTERM forwarded for a stop (before it had installed its handler) was stopped, not broken;
 * anything after our SIGKILL is ours too. */
static zt_rank_sent sent_to_group(const launch *l) {
    if (l->kill_sent)
        return ZT_RANK_SENT_KILL;
    return l->user_signals > 0 && l->term_signals_sent == 1 ? ZT_RANK_SENT_STOP
                                                           : ZT_RANK_SENT_NONE;
}

/* The first failure was a rank's own exit: it may only have given up waiting for a peer that
 * stopped answering. Called before the group is continued (SIGCONT), which would hide a stop. */
static void find_stopped(launch *l) {
    const zt_rank_exit *first = &l->exits[l->first_failed];
    if (first->term_signal)
        return;
    for (int r = 0; r < l->n && l->stopped_rank < 0; r++)
        if (l->pids[r] > 0 && !l->reaped[r] && zt_rank_is_stopped(l->pids[r]))
            l->stopped_rank = r;
}

/* Reaps every rank that has ended (with block, every rank), the one SIGCHLD named first (hint_pid):
 * that signal carries the pid of the first child to change state since the last wakeup, which
 * orders a killed rank before the peers that exit because they noticed it. */
static void reap_ended(launch *l, pid_t hint_pid, bool block) {
    int order[l->n + 1], n_order = 0;
    for (int r = 0; r < l->n; r++)
        if (l->pids[r] == hint_pid && hint_pid > 0)
            order[n_order++] = r;
    for (int r = 0; r < l->n; r++)
        if (l->pids[r] != hint_pid || hint_pid <= 0)
            order[n_order++] = r;
    int failed[l->n], n_failed = 0;
    for (int i = 0; i < n_order; i++) {
        int r = order[i];
        if (l->pids[r] <= 0 || l->reaped[r])
            continue;
        int st;
        pid_t got;
        do
            got = waitpid(l->pids[r], &st, block ? 0 : WNOHANG);
        while (got < 0 && errno == EINTR);
        if (got == 0)
            continue;
        zt_rank_exit *x = &l->exits[r];
        if (got < 0) {
            /* ECHILD: another thread or a SIGCHLD handler reaped it; its status is lost. */
            x->exit_status = -1;
            x->term_signal = 0;
        } else if (WIFEXITED(st)) {
            x->exit_status = WEXITSTATUS(st);
            x->term_signal = 0;
        } else if (WIFSIGNALED(st)) {
            x->exit_status = -1;
            x->term_signal = WTERMSIG(st);
        } else {
            continue; /* stopped or continued: not reported without WUNTRACED, but be safe */
        }
        l->reaped[r] = 1;
        l->live--;
        if (l->grace_ran_out && x->term_signal == SIGKILL && l->unanswering_rank < 0)
            l->unanswering_rank = r;
        if (zt_rank_exit_is_failure(x, sent_to_group(l)))
            failed[n_failed++] = r;
    }
    if (n_failed > 0 && l->first_failed < 0) {
        /* Within one batch the order is known only for the SIGCHLD's pid; otherwise a rank killed
         * by a signal is the likelier cause than a peer that exited with an error after it. */
        int pick = failed[0];
        if (l->pids[pick] != hint_pid)
            for (int i = 0; i < n_failed; i++)
                if (l->exits[failed[i]].term_signal) {
                    pick = failed[i];
                    break;
                }
        l->first_failed = pick;
        find_stopped(l);
    }
}

static void begin_termination(launch *l) {
    if (l->terminating)
        return;
    l->terminating = true;
    l->deadline = now_s() + (l->opts->grace_s > 0 ? l->opts->grace_s : 5.0);
    terminate_group(l);
}

/* Waits for every started rank, acting on SIGCHLD, SIGINT and SIGTERM (all blocked). */
static void supervise(launch *l, const sigset_t *waitset) {
    while (l->live > 0) {
        double wait = 1.0; /* a periodic poll as well, in case a SIGCHLD went to another thread */
        if (l->terminating && !l->kill_sent) {
            double left = l->deadline - now_s();
            if (left <= 0) {
                l->grace_ran_out = true;
                kill_group(l);
                continue;
            }
            if (left < wait)
                wait = left;
        }
        struct timespec ts = {.tv_sec = (time_t)wait,
                              .tv_nsec = (long)((wait - (double)(time_t)wait) * 1e9)};
        siginfo_t si;
        int sig = sigtimedwait(waitset, &si, &ts);
        pid_t hint = 0;
        if (sig < 0) {
            if (errno != EAGAIN && errno != EINTR) {
                /* Cannot happen with a valid set and timeout; never leave the ranks unwatched. */
                fprintf(stderr, "ztrain: sigtimedwait: %s; killing the ranks\n", strerror(errno));
                kill_group(l);
                l->terminating = true;
            }
        } else if (sig == SIGCHLD) {
            if (si.si_code == CLD_EXITED || si.si_code == CLD_KILLED || si.si_code == CLD_DUMPED)
                hint = si.si_pid;
        } else if (l->user_signals > 0 && sig == SIGTERM &&
                   now_s() - l->first_signal_at < ZT_STOP_REPEATED_TERM_S) {
            /* The first stop asked for again, as a rank takes it (ztrain/stop_signals.h): a
             * supervisor or slurmd sends SIGTERM twice in a row, and killing the ranks for the
             * second would lose the checkpoint the first asked for. */
        } else {
            if (l->user_signals++ == 0)
                l->first_signal_at = now_s();
            if (l->user_signals == 1 && !l->terminating)
                terminate_group(l); /* a stop: the ranks checkpoint and exit 130, no deadline */
            else
                kill_group(l);
        }
        /* After SIGKILL, which cannot be caught, the ranks are waited for without a deadline. */
        reap_ended(l, hint, l->kill_sent);
        if (l->first_failed >= 0)
            begin_termination(l);
    }
}

/* What `ztrain run` says of the offload directories its killed ranks left (zt_rank_record). */
static void said_removed(void *ctx, int rank, const char *dir) {
    (void)ctx;
    fprintf(stderr, "ztrain: rank %d was killed before it could remove its NVMe offload "
                    "directory: removed %s\n", rank, dir);
}

static void said_not_removed(void *ctx, int rank, const char *dir, const char *why) {
    (void)ctx;
    fprintf(stderr, "ztrain: rank %d was killed before it could remove its NVMe offload "
                    "directory, and it cannot be removed: %s: %s; remove it by hand\n", rank,
            dir, why);
}

/* Starts the ranks through zt_rank_spawn: an empty signal mask (ours blocks SIGINT, SIGTERM and
 * SIGCHLD right now) and default dispositions even if our caller ignores some, no descriptor
 * other than 0-2 (the user's terminal), one process group. */
static zt_status spawn_all(launch *l, zt_rank_env *env) {
    zt_status s = ZT_OK;
    for (int r = 0; r < l->n; r++) {
        /* Rank 0 founds the group (pgid 0: its own pid); the others join it. The group exists
         * as long as rank 0 is unreaped, and nothing is reaped before every rank has started. */
        zt_rank_io io = {.pgid = l->pgid, .inherit_stdio = true};
        pid_t pid;
        s = zt_rank_spawn(env, r, &io, &pid, NULL);
        if (s != ZT_OK) {
            l->spawn_rank = r;
            snprintf(l->spawn_error, sizeof l->spawn_error, "%s", zt_last_error());
            break;
        }
        l->pids[r] = pid;
        l->exits[r].pid = pid;
        l->live++;
        if (r == 0)
            l->pgid = pid;
    }
    return s;
}

zt_status zt_launch_ranks(const zt_launch_options *opts, zt_launch_result *res) {
    res->stopped = res->killed = false;
    res->failed_rank = -1;
    if (!opts->program || !opts->argv || !opts->argv[0] || opts->world_size < 1)
        return zt_error(ZT_ERR_INVALID, "launch: a program, its argv and world_size >= 1 are "
                                        "required (world_size %d)", opts->world_size);
    int n = opts->world_size;
    launch l = {.opts = opts, .n = n, .first_failed = -1, .spawn_rank = -1, .stopped_rank = -1,
                .unanswering_rank = -1};
    l.pids = calloc((size_t)n, sizeof *l.pids);
    l.reaped = calloc((size_t)n, 1);
    l.exits = opts->exits ? opts->exits : calloc((size_t)n, sizeof *l.exits);
    if (!l.pids || !l.reaped || !l.exits) {
        free(l.pids);
        free(l.reaped);
        if (!opts->exits)
            free(l.exits);
        return zt_error(ZT_ERR_NOMEM, "out of memory launching %d ranks", n);
    }
    for (int r = 0; r < n; r++)
        l.exits[r] = (zt_rank_exit){.pid = 0, .exit_status = -1, .term_signal = 0};

    char run_id[96];
    if (opts->run_id) {
        snprintf(run_id, sizeof run_id, "%s", opts->run_id);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(run_id, sizeof run_id, "%ld-%lld%09ld", (long)getpid(), (long long)ts.tv_sec,
                 ts.tv_nsec);
    }
    /* Without a record the run goes on: only the clean-up after a SIGKILL is lost. */
    zt_rank_record record;
    if (zt_rank_record_init(&record) != ZT_OK)
        fprintf(stderr, "ztrain: warning: %s; a rank killed with SIGKILL will leave its NVMe "
                        "offload directory behind\n", zt_last_error());
    const char *extra_env[] = {record.var, NULL};
    int port = 0;
    zt_rank_env env = {0};
    zt_rank_group_spec spec = {.program = opts->program, .argv = opts->argv, .world_size = n,
                               .env = ZT_RANK_ENV_INHERIT, .identity = ZT_RANK_ID_TORCHRUN,
                               .master_addr = "127.0.0.1", .run_id = run_id,
                               .threads_per_rank = opts->threads_per_rank,
                               .wait = ZT_RANK_WAIT_AUTO, .cuda_devices = opts->cuda_devices,
                               .extra_env = record.var[0] ? extra_env : NULL};
    zt_status s = zt_rank_free_port(&port);
    spec.master_port = port;
    if (s == ZT_OK)
        s = zt_rank_env_init(&env, &spec);
    if (s != ZT_OK) {
        zt_rank_record_free(&record);
        free(l.pids);
        free(l.reaped);
        if (!opts->exits)
            free(l.exits);
        return s;
    }

    /* SIGCHLD is blocked and taken with sigtimedwait, which needs it not ignored: SIG_IGN would
     * make the kernel reap the ranks itself and lose their exit statuses. */
    struct sigaction old_chld, dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGCHLD, NULL, &old_chld);
    bool restore_chld = old_chld.sa_handler == SIG_IGN || (old_chld.sa_flags & SA_NOCLDWAIT);
    if (restore_chld)
        sigaction(SIGCHLD, &dfl, NULL);
    sigset_t waitset, old_mask;
    sigemptyset(&waitset);
    sigaddset(&waitset, SIGCHLD);
    sigaddset(&waitset, SIGINT);
    sigaddset(&waitset, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &waitset, &old_mask);

    /* Output the caller buffered must come before the ranks' own. */
    fflush(NULL);
    s = spawn_all(&l, &env);
    if (s != ZT_OK)
        begin_termination(&l);
    supervise(&l, &waitset);

    /* A SIGINT/SIGTERM that arrived after the last rank ended belongs to this run, which is over;
     * take it off so that it does not reach the caller's handler once the mask is restored. */
    struct timespec zero = {0, 0};
    sigset_t user;
    sigemptyset(&user);
    sigaddset(&user, SIGINT);
    sigaddset(&user, SIGTERM);
    while (sigtimedwait(&user, NULL, &zero) > 0)
        ;
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (restore_chld)
        sigaction(SIGCHLD, &old_chld, NULL);
    /* Every rank has ended: a directory still recorded is one a killed rank could not remove,
     * and a segment still named one that rank 0 left, killed before the others attached. */
    zt_rank_record_clean(&record, said_removed, said_not_removed, NULL);
    zt_comm_shm_remove_leftover(run_id);
    zt_rank_record_free(&record);

    char why[512];
    if (l.spawn_rank >= 0) {
        s = zt_error(ZT_ERR_IO, "cannot start rank %d: %s", l.spawn_rank, l.spawn_error);
    } else if (l.first_failed >= 0) {
        zt_rank_describe_exit(why, sizeof why, l.first_failed, NULL, &l.exits[l.first_failed],
                              NULL);
        int stuck = l.stopped_rank >= 0 ? l.stopped_rank : l.unanswering_rank;
        if (stuck >= 0 && !l.exits[l.first_failed].term_signal) {
            /* The peers' own messages name it too (waiting for rank 1, lost rank 1). */
            double grace = opts->grace_s > 0 ? opts->grace_s : 5.0;
            char line[1024];
            zt_rank_describe_stuck(line, sizeof line, stuck, l.exits[stuck].pid,
                                   stuck == l.stopped_rank, grace, why);
            s = zt_error(ZT_ERR_IO, "%s", line);
            res->failed_rank = stuck;
        } else {
            s = zt_error(ZT_ERR_IO, "%s", why);
            res->failed_rank = l.first_failed;
        }
    } else {
        /* Ranks that all exited 0 finished the job, even if a signal came in as they did. */
        s = ZT_OK;
        res->killed = l.kill_sent;
        for (int r = 0; r < n; r++)
            if (l.exits[r].exit_status != 0)
                res->stopped = true;
    }
    zt_rank_env_free(&env);
    free(l.pids);
    free(l.reaped);
    if (!opts->exits)
        free(l.exits);
    return s;
}
