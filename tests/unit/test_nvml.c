/* NVML through dlopen (engine/observe/nvml.c) and the per-rank figures built on it (engine/observe/rank_stats.c).
 *
 * Plain: the host's own libnvidia-ml.so.1. Without one (CI) opening says "NVML not present", and
 * a cuda job's per-rank figures carry no GPU keys, with one note from rank 0; with one (a GPU
 * host) the first GPU's readings are in range and the figures have them.
 * With --stub (ctest's unit/test_nvml_stub, LD_LIBRARY_PATH at tests/unit/nvml_stub.c's build):
 * every reading, unit conversion and CUDA_VISIBLE_DEVICES rule against the stub's fixed values.
 * Both: the step breakdown's arithmetic and the straggler of one rank's figures. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ztrain/rank_stats.h"
#include "ztrain/nvml.h"

static const double GIB = 1024.0 * 1024.0 * 1024.0;

/* The metric with this key in m[0..n), or NaN. */
static double find(const zt_metric *m, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (strcmp(m[i].key, key) == 0)
            return m[i].value;
    return NAN;
}

static bool has_prefix(const zt_metric *m, int n, const char *prefix) {
    for (int i = 0; i < n; i++)
        if (strncmp(m[i].key, prefix, strlen(prefix)) == 0)
            return true;
    return false;
}

static void check_device_choice(zt_nvml *n, const char *visible, int local_rank, int want) {
    if (visible)
        setenv("CUDA_VISIBLE_DEVICES", visible, 1);
    else
        unsetenv("CUDA_VISIBLE_DEVICES");
    int got = -1;
    zt_status s = zt_nvml_device_for_local_rank(n, local_rank, &got);
    if (want >= 0) {
        CHECK(s == ZT_OK && got == want, "CUDA_VISIBLE_DEVICES=%s local rank %d: device %d, want %d (%s)",
              visible ? visible : "(unset)", local_rank, got, want, zt_last_error());
    } else {
        CHECK(s == ZT_ERR_INVALID && strstr(zt_last_error(), "CUDA_VISIBLE_DEVICES"),
              "CUDA_VISIBLE_DEVICES=%s local rank %d: status %s, %s", visible, local_rank,
              zt_status_name(s), zt_last_error());
    }
    unsetenv("CUDA_VISIBLE_DEVICES");
}

static void test_stub(void) {
    zt_nvml *n = NULL;
    CHECK(zt_nvml_open(&n) == ZT_OK, "%s", zt_last_error());
    if (!n)
        return;
    int count = 0;
    CHECK(zt_nvml_device_count(n, &count) == ZT_OK && count == 3, "count %d", count);
    check_device_choice(n, NULL, 4, 1);
    check_device_choice(n, "2,0", 0, 2);
    check_device_choice(n, "2,0", 1, 0);
    check_device_choice(n, "2,0", 3, 0);
    check_device_choice(n, "GPU-5b0c-0001", 0, 1);
    check_device_choice(n, "1,GPU-5b0c-0002", 1, 2);
    check_device_choice(n, "7", 0, -1);
    check_device_choice(n, "1,x", 1, -1);
    check_device_choice(n, "GPU-ffff", 0, -1);

    zt_gpu_sample g;
    CHECK(zt_nvml_sample(n, 1, &g) == ZT_OK, "%s", zt_last_error());
    CHECK(g.util == 0.38 && g.memory_used_bytes == 2 * GIB && g.memory_total_bytes == 80 * GIB &&
              g.power_watts == 251.5 && g.temperature_c == 41,
          "device 1: util %g, memory %g of %g, %g W, %g C", g.util, g.memory_used_bytes,
          g.memory_total_bytes, g.power_watts, g.temperature_c);
    CHECK(zt_nvml_sample(n, 2, &g) == ZT_OK && isnan(g.power_watts) && g.util == 0.39,
          "device 2 has no power sensor: %g W (util %g)", g.power_watts, g.util);
    CHECK(zt_nvml_sample(n, 3, &g) == ZT_ERR_INVALID &&
              strstr(zt_last_error(), "no GPU with index 3"), "%s", zt_last_error());
    CHECK(zt_nvml_sample(n, -1, &g) == ZT_ERR_INVALID);
    zt_nvml_close(n);

    setenv("NVML_STUB_INIT_FAILS", "1", 1);
    n = (zt_nvml *)1;
    CHECK(zt_nvml_open(&n) == ZT_ERR_IO && n == NULL &&
              strstr(zt_last_error(), "nvmlInit failed: Driver Not Loaded"), "%s", zt_last_error());
    unsetenv("NVML_STUB_INIT_FAILS");
}

static void test_host(void) {
    zt_nvml *n = (zt_nvml *)1;
    zt_status st = zt_nvml_open(&n);
    if (st != ZT_OK) {
        CHECK(n == NULL);
        CHECK(st == ZT_ERR_IO || (st == ZT_ERR_UNSUPPORTED &&
                                  strncmp(zt_last_error(), "NVML not present: ", 18) == 0),
              "%s: %s", zt_status_name(st), zt_last_error());
        printf("nvml: %s\n", zt_last_error());
        return;
    }
    int count = 0, dev = -1;
    CHECK(zt_nvml_device_count(n, &count) == ZT_OK, "%s", zt_last_error());
    if (count > 0 && zt_nvml_device_for_local_rank(n, 0, &dev) == ZT_OK) {
        zt_gpu_sample g;
        CHECK(zt_nvml_sample(n, dev, &g) == ZT_OK, "%s", zt_last_error());
        CHECK(g.memory_total_bytes > 1e8 && g.memory_used_bytes <= g.memory_total_bytes,
              "memory %g of %g", g.memory_used_bytes, g.memory_total_bytes);
        CHECK(isnan(g.util) || (g.util >= 0 && g.util <= 1), "util %g", g.util);
        CHECK(isnan(g.temperature_c) || (g.temperature_c > 0 && g.temperature_c < 120), "%g C",
              g.temperature_c);
        CHECK(isnan(g.power_watts) || (g.power_watts > 0 && g.power_watts < 2000), "%g W",
              g.power_watts);
        printf("nvml: GPU %d of %d: util %.2f, memory %.2f/%.2f GB, %.0f W, %.0f C\n", dev, count,
               g.util, g.memory_used_bytes / 1e9, g.memory_total_bytes / 1e9, g.power_watts,
               g.temperature_c);
    }
    zt_nvml_close(n);
}

/* One rank of a cuda job: its figures after a step with known timers. */
static void test_rank_stats(bool stub) {
    zt_nvml *probe = NULL;
    bool have_nvml = zt_nvml_open(&probe) == ZT_OK;
    zt_nvml_close(probe);

    char *note = NULL;
    size_t note_len = 0;
    FILE *nf = open_memstream(&note, &note_len);
    zt_rank_stats rs;
    CHECK(zt_rank_stats_init(&rs, 0, 1, 0, ZT_DEVICE_CUDA, false, nf) == ZT_OK, "%s", zt_last_error());
    fclose(nf);
    zt_rank_step st = {.step_time = 100, .data = 5, .comm = 30, .device_wait = 42,
                       .engine = {.forward_ms = 30, .backward_ms = 50, .step_ms = 15,
                                  .forward_comm_ms = 4, .backward_comm_ms = 20,
                                  .step_comm_ms = 6}};
    zt_rank_stats_step(&rs, &st);
    zt_rank_memory mem = {.model = {.params_bytes = 1000, .grads_bytes = 2000,
                                    .optimizer_bytes = 3000, .workspace_bytes = 4000},
                          .device = {.allocated = 5000, .peak = 6000}};
    zt_metric m[64];
    int n = 0;
    CHECK(zt_rank_stats_max_metrics(&rs) <= 64);
    CHECK(zt_rank_stats_collect(&rs, NULL, &mem, m, &n) == ZT_OK, "%s", zt_last_error());
    CHECK(find(m, n, "perf/rank0/step_time_ms") == 100 && find(m, n, "perf/rank0/data_ms") == 5 &&
              find(m, n, "perf/rank0/fwd_ms") == 26 && find(m, n, "perf/rank0/bwd_ms") == 30 &&
              find(m, n, "perf/rank0/step_ms") == 9 && find(m, n, "perf/rank0/comm_ms") == 30 &&
              find(m, n, "perf/rank0/compute_ms") == 70,
          "breakdown: fwd %g bwd %g step %g compute %g", find(m, n, "perf/rank0/fwd_ms"),
          find(m, n, "perf/rank0/bwd_ms"), find(m, n, "perf/rank0/step_ms"),
          find(m, n, "perf/rank0/compute_ms"));
    CHECK(find(m, n, "perf/rank0/device_wait_ms") == 42, "device wait %g",
          find(m, n, "perf/rank0/device_wait_ms"));
    CHECK(find(m, n, "system/rank0/rss_bytes") > 0 && !has_prefix(m, n, "perf/straggler"),
          "one rank: memory, and no straggler");
    /* The model's and the device's memory ride in the same row; the fp32 workspace only in
     * mixed precision (this job is fp32). */
    CHECK(find(m, n, "memory/rank0/params_bytes") == 1000 &&
              find(m, n, "memory/rank0/grads_bytes") == 2000 &&
              find(m, n, "memory/rank0/optimizer_bytes") == 3000 &&
              find(m, n, "memory/rank0/device_allocated_bytes") == 5000 &&
              find(m, n, "memory/rank0/device_peak_bytes") == 6000 &&
              find(m, n, "memory/rank0/peak_rss_bytes") > 0 &&
              !has_prefix(m, n, "memory/rank0/fp32_workspace"),
          "memory figures: params %g, device peak %g", find(m, n, "memory/rank0/params_bytes"),
          find(m, n, "memory/rank0/device_peak_bytes"));
    if (stub) {
        CHECK(find(m, n, "system/rank0/gpu_util") == 0.37 &&
                  find(m, n, "system/rank0/gpu_memory_used_bytes") == GIB &&
                  find(m, n, "system/rank0/gpu_memory_total_bytes") == 80 * GIB &&
                  find(m, n, "system/rank0/gpu_power_watts") == 250.5 &&
                  find(m, n, "system/rank0/gpu_temperature_c") == 40,
              "GPU figures of device 0: util %g, power %g", find(m, n, "system/rank0/gpu_util"),
              find(m, n, "system/rank0/gpu_power_watts"));
        CHECK(note_len == 0, "no note when NVML works: %s", note);
    } else if (!have_nvml) {
        CHECK(!has_prefix(m, n, "system/rank0/gpu"), "no GPU keys without NVML");
        CHECK(note && strstr(note, "GPU metrics are off") && strstr(note, "NVML"), "note: %s",
              note ? note : "(none)");
    } else {
        CHECK(find(m, n, "system/rank0/gpu_memory_total_bytes") > 1e8, "a GPU host's figures");
    }
    free(note);
    zt_rank_stats_free(&rs);
}

int main(int argc, char **argv) {
    bool stub = argc > 1 && strcmp(argv[1], "--stub") == 0;
    if (stub)
        test_stub();
    else
        test_host();
    test_rank_stats(stub);
    return check_summary(stub ? "test_nvml --stub" : "test_nvml");
}
