/* The job spec's "max_restarts" and "fork_from" (job_spec_recovery.h). The engine only checks
 * and keeps them: restarting ranks and preparing a fork's checkpoint are ztraind's work
 * (service/daemon/job_recovery.c, service/daemon/job_fork.c). */
#include "job_keys.h"
#include "job_spec_recovery.h"

#include <string.h>

const char *const zt_job_fork_keys[] = {"job", "step", NULL};

zt_status zt_job_spec_parse_recovery(zt_job_spec *job, const zt_json_obj *top) {
    bool found;
    ZT_TRY(zt_json_get_int(top, "max_restarts", &job->max_restarts, &found));
    if (found && (job->max_restarts < 0 || job->max_restarts > ZT_MAX_RESTARTS))
        return zt_json_key_error(ZT_ERR_INVALID, top, "max_restarts",
                                 "must be between 0 and %d, got %d", ZT_MAX_RESTARTS,
                                 job->max_restarts);
    zt_json_obj f;
    ZT_TRY(zt_json_child(top, "fork_from", &f));
    if (!f.obj)
        return ZT_OK;
    ZT_TRY(zt_job_keys_check(&f, "fork_from"));
    ZT_TRY(zt_json_require(&f, "job"));
    ZT_TRY(zt_json_require(&f, "step"));
    const char *id = NULL;
    ZT_TRY(zt_json_get_string(&f, "job", &id, NULL));
    if (!id || !id[0])
        return zt_json_key_error(ZT_ERR_INVALID, &f, "job", "must name a job (\"job-000042\")");
    ZT_TRY(zt_json_get_int64(&f, "step", &job->fork_step, NULL));
    if (job->fork_step < 0)
        return zt_json_key_error(ZT_ERR_INVALID, &f, "step", "must be >= 0, got %lld",
                                 (long long)job->fork_step);
    job->fork_job = zt_json_strdup(id);
    return job->fork_job ? ZT_OK : zt_error(ZT_ERR_NOMEM, "out of memory reading fork_from");
}
