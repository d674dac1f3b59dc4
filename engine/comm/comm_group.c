/* A communicator over a subset of another's ranks (zt_comm_create_group): the collectives of a
 * pipeline stage's data-parallel replicas, or of one replica's stages, built from the parent's
 * point-to-point messages so that every transport with send/recv gets groups for free. A
 * transport that makes groups of its own (comm_transport.h: create_group; "nccl", whose groups
 * are NCCL communicators with collectives on the device) makes them instead.
 *
 * A reduction gathers the members' contributions at one member, a chunk at a time, and folds
 * them with zt_comm_reduce in member order, so the results follow comm.h's precision rules bit
 * for bit and are the same on every member (the others receive the result). */
#include <stdlib.h>
#include <string.h>

#include "comm_transport.h"

/* Elements of one contribution the reducing member holds at a time, per member. */
enum { CHUNK = 16384 };

typedef struct {
    zt_comm comm;          /* rank and world within the group */
    zt_comm *parent;
    int *ranks;            /* [world]: a member's rank in the parent */
    unsigned char *scratch; /* [world × CHUNK × 8]: one chunk of every member's contribution */
} group_comm;

static group_comm *as_group(zt_comm *c) { return (group_comm *)c; }

/* A failure of the parent's call fails the group with the parent's message. */
static zt_status lift(group_comm *g, zt_status s) {
    if (s == ZT_OK)
        return ZT_OK;
    return zt_comm_fail(&g->comm, s, "%s", zt_last_error());
}

static zt_status send_to(group_comm *g, const void *buf, size_t n, zt_dtype t, int member) {
    return lift(g, zt_comm_send(g->parent, buf, n, t, g->ranks[member]));
}

static zt_status recv_from(group_comm *g, void *buf, size_t n, zt_dtype t, int member) {
    return lift(g, zt_comm_recv(g->parent, buf, n, t, g->ranks[member]));
}

/* op over the members' in[n], into out[n] on member root only (out may be in). */
static zt_status reduce_to(group_comm *g, const void *in, void *out, size_t n, zt_dtype t,
                           zt_reduce_op op, int root) {
    const int me = g->comm.rank, world = g->comm.world;
    const size_t es = zt_dtype_size(t), stride = (size_t)CHUNK * es;
    for (size_t lo = 0; lo < n; lo += CHUNK) {
        size_t len = n - lo < CHUNK ? n - lo : CHUNK;
        const unsigned char *mine = (const unsigned char *)in + lo * es;
        if (me != root) {
            ZT_TRY(send_to(g, mine, len, t, root));
            continue;
        }
        for (int k = 0; k < world; k++) {
            unsigned char *slot = g->scratch + (size_t)k * stride;
            if (k == me)
                memcpy(slot, mine, len * es);
            else
                ZT_TRY(recv_from(g, slot, len, t, k));
        }
        zt_comm_reduce((unsigned char *)out + lo * es, g->scratch, stride, world, len, t, op);
    }
    return ZT_OK;
}

static zt_status group_broadcast(zt_comm *c, void *buf, size_t n, zt_dtype t, int root) {
    group_comm *g = as_group(c);
    if (c->rank != root)
        return recv_from(g, buf, n, t, root);
    for (int k = 0; k < c->world; k++)
        if (k != root)
            ZT_TRY(send_to(g, buf, n, t, k));
    return ZT_OK;
}

static zt_status group_all_reduce(zt_comm *c, void *buf, size_t n, zt_dtype t, zt_reduce_op op) {
    ZT_TRY(reduce_to(as_group(c), buf, buf, n, t, op, 0));
    return group_broadcast(c, buf, n, t, 0);
}

static zt_status group_reduce_scatter(zt_comm *c, const void *in, void *out, size_t n,
                                      const size_t *offsets, const size_t *counts, zt_dtype t,
                                      zt_reduce_op op) {
    (void)n;
    const size_t es = zt_dtype_size(t);
    for (int r = 0; r < c->world; r++)
        ZT_TRY(reduce_to(as_group(c), (const unsigned char *)in + offsets[r] * es,
                         r == c->rank ? out : NULL, counts[r], t, op, r));
    return ZT_OK;
}

static zt_status group_all_gather(zt_comm *c, void *buf, size_t n, const size_t *offsets,
                                  const size_t *counts, zt_dtype t) {
    (void)n;
    const size_t es = zt_dtype_size(t);
    for (int r = 0; r < c->world; r++)
        ZT_TRY(group_broadcast(c, (unsigned char *)buf + offsets[r] * es, counts[r], t, r));
    return ZT_OK;
}

static zt_status group_barrier(zt_comm *c) {
    float one = 1.0f;
    return group_all_reduce(c, &one, 1, ZT_F32, ZT_REDUCE_SUM);
}

static zt_status group_send(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer) {
    return send_to(as_group(c), buf, n, t, peer);
}

static zt_status group_recv(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer) {
    return recv_from(as_group(c), buf, n, t, peer);
}

/* The parent fails too, so the ranks outside the group stop at their next wait as well. */
static void group_abort(zt_comm *c) {
    group_comm *g = as_group(c);
    if (g->parent->failed == ZT_OK)
        zt_comm_fail(g->parent, c->failed, "%s", c->failure);
}

static void group_destroy(zt_comm *c) {
    group_comm *g = as_group(c);
    free(g->ranks);
    free(g->scratch);
    free(g);
}

static zt_status group_create(zt_comm **out, const zt_dist_info *d, double timeout_s) {
    (void)out, (void)d, (void)timeout_s;
    return zt_error(ZT_ERR_INVALID, "comm: a group is made with zt_comm_create_group");
}

static const zt_comm_ops group_ops = {
    .name = "group",
    .create = group_create,
    .destroy = group_destroy,
    .abort = group_abort,
    .all_reduce = group_all_reduce,
    .reduce_scatter = group_reduce_scatter,
    .all_gather = group_all_gather,
    .broadcast = group_broadcast,
    .barrier = group_barrier,
    .send = group_send,
    .recv = group_recv,
};

bool zt_comm_pairs_concurrent(const zt_comm *c) {
    while (c->ops == &group_ops)
        c = ((const group_comm *)c)->parent;
    return strcmp(c->ops->name, "shm") == 0 || strcmp(c->ops->name, "gloo") == 0;
}

zt_status zt_comm_create_group(zt_comm **out, zt_comm *parent, const int *ranks, int n) {
    *out = NULL;
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->world)
            return zt_error(ZT_ERR_INVALID, "comm group: member %d is rank %d, not a rank of %d",
                            i, ranks[i], parent->world);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return zt_error(ZT_ERR_INVALID, "comm group: rank %d is listed twice", ranks[i]);
        if (ranks[i] == parent->rank)
            me = i;
    }
    if (n < 1 || me < 0)
        return zt_error(ZT_ERR_INVALID, "comm group: rank %d is not among its %d members",
                        parent->rank, n);
    /* Under point-to-point groups, the transport's own communicator, the members named by their
     * ranks in it: a transport that makes groups itself makes this one (a group of a group is a
     * group of the transport's ranks). */
    zt_comm *base = parent;
    int base_ranks[ZT_MAX_WORLD];
    memcpy(base_ranks, ranks, (size_t)n * sizeof *ranks);
    while (base->ops == &group_ops) {
        const group_comm *up = (const group_comm *)base;
        for (int i = 0; i < n; i++)
            base_ranks[i] = up->ranks[base_ranks[i]];
        base = up->parent;
    }
    if (base->ops->create_group)
        return base->ops->create_group(out, base, base_ranks, n, me);
    group_comm *g = calloc(1, sizeof *g);
    if (g) {
        g->ranks = malloc((size_t)n * sizeof *g->ranks);
        g->scratch = malloc((size_t)n * CHUNK * sizeof(double));
    }
    if (!g || !g->ranks || !g->scratch) {
        if (g)
            group_destroy(&g->comm);
        return zt_error(ZT_ERR_NOMEM, "comm group: out of memory for %d members", n);
    }
    memcpy(g->ranks, ranks, (size_t)n * sizeof *ranks);
    g->parent = parent;
    g->comm = (zt_comm){.ops = &group_ops, .rank = me, .world = n,
                        .timeout_s = parent->timeout_s};
    *out = &g->comm;
    return ZT_OK;
}
