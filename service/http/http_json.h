/* The JSON that ztraind's HTTP API speaks: jobs, metric series and records, log lines and
 * errors, written into a growable buffer. Pure functions (no I/O, no locks, no clock), so the
 * request handlers, the event stream (whose encoder runs under the job manager's lock) and the
 * tests share one encoding. API resources go through proto_json.h; this file keeps the writer,
 * the series (by hand, for speed) and the export's records. */
#ifndef ZTRAIN_HTTP_JSON_H
#define ZTRAIN_HTTP_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/checkpoint.h"
#include "daemon/job_manager.h"

/* A growable byte buffer with a JSON writer on top. The writer inserts the commas between
 * members and elements itself, so encoders read as the structure they write. After an
 * allocation failure the buffer stops growing and `oom` stays set: callers check it once, at
 * the end, instead of after every append. */
typedef struct {
    char *data;    /* NUL-terminated when not NULL */
    size_t len, cap;
    bool comma;    /* a value was just completed: the next member or element needs a ',' */
    bool oom;
} zt_jbuf;

void zt_jbuf_init(zt_jbuf *b);
void zt_jbuf_free(zt_jbuf *b);
/* Makes room for n more bytes; false (and oom) when that failed. */
bool zt_jbuf_reserve(zt_jbuf *b, size_t n);
/* Hands the NUL-terminated text to the caller (release with free()) and leaves b empty;
 * NULL after an allocation failure (b is then freed). *len may be NULL. */
char *zt_jbuf_take(zt_jbuf *b, size_t *len);
/* Appends bytes that are not a JSON value (SSE framing, Prometheus text); resets the comma
 * state, so a JSON value written next starts without one. */
void zt_jbuf_text(zt_jbuf *b, const char *s, size_t n);
void zt_jbuf_puts(zt_jbuf *b, const char *s);
void zt_jbuf_printf(zt_jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The JSON writer. open/close take '{' '}' or '[' ']'. */
void zt_json_open(zt_jbuf *b, char c);
void zt_json_close(zt_jbuf *b, char c);
void zt_json_key(zt_jbuf *b, const char *key);
/* A string, escaped; bytes that are not valid UTF-8 become U+FFFD, so any log line or name
 * yields valid JSON. NULL writes null. */
void zt_json_str(zt_jbuf *b, const char *s);
void zt_json_strn(zt_jbuf *b, const char *s, size_t n);
void zt_json_int(zt_jbuf *b, int64_t v);
/* The shortest of %.15g / %.17g that reads back as v; null when v is NaN or infinite. */
void zt_json_num(zt_jbuf *b, double v);
void zt_json_bool(zt_jbuf *b, bool v);
void zt_json_null(zt_jbuf *b);
/* Splices text that is already one JSON value (a metric record, the job spec); leading and
 * trailing whitespace is dropped, and null is written when nothing is left. */
void zt_json_raw(zt_jbuf *b, const char *json, size_t n);

/* One MetricSeries as its proto3 JSON (proto_json.h): {"key","steps":["1",...],"values":[...]},
 * written directly rather than through a message because series are the API's largest bodies. */
void zt_json_series(zt_jbuf *b, const char *key, const int64_t *steps, const double *values,
                    int n);
/* One line of the metrics.jsonl export: {"step","time_unix_ms","values":<the record's own
 * object>}, the record as the ranks wrote it (the API's /records carries MetricRecord). */
void zt_json_record(zt_jbuf *b, const zt_metric_record *r);

#endif
