/* The CUDA runtime calls the backend makes, on the emulated device: an H100's properties, memory
 * (emu_memory.cc), streams, events, copies, memsets and kernel launches.
 *
 * Stream work is deferred: each stream is a queue that runs only when something forces it
 * (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a blocking cudaMemcpy, a
 * query that finds it pending), so host code that reads the target of an asynchronous copy
 * before synchronising sees the old bytes, as on a GPU. A copy from pageable host memory takes
 * its source at the call (CUDA stages it); from pinned memory when the copy runs, as DMA would.
 * cudaStreamWaitEvent makes draining the stream drain the event's stream up to the event first.
 * The legacy default stream waits for the blocking streams and they for it; streams made with
 * cudaStreamNonBlocking (the backend's) do neither.
 *
 * Launches are checked against an H100's limits and fail as the runtime does, left for
 * cudaGetLastError. A kernel whose arguments reach little memory runs twice, threads and blocks
 * in ascending then in descending order from the same memory, and the two results must agree bit
 * for bit. A fault
 * inside device work is sticky: every later call returns it, with the emulator's account of what
 * went wrong appended to cudaGetErrorString's text.
 *
 * Stream capture and CUDA graphs are not emulated (the backend uses none): their calls are
 * refused by name, at the end of this file. */
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "emu_device.h"
#include "emu_internal.h"

struct CUstream_st {
    std::deque<std::pair<uint64_t, std::function<cudaError_t(std::string &)>>> q;
    std::deque<const char *> what;
    uint64_t next_seq = 1, done_seq = 0;
    bool blocking = true, legacy = false, destroyed = false;
    unsigned queries = 0;
    std::deque<uint64_t> d2h; /* the sequence numbers of device-to-host copies still queued */
};

/* When a timing event's record ran: the host's steady clock as the stream's queue reached it,
 * which is the emulator's account of "after the work before it finished". One per record, shared
 * with the queued record, so a re-record or a destroy before the queue runs touches no freed or
 * reused stamp. */
struct emu_stamp {
    bool done = false;
    std::chrono::steady_clock::time_point t;
};

struct CUevent_st {
    CUstream_st *s = nullptr;
    uint64_t seq = 0; /* 0: never recorded, complete */
    unsigned queries = 0;
    bool timing = true; /* not made with cudaEventDisableTiming */
    std::shared_ptr<emu_stamp> stamp; /* the last record's; NULL: never recorded or no timing */
};

namespace zt_emu {

/* What the host waited for and read back (zt_emu_sync_counts): each call that blocks the host
 * until device work has run, each device-to-host copy, and each host-to-device copy from
 * pageable memory (which CUDA may stage with a wait of its own). */
static std::atomic<unsigned long long> g_waits, g_d2h, g_pageable_h2d;
static void count_wait() { g_waits++; }
/* Event waits that returned with a device-to-host copy still queued behind the event on its
 * stream (zt_emu_waits_ahead): the host goes on while the device has reads left to run. */
static std::atomic<unsigned long long> g_waits_ahead;

std::recursive_mutex &device_lock() {
    static std::recursive_mutex *m = new std::recursive_mutex;
    return *m;
}

namespace {

/* The H100 SXM's figures that launches are checked against. */
constexpr size_t kTotalMem = 85520809984ull;
constexpr int kSmemDefault = 48 << 10, kSmemOptin = 232448;

/* A fault is the context's, seen by every thread; the last error is the calling host thread's,
 * as the CUDA runtime keeps it (cudaGetLastError: "from a runtime call in the same host thread"),
 * so a launch refused on one thread is not taken, or reported, by another. */
cudaError_t g_sticky = cudaSuccess;
thread_local cudaError_t g_last = cudaSuccess;
std::string g_sticky_detail;
/* The current device is the calling host thread's, as the CUDA runtime's: a thread that has not
 * called cudaSetDevice works on device 0, whatever another thread chose, so a thread that issues
 * work without binding itself to its rank's GPU meets what it would on a multi-GPU host (NCCL's
 * device check, memory made on device 0). */
thread_local int g_device = 0;
CUstream_st g_legacy_stream;
std::vector<CUstream_st *> g_streams; /* every stream made, the legacy one first */
std::map<const void *, int> g_max_dyn_smem;
unsigned long g_launches;

struct config {
    int devices = 1;
    int interleave = -1; /* -1: on small arenas only */
    std::string fault_kernel;
    unsigned long fault_nth = 1, fault_seen = 0;
};

/* How many of n devices CUDA_VISIBLE_DEVICES leaves visible, read as the CUDA runtime reads it:
 * a comma-separated list of device indices, taken up to the first entry that is not one (a
 * UUID or MIG name included, which the emulated devices do not have), is out of range or
 * repeats an earlier one; an empty value hides every device. The visible ones are numbered 0,
 * 1, ... in the list's order. Unset: all n. */
int visible_devices(int n) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v)
        return n;
    std::vector<long> seen;
    for (const char *p = v; *p;) {
        while (*p == ' ')
            p++;
        char *end = nullptr;
        long i = strtol(p, &end, 10);
        if (end == p || i < 0 || i >= n)
            break;
        while (*end == ' ')
            end++;
        bool again = false;
        for (long s : seen)
            again |= s == i;
        if (again || (*end != ',' && *end != '\0'))
            break;
        seen.push_back(i);
        p = *end == ',' ? end + 1 : end;
    }
    return (int)seen.size();
}

config &cfg() {
    static config *c = [] {
        config *c = new config;
        /* n GPUs, each process still one device of its own (ranks take their LOCAL_RANK's). A
         * value not understood shows no GPU, saying why, rather than a guess. */
        if (const char *d = getenv("ZTRAIN_CUDA_EMU_DEVICES")) {
            char *end = nullptr;
            long n = strtol(d, &end, 10);
            c->devices = *d && *end == '\0' && n > 0 && n <= 64 ? (int)n : 0;
            if (!c->devices)
                fprintf(stderr, "ztrain cuda emulator: ZTRAIN_CUDA_EMU_DEVICES='%s' is not a "
                        "number of devices from 1 to 64: the emulated device shows none\n", d);
        }
        /* A rank given its own GPUs by ztraind or a launcher sees only those, as on a host. */
        c->devices = visible_devices(c->devices);
        if (const char *i = getenv("ZTRAIN_CUDA_EMU_INTERLEAVE"))
            c->interleave = strcmp(i, "0") == 0 ? 0 : 1;
        /* NAME or NAME:N: the Nth launch of a kernel whose name contains NAME faults (a test's
         * injected device error). */
        if (const char *f = getenv("ZTRAIN_CUDA_EMU_FAULT")) {
            c->fault_kernel = f;
            size_t colon = c->fault_kernel.find(':');
            if (colon != std::string::npos) {
                c->fault_nth = strtoul(f + colon + 1, nullptr, 10);
                c->fault_kernel.resize(colon);
            }
        }
        return c;
    }();
    return *c;
}

/* Launches whose pointer arguments reach at most this much device memory run in both orders
 * when ZTRAIN_CUDA_EMU_INTERLEAVE is unset (the op tests' shapes; training's are bigger). */
constexpr size_t kInterleaveAuto = 8 << 20;

cudaError_t fail(cudaError_t e) {
    if (g_last == cudaSuccess)
        g_last = e;
    return e;
}

CUstream_st *stream_of(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return &g_legacy_stream;
    return s;
}

void init_streams() {
    if (g_streams.empty()) {
        g_legacy_stream.legacy = true;
        g_streams.push_back(&g_legacy_stream);
    }
}

/* Runs s's work up to and including seq. */
void drain(CUstream_st *s, uint64_t seq) {
    if (s->q.empty() || s->q.front().first > seq)
        return;
    /* Open once for the whole drain: mprotect costs in proportion to the arena. */
    arena_open();
    while (!s->q.empty() && s->q.front().first <= seq) {
        auto op = std::move(s->q.front());
        const char *what = s->what.front();
        s->q.pop_front();
        s->what.pop_front();
        s->done_seq = op.first;
        if (g_sticky != cudaSuccess)
            continue; /* a faulted device runs nothing more */
        std::string detail;
        cudaError_t e = op.second(detail);
        std::string red = e == cudaSuccess ? check_red_zones(what) : std::string();
        if (e == cudaSuccess && !red.empty()) {
            e = cudaErrorIllegalAddress;
            detail = red;
        }
        if (e != cudaSuccess)
            set_sticky(e, detail.empty() ? std::string(what) : detail);
    }
    while (!s->d2h.empty() && s->d2h.front() <= s->done_seq)
        s->d2h.pop_front();
    arena_close();
}

void drain_all(CUstream_st *s) { drain(s, s->next_seq - 1); }

cudaError_t push(CUstream_st *s, const char *what, std::function<cudaError_t(std::string &)> fn) {
    s->q.emplace_back(s->next_seq++, std::move(fn));
    s->what.push_back(what);
    return cudaSuccess;
}

/* An op on s waits for the streams CUDA's legacy-stream rules order it after. */
void order_legacy(CUstream_st *s) {
    init_streams();
    if (s->legacy) {
        for (CUstream_st *o : g_streams) {
            if (o != s && o->blocking && !o->destroyed && !o->q.empty()) {
                uint64_t upto = o->next_seq - 1;
                push(s, "legacy stream wait", [o, upto](std::string &) {
                    drain(o, upto);
                    return cudaSuccess;
                });
            }
        }
    } else if (s->blocking && !g_legacy_stream.q.empty()) {
        uint64_t upto = g_legacy_stream.next_seq - 1;
        push(s, "wait for the legacy stream", [upto](std::string &) {
            drain(&g_legacy_stream, upto);
            return cudaSuccess;
        });
    }
}

std::string hex(const void *p) {
    char b[32];
    snprintf(b, sizeof b, "%p", p);
    return b;
}

/* A device range in a reservation must be mapped when the copy or memset runs (the mapping
 * calls take effect at once, the work later: an unmap before it ran is the fault it is on a
 * GPU). */
bool mapped_when_run(const void *p, size_t bytes, const char *call, const char *side,
                     std::string &detail) {
    std::string unmapped = vmm_in(p) ? vmm_unmapped(p, bytes) : std::string();
    if (unmapped.empty())
        return true;
    detail = std::string(call) + ": the " + side + " " + hex(p) + " (" + std::to_string(bytes) +
             " bytes) reaches " + unmapped;
    return false;
}

/* Where a copy's device side must lie: inside one live allocation. */
bool device_range_ok(const void *p, size_t bytes, const char *call, const char *side) {
    if (dev_contains(p, bytes))
        return true;
    std::string why = in_arena(p) ? describe(p) : "not device memory";
    fprintf(stderr, "ztrain cuda emulator: %s: the %s %s (%zu bytes) is %s\n", call, side,
            hex(p).c_str(), bytes, why.c_str());
    return false;
}

} // namespace

void set_sticky(cudaError_t e, const std::string &detail) {
    if (g_sticky != cudaSuccess)
        return;
    g_sticky = e;
    g_sticky_detail = detail;
    g_last = e;
    fprintf(stderr, "ztrain cuda emulator: device fault: %s: %s\n", cudaGetErrorName(e),
            detail.c_str());
}

cudaError_t sticky() { return g_sticky; }

size_t device_total_bytes() { return kTotalMem; }

int current_device() { return g_device; }

cudaError_t enqueue(cudaStream_t s, const char *what,
                    std::function<cudaError_t(std::string &)> fn) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (g_sticky != cudaSuccess)
        return fail(g_sticky);
    CUstream_st *st = stream_of(s);
    order_legacy(st);
    note_issue(what);
    return push(st, what, std::move(fn));
}

} // namespace zt_emu

using namespace zt_emu;

/* ---- launches -------------------------------------------------------------------------------- */

static cudaError_t run_kernel(const grid_run &g, const std::vector<const void *> &ptrs,
                              std::string &detail) {
    for (size_t i = 0; i < ptrs.size(); i++) {
        const void *p = ptrs[i];
        if (p && !dev_contains(p, 0) && !is_pinned(p, 1)) {
            detail = std::string("kernel ") + g.name + ": pointer argument " + hex(p) + " is " +
                     (in_arena(p) ? describe(p) : "host memory, not device memory");
            return cudaErrorIllegalAddress;
        }
        /* In a reservation, the argument's own byte must be mapped when the kernel runs. */
        std::string unmapped = p && vmm_in(p) ? vmm_unmapped(p, 1) : std::string();
        if (!unmapped.empty()) {
            detail = std::string("kernel ") + g.name + ": pointer argument " + hex(p) + " is " +
                     unmapped;
            return cudaErrorIllegalAddress;
        }
    }
    config &c = cfg();
    if (!c.fault_kernel.empty() && strstr(g.name, c.fault_kernel.c_str()) &&
        ++c.fault_seen == c.fault_nth) {
        detail = std::string("kernel ") + g.name +
                 ": fault injected by ZTRAIN_CUDA_EMU_FAULT (a test of error reporting)";
        return cudaErrorIllegalAddress;
    }
    /* The memory the kernel can write: the allocations its pointer arguments point into. */
    struct region {
        char *base;
        size_t bytes;
    };
    std::vector<region> regions;
    size_t total = 0;
    for (const void *p : ptrs) {
        region r;
        if (p && vmm_in(p)) {
            /* A reservation counts whole towards the size, and what is mapped of it is what
             * the kernel can write. */
            std::vector<std::pair<char *, size_t>> pieces;
            vmm_mapped_pieces(p, pieces);
            for (auto &pc : pieces) {
                bool seen = false;
                for (const region &o : regions)
                    seen |= o.base == pc.first;
                if (!seen)
                    regions.push_back(region{pc.first, pc.second});
            }
            total += vmm_reservation_bytes(p);
            continue;
        }
        if (!p || !allocation_of(p, &r.base, &r.bytes))
            continue;
        bool seen = false;
        for (const region &o : regions)
            seen |= o.base == r.base;
        if (!seen) {
            regions.push_back(r);
            total += r.bytes;
        }
    }
    const bool twice = c.interleave == 1 || (c.interleave < 0 && total <= kInterleaveAuto);
    static std::vector<char> before, first;
    if (twice) {
        before.resize(total);
        size_t at = 0;
        for (const region &r : regions)
            memcpy(before.data() + at, r.base, r.bytes), at += r.bytes;
        std::string why = run_grid(g, false);
        if (!why.empty()) {
            detail = why;
            return cudaErrorLaunchFailure;
        }
        /* Every region is read before any is restored: a released granule may still map the
         * memory a live one holds (device_vmm.c), two regions over the same bytes. */
        first.resize(total);
        at = 0;
        for (const region &r : regions)
            memcpy(first.data() + at, r.base, r.bytes), at += r.bytes;
        at = 0;
        for (const region &r : regions)
            memcpy(r.base, before.data() + at, r.bytes), at += r.bytes;
    }
    std::string why = run_grid(g, twice);
    if (!why.empty()) {
        detail = why;
        return cudaErrorLaunchFailure;
    }
    if (twice) {
        size_t at = 0;
        for (const region &r : regions) {
            if (memcmp(r.base, first.data() + at, r.bytes) != 0) {
                size_t i = 0;
                while (r.base[i] == first[at + i])
                    i++;
                detail = std::string("kernel ") + g.name +
                         ": threads run in descending order left a different value than in "
                         "ascending order at " + describe(r.base + i) +
                         ": threads of a block race between barriers (a missing __syncthreads?)";
                return cudaErrorLaunchFailure;
            }
            at += r.bytes;
        }
    }
    return cudaSuccess;
}

void zt_emu_launch_enqueue(const zt_emu_launch_desc &d, std::function<void()> body,
                           const void *const *pointer_args, size_t n_pointer_args) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    const dim3 b = d.block, gr = d.grid;
    const unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (g_sticky != cudaSuccess) {
        fail(g_sticky);
        return;
    }
    if (!b.x || !b.y || !b.z || !gr.x || !gr.y || !gr.z || b.x > 1024 || b.y > 1024 || b.z > 64 ||
        threads > 1024 || gr.x > 0x7FFFFFFFu || gr.y > 65535 || gr.z > 65535) {
        fprintf(stderr,
                "ztrain cuda emulator: launch of %s with grid (%u,%u,%u) and block "
                "(%u,%u,%u): over an H100's limits (1024 threads a block; block 1024x1024x64; "
                "grid 2^31-1 x 65535 x 65535; no zero dimension)\n",
                d.name, gr.x, gr.y, gr.z, b.x, b.y, b.z);
        fail(cudaErrorInvalidConfiguration);
        return;
    }
    auto opt = g_max_dyn_smem.find(d.fn);
    size_t allowed = opt == g_max_dyn_smem.end() ? kSmemDefault : (size_t)opt->second;
    if (d.dyn_smem > allowed) {
        fprintf(stderr,
                "ztrain cuda emulator: launch of %s asks for %zu bytes of dynamic shared "
                "memory; %zu are allowed (over 48 KiB needs cudaFuncSetAttribute("
                "cudaFuncAttributeMaxDynamicSharedMemorySize))\n",
                d.name, d.dyn_smem, allowed);
        fail(cudaErrorInvalidValue);
        return;
    }
    g_launches++;
    grid_run run{d.name, gr, b, d.dyn_smem, d.shared_lo, d.shared_hi, std::move(body)};
    std::vector<const void *> ptrs(pointer_args, pointer_args + n_pointer_args);
    enqueue(d.stream, d.name, [run = std::move(run), ptrs = std::move(ptrs)](std::string &detail) {
        return run_kernel(run, ptrs, detail);
    });
}

/* ---- errors ---------------------------------------------------------------------------------- */

extern "C" {

cudaError_t cudaGetLastError(void) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    cudaError_t e = g_last != cudaSuccess ? g_last : g_sticky;
    g_last = g_sticky;
    return e;
}

cudaError_t cudaPeekAtLastError(void) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    return g_last != cudaSuccess ? g_last : g_sticky;
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    default: return "cudaErrorUnknown";
    }
}

static const char *base_string(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    default: return "unknown error";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (e != g_sticky || g_sticky_detail.empty())
        return base_string(e);
    static std::string s;
    s = std::string(base_string(e)) + " [emulated device: " + g_sticky_detail + "]";
    return s.c_str();
}

/* ---- the device ------------------------------------------------------------------------------ */

cudaError_t cudaGetDeviceCount(int *n) {
    *n = cfg().devices;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= cfg().devices)
        return fail(cudaErrorInvalidDevice);
    g_device = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
    *d = g_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    if (d < 0 || d >= cfg().devices)
        return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (ztrain emulated device)");
    p->major = 9;
    p->minor = 0;
    p->totalGlobalMem = kTotalMem;
    p->sharedMemPerBlock = kSmemDefault;
    p->sharedMemPerBlockOptin = kSmemOptin;
    p->sharedMemPerMultiprocessor = 233472;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7FFFFFFF;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->multiProcessorCount = 132;
    p->maxThreadsPerMultiProcessor = 2048;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 5120;
    p->unifiedAddressing = 1;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 3;
    p->totalConstMem = 65536;
    p->pciDeviceID = d;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
    if (d < 0 || d >= cfg().devices)
        return fail(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = kSmemOptin; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = kSmemDefault; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *v = 132; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
    case cudaDevAttrWarpSize: *v = 32; return cudaSuccess;
    default:
        fprintf(stderr, "ztrain cuda emulator: cudaDeviceGetAttribute(%d) is not emulated\n",
                (int)a);
        return fail(cudaErrorInvalidValue);
    }
}

cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute attr, int value) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
        fprintf(stderr, "ztrain cuda emulator: cudaFuncSetAttribute(%d) is not emulated\n",
                (int)attr);
        return fail(cudaErrorInvalidValue);
    }
    if (value < 0 || value > kSmemOptin)
        return fail(cudaErrorInvalidValue);
    g_max_dyn_smem[fn] = value;
    return cudaSuccess;
}

/* ---- memory ---------------------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    *p = nullptr;
    if (g_sticky != cudaSuccess)
        return fail(g_sticky);
    if (dev_allocated_bytes() + bytes > kTotalMem ||
        !(*p = dev_alloc(bytes, __builtin_return_address(0))))
        return fail(cudaErrorMemoryAllocation);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (!p)
        return cudaSuccess;
    /* cudaFree waits for the device: the memory may still be in use by queued work. */
    for (CUstream_st *s : g_streams)
        drain_all(s);
    if (!dev_free(p)) {
        fprintf(stderr, "ztrain cuda emulator: cudaFree(%p): not a live cudaMalloc pointer\n", p);
        return fail(cudaErrorInvalidValue);
    }
    return g_sticky != cudaSuccess ? fail(g_sticky) : cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    (void)flags;
    *p = pinned_alloc(bytes);
    return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

cudaError_t cudaFreeHost(void *p) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (!p)
        return cudaSuccess;
    for (CUstream_st *s : g_streams)
        drain_all(s);
    return pinned_free(p) ? cudaSuccess : fail(cudaErrorInvalidValue);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    *total = kTotalMem;
    *free_bytes = kTotalMem - dev_allocated_bytes();
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    memset(a, 0, sizeof *a);
    a->device = g_device;
    if (dev_contains(p, 0)) {
        a->type = cudaMemoryTypeDevice;
        a->devicePointer = (void *)p;
    } else if (is_pinned(p, 1)) {
        a->type = cudaMemoryTypeHost;
        a->devicePointer = a->hostPointer = (void *)p;
    } else {
        a->type = cudaMemoryTypeUnregistered;
        a->device = -2;
    }
    return cudaSuccess;
}

/* ---- copies and memsets ---------------------------------------------------------------------- */

static cudaError_t copy_async(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                              cudaStream_t stream, const char *call) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (g_sticky != cudaSuccess)
        return fail(g_sticky);
    if (bytes == 0)
        return cudaSuccess;
    if (kind == cudaMemcpyDefault)
        kind = dev_contains(src, 0)
                   ? (dev_contains(dst, 0) ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                   : (dev_contains(dst, 0) ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((dst_dev && !device_range_ok(dst, bytes, call, "destination")) ||
        (src_dev && !device_range_ok(src, bytes, call, "source")))
        return fail(cudaErrorInvalidValue);
    if ((!dst_dev && in_arena(dst)) || (!src_dev && in_arena(src))) {
        fprintf(stderr,
                "ztrain cuda emulator: %s: a host side of the copy is device memory "
                "(the copy kind is wrong)\n",
                call);
        return fail(cudaErrorInvalidValue);
    }
    if (kind == cudaMemcpyDeviceToHost)
        g_d2h++;
    if (kind == cudaMemcpyHostToDevice && !is_pinned(src, bytes))
        g_pageable_h2d++;
    if (!src_dev && !is_pinned(src, bytes)) {
        /* Pageable source: staged now, so the caller may reuse it when the call returns. */
        auto staged =
            std::make_shared<std::vector<char>>((const char *)src, (const char *)src + bytes);
        return enqueue(stream, call, [dst, staged, call](std::string &detail) {
            if (!mapped_when_run(dst, staged->size(), call, "destination", detail))
                return cudaErrorIllegalAddress;
            memcpy(dst, staged->data(), staged->size());
            return cudaSuccess;
        });
    }
    cudaError_t e =
        enqueue(stream, call, [dst, src, bytes, call, src_dev, dst_dev](std::string &detail) {
            if ((dst_dev && !mapped_when_run(dst, bytes, call, "destination", detail)) ||
                (src_dev && !mapped_when_run(src, bytes, call, "source", detail)))
                return cudaErrorIllegalAddress;
            memmove(dst, src, bytes);
            return cudaSuccess;
        });
    if (e == cudaSuccess && kind == cudaMemcpyDeviceToHost)
        stream_of(stream)->d2h.push_back(stream_of(stream)->next_seq - 1);
    return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    return copy_async(dst, src, bytes, kind, stream, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    cudaError_t e = copy_async(dst, src, bytes, kind, nullptr, "cudaMemcpy");
    if (e != cudaSuccess)
        return e;
    count_wait();
    init_streams();
    drain_all(&g_legacy_stream);
    return g_sticky != cudaSuccess ? fail(g_sticky) : cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (g_sticky != cudaSuccess)
        return fail(g_sticky);
    if (bytes == 0)
        return cudaSuccess;
    if (!device_range_ok(p, bytes, "cudaMemsetAsync", "target"))
        return fail(cudaErrorInvalidValue);
    return enqueue(stream, "cudaMemsetAsync", [p, value, bytes](std::string &detail) {
        if (!mapped_when_run(p, bytes, "cudaMemsetAsync", "target", detail))
            return cudaErrorIllegalAddress;
        memset(p, value, bytes);
        return cudaSuccess;
    });
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    cudaError_t e = cudaMemsetAsync(p, value, bytes, nullptr);
    if (e == cudaSuccess) {
        count_wait();
        init_streams();
        drain_all(&g_legacy_stream);
    }
    return g_sticky != cudaSuccess ? fail(g_sticky) : e;
}

/* ---- streams and events ---------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    init_streams();
    CUstream_st *st = new CUstream_st;
    st->blocking = !(flags & cudaStreamNonBlocking);
    g_streams.push_back(st);
    *s = st;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (!s || s->legacy || s->destroyed)
        return fail(cudaErrorInvalidResourceHandle);
    /* Work already queued still completes; the object stays for events recorded on it. */
    drain_all(s);
    s->destroyed = true;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    init_streams();
    count_wait();
    drain_all(stream_of(s));
    return g_sticky != cudaSuccess ? fail(g_sticky) : cudaSuccess;
}

/* Polling finds pending work not ready every other time, then runs it: loops that poll get
 * exercised without waiting forever. */
cudaError_t cudaStreamQuery(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    init_streams();
    CUstream_st *st = stream_of(s);
    if (!st->q.empty() && st->queries++ % 2 == 0)
        return cudaErrorNotReady;
    if (!st->q.empty())
        count_wait(); /* the host waits for what the query found pending */
    drain_all(st);
    return g_sticky != cudaSuccess ? fail(g_sticky) : cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    init_streams();
    count_wait();
    for (size_t i = 0; i < g_streams.size(); i++)
        drain_all(g_streams[i]);
    return g_sticky != cudaSuccess ? fail(g_sticky) : cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    *e = new CUevent_st;
    (*e)->timing = !(flags & cudaEventDisableTiming);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    if (g_sticky != cudaSuccess)
        return fail(g_sticky);
    init_streams();
    CUstream_st *st = stream_of(s);
    order_legacy(st);
    e->s = st;
    e->seq = st->next_seq;
    note_issue("cudaEventRecord");
    if (!e->timing)
        return push(st, "cudaEventRecord", [](std::string &) { return cudaSuccess; });
    std::shared_ptr<emu_stamp> stamp = std::make_shared<emu_stamp>();
    e->stamp = stamp;
    return push(st, "cudaEventRecord", [stamp](std::string &) {
        stamp->t = std::chrono::steady_clock::now();
        stamp->done = true;
        return cudaSuccess;
    });
}

/* As the runtime documents it: an event never recorded, or made without timing, is an invalid
 * handle here; one recorded whose record has not run is not ready (nothing is drained: the
 * caller synchronises first, as it must on a GPU). */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (!ms || !start || !end)
        return fail(cudaErrorInvalidValue);
    if (g_sticky != cudaSuccess)
        return fail(g_sticky);
    if (!start->timing || !end->timing || !start->stamp || !end->stamp)
        return fail(cudaErrorInvalidResourceHandle);
    if (!start->stamp->done || !end->stamp->done)
        return cudaErrorNotReady; /* not an error: cudaGetLastError keeps what it had */
    *ms = std::chrono::duration<float, std::milli>(end->stamp->t - start->stamp->t).count();
    return cudaSuccess;
}

/* Runs e's stream up to e, for a host wait; notes whether reads were left queued behind it. */
static void drain_to_event(cudaEvent_t e) {
    drain(e->s, e->seq);
    if (!e->s->d2h.empty())
        g_waits_ahead++;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    count_wait();
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    if (e->s)
        drain_to_event(e);
    return g_sticky != cudaSuccess ? fail(g_sticky) : cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    if (e->s && e->s->done_seq < e->seq) {
        if (e->queries++ % 2 == 0)
            return cudaErrorNotReady;
        count_wait();
        drain_to_event(e);
    }
    return g_sticky != cudaSuccess ? fail(g_sticky) : cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    (void)flags;
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    if (g_sticky != cudaSuccess)
        return fail(g_sticky);
    init_streams();
    if (!e->s)
        return cudaSuccess; /* never recorded: nothing to wait for */
    CUstream_st *from = e->s;
    uint64_t upto = e->seq;
    return enqueue(s, "cudaStreamWaitEvent", [from, upto](std::string &) {
        drain(from, upto);
        return cudaSuccess;
    });
}

/* ---- CUDA graphs: not emulated ---------------------------------------------------------------
 * The backend captures no graphs, so neither does the emulator: a capture or graph call is
 * refused with its name rather than run as if it worked (or left an undefined symbol that would
 * fail the module's load). */

static cudaError_t graphs_refused(const char *call) {
    fprintf(stderr, "ztrain cuda emulator: %s: stream capture and CUDA graphs are not emulated "
                    "(the backend uses none)\n",
            call);
    return fail(cudaErrorNotSupported);
}

cudaError_t cudaStreamBeginCapture(cudaStream_t, enum cudaStreamCaptureMode) {
    return graphs_refused("cudaStreamBeginCapture");
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *graph) {
    if (graph)
        *graph = nullptr;
    return graphs_refused("cudaStreamEndCapture");
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, enum cudaStreamCaptureStatus *) {
    return graphs_refused("cudaStreamIsCapturing");
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t, unsigned long long) {
    if (exec)
        *exec = nullptr;
    return graphs_refused("cudaGraphInstantiate");
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) {
    return graphs_refused("cudaGraphLaunch");
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return graphs_refused("cudaGraphExecDestroy"); }
cudaError_t cudaGraphDestroy(cudaGraph_t) { return graphs_refused("cudaGraphDestroy"); }

void zt_emu_sync_counts(unsigned long long out[3]) {
    out[0] = zt_emu::g_waits;
    out[1] = zt_emu::g_d2h;
    out[2] = zt_emu::g_pageable_h2d;
}

unsigned long long zt_emu_waits_ahead(void) { return zt_emu::g_waits_ahead; }

} /* extern "C" */
