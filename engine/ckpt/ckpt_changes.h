/* What a checkpoint's meta.json says of the run that wrote it, beside the counters a load
 * restores (ckpt_changes.c): its precision and whether it trained with fp16's dynamic loss
 * scaler, read from checkpoints that predate those keys too. */
#ifndef ZTRAIN_CKPT_CHANGES_H
#define ZTRAIN_CKPT_CHANGES_H

#include <stdbool.h>

#include <cjson/cJSON.h>
#include "ztrain/ds_config.h"
#include "ztrain/job_spec.h"

/* "fp32", "fp16" or "bf16": meta.json's "precision", else what its "deepspeed" section enables;
 * NULL when neither says (a checkpoint written without a job, or precision "auto"). */
const char *zt_ckpt_meta_precision(const cJSON *meta);

/* Whether the run that wrote meta.json had fp16's dynamic loss scaler, the only one whose state
 * a new run's dynamic scaler may take: loss_scaler.dynamic, else its deepspeed section (fp16
 * enabled without a static fp16.loss_scale); true when neither says, as before these keys. */
bool zt_ckpt_meta_dynamic_scaler(const cJSON *meta);

/* The precision a DeepSpeed config trains in, by the same names. */
const char *zt_ckpt_precision_name(const zt_ds_config *ds);

/* data.train as the job gave it, for meta.json's data section: the path (or glob), or a
 * mixture's [{"path", "weight"}, ...]; cJSON null without one. The caller owns the result. */
cJSON *zt_ckpt_data_train_json(const zt_data_spec *d);

#endif
