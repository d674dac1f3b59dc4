/* The CUDA backend object: device memory from cudaMalloc, or for large allocations reserved
 * address ranges whose physical granules release gives back and commit maps again
 * (memory/device_vmm.c), pinned memory from cudaHostAlloc, a compute and a communication stream
 * (non-blocking, so neither waits for the legacy default stream) ordered by CUDA events, and the
 * first asynchronous error reported by sync with the device named. Released ranges are also kept
 * as a set (cuda_host.h's ranges), which resident_bytes reads. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_backend.h"
#include "device_vmm.h"

/* Estimates made without a GPU count the backend's own memory from backend.h's figures. */
_Static_assert(ZT_CUDA_CUBLAS_WORKSPACE == ZT_CUDA_CUBLAS_WORKSPACE_BYTES,
               "backend.h states cuBLASLt's workspace");
_Static_assert((2 * ZT_CUDA_SUM_BLOCKS + 2) * sizeof(double) == ZT_CUDA_SUMS_BYTES,
               "backend.h states the two-pass sums' memory");

struct zt_event {
    cudaEvent_t ev;
    zt_stream on; /* the stream of its last record */
};

void zt_cuda_fail(zt_backend *be, const char *lib, const char *call, const char *msg,
                  const char *file, int line) {
    zt_cuda_state *st = be->impl;
    pthread_mutex_lock(&st->lock);
    if (!st->first_error[0])
        snprintf(st->first_error, sizeof st->first_error, "%s:%d: %s failed: %s (%s)", file, line,
                 lib, msg, call);
    pthread_mutex_unlock(&st->lock);
}

static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* The calling thread's time in counted waits, on any CUDA backend of the process: what the
 * training thread reads as its own (a communication thread's waits are its own). */
static _Thread_local unsigned long long thread_wait_ns;

unsigned long long zt_cuda_wait_begin(zt_backend *be) {
    zt_cuda_state *st = be->impl;
    __atomic_add_fetch(&st->waits, 1, __ATOMIC_RELAXED);
    return now_ns();
}

void zt_cuda_wait_end(unsigned long long t0) { thread_wait_ns += now_ns() - t0; }

void zt_cuda_wait(zt_backend *be, cudaStream_t s) {
    unsigned long long t0 = zt_cuda_wait_begin(be);
    if (!zt_cuda_watched_wait(be, s))
        ZT_CUDA_CHECK(be, cudaStreamSynchronize(s));
    zt_cuda_wait_end(t0);
}

zt_status zt_cuda_waits_of(zt_backend *be, zt_cuda_waits *out) {
    if (!be || be->device != ZT_DEVICE_CUDA)
        return zt_error(ZT_ERR_INVALID, "backend \"%s\": host waits are the CUDA backend's",
                        be ? be->name : "?");
    zt_cuda_state *st = be->impl;
    out->waits = __atomic_load_n(&st->waits, __ATOMIC_RELAXED);
    out->reads = __atomic_load_n(&st->reads, __ATOMIC_RELAXED);
    out->wait_ms = (double)thread_wait_ns / 1e6;
    out->compute_issued_elsewhere = __atomic_load_n(&st->compute_elsewhere, __ATOMIC_RELAXED);
    out->compute_waits_on_comm = __atomic_load_n(&st->compute_waits_on_comm, __ATOMIC_RELAXED);
    return ZT_OK;
}

void zt_cuda_count_read(zt_backend *be) {
    zt_cuda_state *st = be->impl;
    __atomic_add_fetch(&st->reads, 1, __ATOMIC_RELAXED);
}

void zt_cuda_round_trips(zt_backend *be, unsigned long long out[2]) {
    zt_cuda_state *st = be->impl;
    out[0] = __atomic_load_n(&st->waits, __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&st->reads, __ATOMIC_RELAXED);
}

void zt_cuda_count(zt_cuda_state *st, long long delta) {
    pthread_mutex_lock(&st->lock);
    st->allocated = (size_t)((long long)st->allocated + delta);
    if (st->allocated > st->peak)
        st->peak = st->allocated;
    pthread_mutex_unlock(&st->lock);
}

zt_status zt_cuda_memory_of(zt_backend *be, zt_cuda_memory *out) {
    if (!be || be->device != ZT_DEVICE_CUDA)
        return zt_error(ZT_ERR_INVALID, "backend \"%s\": device memory counts are the CUDA "
                        "backend's", be ? be->name : "?");
    zt_cuda_state *st = be->impl;
    pthread_mutex_lock(&st->lock);
    out->allocated = st->allocated;
    out->peak = st->peak;
    pthread_mutex_unlock(&st->lock);
    out->device_free = out->device_total = 0;
    ZT_CUDA_TRY(be->device_index, cudaMemGetInfo(&out->device_free, &out->device_total));
    return ZT_OK;
}

static void *cuda_alloc(zt_backend *be, zt_mem kind, size_t bytes) {
    zt_cuda_state *st = be->impl;
    /* A 0-byte request still gets a distinct pointer. */
    if (bytes == 0)
        bytes = 1;
    void *p = NULL;
    if (kind == ZT_MEM_HOST) {
        if (posix_memalign(&p, (size_t)sysconf(_SC_PAGESIZE), bytes) != 0)
            return NULL;
        memset(p, 0, bytes);
        return p;
    }
    if (kind == ZT_MEM_PINNED) {
        if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
            cudaGetLastError(); /* an allocation failure is not sticky; clear it */
            return NULL;
        }
        memset(p, 0, bytes);
        return p;
    }
    if (zt_cuda_vmm_takes(st, bytes)) {
        pthread_mutex_lock(&st->released_lock);
        p = zt_cuda_vmm_alloc(be, bytes);
        pthread_mutex_unlock(&st->released_lock);
        if (!p)
            return NULL;
        /* Zero-filled on the VMM's stream, which both streams wait for; waited for here as a
         * cudaMalloc'd allocation is, so that allocating costs the same waits either way. */
        zt_cuda_wait(be, st->stream[ZT_STREAM_COMPUTE]);
        return p;
    }
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    zt_cuda_count(st, (long long)bytes);
    /* Zeroed before any later work on either stream can see it: the streams are non-blocking,
     * so a plain cudaMemset on the legacy stream would not be ordered before them. Allocation
     * happens at setup, where waiting costs nothing. */
    ZT_CUDA_CHECK(be, cudaMemsetAsync(p, 0, bytes, st->stream[ZT_STREAM_COMPUTE]));
    zt_cuda_wait(be, st->stream[ZT_STREAM_COMPUTE]);
    return p;
}

static void cuda_release(zt_backend *be, void *p, size_t lo, size_t hi);

/* A large allocation reserves its granules and maps none (no device call, nothing held); a small
 * one is cudaMalloc's, allocated and zeroed, and released as any other (it stays held). */
static void *cuda_alloc_released(zt_backend *be, size_t bytes) {
    zt_cuda_state *st = be->impl;
    if (!zt_cuda_vmm_takes(st, bytes)) {
        void *p = cuda_alloc(be, ZT_MEM_DEVICE, bytes);
        if (p)
            cuda_release(be, p, 0, bytes ? bytes : 1);
        return p;
    }
    pthread_mutex_lock(&st->released_lock);
    void *p = zt_cuda_vmm_reserve(be, bytes);
    if (p && zt_cuda_ranges_add(&st->released, (uintptr_t)p, (uintptr_t)p + bytes) != ZT_OK) {
        zt_cuda_vmm_free(be, p);
        p = NULL;
    }
    pthread_mutex_unlock(&st->released_lock);
    return p;
}

/* Granules reserved at any size, none mapped (backend.h, zt_backend_reserve); without a VMM, as
 * alloc_released. */
static void *cuda_reserve(zt_backend *be, size_t bytes) {
    zt_cuda_state *st = be->impl;
    if (!st->vmm)
        return cuda_alloc_released(be, bytes);
    pthread_mutex_lock(&st->released_lock);
    void *p = zt_cuda_vmm_reserve(be, bytes ? bytes : 1);
    if (p && zt_cuda_ranges_add(&st->released, (uintptr_t)p,
                                (uintptr_t)p + (bytes ? bytes : 1)) != ZT_OK) {
        zt_cuda_vmm_free(be, p);
        p = NULL;
    }
    pthread_mutex_unlock(&st->released_lock);
    return p;
}

static void cuda_free(zt_backend *be, zt_mem kind, void *p, size_t bytes) {
    zt_cuda_state *st = be->impl;
    if (!p)
        return;
    if (kind == ZT_MEM_HOST) {
        free(p);
        return;
    }
    if (kind == ZT_MEM_PINNED) {
        ZT_CUDA_CHECK(be, cudaFreeHost(p));
        return;
    }
    /* The range is no longer this allocation's: forget what was released of it. */
    pthread_mutex_lock(&st->released_lock);
    zt_cuda_ranges_remove(&st->released, (uintptr_t)p, (uintptr_t)p + (bytes ? bytes : 1));
    bool vmm = zt_cuda_vmm_owns(st, p);
    if (vmm)
        zt_cuda_vmm_free(be, p);
    pthread_mutex_unlock(&st->released_lock);
    if (vmm)
        return;
    ZT_CUDA_CHECK(be, cudaFree(p));
    zt_cuda_count(st, -(long long)(bytes ? bytes : 1));
}

static void cuda_zero(zt_backend *be, void *p, size_t bytes, zt_stream s) {
    zt_cuda_state *st = be->impl;
    if (!bytes)
        return;
    zt_cuda_note_issue(st, s);
    /* As a copy: released granules are written only once committed (backend.h). */
    pthread_mutex_lock(&st->released_lock);
    bool live = zt_cuda_vmm_live(st, p, bytes);
    pthread_mutex_unlock(&st->released_lock);
    if (!live) {
        zt_cuda_fail(be, "host", "zt_backend_zero", "the range lies in released device memory "
                     "that was not committed again (zt_backend_commit)", __FILE__, __LINE__);
        return;
    }
    if (s == ZT_STREAM_COMM)
        zt_cuda_vmm_order_comm(be);
    ZT_CUDA_CHECK(be, cudaMemsetAsync(p, 0, bytes, st->stream[s]));
}

/* Whether host memory is page-locked (cudaHostAlloc or registered), so a copy from or to it can
 * run asynchronously. */
static bool is_pinned(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

static void cuda_copy(zt_backend *be, void *dst, const void *src, size_t bytes, zt_copy_kind kind,
                      zt_stream s) {
    zt_cuda_state *st = be->impl;
    if (bytes == 0)
        return;
    zt_cuda_note_issue(st, s);
    static const enum cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                                cudaMemcpyDeviceToDevice, cudaMemcpyHostToHost};
    /* Bytes written to device memory are held again, released before or not; but a granule
     * of a large allocation given back must be committed first (backend.h): the copy is refused
     * before it is issued, since it would write into memory another range may hold. */
    if (kind == ZT_COPY_H2D || kind == ZT_COPY_D2D) {
        pthread_mutex_lock(&st->released_lock);
        bool live = zt_cuda_vmm_live(st, dst, bytes);
        zt_status rs = live ? zt_cuda_ranges_remove(&st->released, (uintptr_t)dst,
                                                    (uintptr_t)dst + bytes)
                            : ZT_OK;
        pthread_mutex_unlock(&st->released_lock);
        if (!live) {
            zt_cuda_fail(be, "host", "zt_backend_copy", "the destination lies in released "
                         "device memory that was not committed again (zt_backend_commit)",
                         __FILE__, __LINE__);
            return;
        }
        if (rs != ZT_OK)
            zt_cuda_fail(be, "host", "zt_cuda_ranges_remove", zt_last_error(), __FILE__, __LINE__);
    }
    if (s == ZT_STREAM_COMM)
        zt_cuda_vmm_order_comm(be);
    ZT_CUDA_CHECK(be, cudaMemcpyAsync(dst, src, bytes, kinds[kind], st->stream[s]));
    if (kind == ZT_COPY_D2H)
        zt_cuda_count_read(be);
    /* backend.h: from or to pageable host memory the call returns only when the host buffer may
     * be reused. CUDA stages a pageable source before returning; a pageable destination is
     * written only when the copy has run, so wait for it. */
    if ((kind == ZT_COPY_D2H && !is_pinned(dst)) || kind == ZT_COPY_H2H)
        zt_cuda_wait(be, st->stream[s]);
}

static void cuda_release(zt_backend *be, void *p, size_t lo, size_t hi) {
    zt_cuda_state *st = be->impl;
    if (hi <= lo)
        return;
    pthread_mutex_lock(&st->released_lock);
    zt_status rs = zt_cuda_ranges_add(&st->released, (uintptr_t)p + lo, (uintptr_t)p + hi);
    /* A reserved range never takes the plain memset below: its granules outside the live set
     * may hold another range's memory. Without the bookkeeping (no host memory) nothing of it
     * is given back; the failure is the next sync's. */
    bool vmm = zt_cuda_vmm_in(st, p);
    bool issued = !vmm; /* the memset below */
    if (vmm && rs == ZT_OK)
        issued = zt_cuda_vmm_release(be, p, lo, hi);
    pthread_mutex_unlock(&st->released_lock);
    if (rs != ZT_OK)
        zt_cuda_fail(be, "host", "zt_cuda_ranges_add", zt_last_error(), __FILE__, __LINE__);
    if (issued)
        zt_cuda_note_issue(st, ZT_STREAM_COMPUTE);
    if (!vmm)
        ZT_CUDA_CHECK(be, cudaMemsetAsync((char *)p + lo, 0, hi - lo,
                                          st->stream[ZT_STREAM_COMPUTE]));
}

static zt_status cuda_commit(zt_backend *be, void *p, size_t lo, size_t hi) {
    zt_cuda_state *st = be->impl;
    if (hi <= lo)
        return ZT_OK;
    pthread_mutex_lock(&st->released_lock);
    zt_status s = zt_cuda_ranges_remove(&st->released, (uintptr_t)p + lo, (uintptr_t)p + hi);
    if (s == ZT_OK && zt_cuda_vmm_in(st, p))
        s = zt_cuda_vmm_commit(be, p, lo, hi);
    pthread_mutex_unlock(&st->released_lock);
    return s;
}

static size_t cuda_resident_bytes(zt_backend *be, const void *p, size_t lo, size_t hi) {
    zt_cuda_state *st = be->impl;
    if (hi <= lo)
        return 0;
    pthread_mutex_lock(&st->released_lock);
    size_t gone = zt_cuda_ranges_overlap(&st->released, (uintptr_t)p + lo, (uintptr_t)p + hi);
    pthread_mutex_unlock(&st->released_lock);
    return (hi - lo) - gone;
}

static zt_event *cuda_event_create(zt_backend *be) {
    zt_event *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    if (cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming) != cudaSuccess) {
        ZT_CUDA_LAUNCHED(be);
        free(e);
        return NULL;
    }
    return e;
}

/* A timing event (profiling, op_profile.h): the default flags keep the timestamp that
 * cudaEventDisableTiming drops. */
static zt_event *cuda_timer_create(zt_backend *be) {
    zt_event *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    if (cudaEventCreateWithFlags(&e->ev, cudaEventDefault) != cudaSuccess) {
        ZT_CUDA_LAUNCHED(be);
        free(e);
        return NULL;
    }
    return e;
}

static zt_status cuda_timer_elapsed(zt_backend *be, zt_event *start, zt_event *end, double *ms) {
    zt_cuda_state *st = be->impl;
    float f = 0.0f;
    unsigned long long t0 = zt_cuda_wait_begin(be);
    cudaError_t rc = cudaEventSynchronize(end->ev);
    zt_cuda_wait_end(t0);
    if (rc == cudaSuccess)
        rc = cudaEventElapsedTime(&f, start->ev, end->ev);
    if (rc != cudaSuccess)
        return zt_error(ZT_ERR_IO, "cuda device %d (%s): cudaEventElapsedTime: %s",
                        be->device_index, st->device_name, cudaGetErrorString(rc));
    *ms = f;
    return ZT_OK;
}

static void cuda_event_destroy(zt_backend *be, zt_event *ev) {
    if (!ev)
        return;
    ZT_CUDA_CHECK(be, cudaEventDestroy(ev->ev));
    free(ev);
}

static void cuda_event_record(zt_backend *be, zt_event *ev, zt_stream s) {
    zt_cuda_state *st = be->impl;
    zt_cuda_note_issue(st, s);
    ev->on = s;
    ZT_CUDA_CHECK(be, cudaEventRecord(ev->ev, st->stream[s]));
}

static void cuda_stream_wait(zt_backend *be, zt_stream s, zt_event *ev) {
    zt_cuda_state *st = be->impl;
    zt_cuda_note_issue(st, s);
    if (s == ZT_STREAM_COMPUTE && ev->on == ZT_STREAM_COMM)
        __atomic_add_fetch(&st->compute_waits_on_comm, 1, __ATOMIC_RELAXED);
    ZT_CUDA_CHECK(be, cudaStreamWaitEvent(st->stream[s], ev->ev, 0));
}

/* The first failure recorded since the last report, as the host's waits report it (ZT_ERR_IO
 * naming the device), and cleared: each failure is reported once. A launch error still pending
 * in the runtime counts. */
static zt_status take_first_error(zt_backend *be) {
    zt_cuda_state *st = be->impl;
    ZT_CUDA_LAUNCHED(be);
    pthread_mutex_lock(&st->lock);
    char msg[sizeof st->first_error];
    memcpy(msg, st->first_error, sizeof msg);
    st->first_error[0] = '\0';
    pthread_mutex_unlock(&st->lock);
    if (!msg[0])
        return ZT_OK;
    return zt_error(ZT_ERR_IO, "cuda device %d (%s): %s", be->device_index, st->device_name, msg);
}

/* The host's wait for one event, counted and timed as every wait of the backend's is, and
 * watched (stream_watch.c) when communicators post on the streams. A failure recorded before
 * the wait is its result, as sync reports the first; otherwise a failed wait keeps its own
 * status (a dead peer's timeout stays a timeout; what it recorded is cleared with it), and a
 * wait that succeeds returns the first failure recorded meanwhile. */
static zt_status cuda_event_wait(zt_backend *be, zt_event *ev) {
    zt_cuda_state *st = be->impl;
    /* A failure recorded before the wait is the cause of whatever the wait meets: it wins. */
    pthread_mutex_lock(&st->lock);
    const bool earlier = st->first_error[0] != '\0';
    pthread_mutex_unlock(&st->lock);
    unsigned long long t0 = zt_cuda_wait_begin(be);
    zt_status s = zt_cuda_watched_event_wait(be, ev->ev);
    zt_cuda_wait_end(t0);
    if (s == ZT_OK || earlier)
        return take_first_error(be);
    pthread_mutex_lock(&st->lock);
    st->first_error[0] = '\0';
    pthread_mutex_unlock(&st->lock);
    return s;
}

static zt_status cuda_sync(zt_backend *be) {
    zt_cuda_state *st = be->impl;
    /* What has been staged for uploads so far: queued already, so the wait covers it. */
    pthread_mutex_lock(&st->stage_lock);
    unsigned long long staged = st->staged;
    pthread_mutex_unlock(&st->stage_lock);
    /* What the communicators had posted before the join: all the wait below covers. Another
     * thread (ZeRO's communication thread) may post more meanwhile, behind the join. */
    zt_cuda_watch_marks marks;
    zt_cuda_watch_mark(be, &marks);
    /* One wait of the host for both streams: the compute stream first waits (on the device) for
     * what the others have queued, then the host waits for it. A wait per stream would cost a
     * host round trip each, and a step affords one (docs/gpu.md). */
    for (int s = 0; s < ZT_STREAMS; s++) {
        if (s == ZT_STREAM_COMPUTE)
            continue;
        ZT_CUDA_CHECK(be, cudaEventRecord(st->joined[s], st->stream[s]));
        ZT_CUDA_CHECK(be, cudaStreamWaitEvent(st->stream[ZT_STREAM_COMPUTE], st->joined[s], 0));
    }
    zt_cuda_wait(be, st->stream[ZT_STREAM_COMPUTE]);
    zt_cuda_watch_settled(be, &marks);
    /* Every copy from the staging has run: it is free again, unless more was staged meanwhile. */
    pthread_mutex_lock(&st->stage_lock);
    if (st->staged == staged) {
        for (int i = 0; i < ZT_CUDA_STAGE_BLOCKS; i++)
            st->stage[i].used = 0;
        st->stage_at = 0;
    }
    pthread_mutex_unlock(&st->stage_lock);
    return take_first_error(be);
}

static void cuda_destroy(zt_backend *be) {
    zt_cuda_state *st = be->impl;
    cudaDeviceSynchronize();
    zt_cuda_vmm_destroy(st);
    for (int i = 0; i < ZT_CUDA_SCRATCHES; i++)
        cudaFree(st->scratch[i]);
    free(st->bucket_host);
    for (int i = 0; i < ZT_CUDA_STAGE_BLOCKS; i++)
        cudaFreeHost(st->stage[i].p);
    cudaFree(st->sums_dev);
    cudaFreeHost(st->sums_host);
    zt_cuda_matmul_plans_free(st);
    cudaFree(st->lt_workspace);
    if (st->lt)
        cublasLtDestroy(st->lt);
    for (int s = 0; s < ZT_STREAMS; s++) {
        if (st->stream[s])
            cudaStreamDestroy(st->stream[s]);
        if (st->joined[s])
            cudaEventDestroy(st->joined[s]);
    }
    zt_cuda_ranges_free(&st->released);
    pthread_mutex_destroy(&st->released_lock);
    pthread_mutex_destroy(&st->stage_lock);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

static const zt_backend_iface cuda_iface = {
    .alloc = cuda_alloc,
    .alloc_released = cuda_alloc_released,
    .reserve = cuda_reserve,
    .free = cuda_free,
    .zero = cuda_zero,
    .copy = cuda_copy,
    .release = cuda_release,
    .commit = cuda_commit,
    .resident_bytes = cuda_resident_bytes,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait = cuda_stream_wait,
    .event_wait = cuda_event_wait,
    .sync = cuda_sync,
    .destroy = cuda_destroy,
    .timer_create = cuda_timer_create,
    .timer_elapsed = cuda_timer_elapsed,
};

bool zt_cuda_on_compute(const zt_ctx *x, const char *op) {
    if (x->stream == ZT_STREAM_COMPUTE)
        return true;
    zt_cuda_fail(x->be, "ztrain", op, "uses the backend's shared scratch and runs on the compute "
                 "stream only, not on the communication stream its ctx names", __FILE__, __LINE__);
    return false;
}

void *zt_cuda_scratch(const zt_ctx *x, zt_cuda_scratch_slot slot, size_t bytes) {
    zt_cuda_state *st = zt_cuda_of(x);
    if (!zt_cuda_on_compute(x, "an op with device scratch"))
        return NULL;
    if (bytes <= st->scratch_bytes[slot])
        return st->scratch[slot];
    zt_cuda_wait(x->be, st->stream[ZT_STREAM_COMPUTE]);
    ZT_CUDA_CHECK(x->be, cudaFree(st->scratch[slot]));
    zt_cuda_count(st, -(long long)st->scratch_bytes[slot]);
    st->scratch[slot] = NULL;
    st->scratch_bytes[slot] = 0;
    /* A quarter more than asked, so a batch that grows a little does not reallocate each time. */
    size_t want = (size_t)zt_cuda_scratch_bytes(bytes);
    void *p = NULL;
    ZT_CUDA_CHECK(x->be, cudaMalloc(&p, want));
    if (!p)
        return NULL;
    st->scratch[slot] = p;
    st->scratch_bytes[slot] = want;
    zt_cuda_count(st, (long long)want);
    return p;
}

/* bytes of pinned staging (16-byte aligned) that no queued copy reads, or NULL after recording
 * the failure. A block is added when the ones in use are full: during a model's first step; the
 * next sync takes them all back. Under stage_lock. */
static void *stage(const zt_ctx *x, size_t bytes) {
    zt_cuda_state *st = zt_cuda_of(x);
    bytes = (bytes + 15) & ~(size_t)15;
    void *p = NULL;
    for (; st->stage_at < ZT_CUDA_STAGE_BLOCKS; st->stage_at++) {
        struct zt_cuda_stage_block *b = &st->stage[st->stage_at];
        if (!b->p) {
            /* 1 MB, doubling with each block up to 256 MB: many micro-batches between two
             * syncs (a long accumulation) still find room in a few blocks. */
            int i = st->stage_at < 8 ? st->stage_at : 8;
            size_t want = (size_t)1 << (20 + i);
            want = bytes > want ? bytes : want;
            if (cudaHostAlloc((void **)&b->p, want, cudaHostAllocPortable) != cudaSuccess) {
                cudaGetLastError();
                b->p = NULL;
                break;
            }
            b->bytes = want;
        }
        if (b->bytes - b->used >= bytes) {
            p = b->p + b->used;
            b->used += bytes;
            st->staged++;
            break;
        }
    }
    if (!p)
        zt_cuda_fail(x->be, "CUDA", "cudaHostAlloc", "no pinned staging left for an upload",
                     __FILE__, __LINE__);
    return p;
}

const int32_t *zt_cuda_upload_i32(const zt_ctx *x, zt_cuda_scratch_slot slot, const int32_t *host,
                                  size_t n) {
    int32_t *d = zt_cuda_scratch(x, slot, (n ? n : 1) * sizeof(int32_t));
    if (!d || !n)
        return d;
    zt_cuda_state *st = zt_cuda_of(x);
    pthread_mutex_lock(&st->stage_lock);
    int32_t *staged = stage(x, n * sizeof(int32_t));
    if (staged) {
        memcpy(staged, host, n * sizeof(int32_t));
        ZT_CUDA_CHECK(x->be, cudaMemcpyAsync(d, staged, n * sizeof(int32_t),
                                             cudaMemcpyHostToDevice, zt_cuda_stream(x)));
    }
    pthread_mutex_unlock(&st->stage_lock);
    return staged ? d : NULL;
}

void *zt_cuda_bucket_host(const zt_ctx *x, size_t bytes) {
    zt_cuda_state *st = zt_cuda_of(x);
    if (bytes <= st->bucket_host_bytes)
        return st->bucket_host;
    void *p = realloc(st->bucket_host, bytes);
    if (!p) {
        zt_cuda_fail(x->be, "host", "realloc", "out of host memory", __FILE__, __LINE__);
        return NULL;
    }
    st->bucket_host = p;
    st->bucket_host_bytes = bytes;
    return p;
}

/* What creation needs besides the state itself; on failure the caller destroys st. */
static zt_status setup(zt_cuda_state *st, int dev) {
    st->owner = pthread_self();
    ZT_CUDA_TRY(dev, cudaSetDevice(dev));
    struct cudaDeviceProp prop;
    ZT_CUDA_TRY(dev, cudaGetDeviceProperties(&prop, dev));
    snprintf(st->device_name, sizeof st->device_name, "%s", prop.name);
    for (int s = 0; s < ZT_STREAMS; s++) {
        ZT_CUDA_TRY(dev, cudaStreamCreateWithFlags(&st->stream[s], cudaStreamNonBlocking));
        ZT_CUDA_TRY(dev, cudaEventCreateWithFlags(&st->joined[s], cudaEventDisableTiming));
    }
    ZT_CUBLAS_TRY(dev, cublasLtCreate(&st->lt));
    ZT_CUDA_TRY(dev, cudaMalloc(&st->lt_workspace, ZT_CUDA_CUBLAS_WORKSPACE));
    ZT_CUDA_TRY(dev, cudaMalloc((void **)&st->sums_dev,
                                (2 * ZT_CUDA_SUM_BLOCKS + 2) * sizeof(double)));
    ZT_CUDA_TRY(dev, cudaHostAlloc((void **)&st->sums_host, 2 * sizeof(double),
                                   cudaHostAllocPortable));
    zt_cuda_count(st, ZT_CUDA_CUBLAS_WORKSPACE + (2 * ZT_CUDA_SUM_BLOCKS + 2) * sizeof(double));
    return zt_cuda_vmm_create(st);
}

/* ZTRAIN_CUDA_WEIGHTS: "twin" (the default) lets the linear ops read a mixed-precision model's
 * 16-bit parameters; "round" rounds every weight at every product as before they existed, the
 * same values, which is what tests compare the twin against. */
static zt_status weights_mode(bool *round) {
    const char *v = getenv("ZTRAIN_CUDA_WEIGHTS");
    *round = v && strcmp(v, "round") == 0;
    if (v && *v && !*round && strcmp(v, "twin") != 0)
        return zt_error(ZT_ERR_INVALID, "ZTRAIN_CUDA_WEIGHTS=\"%s\": expected \"twin\" or "
                        "\"round\"", v);
    return ZT_OK;
}

/* ZTRAIN_CUDA_GRADS: "half" (the default) has the ops accumulate a mixed-precision model's
 * gradients into its 16-bit gradients (writes_grad16); "f32" into the fp32 gradients, which ZeRO
 * then adds into the 16-bit ones layer by layer, as before: what tests compare against. */
static zt_status grads_mode(bool *f32) {
    const char *v = getenv("ZTRAIN_CUDA_GRADS");
    *f32 = v && strcmp(v, "f32") == 0;
    if (v && *v && !*f32 && strcmp(v, "half") != 0)
        return zt_error(ZT_ERR_INVALID, "ZTRAIN_CUDA_GRADS=\"%s\": expected \"half\" or "
                        "\"f32\"", v);
    return ZT_OK;
}

zt_status zt_cuda_bias_grad_policy_of_env(zt_cuda_bias_grad_policy *out) {
    const char *e = getenv("ZTRAIN_CUDA_BIAS_GRAD");
    *out = ZT_CUDA_BIAS_GRAD_AUTO;
    if (!e || !*e || strcmp(e, "auto") == 0)
        return ZT_OK;
    if (strcmp(e, "sums") == 0)
        *out = ZT_CUDA_BIAS_GRAD_SUMS;
    else if (strcmp(e, "epilogue") == 0)
        *out = ZT_CUDA_BIAS_GRAD_EPILOGUE;
    else
        return zt_error(ZT_ERR_INVALID, "ZTRAIN_CUDA_BIAS_GRAD=\"%s\": expected \"auto\", "
                        "\"epilogue\" or \"sums\"", e);
    return ZT_OK;
}

unsigned long long zt_cuda_weights_rounded(zt_backend *be) {
    zt_cuda_state *st = be->impl;
    return __atomic_load_n(&st->weights_rounded, __ATOMIC_RELAXED);
}

zt_status zt_cuda_backend_create(zt_backend **out, const zt_backend_options *opts) {
    *out = NULL;
    bool round_weights = false;
    ZT_TRY(weights_mode(&round_weights));
    bool f32_grads = false;
    ZT_TRY(grads_mode(&f32_grads));
    zt_cuda_attention_policy attention;
    ZT_TRY(zt_cuda_attention_policy_of_env(&attention));
    zt_cuda_bias_grad_policy bias_grad;
    ZT_TRY(zt_cuda_bias_grad_policy_of_env(&bias_grad));
    int dev = opts ? opts->device_index : 0;
    int count = 0;
    if (zt_cuda_visible(&count) != ZT_OK)
        return zt_error_prefix(ZT_ERR_UNSUPPORTED, "device \"cuda\": ");
    if (count == 0)
        return zt_error(ZT_ERR_UNSUPPORTED,
                        "device \"cuda\": no CUDA device is visible to this process (no GPU, no "
                        "driver, or CUDA_VISIBLE_DEVICES hides them)");
    if (dev < 0 || dev >= count)
        return zt_error(ZT_ERR_INVALID, "cuda device %d: this process sees %d CUDA device%s",
                        dev, count, count == 1 ? "" : "s");
    zt_cuda_state *st = calloc(1, sizeof *st);
    if (!st)
        return zt_error(ZT_ERR_NOMEM, "cuda backend: out of host memory");
    pthread_mutex_init(&st->lock, NULL);
    pthread_mutex_init(&st->released_lock, NULL);
    pthread_mutex_init(&st->stage_lock, NULL);
    zt_backend *be = &st->be;
    be->impl = st;
    be->name = "cuda";
    be->device = ZT_DEVICE_CUDA;
    be->device_index = dev;
    be->iface = &cuda_iface;
    be->ops = zt_cuda_ops();
    be->act_as_f32 = false;
    be->attn_lse = true; /* attention/: cuDNN and the flash kernel both keep row statistics */
    st->weights_round = round_weights;
    be->reads_param16 = !round_weights; /* zt_param_view, cuda_common.cuh */
    be->writes_grad16 = !f32_grads;     /* zt_grad_view, cuda_common.cuh */
    st->attention = attention;
    st->bias_grad = bias_grad;
    zt_status s = setup(st, dev);
    if (s != ZT_OK) {
        cuda_destroy(be);
        return s;
    }
    *out = be;
    return ZT_OK;
}

int zt_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

/* ---- GPU discovery for kernels/gpu_info.c (ztrain/gpu.h), through backend.c ------------------ */

zt_status zt_cuda_device_props(int index, zt_gpu_props *out) {
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, index);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return zt_error(ZT_ERR_IO, "GPU %d: cudaGetDeviceProperties: %s", index,
                        cudaGetErrorString(e));
    }
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->major = p.major;
    out->minor = p.minor;
    out->total_bytes = p.totalGlobalMem;
    return ZT_OK;
}

zt_status zt_cuda_device_mem(int index, size_t *free_bytes, size_t *total_bytes) {
    int was = 0;
    cudaGetDevice(&was);
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess)
        e = cudaMemGetInfo(free_bytes, total_bytes);
    cudaSetDevice(was);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return zt_error(ZT_ERR_IO, "GPU %d: cudaMemGetInfo: %s", index, cudaGetErrorString(e));
    }
    return ZT_OK;
}

void zt_cuda_device_bind(int index) {
    if (cudaSetDevice(index) != cudaSuccess)
        cudaGetLastError(); /* the ops then fail and sync reports it, naming the device */
}
