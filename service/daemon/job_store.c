/* SQLite persistence of jobs, metric records and log tails (job_store.h). */
#include "job_store.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/comm.h"

/* Records are numbered per job (seq, from 1) in the order they came: the number is what a reader
 * pages by and what tells the store's part of a history from the job manager's recent records.
 * The indexes follow the migration (migrate_records), which adds seq to an older file. */
static const char schema[] =
    "CREATE TABLE IF NOT EXISTS jobs ("
    "  number INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, name TEXT NOT NULL,"
    "  state INTEGER NOT NULL, reason TEXT NOT NULL, spec_json TEXT NOT NULL,"
    "  idempotency_key TEXT NOT NULL, world_size INTEGER NOT NULL, device TEXT NOT NULL,"
    "  created_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL, finished_ms INTEGER NOT NULL,"
    "  max_steps INTEGER NOT NULL, ranks_json TEXT NOT NULL, run_dir TEXT NOT NULL,"
    "  checkpoint_dir TEXT NOT NULL, submitter TEXT NOT NULL DEFAULT '',"
    "  submitter_scope TEXT NOT NULL DEFAULT '');"
    "CREATE TABLE IF NOT EXISTS records ("
    "  job INTEGER NOT NULL, step INTEGER NOT NULL, time_ms INTEGER NOT NULL, json TEXT NOT NULL,"
    "  seq INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS logs ("
    "  job INTEGER NOT NULL, seq INTEGER NOT NULL, time_ms INTEGER NOT NULL, rank INTEGER NOT NULL,"
    "  stream TEXT NOT NULL, text TEXT NOT NULL, PRIMARY KEY (job, seq));"
    /* One row per start of a job's ranks (zt_job_attempt), written when it starts and again
     * when it ends. */
    "CREATE TABLE IF NOT EXISTS attempts ("
    "  job INTEGER NOT NULL, attempt INTEGER NOT NULL, started_ms INTEGER NOT NULL,"
    "  ended_ms INTEGER NOT NULL, step INTEGER NOT NULL, resumed_from_step INTEGER NOT NULL,"
    "  rank INTEGER NOT NULL, exit_code INTEGER NOT NULL, signal INTEGER NOT NULL,"
    "  failed INTEGER NOT NULL, reason TEXT NOT NULL, PRIMARY KEY (job, attempt));";

/* A job's records are read in the order they came, which is their seq: a restart
 * (max_restarts) runs the steps after its checkpoint again, and an eval step has two records, so
 * neither a step nor (step, seq) names a place in the history that a reader can go on from.
 * step is in the key so that a reader filtering by step (since_step) reads the index only. */
static const char indexes[] =
    "CREATE INDEX IF NOT EXISTS records_by_job_seq ON records (job, seq, step);"
    "DROP INDEX IF EXISTS records_by_job_step;"
    "DROP INDEX IF EXISTS records_by_job;";

/* A file written before records were numbered: each job's records get 1, 2, ... in the order
 * they were inserted (rowid), in one transaction. */
static const char migrate_sql[] =
    "BEGIN IMMEDIATE;"
    "ALTER TABLE records ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;"
    "UPDATE records SET seq = numbered.n FROM (SELECT rowid AS id, row_number() OVER"
    "  (PARTITION BY job ORDER BY rowid) AS n FROM records) AS numbered"
    "  WHERE records.rowid = numbered.id;"
    "COMMIT;";

/* A file written before jobs recorded their submitter: the columns are added, empty. */
static const char migrate_submitter_sql[] =
    "BEGIN IMMEDIATE;"
    "ALTER TABLE jobs ADD COLUMN submitter TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE jobs ADD COLUMN submitter_scope TEXT NOT NULL DEFAULT '';"
    "COMMIT;";

enum { PUT_JOB, ADD_RECORD, ADD_LOG, TRIM_LOG, LAST_RECORDS, READ_LOGS, PUT_ATTEMPT, N_STMTS };
static const char *const stmt_sql[N_STMTS] = {
    [PUT_JOB] = "INSERT OR REPLACE INTO jobs VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11,"
                " ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
    [ADD_RECORD] = "INSERT INTO records (job, seq, step, time_ms, json)"
                   " VALUES (?1, ?2, ?3, ?4, ?5)",
    [ADD_LOG] = "INSERT INTO logs VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [TRIM_LOG] = "DELETE FROM logs WHERE job = ?1 AND seq <= ?2",
    [LAST_RECORDS] = "SELECT seq, step, time_ms, json FROM records WHERE job = ?1"
                     " ORDER BY seq DESC LIMIT ?2",
    /* The newest lines below a seq, walking the (job, seq) key backwards, then put in order. */
    [READ_LOGS] = "SELECT seq, time_ms, rank, stream, text FROM (SELECT * FROM logs WHERE job = ?1"
                  " AND seq < ?2 ORDER BY seq DESC LIMIT ?3) ORDER BY seq",
    [PUT_ATTEMPT] = "INSERT OR REPLACE INTO attempts VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9,"
                    " ?10, ?11)",
};

/* The reader's one statement: a page of a job's history in the order they came (seq), after a record and from a step. */
static const char read_sql[] =
    "SELECT seq, step, time_ms, json FROM records WHERE job = ?1 AND seq > ?3 AND seq < ?4"
    " AND step >= ?2 ORDER BY seq LIMIT ?5";

struct zt_job_store {
    sqlite3 *db;
    char *path;
    sqlite3_stmt *stmt[N_STMTS];
    /* The history's readers: their own connection (WAL lets it read while db writes), used by
     * one thread at a time under rd_mu, which nothing else is held under. */
    pthread_mutex_t rd_mu;
    sqlite3 *rd;
    sqlite3_stmt *rd_stmt;
};

static zt_status conn_error(zt_job_store *st, sqlite3 *db, const char *what) {
    return zt_error(ZT_ERR_IO, "%s: %s: %s", st->path, what, sqlite3_errmsg(db));
}

static zt_status db_error(zt_job_store *st, const char *what) {
    return conn_error(st, st->db, what);
}

/* "job-000042" -> 42; the number is the row's key, so rows sort by age. */
static long long job_number(const char *id) {
    const char *digits = strchr(id, '-');
    return digits ? atoll(digits + 1) : 0;
}

static zt_status migrate_jobs(zt_job_store *st) {
    sqlite3_stmt *probe = NULL;
    bool has = sqlite3_prepare_v2(st->db, "SELECT submitter FROM jobs LIMIT 0", -1, &probe,
                                  NULL) == SQLITE_OK;
    sqlite3_finalize(probe);
    if (has)
        return ZT_OK;
    if (sqlite3_exec(st->db, migrate_submitter_sql, NULL, NULL, NULL) == SQLITE_OK)
        return ZT_OK;
    zt_status s = db_error(st, "cannot add the submitter to the jobs of an older state file");
    sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    return s;
}

static zt_status migrate_records(zt_job_store *st) {
    sqlite3_stmt *probe = NULL;
    bool numbered = sqlite3_prepare_v2(st->db, "SELECT seq FROM records LIMIT 0", -1, &probe,
                                       NULL) == SQLITE_OK;
    sqlite3_finalize(probe);
    if (numbered)
        return ZT_OK;
    if (sqlite3_exec(st->db, migrate_sql, NULL, NULL, NULL) == SQLITE_OK)
        return ZT_OK;
    zt_status s = db_error(st, "cannot number the metric records of an older state file");
    sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    return s;
}

/* Opens one connection to the file, as ztraind uses them: WAL, so that readers never block the
 * writer and a killed process loses nothing committed, and a wait for a lock held elsewhere. */
static zt_status open_conn(zt_job_store *st, sqlite3 **db) {
    if (sqlite3_open_v2(st->path, db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                          SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK)
        return conn_error(st, *db, "cannot open");
    if (sqlite3_exec(*db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                          "PRAGMA busy_timeout=5000;", NULL, NULL, NULL) != SQLITE_OK)
        return conn_error(st, *db, "cannot set WAL mode");
    return ZT_OK;
}

zt_status zt_store_open(zt_job_store **out, const char *path) {
    zt_job_store *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&st->rd_mu, NULL);
    zt_status s = open_conn(st, &st->db);
    if (s == ZT_OK && sqlite3_exec(st->db, schema, NULL, NULL, NULL) != SQLITE_OK)
        s = db_error(st, "cannot create the schema");
    if (s == ZT_OK)
        s = migrate_records(st);
    if (s == ZT_OK)
        s = migrate_jobs(st);
    if (s == ZT_OK && sqlite3_exec(st->db, indexes, NULL, NULL, NULL) != SQLITE_OK)
        s = db_error(st, "cannot index the metric records");
    for (int i = 0; s == ZT_OK && i < N_STMTS; i++)
        if (sqlite3_prepare_v3(st->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &st->stmt[i],
                               NULL) != SQLITE_OK)
            s = db_error(st, "cannot prepare a statement (is this a ztraind state file?)");
    if (s == ZT_OK)
        s = open_conn(st, &st->rd);
    if (s == ZT_OK && (sqlite3_exec(st->rd, "PRAGMA query_only=1", NULL, NULL, NULL) != SQLITE_OK ||
                       sqlite3_prepare_v3(st->rd, read_sql, -1, SQLITE_PREPARE_PERSISTENT,
                                          &st->rd_stmt, NULL) != SQLITE_OK))
        s = conn_error(st, st->rd, "cannot prepare the history reader");
    if (s != ZT_OK) {
        zt_store_close(st);
        return s;
    }
    *out = st;
    return ZT_OK;
}

void zt_store_close(zt_job_store *st) {
    if (!st)
        return;
    for (int i = 0; i < N_STMTS; i++)
        sqlite3_finalize(st->stmt[i]);
    sqlite3_finalize(st->rd_stmt);
    sqlite3_close(st->rd);
    sqlite3_close(st->db);
    pthread_mutex_destroy(&st->rd_mu);
    free(st->path);
    free(st);
}

static zt_status run(zt_job_store *st, sqlite3_stmt *stmt, const char *what) {
    int rc = sqlite3_step(stmt);
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    return rc == SQLITE_DONE ? ZT_OK : db_error(st, what);
}

static char *ranks_to_json(const zt_job_info *j) {
    cJSON *arr = cJSON_CreateArray();
    for (int r = 0; arr && r < j->world_size; r++) {
        const zt_rank_info *ri = &j->ranks[r];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "pid", ri->pid);
        cJSON_AddBoolToObject(o, "running", ri->running);
        cJSON_AddNumberToObject(o, "exit_code", ri->exit_code);
        cJSON_AddNumberToObject(o, "signal", ri->signal);
        if (ri->exit_unknown)
            cJSON_AddBoolToObject(o, "exit_unknown", true);
        cJSON_AddItemToArray(arr, o);
    }
    char *text = arr ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    return text;
}

static void ranks_from_json(zt_job_info *j, const char *text) {
    cJSON *arr = cJSON_Parse(text);
    for (int r = 0; r < j->world_size; r++) {
        cJSON *o = cJSON_GetArrayItem(arr, r);
        zt_rank_info *ri = &j->ranks[r];
        ri->rank = r;
        if (!o)
            continue;
        ri->pid = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "pid"));
        ri->running = cJSON_IsTrue(cJSON_GetObjectItem(o, "running"));
        ri->exit_code = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "exit_code"));
        ri->signal = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "signal"));
        ri->exit_unknown = cJSON_IsTrue(cJSON_GetObjectItem(o, "exit_unknown"));
    }
    cJSON_Delete(arr);
}

zt_status zt_store_put_job(zt_job_store *st, const zt_job_info *j) {
    char *ranks = ranks_to_json(j);
    if (!ranks)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    sqlite3_stmt *q = st->stmt[PUT_JOB];
    sqlite3_bind_int64(q, 1, job_number(j->id));
    sqlite3_bind_text(q, 2, j->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, j->name, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 4, j->state);
    sqlite3_bind_text(q, 5, j->reason, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 6, j->spec_json, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 7, j->idempotency_key, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 8, j->world_size);
    sqlite3_bind_text(q, 9, j->device, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 10, j->created_ms);
    sqlite3_bind_int64(q, 11, j->started_ms);
    sqlite3_bind_int64(q, 12, j->finished_ms);
    sqlite3_bind_int64(q, 13, j->max_steps);
    sqlite3_bind_text(q, 14, ranks, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 15, j->run_dir, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 16, j->checkpoint_dir, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 17, j->submitter.identity, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 18, j->submitter.scope, -1, SQLITE_STATIC);
    zt_status s = run(st, q, "cannot write a job");
    free(ranks);
    return s;
}

zt_status zt_store_add_record(zt_job_store *st, const char *job_id, const zt_metric_record *r) {
    sqlite3_stmt *q = st->stmt[ADD_RECORD];
    sqlite3_bind_int64(q, 1, job_number(job_id));
    sqlite3_bind_int64(q, 2, r->seq);
    sqlite3_bind_int64(q, 3, r->step);
    sqlite3_bind_int64(q, 4, r->time_ms);
    sqlite3_bind_text(q, 5, r->json, -1, SQLITE_STATIC);
    return run(st, q, "cannot write a metric record");
}

zt_status zt_store_add_log(zt_job_store *st, const char *job_id, const zt_log_line *l, int keep) {
    sqlite3_stmt *q = st->stmt[ADD_LOG];
    long long job = job_number(job_id);
    sqlite3_bind_int64(q, 1, job);
    sqlite3_bind_int64(q, 2, l->seq);
    sqlite3_bind_int64(q, 3, l->time_ms);
    sqlite3_bind_int(q, 4, l->rank);
    sqlite3_bind_text(q, 5, l->stream, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 6, l->text, -1, SQLITE_STATIC);
    ZT_TRY(run(st, q, "cannot write a log line"));
    /* Trimming in batches keeps the table near `keep` lines per job at a tenth of the cost. */
    int batch = keep / 10 > 0 ? keep / 10 : 1;
    if (l->seq > keep && l->seq % batch == 0) {
        q = st->stmt[TRIM_LOG];
        sqlite3_bind_int64(q, 1, job);
        sqlite3_bind_int64(q, 2, l->seq - keep);
        ZT_TRY(run(st, q, "cannot trim the log"));
    }
    return ZT_OK;
}

static const char *col_text(sqlite3_stmt *q, int i) {
    const unsigned char *t = sqlite3_column_text(q, i);
    return t ? (const char *)t : "";
}

zt_status zt_store_logs(zt_job_store *st, const char *job_id, int64_t before_seq, int limit,
                        zt_log_fn emit, void *ctx) {
    sqlite3_stmt *q = st->stmt[READ_LOGS];
    sqlite3_bind_int64(q, 1, job_number(job_id));
    sqlite3_bind_int64(q, 2, before_seq);
    sqlite3_bind_int(q, 3, limit);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        zt_log_line l = {.seq = sqlite3_column_int64(q, 0), .time_ms = sqlite3_column_int64(q, 1),
                         .rank = sqlite3_column_int(q, 2), .stream = col_text(q, 3),
                         .text = col_text(q, 4)};
        emit(ctx, &l);
    }
    sqlite3_reset(q);
    sqlite3_clear_bindings(q);
    return rc == SQLITE_DONE ? ZT_OK : db_error(st, "cannot read logs");
}

/* The transport a stored job's ranks use, from its spec (the column-less field of zt_job_info):
 * its "comm", or auto's choice for its "nodes". */
static void comm_of_spec(const char *spec_json, char *out, size_t size) {
    cJSON *top = cJSON_Parse(spec_json);
    const cJSON *comm = cJSON_GetObjectItemCaseSensitive(top, "comm");
    const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(top, "nodes");
    zt_comm_choice choice = ZT_COMM_AUTO;
    if (cJSON_IsString(comm))
        zt_comm_choice_parse(comm->valuestring, &choice);
    snprintf(out, size, "%s",
             zt_comm_for_nodes(choice, cJSON_IsNumber(nodes) ? nodes->valueint : 1));
    cJSON_Delete(top);
}

static zt_status load_jobs(zt_job_store *st, const zt_store_loader *cb, void *ctx) {
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(st->db, "SELECT * FROM jobs ORDER BY number", -1, &q, NULL) != SQLITE_OK)
        return db_error(st, "cannot read jobs");
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        zt_job_info j = {0};
        snprintf(j.id, sizeof j.id, "%s", col_text(q, 1));
        j.name = (char *)col_text(q, 2);
        j.state = (zt_job_state)sqlite3_column_int(q, 3);
        j.reason = (char *)col_text(q, 4);
        j.spec_json = (char *)col_text(q, 5);
        j.idempotency_key = (char *)col_text(q, 6);
        j.world_size = sqlite3_column_int(q, 7);
        snprintf(j.device, sizeof j.device, "%s", col_text(q, 8));
        comm_of_spec(j.spec_json, j.comm, sizeof j.comm);
        j.grid = zt_grid_of_spec_json(j.spec_json);
        j.created_ms = sqlite3_column_int64(q, 9);
        j.started_ms = sqlite3_column_int64(q, 10);
        j.finished_ms = sqlite3_column_int64(q, 11);
        j.max_steps = sqlite3_column_int64(q, 12);
        j.run_dir = (char *)col_text(q, 14);
        j.checkpoint_dir = (char *)col_text(q, 15);
        snprintf(j.submitter.identity, sizeof j.submitter.identity, "%s", col_text(q, 16));
        snprintf(j.submitter.scope, sizeof j.submitter.scope, "%s", col_text(q, 17));
        if (j.world_size < 1 || j.world_size > 1 << 16)
            continue;
        j.ranks = calloc((size_t)j.world_size, sizeof *j.ranks);
        if (!j.ranks)
            break;
        ranks_from_json(&j, col_text(q, 13));
        cb->job(ctx, &j);
        free(j.ranks);
    }
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? ZT_OK : db_error(st, "cannot read jobs");
}

static zt_status load_logs(zt_job_store *st, int tail, const zt_store_loader *cb, void *ctx) {
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(st->db,
                           "SELECT jobs.id, seq, time_ms, rank, stream, text FROM logs JOIN jobs "
                           "ON jobs.number = logs.job WHERE seq > (SELECT MAX(seq) FROM logs l2 "
                           "WHERE l2.job = logs.job) - ?1 ORDER BY logs.job, seq",
                           -1, &q, NULL) != SQLITE_OK)
        return db_error(st, "cannot read logs");
    sqlite3_bind_int(q, 1, tail);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        zt_log_line l = {.seq = sqlite3_column_int64(q, 1), .time_ms = sqlite3_column_int64(q, 2),
                         .rank = sqlite3_column_int(q, 3), .stream = col_text(q, 4),
                         .text = col_text(q, 5)};
        cb->log(ctx, col_text(q, 0), &l);
    }
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? ZT_OK : db_error(st, "cannot read logs");
}

static zt_status load_attempts(zt_job_store *st, const zt_store_loader *cb, void *ctx) {
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(st->db,
                           "SELECT jobs.id, a.attempt, a.started_ms, a.ended_ms, a.step,"
                           " a.resumed_from_step, a.rank, a.exit_code, a.signal, a.failed,"
                           " a.reason FROM attempts AS a JOIN jobs ON jobs.number = a.job"
                           " ORDER BY a.job, a.attempt",
                           -1, &q, NULL) != SQLITE_OK)
        return db_error(st, "cannot read the jobs' attempts");
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        zt_job_attempt a = {.attempt = sqlite3_column_int(q, 1),
                            .started_ms = sqlite3_column_int64(q, 2),
                            .ended_ms = sqlite3_column_int64(q, 3),
                            .step = sqlite3_column_int64(q, 4),
                            .resumed_from_step = sqlite3_column_int64(q, 5),
                            .rank = sqlite3_column_int(q, 6), .exit_code = sqlite3_column_int(q, 7),
                            .signal = sqlite3_column_int(q, 8),
                            .failed = sqlite3_column_int(q, 9) != 0,
                            .reason = (char *)col_text(q, 10)};
        cb->attempt(ctx, col_text(q, 0), &a);
    }
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? ZT_OK : db_error(st, "cannot read the jobs' attempts");
}

zt_status zt_store_load(zt_job_store *st, int log_tail, const zt_store_loader *cb, void *ctx) {
    ZT_TRY(load_jobs(st, cb, ctx));
    if (cb->attempt)
        ZT_TRY(load_attempts(st, cb, ctx));
    return load_logs(st, log_tail, cb, ctx);
}

zt_status zt_store_put_attempt(zt_job_store *st, const char *job_id, const zt_job_attempt *a) {
    sqlite3_stmt *q = st->stmt[PUT_ATTEMPT];
    sqlite3_bind_int64(q, 1, job_number(job_id));
    sqlite3_bind_int(q, 2, a->attempt);
    sqlite3_bind_int64(q, 3, a->started_ms);
    sqlite3_bind_int64(q, 4, a->ended_ms);
    sqlite3_bind_int64(q, 5, a->step);
    sqlite3_bind_int64(q, 6, a->resumed_from_step);
    sqlite3_bind_int(q, 7, a->rank);
    sqlite3_bind_int(q, 8, a->exit_code);
    sqlite3_bind_int(q, 9, a->signal);
    sqlite3_bind_int(q, 10, a->failed);
    sqlite3_bind_text(q, 11, a->reason ? a->reason : "", -1, SQLITE_STATIC);
    return run(st, q, "cannot write a job's attempt");
}

/* A record of the current row of q (seq, step, time_ms, json): valid until q moves on. */
static zt_metric_record row_record(sqlite3_stmt *q) {
    return (zt_metric_record){.seq = sqlite3_column_int64(q, 0),
                              .step = sqlite3_column_int64(q, 1),
                              .time_ms = sqlite3_column_int64(q, 2), .json = col_text(q, 3)};
}

zt_status zt_store_last_records(zt_job_store *st, const char *job_id, int limit,
                                zt_record_fn emit, void *ctx) {
    sqlite3_stmt *q = st->stmt[LAST_RECORDS];
    sqlite3_bind_int64(q, 1, job_number(job_id));
    sqlite3_bind_int(q, 2, limit);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        zt_metric_record r = row_record(q);
        emit(ctx, &r);
    }
    sqlite3_reset(q);
    sqlite3_clear_bindings(q);
    return rc == SQLITE_DONE ? ZT_OK : db_error(st, "cannot read metric records");
}

zt_status zt_store_read_records(zt_job_store *st, const char *job_id, int64_t since_step,
                                int64_t after_seq, int64_t before_seq, int limit,
                                zt_record_fn emit, void *ctx, int *n) {
    *n = 0;
    pthread_mutex_lock(&st->rd_mu);
    sqlite3_stmt *q = st->rd_stmt;
    sqlite3_bind_int64(q, 1, job_number(job_id));
    sqlite3_bind_int64(q, 2, since_step);
    sqlite3_bind_int64(q, 3, after_seq);
    sqlite3_bind_int64(q, 4, before_seq);
    sqlite3_bind_int(q, 5, limit);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        zt_metric_record r = row_record(q);
        emit(ctx, &r);
        (*n)++;
    }
    zt_status s = rc == SQLITE_DONE ? ZT_OK : conn_error(st, st->rd, "cannot read metric records");
    sqlite3_reset(q);
    sqlite3_clear_bindings(q);
    pthread_mutex_unlock(&st->rd_mu);
    return s;
}

zt_status zt_store_max_job_number(zt_job_store *st, long long *n) {
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(st->db, "SELECT COALESCE(MAX(number), 0) FROM jobs", -1, &q, NULL) !=
        SQLITE_OK)
        return db_error(st, "cannot read jobs");
    zt_status s = sqlite3_step(q) == SQLITE_ROW ? ZT_OK : db_error(st, "cannot read jobs");
    *n = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return s;
}
