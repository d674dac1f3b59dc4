/* A job's history in ztraind's memory, bounded whatever the job's length: its newest metric
 * records (a ring, for watchers and queries of the recent past; the job store has every record
 * and serves the rest), the value each metric key had at the job's last step, and a ring of the
 * newest log lines. The job manager owns one per job and calls it under its lock. */
#ifndef ZTRAIN_JOB_HISTORY_H
#define ZTRAIN_JOB_HISTORY_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "job_manager.h"

typedef struct zt_job_history zt_job_history;

/* log_ring: how many log lines are kept; record_cache: how many of the newest metric records
 * (older ones are forgotten, and the ring is only allocated with the first record). */
zt_job_history *zt_history_create(int log_ring, int record_cache);
void zt_history_destroy(zt_job_history *h);

/* Appends a record, numbered n_records + 1: `obj` is its parsed form, `text` its JSON. Its step
 * is train/global_step, or `default_step` when the record has none, and its numbers become the
 * last values of their keys. *out (may be NULL) describes the record; its json stays valid
 * while the record is in the ring: until record_cache more have come, or
 * zt_history_drop_records, or the history is destroyed. */
void zt_history_add_record(zt_job_history *h, const cJSON *obj, const char *text,
                           int64_t time_ms, int64_t default_step, zt_metric_record *out);
/* Takes a stored record back after a restart (oldest first): it counts towards n_records and
 * its values towards the last ones, but it is not kept in the ring. */
void zt_history_restore_record(zt_job_history *h, const cJSON *obj, int64_t seq, int64_t step);
/* Records the job has had (the number of the newest one). */
int64_t zt_history_n_records(const zt_job_history *h);
/* The number of the oldest record in the ring, n_records + 1 when it is empty: the records
 * numbered below it are only in the job store. */
int64_t zt_history_first_cached(const zt_job_history *h);
/* Calls emit for each record in the ring with step >= since_step and seq > after_seq, oldest
 * first (the pointers are the ring's: copy what outlives the caller's lock). */
void zt_history_cached_records(const zt_job_history *h, int64_t since_step, int64_t after_seq,
                               zt_record_fn emit, void *ctx);
/* Forgets the ring (a job that has ended is read from the store); the last values stay. */
void zt_history_drop_records(zt_job_history *h);
/* Whether a record of the job has had `key`, and in *value the value of the newest record that
 * has it, whatever its step (an eval-only record leaves the train keys as they were): NaN when
 * that record had null, a value that was not finite, and when no record has had the key. */
bool zt_history_last_value(const zt_job_history *h, const char *key, double *value);

/* Stores a copy of the line; its seq must be zt_history_next_seq() or later. */
void zt_history_add_log(zt_job_history *h, const zt_log_line *l);
int64_t zt_history_next_seq(const zt_job_history *h);
/* How many lines the ring holds, and in *first_seq the seq of the oldest (0 when none): older
 * lines are only in the job store. */
int zt_history_log_count(const zt_job_history *h, int64_t *first_seq);
/* The newest `tail` lines (all when tail < 0), oldest first. */
void zt_history_logs(const zt_job_history *h, int tail, zt_log_fn emit, void *ctx);

#endif
