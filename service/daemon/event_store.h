/* The durable side of anomaly events and webhook deliveries: two tables in ztraind's SQLite
 * file (the job store's, job_store.h), through a connection of their own so that the webhook
 * thread writes without the job manager's lock. Every function is thread-safe (one mutex around
 * the connection). */
#ifndef ZTRAIN_EVENT_STORE_H
#define ZTRAIN_EVENT_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "ztrain/status.h"

typedef struct zt_event_store zt_event_store;

/* Rows kept per job: adding one beyond these deletes the job's oldest. */
#define ZT_EVENT_STORE_ANOMALIES_PER_JOB 1000
#define ZT_EVENT_STORE_DELIVERIES_PER_JOB 2000

/* One anomaly event of a job, as the HTTP API and WatchJob show it. `json` is the whole event as
 * one JSON object ({"seq", "train/global_step", "time_unix_ms", "kind", "policy", "value",
 * "zscore", "rank", "message"}); the other fields are taken from it. */
typedef struct {
    int64_t seq, step, time_ms;
    const char *kind, *policy, *message;
    double value, zscore;      /* NaN when none */
    int rank;                  /* -1 when none */
    const char *json;
} zt_anomaly;

/* One attempt to deliver a webhook. outcome: "delivered", "retrying" (another attempt is
 * scheduled), "failed" (the last attempt, given up) or "dropped" (the queue was full). */
typedef struct {
    int64_t id;                /* of the row, increasing */
    const char *job_id;        /* "" for a delivery that concerns no job */
    const char *delivery_id;   /* the same for every attempt of one delivery */
    const char *url;           /* without its query string or user info */
    const char *type;          /* "job.end", "job.failure", "job.event" */
    int attempt;               /* from 1 */
    int64_t time_ms;
    int http_status;           /* 0 when no response came */
    const char *error;         /* "" when the receiver answered 2xx */
    const char *outcome;
} zt_delivery;

/* Opens the tables in the SQLite file at path (creating them). Errors name the file. */
zt_status zt_event_store_open(zt_event_store **out, const char *path);
void zt_event_store_close(zt_event_store *st);

zt_status zt_event_store_add_anomaly(zt_event_store *st, const char *job_id, const zt_anomaly *a);
/* The job's events with seq > after_seq, oldest first, at most limit, through emit (pointers
 * valid during the call). */
typedef void (*zt_anomaly_fn)(void *ctx, const zt_anomaly *a);
zt_status zt_event_store_anomalies(zt_event_store *st, const char *job_id, int64_t after_seq,
                                   int limit, zt_anomaly_fn emit, void *ctx);

zt_status zt_event_store_add_delivery(zt_event_store *st, const zt_delivery *d);
/* The deliveries of a job ("" : those of no job), oldest first, at most the newest `limit`. */
typedef void (*zt_delivery_fn)(void *ctx, const zt_delivery *d);
zt_status zt_event_store_deliveries(zt_event_store *st, const char *job_id, int limit,
                                    zt_delivery_fn emit, void *ctx);

#endif
