/* srun's command line, the lines it prints, and scancel (slurm_launch.h). The message texts are
 * those of Slurm 22.05's srun (launch/slurm's task-exit report) and slurmstepd (the cancel
 * banner); tests/unit/test_slurm_lines.c holds real examples. */
#define _GNU_SOURCE
#include "slurm_launch.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "strfmt.h"

extern char **environ;

/* ---- command lines ----------------------------------------------------------------------- */

typedef struct {
    char **v;
    int n, cap;
    bool ok;
} argv_builder;

static void add(argv_builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(argv_builder *b, const char *fmt, ...) {
    if (!b->ok)
        return;
    if (b->n + 2 > b->cap) {
        int cap = b->cap ? 2 * b->cap : 32;
        char **v = realloc(b->v, (size_t)cap * sizeof *v);
        if (!v) {
            b->ok = false;
            return;
        }
        b->v = v;
        b->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *s = zt_vstrfmt(fmt, ap);
    va_end(ap);
    if (!s) {
        b->ok = false;
        return;
    }
    b->v[b->n++] = s;
    b->v[b->n] = NULL;
}

static char **finish(argv_builder *b) {
    if (!b->ok) {
        zt_slurm_argv_free(b->v);
        return NULL;
    }
    return b->v;
}

char **zt_slurm_srun_argv(const zt_slurm_job *job, char *const *worker_argv) {
    argv_builder b = {.ok = true};
    const zt_slurm_config *c = job->cfg;
    if (c->setpriv) {
        add(&b, "%s", c->setpriv);
        add(&b, "--pdeathsig");
        add(&b, "TERM");
        add(&b, "--");
    }
    add(&b, "%s", c->srun);
    add(&b, "--job-name=%s", job->job_name);
    add(&b, "--nodes=%d", job->nodes);
    add(&b, "--ntasks=%d", job->ntasks);
    /* Lines come back as "RANK: text", which is how a line finds its rank. */
    add(&b, "--label");
    /* A rank that stops on request exits 130, and rank 0 writes the checkpoint's DONE marker
     * after the others have exited: a cluster's KillOnBadExit or WaitTime would kill it while it
     * does. Failures are ztraind's to act on (it stops the other ranks, as the local launcher
     * does), so both are turned off whatever slurm.conf says. */
    add(&b, "--kill-on-bad-exit=0");
    add(&b, "--wait=0");
    /* The ranks talk through ztrain's own communicator, never MPI: no PMI plugin to load. */
    add(&b, "--mpi=none");
    if (job->cpus_per_task > 0)
        add(&b, "--cpus-per-task=%d", job->cpus_per_task);
    if (c->partition && c->partition[0])
        add(&b, "--partition=%s", c->partition);
    for (char *const *a = worker_argv; *a; a++)
        add(&b, "%s", *a);
    return finish(&b);
}

char **zt_slurm_scancel_argv(const zt_slurm_config *cfg, const char *job_name, const char *sig,
                             const char *state) {
    argv_builder b = {.ok = true};
    add(&b, "%s", cfg->scancel);
    if (sig)
        add(&b, "--signal=%s", sig);
    if (state)
        add(&b, "--state=%s", state);
    add(&b, "--name=%s", job_name);
    return finish(&b);
}

void zt_slurm_argv_free(char **argv) {
    for (char **a = argv; a && *a; a++)
        free(*a);
    free(argv);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int zt_slurm_run_sync(char *const *argv, double timeout_s, char *err, size_t err_size) {
    if (err && err_size)
        err[0] = '\0';
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (rc != 0) {
        close(p[0]);
        if (err)
            snprintf(err, err_size, "%s: %s", argv[0], strerror(rc));
        return -1;
    }
    char buf[1024];
    size_t len = 0;
    double deadline = now_s() + timeout_s;
    for (;;) {
        double left = deadline - now_s();
        struct pollfd pfd = {.fd = p[0], .events = POLLIN};
        if (left <= 0 || poll(&pfd, 1, (int)(left * 1e3) + 1) == 0) {
            kill(pid, SIGKILL);
            break;
        }
        ssize_t k = read(p[0], buf + len, sizeof buf - 1 - len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        len += (size_t)k;
        if (len == sizeof buf - 1)
            break;
    }
    close(p[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    buf[len] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    if (err)
        snprintf(err, err_size, "%s", buf);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* ---- srun's output ------------------------------------------------------------------------ */

bool zt_slurm_split_label(const char *line, int world_size, int *rank, const char **text) {
    const char *p = line;
    while (*p == ' ')
        p++;
    if (!isdigit((unsigned char)*p))
        return false;
    long r = 0;
    for (; isdigit((unsigned char)*p); p++) {
        r = r * 10 + (*p - '0');
        if (r >= world_size)
            return false;
    }
    if (p[0] != ':' || (p[1] != ' ' && p[1] != '\0'))
        return false;
    *rank = (int)r;
    *text = p[1] ? p + 2 : p + 1;
    return true;
}

int zt_slurm_signal_from_text(const char *text) {
    for (int sig = 1; sig < NSIG; sig++) {
        const char *name = strsignal(sig);
        if (name && strcmp(name, text) == 0)
            return sig;
    }
    return 0;
}

int zt_slurm_task_ids(const char *list, int world_size, int *ids, int cap) {
    const char *p = list;
    if (*p == '[')
        p++;
    int n = 0;
    while (*p && *p != ']') {
        char *end;
        errno = 0;
        long lo = strtol(p, &end, 10), hi = lo;
        if (end == p || errno || lo < 0)
            return -1;
        p = end;
        if (*p == '-') {
            hi = strtol(p + 1, &end, 10);
            if (end == p + 1 || errno || hi < lo)
                return -1;
            p = end;
        }
        if (hi >= world_size)
            return -1;
        for (long t = lo; t <= hi; t++) {
            if (n == cap)
                return -1;
            ids[n++] = (int)t;
        }
        if (*p == ',')
            p++;
        else if (*p && *p != ']')
            return -1;
    }
    return n > 0 ? n : -1;
}

static bool starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* "n2: task 3: Exited with exit code 1", "n1: tasks 0-1: Killed", "n1: task 0: Segmentation
 * fault (core dumped)". */
static bool parse_task_exit(const char *s, zt_srun_line *out) {
    const char *colon = strstr(s, ": task");
    size_t host_len = colon ? (size_t)(colon - s) : 0;
    if (host_len == 0 || host_len >= sizeof out->host || memchr(s, ' ', host_len))
        return false;
    const char *p = colon + strlen(": task");
    if (*p == 's')
        p++;
    if (*p != ' ')
        return false;
    p++;
    const char *end = strstr(p, ": ");
    if (!end || end == p || (size_t)(end - p) >= sizeof out->tasks)
        return false;
    zt_srun_line l = {.kind = ZT_SRUN_TASK_EXIT};
    memcpy(l.host, s, host_len);
    memcpy(l.tasks, p, (size_t)(end - p));
    const char *what = end + 2;
    int code;
    char word[128];
    if (sscanf(what, "Exited with exit code %d", &code) == 1) {
        l.exit_code = code;
    } else if (strcmp(what, "Completed") == 0) {
        l.exit_code = 0;
    } else {
        snprintf(word, sizeof word, "%s", what);
        char *core = strstr(word, " (core dumped)");
        if (core) {
            *core = '\0';
            l.core_dumped = true;
        }
        l.signal = zt_slurm_signal_from_text(word);
        if (!l.signal)
            return false;
    }
    *out = l;
    return true;
}

/* slurmstepd's "*** STEP 12.0 ON n1 CANCELLED AT 2026-11-23T16:58:40 DUE TO TIME LIMIT ***" (or
 * "*** JOB 12 ON n1 ..."), anywhere in s. */
static bool parse_cancel_banner(const char *s, zt_srun_line *out) {
    const char *b = strstr(s, "*** ");
    if (!b || !strstr(b, " CANCELLED AT "))
        return false;
    zt_srun_line l = {.kind = ZT_SRUN_CANCELLED};
    const char *p = b + 4;
    if (starts_with(p, "STEP "))
        p += 5;
    else if (starts_with(p, "JOB "))
        p += 4;
    else
        return false;
    l.job_id = strtoll(p, NULL, 10);
    const char *on = strstr(p, " ON ");
    if (on) {
        on += 4;
        size_t n = strcspn(on, " ");
        if (n < sizeof l.host)
            memcpy(l.host, on, n);
    }
    const char *due = strcasestr(b, " DUE TO ");
    if (due) {
        due += 8;
        size_t n = strcspn(due, ",*");
        while (n > 0 && due[n - 1] == ' ')
            n--;
        if (n >= sizeof l.due)
            n = sizeof l.due - 1;
        memcpy(l.due, due, n);
        for (size_t i = 0; i < n; i++)
            l.due[i] = (char)toupper((unsigned char)l.due[i]);
    }
    *out = l;
    return true;
}

void zt_slurm_parse_srun(const char *line, zt_srun_line *out) {
    memset(out, 0, sizeof *out);
    if (!starts_with(line, "srun: "))
        return;
    const char *s = line + 6;
    bool error = starts_with(s, "error: ");
    if (error)
        s += 7;
    long long id;
    int n = 0;
    if (parse_task_exit(s, out) || parse_cancel_banner(s, out))
        return;
    if (sscanf(s, "job %lld queued and waiting for resources%n", &id, &n) == 1 && n > 0) {
        out->kind = ZT_SRUN_QUEUED;
        out->job_id = id;
    } else if (sscanf(s, "job %lld has been allocated resources%n", &id, &n) == 1 && n > 0) {
        out->kind = ZT_SRUN_ALLOCATED;
        out->job_id = id;
    } else if (starts_with(s, "Node failure on ")) {
        out->kind = ZT_SRUN_NODE_FAIL;
        snprintf(out->host, sizeof out->host, "%s", s + strlen("Node failure on "));
    } else if (error) {
        out->kind = ZT_SRUN_ERROR;
    }
}

void zt_slurm_parse_task(const char *text, zt_srun_line *out) {
    memset(out, 0, sizeof *out);
    int rank, world, n = 0;
    long pid;
    char host[128];
    if (sscanf(text, "ztrain-worker: rank %d of %d on %127[^,], pid %ld%n", &rank, &world, host,
               &pid, &n) == 4 && n > 0 && text[n] == '\0') {
        out->kind = ZT_SRUN_PLACED;
        out->rank = rank;
        out->pid = pid;
        snprintf(out->host, sizeof out->host, "%s", host);
        return;
    }
    /* The banner is slurmstepd's, written into task 0's stderr: "slurmstepd-n1: error: ***". */
    if (starts_with(text, "slurmstepd"))
        parse_cancel_banner(text, out);
}
