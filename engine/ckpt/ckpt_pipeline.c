/* The marker and the stage directories of a pipelined job's checkpoints (ckpt_pipeline.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ztrain/ckpt_pipeline.h"
#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"

#define FORMAT "ztrain-pipeline"
#define MAX_STAGES 4096

/* The marker's stage count, or 0 when root is not one. */
static int marker_stages(const cJSON *root) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "stages");
    return cJSON_IsString(fmt) && strcmp(fmt->valuestring, FORMAT) == 0 && cJSON_IsNumber(st) &&
                   st->valuedouble >= 1 && st->valuedouble <= MAX_STAGES
               ? (int)st->valuedouble
               : 0;
}

/* dir/pipeline.json parsed, or NULL when missing or unreadable. */
static cJSON *load_marker(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/pipeline.json", dir);
    cJSON *root = NULL;
    if (!zt_path_exists(path) || zt_json_load_file(path, &root) != ZT_OK)
        return NULL;
    return root;
}

int zt_ckpt_pipeline_stages(const char *dir) {
    cJSON *root = load_marker(dir);
    int stages = root ? marker_stages(root) : 0;
    cJSON_Delete(root);
    return stages;
}

/* The marker's "parts" into out->parts when they are stages + 1 rising layer indices starting
 * at 0; else left NULL (a marker written before they were recorded). */
static void read_parts(const cJSON *root, zt_ckpt_pipeline *out) {
    const cJSON *parts = cJSON_GetObjectItemCaseSensitive(root, "parts");
    if (!cJSON_IsArray(parts) || cJSON_GetArraySize(parts) != out->stages + 1)
        return;
    int *p = calloc((size_t)out->stages + 1, sizeof *p);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, parts) {
        if (!p || !cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6 ||
            (i == 0 && v->valuedouble != 0) || (i > 0 && (int)v->valuedouble <= p[i - 1])) {
            free(p);
            return;
        }
        p[i++] = (int)v->valuedouble;
    }
    out->parts = p;
}

int zt_ckpt_pipeline_read(const char *dir, zt_ckpt_pipeline *out) {
    memset(out, 0, sizeof *out);
    cJSON *root = load_marker(dir);
    out->stages = root ? marker_stages(root) : 0;
    if (out->stages > 0) {
        const char *method =
            cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "partition"));
        snprintf(out->partition, sizeof out->partition, "%s", method ? method : "");
        read_parts(root, out);
    }
    cJSON_Delete(root);
    return out->stages;
}

void zt_ckpt_pipeline_free(zt_ckpt_pipeline *p) {
    free(p->parts);
    p->parts = NULL;
}

void zt_ckpt_pipeline_describe_parts(const int *parts, int stages, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int s = 0; s <= stages && used < size; s++) {
        int n = snprintf(buf + used, size - used, "%s%d%s", s ? ", " : "[", parts[s],
                         s == stages ? "]" : "");
        used += n > 0 ? (size_t)n : 0;
    }
}

void zt_ckpt_stage_dir(char *out, size_t size, const char *dir, int stage) {
    snprintf(out, size, "%s/stage_%02d", dir, stage);
}

zt_status zt_ckpt_write_pipeline(const char *dir, int stages, const char *partition,
                                 const int *parts) {
    char path[4200];
    ZT_TRY(zt_mkdirs(dir));
    snprintf(path, sizeof path, "%s/pipeline.json", dir);
    cJSON *root = cJSON_CreateObject();
    if (root) {
        cJSON_AddStringToObject(root, "format", FORMAT);
        cJSON_AddNumberToObject(root, "stages", stages);
        cJSON_AddStringToObject(root, "partition", partition);
        cJSON_AddItemToObject(root, "parts", cJSON_CreateIntArray(parts, stages + 1));
    }
    /* A marker short of a field would not say what it must. */
    char *text = root && cJSON_GetArraySize(root) == 4 ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    char *line = text ? malloc(strlen(text) + 2) : NULL;
    if (!line) {
        free(text);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    }
    int n = sprintf(line, "%s\n", text);
    free(text);
    zt_status s = zt_write_file_atomic(path, line, (size_t)n);
    free(line);
    return s;
}
