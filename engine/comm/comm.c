/* The communicator's public functions: the argument checks that hold for every transport, then a
 * call through the communicator's table (engine/comm/comm_transport.h). A bad argument fails the
 * communicator like any other failure, so the peers, which would otherwise wait for this rank
 * until their timeout, stop at once. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm_transport.h"

/* Milliseconds this thread has spent inside the collectives and messages below, or waiting for
 * ones run by another thread (zt_comm_add_wait_ms): what the step breakdown calls
 * communication. Per thread, so ZeRO's communication thread, whose collectives overlap the
 * training thread's compute, does not count as the training thread's wait. */
static _Thread_local double thread_comm_ms;
/* Calls of this thread in progress: a group's collective (comm_group.c) runs as its parent's
 * messages, which must not count a second time. */
static _Thread_local int thread_comm_depth;

static double monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double zt_comm_thread_ms(void) { return thread_comm_ms; }
void zt_comm_add_wait_ms(double ms) { thread_comm_ms += ms; }

/* Returns the transport's call, timed into this thread's communication time (the outermost
 * call only). */
#define RETURN_TIMED(call)                                                                        \
    do {                                                                                          \
        double t0_ = monotonic_ms();                                                              \
        thread_comm_depth++;                                                                      \
        zt_status s_ = (call);                                                                    \
        if (--thread_comm_depth == 0)                                                             \
            thread_comm_ms += monotonic_ms() - t0_;                                               \
        return s_;                                                                                \
    } while (0)

/* Every transport ztrain knows of. ops is NULL where this build lacks it, and then absent says
 * why and how to get it; a transport's file, once written, replaces "planned" with the option
 * that builds it. */
static const struct {
    const char *name;
    const zt_comm_ops *ops;
    const char *absent;
} transports[] = {
    {"shm", &zt_comm_shm_ops, NULL},
#ifdef ZT_HAVE_GLOO
    {"gloo", &zt_comm_gloo_ops, NULL},
#else
    {"gloo", NULL, "CPU ranks across hosts: install libgloo-dev and configure again (-DZT_GLOO=ON)"},
#endif
#ifdef ZT_HAVE_NCCL
    {"nccl", &zt_comm_nccl_ops, NULL},
#else
    {"nccl", NULL,
     "GPU buffers: configure with the CUDA toolkit and its NCCL present (-DZT_CUDA=ON)"},
#endif
};
enum { N_TRANSPORTS = sizeof transports / sizeof *transports };

zt_status zt_comm_fail(zt_comm *c, zt_status s, const char *fmt, ...) {
    bool first = c->failed == ZT_OK;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->failure, sizeof c->failure, fmt, ap);
    va_end(ap);
    c->failed = s;
    if (first)
        c->ops->abort(c);
    return zt_error(s, "%s", c->failure);
}

/* Lists the transports this build has (lacking = false: "shm") or lacks (true: "gloo (planned:
 * ...); nccl (...)") into out. */
static void list_transports(bool lacking, char *out, size_t cap) {
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < N_TRANSPORTS; i++) {
        if (!transports[i].ops != lacking)
            continue;
        int w = lacking ? snprintf(out + len, cap - len, "%s%s (%s)", len ? "; " : "",
                                   transports[i].name, transports[i].absent)
                        : snprintf(out + len, cap - len, "%s%s", len ? ", " : "",
                                   transports[i].name);
        if (w > 0 && (size_t)w < cap - len)
            len += (size_t)w;
    }
}

static const volatile sig_atomic_t *stop_flag;

void zt_comm_set_stop_flag(const volatile sig_atomic_t *flag) {
    stop_flag = flag;
}

bool zt_comm_stop_requested(void) {
    return stop_flag && *stop_flag;
}

zt_status zt_comm_create(zt_comm **out, const char *transport, const zt_dist_info *d,
                         double timeout_s) {
    *out = NULL;
    char have[128], planned[512];
    list_transports(false, have, sizeof have);
    list_transports(true, planned, sizeof planned);
    const zt_comm_ops *ops = NULL;
    for (int i = 0; i < N_TRANSPORTS && transport && !ops; i++) {
        if (strcmp(transport, transports[i].name) != 0)
            continue;
        if (!transports[i].ops)
            return zt_error(ZT_ERR_INVALID,
                            "comm: this build lacks transport \"%s\" (%s); this build has: %s",
                            transport, transports[i].absent, have);
        ops = transports[i].ops;
    }
    if (!ops)
        return zt_error(ZT_ERR_INVALID, "comm: unknown transport \"%s\"; this build has: %s%s%s",
                        transport ? transport : "(null)", have, planned[0] ? "; it lacks: " : "",
                        planned);
    if (d->world_size < 1 || d->world_size > ZT_MAX_WORLD)
        return zt_error(ZT_ERR_INVALID,
                        "%s communicator: world size %d is not in [1, %d] (ZT_MAX_WORLD)",
                        ops->name, d->world_size, ZT_MAX_WORLD);
    if (d->rank < 0 || d->rank >= d->world_size)
        return zt_error(ZT_ERR_INVALID, "%s communicator: rank %d is not below world size %d",
                        ops->name, d->rank, d->world_size);
    if (!(timeout_s > 0 && timeout_s <= ZT_COMM_MAX_TIMEOUT_S))
        return zt_error(ZT_ERR_INVALID, "%s communicator: timeout %g s is not in (0, %g] s",
                        ops->name, timeout_s, ZT_COMM_MAX_TIMEOUT_S);
    return ops->create(out, d, timeout_s);
}

void zt_comm_destroy(zt_comm *c) {
    if (!c)
        return;
    if (c->detach)
        c->detach(c);
    c->ops->destroy(c);
}

int zt_comm_rank(const zt_comm *c) { return c->rank; }
int zt_comm_world_size(const zt_comm *c) { return c->world; }
const char *zt_comm_transport(const zt_comm *c) { return c->ops->name; }

static zt_status check_usable(zt_comm *c) {
    if (c->failed)
        return zt_error(c->failed, "communicator failed earlier: %s", c->failure);
    return ZT_OK;
}

/* A valid dtype, and n elements of it that fit in memory. */
static zt_status check_elems(zt_comm *c, const char *what, const void *buf, size_t n, zt_dtype t) {
    if ((unsigned)t >= ZT_DTYPE_COUNT)
        return zt_comm_fail(c, ZT_ERR_INVALID, "%s: unknown dtype %d", what, (int)t);
    if (n > SIZE_MAX / zt_dtype_size(t))
        return zt_comm_fail(c, ZT_ERR_INVALID, "%s: %zu elements of %s overflow the address space",
                            what, n, zt_dtype_name(t));
    if (n && !buf)
        return zt_comm_fail(c, ZT_ERR_INVALID, "%s: NULL buffer for %zu elements", what, n);
    return ZT_OK;
}

static zt_status check_op(zt_comm *c, const char *what, zt_reduce_op op) {
    if (op != ZT_REDUCE_SUM && op != ZT_REDUCE_AVG && op != ZT_REDUCE_MAX)
        return zt_comm_fail(c, ZT_ERR_INVALID, "%s: unknown reduce op %d", what, (int)op);
    return ZT_OK;
}

/* Pieces inside [0, n) and disjoint. Quadratic in the world size, which ZT_MAX_WORLD bounds; a
 * collective moves far more data than this compares. */
static zt_status check_pieces(zt_comm *c, const char *what, size_t n, const size_t *offsets,
                              const size_t *counts) {
    if (!offsets || !counts)
        return zt_comm_fail(c, ZT_ERR_INVALID, "%s: NULL offsets or counts", what);
    for (int r = 0; r < c->world; r++) {
        if (counts[r] > n || offsets[r] > n - counts[r])
            return zt_comm_fail(c, ZT_ERR_INVALID,
                                "%s: piece of rank %d [%zu, +%zu) is outside n=%zu", what, r,
                                offsets[r], counts[r], n);
        for (int q = 0; q < r; q++)
            if (counts[r] && counts[q] && offsets[r] < offsets[q] + counts[q] &&
                offsets[q] < offsets[r] + counts[r])
                return zt_comm_fail(c, ZT_ERR_INVALID, "%s: pieces of ranks %d and %d overlap",
                                    what, q, r);
    }
    return ZT_OK;
}

static zt_status check_rank(zt_comm *c, const char *what, const char *role, int r) {
    if (r < 0 || r >= c->world)
        return zt_comm_fail(c, ZT_ERR_INVALID, "%s: %s %d is not a rank of %d", what, role, r,
                            c->world);
    return ZT_OK;
}

zt_status zt_comm_check_buffer(zt_comm *c, const char *what, const void *buf, size_t n,
                               zt_dtype t) {
    ZT_TRY(check_usable(c));
    return check_elems(c, what, buf, n, t);
}

zt_status zt_comm_checked_all_reduce(zt_comm *c, void *buf, size_t n, zt_dtype t,
                                     zt_reduce_op op, bool dev) {
    const char *what = "all_reduce";
    ZT_TRY(check_usable(c));
    ZT_TRY(check_op(c, what, op));
    ZT_TRY(check_elems(c, what, buf, n, t));
    RETURN_TIMED((dev ? c->ops->dev_all_reduce : c->ops->all_reduce)(c, buf, n, t, op));
}

zt_status zt_comm_all_reduce(zt_comm *c, void *buf, size_t n, zt_dtype t, zt_reduce_op op) {
    return zt_comm_checked_all_reduce(c, buf, n, t, op, false);
}

zt_status zt_comm_reduce_scatter(zt_comm *c, const void *in, void *out, size_t n,
                                 const size_t *offsets, const size_t *counts, zt_dtype t,
                                 zt_reduce_op op) {
    return zt_comm_checked_reduce_scatter(c, in, out, n, offsets, counts, t, op, false);
}

zt_status zt_comm_checked_reduce_scatter(zt_comm *c, const void *in, void *out, size_t n,
                                         const size_t *offsets, const size_t *counts, zt_dtype t,
                                         zt_reduce_op op, bool dev) {
    const char *what = "reduce_scatter";
    ZT_TRY(check_usable(c));
    ZT_TRY(check_op(c, what, op));
    ZT_TRY(check_elems(c, what, in, n, t));
    ZT_TRY(check_pieces(c, what, n, offsets, counts));
    if (counts[c->rank] && !out)
        return zt_comm_fail(c, ZT_ERR_INVALID, "%s: NULL output for %zu elements", what,
                            counts[c->rank]);
    RETURN_TIMED((dev ? c->ops->dev_reduce_scatter
                      : c->ops->reduce_scatter)(c, in, out, n, offsets, counts, t, op));
}

zt_status zt_comm_all_gather(zt_comm *c, void *buf, size_t n, const size_t *offsets,
                             const size_t *counts, zt_dtype t) {
    return zt_comm_checked_all_gather(c, buf, n, offsets, counts, t, false);
}

zt_status zt_comm_checked_all_gather(zt_comm *c, void *buf, size_t n, const size_t *offsets,
                                     const size_t *counts, zt_dtype t, bool dev) {
    const char *what = "all_gather";
    ZT_TRY(check_usable(c));
    ZT_TRY(check_elems(c, what, buf, n, t));
    ZT_TRY(check_pieces(c, what, n, offsets, counts));
    RETURN_TIMED((dev ? c->ops->dev_all_gather : c->ops->all_gather)(c, buf, n, offsets, counts,
                                                                      t));
}

zt_status zt_comm_broadcast(zt_comm *c, void *buf, size_t n, zt_dtype t, int root) {
    return zt_comm_checked_broadcast(c, buf, n, t, root, false);
}

zt_status zt_comm_checked_broadcast(zt_comm *c, void *buf, size_t n, zt_dtype t, int root,
                                    bool dev) {
    const char *what = "broadcast";
    ZT_TRY(check_usable(c));
    ZT_TRY(check_rank(c, what, "root", root));
    ZT_TRY(check_elems(c, what, buf, n, t));
    RETURN_TIMED((dev ? c->ops->dev_broadcast : c->ops->broadcast)(c, buf, n, t, root));
}

zt_status zt_comm_barrier(zt_comm *c) {
    ZT_TRY(check_usable(c));
    RETURN_TIMED(c->ops->barrier(c));
}

static zt_status check_peer(zt_comm *c, const char *what, int peer) {
    ZT_TRY(check_rank(c, what, "peer", peer));
    if (peer == c->rank)
        return zt_comm_fail(c, ZT_ERR_INVALID, "%s: rank %d names itself as the peer", what,
                            peer);
    return ZT_OK;
}

zt_status zt_comm_send(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer) {
    return zt_comm_checked_send(c, buf, n, t, peer, false);
}

zt_status zt_comm_checked_send(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer,
                               bool dev) {
    const char *what = "send";
    ZT_TRY(check_usable(c));
    ZT_TRY(check_peer(c, what, peer));
    ZT_TRY(check_elems(c, what, buf, n, t));
    RETURN_TIMED((dev ? c->ops->dev_send : c->ops->send)(c, buf, n, t, peer));
}

zt_status zt_comm_recv(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer) {
    return zt_comm_checked_recv(c, buf, n, t, peer, false);
}

zt_status zt_comm_checked_recv(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer, bool dev) {
    const char *what = "recv";
    ZT_TRY(check_usable(c));
    ZT_TRY(check_peer(c, what, peer));
    ZT_TRY(check_elems(c, what, buf, n, t));
    RETURN_TIMED((dev ? c->ops->dev_recv : c->ops->recv)(c, buf, n, t, peer));
}
