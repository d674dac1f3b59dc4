/* Device and pinned memory of the emulated device. Device memory is one reserved mapping kept
 * PROT_NONE while the host runs, opened only while the emulator itself does device work, so a
 * host dereference of a device pointer faults as it would on a GPU; the SIGSEGV handler names the
 * allocation and where it was made before the process dies. Allocations are 256-byte aligned
 * (cudaMalloc's guarantee), start filled with 0xFF (NaN in every float type) and are followed by
 * a red zone of 0xA5 bytes that is checked after each piece of device work, so a kernel writing
 * past the end of its buffer fails its launch. Pinned memory is ordinary host memory the emulator
 * remembers, so copies from and to it can be asynchronous. */
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "emu_internal.h"

namespace zt_emu {

namespace {

constexpr size_t kAlign = 256, kRed = 256;
/* Address space reserved for device memory: an H100's 80 GB, of which only what is used is ever
 * made accessible. */
constexpr size_t kArenaBytes = 80ull << 30;
/* What is opened and closed at each drain is rounded to transparent huge pages where the kernel
 * gives them (MADV_HUGEPAGE): mprotect's work is per page table entry, and a drain changes the
 * protection of everything handed out, so 2 MiB entries make it 512 times less (about a fifth
 * of a tensor-parallel test's time with 4 KiB ones). */
constexpr size_t kHuge = 2ull << 20;
constexpr unsigned char kRedByte = 0xA5;

struct allocation {
    size_t bytes;
    unsigned long serial;
    const void *caller;
};

struct arena {
    char *base = nullptr;
    size_t hwm = 0;    /* bytes from base ever handed out */
    size_t opened = 0; /* bytes made accessible */
    int open_depth = 0;
    unsigned long serial = 0;
    size_t live_bytes = 0;
    std::map<size_t, allocation> live;    /* by offset */
    std::map<size_t, size_t> free_ranges; /* offset -> bytes */
    std::map<uintptr_t, size_t> pinned;
};

arena &A() {
    static arena a;
    return a;
}

struct sigaction previous_segv;

void segv_handler(int sig, siginfo_t *info, void *uctx) {
    arena &a = A();
    const char *addr = (const char *)info->si_addr;
    if (vmm_open_on_fault(addr))
        return; /* device work's first touch of a mapping: the access is retried */
    if (vmm_in(addr) && vmm_opened_here()) { /* opened only while the arena is (arena_open) */
        /* Device work reached an address with nothing mapped: a kernel going past the granule of
         * its pointer argument (those are checked before it runs). */
        std::string what = vmm_describe(addr);
        char msg[1024];
        int n = snprintf(msg, sizeof msg,
                         "ztrain cuda emulator: device fault: cudaErrorIllegalAddress: device "
                         "work touched %p, %s\n", (const void *)addr, what.c_str());
        if (n > 0)
            (void)!write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    } else if ((a.base && addr >= a.base && addr < a.base + kArenaBytes) || vmm_in(addr)) {
        std::string what = describe(addr);
        char msg[1024];
        int n = snprintf(msg, sizeof msg,
                         "ztrain cuda emulator: host code dereferenced device memory at %p, %s; "
                         "device memory is readable only by device work (copy it to the host "
                         "with cudaMemcpy first)\n",
                         (const void *)addr, what.c_str());
        if (n > 0)
            (void)!write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        /* Where the host code was: the frames that made the access. */
        void *frames[24];
        int depth = backtrace(frames, 24);
        backtrace_symbols_fd(frames, depth, 2);
    }
    /* Die (or let the program's own handler act) as the fault would have without us. */
    sigaction(SIGSEGV, &previous_segv, nullptr);
    (void)sig;
    (void)uctx;
}

void ensure_arena() {
    arena &a = A();
    if (a.base)
        return;
    void *p = mmap(nullptr, kArenaBytes + kHuge, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr,
                "ztrain cuda emulator: cannot reserve %zu GiB of address space for "
                "device memory: %s\n",
                kArenaBytes >> 30, strerror(errno));
        abort();
    }
    /* The arena starts on a huge page; what is left of the reservation before it is returned. */
    a.base = (char *)(((uintptr_t)p + kHuge - 1) / kHuge * kHuge);
    if (a.base > (char *)p)
        munmap(p, (size_t)(a.base - (char *)p));
    munmap(a.base + kArenaBytes, kHuge - (size_t)(a.base - (char *)p));
#ifdef MADV_HUGEPAGE
    madvise(a.base, kArenaBytes, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
#endif
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
}

size_t page() {
    static size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

/* The opened extent of the arena for a high-water mark: whole huge pages. */
size_t opened_extent(size_t hwm) { return (hwm + kHuge - 1) / kHuge * kHuge; }

/* Makes the arena up to hwm accessible while open (pages handed out since the last open). */
void grow_opened() {
    arena &a = A();
    size_t want = opened_extent(a.hwm);
    if (a.open_depth > 0 && want > a.opened) {
        mprotect(a.base + a.opened, want - a.opened, PROT_READ | PROT_WRITE);
        a.opened = want;
    }
}

size_t footprint(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign + kRed; }

} // namespace

void arena_open() {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    arena &a = A();
    ensure_arena();
    if (a.open_depth++ == 0) {
        a.opened = opened_extent(a.hwm);
        if (a.opened)
            mprotect(a.base, a.opened, PROT_READ | PROT_WRITE);
        vmm_protect(true);
    }
}

void arena_close() {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    arena &a = A();
    if (--a.open_depth == 0) {
        if (a.opened)
            mprotect(a.base, a.opened, PROT_NONE);
        a.opened = 0;
        vmm_protect(false);
    }
}

void *dev_alloc(size_t bytes, const void *caller) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    arena &a = A();
    ensure_arena();
    size_t need = footprint(bytes ? bytes : 1), off = SIZE_MAX;
    for (auto it = a.free_ranges.begin(); it != a.free_ranges.end(); ++it) {
        if (it->second >= need) {
            off = it->first;
            size_t rest = it->second - need;
            a.free_ranges.erase(it);
            if (rest)
                a.free_ranges[off + need] = rest;
            break;
        }
    }
    if (off == SIZE_MAX) {
        if (a.hwm + need > kArenaBytes)
            return nullptr;
        off = a.hwm;
        a.hwm += need;
    }
    a.live[off] = allocation{bytes, ++a.serial, caller};
    a.live_bytes += bytes;
    arena_open();
    grow_opened();
    memset(a.base + off, 0xFF, bytes);
    memset(a.base + off + bytes, kRedByte, need - bytes);
    arena_close();
    return a.base + off;
}

bool dev_free(void *p) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    arena &a = A();
    if (!a.base || (char *)p < a.base)
        return false;
    auto it = a.live.find((size_t)((char *)p - a.base));
    if (it == a.live.end())
        return false;
    size_t off = it->first, len = footprint(it->second.bytes ? it->second.bytes : 1);
    a.live_bytes -= it->second.bytes;
    a.live.erase(it);
    /* Merge with the free neighbours so the arena does not fragment into slivers. */
    auto next = a.free_ranges.lower_bound(off);
    if (next != a.free_ranges.end() && next->first == off + len) {
        len += next->second;
        a.free_ranges.erase(next);
    }
    auto prev = a.free_ranges.lower_bound(off);
    if (prev != a.free_ranges.begin()) {
        --prev;
        if (prev->first + prev->second == off) {
            off = prev->first;
            len += prev->second;
            a.free_ranges.erase(prev);
        }
    }
    a.free_ranges[off] = len;
    return true;
}

static const std::pair<const size_t, allocation> *owner(const void *p) {
    arena &a = A();
    if (!a.base || (const char *)p < a.base || (const char *)p >= a.base + kArenaBytes ||
        a.live.empty())
        return nullptr;
    size_t off = (size_t)((const char *)p - a.base);
    auto it = a.live.upper_bound(off);
    if (it == a.live.begin())
        return nullptr;
    --it;
    return &*it;
}

bool in_arena(const void *p) {
    arena &a = A();
    return (a.base && (const char *)p >= a.base && (const char *)p < a.base + kArenaBytes) ||
           vmm_in(p);
}

bool dev_contains(const void *p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (vmm_in(p))
        return vmm_contains(p, bytes);
    auto *o = owner(p);
    if (!o)
        return false;
    size_t off = (size_t)((const char *)p - A().base) - o->first;
    return off + bytes <= o->second.bytes;
}

std::string describe(const void *p) {
    if (vmm_in(p))
        return vmm_describe(p);
    arena &a = A();
    auto *o = owner(p);
    char buf[512];
    if (!o) {
        snprintf(buf, sizeof buf, "outside every live allocation");
        return buf;
    }
    Dl_info info;
    const char *fn = dladdr(o->second.caller, &info) && info.dli_sname ? info.dli_sname : "?";
    size_t off = (size_t)((const char *)p - a.base) - o->first;
    if (off < o->second.bytes)
        snprintf(buf, sizeof buf,
                 "byte %zu of allocation #%lu (%zu bytes at %p, cudaMalloc called "
                 "from %s)",
                 off, o->second.serial, o->second.bytes, (void *)(a.base + o->first), fn);
    else
        snprintf(buf, sizeof buf,
                 "%zu bytes past the end of allocation #%lu (%zu bytes at %p, "
                 "cudaMalloc called from %s)",
                 off - o->second.bytes + 1, o->second.serial, o->second.bytes,
                 (void *)(a.base + o->first), fn);
    return buf;
}

size_t dev_allocated_bytes() {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    return A().live_bytes + vmm_physical_bytes();
}

bool allocation_of(const void *p, char **base, size_t *bytes) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    auto *o = owner(p);
    if (!o || (size_t)((const char *)p - A().base) - o->first > o->second.bytes)
        return false;
    *base = A().base + o->first;
    *bytes = o->second.bytes;
    return true;
}

std::string check_red_zones(const char *what) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    arena &a = A();
    for (auto &kv : a.live) {
        const unsigned char *end = (const unsigned char *)a.base + kv.first + kv.second.bytes;
        size_t n = footprint(kv.second.bytes ? kv.second.bytes : 1) - kv.second.bytes;
        for (size_t i = 0; i < n; i++) {
            if (end[i] != kRedByte) {
                std::string d = describe(end + i);
                /* Restore it, so one overrun is reported once. */
                memset((void *)end, kRedByte, n);
                return std::string(what) + " wrote " + d;
            }
        }
    }
    return std::string();
}

void *pinned_alloc(size_t bytes) {
    void *p = nullptr;
    if (posix_memalign(&p, page(), bytes ? bytes : 1) != 0)
        return nullptr;
    std::lock_guard<std::recursive_mutex> g(device_lock());
    A().pinned[(uintptr_t)p] = bytes ? bytes : 1;
    return p;
}

bool pinned_free(void *p) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (!A().pinned.erase((uintptr_t)p))
        return false;
    free(p);
    return true;
}

bool is_pinned(const void *p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    auto &m = A().pinned;
    auto it = m.upper_bound((uintptr_t)p);
    if (it == m.begin())
        return false;
    --it;
    return (uintptr_t)p + bytes <= it->first + it->second;
}

} // namespace zt_emu
