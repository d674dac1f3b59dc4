/* The DeepSpeed "zero_optimization" section with its offload sections, and the precision sections
 * fp16 and bf16. Their pydantic models are lists of typed, range-checked keys, so they are read
 * from tables (ds_config_internal.h) plus a few keys read by hand. All of it is parsed and
 * validated here; what this build does not run is refused afterwards by ds_config.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds_config_internal.h"

/* ------------------------------------------------------------------------------------------ */
/* zero_optimization and its offload sections (deepspeed/runtime/zero/config.py, offload_config.py) */

#define ZF(m) FLD(zt_zero_config, m)
static const field zero_fields[] = {
    {"stage", FT_INT, ZF(stage), ANYVAL},
    {"contiguous_gradients", FT_BOOL, ZF(contiguous_gradients), ANYVAL},
    {"reduce_scatter", FT_BOOL, ZF(reduce_scatter), ANYVAL},
    {"reduce_bucket_size", FT_INT64, ZF(reduce_bucket_size), POSITIVE},
    {"use_multi_rank_bucket_allreduce", FT_BOOL, NOSTORE, ANYVAL},
    {"allgather_partitions", FT_BOOL, ZF(allgather_partitions), ANYVAL},
    /* ge=0 in DeepSpeed's model, unlike reduce_bucket_size: 0 runs there, since torch's
     * all_gather_into_tensor path never divides by it. */
    {"allgather_bucket_size", FT_INT64, ZF(allgather_bucket_size), NONNEG},
    {"overlap_comm", FT_BOOL, ZF(overlap_comm), ANYVAL},
    {"load_from_fp32_weights", FT_BOOL, NOSTORE, ANYVAL},
    {"elastic_checkpoint", FT_BOOL, NOSTORE, ANYVAL},
    {"sub_group_size", FT_INT64, ZF(sub_group_size), NONNEG},
    {"cpu_offload", FT_BOOL, NOSTORE, ANYVAL},
    {"cpu_offload_param", FT_BOOL, NOSTORE, ANYVAL},
    {"cpu_offload_use_pin_memory", FT_BOOL, NOSTORE, ANYVAL},
    /* pydantic populate_by_name: each stage3_* alias also works under its field name. */
    {"stage3_prefetch_bucket_size", FT_INT64, ZF(stage3_prefetch_bucket_size), NONNEG},
    {"prefetch_bucket_size", FT_INT64, ZF(stage3_prefetch_bucket_size), NONNEG},
    {"stage3_param_persistence_threshold", FT_INT64, ZF(stage3_param_persistence_threshold), NONNEG},
    {"param_persistence_threshold", FT_INT64, ZF(stage3_param_persistence_threshold), NONNEG},
    {"stage3_model_persistence_threshold", FT_INT64, NOSTORE, NONNEG},
    {"model_persistence_threshold", FT_INT64, NOSTORE, NONNEG},
    {"stage3_max_live_parameters", FT_INT64, ZF(stage3_max_live_parameters), NONNEG},
    {"max_live_parameters", FT_INT64, ZF(stage3_max_live_parameters), NONNEG},
    {"stage3_max_reuse_distance", FT_INT64, ZF(stage3_max_reuse_distance), NONNEG},
    {"max_reuse_distance", FT_INT64, ZF(stage3_max_reuse_distance), NONNEG},
    /* The field, its alias and its deprecated name: stage 3 writes a consolidated 16-bit model
     * with each checkpoint (checkpoint.h). */
    {"stage3_gather_16bit_weights_on_model_save", FT_BOOL, ZF(gather_16bit_weights_on_model_save), ANYVAL},
    {"gather_16bit_weights_on_model_save", FT_BOOL, ZF(gather_16bit_weights_on_model_save), ANYVAL},
    {"stage3_gather_fp16_weights_on_model_save", FT_BOOL, ZF(gather_16bit_weights_on_model_save), ANYVAL},
    {"stage3_module_granularity_threshold", FT_INT64, NOSTORE, ANYVAL},
    {"module_granularity_threshold", FT_INT64, NOSTORE, ANYVAL},
    {"stage3_use_all_reduce_for_fetch_params", FT_BOOL, NOSTORE, ANYVAL},
    {"use_all_reduce_for_fetch_params", FT_BOOL, NOSTORE, ANYVAL},
    {"stage3_allgather_sequential", FT_BOOL, NOSTORE, ANYVAL},
    {"allgather_sequential", FT_BOOL, NOSTORE, ANYVAL},
    {"stage3_partition_stream_chunk_size", FT_INT64, NOSTORE, NONNEG},
    {"partition_stream_chunk_size", FT_INT64, NOSTORE, NONNEG},
    {"ignore_unused_parameters", FT_BOOL, NOSTORE, ANYVAL},
    {"legacy_stage1", FT_BOOL, NOSTORE, ANYVAL},
    {"round_robin_gradients", FT_BOOL, NOSTORE, ANYVAL},
    {"zero_hpz_partition_size", FT_INT, NOSTORE, NONNEG},
    {"zero_quantized_weights", FT_BOOL, NOSTORE, ANYVAL},
    {"zero_quantized_nontrainable_weights", FT_BOOL, NOSTORE, ANYVAL},
    {"zero_quantized_gradients", FT_BOOL, NOSTORE, ANYVAL},
    {"memory_efficient_linear", FT_BOOL, NOSTORE, ANYVAL},
    {"pipeline_loading_checkpoint", FT_BOOL, NOSTORE, ANYVAL},
    {"override_module_apply", FT_BOOL, NOSTORE, ANYVAL},
    {"log_trace_cache_warnings", FT_BOOL, NOSTORE, ANYVAL},
    {"enable_sanity_checks", FT_BOOL, NOSTORE, ANYVAL},
    {"save_muon_momentum_buffer_in_memory", FT_BOOL, NOSTORE, ANYVAL},
    {"leaf_module", FT_OBJECT, NOSTORE, ANYVAL},
    {"zenflow", FT_OBJECT, NOSTORE, ANYVAL},
};

#define OF(m) FLD(zt_offload_config, m)
static const field offload_optimizer_fields[] = {
    {"buffer_count", FT_INT, OF(buffer_count), NONNEG},
    {"pin_memory", FT_BOOL, OF(pin_memory), ANYVAL},
    {"pipeline_read", FT_BOOL, OF(pipeline_read), ANYVAL},
    {"pipeline_write", FT_BOOL, OF(pipeline_write), ANYVAL},
    {"fast_init", FT_BOOL, NOSTORE, ANYVAL},
    {"ratio", FT_DOUBLE, OF(ratio), 0, 1},
    {"super_offload", FT_BOOL, NOSTORE, ANYVAL},
    {"convert_grad_on_cpu", FT_BOOL, NOSTORE, ANYVAL},
    {"cpuadam_cores_perc", FT_DOUBLE, NOSTORE, 0, 1},
};

static const field offload_param_fields[] = {
    {"buffer_count", FT_INT, OF(buffer_count), NONNEG},
    {"buffer_size", FT_INT64, OF(buffer_size), NONNEG},
    {"max_in_cpu", FT_INT64, OF(max_in_cpu), NONNEG},
    {"pin_memory", FT_BOOL, OF(pin_memory), ANYVAL},
};

static const char *const offload_extra_keys[] = {"device", "nvme_path", NULL};

static zt_status parse_offload(const zt_json_obj *zero, const char *key, zt_offload_config *off,
                               const field *fields, size_t n) {
    zt_json_obj o;
    ZT_TRY(zt_json_child(zero, key, &o));
    if (!o.obj)
        return ZT_OK;
    ZT_TRY(zt_ds_check_table_keys(&o, fields, n, offload_extra_keys));
    ZT_TRY(zt_ds_read_fields(&o, fields, n, off));
    const char *device = NULL, *nvme_path = NULL;
    ZT_TRY(zt_json_get_string(&o, "device", &device, NULL));
    if (device) {
        if (strcmp(device, "none") == 0)
            off->device = ZT_OFFLOAD_NONE;
        else if (strcmp(device, "cpu") == 0)
            off->device = ZT_OFFLOAD_CPU;
        else if (strcmp(device, "nvme") == 0)
            off->device = ZT_OFFLOAD_NVME;
        else
            return zt_json_key_error(ZT_ERR_INVALID, &o, "device",
                                     "must be \"none\", \"cpu\" or \"nvme\", got \"%s\"", device);
    }
    ZT_TRY(zt_json_get_string(&o, "nvme_path", &nvme_path, NULL));
    if (nvme_path) {
        if (strlen(nvme_path) >= sizeof off->nvme_path)
            return zt_json_key_error(ZT_ERR_INVALID, &o, "nvme_path", "is longer than %zu bytes",
                                     sizeof off->nvme_path - 1);
        snprintf(off->nvme_path, sizeof off->nvme_path, "%s", nvme_path);
    }
    if (off->device == ZT_OFFLOAD_NVME && !off->nvme_path[0])
        return zt_json_key_error(ZT_ERR_INVALID, &o, "nvme_path", "is required when device is \"nvme\"");
    /* The files stream through these buffers: there must be one. */
    if (off->device == ZT_OFFLOAD_NVME && off->buffer_count < 1)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "buffer_count",
                                 "must be at least 1 when device is \"nvme\", got %d",
                                 off->buffer_count);
    return ZT_OK;
}

/* The deprecated cpu_offload / cpu_offload_param booleans stand for {"device": "cpu"}. */
static zt_status apply_deprecated_offload(const zt_json_obj *z, const char *old_key,
                                          const char *new_key, zt_offload_config *off) {
    bool on = false, found;
    ZT_TRY(zt_json_get_bool(z, old_key, &on, &found));
    if (!found)
        return ZT_OK;
    if (zt_json_item(z, new_key))
        return zt_error(ZT_ERR_INVALID,
                        "%s: Cannot provide deprecated parameter '%s' and replacing parameter '%s' together",
                        z->source, old_key, new_key);
    zt_ds_warn(z->source, "Config parameter %s is deprecated use %s instead", old_key, new_key);
    if (on)
        off->device = ZT_OFFLOAD_CPU;
    return ZT_OK;
}

zt_status zt_ds_parse_zero(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_zero_config *z = &cfg->zero;
    const cJSON *item = zt_json_item(top, "zero_optimization");
    if (item && cJSON_IsBool(item)) {
        /* The legacy form: true is stage 1 with the top-level allgather_size. */
        zt_ds_warn(top->source, "\"zero_optimization\": %s is deprecated; use {\"stage\": N}",
                   cJSON_IsTrue(item) ? "true" : "false");
        z->stage = cJSON_IsTrue(item) ? 1 : 0;
        if (z->stage > 0)
            ZT_TRY(zt_json_get_int64(top, "allgather_size", &z->allgather_bucket_size, NULL));
        return ZT_OK;
    }
    zt_json_obj o;
    ZT_TRY(zt_json_child(top, "zero_optimization", &o));
    static const char *const extra[] = {"offload_optimizer", "offload_param", NULL};
    ZT_TRY(zt_ds_check_table_keys(&o, zero_fields, NFIELDS(zero_fields), extra));
    ZT_TRY(zt_ds_read_fields(&o, zero_fields, NFIELDS(zero_fields), z));
    if (z->stage < 0 || z->stage > 3)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "stage", "must be 0, 1, 2 or 3, got %d", z->stage);
    bool overlap_given = false;
    ZT_TRY(zt_json_get_bool(&o, "overlap_comm", &z->overlap_comm, &overlap_given));
    if (!overlap_given)
        z->overlap_comm = z->stage == 3;

    ZT_TRY(parse_offload(&o, "offload_optimizer", &z->offload_optimizer, offload_optimizer_fields,
                         NFIELDS(offload_optimizer_fields)));
    ZT_TRY(parse_offload(&o, "offload_param", &z->offload_param, offload_param_fields,
                         NFIELDS(offload_param_fields)));
    ZT_TRY(apply_deprecated_offload(&o, "cpu_offload", "offload_optimizer", &z->offload_optimizer));
    ZT_TRY(apply_deprecated_offload(&o, "cpu_offload_param", "offload_param", &z->offload_param));
    if (zt_json_item(&o, "cpu_offload_use_pin_memory"))
        zt_ds_warn(o.source, "Config parameter cpu_offload_use_pin_memory is deprecated use "
                             "offload_param or offload_optimizer instead");
    if (zt_json_item(&o, "stage3_gather_fp16_weights_on_model_save"))
        zt_ds_warn(o.source, "Config parameter stage3_gather_fp16_weights_on_model_save is deprecated "
                             "use gather_16bit_weights_on_model_save instead");

    if (z->offload_optimizer.ratio < 1.0 && z->stage != 3)
        return zt_error(ZT_ERR_INVALID, "%s: Partial offloading only supported for ZeRO Stage 3.",
                        o.source);
    if (z->offload_param.device != ZT_OFFLOAD_NONE && z->stage != 3)
        zt_ds_warn(o.source, "zero_optimization.offload_param only applies to ZeRO stage 3 and is "
                             "ignored at stage %d", z->stage);
    /* stage_1_and_2.py asserts this for its 4-byte NCCL alignment of fp16 buckets. */
    if ((z->stage == 1 || z->stage == 2) && z->allgather_bucket_size % 2 != 0)
        return zt_error(ZT_ERR_INVALID,
                        "%s: allgather_bucket_size must be a multiple of nccl_start_alignment_factor, 2",
                        o.source);
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* fp16 / bf16 (deepspeed/runtime/precision_config.py)                                         */

static const field fp16_fields[] = {
    {"enabled", FT_BOOL, FLD(zt_fp16_config, enabled), ANYVAL},
    {"auto_cast", FT_BOOL, NOSTORE, ANYVAL},
    {"initial_scale_power", FT_INT, FLD(zt_fp16_config, initial_scale_power), ANYVAL},
    {"hysteresis", FT_INT, FLD(zt_fp16_config, hysteresis), ANYVAL},
    {"consecutive_hysteresis", FT_BOOL, FLD(zt_fp16_config, consecutive_hysteresis), ANYVAL},
    {"fp16_master_weights_and_grads", FT_BOOL, FLD(zt_fp16_config, master_weights_and_grads), ANYVAL},
};

static const field bf16_fields[] = {
    {"enabled", FT_BOOL, FLD(zt_bf16_config, enabled), ANYVAL},
    {"immediate_grad_update", FT_BOOL, NOSTORE, ANYVAL},
    {"check_grad_overflow", FT_BOOL, FLD(zt_bf16_config, check_grad_overflow), ANYVAL},
    {"bf16_master_weights_and_grads", FT_BOOL, FLD(zt_bf16_config, master_weights_and_grads), ANYVAL},
    {"bf16_optimizer_states", FT_BOOL, FLD(zt_bf16_config, optimizer_states), ANYVAL},
};

/* The 16-bit master and state flags as the ZeRO optimizers judge them
 * (ZeROOptimizer._configure_master_weights and the offload validators of stage_1_and_2.py and
 * stage3.py): 16-bit masters whose optimizer state stays fp32 need ZeRO-Offload with
 * DeepSpeedCPUAdam, and so do offloaded bf16 states. ztrain runs the one combination that keeps
 * everything on the device (bf16 masters and bf16 states, no optimizer offload) and refuses the
 * offloaded ones, whose store keeps fp32 masters and state, by name. */
static zt_status check_master_precision(const zt_ds_config *cfg, const char *src) {
    const zt_bf16_config *b = &cfg->bf16;
    const zt_zero_config *z = &cfg->zero;
    bool offload = z->offload_optimizer.device != ZT_OFFLOAD_NONE;
    const char *offload_name = z->stage == 3 ? "ZeRO-3 Offload" : "ZeRO-Offload";
    if (cfg->fp16.master_weights_and_grads && b->master_weights_and_grads)
        return zt_error(ZT_ERR_INVALID, "%s: fp16_master_weights_and_gradients and "
                        "bf16_master_weights_and_gradients are mutually exclusive.", src);
    if (cfg->fp16.master_weights_and_grads && !offload)
        return zt_error(ZT_ERR_INVALID, "%s: fp16.fp16_master_weights_and_grads: Master weights "
                        "feature requires %s with DeepSpeedCPUAdam (DeepSpeed keeps the fp32 "
                        "optimizer states on the CPU); enable zero_optimization.offload_optimizer "
                        "or remove the key", src, offload_name);
    if (cfg->fp16.master_weights_and_grads)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: fp16.fp16_master_weights_and_grads is not "
                        "supported yet: ztrain's offloaded optimizer keeps fp32 master weights",
                        src);
    if (!b->master_weights_and_grads)
        return ZT_OK;
    if (!b->enabled)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: bf16.bf16_master_weights_and_grads needs "
                        "bf16.enabled: ztrain keeps bf16 masters of bf16 training only", src);
    if (!b->optimizer_states && !offload)
        return zt_error(ZT_ERR_INVALID, "%s: bf16.bf16_master_weights_and_grads without "
                        "bf16_optimizer_states: Master weights feature requires %s with "
                        "DeepSpeedCPUAdam (DeepSpeed keeps the fp32 optimizer states on the CPU "
                        "then); set bf16.bf16_optimizer_states too, or remove the key", src,
                        offload_name);
    if (offload)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: bf16.bf16_master_weights_and_grads with "
                        "zero_optimization.offload_optimizer is not supported yet: ztrain's "
                        "offloaded optimizer keeps fp32 master weights and optimizer states",
                        src);
    if (z->stage == 3 && z->offload_param.device == ZT_OFFLOAD_NVME)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: bf16.bf16_optimizer_states with "
                        "zero_optimization.offload_param on NVMe is not supported yet: the "
                        "parameter store streams fp32 optimizer state", src);
    return ZT_OK;
}

zt_status zt_ds_parse_precision(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_json_obj fp16, bf16;
    ZT_TRY(zt_json_child(top, "fp16", &fp16));
    /* Read apart from the table, which pydantic's lax mode coerces (true to 1): DeepSpeed's own
     * validator refuses a bool for loss_scale_window and min_loss_scale and takes a float only
     * through float() or int(); loss_scale is read as a float. */
    static const char *const fp16_extra[] = {"loss_scale", "loss_scale_window", "min_loss_scale",
                                             NULL};
    ZT_TRY(zt_ds_check_table_keys(&fp16, fp16_fields, NFIELDS(fp16_fields), fp16_extra));
    ZT_TRY(zt_ds_read_fields(&fp16, fp16_fields, NFIELDS(fp16_fields), &cfg->fp16));
    bool found;
    ZT_TRY(zt_json_get_double(&fp16, "loss_scale", &cfg->fp16.loss_scale, &found));
    if (found && cfg->fp16.loss_scale < 0)
        return zt_ds_fail(ZT_ERR_INVALID, &fp16, "loss_scale", "%s: fp16.loss_scale must be >= 0 "
                          "(0 enables dynamic loss scaling)", top->source);
    ZT_TRY(zt_json_get_int(&fp16, "loss_scale_window", &cfg->fp16.loss_scale_window, &found));
    /* An int in DeepSpeed's model, and Python's ints have no range: any integral value. */
    int64_t min_scale;
    ZT_TRY(zt_json_get_int64(&fp16, "min_loss_scale", &min_scale, &found));
    if (found)
        cfg->fp16.min_loss_scale = (double)min_scale;
    /* The dynamic scaler divides by the window and halves down to the minimum. */
    if (cfg->fp16.enabled && cfg->fp16.loss_scale == 0) {
        if (cfg->fp16.loss_scale_window <= 0)
            return zt_ds_fail(ZT_ERR_INVALID, &fp16, "loss_scale_window",
                              "%s: fp16.loss_scale_window must be greater than 0, got %d", top->source,
                              cfg->fp16.loss_scale_window);
        /* DeepSpeed's scale is the Python int 2**power, and the backward multiplies the loss
         * by it: torch converts at most 2**64 - 1 (OverflowError "int too big to convert" at the
         * first backward). As a double, 2**1024 is inf, a scale that halving never lowers. */
        if (cfg->fp16.initial_scale_power > 63)
            return zt_ds_fail(ZT_ERR_INVALID, &fp16, "initial_scale_power",
                              "%s: fp16.initial_scale_power must be at most 63, got %d (DeepSpeed's "
                              "loss * 2**%d fails at the first backward: OverflowError: int too "
                              "big to convert)", top->source, cfg->fp16.initial_scale_power,
                              cfg->fp16.initial_scale_power);
        if (cfg->fp16.min_loss_scale <= 0)
            return zt_ds_fail(ZT_ERR_INVALID, &fp16, "min_loss_scale",
                              "%s: fp16.min_loss_scale must be greater than 0, got %g", top->source,
                              cfg->fp16.min_loss_scale);
        /* Only the ZeRO rule (DynamicLossScaler) reads it; the non-ZeRO FP16_Optimizer halves on
         * every overflow whatever it says. DeepSpeed accepts any int, but the ZeRO rule lowers
         * the scale only when the count left reaches 1, and from 0 or below each overflow
         * counts down past it: the scale would never come down, and after the first overflow
         * every step would be skipped. */
        if (cfg->fp16.hysteresis <= 0 && cfg->zero.stage > 0)
            return zt_ds_fail(ZT_ERR_INVALID, &fp16, "hysteresis",
                              "%s: fp16.hysteresis must be greater than 0 at ZeRO stage %d, got %d "
                              "(DeepSpeed accepts it, but its dynamic loss scaler would then never "
                              "lower the scale, and every step after an overflow would be skipped)",
                              top->source, cfg->zero.stage, cfg->fp16.hysteresis);
    }

    /* "bfloat16" is the old name; DeepSpeed reads it only when "bf16" is absent. */
    ZT_TRY(zt_json_child(top, "bf16", &bf16));
    if (!bf16.obj)
        ZT_TRY(zt_json_child(top, "bfloat16", &bf16));
    ZT_TRY(zt_ds_check_table_keys(&bf16, bf16_fields, NFIELDS(bf16_fields), NULL));
    ZT_TRY(zt_ds_read_fields(&bf16, bf16_fields, NFIELDS(bf16_fields), &cfg->bf16));

    if (cfg->fp16.enabled && cfg->bf16.enabled)
        return zt_error(ZT_ERR_INVALID, "%s: bfloat16 and fp16 modes cannot be simultaneously enabled",
                        top->source);

    /* DeepSpeedConfig._do_error_check: these only exist inside the ZeRO optimizers. */
    bool fp16_master = cfg->fp16.master_weights_and_grads;
    bool bf16_master = cfg->bf16.master_weights_and_grads;
    bool bf16_states = cfg->bf16.optimizer_states;
    bool zero = cfg->zero.stage > 0;
    if (fp16_master && !zero)
        return zt_error(ZT_ERR_INVALID, "%s: Fp16_master_weights_and_grads is only supported with ZeRO "
                        "Stage 1, 2, or 3.", top->source);
    if (bf16_master && !zero)
        return zt_error(ZT_ERR_INVALID, "%s: Bf16_master_weights_and_grads is only supported with ZeRO "
                        "Stage 1, 2, or 3.", top->source);
    if (bf16_states && !zero)
        return zt_error(ZT_ERR_INVALID, "%s: bf16_optimizer_states is only supported with ZeRO Stage 1, "
                        "2, or 3.", top->source);
    if (bf16_states && !bf16_master)
        return zt_error(ZT_ERR_INVALID, "%s: bf16_optimizer_states requires "
                        "bf16_master_weights_and_grads to be enabled.", top->source);
    return check_master_precision(cfg, top->source);
}

/* pydantic's lax mode on these sections' tables (ds_config_lax.c). */
void zt_ds_coerce_zero_sections(cJSON *root) {
    cJSON *z = cJSON_GetObjectItemCaseSensitive(root, "zero_optimization");
    zt_ds_coerce_fields(z, zero_fields, NFIELDS(zero_fields));
    if (cJSON_IsObject(z)) {
        zt_ds_coerce_fields(cJSON_GetObjectItemCaseSensitive(z, "offload_optimizer"),
                            offload_optimizer_fields, NFIELDS(offload_optimizer_fields));
        zt_ds_coerce_fields(cJSON_GetObjectItemCaseSensitive(z, "offload_param"),
                            offload_param_fields, NFIELDS(offload_param_fields));
    }
    cJSON *fp16 = cJSON_GetObjectItemCaseSensitive(root, "fp16");
    zt_ds_coerce_fields(fp16, fp16_fields, NFIELDS(fp16_fields));
    if (cJSON_IsObject(fp16)) {
        /* DeepSpeed's own validators: float(v) for loss_scale, int(v) for these two. */
        zt_ds_coerce_key(fp16, "loss_scale", FT_DOUBLE, true);
        zt_ds_coerce_key(fp16, "loss_scale_window", FT_INT, true);
        zt_ds_coerce_key(fp16, "min_loss_scale", FT_INT64, true);
    }
    zt_ds_coerce_fields(cJSON_GetObjectItemCaseSensitive(root, "bf16"), bf16_fields,
                        NFIELDS(bf16_fields));
    zt_ds_coerce_fields(cJSON_GetObjectItemCaseSensitive(root, "bfloat16"), bf16_fields,
                        NFIELDS(bf16_fields));
}
