/* Times the communicator's all-reduce and reduce-scatter for bench/bench_comm.py: one rank per
 * process, its place from the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).
 *
 *   zt_comm_bench TRANSPORT BYTES... [--iters N] [--detail]
 *
 * For each size (bytes of fp32) it runs 5 warm-up rounds, then N timed ones of each
 * collective (more for small sizes: up to 64 MiB moved, at most 200), and rank 0 prints one line per size and collective:
 *   all_reduce 65536 0.000123 0.000071
 * (bytes, then seconds per call: the slowest rank's mean and the slowest rank's median; on a
 * shared machine the mean carries the scheduler's tail, the median what a call costs). With
 * --detail every rank also writes to stderr its own figures and the CPU time (all threads) and
 * voluntary context switches per call, which a loaded machine disturbs less than wall time.
 * Exit status 0, or 1 with the communicator's message on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "ztrain/comm.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU seconds of every thread of this process, and its voluntary context switches. */
static void usage_now(double *cpu, long *nvcsw) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *cpu = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    *nvcsw = ru.ru_nvcsw;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int fail(int rank) {
    fprintf(stderr, "zt_comm_bench: rank %d: %s\n", rank, zt_last_error());
    return 1;
}

int main(int argc, char **argv) {
    int iters = 10, detail = 0;
    if (argc < 3) {
        fprintf(stderr, "usage: zt_comm_bench TRANSPORT BYTES... [--iters N] [--detail]\n");
        return 2;
    }
    zt_dist_info d;
    if (zt_dist_from_env(&d) != ZT_OK)
        return fail(-1);
    zt_comm *c;
    if (zt_comm_create(&c, argv[1], &d, 120) != ZT_OK)
        return fail(d.rank);
    /* Options first, wherever they stand, so that they apply to every size. */
    for (int a = 2; a < argc; a++) {
        if (strcmp(argv[a], "--detail") == 0)
            detail = 1;
        else if (strcmp(argv[a], "--iters") == 0 && a + 1 < argc)
            iters = atoi(argv[++a]);
    }
    for (int a = 2; a < argc; a++) {
        if (strcmp(argv[a], "--detail") == 0)
            continue;
        if (strcmp(argv[a], "--iters") == 0 && a + 1 < argc) {
            a++;
            continue;
        }
        size_t n = strtoull(argv[a], NULL, 10) / 4;
        float *buf = calloc(n ? n : 1, 4), *out = calloc(n / (size_t)d.world_size + 1, 4);
        size_t *offs = malloc((size_t)d.world_size * sizeof *offs);
        size_t *cnts = malloc((size_t)d.world_size * sizeof *cnts);
        for (int k = 0; k < d.world_size; k++) {
            offs[k] = n * (size_t)k / (size_t)d.world_size;
            cnts[k] = n * ((size_t)k + 1) / (size_t)d.world_size - offs[k];
        }
        /* Small messages get more rounds (up to 64 MiB moved, at most 200), so that the
         * connections' first-use costs wash out of their mean. */
        size_t want = ((size_t)64 << 20) / (n ? n * 4 : 1);
        if (want > 200)
            want = 200;
        int rounds = (int)want > iters ? (int)want : iters;
        double *each = malloc((size_t)rounds * sizeof *each);
        if (!each)
            return fail(d.rank);
        for (int which = 0; which < 2; which++) {
            double t0 = 0, cpu0 = 0, cpu1;
            long csw0 = 0, csw1;
            for (int i = -5; i < rounds; i++) {
                if (i == 0) {
                    if (zt_comm_barrier(c) != ZT_OK)
                        return fail(d.rank);
                    usage_now(&cpu0, &csw0);
                    t0 = now_s();
                }
                double a = now_s();
                zt_status s = which == 0
                                  ? zt_comm_all_reduce(c, buf, n, ZT_F32, ZT_REDUCE_SUM)
                                  : zt_comm_reduce_scatter(c, buf, out, n, offs, cnts, ZT_F32,
                                                           ZT_REDUCE_SUM);
                if (s != ZT_OK)
                    return fail(d.rank);
                if (i >= 0)
                    each[i] = now_s() - a;
            }
            /* The slowest rank's time is the collective's. */
            double t[2] = {(now_s() - t0) / rounds, 0};
            usage_now(&cpu1, &csw1);
            qsort(each, (size_t)rounds, sizeof *each, cmp_double);
            t[1] = each[rounds / 2];
            const char *name = which == 0 ? "all_reduce" : "reduce_scatter";
            if (detail)
                fprintf(stderr,
                        "rank %d %s %zu: mean %.3f ms, median %.3f ms, CPU %.3f ms and %.1f "
                        "voluntary context switches per call\n",
                        d.rank, name, n * 4, t[0] * 1e3, t[1] * 1e3,
                        (cpu1 - cpu0) / rounds * 1e3, (double)(csw1 - csw0) / rounds);
            if (zt_comm_all_reduce(c, t, 2, ZT_F64, ZT_REDUCE_MAX) != ZT_OK)
                return fail(d.rank);
            if (d.rank == 0)
                printf("%s %zu %.6g %.6g\n", name, n * 4, t[0], t[1]);
        }
        free(each);
        fflush(stdout);
        free(buf);
        free(out);
        free(offs);
        free(cnts);
    }
    zt_comm_destroy(c);
    return 0;
}
