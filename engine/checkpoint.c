/* Checkpoint save and load (layout in ztrain/checkpoint.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsutil.h"
#include "ztrain/checkpoint.h"
#include "ztrain/safetensors.h"

#define META_FORMAT "ztrain-checkpoint"
#define META_VERSION 1

static void path_join(char *out, size_t size, const char *a, const char *b) {
    snprintf(out, size, "%s/%s", a, b);
}

static cJSON *model_spec_json(const zt_model_spec *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", s->type);
    cJSON_AddNumberToObject(o, "n_layer", s->n_layer);
    cJSON_AddNumberToObject(o, "n_head", s->n_head);
    cJSON_AddNumberToObject(o, "n_embd", s->n_embd);
    cJSON_AddNumberToObject(o, "vocab_size", s->vocab_size);
    cJSON_AddNumberToObject(o, "block_size", s->block_size);
    return o;
}

static zt_status save_optimizer(zt_engine *e, const char *path) {
    zt_optimizer *o = zt_engine_optimizer(e);
    if (!o)
        return ZT_OK;
    zt_st_entry entries[2];
    int n = 0;
    const char *first = o->cfg.type == ZT_OPTIM_ADAM ? "exp_avg" : "momentum_buffer";
    if (o->m)
        entries[n++] = (zt_st_entry){first, o->m, 1, {(int64_t)o->n}};
    if (o->v)
        entries[n++] = (zt_st_entry){"exp_avg_sq", o->v, 1, {(int64_t)o->n}};
    char step[32], offset[32];
    snprintf(step, sizeof step, "%lld", (long long)o->t);
    snprintf(offset, sizeof offset, "%d", 0);
    const char *keys[] = {"step", "partition_offset"};
    const char *values[] = {step, offset};
    return zt_st_write(path, entries, n, keys, values, 2);
}

static char *meta_json(zt_engine *e, const zt_job_spec *job, const char *tag) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "format", META_FORMAT);
    cJSON_AddNumberToObject(m, "version", META_VERSION);
    cJSON_AddStringToObject(m, "tag", tag);
    cJSON_AddNumberToObject(m, "global_steps", (double)zt_engine_global_steps(e));
    cJSON_AddNumberToObject(m, "global_samples", (double)zt_engine_global_samples(e));
    cJSON_AddNumberToObject(m, "micro_steps", (double)zt_engine_micro_steps(e));
    cJSON_AddNumberToObject(m, "skipped_steps", (double)zt_engine_skipped_steps(e));
    const zt_ds_config *ds = zt_engine_config(e);
    cJSON_AddNumberToObject(m, "world_size", ds->world_size);
    cJSON_AddNumberToObject(m, "zero_stage", ds->zero.stage);
    zt_optimizer *o = zt_engine_optimizer(e);
    cJSON_AddNumberToObject(m, "optimizer_step", o ? (double)o->t : 0);
    cJSON *sched = cJSON_AddObjectToObject(m, "lr_schedule");
    cJSON_AddNumberToObject(sched, "last_batch_iteration",
                            (double)zt_engine_schedule(e)->last_batch_iteration);
    zt_loader *l = zt_engine_loader(e);
    if (l) {
        cJSON *d = cJSON_AddObjectToObject(m, "data");
        cJSON_AddNumberToObject(d, "epoch", (double)l->epoch);
        cJSON_AddNumberToObject(d, "position", (double)l->pos);
        /* 64-bit seeds do not fit a JSON number exactly. */
        char seed[32];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)l->seed);
        cJSON_AddStringToObject(d, "seed", seed);
        cJSON_AddBoolToObject(d, "shuffle", l->shuffle);
    }
    cJSON_AddItemToObject(m, "model", model_spec_json(&zt_engine_model(e)->spec));
    cJSON *ds_json = job && job->ds_json ? cJSON_Parse(job->ds_json) : NULL;
    if (ds_json)
        cJSON_AddItemToObject(m, "deepspeed", ds_json);
    char *text = cJSON_Print(m);
    cJSON_Delete(m);
    return text;
}

zt_status zt_ckpt_save(zt_engine *e, const zt_job_spec *job, const char *dir, const char *tag) {
    char default_tag[64], tmp[4096], final[4096], path[4200];
    if (!tag) {
        snprintf(default_tag, sizeof default_tag, "global_step%lld",
                 (long long)zt_engine_global_steps(e));
        tag = default_tag;
    }
    if (!*tag || strchr(tag, '/') || tag[0] == '.')
        return zt_error(ZT_ERR_INVALID, "checkpoint tag '%s' must be a plain directory name", tag);
    ZT_TRY(zt_mkdirs(dir));
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp-%d", dir, tag, (int)getpid());
    path_join(final, sizeof final, dir, tag);
    ZT_TRY(zt_remove_tree(tmp));
    ZT_TRY(zt_mkdirs(tmp));

    path_join(path, sizeof path, tmp, "model.safetensors");
    zt_status s = zt_model_save_safetensors(zt_engine_model(e), path);
    if (s == ZT_OK) {
        snprintf(path, sizeof path, "%s/optim_rank_%05d.safetensors", tmp, 0);
        s = save_optimizer(e, path);
    }
    if (s == ZT_OK) {
        char *meta = meta_json(e, job, tag);
        path_join(path, sizeof path, tmp, "meta.json");
        s = meta ? zt_write_file_atomic(path, meta, strlen(meta))
                 : zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
        free(meta);
    }
    if (s == ZT_OK) {
        path_join(path, sizeof path, tmp, "DONE");
        s = zt_write_file_atomic(path, tag, strlen(tag));
    }
    if (s == ZT_OK) {
        zt_sync_dir(tmp);
        s = zt_remove_tree(final);
    }
    if (s == ZT_OK && rename(tmp, final) != 0)
        s = zt_error(ZT_ERR_IO, "%s: cannot rename checkpoint into place", final);
    if (s != ZT_OK) {
        zt_remove_tree(tmp);
        return s;
    }
    path_join(path, sizeof path, dir, "latest");
    ZT_TRY(zt_write_file_atomic(path, tag, strlen(tag)));
    zt_sync_dir(dir);
    return ZT_OK;
}

zt_status zt_ckpt_latest(const char *dir, char *tag, size_t size) {
    char path[4200], *text;
    path_join(path, sizeof path, dir, "latest");
    if (!zt_path_exists(path))
        return zt_error(ZT_ERR_IO, "%s: no checkpoint (no 'latest' file)", dir);
    ZT_TRY(zt_read_file(path, &text, NULL));
    text[strcspn(text, "\r\n")] = '\0';
    if (!*text || strlen(text) >= size) {
        free(text);
        return zt_error(ZT_ERR_FORMAT, "%s: 'latest' does not hold a valid tag", path);
    }
    snprintf(tag, size, "%s", text);
    free(text);
    return ZT_OK;
}

/* Opens dir/tag/meta.json after checking the DONE marker. */
static zt_status open_meta(const char *dir, const char *tag, char *tagdir, size_t size,
                           cJSON **meta) {
    char latest[256], path[4400], *text;
    if (!tag) {
        ZT_TRY(zt_ckpt_latest(dir, latest, sizeof latest));
        tag = latest;
    }
    snprintf(tagdir, size, "%s/%s", dir, tag);
    path_join(path, sizeof path, tagdir, "DONE");
    if (!zt_path_exists(tagdir))
        return zt_error(ZT_ERR_IO, "%s: checkpoint does not exist", tagdir);
    if (!zt_path_exists(path))
        return zt_error(ZT_ERR_FORMAT,
                        "%s: checkpoint is incomplete (no DONE marker); it was not finished "
                        "and will not be loaded",
                        tagdir);
    path_join(path, sizeof path, tagdir, "meta.json");
    ZT_TRY(zt_read_file(path, &text, NULL));
    *meta = cJSON_Parse(text);
    free(text);
    if (!*meta)
        return zt_error(ZT_ERR_FORMAT, "%s: not valid JSON", path);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(*meta, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, META_FORMAT) != 0) {
        cJSON_Delete(*meta);
        return zt_error(ZT_ERR_FORMAT, "%s: not a ztrain checkpoint", path);
    }
    return ZT_OK;
}

static double num(const cJSON *o, const char *key, double fallback) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : fallback;
}

static zt_status read_spec(const cJSON *meta, const char *tagdir, zt_model_spec *spec) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(meta, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(m, "type");
    if (!cJSON_IsObject(m) || !cJSON_IsString(type))
        return zt_error(ZT_ERR_FORMAT, "%s/meta.json: no model section", tagdir);
    memset(spec, 0, sizeof *spec);
    snprintf(spec->type, sizeof spec->type, "%s", type->valuestring);
    spec->n_layer = (int)num(m, "n_layer", 0);
    spec->n_head = (int)num(m, "n_head", 0);
    spec->n_embd = (int)num(m, "n_embd", 0);
    spec->vocab_size = (int)num(m, "vocab_size", 0);
    spec->block_size = (int)num(m, "block_size", 0);
    return ZT_OK;
}

static zt_status load_optimizer(zt_optimizer *o, const char *path, int64_t step) {
    zt_st_file f;
    ZT_TRY(zt_st_open(&f, path));
    zt_status s = ZT_OK;
    const char *first = o->cfg.type == ZT_OPTIM_ADAM ? "exp_avg" : "momentum_buffer";
    struct { const char *name; float *dst; } want[2] = {{first, o->m}, {"exp_avg_sq", o->v}};
    for (int i = 0; i < 2 && s == ZT_OK; i++) {
        if (!want[i].dst)
            continue;
        const zt_st_tensor *t = zt_st_find(&f, want[i].name);
        if (!t)
            s = zt_error(ZT_ERR_FORMAT,
                         "%s: no '%s' tensor (was the checkpoint written with another optimizer?)",
                         path, want[i].name);
        else
            s = zt_st_read_f32(&f, t, want[i].dst, o->n);
    }
    zt_st_close(&f);
    if (s == ZT_OK)
        o->t = step;
    return s;
}

zt_status zt_ckpt_load(zt_engine *e, const char *dir, const char *tag) {
    char tagdir[4096], path[4200];
    cJSON *meta;
    ZT_TRY(open_meta(dir, tag, tagdir, sizeof tagdir, &meta));
    zt_model *model = zt_engine_model(e);
    zt_model_spec saved;
    zt_status s = read_spec(meta, tagdir, &saved);
    const zt_model_spec *cur = &model->spec;
    if (s == ZT_OK && (strcmp(saved.type, cur->type) != 0 || saved.n_layer != cur->n_layer ||
                       saved.n_head != cur->n_head || saved.n_embd != cur->n_embd ||
                       saved.vocab_size != cur->vocab_size || saved.block_size != cur->block_size))
        s = zt_error(ZT_ERR_INVALID,
                     "%s: checkpoint holds a %s model with n_layer %d, n_head %d, n_embd %d, "
                     "vocab_size %d, block_size %d, but the job's model differs",
                     tagdir, saved.type, saved.n_layer, saved.n_head, saved.n_embd,
                     saved.vocab_size, saved.block_size);
    int world = (int)num(meta, "world_size", 1);
    if (s == ZT_OK && world != zt_engine_config(e)->world_size)
        s = zt_error(ZT_ERR_UNSUPPORTED,
                     "%s: checkpoint was written by %d ranks but this job has %d; re-partitioning "
                     "is not supported yet",
                     tagdir, world, zt_engine_config(e)->world_size);
    if (s == ZT_OK) {
        path_join(path, sizeof path, tagdir, "model.safetensors");
        s = zt_model_load_safetensors(model, path);
    }
    zt_optimizer *o = zt_engine_optimizer(e);
    if (s == ZT_OK && o) {
        snprintf(path, sizeof path, "%s/optim_rank_%05d.safetensors", tagdir, 0);
        s = load_optimizer(o, path, (int64_t)num(meta, "optimizer_step", 0));
    }
    if (s == ZT_OK) {
        const cJSON *sched = cJSON_GetObjectItemCaseSensitive(meta, "lr_schedule");
        zt_engine_schedule(e)->last_batch_iteration = (int64_t)num(sched, "last_batch_iteration", -1);
        zt_engine_set_counters(e, (int64_t)num(meta, "global_steps", 0),
                               (int64_t)num(meta, "micro_steps", 0),
                               (int64_t)num(meta, "skipped_steps", 0));
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(meta, "data");
        zt_loader *l = zt_engine_loader(e);
        if (l && cJSON_IsObject(d))
            zt_loader_seek(l, (int64_t)num(d, "epoch", 0), (int64_t)num(d, "position", 0));
    }
    cJSON_Delete(meta);
    return s;
}

zt_status zt_ckpt_read_model_spec(const char *dir, const char *tag, zt_model_spec *spec) {
    char tagdir[4096], path[4200];
    cJSON *meta;
    ZT_TRY(open_meta(dir, tag, tagdir, sizeof tagdir, &meta));
    zt_status s = read_spec(meta, tagdir, spec);
    cJSON_Delete(meta);
    if (s != ZT_OK)
        return s;
    path_join(path, sizeof path, tagdir, "model.safetensors");
    spec->init_from = strdup(path);
    return spec->init_from ? ZT_OK : zt_error(ZT_ERR_NOMEM, "out of memory");
}
