/* The NCCL transport (comm_transport.h's table): GPU ranks on any number of hosts, as an adaptor
 * over the CUDA module's NCCL (ztrain/nccl.h), so that the engine includes no NCCL or CUDA
 * header and no program links libnccl or libcudart. Rank 0 hands out the unique id over the TCP
 * store at MASTER_ADDR:MASTER_PORT (engine/comm/tcp_store.c); each rank takes the GPU of its
 * LOCAL_RANK. The module polls every call against the communicator's timeout and aborts on an
 * error or a timeout; this side then names, through the store, the ranks that said they failed.
 * Host reductions keep comm.h's order and precision: the ranks' values are all-gathered and
 * reduced here with the shared reducer.
 *
 * A group (zt_comm_create_group: tensor parallelism's, a pipeline's, the shards sharing a kv
 * head) is an NCCL communicator of its members alone, made from a fresh unique id that its
 * member 0 sends to the others as the parent's host messages (what PyTorch's new_group does
 * through its store), so its device collectives are NCCL's on the device like the parent's.
 * Not ncclCommSplit: that is a collective of every rank of the parent, and not every rank makes
 * every group (a pipeline's tied-weights group is its first and last stages' only). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_transport.h"
#include "tcp_store.h"
#include "ztrain/backend.h"
#include "ztrain/nccl.h"

typedef struct nccl_comm {
    zt_comm base; /* first: casts between the two */
    const zt_nccl_api *api;
    zt_nccl_comm *m;
    int device;
    /* The host reductions' buffers, grown to the largest, then reused. */
    char *gather, *scatter;
    size_t gather_bytes, scatter_bytes;
    size_t *offsets, *counts; /* [world]: the pieces of a host reduction's all-gather */
    zt_tcp_store_server *server;
    zt_tcp_store *store;
    char prefix[200]; /* the store's keys of this job */
    /* A group: the communicator it was made from (which a failure of the group fails too), the
     * job's communicator (whose store the failures go through), and each member's rank in the
     * job. NULL, NULL, NULL for the job's communicator. */
    zt_comm *parent;
    struct nccl_comm *job;
    int *job_ranks;
} nccl_comm;

static nccl_comm *nc_of(zt_comm *c) { return (nccl_comm *)c; }

/* The job's communicator (c itself, or the one a group was made from) and member r's rank in it. */
static nccl_comm *job_of(nccl_comm *c) { return c->job ? c->job : c; }
static int job_rank(const nccl_comm *c, int r) { return c->job_ranks ? c->job_ranks[r] : r; }

static zt_nccl_op op_of(zt_reduce_op op) {
    return op == ZT_REDUCE_AVG ? ZT_NCCL_AVG : op == ZT_REDUCE_MAX ? ZT_NCCL_MAX : ZT_NCCL_SUM;
}

/* Names the members that said, through the job's store, that they failed ("" when none did),
 * by their ranks in the job. */
static void failed_peers(nccl_comm *c, char *out, size_t cap) {
    nccl_comm *j = job_of(c);
    size_t len = 0;
    out[0] = '\0';
    zt_tcp_store_set_timeout(j->store, 1.0);
    for (int r = 0; r < c->base.world && len + 64 < cap; r++) {
        if (r == c->base.rank)
            continue;
        char key[256];
        void *v = NULL;
        size_t n = 0;
        snprintf(key, sizeof key, "%s/failed/%d", j->prefix, job_rank(c, r));
        if (zt_tcp_store_get(j->store, key, &v, &n, 0) == ZT_OK) {
            int w = snprintf(out + len, cap - len, "%srank %d: %.120s", len ? "; " : "",
                             job_rank(c, r), (const char *)v);
            if (w > 0)
                len += (size_t)w < cap - len ? (size_t)w : cap - len - 1;
        }
        free(v);
    }
    zt_tcp_store_set_timeout(j->store, j->base.timeout_s);
}

/* "" for the job's communicator; for a group, which job ranks it joins ("the group of job ranks
 * 2, 3 (this rank member 1): "), since the module names ranks by their place in the group. */
static void group_label(const nccl_comm *c, char *out, size_t cap) {
    out[0] = '\0';
    if (!c->job_ranks)
        return;
    size_t len = (size_t)snprintf(out, cap, "the group of job ranks ");
    for (int r = 0; r < c->base.world && len + 16 < cap; r++)
        len += (size_t)snprintf(out + len, cap - len, "%s%d", r ? ", " : "", c->job_ranks[r]);
    if (len + 40 < cap)
        snprintf(out + len, cap - len, " (this rank member %d): ", c->base.rank);
}

/* A module call's result: a failure fails the communicator, naming the peers that reported one
 * when the module gave up waiting or NCCL saw an error (a bad message names both ranks already). */
static zt_status done(nccl_comm *c, zt_status s) {
    if (s == ZT_OK)
        return ZT_OK;
    char msg[ZT_COMM_REASON_LEN], peers[256] = "", label[160];
    snprintf(msg, sizeof msg, "%s", zt_last_error());
    if (s != ZT_ERR_INVALID && job_of(c)->store)
        failed_peers(c, peers, sizeof peers);
    group_label(c, label, sizeof label);
    return zt_comm_fail(&c->base, s, "%s%s%s%s", label, msg, peers[0] ? "; failed peers: " : "",
                        peers);
}

/* A host buffer of at least bytes, grown, never shrunk. */
static zt_status grow(nccl_comm *c, char **buf, size_t *have, size_t bytes, const char *what) {
    if (bytes <= *have)
        return ZT_OK;
    char *p = realloc(*buf, bytes);
    if (!p)
        return zt_comm_fail(&c->base, ZT_ERR_NOMEM, "%s: no host memory for %zu bytes", what,
                            bytes);
    *buf = p;
    *have = bytes;
    return ZT_OK;
}

/* ---- device buffers ---------------------------------------------------------------------- */

static zt_status dev_all_reduce(zt_comm *base, void *buf, size_t n, zt_dtype t,
                                zt_reduce_op op) {
    nccl_comm *c = nc_of(base);
    return done(c, c->api->all_reduce(c->m, buf, n, t, op_of(op)));
}

static zt_status dev_reduce_scatter(zt_comm *base, const void *in, void *out, size_t n,
                                    const size_t *offsets, const size_t *counts, zt_dtype t,
                                    zt_reduce_op op) {
    nccl_comm *c = nc_of(base);
    return done(c, c->api->reduce_scatter(c->m, in, out, offsets, counts, t, op_of(op)));
}

static zt_status dev_all_gather(zt_comm *base, void *buf, size_t n, const size_t *offsets,
                                const size_t *counts, zt_dtype t) {
    nccl_comm *c = nc_of(base);
    return done(c, c->api->all_gather(c->m, buf, n, offsets, counts, t, ZT_NCCL_DEVICE));
}

static zt_status dev_broadcast(zt_comm *base, void *buf, size_t n, zt_dtype t, int root) {
    nccl_comm *c = nc_of(base);
    return done(c, c->api->broadcast(c->m, buf, n, t, root, ZT_NCCL_DEVICE));
}

static zt_status dev_send(zt_comm *base, const void *buf, size_t n, zt_dtype t, int peer) {
    nccl_comm *c = nc_of(base);
    return done(c, c->api->send(c->m, buf, n, t, peer, ZT_NCCL_DEVICE));
}

static zt_status dev_recv(zt_comm *base, void *buf, size_t n, zt_dtype t, int peer) {
    nccl_comm *c = nc_of(base);
    return done(c, c->api->recv(c->m, buf, n, t, peer, ZT_NCCL_DEVICE));
}

/* ---- host buffers: staged by the module --------------------------------------------------- */

/* Host reductions go the exact way comm.h promises (rank order, fp32 for 16-bit, NaN kept by
 * MAX): each rank's values are all-gathered, and reduced here with the shared reducer. These
 * are small (losses, flags, norms). */
static zt_status host_all_reduce(zt_comm *base, void *buf, size_t n, zt_dtype t,
                                 zt_reduce_op op) {
    nccl_comm *c = nc_of(base);
    size_t bytes = n * zt_dtype_size(t), all = bytes * (size_t)c->base.world;
    ZT_TRY(grow(c, &c->gather, &c->gather_bytes, all ? all : 1, "all_reduce"));
    memcpy(c->gather + bytes * (size_t)c->base.rank, buf, bytes);
    for (int r = 0; r < c->base.world; r++) {
        c->offsets[r] = n * (size_t)r;
        c->counts[r] = n;
    }
    if (n)
        ZT_TRY(done(c, c->api->all_gather(c->m, c->gather, n * (size_t)c->base.world, c->offsets,
                                          c->counts, t, ZT_NCCL_HOST)));
    zt_comm_reduce(buf, c->gather, bytes, c->base.world, n, t, op);
    return ZT_OK;
}

static zt_status host_reduce_scatter(zt_comm *base, const void *in, void *out, size_t n,
                                     const size_t *offsets, const size_t *counts, zt_dtype t,
                                     zt_reduce_op op) {
    nccl_comm *c = nc_of(base);
    size_t es = zt_dtype_size(t), bytes = n * es;
    ZT_TRY(grow(c, &c->scatter, &c->scatter_bytes, bytes ? bytes : 1, "reduce_scatter"));
    memcpy(c->scatter, in, bytes);
    ZT_TRY(host_all_reduce(base, c->scatter, n, t, op));
    memmove(out, c->scatter + offsets[c->base.rank] * es, counts[c->base.rank] * es);
    return ZT_OK;
}

static zt_status host_all_gather(zt_comm *base, void *buf, size_t n, const size_t *offsets,
                                 const size_t *counts, zt_dtype t) {
    nccl_comm *c = nc_of(base);
    return done(c, c->api->all_gather(c->m, buf, n, offsets, counts, t, ZT_NCCL_HOST));
}

static zt_status host_broadcast(zt_comm *base, void *buf, size_t n, zt_dtype t, int root) {
    nccl_comm *c = nc_of(base);
    return done(c, c->api->broadcast(c->m, buf, n, t, root, ZT_NCCL_HOST));
}

static zt_status host_barrier(zt_comm *base) {
    float one = 1;
    return host_all_reduce(base, &one, 1, ZT_F32, ZT_REDUCE_SUM);
}

static zt_status host_send(zt_comm *base, const void *buf, size_t n, zt_dtype t, int peer) {
    nccl_comm *c = nc_of(base);
    return done(c, c->api->send(c->m, buf, n, t, peer, ZT_NCCL_HOST));
}

static zt_status host_recv(zt_comm *base, void *buf, size_t n, zt_dtype t, int peer) {
    nccl_comm *c = nc_of(base);
    return done(c, c->api->recv(c->m, buf, n, t, peer, ZT_NCCL_HOST));
}

/* ---- life cycle --------------------------------------------------------------------------- */

/* Tells the peers, through the job's store, why this rank failed, then aborts the communicator;
 * a group fails the communicator it was made from too, so that the ranks outside the group stop
 * at their next wait as well. */
static void nccl_abort(zt_comm *base) {
    nccl_comm *c = nc_of(base), *j = job_of(c);
    if (j->store) {
        char key[256];
        snprintf(key, sizeof key, "%s/failed/%d", j->prefix, job_rank(c, c->base.rank));
        zt_tcp_store_set_timeout(j->store, 1.0);
        zt_tcp_store_set(j->store, key, c->base.failure, strlen(c->base.failure) + 1);
    }
    c->api->abort(c->m);
    if (c->parent && c->parent->failed == ZT_OK)
        zt_comm_fail(c->parent, c->base.failed, "%s", c->base.failure);
}

static void nccl_destroy(zt_comm *base) {
    nccl_comm *c = nc_of(base);
    if (c->m)
        c->api->destroy(c->m);
    zt_tcp_store_close(c->store);
    zt_tcp_store_server_stop(c->server);
    free(c->gather);
    free(c->scatter);
    free(c->offsets);
    free(c->counts);
    free(c->job_ranks);
    free(c);
}

/* A communicator object of world ranks with its host reductions' piece tables; NULL when out
 * of memory. */
static nccl_comm *alloc_comm(int world) {
    nccl_comm *c = calloc(1, sizeof *c);
    if (c) {
        c->offsets = calloc((size_t)world, sizeof *c->offsets);
        c->counts = calloc((size_t)world, sizeof *c->counts);
    }
    if (c && (!c->offsets || !c->counts)) {
        free(c->offsets);
        free(c->counts);
        free(c);
        c = NULL;
    }
    return c;
}

static zt_status nccl_attach(zt_comm *base, zt_backend *be) {
    nccl_comm *c = nc_of(base);
    if (be && (be->device != ZT_DEVICE_CUDA || be->device_index != c->device))
        return zt_error(ZT_ERR_INVALID,
                        "nccl rank %d: the engine computes on %s device %d but the communicator "
                        "took GPU %d (LOCAL_RANK %% visible GPUs)", c->base.rank, be->name,
                        be->device_index, c->device);
    return c->api->attach(c->m, be);
}

/* The rendezvous: rank 0 serves the store and publishes the unique id; the others read it. */
static zt_status exchange_id(nccl_comm *c, const zt_dist_info *d, zt_nccl_id *id) {
    if (d->rank == 0)
        ZT_TRY(zt_tcp_store_serve_job(&c->server, d));
    ZT_TRY(zt_tcp_store_connect(&c->store, d->master_addr, d->master_port, c->base.timeout_s,
                                zt_tcp_store_secret()));
    char key[256];
    snprintf(key, sizeof key, "%s/id", c->prefix);
    if (d->rank == 0) {
        ZT_TRY(c->api->unique_id(id));
        return zt_tcp_store_set(c->store, key, id->bytes, sizeof id->bytes);
    }
    void *v = NULL;
    size_t n = 0;
    ZT_TRY(zt_tcp_store_get(c->store, key, &v, &n, c->base.timeout_s));
    zt_status s = ZT_OK;
    char at[sizeof d->master_addr + 16];
    zt_dist_endpoint(d->master_addr, d->master_port, at, sizeof at);
    if (n != sizeof id->bytes)
        s = zt_error(ZT_ERR_INVALID, "nccl rank %d: the unique id at %s is %zu bytes, not %zu",
                     d->rank, at, n, sizeof id->bytes);
    else
        memcpy(id->bytes, v, sizeof id->bytes);
    free(v);
    return s;
}

static zt_status nccl_create(zt_comm **out, const zt_dist_info *d, double timeout_s) {
    const zt_nccl_api *api = zt_nccl_api_get();
    if (!api)
        return zt_error_prefix(ZT_ERR_UNSUPPORTED, "nccl rank %d: ", d->rank);
    int device = -1;
    ZT_TRY(api->pick_device(d->rank, d->local_rank, d->local_world_size, &device));
    nccl_comm *c = alloc_comm(d->world_size);
    if (!c)
        return zt_error(ZT_ERR_NOMEM, "nccl: out of memory");
    zt_comm_init_header(&c->base, &zt_comm_nccl_ops, d, timeout_s);
    c->api = api;
    c->device = device;
    snprintf(c->prefix, sizeof c->prefix, "zt/nccl/%s", d->run_id);
    zt_nccl_id id;
    zt_status s = exchange_id(c, d, &id);
    if (s == ZT_OK) {
        s = api->create(&c->m, &id, d->world_size, d->rank, device, timeout_s);
        if (s == ZT_ERR_TIMEOUT) {
            char at[sizeof d->master_addr + 16];
            zt_dist_endpoint(d->master_addr, d->master_port, at, sizeof at);
            zt_error_prefix(s, "rendezvous at %s: ", at);
        }
    }
    if (s != ZT_OK) {
        nccl_destroy(&c->base);
        return s;
    }
    *out = &c->base;
    return ZT_OK;
}

/* The group's unique id: member 0 makes it and sends it to each other member as the parent's
 * host messages (ranks are the parent's). */
static zt_status group_id(nccl_comm *p, const int *ranks, int n, int me, zt_nccl_id *id) {
    enum { HALVES = ZT_NCCL_ID_BYTES / 2 }; /* a message copies bytes: 16-bit elements */
    if (me != 0)
        return zt_comm_recv(&p->base, id->bytes, HALVES, ZT_F16, ranks[0]);
    zt_status s = p->api->unique_id(id);
    if (s != ZT_OK)
        return zt_comm_fail(&p->base, s, "%s", zt_last_error());
    for (int k = 1; k < n; k++)
        ZT_TRY(zt_comm_send(&p->base, id->bytes, HALVES, ZT_F16, ranks[k]));
    return ZT_OK;
}

static zt_status nccl_create_group(zt_comm **out, zt_comm *parent, const int *ranks, int n,
                                   int me) {
    *out = NULL;
    nccl_comm *p = nc_of(parent), *c = alloc_comm(n);
    if (c && !(c->job_ranks = malloc((size_t)n * sizeof *c->job_ranks))) {
        nccl_destroy(&c->base);
        c = NULL;
    }
    if (!c)
        return zt_comm_fail(parent, ZT_ERR_NOMEM, "nccl rank %d: out of memory for a group of %d",
                            parent->rank, n);
    zt_dist_info d = {.rank = me, .world_size = n};
    zt_comm_init_header(&c->base, &zt_comm_nccl_ops, &d, parent->timeout_s);
    c->api = p->api;
    c->device = p->device;
    c->parent = parent;
    c->job = job_of(p);
    for (int k = 0; k < n; k++)
        c->job_ranks[k] = job_rank(p, ranks[k]);
    zt_nccl_id id;
    zt_status s = group_id(p, ranks, n, me, &id);
    if (s == ZT_OK && (s = c->api->create(&c->m, &id, n, me, c->device, c->base.timeout_s)) !=
                          ZT_OK) {
        /* The members that did join wait for this one until their timeout otherwise. */
        char label[160];
        group_label(c, label, sizeof label);
        s = zt_comm_fail(parent, s, "%s%s", label, zt_last_error());
    }
    if (s != ZT_OK) {
        nccl_destroy(&c->base);
        return s;
    }
    *out = &c->base;
    return ZT_OK;
}

const zt_comm_ops zt_comm_nccl_ops = {
    .name = "nccl",
    .create = nccl_create,
    .destroy = nccl_destroy,
    .abort = nccl_abort,
    .all_reduce = host_all_reduce,
    .reduce_scatter = host_reduce_scatter,
    .all_gather = host_all_gather,
    .broadcast = host_broadcast,
    .barrier = host_barrier,
    .send = host_send,
    .recv = host_recv,
    .attach = nccl_attach,
    .dev_all_reduce = dev_all_reduce,
    .dev_reduce_scatter = dev_reduce_scatter,
    .dev_all_gather = dev_all_gather,
    .dev_broadcast = dev_broadcast,
    .dev_send = dev_send,
    .dev_recv = dev_recv,
    .create_group = nccl_create_group,
};
