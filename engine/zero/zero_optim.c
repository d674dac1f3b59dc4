/* The optimizer over a rank's partition: the update of the slice (fp32, or the fused
 * mixed-precision Adam on fp32 masters with 16-bit outputs), streamed through the offload store
 * when offload_optimizer or offload_param puts the state in host buffers or NVMe files, and
 * copies of that state in and out for checkpoints. */
#include <stdlib.h>
#include <string.h>

#include "zero_internal.h"

/* The mixed-precision update of n elements whose masters, state and 16-bit parameters are at
 * the given addresses. Adam and SGD take one fused pass (the kernel threads it); a backend
 * without the fused kernel streams it through the staging buffer in four passes, with the same
 * bits. */
static void update_half_range(zt_zero *z, zt_optimizer *o, float *master, const uint16_t *g,
                              float *m, float *v, uint16_t *p16, size_t n, float grad_mul,
                              double lr, double momentum) {
    const zt_ops *op = z->be->ops;
    if (zt_optimizer_update_mixed_with(o, master, g, z->dtype, grad_mul, m, v, p16, z->dtype, n,
                                       lr, momentum))
        return;
    for (size_t c = 0; c < n; c += ZT_ZERO_CHUNK) {
        size_t len = zt_min_sz(ZT_ZERO_CHUNK, n - c);
        op->from_half(&z->ctx, z->chunk, g + c, len, z->dtype);
        op->scale(&z->ctx, z->chunk, len, grad_mul);
        zt_optimizer_update_with(o, master + c, z->chunk, m ? m + c : NULL, v ? v + c : NULL, len,
                                 lr, momentum);
        op->to_half(&z->ctx, p16 + c, master + c, len, z->dtype);
    }
}

typedef struct {
    zt_zero *z;
    zt_optimizer *o;
    const void *g;
    float grad_mul;
    double lr, momentum;
    size_t elem; /* bytes of a gradient (and of a parameter): 4, or 2 in mixed precision */
} update_ctx;

/* A tile's parameters in device memory (offload_param keeps them in the store's host buffers
 * instead). */
static bool params_on_device(const zt_zero *z) { return !z->param_file; }

static zt_zero_tile_slot *slot_of(zt_zero *z, const zt_offload_tile *t) {
    size_t i = t->first / zt_offload_tile_elems(z->off);
    return &z->host_slot[i % ZT_ZERO_TILE_SLOTS];
}

/* On a GPU the tiles are staged through pinned host buffers (the copies then run as DMA, CUDA
 * staging nothing), and the optimizer runs on the host backend (the state is host memory). The
 * store tells of each tile one ahead of its update (offload.h), and its copies to the host are
 * issued then: the gradients, and with fp32 parameters kept on the device the parameters too,
 * into the tile's slot, then an event. So while the host updates tile i, tile i + 1's copies
 * run. Reuse of a slot is ordered by the one stream: tile i + 2's copies into tile i's slot are
 * issued after tile i's parameters went back from it (staged_end), so they run after them, and
 * the host writes the slot only after waiting for tile i + 2's event. */
static void stage_ahead(void *arg, const zt_offload_tile *next) {
    update_ctx *c = arg;
    zt_zero *z = c->z;
    zt_zero_tile_slot *sl = slot_of(z, next);
    const void *p = next->p[ZT_OFFLOAD_PARAMS];
    if (c->elem == 4 && params_on_device(z))
        zt_backend_copy(z->be, sl->p, p, next->count * 4, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    zt_backend_copy(z->be, sl->g, (const char *)c->g + next->first * c->elem,
                    next->count * c->elem, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    zt_backend_event_record(z->be, sl->copied, ZT_STREAM_COMPUTE);
}

/* The host waits for the tile's own copies (not the whole device: the next tile's are queued
 * behind them) and computes on what came back. NULL when the device failed, or an earlier tile
 * did (the failure is recorded, and no tile is updated from stale numbers). */
static const void *staged_grads(update_ctx *c, const zt_offload_tile *t) {
    zt_zero *z = c->z;
    if (zt_zero_first_error(z) != ZT_OK)
        return NULL;
    zt_status s = zt_backend_event_wait(z->be, slot_of(z, t)->copied);
    if (s != ZT_OK) {
        zt_zero_fail(z, s);
        return NULL;
    }
    c->o->ctx.be = z->host_be;
    return slot_of(z, t)->g;
}

/* The host's update is in the slot's p; it goes back to the device without a wait (see
 * stage_ahead for when the slot is written again). */
static void staged_end(update_ctx *c, const zt_offload_tile *t) {
    zt_zero *z = c->z;
    c->o->ctx.be = z->be;
    if (params_on_device(z))
        zt_backend_copy(z->be, t->p[ZT_OFFLOAD_PARAMS], slot_of(z, t)->p, t->count * c->elem,
                        ZT_COPY_H2D, ZT_STREAM_COMPUTE);
}

static void update_tile_half(void *arg, const zt_offload_tile *t) {
    update_ctx *c = arg;
    zt_zero *z = c->z;
    const uint16_t *g = (const uint16_t *)c->g + t->first;
    uint16_t *p16 = t->p[ZT_OFFLOAD_PARAMS];
    if (z->host_be) {
        if (!(g = staged_grads(c, t)))
            return;
        if (params_on_device(z))
            p16 = slot_of(z, t)->p;
    }
    update_half_range(z, c->o, t->p[ZT_OFFLOAD_MASTER], g, t->p[ZT_OFFLOAD_EXP_AVG],
                      t->p[ZT_OFFLOAD_EXP_AVG_SQ], p16, t->count, c->grad_mul, c->lr,
                      c->momentum);
    if (z->host_be)
        staged_end(c, t);
}

static void update_tile(void *arg, const zt_offload_tile *t) {
    update_ctx *c = arg;
    zt_zero *z = c->z;
    const float *g = (const float *)c->g + t->first;
    float *p = t->p[ZT_OFFLOAD_PARAMS];
    if (z->host_be) {
        if (!(g = staged_grads(c, t)))
            return;
        if (params_on_device(z))
            p = slot_of(z, t)->p;
    }
    zt_optimizer_update_with(c->o, p, g, t->p[ZT_OFFLOAD_EXP_AVG], t->p[ZT_OFFLOAD_EXP_AVG_SQ],
                             t->count, c->lr, c->momentum);
    if (z->host_be)
        staged_end(c, t);
}

/* The host side of the offloaded update on a GPU: a CPU backend and ZT_ZERO_TILE_SLOTS sets of
 * two tile-sized host buffers and an event. Its mixed-precision update needs the fused Adam
 * kernel (the other path converts on the device), so SGD with 16-bit parameters is refused
 * there. */
static zt_status stage_offload(zt_zero *z, const zt_optimizer *o) {
    const char *forced = getenv("ZTRAIN_OFFLOAD_STAGED");
    if (z->be->device == ZT_DEVICE_CPU && !(forced && strcmp(forced, "1") == 0))
        return ZT_OK;
    if (z->half && o && o->cfg.type != ZT_OPTIM_ADAM)
        return zt_error(ZT_ERR_INVALID, "zero_optimization.offload_optimizer on device \"%s\": "
                        "only Adam/AdamW with bf16/fp16 (SGD in 16 bits is not staged)",
                        z->be->name);
    ZT_TRY(zt_backend_create(&z->host_be, ZT_DEVICE_CPU, NULL));
    z->host_bytes = zt_offload_tile_elems(z->off) * sizeof(float);
    for (int k = 0; k < ZT_ZERO_TILE_SLOTS; k++) {
        zt_zero_tile_slot *sl = &z->host_slot[k];
        sl->g = zt_backend_alloc(z->be, ZT_MEM_PINNED, z->host_bytes);
        sl->p = zt_backend_alloc(z->be, ZT_MEM_PINNED, z->host_bytes);
        if (!sl->g || !sl->p)
            return zt_error(ZT_ERR_NOMEM, "offload: no host memory for %d pairs of %zu-byte "
                            "update tiles", ZT_ZERO_TILE_SLOTS, z->host_bytes);
        sl->copied = zt_backend_event_create(z->be);
        if (!sl->copied)
            return zt_error(ZT_ERR_NOMEM, "offload: device \"%s\" made no event for the "
                            "update's tile copies", z->be->name);
    }
    return ZT_OK;
}

/* After an offloaded update every rank learns whether any rank's failed, so that no rank goes on
 * to publish (all-gather) parameters while another stops. */
static zt_status agree_on_update(zt_zero *z, zt_status mine) {
    return zt_zero_agree(z, mine, "update its offloaded state; no rank applies this update");
}

/* One offloaded update: on a GPU the tiles' copies are issued one tile ahead (stage_ahead). */
static zt_status offload_step(zt_zero *z, update_ctx *c,
                              void (*update)(void *, const zt_offload_tile *)) {
    zt_offload_pass pass = {update, z->host_be ? stage_ahead : NULL, c};
    zt_status s = zt_offload_step(z->off, &pass);
    return agree_on_update(z, s == ZT_OK ? zt_zero_first_error(z) : s);
}

/* LAMB's trust ratios need whole tensors, which ZeRO partitions across ranks: the sums of
 * squares of this rank's pieces are all-reduced between the two passes (stage 0 holds every
 * tensor whole on every rank). Offload is refused with LAMB when the config is read. */
static zt_comm *lamb_comm(const zt_zero *z) { return z->stage > 0 ? z->comm : NULL; }

static zt_status lamb_update(zt_zero *z, zt_optimizer *o, float *p, const float *g, size_t count,
                             double lr, double momentum) {
    ZT_ASSERT(!z->off);
    zt_optimizer_lamb_moments(o, p, g, 0, count, momentum);
    ZT_TRY(zt_optimizer_lamb_reduce(o, lamb_comm(z), lr, momentum));
    zt_optimizer_lamb_apply(o, p, 0, count);
    return ZT_OK;
}

/* The mixed-precision LAMB step: the 16-bit gradients are widened and scaled chunk by chunk
 * through the staging buffer for the first pass; the second needs no gradients and writes the
 * 16-bit parameters with the masters. */
static zt_status lamb_update_half(zt_zero *z, zt_optimizer *o, const uint16_t *g, size_t count,
                                  float grad_mul, double lr, double momentum) {
    ZT_ASSERT(!z->off);
    const zt_ops *op = z->be->ops;
    for (size_t c = 0; c < count; c += ZT_ZERO_CHUNK) {
        size_t len = zt_min_sz(ZT_ZERO_CHUNK, count - c);
        op->from_half(&z->ctx, z->chunk, g + c, len, z->dtype);
        op->scale(&z->ctx, z->chunk, len, grad_mul);
        zt_optimizer_lamb_moments(o, z->master + c, z->chunk, c, len, momentum);
    }
    ZT_TRY(zt_optimizer_lamb_reduce(o, lamb_comm(z), lr, momentum));
    zt_optimizer_lamb_apply_mixed(o, z->master, z->p16 + z->master_base, z->dtype, 0, count);
    return ZT_OK;
}

zt_status zt_zero_update_half(zt_zero *z, zt_optimizer *o, const uint16_t *g, size_t count,
                              float grad_mul, double lr, double momentum) {
    if (o->cfg.type == ZT_OPTIM_LAMB)
        return lamb_update_half(z, o, g, count, grad_mul, lr, momentum);
    if (z->states16) {
        zt_optimizer_update_16(o, z->p16 + z->master_base, g, grad_mul, z->m16, z->v16, z->dtype,
                               count, z->staging16, lr, momentum);
        return ZT_OK;
    }
    if (!z->off) {
        update_half_range(z, o, z->master, g, o->m, o->v, z->p16 + z->master_base, count,
                          grad_mul, lr, momentum);
        return ZT_OK;
    }
    update_ctx c = {z, o, g, grad_mul, lr, momentum, 2};
    return offload_step(z, &c, update_tile_half);
}

zt_status zt_zero_update(zt_zero *z, zt_optimizer *o, float *p, const float *g, size_t count,
                         double lr, double momentum) {
    if (o->cfg.type == ZT_OPTIM_LAMB)
        return lamb_update(z, o, p, g, count, lr, momentum);
    if (!z->off) {
        zt_optimizer_update(o, p, g, 0, count, lr, momentum);
        return ZT_OK;
    }
    update_ctx c = {z, o, g, 1.0f, lr, momentum, 4};
    return offload_step(z, &c, update_tile);
}

zt_status zt_zero_init_offload(zt_zero *z, const zt_zero_config *cfg, zt_optimizer *o,
                               const char *job_name) {
    const zt_offload_device od = cfg->offload_optimizer.device;
    bool param_nvme = z->stage == 3 && cfg->offload_param.device == ZT_OFFLOAD_NVME;
    if (od == ZT_OFFLOAD_NONE && !param_nvme)
        return ZT_OK;
    /* offload_param alone would run the update on the device's state with the parameters in
     * host tiles: not staged (yet); with offload_optimizer too, it is. */
    if (z->be->device != ZT_DEVICE_CPU && od == ZT_OFFLOAD_NONE)
        return zt_error(ZT_ERR_INVALID, "zero_optimization.offload_param on device \"%s\": "
                        "only together with offload_optimizer", z->be->name);
    ZT_ASSERT((od != ZT_OFFLOAD_NONE) == z->masters_offloaded);
    ZT_ASSERT(!o || o->external == z->masters_offloaded);
    zt_model *m = z->model;
    size_t base = z->stage == 0 ? 0 : z->own_lo;
    zt_offload_spec spec = {
        .be = z->be,
        .rank = z->job_rank,
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
    bool adam = o && o->cfg.type != ZT_OPTIM_SGD;
    if (n_state >= 1)
        spec.streams[ZT_OFFLOAD_EXP_AVG] = (zt_offload_stream_spec){
            state, adam ? "exp_avg" : "momentum_buffer", 4, o->m, false};
    if (n_state >= 2)
        spec.streams[ZT_OFFLOAD_EXP_AVG_SQ] =
            (zt_offload_stream_spec){state, "exp_avg_sq", 4, o->v, false};
    ZT_TRY(zt_offload_create(&z->off, &spec));
    z->param_file = param_nvme;
    return od != ZT_OFFLOAD_NONE ? stage_offload(z, o) : ZT_OK;
}

/* 16-bit state in and out of a checkpoint as fp32, through the staging buffer: widened exactly
 * on the way out, rounded to nearest even on the way in. */
static zt_status state16_copy(zt_zero *z, uint16_t *mem, bool write, size_t first, float *data,
                              size_t count) {
    ZT_ASSERT(mem && first + count <= z->part);
    const zt_ops *op = z->be->ops;
    for (size_t c = 0; c < count; c += ZT_ZERO_CHUNK) {
        size_t len = zt_min_sz(ZT_ZERO_CHUNK, count - c);
        if (write) {
            zt_backend_copy(z->be, z->chunk, data + c, len * sizeof(float), ZT_COPY_H2D,
                            ZT_STREAM_COMPUTE);
            op->to_half(&z->ctx, mem + first + c, z->chunk, len, z->dtype);
        } else {
            op->from_half(&z->ctx, z->chunk, mem + first + c, len, z->dtype);
            zt_backend_copy(z->be, data + c, z->chunk, len * sizeof(float), ZT_COPY_D2H,
                            ZT_STREAM_COMPUTE);
        }
    }
    return ZT_OK;
}

bool zt_zero_has_state(const zt_zero *z, const zt_optimizer *o, int stream) {
    if (stream == ZT_OFFLOAD_MASTER)
        return z->half && !z->states16;
    int n_state = o ? zt_optimizer_state_count(&o->cfg) : 0;
    return stream == ZT_OFFLOAD_EXP_AVG ? n_state >= 1 : n_state >= 2;
}

zt_status zt_zero_state_copy(zt_zero *z, zt_optimizer *o, int stream, bool write, size_t first,
                             float *data, size_t count) {
    ZT_ASSERT(zt_zero_has_state(z, o, stream) && stream != ZT_OFFLOAD_PARAMS);
    if (z->off && zt_offload_has(z->off, stream))
        return write ? zt_offload_write(z->off, stream, first, data, count)
                     : zt_offload_read(z->off, stream, first, data, count);
    if (z->states16)
        return state16_copy(z, stream == ZT_OFFLOAD_EXP_AVG ? z->m16 : z->v16, write, first, data,
                            count);
    float *mem = stream == ZT_OFFLOAD_MASTER     ? z->master
                 : stream == ZT_OFFLOAD_EXP_AVG ? o->m
                                                : o->v;
    ZT_ASSERT(mem && first + count <= o->n);
    if (write)
        zt_backend_copy(z->be, mem + first, data, count * sizeof(float), ZT_COPY_H2D,
                        ZT_STREAM_COMPUTE);
    else
        zt_backend_copy(z->be, data, mem + first, count * sizeof(float), ZT_COPY_D2H,
                        ZT_STREAM_COMPUTE);
    return ZT_OK;
}

