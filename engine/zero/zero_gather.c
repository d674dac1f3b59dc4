/* ZeRO's parameter gathering: bringing a range of the parameters into the model's fp32 working
 * copy before it is used (all-gathered from the owners at stage 3, read from this rank's offload
 * file, widened from 16 bits in mixed precision), and letting go of it afterwards, through the
 * model's fetch and release hooks; and the same for checkpoints, which save and load a rank's
 * own slice and gather a layer at a time. */
#include <stdlib.h>

#include "zero_internal.h"

/* Reads this rank's piece [a, a + n) of its offloaded parameters: into the fp32 working copy,
 * or in mixed precision into the 16-bit parameters (committed by the caller), which the caller
 * widens. */
static zt_status load_owned(zt_zero *z, size_t a, size_t n) {
    void *dst = z->half ? (void *)(z->p16 + a) : (void *)(z->model->params + a);
    return zt_offload_read_device(z->off, ZT_OFFLOAD_PARAMS, a - z->own_lo, dst, n,
                                  zt_zero_job_ctx(z)->stream);
}

/* Mixed precision: [lo, hi) of the fp32 working copy, the 16-bit parameters widened. */
static zt_status widen(zt_zero *z, size_t lo, size_t hi) {
    ZT_TRY(zt_zero_commit_f32(z, z->model->params, lo, hi));
    z->be->ops->from_half(zt_zero_job_ctx(z), z->model->params + lo, z->p16 + lo, hi - lo,
                          z->dtype);
    return ZT_OK;
}

/* Whether a step's fetches fill the fp32 working copy. Not in mixed precision on a backend whose
 * ops read every parameter's 16-bit twin (backend.h, reads_param16): the copy would be the twin
 * widened, which nothing in the step reads, so it stays released (no commit, no widening pass,
 * no memory). A gather for readers outside the ops (checkpoints, exports: zt_zero_gather_layer,
 * zt_zero_gather_all) fills it all the same. */
static bool step_widens(const zt_zero *z) { return !z->half || !z->be->reads_param16; }

/* Mixed precision: [lo, hi) of the 16-bit parameters from their owners, 16 bits on the wire as
 * DeepSpeed's stage 3 sends them, then (with `fill`) widened into the fp32 working copy, so the
 * model's 16-bit twin (zt_zero.twin) holds the range as long as the fp32 copy does. */
static zt_status gather_half(zt_zero *z, size_t lo, size_t hi, const size_t *offsets,
                             const size_t *counts, bool fill) {
    ZT_TRY(zt_backend_commit(z->be, z->p16, lo * 2, hi * 2));
    size_t a = lo + offsets[z->rank], n = counts[z->rank];
    if (n && z->param_file)
        ZT_TRY(load_owned(z, a, n));
    if (z->comm)
        ZT_TRY(zt_comm_dev_all_gather(z->comm, z->p16 + lo, hi - lo, offsets, counts, z->dtype));
    return fill ? widen(z, lo, hi) : ZT_OK;
}

/* Gathers [lo, hi) of the parameters from their owners (offloaded pieces are read from the file
 * first; mixed precision gathers the 16-bit parameters, and with `fill` widens them). */
static zt_status gather_range(zt_zero *z, size_t lo, size_t hi, bool fill) {
    size_t offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
    zt_zero_pieces(z, lo, hi, offsets, counts);
    float *p = z->model->params;
    if (z->half)
        return gather_half(z, lo, hi, offsets, counts, fill);
    ZT_TRY(zt_zero_commit_f32(z, p, lo, hi));
    size_t a = lo + offsets[z->rank], n = counts[z->rank];
    if (n && z->param_file)
        ZT_TRY(load_owned(z, a, n));
    if (!z->comm)
        return ZT_OK;
    return zt_comm_dev_all_gather(z->comm, p + lo, hi - lo, offsets, counts, ZT_F32);
}

zt_status zt_zero_gather_range(zt_zero *z, size_t lo, size_t hi) {
    return gather_range(z, lo, hi, step_widens(z));
}

/* Stage 3 brings layers in as they are used: gathered from their owners, or read from this
 * rank's file. */
bool zt_zero_gathers(const zt_zero *z) { return z->stage == 3 && (z->comm || z->param_file); }

/* Brings [lo, hi) of the parameters into place for the model: gathered from their owners at
 * stage 3, and in mixed precision (with `fill`) widened into the fp32 working copy. */
static zt_status materialise(zt_zero *z, size_t lo, size_t hi, bool fill) {
    if (zt_zero_gathers(z))
        return gather_range(z, lo, hi, fill);
    return z->half && fill ? widen(z, lo, hi) : ZT_OK;
}

double zt_zero_workspace(zt_zero *z) {
    const zt_model *m = z->model;
    double bytes = zt_zero_resident_f32(z, m->params, 0, m->n_padded) +
                   zt_zero_resident_f32(z, m->grads, 0, m->n_padded);
    /* Stage 3 in mixed precision: the 16-bit parameters gathered beside this rank's slice. */
    if (z->half && zt_zero_gathers(z))
        bytes += zt_zero_resident_u16(z, z->p16, 0, m->n_padded) -
                 (z->param_file ? 0.0 : zt_zero_resident_u16(z, z->p16, z->own_lo, z->own_hi));
    return bytes;
}

/* Lets go of [lo, hi) of the parameters outside this rank's slice (all of it when the slice
 * itself lives in a file). */
static void release_unowned(zt_zero *z, size_t lo, size_t hi) {
    if (z->param_file) {
        zt_zero_release_f32(z, z->model->params, lo, hi);
        return;
    }
    zt_zero_release_f32(z, z->model->params, lo, zt_min_sz(hi, z->own_lo));
    zt_zero_release_f32(z, z->model->params, zt_max_sz(lo, z->own_hi), hi);
}

/* The next run at or after tensor *t of what a step gathers of a layer: its tensors back to
 * back, but for those kept whole, which come from `kept` (restore_kept). False past the last. */
static bool next_run(const zt_zero *z, int layer, int *t, size_t *lo, size_t *hi) {
    const zt_model *m = z->model;
    while (*t < m->n_tensors && (m->tensors[*t].layer != layer || z->persistent[*t]))
        (*t)++;
    if (*t == m->n_tensors)
        return false;
    *lo = *hi = m->tensors[*t].offset;
    for (; *t < m->n_tensors; (*t)++) {
        const zt_tensor_info *ti = &m->tensors[*t];
        if (ti->layer != layer || z->persistent[*t] || ti->offset != *hi)
            break;
        *hi += ti->numel;
    }
    return true;
}

/* What a gather of [lo, hi) writes, made usable (committed) by the training thread before the
 * job is queued: a commit zero-fills on the compute stream, and from here that lands before the
 * event the job waits for, right behind the layer being fetched now. From the communication
 * thread it would land wherever the training thread had got to, and the gather, which waits for
 * the zero-fill, would wait for all the compute issued before it too. */
static zt_status commit_gathered(zt_zero *z, size_t lo, size_t hi) {
    if (z->half) {
        ZT_TRY(zt_backend_commit(z->be, z->p16, lo * 2, hi * 2));
        return step_widens(z) ? zt_zero_commit_f32(z, z->model->params, lo, hi) : ZT_OK;
    }
    return zt_zero_commit_f32(z, z->model->params, lo, hi);
}

static void queue_gather(zt_zero *z, int layer) {
    uint64_t seq = 0;
    size_t lo, hi;
    for (int t = 0; next_run(z, layer, &t, &lo, &hi);) {
        zt_status s = commit_gathered(z, lo, hi);
        if (s != ZT_OK) {
            zt_zero_fail(z, s);
            return;
        }
        seq = zt_zero_submit(z, (zt_zero_job){ZT_ZERO_GATHER, lo, hi});
    }
    z->prefetched[layer + 1] = seq;
}

/* The layer's tensors kept whole, from `kept` into the flat buffer for the step to read. */
static zt_status restore_kept(zt_zero *z, int layer) {
    const zt_model *m = z->model;
    for (int t = 0; t < m->n_tensors && z->kept; t++) {
        const zt_tensor_info *ti = &m->tensors[t];
        if (ti->layer != layer || !z->persistent[t])
            continue;
        ZT_TRY(zt_zero_commit_f32(z, m->params, ti->offset, ti->offset + ti->numel));
        zt_backend_copy(z->be, m->params + ti->offset, z->kept + z->kept_at[t],
                        ti->numel * sizeof(float), ZT_COPY_D2D, ZT_STREAM_COMPUTE);
    }
    return ZT_OK;
}

/* The backward is about to accumulate the layer's gradients into ranges that an earlier reduction
 * may have released: the fp32 gradients, or the 16-bit ones where it writes those
 * (zt_zero.grads16; below stage 2 they are held whole). */
static zt_status commit_grads(zt_zero *z, int layer) {
    if (z->grads16 && z->stage < 2)
        return ZT_OK;
    const zt_zero_segment *sg = zt_zero_segment_of(z, layer);
    zt_status s = ZT_OK;
    for (int i = 0; i < sg->n && s == ZT_OK; i++) {
        size_t lo = sg->off[i], hi = lo + sg->len[i];
        s = z->grads16 ? zt_backend_commit(z->be, z->g16, lo * 2, hi * 2)
                       : zt_zero_commit_f32(z, z->model->grads, lo, hi);
    }
    if (s != ZT_OK)
        zt_zero_fail(z, s);
    return s;
}

void zt_zero_hook_grads_write(void *ctx, int layer) { commit_grads(ctx, layer); }

void zt_zero_hook_fetch(void *ctx, int layer, bool backward) {
    zt_zero *z = ctx;
    /* A block's gradients are committed as its backward fetches it; the outer tensors', which
     * the head's backward writes before any fetch, by zt_zero_hook_grads_write. */
    if (backward && layer >= 0 && commit_grads(z, layer) != ZT_OK)
        return;
    if (!(z->half || zt_zero_gathers(z)) || zt_zero_first_error(z) != ZT_OK)
        return;
    if (z->half && !step_widens(z) && !zt_zero_gathers(z)) {
        /* Nothing to bring in: the ops read the 16-bit parameters, whole on this rank. No wait
         * for the queue either, so the reductions in flight keep overlapping the backward. */
        zt_zero_note_max(z, &z->peak.workspace_bytes, zt_zero_workspace(z));
        return;
    }
    if (z->prefetched[layer + 1]) {
        zt_zero_wait_for(z, z->prefetched[layer + 1]);
        z->prefetched[layer + 1] = 0;
    } else {
        /* Not prefetched: bring it in now, in order after whatever is queued. */
        zt_zero_drain(z);
        size_t lo, hi;
        for (int t = 0; next_run(z, layer, &t, &lo, &hi);) {
            zt_status s = materialise(z, lo, hi, step_widens(z));
            if (s != ZT_OK) {
                zt_zero_fail(z, s);
                return;
            }
        }
    }
    if (zt_zero_gathers(z)) {
        zt_status s = restore_kept(z, layer);
        if (s != ZT_OK) {
            zt_zero_fail(z, s);
            return;
        }
    }
    int next = backward ? layer - 1 : layer + 1;
    if (z->prefetch && next >= 0 && next < z->model->n_layer)
        queue_gather(z, next);
    if (z->half)
        zt_zero_note_max(z, &z->peak.workspace_bytes, zt_zero_workspace(z));
    else
        zt_zero_note_max(z, &z->peak.params_bytes,
                         zt_zero_resident_f32(z, z->model->params, 0, z->model->n_padded));
}

void zt_zero_hook_release(void *ctx, int layer) {
    zt_zero *z = ctx;
    if (z->stage < 3)
        return;
    /* The end of a pass: nothing may still be in flight when the caller talks to the
     * communicator itself. */
    if (layer < 0)
        zt_zero_drain(z);
    /* The tensors kept whole go too: their values stay in `kept`. */
    const zt_zero_segment *sg = zt_zero_segment_of(z, layer);
    for (int i = 0; i < sg->n; i++)
        release_unowned(z, sg->off[i], sg->off[i] + sg->len[i]);
}

/* Mixed precision at stage 3: the 16-bit parameters of [lo, hi) that a gather brought in
 * (everything outside this rank's slice, and the slice itself when it lives in a file). */
static void release_gathered_half(zt_zero *z, size_t lo, size_t hi) {
    if (!zt_zero_gathers(z))
        return;
    if (z->param_file) {
        zt_zero_release_u16(z, z->p16, lo, hi);
        return;
    }
    zt_zero_release_u16(z, z->p16, lo, zt_min_sz(hi, z->own_lo));
    zt_zero_release_u16(z, z->p16, zt_max_sz(lo, z->own_hi), hi);
}

/* Mixed precision: the fp32 working copy of a layer goes once the layer is done, and at stage 3
 * the 16-bit parameters it gathered with it. */
void zt_zero_hook_release_half(void *ctx, int layer) {
    zt_zero *z = ctx;
    if (layer < 0)
        zt_zero_drain(z);
    const zt_zero_segment *sg = zt_zero_segment_of(z, layer);
    for (int i = 0; i < sg->n; i++) {
        zt_zero_release_f32(z, z->model->params, sg->off[i], sg->off[i] + sg->len[i]);
        release_gathered_half(z, sg->off[i], sg->off[i] + sg->len[i]);
    }
}

void zt_zero_release_gathered(zt_zero *z) {
    const zt_model *m = z->model;
    if (z->half) {
        zt_zero_release_f32(z, m->params, 0, m->n_padded);
        release_gathered_half(z, 0, m->n_padded);
        return;
    }
    if (z->stage == 3)
        release_unowned(z, 0, m->n_padded);
}

zt_status zt_zero_init_kept(zt_zero *z) {
    const zt_model *m = z->model;
    z->kept_at = calloc((size_t)m->n_tensors, sizeof *z->kept_at);
    if (!z->kept_at)
        return zt_error(ZT_ERR_NOMEM, "zero: out of memory");
    for (int t = 0; t < m->n_tensors; t++) {
        z->kept_at[t] = z->kept_n;
        z->kept_n += z->persistent[t] ? m->tensors[t].numel : 0;
    }
    if (!z->kept_n)
        return ZT_OK;
    z->kept = zt_backend_alloc(z->be, ZT_MEM_DEVICE, z->kept_n * sizeof(float));
    if (!z->kept)
        return zt_error(ZT_ERR_NOMEM, "zero: cannot allocate the %zu parameters of the tensors "
                        "kept whole (stage3_param_persistence_threshold) on %s", z->kept_n,
                        z->be->name);
    zt_zero_fill_kept(z);
    return ZT_OK;
}

void zt_zero_fill_kept(zt_zero *z) {
    const zt_model *m = z->model;
    for (int t = 0; t < m->n_tensors && z->kept; t++)
        if (z->persistent[t])
            zt_backend_copy(z->be, z->kept + z->kept_at[t], m->params + m->tensors[t].offset,
                            m->tensors[t].numel * sizeof(float), ZT_COPY_D2D, ZT_STREAM_COMPUTE);
}

/* As DeepSpeed all-gathers its persistent parameters after a step: each owner's piece of a
 * tensor kept whole (from its slice, or its file) into `kept`, then every rank's. */
zt_status zt_zero_gather_kept(zt_zero *z) {
    const zt_model *m = z->model;
    for (int t = 0; t < m->n_tensors && z->kept; t++) {
        if (!z->persistent[t])
            continue;
        const zt_tensor_info *ti = &m->tensors[t];
        size_t offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
        zt_zero_pieces(z, ti->offset, ti->offset + ti->numel, offsets, counts);
        float *k = z->kept + z->kept_at[t];
        size_t at = offsets[z->rank], n = counts[z->rank];
        if (n && z->param_file)
            ZT_TRY(zt_offload_read_device(z->off, ZT_OFFLOAD_PARAMS,
                                          ti->offset + at - z->own_lo, k + at, n,
                                          ZT_STREAM_COMPUTE));
        else if (n)
            zt_backend_copy(z->be, k + at, m->params + ti->offset + at, n * sizeof(float),
                            ZT_COPY_D2D, ZT_STREAM_COMPUTE);
        if (z->comm)
            ZT_TRY(zt_comm_dev_all_gather(z->comm, k, ti->numel, offsets, counts, ZT_F32));
    }
    return ZT_OK;
}

/* The peak of a gather is noted like a layer's, so that what a whole-model gather costs shows in
 * the memory the engine reports. */
static void note_gathered(zt_zero *z) {
    if (z->half)
        zt_zero_note_max(z, &z->peak.workspace_bytes, zt_zero_workspace(z));
    else
        zt_zero_note_max(z, &z->peak.params_bytes,
                         zt_zero_resident_f32(z, z->model->params, 0, z->model->n_padded));
}

zt_status zt_zero_gather_all(zt_zero *z) {
    if (!z->half && !zt_zero_gathers(z))
        return ZT_OK;
    ZT_TRY(materialise(z, 0, z->model->n_padded, true));
    note_gathered(z);
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Checkpoints without gathering the model (zero.h)                                            */

bool zt_zero_params_sharded(const zt_zero *z) { return z->stage == 3; }

zt_status zt_zero_gather_layer(zt_zero *z, int layer) {
    zt_zero_drain(z);
    const zt_zero_segment *sg = zt_zero_segment_of(z, layer);
    for (int i = 0; i < sg->n; i++)
        ZT_TRY(materialise(z, sg->off[i], sg->off[i] + sg->len[i], true));
    note_gathered(z);
    return ZT_OK;
}

void zt_zero_release_layer(zt_zero *z, int layer) {
    if (z->half)
        zt_zero_hook_release_half(z, layer);
    else
        zt_zero_hook_release(z, layer);
}

zt_status zt_zero_read_own(zt_zero *z, size_t first, float *dst, size_t count) {
    ZT_ASSERT(first + count <= z->part);
    float *p = z->model->params;
    for (size_t c = 0; c < count; c += ZT_ZERO_CHUNK) {
        size_t len = zt_min_sz(ZT_ZERO_CHUNK, count - c), at = z->own_lo + first + c;
        const float *from = p + at;
        if (z->param_file && z->half) {
            /* The slice lives in the file: through the 16-bit parameters, let go at once. */
            ZT_TRY(zt_backend_commit(z->be, z->p16, at * 2, (at + len) * 2));
            ZT_TRY(load_owned(z, at, len));
            z->be->ops->from_half(&z->ctx, z->chunk, z->p16 + at, len, z->dtype);
            zt_zero_release_u16(z, z->p16, at, at + len);
            from = z->chunk;
        } else if (z->param_file) {
            /* The slice lives in the file: through the working copy, let go again at once. */
            ZT_TRY(zt_zero_commit_f32(z, p, at, at + len));
            ZT_TRY(load_owned(z, at, len));
        } else if (z->half) {
            z->be->ops->from_half(&z->ctx, z->chunk, z->p16 + at, len, z->dtype);
            from = z->chunk;
        }
        zt_backend_copy(z->be, dst + c, from, len * sizeof(float), ZT_COPY_D2H,
                        ZT_STREAM_COMPUTE);
        if (z->param_file && !z->half)
            zt_zero_release_f32(z, p, at, at + len);
    }
    return ZT_OK;
}

/* Fills [lo, hi) of the fp32 parameters from the reader through a host staging buffer. */
static zt_status fill_range(zt_zero *z, size_t lo, size_t hi, zt_zero_param_reader read,
                            void *ctx, float *staging) {
    if (lo >= hi)
        return ZT_OK; /* a slice of padding only */
    ZT_TRY(zt_zero_commit_f32(z, z->model->params, lo, hi));
    for (size_t c = lo; c < hi; c += ZT_ZERO_CHUNK) {
        size_t len = zt_min_sz(ZT_ZERO_CHUNK, hi - c);
        ZT_TRY(read(ctx, c, staging, len));
        zt_backend_copy(z->be, z->model->params + c, staging, len * sizeof(float), ZT_COPY_H2D,
                        ZT_STREAM_COMPUTE);
    }
    return ZT_OK;
}

zt_status zt_zero_load_params(zt_zero *z, zt_zero_param_reader read, void *ctx) {
    const zt_model *m = z->model;
    size_t bytes = ZT_ZERO_CHUNK * sizeof(float);
    float *staging = zt_backend_alloc(z->be, ZT_MEM_PINNED, bytes);
    if (!staging)
        return zt_error(ZT_ERR_NOMEM, "zero: out of memory for the staging of a parameter load");
    zt_status s = ZT_OK;
    if (!zt_zero_gathers(z)) {
        s = fill_range(z, 0, m->n_params, read, ctx, staging);
    } else {
        /* Only what this rank keeps: its slice, and the tensors kept whole on every rank. */
        s = fill_range(z, z->own_lo, zt_min_sz(z->own_hi, m->n_params), read, ctx, staging);
        for (int t = 0; t < m->n_tensors && s == ZT_OK; t++)
            if (z->persistent[t])
                s = fill_range(z, m->tensors[t].offset, m->tensors[t].offset + m->tensors[t].numel,
                               read, ctx, staging);
    }
    zt_backend_free(z->be, ZT_MEM_PINNED, staging, bytes);
    ZT_TRY(s);
    return zt_zero_after_load(z);
}
