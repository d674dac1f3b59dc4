/* CUDA's virtual memory management on the emulated device: the driver calls cuMemAddressReserve,
 * cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree and
 * cuMemGetAllocationGranularity, reached as a runtime-linked program reaches them, through
 * cudaGetDriverEntryPointByVersion.
 *
 * Reserved address ranges lie in a region of their own beside the cudaMalloc arena, PROT_NONE
 * wherever nothing is mapped. A physical allocation is a memfd of whole granules (2 MiB, an
 * H100's), and mapping it maps that file MAP_SHARED|MAP_FIXED at the address, so one allocation
 * mapped at two addresses is the same bytes at both, as on a GPU. A mapping is accessible only
 * after cuMemSetAccess, and, like the arena, only while the emulator does device work: the host
 * never reads it. While it does, a mapping is made readable at device work's first touch (from
 * the SIGSEGV handler, on the thread doing the work) and protected again after, so a drain pays
 * for the mappings it touches: flipping every mapping at every drain was most of the
 * emulator's system time. Device work that touches an address with no accessible mapping
 * fails: a copy, a memset or a kernel's pointer argument there is a sticky
 * cudaErrorIllegalAddress naming the reservation and the offset, and a kernel reaching past its
 * arguments into an unmapped granule dies in the SIGSEGV handler with the same account. The
 * mapping calls are host calls that take effect at once while queued work runs later, which is
 * how a GPU behaves: an unmap before the work using the range has run is a fault here, as it is
 * there.
 *
 * The driver's checks: sizes and addresses in whole granules, a map only into unmapped space of
 * one reservation and within the allocation, an unmap of whole mappings only, a release of a
 * live handle only (the memory goes when its last mapping does), a reservation freed only whole
 * and with nothing mapped. Physical bytes count as device memory (cudaMemGetInfo) from
 * cuMemCreate until the last of release and unmap. */
#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "emu_internal.h"

namespace zt_emu {

namespace {

/* An H100's granularity, 2 MiB; ZTRAIN_CUDA_EMU_VMM_GRANULE (a power of two from 4096, the page
 * the mappings are made of) sets another, so that a narrow model's buffers span as many granules
 * as a real model's do (bench/launch_count.py). A value not understood is said and ignored. */
size_t granule_bytes() {
    static const size_t g = [] {
        const char *e = getenv("ZTRAIN_CUDA_EMU_VMM_GRANULE");
        if (!e)
            return (size_t)2 << 20;
        char *end = nullptr;
        unsigned long long v = strtoull(e, &end, 10);
        if (*e && *end == '\0' && v >= 4096 && v <= (1ull << 30) && (v & (v - 1)) == 0)
            return (size_t)v;
        fprintf(stderr, "ztrain cuda emulator: ZTRAIN_CUDA_EMU_VMM_GRANULE='%s' is not a power "
                "of two from 4096 to 2^30 bytes: the granularity stays 2 MiB\n", e);
        return (size_t)2 << 20;
    }();
    return g;
}
/* Address space for reservations: far more than a device holds, since reserving costs nothing. */
constexpr size_t kSpaceBytes = 1ull << 40;

struct phys {
    int fd = -1;
    size_t bytes = 0;
    unsigned long serial = 0;
    bool released = false; /* cuMemRelease called: freed when its last mapping goes */
    int mappings = 0;
};

struct mapping {
    size_t bytes;
    CUmemGenericAllocationHandle handle;
    size_t handle_offset;
    bool access = false;
};

struct reservation {
    size_t bytes;
    unsigned long serial;
    const void *caller;
    std::map<size_t, mapping> maps; /* by offset in the reservation */
};

struct space {
    char *base = nullptr;
    size_t hwm = 0;
    unsigned long serial = 0, handle_serial = 0;
    size_t physical = 0;
    std::map<size_t, reservation> reservations; /* by offset from base */
    std::map<CUmemGenericAllocationHandle, phys> handles;
    bool open = false;
    pthread_t opener;                         /* the thread that opened them */
    std::vector<std::pair<char *, size_t>> opened; /* made accessible since, by faults */
    size_t n_maps = 0;                        /* mappings there are, the most `opened` holds */
};

space &S() {
    static space *s = new space;
    return *s;
}

CUresult refuse(CUresult e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
CUresult refuse(CUresult e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ztrain cuda emulator: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return e;
}

bool ensure_space() {
    space &s = S();
    if (s.base)
        return true;
    void *p =
        mmap(nullptr, kSpaceBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return false;
    s.base = (char *)p;
    return true;
}

/* The reservation holding p: its offset from base and itself; null when none. */
std::pair<const size_t, reservation> *reservation_of(const void *p) {
    space &s = S();
    if (!s.base || (const char *)p < s.base || (const char *)p >= s.base + kSpaceBytes)
        return nullptr;
    size_t off = (size_t)((const char *)p - s.base);
    auto it = s.reservations.upper_bound(off);
    if (it == s.reservations.begin())
        return nullptr;
    --it;
    return off < it->first + it->second.bytes ? &*it : nullptr;
}

/* Puts [at, at + bytes) back to reserved, inaccessible, unbacked address space. */
void unback(char *at, size_t bytes) {
    mmap(at, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

/* One mapping (or the handle itself, at cuMemRelease) less: the memory goes with the last. */
void drop_reference(CUmemGenericAllocationHandle id) {
    space &s = S();
    auto it = s.handles.find(id);
    if (--it->second.mappings > 0 || !it->second.released)
        return;
    close(it->second.fd);
    s.physical -= it->second.bytes;
    s.handles.erase(it);
}

std::string name_of(const std::pair<const size_t, reservation> &r) {
    char buf[256];
    Dl_info info;
    const char *fn = dladdr(r.second.caller, &info) && info.dli_sname ? info.dli_sname : "?";
    snprintf(buf, sizeof buf,
             "reservation #%lu (%zu bytes at %p, cuMemAddressReserve called from %s)",
             r.second.serial, r.second.bytes, (void *)(S().base + r.first), fn);
    return buf;
}

} // namespace

bool vmm_in(const void *p) {
    space &s = S();
    return s.base && (const char *)p >= s.base && (const char *)p < s.base + kSpaceBytes;
}

bool vmm_contains(const void *p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    auto *r = reservation_of(p);
    return r && (size_t)((const char *)p - S().base) - r->first + bytes <= r->second.bytes;
}

std::string vmm_describe(const void *p) {
    auto *r = reservation_of(p);
    if (!r)
        return "outside every live reservation of virtual address space";
    size_t off = (size_t)((const char *)p - S().base) - r->first;
    auto m = r->second.maps.upper_bound(off);
    bool mapped = false;
    if (m != r->second.maps.begin()) {
        --m;
        mapped = off < m->first + m->second.bytes && m->second.access;
    }
    char buf[96];
    snprintf(buf, sizeof buf, "byte %zu (granule %zu) of ", off, off / granule_bytes());
    std::string out = buf;
    out += name_of(*r);
    if (!mapped)
        out += ", where no physical memory is mapped with access (never mapped, or unmapped by "
               "cuMemUnmap)";
    return out;
}

std::string vmm_unmapped(const void *p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    auto *r = reservation_of(p);
    if (!r)
        return vmm_describe(p);
    size_t off = (size_t)((const char *)p - S().base) - r->first, end = off + (bytes ? bytes : 1);
    /* Walk the mappings from the one holding off: each must start where the last ended. */
    auto m = r->second.maps.upper_bound(off);
    if (m != r->second.maps.begin())
        --m;
    size_t at = off;
    for (; at < end && m != r->second.maps.end() && m->first <= at; ++m) {
        if (at >= m->first + m->second.bytes)
            continue;
        if (!m->second.access)
            break;
        at = m->first + m->second.bytes;
    }
    if (at >= end)
        return std::string();
    return vmm_describe(S().base + r->first + at);
}

void vmm_protect(bool open) {
    space &s = S();
    if (s.open == open)
        return;
    s.open = open;
    if (open) {
        s.opener = pthread_self();
        /* Room for every mapping (none is made while a drain holds the device lock; the slack
         * is for safety), so that the handler never allocates; past it a touch faults. */
        s.n_maps = 16;
        for (auto &r : s.reservations)
            s.n_maps += r.second.maps.size();
        s.opened.reserve(s.n_maps);
        return;
    }
    for (auto &o : s.opened)
        mprotect(o.first, o.second, PROT_NONE);
    s.opened.clear();
}

bool vmm_opened_here() {
    space &s = S();
    return s.open && pthread_equal(s.opener, pthread_self());
}

bool vmm_open_on_fault(const void *addr) {
    space &s = S();
    if (!vmm_opened_here() || s.opened.size() >= s.n_maps)
        return false;
    auto *r = reservation_of(addr);
    if (!r)
        return false;
    size_t off = (size_t)((const char *)addr - s.base) - r->first;
    auto m = r->second.maps.upper_bound(off);
    if (m == r->second.maps.begin())
        return false;
    --m;
    if (off >= m->first + m->second.bytes || !m->second.access)
        return false;
    char *at = s.base + r->first + m->first;
    if (mprotect(at, m->second.bytes, PROT_READ | PROT_WRITE) != 0)
        return false;
    s.opened.emplace_back(at, m->second.bytes);
    return true;
}

size_t vmm_physical_bytes() {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    return S().physical;
}

size_t vmm_reservation_bytes(const void *p) {
    auto *r = reservation_of(p);
    return r ? r->second.bytes : 0;
}

void vmm_mapped_pieces(const void *p, std::vector<std::pair<char *, size_t>> &out) {
    auto *r = reservation_of(p);
    if (!r)
        return;
    for (auto &m : r->second.maps)
        if (m.second.access)
            out.emplace_back(S().base + r->first + m.first, m.second.bytes);
}

} // namespace zt_emu

using namespace zt_emu;

extern "C" {

static CUresult emu_cuMemGetAllocationGranularity(size_t *granularity,
                                                  const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option) {
    if (!granularity || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        prop->location.id != current_device())
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity: the properties "
                      "must name pinned memory on device %d (this process's emulated device)",
                      current_device());
    (void)option; /* minimum and recommended are the same granule here, as on an H100 */
    *granularity = granule_bytes();
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                        CUdeviceptr addr, unsigned long long flags) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    space &s = S();
    const size_t G = granule_bytes();
    if (!ptr || !size || size % G || (alignment && (alignment & (alignment - 1))) || flags)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve(size %zu, alignment %zu, "
                      "flags %llu): the size must be a non-zero multiple of the granularity "
                      "(%zu), the alignment 0 or a power of two, flags 0", size, alignment,
                      flags, G);
    (void)addr; /* a hint only, as the driver treats it */
    if (!ensure_space())
        return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAddressReserve: no address space: %s",
                      strerror(errno));
    size_t align = alignment > G ? alignment : G;
    size_t off = (s.hwm + align - 1) / align * align;
    if (off + size > kSpaceBytes)
        return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAddressReserve(%zu): the emulator's %zu "
                      "GiB of address space are used up", size, kSpaceBytes >> 30);
    s.hwm = off + size;
    s.reservations[off] = reservation{size, ++s.serial, __builtin_return_address(0), {}};
    *ptr = (CUdeviceptr)(s.base + off);
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    space &s = S();
    auto *r = reservation_of((const void *)ptr);
    if (!r || s.base + r->first != (char *)ptr || r->second.bytes != size)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree(%p, %zu): not a whole "
                      "reservation (free what cuMemAddressReserve returned, with its size)",
                      (void *)ptr, size);
    if (!r->second.maps.empty())
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree(%p): %s still has %zu "
                      "mappings; cuMemUnmap them first", (void *)ptr, name_of(*r).c_str(),
                      r->second.maps.size());
    s.reservations.erase(r->first);
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                const CUmemAllocationProp *prop, unsigned long long flags) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    space &s = S();
    if (!handle || !prop || !size || size % granule_bytes() || flags ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        prop->location.id != current_device())
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemCreate(size %zu): the size must be a "
                      "non-zero multiple of the granularity (%zu), flags 0, and the properties "
                      "pinned memory on device %d", size, granule_bytes(), current_device());
    if (dev_allocated_bytes() + size > device_total_bytes())
        return CUDA_ERROR_OUT_OF_MEMORY;
    int fd = memfd_create("ztrain-emu-granule", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate(%zu): memfd: %s", size,
                      strerror(errno));
    }
    /* New device memory holds no zeros a program may count on: fill it as cudaMalloc's. */
    void *fill = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fill != MAP_FAILED) {
        memset(fill, 0xFF, size);
        munmap(fill, size);
    }
    phys h;
    h.fd = fd;
    h.bytes = size;
    h.serial = ++s.handle_serial;
    s.handles[h.serial] = h;
    s.physical += size;
    *handle = h.serial;
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemRelease(CUmemGenericAllocationHandle handle) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    space &s = S();
    auto it = s.handles.find(handle);
    if (it == s.handles.end() || it->second.released)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemRelease(%llu): not a live allocation "
                      "handle (never made by cuMemCreate, or released already)", handle);
    it->second.released = true;
    it->second.mappings++;
    drop_reference(handle);
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    space &s = S();
    auto h = s.handles.find(handle);
    if (h == s.handles.end() || h->second.released)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap(%p): handle %llu is not a live "
                      "allocation", (void *)ptr, handle);
    auto *r = reservation_of((const void *)ptr);
    size_t at = r ? (size_t)((char *)ptr - s.base) - r->first : 0;
    const size_t G = granule_bytes();
    if (!r || !size || size % G || at % G || offset % G || flags ||
        at + size > r->second.bytes || offset + size > h->second.bytes)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap(%p, %zu, offset %zu, handle %llu): "
                      "the range must lie in one reservation, the size and offsets be whole "
                      "granules (%zu), and [offset, offset + size) lie in the allocation (%zu "
                      "bytes)", (void *)ptr, size, offset, handle, G, h->second.bytes);
    auto next = r->second.maps.lower_bound(at);
    bool clash = next != r->second.maps.end() && next->first < at + size;
    if (next != r->second.maps.begin()) {
        auto prev = std::prev(next);
        clash |= prev->first + prev->second.bytes > at;
    }
    if (clash)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap(%p, %zu): part of the range is "
                      "mapped already in %s (cuMemUnmap it first)", (void *)ptr, size,
                      name_of(*r).c_str());
    void *m = mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->second.fd,
                   (off_t)offset);
    if (m == MAP_FAILED)
        return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemMap(%p, %zu): mmap: %s", (void *)ptr, size,
                      strerror(errno));
    r->second.maps[at] = mapping{size, handle, offset, false};
    h->second.mappings++;
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemUnmap(CUdeviceptr ptr, size_t size) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    space &s = S();
    auto *r = reservation_of((const void *)ptr);
    size_t at = r ? (size_t)((char *)ptr - s.base) - r->first : 0;
    /* Whole mappings only, one after another from ptr to ptr + size. */
    bool whole = r && size;
    size_t end = at + size;
    if (whole) {
        size_t cur = at;
        for (auto m = r->second.maps.find(at); cur < end; ++m) {
            if (m == r->second.maps.end() || m->first != cur || cur + m->second.bytes > end) {
                whole = false;
                break;
            }
            cur += m->second.bytes;
        }
    }
    if (!whole)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemUnmap(%p, %zu): the range must be whole "
                      "mappings made by cuMemMap, with nothing unmapped between them (%s)",
                      (void *)ptr, size,
                      r ? name_of(*r).c_str() : "not in a reservation");
    for (auto m = r->second.maps.find(at); m != r->second.maps.end() && m->first < end;) {
        unback(s.base + r->first + m->first, m->second.bytes);
        drop_reference(m->second.handle);
        m = r->second.maps.erase(m);
    }
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                   size_t count) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    space &s = S();
    if (!desc || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        desc->location.id != current_device() || desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess(%p): one descriptor giving "
                      "device %d read-write access is what the emulator knows", (void *)ptr,
                      current_device());
    auto *r = reservation_of((const void *)ptr);
    size_t at = r ? (size_t)((char *)ptr - s.base) - r->first : 0;
    bool whole = r && size && size % granule_bytes() == 0 && at % granule_bytes() == 0;
    if (whole) {
        /* The whole range must be mapped (no access to unmapped space). */
        size_t cur = at;
        auto m = r->second.maps.upper_bound(at);
        if (m != r->second.maps.begin())
            --m;
        for (; cur < at + size && m != r->second.maps.end() && m->first <= cur; ++m)
            if (m->first + m->second.bytes > cur)
                cur = m->first + m->second.bytes;
        whole = cur >= at + size;
    }
    if (!whole)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess(%p, %zu): the range must be "
                      "whole granules of one reservation, all mapped", (void *)ptr, size);
    auto m = r->second.maps.upper_bound(at);
    if (m != r->second.maps.begin() && std::prev(m)->first + std::prev(m)->second.bytes > at)
        --m;
    /* Opened by device work's first touch, like every mapping (vmm_protect). */
    for (; m != r->second.maps.end() && m->first < at + size; ++m)
        m->second.access = true;
    return CUDA_SUCCESS;
}

/* The driver entry points a runtime-linked program may ask for by name: only the virtual
 * memory calls above are emulated; any other name is "not found", as for a symbol the driver
 * lacks. */
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
    static const struct {
        const char *name;
        void *fn;
    } table[] = {
        {"cuMemGetAllocationGranularity", (void *)emu_cuMemGetAllocationGranularity},
        {"cuMemAddressReserve", (void *)emu_cuMemAddressReserve},
        {"cuMemAddressFree", (void *)emu_cuMemAddressFree},
        {"cuMemCreate", (void *)emu_cuMemCreate},
        {"cuMemRelease", (void *)emu_cuMemRelease},
        {"cuMemMap", (void *)emu_cuMemMap},
        {"cuMemUnmap", (void *)emu_cuMemUnmap},
        {"cuMemSetAccess", (void *)emu_cuMemSetAccess},
    };
    (void)flags;
    if (!symbol || !fn)
        return cudaErrorInvalidValue;
    *fn = nullptr;
    for (const auto &e : table) {
        if (strcmp(symbol, e.name) != 0)
            continue;
        /* All of them are CUDA 10.2's. */
        if (version < 10020) {
            if (status)
                *status = cudaDriverEntryPointVersionNotSufficent;
            return cudaSuccess;
        }
        *fn = e.fn;
        if (status)
            *status = cudaDriverEntryPointSuccess;
        return cudaSuccess;
    }
    if (status)
        *status = cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

} /* extern "C" */
