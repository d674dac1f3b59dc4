/* Checks for the C unit tests: each test is one program that runs every check, prints a FAIL line
 * (file:line, what was checked, and the values at fault) for each one that fails, and exits with
 * check_summary()'s verdict. Passing checks print nothing, so a failure is not lost among the tens
 * of thousands of checks some tests make; the summary line counts them. Also a fresh temporary
 * directory for the files a test writes. Header-only: include it from exactly one file. It needs
 * mkdtemp and realpath, so a test that sets a feature-test macro sets _XOPEN_SOURCE 700. */
#ifndef ZT_TEST_CHECK_H
#define ZT_TEST_CHECK_H

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/status.h"

static long check_count;    /* checks made */
static long check_failures; /* checks that failed */

/* Counts one check and returns ok; when ok is false, prints "FAIL file:line: " and the formatted
 * text on stderr and counts a failure. Helpers that check on behalf of a caller pass the caller's
 * line. */
__attribute__((format(printf, 4, 5))) static inline bool check_at(const char *file, int line,
                                                                   bool ok, const char *fmt, ...) {
    check_count++;
    if (ok)
        return true;
    check_failures++;
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return false;
}

/* CHECK(cond) or CHECK(cond, fmt, ...): a failure prints the condition's text, then ": " and the
 * formatted detail when one is given. The detail's arguments are evaluated only on failure. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        check_count++;                                                                             \
        if (!(cond)) {                                                                             \
            check_failures++;                                                                      \
            fprintf(stderr, "FAIL %s:%d: %s", __FILE__, __LINE__, #cond);                          \
            __VA_OPT__(fputs(": ", stderr); fprintf(stderr, __VA_ARGS__);)                         \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static inline bool check_str_at(const char *file, int line, const char *expr, const char *got,
                                const char *want) {
    return check_at(file, line, got && strcmp(got, want) == 0, "%s\n  want: %s\n  got:  %s", expr,
                    want, got ? got : "(null)");
}

/* A string equal to `want`; NULL never is. */
#define CHECK_STR(got, want) check_str_at(__FILE__, __LINE__, #got, (got), (want))

/* A call that returned `got` must have returned `want` and left a zt_last_error() message equal
 * to `msg`, or starting with it when prefix_only. A failure shows the input, labelled with `what`
 * ("config", "job"), and both outcomes. */
static inline bool check_error_is(const char *file, int line, const char *what, const char *input,
                                  zt_status got, zt_status want, const char *msg,
                                  bool prefix_only) {
    const char *text = zt_last_error();
    bool match = prefix_only ? strncmp(text, msg, strlen(msg)) == 0 : strcmp(text, msg) == 0;
    return check_at(file, line, got == want && match, "%s %s\n  want %s: %s\n  got  %s: %s", what,
                    input, zt_status_name(want), msg, zt_status_name(got),
                    got == ZT_OK ? "(success)" : text);
}

/* A call on the file `path` that returned `got` must have returned `want` and left a
 * zt_last_error() message that names the file and contains each string of the NULL-terminated
 * list `facts`. One check for the status, one for the name, one per fact. */
static inline void check_error_has(const char *file, int line, zt_status got, zt_status want,
                                   const char *path, va_list facts) {
    /* Never NULL, but saying so stops GCC, at -O3 under UBSan, warning of a NULL "%s" argument. */
    const char *msg = zt_last_error();
    if (!msg)
        msg = "";
    check_at(file, line, got == want, "%s: status %s, want %s (%s)", path, zt_status_name(got),
             zt_status_name(want), msg);
    check_at(file, line, strstr(msg, path) != NULL, "message does not name %s: %s", path, msg);
    for (const char *fact; (fact = va_arg(facts, const char *)) != NULL;)
        check_at(file, line, strstr(msg, fact) != NULL, "message lacks \"%s\": %s", fact, msg);
}

/* Prints the verdict and returns the exit status: 0 when every check passed, 1 otherwise. */
static inline int check_summary(const char *name) {
    if (check_failures) {
        fprintf(stderr, "%s: %ld of %ld checks failed\n", name, check_failures, check_count);
        return 1;
    }
    printf("%s: all %ld checks passed\n", name, check_count);
    return 0;
}

/* ---- temporary files ------------------------------------------------------------------------ */

static char check_tmpdir[PATH_MAX]; /* absolute, with symlinks resolved */

/* Makes a fresh directory /tmp/PREFIX.XXXXXX for the test's files, or exits with status 2. */
static inline const char *check_tmpdir_create(const char *prefix) {
    char tmpl[256];
    snprintf(tmpl, sizeof tmpl, "/tmp/%s.XXXXXX", prefix);
    if (!mkdtemp(tmpl) || !realpath(tmpl, check_tmpdir)) {
        fprintf(stderr, "cannot create a temporary directory %s: %s\n", tmpl, strerror(errno));
        exit(2);
    }
    return check_tmpdir;
}

/* check_tmpdir/name. The result lives in one of eight rotating buffers, so a call may use a few
 * paths at once. */
static inline const char *check_tmp_path(const char *name) {
    static char buf[8][PATH_MAX + 256];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", check_tmpdir, name);
    return p;
}

/* Writes n bytes to path, or exits with status 2: a test that cannot set up has nothing to say. */
static inline void check_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        exit(2);
    }
}

/* Removes the directory and everything in it. */
static inline void check_tmpdir_remove(void) {
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", check_tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", check_tmpdir);
}

#endif
