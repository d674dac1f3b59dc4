/* The job store: ztraind's durable state in one SQLite file (WAL). Jobs with their specs,
 * states, reasons and ranks' exits; every metric record; the log tail of every job. A daemon
 * killed at any moment restarts with all of it: each write is its own transaction, and WAL with
 * synchronous=NORMAL survives a process crash (a power loss may lose the last commits, never
 * corrupt the file).
 *
 * Not thread-safe: the job manager calls it under its own lock. */
#ifndef ZTRAIN_JOB_STORE_H
#define ZTRAIN_JOB_STORE_H

#include "job_manager.h"
#include "ztrain/status.h"

typedef struct zt_job_store zt_job_store;

/* Opens or creates path (and its schema). Errors name the file. */
zt_status zt_store_open(zt_job_store **out, const char *path);
void zt_store_close(zt_job_store *st);

/* Writes the job's row whole (insert or replace): state, reason, times, ranks, spec. */
zt_status zt_store_put_job(zt_job_store *st, const zt_job_info *j);
zt_status zt_store_add_record(zt_job_store *st, const char *job_id, const zt_metric_record *r);
/* Appends a log line and keeps only the newest `keep` lines of the job. */
zt_status zt_store_add_log(zt_job_store *st, const char *job_id, const zt_log_line *l, int keep);

/* The newest `limit` log lines of the job whose seq is below before_seq, oldest first, through
 * emit (the line is valid during the call only). */
zt_status zt_store_logs(zt_job_store *st, const char *job_id, int64_t before_seq, int limit,
                        zt_log_fn emit, void *ctx);

/* Calls back for every job (oldest first), then for each job its records in order and its last
 * log_tail lines in order. Pointers are valid during the call only. */
typedef struct {
    void (*job)(void *ctx, const zt_job_info *j);
    void (*record)(void *ctx, const char *job_id, const zt_metric_record *r);
    void (*log)(void *ctx, const char *job_id, const zt_log_line *l);
} zt_store_loader;
zt_status zt_store_load(zt_job_store *st, int log_tail, const zt_store_loader *cb, void *ctx);

/* The largest job number ever given out (the "42" of job-000042), 0 for a new store. */
zt_status zt_store_max_job_number(zt_job_store *st, long long *n);

#endif
