/* The job spec's "pipeline" section (engine/config/job_pipeline.c), read by job_spec.c: internal to the
 * engine. */
#ifndef ZTRAIN_JOB_PIPELINE_H
#define ZTRAIN_JOB_PIPELINE_H

#include "ztrain/json_util.h"
#include "ztrain/job_spec.h"

/* Reads top's "pipeline" into job->pipeline (stages 1 when absent), after world_size: stages
 * must divide it. Errors name the key ("job.json: key 'pipeline.stages' ..."). */
/* The keys of "pipeline", NULL-terminated. */
extern const char *const zt_job_pipeline_keys[];

zt_status zt_job_parse_pipeline(zt_job_spec *job, const zt_json_obj *top);

/* After the DeepSpeed config is read: what a pipelined job refuses in it (ZeRO 2 and 3, with
 * DeepSpeed's message). */
zt_status zt_job_check_pipeline(const zt_job_spec *job, const char *source);

#endif
