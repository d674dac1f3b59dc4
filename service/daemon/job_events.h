/* The job manager's anomaly events and alerts (internal to the job manager's files, as
 * job_manager_internal.h): the events a job's rank 0 reports and the stalls ztraind sees itself,
 * kept on the job (memory for watchers, the event store for the API), told to watchers, and
 * turned into webhook deliveries with the job's end and failure. Every function is called with
 * the manager's lock held, but for open and close. */
#ifndef ZTRAIN_JOB_EVENTS_H
#define ZTRAIN_JOB_EVENTS_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "job_manager.h"

struct job;
struct zt_jobs;

/* The anomaly events a watcher is replayed: a job's newest ones stay in memory. */
#define ZT_JOB_ANOMALIES_KEPT 1000

/* Opens the event store (the manager's SQLite file), starts the webhook thread and loads every
 * job's events. */
zt_status zt_jm_events_open(struct zt_jobs *jm);
/* Stops the webhook thread (what waits is dropped, recorded so) and closes the store. */
void zt_jm_events_close(struct zt_jobs *jm);
void zt_jm_job_events_free(struct job *j);

/* A {"event": "anomaly", ...} line from the job's rank 0 (ztrain/anomaly.h's format). */
void zt_jm_anomaly_line(struct zt_jobs *jm, struct job *j, const cJSON *obj);
/* The job made progress (a metric record or any line of its rank 0): a stall ends. */
void zt_jm_job_progress(struct job *j);
/* From the supervisor's tick: a RUNNING job whose spec has events.stall and that has reported
 * nothing for its seconds gets a stall event (once until it reports again). */
void zt_jm_check_stalls(struct zt_jobs *jm);
/* From zt_jm_set_state, when the job has reached a terminal state: its webhooks. */
void zt_jm_job_ended(struct zt_jobs *jm, struct job *j);
/* The job's kept events with seq > after_seq, oldest first, as ZT_EVENT_ANOMALY events. */
void zt_jm_replay_anomalies(struct job *j, int64_t after_seq, zt_job_event_fn fn, void *ctx);

#endif
