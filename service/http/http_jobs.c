/* The JSON routes over ztraind's jobs (http_internal.h): /healthz, the job list, one job with
 * the checkpoints found on its disk, and cancellation. A job's lists (records, logs, anomalies,
 * webhooks) are http_job_lists.c's; the metric series route, with its cache, has its own file
 * (http_series.c). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "http_internal.h"
#include "api/submitter.h"
#include "ztrain/json_util.h"
#include "ztrain/checkpoint.h"

#define ZT_MAX_LIST_LIMIT 1000

/* ---- one job ---------------------------------------------------------------------------- */

/* The effective DeepSpeed config that rank 0 wrote into the run directory ("auto" values resolved,
 * defaults written in), or null before it has. Read per request, like the checkpoints: one small
 * file, and only for one job's page. */
static void effective_config(zt_jbuf *b, const zt_job_info *j) {
    char path[4200], *text = NULL, *out = NULL;
    cJSON *root = NULL;
    snprintf(path, sizeof path, "%s/ds_config.effective.json", j->run_dir ? j->run_dir : "");
    if (j->run_dir && zt_json_read_file(path, &text, NULL) == ZT_OK)
        root = cJSON_Parse(text);
    if (root)
        out = cJSON_PrintUnformatted(root);
    zt_json_key(b, "effective_config");
    if (out)
        zt_json_raw(b, out, strlen(out));
    else
        zt_json_null(b);
    cJSON_free(out);
    cJSON_Delete(root);
    free(text);
}

enum MHD_Result zt_http_send_job(struct MHD_Connection *c, const zt_job_info *j) {
    zt_ckpt_list ck;
    zt_ckpt_list_dir(j->checkpoint_dir, &ck);
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_json_job_open(&b, j, zt_http_wall_ms());
    effective_config(&b, j);
    zt_json_job_close(&b, &ck);
    zt_ckpt_list_free(&ck);
    return zt_http_send_json(c, MHD_HTTP_OK, &b);
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

/* List items leave out "checkpoints" and "latest": listing a directory per job would make the
 * jobs page cost disk reads; GET /api/v1/jobs/{id} has them. */
enum MHD_Result zt_http_jobs_list(zt_http_server *s, struct MHD_Connection *c) {
    enum MHD_Result ret;
    int64_t limit = 50;
    /* AIP-158's names, as ListJobs has them; limit and after are their older names, still
     * read (and checked) when given, the new name winning when both are. */
    if (!zt_http_arg_int(c, "limit", 1, ZT_MAX_LIST_LIMIT, &limit, &ret) ||
        !zt_http_arg_int(c, "page_size", 1, ZT_MAX_LIST_LIMIT, &limit, &ret))
        return ret;
    zt_job_state state = 0;
    const char *sv = zt_http_arg(c, "state");
    if (sv && *sv && !(state = zt_job_state_parse(sv)))
        return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "state: unknown job state '%.64s'",
                                  sv);
    const char *token_name = "page_token", *after = NULL;
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "page_token" : "after", *v = zt_http_arg(c, name);
        if (v && *v && !zt_http_valid_job_id(v, strlen(v)))
            return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "%s: '%.64s' is not a page token",
                                      name, v);
        if (v && *v)
            token_name = name, after = v;
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
    int64_t now = zt_http_wall_ms();
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_json_open(&b, '{');
    zt_json_key(&b, "jobs");
    zt_json_open(&b, '[');
    for (int i = 0; i < n; i++)
        zt_json_job(&b, &jobs[i], now, NULL);
    zt_json_close(&b, ']');
    /* As ListJobs: the last id of this page, "" on the last page. */
    zt_json_key(&b, "next_page_token");
    zt_json_str(&b, more && n > 0 ? jobs[n - 1].id : "");
    zt_json_close(&b, '}');
    for (int i = 0; i < n; i++)
        zt_job_info_free(&jobs[i]);
    free(jobs);
    return zt_http_send_json(c, MHD_HTTP_OK, &b);
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

/* The optional body {"force": false, "grace_seconds": 30}. */
static bool parse_cancel_body(const zt_jbuf *body, bool *force, double *grace, char *err,
                              size_t errsz) {
    if (!body || body->len == 0)
        return true;
    cJSON *o = cJSON_ParseWithLength(body->data, body->len);
    bool ok = false;
    if (!o || !cJSON_IsObject(o)) {
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
                                  g->valuedouble < 0)) {
        snprintf(err, errsz, "grace_seconds: expected a number >= 0");
        goto out;
    }
    *force = cJSON_IsTrue(f);
    *grace = cJSON_IsNumber(g) ? g->valuedouble : 0;
    ok = true;
out:
    cJSON_Delete(o);
    return ok;
}

enum MHD_Result zt_http_job_cancel(zt_http_server *s, struct MHD_Connection *c, const char *id,
                                   const zt_jbuf *body) {
    bool force = false;
    double grace = 0;
    char err[128];
    if (!parse_cancel_body(body, &force, &grace, err, sizeof err))
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
        if (!own)
            return zt_http_send_error(c, MHD_HTTP_FORBIDDEN, "%s", text);
    }
    zt_status st = zt_jobs_cancel(s->jm, id, force, grace, &info);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, id);
    enum MHD_Result ret = zt_http_send_job(c, &info);
    zt_job_info_free(&info);
    return ret;
}
