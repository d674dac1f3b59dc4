/* SIGINT and SIGTERM as stop requests (engine/train/stop_signals.c), each case in a child process:
 *
 *   a. after zt_stop_signals_start every thread but the signals' own blocks both signals, also
 *      threads started afterwards (the ones that run kernels);
 *   b. the policy: the first SIGTERM sets the flag and the process lives on; a SIGTERM right after
 *      it is the same request again; a SIGINT then kills the process with SIGINT; a second
 *      SIGTERM a second or more later kills it with SIGTERM;
 *   c. the reason for the thread: a process that multiplies matrices on the CPU backend (oneDNN's
 *      generated kernels where the build has oneDNN) gets SIGTERM in the middle of its products,
 *      keeps multiplying and allocating, and exits normally. oneDNN 2.x's f32 kernels point the
 *      stack pointer into the heap, so a handler run on that thread writes its signal frame over
 *      heap memory and glibc aborts at a later free(); before this module, about every second
 *      rank of a two-rank job stopped by ztraind died that way. Ten children are signalled, each
 *      at a different moment. */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "gemm.h"
#include "ztrain/stop_signals.h"

static volatile sig_atomic_t flag;
static atomic_bool spin = true;

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static void *spinner(void *arg) {
    (void)arg;
    while (atomic_load(&spin))
        sleep_s(0.001);
    return NULL;
}

/* Threads of this process, other than the signals' own, whose SigBlk lacks SIGINT or SIGTERM
 * (bits 1 and 14). The signals' thread is not counted: inside sigwaitinfo the kernel lifts the
 * block on the signals it waits for. */
static int threads_taking_signals(int *threads) {
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int taking = 0;
    *threads = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], line[256], name[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f) {
            if (fgets(name, sizeof name, f))
                name[strcspn(name, "\n")] = 0;
            fclose(f);
        }
        if (strcmp(name, ZT_STOP_SIGNALS_THREAD) == 0) {
            (*threads)++;
            continue;
        }
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        while (fgets(line, sizeof line, f)) {
            unsigned long long blk;
            if (sscanf(line, "SigBlk: %llx", &blk) == 1) {
                (*threads)++;
                if (!(blk >> (SIGINT - 1) & 1) || !(blk >> (SIGTERM - 1) & 1))
                    taking++;
            }
        }
        fclose(f);
    }
    closedir(d);
    return taking;
}

/* a: exit status 0 when the process has its four threads (main, two started after the call, the
 * signals' own; a sanitizer may add its own) and none but the signals' own takes the signals. */
static int child_masks(void) {
    if (zt_stop_signals_start(&flag) != ZT_OK) {
        fprintf(stderr, "zt_stop_signals_start: %s\n", zt_last_error());
        return 2;
    }
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, spinner, NULL);
    int threads, taking = threads_taking_signals(&threads);
    atomic_store(&spin, false);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    fprintf(stderr, "  a: %d threads, %d of them take SIGINT or SIGTERM\n", threads, taking);
    return threads >= 4 && taking == 0 ? 0 : 1;
}

/* b: tells the parent through `ready` when the flag is set, then waits to be killed. */
static int child_policy(int ready) {
    if (zt_stop_signals_start(&flag) != ZT_OK) {
        fprintf(stderr, "zt_stop_signals_start: %s\n", zt_last_error());
        return 2;
    }
    if (write(ready, "r", 1) != 1)
        return 3;
    while (!flag)
        sleep_s(0.001);
    if (write(ready, "s", 1) != 1)
        return 3;
    sleep_s(30);
    return 4;
}

/* c: products of the demo model's shapes with allocations in between, 0.3 s before the signal is
 * expected and 0.3 s after; exit status 0 when the flag was set and nothing broke. */
static int child_products(int ready) {
    if (zt_stop_signals_start(&flag) != ZT_OK) {
        fprintf(stderr, "zt_stop_signals_start: %s\n", zt_last_error());
        return 2;
    }
    const int M = 1024, N = 384, K = 128;
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * N * K),
          *c = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; i++)
        a[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < N * K; i++)
        b[i] = (float)(i % 5) * 0.1f;
    if (write(ready, "r", 1) != 1)
        return 3;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double stop_at = -1.0;
    for (int it = 0;; it++) {
        void *junk = malloc(1000 + (size_t)(it % 5000));
        zt_cpu_sgemm(false, true, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
        zt_cpu_sgemm(false, false, M, K, N, 1.0f, c, N, b, K, 0.0f, a, K);
        free(junk);
        clock_gettime(CLOCK_MONOTONIC, &t);
        double s = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9;
        if (flag && stop_at < 0)
            stop_at = s;
        if ((stop_at >= 0 && s > stop_at + 0.3) || s > 20.0)
            break;
    }
    free(a), free(b), free(c);
    return flag ? 0 : 5;
}

static pid_t fork_child(int (*fn)(int), int *rd) {
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        _exit(fn(p[1]));
    }
    close(p[1]);
    *rd = p[0];
    return pid;
}

static char await(int rd) {
    char ch = 0;
    return read(rd, &ch, 1) == 1 ? ch : 0;
}

static bool alive_after(pid_t pid, double s) {
    sleep_s(s);
    return waitpid(pid, NULL, WNOHANG) == 0;
}

static void check_killed_by(pid_t pid, int sig, const char *what) {
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == sig, "%s: status %#x, want killed by signal %d",
          what, st, sig);
}

static int child_masks_fn(int fd) {
    (void)fd;
    return child_masks();
}

int main(void) {
    /* a */
    int rd, st = 0;
    pid_t pid = fork_child(child_masks_fn, &rd);
    waitpid(pid, &st, 0);
    close(rd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "a: every thread but the signals' own blocks SIGINT and SIGTERM (status %#x)", st);

    /* b: SIGTERM, SIGTERM at once (the same request), SIGINT */
    pid = fork_child(child_policy, &rd);
    CHECK(await(rd) == 'r');
    kill(pid, SIGTERM);
    CHECK(await(rd) == 's', "b: the first SIGTERM sets the flag");
    kill(pid, SIGTERM);
    CHECK(alive_after(pid, 0.3), "b: a second SIGTERM right after the first is ignored");
    kill(pid, SIGINT);
    check_killed_by(pid, SIGINT, "b: a SIGINT after the stop request ends the process");
    close(rd);

    /* b: SIGINT, then SIGTERM more than ZT_STOP_REPEATED_TERM_S later */
    pid = fork_child(child_policy, &rd);
    CHECK(await(rd) == 'r');
    kill(pid, SIGINT);
    CHECK(await(rd) == 's', "b: the first SIGINT sets the flag");
    CHECK(alive_after(pid, ZT_STOP_REPEATED_TERM_S + 0.2), "b: the process lives on");
    kill(pid, SIGTERM);
    check_killed_by(pid, SIGTERM, "b: a SIGTERM a second after the first ends the process");
    close(rd);

    /* c */
    fprintf(stderr, "  c: products in %s\n", zt_cpu_gemm_lib_name(zt_cpu_gemm_lib()));
    int clean = 0;
    for (int i = 0; i < 10; i++) {
        pid = fork_child(child_products, &rd);
        if (await(rd) != 'r') {
            CHECK(false, "c: child %d did not start", i);
            break;
        }
        sleep_s(0.05 + 0.023 * i);
        kill(pid, SIGTERM);
        waitpid(pid, &st, 0);
        close(rd);
        if (check_at(__FILE__, __LINE__, WIFEXITED(st) && WEXITSTATUS(st) == 0,
                     "c: child %d, signalled in its products, status %#x (signal %d)", i, st,
                     WIFSIGNALED(st) ? WTERMSIG(st) : 0))
            clean++;
    }
    fprintf(stderr, "  c: %d of 10 children stopped cleanly\n", clean);
    return check_summary("test_stop_signals");
}
