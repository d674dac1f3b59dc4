/* GET /api/v1/jobs/{id}/metrics.csv and .../metrics.jsonl (http_internal.h): a job's whole
 * metric history as a download, streamed page by page from the job manager, so that a long
 * job's export costs the daemon one page of records in memory, not the history.
 *
 * The export is the history as it stood when the request came: records that arrive while it
 * streams are left out, so a CSV's columns (found by a first walk over the history) cover
 * every row written after them. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "http_internal.h"

/* Records fetched from the manager per page: what one stream holds in memory at a time. */
#define EXPORT_PAGE 1000
/* The most columns a CSV export has; a history with more keys is refused (400), as a series
 * query without keys is. */
#define EXPORT_MAX_COLUMNS 1024

typedef struct {
    zt_jobs *jm;
    char id[32];
    bool csv;
    int64_t last_seq;      /* records numbered above it came after the request: left out */
    int64_t written;       /* records encoded so far; the stream ends when it reaches last_seq */
    int64_t next_after;    /* the seq the next page starts after; -1 when the history is done */
    char **columns;        /* CSV: every key of the history, in first-seen order */
    int n_columns;
    bool too_many_columns;
    zt_jbuf out;           /* encoded bytes not yet handed to MHD, from `pos` */
    size_t pos;
} export_stream;

static void export_free(void *cls) {
    export_stream *x = cls;
    for (int i = 0; i < x->n_columns; i++)
        free(x->columns[i]);
    free(x->columns);
    zt_jbuf_free(&x->out);
    free(x);
}

/* ---- CSV ----------------------------------------------------------------------------------- */

/* RFC 4180: a field with a comma, a quote or a line break is quoted, its quotes doubled. */
static void csv_text(zt_jbuf *b, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        zt_jbuf_puts(b, s);
        return;
    }
    zt_jbuf_text(b, "\"", 1);
    for (const char *q; (q = strchr(s, '"')); s = q + 1) {
        zt_jbuf_text(b, s, (size_t)(q - s));
        zt_jbuf_text(b, "\"\"", 2);
    }
    zt_jbuf_puts(b, s);
    zt_jbuf_text(b, "\"", 1);
}

/* One cell: a number as /metrics writes it (the shortest text that reads back as the same
 * double), true/false, a string as text, anything else as its JSON; null and non-finite
 * numbers are empty. */
static void csv_cell(zt_jbuf *b, const cJSON *v) {
    if (cJSON_IsNumber(v)) {
        if (isfinite(v->valuedouble)) {
            b->comma = false;
            zt_json_num(b, v->valuedouble);
            b->comma = false;
        }
    } else if (cJSON_IsBool(v)) {
        zt_jbuf_puts(b, cJSON_IsTrue(v) ? "true" : "false");
    } else if (cJSON_IsString(v)) {
        csv_text(b, v->valuestring);
    } else if (v && !cJSON_IsNull(v)) {
        char *text = cJSON_PrintUnformatted(v);
        if (text)
            csv_text(b, text);
        else
            b->buf.oom = true;
        cJSON_free(text);
    }
}

static void csv_header(export_stream *x) {
    zt_jbuf_puts(&x->out, "step,time_unix_ms");
    for (int i = 0; i < x->n_columns; i++) {
        zt_jbuf_text(&x->out, ",", 1);
        csv_text(&x->out, x->columns[i]);
    }
    zt_jbuf_text(&x->out, "\r\n", 2);
}

static void csv_row(export_stream *x, const zt_metric_record *r) {
    cJSON *obj = cJSON_Parse(r->json);
    zt_jbuf_printf(&x->out, "%" PRId64 ",%" PRId64, r->step, r->time_ms);
    for (int i = 0; i < x->n_columns; i++) {
        zt_jbuf_text(&x->out, ",", 1);
        if (cJSON_IsObject(obj))
            csv_cell(&x->out, cJSON_GetObjectItemCaseSensitive(obj, x->columns[i]));
    }
    zt_jbuf_text(&x->out, "\r\n", 2);
    cJSON_Delete(obj);
}

/* The first walk: every key of the records up to last_seq becomes a column. */
static void collect_columns(void *ctx, const zt_metric_record *r) {
    export_stream *x = ctx;
    if (r->seq > x->last_seq || x->too_many_columns)
        return;
    x->written++;
    cJSON *obj = cJSON_Parse(r->json);
    for (const cJSON *it = cJSON_IsObject(obj) ? obj->child : NULL; it; it = it->next) {
        bool known = false;
        for (int i = 0; i < x->n_columns && !known; i++)
            known = strcmp(x->columns[i], it->string) == 0;
        if (known)
            continue;
        if (x->n_columns == EXPORT_MAX_COLUMNS) {
            x->too_many_columns = true;
            break;
        }
        char **grown = realloc(x->columns, sizeof *grown * (size_t)(x->n_columns + 1));
        char *key = strdup(it->string);
        if (grown)
            x->columns = grown;
        if (!grown || !key) {
            free(key);
            x->out.buf.oom = true;
            break;
        }
        x->columns[x->n_columns++] = key;
    }
    cJSON_Delete(obj);
}

/* ---- the stream ---------------------------------------------------------------------------- */

static void encode_record(void *ctx, const zt_metric_record *r) {
    export_stream *x = ctx;
    if (r->seq > x->last_seq)
        return;
    x->written++;
    if (x->csv) {
        csv_row(x, r);
    } else {
        x->out.comma = false;
        zt_json_record(&x->out, r);
        zt_jbuf_text(&x->out, "\n", 1);
    }
}

/* Walks the history from its start to its end (or to last_seq records), page by page,
 * through fn: the CSV's first walk, over the columns. */
static zt_status walk_all(export_stream *x, zt_record_fn fn) {
    int64_t after = 0;
    x->written = 0;
    while (after >= 0 && x->written < x->last_seq && !x->too_many_columns && !x->out.buf.oom)
        ZT_TRY(zt_jobs_metric_records(x->jm, x->id, 0, after, EXPORT_PAGE, fn, x, &after));
    return ZT_OK;
}

/* MHD's content reader: hands out what is encoded, encoding the next page when it runs out. A
 * failure mid-stream can only end the connection, which the client sees as a cut download. */
static ssize_t export_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    export_stream *x = cls;
    while (x->pos == x->out.buf.len) {
        x->pos = 0;
        zt_jbuf_clear(&x->out);
        if (x->next_after < 0 || x->written >= x->last_seq)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (zt_jobs_metric_records(x->jm, x->id, 0, x->next_after, EXPORT_PAGE, encode_record,
                                   x, &x->next_after) != ZT_OK || x->out.buf.oom)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = x->out.buf.len - x->pos < max ? x->out.buf.len - x->pos : max;
    memcpy(buf, x->out.buf.data + x->pos, n);
    x->pos += n;
    return (ssize_t)n;
}

enum MHD_Result zt_http_job_export(zt_http_server *s, struct MHD_Connection *c, const char *id,
                                   bool csv) {
    int64_t n_records;
    zt_status st = zt_jobs_record_count(s->jm, id, &n_records);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, id);
    export_stream *x = calloc(1, sizeof *x);
    if (!x)
        return MHD_NO;
    x->jm = s->jm;
    snprintf(x->id, sizeof x->id, "%s", id);
    x->csv = csv;
    x->last_seq = n_records;
    zt_jbuf_init(&x->out);
    if (csv) {
        st = walk_all(x, collect_columns);
        if (st == ZT_OK && x->too_many_columns) {
            export_free(x);
            return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "jobs/%s: its records have more "
                                      "than %d keys (the most a CSV export has)", id,
                                      EXPORT_MAX_COLUMNS);
        }
        if (st == ZT_OK && !x->out.buf.oom)
            csv_header(x);
    }
    if (st != ZT_OK || x->out.buf.oom) {
        export_free(x);
        return st != ZT_OK ? zt_http_send_status(c, st, id) : MHD_NO;
    }
    x->written = 0;
    x->next_after = 0;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024,
                                                               export_read, x, export_free);
    if (!r) {
        export_free(x);
        return MHD_NO;
    }
    char disposition[96];
    snprintf(disposition, sizeof disposition, "attachment; filename=\"%s-metrics.%s\"", id,
             csv ? "csv" : "jsonl");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            csv ? "text/csv; charset=utf-8; header=present"
                                : "application/x-ndjson");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, disposition);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    return zt_http_queue(c, MHD_HTTP_OK, r);
}
