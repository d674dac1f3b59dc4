/* ZeRO stages 0–3 over the model's flat buffers (see zero.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "zero.h"

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* The pieces of [lo, hi) that each rank owns, relative to lo. */
static void pieces(const zt_zero *z, size_t lo, size_t hi, size_t *offsets, size_t *counts) {
    for (int r = 0; r < z->world; r++) {
        size_t a = max_sz(lo, (size_t)r * z->part), b = min_sz(hi, (size_t)(r + 1) * z->part);
        offsets[r] = a < b ? a - lo : 0;
        counts[r] = a < b ? b - a : 0;
    }
}

static void lock(zt_zero *z) {
    if (z->ct.running)
        pthread_mutex_lock(&z->ct.mu);
}

static void unlock(zt_zero *z) {
    if (z->ct.running)
        pthread_mutex_unlock(&z->ct.mu);
}

static void fail(zt_zero *z, zt_status s) {
    lock(z);
    if (z->error == ZT_OK)
        z->error = s;
    unlock(z);
}

static zt_status first_error(zt_zero *z) {
    lock(z);
    zt_status s = z->error;
    unlock(z);
    return s;
}

/* Both threads record peaks, so updates go under the lock. */
static void note_max(zt_zero *z, double *slot, double v) {
    lock(z);
    if (v > *slot)
        *slot = v;
    unlock(z);
}

static double resident(const float *x, size_t lo, size_t hi) {
    return (double)zt_flat_resident_bytes(x, lo, hi);
}

/* Gathers [lo, hi) of the parameters from their owners. */
static zt_status gather_range(zt_zero *z, size_t lo, size_t hi) {
    size_t offsets[256], counts[256];
    pieces(z, lo, hi, offsets, counts);
    return zt_comm_all_gather(z->comm, z->model->params + lo, hi - lo, offsets, counts);
}

/* Lets go of [lo, hi) of the parameters outside this rank's slice. */
static void release_unowned(zt_zero *z, size_t lo, size_t hi) {
    zt_flat_release(z->model->params, lo, min_sz(hi, z->own_lo));
    zt_flat_release(z->model->params, max_sz(lo, z->own_hi), hi);
}

static const zt_zero_segment *segment(const zt_zero *z, int layer) {
    return &z->segments[layer + 1];
}

/* ---- the communication thread ----------------------------------------------------------- */

static zt_status reduce_range(zt_zero *z, size_t lo, size_t hi);

static zt_status run_job(zt_zero *z, const zt_zero_job *j) {
    return j->kind == ZT_ZERO_REDUCE ? reduce_range(z, j->lo, j->hi) : gather_range(z, j->lo, j->hi);
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
        if (s != ZT_OK && z->error == ZT_OK)
            z->error = s;
        ct->completed++;
        pthread_cond_broadcast(&ct->done);
    }
    pthread_mutex_unlock(&ct->mu);
    return NULL;
}

/* Queues a job for the communication thread (or runs it here without one); returns its sequence
 * number. */
static uint64_t submit(zt_zero *z, zt_zero_job j) {
    zt_zero_comm_thread *ct = &z->ct;
    if (!ct->running) {
        zt_status s = run_job(z, &j);
        if (s != ZT_OK)
            fail(z, s);
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
static void wait_for(zt_zero *z, uint64_t seq) {
    zt_zero_comm_thread *ct = &z->ct;
    if (!ct->running)
        return;
    pthread_mutex_lock(&ct->mu);
    while (ct->completed < seq)
        pthread_cond_wait(&ct->done, &ct->mu);
    pthread_mutex_unlock(&ct->mu);
}

static void drain(zt_zero *z) {
    if (!z->ct.running)
        return;
    pthread_mutex_lock(&z->ct.mu);
    uint64_t all = z->ct.submitted;
    pthread_mutex_unlock(&z->ct.mu);
    wait_for(z, all);
}

static zt_status start_comm_thread(zt_zero *z) {
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

static void stop_comm_thread(zt_zero *z) {
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

/* ---- model hooks ------------------------------------------------------------------------- */

static void queue_gather(zt_zero *z, int layer) {
    const zt_zero_segment *sg = segment(z, layer);
    uint64_t seq = 0;
    for (int i = 0; i < sg->n; i++)
        seq = submit(z, (zt_zero_job){ZT_ZERO_GATHER, sg->off[i], sg->off[i] + sg->len[i]});
    z->prefetched[layer + 1] = seq;
}

static void hook_fetch(void *ctx, int layer, bool backward) {
    zt_zero *z = ctx;
    if (z->stage < 3 || !z->comm || first_error(z) != ZT_OK)
        return;
    if (z->prefetched[layer + 1]) {
        wait_for(z, z->prefetched[layer + 1]);
        z->prefetched[layer + 1] = 0;
    } else {
        /* Not prefetched: gather it now, in order after whatever is queued. */
        drain(z);
        const zt_zero_segment *sg = segment(z, layer);
        for (int i = 0; i < sg->n; i++) {
            zt_status s = gather_range(z, sg->off[i], sg->off[i] + sg->len[i]);
            if (s != ZT_OK) {
                fail(z, s);
                return;
            }
        }
    }
    int next = backward ? layer - 1 : layer + 1;
    if (z->prefetch && next >= 0 && next < z->model->n_layer)
        queue_gather(z, next);
    note_max(z, &z->peak.params_bytes, resident(z->model->params, 0, z->model->n_padded));
}

static void hook_release(void *ctx, int layer) {
    zt_zero *z = ctx;
    if (z->stage < 3)
        return;
    /* The end of a pass: nothing may still be in flight when the caller talks to the
     * communicator itself. */
    if (layer < 0)
        drain(z);
    const zt_model *m = z->model;
    for (int t = 0; t < m->n_tensors; t++) {
        const zt_tensor_info *ti = &m->tensors[t];
        if (ti->layer == layer && !z->persistent[t])
            release_unowned(z, ti->offset, ti->offset + ti->numel);
    }
}

/* Reduce-scatters the gradients of [lo, hi) (averaged over ranks) and adds this rank's piece to
 * its accumulator; the whole range of the full-size gradient buffer is then released. */
static zt_status reduce_range(zt_zero *z, size_t lo, size_t hi) {
    if (hi <= lo)
        return ZT_OK;
    float *g = z->model->grads;
    note_max(z, &z->peak.grads_bytes,
             resident(g, 0, z->model->n_padded) + (double)z->part * sizeof(float));
    size_t offsets[256], counts[256];
    pieces(z, lo, hi, offsets, counts);
    if (z->comm) {
        size_t off = offsets[z->rank];
        ZT_TRY(zt_comm_reduce_scatter(z->comm, g + lo, g + lo + off, hi - lo, offsets, counts,
                                      ZT_REDUCE_AVG));
    }
    size_t a = max_sz(lo, z->own_lo), b = min_sz(hi, z->own_hi);
    for (size_t i = a; i < b; i++)
        z->grad_acc[i - z->own_lo] += g[i];
    zt_flat_release(g, lo, hi);
    return ZT_OK;
}

static void hook_grads_ready(void *ctx, int layer) {
    zt_zero *z = ctx;
    if (z->stage < 2 || first_error(z) != ZT_OK)
        return;
    const zt_zero_segment *sg = segment(z, layer);
    zt_status s = ZT_OK;
    if (layer >= 0) {
        /* Blocks become ready from the last to the first, so the pending range grows downward. */
        if (z->pend_hi == z->pend_lo)
            z->pend_hi = sg->off[0] + sg->len[0];
        z->pend_lo = sg->off[0];
        if (z->pend_hi - z->pend_lo >= z->bucket_size) {
            /* At most one bucket in flight while the next fills, so the gradient memory stays
             * bounded by two buckets however slow the communication is. */
            wait_for(z, z->last_reduce);
            z->last_reduce = submit(z, (zt_zero_job){ZT_ZERO_REDUCE, z->pend_lo, z->pend_hi});
            z->pend_lo = z->pend_hi = 0;
        }
    } else {
        /* The outer tensors are last: flush what is pending, then them (and the padding), and
         * wait, so the step finds every gradient reduced. */
        drain(z);
        s = reduce_range(z, z->pend_lo, z->pend_hi);
        z->pend_lo = z->pend_hi = 0;
        for (int i = 0; i < sg->n && s == ZT_OK; i++) {
            size_t hi = sg->off[i] + sg->len[i];
            if (hi == z->model->n_params)
                hi = z->model->n_padded;
            s = reduce_range(z, sg->off[i], hi);
        }
    }
    if (s != ZT_OK)
        fail(z, s);
}

/* The runs of the flat buffer each layer's tensors occupy (the outer tensors: two runs). */
static zt_status build_segments(zt_zero *z) {
    const zt_model *m = z->model;
    z->segments = calloc((size_t)m->n_layer + 1, sizeof *z->segments);
    if (!z->segments)
        return zt_error(ZT_ERR_NOMEM, "zero: out of memory");
    for (int t = 0; t < m->n_tensors; t++) {
        const zt_tensor_info *ti = &m->tensors[t];
        zt_zero_segment *sg = &z->segments[ti->layer + 1];
        if (sg->n > 0 && sg->off[sg->n - 1] + sg->len[sg->n - 1] == ti->offset) {
            sg->len[sg->n - 1] += ti->numel;
        } else {
            ZT_ASSERT(sg->n < 2);
            sg->off[sg->n] = ti->offset;
            sg->len[sg->n] = ti->numel;
            sg->n++;
        }
    }
    return ZT_OK;
}

zt_status zt_zero_init(zt_zero *z, zt_model *m, zt_comm *comm, int stage, size_t bucket_size,
                       size_t persistence_threshold, bool overlap_comm, size_t prefetch_size) {
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->comm = comm;
    z->model = m;
    z->rank = comm ? zt_comm_rank(comm) : 0;
    z->world = comm ? zt_comm_world_size(comm) : 1;
    if (z->world > 256)
        return zt_error(ZT_ERR_UNSUPPORTED, "zero: world size %d is above 256", z->world);
    z->part = m->n_padded / (size_t)z->world;
    z->own_lo = (size_t)z->rank * z->part;
    z->own_hi = z->own_lo + z->part;
    z->bucket_size = bucket_size ? bucket_size : 1;
    ZT_TRY(build_segments(z));
    if (stage >= 2) {
        if (posix_memalign((void **)&z->grad_acc, 64, (z->part ? z->part : 1) * sizeof(float)))
            return zt_error(ZT_ERR_NOMEM, "zero: cannot allocate the gradient partition");
        memset(z->grad_acc, 0, z->part * sizeof(float));
    }
    z->persistent = calloc((size_t)m->n_tensors, sizeof *z->persistent);
    if (!z->persistent)
        return zt_error(ZT_ERR_NOMEM, "zero: out of memory");
    for (int t = 0; t < m->n_tensors; t++)
        z->persistent[t] = m->tensors[t].numel < persistence_threshold;
    z->prefetched = calloc((size_t)m->n_layer + 1, sizeof *z->prefetched);
    if (!z->prefetched)
        return zt_error(ZT_ERR_NOMEM, "zero: out of memory");
    if (comm && stage >= 2 && overlap_comm) {
        ZT_TRY(start_comm_thread(z));
        z->prefetch = stage == 3 && prefetch_size > 0;
    }
    m->hooks = (zt_model_hooks){z, hook_fetch, hook_release, hook_grads_ready};
    return ZT_OK;
}

void zt_zero_free(zt_zero *z) {
    stop_comm_thread(z);
    if (z->model)
        z->model->hooks = (zt_model_hooks){0};
    free(z->prefetched);
    free(z->grad_acc);
    free(z->segments);
    free(z->persistent);
    memset(z, 0, sizeof *z);
}

void zt_zero_after_load(zt_zero *z) {
    if (z->stage < 3)
        return;
    const zt_model *m = z->model;
    for (int t = 0; t < m->n_tensors; t++)
        if (!z->persistent[t])
            release_unowned(z, m->tensors[t].offset, m->tensors[t].offset + m->tensors[t].numel);
}

zt_status zt_zero_gather_all(zt_zero *z) {
    if (z->stage < 3 || !z->comm)
        return ZT_OK;
    return gather_range(z, 0, z->model->n_padded);
}

zt_status zt_zero_reduce_gradients(zt_zero *z, float **g, float **p, size_t *count) {
    drain(z);
    ZT_TRY(first_error(z));
    zt_model *m = z->model;
    if (z->stage < 2)
        note_max(z, &z->peak.grads_bytes, resident(m->grads, 0, m->n_padded));
    if (z->stage == 0 || !z->comm) {
        if (z->comm)
            ZT_TRY(zt_comm_all_reduce(z->comm, m->grads, m->n_padded, ZT_REDUCE_AVG));
        if (z->stage == 0) {
            *g = m->grads;
            *p = m->params;
            *count = m->n_padded;
            return ZT_OK;
        }
    } else if (z->stage == 1) {
        size_t offsets[256], counts[256];
        pieces(z, 0, m->n_padded, offsets, counts);
        ZT_TRY(zt_comm_reduce_scatter(z->comm, m->grads, m->grads + z->own_lo, m->n_padded,
                                      offsets, counts, ZT_REDUCE_AVG));
    }
    *g = z->stage >= 2 ? z->grad_acc : m->grads + z->own_lo;
    *p = m->params + z->own_lo;
    *count = z->part;
    return ZT_OK;
}

zt_status zt_zero_norm_squared(zt_zero *z, const float *g, size_t count, double *out) {
    double s = z->model->k->sum_squares(g, count);
    /* Stage 0 holds the whole reduced gradient on every rank; the others sum their slices. */
    if (z->stage >= 1 && z->comm)
        ZT_TRY(zt_comm_all_reduce_f64(z->comm, &s, 1, ZT_REDUCE_SUM));
    *out = s;
    return ZT_OK;
}

zt_status zt_zero_after_step(zt_zero *z) {
    zt_model *m = z->model;
    if (z->stage >= 2)
        memset(z->grad_acc, 0, z->part * sizeof(float));
    else
        memset(m->grads, 0, m->n_padded * sizeof(float));
    if (!z->comm || z->stage == 0)
        goto measure;
    if (z->stage < 3) {
        ZT_TRY(gather_range(z, 0, m->n_padded));
    } else {
        for (int t = 0; t < m->n_tensors; t++)
            if (z->persistent[t])
                ZT_TRY(gather_range(z, m->tensors[t].offset,
                                    m->tensors[t].offset + m->tensors[t].numel));
    }
measure:
    note_max(z, &z->peak.params_bytes, resident(m->params, 0, m->n_padded));
    return ZT_OK;
}

zt_engine_memory zt_zero_take_memory(zt_zero *z, size_t optimizer_bytes) {
    zt_model *m = z->model;
    zt_engine_memory out = z->peak;
    out.optimizer_bytes = (double)optimizer_bytes;
    if (z->stage >= 2 && out.grads_bytes < (double)z->part * sizeof(float))
        out.grads_bytes = (double)z->part * sizeof(float);
    z->peak.params_bytes = resident(m->params, 0, m->n_padded);
    z->peak.grads_bytes = resident(m->grads, 0, m->n_padded) +
                          (z->stage >= 2 ? (double)z->part * sizeof(float) : 0.0);
    return out;
}

zt_status zt_zero_status(zt_zero *z) { return first_error(z); }
