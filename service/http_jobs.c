/* The JSON routes over ztraind's jobs (http_internal.h): /healthz, the job list, one job with
 * the checkpoints found on its disk, its records and log lines, and cancellation. The metric
 * series route, with its cache, has its own file (http_series.c). */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "http_internal.h"
#include "ztrain/checkpoint.h"

#define ZT_MAX_LIST_LIMIT 1000

/* ---- checkpoints ------------------------------------------------------------------------- */

static int64_t tag_step(const char *tag) {
    size_t n = strlen(tag), i = n;
    while (i > 0 && isdigit((unsigned char)tag[i - 1]))
        i--;
    if (i == n || n - i > 18)
        return -1;
    return strtoll(tag + i, NULL, 10);
}

static int ckpt_cmp(const void *a, const void *b) {
    const zt_ckpt_entry *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return strcmp(x->tag, y->tag);
}

/* Directories whose name starts with '.' are checkpoints being written (checkpoint.c renames
 * them into place), so they are left out. */
void zt_http_list_checkpoints(const char *dir, zt_ckpt_list *out) {
    memset(out, 0, sizeof *out);
    DIR *d = dir && *dir ? opendir(dir) : NULL;
    if (!d)
        return;
    int dfd = dirfd(d);
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && out->n < 10000) {
        struct stat st;
        if (e->d_name[0] == '.' || fstatat(dfd, e->d_name, &st, 0) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if (out->n == cap) {
            int ncap = cap ? cap * 2 : 8;
            zt_ckpt_entry *p = realloc(out->items, sizeof *p * (size_t)ncap);
            if (!p)
                break;
            out->items = p;
            cap = ncap;
        }
        char done[NAME_MAX + 8];
        snprintf(done, sizeof done, "%s/DONE", e->d_name);
        zt_ckpt_entry *c = &out->items[out->n];
        c->tag = strdup(e->d_name);
        if (!c->tag)
            break;
        c->step = tag_step(e->d_name);
        c->complete = faccessat(dfd, done, F_OK, 0) == 0;
        out->n++;
    }
    closedir(d);
    /* The engine's reader of dir/latest; a missing or malformed one just leaves latest NULL. */
    char latest[256];
    if (zt_ckpt_latest(dir, latest, sizeof latest) == ZT_OK)
        out->latest = strdup(latest);
    if (out->n > 1)
        qsort(out->items, (size_t)out->n, sizeof *out->items, ckpt_cmp);
}

static enum MHD_Result send_job(struct MHD_Connection *c, const zt_job_info *j) {
    zt_ckpt_list ck;
    zt_http_list_checkpoints(j->checkpoint_dir, &ck);
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_json_job(&b, j, zt_http_wall_ms(), &ck);
    zt_ckpt_list_free(&ck);
    return zt_http_send_json(c, MHD_HTTP_OK, &b);
}

/* ---- routes ------------------------------------------------------------------------------ */

enum MHD_Result zt_http_healthz(zt_http_server *s, struct MHD_Connection *c) {
    zt_job_info *jobs = NULL;
    int n = 0;
    zt_status st = zt_jobs_all(s->jm, &jobs, &n);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, NULL);
    int running = 0, queued = 0;
    for (int i = 0; i < n; i++) {
        zt_job_state js = jobs[i].state;
        running += js == ZT_JOB_STARTING || js == ZT_JOB_RUNNING || js == ZT_JOB_STOPPING;
        queued += js == ZT_JOB_QUEUED;
        zt_job_info_free(&jobs[i]);
    }
    free(jobs);
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
    if (!zt_http_arg_int(c, "limit", 1, ZT_MAX_LIST_LIMIT, &limit, &ret))
        return ret;
    zt_job_state state = 0;
    const char *sv = zt_http_arg(c, "state");
    if (sv && *sv && !(state = zt_job_state_parse(sv)))
        return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "state: unknown job state '%.64s'",
                                  sv);
    const char *after = zt_http_arg(c, "after");
    if (after && *after && !zt_http_valid_job_id(after, strlen(after)))
        return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "after: '%.64s' is not a job id",
                                  after);
    zt_job_info *jobs = NULL;
    int n = 0;
    bool more = false;
    zt_status st = zt_jobs_list(s->jm, state, after, (int)limit, &jobs, &n, &more);
    if ((st == ZT_ERR_NOT_FOUND || st == ZT_ERR_INVALID) && after && *after)
        return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "after: %s", zt_last_error());
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
    zt_json_key(&b, "next_after");
    zt_json_str(&b, more && n > 0 ? jobs[n - 1].id : NULL);
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
    enum MHD_Result ret = send_job(c, &info);
    zt_job_info_free(&info);
    return ret;
}

static void record_encode(void *ctx, const zt_metric_record *r) {
    zt_json_record(ctx, r);
}

static void log_encode(void *ctx, const zt_log_line *l) {
    zt_json_log_line(ctx, l);
}

/* Records and log lines answer {"job_id": id, name: [...]}: the manager's walk appends the
 * elements between begin_job_array and send_job_array. */
static void begin_job_array(zt_jbuf *b, const char *id, const char *name) {
    zt_json_open(b, '{');
    zt_json_key(b, "job_id");
    zt_json_str(b, id);
    zt_json_key(b, name);
    zt_json_open(b, '[');
}

/* Sends the array begun by begin_job_array, or the walk's failure st instead. */
static enum MHD_Result send_job_array(struct MHD_Connection *c, zt_jbuf *b, zt_status st,
                                      const char *id) {
    if (st != ZT_OK) {
        zt_jbuf_free(b);
        return zt_http_send_status(c, st, id);
    }
    zt_json_close(b, ']');
    zt_json_close(b, '}');
    return zt_http_send_json(c, MHD_HTTP_OK, b);
}

enum MHD_Result zt_http_job_records(zt_http_server *s, struct MHD_Connection *c,
                                    const char *id) {
    enum MHD_Result ret;
    int64_t since = 0;
    if (!zt_http_arg_int(c, "since_step", 0, INT64_MAX, &since, &ret))
        return ret;
    zt_jbuf b;
    zt_jbuf_init(&b);
    begin_job_array(&b, id, "records");
    zt_status st = zt_jobs_metric_records(s->jm, id, since, record_encode, &b);
    return send_job_array(c, &b, st, id);
}

enum MHD_Result zt_http_job_logs(zt_http_server *s, struct MHD_Connection *c, const char *id) {
    enum MHD_Result ret;
    int64_t tail = 100;
    if (!zt_http_arg_int(c, "tail", 0, ZT_MAX_LOG_TAIL, &tail, &ret))
        return ret;
    zt_jbuf b;
    zt_jbuf_init(&b);
    begin_job_array(&b, id, "lines");
    zt_status st = zt_jobs_logs(s->jm, id, tail ? (int)tail : 100, log_encode, &b);
    return send_job_array(c, &b, st, id);
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
    zt_status st = zt_jobs_cancel(s->jm, id, force, grace, &info);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, id);
    enum MHD_Result ret = send_job(c, &info);
    zt_job_info_free(&info);
    return ret;
}
