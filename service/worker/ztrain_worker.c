/* ztrain-worker: one rank of a job.
 *
 *   ztrain-worker JOB.json [--out DIR] [--threads N] [--profile [ops]] [--set KEY.PATH=VALUE]...
 *                 [--validated]
 *
 * The options it shares with `ztrain run` (--out, --threads, --profile, --set) take the same
 * forms: "--opt VALUE" or "--opt=VALUE", "--profile", "--profile=ops" or "--profile ops"
 * (service/cli/cli_args.h, which both parse with), so a rank's command line can be written as
 * `ztrain run`'s is.
 *
 * --profile (=ops, the one kind so far): every op of every step is timed, with CUDA events on a
 * GPU and the monotonic clock on the CPU, and rank 0 writes DIR/profile.jsonl (a line a step)
 * and DIR/profile.json (the means after warmup) and prints a table at the end
 * (docs/profiling.md).
 *
 * --set: the overrides `ztrain run --set` was given (ztrain/job_overrides.h), so that every rank
 * reads the job the launching process validated. --local_rank=N (or --local-rank N), which
 * torch.distributed.launch and DeepSpeed's launcher put on a script's command line, is accepted
 * and ignored: the rank's place comes from the environment, which those launchers set as well.
 *
 * --validated: the process that started the ranks (`ztrain run`, ztraind) has validated the job and
 * printed what its DeepSpeed config resolved to and its warnings; without it rank 0 prints them,
 * so that they appear once per job either way.
 *
 * It needs no daemon: its place in the job comes from the launcher's environment (torchrun's
 * RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, or Slurm's SLURM_PROCID, SLURM_NTASKS),
 * so `ztrain run`, ztraind, torchrun-style launchers and srun all start it the same way. Rank 0
 * writes DIR/metrics.jsonl and prints progress; the other ranks print only errors.
 *
 * What ztraind adds: ZTRAIN_METRICS_FD (a pipe that rank 0 mirrors every metric record to), or,
 * for ranks on other hosts (its Slurm launcher), ZTRAIN_METRICS_ADDR=HOST:PORT with
 * ZTRAIN_METRICS_TOKEN (rank 0 connects there and sends the same lines), and
 * ZTRAIN_REPORT_PLACEMENT=1 (each rank first prints "ztrain-worker: rank R of W on NODE, pid P"
 * on stderr, which is how ztraind learns where a Slurm task runs).
 *
 * The ranks' transport is the job's "comm", which ZTRAIN_COMM ("shm", "gloo", "auto") overrides;
 * auto is shm when every rank runs on this host and gloo when not (zt_comm_choose). Rank 0 logs
 * the choice on stderr (not the default shm, which it has always used silently).
 *
 * Exit status: 0 success, 1 failure ("ztrain-worker: rank R: <message>" on stderr), 2 bad usage,
 * 130 stopped by SIGINT/SIGTERM after the job's checkpoint was written, or before the ranks had
 * met (nothing trained: the rendezvous gives up waiting, zt_comm_set_stop_flag). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli_args.h"
#include "ztrain/comm.h"
#include "ztrain/gpu.h"
#include "ztrain/job_overrides.h"
#include "ztrain/job_spec.h"
#include "ztrain/stop_signals.h"
#include "ztrain/trainer.h"

#define DEFAULT_COMM_TIMEOUT_S 300.0
#define METRICS_CONNECT_TIMEOUT_S 30.0

#ifndef ZTRAIN_VERSION
#define ZTRAIN_VERSION "unknown"
#endif

static const char usage[] =
    "usage: ztrain-worker JOB.json [--out DIR] [--threads N] [--profile [ops]]\n"
    "                     [--set KEY.PATH=VALUE]... [--validated]\n"
    "       ztrain-worker --version\n"
    "One rank of a job; its place comes from the launcher's environment (RANK, WORLD_SIZE,\n"
    "LOCAL_RANK, MASTER_ADDR, MASTER_PORT, or Slurm's). --local_rank=N is accepted and ignored.\n"
    "  --out DIR            where rank 0 writes metrics.jsonl (default: runs/<job name>)\n"
    "  --threads N          CPU threads of the rank, 1 to 1024\n"
    "  --profile [ops]      time every op of every step into DIR/profile.json\n"
    "                       (docs/profiling.md); also --profile=ops\n"
    "  --set KEY.PATH=VALUE override a key of the job file (repeatable)\n"
    "  --validated          the launcher has validated the job and printed its notes\n"
    "An option's value may follow it or be joined with '=' (--out=DIR), and -- ends the options,\n"
    "as for `ztrain run`.\n";

/* The options, in the form zt_cli_split_equals takes: '=' marks one with a value. */
static const char options[] = "--out= --threads= --profile --set= --validated --local_rank= "
                              "--local-rank= --version --help -h";

/* --local_rank=N / --local-rank=N / either with the value apart: the argument torch's
 * launchers add. Returns how many arguments it took (0: not this option; -1: a bad value, said). */
static int local_rank_arg(int argc, char **argv, int i) {
    const char *a = argv[i];
    static const char *const names[] = {"--local_rank", "--local-rank"};
    for (int k = 0; k < 2; k++) {
        size_t n = strlen(names[k]);
        if (strncmp(a, names[k], n) != 0 || (a[n] != '\0' && a[n] != '='))
            continue;
        const char *v = a[n] == '=' ? a + n + 1 : i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        errno = 0;
        long r = v ? strtol(v, &end, 10) : -1;
        if (!v || errno || end == v || *end || r < 0 || r > 65535) {
            fprintf(stderr, "ztrain-worker: %s expects a local rank (a non-negative integer), "
                            "got '%s'\n", names[k], v ? v : "");
            return -1;
        }
        return a[n] == '=' ? 1 : 2;
    }
    return 0;
}

/* Set by the thread that takes SIGINT and SIGTERM (ztrain/stop_signals.h: the first asks for a
 * stop with a checkpoint at the end of the current step, every rank at the same one). */
static volatile sig_atomic_t stop_requested;

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
    if (errno || end == v || *end || !isfinite(t) || t <= 0 || t > ZT_COMM_MAX_TIMEOUT_S)
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

/* One connect() attempt to a resolved address, bounded by the time left. 0 or an errno. */
static int connect_within(int fd, const struct addrinfo *a, double timeout_s) {
    fcntl(fd, F_SETFL, O_NONBLOCK);
    int err = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int k = poll(&pfd, 1, (int)(timeout_s * 1e3));
            socklen_t len = sizeof err;
            if (k == 0)
                err = ETIMEDOUT;
            else if (k < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = errno;
        }
    }
    fcntl(fd, F_SETFL, 0);
    return err;
}

/* ZTRAIN_METRICS_ADDR=HOST:PORT ("[v6]:PORT" too): ztraind's endpoint for a rank 0 that may run
 * on another host than ztraind. Connects, sends the handshake line with ZTRAIN_METRICS_TOKEN,
 * and returns the socket in *fd for the trainer to mirror its records to, as it would the pipe
 * of ZTRAIN_METRICS_FD. -1 with a message in msg when that fails: a job whose metrics cannot
 * reach its coordinator fails at once instead of training unseen. */
static int metrics_connect(const char *addr, int *fd, char *msg, size_t size) {
    char host[256];
    const char *colon = strrchr(addr, ':');
    size_t n = colon ? (size_t)(colon - addr) : 0;
    if (!colon || n == 0 || n >= sizeof host || !colon[1]) {
        snprintf(msg, size, "ZTRAIN_METRICS_ADDR='%s' is not HOST:PORT", addr);
        return -1;
    }
    memcpy(host, addr, n);
    host[n] = '\0';
    if (host[0] == '[' && host[n - 1] == ']') {
        memmove(host, host + 1, n - 2);
        host[n - 2] = '\0';
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0) {
        snprintf(msg, size, "ZTRAIN_METRICS_ADDR=%s: %s", addr, gai_strerror(rc));
        return -1;
    }
    int err = ECONNREFUSED;
    *fd = -1;
    for (struct addrinfo *a = res; a && *fd < 0; a = a->ai_next) {
        int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (s < 0) {
            err = errno;
            continue;
        }
        err = connect_within(s, a, METRICS_CONNECT_TIMEOUT_S);
        if (err == 0)
            *fd = s;
        else
            close(s);
    }
    freeaddrinfo(res);
    if (*fd < 0) {
        snprintf(msg, size, "cannot connect to ztraind's metrics endpoint %s: %s", addr,
                 strerror(err));
        return -1;
    }
    int one = 1;
    setsockopt(*fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const char *token = getenv("ZTRAIN_METRICS_TOKEN");
    char hello[256];
    int len = snprintf(hello, sizeof hello, "ztrain-metrics %s\n", token ? token : "");
    if (len <= 0 || (size_t)len >= sizeof hello ||
        send(*fd, hello, (size_t)len, MSG_NOSIGNAL) != len) {
        snprintf(msg, size, "cannot send to ztraind's metrics endpoint %s: %s", addr,
                 strerror(errno));
        close(*fd);
        *fd = -1;
        return -1;
    }
    return 0;
}

/* Where this rank runs, for a launcher that cannot see it (ztraind under Slurm): the Slurm
 * node's name when there is one, else the host's. */
static void report_placement(const zt_dist_info *d) {
    const char *v = getenv("ZTRAIN_REPORT_PLACEMENT");
    if (!v || strcmp(v, "1") != 0)
        return;
    char host[256] = "";
    const char *node = getenv("SLURMD_NODENAME");
    if (node && *node)
        snprintf(host, sizeof host, "%s", node);
    else if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "unknown");
    host[strcspn(host, ",")] = '\0';
    fprintf(stderr, "ztrain-worker: rank %d of %d on %s, pid %ld\n", d->rank, d->world_size, host,
            (long)getpid());
    fflush(stderr);
}

/* Under Slurm without MASTER_ADDR, rank 0's address is its node's name (the step's first node),
 * which the cluster's hosts normally resolve. Where they do not (nodes known to Slurm by a
 * NodeAddr only, as in a test cluster of emulated nodes), Slurm's own record of the node has the
 * address: `scontrol show node NAME` prints NodeAddr=. The name stays when that fails too, and
 * the communicator then says it does not resolve. */
static void slurm_master_addr(zt_dist_info *d) {
    if (zt_dist_env("MASTER_ADDR") || d->launcher != ZT_DIST_SLURM)
        return;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(d->master_addr, NULL, &hints, &res) == 0) {
        freeaddrinfo(res);
        return;
    }
    for (const char *p = d->master_addr; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '.' || *p == '_'))
            return;
    char cmd[320], line[4096];
    snprintf(cmd, sizeof cmd, "scontrol show node -o '%s' 2>/dev/null", d->master_addr);
    FILE *f = popen(cmd, "r");
    if (!f)
        return;
    char addr[256] = "";
    while (fgets(line, sizeof line, f)) {
        const char *a = strstr(line, "NodeAddr=");
        if (a)
            sscanf(a + 9, "%255s", addr);
    }
    pclose(f);
    if (addr[0])
        snprintf(d->master_addr, sizeof d->master_addr, "%s", addr);
}

/* The variable that set the world size, for messages: the launcher's setting is at fault, not
 * the job's. Whose variables those are is zt_dist_from_env's decision, recorded in d. */
static const char *world_size_source(const zt_dist_info *d, char *buf, size_t size) {
    if (d->launcher == ZT_DIST_TORCHRUN)
        snprintf(buf, size, "WORLD_SIZE=%d", d->world_size);
    else if (d->launcher == ZT_DIST_SLURM)
        snprintf(buf, size, "SLURM_NTASKS=%d", d->world_size);
    else
        snprintf(buf, size, "the environment has no WORLD_SIZE (one rank)");
    return buf;
}

typedef struct {
    const char *job_path, *out;
    const char *sets[64];
    size_t n_sets;
    long threads;
    bool validated, profile;
} worker_args;

/* Bad usage: the message about `word`, then the usage text, on stderr. */
static void say_usage(const char *fmt, const char *word) {
    fputs("ztrain-worker: ", stderr);
    fprintf(stderr, fmt, word);
    fprintf(stderr, "\n%s", usage);
}

/* One option at argv[i] (its value, when it takes one, at argv[i + 1]) into *a. Returns how
 * many arguments it took, or -1 after saying what was wrong. */
static int parse_option(int argc, char **argv, int i, worker_args *a) {
    const char *o = argv[i];
    int took = local_rank_arg(argc, argv, i);
    if (took != 0)
        return took;
    if ((took = zt_cli_profile_arg("ztrain-worker", argc, argv, i)) != 0) {
        a->profile = took > 0;
        return took;
    }
    if (strcmp(o, "--validated") == 0) {
        a->validated = true;
        return 1;
    }
    if (!zt_cli_takes_value(options, o) || i + 1 >= argc) {
        say_usage(zt_cli_takes_value(options, o) ? "%s needs a value" : "unknown option '%s'", o);
        return -1;
    }
    const char *v = argv[i + 1];
    if (strcmp(o, "--set") == 0) {
        if (a->n_sets == sizeof a->sets / sizeof a->sets[0]) {
            fprintf(stderr, "ztrain-worker: at most 64 --set overrides\n");
            return -1;
        }
        if (!zt_cli_set_form_ok(v)) {
            fprintf(stderr, "ztrain-worker: --set '%s': expected KEY.PATH=VALUE "
                            "(train.max_steps=30)\n", v);
            return -1;
        }
        a->sets[a->n_sets++] = v;
    } else if (strcmp(o, "--out") == 0) {
        if (!v[0]) {
            fprintf(stderr, "ztrain-worker: --out needs a directory, got ''\n");
            return -1;
        }
        a->out = v;
    } else {  /* --threads */
        char *end;
        errno = 0;
        a->threads = strtol(v, &end, 10);
        if (errno || end == v || *end || a->threads < 1 || a->threads > 1024) {
            fprintf(stderr, "ztrain-worker: --threads expects an integer in [1, 1024], got "
                            "'%s'\n", v);
            return -1;
        }
    }
    return 2;
}

/* The command line (after zt_cli_split_equals) into *a, in the forms `ztrain run` takes (-- ends
 * the options; --help=X is refused). Returns -1 to go on, else the exit status: 0 after --help
 * or --version, 2 for bad usage (said on stderr). */
static int parse_args(int argc, char **argv, worker_args *a) {
    int help = zt_cli_wants_help("ztrain-worker", options, argc, argv);
    if (help != 0) {
        if (help > 0)
            fputs(usage, stdout);
        return help > 0 ? 0 : 2;
    }
    bool operands = false;
    for (int i = 0; i < argc; i++) {
        int kind = zt_cli_word_kind(argv[i], &operands);
        if (kind < 0)
            continue;
        if (kind == 0 && strcmp(argv[i], "--version") == 0) {
            printf("ztrain-worker %s\n", ZTRAIN_VERSION);
            return 0;
        }
        if (kind == 0) {
            int took = parse_option(argc, argv, i, a);
            if (took < 0)
                return 2;
            i += took - 1;
        } else if (a->job_path) {
            say_usage("unexpected argument '%s'", argv[i]);
            return 2;
        } else {
            a->job_path = argv[i];
        }
    }
    if (!a->job_path) {
        say_usage("the job file is missing%s", "");
        return 2;
    }
    return -1;
}

int main(int argc, char **argv) {
    worker_args args = {0};
    int n_split;
    char **split = zt_cli_split_equals(options, argc - 1, argv + 1, &n_split);
    if (!split) {
        fprintf(stderr, "ztrain-worker: out of memory\n");
        return 1;
    }
    int usage_rc = parse_args(n_split, split, &args);
    free(split);
    if (usage_rc >= 0)
        return usage_rc;
    const char *job_path = args.job_path, *out = args.out;
    const char *const *sets = args.sets;
    size_t n_sets = args.n_sets;
    long threads = args.threads;
    bool validated = args.validated, profile = args.profile;
    /* The stop signals first, before any thread starts (they inherit the blocked mask), and so
     * that a stop that arrives while the job loads does not kill the rank outright. */
    if (zt_stop_signals_start(&stop_requested) != ZT_OK) {
        fprintf(stderr, "ztrain-worker: %s\n", zt_last_error());
        return 1;
    }
    zt_comm_set_stop_flag(&stop_requested);
    if (follow_launcher() != 0)
        return 1;

    zt_dist_info dist;
    if (zt_dist_from_env(&dist) != ZT_OK) {
        fprintf(stderr, "ztrain-worker: %s\n", zt_last_error());
        return 1;
    }
    int rank = dist.rank;
    double timeout_s;
    if (comm_timeout(&timeout_s) != 0) {
        fprintf(stderr, "ztrain-worker: rank %d: ZTRAIN_COMM_TIMEOUT_S='%s' is not a number of "
                        "seconds in (0, %g]\n", rank, getenv("ZTRAIN_COMM_TIMEOUT_S"),
                ZT_COMM_MAX_TIMEOUT_S);
        return 1;
    }
    report_placement(&dist);
    slurm_master_addr(&dist);
    zt_job_spec job;
    if (zt_job_overrides_load(&job, job_path, sets, n_sets) != ZT_OK) {
        fprintf(stderr, "ztrain-worker: rank %d: %s\n", rank, zt_last_error());
        return 1;
    }
    if (rank == 0 && !validated)
        zt_job_spec_print_notes(&job, stderr);
    /* ztraind names its job, which the checkpoints record (ztrain/job_spec.h). */
    const char *service_job = getenv("ZTRAIN_JOB_ID");
    if (service_job && *service_job && !(job.service_job_id = strdup(service_job))) {
        fprintf(stderr, "ztrain-worker: rank %d: out of memory\n", rank);
        zt_job_spec_free(&job);
        return 1;
    }
    if (job.world_size != dist.world_size) {
        char src[160];
        fprintf(stderr, "ztrain-worker: rank %d: %s but %s says world_size %d\n", rank,
                world_size_source(&dist, src, sizeof src), job_path, job.world_size);
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
    const char *metrics_addr = getenv("ZTRAIN_METRICS_ADDR");
    char msg[512];
    if (rank == 0 && !metrics_fd && metrics_addr && *metrics_addr &&
        metrics_connect(metrics_addr, &metrics_fd, msg, sizeof msg) != 0) {
        fprintf(stderr, "ztrain-worker: rank %d: %s\n", rank, msg);
        zt_job_spec_free(&job);
        return 1;
    }

    /* The transport: the job's or ZTRAIN_COMM's, else shm when every rank is on this host and
     * gloo when not. Rank 0 says which and why, so the job's log shows it, unless it is shm
     * picked by default: ranks on one host have always talked that way and stay silent. */
    zt_comm *comm = NULL;
    if (dist.world_size > 1) {
        const char *transport;
        char why[256];
        bool cuda = job.device == ZT_DEVICE_CUDA;
        if (zt_comm_choose_on(&dist, job.comm, cuda, cuda ? zt_gpu_count() : 0, &transport, why,
                              sizeof why) != ZT_OK ||
            zt_comm_create(&comm, transport, &dist, timeout_s) != ZT_OK) {
            fprintf(stderr, "ztrain-worker: rank %d: %s\n", rank, zt_last_error());
            zt_job_spec_free(&job);
            /* A peer that gave up because of its own stop fails this rank's wait too. */
            return zt_stop_is_requested(&stop_requested) ? 130 : 1;
        }
        const char *env_comm = getenv("ZTRAIN_COMM");
        bool named = job.comm != ZT_COMM_AUTO || (env_comm && *env_comm &&
                                                  strcmp(env_comm, "auto") != 0);
        bool shm = strcmp(transport, "shm") == 0;
        if (rank == 0 && shm && named)
            fprintf(stderr, "ztrain-worker: comm transport shm (%s)\n", why);
        else if (rank == 0 && !shm) {
            char at[sizeof dist.master_addr + 16];
            zt_dist_endpoint(dist.master_addr, dist.master_port, at, sizeof at);
            fprintf(stderr, "ztrain-worker: comm transport %s (%s), rendezvous at %s\n",
                    transport, why, at);
        }
        fflush(stderr);
    }
    /* A GPU rank names its device, the device's memory (cudaMemGetInfo) and the peak its MFU
     * assumes, so a job's log says what it ran on. */
    if (job.device == ZT_DEVICE_CUDA && zt_gpu_count() > 0) {
        int gpu = zt_gpu_for_rank(dist.local_rank, zt_gpu_count());
        zt_gpu_props gp;
        size_t free_b = 0, total_b = 0;
        const char *peak = "";
        if (zt_gpu_props_get(gpu, &gp) == ZT_OK &&
            zt_gpu_mem_info(gpu, &free_b, &total_b) == ZT_OK) {
            zt_gpu_peak_bf16(gp.name, gp.major, gp.minor, &peak);
            fprintf(stderr, "ztrain-worker: rank %d: GPU %d of %d, %s, %.1f GiB free of %.1f GiB, "
                    "MFU peak %s\n", rank, gpu, zt_gpu_count(), gp.name, free_b / 1073741824.0,
                    total_b / 1073741824.0, peak);
        }
    }
    zt_train_options opts = {.out_dir = out, .progress = rank == 0 ? stdout : NULL,
                             .threads = (int)threads, .stop_requested = &stop_requested,
                             .dist = comm ? &dist : NULL, .comm = comm,
                             .metrics_fd = metrics_fd, .profile = profile};
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
        zt_train_result_print(&res, stdout);
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
