/* Anomaly events and webhook deliveries in SQLite (event_store.h). */
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "event_store.h"

struct zt_event_store {
    sqlite3 *db;
    char *path;
    pthread_mutex_t mu;
};

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS anomalies ("
    " job_id TEXT NOT NULL, seq INTEGER NOT NULL, step INTEGER NOT NULL,"
    " time_ms INTEGER NOT NULL, kind TEXT NOT NULL, policy TEXT NOT NULL,"
    " value REAL, zscore REAL, rank INTEGER NOT NULL, message TEXT NOT NULL, json TEXT NOT NULL,"
    " PRIMARY KEY (job_id, seq));"
    "CREATE TABLE IF NOT EXISTS webhook_deliveries ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, delivery_id TEXT NOT NULL,"
    " url TEXT NOT NULL, type TEXT NOT NULL, attempt INTEGER NOT NULL, time_ms INTEGER NOT NULL,"
    " http_status INTEGER NOT NULL, error TEXT NOT NULL, outcome TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS webhook_deliveries_job ON webhook_deliveries (job_id, id);";

static zt_status db_error(zt_event_store *st, const char *what) {
    return zt_error(ZT_ERR_IO, "%s: %s: %s", st->path, what, sqlite3_errmsg(st->db));
}

zt_status zt_event_store_open(zt_event_store **out, const char *path) {
    zt_event_store *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&st->mu, NULL);
    zt_status s = ZT_OK;
    if (sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK)
        s = db_error(st, "cannot open");
    else if (sqlite3_exec(st->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                                  "PRAGMA busy_timeout=5000;", NULL, NULL, NULL) != SQLITE_OK ||
             sqlite3_exec(st->db, schema, NULL, NULL, NULL) != SQLITE_OK)
        s = db_error(st, "cannot create the event tables");
    if (s != ZT_OK) {
        zt_event_store_close(st);
        return s;
    }
    *out = st;
    return ZT_OK;
}

void zt_event_store_close(zt_event_store *st) {
    if (!st)
        return;
    sqlite3_close(st->db);
    pthread_mutex_destroy(&st->mu);
    free(st->path);
    free(st);
}

static void bind_real_or_null(sqlite3_stmt *q, int i, double v) {
    if (isfinite(v))
        sqlite3_bind_double(q, i, v);
    else
        sqlite3_bind_null(q, i);
}

static double column_real(sqlite3_stmt *q, int i) {
    return sqlite3_column_type(q, i) == SQLITE_NULL ? NAN : sqlite3_column_double(q, i);
}

static const char *column_text(sqlite3_stmt *q, int i) {
    const char *t = (const char *)sqlite3_column_text(q, i);
    return t ? t : "";
}

/* Runs one statement under the lock: binds with bind(ctx, q), then steps it, handing each row
 * to row(ctx, q) (may be NULL). */
static zt_status run_stmt(zt_event_store *st, const char *sql, void (*bind)(void *, sqlite3_stmt *),
                          void (*row)(void *, sqlite3_stmt *), void *ctx, const char *what) {
    pthread_mutex_lock(&st->mu);
    sqlite3_stmt *q = NULL;
    zt_status s = ZT_OK;
    if (sqlite3_prepare_v2(st->db, sql, -1, &q, NULL) != SQLITE_OK) {
        s = db_error(st, what);
    } else {
        bind(ctx, q);
        int rc;
        while ((rc = sqlite3_step(q)) == SQLITE_ROW)
            if (row)
                row(ctx, q);
        if (rc != SQLITE_DONE)
            s = db_error(st, what);
    }
    sqlite3_finalize(q);
    pthread_mutex_unlock(&st->mu);
    return s;
}

typedef struct {
    const char *job_id;
    const zt_anomaly *a;
    int64_t after;
    int limit;
    zt_anomaly_fn emit;
    void *ctx;
} anomaly_q;

static void bind_anomaly(void *ctx, sqlite3_stmt *q) {
    anomaly_q *x = ctx;
    const zt_anomaly *a = x->a;
    sqlite3_bind_text(q, 1, x->job_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 2, a->seq);
    sqlite3_bind_int64(q, 3, a->step);
    sqlite3_bind_int64(q, 4, a->time_ms);
    sqlite3_bind_text(q, 5, a->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 6, a->policy, -1, SQLITE_STATIC);
    bind_real_or_null(q, 7, a->value);
    bind_real_or_null(q, 8, a->zscore);
    sqlite3_bind_int(q, 9, a->rank);
    sqlite3_bind_text(q, 10, a->message, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 11, a->json, -1, SQLITE_STATIC);
}

zt_status zt_event_store_add_anomaly(zt_event_store *st, const char *job_id, const zt_anomaly *a) {
    anomaly_q x = {.job_id = job_id, .a = a};
    return run_stmt(st,
                    "INSERT OR REPLACE INTO anomalies (job_id, seq, step, time_ms, kind, policy, "
                    "value, zscore, rank, message, json) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    bind_anomaly, NULL, &x, "cannot store an anomaly event");
}

static void bind_anomaly_query(void *ctx, sqlite3_stmt *q) {
    anomaly_q *x = ctx;
    sqlite3_bind_text(q, 1, x->job_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 2, x->after);
    sqlite3_bind_int(q, 3, x->limit);
}

static void anomaly_row(void *ctx, sqlite3_stmt *q) {
    anomaly_q *x = ctx;
    zt_anomaly a = {.seq = sqlite3_column_int64(q, 0), .step = sqlite3_column_int64(q, 1),
                    .time_ms = sqlite3_column_int64(q, 2), .kind = column_text(q, 3),
                    .policy = column_text(q, 4), .value = column_real(q, 5),
                    .zscore = column_real(q, 6), .rank = sqlite3_column_int(q, 7),
                    .message = column_text(q, 8), .json = column_text(q, 9)};
    x->emit(x->ctx, &a);
}

zt_status zt_event_store_anomalies(zt_event_store *st, const char *job_id, int64_t after_seq,
                                   int limit, zt_anomaly_fn emit, void *ctx) {
    anomaly_q x = {.job_id = job_id, .after = after_seq, .limit = limit, .emit = emit,
                   .ctx = ctx};
    return run_stmt(st,
                    "SELECT seq, step, time_ms, kind, policy, value, zscore, rank, message, json "
                    "FROM anomalies WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    bind_anomaly_query, anomaly_row, &x, "cannot read anomaly events");
}

typedef struct {
    const zt_delivery *d;
    const char *job_id;
    int limit;
    zt_delivery_fn emit;
    void *ctx;
} delivery_q;

static void bind_delivery(void *ctx, sqlite3_stmt *q) {
    const zt_delivery *d = ((delivery_q *)ctx)->d;
    sqlite3_bind_text(q, 1, d->job_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, d->delivery_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, d->url, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, d->type, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 5, d->attempt);
    sqlite3_bind_int64(q, 6, d->time_ms);
    sqlite3_bind_int(q, 7, d->http_status);
    sqlite3_bind_text(q, 8, d->error, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 9, d->outcome, -1, SQLITE_STATIC);
}

zt_status zt_event_store_add_delivery(zt_event_store *st, const zt_delivery *d) {
    delivery_q x = {.d = d};
    return run_stmt(st,
                    "INSERT INTO webhook_deliveries (job_id, delivery_id, url, type, attempt, "
                    "time_ms, http_status, error, outcome) VALUES (?,?,?,?,?,?,?,?,?)",
                    bind_delivery, NULL, &x, "cannot record a webhook delivery");
}

static void bind_delivery_query(void *ctx, sqlite3_stmt *q) {
    delivery_q *x = ctx;
    sqlite3_bind_text(q, 1, x->job_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, x->limit);
}

static void delivery_row(void *ctx, sqlite3_stmt *q) {
    delivery_q *x = ctx;
    zt_delivery d = {.id = sqlite3_column_int64(q, 0), .job_id = column_text(q, 1),
                     .delivery_id = column_text(q, 2), .url = column_text(q, 3),
                     .type = column_text(q, 4), .attempt = sqlite3_column_int(q, 5),
                     .time_ms = sqlite3_column_int64(q, 6), .http_status = sqlite3_column_int(q, 7),
                     .error = column_text(q, 8), .outcome = column_text(q, 9)};
    x->emit(x->ctx, &d);
}

zt_status zt_event_store_deliveries(zt_event_store *st, const char *job_id, int limit,
                                    zt_delivery_fn emit, void *ctx) {
    delivery_q x = {.job_id = job_id, .limit = limit, .emit = emit, .ctx = ctx};
    return run_stmt(st,
                    "SELECT id, job_id, delivery_id, url, type, attempt, time_ms, http_status, "
                    "error, outcome FROM (SELECT * FROM webhook_deliveries WHERE job_id = ? "
                    "ORDER BY id DESC LIMIT ?) ORDER BY id",
                    bind_delivery_query, delivery_row, &x, "cannot read webhook deliveries");
}
