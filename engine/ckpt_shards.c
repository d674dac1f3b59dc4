/* ZeRO-3 checkpoints without gathering (ckpt_shards.h): each rank saves and loads only its own
 * slice of the parameters, the consolidated model is written a layer at a time when the config
 * asks for it, and a checkpoint's weights are read tensor by tensor from whichever files hold
 * them (checkpoint.h's zt_ckpt_weights, which `ztrain export` and `zero-to-fp32` stream from). */
#include "ckpt_shards.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "model_fields.h"
#include "size_math.h"
#include "ztrain/comm.h"
#include "ztrain/safetensors.h"

#define PATH_BYTES 4400

static void shard_path(char *out, size_t size, const char *tagdir, int rank) {
    snprintf(out, size, "%s/model_rank_%05d.safetensors", tagdir, rank);
}

/* A number stored as a string in a safetensors file's metadata; false when absent or not one. */
static bool meta_number(const zt_st_file *f, const char *key, size_t *out) {
    cJSON *m = f->metadata_json ? cJSON_Parse(f->metadata_json) : NULL;
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(m, key);
    char *end = NULL;
    bool ok = cJSON_IsString(item) && item->valuestring[0] >= '0' && item->valuestring[0] <= '9';
    if (ok) {
        unsigned long long v = strtoull(item->valuestring, &end, 10);
        ok = *end == '\0';
        *out = (size_t)v;
    }
    cJSON_Delete(m);
    return ok;
}

/* ------------------------------------------------------------------------------------------ */
/* Saving                                                                                      */

typedef struct {
    zt_engine *e;
    size_t first; /* the file's first element within this rank's slice */
} own_reader;

static zt_status read_own(void *ctx, size_t first, float *dst, size_t n) {
    own_reader *r = ctx;
    return zt_engine_read_own_params(r->e, r->first + first, dst, n);
}

zt_status zt_ckpt_save_param_shard(zt_engine *e, const char *path) {
    size_t own_lo, part, n = zt_engine_model(e)->n_params;
    zt_engine_partition(e, &own_lo, &part);
    size_t lo = own_lo < n ? own_lo : n, hi = own_lo + part < n ? own_lo + part : n;
    own_reader reader = {e, 0};
    zt_st_entry entry = {"params", NULL, 1, {(int64_t)(hi - lo)}};
    zt_st_source source = {read_own, &reader};
    char offset[32], total[32];
    snprintf(offset, sizeof offset, "%zu", lo);
    snprintf(total, sizeof total, "%zu", n);
    const char *keys[] = {"partition_offset", "n_params"};
    const char *values[] = {offset, total};
    return zt_st_write_sources(path, &entry, &source, 1, keys, values, 2);
}

/* The gathers of a consolidated save, the same sequence on every rank: along the model's tensors,
 * a layer is gathered whenever the next tensor belongs to another than the one held (which is
 * let go first). Rank 0 advances it from the writer's callbacks, the others in one loop. */
typedef struct {
    zt_engine *e;
    int next;       /* the next tensor whose layer has not been brought in yet */
    int held;       /* the layer gathered now; INT_MIN for none */
    zt_status status;
} layer_walk;

static void walk_release(layer_walk *w) {
    if (w->held != INT_MIN)
        zt_engine_release_layer(w->e, w->held);
    w->held = INT_MIN;
}

/* Advances through tensor `upto` (inclusive), gathering the layers on the way. */
static zt_status walk_to(layer_walk *w, int upto) {
    const zt_model *m = zt_engine_model(w->e);
    for (; w->next <= upto && w->status == ZT_OK; w->next++) {
        const zt_tensor_info *t = &m->tensors[w->next];
        if (t->numel == 0 || t->layer == w->held)
            continue;
        walk_release(w);
        w->status = zt_engine_gather_layer(w->e, t->layer);
        if (w->status == ZT_OK)
            w->held = t->layer;
    }
    return w->status;
}

typedef struct {
    layer_walk *walk;
    int tensor;
} gathered_reader;

static zt_status read_gathered(void *ctx, size_t first, float *dst, size_t n) {
    gathered_reader *r = ctx;
    ZT_TRY(walk_to(r->walk, r->tensor));
    const zt_model *m = zt_engine_model(r->walk->e);
    const zt_tensor_info *t = &m->tensors[r->tensor];
    ZT_ASSERT(r->walk->held == t->layer);
    zt_backend_copy(m->ctx.be, dst, m->params + t->offset + first, n * sizeof(float),
                    ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    return ZT_OK;
}

static zt_st_dtype training_dtype(const zt_engine *e) {
    const zt_ds_config *ds = zt_engine_config(e);
    return ds->bf16.enabled ? ZT_ST_BF16 : ds->fp16.enabled ? ZT_ST_F16 : ZT_ST_F32;
}

zt_status zt_ckpt_save_gathered_model(zt_engine *e, const char *path) {
    const zt_model *m = zt_engine_model(e);
    layer_walk walk = {e, 0, INT_MIN, ZT_OK};
    zt_status s = ZT_OK;
    if (zt_engine_rank(e) == 0) {
        zt_st_entry *entries = calloc((size_t)m->n_tensors, sizeof *entries);
        zt_st_source *sources = calloc((size_t)m->n_tensors, sizeof *sources);
        gathered_reader *readers = calloc((size_t)m->n_tensors, sizeof *readers);
        zt_st_dtype *dtypes = calloc((size_t)m->n_tensors, sizeof *dtypes);
        if (entries && sources && readers && dtypes) {
            for (int i = 0; i < m->n_tensors; i++) {
                const zt_tensor_info *t = &m->tensors[i];
                entries[i] = (zt_st_entry){t->name, NULL, t->ndim, {t->shape[0], t->shape[1]}};
                dtypes[i] = training_dtype(e);
                readers[i] = (gathered_reader){&walk, i};
                sources[i] = (zt_st_source){read_gathered, &readers[i]};
            }
            zt_model_st_metadata meta;
            int n_meta = zt_model_st_metadata_of(&m->spec, &meta);
            s = zt_st_write_typed(path, entries, sources, dtypes, m->n_tensors, meta.keys,
                                  meta.values, n_meta);
        } else {
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
        }
        free(entries);
        free(sources);
        free(readers);
        free(dtypes);
    }
    /* Whatever happened to the file, every rank takes part in every gather of the sequence. */
    zt_status g = walk_to(&walk, m->n_tensors - 1);
    walk_release(&walk);
    return g != ZT_OK ? g : s;
}

void zt_ckpt_shards_meta(zt_engine *e, cJSON *meta, bool gathered) {
    const zt_model *m = zt_engine_model(e);
    cJSON_AddNumberToObject(meta, "model_shards", zt_engine_world_size(e));
    if (gathered)
        cJSON_AddStringToObject(meta, "model_file", "model.safetensors");
    cJSON *params = cJSON_AddArrayToObject(meta, "params");
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        cJSON *row = cJSON_CreateArray();
        cJSON_AddItemToArray(row, cJSON_CreateString(t->name));
        cJSON_AddItemToArray(row, cJSON_CreateNumber((double)t->offset));
        cJSON *shape = cJSON_CreateArray();
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToArray(row, shape);
        cJSON_AddItemToArray(params, row);
    }
}

int zt_ckpt_meta_shards(const cJSON *meta) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(meta, "model_shards");
    return cJSON_IsNumber(n) && n->valuedouble >= 1 && n->valuedouble <= ZT_MAX_WORLD
               ? (int)n->valuedouble
               : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The shards as one flat buffer                                                               */

typedef struct {
    zt_st_file f;
    const zt_st_tensor *t;
    size_t lo, n; /* the flat elements [lo, lo + n) it holds */
} shard;

typedef struct {
    shard *s;
    int n;
    size_t n_params;
} shard_set;

static void shards_close(shard_set *set) {
    for (int r = 0; r < set->n; r++)
        zt_st_close(&set->s[r].f);
    free(set->s);
    memset(set, 0, sizeof *set);
}

/* Opens the n_shards model_rank files of tagdir, each checked to be a slice of n_params (0: of
 * what the first one says). */
static zt_status shards_open(shard_set *set, const char *tagdir, int n_shards, size_t n_params) {
    memset(set, 0, sizeof *set);
    set->s = calloc((size_t)n_shards, sizeof *set->s);
    if (!set->s)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", tagdir);
    set->n_params = n_params;
    for (int r = 0; r < n_shards; r++) {
        char path[PATH_BYTES];
        shard_path(path, sizeof path, tagdir, r);
        shard *sh = &set->s[r];
        zt_status s = zt_st_open(&sh->f, path);
        if (s != ZT_OK) {
            shards_close(set);
            return s;
        }
        set->n = r + 1;
        size_t total = 0;
        sh->t = zt_st_find(&sh->f, "params");
        bool has_total = meta_number(&sh->f, "n_params", &total);
        if (r == 0 && n_params == 0 && has_total)
            n_params = set->n_params = total;
        if (!sh->t || sh->t->ndim != 1 || !meta_number(&sh->f, "partition_offset", &sh->lo) ||
            !has_total || total != n_params ||
            sh->lo > n_params || (size_t)sh->t->shape[0] > n_params - sh->lo) {
            shards_close(set);
            return zt_error(ZT_ERR_FORMAT, "%s: not a slice of the %zu parameters (a 1-D "
                            "'params' tensor with partition_offset and n_params metadata)", path,
                            n_params);
        }
        sh->n = (size_t)sh->t->shape[0];
    }
    return ZT_OK;
}

/* Flat elements [lo, lo + n) from the shards that hold them; every one must be held. */
static zt_status shards_read(const shard_set *set, size_t lo, float *dst, size_t n) {
    size_t covered = 0;
    for (int r = 0; r < set->n; r++) {
        const shard *sh = &set->s[r];
        size_t a = lo > sh->lo ? lo : sh->lo;
        size_t b = lo + n < sh->lo + sh->n ? lo + n : sh->lo + sh->n;
        if (a >= b)
            continue;
        ZT_TRY(zt_st_read_f32_range(&sh->f, sh->t, a - sh->lo, dst + (a - lo), b - a));
        covered += b - a;
    }
    if (covered != n)
        return zt_error(ZT_ERR_FORMAT, "%s: the model shards do not hold parameters [%zu, %zu)",
                        set->n ? set->s[0].f.path : "checkpoint", lo, lo + n);
    return ZT_OK;
}

static zt_status read_shards(void *ctx, size_t lo, float *dst, size_t n) {
    return shards_read(ctx, lo, dst, n);
}

zt_status zt_ckpt_load_param_shards(zt_engine *e, const char *tagdir, int n_shards) {
    shard_set set;
    ZT_TRY(shards_open(&set, tagdir, n_shards, zt_engine_model(e)->n_params));
    zt_status s = zt_engine_load_params(e, read_shards, &set);
    shards_close(&set);
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* Reading a checkpoint's weights (checkpoint.h)                                               */

struct zt_ckpt_weights {
    zt_ckpt_tensor *tensors;
    size_t *offsets;      /* sharded: each tensor's flat offset */
    const zt_st_tensor **in_file; /* model.safetensors: each tensor's entry */
    int n;
    shard_set shards;     /* sharded checkpoints */
    zt_st_file model;     /* the others: model.safetensors */
    bool sharded, model_open;
};

void zt_ckpt_weights_close(zt_ckpt_weights *w) {
    if (!w)
        return;
    for (int i = 0; i < w->n; i++)
        free((char *)w->tensors[i].name);
    free(w->tensors);
    free(w->offsets);
    free(w->in_file);
    shards_close(&w->shards);
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

/* Every tensor of the layout must lie within the shards' parameters. */
static zt_status check_layout(const zt_ckpt_weights *w, const char *tagdir) {
    for (int i = 0; i < w->n; i++)
        if (w->offsets[i] > w->shards.n_params ||
            w->tensors[i].numel > w->shards.n_params - w->offsets[i])
            return zt_error(ZT_ERR_FORMAT, "%s/meta.json: params[%d] ('%s') lies outside the %zu "
                            "parameters of the model shards", tagdir, i, w->tensors[i].name,
                            w->shards.n_params);
    return ZT_OK;
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

zt_status zt_ckpt_weights_open(zt_ckpt_weights **out, const char *dir, const char *tag,
                               zt_model_spec *spec) {
    char tagdir[4096];
    cJSON *meta;
    *out = NULL;
    ZT_TRY(zt_ckpt_open_meta(dir, tag, tagdir, sizeof tagdir, &meta));
    zt_ckpt_weights *w = calloc(1, sizeof *w);
    zt_status s = w ? zt_ckpt_meta_spec(meta, tagdir, spec)
                    : zt_error(ZT_ERR_NOMEM, "%s: out of memory", tagdir);
    int n_shards = zt_ckpt_meta_shards(meta);
    if (s == ZT_OK && n_shards > 0) {
        w->sharded = true;
        s = tensors_from_meta(w, meta, tagdir);
        if (s == ZT_OK)
            s = shards_open(&w->shards, tagdir, n_shards, 0);
        if (s == ZT_OK)
            s = check_layout(w, tagdir);
    } else if (s == ZT_OK) {
        s = tensors_from_file(w, tagdir);
    }
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
    if (w->sharded)
        return shards_read(&w->shards, w->offsets[i] + first, dst, n);
    return zt_st_read_f32_range(&w->model, w->in_file[i], first, dst, n);
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
    ZT_TRY(zt_ckpt_weights_open(&w, dir, tag, &spec));
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
