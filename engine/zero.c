/* ZeRO stages 0–3 over the model's flat buffers (see zero.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero.h"

enum { HALF_ALL_REDUCE, HALF_REDUCE_SCATTER, HALF_ALL_GATHER };
static zt_status half_collective(zt_zero *z, uint16_t *x, int op);
static void poison(zt_zero *z);

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

/* Records the first failure with its message, which lives in the failing thread's
 * zt_last_error (call with the lock held, or without a comm thread). */
static void record(zt_zero *z, zt_status s) {
    if (s == ZT_OK || z->error != ZT_OK)
        return;
    z->error = s;
    snprintf(z->error_msg, sizeof z->error_msg, "%s", zt_last_error());
}

static void fail(zt_zero *z, zt_status s) {
    lock(z);
    record(z, s);
    unlock(z);
}

/* The first failure, its message made this thread's zt_last_error. */
static zt_status first_error(zt_zero *z) {
    lock(z);
    zt_status s = z->error;
    if (s != ZT_OK)
        zt_error(s, "%s", z->error_msg);
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

/* Reads this rank's piece [a, a + n) of its offloaded parameters into the fp32 working copy
 * (16-bit ones pass through the 16-bit buffer, which holds nothing else at stage 3 then). */
static zt_status load_owned(zt_zero *z, size_t a, size_t n) {
    float *p = z->model->params;
    if (!z->half)
        return zt_offload_read(z->off, ZT_OFFLOAD_PARAMS, a - z->own_lo, p + a, n);
    ZT_TRY(zt_offload_read(z->off, ZT_OFFLOAD_PARAMS, a - z->own_lo, z->p16 + a, n));
    z->model->k->from_half(p + a, z->p16 + a, n, z->dtype);
    zt_half_release(z->p16, a, a + n);
    return ZT_OK;
}

/* Gathers [lo, hi) of the parameters from their owners (in mixed precision, each owner first
 * widens its 16-bit piece into the fp32 working copy; the values stay 16-bit exact; offloaded
 * pieces are read from the file first). */
static zt_status gather_range(zt_zero *z, size_t lo, size_t hi) {
    size_t offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
    pieces(z, lo, hi, offsets, counts);
    float *p = z->model->params;
    size_t a = lo + offsets[z->rank], n = counts[z->rank];
    if (n && z->param_file)
        ZT_TRY(load_owned(z, a, n));
    else if (z->half && n)
        z->model->k->from_half(p + a, z->p16 + a, n, z->dtype);
    return z->comm ? zt_comm_all_gather(z->comm, p + lo, hi - lo, offsets, counts, ZT_F32) : ZT_OK;
}

/* Stage 3 brings layers in as they are used: gathered from their owners, or read from this
 * rank's file. */
static bool gathers(const zt_zero *z) { return z->stage == 3 && (z->comm || z->param_file); }

/* Brings [lo, hi) of the fp32 parameters into place for the model: gathered from their owners at
 * stage 3, widened from the 16-bit parameters in mixed precision. */
static zt_status materialise(zt_zero *z, size_t lo, size_t hi) {
    if (gathers(z))
        return gather_range(z, lo, hi);
    if (z->half)
        z->model->k->from_half(z->model->params + lo, z->p16 + lo, hi - lo, z->dtype);
    return ZT_OK;
}

static double workspace(zt_zero *z) {
    const zt_model *m = z->model;
    return resident(m->params, 0, m->n_padded) + resident(m->grads, 0, m->n_padded);
}

/* Lets go of [lo, hi) of the parameters outside this rank's slice (all of it when the slice
 * itself lives in a file). */
static void release_unowned(zt_zero *z, size_t lo, size_t hi) {
    if (z->param_file) {
        zt_flat_release(z->model->params, lo, hi);
        return;
    }
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
        record(z, s);
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
    if (!(z->half || gathers(z)) || first_error(z) != ZT_OK)
        return;
    if (z->prefetched[layer + 1]) {
        wait_for(z, z->prefetched[layer + 1]);
        z->prefetched[layer + 1] = 0;
    } else {
        /* Not prefetched: bring it in now, in order after whatever is queued. */
        drain(z);
        const zt_zero_segment *sg = segment(z, layer);
        for (int i = 0; i < sg->n; i++) {
            zt_status s = materialise(z, sg->off[i], sg->off[i] + sg->len[i]);
            if (s != ZT_OK) {
                fail(z, s);
                return;
            }
        }
    }
    int next = backward ? layer - 1 : layer + 1;
    if (z->prefetch && next >= 0 && next < z->model->n_layer)
        queue_gather(z, next);
    if (z->half)
        note_max(z, &z->peak.workspace_bytes, workspace(z));
    else
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

/* Mixed precision: the fp32 working copy of a layer goes once the layer is done. */
static void hook_release_half(void *ctx, int layer) {
    zt_zero *z = ctx;
    if (layer < 0)
        drain(z);
    const zt_zero_segment *sg = segment(z, layer);
    for (int i = 0; i < sg->n; i++)
        zt_flat_release(z->model->params, sg->off[i], sg->off[i] + sg->len[i]);
}

/* Reduce-scatters the gradients of [lo, hi) (averaged over ranks) and adds this rank's piece to
 * its accumulator; the whole range of the full-size gradient buffer is then released. */
static zt_status reduce_range(zt_zero *z, size_t lo, size_t hi) {
    if (hi <= lo)
        return ZT_OK;
    float *g = z->model->grads;
    const zt_kernels *k = z->model->k;
    if (z->half)
        note_max(z, &z->peak.workspace_bytes, workspace(z));
    else
        note_max(z, &z->peak.grads_bytes,
                 resident(g, 0, z->model->n_padded) + (double)z->part * sizeof(float));
    size_t offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
    pieces(z, lo, hi, offsets, counts);
    size_t a = max_sz(lo, z->own_lo), b = min_sz(hi, z->own_hi);
    /* What travels is rounded to communication_data_type (16-bit gradients by default in mixed
     * precision); the reduction itself adds in fp32. */
    if (z->half && z->comm_dtype != ZT_F32)
        k->round_to(g + lo, hi - lo, z->comm_dtype);
    if (z->comm) {
        size_t off = offsets[z->rank];
        ZT_TRY(zt_comm_reduce_scatter(z->comm, g + lo, g + lo + off, hi - lo, offsets, counts,
                                      ZT_F32, ZT_REDUCE_AVG));
    }
    if (z->half) {
        if (a < b && z->comm_dtype != ZT_F32)
            k->round_to(g + a, b - a, z->comm_dtype);
        if (a < b)
            k->accumulate_half(z->gacc16 + (a - z->own_lo), g + a, b - a, z->dtype);
    } else {
        for (size_t i = a; i < b; i++)
            z->grad_acc[i - z->own_lo] += g[i];
    }
    zt_flat_release(g, lo, hi);
    return ZT_OK;
}

static void hook_grads_ready(void *ctx, int layer) {
    zt_zero *z = ctx;
    if (z->half && z->stage < 2) {
        /* The layer's fp32 gradients go into the 16-bit gradient buffer (rounded to nearest even,
         * accumulating over micro-steps) and the fp32 copy is let go. */
        const zt_zero_segment *sg = segment(z, layer);
        note_max(z, &z->peak.workspace_bytes, workspace(z));
        for (int i = 0; i < sg->n; i++) {
            size_t lo = sg->off[i], hi = lo + sg->len[i];
            z->model->k->accumulate_half(z->g16 + lo, z->model->grads + lo, hi - lo, z->dtype);
            zt_flat_release(z->model->grads, lo, hi);
        }
        return;
    }
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

static zt_status init_half(zt_zero *z) {
    size_t n = z->model->n_padded;
    z->p16 = zt_half_map(n);
    if (z->stage < 2)
        z->g16 = zt_half_map(n);
    else if (posix_memalign((void **)&z->gacc16, 64, (z->part ? z->part : 1) * 2) == 0)
        memset(z->gacc16, 0, z->part * 2);
    z->master_n = z->stage == 0 ? n : z->part;
    z->master_base = z->stage == 0 ? 0 : z->own_lo;
    if (!z->masters_offloaded &&
        posix_memalign((void **)&z->master, 64, (z->master_n ? z->master_n : 1) * sizeof(float)))
        z->master = NULL;
    if (posix_memalign((void **)&z->chunk, 64, ZT_ZERO_CHUNK * sizeof(float)))
        z->chunk = NULL;
    if (!z->p16 || (z->stage < 2 ? !z->g16 : !z->gacc16) || (!z->master && !z->masters_offloaded) ||
        !z->chunk)
        return zt_error(ZT_ERR_NOMEM, "zero: cannot allocate the 16-bit parameters, gradients "
                        "and fp32 master weights");
    return ZT_OK;
}

zt_status zt_zero_init(zt_zero *z, zt_model *m, zt_comm *comm, int stage, size_t bucket_size,
                       size_t persistence_threshold, bool overlap_comm, size_t prefetch_size,
                       zt_dtype dtype, zt_dtype comm_dtype, bool masters_offloaded) {
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->masters_offloaded = masters_offloaded;
    z->comm = comm;
    z->model = m;
    z->rank = comm ? zt_comm_rank(comm) : 0;
    z->world = comm ? zt_comm_world_size(comm) : 1;
    if (z->world > ZT_MAX_WORLD)
        return zt_error(ZT_ERR_UNSUPPORTED, "zero: world size %d is above ZT_MAX_WORLD (%d)",
                        z->world, ZT_MAX_WORLD);
    z->part = m->n_padded / (size_t)z->world;
    z->own_lo = (size_t)z->rank * z->part;
    z->own_hi = z->own_lo + z->part;
    z->bucket_size = bucket_size ? bucket_size : 1;
    ZT_TRY(build_segments(z));
    z->half = dtype != ZT_F32;
    z->dtype = dtype;
    z->comm_dtype = comm_dtype;
    if (z->half)
        ZT_TRY(init_half(z));
    else if (stage >= 2) {
        if (posix_memalign((void **)&z->grad_acc, 64, (z->part ? z->part : 1) * sizeof(float)))
            return zt_error(ZT_ERR_NOMEM, "zero: cannot allocate the gradient partition");
        memset(z->grad_acc, 0, z->part * sizeof(float));
    }
    z->persistent = calloc((size_t)m->n_tensors, sizeof *z->persistent);
    if (!z->persistent)
        return zt_error(ZT_ERR_NOMEM, "zero: out of memory");
    /* In mixed precision every layer's fp32 copy is transient anyway, and the 16-bit parameters of
     * small tensors are not yet kept whole either: the threshold has no effect there (README). */
    for (int t = 0; t < m->n_tensors; t++)
        z->persistent[t] = !z->half && m->tensors[t].numel < persistence_threshold;
    z->prefetched = calloc((size_t)m->n_layer + 1, sizeof *z->prefetched);
    if (!z->prefetched)
        return zt_error(ZT_ERR_NOMEM, "zero: out of memory");
    if (comm && stage >= 2 && overlap_comm) {
        ZT_TRY(start_comm_thread(z));
        z->prefetch = stage == 3 && prefetch_size > 0;
    }
    m->hooks = (zt_model_hooks){z, hook_fetch, z->half ? hook_release_half : hook_release,
                                hook_grads_ready};
    return ZT_OK;
}

void zt_zero_free(zt_zero *z) {
    stop_comm_thread(z);
    zt_offload_destroy(z->off);
    if (z->model)
        z->model->hooks = (zt_model_hooks){0};
    free(z->prefetched);
    free(z->grad_acc);
    if (z->model) {
        zt_half_unmap(z->p16, z->model->n_padded);
        zt_half_unmap(z->g16, z->model->n_padded);
    }
    free(z->gacc16);
    free(z->master);
    free(z->chunk);
    free(z->segments);
    free(z->persistent);
    memset(z, 0, sizeof *z);
}

void zt_zero_release_gathered(zt_zero *z) {
    const zt_model *m = z->model;
    if (z->half) {
        zt_flat_release(m->params, 0, m->n_padded);
        return;
    }
    if (z->stage < 3)
        return;
    for (int t = 0; t < m->n_tensors; t++)
        if (!z->persistent[t])
            release_unowned(z, m->tensors[t].offset, m->tensors[t].offset + m->tensors[t].numel);
}

/* Masters [c, c + len) of the slice widened from their 16-bit parameters h, into memory or,
 * through the staging buffer, into the store. */
static zt_status put_masters(zt_zero *z, size_t c, const uint16_t *h, size_t len) {
    const zt_kernels *k = z->model->k;
    if (z->master) {
        k->from_half(z->master + c, h, len, z->dtype);
        return ZT_OK;
    }
    k->from_half(z->chunk, h, len, z->dtype);
    return zt_offload_write(z->off, ZT_OFFLOAD_MASTER, c, z->chunk, len);
}

/* Stage 3 in mixed precision keeps only its slice of the 16-bit parameters: the slice is rounded
 * from the fp32 weights a chunk at a time and the masters widened from it, so the whole 16-bit
 * model is never resident, nor, when offloaded, the whole slice. */
static zt_status slice_to_half(zt_zero *z) {
    const zt_kernels *k = z->model->k;
    zt_half_release(z->p16, 0, z->own_lo);
    zt_half_release(z->p16, z->own_hi, z->model->n_padded);
    for (size_t c = 0; c < z->part; c += ZT_ZERO_CHUNK) {
        size_t len = min_sz(ZT_ZERO_CHUNK, z->part - c), at = z->own_lo + c;
        uint16_t *h = z->p16 + at;
        k->to_half(h, z->model->params + at, len, z->dtype);
        ZT_TRY(put_masters(z, c, h, len));
        if (z->param_file) {
            ZT_TRY(zt_offload_write(z->off, ZT_OFFLOAD_PARAMS, c, h, len));
            zt_half_release(z->p16, at, at + len);
        }
    }
    return ZT_OK;
}

zt_status zt_zero_after_load(zt_zero *z) {
    zt_model *m = z->model;
    zt_status s = ZT_OK;
    /* As DeepSpeed: the model becomes 16-bit, and the masters are that 16-bit model widened. */
    if (z->half && z->stage == 3) {
        s = slice_to_half(z);
    } else if (z->half) {
        m->k->to_half(z->p16, m->params, m->n_padded, z->dtype);
        for (size_t c = 0; c < z->master_n && s == ZT_OK; c += ZT_ZERO_CHUNK)
            s = put_masters(z, c, z->p16 + z->master_base + c,
                            min_sz(ZT_ZERO_CHUNK, z->master_n - c));
    } else if (z->param_file) {
        s = zt_offload_write(z->off, ZT_OFFLOAD_PARAMS, 0, m->params + z->own_lo, z->part);
    }
    zt_zero_release_gathered(z);
    return s;
}

zt_status zt_zero_gather_all(zt_zero *z) {
    if (!z->half && !gathers(z))
        return ZT_OK;
    return materialise(z, 0, z->model->n_padded);
}

zt_status zt_zero_reduce_gradients(zt_zero *z, float **g, float **p, size_t *count) {
    drain(z);
    ZT_TRY(first_error(z));
    poison(z);
    zt_model *m = z->model;
    if (z->stage < 2)
        note_max(z, &z->peak.grads_bytes, resident(m->grads, 0, m->n_padded));
    if (z->stage == 0 || !z->comm) {
        if (z->comm)
            ZT_TRY(zt_comm_all_reduce(z->comm, m->grads, m->n_padded, ZT_F32, ZT_REDUCE_AVG));
        if (z->stage == 0) {
            *g = m->grads;
            *p = m->params;
            *count = m->n_padded;
            return ZT_OK;
        }
    } else if (z->stage == 1) {
        size_t offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
        pieces(z, 0, m->n_padded, offsets, counts);
        ZT_TRY(zt_comm_reduce_scatter(z->comm, m->grads, m->grads + z->own_lo, m->n_padded,
                                      offsets, counts, ZT_F32, ZT_REDUCE_AVG));
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
        ZT_TRY(zt_comm_all_reduce(z->comm, &s, 1, ZT_F64, ZT_REDUCE_SUM));
    *out = s;
    return ZT_OK;
}

static zt_status after_step_half(zt_zero *z) {
    zt_model *m = z->model;
    if (z->stage >= 2)
        memset(z->gacc16, 0, z->part * 2);
    else
        memset(z->g16, 0, m->n_padded * 2);
    if (z->comm && (z->stage == 1 || z->stage == 2))
        ZT_TRY(half_collective(z, z->p16, HALF_ALL_GATHER));
    note_max(z, &z->peak.params_bytes, (double)zt_half_resident_bytes(z->p16, 0, m->n_padded));
    return ZT_OK;
}

zt_status zt_zero_after_step(zt_zero *z) {
    zt_model *m = z->model;
    if (z->half)
        return after_step_half(z);
    if (z->stage >= 2)
        memset(z->grad_acc, 0, z->part * sizeof(float));
    else
        memset(m->grads, 0, m->n_padded * sizeof(float));
    if (z->stage == 3 && gathers(z)) {
        /* The tensors kept whole take the update of every owner (from this rank's file too). */
        for (int t = 0; t < m->n_tensors; t++)
            if (z->persistent[t])
                ZT_TRY(gather_range(z, m->tensors[t].offset,
                                    m->tensors[t].offset + m->tensors[t].numel));
    } else if (z->comm && z->stage > 0 && z->stage < 3) {
        ZT_TRY(gather_range(z, 0, m->n_padded));
    }
    note_max(z, &z->peak.params_bytes, resident(m->params, 0, m->n_padded));
    return ZT_OK;
}

/* Runs a collective over a 16-bit range through the fp32 gradient buffer, a chunk at a time, so
 * the staging stays small: widen, communicate, round back, let go. `reduce` selects an averaging
 * all-reduce (stage 0) or a reduce-scatter into this rank's piece (stage 1); otherwise it is an
 * all-gather of the owners' pieces (the 16-bit parameters after a step). */
static zt_status half_collective(zt_zero *z, uint16_t *x, int op) {
    const zt_kernels *k = z->model->k;
    float *buf = z->model->grads;
    size_t n = z->model->n_padded, step = (size_t)ZT_ZERO_CHUNK * 16;
    for (size_t lo = 0; lo < n; lo += step) {
        size_t hi = min_sz(lo + step, n), offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
        pieces(z, lo, hi, offsets, counts);
        size_t a = lo + offsets[z->rank], cnt = counts[z->rank];
        zt_status s;
        if (op == HALF_ALL_GATHER) {
            k->from_half(buf + a, x + a, cnt, z->dtype);
            s = zt_comm_all_gather(z->comm, buf + lo, hi - lo, offsets, counts, ZT_F32);
            if (s == ZT_OK)
                k->to_half(x + lo, buf + lo, hi - lo, z->dtype);
        } else {
            k->from_half(buf + lo, x + lo, hi - lo, z->dtype);
            if (op == HALF_ALL_REDUCE) {
                s = zt_comm_all_reduce(z->comm, buf + lo, hi - lo, ZT_F32, ZT_REDUCE_AVG);
                if (s == ZT_OK)
                    k->to_half(x + lo, buf + lo, hi - lo, z->dtype);
            } else {
                s = zt_comm_reduce_scatter(z->comm, buf + lo, buf + a, hi - lo, offsets, counts,
                                           ZT_F32, ZT_REDUCE_AVG);
                if (s == ZT_OK)
                    k->to_half(x + a, buf + a, cnt, z->dtype);
            }
        }
        zt_flat_release(buf, lo, hi);
        ZT_TRY(s);
    }
    return ZT_OK;
}

/* Fault injection for tests: one non-finite value in this rank's local gradients, before they
 * are combined, as an overflow in one rank's backward would leave it. */
static void poison(zt_zero *z) {
    if (!z->poison_next)
        return;
    z->poison_next = false;
    float nan = __builtin_nanf("");
    if (z->half)
        z->model->k->to_half(z->stage >= 2 ? z->gacc16 : z->g16 + z->own_lo, &nan, 1, z->dtype);
    else
        *(z->stage >= 2 ? z->grad_acc : z->model->grads + z->own_lo) = nan;
}

zt_status zt_zero_reduce_gradients_half(zt_zero *z, uint16_t **g, size_t *count) {
    drain(z);
    ZT_TRY(first_error(z));
    poison(z);
    if (z->stage < 2)
        note_max(z, &z->peak.grads_bytes, (double)zt_half_resident_bytes(z->g16, 0, z->model->n_padded));
    if (z->comm && z->stage == 0)
        ZT_TRY(half_collective(z, z->g16, HALF_ALL_REDUCE));
    else if (z->comm && z->stage == 1)
        ZT_TRY(half_collective(z, z->g16, HALF_REDUCE_SCATTER));
    *g = z->stage >= 2 ? z->gacc16 : z->g16 + z->master_base;
    *count = z->master_n;
    return ZT_OK;
}

zt_status zt_zero_norm_squared_half(zt_zero *z, const uint16_t *g, size_t count, double *out) {
    double s = z->model->k->sum_squares_half(g, count, z->dtype);
    if (z->stage >= 1 && z->comm)
        ZT_TRY(zt_comm_all_reduce(z->comm, &s, 1, ZT_F64, ZT_REDUCE_SUM));
    *out = s;
    return ZT_OK;
}

/* The mixed-precision update of n elements whose masters, state and 16-bit parameters are at
 * the given addresses. Adam takes one fused pass (the kernel threads it). SGD, and a backend
 * without the fused kernel, stream it through the staging buffer in four passes, with the same
 * bits. */
static void update_half_range(zt_zero *z, zt_optimizer *o, float *master, const uint16_t *g,
                              float *m, float *v, uint16_t *p16, size_t n, float grad_mul,
                              double lr, double momentum) {
    const zt_kernels *k = z->model->k;
    if (zt_optimizer_update_mixed_with(o, master, g, z->dtype, grad_mul, m, v, p16, z->dtype, n,
                                       lr, momentum))
        return;
    for (size_t c = 0; c < n; c += ZT_ZERO_CHUNK) {
        size_t len = min_sz(ZT_ZERO_CHUNK, n - c);
        k->from_half(z->chunk, g + c, len, z->dtype);
        k->scale(z->chunk, len, grad_mul);
        zt_optimizer_update_with(o, master + c, z->chunk, m ? m + c : NULL, v ? v + c : NULL, len,
                                 lr, momentum);
        k->to_half(p16 + c, master + c, len, z->dtype);
    }
}

typedef struct {
    zt_zero *z;
    zt_optimizer *o;
    const void *g;
    float grad_mul;
    double lr, momentum;
} update_ctx;

static void update_tile_half(void *arg, const zt_offload_tile *t) {
    update_ctx *c = arg;
    update_half_range(c->z, c->o, t->p[ZT_OFFLOAD_MASTER], (const uint16_t *)c->g + t->first,
                      t->p[ZT_OFFLOAD_EXP_AVG], t->p[ZT_OFFLOAD_EXP_AVG_SQ],
                      t->p[ZT_OFFLOAD_PARAMS], t->count, c->grad_mul, c->lr, c->momentum);
}

static void update_tile(void *arg, const zt_offload_tile *t) {
    update_ctx *c = arg;
    zt_optimizer_update_with(c->o, t->p[ZT_OFFLOAD_PARAMS], (const float *)c->g + t->first,
                             t->p[ZT_OFFLOAD_EXP_AVG], t->p[ZT_OFFLOAD_EXP_AVG_SQ], t->count,
                             c->lr, c->momentum);
}

zt_status zt_zero_agree(zt_zero *z, zt_status mine, const char *what) {
    if (!z->comm)
        return mine;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zt_last_error());
    double failed = mine != ZT_OK ? (double)z->rank + 1.0 : 0.0;
    zt_status s = zt_comm_all_reduce(z->comm, &failed, 1, ZT_F64, ZT_REDUCE_MAX);
    if (mine != ZT_OK)
        return zt_error(mine, "%s", msg);
    ZT_TRY(s);
    if (failed > 0.0)
        return zt_error(ZT_ERR_IO, "rank %d could not %s (its own message says why)",
                        (int)failed - 1, what);
    return ZT_OK;
}

/* After an offloaded update every rank learns whether any rank's failed, so that no rank goes on
 * to publish (all-gather) parameters while another stops. */
static zt_status agree_on_update(zt_zero *z, zt_status mine) {
    return zt_zero_agree(z, mine, "update its offloaded state; no rank applies this update");
}

zt_status zt_zero_update_half(zt_zero *z, zt_optimizer *o, const uint16_t *g, size_t count,
                              float grad_mul, double lr, double momentum) {
    if (!z->off) {
        update_half_range(z, o, z->master, g, o->m, o->v, z->p16 + z->master_base, count,
                          grad_mul, lr, momentum);
        return ZT_OK;
    }
    update_ctx c = {z, o, g, grad_mul, lr, momentum};
    return agree_on_update(z, zt_offload_step(z->off, update_tile_half, &c));
}

zt_status zt_zero_update(zt_zero *z, zt_optimizer *o, float *p, const float *g, size_t count,
                         double lr, double momentum) {
    if (!z->off) {
        zt_optimizer_update(o, p, g, 0, count, lr, momentum);
        return ZT_OK;
    }
    update_ctx c = {z, o, g, 1.0f, lr, momentum};
    return agree_on_update(z, zt_offload_step(z->off, update_tile, &c));
}

/* ---- offload ------------------------------------------------------------------------------- */

zt_status zt_zero_init_offload(zt_zero *z, const zt_zero_config *cfg, zt_optimizer *o,
                               const char *job_name) {
    const zt_offload_device od = cfg->offload_optimizer.device;
    bool param_nvme = z->stage == 3 && cfg->offload_param.device == ZT_OFFLOAD_NVME;
    if (od == ZT_OFFLOAD_NONE && !param_nvme)
        return ZT_OK;
    ZT_ASSERT((od != ZT_OFFLOAD_NONE) == z->masters_offloaded);
    ZT_ASSERT(!o || o->external == z->masters_offloaded);
    zt_model *m = z->model;
    size_t base = z->stage == 0 ? 0 : z->own_lo;
    zt_offload_spec spec = {
        .rank = z->rank,
        .job_name = job_name,
        .n = z->stage == 0 ? m->n_padded : z->part,
        .optimizer = &cfg->offload_optimizer,
        .param = &cfg->offload_param,
        .sub_group_size = cfg->sub_group_size,
    };
    ZT_ASSERT(!o || o->n == spec.n);
    /* Where offload_optimizer puts the masters and moments; without it they stay where they are. */
    zt_offload_place state = od == ZT_OFFLOAD_NVME ? ZT_PLACE_FILE
                             : od == ZT_OFFLOAD_CPU ? ZT_PLACE_HOST : ZT_PLACE_MEMORY;
    spec.streams[ZT_OFFLOAD_PARAMS] = (zt_offload_stream_spec){
        param_nvme ? ZT_PLACE_FILE : ZT_PLACE_MEMORY, z->half ? "params16" : "params",
        z->half ? 2 : 4, z->half ? (void *)(z->p16 + base) : (void *)(m->params + base), z->half};
    if (z->half)
        spec.streams[ZT_OFFLOAD_MASTER] =
            (zt_offload_stream_spec){state, "fp32_master", 4, z->master, false};
    int n_state = o ? zt_optimizer_state_count(&o->cfg) : 0;
    bool adam = o && o->cfg.type == ZT_OPTIM_ADAM;
    if (n_state >= 1)
        spec.streams[ZT_OFFLOAD_EXP_AVG] = (zt_offload_stream_spec){
            state, adam ? "exp_avg" : "momentum_buffer", 4, o->m, false};
    if (n_state >= 2)
        spec.streams[ZT_OFFLOAD_EXP_AVG_SQ] =
            (zt_offload_stream_spec){state, "exp_avg_sq", 4, o->v, false};
    ZT_TRY(zt_offload_create(&z->off, &spec));
    z->param_file = param_nvme;
    return ZT_OK;
}

bool zt_zero_has_state(const zt_zero *z, const zt_optimizer *o, int stream) {
    if (stream == ZT_OFFLOAD_MASTER)
        return z->half;
    int n_state = o ? zt_optimizer_state_count(&o->cfg) : 0;
    return stream == ZT_OFFLOAD_EXP_AVG ? n_state >= 1 : n_state >= 2;
}

zt_status zt_zero_state_copy(zt_zero *z, zt_optimizer *o, int stream, bool write, size_t first,
                             float *data, size_t count) {
    ZT_ASSERT(zt_zero_has_state(z, o, stream) && stream != ZT_OFFLOAD_PARAMS);
    if (z->off && zt_offload_has(z->off, stream))
        return write ? zt_offload_write(z->off, stream, first, data, count)
                     : zt_offload_read(z->off, stream, first, data, count);
    float *mem = stream == ZT_OFFLOAD_MASTER     ? z->master
                 : stream == ZT_OFFLOAD_EXP_AVG ? o->m
                                                : o->v;
    ZT_ASSERT(mem && first + count <= o->n);
    if (write)
        memcpy(mem + first, data, count * sizeof(float));
    else
        memcpy(data, mem + first, count * sizeof(float));
    return ZT_OK;
}

zt_engine_memory zt_zero_take_memory(zt_zero *z, size_t optimizer_bytes) {
    zt_model *m = z->model;
    zt_engine_memory out = z->peak;
    out.optimizer_bytes = (double)optimizer_bytes;
    if (z->off) {
        /* What the store holds in memory: host state and the buffers the files stream through. */
        for (int i = ZT_OFFLOAD_MASTER; i < ZT_OFFLOAD_STREAMS; i++)
            out.optimizer_bytes += zt_offload_resident_bytes(z->off, i);
        out.params_bytes += zt_offload_resident_bytes(z->off, ZT_OFFLOAD_PARAMS);
    }
    if (z->half) {
        if (z->master)
            out.optimizer_bytes += (double)z->master_n * sizeof(float);
        if (z->stage >= 2)
            out.grads_bytes = (double)z->part * 2;
        z->peak.params_bytes = (double)zt_half_resident_bytes(z->p16, 0, m->n_padded);
        z->peak.grads_bytes = 0;
        z->peak.workspace_bytes = 0;
        return out;
    }
    if (z->stage >= 2 && out.grads_bytes < (double)z->part * sizeof(float))
        out.grads_bytes = (double)z->part * sizeof(float);
    z->peak.params_bytes = resident(m->params, 0, m->n_padded);
    z->peak.grads_bytes = resident(m->grads, 0, m->n_padded) +
                          (z->stage >= 2 ? (double)z->part * sizeof(float) : 0.0);
    return out;
}

zt_status zt_zero_status(zt_zero *z) { return first_error(z); }
