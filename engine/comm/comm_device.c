/* Collectives on device buffers (ztrain/comm.h: zt_comm_dev_*): passed as they are to a transport
 * that reads device memory itself (NCCL) or to a host transport when device memory is host
 * memory (the CPU backend), and staged through a host buffer otherwise (shm or gloo ranks on
 * GPUs, e.g. several ranks sharing one GPU, which NCCL refuses). */
#include "comm_transport.h"
#include "ztrain/backend.h"

enum { EV_BEFORE = 0, EV_AFTER = 1 };

static bool native(const zt_comm *c) { return c->be && c->ops->dev_all_reduce; }

bool zt_comm_dev_native(const zt_comm *c) { return native(c); }

bool zt_comm_dev_staged(const zt_comm *c) {
    return c->be && !c->ops->dev_all_reduce && c->be->device != ZT_DEVICE_CPU;
}

static void release_staging(zt_comm *c) {
    if (!c->be)
        return;
    if (c->stage)
        zt_backend_free(c->be, ZT_MEM_HOST, c->stage, c->stage_bytes);
    for (int i = 0; i < 2; i++)
        if (c->stage_ev[i])
            zt_backend_event_destroy(c->be, c->stage_ev[i]);
    c->stage = NULL;
    c->stage_bytes = 0;
    c->stage_ev[0] = c->stage_ev[1] = NULL;
}

static void detach(zt_comm *c) { zt_comm_attach_backend(c, NULL); }

zt_status zt_comm_attach_backend(zt_comm *c, zt_backend *be) {
    release_staging(c);
    c->be = be;
    c->detach = be ? detach : NULL;
    c->dev_stats = (zt_comm_dev_stats){0};
    if (!be)
        return c->ops->attach ? c->ops->attach(c, NULL) : ZT_OK;
    if (c->ops->attach)
        ZT_TRY(c->ops->attach(c, be));
    for (int i = 0; i < 2; i++) {
        c->stage_ev[i] = zt_backend_event_create(be);
        if (!c->stage_ev[i]) {
            release_staging(c);
            c->be = NULL;
            c->detach = NULL;
            return zt_error(ZT_ERR_NOMEM, "%s communicator: cannot create the events that order "
                                          "its copies on %s", c->ops->name, be->name);
        }
    }
    return ZT_OK;
}

/* Set on a thread that orders the two streams itself (comm.h). */
static _Thread_local bool thread_orders;

void zt_comm_dev_thread_orders_streams(bool on) { thread_orders = on; }

/* The communication stream starts after everything issued on the compute stream so far. */
static void order_before(zt_comm *c) {
    if (thread_orders)
        return;
    zt_backend_event_record(c->be, c->stage_ev[EV_BEFORE], ZT_STREAM_COMPUTE);
    zt_backend_stream_wait(c->be, ZT_STREAM_COMM, c->stage_ev[EV_BEFORE]);
}

/* Compute issued from now on starts after the collective and its copies. */
static void order_after(zt_comm *c) {
    if (thread_orders)
        return;
    zt_backend_event_record(c->be, c->stage_ev[EV_AFTER], ZT_STREAM_COMM);
    zt_backend_stream_wait(c->be, ZT_STREAM_COMPUTE, c->stage_ev[EV_AFTER]);
}

/* A host buffer of at least n elements of t, grown (never shrunk) as messages grow: after the
 * first steps every message fits and nothing more is allocated. */
static zt_status staging(zt_comm *c, const char *what, const void *buf, size_t n, zt_dtype t,
                         void **out) {
    ZT_TRY(zt_comm_check_buffer(c, what, buf, n, t));
    size_t bytes = n * zt_dtype_size(t);
    if (bytes > c->stage_bytes) {
        if (c->stage)
            zt_backend_free(c->be, ZT_MEM_HOST, c->stage, c->stage_bytes);
        c->stage_bytes = 0;
        c->stage = zt_backend_alloc(c->be, ZT_MEM_HOST, bytes);
        if (!c->stage)
            return zt_comm_fail(c, ZT_ERR_NOMEM, "%s: no host memory for a %zu-byte staging "
                                                 "buffer of a device collective", what, bytes);
        c->stage_bytes = bytes;
    }
    *out = c->stage;
    return ZT_OK;
}

/* Device → staging (the copy from device to non-pinned host memory returns when the host may
 * read it), after the compute stream's work. */
static void to_host(zt_comm *c, void *host, const void *dev, size_t bytes) {
    order_before(c);
    zt_backend_copy(c->be, host, dev, bytes, ZT_COPY_D2H, ZT_STREAM_COMM);
    c->dev_stats.staged_waits++;
}

static void to_device(zt_comm *c, void *dev, const void *host, size_t bytes) {
    zt_backend_copy(c->be, dev, host, bytes, ZT_COPY_H2D, ZT_STREAM_COMM);
    c->dev_stats.staged_uploads++;
}

/* Every zt_comm_dev_ call: its payload, whatever the transport. */
static void count(zt_comm *c, size_t n, zt_dtype t) {
    c->dev_stats.calls++;
    c->dev_stats.payload_bytes += (unsigned long long)n * zt_dtype_size(t);
}

static void count_reduction(zt_comm *c, size_t n, zt_dtype t) {
    count(c, n, t);
    c->dev_stats.reduced_bytes += (unsigned long long)n * zt_dtype_size(t);
}

zt_comm_dev_stats zt_comm_dev_counts(const zt_comm *c) { return c->dev_stats; }

zt_comm_dev_stats zt_comm_dev_counts_sum(zt_comm *const *comms, size_t n) {
    zt_comm_dev_stats sum = {0};
    for (size_t i = 0; i < n; i++) {
        if (!comms[i])
            continue;
        const zt_comm_dev_stats *s = &comms[i]->dev_stats;
        sum.calls += s->calls;
        sum.payload_bytes += s->payload_bytes;
        sum.reduced_bytes += s->reduced_bytes;
        sum.staged_waits += s->staged_waits;
        sum.staged_uploads += s->staged_uploads;
    }
    return sum;
}

static zt_status native_done(zt_comm *c, zt_status s) {
    order_after(c);
    return s;
}

zt_status zt_comm_dev_all_reduce(zt_comm *c, void *buf, size_t n, zt_dtype t, zt_reduce_op op) {
    count_reduction(c, n, t);
    if (native(c)) {
        order_before(c);
        return native_done(c, zt_comm_checked_all_reduce(c, buf, n, t, op, true));
    }
    if (!zt_comm_dev_staged(c))
        return zt_comm_all_reduce(c, buf, n, t, op);
    void *h;
    size_t bytes = n * zt_dtype_size(t);
    ZT_TRY(staging(c, "all_reduce", buf, n, t, &h));
    to_host(c, h, buf, bytes);
    ZT_TRY(zt_comm_all_reduce(c, h, n, t, op));
    to_device(c, buf, h, bytes);
    order_after(c);
    return ZT_OK;
}

zt_status zt_comm_dev_reduce_scatter(zt_comm *c, const void *in, void *out, size_t n,
                                     const size_t *offsets, const size_t *counts, zt_dtype t,
                                     zt_reduce_op op) {
    count_reduction(c, n, t);
    if (native(c)) {
        order_before(c);
        return native_done(c, zt_comm_checked_reduce_scatter(c, in, out, n, offsets, counts, t,
                                                             op, true));
    }
    if (!zt_comm_dev_staged(c))
        return zt_comm_reduce_scatter(c, in, out, n, offsets, counts, t, op);
    void *h;
    size_t es = zt_dtype_size(t);
    ZT_TRY(staging(c, "reduce_scatter", in, n, t, &h));
    if (!offsets || !counts)
        return zt_comm_reduce_scatter(c, in, out, n, offsets, counts, t, op);
    to_host(c, h, in, n * es);
    /* The result lands in the staging buffer's own piece, which the host call allows. */
    char *piece = (char *)h + offsets[c->rank] * es;
    ZT_TRY(zt_comm_reduce_scatter(c, h, piece, n, offsets, counts, t, op));
    if (counts[c->rank])
        to_device(c, out, piece, counts[c->rank] * es);
    order_after(c);
    return ZT_OK;
}

zt_status zt_comm_dev_all_gather(zt_comm *c, void *buf, size_t n, const size_t *offsets,
                                 const size_t *counts, zt_dtype t) {
    count(c, n, t);
    if (native(c)) {
        order_before(c);
        return native_done(c, zt_comm_checked_all_gather(c, buf, n, offsets, counts, t, true));
    }
    if (!zt_comm_dev_staged(c))
        return zt_comm_all_gather(c, buf, n, offsets, counts, t);
    void *h;
    size_t bytes = n * zt_dtype_size(t);
    ZT_TRY(staging(c, "all_gather", buf, n, t, &h));
    /* The whole range travels both ways, so elements in no piece come back as they were. */
    to_host(c, h, buf, bytes);
    ZT_TRY(zt_comm_all_gather(c, h, n, offsets, counts, t));
    to_device(c, buf, h, bytes);
    order_after(c);
    return ZT_OK;
}

zt_status zt_comm_dev_broadcast(zt_comm *c, void *buf, size_t n, zt_dtype t, int root) {
    count(c, n, t);
    if (native(c)) {
        order_before(c);
        return native_done(c, zt_comm_checked_broadcast(c, buf, n, t, root, true));
    }
    if (!zt_comm_dev_staged(c))
        return zt_comm_broadcast(c, buf, n, t, root);
    void *h;
    size_t bytes = n * zt_dtype_size(t);
    ZT_TRY(staging(c, "broadcast", buf, n, t, &h));
    if (c->rank == root)
        to_host(c, h, buf, bytes);
    ZT_TRY(zt_comm_broadcast(c, h, n, t, root));
    if (c->rank != root) {
        order_before(c);
        to_device(c, buf, h, bytes);
    }
    order_after(c);
    return ZT_OK;
}

zt_status zt_comm_dev_send(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer) {
    count(c, n, t);
    if (native(c)) {
        order_before(c);
        return native_done(c, zt_comm_checked_send(c, buf, n, t, peer, true));
    }
    if (!zt_comm_dev_staged(c))
        return zt_comm_send(c, buf, n, t, peer);
    void *h;
    ZT_TRY(staging(c, "send", buf, n, t, &h));
    to_host(c, h, buf, n * zt_dtype_size(t));
    return zt_comm_send(c, h, n, t, peer);
}

zt_status zt_comm_dev_recv(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer) {
    count(c, n, t);
    if (native(c)) {
        order_before(c);
        return native_done(c, zt_comm_checked_recv(c, buf, n, t, peer, true));
    }
    if (!zt_comm_dev_staged(c))
        return zt_comm_recv(c, buf, n, t, peer);
    void *h;
    ZT_TRY(staging(c, "recv", buf, n, t, &h));
    ZT_TRY(zt_comm_recv(c, h, n, t, peer));
    /* The buffer may still be read by compute issued before this call. */
    order_before(c);
    to_device(c, buf, h, n * zt_dtype_size(t));
    order_after(c);
    return ZT_OK;
}
