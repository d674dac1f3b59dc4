/* ZeRO's communication thread: with overlap_comm, the collectives that the model's hooks queue
 * (gradient buckets to reduce, layers to gather) run here in order while the main thread computes
 * the next layers. Without the thread, a queued job runs at once on the caller's thread. */
#include <pthread.h>
#include <time.h>

#include "zero_internal.h"
#include "ztrain/comm.h"

/* The training thread's time blocked on the communication thread counts as its communication
 * time in the step breakdown (zt_comm_add_wait_ms), the collectives' own time being the other
 * thread's. */
static double monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
#include "ztrain/gpu.h"

static zt_status run_job(zt_zero *z, const zt_zero_job *j) {
    if (j->kind == ZT_ZERO_REDUCE)
        return zt_zero_reduce_range(z, j->lo, j->hi);
    return zt_zero_gather_range(z, j->lo, j->hi);
}

static void *comm_thread_main(void *arg) {
    zt_zero *z = arg;
    /* The CUDA runtime's current device is per thread: this one issues ops and copies too. */
    if (z->be->device == ZT_DEVICE_CUDA)
        zt_gpu_bind_thread(z->be->device_index);
    /* Each job waits on the device for the event its submitter recorded and records one for its
     * consumers: its collectives need no ordering of their own (comm.h). */
    zt_comm_dev_thread_orders_streams(true);
    zt_zero_comm_thread *ct = &z->ct;
    pthread_mutex_lock(&ct->mu);
    for (;;) {
        while (!ct->stop && ct->completed == ct->submitted)
            pthread_cond_wait(&ct->work, &ct->mu);
        if (ct->stop)
            break;
        size_t slot = ct->completed % ZT_ZERO_QUEUE;
        zt_zero_job j = ct->queue[slot];
        bool skip = z->error != ZT_OK;
        pthread_mutex_unlock(&ct->mu);
        /* After a failure the communicator is unusable: later jobs only count as done. */
        zt_backend_stream_wait(z->be, ZT_STREAM_COMM, ct->ready[slot]);
        zt_status s = skip ? ZT_OK : run_job(z, &j);
        zt_backend_event_record(z->be, ct->finished[slot], ZT_STREAM_COMM);
        pthread_mutex_lock(&ct->mu);
        zt_zero_record(z, s);
        ct->completed++;
        pthread_cond_broadcast(&ct->done);
    }
    pthread_mutex_unlock(&ct->mu);
    return NULL;
}

/* Queues a job for the communication thread (or runs it here without one); returns its sequence
 * number. */
uint64_t zt_zero_submit(zt_zero *z, zt_zero_job j) {
    zt_zero_comm_thread *ct = &z->ct;
    if (!ct->running) {
        zt_status s = run_job(z, &j);
        if (s != ZT_OK)
            zt_zero_fail(z, s);
        return 0;
    }
    pthread_mutex_lock(&ct->mu);
    double t0 = monotonic_ms();
    while (ct->submitted - ct->completed == ZT_ZERO_QUEUE)
        pthread_cond_wait(&ct->done, &ct->mu);
    zt_comm_add_wait_ms(monotonic_ms() - t0);
    size_t slot = ct->submitted % ZT_ZERO_QUEUE;
    if (ct->released + ZT_ZERO_QUEUE <= ct->submitted) {
        /* The slot's job is still to be let go (a reduction nobody waited for since): it has
         * run, since the queue is not full; wait for it on the device and let it go first. */
        pthread_mutex_unlock(&ct->mu);
        zt_zero_wait_for(z, ct->submitted + 1 - ZT_ZERO_QUEUE);
        pthread_mutex_lock(&ct->mu);
    }
    ct->queue[slot] = j;
    zt_backend_event_record(z->be, ct->ready[slot], ZT_STREAM_COMPUTE);
    uint64_t seq = ++ct->submitted;
    pthread_cond_signal(&ct->work);
    pthread_mutex_unlock(&ct->mu);
    return seq;
}

/* Waits until job `seq` (and everything queued before it) has run, and orders the compute issued
 * from now on after its collective. */
void zt_zero_wait_for(zt_zero *z, uint64_t seq) {
    zt_zero_comm_thread *ct = &z->ct;
    if (!ct->running || seq == 0)
        return;
    pthread_mutex_lock(&ct->mu);
    double t0 = monotonic_ms();
    while (ct->completed < seq)
        pthread_cond_wait(&ct->done, &ct->mu);
    zt_comm_add_wait_ms(monotonic_ms() - t0);
    /* The slot is not reused before this job's successors are queued, which only this thread
     * does. */
    zt_backend_stream_wait(z->be, ZT_STREAM_COMPUTE, ct->finished[(seq - 1) % ZT_ZERO_QUEUE]);
    /* The compute stream is now after every job up to seq: the ranges they reduced can go, the
     * release marks recorded there following the reductions. */
    for (; ct->released < seq; ct->released++) {
        const zt_zero_job *j = &ct->queue[ct->released % ZT_ZERO_QUEUE];
        if (j->kind == ZT_ZERO_REDUCE)
            zt_zero_let_go_reduced(z, j->lo, j->hi);
    }
    pthread_mutex_unlock(&ct->mu);
}

bool zt_zero_on_comm_thread(const zt_zero *z) {
    return z->ct.running && pthread_equal(pthread_self(), z->ct.thread);
}

const zt_ctx *zt_zero_job_ctx(const zt_zero *z) {
    return zt_zero_on_comm_thread(z) ? &z->ct.ctx : &z->ctx;
}

void zt_zero_drain(zt_zero *z) {
    if (!z->ct.running)
        return;
    pthread_mutex_lock(&z->ct.mu);
    uint64_t all = z->ct.submitted;
    pthread_mutex_unlock(&z->ct.mu);
    zt_zero_wait_for(z, all);
}

static void destroy_events(zt_zero *z) {
    zt_zero_comm_thread *ct = &z->ct;
    for (int i = 0; i < ZT_ZERO_QUEUE; i++) {
        if (ct->ready[i])
            zt_backend_event_destroy(z->be, ct->ready[i]);
        if (ct->finished[i])
            zt_backend_event_destroy(z->be, ct->finished[i]);
        ct->ready[i] = ct->finished[i] = NULL;
    }
}

zt_status zt_zero_start_comm_thread(zt_zero *z) {
    zt_zero_comm_thread *ct = &z->ct;
    for (int i = 0; i < ZT_ZERO_QUEUE; i++) {
        ct->ready[i] = zt_backend_event_create(z->be);
        ct->finished[i] = zt_backend_event_create(z->be);
        if (!ct->ready[i] || !ct->finished[i]) {
            destroy_events(z);
            return zt_error(ZT_ERR_NOMEM, "zero: cannot create the communication events on %s",
                            z->be->name);
        }
    }
    ct->ctx = z->ctx;
    ct->ctx.stream = ZT_STREAM_COMM;
    ct->released = ct->completed = ct->submitted = 0;
    pthread_mutex_init(&ct->mu, NULL);
    pthread_cond_init(&ct->work, NULL);
    pthread_cond_init(&ct->done, NULL);
    if (pthread_create(&ct->thread, NULL, comm_thread_main, z) != 0) {
        pthread_mutex_destroy(&ct->mu);
        pthread_cond_destroy(&ct->work);
        pthread_cond_destroy(&ct->done);
        destroy_events(z);
        return zt_error(ZT_ERR_NOMEM, "zero: cannot start the communication thread");
    }
    ct->running = true;
    return ZT_OK;
}

void zt_zero_stop_comm_thread(zt_zero *z) {
    zt_zero_comm_thread *ct = &z->ct;
    if (!ct->running)
        return;
    pthread_mutex_lock(&ct->mu);
    ct->stop = true;
    pthread_cond_signal(&ct->work);
    pthread_mutex_unlock(&ct->mu);
    pthread_join(ct->thread, NULL);
    ct->running = false;
    pthread_mutex_destroy(&ct->mu);
    pthread_cond_destroy(&ct->work);
    pthread_cond_destroy(&ct->done);
    destroy_events(z);
}

