/* NVML through dlopen (ztrain/nvml.h): the few functions the GPU metrics need, declared here with
 * the types of NVIDIA's nvml.h so that building needs neither the header nor the library. */
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/nvml.h"

typedef int nvml_return;             /* nvmlReturn_t; 0 is NVML_SUCCESS */
typedef struct nvml_device *nvml_device;
enum { NVML_SUCCESS = 0, NVML_ERROR_NOT_SUPPORTED = 3, NVML_TEMPERATURE_GPU = 0,
       NVML_UUID_BUFFER = 96 };
typedef struct {
    unsigned int gpu, memory;
} nvml_utilization;
typedef struct {
    unsigned long long total, free, used;
} nvml_memory;

struct zt_nvml {
    void *lib;
    nvml_return (*init)(void);
    nvml_return (*shutdown)(void);
    const char *(*error_string)(nvml_return);
    nvml_return (*count)(unsigned int *);
    nvml_return (*handle)(unsigned int, nvml_device *);
    nvml_return (*utilization)(nvml_device, nvml_utilization *);
    nvml_return (*memory)(nvml_device, nvml_memory *);
    nvml_return (*power)(nvml_device, unsigned int *);
    nvml_return (*temperature)(nvml_device, int, unsigned int *);
    nvml_return (*uuid)(nvml_device, char *, unsigned int);
};

/* Resolves every symbol the table needs; the name of the first one missing, or NULL. */
static const char *resolve(zt_nvml *n) {
    static const struct {
        const char *name;
        size_t offset;
    } syms[] = {
        {"nvmlInit_v2", offsetof(zt_nvml, init)},
        {"nvmlShutdown", offsetof(zt_nvml, shutdown)},
        {"nvmlErrorString", offsetof(zt_nvml, error_string)},
        {"nvmlDeviceGetCount_v2", offsetof(zt_nvml, count)},
        {"nvmlDeviceGetHandleByIndex_v2", offsetof(zt_nvml, handle)},
        {"nvmlDeviceGetUtilizationRates", offsetof(zt_nvml, utilization)},
        {"nvmlDeviceGetMemoryInfo", offsetof(zt_nvml, memory)},
        {"nvmlDeviceGetPowerUsage", offsetof(zt_nvml, power)},
        {"nvmlDeviceGetTemperature", offsetof(zt_nvml, temperature)},
        {"nvmlDeviceGetUUID", offsetof(zt_nvml, uuid)},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
        void *f = dlsym(n->lib, syms[i].name);
        if (!f)
            return syms[i].name;
        /* POSIX guarantees that a function pointer round-trips through dlsym's void *. */
        memcpy((char *)n + syms[i].offset, &f, sizeof f);
    }
    return NULL;
}

zt_status zt_nvml_open(zt_nvml **out) {
    *out = NULL;
    zt_nvml *n = calloc(1, sizeof *n);
    if (!n)
        return zt_error(ZT_ERR_NOMEM, "nvml: out of memory");
    n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        const char *why = dlerror();
        free(n);
        return zt_error(ZT_ERR_UNSUPPORTED, "NVML not present: %s",
                        why ? why : "libnvidia-ml.so.1 cannot be loaded");
    }
    const char *missing = resolve(n);
    if (missing) {
        dlclose(n->lib);
        free(n);
        return zt_error(ZT_ERR_UNSUPPORTED, "NVML not present: libnvidia-ml.so.1 has no %s",
                        missing);
    }
    nvml_return r = n->init();
    if (r != NVML_SUCCESS) {
        zt_status s = zt_error(ZT_ERR_IO, "nvml: nvmlInit failed: %s", n->error_string(r));
        dlclose(n->lib);
        free(n);
        return s;
    }
    *out = n;
    return ZT_OK;
}

void zt_nvml_close(zt_nvml *n) {
    if (!n)
        return;
    n->shutdown();
    dlclose(n->lib);
    free(n);
}

zt_status zt_nvml_device_count(zt_nvml *n, int *count) {
    unsigned int c = 0;
    nvml_return r = n->count(&c);
    if (r != NVML_SUCCESS)
        return zt_error(ZT_ERR_IO, "nvml: nvmlDeviceGetCount failed: %s", n->error_string(r));
    *count = (int)c;
    return ZT_OK;
}

static zt_status device(zt_nvml *n, int index, nvml_device *d) {
    nvml_return r = index >= 0 ? n->handle((unsigned int)index, d) : NVML_ERROR_NOT_SUPPORTED;
    if (r != NVML_SUCCESS)
        return zt_error(ZT_ERR_INVALID, "nvml: no GPU with index %d (%s)", index,
                        index >= 0 ? n->error_string(r) : "negative");
    return ZT_OK;
}

/* The index of the device whose UUID starts with prefix (CUDA accepts a unique prefix). */
static zt_status find_uuid(zt_nvml *n, const char *prefix, size_t len, int count, int *index) {
    for (int i = 0; i < count; i++) {
        nvml_device d;
        char uuid[NVML_UUID_BUFFER];
        if (n->handle((unsigned int)i, &d) == NVML_SUCCESS &&
            n->uuid(d, uuid, sizeof uuid) == NVML_SUCCESS && strncmp(uuid, prefix, len) == 0) {
            *index = i;
            return ZT_OK;
        }
    }
    return zt_error(ZT_ERR_INVALID, "CUDA_VISIBLE_DEVICES: no GPU has the UUID %.*s", (int)len,
                    prefix);
}

zt_status zt_nvml_device_for_local_rank(zt_nvml *n, int local_rank, int *index) {
    int count = 0;
    ZT_TRY(zt_nvml_device_count(n, &count));
    if (count < 1)
        return zt_error(ZT_ERR_INVALID, "nvml: the host has no GPU");
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (!visible || !visible[0]) {
        *index = local_rank % count;
        return ZT_OK;
    }
    int entries = 1;
    for (const char *p = visible; *p; p++)
        entries += *p == ',';
    int want = local_rank % entries;
    const char *e = visible;
    for (int i = 0; i < want; i++)
        e = strchr(e, ',') + 1;
    size_t len = strcspn(e, ",");
    if (strncmp(e, "GPU-", 4) == 0)
        return find_uuid(n, e, len, count, index);
    char *end;
    long v = strtol(e, &end, 10);
    if (end == e || (size_t)(end - e) != len || v < 0 || v >= count)
        return zt_error(ZT_ERR_INVALID,
                        "CUDA_VISIBLE_DEVICES: entry \"%.*s\" names none of the host's %d GPUs",
                        (int)len, e, count);
    *index = (int)v;
    return ZT_OK;
}

zt_status zt_nvml_sample(zt_nvml *n, int index, zt_gpu_sample *out) {
    nvml_device d;
    ZT_TRY(device(n, index, &d));
    *out = (zt_gpu_sample){NAN, NAN, NAN, NAN, NAN};
    nvml_memory mem;
    nvml_return r = n->memory(d, &mem);
    if (r != NVML_SUCCESS)
        return zt_error(ZT_ERR_IO, "nvml: memory of GPU %d: %s", index, n->error_string(r));
    out->memory_used_bytes = (double)mem.used;
    out->memory_total_bytes = (double)mem.total;
    /* Utilisation, power and temperature are optional: boards that lack a sensor say so. */
    nvml_utilization u;
    if (n->utilization(d, &u) == NVML_SUCCESS)
        out->util = u.gpu / 100.0;
    unsigned int v;
    if (n->power(d, &v) == NVML_SUCCESS)
        out->power_watts = v / 1e3;
    if (n->temperature(d, NVML_TEMPERATURE_GPU, &v) == NVML_SUCCESS)
        out->temperature_c = v;
    return ZT_OK;
}
