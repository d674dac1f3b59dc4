/* The switches of DeepSpeed features ztrain does not have (the flops profiler, autotuning, the
 * hybrid engine, DeepCompile, ...): refused, naming the key, whenever DeepSpeed would turn the
 * feature on, and read exactly as DeepSpeed reads each one, since that differs by section:
 *   - a pydantic model's bool (comms_logger, hybrid_engine, compile): converted beforehand by
 *     zt_ds_coerce_model_strings, so 1, "yes" and "on" are on; what is left that is not a bool,
 *     pydantic refuses;
 *   - the value itself, fetched with dict.get and tested for truth later (autotuning,
 *     torch_autocast, expert_parallel): 1, "no" and [0] are on, 0, "", [] and {} off;
 *   - flops_profiler.enabled, which DeepSpeed ORs into a bool (`wall_clock_breakdown |
 *     enabled`): a bool or an integer, anything else fails there;
 *   - datastates_ckpt, on when present and not false.
 * comms_logger is judged by its "enabled", as its model reads it, although DeepSpeed 0.19's
 * logger itself starts whenever the section is present (utils/comms_logging.py configure() tests
 * the presence): refusing every config that says "enabled": false would follow a slip of
 * DeepSpeed's rather than what the config says. */
#include <stdio.h>

#include "ds_config_internal.h"

typedef enum { AS_PYDANTIC_BOOL, AS_TRUTH, AS_BOOL_OR_INT } switch_reading;

static zt_status refuse_type(const zt_json_obj *top, const char *field, const char *got,
                             const char *how) {
    return zt_error_field(zt_error(ZT_ERR_INVALID, "%s: key '%s' must be true or false (%s), "
                                   "got %s", top->source, field, how, got),
                          field);
}

static zt_status check_switch(const zt_json_obj *top, const char *section, const char *key,
                              switch_reading reading) {
    const cJSON *sec = zt_json_item(top, section);
    const cJSON *v = cJSON_IsObject(sec) ? cJSON_GetObjectItemCaseSensitive(sec, key) : NULL;
    if (!v || cJSON_IsFalse(v))
        return ZT_OK;
    char got[64], field[128];
    zt_json_repr(v, got, sizeof got);
    snprintf(field, sizeof field, "%s.%s", section, key);
    if (reading == AS_PYDANTIC_BOOL && !cJSON_IsBool(v))
        return refuse_type(top, field, got, "DeepSpeed's pydantic model also takes 1/0, "
                           "\"yes\"/\"no\" and \"on\"/\"off\"");
    if (reading == AS_BOOL_OR_INT && !cJSON_IsBool(v) &&
        !(cJSON_IsNumber(v) && v->valuedouble == (double)(long long)v->valuedouble))
        return refuse_type(top, field, got, "DeepSpeed ORs it into a bool, and fails on "
                           "anything but a bool or an integer");
    if (!zt_json_truthy(v))
        return ZT_OK;
    const bool b = cJSON_IsBool(v);
    return zt_error_field(zt_error(ZT_ERR_UNSUPPORTED, "%s: %s is not supported by ztrain%s%s%s",
                                   top->source, field, b ? "" : " (DeepSpeed takes ",
                                   b ? "" : got, b ? "" : " as true)"),
                          field);
}

zt_status zt_ds_check_switches(const zt_json_obj *top) {
    static const struct {
        const char *section, *key;
        switch_reading reading;
    } switches[] = {
        {"flops_profiler", "enabled", AS_BOOL_OR_INT}, {"comms_logger", "enabled", AS_PYDANTIC_BOOL},
        {"autotuning", "enabled", AS_TRUTH},           {"hybrid_engine", "enabled", AS_PYDANTIC_BOOL},
        {"torch_autocast", "enabled", AS_TRUTH},       {"expert_parallel", "enabled", AS_TRUTH},
        {"compile", "deepcompile", AS_PYDANTIC_BOOL},
    };
    for (size_t i = 0; i < sizeof switches / sizeof switches[0]; i++)
        ZT_TRY(check_switch(top, switches[i].section, switches[i].key, switches[i].reading));
    const cJSON *datastates = zt_json_item(top, "datastates_ckpt");
    if (datastates && !cJSON_IsFalse(datastates))
        return zt_error_field(
            zt_error(ZT_ERR_UNSUPPORTED, "%s: datastates_ckpt is not supported by ztrain "
                     "(DeepSpeed turns DataStates checkpointing on for any value but false)",
                     top->source),
            "datastates_ckpt");
    return ZT_OK;
}
