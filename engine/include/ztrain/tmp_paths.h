/* Temporary files and directories in the making, removed when the program is interrupted.
 *
 * A writer that builds its output under a temporary name and renames it into place (path.tmp of
 * zt_atomic_write_begin, `export --hf`'s DIR.tmp-PID/, prepare's shards) tracks that name from
 * just before it creates it until just after the rename or its own removal. A program whose
 * outputs are such files (`ztrain export`, `ztrain prepare`) calls zt_tmp_remove_on_signals()
 * first in its command: a SIGINT or SIGTERM then removes every tracked path and ends the
 * process killed by that signal, as an uncaught one would (a shell shows 130 or 143), instead of
 * leaving the temporary files behind (a new DIR.tmp-PID/ at every interrupted export).
 *
 * The signals are taken by a thread of their own through a signalfd, not by a handler: removing a
 * directory tree is not async-signal-safe, and a handler's frame must not land on a thread that
 * runs a kernel (ztrain/stop_signals.h). Tracking is a mutex-guarded list, so any thread may
 * track and untrack; the removal holds the mutex, so a path is never removed half-way through
 * its untracking. A path created in the microseconds between the removal and the end of the
 * process can remain; nothing is written into a removed directory (its files cannot be created).
 * A writer puts its output into place with zt_tmp_rename, never plain rename(): the signals'
 * thread can be slower to wake than the writer, and a signal that arrived before the rename
 * must still find the temporary output there to remove, not a finished final one.
 * ZTRAIN_INJECT_SIGNAL_LATE_MS=N (tests; ztrain/fault_inject.h) holds the signals' thread for N
 * ms after it has seen a signal, the moment a loaded machine can stretch.
 * Without zt_tmp_remove_on_signals the tracking costs a lock and a copy of the name and does
 * nothing else (a training rank keeps its own stop signals: ztrain/stop_signals.h). */
#ifndef ZTRAIN_TMP_PATHS_H
#define ZTRAIN_TMP_PATHS_H

#include "ztrain/status.h"

/* Starts the thread that takes SIGINT and SIGTERM. Call it before any other thread starts:
 * threads inherit the blocked signals from their creator. */
zt_status zt_tmp_remove_on_signals(void);

/* Tracks path (copied) until zt_tmp_untrack(path); a failed copy leaves it untracked. */
void zt_tmp_track(const char *path);
void zt_tmp_untrack(const char *path);

/* rename(tmp, path) and zt_tmp_untrack(tmp) as one step, returning rename's result (errno set on
 * -1; tmp stays tracked then). Under zt_tmp_remove_on_signals, a SIGINT or SIGTERM that has
 * arrived but not yet been acted on wins: the call does not rename and does not return, the
 * signals' thread removes tmp and ends the process. */
int zt_tmp_rename(const char *tmp, const char *path);

#endif
