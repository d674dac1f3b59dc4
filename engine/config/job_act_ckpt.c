/* Activation checkpointing as a job asks for it: the switch in "train", Hugging Face's
 * gradient_checkpointing, and where the DeepSpeed config puts the kept inputs (job_act_ckpt.h). */
#include <stdio.h>
#include <string.h>

#include "job_act_ckpt.h"

/* Appends one warning line, as the DeepSpeed config parser words them, unless the buffer is
 * full. */
static void add_warning(zt_ds_config *ds, const char *line) {
    size_t used = strlen(ds->warnings);
    snprintf(ds->warnings + used, sizeof ds->warnings - used, "%s\n", line);
}

zt_status zt_job_activation_checkpointing(zt_job_spec *job, const zt_json_obj *top) {
    const bool on = job->train.activation_checkpointing || job->args.gradient_checkpointing;
    zt_json_obj train;
    ZT_TRY(zt_json_child(top, "train", &train));
    if (!on && train.obj && zt_json_item(&train, "activation_checkpoint_interval"))
        return zt_error(ZT_ERR_INVALID, "%s: train.activation_checkpoint_interval is %d but "
                        "activation checkpointing is off (set train.activation_checkpointing or "
                        "training_args.gradient_checkpointing to true)", top->source,
                        job->train.activation_checkpoint_interval);
    job->train.activation_checkpointing = on;
    job->model.checkpoint_interval = on ? job->train.activation_checkpoint_interval : 0;
    /* A pipeline's stages also checkpoint their blocks when pipeline.activation_checkpoint_interval
     * is above 0 (pipe_engine.c puts it in their model spec), the train section's switch or not;
     * their kept inputs go where cpu_checkpointing says, as without a pipeline. */
    const bool pipe_on =
        job->pipeline.stages > 1 && job->pipeline.activation_checkpoint_interval > 0;
    job->model.checkpoint_cpu = (on || pipe_on) && job->ds.cpu_checkpointing;
    if (job->ds.cpu_checkpointing && !on && !pipe_on) {
        char line[512];
        snprintf(line, sizeof line, "ztrain: warning: %s: activation_checkpointing."
                 "cpu_checkpointing has no effect: the job does not checkpoint activations (set "
                 "train.activation_checkpointing to true, or in a pipelined job "
                 "pipeline.activation_checkpoint_interval above 0)", top->source);
        add_warning(&job->ds, line);
    }
    return ZT_OK;
}
