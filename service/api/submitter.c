/* Who submitted a job, and who may cancel it (submitter.h). */
#include "submitter.h"

#include <stdio.h>
#include <string.h>

const zt_submitter *zt_submitter_of(const zt_auth_caller *who, zt_submitter *out) {
    if (!who->identity[0])
        return NULL;
    memset(out, 0, sizeof *out);
    snprintf(out->identity, sizeof out->identity, "%s", who->identity);
    snprintf(out->scope, sizeof out->scope, "%s", zt_scope_name(who->scope));
    return out;
}

bool zt_submitted_by(const zt_job_info *job, const zt_auth_caller *who, char *text, size_t size) {
    if (who->scope >= ZT_SCOPE_ADMIN)
        return true;
    /* A job without a recorded submitter (from before jobs recorded one) is nobody's: only an
     * admin cancels it. */
    if (who->scope == ZT_SCOPE_SUBMIT && who->identity[0] &&
        strcmp(job->submitter.identity, who->identity) == 0)
        return true;
    snprintf(text, size, "this token's scope is %s; it may cancel only the jobs it submitted, "
             "and jobs/%s was submitted by %s: cancelling it needs admin",
             zt_scope_name(who->scope), job->id, job->submitter.identity[0] ? "another token" : "no recorded token");
    return false;
}

void zt_submitter_refusal(zt_api_error *e, const char *job_id, const char *text) {
    char name[80];
    snprintf(name, sizeof name, "jobs/%.64s", job_id);
    zt_api_error_refusal(e, GRPC_STATUS_PERMISSION_DENIED, "NOT_JOB_SUBMITTER", text);
    zt_api_error_meta(e, "job", name);
    zt_api_error_meta(e, "requiredScope", zt_scope_name(ZT_SCOPE_ADMIN));
}
