/* SIGINT and SIGTERM as stop requests of a process that trains (ztrain-worker, `ztrain run`).
 *
 * The two signals are blocked in every thread and taken by one thread of their own, which waits
 * for them (sigwaitinfo): no signal frame is ever pushed onto a thread that runs a kernel. That is
 * not a nicety. oneDNN 2.x's generated f32 GEMM kernels (Debian's libdnnl2) point the stack
 * pointer at their heap workspace while they run, and a signal handled there writes its frame
 * into the heap, which aborts the process later in free() ("corrupted size vs. prev_size"; oneDNN
 * issue 4845, fixed in 3.12). A rank that was asked to stop with a checkpoint died instead.
 *
 * The policy:
 *   - the first SIGINT or SIGTERM sets *flag (zt_train_options.stop_requested): the trainer ends
 *     the step, every rank at the same one, and writes the checkpoint;
 *   - a SIGTERM less than ZT_STOP_REPEATED_TERM_S after the first is the same request again (at a
 *     job's time limit slurmd signals the step twice in a row; taking the second as "now" would
 *     lose exactly the checkpoint the first asked for);
 *   - any later signal ends the process at once, killed by that signal.
 *
 * Call it first in main, before anything starts a thread (OpenMP's pool, oneDNN, the
 * communication threads): threads inherit the blocked mask from their creator. So would a child
 * process started afterwards (none is, today): it must unblock the two between fork and exec. */
#ifndef ZTRAIN_STOP_SIGNALS_H
#define ZTRAIN_STOP_SIGNALS_H

#include <signal.h>
#include <stdbool.h>

#include "ztrain/status.h"

#define ZT_STOP_REPEATED_TERM_S 1.0
/* The thread's name (top -H, /proc/PID/task/TID/comm). */
#define ZT_STOP_SIGNALS_THREAD "zt-stop-signals"

zt_status zt_stop_signals_start(volatile sig_atomic_t *flag);

/* Whether a stop was asked for through flag (NULL: never). */
static inline bool zt_stop_is_requested(const volatile sig_atomic_t *flag) {
    return flag && *flag;
}

#endif
