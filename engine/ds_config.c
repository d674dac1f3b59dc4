/* The DeepSpeed config, read the way DeepSpeed 0.19 reads it (shared/reference/deepspeed.md §1).
 *
 * Order of work follows DeepSpeedConfig: sections and scalars first, then the batch triple, then
 * what DeepSpeed checks when it builds the optimizer and the scheduler, and last the two gates
 * below, so a config that is wrong is reported as wrong before it is reported as unsupported.
 *
 * Choices made where DeepSpeed gave no answer, or where we are stricter on purpose:
 * - Unknown keys inside any section are an error naming the key, also in sections DeepSpeed reads
 *   with dict.get (optimizer, scheduler, their params, data_types). Unknown top-level keys print one
 *   warning line to stderr and are otherwise ignored, as DeepSpeed ignores them.
 * - JSON null and the string "auto" mean "absent" everywhere, so the default applies.
 * - Integers must be integral numbers (5e8 and 2.0 are fine); bools must be true/false.
 * - Sections we accept but do not act on are not validated inside, except that switching on
 *   something we would otherwise silently ignore ("enabled": true on a monitor, the profiler,
 *   elasticity, amp, ...; activation partitioning; ZeRO++ quantisation) is ZT_ERR_UNSUPPORTED
 *   (ds_config_check_features). Options that later issues will implement (fp16, bf16, ZeRO
 *   stages > 0, offload, 16-bit communication) are parsed and validated, then refused in one place,
 *   ds_config_check_implemented, which those issues shrink.
 * - A missing "type" in optimizer or scheduler is an error rather than DeepSpeed's "no optimizer".
 * - Batch inference divides like Python (floor); where Python would raise ZeroDivisionError the
 *   inference is skipped and DeepSpeed's "has to be greater than 0" assertion names the zero key.
 * - torch.optim's argument checks (negative lr, betas outside [0, 1), ...) are applied to Adam too,
 *   with torch's texts, although FusedAdam itself does not check them.
 * - OneCycle with cycle_momentum: DeepSpeed writes (mom, 0.99) into Adam's betas, so beta2 becomes
 *   0.99; with SGD (no betas) DeepSpeed turns cycle_momentum off with a warning. Both are mirrored
 *   in the parsed config, so the engine needs no special case.
 * - Numbers that DeepSpeed checks only at run time and that would crash there (a zero step size
 *   in LRRangeTest/OneCycle, gradient_predivide_factor 0) are rejected here. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ds_config_json.h"
#include "json_util.h"
#include "ztrain/ds_config.h"

static void ds_warn(const char *source, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ds_warn(const char *source, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ztrain: warning: %s: ", source);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static bool name_in(const char *name, const char *const *list) {
    for (; *list; list++)
        if (strcmp(name, *list) == 0)
            return true;
    return false;
}

void zt_ds_config_defaults(zt_ds_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->world_size = 1;

    zt_optimizer_config *o = &cfg->optimizer;
    o->type = ZT_OPTIM_ADAM;
    o->lr = 1e-3;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->adam_w_mode = true;
    o->bias_correction = true;

    zt_schedule_config *s = &cfg->scheduler;
    s->type = ZT_SCHED_NONE;
    s->warmup_max_lr = 1e-3;
    s->warmup_num_steps = 1000;
    s->cos_min_ratio = 1e-4;
    s->cycle_first_step_size = 2000;
    s->cycle_second_step_size = 2000;
    s->cycle_momentum = true;
    s->cycle_min_mom = 0.8;
    s->cycle_max_mom = 0.9;
    s->lr_range_test_min_lr = 1e-3;
    s->lr_range_test_step_size = 2000;
    s->lr_range_test_step_rate = 1.0;

    cfg->gradient_clipping = 1.0;
    cfg->gradient_predivide_factor = 1.0;

    cfg->fp16.initial_scale_power = 16;
    cfg->fp16.loss_scale_window = 1000;
    cfg->fp16.hysteresis = 2;
    cfg->fp16.min_loss_scale = 1;
    cfg->bf16.check_grad_overflow = true;

    zt_zero_config *z = &cfg->zero;
    z->contiguous_gradients = true;
    z->reduce_scatter = true;
    z->reduce_bucket_size = 500000000;
    z->allgather_bucket_size = 500000000;
    z->allgather_partitions = true;
    z->sub_group_size = 1000000000;
    z->stage3_prefetch_bucket_size = 50000000;
    z->stage3_param_persistence_threshold = 100000;
    z->stage3_max_live_parameters = 1000000000;
    z->stage3_max_reuse_distance = 1000000000;
    z->offload_optimizer.buffer_count = 4;
    z->offload_optimizer.pin_memory = true;
    z->offload_optimizer.ratio = 1.0;
    z->offload_param.buffer_count = 5;
    z->offload_param.pin_memory = true;
    z->offload_param.ratio = 1.0;
    z->offload_param.buffer_size = 100000000;
    z->offload_param.max_in_cpu = 1000000000;
}

/* ------------------------------------------------------------------------------------------ */
/* Table-driven sections: the pydantic models (zero, offload, fp16, bf16) are lists of typed,
 * range-checked keys, so they are read from tables. */

typedef enum { FT_BOOL, FT_INT, FT_INT64, FT_DOUBLE, FT_OBJECT } field_type;

typedef struct {
    const char *key;
    field_type type;
    ptrdiff_t off; /* offset into the section's struct, or NOSTORE: validated, then dropped */
    double lo, hi; /* inclusive range, checked when lo <= hi */
} field;

#define NOSTORE ((ptrdiff_t)-1)
#define ANYVAL 1, 0
#define NONNEG 0, 1e300
#define FLD(T, m) offsetof(T, m)

static zt_status check_range(const zt_json_obj *o, const field *f, double v) {
    if (f->lo > f->hi || (v >= f->lo && v <= f->hi))
        return ZT_OK;
    char got[64];
    zt_json_repr(zt_json_item(o, f->key), got, sizeof got);
    if (f->hi >= 1e300)
        return zt_json_key_error(ZT_ERR_INVALID, o, f->key, "must be >= %g, got %s", f->lo, got);
    return zt_json_key_error(ZT_ERR_INVALID, o, f->key, "must be between %g and %g, got %s", f->lo,
                             f->hi, got);
}

static zt_status read_fields(const zt_json_obj *o, const field *fields, size_t n, void *base) {
    for (size_t i = 0; i < n; i++) {
        const field *f = &fields[i];
        char *dst = f->off == NOSTORE ? NULL : (char *)base + f->off;
        bool found = false, b;
        int iv;
        int64_t lv;
        double dv;
        zt_json_obj child;
        switch (f->type) {
        case FT_BOOL:
            ZT_TRY(zt_json_get_bool(o, f->key, &b, &found));
            if (found && dst)
                *(bool *)dst = b;
            break;
        case FT_INT:
            ZT_TRY(zt_json_get_int(o, f->key, &iv, &found));
            if (found)
                ZT_TRY(check_range(o, f, iv));
            if (found && dst)
                *(int *)dst = iv;
            break;
        case FT_INT64:
            ZT_TRY(zt_json_get_int64(o, f->key, &lv, &found));
            if (found)
                ZT_TRY(check_range(o, f, (double)lv));
            if (found && dst)
                *(int64_t *)dst = lv;
            break;
        case FT_DOUBLE:
            ZT_TRY(zt_json_get_double(o, f->key, &dv, &found));
            if (found)
                ZT_TRY(check_range(o, f, dv));
            if (found && dst)
                *(double *)dst = dv;
            break;
        case FT_OBJECT:
            ZT_TRY(zt_json_child(o, f->key, &child));
            break;
        }
    }
    return ZT_OK;
}

/* The allowed keys of a table section are its fields plus a few read by hand (`extra`). */
static zt_status check_table_keys(const zt_json_obj *o, const field *fields, size_t n,
                                  const char *const *extra) {
    const char *names[96];
    size_t k = 0;
    for (size_t i = 0; i < n && k < 90; i++)
        names[k++] = fields[i].key;
    for (; extra && *extra && k < 95; extra++)
        names[k++] = *extra;
    names[k] = NULL;
    return zt_json_check_keys(o, names);
}

#define NFIELDS(t) (sizeof(t) / sizeof((t)[0]))

/* ------------------------------------------------------------------------------------------ */
/* zero_optimization and its offload sections (deepspeed/runtime/zero/config.py, offload_config.py) */

#define ZF(m) FLD(zt_zero_config, m)
static const field zero_fields[] = {
    {"stage", FT_INT, ZF(stage), ANYVAL},
    {"contiguous_gradients", FT_BOOL, ZF(contiguous_gradients), ANYVAL},
    {"reduce_scatter", FT_BOOL, ZF(reduce_scatter), ANYVAL},
    {"reduce_bucket_size", FT_INT64, ZF(reduce_bucket_size), NONNEG},
    {"use_multi_rank_bucket_allreduce", FT_BOOL, NOSTORE, ANYVAL},
    {"allgather_partitions", FT_BOOL, ZF(allgather_partitions), ANYVAL},
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
    {"stage3_gather_16bit_weights_on_model_save", FT_BOOL, NOSTORE, ANYVAL},
    {"gather_16bit_weights_on_model_save", FT_BOOL, NOSTORE, ANYVAL},
    {"stage3_gather_fp16_weights_on_model_save", FT_BOOL, NOSTORE, ANYVAL},
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
    {"zeropp_loco_param", FT_OBJECT, NOSTORE, ANYVAL},
    {"mics_shard_size", FT_INT, NOSTORE, ANYVAL},
    {"mics_hierarchical_params_gather", FT_BOOL, NOSTORE, ANYVAL},
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
    ZT_TRY(check_table_keys(&o, fields, n, offload_extra_keys));
    ZT_TRY(read_fields(&o, fields, n, off));
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
    ds_warn(z->source, "Config parameter %s is deprecated use %s instead", old_key, new_key);
    if (on)
        off->device = ZT_OFFLOAD_CPU;
    return ZT_OK;
}

static zt_status parse_zero(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_zero_config *z = &cfg->zero;
    const cJSON *item = zt_json_item(top, "zero_optimization");
    if (item && cJSON_IsBool(item)) {
        /* The legacy form: true is stage 1 with the top-level allgather_size. */
        ds_warn(top->source, "\"zero_optimization\": %s is deprecated; use {\"stage\": N}",
                cJSON_IsTrue(item) ? "true" : "false");
        z->stage = cJSON_IsTrue(item) ? 1 : 0;
        if (z->stage > 0)
            ZT_TRY(zt_json_get_int64(top, "allgather_size", &z->allgather_bucket_size, NULL));
        return ZT_OK;
    }
    zt_json_obj o;
    ZT_TRY(zt_json_child(top, "zero_optimization", &o));
    static const char *const extra[] = {"offload_optimizer", "offload_param", NULL};
    ZT_TRY(check_table_keys(&o, zero_fields, NFIELDS(zero_fields), extra));
    ZT_TRY(read_fields(&o, zero_fields, NFIELDS(zero_fields), z));
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
        ds_warn(o.source, "Config parameter cpu_offload_use_pin_memory is deprecated use "
                          "offload_param or offload_optimizer instead");
    if (zt_json_item(&o, "stage3_gather_fp16_weights_on_model_save"))
        ds_warn(o.source, "Config parameter stage3_gather_fp16_weights_on_model_save is deprecated "
                          "use gather_16bit_weights_on_model_save instead");

    if (z->offload_optimizer.ratio < 1.0 && z->stage != 3)
        return zt_error(ZT_ERR_INVALID, "%s: Partial offloading only supported for ZeRO Stage 3.",
                        o.source);
    if (z->offload_param.device != ZT_OFFLOAD_NONE && z->stage != 3)
        ds_warn(o.source, "zero_optimization.offload_param only applies to ZeRO stage 3 and is "
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
    {"loss_scale_window", FT_INT, FLD(zt_fp16_config, loss_scale_window), ANYVAL},
    {"hysteresis", FT_INT, FLD(zt_fp16_config, hysteresis), ANYVAL},
    {"consecutive_hysteresis", FT_BOOL, FLD(zt_fp16_config, consecutive_hysteresis), ANYVAL},
    {"fp16_master_weights_and_grads", FT_BOOL, NOSTORE, ANYVAL},
};

static const field bf16_fields[] = {
    {"enabled", FT_BOOL, FLD(zt_bf16_config, enabled), ANYVAL},
    {"immediate_grad_update", FT_BOOL, NOSTORE, ANYVAL},
    {"check_grad_overflow", FT_BOOL, FLD(zt_bf16_config, check_grad_overflow), ANYVAL},
    {"bf16_master_weights_and_grads", FT_BOOL, NOSTORE, ANYVAL},
    {"bf16_optimizer_states", FT_BOOL, NOSTORE, ANYVAL},
};

static zt_status parse_precision(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_json_obj fp16, bf16;
    ZT_TRY(zt_json_child(top, "fp16", &fp16));
    static const char *const fp16_extra[] = {"loss_scale", "min_loss_scale", NULL};
    ZT_TRY(check_table_keys(&fp16, fp16_fields, NFIELDS(fp16_fields), fp16_extra));
    ZT_TRY(read_fields(&fp16, fp16_fields, NFIELDS(fp16_fields), &cfg->fp16));
    bool found;
    ZT_TRY(zt_json_get_double(&fp16, "loss_scale", &cfg->fp16.loss_scale, &found));
    if (found && cfg->fp16.loss_scale < 0)
        return zt_error(ZT_ERR_INVALID, "%s: fp16.loss_scale must be >= 0 (0 enables dynamic loss scaling)",
                        top->source);
    int min_scale;
    ZT_TRY(zt_json_get_int(&fp16, "min_loss_scale", &min_scale, &found));
    if (found)
        cfg->fp16.min_loss_scale = min_scale;
    /* The dynamic scaler divides by the window and halves down to the minimum. */
    if (cfg->fp16.enabled && cfg->fp16.loss_scale == 0) {
        if (cfg->fp16.loss_scale_window <= 0)
            return zt_error(ZT_ERR_INVALID, "%s: fp16.loss_scale_window must be greater than 0, got %d",
                            top->source, cfg->fp16.loss_scale_window);
        if (cfg->fp16.min_loss_scale <= 0)
            return zt_error(ZT_ERR_INVALID, "%s: fp16.min_loss_scale must be greater than 0, got %g",
                            top->source, cfg->fp16.min_loss_scale);
    }

    /* "bfloat16" is the old name; DeepSpeed reads it only when "bf16" is absent. */
    ZT_TRY(zt_json_child(top, "bf16", &bf16));
    if (!bf16.obj)
        ZT_TRY(zt_json_child(top, "bfloat16", &bf16));
    ZT_TRY(check_table_keys(&bf16, bf16_fields, NFIELDS(bf16_fields), NULL));
    ZT_TRY(read_fields(&bf16, bf16_fields, NFIELDS(bf16_fields), &cfg->bf16));

    if (cfg->fp16.enabled && cfg->bf16.enabled)
        return zt_error(ZT_ERR_INVALID, "%s: bfloat16 and fp16 modes cannot be simultaneously enabled",
                        top->source);

    /* DeepSpeedConfig._do_error_check: these only exist inside the ZeRO optimizers. */
    bool fp16_master = false, bf16_master = false, bf16_states = false;
    ZT_TRY(zt_json_get_bool(&fp16, "fp16_master_weights_and_grads", &fp16_master, NULL));
    ZT_TRY(zt_json_get_bool(&bf16, "bf16_master_weights_and_grads", &bf16_master, NULL));
    ZT_TRY(zt_json_get_bool(&bf16, "bf16_optimizer_states", &bf16_states, NULL));
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
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Top-level scalars                                                                           */

/* Every top-level key DeepSpeed 0.19 reads; anything else draws a warning. */
static const char *const known_top_keys[] = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "managed_gradient_accumulation", "steps_per_print", "dump_state", "disable_allgather",
    "communication_data_type", "seq_parallel_communication_data_type", "prescale_gradients",
    "gradient_predivide_factor", "gradient_allreduce_op", "sparse_gradients", "zero_optimization",
    "allgather_size", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "activation_checkpointing", "comms_logger", "tensorboard", "wandb", "csv_monitor", "comet",
    "gradient_clipping", "fp16", "bf16", "bfloat16", "amp", "torch_autocast",
    "compression_training", "graph_harvesting", "optimizer", "scheduler", "flops_profiler",
    "wall_clock_breakdown", "memory_breakdown", "autotuning", "eigenvalue", "quantize_training",
    "use_data_before_expert_parallelism", "hybrid_engine", "sparse_attention", "pipeline",
    "progressive_layer_drop", "curriculum_learning", "data_efficiency", "checkpoint", "data_types",
    "aio", "dataloader_drop_last", "log_level", "nebula", "datastates", "weight_quantization",
    "compile", "timers", "tensor_parallel", "expert_parallel", "vocabulary_size", "elasticity",
    "sequence_parallel_size", "data_parallel_size", NULL};

static void warn_unknown_top_keys(const zt_json_obj *top) {
    for (const cJSON *c = top->obj->child; c; c = c->next) {
        if (name_in(c->string, known_top_keys))
            continue;
        const char *near = zt_json_suggest(c->string, known_top_keys);
        char hint[128] = "";
        if (near)
            snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
        ds_warn(top->source, "unknown top-level key '%s' is ignored%s", c->string, hint);
    }
}

/* A DeepSpeed data type name ("fp16", "bfloat16", "torch.float32", ...) as fp32/fp16/bf16, or
 * NULL for a name DtypeEnum does not know. */
static const char *dtype_canonical(const char *name) {
    static const char *const fp32[] = {"fp32", "float32", "float", "torch.float32", NULL};
    static const char *const fp16[] = {"fp16", "float16", "half", "torch.float16", NULL};
    static const char *const bf16[] = {"bf16", "bfloat16", "torch.bfloat16", NULL};
    if (name_in(name, fp32))
        return "fp32";
    if (name_in(name, fp16))
        return "fp16";
    if (name_in(name, bf16))
        return "bf16";
    return NULL;
}

/* communication_data_type: case-insensitive fp32/fp16/bf16, DeepSpeed's error text otherwise. */
static zt_status read_comm_dtype(const zt_json_obj *top, const char *key, char *out, size_t n) {
    const char *v = NULL;
    ZT_TRY(zt_json_get_string(top, key, &v, NULL));
    if (!v)
        return ZT_OK;
    char lower[16] = "";
    for (size_t i = 0; v[i] && i + 1 < sizeof lower; i++)
        lower[i] = (char)((v[i] >= 'A' && v[i] <= 'Z') ? v[i] + 32 : v[i]);
    if (strlen(v) >= sizeof lower || (strcmp(lower, "fp32") && strcmp(lower, "fp16") && strcmp(lower, "bf16")))
        return zt_error(ZT_ERR_INVALID, "%s: Invalid %s. Supported data types: ['fp16', 'bf16', 'fp32']. "
                        "Got: %s", top->source, key, v);
    if (out)
        snprintf(out, n, "%s", lower);
    return ZT_OK;
}

typedef struct {
    bool has_train, has_micro, has_gas;
    int64_t train, micro, gas;
} batch_keys;

static const field top_fields[] = {
    {"managed_gradient_accumulation", FT_BOOL, NOSTORE, ANYVAL},
    {"steps_per_print", FT_INT, FLD(zt_ds_config, steps_per_print), NONNEG},
    {"dump_state", FT_BOOL, NOSTORE, ANYVAL},
    {"disable_allgather", FT_BOOL, NOSTORE, ANYVAL},
    {"prescale_gradients", FT_BOOL, FLD(zt_ds_config, prescale_gradients), ANYVAL},
    {"gradient_predivide_factor", FT_DOUBLE, FLD(zt_ds_config, gradient_predivide_factor), ANYVAL},
    {"sparse_gradients", FT_BOOL, NOSTORE, ANYVAL},
    {"zero_allow_untested_optimizer", FT_BOOL, NOSTORE, ANYVAL},
    {"zero_force_ds_cpu_optimizer", FT_BOOL, NOSTORE, ANYVAL},
    {"gradient_clipping", FT_DOUBLE, FLD(zt_ds_config, gradient_clipping), NONNEG},
    {"graph_harvesting", FT_BOOL, NOSTORE, ANYVAL},
    {"wall_clock_breakdown", FT_BOOL, FLD(zt_ds_config, wall_clock_breakdown), ANYVAL},
    {"memory_breakdown", FT_BOOL, NOSTORE, ANYVAL},
    {"use_data_before_expert_parallelism", FT_BOOL, NOSTORE, ANYVAL},
    {"dataloader_drop_last", FT_BOOL, FLD(zt_ds_config, dataloader_drop_last), ANYVAL},
    {"vocabulary_size", FT_INT, NOSTORE, ANYVAL},
    {"sequence_parallel_size", FT_INT, NOSTORE, ANYVAL},
    {"data_parallel_size", FT_INT, NOSTORE, ANYVAL},
    {"allgather_size", FT_INT64, NOSTORE, NONNEG},
    /* Sections read by hand below or only checked for switches we cannot honour. */
    {"activation_checkpointing", FT_OBJECT, NOSTORE, ANYVAL},
    {"comms_logger", FT_OBJECT, NOSTORE, ANYVAL},
    {"tensorboard", FT_OBJECT, NOSTORE, ANYVAL},
    {"wandb", FT_OBJECT, NOSTORE, ANYVAL},
    {"csv_monitor", FT_OBJECT, NOSTORE, ANYVAL},
    {"comet", FT_OBJECT, NOSTORE, ANYVAL},
    {"amp", FT_OBJECT, NOSTORE, ANYVAL},
    {"torch_autocast", FT_OBJECT, NOSTORE, ANYVAL},
    {"flops_profiler", FT_OBJECT, NOSTORE, ANYVAL},
    {"data_types", FT_OBJECT, NOSTORE, ANYVAL},
};

static zt_status parse_top(zt_ds_config *cfg, const zt_json_obj *top, batch_keys *bk) {
    ZT_TRY(zt_json_get_int64(top, "train_batch_size", &bk->train, &bk->has_train));
    ZT_TRY(zt_json_get_int64(top, "train_micro_batch_size_per_gpu", &bk->micro, &bk->has_micro));
    ZT_TRY(zt_json_get_int64(top, "gradient_accumulation_steps", &bk->gas, &bk->has_gas));
    ZT_TRY(read_fields(top, top_fields, NFIELDS(top_fields), cfg));
    /* Gradients are divided by it before the reduction. */
    if (cfg->gradient_predivide_factor <= 0)
        return zt_json_key_error(ZT_ERR_INVALID, top, "gradient_predivide_factor", "must be > 0, got %g",
                                 cfg->gradient_predivide_factor);
    ZT_TRY(read_comm_dtype(top, "communication_data_type", cfg->communication_data_type,
                           sizeof cfg->communication_data_type));
    ZT_TRY(read_comm_dtype(top, "seq_parallel_communication_data_type", NULL, 0));

    const char *op = NULL;
    ZT_TRY(zt_json_get_string(top, "gradient_allreduce_op", &op, NULL));
    if (op && strcasecmp(op, "mean") != 0 && strcasecmp(op, "sum") != 0)
        return zt_error(ZT_ERR_INVALID, "%s: Invalid gradient_allreduce_op. Supported operations: "
                        "['mean', 'sum']. Got: '%s'", top->source, op);

    zt_json_obj dt;
    ZT_TRY(zt_json_child(top, "data_types", &dt));
    static const char *const dt_keys[] = {"grad_accum_dtype", "param_dtype", "buffer_dtype", NULL};
    ZT_TRY(zt_json_check_keys(&dt, dt_keys));
    for (const char *const *k = dt_keys; *k; k++) {
        const char *v = NULL;
        ZT_TRY(zt_json_get_string(&dt, *k, &v, NULL));
        if (v && !dtype_canonical(v))
            return zt_json_key_error(ZT_ERR_INVALID, &dt, *k,
                                     "must be \"fp32\", \"fp16\" or \"bf16\", got \"%s\"", v);
    }
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Batch triple (DeepSpeedConfig._set_batch_related_parameters and _batch_assertion)            */

/* Python's //: rounds toward negative infinity. */
static int64_t floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if (a % b != 0 && ((a < 0) != (b < 0)))
        q--;
    return q;
}

static zt_status infer_batch(zt_ds_config *cfg, const batch_keys *bk, const char *src) {
    int64_t t = bk->train, m = bk->micro, g = bk->gas, w = cfg->world_size;
    if (bk->has_train && bk->has_micro && bk->has_gas) {
        /* all three given: nothing to infer */
    } else if (bk->has_train && bk->has_micro) {
        g = m != 0 ? floordiv(floordiv(t, m), w) : 0;
    } else if (bk->has_train && bk->has_gas) {
        m = floordiv(t, w);
        if (g != 0)
            m = floordiv(m, g);
    } else if (bk->has_micro && bk->has_gas) {
        if (__builtin_mul_overflow(m, g, &t) || __builtin_mul_overflow(t, w, &t))
            return zt_error(ZT_ERR_INVALID, "%s: train_micro_batch_size_per_gpu * "
                            "gradient_accumulation_steps * world_size overflows", src);
    } else if (bk->has_train) {
        g = 1;
        m = floordiv(t, w);
    } else if (bk->has_micro) {
        if (__builtin_mul_overflow(m, w, &t))
            return zt_error(ZT_ERR_INVALID, "%s: train_micro_batch_size_per_gpu * world_size overflows", src);
        g = 1;
    } else {
        return zt_error(ZT_ERR_INVALID,
                        "%s: Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided",
                        src);
    }

    if (t <= 0)
        return zt_error(ZT_ERR_INVALID, "%s: Train batch size: %lld has to be greater than 0", src,
                        (long long)t);
    if (m <= 0)
        return zt_error(ZT_ERR_INVALID, "%s: Micro batch size per gpu: %lld has to be greater than 0",
                        src, (long long)m);
    if (g <= 0)
        return zt_error(ZT_ERR_INVALID, "%s: Gradient accumulation steps: %lld has to be greater than 0",
                        src, (long long)g);
    int64_t prod;
    if (__builtin_mul_overflow(m, g, &prod) || __builtin_mul_overflow(prod, w, &prod) || prod != t)
        return zt_error(ZT_ERR_INVALID, "%s: Check batch related parameters. train_batch_size is not "
                        "equal to micro_batch_per_gpu * gradient_acc_step * world_size "
                        "%lld != %lld * %lld * %lld", src, (long long)t, (long long)m, (long long)g,
                        (long long)w);
    if (t > 0x7fffffff)
        return zt_error(ZT_ERR_INVALID, "%s: train_batch_size %lld is too large", src, (long long)t);
    cfg->train_batch_size = (int)t;
    cfg->train_micro_batch_size_per_gpu = (int)m;
    cfg->gradient_accumulation_steps = (int)g;
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Optimizer (engine.py::_configure_basic_optimizer)                                           */

static const char *const ds_builtin_optimizers[] = {
    "adagrad", "adam", "adamw", "lamb", "onebitadam", "zerooneadam", "onebitlamb",
    "muadam", "muadamw", "musgd", "lion", "muon", NULL};
static const char *const torch_optimizers[] = {
    "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "ASGD", "LBFGS", "NAdam",
    "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam", NULL};

/* torch.optim's argument checks, with its texts, prefixed by where the value came from. */
static zt_status torch_check(const zt_json_obj *p, bool bad, const char *fmt, double v) {
    if (!bad)
        return ZT_OK;
    char msg[128];
    snprintf(msg, sizeof msg, fmt, v);
    return zt_error(ZT_ERR_INVALID, "%s: %s: %s", p->source, p->path, msg);
}

static zt_status parse_adam(zt_optimizer_config *o, const zt_json_obj *p, bool type_is_adamw) {
    static const char *const keys[] = {"lr", "betas", "eps", "weight_decay", "bias_correction",
                                       "amsgrad", "torch_adam", "adam_w_mode", "set_grad_none",
                                       "fused", "foreach", NULL};
    ZT_TRY(zt_json_check_keys(p, keys));
    bool adam_w_mode = true, amsgrad = false, ignored;
    ZT_TRY(zt_json_get_bool(p, "torch_adam", &o->torch_adam, NULL));
    ZT_TRY(zt_json_get_bool(p, "adam_w_mode", &adam_w_mode, NULL));
    o->type = ZT_OPTIM_ADAM;
    o->adam_w_mode = type_is_adamw || adam_w_mode;
    /* With torch_adam DeepSpeed builds torch.optim.AdamW for the decoupled mode, and its default
     * weight_decay is 0.01; FusedAdam's (and torch Adam's) is 0. */
    o->weight_decay = o->torch_adam && o->adam_w_mode ? 0.01 : 0.0;
    ZT_TRY(zt_json_get_double(p, "lr", &o->lr, NULL));
    ZT_TRY(zt_json_get_double(p, "eps", &o->eps, NULL));
    ZT_TRY(zt_json_get_double(p, "weight_decay", &o->weight_decay, NULL));
    ZT_TRY(zt_json_get_bool(p, "bias_correction", &o->bias_correction, NULL));
    ZT_TRY(zt_json_get_bool(p, "amsgrad", &amsgrad, NULL));
    ZT_TRY(zt_json_get_bool(p, "set_grad_none", &ignored, NULL));
    ZT_TRY(zt_json_get_bool(p, "fused", &ignored, NULL));
    ZT_TRY(zt_json_get_bool(p, "foreach", &ignored, NULL));
    const cJSON *betas = zt_json_item(p, "betas");
    if (betas) {
        const cJSON *b1 = cJSON_GetArrayItem(betas, 0), *b2 = cJSON_GetArrayItem(betas, 1);
        if (!cJSON_IsArray(betas) || cJSON_GetArraySize(betas) != 2 || !cJSON_IsNumber(b1) ||
            !cJSON_IsNumber(b2)) {
            char got[128];
            zt_json_repr(betas, got, sizeof got);
            return zt_json_key_error(ZT_ERR_INVALID, p, "betas", "must be a list of two numbers, got %s",
                                     got);
        }
        o->beta1 = b1->valuedouble;
        o->beta2 = b2->valuedouble;
    }
    ZT_TRY(torch_check(p, o->lr < 0, "Invalid learning rate: %g", o->lr));
    ZT_TRY(torch_check(p, o->eps < 0, "Invalid epsilon value: %g", o->eps));
    ZT_TRY(torch_check(p, o->beta1 < 0 || o->beta1 >= 1, "Invalid beta parameter at index 0: %g", o->beta1));
    ZT_TRY(torch_check(p, o->beta2 < 0 || o->beta2 >= 1, "Invalid beta parameter at index 1: %g", o->beta2));
    ZT_TRY(torch_check(p, o->weight_decay < 0, "Invalid weight_decay value: %g", o->weight_decay));
    if (amsgrad)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: %s.amsgrad: true is not supported (ztrain's Adam, like "
                        "DeepSpeed's FusedAdam, has no AMSGrad variant)", p->source, p->path);
    return ZT_OK;
}

static zt_status parse_sgd(zt_optimizer_config *o, const zt_json_obj *p) {
    static const char *const keys[] = {"lr", "momentum", "dampening", "weight_decay", "nesterov",
                                       "foreach", "fused", NULL};
    ZT_TRY(zt_json_check_keys(p, keys));
    bool ignored;
    o->type = ZT_OPTIM_SGD;
    o->adam_w_mode = false; /* SGD's weight decay is L2, added to the gradient */
    o->weight_decay = 0;
    ZT_TRY(zt_json_get_double(p, "lr", &o->lr, NULL));
    ZT_TRY(zt_json_get_double(p, "momentum", &o->momentum, NULL));
    ZT_TRY(zt_json_get_double(p, "dampening", &o->dampening, NULL));
    ZT_TRY(zt_json_get_double(p, "weight_decay", &o->weight_decay, NULL));
    ZT_TRY(zt_json_get_bool(p, "nesterov", &o->nesterov, NULL));
    ZT_TRY(zt_json_get_bool(p, "foreach", &ignored, NULL));
    ZT_TRY(zt_json_get_bool(p, "fused", &ignored, NULL));
    ZT_TRY(torch_check(p, o->lr < 0, "Invalid learning rate: %g", o->lr));
    ZT_TRY(torch_check(p, o->momentum < 0, "Invalid momentum value: %g", o->momentum));
    ZT_TRY(torch_check(p, o->weight_decay < 0, "Invalid weight_decay value: %g", o->weight_decay));
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return zt_error(ZT_ERR_INVALID, "%s: %s: Nesterov momentum requires a momentum and zero dampening",
                        p->source, p->path);
    return ZT_OK;
}

static zt_status parse_optimizer(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_json_obj opt, params;
    ZT_TRY(zt_json_child(top, "optimizer", &opt));
    if (!opt.obj)
        return ZT_OK;
    static const char *const keys[] = {"type", "params", "legacy_fusion", NULL};
    ZT_TRY(zt_json_check_keys(&opt, keys));
    bool legacy_fusion;
    ZT_TRY(zt_json_get_bool(&opt, "legacy_fusion", &legacy_fusion, NULL));
    const char *type = NULL;
    ZT_TRY(zt_json_get_string(&opt, "type", &type, NULL));
    if (!type)
        return zt_json_key_error(ZT_ERR_INVALID, &opt, "type", "is required");
    ZT_TRY(zt_json_child(&opt, "params", &params));
    /* DeepSpeed checks the key's presence, whatever its value, before looking at the type. */
    if (params.obj && cJSON_GetObjectItemCaseSensitive(params.obj, "max_grad_norm"))
        return zt_error(ZT_ERR_INVALID, "%s: 'max_grad_norm' is not supported as an optimizer parameter, "
                        "please switch to using the deepspeed parameter 'gradient_clipping' see: "
                        "https://www.deepspeed.ai/docs/config-json/#gradient-clipping for more details",
                        top->source);

    char lower[32] = "";
    for (size_t i = 0; type[i] && i + 1 < sizeof lower; i++)
        lower[i] = (char)((type[i] >= 'A' && type[i] <= 'Z') ? type[i] + 32 : type[i]);
    bool builtin = strlen(type) < sizeof lower && name_in(lower, ds_builtin_optimizers);
    cfg->has_optimizer = true;
    snprintf(cfg->optimizer.name, sizeof cfg->optimizer.name, "%s", type);
    if (builtin && (strcmp(lower, "adam") == 0 || strcmp(lower, "adamw") == 0))
        return parse_adam(&cfg->optimizer, &params, strcmp(lower, "adamw") == 0);
    if (!builtin && strcmp(type, "SGD") == 0)
        return parse_sgd(&cfg->optimizer, &params);
    if (builtin || name_in(type, torch_optimizers))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: optimizer type '%s' is not supported by ztrain "
                        "(supported: Adam, AdamW, SGD)", top->source, type);
    const char *near = zt_json_suggest(type, torch_optimizers);
    char hint[96] = "";
    if (near)
        snprintf(hint, sizeof hint, "; did you mean '%s'?", near);
    return zt_error(ZT_ERR_INVALID, "%s: unknown optimizer type '%s' (DeepSpeed's own types such as "
                    "Adam are case-insensitive, torch.optim names such as SGD are case-sensitive)%s",
                    top->source, type, hint);
}

/* ------------------------------------------------------------------------------------------ */
/* Scheduler (deepspeed/runtime/lr_schedules.py)                                               */

static const char *const ds_schedulers[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                            "OneCycle", "LRRangeTest", NULL};
static const char *const torch_schedulers[] = {
    "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
    "ExponentialLR", "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau",
    "CyclicLR", "CosineAnnealingWarmRestarts", "OneCycleLR", "PolynomialLR", NULL};

/* A positive int; a zero would divide by zero inside the schedule. */
static zt_status get_positive_int(const zt_json_obj *p, const char *key, int *out, bool *found) {
    bool f;
    ZT_TRY(zt_json_get_int(p, key, out, &f));
    if (found)
        *found = f;
    if (f && *out <= 0)
        return zt_json_key_error(ZT_ERR_INVALID, p, key, "must be a positive integer, got %d", *out);
    return ZT_OK;
}

static zt_status get_nonneg_int(const zt_json_obj *p, const char *key, int *out, bool *found) {
    bool f;
    ZT_TRY(zt_json_get_int(p, key, out, &f));
    if (found)
        *found = f;
    if (f && *out < 0)
        return zt_json_key_error(ZT_ERR_INVALID, p, key, "must be >= 0, got %d", *out);
    return ZT_OK;
}

/* warmup_num_steps and warmup_type, shared by the three Warmup* schedules. */
static zt_status parse_warmup(zt_schedule_config *s, const zt_json_obj *p) {
    const cJSON *n = zt_json_item(p, "warmup_num_steps");
    if (n) {
        if (!cJSON_IsNumber(n) || n->valuedouble != floor(n->valuedouble) || n->valuedouble <= 0 ||
            n->valuedouble > INT_MAX) {
            char got[64];
            zt_json_repr(n, got, sizeof got);
            return zt_error(ZT_ERR_INVALID, "%s: %s: warmup_num_steps must be a positive integer, got %s",
                            p->source, p->path, got);
        }
        s->warmup_num_steps = (int)n->valuedouble;
    }
    const char *type = NULL;
    ZT_TRY(zt_json_get_string(p, "warmup_type", &type, NULL));
    if (type && strcmp(type, "log") != 0 && strcmp(type, "linear") != 0)
        ds_warn(p->source, "Using unknown warmup_type: %s. The increasing function is set to default (log)",
                type);
    s->warmup_linear = type && strcmp(type, "linear") == 0;
    return ZT_OK;
}

static zt_status parse_total_steps(zt_schedule_config *s, const zt_json_obj *p) {
    ZT_TRY(zt_json_require(p, "total_num_steps"));
    ZT_TRY(get_positive_int(p, "total_num_steps", &s->total_num_steps, NULL));
    int n = s->warmup_num_steps < 2 ? 2 : s->warmup_num_steps;
    if (s->total_num_steps < n)
        ds_warn(p->source, "total_num_steps %d is less than warmup_num_steps %d", s->total_num_steps,
                s->warmup_num_steps);
    return ZT_OK;
}

static zt_status parse_one_cycle(zt_ds_config *cfg, const zt_json_obj *p) {
    zt_schedule_config *s = &cfg->scheduler;
    bool second_given = false, stair_given = false;
    ZT_TRY(zt_json_require(p, "cycle_min_lr"));
    ZT_TRY(zt_json_require(p, "cycle_max_lr"));
    ZT_TRY(zt_json_get_double(p, "cycle_min_lr", &s->cycle_min_lr, NULL));
    ZT_TRY(zt_json_get_double(p, "cycle_max_lr", &s->cycle_max_lr, NULL));
    ZT_TRY(zt_json_get_double(p, "decay_lr_rate", &s->decay_lr_rate, NULL));
    ZT_TRY(get_positive_int(p, "cycle_first_step_size", &s->cycle_first_step_size, NULL));
    ZT_TRY(get_positive_int(p, "cycle_second_step_size", &s->cycle_second_step_size, &second_given));
    ZT_TRY(get_nonneg_int(p, "cycle_first_stair_count", &s->cycle_first_stair_count, NULL));
    ZT_TRY(get_nonneg_int(p, "cycle_second_stair_count", &s->cycle_second_stair_count, &stair_given));
    ZT_TRY(get_nonneg_int(p, "decay_step_size", &s->decay_step_size, NULL));
    ZT_TRY(zt_json_get_bool(p, "cycle_momentum", &s->cycle_momentum, NULL));
    ZT_TRY(zt_json_get_double(p, "cycle_min_mom", &s->cycle_min_mom, NULL));
    ZT_TRY(zt_json_get_double(p, "cycle_max_mom", &s->cycle_max_mom, NULL));
    ZT_TRY(zt_json_get_double(p, "decay_mom_rate", &s->decay_mom_rate, NULL));
    if (!second_given)
        s->cycle_second_step_size = s->cycle_first_step_size;
    if (!stair_given)
        s->cycle_second_stair_count = s->cycle_first_stair_count;
    if (s->cycle_momentum && cfg->has_optimizer) {
        if (cfg->optimizer.type == ZT_OPTIM_SGD) {
            ds_warn(p->source, "cycle_momentum is disabled because optimizer SGD does not support "
                               "momentum, no betas attribute in defaults");
            s->cycle_momentum = false;
        } else {
            cfg->optimizer.beta2 = 0.99;
        }
    }
    return ZT_OK;
}

static zt_status parse_scheduler(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_json_obj sch, p;
    ZT_TRY(zt_json_child(top, "scheduler", &sch));
    if (!sch.obj)
        return ZT_OK;
    static const char *const keys[] = {"type", "params", NULL};
    ZT_TRY(zt_json_check_keys(&sch, keys));
    const char *type = NULL;
    ZT_TRY(zt_json_get_string(&sch, "type", &type, NULL));
    if (!type)
        return zt_json_key_error(ZT_ERR_INVALID, &sch, "type", "is required");
    ZT_TRY(zt_json_child(&sch, "params", &p));
    zt_schedule_config *s = &cfg->scheduler;

    if (strcmp(type, "WarmupLR") == 0 || strcmp(type, "WarmupDecayLR") == 0) {
        bool decay = type[6] == 'D';
        static const char *const warm_keys[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                                "warmup_type", "last_batch_iteration", NULL};
        static const char *const decay_keys[] = {"total_num_steps", "warmup_min_lr", "warmup_max_lr",
                                                 "warmup_num_steps", "warmup_type",
                                                 "last_batch_iteration", NULL};
        ZT_TRY(zt_json_check_keys(&p, decay ? decay_keys : warm_keys));
        s->type = decay ? ZT_SCHED_WARMUP_DECAY_LR : ZT_SCHED_WARMUP_LR;
        /* WarmupLR's max defaults to the optimizer's lr; WarmupDecayLR's signature says 0.001. */
        s->warmup_max_lr = !decay && cfg->has_optimizer ? cfg->optimizer.lr : 1e-3;
        ZT_TRY(zt_json_get_double(&p, "warmup_min_lr", &s->warmup_min_lr, NULL));
        ZT_TRY(zt_json_get_double(&p, "warmup_max_lr", &s->warmup_max_lr, NULL));
        ZT_TRY(parse_warmup(s, &p));
        if (decay)
            ZT_TRY(parse_total_steps(s, &p));
    } else if (strcmp(type, "WarmupCosineLR") == 0) {
        static const char *const cos_keys[] = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                                               "cos_min_ratio", "warmup_type", "last_batch_iteration",
                                               NULL};
        ZT_TRY(zt_json_check_keys(&p, cos_keys));
        s->type = ZT_SCHED_WARMUP_COSINE_LR;
        ZT_TRY(zt_json_get_double(&p, "warmup_min_ratio", &s->warmup_min_ratio, NULL));
        ZT_TRY(zt_json_get_double(&p, "cos_min_ratio", &s->cos_min_ratio, NULL));
        ZT_TRY(parse_warmup(s, &p));
        ZT_TRY(parse_total_steps(s, &p));
    } else if (strcmp(type, "OneCycle") == 0) {
        static const char *const oc_keys[] = {
            "cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
            "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
            "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate",
            "last_batch_iteration", NULL};
        ZT_TRY(zt_json_check_keys(&p, oc_keys));
        s->type = ZT_SCHED_ONE_CYCLE;
        ZT_TRY(parse_one_cycle(cfg, &p));
    } else if (strcmp(type, "LRRangeTest") == 0) {
        static const char *const lrrt_keys[] = {"lr_range_test_min_lr", "lr_range_test_step_size",
                                                "lr_range_test_step_rate", "lr_range_test_staircase",
                                                "last_batch_iteration", NULL};
        ZT_TRY(zt_json_check_keys(&p, lrrt_keys));
        s->type = ZT_SCHED_LR_RANGE_TEST;
        ZT_TRY(zt_json_get_double(&p, "lr_range_test_min_lr", &s->lr_range_test_min_lr, NULL));
        ZT_TRY(get_positive_int(&p, "lr_range_test_step_size", &s->lr_range_test_step_size, NULL));
        ZT_TRY(zt_json_get_double(&p, "lr_range_test_step_rate", &s->lr_range_test_step_rate, NULL));
        ZT_TRY(zt_json_get_bool(&p, "lr_range_test_staircase", &s->lr_range_test_staircase, NULL));
    } else if (name_in(type, torch_schedulers)) {
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: scheduler type '%s' (torch.optim.lr_scheduler) is not "
                        "supported by ztrain (supported: WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                        "OneCycle, LRRangeTest)", top->source, type);
    } else {
        const char *near = zt_json_suggest(type, ds_schedulers);
        char hint[96] = "";
        if (near)
            snprintf(hint, sizeof hint, "; did you mean '%s'? (names are case-sensitive)", near);
        return zt_error(ZT_ERR_INVALID, "%s: unknown scheduler type '%s'%s", top->source, type, hint);
    }

    /* The starting iteration of a resumed run comes from ztrain's own checkpoint. */
    int last = -1;
    ZT_TRY(zt_json_get_int(&p, "last_batch_iteration", &last, NULL));
    if (last != -1)
        return zt_json_key_error(ZT_ERR_UNSUPPORTED, &p, "last_batch_iteration",
                                 "%d is not supported (only -1; resume from a checkpoint instead)", last);
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Gates                                                                                       */

/* Switches in sections ztrain accepts but does not act on. Honouring them is not planned, so
 * turning one on is refused rather than silently dropped. */
static zt_status ds_config_check_features(const zt_ds_config *cfg, const zt_json_obj *top) {
    const char *src = top->source;
    static const char *const monitors[] = {"tensorboard", "wandb", "csv_monitor", "comet", NULL};
    static const char *const switched[] = {
        "flops_profiler", "comms_logger", "elasticity", "autotuning", "eigenvalue",
        "progressive_layer_drop", "curriculum_learning", "data_efficiency", "hybrid_engine",
        "nebula", "datastates", "amp", "torch_autocast", "quantize_training", "expert_parallel",
        NULL};
    for (int pass = 0; pass < 2; pass++) {
        for (const char *const *k = pass ? switched : monitors; *k; k++) {
            const cJSON *sec = zt_json_item(top, *k);
            const cJSON *en = sec && cJSON_IsObject(sec) ? cJSON_GetObjectItemCaseSensitive(sec, "enabled") : NULL;
            if (!cJSON_IsTrue(en))
                continue;
            if (!pass)
                return zt_error(ZT_ERR_UNSUPPORTED, "%s: %s.enabled is not supported: ztrain writes its "
                                "metrics to metrics.jsonl instead", src, *k);
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: %s.enabled is not supported by ztrain", src, *k);
        }
    }
    const cJSON *ac = zt_json_item(top, "activation_checkpointing");
    static const char *const ac_flags[] = {"partition_activations", "cpu_checkpointing", NULL};
    for (const char *const *k = ac_flags; ac && *k; k++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ac, *k)))
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: activation_checkpointing.%s is not supported by ztrain",
                            src, *k);
    const cJSON *comp = zt_json_item(top, "compile");
    if (comp && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(comp, "deepcompile")))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: compile.deepcompile is not supported by ztrain", src);
    const cJSON *tp = zt_json_item(top, "tensor_parallel");
    const cJSON *tp_size = tp ? cJSON_GetObjectItemCaseSensitive(tp, "autotp_size") : NULL;
    if (cJSON_IsNumber(tp_size) && tp_size->valuedouble > 1)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: tensor_parallel.autotp_size %g is not supported "
                        "(ztrain is data-parallel only)", src, tp_size->valuedouble);
    int sp = 1, dp = cfg->world_size;
    bool managed = true;
    zt_json_get_int(top, "sequence_parallel_size", &sp, NULL);
    zt_json_get_int(top, "data_parallel_size", &dp, NULL);
    zt_json_get_bool(top, "managed_gradient_accumulation", &managed, NULL);
    if (sp > 1)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: sequence_parallel_size %d is not supported (ztrain is "
                        "data-parallel only)", src, sp);
    if (dp != cfg->world_size)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: data_parallel_size %d differs from the job's world_size "
                        "%d; ztrain's data-parallel size is the world size", src, dp, cfg->world_size);
    if (!managed)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: managed_gradient_accumulation: false is not supported "
                        "(ztrain's training loop owns the accumulation boundary)", src);

    zt_json_obj z;
    zt_json_child(top, "zero_optimization", &z);
    static const char *const zero_flags[] = {"zero_quantized_weights", "zero_quantized_nontrainable_weights",
                                             "zero_quantized_gradients", "legacy_stage1",
                                             "mics_hierarchical_params_gather", NULL};
    for (const char *const *k = zero_flags; z.obj && *k; k++)
        if (cJSON_IsTrue(zt_json_item(&z, *k)))
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.%s is not supported by ztrain", src, *k);
    int hpz = 1, mics = -1;
    zt_json_get_int(&z, "zero_hpz_partition_size", &hpz, NULL);
    zt_json_get_int(&z, "mics_shard_size", &mics, NULL);
    if (hpz > 1)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.zero_hpz_partition_size %d (ZeRO++ "
                        "hierarchical partitioning) is not supported by ztrain", src, hpz);
    if (mics > 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.mics_shard_size %d (MiCS) is not "
                        "supported by ztrain", src, mics);
    if (zt_json_item(&z, "zenflow") || zt_json_item(&z, "zeropp_loco_param"))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.%s is not supported by ztrain", src,
                        zt_json_item(&z, "zenflow") ? "zenflow" : "zeropp_loco_param");
    bool super_offload = false;
    zt_json_obj off;
    zt_json_child(&z, "offload_optimizer", &off);
    zt_json_get_bool(&off, "super_offload", &super_offload, NULL);
    if (super_offload)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.offload_optimizer.super_offload is not "
                        "supported by ztrain", src);
    return ZT_OK;
}

/* Valid DeepSpeed options that this build does not run yet. Everything else in the config has
 * been validated by now; the issue that implements one of these deletes its lines here. */
static zt_status ds_config_check_implemented(const zt_ds_config *cfg, const zt_json_obj *top) {
    const char *src = top->source;
    static const char *const dev[] = {"none", "cpu", "nvme"};
    if (cfg->fp16.enabled)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: fp16.enabled is not supported yet (this build trains "
                        "in fp32)", src);
    if (cfg->bf16.enabled)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: bf16.enabled is not supported yet (this build trains "
                        "in fp32)", src);
    if (cfg->zero.stage > 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.stage %d is not supported yet (this "
                        "build implements stage 0)", src, cfg->zero.stage);
    if (cfg->zero.offload_optimizer.device != ZT_OFFLOAD_NONE)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.offload_optimizer.device \"%s\" is "
                        "not supported yet (this build implements \"none\")", src,
                        dev[cfg->zero.offload_optimizer.device]);
    if (cfg->zero.offload_param.device != ZT_OFFLOAD_NONE)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.offload_param.device \"%s\" is not "
                        "supported yet (this build implements \"none\")", src,
                        dev[cfg->zero.offload_param.device]);
    if (cfg->communication_data_type[0] && strcmp(cfg->communication_data_type, "fp32") != 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: communication_data_type \"%s\" is not supported yet "
                        "(this build communicates in fp32)", src, cfg->communication_data_type);
    const char *op = NULL;
    zt_json_get_string(top, "gradient_allreduce_op", &op, NULL);
    if (op && strcasecmp(op, "sum") == 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: gradient_allreduce_op \"sum\" is not supported yet "
                        "(this build averages gradients)", src);
    zt_json_obj dt;
    zt_json_child(top, "data_types", &dt);
    static const char *const dt_keys[] = {"grad_accum_dtype", "param_dtype", "buffer_dtype", NULL};
    for (const char *const *k = dt_keys; *k; k++) {
        const char *v = NULL;
        zt_json_get_string(&dt, *k, &v, NULL);
        if (v && strcmp(dtype_canonical(v), "fp32") != 0)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: data_types.%s \"%s\" is not supported yet (this "
                            "build keeps everything in fp32)", src, *k, v);
    }
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                                */

zt_status zt_ds_config_from_json(zt_ds_config *cfg, const cJSON *root, const char *source,
                                 int world_size) {
    zt_ds_config_defaults(cfg);
    if (!cJSON_IsObject(root)) {
        char got[64];
        zt_json_repr(root, got, sizeof got);
        return zt_error(ZT_ERR_INVALID, "%s: a DeepSpeed config must be a JSON object, got %s", source, got);
    }
    ZT_TRY(zt_json_check_duplicates(root, source, "DeepSpeed config", "", NULL));
    if (world_size < 1)
        return zt_error(ZT_ERR_INVALID, "%s: world_size must be >= 1, got %d", source, world_size);
    cfg->world_size = world_size;

    zt_json_obj top;
    zt_json_obj_init(&top, root, source, "");
    batch_keys bk = {0};
    warn_unknown_top_keys(&top);
    ZT_TRY(parse_top(cfg, &top, &bk));
    ZT_TRY(parse_zero(cfg, &top));
    ZT_TRY(parse_precision(cfg, &top));
    ZT_TRY(infer_batch(cfg, &bk, source));
    const char *op = NULL;
    ZT_TRY(zt_json_get_string(&top, "gradient_allreduce_op", &op, NULL));
    if (op && strcasecmp(op, "sum") == 0 && cfg->zero.stage == 3)
        return zt_error(ZT_ERR_INVALID, "%s: gradient_allreduce_op='sum' is not supported with ZeRO stage 3",
                        source);
    ZT_TRY(parse_optimizer(cfg, &top));
    ZT_TRY(parse_scheduler(cfg, &top));
    ZT_TRY(ds_config_check_features(cfg, &top));
    return ds_config_check_implemented(cfg, &top);
}

zt_status zt_ds_config_parse(zt_ds_config *cfg, const char *json_text, const char *source,
                             int world_size) {
    cJSON *root;
    ZT_TRY(zt_json_parse(json_text, source, &root));
    zt_status s = zt_ds_config_from_json(cfg, root, source, world_size);
    cJSON_Delete(root);
    return s;
}

zt_status zt_ds_config_load(zt_ds_config *cfg, const char *path, int world_size) {
    char *text;
    ZT_TRY(zt_json_read_file(path, &text, NULL));
    zt_status s = zt_ds_config_parse(cfg, text, path, world_size);
    free(text);
    return s;
}
