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

#endif
