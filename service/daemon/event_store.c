/* Anomaly events and webhook deliveries in SQLite (event_store.h). */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
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

/* A record type's columns, in the order of its table: where each field lives in the C struct
 * and how it crosses SQLite. One table per record drives its INSERT bindings and its SELECT row,
 * so a field is added in one place. A REAL column stores NULL for a non-finite value and reads
 * back NaN; TEXT never reads back NULL (""). */
typedef enum { COL_TEXT, COL_INT, COL_INT64, COL_REAL } col_kind;
typedef struct {
    col_kind kind;
    size_t offset;
} column;

#define COL(kind, type, field) {kind, offsetof(type, field)}

static const column anomaly_cols[] = {
    COL(COL_INT64, zt_anomaly, seq),      COL(COL_INT64, zt_anomaly, step),
    COL(COL_INT64, zt_anomaly, time_ms),  COL(COL_TEXT, zt_anomaly, kind),
    COL(COL_TEXT, zt_anomaly, policy),    COL(COL_REAL, zt_anomaly, value),
    COL(COL_REAL, zt_anomaly, zscore),    COL(COL_INT, zt_anomaly, rank),
    COL(COL_TEXT, zt_anomaly, message),   COL(COL_TEXT, zt_anomaly, json),
};
/* After the row id: every field but `id`. */
static const column delivery_cols[] = {
    COL(COL_TEXT, zt_delivery, job_id),   COL(COL_TEXT, zt_delivery, delivery_id),
    COL(COL_TEXT, zt_delivery, url),      COL(COL_TEXT, zt_delivery, type),
    COL(COL_INT, zt_delivery, attempt),   COL(COL_INT64, zt_delivery, time_ms),
    COL(COL_INT, zt_delivery, http_status), COL(COL_TEXT, zt_delivery, error),
    COL(COL_TEXT, zt_delivery, outcome),
};
#define N_COLS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Binds the record's fields to parameters first, first + 1, ... */
static void bind_record(sqlite3_stmt *q, int first, const column *cols, int n, const void *rec) {
    for (int i = 0; i < n; i++) {
        const char *f = (const char *)rec + cols[i].offset;
        int at = first + i;
        switch (cols[i].kind) {
        case COL_TEXT: sqlite3_bind_text(q, at, *(const char *const *)f, -1, SQLITE_STATIC); break;
        case COL_INT: sqlite3_bind_int(q, at, *(const int *)f); break;
        case COL_INT64: sqlite3_bind_int64(q, at, *(const int64_t *)f); break;
        case COL_REAL: {
            double v = *(const double *)f;
            if (isfinite(v))
                sqlite3_bind_double(q, at, v);
            else
                sqlite3_bind_null(q, at);
            break;
        }
        }
    }
}

/* Fills the record from result columns first, first + 1, ...; text stays valid until the next
 * step of q. */
static void read_record(sqlite3_stmt *q, int first, const column *cols, int n, void *rec) {
    for (int i = 0; i < n; i++) {
        char *f = (char *)rec + cols[i].offset;
        int at = first + i;
        switch (cols[i].kind) {
        case COL_TEXT: {
            const char *s = (const char *)sqlite3_column_text(q, at);
            *(const char **)f = s ? s : "";
            break;
        }
        case COL_INT: *(int *)f = sqlite3_column_int(q, at); break;
        case COL_INT64: *(int64_t *)f = sqlite3_column_int64(q, at); break;
        case COL_REAL:
            *(double *)f = sqlite3_column_type(q, at) == SQLITE_NULL ? NAN
                                                                    : sqlite3_column_double(q, at);
            break;
        }
    }
}

/* One statement: its record's columns, what to bind before them, and where rows go. */
typedef struct {
    const column *cols;
    int n_cols;
    const char *job_id;        /* bound first when not NULL */
    const void *rec;           /* INSERT: the record bound after job_id */
    int64_t after;             /* SELECT of anomalies: the cursor */
    int limit;                 /* SELECT: at most this many rows (bound last) */
    bool has_after, has_row_id;
    zt_anomaly_fn emit_anomaly; /* SELECT: where rows go (one of the two) */
    zt_delivery_fn emit_delivery;
    void *ctx;
} stmt_plan;

/* Runs one statement under the lock: binds job_id, the record, the cursor and the limit, in
 * that order, those the plan has; hands each row to its emit function. */
static zt_status run_plan_locked(zt_event_store *st, const char *sql, const stmt_plan *p,
                                 const char *what) {
    sqlite3_stmt *q = NULL;
    zt_status s = ZT_OK;
    if (sqlite3_prepare_v2(st->db, sql, -1, &q, NULL) != SQLITE_OK) {
        s = db_error(st, what);
    } else {
        int at = 1;
        if (p->job_id)
            sqlite3_bind_text(q, at++, p->job_id, -1, SQLITE_STATIC);
        if (p->rec)
            bind_record(q, at, p->cols, p->n_cols, p->rec), at += p->n_cols;
        if (p->has_after)
            sqlite3_bind_int64(q, at++, p->after);
        bool select = p->emit_anomaly || p->emit_delivery;
        if (select)
            sqlite3_bind_int(q, at++, p->limit);
        int rc;
        while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
            union {
                zt_anomaly a;
                zt_delivery d;
            } row;
            memset(&row, 0, sizeof row);
            if (p->has_row_id)
                row.d.id = sqlite3_column_int64(q, 0);
            read_record(q, p->has_row_id ? 1 : 0, p->cols, p->n_cols, &row);
            if (p->emit_anomaly)
                p->emit_anomaly(p->ctx, &row.a);
            else if (p->emit_delivery)
                p->emit_delivery(p->ctx, &row.d);
        }
        if (rc != SQLITE_DONE)
            s = db_error(st, what);
    }
    sqlite3_finalize(q);
    return s;
}

static zt_status run_plan(zt_event_store *st, const char *sql, const stmt_plan *p,
                          const char *what) {
    pthread_mutex_lock(&st->mu);
    zt_status s = run_plan_locked(st, sql, p, what);
    pthread_mutex_unlock(&st->mu);
    return s;
}

/* Keeps a job's newest `keep` rows of a table and deletes the others: a job whose rules fire
 * every step, or whose webhooks all fail, must not grow the state file without end (issue 34).
 * sql deletes the rows of job ?1 older than its ?2-th newest. */
static zt_status trim_locked(zt_event_store *st, const char *sql, const char *job_id, int keep,
                             const char *what) {
    sqlite3_stmt *q = NULL;
    zt_status s = ZT_OK;
    if (sqlite3_prepare_v2(st->db, sql, -1, &q, NULL) != SQLITE_OK ||
        sqlite3_bind_text(q, 1, job_id, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        sqlite3_bind_int(q, 2, keep) != SQLITE_OK || sqlite3_step(q) != SQLITE_DONE)
        s = db_error(st, what);
    sqlite3_finalize(q);
    return s;
}

/* Inserts a row and trims the job's rows to the newest `keep` in one transaction, so no reader,
 * of this connection or another, ever sees keep + 1 rows (a reader between a separate insert and
 * trim did). */
static zt_status add_trimmed(zt_event_store *st, const char *insert_sql, const stmt_plan *p,
                             const char *trim_sql, const char *job_id, int keep,
                             const char *what) {
    pthread_mutex_lock(&st->mu);
    zt_status s = ZT_OK;
    if (sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        s = db_error(st, what);
    } else {
        s = run_plan_locked(st, insert_sql, p, what);
        if (s == ZT_OK)
            s = trim_locked(st, trim_sql, job_id, keep, what);
        if (sqlite3_exec(st->db, s == ZT_OK ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL) !=
                SQLITE_OK && s == ZT_OK)
            s = db_error(st, what);
    }
    pthread_mutex_unlock(&st->mu);
    return s;
}

zt_status zt_event_store_add_anomaly(zt_event_store *st, const char *job_id, const zt_anomaly *a) {
    stmt_plan p = {.cols = anomaly_cols, .n_cols = N_COLS(anomaly_cols), .job_id = job_id,
                   .rec = a};
    return add_trimmed(st,
                       "INSERT OR REPLACE INTO anomalies (job_id, seq, step, time_ms, kind, "
                       "policy, value, zscore, rank, message, json) "
                       "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       &p,
                       "DELETE FROM anomalies WHERE job_id = ?1 AND seq <= (SELECT seq FROM "
                       "anomalies WHERE job_id = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
                       job_id, ZT_EVENT_STORE_ANOMALIES_PER_JOB, "cannot store an anomaly event");
}

zt_status zt_event_store_anomalies(zt_event_store *st, const char *job_id, int64_t after_seq,
                                   int limit, zt_anomaly_fn emit, void *ctx) {
    stmt_plan p = {.cols = anomaly_cols, .n_cols = N_COLS(anomaly_cols), .job_id = job_id,
                   .after = after_seq, .has_after = true, .limit = limit,
                   .emit_anomaly = emit, .ctx = ctx};
    return run_plan(st,
                    "SELECT seq, step, time_ms, kind, policy, value, zscore, rank, message, json "
                    "FROM anomalies WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    &p, "cannot read anomaly events");
}

zt_status zt_event_store_add_delivery(zt_event_store *st, const zt_delivery *d) {
    stmt_plan p = {.cols = delivery_cols, .n_cols = N_COLS(delivery_cols), .rec = d};
    return add_trimmed(st,
                       "INSERT INTO webhook_deliveries (job_id, delivery_id, url, type, attempt, "
                       "time_ms, http_status, error, outcome) VALUES (?,?,?,?,?,?,?,?,?)",
                       &p,
                       "DELETE FROM webhook_deliveries WHERE job_id = ?1 AND id <= (SELECT id "
                       "FROM webhook_deliveries WHERE job_id = ?1 ORDER BY id DESC LIMIT 1 "
                       "OFFSET ?2)",
                       d->job_id, ZT_EVENT_STORE_DELIVERIES_PER_JOB,
                       "cannot record a webhook delivery");
}

zt_status zt_event_store_deliveries(zt_event_store *st, const char *job_id, int limit,
                                    zt_delivery_fn emit, void *ctx) {
    stmt_plan p = {.cols = delivery_cols, .n_cols = N_COLS(delivery_cols), .job_id = job_id,
                   .has_row_id = true, .limit = limit,
                   .emit_delivery = emit, .ctx = ctx};
    return run_plan(st,
                    "SELECT id, job_id, delivery_id, url, type, attempt, time_ms, http_status, "
                    "error, outcome FROM (SELECT * FROM webhook_deliveries WHERE job_id = ? "
                    "ORDER BY id DESC LIMIT ?) ORDER BY id",
                    &p, "cannot read webhook deliveries");
}
