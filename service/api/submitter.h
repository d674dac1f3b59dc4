/* Who submitted a job, and who may cancel it: a token of scope submit cancels only the jobs it
 * submitted, an admin token any job (auth.h). Both front ends (gRPC and HTTP) ask here, so that
 * they decide and word it alike. */
#ifndef ZTRAIN_SUBMITTER_H
#define ZTRAIN_SUBMITTER_H

#include <stdbool.h>
#include <stddef.h>

#include "api_error.h"
#include "auth.h"
#include "daemon/job_manager.h"

/* The submitter a job of this caller records: *out filled and returned, or NULL when the caller
 * has no identity (the server takes no tokens). */
const zt_submitter *zt_submitter_of(const zt_auth_caller *who, zt_submitter *out);

/* Whether the caller may cancel `job`: an admin always, a submit token when it submitted the
 * job. When not, text (size bytes) says why, naming the job, the caller's scope and the one
 * needed. */
bool zt_submitted_by(const zt_job_info *job, const zt_auth_caller *who, char *text, size_t size);

/* The PERMISSION_DENIED of such a refusal, with zt_submitted_by's text: ErrorInfo reason
 * NOT_JOB_SUBMITTER, metadata job (its resource name) and requiredScope admin. */
void zt_submitter_refusal(zt_api_error *e, const char *job_id, const char *text);

#endif
