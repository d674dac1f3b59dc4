/* What the files of the CUDA backend's VMM share (memory/device_vmm.c: ranges, granules, commit
 * and release; vmm_marks.c: the release marks; vmm_check.c: ZTRAIN_CUDA_VMM=check's unmapping;
 * device_vmm.c calls the other two, never the other way). Not part of device_vmm.h's interface
 * to the backend; every call here expects the backend's released_lock held. */
#ifndef ZTRAIN_CUDA_VMM_INTERNAL_H
#define ZTRAIN_CUDA_VMM_INTERNAL_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "device_vmm.h"

typedef struct zt_vmm_granule {
    int handle;   /* the physical granule mapped here (index), -1: none */
    bool live;    /* it holds this address's bytes */
    int released; /* the mark of its last release (index), -1: none */
} zt_vmm_granule;

/* An event recorded on the compute stream by one release, shared by the granules it let go
 * of; recorded again only once no granule refers to it. */
typedef struct {
    cudaEvent_t ev;
    int refs; /* granules whose last release it marks */
} zt_vmm_mark;

typedef struct {
    char *base;
    size_t bytes, span; /* asked for, and reserved (whole granules) */
    size_t n;
    zt_vmm_granule *g;
} zt_vmm_range;

typedef struct {
    CUmemGenericAllocationHandle h;
    zt_vmm_granule *owner; /* where it is live; NULL: free */
    int mappings;          /* addresses mapped to it */
} zt_vmm_handle;

struct zt_cuda_vmm {
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuMemAddressReserve_v10020 reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemUnmap_v10020 unmap;
    PFN_cuMemSetAccess_v10020 set_access;
    CUmemAllocationProp prop;
    CUmemAccessDesc access;
    size_t granule, min_bytes;
    /* ZTRAIN_CUDA_VMM=check: a release waits for the device and unmaps what it lets go of, so
     * that any later touch before a commit is a fault naming the granule (on the emulated
     * device) instead of a read or write of memory another range may hold. For tests. */
    bool check;
    zt_vmm_range *ranges;
    size_t n_ranges, cap_ranges;
    zt_vmm_handle *handles;
    size_t n_handles, cap_handles;
    int *free_list; /* handle indices, a stack: the last freed is taken first */
    size_t n_free;
    zt_vmm_mark *marks;
    size_t n_marks, cap_marks;
    int *free_marks; /* marks no granule refers to, a stack */
    size_t n_free_marks;
    /* Commits that zero-filled on the compute stream, and how many of them the communication
     * stream has been made to wait for (through `zeroed`, recorded under order_lock, which is
     * never held across a wait: released_lock may be held by a thread in a watched wait that a
     * communicator's caller, the one ordering the stream, must not block). */
    _Atomic unsigned long long zero_fills, comm_ordered;
    pthread_mutex_t order_lock;
    cudaEvent_t zeroed;
    /* zt_cuda_vmm_counts: [0] host waits before an unmap, [1] maps, [2] physical granules made,
     * [3] commits that revived a granule without a driver call. */
    unsigned long long counts[4];
};

/* Room for one more in a table of `size`-byte entries and its free stack of indices, both
 * *cap long (doubled from `first`); false, with both as they were but perhaps moved, when the
 * host has no memory. */
static inline bool zt_vmm_grow_pair(void **table, size_t size, int **stack, size_t n,
                                    size_t *cap, size_t first) {
    if (n < *cap)
        return true;
    size_t want = *cap ? 2 * *cap : first;
    void *t = realloc(*table, want * size);
    if (!t)
        return false;
    *table = t;
    int *f = realloc(*stack, want * sizeof *f);
    if (!f)
        return false;
    *stack = f;
    *cap = want;
    return true;
}

/* A driver call's result: true on success; otherwise recorded for sync, naming the call. */
static inline bool zt_vmm_drv(zt_backend *be, CUresult rc, const char *call) {
    if (rc == CUDA_SUCCESS)
        return true;
    char msg[64];
    snprintf(msg, sizeof msg, "driver error %d", (int)rc);
    zt_cuda_fail(be, "CUDA driver", call, msg, __FILE__, __LINE__);
    return false;
}

/* vmm_marks.c. A mark to record a release with: one no granule refers to, or a new one; -1
 * when no event can be made. */
int zt_vmm_mark_take(zt_backend *be, struct zt_cuda_vmm *v);
/* Granule g's last release is now mark m (-1: none); its former mark loses a reference, and a
 * mark no granule refers to goes back to be taken again. */
void zt_vmm_mark_set(struct zt_cuda_vmm *v, zt_vmm_granule *g, int m);
/* Destroys every mark's event and frees the tables (at the VMM's end, the device idle). */
void zt_vmm_marks_free(struct zt_cuda_vmm *v);

/* vmm_check.c. The check mode's release: the granules of r in [k0, k1) that one release let
 * go of (mark m) are unmapped once the work before it has run (one counted wait, the
 * communicators' watched one, so a dead peer is an error, not a hang); their memory stays free
 * for any address. On a failed wait they stay mapped, and the error is the backend's. */
void zt_vmm_check_unmap(zt_backend *be, struct zt_cuda_vmm *v, zt_vmm_range *r, size_t k0,
                        size_t k1, int m);

#endif
