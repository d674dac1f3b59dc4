/* NCCL inside the CUDA module (ztrain/nccl.h's table): communicators made non-blocking and driven
 * by nccl_wait.h's protocol, so that every wait polls against the operation's deadline and a dead
 * or stuck peer ends in ncclCommAbort and an error, never a hang.
 *
 * Collectives and messages on device memory are posted, not awaited: once NCCL took the call,
 * it runs on the stream in order with the compute around it, and the host goes on. The backend's
 * next host wait watches them (stream_watch.c calls watch() below between its polls of the
 * stream), so a dead or stuck peer still ends in an abort and an error at the deadline of the
 * oldest posted operation. A message's header (count and dtype) travels in a slot of its own,
 * checked as soon as an event behind its copy to the host has fired (the watch and every poll
 * look), so that a count or type the sender did not send is an error naming both ranks at
 * once, not the timeout of a payload that never arrives; at the latest when the posted work is
 * known complete.
 *
 * Nothing here blocks the host before the watch starts: host buffers are staged through pinned
 * memory (a copy from or into pageable memory may wait for earlier work on the stream, which is
 * the collective that hangs), every copy is cudaMemcpyAsync on the stream NCCL uses (never the
 * legacy stream, which the backend's non-blocking streams do not wait for), and the staging is
 * allocated once and grown only between operations, never per message (cudaFree waits for the
 * whole device). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend.h"
#include "device_vmm.h"
#include "nccl_wait.h"
#include "ztrain/nccl.h"

_Static_assert(sizeof(ncclUniqueId) == ZT_NCCL_ID_BYTES, "ncclUniqueId is ZT_NCCL_ID_BYTES");

/* Message headers posted between two retirements; one more waits for them first. */
enum { ZT_NCCL_SLOTS = 64 };

struct zt_nccl_comm {
    ncclComm_t nc;
    int rank, world, device;
    double timeout_s;
    zt_nccl_wait wait;
    cudaStream_t own;  /* the communicator's stream when no CUDA backend is attached */
    cudaStream_t st;   /* the stream of the current operation */
    zt_backend *be;    /* attached CUDA backend (its communication stream), or NULL */
    cudaEvent_t done;   /* recorded behind an operation's work */
    cudaEvent_t posted; /* recorded behind the last posted operation */
    cudaEvent_t mark;   /* recorded behind the posted work when its deadline last began */
    /* One call at a time (ZeRO's communication thread and the main thread both call), and the
     * backend's watch (which skips a communicator whose call is under way) beside them. */
    pthread_mutex_t mu;
    /* The handle nc: every NCCL call on it is made holding nc_mu, and only for the call (on a
     * non-blocking communicator each returns at once), so that an abort from another thread,
     * which cannot wait for mu (a call stuck on a dead peer holds it up to its deadline), never
     * frees the handle under a call; abort_asked then tells that call to give up. */
    pthread_mutex_t nc_mu;
    atomic_bool abort_asked;
    /* Message headers (count, dtype), a slot each until retired, used as a ring in the order
     * the messages are posted: a posted send's is read by its copy when the stream gets there,
     * a posted receive's checked once its event fired, or at retirement. */
    int64_t *hdr_host; /* [ZT_NCCL_SLOTS][2] pinned */
    int64_t *hdr_dev;  /* [ZT_NCCL_SLOTS][2] device */
    cudaEvent_t hdr_ev[ZT_NCCL_SLOTS]; /* behind a posted receive's header copy to hdr_host */
    struct {
        int64_t n, t; /* what the receive expects */
        int peer;     /* -1: a send's slot, nothing to check */
        bool checked; /* its header was found as expected */
        long seq;     /* the posting sequence number of its operation (zt_nccl_wait.seq) */
    } slot[ZT_NCCL_SLOTS];
    unsigned slot_lo, slot_hi; /* the slots in use: [lo, hi), each modulo ZT_NCCL_SLOTS */
    long posted_seq; /* wait.seq for other threads (the backend's mark), atomically */
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

/* Takes nc_mu for one NCCL call on c->nc: false (and nothing held) once the handle is gone. */
static bool nc_enter(zt_nccl_comm *c) {
    pthread_mutex_lock(&c->nc_mu);
    if (c->nc)
        return true;
    pthread_mutex_unlock(&c->nc_mu);
    return false;
}

static ncclResult_t nc_leave(zt_nccl_comm *c, ncclResult_t r) {
    pthread_mutex_unlock(&c->nc_mu);
    return r;
}

/* An NCCL call on the handle, made under nc_mu; ncclInvalidUsage once the handle is aborted. */
#define NC(c, call) (nc_enter(c) ? nc_leave((c), (call)) : ncclInvalidUsage)

/* Whether the handle is still there (not aborted). */
static bool live(zt_nccl_comm *c) { return nc_enter(c) && nc_leave(c, ncclSuccess) == ncclSuccess; }

/* ncclCommAbort, at most once: any thread may call it (NCCL's abort is what ends a call that
 * waits for a dead peer). */
static void release_handle(zt_nccl_comm *c) {
    pthread_mutex_lock(&c->nc_mu);
    if (c->nc) {
        ncclCommAbort(c->nc);
        c->nc = NULL;
    }
    pthread_mutex_unlock(&c->nc_mu);
}

/* By the thread that owns the call (holding mu), or with no call possible. */
static void abort_comm(zt_nccl_comm *c) {
    release_handle(c);
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
    char last[200] = "";
    if (nc_enter(c)) {
        const char *l = ncclGetLastError(c->nc);
        snprintf(last, sizeof last, "%s", l ? l : "");
        nc_leave(c, ncclSuccess);
    }
    snprintf(out, cap, "%s%s%s", ncclGetErrorString(r), last[0] ? ": " : "", last);
}

/* The call under way gives up when another thread aborted the communicator (nccl_abort). */
static bool abort_asked(zt_nccl_comm *c) { return atomic_load(&c->abort_asked); }

static zt_status aborted_under(zt_nccl_comm *c, const char *what) {
    return fail(c, ZT_ERR_IO, "%s: the communicator was aborted (zt_nccl_api.abort) while the "
                "call waited", what);
}

static zt_status check_landed(zt_nccl_comm *c);

/* Polls until the machine leaves SETTLING or RUNNING; the failure names the call (what). */
static zt_status drive(zt_nccl_comm *c, const char *what) {
    zt_nccl_verdict v = ZT_NCCL_POLL;
    ncclResult_t async = ncclSuccess;
    cudaError_t ev = cudaSuccess;
    while (v == ZT_NCCL_POLL) {
        pause_s(zt_nccl_wait_pause_s(&c->wait));
        if (abort_asked(c))
            return aborted_under(c, what);
        /* The stream first, then the error: work that failed as it completed (the emulated
         * NCCL's, whose wait for a dead peer ends) shows its error in the same poll. */
        zt_nccl_result stream = ZT_NCCL_R_SUCCESS;
        if (c->wait.state == ZT_NCCL_RUNNING) {
            ev = cudaEventQuery(c->done);
            stream = ev == cudaSuccess         ? ZT_NCCL_R_SUCCESS
                     : ev == cudaErrorNotReady ? ZT_NCCL_R_IN_PROGRESS
                                               : ZT_NCCL_R_ERROR;
        }
        /* A posted receive's header that disagrees, before what NCCL makes of its payload. */
        if (c->wait.state == ZT_NCCL_RUNNING && stream != ZT_NCCL_R_SUCCESS)
            ZT_TRY(check_landed(c));
        ncclResult_t r = NC(c, ncclCommGetAsyncError(c->nc, &async));
        if (r != ncclSuccess)
            async = r;
        v = zt_nccl_wait_poll(&c->wait, result_of(async), stream, now_s());
    }
    if (v != ZT_NCCL_DONE && abort_asked(c))
        return aborted_under(c, what);
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
    if (r != ncclSuccess && r != ncclInProgress && abort_asked(c))
        return aborted_under(c, call);
    zt_nccl_verdict v = zt_nccl_wait_issued(&c->wait, result_of(r));
    if (v == ZT_NCCL_DONE)
        return ZT_OK;
    if (v == ZT_NCCL_POLL)
        return drive(c, call);
    char text[256];
    nccl_text(c, r, text, sizeof text);
    return fail(c, ZT_ERR_IO, "%s failed: %s", call, text);
}
#define NCCL_TRY(c, call) ZT_TRY(issued((c), NC((c), (call)), #call))

/* Slot k's received header against what its receive expects. */
static zt_status check_header(zt_nccl_comm *c, unsigned k) {
    const int64_t *h = c->hdr_host + 2 * k;
    if (c->slot[k].peer < 0 || c->slot[k].checked)
        return ZT_OK;
    if (h[0] != c->slot[k].n || h[1] != c->slot[k].t) {
        /* A receive whose peer died ends with whatever its buffer held: NCCL's remote error,
         * naming the peer, is the cause, not the header. (A header that truly disagrees may
         * come with an error of NCCL's too, of usage: the header names it better.) */
        ncclResult_t async = ncclSuccess;
        if (NC(c, ncclCommGetAsyncError(c->nc, &async)) == ncclSuccess &&
            (async == ncclRemoteError || async == ncclSystemError)) {
            char text[256];
            nccl_text(c, async, text, sizeof text);
            return fail(c, ZT_ERR_IO, "a posted collective failed: %s", text);
        }
        return fail(c, ZT_ERR_INVALID,
                    "recv: rank %d sent %lld elements of %s but rank %d expects %lld of %s",
                    c->slot[k].peer, (long long)h[0],
                    (unsigned long long)h[1] < ZT_DTYPE_COUNT ? zt_dtype_name((zt_dtype)h[1])
                                                              : "an unknown type",
                    c->rank, (long long)c->slot[k].n, zt_dtype_name((zt_dtype)c->slot[k].t));
    }
    c->slot[k].checked = true;
    return ZT_OK;
}

/* The posted receives whose headers have landed, in posting order (they land in that order on
 * the one stream), up to the first still on its way. A header that disagrees fails at once:
 * NCCL would otherwise wait for a payload of the expected size until the deadline, or take one
 * of the wrong type without a word. */
static zt_status check_landed(zt_nccl_comm *c) {
    for (unsigned i = c->slot_lo; i != c->slot_hi; i++) {
        unsigned k = i % ZT_NCCL_SLOTS;
        if (c->slot[k].peer < 0 || c->slot[k].checked)
            continue;
        if (cudaEventQuery(c->hdr_ev[k]) != cudaSuccess)
            return ZT_OK; /* not yet (an error of the stream is the watch's to report) */
        ZT_TRY(check_header(c, k));
    }
    return ZT_OK;
}

/* Everything posted is complete: the received headers are checked, the slots free again. */
static zt_status retire(zt_nccl_comm *c) {
    zt_nccl_wait_retire(&c->wait);
    zt_status s = ZT_OK;
    for (; c->slot_lo != c->slot_hi; c->slot_lo++)
        if (s == ZT_OK)
            s = check_header(c, c->slot_lo % ZT_NCCL_SLOTS);
    return s;
}

/* What was posted up to sequence number upto is complete (a sync's wait covered it): its
 * headers are checked and its slots freed; what was posted since stays watched, against a
 * deadline from now and a mark recorded behind it. */
static zt_status retire_to(zt_nccl_comm *c, long upto, double now) {
    for (; c->slot_lo != c->slot_hi && c->slot[c->slot_lo % ZT_NCCL_SLOTS].seq <= upto;
         c->slot_lo++)
        ZT_TRY(check_header(c, c->slot_lo % ZT_NCCL_SLOTS));
    long before = c->wait.inflight;
    zt_nccl_wait_retire_to(&c->wait, upto, now, c->timeout_s);
    if (c->wait.inflight && c->wait.inflight < before) {
        cudaStream_t st = c->be ? ((zt_cuda_state *)c->be->impl)->stream[ZT_STREAM_COMM] : c->own;
        CUDA_TRY(c, cudaEventRecord(c->mark, st));
    }
    return ZT_OK;
}

/* Waits for everything issued on the operation's stream (the posted work included). */
static zt_status finish(zt_nccl_comm *c, const char *what) {
    CUDA_TRY(c, cudaEventRecord(c->done, c->st));
    zt_nccl_wait_await(&c->wait);
    ZT_TRY(drive(c, what));
    return retire(c);
}

/* Leaves a settled operation running on its stream, for the backend's next wait to watch. */
static zt_status post(zt_nccl_comm *c) {
    CUDA_TRY(c, cudaEventRecord(c->posted, c->st));
    if (c->wait.inflight == 0)
        CUDA_TRY(c, cudaEventRecord(c->mark, c->st));
    zt_nccl_wait_posted(&c->wait, now_s(), c->timeout_s);
    __atomic_store_n(&c->posted_seq, c->wait.seq, __ATOMIC_RELEASE);
    return ZT_OK;
}

/* A header slot of a message; with every slot in use, the messages posted so far are waited
 * for first. */
static zt_status take_slot(zt_nccl_comm *c, int *out) {
    if (c->slot_hi - c->slot_lo == ZT_NCCL_SLOTS)
        ZT_TRY(finish(c, "the messages posted before"));
    *out = (int)(c->slot_hi++ % ZT_NCCL_SLOTS);
    c->slot[*out].peer = -1;
    c->slot[*out].checked = false;
    c->slot[*out].seq = c->wait.seq + 1; /* the operation about to be posted */
    return ZT_OK;
}

/* The start of every operation: the communicator usable, this thread on its GPU, the stream
 * chosen, the deadline set. */
static zt_status begin(zt_nccl_comm *c, const char *what) {
    if (c->wait.state == ZT_NCCL_ABORTED || !live(c))
        return zt_error(ZT_ERR_IO, "nccl rank %d: %s: the communicator was aborted: %s", c->rank,
                        what, c->failure[0] ? c->failure : "(no failure recorded)");
    if (!zt_nccl_wait_begin(&c->wait, now_s(), c->timeout_s))
        return fail(c, ZT_ERR_IO, "%s: an earlier operation was left unfinished", what);
    /* ZeRO's communication thread calls in too: the current device is per thread. */
    CUDA_TRY(c, cudaSetDevice(c->device));
    c->st = c->be ? ((zt_cuda_state *)c->be->impl)->stream[ZT_STREAM_COMM] : c->own;
    /* The operation may touch memory a commit has just zero-filled on the compute stream. */
    if (c->be)
        zt_cuda_vmm_order_comm(c->be);
    return ZT_OK;
}

static zt_status settle(zt_nccl_comm *c, const char *what);

/* Staging of at least bytes, device and pinned; grown only here, between operations. */
static zt_status stage(zt_nccl_comm *c, size_t bytes) {
    if (bytes <= c->dstage_bytes)
        return ZT_OK;
    /* cudaFree waits for the whole device, posted collectives included: they are polled first. */
    ZT_TRY(settle(c, "the operations posted before the staging grows"));
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
    return post(c);
}

/* Several calls as one group, all under nc_mu (group_start takes it, group_end lets it go):
 * inside it NCCL only queues (each returns ncclSuccess or an argument error); ncclGroupEnd posts
 * them and may return ncclInProgress. */
static ncclResult_t group_start(zt_nccl_comm *c, bool *held) {
    *held = nc_enter(c);
    return *held ? ncclGroupStart() : ncclInvalidUsage;
}

static zt_status group_end(zt_nccl_comm *c, bool held, ncclResult_t first_error,
                           const char *what) {
    if (!held)
        return issued(c, first_error, what);
    ncclResult_t end = nc_leave(c, ncclGroupEnd());
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
        bool held;
        ncclResult_t bad = group_start(c, &held);
        for (int r = 0; r < c->world && bad == ncclSuccess; r++) {
            if (!counts[r])
                continue;
            void *dst = r == c->rank ? out : (void *)(src + offsets[r] * es);
            bad = ncclReduce(src + offsets[r] * es, dst, counts[r], type_of(t), op_of(op), r,
                             c->nc, c->st);
        }
        ZT_TRY(group_end(c, held, bad, "ncclReduce (a piece of a reduce_scatter)"));
    }
    return post(c);
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
    bool held;
    ncclResult_t bad = group_start(c, &held);
    for (int r = 0; r < c->world && bad == ncclSuccess; r++) {
        if (!counts[r])
            continue;
        char *p = b + offsets[r] * es;
        bad = ncclBroadcast(p, p, counts[r], type_of(t), r, c->nc, c->st);
    }
    return group_end(c, held, bad, "ncclBroadcast (a piece of an all_gather)");
}

static zt_status nccl_all_gather(zt_nccl_comm *c, void *buf, size_t n, const size_t *offsets,
                                 const size_t *counts, zt_dtype t, zt_nccl_mem mem) {
    size_t bytes = n * zt_dtype_size(t);
    if (mem == ZT_NCCL_HOST)
        ZT_TRY(stage(c, bytes));
    ZT_TRY(begin(c, "all_gather"));
    if (mem == ZT_NCCL_DEVICE) {
        ZT_TRY(gather_on(c, buf, offsets, counts, t));
        return post(c);
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
    if (mem == ZT_NCCL_DEVICE)
        return post(c);
    if (c->rank != root)
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
    int k;
    ZT_TRY(take_slot(c, &k));
    c->hdr_host[2 * k] = (int64_t)n;
    c->hdr_host[2 * k + 1] = (int64_t)t;
    CUDA_TRY(c, cudaMemcpyAsync(c->hdr_dev + 2 * k, c->hdr_host + 2 * k, 2 * sizeof(int64_t),
                                cudaMemcpyHostToDevice, c->st));
    NCCL_TRY(c, ncclSend(c->hdr_dev + 2 * k, 2, ncclInt64, peer, c->nc, c->st));
    if (n) {
        const void *d = buf;
        if (mem == ZT_NCCL_HOST) {
            ZT_TRY(stage_in(c, buf, bytes));
            d = c->dstage;
        }
        NCCL_TRY(c, ncclSend(d, n, type_of(t), peer, c->nc, c->st));
    }
    return mem == ZT_NCCL_DEVICE ? post(c) : finish(c, "send");
}

static zt_status nccl_recv(zt_nccl_comm *c, void *buf, size_t n, zt_dtype t, int peer,
                           zt_nccl_mem mem) {
    size_t bytes = n * zt_dtype_size(t);
    if (mem == ZT_NCCL_HOST)
        ZT_TRY(stage(c, bytes));
    ZT_TRY(begin(c, "recv"));
    int k;
    ZT_TRY(take_slot(c, &k));
    NCCL_TRY(c, ncclRecv(c->hdr_dev + 2 * k, 2, ncclInt64, peer, c->nc, c->st));
    CUDA_TRY(c, cudaMemcpyAsync(c->hdr_host + 2 * k, c->hdr_dev + 2 * k, 2 * sizeof(int64_t),
                                cudaMemcpyDeviceToHost, c->st));
    c->slot[k].n = (int64_t)n;
    c->slot[k].t = (int64_t)t;
    c->slot[k].peer = peer;
    /* Into device memory the payload follows the header at once; the header is checked once
     * its event fired (check_landed), at the latest when the posted work is retired. Into host
     * memory it is checked first, as the host waits. */
    CUDA_TRY(c, cudaEventRecord(c->hdr_ev[k], c->st));
    if (mem == ZT_NCCL_DEVICE) {
        if (n)
            NCCL_TRY(c, ncclRecv(buf, n, type_of(t), peer, c->nc, c->st));
        return post(c);
    }
    ZT_TRY(finish(c, "recv (the message's header)"));
    if (!n)
        return ZT_OK;
    ZT_TRY(begin(c, "recv"));
    NCCL_TRY(c, ncclRecv(c->dstage, n, type_of(t), peer, c->nc, c->st));
    ZT_TRY(stage_back(c, bytes));
    ZT_TRY(finish(c, "recv"));
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

/* Waits (polled) for what was posted on the current streams. */
static zt_status settle(zt_nccl_comm *c, const char *what) {
    if (!c->wait.inflight || !live(c))
        return ZT_OK;
    ZT_TRY(begin(c, what));
    return finish(c, what);
}

static void nccl_destroy(zt_nccl_comm *c) {
    if (!c)
        return;
    cudaSetDevice(c->device);
    /* The backend's waits stop looking at c first: a watch beside the settling below would race
     * it for the posted work (both retire it) and for the handle, which a settling that fails
     * aborts. (The settling still waits on the backend's stream: c->be stays.) Holding mu, an
     * abort from another thread leaves the calls below to give up by themselves. */
    if (c->be)
        zt_cuda_watch_remove(c->be, c);
    pthread_mutex_lock(&c->mu);
    settle(c, "the operations posted before destroy");
    if (c->wait.state == ZT_NCCL_READY && live(c) &&
        zt_nccl_wait_begin(&c->wait, now_s(), c->timeout_s)) {
        /* A clean end: flush (polled like any call), then free; otherwise abort. */
        if (issued(c, NC(c, ncclCommFinalize(c->nc)), "ncclCommFinalize") == ZT_OK) {
            pthread_mutex_lock(&c->nc_mu);
            if (c->nc)
                ncclCommDestroy(c->nc);
            c->nc = NULL;
            pthread_mutex_unlock(&c->nc_mu);
        }
    }
    abort_comm(c);
    pthread_mutex_unlock(&c->mu);
    if (c->dstage)
        cudaFree(c->dstage);
    if (c->hstage)
        cudaFreeHost(c->hstage);
    if (c->hdr_dev)
        cudaFree(c->hdr_dev);
    if (c->hdr_host)
        cudaFreeHost(c->hdr_host);
    for (int k = 0; k < ZT_NCCL_SLOTS; k++)
        if (c->hdr_ev[k])
            cudaEventDestroy(c->hdr_ev[k]);
    if (c->done)
        cudaEventDestroy(c->done);
    if (c->posted)
        cudaEventDestroy(c->posted);
    if (c->mark)
        cudaEventDestroy(c->mark);
    if (c->own)
        cudaStreamDestroy(c->own);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->nc_mu);
    free(c);
}

/* Never waits for the call under way: that call may be waiting for a stuck peer until its
 * deadline, and ending it is what an abort from another thread is for (as ncclCommAbort from a
 * watchdog thread ends NCCL's). The handle is aborted at once, under nc_mu only, and the call
 * gives up at its next poll (abort_asked), naming the abort. */
static void nccl_abort(zt_nccl_comm *c) {
    if (!c)
        return;
    atomic_store(&c->abort_asked, true);
    if (pthread_mutex_trylock(&c->mu) == 0) {
        abort_comm(c);
        if (!c->failure[0])
            snprintf(c->failure, sizeof c->failure, "nccl rank %d (GPU %d): aborted "
                     "(zt_nccl_api.abort)", c->rank, c->device);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    release_handle(c);
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
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->nc_mu, NULL);
    atomic_init(&c->abort_asked, false);
    zt_status s = check_cuda(c, cudaSetDevice(device), "cudaSetDevice");
    if (s == ZT_OK)
        s = check_cuda(c, cudaStreamCreateWithFlags(&c->own, cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags");
    if (s == ZT_OK)
        s = check_cuda(c, cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
    if (s == ZT_OK)
        s = check_cuda(c, cudaEventCreateWithFlags(&c->posted, cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
    if (s == ZT_OK)
        s = check_cuda(c, cudaEventCreateWithFlags(&c->mark, cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
    const size_t hdr = ZT_NCCL_SLOTS * 2 * sizeof(int64_t);
    if (s == ZT_OK)
        s = check_cuda(c, cudaMalloc((void **)&c->hdr_dev, hdr), "cudaMalloc");
    if (s == ZT_OK)
        s = check_cuda(c, cudaHostAlloc((void **)&c->hdr_host, hdr, cudaHostAllocPortable),
                       "cudaHostAlloc");
    for (int k = 0; k < ZT_NCCL_SLOTS && s == ZT_OK; k++)
        s = check_cuda(c, cudaEventCreateWithFlags(&c->hdr_ev[k], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
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

/* The posting sequence, for the backend's snapshot before a covering wait (zt_cuda_mark_fn). */
static long mark(void *ctx) {
    zt_nccl_comm *c = ctx;
    return __atomic_load_n(&c->posted_seq, __ATOMIC_ACQUIRE);
}

/* The backend's host wait looking at the posted work (cuda_backend.h: zt_cuda_watch_fn): during
 * the wait (covered < 0), or after one that covered what was posted up to sequence number
 * covered. A call under way watches its own operation, so the look is skipped then. */
static zt_status watch(void *ctx, long covered_upto) {
    zt_nccl_comm *c = ctx;
    if (pthread_mutex_trylock(&c->mu) != 0)
        return ZT_OK;
    zt_status s = ZT_OK;
    if (c->wait.inflight && (abort_asked(c) || c->wait.state == ZT_NCCL_ABORTED)) {
        /* A communicator that failed itself says again why (fail() aborted it): a caller that
         * waits twice (a step's own error, then the device's) still learns which peer it was. */
        if (c->failure[0])
            s = zt_error(ZT_ERR_IO, "%s; the communicator was aborted with collectives posted "
                         "on the stream", c->failure);
        else
            s = fail(c, ZT_ERR_IO, "the communicator was aborted with collectives posted on the "
                     "stream");
    } else if (c->wait.inflight && live(c)) {
        double t = now_s();
        /* Everything posted was covered, or only what came before another thread posted more
         * (after the streams were joined): that is retired, the rest watched as before. */
        bool covered = covered_upto >= 0 && covered_upto >= c->wait.seq;
        s = check_landed(c);
        if (s == ZT_OK && covered_upto >= 0 && !covered)
            s = retire_to(c, covered_upto, t);
        if (s != ZT_OK || !c->wait.inflight) {
            pthread_mutex_unlock(&c->mu);
            return s;
        }
        /* Past the deadline, the stream first, then the error (as drive() does). */
        zt_nccl_result posted = ZT_NCCL_R_IN_PROGRESS;
        cudaError_t ev = cudaSuccess;
        if (!covered && zt_nccl_wait_overdue(&c->wait, t)) {
            ev = cudaEventQuery(c->posted);
            posted = ev == cudaSuccess         ? ZT_NCCL_R_SUCCESS
                     : ev == cudaErrorNotReady ? ZT_NCCL_R_IN_PROGRESS
                                               : ZT_NCCL_R_ERROR;
            /* Still running, but past what was posted when the deadline began: progress, not
             * a stuck peer. The deadline runs again, from a mark behind everything posted. */
            if (posted == ZT_NCCL_R_IN_PROGRESS && cudaEventQuery(c->mark) == cudaSuccess) {
                cudaStream_t st = c->be ? ((zt_cuda_state *)c->be->impl)->stream[ZT_STREAM_COMM]
                                        : c->own;
                if (cudaEventRecord(c->mark, st) == cudaSuccess)
                    zt_nccl_wait_progress(&c->wait, t, c->timeout_s);
            }
        }
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = NC(c, ncclCommGetAsyncError(c->nc, &async));
        if (r != ncclSuccess)
            async = r;
        zt_nccl_verdict v = zt_nccl_wait_watch(&c->wait, result_of(async), posted, covered, t);
        char text[256];
        if (v == ZT_NCCL_DONE) {
            s = retire(c);
        } else if (v == ZT_NCCL_TIMED_OUT) {
            s = fail(c, ZT_ERR_TIMEOUT, "the collectives posted on the stream did not complete "
                     "within %g s; a peer is dead or stuck", c->timeout_s);
        } else if (v == ZT_NCCL_FAILED) {
            if (async != ncclSuccess && async != ncclInProgress)
                nccl_text(c, async, text, sizeof text);
            else
                snprintf(text, sizeof text, "%s", cudaGetErrorString(ev));
            s = fail(c, ZT_ERR_IO, "a posted collective failed: %s", text);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

static zt_status nccl_attach(zt_nccl_comm *c, zt_backend *be) {
    if (be && (be->device != ZT_DEVICE_CUDA || be->device_index != c->device))
        return zt_error(ZT_ERR_INVALID, "nccl rank %d: cannot run on the streams of %s device "
                        "%d: the communicator has GPU %d", c->rank, be->name, be->device_index,
                        c->device);
    if (be == c->be)
        return ZT_OK;
    /* Work posted on the old streams completes before they are let go. */
    zt_status s = settle(c, "the operations posted before attach");
    if (c->be)
        zt_cuda_watch_remove(c->be, c);
    c->be = NULL;
    /* Only a watched communicator posts on the backend's streams: without a watcher its
     * deadline would not be enforced. */
    if (be && s == ZT_OK && (s = zt_cuda_watch_add(be, watch, mark, c)) == ZT_OK)
        c->be = be;
    return s;
}

static zt_status nccl_async_error(zt_nccl_comm *c) {
    if (c->wait.state == ZT_NCCL_ABORTED || abort_asked(c) || !live(c))
        return zt_error(ZT_ERR_IO, "nccl rank %d: the communicator was aborted: %s", c->rank,
                        c->failure[0] ? c->failure : "(no failure recorded)");
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = NC(c, ncclCommGetAsyncError(c->nc, &async));
    if (r != ncclSuccess)
        async = r;
    if (async == ncclSuccess || async == ncclInProgress)
        return ZT_OK;
    char text[256];
    nccl_text(c, async, text, sizeof text);
    return fail(c, ZT_ERR_IO, "asynchronous error: %s", text);
}

/* ---- the table: one call of a communicator at a time --------------------------------------- */

#define LOCKED(c, call)                                                                            \
    do {                                                                                           \
        pthread_mutex_lock(&(c)->mu);                                                              \
        zt_status s_ = (call);                                                                     \
        pthread_mutex_unlock(&(c)->mu);                                                            \
        return s_;                                                                                 \
    } while (0)

static zt_status locked_attach(zt_nccl_comm *c, zt_backend *be) { LOCKED(c, nccl_attach(c, be)); }
static zt_status locked_async_error(zt_nccl_comm *c) { LOCKED(c, nccl_async_error(c)); }
static zt_status locked_all_reduce(zt_nccl_comm *c, void *buf, size_t n, zt_dtype t,
                                   zt_nccl_op op) {
    LOCKED(c, nccl_all_reduce(c, buf, n, t, op));
}
static zt_status locked_reduce_scatter(zt_nccl_comm *c, const void *in, void *out,
                                       const size_t *offsets, const size_t *counts, zt_dtype t,
                                       zt_nccl_op op) {
    LOCKED(c, nccl_reduce_scatter(c, in, out, offsets, counts, t, op));
}
static zt_status locked_all_gather(zt_nccl_comm *c, void *buf, size_t n, const size_t *offsets,
                                   const size_t *counts, zt_dtype t, zt_nccl_mem mem) {
    LOCKED(c, nccl_all_gather(c, buf, n, offsets, counts, t, mem));
}
static zt_status locked_broadcast(zt_nccl_comm *c, void *buf, size_t n, zt_dtype t, int root,
                                  zt_nccl_mem mem) {
    LOCKED(c, nccl_broadcast(c, buf, n, t, root, mem));
}
static zt_status locked_send(zt_nccl_comm *c, const void *buf, size_t n, zt_dtype t, int peer,
                             zt_nccl_mem mem) {
    LOCKED(c, nccl_send(c, buf, n, t, peer, mem));
}
static zt_status locked_recv(zt_nccl_comm *c, void *buf, size_t n, zt_dtype t, int peer,
                             zt_nccl_mem mem) {
    LOCKED(c, nccl_recv(c, buf, n, t, peer, mem));
}

static const zt_nccl_api api = {
    .version = ZT_NCCL_API_VERSION,
    .nccl_version = nccl_version,
    .pick_device = nccl_pick_device,
    .unique_id = nccl_unique_id,
    .create = nccl_create,
    .destroy = nccl_destroy,
    .abort = nccl_abort,
    .attach = locked_attach,
    .async_error = locked_async_error,
    .all_reduce = locked_all_reduce,
    .reduce_scatter = locked_reduce_scatter,
    .all_gather = locked_all_gather,
    .broadcast = locked_broadcast,
    .send = locked_send,
    .recv = locked_recv,
};

/* The module's entry point for NCCL, which kernels/backend.c finds with dlsym. */
const zt_nccl_api *zt_cuda_nccl_api(void) { return &api; }
