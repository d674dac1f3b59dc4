/* Starting and supervising the rank processes of one job on this host.
 *
 * `ztrain run` hands zt_launch_ranks a worker program and its
 * arguments; it starts world_size copies as one new process group, gives each its identity in the
 * torchrun environment, and waits until every rank has ended. The first rank to fail takes the
 * whole group down with it, so a job never ends with some of its ranks still running. */
#ifndef ZTRAIN_LAUNCHER_H
#define ZTRAIN_LAUNCHER_H

#include <stdbool.h>
#include <sys/types.h>

#include "ranks/rank_group.h"
#include "ztrain/status.h"

typedef struct {
    const char *program;    /* path of the worker executable; it is not searched in PATH */
    char *const *argv;      /* the worker's argv, argv[0] included, NULL-terminated */
    int world_size;         /* ranks to start, >= 1 */
    /* Distinguishes this run's ranks from any other job's on the host (the shm backend names its
     * segment after it). NULL: "<launcher pid>-<nanoseconds since the epoch>". */
    const char *run_id;
    /* OpenMP threads per rank (OMP_NUM_THREADS); 0: the user's OMP_NUM_THREADS if set, else
     * max(1, cpus / world_size) with cpus from this process's affinity mask. */
    int threads_per_rank;
    /* world_size strings, rank r's CUDA_VISIBLE_DEVICES (see zt_rank_group_spec); NULL: the
     * ranks inherit the user's CUDA_VISIBLE_DEVICES, if any, like the rest of the environment. */
    const char *const *cuda_devices;
    /* Seconds the ranks get to exit after SIGTERM before they are sent SIGKILL (<= 0: 5 s). */
    double grace_s;
    /* If not NULL, world_size entries the launcher fills with how each rank ended (pid 0: the
     * rank was never started). */
    zt_rank_exit *exits;
} zt_launch_options;

typedef struct {
    /* The job was stopped: the launcher received SIGINT or SIGTERM and forwarded it, or every
     * rank exited 0 or 130 with at least one 130 (a rank that was itself asked to stop). */
    bool stopped;
    /* A second SIGINT/SIGTERM made the launcher SIGKILL the ranks: stopped is set too, but the
     * ranks did not get to finish their step or write a checkpoint. */
    bool killed;
    int failed_rank;        /* the first rank that failed, or -1 */
} zt_launch_result;

/* Starts opts->world_size copies of opts->program and waits until all of them have ended.
 *
 * Each rank gets the launcher's environment plus RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
 * MASTER_ADDR=127.0.0.1, MASTER_PORT (a port that was free on loopback), ZTRAIN_RUN_ID,
 * ZTRAIN_LAUNCHER_PID, ZTRAIN_OFFLOAD_RECORD (see below), and OMP_NUM_THREADS (see
 * threads_per_rank); OMP_WAIT_POLICY=PASSIVE when the ranks' threads outnumber the cores and the
 * user chose no policy; CUDA_VISIBLE_DEVICES when cuda_devices assigns GPUs. Slurm's and torchelastic's identity variables are removed so
 * that they cannot contradict these (rank_group.h: ZT_RANK_ENV_INHERIT, ZT_RANK_WAIT_AUTO).
 * Ranks inherit stdin, stdout and stderr and no other descriptor, start with default signal
 * dispositions and an empty signal mask, and form one new process group whose id is rank 0's pid.
 *
 * Returns ZT_OK when every rank exited 0 (res->stopped false) or the job was stopped (see
 * zt_launch_result). When a rank exits non-zero (other than a stop's 130) or is killed by a
 * signal, the group is sent SIGTERM (and SIGCONT, so that a stopped rank can act on it), then
 * SIGKILL after opts->grace_s, every rank is reaped, and ZT_ERR_IO is returned with a message
 * naming the first failing rank: "rank 1 (pid 4242) was killed by signal 9 (SIGKILL)". Later
 * failures of other ranks are taken as consequences and not named. When that first failure is a
 * rank's own exit (not a signal), it may be a survivor that gave up waiting for a stuck peer
 * (its collective timed out): then a rank that was stopped at that moment (state T, SIGSTOP or a
 * debugger), else one that ignored the SIGTERM and SIGCONT for the whole grace period and had to
 * be SIGKILLed, is named instead, as the survivors' messages name it: "rank 1 (pid 4243) stopped
 * answering: it was stopped (SIGSTOP or a debugger) when rank 0 (pid 4242) exited with status
 * 1". res->failed_rank is the rank named. A rank that cannot be started
 * (a missing or non-executable program) is ZT_ERR_IO naming the program's path; the ranks already
 * started are ended the same way.
 *
 * While it runs, SIGINT, SIGTERM and SIGCHLD are blocked in the calling thread and taken with
 * sigtimedwait: the first SIGINT/SIGTERM is forwarded to the group as SIGTERM (the ranks finish
 * their step, checkpoint and exit 130), a second one SIGKILLs the group.
 *
 * Once every rank has ended, whatever NVMe offload directory a rank recorded in the file named
 * by ZTRAIN_OFFLOAD_RECORD and did not remove itself (it was killed: by the SIGKILL above, or
 * from outside) is removed, each with a line on stderr naming the rank and the directory
 * (rank_group.h: zt_rank_record). The caller's signal mask
 * and SIGCHLD disposition are restored before it returns. It waits only for the pids it started
 * (never for other children of the caller), so call it from a process whose other threads block
 * SIGINT and SIGTERM, and that does not set SIGCHLD to SIG_IGN concurrently. */
zt_status zt_launch_ranks(const zt_launch_options *opts, zt_launch_result *res);

#endif
