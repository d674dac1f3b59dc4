/* ZeRO's communication thread: with overlap_comm, the collectives that the model's hooks queue
 * (gradient buckets to reduce, layers to gather) run here in order while the main thread computes
 * the next layers. Without the thread, a queued job runs at once on the caller's thread. */
#include <pthread.h>

#include "zero_internal.h"

static zt_status run_job(zt_zero *z, const zt_zero_job *j) {
    return j->kind == ZT_ZERO_REDUCE ? zt_zero_reduce_range(z, j->lo, j->hi) : zt_zero_gather_range(z, j->lo, j->hi);
}

static void *comm_thread_main(void *arg) {
    zt_zero *z = arg;
    zt_zero_comm_thread *ct = &z->ct;
    pthread_mutex_lock(&ct->mu);
    for (;;) {
        while (!ct->stop && ct->completed == ct->submitted)
            pthread_cond_wait(&ct->work, &ct->mu);
        if (ct->stop)
            break;
        zt_zero_job j = ct->queue[ct->completed % ZT_ZERO_QUEUE];
        bool skip = z->error != ZT_OK;
        pthread_mutex_unlock(&ct->mu);
        /* After a failure the communicator is unusable: later jobs only count as done. */
        zt_status s = skip ? ZT_OK : run_job(z, &j);
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
    while (ct->submitted - ct->completed == ZT_ZERO_QUEUE)
        pthread_cond_wait(&ct->done, &ct->mu);
    ct->queue[ct->submitted % ZT_ZERO_QUEUE] = j;
    uint64_t seq = ++ct->submitted;
    pthread_cond_signal(&ct->work);
    pthread_mutex_unlock(&ct->mu);
    return seq;
}

/* Waits until job `seq` (and everything queued before it) has run. */
void zt_zero_wait_for(zt_zero *z, uint64_t seq) {
    zt_zero_comm_thread *ct = &z->ct;
    if (!ct->running)
        return;
    pthread_mutex_lock(&ct->mu);
    while (ct->completed < seq)
        pthread_cond_wait(&ct->done, &ct->mu);
    pthread_mutex_unlock(&ct->mu);
}

void zt_zero_drain(zt_zero *z) {
    if (!z->ct.running)
        return;
    pthread_mutex_lock(&z->ct.mu);
    uint64_t all = z->ct.submitted;
    pthread_mutex_unlock(&z->ct.mu);
    zt_zero_wait_for(z, all);
}

zt_status zt_zero_start_comm_thread(zt_zero *z) {
    zt_zero_comm_thread *ct = &z->ct;
    pthread_mutex_init(&ct->mu, NULL);
    pthread_cond_init(&ct->work, NULL);
    pthread_cond_init(&ct->done, NULL);
    if (pthread_create(&ct->thread, NULL, comm_thread_main, z) != 0) {
        pthread_mutex_destroy(&ct->mu);
        pthread_cond_destroy(&ct->work);
        pthread_cond_destroy(&ct->done);
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
}

