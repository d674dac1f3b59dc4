/* Per-op timings of a training step (`ztrain-worker --profile`): how long each op of the table
 * (ops.h) took, summed per op over a step.
 *
 * A profile stands between a backend and its callers: creating one points be->ops at a table of
 * the same entries, each of which records a timing event (backend.h) on the compute stream,
 * calls the backend's own entry and records a second one. On the CPU an event holds the
 * monotonic clock at its record (every op has completed when it returns); on a GPU it is a CUDA
 * event, so a time is the device's time between the op's first kernel starting and its last one
 * finishing, not the host's time to launch them. Nothing else in the engine changes: the model,
 * ZeRO and the optimizer call be->ops as always.
 *
 * Only ops called between zt_op_profile_begin_step and zt_op_profile_end_step, on the thread that
 * called begin, are timed: initialisation, evaluation and checkpoints are not a step's, and ops
 * another thread issues (ZeRO's communication thread) would overlap the step's own. Those others
 * are counted (other_calls), so nothing is lost unseen. Events come from a pool made at creation
 * (no allocation in the step); a step that calls more ops than it holds waits for the device
 * once per poolful to read them, which a profiled step may afford.
 *
 * The times of one step's ops never overlap (one stream, or one thread on the CPU), so their sum
 * is at most the step's wall time measured around begin and end. */
#ifndef ZTRAIN_OP_PROFILE_H
#define ZTRAIN_OP_PROFILE_H

#include <stddef.h>

#include "ztrain/backend.h"
#include "ztrain/status.h"

/* One entry per field of zt_ops, in its order. */
typedef enum {
    ZT_OP_EMBEDDING_FORWARD = 0,
    ZT_OP_EMBEDDING_BACKWARD,
    ZT_OP_LAYERNORM_FORWARD,
    ZT_OP_LAYERNORM_BACKWARD,
    ZT_OP_RMSNORM_FORWARD,
    ZT_OP_RMSNORM_BACKWARD,
    ZT_OP_ROPE_FORWARD,
    ZT_OP_ROPE_BACKWARD,
    ZT_OP_LINEAR_FORWARD,
    ZT_OP_LINEAR_BACKWARD,
    ZT_OP_LINEAR_GELU_FORWARD,
    ZT_OP_LINEAR_BACKWARD_GELU,
    ZT_OP_ATTENTION_FORWARD,
    ZT_OP_ATTENTION_BACKWARD,
    ZT_OP_GELU_FORWARD,
    ZT_OP_GELU_BACKWARD,
    ZT_OP_SILU_MUL_FORWARD,
    ZT_OP_SILU_MUL_BACKWARD,
    ZT_OP_ADD,
    ZT_OP_SOFTMAX_XENT,
    ZT_OP_XENT_PARTIAL_STATS,
    ZT_OP_XENT_PARTIAL_GRAD,
    ZT_OP_ADAM_UPDATE,
    ZT_OP_SGD_UPDATE,
    ZT_OP_ADAM_UPDATE_MIXED,
    ZT_OP_LAMB_MOMENTS,
    ZT_OP_LAMB_APPLY,
    ZT_OP_SUM_SQUARES,
    ZT_OP_SCALE,
    ZT_OP_TO_HALF,
    ZT_OP_FROM_HALF,
    ZT_OP_ROUND_TO,
    ZT_OP_ACCUMULATE_HALF,
    ZT_OP_SUM_SQUARES_HALF,
    ZT_OP_SGD_UPDATE_MIXED,
    ZT_OP_LAMB_APPLY_MIXED,
    ZT_OP_SUM_TO,
    ZT_OP_LAMB_MOMENTS_TO,
    ZT_OP_XENT_PARTIAL_COMBINE,
    ZT_OP_LAMB_STEPS,
    ZT_OP_WEIGHTED_SUM_TO,
    ZT_OP_COUNT
} zt_op_id;

/* The field's name in zt_ops ("linear_forward"); "?" past the last. A static string. */
const char *zt_op_name(zt_op_id op);

/* One op's share of a step. */
typedef struct {
    long calls;
    double ms;
} zt_op_time;

typedef struct zt_op_profile zt_op_profile;

/* Starts profiling be: from now on be->ops is the profile's table. ZT_ERR_UNSUPPORTED naming the
 * backend when it has no timing events, ZT_ERR_NOMEM when the event pool cannot be made. Destroy
 * it before the backend; destroying puts the backend's own table back. */
zt_status zt_op_profile_create(zt_op_profile **out, zt_backend *be);
void zt_op_profile_destroy(zt_op_profile *p);

/* "cudaEvent" or "monotonic": what the times are read from. A static string. */
const char *zt_op_profile_clock(const zt_op_profile *p);

/* Starts a step on the calling thread: the per-op sums go back to zero. */
void zt_op_profile_begin_step(zt_op_profile *p);

/* Ends the step: reads the times of its ops (waiting for the device to finish them) into
 * out[ZT_OP_COUNT], ops not called having 0 calls. Errors of the backend's events are returned
 * (ZT_ERR_IO naming the device). */
zt_status zt_op_profile_end_step(zt_op_profile *p, zt_op_time out[ZT_OP_COUNT]);

/* Ops called from other threads than the step's, or outside a step, since creation; not timed. */
long zt_op_profile_other_calls(const zt_op_profile *p);

#endif
