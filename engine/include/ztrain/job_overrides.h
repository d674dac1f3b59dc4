/* Command-line overrides of a job file: `--set key.path=value` on `ztrain run`, `submit` and
 * `validate`, and on the ztrain-worker processes `ztrain run` starts (which must read the same
 * job as the process that validated it).
 *
 * A path is dotted object keys from the job's root ("train.max_steps",
 * "deepspeed.zero_optimization.stage"); objects on the way that are missing are made. The value
 * is JSON when it parses as JSON (30, true, null, [0.9, 0.95], {"stage": 2}), else the text as a
 * string (`name=my-run`). When the path goes into "deepspeed" and the job gives it as a file's
 * path, that file (relative to the job file's directory) is read and inlined first, so a config
 * file's key can be overridden without editing it. A path that crosses a value that is not an
 * object, an empty key, or a missing '=' is ZT_ERR_INVALID naming the override. */
#ifndef ZTRAIN_JOB_OVERRIDES_H
#define ZTRAIN_JOB_OVERRIDES_H

#include <stddef.h>

#include "ztrain/job_spec.h"
#include "ztrain/status.h"

/* Applies `n` overrides ("key.path=value") in order to the job JSON `text` (named `source` in
 * messages; `base_dir` anchors a "deepspeed" file path) and returns the new JSON text in *out,
 * heap-owned by the caller. With n == 0 *out is a copy of text. */
zt_status zt_job_overrides_apply(const char *text, const char *source, const char *base_dir,
                                 const char *const *sets, size_t n, char **out);

/* Reads a job file, applies the overrides and parses the result as zt_job_spec_load does (paths
 * relative to the file's directory). */
zt_status zt_job_overrides_load(zt_job_spec *job, const char *path,
                                const char *const *sets, size_t n);

#endif
