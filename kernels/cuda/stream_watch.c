/* The CUDA backend's host waits when communicators watch its streams: NCCL's collectives on
 * device memory are posted on the communication stream without a host wait of their own
 * (nccl_comm.c), so the backend's next wait is the one that would meet a collective whose peer
 * died, and cudaStreamSynchronize would then never return. Such a wait polls instead: the stream,
 * and between queries each watching communicator, which gives up at its deadline or on NCCL's
 * asynchronous error, aborts itself (which ends its kernels) and fails the wait. */
#include <stdio.h>
#include <time.h>

#include "cuda_backend.h"

/* One backend per process (a rank per GPU): one lock for the watchers of all, held while they
 * are polled, so that a communicator detaching waits until no poll uses it. */
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
/* The last registration's id, under watch_lock: ids start at 1 and are never reused, where a ctx
 * (a communicator's address) may be, once it is freed. */
static unsigned long long last_id;

zt_status zt_cuda_watch_add(zt_backend *be, zt_cuda_watch_fn poll, zt_cuda_mark_fn mark,
                            void *ctx) {
    zt_cuda_state *st = be->impl;
    pthread_mutex_lock(&watch_lock);
    int n = st->watchers;
    if (n < ZT_CUDA_WATCHERS) {
        st->watch[n].poll = poll;
        st->watch[n].mark = mark;
        st->watch[n].ctx = ctx;
        st->watch[n].id = ++last_id;
        st->watchers = n + 1;
    }
    pthread_mutex_unlock(&watch_lock);
    if (n == ZT_CUDA_WATCHERS)
        return zt_error(ZT_ERR_INVALID, "cuda device %d: more than %d communicators post "
                        "collectives on its streams", be->device_index, ZT_CUDA_WATCHERS);
    return ZT_OK;
}

void zt_cuda_watch_remove(zt_backend *be, void *ctx) {
    zt_cuda_state *st = be->impl;
    pthread_mutex_lock(&watch_lock);
    for (int i = 0; i < st->watchers; i++) {
        if (st->watch[i].ctx == ctx) {
            st->watch[i] = st->watch[--st->watchers];
            break;
        }
    }
    pthread_mutex_unlock(&watch_lock);
}

/* Every watcher once, as a look during a wait (m NULL) or after a covering wait with the marks
 * taken before it; the first failure is recorded as the backend's. A watcher that was not
 * registered when the marks were taken is only looked at: nothing of its work is known to be
 * covered. The marks name registrations, not addresses: a communicator destroyed after the
 * marks and another made at its address before the settle is a registration the marks never
 * saw. */
static zt_status poll_all(zt_backend *be, const zt_cuda_watch_marks *m) {
    zt_cuda_state *st = be->impl;
    zt_status s = ZT_OK;
    pthread_mutex_lock(&watch_lock);
    for (int i = 0; i < st->watchers && s == ZT_OK; i++) {
        long covered = -1;
        for (int j = 0; m && j < m->n; j++)
            if (m->id[j] == st->watch[i].id)
                covered = m->seq[j];
        s = st->watch[i].poll(st->watch[i].ctx, covered);
    }
    pthread_mutex_unlock(&watch_lock);
    if (s != ZT_OK)
        zt_cuda_fail(be, "NCCL", "a collective posted on the backend's streams", zt_last_error(),
                     __FILE__, __LINE__);
    return s;
}

bool zt_cuda_watched_wait(zt_backend *be, cudaStream_t s) {
    zt_cuda_state *st = be->impl;
    pthread_mutex_lock(&watch_lock);
    int n = st->watchers;
    pthread_mutex_unlock(&watch_lock);
    if (n == 0)
        return false;
    for (long polls = 0;; polls++) {
        cudaError_t q = cudaStreamQuery(s);
        if (q == cudaSuccess)
            break;
        if (q != cudaErrorNotReady) {
            ZT_CUDA_CHECK(be, cudaStreamQuery(s));
            return true;
        }
        if (poll_all(be, NULL) != ZT_OK) {
            /* The communicator aborted, which ends its kernels: the stream drains. */
            ZT_CUDA_CHECK(be, cudaStreamSynchronize(s));
            return true;
        }
        /* Spin first (a step's last collective is usually done), then leave the cores. */
        if (polls >= 1000)
            nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    /* Work that failed as it completed shows in the asynchronous error now. */
    poll_all(be, NULL);
    return true;
}

zt_status zt_cuda_watched_event_wait(zt_backend *be, cudaEvent_t e) {
    zt_cuda_state *st = be->impl;
    pthread_mutex_lock(&watch_lock);
    int n = st->watchers;
    pthread_mutex_unlock(&watch_lock);
    if (n == 0) {
        cudaError_t rc = cudaEventSynchronize(e);
        if (rc == cudaSuccess)
            return ZT_OK;
        ZT_CUDA_CHECK(be, rc);
        return zt_error(ZT_ERR_IO, "cuda device %d (%s): cudaEventSynchronize: %s",
                        be->device_index, st->device_name, cudaGetErrorString(rc));
    }
    for (long polls = 0;; polls++) {
        cudaError_t q = cudaEventQuery(e);
        if (q == cudaSuccess)
            break;
        if (q != cudaErrorNotReady) {
            ZT_CUDA_CHECK(be, q);
            return zt_error(ZT_ERR_IO, "cuda device %d (%s): cudaEventQuery: %s",
                            be->device_index, st->device_name, cudaGetErrorString(q));
        }
        zt_status s = poll_all(be, NULL);
        if (s != ZT_OK) {
            /* The message is the communicator's; the abort ends its kernels, so the event
             * fires and nothing queued before it still runs. */
            char msg[512];
            snprintf(msg, sizeof msg, "%s", zt_last_error());
            ZT_CUDA_CHECK(be, cudaEventSynchronize(e));
            return zt_error(s, "%s", msg);
        }
        if (polls >= 1000)
            nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    /* Work that failed as it completed shows in the asynchronous error now (its message is
     * the communicator's). */
    return poll_all(be, NULL);
}

void zt_cuda_watch_mark(zt_backend *be, zt_cuda_watch_marks *m) {
    zt_cuda_state *st = be->impl;
    pthread_mutex_lock(&watch_lock);
    m->n = st->watchers;
    for (int i = 0; i < m->n; i++) {
        m->id[i] = st->watch[i].id;
        m->seq[i] = st->watch[i].mark(st->watch[i].ctx);
    }
    pthread_mutex_unlock(&watch_lock);
}

void zt_cuda_watch_settled(zt_backend *be, const zt_cuda_watch_marks *m) { poll_all(be, m); }
