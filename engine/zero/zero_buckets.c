/* ZeRO's gradients: buckets reduce-scattered into this rank's accumulator as the backward makes
 * them ready (stages 2 and 3), the reduction at the accumulation boundary (all-reduce at stage 0,
 * reduce-scatter at stage 1; 16-bit gradients in 16 bits, or through fp32 chunks when
 * communication_data_type says fp32), the global norm, clearing after
 * the step, and the fault injection that makes a rank's gradients non-finite for tests. */
#include <math.h>
#include <stdlib.h>

#include "zero_internal.h"

enum { HALF_ALL_REDUCE, HALF_REDUCE_SCATTER, HALF_ALL_GATHER };
static zt_status half_collective(zt_zero *z, uint16_t *x, int kind);
static void poison(zt_zero *z);

/* Whether gradients travel in 16 bits: mixed precision with a 16-bit communication_data_type
 * (the training type by default). They then go as that type, half the bytes of fp32, as
 * DeepSpeed sends them. A transport that reduces on the host (shm, gloo) widens each rank's
 * values exactly, adds them in fp32 in rank order and rounds once (comm.h), which is what
 * reducing their fp32 copies and rounding the result gave before, bit for bit; NCCL adds in the
 * 16-bit type itself, as DeepSpeed's NCCL path does. */
static bool travels16(const zt_zero *z) { return z->half && z->comm && z->comm_dtype != ZT_F32; }

/* The 16-bit reduce-scatter of [lo, hi) of the fp32 gradient buffer: a chunk at a time, each
 * rounded into z->chunk's bytes (2 ZT_ZERO_CHUNK 16-bit values; the step's conversions, which
 * never run while gradients are reduced), reduce-scattered there, and this rank's piece widened
 * back into the fp32 buffer, where the caller accumulates it. */
static zt_status reduce_scatter16(zt_zero *z, size_t lo, size_t hi) {
    const zt_ops *op = z->be->ops;
    const zt_ctx *x = zt_zero_job_ctx(z);
    float *g = z->model->grads;
    uint16_t *h = (uint16_t *)z->chunk;
    const size_t step = 2 * (size_t)ZT_ZERO_CHUNK;
    for (size_t c = lo; c < hi; c += step) {
        size_t e = zt_min_sz(c + step, hi), offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
        zt_zero_pieces(z, c, e, offsets, counts);
        size_t off = offsets[z->rank], cnt = counts[z->rank];
        op->to_half(x, h, g + c, e - c, z->comm_dtype);
        ZT_TRY(zt_comm_dev_reduce_scatter(z->comm, h, h + off, e - c, offsets, counts,
                                          z->comm_dtype, ZT_REDUCE_AVG));
        if (cnt)
            op->from_half(x, g + c + off, h + off, cnt, z->comm_dtype);
    }
    return ZT_OK;
}

void zt_zero_let_go_reduced(zt_zero *z, size_t lo, size_t hi) {
    if (z->grads16)
        zt_zero_release_u16(z, z->g16, lo, hi);
    else
        zt_zero_release_f32(z, z->model->grads, lo, hi);
}

/* A reduced range is let go at once on the training thread; the communication thread leaves it
 * to the training thread's wait for the job (zt_zero_wait_for), which orders the release, a mark
 * on the compute stream, after the job's work on the communication stream. */
static void let_go(zt_zero *z, size_t lo, size_t hi) {
    if (!zt_zero_on_comm_thread(z))
        zt_zero_let_go_reduced(z, lo, hi);
}

/* The 16-bit gradients the backward wrote in [lo, hi) (zt_zero.grads16) reduce-scattered where
 * they are, in their own type, and this rank's piece added into its accumulator in one pass (the
 * add op in that type: fp32 sums rounded once, as accumulate_half rounds); then the range is let
 * go. The values are those of rounding the fp32 gradients into 16 bits and reducing them
 * (reduce_scatter16), bit for bit, wherever one op writes each gradient. */
static zt_status reduce_range16(zt_zero *z, size_t lo, size_t hi) {
    /* Gradient memory: the buckets' 16-bit gradients held and the slice's accumulator. */
    zt_zero_note_max(z, &z->peak.grads_bytes, zt_zero_resident_u16(z, z->g16, 0,
                                                                    z->model->n_padded) +
                                                  (double)z->part * 2);
    size_t offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
    zt_zero_pieces(z, lo, hi, offsets, counts);
    if (z->comm)
        ZT_TRY(zt_comm_dev_reduce_scatter(z->comm, z->g16 + lo, z->g16 + lo + offsets[z->rank],
                                          hi - lo, offsets, counts, z->dtype, ZT_REDUCE_AVG));
    size_t a = zt_max_sz(lo, z->own_lo), b = zt_min_sz(hi, z->own_hi);
    if (a < b) {
        zt_ctx x16 = *zt_zero_job_ctx(z);
        x16.act = z->dtype;
        uint16_t *acc = z->gacc16 + (a - z->own_lo);
        z->be->ops->add(&x16, acc, acc, z->g16 + a, b - a);
    }
    let_go(z, lo, hi);
    return ZT_OK;
}

/* Reduce-scatters the gradients of [lo, hi) (averaged over ranks) and adds this rank's piece to
 * its accumulator; the whole range of the full-size gradient buffer is then released. */
zt_status zt_zero_reduce_range(zt_zero *z, size_t lo, size_t hi) {
    if (hi <= lo)
        return ZT_OK;
    if (z->grads16)
        return reduce_range16(z, lo, hi);
    float *g = z->model->grads;
    const zt_ops *op = z->be->ops;
    const zt_ctx *x = zt_zero_job_ctx(z);
    if (z->half)
        zt_zero_note_max(z, &z->peak.workspace_bytes, zt_zero_workspace(z));
    else
        zt_zero_note_max(z, &z->peak.grads_bytes, zt_zero_resident_f32(z, g, 0, z->model->n_padded) +
                                                      (double)z->part * sizeof(float));
    size_t offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
    zt_zero_pieces(z, lo, hi, offsets, counts);
    size_t a = zt_max_sz(lo, z->own_lo), b = zt_min_sz(hi, z->own_hi);
    if (travels16(z)) {
        ZT_TRY(reduce_scatter16(z, lo, hi));
    } else {
        /* One rank rounds as the traffic would have; an fp32 communication_data_type adds the
         * fp32 gradients. */
        if (z->half && z->comm_dtype != ZT_F32)
            op->round_to(x, g + lo, hi - lo, z->comm_dtype);
        if (z->comm) {
            size_t off = offsets[z->rank];
            ZT_TRY(zt_comm_dev_reduce_scatter(z->comm, g + lo, g + lo + off, hi - lo, offsets,
                                              counts, ZT_F32, ZT_REDUCE_AVG));
        }
        if (z->half && a < b && z->comm_dtype != ZT_F32)
            op->round_to(x, g + a, b - a, z->comm_dtype);
    }
    if (z->half && !z->accum32) {
        if (a < b)
            op->accumulate_half(x, z->gacc16 + (a - z->own_lo), g + a, b - a, z->dtype);
    } else if (a < b) {
        float *acc = z->grad_acc + (a - z->own_lo);
        op->add(x, acc, acc, g + a, b - a);
    }
    let_go(z, lo, hi);
    return ZT_OK;
}

void zt_zero_hook_grads_ready(void *ctx, int layer) {
    zt_zero *z = ctx;
    if (z->half && z->stage < 2) {
        /* The layer's fp32 gradients go into the 16-bit gradient buffer (rounded to nearest even,
         * accumulating over micro-steps) and the fp32 copy is let go; where the backward wrote
         * the 16-bit gradients itself, or they add up in fp32 (accum32), there is nothing to
         * add. */
        const zt_zero_segment *sg = zt_zero_segment_of(z, layer);
        zt_zero_note_max(z, &z->peak.workspace_bytes, zt_zero_workspace(z));
        if (z->grads16 || z->accum32)
            return;
        for (int i = 0; i < sg->n; i++) {
            size_t lo = sg->off[i], hi = lo + sg->len[i];
            z->be->ops->accumulate_half(&z->ctx, z->g16 + lo, z->model->grads + lo, hi - lo,
                                        z->dtype);
            zt_zero_release_f32(z, z->model->grads, lo, hi);
        }
        return;
    }
    if (z->stage < 2 || zt_zero_first_error(z) != ZT_OK)
        return;
    const zt_zero_segment *sg = zt_zero_segment_of(z, layer);
    zt_status s = ZT_OK;
    if (layer >= 0) {
        /* Blocks become ready from the last to the first, so the pending range grows downward. */
        if (z->pend_hi == z->pend_lo)
            z->pend_hi = sg->off[0] + sg->len[0];
        z->pend_lo = sg->off[0];
        if (z->pend_hi - z->pend_lo >= z->bucket_size) {
            /* At most one bucket in flight while the next fills, so the gradient memory stays
             * bounded by two buckets however slow the communication is. */
            zt_zero_wait_for(z, z->last_reduce);
            z->last_reduce =
                zt_zero_submit(z, (zt_zero_job){ZT_ZERO_REDUCE, z->pend_lo, z->pend_hi});
            z->pend_lo = z->pend_hi = 0;
        }
    } else {
        /* The outer tensors are last: flush what is pending, then them (and the padding), and
         * wait, so the step finds every gradient reduced. */
        zt_zero_drain(z);
        s = zt_zero_reduce_range(z, z->pend_lo, z->pend_hi);
        z->pend_lo = z->pend_hi = 0;
        for (int i = 0; i < sg->n && s == ZT_OK; i++) {
            size_t hi = sg->off[i] + sg->len[i];
            if (hi == z->model->n_params)
                hi = z->model->n_padded;
            s = zt_zero_reduce_range(z, sg->off[i], hi);
        }
    }
    if (s != ZT_OK)
        zt_zero_fail(z, s);
}

zt_status zt_zero_reduce_gradients(zt_zero *z, float **g, float **p, size_t *count) {
    zt_zero_drain(z);
    ZT_TRY(zt_zero_first_error(z));
    poison(z);
    zt_model *m = z->model;
    if (z->stage < 2)
        zt_zero_note_max(z, &z->peak.grads_bytes,
                         zt_zero_resident_f32(z, m->grads, 0, m->n_padded));
    if (z->stage == 0 || !z->comm) {
        if (z->comm)
            ZT_TRY(zt_comm_dev_all_reduce(z->comm, m->grads, m->n_padded, ZT_F32,
                                          ZT_REDUCE_AVG));
        if (z->stage == 0) {
            *g = m->grads;
            *p = m->params;
            *count = m->n_padded;
            return ZT_OK;
        }
    } else if (z->stage == 1) {
        size_t offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
        zt_zero_pieces(z, 0, m->n_padded, offsets, counts);
        ZT_TRY(zt_comm_dev_reduce_scatter(z->comm, m->grads, m->grads + z->own_lo,
                                          m->n_padded, offsets, counts, ZT_F32, ZT_REDUCE_AVG));
    }
    *g = z->stage >= 2 ? z->grad_acc : m->grads + z->own_lo;
    *p = m->params + z->own_lo;
    *count = z->part;
    return ZT_OK;
}

/* The flat-buffer range [lo, hi) of the gradient slice this rank's norm covers, less the range a
 * pipeline stage leaves out: up to two pieces, relative to the slice's start. */
static int norm_pieces(const zt_zero *z, size_t count, size_t *lo, size_t *hi) {
    size_t base = z->stage == 0 ? 0 : z->own_lo, a = zt_max_sz(z->skip_lo, base),
           b = zt_min_sz(z->skip_hi, base + count);
    if (a >= b) {
        lo[0] = 0, hi[0] = count;
        return 1;
    }
    lo[0] = 0, hi[0] = a - base;
    lo[1] = b - base, hi[1] = count;
    return 2;
}

/* The communicators the norm is summed over, in order: the data-parallel ranks' (stage 0 holds
 * the whole reduced gradient on every rank, the others sum their slices), then a pipeline
 * stage's replica or a tensor-parallel group (norm_comm). */
static int norm_comms(const zt_zero *z, zt_comm *out[2]) {
    int n = 0;
    if (z->stage >= 1 && z->comm)
        out[n++] = z->comm;
    if (z->norm_comm)
        out[n++] = z->norm_comm;
    return n;
}

/* How many of them, from the first, reduce device memory themselves (NCCL): those sum the
 * norm's total on the device before the step's read, where a host collective after it would
 * travel through device memory and wait for it. The rest (shm, gloo, a group without a device
 * path, or any behind one) sum it on the host after the read, as before, where that costs the
 * device nothing. The order of the sums is the same either way. */
static int device_sums(const zt_zero *z, zt_comm *const *comms, int n) {
    int k = 0;
    while (k < n && zt_comm_dev_native(comms[k]))
        k++;
    return k;
}

/* The pieces whose sums of squares make up the norm, in the order they are added: the slice less
 * what a pipeline stage leaves out (weight 1), or with tensor parallelism each weighted range of
 * the shard (zt_zero_set_tensor_parallel) that meets the slice. *c starts zeroed; false past
 * the last piece, else [lo, hi) relative to the slice's start and its weight. */
typedef struct {
    int i;
    size_t lo, hi;
    double weight;
} norm_cursor;

static bool next_piece(const zt_zero *z, size_t count, norm_cursor *c) {
    if (!z->norm_ranges) {
        size_t lo[2], hi[2];
        int n = norm_pieces(z, count, lo, hi);
        if (c->i >= n)
            return false;
        c->lo = lo[c->i], c->hi = hi[c->i], c->weight = 1.0;
        c->i++;
        return true;
    }
    const size_t base = z->stage == 0 ? 0 : z->own_lo;
    for (; c->i < z->n_norm_ranges; c->i++) {
        const struct zt_zero_norm_range *r = &z->norm_ranges[c->i];
        size_t a = zt_max_sz(r->lo, base), b = zt_min_sz(r->hi, base + count);
        if (a >= b || r->weight == 0.0)
            continue;
        c->lo = a - base, c->hi = b - base, c->weight = r->weight;
        c->i++;
        return true;
    }
    return false;
}

/* The pieces' slots and one more for their total. */
int zt_zero_norm_parts(const zt_zero *z) {
    return (z->n_norm_ranges > 2 ? z->n_norm_ranges : 2) + 1;
}

zt_status zt_zero_norm_enqueue(zt_zero *z, const float *g, const uint16_t *g16, size_t count,
                               double *parts, int *slots) {
    norm_cursor c = {0};
    int n = 0;
    bool weighted = false;
    while (next_piece(z, count, &c)) {
        if (g)
            z->be->ops->sum_to(&z->ctx, parts + n, g + c.lo, c.hi - c.lo, ZT_F32, true);
        else
            z->be->ops->sum_to(&z->ctx, parts + n, g16 + c.lo, c.hi - c.lo, z->dtype, true);
        if (z->norm_weights)
            z->norm_weights[n] = c.weight;
        weighted = weighted || c.weight != 1.0;
        n++;
    }
    *slots = n;
    zt_comm *comms[2];
    int k = device_sums(z, comms, norm_comms(z, comms));
    if (k == 0)
        return ZT_OK;
    /* The host's combination (zt_zero_norm_combine), where the pieces are, then the sums. */
    ZT_ASSERT(!weighted || z->norm_weights);
    z->be->ops->weighted_sum_to(&z->ctx, parts + n, parts, weighted ? z->norm_weights : NULL, n);
    for (int i = 0; i < k; i++)
        ZT_TRY(zt_comm_dev_all_reduce(comms[i], parts + n, 1, ZT_F64, ZT_REDUCE_SUM));
    *slots = n + 1;
    return ZT_OK;
}

zt_status zt_zero_norm_combine(zt_zero *z, size_t count, const double *parts, double *out) {
    norm_cursor c = {0};
    zt_comm *comms[2];
    int n_comms = norm_comms(z, comms), k = device_sums(z, comms, n_comms), n = 0;
    double s = 0.0;
    /* fma, as weighted_sum_to computes it on the device (and a -march=native build contracted
     * this loop to before): the total is the same bits whichever side adds. A piece of weight
     * 1 is added as it is, the sum each piece's readback used to give, bit for bit. */
    for (; next_piece(z, count, &c); n++)
        s = fma(c.weight, parts[n], s);
    if (k > 0)
        s = parts[n]; /* the total, summed over comms[0, k) on the device */
    for (int i = k; i < n_comms; i++)
        ZT_TRY(zt_comm_all_reduce(comms[i], &s, 1, ZT_F64, ZT_REDUCE_SUM));
    *out = s;
    return ZT_OK;
}

static zt_status after_step_half(zt_zero *z) {
    zt_model *m = z->model;
    if (z->stage >= 2)
        zt_backend_zero(z->be, z->gacc16, z->part * 2, ZT_STREAM_COMPUTE);
    else
        zt_backend_zero(z->be, z->g16, m->n_padded * 2, ZT_STREAM_COMPUTE);
    if (z->comm && (z->stage == 1 || z->stage == 2))
        ZT_TRY(half_collective(z, z->p16, HALF_ALL_GATHER));
    zt_zero_note_max(z, &z->peak.params_bytes, zt_zero_resident_u16(z, z->p16, 0, m->n_padded));
    return ZT_OK;
}

zt_status zt_zero_after_step(zt_zero *z) {
    zt_model *m = z->model;
    if (z->half)
        return after_step_half(z);
    if (z->stage >= 2)
        zt_backend_zero(z->be, z->grad_acc, z->part * sizeof(float), ZT_STREAM_COMPUTE);
    else
        zt_backend_zero(z->be, m->grads, m->n_padded * sizeof(float), ZT_STREAM_COMPUTE);
    if (z->stage == 3 && zt_zero_gathers(z)) {
        /* The tensors kept whole take the update of every owner (from this rank's file too). */
        ZT_TRY(zt_zero_gather_kept(z));
    } else if (z->comm && z->stage > 0 && z->stage < 3) {
        ZT_TRY(zt_zero_gather_range(z, 0, m->n_padded));
    }
    zt_zero_note_max(z, &z->peak.params_bytes,
                     zt_zero_resident_f32(z, m->params, 0, m->n_padded));
    return ZT_OK;
}

/* Runs a collective over a 16-bit range, a chunk at a time, so a staging transport's host
 * buffer stays small: an averaging all-reduce (stage 0), a reduce-scatter into this rank's piece
 * (stage 1), or an all-gather of the owners' pieces (the 16-bit parameters after a step). The
 * all-gather moves the 16-bit values as they are; the reductions do too where gradients travel
 * in 16 bits (travels16) and the type is the gradients' own. Otherwise (an fp32
 * communication_data_type, or one other than the training type) they go through the fp32
 * gradient buffer: widen, communicate, round back, let go. */
static zt_status half_collective(zt_zero *z, uint16_t *x, int kind) {
    const zt_ops *op = z->be->ops;
    float *buf = z->model->grads;
    const zt_dtype t = z->dtype;
    const bool direct = kind == HALF_ALL_GATHER || (travels16(z) && z->comm_dtype == t);
    size_t n = z->model->n_padded, step = (size_t)ZT_ZERO_CHUNK * 16;
    for (size_t lo = 0; lo < n; lo += step) {
        size_t hi = zt_min_sz(lo + step, n), offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
        zt_zero_pieces(z, lo, hi, offsets, counts);
        size_t a = lo + offsets[z->rank], cnt = counts[z->rank];
        if (direct) {
            if (kind == HALF_ALL_GATHER)
                ZT_TRY(zt_comm_dev_all_gather(z->comm, x + lo, hi - lo, offsets, counts, t));
            else if (kind == HALF_ALL_REDUCE)
                ZT_TRY(zt_comm_dev_all_reduce(z->comm, x + lo, hi - lo, t, ZT_REDUCE_AVG));
            else
                ZT_TRY(zt_comm_dev_reduce_scatter(z->comm, x + lo, x + a, hi - lo, offsets,
                                                  counts, t, ZT_REDUCE_AVG));
            continue;
        }
        zt_status s;
        ZT_TRY(zt_zero_commit_f32(z, buf, lo, hi));
        op->from_half(&z->ctx, buf + lo, x + lo, hi - lo, t);
        if (kind == HALF_ALL_REDUCE) {
            s = zt_comm_dev_all_reduce(z->comm, buf + lo, hi - lo, ZT_F32, ZT_REDUCE_AVG);
            if (s == ZT_OK)
                op->to_half(&z->ctx, x + lo, buf + lo, hi - lo, t);
        } else {
            s = zt_comm_dev_reduce_scatter(z->comm, buf + lo, buf + a, hi - lo, offsets, counts,
                                           ZT_F32, ZT_REDUCE_AVG);
            if (s == ZT_OK)
                op->to_half(&z->ctx, x + a, buf + a, cnt, t);
        }
        zt_zero_release_f32(z, buf, lo, hi);
        ZT_TRY(s);
    }
    return ZT_OK;
}

/* Fault injection for tests: one non-finite value in this rank's local gradients, before they
 * are combined, as an overflow in one rank's backward would leave it. The value is a quiet NaN
 * of the gradients' type, written from the host. */
static void poison(zt_zero *z) {
    if (!z->poison_next)
        return;
    z->poison_next = false;
    if (z->half) {
        uint16_t nan16 = z->dtype == ZT_BF16 ? 0x7fc0 : 0x7e00;
        uint16_t *at = z->stage >= 2 ? z->gacc16 : z->g16 + z->own_lo;
        zt_backend_copy(z->be, at, &nan16, sizeof nan16, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    } else {
        float nan = __builtin_nanf("");
        float *at = z->stage >= 2 ? z->grad_acc : z->model->grads + z->own_lo;
        zt_backend_copy(z->be, at, &nan, sizeof nan, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    }
}

/* accum32: the micro-steps' fp32 sum rounded into the 16-bit gradients once (they were zeroed
 * after the last step) and the fp32 sum zeroed for the next step's micro-steps. At stage 1 the
 * sum is the model's gradients, which a reduction through fp32 (half_collective) lets go of
 * after use and the backward commits again only where it writes: committed whole first. */
static zt_status round_accumulated(zt_zero *z) {
    size_t n = z->stage >= 2 ? z->part : z->model->n_padded;
    float *sum = z->stage >= 2 ? z->grad_acc : z->model->grads;
    uint16_t *g16 = z->stage >= 2 ? z->gacc16 : z->g16;
    /* Memory: at stage 1 the sum is the model's fp32 gradients, which the working copy counts
     * (zt_zero_workspace); from stage 2 it is the slice's own buffer, beside its 16-bit one. */
    if (z->stage < 2) {
        ZT_TRY(zt_zero_commit_f32(z, sum, 0, n));
        zt_zero_note_max(z, &z->peak.workspace_bytes, zt_zero_workspace(z));
    } else {
        zt_zero_note_max(z, &z->peak.grads_bytes,
                         (double)n * sizeof(float) + zt_zero_resident_u16(z, g16, 0, n));
    }
    z->be->ops->to_half(&z->ctx, g16, sum, n, z->dtype);
    zt_backend_zero(z->be, sum, n * sizeof(float), ZT_STREAM_COMPUTE);
    return ZT_OK;
}

zt_status zt_zero_reduce_gradients_half(zt_zero *z, uint16_t **g, size_t *count) {
    zt_zero_drain(z);
    ZT_TRY(zt_zero_first_error(z));
    if (z->accum32)
        ZT_TRY(round_accumulated(z));
    poison(z);
    if (z->stage < 2)
        zt_zero_note_max(z, &z->peak.grads_bytes,
                         zt_zero_resident_u16(z, z->g16, 0, z->model->n_padded));
    if (z->comm && z->stage == 0)
        ZT_TRY(half_collective(z, z->g16, HALF_ALL_REDUCE));
    else if (z->comm && z->stage == 1)
        ZT_TRY(half_collective(z, z->g16, HALF_REDUCE_SCATTER));
    *g = z->stage >= 2 ? z->gacc16 : z->g16 + z->master_base;
    *count = z->master_n;
    return ZT_OK;
}

void zt_zero_set_pipeline(zt_zero *z, zt_comm *stage_comm) {
    z->norm_comm = stage_comm;
    z->skip_lo = z->skip_hi = 0;
    const zt_model *m = z->model;
    for (int t = 0; t < m->n_tensors; t++) {
        if (!m->tensors[t].tied_copy)
            continue;
        ZT_ASSERT(z->skip_hi == z->skip_lo); /* one tied tensor per model */
        z->skip_lo = m->tensors[t].offset;
        z->skip_hi = z->skip_lo + m->tensors[t].numel;
    }
}
