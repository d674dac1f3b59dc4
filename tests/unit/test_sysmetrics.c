/* The system-metrics sampler (ztrain/sysmetrics.h) against the kernel's other accounts of the
 * same process: CPU utilisation against /proc/self/stat's utime + stime over the same interval
 * (busy loop, then sleep) and, for the busy loop, against 1 less its run-queue wait; the
 * resident set against /proc/self/statm after touching 64 MiB. NVML is test_nvml.c's. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>

#include "check.h"
#include "ztrain/sysmetrics.h"

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* utime + stime of this process in seconds, from /proc/self/stat (fields 14 and 15, in clock
 * ticks; the command name in field 2 may hold spaces, so fields are counted after its ')'). */
static double proc_stat_cpu_s(void) {
    char buf[4096];
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    unsigned long long utime, stime;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                     &stime) != 2)
        return NAN;
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

/* Resident bytes from /proc/self/statm (its second field, in pages). */
static double statm_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size, resident;
    int got = f ? fscanf(f, "%llu %llu", &size, &resident) : 0;
    if (f)
        fclose(f);
    return got == 2 ? (double)resident * (double)sysconf(_SC_PAGESIZE) : NAN;
}

/* Seconds this thread has been runnable but waiting for a core (/proc/thread-self/schedstat's
 * second field, in ns); NaN where the kernel does not keep it (all fields 0). */
static double sched_wait_s(void) {
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    unsigned long long run, wait;
    int got = f ? fscanf(f, "%llu %llu", &run, &wait) : 0;
    if (f)
        fclose(f);
    return got == 2 && run > 0 ? (double)wait / 1e9 : NAN;
}

static volatile double sink;

static void test_cpu_util(void) {
    zt_sys_sampler s;
    zt_sys_sample a;
    double tick = 1.0 / (double)sysconf(_SC_CLK_TCK);

    /* Busy: spin for 0.5 s of wall time. */
    zt_sys_sampler_init(&s);
    double w0 = wall_s(), c0 = proc_stat_cpu_s(), q0 = sched_wait_s();
    double x = 1.0;
    while (wall_s() - w0 < 0.5)
        for (int i = 0; i < 10000; i++)
            x = x * 1.0000001 + 1e-9;
    sink = x;
    CHECK(zt_sys_sample_take(&s, &a) == ZT_OK, "%s", zt_last_error());
    double wall = wall_s() - w0, proc = (proc_stat_cpu_s() - c0) / wall;
    /* /proc/self/stat counts whole ticks, so it may be up to two ticks off over the interval. */
    CHECK(fabs(a.cpu_util - proc) < 0.05 + 2 * tick / wall,
          "busy loop: sampler %.3f vs /proc/self/stat %.3f", a.cpu_util, proc);
    CHECK(a.cpu_util <= 1.05, "one thread cannot use more than one core: %.3f", a.cpu_util);
    /* Near 1 on an idle machine; on a loaded one, 1 less the share of the interval the scheduler
     * kept the runnable loop waiting for a core (/proc/self/schedstat's run-queue wait). */
    double queued = (sched_wait_s() - q0) / wall;
    if (!isnan(queued))
        CHECK(fabs(a.cpu_util - (1.0 - queued)) < 0.08,
              "busy loop: cpu_util %.3f vs 1 - run-queue wait %.3f", a.cpu_util, 1.0 - queued);
    printf("busy 0.5 s: cpu_util %.3f (/proc/self/stat %.3f, 1 - run-queue wait %.3f)\n",
           a.cpu_util, proc, 1.0 - queued);

    /* Idle: sleep 0.3 s. */
    w0 = wall_s();
    c0 = proc_stat_cpu_s();
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    CHECK(zt_sys_sample_take(&s, &a) == ZT_OK, "%s", zt_last_error());
    wall = wall_s() - w0;
    proc = (proc_stat_cpu_s() - c0) / wall;
    CHECK(a.cpu_util >= 0.0 && a.cpu_util < 0.05, "sleeping: cpu_util %.3f", a.cpu_util);
    CHECK(fabs(a.cpu_util - proc) < 0.05 + 2 * tick / wall,
          "sleeping: sampler %.3f vs /proc/self/stat %.3f", a.cpu_util, proc);
}

static void test_rss(void) {
    const size_t size = 64u << 20;
    const double mib = 1024.0 * 1024.0;
    zt_sys_sampler s;
    zt_sys_sample before, touched, released;
    zt_sys_sampler_init(&s);
    CHECK(zt_sys_sample_take(&s, &before) == ZT_OK, "%s", zt_last_error());
    double statm_before = statm_rss_bytes();
    CHECK(fabs(before.rss_bytes - statm_before) < 1 * mib,
          "VmRSS %.1f MiB vs statm %.1f MiB", before.rss_bytes / mib, statm_before / mib);

    /* mmap'd directly, so that munmap returns the pages whatever malloc would keep. */
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    if (p == MAP_FAILED)
        return;
    long page = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < size; i += (size_t)page)
        p[i] = (char)i;
    CHECK(zt_sys_sample_take(&s, &touched) == ZT_OK, "%s", zt_last_error());
    double statm_touched = statm_rss_bytes();
    double rise = touched.rss_bytes - before.rss_bytes;
    CHECK(fabs(rise - (double)size) < 4 * mib, "touching 64 MiB raised VmRSS by %.1f MiB",
          rise / mib);
    CHECK(fabs(touched.rss_bytes - statm_touched) < 1 * mib,
          "VmRSS %.1f MiB vs statm %.1f MiB", touched.rss_bytes / mib, statm_touched / mib);
    CHECK(touched.peak_rss_bytes >= touched.rss_bytes - 0.5 * mib,
          "peak %.1f MiB below the resident %.1f MiB", touched.peak_rss_bytes / mib,
          touched.rss_bytes / mib);
    printf("64 MiB touched: rss %.1f -> %.1f MiB (statm %.1f MiB), peak %.1f MiB\n",
           before.rss_bytes / mib, touched.rss_bytes / mib, statm_touched / mib,
           touched.peak_rss_bytes / mib);

    munmap(p, size);
    CHECK(zt_sys_sample_take(&s, &released) == ZT_OK, "%s", zt_last_error());
    CHECK(touched.rss_bytes - released.rss_bytes > (double)size - 4 * mib,
          "munmap lowered VmRSS by only %.1f MiB", (touched.rss_bytes - released.rss_bytes) / mib);
    CHECK(released.peak_rss_bytes >= touched.rss_bytes - 0.5 * mib,
          "the peak forgot the 64 MiB: %.1f MiB after %.1f MiB resident",
          released.peak_rss_bytes / mib, touched.rss_bytes / mib);
}

int main(void) {
    test_cpu_util();
    test_rss();
    return check_summary("test_sysmetrics");
}
