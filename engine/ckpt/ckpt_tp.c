/* Tensor-parallel checkpoints (ckpt_tp.h): the layout file, resharding on load, and the whole
 * tensors that readers of weights see (ckpt_tp_weights.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ckpt_tp_weights.h"
#include "ztrain/checkpoint.h"
#include "ztrain/ckpt_tp.h"
#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"
#include "ztrain/optimizer.h"
#include "ztrain/safetensors.h"

#define FORMAT "ztrain-tensor-parallel"

void zt_ckpt_tp_shard_dir(char *out, size_t size, const char *dir, int tp_rank) {
    snprintf(out, size, "%s/tp_%02d", dir, tp_rank);
}

cJSON *zt_ckpt_tp_layout_json(const zt_model *m) {
    cJSON *root = cJSON_CreateObject(), *list = cJSON_CreateArray();
    cJSON_AddNumberToObject(root, "tp", zt_model_stage_tp(&m->stage));
    cJSON_AddItemToObject(root, "tensors", list);
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        cJSON *row = cJSON_CreateArray(), *shape = cJSON_CreateArray();
        cJSON_AddItemToArray(row, cJSON_CreateString(t->name));
        cJSON_AddItemToArray(row, cJSON_CreateNumber(t->tp_dim));
        cJSON_AddItemToArray(row, cJSON_CreateNumber(t->tp_groups));
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->full_shape[d]));
        cJSON_AddItemToArray(row, shape);
        /* A piece several shards hold alike (kv heads fewer than TP ranks): how many pieces. */
        if (t->tp_dim >= 0 && t->tp_shared > 1)
            cJSON_AddItemToArray(row, cJSON_CreateNumber(t->tp_pieces));
        cJSON_AddItemToArray(list, row);
    }
    return root;
}

zt_status zt_ckpt_write_tp(const char *dir, const zt_model *m) {
    char path[4200];
    ZT_TRY(zt_mkdirs(dir));
    cJSON *root = zt_ckpt_tp_layout_json(m);
    cJSON_AddStringToObject(root, "format", FORMAT);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
    snprintf(path, sizeof path, "%s/tp.json", dir);
    zt_status s = zt_write_file_atomic(path, text, strlen(text));
    free(text);
    return s;
}

/* ---- The layout ---------------------------------------------------------------------------- */

zt_status zt_ckpt_tp_layout_read(const char *dir, zt_ckpt_tp_layout *out) {
    char path[4200];
    memset(out, 0, sizeof *out);
    snprintf(path, sizeof path, "%s/tp.json", dir);
    cJSON *root;
    ZT_TRY(zt_json_load_file(path, &root));
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    zt_status s = cJSON_IsString(fmt) && strcmp(fmt->valuestring, FORMAT) == 0
                      ? zt_ckpt_tp_layout_parse(root, path, out)
                      : zt_error(ZT_ERR_FORMAT, "%s: not a ztrain tensor-parallel layout", path);
    cJSON_Delete(root);
    return s;
}

zt_status zt_ckpt_tp_layout_parse(const cJSON *root, const char *path, zt_ckpt_tp_layout *out) {
    memset(out, 0, sizeof *out);
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "tp");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    zt_status s = ZT_OK;
    if (!cJSON_IsNumber(tp) || tp->valuedouble < 1 || tp->valuedouble > ZT_MAX_WORLD ||
        !cJSON_IsArray(list))
        s = zt_error(ZT_ERR_FORMAT, "%s: not a ztrain tensor-parallel layout", path);
    int n = s == ZT_OK ? cJSON_GetArraySize(list) : 0;
    if (s == ZT_OK) {
        out->tp = (int)tp->valuedouble;
        out->t = calloc((size_t)(n ? n : 1), sizeof *out->t);
        if (!out->t)
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < n && s == ZT_OK; i++) {
        const cJSON *row = cJSON_GetArrayItem(list, i);
        const cJSON *name = cJSON_GetArrayItem(row, 0), *dim = cJSON_GetArrayItem(row, 1);
        const cJSON *groups = cJSON_GetArrayItem(row, 2), *shape = cJSON_GetArrayItem(row, 3);
        const cJSON *pieces = cJSON_GetArrayItem(row, 4);
        int ndim = cJSON_GetArraySize(shape);
        zt_tensor_info *t = &out->t[i];
        bool ok = cJSON_IsString(name) && strlen(name->valuestring) < sizeof t->name &&
                  cJSON_IsNumber(dim) && cJSON_IsNumber(groups) && cJSON_IsArray(shape) &&
                  ndim >= 1 && ndim <= 2 && dim->valuedouble >= -1 && dim->valuedouble < ndim &&
                  groups->valuedouble >= 1 && cJSON_GetArraySize(row) <= 5 &&
                  (!pieces || (cJSON_IsNumber(pieces) && pieces->valuedouble >= 1 &&
                               pieces->valuedouble <= out->tp &&
                               out->tp % (int)pieces->valuedouble == 0));
        int64_t whole[2] = {0, 0};
        for (int d = 0; ok && d < ndim; d++) {
            const cJSON *v = cJSON_GetArrayItem(shape, d);
            ok = cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble < 9e15;
            whole[d] = ok ? (int64_t)v->valuedouble : 0;
        }
        const int g = ok ? (int)groups->valuedouble : 1, dd = ok ? (int)dim->valuedouble : -1;
        const int np = ok && pieces ? (int)pieces->valuedouble : out->tp;
        if (ok && dd >= 0 && whole[dd] % ((int64_t)g * np) != 0)
            ok = false;
        if (!ok) {
            s = zt_error(ZT_ERR_FORMAT, "%s: tensors[%d] is not [name, dim, groups, [shape]] "
                         "or [name, dim, groups, [shape], pieces] with pieces dividing tp and "
                         "the shape's dimension dim divisible by groups · pieces (pieces: tp "
                         "when not given)", path, i);
            break;
        }
        snprintf(t->name, sizeof t->name, "%s", name->valuestring);
        t->ndim = ndim;
        t->full_shape[0] = whole[0];
        t->full_shape[1] = whole[1];
        t->tp_dim = dd;
        t->tp_groups = g;
        t->tp_pieces = dd >= 0 ? np : 1;
        t->tp_shared = dd >= 0 ? out->tp / np : out->tp;
        out->n++;
    }
    if (s != ZT_OK)
        zt_ckpt_tp_layout_free(out);
    return s;
}

void zt_ckpt_tp_layout_free(zt_ckpt_tp_layout *l) {
    free(l->t);
    memset(l, 0, sizeof *l);
}

int zt_ckpt_tp_size(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tp.json", dir);
    if (!zt_path_exists(path))
        return 0;
    zt_ckpt_tp_layout l;
    if (zt_ckpt_tp_layout_read(dir, &l) != ZT_OK)
        return 0;
    int tp = l.tp;
    zt_ckpt_tp_layout_free(&l);
    return tp;
}

zt_tensor_info zt_ckpt_tp_piece(const zt_tensor_info *whole, int piece) {
    zt_tensor_info t = *whole;
    t.shape[0] = whole->full_shape[0];
    t.shape[1] = whole->full_shape[1];
    t.tp_piece = whole->tp_dim >= 0 ? piece : 0;
    if (whole->tp_dim >= 0)
        t.shape[whole->tp_dim] /= whole->tp_pieces;
    t.numel = (size_t)t.shape[0] * (t.ndim == 2 ? (size_t)t.shape[1] : 1);
    return t;
}

/* ---- Shards put together --------------------------------------------------------------------- */

zt_status zt_ckpt_tp_assemble(const zt_ckpt_tp_layout *l, int i, zt_ckpt_tp_read read,
                              void *ctx, float *whole) {
    const zt_tensor_info *w = &l->t[i];
    if (w->tp_dim < 0)
        return read(ctx, 0, i, zt_tensor_full_numel(w), whole);
    const zt_tensor_info first = zt_ckpt_tp_piece(w, 0);
    float *piece = malloc(first.numel * sizeof *piece);
    if (!piece)
        return zt_error(ZT_ERR_NOMEM, "out of memory putting %s together", w->name);
    zt_status s = ZT_OK;
    /* Piece p is held by shards [p · shared, (p + 1) · shared) alike: the first is read. */
    for (int p = 0; p < w->tp_pieces && s == ZT_OK; p++) {
        const zt_tensor_info t = zt_ckpt_tp_piece(w, p);
        s = read(ctx, p * w->tp_shared, i, t.numel, piece);
        if (s == ZT_OK)
            zt_tensor_shard_to_full(&t, piece, whole);
    }
    free(piece);
    return s;
}
