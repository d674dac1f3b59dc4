/* What the fuzz targets of tests/fuzz/ share: the input as a C string, one temporary directory
 * per process for the files a target has to write (readers that take a path), and the check
 * that turns a broken property into a crash the fuzzer keeps. Header-only; each target includes
 * it once. The same target file links with libFuzzer (build-fuzz, `make test-fuzz`) or with
 * replay.c (the ctest that replays the corpus in every build). */
#ifndef ZT_FUZZ_UTIL_H
#define ZT_FUZZ_UTIL_H

#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The sanitizers' report channel, present when they are linked in. Under libFuzzer's
 * -close_fd_mask the target's stderr is closed, but this channel still reaches the log. */
void __sanitizer_report_error_summary(const char *summary) __attribute__((weak));

/* A broken invariant: the message is printed, then abort(), which both libFuzzer and the replay
 * test report with the input that caused it. */
__attribute__((format(printf, 4, 5), noreturn)) static inline void
fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    char msg[2048];
    int n = snprintf(msg, sizeof msg, "fuzz check failed at %s:%d: %s: ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof msg)
        vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", msg);
    if (__sanitizer_report_error_summary)
        __sanitizer_report_error_summary(msg);
    abort();
}

#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                                     \
    } while (0)

/* The input with a NUL after it, so that text parsers see exactly these bytes (an embedded NUL
 * ends the text early, as it would in a file read into a C string). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    FUZZ_CHECK(s != NULL, "out of memory copying %zu bytes", size);
    if (size)
        memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* A fresh directory under $TMPDIR (or /tmp) for this process; the same one on every call. It is
 * left behind if the process is killed, and removed at a normal exit. Its name is kept short
 * enough that the targets' paths under it fit PATH_MAX. */
static char fuzz_tmp[256];

static inline void fuzz_tmp_remove(void) {
    char cmd[4200];
    if (fuzz_tmp[0] && snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_tmp) < (int)sizeof cmd &&
        system(cmd) != 0)
        fprintf(stderr, "fuzz: could not remove %s\n", fuzz_tmp);
}

static inline const char *fuzz_tmpdir(void) {
    if (fuzz_tmp[0])
        return fuzz_tmp;
    const char *base = getenv("TMPDIR");
    int n = snprintf(fuzz_tmp, sizeof fuzz_tmp, "%s/ztrain-fuzz-XXXXXX",
                     base && *base ? base : "/tmp");
    FUZZ_CHECK(n > 0 && (size_t)n < sizeof fuzz_tmp, "TMPDIR is too long");
    FUZZ_CHECK(mkdtemp(fuzz_tmp) != NULL, "cannot make a directory like %s", fuzz_tmp);
    atexit(fuzz_tmp_remove);
    return fuzz_tmp;
}

/* Replaces the file at path with exactly these bytes. */
static inline void fuzz_write_file(const char *path, const void *data, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_CHECK(fd >= 0, "cannot create %s", path);
    const char *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        FUZZ_CHECK(n > 0, "cannot write %s", path);
        p += n;
        size -= (size_t)n;
    }
    close(fd);
}

#endif
