/* Tests for the Gloo transport (engine/comm/comm_gloo*.cc) on this host's loopback: every collective
 * and point-to-point message in every dtype against rank-order sums computed here (fp32, fp64)
 * and bit for bit against the shm transport on the same inputs (all dtypes, 16-bit reductions
 * included), pieces of uneven sizes, a buffer past the transport's chunking; then the failures:
 * a rank that dies, a rendezvous missing a rank, ranks of different world sizes, a port in use,
 * a MASTER_ADDR that does not resolve (asked again until the timeout); GLOO_SOCKET_IFNAME as
 * a comma-separated list; and two threads of one rank sending and receiving on the
 * same communicator at once, each with another peer (as a tensor-parallel group's and ZeRO's
 * communication thread's messages share the job's communicator), every message checked. Each
 * scenario forks its ranks; the parent reaps them. */
#define _GNU_SOURCE /* before any header */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ports.h"
#include "ztrain/comm.h"

#ifndef ZT_HAVE_GLOO
int main(void) {
    printf("test_comm_gloo: this build has no gloo transport (libgloo-dev absent); skipped\n");
    return 0;
}
#else

static int failures;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL [pid %d]: %s\n", (int)getpid(), msg);
    failures++;
}

#define CHECK(cond, ...)         \
    do {                         \
        if (!(cond))             \
            fail(__VA_ARGS__);   \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static zt_dist_info info(int rank, int world, int port, const char *id) {
    zt_dist_info d;
    memset(&d, 0, sizeof d);
    d.rank = rank;
    d.world_size = world;
    d.local_world_size = world;
    d.local_rank = rank;
    snprintf(d.master_addr, sizeof d.master_addr, "127.0.0.1");
    d.master_port = port;
    snprintf(d.run_id, sizeof d.run_id, "%s-%d", id, (int)getppid());
    return d;
}

/* Rank r's element i, exact in every dtype's range and varied enough to make the order of the
 * additions matter in fp32. Not inlined: GCC would otherwise fuse its last multiplication with the
 * formula's addition into one FMA (-ffp-contract=fast is its default), and the reference would
 * add an unrounded product where the ranks add the stored value. */
__attribute__((noinline)) static double value(int r, size_t i) {
    return ((double)((i * 2654435761u + (size_t)r * 40503u) % 2001) - 1000.0) / 64.0 *
           (1.0 + (double)r / 3.0);
}

static void fill(void *buf, zt_dtype t, size_t n, int r) {
    for (size_t i = 0; i < n; i++) {
        double v = value(r, i);
        switch (t) {
        case ZT_F32: ((float *)buf)[i] = (float)v; break;
        case ZT_F64: ((double *)buf)[i] = v; break;
        default: {
            /* 16-bit values: the top bits of an fp32 (bf16) or a value on fp16's grid. */
            float f = (float)v;
            uint32_t bits;
            memcpy(&bits, &f, 4);
            ((uint16_t *)buf)[i] = t == ZT_BF16 ? (uint16_t)(bits >> 16)
                                                : (uint16_t)(0x3c00 + (i * 7 + (size_t)r) % 0x2000);
        }
        }
    }
}

/* The rank-order reference for fp32 and fp64 reductions, computed here. */
static bool matches_formula(const void *got, zt_dtype t, size_t lo, size_t cnt, int world,
                            zt_reduce_op op) {
    for (size_t j = 0; j < cnt; j++) {
        size_t i = lo + j;
        if (t == ZT_F32) {
            float acc = (float)value(0, i);
            for (int r = 1; r < world; r++)
                acc = op == ZT_REDUCE_MAX ? fmaxf(acc, (float)value(r, i)) : acc + (float)value(r, i);
            if (op == ZT_REDUCE_AVG)
                acc /= (float)world;
            if (memcmp(&acc, (const float *)got + j, 4) != 0)
                return false;
        } else {
            double acc = value(0, i);
            for (int r = 1; r < world; r++)
                acc = op == ZT_REDUCE_MAX ? fmax(acc, value(r, i)) : acc + value(r, i);
            if (op == ZT_REDUCE_AVG)
                acc /= world;
            if (memcmp(&acc, (const double *)got + j, 8) != 0)
                return false;
        }
    }
    return true;
}

/* Forks world ranks running body(rank) and returns how many exited non-zero; each child's exit
 * status is its failure count (capped). */
static int run_ranks(int world, void (*body)(int rank, int world, int port), int port) {
    pid_t pids[16];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            failures = 0;
            body(r, world, port);
            _exit(failures > 100 ? 100 : failures);
        }
    }
    int bad = 0;
    for (int r = 0; r < world; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            bad++;
            if (WIFSIGNALED(st))
                fprintf(stderr, "rank %d (pid %d) was killed by signal %d\n", r, (int)pids[r],
                        WTERMSIG(st));
        }
    }
    return bad;
}

static void collectives(int rank, int world, int port) {
    zt_dist_info d = info(rank, world, port, "gloo-coll");
    zt_comm *g = NULL, *s = NULL;
    if (zt_comm_create(&g, "gloo", &d, 20) != ZT_OK) {
        fail("rank %d: gloo create: %s", rank, zt_last_error());
        return;
    }
    if (zt_comm_create(&s, "shm", &d, 20) != ZT_OK) {
        fail("rank %d: shm create: %s", rank, zt_last_error());
        zt_comm_destroy(g);
        return;
    }
    CHECK(strcmp(zt_comm_transport(g), "gloo") == 0, "transport name");
    /* 5M + 3 elements passes the 16 MiB chunk of an fp32 all-reduce; 1001 is uneven over 3;
     * 300001 (1.2 MB in fp32) is reduced in one step on 2 ranks and in two on 3. */
    const size_t sizes[] = {1, 1001, 300001, ((size_t)5 << 20) + 3};
    const zt_dtype types[] = {ZT_F32, ZT_F64, ZT_BF16, ZT_F16};
    const zt_reduce_op ops[] = {ZT_REDUCE_SUM, ZT_REDUCE_AVG, ZT_REDUCE_MAX};
    for (int si = 0; si < 4; si++) {
        for (int ti = 0; ti < 4; ti++) {
            zt_dtype t = types[ti];
            size_t n = sizes[si], es = zt_dtype_size(t);
            if (si == 3 && t != ZT_F32 && t != ZT_BF16)
                continue;
            unsigned char *a = malloc(n * es), *b = malloc(n * es);
            for (int oi = 0; oi < 3; oi++) {
                zt_reduce_op op = ops[oi];
                fill(a, t, n, rank);
                fill(b, t, n, rank);
                CHECK(zt_comm_all_reduce(g, a, n, t, op) == ZT_OK, "all_reduce: %s",
                      zt_last_error());
                CHECK(zt_comm_all_reduce(s, b, n, t, op) == ZT_OK, "shm all_reduce: %s",
                      zt_last_error());
                CHECK(memcmp(a, b, n * es) == 0, "all_reduce %s n=%zu op=%d differs from shm",
                      zt_dtype_name(t), n, (int)op);
                if (t == ZT_F32 || t == ZT_F64)
                    CHECK(matches_formula(a, t, 0, n, world, op),
                          "all_reduce %s n=%zu op=%d differs from the rank-order formula",
                          zt_dtype_name(t), n, (int)op);

                /* Uneven pieces with a gap: rank k owns [off_k, off_k + cnt_k). */
                size_t offs[3], cnts[3], pos = 1;
                for (int k = 0; k < world; k++) {
                    cnts[k] = n / 4 + (size_t)k * (n / 8);
                    offs[k] = pos;
                    pos += cnts[k];
                }
                if (pos > n)
                    continue;
                fill(a, t, n, rank);
                fill(b, t, n, rank);
                unsigned char *out = malloc(cnts[rank] * es + 1), *out2 = malloc(cnts[rank] * es + 1);
                CHECK(zt_comm_reduce_scatter(g, a, out, n, offs, cnts, t, op) == ZT_OK,
                      "reduce_scatter: %s", zt_last_error());
                CHECK(zt_comm_reduce_scatter(s, b, out2, n, offs, cnts, t, op) == ZT_OK,
                      "shm reduce_scatter: %s", zt_last_error());
                CHECK(memcmp(out, out2, cnts[rank] * es) == 0, "reduce_scatter %s differs from shm",
                      zt_dtype_name(t));
                if (t == ZT_F32 || t == ZT_F64)
                    CHECK(matches_formula(out, t, offs[rank], cnts[rank], world, op),
                          "reduce_scatter %s differs from the formula", zt_dtype_name(t));
                free(out);
                free(out2);
                if (oi)
                    continue;
                /* All-gather: each rank's piece holds its own values, the rest a marker. */
                memset(a, 0x5a, n * es);
                fill(b, t, n, rank);
                memcpy(a + offs[rank] * es, b + offs[rank] * es, cnts[rank] * es);
                CHECK(zt_comm_all_gather(g, a, n, offs, cnts, t) == ZT_OK, "all_gather: %s",
                      zt_last_error());
                for (int k = 0; k < world; k++) {
                    fill(b, t, n, k);
                    CHECK(memcmp(a + offs[k] * es, b + offs[k] * es, cnts[k] * es) == 0,
                          "all_gather %s: piece of rank %d", zt_dtype_name(t), k);
                }
                CHECK(a[0] == 0x5a, "all_gather wrote outside the pieces");
                fill(a, t, n, rank);
                CHECK(zt_comm_broadcast(g, a, n, t, 1) == ZT_OK, "broadcast: %s", zt_last_error());
                fill(b, t, n, 1);
                CHECK(memcmp(a, b, n * es) == 0, "broadcast %s from rank 1", zt_dtype_name(t));
            }
            free(a);
            free(b);
        }
    }
    CHECK(zt_comm_barrier(g) == ZT_OK, "barrier: %s", zt_last_error());

    /* A ring of messages: even ranks send first, odd ones receive first. */
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    size_t n = 300001;
    float *m = malloc(n * 4), *want = malloc(n * 4);
    fill(m, ZT_F32, n, rank);
    fill(want, ZT_F32, n, prev);
    float *got = malloc(n * 4);
    for (int round = 0; round < 2; round++) {
        bool send_first = rank % 2 == 0;
        if (send_first)
            CHECK(zt_comm_send(g, m, n, ZT_F32, next) == ZT_OK, "send: %s", zt_last_error());
        CHECK(zt_comm_recv(g, got, n, ZT_F32, prev) == ZT_OK, "recv: %s", zt_last_error());
        if (!send_first)
            CHECK(zt_comm_send(g, m, n, ZT_F32, next) == ZT_OK, "send: %s", zt_last_error());
        CHECK(memcmp(got, want, n * 4) == 0, "recv from rank %d: wrong data", prev);
    }
    /* A receiver expecting another count fails naming both. */
    if (rank == 0)
        zt_comm_send(g, m, 10, ZT_F32, 1);
    if (rank == 1) {
        CHECK(zt_comm_recv(g, got, 11, ZT_F32, 0) == ZT_ERR_INVALID &&
                  strstr(zt_last_error(), "rank 0 sent 10 elements of fp32") &&
                  strstr(zt_last_error(), "expects 11"),
              "mismatched recv: %s", zt_last_error());
    }
    free(m);
    free(want);
    free(got);
    zt_comm_destroy(g);
    zt_comm_destroy(s);
}

/* Rank 2 exits before the collective: the others fail naming it and its host, long before the
 * timeout. */
static void dead_rank(int rank, int world, int port) {
    zt_dist_info d = info(rank, world, port, "gloo-dead");
    zt_comm *g = NULL;
    if (zt_comm_create(&g, "gloo", &d, 30) != ZT_OK) {
        fail("rank %d: create: %s", rank, zt_last_error());
        return;
    }
    float v[4096] = {0};
    /* Every rank is connected (the barrier) before rank 2 goes. */
    CHECK(zt_comm_barrier(g) == ZT_OK, "rank %d: barrier: %s", rank, zt_last_error());
    if (rank == 2)
        _exit(0);
    double t0 = now_s();
    zt_status s = zt_comm_all_reduce(g, v, 4096, ZT_F32, ZT_REDUCE_SUM);
    CHECK(s == ZT_ERR_IO && strstr(zt_last_error(), "rank 2 on host") &&
              strstr(zt_last_error(), "127.0.0.1"),
          "rank %d after rank 2 died: %d %s", rank, (int)s, zt_last_error());
    CHECK(now_s() - t0 < 10, "rank %d took %.1f s to notice", rank, now_s() - t0);
    zt_comm_destroy(g);
}

static void missing_rank(int rank, int world, int port) {
    zt_dist_info d = info(rank, 3, port, "gloo-missing");
    zt_comm *g = NULL;
    double t0 = now_s();
    zt_status s = zt_comm_create(&g, "gloo", &d, 1.5);
    double took = now_s() - t0;
    CHECK(s == ZT_ERR_TIMEOUT && g == NULL && strstr(zt_last_error(), "rank(s) 2 of 3 never joined"),
          "rank %d: %d %s", rank, (int)s, zt_last_error());
    CHECK(took > 1.4 && took < 6, "rank %d timed out after %.1f s", rank, took);
}

/* Ranks that disagree on a collective (a bug in the caller): rank 0 all-reduces 10 elements,
 * rank 1 20. Neither may crash; both fail within the timeout. */
static void disagreeing(int rank, int world, int port) {
    zt_dist_info d = info(rank, world, port, "gloo-disagree");
    zt_comm *g = NULL;
    if (zt_comm_create(&g, "gloo", &d, 1.5) != ZT_OK) {
        fail("rank %d: create: %s", rank, zt_last_error());
        return;
    }
    float v[20] = {0};
    double t0 = now_s();
    zt_status s = zt_comm_all_reduce(g, v, rank == 0 ? 10 : 20, ZT_F32, ZT_REDUCE_SUM);
    CHECK(s != ZT_OK && now_s() - t0 < 8, "rank %d: %d after %.1f s: %s", rank, (int)s,
          now_s() - t0, zt_last_error());
    zt_comm_destroy(g);
}

/* Rank 1 believes the world has 3 ranks, rank 0 that it has 2. */
static void mismatched_world(int rank, int world, int port) {
    zt_dist_info d = info(rank, rank == 0 ? 2 : 3, port, "gloo-world");
    zt_comm *g = NULL;
    zt_status s = zt_comm_create(&g, "gloo", &d, 5);
    if (rank == 1)
        CHECK(s == ZT_ERR_INVALID && strstr(zt_last_error(), "rank 1 has world size 3") &&
                  strstr(zt_last_error(), "rank 0"),
              "rank 1: %d %s", (int)s, zt_last_error());
    else
        CHECK(s != ZT_OK && strstr(zt_last_error(), "world size 3"), "rank 0: %d %s", (int)s,
              zt_last_error());
}

/* Rank 0 exchanges messages with rank 1 on one thread and with rank 2 on another, at once, on
 * one communicator; ranks 1 and 2 answer. Every value is checked (a thread's message must never
 * land in the other's buffer). What the communicator keeps of completed messages was shared by
 * the two threads without a lock (a crash in malloc, once, in a tp × dp job over gloo); this
 * scenario did not reproduce that crash in 3 runs of 5,000 messages a thread, so it checks the
 * contract, not the race. */
enum { PINGS = 1000 };

typedef struct {
    zt_comm *c;
    int peer;
} pinger;

static void *ping(void *arg) {
    const pinger *p = arg;
    for (int i = 0; i < PINGS; i++) {
        float out[7], in[7];
        for (int k = 0; k < 7; k++)
            out[k] = (float)(p->peer * 100000 + i * 10 + k);
        if (zt_comm_send(p->c, out, 7, ZT_F32, p->peer) != ZT_OK ||
            zt_comm_recv(p->c, in, 7, ZT_F32, p->peer) != ZT_OK) {
            fail("rank 0, thread of peer %d, message %d: %s", p->peer, i, zt_last_error());
            return NULL;
        }
        for (int k = 0; k < 7; k++)
            if (in[k] != out[k] + 1.0f) {
                fail("rank 0, thread of peer %d, message %d: got %g, want %g", p->peer, i,
                     (double)in[k], (double)(out[k] + 1.0f));
                return NULL;
            }
    }
    return NULL;
}

static void two_threads(int rank, int world, int port) {
    zt_dist_info d = info(rank, world, port, "gloo-threads");
    zt_comm *g = NULL;
    if (zt_comm_create(&g, "gloo", &d, 20) != ZT_OK) {
        fail("rank %d: gloo create: %s", rank, zt_last_error());
        return;
    }
    if (rank == 0) {
        pinger a = {g, 1}, b = {g, 2};
        pthread_t ta, tb;
        pthread_create(&ta, NULL, ping, &a);
        pthread_create(&tb, NULL, ping, &b);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
    } else {
        for (int i = 0; i < PINGS; i++) {
            float v[7];
            if (zt_comm_recv(g, v, 7, ZT_F32, 0) != ZT_OK) {
                fail("rank %d, message %d: %s", rank, i, zt_last_error());
                break;
            }
            for (int k = 0; k < 7; k++)
                v[k] += 1.0f;
            if (zt_comm_send(g, v, 7, ZT_F32, 0) != ZT_OK) {
                fail("rank %d, message %d: %s", rank, i, zt_last_error());
                break;
            }
        }
    }
    zt_comm_destroy(g);
}

int main(void) {
    CHECK(run_ranks(3, two_threads, free_port()) == 0, "two threads on one communicator");
    CHECK(run_ranks(3, collectives, free_port()) == 0, "collectives");
    CHECK(run_ranks(2, collectives, free_port()) == 0, "collectives on 2 ranks");
    CHECK(run_ranks(3, dead_rank, free_port()) == 0, "dead rank");
    CHECK(run_ranks(2, missing_rank, free_port()) == 0, "missing rank");
    CHECK(run_ranks(2, disagreeing, free_port()) == 0, "ranks calling different collectives");
    CHECK(run_ranks(2, mismatched_world, free_port()) == 0, "mismatched world size");

    /* A port in use on rank 0's host, and an address that does not resolve. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    listen(fd, 1);
    getsockname(fd, (struct sockaddr *)&a, &len);
    zt_dist_info d = info(0, 2, ntohs(a.sin_port), "gloo-port");
    zt_comm *g = NULL;
    CHECK(zt_comm_create(&g, "gloo", &d, 2) == ZT_ERR_IO && strstr(zt_last_error(), "already in use"),
          "port in use: %s", zt_last_error());
    /* Rank 1 meets the program that holds the port, which accepts and never answers: it times
     * out saying that another program may hold the port, not that the store answers. */
    d = info(1, 2, ntohs(a.sin_port), "gloo-port");
    zt_status st = zt_comm_create(&g, "gloo", &d, 1.5);
    CHECK(st == ZT_ERR_TIMEOUT && strstr(zt_last_error(), "another program may hold that port"),
          "port held by another program, rank 1: %s: %s", zt_status_name(st), zt_last_error());
    close(fd);
    /* A name that does not resolve (yet: a pod's DNS name on Kubernetes) is asked again until
     * the timeout, as PyTorch does, and then named. ".invalid" never resolves (RFC 6761). */
    d = info(1, 2, 29999, "gloo-addr");
    snprintf(d.master_addr, sizeof d.master_addr, "no-such-host.invalid");
    double t0 = now_s();
    st = zt_comm_create(&g, "gloo", &d, 1.5);
    double waited = now_s() - t0;
    CHECK(st == ZT_ERR_TIMEOUT &&
              strstr(zt_last_error(), "MASTER_ADDR 'no-such-host.invalid' did not resolve "
                                      "within 1.5 s"),
          "bad MASTER_ADDR: %s: %s", zt_status_name(st), zt_last_error());
    CHECK(waited >= 1.5 && waited < 6, "bad MASTER_ADDR: failed after %.2f s, not the 1.5 s "
          "timeout", waited);
    /* Under Slurm the name is the step's first node, and the message names the list. */
    snprintf(d.addr_origin, sizeof d.addr_origin, "the first node of SLURM_STEP_NODELIST");
    st = zt_comm_create(&g, "gloo", &d, 0.2);
    CHECK(st == ZT_ERR_TIMEOUT &&
              strstr(zt_last_error(), "MASTER_ADDR (the first node of SLURM_STEP_NODELIST) "
                                      "'no-such-host.invalid' did not resolve"),
          "bad node list host: %s", zt_last_error());

    /* No rank 0 at all: the message gives the timeout the rank was given, not what was left of
     * it after the name resolved (1.49987 s). */
    d = info(1, 2, free_port(), "gloo-norank0");
    st = zt_comm_create(&g, "gloo", &d, 1.5);
    CHECK(st == ZT_ERR_TIMEOUT && strstr(zt_last_error(), "within 1.5 s:"),
          "no rank 0: %s: %s", zt_status_name(st), zt_last_error());

    /* GLOO_SOCKET_IFNAME in PyTorch's form, a comma-separated list: every name must have an
     * address (PyTorch makes a device of each and fails on one that has none) and the ranks use
     * the first. */
    setenv("GLOO_SOCKET_IFNAME", "lo,lo", 1);
    CHECK(run_ranks(2, collectives, free_port()) == 0, "collectives with GLOO_SOCKET_IFNAME=lo,lo");
    setenv("GLOO_SOCKET_IFNAME", "lo,no-such-if0", 1);
    d = info(0, 2, free_port(), "gloo-ifname");
    st = zt_comm_create(&g, "gloo", &d, 2);
    CHECK(st == ZT_ERR_INVALID && strstr(zt_last_error(), "GLOO_SOCKET_IFNAME='lo,no-such-if0'") &&
              strstr(zt_last_error(), "'no-such-if0' names no interface"),
          "GLOO_SOCKET_IFNAME with a missing interface: %s", zt_last_error());
    unsetenv("GLOO_SOCKET_IFNAME");

    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("test_comm_gloo: all checks passed\n");
    return 0;
}
#endif
