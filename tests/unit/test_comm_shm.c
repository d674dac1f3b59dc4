/* Tests for the shared-memory communicator (engine/comm_shm.c) and zt_dist_from_env.
 *
 * Each scenario forks its ranks as child processes. Collective results are compared bit for bit
 * with references computed here (contributions added in rank order, AVG = that sum / N), and every
 * rank sends a hash of each replicated result back so the parent can check that all ranks hold
 * the same bits. Fault scenarios kill or stall one rank and check that the others fail fast with
 * a message naming it. The parent reaps every child it forks. */
#define _GNU_SOURCE /* prctl, strcasestr; before any header */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ztrain/comm.h"

static int failures;

/* Ranks print concurrently, so each failure goes out in one write. */
static void report(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void report(const char *file, int line, const char *cond, const char *fmt, ...) {
    char msg[2048];
    int n = snprintf(msg, sizeof msg, "FAIL %s:%d: %s", file, line, cond);
    if (fmt && n >= 0 && (size_t)n < sizeof msg - 3) {
        va_list ap;
        va_start(ap, fmt);
        n += snprintf(msg + n, sizeof msg - (size_t)n, ": ");
        vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
        va_end(ap);
    }
    size_t len = strnlen(msg, sizeof msg - 2);
    msg[len++] = '\n';
    (void)!write(2, msg, len);
    failures++;
}

#define CHECK(cond)                                         \
    do {                                                    \
        if (!(cond))                                        \
            report(__FILE__, __LINE__, #cond, NULL);        \
    } while (0)

#define CHECKF(cond, ...)                                   \
    do {                                                    \
        if (!(cond))                                        \
            report(__FILE__, __LINE__, #cond, __VA_ARGS__); \
    } while (0)

/* Larger than any slot (4 MiB) and any buffer set (8 MiB), so every collective runs in chunks. */
enum { BIG = 2500007, BIG_F64 = 600001 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_for(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

/* Rank r's test values: exact numbers of widely varying magnitude, so that adding the ranks in
 * another order than 0..N-1 would change the rounded sums. They are tabulated once before the
 * ranks are forked (and shared copy-on-write), and each test reads them at its own shift. */
enum { MAX_WORLD = 4, TABLE_LEN = BIG + 64 };
static float *table_f32[MAX_WORLD];
static double *table_f64[MAX_WORLD];

static void make_tables(void) {
    for (int r = 0; r < MAX_WORLD; r++) {
        table_f32[r] = malloc(TABLE_LEN * sizeof(float));
        table_f64[r] = malloc(BIG_F64 * sizeof(double));
        if (!table_f32[r] || !table_f64[r]) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        for (size_t i = 0; i < TABLE_LEN; i++) {
            uint64_t h = mix(((uint64_t)r << 40) ^ i);
            int mant = (int)(h % 2000001) - 1000000;
            table_f32[r][i] = ldexpf((float)mant, (int)((h >> 32) % 4) * 8 - 20);
        }
        for (size_t i = 0; i < BIG_F64; i++) {
            uint64_t h = mix(((uint64_t)r << 40) ^ i ^ 0x5555);
            int64_t mant = (int64_t)(h % 2000000000001ULL) - 1000000000000LL;
            table_f64[r][i] = ldexp((double)mant, (int)((h >> 44) % 4) * 30 - 60);
        }
    }
}

static float val_f32(int rank, size_t i, unsigned salt) {
    return table_f32[rank][(i + (size_t)salt * 7919) % TABLE_LEN];
}

static double val_f64(int rank, size_t i, unsigned salt) {
    return table_f64[rank][(i + (size_t)salt * 7919) % BIG_F64];
}

static float ref_f32(int world, size_t i, unsigned salt, zt_reduce_op op) {
    float acc = val_f32(0, i, salt);
    for (int k = 1; k < world; k++) {
        float v = val_f32(k, i, salt);
        if (op == ZT_REDUCE_MAX)
            acc = v > acc ? v : acc;
        else
            acc += v;
    }
    return op == ZT_REDUCE_AVG ? acc / (float)world : acc;
}

static double ref_f64(int world, size_t i, unsigned salt, zt_reduce_op op) {
    double acc = val_f64(0, i, salt);
    for (int k = 1; k < world; k++) {
        double v = val_f64(k, i, salt);
        if (op == ZT_REDUCE_MAX)
            acc = v > acc ? v : acc;
        else
            acc += v;
    }
    return op == ZT_REDUCE_AVG ? acc / (double)world : acc;
}

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* Each child sends the hash of every result that all ranks must share to the parent. */
static int hash_fd = -1;
static void send_hash(const void *p, size_t n) {
    uint64_t h = fnv(p, n);
    if (write(hash_fd, &h, sizeof h) != (ssize_t)sizeof h) {
        fprintf(stderr, "FAIL: cannot write hash: %s\n", strerror(errno));
        failures++;
    }
}

static const char *op_str(zt_reduce_op op) {
    return op == ZT_REDUCE_SUM ? "sum" : op == ZT_REDUCE_AVG ? "avg" : "max";
}

/* Uneven pieces: placed in reverse rank order with gaps, rank 1 empty, sizes growing with rank;
 * with even=1, equal contiguous pieces in rank order as ZeRO uses them. */
static void make_layout(int world, size_t n, int even, size_t *off, size_t *cnt) {
    if (even) {
        size_t per = n / (size_t)world;
        for (int r = 0; r < world; r++) {
            off[r] = per * (size_t)r;
            cnt[r] = r == world - 1 ? n - off[r] : per;
        }
        return;
    }
    size_t gap = n >= 40 ? 3 : 0, weight_sum = 0, used = 0;
    for (int r = 0; r < world; r++)
        weight_sum += r == 1 ? 0 : (size_t)r + 1;
    size_t usable = n - gap * ((size_t)world + 1);
    for (int r = 0; r < world; r++) {
        cnt[r] = usable * (r == 1 ? 0 : (size_t)r + 1) / weight_sum;
        used += cnt[r];
    }
    cnt[world - 1] += usable - used - (usable - used) / 2; /* leave some slack at the end */
    size_t pos = gap;
    for (int r = world - 1; r >= 0; r--) {
        off[r] = pos;
        pos += cnt[r] + gap;
    }
}

static zt_dist_info make_info(int rank, int world, const char *run_id) {
    zt_dist_info d;
    memset(&d, 0, sizeof d);
    d.rank = rank;
    d.world_size = world;
    d.local_rank = rank;
    d.local_world_size = world;
    strcpy(d.master_addr, "127.0.0.1");
    d.master_port = 29500;
    snprintf(d.run_id, sizeof d.run_id, "%s", run_id);
    return d;
}

static void test_all_reduce(zt_comm *c, int rank, int world) {
    static const size_t sizes[] = {0, 1, 7, 1001, BIG};
    static const zt_reduce_op ops[] = {ZT_REDUCE_SUM, ZT_REDUCE_AVG, ZT_REDUCE_MAX};
    float *buf = malloc(BIG * sizeof(float));
    for (unsigned o = 0; o < 3; o++) {
        for (unsigned s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            size_t n = sizes[s];
            unsigned salt = o * 16 + s;
            for (size_t i = 0; i < n; i++)
                buf[i] = val_f32(rank, i, salt);
            zt_status st = zt_comm_all_reduce(c, buf, n, ZT_F32, ops[o]);
            CHECKF(st == ZT_OK, "all_reduce(%zu, %s): %s", n, op_str(ops[o]), zt_last_error());
            size_t bad = 0, first = 0;
            for (size_t i = 0; i < n; i++) {
                float want = ref_f32(world, i, salt, ops[o]);
                if (memcmp(&want, &buf[i], sizeof want) != 0 && bad++ == 0)
                    first = i;
            }
            CHECKF(bad == 0, "rank %d all_reduce(n=%zu, %s): %zu wrong, first at %zu", rank, n,
                   op_str(ops[o]), bad, first);
            send_hash(buf, n * sizeof(float));
        }
    }
    free(buf);
}

static void test_all_reduce_f64(zt_comm *c, int rank, int world) {
    static const size_t sizes[] = {0, 1, 5, BIG_F64};
    static const zt_reduce_op ops[] = {ZT_REDUCE_SUM, ZT_REDUCE_AVG, ZT_REDUCE_MAX};
    double *buf = malloc(BIG_F64 * sizeof(double));
    for (unsigned o = 0; o < 3; o++) {
        for (unsigned s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            size_t n = sizes[s];
            unsigned salt = 100 + o * 16 + s;
            for (size_t i = 0; i < n; i++)
                buf[i] = val_f64(rank, i, salt);
            zt_status st = zt_comm_all_reduce(c, buf, n, ZT_F64, ops[o]);
            CHECKF(st == ZT_OK, "all_reduce_f64: %s", zt_last_error());
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                double want = ref_f64(world, i, salt, ops[o]);
                bad += memcmp(&want, &buf[i], sizeof want) != 0;
            }
            CHECKF(bad == 0, "rank %d all_reduce_f64(n=%zu, %s): %zu wrong", rank, n,
                   op_str(ops[o]), bad);
            send_hash(buf, n * sizeof(double));
        }
    }
    free(buf);
}

static void test_reduce_scatter(zt_comm *c, int rank, int world) {
    static const size_t sizes[] = {0, 1, 13, 1001, BIG + 40};
    size_t off[8], cnt[8];
    float *in = malloc((BIG + 40) * sizeof(float)), *out = malloc((BIG + 40) * sizeof(float));
    for (unsigned s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        for (int variant = 0; variant < 4; variant++) {
            size_t n = sizes[s];
            int even = variant == 0;
            int alias = variant == 2;
            zt_reduce_op op = variant == 3 ? ZT_REDUCE_MAX : variant == 1 ? ZT_REDUCE_AVG
                                                                           : ZT_REDUCE_SUM;
            unsigned salt = 200 + s * 8 + (unsigned)variant;
            make_layout(world, n, even, off, cnt);
            for (size_t i = 0; i < n; i++)
                in[i] = val_f32(rank, i, salt);
            uint64_t in_hash = fnv(in, n * sizeof(float));
            float *dst = alias ? in + off[rank] : out;
            zt_status st = zt_comm_reduce_scatter(c, in, dst, n, off, cnt, ZT_F32, op);
            CHECKF(st == ZT_OK, "reduce_scatter: %s", zt_last_error());
            size_t bad = 0;
            for (size_t j = 0; j < cnt[rank]; j++) {
                float want = ref_f32(world, off[rank] + j, salt, op);
                bad += memcmp(&want, &dst[j], sizeof want) != 0;
            }
            CHECKF(bad == 0, "rank %d reduce_scatter(n=%zu, variant %d): %zu wrong of %zu", rank,
                   n, variant, bad, cnt[rank]);
            if (!alias)
                CHECKF(fnv(in, n * sizeof(float)) == in_hash, "reduce_scatter changed its input");
            if (alias) {
                /* Only this rank's own piece of in may change. */
                size_t stray = 0;
                for (size_t i = 0; i < n; i++) {
                    if (i >= off[rank] && i < off[rank] + cnt[rank])
                        continue;
                    float want = val_f32(rank, i, salt);
                    stray += memcmp(&want, &in[i], sizeof want) != 0;
                }
                CHECKF(stray == 0, "aliased reduce_scatter wrote %zu elements outside its piece",
                       stray);
            }
        }
    }
    free(in);
    free(out);
}

static void test_all_gather(zt_comm *c, int rank, int world) {
    static const size_t sizes[] = {0, 1, 13, 1001, BIG + 40};
    size_t off[8], cnt[8];
    float *buf = malloc((BIG + 40) * sizeof(float));
    const float sentinel = -7777.0f;
    for (unsigned s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        for (int even = 0; even < 2; even++) {
            size_t n = sizes[s];
            unsigned salt = 300 + s * 2 + (unsigned)even;
            make_layout(world, n, even, off, cnt);
            for (size_t i = 0; i < n; i++)
                buf[i] = i >= off[rank] && i < off[rank] + cnt[rank] ? val_f32(rank, i, salt)
                                                                      : sentinel;
            zt_status st = zt_comm_all_gather(c, buf, n, off, cnt, ZT_F32);
            CHECKF(st == ZT_OK, "all_gather: %s", zt_last_error());
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                float want = sentinel;
                for (int k = 0; k < world; k++)
                    if (i >= off[k] && i < off[k] + cnt[k])
                        want = val_f32(k, i, salt);
                bad += memcmp(&want, &buf[i], sizeof want) != 0;
            }
            CHECKF(bad == 0, "rank %d all_gather(n=%zu, even=%d): %zu wrong", rank, n, even, bad);
            send_hash(buf, n * sizeof(float));
        }
    }
    free(buf);
}

static void test_broadcast(zt_comm *c, int rank, int world) {
    static const size_t sizes[] = {0, 1, 7, BIG};
    float *buf = malloc(BIG * sizeof(float));
    for (int root = 0; root < world; root++) {
        for (unsigned s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            size_t n = sizes[s];
            unsigned salt = 400 + (unsigned)root * 8 + s;
            for (size_t i = 0; i < n; i++)
                buf[i] = rank == root ? val_f32(root, i, salt) : -1.0f;
            zt_status st = zt_comm_broadcast(c, buf, n, ZT_F32, root);
            CHECKF(st == ZT_OK, "broadcast: %s", zt_last_error());
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                float want = val_f32(root, i, salt);
                bad += memcmp(&want, &buf[i], sizeof want) != 0;
            }
            CHECKF(bad == 0, "rank %d broadcast(n=%zu, root=%d): %zu wrong", rank, n, root, bad);
            send_hash(buf, n * sizeof(float));
        }
    }
    free(buf);
}

/* ---- Scenarios, each run by every rank in its own child process. ---- */

typedef struct {
    int world;
    char run_id[64];
    double timeout_s;
    int victim; /* the rank that misbehaves in a fault scenario */
} scenario;

static void collectives(const scenario *sc, int rank) {
    zt_dist_info d = make_info(rank, sc->world, sc->run_id);
    zt_comm *c;
    zt_status st = zt_comm_create(&c, "shm", &d, sc->timeout_s);
    CHECKF(st == ZT_OK, "rank %d create: %s", rank, zt_last_error());
    if (st != ZT_OK)
        return;
    CHECK(zt_comm_rank(c) == rank && zt_comm_world_size(c) == sc->world);
    CHECKF(zt_comm_barrier(c) == ZT_OK, "barrier: %s", zt_last_error());
    test_all_reduce(c, rank, sc->world);
    test_all_reduce_f64(c, rank, sc->world);
    test_reduce_scatter(c, rank, sc->world);
    test_all_gather(c, rank, sc->world);
    test_broadcast(c, rank, sc->world);
    /* NaN in MAX survives from any rank: the fp16 overflow check relies on it. */
    float flag = rank == sc->world - 1 ? NAN : (float)rank;
    CHECK(zt_comm_all_reduce(c, &flag, 1, ZT_F32, ZT_REDUCE_MAX) == ZT_OK && isnan(flag));
    for (int i = 0; i < 5; i++)
        CHECKF(zt_comm_barrier(c) == ZT_OK, "barrier: %s", zt_last_error());
    zt_comm_destroy(c);
}

/* The victim exits without a word after the first barrier; the others are in a chunked
 * all_reduce and must fail within a second, naming it. */
static void peer_exits(const scenario *sc, int rank) {
    zt_dist_info d = make_info(rank, sc->world, sc->run_id);
    zt_comm *c;
    if (zt_comm_create(&c, "shm", &d, sc->timeout_s) != ZT_OK) {
        CHECKF(0, "create: %s", zt_last_error());
        return;
    }
    CHECKF(zt_comm_barrier(c) == ZT_OK, "barrier: %s", zt_last_error());
    if (rank == sc->victim)
        _exit(0);
    float *buf = calloc(BIG, sizeof(float));
    double t0 = now_s();
    zt_status st = zt_comm_all_reduce(c, buf, BIG, ZT_F32, ZT_REDUCE_SUM);
    double dt = now_s() - t0;
    char want[32];
    snprintf(want, sizeof want, "rank %d (pid", sc->victim);
    CHECKF(st == ZT_ERR_IO, "rank %d: status %s: %s", rank, zt_status_name(st), zt_last_error());
    CHECKF(strstr(zt_last_error(), want) && strstr(zt_last_error(), "has exited"),
           "rank %d: message does not name rank %d: %s", rank, sc->victim, zt_last_error());
    CHECKF(dt < 1.0, "rank %d took %.2f s to notice", rank, dt);
    if (rank == 0)
        printf("  peer exit, rank 0 saw after %.3f s: %s\n", dt, zt_last_error());
    /* The communicator stays failed. */
    CHECK(zt_comm_barrier(c) == ZT_ERR_IO && strstr(zt_last_error(), "failed earlier"));
    free(buf);
    zt_comm_destroy(c);
}

/* The victim stays alive but arrives late: the others time out after the configured timeout,
 * naming it; the victim then fails at once because the segment was marked aborted. */
static void peer_stalls(const scenario *sc, int rank) {
    zt_dist_info d = make_info(rank, sc->world, sc->run_id);
    zt_comm *c;
    if (zt_comm_create(&c, "shm", &d, sc->timeout_s) != ZT_OK) {
        CHECKF(0, "create: %s", zt_last_error());
        return;
    }
    CHECKF(zt_comm_barrier(c) == ZT_OK, "barrier: %s", zt_last_error());
    if (rank == sc->victim)
        sleep_for(sc->timeout_s + 1.0);
    double t0 = now_s();
    zt_status st = zt_comm_barrier(c);
    double dt = now_s() - t0;
    CHECKF(st == ZT_ERR_TIMEOUT, "rank %d: status %s: %s", rank, zt_status_name(st),
           zt_last_error());
    if (rank == sc->victim) {
        CHECKF(strstr(zt_last_error(), "aborted"), "victim: %s", zt_last_error());
        CHECKF(dt < 0.5, "victim took %.2f s to see the abort", dt);
    } else {
        char want[32];
        snprintf(want, sizeof want, "rank(s) %d", sc->victim);
        CHECKF(strstr(zt_last_error(), want), "rank %d: message does not name rank %d: %s", rank,
               sc->victim, zt_last_error());
        CHECKF(dt > sc->timeout_s - 0.1 && dt < sc->timeout_s + 1.0,
               "rank %d timed out after %.2f s, configured %.2f s", rank, dt, sc->timeout_s);
        if (rank == 0)
            printf("  peer stall, rank 0 after %.3f s: %s\n", dt, zt_last_error());
    }
    zt_comm_destroy(c);
}

/* Rank 0 calls all_reduce while the victim calls broadcast: both must say so. */
static void mismatch(const scenario *sc, int rank) {
    zt_dist_info d = make_info(rank, sc->world, sc->run_id);
    zt_comm *c;
    if (zt_comm_create(&c, "shm", &d, sc->timeout_s) != ZT_OK) {
        CHECKF(0, "create: %s", zt_last_error());
        return;
    }
    float buf[10] = {0};
    zt_status st = rank == sc->victim ? zt_comm_broadcast(c, buf, 10, ZT_F32, 0)
                                      : zt_comm_all_reduce(c, buf, 10, ZT_F32, ZT_REDUCE_SUM);
    CHECKF(st == ZT_ERR_INVALID && strstr(zt_last_error(), "broadcast(n=10, root=0)") &&
               strstr(zt_last_error(), "all_reduce(n=10, op=sum)"),
           "rank %d: %s: %s", rank, zt_status_name(st), zt_last_error());
    if (rank == 0)
        printf("  mismatch: %s\n", zt_last_error());
    zt_comm_destroy(c);
}

/* Only one rank of a world of two is started. */
static void alone(const scenario *sc, int rank) {
    zt_dist_info d = make_info(rank, sc->world, sc->run_id);
    zt_comm *c;
    double t0 = now_s();
    zt_status st = zt_comm_create(&c, "shm", &d, sc->timeout_s);
    double dt = now_s() - t0;
    const char *want = rank == 0 ? "rank(s) 1" : "from rank 0";
    CHECKF(st == ZT_ERR_TIMEOUT && strstr(zt_last_error(), want), "rank %d alone: %s: %s", rank,
           zt_status_name(st), zt_last_error());
    CHECKF(dt > sc->timeout_s - 0.1 && dt < sc->timeout_s + 1.0, "rank %d alone: %.2f s", rank,
           dt);
    printf("  rank %d alone: %s\n", rank, zt_last_error());
}

/* Rank 0 of an earlier run died in the rendezvous and left its segment behind. */
static void hang_in_rendezvous(const scenario *sc, int rank) {
    zt_dist_info d = make_info(rank, sc->world, sc->run_id);
    zt_comm *c;
    zt_comm_create(&c, "shm", &d, 30.0); /* killed by the parent long before this returns */
    CHECK(0);
}

/* ---- The parent: forks the ranks, reaps them, compares their hashes. ---- */

typedef void (*scenario_fn)(const scenario *, int);

static pid_t children[8];
static int nchildren;

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL: test_comm_shm timed out; killing its children\n";
    (void)!write(2, msg, sizeof msg - 1);
    for (int i = 0; i < nchildren; i++)
        if (children[i] > 0)
            kill(children[i], SIGKILL);
    _exit(2);
}

/* Forks one child per listed rank (ranks[i], started delay[i] seconds late), waits for all, and
 * checks that all exited 0 and sent identical hash streams. */
static void run_ranks(const char *label, const scenario *sc, scenario_fn fn, const int *ranks,
                      int n, const double *delay, int expect_hashes) {
    int fds[8];
    uint64_t *hashes[8];
    size_t nh[8];
    fflush(stdout);
    nchildren = 0;
    for (int i = 0; i < n; i++) {
        int p[2];
        if (pipe(p) != 0) {
            perror("pipe");
            exit(1);
        }
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            exit(1);
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            alarm(40);
            close(p[0]);
            hash_fd = p[1];
            if (delay && delay[i] > 0)
                sleep_for(delay[i]);
            fn(sc, ranks[i]);
            fflush(stdout);
            _exit(failures ? 1 : 0);
        }
        close(p[1]);
        fds[i] = p[0];
        children[nchildren++] = pid;
    }
    /* Reap in exit order, so an exited rank never lingers as a zombie. */
    for (int left = n; left > 0; left--) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            perror("waitpid");
            exit(1);
        }
        int i = 0;
        while (i < n && children[i] != pid)
            i++;
        if (i == n)
            continue;
        children[i] = -1;
        CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: rank %d %s %d", label,
               ranks[i], WIFEXITED(status) ? "exited with" : "killed by signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
    for (int i = 0; i < n; i++) {
        size_t cap = 1024;
        hashes[i] = malloc(cap * sizeof(uint64_t));
        nh[i] = 0;
        ssize_t got;
        while ((got = read(fds[i], hashes[i] + nh[i], (cap - nh[i]) * sizeof(uint64_t))) > 0)
            nh[i] += (size_t)got / sizeof(uint64_t);
        close(fds[i]);
    }
    if (expect_hashes) {
        for (int i = 0; i < n; i++) {
            CHECKF(nh[i] == nh[0] && nh[i] > 0, "%s: rank %d sent %zu hashes, rank %d %zu", label,
                   ranks[i], nh[i], ranks[0], nh[0]);
            for (size_t j = 0; j < nh[i] && j < nh[0]; j++)
                CHECKF(hashes[i][j] == hashes[0][j], "%s: rank %d result %zu differs from rank %d",
                       label, ranks[i], j, ranks[0]);
        }
    }
    for (int i = 0; i < n; i++)
        free(hashes[i]);
}

static bool segment_exists(const char *run_id) {
    char name[192];
    snprintf(name, sizeof name, "/ztrain-%u-%s", (unsigned)getuid(), run_id);
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

static scenario make_scenario(int world, const char *tag, double timeout_s, int victim) {
    scenario sc = {.world = world, .timeout_s = timeout_s, .victim = victim};
    snprintf(sc.run_id, sizeof sc.run_id, "test-%d-%s", (int)getpid(), tag);
    return sc;
}

static void test_scenarios(void) {
    static const int all[] = {0, 1, 2, 3};
    for (int world = 2; world <= 4; world++) {
        char tag[16], label[32];
        snprintf(tag, sizeof tag, "w%d", world);
        snprintf(label, sizeof label, "collectives world %d", world);
        scenario sc = make_scenario(world, tag, 20.0, -1);
        double t0 = now_s();
        run_ranks(label, &sc, collectives, all, world, NULL, 1);
        printf("  %s: %.2f s\n", label, now_s() - t0);
        CHECKF(!segment_exists(sc.run_id), "%s left its segment behind", label);
    }

    scenario sc = make_scenario(3, "exit", 20.0, 2);
    run_ranks("peer exits", &sc, peer_exits, all, 3, NULL, 0);
    CHECK(!segment_exists(sc.run_id));

    sc = make_scenario(3, "stall", 1.5, 1);
    run_ranks("peer stalls", &sc, peer_stalls, all, 3, NULL, 0);

    sc = make_scenario(2, "mismatch", 20.0, 1);
    run_ranks("mismatch", &sc, mismatch, all, 2, NULL, 0);

    sc = make_scenario(2, "alone0", 1.0, -1);
    run_ranks("rank 0 alone", &sc, alone, &all[0], 1, NULL, 0);
    CHECKF(!segment_exists(sc.run_id), "rank 0 left its segment behind after a failed rendezvous");
    sc = make_scenario(2, "alone1", 1.0, -1);
    run_ranks("rank 1 alone", &sc, alone, &all[1], 1, NULL, 0);

    /* A stale segment: rank 0 is killed in the rendezvous, leaving a ready segment whose rank 0
     * is dead. A new run under the same id must not attach to it, even when its rank 1 starts
     * first. */
    sc = make_scenario(2, "stale", 20.0, -1);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(40);
        hang_in_rendezvous(&sc, 0);
        _exit(1);
    }
    CHECK(pid > 0);
    for (int i = 0; i < 200 && !segment_exists(sc.run_id); i++)
        sleep_for(0.01);
    sleep_for(0.05);
    kill(pid, SIGKILL);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECKF(segment_exists(sc.run_id), "no stale segment was left to test with");
    static const double late_rank0[] = {0.3, 0.0};
    run_ranks("after a stale segment", &sc, collectives, all, 2, late_rank0, 1);
    CHECK(!segment_exists(sc.run_id));
}

/* ---- zt_dist_from_env ---- */

static const char *const dist_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "ZTRAIN_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID",
    "SLURM_NNODES", "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
};

/* Replaces the launcher environment with "NAME=value" entries up to a NULL. */
static void set_env(const char *const *kv) {
    for (size_t i = 0; i < sizeof dist_vars / sizeof *dist_vars; i++)
        unsetenv(dist_vars[i]);
    for (; *kv; kv++) {
        char name[64];
        const char *eq = strchr(*kv, '=');
        snprintf(name, sizeof name, "%.*s", (int)(eq - *kv), *kv);
        setenv(name, eq + 1, 1);
    }
}

static void expect_env_error(const char *const *kv, const char *msg) {
    zt_dist_info d;
    set_env(kv);
    zt_status st = zt_dist_from_env(&d);
    CHECKF(st == ZT_ERR_INVALID && strstr(zt_last_error(), msg), "%s: expected '%s', got %s: %s",
           kv[0], msg, zt_status_name(st), zt_last_error());
}

static void test_dist_env(void) {
    zt_dist_info d;
    set_env((const char *const[]){NULL});
    CHECK(zt_dist_from_env(&d) == ZT_OK);
    CHECK(d.rank == 0 && d.world_size == 1 && d.local_rank == 0 && d.local_world_size == 1);
    CHECK(strcmp(d.run_id, "port29500") == 0 && d.master_port == 29500);

    set_env((const char *const[]){"RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4",
                                  "MASTER_ADDR=node-a.example", "MASTER_PORT=29611",
                                  "TORCHELASTIC_RUN_ID=job/7 x.y", NULL});
    CHECKF(zt_dist_from_env(&d) == ZT_OK, "%s", zt_last_error());
    CHECK(d.rank == 5 && d.world_size == 8 && d.local_rank == 1 && d.local_world_size == 4);
    CHECK(strcmp(d.master_addr, "node-a.example") == 0 && d.master_port == 29611);
    CHECKF(strcmp(d.run_id, "job_7_x_y") == 0, "run_id %s", d.run_id);

    /* torchrun's placeholder id is not an id; ZTRAIN_RUN_ID wins over everything. */
    set_env((const char *const[]){"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=1234",
                                  "TORCHELASTIC_RUN_ID=none", "SLURM_JOB_ID=99", NULL});
    CHECK(zt_dist_from_env(&d) == ZT_OK && strcmp(d.run_id, "99") == 0);
    set_env((const char *const[]){"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=1234",
                                  "TORCHELASTIC_RUN_ID=none", NULL});
    CHECK(zt_dist_from_env(&d) == ZT_OK && strcmp(d.run_id, "port1234") == 0);
    set_env((const char *const[]){"ZTRAIN_RUN_ID=mine", "TORCHELASTIC_RUN_ID=abc", NULL});
    CHECK(zt_dist_from_env(&d) == ZT_OK && strcmp(d.run_id, "mine") == 0);

    /* Kubeflow: one process per pod, no LOCAL_* variables. */
    set_env((const char *const[]){"RANK=3", "WORLD_SIZE=4", "MASTER_ADDR=master-0",
                                  "MASTER_PORT=23456", NULL});
    CHECK(zt_dist_from_env(&d) == ZT_OK && d.local_rank == 0 && d.local_world_size == 1);

    /* Slurm: per-node task counts in compressed form, master on the step's first node. */
    set_env((const char *const[]){"SLURM_PROCID=6", "SLURM_NTASKS=10", "SLURM_LOCALID=2",
                                  "SLURM_NODEID=1", "SLURM_TASKS_PER_NODE=4(x2),2",
                                  "SLURM_JOB_ID=4242", "SLURM_JOB_NODELIST=gpu[007-009],cpu1",
                                  NULL});
    CHECKF(zt_dist_from_env(&d) == ZT_OK, "%s", zt_last_error());
    CHECK(d.rank == 6 && d.world_size == 10 && d.local_rank == 2 && d.local_world_size == 4);
    CHECKF(strcmp(d.master_addr, "gpu007") == 0, "master_addr %s", d.master_addr);
    CHECK(strcmp(d.run_id, "4242") == 0 && d.master_port == 24242);
    set_env((const char *const[]){"SLURM_PROCID=9", "SLURM_NTASKS=10", "SLURM_LOCALID=1",
                                  "SLURM_NODEID=2", "SLURM_TASKS_PER_NODE=4(x2),2",
                                  "MASTER_PORT=30000", NULL});
    CHECK(zt_dist_from_env(&d) == ZT_OK && d.local_world_size == 2 && d.master_port == 30000);
    set_env((const char *const[]){"SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_LOCALID=1",
                                  "SLURM_NTASKS_PER_NODE=2", NULL});
    CHECK(zt_dist_from_env(&d) == ZT_OK && d.local_world_size == 2);
    /* torchrun inside a Slurm allocation: torchrun's variables describe the ranks. */
    set_env((const char *const[]){"RANK=1", "WORLD_SIZE=2", "SLURM_PROCID=0", "SLURM_NTASKS=1",
                                  NULL});
    CHECK(zt_dist_from_env(&d) == ZT_OK && d.rank == 1 && d.world_size == 2);

    expect_env_error((const char *const[]){"RANK=3", "WORLD_SIZE=2", NULL},
                     "RANK=3 is not below WORLD_SIZE=2");
    expect_env_error((const char *const[]){"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=abc", NULL},
                     "MASTER_PORT='abc' is not a port number");
    expect_env_error((const char *const[]){"MASTER_PORT=70000", NULL},
                     "MASTER_PORT='70000' is not a port number");
    expect_env_error((const char *const[]){"RANK=-1", "WORLD_SIZE=2", NULL},
                     "RANK='-1' is not a non-negative integer");
    expect_env_error((const char *const[]){"RANK=1x", "WORLD_SIZE=2", NULL}, "RANK='1x'");
    expect_env_error((const char *const[]){"RANK=0", "WORLD_SIZE=0", NULL},
                     "WORLD_SIZE=0 must be at least 1");
    expect_env_error((const char *const[]){"RANK=0", NULL}, "RANK is set but WORLD_SIZE is not");
    expect_env_error((const char *const[]){"RANK=0", "WORLD_SIZE=99999999999", NULL},
                     "WORLD_SIZE='99999999999'");
    expect_env_error((const char *const[]){"RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=2",
                                           "LOCAL_WORLD_SIZE=2", NULL},
                     "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
    expect_env_error((const char *const[]){"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0",
                                           "LOCAL_WORLD_SIZE=4", NULL},
                     "LOCAL_WORLD_SIZE=4 is larger than WORLD_SIZE=2");
    expect_env_error((const char *const[]){"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=2", NULL},
                     "LOCAL_RANK=2 is not below WORLD_SIZE=2");
    expect_env_error((const char *const[]){"SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_NODEID=5",
                                           "SLURM_TASKS_PER_NODE=2(x2)", NULL},
                     "SLURM_TASKS_PER_NODE='2(x2)' has no entry for SLURM_NODEID=5");
    expect_env_error((const char *const[]){"SLURM_PROCID=8", "SLURM_NTASKS=8", NULL},
                     "SLURM_PROCID=8 is not below SLURM_NTASKS=8");
    expect_env_error((const char *const[]){"SLURM_PROCID=0", NULL}, "SLURM_NTASKS is not");
    expect_env_error((const char *const[]){"SLURM_PROCID=0", "SLURM_NTASKS=4",
                                           "SLURM_LOCALID=abc", NULL},
                     "SLURM_LOCALID='abc' is not a non-negative integer");
    expect_env_error((const char *const[]){"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=3",
                                           "SLURM_NTASKS_PER_NODE=2", NULL},
                     "SLURM_LOCALID=3 is not below the 2 task(s) on this node");
    set_env((const char *const[]){NULL});
}

/* Communicator arguments that are wrong before any peer is involved. */
static void test_bad_args(void) {
    zt_comm *c = (zt_comm *)1;
    zt_dist_info d = make_info(2, 2, "x");
    CHECK(zt_comm_create(&c, "shm", &d, 1.0) == ZT_ERR_INVALID && c == NULL);
    d = make_info(0, 2, "bad/name");
    CHECK(zt_comm_create(&c, "shm", &d, 1.0) == ZT_ERR_INVALID && strstr(zt_last_error(), "run id"));
    d = make_info(0, 2, "x");
    CHECK(zt_comm_create(&c, "shm", &d, 0.0) == ZT_ERR_INVALID);
    /* A world of one needs no peers: every collective is the identity. */
    char id[64];
    snprintf(id, sizeof id, "test-%d-single", (int)getpid());
    d = make_info(0, 1, id);
    CHECKF(zt_comm_create(&c, "shm", &d, 1.0) == ZT_OK, "%s", zt_last_error());
    float v[3] = {1.5f, -2.0f, 3.0f};
    size_t off = 1, cnt = 2;
    float out[2];
    CHECK(zt_comm_all_reduce(c, v, 3, ZT_F32, ZT_REDUCE_AVG) == ZT_OK && v[0] == 1.5f && v[2] == 3.0f);
    CHECK(zt_comm_reduce_scatter(c, v, out, 3, &off, &cnt, ZT_F32, ZT_REDUCE_SUM) == ZT_OK &&
          out[0] == -2.0f && out[1] == 3.0f);
    CHECK(zt_comm_broadcast(c, v, 3, ZT_F32, 1) == ZT_ERR_INVALID);
    zt_comm_destroy(c);
    CHECK(!segment_exists(id));
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(55);
    double t0 = now_s();
    make_tables();
    test_dist_env();
    test_bad_args();
    test_scenarios();
    printf("test_comm_shm: %s (%.1f s)\n", failures ? "FAILED" : "ok", now_s() - t0);
    return failures ? 1 : 0;
}
