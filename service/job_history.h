/* A job's history in ztraind's memory: every metric record (its text, and its values parsed
 * once so that series queries need no JSON parsing) and a ring of the newest log lines. The job
 * manager owns one per job and calls it under its lock; the job store keeps the durable copy. */
#ifndef ZTRAIN_JOB_HISTORY_H
#define ZTRAIN_JOB_HISTORY_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "job_manager.h"

typedef struct zt_job_history zt_job_history;

/* log_ring: how many log lines are kept (older ones are forgotten). */
zt_job_history *zt_history_create(int log_ring);
void zt_history_destroy(zt_job_history *h);

/* Appends a record: `obj` is its parsed form, `text` its JSON. Its step is train/global_step,
 * or `default_step` when the record has none. *out (may be NULL) describes the stored record;
 * its json stays valid until the history is destroyed. */
void zt_history_add_record(zt_job_history *h, const cJSON *obj, const char *text,
                           int64_t time_ms, int64_t default_step, zt_metric_record *out);
int64_t zt_history_n_records(const zt_job_history *h);

/* Series, records and log tails, as zt_jobs_metric_series / _records / _logs describe them. */
void zt_history_series(const zt_job_history *h, const char *const *keys, int n_keys,
                       int64_t since_step, int max_points, zt_series_fn emit, void *ctx);
void zt_history_records(const zt_job_history *h, int64_t since_step, zt_record_fn emit,
                        void *ctx);

/* Stores a copy of the line; its seq must be zt_history_next_seq() or later. */
void zt_history_add_log(zt_job_history *h, const zt_log_line *l);
int64_t zt_history_next_seq(const zt_job_history *h);
/* How many lines the ring holds, and in *first_seq the seq of the oldest (0 when none): older
 * lines are only in the job store. */
int zt_history_log_count(const zt_job_history *h, int64_t *first_seq);
/* The newest `tail` lines (all when tail < 0), oldest first. */
void zt_history_logs(const zt_job_history *h, int tail, zt_log_fn emit, void *ctx);

#endif
