/* The CPU backend object: device memory is host memory. Device buffers are anonymous mappings
 * whose pages are committed on first touch, so a released range (madvise DONTNEED) reads as zero
 * and stops counting against the process until it is written again; /proc/self/pagemap tells
 * what a range holds. Every op completes before it returns, so streams and events have nothing
 * to order. */
#include <fcntl.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "gemm.h"
#include "isa.h"
#include "ztrain/backend.h"

/* The backend and what the CPU keeps open for it. */
typedef struct {
    zt_backend be;
    int pagemap; /* /proc/self/pagemap, or -1 */
    void *scratch; /* zt_cpu_scratch's work memory, of scratch_bytes */
    size_t scratch_bytes;
} cpu_state;

/* The CPU has nothing to wait for; an event only has to be a distinct non-NULL pointer. A timer
 * (profiling) also keeps the monotonic clock of its last record: every op issued before it has
 * completed by then. */
struct zt_event {
    bool timer, recorded;
    double ms;
};

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static void *cpu_alloc(zt_backend *be, zt_mem kind, size_t bytes) {
    (void)be;
    if (bytes == 0)
        bytes = 1;
    if (kind == ZT_MEM_DEVICE) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = NULL;
    if (posix_memalign(&p, page_size(), bytes) != 0)
        return NULL;
    memset(p, 0, bytes);
    return p;
}

/* An anonymous mapping holds no page until one is touched: allocated is already released. */
static void *cpu_alloc_released(zt_backend *be, size_t bytes) {
    return cpu_alloc(be, ZT_MEM_DEVICE, bytes);
}

static void cpu_free(zt_backend *be, zt_mem kind, void *p, size_t bytes) {
    (void)be;
    if (!p)
        return;
    if (kind == ZT_MEM_DEVICE)
        munmap(p, bytes ? bytes : 1);
    else
        free(p);
}

static void cpu_zero(zt_backend *be, void *p, size_t bytes, zt_stream s) {
    (void)be, (void)s;
    memset(p, 0, bytes);
}

static void cpu_copy(zt_backend *be, void *dst, const void *src, size_t bytes, zt_copy_kind kind,
                     zt_stream s) {
    (void)be, (void)kind, (void)s;
    memcpy(dst, src, bytes);
}

/* Zeroes the partial pages at the ends and hands the whole pages in between back to the kernel,
 * which maps fresh zero pages when they are touched again. */
static void cpu_release(zt_backend *be, void *p, size_t lo, size_t hi) {
    (void)be;
    if (hi <= lo)
        return;
    unsigned char *x = p;
    size_t page = page_size();
    size_t first = (lo + page - 1) / page * page, last = hi / page * page;
    if (first >= last) {
        memset(x + lo, 0, hi - lo);
        return;
    }
    memset(x + lo, 0, first - lo);
    memset(x + last, 0, hi - last);
    madvise(x + first, last - first, MADV_DONTNEED);
}

/* Commit puts back the pages a release gave away, before the op that comes next writes them.
 * Leaving them to that op would be correct too, but it is usually an accumulation (a gradient
 * product with beta = 1, an embedding's scatter add): its first read maps the shared zero page
 * and its first write then replaces that mapping, which makes the kernel flush the page from
 * every CPU the process runs on, an inter-processor interrupt per page (under a hypervisor a VM
 * exit). Allocated by a write first, a page is only allocated. The mixed-precision step releases
 * and re-commits every layer's fp32 gradients, so on two threads this is the difference between
 * one interrupt per 4 KiB of gradients per step and none (bench/README.md, issue 33).
 * The kernel does it in one call (MADV_POPULATE_WRITE, Linux 5.14: it faults in the range's
 * missing pages writable and leaves present ones, their contents, alone). On an older kernel
 * each whole page that /proc/self/pagemap shows neither present nor swapped gets zeros written
 * (such a page reads as zero, so its contents do not change); without pagemap either, nothing is
 * done and the pages come back on first touch. */
static zt_status cpu_commit(zt_backend *be, void *p, size_t lo, size_t hi) {
    int pagemap = ((const cpu_state *)be->impl)->pagemap;
    size_t page = page_size();
    size_t first = (lo + page - 1) / page * page, last = hi / page * page;
    if (last <= first)
        return ZT_OK;
    unsigned char *x = p;
#ifdef MADV_POPULATE_WRITE
    if (madvise(x + first, last - first, MADV_POPULATE_WRITE) == 0)
        return ZT_OK;
#endif
    if (pagemap < 0)
        return ZT_OK;
    const size_t batch = 512;
    for (size_t a = first; a < last; a += batch * page) {
        size_t np = (last - a) / page < batch ? (last - a) / page : batch;
        uint64_t e[512];
        off_t at = (off_t)((uintptr_t)(x + a) / page * sizeof(uint64_t));
        if (pread(pagemap, e, np * sizeof(uint64_t), at) != (ssize_t)(np * sizeof(uint64_t)))
            return ZT_OK;
        /* bit 63: present, bit 62: swapped */
        for (size_t i = 0; i < np; i++)
            if (!(e[i] >> 62 & 3))
                memset(x + a + i * page, 0, page);
    }
    return ZT_OK;
}

/* Whether each of n pages from `addr` is held by this process: present in /proc/self/pagemap
 * (bit 63) and mapped by this process alone (bit 56). mincore would also count the kernel's shared
 * zero page, which any read of an untouched or released page maps and which holds none of the
 * process's memory. Without pagemap (a restricted /proc) mincore is the fallback. */
static bool pages_held(int pagemap, const unsigned char *addr, size_t n, size_t page,
                       unsigned char *held) {
    if (pagemap >= 0) {
        uint64_t e[512];
        off_t at = (off_t)((uintptr_t)addr / page * sizeof(uint64_t));
        if (pread(pagemap, e, n * sizeof(uint64_t), at) != (ssize_t)(n * sizeof(uint64_t)))
            return false;
        for (size_t i = 0; i < n; i++)
            held[i] = (e[i] >> 63 & 1) && (e[i] >> 56 & 1);
        return true;
    }
    if (mincore((void *)addr, n * page, held) != 0)
        return false;
    for (size_t i = 0; i < n; i++)
        held[i] &= 1;
    return true;
}

/* Held pages of [lo, hi), counting only the part of each page inside the range. */
static size_t cpu_resident_bytes(zt_backend *be, const void *p, size_t lo, size_t hi) {
    if (hi <= lo)
        return 0;
    const unsigned char *x = p;
    size_t page = page_size();
    size_t first = lo / page * page, pages = (hi - first + page - 1) / page;
    int pagemap = ((const cpu_state *)be->impl)->pagemap;
    unsigned char held[512];
    size_t bytes = 0;
    for (size_t p0 = 0; p0 < pages; p0 += sizeof held) {
        size_t np = pages - p0 < sizeof held ? pages - p0 : sizeof held;
        if (!pages_held(pagemap, x + first + p0 * page, np, page, held))
            break;
        for (size_t i = 0; i < np; i++) {
            if (!held[i])
                continue;
            size_t a = first + (p0 + i) * page, b = a + page;
            a = a < lo ? lo : a;
            b = b > hi ? hi : b;
            bytes += b - a;
        }
    }
    return bytes;
}

static zt_event *cpu_event_create(zt_backend *be) {
    (void)be;
    return calloc(1, sizeof(zt_event));
}

static void cpu_event_destroy(zt_backend *be, zt_event *ev) {
    (void)be;
    free(ev);
}

static void cpu_event_record(zt_backend *be, zt_event *ev, zt_stream s) {
    (void)be, (void)s;
    if (ev->timer) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ev->ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
        ev->recorded = true;
    }
}

static zt_event *cpu_timer_create(zt_backend *be) {
    zt_event *ev = cpu_event_create(be);
    if (ev)
        ev->timer = true;
    return ev;
}

static zt_status cpu_timer_elapsed(zt_backend *be, zt_event *start, zt_event *end, double *ms) {
    (void)be;
    if (!start->timer || !end->timer || !start->recorded || !end->recorded)
        return zt_error(ZT_ERR_INVALID, "cpu backend: elapsed time of an event that is not a "
                        "recorded timer");
    *ms = end->ms - start->ms;
    return ZT_OK;
}

static void cpu_stream_wait(zt_backend *be, zt_stream s, zt_event *ev) {
    (void)be, (void)s, (void)ev;
}

static zt_status cpu_event_wait(zt_backend *be, zt_event *ev) {
    (void)be, (void)ev;
    return ZT_OK;
}

static zt_status cpu_sync(zt_backend *be) {
    (void)be;
    return ZT_OK;
}

void *zt_cpu_scratch(zt_backend *be, size_t bytes) {
    cpu_state *st = be->impl;
    if (bytes > st->scratch_bytes) {
        free(st->scratch);
        st->scratch = malloc(bytes);
        ZT_ASSERT(st->scratch);
        st->scratch_bytes = bytes;
    }
    return st->scratch;
}

static void cpu_destroy(zt_backend *be) {
    cpu_state *st = be->impl;
    if (st->pagemap >= 0)
        close(st->pagemap);
    free(st->scratch);
    free(st);
}

static const zt_backend_iface cpu_iface = {
    .alloc = cpu_alloc,
    .alloc_released = cpu_alloc_released,
    .reserve = cpu_alloc_released,
    .free = cpu_free,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .release = cpu_release,
    .commit = cpu_commit,
    .resident_bytes = cpu_resident_bytes,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_wait = cpu_event_wait,
    .sync = cpu_sync,
    .destroy = cpu_destroy,
    .timer_create = cpu_timer_create,
    .timer_elapsed = cpu_timer_elapsed,
};

zt_status zt_backend_cpu_create(zt_backend **out, const zt_backend_options *opts) {
    /* A misspelt knob is refused here, before any job computes with the default it would get. */
    ZT_TRY(zt_cpu_gemm_check_env());
    ZT_TRY(zt_cpu_isa_check_env("ZTRAIN_OPTIM_ISA"));
    ZT_TRY(zt_cpu_isa_check_env("ZTRAIN_CAST_ISA"));
    cpu_state *st = calloc(1, sizeof *st);
    if (!st)
        return zt_error(ZT_ERR_NOMEM, "cpu backend: out of memory");
    zt_backend *be = &st->be;
    be->impl = st;
    /* Opened once: ZeRO measures residency at every layer. -1 leaves mincore as the fallback. */
    st->pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    be->name = "cpu";
    be->device = ZT_DEVICE_CPU;
    be->iface = &cpu_iface;
    be->ops = zt_cpu_ops();
    be->act_as_f32 = true;
    if (opts && opts->threads > 0)
        omp_set_num_threads(opts->threads);
    zt_cpu_gemm_warm();
    *out = be;
    return ZT_OK;
}

const char *zt_backend_cpu_optim_isa(void) { return zt_cpu_optim_isa(); }

const char *zt_backend_cpu_matmul(void) { return zt_cpu_gemm_lib_name(zt_cpu_gemm_lib()); }

bool zt_backend_cpu_bf16_matmul(void) { return zt_cpu_gemm_bf16_enabled(); }
