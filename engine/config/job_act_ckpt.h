/* Activation checkpointing as a job asks for it (internal to libztrain): the job spec's switch,
 * Hugging Face's gradient_checkpointing and the DeepSpeed config's activation_checkpointing
 * section resolved into the model spec's checkpoint_interval and checkpoint_cpu. */
#ifndef ZTRAIN_JOB_ACT_CKPT_H
#define ZTRAIN_JOB_ACT_CKPT_H

#include "ztrain/json_util.h"
#include "ztrain/job_spec.h"

/* Sets job->model.checkpoint_interval (train.activation_checkpoint_interval when
 * train.activation_checkpointing or training_args.gradient_checkpointing is true, else 0) and
 * checkpoint_cpu (the DeepSpeed config's cpu_checkpointing, when the job checkpoints: by that
 * switch, or in a pipelined job by pipeline.activation_checkpoint_interval, which the stages'
 * model spec takes). An interval given without the switch is an error naming both keys;
 * cpu_checkpointing without checkpointing adds a warning to job->ds.warnings. Called once the
 * train section, training_args, the pipeline section and the DeepSpeed config are parsed. */
zt_status zt_job_activation_checkpointing(zt_job_spec *job, const zt_json_obj *top);

#endif
