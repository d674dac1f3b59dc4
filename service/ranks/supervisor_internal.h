/* What supervisor.c (the thread, local groups) and supervisor_slurm.c (Slurm groups) share:
 * the group and supervisor structures and a few helpers. Not an API: nothing outside these two
 * files includes it. */
#ifndef ZTRAIN_SUPERVISOR_INTERNAL_H
#define ZTRAIN_SUPERVISOR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "metrics_listener.h"
#include "rank_group.h"
#include "supervisor.h"

typedef struct {
    int fd;                 /* -1 once closed */
    int rank;
    const char *stream;     /* "stdout", "stderr", or "metrics" */
    char *buf;
    size_t len;
} line_pipe;

typedef struct {
    pid_t pid;
    int pidfd;              /* -1 once reaped */
} child_proc;

/* What a Slurm group knows beyond its one process, srun. Supervisor thread only, except
 * term_wanted (under the supervisor's mutex). */
typedef struct {
    zt_slurm_config cfg;
    char *job_name;
    zt_metrics_listener *listener;   /* until rank 0 has connected */
    bool *ended;            /* per rank: srun reported its end */
    bool ranks_seen;        /* a task wrote, said where it runs or ended: the step ran */
    bool term_wanted;       /* a graceful stop was asked for */
    bool term_sent;         /* scancel --signal=TERM was run */
    bool cancel_noted;      /* Slurm's own cancel was reported to the manager */
    double srun_kill_at;    /* when srun gets SIGKILL itself; 0: not scheduled */
    bool srun_killed;
    char last_line[512];    /* srun's last own line, and its last error: why a launch failed */
    char last_error[512];
} slurm_part;

struct zt_rank_group {
    void *ctx;
    int n;                  /* ranks */
    int n_procs;            /* processes started here: n, or 1 (srun) */
    child_proc *procs;
    line_pipe *pipes;       /* local: stdout and stderr of every rank, then rank 0's metrics pipe;
                               Slurm: srun's stdout and stderr, then rank 0's metrics connection */
    int n_pipes;
    pid_t pgid;
    int live;               /* processes not yet reaped */
    double reaped_at;       /* when live reached 0 */
    double fail_grace_s;
    slurm_part *slurm;      /* NULL for local ranks */
    /* Shared with other threads, under the supervisor's mutex. */
    bool tearing_down;
    double term_at;         /* CLOCK_MONOTONIC seconds of the first graceful stop; 0: none */
    double kill_at;         /* CLOCK_MONOTONIC seconds; 0: no SIGKILL scheduled */
    bool kill_sent;
    /* Local groups, supervisor thread only: the rank found stopped when a rank that exited
     * with an error took the group down (zt_group_end.stuck_rank; -1: none). */
    int stuck_rank;
    /* Local groups: ZTRAIN_RUN_ID, which names their shm segment. */
    char run_id[160];
    /* Local groups: where the ranks record their NVMe offload directories (rank_group.h). */
    zt_rank_record record;
    zt_rank_group *next;
};

/* A short-lived command of the supervisor's own (scancel), reaped like a rank. */
typedef struct helper {
    pid_t pid;
    int pidfd;
    int err_fd;             /* its stderr, read when it has ended */
    char what[200];
    struct helper *next;
} helper;

struct zt_supervisor {
    zt_supervisor_callbacks cb;
    void *ctx;
    pthread_t thread;
    int wake_fd;
    pthread_mutex_t mu;
    zt_rank_group *groups;  /* changed only by the supervisor thread */
    helper *helpers;        /* likewise */
    atomic_bool stop;
};

static inline double zt_sup_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A rank's end that takes its group down: rank_group.h's verdict. The supervisor's own signals
 * need no exception: a group that is being torn down is not torn down again. */
static inline bool zt_sup_rank_failed(int exit_code, int sig) {
    zt_rank_exit x = {.exit_status = exit_code, .term_signal = sig};
    return zt_rank_exit_is_failure(&x, ZT_RANK_SENT_NONE);
}
/* Signals the group's process group while one of its processes is unreaped. */
void zt_sup_signal_group(zt_rank_group *g, int sig);
/* A close-on-exec pipe whose read end is non-blocking. */
zt_status zt_sup_open_pipe(int fds[2]);
/* Hands a message to cb.warning (printf-style, no newline). */
void zt_sup_warn(zt_supervisor *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reads what the pipe has and hands on complete lines; EOF closes it. */
void zt_sup_read_pipe(zt_supervisor *s, zt_rank_group *g, line_pipe *p);

/* supervisor_slurm.c, on the supervisor thread unless said otherwise. */
zt_status zt_sup_start_slurm(const zt_group_spec *spec, zt_rank_group *g, pid_t *pids);
void zt_sup_slurm_free(slurm_part *sl);
/* One line of srun's stdout or stderr. */
void zt_sup_slurm_line(zt_supervisor *s, zt_rank_group *g, const char *stream, const char *line);
/* srun's pidfd is readable. */
void zt_sup_reap_srun(zt_supervisor *s, zt_rank_group *g);
/* Acts on stops asked for by other threads and on deadlines (scancel, then srun's SIGKILL). */
void zt_sup_drive_slurm(zt_supervisor *s, zt_rank_group *g, double now);
/* Takes rank 0's metrics connection when it has arrived. */
void zt_sup_accept_metrics(zt_rank_group *g);
/* A helper's pidfd is readable. */
void zt_sup_reap_helper(zt_supervisor *s, helper *h);
/* zt_supervisor_destroy: scancel --signal=KILL, waiting for it. */
void zt_sup_slurm_kill_now(zt_rank_group *g);

#endif
