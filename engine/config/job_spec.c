/* The job spec file (DESIGN.md §3): name, world size, device, model, data, train options and the
 * DeepSpeed config, inline or by path.
 *
 * Choices made where the contract is silent: "name" defaults to the job file's name without
 * ".json"; "model.type" defaults to "gpt2"; the "train" section may be left out; eval_interval > 0
 * needs data.val, and resume or checkpoint_interval > 0 need checkpoint_dir, so those mistakes
 * surface now rather than hours into a run. The load path anchors relative paths at the job
 * file's directory made absolute, so ranks started elsewhere find the same files. Whether
 * data.train exists is the data loader's business, not ours. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds_config_json.h"
#include "ztrain/fsutil.h"
#include "job_pipeline.h"
#include "job_tp.h"
#include "job_spec_recovery.h"
#include "ztrain/json_util.h"
#include "job_act_ckpt.h"
#include "job_keys.h"
#include "ztrain/model_fields.h"
#include "ztrain/text.h"
#include "ztrain/comm.h"
#include "ztrain/hf_config.h"
#include "ztrain/job_spec.h"
#include "ztrain/model.h"

static const char *const top_keys[] = {"name", "world_size", "nodes", "comm", "device", "model",
                                       "data", "train", "training_args", "deepspeed",
                                       "pipeline", "max_restarts", "fork_from", "events",
                                       "alerts", NULL};
static const char *const data_keys[] = {"train",         "val",          "shuffle", "tokenizer",
                                        "sample_tokens", "sample_prompt", "format",
                                        "packing",       "train_files", "val_files", NULL};
static const char *const source_keys[] = {"path", "weight", NULL};
static const char *const train_keys[] = {"max_steps", "epochs", "log_interval", "eval_interval",
                                         "eval_steps", "checkpoint_dir", "checkpoint_interval",
                                         "resume", "bench_steps", "warmup_steps", "seed",
                                         "activation_checkpointing",
                                         "activation_checkpoint_interval", NULL};

/* base_dir/path for a relative path; an absolute path, or an empty or "." base, is kept as is. */
static char *resolve_path(const char *base_dir, const char *path) {
    if (path[0] == '/' || !base_dir || !base_dir[0] || strcmp(base_dir, ".") == 0)
        return zt_json_strdup(path);
    size_t lb = strlen(base_dir), lp = strlen(path);
    bool slash = base_dir[lb - 1] != '/';
    char *out = malloc(lb + slash + lp + 1);
    if (!out) {
        zt_error(ZT_ERR_NOMEM, "out of memory resolving %s", path);
        return NULL;
    }
    memcpy(out, base_dir, lb);
    if (slash)
        out[lb] = '/';
    memcpy(out + lb + slash, path, lp + 1);
    return out;
}

/* Reads an optional path-valued key into *out (heap, resolved against base_dir). */
static zt_status get_path(const zt_json_obj *o, const char *key, const char *base_dir, char **out) {
    const char *v = NULL;
    ZT_TRY(zt_json_get_string(o, key, &v, NULL));
    if (!v)
        return ZT_OK;
    if (!v[0])
        return zt_json_key_error(ZT_ERR_INVALID, o, key, "must not be an empty path");
    *out = resolve_path(base_dir, v);
    return *out ? ZT_OK : ZT_ERR_NOMEM;
}

/* An int with a lower bound; messages say which bound. */
static zt_status get_int_min(const zt_json_obj *o, const char *key, int min, int *out) {
    bool found;
    ZT_TRY(zt_json_get_int(o, key, out, &found));
    if (found && *out < min)
        return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be >= %d, got %d", min, *out);
    return ZT_OK;
}

/* The family: the job's "type", or config.json's model_type when init_from is a Hugging Face
 * directory (then a "type" the job also gives must agree). */
static zt_status model_family(const zt_json_obj *o, const zt_hf_config *hf,
                              const zt_model_family **fam) {
    const char *type = hf ? hf->spec.type : zt_model_type_field.def_str;
    const char *given = NULL;
    ZT_TRY(zt_json_get_string(o, zt_model_type_field.key, &given, NULL));
    if (hf && given && strcmp(given, type) != 0)
        return zt_error(ZT_ERR_INVALID, "%s: model.type is \"%s\" but %s has model_type \"%s\"",
                        o->source, given, hf->path, type);
    if (given)
        type = given;
    *fam = strlen(type) < sizeof ((zt_model_spec *)0)->type ? zt_model_family_find(type) : NULL;
    if (!*fam) {
        char known[256];
        zt_model_family_names(known, sizeof known);
        return zt_error(ZT_ERR_INVALID, "%s: model.type \"%s\" is not supported (known types: %s)",
                        o->source, type, known);
    }
    return ZT_OK;
}

/* One architecture field: from the job, from config.json, or both when they agree. */
static zt_status model_field(const zt_model_field *f, const zt_json_obj *o,
                             const zt_hf_config *hf, int i, zt_model_spec *m) {
    if (!hf || !hf->given[i])
        return zt_model_field_read_json(f, o, m);
    if (!zt_json_item(o, f->key)) {
        memcpy((char *)m + f->offset, (const char *)&hf->spec + f->offset, f->size);
        return ZT_OK;
    }
    ZT_TRY(zt_model_field_read_json(f, o, m));
    if (zt_model_field_equal(f, m, &hf->spec))
        return ZT_OK;
    char job_value[64], hf_value[64], key[96] = "";
    zt_model_field_format(f, m, job_value, sizeof job_value);
    zt_model_field_format(f, &hf->spec, hf_value, sizeof hf_value);
    /* An empty string (no rope scaling) is shown as such. */
    if (!hf_value[0])
        snprintf(hf_value, sizeof hf_value, "(none)");
    if (!job_value[0])
        snprintf(job_value, sizeof job_value, "(none)");
    if (hf->given_key[i])
        snprintf(key, sizeof key, " (%s)", hf->given_key[i]);
    else
        snprintf(key, sizeof key, " (fixed for model_type %s)", hf->spec.type);
    return zt_error(ZT_ERR_INVALID, "%s: model.%s is %s but %s gives %s%s", o->source, f->key,
                    job_value, hf->path, hf_value, key);
}

/* The model section, read through the field table of its family. When init_from is a Hugging
 * Face directory, its config.json names the family and fills the architecture fields the job
 * leaves out (ztrain/hf_config.h); this is the one place a directory is resolved, which
 * `ztrain run`, ztraind's spec check and every rank all go through. */
static zt_status parse_model(zt_model_spec *m, const zt_json_obj *top, const char *base_dir) {
    zt_json_obj o;
    ZT_TRY(zt_json_require(top, "model"));
    ZT_TRY(zt_json_child(top, "model", &o));
    char *from = NULL;
    ZT_TRY(get_path(&o, "init_from", base_dir, &from));
    zt_hf_config *hf = NULL;
    zt_status s = ZT_OK;
    if (zt_hf_is_dir(from)) {
        hf = malloc(sizeof *hf);
        s = hf ? zt_hf_config_read(from, hf) : zt_error(ZT_ERR_NOMEM, "out of memory");
        /* A directory the job names that cannot be read (a missing shard) is a fault of the
         * job, as a missing data.train is. */
        if (s != ZT_OK && hf)
            s = zt_error_prefix(s == ZT_ERR_IO ? ZT_ERR_INVALID : s, "%s: model.init_from: ",
                                top->source);
    }
    const zt_model_family *fam = NULL;
    if (s == ZT_OK)
        s = model_family(&o, hf, &fam);
    if (s != ZT_OK) {
        free(from);
        free(hf);
        return s;
    }
    /* From here the spec owns `from` (zt_job_spec_free releases the family's paths). */
    snprintf(m->type, sizeof m->type, "%s", fam->name);
    m->init_from = from;

    const char *keys[ZT_MODEL_MAX_FIELDS + 2];
    int n = 0;
    keys[n++] = zt_model_type_field.key;
    for (const zt_model_field *f = fam->fields; f->key; f++) {
        ZT_ASSERT(n < ZT_MODEL_MAX_FIELDS + 1);
        keys[n++] = f->key;
    }
    keys[n] = NULL;
    s = zt_json_check_keys(&o, keys);
    for (const zt_model_field *f = fam->fields; f->key && s == ZT_OK; f++) {
        if (f->kind != ZT_FIELD_PATH) {
            s = model_field(f, &o, hf, (int)(f - fam->fields), m);
            continue;
        }
        char **path = (char **)((char *)m + f->offset);
        if (path == &m->init_from)
            continue;
        if (f->required)
            s = zt_json_require(&o, f->key);
        if (s == ZT_OK)
            s = get_path(&o, f->key, base_dir, path);
    }
    if (s == ZT_OK && hf && hf->max_positions > 0 && m->block_size > hf->max_positions)
        s = zt_error(ZT_ERR_INVALID, "%s: model.block_size %d is above %s's %s %d, the longest "
                     "sequence the model supports", top->source, m->block_size, hf->path,
                     hf->max_positions_key, hf->max_positions);
    free(hf);
    return s == ZT_OK ? zt_model_spec_validate(m, top->source) : s;
}

/* data.train as a mixture: [{"path": P, "weight": W}, ...], every weight > 0. */
static zt_status parse_mixture(zt_data_spec *d, const zt_json_obj *data, const cJSON *list,
                               const char *base_dir) {
    int n = cJSON_GetArraySize(list);
    if (n == 0)
        return zt_json_key_error(ZT_ERR_INVALID, data, "train", "is an empty mixture");
    d->train_mix = calloc((size_t)n, sizeof *d->train_mix);
    if (!d->train_mix)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", data->source);
    int i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        char path[64];
        snprintf(path, sizeof path, "data.train[%d]", i);
        if (!cJSON_IsObject(e))
            return zt_error(ZT_ERR_INVALID, "%s: key '%s' must be an object {\"path\", \"weight\"}",
                            data->source, path);
        zt_json_obj src;
        zt_json_obj_init(&src, e, data->source, path);
        ZT_TRY(zt_job_keys_check(&src, "data.train[]"));
        ZT_TRY(zt_json_require(&src, "path"));
        ZT_TRY(zt_json_require(&src, "weight"));
        zt_data_source *ds = &d->train_mix[d->n_train_mix++];
        ZT_TRY(get_path(&src, "path", base_dir, &ds->path));
        ZT_TRY(zt_json_get_double(&src, "weight", &ds->weight, NULL));
        if (!(ds->weight > 0))
            return zt_json_key_error(ZT_ERR_INVALID, &src, "weight", "must be > 0, got %g",
                                     ds->weight);
    }
    return ZT_OK;
}

/* data.train_files / data.val_files: a glob's checked matches, absolute paths in name order. */
static zt_status parse_files(const zt_json_obj *o, const char *key, char ***out, int *n) {
    const cJSON *list = zt_json_item(o, key);
    if (!list)
        return ZT_OK;
    int count = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : 0;
    if (count < 1)
        return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be a non-empty list of absolute "
                                 "paths (the files a glob matched)");
    *out = calloc((size_t)count, sizeof **out);
    if (!*out)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", o->source);
    for (const cJSON *e = list->child; e; e = e->next) {
        if (!cJSON_IsString(e) || e->valuestring[0] != '/')
            return zt_json_key_error(ZT_ERR_INVALID, o, key, "entry %d must be an absolute path",
                                     *n);
        if (!((*out)[(*n)++] = zt_json_strdup(e->valuestring)))
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", o->source);
    }
    return ZT_OK;
}

static zt_status parse_data(zt_data_spec *d, const zt_json_obj *top, const char *base_dir) {
    zt_json_obj o;
    ZT_TRY(zt_json_require(top, "data"));
    ZT_TRY(zt_json_child(top, "data", &o));
    ZT_TRY(zt_job_keys_check(&o, "data"));
    ZT_TRY(zt_json_require(&o, "train"));
    const cJSON *train = zt_json_item(&o, "train");
    if (cJSON_IsArray(train))
        ZT_TRY(parse_mixture(d, &o, train, base_dir));
    else
        ZT_TRY(get_path(&o, "train", base_dir, &d->train));
    ZT_TRY(get_path(&o, "val", base_dir, &d->val));
    ZT_TRY(parse_files(&o, "train_files", &d->train_files, &d->n_train_files));
    ZT_TRY(parse_files(&o, "val_files", &d->val_files, &d->n_val_files));
    if (d->train_files && !d->train)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "train_files", "goes with a data.train "
                                 "glob, not with a mixture");
    if (d->val_files && !d->val)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "val_files", "goes with data.val");
    ZT_TRY(get_path(&o, "tokenizer", base_dir, &d->tokenizer));
    ZT_TRY(get_int_min(&o, "sample_tokens", 0, &d->sample_tokens));
    const char *prompt = NULL;
    ZT_TRY(zt_json_get_string(&o, "sample_prompt", &prompt, NULL));
    if (prompt && !(d->sample_prompt = zt_json_strdup(prompt)))
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", o.source);
    if (d->sample_tokens > 0 && !d->tokenizer)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "sample_tokens",
                                 "is %d but data.tokenizer is not set", d->sample_tokens);
    const char *format = NULL;
    ZT_TRY(zt_json_get_string(&o, "format", &format, NULL));
    if (format && strcmp(format, "masked") == 0)
        d->format = ZT_DATA_FORMAT_MASKED;
    else if (format && strcmp(format, "tokens") != 0)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "format", "is \"%s\"; known: \"tokens\" "
                                 "(every token trained), \"masked\" (token files with a loss "
                                 "mask X.mask)", format);
    const char *packing = NULL;
    ZT_TRY(zt_json_get_string(&o, "packing", &packing, NULL));
    if (packing && strcmp(packing, "padded") == 0)
        d->packing = ZT_DATA_PADDED;
    else if (packing && strcmp(packing, "packed") != 0)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "packing", "is \"%s\"; known: \"packed\", "
                                 "\"padded\"", packing);
    if (packing && d->format != ZT_DATA_FORMAT_MASKED)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "packing", "needs data.format \"masked\" "
                                 "(documents are marked in the loss mask)");
    d->shuffle = true;
    return zt_json_get_bool(&o, "shuffle", &d->shuffle, NULL);
}

static zt_status parse_train(zt_train_spec *t, const zt_data_spec *data, const zt_json_obj *top,
                             const char *base_dir) {
    zt_json_obj o;
    ZT_TRY(zt_json_child(top, "train", &o));
    ZT_TRY(zt_job_keys_check(&o, "train"));
    *t = (zt_train_spec){.epochs = 1, .log_interval = 10, .eval_steps = 20, .warmup_steps = 5,
                         .seed = 1234};
    bool found;
    ZT_TRY(zt_json_get_int64(&o, "max_steps", &t->max_steps, &found));
    if (found && t->max_steps < 0)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "max_steps", "must be >= 0, got %lld",
                                 (long long)t->max_steps);
    ZT_TRY(get_int_min(&o, "epochs", 1, &t->epochs));
    ZT_TRY(get_int_min(&o, "log_interval", 1, &t->log_interval));
    ZT_TRY(get_int_min(&o, "eval_interval", 0, &t->eval_interval));
    ZT_TRY(get_int_min(&o, "eval_steps", 1, &t->eval_steps));
    ZT_TRY(get_path(&o, "checkpoint_dir", base_dir, &t->checkpoint_dir));
    ZT_TRY(get_int_min(&o, "checkpoint_interval", 0, &t->checkpoint_interval));
    ZT_TRY(zt_json_get_bool(&o, "resume", &t->resume, NULL));
    ZT_TRY(get_int_min(&o, "bench_steps", 0, &t->bench_steps));
    ZT_TRY(get_int_min(&o, "warmup_steps", 0, &t->warmup_steps));
    int64_t seed = 1234;
    ZT_TRY(zt_json_get_int64(&o, "seed", &seed, &found));
    if (found && seed < 0)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "seed", "must be >= 0, got %lld", (long long)seed);
    t->seed = (uint64_t)seed;
    ZT_TRY(zt_json_get_bool(&o, "activation_checkpointing", &t->activation_checkpointing, NULL));
    t->activation_checkpoint_interval = 1;
    ZT_TRY(get_int_min(&o, "activation_checkpoint_interval", 1,
                       &t->activation_checkpoint_interval));

    const char *src = top->source;
    if (t->eval_interval > 0 && !data->val)
        return zt_error(ZT_ERR_INVALID, "%s: train.eval_interval is %d but data.val is not set", src,
                        t->eval_interval);
    if (t->resume && !t->checkpoint_dir)
        return zt_error(ZT_ERR_INVALID, "%s: train.resume is true but train.checkpoint_dir is not set", src);
    if (t->checkpoint_interval > 0 && !t->checkpoint_dir)
        return zt_error(ZT_ERR_INVALID, "%s: train.checkpoint_interval is %d but train.checkpoint_dir "
                        "is not set", src, t->checkpoint_interval);
    return ZT_OK;
}

/* A double argument with an inclusive lower bound (and an upper one when hi >= lo). */
static zt_status get_arg_double(const zt_json_obj *o, const char *key, double lo, double hi,
                                double *out, unsigned bit, unsigned *given) {
    bool found;
    ZT_TRY(zt_json_get_double(o, key, out, &found));
    if (!found)
        return ZT_OK;
    if (*out < lo || (hi >= lo && *out > hi)) {
        if (hi >= lo)
            return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be between %g and %g, got %g", lo,
                                     hi, *out);
        return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be >= %g, got %g", lo, *out);
    }
    *given |= bit;
    return ZT_OK;
}

static const char *const training_args_keys[] = {
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
    "max_grad_norm", "per_device_train_batch_size", "gradient_accumulation_steps",
    "warmup_steps", "warmup_ratio", "lr_scheduler_type", "bf16", "fp16",
    "gradient_checkpointing", NULL};

/* "training_args": Hugging Face TrainingArguments' names, ranges and defaults. */
static zt_status parse_training_args(zt_training_args *a, const zt_json_obj *top) {
    zt_json_obj o;
    zt_training_args_defaults(a);
    ZT_TRY(zt_json_child(top, "training_args", &o));
    ZT_TRY(zt_job_keys_check(&o, "training_args"));
    unsigned *g = &a->given;
    ZT_TRY(get_arg_double(&o, "learning_rate", 0, -1, &a->learning_rate, ZT_ARG_LEARNING_RATE, g));
    ZT_TRY(get_arg_double(&o, "weight_decay", 0, -1, &a->weight_decay, ZT_ARG_WEIGHT_DECAY, g));
    ZT_TRY(get_arg_double(&o, "adam_beta1", 0, 0.999999, &a->adam_beta1, ZT_ARG_ADAM_BETAS, g));
    ZT_TRY(get_arg_double(&o, "adam_beta2", 0, 0.999999, &a->adam_beta2, ZT_ARG_ADAM_BETAS, g));
    ZT_TRY(get_arg_double(&o, "adam_epsilon", 0, -1, &a->adam_epsilon, ZT_ARG_ADAM_EPSILON, g));
    ZT_TRY(get_arg_double(&o, "warmup_ratio", 0, 1, &a->warmup_ratio, ZT_ARG_WARMUP, g));
    /* Any number: the Trainer clips only when max_grad_norm > 0, and DeepSpeed, which
     * "gradient_clipping": "auto" hands it to, only when gradient_clipping > 0, so 0 and below
     * are no clipping, as they are here (ds_config.h: gradient_clipping). */
    bool found;
    ZT_TRY(zt_json_get_double(&o, "max_grad_norm", &a->max_grad_norm, &found));
    *g |= found ? ZT_ARG_MAX_GRAD_NORM : 0;
    ZT_TRY(get_int_min(&o, "per_device_train_batch_size", 1, &a->per_device_train_batch_size));
    if (zt_json_item(&o, "per_device_train_batch_size"))
        *g |= ZT_ARG_PER_DEVICE_TRAIN_BATCH_SIZE;
    ZT_TRY(get_int_min(&o, "gradient_accumulation_steps", 1, &a->gradient_accumulation_steps));
    if (zt_json_item(&o, "gradient_accumulation_steps"))
        *g |= ZT_ARG_GRADIENT_ACCUMULATION_STEPS;
    /* transformers 5 declares it a float: an int is steps, a float in [0, 1) a ratio
     * (TrainingArguments.get_warmup_steps); its __post_init__ refuses a negative one. */
    ZT_TRY(zt_json_get_double(&o, "warmup_steps", &a->warmup_steps, &found));
    if (found && a->warmup_steps < 0)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "warmup_steps", "must be >= 0, got %g "
                                 "(transformers: Got warmup_steps = %g, Expected value "
                                 "warmup_steps >= 0)", a->warmup_steps, a->warmup_steps);
    *g |= found ? ZT_ARG_WARMUP : 0;
    ZT_TRY(zt_json_get_bool(&o, "bf16", &a->bf16, &found));
    *g |= found ? ZT_ARG_BF16 : 0;
    ZT_TRY(zt_json_get_bool(&o, "fp16", &a->fp16, &found));
    *g |= found ? ZT_ARG_FP16 : 0;
    ZT_TRY(zt_json_get_bool(&o, "gradient_checkpointing", &a->gradient_checkpointing, NULL));
    if (a->bf16 && a->fp16)
        return zt_error(ZT_ERR_INVALID, "%s: training_args.bf16 and training_args.fp16 cannot both "
                        "be true", top->source);
    static const char *const schedules[] = {"linear", "constant", "constant_with_warmup", NULL};
    const char *sched = NULL;
    ZT_TRY(zt_json_get_string(&o, "lr_scheduler_type", &sched, NULL));
    if (sched) {
        bool known = false;
        for (const char *const *k = schedules; *k; k++)
            known = known || strcmp(sched, *k) == 0;
        if (!known)
            return zt_json_key_error(ZT_ERR_INVALID, &o, "lr_scheduler_type", "\"%s\" is not supported "
                                     "(supported: linear, constant, constant_with_warmup)", sched);
        snprintf(a->lr_scheduler_type, sizeof a->lr_scheduler_type, "%s", sched);
    }
    return ZT_OK;
}

/* The DeepSpeed config as the job's script leaves it (ds_config_auto.c), parsed, with its
 * effective form kept for the run directory. */
static zt_status read_ds(zt_job_spec *job, const cJSON *ds, const char *source) {
    /* A pipelined job's data-parallel size is its world size over the stages. */
    zt_ds_auto_context ctx = {.world_size = job->world_size / job->pipeline.stages,
                              .hidden_size = job->model.n_embd,
                              .max_steps = job->train.max_steps};
    cJSON *resolved = NULL;
    /* The DeepSpeed parser names fields within its document; here that document is the job's
     * "deepspeed". */
    zt_status s = zt_ds_config_from_script(&job->ds, ds, source, &job->args, &ctx, &resolved);
    if (s != ZT_OK)
        return zt_error_field_prefix(s, "deepspeed");
    job->ds_effective_json = zt_ds_config_effective_json(&job->ds, resolved);
    cJSON_Delete(resolved);
    if (!job->ds_effective_json)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory printing the effective config", source);
    return ZT_OK;
}

/* The DeepSpeed config: an inline object, or a path to a ds_config.json beside the job file. */

/* Resolves a relative path held in a fixed-size config buffer against the job's directory, in
 * place; absolute paths stay as they are, and so does "" when it means unset
 * (empty_is_unset) rather than the directory itself. */
static zt_status resolve_in_place(const char *base_dir, char *buf, size_t size, bool empty_is_unset,
                                  const char *what, const char *src) {
    if ((empty_is_unset && !buf[0]) || buf[0] == '/')
        return ZT_OK;
    char *path = resolve_path(base_dir, buf);
    if (!path)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory resolving %s", src, what);
    size_t len = strlen(path);
    if (len < size)
        memcpy(buf, path, len + 1);
    free(path);
    if (len >= size)
        return zt_error(ZT_ERR_INVALID, "%s: deepspeed: %s is longer than %zu bytes once resolved "
                        "against the job's directory", src, what, size - 1);
    return ZT_OK;
}
static zt_status parse_deepspeed(zt_job_spec *job, const zt_json_obj *top, const char *base_dir) {
    const char *src = top->source;
    ZT_TRY(zt_json_require(top, "deepspeed"));
    const cJSON *ds = zt_json_item(top, "deepspeed");
    zt_status s;
    if (cJSON_IsObject(ds)) {
        char ds_source[512];
        snprintf(ds_source, sizeof ds_source, "%s: deepspeed", src);
        ZT_TRY(read_ds(job, ds, ds_source));
        job->ds_json = zt_json_print(ds, false);
    } else if (cJSON_IsString(ds)) {
        if (!ds->valuestring[0])
            return zt_json_key_error(ZT_ERR_INVALID, top, "deepspeed", "must not be an empty path");
        char *path = resolve_path(base_dir, ds->valuestring);
        if (!path)
            return ZT_ERR_NOMEM;
        cJSON *root = NULL;
        s = zt_json_load_config(path, &root);
        if (s == ZT_ERR_IO)
            zt_error_prefix(s, "%s: deepspeed: ", src);
        if (s == ZT_OK) {
            s = read_ds(job, root, path);
            if (s == ZT_OK)
                job->ds_json = zt_json_print(root, false);
        }
        cJSON_Delete(root);
        free(path);
        ZT_TRY(s);
    } else {
        char got[96];
        zt_json_repr(ds, got, sizeof got);
        return zt_json_key_error(ZT_ERR_INVALID, top, "deepspeed",
                                 "must be an object or a path to a DeepSpeed config file, got %s", got);
    }
    if (!job->ds_json)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory printing the DeepSpeed config", src);
    /* A relative nvme_path is relative to the job file, as the job's other paths are. */
    ZT_TRY(resolve_in_place(base_dir, job->ds.zero.offload_optimizer.nvme_path,
                            sizeof job->ds.zero.offload_optimizer.nvme_path, true,
                            "zero_optimization.offload_optimizer.nvme_path", src));
    ZT_TRY(resolve_in_place(base_dir, job->ds.zero.offload_param.nvme_path,
                            sizeof job->ds.zero.offload_param.nvme_path, true,
                            "zero_optimization.offload_param.nvme_path", src));
    /* DeepSpeed's monitors write under the launch directory; a job's is its file's directory. */
    ZT_TRY(resolve_in_place(base_dir, job->ds.monitor.tensorboard.dir,
                            sizeof job->ds.monitor.tensorboard.dir, false,
                            "tensorboard output_path/job_name", src));
    ZT_TRY(resolve_in_place(base_dir, job->ds.monitor.csv.dir, sizeof job->ds.monitor.csv.dir,
                            false, "csv_monitor output_path/job_name", src));
    return ZT_OK;
}

/* "runs/gpt2-small.json" names the job "gpt2-small". */
static char *default_name(const char *source) {
    const char *base = strrchr(source, '/');
    base = base ? base + 1 : source;
    char *name = zt_json_strdup(base);
    if (!name)
        return NULL;
    size_t n = strlen(name);
    if (n > 5 && strcmp(name + n - 5, ".json") == 0)
        name[n - 5] = '\0';
    return name;
}

/* A name is shown in terminals (`ztrain list`), in file names and in Prometheus labels: printable
 * UTF-8 of bounded length, so that it can neither drive the terminal nor hide what follows it.
 * It is also the default run directory of `ztrain run` (runs/<name>), so it is one ordinary path
 * component: not empty (ztraind's "must not be empty"), no '/', no leading '.' (".." would
 * climb out of runs/, "." would be runs/ itself). */
static zt_status check_name(const char *name, const char *source) {
    size_t n = strlen(name), at;
    char why[ZT_TEXT_WHY_SIZE];
    if (n == 0)
        return zt_error_field(zt_error(ZT_ERR_INVALID, "%s: name: must not be empty", source),
                              "name");
    if (name[0] == '.' || strchr(name, '/'))
        return zt_error_field(zt_error(ZT_ERR_INVALID, "%s: name: \"%s\" %s (a job name is one "
                                       "path component: runs/<name> is its default run "
                                       "directory)", source, name,
                                       name[0] == '.' ? "starts with '.'" : "has a '/'"),
                              "name");
    if (n > ZT_JOB_NAME_MAX)
        return zt_error(ZT_ERR_INVALID, "%s: name: %zu bytes is above the limit of %d", source, n,
                        ZT_JOB_NAME_MAX);
    if (!zt_text_check(name, n, ZT_TEXT_PRINTABLE, &at, why))
        return zt_error(ZT_ERR_INVALID, "%s: name: %s at byte %zu (a job name is printable "
                        "UTF-8 text)", source, why, at);
    return ZT_OK;
}

/* "events" is read by its own parser (engine/observe/anomaly_spec.c); "alerts" by ztraind's, which
 * needs only that it is an object here. */
static zt_status parse_events(zt_job_spec *job, const zt_json_obj *top) {
    zt_json_obj alerts;
    ZT_TRY(zt_json_child(top, "alerts", &alerts));
    const cJSON *ev = zt_json_item(top, "events");
    char *text = ev ? cJSON_PrintUnformatted(ev) : NULL;
    if (ev && !text)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory reading events", top->source);
    zt_status s = zt_events_spec_parse(&job->events, text, top->source);
    cJSON_free(text);
    return s;
}

static zt_status job_from_json(zt_job_spec *job, const cJSON *root, const char *source,
                               const char *base_dir) {
    if (!cJSON_IsObject(root)) {
        char got[64];
        zt_json_repr(root, got, sizeof got);
        return zt_error(ZT_ERR_INVALID, "%s: a job spec must be a JSON object, got %s", source, got);
    }
    ZT_TRY(zt_json_check_duplicates(root, source, "job spec", "", "deepspeed"));
    ZT_TRY(zt_json_check_finite(root, source, "", "deepspeed"));
    zt_json_obj top;
    zt_json_obj_init(&top, root, source, "");
    ZT_TRY(zt_job_keys_check(&top, ""));

    job->base_dir = zt_json_strdup(base_dir && base_dir[0] ? base_dir : ".");
    if (!job->base_dir)
        return ZT_ERR_NOMEM;
    const char *name = NULL;
    ZT_TRY(zt_json_get_string(&top, "name", &name, NULL));
    job->name = name ? zt_json_strdup(name) : default_name(source);
    if (!job->name)
        return ZT_ERR_NOMEM;
    ZT_TRY(check_name(job->name, source));

    job->world_size = 1;
    ZT_TRY(get_int_min(&top, "world_size", 1, &job->world_size));
    if (job->world_size > ZT_MAX_WORLD)
        return zt_json_key_error(ZT_ERR_INVALID, &top, "world_size",
                                 "(%d) is above ztrain's limit of %d ranks (ZT_MAX_WORLD)",
                                 job->world_size, ZT_MAX_WORLD);
    /* Where the ranks run is the launcher's business (srun --nodes); the spec only has to be
     * possible: every node gets at least one rank. */
    job->nodes = 1;
    ZT_TRY(get_int_min(&top, "nodes", 1, &job->nodes));
    if (job->nodes > job->world_size)
        return zt_json_key_error(ZT_ERR_INVALID, &top, "nodes", "(%d) must not exceed world_size "
                                 "(%d): every node runs at least one rank", job->nodes,
                                 job->world_size);
    const char *comm = "auto";
    ZT_TRY(zt_json_get_string(&top, "comm", &comm, NULL));
    if (!zt_comm_choice_parse(comm, &job->comm))
        return zt_json_key_error(ZT_ERR_INVALID, &top, "comm",
                                 "must be \"auto\", \"shm\", \"gloo\" or \"nccl\", got \"%s\"",
                                 comm);
    const char *device = "cpu";
    ZT_TRY(zt_json_get_string(&top, "device", &device, NULL));
    if (strcmp(device, "cpu") == 0)
        job->device = ZT_DEVICE_CPU;
    else if (strcmp(device, "cuda") == 0)
        job->device = ZT_DEVICE_CUDA;
    else
        return zt_json_key_error(ZT_ERR_INVALID, &top, "device", "must be \"cpu\" or \"cuda\", got \"%s\"",
                                 device);
    if (!zt_backend_available(job->device))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: device \"%s\" is not supported yet in this build "
                        "(configure with -DZT_CUDA=ON)", source, device);
    /* Whether this host has the device is not the spec's business: a daemon on a head node
     * without GPUs submits GPU jobs to Slurm nodes that have them. What runs the ranks checks
     * (`ztrain run`, ztraind's local launcher through its GPU pool, the worker's backend). */

    ZT_TRY(parse_model(&job->model, &top, job->base_dir));
    ZT_TRY(parse_data(&job->data, &top, job->base_dir));
    ZT_TRY(parse_train(&job->train, &job->data, &top, job->base_dir));
    ZT_TRY(parse_training_args(&job->args, &top));
    ZT_TRY(zt_job_parse_pipeline(job, &top));
    ZT_TRY(zt_job_spec_parse_recovery(job, &top));
    ZT_TRY(parse_deepspeed(job, &top, job->base_dir));
    ZT_TRY(parse_events(job, &top));
    ZT_TRY(zt_job_check_pipeline(job, source));
    ZT_TRY(zt_job_check_tp(job, source));
    ZT_TRY(zt_job_activation_checkpointing(job, &top));
    /* Sizing the model for its micro-batch refuses, naming the field, a spec whose sizes would
     * overflow, wherever a spec is read; activations are sized at fp32, the widest. */
    zt_model_estimate est;
    zt_model_estimate_args args = {.micro_batch = job->ds.train_micro_batch_size_per_gpu,
                                   .act_size = sizeof(float)};
    return zt_model_estimate_spec(&job->model, &args, source, &est);
}

zt_status zt_job_spec_parse(zt_job_spec *job, const char *json_text, const char *source,
                            const char *base_dir) {
    memset(job, 0, sizeof *job);
    cJSON *root;
    ZT_TRY(zt_json_parse(json_text, source, &root));
    zt_status s = job_from_json(job, root, source, base_dir);
    cJSON_Delete(root);
    if (s != ZT_OK)
        zt_job_spec_free(job);
    return s;
}

zt_status zt_job_spec_load(zt_job_spec *job, const char *path) {
    memset(job, 0, sizeof *job);
    char *text;
    ZT_TRY(zt_json_read_config(path, &text, NULL));

    /* The job file's directory, absolute, so relative paths mean the same thing to every rank. */
    char *dir = zt_json_strdup(path);
    if (!dir) {
        free(text);
        return ZT_ERR_NOMEM;
    }
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, strlen(dir) + 1, ".");
    else if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    char *abs = realpath(dir, NULL);

    zt_status s = zt_job_spec_parse(job, text, path, abs ? abs : dir);
    free(abs);
    free(dir);
    free(text);
    return s;
}

/* The model's path fields are heap strings the spec owns. */
static void free_model_paths(zt_model_spec *m) {
    const zt_model_family *fam = zt_model_family_find(m->type);
    for (const zt_model_field *f = fam ? fam->fields : NULL; f && f->key; f++) {
        if (f->kind == ZT_FIELD_PATH) {
            char **path = (char **)((char *)m + f->offset);
            free(*path);
            *path = NULL;
        }
    }
}

void zt_job_spec_free(zt_job_spec *job) {
    free(job->name);
    free_model_paths(&job->model);
    free(job->data.train);
    for (int i = 0; i < job->data.n_train_mix; i++)
        free(job->data.train_mix[i].path);
    free(job->data.train_mix);
    free(job->data.val);
    for (int i = 0; i < job->data.n_train_files; i++)
        free(job->data.train_files[i]);
    free(job->data.train_files);
    for (int i = 0; i < job->data.n_val_files; i++)
        free(job->data.val_files[i]);
    free(job->data.val_files);
    free(job->data.tokenizer);
    free(job->data.sample_prompt);
    free(job->train.checkpoint_dir);
    free(job->fork_job);
    free(job->service_job_id);
    /* ds_json comes from cJSON's allocator. */
    if (job->ds_json)
        cJSON_free(job->ds_json);
    free(job->ds_effective_json);
    free(job->base_dir);
    memset(job, 0, sizeof *job);
}

void zt_job_spec_print_notes(const zt_job_spec *job, FILE *f) {
    fputs(job->ds.resolved, f);
    zt_ds_config_print_warnings(&job->ds, f);
}

zt_status zt_job_spec_write_effective(const zt_job_spec *job, const char *dir) {
    if (!job->ds_effective_json)
        return ZT_OK;
    ZT_TRY(zt_mkdirs(dir));
    char path[4200];
    snprintf(path, sizeof path, "%s/ds_config.effective.json", dir);
    char *text = NULL;
    size_t n = strlen(job->ds_effective_json);
    text = malloc(n + 2);
    if (!text)
        return zt_error(ZT_ERR_NOMEM, "out of memory writing %s", path);
    memcpy(text, job->ds_effective_json, n);
    text[n] = '\n';
    text[n + 1] = '\0';
    zt_status s = zt_write_file_atomic(path, text, n + 1);
    free(text);
    return s;
}

const char *const *zt_job_spec_keys(const char *section) {
    static const struct {
        const char *section;
        const char *const *keys;
    } tables[] = {
        {"", top_keys},           {"data", data_keys},
        {"data.train[]", source_keys}, {"train", train_keys},
        {"training_args", training_args_keys}, {"pipeline", zt_job_pipeline_keys},
        {"fork_from", zt_job_fork_keys},
    };
    for (size_t i = 0; section && i < sizeof tables / sizeof tables[0]; i++)
        if (strcmp(tables[i].section, section) == 0)
            return tables[i].keys;
    return NULL;
}
