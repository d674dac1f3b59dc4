/* The pipeline engine (engine/pipe/pipe_engine.c): one rank's stage of a pipelined job, running
 * DeepSpeed's TrainSchedule and InferenceSchedule (ztrain/pipeline.h) through the model's stage
 * API, with the data-parallel reduction, ZeRO 0/1, the optimizer and the loss scaler of the
 * ordinary engine (ztrain/engine.h), which it owns. Internal to the engine: the trainer drives it.
 *
 * Ranks form DeepSpeed's grid: rank = stage · dp + replica, and with tensor parallelism
 * (tensor_parallel.autotp_size tp) rank = (stage · dp + replica) · tp + tp_rank (ztrain/tp.h): each
 * stage is then tp shards, each talking to the same shard of the neighbouring stages. Every
 * replica reads its share of the data as a non-pipelined rank with the same data-parallel index
 * would; its first stage takes the micro-batch's tokens and its last stage the targets. */
#ifndef ZTRAIN_PIPE_ENGINE_H
#define ZTRAIN_PIPE_ENGINE_H

#include "ztrain/comm.h"
#include "ztrain/data.h"
#include "ztrain/engine.h"
#include "ztrain/job_spec.h"
#include "ztrain/pipeline.h"

typedef struct zt_pipe zt_pipe;

/* Where this rank sits in the grid. */
typedef struct {
    int stages, stage, dp, replica;
    int tp, tp_rank;              /* the stage's TP shards and this rank's (1 and 0 without) */
    int micro_batches;            /* gradient_accumulation_steps */
    int first_layer, last_layer;  /* the transformer blocks of this stage */
} zt_pipe_info;

/* Builds this rank's stage of job (job->pipeline.stages > 1) over world (the job's communicator,
 * which must outlive the pipe): the partition of the model's layers, the groups of the stage's
 * replicas and of the replica's stages, and an engine over the stage's model (base supplies the
 * seed, shuffle, device, threads, log and job name; the pipe sets rank, comm and stage).
 * train_data must outlive the pipe. A partition that leaves a stage without layers, a world that
 * is not stages × dp, ZeRO 2/3: ZT_ERR_INVALID / ZT_ERR_UNSUPPORTED naming the key. Free with
 * zt_pipe_destroy, which destroys the engine. */
zt_status zt_pipe_create(zt_pipe **out, const zt_job_spec *job, const zt_dataset *train_data,
                         zt_comm *world, const zt_engine_options *base);
void zt_pipe_destroy(zt_pipe *p);

/* The part of the model stage `stage` of job->pipeline.stages holds under
 * job->pipeline.partition (buffers left 1: the caller sets them, zt_pipe_train_buffers), its
 * layers' parameters counted on stage models made on a backend of `device` (their sizes do not
 * depend on it): what a rank builds, and what the device estimate counts (admission.h). The
 * embedding always goes with the first stage and the head with the last, as DeepSpeed's
 * partitions of a GPT-style layer list place them. An error names pipeline.partition. */
zt_status zt_pipe_stage_plan(const zt_job_spec *job, zt_device device, int stage,
                             zt_model_stage *out);
/* Every stage's plan, out[job->pipeline.stages], from one measure of the layer list and one
 * partition (zt_pipe_stage_plan builds the small models that measure it at each call): the
 * first stage left without layers is the error, as zt_pipe_stage_plan's for that stage. */
zt_status zt_pipe_stage_plans(const zt_job_spec *job, zt_device device, zt_model_stage *out);
/* What the workers' partition (zt_pipe_stage_plan) would refuse, judged from the spec alone,
 * without building a model: a type:REGEX that does not compile, matches no layer type or leaves
 * a stage without a block, in zt_pipe_partition's words. The memory estimate calls it
 * (admission.h), so that `ztrain validate`, `run` and ztraind refuse such a job before a rank
 * starts. */
zt_status zt_pipe_check_partition(const zt_job_spec *job);

zt_engine *zt_pipe_engine(zt_pipe *p);
zt_pipe_info zt_pipe_get_info(const zt_pipe *p);
/* The partition every rank builds, parts[stages + 1] as DeepSpeed's PipelineModule.parts: stage
 * s holds layers [parts[s], parts[s + 1]) of the layer list (embed, n_layer blocks, head).
 * Owned by p. */
const int *zt_pipe_parts(const zt_pipe *p);
/* zt_comm_dev_counts summed over every communicator the stage's device buffers travel on: world
 * (its activations and their gradients) and the pipe's groups (the tied gradient, the replicas'
 * reduction, the norm over the stages, the stages' agreement), so a caller can tell a transport's staging apart from
 * the stage's own host round trips. */
zt_comm_dev_stats zt_pipe_dev_counts(const zt_pipe *p);

/* The result of one batch, the same on every rank of the job. */
typedef struct {
    double loss;     /* DeepSpeed's: the mean over micro-batches, averaged over the replicas */
    double tokens;   /* tokens of the batch over all replicas */
    double bubble;   /* measured idle fraction of the schedule, averaged over replica 0's stages:
                        time outside forward and backward over the schedule's time (the
                        reductions and the optimizer step left out) */
} zt_pipe_batch_result;

/* Runs one training batch (TrainSchedule over gradient_accumulation_steps micro-batches, then
 * the tied and data-parallel reductions and the optimizer step). Collective over the job. */
zt_status zt_pipe_train_batch(zt_pipe *p, zt_pipe_batch_result *res);

/* Evaluation through the InferenceSchedule: the mean loss over `steps` micro-batches that the
 * first and last stages read from val (a loader over this replica's share), averaged over the
 * replicas, into *loss on every rank. Collective over the job. */
zt_status zt_pipe_eval(zt_pipe *p, zt_loader *val, int steps, double *loss);

#endif
