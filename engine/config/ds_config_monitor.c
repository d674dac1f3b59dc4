/* The DeepSpeed monitor sections (deepspeed/monitor/config.py): "tensorboard" and "csv_monitor"
 * are honoured (monitor.c writes what DeepSpeed's engine writes, where it writes it); "wandb" and
 * "comet" are validated and, when enabled, warned about: a rank has no network to send to, and
 * the same metrics are in metrics.jsonl and on ztraind's HTTP API. Each section is a pydantic
 * model with extra="forbid", so an unknown key is an error, and its types are checked. */
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

zt_status zt_ds_parse_monitor(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_monitor_config *m = &cfg->monitor;
    ZT_TRY(parse_output(top, "tensorboard", &m->tensorboard));
    ZT_TRY(parse_output(top, "csv_monitor", &m->csv));
    ZT_TRY(parse_wandb(cfg, top));
    ZT_TRY(parse_comet(cfg, top));
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
