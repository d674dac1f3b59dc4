/* A JSON writer over a growable buffer: the encoder under proto_json.h, shared by ztraind's HTTP
 * API and the CLI so that both print one encoding. Pure functions (no I/O, no locks, no clock). */
#ifndef ZTRAIN_JSON_WRITER_H
#define ZTRAIN_JSON_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/strbuf.h"

/* A growable byte buffer (ztrain/strbuf.h) with a JSON writer on top. The writer inserts the
 * commas between members and elements itself, so encoders read as the structure they write.
 * The bytes, their length and the out-of-memory latch are the zt_strbuf's: after an allocation
 * failure the buffer stops growing and `buf.oom` stays set, so callers check it once, at the end,
 * instead of after every append. */
typedef struct {
    zt_strbuf buf; /* buf.data is NUL-terminated when not NULL */
    bool comma;    /* a value was just completed: the next member or element needs a ',' */
} zt_jbuf;

void zt_jbuf_init(zt_jbuf *b);
void zt_jbuf_free(zt_jbuf *b);
/* Makes room for n more bytes; false (and buf.oom) when that failed. */
bool zt_jbuf_reserve(zt_jbuf *b, size_t n);
/* Hands the NUL-terminated text to the caller (release with free()) and leaves b empty;
 * NULL after an allocation failure (b is then freed). *len may be NULL. */
char *zt_jbuf_take(zt_jbuf *b, size_t *len);
/* Forgets the text but keeps its memory and the out-of-memory latch, for a buffer that writes
 * one chunk or page after another; the next value starts without a comma. */
void zt_jbuf_clear(zt_jbuf *b);
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

#endif
