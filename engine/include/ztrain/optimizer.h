/* The optimizer over one flat slice of parameters: Adam/AdamW, SGD or LAMB as DeepSpeed configures
 * them.
 *
 * The state (Adam's m and v, or SGD's momentum buffer) is one flat fp32 buffer per moment, the same
 * length as the slice it updates, so a ZeRO partition is just a shorter slice. The lr and momentum
 * come from the schedule at each step. */
#ifndef ZTRAIN_OPTIMIZER_H
#define ZTRAIN_OPTIMIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/ds_config.h"
#include "ztrain/backend.h"
#include "ztrain/comm.h"
#include "ztrain/status.h"

typedef struct {
    zt_optimizer_config cfg;
    zt_ctx ctx;    /* the backend that holds the state and runs the updates */
    size_t n;      /* parameters in the slice */
    int64_t t;     /* updates applied so far (Adam's bias-correction step) */
    float *m;      /* Adam first moment, or SGD momentum buffer (NULL when momentum is 0) */
    float *v;      /* Adam second moment (NULL for SGD) */
    bool external; /* the state lives elsewhere (offload): m and v are NULL */
    /* LAMB only (zt_optimizer_set_tensors): the parameter tensors' parts in this slice, and
     * per tensor, in the backend's device memory, this step's sums of p² and of u² (each
     * piece's lamb_moments_to adds its own, in the order the pieces come) and its step (step
     * size times trust ratio, lamb_steps), which lamb_apply reads there: the host never waits
     * for them. */
    int n_tensors;      /* the model's tensors, and the padding after them as one more */
    size_t *tensor_lo;  /* [n_tensors + 1]: tensor i is [tensor_lo[i], tensor_lo[i+1]) here */
    double *lamb_sums;  /* [2 * n_tensors], device memory */
    float *lamb_step;   /* [n_tensors], device memory */
} zt_optimizer;

/* Allocates zeroed state for n parameters in be's device memory; updates run on be. Free with
 * zt_optimizer_free(). */
zt_status zt_optimizer_init(zt_optimizer *o, const zt_optimizer_config *cfg, zt_backend *be,
                            size_t n);
/* The same without allocating the state: its owner (the offload store) keeps it and passes it to
 * the *_with updates, which run on be (the backend whose memory that state is in: the host's, for
 * offloaded state). */
void zt_optimizer_init_external(zt_optimizer *o, const zt_optimizer_config *cfg,
                                zt_backend *be, size_t n);
void zt_optimizer_free(zt_optimizer *o);

/* How many state buffers of n floats the optimizer keeps: 2 for Adam and LAMB (exp_avg,
 * exp_avg_sq), 1
 * for SGD with momentum (momentum_buffer), 0 for plain SGD. */
int zt_optimizer_state_count(const zt_optimizer_config *cfg);

/* LAMB's trust ratios are per parameter tensor, so a LAMB optimizer must be told where the
 * tensors lie before its first step (other types ignore this): `starts[0..count)` are the tensors'
 * first elements in the model's flat buffer, ascending, the last tensor ends at `end`, the padding
 * up to `total` counts as one more tensor, and the slice begins at element `slice_lo` of that
 * buffer. The arrays are the optimizer's, freed by zt_optimizer_free. */
zt_status zt_optimizer_set_tensors(zt_optimizer *o, const size_t *starts, int count, size_t end,
                                   size_t total, size_t slice_lo);

/* LAMB's step in three calls, after zt_optimizer_begin_step: lamb_moments over the slice's
 * elements [offset, offset + n) (in any number of pieces) updates the moments from grads and adds
 * up each tensor's sums of squares in device memory; lamb_reduce all-reduces them over comm
 * (zt_comm_dev_all_reduce) when the tensors are partitioned across ranks (NULL: this slice holds
 * them whole) and derives each tensor's step on the device from lr and momentum (beta1, which the
 * schedule may cycle); lamb_apply then updates the parameters of [offset, offset + n), again in
 * any pieces. None of them waits for the device (the communicator's staging through host memory
 * apart). zt_optimizer_step does all three on a whole slice. */
void zt_optimizer_lamb_moments(zt_optimizer *o, const float *params, const float *grads,
                               size_t offset, size_t n, double momentum);
zt_status zt_optimizer_lamb_reduce(zt_optimizer *o, zt_comm *comm, double lr, double momentum);
void zt_optimizer_lamb_apply(zt_optimizer *o, float *params, size_t offset, size_t n);
/* lamb_apply that also writes params16[i] = params[i] rounded to type (ZT_BF16 or ZT_F16) in the
 * same pass (the backend's lamb_apply_mixed); params16 NULL: lamb_apply. */
void zt_optimizer_lamb_apply_mixed(zt_optimizer *o, float *params, uint16_t *params16,
                                   zt_dtype type, size_t offset, size_t n);

/* Applies one update to params[n] from grads[n] with the given lr and momentum (Adam's beta1 or
 * SGD's momentum, from the schedule). */
void zt_optimizer_step(zt_optimizer *o, float *params, const float *grads, double lr,
                       double momentum);

/* The same in pieces, for callers that stream the slice through a small buffer: begin_step counts
 * the update once, then update() (Adam and SGD; LAMB uses the lamb_* calls) applies it to params[0..n) / grads[0..n), which are the slice's
 * elements [offset, offset + n) (so the matching part of the state is used). */
void zt_optimizer_begin_step(zt_optimizer *o);
void zt_optimizer_update(zt_optimizer *o, float *params, const float *grads, size_t offset,
                         size_t n, double lr, double momentum);

/* Mixed precision in one pass, when the optimizer is Adam or SGD and the backend has
 * adam_update_mixed or sgd_update_mixed (else returns false and does nothing): as zt_optimizer_update on master[0..n) with gradients
 * grads[i] * grad_mul read as grad_type, then params16[i] = master[i] rounded to param_type
 * (params16 may be NULL). Bit for bit the same as from_half, scale, zt_optimizer_update, to_half. */
bool zt_optimizer_update_mixed(zt_optimizer *o, float *master, const void *grads,
                               zt_dtype grad_type, float grad_mul, uint16_t *params16,
                               zt_dtype param_type, size_t offset, size_t n, double lr,
                               double momentum);

/* zt_optimizer_update and zt_optimizer_update_mixed with the state of these n elements given
 * explicitly (m: first moment or momentum buffer, v: second moment; NULL where the optimizer has
 * none), for state that the optimizer does not hold (offload streams it through buffers). The
 * bits are the same: every element's update depends on that element alone. */
void zt_optimizer_update_with(zt_optimizer *o, float *params, const float *grads, float *m,
                              float *v, size_t n, double lr, double momentum);
bool zt_optimizer_update_mixed_with(zt_optimizer *o, float *master, const void *grads,
                                    zt_dtype grad_type, float grad_mul, float *m, float *v,
                                    uint16_t *params16, zt_dtype param_type, size_t n, double lr,
                                    double momentum);

/* bf16_master_weights_and_grads with bf16_optimizer_states: parameters (which are the masters),
 * gradients and state all 16-bit of `type`, the update computed in fp32 as DeepSpeed's fused
 * optimizers compute it. Each piece of ZT_OPTIMIZER_PIECE16 elements is widened into staging (4 ×
 * ZT_OPTIMIZER_PIECE16 floats of the backend's memory, the caller's), the gradients multiplied by
 * grad_mul, updated as zt_optimizer_update_with (m and v hold the 16-bit state, NULL where the
 * optimizer has none) and rounded to nearest even on store: parameters, m and v. The optimizer
 * holds no state of its own then (zt_optimizer_init_external). */
#define ZT_OPTIMIZER_PIECE16 (1 << 14)
void zt_optimizer_update_16(zt_optimizer *o, uint16_t *params, const uint16_t *grads,
                            float grad_mul, uint16_t *m, uint16_t *v, zt_dtype type, size_t n,
                            float *staging, double lr, double momentum);

#endif
