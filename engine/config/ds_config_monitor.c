/* The DeepSpeed monitor sections (deepspeed/monitor/config.py): "tensorboard" and "csv_monitor"
 * are honoured (monitor.c writes what DeepSpeed's engine writes, where it writes it); "wandb" and
 * "comet" are validated and, when enabled, warned about: a rank has no network to send to, and
 * the same metrics are in metrics.jsonl and on ztraind's HTTP API. Each section is a pydantic
 * model with extra="forbid", so an unknown key is an error, and its types are checked. "timers"
 * has no effect (ztrain always times its steps) and is only checked as DeepSpeed reads it. */
#include <stdio.h>
#include <string.h>

#include "ds_config_internal.h"

/* A key that must be a string or JSON null (pydantic's Optional[str]). */
static zt_status check_string(const zt_json_obj *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o->obj, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsString(v))
        return ZT_OK;
    char got[64];
    zt_json_repr(v, got, sizeof got);
    return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be a string, got %s", got);
}

/* os.path.join(output_path, job_name): an absolute job_name replaces the path, an empty path
 * leaves job_name alone, and a separator is added only where the path lacks one. */
static zt_status join_dir(const zt_json_obj *o, const char *output_path, const char *job_name,
                          char *out, size_t size) {
    int n;
    if (job_name[0] == '/' || !output_path[0])
        n = snprintf(out, size, "%s", job_name);
    else
        n = snprintf(out, size, "%s%s%s", output_path,
                     output_path[strlen(output_path) - 1] == '/' ? "" : "/", job_name);
    if (n < 0 || (size_t)n >= size)
        return zt_error(ZT_ERR_INVALID, "%s: %s: output_path/job_name is longer than %zu bytes",
                        o->source, o->path, size - 1);
    return ZT_OK;
}

/* tensorboard and csv_monitor: enabled, output_path (""), job_name ("DeepSpeedJobName"). */
static zt_status parse_output(const zt_json_obj *top, const char *key, zt_monitor_output *out) {
    zt_json_obj o;
    ZT_TRY(zt_json_child(top, key, &o));
    if (!o.obj)
        return ZT_OK;
    static const char *const keys[] = {"enabled", "output_path", "job_name", NULL};
    ZT_TRY(zt_json_check_keys(&o, keys));
    const char *output_path = "", *job_name = "DeepSpeedJobName";
    ZT_TRY(zt_json_get_bool(&o, "enabled", &out->enabled, NULL));
    ZT_TRY(zt_json_get_string(&o, "output_path", &output_path, NULL));
    ZT_TRY(zt_json_get_string(&o, "job_name", &job_name, NULL));
    return join_dir(&o, output_path, job_name, out->dir, sizeof out->dir);
}

static zt_status parse_wandb(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_json_obj o;
    ZT_TRY(zt_json_child(top, "wandb", &o));
    if (!o.obj)
        return ZT_OK;
    static const char *const keys[] = {"enabled", "group", "team", "project", NULL};
    ZT_TRY(zt_json_check_keys(&o, keys));
    ZT_TRY(zt_json_get_bool(&o, "enabled", &cfg->monitor.wandb, NULL));
    for (const char *const *k = keys + 1; *k; k++)
        ZT_TRY(check_string(&o, *k));
    return ZT_OK;
}

static zt_status parse_comet(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_json_obj o;
    ZT_TRY(zt_json_child(top, "comet", &o));
    if (!o.obj)
        return ZT_OK;
    static const char *const keys[] = {"enabled", "samples_log_interval", "project", "workspace",
                                       "api_key", "experiment_name", "experiment_key", "online",
                                       "mode", NULL};
    static const char *const strings[] = {"project", "workspace", "api_key", "experiment_name",
                                          "experiment_key", "mode", NULL};
    ZT_TRY(zt_json_check_keys(&o, keys));
    int interval;
    bool online;
    ZT_TRY(zt_json_get_bool(&o, "enabled", &cfg->monitor.comet, NULL));
    ZT_TRY(zt_json_get_int(&o, "samples_log_interval", &interval, NULL));
    ZT_TRY(zt_json_get_bool(&o, "online", &online, NULL));
    for (const char *const *k = strings; *k; k++)
        ZT_TRY(check_string(&o, *k));
    return ZT_OK;
}

/* The keys of "timers" draw the key table's warnings; what DeepSpeed 0.19 fails on is refused here,
 * read as its get_timers_config reads it (utils/config.py): `"throughput" in timers` (a number
 * fails, a string or a list is searched and, holding "throughput", fails on the subscript), then
 * DeepSpeedThroughputTimerConfig(**timers["throughput"]), a pydantic model of two bools that
 * zt_ds_coerce_model_strings has converted beforehand, so what is left that is not a bool
 * (null included) pydantic refuses. Its unknown keys are refused by the key table. */
static bool holds_throughput(const cJSON *timers) {
    if (cJSON_IsString(timers))
        return strstr(timers->valuestring, "throughput") != NULL;
    for (const cJSON *c = cJSON_IsArray(timers) ? timers->child : NULL; c; c = c->next)
        if (cJSON_IsString(c) && strcmp(c->valuestring, "throughput") == 0)
            return true;
    return false;
}

static zt_status check_timers(const zt_json_obj *top) {
    const cJSON *timers = zt_json_item(top, "timers");
    if (!timers)
        return ZT_OK; /* null is zt_ds_check_nulls' */
    char got[64];
    zt_json_repr(timers, got, sizeof got);
    if (cJSON_IsNumber(timers) || cJSON_IsBool(timers) || holds_throughput(timers))
        return zt_ds_fail(ZT_ERR_INVALID, top, "timers", "%s: key 'timers' must be an object "
                          "such as {\"throughput\": {\"enabled\": true}}, got %s (DeepSpeed "
                          "fails looking \"throughput\" up in it)", top->source, got);
    if (!cJSON_IsObject(timers))
        return ZT_OK; /* a string or list without "throughput": DeepSpeed ignores it, as ztrain */
    zt_json_obj t;
    zt_json_obj_init(&t, timers, top->source, "timers");
    const cJSON *thr = cJSON_GetObjectItemCaseSensitive(timers, "throughput");
    if (!thr)
        return ZT_OK;
    zt_json_repr(thr, got, sizeof got);
    if (!cJSON_IsObject(thr))
        return zt_ds_fail(ZT_ERR_INVALID, &t, "throughput", "%s: key 'timers.throughput' must be "
                          "an object, got %s (DeepSpeed passes it by ** to "
                          "DeepSpeedThroughputTimerConfig, which needs a mapping)", top->source, got);
    zt_json_obj o;
    zt_json_obj_init(&o, thr, top->source, "timers.throughput");
    static const char *const bools[] = {"enabled", "synchronized"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(thr, bools[i]);
        if (!v || cJSON_IsBool(v))
            continue;
        zt_json_repr(v, got, sizeof got);
        return zt_ds_fail(ZT_ERR_INVALID, &o, bools[i], "%s: key 'timers.throughput.%s' must be "
                          "true or false (DeepSpeed's pydantic model also takes 1/0, \"yes\"/"
                          "\"no\" and \"on\"/\"off\"), got %s", top->source, bools[i], got);
    }
    return ZT_OK;
}

zt_status zt_ds_parse_monitor(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_monitor_config *m = &cfg->monitor;
    ZT_TRY(parse_output(top, "tensorboard", &m->tensorboard));
    ZT_TRY(parse_output(top, "csv_monitor", &m->csv));
    ZT_TRY(parse_wandb(cfg, top));
    ZT_TRY(parse_comet(cfg, top));
    ZT_TRY(check_timers(top));
    if (m->wandb)
        zt_ds_warn(top->source, "wandb.enabled: nothing is sent to Weights & Biases (ztrain's ranks "
                   "have no network); the same metrics are in the run's metrics.jsonl and on "
                   "ztraind's HTTP API (GET /api/v1/jobs/{id}/metrics) and dashboard");
    if (m->comet)
        zt_ds_warn(top->source, "comet.enabled: nothing is sent to Comet (ztrain's ranks have no "
                   "network); the same metrics are in the run's metrics.jsonl and on ztraind's "
                   "HTTP API (GET /api/v1/jobs/{id}/metrics) and dashboard");
    return ZT_OK;
}
