/* Communicators over a subset of ranks (zt_comm_create_group): four forked ranks on "shm" form
 * DeepSpeed's 2 × 2 pipeline grid, and every collective of the data-parallel groups {0,1}, {2,3}
 * and of the stage groups {0,2}, {1,3} is checked bit for bit against the rule of comm.h
 * re-derived here (contributions added in member order; bf16 widened, summed in fp32 and rounded
 * once to nearest even), for sizes across the group's chunking, one group after the other and
 * then both at once from two threads (zt_comm_pairs_concurrent: tensor parallelism's group beside
 * ZeRO's communication thread). Bad member lists are refused, and a member that exits makes the
 * others' group calls fail naming its rank. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ztrain/comm.h"

enum { WORLD = 4, N = 40000 };

static float value(int rank, size_t i, unsigned salt) {
    uint32_t x = (uint32_t)(rank * 2654435761u) ^ (uint32_t)(i * 40503u) ^ (salt * 97u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return ((float)(x % 20001) - 10000.0f) / 997.0f;
}

static uint16_t bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The fp32 result of op over members' value(·, i, salt), in member order. */
static float want_f32(const int *members, int n, size_t i, unsigned salt, zt_reduce_op op) {
    float acc = value(members[0], i, salt);
    for (int k = 1; k < n; k++) {
        float v = value(members[k], i, salt);
        acc = op == ZT_REDUCE_MAX ? (v > acc ? v : acc) : acc + v;
    }
    return op == ZT_REDUCE_AVG ? acc / (float)n : acc;
}

static void check_group(zt_comm *g, const int *members, int n, int me) {
    float *buf = malloc(N * sizeof(float));
    uint16_t *h = malloc(N * sizeof(uint16_t));
    static const size_t sizes[] = {1, 7, 16384, N};
    static const zt_reduce_op ops[] = {ZT_REDUCE_SUM, ZT_REDUCE_AVG, ZT_REDUCE_MAX};
    for (unsigned s = 0; s < 4; s++) {
        size_t len = sizes[s];
        for (unsigned o = 0; o < 3; o++) {
            unsigned salt = s * 8 + o;
            for (size_t i = 0; i < len; i++)
                buf[i] = value(members[me], i, salt);
            CHECK(zt_comm_all_reduce(g, buf, len, ZT_F32, ops[o]) == ZT_OK, "%s", zt_last_error());
            size_t bad = 0;
            for (size_t i = 0; i < len; i++) {
                float w = want_f32(members, n, i, salt, ops[o]);
                bad += memcmp(&w, &buf[i], 4) != 0;
            }
            CHECK(bad == 0, "fp32 all_reduce n=%zu op %d: %zu elements differ", len, (int)ops[o],
                  bad);
        }
        /* bf16: the fp32 sum of the exactly widened inputs, rounded once. */
        for (size_t i = 0; i < len; i++)
            h[i] = bf16_round(value(members[me], i, 99));
        CHECK(zt_comm_all_reduce(g, h, len, ZT_BF16, ZT_REDUCE_SUM) == ZT_OK, "%s",
              zt_last_error());
        size_t bad = 0;
        for (size_t i = 0; i < len; i++) {
            float acc = 0.0f;
            for (int k = 0; k < n; k++)
                acc += bf16_widen(bf16_round(value(members[k], i, 99)));
            bad += h[i] != bf16_round(acc);
        }
        CHECK(bad == 0, "bf16 all_reduce n=%zu: %zu elements differ", len, bad);
    }
    /* Reduce-scatter into uneven pieces, then all-gather them back: every member ends with the
     * whole sum. */
    size_t off[2] = {0, 30001}, cnt[2] = {30001, N - 30001};
    for (size_t i = 0; i < N; i++)
        buf[i] = value(members[me], i, 7);
    CHECK(zt_comm_reduce_scatter(g, buf, buf + off[me], N, off, cnt, ZT_F32, ZT_REDUCE_SUM) ==
          ZT_OK, "%s", zt_last_error());
    CHECK(zt_comm_all_gather(g, buf, N, off, cnt, ZT_F32) == ZT_OK, "%s", zt_last_error());
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) {
        float w = want_f32(members, n, i, 7, ZT_REDUCE_SUM);
        bad += memcmp(&w, &buf[i], 4) != 0;
    }
    CHECK(bad == 0, "reduce_scatter + all_gather: %zu elements differ", bad);
    double b = me == 1 ? 42.5 : 0.0;
    CHECK(zt_comm_broadcast(g, &b, 1, ZT_F64, 1) == ZT_OK && b == 42.5, "broadcast: %g", b);
    CHECK(zt_comm_barrier(g) == ZT_OK, "%s", zt_last_error());
    free(buf);
    free(h);
}

/* All-reduce and reduce-scatter over four members. */
static void check_group4(zt_comm *g, const int *members, int me) {
    float *buf = malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++)
        buf[i] = value(members[me], i, 11);
    CHECK(zt_comm_all_reduce(g, buf, N, ZT_F32, ZT_REDUCE_SUM) == ZT_OK, "%s", zt_last_error());
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) {
        float w = want_f32(members, WORLD, i, 11, ZT_REDUCE_SUM);
        bad += memcmp(&w, &buf[i], 4) != 0;
    }
    CHECK(bad == 0, "four members' all_reduce: %zu elements differ", bad);
    size_t off[WORLD] = {0, 10000, 20000, 30000}, cnt[WORLD] = {10000, 10000, 10000, 10000};
    for (size_t i = 0; i < N; i++)
        buf[i] = value(members[me], i, 12);
    CHECK(zt_comm_reduce_scatter(g, buf, buf + off[me], N, off, cnt, ZT_F32, ZT_REDUCE_AVG) ==
          ZT_OK, "%s", zt_last_error());
    bad = 0;
    for (size_t i = off[me]; i < off[me] + cnt[me]; i++) {
        float w = want_f32(members, WORLD, i, 12, ZT_REDUCE_AVG);
        bad += memcmp(&w, &buf[i], 4) != 0;
    }
    CHECK(bad == 0, "four members' reduce_scatter: %zu elements differ", bad);
    free(buf);
}

/* One rank of the grid; returns its failed checks. */
/* One group's checks on a thread of their own. */
typedef struct {
    zt_comm *g;
    const int *members;
    int me;
} group_job;

static void *check_group_thread(void *arg) {
    group_job *j = arg;
    check_group(j->g, j->members, 2, j->me);
    return NULL;
}

static int run_rank(int rank, const char *run_id, bool exit_early) {
    zt_dist_info d = {.rank = rank, .world_size = WORLD, .local_rank = rank,
                      .local_world_size = WORLD, .master_port = 29500};
    snprintf(d.run_id, sizeof d.run_id, "%s", run_id);
    zt_comm *world;
    if (zt_comm_create(&world, "shm", &d, 20.0) != ZT_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, zt_last_error());
        return 1;
    }
    int dp = 2, stage = rank / dp, replica = rank % dp;
    int dp_members[2] = {stage * dp, stage * dp + 1};
    int stage_members[2] = {replica, dp + replica};
    zt_comm *dpg, *stg;
    CHECK(zt_comm_create_group(&dpg, world, dp_members, 2) == ZT_OK, "%s", zt_last_error());
    CHECK(zt_comm_create_group(&stg, world, stage_members, 2) == ZT_OK, "%s", zt_last_error());
    if (exit_early) {
        /* Rank 3 leaves; rank 2 (its data-parallel partner) must be told, naming it. */
        if (rank == 3)
            _exit(0);
        if (rank == 2) {
            float x = 1.0f;
            zt_status s = zt_comm_all_reduce(dpg, &x, 1, ZT_F32, ZT_REDUCE_SUM);
            CHECK(s == ZT_ERR_IO && strstr(zt_last_error(), "rank 3"), "got %s: %s",
                  zt_status_name(s), zt_last_error());
        }
        zt_comm_destroy(stg);
        zt_comm_destroy(dpg);
        zt_comm_destroy(world);
        return (int)check_failures;
    }
    check_group(dpg, dp_members, 2, replica);
    check_group(stg, stage_members, 2, stage);
    /* The two groups share no pair of ranks, so on "shm" two threads may drive them at once. */
    CHECK(zt_comm_pairs_concurrent(dpg) && zt_comm_pairs_concurrent(world),
          "shm groups may be used from two threads at once");
    pthread_t th;
    group_job other = {stg, stage_members, stage};
    CHECK(pthread_create(&th, NULL, check_group_thread, &other) == 0, "pthread_create");
    check_group(dpg, dp_members, 2, replica);
    pthread_join(th, NULL);
    /* Four members listed out of rank order: sums of four follow the members' order, which
     * two members could not show (a + b == b + a). */
    int shuffled[WORLD] = {3, 1, 0, 2}, me = 0;
    while (shuffled[me] != rank)
        me++;
    zt_comm *all;
    CHECK(zt_comm_create_group(&all, world, shuffled, WORLD) == ZT_OK, "%s", zt_last_error());
    check_group4(all, shuffled, me);
    zt_comm_destroy(all);
    /* The world's own collectives still match after the groups' traffic. */
    double one = 1.0;
    CHECK(zt_comm_all_reduce(world, &one, 1, ZT_F64, ZT_REDUCE_SUM) == ZT_OK && one == WORLD,
          "world all_reduce after the groups: %g", one);
    zt_comm *bad;
    int twice[2] = {rank, rank}, outside[1] = {(rank + 1) % WORLD}, big[1] = {WORLD};
    CHECK(zt_comm_create_group(&bad, world, twice, 2) == ZT_ERR_INVALID && !bad &&
          strstr(zt_last_error(), "twice"), "%s", zt_last_error());
    CHECK(zt_comm_create_group(&bad, world, outside, 1) == ZT_ERR_INVALID &&
          strstr(zt_last_error(), "not among"), "%s", zt_last_error());
    CHECK(zt_comm_create_group(&bad, world, big, 1) == ZT_ERR_INVALID &&
          strstr(zt_last_error(), "not a rank"), "%s", zt_last_error());
    zt_comm_destroy(stg);
    zt_comm_destroy(dpg);
    zt_comm_destroy(world);
    return (int)check_failures;
}

static int run_world(const char *run_id, bool exit_early) {
    pid_t pids[WORLD];
    for (int r = 0; r < WORLD; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(run_rank(r, run_id, exit_early) ? 1 : 0);
    }
    int failed = 0;
    for (int r = 0; r < WORLD; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "FAIL: rank %d of %s ended with status %d\n", r, run_id, st);
            failed++;
        }
    }
    return failed;
}

int main(void) {
    alarm(100);
    char id[64];
    snprintf(id, sizeof id, "grp%d", (int)getpid());
    int failed = run_world(id, false);
    snprintf(id, sizeof id, "grpx%d", (int)getpid());
    failed += run_world(id, true);
    printf("test_comm_group: %s\n", failed ? "FAILED" : "ok");
    return failed ? 1 : 0;
}
