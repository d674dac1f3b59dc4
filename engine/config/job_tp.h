/* Tensor parallelism's checks of a parsed job (internal to the job-spec parser). */
#ifndef ZTRAIN_CONFIG_JOB_TP_H
#define ZTRAIN_CONFIG_JOB_TP_H

#include "ztrain/job_spec.h"

/* With job->ds.tp_size > 1: the model's heads, kv heads, MLP width and vocabulary divisible by
 * it (ZT_ERR_INVALID naming the field), and ZT_ERR_UNSUPPORTED naming the first setting that
 * sharded models do not support yet. ZT_OK without tensor parallelism. */
zt_status zt_job_check_tp(const zt_job_spec *job, const char *source);

#endif
