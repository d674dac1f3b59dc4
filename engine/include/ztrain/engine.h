/* The training engine: DeepSpeed's loop in C.
 *
 *     zt_engine_create(&e, &ds_config, &model_spec, train_data, &opts);
 *     for (;;) {
 *         zt_batch b;
 *         zt_engine_next_batch(e, &b);
 *         zt_engine_forward(e, &b, &loss);   // loss = engine(batch)
 *         zt_engine_backward(e);             // engine.backward(loss)
 *         zt_engine_step(e);                 // engine.step(): updates only at an accumulation boundary
 *     }
 *
 * As in DeepSpeed, backward scales the gradients by 1/gradient_accumulation_steps, and step()
 * counts every micro-step but at a boundary (the gas-th micro-step since the last optimizer step,
 * DeepSpeed's (micro_steps + 1) % gas == 0 with micro_steps counted from 0 after a checkpoint
 * load) computes the global gradient norm, clips (gradient_clipping), applies the optimizer with
 * the schedule's lr, zeroes the gradients and advances the schedule. */
#ifndef ZTRAIN_ENGINE_H
#define ZTRAIN_ENGINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ztrain/data.h"
#include "ztrain/ds_config.h"
#include "ztrain/loss_scaler.h"
#include "ztrain/lr_schedule.h"
#include "ztrain/model.h"
#include "ztrain/optimizer.h"
#include "ztrain/status.h"

typedef struct zt_engine zt_engine;

/* Model-state bytes one rank holds, measured (resident pages of the flat buffers; the optimizer
 * state's size — with offload, what stays in memory: host state and the buffers the NVMe files
 * stream through), as maxima over the steps since they were last read. */
typedef struct {
    double params_bytes, grads_bytes, optimizer_bytes;
    /* Mixed precision on the CPU: the fp32 working copy of the layers in use (parameters and
     * gradients), which a backend with 16-bit kernels would not need. 0 in fp32. */
    double workspace_bytes;
} zt_engine_memory;

typedef struct zt_comm zt_comm;

typedef struct {
    uint64_t seed;       /* weight init (unless init_from) and data shuffling */
    bool shuffle;        /* shuffle the training data each epoch */
    int rank;            /* this process's data-parallel rank */
    int job_rank;        /* its rank in the job (rank's equal without a pipeline or TP): the rank
                            that messages and NVMe offload directories name */
    zt_comm *comm;       /* the job's communicator; NULL for one rank */
    FILE *log;           /* where DeepSpeed-style lines go (steps_per_print, wall_clock_breakdown);
                            NULL: silent */
    const char *job_name; /* names the per-run directories of NVMe offload; NULL: "job" */
    zt_device device;    /* the backend the engine computes on (the job's "device") */
    int threads;         /* CPU threads of the backend; 0: the OpenMP default */
    /* Pipeline parallelism (engine/pipe/pipe_engine.c): the stage of the model this rank holds (NULL:
     * the whole model). With a stage, comm connects the stage's data-parallel replicas, rank is
     * this rank's replica, and stage_comm connects the stages of its replica (NULL: one stage):
     * the squared gradient norm is summed over it, a tied copy (zt_tensor_info.tied_copy) left
     * out, so every stage sees the global norm and skips an overflowing step together. */
    const zt_model_stage *stage;
    zt_comm *stage_comm;
    /* Tensor parallelism (ztrain/tp.h): this rank holds shard tp_rank of tp_size of every
     * sharded layer and tp_comm connects the shards (NULL and 0 without). comm then connects the
     * replicas of this shard (the data-parallel group) and rank is the replica. The gradient
     * norm counts each tensor once: shards summed over tp_comm, whole tensors (held alike by
     * every shard) once. */
    int tp_size, tp_rank;
    zt_comm *tp_comm;
    /* A pipeline stage with tensor parallelism: every rank of this replica (its stages × its
     * shards), over which the gradient norm is summed instead of stage_comm or tp_comm. */
    zt_comm *norm_comm;
} zt_engine_options;

/* One micro-batch: inputs and targets [B, T], engine-owned until the next zt_engine_next_batch. */
typedef struct {
    const int32_t *inputs;
    const int32_t *targets;
    int B, T;
    /* Loss-masked data: each input's position inside its packed document [B, T]
     * (zt_loader_next_docs), which restarts the attention and the positions; NULL: one document
     * per row. */
    const int32_t *doc_pos;
} zt_batch;

/* Wall-clock time of the last optimizer step's phases, in milliseconds, summed over its
 * micro-steps (DeepSpeed's fwd, bwd, step timers), and the part of each that this thread spent
 * communicating (zt_comm_thread_ms: in collectives, or waiting for ZeRO's communication thread).
 * backward_comm_ms is DeepSpeed's bwd_allreduce and backward_ms - backward_comm_ms its bwd_inner. */
typedef struct {
    double forward_ms, backward_ms, step_ms;
    double forward_comm_ms, backward_comm_ms, step_comm_ms;
} zt_engine_timers;

/* Builds the model (weights from spec->init_from, else initialised from the seed), the optimizer
 * and the schedule from the config, and a loader over train_data (may be NULL: then batches come
 * from the caller). train_data must outlive the engine. Free with zt_engine_destroy(). */
zt_status zt_engine_create(zt_engine **out, const zt_ds_config *ds, const zt_model_spec *spec,
                           const zt_dataset *train_data, const zt_engine_options *opts);
void zt_engine_destroy(zt_engine *e);

/* Fills *b with the next micro-batch of this rank's share of the training data. */
zt_status zt_engine_next_batch(zt_engine *e, zt_batch *b);
/* Fills *b with micro-batch `micro` (0 to gradient_accumulation_steps - 1) of the next optimizer
 * step, for a caller that draws a step's micro-batches before it counts them with
 * zt_engine_step (a pipeline stage). With loss-masked data they must come in order, from 0:
 * the whole step is drawn and its trained targets counted over opts.comm before micro-batch 0,
 * at the last step's zt_engine_step when that step's micro-batches came from here (under its
 * one wait), else at micro-batch 0 itself (a collective). A micro out of range (or out of
 * order, masked) is ZT_ERR_INVALID. */
zt_status zt_engine_step_batch(zt_engine *e, int micro, zt_batch *b);

/* How a micro-batch whose targets include `counted` trained ones (targets >= 0) enters the
 * step: the returned factor multiplies the gradient of its summed token losses (the loss
 * scale over the step's divisor: counted × gradient_accumulation_steps, or with loss-masked
 * data the global batch's trained targets over the data-parallel size, which the gradient
 * average divides out), 0 when nothing counts; *loss_share (may be NULL) turns its mean token
 * loss into the value whose mean over the step's micro-batches and ranks is the step's loss.
 * With loss-masked data, valid once the step's micro-batch 0 has been drawn. */
float zt_engine_grad_scale(const zt_engine *e, int counted, double *loss_share);

/* Forward pass with the loss of the batch (mean token cross-entropy) in *loss, which waits for
 * the device. With loss NULL the loss is not waited for: it stays on the device until the
 * step's one synchronisation, at the accumulation boundary's zt_engine_step, after which
 * zt_engine_step_losses has it (docs/gpu.md, "Host round trips"). */
zt_status zt_engine_forward(zt_engine *e, const zt_batch *b, float *loss);
/* The losses of the current step's micro-batches, in order (gradient_accumulation_steps of
 * them, each as zt_engine_forward gives it), complete from the boundary's synchronisation
 * inside zt_engine_step (when the step gate runs) until the next step's first forward.
 * Engine-owned. */
const float *zt_engine_step_losses(const zt_engine *e);
/* The step's table, for a caller that judges every rank's step alike (the trainer's step gate
 * and stop requests): with zt_engine_set_step_table(e, values, over) called once before the
 * first micro-step, every boundary's zt_engine_step gathers over the communicator `over` (every
 * rank of it steps its engine alike; NULL: this rank alone), for each of its ranks in rank
 * order, that rank's micro-batch losses (gradient_accumulation_steps of them, as
 * zt_engine_step_losses gives them there) and then the `values` numbers it wrote at
 * zt_engine_step_table_in before that zt_engine_step. zt_engine_step_table has them,
 * [ranks of over][gradient_accumulation_steps + values] (NULL without a table), from the step's
 * one synchronisation (the gate and the check see it) until the next boundary. Where `over`
 * reads device memory (NCCL, with this engine's backend attached: zt_comm_attach_backend) the
 * ranks' entries are all-gathered on the device under that one wait: each rank's summed token
 * losses with the counts and shares that make them its losses, by the same arithmetic, so they
 * are the bits the rank computed; elsewhere (shm, gloo) each rank's row is all-gathered on the
 * host after the read, which waits for nothing on the device. */
zt_status zt_engine_set_step_table(zt_engine *e, int values, zt_comm *over);
double *zt_engine_step_table_in(zt_engine *e);
const double *zt_engine_step_table(const zt_engine *e);
/* Waits for the device and returns its first error, naming it: what the last step's update (not
 * waited for by zt_engine_step) may have met. Before reading results out of the engine. */
zt_status zt_engine_sync(zt_engine *e);
/* Backward of the last forward, accumulating gradients scaled by 1/gas. */
zt_status zt_engine_backward(zt_engine *e);
/* Counts a micro-step; at an accumulation boundary, updates the weights. Fails with
 * ZT_ERR_NUMERIC (naming the step) when the gradient norm is not finite. */
zt_status zt_engine_step(zt_engine *e);

/* A step's gate: called once at every accumulation boundary, after the gradients are reduced and
 * before the update, with the optimizer step's number (global_steps + 1) and the global gradient
 * norm (unscaled; the same on every rank; NaN with overflow true when the fp16 loss scaler found
 * an overflow and will skip the step anyway). It may use the communicator (every rank calls it at
 * the same point). Returning true holds the update back: the gradients are dropped and the step
 * counts as skipped (global_steps and skipped_steps advance, the lr schedule, the optimizer's step
 * count and the loss scale do not). Held, a non-finite norm is no error. How the trainer applies
 * the job's anomaly policies (ztrain/anomaly.h). */
typedef bool (*zt_engine_step_gate)(void *ctx, int64_t step, double grad_norm, bool overflow);
void zt_engine_set_step_gate(zt_engine *e, zt_engine_step_gate gate, void *ctx);

/* A step's check: called once at every accumulation boundary right after the step's one
 * synchronisation (zt_engine_step_losses are complete, and whatever else the caller queued
 * before zt_engine_step has come back), on every rank, before the norm is combined, the gate
 * asked or anything applied. A status other than ZT_OK fails the step with it: nothing is
 * updated and zt_engine_step returns it. It may use the communicator. How the pipeline compares
 * what its stages trained on before the step that trained it takes effect. */
typedef zt_status (*zt_engine_step_check)(void *ctx);
void zt_engine_set_step_check(zt_engine *e, zt_engine_step_check check, void *ctx);

/* Loss of a batch without gradients (evaluation). */
zt_status zt_engine_eval_loss(zt_engine *e, const zt_batch *b, float *loss);

bool zt_engine_is_gradient_accumulation_boundary(const zt_engine *e);
bool zt_engine_was_step_applied(const zt_engine *e);

int64_t zt_engine_global_steps(const zt_engine *e);   /* optimizer steps taken */
/* Samples of the optimizer steps taken: each step's train_batch_size added up (DeepSpeed's
 * running global_samples, restored from a checkpoint), whatever batch size earlier runs had. */
int64_t zt_engine_global_samples(const zt_engine *e);
/* Loss-masked data (data.format "masked"): the trained targets of the current (or last) step's
 * global batch over every rank, the loss's divisor, and in *all (may be NULL) all its targets.
 * 0 for unmasked data. */
double zt_engine_trained_tokens(const zt_engine *e, double *all);
int64_t zt_engine_micro_steps(const zt_engine *e);
int64_t zt_engine_skipped_steps(const zt_engine *e);
double zt_engine_get_lr(const zt_engine *e);          /* lr the next update uses */
double zt_engine_get_momentum(const zt_engine *e);
/* The pre-clip gradient norm of the last step that was applied or held by the step gate (a
 * held step's own, NaN when it was not finite); an overflow step keeps the one before, as
 * DeepSpeed's get_global_grad_norm does. */
double zt_engine_global_grad_norm(const zt_engine *e);
zt_engine_timers zt_engine_get_timers(const zt_engine *e);
/* Model-state memory held by this rank since the last call (see zt_engine_memory). */
zt_engine_memory zt_engine_take_memory(zt_engine *e);
/* This rank's place in the data-parallel group (its ZeRO partition, optim_rank_<r>), and its rank
 * in the job (what messages name; the same without a pipeline or TP). */
int zt_engine_rank(const zt_engine *e);
int zt_engine_job_rank(const zt_engine *e);
int zt_engine_world_size(const zt_engine *e);
zt_comm *zt_engine_comm(zt_engine *e);
/* The slice of the flat buffers this rank owns, and the partition size (see engine/include/ztrain/zero.h). */
void zt_engine_partition(const zt_engine *e, size_t *own_lo, size_t *part);
/* Gathers every parameter on every rank (collective; stage 3 releases them again with
 * zt_engine_release_unowned) — for writing full weights. */
zt_status zt_engine_gather_params(zt_engine *e);
void zt_engine_release_unowned(zt_engine *e);
/* After new fp32 weights were written into the model's parameters (a checkpoint): every rank
 * takes its share (stage 3) and its 16-bit parameters and fp32 masters (mixed precision), into
 * the offload files where they live there (which can fail). */
zt_status zt_engine_params_loaded(zt_engine *e);

/* ZeRO-3 checkpoints (checkpoint.c). Whether the parameters are partitioned (stage 3), so that
 * each rank saves and loads only its slice; that slice's elements [first, first + count) as fp32
 * into host memory dst (widened from 16 bits in mixed precision); one layer (-1: the outer
 * tensors) gathered on every rank until zt_engine_release_layer (collective), for a consolidated
 * model file written a layer at a time; and a parameter load in which read(ctx, lo, dst, n)
 * supplies flat elements [lo, lo + n) and is asked only for what this rank keeps, after which
 * the engine takes them as zt_engine_params_loaded does. */
bool zt_engine_params_sharded(const zt_engine *e);
zt_status zt_engine_read_own_params(zt_engine *e, size_t first, float *dst, size_t count);
zt_status zt_engine_gather_layer(zt_engine *e, int layer);
void zt_engine_release_layer(zt_engine *e, int layer);
typedef zt_status (*zt_engine_param_reader)(void *ctx, size_t lo, float *dst, size_t n);
zt_status zt_engine_load_params(zt_engine *e, zt_engine_param_reader read, void *ctx);

/* Mixed precision. The loss scale (1 unless fp16), the scaler itself (its state goes into
 * checkpoints) and whether bf16/fp16 training is on. The fp32 master weights are state like the
 * optimizer's: zt_engine_read_state (ZT_STATE_MASTER) reads them wherever they live. */
double zt_engine_loss_scale(const zt_engine *e);
zt_loss_scaler *zt_engine_loss_scaler(zt_engine *e);
bool zt_engine_mixed_precision(const zt_engine *e);

/* The optimizer's state and the fp32 masters of this rank's slice, wherever they live (in memory,
 * or offloaded to host buffers or NVMe files), for checkpoints: elements [first, first + count)
 * of the slice the optimizer updates (the whole flat buffer at stage 0, else the partition from
 * zt_engine_partition). EXP_AVG is Adam's first moment or SGD's momentum buffer. */
typedef enum { ZT_STATE_MASTER, ZT_STATE_EXP_AVG, ZT_STATE_EXP_AVG_SQ } zt_state_kind;
bool zt_engine_has_state(const zt_engine *e, zt_state_kind kind);
zt_status zt_engine_read_state(zt_engine *e, zt_state_kind kind, size_t first, float *dst,
                               size_t count);
zt_status zt_engine_write_state(zt_engine *e, zt_state_kind kind, size_t first, const float *src,
                                size_t count);

/* The gradients this rank accumulates before any reduction, in the model's flat layout: the
 * model's fp32 grads, or in mixed precision at ZeRO stages 0 and 1 the 16-bit gradient buffer
 * (*dtype says which). Pipeline stages sum a tied tensor's gradient there. Valid until the
 * engine is destroyed. */
void *zt_engine_local_grads(zt_engine *e, zt_dtype *dtype);

zt_model *zt_engine_model(zt_engine *e);
const zt_ds_config *zt_engine_config(const zt_engine *e);
zt_loader *zt_engine_loader(zt_engine *e);           /* NULL without train data */
/* Where the steps taken have got to in the training data (the loader's epoch and position in
 * this rank's share): what a checkpoint saves. With loss-masked data the loader itself may be a
 * step further, the next step drawn ahead. Only with train data. */
void zt_engine_data_position(const zt_engine *e, int64_t *epoch, int64_t *pos);
/* Moves the training data to (epoch, pos) (zt_loader_seek), dropping what was drawn ahead: the
 * next step starts there. Only with train data. */
void zt_engine_seek_data(zt_engine *e, int64_t epoch, int64_t pos);
zt_optimizer *zt_engine_optimizer(zt_engine *e);
zt_lr_schedule *zt_engine_schedule(zt_engine *e);

/* Restores counters after loading a checkpoint (the schedule and optimizer are restored through
 * their own accessors). The next micro-step starts a step of the current
 * gradient_accumulation_steps, whatever micro_steps says: a checkpoint holds whole steps, and a
 * resume may change gas. */
void zt_engine_set_counters(zt_engine *e, int64_t global_steps, int64_t global_samples,
                            int64_t micro_steps, int64_t skipped_steps);

#endif
