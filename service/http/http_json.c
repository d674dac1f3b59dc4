/* JSON encodings of the HTTP API (http_json.h) that are not messages: the metric series of the
 * API (MetricSeries, by hand for speed) and the records of the JSONL export. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "http_json.h"

static void member_int(zt_jbuf *b, const char *key, int64_t v) {
    zt_json_key(b, key);
    zt_json_int(b, v);
}

void zt_json_series(zt_jbuf *b, const char *key, const int64_t *steps, const double *values,
                    int n) {
    /* Roughly 10 bytes a step and 20 a value: one reservation instead of many regrowths. */
    zt_jbuf_reserve(b, strlen(key) + 40 + (size_t)(n > 0 ? n : 0) * 32);
    zt_json_open(b, '{');
    zt_json_key(b, "key");
    zt_json_str(b, key);
    /* The proto3 JSON mapping of MetricSeries, written by hand because a series response holds
     * thousands of numbers: int64 steps as strings, NaN as "NaN", empty lists left out. */
    if (n > 0) {
        zt_json_key(b, "steps");
        zt_json_open(b, '[');
        for (int i = 0; i < n; i++) {
            char text[24];
            int len = snprintf(text, sizeof text, "%" PRId64, steps[i]);
            zt_json_strn(b, text, (size_t)len);
        }
        zt_json_close(b, ']');
        zt_json_key(b, "values");
        zt_json_open(b, '[');
        for (int i = 0; i < n; i++) {
            if (isnan(values[i]))
                zt_json_str(b, "NaN");
            else if (isinf(values[i]))
                zt_json_str(b, values[i] > 0 ? "Infinity" : "-Infinity");
            else
                zt_json_num(b, values[i]);
        }
        zt_json_close(b, ']');
    }
    zt_json_close(b, '}');
}

void zt_json_record(zt_jbuf *b, const zt_metric_record *r) {
    zt_json_open(b, '{');
    member_int(b, "step", r->step);
    member_int(b, "time_unix_ms", r->time_ms);
    zt_json_key(b, "values");
    zt_json_raw(b, r->json, r->json ? strlen(r->json) : 0);
    zt_json_close(b, '}');
}
