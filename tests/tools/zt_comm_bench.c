/* Times the communicator's all-reduce and reduce-scatter for bench/bench_comm.py: one rank per
 * process, its place from the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).
 *
 *   zt_comm_bench TRANSPORT BYTES... [--iters N]
 *
 * For each size (bytes of fp32) it runs 5 warm-up rounds, then N timed ones of each
 * collective (more for small sizes: up to 64 MiB moved, at most 200), and rank 0 prints one line per size and collective:
 *   all_reduce 65536 0.000123   (bytes, seconds per call: the slowest rank's mean)
 * Exit status 0, or 1 with the communicator's message on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ztrain/comm.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int fail(int rank) {
    fprintf(stderr, "zt_comm_bench: rank %d: %s\n", rank, zt_last_error());
    return 1;
}

int main(int argc, char **argv) {
    int iters = 10;
    if (argc < 3) {
        fprintf(stderr, "usage: zt_comm_bench TRANSPORT BYTES... [--iters N]\n");
        return 2;
    }
    zt_dist_info d;
    if (zt_dist_from_env(&d) != ZT_OK)
        return fail(-1);
    zt_comm *c;
    if (zt_comm_create(&c, argv[1], &d, 120) != ZT_OK)
        return fail(d.rank);
    for (int a = 2; a < argc; a++) {
        if (strcmp(argv[a], "--iters") == 0 && a + 1 < argc) {
            iters = atoi(argv[++a]);
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
        for (int which = 0; which < 2; which++) {
            double t0 = 0;
            for (int i = -5; i < rounds; i++) {
                if (i == 0) {
                    if (zt_comm_barrier(c) != ZT_OK)
                        return fail(d.rank);
                    t0 = now_s();
                }
                zt_status s = which == 0
                                  ? zt_comm_all_reduce(c, buf, n, ZT_F32, ZT_REDUCE_SUM)
                                  : zt_comm_reduce_scatter(c, buf, out, n, offs, cnts, ZT_F32,
                                                           ZT_REDUCE_SUM);
                if (s != ZT_OK)
                    return fail(d.rank);
            }
            /* The slowest rank's time is the collective's. */
            double t = (now_s() - t0) / rounds;
            if (zt_comm_all_reduce(c, &t, 1, ZT_F64, ZT_REDUCE_MAX) != ZT_OK)
                return fail(d.rank);
            if (d.rank == 0)
                printf("%s %zu %.6g\n", which == 0 ? "all_reduce" : "reduce_scatter", n * 4, t);
        }
        fflush(stdout);
        free(buf);
        free(out);
        free(offs);
        free(cnts);
    }
    zt_comm_destroy(c);
    return 0;
}
