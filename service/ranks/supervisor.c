/* The supervisor thread (supervisor.h): spawns rank groups, reads their pipes, reaps them through
 * pidfds and tears a group down when one of its ranks fails. Local groups are all here; a Slurm
 * group (one srun whose output speaks for all ranks) has its own file, supervisor_slurm.c, and
 * this loop polls and dispatches for both. */
#define _GNU_SOURCE
#include "supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "supervisor_internal.h"
#include "ztrain/comm.h"

#define POLL_MS 200
#define LINE_BYTES 16384            /* longer lines are split */
/* A metric record grows with the world (each rank's memory, step and system figures, some 600
 * bytes a rank), so rank 0's metrics pipe takes whole lines of up to 1 MiB: ~1,700 ranks. */
#define METRICS_LINE_BYTES (1 << 20)
#define DRAIN_AFTER_REAP_S 1.0      /* pipes held open by a stray grandchild stop counting */

/* ------------------------------------------------------------------------------------------ */
/* Groups                                                                                      */

static void group_free(zt_rank_group *g) {
    zt_rank_record_free(&g->record);
    for (int i = 0; i < g->n_pipes; i++) {
        if (g->pipes[i].fd >= 0)
            close(g->pipes[i].fd);
        free(g->pipes[i].buf);
    }
    for (int r = 0; r < g->n_procs; r++)
        if (g->procs[r].pidfd >= 0)
            close(g->procs[r].pidfd);
    zt_sup_slurm_free(g->slurm);
    free(g->pipes);
    free(g->procs);
    free(g);
}

/* n ranks in n_procs processes: 2 pipes per process, then the metrics stream. */
static zt_rank_group *group_alloc(int n, int n_procs, void *ctx) {
    zt_rank_group *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->ctx = ctx;
    g->n = n;
    g->n_procs = n_procs;
    g->n_pipes = 2 * n_procs + 1;
    g->procs = calloc((size_t)n_procs, sizeof *g->procs);
    g->pipes = calloc((size_t)g->n_pipes, sizeof *g->pipes);
    if (!g->procs || !g->pipes) {
        free(g->procs);
        free(g->pipes);
        free(g);
        return NULL;
    }
    for (int r = 0; r < n_procs; r++)
        g->procs[r].pidfd = -1;
    g->stuck_rank = -1;
    for (int i = 0; i < g->n_pipes; i++) {
        g->pipes[i].fd = -1;
        g->pipes[i].rank = i < 2 * n_procs ? i / 2 : 0;
        g->pipes[i].stream = i < 2 * n_procs ? (i % 2 ? "stderr" : "stdout") : "metrics";
    }
    return g;
}

/* Signals the group while one of its processes is unreaped (afterwards -pgid may be another's). */
void zt_sup_signal_group(zt_rank_group *g, int sig) {
    if (g->live > 0 && g->pgid > 0)
        kill(-g->pgid, sig);
}

zt_status zt_sup_open_pipe(int fds[2]) {
    if (pipe2(fds, O_CLOEXEC) != 0)
        return zt_error(ZT_ERR_IO, "pipe: %s", strerror(errno));
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    return ZT_OK;
}

void zt_sup_warn(zt_supervisor *s, const char *fmt, ...) {
    char text[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (s->cb.warning)
        s->cb.warning(s->ctx, text);
    else
        fprintf(stderr, "ztraind: %s\n", text);
}

/* Kills and reaps whatever a half-started group has running, then frees it; nothing of it may
 * outlive the failed start. */
static zt_status abandon_group(zt_rank_group *g, zt_status st) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zt_last_error());
    zt_sup_signal_group(g, SIGKILL);
    for (int r = 0; r < g->n_procs; r++)
        if (g->procs[r].pid > 0 && g->procs[r].pidfd >= 0)
            waitid(P_PIDFD, (id_t)g->procs[r].pidfd, &(siginfo_t){0}, WEXITED);
    group_free(g);
    return zt_error(st, "%s", msg);
}

/* The local ranks: one zt_rank_spawn each, with the whitelist environment and the torchrun
 * identity, stdout and stderr on pipes, and rank 0's metrics pipe as its fd 3. */
static zt_status start_local(zt_supervisor *s, const zt_group_spec *spec, zt_rank_group *g,
                             pid_t *pids) {
    /* Unique on the host even with several daemons: the shm backend names its segment after it. */
    char run_id[160];
    snprintf(run_id, sizeof run_id, "ztraind%ld-%s", (long)getpid(), spec->run_id);
    snprintf(g->run_id, sizeof g->run_id, "%s", run_id);
    ZT_ASSERT(spec->threads_per_rank > 0);
    /* The shm backend meets through ZTRAIN_RUN_ID, the gloo one (a job's "comm": "gloo") at the
     * port, where its rank 0 listens: a free one, so that concurrent jobs never share it. */
    int port = 0;
    zt_status pst = zt_rank_free_port(&port);
    if (pst != ZT_OK)
        return pst;
    char job_var[160];
    snprintf(job_var, sizeof job_var, "ZTRAIN_JOB_ID=%s", spec->job_id ? spec->job_id : "");
    /* Without a record the job runs all the same: only the clean-up after a SIGKILL is lost. */
    if (zt_rank_record_init(&g->record) != ZT_OK)
        zt_sup_warn(s, "warning: %s; a rank killed with SIGKILL will leave its NVMe offload "
                    "directory behind", zt_last_error());
    const char *extra[3] = {NULL}, **x = extra;
    if (spec->job_id)
        *x++ = job_var;
    if (g->record.var[0])
        *x++ = g->record.var;
    zt_rank_group_spec rs = {
        .program = spec->program, .argv = spec->argv, .cwd = spec->cwd,
        .extra_env = extra,
        .world_size = spec->world_size, .env = ZT_RANK_ENV_WHITELIST,
        .identity = ZT_RANK_ID_TORCHRUN, .master_addr = "127.0.0.1", .master_port = port,
        .run_id = run_id, .threads_per_rank = spec->threads_per_rank,
        .wait = spec->passive_wait ? ZT_RANK_WAIT_PASSIVE : ZT_RANK_WAIT_DEFAULT,
        .cuda_devices = spec->cuda_devices};
    zt_rank_env env;
    zt_status st = zt_rank_env_init(&env, &rs);
    for (int r = 0; st == ZT_OK && r < spec->world_size; r++) {
        int out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, met_p[2] = {-1, -1};
        st = zt_sup_open_pipe(out_p);
        if (st == ZT_OK)
            st = zt_sup_open_pipe(err_p);
        if (st == ZT_OK && r == 0)
            st = zt_sup_open_pipe(met_p);
        zt_rank_io io = {.pgid = g->pgid, .stdout_fd = out_p[1], .stderr_fd = err_p[1],
                         .metrics_fd = r == 0 ? met_p[1] : -1};
        if (st == ZT_OK)
            st = zt_rank_spawn(&env, r, &io, &g->procs[r].pid, &g->procs[r].pidfd);
        /* Our copies of the write ends close now, so EOF comes when the rank's do. */
        if (out_p[1] >= 0)
            close(out_p[1]);
        if (err_p[1] >= 0)
            close(err_p[1]);
        if (met_p[1] >= 0)
            close(met_p[1]);
        g->pipes[2 * r].fd = out_p[0];
        g->pipes[2 * r + 1].fd = err_p[0];
        if (r == 0)
            g->pipes[2 * spec->world_size].fd = met_p[0];
        if (st == ZT_OK) {
            if (r == 0)
                g->pgid = g->procs[0].pid;
            g->live++;
            if (pids)
                pids[r] = g->procs[r].pid;
        }
    }
    zt_rank_env_free(&env);
    return st;
}

zt_status zt_supervisor_start_group(zt_supervisor *s, const zt_group_spec *spec, void *group_ctx,
                                    zt_rank_group **out, pid_t *pids) {
    zt_rank_group *g = group_alloc(spec->world_size, spec->slurm ? 1 : spec->world_size,
                                   group_ctx);
    if (!g)
        return zt_error(ZT_ERR_NOMEM, "out of memory starting %d ranks", spec->world_size);
    g->fail_grace_s = spec->fail_grace_s;
    zt_status st = spec->slurm ? zt_sup_start_slurm(spec, g, pids) : start_local(s, spec, g, pids);
    if (st != ZT_OK)
        return abandon_group(g, st);
    g->next = s->groups;
    s->groups = g;
    *out = g;
    return ZT_OK;
}

/* Caller holds s->mu. */
static void kill_no_later(zt_rank_group *g, double at) {
    if (!g->kill_at || at < g->kill_at)
        g->kill_at = at;
}

void zt_rank_group_terminate(zt_supervisor *s, zt_rank_group *g, double grace_s) {
    double now = zt_sup_now_s();
    pthread_mutex_lock(&s->mu);
    if (g->slurm) {
        g->slurm->term_wanted = true;   /* the supervisor thread runs scancel */
    } else {
        zt_sup_signal_group(g, SIGTERM);
        zt_sup_signal_group(g, SIGCONT);   /* a stopped rank must be able to act on it */
    }
    if (!g->term_at)
        g->term_at = now;
    kill_no_later(g, now + (grace_s > 0 ? grace_s : 0));
    g->tearing_down = true;
    pthread_mutex_unlock(&s->mu);
    zt_supervisor_wake(s);
}

void zt_rank_group_kill_within(zt_supervisor *s, zt_rank_group *g, double grace_s) {
    double now = zt_sup_now_s();
    pthread_mutex_lock(&s->mu);
    kill_no_later(g, now + (grace_s > 0 ? grace_s : 0));
    pthread_mutex_unlock(&s->mu);
    zt_supervisor_wake(s);
}

void zt_rank_group_kill(zt_supervisor *s, zt_rank_group *g) {
    pthread_mutex_lock(&s->mu);
    if (g->slurm) {
        g->kill_at = zt_sup_now_s();      /* the supervisor thread runs scancel --signal=KILL */
    } else {
        zt_sup_signal_group(g, SIGKILL);
        g->kill_sent = true;
    }
    g->tearing_down = true;
    pthread_mutex_unlock(&s->mu);
    zt_supervisor_wake(s);
}

/* ------------------------------------------------------------------------------------------ */
/* The thread                                                                                  */

static void emit_line(zt_supervisor *s, zt_rank_group *g, line_pipe *p, const char *line) {
    if (p->stream[0] == 'm')
        s->cb.metrics_line(g->ctx, line);
    else if (g->slurm)
        zt_sup_slurm_line(s, g, p->stream, line);
    else
        s->cb.log_line(g->ctx, p->rank, p->stream, line);
}

static void flush_partial(zt_supervisor *s, zt_rank_group *g, line_pipe *p) {
    if (p->len == 0)
        return;
    p->buf[p->len] = '\0';
    emit_line(s, g, p, p->buf);
    p->len = 0;
}

/* Reads what is there, hands on complete lines; EOF or an error closes the pipe. */
void zt_sup_read_pipe(zt_supervisor *s, zt_rank_group *g, line_pipe *p) {
    const size_t cap = p->stream[0] == 'm' ? METRICS_LINE_BYTES : LINE_BYTES;
    if (!p->buf && !(p->buf = malloc(cap + 1)))
        return;
    for (;;) {
        ssize_t k = read(p->fd, p->buf + p->len, cap - p->len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EAGAIN)
            return;
        if (k <= 0) {
            flush_partial(s, g, p);
            close(p->fd);
            p->fd = -1;
            return;
        }
        p->len += (size_t)k;
        size_t start = 0;
        for (size_t i = 0; i < p->len; i++) {
            if (p->buf[i] != '\n')
                continue;
            p->buf[i] = '\0';
            emit_line(s, g, p, p->buf + start);
            start = i + 1;
        }
        memmove(p->buf, p->buf + start, p->len - start);
        p->len -= start;
        if (p->len == cap)
            flush_partial(s, g, p);
    }
}

/* A rank exited with an error and takes the group down: a peer it waited for may be stopped.
 * Called before the group is continued (SIGCONT), which would hide the stop. */
static void find_stopped(zt_rank_group *g) {
    for (int r = 0; r < g->n_procs && g->stuck_rank < 0; r++)
        if (g->procs[r].pidfd >= 0 && zt_rank_is_stopped(g->procs[r].pid))
            g->stuck_rank = r;
}

static void reap_rank(zt_supervisor *s, zt_rank_group *g, int r) {
    siginfo_t si = {0};
    if (waitid(P_PIDFD, (id_t)g->procs[r].pidfd, &si, WEXITED | WNOHANG) != 0 || si.si_pid == 0)
        return;
    close(g->procs[r].pidfd);
    g->procs[r].pidfd = -1;
    int code = si.si_code == CLD_EXITED ? si.si_status : -1;
    int sig = si.si_code == CLD_EXITED ? 0 : si.si_status;
    /* The pipes of this rank may still hold its last words; read them before reporting. */
    zt_sup_read_pipe(s, g, &g->pipes[2 * r]);
    zt_sup_read_pipe(s, g, &g->pipes[2 * r + 1]);
    if (r == 0 && g->pipes[2 * g->n].fd >= 0)
        zt_sup_read_pipe(s, g, &g->pipes[2 * g->n]);
    pthread_mutex_lock(&s->mu);
    g->live--;
    if (g->live == 0)
        g->reaped_at = zt_sup_now_s();
    bool teardown = zt_sup_rank_failed(code, sig) && !g->tearing_down && g->live > 0;
    pthread_mutex_unlock(&s->mu);
    s->cb.rank_exited(g->ctx, r, g->procs[r].pid, NULL, code, sig);
    if (teardown && sig == 0)
        find_stopped(g);
    if (teardown)
        zt_rank_group_terminate(s, g, g->fail_grace_s);
}

static bool group_done(const zt_rank_group *g, double now) {
    if (g->live > 0)
        return false;
    if (now - g->reaped_at > DRAIN_AFTER_REAP_S)
        return true;
    for (int i = 0; i < g->n_pipes; i++)
        if (g->pipes[i].fd >= 0)
            return false;
    return true;
}

/* The text of zt_group_end.offload_dirs, built by zt_rank_record_clean's callbacks. */
typedef struct {
    char text[2048];
    size_t len;
} dirs_note;

static void note_dir(dirs_note *n, int rank, const char *dir, const char *why) {
    if (n->len >= sizeof n->text - 1)
        return;
    int w = snprintf(n->text + n->len, sizeof n->text - n->len, "%srank %d: %s%s%s%s",
                     n->len ? "; " : "", rank, dir, why ? " (cannot remove: " : "",
                     why ? why : "", why ? ")" : "");
    n->len = w < 0 ? n->len : n->len + (size_t)w;
    if (n->len >= sizeof n->text)
        n->len = sizeof n->text - 1;
}

static void dir_removed(void *ctx, int rank, const char *dir) {
    note_dir(ctx, rank, dir, NULL);
}

static void dir_not_removed(void *ctx, int rank, const char *dir, const char *why) {
    note_dir(ctx, rank, dir, why);
}

static void finish_groups(zt_supervisor *s) {
    double now = zt_sup_now_s();
    zt_rank_group **link = &s->groups;
    while (*link) {
        zt_rank_group *g = *link;
        if (g->slurm) {
            zt_sup_drive_slurm(s, g, now);
        } else {
            pthread_mutex_lock(&s->mu);
            if (g->live > 0 && g->kill_at && now >= g->kill_at && !g->kill_sent) {
                zt_sup_signal_group(g, SIGKILL);
                g->kill_sent = true;
            }
            pthread_mutex_unlock(&s->mu);
        }
        if (!group_done(g, now)) {
            link = &g->next;
            continue;
        }
        for (int i = 0; i < g->n_pipes; i++)
            if (g->pipes[i].fd >= 0) {
                zt_sup_read_pipe(s, g, &g->pipes[i]);
                flush_partial(s, g, &g->pipes[i]);
            }
        *link = g->next;
        /* A cancel may still come in (and move kill_at) until group_ended has returned. */
        pthread_mutex_lock(&s->mu);
        zt_group_end end = {.killed = g->kill_sent, .stuck_rank = g->stuck_rank};
        if (g->stuck_rank >= 0)
            end.stuck_pid = g->procs[g->stuck_rank].pid;
        if (g->kill_sent && g->term_at && g->kill_at >= g->term_at)
            end.grace_s = g->kill_at - g->term_at;
        pthread_mutex_unlock(&s->mu);
        /* Every rank is reaped: a directory still recorded is one a killed rank left, and a
         * segment still named one that rank 0 left, killed before the others attached; a
         * restart of the job would find it. */
        if (!g->slurm)
            zt_comm_shm_remove_leftover(g->run_id);
        dirs_note dirs = {.text = ""};
        zt_rank_record_clean(&g->record, dir_removed, dir_not_removed, &dirs);
        end.offload_dirs = dirs.text;
        s->cb.group_ended(g->ctx, &end);
        group_free(g);
    }
}

/* What a polled descriptor belongs to. */
typedef enum { OWNER_PIPE, OWNER_PROC, OWNER_LISTENER, OWNER_HELPER } owner_kind;
typedef struct {
    owner_kind kind;
    zt_rank_group *g;
    int index;              /* pipe or process index */
    helper *h;
} poll_owner;

static void *supervisor_main(void *arg) {
    zt_supervisor *s = arg;
    size_t cap = 0;
    struct pollfd *pfd = NULL;
    poll_owner *owner = NULL;
    while (!atomic_load(&s->stop)) {
        s->cb.tick(s->ctx);
        size_t need = 1;
        for (zt_rank_group *g = s->groups; g; g = g->next)
            need += (size_t)(g->n_pipes + g->n_procs) + (g->slurm ? 8 : 0);
        for (helper *h = s->helpers; h; h = h->next)
            need++;
        if (need > cap) {
            cap = need * 2;
            pfd = realloc(pfd, cap * sizeof *pfd);
            owner = realloc(owner, cap * sizeof *owner);
            ZT_ASSERT(pfd && owner);
        }
        size_t n = 0;
        pfd[n++] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
        double timeout = POLL_MS / 1e3, now = zt_sup_now_s();
        for (zt_rank_group *g = s->groups; g; g = g->next) {
            for (int i = 0; i < g->n_pipes; i++)
                if (g->pipes[i].fd >= 0) {
                    owner[n] = (poll_owner){OWNER_PIPE, g, i, NULL};
                    pfd[n++] = (struct pollfd){.fd = g->pipes[i].fd, .events = POLLIN};
                }
            for (int r = 0; r < g->n_procs; r++)
                if (g->procs[r].pidfd >= 0) {
                    owner[n] = (poll_owner){OWNER_PROC, g, r, NULL};
                    pfd[n++] = (struct pollfd){.fd = g->procs[r].pidfd, .events = POLLIN};
                }
            if (g->slurm && g->slurm->listener) {
                int k = zt_metrics_listener_fds(g->slurm->listener, pfd + n, 8);
                for (int i = 0; i < k; i++)
                    owner[n + (size_t)i] = (poll_owner){OWNER_LISTENER, g, 0, NULL};
                n += (size_t)k;
            }
            pthread_mutex_lock(&s->mu);
            if (g->kill_at && !g->kill_sent && g->kill_at - now < timeout)
                timeout = g->kill_at - now > 0 ? g->kill_at - now : 0;
            if (g->slurm && g->slurm->term_wanted && !g->slurm->term_sent)
                timeout = 0;
            pthread_mutex_unlock(&s->mu);
            if (g->live == 0)
                timeout = 0.05;
        }
        for (helper *h = s->helpers; h; h = h->next) {
            owner[n] = (poll_owner){OWNER_HELPER, NULL, 0, h};
            pfd[n++] = (struct pollfd){.fd = h->pidfd, .events = POLLIN};
        }
        int ready = poll(pfd, (nfds_t)n, (int)(timeout * 1e3) + 1);
        if (ready > 0) {
            if (pfd[0].revents) {
                uint64_t v;
                if (read(s->wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
                    perror("ztraind: supervisor wake");
            }
            for (size_t i = 1; i < n; i++) {
                if (!pfd[i].revents)
                    continue;
                zt_rank_group *g = owner[i].g;
                int k = owner[i].index;
                switch (owner[i].kind) {
                case OWNER_PIPE:
                    if (g->pipes[k].fd >= 0)
                        zt_sup_read_pipe(s, g, &g->pipes[k]);
                    break;
                case OWNER_PROC:
                    if (g->procs[k].pidfd >= 0 && g->slurm)
                        zt_sup_reap_srun(s, g);
                    else if (g->procs[k].pidfd >= 0)
                        reap_rank(s, g, k);
                    break;
                case OWNER_LISTENER:
                    break;      /* accept_metrics below */
                case OWNER_HELPER:
                    zt_sup_reap_helper(s, owner[i].h);
                    break;
                }
            }
        }
        for (zt_rank_group *g = s->groups; g; g = g->next)
            zt_sup_accept_metrics(g);
        finish_groups(s);
    }
    free(pfd);
    free(owner);
    return NULL;
}

zt_status zt_supervisor_create(zt_supervisor **out, const zt_supervisor_callbacks *cb, void *ctx) {
    zt_supervisor *s = calloc(1, sizeof *s);
    if (!s)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    s->cb = *cb;
    s->ctx = ctx;
    pthread_mutex_init(&s->mu, NULL);
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0) {
        free(s);
        return zt_error(ZT_ERR_IO, "eventfd: %s", strerror(errno));
    }
    int rc = pthread_create(&s->thread, NULL, supervisor_main, s);
    if (rc != 0) {
        close(s->wake_fd);
        free(s);
        return zt_error(ZT_ERR_IO, "cannot start the supervisor thread: %s", strerror(rc));
    }
    *out = s;
    return ZT_OK;
}

void zt_supervisor_wake(zt_supervisor *s) {
    uint64_t one = 1;
    if (write(s->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        perror("ztraind: supervisor wake");
}

void zt_supervisor_destroy(zt_supervisor *s) {
    if (!s)
        return;
    atomic_store(&s->stop, true);
    zt_supervisor_wake(s);
    pthread_join(s->thread, NULL);
    /* Whatever is left dies with the daemon's shutdown; reap it so no zombie is left either. */
    for (zt_rank_group *g = s->groups, *next; g; g = next) {
        next = g->next;
        if (g->slurm && g->live > 0)
            zt_sup_slurm_kill_now(g);
        zt_sup_signal_group(g, SIGKILL);
        for (int r = 0; r < g->n_procs; r++)
            if (g->procs[r].pidfd >= 0)
                waitid(P_PIDFD, (id_t)g->procs[r].pidfd, &(siginfo_t){0}, WEXITED);
        group_free(g);
    }
    for (helper *h = s->helpers, *next; h; h = next) {
        next = h->next;
        waitid(P_PIDFD, (id_t)h->pidfd, &(siginfo_t){0}, WEXITED);
        close(h->pidfd);
        close(h->err_fd);
        free(h);
    }
    close(s->wake_fd);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
