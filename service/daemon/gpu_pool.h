/* The daemon's GPUs as a resource of its queue, beside rank slots: which GPUs ztraind may hand
 * out (--gpus, default every visible one), which job holds each, and the CUDA_VISIBLE_DEVICES a
 * job's ranks get. A job on "device": "cuda" holds min(world_size, GPUs) of them while it runs:
 * one per rank when there are enough (each rank takes the GPU of its LOCAL_RANK, and NCCL
 * connects them), else all of them, shared round-robin by LOCAL_RANK (the ranks then talk
 * through shared memory, staging through the host; comm.h). Every rank of a job sees the same
 * list. Not thread-safe: the job manager's lock guards it. */
#ifndef ZTRAIN_GPU_POOL_H
#define ZTRAIN_GPU_POOL_H

#include <stdbool.h>
#include <stddef.h>

#include "ztrain/status.h"

#define ZT_MAX_GPUS 64

typedef struct {
    int n;                       /* GPUs the daemon schedules */
    char ids[ZT_MAX_GPUS][64];   /* what CUDA_VISIBLE_DEVICES calls each ("3", a UUID) */
    char owner[ZT_MAX_GPUS][64]; /* the job id holding it; "" when free */
} zt_gpu_pool;

/* n GPUs: the first n of `visible` (the daemon's own CUDA_VISIBLE_DEVICES, so a daemon limited
 * to "2,3" hands out 2 and 3), or 0 .. n-1 when visible is NULL or empty. n outside [0,
 * ZT_MAX_GPUS], or above the GPUs the list names, is ZT_ERR_INVALID naming --gpus. */
zt_status zt_gpu_pool_init(zt_gpu_pool *p, int n, const char *visible);

/* GPUs a job of world_size ranks holds: min(world_size, n); 0 when the pool is empty. */
int zt_gpu_pool_need(const zt_gpu_pool *p, int world_size);
int zt_gpu_pool_free(const zt_gpu_pool *p);

/* Gives owner the `count` lowest free GPUs and writes their CUDA_VISIBLE_DEVICES list into
 * list[cap] ("2,3"); false, changing nothing, when fewer are free or the list does not fit. */
bool zt_gpu_pool_take(zt_gpu_pool *p, const char *owner, int count, char *list, size_t cap);

/* Frees every GPU owner holds; a no-op for one that holds none. */
void zt_gpu_pool_release(zt_gpu_pool *p, const char *owner);

#endif
