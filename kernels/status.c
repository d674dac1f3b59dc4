/* Status names and the per-thread message behind zt_last_error(). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ztrain/status.h"

static _Thread_local char last_error[4096];
static _Thread_local char last_field[512];

const char *zt_status_name(zt_status s) {
    switch (s) {
    case ZT_OK: return "ok";
    case ZT_ERR_INVALID: return "invalid";
    case ZT_ERR_IO: return "io";
    case ZT_ERR_FORMAT: return "format";
    case ZT_ERR_NOMEM: return "out of memory";
    case ZT_ERR_UNSUPPORTED: return "unsupported";
    case ZT_ERR_TIMEOUT: return "timeout";
    case ZT_ERR_NUMERIC: return "numeric";
    case ZT_ERR_STOPPED: return "stopped";
    }
    return "unknown";
}

const char *zt_last_error(void) { return last_error; }

const char *zt_last_error_field(void) { return last_field; }

zt_status zt_error_field(zt_status s, const char *path) {
    snprintf(last_field, sizeof last_field, "%s", path ? path : "");
    return s;
}

zt_status zt_error_field_prefix(zt_status s, const char *section) {
    size_t ls = section ? strlen(section) : 0, lf = strlen(last_field);
    /* A path that would not fit whole is dropped rather than cut: a cut path names another
     * field. */
    if (lf && ls && ls + 1 + lf < sizeof last_field) {
        memmove(last_field + ls + 1, last_field, lf + 1);
        memcpy(last_field, section, ls);
        last_field[ls] = '.';
    } else if (lf && ls) {
        last_field[0] = '\0';
    }
    return s;
}

zt_status zt_error(zt_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    last_field[0] = '\0';
    return s;
}

zt_status zt_error_prefix(zt_status s, const char *fmt, ...) {
    char prefix[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t plen = strlen(prefix), mlen = strlen(last_error);
    if (plen + mlen >= sizeof last_error)
        mlen = sizeof last_error - 1 - plen;
    memmove(last_error + plen, last_error, mlen);
    memcpy(last_error, prefix, plen);
    last_error[plen + mlen] = '\0';
    return s;
}
