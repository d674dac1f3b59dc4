/* Per-rank memory, step breakdown and system metrics (rank_stats.h). Each rank fills its row of a
 * world × per_rank table, and one sum all-reduce gives every rank the whole table (the other rows
 * are zero, so a sum copies them exactly): a logged step's only collective beyond the step's. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "ztrain/rank_stats.h"

/* The row of one rank, in this order; the fp32 workspace only in mixed precision, the device and
 * GPU figures only with device cuda. */
enum {
    M_PARAMS, M_GRADS, M_OPTIMIZER, M_PEAK_RSS, M_FP32_WORKSPACE, M_DEVICE_ALLOCATED, M_DEVICE_PEAK,
    F_STEP_TIME, F_DATA, F_FWD, F_BWD, F_STEP, F_COMM, F_COMPUTE, F_CPU, F_RSS, F_PEAK_RSS,
    F_GPU_UTIL, F_GPU_MEM, F_GPU_MEM_TOTAL, F_GPU_POWER, F_GPU_TEMP, F_DEVICE_WAIT, F_COUNT
};
static const char *const field_keys[F_COUNT] = {
    "memory/rank%d/params_bytes", "memory/rank%d/grads_bytes",
    "memory/rank%d/optimizer_bytes", "memory/rank%d/peak_rss_bytes",
    "memory/rank%d/fp32_workspace_bytes", "memory/rank%d/device_allocated_bytes",
    "memory/rank%d/device_peak_bytes",
    "perf/rank%d/step_time_ms",   "perf/rank%d/data_ms",
    "perf/rank%d/fwd_ms",         "perf/rank%d/bwd_ms",
    "perf/rank%d/step_ms",        "perf/rank%d/comm_ms",
    "perf/rank%d/compute_ms",     "system/rank%d/cpu_util",
    "system/rank%d/rss_bytes",    "system/rank%d/peak_rss_bytes",
    "system/rank%d/gpu_util",     "system/rank%d/gpu_memory_used_bytes",
    "system/rank%d/gpu_memory_total_bytes", "system/rank%d/gpu_power_watts",
    "system/rank%d/gpu_temperature_c", "perf/rank%d/device_wait_ms",
};
enum { N_STRAGGLER = 4 };

_Static_assert(F_COUNT <= (int)(sizeof ((zt_rank_stats *)0)->mine / sizeof(double)) &&
                   F_COUNT <= (int)(sizeof ((zt_rank_stats *)0)->field / sizeof(int)),
               "zt_rank_stats.mine and .field hold a row");

/* Whether a job of this device and precision has figure f. */
static bool applies(int f, zt_device device, bool mixed_precision) {
    if (f == M_FP32_WORKSPACE)
        return mixed_precision;
    if (f == M_DEVICE_ALLOCATED || f == M_DEVICE_PEAK || f >= F_GPU_UTIL)
        return device == ZT_DEVICE_CUDA;
    return true;
}

/* Opens NVML for this rank's GPU; on failure the GPU figures stay NaN and rank 0 says why. */
static void open_gpu(zt_rank_stats *rs, int local_rank, FILE *note) {
    zt_status s = zt_nvml_open(&rs->nvml);
    if (s == ZT_OK)
        s = zt_nvml_device_for_local_rank(rs->nvml, local_rank, &rs->gpu_index);
    if (s == ZT_OK)
        return;
    zt_nvml_close(rs->nvml);
    rs->nvml = NULL;
    if (note && rs->rank == 0) {
        fprintf(note, "[ztrain] GPU metrics are off (no system/rank<r>/gpu_* figures): %s\n",
                zt_last_error());
        fflush(note);
    }
}

zt_status zt_rank_stats_init(zt_rank_stats *rs, int rank, int world, int local_rank,
                             zt_device device, bool mixed_precision, FILE *note) {
    memset(rs, 0, sizeof *rs);
    rs->rank = rank;
    rs->world = world;
    for (int f = 0; f < F_COUNT; f++)
        if (applies(f, device, mixed_precision))
            rs->field[rs->per_rank++] = f;
    size_t slots = (size_t)rs->per_rank * (size_t)world;
    rs->values = calloc(slots, sizeof *rs->values);
    rs->keys = calloc(slots, sizeof *rs->keys);
    rs->compute = calloc((size_t)world, sizeof *rs->compute);
    if (!rs->values || !rs->keys || !rs->compute)
        return zt_error(ZT_ERR_NOMEM, "out of memory for the per-rank metrics of %d ranks", world);
    for (int r = 0; r < world; r++)
        for (int f = 0; f < rs->per_rank; f++)
            snprintf(rs->keys[r * rs->per_rank + f], sizeof *rs->keys, field_keys[rs->field[f]], r);
    for (int f = 0; f < F_COUNT; f++)
        rs->mine[f] = NAN;
    if (device == ZT_DEVICE_CUDA)
        open_gpu(rs, local_rank, note);
    const char *slow = getenv("ZTRAIN_INJECT_SLOW_RANK");
    double ms;
    int at = 0;
    if (slow && sscanf(slow, "%lf:%d", &ms, &at) >= 1 && at == rank && ms > 0)
        rs->slow_ms = ms;
    zt_sys_sampler_init(&rs->sys);
    return ZT_OK;
}

void zt_rank_stats_inject_delay(const zt_rank_stats *rs) {
    if (rs->slow_ms <= 0)
        return;
    struct timespec ts = {(time_t)(rs->slow_ms / 1e3),
                          (long)(fmod(rs->slow_ms, 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void zt_rank_stats_free(zt_rank_stats *rs) {
    zt_nvml_close(rs->nvml);
    free(rs->values);
    free(rs->keys);
    free(rs->compute);
    memset(rs, 0, sizeof *rs);
}

int zt_rank_stats_max_metrics(const zt_rank_stats *rs) {
    return rs->per_rank * rs->world + N_STRAGGLER;
}

void zt_rank_stats_step(zt_rank_stats *rs, const zt_rank_step *st) {
    const zt_engine_timers *tm = &st->engine;
    double *m = rs->mine;
    m[F_STEP_TIME] = st->step_time;
    m[F_DATA] = st->data;
    m[F_FWD] = tm->forward_ms - tm->forward_comm_ms;
    m[F_BWD] = tm->backward_ms - tm->backward_comm_ms;
    m[F_STEP] = tm->step_ms - tm->step_comm_ms;
    m[F_COMM] = st->comm;
    /* What the other ranks wait for: a rank slow in computing (or in reading its data) makes the
     * others wait in the collectives, so its own communication time is the shortest. */
    m[F_COMPUTE] = st->step_time - st->comm;
    m[F_DEVICE_WAIT] = st->device_wait;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The slowest rank by compute time, and how it compares with the statistical median of the
 * ranks' compute times (the mean of the two middle ones for an even number; the slow_rank
 * event compares with the lower median instead, and says so: anomaly.h). */
static int write_straggler(zt_rank_stats *rs, zt_metric *dst) {
    int slow = 0;
    int col = 0;
    while (rs->field[col] != F_COMPUTE)
        col++;
    for (int r = 0; r < rs->world; r++) {
        rs->compute[r] = rs->values[r * rs->per_rank + col];
        if (rs->compute[r] > rs->compute[slow])
            slow = r;
    }
    double worst = rs->compute[slow];
    qsort(rs->compute, (size_t)rs->world, sizeof *rs->compute, cmp_double);
    int w = rs->world;
    double median = w % 2 ? rs->compute[w / 2] : 0.5 * (rs->compute[w / 2 - 1] + rs->compute[w / 2]);
    dst[0] = (zt_metric){"perf/straggler_rank", slow};
    dst[1] = (zt_metric){"perf/straggler_compute_ms", worst};
    dst[2] = (zt_metric){"perf/median_compute_ms", median};
    dst[3] = (zt_metric){"perf/straggler_ratio", median > 0 ? worst / median : NAN};
    return N_STRAGGLER;
}

zt_status zt_rank_stats_collect(zt_rank_stats *rs, zt_comm *comm, const zt_rank_memory *mem,
                                zt_metric *dst, int *n) {
    double *m = rs->mine;
    struct rusage ru;
    m[M_PARAMS] = mem->model.params_bytes;
    m[M_GRADS] = mem->model.grads_bytes;
    m[M_OPTIMIZER] = mem->model.optimizer_bytes;
    m[M_PEAK_RSS] = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss * 1024.0 : NAN;
    m[M_FP32_WORKSPACE] = mem->model.workspace_bytes;
    m[M_DEVICE_ALLOCATED] = (double)mem->device.allocated;
    m[M_DEVICE_PEAK] = (double)mem->device.peak;
    zt_sys_sample sys;
    /* Without /proc the figures are left out rather than the training failing. */
    (void)zt_sys_sample_take(&rs->sys, &sys);
    m[F_CPU] = sys.cpu_util;
    m[F_RSS] = sys.rss_bytes;
    m[F_PEAK_RSS] = sys.peak_rss_bytes;
    zt_gpu_sample g = {NAN, NAN, NAN, NAN, NAN};
    if (rs->nvml && zt_nvml_sample(rs->nvml, rs->gpu_index, &g) != ZT_OK)
        g = (zt_gpu_sample){NAN, NAN, NAN, NAN, NAN};
    m[F_GPU_UTIL] = g.util;
    m[F_GPU_MEM] = g.memory_used_bytes;
    m[F_GPU_MEM_TOTAL] = g.memory_total_bytes;
    m[F_GPU_POWER] = g.power_watts;
    m[F_GPU_TEMP] = g.temperature_c;

    size_t slots = (size_t)rs->per_rank * (size_t)rs->world;
    memset(rs->values, 0, slots * sizeof *rs->values);
    double *row = rs->values + (size_t)rs->rank * rs->per_rank;
    for (int f = 0; f < rs->per_rank; f++)
        row[f] = m[rs->field[f]];
    if (comm)
        ZT_TRY(zt_comm_all_reduce(comm, rs->values, slots, ZT_F64, ZT_REDUCE_SUM));
    /* A figure a rank could not measure is left out rather than written as null, so every
     * value in a record is a number. */
    int k = 0;
    for (size_t i = 0; i < slots; i++)
        if (isfinite(rs->values[i]))
            dst[k++] = (zt_metric){rs->keys[i], rs->values[i]};
    if (rs->world > 1) {
        zt_metric st[N_STRAGGLER];
        int m = write_straggler(rs, st);
        for (int i = 0; i < m; i++)
            if (isfinite(st[i].value))
                dst[k++] = st[i];
    }
    *n = k;
    return ZT_OK;
}
