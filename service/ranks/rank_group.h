/* The contract between a job's ranks on this host and whoever starts them, shared by `ztrain run`
 * (launcher.c) and ztraind's supervisor: the environment a rank gets (its identity, its threads,
 * the GPUs it may use), the one call that starts a rank, and how a rank's end is judged and told.
 * Each keeps its own loop for watching the ranks; what a rank sees and what a user reads of it
 * come from here. */
#ifndef ZTRAIN_RANK_GROUP_H
#define ZTRAIN_RANK_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "ztrain/status.h"

/* The exit status of a rank that stopped on request: told to stop (SIGINT or SIGTERM), it
 * finished its step, wrote its checkpoint and exited with the status a shell gives SIGINT. */
#define ZT_RANK_EXIT_STOPPED 130

/* Which of the caller's environment variables the ranks inherit. */
typedef enum {
    /* `ztrain run`: all of them, since a user expects their own environment, less the identity
     * variables of launchers (RANK, WORLD_SIZE, MASTER_PORT, ZTRAIN_RUN_ID, SLURM_PROCID,
     * SLURM_NTASKS, TORCHELASTIC_RUN_ID, ...; rank_group.c has the list): `ztrain run` may itself
     * run inside a Slurm step or under torchrun, whose identity would contradict the ranks'. */
    ZT_RANK_ENV_INHERIT = 1,
    /* ztraind: only a short list (PATH, HOME, USER, LOGNAME, LANG, TZ, TMPDIR, LD_LIBRARY_PATH,
     * CUDA_VISIBLE_DEVICES, the OpenBLAS, OpenMP placement and sanitizer knobs, LC_*, NCCL_*,
     * ZTRAIN_COMM_TIMEOUT_S, ZTRAIN_OPTIM_ISA), so that the daemon's token (ZTRAIN_TOKEN) and
     * whatever else it was started with stay out of the ranks. */
    ZT_RANK_ENV_WHITELIST,
} zt_rank_env_policy;

/* Who tells each rank its place in the job. */
typedef enum {
    /* Set here, per rank, in torchrun's variables: RANK, LOCAL_RANK, WORLD_SIZE,
     * LOCAL_WORLD_SIZE (every rank is on this host), MASTER_ADDR, MASTER_PORT, and
     * ZTRAIN_LAUNCHER_PID (this process: a rank asks for SIGTERM when its parent dies). Under
     * either identity the group gets a fresh ZTRAIN_RDZV_SECRET, its rendezvous store's. */
    ZT_RANK_ID_TORCHRUN = 1,
    /* One srun starts every rank and gives each Slurm's identity (SLURM_PROCID, ...). What is
     * built is srun's one environment (ZTRAIN_RDZV_SECRET included, so every task has the
     * group's secret): no torchrun variable, no ZTRAIN_LAUNCHER_PID (a task's
     * parent is slurmstepd), and SLURM_CONF passed on under either policy so that srun finds
     * the cluster. No per-rank part: a Slurm group is not started with zt_rank_spawn. */
    ZT_RANK_ID_SLURM,
} zt_rank_identity;

/* How the ranks' OpenMP threads wait at the end of a parallel region. Whatever the value, an
 * OMP_WAIT_POLICY that the ranks inherit from the caller is the user's choice and wins. */
typedef enum {
    ZT_RANK_WAIT_DEFAULT = 0,   /* OpenMP's own (libgomp spins a while, then sleeps) */
    ZT_RANK_WAIT_PASSIVE,       /* OMP_WAIT_POLICY=PASSIVE: other jobs may share the cores */
    ZT_RANK_WAIT_AUTO,          /* PASSIVE when threads per rank × world_size exceeds the cores
                                   (zt_cpu_count), where spinning threads would take the core
                                   another rank's thread needs */
} zt_rank_wait;

/* One group of ranks: what they run and who they are. Every pointer is borrowed and must stay
 * valid as long as a zt_rank_env built from the spec is in use. */
typedef struct {
    const char *program;        /* the worker; PATH is not searched */
    char *const *argv;          /* NULL-terminated, argv[0] included */
    const char *cwd;            /* NULL: the caller's */
    int world_size;             /* ranks, >= 1; all of them on this host */
    zt_rank_env_policy env;
    zt_rank_identity identity;
    const char *master_addr;    /* MASTER_ADDR, MASTER_PORT (torchrun identity) */
    int master_port;
    const char *run_id;         /* ZTRAIN_RUN_ID: names the shm backend's segment; required */
    /* OMP_NUM_THREADS. 0: under ZT_RANK_ENV_INHERIT the caller's OMP_NUM_THREADS when it has one
     * (passed on as it is), otherwise max(1, zt_cpu_count() / world_size). */
    int threads_per_rank;
    zt_rank_wait wait;
    /* The GPUs each rank may use: world_size strings, rank r's becoming its
     * CUDA_VISIBLE_DEVICES verbatim ("0", "2,3", a GPU's UUID; "" hides every GPU). A
     * CUDA_VISIBLE_DEVICES the caller has is then not inherited: the assignment replaces it (a
     * scheduler that honours the caller's restriction maps its ids through it first). NULL: no
     * assignment, and the variable is inherited as the policy says (ZT_RANK_ENV_INHERIT and
     * ZT_RANK_ENV_WHITELIST both pass it on). Torchrun identity only: under Slurm the
     * scheduler's own GPU binding decides. */
    const char *const *cuda_devices;
    /* NULL-terminated "NAME=value" entries every rank gets besides (the Slurm group's metrics
     * endpoint), or NULL. Set here, never also inherited. */
    const char *const *extra_env;
    /* The environment the ranks inherit from, NULL-terminated; NULL: this process's (environ).
     * OMP_NUM_THREADS and OMP_WAIT_POLICY are looked up in it as well. */
    char *const *caller_env;
} zt_rank_group_spec;

/* The environment of a group's ranks: the part they share, built once, and the per-rank part
 * that zt_rank_env_of fills in. Caller-owned; fields other than envp are private. */
typedef struct {
    /* NULL-terminated. Under ZT_RANK_ID_SLURM it is srun's whole environment; under the
     * torchrun identity, use zt_rank_env_of. Its entries point into the caller's environment
     * (inherited ones) or into memory this struct owns; zt_rank_env_free frees the latter. */
    char **envp;
    const zt_rank_group_spec *spec;
    char **owned;               /* strings allocated here */
    size_t n_owned, cap_owned;
    size_t n_shared;            /* envp entries every rank has */
    char **cuda_vars;           /* per rank "CUDA_VISIBLE_DEVICES=...", or NULL */
    char rank_var[32], local_rank_var[32], metrics_var[32];
} zt_rank_env;

/* Builds the shared part of spec's ranks' environment: the variables inherited under
 * spec->env, then OMP_NUM_THREADS (unless inherited as it is, see threads_per_rank),
 * OMP_WAIT_POLICY=PASSIVE (see wait), ZTRAIN_RUN_ID, the torchrun identity but RANK and
 * LOCAL_RANK (see identity), and spec->extra_env. No variable appears twice: one set here is
 * not inherited. ZT_ERR_NOMEM when memory runs out (e is then empty; zt_rank_env_free is
 * harmless on it). spec must outlive e. */
zt_status zt_rank_env_init(zt_rank_env *e, const zt_rank_group_spec *spec);

/* Rank `rank`'s whole environment (torchrun identity only): the shared part, then RANK and
 * LOCAL_RANK, CUDA_VISIBLE_DEVICES when spec->cuda_devices assigns devices, and
 * ZTRAIN_METRICS_FD=3 when metrics_fd (the rank gets the metrics pipe as descriptor 3). The
 * array is e's and valid until the next zt_rank_env_of or zt_rank_env_free. */
char *const *zt_rank_env_of(zt_rank_env *e, int rank, bool metrics_fd);

void zt_rank_env_free(zt_rank_env *e);

/* A port for MASTER_PORT that nothing on 127.0.0.1 listens on now, picked by the kernel: the
 * gloo transport's rank 0 serves its rendezvous there, so concurrent jobs need distinct ones. */
zt_status zt_rank_free_port(int *port);

/* Where one rank's descriptors go and which process group it joins. */
typedef struct {
    pid_t pgid;                 /* 0: the rank founds a new process group (rank 0, whose pid
                                   becomes the group's id); else it joins this group */
    bool inherit_stdio;         /* fds 0-2 stay the caller's (`ztrain run`: the user's terminal) */
    int stdout_fd, stderr_fd;   /* without inherit_stdio: become fds 1 and 2 (-1: /dev/null);
                                   stdin is /dev/null */
    int metrics_fd;             /* > 0: becomes fd 3 and the rank is told ZTRAIN_METRICS_FD=3;
                                   0 or -1: none */
} zt_rank_io;

/* Starts rank `rank` of e's group (torchrun identity) with zt_rank_env_of's environment, through
 * zt_spawn: no descriptor but 0-2 (and 3, the metrics pipe) inherited, default signal
 * dispositions and an empty signal mask, in io's process group. *pid is the rank's; *pidfd (if
 * not NULL) a close-on-exec pidfd to poll and wait on. A rank that cannot be started (a missing
 * or non-executable program) is ZT_ERR_IO with zt_spawn's message naming the program's path. */
zt_status zt_rank_spawn(zt_rank_env *e, int rank, const zt_rank_io *io, pid_t *pid, int *pidfd);

/* The record of the NVMe offload directories a group's ranks make (`<nvme_path>/ztrain-<job>-
 * rank<r>-XXXXXX/`, engine/include/ztrain/offload.h). A rank removes its own when it ends, but
 * one killed with SIGKILL cannot, and its directory holds the rank's whole optimizer state.
 * The group's keeper therefore makes an empty file and hands its name to the ranks in
 * ZTRAIN_OFFLOAD_RECORD (var, to put in the spec's extra_env); each rank appends "RANK PATH"
 * for each directory it makes, before it makes it (so a kill at any point leaves no directory
 * unrecorded), and "RANK -PATH" when it found that name taken after all. Once every rank has
 * ended, zt_rank_record_clean removes what the record names, does not withdraw, and is there: exactly this group's directories, never another run's
 * beside them under the same nvme_path (a name pattern could not tell them apart, and the
 * keeper does not read the ranks' configs to learn their nvme_paths). Local ranks only: a
 * Slurm group's ranks run on other hosts. Caller-owned; path[0] is '\0' when there is none. */
typedef struct {
    char path[4096];    /* the record file, in $TMPDIR (else /tmp) */
    char var[4200];     /* "ZTRAIN_OFFLOAD_RECORD=<path>" */
} zt_rank_record;

/* Creates the empty record file (mode 0600). ZT_ERR_IO naming the directory when it cannot; r is
 * then empty and zt_rank_record_clean and _free do nothing. */
zt_status zt_rank_record_init(zt_rank_record *r);

/* Call only after every rank of the group has ended. Removes each recorded directory that is still
 * there (its files and itself; a line that does not name a directory "ztrain-...-rank<R>-..."
 * of its rank, or names one the record withdraws, is skipped; a recorded directory that is not
 * there, never made or already removed by its rank, is passed over in silence) and calls removed(ctx, rank, dir) for each, or failed(ctx, rank, dir,
 * reason) when it could not remove it. Returns how many were removed. */
int zt_rank_record_clean(const zt_rank_record *r,
                         void (*removed)(void *ctx, int rank, const char *dir),
                         void (*failed)(void *ctx, int rank, const char *dir, const char *why),
                         void *ctx);

/* Removes the record file itself. */
void zt_rank_record_free(zt_rank_record *r);

/* How one rank ended, exit status and signal recorded apart (as waitpid reports them). */
typedef struct {
    pid_t pid;          /* 0 when unknown (never started, or a Slurm rank on another node) */
    int exit_status;    /* the status passed to exit(), or -1 when a signal ended the process or
                           the status was lost */
    int term_signal;    /* the signal that ended the process, or 0 when it exited */
} zt_rank_exit;

/* What the group's keeper had sent the whole group when a rank ended. */
typedef enum {
    ZT_RANK_SENT_NONE = 0,      /* nothing, or nothing the verdict depends on */
    ZT_RANK_SENT_STOP,          /* only the SIGTERM of a requested stop */
    ZT_RANK_SENT_KILL,          /* SIGKILL */
} zt_rank_sent;

/* Whether a rank's end is a failure that takes its group down: an exit status other than 0 and
 * ZT_RANK_EXIT_STOPPED (a lost status, -1, included), or death by a signal, except the SIGTERM
 * of a stop (the rank died of it before installing its handler: it was stopped, not broken) and
 * any signal once the group was sent SIGKILL (its end is the keeper's doing). */
bool zt_rank_exit_is_failure(const zt_rank_exit *x, zt_rank_sent sent);

/* "signal 9 (SIGKILL)"; "signal 40" for a signal without an abbreviation (a real-time one). */
void zt_rank_describe_signal(char *buf, size_t size, int sig);

/* One line on how a rank ended, for a job's reason, its log, or `ztrain run`'s error:
 *   "rank 1 (pid 4242) was killed by signal 9 (SIGKILL)"
 *   "rank 0 (pid 4241) exited with status 1: <last_stderr>"
 *   "rank 3 on n2 exited with status 3"
 *   "rank 1 (pid 4242) ended, but its exit status was lost (reaped elsewhere)"
 * host (NULL: a local rank) and a pid of 0 are left out; last_stderr (NULL: none) is the rank's
 * last line on stderr, appended to an exit status only. Truncated to size. */
void zt_rank_describe_exit(char *buf, size_t size, int rank, const char *host,
                           const zt_rank_exit *x, const char *last_stderr);

/* Whether the process is stopped (SIGSTOP, or a debugger: state T or t in /proc/PID/stat). A
 * keeper asks before it continues the group (SIGCONT), which would hide the stop. */
bool zt_rank_is_stopped(pid_t pid);

/* How a rank stopped answering (a peer gave up waiting for it, and the keeper found it stopped,
 * or it outlived the grace period after SIGTERM), for the line that blames it rather than the
 * peer that failed first:
 *   "rank 1 (pid 4243) stopped answering: it was stopped (SIGSTOP or a debugger) when
 *    <first_failure>"
 *   "rank 1 (pid 4243) stopped answering: it did not end within 5 s of SIGTERM and was killed
 *    when <first_failure>"
 * first_failure is zt_rank_describe_exit's line for the rank that failed first. Truncated to
 * size. */
void zt_rank_describe_stuck(char *buf, size_t size, int rank, pid_t pid, bool stopped,
                            double grace_s, const char *first_failure);

#endif
