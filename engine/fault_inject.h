/* Fault injection for tests (internal): the environment variables ZTRAIN_INJECT_* that make one
 * rank fail on purpose at one step. */
#ifndef ZTRAIN_FAULT_INJECT_H
#define ZTRAIN_FAULT_INJECT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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

#endif
