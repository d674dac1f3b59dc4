/* The JSON routes over ztraind's jobs (http_internal.h): /healthz, the job list, one job, its
 * checkpoints and effective config, and cancellation; each body is the proto3 JSON of the
 * message gRPC answers with (proto_json.h). A job's lists (records, logs, anomalies,
 * webhooks) are http_job_lists.c's; the metric series route, with its cache, has its own file
 * (http_series.c). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "http_internal.h"
#include "api/page_token.h"
#include "api/submitter.h"
#include "api/job_proto.h"
#include "ztrain/json_util.h"

#define ZT_MAX_LIST_LIMIT 1000

/* ---- one job ---------------------------------------------------------------------------- */

enum MHD_Result zt_http_send_job(struct MHD_Connection *c, const zt_job_info *j) {
    Ztrain__V1__Job *job;
    zt_status st = zt_job_proto_job_from_info(j, zt_http_wall_ms(), &job);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, j->id);
    enum MHD_Result ret = zt_http_send_proto(c, MHD_HTTP_OK, &job->base);
    protobuf_c_message_free_unpacked(&job->base, NULL);
    return ret;
}

/* ---- routes ------------------------------------------------------------------------------ */

enum MHD_Result zt_http_healthz(zt_http_server *s, struct MHD_Connection *c) {
    /* Probes and the dashboard ask every second or two: count, do not copy every job. */
    int count[ZT_JOB_CANCELLED + 1];
    zt_jobs_count_states(s->jm, count);
    int n = 0;
    for (int i = ZT_JOB_QUEUED; i <= ZT_JOB_CANCELLED; i++)
        n += count[i];
    int running = count[ZT_JOB_STARTING] + count[ZT_JOB_RUNNING] + count[ZT_JOB_STOPPING];
    int queued = count[ZT_JOB_QUEUED];
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_json_open(&b, '{');
    zt_json_key(&b, "status");
    zt_json_str(&b, "ok");
    zt_json_key(&b, "jobs");
    zt_json_int(&b, n);
    zt_json_key(&b, "running");
    zt_json_int(&b, running);
    zt_json_key(&b, "queued");
    zt_json_int(&b, queued);
    zt_json_close(&b, '}');
    return zt_http_send_json(c, MHD_HTTP_OK, &b);
}

/* ListJobsResponse, as gRPC's ListJobs answers it. */
enum MHD_Result zt_http_jobs_list(zt_http_server *s, struct MHD_Connection *c) {
    enum MHD_Result ret;
    int64_t limit = 50;
    /* AIP-158's names, as ListJobs has them; limit and after are their older names, still
     * read (and checked) when given, the new name winning when both are. */
    if (!zt_http_arg_page_size(c, "limit", 50, ZT_MAX_LIST_LIMIT, &limit, &ret) ||
        !zt_http_arg_page_size(c, "page_size", 50, ZT_MAX_LIST_LIMIT, &limit, &ret))
        return ret;
    zt_job_state state = 0;
    const char *sv = zt_http_arg(c, "state");
    if (sv && *sv && !(state = zt_job_state_parse(sv)))
        return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "state: unknown job state '%.64s'",
                                  sv);
    /* page_token is a token this list handed out under the same state filter (page_token.h),
     * as ListJobs reads it; `after`, its older form, is the job id itself. */
    const char *filter = state ? zt_job_state_name(state) : "";
    const char *token_name = "page_token", *after = NULL;
    char cursor[ZT_PAGE_TOKEN_MAX];
    const char *v = zt_http_arg(c, "after");
    if (v && *v && !zt_http_valid_job_id(v, strlen(v)))
        return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "after: '%.64s' is not a job id", v);
    if (v && *v)
        token_name = "after", after = v;
    v = zt_http_arg(c, "page_token");
    if (v && *v) {
        if (!zt_page_token_read(&s->page_key, v, ZT_PAGE_JOBS, "", filter, cursor,
                                sizeof cursor) ||
            !zt_http_valid_job_id(cursor, strlen(cursor)))
            return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "page_token: '%.64s' is not a "
                                      "next_page_token of this list with this state", v);
        token_name = "page_token", after = cursor;
    }
    zt_job_info *jobs = NULL;
    int n = 0;
    bool more = false;
    zt_status st = zt_jobs_list(s->jm, state, after, (int)limit, &jobs, &n, &more);
    if ((st == ZT_ERR_NOT_FOUND || st == ZT_ERR_INVALID) && after && *after) {
        const char *why = zt_last_error();
        const char *colon = strstr(why, ": ");
        return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "%s: %s", token_name,
                                  colon ? colon + 2 : why);
    }
    if (st != ZT_OK)
        return zt_http_send_status(c, st, NULL);
    /* As ListJobs answers: a token after the last job of this page, "" on the last page. */
    char token[ZT_PAGE_TOKEN_MAX] = "";
    if (more && n > 0)
        zt_page_token_make(&s->page_key, ZT_PAGE_JOBS, "", filter, jobs[n - 1].id, token,
                           sizeof token);
    Ztrain__V1__ListJobsResponse resp = ZTRAIN__V1__LIST_JOBS_RESPONSE__INIT;
    resp.jobs = n > 0 ? calloc((size_t)n, sizeof *resp.jobs) : NULL;
    if (n > 0 && !resp.jobs)
        st = zt_error(ZT_ERR_NOMEM, "out of memory listing %d jobs", n);
    int64_t now = zt_http_wall_ms();
    for (int i = 0; st == ZT_OK && i < n; i++) {
        st = zt_job_proto_job_from_info(&jobs[i], now, &resp.jobs[i]);
        resp.n_jobs += st == ZT_OK;
    }
    resp.next_page_token = token;
    ret = st == ZT_OK ? zt_http_send_proto(c, MHD_HTTP_OK, &resp.base)
                                      : zt_http_send_status(c, st, NULL);
    for (size_t i = 0; i < resp.n_jobs; i++)
        protobuf_c_message_free_unpacked(&resp.jobs[i]->base, NULL);
    free(resp.jobs);
    for (int i = 0; i < n; i++)
        zt_job_info_free(&jobs[i]);
    free(jobs);
    return ret;
}

enum MHD_Result zt_http_job_get(zt_http_server *s, struct MHD_Connection *c, const char *id) {
    zt_job_info info;
    zt_status st = zt_jobs_get(s->jm, id, &info);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, id);
    enum MHD_Result ret = zt_http_send_job(c, &info);
    zt_job_info_free(&info);
    return ret;
}

/* The optional body {"force": false, "grace_seconds": 30}, read by the caller. */
static bool parse_cancel_body(cJSON *o, bool *force, double *grace, char *err, size_t errsz) {
    if (!o)
        return true;
    bool ok = false;
    if (!cJSON_IsObject(o)) {
        snprintf(err, errsz, "the body must be a JSON object");
        goto out;
    }
    for (const cJSON *m = o->child; m; m = m->next) {
        if (strcmp(m->string, "force") != 0 && strcmp(m->string, "grace_seconds") != 0) {
            snprintf(err, errsz, "%.64s: unknown member (a cancel takes force and "
                     "grace_seconds)", m->string);
            goto out;
        }
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "force");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "grace_seconds");
    if (f && !cJSON_IsBool(f) && !cJSON_IsNull(f)) {
        snprintf(err, errsz, "force: expected true or false");
        goto out;
    }
    if (g && !cJSON_IsNull(g) && (!cJSON_IsNumber(g) || !isfinite(g->valuedouble) ||
                                  g->valuedouble < 0 || g->valuedouble > ZT_JOBS_MAX_GRACE_S)) {
        snprintf(err, errsz, "grace_seconds: expected a number of seconds from 0 to %g",
                 ZT_JOBS_MAX_GRACE_S);
        goto out;
    }
    *force = cJSON_IsTrue(f);
    *grace = cJSON_IsNumber(g) ? g->valuedouble : 0;
    ok = true;
out:
    return ok;
}

enum MHD_Result zt_http_job_cancel(zt_http_server *s, struct MHD_Connection *c, const char *id,
                                   const zt_jbuf *body) {
    bool force = false;
    double grace = 0;
    char err[128];
    cJSON *o = NULL;
    enum MHD_Result ret;
    if (body && body->buf.len > 0 && !zt_http_body_json(c, body, NULL, &o, &ret))
        return ret;
    bool ok = parse_cancel_body(o, &force, &grace, err, sizeof err);
    cJSON_Delete(o);
    if (!ok)
        return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "%s", err);
    zt_job_info info;
    /* Below admin, a token cancels only the jobs it submitted; who submitted a job never
     * changes, so checking first is no race. */
    zt_auth_caller who = zt_http_caller(s, c);
    if (who.scope < ZT_SCOPE_ADMIN) {
        zt_status st = zt_jobs_get(s->jm, id, &info);
        if (st != ZT_OK)
            return zt_http_send_status(c, st, id);
        char text[300];
        bool own = zt_submitted_by(&info, &who, text, sizeof text);
        zt_job_info_free(&info);
        if (!own) {
            zt_api_error e;
            zt_submitter_refusal(&e, id, text);
            return zt_http_send_api_error(c, &e);
        }
    }
    zt_status st = zt_jobs_cancel(s->jm, id, force, grace, &info);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, id);
    ret = zt_http_send_job(c, &info);
    zt_job_info_free(&info);
    return ret;
}

/* ListCheckpointsResponse: the entries of the job's checkpoint directory, as ListCheckpoints. */
enum MHD_Result zt_http_job_checkpoints(zt_http_server *s, struct MHD_Connection *c,
                                        const char *id) {
    zt_job_info info;
    zt_status st = zt_jobs_get(s->jm, id, &info);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, id);
    Ztrain__V1__ListCheckpointsResponse *resp;
    st = zt_job_proto_checkpoints(info.id, info.checkpoint_dir, &resp);
    zt_job_info_free(&info);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, id);
    enum MHD_Result ret = zt_http_send_proto(c, MHD_HTTP_OK, &resp->base);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return ret;
}

/* EffectiveConfig: the DeepSpeed config rank 0 resolved and wrote into the run directory, as
 * GetEffectiveConfig; before it has, FAILED_PRECONDITION as gRPC answers it. */
enum MHD_Result zt_http_job_config(zt_http_server *s, struct MHD_Connection *c, const char *id) {
    zt_job_info info;
    zt_status st = zt_jobs_get(s->jm, id, &info);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, id);
    char path[4200], *text = NULL;
    snprintf(path, sizeof path, "%s/ds_config.effective.json", info.run_dir ? info.run_dir : "");
    enum MHD_Result ret;
    if (!info.run_dir || zt_json_read_file(path, &text, NULL) != ZT_OK) {
        char msg[200];
        snprintf(msg, sizeof msg, "jobs/%.64s: its ranks have not written the effective config "
                 "yet (state %s)", id, zt_job_state_name(info.state));
        zt_api_error e;
        zt_api_error_set(&e, GRPC_STATUS_FAILED_PRECONDITION, NULL, msg);
        e.kind = ZT_DETAIL_PRECONDITION;
        snprintf(e.type, sizeof e.type, "STATE");
        snprintf(e.field, sizeof e.field, "jobs/%.64s", id);
        ret = zt_http_send_api_error(c, &e);
    } else {
        Ztrain__V1__EffectiveConfig resp = ZTRAIN__V1__EFFECTIVE_CONFIG__INIT;
        resp.deepspeed_json = text;
        ret = zt_http_send_proto(c, MHD_HTTP_OK, &resp.base);
    }
    free(text);
    zt_job_info_free(&info);
    return ret;
}
