/* Pipeline parallelism as DeepSpeed's pipeline engine defines it: the grid of ranks, how a
 * model's layers are cut into stages, and each stage's schedule of commands.
 *
 * These are pure functions of small integers and layer lists, so that the engine that runs a
 * pipeline (engine/pipe/pipe_engine.c) and the tests agree on one definition, re-derived from
 * DeepSpeed's deepspeed/runtime/pipe/{topology,schedule}.py and runtime/utils.py:
 *
 * - Grid: DeepSpeed's PipeDataParallelTopology numbers ranks with the data-parallel axis
 *   fastest, so rank = stage · dp + replica. A stage's replicas are consecutive ranks.
 * - Partition: `uniform` cuts n layers into parts whose sizes differ by at most one, the larger
 *   first; `parameters` and `type:REGEX` are DeepSpeed's balanced partition (the linear-partition
 *   problem: stage boundaries that minimise the difference between the heaviest and the lightest
 *   stage, ties to the later boundary) over the layers' trainable parameter counts, or over 1 for
 *   each layer whose type name matches REGEX (PCRE2, unanchored, as Python's re.search) and 0
 *   for the others.
 * - Schedule: TrainSchedule (1F1B) and InferenceSchedule. A stage's schedule is a list of steps;
 *   each step is a short list of commands, and a barrier may sit between any two steps without a
 *   deadlock. The commands carry the micro-batch and the buffer they touch. */
#ifndef ZTRAIN_PIPELINE_H
#define ZTRAIN_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>

#include "ztrain/status.h"

/* ---- the grid ------------------------------------------------------------------------------ */

static inline int zt_pipe_rank(int stage, int replica, int dp) { return stage * dp + replica; }
static inline int zt_pipe_stage_of(int rank, int dp) { return rank / dp; }
static inline int zt_pipe_replica_of(int rank, int dp) { return rank % dp; }

/* ---- partitioning layers into stages ------------------------------------------------------- */

/* One entry of the layer list a model offers for partitioning (DeepSpeed's layer specs): for
 * GPT-2 "embed", then n_layer × "block", then "final_norm" and "head". */
typedef struct {
    const char *type;   /* the layer's type name, which type:REGEX matches */
    size_t params;      /* its trainable parameters (a tied copy counts on each stage holding it) */
} zt_pipe_layer;

/* bounds[0..parts] receives stage boundaries: stage s holds layers [bounds[s], bounds[s+1]).
 * bounds[0] = 0, bounds[parts] = n. With n ≤ parts, stage s holds layer s (later stages none). */
void zt_pipe_partition_uniform(int n, int parts, int *bounds);
/* DeepSpeed's partition_balanced over weights[n]. */
void zt_pipe_partition_balanced(const double *weights, int n, int parts, int *bounds);
/* The partition a method names: "parameters", "uniform" or "type:REGEX" (case-insensitive
 * method names, as DeepSpeed lowers them). An unknown method, a REGEX that does not compile or
 * matches no layer, or a stage left without layers is ZT_ERR_INVALID naming the method
 * ("pipeline.partition \"type:foo\": matches no layer; layer types are embed, block, ..."). */
zt_status zt_pipe_partition(const char *method, const zt_pipe_layer *layers, int n, int parts,
                            int *bounds);

/* ---- schedules ----------------------------------------------------------------------------- */

typedef enum {
    ZT_PIPE_LOAD_MICRO_BATCH = 0,
    ZT_PIPE_FORWARD,
    ZT_PIPE_BACKWARD,
    ZT_PIPE_SEND_ACTIVATION,
    ZT_PIPE_RECV_ACTIVATION,
    ZT_PIPE_SEND_GRAD,
    ZT_PIPE_RECV_GRAD,
    ZT_PIPE_REDUCE_TIED_GRADS,
    ZT_PIPE_REDUCE_GRADS,
    ZT_PIPE_OPTIMIZER_STEP,
    ZT_PIPE_CMD_KINDS
} zt_pipe_cmd_kind;

typedef struct {
    zt_pipe_cmd_kind kind;
    int step;          /* the schedule step the command belongs to */
    int buffer;        /* the pipe buffer (-1 for the reduce and step commands) */
    int micro_batch;   /* the micro-batch whose data the buffer holds (-1 likewise) */
} zt_pipe_cmd;

/* DeepSpeed's names: "LoadMicroBatch", "ForwardPass", "BackwardPass", "SendActivation",
 * "RecvActivation", "SendGrad", "RecvGrad", "ReduceTiedGrads", "ReduceGrads", "OptimizerStep". */
const char *zt_pipe_cmd_name(zt_pipe_cmd_kind k);

/* Buffers a stage of the training schedule uses: max(2, min(stages - stage + 1, micro_batches)),
 * as DeepSpeed's TrainSchedule.num_pipe_buffers. The inference schedule uses 2. */
int zt_pipe_train_buffers(int stages, int stage, int micro_batches);

/* The training schedule of one batch for `stage` of `stages` with `micro_batches` micro-batches
 * (the gradient accumulation steps): 2·(micro_batches + stages - 1) steps, in DeepSpeed's order
 * within each step. Writes at most cap commands to out (out may be NULL with cap 0) and returns
 * how many the whole schedule has, so a caller sizes with a first call. Arguments outside
 * 0 ≤ stage < stages, micro_batches ≥ 1 are a caller's bug (ZT_ASSERT). */
size_t zt_pipe_train_schedule(int stages, int stage, int micro_batches, zt_pipe_cmd *out,
                              size_t cap);
/* The inference (evaluation) schedule: micro_batches + stages - 1 steps, likewise. */
size_t zt_pipe_inference_schedule(int stages, int stage, int micro_batches, zt_pipe_cmd *out,
                                  size_t cap);

/* The ideal bubble fraction of 1F1B, (stages - 1) / (micro_batches + stages - 1). */
static inline double zt_pipe_ideal_bubble(int stages, int micro_batches) {
    return (double)(stages - 1) / (double)(micro_batches + stages - 1);
}

#endif
