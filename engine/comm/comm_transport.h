/* What a communicator transport fills in (internal to the engine): one table of operations and
 * the zt_comm header that its communicator object starts with.
 *
 * engine/comm/comm.c checks every argument before it calls an entry, so an entry may rely on the
 * checks its public function documents (dtype valid, op valid, root or peer in range and not
 * this rank for send/recv, pieces inside [0, n) and disjoint, buffers non-NULL where they hold
 * elements, n * dtype size not overflowing) and on the communicator not having failed. A transport
 * reports a failure with zt_comm_fail, which makes the communicator unusable and tells the peers
 * through the table's abort entry. A transport adds its table to the list in comm.c (under its
 * build option) and to the extern declarations below; a C++ one (comm_gloo.cc) includes this
 * header inside extern "C", as the engine's headers carry no C++ guards. */
#ifndef ZTRAIN_COMM_TRANSPORT_H
#define ZTRAIN_COMM_TRANSPORT_H

#include "ztrain/comm.h"

enum { ZT_COMM_REASON_LEN = 400 };

typedef struct zt_comm_ops {
    const char *name;
    /* Called with d checked: world size in [1, ZT_MAX_WORLD], rank inside it, timeout_s > 0.
     * Fills the zt_comm header (zt_comm_init_header) and returns the object in *out; on failure
     * it frees what it made and leaves *out NULL. */
    zt_status (*create)(zt_comm **out, const zt_dist_info *d, double timeout_s);
    void (*destroy)(zt_comm *c);
    /* Makes the peers' waits fail soon after this rank failed (c->failure says why), at the
     * latest within their timeout. Called once, by zt_comm_fail. */
    void (*abort)(zt_comm *c);

    zt_status (*all_reduce)(zt_comm *c, void *buf, size_t n, zt_dtype t, zt_reduce_op op);
    zt_status (*reduce_scatter)(zt_comm *c, const void *in, void *out, size_t n,
                                const size_t *offsets, const size_t *counts, zt_dtype t,
                                zt_reduce_op op);
    zt_status (*all_gather)(zt_comm *c, void *buf, size_t n, const size_t *offsets,
                            const size_t *counts, zt_dtype t);
    zt_status (*broadcast)(zt_comm *c, void *buf, size_t n, zt_dtype t, int root);
    zt_status (*barrier)(zt_comm *c);
    zt_status (*send)(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer);
    zt_status (*recv)(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer);

    /* Device buffers (engine/comm/comm_device.c). A transport that reads the backend's device memory
     * itself ("nccl") fills these; one that reads host memory leaves them NULL, and
     * comm_device.c then stages device buffers through host memory for it. The entries above
     * always take host memory: a device transport stages those through its own device buffer.
     * attach hands the transport the backend whose memory the dev_ entries receive (called
     * once, before the first dev_ call; may be NULL). Arguments are checked as above. */
    zt_status (*attach)(zt_comm *c, struct zt_backend *be);
    zt_status (*dev_all_reduce)(zt_comm *c, void *buf, size_t n, zt_dtype t, zt_reduce_op op);
    zt_status (*dev_reduce_scatter)(zt_comm *c, const void *in, void *out, size_t n,
                                    const size_t *offsets, const size_t *counts, zt_dtype t,
                                    zt_reduce_op op);
    zt_status (*dev_all_gather)(zt_comm *c, void *buf, size_t n, const size_t *offsets,
                                const size_t *counts, zt_dtype t);
    zt_status (*dev_broadcast)(zt_comm *c, void *buf, size_t n, zt_dtype t, int root);
    zt_status (*dev_send)(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer);
    zt_status (*dev_recv)(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer);

    /* Optional: a group that the transport makes itself (engine/comm/comm_group.c asks for it
     * before it falls back to a group of c's point-to-point messages): members ranks[0..n) of c
     * (checked: distinct, in range), this rank member `me`, called by the members only, at the
     * same point of their calls on c. "nccl" makes an NCCL communicator of the members alone, so
     * the group's dev_ entries run on the device too. The group fills the zt_comm header with
     * rank me of n and c's timeout; a failure of the group fails c as well (as comm_group.c's
     * groups do). Freed with zt_comm_destroy, before c. */
    zt_status (*create_group)(zt_comm **out, zt_comm *c, const int *ranks, int n, int me);
} zt_comm_ops;

/* The first member of every transport's communicator object, which casts between the two. */
struct zt_comm {
    const zt_comm_ops *ops;
    int rank, world;
    double timeout_s;
    zt_status failed; /* ZT_OK until the first failure */
    char failure[ZT_COMM_REASON_LEN];
    /* Device buffers (comm_device.c): the backend attached, and, for a host transport on a
     * backend whose device memory the host cannot read, the host staging buffer (grown to the
     * largest message, then reused) and the events that order it with the compute stream. */
    struct zt_backend *be;
    void *stage;
    size_t stage_bytes;
    struct zt_event *stage_ev[2];
    zt_comm_dev_stats dev_stats; /* zt_comm_dev_counts, zeroed at attach */
    /* Set by comm_device.c while a backend is attached: what zt_comm_destroy calls first to
     * release it, so that comm.c (the host collectives) never calls up into the device layer. */
    void (*detach)(zt_comm *c);
};

/* Whether the stop flag of zt_comm_set_stop_flag is set: the rendezvous waits give up. */
bool zt_comm_stop_requested(void);

extern const zt_comm_ops zt_comm_shm_ops;
#ifdef ZT_HAVE_GLOO
extern const zt_comm_ops zt_comm_gloo_ops;
#endif
#ifdef ZT_HAVE_NCCL
extern const zt_comm_ops zt_comm_nccl_ops;
#endif

static inline void zt_comm_init_header(zt_comm *c, const zt_comm_ops *ops, const zt_dist_info *d,
                                       double timeout_s) {
    c->ops = ops;
    c->rank = d->rank;
    c->world = d->world_size;
    c->timeout_s = timeout_s;
    c->failed = ZT_OK;
    c->failure[0] = '\0';
    c->be = NULL;
    c->stage = NULL;
    c->stage_bytes = 0;
    c->stage_ev[0] = c->stage_ev[1] = NULL;
    c->dev_stats.calls = c->dev_stats.payload_bytes = c->dev_stats.reduced_bytes = 0;
    c->dev_stats.staged_waits = c->dev_stats.staged_uploads = 0;
    c->detach = NULL;
}

/* Records a failure: the message goes to c->failure and zt_last_error(), the communicator becomes
 * unusable, and, on the first failure, the transport's abort tells the peers. Returns s. */
zt_status zt_comm_fail(zt_comm *c, zt_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The public calls' argument checks, then the table's host entry (dev false) or device entry
 * (dev true, which must be non-NULL): what comm_device.c dispatches through. */
zt_status zt_comm_checked_all_reduce(zt_comm *c, void *buf, size_t n, zt_dtype t,
                                     zt_reduce_op op, bool dev);
zt_status zt_comm_checked_reduce_scatter(zt_comm *c, const void *in, void *out, size_t n,
                                         const size_t *offsets, const size_t *counts, zt_dtype t,
                                         zt_reduce_op op, bool dev);
zt_status zt_comm_checked_all_gather(zt_comm *c, void *buf, size_t n, const size_t *offsets,
                                     const size_t *counts, zt_dtype t, bool dev);
zt_status zt_comm_checked_broadcast(zt_comm *c, void *buf, size_t n, zt_dtype t, int root,
                                    bool dev);
zt_status zt_comm_checked_send(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer,
                               bool dev);
zt_status zt_comm_checked_recv(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer, bool dev);
/* The communicator usable, t valid, buf non-NULL when n > 0 and n elements addressable: checked
 * before a buffer is staged. */
zt_status zt_comm_check_buffer(zt_comm *c, const char *what, const void *buf, size_t n,
                               zt_dtype t);

/* dst[0 .. n) = op over the nsrc contributions src_k[0 .. n), where src_k starts stride bytes
 * after src_(k-1) and src_0 = src, added in order k = 0, 1, ... with the precision rules of
 * comm.h (AVG divides by nsrc). dst may be src_0 itself but must not overlap another src_k
 * otherwise. Shared by the transports that reduce on the host. */
void zt_comm_reduce(void *dst, const void *src, size_t stride, int nsrc, size_t n, zt_dtype t,
                    zt_reduce_op op);

#endif
