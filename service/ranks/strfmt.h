/* printf-style formatting into a new heap string, for the service's own printf-like helpers
 * (a job's reason, a rank's environment, srun's arguments). Header-only, so that every program
 * and test that compiles one of those files gets it without another source file. */
#ifndef ZTRAIN_STRFMT_H
#define ZTRAIN_STRFMT_H

#include <stdarg.h>
#include <stdio.h>

/* A malloc'd string made from fmt and ap, or NULL when memory ran out; the caller frees it.
 * vasprintf leaves its pointer undefined when it fails, which is why callers do not use it
 * directly. The including file defines _GNU_SOURCE before any system header (for vasprintf). */
static inline char *zt_vstrfmt(const char *fmt, va_list ap) {
    char *s;
    return vasprintf(&s, fmt, ap) < 0 ? NULL : s;
}

#endif
