/* NVIDIA's management library (NVML), loaded at run time with dlopen("libnvidia-ml.so.1"), so the
 * same build runs on hosts without a driver: there zt_nvml_open says NVML is not present and the
 * caller leaves its GPU figures out. Used by the trainer for the "system/rank<r>/gpu_*" metrics
 * and meant for the CUDA backend's per-rank GPU memory and utilisation too.
 *
 *     zt_nvml *n;
 *     if (zt_nvml_open(&n) == ZT_OK) {           // else zt_last_error() says why (for a note)
 *         int dev;
 *         zt_gpu_sample g;
 *         if (zt_nvml_device_for_local_rank(n, local_rank, &dev) == ZT_OK &&
 *             zt_nvml_sample(n, dev, &g) == ZT_OK) ...
 *         zt_nvml_close(n);
 *     }
 *
 * One zt_nvml per process is enough; it may be opened more than once (NVML counts its inits).
 * Calls on one handle are not made from several threads at once. */
#ifndef ZTRAIN_NVML_H
#define ZTRAIN_NVML_H

#include "ztrain/status.h"

typedef struct zt_nvml zt_nvml;

/* One reading of a GPU. A figure the device does not report (NVML_ERROR_NOT_SUPPORTED, e.g.
 * power on some boards) is NaN; the others are still filled. */
typedef struct {
    double util;                /* fraction of the last sample period a kernel ran, 0..1 */
    double memory_used_bytes;   /* device memory in use (every process's) */
    double memory_total_bytes;
    double power_watts;
    double temperature_c;       /* the GPU die */
} zt_gpu_sample;

/* Loads the library and initialises NVML. ZT_ERR_UNSUPPORTED with "NVML not present: ..." (the
 * loader's reason) when libnvidia-ml.so.1 cannot be loaded or lacks a function used here, and
 * ZT_ERR_IO with NVML's error text when nvmlInit fails (a driver that is not loaded). *out is
 * NULL on failure. Free with zt_nvml_close. */
zt_status zt_nvml_open(zt_nvml **out);
/* Shuts NVML down and unloads the library. NULL is allowed. */
void zt_nvml_close(zt_nvml *n);

/* GPUs NVML sees (all of the host's, whatever CUDA_VISIBLE_DEVICES says). */
zt_status zt_nvml_device_count(zt_nvml *n, int *count);

/* The NVML index of the GPU a rank with this local rank uses under the CUDA convention (the
 * local_rank-th visible device): with CUDA_VISIBLE_DEVICES a list of indices, its local_rank-th
 * entry (wrapping when the ranks share fewer GPUs); a list of UUIDs ("GPU-..." prefixes) is
 * matched against each device's UUID; unset, local_rank modulo the device count. ZT_ERR_INVALID
 * naming CUDA_VISIBLE_DEVICES when an entry matches no device. */
zt_status zt_nvml_device_for_local_rank(zt_nvml *n, int local_rank, int *index);

/* Reads device `index` (NVML's numbering). ZT_ERR_INVALID naming the index when there is no such
 * device; ZT_ERR_IO with NVML's text when the memory query fails. */
zt_status zt_nvml_sample(zt_nvml *n, int index, zt_gpu_sample *out);

#endif
