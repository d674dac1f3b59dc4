/* The growable byte buffer (strbuf.h): doubling growth with sizes checked for overflow, and the
 * out-of-memory latch that lets writers check once. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/size_math.h"
#include "ztrain/strbuf.h"

/* The first allocation: room for a typical line or small JSON object, so short texts allocate
 * once. */
#define FIRST_CAP 256

void zt_strbuf_init(zt_strbuf *b) {
    memset(b, 0, sizeof *b);
}

void zt_strbuf_free(zt_strbuf *b) {
    free(b->data);
    zt_strbuf_init(b);
}

/* The capacity that holds `need` bytes: at least double the current one, so a run of appends
 * reallocates O(log n) times, and exactly `need` when that is more (a reserve for a whole batch
 * gets what it asked for, not the next power of two above it). */
static size_t grown_cap(size_t cap, size_t need) {
    cap = cap < FIRST_CAP ? FIRST_CAP : cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    return cap < need ? need : cap;
}

bool zt_strbuf_reserve(zt_strbuf *b, size_t n) {
    if (b->oom)
        return false;
    /* len + n + 1 (the NUL) in 64 bits, which size_t is on every platform ztrain builds for; a
     * sum past SIZE_MAX can never be allocated and latches like a failed realloc. */
    bool overflow = false;
    uint64_t need = zt_u64_add(zt_u64_add(b->len, n, &overflow), 1, &overflow);
    if (overflow || need > SIZE_MAX) {
        b->oom = true;
        return false;
    }
    if (need <= b->cap)
        return true;
    size_t cap = grown_cap(b->cap, (size_t)need);
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    if (!b->data)
        p[0] = '\0';
    b->data = p;
    b->cap = cap;
    return true;
}

void zt_strbuf_append(zt_strbuf *b, const void *p, size_t n) {
    if (!zt_strbuf_reserve(b, n))
        return;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void zt_strbuf_puts(zt_strbuf *b, const char *s) {
    zt_strbuf_append(b, s, strlen(s));
}

void zt_strbuf_putc(zt_strbuf *b, char c) {
    zt_strbuf_append(b, &c, 1);
}

void zt_strbuf_vprintf(zt_strbuf *b, const char *fmt, va_list ap) {
    if (!zt_strbuf_reserve(b, 0))
        return;
    /* Most output fits the room already there: format once, and again only after growing. */
    va_list again;
    va_copy(again, ap);
    size_t room = b->cap - b->len;
    int n = vsnprintf(b->data + b->len, room, fmt, ap);
    if (n >= 0 && (size_t)n >= room && zt_strbuf_reserve(b, (size_t)n))
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, again);
    va_end(again);
    if (n < 0 || b->oom) {
        /* An encoding error, or no room: drop whatever part was formatted. */
        b->data[b->len] = '\0';
        return;
    }
    b->len += (size_t)n;
}

void zt_strbuf_printf(zt_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    zt_strbuf_vprintf(b, fmt, ap);
    va_end(ap);
}

void zt_strbuf_clear(zt_strbuf *b) {
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

char *zt_strbuf_take(zt_strbuf *b, size_t *len) {
    if (!zt_strbuf_reserve(b, 0)) {
        zt_strbuf_free(b);
        if (len)
            *len = 0;
        return NULL;
    }
    char *p = b->data;
    if (len)
        *len = b->len;
    zt_strbuf_init(b);
    return p;
}
