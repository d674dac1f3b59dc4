/* The backend object itself: allocation of each kind (zeroed, aligned), the copy kinds, zero,
 * release and commit measured with resident_bytes, events and sync, and the failure of a device
 * this build lacks. The exact page accounting is the CPU's (pages of sysconf(_SC_PAGESIZE),
 * committed on first touch); other backends are held to what backend.h says of every device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static const char *const kind_names[] = {"device", "host", "pinned"};

static bool all_zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/* Reads n bytes of memory of the kind into host memory. */
static void read_back(zt_backend *be, zt_mem kind, unsigned char *host, const void *p, size_t n) {
    if (kind == ZT_MEM_DEVICE)
        zt_backend_copy(be, host, p, n, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    else
        memcpy(host, p, n);
}

static void check_alloc(zt_backend *be) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t sizes[] = {0, 1, 100, 3 * page + 5, (size_t)1 << 20};
    unsigned char *host = calloc(1, (size_t)1 << 20);
    for (zt_mem kind = ZT_MEM_DEVICE; kind <= ZT_MEM_PINNED; kind++) {
        const char *kn = kind_names[kind];
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = sizes[k];
            void *p = zt_backend_alloc(be, kind, n);
            if (!CHECK_AT(p != NULL, "%s: alloc(%s, %zu) returned NULL", be->name, kn, n))
                continue;
            size_t align = kind == ZT_MEM_DEVICE && be->device == ZT_DEVICE_CPU ? page : 64;
            CHECK_AT((uintptr_t)p % align == 0, "%s: alloc(%s, %zu) = %p is not %zu-aligned",
                     be->name, kn, n, p, align);
            read_back(be, kind, host, p, n);
            CHECK_AT(all_zero(host, n), "%s: alloc(%s, %zu) is not zeroed", be->name, kn, n);
            /* Memory handed back dirty must come back zeroed too. */
            memset(host, 0xA5, n);
            if (kind == ZT_MEM_DEVICE)
                zt_backend_copy(be, p, host, n, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
            else
                memcpy(p, host, n);
            zt_backend_free(be, kind, p, n);
            p = zt_backend_alloc(be, kind, n);
            read_back(be, kind, host, p, n);
            CHECK_AT(all_zero(host, n), "%s: alloc(%s, %zu) after a free is not zeroed", be->name,
                     kn, n);
            zt_backend_free(be, kind, p, n);
        }
        void *a = zt_backend_alloc(be, kind, 0), *b = zt_backend_alloc(be, kind, 0);
        CHECK_AT(a && b && a != b, "%s: two alloc(%s, 0) are not distinct: %p %p", be->name, kn, a,
                 b);
        zt_backend_free(be, kind, a, 0);
        zt_backend_free(be, kind, b, 0);
    }
    zt_backend_free(be, ZT_MEM_HOST, NULL, 0);
    free(host);
}

/* H2D, D2D, D2H and H2H (into pinned memory) carry the bytes on either stream; zero clears
 * exactly its range. */
static void check_copy(zt_backend *be) {
    const size_t n = 40000 + 3;
    unsigned char *src = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 131 + 7);
    unsigned char *d1 = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    unsigned char *d2 = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    unsigned char *pin = zt_backend_alloc(be, ZT_MEM_PINNED, n);
    for (zt_stream s = ZT_STREAM_COMPUTE; s <= ZT_STREAM_COMM; s++) {
        memset(back, 0, n);
        zt_backend_copy(be, pin, src, n, ZT_COPY_H2H, s);
        zt_backend_copy(be, d1, pin, n, ZT_COPY_H2D, s);
        zt_backend_copy(be, d2, d1, n, ZT_COPY_D2D, s);
        zt_backend_copy(be, back, d2, n, ZT_COPY_D2H, s);
        zt_status st = zt_backend_sync(be);
        CHECK_AT(st == ZT_OK, "%s: sync after copies: %s", be->name, zt_last_error());
        CHECK_AT(memcmp(back, src, n) == 0,
                 "%s: H2H, H2D, D2D, D2H on stream %d did not carry the bytes", be->name, (int)s);
    }
    zt_backend_zero(be, d2 + 17, 1000, ZT_STREAM_COMPUTE);
    zt_backend_copy(be, back, d2, n, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    zt_backend_sync(be);
    CHECK_AT(all_zero(back + 17, 1000) && memcmp(back, src, 17) == 0 &&
                 memcmp(back + 1017, src + 1017, n - 1017) == 0,
             "%s: zero(17, 1000) did not clear exactly [17, 1017)", be->name);
    zt_backend_free(be, ZT_MEM_DEVICE, d1, n);
    zt_backend_free(be, ZT_MEM_DEVICE, d2, n);
    zt_backend_free(be, ZT_MEM_PINNED, pin, n);
    free(src), free(back);
}

/* Events order a copy on the communication stream after work on the compute stream. */
static void check_events(zt_backend *be) {
    zt_event *a = zt_backend_event_create(be), *b = zt_backend_event_create(be);
    CHECK_AT(a && b && a != b, "%s: event_create gave %p and %p", be->name, (void *)a, (void *)b);
    const size_t n = 4096;
    unsigned char *src = malloc(n), *back = calloc(1, n);
    memset(src, 0x3C, n);
    unsigned char *d1 = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    unsigned char *d2 = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    zt_backend_copy(be, d1, src, n, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    zt_backend_event_record(be, a, ZT_STREAM_COMPUTE);
    zt_backend_stream_wait(be, ZT_STREAM_COMM, a);
    zt_backend_copy(be, d2, d1, n, ZT_COPY_D2D, ZT_STREAM_COMM);
    zt_backend_event_record(be, b, ZT_STREAM_COMM);
    zt_backend_stream_wait(be, ZT_STREAM_COMPUTE, b);
    zt_backend_copy(be, back, d2, n, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    zt_status s = zt_backend_sync(be);
    CHECK_AT(s == ZT_OK, "%s: sync after events: %s", be->name, zt_last_error());
    CHECK_AT(memcmp(back, src, n) == 0, "%s: a copy ordered by events lost its bytes", be->name);
    zt_backend_event_destroy(be, a);
    zt_backend_event_destroy(be, b);
    zt_backend_free(be, ZT_MEM_DEVICE, d1, n);
    zt_backend_free(be, ZT_MEM_DEVICE, d2, n);
    free(src), free(back);
}

/* Release reads as zero and gives back the whole pages inside the range; commit makes the range
 * writable again. Resident bytes are measured before anything reads the released range, since
 * reading it may map the system's shared zero page. */
static void check_release(zt_backend *be) {
    bool cpu = be->device == ZT_DEVICE_CPU;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 16 * page;
    size_t lo = 100, hi = 13 * page + 200, first = page, last = 13 * page;
    unsigned char *host = malloc(n), *back = malloc(n);
    memset(host, 0x5A, n);
    unsigned char *p = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    if (cpu)
        CHECK_AT(zt_backend_resident_bytes(be, p, 0, n) == 0,
                 "cpu: a fresh device allocation holds %zu bytes before it is touched",
                 zt_backend_resident_bytes(be, p, 0, n));
    zt_backend_copy(be, p, host, n, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    zt_backend_sync(be);
    size_t before = zt_backend_resident_bytes(be, p, 0, n);
    CHECK_AT(before == n, "%s: a written range of %zu bytes holds %zu", be->name, n, before);
    CHECK_AT(zt_backend_resident_bytes(be, p, 50, 150) == 100,
             "%s: resident_bytes(50, 150) of a written range is %zu, not 100", be->name,
             zt_backend_resident_bytes(be, p, 50, 150));

    zt_backend_release(be, p, lo, hi);
    zt_backend_sync(be);
    size_t after = zt_backend_resident_bytes(be, p, 0, n);
    if (cpu) {
        CHECK_AT(after == n - (last - first),
                 "cpu: release(%zu, %zu) left %zu of %zu bytes resident, want %zu (the %zu whole "
                 "pages inside go back)",
                 lo, hi, after, n, n - (last - first), (last - first) / page);
        size_t in = zt_backend_resident_bytes(be, p, lo, hi);
        CHECK_AT(in == (first - lo) + (hi - last),
                 "cpu: the released range still holds %zu bytes, want its partial pages' %zu", in,
                 (first - lo) + (hi - last));
    } else {
        CHECK_AT(after < before, "%s: release(%zu, %zu) gave nothing back (%zu bytes before and "
                 "after)", be->name, lo, hi, before);
    }
    zt_backend_copy(be, back, p, n, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    zt_backend_sync(be);
    CHECK_AT(all_zero(back + lo, hi - lo), "%s: a released range does not read as zero",
             be->name);
    CHECK_AT(memcmp(back, host, lo) == 0 && memcmp(back + hi, host + hi, n - hi) == 0,
             "%s: release(%zu, %zu) touched bytes outside its range", be->name, lo, hi);
    /* Reading released memory holds none: the kernel maps its one shared zero page there, which
     * the process's RSS does not count, and neither may resident_bytes ("what a range really
     * holds", backend.h), or a rank that reads what it gave back would measure the memory ZeRO
     * saved as spent. */
    if (cpu)
        CHECK_AT(zt_backend_resident_bytes(be, p, 0, n) == after,
                 "cpu: after reading the released range, resident_bytes counts %zu bytes, not %zu "
                 "(mincore reports the shared zero page as resident)",
                 zt_backend_resident_bytes(be, p, 0, n), after);

    /* Within one page nothing goes back, but the bytes still read as zero. */
    zt_backend_release(be, p, 14 * page + 10, 14 * page + 90);
    zt_backend_copy(be, back, p, n, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    zt_backend_sync(be);
    CHECK_AT(all_zero(back + 14 * page + 10, 80) && back[14 * page + 9] == 0x5A &&
                 back[14 * page + 90] == 0x5A,
             "%s: release inside one page did not zero exactly its range", be->name);

    zt_status s = zt_backend_commit(be, p, lo, hi);
    CHECK_AT(s == ZT_OK, "%s: commit(%zu, %zu): %s", be->name, lo, hi, zt_last_error());
    zt_backend_copy(be, p, host, n, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    zt_backend_copy(be, back, p, n, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    zt_backend_sync(be);
    CHECK_AT(memcmp(back, host, n) == 0, "%s: a committed range does not keep what is written",
             be->name);
    CHECK_AT(zt_backend_resident_bytes(be, p, 0, n) == before,
             "%s: rewritten after commit, the range holds %zu bytes, not %zu", be->name,
             zt_backend_resident_bytes(be, p, 0, n), before);
    zt_backend_free(be, ZT_MEM_DEVICE, p, n);
    free(host), free(back);
}

/* On the CPU, commit brings back a released range's pages by writing them (zeros, which is
 * what they read as), so that the op that accumulates into them next does not first map the
 * shared zero page and then replace it, one TLB flush of every CPU per page. What a range
 * already holds stays as it is. */
static void check_commit_cpu(zt_backend *be) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 16 * page;
    unsigned char *host = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++)
        host[i] = (unsigned char)(i * 7 + 1);
    unsigned char *p = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    zt_backend_copy(be, p, host, n, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    zt_backend_release(be, p, 2 * page, 10 * page);
    CHECK_AT(zt_backend_resident_bytes(be, p, 0, n) == n - 8 * page,
             "cpu: release of 8 pages left %zu bytes resident", zt_backend_resident_bytes(be, p, 0, n));
    zt_status s = zt_backend_commit(be, p, 0, n);
    CHECK_AT(s == ZT_OK, "cpu: commit: %s", zt_last_error());
    CHECK_AT(zt_backend_resident_bytes(be, p, 0, n) == n,
             "cpu: after commit the range holds %zu of %zu bytes: the released pages were not "
             "written back", zt_backend_resident_bytes(be, p, 0, n), n);
    zt_backend_copy(be, back, p, n, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    CHECK_AT(all_zero(back + 2 * page, 8 * page),
             "cpu: a committed released range does not read as zero");
    CHECK_AT(memcmp(back, host, 2 * page) == 0 && memcmp(back + 10 * page, host + 10 * page,
                                                         6 * page) == 0,
             "cpu: commit changed pages that were held");
    zt_backend_free(be, ZT_MEM_DEVICE, p, n);
    free(host), free(back);
}

static void check_devices(const zt_test_env *env) {
    CHECK_AT(strcmp(zt_device_name(ZT_DEVICE_CPU), "cpu") == 0 &&
                 strcmp(zt_device_name(ZT_DEVICE_CUDA), "cuda") == 0,
             "zt_device_name: %s, %s", zt_device_name(ZT_DEVICE_CPU),
             zt_device_name(ZT_DEVICE_CUDA));
    CHECK_AT(zt_backend_available(ZT_DEVICE_CPU), "the CPU backend is not available");
    if (!zt_backend_available(ZT_DEVICE_CUDA)) {
        zt_backend *be = (zt_backend *)&be;
        zt_status s = zt_backend_create(&be, ZT_DEVICE_CUDA, NULL);
        const char *msg = zt_last_error();
        CHECK_AT(s == ZT_ERR_INVALID && be == NULL,
                 "zt_backend_create(cuda) in a build without CUDA: %s, backend %p",
                 zt_status_name(s), (void *)be);
        CHECK_AT(strstr(msg, "-DZT_CUDA=ON") && strstr(msg, "cuda"),
                 "the error of zt_backend_create(cuda) does not name -DZT_CUDA=ON: %s", msg);
    }
    for (int b = 0; b < env->n; b++) {
        zt_backend *be = env->be[b];
        CHECK_AT(strcmp(be->name, zt_device_name(be->device)) == 0 && be->ops && be->iface,
                 "backend %s: name, device %d, ops or iface wrong", be->name, (int)be->device);
        check_alloc(be);
        check_copy(be);
        check_events(be);
        check_release(be);
        if (be->device == ZT_DEVICE_CPU && access("/proc/self/pagemap", R_OK) == 0)
            check_commit_cpu(be);
    }
}

static const char *const no_entries[] = {NULL};

const zt_test_family zt_test_backend_memory = {"backend", no_entries, check_devices, NULL};
