/* The effective DeepSpeed config of a job: what the engine runs with, written back as a DeepSpeed
 * config. It starts from the config with its "auto" values resolved and writes in every value the
 * parser settled (defaults included), so that the file in the run directory answers "what did
 * this run use" without knowing DeepSpeed's defaults. Keys ztrain does not act on stay as the user
 * wrote them. */
#include <stdlib.h>
#include <string.h>

#include "ds_config_json.h"

static cJSON *section(cJSON *parent, const char *key) {
    cJSON *o = cJSON_GetObjectItemCaseSensitive(parent, key);
    if (cJSON_IsObject(o))
        return o;
    cJSON_DeleteItemFromObjectCaseSensitive(parent, key);
    return cJSON_AddObjectToObject(parent, key);
}

static void put(cJSON *o, const char *key, cJSON *v) {
    if (cJSON_GetObjectItemCaseSensitive(o, key))
        cJSON_ReplaceItemInObjectCaseSensitive(o, key, v);
    else
        cJSON_AddItemToObject(o, key, v);
}

static void num(cJSON *o, const char *key, double v) {
    put(o, key, cJSON_CreateNumber(v));
}

static void flag(cJSON *o, const char *key, bool v) {
    put(o, key, cJSON_CreateBool(v));
}

/* Each type's params are those of the class DeepSpeed builds for it (a param the class does not take
 * is DeepSpeed's TypeError and the parser's refusal), so the file reads back as the same config. */
static void optimizer(cJSON *root, const zt_ds_config *c) {
    if (!c->has_optimizer)
        return;
    const zt_optimizer_config *o = &c->optimizer;
    cJSON *opt = section(root, "optimizer");
    put(opt, "type", cJSON_CreateString(o->name));
    cJSON *p = section(opt, "params");
    num(p, "lr", o->lr);
    num(p, "weight_decay", o->weight_decay);
    if (o->type == ZT_OPTIM_SGD) {
        num(p, "momentum", o->momentum);
        num(p, "dampening", o->dampening);
        flag(p, "nesterov", o->nesterov);
        flag(p, "maximize", o->maximize);
        return;
    }
    double betas[2] = {o->beta1, o->beta2};
    put(p, "betas", cJSON_CreateDoubleArray(betas, 2));
    num(p, "eps", o->eps);
    if (o->type == ZT_OPTIM_LAMB) {
        flag(p, "bias_correction", o->bias_correction);
        flag(p, "eps_inside_sqrt", o->eps_inside_sqrt);
        num(p, "max_coeff", o->max_coeff);
        num(p, "min_coeff", o->min_coeff);
        return;
    }
    /* torch.optim's Adam and AdamW take no bias_correction (they always correct). adam_w_mode
     * picks the class with torch_adam, so a value written stays: torch.optim.Adam's
     * decoupled_weight_decay gives AdamW's update, but true here would build AdamW, which does
     * not take that key. */
    if (o->torch_adam)
        flag(p, "maximize", o->maximize);
    else
        flag(p, "bias_correction", o->bias_correction);
    if (!cJSON_GetObjectItemCaseSensitive(p, "adam_w_mode"))
        flag(p, "adam_w_mode", o->adam_w_mode);
    flag(p, "torch_adam", o->torch_adam);
}

static void scheduler(cJSON *root, const zt_ds_config *c) {
    const zt_schedule_config *s = &c->scheduler;
    static const char *const names[] = {NULL, "WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                        "OneCycle", "LRRangeTest"};
    if (s->type == ZT_SCHED_NONE)
        return;
    cJSON *sch = section(root, "scheduler");
    put(sch, "type", cJSON_CreateString(names[s->type]));
    cJSON *p = section(sch, "params");
    switch (s->type) {
    case ZT_SCHED_WARMUP_LR:
    case ZT_SCHED_WARMUP_DECAY_LR:
        num(p, "warmup_min_lr", s->warmup_min_lr);
        num(p, "warmup_max_lr", s->warmup_max_lr);
        num(p, "warmup_num_steps", s->warmup_num_steps);
        put(p, "warmup_type", cJSON_CreateString(s->warmup_linear ? "linear" : "log"));
        if (s->type == ZT_SCHED_WARMUP_DECAY_LR)
            num(p, "total_num_steps", s->total_num_steps);
        break;
    case ZT_SCHED_WARMUP_COSINE_LR:
        num(p, "total_num_steps", s->total_num_steps);
        num(p, "warmup_min_ratio", s->warmup_min_ratio);
        num(p, "warmup_num_steps", s->warmup_num_steps);
        num(p, "cos_min_ratio", s->cos_min_ratio);
        put(p, "warmup_type", cJSON_CreateString(s->warmup_linear ? "linear" : "log"));
        break;
    case ZT_SCHED_ONE_CYCLE:
        num(p, "cycle_min_lr", s->cycle_min_lr);
        num(p, "cycle_max_lr", s->cycle_max_lr);
        num(p, "decay_lr_rate", s->decay_lr_rate);
        num(p, "cycle_first_step_size", s->cycle_first_step_size);
        num(p, "cycle_second_step_size", s->cycle_second_step_size);
        num(p, "cycle_first_stair_count", s->cycle_first_stair_count);
        num(p, "cycle_second_stair_count", s->cycle_second_stair_count);
        num(p, "decay_step_size", s->decay_step_size);
        flag(p, "cycle_momentum", s->cycle_momentum);
        num(p, "cycle_min_mom", s->cycle_min_mom);
        num(p, "cycle_max_mom", s->cycle_max_mom);
        num(p, "decay_mom_rate", s->decay_mom_rate);
        break;
    case ZT_SCHED_LR_RANGE_TEST:
        num(p, "lr_range_test_min_lr", s->lr_range_test_min_lr);
        num(p, "lr_range_test_step_size", s->lr_range_test_step_size);
        num(p, "lr_range_test_step_rate", s->lr_range_test_step_rate);
        flag(p, "lr_range_test_staircase", s->lr_range_test_staircase);
        break;
    case ZT_SCHED_NONE:
        break;
    }
}

static void offload(cJSON *zero, const char *key, const zt_offload_config *o, bool param) {
    static const char *const devices[] = {"none", "cpu", "nvme"};
    cJSON *sec = section(zero, key);
    put(sec, "device", cJSON_CreateString(devices[o->device]));
    if (o->nvme_path[0])
        put(sec, "nvme_path", cJSON_CreateString(o->nvme_path));
    num(sec, "buffer_count", o->buffer_count);
    flag(sec, "pin_memory", o->pin_memory);
    if (param) {
        num(sec, "buffer_size", (double)o->buffer_size);
        num(sec, "max_in_cpu", (double)o->max_in_cpu);
        return;
    }
    flag(sec, "pipeline_read", o->pipeline_read);
    flag(sec, "pipeline_write", o->pipeline_write);
    num(sec, "ratio", o->ratio);
}

static void zero(cJSON *root, const zt_ds_config *c) {
    const zt_zero_config *z = &c->zero;
    cJSON *o = section(root, "zero_optimization");
    num(o, "stage", z->stage);
    flag(o, "contiguous_gradients", z->contiguous_gradients);
    flag(o, "reduce_scatter", z->reduce_scatter);
    num(o, "reduce_bucket_size", (double)z->reduce_bucket_size);
    num(o, "allgather_bucket_size", (double)z->allgather_bucket_size);
    flag(o, "allgather_partitions", z->allgather_partitions);
    flag(o, "overlap_comm", z->overlap_comm);
    num(o, "sub_group_size", (double)z->sub_group_size);
    num(o, "stage3_prefetch_bucket_size", (double)z->stage3_prefetch_bucket_size);
    num(o, "stage3_param_persistence_threshold", (double)z->stage3_param_persistence_threshold);
    num(o, "stage3_max_live_parameters", (double)z->stage3_max_live_parameters);
    num(o, "stage3_max_reuse_distance", (double)z->stage3_max_reuse_distance);
    offload(o, "offload_optimizer", &z->offload_optimizer, false);
    offload(o, "offload_param", &z->offload_param, true);
    /* The deprecated switches are read into the two sections just written, and DeepSpeed refuses
     * a deprecated key beside the one that replaces it. */
    static const char *const deprecated[] = {"cpu_offload", "cpu_offload_param",
                                             "cpu_offload_use_pin_memory"};
    for (size_t i = 0; i < sizeof deprecated / sizeof *deprecated; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(o, deprecated[i]);
}

/* The monitors ztrain writes, where the config has their sections: `enabled` as the parser
 * settled it (1 or "yes" written as true). */
static void monitors(cJSON *root, const zt_ds_config *c) {
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "tensorboard")))
        flag(section(root, "tensorboard"), "enabled", c->monitor.tensorboard.enabled);
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "csv_monitor")))
        flag(section(root, "csv_monitor"), "enabled", c->monitor.csv.enabled);
}

char *zt_ds_config_effective_json(const zt_ds_config *c, const cJSON *resolved) {
    cJSON *root = resolved && cJSON_IsObject(resolved) ? cJSON_Duplicate(resolved, true)
                                                       : cJSON_CreateObject();
    if (!root)
        return NULL;
    num(root, "train_batch_size", c->train_batch_size);
    num(root, "train_micro_batch_size_per_gpu", c->train_micro_batch_size_per_gpu);
    num(root, "gradient_accumulation_steps", c->gradient_accumulation_steps);
    num(root, "gradient_clipping", c->gradient_clipping);
    put(root, "steps_per_print", c->steps_per_print > 0 ? cJSON_CreateNumber(c->steps_per_print)
                                                        : cJSON_CreateNull());
    flag(root, "wall_clock_breakdown", c->wall_clock_breakdown);
    flag(root, "dataloader_drop_last", c->dataloader_drop_last);
    flag(root, "prescale_gradients", c->prescale_gradients);
    num(root, "gradient_predivide_factor", c->gradient_predivide_factor);
    put(root, "communication_data_type", c->communication_data_type[0]
                                             ? cJSON_CreateString(c->communication_data_type)
                                             : cJSON_CreateNull());
    optimizer(root, c);
    scheduler(root, c);
    cJSON *fp16 = section(root, "fp16");
    flag(fp16, "enabled", c->fp16.enabled);
    num(fp16, "loss_scale", c->fp16.loss_scale);
    num(fp16, "initial_scale_power", c->fp16.initial_scale_power);
    num(fp16, "loss_scale_window", c->fp16.loss_scale_window);
    num(fp16, "hysteresis", c->fp16.hysteresis);
    flag(fp16, "consecutive_hysteresis", c->fp16.consecutive_hysteresis);
    num(fp16, "min_loss_scale", c->fp16.min_loss_scale);
    /* DeepSpeed reads "bfloat16" only without "bf16"; the effective config says "bf16". */
    cJSON_DeleteItemFromObjectCaseSensitive(root, "bfloat16");
    cJSON *bf16 = section(root, "bf16");
    flag(bf16, "enabled", c->bf16.enabled);
    flag(bf16, "check_grad_overflow", c->bf16.check_grad_overflow);
    zero(root, c);
    monitors(root, c);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char *out = text ? strdup(text) : NULL;
    cJSON_free(text);
    return out;
}
