/* DeepSpeed's tensor_parallel section (TPTrainingConfig, runtime/tensor_parallel/config.py) for
 * training: autotp_size ranks hold the shards of one model replica. DeepSpeed's training engine
 * reads autotp_size (0 disables it); its nested TPConfig ("tensor_parallel", alias "tp") carries
 * tp_size, which its inference engine and AutoTP parser read: ztrain takes it when autotp_size is
 * 0 and refuses a value that disagrees. The keys' other fates are rows of the key table. */
#include <stdio.h>

#include "ds_config_internal.h"

/* tp_size of the nested TPConfig under either of its names (both at once is ambiguous). */
static zt_status nested_tp_size(const zt_json_obj *sec, int *out, const char **where) {
    *out = 0;
    *where = NULL;
    static const char *const names[] = {"tensor_parallel", "tp"};
    for (int i = 0; i < 2; i++) {
        zt_json_obj o;
        ZT_TRY(zt_json_child(sec, names[i], &o));
        if (!o.obj)
            continue;
        if (*where)
            return zt_json_key_error(ZT_ERR_INVALID, sec, names[i], "and tensor_parallel.%s are "
                                     "the same setting (an alias): give one", *where);
        *where = names[i];
        int v = 1;
        ZT_TRY(zt_json_get_int(&o, "tp_size", &v, NULL));
        if (v < 1)
            return zt_json_key_error(ZT_ERR_INVALID, &o, "tp_size", "must be >= 1, got %d", v);
        *out = v;
    }
    return ZT_OK;
}

/* The config as written (a stored job spec), so its values are read as the parser reads them
 * after zt_ds_coerce_model_strings: "2" is 2. */
int zt_ds_tp_size_of(const cJSON *ds) {
    const cJSON *sec = cJSON_IsObject(ds) ? cJSON_GetObjectItemCaseSensitive(ds, "tensor_parallel")
                                          : NULL;
    int v;
    if (zt_ds_lax_int(cJSON_GetObjectItemCaseSensitive(sec, "autotp_size"), &v) && v > 1)
        return v;
    static const char *const names[] = {"tensor_parallel", "tp"};
    for (int i = 0; i < 2; i++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(sec, names[i]);
        if (zt_ds_lax_int(cJSON_GetObjectItemCaseSensitive(o, "tp_size"), &v) && v > 1)
            return v;
    }
    return 1;
}

zt_status zt_ds_parse_tensor_parallel(zt_ds_config *cfg, const zt_json_obj *top) {
    cfg->tp_size = 1;
    zt_json_obj sec;
    ZT_TRY(zt_json_child(top, "tensor_parallel", &sec));
    if (!sec.obj)
        return ZT_OK;
    int autotp = 0, nested = 0;
    const char *where;
    ZT_TRY(zt_json_get_int(&sec, "autotp_size", &autotp, NULL));
    if (autotp < 0)
        return zt_json_key_error(ZT_ERR_INVALID, &sec, "autotp_size", "must be >= 0, got %d",
                                 autotp);
    ZT_TRY(nested_tp_size(&sec, &nested, &where));
    if (autotp > 1 && nested > 1 && nested != autotp)
        return zt_error(ZT_ERR_INVALID, "%s: tensor_parallel.%s.tp_size %d disagrees with "
                        "tensor_parallel.autotp_size %d", top->source, where, nested, autotp);
    const int tp = autotp > 1 ? autotp : nested > 1 ? nested : 1;
    const char *key = autotp > 1 ? "autotp_size" : "tp_size";
    if (cfg->world_size % tp != 0)
        return zt_error(ZT_ERR_INVALID, "%s: tensor_parallel.%s %d does not divide the job's %d "
                        "ranks per pipeline stage (world_size / pipeline.stages): each "
                        "data-parallel replica is %d tensor-parallel ranks", top->source, key, tp,
                        cfg->world_size, tp);
    cfg->tp_size = tp;
    cfg->world_size /= tp;
    return ZT_OK;
}
