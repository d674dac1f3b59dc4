/* The job spec's "pipeline" section: DeepSpeed's PipelineModule settings (num_stages,
 * partition_method, activation_checkpoint_interval). The data-parallel size of a pipelined job
 * is world_size / stages, and its micro-batches per step are gradient_accumulation_steps. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "job_keys.h"
#include "job_pipeline.h"

const char *const zt_job_pipeline_keys[] = {"stages", "partition",
                                            "activation_checkpoint_interval", NULL};

zt_status zt_job_parse_pipeline(zt_job_spec *job, const zt_json_obj *top) {
    zt_pipe_spec *p = &job->pipeline;
    *p = (zt_pipe_spec){.stages = 1, .activation_checkpoint_interval = 0};
    snprintf(p->partition, sizeof p->partition, "parameters");
    zt_json_obj o;
    ZT_TRY(zt_json_child(top, "pipeline", &o));
    if (!o.obj)
        return ZT_OK;
    ZT_TRY(zt_job_keys_check(&o, "pipeline"));
    ZT_TRY(zt_json_require(&o, "stages"));
    ZT_TRY(zt_json_get_int(&o, "stages", &p->stages, NULL));
    if (p->stages < 1)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "stages", "must be >= 1, got %d", p->stages);
    if (job->world_size % p->stages != 0)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "stages",
                                 "(%d) must divide world_size (%d): every stage has world_size / "
                                 "stages data-parallel replicas",
                                 p->stages, job->world_size);
    /* Every family offers the partition its embedding, its n_layer blocks and its head
     * (pipe_layers.c). As in DeepSpeed, a stage may get the embedding or the head alone (6 stages
     * on 4 blocks); past n_layer + 2 stages a stage would get no layer at all, which DeepSpeed's
     * partition_uniform leaves empty and ztrain refuses here, before any rank starts. */
    const int layers = job->model.n_layer + 2;
    if (p->stages > layers)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "stages",
                                 "(%d) is more than the %d layers the model offers to cut (the "
                                 "embedding, %d blocks, the head): a stage would get none",
                                 p->stages, layers, job->model.n_layer);
    const char *method = NULL;
    ZT_TRY(zt_json_get_string(&o, "partition", &method, NULL));
    if (method) {
        bool known = strcasecmp(method, "parameters") == 0 || strcasecmp(method, "uniform") == 0 ||
                     strncasecmp(method, "type:", 5) == 0;
        if (!known || strlen(method) >= sizeof p->partition)
            return zt_json_key_error(ZT_ERR_INVALID, &o, "partition",
                                     "must be \"parameters\", \"uniform\" or \"type:REGEX\" "
                                     "(at most %zu bytes), got \"%s\"",
                                     sizeof p->partition - 1, method);
        snprintf(p->partition, sizeof p->partition, "%s", method);
    }
    ZT_TRY(zt_json_get_int(&o, "activation_checkpoint_interval",
                           &p->activation_checkpoint_interval, NULL));
    if (p->activation_checkpoint_interval < 0)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "activation_checkpoint_interval",
                                 "must be >= 0, got %d", p->activation_checkpoint_interval);
    return ZT_OK;
}

zt_status zt_job_check_pipeline(const zt_job_spec *job, const char *source) {
    if (job->pipeline.stages <= 1)
        return ZT_OK;
    /* DeepSpeed's PipelineEngine asserts this in its constructor, with this message. */
    if (job->ds.zero.stage >= 2)
        return zt_error(ZT_ERR_UNSUPPORTED,
                        "%s: deepspeed: zero_optimization.stage %d with pipeline.stages %d: "
                        "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
                        source, job->ds.zero.stage, job->pipeline.stages);
    /* The anomaly gate judges a step from every rank's micro-batch losses, which a pipeline's
     * middle stages do not have; ztraind's stall watch needs nothing from the ranks. */
    for (int k = 0; k < ZT_ANOMALY_KINDS; k++) {
        const zt_anomaly_rule *r = &job->events.rule[k];
        bool plain_nonfinite = k == ZT_ANOMALY_NONFINITE && r->policy == ZT_POLICY_RECORD;
        if (r->enabled && k != ZT_ANOMALY_STALL && !plain_nonfinite)
            return zt_error(ZT_ERR_UNSUPPORTED,
                            "%s: events.%s: anomaly rules other than stall are not applied to "
                            "pipelined jobs yet (pipeline.stages %d)",
                            source, zt_anomaly_kind_name((zt_anomaly_kind)k),
                            job->pipeline.stages);
    }
    return ZT_OK;
}
