/* The API's operations, one list for both transports, and the scope (auth.h) each needs: the
 * gRPC server names each method's operation, the HTTP server each route's, and both ask this
 * table, so a token is allowed or refused the same whichever way it calls.
 *
 *   read    every query: jobs, metrics, records, logs, the event stream, checkpoints, the
 *           effective config, anomalies, webhook deliveries, exports, the Prometheus scrape,
 *           the OpenAPI document, health (Check and Watch) and server reflection
 *   submit  submitting a job, cancelling one (a submit token only its own: the handlers check)
 *   admin   anything not in this list (an operation added later is admin's until it is said
 *           to be a query) */
#ifndef ZTRAIN_API_OPS_H
#define ZTRAIN_API_OPS_H

#include "auth.h"

typedef enum {
    ZT_OP_OTHER = 0, /* not listed: admin */
    ZT_OP_SUBMIT,
    ZT_OP_CANCEL,
    ZT_OP_GET,
    ZT_OP_LIST,
    ZT_OP_WATCH,
    ZT_OP_METRICS,
    ZT_OP_RECORDS,
    ZT_OP_LOGS,
    ZT_OP_CHECKPOINTS,
    ZT_OP_EFFECTIVE_CONFIG,
    ZT_OP_ANOMALIES,
    ZT_OP_DELIVERIES,
    ZT_OP_EXPORT,     /* HTTP's metrics.csv, metrics.jsonl, tensorboard.tar */
    ZT_OP_PROMETHEUS, /* HTTP's GET /metrics */
    ZT_OP_API_DOC,    /* HTTP's OpenAPI document; gRPC's server reflection */
    ZT_OP_HEALTH,     /* grpc.health.v1.Health Check and Watch */
    ZT_OP_COUNT
} zt_api_op;

/* The scope op needs. */
zt_scope zt_api_op_scope(zt_api_op op);

#endif
