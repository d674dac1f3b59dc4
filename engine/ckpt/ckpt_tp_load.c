/* Loading a tensor-parallel checkpoint at any TP size (ckpt_tp.h): at the size it was saved at,
 * each shard's own directory; at another, every tensor and its optimizer state put together whole
 * from the saved shards through tp.json's layout, and this shard's piece taken. A checkpoint saved
 * without tensor parallelism is read the same way, as the one shard of a layout of whole
 * tensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ckpt_shards.h"
#include "ckpt_tp_weights.h"
#include "ztrain/checkpoint.h"
#include "ztrain/fsutil.h"
#include "ztrain/ckpt_tp.h"
#include "ztrain/optimizer.h"
#include "ztrain/safetensors.h"

/* One saved shard: its weights, its optimizer partitions, and where each layout tensor lies in
 * its flat buffer. */
typedef struct {
    zt_ckpt_weights *w;
    zt_st_file *files;
    size_t *file_offset; /* each partition's first flat element */
    int n_files;
    int *index;          /* [layout.n] the tensor's index in w, or -1 */
    size_t *flat;        /* [layout.n] its first element in the shard's flat buffer */
} saved_shard;

typedef struct {
    zt_ckpt_tp_layout layout;
    bool plain;          /* saved without TP: the one shard is the directory itself */
    saved_shard *shards;
    const char *state;   /* the optimizer tensor being read; NULL: parameters */
    bool absent;         /* the state tensor is in no partition (fp32 training has no masters) */
} reshard;

static zt_status open_shard(reshard *r, int p, const char *dir, const char *tag) {
    saved_shard *sh = &r->shards[p];
    char sdir[4200], tagdir[4400], path[4500];
    zt_model_spec spec;
    if (r->plain)
        snprintf(sdir, sizeof sdir, "%s", dir);
    else
        zt_ckpt_tp_shard_dir(sdir, sizeof sdir, dir, p);
    /* A plain checkpoint's weights are open already: its layout was read from them. */
    if (!sh->w)
        ZT_TRY(zt_ckpt_weights_open(&sh->w, sdir, tag, ZT_CKPT_WORKING, &spec));
    const int n = r->layout.n, have = zt_ckpt_weights_count(sh->w);
    sh->index = malloc((size_t)(n ? n : 1) * sizeof *sh->index);
    sh->flat = malloc((size_t)(n ? n : 1) * sizeof *sh->flat);
    if (!sh->index || !sh->flat)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", sdir);
    /* model.safetensors holds the shard's tensors in flat-buffer order, back to back. */
    for (int i = 0; i < n; i++) {
        size_t at = 0;
        sh->index[i] = -1;
        for (int k = 0; k < have; k++) {
            const zt_ckpt_tensor *t = zt_ckpt_weights_tensor(sh->w, k);
            if (strcmp(t->name, r->layout.t[i].name) == 0) {
                sh->index[i] = k;
                sh->flat[i] = at;
                break;
            }
            at += t->numel;
        }
        if (sh->index[i] < 0)
            return zt_error(ZT_ERR_FORMAT, "%s: shard %d has no tensor '%s', which tp.json "
                            "lists", sdir, p, r->layout.t[i].name);
    }
    cJSON *meta;
    ZT_TRY(zt_ckpt_open_meta(sdir, tag, tagdir, sizeof tagdir, &meta));
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(meta, "world_size");
    int world = cJSON_IsNumber(ws) && ws->valuedouble >= 1 && ws->valuedouble <= ZT_MAX_WORLD
                    ? (int)ws->valuedouble : 0;
    cJSON_Delete(meta);
    if (!world)
        return zt_error(ZT_ERR_FORMAT, "%s/meta.json: no world_size", tagdir);
    sh->files = calloc((size_t)world, sizeof *sh->files);
    sh->file_offset = calloc((size_t)world, sizeof *sh->file_offset);
    if (!sh->files || !sh->file_offset)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", tagdir);
    for (; sh->n_files < world; sh->n_files++) {
        snprintf(path, sizeof path, "%s/optim_rank_%05d.safetensors", tagdir, sh->n_files);
        if (!zt_path_exists(path))
            break; /* a checkpoint without an optimizer */
        ZT_TRY(zt_st_open(&sh->files[sh->n_files], path));
        bool placed = zt_ckpt_st_meta_size(&sh->files[sh->n_files], "partition_offset",
                                           &sh->file_offset[sh->n_files]);
        if (!placed) {
            sh->n_files++; /* closed with the others */
            return zt_error(ZT_ERR_FORMAT, "%s: no partition_offset metadata", path);
        }
    }
    return ZT_OK;
}

static void close_all(reshard *r) {
    for (int p = 0; r->shards && p < r->layout.tp; p++) {
        saved_shard *sh = &r->shards[p];
        zt_ckpt_weights_close(sh->w);
        for (int f = 0; f < sh->n_files; f++)
            zt_st_close(&sh->files[f]);
        free(sh->files);
        free(sh->file_offset);
        free(sh->index);
        free(sh->flat);
    }
    free(r->shards);
    zt_ckpt_tp_layout_free(&r->layout);
}

/* zt_ckpt_tp_read over the saved shards: parameters from the weights, optimizer state from the
 * partitions that cover the tensor's flat range. */
static zt_status read_piece(void *ctx, int piece, int i, size_t n, float *dst) {
    reshard *r = ctx;
    saved_shard *sh = &r->shards[piece];
    if (!r->state)
        return zt_ckpt_weights_read(sh->w, sh->index[i], 0, dst, n);
    const size_t lo = sh->flat[i], hi = lo + n;
    size_t covered = 0;
    bool found = false;
    for (int f = 0; f < sh->n_files; f++) {
        const zt_st_tensor *t = zt_st_find(&sh->files[f], r->state);
        if (!t)
            continue;
        if (t->dtype != ZT_ST_F32 || t->ndim != 1)
            return zt_error(ZT_ERR_FORMAT, "%s: '%s' is not a 1-D fp32 tensor",
                            sh->files[f].path, r->state);
        found = true;
        const size_t off = sh->file_offset[f], len = (size_t)t->shape[0];
        const size_t a = off > lo ? off : lo, b = off + len < hi ? off + len : hi;
        if (a < b) {
            memcpy(dst + (a - lo), (const float *)zt_st_data(&sh->files[f], t) + (a - off),
                   (b - a) * sizeof *dst);
            covered += b - a;
        }
    }
    if (!found) {
        r->absent = true;
        return ZT_OK;
    }
    if (covered != n)
        return zt_error(ZT_ERR_FORMAT, "tensor-parallel shard %d: the optimizer partitions "
                        "cover %zu of the %zu values of %s's '%s'", piece, covered, n,
                        r->layout.t[i].name, r->state);
    return ZT_OK;
}

static int layout_index(const zt_ckpt_tp_layout *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->t[i].name, name) == 0)
            return i;
    return -1;
}

/* My shard of layout tensor li (state NULL: the parameters) into mine[t->numel]; whole is
 * scratch of the whole tensor's size. */
static zt_status my_piece(reshard *r, const zt_tensor_info *t, int li, const char *state,
                          float *whole, float *mine) {
    r->state = state;
    r->absent = false;
    ZT_TRY(zt_ckpt_tp_assemble(&r->layout, li, read_piece, r, whole));
    zt_tensor_shard_from_full(t, whole, mine);
    return ZT_OK;
}

/* The optimizer tensors of a partition file, as checkpoint.c names them. */
static const char *state_name(const zt_optimizer *o, zt_state_kind k) {
    return k == ZT_STATE_MASTER ? "fp32_master"
           : k == ZT_STATE_EXP_AVG_SQ ? "exp_avg_sq"
           : o->cfg.type != ZT_OPTIM_SGD ? "exp_avg" : "momentum_buffer";
}

static zt_status fill(void *ctx, zt_engine *e, int64_t optimizer_step) {
    reshard *r = ctx;
    zt_model *m = zt_engine_model(e);
    size_t most = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        int li = layout_index(&r->layout, t->name);
        const zt_tensor_info *w = li >= 0 ? &r->layout.t[li] : NULL;
        if (!w || w->ndim != t->ndim || w->full_shape[0] != t->full_shape[0] ||
            w->full_shape[1] != t->full_shape[1])
            return zt_error(ZT_ERR_FORMAT, "tensor-parallel checkpoint: %s is %s %s", t->name,
                            w ? "of another shape in" : "not in",
                            r->plain ? "the checkpoint saved without tensor parallelism"
                                     : "tp.json");
        size_t n = zt_tensor_full_numel(t);
        most = n > most ? n : most;
    }
    float *whole = malloc((most ? most : 1) * sizeof *whole);
    float *mine = malloc((most ? most : 1) * sizeof *mine);
    zt_status s = whole && mine ? ZT_OK : zt_error(ZT_ERR_NOMEM, "out of memory resharding");
    for (int i = 0; i < m->n_tensors && s == ZT_OK; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        s = my_piece(r, t, layout_index(&r->layout, t->name), NULL, whole, mine);
        if (s == ZT_OK)
            s = zt_model_set_params(m, t->offset, mine, t->numel);
    }
    if (s == ZT_OK)
        s = zt_engine_params_loaded(e);
    zt_optimizer *o = zt_engine_optimizer(e);
    /* This rank's optimizer slice of the flat buffer, as load_optimizer (checkpoint.c) takes it. */
    size_t own_lo = 0, part = 0;
    if (o)
        zt_engine_partition(e, &own_lo, &part);
    const size_t base = o && o->n == part ? own_lo : 0, lo = base;
    const size_t hi = o ? (base + o->n < m->n_params ? base + o->n : m->n_params) : 0;
    static const zt_state_kind kinds[] = {ZT_STATE_EXP_AVG, ZT_STATE_EXP_AVG_SQ, ZT_STATE_MASTER};
    for (int k = 0; o && k < 3 && s == ZT_OK; k++) {
        if (!zt_engine_has_state(e, kinds[k]))
            continue;
        for (int i = 0; i < m->n_tensors && s == ZT_OK; i++) {
            const zt_tensor_info *t = &m->tensors[i];
            size_t a = t->offset > lo ? t->offset : lo;
            size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
            if (a >= b)
                continue;
            s = my_piece(r, t, layout_index(&r->layout, t->name), state_name(o, kinds[k]),
                         whole, mine);
            if (s != ZT_OK || r->absent)
                break; /* fp32 training saved no masters: they stay the loaded weights */
            s = zt_engine_write_state(e, kinds[k], a - base, mine + (a - t->offset), b - a);
        }
    }
    if (o && s == ZT_OK)
        o->t = optimizer_step;
    free(whole);
    free(mine);
    return s;
}

/* The layout of a checkpoint saved without tensor parallelism, from its open weights w: its own
 * tensors, each whole (dim -1), at the shapes it saved them, which fill() then checks against the
 * model's. */
static zt_status plain_layout(zt_ckpt_tp_layout *l, const zt_ckpt_weights *w, const char *dir) {
    const int n = zt_ckpt_weights_count(w);
    zt_status s = ZT_OK;
    *l = (zt_ckpt_tp_layout){.tp = 1, .t = calloc((size_t)(n ? n : 1), sizeof *l->t)};
    if (!l->t)
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
    for (int i = 0; i < n && s == ZT_OK; i++) {
        const zt_ckpt_tensor *c = zt_ckpt_weights_tensor(w, i);
        zt_tensor_info *t = &l->t[l->n++];
        if (strlen(c->name) >= sizeof t->name)
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor name '%s' is too long", dir, c->name);
        snprintf(t->name, sizeof t->name, "%s", c->name);
        t->ndim = c->ndim;
        t->full_shape[0] = c->shape[0];
        t->full_shape[1] = c->ndim == 2 ? c->shape[1] : 0;
        t->tp_dim = -1;
        t->tp_groups = t->tp_pieces = t->tp_shared = 1;
    }
    return s;
}

zt_status zt_ckpt_tp_load(zt_engine *e, const char *dir, const char *tag) {
    const zt_model *m = zt_engine_model(e);
    const int tp = zt_model_stage_tp(&m->stage);
    char sdir[4200], latest[256];
    reshard r = {.plain = zt_ckpt_tp_size(dir) == 0};
    if (r.plain && tp == 1)
        return zt_ckpt_load(e, dir, tag);
    if (!r.plain) {
        ZT_TRY(zt_ckpt_tp_layout_at(dir, tag, &r.layout));
        if (r.layout.tp == tp) {
            zt_ckpt_tp_layout_free(&r.layout);
            zt_ckpt_tp_shard_dir(sdir, sizeof sdir, dir, m->stage.tp_rank);
            return zt_ckpt_load(e, sdir, tag);
        }
    }
    if (r.plain)
        snprintf(sdir, sizeof sdir, "%s", dir);
    else
        zt_ckpt_tp_shard_dir(sdir, sizeof sdir, dir, 0);
    zt_status s = ZT_OK;
    if (!tag) {
        s = zt_ckpt_latest(sdir, latest, sizeof latest);
        tag = latest;
    }
    /* A plain checkpoint is its own one shard: its weights are opened once, for the layout and
     * for the values. */
    if (r.plain)
        r.layout.tp = 1;
    r.shards = calloc((size_t)r.layout.tp, sizeof *r.shards);
    if (s == ZT_OK && !r.shards)
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
    if (s == ZT_OK && r.plain) {
        zt_model_spec spec;
        s = zt_ckpt_weights_open(&r.shards[0].w, dir, tag, ZT_CKPT_WORKING, &spec);
        if (s == ZT_OK)
            s = plain_layout(&r.layout, r.shards[0].w, dir);
    }
    for (int p = 0; p < r.layout.tp && s == ZT_OK; p++)
        s = open_shard(&r, p, dir, tag);
    if (s == ZT_OK)
        s = zt_ckpt_load_filled(e, sdir, tag, fill, &r);
    close_all(&r);
    return s;
}
