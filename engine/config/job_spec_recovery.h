/* The job spec's keys for ztraind's recovery and forks, "max_restarts" and "fork_from"
 * (ztrain/job_spec.h says what they mean). Internal: job_spec.c reads them through it. */
#ifndef ZTRAIN_JOB_SPEC_RECOVERY_H
#define ZTRAIN_JOB_SPEC_RECOVERY_H

#include "ztrain/json_util.h"
#include "ztrain/job_spec.h"

/* The most restarts a spec may ask for: a job that failed this often has a fault no restart
 * mends, and its attempts are kept, one row each, for as long as the job. */
#define ZT_MAX_RESTARTS 100

/* The keys of "fork_from", NULL-terminated. */
extern const char *const zt_job_fork_keys[];

/* Reads max_restarts (0..ZT_MAX_RESTARTS) and fork_from ({"job": "job-NNNNNN", "step": N >= 0},
 * both required, nothing else) from the spec's top object into job. Errors name the key. */
zt_status zt_job_spec_parse_recovery(zt_job_spec *job, const zt_json_obj *top);

#endif
