/* System metrics of the calling process, sampled by the process itself (no helper process): CPU
 * utilisation over an interval, resident and peak resident memory. The trainer of every rank
 * samples them at each log interval (the "system/rank<r>/..." metric keys); GPU figures come
 * from ztrain/nvml.h. */
#ifndef ZTRAIN_SYSMETRICS_H
#define ZTRAIN_SYSMETRICS_H

#include <stdbool.h>

#include "ztrain/status.h"

/* The state between two samples: where the previous one left the process's clocks. Caller-owned;
 * no resources, so there is nothing to free. */
typedef struct {
    double wall_ms;  /* CLOCK_MONOTONIC at the previous sample */
    double cpu_ms;   /* the process's CPU time (user + system, every thread) then */
} zt_sys_sampler;

typedef struct {
    /* Process CPU time divided by wall time since the previous sample (or since
     * zt_sys_sampler_init): 1.0 is one core busy the whole interval; with several threads
     * (OpenMP) it can exceed 1. NaN for an interval too short to say anything (under 50 µs);
     * getrusage's CPU time of the caller's own process is exact to the microsecond, so short
     * intervals are fine. */
    double cpu_util;
    double rss_bytes;       /* resident set now (/proc/self/status VmRSS) */
    double peak_rss_bytes;  /* the largest resident set so far (VmHWM) */
} zt_sys_sample;

/* Starts the first interval now. */
void zt_sys_sampler_init(zt_sys_sampler *s);

/* Fills *out and starts the next interval. ZT_ERR_IO naming /proc/self/status when it cannot be
 * read or lacks VmRSS/VmHWM (a kernel without procfs); the interval still restarts. */
zt_status zt_sys_sample_take(zt_sys_sampler *s, zt_sys_sample *out);

/* The process's CPU time in milliseconds (getrusage: user + system of every thread). */
double zt_sys_cpu_ms(void);

#endif
