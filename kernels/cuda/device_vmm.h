/* The CUDA backend's large device allocations as reserved address ranges over physical
 * granules (CUDA's virtual memory management), so that what ZeRO releases is really given back
 * and committing it again maps memory (memory/device_vmm.c). backend_cuda.c's memory calls go
 * through here for the allocations this took; the calls that read or change the ranges (alloc,
 * reserve, free, release, commit, owns, in, live) expect the backend's released_lock held. */
#ifndef ZTRAIN_CUDA_DEVICE_VMM_H
#define ZTRAIN_CUDA_DEVICE_VMM_H

#include "cuda_backend.h"

/* Sets st->vmm when the driver has virtual memory management (its entry points through
 * cudaGetDriverEntryPointByVersion) and ZTRAIN_CUDA_VMM is not "off"; leaves it NULL otherwise,
 * and every allocation is then cudaMalloc's. ZT_ERR_INVALID naming the variable for a value of
 * ZTRAIN_CUDA_VMM or ZTRAIN_CUDA_VMM_MIN_BYTES it does not understand. */
zt_status zt_cuda_vmm_create(zt_cuda_state *st);
/* Unmaps and releases everything, after the device is idle (the caller's cudaDeviceSynchronize). */
void zt_cuda_vmm_destroy(zt_cuda_state *st);

/* Whether bytes of device memory are the VMM's to give: at least the threshold (a few
 * granules, ZTRAIN_CUDA_VMM_MIN_BYTES) and a VMM present. */
bool zt_cuda_vmm_takes(const zt_cuda_state *st, size_t bytes);
/* A reserved range of whole granules for bytes, every granule mapped, live and zero-filled on
 * the compute stream (which the caller waits for); NULL when the driver refuses (out of
 * memory). */
void *zt_cuda_vmm_alloc(zt_backend *be, size_t bytes);
/* A reserved range of whole granules for bytes with none mapped, none live: nothing held until
 * a commit (zt_backend_alloc_released, zt_backend_reserve; the caller adds it to the released
 * ranges). NULL when the driver refuses the address range. */
void *zt_cuda_vmm_reserve(zt_backend *be, size_t bytes);
/* Whether p is one of the VMM's allocations (its start), or lies in one. */
bool zt_cuda_vmm_owns(const zt_cuda_state *st, const void *p);
bool zt_cuda_vmm_in(const zt_cuda_state *st, const void *p);
/* Frees the allocation at p: waits for the device (cudaFree's rule), unmaps its granules and
 * releases the physical memory no other address still maps. */
void zt_cuda_vmm_free(zt_backend *be, void *p);
/* [lo, hi) of the allocation at p has been added to the released ranges: the bytes of granules
 * that stay live are zeroed on the compute stream, and each granule now wholly released stops
 * being live, its physical memory free for any commit once the compute stream passes this
 * point. No driver call, no wait. Whether it issued anything on the compute stream (a memset
 * or a release mark): nothing, when every granule it touches was already released. */
bool zt_cuda_vmm_release(zt_backend *be, void *p, size_t lo, size_t hi);
/* Makes every granule touching [lo, hi) of the allocation at p live again, zero-filled before
 * any later work on either stream: the granule's own physical memory when it is free (no driver
 * call), otherwise a free granule of memory or a new one mapped there. The zero-fill is one
 * memset per run of adjacent granules on the compute stream, behind every release's mark, and
 * an event recorded behind them, no wait: the communication stream waits for that event at its
 * next use (zt_cuda_vmm_order_comm). ZT_ERR_NOMEM naming the device and size when the driver has no
 * memory left. */
zt_status zt_cuda_vmm_commit(zt_backend *be, void *p, size_t lo, size_t hi);
/* Before the backend issues work that touches memory on the communication stream (a copy, a
 * memset, a collective): makes the stream wait for the last commit's zero-fill when a commit
 * has zero-filled since it last did (one wait for any number of commits; nothing otherwise,
 * and nothing without a VMM). Any thread, without released_lock. */
void zt_cuda_vmm_order_comm(zt_backend *be);
/* Whether [addr, addr + bytes) lies in live granules, or outside the VMM's allocations (what a
 * copy into it needs: a write into released memory must be committed first). */
bool zt_cuda_vmm_live(const zt_cuda_state *st, const void *addr, size_t bytes);

/* Found by name (zt_backend_cuda_symbol), for tests and records: since creation, [0] host waits
 * before an unmap (a granule whose memory was live elsewhere), [1] cuMemMap calls, [2] physical
 * granules made by cuMemCreate, [3] commits that took a granule's own memory back without a
 * driver call. Zeros without a VMM. */
void zt_cuda_vmm_counts(zt_backend *be, unsigned long long out[4]);
/* The granule in bytes, 0 without a VMM. */
size_t zt_cuda_vmm_granule(zt_backend *be);

#endif
