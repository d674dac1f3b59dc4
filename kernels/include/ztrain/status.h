/* Status codes and error messages of libztrain.
 *
 * The library never exits: a recoverable failure returns a negative zt_status and leaves a human
 * message, naming the file, key, value or rank at fault, that the caller reads with zt_last_error().
 * Programming errors (broken invariants) stop the process through ZT_ASSERT. */
#ifndef ZTRAIN_STATUS_H
#define ZTRAIN_STATUS_H

#include <stdio.h>
#include <stdlib.h>

typedef enum {
    ZT_OK = 0,
    ZT_ERR_INVALID = -1,     /* a bad value in a config, job spec or argument */
    ZT_ERR_IO = -2,          /* a file could not be opened, read or written */
    ZT_ERR_FORMAT = -3,      /* a file exists but its contents are malformed */
    ZT_ERR_NOMEM = -4,       /* an allocation failed */
    ZT_ERR_UNSUPPORTED = -5, /* a valid option that this build does not implement yet */
    ZT_ERR_TIMEOUT = -6,     /* a peer or a wait took longer than allowed */
    ZT_ERR_NUMERIC = -7,     /* training diverged: a non-finite loss or gradient */
    ZT_ERR_STOPPED = -8,     /* a wait gave up because a stop was asked for (SIGINT, SIGTERM) */
} zt_status;

/* A short name for a status ("invalid", "io", ...). */
const char *zt_status_name(zt_status s);

/* The message of the most recent failure on this thread. Never NULL; "" when nothing failed.
 * The string stays valid until the next zt_error() on the same thread. */
const char *zt_last_error(void);

/* Records a formatted message for zt_last_error() and returns s, so a failure site reads
 * `return zt_error(ZT_ERR_INVALID, "%s: key '%s' ...", file, key);`. */
zt_status zt_error(zt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The field the most recent failure on this thread is about: the dotted path of the key a
 * parser refused ("train.max_steps", "zero_optimization.stage", "data.train[1].weight"),
 * relative to the document that parser read; "" when the failure names none. Every zt_error()
 * clears it and the parser that refused a key sets it, so a caller (the service's structured
 * errors) reads the path from the parser rather than out of the message. Valid until the next
 * zt_error() or zt_error_field*() on the same thread. */
const char *zt_last_error_field(void);

/* Records `path` as the current failure's field and returns s. */
zt_status zt_error_field(zt_status s, const char *path);

/* Puts `section` in front of the current field ("deepspeed" + "zero_optimization.stage") when
 * there is one, for a caller that parsed a document embedded in its own; returns s. */
zt_status zt_error_field_prefix(zt_status s, const char *section);

/* Prefixes the current message with context ("job.json: " + message) and returns s. */
zt_status zt_error_prefix(zt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define ZT_ASSERT(cond)                                                                       \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "ztrain: assertion failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

/* Evaluates a zt_status expression and returns it from the enclosing function when it failed. */
#define ZT_TRY(expr)                      \
    do {                                  \
        zt_status zt_try_s_ = (expr);     \
        if (zt_try_s_ != ZT_OK)           \
            return zt_try_s_;             \
    } while (0)

#endif
