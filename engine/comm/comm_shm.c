/* The shared-memory transport ("shm"): ranks on one host exchange data through one POSIX
 * shared-memory segment and wait for each other on a futex barrier that lives in it. This file
 * holds the segment's life, the barrier and the collectives; comm_shm_p2p.c the point-to-point
 * channels; comm_shm_claim.c which process runs each rank, so that two with one RANK are an error.
 *
 * Every wait is bounded by the communicator's timeout and watches the processes of the ranks it
 * waits for, so a dead or stuck peer becomes an error that names it. The first rank to fail marks
 * the segment aborted, and the others stop at their next wait instead of running into their own
 * timeouts. Ranks must share a PID namespace (one container, or the host), as torchrun's do. */
#define _GNU_SOURCE /* getrandom; before any header */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "comm_shm.h"

#define SHM_MAGIC 0x6d68736e69617274ULL /* "trainshm" */
enum { SHM_VERSION = 2, MAX_NAMED_RANKS = 16 };

/* Collective data lives in two buffer sets of SET_BYTES each, split into one slot per rank: 16 MiB
 * in all, well under Docker's default 64 MiB /dev/shm whatever the world size. Larger operations
 * go through in chunks of a slot (reductions) or of a whole set (copies). */
#define SET_BYTES ((size_t)8 << 20)
#define SLOT_MAX_BYTES ((size_t)4 << 20)
#define SLOT_MIN_BYTES ((size_t)16 << 10)

/* Point-to-point channels share RINGS_BYTES (8 MiB), whatever the world size. A channel per
 * ordered pair grows as world², far past any /dev/shm at ZT_MAX_WORLD (262,144 pairs), and
 * separate segments made on first use could outlive a crash in /dev/shm. So a channel is handed
 * to a pair by its sender on the pair's first message, from a pool made with the segment: every
 * ordered pair gets one while there are at most MIN_CHANNELS pairs (worlds up to 23), and beyond
 * that there are max(MIN_CHANNELS, 4 × world) channels, enough for every rank to talk to four
 * others (a pipeline stage talks to two; an exhausted pool is an error naming the pair). Rings
 * are RINGS_BYTES over the channel count, between 4 KiB and 1 MiB: a message larger than its ring
 * streams through it while the receiver drains it. */
#define RINGS_BYTES ((size_t)8 << 20)
#define CHANNEL_MAX_BYTES ((size_t)1 << 20)
#define CHANNEL_MIN_BYTES ((size_t)4 << 10)
enum { MIN_CHANNELS = 512 };

/* How often a rank polls for rank 0's segment while attaching. */
#define ATTACH_POLL_NS 10000000LL

typedef enum {
    OP_BARRIER = 1,
    OP_ALL_REDUCE,
    OP_REDUCE_SCATTER,
    OP_ALL_GATHER,
    OP_BROADCAST,
} op_kind;

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

static zt_shm_comm *shm(zt_comm *c) { return (zt_shm_comm *)c; }

static zt_shm_plan plan_segment(int world) {
    zt_shm_plan p;
    size_t w = (size_t)world, pairs = w * (w - 1);
    p.slot_bytes = max_sz(SLOT_MIN_BYTES, min_sz(SLOT_MAX_BYTES, SET_BYTES / w / 4096 * 4096));
    p.channels = (uint32_t)min_sz(pairs, max_sz(MIN_CHANNELS, 4 * w));
    p.channel_bytes = p.channels ? RINGS_BYTES / p.channels / 4096 * 4096 : 0;
    p.channel_bytes = max_sz(CHANNEL_MIN_BYTES, min_sz(CHANNEL_MAX_BYTES, p.channel_bytes));
    p.ranks_off = align_up(sizeof(zt_shm_header), 64);
    p.pairs_off = align_up(p.ranks_off + w * sizeof(zt_shm_rank), 64);
    p.channels_off = align_up(p.pairs_off + w * w * sizeof(uint64_t), 64);
    p.sets_off = align_up(p.channels_off + p.channels * sizeof(zt_shm_channel), 4096);
    p.rings_off = p.sets_off + 2 * w * p.slot_bytes;
    p.total = p.rings_off + p.channels * p.channel_bytes;
    return p;
}

static void sleep_ns(int64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
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
static bool pid_alive(pid_t pid, uint64_t start) {
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

bool zt_shm_rank_alive(const zt_shm_comm *c, int r) {
    const zt_shm_rank *k = &c->ranks[r];
    return pid_alive(atomic_load_explicit(&k->pid, memory_order_acquire), k->start_time);
}

static uint64_t self_start_time(void) {
    char state;
    uint64_t t;
    return proc_stat(getpid(), &state, &t) ? t : 0;
}

/* Publishes this rank's failure in its record and marks the segment aborted, unless another rank
 * failed first; then wakes every rank, whether it sleeps in the barrier or on its bell. */
static void shm_abort(zt_comm *cc) {
    zt_shm_comm *c = shm(cc);
    if (!c->hdr || atomic_load_explicit(&c->hdr->aborted, memory_order_acquire) != 0)
        return;
    zt_shm_rank *me = &c->ranks[cc->rank];
    memcpy(me->abort_reason, cc->failure, sizeof me->abort_reason);
    me->abort_status = cc->failed;
    uint32_t none = 0;
    atomic_compare_exchange_strong_explicit(&c->hdr->aborted, &none, (uint32_t)cc->rank + 1,
                                            memory_order_release, memory_order_relaxed);
    zt_shm_futex_wake_all(&c->hdr->gen);
    for (int k = 0; k < cc->world; k++)
        zt_shm_ring(c, k);
}

zt_status zt_shm_check_aborted(zt_shm_comm *c, const char *what) {
    uint32_t a = atomic_load_explicit(&c->hdr->aborted, memory_order_acquire);
    if (a == 0)
        return ZT_OK;
    if (a > (uint32_t)c->comm.world)
        return zt_comm_fail(&c->comm, ZT_ERR_IO, "%s: shared-memory segment is corrupt", what);
    const zt_shm_rank *r = &c->ranks[a - 1];
    zt_status s = r->abort_status < 0 ? (zt_status)r->abort_status : ZT_ERR_IO;
    return zt_comm_fail(&c->comm, s, "%s: rank %u aborted: %.*s", what, a - 1,
                        ZT_COMM_REASON_LEN - 1, r->abort_reason);
}

/* "1, 3" for the ranks that have not arrived at barrier generation gen. */
static void missing_ranks(const zt_shm_comm *c, uint32_t gen, char *out, size_t cap) {
    size_t len = 0;
    int named = 0, more = 0;
    out[0] = '\0';
    for (int k = 0; k < c->comm.world; k++) {
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
static zt_status barrier(zt_shm_comm *c, const char *what, bool rendezvous) {
    zt_shm_header *h = c->hdr;
    int world = c->comm.world;
    ZT_TRY(zt_shm_check_aborted(c, what));
    /* The generation is read before counting in: it cannot advance until this rank is counted. */
    uint32_t g = atomic_load_explicit(&h->gen, memory_order_acquire);
    atomic_store_explicit(&c->ranks[c->comm.rank].arrived, g + 1, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&h->count, 1, memory_order_acq_rel) == (uint32_t)world - 1) {
        atomic_store_explicit(&h->count, 0, memory_order_relaxed);
        atomic_store_explicit(&h->gen, g + 1, memory_order_release);
        zt_shm_futex_wake_all(&h->gen);
        return ZT_OK;
    }

    int64_t start = zt_shm_now_ns(), deadline = start + c->timeout_ns;
    int64_t next_check = start + ZT_SHM_WAIT_SLICE_NS;
    for (;;) {
        if (atomic_load_explicit(&h->gen, memory_order_acquire) != g)
            return ZT_OK;
        ZT_TRY(zt_shm_check_aborted(c, what));
        int64_t now = zt_shm_now_ns();
        if (now >= next_check) {
            for (int k = 0; k < world; k++) {
                const zt_shm_rank *r = &c->ranks[k];
                if (atomic_load_explicit(&r->arrived, memory_order_relaxed) == g + 1)
                    continue;
                if (zt_shm_rank_alive(c, k))
                    continue;
                /* A rank may arrive, complete the barrier and exit between the two loads. */
                if (atomic_load_explicit(&h->gen, memory_order_acquire) != g)
                    return ZT_OK;
                return zt_comm_fail(&c->comm, ZT_ERR_IO, "%s: rank %d (pid %d) has exited", what,
                                    k, (int)atomic_load(&r->pid));
            }
            next_check = now + ZT_SHM_WAIT_SLICE_NS;
        }
        if (rendezvous && zt_comm_stop_requested()) {
            char who[160];
            missing_ranks(c, g, who, sizeof who);
            return zt_comm_fail(&c->comm, ZT_ERR_STOPPED,
                                "rendezvous: a stop was asked for while waiting for rank(s) %s "
                                "to attach to %s",
                                who, c->name);
        }
        if (now >= deadline) {
            if (atomic_load_explicit(&h->gen, memory_order_acquire) != g)
                return ZT_OK;
            char who[160];
            missing_ranks(c, g, who, sizeof who);
            if (rendezvous)
                return zt_comm_fail(&c->comm, ZT_ERR_TIMEOUT,
                                    "rendezvous timed out after %g s waiting for rank(s) %s to "
                                    "attach to %s",
                                    c->comm.timeout_s, who, c->name);
            return zt_comm_fail(&c->comm, ZT_ERR_TIMEOUT,
                                "%s: collective timed out after %g s waiting for rank(s) %s",
                                what, c->comm.timeout_s, who);
        }
        int64_t wait = (next_check < deadline ? next_check : deadline) - now;
        int err = zt_shm_futex_wait(&h->gen, g, wait);
        if (err)
            return zt_comm_fail(&c->comm, ZT_ERR_IO, "%s: futex wait failed: %s", what,
                                strerror(err));
    }
}

static const char *op_name(uint32_t kind) {
    switch (kind) {
    case OP_BARRIER: return "barrier";
    case OP_ALL_REDUCE: return "all_reduce";
    case OP_REDUCE_SCATTER: return "reduce_scatter";
    case OP_ALL_GATHER: return "all_gather";
    case OP_BROADCAST: return "broadcast";
    }
    return "?";
}

/* "bf16 all_reduce(n=10, op=sum)", "barrier()". */
static void describe(const zt_shm_desc *d, char *out, size_t cap) {
    const char *t = zt_dtype_name((zt_dtype)d->dtype);
    unsigned long long n = (unsigned long long)d->n;
    if (d->kind == OP_BROADCAST)
        snprintf(out, cap, "%s %s(n=%llu, root=%u)", t, op_name(d->kind), n, d->arg);
    else if (d->kind == OP_BARRIER)
        snprintf(out, cap, "barrier()");
    else if (d->kind == OP_ALL_GATHER)
        snprintf(out, cap, "%s %s(n=%llu)", t, op_name(d->kind), n);
    else
        snprintf(out, cap, "%s %s(n=%llu, op=%s)", t, op_name(d->kind), n,
                 d->arg == ZT_REDUCE_SUM ? "sum" : d->arg == ZT_REDUCE_AVG ? "avg" : "max");
}

static unsigned char *phase_set(const zt_shm_comm *c) {
    return c->sets + (size_t)(c->phase & 1) * (size_t)c->comm.world * c->plan.slot_bytes;
}

static unsigned char *my_slot(const zt_shm_comm *c, unsigned char *set) {
    return set + (size_t)c->comm.rank * c->plan.slot_bytes;
}

/* The barrier after a rank has written its part of this phase's buffer set. With desc (the first
 * phase of a collective) it also checks that every rank is running the same collective. */
static zt_status phase_sync(zt_shm_comm *c, const zt_shm_desc *desc, const char *what) {
    int s = (int)(c->phase & 1);
    if (desc)
        c->ranks[c->comm.rank].desc[s] = *desc;
    ZT_TRY(barrier(c, what, false));
    if (!desc)
        return ZT_OK;
    for (int k = 0; k < c->comm.world; k++) {
        const zt_shm_desc *o = &c->ranks[k].desc[s];
        if (o->kind == desc->kind && o->arg == desc->arg && o->n == desc->n &&
            o->layout == desc->layout && o->dtype == desc->dtype)
            continue;
        char mine[96], theirs[96];
        describe(desc, mine, sizeof mine);
        describe(o, theirs, sizeof theirs);
        if (strcmp(mine, theirs) == 0)
            return zt_comm_fail(&c->comm, ZT_ERR_INVALID,
                                "%s: ranks disagree: rank %d and rank %d passed different "
                                "offsets/counts",
                                what, c->comm.rank, k);
        return zt_comm_fail(&c->comm, ZT_ERR_INVALID,
                            "%s: ranks disagree: rank %d called %s but rank %d called %s", what,
                            c->comm.rank, mine, k, theirs);
    }
    return ZT_OK;
}

/* Each chunk: every rank copies its contribution into its slot; each rank reduces a 1/N share of
 * the chunk over all slots, in place into slot 0; every rank copies slot 0 out. */
static zt_status shm_all_reduce(zt_comm *cc, void *buf, size_t n, zt_dtype t, zt_reduce_op op) {
    zt_shm_comm *c = shm(cc);
    const char *what = op_name(OP_ALL_REDUCE);
    /* One rank's sum, mean and maximum are its own values. */
    if (cc->world == 1)
        return ZT_OK;
    const zt_shm_desc desc = {OP_ALL_REDUCE, (uint32_t)op, n, 0, (uint32_t)t, 0};
    size_t es = zt_dtype_size(t), chunk = c->plan.slot_bytes / es, off = 0;
    unsigned char *p = buf;
    do {
        size_t m = min_sz(chunk, n - off);
        unsigned char *set = phase_set(c);
        if (m)
            memcpy(my_slot(c, set), p + off * es, m * es);
        ZT_TRY(phase_sync(c, off == 0 ? &desc : NULL, what));
        size_t lo = m * (size_t)cc->rank / (size_t)cc->world;
        size_t hi = m * ((size_t)cc->rank + 1) / (size_t)cc->world;
        zt_comm_reduce(set + lo * es, set + lo * es, c->plan.slot_bytes, cc->world, hi - lo, t,
                       op);
        ZT_TRY(barrier(c, what, false));
        if (m)
            memcpy(p + off * es, set, m * es);
        c->phase++;
        off += m;
    } while (off < n);
    return ZT_OK;
}

/* The range the pieces span ([0, 0) when all are empty) and a hash of the layout for the
 * cross-rank check. comm.c has checked that the pieces lie inside [0, n) and are disjoint. */
static void span(int world, const size_t *offsets, const size_t *counts, size_t *lo, size_t *hi,
                 uint64_t *hash) {
    uint64_t h = 1469598103934665603ULL;
    *lo = SIZE_MAX;
    *hi = 0;
    for (int r = 0; r < world; r++) {
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
}

/* Each chunk of the span: every rank copies its whole input chunk into its slot, and each rank
 * reduces the part of its own piece that lies in the chunk straight into out. */
static zt_status shm_reduce_scatter(zt_comm *cc, const void *in, void *out, size_t n,
                                    const size_t *offsets, const size_t *counts, zt_dtype t,
                                    zt_reduce_op op) {
    zt_shm_comm *c = shm(cc);
    const char *what = op_name(OP_REDUCE_SCATTER);
    size_t es = zt_dtype_size(t), my_off = offsets[cc->rank], my_cnt = counts[cc->rank];
    const unsigned char *src = in;
    unsigned char *dst = out;
    if (cc->world == 1) {
        if (my_cnt)
            memmove(dst, src + my_off * es, my_cnt * es);
        return ZT_OK;
    }
    size_t lo, hi;
    uint64_t layout;
    span(cc->world, offsets, counts, &lo, &hi, &layout);
    const zt_shm_desc desc = {OP_REDUCE_SCATTER, (uint32_t)op, n, layout, (uint32_t)t, 0};
    size_t chunk = c->plan.slot_bytes / es, pos = lo;
    do {
        size_t m = min_sz(chunk, hi - pos);
        unsigned char *set = phase_set(c);
        if (m)
            memcpy(my_slot(c, set), src + pos * es, m * es);
        ZT_TRY(phase_sync(c, pos == lo ? &desc : NULL, what));
        size_t a = max_sz(pos, my_off), b = min_sz(pos + m, my_off + my_cnt);
        if (a < b)
            zt_comm_reduce(dst + (a - my_off) * es, set + (a - pos) * es, c->plan.slot_bytes,
                           cc->world, b - a, t, op);
        c->phase++;
        pos += m;
    } while (pos < hi);
    return ZT_OK;
}

/* Each chunk of the span (a whole buffer set, since pieces are disjoint): every rank writes its
 * piece's part at its place, then copies the others' parts out. */
static zt_status shm_all_gather(zt_comm *cc, void *buf, size_t n, const size_t *offsets,
                                const size_t *counts, zt_dtype t) {
    zt_shm_comm *c = shm(cc);
    const char *what = op_name(OP_ALL_GATHER);
    if (cc->world == 1)
        return ZT_OK;
    size_t lo, hi;
    uint64_t layout;
    span(cc->world, offsets, counts, &lo, &hi, &layout);
    const zt_shm_desc desc = {OP_ALL_GATHER, 0, n, layout, (uint32_t)t, 0};
    size_t es = zt_dtype_size(t), chunk = (size_t)cc->world * c->plan.slot_bytes / es, pos = lo;
    unsigned char *p = buf;
    do {
        size_t m = min_sz(chunk, hi - pos);
        unsigned char *set = phase_set(c);
        size_t a = max_sz(pos, offsets[cc->rank]);
        size_t b = min_sz(pos + m, offsets[cc->rank] + counts[cc->rank]);
        if (a < b)
            memcpy(set + (a - pos) * es, p + a * es, (b - a) * es);
        ZT_TRY(phase_sync(c, pos == lo ? &desc : NULL, what));
        for (int k = 0; k < cc->world; k++) {
            a = max_sz(pos, offsets[k]);
            b = min_sz(pos + m, offsets[k] + counts[k]);
            if (k != cc->rank && a < b)
                memcpy(p + a * es, set + (a - pos) * es, (b - a) * es);
        }
        c->phase++;
        pos += m;
    } while (pos < hi);
    return ZT_OK;
}

static zt_status shm_broadcast(zt_comm *cc, void *buf, size_t n, zt_dtype t, int root) {
    zt_shm_comm *c = shm(cc);
    const char *what = op_name(OP_BROADCAST);
    if (cc->world == 1)
        return ZT_OK;
    const zt_shm_desc desc = {OP_BROADCAST, (uint32_t)root, n, 0, (uint32_t)t, 0};
    size_t es = zt_dtype_size(t), chunk = (size_t)cc->world * c->plan.slot_bytes / es, off = 0;
    unsigned char *p = buf;
    do {
        size_t m = min_sz(chunk, n - off);
        unsigned char *set = phase_set(c);
        if (cc->rank == root && m)
            memcpy(set, p + off * es, m * es);
        ZT_TRY(phase_sync(c, off == 0 ? &desc : NULL, what));
        if (cc->rank != root && m)
            memcpy(p + off * es, set, m * es);
        c->phase++;
        off += m;
    } while (off < n);
    return ZT_OK;
}

static zt_status shm_barrier(zt_comm *cc) {
    zt_shm_comm *c = shm(cc);
    if (cc->world == 1)
        return ZT_OK;
    const zt_shm_desc desc = {OP_BARRIER, 0, 0, 0, 0, 0};
    ZT_TRY(phase_sync(c, &desc, "barrier"));
    c->phase++;
    return ZT_OK;
}

static uint64_t session_nonce(void) {
    uint64_t x;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) == (ssize_t)sizeof x && x)
        return x;
    /* No entropy yet (early boot): time and pid still differ between sessions. */
    return ((uint64_t)zt_shm_now_ns() * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)getpid() ^ 1;
}

static void set_layout(zt_shm_comm *c) {
    c->hdr = (zt_shm_header *)c->base;
    c->ranks = (zt_shm_rank *)(c->base + c->plan.ranks_off);
    c->pairs = (_Atomic uint64_t *)(c->base + c->plan.pairs_off);
    c->channels = (zt_shm_channel *)(c->base + c->plan.channels_off);
    c->sets = c->base + c->plan.sets_off;
    c->rings = c->base + c->plan.rings_off;
}

/* The pid of the live rank 0 of a segment already under c's name, or 0 when there is none (no
 * segment, one not published yet, or one whose rank 0 has exited: a crashed run's). The rank
 * claim (comm_shm_claim.c) finds a second rank 0 first; this keeps one that the claim cannot see
 * (another network namespace) from removing a live job's segment while its ranks meet. */
static pid_t segment_owner(const zt_shm_comm *c) {
    int fd = shm_open(c->name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct stat st;
    size_t need = c->plan.ranks_off + sizeof(zt_shm_rank);
    void *p = fstat(fd, &st) == 0 && (size_t)st.st_size >= need
                  ? mmap(NULL, need, PROT_READ, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED)
        return 0;
    const zt_shm_header *h = p;
    const zt_shm_rank *r0 = (const zt_shm_rank *)((const unsigned char *)p + c->plan.ranks_off);
    pid_t pid = 0;
    if (atomic_load_explicit(&h->ready, memory_order_acquire) && h->magic == SHM_MAGIC &&
        h->version == SHM_VERSION) {
        pid = atomic_load_explicit(&r0->pid, memory_order_relaxed);
        if (pid == getpid() || !pid_alive(pid, r0->start_time))
            pid = 0;
    }
    munmap(p, need);
    return pid;
}

/* Rank 0: removes a segment a crashed run may have left under this name, creates a fresh one,
 * and publishes it by setting ready last. A segment whose rank 0 still runs is another
 * process's with this RANK, and is left alone. */
static zt_status create_segment(zt_shm_comm *c) {
    size_t total = c->plan.total;
    pid_t owner = segment_owner(c);
    if (owner)
        return zt_error(ZT_ERR_INVALID,
                        "shm rendezvous: rank 0 of %s is already run by pid %d on this host: two "
                        "processes have RANK=0 (is another job running with the same run id or "
                        "MASTER_PORT?)",
                        c->name, (int)owner);
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
    zt_shm_header *h = c->hdr;
    h->magic = SHM_MAGIC;
    h->version = SHM_VERSION;
    h->world_size = (uint32_t)c->comm.world;
    h->nonce = session_nonce();
    h->slot_bytes = c->plan.slot_bytes;
    h->channel_bytes = c->plan.channel_bytes;
    h->channels = c->plan.channels;
    h->total_bytes = total;
    c->ranks[0].start_time = self_start_time();
    atomic_store_explicit(&c->ranks[0].pid, (int32_t)getpid(), memory_order_relaxed);
    atomic_store_explicit(&h->ready, 1, memory_order_release);
    return ZT_OK;
}

/* Whether a mapped segment is rank 0's for this session; if not, says why in why[]. */
static bool segment_usable(const zt_shm_comm *c, const unsigned char *base, size_t size,
                           char *why, size_t cap) {
    const zt_shm_header *h = (const zt_shm_header *)base;
    if (size < sizeof *h || !atomic_load_explicit(&h->ready, memory_order_acquire)) {
        snprintf(why, cap, "segment %s is not initialised yet", c->name);
        return false;
    }
    if (h->magic != SHM_MAGIC || h->version != SHM_VERSION) {
        snprintf(why, cap, "segment %s is not a ztrain version %d segment", c->name, SHM_VERSION);
        return false;
    }
    const zt_shm_plan *p = &c->plan;
    if (h->world_size != (uint32_t)c->comm.world || h->total_bytes != p->total ||
        size != p->total || h->slot_bytes != p->slot_bytes ||
        h->channel_bytes != p->channel_bytes || h->channels != p->channels) {
        snprintf(why, cap, "segment %.160s is for world size %u, this rank expects %d", c->name,
                 h->world_size, c->comm.world);
        return false;
    }
    const zt_shm_rank *r0 = (const zt_shm_rank *)(base + p->ranks_off);
    pid_t pid = atomic_load_explicit(&r0->pid, memory_order_relaxed);
    if (!pid_alive(pid, r0->start_time)) {
        snprintf(why, cap, "segment %.160s is left from an earlier run (its rank 0, pid %d, has exited)",
                 c->name, (int)pid);
        return false;
    }
    return true;
}

/* Whether a segment that segment_usable refused belongs to a live rank 0 started for another world
 * size: ranks started with different WORLD_SIZEs, which waiting does not mend (a stale segment's
 * rank 0 has exited, and a new one will replace it). Says so in why[]. */
static bool live_rank0_other_world(const zt_shm_comm *c, const unsigned char *base, size_t size,
                                   char *why, size_t cap) {
    const zt_shm_header *h = (const zt_shm_header *)base;
    if (size < c->plan.ranks_off + sizeof(zt_shm_rank) ||
        !atomic_load_explicit(&h->ready, memory_order_acquire) || h->magic != SHM_MAGIC ||
        h->version != SHM_VERSION || h->world_size == (uint32_t)c->comm.world)
        return false;
    const zt_shm_rank *r0 = (const zt_shm_rank *)(base + c->plan.ranks_off);
    pid_t pid = atomic_load_explicit(&r0->pid, memory_order_relaxed);
    if (!pid_alive(pid, r0->start_time))
        return false;
    snprintf(why, cap,
             "rank %d has world size %d (WORLD_SIZE) but rank 0 (pid %d), whose segment %.160s it "
             "found, has %u: the ranks were started for different jobs",
             c->comm.rank, c->comm.world, (int)pid, c->name, h->world_size);
    return true;
}

static void segment_name(const char *run_id, char *buf, size_t cap) {
    snprintf(buf, cap, "/ztrain-%u-%s", (unsigned)getuid(), run_id);
}

void zt_comm_shm_remove_leftover(const char *run_id) {
    char name[sizeof ((zt_shm_comm *)0)->name];
    segment_name(run_id, name, sizeof name);
    shm_unlink(name);
}

/* Ranks other than 0: poll for rank 0's segment until it is ready and current, then register. */
static zt_status attach_segment(zt_shm_comm *c) {
    int64_t deadline = zt_shm_now_ns() + c->timeout_ns;
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
            void *p = size >= sizeof(zt_shm_header)
                          ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                          : MAP_FAILED;
            int err = errno;
            close(fd);
            if (size >= sizeof(zt_shm_header) && p == MAP_FAILED)
                return zt_error(ZT_ERR_IO, "cannot map shared-memory segment %s: %s", c->name,
                                strerror(err));
            if (p == MAP_FAILED) {
                snprintf(why, sizeof why, "segment %s is not sized yet", c->name);
            } else if (segment_usable(c, p, size, why, sizeof why)) {
                c->base = p;
                c->map_bytes = size;
                set_layout(c);
                zt_shm_rank *me = &c->ranks[c->comm.rank];
                me->start_time = self_start_time();
                int32_t none = 0;
                if (!atomic_compare_exchange_strong_explicit(&me->pid, &none, (int32_t)getpid(),
                                                             memory_order_release,
                                                             memory_order_relaxed))
                    return zt_error(ZT_ERR_IO,
                                    "rank %d of segment %s is already taken by pid %d: is another "
                                    "job running with the same run id?",
                                    c->comm.rank, c->name, (int)none);
                return ZT_OK;
            } else if (live_rank0_other_world(c, p, size, why, sizeof why)) {
                munmap(p, size);
                return zt_error(ZT_ERR_INVALID, "rendezvous: %s", why);
            } else {
                munmap(p, size);
            }
        }
        int64_t left = deadline - zt_shm_now_ns();
        if (zt_comm_stop_requested())
            return zt_error(ZT_ERR_STOPPED,
                            "rendezvous: a stop was asked for while rank %d waited for rank 0's "
                            "segment (%s)",
                            c->comm.rank, why);
        if (left <= 0)
            return zt_error(ZT_ERR_TIMEOUT,
                            "rendezvous timed out after %g s: rank %d found no usable segment "
                            "from rank 0 (%s)",
                            c->comm.timeout_s, c->comm.rank, why);
        sleep_ns(left < ATTACH_POLL_NS ? left : ATTACH_POLL_NS);
    }
}

static void release(zt_shm_comm *c) {
    if (c->comm.rank == 0 && !c->unlinked && c->base)
        shm_unlink(c->name);
    if (c->base)
        munmap(c->base, c->map_bytes);
    zt_shm_release_rank(c);
    free(c);
}

static zt_status shm_create(zt_comm **out, const zt_dist_info *d, double timeout_s) {
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

    zt_shm_comm *c = calloc(1, sizeof *c);
    if (!c)
        return zt_error(ZT_ERR_NOMEM, "shm communicator: out of memory");
    zt_comm_init_header(&c->comm, &zt_comm_shm_ops, d, timeout_s);
    c->timeout_ns = (int64_t)(timeout_s * 1e9);
    segment_name(d->run_id, c->name, sizeof c->name);
    c->plan = plan_segment(d->world_size);
    c->claim_fd = -1;

    /* The claim comes first: a second process with this RANK must fail before it touches the
     * segment of the job the first one runs. */
    zt_status s = zt_shm_claim_rank(c);
    if (s == ZT_OK)
        s = d->rank == 0 ? create_segment(c) : attach_segment(c);
    if (s == ZT_OK)
        s = barrier(c, "rendezvous", true);
    /* Once every rank has mapped the segment the name is no longer needed; removing it now means
     * no crash, however abrupt, can leave it behind in /dev/shm. */
    if (d->rank == 0 && c->base) {
        if (shm_unlink(c->name) == 0 || errno == ENOENT) {
            c->unlinked = true;
        } else if (s == ZT_OK) {
            s = zt_comm_fail(&c->comm, ZT_ERR_IO, "cannot remove shared-memory segment name %s: %s",
                             c->name, strerror(errno));
        }
    }
    if (s != ZT_OK) {
        release(c);
        return s;
    }
    *out = &c->comm;
    return ZT_OK;
}

static void shm_destroy(zt_comm *c) { release(shm(c)); }

const zt_comm_ops zt_comm_shm_ops = {
    .name = "shm",
    .create = shm_create,
    .destroy = shm_destroy,
    .abort = shm_abort,
    .all_reduce = shm_all_reduce,
    .reduce_scatter = shm_reduce_scatter,
    .all_gather = shm_all_gather,
    .broadcast = shm_broadcast,
    .barrier = shm_barrier,
    .send = zt_shm_send,
    .recv = zt_shm_recv,
};
