/* The dp × pp × tp grid of ranks and its sub-group communicators (ztrain/tp.h). */
#include <cjson/cJSON.h>

#include "ztrain/ds_config.h"
#include "ztrain/tp.h"

zt_status zt_grid_of(int rank, int world, int stages, int tp, zt_grid *out) {
    if (stages < 1 || tp < 1 || world % (stages * tp) != 0)
        return zt_error(ZT_ERR_INVALID, "grid: %d ranks do not form pipeline.stages %d × a "
                        "data-parallel size × tensor_parallel.autotp_size %d", world, stages, tp);
    zt_grid g = {.stages = stages, .tp = tp, .dp = world / (stages * tp)};
    g.tp_rank = rank % tp;
    g.replica = (rank / tp) % g.dp;
    g.stage = rank / (tp * g.dp);
    *out = g;
    return ZT_OK;
}

zt_status zt_tp_groups_create(zt_tp_groups *out, zt_comm *world, const zt_grid *g) {
    *out = (zt_tp_groups){0};
    int ranks[ZT_MAX_WORLD];
    if (g->tp > 1) {
        for (int t = 0; t < g->tp; t++)
            ranks[t] = zt_grid_rank(g, g->stage, g->replica, t);
        ZT_TRY(zt_comm_create_group(&out->tp, world, ranks, g->tp));
    }
    if (g->dp > 1) {
        for (int r = 0; r < g->dp; r++)
            ranks[r] = zt_grid_rank(g, g->stage, r, g->tp_rank);
        zt_status s = zt_comm_create_group(&out->dp, world, ranks, g->dp);
        if (s != ZT_OK) {
            zt_tp_groups_destroy(out);
            return s;
        }
    }
    return ZT_OK;
}

void zt_tp_groups_destroy(zt_tp_groups *g) {
    zt_comm_destroy(g->dp);
    zt_comm_destroy(g->tp);
    *g = (zt_tp_groups){0};
}

zt_grid zt_grid_of_spec_json(const char *spec_json) {
    cJSON *top = spec_json ? cJSON_Parse(spec_json) : NULL;
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(top, "world_size");
    const cJSON *pipe = cJSON_GetObjectItemCaseSensitive(top, "pipeline");
    const cJSON *stages = cJSON_GetObjectItemCaseSensitive(pipe, "stages");
    int world = cJSON_IsNumber(ws) && ws->valuedouble >= 1 ? (int)ws->valuedouble : 1;
    int pp = cJSON_IsNumber(stages) && stages->valuedouble > 1 ? (int)stages->valuedouble : 1;
    int tp = zt_ds_tp_size_of(cJSON_GetObjectItemCaseSensitive(top, "deepspeed"));
    cJSON_Delete(top);
    if (world % (pp * tp) != 0)
        pp = tp = 1;
    return (zt_grid){.dp = world / (pp * tp), .stages = pp, .tp = tp};
}

zt_grid zt_grid_at(const zt_grid *g, int rank) {
    zt_grid out = *g;
    /* A grid never set (all zero) is a world of data-parallel ranks. */
    const int tp = g->tp > 0 ? g->tp : 1, dp = g->dp > 0 ? g->dp : rank + 1;
    out.tp_rank = rank % tp;
    out.replica = (rank / tp) % dp;
    out.stage = rank / (tp * dp);
    return out;
}
