/* The job store: ztraind's durable state in one SQLite file (WAL). Jobs with their specs,
 * states, reasons and ranks' exits; every metric record, numbered per job; the log tail of every
 * job. A daemon killed at any moment restarts with all of it: each write is its own transaction,
 * and WAL with synchronous=NORMAL survives a process crash (a power loss may lose the last
 * commits, never corrupt the file). The store is also where a job's metric history is read
 * from: the job manager keeps only its newest records in memory.
 *
 * Thread safety: writing and loading are not thread-safe (the job manager calls them under its
 * own lock); zt_store_read_records may be called from any thread at any time, with or without
 * that lock: it reads through a second connection of its own. */
#ifndef ZTRAIN_JOB_STORE_H
#define ZTRAIN_JOB_STORE_H

#include "job_manager.h"
#include "ztrain/status.h"

typedef struct zt_job_store zt_job_store;

/* Opens or creates path (and its schema). A file of an older ztraind, whose records have no
 * numbers, gets them (in the order they were written) before anything else. Errors name the
 * file. */
zt_status zt_store_open(zt_job_store **out, const char *path);
void zt_store_close(zt_job_store *st);

/* Writes the job's row whole (insert or replace): state, reason, times, ranks, spec. */
zt_status zt_store_put_job(zt_job_store *st, const zt_job_info *j);
/* Appends a record; r->seq is its number within the job (1, 2, ...), which the caller keeps. */
zt_status zt_store_add_record(zt_job_store *st, const char *job_id, const zt_metric_record *r);
/* Appends a log line and keeps only the newest `keep` lines of the job. */
zt_status zt_store_add_log(zt_job_store *st, const char *job_id, const zt_log_line *l, int keep);

/* The newest `limit` log lines of the job whose seq is below before_seq, oldest first, through
 * emit (the line is valid during the call only). */
zt_status zt_store_logs(zt_job_store *st, const char *job_id, int64_t before_seq, int limit,
                        zt_log_fn emit, void *ctx);

/* Writes one attempt of the job's ranks whole (insert or replace, keyed by its number). */
zt_status zt_store_put_attempt(zt_job_store *st, const char *job_id, const zt_job_attempt *a);

/* Calls back for every job (oldest first), then for each job its last log_tail lines in order.
 * Metric records are not loaded: zt_store_last_records gives the newest ones, and readers read
 * the rest when asked. Pointers are valid during the call only. */
typedef struct {
    void (*job)(void *ctx, const zt_job_info *j);
    void (*log)(void *ctx, const char *job_id, const zt_log_line *l);
    /* Each job's attempts, in order, after every job and before the log lines; may be NULL. */
    void (*attempt)(void *ctx, const char *job_id, const zt_job_attempt *a);
} zt_store_loader;
zt_status zt_store_load(zt_job_store *st, int log_tail, const zt_store_loader *cb, void *ctx);

/* The job's newest `limit` records (by seq: the last to come), newest first, through emit (pointers valid during the call):
 * what a restarted daemon needs of a job's history (its last step, loss and values). */
zt_status zt_store_last_records(zt_job_store *st, const char *job_id, int limit,
                                zt_record_fn emit, void *ctx);

/* One page of a job's history: its records with step >= since_step and after_seq < seq <
 * before_seq, in the order they came (by seq: a restart's records of steps run again, and an
 * eval step's second record, follow the ones before them), at most `limit`; *n says how many.
 * To read on, call again with the same since_step and after_seq the last record's seq. emit runs on the caller's thread with the reader's own mutex held (pointers are
 * valid during the call only): it must not call back into the store. Any thread. */
zt_status zt_store_read_records(zt_job_store *st, const char *job_id, int64_t since_step,
                                int64_t after_seq, int64_t before_seq, int limit,
                                zt_record_fn emit, void *ctx, int *n);

/* The largest job number ever given out (the "42" of job-000042), 0 for a new store. */
zt_status zt_store_max_job_number(zt_job_store *st, long long *n);

#endif
