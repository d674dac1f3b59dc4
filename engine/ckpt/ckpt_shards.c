/* ZeRO-3 checkpoints without gathering (ckpt_shards.h): each rank saves and loads only its own
 * slice of the parameters, the consolidated model is written a layer at a time when the config
 * asks for it, and the shards are read as one flat buffer (by loads here, and by ckpt_weights.c,
 * which reads a checkpoint's weights for export). */
#include "ckpt_shards.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/comm.h"
#include "ztrain/fsutil.h"
#include "ztrain/safetensors.h"

#define PATH_BYTES 4400

bool zt_ckpt_st_meta_size(const zt_st_file *f, const char *key, size_t *out) {
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

void zt_ckpt_shards_meta(zt_engine *e, cJSON *meta, bool sharded, bool gathered) {
    const zt_model *m = zt_engine_model(e);
    if (sharded)
        cJSON_AddNumberToObject(meta, "model_shards", zt_engine_world_size(e));
    if (sharded && gathered)
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

void zt_ckpt_shards_close(zt_ckpt_shard_set *set) {
    for (int r = 0; r < set->n; r++)
        zt_st_close(&set->s[r].f);
    free(set->s);
    memset(set, 0, sizeof *set);
}

/* Opens the n_files files "<stem>_<r>.safetensors" of tagdir, each a slice of n_params values
 * (0: of what the first one says) in its 1-D tensor `tensor`; with `optional`, files without that
 * tensor leave the set empty when none has it (optimizer files of a run without masters). */
static zt_status open_slices(zt_ckpt_shard_set *set, const char *tagdir, const char *stem,
                             const char *tensor, int n_files, size_t n_params, bool optional) {
    memset(set, 0, sizeof *set);
    char path[PATH_BYTES];
    snprintf(path, sizeof path, "%s/%s_%05d.safetensors", tagdir, stem, 0);
    if (optional && !zt_path_exists(path))
        return ZT_OK; /* saved without an optimizer */
    set->s = calloc((size_t)n_files, sizeof *set->s);
    if (!set->s)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", tagdir);
    set->n_params = n_params;
    for (int r = 0; r < n_files; r++) {
        snprintf(path, sizeof path, "%s/%s_%05d.safetensors", tagdir, stem, r);
        zt_ckpt_shard *sh = &set->s[r];
        zt_status s = zt_st_open(&sh->f, path);
        if (s != ZT_OK) {
            zt_ckpt_shards_close(set);
            return s;
        }
        set->n = r + 1;
        size_t total = 0;
        sh->t = zt_st_find(&sh->f, tensor);
        if (optional && r == 0 && !sh->t) {
            zt_ckpt_shards_close(set);
            return ZT_OK;
        }
        bool has_total = zt_ckpt_st_meta_size(&sh->f, "n_params", &total);
        if (r == 0 && n_params == 0 && has_total)
            n_params = set->n_params = total;
        if (!sh->t || sh->t->ndim != 1 ||
            !zt_ckpt_st_meta_size(&sh->f, "partition_offset", &sh->lo) ||
            !has_total || total != n_params ||
            sh->lo > n_params || (size_t)sh->t->shape[0] > n_params - sh->lo) {
            zt_ckpt_shards_close(set);
            return zt_error(ZT_ERR_FORMAT, "%s: not a slice of the %zu parameters (a 1-D "
                            "'%s' tensor with partition_offset and n_params metadata)", path,
                            n_params, tensor);
        }
        sh->n = (size_t)sh->t->shape[0];
    }
    return ZT_OK;
}

zt_status zt_ckpt_shards_open(zt_ckpt_shard_set *set, const char *tagdir, int n_shards,
                              size_t n_params) {
    return open_slices(set, tagdir, "model_rank", "params", n_shards, n_params, false);
}

zt_status zt_ckpt_masters_open(zt_ckpt_shard_set *set, const char *tagdir, int n_files,
                               size_t n_params) {
    return open_slices(set, tagdir, "optim_rank", "fp32_master", n_files, n_params, true);
}

zt_status zt_ckpt_shards_read(const zt_ckpt_shard_set *set, size_t lo, float *dst, size_t n) {
    size_t covered = 0;
    for (int r = 0; r < set->n; r++) {
        const zt_ckpt_shard *sh = &set->s[r];
        size_t a = lo > sh->lo ? lo : sh->lo;
        size_t b = lo + n < sh->lo + sh->n ? lo + n : sh->lo + sh->n;
        if (a >= b)
            continue;
        ZT_TRY(zt_st_read_f32_range(&sh->f, sh->t, a - sh->lo, dst + (a - lo), b - a));
        ZT_TRY(zt_st_check_finite(&sh->f, sh->t, dst + (a - lo), a - sh->lo, b - a));
        covered += b - a;
    }
    if (covered != n)
        return zt_error(ZT_ERR_FORMAT, "%s: the model shards do not hold parameters [%zu, %zu)",
                        set->n ? set->s[0].f.path : "checkpoint", lo, lo + n);
    return ZT_OK;
}

static zt_status read_shards(void *ctx, size_t lo, float *dst, size_t n) {
    return zt_ckpt_shards_read(ctx, lo, dst, n);
}

zt_status zt_ckpt_load_param_shards(zt_engine *e, const char *tagdir, int n_shards) {
    zt_ckpt_shard_set set;
    ZT_TRY(zt_ckpt_shards_open(&set, tagdir, n_shards, zt_engine_model(e)->n_params));
    zt_status s = zt_engine_load_params(e, read_shards, &set);
    zt_ckpt_shards_close(&set);
    return s;
}
