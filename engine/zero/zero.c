/* ZeRO's partition state (see zero.h): which slice of the flat buffers each rank owns, the buffers
 * that hold it (16-bit parameters and gradients, fp32 masters, the gradient accumulator), loading
 * the model into them, the first failure of any ZeRO thread, and the memory a rank holds. The
 * other concepts have files of their own: zero_gather.c, zero_buckets.c, zero_comm_thread.c,
 * zero_optim.c. All memory goes through the model's backend. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero_internal.h"
/* The pieces of [lo, hi) that each rank owns, relative to lo. */
void zt_zero_pieces(const zt_zero *z, size_t lo, size_t hi, size_t *offsets, size_t *counts) {
    for (int r = 0; r < z->world; r++) {
        size_t a = zt_max_sz(lo, (size_t)r * z->part), b = zt_min_sz(hi, (size_t)(r + 1) * z->part);
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
void zt_zero_record(zt_zero *z, zt_status s) {
    if (s == ZT_OK || z->error != ZT_OK)
        return;
    z->error = s;
    snprintf(z->error_msg, sizeof z->error_msg, "%s", zt_last_error());
}

void zt_zero_fail(zt_zero *z, zt_status s) {
    lock(z);
    zt_zero_record(z, s);
    unlock(z);
}

/* The first failure, its message made this thread's zt_last_error. */
zt_status zt_zero_first_error(zt_zero *z) {
    lock(z);
    zt_status s = z->error;
    if (s != ZT_OK)
        zt_error(s, "%s", z->error_msg);
    unlock(z);
    return s;
}

/* Both threads record peaks, so updates go under the lock. */
void zt_zero_note_max(zt_zero *z, double *slot, double v) {
    lock(z);
    if (v > *slot)
        *slot = v;
    unlock(z);
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

/* Device memory of the model's backend, zeroed; NULL when it cannot be had. */
static void *alloc_device(zt_zero *z, size_t bytes) {
    return zt_backend_alloc(z->be, ZT_MEM_DEVICE, bytes);
}

/* The same, written once now so that the memory is taken at the start: for the slice-sized
 * buffers every step fills whole (a rank that cannot hold them fails at once). */
static void *alloc_device_taken(zt_zero *z, size_t bytes) {
    void *p = alloc_device(z, bytes);
    if (p)
        zt_backend_zero(z->be, p, bytes, ZT_STREAM_COMPUTE);
    return p;
}

static void free_device(zt_zero *z, void *p, size_t bytes) {
    zt_backend_free(z->be, ZT_MEM_DEVICE, p, bytes);
}

/* Sizes of the buffers zt_zero_init allocates, for zt_zero_free. */
static size_t p16_bytes(const zt_zero *z) { return z->model->n_padded * 2; }
static size_t gacc16_bytes(const zt_zero *z) { return z->part * 2; }
static size_t grad_acc_bytes(const zt_zero *z) { return z->part * sizeof(float); }
static size_t master_bytes(const zt_zero *z) { return z->master_n * sizeof(float); }
static size_t chunk_bytes(void) { return ZT_ZERO_CHUNK * sizeof(float); }
static size_t staging16_bytes(void) { return 4 * ZT_OPTIMIZER_PIECE16 * sizeof(float); }

/* Mixed precision: the 16-bit parameters rounded from the model's fp32 ones (stage 3: only this
 * rank's slice, the rest let go), so the whole 16-bit model is never resident at stage 3. The
 * slice is committed first: after a load with offload_param it was let go into its file. */
static zt_status round_half(zt_zero *z) {
    const zt_ops *op = z->be->ops;
    size_t lo = z->stage == 3 ? z->own_lo : 0, hi = z->stage == 3 ? z->own_hi : z->model->n_padded;
    zt_zero_release_u16(z, z->p16, 0, lo);
    zt_zero_release_u16(z, z->p16, hi, z->model->n_padded);
    ZT_TRY(zt_backend_commit(z->be, z->p16, lo * 2, hi * 2));
    /* After a load only the tensors' ranges were written (and committed): the padding past them
     * may lie in a granule released at setup, which must read as zero, not another range's. */
    ZT_TRY(zt_zero_commit_f32(z, z->model->params, lo, hi));
    op->to_half(&z->ctx, z->p16 + lo, z->model->params + lo, hi - lo, z->dtype);
    return ZT_OK;
}

/* The 16-bit parameters are made from the fp32 ones first and the whole fp32 copy let go before
 * the gradients, masters and (later, the engine's) optimizer state are allocated: in a step that
 * copy is only a working copy of the layers in use, so holding it whole beside the rest would
 * set the rank's peak at setup. The masters are the 16-bit parameters widened (zt_zero_after_init),
 * as DeepSpeed takes them, so they need nothing of the fp32 copy. */
static zt_status init_half(zt_zero *z) {
    size_t n = z->model->n_padded;
    /* Stage 3 holds only its slice of them (round_half commits it): nothing else is mapped. */
    z->p16 = z->stage == 3 ? zt_backend_alloc_released(z->be, p16_bytes(z))
                           : alloc_device(z, p16_bytes(z));
    if (!z->p16)
        return zt_error(ZT_ERR_NOMEM, "zero: cannot allocate the 16-bit parameters on %s",
                        z->be->name);
    ZT_TRY(round_half(z));
    zt_zero_release_f32(z, z->model->params, 0, n);
    /* The backward's 16-bit gradients: whole below stage 2; from stage 2, where the ops write
     * them (grads16 below), reserved and held a bucket at a time until reduced, as the fp32
     * ones are otherwise. */
    z->grads16 = z->be->writes_grad16 && !z->accum32 &&
                 (z->stage < 2 || z->comm_dtype == z->dtype);
    if (z->stage < 2)
        z->g16 = alloc_device(z, p16_bytes(z));
    else if (z->grads16)
        z->g16 = zt_backend_alloc_released(z->be, p16_bytes(z));
    if (z->stage >= 2)
        z->gacc16 = alloc_device_taken(z, gacc16_bytes(z));
    z->master_n = z->stage == 0 ? n : z->part;
    z->master_base = z->stage == 0 ? 0 : z->own_lo;
    if (!z->masters_offloaded)
        z->master = alloc_device(z, master_bytes(z));
    z->chunk = alloc_device(z, chunk_bytes());
    if ((z->stage < 2 ? !z->g16 : !z->gacc16) || (z->grads16 && !z->g16) ||
        (!z->master && !z->masters_offloaded) ||
        !z->chunk)
        return zt_error(ZT_ERR_NOMEM, "zero: cannot allocate the 16-bit gradients and fp32 "
                        "master weights on %s", z->be->name);
    /* The model's products read the 16-bit parameters instead of rounding its fp32 copy. */
    z->twin = (zt_param16){z->model->params, z->p16, n, z->dtype};
    z->model->ctx.param16 = &z->twin;
    /* The backward accumulates into the 16-bit gradients themselves. */
    if (z->grads16) {
        z->gtwin = (zt_grad16){z->model->grads, z->g16, n, z->dtype};
        z->model->ctx.grad16 = &z->gtwin;
    }
    return ZT_OK;
}

zt_status zt_zero_use_states16(zt_zero *z, const zt_optimizer *o) {
    ZT_ASSERT(z->half && z->stage > 0 && !z->masters_offloaded && (!o || o->external));
    z->states16 = true;
    free_device(z, z->master, master_bytes(z));
    z->master = NULL;
    int n_state = o ? zt_optimizer_state_count(&o->cfg) : 0;
    /* Written once now, as the fp32 state is: a rank that cannot hold it fails at the start. */
    if (n_state >= 1)
        z->m16 = alloc_device_taken(z, gacc16_bytes(z));
    if (n_state >= 2)
        z->v16 = alloc_device_taken(z, gacc16_bytes(z));
    z->staging16 = alloc_device(z, staging16_bytes());
    if ((n_state >= 1 && !z->m16) || (n_state >= 2 && !z->v16) || !z->staging16)
        return zt_error(ZT_ERR_NOMEM, "zero: cannot allocate the bf16 optimizer state on %s",
                        z->be->name);
    return ZT_OK;
}

zt_status zt_zero_init(zt_zero *z, zt_model *m, zt_comm *comm, int stage, size_t bucket_size,
                       size_t persistence_threshold, bool overlap_comm, size_t prefetch_size,
                       zt_dtype dtype, zt_dtype comm_dtype, zt_dtype accum_dtype,
                       bool masters_offloaded) {
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->masters_offloaded = masters_offloaded;
    z->comm = comm;
    z->model = m;
    z->be = m->ctx.be;
    z->ctx = (zt_ctx){.be = m->ctx.be, .act = ZT_F32};
    z->rank = comm ? zt_comm_rank(comm) : 0;
    z->world = comm ? zt_comm_world_size(comm) : 1;
    if (z->world > ZT_MAX_WORLD)
        return zt_error(ZT_ERR_UNSUPPORTED, "zero: world size %d is above %d", z->world,
                        ZT_MAX_WORLD);
    z->part = m->n_padded / (size_t)z->world;
    z->own_lo = (size_t)z->rank * z->part;
    z->own_hi = z->own_lo + z->part;
    z->bucket_size = bucket_size ? bucket_size : 1;
    ZT_TRY(build_segments(z));
    z->half = dtype != ZT_F32;
    z->dtype = dtype;
    z->comm_dtype = comm_dtype;
    ZT_ASSERT(accum_dtype == dtype || (z->half && accum_dtype == ZT_F32 && stage > 0));
    z->accum32 = z->half && accum_dtype == ZT_F32;
    z->persistent = calloc((size_t)m->n_tensors, sizeof *z->persistent);
    if (!z->persistent)
        return zt_error(ZT_ERR_NOMEM, "zero: out of memory");
    /* In mixed precision every layer's fp32 copy is transient anyway, and the 16-bit parameters of
     * small tensors are not yet kept whole either: the threshold has no effect there (README). */
    for (int t = 0; t < m->n_tensors; t++)
        z->persistent[t] = !z->half && m->tensors[t].numel < persistence_threshold;
    /* The model's fp32 gradients start released (zt_model_alloc_flat) and are held only where
     * the backward writes: stages 2 and 3 let each bucket go once reduced, mixed precision each
     * layer once added into its 16-bit gradients, and the backward commits a layer before
     * writing it (zt_zero_hook_fetch); where the ops write 16-bit gradients (grads16) they are
     * never held, and from stage 2 the 16-bit buffer is held and let go that way instead. Stages 0-1 in fp32 (stage 1 with accum32 too) hold them whole (the all-reduce and
     * the step read them whole). The fp32 parameters that a step holds only per layer (mixed
     * precision, once rounded; stage 3, outside the slice) go before the partition's own
     * buffers are allocated, so that on a device that maps memory they take its granules
     * instead of new ones. */
    if (stage < 2 && (!z->half || z->accum32))
        ZT_TRY(zt_zero_commit_f32(z, m->grads, 0, m->n_padded));
    if (z->half)
        ZT_TRY(init_half(z));
    else if (stage == 3) {
        ZT_TRY(zt_zero_init_kept(z));
        zt_zero_release_gathered(z);
    }
    if ((!z->half || z->accum32) && stage >= 2 && !(z->grad_acc = alloc_device_taken(z, grad_acc_bytes(z))))
        return zt_error(ZT_ERR_NOMEM, "zero: cannot allocate the gradient partition on %s",
                        z->be->name);
    z->prefetched = calloc((size_t)m->n_layer + 1, sizeof *z->prefetched);
    if (!z->prefetched)
        return zt_error(ZT_ERR_NOMEM, "zero: out of memory");
    if (comm && stage >= 2 && overlap_comm) {
        ZT_TRY(zt_zero_start_comm_thread(z));
        z->prefetch = stage == 3 && prefetch_size > 0;
    }
    m->hooks = (zt_model_hooks){z, zt_zero_hook_fetch,
                                z->half ? zt_zero_hook_release_half : zt_zero_hook_release,
                                zt_zero_hook_grads_write, zt_zero_hook_grads_ready};
    return ZT_OK;
}

void zt_zero_free(zt_zero *z) {
    zt_zero_stop_comm_thread(z);
    free(z->norm_ranges);
    free(z->norm_weights);
    z->norm_ranges = NULL;
    z->norm_weights = NULL;
    zt_offload_destroy(z->off);
    if (z->host_be) {
        /* Pinned by the device's backend (zero_optim.c): the last tile's upload from a slot may
         * still be queued. A failure there was the step's to report. */
        (void)zt_backend_sync(z->be);
        for (int k = 0; k < ZT_ZERO_TILE_SLOTS; k++) {
            zt_zero_tile_slot *sl = &z->host_slot[k];
            zt_backend_free(z->be, ZT_MEM_PINNED, sl->g, z->host_bytes);
            zt_backend_free(z->be, ZT_MEM_PINNED, sl->p, z->host_bytes);
            if (sl->copied)
                zt_backend_event_destroy(z->be, sl->copied);
        }
        zt_backend_destroy(z->host_be);
    }
    if (z->model) {
        z->model->hooks = (zt_model_hooks){0};
        if (z->model->ctx.param16 == &z->twin)
            z->model->ctx.param16 = NULL;
        if (z->model->ctx.grad16 == &z->gtwin)
            z->model->ctx.grad16 = NULL;
    }
    free(z->prefetched);
    if (z->be) {
        free_device(z, z->grad_acc, grad_acc_bytes(z));
        free_device(z, z->p16, p16_bytes(z));
        free_device(z, z->g16, p16_bytes(z));
        free_device(z, z->gacc16, gacc16_bytes(z));
        free_device(z, z->master, master_bytes(z));
        free_device(z, z->chunk, chunk_bytes());
        free_device(z, z->m16, gacc16_bytes(z));
        free_device(z, z->v16, gacc16_bytes(z));
        free_device(z, z->staging16, staging16_bytes());
        free_device(z, z->kept, z->kept_n * sizeof(float));
    }
    free(z->kept_at);
    free(z->segments);
    free(z->persistent);
    memset(z, 0, sizeof *z);
}

/* Masters [c, c + len) of the slice widened from their 16-bit parameters h, into memory or,
 * through the staging buffer, into the store. */
static zt_status put_masters(zt_zero *z, size_t c, const uint16_t *h, size_t len) {
    const zt_ops *op = z->be->ops;
    if (z->states16)
        return ZT_OK; /* the 16-bit parameters are the masters */
    if (z->master) {
        op->from_half(&z->ctx, z->master + c, h, len, z->dtype);
        return ZT_OK;
    }
    op->from_half(&z->ctx, z->chunk, h, len, z->dtype);
    return zt_offload_write_device(z->off, ZT_OFFLOAD_MASTER, c, z->chunk, len,
                                   ZT_STREAM_COMPUTE);
}

/* Mixed precision: the masters of the slice widened from the 16-bit parameters, and with
 * offload_param the slice written to its file and let go, a chunk at a time, so that neither the
 * whole 16-bit model (stage 3) nor, when offloaded, the whole slice is ever resident. */
static zt_status take_half(zt_zero *z) {
    zt_status s = ZT_OK;
    for (size_t c = 0; c < z->master_n && s == ZT_OK; c += ZT_ZERO_CHUNK) {
        size_t len = zt_min_sz(ZT_ZERO_CHUNK, z->master_n - c), at = z->master_base + c;
        s = put_masters(z, c, z->p16 + at, len);
        if (s == ZT_OK && z->stage == 3 && z->param_file) {
            s = zt_offload_write_device(z->off, ZT_OFFLOAD_PARAMS, c, z->p16 + at, len,
                                        ZT_STREAM_COMPUTE);
            zt_zero_release_u16(z, z->p16, at, at + len);
        }
    }
    return s;
}

zt_status zt_zero_after_init(zt_zero *z) {
    zt_model *m = z->model;
    zt_status s = ZT_OK;
    if (z->half)
        s = take_half(z);
    else if (z->param_file)
        s = zt_offload_write_device(z->off, ZT_OFFLOAD_PARAMS, 0, m->params + z->own_lo,
                                     z->part, ZT_STREAM_COMPUTE);
    zt_zero_release_gathered(z);
    return s;
}

zt_status zt_zero_after_load(zt_zero *z) {
    /* As DeepSpeed: the model becomes 16-bit, and the masters are that 16-bit model widened. */
    if (z->half)
        ZT_TRY(round_half(z));
    zt_zero_fill_kept(z);
    return zt_zero_after_init(z);
}

zt_status zt_zero_agree(zt_zero *z, zt_status mine, const char *what) {
    if (!z->comm)
        return mine;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zt_last_error());
    /* The maximum over the ranks of ZT_MAX_WORLD - job_rank picks the lowest failing job rank. */
    double failed = mine != ZT_OK ? (double)(ZT_MAX_WORLD - z->job_rank) : 0.0;
    zt_status s = zt_comm_all_reduce(z->comm, &failed, 1, ZT_F64, ZT_REDUCE_MAX);
    if (mine != ZT_OK)
        return zt_error(mine, "%s", msg);
    ZT_TRY(s);
    if (failed > 0.0)
        return zt_error(ZT_ERR_IO, "rank %d could not %s (its own message says why)",
                        ZT_MAX_WORLD - (int)failed, what);
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
        /* 16-bit state: what its pages hold, measured. */
        if (z->m16)
            out.optimizer_bytes += zt_zero_resident_u16(z, z->m16, 0, z->part);
        if (z->v16)
            out.optimizer_bytes += zt_zero_resident_u16(z, z->v16, 0, z->part);
        /* From stage 2 the slice's accumulator, and the buckets' 16-bit gradients where the
         * backward writes those (noted as they are reduced). */
        if (z->stage >= 2 && out.grads_bytes < (double)z->part * 2)
            out.grads_bytes = (double)z->part * 2;
        z->peak.params_bytes = zt_zero_resident_u16(z, z->p16, 0, m->n_padded);
        z->peak.grads_bytes = 0;
        z->peak.workspace_bytes = 0;
        return out;
    }
    out.params_bytes += (double)z->kept_n * sizeof(float);
    if (z->stage >= 2 && out.grads_bytes < (double)z->part * sizeof(float))
        out.grads_bytes = (double)z->part * sizeof(float);
    z->peak.params_bytes = zt_zero_resident_f32(z, m->params, 0, m->n_padded);
    z->peak.grads_bytes = zt_zero_resident_f32(z, m->grads, 0, m->n_padded) +
                          (z->stage >= 2 ? (double)z->part * sizeof(float) : 0.0);
    return out;
}

zt_status zt_zero_status(zt_zero *z) { return zt_zero_first_error(z); }

