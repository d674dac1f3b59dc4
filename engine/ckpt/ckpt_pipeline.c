/* The marker and the stage directories of a pipelined job's checkpoints (ckpt_pipeline.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ztrain/ckpt_pipeline.h"
#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"

#define FORMAT "ztrain-pipeline"

int zt_ckpt_pipeline_stages(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/pipeline.json", dir);
    if (!zt_path_exists(path))
        return 0;
    cJSON *root;
    if (zt_json_load_file(path, &root) != ZT_OK)
        return 0;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "stages");
    int stages = cJSON_IsString(fmt) && strcmp(fmt->valuestring, FORMAT) == 0 &&
                 cJSON_IsNumber(st) && st->valuedouble >= 1 && st->valuedouble <= 4096
                     ? (int)st->valuedouble
                     : 0;
    cJSON_Delete(root);
    return stages;
}

void zt_ckpt_stage_dir(char *out, size_t size, const char *dir, int stage) {
    snprintf(out, size, "%s/stage_%02d", dir, stage);
}

zt_status zt_ckpt_write_pipeline(const char *dir, int stages) {
    char path[4200], text[128];
    ZT_TRY(zt_mkdirs(dir));
    snprintf(path, sizeof path, "%s/pipeline.json", dir);
    int n = snprintf(text, sizeof text, "{\"format\": \"" FORMAT "\", \"stages\": %d}\n", stages);
    return zt_write_file_atomic(path, text, (size_t)n);
}
