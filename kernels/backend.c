/* Backend creation by device: the one place that knows which backends this build has. */
#include <stdio.h>

#include "ztrain/backend.h"

const char *zt_device_name(zt_device d) {
    static const char *const names[ZT_DEVICE_COUNT] = {"cpu", "cuda"};
    return (unsigned)d < ZT_DEVICE_COUNT ? names[d] : "?";
}

bool zt_backend_available(zt_device device) {
    switch (device) {
    case ZT_DEVICE_CPU:
        return true;
    case ZT_DEVICE_CUDA:
#ifdef ZT_HAVE_CUDA
        return true;
#else
        return false;
#endif
    default:
        return false;
    }
}

int zt_backend_device_count(zt_device device) {
    switch (device) {
    case ZT_DEVICE_CPU:
        return 1;
    case ZT_DEVICE_CUDA:
#ifdef ZT_HAVE_CUDA
        return zt_backend_cuda_device_count();
#else
        return 0;
#endif
    default:
        return 0;
    }
}

zt_status zt_backend_create(zt_backend **out, zt_device device, const zt_backend_options *opts) {
    static const zt_backend_options defaults = {0};
    if (!opts)
        opts = &defaults;
    *out = NULL;
    switch (device) {
    case ZT_DEVICE_CPU:
        return zt_backend_cpu_create(out, opts);
    case ZT_DEVICE_CUDA:
#ifdef ZT_HAVE_CUDA
        return zt_backend_cuda_create(out, opts);
#else
        return zt_error(ZT_ERR_INVALID,
                        "device \"cuda\": this build has no CUDA backend (configure with "
                        "-DZT_CUDA=ON on a machine with the CUDA toolkit)");
#endif
    default:
        return zt_error(ZT_ERR_INVALID, "device %d is not known (available: cpu)", (int)device);
    }
}

void zt_backend_destroy(zt_backend *be) {
    if (be)
        be->iface->destroy(be);
}

#ifndef ZT_HAVE_CUDA
zt_status zt_backend_cuda_memory(zt_backend *be, zt_cuda_memory *out) {
    (void)out;
    return zt_error(ZT_ERR_INVALID, "backend \"%s\": device memory counts are the CUDA backend's "
                    "(this build has none)", be ? be->name : "?");
}
#endif
