/* The JSON that ztraind's HTTP API speaks beside its messages: metric series and the export's
 * records, written with api/json_writer.h. Pure functions (no I/O, no locks, no clock), so the
 * request handlers, the event stream (whose encoder runs under the job manager's lock) and the
 * tests share one encoding. API resources go through api/proto_json.h, which the CLI shares. */
#ifndef ZTRAIN_HTTP_JSON_H
#define ZTRAIN_HTTP_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/json_writer.h"
#include "ztrain/checkpoint.h"
#include "daemon/job_manager.h"

/* One MetricSeries as its proto3 JSON (api/proto_json.h): {"key","steps":["1",...],"values":[...]},
 * written directly rather than through a message because series are the API's largest bodies. */
void zt_json_series(zt_jbuf *b, const char *key, const int64_t *steps, const double *values,
                    int n);
/* One line of the metrics.jsonl export: {"step","time_unix_ms","values":<the record's own
 * object>}, the record as the ranks wrote it (the API's /records carries MetricRecord). */
void zt_json_record(zt_jbuf *b, const zt_metric_record *r);

#endif
