/* The DeepSpeed config, read the way DeepSpeed 0.19 reads it (shared/reference/deepspeed.md §1):
 * the entry points, the top-level keys, the batch triple, the two gates, and the helpers every
 * section shares; the sections themselves are in ds_config_optim.c, ds_config_zero.c and
 * ds_config_monitor.c. Order of work follows DeepSpeedConfig: sections and scalars first, then the
 * batch triple, then what DeepSpeed checks when it builds the optimizer and the scheduler, and
 * last the two gates, so a config that is wrong is reported as wrong before it is reported as
 * unsupported. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ds_config_internal.h"
#include "ds_config_json.h"

/* The config being parsed on this thread, whose warnings zt_ds_warn records. */
static _Thread_local zt_ds_config *warn_sink;

void zt_ds_warn(const char *source, const char *fmt, ...) {
    char line[1024];
    int n = snprintf(line, sizeof line, "ztrain: warning: %s: ", source);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (!warn_sink) {
        fprintf(stderr, "%s\n", line);
        return;
    }
    char *w = warn_sink->warnings;
    size_t used = strlen(w), len = strlen(line);
    for (const char *at = w; (at = strstr(at, line)) != NULL; at += len)
        if ((at == w || at[-1] == '\n') && at[len] == '\n')
            return;
    if (used + len + 2 > sizeof warn_sink->warnings) {
        warn_sink->warnings_lost++;
        return;
    }
    memcpy(w + used, line, len);
    w[used + len] = '\n';
    w[used + len + 1] = '\0';
}

void zt_ds_config_print_warnings(const zt_ds_config *cfg, FILE *f) {
    fputs(cfg->warnings, f);
    if (cfg->warnings_lost)
        fprintf(f, "ztrain: warning: %d more warning(s) about the DeepSpeed config not shown\n",
                cfg->warnings_lost);
    fflush(f);
}

zt_status zt_ds_fail(zt_status s, const zt_json_obj *o, const char *key, const char *fmt, ...) {
    char msg[2048], path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    zt_error(s, "%s", msg);
    if (key)
        zt_json_key_path(o, key, path, sizeof path);
    else
        snprintf(path, sizeof path, "%s", o->path);
    return zt_error_field(s, path);
}

void zt_ds_py_float(double v, char *buf, size_t n) {
    /* repr(float): the fewest significant digits that read back as the same double, written
     * positionally for exponents -4 to 15 (with ".0" when there is no fraction) and as
     * "1e+16" / "1.5e-07" outside. */
    char sci[40];
    int digits = 1;
    for (; digits <= 17; digits++) {
        snprintf(sci, sizeof sci, "%.*e", digits - 1, v);
        if (strtod(sci, NULL) == v)
            break;
    }
    const char *e = strchr(sci, 'e');
    int exp = e ? atoi(e + 1) : 0;
    if (!isfinite(v) || exp < -4 || exp >= 16) {
        snprintf(buf, n, "%s", isnan(v) ? "nan" : isinf(v) ? (v < 0 ? "-inf" : "inf") : sci);
        return;
    }
    int decimals = digits - 1 - exp;
    snprintf(buf, n, "%.*f", decimals > 0 ? decimals : 0, v);
    if (!strchr(buf, '.') && strlen(buf) + 2 < n)
        strcat(buf, ".0");
}

void zt_ds_py_str(const cJSON *v, char *buf, size_t n) {
    if (cJSON_IsNumber(v) && zt_json_is_float_literal(v)) {
        zt_ds_py_float(v->valuedouble, buf, n);
    } else if (cJSON_IsNumber(v) && zt_json_int_digits(v)) { /* past 2**53, as written */
        snprintf(buf, n, "%s", zt_json_int_digits(v));
    } else if (cJSON_IsNumber(v)) {
        snprintf(buf, n, "%.0f", v->valuedouble);
    } else if (cJSON_IsBool(v)) {
        snprintf(buf, n, "%s", cJSON_IsTrue(v) ? "True" : "False");
    } else if (!v || cJSON_IsNull(v)) {
        snprintf(buf, n, "None");
    } else if (cJSON_IsString(v)) {
        snprintf(buf, n, "%s", v->valuestring);
    } else {
        zt_json_repr(v, buf, n);
    }
}

bool zt_ds_name_in(const char *name, const char *const *list) {
    for (; *list; list++)
        if (strcmp(name, *list) == 0)
            return true;
    return false;
}

void zt_ds_config_defaults(zt_ds_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->world_size = 1;
    cfg->tp_size = 1;

    zt_optimizer_config *o = &cfg->optimizer;
    o->type = ZT_OPTIM_ADAM;
    o->lr = 1e-3;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->adam_w_mode = true;
    o->bias_correction = true;
    o->max_coeff = 10.0;
    o->min_coeff = 0.01;

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

    snprintf(cfg->monitor.tensorboard.dir, sizeof cfg->monitor.tensorboard.dir, "DeepSpeedJobName");
    snprintf(cfg->monitor.csv.dir, sizeof cfg->monitor.csv.dir, "DeepSpeedJobName");

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
/* Field tables (ds_config_internal.h)                                                          */

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

zt_status zt_ds_read_fields(const zt_json_obj *o, const field *fields, size_t n, void *base) {
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

zt_status zt_ds_check_table_keys(const zt_json_obj *o, const field *fields, size_t n,
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

/* ------------------------------------------------------------------------------------------ */
/* Top-level scalars                                                                           */

/* A DeepSpeed data type name ("fp16", "bfloat16", "torch.float32", ...) as fp32/fp16/bf16, or
 * NULL for a name DtypeEnum does not know. */
static const char *dtype_canonical(const char *name) {
    static const char *const fp32[] = {"fp32", "float32", "float", "torch.float32", NULL};
    static const char *const fp16[] = {"fp16", "float16", "half", "torch.float16", NULL};
    static const char *const bf16[] = {"bf16", "bfloat16", "torch.bfloat16", NULL};
    if (zt_ds_name_in(name, fp32))
        return "fp32";
    if (zt_ds_name_in(name, fp16))
        return "fp16";
    if (zt_ds_name_in(name, bf16))
        return "bf16";
    return NULL;
}

zt_dtype zt_ds_train_dtype(const zt_ds_config *cfg) {
    return cfg->bf16.enabled ? ZT_BF16 : cfg->fp16.enabled ? ZT_F16 : ZT_F32;
}

zt_dtype zt_ds_comm_dtype(const zt_ds_config *cfg) {
    const char *c = cfg->communication_data_type; /* "" or lower case (read_comm_dtype) */
    if (strcmp(c, "fp32") == 0)
        return ZT_F32;
    if (strcmp(c, "bf16") == 0)
        return ZT_BF16;
    if (strcmp(c, "fp16") == 0)
        return ZT_F16;
    return zt_ds_train_dtype(cfg);
}

zt_dtype zt_ds_grad_accum_dtype(const zt_ds_config *cfg) {
    const char *a = cfg->grad_accum_dtype; /* "" or canonical (parse_top) */
    if (strcmp(a, "fp32") == 0)
        return ZT_F32;
    if (strcmp(a, "bf16") == 0)
        return ZT_BF16;
    if (strcmp(a, "fp16") == 0)
        return ZT_F16;
    return zt_ds_train_dtype(cfg);
}

/* data_types.keep_in_fp32_modules: the buffers DeepSpeed keeps in fp32 under 16-bit training,
 * "auto" (the model's own transformers lists) or a list of name patterns; anything else (null
 * too) DeepSpeedConfig refuses. Every value is honoured as it stands: ztrain's models have no
 * buffers in the training precision (the RoPE tables are computed in fp32 at each use). */
static zt_status read_keep_in_fp32(const zt_json_obj *dt) {
    const cJSON *v = dt->obj ? cJSON_GetObjectItemCaseSensitive(dt->obj, "keep_in_fp32_modules")
                             : NULL;
    if (!v || (cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0))
        return ZT_OK;
    bool names = cJSON_IsArray(v);
    for (const cJSON *n = names ? v->child : NULL; n; n = n->next)
        names = names && cJSON_IsString(n);
    if (!names)
        return zt_json_key_error(ZT_ERR_INVALID, dt, "keep_in_fp32_modules",
                                 "must be \"auto\" or a list of name patterns (DeepSpeed "
                                 "refuses anything else)");
    return ZT_OK;
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
    {"steps_per_print", FT_INT, FLD(zt_ds_config, steps_per_print), ANYVAL},
    {"dump_state", FT_BOOL, NOSTORE, ANYVAL},
    {"disable_allgather", FT_BOOL, NOSTORE, ANYVAL},
    {"prescale_gradients", FT_BOOL, FLD(zt_ds_config, prescale_gradients), ANYVAL},
    {"gradient_predivide_factor", FT_DOUBLE, FLD(zt_ds_config, gradient_predivide_factor), ANYVAL},
    {"sparse_gradients", FT_BOOL, NOSTORE, ANYVAL},
    {"zero_allow_untested_optimizer", FT_BOOL, FLD(zt_ds_config, zero_allow_untested_optimizer), ANYVAL},
    {"zero_force_ds_cpu_optimizer", FT_BOOL, NOSTORE, ANYVAL},
    /* DeepSpeed's optimizers clip only when it is > 0: a negative value is no clipping, as 0. */
    {"gradient_clipping", FT_DOUBLE, FLD(zt_ds_config, gradient_clipping), ANYVAL},
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
    ZT_TRY(zt_ds_read_fields(top, top_fields, NFIELDS(top_fields), cfg));
    /* DeepSpeed prints when (step + 1) % steps_per_print == 0, which in Python holds for -n
     * exactly when it holds for n. */
    if (cfg->steps_per_print == INT_MIN)
        return zt_json_key_error(ZT_ERR_INVALID, top, "steps_per_print", "is out of range, got %d",
                                 cfg->steps_per_print);
    /* 0 stored is DeepSpeed's None (never); a 0 given is Python's ZeroDivisionError in the
     * engine's (step + 1) % steps_per_print at the end of the first step. */
    if (cfg->steps_per_print == 0 && cJSON_IsNumber(zt_json_item(top, "steps_per_print")))
        return zt_json_key_error(ZT_ERR_INVALID, top, "steps_per_print",
                                 "must not be 0: DeepSpeed's (step + 1) %% steps_per_print is "
                                 "ZeroDivisionError at the first step (leave it out or null for "
                                 "no step line)");
    if (cfg->steps_per_print < 0)
        cfg->steps_per_print = -cfg->steps_per_print;
    /* Gradients are divided by it before the reduction; DeepSpeed checks it only at run time,
     * where 0 would crash, so it is rejected here. */
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
    static const char *const dt_keys[] = {"grad_accum_dtype", "param_dtype", "buffer_dtype",
                                          "keep_in_fp32_modules", NULL};
    static const char *const dtype_keys[] = {"grad_accum_dtype", "param_dtype", "buffer_dtype",
                                             NULL};
    ZT_TRY(zt_json_check_keys(&dt, dt_keys));
    ZT_TRY(read_keep_in_fp32(&dt));
    for (const char *const *k = dtype_keys; *k; k++) {
        const char *v = NULL;
        ZT_TRY(zt_json_get_string(&dt, *k, &v, NULL));
        if (v && !dtype_canonical(v))
            return zt_json_key_error(ZT_ERR_INVALID, &dt, *k,
                                     "must be \"fp32\", \"fp16\" or \"bf16\", got \"%s\"", v);        if (v && strcmp(*k, "grad_accum_dtype") == 0)
            snprintf(cfg->grad_accum_dtype, sizeof cfg->grad_accum_dtype, "%s",
                     dtype_canonical(v));
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

/* Inference divides like Python (floor); where Python would raise ZeroDivisionError the inference
 * is skipped and DeepSpeed's "has to be greater than 0" assertion names the zero key. */
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

    /* DeepSpeed's texts name the batch keys in prose; the field says which one is at fault. */
    if (t <= 0) {
        zt_error(ZT_ERR_INVALID, "%s: Train batch size: %lld has to be greater than 0", src,
                 (long long)t);
        return zt_error_field(ZT_ERR_INVALID, "train_batch_size");
    }
    if (m <= 0) {
        zt_error(ZT_ERR_INVALID, "%s: Micro batch size per gpu: %lld has to be greater than 0",
                 src, (long long)m);
        return zt_error_field(ZT_ERR_INVALID, "train_micro_batch_size_per_gpu");
    }
    if (g <= 0) {
        zt_error(ZT_ERR_INVALID, "%s: Gradient accumulation steps: %lld has to be greater than 0",
                 src, (long long)g);
        return zt_error_field(ZT_ERR_INVALID, "gradient_accumulation_steps");
    }
    int64_t prod;
    if (__builtin_mul_overflow(m, g, &prod) || __builtin_mul_overflow(prod, w, &prod) || prod != t) {
        zt_error(ZT_ERR_INVALID, "%s: Check batch related parameters. train_batch_size is not "
                 "equal to micro_batch_per_gpu * gradient_acc_step * world_size "
                 "%lld != %lld * %lld * %lld", src, (long long)t, (long long)m, (long long)g,
                 (long long)w);
        return zt_error_field(ZT_ERR_INVALID, "train_batch_size");
    }
    if (t > 0x7fffffff) {
        zt_error(ZT_ERR_INVALID, "%s: train_batch_size %lld is too large", src, (long long)t);
        return zt_error_field(ZT_ERR_INVALID, "train_batch_size");
    }
    cfg->train_batch_size = (int)t;
    cfg->train_micro_batch_size_per_gpu = (int)m;
    cfg->gradient_accumulation_steps = (int)g;
    return ZT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Gates                                                                                       */

/* data_efficiency runs a feature only when the switches on the whole path to it are on
 * (data_efficiency.enabled, then data_sampling.enabled or data_routing.enabled, then the feature's
 * own). A feature switched on under a switch that is off does nothing, in DeepSpeed too: a warning
 * says so. A section with every feature off is accepted. */
static zt_status check_data_efficiency(const zt_json_obj *top) {
    static const char *const features[][2] = {{"data_sampling", "curriculum_learning"},
                                              {"data_sampling", "dynamic_batching"},
                                              {"data_routing", "random_ltd"}};
    const cJSON *de = zt_json_item(top, "data_efficiency");
    for (size_t i = 0; cJSON_IsObject(de) && i < sizeof features / sizeof features[0]; i++) {
        const cJSON *group = cJSON_GetObjectItemCaseSensitive(de, features[i][0]);
        const cJSON *feat = cJSON_IsObject(group) ? cJSON_GetObjectItemCaseSensitive(group, features[i][1])
                                                  : NULL;
        if (!cJSON_IsObject(feat) || !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(feat, "enabled")))
            continue;
        bool de_on = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(de, "enabled"));
        bool group_on = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(group, "enabled"));
        if (de_on && group_on)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: data_efficiency.%s.%s.enabled is not supported "
                            "by ztrain", top->source, features[i][0], features[i][1]);
        zt_ds_warn(top->source, "data_efficiency.%s.%s.enabled has no effect: %s is false",
                   features[i][0], features[i][1],
                   de_on ? features[i][0] : "data_efficiency.enabled");
    }
    return ZT_OK;
}

/* Switches in sections ztrain accepts but does not act on (and does not validate inside).
 * Honouring them is not planned, so turning one on ("enabled": true on the profiler,
 * elasticity, amp, ...; activation partitioning; ZeRO++ quantisation) is ZT_ERR_UNSUPPORTED
 * rather than silently dropped. */
/* activation_checkpointing: where the job's checkpointed block inputs go (its other keys are
 * warned by the key table). */
static zt_status parse_activation_checkpointing(zt_ds_config *cfg, const zt_json_obj *top) {
    if (!cJSON_IsObject(zt_json_item(top, "activation_checkpointing")))
        return ZT_OK;
    zt_json_obj o;
    ZT_TRY(zt_json_child(top, "activation_checkpointing", &o));
    return zt_json_get_bool(&o, "cpu_checkpointing", &cfg->cpu_checkpointing, NULL);
}

static zt_status ds_config_check_features(const zt_ds_config *cfg, const zt_json_obj *top) {
    const char *src = top->source;
    ZT_TRY(zt_ds_check_switches(top));
    ZT_TRY(zt_ds_check_checkpoint(top));
    ZT_TRY(check_data_efficiency(top));
    int sp = 1, dp = cfg->world_size;
    bool managed = true;
    zt_json_get_int(top, "sequence_parallel_size", &sp, NULL);
    zt_json_get_int(top, "data_parallel_size", &dp, NULL);
    zt_json_get_bool(top, "managed_gradient_accumulation", &managed, NULL);
    if (sp > 1)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: sequence_parallel_size %d is not supported (ztrain "
                        "has no sequence parallelism)", src, sp);
    if (dp != cfg->world_size)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: data_parallel_size %d differs from the job's world_size "
                        "%d; ztrain's data-parallel size is the world size", src, dp, cfg->world_size);
    if (!managed)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: managed_gradient_accumulation: false is not supported "
                        "(ztrain's training loop owns the accumulation boundary)", src);

    zt_json_obj z;
    zt_json_child(top, "zero_optimization", &z);
    static const char *const zero_flags[] = {"zero_quantized_weights", "zero_quantized_nontrainable_weights",
                                             "zero_quantized_gradients", "legacy_stage1", NULL};
    for (const char *const *k = zero_flags; z.obj && *k; k++)
        if (cJSON_IsTrue(zt_json_item(&z, *k)))
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.%s is not supported by ztrain", src, *k);
    int hpz = 1;
    zt_json_get_int(&z, "zero_hpz_partition_size", &hpz, NULL);
    if (hpz > 1)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.zero_hpz_partition_size %d (ZeRO++ "
                        "hierarchical partitioning) is not supported by ztrain", src, hpz);
    if (zt_json_item(&z, "zenflow"))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.zenflow is not supported by ztrain",
                        src);
    bool super_offload = false;
    zt_json_obj off;
    zt_json_child(&z, "offload_optimizer", &off);
    zt_json_get_bool(&off, "super_offload", &super_offload, NULL);
    if (super_offload)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: zero_optimization.offload_optimizer.super_offload is not "
                        "supported by ztrain", src);
    return ZT_OK;
}

/* The warnings that depend on more than one key; the key table's pass (ds_config_keys.c) gives
 * those of single keys. */
static void ds_config_warn_without_effect(const zt_ds_config *cfg, const zt_json_obj *top) {
    const char *src = top->source;
    const zt_zero_config *z = &cfg->zero;
    const cJSON *zero = zt_json_item(top, "zero_optimization");
    const cJSON *overlap = cJSON_IsObject(zero) ? cJSON_GetObjectItemCaseSensitive(zero, "overlap_comm")
                                                : NULL;
    /* The communication thread exists only to overlap collectives, which one rank has none of. */
    if (cJSON_IsTrue(overlap) && z->stage >= 2 && cfg->world_size == 1)
        zt_ds_warn(src, "zero_optimization.overlap_comm has no effect with one rank");
    /* The next layer is prefetched on the communication thread, so only with overlap_comm. */
    if (z->stage == 3 && !z->overlap_comm && z->stage3_prefetch_bucket_size != 50000000)
        zt_ds_warn(src, "zero_optimization.stage3_prefetch_bucket_size has no effect without "
                   "overlap_comm: the next layer is prefetched on the communication thread");
    bool mixed = cfg->bf16.enabled || cfg->fp16.enabled;
    if (z->stage == 3 && mixed && z->stage3_param_persistence_threshold != 100000)
        zt_ds_warn(src, "zero_optimization.stage3_param_persistence_threshold has no effect in "
                   "bf16/fp16 training yet: every 16-bit parameter is partitioned");
    /* Without files there is nothing to stream, pipeline or split. */
    const zt_offload_config *oo = &z->offload_optimizer;
    if (oo->device != ZT_OFFLOAD_NVME && (oo->pipeline_read || oo->pipeline_write ||
                                          oo->buffer_count != 4 || oo->ratio < 1.0))
        zt_ds_warn(src, "zero_optimization.offload_optimizer buffer_count / pipeline_read / "
                   "pipeline_write / ratio have no effect without device \"nvme\"");
    if (z->stage == 3 && z->offload_param.device != ZT_OFFLOAD_NVME &&
        z->offload_param.buffer_count != 5)
        zt_ds_warn(src, "zero_optimization.offload_param.buffer_count has no effect without device "
                   "\"nvme\"");
    /* The offloaded update streams its state in tiles of sub_group_size elements, from host
     * memory or files alike (offload.c); nothing else is split. */
    bool offloaded = z->offload_optimizer.device != ZT_OFFLOAD_NONE ||
                     (z->stage == 3 && z->offload_param.device != ZT_OFFLOAD_NONE);
    if (z->sub_group_size != 1000000000 && !offloaded)
        zt_ds_warn(src, "zero_optimization.sub_group_size has no effect without offload_optimizer "
                   "or offload_param");
    const zt_offload_config *op = &z->offload_param;
    /* The update streams every file through one set of buffers: offload_optimizer's when the
     * optimizer state is in files too (offload.c). */
    if (z->stage == 3 && op->device == ZT_OFFLOAD_NVME && op->buffer_count != 5 &&
        z->offload_optimizer.device == ZT_OFFLOAD_NVME)
        zt_ds_warn(src, "zero_optimization.offload_param.buffer_count has no effect with "
                   "offload_optimizer on NVMe: the update streams the parameters through "
                   "offload_optimizer.buffer_count buffers");
    if (!mixed && cfg->communication_data_type[0] && strcmp(cfg->communication_data_type, "fp32"))
        zt_ds_warn(src, "communication_data_type \"%s\" has no effect in fp32 training: ztrain "
                   "communicates fp32 gradients in fp32", cfg->communication_data_type);
}

static const char *dtype_short_name(zt_dtype t) {
    return t == ZT_BF16 ? "bf16" : t == ZT_F16 ? "fp16" : "fp32";
}

static const char *torch_dtype_name(zt_dtype t) {
    return t == ZT_BF16 ? "torch.bfloat16" : t == ZT_F16 ? "torch.float16" : "torch.float32";
}

/* data_types.grad_accum_dtype as DeepSpeed's _do_optimizer_sanity_check takes it: the training
 * type (its default) always; another type without ZeRO is its NotImplementedError; with ZeRO,
 * fp32 under bf16/fp16 adds the micro-steps up in fp32 (zero.h, accum32). */
static zt_status check_grad_accum_dtype(const zt_ds_config *cfg, const zt_json_obj *top) {
    zt_dtype model = zt_ds_train_dtype(cfg), accum = zt_ds_grad_accum_dtype(cfg);
    if (accum == model || (cfg->zero.stage > 0 && model != ZT_F32 && accum == ZT_F32))
        return ZT_OK;
    if (cfg->zero.stage == 0)
        return zt_error(ZT_ERR_INVALID, "%s: data_types.grad_accum_dtype \"%s\" with %s training "
                        "needs ZeRO stage 1-3 (DeepSpeed: unsupported mix of model_dtype=%s and "
                        "grad_accum_dtype=%s)", top->source, cfg->grad_accum_dtype,
                        dtype_short_name(model), torch_dtype_name(model), torch_dtype_name(accum));
    return zt_error(ZT_ERR_UNSUPPORTED, "%s: data_types.grad_accum_dtype \"%s\" with %s training "
                    "is not supported yet (gradients add up in fp32 or in the training type)",
                    top->source, cfg->grad_accum_dtype, dtype_short_name(model));
}

/* Valid DeepSpeed options that this build does not run yet (gradient_allreduce_op "sum", 16-bit
 * data_types): they are parsed and validated like the rest, then refused here, in one place.
 * Everything else in the config has been validated by now; the issue that implements one of
 * these deletes its lines here. */
static zt_status ds_config_check_implemented(const zt_ds_config *cfg, const zt_json_obj *top) {
    const char *src = top->source;
    const char *op = NULL;
    zt_json_get_string(top, "gradient_allreduce_op", &op, NULL);
    if (op && strcasecmp(op, "sum") == 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: gradient_allreduce_op \"sum\" is not supported yet "
                        "(this build averages gradients)", src);
    zt_json_obj dt;
    zt_json_child(top, "data_types", &dt);
    ZT_TRY(check_grad_accum_dtype(cfg, top));
    static const char *const dt_keys[] = {"param_dtype", "buffer_dtype", NULL};
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

static zt_status parse_tree(zt_ds_config *cfg, const cJSON *root, const char *source,
                            int world_size);

/* The tree as the parser reads it: a copy without its "auto" values (zt_ds_strip_auto). */
static zt_status from_json(zt_ds_config *cfg, const cJSON *root, const char *source,
                           int world_size) {
    if (!cJSON_IsObject(root))
        return parse_tree(cfg, root, source, world_size);
    cJSON *copy = cJSON_Duplicate(root, true);
    if (!copy)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory copying the DeepSpeed config", source);
    /* Duplicate keys and numbers are judged on the text as written. */
    zt_status s = zt_json_check_duplicates(root, source, "DeepSpeed config", "", NULL);
    if (s == ZT_OK)
        s = zt_json_check_finite(root, source, "", NULL);
    if (s == ZT_OK)
        s = zt_ds_strip_auto(copy, source);
    if (s == ZT_OK) {
        zt_ds_coerce_model_strings(copy);
        s = parse_tree(cfg, copy, source, world_size);
    }
    cJSON_Delete(copy);
    return s;
}

static zt_status parse_tree(zt_ds_config *cfg, const cJSON *root, const char *source,
                            int world_size) {
    if (!cJSON_IsObject(root)) {
        char got[64];
        zt_json_repr(root, got, sizeof got);
        return zt_error(ZT_ERR_INVALID, "%s: a DeepSpeed config must be a JSON object, got %s", source, got);
    }
    if (world_size < 1)
        return zt_error(ZT_ERR_INVALID, "%s: world_size must be >= 1, got %d", source, world_size);
    cfg->world_size = world_size;

    zt_json_obj top;
    zt_json_obj_init(&top, root, source, "");
    batch_keys bk = {0};
    ZT_TRY(zt_ds_check_removed(&top));
    ZT_TRY(zt_ds_check_known_keys(&top));
    ZT_TRY(zt_ds_check_nulls(&top));
    ZT_TRY(parse_top(cfg, &top, &bk));
    ZT_TRY(zt_ds_parse_zero(cfg, &top));
    ZT_TRY(zt_ds_parse_precision(cfg, &top));
    ZT_TRY(zt_ds_parse_tensor_parallel(cfg, &top));
    ZT_TRY(infer_batch(cfg, &bk, source));
    const char *op = NULL;
    ZT_TRY(zt_json_get_string(&top, "gradient_allreduce_op", &op, NULL));
    if (op && strcasecmp(op, "sum") == 0 && cfg->zero.stage == 3)
        return zt_error(ZT_ERR_INVALID, "%s: gradient_allreduce_op='sum' is not supported with ZeRO stage 3",
                        source);
    ZT_TRY(zt_ds_parse_optimizer(cfg, &top));
    if (cfg->bf16.optimizer_states && cfg->has_optimizer && cfg->optimizer.type == ZT_OPTIM_LAMB)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: bf16.bf16_optimizer_states with optimizer type "
                        "Lamb is not supported yet: ztrain's LAMB keeps fp32 moments", source);
    ZT_TRY(zt_ds_parse_scheduler(cfg, &top));
    ZT_TRY(zt_ds_parse_monitor(cfg, &top));
    ZT_TRY(parse_activation_checkpointing(cfg, &top));
    ZT_TRY(ds_config_check_features(cfg, &top));
    ZT_TRY(ds_config_check_implemented(cfg, &top));
    ds_config_warn_without_effect(cfg, &top);
    return zt_ds_apply_fates(cfg, &top);
}

zt_status zt_ds_config_from_json(zt_ds_config *cfg, const cJSON *root, const char *source,
                                 int world_size) {
    zt_ds_config_defaults(cfg);
    zt_ds_config *outer = warn_sink;
    warn_sink = cfg;
    zt_status s = from_json(cfg, root, source, world_size);
    warn_sink = outer;
    return s;
}

/* A batch error after "auto" or missing batch keys were filled quotes what was filled: DeepSpeed's
 * "Gradient accumulation steps: 0 has to be greater than 0" alone does not say that the 0 comes
 * from a micro batch of 8 that the user never wrote. The failure's field is kept. */
static zt_status quote_batch_fills(zt_status s, const char *fills) {
    const char *field = zt_last_error_field();
    bool batch = strcmp(field, "train_batch_size") == 0 ||
                 strcmp(field, "train_micro_batch_size_per_gpu") == 0 ||
                 strcmp(field, "gradient_accumulation_steps") == 0;
    if (s == ZT_OK || !batch || !fills[0])
        return s;
    char msg[1024], quoted[1024], key[64];
    snprintf(msg, sizeof msg, "%s", zt_last_error());
    snprintf(key, sizeof key, "%s", field);
    snprintf(quoted, sizeof quoted, "%s", fills);
    quoted[strlen(quoted) - 1] = '\0'; /* the last line's newline */
    for (char *nl = quoted; (nl = strchr(nl, '\n')) != NULL;)
        *nl = ';';
    zt_error(s, "%s (the batch keys ztrain filled, as the Trainer does: %s)", msg, quoted);
    return zt_error_field(s, key);
}

zt_status zt_ds_config_from_script(zt_ds_config *cfg, const cJSON *root, const char *source,
                                   const zt_training_args *args, const zt_ds_auto_context *ctx,
                                   cJSON **resolved) {
    zt_ds_config_defaults(cfg);
    if (resolved)
        *resolved = NULL;
    cJSON *copy = cJSON_Duplicate(root, true);
    if (!copy)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory copying the DeepSpeed config", source);
    zt_ds_config *outer = warn_sink;
    warn_sink = cfg;
    /* Duplicate keys are judged on the text as written, before "auto" is filled. */
    zt_status s = zt_json_check_duplicates(root, source, "DeepSpeed config", "", NULL);
    if (s == ZT_OK)
        s = zt_json_check_finite(root, source, "", NULL);
    char log[sizeof cfg->resolved], batch_fills[1024];
    log[0] = batch_fills[0] = '\0';
    /* "auto" batch keys multiply by the data-parallel size, as the Trainer's world size under
     * DeepSpeed's AutoTP: ctx's ranks per pipeline stage over the TP size (a TP size that does
     * not divide them is refused below, by name). */
    zt_ds_auto_context dp_ctx = *ctx;
    int tp = zt_ds_tp_size_of(root);
    if (tp > 1 && dp_ctx.world_size % tp == 0)
        dp_ctx.world_size /= tp;
    if (s == ZT_OK)
        s = zt_ds_resolve_auto(copy, args, &dp_ctx, source, log, sizeof log, batch_fills,
                               sizeof batch_fills);
    if (s == ZT_OK)
        s = quote_batch_fills(from_json(cfg, copy, source, ctx->world_size), batch_fills);
    /* Without an "optimizer" section the betas are the Trainer's AdamW's, a tuple (its
     * get_optimizer_cls_and_kwargs), not a list from the config. */
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    if (s == ZT_OK && (!opt || cJSON_IsNull(opt)))
        cfg->optimizer.betas_given = false;
    warn_sink = outer;
    snprintf(cfg->resolved, sizeof cfg->resolved, "%s", log);
    if (s == ZT_OK && resolved)
        *resolved = copy;
    else
        cJSON_Delete(copy);
    return s;
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
    ZT_TRY(zt_json_read_config(path, &text, NULL));
    zt_status s = zt_ds_config_parse(cfg, text, path, world_size);
    free(text);
    return s;
}
