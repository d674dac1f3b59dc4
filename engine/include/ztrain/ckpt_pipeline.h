/* A pipelined job's checkpoint directory (internal; README "Pipeline parallelism" states the
 * layout): DIR/pipeline.json ({"format": "ztrain-pipeline", "stages": S}) and DIR/stage_<ss>/
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

/* Writes dir/pipeline.json (dir made when missing). */
zt_status zt_ckpt_write_pipeline(const char *dir, int stages);

#endif
