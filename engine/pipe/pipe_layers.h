/* Which part of the model a pipeline stage holds (engine/pipe/pipe_layers.c): the layer list a model
 * offers DeepSpeed's partition methods, and the stage the partition gives a rank. Internal to
 * the pipeline engine. */
#ifndef ZTRAIN_PIPE_LAYERS_H
#define ZTRAIN_PIPE_LAYERS_H

#include "ztrain/job_spec.h"
#include "ztrain/model.h"
#include "ztrain/pipe_engine.h"
#include "ztrain/pipeline.h"

/* The layer list of job's model, as DeepSpeed's PipelineModule would see its layer specs:
 * "embed" (token and position embeddings), n_layer × "block", "head" (final norm and LM head,
 * a tied head counting its copy of the embedding), with their trainable parameter counts,
 * measured on stage models of the job's family. layers[n_layer + 2]. */
zt_status zt_pipe_model_layers(const zt_model_spec *spec, zt_device device,
                               zt_pipe_layer *layers);

#endif
