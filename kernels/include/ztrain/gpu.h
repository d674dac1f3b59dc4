/* The GPUs this process can see, as the engine, the worker and ztraind need to know them: how
 * many, which one a rank takes, their names, memory and the peak the MFU metric divides by.
 *
 * Built with the CUDA toolkit (kernels/gpu_info.c with the CUDA runtime), these ask the driver;
 * built without it, or on a host without a GPU or driver, there are no GPUs: zt_gpu_count is 0
 * and the others report that. None of them starts work on a GPU beyond the runtime's own
 * initialisation. */
#ifndef ZTRAIN_GPU_H
#define ZTRAIN_GPU_H

#include <stdbool.h>
#include <stddef.h>

#include "ztrain/status.h"

typedef struct {
    char name[256];   /* "NVIDIA H100 80GB HBM3" */
    int major, minor; /* compute capability */
    size_t total_bytes;
} zt_gpu_props;

/* GPUs visible to this process (CUDA_VISIBLE_DEVICES applies); 0 without CUDA, driver or GPU. */
int zt_gpu_count(void);

/* Whether this build can drive GPUs at all (compiled with the CUDA runtime). */
bool zt_gpu_built(void);

/* Makes visible GPU index the calling thread's current device (cudaSetDevice), as a thread
 * other than the one that created the CUDA backend must before it issues ops (ZeRO's
 * communication thread). A no-op for index < 0 or without CUDA. */
void zt_gpu_bind_thread(int index);

/* Properties of visible GPU index; ZT_ERR_INVALID naming the index when there is no such GPU. */
zt_status zt_gpu_props_get(int index, zt_gpu_props *out);

/* Free and total device memory of visible GPU index (cudaMemGetInfo), for the memory metrics. */
zt_status zt_gpu_mem_info(int index, size_t *free_bytes, size_t *total_bytes);

/* The GPU a rank computes on: its LOCAL_RANK modulo the visible GPUs, so each rank of a host
 * has its own while there are enough, and ranks share round-robin when there are not (which
 * NCCL refuses: comm.h). -1 when n_visible is 0. */
int zt_gpu_for_rank(int local_rank, int n_visible);

/* The dense (no sparsity) bf16 tensor-core peak of a device in FLOP/s, which perf/mfu divides
 * the achieved FLOP/s by, looked up by name and then compute capability: H100 SXM and H200
 * 989 TFLOPS, H100 NVL and H200 NVL 835, H100 PCIe 756, A100 312, L40S 362, A10 125, RTX 4090 165 (dense, fp32
 * accumulation as NVIDIA's data sheets list them). 0 for a device the table does not know.
 * *label (may be NULL) is the table row used, static storage ("H100 SXM: 989 TFLOPS"). */
double zt_gpu_peak_bf16(const char *name, int major, int minor, const char **label);

/* The peak of visible GPU index (zt_gpu_peak_bf16 of its name and capability); 0 when there is
 * no such GPU or the table does not know it. */
double zt_gpu_peak_of(int index, const char **label);

/* The CUDA_VISIBLE_DEVICES value giving a job the GPUs first .. first + n - 1 of the daemon's
 * list ids[0 .. n_ids) (ids are the daemon's device indices): "2,3". out[cap]; false when it
 * does not fit or the range is outside the list. */
bool zt_gpu_visible_list(const int *ids, int n_ids, int first, int n, char *out, size_t cap);

#endif
