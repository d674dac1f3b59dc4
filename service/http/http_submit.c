/* POST /api/v1/jobs: submitting a job over HTTP, the same call as gRPC's SubmitJob. The body is
 * a SubmitJobRequest as JSON, {"spec": {...}, "idempotency_key": "..."}, whose spec is the job
 * file's object (what `ztrain submit job.json` sends and what GET /api/v1/jobs/{id} shows as
 * "spec", with "deepspeed" inline). It goes the way a gRPC request goes: into a JobSpec message
 * (unknown keys and wrong types refused by name, job_proto.h), back to the job manager's JSON,
 * and through zt_jobs_submit, so both transports validate, limit and de-duplicate alike. The key
 * may also come as an Idempotency-Key header. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "api/job_proto.h"
#include "api/submitter.h"
#include "http_internal.h"
#include "ztrain/json_util.h"

static enum MHD_Result bad(struct MHD_Connection *c, const char *msg) {
    return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "%s", msg);
}

enum MHD_Result zt_http_jobs_submit(zt_http_server *s, struct MHD_Connection *c,
                                    const zt_jbuf *body) {
    if (!body || body->buf.len == 0)
        return bad(c, "spec: the body must be a SubmitJobRequest, {\"spec\": {...}}");
    cJSON *root;
    enum MHD_Result ret;
    if (!zt_http_body_json(c, body, "spec", &root, &ret))
        return ret;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return bad(c, "spec: the body must be a JSON object, {\"spec\": {...}}");
    }
    const cJSON *spec = NULL, *key = NULL;
    for (const cJSON *m = root->child; m; m = m->next) {
        if (!strcmp(m->string, "spec")) {
            spec = m;
        } else if (!strcmp(m->string, "idempotency_key") || !strcmp(m->string, "idempotencyKey")) {
            key = m;
        } else {
            char msg[200];
            snprintf(msg, sizeof msg, "%.64s: unknown member of SubmitJobRequest (it has spec "
                     "and idempotency_key)", m->string);
            cJSON_Delete(root);
            return bad(c, msg);
        }
    }
    const char *refusal = !cJSON_IsObject(spec) ? "spec: required, a job spec object"
                          : key && !cJSON_IsString(key) && !cJSON_IsNull(key)
                              ? "idempotency_key: must be a string"
                              : NULL;
    if (refusal) {
        cJSON_Delete(root);
        return bad(c, refusal);
    }
    const char *header = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
    const char *k = cJSON_IsString(key) ? key->valuestring : "";
    if (header && k[0] && strcmp(header, k) != 0) {
        cJSON_Delete(root);
        return bad(c, "idempotency_key: differs from the Idempotency-Key header");
    }
    if (header && !k[0])
        k = header;

    /* cJSON reads a number beyond a double's range (1e400) as an infinity and prints it back
     * as null, which would then read as "absent": refused here, by its key, before printing. */
    zt_status st = zt_json_check_finite(spec, "spec", "", NULL);
    char *spec_text = st == ZT_OK ? zt_json_print(spec, false) : NULL;
    Ztrain__V1__JobSpec *msg = NULL;
    char *spec_json = NULL;
    /* No base directory: a path given as "deepspeed" is refused, as gRPC cannot send one. */
    if (st == ZT_OK)
        st = spec_text ? zt_job_proto_spec_from_json(spec_text, "spec", NULL, &msg)
                       : zt_error(ZT_ERR_NOMEM, "out of memory");
    if (st == ZT_OK)
        st = zt_job_proto_spec_to_json(msg, &spec_json);
    zt_job_info info;
    memset(&info, 0, sizeof info);
    zt_auth_caller who = zt_http_caller(s, c);
    zt_submitter by;
    if (st == ZT_OK)
        st = zt_jobs_submit_by(s->jm, spec_json, k, zt_submitter_of(&who, &by), &info);
    free(spec_text);
    free(spec_json);
    if (msg)
        protobuf_c_message_free_unpacked(&msg->base, NULL);
    if (st != ZT_OK) {
        ret = zt_http_send_status_in(c, st, "spec", NULL);
    } else {
        ret = zt_http_send_job(c, &info);
        zt_job_info_free(&info);
    }
    cJSON_Delete(root);
    return ret;
}
