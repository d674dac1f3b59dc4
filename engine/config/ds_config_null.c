/* JSON null in a DeepSpeed config, as DeepSpeed 0.19 reads it. Elsewhere in the parser a null
 * value reads as absent; here are the keys where DeepSpeed does something else with None: it
 * crashes (a section it calls .keys() or ** on, a scalar it compares), or its pydantic model
 * refuses it. Each is refused by name with what DeepSpeed does. The nulls DeepSpeed reads as its
 * default (the batch keys, steps_per_print, bf16, optimizer.params, the Optional fields of
 * zero_optimization and the offload sections, the optimizer's switches that default to false,
 * ...) stay accepted. */
#include <string.h>

#include "ds_config_internal.h"

/* Top-level keys whose null DeepSpeed does not survive, and how it fails (DeepSpeedConfig run on
 * {"train_batch_size": 2, KEY: null} for every top-level key of the key table). */
#define NOT_A_MAPPING "its config class's constructor fails: argument after ** must be a " \
                      "mapping, not NoneType"
#define NO_GET "DeepSpeedConfig fails: 'NoneType' object has no attribute 'get'"
#define NO_KEYS "DeepSpeedConfig fails: 'NoneType' object has no attribute 'keys'"
#define REMOVED "DeepSpeed 0.19.8 refuses the key itself, whatever its value: the feature has " \
                "been removed"
static const char *const top_crash[][2] = {
    {"optimizer", NO_KEYS},
    {"scheduler", NO_KEYS},
    {"fp16", NOT_A_MAPPING},
    {"bfloat16", NOT_A_MAPPING},
    {"zero_optimization", NOT_A_MAPPING},
    {"comms_logger", NOT_A_MAPPING},
    {"compile", NOT_A_MAPPING},
    {"hybrid_engine", NOT_A_MAPPING},
    {"tensor_parallel", NOT_A_MAPPING},
    {"weight_quantization", NOT_A_MAPPING},
    {"activation_checkpointing", NO_GET},
    {"data_types", NO_GET},
    {"autotuning", NO_GET},
    {"checkpoint", NO_GET},
    {"data_efficiency", NO_GET},
    {"flops_profiler", NO_GET},
    {"torch_autocast", NO_GET},
    {"pipeline", "DeepSpeedConfig fails: 'NoneType' object has no attribute 'items'"},
    {"timers", "DeepSpeedConfig fails: argument of type 'NoneType' is not iterable"},
    {"tensorboard", "DeepSpeedMonitorConfig: Input should be a valid dictionary"},
    {"csv_monitor", "DeepSpeedMonitorConfig: Input should be a valid dictionary"},
    {"wandb", "DeepSpeedMonitorConfig: Input should be a valid dictionary"},
    {"comet", "DeepSpeedMonitorConfig: Input should be a valid dictionary"},
    {"gradient_allreduce_op", "Invalid gradient_allreduce_op. Supported operations: ['mean', "
                              "'sum']. Got: None"},
    {"gradient_clipping", "DeepSpeed's step compares it with 0.0: TypeError"},
    {"wall_clock_breakdown", "DeepSpeedConfig fails: unsupported operand type(s) for |: "
                             "'NoneType' and 'bool'"},
    {"amp", REMOVED},
    {"sparse_gradients", REMOVED},
    {"graph_harvesting", REMOVED},
    {"compression_training", REMOVED},
    {"curriculum_learning", REMOVED},
    {"eigenvalue", REMOVED},
    {"elasticity", REMOVED},
    {"nebula", REMOVED},
    {"progressive_layer_drop", REMOVED},
    {"quantize_training", REMOVED},
    {"sparse_attention", REMOVED},
};

/* Keys inside a section whose null DeepSpeed does not survive: checkpoint.parallel_write, which
 * get_checkpoint_parallel_write_pipeline reads with .get. */
static const char *const section_crash[][3] = {
    {"checkpoint", "parallel_write", NO_GET},
};

/* The fields of DeepSpeed's pydantic sections that take None (Optional in the model); a null at
 * any other field of these sections is the model's validation error. */
static const char *const zero_nullable[] = {
    "overlap_comm", "offload_param", "offload_optimizer", "zenflow", "cpu_offload_param",
    "cpu_offload_use_pin_memory", "cpu_offload", "leaf_module", NULL};
static const char *const offload_nullable[] = {"nvme_path", NULL};
static const char *const none_nullable[] = {NULL};

/* The scheduler parameters that take None: the ones whose default is None in lr_schedules.py,
 * and those only tested for truth or membership (None is false, or an unknown warmup_type). */
static const char *const sched_nullable[] = {
    "warmup_max_lr", "cycle_second_step_size", "cycle_second_stair_count", "warmup_type",
    "lr_range_test_staircase", "cycle_momentum", NULL};

/* The optimizer's parameters go to its constructor as keyword arguments, None included. A number
 * as None fails there or at the first step (FusedAdam's multi_tensor_adam, torch.optim's range
 * checks, DeepSpeedCPUAdam's create_adam); lr too, unless a schedule overwrites it first, which
 * ztrain does not follow. These two switches default to true but are tested for truth, so None
 * turns them off (FusedAdam's `1 if bias_correction else 0`, the engine's `name == "adamw" or
 * adam_w_mode`): refused rather than read as absent, which would mean the opposite. */
static const char *const optim_numbers[] = {"lr", "betas", "eps", "weight_decay", "momentum",
                                            "dampening", "max_coeff", "min_coeff", NULL};
static const char *const optim_true_switches[] = {"bias_correction", "adam_w_mode", NULL};

static zt_status refuse_null_optimizer_params(const zt_json_obj *p) {
    for (const cJSON *c = p->obj ? p->obj->child : NULL; c; c = c->next) {
        if (!cJSON_IsNull(c))
            continue;
        char path[512];
        zt_json_key_path(p, c->string, path, sizeof path);
        if (zt_ds_name_in(c->string, optim_numbers))
            return zt_ds_fail(ZT_ERR_INVALID, p, c->string, "%s: key '%s' must not be null "
                              "(DeepSpeed hands None to the optimizer, which fails on it; give "
                              "the value or leave the key out)", p->source, path);
        if (zt_ds_name_in(c->string, optim_true_switches))
            return zt_ds_fail(ZT_ERR_INVALID, p, c->string, "%s: key '%s' must not be null "
                              "(DeepSpeed reads None there as false, and the key left out as "
                              "true: write false or true)", p->source, path);
    }
    return ZT_OK;
}

static zt_status refuse_null_fields(const zt_json_obj *o, const char *model,
                                    const char *const *nullable) {
    for (const cJSON *c = o->obj ? o->obj->child : NULL; c; c = c->next)
        if (cJSON_IsNull(c) && !zt_ds_name_in(c->string, nullable)) {
            char path[512];
            zt_json_key_path(o, c->string, path, sizeof path);
            return zt_ds_fail(ZT_ERR_INVALID, o, c->string, "%s: key '%s' must not be null "
                              "(DeepSpeed's %s refuses None there)", o->source, path, model);
        }
    return ZT_OK;
}

/* parent's object under key as *o, or an absent one when it is not an object. */
static void section(const zt_json_obj *parent, const char *key, zt_json_obj *o) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(parent->obj, key);
    char path[512];
    zt_json_key_path(parent, key, path, sizeof path);
    zt_json_obj_init(o, cJSON_IsObject(v) ? v : NULL, parent->source, path);
}

zt_status zt_ds_check_nulls(const zt_json_obj *top) {
    for (size_t i = 0; i < sizeof top_crash / sizeof top_crash[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(top->obj, top_crash[i][0]);
        if (cJSON_IsNull(v))
            return zt_ds_fail(ZT_ERR_INVALID, top, top_crash[i][0], "%s: key '%s' must not be "
                              "null (%s)", top->source, top_crash[i][0], top_crash[i][1]);
    }
    for (size_t i = 0; i < sizeof section_crash / sizeof section_crash[0]; i++) {
        zt_json_obj o;
        section(top, section_crash[i][0], &o);
        const char *key = section_crash[i][1];
        if (!cJSON_IsNull(o.obj ? cJSON_GetObjectItemCaseSensitive(o.obj, key) : NULL))
            continue;
        char path[512];
        zt_json_key_path(&o, key, path, sizeof path);
        return zt_ds_fail(ZT_ERR_INVALID, &o, key, "%s: key '%s' must not be null (%s)",
                          top->source, path, section_crash[i][2]);
    }
    zt_json_obj zero, off, fp16, bf16, sch;
    section(top, "zero_optimization", &zero);
    ZT_TRY(refuse_null_fields(&zero, "DeepSpeedZeroConfig", zero_nullable));
    section(&zero, "offload_optimizer", &off);
    ZT_TRY(refuse_null_fields(&off, "DeepSpeedZeroOffloadOptimizerConfig", offload_nullable));
    section(&zero, "offload_param", &off);
    ZT_TRY(refuse_null_fields(&off, "DeepSpeedZeroOffloadParamConfig", offload_nullable));
    section(top, "fp16", &fp16);
    ZT_TRY(refuse_null_fields(&fp16, "DeepSpeedFP16Config", none_nullable));
    section(top, "bf16", &bf16);
    ZT_TRY(refuse_null_fields(&bf16, "DeepSpeedBF16Config", none_nullable));

    zt_json_obj p, opt;
    section(top, "optimizer", &opt);
    section(&opt, "params", &p);
    ZT_TRY(refuse_null_optimizer_params(&p));
    section(top, "scheduler", &sch);
    section(&sch, "params", &p);
    return refuse_null_fields(&p, "lr_schedules", sched_nullable);
}
