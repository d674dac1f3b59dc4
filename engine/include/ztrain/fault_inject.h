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

/* Whether the variable `name`, set to "STEP:POINT", names this step and this point (a word);
 * false when it is unset or malformed. */
static inline bool zt_inject_at(const char *name, int64_t step, const char *point) {
    const char *v = getenv(name);
    long long at = 0;
    char where[64];
    return v && sscanf(v, "%lld:%63s", &at, where) == 2 && at == step &&
           strcmp(where, point) == 0;
}

/* ZTRAIN_INJECT_CKPT_KILL="STEP:POINT": the process SIGKILLs itself at POINT of saving the
 * checkpoint of global step STEP, as a grace period running out there would (checkpoint.c names
 * the points). */
static inline void zt_inject_ckpt_kill(int64_t step, const char *point) {
    if (!zt_inject_at("ZTRAIN_INJECT_CKPT_KILL", step, point))
        return;
    fflush(NULL);
    raise(SIGKILL);
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

/* ZTRAIN_INJECT_LISTEN_RACE_MS=N: ztraind waits N milliseconds after it has made its state
 * directory and before its servers bind their ports, so a test can take a port in the moment
 * between ztraind's check of it and the bind, as another program could. */
static inline void zt_inject_listen_race(void) {
    const char *v = getenv("ZTRAIN_INJECT_LISTEN_RACE_MS");
    long ms = v ? strtol(v, NULL, 10) : 0;
    if (ms > 0)
        nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL);
}

/* ZTRAIN_INJECT_NO_RENAME_EXCHANGE set: checkpoints are replaced as on a filesystem without
 * renameat2's RENAME_EXCHANGE (NFS, for one), so that path is tested on any filesystem. */
static inline bool zt_inject_no_rename_exchange(void) {
    const char *v = getenv("ZTRAIN_INJECT_NO_RENAME_EXCHANGE");
    return v && *v && strcmp(v, "0") != 0;
}

#endif
