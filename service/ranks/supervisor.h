/* The supervisor: one thread that owns every rank process of every job. It spawns a job's ranks
 * as one process group, reads their stdout/stderr and rank 0's metrics pipe line by line, reaps
 * exactly the pids it started (through pidfds, never waitpid(-1)), and tears a group down when a
 * rank fails. What it sees goes to the job manager through callbacks on the supervisor thread.
 *
 * A group's ranks are either local processes or, with a Slurm spec, the tasks of one srun that
 * the supervisor starts instead (slurm_launch.h): their lines come through srun's labelled
 * output, their exits from srun's reports, rank 0's metrics over a per-job TCP endpoint
 * (metrics_listener.h), and stopping them is scancel's job.
 *
 * Spawning also happens on this thread: a rank asks to be told when its parent thread dies
 * (PR_SET_PDEATHSIG), so its parent must be a thread that lives as long as the daemon. */
#ifndef ZTRAIN_SUPERVISOR_H
#define ZTRAIN_SUPERVISOR_H

#include <stdbool.h>
#include <sys/types.h>

#include "slurm_launch.h"
#include "ztrain/status.h"

typedef struct zt_supervisor zt_supervisor;
typedef struct zt_rank_group zt_rank_group;

/* What the scheduler did with a Slurm group's job, beyond its ranks' own exits. */
typedef enum {
    ZT_LAUNCH_WAITING = 1,   /* queued in Slurm, waiting for resources: text says so */
    ZT_LAUNCH_ALLOCATED,     /* it got its nodes */
    ZT_LAUNCH_STOPPED,       /* cancelled in Slurm from outside ztraind (scancel, preemption) */
    ZT_LAUNCH_FAILED,        /* srun failed, or Slurm ended the job for a failure (time limit,
                                node failure): text says which */
} zt_launch_event;

/* How the supervisor ended a group, beyond what its ranks' exits say. */
typedef struct {
    /* The supervisor sent SIGKILL (for Slurm: scancel --signal=KILL): a grace period ran out,
     * or zt_rank_group_kill asked for it. */
    bool killed;
    /* When killed after a graceful stop: the grace period that ran out, in seconds from the
     * first zt_rank_group_terminate to the SIGKILL deadline in force (the shortest asked for);
     * 0 otherwise. */
    double grace_s;
    /* Local groups: "rank 1: <dir>" for each NVMe offload directory that a rank killed with
     * SIGKILL could not remove and the supervisor removed once every rank had ended (the
     * ranks record them, rank_group.h: zt_rank_record), "; "-separated, and "rank 1: <dir>
     * (cannot remove: <why>)" for one it could not; "" when there was none. */
    const char *offload_dirs;
    /* Local groups whose first failure was a rank's exit with an error: that rank may only have
     * given up waiting for a peer that stopped answering. stuck_rank is a peer found stopped
     * (SIGSTOP, a debugger) before the group was continued (-1: none), stuck_pid its pid
     * (rank_group.h: zt_rank_describe_stuck words it). A rank merely slow to end after SIGTERM
     * is not blamed: it may be finishing a long step. */
    int stuck_rank;
    pid_t stuck_pid;
} zt_group_end;

/* All run on the supervisor thread, with no supervisor lock held. */
typedef struct {
    /* Every loop iteration (at least every 200 ms, and at once after zt_supervisor_wake): the
     * place to start queued jobs with zt_supervisor_start_group. */
    void (*tick)(void *ctx);
    /* One complete line from rank 0's metrics pipe (no newline). */
    void (*metrics_line)(void *group_ctx, const char *line);
    /* One line of a rank's stdout or stderr (no newline); rank -1 for a line of srun's own. */
    void (*log_line)(void *group_ctx, int rank, const char *stream, const char *line);
    /* A rank ended: exit_code when it exited, or the signal that ended it. pid is 0 and host
     * the node's name for a Slurm rank (srun reports no pid); host is NULL for a local one. */
    void (*rank_exited)(void *group_ctx, int rank, pid_t pid, const char *host, int exit_code,
                        int signal);
    /* Slurm groups: a rank said where it runs (its pid on that node). */
    void (*rank_placed)(void *group_ctx, int rank, pid_t pid, const char *host);
    /* Slurm groups: what the scheduler did with the job (see zt_launch_event). */
    void (*launch_event)(void *group_ctx, zt_launch_event event, const char *text);
    /* Every rank is reaped and the pipes are drained. The group is freed after this returns. */
    void (*group_ended)(void *group_ctx, const zt_group_end *end);
    /* A problem for the operator that no job's log holds (a scancel that failed, a clean-up
     * that will not happen): one message, no newline, for the daemon's own log. NULL: written
     * to stderr. */
    void (*warning)(void *ctx, const char *text);
} zt_supervisor_callbacks;

typedef struct {
    const char *program;       /* ztrain-worker */
    char *const *argv;         /* NULL-terminated */
    const char *cwd;
    int world_size;
    int threads_per_rank;      /* OMP_NUM_THREADS, at least 1: the caller chose it from the
                                  cores it shares out (job_runner.c's start_job) */
    /* OMP_WAIT_POLICY=PASSIVE (unless the daemon's environment chose a policy): other jobs may
     * share the cores, and OpenMP threads spinning at barriers would take them. */
    bool passive_wait;
    const char *run_id;        /* ZTRAIN_RUN_ID: names the ranks' shm segment */
    const char *job_id;        /* ZTRAIN_JOB_ID: the daemon's job, which checkpoints record;
                                  NULL: not set */
    /* Local groups: world_size strings, the GPUs each rank may use (its CUDA_VISIBLE_DEVICES,
     * see rank_group.h); NULL: none assigned, and the daemon's own CUDA_VISIBLE_DEVICES, if
     * any, is passed on. */
    const char *const *cuda_devices;
    /* After a rank fails, the others get SIGTERM, then SIGKILL after this many seconds. */
    double fail_grace_s;
    /* NULL: the ranks are local processes. Else one srun places them on the Slurm cluster
     * (program and argv are then the worker's; job_name and run_id are copied). */
    const zt_slurm_job *slurm;
} zt_group_spec;

zt_status zt_supervisor_create(zt_supervisor **out, const zt_supervisor_callbacks *cb, void *ctx);
/* SIGKILLs and reaps whatever is still running, stops the thread. No callback runs after it. */
void zt_supervisor_destroy(zt_supervisor *s);
/* Makes the thread run `tick` soon. Any thread. */
void zt_supervisor_wake(zt_supervisor *s);

/* Supervisor thread only (from tick). Starts world_size ranks with a clean environment
 * (rank_group.h: a short list of inherited variables, the torchrun identity, OMP_NUM_THREADS,
 * CUDA_VISIBLE_DEVICES from cuda_devices, ZTRAIN_METRICS_FD=3 for rank 0). pids gets
 * world_size entries. On failure nothing is left running and no callback will come.
 *
 * With spec->slurm it starts one srun instead, whose environment carries no torchrun identity
 * (the ranks take Slurm's) but ZTRAIN_METRICS_ADDR/ZTRAIN_METRICS_TOKEN for rank 0 and
 * ZTRAIN_REPORT_PLACEMENT=1; pids are all 0 until the ranks report (rank_placed). */
zt_status zt_supervisor_start_group(zt_supervisor *s, const zt_group_spec *spec, void *group_ctx,
                                    zt_rank_group **out, pid_t *pids);

/* Any thread; g is valid until its group_ended callback has returned. Graceful: SIGTERM (and
 * SIGCONT) to the group now, SIGKILL when grace_s has passed. For a Slurm group that is
 * `scancel --signal=TERM`, then `scancel --signal=KILL` (and a pending job is simply
 * cancelled); srun itself is killed only when it has not ended 10 s after that. */
void zt_rank_group_terminate(zt_supervisor *s, zt_rank_group *g, double grace_s);
/* Any thread, for a group already terminated: its SIGKILL comes at most grace_s from now (an
 * earlier one stays). Nothing is signalled now, so ranks stopping with a checkpoint do not take
 * a second SIGTERM as "die at once" (ztrain/stop_signals.h). */
void zt_rank_group_kill_within(zt_supervisor *s, zt_rank_group *g, double grace_s);
void zt_rank_group_kill(zt_supervisor *s, zt_rank_group *g);

#endif
