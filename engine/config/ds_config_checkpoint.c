/* The values of the checkpoint section that DeepSpeed 0.19 checks while it reads the config
 * (runtime/config.py get_checkpoint_tag_validation_mode and get_checkpoint_parallel_write_pipeline,
 * model_checkpointing/config.py get_checkpoint_config). ztrain writes its own checkpoints and only
 * warns that these keys have no effect, but a value DeepSpeed refuses is refused here as well, so
 * a config ztrain runs is one DeepSpeed would run too. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "ds_config_internal.h"

/* Whether Python's name.upper() is one of `allowed` (upper case), for ASCII names. */
static bool upper_in(const char *name, const char *const *allowed) {
    for (const char *const *k = allowed; *k; k++)
        if (strcasecmp(name, *k) == 0)
            return true;
    return false;
}

/* The value under key as written, JSON null included (zt_json_item reads null as absent, but
 * DeepSpeed's dict.get hands None on, and .upper() or the `in` test fails on it). */
static const cJSON *raw_item(const zt_json_obj *o, const char *key) {
    return o->obj ? cJSON_GetObjectItemCaseSensitive(o->obj, key) : NULL;
}

/* A name DeepSpeed upper-cases and looks up in `allowed` (upper case; printed as Python prints
 * the list). A non-string fails in DeepSpeed at .upper(); null is skipped where DeepSpeed's
 * validator skips None (`null_ok`). */
static zt_status check_name(const zt_json_obj *o, const char *key, const char *const *allowed,
                            bool null_ok, const char *list) {
    const cJSON *v = raw_item(o, key);
    if (!v || (null_ok && cJSON_IsNull(v)))
        return ZT_OK;
    char got[64];
    zt_json_repr(v, got, sizeof got);
    if (!cJSON_IsString(v))
        return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be one of %s (any case), got %s "
                                 "(DeepSpeed fails calling .upper() on it)", list, got);
    if (upper_in(v->valuestring, allowed))
        return ZT_OK;
    return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be one of %s (any case), got %s",
                             list, got);
}

/* pipeline_stage is tested with `value in [True, False]`, which also holds for 1, 0, 1.0 and
 * 0.0, Python's numbers equal to the two bools. (A null parallel_write is zt_ds_check_nulls'.) */
static zt_status check_parallel_write(const zt_json_obj *ckpt) {
    zt_json_obj pw;
    ZT_TRY(zt_json_child(ckpt, "parallel_write", &pw));
    const cJSON *v = raw_item(&pw, "pipeline_stage");
    if (!v || cJSON_IsBool(v) || (cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1)))
        return ZT_OK;
    char got[64];
    zt_json_repr(v, got, sizeof got);
    return zt_json_key_error(ZT_ERR_INVALID, &pw, "pipeline_stage", "must be true or false, got "
                             "%s (DeepSpeed: checkpoint::parallel_write::pipeline_stage value "
                             "is invalid)", got);
}

zt_status zt_ds_check_checkpoint(const zt_json_obj *top) {
    static const char *const modes[] = {"WARN", "IGNORE", "FAIL", NULL};
    static const char *const writers[] = {"MOCK", "PYTHON", "FAST", NULL};
    static const char *const units[] = {"REPLICA", "SOCKET", "MACHINE", NULL};
    zt_json_obj ckpt, writer;
    ZT_TRY(zt_json_child(top, "checkpoint", &ckpt));
    if (!ckpt.obj)
        return ZT_OK;
    ZT_TRY(check_name(&ckpt, "tag_validation", modes, false, "'WARN', 'IGNORE', 'FAIL'"));
    ZT_TRY(check_parallel_write(&ckpt));
    /* A null writer is DeepSpeed's default (no writer); inside one, a null value is skipped. */
    if (cJSON_IsNull(raw_item(&ckpt, "writer")))
        return ZT_OK;
    ZT_TRY(zt_json_child(&ckpt, "writer", &writer));
    ZT_TRY(check_name(&writer, "type", writers, true, "'MOCK', 'PYTHON', 'FAST'"));
    return check_name(&writer, "data_parallel", units, true, "'REPLICA', 'SOCKET', 'MACHINE'");
}
