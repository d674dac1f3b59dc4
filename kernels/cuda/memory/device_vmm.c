/* Device memory that ZeRO's releases really give back: each large allocation is a reserved
 * address range of whole granules (2 MiB on an H100), each granule mapped to physical memory of
 * one granule (CUDA's virtual memory management, reached through the runtime's driver entry
 * points, so the module still links only cudart).
 *
 * The difficulty is that cuMemUnmap is not stream-ordered: unmapping a range that queued
 * kernels still touch faults, and waiting for the device before every unmap would put host
 * waits into every layer. So release unmaps nothing: a granule wholly released stops being
 * live, its physical memory goes to a free list tagged with the event recorded at the release,
 * and its mapping stays. A commit finds the granule still mapped to its own memory, free, in
 * the steady state, and takes it back with no driver call; otherwise it maps a free granule of
 * memory (or a new one) there — one physical granule may be mapped at several addresses, which
 * CUDA allows. Either way the granule is zeroed on the compute stream, where every release's
 * mark is recorded, so the zeroing follows the memory's last use there without a wait, and
 * the compute stream's later work sees zeros. The communication stream is ordered after the
 * zeroing lazily: the next time the backend issues work that touches memory on it (a copy, a
 * memset, a collective), it first waits for the event the last commit recorded behind its
 * memsets, once for every commit since the last such wait (zt_cuda_vmm_order_comm). Only when the
 * granule's address is still mapped to memory that another address holds live must it be
 * unmapped: the host then waits for that address's own last release (an old event, long
 * passed on a GPU) — counted, and rare, since a commit prefers the memory the address had.
 *
 * What the host issues stays per call, not per granule (a GPU's host pays a few microseconds a
 * call, and GPT-2 124M's gradients alone are 238 granules): a release records one event, a
 * mark that every granule it lets go of shares; a commit zero-fills each run of adjacent
 * granules with one memset and issues nothing else (the communication stream's one wait comes
 * at its next use, shared by every commit before it).
 *
 * The backend's allocated and peak bytes count physical granules: what is really held. The
 * release marks are vmm_marks.c's and ZTRAIN_CUDA_VMM=check's unmapping vmm_check.c's; what
 * the three files share is vmm_internal.h. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "vmm_internal.h"

/* Allocations of at least this many granules are the VMM's; smaller ones stay cudaMalloc's,
 * where rounding to granules would cost more than releasing saves. */
enum { ZT_VMM_MIN_GRANULES = 4 };
_Static_assert(ZT_VMM_MIN_GRANULES * ZT_CUDA_VMM_GRANULE_BYTES == ZT_CUDA_VMM_MIN_BYTES,
               "backend.h states the size from which an allocation is reserved granules");

static zt_vmm_range *range_of(const zt_cuda_state *st, const void *p) {
    const struct zt_cuda_vmm *v = st->vmm;
    if (!v)
        return NULL;
    for (size_t i = 0; i < v->n_ranges; i++)
        if ((const char *)p >= v->ranges[i].base &&
            (const char *)p < v->ranges[i].base + v->ranges[i].span)
            return &v->ranges[i];
    return NULL;
}

static zt_status env_setting(struct zt_cuda_vmm *v, bool *off) {
    const char *mode = getenv("ZTRAIN_CUDA_VMM");
    *off = mode && strcmp(mode, "off") == 0;
    v->check = mode && strcmp(mode, "check") == 0;
    if (mode && *mode && !*off && !v->check && strcmp(mode, "on") != 0)
        return zt_error(ZT_ERR_INVALID, "ZTRAIN_CUDA_VMM=\"%s\": expected \"on\", \"off\" or "
                        "\"check\"", mode);
    v->min_bytes = ZT_VMM_MIN_GRANULES * v->granule;
    const char *min = getenv("ZTRAIN_CUDA_VMM_MIN_BYTES");
    if (min && *min) {
        char *end = NULL;
        unsigned long long n = strtoull(min, &end, 10);
        if (*end || min[0] == '-')
            return zt_error(ZT_ERR_INVALID, "ZTRAIN_CUDA_VMM_MIN_BYTES=\"%s\": expected a "
                            "number of bytes", min);
        v->min_bytes = (size_t)n;
    }
    return ZT_OK;
}

/* One driver entry point by name, as CUDA 12.0 and later hand it out. */
static bool entry(const char *name, void **fn) {
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    *fn = NULL;
    if (cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !*fn) {
        cudaGetLastError();
        return false;
    }
    return true;
}

zt_status zt_cuda_vmm_create(zt_cuda_state *st) {
    st->vmm = NULL;
    struct zt_cuda_vmm *v = calloc(1, sizeof *v);
    if (!v)
        return zt_error(ZT_ERR_NOMEM, "cuda backend: out of host memory");
    bool ok = entry("cuMemGetAllocationGranularity", (void **)&v->granularity) &&
              entry("cuMemAddressReserve", (void **)&v->reserve) &&
              entry("cuMemAddressFree", (void **)&v->address_free) &&
              entry("cuMemCreate", (void **)&v->create) &&
              entry("cuMemRelease", (void **)&v->release) &&
              entry("cuMemMap", (void **)&v->map) && entry("cuMemUnmap", (void **)&v->unmap) &&
              entry("cuMemSetAccess", (void **)&v->set_access);
    v->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    v->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    v->prop.location.id = st->be.device_index;
    v->access.location = v->prop.location;
    v->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ok = ok && v->granularity(&v->granule, &v->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) ==
                   CUDA_SUCCESS && v->granule > 0;
    bool off = false;
    zt_status s = ok ? env_setting(v, &off) : ZT_OK;
    if (s != ZT_OK || !ok || off) {
        /* No VMM (an old driver, or turned off): every allocation is cudaMalloc's. */
        free(v);
        return s;
    }
    if (cudaEventCreateWithFlags(&v->zeroed, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        free(v);
        return zt_error(ZT_ERR_UNSUPPORTED, "cuda device %d: cannot make the event that orders "
                        "the communication stream after zero-fills", st->be.device_index);
    }
    pthread_mutex_init(&v->order_lock, NULL);
    st->vmm = v;
    return ZT_OK;
}

bool zt_cuda_vmm_takes(const zt_cuda_state *st, size_t bytes) {
    return st->vmm && bytes >= st->vmm->min_bytes;
}

bool zt_cuda_vmm_in(const zt_cuda_state *st, const void *p) { return range_of(st, p) != NULL; }

bool zt_cuda_vmm_owns(const zt_cuda_state *st, const void *p) {
    zt_vmm_range *r = range_of(st, p);
    return r && r->base == (const char *)p;
}

/* Physical granule index h mapped (read-write) at address a: MAPPED; NOT_MAPPED when the map
 * failed, or access could not be set and the mapping was undone; STILL_MAPPED when neither
 * access nor the undoing worked (a stays mapped to h, for free to unmap). */
enum { MAPPED, NOT_MAPPED, STILL_MAPPED };
static int map_at(zt_backend *be, struct zt_cuda_vmm *v, char *a, int h) {
    if (!zt_vmm_drv(be, v->map((CUdeviceptr)a, v->granule, 0, v->handles[h].h, 0), "cuMemMap"))
        return NOT_MAPPED;
    v->handles[h].mappings++;
    v->counts[1]++;
    if (zt_vmm_drv(be, v->set_access((CUdeviceptr)a, v->granule, &v->access, 1),
                   "cuMemSetAccess"))
        return MAPPED;
    if (v->unmap((CUdeviceptr)a, v->granule) != CUDA_SUCCESS)
        return STILL_MAPPED;
    v->handles[h].mappings--;
    return NOT_MAPPED;
}

/* A free physical granule (the last freed), or a new one; -1 when the device has no memory. */
static int take_free(zt_backend *be, struct zt_cuda_vmm *v) {
    zt_cuda_state *st = be->impl;
    if (v->n_free)
        return v->free_list[--v->n_free];
    if (!zt_vmm_grow_pair((void **)&v->handles, sizeof *v->handles, &v->free_list,
                          v->n_handles, &v->cap_handles, 64))
        return -1;
    CUmemGenericAllocationHandle h = 0;
    if (v->create(&h, v->granule, &v->prop, 0) != CUDA_SUCCESS)
        return -1;
    v->handles[v->n_handles] = (zt_vmm_handle){h, NULL, 0};
    v->counts[2]++;
    zt_cuda_count(st, (long long)v->granule);
    return (int)v->n_handles++;
}

static void unfree(struct zt_cuda_vmm *v, int h) {
    for (size_t i = 0; i < v->n_free; i++)
        if (v->free_list[i] == h) {
            memmove(v->free_list + i, v->free_list + i + 1, (v->n_free - i - 1) * sizeof(int));
            v->n_free--;
            return;
        }
}

/* What revive did: the granule is live, or no memory was left, or the wait before an unmap
 * failed (a communicator's posted work before the release failed; its error is the backend's and
 * zt_last_error's). */
enum { REVIVED, NO_MEMORY, WAIT_FAILED };

/* Makes granule k of r live, which the caller then zero-fills on the compute stream
 * (zero_fill), behind its memory's last release. On WAIT_FAILED, *failed is the wait's
 * status. */
static int revive(zt_backend *be, struct zt_cuda_vmm *v, zt_vmm_range *r, size_t k,
                  zt_status *failed) {
    zt_vmm_granule *g = &r->g[k];
    char *a = r->base + k * v->granule;
    if (g->handle >= 0 && !v->handles[g->handle].owner) {
        /* Its own memory, free: the steady state, no driver call. */
        unfree(v, g->handle);
        v->counts[3]++;
    } else {
        if (g->handle >= 0) {
            /* Its memory is live at another address, so this one must be unmapped first, once
             * the work before this address's own last release has run. That work may end in a
             * collective posted on NCCL whose peer died, so the wait is the communicators'
             * watched one, which aborts them at their deadline instead of waiting forever.
             * released_lock stays held across it: the watch takes no lock a communicator's
             * caller holds while it takes this one (a busy communicator is skipped), and the
             * work waited for was queued before, so nothing it needs waits for this lock. */
            v->counts[0]++;
            unsigned long long t0 = zt_cuda_wait_begin(be);
            zt_status waited =
                g->released >= 0 ? zt_cuda_watched_event_wait(be, v->marks[g->released].ev) : ZT_OK;
            zt_cuda_wait_end(t0);
            if (waited != ZT_OK) {
                *failed = waited;
                return WAIT_FAILED;
            }
            if (!zt_vmm_drv(be, v->unmap((CUdeviceptr)a, v->granule), "cuMemUnmap"))
                return NO_MEMORY;
            v->handles[g->handle].mappings--;
            g->handle = -1;
        }
        int h = take_free(be, v);
        if (h < 0)
            return NO_MEMORY;
        const int mapped = map_at(be, v, a, h);
        if (mapped == NOT_MAPPED) {
            /* The granule's memory is still free: back on the list, not lost. */
            v->free_list[v->n_free++] = h;
            return NO_MEMORY;
        }
        g->handle = h;
        if (mapped == STILL_MAPPED)
            return NO_MEMORY;
    }
    v->handles[g->handle].owner = g;
    g->live = true;
    return REVIVED;
}

/* Issues the memset of the run [*lo, *hi) of revived granules of r (granule indices), if any,
 * on the compute stream, and empties the run. */
static void zero_flush(zt_backend *be, struct zt_cuda_vmm *v, zt_vmm_range *r, size_t *lo,
                       size_t *hi) {
    zt_cuda_state *st = be->impl;
    if (*hi > *lo) {
        zt_cuda_note_issue(st, ZT_STREAM_COMPUTE);
        ZT_CUDA_CHECK(be, cudaMemsetAsync(r->base + *lo * v->granule, 0,
                                          (*hi - *lo) * v->granule,
                                          st->stream[ZT_STREAM_COMPUTE]));
    }
    *lo = *hi = 0;
}

/* Zero-fills revived granules a run of adjacent ones at a time: granule k of r joins the run
 * [*lo, *hi) or, not adjacent to it, flushes the run and starts a new one. */
static void zero_fill(zt_backend *be, struct zt_cuda_vmm *v, zt_vmm_range *r, size_t k,
                      size_t *lo, size_t *hi) {
    if (k == *hi && *hi > *lo) {
        (*hi)++;
        return;
    }
    zero_flush(be, v, r, lo, hi);
    *lo = k, *hi = k + 1;
}

/* The communication stream must wait for the zero-fills issued so far before its next work
 * on memory. Each commit that zero-filled records `zeroed` right behind its memsets (not
 * behind whatever the compute stream holds when the communication stream next needs it, which
 * would make a reduction wait for the next layer's backward too) and then counts itself, so
 * that a thread that reads the count and waits for the event is behind them. */
static void after_zeroing(zt_backend *be, struct zt_cuda_vmm *v) {
    zt_cuda_state *st = be->impl;
    pthread_mutex_lock(&v->order_lock);
    ZT_CUDA_CHECK(be, cudaEventRecord(v->zeroed, st->stream[ZT_STREAM_COMPUTE]));
    atomic_fetch_add(&v->zero_fills, 1);
    pthread_mutex_unlock(&v->order_lock);
}

void zt_cuda_vmm_order_comm(zt_backend *be) {
    zt_cuda_state *st = be->impl;
    struct zt_cuda_vmm *v = st->vmm;
    if (!v || atomic_load(&v->comm_ordered) == atomic_load(&v->zero_fills))
        return;
    pthread_mutex_lock(&v->order_lock);
    unsigned long long fills = atomic_load(&v->zero_fills);
    if (atomic_load(&v->comm_ordered) != fills) {
        ZT_CUDA_CHECK(be, cudaStreamWaitEvent(st->stream[ZT_STREAM_COMM], v->zeroed, 0));
        atomic_store(&v->comm_ordered, fills);
    }
    pthread_mutex_unlock(&v->order_lock);
}

void *zt_cuda_vmm_reserve(zt_backend *be, size_t bytes) {
    zt_cuda_state *st = be->impl;
    struct zt_cuda_vmm *v = st->vmm;
    if (v->n_ranges == v->cap_ranges) {
        size_t cap = v->cap_ranges ? 2 * v->cap_ranges : 16;
        zt_vmm_range *r = realloc(v->ranges, cap * sizeof *r);
        if (!r)
            return NULL;
        v->ranges = r;
        v->cap_ranges = cap;
    }
    zt_vmm_range r = {0};
    r.bytes = bytes;
    r.n = (bytes + v->granule - 1) / v->granule;
    r.span = r.n * v->granule;
    r.g = calloc(r.n, sizeof *r.g);
    CUdeviceptr base = 0;
    if (!r.g || v->reserve(&base, r.span, 0, 0, 0) != CUDA_SUCCESS) {
        free(r.g);
        return NULL;
    }
    r.base = (char *)base;
    for (size_t k = 0; k < r.n; k++)
        r.g[k].handle = r.g[k].released = -1;
    v->ranges[v->n_ranges++] = r;
    return r.base;
}

void *zt_cuda_vmm_alloc(zt_backend *be, size_t bytes) {
    zt_cuda_state *st = be->impl;
    struct zt_cuda_vmm *v = st->vmm;
    char *base = zt_cuda_vmm_reserve(be, bytes);
    if (!base)
        return NULL;
    zt_vmm_range *in = range_of(st, base);
    for (size_t k = 0; k < in->n; k++) {
        zt_status failed = ZT_OK;
        if (revive(be, v, in, k, &failed) != REVIVED) {
            zt_cuda_vmm_free(be, in->base);
            cudaGetLastError();
            return NULL;
        }
    }
    /* The caller waits for the compute stream (cuda_alloc): nothing for the other to wait for. */
    ZT_CUDA_CHECK(be, cudaMemsetAsync(in->base, 0, in->span, st->stream[ZT_STREAM_COMPUTE]));
    return in->base;
}

void zt_cuda_vmm_free(zt_backend *be, void *p) {
    zt_cuda_state *st = be->impl;
    struct zt_cuda_vmm *v = st->vmm;
    zt_vmm_range *r = range_of(st, p);
    /* cudaFree's rule: the memory may still be in use by queued work. A host wait, counted
     * as every other (zt_cuda_round_trips); allocations are freed at the end of a job. */
    unsigned long long t0 = zt_cuda_wait_begin(be);
    ZT_CUDA_CHECK(be, cudaDeviceSynchronize());
    zt_cuda_wait_end(t0);
    for (size_t k = 0; k < r->n; k++) {
        zt_vmm_granule *g = &r->g[k];
        if (g->handle >= 0) {
            zt_vmm_drv(be, v->unmap((CUdeviceptr)(r->base + k * v->granule), v->granule),
                       "cuMemUnmap");
            v->handles[g->handle].mappings--;
            if (g->live) {
                v->handles[g->handle].owner = NULL;
                v->free_list[v->n_free++] = g->handle;
            }
        }
        zt_vmm_mark_set(v, g, -1);
    }
    /* The device is idle: no free granule's reuse waits for a release any more; and memory
     * mapped nowhere now goes back to the device. */
    size_t kept = 0;
    for (size_t i = 0; i < v->n_free; i++) {
        zt_vmm_handle *h = &v->handles[v->free_list[i]];
        if (h->mappings == 0 && zt_vmm_drv(be, v->release(h->h), "cuMemRelease")) {
            h->h = 0;
            zt_cuda_count(st, -(long long)v->granule);
        } else {
            v->free_list[kept++] = v->free_list[i];
        }
    }
    v->n_free = kept;
    zt_vmm_drv(be, v->address_free((CUdeviceptr)r->base, r->span), "cuMemAddressFree");
    free(r->g);
    *r = v->ranges[--v->n_ranges];
}

bool zt_cuda_vmm_release(zt_backend *be, void *p, size_t lo, size_t hi) {
    zt_cuda_state *st = be->impl;
    struct zt_cuda_vmm *v = st->vmm;
    zt_vmm_range *r = range_of(st, p);
    size_t at = (size_t)((char *)p - r->base) + lo, end = at + (hi - lo);
    size_t G = v->granule;
    int mark = -1;
    bool zeroed = false;
    for (size_t k = at / G; k * G < end; k++) {
        zt_vmm_granule *g = &r->g[k];
        size_t a = k * G, b = a + G < r->bytes ? a + G : r->bytes;
        if (!g->live)
            continue;
        uintptr_t base = (uintptr_t)r->base;
        if (zt_cuda_ranges_overlap(&st->released, base + a, base + b) < b - a) {
            /* Stays live: the released part of it must read as zero. */
            size_t za = a > at ? a : at, zb = b < end ? b : end;
            if (zb > za) {
                ZT_CUDA_CHECK(be, cudaMemsetAsync(r->base + za, 0, zb - za,
                                                  st->stream[ZT_STREAM_COMPUTE]));
                zeroed = true;
            }
            continue;
        }
        if (mark < 0) {
            /* Without an event its reuse could not be ordered: it stays live. */
            if ((mark = zt_vmm_mark_take(be, v)) < 0)
                continue;
            /* On the compute stream: work the communication stream did on the range is before
             * it too, since every device collective ends with the compute stream waiting for
             * it (engine/comm/comm_device.c, order_after). */
            ZT_CUDA_CHECK(be, cudaEventRecord(v->marks[mark].ev, st->stream[ZT_STREAM_COMPUTE]));
        }
        zt_vmm_mark_set(v, g, mark);
        v->handles[g->handle].owner = NULL;
        v->free_list[v->n_free++] = g->handle;
        g->live = false;
    }
    if (v->check && mark >= 0)
        zt_vmm_check_unmap(be, v, r, at / G, (end + G - 1) / G, mark);
    return zeroed || mark >= 0;
}

zt_status zt_cuda_vmm_commit(zt_backend *be, void *p, size_t lo, size_t hi) {
    zt_cuda_state *st = be->impl;
    struct zt_cuda_vmm *v = st->vmm;
    zt_vmm_range *r = range_of(st, p);
    size_t at = (size_t)((char *)p - r->base) + lo, end = at + (hi - lo);
    size_t run_lo = 0, run_hi = 0;
    bool zeroed = false;
    for (size_t k = at / v->granule; k * v->granule < end; k++) {
        if (r->g[k].live)
            continue;
        zt_status failed = ZT_OK;
        int got = revive(be, v, r, k, &failed);
        if (got != REVIVED) {
            zero_flush(be, v, r, &run_lo, &run_hi);
            if (zeroed)
                after_zeroing(be, v);
        }
        if (got == WAIT_FAILED)
            return zt_error_prefix(failed, "cuda device %d (%s): committing released device "
                                   "memory waits for its last use, which failed: ",
                                   be->device_index, st->device_name);
        if (got != REVIVED)
            return zt_error(ZT_ERR_NOMEM, "cuda device %d (%s): no device memory left to map "
                            "%zu bytes back into a released range (%zu of %zu bytes held)",
                            be->device_index, st->device_name, v->granule, st->allocated,
                            st->peak);
        zero_fill(be, v, r, k, &run_lo, &run_hi);
        zeroed = true;
    }
    zero_flush(be, v, r, &run_lo, &run_hi);
    if (zeroed)
        after_zeroing(be, v);
    return ZT_OK;
}

bool zt_cuda_vmm_live(const zt_cuda_state *st, const void *addr, size_t bytes) {
    zt_vmm_range *r = range_of(st, addr);
    if (!r || !bytes)
        return true;
    size_t at = (size_t)((const char *)addr - r->base), G = st->vmm->granule;
    for (size_t k = at / G; k * G < at + bytes && k < r->n; k++)
        if (!r->g[k].live)
            return false;
    return true;
}

void zt_cuda_vmm_destroy(zt_cuda_state *st) {
    struct zt_cuda_vmm *v = st->vmm;
    if (!v)
        return;
    while (v->n_ranges)
        zt_cuda_vmm_free(&st->be, v->ranges[0].base);
    for (size_t i = 0; i < v->n_handles; i++)
        if (v->handles[i].h && v->handles[i].mappings == 0)
            v->release(v->handles[i].h);
    zt_vmm_marks_free(v);
    cudaEventDestroy(v->zeroed);
    pthread_mutex_destroy(&v->order_lock);
    free(v->ranges);
    free(v->handles);
    free(v->free_list);
    free(v);
    st->vmm = NULL;
}

/* Found by name (zt_backend_cuda_symbol) by tests and the trainer's records. */
void zt_cuda_vmm_counts(zt_backend *be, unsigned long long out[4]) {
    zt_cuda_state *st = be->impl;
    pthread_mutex_lock(&st->released_lock);
    for (int i = 0; i < 4; i++)
        out[i] = st->vmm ? st->vmm->counts[i] : 0;
    pthread_mutex_unlock(&st->released_lock);
}

size_t zt_cuda_vmm_granule(zt_backend *be) {
    zt_cuda_state *st = be->impl;
    return st->vmm ? st->vmm->granule : 0;
}
