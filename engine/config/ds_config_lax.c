/* pydantic's lax mode, as DeepSpeed's config models convert what a JSON config gives them: a
 * string holding a number or a truth value becomes the field's type, 0 and 1 become bools and
 * bools 0 and 1. The sections DeepSpeed reads through such models are converted in place here,
 * each by the fields ztrain reads or judges, before any reader sees them; a value pydantic
 * refuses is left for the reader to refuse by name. The sections DeepSpeed reads with dict.get
 * convert nothing (ds_config_internal.h). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ds_config_internal.h"

/* Python's whitespace at either end of a number; *end is one past the last non-space. */
static const char *trim(const char *s, const char **end) {
    while (*s == ' ' || (*s >= '\t' && *s <= '\r'))
        s++;
    const char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || (e[-1] >= '\t' && e[-1] <= '\r')))
        e--;
    *end = e;
    return s;
}

/* An int as pydantic reads a string: a sign, digits with single underscores between them, and
 * (unless `whole`, Python's int() as DeepSpeed's own validators call it) a fraction of zeros
 * ("2.00"). */
static bool lax_int(const char *text, bool whole, double *out) {
    const char *end, *s = trim(text, &end);
    char buf[64];
    size_t n = 0;
    if (s < end && (*s == '+' || *s == '-'))
        buf[n++] = *s++;
    bool digit = false;
    for (; s < end && n + 1 < sizeof buf; s++) {
        if (*s >= '0' && *s <= '9') {
            buf[n++] = *s;
            digit = true;
        } else if (*s == '_' && digit && s + 1 < end && s[1] >= '0' && s[1] <= '9') {
            continue;
        } else {
            break;
        }
    }
    if (!digit)
        return false;
    if (!whole && s < end && *s == '.' && s + 1 < end) {
        for (s++; s < end && *s == '0'; s++)
            ;
    }
    if (s != end)
        return false;
    buf[n] = '\0';
    *out = strtod(buf, NULL);
    return true;
}

/* A float as pydantic reads a string: Python's float() syntax, underscores dropped; a value that
 * is not finite is left to be refused as a string. */
static bool lax_float(const char *text, double *out) {
    const char *end, *s = trim(text, &end);
    char buf[64];
    size_t n = 0;
    for (; s < end && n + 1 < sizeof buf; s++)
        if (*s != '_')
            buf[n++] = *s;
    if (s != end || n == 0 || strpbrk(buf, "xXpP"))
        return false;
    buf[n] = '\0';
    char *stop;
    double v = strtod(buf, &stop);
    if (*stop || !isfinite(v))
        return false;
    *out = v;
    return true;
}

/* A bool as pydantic reads a string, in any case and without spaces. */
static bool lax_bool_text(const char *s, bool *out) {
    static const char *const yes[] = {"true", "1", "yes", "on", "t", "y", NULL};
    static const char *const no[] = {"false", "0", "no", "off", "f", "n", NULL};
    for (int i = 0; yes[i]; i++) {
        if (strcasecmp(s, yes[i]) == 0)
            return *out = true, true;
        if (strcasecmp(s, no[i]) == 0)
            return *out = false, true;
    }
    return false;
}

void zt_ds_coerce_key(cJSON *sec, const char *key, field_type type, bool strict) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(sec, key);
    bool number = type == FT_INT || type == FT_INT64 || type == FT_DOUBLE;
    double d;
    bool b;
    cJSON *to = NULL;
    if (cJSON_IsString(v) && (type == FT_INT || type == FT_INT64) &&
        lax_int(v->valuestring, strict, &d))
        to = cJSON_CreateNumber(d);
    else if (cJSON_IsString(v) && type == FT_DOUBLE && lax_float(v->valuestring, &d))
        to = cJSON_CreateNumber(d);
    else if (cJSON_IsString(v) && type == FT_BOOL && lax_bool_text(v->valuestring, &b))
        to = cJSON_CreateBool(b);
    else if (cJSON_IsNumber(v) && type == FT_BOOL && (v->valuedouble == 0 || v->valuedouble == 1))
        to = cJSON_CreateBool(v->valuedouble == 1);
    else if (cJSON_IsBool(v) && number && !strict)
        to = cJSON_CreateNumber(cJSON_IsTrue(v) ? 1 : 0);
    /* Out of memory leaves the value, which its reader then refuses by name. */
    if (to && !cJSON_ReplaceItemInObjectCaseSensitive(sec, key, to))
        cJSON_Delete(to);
}

void zt_ds_coerce_fields(cJSON *sec, const field *fields, size_t n) {
    if (!cJSON_IsObject(sec))
        return;
    for (size_t i = 0; i < n; i++)
        zt_ds_coerce_key(sec, fields[i].key, fields[i].type, false);
}

bool zt_ds_lax_bool(const cJSON *v, bool *out) {
    if (cJSON_IsBool(v))
        return *out = cJSON_IsTrue(v), true;
    if (cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1))
        return *out = v->valuedouble == 1, true;
    return cJSON_IsString(v) && lax_bool_text(v->valuestring, out);
}

/* The other sections DeepSpeed 0.19 reads through pydantic models, by the typed keys ztrain reads
 * (the monitors) or judges (a switch it refuses): deepspeed/monitor/config.py, comm/config.py
 * (CommsLoggerConfig), runtime/config.py (HybridEngineConfig), compile/config.py and
 * utils/config.py (the throughput timers). */
static const field switch_fields[] = {{"enabled", FT_BOOL, NOSTORE, ANYVAL}};
static const field comet_fields[] = {
    {"enabled", FT_BOOL, NOSTORE, ANYVAL},
    {"samples_log_interval", FT_INT, NOSTORE, ANYVAL},
    {"online", FT_BOOL, NOSTORE, ANYVAL},
};
static const field compile_fields[] = {{"deepcompile", FT_BOOL, NOSTORE, ANYVAL}};
/* runtime/tensor_parallel/config.py: TPTrainingConfig and its TPConfig (under "tensor_parallel"
 * or its alias "tp"). */
static const field tp_training_fields[] = {
    {"autotp_size", FT_INT, NOSTORE, ANYVAL},
    {"tp_overlap_comm", FT_BOOL, NOSTORE, ANYVAL},
    {"keep_module_on_host", FT_BOOL, NOSTORE, ANYVAL},
    {"vocab_parallel_lm_head", FT_BOOL, NOSTORE, ANYVAL},
    {"replace_with_kernel_inject", FT_BOOL, NOSTORE, ANYVAL},
    {"kernel_inject", FT_BOOL, NOSTORE, ANYVAL},
};
static const field tp_config_fields[] = {
    {"tp_size", FT_INT, NOSTORE, ANYVAL},
    {"tp_grain_size", FT_INT, NOSTORE, ANYVAL},
};
/* utils/config.py: DeepSpeedThroughputTimerConfig, built from timers.throughput. */
static const field timer_fields[] = {
    {"enabled", FT_BOOL, NOSTORE, ANYVAL},
    {"synchronized", FT_BOOL, NOSTORE, ANYVAL},
};

void zt_ds_coerce_model_strings(cJSON *root) {
    zt_ds_coerce_zero_sections(root);
    static const char *const switched[] = {"tensorboard", "csv_monitor", "wandb", "comms_logger",
                                           "hybrid_engine", NULL};
    for (const char *const *k = switched; *k; k++)
        zt_ds_coerce_fields(cJSON_GetObjectItemCaseSensitive(root, *k), switch_fields,
                            NFIELDS(switch_fields));
    zt_ds_coerce_fields(cJSON_GetObjectItemCaseSensitive(root, "comet"), comet_fields,
                        NFIELDS(comet_fields));
    zt_ds_coerce_fields(cJSON_GetObjectItemCaseSensitive(root, "compile"), compile_fields,
                        NFIELDS(compile_fields));
    cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "tensor_parallel");
    zt_ds_coerce_fields(tp, tp_training_fields, NFIELDS(tp_training_fields));
    if (cJSON_IsObject(tp)) {
        zt_ds_coerce_fields(cJSON_GetObjectItemCaseSensitive(tp, "tensor_parallel"),
                            tp_config_fields, NFIELDS(tp_config_fields));
        zt_ds_coerce_fields(cJSON_GetObjectItemCaseSensitive(tp, "tp"), tp_config_fields,
                            NFIELDS(tp_config_fields));
    }
    cJSON *timers = cJSON_GetObjectItemCaseSensitive(root, "timers");
    if (cJSON_IsObject(timers))
        zt_ds_coerce_fields(cJSON_GetObjectItemCaseSensitive(timers, "throughput"), timer_fields,
                            NFIELDS(timer_fields));
}

bool zt_ds_lax_int(const cJSON *v, int *out) {
    double d;
    if (cJSON_IsNumber(v))
        d = v->valuedouble;
    else if (cJSON_IsString(v) && lax_int(v->valuestring, false, &d))
        ;
    else if (cJSON_IsBool(v))
        d = cJSON_IsTrue(v);
    else
        return false;
    if (!(d >= INT_MIN && d <= INT_MAX) || d != (double)(int)d)
        return false;
    *out = (int)d;
    return true;
}
