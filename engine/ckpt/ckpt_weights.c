/* A checkpoint's weights read tensor by tensor (checkpoint.h's zt_ckpt_weights): from
 * model.safetensors, or for a ZeRO-3 checkpoint from the ranks' shards through meta.json's flat
 * layout, or the fp32 masters from the optimizer files through the same layout; and `ztrain
 * export` / `zero-to-fp32`, which stream the masters into one fp32 file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/ckpt_pipeline.h"
#include "ztrain/ckpt_tp.h"
#include "ckpt_shards.h"
#include "ckpt_tp_weights.h"
#include "ztrain/size_math.h"
#include "ztrain/safetensors.h"

#define PATH_BYTES 4400

struct zt_ckpt_weights {
    zt_ckpt_tensor *tensors;
    size_t *offsets;      /* sharded or masters: each tensor's flat offset */
    const zt_st_tensor **in_file; /* model.safetensors: each tensor's entry */
    int n;
    zt_ckpt_shard_set shards;     /* sharded checkpoints */
    zt_ckpt_shard_set masters;    /* ZT_CKPT_MASTER: the optimizer files' fp32 masters, if any */
    zt_st_file model;     /* the others: model.safetensors */
    bool sharded, model_open;
    /* A pipelined checkpoint: its stages' weights, and for each tensor of the union the stage
     * and the index there that supply it. */
    zt_ckpt_weights **parts;
    int n_parts;
    int *part, *index;
    /* A tensor-parallel checkpoint: parts are its shards, tensors the whole model's (tp.json),
     * each put together whole when first read (one at a time). */
    zt_ckpt_tp_layout *tp;
    float *whole;
    size_t whole_n;
    int whole_i;
};

void zt_ckpt_weights_close(zt_ckpt_weights *w) {
    if (!w)
        return;
    for (int i = 0; i < w->n; i++)
        free((char *)w->tensors[i].name);
    free(w->tensors);
    free(w->offsets);
    free(w->in_file);
    zt_ckpt_shards_close(&w->shards);
    zt_ckpt_shards_close(&w->masters);
    for (int i = 0; i < w->n_parts; i++)
        zt_ckpt_weights_close(w->parts[i]);
    free(w->parts);
    free(w->part);
    free(w->index);
    if (w->tp)
        zt_ckpt_tp_layout_free(w->tp);
    free(w->tp);
    free(w->whole);
    if (w->model_open)
        zt_st_close(&w->model);
    free(w);
}

/* The tensor list from meta.json's "params" ([[name, offset, [shape]], ...]). */
static zt_status tensors_from_meta(zt_ckpt_weights *w, const cJSON *meta, const char *tagdir) {
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(meta, "params");
    int n = cJSON_GetArraySize(params);
    w->tensors = calloc((size_t)(n ? n : 1), sizeof *w->tensors);
    w->offsets = calloc((size_t)(n ? n : 1), sizeof *w->offsets);
    if (!w->tensors || !w->offsets)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", tagdir);
    const cJSON *row;
    cJSON_ArrayForEach(row, params) {
        const cJSON *name = cJSON_GetArrayItem(row, 0), *off = cJSON_GetArrayItem(row, 1);
        const cJSON *shape = cJSON_GetArrayItem(row, 2);
        int ndim = cJSON_GetArraySize(shape);
        if (!cJSON_IsString(name) || !cJSON_IsNumber(off) || off->valuedouble < 0 ||
            !cJSON_IsArray(shape) || ndim < 1 || ndim > 2)
            return zt_error(ZT_ERR_FORMAT, "%s/meta.json: params[%d] is not [name, offset, "
                            "[shape]]", tagdir, w->n);
        zt_ckpt_tensor *t = &w->tensors[w->n];
        bool ov = off->valuedouble > 9e15;
        uint64_t numel = 1;
        t->ndim = ndim;
        for (int d = 0; d < ndim; d++) {
            const cJSON *dim = cJSON_GetArrayItem(shape, d);
            ov |= !cJSON_IsNumber(dim) || dim->valuedouble < 0 || dim->valuedouble > 9e15;
            t->shape[d] = ov ? 0 : (int64_t)dim->valuedouble;
            numel = zt_u64_mul(numel, (uint64_t)t->shape[d], &ov);
        }
        if (ov || numel > SIZE_MAX)
            return zt_error(ZT_ERR_FORMAT, "%s/meta.json: params[%d] has a bad offset or shape",
                            tagdir, w->n);
        t->numel = (size_t)numel;
        w->offsets[w->n] = (size_t)off->valuedouble;
        if (!(t->name = strdup(name->valuestring)))
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", tagdir);
        w->n++;
    }
    return ZT_OK;
}

/* Every tensor of the layout must lie within the flat parameters of the files read. */
static zt_status check_layout(const zt_ckpt_weights *w, const zt_ckpt_shard_set *set,
                              const char *files, const char *tagdir) {
    for (int i = 0; i < w->n; i++)
        if (w->offsets[i] > set->n_params || w->tensors[i].numel > set->n_params - w->offsets[i])
            return zt_error(ZT_ERR_FORMAT, "%s/meta.json: params[%d] ('%s') lies outside the %zu "
                            "parameters of the %s", tagdir, i, w->tensors[i].name,
                            set->n_params, files);
    return ZT_OK;
}

/* The flat offsets of model.safetensors' tensors w: meta.json's "params" where it has them,
 * else (a checkpoint saved before every meta.json recorded them) back to back in the file's
 * order, which is the flat buffer's (ckpt_tp_load.c reads the optimizer state so too). */
static zt_status file_offsets(zt_ckpt_weights *w, const cJSON *meta, const char *tagdir) {
    w->offsets = calloc((size_t)(w->n ? w->n : 1), sizeof *w->offsets);
    if (!w->offsets)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", tagdir);
    if (!cJSON_GetObjectItemCaseSensitive(meta, "params")) {
        for (int i = 1; i < w->n; i++)
            w->offsets[i] = w->offsets[i - 1] + w->tensors[i - 1].numel;
        return ZT_OK;
    }
    zt_ckpt_weights *layout = calloc(1, sizeof *layout);
    zt_status s = layout ? tensors_from_meta(layout, meta, tagdir)
                         : zt_error(ZT_ERR_NOMEM, "%s: out of memory", tagdir);
    for (int i = 0; i < w->n && s == ZT_OK; i++) {
        int k = 0;
        while (k < layout->n && strcmp(layout->tensors[k].name, w->tensors[i].name) != 0)
            k++;
        if (k == layout->n || layout->tensors[k].numel != w->tensors[i].numel)
            s = zt_error(ZT_ERR_FORMAT, "%s/meta.json: params %s '%s' of model.safetensors",
                         tagdir, k == layout->n ? "lacks" : "gives another shape for",
                         w->tensors[i].name);
        else
            w->offsets[i] = layout->offsets[k];
    }
    zt_ckpt_weights_close(layout);
    return s;
}

/* ZT_CKPT_MASTER: the optimizer files' fp32 masters over the flat parameters, where the
 * tensors lie at their flat offsets. The saving ranks' partitions together cover every
 * parameter, whatever the stage. */
static zt_status open_masters(zt_ckpt_weights *w, const cJSON *meta, const char *tagdir) {
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(meta, "world_size");
    if (!cJSON_IsNumber(ws) || ws->valuedouble < 1 || ws->valuedouble > ZT_MAX_WORLD)
        return zt_error(ZT_ERR_FORMAT, "%s/meta.json: world_size is missing or not a rank "
                        "count", tagdir);
    if (!w->sharded)
        ZT_TRY(file_offsets(w, meta, tagdir));
    /* n_params from the files: the layout is checked against it below. */
    ZT_TRY(zt_ckpt_masters_open(&w->masters, tagdir, (int)ws->valuedouble, 0));
    return w->masters.n ? check_layout(w, &w->masters, "optimizer files", tagdir) : ZT_OK;
}

/* The tensor list from model.safetensors, in the order of their data (the model's: the writer
 * writes them so). */
static int by_offset(const void *a, const void *b) {
    const zt_st_tensor *x = *(const zt_st_tensor *const *)a, *y = *(const zt_st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static zt_status tensors_from_file(zt_ckpt_weights *w, const char *tagdir) {
    char path[PATH_BYTES];
    snprintf(path, sizeof path, "%s/model.safetensors", tagdir);
    ZT_TRY(zt_st_open(&w->model, path));
    w->model_open = true;
    int n = w->model.n_tensors;
    w->tensors = calloc((size_t)(n ? n : 1), sizeof *w->tensors);
    w->in_file = calloc((size_t)(n ? n : 1), sizeof *w->in_file);
    if (!w->tensors || !w->in_file)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++)
        w->in_file[i] = &w->model.tensors[i];
    qsort(w->in_file, (size_t)n, sizeof *w->in_file, by_offset);
    for (; w->n < n; w->n++) {
        const zt_st_tensor *st = w->in_file[w->n];
        zt_ckpt_tensor *t = &w->tensors[w->n];
        if (st->ndim < 1 || st->ndim > 2)
            return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' has %d dimensions", path, st->name,
                            st->ndim);
        t->ndim = st->ndim;
        t->shape[0] = st->shape[0];
        t->shape[1] = st->ndim > 1 ? st->shape[1] : 0;
        t->numel = (size_t)zt_st_numel(st);
        if (!(t->name = strdup(st->name)))
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    }
    return ZT_OK;
}

/* Adds tensor i of stage part to the union unless an earlier stage supplied that name (the last
 * stage's tied copy of the embedding, which the first stage holds too). */
static zt_status union_add(zt_ckpt_weights *w, int part, int i) {
    const zt_ckpt_tensor *t = &w->parts[part]->tensors[i];
    for (int k = 0; k < w->n; k++)
        if (strcmp(w->tensors[k].name, t->name) == 0)
            return ZT_OK;
    w->tensors[w->n] = *t;
    if (!(w->tensors[w->n].name = strdup(t->name)))
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    w->part[w->n] = part;
    w->index[w->n] = i;
    w->n++;
    return ZT_OK;
}

/* A pipelined checkpoint read as one model: every stage at the same tag (by default the one the
 * first stage's `latest` names), the first stage's spec. */
static zt_status open_pipeline(zt_ckpt_weights *w, const char *dir, const char *tag, int stages,
                               zt_ckpt_values values, zt_model_spec *spec) {
    char sdir[4200], shard0[4300], latest[256];
    zt_ckpt_stage_dir(sdir, sizeof sdir, dir, 0);
    if (!tag) {
        /* A stage of a tensor-parallel pipeline keeps its tags in its shards' directories. */
        zt_ckpt_tp_shard_dir(shard0, sizeof shard0, sdir, 0);
        ZT_TRY(zt_ckpt_latest(zt_ckpt_tp_size(sdir) > 0 ? shard0 : sdir, latest, sizeof latest));
        tag = latest;
    }
    w->parts = calloc((size_t)stages, sizeof *w->parts);
    if (!w->parts)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
    int total = 0;
    for (int st = 0; st < stages; st++, w->n_parts++) {
        zt_model_spec other;
        zt_ckpt_stage_dir(sdir, sizeof sdir, dir, st);
        ZT_TRY(zt_ckpt_weights_open(&w->parts[st], sdir, tag, values, st == 0 ? spec : &other));
        total += w->parts[st]->n;
    }
    w->tensors = calloc((size_t)(total ? total : 1), sizeof *w->tensors);
    w->part = calloc((size_t)(total ? total : 1), sizeof *w->part);
    w->index = calloc((size_t)(total ? total : 1), sizeof *w->index);
    if (!w->tensors || !w->part || !w->index)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
    for (int st = 0; st < stages; st++)
        for (int i = 0; i < w->parts[st]->n; i++)
            ZT_TRY(union_add(w, st, i));
    return ZT_OK;
}

/* A tensor-parallel checkpoint read as one model: every shard at the same tag (by default the one
 * shard 0's `latest` names), shard 0's spec, the whole tensors of tp.json. */
static zt_status open_tp(zt_ckpt_weights *w, const char *dir, const char *tag,
                         zt_ckpt_values values, zt_model_spec *spec) {
    char sdir[4200], latest[256];
    w->tp = calloc(1, sizeof *w->tp);
    if (!w->tp)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
    ZT_TRY(zt_ckpt_tp_layout_at(dir, tag, w->tp));
    zt_ckpt_tp_shard_dir(sdir, sizeof sdir, dir, 0);
    if (!tag) {
        ZT_TRY(zt_ckpt_latest(sdir, latest, sizeof latest));
        tag = latest;
    }
    w->parts = calloc((size_t)w->tp->tp, sizeof *w->parts);
    w->tensors = calloc((size_t)(w->tp->n ? w->tp->n : 1), sizeof *w->tensors);
    if (!w->parts || !w->tensors)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
    for (int p = 0; p < w->tp->tp; p++, w->n_parts++) {
        zt_model_spec other;
        zt_ckpt_tp_shard_dir(sdir, sizeof sdir, dir, p);
        ZT_TRY(zt_ckpt_weights_open(&w->parts[p], sdir, tag, values, p == 0 ? spec : &other));
    }
    w->whole_i = -1;
    for (; w->n < w->tp->n; w->n++) {
        const zt_tensor_info *t = &w->tp->t[w->n];
        zt_ckpt_tensor *c = &w->tensors[w->n];
        c->ndim = t->ndim;
        c->shape[0] = t->full_shape[0];
        c->shape[1] = t->full_shape[1];
        c->numel = zt_tensor_full_numel(t);
        if (!(c->name = strdup(t->name)))
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
    }
    return ZT_OK;
}

/* zt_ckpt_tp_read over the shards' weights, by name. */
static zt_status read_tp_piece(void *ctx, int piece, int i, size_t n, float *dst) {
    zt_ckpt_weights *w = ctx, *part = w->parts[piece];
    for (int k = 0; k < part->n; k++)
        if (strcmp(part->tensors[k].name, w->tp->t[i].name) == 0) {
            /* With the tag's own layout (meta.json) only damage gets here; a tag saved before
             * meta.json kept it is read by tp.json, which a save at another TP size rewrote. */
            if (part->tensors[k].numel != n)
                return zt_error(ZT_ERR_FORMAT, "tensor-parallel shard %d holds %zu values of "
                                "'%s', its layout (tp %d) says %zu: was the tag saved at another "
                                "TP size? A checkpoint older than the layout in each tag's "
                                "meta.json has only tp.json, which describes the newest save",
                                piece, part->tensors[k].numel, w->tp->t[i].name, w->tp->tp, n);
            return zt_ckpt_weights_read(part, k, 0, dst, n);
        }
    return zt_error(ZT_ERR_FORMAT, "tensor-parallel shard %d has no tensor '%s'", piece,
                    w->tp->t[i].name);
}

zt_status zt_ckpt_weights_open(zt_ckpt_weights **out, const char *dir, const char *tag,
                               zt_ckpt_values values, zt_model_spec *spec) {
    char tagdir[4096];
    cJSON *meta;
    *out = NULL;
    int stages = zt_ckpt_pipeline_stages(dir);
    if (stages > 0 || zt_ckpt_tp_size(dir) > 0) {
        zt_ckpt_weights *w = calloc(1, sizeof *w);
        zt_status s = !w ? zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir)
                      : stages > 0 ? open_pipeline(w, dir, tag, stages, values, spec)
                                   : open_tp(w, dir, tag, values, spec);
        if (s != ZT_OK) {
            zt_ckpt_weights_close(w);
            return s;
        }
        *out = w;
        return ZT_OK;
    }
    ZT_TRY(zt_ckpt_open_meta(dir, tag, tagdir, sizeof tagdir, &meta));
    zt_ckpt_weights *w = calloc(1, sizeof *w);
    zt_status s = w ? zt_ckpt_meta_spec(meta, tagdir, spec)
                    : zt_error(ZT_ERR_NOMEM, "%s: out of memory", tagdir);
    int n_shards = zt_ckpt_meta_shards(meta);
    if (s == ZT_OK && n_shards > 0) {
        w->sharded = true;
        s = tensors_from_meta(w, meta, tagdir);
        if (s == ZT_OK)
            s = zt_ckpt_shards_open(&w->shards, tagdir, n_shards, 0);
        if (s == ZT_OK)
            s = check_layout(w, &w->shards, "model shards", tagdir);
    } else if (s == ZT_OK) {
        s = tensors_from_file(w, tagdir);
    }
    if (s == ZT_OK && values == ZT_CKPT_MASTER)
        s = open_masters(w, meta, tagdir);
    cJSON_Delete(meta);
    if (s != ZT_OK) {
        zt_ckpt_weights_close(w);
        return s;
    }
    *out = w;
    return ZT_OK;
}

int zt_ckpt_weights_count(const zt_ckpt_weights *w) { return w->n; }

const zt_ckpt_tensor *zt_ckpt_weights_tensor(const zt_ckpt_weights *w, int i) {
    ZT_ASSERT(i >= 0 && i < w->n);
    return &w->tensors[i];
}

zt_status zt_ckpt_weights_read(zt_ckpt_weights *w, int i, size_t first, float *dst, size_t n) {
    ZT_ASSERT(i >= 0 && i < w->n);
    const zt_ckpt_tensor *t = &w->tensors[i];
    if (first > t->numel || n > t->numel - first)
        return zt_error(ZT_ERR_INVALID, "checkpoint tensor '%s' has %zu elements, not [%zu, %zu)",
                        t->name, t->numel, first, first + n);
    if (w->tp) {
        if (w->whole_i != i) {
            if (t->numel > w->whole_n) {
                float *grown = realloc(w->whole, t->numel * sizeof *grown);
                if (!grown)
                    return zt_error(ZT_ERR_NOMEM, "out of memory putting '%s' together",
                                    t->name);
                w->whole = grown;
                w->whole_n = t->numel;
            }
            w->whole_i = -1;
            ZT_TRY(zt_ckpt_tp_assemble(w->tp, i, read_tp_piece, w, w->whole));
            w->whole_i = i;
        }
        memcpy(dst, w->whole + first, n * sizeof *dst);
        return ZT_OK;
    }
    if (w->parts)
        return zt_ckpt_weights_read(w->parts[w->part[i]], w->index[i], first, dst, n);
    if (w->masters.n)
        return zt_ckpt_shards_read(&w->masters, w->offsets[i] + first, dst, n);
    if (w->sharded)
        return zt_ckpt_shards_read(&w->shards, w->offsets[i] + first, dst, n);
    ZT_TRY(zt_st_read_f32_range(&w->model, w->in_file[i], first, dst, n));
    return zt_st_check_finite(&w->model, w->in_file[i], dst, first, n);
}

/* ------------------------------------------------------------------------------------------ */
/* Export                                                                                      */

typedef struct {
    zt_ckpt_weights *w;
    int tensor;
} weights_reader;

static zt_status read_weights(void *ctx, size_t first, float *dst, size_t n) {
    weights_reader *r = ctx;
    return zt_ckpt_weights_read(r->w, r->tensor, first, dst, n);
}

zt_status zt_ckpt_export_fp32(const char *dir, const char *tag, const char *out) {
    zt_ckpt_weights *w;
    zt_model_spec spec;
    ZT_TRY(zt_ckpt_weights_open(&w, dir, tag, ZT_CKPT_MASTER, &spec));
    int n = w->n;
    zt_st_entry *entries = calloc((size_t)(n ? n : 1), sizeof *entries);
    zt_st_source *sources = calloc((size_t)(n ? n : 1), sizeof *sources);
    weights_reader *readers = calloc((size_t)(n ? n : 1), sizeof *readers);
    zt_status s = ZT_OK;
    if (entries && sources && readers) {
        for (int i = 0; i < n; i++) {
            const zt_ckpt_tensor *t = &w->tensors[i];
            entries[i] = (zt_st_entry){t->name, NULL, t->ndim, {t->shape[0], t->shape[1]}};
            readers[i] = (weights_reader){w, i};
            sources[i] = (zt_st_source){read_weights, &readers[i]};
        }
        zt_model_st_metadata meta;
        int n_meta = zt_model_st_metadata_of(&spec, &meta);
        s = zt_st_write_sources(out, entries, sources, n, meta.keys, meta.values, n_meta);
    } else {
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", out);
    }
    free(entries);
    free(sources);
    free(readers);
    zt_ckpt_weights_close(w);
    return s;
}
