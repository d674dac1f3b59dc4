/* The optimizer over one flat parameter slice: owns Adam's (or LAMB's) moments or SGD's momentum
 * buffer and turns the step count, lr and momentum into the kernel's per-step arguments; for LAMB
 * also the per-tensor sums and steps between its two passes, in device memory. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/optimizer.h"

static size_t state_bytes(const zt_optimizer *o) { return (o->n ? o->n : 1) * sizeof(float); }
static size_t lamb_sums_bytes(const zt_optimizer *o) {
    return 2 * (size_t)o->n_tensors * sizeof(double);
}
static size_t lamb_step_bytes(const zt_optimizer *o) {
    return (size_t)o->n_tensors * sizeof(float);
}

/* One moment buffer of n floats in the backend's memory, zeroed; never 0 bytes, so a zero-length
 * slice still has valid, distinct pointers. It is written once here, so its memory is taken now
 * (a rank that cannot hold its optimizer state fails at the start, not at its first step). */
static zt_status alloc_state(zt_optimizer *o, float **out, const char *what) {
    if (o->n > SIZE_MAX / sizeof(float) - 1)
        return zt_error(ZT_ERR_NOMEM, "optimizer: %zu parameters overflow the size of the %s buffer",
                        o->n, what);
    *out = zt_backend_alloc(o->ctx.be, ZT_MEM_DEVICE, state_bytes(o));
    if (!*out)
        return zt_error(ZT_ERR_NOMEM, "optimizer: cannot allocate %zu bytes on %s for the %s of "
                        "%zu parameters", state_bytes(o), o->ctx.be->name, what, o->n);
    zt_backend_zero(o->ctx.be, *out, state_bytes(o), ZT_STREAM_COMPUTE);
    return ZT_OK;
}

zt_status zt_optimizer_init(zt_optimizer *o, const zt_optimizer_config *cfg, zt_backend *be,
                            size_t n) {
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    o->ctx = (zt_ctx){.be = be, .act = ZT_F32};
    o->n = n;
    zt_status s = ZT_OK;
    if (cfg->type == ZT_OPTIM_ADAM || cfg->type == ZT_OPTIM_LAMB) {
        s = alloc_state(o, &o->m, "first moment");
        if (s == ZT_OK)
            s = alloc_state(o, &o->v, "second moment");
    } else if (cfg->momentum != 0.0) {
        s = alloc_state(o, &o->m, "SGD momentum buffer");
    }
    if (s != ZT_OK)
        zt_optimizer_free(o);
    return s;
}

void zt_optimizer_init_external(zt_optimizer *o, const zt_optimizer_config *cfg,
                                zt_backend *be, size_t n) {
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    o->ctx = (zt_ctx){.be = be, .act = ZT_F32};
    o->n = n;
    o->external = true;
}

int zt_optimizer_state_count(const zt_optimizer_config *cfg) {
    if (cfg->type == ZT_OPTIM_ADAM || cfg->type == ZT_OPTIM_LAMB)
        return 2;
    return cfg->momentum != 0.0 ? 1 : 0;
}

void zt_optimizer_free(zt_optimizer *o) {
    if (o->ctx.be) {
        zt_backend_free(o->ctx.be, ZT_MEM_DEVICE, o->m, state_bytes(o));
        zt_backend_free(o->ctx.be, ZT_MEM_DEVICE, o->v, state_bytes(o));
    }
    o->m = NULL;
    o->v = NULL;
    if (o->ctx.be) {
        zt_backend_free(o->ctx.be, ZT_MEM_DEVICE, o->lamb_sums, lamb_sums_bytes(o));
        zt_backend_free(o->ctx.be, ZT_MEM_DEVICE, o->lamb_step, lamb_step_bytes(o));
    }
    free(o->tensor_lo);
    o->tensor_lo = NULL;
    o->lamb_sums = NULL;
    o->lamb_step = NULL;
}

/* A tensor's pieces add their sums to its slot from +0.0, as the host once added the sums
 * returned to it into a zeroed array; zeroing in stream order needs no wait. */
void zt_optimizer_begin_step(zt_optimizer *o) {
    o->t++;
    if (o->lamb_sums)
        zt_backend_zero(o->ctx.be, o->lamb_sums, lamb_sums_bytes(o), ZT_STREAM_COMPUTE);
}

static size_t clamp_to_slice(size_t at, size_t slice_lo, size_t n) {
    if (at <= slice_lo)
        return 0;
    return at - slice_lo < n ? at - slice_lo : n;
}

zt_status zt_optimizer_set_tensors(zt_optimizer *o, const size_t *starts, int count, size_t end,
                                   size_t total, size_t slice_lo) {
    ZT_ASSERT(count > 0 && end <= total);
    ZT_ASSERT(!o->tensor_lo && !o->external);
    int n = count + 1;
    o->n_tensors = n;
    o->tensor_lo = malloc(((size_t)n + 1) * sizeof *o->tensor_lo);
    if (!o->tensor_lo)
        return zt_error(ZT_ERR_NOMEM, "optimizer: out of memory for LAMB's %d tensors", count);
    o->lamb_sums = zt_backend_alloc(o->ctx.be, ZT_MEM_DEVICE, lamb_sums_bytes(o));
    o->lamb_step = zt_backend_alloc(o->ctx.be, ZT_MEM_DEVICE, lamb_step_bytes(o));
    if (!o->lamb_sums || !o->lamb_step)
        return zt_error(ZT_ERR_NOMEM, "optimizer: cannot allocate %zu bytes on %s for LAMB's "
                        "sums and steps of %d tensors", lamb_sums_bytes(o) + lamb_step_bytes(o),
                        o->ctx.be->name, count);
    for (int i = 0; i < count; i++) {
        ZT_ASSERT(i == 0 || starts[i] >= starts[i - 1]);
        o->tensor_lo[i] = clamp_to_slice(starts[i], slice_lo, o->n);
    }
    o->tensor_lo[count] = clamp_to_slice(end, slice_lo, o->n);
    o->tensor_lo[n] = clamp_to_slice(total, slice_lo, o->n);
    return ZT_OK;
}

static zt_lamb_args lamb_args(const zt_optimizer *o, double momentum) {
    const zt_optimizer_config *c = &o->cfg;
    return (zt_lamb_args){
        .beta1 = (float)momentum,
        .beta2 = (float)c->beta2,
        .eps = (float)c->eps,
        .weight_decay = (float)c->weight_decay,
        .eps_inside_sqrt = c->eps_inside_sqrt,
    };
}

/* The part of tensor i inside the slice's elements [offset, offset + n), as [*lo, *lo + *len);
 * false when they do not meet. */
static bool tensor_part(const zt_optimizer *o, int i, size_t offset, size_t n, size_t *lo,
                        size_t *len) {
    size_t a = o->tensor_lo[i] > offset ? o->tensor_lo[i] : offset;
    size_t b = o->tensor_lo[i + 1] < offset + n ? o->tensor_lo[i + 1] : offset + n;
    *lo = a;
    *len = b > a ? b - a : 0;
    return *len > 0;
}

void zt_optimizer_lamb_moments(zt_optimizer *o, const float *params, const float *grads,
                               size_t offset, size_t n, double momentum) {
    ZT_ASSERT(o->cfg.type == ZT_OPTIM_LAMB && o->lamb_sums && !o->external);
    ZT_ASSERT(offset + n <= o->n);
    zt_lamb_args a = lamb_args(o, momentum);
    const zt_ops *op = o->ctx.be->ops;
    for (int i = 0; i < o->n_tensors; i++) {
        size_t lo, len;
        if (!tensor_part(o, i, offset, n, &lo, &len))
            continue;
        op->lamb_moments_to(&o->ctx, params + (lo - offset), grads + (lo - offset), o->m + lo,
                            o->v + lo, len, &a, o->lamb_sums + 2 * i);
    }
}

/* FusedLamb's constants: the bias corrections in float from powers taken in double, and the step
 * size lr·sqrt(bc2)/bc1 in float (fused_lamb_cuda_kernel.cu), from host values alone; the trust
 * ratio ||p|| / ||u||, clamped first to max_coeff and then to min_coeff, or 1 when either norm
 * is 0, from the sums on the device (the backend's lamb_steps). The sums are all-reduced where
 * they are: a transport that reduces in host memory stages them there and back (its own wait),
 * adding the ranks' sums in the order it adds host buffers, so the steps are the bits the host
 * computed when the sums were read back. */
zt_status zt_optimizer_lamb_reduce(zt_optimizer *o, zt_comm *comm, double lr, double momentum) {
    ZT_ASSERT(o->cfg.type == ZT_OPTIM_LAMB && o->lamb_sums);
    const zt_optimizer_config *c = &o->cfg;
    if (comm)
        ZT_TRY(zt_comm_dev_all_reduce(comm, o->lamb_sums, 2 * (size_t)o->n_tensors, ZT_F64,
                                      ZT_REDUCE_SUM));
    float step_size = (float)lr;
    if (c->bias_correction) {
        float bc1 = (float)(1.0 - pow(momentum, (double)o->t));
        float bc2 = (float)(1.0 - pow(c->beta2, (double)o->t));
        step_size = (float)lr * sqrtf(bc2) / bc1;
    }
    zt_lamb_step_args a = {.step_size = step_size,
                           .max_coeff = (float)c->max_coeff,
                           .min_coeff = (float)c->min_coeff};
    o->ctx.be->ops->lamb_steps(&o->ctx, o->lamb_step, o->lamb_sums, (size_t)o->n_tensors, &a);
    return ZT_OK;
}

void zt_optimizer_lamb_apply_mixed(zt_optimizer *o, float *params, uint16_t *params16,
                                   zt_dtype type, size_t offset, size_t n) {
    ZT_ASSERT(o->cfg.type == ZT_OPTIM_LAMB && o->lamb_step && !o->external);
    ZT_ASSERT(offset + n <= o->n);
    const zt_ops *op = o->ctx.be->ops;
    /* The moments pass's beta1 is not used here: u depends on m, v and p alone. */
    zt_lamb_args a = lamb_args(o, 0.0);
    for (int i = 0; i < o->n_tensors; i++) {
        size_t lo, len;
        if (!tensor_part(o, i, offset, n, &lo, &len))
            continue;
        float *p = params + (lo - offset);
        if (params16 && op->lamb_apply_mixed)
            op->lamb_apply_mixed(&o->ctx, p, o->m + lo, o->v + lo, len, &a, o->lamb_step + i,
                                 params16 + (lo - offset), type);
        else
            op->lamb_apply(&o->ctx, p, o->m + lo, o->v + lo, len, &a, o->lamb_step + i);
        if (params16 && !op->lamb_apply_mixed)
            op->to_half(&o->ctx, params16 + (lo - offset), p, len, type);
    }
}

void zt_optimizer_lamb_apply(zt_optimizer *o, float *params, size_t offset, size_t n) {
    zt_optimizer_lamb_apply_mixed(o, params, NULL, ZT_F32, offset, n);
}

/* Adam's kernel arguments for the update begun by zt_optimizer_begin_step. torch and DeepSpeed take
 * the bias corrections with the current beta1, so a OneCycle that cycles beta1 changes them too.
 * Powers are taken in double, as Python does. */
static zt_adam_args adam_args(const zt_optimizer *o, double lr, double momentum) {
    const zt_optimizer_config *c = &o->cfg;
    double bc1 = 1.0, bc2 = 1.0;
    if (c->bias_correction) {
        bc1 = 1.0 - pow(momentum, (double)o->t);
        bc2 = 1.0 - pow(c->beta2, (double)o->t);
    }
    return (zt_adam_args){
        .lr = (float)lr,
        .beta1 = (float)momentum,
        .beta2 = (float)c->beta2,
        .eps = (float)c->eps,
        .weight_decay = (float)c->weight_decay,
        .bias_correction1 = (float)bc1,
        .bias_correction2 = (float)bc2,
        .adamw_mode = c->adam_w_mode,
        .maximize = c->maximize,
    };
}

/* SGD's kernel arguments for the update begun by zt_optimizer_begin_step. */
static zt_sgd_args sgd_args(const zt_optimizer *o, double lr, double momentum) {
    const zt_optimizer_config *c = &o->cfg;
    return (zt_sgd_args){
        .lr = (float)lr,
        .momentum = (float)momentum,
        .dampening = (float)c->dampening,
        .weight_decay = (float)c->weight_decay,
        .nesterov = c->nesterov,
        .maximize = c->maximize,
        .first_step = o->t == 1,
    };
}

/* Without a buffer (momentum 0 in the config) the kernel runs plain SGD whatever `momentum`
 * says: DeepSpeed's OneCycle never cycles the momentum of torch's SGD, which has no betas, so a
 * cycled value must not conjure up a buffer. */
static float *sgd_buffer(const zt_optimizer *o, float *m) {
    return o->cfg.momentum != 0.0 ? m : NULL;
}

void zt_optimizer_update_with(zt_optimizer *o, float *params, const float *grads, float *m,
                              float *v, size_t n, double lr, double momentum) {
    const zt_optimizer_config *c = &o->cfg;
    ZT_ASSERT(c->type != ZT_OPTIM_LAMB);
    if (c->type == ZT_OPTIM_ADAM) {
        zt_adam_args a = adam_args(o, lr, momentum);
        o->ctx.be->ops->adam_update(&o->ctx, params, grads, m, v, n, &a);
    } else {
        zt_sgd_args a = sgd_args(o, lr, momentum);
        o->ctx.be->ops->sgd_update(&o->ctx, params, grads, sgd_buffer(o, m), n, &a);
    }
}

void zt_optimizer_update(zt_optimizer *o, float *params, const float *grads, size_t offset,
                         size_t n, double lr, double momentum) {
    ZT_ASSERT(offset + n <= o->n && !o->external && o->cfg.type != ZT_OPTIM_LAMB);
    zt_optimizer_update_with(o, params, grads, o->m ? o->m + offset : NULL,
                             o->v ? o->v + offset : NULL, n, lr, momentum);
}

/* Whether the backend has the optimizer's fused mixed-precision update. */
static bool has_mixed(const zt_optimizer *o) {
    const zt_ops *op = o->ctx.be->ops;
    return o->cfg.type == ZT_OPTIM_ADAM ? op->adam_update_mixed != NULL
           : o->cfg.type == ZT_OPTIM_SGD ? op->sgd_update_mixed != NULL
                                         : false;
}

bool zt_optimizer_update_mixed_with(zt_optimizer *o, float *master, const void *grads,
                                    zt_dtype grad_type, float grad_mul, float *m, float *v,
                                    uint16_t *params16, zt_dtype param_type, size_t n, double lr,
                                    double momentum) {
    if (!has_mixed(o))
        return false;
    const zt_ops *op = o->ctx.be->ops;
    if (o->cfg.type == ZT_OPTIM_ADAM) {
        zt_adam_args a = adam_args(o, lr, momentum);
        op->adam_update_mixed(&o->ctx, master, grads, grad_type, grad_mul, m, v, params16,
                              param_type, n, &a);
    } else {
        zt_sgd_args a = sgd_args(o, lr, momentum);
        op->sgd_update_mixed(&o->ctx, master, grads, grad_type, grad_mul, sgd_buffer(o, m),
                             params16, param_type, n, &a);
    }
    return true;
}

bool zt_optimizer_update_mixed(zt_optimizer *o, float *master, const void *grads,
                               zt_dtype grad_type, float grad_mul, uint16_t *params16,
                               zt_dtype param_type, size_t offset, size_t n, double lr,
                               double momentum) {
    if (!has_mixed(o))
        return false;
    ZT_ASSERT(offset + n <= o->n && !o->external);
    return zt_optimizer_update_mixed_with(o, master, grads, grad_type, grad_mul, o->m + offset,
                                          o->v + offset, params16, param_type, n, lr, momentum);
}

void zt_optimizer_step(zt_optimizer *o, float *params, const float *grads, double lr,
                       double momentum) {
    zt_optimizer_begin_step(o);
    if (o->cfg.type != ZT_OPTIM_LAMB) {
        zt_optimizer_update(o, params, grads, 0, o->n, lr, momentum);
        return;
    }
    zt_optimizer_lamb_moments(o, params, grads, 0, o->n, momentum);
    zt_status s = zt_optimizer_lamb_reduce(o, NULL, lr, momentum);
    ZT_ASSERT(s == ZT_OK); /* without a communicator it cannot fail */
    zt_optimizer_lamb_apply(o, params, 0, o->n);
}

void zt_optimizer_update_16(zt_optimizer *o, uint16_t *params, const uint16_t *grads,
                            float grad_mul, uint16_t *m, uint16_t *v, zt_dtype type, size_t n,
                            float *staging, double lr, double momentum) {
    const zt_ops *op = o->ctx.be->ops;
    const zt_ctx *x = &o->ctx;
    enum { PIECE = ZT_OPTIMIZER_PIECE16 };
    float *w = staging, *g = staging + PIECE, *fm = staging + 2 * PIECE, *fv = staging + 3 * PIECE;
    for (size_t c = 0; c < n; c += PIECE) {
        size_t len = n - c < PIECE ? n - c : PIECE;
        op->from_half(x, w, params + c, len, type);
        op->from_half(x, g, grads + c, len, type);
        op->scale(x, g, len, grad_mul);
        if (m)
            op->from_half(x, fm, m + c, len, type);
        if (v)
            op->from_half(x, fv, v + c, len, type);
        zt_optimizer_update_with(o, w, g, m ? fm : NULL, v ? fv : NULL, len, lr, momentum);
        op->to_half(x, params + c, w, len, type);
        if (m)
            op->to_half(x, m + c, fm, len, type);
        if (v)
            op->to_half(x, v + c, fv, len, type);
    }
}
