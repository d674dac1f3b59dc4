/* The rank-group contract that `ztrain run` and ztraind share (service/ranks/rank_group.c): each rank's
 * environment under both policies, checked entry by entry against hand-written lists; a real
 * spawn, whose child reports what it got; the verdict on a rank's end, against a table; the
 * descriptions, against the exact texts that users and the launch and service tests read; and
 * the record of the ranks' NVMe offload directories, with ranks killed while making theirs. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ranks/rank_group.h"
#include "ztrain/offload.h"

/* A caller's environment with a bit of everything: the user's own settings, a secret, the
 * identity of an enclosing launcher (Slurm, torchrun), a stale GPU choice. */
static char *caller[] = {
    "PATH=/usr/bin:/bin", "HOME=/home/u", "LC_ALL=C", "NCCL_DEBUG=INFO", "MY_SETTING=1",
    "ZTRAIN_TOKEN=s3cret", "RANK=7", "LOCAL_RANK=7", "WORLD_SIZE=9", "MASTER_PORT=1",
    "ZTRAIN_RUN_ID=outer", "SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_CONF=/etc/slurm.conf",
    "TORCHELASTIC_RUN_ID=te", "TORCHELASTIC_USE_AGENT_STORE=True", "CUDA_VISIBLE_DEVICES=7",
    NULL,
};

static int cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return (int)sysconf(_SC_NPROCESSORS_ONLN);
    return CPU_COUNT(&set);
}

static size_t count(char *const *v) {
    size_t n = 0;
    while (v[n])
        n++;
    return n;
}

/* The rendezvous secret is fresh per group: a want of SECRET_ANY matches any 32 hex digits. */
#define SECRET_ANY "ZTRAIN_RDZV_SECRET=*"

static bool is_secret(const char *entry) {
    size_t prefix = strlen(SECRET_ANY) - 1;
    if (strncmp(entry, SECRET_ANY, prefix) != 0)
        return false;
    const char *v = entry + prefix;
    return strlen(v) == 32 && strspn(v, "0123456789abcdef") == 32;
}

static bool has(char *const *v, const char *entry) {
    for (; *v; v++)
        if (strcmp(*v, entry) == 0 || (strcmp(*v, SECRET_ANY) == 0 && is_secret(entry)) ||
            (strcmp(entry, SECRET_ANY) == 0 && is_secret(*v)))
            return true;
    return false;
}

static const char *secret_of(char *const *envp) {
    for (; *envp; envp++)
        if (is_secret(*envp))
            return *envp;
    return "";
}

/* envp must hold exactly the NULL-terminated `want` (any order), each name once. */
static void check_env_at(int line, const char *what, char *const *envp, char *const *want) {
    for (char *const *w = want; *w; w++)
        check_at(__FILE__, line, has(envp, *w), "%s: %s is missing", what, *w);
    for (char *const *p = envp; *p; p++) {
        check_at(__FILE__, line, has(want, *p), "%s: %s should not be there", what, *p);
        size_t len = strcspn(*p, "=");
        for (char *const *q = p + 1; *q; q++)
            check_at(__FILE__, line, strncmp(*p, *q, len + 1) != 0,
                     "%s: %.*s is set twice (%s, %s)", what, (int)len, *p, *p, *q);
    }
    check_at(__FILE__, line, count(envp) == count(want), "%s: %zu entries, want %zu", what,
             count(envp), count(want));
}
#define CHECK_ENV(what, envp, ...)                                                                 \
    check_env_at(__LINE__, what, envp, (char *const[]){__VA_ARGS__, NULL})

static char pid_var[64];

/* `ztrain run`: the user's environment, less every launcher's identity; ours instead. */
static void inherit_policy(void) {
    zt_rank_group_spec spec = {.world_size = 2, .env = ZT_RANK_ENV_INHERIT,
                               .identity = ZT_RANK_ID_TORCHRUN, .master_addr = "127.0.0.1",
                               .master_port = 12345, .run_id = "r1", .threads_per_rank = 3,
                               .caller_env = caller};
    zt_rank_env e;
    CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
    CHECK_ENV("inherit, rank 1", zt_rank_env_of(&e, 1, false), "PATH=/usr/bin:/bin",
              "HOME=/home/u", "LC_ALL=C", "NCCL_DEBUG=INFO", "MY_SETTING=1", "ZTRAIN_TOKEN=s3cret",
              "SLURM_CONF=/etc/slurm.conf", "CUDA_VISIBLE_DEVICES=7", "OMP_NUM_THREADS=3",
              "ZTRAIN_RUN_ID=r1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
              "MASTER_PORT=12345", SECRET_ANY, pid_var, "RANK=1", "LOCAL_RANK=1");
    CHECK_ENV("inherit, rank 0", zt_rank_env_of(&e, 0, false), "PATH=/usr/bin:/bin",
              "HOME=/home/u", "LC_ALL=C", "NCCL_DEBUG=INFO", "MY_SETTING=1", "ZTRAIN_TOKEN=s3cret",
              "SLURM_CONF=/etc/slurm.conf", "CUDA_VISIBLE_DEVICES=7", "OMP_NUM_THREADS=3",
              "ZTRAIN_RUN_ID=r1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
              "MASTER_PORT=12345", SECRET_ANY, pid_var, "RANK=0", "LOCAL_RANK=0");
    /* One secret for the group's ranks, another for the next group (issue 34). */
    char first[64];
    snprintf(first, sizeof first, "%s", secret_of(zt_rank_env_of(&e, 0, false)));
    CHECK(first[0] && strcmp(first, secret_of(zt_rank_env_of(&e, 1, false))) == 0);
    zt_rank_env again;
    CHECK(zt_rank_env_init(&again, &spec) == ZT_OK);
    CHECK(strcmp(first, secret_of(zt_rank_env_of(&again, 0, false))) != 0);
    zt_rank_env_free(&again);
    zt_rank_env_free(&e);
}

/* ztraind: the whitelist only; the token, the user's settings and Slurm's variables stay out. */
static void whitelist_policy(void) {
    zt_rank_group_spec spec = {.world_size = 2, .env = ZT_RANK_ENV_WHITELIST,
                               .identity = ZT_RANK_ID_TORCHRUN, .master_addr = "127.0.0.1",
                               .master_port = 29500, .run_id = "ztraind1-job-000001",
                               .threads_per_rank = 2, .wait = ZT_RANK_WAIT_PASSIVE,
                               .caller_env = caller};
    zt_rank_env e;
    CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
    CHECK_ENV("whitelist, rank 0 with the metrics pipe", zt_rank_env_of(&e, 0, true),
              "PATH=/usr/bin:/bin", "HOME=/home/u", "LC_ALL=C", "NCCL_DEBUG=INFO",
              "CUDA_VISIBLE_DEVICES=7", "OMP_NUM_THREADS=2", "OMP_WAIT_POLICY=PASSIVE",
              "ZTRAIN_RUN_ID=ztraind1-job-000001", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2",
              "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", SECRET_ANY, pid_var, "RANK=0",
              "LOCAL_RANK=0",
              "ZTRAIN_METRICS_FD=3");
    char *const *r1 = zt_rank_env_of(&e, 1, false);
    CHECK(!has(r1, "ZTRAIN_METRICS_FD=3") && has(r1, "RANK=1") && has(r1, "LOCAL_RANK=1"));
    CHECK(!has(r1, "ZTRAIN_TOKEN=s3cret"), "the daemon's token must not reach a rank");
    zt_rank_env_free(&e);

    /* A policy the daemon's environment chose is passed on and wins over PASSIVE. */
    char *with_policy[] = {"PATH=/bin", "OMP_WAIT_POLICY=ACTIVE", "OMP_NUM_THREADS=64", NULL};
    spec.caller_env = with_policy;
    CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
    CHECK_ENV("whitelist, the caller's wait policy", zt_rank_env_of(&e, 1, false), "PATH=/bin",
              "OMP_WAIT_POLICY=ACTIVE", "OMP_NUM_THREADS=2", "ZTRAIN_RUN_ID=ztraind1-job-000001",
              "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500",
              SECRET_ANY,
              pid_var, "RANK=1", "LOCAL_RANK=1");
    zt_rank_env_free(&e);
}

/* srun's environment: the whitelist plus SLURM_CONF, the run id, the metrics endpoint and the
 * group's rendezvous secret (fresh per group, as under the local launcher), and no torchrun
 * identity (the tasks take Slurm's). */
static void slurm_identity(void) {
    const char *extra[] = {"ZTRAIN_METRICS_ADDR=n0:4000", "ZTRAIN_METRICS_TOKEN=abc",
                           "ZTRAIN_REPORT_PLACEMENT=1", NULL};
    zt_rank_group_spec spec = {.world_size = 4, .env = ZT_RANK_ENV_WHITELIST,
                               .identity = ZT_RANK_ID_SLURM, .run_id = "ztraind-job-000002",
                               .threads_per_rank = 1, .extra_env = extra, .caller_env = caller};
    zt_rank_env e;
    CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
    CHECK_ENV("srun", e.envp, "PATH=/usr/bin:/bin", "HOME=/home/u", "LC_ALL=C",
              "NCCL_DEBUG=INFO", "CUDA_VISIBLE_DEVICES=7", "SLURM_CONF=/etc/slurm.conf",
              "OMP_NUM_THREADS=1", "ZTRAIN_RUN_ID=ztraind-job-000002",
              "ZTRAIN_METRICS_ADDR=n0:4000", "ZTRAIN_METRICS_TOKEN=abc",
              "ZTRAIN_REPORT_PLACEMENT=1", SECRET_ANY);
    zt_rank_env again;
    CHECK(zt_rank_env_init(&again, &spec) == ZT_OK);
    CHECK(strcmp(secret_of(e.envp), secret_of(again.envp)) != 0);
    zt_rank_env_free(&again);
    zt_rank_env_free(&e);
}

/* OMP_NUM_THREADS and OMP_WAIT_POLICY: max(1, cpus / world_size) without a choice; the user's
 * OMP_NUM_THREADS as it is under `ztrain run`; passive when the threads outnumber the cores. */
static void threads_and_wait(void) {
    char want[64];
    zt_rank_env e;
    char *bare[] = {"PATH=/bin", NULL};
    zt_rank_group_spec spec = {.world_size = 1, .env = ZT_RANK_ENV_INHERIT,
                               .identity = ZT_RANK_ID_TORCHRUN, .master_addr = "127.0.0.1",
                               .run_id = "t", .wait = ZT_RANK_WAIT_AUTO, .caller_env = bare};
    CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
    snprintf(want, sizeof want, "OMP_NUM_THREADS=%d", cpus());
    CHECK(has(e.envp, want), "one rank gets every core (%s)", want);
    CHECK(!has(e.envp, "OMP_WAIT_POLICY=PASSIVE"), "cpus threads on cpus cores do not spin-wait");
    zt_rank_env_free(&e);

    spec.world_size = 100000;   /* more ranks than any machine has cores */
    CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
    CHECK(has(e.envp, "OMP_NUM_THREADS=1") && has(e.envp, "OMP_WAIT_POLICY=PASSIVE"));
    zt_rank_env_free(&e);

    char *user[] = {"OMP_NUM_THREADS=100000,2", "PATH=/bin", NULL};
    spec.world_size = 2;
    spec.caller_env = user;
    CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
    CHECK(has(e.envp, "OMP_NUM_THREADS=100000,2") && has(e.envp, "OMP_WAIT_POLICY=PASSIVE"),
          "the user's thread count is kept, and weighed against the cores");
    zt_rank_env_free(&e);

    char *user_policy[] = {"OMP_NUM_THREADS=100000", "OMP_WAIT_POLICY=active", NULL};
    spec.caller_env = user_policy;
    spec.threads_per_rank = 4;
    CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
    CHECK_ENV("explicit threads, the user's policy", zt_rank_env_of(&e, 0, false),
              "OMP_NUM_THREADS=4", "OMP_WAIT_POLICY=active", "ZTRAIN_RUN_ID=t", "WORLD_SIZE=2",
              "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=0", SECRET_ANY, pid_var,
              "RANK=0", "LOCAL_RANK=0");
    zt_rank_env_free(&e);

    /* Under the whitelist the caller's OMP_NUM_THREADS is not inherited, so it is not kept. */
    spec.env = ZT_RANK_ENV_WHITELIST;
    spec.threads_per_rank = 0;
    spec.world_size = 100000;
    CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
    CHECK(has(e.envp, "OMP_NUM_THREADS=1") && !has(e.envp, "OMP_NUM_THREADS=100000"));
    zt_rank_env_free(&e);
}

/* A GPU assignment becomes each rank's CUDA_VISIBLE_DEVICES and replaces the caller's stale one,
 * under both policies; without one the caller's is inherited as it is, or there is none. */
static void cuda_devices(void) {
    const char *gpus[] = {"0", "2,3"};
    zt_rank_env_policy policies[] = {ZT_RANK_ENV_INHERIT, ZT_RANK_ENV_WHITELIST};
    char *no_gpu[] = {"PATH=/bin", NULL};
    for (int i = 0; i < 2; i++) {
        zt_rank_group_spec spec = {.world_size = 2, .env = policies[i],
                                   .identity = ZT_RANK_ID_TORCHRUN, .master_addr = "127.0.0.1",
                                   .run_id = "c", .threads_per_rank = 1, .cuda_devices = gpus,
                                   .caller_env = caller};
        zt_rank_env e;
        CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
        char *const *r0 = zt_rank_env_of(&e, 0, true);
        CHECK(has(r0, "CUDA_VISIBLE_DEVICES=0") && !has(r0, "CUDA_VISIBLE_DEVICES=7"),
              "policy %d, rank 0", i);
        char *const *r1 = zt_rank_env_of(&e, 1, false);
        CHECK(has(r1, "CUDA_VISIBLE_DEVICES=2,3") && !has(r1, "CUDA_VISIBLE_DEVICES=7") &&
              !has(r1, "CUDA_VISIBLE_DEVICES=0"), "policy %d, rank 1", i);
        zt_rank_env_free(&e);

        spec.cuda_devices = NULL;
        CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
        CHECK(has(zt_rank_env_of(&e, 1, false), "CUDA_VISIBLE_DEVICES=7"),
              "policy %d: no assignment, the caller's is passed on", i);
        zt_rank_env_free(&e);

        spec.caller_env = no_gpu;
        CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
        char *const *r = zt_rank_env_of(&e, 1, false);
        for (char *const *p = r; *p; p++)
            CHECK(strncmp(*p, "CUDA_VISIBLE_DEVICES=", 21) != 0, "policy %d: %s", i, *p);
        zt_rank_env_free(&e);
    }
}

/* Runs one rank through zt_rank_spawn; it prints its environment, whether fd 3 is open, its
 * process group and its blocked signals, which *out receives. Returns its pid (reaped). */
static pid_t spawn_and_read(zt_rank_env *e, int rank, pid_t pgid, int metrics_fd, char *out,
                            size_t size) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        exit(2);
    zt_rank_io io = {.pgid = pgid, .stdout_fd = p[1], .stderr_fd = -1, .metrics_fd = metrics_fd};
    pid_t pid = 0;
    CHECK(zt_rank_spawn(e, rank, &io, &pid, NULL) == ZT_OK, "%s", zt_last_error());
    close(p[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < size && (k = read(p[0], out + n, size - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = '\0';
    close(p[0]);
    return pid;
}

static void spawn(void) {
    char *argv[] = {"sh", "-c",
                    "/usr/bin/env; if [ -e /dev/fd/3 ]; then echo FD3=open; fi; "
                    "read -r st < /proc/$$/stat; set -- $st; echo PGID=$5; "
                    "while read -r k v; do [ \"$k\" = SigBlk: ] && echo SIGBLK=$v; done "
                    "< /proc/$$/status; exit 0", NULL};
    const char *gpus[] = {"1", "0"};
    zt_rank_group_spec spec = {.program = "/bin/sh", .argv = argv, .world_size = 2,
                               .env = ZT_RANK_ENV_WHITELIST, .identity = ZT_RANK_ID_TORCHRUN,
                               .master_addr = "127.0.0.1", .master_port = 29500, .run_id = "s",
                               .threads_per_rank = 1, .cuda_devices = gpus, .caller_env = caller};
    zt_rank_env e;
    CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
    /* Blocked here, as in `ztrain run`: the ranks must start with an empty mask. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int met[2];
    if (pipe2(met, O_CLOEXEC) != 0)
        exit(2);
    static char out0[16384], out1[16384];
    pid_t pid0 = spawn_and_read(&e, 0, 0, met[1], out0, sizeof out0);
    pid_t pid1 = spawn_and_read(&e, 1, pid0, -1, out1, sizeof out1);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(met[0]);
    close(met[1]);
    char want[64];
    snprintf(want, sizeof want, "PGID=%ld\n", (long)pid0);
    CHECK(strstr(out0, want) && strstr(out1, want), "both in rank 0's group:\n%s\n%s", out0, out1);
    CHECK(strstr(out0, "\nRANK=0\n") && strstr(out0, "\nZTRAIN_METRICS_FD=3\n") &&
          strstr(out0, "FD3=open\n") && strstr(out0, "\nCUDA_VISIBLE_DEVICES=1\n"), "%s", out0);
    CHECK(strstr(out1, "\nRANK=1\n") && !strstr(out1, "ZTRAIN_METRICS_FD") &&
          !strstr(out1, "FD3=open") && strstr(out1, "\nCUDA_VISIBLE_DEVICES=0\n"), "%s", out1);
    CHECK(strstr(out0, "SIGBLK=0000000000000000\n") && strstr(out1, "SIGBLK=0000000000000000\n"),
          "an empty signal mask:\n%s\n%s", out0, out1);
    CHECK(!strstr(out0, "ZTRAIN_TOKEN") && !strstr(out0, "MY_SETTING"), "%s", out0);
    int st0 = -1, st1 = -1;
    CHECK(waitpid(pid0, &st0, 0) == pid0 && WIFEXITED(st0) && WEXITSTATUS(st0) == 0);
    CHECK(waitpid(pid1, &st1, 0) == pid1 && WIFEXITED(st1) && WEXITSTATUS(st1) == 0);
    zt_rank_env_free(&e);

    /* A program that is not there: the error names it. */
    spec.program = "/nonexistent/ztrain-worker";
    CHECK(zt_rank_env_init(&e, &spec) == ZT_OK);
    zt_rank_io io = {.stdout_fd = -1, .stderr_fd = -1};
    pid_t pid;
    zt_status s = zt_rank_spawn(&e, 0, &io, &pid, NULL);
    CHECK(s == ZT_ERR_IO && strstr(zt_last_error(), "/nonexistent/ztrain-worker") &&
          strstr(zt_last_error(), "No such file or directory"), "%s", zt_last_error());
    zt_rank_env_free(&e);
}

/* The verdict, against a table written from the rule: an exit status other than 0 and 130 is a
 * failure whatever was sent; a signal is, except the stop's SIGTERM and anything after SIGKILL. */
static void failures(void) {
    const struct {
        int status, sig;
        zt_rank_sent sent;
        bool failed;
    } cases[] = {
        {0, 0, ZT_RANK_SENT_NONE, false},         {130, 0, ZT_RANK_SENT_NONE, false},
        {1, 0, ZT_RANK_SENT_NONE, true},          {2, 0, ZT_RANK_SENT_STOP, true},
        {129, 0, ZT_RANK_SENT_NONE, true},        {131, 0, ZT_RANK_SENT_NONE, true},
        {-1, 0, ZT_RANK_SENT_NONE, true},         {1, 0, ZT_RANK_SENT_KILL, true},
        {130, 0, ZT_RANK_SENT_KILL, false},       {-1, SIGKILL, ZT_RANK_SENT_NONE, true},
        {-1, SIGTERM, ZT_RANK_SENT_NONE, true},   {-1, SIGTERM, ZT_RANK_SENT_STOP, false},
        {-1, SIGINT, ZT_RANK_SENT_STOP, true},    {-1, SIGKILL, ZT_RANK_SENT_STOP, true},
        {-1, SIGSEGV, ZT_RANK_SENT_STOP, true},   {-1, SIGKILL, ZT_RANK_SENT_KILL, false},
        {-1, SIGSEGV, ZT_RANK_SENT_KILL, false},  {-1, SIGTERM, ZT_RANK_SENT_KILL, false},
        {0, SIGABRT, ZT_RANK_SENT_NONE, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        zt_rank_exit x = {.pid = 10, .exit_status = cases[i].status, .term_signal = cases[i].sig};
        CHECK(zt_rank_exit_is_failure(&x, cases[i].sent) == cases[i].failed,
              "status %d, signal %d, sent %d: want %s", cases[i].status, cases[i].sig,
              (int)cases[i].sent, cases[i].failed ? "a failure" : "no failure");
    }
}

static void describe_one(int line, int rank, const char *host, pid_t pid, int status, int sig,
                         const char *last, const char *want) {
    char buf[512];
    zt_rank_exit x = {.pid = pid, .exit_status = status, .term_signal = sig};
    zt_rank_describe_exit(buf, sizeof buf, rank, host, &x, last);
    check_str_at(__FILE__, line, "zt_rank_describe_exit", buf, want);
}

static void descriptions(void) {
    /* tests/dist/test_launch.py and tests/service/test_supervision.py read these. */
    describe_one(__LINE__, 1, NULL, 4242, -1, 9, NULL,
                 "rank 1 (pid 4242) was killed by signal 9 (SIGKILL)");
    describe_one(__LINE__, 0, NULL, 4241, 1, 0, "RuntimeError: boom",
                 "rank 0 (pid 4241) exited with status 1: RuntimeError: boom");
    describe_one(__LINE__, 0, NULL, 4241, 0, 0, NULL, "rank 0 (pid 4241) exited with status 0");
    describe_one(__LINE__, 3, "n2", 0, 3, 0, NULL, "rank 3 on n2 exited with status 3");
    describe_one(__LINE__, 2, "n2", 977, -1, 9, "last words",
                 "rank 2 on n2 (pid 977) was killed by signal 9 (SIGKILL)");
    describe_one(__LINE__, 1, NULL, 4242, -1, 0, NULL,
                 "rank 1 (pid 4242) ended, but its exit status was lost (reaped elsewhere)");
    describe_one(__LINE__, 5, NULL, 12, -1, 15, NULL,
                 "rank 5 (pid 12) was killed by signal 15 (SIGTERM)");

    char small[16];
    zt_rank_exit x = {.pid = 4242, .exit_status = 1};
    zt_rank_describe_exit(small, sizeof small, 1, NULL, &x, NULL);
    CHECK_STR(small, "rank 1 (pid 424");

    /* Names from a table: the numbers Linux gives these on every architecture, and the others
     * by their <signal.h> macros. */
    const struct {
        int sig;
        const char *name;
    } names[] = {
        {1, "SIGHUP"},         {2, "SIGINT"},         {3, "SIGQUIT"},        {4, "SIGILL"},
        {5, "SIGTRAP"},        {6, "SIGABRT"},        {8, "SIGFPE"},         {9, "SIGKILL"},
        {11, "SIGSEGV"},       {13, "SIGPIPE"},       {14, "SIGALRM"},       {15, "SIGTERM"},
        {SIGBUS, "SIGBUS"},    {SIGUSR1, "SIGUSR1"},  {SIGUSR2, "SIGUSR2"},  {SIGCHLD, "SIGCHLD"},
        {SIGCONT, "SIGCONT"},  {SIGSTOP, "SIGSTOP"},  {SIGTSTP, "SIGTSTP"},  {SIGXCPU, "SIGXCPU"},
        {SIGXFSZ, "SIGXFSZ"},  {SIGSYS, "SIGSYS"},    {SIGWINCH, "SIGWINCH"},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char want[64], got[64];
        snprintf(want, sizeof want, "signal %d (%s)", names[i].sig, names[i].name);
        zt_rank_describe_signal(got, sizeof got, names[i].sig);
        CHECK_STR(got, want);
    }
    /* A real-time signal has a number but no abbreviation. */
    char got[64], want[64];
    zt_rank_describe_signal(got, sizeof got, SIGRTMIN + 2);
    snprintf(want, sizeof want, "signal %d", SIGRTMIN + 2);
    CHECK_STR(got, want);
}

/* ---- the record of the ranks' offload directories ------------------------------------------ */

typedef struct {
    int removed, failed;
    char said[2048];
} cleaned;

static void on_removed(void *ctx, int rank, const char *dir) {
    cleaned *c = ctx;
    c->removed++;
    size_t n = strlen(c->said);
    snprintf(c->said + n, sizeof c->said - n, "removed %d %s; ", rank, dir);
}

static void on_failed(void *ctx, int rank, const char *dir, const char *why) {
    cleaned *c = ctx;
    c->failed++;
    size_t n = strlen(c->said);
    snprintf(c->said + n, sizeof c->said - n, "failed %d %s: %s; ", rank, dir, why);
}

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    if (d)
        closedir(d);
    return n;
}

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Rank 1 making its NVMe offload directory under nvme in a child process, which SIGKILLs itself
 * at `point` of it (ZTRAIN_INJECT_OFFLOAD_KILL, offload.c); the child's wait status. */
static int rank_killed_at(const char *nvme, const zt_rank_record *rec, const char *point) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv(ZT_OFFLOAD_RECORD_ENV, rec->path, 1);
        setenv("ZTRAIN_INJECT_OFFLOAD_KILL", point, 1);
        zt_backend *be;
        zt_backend_options opts = {.threads = 1};
        if (zt_backend_create(&be, ZT_DEVICE_CPU, &opts) != ZT_OK)
            _exit(3);
        zt_offload_config opt = {.device = ZT_OFFLOAD_NVME, .buffer_count = 1, .ratio = 1.0};
        snprintf(opt.nvme_path, sizeof opt.nvme_path, "%s", nvme);
        zt_offload_config param = {.device = ZT_OFFLOAD_NONE};
        zt_offload_spec spec = {.be = be, .rank = 1, .job_name = "rec", .n = 4096,
                                .optimizer = &opt, .param = &param};
        spec.streams[ZT_OFFLOAD_EXP_AVG] =
            (zt_offload_stream_spec){ZT_PLACE_FILE, "exp_avg", 4, NULL, false};
        zt_offload *f;
        _exit(zt_offload_create(&f, &spec) == ZT_OK ? 0 : 4);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

/* The record's lines, as one string. */
static void read_record(const zt_rank_record *rec, char *out, size_t n) {
    FILE *f = fopen(rec->path, "r");
    size_t got = f ? fread(out, 1, n - 1, f) : 0;
    out[got] = '\0';
    if (f)
        fclose(f);
}

static void offload_record(void) {
    char root[] = "/tmp/ztrain_record_XXXXXX", nvme[64];
    if (!check_at(__FILE__, __LINE__, mkdtemp(root) != NULL, "mkdtemp: %s", strerror(errno)))
        return;
    snprintf(nvme, sizeof nvme, "%s/nvme", root);
    mkdir(nvme, 0700);
    setenv("TMPDIR", root, 1);
    char lines[4096], want[4200];

    /* A rank killed after recording its directory's name but before making it: the record names
     * a directory that never came to be, nothing is left under nvme_path, and the cleaner passes
     * over the name without a word. */
    zt_rank_record rec;
    if (check_at(__FILE__, __LINE__, zt_rank_record_init(&rec) == ZT_OK, "%s",
                 zt_last_error())) {
        int st = rank_killed_at(nvme, &rec, "recorded");
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the rank was killed (status %d)", st);
        read_record(&rec, lines, sizeof lines);
        snprintf(want, sizeof want, "1 %s/ztrain-rec-rank1-", nvme);
        CHECK(strncmp(lines, want, strlen(want)) == 0 && strchr(lines, '\n') ==
                  lines + strlen(lines) - 1, "the record holds one line for rank 1: '%s'", lines);
        CHECK(entries(nvme) == 0, "nothing is left under nvme_path: %d entries", entries(nvme));
        cleaned c = {0};
        int n = zt_rank_record_clean(&rec, on_removed, on_failed, &c);
        CHECK(n == 0 && c.removed == 0 && c.failed == 0, "the cleaner says nothing: %d, '%s'", n,
              c.said);
        zt_rank_record_free(&rec);
    }

    /* Killed just after making it: the record names it, and the cleaner removes it. */
    if (check_at(__FILE__, __LINE__, zt_rank_record_init(&rec) == ZT_OK, "%s",
                 zt_last_error())) {
        int st = rank_killed_at(nvme, &rec, "made");
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the rank was killed (status %d)", st);
        read_record(&rec, lines, sizeof lines);
        lines[strcspn(lines, "\n")] = '\0';
        CHECK(entries(nvme) == 1 && is_dir(lines + 2),
              "the rank left its directory %s (%d entries)", lines + 2, entries(nvme));
        cleaned c = {0};
        int n = zt_rank_record_clean(&rec, on_removed, on_failed, &c);
        snprintf(want, sizeof want, "removed 1 %s; ", lines + 2);
        CHECK(n == 1 && strcmp(c.said, want) == 0, "the cleaner removes it: %d, '%s'", n, c.said);
        CHECK(entries(nvme) == 0, "nothing is left under nvme_path: %d entries", entries(nvme));
        zt_rank_record_free(&rec);
    }

    /* A record by hand: rank 0's directory never made, rank 1's made with a file in it, and rank
     * 2's name withdrawn (another run's directory had it): only rank 1's is removed, and the
     * other run's stays. */
    if (check_at(__FILE__, __LINE__, zt_rank_record_init(&rec) == ZT_OK, "%s",
                 zt_last_error())) {
        char gone[128], made[128], file[160], other[128];
        snprintf(gone, sizeof gone, "%s/ztrain-rec-rank0-Gone00", nvme);
        snprintf(made, sizeof made, "%s/ztrain-rec-rank1-Made00", nvme);
        snprintf(other, sizeof other, "%s/ztrain-rec-rank2-Other0", nvme);
        mkdir(made, 0700);
        mkdir(other, 0700);
        snprintf(file, sizeof file, "%s/exp_avg.bin", made);
        FILE *f = fopen(file, "w");
        if (f)
            fclose(f);
        f = fopen(rec.path, "a");
        if (f) {
            fprintf(f, "0 %s\n1 %s\n2 %s\n2 -%s\n", gone, made, other, other);
            fclose(f);
        }
        cleaned c = {0};
        int n = zt_rank_record_clean(&rec, on_removed, on_failed, &c);
        snprintf(want, sizeof want, "removed 1 %s; ", made);
        CHECK(n == 1 && strcmp(c.said, want) == 0, "only rank 1's directory is removed, without a "
              "word on rank 0's: %d, '%s'", n, c.said);
        CHECK(!is_dir(made) && is_dir(other), "rank 1's directory is gone, the other run's kept");
        rmdir(other);
        zt_rank_record_free(&rec);
    }
    rmdir(nvme);
    CHECK(rmdir(root) == 0, "%s is left empty: %s", root, strerror(errno));
    unsetenv("TMPDIR");
}

int main(void) {
    snprintf(pid_var, sizeof pid_var, "ZTRAIN_LAUNCHER_PID=%ld", (long)getpid());
    inherit_policy();
    whitelist_policy();
    slurm_identity();
    threads_and_wait();
    cuda_devices();
    spawn();
    failures();
    descriptions();
    offload_record();
    return check_summary("test_rank_group");
}
