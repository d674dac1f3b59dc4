/* A growable byte buffer (internal to libztrain, shared with ztraind and the CLI): the one place
 * text that is built piece by piece grows, so each writer of JSON, headers or rendered templates
 * says what it writes instead of how its buffer doubles. */
#ifndef ZTRAIN_STRBUF_H
#define ZTRAIN_STRBUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

/* Bytes and their length, always followed by a NUL once anything was reserved, so `data` reads
 * as a C string (the bytes themselves may hold NULs; `len` counts them all). A zeroed zt_strbuf
 * ({0}) is an empty one, the same as after zt_strbuf_init.
 *
 * Out of memory latches: after a failed allocation (or a size that does not fit in size_t) the
 * buffer stops growing, every later append does nothing and `oom` stays set until the buffer is
 * freed or taken. A writer makes all its appends and checks `oom` once, at the end; what the
 * buffer holds then is a prefix of what was written, never a torn byte sequence past `len`. */
typedef struct {
    char *data; /* owned by the buffer; NULL until the first reserve */
    size_t len; /* bytes held, not counting the NUL */
    size_t cap; /* bytes allocated, the NUL included */
    bool oom;
} zt_strbuf;

void zt_strbuf_init(zt_strbuf *b);
/* Releases the bytes and leaves b empty, its latch cleared. */
void zt_strbuf_free(zt_strbuf *b);

/* Makes room for n more bytes (and the NUL after them): false, and oom set, when that failed or
 * was already latched. Writers that fill the room themselves (b->data + b->len, then len += n)
 * call it first; the appends below call it for you. Each growth at least doubles the capacity,
 * so a run of appends costs amortized O(1) each; a larger reserve gets exactly what it asks for
 * (a batch sized up front is not rounded up to a power of two). */
bool zt_strbuf_reserve(zt_strbuf *b, size_t n);

/* Appends n bytes from p (p may be NULL when n is 0). */
void zt_strbuf_append(zt_strbuf *b, const void *p, size_t n);
/* Appends the NUL-terminated string s, without its NUL. */
void zt_strbuf_puts(zt_strbuf *b, const char *s);
void zt_strbuf_putc(zt_strbuf *b, char c);
/* Appends printf's output, however long. */
void zt_strbuf_printf(zt_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void zt_strbuf_vprintf(zt_strbuf *b, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* Forgets the bytes but keeps their memory, for a buffer reused line after line. The latch
 * stays: a writer that ran out of memory is told so at its one check, whatever it cleared. */
void zt_strbuf_clear(zt_strbuf *b);

/* Hands the NUL-terminated bytes to the caller, who releases them with free(), and leaves b
 * empty (as after zt_strbuf_init). An empty buffer gives "", not NULL. After an allocation
 * failure it returns NULL and frees what b held, so one check of the result covers every append
 * before it. *len, when len is not NULL, is the byte count without the NUL. */
char *zt_strbuf_take(zt_strbuf *b, size_t *len);

#endif
