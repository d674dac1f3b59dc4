/* A pipeline stage's part of the model: the layer list with each layer's parameter count, cut by
 * DeepSpeed's partition methods (ztrain/pipeline.h), and the stage of the model a rank builds. */
#include <stdio.h>
#include <strings.h>

#include "pipe_layers.h"

/* Trainable parameters of the stage `st` of spec's model, counted on a model built for one
 * sequence (the counts do not depend on the batch). */
static zt_status stage_params(const zt_model_spec *spec, zt_backend *be, zt_model_stage st,
                              size_t *out) {
    zt_model *m;
    st.buffers = 1;
    ZT_TRY(zt_model_create_stage(&m, spec, be, ZT_F32, 1, 1, &st));
    *out = m->n_params;
    zt_model_destroy(m);
    return ZT_OK;
}

/* The layer list's types, which every family offers alike; the parameter counts left 0. */
static void layer_types(int n_layer, zt_pipe_layer *layers) {
    layers[0] = (zt_pipe_layer){"embed", 0};
    for (int i = 0; i < n_layer; i++)
        layers[1 + i] = (zt_pipe_layer){"block", 0};
    layers[n_layer + 1] = (zt_pipe_layer){"head", 0};
}

zt_status zt_pipe_model_layers(const zt_model_spec *spec, zt_device device,
                               zt_pipe_layer *layers) {
    const int L = spec->n_layer;
    zt_backend *be;
    zt_backend_options bo = {.threads = 1};
    ZT_TRY(zt_backend_create(&be, device, &bo));
    size_t embed = 0, block = 0, head = 0;
    zt_status s = stage_params(spec, be, (zt_model_stage){0, 0, true, false, 1, 1, 0}, &embed);
    /* Every block of a family has the same tensors. */
    if (s == ZT_OK && L > 0)
        s = stage_params(spec, be, (zt_model_stage){0, 1, false, false, 1, 1, 0}, &block);
    if (s == ZT_OK)
        s = stage_params(spec, be, (zt_model_stage){L, L, false, true, 1, 1, 0}, &head);
    zt_backend_destroy(be);
    ZT_TRY(s);
    layer_types(L, layers);
    layers[0].params = embed;
    for (int i = 0; i < L; i++)
        layers[1 + i].params = block;
    layers[L + 1].params = head;
    return ZT_OK;
}

/* Stage `stage`'s part of the model under the partition bounds of layers[n_layer + 2]. */
static zt_status stage_of(const zt_job_spec *job, const int *bounds, int stage,
                          zt_model_stage *out) {
    const int L = job->model.n_layer, stages = job->pipeline.stages;
    /* Layer i of the list is block i - 1; the stage's blocks are those its range holds. */
    int lo = bounds[stage], hi = bounds[stage + 1];
    int first = lo < 1 ? 0 : lo - 1 > L ? L : lo - 1;
    int last = hi - 1 < 0 ? 0 : hi - 1 > L ? L : hi - 1;
    *out = (zt_model_stage){first, last < first ? first : last, stage == 0, stage == stages - 1,
                            1, 1, 0};
    if (out->first_layer == out->last_layer && !out->embed && !out->head)
        return zt_error(ZT_ERR_INVALID,
                        "pipeline.partition \"%s\": stage %d of %d gets no transformer block "
                        "(layers [%d, %d) of embed, %d blocks, head)",
                        job->pipeline.partition, stage, stages, lo, hi, L);
    return ZT_OK;
}

/* The partition's bounds[stages + 1] over the model's layer list, measured once. */
static zt_status cut(const zt_job_spec *job, zt_device device, int *bounds) {
    const int n = job->model.n_layer + 2;
    zt_pipe_layer layers[n];
    ZT_TRY(zt_pipe_model_layers(&job->model, device, layers));
    return zt_pipe_partition(job->pipeline.partition, layers, n, job->pipeline.stages, bounds);
}

zt_status zt_pipe_stage_plan(const zt_job_spec *job, zt_device device, int stage,
                             zt_model_stage *out) {
    int bounds[job->pipeline.stages + 1];
    ZT_TRY(cut(job, device, bounds));
    return stage_of(job, bounds, stage, out);
}

zt_status zt_pipe_stage_plans(const zt_job_spec *job, zt_device device, zt_model_stage *out) {
    int bounds[job->pipeline.stages + 1];
    ZT_TRY(cut(job, device, bounds));
    for (int s = 0; s < job->pipeline.stages; s++)
        ZT_TRY(stage_of(job, bounds, s, &out[s]));
    return ZT_OK;
}

zt_status zt_pipe_check_partition(const zt_job_spec *job) {
    /* "parameters" and "uniform" give each of at most n_layer + 2 stages a layer of its own and
     * every middle stage a block; only a type:REGEX partition, which needs no parameter counts,
     * can fail. */
    if (job->pipeline.stages <= 1 || strncasecmp(job->pipeline.partition, "type:", 5) != 0)
        return ZT_OK;
    const int n = job->model.n_layer + 2;
    zt_pipe_layer layers[n];
    int bounds[job->pipeline.stages + 1];
    layer_types(job->model.n_layer, layers);
    ZT_TRY(zt_pipe_partition(job->pipeline.partition, layers, n, job->pipeline.stages, bounds));
    for (int s = 0; s < job->pipeline.stages; s++) {
        zt_model_stage st;
        ZT_TRY(stage_of(job, bounds, s, &st));
    }
    return ZT_OK;
}
