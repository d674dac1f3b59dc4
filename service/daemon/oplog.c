/* ztraind's own log lines: one function that formats them, marks their severity for journald
 * when systemd collects them, and writes each whole message at once. */
#include "oplog.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* systemd sets JOURNAL_STREAM to "DEVICE:INODE" of the journal stream it connects a service's
 * stdout or stderr to (systemd.exec(5)); a program started from such a service with its output
 * redirected inherits the variable, so the descriptor itself is compared. */
bool zt_oplog_to_journal(int fd) {
    const char *v = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    return v && sscanf(v, "%llu:%llu", &dev, &ino) == 2 && fstat(fd, &st) == 0 &&
           (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* Writes text line by line, each line after the level's "<N>" prefix when there is one. */
static void write_lines(FILE *f, const char *prefix, const char *text) {
    while (*text) {
        const char *end = strchr(text, '\n');
        size_t len = end ? (size_t)(end - text) : strlen(text);
        fputs(prefix, f);
        fwrite(text, 1, len, f);
        fputc('\n', f);
        text += len + (end ? 1 : 0);
    }
}

void zt_oplog(zt_log_level level, const char *fmt, ...) {
    char text[4096];
    int n = snprintf(text, sizeof text, "ztraind: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text + n, sizeof text - (size_t)n, fmt, ap);
    va_end(ap);
    FILE *f = level <= ZT_LOG_WARNING ? stderr : stdout;
    char prefix[8] = "";
    if (zt_oplog_to_journal(fileno(f)))
        snprintf(prefix, sizeof prefix, "<%d>", (int)level);
    flockfile(f);
    write_lines(f, prefix, text);
    fflush(f);
    funlockfile(f);
}

void zt_oplog_escape(char *out, size_t size, const char *text) {
    size_t at = 0;
    for (const unsigned char *c = (const unsigned char *)text; *c && at + 5 < size; c++) {
        if (*c == '\\' || *c == '"')
            at += (size_t)snprintf(out + at, size - at, "\\%c", *c);
        else if (*c == '\n')
            at += (size_t)snprintf(out + at, size - at, "\\n");
        else if (*c == '\t')
            at += (size_t)snprintf(out + at, size - at, "\\t");
        else if (*c < 0x20 || *c == 0x7f)
            at += (size_t)snprintf(out + at, size - at, "\\x%02x", *c);
        else
            out[at++] = (char)*c;
    }
    if (size)
        out[at < size ? at : size - 1] = '\0';
}
