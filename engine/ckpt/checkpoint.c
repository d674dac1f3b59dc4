/* Checkpoint save and load (layout in ztrain/checkpoint.h). */
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ztrain/ckpt_dir.h"
#include "ckpt_changes.h"
#include "ckpt_shards.h"
#include "ztrain/fsutil.h"
#include "ztrain/model_fields.h"
#include "ztrain/checkpoint.h"
#include "ztrain/ckpt_pipeline.h"
#include "ztrain/ckpt_tp.h"
#include "ckpt_tp_weights.h"
#include "ztrain/comm.h"
#include "ztrain/fault_inject.h"
#include "ztrain/hf_config.h"
#include "ztrain/safetensors.h"

#define META_FORMAT "ztrain-checkpoint"
/* The layout of meta.json this build writes and the only one it reads: a later layout may mean
 * its keys differently, so it is refused rather than read by guess. */
#define META_VERSION 1

static void path_join(char *out, size_t size, const char *a, const char *b) {
    snprintf(out, size, "%s/%s", a, b);
}

/* The spec's type and architecture fields (its paths say where weights came from, which a
 * checkpoint replaces). */
static cJSON *model_spec_json(const zt_model_spec *s) {
    const zt_model_family *fam = zt_model_family_find(s->type);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, zt_model_type_field.key, zt_model_field_to_cjson(&zt_model_type_field, s));
    for (const zt_model_field *f = fam ? fam->fields : NULL; f && f->key; f++)
        if (f->kind != ZT_FIELD_PATH)
            cJSON_AddItemToObject(o, f->key, zt_model_field_to_cjson(f, s));
    return o;
}

/* Reads saved optimizer state from wherever the engine keeps it (memory or offload files). */
typedef struct {
    zt_engine *e;
    zt_state_kind kind;
    size_t start; /* the tensor's first element within the optimizer's slice */
} state_reader;

static zt_status read_state(void *ctx, size_t first, float *dst, size_t n) {
    state_reader *r = ctx;
    return zt_engine_read_state(r->e, r->kind, r->start + first, dst, n);
}

/* The tensors of an optimizer partition file, in file order. */
static void state_names(const zt_optimizer *o, const char *names[3], zt_state_kind kinds[3]) {
    names[0] = o->cfg.type != ZT_OPTIM_SGD ? "exp_avg" : "momentum_buffer";
    kinds[0] = ZT_STATE_EXP_AVG;
    names[1] = "exp_avg_sq";
    kinds[1] = ZT_STATE_EXP_AVG_SQ;
    names[2] = "fp32_master";
    kinds[2] = ZT_STATE_MASTER;
}

/* This rank's optimizer state over its slice [own_lo, own_lo + count) of the flat parameters,
 * clipped to the real parameters (the padding is not saved), so a checkpoint can be loaded by any
 * number of ranks. Stage 0 ranks hold the whole state; each saves its slice all the same. The
 * state is streamed from where it lives, so offloaded state is never all in memory at once. */
static zt_status save_optimizer(zt_engine *e, const char *path) {
    zt_optimizer *o = zt_engine_optimizer(e);
    if (!o)
        return ZT_OK;
    size_t own_lo, part, n = zt_engine_model(e)->n_params;
    zt_engine_partition(e, &own_lo, &part);
    size_t lo = own_lo < n ? own_lo : n, hi = own_lo + part < n ? own_lo + part : n;
    /* A stage-0 optimizer covers the whole buffer, so its slice starts at own_lo. */
    size_t base = o->n == part ? own_lo : 0;
    const char *names[3];
    zt_state_kind kinds[3];
    state_names(o, names, kinds);
    zt_st_entry entries[3];
    zt_st_source sources[3];
    state_reader readers[3];
    int k = 0;
    for (int i = 0; i < 3; i++) {
        if (!zt_engine_has_state(e, kinds[i]))
            continue;
        readers[k] = (state_reader){e, kinds[i], lo - base};
        entries[k] = (zt_st_entry){names[i], NULL, 1, {(int64_t)(hi - lo)}};
        sources[k] = (zt_st_source){read_state, &readers[k]};
        k++;
    }
    char step[32], offset[32], total[32];
    snprintf(step, sizeof step, "%lld", (long long)o->t);
    snprintf(offset, sizeof offset, "%zu", lo);
    snprintf(total, sizeof total, "%zu", n);
    const char *keys[] = {"step", "partition_offset", "n_params"};
    const char *values[] = {step, offset, total};
    return zt_st_write_sources(path, entries, sources, k, keys, values, 3);
}

static char *meta_json(zt_engine *e, const zt_job_spec *job, const char *tag, bool tp_layout) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "format", META_FORMAT);
    cJSON_AddNumberToObject(m, "version", META_VERSION);
    cJSON_AddStringToObject(m, "tag", tag);
    if (job && job->data.tokenizer)
        cJSON_AddStringToObject(m, "tokenizer", job->data.tokenizer);
    if (job && job->model.init_from && zt_hf_is_dir(job->model.init_from))
        cJSON_AddStringToObject(m, "hf_source", job->model.init_from);
    if (job && job->service_job_id)
        cJSON_AddStringToObject(m, "job_id", job->service_job_id);
    cJSON_AddNumberToObject(m, "global_steps", (double)zt_engine_global_steps(e));
    cJSON_AddNumberToObject(m, "global_samples", (double)zt_engine_global_samples(e));
    cJSON_AddNumberToObject(m, "micro_steps", (double)zt_engine_micro_steps(e));
    cJSON_AddNumberToObject(m, "skipped_steps", (double)zt_engine_skipped_steps(e));
    const zt_ds_config *ds = zt_engine_config(e);
    cJSON_AddStringToObject(m, "precision", zt_ckpt_precision_name(ds));
    cJSON_AddNumberToObject(m, "world_size", ds->world_size);
    cJSON_AddNumberToObject(m, "zero_stage", ds->zero.stage);
    zt_optimizer *o = zt_engine_optimizer(e);
    cJSON_AddNumberToObject(m, "optimizer_step", o ? (double)o->t : 0);
    const zt_loss_scaler *ls = zt_engine_loss_scaler(e);
    cJSON *scaler = cJSON_AddObjectToObject(m, "loss_scaler");
    cJSON_AddNumberToObject(scaler, "cur_scale", ls->cur_scale);
    cJSON_AddNumberToObject(scaler, "cur_iter", (double)ls->cur_iter);
    cJSON_AddNumberToObject(scaler, "last_overflow_iter", (double)ls->last_overflow_iter);
    cJSON_AddNumberToObject(scaler, "cur_hysteresis", ls->cur_hysteresis);
    /* fp32, bf16 and a static fp16 scale keep a scale no dynamic scaler may take. */
    cJSON_AddBoolToObject(scaler, "dynamic", ls->kind != ZT_SCALER_STATIC);
    cJSON *sched = cJSON_AddObjectToObject(m, "lr_schedule");
    cJSON_AddNumberToObject(sched, "last_batch_iteration",
                            (double)zt_engine_schedule(e)->last_batch_iteration);
    zt_loader *l = zt_engine_loader(e);
    if (l) {
        int64_t epoch, pos;
        zt_engine_data_position(e, &epoch, &pos);
        cJSON *d = cJSON_AddObjectToObject(m, "data");
        cJSON_AddNumberToObject(d, "epoch", (double)epoch);
        cJSON_AddNumberToObject(d, "position", (double)pos);
        /* Samples of the epoch consumed by all ranks together: what a different number of ranks
         * resumes from. */
        cJSON_AddNumberToObject(d, "global_position", (double)pos * l->world_size);
        /* 64-bit seeds do not fit a JSON number exactly. */
        char seed[32];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)l->seed);
        cJSON_AddStringToObject(d, "seed", seed);
        cJSON_AddBoolToObject(d, "shuffle", l->shuffle);
        if (job)
            cJSON_AddItemToObject(d, "train", zt_ckpt_data_train_json(&job->data));
    }
    cJSON_AddItemToObject(m, "model", model_spec_json(&zt_engine_model(e)->spec));
    zt_ckpt_shards_meta(e, m, zt_engine_params_sharded(e),
                        ds->zero.gather_16bit_weights_on_model_save);
    /* A tensor-parallel shard: the layout this tag's shards are in, which tp.json keeps only
     * until a save at another TP size. */
    if (tp_layout)
        cJSON_AddItemToObject(m, "tensor_parallel", zt_ckpt_tp_layout_json(zt_engine_model(e)));
    cJSON *ds_json = job && job->ds_json ? cJSON_Parse(job->ds_json) : NULL;
    if (ds_json)
        cJSON_AddItemToObject(m, "deepspeed", ds_json);
    char *text = cJSON_Print(m);
    cJSON_Delete(m);
    return text;
}

/* Whether any rank failed (collective); the message names the first failing rank. */
static zt_status agree(zt_engine *e, zt_status mine, const char *what) {
    zt_comm *c = zt_engine_comm(e);
    if (!c)
        return mine;
    double failed[2] = {mine != ZT_OK ? 1.0 : 0.0,
                        mine != ZT_OK ? -(double)zt_engine_job_rank(e) : -1e9};
    zt_status s = zt_comm_all_reduce(c, failed, 2, ZT_F64, ZT_REDUCE_MAX);
    if (s != ZT_OK)
        return s;
    if (mine != ZT_OK)
        return mine;
    if (failed[0] > 0.0)
        return zt_error(ZT_ERR_IO, "%s failed on rank %d", what, (int)-failed[1]);
    return ZT_OK;
}

/* Rank 0, once a save has failed before its DONE (a disk full): the temporary directory holds
 * nothing to keep, so it goes now rather than at the next save, and the save's own error stays
 * the one reported. */
static zt_status drop_unfinished(const char *tmp, zt_status failed) {
    char why[2048];
    snprintf(why, sizeof why, "%s", zt_last_error());
    return zt_remove_tree(tmp) == ZT_OK ? failed : zt_error(failed, "%s", why);
}

/* Rank 0: the checkpoint directory, what an earlier save killed half-way left repaired, and an
 * empty temporary directory for this tag. */
static zt_status make_tmp(const char *dir, const char *tmp) {
    ZT_TRY(zt_mkdirs(dir));
    ZT_TRY(zt_ckpt_recover(dir));
    ZT_TRY(zt_remove_tree(tmp));
    return zt_mkdirs(tmp);
}

/* Every rank writes its optimizer partition into tmp; rank 0 writes the model and meta.json;
 * then they agree on the outcome (a collective). */
static zt_status write_parts(zt_engine *e, const zt_job_spec *job, const char *tag,
                             const char *tmp, bool tp_layout) {
    char path[4200];
    int rank = zt_engine_rank(e);
    zt_inject_ckpt_kill(zt_engine_global_steps(e), "parts", rank);
    snprintf(path, sizeof path, "%s/optim_rank_%05d.safetensors", tmp, rank);
    zt_status s = save_optimizer(e, path);
    if (zt_engine_params_sharded(e)) {
        /* Stage 3: each rank its own slice, and the consolidated model only on request, a layer
         * at a time (collective). */
        snprintf(path, sizeof path, "%s/model_rank_%05d.safetensors", tmp, rank);
        if (s == ZT_OK)
            s = zt_ckpt_save_param_shard(e, path);
        if (zt_engine_config(e)->zero.gather_16bit_weights_on_model_save) {
            path_join(path, sizeof path, tmp, "model.safetensors");
            zt_status g = zt_ckpt_save_gathered_model(e, path);
            if (s == ZT_OK)
                s = g;
        }
    } else {
        /* Stages 0-2 hold every parameter (mixed precision widens them from 16 bits, which
         * takes memory): a failure is this rank's alone, agreed on below as any other. */
        zt_status g = zt_inject_ckpt_fail(zt_engine_global_steps(e), "gather", rank)
                          ? zt_error(ZT_ERR_NOMEM, "%s: injected gather failure", tmp)
                          : zt_engine_gather_params(e);
        if (s == ZT_OK)
            s = g;
        if (s == ZT_OK && rank == 0) {
            path_join(path, sizeof path, tmp, "model.safetensors");
            s = zt_model_save_safetensors(zt_engine_model(e), path);
        }
        zt_engine_release_unowned(e);
    }
    if (s == ZT_OK && rank == 0) {
        char *meta = meta_json(e, job, tag, tp_layout);
        path_join(path, sizeof path, tmp, "meta.json");
        s = meta ? zt_write_file_atomic(path, meta, strlen(meta))
                 : zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
        free(meta);
    }
    /* Every rank has stopped writing into tmp once they agree (a collective). */
    return agree(e, s, "writing the checkpoint");
}

/* The save: the parts into a temporary directory (write_parts); once every rank has finished,
 * rank 0 writes DONE and installs the directory under its tag (ckpt_dir.c: renamed or swapped
 * into place, then `latest`). A save that fails before its DONE, whichever rank or step failed,
 * leaves no temporary directory behind. */
static zt_status save(zt_engine *e, const zt_job_spec *job, const char *dir, const char *tag,
                      bool tp_layout) {
    char default_tag[64], tmp[4096], path[4200];
    int rank = zt_engine_rank(e);
    if (!tag) {
        snprintf(default_tag, sizeof default_tag, "global_step%lld",
                 (long long)zt_engine_global_steps(e));
        tag = default_tag;
    }
    if (!*tag || strchr(tag, '/') || tag[0] == '.')
        return zt_error(ZT_ERR_INVALID, "checkpoint tag '%s' must be a plain directory name", tag);
    zt_ckpt_aside_name(tmp, sizeof tmp, dir, tag, ZT_CKPT_TMP_SUFFIX);

    /* A failed repair may have left the only complete copy under tmp's name: it stays. */
    zt_status made = rank == 0 ? make_tmp(dir, tmp) : ZT_OK;
    zt_status s = agree(e, made, "creating the checkpoint directory");
    if (s == ZT_OK)
        s = write_parts(e, job, tag, tmp, tp_layout);
    if (s != ZT_OK)
        return rank == 0 && made == ZT_OK ? drop_unfinished(tmp, s) : s;
    if (rank == 0) {
        path_join(path, sizeof path, tmp, "DONE");
        s = zt_write_file_atomic(path, tag, strlen(tag));
        /* Once DONE is there the temporary directory may be the only complete copy (an
         * install that failed half-way): the next save's zt_ckpt_recover sorts it out. */
        if (s != ZT_OK)
            s = drop_unfinished(tmp, s);
        else
            s = zt_ckpt_install(dir, tag, tmp, zt_engine_global_steps(e));
    }
    return agree(e, s, "finishing the checkpoint");
}

zt_status zt_ckpt_save(zt_engine *e, const zt_job_spec *job, const char *dir, const char *tag) {
    return save(e, job, dir, tag, false);
}

zt_status zt_ckpt_save_tp_shard(zt_engine *e, const zt_job_spec *job, const char *dir) {
    return save(e, job, dir, NULL, true);
}

zt_status zt_ckpt_tp_layout_at(const char *dir, const char *tag, zt_ckpt_tp_layout *out) {
    char shard0[4200], tagdir[4096], source[4200];
    cJSON *meta;
    zt_ckpt_tp_shard_dir(shard0, sizeof shard0, dir, 0);
    ZT_TRY(zt_ckpt_open_meta(shard0, tag, tagdir, sizeof tagdir, &meta));
    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(meta, "tensor_parallel");
    snprintf(source, sizeof source, "%s/meta.json: tensor_parallel", tagdir);
    zt_status s = layout ? zt_ckpt_tp_layout_parse(layout, source, out)
                         : zt_ckpt_tp_layout_read(dir, out);
    cJSON_Delete(meta);
    return s;
}

/* Opens the complete copy of dir/tag (zt_ckpt_tag_dir) and its meta.json. */
zt_status zt_ckpt_open_meta(const char *dir, const char *tag, char *tagdir, size_t size,
                            cJSON **meta) {
    char latest[256], path[4400], *text;
    if (!tag) {
        ZT_TRY(zt_ckpt_latest(dir, latest, sizeof latest));
        tag = latest;
    }
    zt_ckpt_tag_dir(dir, tag, tagdir, size);
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
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(*meta, "version");
    if (!cJSON_IsNumber(version) || version->valuedouble != META_VERSION) {
        char *got = version ? cJSON_PrintUnformatted(version) : NULL;
        zt_error(ZT_ERR_FORMAT, "%s: version %s is not one this build reads (it reads version %d)",
                 path, got ? got : "(missing)", META_VERSION);
        free(got);
        cJSON_Delete(*meta);
        return ZT_ERR_FORMAT;
    }
    return ZT_OK;
}

/* Integers in meta.json go through doubles: beyond 2^53 they are no longer exact. */
#define META_MAX_INT 9007199254740992.0

/* Marks a key every save has written: its absence is damage, not an older checkpoint. */
#define META_REQUIRED NAN

/* The number under `key` of `o` (the section named `section`, "" at the top), or fallback when it
 * is absent and fallback is not META_REQUIRED. Only keys that older ztrain versions did not write
 * have a fallback; a missing required key or a value that is not a number (a damaged or edited
 * file) is refused by name rather than replaced by a default the run would silently go on from. */
static zt_status meta_num(const cJSON *o, const char *section, const char *key, double fallback,
                          const char *tagdir, double *out) {
    const char *dot = *section ? "." : "";
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v && isnan(fallback))
        return zt_error(ZT_ERR_FORMAT, "%s/meta.json: %s%s%s is missing", tagdir, section, dot,
                        key);
    if (v && !cJSON_IsNumber(v)) {
        char *got = cJSON_PrintUnformatted(v);
        zt_error(ZT_ERR_FORMAT, "%s/meta.json: %s%s%s (%s) is not a number", tagdir, section, dot,
                 key, got ? got : "?");
        free(got);
        return ZT_ERR_FORMAT;
    }
    *out = v ? v->valuedouble : fallback;
    return ZT_OK;
}

/* The section `key` of meta.json, which every save has written (so it must be there). */
static zt_status meta_section(const cJSON *meta, const char *key, const char *tagdir,
                              const cJSON **out) {
    *out = cJSON_GetObjectItemCaseSensitive(meta, key);
    if (!cJSON_IsObject(*out))
        return zt_error(ZT_ERR_FORMAT, "%s/meta.json: the %s section is %s", tagdir, key,
                        *out ? "not an object" : "missing");
    return ZT_OK;
}

/* The whole number under `key` (as meta_num), within [lo, hi]. A value no save writes is refused
 * by name rather than converted out of range into the engine's counters. */
static zt_status meta_int(const cJSON *o, const char *section, const char *key, double fallback,
                          double lo, double hi, const char *tagdir, int64_t *out) {
    double v = 0;
    ZT_TRY(meta_num(o, section, key, fallback, tagdir, &v));
    if (!(v >= lo && v <= hi && v == floor(v)))
        return zt_error(ZT_ERR_FORMAT, "%s/meta.json: %s%s%s (%g) is not a whole number from "
                        "%.0f to %.0f", tagdir, section, *section ? "." : "", key, v, lo, hi);
    *out = (int64_t)v;
    return ZT_OK;
}

/* The counters and the data position a load restores, all checked before any is applied. */
typedef struct {
    int64_t world_size, optimizer_step;
    bool has_scaler;             /* a loss_scaler section the engine's dynamic scaler takes */
    int64_t cur_iter, last_overflow_iter, cur_hysteresis;
    double cur_scale;
    int64_t last_batch_iteration, global_steps, global_samples, micro_steps, skipped_steps;
    bool has_data;               /* a data section and a loader to seek */
    int64_t epoch, global_position;
} meta_counts;

/* Every key here has been written by every save since the first, except where a fallback says
 * otherwise: the loss_scaler section (first written with mixed precision; a checkpoint without it
 * starts a dynamic scaler afresh) and data.global_position (first written with ZeRO; it is then
 * position times the saved world size). The data section is written whenever the saving engine
 * had a loader, as every training engine has. */
static zt_status read_counts(const cJSON *meta, const char *tagdir, zt_engine *e,
                             meta_counts *c) {
    const double max = META_MAX_INT, req = META_REQUIRED;
    memset(c, 0, sizeof *c);
    ZT_TRY(meta_int(meta, "", "world_size", req, 1, ZT_MAX_WORLD, tagdir, &c->world_size));
    ZT_TRY(meta_int(meta, "", "optimizer_step", req, 0, max, tagdir, &c->optimizer_step));
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(meta, "loss_scaler");
    if (sc && !cJSON_IsObject(sc))
        return zt_error(ZT_ERR_FORMAT, "%s/meta.json: the loss_scaler section is not an object",
                        tagdir);
    const zt_loss_scaler *ls = zt_engine_loss_scaler(e);
    /* A scale fp32, bf16 or a static fp16 scale kept (1, or the fixed value) is no dynamic
     * scaler's state: a dynamic one then starts at 2^initial_scale_power, as in a fresh run. */
    c->has_scaler = sc && ls->kind != ZT_SCALER_STATIC && zt_ckpt_meta_dynamic_scaler(meta);
    if (c->has_scaler) {
        ZT_TRY(meta_num(sc, "loss_scaler", "cur_scale", req, tagdir, &c->cur_scale));
        if (!(c->cur_scale > 0 && isfinite(c->cur_scale)))
            return zt_error(ZT_ERR_FORMAT, "%s/meta.json: loss_scaler.cur_scale (%g) is not a "
                            "positive number", tagdir, c->cur_scale);
        ZT_TRY(meta_int(sc, "loss_scaler", "cur_iter", req, 0, max, tagdir, &c->cur_iter));
        ZT_TRY(meta_int(sc, "loss_scaler", "last_overflow_iter", req, -1, max, tagdir,
                        &c->last_overflow_iter));
        /* From INT_MIN: the non-ZeRO rule keeps the configured hysteresis unused, and
         * DeepSpeed allows any int there (ds_config_zero.c). */
        ZT_TRY(meta_int(sc, "loss_scaler", "cur_hysteresis", req, INT_MIN, INT_MAX, tagdir,
                        &c->cur_hysteresis));
    }
    const cJSON *sched;
    ZT_TRY(meta_section(meta, "lr_schedule", tagdir, &sched));
    ZT_TRY(meta_int(sched, "lr_schedule", "last_batch_iteration", req, -1, max, tagdir,
                    &c->last_batch_iteration));
    ZT_TRY(meta_int(meta, "", "global_steps", req, 0, max, tagdir, &c->global_steps));
    ZT_TRY(meta_int(meta, "", "global_samples", req, 0, max, tagdir, &c->global_samples));
    ZT_TRY(meta_int(meta, "", "micro_steps", req, 0, max, tagdir, &c->micro_steps));
    ZT_TRY(meta_int(meta, "", "skipped_steps", req, 0, max, tagdir, &c->skipped_steps));
    c->has_data = zt_engine_loader(e) != NULL;
    if (c->has_data) {
        const cJSON *d;
        int64_t position;
        ZT_TRY(meta_section(meta, "data", tagdir, &d));
        ZT_TRY(meta_int(d, "data", "epoch", req, 0, max, tagdir, &c->epoch));
        ZT_TRY(meta_int(d, "data", "position", req, 0, max, tagdir, &position));
        ZT_TRY(meta_int(d, "data", "global_position", (double)position * (double)c->world_size,
                        0, max, tagdir, &c->global_position));
    }
    return ZT_OK;
}

zt_status zt_ckpt_meta_spec(const cJSON *meta, const char *tagdir, zt_model_spec *spec) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(meta, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(m, zt_model_type_field.key);
    if (!cJSON_IsObject(m) || !cJSON_IsString(type))
        return zt_error(ZT_ERR_FORMAT, "%s/meta.json: no model section", tagdir);
    memset(spec, 0, sizeof *spec);
    const zt_model_family *fam = zt_model_family_find(type->valuestring);
    if (!fam) {
        char known[256];
        zt_model_family_names(known, sizeof known);
        return zt_error(ZT_ERR_FORMAT, "%s/meta.json: model.type \"%s\" is not supported (known "
                        "types: %s)", tagdir, type->valuestring, known);
    }
    snprintf(spec->type, sizeof spec->type, "%s", fam->name);
    char source[4200];
    snprintf(source, sizeof source, "%s/meta.json", tagdir);
    for (const zt_model_field *f = fam->fields; f->key; f++)
        if (f->kind != ZT_FIELD_PATH)
            ZT_TRY(zt_model_field_from_cjson(f, m, spec, source));
    return ZT_OK;
}

/* A path meta.json records under key, read from meta.json itself rather than through the
 * loader's checks: `ztrain sample` has already read the model spec, which makes them, from the
 * same checkpoint. */
static zt_status read_meta_path(const char *dir, const char *tag, const char *key, char **path) {
    char latest[256], tagdir[4096], file[4200], *text;
    *path = NULL;
    /* A pipeline's and a tensor-parallel job's meta.json are in their parts' directories, the
     * same job's in each: the first stage's, and shard 0's. */
    if (zt_ckpt_pipeline_stages(dir) > 0) {
        zt_ckpt_stage_dir(file, sizeof file, dir, 0);
        return read_meta_path(file, tag, key, path);
    }
    if (zt_ckpt_tp_size(dir) > 0) {
        zt_ckpt_tp_shard_dir(file, sizeof file, dir, 0);
        return read_meta_path(file, tag, key, path);
    }
    if (!tag) {
        ZT_TRY(zt_ckpt_latest(dir, latest, sizeof latest));
        tag = latest;
    }
    zt_ckpt_tag_dir(dir, tag, tagdir, sizeof tagdir);
    snprintf(file, sizeof file, "%s/meta.json", tagdir);
    ZT_TRY(zt_read_file(file, &text, NULL));
    cJSON *meta = cJSON_Parse(text);
    free(text);
    if (!meta)
        return zt_error(ZT_ERR_FORMAT, "%s: not valid JSON", file);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(meta, key);
    zt_status s = ZT_OK;
    if (cJSON_IsString(t) && !(*path = strdup(t->valuestring)))
        s = zt_error(ZT_ERR_NOMEM, "out of memory");
    cJSON_Delete(meta);
    return s;
}

zt_status zt_ckpt_read_tokenizer(const char *dir, const char *tag, char **path) {
    return read_meta_path(dir, tag, "tokenizer", path);
}

zt_status zt_ckpt_read_hf_source(const char *dir, const char *tag, char **path) {
    return read_meta_path(dir, tag, "hf_source", path);
}

/* The saved partitions tile the flat parameters [0, n) in rank order (save_optimizer): file r's
 * starts where file r - 1's ends, next. Its metadata says where (partition_offset) and of how
 * many parameters (n_params); a file that says otherwise is damaged or from another checkpoint,
 * and loading it would put its state on the wrong parameters. */
static zt_status partition_start(const zt_st_file *f, const char *path, size_t n, size_t next,
                                 size_t *off) {
    size_t total = 0;
    if (!zt_ckpt_st_meta_size(f, "n_params", &total) ||
        !zt_ckpt_st_meta_size(f, "partition_offset", off))
        return zt_error(ZT_ERR_FORMAT, "%s: no partition_offset and n_params metadata", path);
    if (total != n)
        return zt_error(ZT_ERR_FORMAT, "%s: optimizer state is for %zu parameters, the model has "
                        "%zu", path, total, n);
    if (*off != next)
        return zt_error(ZT_ERR_FORMAT, "%s: its partition starts at parameter %zu, but the "
                        "partitions of the ranks before it end at %zu (a damaged file, or one of "
                        "another checkpoint)", path, *off, next);
    return ZT_OK;
}

/* Hands the pages of a read-only file mapping that were just copied back to the kernel, so
 * loading offloaded state does not bring it all into resident memory on the way. */
static void drop_pages(const void *p, size_t bytes) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + bytes) / page * page;
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Copies saved values into the engine's state, wherever it lives, in pieces. */
static zt_status copy_in(zt_engine *e, zt_state_kind kind, const float *src, size_t first,
                         size_t n) {
    enum { PIECE = 1 << 20 };
    for (size_t c = 0; c < n; c += PIECE) {
        size_t len = n - c < PIECE ? n - c : PIECE;
        ZT_TRY(zt_engine_write_state(e, kind, first + c, src + c, len));
        drop_pages(src + c, len * sizeof(float));
    }
    return ZT_OK;
}

/* Fills this rank's optimizer state from every saved partition that overlaps its slice, so a
 * checkpoint written by any number of ranks loads on any other number, with or without offload. */
static zt_status load_optimizer(zt_engine *e, const char *tagdir, int saved_world, int64_t step) {
    zt_optimizer *o = zt_engine_optimizer(e);
    size_t own_lo, part, n = zt_engine_model(e)->n_params;
    zt_engine_partition(e, &own_lo, &part);
    size_t base = o->n == part ? own_lo : 0;
    size_t lo = o->n == part ? own_lo : 0, hi = base + o->n < n ? base + o->n : n;
    const char *names[3];
    zt_state_kind kinds[3];
    state_names(o, names, kinds);
    /* Coverage is counted on the first tensor the optimizer has (none for plain SGD). */
    int counted = -1;
    for (int i = 0; i < 2 && counted < 0; i++)
        if (zt_engine_has_state(e, kinds[i]))
            counted = i;
    size_t covered = 0, next = 0;
    bool any_state = false;
    for (int r = 0; r < saved_world; r++) {
        char path[4400];
        snprintf(path, sizeof path, "%s/optim_rank_%05d.safetensors", tagdir, r);
        zt_st_file f;
        ZT_TRY(zt_st_open(&f, path));
        size_t off = 0, file_len = 0;
        zt_status s = partition_start(&f, path, n, next, &off);
        /* The first state tensor gives the partition's length, which the others must have. */
        bool tiled = false;
        for (int i = 0; i < 3 && s == ZT_OK; i++) {
            if (!zt_engine_has_state(e, kinds[i]))
                continue;
            const zt_st_tensor *t = zt_st_find(&f, names[i]);
            /* A checkpoint from fp32 training has no masters: they stay the loaded weights. */
            if (!t && kinds[i] == ZT_STATE_MASTER)
                continue;
            if (!t || t->dtype != ZT_ST_F32 || t->ndim != 1) {
                s = zt_error(ZT_ERR_FORMAT,
                             "%s: no fp32 '%s' tensor (was the checkpoint written with another "
                             "optimizer?)",
                             path, names[i]);
                break;
            }
            size_t len = (size_t)t->shape[0];
            if (!tiled)
                file_len = len;
            tiled = true;
            if (len != file_len || len > n - off) {
                s = zt_error(ZT_ERR_FORMAT, "%s: '%s' holds %zu values from parameter %zu, "
                             "where its partition holds %zu of the %zu", path, names[i], len,
                             off, file_len, n);
                break;
            }
            size_t a = off > lo ? off : lo, b = off + len < hi ? off + len : hi;
            if (a < b) {
                const float *src = (const float *)zt_st_data(&f, t) + (a - off);
                s = zt_st_check_finite(&f, t, src, a - off, b - a);
                if (s == ZT_OK)
                    s = copy_in(e, kinds[i], src, a - base, b - a);
                if (i == counted)
                    covered += b - a;
            }
        }
        zt_st_close(&f);
        ZT_TRY(s);
        next = tiled ? off + file_len : next;
        any_state = any_state || tiled;
    }
    if (any_state && next != n)
        return zt_error(ZT_ERR_FORMAT, "%s: the optimizer partitions end at parameter %zu of %zu",
                        tagdir, next, n);
    if (counted >= 0 && covered != hi - lo)
        return zt_error(ZT_ERR_FORMAT, "%s: the optimizer partitions cover %zu of the %zu values "
                        "this rank needs", tagdir, covered, hi - lo);
    o->t = step;
    return ZT_OK;
}

zt_status zt_ckpt_load(zt_engine *e, const char *dir, const char *tag) {
    return zt_ckpt_load_filled(e, dir, tag, NULL, NULL);
}

zt_status zt_ckpt_load_filled(zt_engine *e, const char *dir, const char *tag,
                              zt_ckpt_state_filler fill, void *ctx) {
    char tagdir[4096], path[4200];
    cJSON *meta;
    ZT_TRY(zt_ckpt_open_meta(dir, tag, tagdir, sizeof tagdir, &meta));
    zt_model *model = zt_engine_model(e);
    zt_model_spec saved;
    zt_status s = zt_ckpt_meta_spec(meta, tagdir, &saved);
    const zt_model_field *differs = s == ZT_OK ? zt_model_spec_difference(&saved, &model->spec)
                                               : NULL;
    if (differs) {
        char held[1024], job_value[256];
        zt_model_spec_describe(&saved, held, sizeof held);
        zt_model_field_format(differs, &model->spec, job_value, sizeof job_value);
        s = zt_error(ZT_ERR_INVALID, "%s: checkpoint holds a %s model, but the job's model has "
                     "%s %s", tagdir, held, differs->key, job_value);
    }
    meta_counts c;
    if (s == ZT_OK)
        s = read_counts(meta, tagdir, e, &c);
    int n_shards = zt_ckpt_meta_shards(meta);
    if (s == ZT_OK && fill) {
        s = fill(ctx, e, c.optimizer_step);
    } else if (s == ZT_OK && n_shards > 0) {
        s = zt_ckpt_load_param_shards(e, tagdir, n_shards);
    } else if (s == ZT_OK) {
        path_join(path, sizeof path, tagdir, "model.safetensors");
        s = zt_model_load_safetensors(model, path);
        zt_status loaded = zt_engine_params_loaded(e);
        if (s == ZT_OK)
            s = loaded;
    }
    if (s == ZT_OK && zt_engine_optimizer(e) && !fill)
        s = load_optimizer(e, tagdir, (int)c.world_size, c.optimizer_step);
    if (s == ZT_OK) {
        if (c.has_scaler) {
            zt_loss_scaler *ls = zt_engine_loss_scaler(e);
            ls->cur_scale = c.cur_scale;
            ls->cur_iter = c.cur_iter;
            ls->last_overflow_iter = c.last_overflow_iter;
            ls->cur_hysteresis = (int)c.cur_hysteresis;
        }
        zt_engine_schedule(e)->last_batch_iteration = c.last_batch_iteration;
        zt_engine_set_counters(e, c.global_steps, c.global_samples, c.micro_steps, c.skipped_steps);
        zt_loader *l = zt_engine_loader(e);
        if (c.has_data)
            zt_engine_seek_data(e, c.epoch, c.global_position / l->world_size);
    }
    cJSON_Delete(meta);
    return s;
}

zt_status zt_ckpt_read_model_spec(const char *dir, const char *tag, zt_model_spec *spec) {
    char tagdir[4096], path[4200];
    cJSON *meta;
    ZT_TRY(zt_ckpt_open_meta(dir, tag, tagdir, sizeof tagdir, &meta));
    zt_status s = zt_ckpt_meta_spec(meta, tagdir, spec);
    cJSON_Delete(meta);
    if (s != ZT_OK)
        return s;
    path_join(path, sizeof path, tagdir, "model.safetensors");
    if (!zt_path_exists(path))
        return ZT_OK; /* a stage-3 checkpoint without the consolidated model */
    spec->init_from = strdup(path);
    return spec->init_from ? ZT_OK : zt_error(ZT_ERR_NOMEM, "out of memory");
}
