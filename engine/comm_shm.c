/* The shared-memory communicator: ranks on one host exchange data through one POSIX shared-memory
 * segment and wait for each other on a futex barrier that lives in it.
 *
 * Every wait is bounded by the communicator's timeout and watches the processes of the ranks it
 * waits for, so a dead or stuck peer becomes an error that names it. The first rank to fail marks
 * the segment aborted, and the others stop at their next wait instead of running into their own
 * timeouts. Ranks must share a PID namespace (one container, or the host), as torchrun's do. */
#define _GNU_SOURCE /* syscall, getrandom; before any header */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ztrain/comm.h"

#define SHM_MAGIC 0x6d68736e69617274ULL /* "trainshm" */
enum { SHM_VERSION = 1, MAX_RANKS = 512, REASON_LEN = 400, MAX_NAMED_RANKS = 16 };

/* Data lives in two buffer sets of SET_BYTES each, split into one slot per rank: 16 MiB in all,
 * well under Docker's default 64 MiB /dev/shm whatever the world size. Larger operations go
 * through in chunks of a slot (reductions) or of a whole set (copies). */
#define SET_BYTES ((size_t)8 << 20)
#define SLOT_MAX_BYTES ((size_t)4 << 20)
#define SLOT_MIN_BYTES ((size_t)16 << 10)

/* A waiting rank wakes at least this often to check its peers' processes and its deadline. */
#define WAIT_SLICE_NS 50000000LL
/* How often a rank polls for rank 0's segment while attaching. */
#define ATTACH_POLL_NS 10000000LL

typedef enum {
    OP_BARRIER = 1,
    OP_ALL_REDUCE,
    OP_ALL_REDUCE_F64,
    OP_REDUCE_SCATTER,
    OP_ALL_GATHER,
    OP_BROADCAST,
} op_kind;

/* What a rank is about to do. Each rank publishes one at the start of a collective and compares
 * all of them after the first barrier, so ranks that call different collectives (a bug in the
 * caller) fail with a message saying so instead of silently exchanging wrong data. */
typedef struct {
    uint32_t kind;
    uint32_t arg;    /* the reduce op, or the broadcast root */
    uint64_t n;
    uint64_t layout; /* a hash of offsets and counts for reduce_scatter and all_gather */
} shm_desc;

/* One per rank; each field is written only by its own rank. */
typedef struct {
    alignas(64) _Atomic int32_t pid; /* 0 until the rank has attached */
    int32_t abort_status;
    uint64_t start_time;         /* from /proc/<pid>/stat; tells a reused pid from the rank */
    _Atomic uint32_t arrived;    /* 1 + the barrier generation the rank last arrived at */
    uint32_t unused;
    shm_desc desc[2];            /* one per buffer set, see phase_sync */
    char abort_reason[REASON_LEN];
} shm_rank;

typedef struct {
    uint64_t magic;
    uint32_t version, world_size;
    /* Random per session. Staleness is judged by rank 0's pid and start time, not by this; it
     * lets a person inspecting /dev/shm or a core dump tell two sessions under one name apart. */
    uint64_t nonce;
    uint64_t slot_bytes, total_bytes;
    _Atomic uint32_t ready;   /* set last by rank 0, once everything above is written */
    _Atomic uint32_t aborted; /* 0, or 1 + the rank that failed first */
    /* The barrier: ranks count themselves in; the last one resets the count and advances the
     * generation, which is the word everyone else sleeps on with futex. */
    alignas(64) _Atomic uint32_t count;
    alignas(64) _Atomic uint32_t gen;
} shm_header;

struct zt_comm {
    int rank, world;
    int64_t timeout_ns;
    double timeout_s;
    char name[192];
    unsigned char *base;
    size_t map_bytes;
    shm_header *hdr;
    shm_rank *ranks;
    unsigned char *data;
    size_t slot_bytes;
    /* Counts the phases (chunks) done; its parity picks the buffer set. Two sets let a rank fill
     * the next chunk while slower ranks still read the last one, with no extra barrier. */
    uint64_t phase;
    bool unlinked;
    zt_status failed;
    char failure[REASON_LEN];
};

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_ns(int64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Sleeps until *word != val, a wake-up, or ns pass. The segment is shared between processes, so
 * these are the non-private futex operations. Returns 0 or an errno that is not a normal wake. */
static int futex_wait(_Atomic uint32_t *word, uint32_t val, int64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    if (syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0) == 0)
        return 0;
    return errno == EAGAIN || errno == ETIMEDOUT || errno == EINTR ? 0 : errno;
}

static void futex_wake_all(_Atomic uint32_t *word) {
    /* A failed wake leaves the sleepers to their next time slice, so it costs latency only. */
    (void)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Reads the state letter and start time (field 22, clock ticks since boot) of a process. */
static bool proc_stat(pid_t pid, char *state, uint64_t *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses; fields resume after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return false;
    p += 2;
    *state = *p;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return false;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return true;
}

/* Whether the process that registered as a rank still runs. A zombie counts as exited: it will
 * never arrive, and its parent may be slow to reap it. When unsure, says alive: the deadline
 * still bounds the wait. */
static bool rank_alive(pid_t pid, uint64_t start) {
    if (pid <= 0)
        return true;
    if (kill(pid, 0) == -1 && errno == ESRCH)
        return false;
    char state;
    uint64_t t;
    if (!proc_stat(pid, &state, &t))
        return true;
    if (state == 'Z' || state == 'X')
        return false;
    return start == 0 || t == start;
}

static uint64_t self_start_time(void) {
    char state;
    uint64_t t;
    return proc_stat(getpid(), &state, &t) ? t : 0;
}

/* Records a failure: the communicator is unusable afterwards. The message is also published in
 * this rank's record, and the segment marked aborted, unless another rank failed first. */
static zt_status comm_fail(zt_comm *c, zt_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static zt_status comm_fail(zt_comm *c, zt_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->failure, sizeof c->failure, fmt, ap);
    va_end(ap);
    c->failed = s;
    if (c->hdr && atomic_load_explicit(&c->hdr->aborted, memory_order_acquire) == 0) {
        shm_rank *me = &c->ranks[c->rank];
        memcpy(me->abort_reason, c->failure, sizeof me->abort_reason);
        me->abort_status = s;
        uint32_t none = 0;
        atomic_compare_exchange_strong_explicit(&c->hdr->aborted, &none, (uint32_t)c->rank + 1,
                                                memory_order_release, memory_order_relaxed);
        futex_wake_all(&c->hdr->gen);
    }
    return zt_error(s, "%s", c->failure);
}

static zt_status check_usable(zt_comm *c) {
    if (c->failed)
        return zt_error(c->failed, "communicator failed earlier: %s", c->failure);
    return ZT_OK;
}

static zt_status check_aborted(zt_comm *c, const char *what) {
    uint32_t a = atomic_load_explicit(&c->hdr->aborted, memory_order_acquire);
    if (a == 0)
        return ZT_OK;
    if (a > (uint32_t)c->world)
        return comm_fail(c, ZT_ERR_IO, "%s: shared-memory segment is corrupt", what);
    const shm_rank *r = &c->ranks[a - 1];
    zt_status s = r->abort_status < 0 ? (zt_status)r->abort_status : ZT_ERR_IO;
    return comm_fail(c, s, "%s: rank %u aborted: %.*s", what, a - 1, REASON_LEN - 1,
                     r->abort_reason);
}

/* "1, 3" for the ranks that have not arrived at barrier generation gen. */
static void missing_ranks(const zt_comm *c, uint32_t gen, char *out, size_t cap) {
    size_t len = 0;
    int named = 0, more = 0;
    out[0] = '\0';
    for (int k = 0; k < c->world; k++) {
        if (atomic_load_explicit(&c->ranks[k].arrived, memory_order_relaxed) == gen + 1)
            continue;
        if (named == MAX_NAMED_RANKS) {
            more++;
            continue;
        }
        int w = snprintf(out + len, cap - len, "%s%d", named ? ", " : "", k);
        if (w > 0 && (size_t)w < cap - len)
            len += (size_t)w;
        named++;
    }
    if (more)
        snprintf(out + len, cap - len, " and %d more", more);
}

/* Waits until every rank has arrived. rendezvous selects the wording of a timeout. */
static zt_status barrier(zt_comm *c, const char *what, bool rendezvous) {
    shm_header *h = c->hdr;
    ZT_TRY(check_aborted(c, what));
    /* The generation is read before counting in: it cannot advance until this rank is counted. */
    uint32_t g = atomic_load_explicit(&h->gen, memory_order_acquire);
    atomic_store_explicit(&c->ranks[c->rank].arrived, g + 1, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&h->count, 1, memory_order_acq_rel) == (uint32_t)c->world - 1) {
        atomic_store_explicit(&h->count, 0, memory_order_relaxed);
        atomic_store_explicit(&h->gen, g + 1, memory_order_release);
        futex_wake_all(&h->gen);
        return ZT_OK;
    }

    int64_t start = now_ns(), deadline = start + c->timeout_ns;
    int64_t next_check = start + WAIT_SLICE_NS;
    for (;;) {
        if (atomic_load_explicit(&h->gen, memory_order_acquire) != g)
            return ZT_OK;
        ZT_TRY(check_aborted(c, what));
        int64_t now = now_ns();
        if (now >= next_check) {
            for (int k = 0; k < c->world; k++) {
                const shm_rank *r = &c->ranks[k];
                if (atomic_load_explicit(&r->arrived, memory_order_relaxed) == g + 1)
                    continue;
                pid_t pid = atomic_load_explicit(&r->pid, memory_order_acquire);
                if (rank_alive(pid, r->start_time))
                    continue;
                /* A rank may arrive, complete the barrier and exit between the two loads. */
                if (atomic_load_explicit(&h->gen, memory_order_acquire) != g)
                    return ZT_OK;
                return comm_fail(c, ZT_ERR_IO, "%s: rank %d (pid %d) has exited", what, k,
                                 (int)pid);
            }
            next_check = now + WAIT_SLICE_NS;
        }
        if (now >= deadline) {
            if (atomic_load_explicit(&h->gen, memory_order_acquire) != g)
                return ZT_OK;
            char who[160];
            missing_ranks(c, g, who, sizeof who);
            if (rendezvous)
                return comm_fail(c, ZT_ERR_TIMEOUT,
                                 "rendezvous timed out after %g s waiting for rank(s) %s to "
                                 "attach to %s",
                                 c->timeout_s, who, c->name);
            return comm_fail(c, ZT_ERR_TIMEOUT,
                             "%s: collective timed out after %g s waiting for rank(s) %s", what,
                             c->timeout_s, who);
        }
        int64_t wait = (next_check < deadline ? next_check : deadline) - now;
        int err = futex_wait(&h->gen, g, wait);
        if (err)
            return comm_fail(c, ZT_ERR_IO, "%s: futex wait failed: %s", what, strerror(err));
    }
}

static const char *op_name(uint32_t kind) {
    switch (kind) {
    case OP_BARRIER: return "barrier";
    case OP_ALL_REDUCE: return "all_reduce";
    case OP_ALL_REDUCE_F64: return "all_reduce_f64";
    case OP_REDUCE_SCATTER: return "reduce_scatter";
    case OP_ALL_GATHER: return "all_gather";
    case OP_BROADCAST: return "broadcast";
    }
    return "?";
}

static void describe(const shm_desc *d, char *out, size_t cap) {
    if (d->kind == OP_BROADCAST)
        snprintf(out, cap, "%s(n=%llu, root=%u)", op_name(d->kind), (unsigned long long)d->n,
                 d->arg);
    else if (d->kind == OP_BARRIER)
        snprintf(out, cap, "barrier()");
    else if (d->kind == OP_ALL_GATHER)
        snprintf(out, cap, "%s(n=%llu)", op_name(d->kind), (unsigned long long)d->n);
    else
        snprintf(out, cap, "%s(n=%llu, op=%s)", op_name(d->kind), (unsigned long long)d->n,
                 d->arg == ZT_REDUCE_SUM ? "sum" : d->arg == ZT_REDUCE_AVG ? "avg" : "max");
}

static unsigned char *phase_set(const zt_comm *c) {
    return c->data + (size_t)(c->phase & 1) * (size_t)c->world * c->slot_bytes;
}

/* The barrier after a rank has written its part of this phase's buffer set. With desc (the first
 * phase of a collective) it also checks that every rank is running the same collective. */
static zt_status phase_sync(zt_comm *c, const shm_desc *desc, const char *what) {
    int s = (int)(c->phase & 1);
    if (desc)
        c->ranks[c->rank].desc[s] = *desc;
    ZT_TRY(barrier(c, what, false));
    if (!desc)
        return ZT_OK;
    for (int k = 0; k < c->world; k++) {
        const shm_desc *o = &c->ranks[k].desc[s];
        if (o->kind == desc->kind && o->arg == desc->arg && o->n == desc->n &&
            o->layout == desc->layout)
            continue;
        char mine[96], theirs[96];
        describe(desc, mine, sizeof mine);
        describe(o, theirs, sizeof theirs);
        if (strcmp(mine, theirs) == 0)
            return comm_fail(c, ZT_ERR_INVALID,
                             "%s: ranks disagree: rank %d and rank %d passed different "
                             "offsets/counts",
                             what, c->rank, k);
        return comm_fail(c, ZT_ERR_INVALID,
                         "%s: ranks disagree: rank %d called %s but rank %d called %s", what,
                         c->rank, mine, k, theirs);
    }
    return ZT_OK;
}

/* The reduction of one block, in rank order so that every rank computes the same bits: dst
 * starts as rank 0's contribution and each later rank's is added (or maxed) in turn. AVG is that
 * sum divided by the world size. MAX keeps a NaN from any rank, so an overflow flag survives. */
#define DEFINE_REDUCE(T, NAME)                                                               \
    static void NAME##_add(T *restrict d, const T *restrict s, size_t n) {                   \
        for (size_t i = 0; i < n; i++)                                                       \
            d[i] += s[i];                                                                    \
    }                                                                                        \
    static void NAME##_max(T *restrict d, const T *restrict s, size_t n) {                   \
        for (size_t i = 0; i < n; i++)                                                       \
            d[i] = s[i] != s[i] ? s[i] : s[i] > d[i] ? s[i] : d[i];                          \
    }                                                                                        \
    static void NAME##_div(T *d, T by, size_t n) {                                           \
        for (size_t i = 0; i < n; i++)                                                       \
            d[i] /= by;                                                                      \
    }                                                                                        \
    /* dst[0 .. hi-lo) = op over ranks k of slot k [lo, hi); dst may be slot 0 + lo. */      \
    static void NAME(T *dst, const unsigned char *set, size_t slot_bytes, int world, size_t lo, \
                     size_t hi, zt_reduce_op op) {                                           \
        /* Blocks small enough to stay in L1 while every rank's slot is folded in. */        \
        enum { BLOCK = 4096 / sizeof(T) };                                                   \
        for (size_t b = lo; b < hi; b += BLOCK) {                                            \
            size_t m = min_sz(BLOCK, hi - b);                                                \
            T *d = dst + (b - lo);                                                           \
            const T *s0 = (const T *)set + b;                                                \
            if (d != s0)                                                                     \
                memcpy(d, s0, m * sizeof(T));                                                \
            for (int k = 1; k < world; k++) {                                                \
                const T *s = (const T *)(set + (size_t)k * slot_bytes) + b;                  \
                if (op == ZT_REDUCE_MAX)                                                     \
                    NAME##_max(d, s, m);                                                     \
                else                                                                         \
                    NAME##_add(d, s, m);                                                     \
            }                                                                                \
            if (op == ZT_REDUCE_AVG)                                                         \
                NAME##_div(d, (T)world, m);                                                  \
        }                                                                                    \
    }

DEFINE_REDUCE(float, reduce_f32)
DEFINE_REDUCE(double, reduce_f64)

static zt_status check_op(zt_comm *c, const char *what, zt_reduce_op op) {
    if (op != ZT_REDUCE_SUM && op != ZT_REDUCE_AVG && op != ZT_REDUCE_MAX)
        return comm_fail(c, ZT_ERR_INVALID, "%s: unknown reduce op %d", what, (int)op);
    return ZT_OK;
}

/* Each chunk: every rank copies its contribution into its slot; each rank reduces a 1/N share of
 * the chunk over all slots, in place into slot 0; every rank copies slot 0 out. */
static zt_status all_reduce_elems(zt_comm *c, void *buf, size_t n, size_t es, zt_reduce_op op,
                                  op_kind kind) {
    const char *what = op_name(kind);
    ZT_TRY(check_usable(c));
    ZT_TRY(check_op(c, what, op));
    if (n && !buf)
        return comm_fail(c, ZT_ERR_INVALID, "%s: NULL buffer for %zu elements", what, n);
    /* One rank's sum, mean and maximum are its own values. */
    if (c->world == 1)
        return ZT_OK;
    const shm_desc desc = {kind, (uint32_t)op, n, 0};
    size_t chunk = c->slot_bytes / es, off = 0;
    unsigned char *p = buf;
    do {
        size_t m = min_sz(chunk, n - off);
        unsigned char *set = phase_set(c);
        if (m)
            memcpy(set + (size_t)c->rank * c->slot_bytes, p + off * es, m * es);
        ZT_TRY(phase_sync(c, off == 0 ? &desc : NULL, what));
        size_t lo = m * (size_t)c->rank / (size_t)c->world;
        size_t hi = m * ((size_t)c->rank + 1) / (size_t)c->world;
        if (es == sizeof(float))
            reduce_f32((float *)set + lo, set, c->slot_bytes, c->world, lo, hi, op);
        else
            reduce_f64((double *)set + lo, set, c->slot_bytes, c->world, lo, hi, op);
        ZT_TRY(barrier(c, what, false));
        if (m)
            memcpy(p + off * es, set, m * es);
        c->phase++;
        off += m;
    } while (off < n);
    return ZT_OK;
}

zt_status zt_comm_all_reduce(zt_comm *c, float *buf, size_t n, zt_reduce_op op) {
    return all_reduce_elems(c, buf, n, sizeof(float), op, OP_ALL_REDUCE);
}

zt_status zt_comm_all_reduce_f64(zt_comm *c, double *buf, size_t n, zt_reduce_op op) {
    return all_reduce_elems(c, buf, n, sizeof(double), op, OP_ALL_REDUCE_F64);
}

/* Checks that the pieces lie inside [0, n) and do not overlap, and returns the range they span
 * ([0, 0) when all are empty) and a hash of the layout for the cross-rank check. */
static zt_status check_pieces(zt_comm *c, const char *what, size_t n, const size_t *offsets,
                              const size_t *counts, size_t *lo, size_t *hi, uint64_t *hash) {
    if (!offsets || !counts)
        return comm_fail(c, ZT_ERR_INVALID, "%s: NULL offsets or counts", what);
    *lo = SIZE_MAX;
    *hi = 0;
    uint64_t h = 1469598103934665603ULL;
    for (int r = 0; r < c->world; r++) {
        if (counts[r] > n || offsets[r] > n - counts[r])
            return comm_fail(c, ZT_ERR_INVALID, "%s: piece of rank %d [%zu, +%zu) is outside n=%zu",
                             what, r, offsets[r], counts[r], n);
        for (int q = 0; q < r; q++)
            if (counts[r] && counts[q] && offsets[r] < offsets[q] + counts[q] &&
                offsets[q] < offsets[r] + counts[r])
                return comm_fail(c, ZT_ERR_INVALID, "%s: pieces of ranks %d and %d overlap", what,
                                 q, r);
        if (counts[r]) {
            *lo = min_sz(*lo, offsets[r]);
            *hi = max_sz(*hi, offsets[r] + counts[r]);
        }
        h = (h ^ offsets[r]) * 1099511628211ULL;
        h = (h ^ counts[r]) * 1099511628211ULL;
    }
    if (*hi == 0)
        *lo = 0;
    *hash = h;
    return ZT_OK;
}

/* Each chunk of the span: every rank copies its whole input chunk into its slot, and each rank
 * reduces the part of its own piece that lies in the chunk straight into out. */
zt_status zt_comm_reduce_scatter(zt_comm *c, const float *in, float *out, size_t n,
                                 const size_t *offsets, const size_t *counts, zt_reduce_op op) {
    const char *what = op_name(OP_REDUCE_SCATTER);
    ZT_TRY(check_usable(c));
    ZT_TRY(check_op(c, what, op));
    size_t lo, hi;
    uint64_t layout;
    ZT_TRY(check_pieces(c, what, n, offsets, counts, &lo, &hi, &layout));
    size_t my_off = offsets[c->rank], my_cnt = counts[c->rank];
    if ((n && !in) || (my_cnt && !out))
        return comm_fail(c, ZT_ERR_INVALID, "%s: NULL buffer", what);
    if (c->world == 1) {
        if (my_cnt)
            memmove(out, in + my_off, my_cnt * sizeof(float));
        return ZT_OK;
    }
    const shm_desc desc = {OP_REDUCE_SCATTER, (uint32_t)op, n, layout};
    size_t chunk = c->slot_bytes / sizeof(float), pos = lo;
    do {
        size_t m = min_sz(chunk, hi - pos);
        unsigned char *set = phase_set(c);
        if (m)
            memcpy(set + (size_t)c->rank * c->slot_bytes, in + pos, m * sizeof(float));
        ZT_TRY(phase_sync(c, pos == lo ? &desc : NULL, what));
        size_t a = max_sz(pos, my_off), b = min_sz(pos + m, my_off + my_cnt);
        if (a < b)
            reduce_f32(out + (a - my_off), set, c->slot_bytes, c->world, a - pos, b - pos, op);
        c->phase++;
        pos += m;
    } while (pos < hi);
    return ZT_OK;
}

/* Each chunk of the span (a whole buffer set, since pieces are disjoint): every rank writes its
 * piece's part at its place, then copies the others' parts out. */
zt_status zt_comm_all_gather(zt_comm *c, float *buf, size_t n, const size_t *offsets,
                             const size_t *counts) {
    const char *what = op_name(OP_ALL_GATHER);
    ZT_TRY(check_usable(c));
    size_t lo, hi;
    uint64_t layout;
    ZT_TRY(check_pieces(c, what, n, offsets, counts, &lo, &hi, &layout));
    if (n && !buf)
        return comm_fail(c, ZT_ERR_INVALID, "%s: NULL buffer", what);
    if (c->world == 1)
        return ZT_OK;
    const shm_desc desc = {OP_ALL_GATHER, 0, n, layout};
    size_t chunk = (size_t)c->world * c->slot_bytes / sizeof(float), pos = lo;
    do {
        size_t m = min_sz(chunk, hi - pos);
        float *set = (float *)phase_set(c);
        size_t a = max_sz(pos, offsets[c->rank]);
        size_t b = min_sz(pos + m, offsets[c->rank] + counts[c->rank]);
        if (a < b)
            memcpy(set + (a - pos), buf + a, (b - a) * sizeof(float));
        ZT_TRY(phase_sync(c, pos == lo ? &desc : NULL, what));
        for (int k = 0; k < c->world; k++) {
            a = max_sz(pos, offsets[k]);
            b = min_sz(pos + m, offsets[k] + counts[k]);
            if (k != c->rank && a < b)
                memcpy(buf + a, set + (a - pos), (b - a) * sizeof(float));
        }
        c->phase++;
        pos += m;
    } while (pos < hi);
    return ZT_OK;
}

zt_status zt_comm_broadcast(zt_comm *c, float *buf, size_t n, int root) {
    const char *what = op_name(OP_BROADCAST);
    ZT_TRY(check_usable(c));
    if (root < 0 || root >= c->world)
        return comm_fail(c, ZT_ERR_INVALID, "%s: root %d is not a rank of %d", what, root,
                         c->world);
    if (n && !buf)
        return comm_fail(c, ZT_ERR_INVALID, "%s: NULL buffer", what);
    if (c->world == 1)
        return ZT_OK;
    const shm_desc desc = {OP_BROADCAST, (uint32_t)root, n, 0};
    size_t chunk = (size_t)c->world * c->slot_bytes / sizeof(float), off = 0;
    do {
        size_t m = min_sz(chunk, n - off);
        float *set = (float *)phase_set(c);
        if (c->rank == root && m)
            memcpy(set, buf + off, m * sizeof(float));
        ZT_TRY(phase_sync(c, off == 0 ? &desc : NULL, what));
        if (c->rank != root && m)
            memcpy(buf + off, set, m * sizeof(float));
        c->phase++;
        off += m;
    } while (off < n);
    return ZT_OK;
}

zt_status zt_comm_barrier(zt_comm *c) {
    ZT_TRY(check_usable(c));
    if (c->world == 1)
        return ZT_OK;
    const shm_desc desc = {OP_BARRIER, 0, 0, 0};
    ZT_TRY(phase_sync(c, &desc, "barrier"));
    c->phase++;
    return ZT_OK;
}

int zt_comm_rank(const zt_comm *c) { return c->rank; }
int zt_comm_world_size(const zt_comm *c) { return c->world; }

static uint64_t session_nonce(void) {
    uint64_t x;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) == (ssize_t)sizeof x && x)
        return x;
    /* No entropy yet (early boot): time and pid still differ between sessions. */
    return ((uint64_t)now_ns() * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)getpid() ^ 1;
}

static void set_layout(zt_comm *c) {
    c->hdr = (shm_header *)c->base;
    c->ranks = (shm_rank *)(c->base + align_up(sizeof(shm_header), 64));
    c->data = c->base + align_up(align_up(sizeof(shm_header), 64) +
                                     (size_t)c->world * sizeof(shm_rank), 4096);
}

/* Rank 0: removes a segment a crashed run may have left under this name, creates a fresh one,
 * and publishes it by setting ready last. */
static zt_status create_segment(zt_comm *c, size_t total) {
    if (shm_unlink(c->name) != 0 && errno != ENOENT)
        return zt_error(ZT_ERR_IO, "cannot remove stale shared-memory segment %s: %s", c->name,
                        strerror(errno));
    int fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            return zt_error(ZT_ERR_IO,
                            "shared-memory segment %s was created by another process: is another "
                            "job running with the same run id?",
                            c->name);
        return zt_error(ZT_ERR_IO, "cannot create shared-memory segment %s: %s", c->name,
                        strerror(errno));
    }
    /* Reserving the pages now turns a full /dev/shm into an error here, not a SIGBUS later. */
    int err = posix_fallocate(fd, 0, (off_t)total);
    if (err == EOPNOTSUPP || err == EINVAL)
        err = ftruncate(fd, (off_t)total) == 0 ? 0 : errno;
    if (err) {
        close(fd);
        shm_unlink(c->name);
        return zt_error(ZT_ERR_IO,
                        "cannot reserve %zu MiB for shared-memory segment %s: %s (is /dev/shm "
                        "too small? Docker's default is 64 MiB; raise it with --shm-size)",
                        total >> 20, c->name, strerror(err));
    }
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    err = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(c->name);
        return zt_error(ZT_ERR_IO, "cannot map shared-memory segment %s: %s", c->name,
                        strerror(err));
    }
    c->base = p;
    c->map_bytes = total;
    set_layout(c);
    shm_header *h = c->hdr;
    h->magic = SHM_MAGIC;
    h->version = SHM_VERSION;
    h->world_size = (uint32_t)c->world;
    h->nonce = session_nonce();
    h->slot_bytes = c->slot_bytes;
    h->total_bytes = total;
    c->ranks[0].start_time = self_start_time();
    atomic_store_explicit(&c->ranks[0].pid, (int32_t)getpid(), memory_order_relaxed);
    atomic_store_explicit(&h->ready, 1, memory_order_release);
    return ZT_OK;
}

/* Whether a mapped segment is rank 0's for this session; if not, says why in why[]. */
static bool segment_usable(const zt_comm *c, const unsigned char *base, size_t size, size_t total,
                           char *why, size_t cap) {
    const shm_header *h = (const shm_header *)base;
    if (size < sizeof *h || !atomic_load_explicit(&h->ready, memory_order_acquire)) {
        snprintf(why, cap, "segment %s is not initialised yet", c->name);
        return false;
    }
    if (h->magic != SHM_MAGIC || h->version != SHM_VERSION) {
        snprintf(why, cap, "segment %s is not a ztrain version %d segment", c->name, SHM_VERSION);
        return false;
    }
    if (h->world_size != (uint32_t)c->world || h->total_bytes != total || size != total ||
        h->slot_bytes != c->slot_bytes) {
        snprintf(why, cap, "segment %.160s is for world size %u, this rank expects %d", c->name,
                 h->world_size, c->world);
        return false;
    }
    const shm_rank *r0 = (const shm_rank *)(base + align_up(sizeof(shm_header), 64));
    pid_t pid = atomic_load_explicit(&r0->pid, memory_order_relaxed);
    if (!rank_alive(pid, r0->start_time)) {
        snprintf(why, cap, "segment %.160s is left from an earlier run (its rank 0, pid %d, has exited)",
                 c->name, (int)pid);
        return false;
    }
    return true;
}

/* Ranks other than 0: poll for rank 0's segment until it is ready and current, then register. */
static zt_status attach_segment(zt_comm *c, size_t total) {
    int64_t deadline = now_ns() + c->timeout_ns;
    char why[512];
    snprintf(why, sizeof why, "segment %s does not exist yet", c->name);
    for (;;) {
        int fd = shm_open(c->name, O_RDWR | O_CLOEXEC, 0);
        if (fd < 0 && errno != ENOENT)
            return zt_error(ZT_ERR_IO, "cannot open shared-memory segment %s: %s", c->name,
                            strerror(errno));
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) != 0) {
                int err = errno;
                close(fd);
                return zt_error(ZT_ERR_IO, "cannot stat shared-memory segment %s: %s", c->name,
                                strerror(err));
            }
            size_t size = (size_t)st.st_size;
            void *p = size >= sizeof(shm_header)
                          ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                          : MAP_FAILED;
            int err = errno;
            close(fd);
            if (size >= sizeof(shm_header) && p == MAP_FAILED)
                return zt_error(ZT_ERR_IO, "cannot map shared-memory segment %s: %s", c->name,
                                strerror(err));
            if (p == MAP_FAILED) {
                snprintf(why, sizeof why, "segment %s is not sized yet", c->name);
            } else if (segment_usable(c, p, size, total, why, sizeof why)) {
                c->base = p;
                c->map_bytes = size;
                set_layout(c);
                shm_rank *me = &c->ranks[c->rank];
                me->start_time = self_start_time();
                int32_t none = 0;
                if (!atomic_compare_exchange_strong_explicit(&me->pid, &none, (int32_t)getpid(),
                                                             memory_order_release,
                                                             memory_order_relaxed))
                    return zt_error(ZT_ERR_IO,
                                    "rank %d of segment %s is already taken by pid %d: is another "
                                    "job running with the same run id?",
                                    c->rank, c->name, (int)none);
                return ZT_OK;
            } else {
                munmap(p, size);
            }
        }
        int64_t left = deadline - now_ns();
        if (left <= 0)
            return zt_error(ZT_ERR_TIMEOUT,
                            "rendezvous timed out after %g s: rank %d found no usable segment "
                            "from rank 0 (%s)",
                            c->timeout_s, c->rank, why);
        sleep_ns(left < ATTACH_POLL_NS ? left : ATTACH_POLL_NS);
    }
}

static void release(zt_comm *c) {
    if (c->rank == 0 && !c->unlinked && c->base)
        shm_unlink(c->name);
    if (c->base)
        munmap(c->base, c->map_bytes);
    free(c);
}

zt_status zt_comm_create_shm(zt_comm **out, const zt_dist_info *d, double timeout_s) {
    *out = NULL;
    if (d->world_size < 1 || d->world_size > MAX_RANKS)
        return zt_error(ZT_ERR_INVALID, "shm communicator: world size %d is not in [1, %d]",
                        d->world_size, MAX_RANKS);
    if (d->rank < 0 || d->rank >= d->world_size)
        return zt_error(ZT_ERR_INVALID, "shm communicator: rank %d is not below world size %d",
                        d->rank, d->world_size);
    if (!(timeout_s > 0 && timeout_s <= 1e9))
        return zt_error(ZT_ERR_INVALID, "shm communicator: timeout %g s is not positive",
                        timeout_s);
    size_t id_len = strnlen(d->run_id, sizeof d->run_id);
    if (id_len == 0 || id_len == sizeof d->run_id)
        return zt_error(ZT_ERR_INVALID, "shm communicator: run id is empty or not terminated");
    for (size_t i = 0; i < id_len; i++) {
        char ch = d->run_id[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-'))
            return zt_error(ZT_ERR_INVALID,
                            "shm communicator: run id '%s' may hold only [A-Za-z0-9_-]",
                            d->run_id);
    }

    zt_comm *c = calloc(1, sizeof *c);
    if (!c)
        return zt_error(ZT_ERR_NOMEM, "shm communicator: out of memory");
    c->rank = d->rank;
    c->world = d->world_size;
    c->timeout_s = timeout_s;
    c->timeout_ns = (int64_t)(timeout_s * 1e9);
    snprintf(c->name, sizeof c->name, "/ztrain-%u-%s", (unsigned)getuid(), d->run_id);
    c->slot_bytes = SET_BYTES / (size_t)c->world / 4096 * 4096;
    c->slot_bytes = max_sz(SLOT_MIN_BYTES, min_sz(SLOT_MAX_BYTES, c->slot_bytes));
    size_t data_off = align_up(align_up(sizeof(shm_header), 64) + (size_t)c->world * sizeof(shm_rank),
                               4096);
    size_t total = data_off + 2 * (size_t)c->world * c->slot_bytes;

    zt_status s = c->rank == 0 ? create_segment(c, total) : attach_segment(c, total);
    if (s == ZT_OK)
        s = barrier(c, "rendezvous", true);
    /* Once every rank has mapped the segment the name is no longer needed; removing it now means
     * no crash, however abrupt, can leave it behind in /dev/shm. */
    if (c->rank == 0 && c->base) {
        if (shm_unlink(c->name) == 0 || errno == ENOENT) {
            c->unlinked = true;
        } else if (s == ZT_OK) {
            s = comm_fail(c, ZT_ERR_IO, "cannot remove shared-memory segment name %s: %s",
                          c->name, strerror(errno));
        }
    }
    if (s != ZT_OK) {
        release(c);
        return s;
    }
    *out = c;
    return ZT_OK;
}

void zt_comm_destroy(zt_comm *c) {
    if (c)
        release(c);
}
