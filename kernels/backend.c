/* Backend creation by device: the one place that knows which backends this build has.
 *
 * The CUDA backend is a shared module, libztrain_cuda.so, loaded here on first use: linking
 * cuBLASLt (half a gigabyte of library whose relocations alone add about 100 MB to a process's
 * resident memory) into every program would charge that to every CPU rank. The module calls back
 * into this library (zt_error, ...), which the programs export (CMake's ENABLE_EXPORTS). Tests
 * load the emulated CUDA device (libztrain_cuda_emu.so) in its place through the environment. */
#include <stdio.h>

#include "ztrain/backend.h"
#include "ztrain/nccl.h"

#if defined(ZT_HAVE_CUDA) || defined(ZT_CUDA_EMU_MODULE)
#define ZT_CUDA_LOADER 1
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The module's entry points (kernels/cuda/cuda_backend.h). */
static struct {
    void *handle;
    zt_status (*create)(zt_backend **out, const zt_backend_options *opts);
    int (*count)(void);
    zt_status (*memory)(zt_backend *be, zt_cuda_memory *out);
    zt_status (*waits)(zt_backend *be, zt_cuda_waits *out);
    const zt_nccl_api *(*nccl)(void); /* NULL in a module built without NCCL */
} cuda_module;
static char cuda_module_error[512];
static pthread_once_t cuda_module_once = PTHREAD_ONCE_INIT;

/* Which module the environment asks for, as a test facility: ZTRAIN_CUDA_MODULE=<path> loads
 * that file, ZTRAIN_CUDA_EMU=1 the emulated CUDA device of this build tree
 * (libztrain_cuda_emu.so, docs/gpu.md); NULL for the real module. False, with the error set,
 * when the variables make no sense. */
static bool cuda_module_requested(const char **path) {
    *path = NULL;
    const char *mod = getenv("ZTRAIN_CUDA_MODULE"), *emu = getenv("ZTRAIN_CUDA_EMU");
    if (emu && *emu && strcmp(emu, "0") != 0 && strcmp(emu, "1") != 0) {
        snprintf(cuda_module_error, sizeof cuda_module_error,
                 "ZTRAIN_CUDA_EMU=%s: expected 1 (the emulated device) or 0", emu);
        return false;
    }
    if (mod && *mod) {
        *path = mod;
        return true;
    }
    if (emu && strcmp(emu, "1") == 0) {
#ifdef ZT_CUDA_EMU_MODULE
        *path = ZT_CUDA_EMU_MODULE;
#else
        snprintf(cuda_module_error, sizeof cuda_module_error,
                 "ZTRAIN_CUDA_EMU=1: this build has no emulated CUDA device (configure with "
                 "-DZT_CUDA_EMU=ON where the CUDA toolkit's headers are installed)");
        return false;
#endif
    }
    return true;
}

/* The requested module; else the real one by name first (LD_LIBRARY_PATH, the program's run
 * path: a carried or installed build), then at the path of the build tree that made this
 * library. */
static void cuda_module_load(void) {
    const char *path;
    if (!cuda_module_requested(&path))
        return;
    void *h = NULL;
    if (path)
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
#ifdef ZT_HAVE_CUDA
    else if (!(h = dlopen("libztrain_cuda.so", RTLD_NOW | RTLD_LOCAL)))
        h = dlopen(ZT_CUDA_MODULE, RTLD_NOW | RTLD_LOCAL);
#else
    else {
        snprintf(cuda_module_error, sizeof cuda_module_error,
                 "this build has no CUDA backend (configure with -DZT_CUDA=ON on a machine with "
                 "the CUDA toolkit); only the emulated device, with ZTRAIN_CUDA_EMU=1");
        return;
    }
#endif
    if (!h) {
        snprintf(cuda_module_error, sizeof cuda_module_error, "%s", dlerror());
        return;
    }
    *(void **)&cuda_module.create = dlsym(h, "zt_cuda_backend_create");
    *(void **)&cuda_module.count = dlsym(h, "zt_cuda_device_count");
    *(void **)&cuda_module.memory = dlsym(h, "zt_cuda_memory_of");
    *(void **)&cuda_module.waits = dlsym(h, "zt_cuda_waits_of");
    *(void **)&cuda_module.nccl = dlsym(h, "zt_cuda_nccl_api");
    if (!cuda_module.create || !cuda_module.count || !cuda_module.memory || !cuda_module.waits) {
        snprintf(cuda_module_error, sizeof cuda_module_error, "%s lacks its entry points",
                 path ? path : "libztrain_cuda.so");
        cuda_module.create = NULL;
        return;
    }
    cuda_module.handle = h;
}

/* Whether the module is loaded; its failure is left for zt_last_error otherwise. */
static bool cuda_module_ready(void) {
    pthread_once(&cuda_module_once, cuda_module_load);
    if (cuda_module.create)
        return true;
    zt_error(ZT_ERR_UNSUPPORTED, "device \"cuda\": cannot load the CUDA backend: %s",
             cuda_module_error);
    return false;
}

zt_status zt_backend_cuda_create(zt_backend **out, const zt_backend_options *opts) {
    *out = NULL;
    return cuda_module_ready() ? cuda_module.create(out, opts) : ZT_ERR_UNSUPPORTED;
}

int zt_backend_cuda_device_count(void) { return cuda_module_ready() ? cuda_module.count() : 0; }

zt_status zt_backend_cuda_memory(zt_backend *be, zt_cuda_memory *out) {
    if (!be || be->device != ZT_DEVICE_CUDA)
        return zt_error(ZT_ERR_INVALID, "backend \"%s\": device memory counts are the CUDA "
                        "backend's", be ? be->name : "?");
    return cuda_module.memory(be, out);
}

zt_status zt_backend_cuda_waits(zt_backend *be, zt_cuda_waits *out) {
    if (!be || be->device != ZT_DEVICE_CUDA)
        return zt_error(ZT_ERR_INVALID, "backend \"%s\": host waits are the CUDA backend's",
                        be ? be->name : "?");
    return cuda_module.waits(be, out);
}

const zt_nccl_api *zt_nccl_api_get(void) {
    if (!cuda_module_ready())
        return NULL;
    const zt_nccl_api *api = cuda_module.nccl ? cuda_module.nccl() : NULL;
    if (!api)
        zt_error(ZT_ERR_UNSUPPORTED, "nccl: the CUDA module was built without NCCL");
    else if (api->version != ZT_NCCL_API_VERSION)
        zt_error(ZT_ERR_UNSUPPORTED, "nccl: the CUDA module's NCCL table is version %d, this "
                 "program's %d (a module from another build)", api->version, ZT_NCCL_API_VERSION);
    return api && api->version == ZT_NCCL_API_VERSION ? api : NULL;
}

void *zt_backend_cuda_symbol(const char *name) {
    return cuda_module_ready() ? dlsym(cuda_module.handle, name) : NULL;
}

/* Whether this process can have the CUDA backend: a real module built, or one the environment
 * names. */
static bool cuda_module_possible(void) {
#ifdef ZT_HAVE_CUDA
    return true;
#else
    const char *path;
    return cuda_module_requested(&path) && path;
#endif
}
#else
const zt_nccl_api *zt_nccl_api_get(void) {
    zt_error(ZT_ERR_UNSUPPORTED, "nccl: this build has no CUDA module (configure with the CUDA "
             "toolkit and -DZT_CUDA=ON)");
    return NULL;
}
#endif

const char *zt_device_name(zt_device d) {
    static const char *const names[ZT_DEVICE_COUNT] = {"cpu", "cuda"};
    return (unsigned)d < ZT_DEVICE_COUNT ? names[d] : "?";
}

bool zt_backend_available(zt_device device) {
    switch (device) {
    case ZT_DEVICE_CPU:
        return true;
    case ZT_DEVICE_CUDA:
#ifdef ZT_CUDA_LOADER
        return cuda_module_possible();
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
#ifdef ZT_CUDA_LOADER
        return cuda_module_possible() ? zt_backend_cuda_device_count() : 0;
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
#ifdef ZT_CUDA_LOADER
        /* A build with only the emulated device has no CUDA backend unless the environment
         * asks for the emulator: the same answer as a build without either. */
        if (!cuda_module_possible())
            return zt_error(ZT_ERR_INVALID, "device \"cuda\": %s",
                            cuda_module_error[0] ? cuda_module_error
                                                 : "this build has no CUDA backend (configure "
                                                   "with -DZT_CUDA=ON on a machine with the CUDA "
                                                   "toolkit); only the emulated device, with "
                                                   "ZTRAIN_CUDA_EMU=1");
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

#ifndef ZT_CUDA_LOADER
void *zt_backend_cuda_symbol(const char *name) {
    (void)name;
    return NULL;
}

zt_status zt_backend_cuda_memory(zt_backend *be, zt_cuda_memory *out) {
    (void)out;
    return zt_error(ZT_ERR_INVALID, "backend \"%s\": device memory counts are the CUDA backend's "
                    "(this build has none)", be ? be->name : "?");
}

zt_status zt_backend_cuda_waits(zt_backend *be, zt_cuda_waits *out) {
    (void)out;
    return zt_error(ZT_ERR_INVALID, "backend \"%s\": host waits are the CUDA backend's (this "
                    "build has none)", be ? be->name : "?");
}
#endif
