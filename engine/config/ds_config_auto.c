/* The DeepSpeed config as the training script leaves it: "auto" values filled from the job's
 * training_args the way Hugging Face's Trainer fills them (transformers' integrations/deepspeed.py,
 * HfTrainerDeepSpeedConfig.trainer_config_process and trainer_config_finalize), missing batch keys
 * and a missing optimizer supplied as the script would supply them. Works on the JSON tree, before
 * the parser reads it, so the parser judges the result like any config. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ds_config_json.h"
#include "ds_config_internal.h"

void zt_training_args_defaults(zt_training_args *a) {
    *a = (zt_training_args){.learning_rate = 5e-5, .adam_beta1 = 0.9, .adam_beta2 = 0.999,
                            .adam_epsilon = 1e-8, .max_grad_norm = 1.0,
                            .per_device_train_batch_size = 8, .gradient_accumulation_steps = 1};
}

typedef struct {
    cJSON *root;
    const zt_training_args *args;
    const char *source;
    char *log;
    size_t log_size;
    char *batch_fills; /* the batch keys' lines of log, for a batch error to quote */
    size_t batch_fills_size;
    char mismatches[2048];
} resolver;

/* Appends the line `text` to buf, or nothing when it does not fit whole. */
static void append_line(char *buf, size_t size, const char *text) {
    size_t used = strlen(buf), n = strlen(text);
    if (used + n + 2 > size)
        return;
    memcpy(buf + used, text, n);
    buf[used + n] = '\n';
    buf[used + n + 1] = '\0';
}

static void log_line(resolver *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(resolver *r, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line)
        return;
    append_line(r->log, r->log_size, line);
}

static bool is_batch_key(const char *path) {
    return strcmp(path, "train_batch_size") == 0 ||
           strcmp(path, "train_micro_batch_size_per_gpu") == 0 ||
           strcmp(path, "gradient_accumulation_steps") == 0;
}

/* What the resolver did to a batch key, logged and kept for a batch error to quote (the parser's
 * "Gradient accumulation steps: 0 has to be greater than 0" says nothing of where a value came
 * from). */
static void log_batch(resolver *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_batch(resolver *r, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line)
        return;
    log_line(r, "ztrain: %s: %s", r->source, line);
    append_line(r->batch_fills, r->batch_fills_size, line);
}

/* The object that holds the last component of a dotted path, and that component; NULL when a
 * section on the way is absent (HF's find_config_node). */
static cJSON *find_node(cJSON *root, const char *path, const char **key) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    cJSON *node = root;
    char *part = buf, *dot;
    while ((dot = strchr(part, '.')) != NULL) {
        *dot = '\0';
        node = cJSON_GetObjectItemCaseSensitive(node, part);
        if (!cJSON_IsObject(node))
            return NULL;
        part = dot + 1;
    }
    *key = path + (part - buf);
    return node;
}

static bool is_auto(const cJSON *v) {
    return cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0;
}

static void value_text(const cJSON *v, char *buf, size_t n) {
    char *t = cJSON_PrintUnformatted(v);
    snprintf(buf, n, "%s", t ? t : "?");
    cJSON_free(t);
}

/* HF's fill_match: "auto" becomes hf_val (logged); otherwise, when the job gave the argument
 * (`given`), a different value is a mismatch. hf_val is consumed. */
static void fill(resolver *r, const char *path, cJSON *hf_val, const char *hf_key, bool given) {
    const char *key = NULL;
    cJSON *node = find_node(r->root, path, &key);
    cJSON *cur = node ? cJSON_GetObjectItemCaseSensitive(node, key) : NULL;
    char text[128];
    value_text(hf_val, text, sizeof text);
    if (is_auto(cur)) {
        if (is_batch_key(path))
            log_batch(r, "\"auto\" %s = %s (%s)", path, text, hf_key);
        else
            log_line(r, "ztrain: %s: \"auto\" %s = %s (%s)", r->source, path, text, hf_key);
        cJSON_ReplaceItemInObjectCaseSensitive(node, key, hf_val);
        return;
    }
    bool differs = cur && !cJSON_IsNull(cur) && !cJSON_Compare(cur, hf_val, true);
    if (given && differs) {
        char ds[128];
        value_text(cur, ds, sizeof ds);
        /* HF's text names the TrainingArguments field alone. */
        const char *name = strncmp(hf_key, "training_args.", 14) == 0 ? hf_key + 14 : hf_key;
        size_t used = strlen(r->mismatches);
        snprintf(r->mismatches + used, sizeof r->mismatches - used, "\n- ds %s=%s vs hf %s=%s", path,
                 ds, name, text);
    }
    cJSON_Delete(hf_val);
}

static bool given(const zt_training_args *a, unsigned bit) {
    return (a->given & bit) != 0;
}

static cJSON *betas(const zt_training_args *a) {
    double b[2] = {a->adam_beta1, a->adam_beta2};
    return cJSON_CreateDoubleArray(b, 2);
}

/* A batch key the config lacks, supplied (and logged) as the script would supply it. */
static void supply(resolver *r, cJSON *obj, const char *key, cJSON *v, const char *why) {
    char text[256];
    value_text(v, text, sizeof text);
    log_batch(r, "%s = %s (%s)", key, text, why);
    cJSON_AddItemToObject(obj, key, v);
}

static int zero_stage(const cJSON *root) {
    const cJSON *z = cJSON_GetObjectItemCaseSensitive(root, "zero_optimization");
    const cJSON *s = cJSON_IsObject(z) ? cJSON_GetObjectItemCaseSensitive(z, "stage") : NULL;
    if (cJSON_IsTrue(z))
        return 1;
    /* Only stage 3 matters here; a stage outside 0-3 (or not a number) is refused by the
     * config's own check later, and converting it to int first would be undefined. */
    if (!cJSON_IsNumber(s) || !(s->valuedouble >= 0 && s->valuedouble <= 3))
        return 0;
    return (int)s->valuedouble;
}

/* The micro batch or accumulation the config fixes (a whole number >= 1, as the parser will
 * take it) and its name, else the Trainer's argument: an argument the job leaves at its default is
 * not compared with the config (docs/deepspeed.md), so the config's value is the one in force. */
static double batch_factor(const resolver *r, const char *key, double arg, const char *arg_name,
                           char *name, size_t name_size) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
    bool fixed = cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 0x7fffffff &&
                 v->valuedouble == floor(v->valuedouble);
    snprintf(name, name_size, "%s %g", fixed ? key : arg_name, fixed ? v->valuedouble : arg);
    return fixed ? v->valuedouble : arg;
}

/* HF's train_batch_size = world_size * per_device_train_batch_size * gradient_accumulation_steps,
 * with the micro batch and accumulation in force (batch_factor): "auto" beside a fixed
 * train_micro_batch_size_per_gpu 16 is 16 * world_size, not the default argument's 8, which
 * DeepSpeed would refuse as 0 accumulation steps. Where the job gives the arguments, a config
 * value that differs is the mismatch error in any case. */
static void fill_train_batch(resolver *r, int world, bool given) {
    const zt_training_args *a = r->args;
    char micro[96], gas[96], why[256] = "train_batch_size (calculated)";
    double tbs = world *
                 batch_factor(r, "train_micro_batch_size_per_gpu", a->per_device_train_batch_size,
                              "training_args.per_device_train_batch_size", micro, sizeof micro) *
                 batch_factor(r, "gradient_accumulation_steps", a->gradient_accumulation_steps,
                              "training_args.gradient_accumulation_steps", gas, sizeof gas);
    if (is_auto(cJSON_GetObjectItemCaseSensitive(r->root, "train_batch_size")))
        snprintf(why, sizeof why, "data-parallel size %d * %s * %s", world, micro, gas);
    fill(r, "train_batch_size", cJSON_CreateNumber(tbs), why, given);
}

/* trainer_config_process: batch, clipping, optimizer and scheduler values, precision. */
static void fill_from_args(resolver *r, int world) {
    const zt_training_args *a = r->args;
    bool pb = given(a, ZT_ARG_PER_DEVICE_TRAIN_BATCH_SIZE);
    bool gas = given(a, ZT_ARG_GRADIENT_ACCUMULATION_STEPS);
    /* The job's text says when the value is the argument's default, which it never wrote. */
    fill(r, "train_micro_batch_size_per_gpu", cJSON_CreateNumber(a->per_device_train_batch_size),
         pb ? "training_args.per_device_train_batch_size"
            : "training_args.per_device_train_batch_size, not set: the Trainer's default", pb);
    fill(r, "gradient_accumulation_steps", cJSON_CreateNumber(a->gradient_accumulation_steps),
         gas ? "training_args.gradient_accumulation_steps"
             : "training_args.gradient_accumulation_steps, not set: the Trainer's default", gas);
    fill_train_batch(r, world, pb || gas);
    fill(r, "gradient_clipping", cJSON_CreateNumber(a->max_grad_norm), "training_args.max_grad_norm",
         given(a, ZT_ARG_MAX_GRAD_NORM));
    fill(r, "optimizer.params.lr", cJSON_CreateNumber(a->learning_rate), "training_args.learning_rate",
         given(a, ZT_ARG_LEARNING_RATE));
    fill(r, "optimizer.params.betas", betas(a), "training_args.adam_beta1+adam_beta2",
         given(a, ZT_ARG_ADAM_BETAS));
    fill(r, "optimizer.params.eps", cJSON_CreateNumber(a->adam_epsilon), "training_args.adam_epsilon",
         given(a, ZT_ARG_ADAM_EPSILON));
    fill(r, "optimizer.params.weight_decay", cJSON_CreateNumber(a->weight_decay),
         "training_args.weight_decay", given(a, ZT_ARG_WEIGHT_DECAY));
    fill(r, "scheduler.params.warmup_min_lr", cJSON_CreateNumber(0), "not a Trainer argument", false);
    fill(r, "scheduler.params.warmup_max_lr", cJSON_CreateNumber(a->learning_rate),
         "training_args.learning_rate", given(a, ZT_ARG_LEARNING_RATE));
    fill(r, "fp16.enabled", cJSON_CreateBool(a->fp16), "training_args.fp16", given(a, ZT_ARG_FP16));
    fill(r, "amp.enabled", cJSON_CreateBool(false), "Trainer fp16_backend amp", false);
    fill(r, "amp.opt_level", cJSON_CreateString("O1"), "Trainer fp16_opt_level", false);
    fill(r, "bf16.enabled", cJSON_CreateBool(a->bf16), "training_args.bf16", given(a, ZT_ARG_BF16));
}

/* trainer_config_finalize: the sizes HF derives from the model's hidden size, and the schedule's
 * step counts. */
static zt_status fill_finalize(resolver *r, const zt_ds_auto_context *ctx) {
    double h = ctx->hidden_size;
    fill(r, "zero_optimization.reduce_bucket_size", cJSON_CreateNumber(h * h), "model hidden size squared",
         false);
    if (zero_stage(r->root) == 3) {
        fill(r, "zero_optimization.stage3_prefetch_bucket_size", cJSON_CreateNumber(floor(0.9 * h * h)),
             "0.9 * model hidden size squared", false);
        fill(r, "zero_optimization.stage3_param_persistence_threshold", cJSON_CreateNumber(10 * h),
             "10 * model hidden size", false);
    }
    const char *key = NULL;
    cJSON *params = find_node(r->root, "scheduler.params.total_num_steps", &key);
    bool needs_total =
        params && (is_auto(cJSON_GetObjectItemCaseSensitive(params, "total_num_steps")) ||
                   is_auto(cJSON_GetObjectItemCaseSensitive(params, "warmup_num_steps")));
    if (needs_total && ctx->max_steps <= 0)
        return zt_error(ZT_ERR_INVALID, "%s: scheduler.params total_num_steps / warmup_num_steps "
                        "\"auto\" need the number of training steps: set train.max_steps in the job",
                        r->source);
    if (!params || ctx->max_steps <= 0)
        return ZT_OK;
    const zt_training_args *a = r->args;
    double total = (double)ctx->max_steps;
    /* TrainingArguments.get_warmup_steps: transformers 5 reads warmup_steps >= 1 as steps
     * (int()) and one in (0, 1) as a ratio; transformers 4 reads warmup_ratio when warmup_steps
     * is 0. Like transformers 5's integration, at least 1: DeepSpeed >= 0.19.6 refuses 0. */
    double w = a->warmup_steps, warmup;
    const char *from;
    if (w >= 1) {
        warmup = floor(w);
        from = "training_args.warmup_steps";
    } else if (w > 0) {
        warmup = ceil(total * w);
        from = "ceil(train.max_steps * training_args.warmup_steps), transformers 5's ratio";
    } else {
        warmup = ceil(total * a->warmup_ratio);
        from = "ceil(train.max_steps * training_args.warmup_ratio)";
    }
    if (warmup < 1)
        warmup = 1;
    fill(r, "scheduler.params.total_num_steps", cJSON_CreateNumber(total), "train.max_steps", false);
    fill(r, "scheduler.params.warmup_num_steps", cJSON_CreateNumber(warmup), from,
         given(a, ZT_ARG_WARMUP));
    return ZT_OK;
}

/* Batch keys a config leaves out altogether: DeepSpeed refuses a config with neither
 * train_batch_size nor train_micro_batch_size_per_gpu; the script's DataLoader has a batch size. */
static void supply_batch(resolver *r) {
    cJSON *root = r->root;
    if (cJSON_GetObjectItemCaseSensitive(root, "train_batch_size") ||
        cJSON_GetObjectItemCaseSensitive(root, "train_micro_batch_size_per_gpu"))
        return;
    supply(r, root, "train_micro_batch_size_per_gpu",
           cJSON_CreateNumber(r->args->per_device_train_batch_size),
           "missing; training_args.per_device_train_batch_size");
    if (!cJSON_GetObjectItemCaseSensitive(root, "gradient_accumulation_steps"))
        supply(r, root, "gradient_accumulation_steps",
               cJSON_CreateNumber(r->args->gradient_accumulation_steps),
               "missing; training_args.gradient_accumulation_steps");
}

/* No "optimizer": the script passes its own, as the Trainer passes torch's AdamW. */
static void supply_optimizer(resolver *r) {
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(r->root, "optimizer");
    if (opt && !cJSON_IsNull(opt))
        return;
    cJSON_DeleteItemFromObjectCaseSensitive(r->root, "optimizer");
    const zt_training_args *a = r->args;
    cJSON *o = cJSON_AddObjectToObject(r->root, "optimizer");
    cJSON_AddStringToObject(o, "type", "AdamW");
    cJSON *p = cJSON_AddObjectToObject(o, "params");
    cJSON_AddNumberToObject(p, "lr", a->learning_rate);
    cJSON_AddItemToObject(p, "betas", betas(a));
    cJSON_AddNumberToObject(p, "eps", a->adam_epsilon);
    cJSON_AddNumberToObject(p, "weight_decay", a->weight_decay);
    zt_ds_warn(r->source, "no \"optimizer\" section: training with the Trainer's default AdamW "
               "(lr %g, betas [%g, %g], eps %g, weight_decay %g, from training_args)",
               a->learning_rate, a->adam_beta1, a->adam_beta2, a->adam_epsilon, a->weight_decay);
}

/* No "scheduler" and training_args.lr_scheduler_type: the Trainer's schedule as the DeepSpeed
 * schedule of the same formula (linear: WarmupDecayLR with linear warmup from 0 is transformers'
 * get_linear_schedule_with_warmup). As every DeepSpeed schedule it runs one step later than the
 * Trainer's own: DeepSpeed's first step is taken at lr 0, before the schedule's first step. */
static zt_status supply_scheduler(resolver *r, const zt_ds_auto_context *ctx) {
    const char *type = r->args->lr_scheduler_type;
    if (!type[0] || strcmp(type, "constant") == 0 ||
        cJSON_GetObjectItemCaseSensitive(r->root, "scheduler"))
        return ZT_OK;
    bool linear = strcmp(type, "linear") == 0;
    if (linear && ctx->max_steps <= 0)
        return zt_error(ZT_ERR_INVALID, "%s: training_args.lr_scheduler_type \"linear\" needs the "
                        "number of training steps: set train.max_steps in the job", r->source);
    cJSON *s = cJSON_AddObjectToObject(r->root, "scheduler");
    cJSON_AddStringToObject(s, "type", linear ? "WarmupDecayLR" : "WarmupLR");
    cJSON *p = cJSON_AddObjectToObject(s, "params");
    cJSON_AddStringToObject(p, "warmup_min_lr", "auto");
    cJSON_AddStringToObject(p, "warmup_max_lr", "auto");
    cJSON_AddStringToObject(p, "warmup_num_steps", "auto");
    cJSON_AddStringToObject(p, "warmup_type", "linear");
    if (linear)
        cJSON_AddStringToObject(p, "total_num_steps", "auto");
    log_line(r, "ztrain: %s: scheduler = %s with linear warmup (training_args.lr_scheduler_type %s)",
             r->source, linear ? "WarmupDecayLR" : "WarmupLR", type);
    return ZT_OK;
}

zt_status zt_ds_resolve_auto(cJSON *root, const zt_training_args *args,
                             const zt_ds_auto_context *ctx, const char *source, char *log,
                             size_t log_size, char *batch_fills, size_t batch_fills_size) {
    ZT_ASSERT(log && log_size > 0 && batch_fills && batch_fills_size > 0);
    log[0] = batch_fills[0] = '\0';
    if (!cJSON_IsObject(root))
        return ZT_OK; /* the parser says what is wrong */
    resolver r = {.root = root, .args = args, .source = source, .log = log, .log_size = log_size,
                  .batch_fills = batch_fills, .batch_fills_size = batch_fills_size};
    supply_optimizer(&r);
    ZT_TRY(supply_scheduler(&r, ctx));
    fill_from_args(&r, ctx->world_size);
    ZT_TRY(fill_finalize(&r, ctx));
    supply_batch(&r);
    if (r.mismatches[0])
        return zt_error(ZT_ERR_INVALID, "%s: Please correct the following DeepSpeed config values that "
                        "mismatch TrainingArguments values:%s\nThe easiest method is to set these "
                        "DeepSpeed config values to 'auto'.", source, r.mismatches);
    return ZT_OK;
}

/* The keys whose "auto" has a meaning: those the Trainer fills (fill_from_args, fill_finalize),
 * and DeepSpeed's own pipeline.stages and data_types.keep_in_fp32_modules, whose default is
 * "auto". */
static const char *const auto_keys[] = {
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
    "gradient_clipping", "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps",
    "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr", "scheduler.params.total_num_steps",
    "scheduler.params.warmup_num_steps", "fp16.enabled", "amp.enabled", "amp.opt_level",
    "bf16.enabled", "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold", "pipeline.stages",
    "data_types.keep_in_fp32_modules", NULL};

static bool auto_allowed(const char *path) {
    for (const char *const *k = auto_keys; *k; k++)
        if (strcmp(*k, path) == 0)
            return true;
    return false;
}

static zt_status strip_walk(cJSON *node, const char *source, char *path, size_t cap) {
    size_t len = strlen(path);
    for (cJSON *c = node->child, *next; c; c = next) {
        next = c->next;
        if (!c->string)
            continue; /* an array's items have no key of their own */
        snprintf(path + len, cap - len, "%s%s", len ? "." : "", c->string);
        if (is_auto(c)) {
            if (!auto_allowed(path)) {
                zt_status s = zt_error(ZT_ERR_INVALID, "%s: key '%s' is \"auto\", which only the "
                                       "keys the Hugging Face Trainer fills may be (docs/"
                                       "deepspeed.md): give a value", source, path);
                return zt_error_field(s, path);
            }
            cJSON_DeleteItemFromObjectCaseSensitive(node, c->string);
        } else if (cJSON_IsObject(c)) {
            ZT_TRY(strip_walk(c, source, path, cap));
        }
        path[len] = '\0';
    }
    return ZT_OK;
}

zt_status zt_ds_strip_auto(cJSON *root, const char *source) {
    char path[640] = "";
    return cJSON_IsObject(root) ? strip_walk(root, source, path, sizeof path) : ZT_OK;
}
