/* CUDA's virtual memory management on the emulated device (kernels/cuda/emu/emu_vmm.cc), reached
 * as the backend reaches it, through cudaGetDriverEntryPointByVersion: the granularity an H100
 * reports (2 MiB); one physical allocation mapped at two addresses is the same bytes at both
 * (written by a memset and by a kernel through one, read through the other); the driver's
 * refusals (an unmap of part of what is mapped, a map over a mapping, a second release, freeing
 * a reservation that still has mappings); the device's free memory, which counts physical
 * allocations from cuMemCreate until the last of release and unmap; and the faults: a memset or
 * a kernel argument in an unmapped granule, and an unmap while queued work still touches the
 * range (the race a GPU punishes), each a sticky cudaErrorIllegalAddress naming the reservation
 * and the granule; a kernel reaching from its argument into an unmapped granule, and a host
 * dereference of mapped memory, each a SIGSEGV whose message names the reservation; a kernel
 * whose arguments reach two mappings of the same memory, run in both thread orders (the race
 * check), is no race; ZTRAIN_CUDA_EMU_VMM_GRANULE sets the granularity, and a value it does not
 * understand is said and leaves 2 MiB; a process on device 1 of ZTRAIN_CUDA_EMU_DEVICES=2 maps
 * memory of device 1, not 0.
 *
 * Faults are sticky for the process, so every case runs in a child of its own, as in
 * test_cuda_emu. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "emu_child.h"

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "expectation failed at %s:%d: ", __FILE__, __LINE__);                  \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

constexpr size_t G = 2u << 20;

__global__ void fill_kernel(unsigned *p, size_t n, unsigned v) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = v;
}

/* Each thread its own element: the same result in any order, whatever aliases what. */
__global__ void add_one_kernel(unsigned *dst, const unsigned *src, size_t n) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        dst[i] = src[i] + 1;
}

struct driver {
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
};

static bool entry(const char *name, void **fn) {
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    return cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q) ==
               cudaSuccess && q == cudaDriverEntryPointSuccess && *fn;
}

static bool load(driver &d) {
    memset(&d, 0, sizeof d);
    d.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    d.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.prop.location.id = 0;
    d.access.location = d.prop.location;
    d.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return entry("cuMemGetAllocationGranularity", (void **)&d.granularity) &&
           entry("cuMemAddressReserve", (void **)&d.reserve) &&
           entry("cuMemAddressFree", (void **)&d.address_free) &&
           entry("cuMemCreate", (void **)&d.create) && entry("cuMemRelease", (void **)&d.release) &&
           entry("cuMemMap", (void **)&d.map) && entry("cuMemUnmap", (void **)&d.unmap) &&
           entry("cuMemSetAccess", (void **)&d.set_access);
}

/* A reservation of n granules whose granules in `mapped` (a bit mask) are mapped, each to a new
 * physical granule, with access; the handles in h[]. */
static bool reserve_mapped(driver &d, size_t n, unsigned mapped, char **base,
                           CUmemGenericAllocationHandle *h) {
    CUdeviceptr p = 0;
    if (d.reserve(&p, n * G, 0, 0, 0) != CUDA_SUCCESS)
        return false;
    *base = (char *)p;
    for (size_t k = 0; k < n; k++) {
        if (!(mapped >> k & 1))
            continue;
        if (d.create(&h[k], G, &d.prop, 0) != CUDA_SUCCESS ||
            d.map(p + k * G, G, 0, h[k], 0) != CUDA_SUCCESS ||
            d.set_access(p + k * G, G, &d.access, 1) != CUDA_SUCCESS)
            return false;
    }
    return true;
}

static size_t free_bytes() {
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    return f;
}

static bool says(cudaError_t e, const char *a, const char *b) {
    const char *s = cudaGetErrorString(e);
    return strstr(s, a) && strstr(s, b);
}

static int case_alias_and_refusals() {
    driver d;
    EXPECT(load(d), "the VMM entry points are missing");
    size_t g = 0;
    EXPECT(d.granularity(&g, &d.prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS &&
               g == G, "granularity %zu, an H100's is 2 MiB", g);
    const size_t before = free_bytes();
    char *a = nullptr, *b = nullptr;
    CUmemGenericAllocationHandle h[3] = {0, 0, 0}, hb[1] = {0};
    EXPECT(reserve_mapped(d, 3, 0x3, &a, h), "reserving and mapping two granules");
    EXPECT(before - free_bytes() == 2 * G, "two physical granules take %zu bytes of the device's "
           "free memory, not 2 MiB each", before - free_bytes());
    /* b's one granule is a's first physical granule, mapped a second time. */
    CUdeviceptr pb = 0;
    EXPECT(d.reserve(&pb, G, 0, 0, 0) == CUDA_SUCCESS, "a second reservation");
    b = (char *)pb;
    EXPECT(d.map(pb, G, 0, h[0], 0) == CUDA_SUCCESS &&
               d.set_access(pb, G, &d.access, 1) == CUDA_SUCCESS, "mapping h[0] again at b");
    EXPECT(before - free_bytes() == 2 * G, "an alias takes no memory");
    cudaMemset(a, 0x11, G);
    static unsigned host[G / 4];
    cudaMemcpy(host, b, G, cudaMemcpyDeviceToHost);
    EXPECT(host[0] == 0x11111111u && host[G / 4 - 1] == 0x11111111u,
           "a memset through a did not show through b: %08x", host[0]);
    ZT_LAUNCH(fill_kernel, 64, 256, 0, nullptr, (unsigned *)b, G / 4, 0xC0FFEEu);
    cudaMemcpy(host, a, G, cudaMemcpyDeviceToHost);
    EXPECT(host[7] == 0xC0FFEEu && host[G / 4 - 1] == 0xC0FFEEu,
           "a kernel writing through b did not show through a: %08x", host[7]);
    /* The driver's refusals, each leaving the state as it was. */
    EXPECT(d.unmap((CUdeviceptr)a, 3 * G) == CUDA_ERROR_INVALID_VALUE,
           "an unmap over an unmapped granule was accepted");
    EXPECT(d.unmap((CUdeviceptr)a, G / 2) == CUDA_ERROR_INVALID_VALUE,
           "an unmap of half a mapping was accepted");
    EXPECT(d.map((CUdeviceptr)a + G, G, 0, h[0], 0) == CUDA_ERROR_INVALID_VALUE,
           "a map over a mapping was accepted");
    EXPECT(d.map((CUdeviceptr)a + 2 * G, G, G, h[0], 0) == CUDA_ERROR_INVALID_VALUE,
           "a map past the end of the physical allocation was accepted");
    EXPECT(d.address_free((CUdeviceptr)a, 3 * G) == CUDA_ERROR_INVALID_VALUE,
           "freeing a reservation with mappings was accepted");
    /* Released while mapped twice: the memory stays until the last mapping goes. */
    EXPECT(d.release(h[0]) == CUDA_SUCCESS, "cuMemRelease of a mapped handle");
    EXPECT(d.release(h[0]) == CUDA_ERROR_INVALID_VALUE, "a second cuMemRelease was accepted");
    EXPECT(d.unmap((CUdeviceptr)a, 2 * G) == CUDA_SUCCESS, "unmapping a's two mappings at once");
    EXPECT(before - free_bytes() == 2 * G, "h[0], released but mapped at b, and h[1], unmapped "
           "but not released, still hold %zu bytes, not 4 MiB", before - free_bytes());
    cudaMemcpy(host, b, G, cudaMemcpyDeviceToHost);
    EXPECT(host[3] == 0xC0FFEEu, "b lost its bytes when a was unmapped");
    EXPECT(d.unmap(pb, G) == CUDA_SUCCESS && d.release(h[1]) == CUDA_SUCCESS, "the last unmap");
    EXPECT(free_bytes() == before, "everything unmapped and released: %zu bytes still held",
           before - free_bytes());
    EXPECT(d.address_free((CUdeviceptr)a, 3 * G) == CUDA_SUCCESS &&
               d.address_free(pb, G) == CUDA_SUCCESS, "freeing the reservations");
    (void)hb;
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}

static int case_memset_unmapped() {
    driver d;
    EXPECT(load(d), "the VMM entry points are missing");
    char *a = nullptr;
    CUmemGenericAllocationHandle h[2] = {0, 0};
    EXPECT(reserve_mapped(d, 2, 0x1, &a, h), "reserving");
    cudaMemsetAsync(a + G - 64, 0, 128, nullptr);
    cudaError_t e = cudaDeviceSynchronize();
    EXPECT(e == cudaErrorIllegalAddress && says(e, "(granule 1) of reservation #", "no physical"),
           "a memset reaching an unmapped granule: %s", cudaGetErrorString(e));
    return 0;
}

static int case_kernel_argument_unmapped() {
    driver d;
    EXPECT(load(d), "the VMM entry points are missing");
    char *a = nullptr;
    CUmemGenericAllocationHandle h[2] = {0, 0};
    EXPECT(reserve_mapped(d, 2, 0x1, &a, h), "reserving");
    ZT_LAUNCH(fill_kernel, 1, 32, 0, nullptr, (unsigned *)(a + G), 32, 1u);
    cudaError_t e = cudaDeviceSynchronize();
    EXPECT(e == cudaErrorIllegalAddress && says(e, "fill_kernel", "(granule 1) of reservation #"),
           "a kernel argument in an unmapped granule: %s", cudaGetErrorString(e));
    return 0;
}

/* cuMemUnmap is not stream-ordered: the kernel is queued, the unmap is not, and the kernel then
 * finds nothing mapped. */
static int case_unmap_races_queued_work() {
    driver d;
    EXPECT(load(d), "the VMM entry points are missing");
    char *a = nullptr;
    CUmemGenericAllocationHandle h[1] = {0};
    EXPECT(reserve_mapped(d, 1, 0x1, &a, h), "reserving");
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    ZT_LAUNCH(fill_kernel, 4, 256, 0, s, (unsigned *)a, G / 4, 2u);
    EXPECT(d.unmap((CUdeviceptr)a, G) == CUDA_SUCCESS, "the unmap itself is legal");
    cudaError_t e = cudaStreamSynchronize(s);
    EXPECT(e == cudaErrorIllegalAddress && says(e, "(granule 0) of reservation #", "no physical"),
           "an unmap before the queued kernel ran went unseen: %s", cudaGetErrorString(e));
    return 0;
}

/* A kernel whose argument is mapped but which reaches into the next, unmapped granule. */
static int case_kernel_reaches_unmapped() {
    driver d;
    EXPECT(load(d), "the VMM entry points are missing");
    char *a = nullptr;
    CUmemGenericAllocationHandle h[2] = {0, 0};
    EXPECT(reserve_mapped(d, 2, 0x1, &a, h), "reserving");
    ZT_LAUNCH(fill_kernel, 4, 256, 0, nullptr, (unsigned *)a, 2 * G / 4, 3u);
    cudaDeviceSynchronize();
    return 0;
}

static int case_host_dereference() {
    driver d;
    EXPECT(load(d), "the VMM entry points are missing");
    char *a = nullptr;
    CUmemGenericAllocationHandle h[1] = {0};
    EXPECT(reserve_mapped(d, 1, 0x1, &a, h), "reserving");
    cudaMemset(a, 0, G);
    return *(volatile char *)(a + 100);
}

/* a and b map the same physical granule; the kernel writes through a and reads through b. The
 * race check (run in ascending then descending order, compared) must read both mappings' results
 * before restoring either, or the second read sees the first's restore. */
static int case_aliased_arguments_no_race() {
    setenv("ZTRAIN_CUDA_EMU_INTERLEAVE", "1", 1);
    driver d;
    EXPECT(load(d), "the VMM entry points are missing");
    char *a = nullptr;
    CUmemGenericAllocationHandle h[1] = {0};
    EXPECT(reserve_mapped(d, 1, 0x1, &a, h), "reserving");
    CUdeviceptr pb = 0;
    EXPECT(d.reserve(&pb, G, 0, 0, 0) == CUDA_SUCCESS && d.map(pb, G, 0, h[0], 0) == CUDA_SUCCESS &&
               d.set_access(pb, G, &d.access, 1) == CUDA_SUCCESS, "mapping h[0] again at b");
    cudaMemset(a, 0, G);
    ZT_LAUNCH(add_one_kernel, 8, 128, 0, nullptr, (unsigned *)a, (const unsigned *)pb, G / 4);
    cudaError_t e = cudaDeviceSynchronize();
    EXPECT(e == cudaSuccess, "a kernel over two mappings of the same memory: %s",
           cudaGetErrorString(e));
    static unsigned host[G / 4];
    cudaMemcpy(host, (void *)pb, G, cudaMemcpyDeviceToHost);
    EXPECT(host[0] == 1 && host[G / 4 - 1] == 1, "the kernel left %u, not 1", host[0]);
    return 0;
}

/* The granularity ZTRAIN_CUDA_EMU_VMM_GRANULE=value gives (read once per process: each case
 * runs in a child of its own); 0 when the query fails. */
static size_t granularity_with(const char *value) {
    setenv("ZTRAIN_CUDA_EMU_VMM_GRANULE", value, 1);
    driver d;
    size_t g = 0;
    if (!load(d) ||
        d.granularity(&g, &d.prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS)
        return 0;
    return g;
}

static int case_granule_setting() {
    size_t g = granularity_with("65536");
    EXPECT(g == 65536, "ZTRAIN_CUDA_EMU_VMM_GRANULE=65536 gave a granularity of %zu", g);
    return 0;
}

static int case_granule_not_understood() {
    size_t g = granularity_with("3000");
    EXPECT(g == G, "ZTRAIN_CUDA_EMU_VMM_GRANULE=3000 gave a granularity of %zu, not 2 MiB", g);
    return 0;
}

/* A rank's process on the second of two emulated GPUs: its memory is device 1's. */
static int case_second_device() {
    setenv("ZTRAIN_CUDA_EMU_DEVICES", "2", 1);
    EXPECT(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1) with two emulated devices");
    driver d;
    EXPECT(load(d), "the VMM entry points are missing");
    size_t g = 0;
    EXPECT(d.granularity(&g, &d.prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) ==
               CUDA_ERROR_INVALID_VALUE, "device 0's memory was offered to device 1's process");
    d.prop.location.id = d.access.location.id = 1;
    EXPECT(d.granularity(&g, &d.prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS &&
               g == G, "device 1's granularity: %zu", g);
    char *a = nullptr;
    CUmemGenericAllocationHandle h[1] = {0};
    EXPECT(reserve_mapped(d, 1, 0x1, &a, h), "reserving and mapping on device 1");
    ZT_LAUNCH(fill_kernel, 4, 256, 0, nullptr, (unsigned *)a, G / 4, 7u);
    static unsigned host[G / 4];
    cudaMemcpy(host, a, G, cudaMemcpyDeviceToHost);
    EXPECT(host[G / 4 - 1] == 7u, "a kernel on device 1's mapping left %u", host[G / 4 - 1]);
    return 0;
}

struct test_case {
    const char *name;
    int (*run)();
    int want_signal;
    const char *want_stderr;
};

static const test_case cases[] = {
    {"map, alias, refusals, accounting", case_alias_and_refusals, 0, nullptr},
    {"memset into an unmapped granule", case_memset_unmapped, 0, nullptr},
    {"kernel argument in an unmapped granule", case_kernel_argument_unmapped, 0, nullptr},
    {"unmap while a queued kernel still uses the range", case_unmap_races_queued_work, 0, nullptr},
    {"kernel reaching into an unmapped granule", case_kernel_reaches_unmapped, SIGSEGV,
     "device work touched"},
    {"host dereference of mapped device memory", case_host_dereference, SIGSEGV,
     "host code dereferenced device memory"},
    {"kernel over two mappings of one granule, run in both orders", case_aliased_arguments_no_race,
     0, nullptr},
    {"ZTRAIN_CUDA_EMU_VMM_GRANULE", case_granule_setting, 0, nullptr},
    {"VMM on the second of two emulated devices", case_second_device, 0, nullptr},
    {"ZTRAIN_CUDA_EMU_VMM_GRANULE not understood", case_granule_not_understood, 0,
     "ZTRAIN_CUDA_EMU_VMM_GRANULE='3000'"},
};

int main() {
    int failures = 0;
    for (const test_case &c : cases) {
        std::string err;
        int status = zt_emu_run_child(c.run, &err);
        if (status == -1)
            return 2;
        bool ok = zt_emu_child_as_wanted(status, c.want_signal);
        /* A fault names the reservation and granule it touched. */
        if (ok && c.want_stderr)
            ok = err.find(c.want_stderr) != std::string::npos &&
                 (!c.want_signal || err.find("of reservation #") != std::string::npos);
        printf("%s %s\n", ok ? "ok  " : "FAIL", c.name);
        if (!ok) {
            failures++;
            printf("  child status 0x%x; its stderr:\n%s\n", status, err.c_str());
        }
    }
    printf("test_cuda_emu_vmm: %d of %zu cases failed\n", failures, sizeof cases / sizeof *cases);
    return failures ? 1 : 0;
}
