/* A stand-in for NVIDIA's libnvidia-ml.so.1 with fixed readings, built as
 * build/nvml-stub/libnvidia-ml.so.1 so that test_nvml (run with LD_LIBRARY_PATH pointing there)
 * exercises engine/observe/nvml.c on hosts without a GPU. The functions have NVML's names and C types;
 * the readings of device i (three devices) are:
 *   UUID "GPU-5b0c-000<i>", utilisation 37 + i %, memory used (i + 1) GiB of 80 GiB,
 *   power 250500 + 1000 i mW (device 2: NVML_ERROR_NOT_SUPPORTED), temperature 40 + i C. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { SUCCESS = 0, ERROR_INVALID_ARGUMENT = 2, ERROR_NOT_SUPPORTED = 3, DEVICES = 3 };
typedef struct {
    unsigned int gpu, memory;
} utilization;
typedef struct {
    unsigned long long total, free, used;
} memory;

/* A device handle is its index + 1, so that no handle is NULL. */
static int index_of(void *device) { return (int)(intptr_t)device - 1; }

int nvmlInit_v2(void) { return getenv("NVML_STUB_INIT_FAILS") ? 9 : SUCCESS; }
int nvmlShutdown(void) { return SUCCESS; }

const char *nvmlErrorString(int r) {
    return r == 9 ? "Driver Not Loaded" : r == ERROR_INVALID_ARGUMENT ? "Invalid Argument"
                                                                      : "Unknown Error";
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    *count = DEVICES;
    return SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    if (index >= DEVICES)
        return ERROR_INVALID_ARGUMENT;
    *device = (void *)(intptr_t)(index + 1);
    return SUCCESS;
}

int nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    snprintf(uuid, length, "GPU-5b0c-%04d", index_of(device));
    return SUCCESS;
}

int nvmlDeviceGetUtilizationRates(void *device, utilization *u) {
    u->gpu = 37 + (unsigned)index_of(device);
    u->memory = 10;
    return SUCCESS;
}

int nvmlDeviceGetMemoryInfo(void *device, memory *m) {
    m->total = 80ull << 30;
    m->used = (unsigned long long)(index_of(device) + 1) << 30;
    m->free = m->total - m->used;
    return SUCCESS;
}

int nvmlDeviceGetPowerUsage(void *device, unsigned int *mw) {
    if (index_of(device) == 2)
        return ERROR_NOT_SUPPORTED;
    *mw = 250500 + 1000 * (unsigned)index_of(device);
    return SUCCESS;
}

int nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *c) {
    if (sensor != 0)
        return ERROR_INVALID_ARGUMENT;
    *c = 40 + (unsigned)index_of(device);
    return SUCCESS;
}
