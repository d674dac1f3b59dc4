/* NCCL inside the CUDA module (ztrain/nccl.h's table): communicators made non-blocking and driven
 * by nccl_wait.h's protocol, so that every wait polls against the operation's deadline and a dead
 * or stuck peer ends in ncclCommAbort and an error, never a hang.
 *
 * Nothing here blocks the host before the watch starts: host buffers are staged through pinned
 * memory (a copy from or into pageable memory may wait for earlier work on the stream, which is
 * the collective that hangs), every copy is cudaMemcpyAsync on the stream NCCL uses (never the
 * legacy stream, which the backend's non-blocking streams do not wait for), and the staging is
 * allocated once and grown only between operations, never per message (cudaFree waits for the
 * whole device). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend.h"
#include "nccl_wait.h"
#include "ztrain/nccl.h"

_Static_assert(sizeof(ncclUniqueId) == ZT_NCCL_ID_BYTES, "ncclUniqueId is ZT_NCCL_ID_BYTES");

struct zt_nccl_comm {
    ncclComm_t nc;
    int rank, world, device;
    double timeout_s;
    zt_nccl_wait wait;
    cudaStream_t own;  /* the communicator's stream when no CUDA backend is attached */
    cudaStream_t st;   /* the stream of the current operation */
    zt_backend *be;    /* attached CUDA backend (its communication stream), or NULL */
    cudaEvent_t done;  /* recorded behind an operation's work */
    int64_t *hdr_host; /* [2] pinned: a message's header (count, dtype) */
    int64_t *hdr_dev;  /* [2] device */
    void *dstage;      /* device staging of host buffers, grown to the largest */
    size_t dstage_bytes;
    void *hstage; /* pinned staging of host buffers, as large as dstage */
    size_t hstage_bytes;
    char failure[400]; /* the first failure, which every later call repeats */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void pause_s(double s) {
    if (s <= 0)
        return;
    struct timespec ts = {0, (long)(s * 1e9)};
    nanosleep(&ts, NULL);
}

static void abort_comm(zt_nccl_comm *c) {
    if (c->nc) {
        ncclCommAbort(c->nc);
        c->nc = NULL;
    }
    c->wait.state = ZT_NCCL_ABORTED;
}

/* Records the first failure, aborts the communicator and returns s with the message. */
__attribute__((format(printf, 3, 4))) static zt_status fail(zt_nccl_comm *c, zt_status s,
                                                            const char *fmt, ...) {
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    abort_comm(c);
    if (!c->failure[0])
        snprintf(c->failure, sizeof c->failure, "nccl rank %d (GPU %d): %s", c->rank, c->device,
                 msg);
    return zt_error(s, "nccl rank %d (GPU %d): %s", c->rank, c->device, msg);
}

static zt_status check_cuda(zt_nccl_comm *c, cudaError_t e, const char *call) {
    if (e == cudaSuccess)
        return ZT_OK;
    return fail(c, ZT_ERR_IO, "%s failed: %s", call, cudaGetErrorString(e));
}
#define CUDA_TRY(c, call) ZT_TRY(check_cuda((c), (call), #call))

static zt_nccl_result result_of(ncclResult_t r) {
    return r == ncclSuccess ? ZT_NCCL_R_SUCCESS
           : r == ncclInProgress ? ZT_NCCL_R_IN_PROGRESS
                                 : ZT_NCCL_R_ERROR;
}

/* NCCL's text for r, and its last message on this communicator when it has one. */
static void nccl_text(zt_nccl_comm *c, ncclResult_t r, char *out, size_t cap) {
    const char *last = c->nc ? ncclGetLastError(c->nc) : NULL;
    snprintf(out, cap, "%s%s%s", ncclGetErrorString(r), last && last[0] ? ": " : "",
             last ? last : "");
}

/* Polls until the machine leaves SETTLING or RUNNING; the failure names the call (what). */
static zt_status drive(zt_nccl_comm *c, const char *what) {
    zt_nccl_verdict v = ZT_NCCL_POLL;
    ncclResult_t async = ncclSuccess;
    cudaError_t ev = cudaSuccess;
    while (v == ZT_NCCL_POLL) {
        pause_s(zt_nccl_wait_pause_s(&c->wait));
        /* The stream first, then the error: work that failed as it completed (the emulated
         * NCCL's, whose wait for a dead peer ends) shows its error in the same poll. */
        zt_nccl_result stream = ZT_NCCL_R_SUCCESS;
        if (c->wait.state == ZT_NCCL_RUNNING) {
            ev = cudaEventQuery(c->done);
            stream = ev == cudaSuccess         ? ZT_NCCL_R_SUCCESS
                     : ev == cudaErrorNotReady ? ZT_NCCL_R_IN_PROGRESS
                                               : ZT_NCCL_R_ERROR;
        }
        ncclResult_t r = ncclCommGetAsyncError(c->nc, &async);
        if (r != ncclSuccess)
            async = r;
        v = zt_nccl_wait_poll(&c->wait, result_of(async), stream, now_s());
    }
    if (v == ZT_NCCL_DONE)
        return ZT_OK;
    if (v == ZT_NCCL_TIMED_OUT)
        return fail(c, ZT_ERR_TIMEOUT,
                    "%s did not complete within %g s; a peer is dead or stuck", what,
                    c->timeout_s);
    char text[256];
    if (async != ncclSuccess && async != ncclInProgress)
        nccl_text(c, async, text, sizeof text);
    else
        snprintf(text, sizeof text, "%s", cudaGetErrorString(ev));
    return fail(c, ZT_ERR_IO, "%s failed: %s", what, text);
}

/* After an NCCL call: settled (polled out of ncclInProgress) or failed. */
static zt_status issued(zt_nccl_comm *c, ncclResult_t r, const char *call) {
    zt_nccl_verdict v = zt_nccl_wait_issued(&c->wait, result_of(r));
    if (v == ZT_NCCL_DONE)
        return ZT_OK;
    if (v == ZT_NCCL_POLL)
        return drive(c, call);
    char text[256];
    nccl_text(c, r, text, sizeof text);
    return fail(c, ZT_ERR_IO, "%s failed: %s", call, text);
}
#define NCCL_TRY(c, call) ZT_TRY(issued((c), (call), #call))

/* Waits for everything issued on the operation's stream. */
static zt_status finish(zt_nccl_comm *c, const char *what) {
    CUDA_TRY(c, cudaEventRecord(c->done, c->st));
    zt_nccl_wait_await(&c->wait);
    return drive(c, what);
}

/* The start of every operation: the communicator usable, this thread on its GPU, the stream
 * chosen, the deadline set. */
static zt_status begin(zt_nccl_comm *c, const char *what) {
    if (!c->nc || c->wait.state == ZT_NCCL_ABORTED)
        return zt_error(ZT_ERR_IO, "nccl rank %d: %s: the communicator was aborted: %s", c->rank,
                        what, c->failure[0] ? c->failure : "(no failure recorded)");
    if (!zt_nccl_wait_begin(&c->wait, now_s(), c->timeout_s))
        return fail(c, ZT_ERR_IO, "%s: an earlier operation was left unfinished", what);
    /* ZeRO's communication thread calls in too: the current device is per thread. */
    CUDA_TRY(c, cudaSetDevice(c->device));
    c->st = c->be ? ((zt_cuda_state *)c->be->impl)->stream[ZT_STREAM_COMM] : c->own;
    return ZT_OK;
}

/* Staging of at least bytes, device and pinned; grown only here, between operations. */
static zt_status stage(zt_nccl_comm *c, size_t bytes) {
    if (bytes <= c->dstage_bytes)
        return ZT_OK;
    CUDA_TRY(c, cudaSetDevice(c->device));
    if (c->dstage)
        cudaFree(c->dstage);
    if (c->hstage)
        cudaFreeHost(c->hstage);
    c->dstage = c->hstage = NULL;
    c->dstage_bytes = c->hstage_bytes = 0;
    CUDA_TRY(c, cudaMalloc(&c->dstage, bytes));
    CUDA_TRY(c, cudaHostAlloc(&c->hstage, bytes, cudaHostAllocPortable));
    c->dstage_bytes = c->hstage_bytes = bytes;
    return ZT_OK;
}

/* host → pinned → device staging, on the operation's stream. */
static zt_status stage_in(zt_nccl_comm *c, const void *host, size_t bytes) {
    memcpy(c->hstage, host, bytes);
    CUDA_TRY(c, cudaMemcpyAsync(c->dstage, c->hstage, bytes, cudaMemcpyHostToDevice, c->st));
    return ZT_OK;
}

/* Device staging → pinned, queued behind the collective; the caller finishes, then copies out. */
static zt_status stage_back(zt_nccl_comm *c, size_t bytes) {
    CUDA_TRY(c, cudaMemcpyAsync(c->hstage, c->dstage, bytes, cudaMemcpyDeviceToHost, c->st));
    return ZT_OK;
}

static ncclDataType_t type_of(zt_dtype t) {
    switch (t) {
    case ZT_BF16: return ncclBfloat16;
    case ZT_F16: return ncclFloat16;
    case ZT_F64: return ncclFloat64;
    default: return ncclFloat32;
    }
}

static ncclRedOp_t op_of(zt_nccl_op op) {
    return op == ZT_NCCL_AVG ? ncclAvg : op == ZT_NCCL_MAX ? ncclMax : ncclSum;
}

/* Equal pieces one after another: what NCCL's own reduce-scatter and all-gather take. */
static bool uniform(const zt_nccl_comm *c, const size_t *offsets, const size_t *counts) {
    for (int r = 1; r < c->world; r++)
        if (counts[r] != counts[0] || offsets[r] != offsets[0] + (size_t)r * counts[0])
            return false;
    return true;
}

/* ---- the operations ---------------------------------------------------------------------- */

static zt_status nccl_all_reduce(zt_nccl_comm *c, void *buf, size_t n, zt_dtype t,
                                 zt_nccl_op op) {
    ZT_TRY(begin(c, "all_reduce"));
    NCCL_TRY(c, ncclAllReduce(buf, buf, n, type_of(t), op_of(op), c->nc, c->st));
    return finish(c, "all_reduce");
}

/* Several calls as one group: inside it NCCL only queues (each returns ncclSuccess or an
 * argument error); ncclGroupEnd posts them and may return ncclInProgress. */
static zt_status group_end(zt_nccl_comm *c, ncclResult_t first_error, const char *what) {
    ncclResult_t end = ncclGroupEnd();
    if (first_error != ncclSuccess)
        return issued(c, first_error, what);
    return issued(c, end, "ncclGroupEnd");
}

static zt_status nccl_reduce_scatter(zt_nccl_comm *c, const void *in, void *out,
                                     const size_t *offsets, const size_t *counts, zt_dtype t,
                                     zt_nccl_op op) {
    ZT_TRY(begin(c, "reduce_scatter"));
    size_t es = zt_dtype_size(t);
    const char *src = in;
    if (uniform(c, offsets, counts)) {
        NCCL_TRY(c, ncclReduceScatter(src + offsets[0] * es, out, counts[0], type_of(t),
                                      op_of(op), c->nc, c->st));
    } else {
        /* Uneven pieces (a bucket cuts the ranks' slices unevenly): one reduce to each owner. */
        ncclResult_t bad = ncclGroupStart();
        for (int r = 0; r < c->world && bad == ncclSuccess; r++) {
            if (!counts[r])
                continue;
            void *dst = r == c->rank ? out : (void *)(src + offsets[r] * es);
            bad = ncclReduce(src + offsets[r] * es, dst, counts[r], type_of(t), op_of(op), r,
                             c->nc, c->st);
        }
        ZT_TRY(group_end(c, bad, "ncclReduce (a piece of a reduce_scatter)"));
    }
    return finish(c, "reduce_scatter");
}

/* The all-gather on device memory buf, issued (not finished). */
static zt_status gather_on(zt_nccl_comm *c, char *b, const size_t *offsets, const size_t *counts,
                           zt_dtype t) {
    size_t es = zt_dtype_size(t);
    if (uniform(c, offsets, counts)) {
        char *first = b + offsets[0] * es;
        NCCL_TRY(c, ncclAllGather(first + (size_t)c->rank * counts[0] * es, first, counts[0],
                                  type_of(t), c->nc, c->st));
        return ZT_OK;
    }
    ncclResult_t bad = ncclGroupStart();
    for (int r = 0; r < c->world && bad == ncclSuccess; r++) {
        if (!counts[r])
            continue;
        char *p = b + offsets[r] * es;
        bad = ncclBroadcast(p, p, counts[r], type_of(t), r, c->nc, c->st);
    }
    return group_end(c, bad, "ncclBroadcast (a piece of an all_gather)");
}

static zt_status nccl_all_gather(zt_nccl_comm *c, void *buf, size_t n, const size_t *offsets,
                                 const size_t *counts, zt_dtype t, zt_nccl_mem mem) {
    size_t bytes = n * zt_dtype_size(t);
    if (mem == ZT_NCCL_HOST)
        ZT_TRY(stage(c, bytes));
    ZT_TRY(begin(c, "all_gather"));
    if (mem == ZT_NCCL_DEVICE) {
        ZT_TRY(gather_on(c, buf, offsets, counts, t));
        return finish(c, "all_gather");
    }
    /* The whole range travels both ways, so elements in no piece come back as they were. */
    ZT_TRY(stage_in(c, buf, bytes));
    ZT_TRY(gather_on(c, c->dstage, offsets, counts, t));
    ZT_TRY(stage_back(c, bytes));
    ZT_TRY(finish(c, "all_gather"));
    memcpy(buf, c->hstage, bytes);
    return ZT_OK;
}

static zt_status nccl_broadcast(zt_nccl_comm *c, void *buf, size_t n, zt_dtype t, int root,
                                zt_nccl_mem mem) {
    size_t bytes = n * zt_dtype_size(t);
    if (mem == ZT_NCCL_HOST)
        ZT_TRY(stage(c, bytes));
    ZT_TRY(begin(c, "broadcast"));
    void *d = mem == ZT_NCCL_HOST ? c->dstage : buf;
    if (mem == ZT_NCCL_HOST && c->rank == root)
        ZT_TRY(stage_in(c, buf, bytes));
    NCCL_TRY(c, ncclBroadcast(d, d, n, type_of(t), root, c->nc, c->st));
    if (mem == ZT_NCCL_HOST && c->rank != root)
        ZT_TRY(stage_back(c, bytes));
    ZT_TRY(finish(c, "broadcast"));
    if (mem == ZT_NCCL_HOST && c->rank != root)
        memcpy(buf, c->hstage, bytes);
    return ZT_OK;
}

/* A message: its header (count and dtype), then its elements, in one operation. */
static zt_status nccl_send(zt_nccl_comm *c, const void *buf, size_t n, zt_dtype t, int peer,
                           zt_nccl_mem mem) {
    size_t bytes = n * zt_dtype_size(t);
    if (mem == ZT_NCCL_HOST)
        ZT_TRY(stage(c, bytes));
    ZT_TRY(begin(c, "send"));
    c->hdr_host[0] = (int64_t)n;
    c->hdr_host[1] = (int64_t)t;
    CUDA_TRY(c, cudaMemcpyAsync(c->hdr_dev, c->hdr_host, 2 * sizeof(int64_t),
                                cudaMemcpyHostToDevice, c->st));
    NCCL_TRY(c, ncclSend(c->hdr_dev, 2, ncclInt64, peer, c->nc, c->st));
    if (n) {
        const void *d = buf;
        if (mem == ZT_NCCL_HOST) {
            ZT_TRY(stage_in(c, buf, bytes));
            d = c->dstage;
        }
        NCCL_TRY(c, ncclSend(d, n, type_of(t), peer, c->nc, c->st));
    }
    return finish(c, "send");
}

static zt_status nccl_recv(zt_nccl_comm *c, void *buf, size_t n, zt_dtype t, int peer,
                           zt_nccl_mem mem) {
    size_t bytes = n * zt_dtype_size(t);
    if (mem == ZT_NCCL_HOST)
        ZT_TRY(stage(c, bytes));
    ZT_TRY(begin(c, "recv"));
    NCCL_TRY(c, ncclRecv(c->hdr_dev, 2, ncclInt64, peer, c->nc, c->st));
    CUDA_TRY(c, cudaMemcpyAsync(c->hdr_host, c->hdr_dev, 2 * sizeof(int64_t),
                                cudaMemcpyDeviceToHost, c->st));
    ZT_TRY(finish(c, "recv (the message's header)"));
    if (c->hdr_host[0] != (int64_t)n || c->hdr_host[1] != (int64_t)t)
        return fail(c, ZT_ERR_INVALID,
                    "recv: rank %d sent %lld elements of %s but rank %d expects %zu of %s", peer,
                    (long long)c->hdr_host[0], zt_dtype_name((zt_dtype)c->hdr_host[1]), c->rank,
                    n, zt_dtype_name(t));
    if (!n)
        return ZT_OK;
    ZT_TRY(begin(c, "recv"));
    void *d = mem == ZT_NCCL_HOST ? c->dstage : buf;
    NCCL_TRY(c, ncclRecv(d, n, type_of(t), peer, c->nc, c->st));
    if (mem == ZT_NCCL_HOST)
        ZT_TRY(stage_back(c, bytes));
    ZT_TRY(finish(c, "recv"));
    if (mem == ZT_NCCL_HOST)
        memcpy(buf, c->hstage, bytes);
    return ZT_OK;
}

/* ---- life cycle --------------------------------------------------------------------------- */

static int nccl_version(void) {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

static zt_status nccl_pick_device(int rank, int local_rank, int local_world, int *device) {
    int count = 0;
    *device = -1;
    if (zt_cuda_visible(&count) != ZT_OK)
        return zt_error_prefix(ZT_ERR_INVALID, "nccl rank %d: no CUDA device is visible: ", rank);
    if (count == 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return zt_error(ZT_ERR_INVALID, "nccl rank %d: no CUDA device is visible (0 devices; "
                        "CUDA_VISIBLE_DEVICES=%s)", rank, vis ? vis : "(unset)");
    }
    if (local_world > count)
        return zt_error(ZT_ERR_INVALID,
                        "nccl: %d ranks on this host share %d GPU(s), and NCCL needs a GPU of "
                        "its own per rank; use \"comm\": \"shm\" (or \"auto\"), which stages "
                        "through host memory", local_world, count);
    *device = local_rank % count;
    return ZT_OK;
}

static zt_status nccl_unique_id(zt_nccl_id *out) {
    ncclResult_t r = ncclGetUniqueId((ncclUniqueId *)out->bytes);
    if (r != ncclSuccess)
        return zt_error(ZT_ERR_IO, "nccl rank 0: ncclGetUniqueId failed: %s",
                        ncclGetErrorString(r));
    return ZT_OK;
}

static void nccl_destroy(zt_nccl_comm *c) {
    if (!c)
        return;
    cudaSetDevice(c->device);
    if (c->nc && c->wait.state == ZT_NCCL_READY &&
        zt_nccl_wait_begin(&c->wait, now_s(), c->timeout_s)) {
        /* A clean end: flush (polled like any call), then free; otherwise abort. */
        if (issued(c, ncclCommFinalize(c->nc), "ncclCommFinalize") == ZT_OK) {
            ncclCommDestroy(c->nc);
            c->nc = NULL;
        }
    }
    abort_comm(c);
    if (c->dstage)
        cudaFree(c->dstage);
    if (c->hstage)
        cudaFreeHost(c->hstage);
    if (c->hdr_dev)
        cudaFree(c->hdr_dev);
    if (c->hdr_host)
        cudaFreeHost(c->hdr_host);
    if (c->done)
        cudaEventDestroy(c->done);
    if (c->own)
        cudaStreamDestroy(c->own);
    free(c);
}

static void nccl_abort(zt_nccl_comm *c) {
    if (c)
        abort_comm(c);
}

static zt_status nccl_create(zt_nccl_comm **out, const zt_nccl_id *id, int world, int rank,
                             int device, double timeout_s) {
    *out = NULL;
    zt_nccl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return zt_error(ZT_ERR_NOMEM, "nccl rank %d: out of memory", rank);
    c->rank = rank;
    c->world = world;
    c->device = device;
    c->timeout_s = timeout_s;
    zt_nccl_wait_init(&c->wait);
    zt_status s = check_cuda(c, cudaSetDevice(device), "cudaSetDevice");
    if (s == ZT_OK)
        s = check_cuda(c, cudaStreamCreateWithFlags(&c->own, cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags");
    if (s == ZT_OK)
        s = check_cuda(c, cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
    if (s == ZT_OK)
        s = check_cuda(c, cudaMalloc((void **)&c->hdr_dev, 2 * sizeof(int64_t)), "cudaMalloc");
    if (s == ZT_OK)
        s = check_cuda(c, cudaHostAlloc((void **)&c->hdr_host, 2 * sizeof(int64_t),
                                        cudaHostAllocPortable), "cudaHostAlloc");
    if (s != ZT_OK) {
        nccl_destroy(c);
        return s;
    }
    /* Non-blocking, so that joining is polled against the timeout like every later call: a rank
     * that never joins ends in an abort. */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclUniqueId uid;
    memcpy(&uid, id->bytes, sizeof uid);
    zt_nccl_wait_begin(&c->wait, now_s(), timeout_s);
    ncclResult_t r = ncclCommInitRankConfig(&c->nc, world, uid, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        s = zt_error(ZT_ERR_IO, "nccl rank %d (GPU %d): ncclCommInitRankConfig failed: %s",
                     rank, device, ncclGetErrorString(r));
        nccl_destroy(c);
        return s;
    }
    s = issued(c, r, "ncclCommInitRankConfig");
    if (s == ZT_ERR_TIMEOUT)
        s = zt_error(ZT_ERR_TIMEOUT, "nccl rank %d: the communicator of %d ranks did not form "
                     "within %g s (a rank did not join)", rank, world, timeout_s);
    if (s != ZT_OK) {
        nccl_destroy(c);
        return s;
    }
    *out = c;
    return ZT_OK;
}

static zt_status nccl_attach(zt_nccl_comm *c, zt_backend *be) {
    if (be && (be->device != ZT_DEVICE_CUDA || be->device_index != c->device))
        return zt_error(ZT_ERR_INVALID, "nccl rank %d: cannot run on the streams of %s device "
                        "%d: the communicator has GPU %d", c->rank, be->name, be->device_index,
                        c->device);
    c->be = be;
    return ZT_OK;
}

static zt_status nccl_async_error(zt_nccl_comm *c) {
    if (!c->nc || c->wait.state == ZT_NCCL_ABORTED)
        return zt_error(ZT_ERR_IO, "nccl rank %d: the communicator was aborted: %s", c->rank,
                        c->failure[0] ? c->failure : "(no failure recorded)");
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c->nc, &async);
    if (r != ncclSuccess)
        async = r;
    if (async == ncclSuccess || async == ncclInProgress)
        return ZT_OK;
    char text[256];
    nccl_text(c, async, text, sizeof text);
    return fail(c, ZT_ERR_IO, "asynchronous error: %s", text);
}

static const zt_nccl_api api = {
    .version = ZT_NCCL_API_VERSION,
    .nccl_version = nccl_version,
    .pick_device = nccl_pick_device,
    .unique_id = nccl_unique_id,
    .create = nccl_create,
    .destroy = nccl_destroy,
    .abort = nccl_abort,
    .attach = nccl_attach,
    .async_error = nccl_async_error,
    .all_reduce = nccl_all_reduce,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .send = nccl_send,
    .recv = nccl_recv,
};

/* The module's entry point for NCCL, which kernels/backend.c finds with dlsym. */
const zt_nccl_api *zt_cuda_nccl_api(void) { return &api; }
