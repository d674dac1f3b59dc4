/* Which part of the model a pipeline stage holds (engine/pipe/pipe_layers.c): the layer list a model
 * offers DeepSpeed's partition methods, and the stage the partition gives a rank. Internal to
 * the pipeline engine. */
#ifndef ZTRAIN_PIPE_LAYERS_H
#define ZTRAIN_PIPE_LAYERS_H

#include "ztrain/job_spec.h"
#include "ztrain/model.h"
#include "ztrain/pipeline.h"

/* The layer list of job's model, as DeepSpeed's PipelineModule would see its layer specs:
 * "embed" (token and position embeddings), n_layer × "block", "head" (final norm and LM head,
 * a tied head counting its copy of the embedding), with their trainable parameter counts,
 * measured on stage models of the job's family. layers[n_layer + 2]. */
zt_status zt_pipe_model_layers(const zt_model_spec *spec, zt_device device,
                               zt_pipe_layer *layers);

/* The part of the model stage `stage` of job->pipeline.stages holds under
 * job->pipeline.partition (buffers left 1: the caller sets them). The embedding always goes with
 * the first stage and the head with the last, as DeepSpeed's partitions of a GPT-style layer
 * list place them. An error names pipeline.partition. */
zt_status zt_pipe_stage_plan(const zt_job_spec *job, zt_device device, int stage,
                             zt_model_stage *out);

#endif
