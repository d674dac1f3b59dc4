/* ztraind's own log for operators: every line ztraind itself writes (not its ranks') goes
 * through zt_oplog, which gives it a severity that journald understands. */
#ifndef ZT_OPLOG_H
#define ZT_OPLOG_H

#include <stdbool.h>
#include <stddef.h>

/* The syslog priorities of sd-daemon(3), which journald reads from a "<N>" line prefix. */
typedef enum {
    ZT_LOG_ERR = 3,
    ZT_LOG_WARNING = 4,
    ZT_LOG_INFO = 6,
} zt_log_level;

/* Writes "ztraind: " and the formatted text, which ends with a newline and may hold several
 * lines, to stderr (errors and warnings) or stdout (info; flushed at once). When that stream
 * is journald's (JOURNAL_STREAM names it, as systemd does for a service), every line starts
 * with "<N>", N the level, so that `journalctl -p warning` shows errors and warnings;
 * otherwise lines are written as they are. Safe from any thread. */
void zt_oplog(zt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether fd is journald's stream: JOURNAL_STREAM names its device and inode. */
bool zt_oplog_to_journal(int fd);

/* Copies text to out (size bytes, always terminated) with backslash, double quote and every
 * control character escaped (\\, \", \n, \t, \xNN), so that text a user chose (a job's name,
 * a rank's last stderr line) stays on one log line and cannot pass for a line of ztraind's. */
void zt_oplog_escape(char *out, size_t size, const char *text);

#endif
