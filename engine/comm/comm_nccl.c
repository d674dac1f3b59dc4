/* The NCCL transport (comm_transport.h's table): GPU ranks on any number of hosts. Rank 0 hands
 * out the ncclUniqueId over the TCP store at MASTER_ADDR:MASTER_PORT (engine/comm/tcp_store.c), each
 * rank takes the GPU of its LOCAL_RANK, and every wait polls the collective's completion and
 * ncclCommGetAsyncError against the communicator's timeout, so a dead or stuck peer ends in
 * ncclCommAbort and an error, never a hang. Built only with the CUDA toolkit's NCCL present. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_transport.h"
#include "tcp_store.h"
#include "ztrain/backend.h"

#ifdef ZT_HAVE_CUDA
/* The CUDA backend's streams (this one file reaches into kernels/cuda/'s state, as comm_reduce.c
 * does into the CPU's): collectives run on its communication stream, in the order the ZeRO
 * communication thread's events set, overlapping the compute stream. */
#include "cuda_backend.h"
#endif

typedef struct {
    zt_comm base; /* first: casts between the two */
    ncclComm_t nc;
    int device;
    cudaStream_t own;
    cudaEvent_t done;
    /* Device staging for the calls that take host memory: grown to the largest, then reused. */
    void *dstage;
    size_t dstage_bytes;
    zt_tcp_store_server *server;
    zt_tcp_store *store;
    char prefix[200]; /* the store's keys of this job */
} nccl_comm;

/* One checked call: the CUDA or NCCL error names the statement that failed. */
#define NCCL_CHECK_GEN(kind, type, ok, errstr)                                                   \
    static zt_status check_##kind(nccl_comm *c, type r, const char *stmt) {                     \
        if (r == ok)                                                                             \
            return ZT_OK;                                                                        \
        return zt_comm_fail(&c->base, ZT_ERR_IO, "nccl rank %d (GPU %d): %s failed: %s",        \
                            c->base.rank, c->device, stmt, errstr(r));                           \
    }
NCCL_CHECK_GEN(cuda, cudaError_t, cudaSuccess, cudaGetErrorString)
NCCL_CHECK_GEN(nccl, ncclResult_t, ncclSuccess, ncclGetErrorString)
#define CUDA_CHECK(c, call) ZT_TRY(check_cuda((c), (call), #call))
#define NCCL_CHECK(c, call) ZT_TRY(check_nccl((c), (call), #call))

static nccl_comm *nc_of(zt_comm *c) { return (nccl_comm *)c; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static ncclDataType_t nccl_type(zt_dtype t) {
    switch (t) {
    case ZT_F32: return ncclFloat32;
    case ZT_BF16: return ncclBfloat16;
    case ZT_F16: return ncclFloat16;
    case ZT_F64: return ncclFloat64;
    default: break;
    }
    ZT_ASSERT(!"dtype checked by comm.c");
    return ncclFloat32;
}

static ncclRedOp_t nccl_op(zt_reduce_op op) {
    return op == ZT_REDUCE_AVG ? ncclAvg : op == ZT_REDUCE_MAX ? ncclMax : ncclSum;
}

/* The stream collectives run on: the backend's communication stream when it offers one, else
 * the transport's own (after everything the backend issued, so its buffers are ready). */
static zt_status stream_of(nccl_comm *c, cudaStream_t *out) {
    CUDA_CHECK(c, cudaSetDevice(c->device));
    zt_backend *be = c->base.be;
#ifdef ZT_HAVE_CUDA
    if (be && be->device == ZT_DEVICE_CUDA) {
        *out = ((zt_cuda_state *)be->impl)->stream[ZT_STREAM_COMM];
        return ZT_OK;
    }
#endif
    /* Without the backend's streams: after everything it issued, on the transport's own. */
    if (be)
        ZT_TRY(zt_backend_sync(be));
    *out = c->own;
    return ZT_OK;
}

/* Names the ranks that said, through the store, that they failed ("" when none did). */
static void failed_peers(nccl_comm *c, char *out, size_t cap) {
    size_t len = 0;
    out[0] = '\0';
    zt_tcp_store_set_timeout(c->store, 1.0);
    for (int r = 0; r < c->base.world && len + 64 < cap; r++) {
        if (r == c->base.rank)
            continue;
        char key[256];
        void *v = NULL;
        size_t n = 0;
        snprintf(key, sizeof key, "%s/failed/%d", c->prefix, r);
        if (zt_tcp_store_get(c->store, key, &v, &n, 0) == ZT_OK) {
            int w = snprintf(out + len, cap - len, "%srank %d: %.120s", len ? "; " : "", r,
                             (const char *)v);
            if (w > 0)
                len += (size_t)w < cap - len ? (size_t)w : cap - len - 1;
        }
        free(v);
    }
    zt_tcp_store_set_timeout(c->store, c->base.timeout_s);
}

/* Waits for what was issued on st: polls its completion and NCCL's asynchronous error; past
 * the timeout, or on an error, the communicator is aborted and the failure names the ranks that
 * reported one. */
static zt_status wait_done(nccl_comm *c, cudaStream_t st, const char *what) {
    CUDA_CHECK(c, cudaEventRecord(c->done, st));
    double start = now_s();
    for (long spin = 0;; spin++) {
        cudaError_t q = cudaEventQuery(c->done);
        if (q == cudaSuccess)
            return ZT_OK;
        if (q != cudaErrorNotReady)
            return check_cuda(c, q, "cudaEventQuery (the collective's completion)");
        ncclResult_t async = ncclSuccess;
        NCCL_CHECK(c, ncclCommGetAsyncError(c->nc, &async));
        bool late = now_s() - start > c->base.timeout_s;
        if (async != ncclSuccess || late) {
            char peers[256];
            ncclCommAbort(c->nc);
            c->nc = NULL;
            failed_peers(c, peers, sizeof peers);
            return zt_comm_fail(&c->base, late ? ZT_ERR_TIMEOUT : ZT_ERR_IO,
                                "nccl rank %d: %s %s%s%s%s", c->base.rank, what,
                                late ? "did not complete within the timeout; a peer is dead or "
                                       "stuck"
                                     : "failed: ",
                                late ? "" : ncclGetErrorString(async),
                                peers[0] ? "; failed peers: " : "", peers);
        }
        if (spin > 1000) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
}

static zt_status device_stage(nccl_comm *c, size_t bytes, void **out) {
    if (bytes > c->dstage_bytes) {
        if (c->dstage)
            cudaFree(c->dstage);
        c->dstage = NULL;
        c->dstage_bytes = 0;
        CUDA_CHECK(c, cudaMalloc(&c->dstage, bytes ? bytes : 1));
        c->dstage_bytes = bytes;
    }
    *out = c->dstage;
    return ZT_OK;
}

/* ---- device buffers ---------------------------------------------------------------------- */

static zt_status dev_all_reduce(zt_comm *base, void *buf, size_t n, zt_dtype t,
                                zt_reduce_op op) {
    nccl_comm *c = nc_of(base);
    cudaStream_t st;
    ZT_TRY(stream_of(c, &st));
    NCCL_CHECK(c, ncclAllReduce(buf, buf, n, nccl_type(t), nccl_op(op), c->nc, st));
    return wait_done(c, st, "all_reduce");
}

/* Equal pieces one after another: what NCCL's own reduce-scatter and all-gather take. */
static bool uniform(const nccl_comm *c, const size_t *offsets, const size_t *counts) {
    for (int r = 1; r < c->base.world; r++)
        if (counts[r] != counts[0] || offsets[r] != offsets[0] + (size_t)r * counts[0])
            return false;
    return true;
}

static zt_status dev_reduce_scatter(zt_comm *base, const void *in, void *out, size_t n,
                                    const size_t *offsets, const size_t *counts, zt_dtype t,
                                    zt_reduce_op op) {
    nccl_comm *c = nc_of(base);
    cudaStream_t st;
    ZT_TRY(stream_of(c, &st));
    size_t es = zt_dtype_size(t);
    const char *src = in;
    if (uniform(c, offsets, counts)) {
        NCCL_CHECK(c, ncclReduceScatter(src + offsets[0] * es, out, counts[0], nccl_type(t),
                                        nccl_op(op), c->nc, st));
    } else {
        /* Uneven pieces (a bucket cuts the ranks' slices unevenly): one reduce to each owner. */
        NCCL_CHECK(c, ncclGroupStart());
        for (int r = 0; r < c->base.world; r++) {
            if (!counts[r])
                continue;
            void *dst = r == c->base.rank ? out : (void *)(src + offsets[r] * es);
            ncclResult_t res = ncclReduce(src + offsets[r] * es, dst, counts[r], nccl_type(t),
                                          nccl_op(op), r, c->nc, st);
            if (res != ncclSuccess) {
                ncclGroupEnd();
                return check_nccl(c, res, "ncclReduce (a piece of a reduce_scatter)");
            }
        }
        NCCL_CHECK(c, ncclGroupEnd());
    }
    return wait_done(c, st, "reduce_scatter");
}

static zt_status dev_all_gather(zt_comm *base, void *buf, size_t n, const size_t *offsets,
                                const size_t *counts, zt_dtype t) {
    nccl_comm *c = nc_of(base);
    cudaStream_t st;
    ZT_TRY(stream_of(c, &st));
    size_t es = zt_dtype_size(t);
    char *b = buf;
    if (uniform(c, offsets, counts)) {
        char *first = b + offsets[0] * es;
        NCCL_CHECK(c, ncclAllGather(first + (size_t)c->base.rank * counts[0] * es, first,
                                    counts[0], nccl_type(t), c->nc, st));
    } else {
        NCCL_CHECK(c, ncclGroupStart());
        for (int r = 0; r < c->base.world; r++) {
            if (!counts[r])
                continue;
            char *p = b + offsets[r] * es;
            ncclResult_t res = ncclBroadcast(p, p, counts[r], nccl_type(t), r, c->nc, st);
            if (res != ncclSuccess) {
                ncclGroupEnd();
                return check_nccl(c, res, "ncclBroadcast (a piece of an all_gather)");
            }
        }
        NCCL_CHECK(c, ncclGroupEnd());
    }
    return wait_done(c, st, "all_gather");
}

static zt_status dev_broadcast(zt_comm *base, void *buf, size_t n, zt_dtype t, int root) {
    nccl_comm *c = nc_of(base);
    cudaStream_t st;
    ZT_TRY(stream_of(c, &st));
    NCCL_CHECK(c, ncclBroadcast(buf, buf, n, nccl_type(t), root, c->nc, st));
    return wait_done(c, st, "broadcast");
}

/* A message is its header (count and dtype, so the receiver can refuse a mismatch as comm.h
 * says) and then its elements. */
static zt_status dev_send(zt_comm *base, const void *buf, size_t n, zt_dtype t, int peer) {
    nccl_comm *c = nc_of(base);
    cudaStream_t st;
    ZT_TRY(stream_of(c, &st));
    int64_t hdr[2] = {(int64_t)n, (int64_t)t};
    void *h;
    ZT_TRY(device_stage(c, sizeof hdr, &h));
    CUDA_CHECK(c, cudaMemcpyAsync(h, hdr, sizeof hdr, cudaMemcpyHostToDevice, st));
    NCCL_CHECK(c, ncclSend(h, 2, ncclInt64, peer, c->nc, st));
    if (n)
        NCCL_CHECK(c, ncclSend(buf, n, nccl_type(t), peer, c->nc, st));
    return wait_done(c, st, "send");
}

static zt_status dev_recv(zt_comm *base, void *buf, size_t n, zt_dtype t, int peer) {
    nccl_comm *c = nc_of(base);
    cudaStream_t st;
    ZT_TRY(stream_of(c, &st));
    int64_t hdr[2];
    void *h;
    ZT_TRY(device_stage(c, sizeof hdr, &h));
    NCCL_CHECK(c, ncclRecv(h, 2, ncclInt64, peer, c->nc, st));
    CUDA_CHECK(c, cudaMemcpyAsync(hdr, h, sizeof hdr, cudaMemcpyDeviceToHost, st));
    ZT_TRY(wait_done(c, st, "recv"));
    if (hdr[0] != (int64_t)n || hdr[1] != (int64_t)t)
        return zt_comm_fail(base, ZT_ERR_INVALID,
                            "recv: rank %d sent %lld elements of %s but rank %d expects %zu of %s",
                            peer, (long long)hdr[0], zt_dtype_name((zt_dtype)hdr[1]),
                            c->base.rank, n, zt_dtype_name(t));
    if (n)
        NCCL_CHECK(c, ncclRecv(buf, n, nccl_type(t), peer, c->nc, st));
    return wait_done(c, st, "recv");
}

/* ---- host buffers: through the device staging ------------------------------------------- */

/* Host reductions go the exact way comm.h promises (rank order, fp32 for 16-bit, NaN kept by
 * MAX): each rank's values are all-gathered on the device, brought back, and reduced on the host
 * with the shared reducer. These are small (losses, flags, norms). */
static zt_status host_all_reduce(zt_comm *base, void *buf, size_t n, zt_dtype t,
                                 zt_reduce_op op) {
    nccl_comm *c = nc_of(base);
    size_t bytes = n * zt_dtype_size(t), all = bytes * (size_t)c->base.world;
    void *d;
    ZT_TRY(device_stage(c, all, &d));
    cudaStream_t st;
    ZT_TRY(stream_of(c, &st));
    char *mine = (char *)d + bytes * (size_t)c->base.rank;
    CUDA_CHECK(c, cudaMemcpyAsync(mine, buf, bytes, cudaMemcpyHostToDevice, st));
    if (n)
        NCCL_CHECK(c, ncclAllGather(mine, d, bytes, ncclUint8, c->nc, st));
    char *h = malloc(all ? all : 1);
    if (!h)
        return zt_comm_fail(base, ZT_ERR_NOMEM, "all_reduce: no host memory for %zu bytes", all);
    zt_status s = check_cuda(c, cudaMemcpyAsync(h, d, all, cudaMemcpyDeviceToHost, st),
                             "cudaMemcpyAsync (the gathered values)");
    if (s == ZT_OK)
        s = wait_done(c, st, "all_reduce");
    if (s == ZT_OK)
        zt_comm_reduce(buf, h, bytes, c->base.world, n, t, op);
    free(h);
    return s;
}

static zt_status host_reduce_scatter(zt_comm *base, const void *in, void *out, size_t n,
                                     const size_t *offsets, const size_t *counts, zt_dtype t,
                                     zt_reduce_op op) {
    nccl_comm *c = nc_of(base);
    size_t es = zt_dtype_size(t), bytes = n * es;
    char *tmp = malloc(bytes ? bytes : 1);
    if (!tmp)
        return zt_comm_fail(base, ZT_ERR_NOMEM, "reduce_scatter: no host memory for %zu bytes",
                            bytes);
    memcpy(tmp, in, bytes);
    zt_status s = host_all_reduce(base, tmp, n, t, op);
    if (s == ZT_OK)
        memmove(out, tmp + offsets[c->base.rank] * es, counts[c->base.rank] * es);
    free(tmp);
    return s;
}

/* Runs a device entry on a staged copy of a host buffer and brings the result back. */
static zt_status staged(nccl_comm *c, void *buf, size_t bytes, bool back,
                        zt_status (*run)(nccl_comm *c, void *d, void *ctx), void *ctx) {
    void *d;
    ZT_TRY(device_stage(c, bytes, &d));
    CUDA_CHECK(c, cudaSetDevice(c->device));
    CUDA_CHECK(c, cudaMemcpy(d, buf, bytes, cudaMemcpyHostToDevice));
    ZT_TRY(run(c, d, ctx));
    if (back)
        CUDA_CHECK(c, cudaMemcpy(buf, d, bytes, cudaMemcpyDeviceToHost));
    return ZT_OK;
}

typedef struct {
    size_t n;
    const size_t *offsets, *counts;
    zt_dtype t;
    int peer;
} call;

static zt_status run_gather(nccl_comm *c, void *d, void *ctx) {
    call *a = ctx;
    return dev_all_gather(&c->base, d, a->n, a->offsets, a->counts, a->t);
}
static zt_status run_bcast(nccl_comm *c, void *d, void *ctx) {
    call *a = ctx;
    return dev_broadcast(&c->base, d, a->n, a->t, a->peer);
}
static zt_status run_send(nccl_comm *c, void *d, void *ctx) {
    call *a = ctx;
    return dev_send(&c->base, d, a->n, a->t, a->peer);
}
static zt_status run_recv(nccl_comm *c, void *d, void *ctx) {
    call *a = ctx;
    return dev_recv(&c->base, d, a->n, a->t, a->peer);
}

/* All-gather and broadcast of host buffers: the whole buffer through the device staging. */
static zt_status host_all_gather(zt_comm *base, void *buf, size_t n, const size_t *offsets,
                                 const size_t *counts, zt_dtype t) {
    call a = {n, offsets, counts, t, 0};
    return staged(nc_of(base), buf, n * zt_dtype_size(t), true, run_gather, &a);
}
static zt_status host_broadcast(zt_comm *base, void *buf, size_t n, zt_dtype t, int root) {
    call a = {n, NULL, NULL, t, root};
    return staged(nc_of(base), buf, n * zt_dtype_size(t), true, run_bcast, &a);
}
static zt_status host_barrier(zt_comm *base) {
    float one = 1;
    return host_all_reduce(base, &one, 1, ZT_F32, ZT_REDUCE_SUM);
}

/* Host send and recv go through device memory of their own (the staging also carries the
 * header), allocated per message: pipelines on NCCL pass device buffers (zt_comm_dev_send). */
static zt_status host_p2p(zt_comm *base, void *buf, size_t n, zt_dtype t, int peer, bool send) {
    nccl_comm *c = nc_of(base);
    size_t bytes = n * zt_dtype_size(t);
    void *d = NULL;
    CUDA_CHECK(c, cudaSetDevice(c->device));
    CUDA_CHECK(c, cudaMalloc(&d, bytes ? bytes : 1));
    zt_status s = ZT_OK;
    call a = {n, NULL, NULL, t, peer};
    if (send)
        s = check_cuda(c, cudaMemcpy(d, buf, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    if (s == ZT_OK)
        s = send ? run_send(c, d, &a) : run_recv(c, d, &a);
    if (s == ZT_OK && !send)
        s = check_cuda(c, cudaMemcpy(buf, d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    cudaFree(d);
    return s;
}
static zt_status host_send(zt_comm *base, const void *buf, size_t n, zt_dtype t, int peer) {
    return host_p2p(base, (void *)buf, n, t, peer, true);
}
static zt_status host_recv(zt_comm *base, void *buf, size_t n, zt_dtype t, int peer) {
    return host_p2p(base, buf, n, t, peer, false);
}

/* ---- life cycle --------------------------------------------------------------------------- */

static void nccl_abort(zt_comm *base) {
    nccl_comm *c = nc_of(base);
    if (c->store) {
        char key[256];
        snprintf(key, sizeof key, "%s/failed/%d", c->prefix, c->base.rank);
        zt_tcp_store_set_timeout(c->store, 1.0);
        zt_tcp_store_set(c->store, key, c->base.failure, strlen(c->base.failure) + 1);
    }
    if (c->nc) {
        ncclCommAbort(c->nc);
        c->nc = NULL;
    }
}

static void nccl_destroy(zt_comm *base) {
    nccl_comm *c = nc_of(base);
    cudaSetDevice(c->device);
    if (c->nc) {
        /* A clean end: flush, then free; a failed communicator was aborted already. */
        if (ncclCommFinalize(c->nc) == ncclSuccess)
            ncclCommDestroy(c->nc);
        else
            ncclCommAbort(c->nc);
    }
    if (c->dstage)
        cudaFree(c->dstage);
    if (c->done)
        cudaEventDestroy(c->done);
    if (c->own)
        cudaStreamDestroy(c->own);
    zt_tcp_store_close(c->store);
    zt_tcp_store_server_stop(c->server);
    free(c);
}

static zt_status nccl_attach(zt_comm *base, zt_backend *be) {
    nccl_comm *c = nc_of(base);
    if (be && (be->device != ZT_DEVICE_CUDA || be->device_index != c->device))
        return zt_error(ZT_ERR_INVALID,
                        "nccl rank %d: the engine computes on %s device %d but the communicator "
                        "took GPU %d (LOCAL_RANK %% visible GPUs)", c->base.rank, be->name,
                        be->device_index, c->device);
    return ZT_OK;
}

/* The rendezvous: rank 0 serves the store and publishes the unique id; the others read it. */
static zt_status exchange_id(nccl_comm *c, const zt_dist_info *d, ncclUniqueId *id) {
    if (d->rank == 0)
        ZT_TRY(zt_tcp_store_server_start(&c->server, zt_tcp_store_bind_host(d->master_addr),
                                         d->master_port, zt_tcp_store_secret()));
    ZT_TRY(zt_tcp_store_connect(&c->store, d->master_addr, d->master_port, c->base.timeout_s,
                                zt_tcp_store_secret()));
    char key[256];
    snprintf(key, sizeof key, "%s/id", c->prefix);
    if (d->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess)
            return zt_error(ZT_ERR_IO, "nccl rank 0: ncclGetUniqueId failed: %s",
                            ncclGetErrorString(r));
        return zt_tcp_store_set(c->store, key, id, sizeof *id);
    }
    void *v = NULL;
    size_t n = 0;
    ZT_TRY(zt_tcp_store_get(c->store, key, &v, &n, c->base.timeout_s));
    zt_status s = ZT_OK;
    if (n != sizeof *id)
        s = zt_error(ZT_ERR_INVALID, "nccl rank %d: the unique id at %s:%d is %zu bytes, not %zu",
                     d->rank, d->master_addr, d->master_port, n, sizeof *id);
    else
        memcpy(id, v, sizeof *id);
    free(v);
    return s;
}

/* Non-blocking initialisation, polled against the timeout: a rank that never joins ends in an
 * abort, not a hang. */
static zt_status init_comm(nccl_comm *c, const zt_dist_info *d, ncclUniqueId id) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c->nc, d->world_size, id, d->rank, &cfg);
    double start = now_s();
    while (r == ncclInProgress || r == ncclSuccess) {
        ncclResult_t state = ncclInProgress;
        if (!c->nc || ncclCommGetAsyncError(c->nc, &state) != ncclSuccess)
            break;
        if (state == ncclSuccess)
            return ZT_OK;
        if (state != ncclInProgress) {
            r = state;
            break;
        }
        if (now_s() - start > c->base.timeout_s) {
            ncclCommAbort(c->nc);
            c->nc = NULL;
            return zt_error(ZT_ERR_TIMEOUT,
                            "nccl rank %d: the communicator of %d ranks did not form within "
                            "%g s (a rank did not join at %s:%d)", d->rank, d->world_size,
                            c->base.timeout_s, d->master_addr, d->master_port);
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (c->nc)
        ncclCommAbort(c->nc);
    c->nc = NULL;
    return zt_error(ZT_ERR_IO, "nccl rank %d (GPU %d): ncclCommInitRankConfig failed: %s",
                    d->rank, c->device, ncclGetErrorString(r));
}

static zt_status nccl_create(zt_comm **out, const zt_dist_info *d, double timeout_s) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return zt_error(ZT_ERR_INVALID,
                        "nccl rank %d: no CUDA device is visible (%s; CUDA_VISIBLE_DEVICES=%s)",
                        d->rank, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices",
                        getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES")
                                                       : "(unset)");
    if (d->local_world_size > count)
        return zt_error(ZT_ERR_INVALID,
                        "nccl: %d ranks on this host share %d GPU(s), and NCCL needs a GPU of "
                        "its own per rank; use \"comm\": \"shm\" (or \"auto\"), which stages "
                        "through host memory", d->local_world_size, count);
    nccl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return zt_error(ZT_ERR_NOMEM, "nccl: out of memory");
    zt_comm_init_header(&c->base, &zt_comm_nccl_ops, d, timeout_s);
    c->device = d->local_rank % count;
    snprintf(c->prefix, sizeof c->prefix, "zt/nccl/%s", d->run_id);
    ncclUniqueId id;
    zt_status s = ZT_OK;
    if (cudaSetDevice(c->device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->own, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming) != cudaSuccess)
        s = zt_error(ZT_ERR_IO, "nccl rank %d: cannot set up GPU %d: %s", d->rank, c->device,
                     cudaGetErrorString(cudaGetLastError()));
    if (s == ZT_OK)
        s = exchange_id(c, d, &id);
    if (s == ZT_OK)
        s = init_comm(c, d, id);
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
};
