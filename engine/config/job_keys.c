/* The type of every key of the job file outside "model" (whose fields are the model families'
 * tables): one table the parser checks values against (zt_job_keys_check) and
 * docs/job.schema.json states (tests/tools/zt_job_schema.c), so the schema cannot promise a type
 * the parser refuses. The ranges and the cross-key rules stay with the code that reads each
 * section (job_spec.c and its neighbours). */
#include <math.h>
#include <string.h>

#include "job_keys.h"
#include "ztrain/job_spec.h"

typedef struct {
    const char *section, *key;
    zt_job_key_type type;
} key_type;

static const key_type types[] = {
    {"", "name", ZT_JOB_KEY_STRING},
    {"", "world_size", ZT_JOB_KEY_INTEGER},
    {"", "nodes", ZT_JOB_KEY_INTEGER},
    {"", "comm", ZT_JOB_KEY_STRING},
    {"", "device", ZT_JOB_KEY_STRING},
    {"", "model", ZT_JOB_KEY_OBJECT},
    {"", "data", ZT_JOB_KEY_OBJECT},
    {"", "train", ZT_JOB_KEY_OBJECT},
    {"", "training_args", ZT_JOB_KEY_OBJECT},
    {"", "deepspeed", ZT_JOB_KEY_OBJECT_OR_STRING},
    {"", "pipeline", ZT_JOB_KEY_OBJECT},
    {"", "max_restarts", ZT_JOB_KEY_INTEGER},
    {"", "fork_from", ZT_JOB_KEY_OBJECT},
    {"", "events", ZT_JOB_KEY_OBJECT},
    {"", "alerts", ZT_JOB_KEY_OBJECT},
    {"data", "train", ZT_JOB_KEY_STRING_OR_LIST},
    {"data", "val", ZT_JOB_KEY_STRING},
    {"data", "shuffle", ZT_JOB_KEY_BOOLEAN},
    {"data", "tokenizer", ZT_JOB_KEY_STRING},
    {"data", "sample_tokens", ZT_JOB_KEY_INTEGER},
    {"data", "sample_prompt", ZT_JOB_KEY_STRING},
    {"data", "format", ZT_JOB_KEY_STRING},
    {"data", "packing", ZT_JOB_KEY_STRING},
    {"data", "train_files", ZT_JOB_KEY_STRING_LIST},
    {"data", "val_files", ZT_JOB_KEY_STRING_LIST},
    {"data.train[]", "path", ZT_JOB_KEY_STRING},
    {"data.train[]", "weight", ZT_JOB_KEY_NUMBER},
    {"train", "max_steps", ZT_JOB_KEY_INTEGER},
    {"train", "epochs", ZT_JOB_KEY_INTEGER},
    {"train", "log_interval", ZT_JOB_KEY_INTEGER},
    {"train", "eval_interval", ZT_JOB_KEY_INTEGER},
    {"train", "eval_steps", ZT_JOB_KEY_INTEGER},
    {"train", "checkpoint_dir", ZT_JOB_KEY_STRING},
    {"train", "checkpoint_interval", ZT_JOB_KEY_INTEGER},
    {"train", "resume", ZT_JOB_KEY_BOOLEAN},
    {"train", "bench_steps", ZT_JOB_KEY_INTEGER},
    {"train", "warmup_steps", ZT_JOB_KEY_INTEGER},
    {"train", "seed", ZT_JOB_KEY_INTEGER},
    {"train", "activation_checkpointing", ZT_JOB_KEY_BOOLEAN},
    {"train", "activation_checkpoint_interval", ZT_JOB_KEY_INTEGER},
    {"training_args", "learning_rate", ZT_JOB_KEY_NUMBER},
    {"training_args", "weight_decay", ZT_JOB_KEY_NUMBER},
    {"training_args", "adam_beta1", ZT_JOB_KEY_NUMBER},
    {"training_args", "adam_beta2", ZT_JOB_KEY_NUMBER},
    {"training_args", "adam_epsilon", ZT_JOB_KEY_NUMBER},
    {"training_args", "max_grad_norm", ZT_JOB_KEY_NUMBER},
    {"training_args", "per_device_train_batch_size", ZT_JOB_KEY_INTEGER},
    {"training_args", "gradient_accumulation_steps", ZT_JOB_KEY_INTEGER},
    {"training_args", "warmup_steps", ZT_JOB_KEY_NUMBER},
    {"training_args", "warmup_ratio", ZT_JOB_KEY_NUMBER},
    {"training_args", "lr_scheduler_type", ZT_JOB_KEY_STRING},
    {"training_args", "bf16", ZT_JOB_KEY_BOOLEAN},
    {"training_args", "fp16", ZT_JOB_KEY_BOOLEAN},
    {"training_args", "gradient_checkpointing", ZT_JOB_KEY_BOOLEAN},
    {"pipeline", "stages", ZT_JOB_KEY_INTEGER},
    {"pipeline", "partition", ZT_JOB_KEY_STRING},
    {"pipeline", "activation_checkpoint_interval", ZT_JOB_KEY_INTEGER},
    {"fork_from", "job", ZT_JOB_KEY_STRING},
    {"fork_from", "step", ZT_JOB_KEY_INTEGER},
};

/* The schema's descriptions, for the keys whose name does not say it all. */
static const struct {
    const char *section, *key, *meaning;
} meanings[] = {
    {"train", "max_steps",
     "optimizer steps to train; 0 or absent: train.epochs decide (epochs x the steps of one "
     "epoch, its batches / gradient_accumulation_steps)"},
    {"train", "epochs",
     "epochs to train when max_steps is 0 or absent (default 1); unused when max_steps is set"},
};

const char *zt_job_spec_key_meaning(const char *section, const char *key) {
    for (size_t i = 0; section && key && i < sizeof meanings / sizeof meanings[0]; i++)
        if (!strcmp(meanings[i].section, section) && !strcmp(meanings[i].key, key))
            return meanings[i].meaning;
    return NULL;
}

zt_job_key_type zt_job_spec_key_type(const char *section, const char *key) {
    for (size_t i = 0; section && key && i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(types[i].section, section) && !strcmp(types[i].key, key))
            return types[i].type;
    return ZT_JOB_KEY_UNKNOWN;
}

static bool is_integer(const cJSON *v) {
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
}

static bool has_type(const cJSON *v, zt_job_key_type t) {
    switch (t) {
    case ZT_JOB_KEY_OBJECT: return cJSON_IsObject(v);
    case ZT_JOB_KEY_INTEGER: return is_integer(v);
    case ZT_JOB_KEY_NUMBER: return cJSON_IsNumber(v);
    case ZT_JOB_KEY_BOOLEAN: return cJSON_IsBool(v);
    case ZT_JOB_KEY_STRING: return cJSON_IsString(v);
    case ZT_JOB_KEY_STRING_OR_LIST: return cJSON_IsString(v) || cJSON_IsArray(v);
    case ZT_JOB_KEY_STRING_LIST: return cJSON_IsArray(v);
    case ZT_JOB_KEY_OBJECT_OR_STRING: return cJSON_IsObject(v) || cJSON_IsString(v);
    case ZT_JOB_KEY_UNKNOWN: break;
    }
    return false;
}

static const char *type_text(zt_job_key_type t) {
    switch (t) {
    case ZT_JOB_KEY_OBJECT: return "an object";
    case ZT_JOB_KEY_INTEGER: return "an integer";
    case ZT_JOB_KEY_NUMBER: return "a number";
    case ZT_JOB_KEY_BOOLEAN: return "true or false";
    case ZT_JOB_KEY_STRING: return "a string";
    case ZT_JOB_KEY_STRING_OR_LIST: return "a path or a list of {\"path\", \"weight\"}";
    case ZT_JOB_KEY_STRING_LIST: return "a list of paths";
    case ZT_JOB_KEY_OBJECT_OR_STRING: return "an object or a path to a DeepSpeed config file";
    case ZT_JOB_KEY_UNKNOWN: break;
    }
    return "?";
}

zt_status zt_job_keys_check(const zt_json_obj *o, const char *section) {
    ZT_TRY(zt_json_check_keys(o, zt_job_spec_keys(section)));
    for (const cJSON *v = o->obj ? o->obj->child : NULL; v; v = v->next) {
        if (cJSON_IsNull(v))
            continue;
        zt_job_key_type t = zt_job_spec_key_type(section, v->string);
        if (!has_type(v, t)) {
            char got[64];
            zt_json_repr(v, got, sizeof got);
            bool is_auto = cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0;
            return zt_json_key_error(ZT_ERR_INVALID, o, v->string, "must be %s, got %s%s",
                                     type_text(t), got,
                                     is_auto ? " (\"auto\" is only for the DeepSpeed config keys "
                                               "the Hugging Face Trainer fills)" : "");
        }
    }
    return ZT_OK;
}
