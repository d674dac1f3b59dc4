/* A pipelined job's checkpoint directory (internal; README "Pipeline parallelism" states the
 * layout): DIR/pipeline.json ({"format": "ztrain-pipeline", "stages": S, "partition": METHOD,
 * "parts": [0, ..., n_layer + 2]}: the stage count, pipeline.partition and the stage boundaries
 * it resolved to, DeepSpeed's PipelineModule.parts over the layer list embed, n_layer blocks,
 * head; markers written before the partition was recorded hold the stages alone) and DIR/stage_<ss>/
 * for each stage, an ordinary checkpoint directory (ztrain/checkpoint.h) that the stage's
 * replicas save and load as a data-parallel job of their own; its model.safetensors holds the
 * stage's tensors under their Hugging Face names, the last stage's tied copy of the embedding
 * included. Readers of weights (zt_ckpt_weights_open, hence export and zero-to-fp32) see the
 * union of the stages as one model. */
#ifndef ZTRAIN_CKPT_PIPELINE_H
#define ZTRAIN_CKPT_PIPELINE_H

#include <stddef.h>

#include "ztrain/status.h"

/* The stages of the pipelined checkpoint directory dir, or 0 when dir is not one. */
int zt_ckpt_pipeline_stages(const char *dir);

/* dir/stage_<ss> into out[size]. */
void zt_ckpt_stage_dir(char *out, size_t size, const char *dir, int stage);

/* dir/pipeline.json read. */
typedef struct {
    int stages;          /* 0: dir is not a pipelined checkpoint directory */
    char partition[128]; /* the method saved, "" when the marker does not say */
    int *parts;          /* [stages + 1], or NULL when the marker does not record them */
} zt_ckpt_pipeline;

/* Reads dir's marker into out and returns out->stages (0: none, or not one). Free with
 * zt_ckpt_pipeline_free. */
int zt_ckpt_pipeline_read(const char *dir, zt_ckpt_pipeline *out);
void zt_ckpt_pipeline_free(zt_ckpt_pipeline *p);

/* "[0, 3, 6]" for messages: parts[0..stages]. */
void zt_ckpt_pipeline_describe_parts(const int *parts, int stages, char *buf, size_t size);

/* Writes dir/pipeline.json (dir made when missing): stages, the partition method and
 * parts[stages + 1], the boundaries it resolved to (zt_pipe_parts). */
zt_status zt_ckpt_write_pipeline(const char *dir, int stages, const char *partition,
                                 const int *parts);

#endif
