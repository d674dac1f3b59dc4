/* A job's ranks on this host (rank_group.h): the environment each one gets under `ztrain run`'s
 * and ztraind's policies, the one call that starts a rank, and the verdict and the words for how
 * a rank ended. The lists of replaced and inherited variables live here and nowhere else. */
#define _GNU_SOURCE
#include "rank_group.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/random.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proc_spawn.h"
#include "strfmt.h"

extern char **environ;

/* ZT_RANK_ENV_INHERIT drops these: the identity every launcher sets. Slurm's and torchelastic's
 * are removed as well as those set here, because when `ztrain run` itself runs inside a Slurm
 * step they describe that step, not the ranks started here, and zt_dist_from_env must not see
 * two contradicting identities. */
static const char *const replaced_vars[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "ZTRAIN_RUN_ID", "ZTRAIN_JOB_ID", "ZTRAIN_LAUNCHER_PID", "ZTRAIN_RDZV_SECRET",
    "ZTRAIN_OFFLOAD_RECORD",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "TORCHELASTIC_RUN_ID",
    "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
    /* torchrun's agent store is at its MASTER_PORT, not at the one set here: kept, it would move
     * the ranks' rendezvous to MASTER_PORT + 1 (zt_dist_from_env), a port nobody checked. */
    "TORCHELASTIC_USE_AGENT_STORE",
};

/* ZT_RANK_ENV_WHITELIST keeps only these: locale, paths, and the knobs of the libraries a rank
 * runs on, and the fault injections of tests (ZTRAIN_INJECT_*, engine/include/ztrain/fault_inject.h)
 * and their choice of CUDA module (ZTRAIN_CUDA_*: the emulated CUDA device, docs/gpu.md), which a
 * daemon started with them hands to its ranks. Anything else (the daemon's token, a user's
 * stray settings) stays out. */
static const char *const whitelist_names[] = {
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "ZTRAIN_COMM_TIMEOUT_S",
    "ZTRAIN_OPTIM_ISA", "ZTRAIN_GEMM", "ZTRAIN_GEMM_BF16", "OMP_WAIT_POLICY", "OMP_PROC_BIND",
    "OMP_PLACES",
};
static const char *const whitelist_prefixes[] = {"LC_",   "NCCL_", "ASAN_",         "UBSAN_",
                                                 "LSAN_", "ZTRAIN_INJECT_", "ZTRAIN_CUDA_"};

#define N_OF(a) (sizeof(a) / sizeof *(a))
#define MAX_SET 9       /* shared entries made here: OMP x2, run id, the torchrun six */

/* ------------------------------------------------------------------------------------------ */
/* The environment                                                                             */

/* Whether entry ("NAME=value") has the name `name`, given as "NAME" or as another "NAME=..." */
static bool same_name(const char *entry, const char *name) {
    size_t len = strcspn(name, "=");
    return strncmp(entry, name, len) == 0 && entry[len] == '=';
}

static bool named_in(const char *entry, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (same_name(entry, names[i]))
            return true;
    return false;
}

/* Whether spec's policy passes the caller's entry on to the ranks. */
static bool policy_passes(const zt_rank_group_spec *s, const char *entry) {
    if (s->env == ZT_RANK_ENV_INHERIT)
        return !named_in(entry, replaced_vars, N_OF(replaced_vars));
    if (!strchr(entry, '='))
        return false;
    if (named_in(entry, whitelist_names, N_OF(whitelist_names)))
        return true;
    for (size_t i = 0; i < N_OF(whitelist_prefixes); i++)
        if (strncmp(entry, whitelist_prefixes[i], strlen(whitelist_prefixes[i])) == 0)
            return true;
    return s->identity == ZT_RANK_ID_SLURM && same_name(entry, "SLURM_CONF");
}

/* The value of `name` that the ranks inherit from the caller, or NULL when they inherit none. */
static const char *inherited_value(const zt_rank_group_spec *s, char *const *env,
                                   const char *name) {
    for (char *const *p = env; *p; p++)
        if (same_name(*p, name) && policy_passes(s, *p))
            return *p + strlen(name) + 1;
    return NULL;
}

/* The thread count OMP_NUM_THREADS gives the outermost level ("4" or "4,2"), or 0. */
static int omp_threads(const char *v) {
    if (!v)
        return 0;
    char *end;
    errno = 0;
    long t = strtol(v, &end, 10);
    return errno || end == v || (*end && *end != ',') || t < 1 || t > 1 << 20 ? 0 : (int)t;
}

static char *own(zt_rank_env *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *own(zt_rank_env *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = zt_vstrfmt(fmt, ap);
    va_end(ap);
    ZT_ASSERT(e->n_owned < e->cap_owned);
    if (s)
        e->owned[e->n_owned++] = s;
    return s;
}

/* The entries set here for every rank, in order, into set[]; their count, or -1 when memory ran
 * out. */
static int shared_entries(zt_rank_env *e, char *const *env, char **set) {
    const zt_rank_group_spec *s = e->spec;
    int n = 0, cpus = zt_cpu_count();
    /* An explicit thread count replaces the user's OMP_NUM_THREADS; without either, every
     * rank's OpenMP runtime would start one thread per core, world_size times over. */
    const char *user_threads = inherited_value(s, env, "OMP_NUM_THREADS");
    int threads = s->threads_per_rank;
    bool set_threads = threads > 0 || !user_threads;
    if (threads <= 0)
        threads = set_threads ? (cpus / s->world_size > 0 ? cpus / s->world_size : 1)
                              : omp_threads(user_threads);
    if (set_threads)
        set[n++] = own(e, "OMP_NUM_THREADS=%d", threads);
    /* When the ranks' threads outnumber the cores, libgomp's spin-waiting at the end of each
     * parallel region keeps the core that another rank's thread needs: measured on 2 cores with
     * 2 ranks of 2 threads, a step took 450 ms spinning and 3 ms passive. It cannot see the
     * other processes, so the one starting them tells it (unless the user chose a policy). */
    bool passive = s->wait == ZT_RANK_WAIT_PASSIVE ||
                   (s->wait == ZT_RANK_WAIT_AUTO && threads > 0 &&
                    (long)threads * s->world_size > cpus);
    if (passive && !inherited_value(s, env, "OMP_WAIT_POLICY"))
        set[n++] = own(e, "OMP_WAIT_POLICY=PASSIVE");
    set[n++] = own(e, "ZTRAIN_RUN_ID=%s", s->run_id);
    /* A fresh secret per group, under either identity: the rendezvous store rank 0 serves at
     * MASTER_PORT answers only ranks that know it (engine/comm/tcp_store.h), not any process
     * of the host, nor (Slurm) of the other nodes. srun hands its environment to every task,
     * so all the ranks of a Slurm group get the same one. */
    unsigned char rnd[16];
    char hex[33];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        return -1;
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    set[n++] = own(e, "ZTRAIN_RDZV_SECRET=%s", hex);
    if (s->identity == ZT_RANK_ID_TORCHRUN) {
        set[n++] = own(e, "WORLD_SIZE=%d", s->world_size);
        set[n++] = own(e, "LOCAL_WORLD_SIZE=%d", s->world_size);
        set[n++] = own(e, "MASTER_ADDR=%s", s->master_addr);
        set[n++] = own(e, "MASTER_PORT=%d", s->master_port);
        /* Lets a worker ask for SIGTERM when its parent dies (PR_SET_PDEATHSIG), so that even a
         * SIGKILLed launcher leaves no rank behind. */
        set[n++] = own(e, "ZTRAIN_LAUNCHER_PID=%ld", (long)getpid());
    }
    ZT_ASSERT(n <= MAX_SET);
    for (int i = 0; i < n; i++)
        if (!set[i])
            return -1;
    return n;
}

/* Whether the caller's entry is one the ranks get from here instead. */
static bool set_here(const zt_rank_env *e, const char *entry, char *const *set, int n_set) {
    const zt_rank_group_spec *s = e->spec;
    for (int i = 0; i < n_set; i++)
        if (same_name(entry, set[i]))
            return true;
    for (const char *const *x = s->extra_env; x && *x; x++)
        if (same_name(entry, *x))
            return true;
    if (s->identity == ZT_RANK_ID_TORCHRUN &&
        (same_name(entry, "RANK") || same_name(entry, "LOCAL_RANK")))
        return true;
    return s->cuda_devices && same_name(entry, "CUDA_VISIBLE_DEVICES");
}

zt_status zt_rank_env_init(zt_rank_env *e, const zt_rank_group_spec *spec) {
    ZT_ASSERT(spec->world_size >= 1 && spec->run_id);
    ZT_ASSERT(spec->env == ZT_RANK_ENV_INHERIT || spec->env == ZT_RANK_ENV_WHITELIST);
    ZT_ASSERT(spec->identity == ZT_RANK_ID_TORCHRUN ||
              (spec->identity == ZT_RANK_ID_SLURM && !spec->cuda_devices));
    ZT_ASSERT(spec->identity == ZT_RANK_ID_SLURM || spec->master_addr);
    *e = (zt_rank_env){.spec = spec};
    char *const *env = spec->caller_env ? spec->caller_env : environ;
    size_t n_env = 0, n_extra = 0;
    while (env[n_env])
        n_env++;
    while (spec->extra_env && spec->extra_env[n_extra])
        n_extra++;
    int world = spec->world_size;
    e->cap_owned = MAX_SET + (spec->cuda_devices ? (size_t)world : 0);
    e->owned = calloc(e->cap_owned, sizeof *e->owned);
    /* Inherited, set here, extra, then RANK, LOCAL_RANK, CUDA_VISIBLE_DEVICES,
     * ZTRAIN_METRICS_FD and the NULL. */
    e->envp = calloc(n_env + MAX_SET + n_extra + 5, sizeof *e->envp);
    if (spec->cuda_devices)
        e->cuda_vars = calloc((size_t)world, sizeof *e->cuda_vars);
    char *set[MAX_SET];
    int n_set = e->owned && e->envp && (e->cuda_vars || !spec->cuda_devices)
                    ? shared_entries(e, env, set)
                    : -1;
    for (int r = 0; n_set >= 0 && e->cuda_vars && r < world; r++) {
        ZT_ASSERT(spec->cuda_devices[r]);
        e->cuda_vars[r] = own(e, "CUDA_VISIBLE_DEVICES=%s", spec->cuda_devices[r]);
        if (!e->cuda_vars[r])
            n_set = -1;
    }
    if (n_set < 0) {
        zt_rank_env_free(e);
        return zt_error(ZT_ERR_NOMEM, "out of memory building the ranks' environment");
    }
    size_t k = 0;
    for (char *const *p = env; *p; p++)
        if (policy_passes(spec, *p) && !set_here(e, *p, set, n_set))
            e->envp[k++] = *p;
    for (int i = 0; i < n_set; i++)
        e->envp[k++] = set[i];
    for (size_t i = 0; i < n_extra; i++)
        e->envp[k++] = (char *)spec->extra_env[i];
    e->envp[k] = NULL;
    e->n_shared = k;
    return ZT_OK;
}

char *const *zt_rank_env_of(zt_rank_env *e, int rank, bool metrics_fd) {
    ZT_ASSERT(e->spec->identity == ZT_RANK_ID_TORCHRUN);
    ZT_ASSERT(rank >= 0 && rank < e->spec->world_size);
    size_t k = e->n_shared;
    snprintf(e->rank_var, sizeof e->rank_var, "RANK=%d", rank);
    snprintf(e->local_rank_var, sizeof e->local_rank_var, "LOCAL_RANK=%d", rank);
    e->envp[k++] = e->rank_var;
    e->envp[k++] = e->local_rank_var;
    if (e->cuda_vars)
        e->envp[k++] = e->cuda_vars[rank];
    if (metrics_fd) {
        snprintf(e->metrics_var, sizeof e->metrics_var, "ZTRAIN_METRICS_FD=3");
        e->envp[k++] = e->metrics_var;
    }
    e->envp[k] = NULL;
    return e->envp;
}

void zt_rank_env_free(zt_rank_env *e) {
    for (size_t i = 0; i < e->n_owned; i++)
        free(e->owned[i]);
    free(e->owned);
    free(e->cuda_vars);
    free(e->envp);
    *e = (zt_rank_env){0};
}

/* ------------------------------------------------------------------------------------------ */
/* Starting a rank                                                                             */

zt_status zt_rank_spawn(zt_rank_env *e, int rank, const zt_rank_io *io, pid_t *pid, int *pidfd) {
    const zt_rank_group_spec *s = e->spec;
    bool metrics = io->metrics_fd > 0;
    zt_spawn_request req = {.program = s->program, .argv = s->argv,
                            .envp = zt_rank_env_of(e, rank, metrics), .cwd = s->cwd,
                            .pgid = io->pgid, .inherit_stdio = io->inherit_stdio,
                            .stdout_fd = io->stdout_fd, .stderr_fd = io->stderr_fd,
                            .fd3 = metrics ? io->metrics_fd : 0};
    return zt_spawn(&req, pid, pidfd);
}

/* ------------------------------------------------------------------------------------------ */
/* The record of the ranks' offload directories                                                */

zt_status zt_rank_record_init(zt_rank_record *r) {
    *r = (zt_rank_record){0};
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    int n = snprintf(r->path, sizeof r->path, "%s/ztrain-offload-record-XXXXXX", tmp);
    int fd = n > 0 && (size_t)n < sizeof r->path ? mkostemp(r->path, O_CLOEXEC) : -1;
    if (fd < 0) {
        zt_status s = zt_error(ZT_ERR_IO, "cannot create the record of the ranks' offload "
                               "directories in %s: %s", tmp, strerror(errno));
        r->path[0] = '\0';
        return s;
    }
    close(fd);
    snprintf(r->var, sizeof r->var, "ZTRAIN_OFFLOAD_RECORD=%s", r->path);
    return ZT_OK;
}

/* Whether dir's last component is what a rank `rank` names its directory (offload.c's
 * "ztrain-<job>-rank<r>-XXXXXX"): a line that is not one is never acted on. */
static bool is_rank_dir(const char *dir, int rank) {
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    char tag[32];
    snprintf(tag, sizeof tag, "-rank%d-", rank);
    return strncmp(base, "ztrain-", 7) == 0 && strstr(base, tag) != NULL;
}

/* Removes dir and the files in it (the rank makes nothing else there); errno on failure. */
static int remove_rank_dir(const char *dir) {
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return -1;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return -1;
    }
    int err = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
            unlinkat(dfd, e->d_name, 0) != 0 && !err)
            err = errno;
    closedir(d);
    if (!err && rmdir(dir) != 0)
        err = errno;
    errno = err;
    return err ? -1 : 0;
}

/* One line of the record: "RANK PATH" for a directory the rank names before it makes it, "RANK
 * -PATH" for a name it withdrew because the name was taken by then (offload.c's make_dir). */
static bool read_line(char *line, int *rank, const char **dir, bool *withdrawn) {
    line[strcspn(line, "\n")] = '\0';
    int at = 0;
    if (sscanf(line, "%d %n", rank, &at) != 1 || at == 0)
        return false;
    *withdrawn = line[at] == '-';
    *dir = line + at + *withdrawn;
    return **dir == '/' && is_rank_dir(*dir, *rank);
}

/* Whether the record withdraws rank's dir: the directory of that name is someone else's. */
static bool is_withdrawn(const char *record, int rank, const char *dir) {
    FILE *f = fopen(record, "re");
    if (!f)
        return false;
    bool found = false;
    char line[2 * 4096 + 32];
    while (!found && fgets(line, sizeof line, f)) {
        int r;
        const char *d;
        bool withdrawn;
        found = read_line(line, &r, &d, &withdrawn) && withdrawn && r == rank &&
                strcmp(d, dir) == 0;
    }
    fclose(f);
    return found;
}

int zt_rank_record_clean(const zt_rank_record *r,
                         void (*removed)(void *ctx, int rank, const char *dir),
                         void (*failed)(void *ctx, int rank, const char *dir, const char *why),
                         void *ctx) {
    if (!r->path[0])
        return 0;
    FILE *f = fopen(r->path, "re");
    if (!f)
        return 0;
    int n = 0;
    char line[2 * 4096 + 32];
    while (fgets(line, sizeof line, f)) {
        int rank;
        const char *dir;
        bool withdrawn;
        if (!read_line(line, &rank, &dir, &withdrawn) || withdrawn ||
            is_withdrawn(r->path, rank, dir))
            continue;
        /* Not there (ENOENT): removed by its rank as it ended, or a name recorded by a rank
         * killed before it made the directory; nothing to say either way. */
        if (remove_rank_dir(dir) == 0) {
            n++;
            if (removed)
                removed(ctx, rank, dir);
        } else if (errno != ENOENT && failed) {
            failed(ctx, rank, dir, strerror(errno));
        }
    }
    fclose(f);
    return n;
}

void zt_rank_record_free(zt_rank_record *r) {
    if (r->path[0])
        unlink(r->path);
    *r = (zt_rank_record){0};
}

/* ------------------------------------------------------------------------------------------ */
/* How a rank ended                                                                            */

bool zt_rank_exit_is_failure(const zt_rank_exit *x, zt_rank_sent sent) {
    if (x->term_signal == 0)
        return x->exit_status != 0 && x->exit_status != ZT_RANK_EXIT_STOPPED;
    if (sent == ZT_RANK_SENT_KILL)
        return false;
    return !(sent == ZT_RANK_SENT_STOP && x->term_signal == SIGTERM);
}

void zt_rank_describe_signal(char *buf, size_t size, int sig) {
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev)
        snprintf(buf, size, "signal %d (SIG%s)", sig, abbrev);
    else
        snprintf(buf, size, "signal %d", sig);
}

void zt_rank_describe_exit(char *buf, size_t size, int rank, const char *host,
                           const zt_rank_exit *x, const char *last_stderr) {
    char who[300], sig[64];
    int n = snprintf(who, sizeof who, "rank %d", rank);
    if (host && n >= 0 && (size_t)n < sizeof who)
        n += snprintf(who + n, sizeof who - (size_t)n, " on %s", host);
    if (x->pid && n >= 0 && (size_t)n < sizeof who)
        snprintf(who + n, sizeof who - (size_t)n, " (pid %ld)", (long)x->pid);
    if (x->term_signal) {
        zt_rank_describe_signal(sig, sizeof sig, x->term_signal);
        snprintf(buf, size, "%s was killed by %s", who, sig);
    } else if (x->exit_status < 0) {
        snprintf(buf, size, "%s ended, but its exit status was lost (reaped elsewhere)", who);
    } else if (last_stderr) {
        snprintf(buf, size, "%s exited with status %d: %s", who, x->exit_status, last_stderr);
    } else {
        snprintf(buf, size, "%s exited with status %d", who, x->exit_status);
    }
}

bool zt_rank_is_stopped(pid_t pid) {
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    /* The name in parentheses may hold anything: the state follows the last ')'. */
    const char *close = strrchr(stat, ')');
    return close && close[1] == ' ' && (close[2] == 'T' || close[2] == 't');
}

void zt_rank_describe_stuck(char *buf, size_t size, int rank, pid_t pid, bool stopped,
                            double grace_s, const char *first_failure) {
    char how[128];
    if (stopped)
        snprintf(how, sizeof how, "was stopped (SIGSTOP or a debugger)");
    else
        snprintf(how, sizeof how, "did not end within %g s of SIGTERM and was killed", grace_s);
    snprintf(buf, size, "rank %d (pid %ld) stopped answering: it %s when %s", rank, (long)pid,
             how, first_failure);
}

/* ------------------------------------------------------------------------------------------ */
/* The rendezvous port                                                                         */

zt_status zt_rank_free_port(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return zt_error(ZT_ERR_IO, "cannot pick a MASTER_PORT: socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    zt_status s = ZT_OK;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        s = zt_error(ZT_ERR_IO, "cannot pick a MASTER_PORT on 127.0.0.1: %s", strerror(errno));
    else
        *port = ntohs(a.sin_port);
    close(fd);
    return s;
}
