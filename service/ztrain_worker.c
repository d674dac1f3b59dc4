/* ztrain-worker: one rank of a job.
 *
 *   ztrain-worker JOB.json [--out DIR] [--threads N]
 *
 * It needs no daemon: its place in the job comes from the launcher's environment (torchrun's
 * RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, or Slurm's SLURM_PROCID, SLURM_NTASKS),
 * so `ztrain run`, ztraind, torchrun-style launchers and srun all start it the same way. Rank 0
 * writes DIR/metrics.jsonl and prints progress; the other ranks print only errors.
 *
 * Exit status: 0 success, 1 failure ("ztrain-worker: rank R: <message>" on stderr), 2 bad usage,
 * 130 stopped by SIGINT/SIGTERM after the job's checkpoint was written. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "ztrain/comm.h"
#include "ztrain/job_spec.h"
#include "ztrain/trainer.h"

#define DEFAULT_COMM_TIMEOUT_S 300.0

static const char usage[] = "usage: ztrain-worker JOB.json [--out DIR] [--threads N]\n";

static volatile sig_atomic_t stop_requested;

/* The first SIGINT or SIGTERM asks the trainer to stop after the current step (every rank stops
 * at the same step and the checkpoint is written); the second one ends the process at once. */
static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, NULL);
    sigaction(SIGTERM, &dfl, NULL);
}

static int install_signal_handlers(void) {
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) {
        fprintf(stderr, "ztrain-worker: sigaction: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* Under `ztrain run` the launcher's pid is in ZTRAIN_LAUNCHER_PID: ask for SIGTERM when it dies,
 * so that a launcher killed with SIGKILL (which it cannot forward) still takes its ranks along.
 * The check of getppid() after prctl closes the window in which it died before the request. */
static int follow_launcher(void) {
    const char *v = getenv("ZTRAIN_LAUNCHER_PID");
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    long pid = strtol(v, &end, 10);
    if (errno || *end || pid <= 1) {
        fprintf(stderr, "ztrain-worker: ZTRAIN_LAUNCHER_PID='%s' is not a process id\n", v);
        return -1;
    }
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) {
        fprintf(stderr, "ztrain-worker: prctl(PR_SET_PDEATHSIG): %s\n", strerror(errno));
        return -1;
    }
    if (getppid() != (pid_t)pid) {
        fprintf(stderr, "ztrain-worker: the launcher (pid %ld) has already exited\n", pid);
        return -1;
    }
    return 0;
}

static int comm_timeout(double *out) {
    const char *v = getenv("ZTRAIN_COMM_TIMEOUT_S");
    *out = DEFAULT_COMM_TIMEOUT_S;
    if (!v)
        return 0;
    char *end;
    errno = 0;
    double t = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(t) || t <= 0)
        return -1;
    *out = t;
    return 0;
}

/* ztraind hands rank 0 the write end of its metrics pipe as ZTRAIN_METRICS_FD. */
static int metrics_fd_from_env(int *fd) {
    const char *v = getenv("ZTRAIN_METRICS_FD");
    *fd = 0;
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || *end || n < 3 || n > 65535 || fcntl((int)n, F_GETFD) < 0)
        return -1;
    *fd = (int)n;
    return 0;
}

/* The variable that set the world size, for messages: the launcher's setting is at fault, not
 * the job's. The same precedence as zt_dist_from_env: torchrun's variables, then Slurm's. */
static bool env_set(const char *name) {
    const char *v = getenv(name);
    return v && *v;
}

static const char *world_size_source(char *buf, size_t size) {
    if (env_set("WORLD_SIZE"))
        snprintf(buf, size, "WORLD_SIZE=%s", getenv("WORLD_SIZE"));
    else if (!env_set("RANK") && !env_set("LOCAL_RANK") && env_set("SLURM_PROCID") &&
             env_set("SLURM_NTASKS"))
        snprintf(buf, size, "SLURM_NTASKS=%s", getenv("SLURM_NTASKS"));
    else
        snprintf(buf, size, "the environment has no WORLD_SIZE (one rank)");
    return buf;
}

int main(int argc, char **argv) {
    const char *job_path = NULL, *out = NULL;
    long threads = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out = argv[++i];
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            char *end;
            const char *v = argv[++i];
            errno = 0;
            threads = strtol(v, &end, 10);
            if (errno || end == v || *end || threads < 1 || threads > 1024) {
                fprintf(stderr, "ztrain-worker: --threads expects an integer in [1, 1024], got "
                                "'%s'\n", v);
                return 2;
            }
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (argv[i][0] == '-' || job_path) {
            fprintf(stderr, "ztrain-worker: unexpected argument '%s'\n%s", argv[i], usage);
            return 2;
        } else {
            job_path = argv[i];
        }
    }
    if (!job_path) {
        fprintf(stderr, "ztrain-worker: the job file is missing\n%s", usage);
        return 2;
    }
    /* Handlers first: a stop that arrives while the job loads must not kill the rank outright. */
    if (install_signal_handlers() != 0 || follow_launcher() != 0)
        return 1;

    zt_dist_info dist;
    if (zt_dist_from_env(&dist) != ZT_OK) {
        fprintf(stderr, "ztrain-worker: %s\n", zt_last_error());
        return 1;
    }
    int rank = dist.rank;
    double timeout_s;
    if (comm_timeout(&timeout_s) != 0) {
        fprintf(stderr, "ztrain-worker: rank %d: ZTRAIN_COMM_TIMEOUT_S='%s' is not a positive "
                        "number of seconds\n", rank, getenv("ZTRAIN_COMM_TIMEOUT_S"));
        return 1;
    }
    zt_job_spec job;
    if (zt_job_spec_load(&job, job_path) != ZT_OK) {
        fprintf(stderr, "ztrain-worker: rank %d: %s\n", rank, zt_last_error());
        return 1;
    }
    if (job.world_size != dist.world_size) {
        char src[160];
        fprintf(stderr, "ztrain-worker: rank %d: %s but %s says world_size %d\n", rank,
                world_size_source(src, sizeof src), job_path, job.world_size);
        zt_job_spec_free(&job);
        return 1;
    }
    char default_out[1024];
    if (!out) {
        snprintf(default_out, sizeof default_out, "runs/%s", job.name ? job.name : "job");
        out = default_out;
    }

    int metrics_fd = 0;
    if (metrics_fd_from_env(&metrics_fd) != 0) {
        fprintf(stderr, "ztrain-worker: rank %d: ZTRAIN_METRICS_FD='%s' is not an open "
                        "descriptor\n", rank, getenv("ZTRAIN_METRICS_FD"));
        zt_job_spec_free(&job);
        return 1;
    }

    zt_comm *comm = NULL;
    if (dist.world_size > 1 && zt_comm_create_shm(&comm, &dist, timeout_s) != ZT_OK) {
        fprintf(stderr, "ztrain-worker: rank %d: %s\n", rank, zt_last_error());
        zt_job_spec_free(&job);
        return 1;
    }
    zt_train_options opts = {.out_dir = out, .progress = rank == 0 ? stdout : NULL,
                             .threads = (int)threads, .stop_requested = &stop_requested,
                             .dist = comm ? &dist : NULL, .comm = comm,
                             .metrics_fd = metrics_fd};
    zt_train_result res;
    zt_status s = zt_train_run(&job, &opts, &res);
    bool checkpointed = job.train.checkpoint_dir != NULL;
    int rc = 0;
    if (s != ZT_OK) {
        fprintf(stderr, "ztrain-worker: rank %d: %s\n", rank, zt_last_error());
        rc = 1;
    } else if (res.stopped) {
        if (rank == 0)
            printf("stopped at step %lld%s\n", res.steps,
                   checkpointed ? " (checkpoint written)" : "");
        rc = 130;
    } else if (rank == 0) {
        printf("done: %lld steps, final loss %.4f", res.steps, res.final_loss);
        if (res.final_eval_loss == res.final_eval_loss)
            printf(", eval loss %.4f", res.final_eval_loss);
        if (res.tokens_per_second == res.tokens_per_second)
            printf(", %.0f tokens/s, %.3f TFLOPS", res.tokens_per_second, res.tflops);
        printf("\n");
    }
    /* After a failure the communicator is unusable, but destroying it still unmaps the segment
     * (and rank 0 removes it), so a failed run leaves nothing in /dev/shm. */
    if (comm)
        zt_comm_destroy(comm);
    zt_job_spec_free(&job);
    if (fflush(stdout) != 0 && rc == 0) {
        fprintf(stderr, "ztrain-worker: rank %d: writing stdout: %s\n", rank, strerror(errno));
        rc = 1;
    }
    return rc;
}
