/* What ztrain/gpu.h says about the visible GPUs: counted and described by the CUDA module
 * (kernels/cuda/, loaded through backend.c, so that no program links the CUDA runtime itself,
 * and an emulated device answers as its emulated H100), none without one; the table of peaks the
 * MFU metric uses; which GPU a rank takes and the CUDA_VISIBLE_DEVICES list a job is given. */
#include <stdio.h>
#include <string.h>

#include "ztrain/backend.h"
#include "ztrain/gpu.h"

bool zt_gpu_built(void) { return zt_backend_available(ZT_DEVICE_CUDA); }

int zt_gpu_count(void) {
    return zt_gpu_built() ? zt_backend_device_count(ZT_DEVICE_CUDA) : 0;
}

void zt_gpu_bind_thread(int index) {
    if (index < 0 || !zt_gpu_built())
        return;
    void (*bind)(int) = NULL;
    *(void **)&bind = zt_backend_cuda_symbol("zt_cuda_device_bind");
    /* Without a module there is no device to bind; the ops then fail and say so. */
    if (bind)
        bind(index);
}

zt_status zt_gpu_props_get(int index, zt_gpu_props *out) {
    memset(out, 0, sizeof *out);
    int n = zt_gpu_count();
    if (index < 0 || index >= n)
        return zt_error(ZT_ERR_INVALID, "GPU %d: this process sees %d GPU(s)%s", index, n,
                        zt_gpu_built() ? "" : " (built without CUDA)");
    zt_status (*props)(int, zt_gpu_props *) = NULL;
    *(void **)&props = zt_backend_cuda_symbol("zt_cuda_device_props");
    if (!props)
        return zt_error(ZT_ERR_UNSUPPORTED, "GPU %d: the CUDA module has no "
                        "zt_cuda_device_props", index);
    return props(index, out);
}

zt_status zt_gpu_mem_info(int index, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    int n = zt_gpu_count();
    if (index < 0 || index >= n)
        return zt_error(ZT_ERR_INVALID, "GPU %d: this process sees %d GPU(s)", index, n);
    zt_status (*mem)(int, size_t *, size_t *) = NULL;
    *(void **)&mem = zt_backend_cuda_symbol("zt_cuda_device_mem");
    if (!mem)
        return zt_error(ZT_ERR_UNSUPPORTED, "GPU %d: the CUDA module has no zt_cuda_device_mem",
                        index);
    return mem(index, free_bytes, total_bytes);
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
