/* The process's own CPU utilisation and memory (ztrain/sysmetrics.h): getrusage for CPU time,
 * /proc/self/status for the resident set and its high-water mark, which the kernel keeps per
 * process so no sampling thread is needed to catch the peak. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

#include "ztrain/sysmetrics.h"

static double monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double zt_sys_cpu_ms(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return NAN;
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

void zt_sys_sampler_init(zt_sys_sampler *s) {
    s->wall_ms = monotonic_ms();
    s->cpu_ms = zt_sys_cpu_ms();
}

/* VmRSS and VmHWM, which /proc/self/status gives in kB. */
static zt_status read_status(double *rss, double *hwm) {
    const char *path = "/proc/self/status";
    FILE *f = fopen(path, "r");
    if (!f)
        return zt_error(ZT_ERR_IO, "%s: cannot open it for the resident set size", path);
    char line[256];
    bool have_rss = false, have_hwm = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) {
            *rss = (double)kb * 1024.0;
            have_rss = true;
        } else if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) {
            *hwm = (double)kb * 1024.0;
            have_hwm = true;
        }
    }
    fclose(f);
    if (!have_rss || !have_hwm)
        return zt_error(ZT_ERR_IO, "%s: no %s line", path, have_rss ? "VmHWM" : "VmRSS");
    return ZT_OK;
}

zt_status zt_sys_sample_take(zt_sys_sampler *s, zt_sys_sample *out) {
    double wall = monotonic_ms(), cpu = zt_sys_cpu_ms();
    double dt = wall - s->wall_ms;
    out->cpu_util = dt >= 0.05 ? (cpu - s->cpu_ms) / dt : NAN;
    s->wall_ms = wall;
    s->cpu_ms = cpu;
    out->rss_bytes = out->peak_rss_bytes = NAN;
    return read_status(&out->rss_bytes, &out->peak_rss_bytes);
}
