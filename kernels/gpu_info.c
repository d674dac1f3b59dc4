/* What ztrain/gpu.h says about the visible GPUs: counted and described through the CUDA runtime
 * when the build has it, none otherwise; the table of peaks the MFU metric uses; which GPU a
 * rank takes and the CUDA_VISIBLE_DEVICES list a job is given.
 *
 * The CUDA runtime is opened here on first use (dlopen), not linked: no program of a CUDA build
 * depends on libcudart, a host without it simply has no GPUs, and a CPU rank that never asks
 * about GPUs never maps it.
 *
 * When the environment names a CUDA module (ZTRAIN_CUDA_EMU=1: the emulated CUDA device of the
 * tests, docs/gpu.md), that module answers instead, so the emulated H100 is what is seen. The
 * real module is not asked: loading it maps cuBLASLt, about 120 MB of resident memory, into
 * every process that only counts GPUs (ztraind among them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/backend.h"
#include "ztrain/gpu.h"

#ifdef ZT_HAVE_CUDART
#include <cuda_runtime_api.h> /* the types and the calls' signatures only */
#include <dlfcn.h>
#include <pthread.h>

/* The few runtime calls discovery makes, from the runtime this build was compiled against: by
 * its soname first (LD_LIBRARY_PATH, the linker's cache: a carried bundle, an image), then at
 * the toolkit's path. */
static struct {
    cudaError_t (*get_device_count)(int *);
    cudaError_t (*get_last_error)(void);
    cudaError_t (*set_device)(int);
    cudaError_t (*get_device)(int *);
    cudaError_t (*get_device_properties)(struct cudaDeviceProp *, int);
    cudaError_t (*mem_get_info)(size_t *, size_t *);
    const char *(*get_error_string)(cudaError_t);
} rt;
static bool rt_loaded;
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;

static void rt_load(void) {
    void *h = dlopen(ZT_CUDART_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        h = dlopen(ZT_CUDART_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    *(void **)&rt.get_device_count = dlsym(h, "cudaGetDeviceCount");
    *(void **)&rt.get_last_error = dlsym(h, "cudaGetLastError");
    *(void **)&rt.set_device = dlsym(h, "cudaSetDevice");
    *(void **)&rt.get_device = dlsym(h, "cudaGetDevice");
    *(void **)&rt.get_device_properties = dlsym(h, "cudaGetDeviceProperties");
    *(void **)&rt.mem_get_info = dlsym(h, "cudaMemGetInfo");
    *(void **)&rt.get_error_string = dlsym(h, "cudaGetErrorString");
    rt_loaded = rt.get_device_count && rt.get_last_error && rt.set_device && rt.get_device &&
                rt.get_device_properties && rt.mem_get_info && rt.get_error_string;
}

/* Whether the CUDA runtime could be opened (no runtime: no GPUs). */
static bool runtime(void) {
    pthread_once(&rt_once, rt_load);
    return rt_loaded;
}
#endif

/* Whether a module named by the environment answers (ZTRAIN_CUDA_EMU=1 or ZTRAIN_CUDA_MODULE). */
static bool module_answers(void) {
    const char *emu = getenv("ZTRAIN_CUDA_EMU"), *mod = getenv("ZTRAIN_CUDA_MODULE");
    return (emu && strcmp(emu, "1") == 0) || (mod && *mod);
}

bool zt_gpu_built(void) {
    if (module_answers())
        return zt_backend_available(ZT_DEVICE_CUDA);
#ifdef ZT_HAVE_CUDART
    return true;
#else
    return false;
#endif
}

int zt_gpu_count(void) {
    if (module_answers())
        return zt_backend_device_count(ZT_DEVICE_CUDA);
#ifdef ZT_HAVE_CUDART
    int n = 0;
    if (!runtime())
        return 0;
    if (rt.get_device_count(&n) != cudaSuccess) {
        rt.get_last_error(); /* no driver or no device: not sticky, nothing to report */
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

void zt_gpu_bind_thread(int index) {
    if (index < 0)
        return;
    if (module_answers()) {
        void (*bind)(int) = NULL;
        *(void **)&bind = zt_backend_cuda_symbol("zt_cuda_device_bind");
        if (bind)
            bind(index);
        return;
    }
#ifdef ZT_HAVE_CUDART
    if (runtime() && rt.set_device(index) != cudaSuccess)
        rt.get_last_error(); /* the ops then fail and sync reports it, naming the device */
#endif
}

zt_status zt_gpu_props_get(int index, zt_gpu_props *out) {
    memset(out, 0, sizeof *out);
    int n = zt_gpu_count();
    if (index < 0 || index >= n)
        return zt_error(ZT_ERR_INVALID, "GPU %d: this process sees %d GPU(s)%s", index, n,
                        zt_gpu_built() ? "" : " (built without CUDA)");
    if (module_answers()) {
        zt_status (*props)(int, zt_gpu_props *) = NULL;
        *(void **)&props = zt_backend_cuda_symbol("zt_cuda_device_props");
        if (!props)
            return zt_error(ZT_ERR_UNSUPPORTED, "GPU %d: the CUDA module has no "
                            "zt_cuda_device_props", index);
        return props(index, out);
    }
#ifdef ZT_HAVE_CUDART
    struct cudaDeviceProp p;
    cudaError_t e = rt.get_device_properties(&p, index); /* index < count: the runtime is open */
    if (e != cudaSuccess)
        return zt_error(ZT_ERR_IO, "GPU %d: cudaGetDeviceProperties: %s", index,
                        rt.get_error_string(e));
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->major = p.major;
    out->minor = p.minor;
    out->total_bytes = p.totalGlobalMem;
#endif
    return ZT_OK;
}

zt_status zt_gpu_mem_info(int index, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    int n = zt_gpu_count();
    if (index < 0 || index >= n)
        return zt_error(ZT_ERR_INVALID, "GPU %d: this process sees %d GPU(s)", index, n);
    if (module_answers()) {
        zt_status (*mem)(int, size_t *, size_t *) = NULL;
        *(void **)&mem = zt_backend_cuda_symbol("zt_cuda_device_mem");
        if (!mem)
            return zt_error(ZT_ERR_UNSUPPORTED, "GPU %d: the CUDA module has no "
                            "zt_cuda_device_mem", index);
        return mem(index, free_bytes, total_bytes);
    }
#ifdef ZT_HAVE_CUDART
    int was = 0;
    rt.get_device(&was);
    cudaError_t e = rt.set_device(index);
    if (e == cudaSuccess)
        e = rt.mem_get_info(free_bytes, total_bytes);
    rt.set_device(was);
    if (e != cudaSuccess)
        return zt_error(ZT_ERR_IO, "GPU %d: cudaMemGetInfo: %s", index, rt.get_error_string(e));
#endif
    return ZT_OK;
}

int zt_gpu_for_rank(int local_rank, int n_visible) {
    if (n_visible <= 0 || local_rank < 0)
        return -1;
    return local_rank % n_visible;
}

/* Dense bf16 peaks from NVIDIA's data sheets (the figures with sparsity are twice these). A name
 * row wins over a capability row, since one capability covers parts of different peaks (an H100
 * PCIe, NVL and SXM are all 9.0); the first row whose name part the device name contains wins,
 * so the NVL and PCIe parts come before the plain "H100" and "H200" rows that would match them
 * too. */
static const struct {
    const char *name_part; /* matched inside the device name; NULL: by capability only */
    int major, minor;
    double tflops;
    const char *label;
} peaks[] = {
    {"H200 NVL", 9, 0, 835.0, "H200 NVL: 835 TFLOPS dense bf16"},
    {"H200", 9, 0, 989.0, "H200: 989 TFLOPS dense bf16"},
    {"H100 NVL", 9, 0, 835.0, "H100 NVL: 835 TFLOPS dense bf16"},
    {"H100 PCIe", 9, 0, 756.0, "H100 PCIe: 756 TFLOPS dense bf16"},
    {"H100", 9, 0, 989.0, "H100 SXM: 989 TFLOPS dense bf16"},
    {"A100", 8, 0, 312.0, "A100: 312 TFLOPS dense bf16"},
    {"L40S", 8, 9, 362.0, "L40S: 362 TFLOPS dense bf16"},
    {"RTX 4090", 8, 9, 165.0, "RTX 4090: 165 TFLOPS dense bf16"},
    {"A10", 8, 6, 125.0, "A10: 125 TFLOPS dense bf16"},
    {NULL, 9, 0, 989.0, "compute capability 9.0 (as H100 SXM): 989 TFLOPS dense bf16"},
    {NULL, 8, 0, 312.0, "compute capability 8.0 (as A100): 312 TFLOPS dense bf16"},
};

double zt_gpu_peak_bf16(const char *name, int major, int minor, const char **label) {
    int n = (int)(sizeof peaks / sizeof *peaks);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            bool by_name = peaks[i].name_part != NULL;
            if (pass == 0 && !(by_name && name && strstr(name, peaks[i].name_part)))
                continue;
            if (pass == 1 && (by_name || peaks[i].major != major || peaks[i].minor != minor))
                continue;
            if (label)
                *label = peaks[i].label;
            return peaks[i].tflops * 1e12;
        }
    }
    if (label)
        *label = "unknown device: no peak, no MFU";
    return 0;
}

double zt_gpu_peak_of(int index, const char **label) {
    zt_gpu_props p;
    if (zt_gpu_props_get(index, &p) != ZT_OK) {
        if (label)
            *label = "no GPU: no peak, no MFU";
        return 0;
    }
    return zt_gpu_peak_bf16(p.name, p.major, p.minor, label);
}

bool zt_gpu_visible_list(const int *ids, int n_ids, int first, int n, char *out, size_t cap) {
    if (!cap || first < 0 || n < 0 || first > n_ids - n)
        return false;
    size_t len = 0;
    out[0] = '\0';
    for (int i = first; i < first + n; i++) {
        int w = snprintf(out + len, cap - len, "%s%d", len ? "," : "", ids[i]);
        if (w < 0 || (size_t)w >= cap - len)
            return false;
        len += (size_t)w;
    }
    return true;
}
