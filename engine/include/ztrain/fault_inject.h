/* Fault injection for tests (internal): the environment variables ZTRAIN_INJECT_* that make one
 * rank fail on purpose at one step, or at one point of one step's checkpoint. */
#ifndef ZTRAIN_FAULT_INJECT_H
#define ZTRAIN_FAULT_INJECT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The step (from 1) that the variable `name`, set to "STEP[:RANK]", names for `rank` (RANK
 * defaults to 0); 0 when it is unset, malformed or names another rank. */
static inline int64_t zt_inject_step(const char *name, int rank) {
    const char *v = getenv(name);
    long long step = 0;
    int r = 0;
    if (!v || sscanf(v, "%lld:%d", &step, &r) < 1 || r != rank)
        return 0;
    return step;
}

/* Whether the variable `name`, set to "STEP:POINT[:RANK]", names this step, this point (a word)
 * and this rank (RANK defaults to 0); false when it is unset or malformed. */
static inline bool zt_inject_at(const char *name, int64_t step, const char *point, int rank) {
    const char *v = getenv(name);
    long long at = 0;
    int r = 0;
    char where[64];
    return v && sscanf(v, "%lld:%63[^:]:%d", &at, where, &r) >= 2 && at == step &&
           strcmp(where, point) == 0 && r == rank;
}

/* ZTRAIN_INJECT_CKPT_KILL="STEP:POINT[:RANK]": rank RANK (default 0) SIGKILLs itself at POINT
 * of saving the checkpoint of global step STEP, as a grace period running out there would
 * (checkpoint.c and ckpt_dir.c name the points). */
static inline void zt_inject_ckpt_kill(int64_t step, const char *point, int rank) {
    if (!zt_inject_at("ZTRAIN_INJECT_CKPT_KILL", step, point, rank))
        return;
    fflush(NULL);
    raise(SIGKILL);
}

/* ZTRAIN_INJECT_CKPT_FAIL="STEP:POINT[:RANK]": rank RANK's save of global step STEP fails at
 * POINT ("gather": widening the parameters at ZeRO stages 0-2, as running out of memory there
 * would). */
static inline bool zt_inject_ckpt_fail(int64_t step, const char *point, int rank) {
    return zt_inject_at("ZTRAIN_INJECT_CKPT_FAIL", step, point, rank);
}

/* ZTRAIN_INJECT_OFFLOAD_KILL=POINT: the process SIGKILLs itself at POINT of making its NVMe
 * offload directory (offload.c: "recorded", the name written to the record but the directory
 * not yet made; "made", just after), as a kill from outside landing there would. */
static inline void zt_inject_offload_kill(const char *point) {
    const char *v = getenv("ZTRAIN_INJECT_OFFLOAD_KILL");
    if (!v || strcmp(v, point) != 0)
        return;
    fflush(NULL);
    raise(SIGKILL);
}

/* The hooks that hold a race open are named ZTRAIN_INJECT_<MOMENT>_MS and set to N: the program
 * waits N milliseconds at that moment, one that a loaded machine can stretch. (The slow rank of
 * ZTRAIN_INJECT_SLOW_RANK=MS[:RANK], observe/rank_stats.c, is a slowdown of every batch of one
 * rank, not such a moment.) The value of the variable `name`: N, or 0 when it is unset,
 * malformed or not positive. A hook that runs on a thread of its own reads it before that thread
 * starts (getenv is not safe beside setenv). */
static inline long zt_inject_ms(const char *name) {
    const char *v = getenv(name);
    char *end;
    long ms = v ? strtol(v, &end, 10) : 0;
    return v && end != v && *end == '\0' && ms > 0 ? ms : 0;
}

static inline void zt_inject_sleep_ms(long ms) {
    if (ms > 0)
        nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL);
}

/* ZTRAIN_INJECT_LISTEN_RACE_MS=N: ztraind waits N milliseconds after it has made its state
 * directory and before its servers bind their ports, so a test can take a port in the moment
 * between ztraind's check of it and the bind, as another program could. */
static inline void zt_inject_listen_race(void) {
    zt_inject_sleep_ms(zt_inject_ms("ZTRAIN_INJECT_LISTEN_RACE_MS"));
}

/* ZTRAIN_INJECT_SIGNAL_LATE_MS=N: the thread that takes SIGINT and SIGTERM for the temporary
 * outputs (tmp_paths.c) waits N milliseconds after it has seen a signal and before it takes it,
 * so a writer renames while the signal is on its way. Read when that thread starts. */
static inline long zt_inject_signal_late_ms(void) {
    return zt_inject_ms("ZTRAIN_INJECT_SIGNAL_LATE_MS");
}

/* ZTRAIN_INJECT_NO_RENAME_EXCHANGE set: checkpoints are replaced as on a filesystem without
 * renameat2's RENAME_EXCHANGE (NFS, for one), so that path is tested on any filesystem. */
static inline bool zt_inject_no_rename_exchange(void) {
    const char *v = getenv("ZTRAIN_INJECT_NO_RENAME_EXCHANGE");
    return v && *v && strcmp(v, "0") != 0;
}

#endif
