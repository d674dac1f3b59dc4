/* Placing a job's ranks on a Slurm cluster: the srun command line ztraind runs for a job, what
 * srun's output says (each labelled line's rank, task exits, queueing, cancellations, the ranks'
 * placement), and the scancel commands that stop it.
 *
 * Everything here is pure string work, with no I/O except zt_slurm_run_sync: the supervisor
 * runs the commands and feeds it the lines (supervisor.c), and tests/unit/test_slurm_lines.c
 * checks the parsing against the texts Slurm 22.05 prints. */
#ifndef ZTRAIN_SLURM_LAUNCH_H
#define ZTRAIN_SLURM_LAUNCH_H

#include <stdbool.h>
#include <sys/types.h>

#include "ztrain/status.h"

/* The daemon-wide settings of `ztraind --launcher slurm`. */
typedef struct {
    const char *srun;          /* absolute paths, found in PATH at start */
    const char *scancel;
    /* setpriv (util-linux): srun runs under `setpriv --pdeathsig TERM`, so that a ztraind that
     * dies takes its sruns along (srun answers SIGTERM by killing its tasks). NULL: not tied. */
    const char *setpriv;
    const char *partition;     /* NULL or "": the cluster's default */
    const char *metrics_host;  /* where a job's rank 0 connects to send its metrics */
} zt_slurm_config;

/* One job's srun. */
typedef struct {
    const zt_slurm_config *cfg;
    const char *job_name;      /* --job-name: unique per daemon and job; scancel --name uses it */
    int nodes;
    int ntasks;
    int cpus_per_task;         /* 0: Slurm's default (one CPU per task) */
} zt_slurm_job;

/* The command ztraind runs for a job: [setpriv --pdeathsig TERM --] srun --job-name=... --nodes=N
 * --ntasks=W --label --kill-on-bad-exit=0 --wait=0 --mpi=none [--cpus-per-task=C]
 * [--partition=P] worker_argv... — a NULL-terminated heap array of heap strings (free with
 * zt_slurm_argv_free); argv[0] is the program to spawn. NULL when out of memory. */
char **zt_slurm_srun_argv(const zt_slurm_job *job, char *const *worker_argv);

/* scancel --name=NAME, with --signal=SIG when sig is given ("TERM", "KILL"; NULL ends the job)
 * and --state=STATE when state is given ("RUNNING", "PENDING"). Same ownership as above. */
char **zt_slurm_scancel_argv(const zt_slurm_config *cfg, const char *job_name, const char *sig,
                             const char *state);
void zt_slurm_argv_free(char **argv);

/* Runs argv (absolute argv[0], no shell) with an empty stdin and waits up to timeout_s; its
 * stderr's first line goes into err (may be NULL). 0: it exited 0. For startup-time cleanup
 * only: the supervisor runs its commands without blocking. */
int zt_slurm_run_sync(char *const *argv, double timeout_s, char *err, size_t err_size);

/* The rank of a line srun wrote with --label ("3: text", "  3: text" when there are 10 or
 * more tasks): true with *rank in [0, world_size) and *text after the label; false for a line
 * of srun's own ("srun: ...") or anything else. */
bool zt_slurm_split_label(const char *line, int world_size, int *rank, const char **text);

typedef enum {
    ZT_SRUN_OTHER = 0,
    ZT_SRUN_TASK_EXIT,   /* "srun: error: n2: task 3: Exited with exit code 1", "...: Killed" */
    ZT_SRUN_QUEUED,      /* "srun: job 12 queued and waiting for resources" */
    ZT_SRUN_ALLOCATED,   /* "srun: job 12 has been allocated resources" */
    ZT_SRUN_CANCELLED,   /* "*** STEP 12.0 ON n1 CANCELLED AT <time> [DUE TO TIME LIMIT] ***" */
    ZT_SRUN_NODE_FAIL,   /* "srun: error: Node failure on n2" */
    ZT_SRUN_ERROR,       /* any other "srun: error: ..." */
    ZT_SRUN_PLACED,      /* ztrain-worker's "ztrain-worker: rank 2 of 4 on n2, pid 4242" */
} zt_srun_kind;

typedef struct {
    zt_srun_kind kind;
    char host[128];      /* TASK_EXIT, NODE_FAIL, PLACED, CANCELLED: the node (or node list) */
    char tasks[256];     /* TASK_EXIT: the task ids as srun wrote them ("0-1,3") */
    int exit_code;       /* TASK_EXIT: the exit status, when signal == 0 */
    int signal;          /* TASK_EXIT: the signal that ended the tasks; 0 when they exited */
    bool core_dumped;
    long long job_id;    /* QUEUED, ALLOCATED, CANCELLED: Slurm's job id; 0 when not said */
    char due[64];        /* CANCELLED: "TIME LIMIT", "NODE FAILURE", "PREEMPTION", ... or "" */
    int rank;            /* PLACED */
    long pid;            /* PLACED */
} zt_srun_line;

/* What one of srun's own lines says (without a label; "srun: " prefix and all). */
void zt_slurm_parse_srun(const char *line, zt_srun_line *out);
/* What the text of a labelled task line says: slurmstepd's cancel banner, the worker's
 * placement line; everything else is ZT_SRUN_OTHER (the rank's own output). */
void zt_slurm_parse_task(const char *text, zt_srun_line *out);

/* The ids in a task list ("0-1,3", "[0-3]") into ids[], at most cap; the count, or -1 when the
 * list is malformed or names an id outside [0, world_size). */
int zt_slurm_task_ids(const char *list, int world_size, int *ids, int cap);

/* A signal's number from its strsignal() text ("Killed" -> 9), 0 when unknown. srun names
 * signals that way, in the locale both it and ztraind inherit. */
int zt_slurm_signal_from_text(const char *text);

#endif
