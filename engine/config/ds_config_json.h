/* The DeepSpeed config parser's entry point for an already-parsed JSON tree (internal).
 *
 * The job spec embeds the DeepSpeed config as an object; it hands that object here instead of
 * printing and re-parsing it, so messages keep pointing at the job file. */
#ifndef ZTRAIN_DS_CONFIG_JSON_H
#define ZTRAIN_DS_CONFIG_JSON_H

#include <cjson/cJSON.h>

#include "ztrain/ds_config.h"

/* Reads a DeepSpeed config from `root` (which must be a JSON object) exactly as
 * zt_ds_config_parse() reads text: duplicate keys, types, defaults, batch inference, optimizer and
 * scheduler, then the "not supported yet" gate. `source` names the config in messages ("ds.json"
 * or "job.json: deepspeed"). The tree is only read; the caller keeps owning it. */
zt_status zt_ds_config_from_json(zt_ds_config *cfg, const cJSON *root, const char *source,
                                 int world_size);

/* As zt_ds_config_from_json, for the config of a job whose script supplies `args`: the tree is
 * copied and resolved first as Hugging Face's Trainer resolves it (HfTrainerDeepSpeedConfig's
 * trainer_config_process and trainer_config_finalize): every "auto" that the Trainer fills is
 * filled from args and ctx, a missing optimizer is the Trainer's AdamW (with a warning), missing
 * batch keys come from args, and a value the job set in args that differs from the config's is
 * the Trainer's mismatch error. cfg->resolved lists what was filled. On success *resolved (if not
 * NULL) is the resolved tree, which the caller deletes. */
zt_status zt_ds_config_from_script(zt_ds_config *cfg, const cJSON *root, const char *source,
                                   const zt_training_args *args, const zt_ds_auto_context *ctx,
                                   cJSON **resolved);

/* The effective config: the resolved tree with every value the engine uses written in, defaults
 * included (the keys the key table honours), as indented JSON text the caller frees with free(). */
char *zt_ds_config_effective_json(const zt_ds_config *cfg, const cJSON *resolved);

/* The "auto" values the resolution left: at a key the Trainer fills (left when the job gives
 * nothing to fill it with, e.g. stage3_* below stage 3) or DeepSpeed's own pipeline.stages, the
 * key is removed, so it takes its default; anywhere else "auto" is ZT_ERR_INVALID naming the
 * key. */
zt_status zt_ds_strip_auto(cJSON *root, const char *source);

/* Fills the "auto" values of root in place (see zt_ds_config_from_script); log receives the lines
 * for cfg->resolved, and batch_fills those of them about the batch keys, without the source
 * prefix ("\"auto\" train_batch_size = 8 (...)"), for an error about the batch to quote. */
zt_status zt_ds_resolve_auto(cJSON *root, const zt_training_args *args, const zt_ds_auto_context *ctx,
                             const char *source, char *log, size_t log_size, char *batch_fills,
                             size_t batch_fills_size);

#endif
